"""Environments of the Ray and job steps (the commands users run against the cluster: infra/ray/user_commands.py).

Pure Python on plain values: the Pulumi components call these inside `Output.apply` and hand the result to
`infra.node.remote.render` together with the scripts named here (each list runs after lib.sh, in order). Secrets are
not part of these environments: a component adds them to the environment it renders (as Outputs, so they stay
secret) and lists their names in `RaySettings.extra_env_names`; the Ray steps write them into the start record in
the container (mode 0600) and `ray start` gets them from there (ray_launch.sh), so the raylet and every job inherit
them and no value appears on a command line.

    settings = RaySettings(container_name="roll", gpus_per_node=8, ports=RayPorts(8100, 8101, 8102),
                           extra_env_names=("WANDB_API_KEY",))
    render(HEAD_STEP.step, HEAD_STEP.scripts, {**head_env(settings, "10.0.0.10"), "WANDB_API_KEY": secret})
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import ipaddress
import json
import re
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

RAY_COMMON_SCRIPT = "ray_common.sh"


@dataclass(frozen=True)
class StepScripts:
    """A step's name (ROLL_CLUSTER_STEP, the name of its log file) and the scripts it runs, in order, after lib.sh."""

    step: str
    scripts: tuple[str, ...]


# ray_launch.sh: the start function the container's main process shares (components/bootstrap.py container_command).
RAY_LAUNCH_SCRIPT = "ray_launch.sh"
HEAD_STEP = StepScripts("ray-head", (RAY_COMMON_SCRIPT, RAY_LAUNCH_SCRIPT, "ray_head.sh"))
WORKER_STEP = StepScripts("ray-worker", (RAY_COMMON_SCRIPT, RAY_LAUNCH_SCRIPT, "ray_worker.sh"))
READY_STEP = StepScripts("ray-ready", (RAY_COMMON_SCRIPT, "ray_ready.sh"))
RAY_STOP_STEP = StepScripts("ray-stop", (RAY_COMMON_SCRIPT, "ray_stop.sh"))
JOB_STOP_STEP = StepScripts("job-stop", (RAY_COMMON_SCRIPT, "job_stop.sh"))
REWARD_SERVER_STEP = StepScripts("reward-server", (RAY_COMMON_SCRIPT, "reward_server.sh"))
# The same script with REWARD_ACTION=stop (reward_stop_env): the reward server's delete command.
REWARD_STOP_STEP = StepScripts("reward-server-stop", (RAY_COMMON_SCRIPT, "reward_server.sh"))

REMOTE_USER = "root"
OBJECT_STORE_MINIMUM_BYTES = 75 * 1024 * 1024  # Ray refuses a smaller object store

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTAINER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9._/-]*$")


@dataclass(frozen=True)
class RayPorts:
    """The head's ports: GCS (`ray start --port`), dashboard / Jobs API, Ray Client server."""

    gcs: int = 6379
    dashboard: int = 8265
    client: int = 10001

    def __post_init__(self) -> None:
        ports = {"gcs": self.gcs, "dashboard": self.dashboard, "client": self.client}
        for name, port in ports.items():
            _check_port(f"Ray {name} port", port)
        if len(set(ports.values())) != len(ports):
            raise ValueError(f"the Ray ports must differ: {ports}")


@dataclass(frozen=True)
class RaySettings:
    """What the Ray steps of one cluster share.

    dashboard_host: "0.0.0.0" when the dashboard is reached from the admin CIDRs, "127.0.0.1" for tunnel only.
    temp_dir / spill_dir: "" for Ray's defaults; e.g. "/data/ray/tmp" and "/data/ray/spill" on a data disk.
    object_store_memory (bytes) / num_cpus: None for Ray's defaults.
    extra_env_names: exported variables (secrets) passed into `ray start`, so the raylet and every job have them.
    head_wait_timeout_s: how long a worker waits for the head's GCS port; ready_timeout_s: the readiness gate's.
    head_reserved_gpus: GPU ids of the head that Ray must not hand out (OpenRLHF's reward server runs on them
    outside Ray): the head's Ray starts with the other ids in CUDA_VISIBLE_DEVICES and announces only those.
    """

    container_name: str
    gpus_per_node: int
    ports: RayPorts = field(default_factory=RayPorts)
    dashboard_host: str = "127.0.0.1"
    temp_dir: str = ""
    spill_dir: str = ""
    object_store_memory: int | None = None
    num_cpus: int | None = None
    extra_env_names: tuple[str, ...] = ()
    head_wait_timeout_s: int = 900
    ready_timeout_s: int = 900
    # "GPU" (announced with --num-gpus) or "NPU" (Ascend: a custom resource, as MindSpeed-RL's scripts start Ray).
    accelerator_resource: str = "GPU"
    preload_jemalloc: bool = False  # Ray starts with the container's libjemalloc in LD_PRELOAD (MindSpeed-RL)
    head_reserved_gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _check_container_name(self.container_name)
        reserved = self.head_reserved_gpus
        if reserved and self.accelerator_resource != "GPU":
            raise ValueError("head_reserved_gpus is for NVIDIA GPUs only (CUDA_VISIBLE_DEVICES)")
        if len(set(reserved)) != len(reserved) or any(not 0 <= gpu < self.gpus_per_node for gpu in reserved):
            raise ValueError(f"head_reserved_gpus must be distinct GPU ids of 0..{self.gpus_per_node - 1}, "
                             f"not {list(reserved)}")
        if self.accelerator_resource not in ("GPU", "NPU"):
            raise ValueError(f"accelerator_resource must be GPU or NPU, not {self.accelerator_resource!r}")
        if self.gpus_per_node < 0:
            raise ValueError(f"gpus_per_node must be 0 or more, not {self.gpus_per_node}")
        if self.dashboard_host not in ("0.0.0.0", "127.0.0.1"):
            raise ValueError(f"dashboard_host must be 0.0.0.0 or 127.0.0.1, not {self.dashboard_host!r}")
        for name, path in (("temp_dir", self.temp_dir), ("spill_dir", self.spill_dir)):
            if path and not _PLAIN_PATH.match(path):
                raise ValueError(f"{name} must be an absolute path of letters, digits and ._/-, not {path!r}")
        if self.object_store_memory is not None and self.object_store_memory < OBJECT_STORE_MINIMUM_BYTES:
            raise ValueError(f"object_store_memory must be at least {OBJECT_STORE_MINIMUM_BYTES} bytes (75 MiB)")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ValueError(f"num_cpus must be 1 or more, not {self.num_cpus}")
        for name in self.extra_env_names:
            if not _ENV_NAME.match(name):
                raise ValueError(f"extra_env_names: {name!r} is not an environment variable name")
        if self.head_wait_timeout_s < 1 or self.ready_timeout_s < 1:
            raise ValueError("the head wait and readiness timeouts must be at least 1 second")

    @property
    def head_gpus(self) -> int:
        """GPUs the head announces to Ray: its own less the reserved ones."""
        return self.gpus_per_node - len(self.head_reserved_gpus)

    @property
    def head_ray_devices(self) -> str | None:
        """CUDA_VISIBLE_DEVICES of the head's `ray start`: None when nothing is reserved (Ray sees every GPU), ""
        when every GPU is (Ray gets none)."""
        if not self.head_reserved_gpus:
            return None
        return ",".join(str(gpu) for gpu in range(self.gpus_per_node) if gpu not in self.head_reserved_gpus)


@dataclass(frozen=True)
class RewardServer:
    """A remote reward server (OpenRLHF) kept running on the head, in the container, from `workdir`."""

    command: str
    port: int = 5000
    health_timeout_s: int = 600
    workdir: str = "/"

    def __post_init__(self) -> None:
        if not self.command.strip():
            raise ValueError("the reward server command is empty")
        _check_port("reward server port", self.port)
        if not self.workdir.startswith("/"):
            raise ValueError(f"the reward server's workdir must be an absolute path, not {self.workdir!r}")


# The checkpoint layouts the job step can search (infra/scripts/checkpoint_find.sh latest_checkpoint, one case each):
# an adapter's Checkpoints.layout names one of them (a framework with a layout of its own adds its case there).
CHECKPOINT_LAYOUTS = ("roll", "verl", "openrlhf", "megatron")


@dataclass(frozen=True)
class JobSubmission:
    """The training job the head submits; see job_submit.sh for how each field is used.

    entrypoint: a shell command, run with bash from workdir exactly as written.
    runtime_env: Ray's runtime_env (never secrets: jobs get those from the raylet's environment).
    files: absolute container path -> content, written before anything else (e.g. the generated ROLL YAML).
    prepare: an idempotent shell command run before submission (e.g. verl's data preparation).
    pre_submit_check: a shell command that must succeed before submission (e.g. a config check).
    reward_server: started (or kept) by the submit step before the job; None for none.
    start_timeout_s: how long the step waits for the job to leave PENDING; settle_s: how long a RUNNING job is
    watched for an immediate failure (both without a start gate).
    checkpoint_layout/checkpoint_dir/checkpoint_world/checkpoint_staging: where the step looks for the newest
    complete checkpoint before submitting (checkpoint_find.sh; "" layout: it does not look).
    first_step_pattern: the framework's first-step line (the start gate; "": none); gate_s: the gate's bound from
    the step's start; stall_s: the gate stops and fails a running job whose log has not grown for this long (0:
    not watched); download_pattern: download lines, for the phase the gate reports.
    """

    job_id: str
    workdir: str
    entrypoint: str
    runtime_env: Mapping[str, Any] | None = None
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    prepare: str = ""
    pre_submit_check: str = ""
    reward_server: RewardServer | None = None
    start_timeout_s: int = 60
    settle_s: int = 10
    checkpoint_layout: str = ""
    checkpoint_dir: str = ""
    checkpoint_world: int = 0
    checkpoint_staging: str = ""
    first_step_pattern: str = ""
    download_pattern: str = ""
    gate_s: int = 3600
    stall_s: int = 1200

    def __post_init__(self) -> None:
        _check_job_id(self.job_id)
        if not self.workdir.startswith("/"):
            raise ValueError(f"the job's workdir must be an absolute path, not {self.workdir!r}")
        if not self.entrypoint.strip():
            raise ValueError("the job's entrypoint is empty")
        for path in self.files:
            _check_file_path(path)
        if self.checkpoint_layout and self.checkpoint_layout not in CHECKPOINT_LAYOUTS:
            raise ValueError(f"unknown checkpoint layout {self.checkpoint_layout!r}")
        if self.checkpoint_layout and not self.checkpoint_dir.startswith("/"):
            raise ValueError(f"the checkpoint directory must be an absolute path, not {self.checkpoint_dir!r}")
        if self.checkpoint_staging and not self.checkpoint_staging.startswith("/"):
            raise ValueError(f"the staging directory must be an absolute path, not {self.checkpoint_staging!r}")


def _check_container_name(name: str) -> None:
    if not _CONTAINER_NAME.match(name):
        raise ValueError(f"container name {name!r} is not a valid Docker container name")


def _check_job_id(job_id: str) -> None:
    if not _JOB_ID.match(job_id):
        raise ValueError(f"job id {job_id!r} may hold only letters, digits, '.', '_' and '-'")


def _check_port(what: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise ValueError(f"{what} {port} is not a TCP port (1..65535)")


def _check_file_path(path: str) -> None:
    parts = path.split("/")
    if not path.startswith("/") or path.endswith("/") or ".." in parts or "" in parts[1:]:
        raise ValueError(f"job file path {path!r} must be an absolute path to a file, without '..'")


def _ip(ip: str) -> str:
    return str(ipaddress.ip_address(ip))


def _env_names(names: Sequence[str]) -> str:
    for name in names:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name")
    return " ".join(names)


def _optional(value: int | None) -> str:
    return "" if value is None else str(value)


def _node_env(settings: RaySettings) -> dict[str, str]:
    return {
        "CONTAINER_NAME": settings.container_name,
        "GCS_PORT": str(settings.ports.gcs),
        "NUM_GPUS": str(settings.gpus_per_node if settings.accelerator_resource == "GPU" else 0),
        "RAY_RESOURCES": (
            json.dumps({settings.accelerator_resource: settings.gpus_per_node})
            if settings.accelerator_resource != "GPU" else ""
        ),
        "RAY_PRELOAD_JEMALLOC": "1" if settings.preload_jemalloc else "0",
        "RAY_TEMP_DIR": settings.temp_dir,
        "RAY_OBJECT_STORE_MEMORY": _optional(settings.object_store_memory),
        "RAY_NUM_CPUS": _optional(settings.num_cpus),
        "RAY_EXTRA_ENV_NAMES": " ".join(settings.extra_env_names),
    }


def head_env(settings: RaySettings, head_ip: str) -> dict[str, str]:
    """Environment of HEAD_STEP on node rank 0 (`head_ip`: its private IP). With reserved GPUs the head announces
    only the others (NUM_GPUS) and `ray start` gets them as CUDA_VISIBLE_DEVICES (RAY_CUDA_VISIBLE_DEVICES): Ray
    counts a node's GPUs among those ids and its workers map the ids it assigns through that list, so no Ray
    actor is placed on a reserved GPU (ray/_private/resource_and_label_spec.py, _resolve_accelerator_resources;
    ray/_private/worker.py, get_accelerator_ids_for_accelerator_resource)."""
    devices = settings.head_ray_devices
    return {
        **_node_env(settings),
        "NUM_GPUS": str(settings.head_gpus if settings.accelerator_resource == "GPU" else 0),
        **({"RAY_CUDA_VISIBLE_DEVICES": devices} if devices is not None else {}),
        "NODE_IP": _ip(head_ip),
        "NODE_RANK": "0",
        "DASHBOARD_PORT": str(settings.ports.dashboard),
        "CLIENT_PORT": str(settings.ports.client),
        "DASHBOARD_HOST": settings.dashboard_host,
        "RAY_SPILL_DIR": settings.spill_dir,
    }


def worker_env(
    settings: RaySettings, node_ip: str, head_ip: str, node_rank: int, generation: str = ""
) -> dict[str, str]:
    """Environment of WORKER_STEP on node `node_rank` (1 and up); IPs are private. `generation`: the cluster's Ray
    generation (ray_generation): when it changes the head restarted, and the worker rejoins."""
    if node_rank < 1:
        raise ValueError(f"a worker's node rank is 1 or more (0 is the head), not {node_rank}")
    return {
        **_node_env(settings),
        "NODE_IP": _ip(node_ip),
        "HEAD_IP": _ip(head_ip),
        "NODE_RANK": str(node_rank),
        "HEAD_WAIT_TIMEOUT_S": str(settings.head_wait_timeout_s),
        "RAY_GENERATION": generation,
    }


def ray_generation(settings: RaySettings, head_ip: str, head_container: str, secret_values: Sequence[str]) -> str:
    """The cluster's Ray generation: a digest of everything the head's Ray runs with (its settings, its container,
    the secrets in its environment). Ray restarts on the head when it changes, so the workers rejoin, the
    readiness gate checks again and the job is submitted again: these steps carry it in their environment.
    The secrets enter only through a digest of their own."""
    secrets = hashlib.sha256("\0".join(secret_values).encode()).hexdigest()
    document = json.dumps({"head": head_env(settings, head_ip), "container": head_container, "secrets": secrets},
                          sort_keys=True)
    return hashlib.sha256(document.encode()).hexdigest()[:32]


def ready_env(settings: RaySettings, head_ip: str, node_ips: Sequence[str]) -> dict[str, str]:
    """Environment of READY_STEP on the head: the alive Ray nodes must be exactly `node_ips` (private, head
    included), each with `settings.gpus_per_node` GPUs (the head `settings.head_gpus`), within
    `settings.ready_timeout_s`."""
    ips = [_ip(ip) for ip in node_ips]
    if len(set(ips)) != len(ips):
        raise ValueError(f"node IPs repeat: {' '.join(ips)}")
    if _ip(head_ip) not in ips:
        raise ValueError(f"the head {head_ip} is not among the node IPs {' '.join(ips)}")
    return {
        "CONTAINER_NAME": settings.container_name,
        "HEAD_IP": _ip(head_ip),
        "GCS_PORT": str(settings.ports.gcs),
        "EXPECTED_NODE_IPS": " ".join(ips),
        "GPUS_PER_NODE": str(settings.gpus_per_node),
        "HEAD_GPUS": str(settings.head_gpus),
        "ACCELERATOR_RESOURCE": settings.accelerator_resource,
        "READY_TIMEOUT_S": str(settings.ready_timeout_s),
    }


def ray_stop_env(settings: RaySettings) -> dict[str, str]:
    """Environment of RAY_STOP_STEP (`ray stop` on every node: the delete command of the head and workers)."""
    return {"CONTAINER_NAME": settings.container_name}


def reward_server_env(
    settings: RaySettings, reward: RewardServer, extra_env_names: Sequence[str] = ()
) -> dict[str, str]:
    """Environment of REWARD_SERVER_STEP on the head (also merged into submit_env when the job has one).
    `extra_env_names`: exported variables (e.g. HF_TOKEN) the server needs; the step must export them too."""
    return {
        "CONTAINER_NAME": settings.container_name,
        "REWARD_COMMAND": reward.command,
        "REWARD_PORT": str(reward.port),
        "REWARD_HEALTH_TIMEOUT_S": str(reward.health_timeout_s),
        "REWARD_WORKDIR": reward.workdir,
        "RAY_EXTRA_ENV_NAMES": _env_names(extra_env_names),
    }


def reward_stop_env(settings: RaySettings) -> dict[str, str]:
    """Environment of REWARD_STOP_STEP (the reward server's delete command): stops every supervised reward
    server in the head's container; nothing running is success."""
    return {"CONTAINER_NAME": settings.container_name, "REWARD_ACTION": "stop"}


SUBMIT_STEP = StepScripts("job-submit", (RAY_COMMON_SCRIPT, "checkpoint_find.sh", "job_submit.sh"))


def submit_step(job: JobSubmission) -> StepScripts:
    """The submit step; with a reward server it starts (or keeps) the server before submitting."""
    if job.reward_server is None:
        return SUBMIT_STEP
    return StepScripts(SUBMIT_STEP.step, (RAY_COMMON_SCRIPT, "reward_server.sh", "checkpoint_find.sh", "job_submit.sh"))


HEAD_IP_VARIABLE = "ROLL_CLUSTER_HEAD_IP"


def submit_env(
    settings: RaySettings, job: JobSubmission, extra_env_names: Sequence[str] = (), head_ip: str = ""
) -> dict[str, str]:
    """Environment of `submit_step(job)` on the head. The job itself gets the secrets from the raylet;
    `extra_env_names` names exported variables (e.g. HF_TOKEN) that the prepare and check commands and the
    reward server need, which the step must then export too. `head_ip` (the head's private IP) reaches the job's
    entrypoint as $ROLL_CLUSTER_HEAD_IP, so that the job's configuration can name the head without knowing its
    address before the head exists (OpenRLHF's reward URL)."""
    env = {
        "CONTAINER_NAME": settings.container_name,
        "DASHBOARD_PORT": str(settings.ports.dashboard),
        "JOB_ID": job.job_id,
        "JOB_WORKDIR": job.workdir,
        "JOB_ENTRYPOINT": job.entrypoint,
        "JOB_RUNTIME_ENV_JSON": json.dumps(dict(job.runtime_env), sort_keys=True) if job.runtime_env else "",
        "JOB_FILES_B64": files_archive_b64(job.files) if job.files else "",
        "JOB_PREPARE": job.prepare,
        "JOB_PRE_SUBMIT_CHECK": job.pre_submit_check,
        "JOB_START_TIMEOUT_S": str(job.start_timeout_s),
        "JOB_SETTLE_S": str(job.settle_s),
        "JOB_CHECKPOINT_LAYOUT": job.checkpoint_layout,
        "JOB_CHECKPOINT_DIR": job.checkpoint_dir,
        "JOB_CHECKPOINT_WORLD": str(job.checkpoint_world),
        "JOB_CHECKPOINT_STAGING": job.checkpoint_staging,
        "JOB_FIRST_STEP_PATTERN": job.first_step_pattern,
        "JOB_DOWNLOAD_PATTERN": job.download_pattern,
        "JOB_START_GATE_S": str(job.gate_s),
        "JOB_STALL_S": str(job.stall_s),
        "RAY_EXTRA_ENV_NAMES": _env_names(extra_env_names),
        "JOB_HEAD_IP": _ip(head_ip) if head_ip else "",
    }
    if job.reward_server is not None:
        env.update(reward_server_env(settings, job.reward_server, extra_env_names))
    return env


def job_stop_env(settings: RaySettings, job_id: str) -> dict[str, str]:
    """Environment of JOB_STOP_STEP on the head (on destroy, and before a changed job replaces this one)."""
    _check_job_id(job_id)
    return {
        "CONTAINER_NAME": settings.container_name,
        "DASHBOARD_PORT": str(settings.ports.dashboard),
        "JOB_ID": job_id,
    }


# A fixed timestamp makes the archive, and so the step's command, the same on every `pulumi up`: a changed
# command would make Pulumi run the step again.
_ARCHIVE_MTIME = 1_704_067_200  # 2024-01-01T00:00:00Z


def files_archive_b64(files: Mapping[str, str | bytes]) -> str:
    """JOB_FILES_B64: base64 of a gzipped tar of `files` (absolute container path -> content), members relative
    to / (job_submit.sh extracts it with `tar -xz -C /`)."""
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped,
        tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for path in sorted(files):
            _check_file_path(path)
            content = files[path]
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size = len(data)
            info.mode = 0o644
            info.mtime = _ARCHIVE_MTIME
            archive.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode()
