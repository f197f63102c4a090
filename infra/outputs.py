"""Stack outputs: what was built, and every command a user needs (the names are the contract's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pulumi

from infra.config import ClusterConfig
from infra.node import steps
from infra.ray import commands as ray_commands
from infra.sources.base import ClusterFacts, ProvisionedCluster

if TYPE_CHECKING:
    from infra.frameworks.job import TrainingJob
    from infra.ray.cluster import RayNode


def export_all(
    config: ClusterConfig,
    facts: ClusterFacts,
    cluster: ProvisionedCluster,
    nodes: Sequence[RayNode],
    job: TrainingJob,
) -> None:
    head = nodes[0]
    head_host = pulumi.Output.from_input(head.machine.ssh_host)
    steps.NOTES.update(cluster.notes)
    steps.NOTES.update(auto_start=config.training.auto_start, source=config.nodes.source)
    job.spec.apply(lambda spec: steps.NOTES.__setitem__("job_spec", spec))
    key = config.access.ssh_private_key_path
    ports = config.ray
    container = config.container.name
    user, port = head.machine.ssh_user, head.machine.ssh_port
    for name, value in cluster.outputs.items():
        pulumi.export(name, value)
    pulumi.export(
        "nodes",
        [
            pulumi.Output.all(
                name=n.name, rank=rank, instanceId=n.machine.identity, publicIp=n.machine.ssh_host,
                privateIp=n.machine.private_ip,
            )
            for rank, n in enumerate(nodes)
        ],
    )
    pulumi.export("gpus", facts.accelerators_per_node * config.nodes.count)
    pulumi.export("gpuModel", facts.accelerator_model)
    pulumi.export("sshHead", head_host.apply(lambda ip: ray_commands.ssh_command(ip, key, user, port)))
    pulumi.export(
        "dashboardTunnel",
        head_host.apply(lambda ip: ray_commands.dashboard_tunnel_command(ip, key, ports.dashboard_port, user, port)),
    )
    if config.access.dashboard == "admin-cidrs":
        pulumi.export(
            "dashboardUrl", head_host.apply(lambda ip: ray_commands.dashboard_url(ip, ports.dashboard_port))
        )
    pulumi.export("rayAddress", head.private_ip.apply(lambda ip: ray_commands.ray_address(ip, ports.gcs_port)))
    pulumi.export("jobId", job.job_id)
    status_and_logs: Any = pulumi.Output.all(head_host, job.job_id)
    pulumi.export(
        "jobStatus",
        status_and_logs.apply(
            lambda v: ray_commands.job_status_command(v[0], key, container, v[1], ports.dashboard_port, user, port)
        ),
    )
    pulumi.export(
        "jobLogs",
        status_and_logs.apply(
            lambda v: ray_commands.job_logs_command(v[0], key, container, v[1], ports.dashboard_port, user, port)
        ),
    )
    if not config.training.auto_start:
        pulumi.export("jobSubmitted", False)

