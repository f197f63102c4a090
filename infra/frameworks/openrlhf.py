"""OpenRLHF: the pip package on every node, an optional reward-model server on the head, and
`python3 -m openrlhf.cli.train_ppo_ray` with dotted flags sized from the cluster
(verified-facts#openrlhf-verl-openrlhf; flag names of OpenRLHF >= 0.10.2)."""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Callable
from typing import Any

from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks.base import (
    RESUME_VARIABLE,
    WHERE_FROM_ONLY,
    Checkpoints,
    ClusterShape,
    CodeSpec,
    FrameworkFacts,
    JobSpec,
    ModelRef,
    bare_key,
    checkpoints,
    every_steps,
    flatten,
    github_archive_url,
    image_facts,
    job_id,
    job_name,
    key,
    resume_of,
    source_models,
)
from infra.ray.step_env import HEAD_IP_VARIABLE, RewardServer

DEFAULT_SAVE_STEPS = 10  # training.checkpointEvery null
OPENRLHF_DIR = "/workspace/OpenRLHF"
COLOCATE_ALL = "train.colocate_all"
GPU_MEMORY = "vllm.gpu_memory_utilization"
COLOCATED_GPU_MEMORY = 0.5
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
    GPU_MEMORY: 0.95,
    "ds.param_dtype": "bf16",
    "ds.attn_implementation": "flash_attention_2",
    "data.input_key": "input",
    "rollout.n_samples_per_prompt": 1,
    "rollout.batch_size": 1024,
    "rollout.micro_batch_size": 1,
    "train.batch_size": 128,
    "train.micro_batch_size": 1,
    "ds.ring_attn_size": 1,
    "ds.tensor_parallel_size": 1,
    "algo.advantage.estimator": "gae",
}


# The flags that size the roles' placement groups (train_ppo_ray.py), in the order a refusal names them.
PLACEMENT_FLAGS = (
    "actor.num_nodes", "actor.num_gpus_per_node", "ref.num_nodes", "ref.num_gpus_per_node", "vllm.num_engines",
    "vllm.tensor_parallel_size", "critic.num_nodes", "critic.num_gpus_per_node", "reward.num_nodes",
    "reward.num_gpus_per_node",
)


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


_HEAD_IP_WORD = re.compile(r"[A-Za-z0-9:/._-]*\$\{" + HEAD_IP_VARIABLE + r"\}[A-Za-z0-9:/._-]*")


def _shell_word(argument: str) -> str:
    """An argument quoted for the entrypoint's shell: in double quotes where it names the head as
    ${ROLL_CLUSTER_HEAD_IP} (and holds nothing else the shell would expand), so the shell puts the address in;
    otherwise quoted as is."""
    if _HEAD_IP_WORD.fullmatch(argument):
        return f'"{argument}"'
    return shlex.quote(argument)


def _shown_flag(value: Any) -> str:
    return "nothing" if value is None else json.dumps(value)


def _flag_value(value: Any) -> str:
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)  # e.g. a JSON-valued flag such as generation kwargs
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class OpenRlhfAdapter(FrameworkFacts):
    name = "openrlhf"
    # OpenRLHF v0.10.2 logs "... Global step N: ..." once per step (see verified-facts#base-ppo-trainer).
    first_step_pattern = "Global step [0-9]+: "
    prefetches_models = True
    overrides_on_command_line = True  # argparse

    def __init__(self, training: TrainingConfig, container: ContainerConfig):
        self.training = training
        self.container = container
        self.openrlhf = training.openrlhf

    def code(self) -> CodeSpec:
        # The checkout at the package's ref on every node (the job and the reward server run from it, as
        # upstream's README runs from /openrlhf), then the install of upstream's dockerfile at v0.10.2: remove the
        # conflicting packages, install the vLLM pin and the prebuilt flash-attn wheel with the package.
        settings = self.openrlhf
        return CodeSpec(
            repo=settings.repo,
            ref=settings.ref,
            archive_url=settings.archive_url or github_archive_url(settings.repo, settings.ref),
            mirror_repo=settings.mirror_repo,
            code_dir=OPENRLHF_DIR,
            requirements_file=None,
            pip_index_url=settings.pip_index_url,
            install_editable=False,
            extra_packages=" ".join([*settings.preinstall_packages, settings.package]),
            uninstall_packages=" ".join(settings.uninstall_packages),
        )

    def resume(self) -> bool:
        return resume_of(self.training, default=True)

    def checkpoint_dir(self, shape: ClusterShape) -> str:
        # DeepSpeed ZeRO checkpoints are sharded by data-parallel rank: per world size, like verl's.
        identity = job_name(self.name, shape, self.resume(), self.job_id(shape), per_world_size=True)
        return shape.checkpoint_dir(identity)

    def reward_url(self) -> str | None:
        """The reward server's URL as the job's entrypoint names it: by the head's private IP, which the job step
        exports to the entrypoint's shell as $ROLL_CLUSTER_HEAD_IP (infra/scripts/ray_common.sh, submit). Not
        127.0.0.1: OpenRLHF posts to it from the vLLM engines (RolloutRayActor builds SingleTurnAgentExecutor with
        remote_rm_url, openrlhf/trainer/ray/vllm_engine.py, which posts in openrlhf/utils/agent.py),
        Ray actors that a placement group puts on any node (vllm_engine.py), not in the driver. Not the
        address itself: it is unknown before the head exists, and the configuration (jobConfig) must be known in
        a first `pulumi preview`. See verified-facts#openrlhf-vllm-engine."""
        server = self.openrlhf.reward_server
        if server is None:
            return None
        return f"http://${{{HEAD_IP_VARIABLE}}}:{server.port}/get_reward"

    def reward_devices(self, shape: ClusterShape) -> list[int]:
        """The head's last `rewardServer.gpus` GPUs: the reward server's, given as CUDA_VISIBLE_DEVICES."""
        server = self.openrlhf.reward_server
        if server is None:
            return []
        return list(range(max(0, shape.gpus_per_node - server.gpus), shape.gpus_per_node))

    def _colocate_all(self) -> bool:
        return self._user().get(COLOCATE_ALL) is True

    def head_reserved_gpus(self, gpus_per_node: int) -> list[int]:
        """The reward server's GPUs, which the head's Ray must leave alone (components/ray_cluster.py ray_settings):
        without train.colocate_all every role takes whole GPUs of its own from Ray (1-GPU bundles,
        openrlhf/trainer/ray/launcher.py, vllm_engine.py), which must not be the server's. With
        it the colocated roles share the head's GPUs with the server on purpose (vLLM at 0.5 of their memory), so
        Ray keeps them all. See verified-facts#openrlhf-launcher."""
        server = self.openrlhf.reward_server
        if server is None or self._colocate_all() or server.gpus > gpus_per_node:
            return []
        return list(range(gpus_per_node - server.gpus, gpus_per_node))

    def _user(self) -> dict[str, Any]:
        return {bare_key(name): value for name, value in flatten(self.training.overrides).items()}

    def cluster_flags(self, shape: ClusterShape) -> dict[str, Any]:
        user = self._user()
        flags: dict[str, Any] = {
            "actor.num_nodes": shape.nodes,
            "actor.num_gpus_per_node": shape.gpus_per_node,
            "ref.num_nodes": shape.nodes,
            "ref.num_gpus_per_node": shape.gpus_per_node,
            "vllm.num_engines": self.openrlhf.vllm_num_engines,
            "vllm.tensor_parallel_size": self.openrlhf.vllm_tensor_parallel_size,
        }
        if user.get(COLOCATE_ALL) is True:
            # vLLM shares the GPUs with the trained models (and the reward server): upstream's colocated example
            # (examples/scripts/train_ppo_ray_hybrid_engine.sh) runs it at 0.5, not the parser's 0.95.
            flags[GPU_MEMORY] = COLOCATED_GPU_MEMORY
        url = self.reward_url()
        if url is not None:
            flags["reward.remote_url"] = url
        # OpenRLHF's defaults are relative (./ckpt), i.e. wherever the job's cwd happens to be.
        checkpoints = self.checkpoint_dir(shape)
        flags["ckpt.path"] = checkpoints
        flags["ckpt.output_dir"] = posixpath.join(checkpoints, "model")
        # Every N steps (OpenRLHF's -1 never saves a resumable state, openrlhf/trainer/ppo_trainer.py);
        # the final HF model always goes to ckpt.output_dir (openrlhf/cli/train_ppo_ray.py).
        # see verified-facts#openrlhf-ppo-trainer
        every = self.training.checkpoint_every
        flags["ckpt.save_steps"] = DEFAULT_SAVE_STEPS if every is None else (every if every > 0 else -1)
        # No ckpt.load_enable here: the entrypoint adds it only when the job step found a complete checkpoint.
        # Given with none there, DeepSpeed returns no state and fit() fails on KeyError 'episode'
        # (ppo_trainer.py).
        # see verified-facts#openrlhf-ppo-trainer-2
        if not shape.bf16:
            # V100/T4: no bf16, and FlashAttention 2 (the parser's default) needs sm80.
            flags["ds.param_dtype"] = "fp16"
            flags["ds.attn_implementation"] = "sdpa"
        if shape.model_source == "modelscope":
            flags["use_ms"] = True  # train_ppo_ray patches the hub to ModelScope
        return flags

    def effective_flags(self, shape: ClusterShape) -> dict[str, Any]:
        """Cluster flags, then the user's overrides; a user flag replaces ours in place."""
        merged: dict[str, Any] = {bare_key(name): value for name, value in self.cluster_flags(shape).items()}
        for name, value in flatten(self.training.overrides).items():
            merged[bare_key(name)] = value
        return merged

    def reward_server(self, shape: ClusterShape) -> RewardServer | None:
        server = self.openrlhf.reward_server
        if server is None:
            return None
        exports = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, self.reward_devices(shape))), **shape.download_env()}
        prefix = "export " + " ".join(f"{name}={shlex.quote(value)}" for name, value in exports.items())
        return RewardServer(
            command=f"{prefix}; " + server.command.replace("{port}", str(server.port)),
            port=server.port,
            health_timeout_s=server.health_timeout_seconds,
            workdir=OPENRLHF_DIR,
        )

    def checkpoints(self, shape: ClusterShape) -> Checkpoints:
        flags = self.effective_flags(shape)
        steps = flags.get("ckpt.save_steps")
        every = every_steps(steps if isinstance(steps, int) and steps > 0 else 0) + " (--ckpt.save_steps; the final "
        every += "HF model to --ckpt.output_dir)"
        directory = str(flags.get("ckpt.path"))
        # One optimizer shard per actor GPU with ZeRO 1-3 (deepspeed/runtime/engine.py); ZeRO 0 writes none.
        # see verified-facts#openrlhf-engine
        zero = flags.get("ds.zero_stage", flags.get("zero_stage", 2))
        world = int(flags["actor.num_nodes"]) * int(flags["actor.num_gpus_per_node"]) if zero != 0 else 0
        saves = checkpoints(
            "openrlhf", shape, directory, every, self.resume(),
            "`--ckpt.load_enable` with `--ckpt.path`, its tag written into _actor/latest and _critic/latest, "
            "which DeepSpeed loads (complete: the tag's model states and one *optim_states.pt per actor GPU, and "
            "the critic's model states of the same tag)", world=world,
        )
        if "ckpt.load_enable" in flags:
            return Checkpoints("", directory, every, saves.shared, False,
                               "as ckpt.load_enable in training.overrides says", world)
        return saves

    def configuration(self) -> dict[str, Any]:
        return {
            "openrlhf": self.openrlhf.model_dump(mode="json", exclude=set(WHERE_FROM_ONLY)),
            "overrides": self.training.overrides,
            "resume": self.resume(),
            **image_facts(self.container),
        }

    def job_id(self, shape: ClusterShape) -> str:
        return job_id(self.name, shape, self.configuration())

    def job(self, shape: ClusterShape) -> JobSpec:
        arguments = flag_arguments(self.effective_flags(shape))
        module = shlex.quote(self.openrlhf.entrypoint_module)
        entrypoint = " ".join(["python3", "-m", module, *map(_shell_word, arguments)])
        saves = self.checkpoints(shape)
        if saves.find:
            entrypoint = f'{openrlhf_resume_command(saves.directory)} exec {entrypoint} "$@"'

        reward = self.reward_server(shape)
        download = shape.download_env()
        runtime_env = {"env_vars": download} if download else None
        return JobSpec(
            job_id=self.job_id(shape),
            workdir=OPENRLHF_DIR,
            entrypoint=entrypoint,
            runtime_env=runtime_env,
            files={},
            prepare=None,
            pre_submit_check=None,
            reward_server=reward,
            summary={
                "framework": self.name,
                "cluster": shape.facts(),
                "code": {"repo": self.openrlhf.repo, "ref": self.openrlhf.ref, "dir": OPENRLHF_DIR},
                "package": self.openrlhf.package,
                "flags": arguments,
                "overrides": self.training.overrides,
                "command": entrypoint,
                "checkpoints": self.checkpoint_dir(shape),
                "resume": self.resume(),
                "model_source": shape.model_source,
                "runtime_env": runtime_env,
                "reward_server": (
                    {
                        "command": reward.command,
                        "port": reward.port,
                        "url": self.reward_url(),
                        "gpus": self.reward_devices(shape),
                        # Without train.colocate_all the head's Ray leaves these GPUs out (head_reserved_gpus).
                        "ray_leaves_them_out": bool(self.head_reserved_gpus(shape.gpus_per_node)),
                    }
                    if reward
                    else None
                ),
                "checks": [
                    "vLLM engines x tensor parallel size fit the cluster's GPUs",
                    "placement demand <= the GPUs Ray has (less the reward server's, unless colocated)",
                ],
            },
            checkpoints=saves,
            models=self.models(shape),
        )

    def models(self, shape: ClusterShape) -> tuple[ModelRef, ...]:
        """The models train_ppo_ray loads by name (openrlhf/cli/train_ppo_ray.py: the actor's, which the
        reference shares, the critic's, the reward model's unless a remote reward URL replaces it), through
        transformers' from_pretrained into huggingface_hub's cache, or ModelScope's with --use_ms (patch_hub in the
        driver, train_ppo_ray.py; whether the Ray actors on other nodes are patched too: UNCONFIRMED). The
        reward server names its model in its own command: it downloads it itself, on the head alone.
        See verified-facts#openrlhf-train-ppo-ray-2."""
        flags = self.effective_flags(shape)
        names = [flags.get("actor.model_name_or_path"), flags.get("critic.model_name_or_path")]
        if not flags.get("reward.remote_url"):
            names.append(flags.get("reward.model_name_or_path"))
        return source_models(shape, names)

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
        server = self.openrlhf.reward_server
        reward_gpus = server.gpus if server is not None else 0
        server_key = key("training.openrlhf.rewardServer.gpus")
        # What Ray hands out: the head's Ray leaves the reward server's GPUs alone unless the roles are colocated
        # with it (head_reserved_gpus; components/ray_cluster.py starts Ray so).
        reserved = len(self.head_reserved_gpus(shape.gpus_per_node))
        ray_gpus = total - reserved
        ray_has = cluster if not reserved else (
            f"the {ray_gpus} GPUs Ray has: {cluster} less the reward server's {reserved} on the head ({server_key}), "
            "which Ray leaves to it without train.colocate_all"
        )
        if vllm_gpus > ray_gpus:
            problems.append(
                f"{where('vllm.num_engines', 'training.openrlhf.vllmNumEngines')}: vLLM engines x tensor parallel "
                f"size must fit {ray_has}; got {engines} x {tp} = {vllm_gpus}"
            )
        if colocate_all and not asynchronous and vllm_gpus != actor:
            problems.append(
                f"{where('vllm.num_engines', 'training.openrlhf.vllmNumEngines')}: with train.colocate_all, vLLM "
                f"engines x tensor parallel size must equal the actor's GPUs (actor.num_nodes x "
                f"actor.num_gpus_per_node); got {engines} x {tp} = {vllm_gpus} and actor {actor}"
            )
        demand, parts = self._placement_demand(flags, actor, ref, vllm_gpus, number)
        if reward_gpus > shape.gpus_per_node:
            problems.append(f"{server_key}: the reward server runs on the head, which has {shape.gpus_per_node} "
                            f"GPUs; got {reward_gpus}")
        if demand > ray_gpus and not problems:
            # Every role's placement group is of 1-GPU bundles (openrlhf/cli/train_ppo_ray.py,
            # launcher.py, vllm_engine.py): the count decides, not the GPUs per node.
            # see verified-facts#openrlhf-train-ppo-ray
            user = self._user()
            named = [flag for flag in PLACEMENT_FLAGS if flag in user]
            lead = key(f"training.overrides.{named[0]}") if named else key(f"training.overrides.{COLOCATE_ALL}")
            problems.append(
                f"{lead}: the roles need {demand} GPUs ({', '.join(parts)}), more than {ray_has}; Ray would wait "
                "forever. Colocate them (train.colocate_all: true, with vLLM engines x TP = actor GPUs) or shrink "
                f"them ({', '.join(named or PLACEMENT_FLAGS[:2])}, ..., training.openrlhf.vllmNumEngines"
                f"{', rewardServer.gpus' if reserved else ''})"
            )
        memory = flags.get(GPU_MEMORY)
        if reward_gpus and colocate_all and isinstance(memory, int | float) and memory > COLOCATED_GPU_MEMORY:
            problems.append(
                f"{key('training.overrides.' + GPU_MEMORY)}: must be at most {COLOCATED_GPU_MEMORY} with "
                f"train.colocate_all and a reward server: the server shares GPUs {self.reward_devices(shape)} of the "
                f"head with vLLM and the trained models; got {memory}"
            )
        if flags.get("data.input_key") == "context_messages" and flags.get("data.apply_chat_template") is not True:
            # A message list is a prompt only through the chat template (openrlhf/datasets/prompts_dataset.py);
            # upstream passes both flags together (examples/scripts/train_ppo_ray_hybrid_engine.sh).
            # see verified-facts#openrlhf-prompts-dataset
            problems.append(
                f"{key('training.overrides.data.apply_chat_template')}: must be true with data.input_key "
                "context_messages (a list of chat messages becomes a prompt only through the tokenizer's chat "
                f"template); got {_shown_flag(flags.get('data.apply_chat_template'))}"
            )
        problems += self._version_problems()
        problems += self._batch_problems(flags, actor, number)
        if not shape.bf16:
            problems += self._fp16_problems(flags)
        return problems

    def _version_problems(self) -> list[str]:
        """The checkout (the job's and the reward server's working dir, where `-m openrlhf...` imports from) and the
        installed package must be the same release."""
        pinned = re.fullmatch(r"openrlhf(?:\[[\w,-]+\])?==([\w.]+)", self.openrlhf.package.replace(" ", ""))
        tag = re.fullmatch(r"v?(\d+(?:\.\d+)*(?:\.post\d+)?)", self.openrlhf.ref)
        if pinned and tag and pinned.group(1) != tag.group(1):
            return [f"{key('training.openrlhf.ref')}: must be the release of training.openrlhf.package "
                    f"(v{pinned.group(1)}); got {self.openrlhf.ref!r}"]
        return []

    def _batch_problems(self, flags: dict[str, Any], actor: int, number: Callable[[str], int]) -> list[str]:
        """The batch rules train_ppo_ray asserts after parsing, and DeepSpeed's batch arithmetic."""
        problems: list[str] = []
        user = self._user()

        def where(flag: str) -> str:
            return key(f"training.overrides.{flag}") + ("" if flag in user else f" (OpenRLHF's default {flag})")

        samples = number("rollout.n_samples_per_prompt")
        estimator = flags.get("algo.advantage.estimator")
        if estimator in ("rloo", "reinforce_baseline", "group_norm") and samples <= 1:
            # openrlhf/cli/train_ppo_ray.py (v0.10.2), after hierarchize: the estimator needs a group per prompt.
            problems.append(f"{where('rollout.n_samples_per_prompt')}: must be more than 1 with "
                            f"algo.advantage.estimator {estimator}; got {samples}")
        ranks = actor // max(1, number("ds.ring_attn_size")) // max(1, number("ds.tensor_parallel_size"))
        rollout, rollout_micro = number("rollout.batch_size"), number("rollout.micro_batch_size")
        if rollout_micro and samples * rollout // rollout_micro < ranks:
            # train_ppo_ray.py's last assert: every actor process needs a sample batch.
            problems.append(
                f"{where('rollout.batch_size')}: rollout.n_samples_per_prompt x rollout.batch_size // "
                f"rollout.micro_batch_size must be at least the actor's {ranks} data-parallel ranks; got {samples} x "
                f"{rollout} // {rollout_micro}"
            )
        train, train_micro = number("train.batch_size"), number("train.micro_batch_size")
        if ranks and train_micro and train % (train_micro * ranks):
            # DeepSpeed: train_batch_size = micro_batch_per_gpu x gradient_accumulation x data-parallel size.
            problems.append(
                f"{where('train.batch_size')}: must be a multiple of train.micro_batch_size x the actor's "
                f"data-parallel ranks ({train_micro} x {ranks} = {train_micro * ranks}); got {train}"
            )
        return problems

    def _fp16_problems(self, flags: dict[str, Any]) -> list[str]:
        gpus = "the cluster's GPUs have no bf16 (V100/T4)"
        problems: list[str] = []
        user = self._user()
        if flags.get("ds.param_dtype") == "bf16":
            problems.append(f"{key('training.overrides.ds.param_dtype')}: must be fp16: {gpus}; got 'bf16'")
        attention = flags.get("ds.attn_implementation")
        if isinstance(attention, str) and attention.startswith("flash_attention") and "ds.attn_implementation" in user:
            problems.append(f"{key('training.overrides.ds.attn_implementation')}: must not be {attention}: it needs "
                            f"sm80 and {gpus}; use sdpa or eager; got {attention!r}")
        server = self.openrlhf.reward_server
        if server is not None and "serve_rm" in server.command:
            words = server.command.split()
            dtype = words[words.index("--ds.param_dtype") + 1] if "--ds.param_dtype" in words[:-1] else "bf16"
            attn = (words[words.index("--ds.attn_implementation") + 1]
                    if "--ds.attn_implementation" in words[:-1] else "flash_attention_2")
            if dtype != "fp16" or attn.startswith("flash_attention"):
                # serve_rm's defaults are bf16 and flash_attention_2 (openrlhf/cli/serve_rm.py at v0.10.2).
                problems.append(
                    f"{key('training.openrlhf.rewardServer.command')}: serve_rm must run with --ds.param_dtype fp16 "
                    f"and --ds.attn_implementation sdpa: {gpus}; got --ds.param_dtype {dtype} "
                    f"--ds.attn_implementation {attn}"
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


def openrlhf_resume_command(directory: str) -> str:
    """The entrypoint's first part when a resume is possible: sets the arguments the command ends with. With the
    tag the job step found (`<directory>/_actor/global_step<N>`, a path of [A-Za-z0-9._/-] only, checked there),
    it points `_actor/latest` and `_critic/latest` at that tag, since OpenRLHF passes DeepSpeed no tag and
    DeepSpeed loads the one `latest` names (trainer/ray/ppo_actor.py, ppo_critic.py;
    deepspeed/runtime/engine.py), which may be a newer, incomplete save; then adds --ckpt.load_enable.
    See verified-facts#openrlhf-ppo-actor."""
    var = RESUME_VARIABLE
    root = shlex.quote(directory)
    return (
        f'if [ -n "${{{var}:-}}" ]; then tag=${{{var}##*/}}; '
        f'{{ printf %s "$tag" >{root}/_actor/latest && '
        f'{{ [ ! -d {root}/_critic ] || printf %s "$tag" >{root}/_critic/latest; }}; }} || '
        f'{{ echo "roll-cluster: could not point _actor/latest under "{root}" at $tag" >&2; exit 2; }}; '
        f'echo "roll-cluster: OpenRLHF resumes from tag $tag (${{{var}}})"; '
        'set -- --ckpt.load_enable; else set --; fi;'
    )
