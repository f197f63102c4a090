"""The stack configuration: one pydantic model per `roll-cluster:<section>` object of the contract
(../shared/design/stack-config.md), validated as a whole before any resource is registered.

Every error names the key path as the user writes it (`roll-cluster:nodes.count`), what is allowed and what
was given. Unknown fields are errors that suggest the nearest valid name. The README's configuration reference
is generated from these models (infra/reference.py), so descriptions here are user documentation.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import ipaddress
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from infra import catalog
from infra.device_mapping import DeviceMappingError, parse_device_mapping

PROJECT = "roll-cluster"
SECTIONS = ("nodes", "access", "container", "ray", "training", "storage")
SECRETS = ("wandbApiKey", "hfToken", "registryPassword")
DEFAULT_ROLL_IMAGE = "roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-24.05-py3-torch260-vllm084"
DEFAULT_ROLL_REPO = "https://github.com/alibaba/ROLL.git"
# v0.3.0, the ref whose configs, launchers and requirements files ../shared/reference/roll.md describes.
DEFAULT_ROLL_REF = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"
DEFAULT_PIP_INDEX = "https://mirrors.aliyun.com/pypi/simple/"
ROLL_PIPELINES = (
    "agentic", "agentic_rollout", "rlvr", "rlvr_rollout", "rlvr_vl", "distill", "distill_vl", "dpo", "sft",
    "onpolicy_distill",
)
WORLD_CIDRS = ("0.0.0.0/0", "::/0")


class ConfigError(ValueError):
    """Invalid stack configuration; every line names a key path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack configuration:\n  " + "\n  ".join(problems))


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=False, frozen=True, validate_default=True
    )


# ---------------------------------------------------------------------------------------------------- nodes
class NodesConfig(Section):
    count: int = Field(1, ge=1, le=256, description="GPU nodes; rank 0 is the Ray head and runs the training driver.")
    instance_types: list[str] = Field(
        min_length=1,
        description="ECS GPU instance types in order of preference; every node gets the same type (ROLL needs "
        "identical nodes). The first type with stock in the region (or in `zone`) is taken.",
    )
    zone: str = Field(
        "auto",
        description="A zone id of the region (e.g. `cn-hangzhou-k`), or `auto` for a zone with stock for the "
        "chosen type. Once the cluster exists the zone is kept (see README, 'sticky placement').",
    )
    spot: bool = Field(False, description="Preemptible (spot) instances at the market price.")
    spot_price_limit: float | None = Field(
        None, gt=0, description="Hourly price cap per instance; implies spot with a price limit."
    )
    system_disk_gb: int = Field(200, ge=100, le=2048, description="ESSD system disk size in GB.")
    data_disk_gb: int = Field(
        0,
        description="ESSD data disk in GB (0, or 100 to 32768) mounted at `/data`: Docker's root, Ray's temp and "
        "spill directories. 0: no data disk.",
    )
    os_image: str = Field(
        "^aliyun_3_x64_20G_alibase_.*",
        description="Regular expression for the public image name; the newest match is used. Alibaba Cloud Linux 3 "
        "and Ubuntu 22.04 (`^ubuntu_22_04_x64_20G_alibase_.*`) are supported.",
    )
    gpu_driver: Literal["auto-install", "preinstalled"] = Field(
        "auto-install",
        description="`auto-install`: Alibaba's driver auto-install script runs at first boot (10-20 min, overlapped "
        "with the image pull). `preinstalled`: the image already has the NVIDIA driver.",
    )
    driver_version: str = Field(
        "550.127.08", pattern=r"^\d+\.\d+(\.\d+)?$",
        description="NVIDIA driver for auto-install; must support the container image's CUDA (12.4 for torch260).",
    )
    cuda_version: str = Field("12.4.1", pattern=r"^\d+\.\d+(\.\d+)?$", description="CUDA version for auto-install.")
    cudnn_version: str = Field("9.2.0.82", pattern=r"^\d+(\.\d+){1,3}$", description="cuDNN version for auto-install.")
    internet_bandwidth_mbps: int = Field(
        100, ge=1, le=100,
        description="Outbound bandwidth of each node's public IP (pay by traffic); image pulls are many GB.",
    )

    @field_validator("instance_types")
    @classmethod
    def _gpu_types(cls, types: list[str]) -> list[str]:
        for index, name in enumerate(types):
            if not catalog.is_gpu_family(name):
                families = ", ".join(sorted(catalog.FAMILIES))
                raise ValueError(f"[{index}] must be an ECS GPU instance type of a known family ({families}); got {name!r}")
        if len(set(types)) != len(types):
            raise ValueError(f"lists a type twice; got {types}")
        known = [t for t in (catalog.lookup(n) for n in types) if t is not None]
        if len({t.gpus for t in known}) > 1:
            detail = ", ".join(f"{t.name} ({t.gpus})" for t in known)
            raise ValueError(
                "all candidate types must have the same number of GPUs per node, because the training "
                f"configuration is sized from it; got {detail}"
            )
        return types

    @field_validator("zone")
    @classmethod
    def _zone(cls, zone: str) -> str:
        if zone != "auto" and not re.fullmatch(r"[a-z]{2}-[a-z0-9]+(-[a-z0-9]+)*-[a-z0-9]", zone):
            raise ValueError(f"must be `auto` or a zone id such as `cn-hangzhou-k`; got {zone!r}")
        return zone

    @field_validator("data_disk_gb")
    @classmethod
    def _data_disk(cls, size: int) -> int:
        if size != 0 and not 100 <= size <= 32768:
            raise ValueError(f"must be 0 (no data disk) or between 100 and 32768; got {size}")
        return size

    @field_validator("os_image")
    @classmethod
    def _regex(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as error:
            raise ValueError(f"must be a valid regular expression ({error}); got {pattern!r}") from None
        return pattern

    @model_validator(mode="before")
    @classmethod
    def _price_limit_implies_spot(cls, data: Any) -> Any:
        # An explicit `spot: false` is kept so that the contradiction is reported below, after field checks.
        if isinstance(data, dict) and data.get("spotPriceLimit") is not None and "spot" not in data:
            data = {**data, "spot": True}
        return data

    @model_validator(mode="after")
    def _price_limit_needs_spot(self) -> NodesConfig:
        if self.spot_price_limit is not None and not self.spot:
            raise ValueError(
                "spot: must not be false when spotPriceLimit is set (a price limit implies spot); "
                f"got spot=false, spotPriceLimit={self.spot_price_limit}"
            )
        return self

    @property
    def spot_strategy(self) -> str:
        if not self.spot:
            return "NoSpot"
        return "SpotWithPriceLimit" if self.spot_price_limit is not None else "SpotAsPriceGo"


# --------------------------------------------------------------------------------------------------- access
class AccessConfig(Section):
    admin_cidrs: list[str] = Field(
        min_length=1, description="The only sources that may reach SSH and (in `admin-cidrs` mode) the dashboard."
    )
    allow_world: bool = Field(False, description="Must be true for `0.0.0.0/0` or `::/0` in `adminCidrs`.")
    ssh_public_key: str = Field(description="OpenSSH public key installed on every node (root).")
    ssh_private_key_path: str = Field(
        "~/.ssh/id_ed25519",
        description="The matching private key on the machine that runs `pulumi up`; used for the SSH steps.",
    )
    dashboard: Literal["admin-cidrs", "tunnel"] = Field(
        "admin-cidrs",
        description="`admin-cidrs`: the dashboard listens on the head's address, reachable from `adminCidrs` only. "
        "`tunnel`: it listens on 127.0.0.1 only; use the `dashboardTunnel` output.",
    )

    @field_validator("admin_cidrs")
    @classmethod
    def _cidrs(cls, cidrs: list[str]) -> list[str]:
        for index, cidr in enumerate(cidrs):
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as error:
                raise ValueError(f"[{index}] must be a CIDR such as 203.0.113.0/24 ({error}); got {cidr!r}") from None
        return cidrs

    @field_validator("ssh_public_key")
    @classmethod
    def _public_key(cls, key: str) -> str:
        key = key.strip()
        if "PRIVATE KEY" in key:
            raise ValueError("must be a public key; got a private key (never put a private key in the stack config)")
        match = re.fullmatch(
            r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(?:256|384|521)|sk-ssh-ed25519@openssh\.com|"
            r"sk-ecdsa-sha2-nistp256@openssh\.com) ([A-Za-z0-9+/]+={0,3})(?: .*)?",
            key,
        )
        if not match:
            raise ValueError(f"must be an OpenSSH public key ('ssh-ed25519 AAAA... comment'); got {key[:40]!r}")
        try:
            blob = base64.b64decode(match.group(2), validate=True)
        except binascii.Error:
            raise ValueError("must be an OpenSSH public key; its base64 part does not decode") from None
        if match.group(1).encode() not in blob[:64]:
            raise ValueError(f"is not a valid {match.group(1)} key: its key data names another type")
        return key

    @model_validator(mode="after")
    def _world_needs_opt_in(self) -> AccessConfig:
        world = [c for c in self.admin_cidrs if ipaddress.ip_network(c).prefixlen == 0]
        if world and not self.allow_world:
            raise ValueError(
                f"adminCidrs: {', '.join(world)} opens SSH and the Ray dashboard (remote code execution) to the "
                "whole internet; allowed only with allowWorld: true. Use your own address range instead"
            )
        return self


# ------------------------------------------------------------------------------------------------ container
class ContainerConfig(Section):
    image: str = Field(
        DEFAULT_ROLL_IMAGE,
        description="The training image, pulled on every node. The default is ROLL's torch 2.6 / vLLM 0.8.4 image "
        "(CUDA 12.4, runs on V100). For speed, mirror it into your own ACR in the training region.",
    )
    shm_size: str = Field("16g", description="Size of the container's /dev/shm, e.g. `16g` or `512m`.")
    registry_username: str | None = Field(
        None, description="User for a private registry; the password is the secret `registryPassword`."
    )
    name: str = Field("roll", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$", description="Container name on every node.")

    @field_validator("image")
    @classmethod
    def _image(cls, image: str) -> str:
        if not re.fullmatch(r"[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[\w][\w.-]{0,127})?(@sha256:[a-f0-9]{64})?", image):
            raise ValueError(f"must be an image reference such as registry/repo:tag; got {image!r}")
        return image

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, size: str) -> str:
        if not re.fullmatch(r"[1-9][0-9]*[mg]", size):
            raise ValueError(f"must be a size in m or g such as `16g`; got {size!r}")
        return size

    @property
    def shm_size_mb(self) -> int:
        """pulumi-docker takes /dev/shm in MB."""
        number, unit = int(self.shm_size[:-1]), self.shm_size[-1]
        return number * 1024 if unit == "g" else number

    @property
    def registry_host(self) -> str:
        first = self.image.split("/", 1)[0]
        return first if "/" in self.image and ("." in first or ":" in first) else "docker.io"


# ------------------------------------------------------------------------------------------------------ ray
class RayConfig(Section):
    gcs_port: int = Field(6379, ge=1, le=65535, description="Ray GCS port (workers join here).")
    dashboard_port: int = Field(8265, ge=1, le=65535, description="Ray dashboard and Jobs API port.")
    client_port: int = Field(10001, ge=1, le=65535, description="Ray Client server port.")
    ready_timeout_seconds: int = Field(
        900, ge=30, le=7200, description="How long the readiness gate waits for all nodes and GPUs to join."
    )

    @model_validator(mode="after")
    def _ports(self) -> RayConfig:
        ports = {"gcsPort": self.gcs_port, "dashboardPort": self.dashboard_port, "clientPort": self.client_port}
        for key, port in ports.items():
            if port == 22:
                raise ValueError(f"{key}: must not be 22 (SSH); got 22")
        if len(set(ports.values())) != len(ports):
            given = ", ".join(f"{k}={v}" for k, v in ports.items())
            raise ValueError(f"gcsPort, dashboardPort and clientPort must be distinct; got {given}")
        return self


# ------------------------------------------------------------------------------------------------- training
class RollConfig(Section):
    repo: str = Field(DEFAULT_ROLL_REPO, description="Git URL of ROLL.")
    ref: str = Field(DEFAULT_ROLL_REF, description="Tag or commit of ROLL; never a moving branch by default.")
    archive_url: str | None = Field(
        None,
        description="Tarball of the same ref, used when GitHub is unreachable from the region. Default: GitHub's "
        "archive of `ref` (set your own mirror, e.g. an OSS URL, where GitHub is blocked).",
    )
    pipeline: Literal[ROLL_PIPELINES] = Field(  # type: ignore[valid-type]
        "agentic", description="Selects `examples/start_<pipeline>_pipeline.py`."
    )
    base_config: str = Field(
        "agentic_demo/agent_val_frozen_lake_single_node_demo.yaml",
        description="`<dir>/<name>.yaml` under ROLL's `examples/`: the example the generated config starts from.",
    )
    requirements_file: str | None = Field(
        None,
        description="ROLL requirements file installed in the container; default: the one matching the image tag "
        "(e.g. `requirements_torch260_vllm.txt`).",
    )
    pip_index_url: str = Field(DEFAULT_PIP_INDEX, description="pip index used on the nodes (Alibaba's mirror).")

    @field_validator("base_config")
    @classmethod
    def _inside_examples(cls, path: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+\.ya?ml", path) or ".." in path.split("/"):
            raise ValueError(
                "must be `<dir>/<name>.yaml` inside ROLL's examples/ (no absolute path, no `..`), e.g. "
                f"`agentic_demo/agent_val_frozen_lake_single_node_demo.yaml`; got {path!r}"
            )
        return path


class VerlConfig(Section):
    repo: str = Field("https://github.com/volcengine/verl.git", description="Git URL of verl.")
    ref: str = Field("v0.7.0", description="Tag or commit of verl.")
    archive_url: str | None = Field(None, description="Tarball of the same ref, used when GitHub is unreachable.")
    entrypoint_module: str = Field("verl.trainer.main_ppo", description="Module run with `python3 -m`.")
    data_dir: str = Field(
        "/mnt/shared/data/gsm8k",
        description="Absolute directory of the prepared parquet files; must be readable on every node "
        "(verl's TaskRunner runs on any node), hence the shared storage.",
    )
    data_preparation: str | None = Field(
        "python3 examples/data_preprocess/gsm8k.py --local_save_dir {data_dir}",
        description="Shell command run once in the verl checkout on the head before submission (`{data_dir}` is "
        "replaced); skipped when `{data_dir}/train.parquet` exists. null: the data is already there.",
    )
    pip_index_url: str = Field(DEFAULT_PIP_INDEX, description="pip index used on the nodes.")

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise ValueError(f"must be an absolute path (relative paths land in Ray's temporary working_dir); got {path!r}")
        return path


class RewardServerConfig(Section):
    command: str = Field(description="Command that serves the reward model in the container on the head.")
    port: int = Field(5000, ge=1024, le=65535, description="Port of the reward server (the job gets its URL).")
    health_timeout_seconds: int = Field(
        900, ge=10, le=7200, description="How long to wait for the server to answer before failing."
    )


class OpenRlhfConfig(Section):
    package: str = Field(
        "openrlhf[vllm]==0.10.2",
        description="pip requirement installed in the container on every node (0.10.2 is the last release on "
        "Ray 2.48.0 and takes the dotted flag names).",
    )
    entrypoint_module: str = Field("openrlhf.cli.train_ppo_ray", description="Module run with `python3 -m`.")
    vllm_num_engines: int = Field(2, ge=1, description="vLLM engines (`--vllm.num_engines`).")
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="GPUs per vLLM engine.")
    reward_server: RewardServerConfig | None = Field(
        None, description="A remote reward-model server started on the head and health-checked before the job."
    )
    pip_index_url: str = Field(DEFAULT_PIP_INDEX, description="pip index used on the nodes.")


class CustomConfig(Section):
    entrypoint: str = Field(description="Shell command submitted as a Ray job, run on the head in the container.")
    working_dir: str = Field("/workspace", description="Directory (in the container) the entrypoint runs from.")


class TrainingConfig(Section):
    framework: Literal["roll", "verl", "openrlhf", "custom"] = Field("roll", description="What the job runs.")
    auto_start: bool = Field(True, description="Submit the job during `pulumi up`; false prepares everything.")
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Deep-merged last into the framework's configuration: ROLL YAML keys, verl Hydra keys "
        "(`a.b.c: value`), OpenRLHF flags (`actor.num_nodes: 2`).",
    )
    roll: RollConfig = Field(default_factory=RollConfig, description="ROLL settings.")  # type: ignore[arg-type]
    verl: VerlConfig = Field(default_factory=VerlConfig, description="verl settings.")  # type: ignore[arg-type]
    openrlhf: OpenRlhfConfig = Field(default_factory=OpenRlhfConfig, description="OpenRLHF settings.")  # type: ignore[arg-type]
    custom: CustomConfig | None = Field(None, description="Any Ray program; required when framework is `custom`.")

    @model_validator(mode="after")
    def _custom_needs_entrypoint(self) -> TrainingConfig:
        if self.framework == "custom" and self.custom is None:
            raise ValueError("custom: required when framework is `custom` (give custom.entrypoint); got nothing")
        return self


# -------------------------------------------------------------------------------------------------- storage
class StorageConfig(Section):
    nas: bool = Field(False, description="A NAS file system mounted at /mnt/shared on every node and container.")
    retain_on_destroy: bool = Field(True, description="`pulumi destroy` keeps the NAS file system and its data.")
    nas_storage_type: Literal["Capacity", "Performance", "Premium"] = Field(
        "Capacity", description="NAS storage class of a standard (General-purpose) NFS file system."
    )


# ---------------------------------------------------------------------------------------------------- whole
class ClusterConfig(Section):
    region: str = Field(description="`alicloud:region` of the stack.")
    nodes: NodesConfig
    access: AccessConfig
    container: ContainerConfig = Field(default_factory=ContainerConfig)  # type: ignore[arg-type]
    ray: RayConfig = Field(default_factory=RayConfig)  # type: ignore[arg-type]
    training: TrainingConfig = Field(default_factory=TrainingConfig)  # type: ignore[arg-type]
    storage: StorageConfig = Field(default_factory=StorageConfig)  # type: ignore[arg-type]

    @field_validator("region")
    @classmethod
    def _region(cls, region: str) -> str:
        if not re.fullmatch(r"[a-z]{2}-[a-z0-9]+(-[a-z0-9]+)*", region):
            raise ValueError(f"must be an Alibaba Cloud region id such as `cn-hangzhou`; got {region!r}")
        return region

    @model_validator(mode="after")
    def _cluster_rules(self) -> ClusterConfig:
        gpus = self.gpus_per_node * self.nodes.count
        problems: list[str] = []
        if self.training.framework == "roll":
            problems += _roll_device_mappings_fit(self.training.overrides, gpus)
        if self.training.framework == "openrlhf":
            o = self.training.openrlhf
            if o.vllm_num_engines * o.vllm_tensor_parallel_size > gpus:
                problems.append(
                    f"training.openrlhf.vllmNumEngines x vllmTensorParallelSize must fit the cluster's {gpus} GPUs; "
                    f"got {o.vllm_num_engines} x {o.vllm_tensor_parallel_size}"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def instance_type_info(self) -> catalog.GpuInstanceType | None:
        return catalog.lookup(self.nodes.instance_types[0])

    @property
    def gpus_per_node(self) -> int:
        known = [t for t in (catalog.lookup(n) for n in self.nodes.instance_types) if t]
        return known[0].gpus if known else 1


def _roll_device_mappings_fit(overrides: Mapping[str, Any], gpus: int, path: str = "training.overrides") -> list[str]:
    problems = []
    for key, value in overrides.items():
        here = f"{path}.{key}"
        if isinstance(value, Mapping):
            problems += _roll_device_mappings_fit(value, gpus, here)
        elif key == "device_mapping":
            try:
                indices = parse_device_mapping(value)
            except DeviceMappingError as error:
                problems.append(f"{here}: {error}; got {value!r}")
                continue
            if indices and max(indices) >= gpus:
                problems.append(
                    f"{here}: GPU indices must be within 0..{gpus - 1} (the cluster has {gpus} GPUs); got {value!r}"
                )
    return problems


# ---------------------------------------------------------------------------------------------- error format
def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class that owns the field at loc (for suggestions on unknown fields)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or isinstance(part, int):
            continue
        field = next((f for n, f in current.model_fields.items() if (f.alias or n) == part), None)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return current


def _format(loc: tuple[int | str, ...]) -> str:
    path = PROJECT + ":"
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("" if i == 0 else ".") + part
    return path


def _messages(error: ValidationError) -> list[str]:
    problems = []
    for item in error.errors():
        loc = tuple(p for p in item["loc"] if p not in ("function-after[_cidrs(), list[str]]",))
        # Union branches add the member type name to the location; drop those.
        loc = tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or p in ("RewardServerConfig", "CustomConfig"))))
        kind = item["type"]
        if kind == "extra_forbidden":
            owner = _model_at(ClusterConfig, loc[:-1])
            names = [f.alias or n for n, f in owner.model_fields.items()] if owner else []
            if not loc[:-1]:
                names = list(SECTIONS)
            guess = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.5)
            hint = f"; did you mean {guess[0]!r}?" if guess else ""
            problems.append(f"{_format(loc)}: unknown field{hint} Allowed: {', '.join(names)}")
            continue
        message = str(item["msg"])
        if message.startswith("Value error, "):
            message = message[len("Value error, "):]
            # Validators of a model may name a sub-key first ("spot: ..."), keep it in the path.
            head, sep, rest = message.partition(": ")
            if sep and re.fullmatch(r"[a-zA-Z][a-zA-Z.]*", head):
                problems.append(f"{_format(loc + (head,)) if loc else PROJECT + ':' + head}: {rest}")
                continue
            if message.startswith("["):
                index, _, rest = message[1:].partition("] ")
                problems.append(f"{_format(loc + (int(index),))}: {rest}")
                continue
            problems.append(f"{_format(loc)}: {message}")
            continue
        if kind == "missing":
            problems.append(f"{_format(loc)}: required; got nothing")
            continue
        problems.append(f"{_format(loc)}: {message[0].lower() + message[1:]}; got {item.get('input')!r}")
    return problems


def parse_cluster_config(raw: Mapping[str, str | None], region: str | None) -> ClusterConfig:
    """Validate the `roll-cluster:*` values as Pulumi hands them over (structured values are JSON strings).

    `raw` maps the key without the project prefix ("nodes") to its text; secrets are not part of it.
    Raises ConfigError listing every problem.
    """
    problems: list[str] = []
    data: dict[str, Any] = {}
    for key, text in raw.items():
        if key in SECRETS:
            continue
        if key not in SECTIONS:
            guess = difflib.get_close_matches(key, [*SECTIONS, *SECRETS], n=1, cutoff=0.5)
            hint = f"; did you mean {guess[0]!r}?" if guess else ""
            problems.append(f"{PROJECT}:{key}: unknown key{hint} Allowed: {', '.join([*SECTIONS, *SECRETS])}")
            continue
        try:
            value = json.loads(text) if text is not None else None
        except json.JSONDecodeError as error:
            problems.append(f"{PROJECT}:{key}: must be a structured object; got {text!r} ({error.msg})")
            continue
        if not isinstance(value, dict):
            problems.append(f"{PROJECT}:{key}: must be an object with fields; got {value!r}")
            continue
        data[key] = value
    if region is None:
        problems.append("alicloud:region: required (pulumi config set alicloud:region cn-hangzhou); got nothing")
    else:
        data["region"] = region
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as error:
        problems += [p for p in _messages(error) if not (region is None and p.startswith(PROJECT + ":region"))]
    if problems:
        raise ConfigError(problems)
    return config
