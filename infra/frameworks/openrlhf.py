"""OpenRLHF: the pip package on every node, an optional reward-model server on the head, and
`python3 -m openrlhf.cli.train_ppo_ray` with dotted flags sized from the cluster
(../shared/reference/verl-openrlhf.md section 2; flag names of OpenRLHF >= 0.10.2)."""

from __future__ import annotations

import json
import posixpath
import shlex
from collections.abc import Callable
from typing import Any

from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks.base import (
    WHERE_FROM_ONLY,
    ClusterShape,
    CodeSpec,
    JobSpec,
    bare_key,
    flatten,
    image_facts,
    job_id,
    key,
)
from infra.ray.commands import RewardServer

WORKDIR = "/workspace"
# train_ppo_ray's own defaults where the checks below need one (openrlhf/cli/train_ppo_ray.py, v0.10.2).
FLAG_DEFAULTS: dict[str, Any] = {
    "actor.num_nodes": 1,
    "actor.num_gpus_per_node": 8,
    "ref.num_nodes": 1,
    "ref.num_gpus_per_node": 8,
    "critic.num_nodes": 1,
    "critic.num_gpus_per_node": 8,
    "reward.num_nodes": 1,
    "reward.num_gpus_per_node": 8,
    "vllm.num_engines": None,
    "vllm.tensor_parallel_size": 1,
    "algo.kl.init_coef": 0.01,
}


def flag_arguments(flags: dict[str, Any]) -> list[str]:
    """`key: value` -> `--key value`; true -> `--key`; false or null -> omitted; a list -> `--key a b`."""
    arguments: list[str] = []
    for name, value in flags.items():
        flag = "--" + bare_key(name)
        if value is None or value is False:
            continue
        if value is True:
            arguments.append(flag)
        elif isinstance(value, list):
            arguments += [flag, *(_flag_value(item) for item in value)]
        else:
            arguments += [flag, _flag_value(value)]
    return arguments


def _flag_value(value: Any) -> str:
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)  # e.g. a JSON-valued flag such as generation kwargs
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class OpenRlhfAdapter:
    name = "openrlhf"

    def __init__(self, training: TrainingConfig, container: ContainerConfig):
        self.training = training
        self.container = container
        self.openrlhf = training.openrlhf

    def code(self) -> CodeSpec:
        # No checkout: the package from the index on every node (job workers run in each node's container).
        return CodeSpec(
            repo=None,
            ref=None,
            archive_url=None,
            code_dir=None,
            requirements_file=None,
            pip_index_url=self.openrlhf.pip_index_url,
            install_editable=False,
            extra_packages=self.openrlhf.package,
        )

    def reward_url(self, shape: ClusterShape) -> str | None:
        server = self.openrlhf.reward_server
        if server is None:
            return None
        return f"http://{shape.head_ip}:{server.port}/get_reward"

    def cluster_flags(self, shape: ClusterShape) -> dict[str, Any]:
        flags: dict[str, Any] = {
            "actor.num_nodes": shape.nodes,
            "actor.num_gpus_per_node": shape.gpus_per_node,
            "ref.num_nodes": shape.nodes,
            "ref.num_gpus_per_node": shape.gpus_per_node,
            "vllm.num_engines": self.openrlhf.vllm_num_engines,
            "vllm.tensor_parallel_size": self.openrlhf.vllm_tensor_parallel_size,
        }
        url = self.reward_url(shape)
        if url is not None:
            flags["reward.remote_url"] = url
        # OpenRLHF's defaults are relative (./ckpt), i.e. wherever the job's cwd happens to be.
        root = shape.output_root("openrlhf")
        flags["ckpt.path"] = posixpath.join(root, "checkpoints")
        flags["ckpt.output_dir"] = posixpath.join(root, "model")
        return flags

    def effective_flags(self, shape: ClusterShape) -> dict[str, Any]:
        """Cluster flags, then the user's overrides; a user flag replaces ours in place."""
        merged: dict[str, Any] = {bare_key(name): value for name, value in self.cluster_flags(shape).items()}
        for name, value in flatten(self.training.overrides).items():
            merged[bare_key(name)] = value
        return merged

    def job(self, shape: ClusterShape) -> JobSpec:
        arguments = flag_arguments(self.effective_flags(shape))
        module = shlex.quote(self.openrlhf.entrypoint_module)
        entrypoint = " ".join(["python3", "-m", module, *map(shlex.quote, arguments)])
        server = self.openrlhf.reward_server
        reward = (
            RewardServer(
                command=server.command.replace("{port}", str(server.port)),
                port=server.port,
                health_timeout_s=server.health_timeout_seconds,
                workdir=WORKDIR,
            )
            if server is not None
            else None
        )
        configuration = {
            "openrlhf": self.openrlhf.model_dump(mode="json", exclude=set(WHERE_FROM_ONLY)),
            "overrides": self.training.overrides,
            **image_facts(self.container),
        }
        return JobSpec(
            job_id=job_id(self.name, shape, configuration),
            workdir=WORKDIR,
            entrypoint=entrypoint,
            runtime_env=None,
            files={},
            prepare=None,
            pre_submit_check=None,
            reward_server=reward,
            summary={
                "framework": self.name,
                "cluster": shape.facts(),
                "package": self.openrlhf.package,
                "flags": arguments,
                "overrides": self.training.overrides,
                "command": entrypoint,
                "reward_server": (
                    {"command": reward.command, "port": reward.port, "url": self.reward_url(shape)} if reward else None
                ),
                "checks": ["vLLM engines x tensor parallel size fit the cluster's GPUs", "placement demand <= GPUs"],
            },
        )

    def problems(self, shape: ClusterShape) -> list[str]:
        """What train_ppo_ray asserts, or where Ray would leave its placement groups pending forever."""
        flags = {**FLAG_DEFAULTS, **self.effective_flags(shape)}
        total = shape.total_gpus
        cluster = f"the cluster's {total} GPUs ({shape.nodes} x {shape.gpus_per_node})"
        problems: list[str] = []

        def number(name: str) -> int:
            value = flags.get(name)
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        def where(flag: str, config_key: str) -> str:
            user = {bare_key(k) for k in flatten(self.training.overrides)}
            return key(f"training.overrides.{flag}") if flag in user else key(config_key)

        engines, tp = number("vllm.num_engines"), number("vllm.tensor_parallel_size")
        vllm_gpus = engines * tp
        actor = number("actor.num_nodes") * number("actor.num_gpus_per_node")
        ref = number("ref.num_nodes") * number("ref.num_gpus_per_node")
        colocate_all = flags.get("train.colocate_all") is True
        asynchronous = flags.get("train.async_enable") is True
        if vllm_gpus > total:
            problems.append(
                f"{where('vllm.num_engines', 'training.openrlhf.vllmNumEngines')}: vLLM engines x tensor parallel "
                f"size must fit {cluster}; got {engines} x {tp} = {vllm_gpus}"
            )
        if colocate_all and not asynchronous and vllm_gpus != actor:
            problems.append(
                f"{where('vllm.num_engines', 'training.openrlhf.vllmNumEngines')}: with train.colocate_all, vLLM "
                f"engines x tensor parallel size must equal the actor's GPUs (actor.num_nodes x "
                f"actor.num_gpus_per_node); got {engines} x {tp} = {vllm_gpus} and actor {actor}"
            )
        demand, parts = self._placement_demand(flags, actor, ref, vllm_gpus, number)
        if demand > total and not problems:
            problems.append(
                f"{key('training.overrides')}: the roles need {demand} GPUs ({', '.join(parts)}) but {cluster} "
                "exist, so Ray would wait forever; colocate them (train.colocate_all: true, with vLLM engines x TP "
                "= actor GPUs) or shrink them (actor.num_nodes, ref.num_gpus_per_node, ...)"
            )
        return problems

    @staticmethod
    def _placement_demand(
        flags: dict[str, Any], actor: int, ref: int, vllm_gpus: int, number: Callable[[str], int]
    ) -> tuple[int, list[str]]:
        """GPUs the roles claim, following train_ppo_ray's placement: colocated roles share one placement
        group sized for the actor; every other role takes whole GPUs of its own."""
        colocate_all = flags.get("train.colocate_all") is True
        colocate_actor_ref = flags.get("train.colocate_actor_ref") is True
        colocate_critic_reward = flags.get("train.colocate_critic_reward") is True
        asynchronous = flags.get("train.async_enable") is True
        kl = flags.get("algo.kl.init_coef")
        uses_ref = not isinstance(kl, int | float) or kl > 0
        critic = 0
        if flags.get("critic.model_name_or_path"):
            critic = number("critic.num_nodes") * number("critic.num_gpus_per_node")
        reward = 0  # a remote reward server takes no GPU of the cluster's placement
        if not flags.get("reward.remote_url"):
            reward = number("reward.num_nodes") * number("reward.num_gpus_per_node")
        parts = [f"actor {actor}"]
        if colocate_all:
            demand = actor
            parts[0] += " shared by all colocated roles"
            if asynchronous and vllm_gpus:
                demand += vllm_gpus
                parts.append(f"vLLM {vllm_gpus} (async: not colocated)")
            return demand, parts
        demand = actor
        if uses_ref and not colocate_actor_ref:
            demand += ref
            parts.append(f"ref {ref}")
        if vllm_gpus:
            demand += vllm_gpus
            parts.append(f"vLLM {vllm_gpus}")
        if colocate_critic_reward and critic:
            demand += critic
            parts.append(f"critic+reward {critic}")
        else:
            if critic:
                demand += critic
                parts.append(f"critic {critic}")
            if reward:
                demand += reward
                parts.append(f"reward model {reward}")
        return demand, parts
