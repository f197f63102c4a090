"""The `alibaba` node source's resources: the network, the login key pair, the NAS and one GPU node per rank.

Placement (zone, type, image) was decided before any resource by infra/sources/alibaba/placement.py through the
source's facts(); this registers what it chose. What it hands on is the same as any other source's
(infra/sources/base.py `ProvisionedCluster`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pulumi
import pulumi_alicloud as alicloud

from components.alibaba.baked_image import bake_image
from components.alibaba.gpu_node import GpuNode, GpuNodeArgs
from components.alibaba.network import Network
from components.alibaba.shared_storage import SharedStorage, SharedStorageArgs
from infra.cost import cost_summary
from infra.economical import economical_mode
from infra.node import ssh_access
from infra.sources.alibaba.network_plan import NetworkArgs
from infra.sources.alibaba.placement import image_data_disk
from infra.sources.alibaba.source import AlibabaSource, checkpoint_note
from infra.sources.alibaba.unchecked import unchecked
from infra.sources.base import Machine, ProvisionedCluster, SourceError


def provision_alibaba(source: AlibabaSource) -> ProvisionedCluster:
    """Register the source's resources in the order they depend on each other and hand on the machines."""
    config, stack, placement = source.config, source.stack, source.placement
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
    if public_key is None:  # infra/config/cluster.py requires it with nodes.source alibaba; guard for the type checker
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
                depends_on=[node, *network.ssh_rules],
                started=node.start_time,
                deleted_with=node.instance,
                bake=_baker(stack, node) if config.nodes.bake and rank == 0 else None,
            )
        )
    hourly = placement.price.total(config.nodes.count)
    outputs: dict[str, object] = {
        "zone": network.zone,
        "instanceType": network.instance_type,
        "hourlyPrice": hourly,
        "cost": cost_summary(config, hourly, economical=economical_mode(placement.instance_type)),
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
            "unchecked": unchecked(config, placement),
        },
    )


def _baker(
    stack: str, node: GpuNode
) -> Callable[[Sequence[pulumi.Resource], pulumi.Resource], tuple[pulumi.Resource, pulumi.Output[str]]]:
    # Not a child of the GpuNode: the node's steps wait for the GpuNode (all its children), the image for them.
    return lambda after, parent: bake_image("baked-image", stack, node.instance_id, after, parent)
