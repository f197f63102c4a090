"""ROLL's training YAML for this cluster, built on the machine that runs `pulumi up` and shipped to the head as is.

ROLL's launchers take no command-line overrides (they call Hydra's compose() without any, roll.md 2.1), so the
complete configuration has to exist as a file under examples/. It is built here, before any resource exists, so
that the plan shows it and every problem is reported before a GPU is paid for:

  1. the base example (`training.roll.baseConfig`, read from the pinned ref: roll_sources.py) with its Hydra
     `defaults` merged in (roll_compose.py): the result needs no other file of the checkout;
  2. hardware-aware defaults: the roles whose device_mapping covers all of the base's GPUs get
     `list(range(0,N))` for the cluster's N GPUs (roles on a subset are kept as written); on GPUs without bf16
     and FlashAttention-2 (V100, T4) fp16 everywhere it matters and SDPA attention; output, log, checkpoint
     and TensorBoard directories under the shared storage (or the node's data dir);
  3. keys of the base that are not ROLL fields (ROLL ignores them: `flash_attn` in the demos) are dropped;
  4. the user's overrides, deep-merged last (mappings merge, anything else replaces; `a.b.c` keys are paths).
roll_checks.py then applies ROLL's own start-up rules.
"""

from __future__ import annotations

import copy
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from infra.device_mapping import DeviceMappingError, parse_device_mapping
from infra.frameworks.roll_compose import deep_merge
from infra.frameworks.roll_keys import RollKeys

TRAINING_ROLES = ("actor_train", "actor_infer", "reference", "critic")
# ROLL's ModelArguments.attn_implementation accepts sdpa, fa2 and auto (roll/configs/model_args.py at 8eb27cc);
# fa2 is FlashAttention-2, which needs compute capability 8.0 (Ampere) or newer.
# see verified-facts#roll-render-model-args
FALLBACK_ATTENTION = "sdpa"
# The max_num_batched_tokens ROLL hands vLLM when the strategy_config has none
# (roll/distributed/strategy/vllm_strategy.py at 8eb27cc).
# see verified-facts#roll-render-vllm-strategy
V0_DEFAULT_BATCHED_TOKENS = 8192
# Absolute paths in ROLL's examples that belong to the sites the examples were written at (Alibaba's CPFS and OSS
# mounts, one developer's home): 75 values under /data/cpfs_0, 66 under /data/oss_bucket_0 and 3 under
# /home/ubuntu in examples/**/*.yaml at 8eb27cc (e.g. qwen2.5-7B-rlvr_megatron/rlvr_config_async.yaml). The
# container mounts only /data (the node's data dir, empty at first), /mnt/shared and /workspace, so such a path is
# missing at run time: ROLL then takes a model path for a ModelScope id (roll/utils/checkpoint_manager.py) or
# fails to open a data file. roll_checks refuses them, except where the render moved them (OUTPUT_ONLY_KEYS).
# see verified-facts#roll-render-rlvr-config-async
FOREIGN_PATH_PREFIXES = ("/data/cpfs_0", "/data/oss_bucket_0", "/home/ubuntu")
# Top-level keys whose directory ROLL 8eb27cc only ever writes (never reads an input from), with the folder under
# the job's output root they move to when the base names a path of another site. Every use at the pinned ref:
# - profiler_output_dir: BaseConfig appends exp_name and a timestamp and exports it as PROFILER_OUTPUT_DIR
#   (roll/configs/base_config.py); profiling makes that folder and writes traces and memory
#   snapshots into it (roll/utils/context_managers.py); the pipelines make <it>/timeline and write Ray
#   timelines there (roll/pipeline/rlvr/rlvr_pipeline.py, rlvr_vlm_pipeline.py, agentic/
#   agentic_pipeline.py, agentic_rollout_pipeline.py, distill/distill_pipeline.py,
#   distill_vlm_pipeline.py, dpo/dpo_pipeline.py).
# - rollout_dump_dir: passed only to the dump functions (rlvr_pipeline.py, rlvr_vlm_pipeline.py,
#   agentic_pipeline.py, agentic_rollout_pipeline.py), which make it and write
#   rollout_dump_data.step_N.jsonl (roll/pipeline/rlvr/utils.py; roll/pipeline/agentic/utils.py,
#   which uses the same DUMPING_FUNC).
# see verified-facts#roll-render-base-config
OUTPUT_ONLY_KEYS = {"profiler_output_dir": "profiler", "rollout_dump_dir": "rollout_dump"}


def is_foreign_path(value: Any) -> bool:
    return isinstance(value, str) and any(value == p or value.startswith(p + "/") for p in FOREIGN_PATH_PREFIXES)


class RenderError(Exception):
    """The render cannot proceed (malformed overrides); the message says what to fix."""


@dataclass(frozen=True)
class Cluster:
    """The facts of the cluster that the configuration is sized from."""

    stack: str
    nodes: int
    gpus_per_node: int
    bf16: bool  # also stands for FlashAttention-2: every GPU family in infra/catalog.py with bf16 is sm80+
    shared_dir: str | None
    data_dir: str
    # The job's own checkpoint directory (infra.layout.checkpoint_dir: <root>/checkpoints/<stack>/<job>) and
    # whether a changed configuration resumes from it (training.resume); None: the output root's, the base's.
    checkpoint_dir: str | None = None
    resume: bool | None = None
    # training.checkpointEvery: ROLL's save_steps (None: the program's default, see _apply_save_steps).
    checkpoint_every: int | None = None

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def output_root(self) -> str:
        """Where outputs go: shared storage when there is some (every node sees the same files)."""
        root = self.shared_dir if self.shared_dir else self.data_dir
        return posixpath.join(root, "roll", self.stack)

    @classmethod
    def of(cls, shape: Any) -> Cluster:
        """From any object with the same attribute names (roll-cluster's ClusterShape)."""
        return cls(shape.stack, shape.nodes, shape.gpus_per_node, shape.bf16, shape.shared_dir, shape.data_dir)


@dataclass
class Rendered:
    config: dict[str, Any]
    applied: list[str] = field(default_factory=list)  # what the hardware-aware defaults changed
    kept: list[str] = field(default_factory=list)  # what they deliberately left alone, and why
    # What the plan states beside the check warnings: a changed path of another site, device mappings kept.
    notes: list[str] = field(default_factory=list)

    def yaml_text(self, header: str = "") -> str:
        return header + yaml.safe_dump(self.config, sort_keys=False, allow_unicode=True, width=120)


# ------------------------------------------------------------------------------------------------- overrides
def expand_dotted(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`{"actor_train.model_args.dtype": "fp16"}` -> nested dicts, the notation ROLL's own guides use."""
    expanded: dict[str, Any] = {}
    for key, value in overrides.items():
        parts = str(key).split(".")
        if any(not part for part in parts):
            raise RenderError(f"override key {key!r} has an empty path segment")
        node = expanded
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        leaf = expand_dotted(value) if isinstance(value, Mapping) else copy.deepcopy(value)
        if isinstance(leaf, dict) and isinstance(node.get(parts[-1]), dict):
            node[parts[-1]] = deep_merge(node[parts[-1]], leaf)
        else:
            node[parts[-1]] = leaf
    return expanded


def leaf_keys(tree: Mapping[str, Any], prefix: str = "") -> set[str]:
    """Every dotted key of a nested mapping, inner ones included (`a`, `a.b`, `a.b.c`)."""
    keys: set[str] = set()
    for key, value in tree.items():
        path = f"{prefix}{key}"
        keys.add(path)
        if isinstance(value, Mapping):
            keys |= leaf_keys(value, path + ".")
    return keys


# ------------------------------------------------------------------------------------------- device mappings
def device_mappings(config: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Every `device_mapping` in the tree (training roles, reward workers, ...) with its dotted key."""
    found: list[tuple[str, Any]] = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        if key == "device_mapping" and value is not None:
            found.append((path, value))
        elif isinstance(value, Mapping):
            found += device_mappings(value, path + ".")
    return found


def is_contiguous_from_zero(indices: list[int]) -> bool:
    return sorted(set(indices)) == list(range(len(set(indices))))


def _apply_device_mappings(
    config: dict[str, Any], cluster: Cluster, result: Rendered, keep_reason: str | None = None
) -> None:
    """keep_reason: the base's mappings are kept as written (RollAdapter: resizing them breaks a rule of ROLL)."""
    if keep_reason is not None:
        if "num_gpus_per_node" in config:
            config["num_gpus_per_node"] = cluster.gpus_per_node
            result.applied.append(f"num_gpus_per_node: {cluster.gpus_per_node}")
        result.kept.append(f"every device_mapping {keep_reason}")
        return
    mappings = device_mappings(config)
    if not mappings:
        result.kept.append("no device_mapping in the base; nothing to size")
        return
    union: list[int] = []
    for key, value in mappings:
        try:
            union += parse_device_mapping(value)
        except DeviceMappingError:
            result.kept.append(f"{key}: {value!r} is not a form this renderer reads; all device mappings kept")
            return
    if not union or not is_contiguous_from_zero(union):
        result.kept.append(
            f"the base's GPU indices {sorted(set(union))} are not contiguous from 0; all device mappings kept"
        )
        return
    base_span = sorted(set(union))
    target = f"list(range(0,{cluster.total_gpus}))"
    for role in TRAINING_ROLES:
        section = config.get(role)
        if not isinstance(section, dict) or section.get("device_mapping") is None:
            continue
        value = section["device_mapping"]
        if sorted(set(parse_device_mapping(value))) == base_span:
            section["device_mapping"] = target
            was = "unchanged" if value == target else f"was {value!r}"
            result.applied.append(
                f"{role}.device_mapping: {target} ({was}; it covered all of the base's {len(base_span)} GPUs, "
                f"the cluster has {cluster.nodes} x {cluster.gpus_per_node})"
            )
        else:
            result.kept.append(f"{role}.device_mapping: kept {value!r}, a subset of the base's {len(base_span)} GPUs")
    if "num_gpus_per_node" in config:
        # ROLL recomputes it from the driver's GPUs (roll.md 3.3); written so the file tells the truth.
        config["num_gpus_per_node"] = cluster.gpus_per_node
        result.applied.append(f"num_gpus_per_node: {cluster.gpus_per_node}")


# ------------------------------------------------------------------------------------------------- precision
def workers(config: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Sections that configure a ROLL worker (a WorkerConfig: model_args or device_mapping), at the top level and
    one level down (rewards.<name>, teacher.<name>)."""
    found: list[tuple[str, dict[str, Any]]] = []
    for key, value in config.items():
        if not isinstance(value, dict) or key == "hydra":
            continue
        if "model_args" in value or "device_mapping" in value or "strategy_args" in value:
            found.append((key, value))
            continue
        for child_key, child in value.items():
            if isinstance(child, dict) and ("model_args" in child or "device_mapping" in child):
                found.append((f"{key}.{child_key}", child))
    return found


def _apply_precision(config: dict[str, Any], cluster: Cluster, result: Rendered) -> None:
    """fp16 and SDPA on GPUs without bf16 / FlashAttention-2, everywhere ROLL reads a precision:

    - `model_args.dtype` (fp16/bf16/fp32; roll/configs/model_args.py, default bf16): also for a worker on
      GPUs that has no model_args at all, which would otherwise get the bf16 default;
    - `training_args.bf16/fp16`: ROLL sets them from the dtype (roll/configs/worker_config.py), but a
      YAML value is kept;
    - Megatron `strategy_args.strategy_config.bf16`: merged over training_args when the Megatron strategy
      builds its arguments (roll/distributed/strategy/megatron_strategy.py), so a `bf16: true` there
      wins over the dtype;
    - `model_args.attn_implementation: fa2` (FlashAttention-2 needs sm80) -> sdpa.
    See verified-facts#roll-render-model-args-2.
    """
    if cluster.bf16:
        return
    changed: list[str] = []
    for name, worker in workers(config):
        model_args = worker.get("model_args")
        on_gpu = worker.get("device_mapping") is not None
        if model_args is None and on_gpu:
            worker["model_args"] = {"dtype": "fp16"}
            changed.append(f"{name}.model_args.dtype: fp16 (no model_args: ROLL's default is bf16)")
        elif isinstance(model_args, dict):
            if model_args.get("dtype") != "fp16":
                was = model_args.get("dtype", "unset: bf16 by default")
                model_args["dtype"] = "fp16"
                changed.append(f"{name}.model_args.dtype: fp16 (was {was})")
            if model_args.get("attn_implementation") == "fa2":
                model_args["attn_implementation"] = FALLBACK_ATTENTION
                changed.append(f"{name}.model_args.attn_implementation: {FALLBACK_ATTENTION} (was fa2, needs sm80)")
        training_args = worker.get("training_args")
        if isinstance(training_args, dict) and training_args.get("bf16"):
            training_args["bf16"] = False
            training_args["fp16"] = True
            changed.append(f"{name}.training_args: bf16 false, fp16 true")
        strategy_args = worker.get("strategy_args")
        strategy_config = strategy_args.get("strategy_config") if isinstance(strategy_args, dict) else None
        if isinstance(strategy_config, dict) and strategy_config.get("bf16"):
            strategy_config["bf16"] = False
            strategy_config["fp16"] = True
            changed.append(f"{name}.strategy_args.strategy_config: bf16 false, fp16 true (Megatron)")
    if changed:
        result.applied += [f"{line} (the GPUs have no bf16)" for line in changed]
    else:
        result.kept.append("precision: already fp16 everywhere (the GPUs have no bf16)")


def _fill_missing_dtype(config: dict[str, Any], cluster: Cluster, result: Rendered) -> None:
    """After the overrides: a worker on GPUs whose dtype nobody set (a role the overrides added) gets fp16, not
    ROLL's bf16 default. Values the user set are left for the check to judge."""
    if cluster.bf16:
        return
    for name, worker in workers(config):
        if worker.get("device_mapping") is None:
            continue
        model_args = worker.get("model_args")
        if model_args is None:
            worker["model_args"] = {"dtype": "fp16"}
        elif isinstance(model_args, dict) and "dtype" not in model_args:
            model_args["dtype"] = "fp16"
        else:
            continue
        result.applied.append(f"{name}.model_args.dtype: fp16 (not set: ROLL's default is bf16, the GPUs have none)")


# ------------------------------------------------------------------------------------------------ output dirs
def _apply_output_dirs(config: dict[str, Any], cluster: Cluster, result: Rendered) -> None:
    root = cluster.output_root
    where = "shared storage" if cluster.shared_dir else "the node's data dir: no shared storage, node-local"
    targets: list[tuple[tuple[str, ...], str]] = [
        (("output_dir",), "output"),
        (("logging_dir",), "logs"),
    ]
    if isinstance(config.get("checkpoint_config"), dict) and cluster.checkpoint_dir is None:
        targets.append((("checkpoint_config", "output_dir"), "checkpoints"))
    if isinstance(config.get("tracker_kwargs"), dict) and "log_dir" in config["tracker_kwargs"]:
        targets.append((("tracker_kwargs", "log_dir"), "tensorboard"))
    if "render_save_dir" in config:
        targets.append((("render_save_dir",), "render"))
    for path, leaf in targets:
        node = config
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = posixpath.join(root, leaf)
        result.applied.append(f"{'.'.join(path)}: {posixpath.join(root, leaf)} ({where})")
    for name, leaf in OUTPUT_ONLY_KEYS.items():
        # A folder ROLL only writes to: another site's path there is no input missing here, so the outputs land
        # in the job's output folder instead of a path no mount provides (an override still decides).
        if is_foreign_path(config.get(name)):
            was, config[name] = config[name], posixpath.join(root, leaf)
            line = (f"{name}: {config[name]} (was {was!r}, a path of the site ROLL's example was written at; ROLL "
                    f"only writes there; {where})")
            result.applied.append(line)
            result.notes.append(line)
    if cluster.checkpoint_dir is not None:
        # The job's own directory, so that two jobs (or a fresh start) never mix checkpoints.
        checkpoint = config.get("checkpoint_config")
        config["checkpoint_config"] = {**(checkpoint if isinstance(checkpoint, dict) else {}),
                                       "output_dir": cluster.checkpoint_dir}
        result.applied.append(f"checkpoint_config.output_dir: {cluster.checkpoint_dir} (the job's own, {where})")
    if cluster.resume is not None:
        # Never `true`: ROLL 8eb27cc appends a fresh timestamp to checkpoint_config.output_dir at every launch
        # (roll/configs/base_config.py) and then lists that folder, which nothing has created yet
        # (roll/utils/checkpoint_manager.py -> roll/utils/upload_utils.py; only upload() creates it,
        #): FileNotFoundError before the first step, and no earlier run could be found. A path (a str) is
        # used as given (base_pipeline.py, checkpoint_manager.py): the job step finds the newest
        # complete checkpoint and the entrypoint writes its path here (RollAdapter.entrypoint).
        # see verified-facts#roll-render-base-config-2
        config["resume_from_checkpoint"] = False
        result.applied.append(
            "resume_from_checkpoint: false (ROLL's `true` fails at start-up; a resume is handed the newest complete "
            "checkpoint's path at submission: training.resume)"
        )
        # Synchronous uploads: each worker's do_checkpoint returns only after its copy, and the driver uploads
        # pipeline/worker_state_pipeline.json after all of them (base_pipeline.py), so that file marks a
        # complete checkpoint. FileSystemUploader(**checkpoint_config) takes the key (upload_utils.py).
        # see verified-facts#roll-render-base-pipeline
        checkpoint = config.get("checkpoint_config")
        config["checkpoint_config"] = {**(checkpoint if isinstance(checkpoint, dict) else {}), "async_upload": False}
        result.applied.append("checkpoint_config.async_upload: false (a checkpoint is complete once "
                              "pipeline/worker_state_pipeline.json is there)")


# ---------------------------------------------------------------------------------------------- non-fields
def _drop_non_fields(config: dict[str, Any], keys: RollKeys, pipeline: str, result: Rendered) -> None:
    """Keys of the base that are no ROLL field are ignored by dacite.from_dict; they are dropped so the file
    says only what takes effect. Values outside a Literal stay (the check reports them).

    Repeated until nothing more is dropped: a top-level YAML variable is allowed while an interpolation refers to
    it (roll_keys.referenced_top_level), so dropping the only key that referred to it (`custom_env` of the GEM and
    rock_swe examples referring to `action_pattern`, `agent_template`, ...) leaves a variable that ROLL ignores
    just the same; one pass would report it as an error the user cannot fix (overrides cannot delete a key)."""
    while _drop_pass(config, keys, pipeline, result):
        pass


def _drop_pass(config: dict[str, Any], keys: RollKeys, pipeline: str, result: Rendered) -> bool:
    dropped = False
    for problem in keys.check(config, pipeline):
        if "is not a field" not in problem.message:
            continue
        parts = problem.key.split(".")
        node: Any = config
        for part in parts[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and parts[-1] in node:
            value = node.pop(parts[-1])
            reason = problem.message.split("; did you mean")[0]
            result.applied.append(
                f"{problem.key}: dropped ({json.dumps(value, default=str)[:60]}), {reason}, so ROLL ignores it"
            )
            dropped = True
    return dropped


# ---------------------------------------------------------------------------------------------------- render
def render_roll_config(
    composed: Mapping[str, Any],
    cluster: Cluster,
    overrides: Mapping[str, Any],
    keys: RollKeys,
    pipeline: str,
    keep_mappings: str | None = None,
) -> Rendered:
    """The configuration ROLL will run: composed base, hardware defaults, non-fields dropped, overrides last.
    keep_mappings: why the base's device mappings are kept as written instead of resized (None: resized)."""
    result = Rendered(config=copy.deepcopy(dict(composed)))
    _apply_device_mappings(result.config, cluster, result, keep_mappings)
    _apply_precision(result.config, cluster, result)
    _apply_output_dirs(result.config, cluster, result)
    _drop_non_fields(result.config, keys, pipeline, result)
    expanded = expand_dotted(overrides)
    result.config = deep_merge(result.config, expanded)
    _fill_missing_dtype(result.config, cluster, result)
    _apply_vllm_v0(result.config, cluster, result)
    _apply_save_steps(result.config, cluster, expanded, result)
    return result


def save_steps_default(config: Mapping[str, Any], every: int | None) -> int | None:
    """ROLL's save_steps for training.checkpointEvery (None: the base's when below max_steps, else a tenth of
    max_steps). ROLL saves when `step % save_steps == 0 or step == max_steps - 1` (roll/pipeline/base_pipeline.py):
    the final step always; 0 would divide by zero there, so "final only" is save_steps = max_steps.
    See verified-facts#roll-render-save-steps."""
    max_steps = config.get("max_steps")
    if not isinstance(max_steps, int) or max_steps <= 0:
        return every if every else None
    if every is not None:
        return every if every > 0 else max_steps
    base = config.get("save_steps")
    if isinstance(base, int) and 0 < base < max_steps:
        return base
    return max(1, max_steps // 10)


def _apply_save_steps(config: dict[str, Any], cluster: Cluster, overrides: Mapping[str, Any],
                      result: Rendered) -> None:
    if "save_steps" in overrides or cluster.resume is None:
        return
    steps = save_steps_default(config, cluster.checkpoint_every)
    if steps is None or steps == config.get("save_steps"):
        return
    was = config.get("save_steps", "unset")
    config["save_steps"] = steps
    result.applied.append(f"save_steps: {steps} (was {was}; training.checkpointEvery; the final step is always saved)")


def _apply_vllm_v0(config: dict[str, Any], cluster: Cluster, result: Rendered) -> None:
    """vLLM's V0 engine for every vLLM worker on GPUs below compute capability 8.0 (V100, T4), which vLLM 0.8.4's
    V1 engine refuses. ROLL 8eb27cc forces V1 unless the worker's strategy_config says otherwise:
    `os.environ["VLLM_USE_V1"] = str(vllm_config.pop("VLLM_USE_V1", 1))` with vllm_config a copy of
    strategy_args.strategy_config (roll/distributed/strategy/vllm_strategy.py; a system_envs value is
    overwritten there). The rest as in ROLL's own V0 example (examples/agentic_demo/
    atropos_gsm8k_grpo_qwen25_0.5b.yaml): prefix caching off (ROLL turns it on, vllm_strategy.py),
    enforce_eager, and a max_model_len within the token budget (_fit_v0_token_budget).
    FSDP2 parameters in fp16 (ROLL's default param_dtype is bf16, fsdp2_strategy.py; reductions in fp32).
    A value the user set is kept (RollAdapter.problems refuses a V1 or bf16 one).
    See verified-facts#roll-render-vllm-strategy-2."""
    if cluster.bf16:
        return
    for name, worker in workers(config):
        strategy_args = worker.get("strategy_args")
        if not isinstance(strategy_args, dict):
            continue
        strategy = strategy_args.get("strategy_name")
        if strategy == "vllm":
            strategy_config = strategy_args.get("strategy_config")
            if not isinstance(strategy_config, dict):
                strategy_config = strategy_args["strategy_config"] = {}
            if "VLLM_USE_V1" not in strategy_config:
                strategy_config["VLLM_USE_V1"] = 0
                result.applied.append(f"{name}.strategy_args.strategy_config.VLLM_USE_V1: 0 (vLLM's V1 engine needs "
                                      "compute capability 8.0; the GPUs have no bf16)")
            if "enable_prefix_caching" not in strategy_config:
                strategy_config["enable_prefix_caching"] = False
                result.applied.append(f"{name}.strategy_args.strategy_config.enable_prefix_caching: false (V0 on "
                                      "sm70/sm75, as ROLL's own V0 example)")
            if "enforce_eager" not in strategy_config:
                strategy_config["enforce_eager"] = True
                result.applied.append(f"{name}.strategy_args.strategy_config.enforce_eager: true (V0 on sm70/sm75, "
                                      "as ROLL's own V0 example: no CUDA graphs)")
            _fit_v0_token_budget(name, strategy_config, pipeline_sequence_length(config), result)
        elif strategy in ("fsdp2_train", "fsdp2_infer"):
            strategy_config = strategy_args.get("strategy_config")
            if not isinstance(strategy_config, dict):
                strategy_config = strategy_args["strategy_config"] = {}
            if "param_dtype" not in strategy_config:
                strategy_config["param_dtype"] = "fp16"
                result.applied.append(f"{name}.strategy_args.strategy_config.param_dtype: fp16 (FSDP2's default "
                                      "is bf16; the GPUs have none)")
            if "reduce_dtype" not in strategy_config:
                strategy_config["reduce_dtype"] = "fp32"
                result.applied.append(f"{name}.strategy_args.strategy_config.reduce_dtype: fp32")


def pipeline_sequence_length(config: Mapping[str, Any]) -> int | None:
    """The longest sequence (prompt and response) the pipeline generates: ROLL's `sequence_length`, else
    `prompt_length + response_length` (roll/configs/base_config.py), and `val_sequence_length` when longer.
    None when the config says neither. See verified-facts#roll-render-base-config-3."""
    def positive(value: Any) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    train = positive(config.get("sequence_length"))
    if train is None:
        prompt, response = positive(config.get("prompt_length")), positive(config.get("response_length"))
        train = prompt + response if prompt is not None and response is not None else None
    lengths = [n for n in (train, positive(config.get("val_sequence_length"))) if n is not None]
    return max(lengths) if lengths else None


def v0_token_budget(strategy_config: Mapping[str, Any]) -> int:
    """The max_num_batched_tokens ROLL hands vLLM: the strategy_config's, else 8192
    (roll/distributed/strategy/vllm_strategy.py). See verified-facts#roll-render-vllm-strategy-3."""
    value = strategy_config.get("max_num_batched_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) else V0_DEFAULT_BATCHED_TOKENS


def _fit_v0_token_budget(name: str, strategy_config: dict[str, Any], sequence_length: int | None,
                         result: Rendered) -> None:
    """vLLM 0.8.4's V0 engine turns chunked prefill on by itself only above 32,768 tokens
    (vllm/engine/arg_utils.py `_set_default_args_v0`); without it the scheduler refuses a max_num_batched_tokens
    below max_model_len (vllm/config.py `SchedulerConfig._verify_args`). With no max_model_len vLLM takes the
    model's (32,768 for Qwen2.5-0.5B) against ROLL's 8,192. So, as ROLL's own V0 example does
    (examples/agentic_demo/atropos_gsm8k_grpo_qwen25_0.5b.yaml: max_model_len = sequence_length), the
    engine gets the pipeline's sequence length, and a budget that holds it.
    See verified-facts#roll-render-atropos-gsm8k-grpo-qwen25-0-5b."""
    if "max_model_len" not in strategy_config and sequence_length is not None:
        strategy_config["max_model_len"] = sequence_length
        result.applied.append(f"{name}.strategy_args.strategy_config.max_model_len: {sequence_length} (the "
                              "pipeline's sequence length, as ROLL's own V0 example; vLLM's V0 engine otherwise "
                              "takes the model's, beyond ROLL's max_num_batched_tokens)")
    max_model_len = strategy_config.get("max_model_len")
    if (isinstance(max_model_len, int) and not isinstance(max_model_len, bool)
            and "max_num_batched_tokens" not in strategy_config and not strategy_config.get("enable_chunked_prefill")
            and max_model_len > V0_DEFAULT_BATCHED_TOKENS):
        strategy_config["max_num_batched_tokens"] = max_model_len
        result.applied.append(f"{name}.strategy_args.strategy_config.max_num_batched_tokens: {max_model_len} "
                              f"(ROLL's {V0_DEFAULT_BATCHED_TOKENS} is below max_model_len; vLLM's V0 engine "
                              "without chunked prefill needs at least max_model_len)")
    if (isinstance(max_model_len, int) and not strategy_config.get("enable_chunked_prefill")
            and max_model_len <= v0_token_budget(strategy_config)):
        result.applied.append(f"{name}: vLLM V0 max_model_len {max_model_len} within max_num_batched_tokens "
                              f"{v0_token_budget(strategy_config)} (chunked prefill off)")


def header(base_config: str, ref: str, cluster: Cluster, overrides: Mapping[str, Any], rendered: Rendered) -> str:
    lines = [
        "Generated by roll-cluster on the machine that ran `pulumi up`; edits are overwritten on the next run.",
        f"base: examples/{base_config} of ROLL {ref}, Hydra defaults merged in",
        f"cluster: {cluster.nodes} node(s) x {cluster.gpus_per_node} GPU(s), bf16={'yes' if cluster.bf16 else 'no'}",
        *[f"applied: {line}" for line in rendered.applied],
        *[f"kept: {line}" for line in rendered.kept],
        f"overrides (merged last): {json.dumps(overrides, sort_keys=True)}",
    ]
    return "".join(f"# {line}\n" for line in lines)
