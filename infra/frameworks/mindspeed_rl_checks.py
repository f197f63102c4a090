"""The plan-time checks of a MindSpeed-RL job: the rules MindSpeed-RL 2.0.0 enforces when the job starts
(mindspeed_rl/config_cls/validate_config.py, models/rollout/vllm_adapter/vllm_parallel_state.py at
Ascend/MindSpeed-RL@62e9928) and what would make it wait forever (more NPUs than the cluster has), applied to the
example's values, the cluster's and training.overrides before anything is created. Each problem names the key the
user changes (docs/mindspeed-rl.md section 4). See verified-facts#mindspeed-rl-checks-vllm-parallel-state."""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.frameworks.base import ClusterShape, key
from infra.layout import WORKSPACE

NUM_NPUS = "rl_config.actor_resource.num_npus"
TOKENIZER = "megatron_training.tokenizer_name_or_path"
DATA = "megatron_training.data_path"
LOAD = "actor_config.load"
SAVE = "actor_config.save"
# MindSpeed-RL's trainer saves when iteration % actor_config.save_interval == 0 (mindspeed_rl/trainer/
# grpo_trainer_hybrid.py; cli/train_grpo.py passes actor_config.save_interval, actor_config being
# megatron_training updated by actor_config); there is no save at the last iteration otherwise.
# see verified-facts#mindspeed-rl-checks-grpo-trainer-hybrid
SAVE_INTERVAL = "actor_config.save_interval"
TRAIN_ITERS = "megatron_training.train_iters"
INTEGRATED = "rl_config.use_integrated_worker"
# What resuming sets (MegatronConfig fields, mindspeed_rl/config_cls/megatron_config.py): the user setting
# one of them in training.overrides takes the checkpoint loading over.
# see verified-facts#mindspeed-rl-checks-megatron-config
RESUME_KEYS = (LOAD, "actor_config.finetune", "actor_config.no_load_optim", "actor_config.no_load_rng")
PATH_KEYS = {TOKENIZER: "tokenizerPath", DATA: "dataPath", LOAD: "loadPath", SAVE: "savePath"}

INFER_TP = "generate_config.infer_tensor_parallel_size"
INFER_PP = "generate_config.infer_pipeline_parallel_size"
MAX_LEN = "generate_config.max_model_len"
BATCH = "global_batch_size"
MICRO = "micro_batch_size"
SAMPLES = "rl_config.n_samples_per_prompt"
# Whole numbers of at least 1 that the rules divide by (the first three are TP, PP and CP).
SIZES = (
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size", INFER_TP, INFER_PP,
    MICRO, BATCH, SAMPLES,
)

# The values of the GRPO examples of MindSpeed-RL 2.0.0 (the default ref) that the plan-time checks need, read
# from Ascend/MindSpeed-RL@62e9928:configs/<name>.yaml. Only these two GRPO configs exist at that ref; both are
# written for one 16-NPU A3 node, i.e. 2 x 8 NPUs on Atlas 800T A2 / 910B.
EXAMPLES: dict[str, dict[str, Any]] = {
    "grpo_qwen25_7b_A3": {
        NUM_NPUS: 16,
        "actor_config.tensor_model_parallel_size": 4,
        "actor_config.pipeline_model_parallel_size": 1,
        "actor_config.micro_batch_size": 1,
        "megatron_training.global_batch_size": 32,
        "megatron_training.seq_length": 2048,
        "megatron_training.save_interval": 200,
        TRAIN_ITERS: 1000,
        "rl_config.n_samples_per_prompt": 8,
        "rl_config.use_integrated_worker": True,
        "rl_config.verifier_function": ["base_acc"],
        "rl_config.verifier_weight": [1.0],
        "generate_config.infer_tensor_parallel_size": 4,
        "generate_config.infer_pipeline_parallel_size": 1,
        "generate_config.max_model_len": 4096,
        TOKENIZER: "./Qwen2.5-7B",
        DATA: "./dataset/deepscaler/data",
        LOAD: "./ckpt",
        SAVE: "./ckpt",
    },
    "grpo_qwen25_32b_A3": {
        NUM_NPUS: 16,
        "actor_config.tensor_model_parallel_size": 8,
        "actor_config.pipeline_model_parallel_size": 1,
        "actor_config.micro_batch_size": 1,
        "megatron_training.global_batch_size": 32,
        "megatron_training.seq_length": 2048,
        "megatron_training.save_interval": 100,
        TRAIN_ITERS: 100,
        "rl_config.n_samples_per_prompt": 8,
        "rl_config.use_integrated_worker": True,
        "rl_config.verifier_function": ["base_acc"],
        "rl_config.verifier_weight": [1.0],
        "generate_config.infer_tensor_parallel_size": 8,
        "generate_config.infer_pipeline_parallel_size": 1,
        "generate_config.max_model_len": 4096,
        TOKENIZER: "./Qwen2.5-32B",
        DATA: "./data",
        LOAD: "./ckpt",
        SAVE: "./ckpt",
    },
}

# Class defaults of MindSpeed-RL 2.0.0 for what an example leaves unset (mindspeed_rl/config_cls/
# megatron_config.py, generate_config.py, rl_config.py).
# see verified-facts#mindspeed-rl-checks-megatron-config-2
CLASS_DEFAULTS: dict[str, Any] = {
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1,
    "generate_config.infer_tensor_parallel_size": 8,
    "generate_config.infer_pipeline_parallel_size": 1,
    "generate_config.max_model_len": 2048,
    "rl_config.n_samples_per_prompt": 1,
    "rl_config.num_cpus_for_placement_group": 8,
}

CHECKS = (
    f"{NUM_NPUS} <= nodes x NPUs per node (placement groups of {{NPU: 1}} bundles, STRICT_PACK per node)",
    "num_npus % (TP x PP x CP) == 0",
    "(global_batch_size x n_samples_per_prompt) % micro_batch_size == 0",
    "global_batch_size % DP == 0 and (global_batch_size / DP x n_samples_per_prompt) % micro_batch_size == 0, "
    "DP = num_npus / (TP x PP x CP)",
    "global_batch_size % (num_npus / (infer TP x infer PP)) == 0",
    "infer TP <= TP: TP % infer TP == 0; infer TP > TP: DP x TP >= infer TP and DP x TP % infer TP == 0",
    "generate_config.max_model_len >= seq_length",
    "len(rl_config.verifier_function) == len(rl_config.verifier_weight)",
    "tokenizer, data, load and save paths are absolute and under a mount of the container (the shared storage, "
    "the data dir or /workspace)",
)

@dataclass(frozen=True)
class Value:
    value: Any
    source: str  # "override", "cluster", "example" or "default"

    def origin(self, example: str) -> str:
        return {
            "override": "from training.overrides",
            "cluster": "set from the cluster",
            "example": f"from {example}.yaml",
            "default": "MindSpeed-RL's default",
        }[self.source]


def found_key(values: Mapping[str, Value], name: str) -> str | None:
    """The full key under which `name` is set; a bare Megatron name (`micro_batch_size`) resolves as MindSpeed-RL
    merges the sections: actor_config over megatron_training (cli/train_grpo.py).
    See verified-facts#mindspeed-rl-checks-train-grpo-2."""
    candidates = [name] if "." in name else [f"actor_config.{name}", f"megatron_training.{name}"]
    return next((candidate for candidate in candidates if candidate in values), None)


def whole(values: Mapping[str, Value], name: str) -> int | None:
    """A whole-number value by its key, else the class default; None when it is set but not a whole number."""
    found = found_key(values, name)
    if found is not None:
        value = values[found].value
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    default = CLASS_DEFAULTS.get(name)
    return default if isinstance(default, int) else None


def container_mounts(shape: ClusterShape) -> list[str]:
    """The container's directories that hold the node's (or the shared storage's) files: components/bootstrap.py
    mounts the data dir, its workspace at /workspace and the shared storage at shape.shared_dir."""
    return [mount for mount in (shape.shared_dir, shape.data_dir, WORKSPACE) if mount]


def under(path: str, directory: str) -> bool:
    normal = posixpath.normpath(path)
    return normal == directory or normal.startswith(directory.rstrip("/") + "/")


class Checker:
    def __init__(self, values: Mapping[str, Value], example: str, shape: ClusterShape):
        self.values = values
        self.example = example
        self.shape = shape

    def where(self, name: str) -> str:
        """The key the user changes for `name`: the mindspeedRl path setting, else the Hydra key in overrides."""
        found = found_key(self.values, name)
        if found in PATH_KEYS and self.values[found].source == "cluster":
            return key(f"training.mindspeedRl.{PATH_KEYS[found]}")
        if found == NUM_NPUS and self.values[found].source == "cluster":
            return key("nodes.count")
        return key(f"training.overrides.{found or name}")

    def got(self, *names: str) -> str:
        parts = []
        for name in names:
            found = found_key(self.values, name)
            if found is None:
                parts.append(f"{name} {CLASS_DEFAULTS.get(name)!r} (MindSpeed-RL's default)")
            else:
                parts.append(f"{found} {self.values[found].value!r} ({self.values[found].origin(self.example)})")
        return "; ".join(parts)

    def problems(self) -> list[str]:
        problems = self.paths()
        npus = whole(self.values, NUM_NPUS)
        if npus is None or npus < 1:
            return [*problems, f"{self.where(NUM_NPUS)}: must be a whole number of NPUs, at least 1; got "
                    f"{self.got(NUM_NPUS)}"]
        problems += self.fits_cluster(npus)
        sizes = self.sizes()
        if sizes:
            return problems + sizes  # the rules below divide by these
        return problems + self.training_split(npus) + self.rollout_split(npus) + self.lengths()

    def paths(self) -> list[str]:
        problems = []
        mounts = container_mounts(self.shape)
        for name in PATH_KEYS:
            value = self.values[name].value if name in self.values else None
            if not (isinstance(value, str) and value.startswith("/")):
                problems.append(
                    f"{self.where(name)}: must be an absolute path, the same on every node (MindSpeed-RL's workers "
                    f"resolve relative paths against the directory Ray was started in); got {self.got(name)}"
                )
            elif not any(under(value, mount) for mount in mounts):
                # The job runs in the container: a host path outside its mounts does not exist there, and
                # MindSpeed-RL's train task then takes the tokenizer path for a Hub id (cli/train_grpo.py at
                # 62e9928) and writes checkpoints into the container's writable layer.
                # see verified-facts#mindspeed-rl-checks-train-grpo
                problems.append(
                    f"{self.where(name)}: must lie under a directory the container mounts ({', '.join(mounts)}; "
                    f"storage.sharedHostPath or the NAS is mounted at {self.shape.shared_dir or 'none here'}): the job "
                    f"runs in the container, where this path does not exist; got {self.got(name)}"
                )
        return problems

    def fits_cluster(self, npus: int) -> list[str]:
        shape = self.shape
        total = shape.total_gpus
        if npus <= total:
            return []
        cluster = f"{shape.nodes} node{'s' if shape.nodes > 1 else ''} x {shape.gpus_per_node} NPUs = {total}"
        needed = math.ceil(npus / max(shape.gpus_per_node, 1))
        return [
            f"{self.where(NUM_NPUS)}: must be at most the cluster's {cluster} (MindSpeed-RL reserves one "
            f"STRICT_PACK placement group of {shape.gpus_per_node} NPUs per node, so it needs {needed} nodes and "
            f"would wait forever); got {self.got(NUM_NPUS)}"
        ]

    def sizes(self) -> list[str]:
        problems = []
        for name in SIZES:
            value = whole(self.values, name)
            if (value is not None and value < 1) or (found_key(self.values, name) is not None and value is None):
                problems.append(f"{self.where(name)}: must be a whole number, at least 1; got {self.got(name)}")
        return problems

    def training_split(self, npus: int) -> list[str]:
        """validate_config.py and vllm_parallel_state.py. See verified-facts#mindspeed-rl-checks-validate-config."""
        tp, pp, cp = (whole(self.values, name) for name in SIZES[:3])
        if not (tp and pp and cp):
            return []
        if npus % (tp * pp * cp):
            return [
                f"{self.where('tensor_model_parallel_size')}: {NUM_NPUS} must be divisible by TP x PP x CP "
                f"(MindSpeed-RL validate_config); got {npus} and {tp} x {pp} x {cp} = {tp * pp * cp}: "
                + self.got(NUM_NPUS, "tensor_model_parallel_size", "pipeline_model_parallel_size")
            ]
        dp = npus // (tp * pp * cp)
        problems = self.batch_split(npus, tp * pp * cp, dp)
        itp = whole(self.values, INFER_TP)
        if itp and itp <= tp and tp % itp:
            problems.append(
                f"{self.where(INFER_TP)}: must divide the training TP {tp} when not larger (MindSpeed-RL gathers "
                f"train TP into infer TP); got " + self.got(INFER_TP, "tensor_model_parallel_size")
            )
        if itp and itp > tp and (dp * tp < itp or (dp * tp) % itp):
            problems.append(
                f"{self.where(INFER_TP)}: larger than the training TP, so DP x TP = {dp * tp} must be a multiple of "
                f"it; got " + self.got(INFER_TP, "tensor_model_parallel_size")
            )
        return problems

    def batch_split(self, npus: int, model_parallel: int, dp: int) -> list[str]:
        batch, micro, samples = (whole(self.values, name) for name in (BATCH, MICRO, SAMPLES))
        if not (batch and micro and samples):
            return []
        if (batch * samples) % micro:
            return [
                f"{self.where(MICRO)}: global_batch_size x n_samples_per_prompt must be divisible by "
                f"micro_batch_size; got {batch} x {samples} and {micro}: " + self.got(BATCH, SAMPLES, MICRO)
            ]
        if batch % dp:
            return [
                f"{self.where(BATCH)}: must be divisible by the actor's data-parallel size DP = num_npus / "
                f"(TP x PP x CP) = {npus} / {model_parallel} = {dp}; got " + self.got(BATCH, NUM_NPUS)
            ]
        if (batch // dp * samples) % micro:
            return [
                f"{self.where(MICRO)}: global_batch_size / DP x n_samples_per_prompt = {batch // dp * samples} must "
                f"be divisible by micro_batch_size; got " + self.got(MICRO, BATCH)
            ]
        return []

    def rollout_split(self, npus: int) -> list[str]:
        """validate_config.py: the rollout's data-parallel size must split the batch.
        See verified-facts#mindspeed-rl-checks-validate-config-2."""
        itp, ipp, batch = whole(self.values, INFER_TP), whole(self.values, INFER_PP), whole(self.values, BATCH)
        if not (itp and ipp and batch):
            return []
        if npus % (itp * ipp):
            return [
                f"{self.where(INFER_TP)}: {NUM_NPUS} must be divisible by infer TP x infer PP; got {npus} and "
                f"{itp} x {ipp}: " + self.got(INFER_TP, NUM_NPUS)
            ]
        if batch % (npus // (itp * ipp)):
            return [
                f"{self.where(BATCH)}: must be divisible by the rollout's data-parallel size num_npus / "
                f"(infer TP x infer PP) = {npus // (itp * ipp)}; got " + self.got(BATCH, INFER_TP)
            ]
        return []

    def lengths(self) -> list[str]:
        """validate_config.py. See verified-facts#mindspeed-rl-checks-validate-config-3."""
        problems = []
        seq, max_len = whole(self.values, "seq_length"), whole(self.values, MAX_LEN)
        if seq and max_len and max_len < seq:
            problems.append(
                f"{self.where(MAX_LEN)}: must be at least seq_length {seq}; got " + self.got(MAX_LEN, "seq_length")
            )
        functions = self.values.get("rl_config.verifier_function")
        weights = self.values.get("rl_config.verifier_weight")
        if (
            functions
            and weights
            and isinstance(functions.value, list)
            and isinstance(weights.value, list)
            and len(functions.value) != len(weights.value)
        ):
            problems.append(
                f"{self.where('rl_config.verifier_weight')}: must have one weight per verifier_function; got "
                + self.got("rl_config.verifier_function", "rl_config.verifier_weight")
            )
        return problems
