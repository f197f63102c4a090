"""What every framework adapter hands to the Pulumi components: the code each node gets (CodeSpec, the env of
fetch_code.sh) and the job the head submits (JobSpec, the env of job_submit.sh).

Pure Python on purpose: the adapters are called with plain values (the head's IP already resolved), so they can
be tested and shown in the offline plan without Pulumi.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from infra import layout
from infra.config import PROJECT, ContainerConfig, TrainingConfig
from infra.ray.commands import RewardServer


@dataclass(frozen=True)
class ClusterShape:
    stack: str  # Pulumi stack name, used in ids and experiment names
    nodes: int
    gpus_per_node: int
    bf16: bool  # False on V100/T4 (catalog GpuFamily.bf16)
    head_ip: str  # head's private IP ("" where it is not known yet, e.g. check_before_deploy)
    shared_dir: str | None  # "/mnt/shared" when storage.nas, else None
    data_dir: str  # "/data" (a data disk or a plain dir)
    dashboard_port: int
    # Where models and datasets come from (ClusterConfig.model_source) and the mirror for `hf-mirror`: where the
    # job downloads from, not what it trains, so not among facts().
    model_source: str = "huggingface"
    hf_endpoint: str = ""

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def output_root(self, framework: str) -> str:
        """Checkpoints and logs: on shared storage when there is some, else on each node's data dir."""
        return posixpath.join(self.shared_dir or self.data_dir, framework, self.stack)

    def checkpoint_dir(self, job_name: str) -> str:
        """This stack's checkpoint directory of the job named job_name (see infra.layout.checkpoint_dir)."""
        return layout.checkpoint_dir(self.stack, job_name, shared=self.shared_dir is not None)

    def download_env(self) -> dict[str, str]:
        """Environment that points Hugging Face downloads at the configured source (empty for the Hub itself)."""
        if self.model_source == "hf-mirror" and self.hf_endpoint:
            return {"HF_ENDPOINT": self.hf_endpoint}
        return {}

    def facts(self) -> dict[str, Any]:
        """What the training configuration depends on. Not the head's IP or the dashboard port: a replaced
        head or a moved dashboard does not make it another training run."""
        return {
            "stack": self.stack,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "total_gpus": self.total_gpus,
            "bf16": self.bf16,
            "shared_dir": self.shared_dir,
            "data_dir": self.data_dir,
        }


@dataclass(frozen=True)
class CodeSpec:
    """What fetch_code.sh installs in the container on every node, at the same path everywhere (Ray puts the
    driver's directories on the workers' sys.path)."""

    repo: str | None
    ref: str | None
    archive_url: str | None
    code_dir: str | None
    requirements_file: str | None
    pip_index_url: str
    install_editable: bool
    extra_packages: str
    # The node scripts of the code step, rendered in this order into one step (lib.sh first). A framework whose
    # code is more than one checkout adds a script that runs after fetch_code.sh (MindSpeed-RL:
    # mindspeed_rl_code.sh) and takes its own settings from extra_env.
    scripts: tuple[str, ...] = ("fetch_code.sh",)
    extra_env: Mapping[str, str] = field(default_factory=dict)
    uninstall_packages: str = ""  # removed from the image before anything is installed (OpenRLHF's dockerfile)
    mirror_repo: str | None = None  # a mainland mirror of repo, fetched from first (fetch_code.sh CODE_MIRROR_REPO)

    def env(self, container_name: str) -> dict[str, str]:
        return {
            **self.extra_env,
            "CONTAINER_NAME": container_name,
            "CODE_REPO": self.repo or "",
            "CODE_REF": self.ref or "",
            "CODE_DIR": self.code_dir or "",
            "CODE_ARCHIVE_URL": self.archive_url or "",
            "CODE_MIRROR_REPO": self.mirror_repo or "",
            "PIP_INDEX_URL": self.pip_index_url,
            "REQUIREMENTS_FILE": self.requirements_file or "",
            "INSTALL_EDITABLE": "1" if self.install_editable else "0",
            "PIP_EXTRA_PACKAGES": self.extra_packages,
            "PIP_UNINSTALL_PACKAGES": self.uninstall_packages,
        }


# The line each framework prints when a training step is done (the start gate waits for it, jobStatus reports the
# step number: the first integer of the last match). POSIX EREs, matched against the job's log.
FIRST_STEP_PATTERNS: dict[str, str] = {
    # ROLL 8eb27cc: logger.info(f"pipeline step {global_step} finished") at the end of every step
    # (roll/pipeline/agentic/agentic_pipeline.py, roll/pipeline/rlvr/rlvr_pipeline.py).
    # see verified-facts#base-agentic-pipeline
    "roll": "pipeline step [0-9]+ finished",
    # verl v0.7.0: logger.log(data=metrics, step=global_steps) (verl/trainer/ppo/ray_trainer.py) prints
    # "step:N - key:val - ..." through the console backend (verl/utils/logger/aggregate_logger.py); the
    # metrics hold training/global_step (ray_trainer.py), which the validation-only line does not.
    # see verified-facts#base-ray-trainer
    "verl": "step:[0-9]+ - .*training/global_step:[0-9]+",
    # OpenRLHF v0.10.2: logger.info(f"... Global step {global_step}: {log_status}")
    # (openrlhf/trainer/ppo_trainer.py).
    # see verified-facts#base-ppo-trainer
    "openrlhf": "Global step [0-9]+: ",
    # MindSpeed-RL 2.0.0: "iteration: N / M | ..." (mindspeed_rl/utils/loggers.py, grpo_trainer_hybrid.py).
    # see verified-facts#base-loggers
    "mindspeed-rl": "iteration: [0-9]+ / [0-9]+ [|]",
}
# Lines a model or data download prints, for the phase the gate and jobStatus report (never to extend the bound).
# UNCONFIRMED against the images' package versions: ModelScope's "Downloading Model to directory:" and its
# "Downloading [<file>]" bars, huggingface_hub's "Fetching N files".
DOWNLOAD_PATTERN = "Downloading Model to directory:|Downloading \\[|Fetching [0-9]+ files"
# The newest complete checkpoint the job step found (infra/scripts/checkpoint_find.sh), exported to the job's
# entrypoint shell; empty or unset: start fresh.
RESUME_VARIABLE = "ROLL_CLUSTER_RESUME_FROM"


@dataclass(frozen=True)
class Checkpoints:
    """Where a job saves, how often, and how a resume finds its checkpoint (what the plan shows and the job step
    uses)."""

    layout: str  # roll | verl | openrlhf | megatron: the layout latest_checkpoint reads; "" for none
    directory: str
    every: str  # in words: "every 10 steps and the final step"
    shared: bool  # on the shared storage (else each node's data dir)
    find: bool  # the job step looks for the newest complete checkpoint and hands it over
    resume: str  # how a resume finds its checkpoint, or why nothing is resumed
    world: int = 0  # OpenRLHF: the actor's GPUs (one optimizer shard each); 0: not checked
    staging: str = ""  # ROLL: its local save folder, where a failed copy is left behind; "": not checked

    def lines(self) -> list[str]:
        where = "shared storage" if self.shared else "the node's data dir: they DIE WITH THE NODE"
        return [f"checkpoints  {self.every}, to {self.directory} ({where})", f"resume       {self.resume}"]


def checkpoints(layout: str, shape: ClusterShape, directory: str, every: str, resume: bool, handed: str,
                world: int = 0, staging: str = "") -> Checkpoints:
    """handed: how the framework is given the path found (its own documented input)."""
    shared = shape.shared_dir is not None
    if not resume:
        return Checkpoints("", directory, every, shared, False,
                           "none (training.resume: false): the job starts fresh in a directory of its own", world)
    if not shared and shape.nodes > 1:
        return Checkpoints("", directory, every, shared, False,
                           f"none: without shared storage the checkpoints are node-local on {shape.nodes} nodes and "
                           "every node would need the same one (storage.nas: true to resume)", world)
    return Checkpoints(
        layout, directory, every, shared, True,
        f"at each submission the job step finds the newest complete checkpoint under {directory} and hands its "
        f"path to the job as {handed} (${RESUME_VARIABLE}); none found: it starts fresh and says so", world, staging)


@dataclass(frozen=True)
class ModelRef:
    """A model the job names by hub id, fetched by the head's model step before the job (infra/model_cache.py):
    through `hub`'s client, the one the framework itself downloads with, from `endpoint` (HF_ENDPOINT; "" for the
    client's default)."""

    hub: str  # "huggingface" | "modelscope"
    repo_id: str
    endpoint: str = ""


# A hub id as both hubs spell one (`name` or `owner/name`: huggingface_hub's validate_repo_id); anything else (a
# path, an hdfs:// URL, an unresolved ${...}) is not fetched.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def hub_models(hub: str, values: list[Any], endpoint: str = "") -> tuple[ModelRef, ...]:
    """The values that are hub ids, once each, in order: a local path (absolute, ./, ~) names nothing to download."""
    seen: list[str] = []
    for value in values:
        if isinstance(value, str) and _HUB_ID.match(value) and ".." not in value and value not in seen:
            seen.append(value)
    return tuple(ModelRef(hub, repo_id, endpoint) for repo_id in seen)


def source_models(shape: ClusterShape, values: list[Any]) -> tuple[ModelRef, ...]:
    """hub_models through the stack's model source (training.modelSource), for frameworks that follow it (verl,
    OpenRLHF): ModelScope's client for `modelscope`, else huggingface_hub's, from the mirror for `hf-mirror`."""
    hub = "modelscope" if shape.model_source == "modelscope" else "huggingface"
    return hub_models(hub, values, shape.download_env().get("HF_ENDPOINT", ""))


@dataclass(frozen=True)
class JobSpec:
    job_id: str  # Ray submission id, derived from the configuration (see job_id())
    workdir: str  # cwd in the container
    entrypoint: str  # shell command
    runtime_env: dict[str, Any] | None  # never secrets: they reach the job through the raylet's environment
    files: dict[str, str]  # absolute path in the container -> text, written before submission
    prepare: str | None  # shell command run in the container before submission (idempotent)
    pre_submit_check: str | None  # shell command that must succeed before submission
    reward_server: RewardServer | None  # started and health-checked on the head before the job
    summary: dict[str, Any]  # what the offline plan shows
    # The exact configuration file shipped to the head, built before deployment (ROLL's YAML); the plan prints
    # it in full and the job step carries it as a readable input.
    rendered_config: str | None = None
    checkpoints: Checkpoints | None = None  # None: the framework saves where and when it likes (custom)
    # The models the job names by hub id (the head's model step fetches them); () where the program cannot know
    # them (custom, MindSpeed-RL's local paths) or the job names local paths only.
    models: tuple[ModelRef, ...] = ()


class FrameworkAdapter(Protocol):
    name: str

    def code(self) -> CodeSpec | None: ...

    def job(self, shape: ClusterShape) -> JobSpec: ...


def resume_of(training: TrainingConfig, default: bool = True) -> bool:
    """training.resume, or the framework's default."""
    return default if training.resume is None else training.resume


def job_name(framework: str, shape: ClusterShape, resume: bool, job_id: str, per_world_size: bool) -> str:
    """The job's identity for its checkpoint directory. Resuming: a name that stays when the configuration
    changes (with the GPU count where the framework's checkpoints are sharded by world size, so that a resized
    cluster starts in its own directory instead of failing to load). Fresh: the submission id, new with every
    configuration."""
    if not resume:
        return job_id
    return f"{framework}-{shape.total_gpus}gpu" if per_world_size else framework


def every_steps(steps: int) -> str:
    return "the final step only" if steps <= 0 else f"every {steps} steps and the final step"


def key(path: str) -> str:
    """A key path as the user writes it in the stack config: `roll-cluster:training.roll.ref`."""
    return f"{PROJECT}:{path}"


def job_id(framework: str, shape: ClusterShape, configuration: Mapping[str, Any]) -> str:
    """Same configuration -> same id (a second `pulumi up` finds the job already submitted); any change of the
    training configuration, code ref, image or cluster shape -> a new id. Lowercase letters, digits and dashes
    only, so the id is safe in Ray's file names and on a command line."""
    payload = json.dumps(
        {"framework": framework, "shape": shape.facts(), "configuration": configuration},
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha256(payload.encode()).hexdigest()[:10]
    stack = re.sub(r"[^a-z0-9]+", "-", shape.stack.lower()).strip("-")[:40] or "stack"
    return f"{framework}-{stack}-{digest}"


# Settings that change where code comes from, not what is trained: a new mirror is not a new training run.
WHERE_FROM_ONLY = ("archive_url", "pip_index_url", "mirror_repo")


def image_facts(container: ContainerConfig) -> dict[str, str]:
    """The part of the container that changes what runs (the image), not its name or /dev/shm size."""
    return {"image": container.image}


_GITHUB = re.compile(r"^(?:https://|git@|ssh://git@)github\.com[/:]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


def github_archive_url(repo: str, ref: str) -> str | None:
    """GitHub's tarball of a ref (tag, branch or commit), the fallback where `git clone` is blocked or slow."""
    match = _GITHUB.match(repo)
    if not match:
        return None
    owner, name = match.groups()
    return f"https://github.com/{owner}/{name}/archive/{ref}.tar.gz"


def flatten(tree: Mapping[str, Any], prefix: str = "", marks: str = "") -> dict[str, Any]:
    """`{"a": {"b": 1}, "c.d": 2}` -> `{"a.b": 1, "c.d": 2}`. A leading `+`/`~` (Hydra's "add"/"delete a key")
    on any level moves to the front of the whole key; empty dicts stay values."""
    flat: dict[str, Any] = {}
    for raw_key, value in tree.items():
        name = str(raw_key)
        stripped = name.lstrip("+~")
        key_marks = marks or name[: len(name) - len(stripped)]
        path = f"{prefix}{stripped}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, path + ".", key_marks))
        else:
            flat[key_marks + path] = value
    return flat


def merged_overrides(cluster: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, Any]:
    """Cluster values, then the user's keys (`training.overrides`, flattened); a user key replaces a cluster value
    of the same name whatever its `+`/`++` prefix (Hydra rejects a key given twice)."""
    merged: dict[str, tuple[str, Any]] = {bare_key(name): (name, value) for name, value in cluster.items()}
    for name, value in flatten(user).items():
        merged[bare_key(name)] = (name, value)
    return dict(merged.values())


def bare_key(name: str) -> str:
    """The key without Hydra's `+`/`++`/`~` prefixes or a flag's leading dashes, for de-duplication."""
    return name.lstrip("+~-")
