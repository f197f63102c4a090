"""Shared storage for checkpoints: a NAS (NFS) file system with a mount target in the cluster's vSwitch.

Mounted at /mnt/shared (infra/layout.py) on every node and container by infra/scripts/prepare_host.sh. Kept on
`pulumi destroy` unless `storage.retainOnDestroy` is false: checkpoints outlive the cluster, and
`storage.existingFileSystemId` attaches such a kept file system to a new deployment (no new file system; the access
group, its rule and the mount target are made for this cluster's vSwitch).

The file system is created in the nodes' zone: Alibaba picks a random zone for a standard file system without
`zone_id`, and recommends "the file system and the ECS instance belong to the same zone to avoid cross-zone
latency" (TF `alicloud_nas_file_system`, `zone_id`; reference/alibaba-cloud-verified.md §8). `zone_id` is ForceNew,
so it is in ignore_changes: a cluster moved to another zone keeps its file system (and its data), mounted across
zones ("file systems in different zones in the same region communicate with ECS cloud servers", same doc).
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_alicloud as alicloud
import pulumi_command as command


@dataclass(frozen=True)
class SharedStorageArgs:
    stack: str
    zone: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    vswitch_id: pulumi.Input[str]
    vswitch_cidr: str
    storage_type: str
    retain_on_destroy: bool
    existing_file_system_id: str | None = None


class SharedStorage(pulumi.ComponentResource):
    file_system_id: pulumi.Output[str]
    mount_domain: pulumi.Output[str]

    def __init__(self, name: str, args: SharedStorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:SharedStorage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        if args.existing_file_system_id is not None:
            # Attached, never owned: nothing here can delete it.
            file_system_id: pulumi.Output[str] = pulumi.Output.from_input(args.existing_file_system_id)
        else:
            file_system = alicloud.nas.FileSystem(
                f"{name}-fs",
                protocol_type="NFS",
                storage_type=args.storage_type,
                file_system_type="standard",
                zone_id=args.zone,
                description=f"roll-cluster {args.stack}: checkpoints and logs",
                opts=pulumi.ResourceOptions(
                    parent=self, retain_on_delete=args.retain_on_destroy, ignore_changes=["zoneId"]
                ),
            )
            file_system_id = file_system.id
            # retain_on_delete is recorded by `pulumi up` only (deploy/step.go reads the old state's): a
            # destroy after retainOnDestroy changed to true would still delete the file system. This step is
            # deleted just before it (it depends on it) and refuses then (infra/scripts/local/nas_guard.sh).
            # see verified-facts#shared-storage-step
            guard_name = f"{name}-fs-guard"
            command.local.Command(
                guard_name,
                delete="bash infra/scripts/local/nas_guard.sh",
                environment={
                    "STACK": f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}",
                    "RETAIN": "true" if args.retain_on_destroy else "false",
                    "GUARD_RESOURCE": guard_name,
                    # Recorded in the stack's configuration when the destroy keeps the file system.
                    "FILE_SYSTEM_ID": file_system.id,
                },
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[file_system]),
            )
        # Only the cluster's vSwitch may mount it (not the whole VPC, which the default access group allows).
        access_group = alicloud.nas.AccessGroup(
            f"{name}-access",
            access_group_name=f"roll-cluster-{args.stack}",
            access_group_type="Vpc",
            file_system_type="standard",
            opts=child,
        )
        rule = alicloud.nas.AccessRule(
            f"{name}-access-rule",
            access_group_name=access_group.access_group_name,
            source_cidr_ip=args.vswitch_cidr,
            rw_access_type="RDWR",
            user_access_type="no_squash",
            priority=1,
            # A move (a new vSwitch CIDR) must not cut the old nodes' access while their job still runs: the provider
            # would modify the rule in place (ModifyAccessRule) at the start of the `up`. Replaced instead, the new
            # rule is created first and the old one deleted at the end, after the old instances (Pulumi deletes a
            # replaced resource after every other step, step_generator.go).
            # see verified-facts#shared-storage-step-generator
            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(replace_on_changes=["sourceCidrIp"])),
        )
        # The rule must exist before anything mounts: the mount target waits for it, and every node's prepare-host
        # step waits for the mount target (it takes the mount target's domain).
        mount_target = alicloud.nas.MountTarget(
            f"{name}-mount",
            file_system_id=file_system_id,
            access_group_name=access_group.access_group_name,
            vswitch_id=args.vswitch_id,
            vpc_id=args.vpc_id,
            network_type="Vpc",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[rule]),
        )
        self.file_system_id = file_system_id
        self.mount_domain = mount_target.mount_target_domain
        self.register_outputs({"fileSystemId": self.file_system_id, "mountDomain": self.mount_domain})
