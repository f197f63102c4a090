"""The `alibaba` node source: new GPU ECS instances in a VPC of their own, placed by stock, with optional NAS.

Stages inside: placement (placement.py, plan time) -> network (network.py) -> key pair -> NAS (storage.py) ->
instances (instance.py). What it hands on is the same as any other source's (infra/sources/base.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import pulumi
import pulumi_alicloud as alicloud

from infra.config import ClusterConfig
from infra.node import ssh_access
from infra.sources.alibaba.bake import bake_image
from infra.sources.alibaba.instance import GpuNode, GpuNodeArgs
from infra.sources.alibaba.network import Network, NetworkArgs
from infra.sources.alibaba.placement import Placement, choose_placement, image_data_disk
from infra.sources.alibaba.storage import SharedStorage, SharedStorageArgs
from infra.sources.base import ClusterFacts, Machine, ProvisionedCluster, SourceError


class AlibabaSource:
    name = "alibaba"

    def __init__(self, config: ClusterConfig, stack: str) -> None:
        self.config = config
        self.stack = stack

    @functools.cached_property
    def placement(self) -> Placement:
        return choose_placement(self.config, self.stack)

    def facts(self) -> ClusterFacts:
        placement = self.placement
        return ClusterFacts(
            accelerator="nvidia",
            accelerators_per_node=placement.gpus_per_node,
            accelerator_model=placement.gpu_model,
            bf16=placement.bf16,
            machine_type=placement.instance_type,
            location=placement.zone,
            nvswitch=placement.nvswitch,
        )

    def provision(self) -> ProvisionedCluster:
        config, stack, placement = self.config, self.stack, self.placement
        network = Network(
            "network",
            NetworkArgs(
                stack=stack,
                zone=placement.zone,
                instance_type=placement.instance_type,
                generation=config.nodes.placement_generation,
                vswitch_name=placement.vswitch_name,
                admin_cidrs=config.access.admin_cidrs,
                dashboard_port=config.ray.dashboard_port,
                dashboard_open_to_admins=config.access.dashboard == "admin-cidrs",
            ),
        )
        # The login key always reaches root through the first-boot user data, which works for every key type.
        # ImportKeyPair accepts rsa, dsa and ecdsa only (not ed25519: ssh_access.IMPORTABLE_KEY_TYPES); for those
        # an ECS key pair is registered as well, so that the console shows which key the instances take.
        public_key = config.access.ssh_public_key
        if public_key is None:  # config.py requires it with nodes.source alibaba; a guard for the type checker
            raise SourceError("roll-cluster:access.sshPublicKey: required with nodes.source alibaba; got nothing")
        key_pair_name = None
        ssh_login = f"{public_key.split()[0]} key for root via first-boot user data"
        if ssh_access.importable(public_key):
            key_pair = alicloud.ecs.EcsKeyPair(
                "key-pair", key_pair_name=f"roll-cluster-{stack}", public_key=public_key
            )
            key_pair_name = key_pair.key_pair_name
            ssh_login += f" and ECS key pair roll-cluster-{stack}"
        else:
            ssh_login += " (ECS ImportKeyPair does not accept this type: no key pair)"
        storage = None
        if config.storage.nas:
            storage = SharedStorage(
                "shared",
                SharedStorageArgs(
                    stack=stack,
                    zone=network.zone,
                    vpc_id=network.vpc_id,
                    vswitch_id=network.vswitch_id,
                    vswitch_cidr=network.vswitch_cidr,
                    storage_type=config.storage.nas_storage_type,
                    retain_on_destroy=config.storage.retain_on_destroy,
                    existing_file_system_id=config.storage.existing_file_system_id,
                ),
            )
        data_snapshot = image_data_disk(config)
        machines: list[Machine] = []
        for rank in range(config.nodes.count):
            name = f"node-{rank}"
            node = GpuNode(
                name,
                GpuNodeArgs(
                    stack=stack,
                    rank=rank,
                    nodes=config.nodes,
                    instance_type=network.instance_type,
                    image_id=placement.image_id,
                    vswitch_id=network.vswitch_id,
                    security_group_id=network.security_group_id,
                    key_pair_name=key_pair_name,
                    ssh_public_key=public_key,
                    fabric_manager=placement.nvswitch and config.nodes.gpu_driver == "auto-install",
                    data_snapshot=data_snapshot,
                ),
            )
            machines.append(
                Machine(
                    name=name,
                    rank=rank,
                    ssh_host=node.public_ip,
                    private_ip=node.private_ip,
                    identity=node.instance_id,
                    data_disk_serial=node.data_disk_serial,
                    host_key=node.host_public_key,
                    depends_on=[node],
                    bake=_baker(stack, node) if config.nodes.bake and rank == 0 else None,
                )
            )
        outputs: dict[str, object] = {
            "zone": network.zone,
            "instanceType": network.instance_type,
            "hourlyPrice": placement.price.total(config.nodes.count),
        }
        if storage is not None:
            outputs["nasFileSystemId"] = storage.file_system_id
        return ProvisionedCluster(
            machines=machines,
            shared_storage_server=storage.mount_domain if storage else None,
            outputs=outputs,
            notes={
                "placement_tried": [] if placement.existing else list(placement.tried),
                "placement_kept": list(placement.tried) if placement.existing else [],
                "image_name": placement.image_name,
                "nas_retained": config.storage.retain_on_destroy,
                "nas_existing": config.storage.existing_file_system_id,
                "checkpoints": checkpoint_note(config),
                "ssh_login": ssh_login,
                "fabric_manager": placement.nvswitch,
            },
        )


def _baker(
    stack: str, node: GpuNode
) -> Callable[[Sequence[pulumi.Resource], pulumi.Resource], tuple[pulumi.Resource, pulumi.Output[str]]]:
    # Not a child of the GpuNode: the node's steps wait for the GpuNode (all its children), the image for them.
    return lambda after, parent: bake_image("baked-image", stack, node.instance_id, after, parent)


def checkpoint_note(config: ClusterConfig) -> str:
    """Where checkpoints live and whether they outlive the instances: the plan states it plainly."""
    if config.storage.nas:
        kept = "kept on pulumi destroy" if config.storage.retain_on_destroy or config.storage.existing_file_system_id \
            else "DELETED on pulumi destroy (storage.retainOnDestroy: false)"
        return f"checkpoints on the NAS at /mnt/shared: {kept}"
    where = "the data disk (/data)" if config.nodes.data_disk_gb else "the system disk"
    return (f"checkpoints on {where} of each node: they DIE WITH THE INSTANCE on pulumi destroy or a\n"
            "  replacement of the node; to keep them: storage.nas: true")
