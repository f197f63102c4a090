"""Stack outputs: what was built, and every command a user needs (the names are the contract's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pulumi

from infra import autostop
from infra.config import ClusterConfig
from infra.frameworks import JobSpec
from infra.frameworks.base import DOWNLOAD_PATTERN
from infra.frameworks.registry import adapter_class
from infra.node import known_hosts as known_hosts_module
from infra.node import ssh_access, steps
from infra.ray import user_commands
from infra.sources.base import ClusterFacts, ProvisionedCluster

if TYPE_CHECKING:
    from components.ray_cluster import RayNode
    from components.training_job import TrainingJob


def export_all(
    config: ClusterConfig,
    facts: ClusterFacts,
    cluster: ProvisionedCluster,
    nodes: Sequence[RayNode],
    job: TrainingJob,
    login: ssh_access.LoginKey,
    known: known_hosts_module.KnownHosts,
    run: steps.RunContext,
) -> None:
    head = nodes[0]
    head_host = pulumi.Output.from_input(head.machine.ssh_host)
    run.notes.update(cluster.notes)
    run.notes.update(auto_start=config.training.auto_start, config=config, facts=facts)
    job.spec.apply(lambda spec: run.notes.__setitem__("job_spec", spec))
    key = login.identity_file
    hosts = known.path
    run.notes.update(ssh_client=f"login with {login.mechanism}; host keys generated per node, verified "
                                f"against {hosts}")
    ports = config.ray
    container = config.container.name
    user, port = head.machine.ssh_user, head.machine.ssh_port
    pinned = head.machine.host_key is not None  # else recorded on first use in the stack's file
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
    pulumi.export("knownHostsFile", hosts)
    pulumi.export(
        "sshHead", head_host.apply(_running(lambda ip: user_commands.ssh_command(ip, key, hosts, user, port, pinned)))
    )
    pulumi.export(
        "dashboardTunnel",
        head_host.apply(_running(
            lambda ip: user_commands.dashboard_tunnel_command(ip, key, ports.dashboard_port, hosts, user, port, pinned)
        )),
    )
    if config.access.dashboard == "admin-cidrs":
        pulumi.export(
            "dashboardUrl", head_host.apply(_running(lambda ip: user_commands.dashboard_url(ip, ports.dashboard_port)))
        )
    pulumi.export("rayAddress", head.private_ip.apply(lambda ip: user_commands.ray_address(ip, ports.gcs_port)))
    pulumi.export("jobId", job.job_id)
    # The configuration the head submits, in full and in plain text (it never holds a secret), so that
    # `pulumi preview` shows what will run before anything is paid for.
    job_config_output = job.spec.apply(job_config)
    # A section held as a secret stays secret in what is derived from it (infra/node/steps.py RunContext.secret_config).
    pulumi.export("jobConfig", pulumi.Output.secret(job_config_output) if run.secret_config
                  else job_config_output)
    if head.bootstrap.baked_image_id is not None:
        pulumi.export("bakedImageId", head.bootstrap.baked_image_id)
    commands: Any = pulumi.Output.all(head_host, job.job_id)
    if config.training.auto_start and job.submission is not None:
        # After a reboot of the head its Ray knows no job: jobStatus says so and names this command.
        stack = pulumi.get_stack()
        first_step = adapter_class(config.training.framework).first_step_pattern
        downloads = DOWNLOAD_PATTERN if first_step else ""
        resubmit = job.submission.urn.apply(lambda urn: user_commands.job_resubmit_command(stack, urn))
        pulumi.export("jobResubmit", resubmit)
        pulumi.export(
            "jobStatus",
            pulumi.Output.all(head_host, job.job_id, resubmit).apply(_running(
                lambda v: user_commands.job_status_command(v[0], key, container, v[1], ports.dashboard_port,
                                                          hosts, user, port, pinned, resubmit=v[2],
                                                          reclaim_dir=autostop.reclaim_dir(config, stack),
                                                          first_step_pattern=first_step, download_pattern=downloads)
            )),
        )
        pulumi.export(
            "jobLogs",
            commands.apply(_running(
                lambda v: user_commands.job_logs_command(v[0], key, container, v[1], ports.dashboard_port,
                                                          hosts, user, port, pinned)
            )),
        )
        pulumi.export(
            "jobStop",
            commands.apply(_running(
                lambda v: user_commands.job_stop_command(v[0], key, container, v[1], ports.dashboard_port,
                                                          hosts, user, port, pinned)
            )),
        )
    else:
        # No job exists to show or stop: the command that submits the prepared one instead.
        pulumi.export("jobSubmitted", False)
        pulumi.export("jobSubmit", user_commands.job_submit_command(pulumi.get_stack()))


PAUSED = ("the cluster is stopped (nodes.paused or autostop): no public IP until `pulumi up` starts it "
          "(after autostop: `pulumi up --refresh`)")


def _running(make: Callable[[Any], str]) -> Callable[[Any], str]:
    """A command for the head's address (the first value), or what to do while the instances are stopped (their
    public IP released under StopCharging: the address is empty)."""
    return lambda v: make(v) if (v[0] if isinstance(v, list) else v) else PAUSED


def job_config(spec: JobSpec) -> dict[str, Any]:
    """The jobConfig output: what the job step ships to the head, as is."""
    config: dict[str, Any] = {"workdir": spec.workdir, "command": spec.entrypoint}
    if spec.runtime_env:
        config["runtimeEnv"] = spec.runtime_env
    if spec.files:
        config["files"] = dict(spec.files)
    if spec.prepare:
        config["prepare"] = spec.prepare
    if spec.pre_submit_check:
        config["check"] = spec.pre_submit_check
    if spec.reward_server is not None:
        config["rewardServer"] = {"command": spec.reward_server.command, "port": spec.reward_server.port}
    return config

