"""verl: the checkout on every node, data preparation on the head, `python3 -m verl.trainer.main_ppo` with Hydra
overrides sized from the cluster (verified-facts#verl-verl-openrlhf)."""

from __future__ import annotations

import math
import posixpath
import re
import shlex
from collections.abc import Mapping
from typing import Any, ClassVar

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
    merged_overrides,
    resume_of,
    source_models,
)

VERL_DIR = "/workspace/verl"
DEFAULT_SAVE_FREQ = 10  # training.checkpointEvery null
FINAL_ONLY_SAVE_FREQ = 1_000_000_000  # training.checkpointEvery 0: no run reaches it, the last step still saves
# From verl's own verl/trainer/runtime_env.yaml, less `working_dir`: the code is installed on every node at the
# same path, so nothing is uploaded (an uploaded tree would also shadow the installed package).
RUNTIME_ENV_VARS = {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}

TRAIN_BATCH = "data.train_batch_size"
ROLLOUT_N = "actor_rollout_ref.rollout.n"
ROLLOUT_TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"
MINI_BATCH = "actor_rollout_ref.actor.ppo_mini_batch_size"
ULYSSES_SP = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
ACTOR_MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
ROLLOUT_LOG_PROB_MICRO = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
REF_LOG_PROB_MICRO = "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"
CRITIC_MICRO = "critic.ppo_micro_batch_size_per_gpu"
DYNAMIC_BSZ = "actor_rollout_ref.actor.use_dynamic_bsz"
ADV_ESTIMATOR = "algorithm.adv_estimator"
MAX_MICRO_BATCH = 4
# verl v0.7.0's defaults where the checks need them (verl/trainer/config/ppo_trainer.yaml and its defaults).
VERL_DEFAULTS: dict[str, Any] = {TRAIN_BATCH: 1024, ROLLOUT_N: 1, MINI_BATCH: 256, ADV_ESTIMATOR: "gae"}
# fp16 where the GPU has no bf16 (V100, T4): the FSDP param dtype of actor and ref (fsdp_workers.py), vLLM's
# dtype, and SDPA attention instead of verl's default flash_attention_2 (fsdp_workers.py), which needs sm80.
# see verified-facts#verl-fsdp-workers
FP16_OVERRIDES: dict[str, Any] = {
    "actor_rollout_ref.actor.fsdp_config.dtype": "float16",
    "actor_rollout_ref.ref.fsdp_config.dtype": "float16",
    "actor_rollout_ref.rollout.dtype": "float16",
    "++actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
}
BF16_VALUES = ("bf16", "bfloat16")
SM80_ATTENTION = ("flash_attention_2", "flash_attention_3")

# Strings Hydra reads back unchanged without quotes; anything else is double-quoted.
_PLAIN_STRING = re.compile(r"[A-Za-z_/][\w./:@+-]*")
_HYDRA_KEYWORD = re.compile(r"(?i)true|false|null|nan|[+-]?inf")


def hydra_value(value: Any) -> str:
    """A value in Hydra's override grammar, read back as the same value: lists `[a,b]`, dicts `{k:v}` (Hydra
    does not accept JSON's quoted keys), strings quoted where they would otherwise change type or split into a
    sweep (`a,b`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{name}:{hydra_value(item)}" for name, item in value.items()) + "}"
    text = str(value)
    if _PLAIN_STRING.fullmatch(text) and not _HYDRA_KEYWORD.fullmatch(text):
        return text
    # Hydra treats a backslash as an escape only before a quote (and so before the closing quote).
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text)
    escaped = re.sub(r'(\\*)"', lambda m: m.group(1) * 2 + '\\"', escaped)
    return f'"{escaped}"'


class VerlAdapter(FrameworkFacts):
    name = "verl"
    # verl v0.7.0 prints "step:N - key:val - ..." through its console logger; a training step's metrics hold
    # training/global_step, which the validation-only line does not (see verified-facts#base-ray-trainer).
    first_step_pattern = "step:[0-9]+ - .*training/global_step:[0-9]+"
    prefetches_models = True
    overrides_on_command_line = True  # Hydra
    cluster_keys: ClassVar[tuple[tuple[str, str], ...]] = (
        ("trainer.nnodes", "nodes"), ("trainer.n_gpus_per_node", "gpus_per_node"))

    def __init__(self, training: TrainingConfig, container: ContainerConfig):
        self.training = training
        self.container = container
        self.verl = training.verl

    def code(self) -> CodeSpec:
        # `pip install --no-deps -e .`: the verl images carry the dependencies but not verl itself.
        return CodeSpec(
            repo=self.verl.repo,
            ref=self.verl.ref,
            archive_url=self.verl.archive_url or github_archive_url(self.verl.repo, self.verl.ref),
            mirror_repo=self.verl.mirror_repo,
            code_dir=VERL_DIR,
            requirements_file=None,
            pip_index_url=self.verl.pip_index_url,
            install_editable=True,
            extra_packages="",
        )

    def _user(self) -> dict[str, Any]:
        return {bare_key(name): value for name, value in flatten(self.training.overrides).items()}

    def normalized_mini_batch(self, shape: ClusterShape) -> int | None:
        """The actor's mini-batch per data-parallel rank, as verl's worker computes it before asserting on it
        (verl/workers/fsdp_workers.py at v0.7.0): ppo_mini_batch_size x rollout.n // (GPUs // SP).
        See verified-facts#verl-fsdp-workers-6."""
        user = self._user()
        mini, samples = user.get(MINI_BATCH, VERL_DEFAULTS[MINI_BATCH]), user.get(ROLLOUT_N, VERL_DEFAULTS[ROLLOUT_N])
        sp = user.get(ULYSSES_SP, 1)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (mini, samples, sp)):
            return None
        ranks = shape.total_gpus // sp
        return mini * samples // ranks if ranks else None

    def micro_batch(self, shape: ClusterShape) -> int:
        """Micro-batch per GPU from the cluster: the largest of 4, 2, 1 that divides the normalized mini-batch
        (fsdp_workers.py asserts the division), so a small GPU is not handed a large micro-batch.
        See verified-facts#verl-fsdp-workers-7."""
        normalized = self.normalized_mini_batch(shape) or 1
        return math.gcd(normalized, MAX_MICRO_BATCH) or 1

    def resume(self) -> bool:
        return resume_of(self.training, default=True)

    def checkpoint_dir(self, shape: ClusterShape) -> str:
        # FSDP checkpoints are one file per rank (model_world_size_<W>_rank_<r>.pt): another GPU count cannot
        # load them (verl-openrlhf.md 1.6, issue 2265), so the directory is per world size.
        identity = job_name(self.name, shape, self.resume(), self.job_id(shape), per_world_size=True)
        return shape.checkpoint_dir(identity)

    def cluster_overrides(self, shape: ClusterShape) -> dict[str, Any]:
        data_dir = self.verl.data_dir
        micro = self.micro_batch(shape)
        overrides: dict[str, Any] = {
            "trainer.nnodes": shape.nodes,
            "trainer.n_gpus_per_node": shape.gpus_per_node,
            "data.train_files": posixpath.join(data_dir, "train.parquet"),
            "data.val_files": posixpath.join(data_dir, "test.parquet"),
            # verl's default is relative, i.e. inside Ray's temporary working dir (lost with the job).
            "trainer.default_local_dir": self.checkpoint_dir(shape),
            # verl saves nothing with its default -1; N > 0 saves every N steps and the last one
            # (verl/trainer/ppo/ray_trainer.py). "Final only": a period no run reaches.
            # see verified-facts#verl-ray-trainer
            "trainer.save_freq": self.save_freq(),
            "actor_rollout_ref.rollout.name": "vllm",  # verl's default is `???` (required)
            ROLLOUT_TP: self._default_tp(shape),
            "trainer.logger": ["console"],  # verl's default adds wandb, which needs an API key
            # Required unless use_dynamic_bsz (workers/config/actor.py, utils/config.py).
            # see verified-facts#verl-actor
            ACTOR_MICRO: micro,
            ROLLOUT_LOG_PROB_MICRO: micro,
            REF_LOG_PROB_MICRO: micro,
        }
        user = self._user()
        if user.get("critic.enable", user.get(ADV_ESTIMATOR, VERL_DEFAULTS[ADV_ESTIMATOR]) == "gae") is True:
            overrides[CRITIC_MICRO] = micro  # verl/workers/config/critic.py asserts it like the actor's
            # see verified-facts#verl-critic
        for per_gpu in (ACTOR_MICRO, ROLLOUT_LOG_PROB_MICRO, REF_LOG_PROB_MICRO, CRITIC_MICRO):
            # verl refuses both the deprecated global size and the per-GPU one (actor.py, config.py).
            # see verified-facts#verl-actor-2
            if per_gpu.removesuffix("_per_gpu") in user:
                overrides.pop(per_gpu, None)
        if not self._resume_handed(shape) and "trainer.resume_mode" not in user:
            # Nothing to hand over: start fresh (verl's `auto` would read latest_checkpointed_iteration.txt).
            overrides["trainer.resume_mode"] = "disable"
        if not shape.bf16:
            # V100/T4: no bf16 and no FlashAttention 2 (sm80+). dp_actor.py scales the loss for fp16.
            # see verified-facts#verl-dp-actor
            overrides.update(FP16_OVERRIDES)
        return overrides

    def save_freq(self) -> int:
        every = self.training.checkpoint_every
        if every is None:
            return DEFAULT_SAVE_FREQ
        return every if every > 0 else FINAL_ONLY_SAVE_FREQ

    def checkpoints(self, shape: ClusterShape) -> Checkpoints:
        user = self._user()
        freq = user.get("trainer.save_freq", self.save_freq())
        every = every_steps(0 if not isinstance(freq, int) or freq >= FINAL_ONLY_SAVE_FREQ else freq)
        if isinstance(freq, int) and freq <= 0:
            every = "never (trainer.save_freq <= 0 in training.overrides)"
        directory = str(user.get("trainer.default_local_dir", self.checkpoint_dir(shape)))
        saves = checkpoints(
            "verl", shape, directory, every + " (trainer.save_freq)", self.resume(),
            "`trainer.resume_mode=resume_path trainer.resume_from_path=<dir>/global_step_N` (complete: data.pt "
            "written, actor/ not empty; verl/trainer/ppo/ray_trainer.py:938-1062)",
        )
        if "trainer.resume_mode" in user:
            return Checkpoints("", directory, every, saves.shared, False,
                               "as trainer.resume_mode in training.overrides says")
        return saves

    def _resume_handed(self, shape: ClusterShape) -> bool:
        return "trainer.resume_mode" not in self._user() and self.checkpoints(shape).find

    def runtime_env_vars(self, shape: ClusterShape) -> dict[str, str]:
        env = {**RUNTIME_ENV_VARS, **shape.download_env()}
        if shape.model_source == "modelscope":
            env["VERL_USE_MODELSCOPE"] = "True"  # verl/__init__.py patches the hub to ModelScope
        return env

    def effective_overrides(self, shape: ClusterShape) -> dict[str, Any]:
        return merged_overrides(self.cluster_overrides(shape), self.training.overrides)

    def arguments(self, shape: ClusterShape) -> list[str]:
        return [f"{name}={hydra_value(value)}" for name, value in self.effective_overrides(shape).items()]

    def configuration(self) -> dict[str, Any]:
        return {
            "verl": self.verl.model_dump(mode="json", exclude=set(WHERE_FROM_ONLY)),
            "overrides": self.training.overrides,
            "resume": self.resume(),
            **image_facts(self.container),
        }

    def job_id(self, shape: ClusterShape) -> str:
        return job_id(self.name, shape, self.configuration())

    def prepare(self, shape: ClusterShape | None = None) -> str | None:
        command = self.verl.data_preparation
        if command is None:
            return None
        if shape is not None:
            # The dataset download goes to the same source as the job's (a mirror in mainland regions).
            exports = [f"{name}={shlex.quote(value)}" for name, value in sorted(self.runtime_env_vars(shape).items())
                       if name not in RUNTIME_ENV_VARS]
            if exports:
                command = f"export {' '.join(exports)}; {command}"
        data_dir = shlex.quote(self.verl.data_dir)
        train = shlex.quote(posixpath.join(self.verl.data_dir, "train.parquet"))
        user_command = command.replace("{data_dir}", data_dir)
        skipped = shlex.quote(f"verl data: {self.verl.data_dir}/train.parquet exists; preparation skipped")
        # The user's command runs in a subshell so that its own `;`, `||` or `cd` cannot change the outcome.
        return (
            f"cd {VERL_DIR} && if [ -e {train} ]; then echo {skipped}; "
            f"else mkdir -p {data_dir} && ( {user_command} ); fi"
        )

    def pre_submit_check(self, shape: ClusterShape) -> str | None:
        """The parquet files must be there before the job starts (a TaskRunner on any node reads them)."""
        effective = {bare_key(k): v for k, v in self.effective_overrides(shape).items()}
        paths = [
            value
            for value in (effective.get("data.train_files"), effective.get("data.val_files"))
            if isinstance(value, str) and value.startswith("/")
        ]
        if not paths:
            return None
        tests = " && ".join(f"test -s {shlex.quote(path)}" for path in paths)
        missing = "verl data missing: expected " + " and ".join(paths) + " (see training.verl.dataPreparation)"
        return f"{tests} || {{ echo {shlex.quote(missing)} >&2; exit 1; }}"

    def job(self, shape: ClusterShape) -> JobSpec:
        arguments = self.arguments(shape)
        entrypoint = " ".join(["python3", "-m", shlex.quote(self.verl.entrypoint_module), *map(shlex.quote, arguments)])
        saves = self.checkpoints(shape)
        if saves.find:
            # The checkpoint the job step found (verl v0.7.0 `resume_path` asserts a global_step_ folder,
            # ray_trainer.py), or a fresh start; Hydra takes the path's characters as they are.
            # see verified-facts#verl-ray-trainer-2
            entrypoint = (
                f'if [ -n "${{{RESUME_VARIABLE}:-}}" ]; then '
                f'echo "roll-cluster: verl resumes from ${{{RESUME_VARIABLE}}}"; '
                f'set -- trainer.resume_mode=resume_path '
                f'"trainer.resume_from_path=${{{RESUME_VARIABLE}}}"; else set -- trainer.resume_mode=disable; fi; '
                f'exec {entrypoint} "$@"'
            )
        prepare = self.prepare(shape)
        check = self.pre_submit_check(shape)
        runtime_env = {"env_vars": self.runtime_env_vars(shape)}
        return JobSpec(
            job_id=self.job_id(shape),
            workdir=VERL_DIR,
            entrypoint=entrypoint,
            runtime_env=runtime_env,
            files={},
            prepare=prepare,
            pre_submit_check=check,
            reward_server=None,
            summary={
                "framework": self.name,
                "cluster": shape.facts(),
                "code": {"repo": self.verl.repo, "ref": self.verl.ref, "dir": VERL_DIR},
                "hydra_overrides": arguments,
                "overrides": self.training.overrides,
                "command": entrypoint,
                "checkpoints": self.checkpoint_dir(shape),
                "resume": self.resume(),
                "model_source": shape.model_source,
                "data_preparation": prepare,
                "checks": [check] if check else [],
                "runtime_env": runtime_env,
            },
            checkpoints=saves,
            models=self.models(shape),
        )

    def models(self, shape: ClusterShape) -> tuple[ModelRef, ...]:
        """The models verl loads by name: the actor's (and the reference's, which is the same,
        verl/workers/fsdp_workers.py), the critic's and the reward model's, through transformers'
        from_pretrained with a hub id left as it is (verl/utils/fs.py copy_to_local: only hdfs:// is
        copied) into huggingface_hub's cache, or ModelScope's with VERL_USE_MODELSCOPE (verl/__init__.py).
        See verified-facts#verl-fsdp-workers-8."""
        effective = {bare_key(k): v for k, v in self.effective_overrides(shape).items()}
        names = [effective.get(name) for name in ("actor_rollout_ref.model.path", "critic.model.path",
                                                  "reward_model.model.path")]
        return source_models(shape, names)

    def problems(self, shape: ClusterShape) -> list[str]:
        """What verl v0.7.0 asserts at start-up (paths in the verl package), checked before anything is paid for."""
        problems: list[str] = []
        user = self._user()
        total = shape.total_gpus
        cluster = f"the cluster's {total} GPUs ({shape.nodes} x {shape.gpus_per_node})"
        path = "training.overrides."

        def number(name: str) -> Any:
            return user.get(name, VERL_DEFAULTS.get(name))

        def where(name: str) -> str:
            return key(path + name) if name in user else key("training.overrides") + f" (verl's default {name})"

        logger = user.get("trainer.logger", ["console"])
        loggers = logger if isinstance(logger, list) else [logger]
        if self.training.start_timeout_minutes > 0 and "console" not in loggers:
            # The start gate reads verl's console metrics line (verl/utils/logger/aggregate_logger.py).
            # see verified-facts#verl-aggregate-logger
            problems.append(
                f"{key(path + 'trainer.logger')}: must include `console` while the start gate waits for verl's "
                f"first step line (or set {key('training.startTimeoutMinutes')} to 0); got {logger!r}"
            )

        batch, samples, mini = number(TRAIN_BATCH), number(ROLLOUT_N), number(MINI_BATCH)
        numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in (batch, samples, mini))
        dynamic = user.get(DYNAMIC_BSZ) is True
        if numbers and not dynamic and (batch * samples) % total:
            # verl/utils/config.py (FSDP: the minimal batch is the GPU count)
            # see verified-facts#verl-config
            named = TRAIN_BATCH if TRAIN_BATCH in user else ROLLOUT_N
            problems.append(
                f"{where(named)}: {TRAIN_BATCH} x {ROLLOUT_N} must be divisible by {cluster}; got {batch} x "
                f"{samples} = {batch * samples}"
            )
        if numbers and not dynamic and batch < mini:
            # verl/workers/config/actor.py
            # see verified-facts#verl-actor-3
            problems.append(f"{where(MINI_BATCH)}: must be at most {TRAIN_BATCH} ({batch}); got {mini}")
        normalized = self.normalized_mini_batch(shape)
        if numbers and not dynamic and normalized == 0:
            # verl/workers/fsdp_workers.py
            # see verified-facts#verl-fsdp-workers-2
            problems.append(
                f"{where(MINI_BATCH)}: {MINI_BATCH} x {ROLLOUT_N} must be at least the data-parallel ranks "
                f"({total} GPUs); got {mini} x {samples} = {mini * samples}"
            )
        micro = user.get(ACTOR_MICRO)
        if normalized and isinstance(micro, int) and not dynamic and (micro < 1 or normalized % micro):
            # verl/workers/fsdp_workers.py
            # see verified-facts#verl-fsdp-workers-3
            problems.append(
                f"{key(path + ACTOR_MICRO)}: must divide the mini-batch per GPU ({MINI_BATCH} x {ROLLOUT_N} // "
                f"{total} GPUs = {normalized}); got {micro}"
            )
        tp = user.get(ROLLOUT_TP, self._default_tp(shape))
        if not isinstance(tp, int) or tp < 1 or total % tp:
            # verl splits the GPUs into rollout engines of TP GPUs each (verl-openrlhf.md 1.5).
            problems.append(f"{where(ROLLOUT_TP)}: must divide {cluster}; got {tp!r}")
        if not shape.bf16:
            problems += self._fp16_problems(user)
        data_dir = self.verl.data_dir
        shared = shape.shared_dir
        on_shared = bool(shared) and (data_dir == shared or data_dir.startswith(str(shared).rstrip("/") + "/"))
        if shape.nodes > 1 and not on_shared and "data.train_files" not in user:
            problems.append(
                f"{key('training.verl.dataDir')}: must be on the shared storage with {shape.nodes} nodes (verl's "
                "TaskRunner reads the data on any node); set roll-cluster:storage.nas: true and a dataDir under "
                f"/mnt/shared; got {data_dir!r}" + ("" if shared else " without shared storage")
            )
        return problems

    @staticmethod
    def _default_tp(shape: ClusterShape) -> int:
        return min(2, shape.gpus_per_node)  # verl's default is 2; a node of one GPU gets 1

    def _fp16_problems(self, user: dict[str, Any]) -> list[str]:
        """GPUs without bf16 (V100, T4) have no FlashAttention 2 either (it needs sm80)."""
        problems: list[str] = []
        gpus = "the cluster's GPUs have no bf16 (V100/T4)"
        for name, value in user.items():
            if name.split(".")[-1] in ("dtype", "param_dtype", "model_dtype") and str(value).lower() in BF16_VALUES:
                problems.append(f"{key('training.overrides.' + name)}: must not be bf16: {gpus}; use float16; "
                                f"got {value!r}")
            if name.split(".")[-1] == "attn_implementation" and value in SM80_ATTENTION:
                problems.append(f"{key('training.overrides.' + name)}: must not be {value}: it needs sm80 and "
                                f"{gpus}; use sdpa or eager; got {value!r}")
        critic_mixed = any(name.startswith("critic.model.fsdp_config.mixed_precision") for name in user)
        if user.get(ADV_ESTIMATOR, VERL_DEFAULTS[ADV_ESTIMATOR]) == "gae" and not critic_mixed:
            # verl/workers/fsdp_workers.py: the critic's FSDP params are bf16 unless mixed_precision is set.
            # see verified-facts#verl-fsdp-workers-4
            problems.append(
                f"{key('training.overrides.' + ADV_ESTIMATOR)}: `gae` trains a critic, which verl v0.7.0 runs in "
                f"bf16 and {gpus}; use a critic-free estimator (e.g. grpo) or set "
                "critic.model.fsdp_config.mixed_precision.param_dtype: fp16; got "
                f"{user.get(ADV_ESTIMATOR, 'gae (verl default)')!r}"
            )
        if user.get("reward_model.enable") is True:
            # verl/workers/fsdp_workers.py: the reward model is loaded in bf16.
            # see verified-facts#verl-fsdp-workers-5
            problems.append(f"{key('training.overrides.reward_model.enable')}: verl v0.7.0 loads the reward model "
                            f"in bf16 and {gpus}; use a function reward; got true")
        return problems
