"""Stack outputs: what was built, and every command a user needs (the names are the contract's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pulumi

from infra import ray_commands, steps
from infra.config import ClusterConfig
from infra.placement import Placement

if TYPE_CHECKING:
    from components.network import Network
    from components.ray_cluster import RayNode
    from components.training_job import TrainingJob


def export_all(
    config: ClusterConfig, placement: Placement, network: Network, nodes: Sequence[RayNode], job: TrainingJob
) -> None:
    head = nodes[0].node
    steps.NOTES.update(
        placement_tried=list(placement.tried),
        image_name=placement.image_name,
        nas_retained=config.storage.retain_on_destroy,
        auto_start=config.training.auto_start,
    )
    job.spec.apply(lambda spec: steps.NOTES.__setitem__("job_spec", spec))
    key = config.access.ssh_private_key_path
    ports = config.ray
    container = config.container.name
    pulumi.export("zone", network.zone)
    pulumi.export("instanceType", network.instance_type)
    pulumi.export(
        "nodes",
        [
            pulumi.Output.all(n.node.instance_id, n.node.public_ip, n.node.private_ip).apply(
                lambda v, rank=rank, name=n.name: {
                    "name": name, "rank": rank, "instanceId": v[0], "publicIp": v[1], "privateIp": v[2]
                }
            )
            for rank, n in enumerate(nodes)
        ],
    )
    pulumi.export("gpus", placement.gpus_per_node * config.nodes.count)
    pulumi.export("gpuModel", placement.gpu_model)
    price = hourly_price(placement, config.nodes.count)
    pulumi.export("hourlyPrice", price)
    pulumi.export("sshHead", head.public_ip.apply(lambda ip: ray_commands.ssh_command(key, ip)))
    pulumi.export(
        "dashboardTunnel",
        head.public_ip.apply(lambda ip: ray_commands.dashboard_tunnel_command(key, ip, ports.dashboard_port)),
    )
    if config.access.dashboard == "admin-cidrs":
        pulumi.export("dashboardUrl", head.public_ip.apply(lambda ip: f"http://{ip}:{ports.dashboard_port}"))
    pulumi.export("rayAddress", head.private_ip.apply(lambda ip: ray_commands.ray_address(ip, ports.gcs_port)))
    pulumi.export("jobId", job.job_id)
    status_and_logs: Any = pulumi.Output.all(head.public_ip, job.job_id)
    pulumi.export(
        "jobStatus",
        status_and_logs.apply(
            lambda v: ray_commands.job_status_command(key, v[0], container, ports.dashboard_port, v[1])
        ),
    )
    pulumi.export(
        "jobLogs",
        status_and_logs.apply(lambda v: ray_commands.job_logs_command(key, v[0], container, ports.dashboard_port, v[1])),
    )
    if not config.training.auto_start:
        pulumi.export("jobSubmitted", False)


def hourly_price(placement: Placement, count: int) -> float | None:
    if placement.hourly_price is None:
        return None
    return round(placement.hourly_price * count, 2)
