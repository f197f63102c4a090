"""The stack configuration: one pydantic model per `roll-cluster:<section>` object of the contract
(../shared/design/stack-config.md), validated as a whole before any resource is registered.

Every error names the key path as the user writes it (`roll-cluster:nodes.count`), what is allowed and what
was given. Unknown fields are errors that suggest the nearest valid name. The README's configuration reference
is generated from these models (infra/reference.py), so descriptions here are user documentation.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import difflib
import ipaddress
import json
import re
import typing
from collections.abc import Mapping
from typing import Any, Literal

import annotated_types
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from infra.device_mapping import DeviceMappingError, parse_device_mapping
from infra.sources.alibaba import catalog

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
SSH_KEY_TYPES = (
    "ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com",
)
RAY_PORT_KEYS = ("gcsPort", "dashboardPort", "clientPort")

KeyPath = tuple[int | str, ...]


class ConfigError(ValueError):
    """Invalid stack configuration; every line names a key path."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack configuration:\n  " + "\n  ".join(problems))


class _Problems(ValueError):
    """Raised by validators: problems, each at a key path relative to where pydantic reports the error (the field
    for a field validator, the model for a model validator). A `..` part steps up one level, so that a field
    validator, which sees the fields validated before it, can report a cross-field rule on the key at fault."""

    def __init__(self, *problems: tuple[KeyPath, str]):
        self.problems = list(problems)
        super().__init__("; ".join(message for _, message in problems))


def _problem(message: str, *path: int | str) -> _Problems:
    return _Problems((path, message))


def _shown(value: Any, limit: int = 100) -> str:
    """A given value as the user wrote it in the stack file (JSON: true, null, "text"), cut if long."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def _catalog_gpus(instance_types: list[str]) -> int | None:
    """GPUs per node of the first candidate the catalog knows; None when it knows none (the live answer decides)."""
    known = [t for t in (catalog.lookup(n) for n in instance_types) if t is not None]
    return known[0].gpus if known else None


def covers_the_world(cidrs: list[str]) -> bool:
    """Whether the CIDRs together cover every IPv4 or every IPv6 address (`0.0.0.0/1` + `128.0.0.0/1` does)."""
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    for cidr in cidrs:
        with contextlib.suppress(ValueError):
            network = ipaddress.ip_network(cidr, strict=False)
            if isinstance(network, ipaddress.IPv4Network):
                v4.append(network)
            else:
                v6.append(network)
    return (ipaddress.IPv4Network("0.0.0.0/0") in ipaddress.collapse_addresses(v4)
            or ipaddress.IPv6Network("::/0") in ipaddress.collapse_addresses(v6))


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=False, frozen=True, validate_default=True
    )


# ---------------------------------------------------------------------------------------------------- nodes
class NodesConfig(Section):
    source: Literal["alibaba"] = Field(
        "alibaba",
        description="Where the nodes come from: `alibaba`, new GPU ECS instances in a VPC of their own "
        "(infra/sources/alibaba).",
    )
    count: int = Field(1, ge=1, le=256, description="GPU nodes; rank 0 is the Ray head and runs the training driver.")
    instance_types: list[str] = Field(
        min_length=1,
        description="ECS GPU instance types (e.g. `ecs.gn7i-c8g1.2xlarge`) in order of preference, each listed once "
        "and all with the same number of GPUs; every node gets the same type (ROLL needs identical nodes). The "
        "first type with stock in the region (or in `zone`) is taken.",
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
        problems: list[tuple[KeyPath, str]] = []
        families = ", ".join(sorted(catalog.FAMILIES))
        for index, name in enumerate(types):
            if not catalog.is_gpu_family(name):
                problems.append((
                    (index,),
                    f"must be an ECS GPU instance type of a known family ({families}), such as "
                    f"`ecs.gn7i-c8g1.2xlarge`; got {_shown(name)}",
                ))
        repeated = [name for index, name in enumerate(types) if name in types[:index]]
        if repeated:
            problems.append(((), f"must list each type once; got {', '.join(map(_shown, repeated))} more than once"))
        known = [t for t in (catalog.lookup(n) for n in types) if t is not None]
        if len({t.gpus for t in known}) > 1:
            detail = ", ".join(f"{t.name} ({_gpus(t.gpus)})" for t in known)
            problems.append((
                (),
                "all candidate types must have the same number of GPUs per node, because the training "
                f"configuration is sized from it; got {detail}",
            ))
        if problems:
            raise _Problems(*problems)
        return types

    @field_validator("zone")
    @classmethod
    def _zone(cls, zone: str) -> str:
        if zone != "auto" and not re.fullmatch(r"[a-z]{2}-[a-z0-9]+(-[a-z0-9]+)*-[a-z0-9]", zone):
            raise _problem(f"must be `auto` or a zone id such as `cn-hangzhou-k`; got {_shown(zone)}")
        return zone

    @field_validator("data_disk_gb")
    @classmethod
    def _data_disk(cls, size: int) -> int:
        if size != 0 and not 100 <= size <= 32768:
            raise _problem(f"must be 0 (no data disk) or between 100 and 32768; got {size}")
        return size

    @field_validator("os_image")
    @classmethod
    def _regex(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as error:
            raise _problem(f"must be a valid regular expression ({error}); got {_shown(pattern)}") from None
        return pattern

    @model_validator(mode="before")
    @classmethod
    def _price_limit_implies_spot(cls, data: Any) -> Any:
        # An explicit `spot: false` is kept so that the contradiction is reported below.
        if isinstance(data, dict) and data.get("spotPriceLimit") is not None and "spot" not in data:
            data = {**data, "spot": True}
        return data

    @field_validator("spot_price_limit")
    @classmethod
    def _price_limit_needs_spot(cls, limit: float | None, info: ValidationInfo) -> float | None:
        # `spot` is declared before `spotPriceLimit`, so info.data holds it when it is valid; a field validator
        # (unlike a model validator) runs even when other fields of the section are wrong.
        if limit is not None and info.data.get("spot") is False:
            raise _problem(
                "must not be false when spotPriceLimit is set (a price limit implies spot: leave spot out or set "
                f"it to true); got false with spotPriceLimit {_shown(limit)}",
                "..", "spot",
            )
        return limit

    @property
    def gpus_per_node(self) -> int | None:
        """GPUs per node from the catalog; None when no candidate type is in it (the live answer decides)."""
        return _catalog_gpus(self.instance_types)

    @property
    def spot_strategy(self) -> str:
        if not self.spot:
            return "NoSpot"
        return "SpotWithPriceLimit" if self.spot_price_limit is not None else "SpotAsPriceGo"


# --------------------------------------------------------------------------------------------------- access
class AccessConfig(Section):
    admin_cidrs: list[str] = Field(
        min_length=1,
        description="IPv4 CIDRs without host bits (e.g. `203.0.113.0/24`), each listed once: the only sources that "
        "may reach SSH and (in `admin-cidrs` mode) the dashboard. IPv6 CIDRs are refused: the cluster's VPC has no "
        "IPv6, so such a rule would never match.",
    )
    allow_world: bool = Field(
        False,
        description="Must be true when `adminCidrs` covers the whole internet (`0.0.0.0/0`, or CIDRs whose union "
        "covers it). It opens SSH only: the dashboard is never opened to the world.",
    )
    ssh_public_key: str = Field(
        description="OpenSSH public key line (`ssh-ed25519 AAAA... comment`; ed25519, RSA, ECDSA or a security "
        "key), installed on every node for root. Never a private key."
    )
    ssh_private_key_path: str = Field(
        "~/.ssh/id_ed25519",
        description="The matching private key on the machine that runs `pulumi up`; used for the SSH steps.",
    )
    dashboard: Literal["admin-cidrs", "tunnel"] = Field(
        "tunnel",
        description="`tunnel` (the default): the dashboard and Jobs API listen on the head's 127.0.0.1 only; reach "
        "them through SSH with the `dashboardTunnel` output. `admin-cidrs` (opt-in): they listen on the head's "
        "address, reachable from `adminCidrs`. Ray's dashboard has no authentication: whoever reaches it can run "
        "code on your cluster and read its secrets (the W&B and Hugging Face tokens in the raylet's environment). "
        "Refused when `adminCidrs` covers the whole internet, even with `allowWorld`.",
    )

    @field_validator("admin_cidrs")
    @classmethod
    def _cidrs(cls, cidrs: list[str]) -> list[str]:
        problems: list[tuple[KeyPath, str]] = []
        for index, cidr in enumerate(cidrs):
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError as error:
                hint = ""
                with contextlib.suppress(ValueError):  # not an address at all: there is nothing to suggest
                    hint = f"; did you mean {ipaddress.ip_network(cidr, strict=False)}?"
                problems.append(
                    ((index,), f"must be a CIDR such as 203.0.113.0/24 ({error}{hint}); got {_shown(cidr)}")
                )
        seen: dict[str, int] = {}
        for index, cidr in enumerate(cidrs):
            if any(index == p[0][0] for p in problems):
                continue
            network = ipaddress.ip_network(cidr)
            if network.version == 6:
                problems.append(((index,), "must be an IPv4 CIDR: the cluster's VPC has no IPv6 (its nodes have IPv4 "
                                 f"addresses only), so an IPv6 rule would never match; got {_shown(cidr)}"))
            elif str(network) in seen:
                problems.append(((index,), f"repeats adminCidrs[{seen[str(network)]}]: list each CIDR once; got "
                                 f"{_shown(cidr)} twice"))
            else:
                seen[str(network)] = index
        if problems:
            raise _Problems(*problems)
        return cidrs

    @field_validator("dashboard")
    @classmethod
    def _dashboard_never_to_the_world(cls, dashboard: str, info: ValidationInfo) -> str:
        # adminCidrs is declared before dashboard, so info.data holds it when it is valid.
        cidrs = info.data.get("admin_cidrs", [])
        if dashboard == "admin-cidrs" and covers_the_world(cidrs):
            raise _problem(
                f"admin-cidrs would open the Ray dashboard to the whole internet (adminCidrs {_shown(cidrs)} covers "
                "it): whoever reaches the dashboard can run code on your cluster and read its secrets. Refused even "
                "with allowWorld; use `tunnel` (the default) or list your own address ranges in adminCidrs; got "
                '"admin-cidrs"'
            )
        return dashboard

    @field_validator("allow_world")
    @classmethod
    def _world_needs_opt_in(cls, allow_world: bool, info: ValidationInfo) -> bool:
        # adminCidrs is declared before allowWorld, so info.data holds it when it is valid.
        cidrs = info.data.get("admin_cidrs", [])
        world = [c for c in cidrs if ipaddress.ip_network(c).prefixlen == 0]
        if not world and covers_the_world(cidrs):
            world = cidrs
        if world and not allow_world:
            raise _problem(
                f"{' and '.join(world)} opens SSH to the whole internet; allowed only with allowWorld: true "
                "(better: use your own address range; the dashboard is never opened to the world); got "
                f"{_shown(world)} without allowWorld",
                "..", "adminCidrs",
            )
        return allow_world

    @field_validator("ssh_public_key")
    @classmethod
    def _public_key(cls, key: str) -> str:
        key = key.strip()
        if "PRIVATE KEY" in key:
            # The value is not echoed: it is a secret that must not reach the console or CI logs.
            raise _problem(
                "must be a public key (the contents of the .pub file); got a private key. Never put a private "
                "key in the stack config; give its location in access.sshPrivateKeyPath instead"
            )
        parts = key.split(maxsplit=2)
        shown = _shown(key if len(key) <= 40 else key[:40] + "...")
        if "\n" in key or len(parts) < 2 or parts[0] not in SSH_KEY_TYPES:
            raise _problem(
                "must be one OpenSSH public key line `<type> <base64 key data> [comment]` (the contents of the "
                f".pub file) with type one of {', '.join(SSH_KEY_TYPES)}; got {shown}"
            )
        try:
            blob = base64.b64decode(parts[1], validate=True)
        except binascii.Error:
            raise _problem(f"must be an OpenSSH public key, but its key data is not base64; got {shown}") from None
        named = _ssh_blob_type(blob)
        if named != parts[0]:
            raise _problem(
                f"must be a valid {parts[0]} key, but its key data is "
                f"{'for ' + named if named else 'not an SSH key'}; got {shown}"
            )
        return key


def _ssh_blob_type(blob: bytes) -> str | None:
    """The key type an OpenSSH key blob starts with (a length-prefixed string), or None if it has none."""
    if len(blob) < 4:
        return None
    length = int.from_bytes(blob[:4], "big")
    name = blob[4 : 4 + length]
    if not 0 < length <= 64 or len(name) != length:
        return None
    return name.decode("ascii", errors="replace")


# ------------------------------------------------------------------------------------------------ container
_IMAGE_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_REFERENCE = re.compile(
    # Docker's reference grammar: [host[:port]/]path[:tag][@digest]; a lower-case host is also a valid first
    # path component, so the host needs no pattern of its own beyond the port.
    rf"{_IMAGE_PATH_COMPONENT}(?::[0-9]+)?(?:/{_IMAGE_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?"
)


class ContainerConfig(Section):
    image: str = Field(
        DEFAULT_ROLL_IMAGE,
        description="The training image `[registry/]repository[:tag][@sha256:digest]`, pulled on every node. The "
        "default is ROLL's torch 2.6 / vLLM 0.8.4 image (CUDA 12.4, runs on V100). For speed, mirror it into your own "
        "ACR in the training region.",
    )
    shm_size: str = Field(
        "16g", description="Size of the container's /dev/shm in megabytes or gigabytes, e.g. `16g` or `512m`."
    )
    registry_username: str | None = Field(
        None, description="User for a private registry; the password is the secret `registryPassword`."
    )
    name: str = Field("roll", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$", description="Container name on every node.")

    @field_validator("image")
    @classmethod
    def _image(cls, image: str) -> str:
        if not _IMAGE_REFERENCE.fullmatch(image):
            raise _problem(
                "must be an image reference `[registry/]repository[:tag][@sha256:digest]` in lower case, such as "
                f"`registry.cn-hangzhou.aliyuncs.com/me/roll:v1`; got {_shown(image)}"
            )
        return image

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, size: str) -> str:
        # Docker reads `16G` and `16gb` as `16g`; the canonical form is kept so that shm_size_mb stays simple.
        match = re.fullmatch(r"([1-9][0-9]*)([mMgG])[bB]?", size)
        if not match:
            raise _problem(
                f"must be a whole number of megabytes or gigabytes such as `16g` or `512m`; got {_shown(size)}"
            )
        return match.group(1) + match.group(2).lower()

    @property
    def shm_size_mb(self) -> int:
        """pulumi-docker takes /dev/shm in MB."""
        number, unit = int(self.shm_size[:-1]), self.shm_size[-1]
        return number * 1024 if unit == "g" else number

    @property
    def registry_host(self) -> str:
        first = self.image.split("/", 1)[0]
        is_host = "." in first or ":" in first or first == "localhost"
        return first if "/" in self.image and is_host else "docker.io"


# ------------------------------------------------------------------------------------------------------ ray
class RayConfig(Section):
    gcs_port: int = Field(
        6379, ge=1, le=65535,
        description="Ray GCS port (workers join here). The three Ray ports differ from each other and from 22.",
    )
    dashboard_port: int = Field(8265, ge=1, le=65535, description="Ray dashboard and Jobs API port.")
    client_port: int = Field(10001, ge=1, le=65535, description="Ray Client server port.")
    ready_timeout_seconds: int = Field(
        900, ge=30, le=7200, description="How long the readiness gate waits for all nodes and GPUs to join."
    )
    head_wait_timeout_seconds: int = Field(
        900, ge=10, le=7200,
        description="How long a worker waits for the head's GCS port before its join fails (naming the address).",
    )
    object_store_memory_gb: float | None = Field(
        None, ge=0.1, le=4096,
        description="Ray object store per node in GB (on /dev/shm, so keep it under container.shmSize); "
        "null: Ray's default, 30% of the node's memory.",
    )

    @field_validator("gcs_port", "dashboard_port", "client_port")
    @classmethod
    def _not_ssh(cls, port: int) -> int:
        if port == 22:
            raise _problem("must not be 22, the nodes' SSH port; got 22")
        return port

    @field_validator("client_port")
    @classmethod
    def _distinct(cls, client_port: int, info: ValidationInfo) -> int:
        # clientPort is the last port declared: info.data holds the valid ones before it.
        ports = [
            (key, info.data.get(name) if name != "client_port" else client_port)
            for key, name in zip(RAY_PORT_KEYS, ("gcs_port", "dashboard_port", "client_port"), strict=True)
        ]
        problems: list[tuple[KeyPath, str]] = []
        for index, (key, port) in enumerate(ports):
            clash = next((other for other, used in ports[:index] if port is not None and used == port), None)
            if clash is not None:
                problems.append((
                    ("..", key),
                    f"must be distinct from {clash} (gcsPort, dashboardPort and clientPort are separate "
                    f"listeners); got {port} for both",
                ))
        if problems:
            raise _Problems(*problems)
        return client_port


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
        if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+\.ya?ml", path) or {".", ".."} & set(path.split("/")):
            raise _problem(
                "must be `<dir>/<name>.yaml` inside ROLL's examples/ (no absolute path, no `..`, a directory "
                f"part), e.g. `agentic_demo/agent_val_frozen_lake_single_node_demo.yaml`; got {_shown(path)}"
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
            raise _problem(
                f"must be an absolute path (relative paths land in Ray's temporary working_dir); got {_shown(path)}"
            )
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
    vllm_num_engines: int = Field(
        2, ge=1,
        description="vLLM engines (`--vllm.num_engines`); engines x `vllmTensorParallelSize` must fit the cluster's "
        "GPUs.",
    )
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
        "(`a.b.c: value`), OpenRLHF flags (`actor.num_nodes: 2`). ROLL `device_mapping` values are checked against "
        "the cluster's GPUs (global indices 0 to nodes x GPUs per node - 1).",
    )
    roll: RollConfig = Field(default_factory=RollConfig, description="ROLL settings.")
    verl: VerlConfig = Field(default_factory=VerlConfig, description="verl settings.")
    openrlhf: OpenRlhfConfig = Field(default_factory=OpenRlhfConfig, description="OpenRLHF settings.")
    custom: CustomConfig | None = Field(None, description="Any Ray program; required when framework is `custom`.")

    @field_validator("custom")
    @classmethod
    def _custom_needs_entrypoint(cls, custom: CustomConfig | None, info: ValidationInfo) -> CustomConfig | None:
        if custom is None and info.data.get("framework") == "custom":
            raise _problem(
                "required when framework is `custom`: the shell command submitted as the Ray job; got nothing",
                "entrypoint",
            )
        return custom


# -------------------------------------------------------------------------------------------------- storage
class StorageConfig(Section):
    nas: bool = Field(False, description="A NAS file system mounted at /mnt/shared on every node and container.")
    retain_on_destroy: bool = Field(True, description="`pulumi destroy` keeps the NAS file system and its data.")
    nas_storage_type: Literal["Capacity", "Performance", "Premium"] = Field(
        "Capacity", description="NAS storage class of a standard (General-purpose) NFS file system."
    )


# ---------------------------------------------------------------------------------------------------- whole
class ClusterConfig(Section):
    region: str = Field(
        description="`alicloud:region` of the stack (the provider's standard key), e.g. `cn-hangzhou`."
    )
    nodes: NodesConfig = Field(description="The GPU instances.")
    access: AccessConfig = Field(description="Who may reach the nodes, and with which SSH key.")
    container: ContainerConfig = Field(
        default_factory=ContainerConfig, description="The training container started on every node."
    )
    ray: RayConfig = Field(
        default_factory=RayConfig, description="The Ray cluster formed by the containers."
    )
    training: TrainingConfig = Field(
        default_factory=TrainingConfig, description="The training job submitted to the Ray cluster."
    )
    storage: StorageConfig = Field(
        default_factory=StorageConfig, description="Storage shared by all nodes."
    )

    @field_validator("region")
    @classmethod
    def _region(cls, region: str) -> str:
        if not re.fullmatch(r"[a-z]{2}-[a-z0-9]+(-[a-z0-9]+)*", region):
            raise _problem(f"must be an Alibaba Cloud region id such as `cn-hangzhou`; got {_shown(region)}")
        return region

    @field_validator("nodes")
    @classmethod
    def _zone_in_region(cls, nodes: NodesConfig, info: ValidationInfo) -> NodesConfig:
        region = info.data.get("region")
        if region is not None and nodes.zone != "auto" and not nodes.zone.startswith(region + "-"):
            raise _problem(
                f"must be `auto` or a zone of alicloud:region {region} (such as `{region}-k`); "
                f"got {_shown(nodes.zone)}",
                "zone",
            )
        return nodes

    @field_validator("training")
    @classmethod
    def _training_fits_nodes(cls, training: TrainingConfig, info: ValidationInfo) -> TrainingConfig:
        # A field validator sees `nodes` (declared before `training`) as soon as that section is valid, so these
        # rules are reported together with problems in other sections, not only after those are fixed.
        nodes: NodesConfig | None = info.data.get("nodes")
        per_node = nodes.gpus_per_node if nodes is not None else None
        if nodes is None or per_node is None:
            # No candidate type is in the catalog (or nodes is invalid): the GPU count is known only at deployment.
            return training
        gpus = per_node * nodes.count
        cluster = f"{nodes.count} node{'s' if nodes.count > 1 else ''} x {_gpus(per_node)} = {_gpus(gpus)}"
        problems: list[tuple[KeyPath, str]] = []
        if training.framework == "roll":
            problems += _roll_device_mappings_fit(training.overrides, gpus, cluster, ("overrides",))
        if training.framework == "openrlhf":
            engines, tp = training.openrlhf.vllm_num_engines, training.openrlhf.vllm_tensor_parallel_size
            if engines * tp > gpus:
                problems.append((
                    ("openrlhf", "vllmNumEngines"),
                    f"vllmNumEngines x vllmTensorParallelSize must fit the cluster's {cluster}; got {engines} x {tp} "
                    f"= {_gpus(engines * tp)}",
                ))
        if problems:
            raise _Problems(*problems)
        return training

    @property
    def instance_type_info(self) -> catalog.GpuInstanceType | None:
        return catalog.lookup(self.nodes.instance_types[0])

    @property
    def gpus_per_node(self) -> int:
        """From the catalog; 1 when no candidate type is in it (the live answer at deployment decides)."""
        return self.nodes.gpus_per_node or 1


def _roll_device_mappings_fit(value: Any, gpus: int, cluster: str, path: KeyPath) -> list[tuple[KeyPath, str]]:
    """Every `device_mapping` anywhere in ROLL overrides must name GPUs the cluster has (ROLL's indices are global
    across nodes). A dotted key (`actor_train.device_mapping`) counts as well; null means "no such worker"."""
    problems: list[tuple[KeyPath, str]] = []
    children: list[tuple[int | str, Any]] = []
    if isinstance(value, Mapping):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    for key, child in children:
        here = (*path, key)
        if isinstance(key, str) and key.split(".")[-1] == "device_mapping" and child is not None:
            try:
                indices = parse_device_mapping(child)
            except DeviceMappingError as error:
                problems.append((here, f"{error}; got {_shown(child)}"))
                continue
            if indices and max(indices) >= gpus:
                problems.append((
                    here,
                    f"GPU indices must be within 0..{gpus - 1}, because the cluster has {cluster}; got "
                    f"{_shown(child)}, which uses index {max(indices)}",
                ))
        else:
            problems += _roll_device_mappings_fit(child, gpus, cluster, here)
    return problems


# ---------------------------------------------------------------------------------------------- error format
#
# Every problem is one line `<key path>: <what is allowed>; got <given value>`, with the key path as the user writes
# it (`roll-cluster:nodes.instanceTypes[1]`, `alicloud:region`) and the given value as JSON, the way the stack file
# spells it (`true`, `null`, `"16G"`). Private keys are never echoed.


def _field_at(model: type[BaseModel], name: str) -> FieldInfo | None:
    return next((f for n, f in model.model_fields.items() if (f.alias or n) == name), None)


def _model_at(model: type[BaseModel], loc: KeyPath) -> type[BaseModel] | None:
    """The model class that owns the field at loc (for suggestions on unknown fields)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or isinstance(part, int):
            continue
        field = _field_at(current, part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *typing.get_args(annotation)]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return current


def _field_of(loc: KeyPath) -> FieldInfo | None:
    """The field definition at loc, if loc ends at a field (not inside a list)."""
    if not loc or not isinstance(loc[-1], str):
        return None
    owner = _model_at(ClusterConfig, loc[:-1])
    return _field_at(owner, loc[-1]) if owner else None


def _join(loc: KeyPath, relative: KeyPath) -> KeyPath:
    parts = list(loc)
    for part in relative:
        if part == "..":
            parts.pop()
        else:
            parts.append(part)
    return tuple(parts)


def _format(loc: KeyPath) -> str:
    if loc[:1] == ("region",):
        return "alicloud:region"
    path = PROJECT + ":"
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("" if i == 0 else ".") + part
    return path


def _allowed(item: Any, loc: KeyPath) -> str:
    """What a built-in pydantic check allows, in the stack file's terms."""
    kind, ctx = item["type"], item.get("ctx", {})
    field = _field_of(loc)
    if kind in ("greater_than_equal", "less_than_equal") and field is not None:
        low = next((m.ge for m in field.metadata if isinstance(m, annotated_types.Ge)), None)
        high = next((m.le for m in field.metadata if isinstance(m, annotated_types.Le)), None)
        if low is not None and high is not None:
            return f"must be between {low} and {high}"
    if kind == "literal_error" and field is not None:
        return "must be one of " + ", ".join(_shown(v) for v in typing.get_args(field.annotation))
    if kind == "string_pattern_mismatch":
        example = f" such as {_shown(field.default)}" if field is not None and isinstance(field.default, str) else ""
        return f"must match the regular expression `{ctx.get('pattern')}`{example}"
    simple = {
        "greater_than_equal": f"must be at least {ctx.get('ge')}",
        "less_than_equal": f"must be at most {ctx.get('le')}",
        "greater_than": f"must be greater than {ctx.get('gt')}",
        "int_type": "must be a whole number",
        "int_parsing": "must be a whole number",
        "int_from_float": "must be a whole number",
        "float_type": "must be a number",
        "float_parsing": "must be a number",
        "bool_type": "must be true or false",
        "bool_parsing": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "dict_type": "must be an object with fields",
        "model_type": "must be an object with fields",
        "model_attributes_type": "must be an object with fields",
    }
    if kind == "too_short":
        count = ctx.get("min_length")
        return f"must list at least {count} {'item' if count == 1 else 'items'}"
    if kind in simple:
        return simple[kind]
    message = str(item["msg"])
    return message[0].lower() + message[1:]


def _messages(error: ValidationError) -> list[str]:
    problems: list[str] = []
    for item in error.errors():
        loc: KeyPath = tuple(item["loc"])
        cause = item.get("ctx", {}).get("error")
        if isinstance(cause, _Problems):
            problems += [f"{_format(_join(loc, path))}: {message}" for path, message in cause.problems]
        elif item["type"] == "extra_forbidden":
            owner = _model_at(ClusterConfig, loc[:-1])
            names = [f.alias or n for n, f in owner.model_fields.items()] if owner else []
            if not loc[:-1]:
                names = list(SECTIONS)
            guess = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.5)
            hint = f"; did you mean {guess[0]!r}?" if guess else "."
            problems.append(f"{_format(loc)}: unknown field{hint} Allowed: {', '.join(names)}")
        elif item["type"] == "missing":
            problems.append(f"{_format(loc)}: required; got nothing")
        elif isinstance(cause, ValueError):
            problems.append(f"{_format(loc)}: {cause}; got {_shown(item.get('input'))}")
        else:
            problems.append(f"{_format(loc)}: {_allowed(item, loc)}; got {_shown(item.get('input'))}")
    return problems


def _section_of_field(name: str) -> str | None:
    """The section that has a field of this name, for a key set at the top level by mistake."""
    for section in SECTIONS:
        model = _model_at(ClusterConfig, (section,))
        if model is not None and _field_at(model, name) is not None:
            return section
    return None


def _unknown_key(key: str) -> str:
    allowed = ", ".join([*SECTIONS, *SECRETS])
    section, dot, field = key.partition(".")
    if dot and section in SECTIONS:
        # `pulumi config set roll-cluster:nodes.count 2` without --path makes a key named "nodes.count".
        return (
            f"{PROJECT}:{key}: unknown key; to set {field!r} inside the {section} section use "
            f"`pulumi config set --path '{PROJECT}:{key}' <value>` (without --path the dot is part of the key name)"
        )
    owner = _section_of_field(key)
    if owner is not None:
        return f"{PROJECT}:{key}: unknown key; did you mean '{owner}.{key}'? (fields belong inside their section)"
    guess = difflib.get_close_matches(key, [*SECTIONS, *SECRETS], n=1, cutoff=0.5)
    hint = f"; did you mean {guess[0]!r}?" if guess else "."
    return f"{PROJECT}:{key}: unknown key{hint} Allowed: {allowed}"


def parse_cluster_config(raw: Mapping[str, str | None], region: str | None) -> ClusterConfig:
    """Validate the `roll-cluster:*` values as Pulumi hands them over (structured values are JSON strings).

    `raw` maps the key without the project prefix ("nodes") to its text; None or a missing key means not set.
    Secrets are skipped if present. Raises ConfigError listing every problem, each with its key path.
    """
    problems: list[str] = []
    data: dict[str, Any] = {}
    malformed: set[str] = set()
    for key, text in raw.items():
        if key in SECRETS or text is None:
            continue
        if key not in SECTIONS:
            problems.append(_unknown_key(key))
            continue
        how = (
            f"nest its fields under `{PROJECT}:{key}` in Pulumi.<stack>.yaml, or set one with "
            f"`pulumi config set --path '{PROJECT}:{key}.<field>' <value>`"
        )
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            malformed.add(key)
            problems.append(f"{PROJECT}:{key}: must be an object with fields ({how}); got {_shown(text)}")
            continue
        if not isinstance(value, dict):
            malformed.add(key)
            problems.append(f"{PROJECT}:{key}: must be an object with fields ({how}); got {_shown(value)}")
            continue
        data[key] = value
    if region is None:
        problems.append("alicloud:region: required (pulumi config set alicloud:region cn-hangzhou); got nothing")
    else:
        data["region"] = region
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as error:
        # A section already reported as malformed, or the region reported above, is not "required" again.
        repeated = {"alicloud:region: required; got nothing"} | {
            f"{PROJECT}:{key}: required; got nothing" for key in malformed
        }
        problems += [p for p in _messages(error) if p not in repeated]
    if problems:
        raise ConfigError(problems)
    return config
