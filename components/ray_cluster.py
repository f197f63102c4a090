"""The Ray cluster inside the training containers: the head on rank 0, a worker on every other rank, and a
readiness gate that waits until every node and every GPU has joined.

Workers start as soon as their own node is bootstrapped and the head runs; they never wait for each other.
Adding nodes adds worker steps (and reruns only the readiness gate); removing nodes runs `ray stop` on the
removed ones (the delete command) before their instances go. `pulumi destroy` stops Ray before the nodes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from components import remote_steps
from components.bootstrap import NodeBootstrap
from infra.config import ClusterConfig
from infra.frameworks import head_reserved_gpus
from infra.layout import DATA_MOUNT
from infra.node import accelerators, ssh_access, steps
from infra.ray import step_env
from infra.sources.base import Machine


@dataclass(frozen=True)
class RayNode:
    name: str
    machine: Machine

    @property
    def private_ip(self) -> pulumi.Output[str]:
        return pulumi.Output.from_input(self.machine.private_ip)
    bootstrap: NodeBootstrap


@dataclass(frozen=True)
class RayClusterArgs:
    config: ClusterConfig
    nodes: Sequence[RayNode]
    gpus_per_node: int
    private_key: pulumi.Output[str] | None  # None: through ssh-agent (infra/node/ssh_access.py)
    login: ssh_access.LoginKey  # the identity the local teardowns (ray stop) give the system ssh
    run: steps.RunContext  # the program's run: the steps are recorded there
    secret_env: dict[str, pulumi.Output[str]]  # WANDB_API_KEY, HF_TOKEN: reach jobs via the raylet's environment


def ray_settings(config: ClusterConfig, gpus_per_node: int, secret_names: tuple[str, ...]) -> step_env.RaySettings:
    on_data_disk = config.nodes.data_disk_gb > 0
    kind = accelerators.accelerator(config.nodes.accelerator)
    # GPUs of the head that something outside Ray holds (OpenRLHF's reward server without train.colocate_all):
    # the head's Ray neither counts nor hands them out.
    reserved = head_reserved_gpus(config.training, config.container, gpus_per_node)
    return step_env.RaySettings(
        container_name=config.container.name,
        gpus_per_node=gpus_per_node,
        ports=step_env.RayPorts(config.ray.gcs_port, config.ray.dashboard_port, config.ray.client_port),
        # The dashboard is remote code execution: it listens on the head's addresses only when the security
        # group limits it to the admin CIDRs, otherwise on loopback for the SSH tunnel.
        dashboard_host="0.0.0.0" if config.access.dashboard == "admin-cidrs" else "127.0.0.1",
        temp_dir=f"{DATA_MOUNT}/ray/tmp" if on_data_disk else "",
        spill_dir=f"{DATA_MOUNT}/ray/spill" if on_data_disk else "",
        extra_env_names=secret_names,
        object_store_memory=(
            int(config.ray.object_store_memory_gb * 1024**3) if config.ray.object_store_memory_gb else None
        ),
        ready_timeout_s=config.ray.ready_timeout_seconds,
        head_wait_timeout_s=config.ray.head_wait_timeout_seconds,
        accelerator_resource=kind.ray_resource,
        preload_jemalloc=kind.preload_jemalloc,
        head_reserved_gpus=tuple(reserved),
    )


class RayCluster(pulumi.ComponentResource):
    head_private_ip: pulumi.Output[str]
    generation: pulumi.Output[str]  # step_env.ray_generation: changes when Ray restarts on the head
    ready: pulumi.Resource
    settings: step_env.RaySettings

    def __init__(self, name: str, args: RayClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:RayCluster", name, None, opts)
        config = args.config
        head = args.nodes[0]
        self.head_private_ip = head.private_ip
        node_settings = ray_settings(config, args.gpus_per_node, tuple(sorted(args.secret_env)))
        self.settings = node_settings
        started: list[tuple[str, pulumi.Resource]] = []
        head_ctx = self._context(head, args)
        head_start = remote_steps.remote_step(
            head_ctx,
            step_env.HEAD_STEP.step,
            step_env.HEAD_STEP.scripts,
            args.secret_env,
            dynamic_env=head.private_ip.apply(lambda ip: step_env.head_env(node_settings, ip)),
            after=[(head.bootstrap.ready_key, head.bootstrap.ready)],
            delete_scripts=step_env.RAY_STOP_STEP.scripts,
            delete_env=step_env.ray_stop_env(node_settings),
            triggers=[head.bootstrap.container.id],
            # The old Ray must be stopped before a new one starts on the same ports.
            delete_before_replace=True,
        )
        started.append((f"{head.name}/ray-head", head_start))
        secret_names = sorted(args.secret_env)
        # A secret Output when there are secrets (the digest is computed from them).
        self.generation = pulumi.Output.all(
            head.private_ip, head.bootstrap.container.id, *[args.secret_env[n] for n in secret_names]
        ).apply(lambda v: step_env.ray_generation(node_settings, v[0], v[1], v[2:]))
        for rank, worker in enumerate(args.nodes[1:], start=1):
            env = pulumi.Output.all(worker.private_ip, head.private_ip, self.generation).apply(
                functools.partial(_worker_env, node_settings, rank)
            )
            join = remote_steps.remote_step(
                self._context(worker, args),
                step_env.WORKER_STEP.step,
                step_env.WORKER_STEP.scripts,
                args.secret_env,
                dynamic_env=env,
                after=[(worker.bootstrap.ready_key, worker.bootstrap.ready), (f"{head.name}/ray-head", head_start)],
                delete_scripts=step_env.RAY_STOP_STEP.scripts,
                delete_env=step_env.ray_stop_env(node_settings),
                triggers=[worker.bootstrap.container.id],
                delete_before_replace=True,
            )
            started.append((f"{worker.name}/ray-worker", join))
        all_ips = pulumi.Output.all(*[n.private_ip for n in args.nodes])
        # A cluster-level step (it runs on the head): it reruns when nodes come or go, the head's own steps don't.
        self.ready = remote_steps.remote_step(
            remote_steps.context_for(head.machine, args.private_key, self, login=args.login, run=args.run,
                                     running=True),
            step_env.READY_STEP.step,
            step_env.READY_STEP.scripts,
            {},
            dynamic_env=pulumi.Output.all(all_ips, self.generation).apply(
                lambda v: {**step_env.ready_env(node_settings, v[0][0], v[0]), "RAY_GENERATION": v[1]}
            ),
            after=started,
            resource_name="ray-ready",
        )
        self.register_outputs({"headPrivateIp": self.head_private_ip})

    @staticmethod
    def _context(ray_node: RayNode, args: RayClusterArgs) -> remote_steps.StepContext:
        return remote_steps.context_for(ray_node.machine, args.private_key, ray_node.bootstrap, login=args.login,
                                        run=args.run, running=True)



def _worker_env(settings: step_env.RaySettings, rank: int, values: list[str]) -> dict[str, str]:
    worker_ip, head_ip, generation = values
    return step_env.worker_env(settings, worker_ip, head_ip, rank, generation)
