#!/usr/bin/env python3
"""Render ROLL's training YAML for this cluster, on the head, inside the ROLL checkout.

ROLL's launchers take no command-line overrides (they call Hydra's compose() without any), so the complete
configuration has to exist as a file under examples/. The base example lives in the ROLL checkout on the head,
not on the machine that runs `pulumi up`, which is why this file is shipped to the head and run there:

    cd /workspace/ROLL
    python3 roll_render.py --base examples/agentic_demo/x.yaml --cluster cluster.json \
        --overrides overrides.json --out examples/pulumi/<name>.yaml
    python3 roll_render.py --check examples/pulumi/<name>.yaml --cluster cluster.json

Self-contained on purpose: the standard library and PyYAML only (PyYAML comes with ROLL's requirements), and no
import of the rest of roll-cluster, which does not exist on the head. Tests import it as a module.

What rendering does, in order:
  1. load the base example;
  2. hardware-aware defaults: the training roles (actor_train, actor_infer, reference, critic) whose
     device_mapping covers all of the base's GPUs get `list(range(0,N))` for the cluster's N GPUs; roles mapped
     to a subset are kept as written; fp16 for every role's model_args on GPUs without bf16 (V100, T4);
     output, log, checkpoint and TensorBoard directories under the shared storage (or the node's data dir);
  3. the user's overrides, deep-merged last (dicts merge, anything else replaces; `a.b.c` keys are paths);
  4. the Hydra `defaults:` entries rewritten so that they still name the same files from the output's folder.
`--check` then applies the rules ROLL asserts at start-up (roll/configs/base_config.py,
roll/pipeline/agentic/agentic_config.py) before anything is submitted, naming the YAML key and the values.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import posixpath
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

TRAINING_ROLES = ("actor_train", "actor_infer", "reference", "critic")
INFER_STRATEGIES = ("vllm", "sglang")
# Hydra's own config groups (hydra/job_logging, ...) come from Hydra's search path, not from examples/.
HYDRA_GROUP = re.compile(r"^(?:override\s+|optional\s+)*hydra(?:/|$|@)")

_RANGE = re.compile(r"list\(\s*range\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?(?:,\s*(\d+)\s*)?\)\s*\)")
_LIST = re.compile(r"\[\s*(\d+(?:\s*,\s*\d+)*)?\s*,?\s*\]")
_INTERPOLATION = re.compile(r"^\$\{([A-Za-z_][\w.]*)\}$")


class RenderError(Exception):
    """The render cannot proceed (missing base, malformed input); the message says what to fix."""


@dataclass(frozen=True)
class Cluster:
    """The facts of the cluster that the configuration is sized from (cluster.json)."""

    stack: str
    nodes: int
    gpus_per_node: int
    bf16: bool
    shared_dir: str | None
    data_dir: str

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def output_root(self) -> str:
        """Where outputs go: shared storage when there is some (every node sees the same files)."""
        root = self.shared_dir if self.shared_dir else self.data_dir
        return posixpath.join(root, "roll", self.stack)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Cluster:
        try:
            return cls(
                stack=str(data["stack"]),
                nodes=int(data["nodes"]),
                gpus_per_node=int(data["gpus_per_node"]),
                bf16=bool(data["bf16"]),
                shared_dir=data.get("shared_dir") or None,
                data_dir=str(data.get("data_dir") or "/data"),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise RenderError(
                f"cluster facts need stack, nodes, gpus_per_node and bf16; got {dict(data)!r} ({error})"
            ) from None

    @classmethod
    def of(cls, shape: Any) -> Cluster:
        """From any object with the same attribute names (roll-cluster's ClusterShape)."""
        return cls(shape.stack, shape.nodes, shape.gpus_per_node, shape.bf16, shape.shared_dir, shape.data_dir)

    def to_json(self) -> str:
        return json.dumps(
            {
                "stack": self.stack,
                "nodes": self.nodes,
                "gpus_per_node": self.gpus_per_node,
                "bf16": self.bf16,
                "shared_dir": self.shared_dir,
                "data_dir": self.data_dir,
            },
            indent=2,
            sort_keys=True,
        )


@dataclass
class Rendered:
    config: dict[str, Any]
    applied: list[str] = field(default_factory=list)  # what the hardware-aware defaults changed
    kept: list[str] = field(default_factory=list)  # what they deliberately left alone, and why

    def yaml_text(self, header: str = "") -> str:
        return header + yaml.safe_dump(self.config, sort_keys=False, allow_unicode=True, width=120)


@dataclass
class CheckResult:
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------- device mappings
def parse_device_mapping(value: Any) -> list[int]:
    """ROLL evals these strings; only the forms its examples use are read here (never eval).

    The same reader as infra/device_mapping.py (validation before deploy); this file keeps its own copy because it
    runs alone on the head. tests/test_device_mapping.py checks that the two agree."""
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    if not isinstance(value, str):
        raise ValueError("must be `list(range(a,b))`, a list of GPU indices, or a sum of those")
    indices: list[int] = []
    for term in value.split("+"):
        term = term.strip()
        if match := _RANGE.fullmatch(term):
            a, b, step = match.groups()
            start, stop = (0, int(a)) if b is None else (int(a), int(b))
            indices += list(range(start, stop, int(step) if step else 1))
        elif match := _LIST.fullmatch(term):
            indices += [int(x) for x in (match.group(1) or "").replace(" ", "").split(",") if x]
        else:
            raise ValueError("must be `list(range(a,b))`, a list of GPU indices, or a sum of those")
    return indices


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


def _is_contiguous_from_zero(indices: list[int]) -> bool:
    return sorted(set(indices)) == list(range(len(set(indices))))


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


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Dicts merge key by key; anything else (lists, scalars, null) replaces."""
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# ------------------------------------------------------------------------------------------ hardware defaults
def _apply_device_mappings(config: dict[str, Any], cluster: Cluster, result: Rendered) -> None:
    mappings = device_mappings(config)
    if not mappings:
        result.kept.append("no device_mapping in the base; nothing to size")
        return
    union: list[int] = []
    for key, value in mappings:
        try:
            union += parse_device_mapping(value)
        except ValueError:
            result.kept.append(f"{key}: {value!r} is not a form this renderer reads; all device mappings kept")
            return
    if not union or not _is_contiguous_from_zero(union):
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


def _roles_with_model_args(config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Top-level roles and the workers one level down (rewards.<name>) that load a model."""
    roles: list[tuple[str, dict[str, Any]]] = []
    for key, value in config.items():
        if not isinstance(value, dict):
            continue
        if isinstance(value.get("model_args"), dict):
            roles.append((key, value))
        else:
            for child_key, child in value.items():
                if isinstance(child, dict) and isinstance(child.get("model_args"), dict):
                    roles.append((f"{key}.{child_key}", child))
    return roles


def _apply_fp16(config: dict[str, Any], cluster: Cluster, result: Rendered) -> None:
    if cluster.bf16:
        return
    changed = []
    for name, role in _roles_with_model_args(config):
        if role["model_args"].get("dtype") != "fp16":
            changed.append(name)
        role["model_args"]["dtype"] = "fp16"
    if changed:
        result.applied.append(f"model_args.dtype: fp16 for {', '.join(changed)} (the GPUs have no bf16)")
    else:
        result.kept.append("model_args.dtype: already fp16 everywhere (the GPUs have no bf16)")


def _apply_output_dirs(config: dict[str, Any], cluster: Cluster, result: Rendered) -> None:
    root = cluster.output_root
    where = "shared storage" if cluster.shared_dir else "the node's data dir: no shared storage, node-local"
    targets: list[tuple[tuple[str, ...], str]] = [
        (("output_dir",), "output"),
        (("logging_dir",), "logs"),
    ]
    if isinstance(config.get("checkpoint_config"), dict):
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


# ------------------------------------------------------------------------------------------- hydra defaults
def _relocate(entry_path: str, base_dir: str, out_dir: str) -> str:
    """The same file as seen from out_dir. Absolute entries are relative to the primary config's folder."""
    target = posixpath.normpath(posixpath.join(base_dir, entry_path.lstrip("/")))
    return posixpath.relpath(target, out_dir)


def _default_package(group: str) -> str:
    """Hydra's package for an entry without `@`: its group path, or the primary config's own (`_here_`) at the
    root. Written out when an entry is re-aimed, because the package would otherwise follow the new path."""
    group = group.strip("/")
    return group.replace("/", ".") if group else "_here_"


def _adjust_defaults(config: dict[str, Any], base_path: str, out_path: str, result: Rendered) -> None:
    defaults = config.get("defaults")
    if not isinstance(defaults, list):
        return
    base_dir = posixpath.dirname(posixpath.normpath(base_path)) or "."
    out_dir = posixpath.dirname(posixpath.normpath(out_path)) or "."
    adjusted: list[Any] = []
    for entry in defaults:
        new = entry
        if isinstance(entry, str) and entry != "_self_" and not HYDRA_GROUP.match(entry):
            path, at, package = entry.partition("@")
            moved = _relocate(path, base_dir, out_dir)
            if moved != path:
                new = moved + "@" + (package if at else _default_package(posixpath.dirname(path)))
        elif isinstance(entry, dict) and len(entry) == 1:
            ((key, option),) = entry.items()
            if not HYDRA_GROUP.match(key):
                words = key.split()
                group, at, package = words[-1].partition("@")
                moved = _relocate(group, base_dir, out_dir)
                if moved != group:
                    words[-1] = moved + "@" + (package if at else _default_package(group))
                    new = {" ".join(words): option}
        if new != entry:
            result.applied.append(f"defaults: {entry!r} -> {new!r} (same file, seen from {out_dir}/)")
        adjusted.append(new)
    config["defaults"] = adjusted


def defaults_files(config: Mapping[str, Any], config_dir: str) -> list[tuple[str, str]]:
    """(entry, file path) of every `defaults:` entry that names a file of its own, for the existence check."""
    files: list[tuple[str, str]] = []
    defaults = config.get("defaults")
    if not isinstance(defaults, list):
        return files
    for entry in defaults:
        if isinstance(entry, str) and entry != "_self_" and not HYDRA_GROUP.match(entry):
            path = entry.partition("@")[0]
            files.append((entry, posixpath.join(config_dir, path.lstrip("/")) + ".yaml"))
        elif isinstance(entry, dict) and len(entry) == 1:
            ((key, option),) = entry.items()
            words = key.split()
            if HYDRA_GROUP.match(key) or "optional" in words[:-1] or not isinstance(option, str):
                continue
            group = words[-1].partition("@")[0]
            files.append((f"{key}: {option}", posixpath.join(config_dir, group.lstrip("/"), option) + ".yaml"))
    return files


# ---------------------------------------------------------------------------------------------------- render
def render(
    base_text: str,
    cluster: Cluster,
    overrides: Mapping[str, Any],
    base_path: str = "examples/base/base.yaml",
    out_path: str = "examples/pulumi/out.yaml",
) -> Rendered:
    try:
        base = yaml.safe_load(base_text)
    except yaml.YAMLError as error:
        raise RenderError(f"the base config {base_path} is not valid YAML: {error}") from None
    if not isinstance(base, dict):
        raise RenderError(f"the base config {base_path} must be a YAML mapping; got {type(base).__name__}")
    result = Rendered(config=copy.deepcopy(base))
    _apply_device_mappings(result.config, cluster, result)
    _apply_fp16(result.config, cluster, result)
    _apply_output_dirs(result.config, cluster, result)
    result.config = deep_merge(result.config, expand_dotted(overrides))
    _adjust_defaults(result.config, base_path, out_path, result)
    return result


def render_preview(
    base_yaml_text: str,
    shape: Any,
    overrides: Mapping[str, Any],
    base_config: str = "base/base.yaml",
    config_name: str = "preview",
) -> str:
    """The rendered YAML for a base text and a cluster shape (tests, and the offline plan with a local checkout).

    base_config is the path under examples/ (`agentic_demo/x.yaml`), used to re-aim relative `defaults:`.
    """
    cluster = shape if isinstance(shape, Cluster) else Cluster.of(shape)
    rendered = render(
        base_yaml_text, cluster, overrides, f"examples/{base_config}", f"examples/pulumi/{config_name}.yaml"
    )
    return rendered.yaml_text(_header(f"examples/{base_config}", cluster, overrides, rendered))


def _header(base_path: str, cluster: Cluster, overrides: Mapping[str, Any], rendered: Rendered) -> str:
    lines = [
        "Generated by roll-cluster (roll_render.py); edits are overwritten on the next `pulumi up`.",
        f"base: {base_path}",
        f"cluster: {cluster.nodes} node(s) x {cluster.gpus_per_node} GPU(s), bf16={'yes' if cluster.bf16 else 'no'}",
        *[f"applied: {line}" for line in rendered.applied],
        *[f"kept: {line}" for line in rendered.kept],
        f"overrides (merged last): {json.dumps(overrides, sort_keys=True)}",
    ]
    return "".join(f"# {line}\n" for line in lines)


# ----------------------------------------------------------------------------------------------------- checks
def _lookup(config: Mapping[str, Any], dotted: str, _depth: int = 0) -> Any:
    """The value at a dotted key, following a whole-value `${other.key}` interpolation; None when absent."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    if isinstance(node, str) and _depth < 8 and (match := _INTERPOLATION.match(node)):
        return _lookup(config, match.group(1), _depth + 1)
    return node


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def check(config: Mapping[str, Any], cluster: Cluster, partial: bool = False) -> CheckResult:
    """ROLL's start-up assertions, applied before submission. partial: only what the given keys decide
    (used on the overrides alone, where a missing key means "comes from the base")."""
    result = CheckResult()
    total = cluster.total_gpus
    _check_device_mappings(config, cluster, result)
    _check_env_manager_batches(config, result)
    _check_megatron_dp(config, result)

    infer_strategy = _lookup(config, "actor_infer.strategy_args.strategy_name")
    if infer_strategy is not None and infer_strategy not in INFER_STRATEGIES:
        result.errors.append(
            f"actor_infer.strategy_args.strategy_name: must be vllm or sglang (ROLL asserts it); got {infer_strategy!r}"
        )
    elif infer_strategy is None and isinstance(config.get("actor_infer"), Mapping) and not partial:
        result.warnings.append("actor_infer.strategy_args.strategy_name: not set; ROLL needs vllm or sglang")

    if not partial and not _lookup(config, "response_length") and not _lookup(config, "sequence_length"):
        result.errors.append(
            "response_length / sequence_length: one of them must be set (ROLL asserts it); got "
            f"response_length={config.get('response_length')!r}, sequence_length={config.get('sequence_length')!r}"
        )

    if not cluster.bf16:
        for name, role in _roles_with_model_args(dict(config)):
            if role["model_args"].get("dtype") == "bf16":
                result.warnings.append(
                    f"{name}.model_args.dtype: bf16 on GPUs without bf16 support (V100/T4); fp16 is the safe choice"
                )
    if total <= 0:
        result.errors.append(f"cluster: needs at least one GPU; got {cluster.nodes} x {cluster.gpus_per_node}")
    return result


def _check_device_mappings(config: Mapping[str, Any], cluster: Cluster, result: CheckResult) -> None:
    total = cluster.total_gpus
    union: list[int] = []
    for key, value in device_mappings(config):
        try:
            indices = parse_device_mapping(value)
        except ValueError as error:
            result.errors.append(f"{key}: {error}; got {value!r}")
            continue
        if not indices:
            result.errors.append(f"{key}: names no GPU; got {value!r}")
            continue
        union += indices
        if max(indices) >= total:
            result.errors.append(
                f"{key}: GPU indices must be within 0..{total - 1} (the cluster has {cluster.nodes} node(s) x "
                f"{cluster.gpus_per_node} GPU(s) = {total}); got {value!r} (up to {max(indices)})"
            )
        if sorted(set(indices)) != list(range(min(indices), max(indices) + 1)) or len(set(indices)) != len(indices):
            result.warnings.append(
                f"{key}: not a contiguous range of distinct GPUs (ROLL's placement assumes one, issue #205); "
                f"got {value!r}"
            )
    if union and not _is_contiguous_from_zero(union):
        result.warnings.append(
            f"device_mapping: together the roles use GPUs {sorted(set(union))}, not a contiguous range from 0 "
            "(issue #205); unused GPUs in between are wasted"
        )


def _check_env_manager_batches(config: Mapping[str, Any], result: CheckResult) -> None:
    rollout = _int(_lookup(config, "rollout_batch_size"))
    train_group = _int(_lookup(config, "train_env_manager.group_size"))
    if rollout is not None and rollout > 0 and train_group and rollout % train_group:
        result.errors.append(
            "rollout_batch_size: must be a multiple of train_env_manager.group_size; got "
            f"rollout_batch_size={rollout}, train_env_manager.group_size={train_group}"
        )
    val = _int(_lookup(config, "val_batch_size"))
    val_group = _int(_lookup(config, "val_env_manager.group_size"))
    val_groups = _int(_lookup(config, "val_env_manager.num_env_groups"))
    if val is None or val < 0 or not val_group:
        return
    if val % val_group:
        result.errors.append(
            "val_batch_size: must be a multiple of val_env_manager.group_size; got "
            f"val_batch_size={val}, val_env_manager.group_size={val_group}"
        )
    elif val_groups and val % (val_groups * val_group):
        result.errors.append(
            "val_batch_size: must be divisible by val_env_manager.num_env_groups x group_size; got "
            f"val_batch_size={val}, num_env_groups={val_groups}, group_size={val_group} "
            f"(= {val_groups * val_group})"
        )


def _check_megatron_dp(config: Mapping[str, Any], result: CheckResult) -> None:
    strategy = _lookup(config, "actor_train.strategy_args.strategy_name")
    mapping = _lookup(config, "actor_train.device_mapping")
    rollout = _int(_lookup(config, "rollout_batch_size"))
    if not isinstance(strategy, str) or "megatron" not in strategy or mapping is None or rollout is None:
        return
    try:
        world = len(parse_device_mapping(mapping))
    except ValueError:
        return  # reported by the device-mapping check
    strategy_config = _lookup(config, "actor_train.strategy_args.strategy_config")
    if not isinstance(strategy_config, Mapping):
        strategy_config = {}
    sizes = {
        "tensor": _int(strategy_config.get("tensor_model_parallel_size")) or 1,
        "pipeline": _int(strategy_config.get("pipeline_model_parallel_size")) or 1,
        "context": _int(strategy_config.get("context_parallel_size")) or 1,
    }
    model_parallel = sizes["tensor"] * sizes["pipeline"] * sizes["context"]
    detail = f"TP={sizes['tensor']} x PP={sizes['pipeline']} x CP={sizes['context']} = {model_parallel}"
    if world % model_parallel:
        result.errors.append(
            f"actor_train.device_mapping: its {world} GPUs must be divisible by the model parallelism ({detail}); "
            f"got {mapping!r}"
        )
        return
    data_parallel = world // model_parallel
    if rollout > 0 and data_parallel > 1 and rollout % data_parallel:
        result.errors.append(
            f"rollout_batch_size: must be divisible by Megatron's data-parallel size {data_parallel} "
            f"({world} GPUs of actor_train.device_mapping / {detail}); got rollout_batch_size={rollout}"
        )


def check_defaults_exist(config: Mapping[str, Any], config_dir: str) -> list[str]:
    return [
        f"defaults: {entry!r} resolves to {path}, which does not exist"
        for entry, path in defaults_files(config, config_dir)
        if not os.path.isfile(path)
    ]


# ------------------------------------------------------------------------------------------------------- CLI
def _read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, json.JSONDecodeError) as error:
        raise RenderError(f"cannot read the {what} {path}: {error}") from None


def _run_render(args: argparse.Namespace) -> int:
    cluster = Cluster.from_mapping(_read_json(args.cluster, "cluster facts"))
    overrides = _read_json(args.overrides, "overrides") if args.overrides else {}
    if not isinstance(overrides, dict):
        raise RenderError(f"the overrides {args.overrides} must be a JSON object; got {overrides!r}")
    if not os.path.isfile(args.base):
        raise RenderError(
            f"the base config {args.base} does not exist in {os.getcwd()} (training.roll.baseConfig must name a "
            "file under ROLL's examples/ at the checked-out ref)"
        )
    with open(args.base, encoding="utf-8") as handle:
        base_text = handle.read()
    rendered = render(base_text, cluster, overrides, args.base, args.out)
    text = rendered.yaml_text(_header(args.base, cluster, overrides, rendered))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    temporary = args.out + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, args.out)  # a half-written config is never left behind
    print(f"roll_render: wrote {args.out} from {args.base}")
    for line in rendered.applied:
        print(f"roll_render: applied {line}")
    for line in rendered.kept:
        print(f"roll_render: kept {line}")
    return 0


def _run_check(args: argparse.Namespace) -> int:
    cluster = Cluster.from_mapping(_read_json(args.cluster, "cluster facts"))
    try:
        with open(args.check, encoding="utf-8") as handle:
            config = yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as error:
        raise RenderError(f"cannot read the rendered config {args.check}: {error}") from None
    if not isinstance(config, dict):
        raise RenderError(f"the rendered config {args.check} is not a YAML mapping")
    result = check(config, cluster)
    result.errors += check_defaults_exist(config, os.path.dirname(os.path.abspath(args.check)))
    for line in result.warnings:
        print(f"roll_render: WARNING {line}", file=sys.stderr)
    for line in result.errors:
        print(f"roll_render: ERROR {line}", file=sys.stderr)
    if result.errors:
        print(
            f"roll_render: {len(result.errors)} problem(s) in {args.check}; fix them with "
            "roll-cluster:training.overrides (or another training.roll.baseConfig)",
            file=sys.stderr,
        )
        return 1
    print(f"roll_render: {args.check} passes the checks for {cluster.total_gpus} GPU(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--base", help="base example YAML, e.g. examples/agentic_demo/x.yaml")
    parser.add_argument("--cluster", required=True, help="cluster facts JSON")
    parser.add_argument("--overrides", help="overrides JSON object, merged last")
    parser.add_argument("--out", help="rendered YAML, e.g. examples/pulumi/<name>.yaml")
    parser.add_argument("--check", metavar="RENDERED_YAML", help="check a rendered YAML instead of rendering")
    args = parser.parse_args(argv)
    try:
        if args.check:
            return _run_check(args)
        if not args.base or not args.out:
            parser.error("rendering needs --base and --out (or use --check RENDERED_YAML)")
        return _run_render(args)
    except RenderError as error:
        print(f"roll_render: ERROR {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
