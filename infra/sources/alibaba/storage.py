"""Shared storage for checkpoints: a NAS (NFS) file system with a mount target in the cluster's vSwitch.

Mounted at /mnt/shared (infra/layout.py) on every node and container by infra/scripts/prepare_host.sh. Kept on
`pulumi destroy` unless `storage.retainOnDestroy` is false: checkpoints outlive the cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_alicloud as alicloud


@dataclass(frozen=True)
class SharedStorageArgs:
    stack: str
    vpc_id: pulumi.Input[str]
    vswitch_id: pulumi.Input[str]
    vswitch_cidr: str
    storage_type: str
    retain_on_destroy: bool


class SharedStorage(pulumi.ComponentResource):
    file_system_id: pulumi.Output[str]
    mount_domain: pulumi.Output[str]

    def __init__(self, name: str, args: SharedStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:SharedStorage", name, None, opts)
        keep = pulumi.ResourceOptions(parent=self, retain_on_delete=args.retain_on_destroy)
        file_system = alicloud.nas.FileSystem(
            f"{name}-fs",
            protocol_type="NFS",
            storage_type=args.storage_type,
            file_system_type="standard",
            description=f"roll-cluster {args.stack}: checkpoints and logs",
            opts=keep,
        )
        # Only the cluster's vSwitch may mount it (not the whole VPC, which the default access group allows).
        access_group = alicloud.nas.AccessGroup(
            f"{name}-access",
            access_group_name=f"roll-cluster-{args.stack}",
            access_group_type="Vpc",
            file_system_type="standard",
            opts=pulumi.ResourceOptions(parent=self),
        )
        alicloud.nas.AccessRule(
            f"{name}-access-rule",
            access_group_name=access_group.access_group_name,
            source_cidr_ip=args.vswitch_cidr,
            rw_access_type="RDWR",
            user_access_type="no_squash",
            priority=1,
            opts=pulumi.ResourceOptions(parent=self),
        )
        mount_target = alicloud.nas.MountTarget(
            f"{name}-mount",
            file_system_id=file_system.id,
            access_group_name=access_group.access_group_name,
            vswitch_id=args.vswitch_id,
            vpc_id=args.vpc_id,
            network_type="Vpc",
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.file_system_id = file_system.id
        self.mount_domain = mount_target.mount_target_domain
        self.register_outputs({"fileSystemId": self.file_system_id, "mountDomain": self.mount_domain})
