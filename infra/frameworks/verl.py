"""verl: the checkout on every node, data preparation on the head, `python3 -m verl.trainer.main_ppo` with Hydra
overrides sized from the cluster (../shared/reference/verl-openrlhf.md section 1)."""

from __future__ import annotations

import math
import posixpath
import re
import shlex
from collections.abc import Mapping
from typing import Any

from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks.base import (
    WHERE_FROM_ONLY,
    ClusterShape,
    CodeSpec,
    JobSpec,
    bare_key,
    flatten,
    github_archive_url,
    image_facts,
    job_id,
    key,
)

VERL_DIR = "/workspace/verl"
# From verl's own verl/trainer/runtime_env.yaml, less `working_dir`: the code is installed on every node at the
# same path, so nothing is uploaded (an uploaded tree would also shadow the installed package).
RUNTIME_ENV_VARS = {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}

TRAIN_BATCH = "data.train_batch_size"
ROLLOUT_N = "actor_rollout_ref.rollout.n"
ROLLOUT_TP = "actor_rollout_ref.rollout.tensor_model_parallel_size"

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


class VerlAdapter:
    name = "verl"

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
            code_dir=VERL_DIR,
            requirements_file=None,
            pip_index_url=self.verl.pip_index_url,
            install_editable=True,
            extra_packages="",
        )

    def cluster_overrides(self, shape: ClusterShape) -> dict[str, Any]:
        data_dir = self.verl.data_dir
        return {
            "trainer.nnodes": shape.nodes,
            "trainer.n_gpus_per_node": shape.gpus_per_node,
            "data.train_files": posixpath.join(data_dir, "train.parquet"),
            "data.val_files": posixpath.join(data_dir, "test.parquet"),
            # verl's default is relative, i.e. inside Ray's temporary working dir (lost with the job).
            "trainer.default_local_dir": posixpath.join(shape.output_root("verl"), "checkpoints"),
            "actor_rollout_ref.rollout.name": "vllm",  # verl's default is `???` (required)
            "trainer.logger": ["console"],  # verl's default adds wandb, which needs an API key
        }

    def effective_overrides(self, shape: ClusterShape) -> dict[str, Any]:
        """Cluster defaults, then the user's keys; a user key replaces a default of the same name (Hydra
        rejects a key given twice)."""
        merged: dict[str, tuple[str, Any]] = {
            bare_key(name): (name, value) for name, value in self.cluster_overrides(shape).items()
        }
        for name, value in flatten(self.training.overrides).items():
            merged[bare_key(name)] = (name, value)
        return dict(merged.values())

    def arguments(self, shape: ClusterShape) -> list[str]:
        return [f"{name}={hydra_value(value)}" for name, value in self.effective_overrides(shape).items()]

    def prepare(self) -> str | None:
        command = self.verl.data_preparation
        if command is None:
            return None
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
        prepare = self.prepare()
        check = self.pre_submit_check(shape)
        configuration = {
            "verl": self.verl.model_dump(mode="json", exclude=set(WHERE_FROM_ONLY)),
            "overrides": self.training.overrides,
            **image_facts(self.container),
        }
        return JobSpec(
            job_id=job_id(self.name, shape, configuration),
            workdir=VERL_DIR,
            entrypoint=entrypoint,
            runtime_env={"env_vars": dict(RUNTIME_ENV_VARS)},
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
                "data_preparation": prepare,
                "checks": [check] if check else [],
                "runtime_env": {"env_vars": dict(RUNTIME_ENV_VARS)},
            },
        )

    def problems(self, shape: ClusterShape) -> list[str]:
        problems: list[str] = []
        user = {bare_key(name): value for name, value in flatten(self.training.overrides).items()}
        total = shape.total_gpus
        path = "training.overrides."
        if TRAIN_BATCH in user or ROLLOUT_N in user:
            # verl's defaults for the one the user left alone (1024 prompts, 1 sample each).
            batch, samples = user.get(TRAIN_BATCH, 1024), user.get(ROLLOUT_N, 1)
            if isinstance(batch, int) and isinstance(samples, int) and (batch * samples) % total:
                named = TRAIN_BATCH if TRAIN_BATCH in user else ROLLOUT_N
                problems.append(
                    f"{key(path + named)}: {TRAIN_BATCH} x {ROLLOUT_N} must be divisible by the cluster's "
                    f"{total} GPUs ({shape.nodes} x {shape.gpus_per_node}); got {batch} x {samples} = {batch * samples}"
                )
        if ROLLOUT_TP in user:
            tp = user[ROLLOUT_TP]
            if not isinstance(tp, int) or tp < 1 or total % tp:
                problems.append(
                    f"{key(path + ROLLOUT_TP)}: must divide the cluster's {total} GPUs "
                    f"({shape.nodes} x {shape.gpus_per_node}); got {tp!r}"
                )
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
