"""The training job on the Ray cluster: the framework's job submitted from the head with `ray job submit`.

The submission id is derived from the job's configuration, so a change of the training config replaces only
this resource: the old job is stopped first (delete before replace: two jobs would fight over the GPUs), then
the new one is submitted. `pulumi destroy` stops the job before Ray and the nodes go (dependency order).
OpenRLHF's reward-model server runs supervised on the head and must answer before the job is submitted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pulumi

from components.bootstrap import DATA_MOUNT
from components.ray_cluster import RayCluster, RayNode
from components.storage import SHARED_MOUNT
from infra import ray_commands, steps
from infra.config import ClusterConfig
from infra.frameworks import ClusterShape, JobSpec, adapter_for


@dataclass(frozen=True)
class TrainingJobArgs:
    config: ClusterConfig
    stack: str
    head: RayNode
    ray: RayCluster
    gpus_per_node: int
    bf16: bool
    private_key: pulumi.Output[str]


def cluster_shape(config: ClusterConfig, stack: str, gpus_per_node: int, bf16: bool, head_ip: str) -> ClusterShape:
    return ClusterShape(
        stack=stack,
        nodes=config.nodes.count,
        gpus_per_node=gpus_per_node,
        bf16=bf16,
        head_ip=head_ip,
        shared_dir=SHARED_MOUNT if config.storage.nas else None,
        data_dir=DATA_MOUNT,
        dashboard_port=config.ray.dashboard_port,
    )


class TrainingJob(pulumi.ComponentResource):
    spec: pulumi.Output[JobSpec]
    job_id: pulumi.Output[str]

    def __init__(self, name: str, args: TrainingJobArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:TrainingJob", name, None, opts)
        config = args.config
        adapter = adapter_for(config.training, config.container)
        shape = cluster_shape(config, args.stack, args.gpus_per_node, args.bf16, head_ip="")
        self.spec = args.ray.head_private_ip.apply(lambda ip: adapter.job(replace(shape, head_ip=ip)))
        self.job_id = self.spec.apply(lambda spec: spec.job_id)
        ctx = steps.StepContext(node=args.head.name, host=args.head.node.public_ip, key=args.private_key,
                                parent=self)
        after: list[tuple[str, pulumi.Resource]] = [(f"{args.head.name}/ray-ready", args.ray.ready)]
        reward = config.training.openrlhf.reward_server if config.training.framework == "openrlhf" else None
        if reward is not None:
            server = steps.remote_step(
                ctx,
                "reward-server",
                ray_commands.REWARD_SCRIPTS,
                {},
                dynamic_env=self.spec.apply(lambda spec: ray_commands.reward_env(config.container.name, spec)),
                after=after,
                delete_scripts=ray_commands.REWARD_STOP_SCRIPTS,
                delete_env=ray_commands.reward_stop_env(config.container.name),
            )
            after = [*after, (f"{args.head.name}/reward-server", server)]
        if config.training.auto_start:
            steps.remote_step(
                ctx,
                "job",
                ray_commands.SUBMIT_SCRIPTS,
                {},
                dynamic_env=self.spec.apply(
                    lambda spec: ray_commands.submit_env(config.container.name, config.ray.dashboard_port, spec)
                ),
                after=after,
                delete_scripts=ray_commands.JOB_STOP_SCRIPTS,
                delete_env=self.job_id.apply(
                    lambda job_id: ray_commands.job_stop_env(config.container.name, config.ray.dashboard_port, job_id)
                ),
                triggers=[self.job_id],
                delete_before_replace=True,
            )
        self.register_outputs({"jobId": self.job_id})
