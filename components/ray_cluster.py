"""The Ray cluster inside the training containers: the head on rank 0, a worker on every other rank, and a
readiness gate that waits until every node and every GPU has joined.

Workers start as soon as their own node is bootstrapped and the head runs; they never wait for each other.
Adding nodes adds worker steps (and reruns only the readiness gate); removing nodes runs `ray stop` on the
removed ones (the delete command) before their instances go. `pulumi destroy` stops Ray before the nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from components.bootstrap import DATA_MOUNT, NodeBootstrap
from components.node import GpuNode
from infra import ray_commands, steps
from infra.config import ClusterConfig


@dataclass(frozen=True)
class RayNode:
    name: str
    node: GpuNode
    bootstrap: NodeBootstrap


@dataclass(frozen=True)
class RayClusterArgs:
    config: ClusterConfig
    nodes: Sequence[RayNode]
    gpus_per_node: int
    private_key: pulumi.Output[str]
    secret_env: dict[str, pulumi.Output[str]]  # WANDB_API_KEY, HF_TOKEN: reach jobs via the raylet's environment


class RayCluster(pulumi.ComponentResource):
    head_private_ip: pulumi.Output[str]
    ready: pulumi.Resource

    def __init__(self, name: str, args: RayClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:RayCluster", name, None, opts)
        config = args.config
        head = args.nodes[0]
        self.head_private_ip = head.node.private_ip
        node_settings = ray_commands.RayNodeSettings(
            container_name=config.container.name,
            gcs_port=config.ray.gcs_port,
            dashboard_port=config.ray.dashboard_port,
            client_port=config.ray.client_port,
            dashboard_host="0.0.0.0" if config.access.dashboard == "admin-cidrs" else "127.0.0.1",
            num_gpus=args.gpus_per_node,
            temp_dir=f"{DATA_MOUNT}/ray/tmp" if config.nodes.data_disk_gb else "",
            spill_dir=f"{DATA_MOUNT}/ray/spill" if config.nodes.data_disk_gb else "",
            extra_env_names=tuple(sorted(args.secret_env)),
        )
        started: list[tuple[str, pulumi.Resource]] = []
        head_ctx = self._context(head, args)
        head_start = steps.remote_step(
            head_ctx,
            "ray-head",
            ray_commands.HEAD_SCRIPTS,
            args.secret_env,
            dynamic_env=head.node.private_ip.apply(lambda ip: ray_commands.head_env(node_settings, ip)),
            after=[(head.bootstrap.ready_key, head.bootstrap.ready)],
            delete_scripts=ray_commands.STOP_SCRIPTS,
            delete_env=ray_commands.stop_env(node_settings),
            triggers=[head.bootstrap.container.id],
        )
        started.append((f"{head.name}/ray-head", head_start))
        for rank, worker in enumerate(args.nodes[1:], start=1):
            env = pulumi.Output.all(worker.node.private_ip, head.node.private_ip).apply(
                lambda ips, rank=rank: ray_commands.worker_env(node_settings, ips[0], ips[1], rank)
            )
            join = steps.remote_step(
                self._context(worker, args),
                "ray-worker",
                ray_commands.WORKER_SCRIPTS,
                args.secret_env,
                dynamic_env=env,
                after=[(worker.bootstrap.ready_key, worker.bootstrap.ready), (f"{head.name}/ray-head", head_start)],
                delete_scripts=ray_commands.STOP_SCRIPTS,
                delete_env=ray_commands.stop_env(node_settings),
                triggers=[worker.bootstrap.container.id],
            )
            started.append((f"{worker.name}/ray-worker", join))
        all_ips = pulumi.Output.all(*[n.node.private_ip for n in args.nodes])
        self.ready = steps.remote_step(
            head_ctx,
            "ray-ready",
            ray_commands.READY_SCRIPTS,
            {},
            dynamic_env=all_ips.apply(
                lambda ips: ray_commands.ready_env(node_settings, list(ips), config.ray.ready_timeout_seconds)
            ),
            after=started,
        )
        self.register_outputs({"headPrivateIp": self.head_private_ip})

    @staticmethod
    def _context(ray_node: RayNode, args: RayClusterArgs) -> steps.StepContext:
        return steps.StepContext(node=ray_node.name, host=ray_node.node.public_ip, key=args.private_key,
                                 parent=ray_node.bootstrap)

