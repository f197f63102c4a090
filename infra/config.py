"""The stack configuration: one pydantic model per `roll-cluster:<section>` object of the contract
(../shared/design/stack-config.md), validated as a whole before any resource is registered.

Every error names the key path as the user writes it (`roll-cluster:nodes.count`), what is allowed and what
was given. Unknown fields are errors that suggest the nearest valid name. The README's configuration reference
is generated from these models (devtools/reference.py), so descriptions here are user documentation.
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
from pulumi.errors import RunError
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
from infra.sources.alibaba import catalog, regions

PROJECT = "roll-cluster"
SECTIONS = ("nodes", "access", "container", "ray", "training", "storage")
SECRETS = ("wandbApiKey", "hfToken", "registryPassword")
DEFAULT_ROLL_IMAGE = "roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-24.05-py3-torch260-vllm084"
DEFAULT_ROLL_REPO = "https://github.com/alibaba/ROLL.git"
# v0.3.0, the ref whose configs, launchers and requirements files ../shared/reference/roll.md describes.
DEFAULT_ROLL_REF = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"
DEFAULT_PIP_INDEX = "https://mirrors.aliyun.com/pypi/simple/"
# MindSpeed-RL and the three repositories placed beside it, at the refs of seed 002 (docs/mindspeed-rl.md section 3):
# the seed pins MindSpeed and MindSpeed-LLM to the commits that MindSpeed-RL's 2.0.0 install guide names
# (Ascend/MindSpeed-RL@62e9928:docs/install_guide.md:158,165,171); the seed clones MindSpeed-RL without a ref, so
# the default is the head of that 2.0.0 branch. Upstream moved from gitee to gitcode (master's install guide); the
# archive fallback is the GitHub mirror of the same commit.
DEFAULT_MSRL_REPO = "https://gitcode.com/Ascend/MindSpeed-RL.git"
DEFAULT_MSRL_REF = "62e9928ae89d9570f659b46e816bc55e1191b5e7"  # branch 2.0.0 (2025-05-30)
DEFAULT_MINDSPEED_REPO = "https://gitcode.com/Ascend/MindSpeed.git"
DEFAULT_MINDSPEED_REF = "0dfa0035ec54d9a74b2f6ee2867367df897299df"
DEFAULT_MEGATRON_REPO = "https://github.com/NVIDIA/Megatron-LM.git"
DEFAULT_MEGATRON_REF = "baf94af3c667248865f23df73b9fb8e2395e6fd0"  # core_r0.8.0 (branch and tag point here)
DEFAULT_MINDSPEED_LLM_REPO = "https://gitcode.com/Ascend/MindSpeed-LLM.git"
DEFAULT_MINDSPEED_LLM_REF = "421ef7bcb83fb31844a1efb688cde71705c0526e"
ROLL_PIPELINES = (
    "agentic", "agentic_rollout", "rlvr", "rlvr_rollout", "rlvr_vl", "distill", "distill_vl", "dpo", "sft",
    "onpolicy_distill",
)
WORLD_CIDRS = ("0.0.0.0/0", "::/0")
SSH_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
SECURITY_KEY_TYPES = ("sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")
RAY_PORT_KEYS = ("gcsPort", "dashboardPort", "clientPort")
# Frameworks that run on Ascend NPUs here (MindSpeed-RL joins with its adapter).
ASCEND_FRAMEWORKS = ("mindspeed-rl", "custom")

KeyPath = tuple[int | str, ...]


class ConfigError(RunError, ValueError):
    """Invalid stack configuration; every line names a key path.

    A pulumi RunError: the Pulumi CLI shows its message and no traceback (pulumi/errors.py, RunError: "a clean
    exit rather than the usual verbose unhandled error logic")."""

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
_SSH_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
_INTERFACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,14}")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
_NOT_GIVEN = object()  # a required key of one source only, left out
# Keys of `nodes` that describe ECS instances: refused with source `hosts`, where no instance is created.
ALIBABA_ONLY_NODE_KEYS = (
    "instanceTypes", "zone", "spot", "spotPriceLimit", "systemDiskGb", "dataDiskGb", "osImage", "gpuDriver",
    "driverVersion", "cudaVersion", "cudnnVersion", "internetBandwidthMbps",
)
# Keys of `nodes` that only mean something for existing hosts: refused with source `alibaba`.
HOSTS_ONLY_NODE_KEYS = ("hosts", "hostDefaults", "privateNetwork", "acceleratorsPerNode", "acceleratorModel", "bf16")
# NVIDIA architectures from Ampere on have bf16 (A10, A30, A100, A800, H20, H100, H800, L4, L20, L40, B200, GH200,
# RTX 30xx/40xx/A6000); Volta (V100), Turing (T4) and Pascal (P100) have not.
_NVIDIA_BF16_MODEL = re.compile(
    r"\b(A[0-9]{1,4}|H[0-9]{2,3}|L[0-9]{1,2}S?|B[0-9]{2,3}|GH[0-9]{3}|RTX ?[34]0[0-9]0|RTX A[0-9]{4})\b"
)


def nvidia_model_has_bf16(model: str) -> bool:
    return bool(_NVIDIA_BF16_MODEL.search(model.upper().replace("NVIDIA", "")))


def _check_interface(name: str | None) -> str | None:
    if name is not None and not _INTERFACE.fullmatch(name):
        raise _problem(f"must be a network interface name such as `eth0` or `bond0`; got {_shown(name)}")
    return name


class HostDefaults(Section):
    user: str = Field(
        "root", pattern=_SSH_USER.pattern,
        description="SSH user; a user other than root needs passwordless sudo (`sudo -n`).",
    )
    port: int = Field(22, ge=1, le=65535, description="SSH port.")
    network_interface: str | None = Field(
        None,
        description="The NIC of the private address (e.g. `bond0`): NCCL, Gloo and HCCL bind to it in the "
        "container. Left out: NCCL avoids `docker0` and `lo` by itself (`NCCL_SOCKET_IFNAME=^docker,lo`).",
    )

    @field_validator("network_interface")
    @classmethod
    def _interface(cls, name: str | None) -> str | None:
        return _check_interface(name)


class HostConfig(Section):
    address: str = Field(
        description="How the machine running `pulumi up` reaches the host over SSH: an IP address or a DNS name."
    )
    private_address: str | None = Field(
        None,
        description="The IP address the other hosts reach this one at (Ray, NCCL/HCCL). Left out: `address`, "
        "which must then be an IP address.",
    )
    user: str | None = Field(
        None, pattern=_SSH_USER.pattern, description="SSH user of this host; default `hostDefaults.user`."
    )
    port: int | None = Field(None, ge=1, le=65535, description="SSH port of this host; default `hostDefaults.port`.")
    network_interface: str | None = Field(
        None, description="NIC of this host's private address; default `hostDefaults.networkInterface`."
    )

    @field_validator("network_interface")
    @classmethod
    def _interface(cls, name: str | None) -> str | None:
        return _check_interface(name)

    @field_validator("address")
    @classmethod
    def _address(cls, address: str) -> str:
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(address)
            return address
        if not _HOST_NAME.fullmatch(address):
            raise _problem(f"must be an IP address or a DNS name such as `gpu-1.example.com`; got {_shown(address)}")
        return address

    @field_validator("private_address")
    @classmethod
    def _private(cls, address: str | None, info: ValidationInfo) -> str | None:
        if address is None:
            public = info.data.get("address")
            if public is not None and not _is_ip(public):
                raise _problem(
                    "required when address is a DNS name: Ray binds and advertises an IP address (the one the other "
                    f"hosts reach this one at); got nothing with address {_shown(public)}",
                    "..", "privateAddress",  # a default's error is reported under the field's name, not its key
                )
            return address
        if not _is_ip(address):
            raise _problem(f"must be an IP address such as `10.0.0.11`; got {_shown(address)}")
        return address

    @property
    def private_ip(self) -> str:
        return self.private_address or self.address


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


class NodesConfig(Section):
    source: Literal["alibaba", "hosts"] = Field(
        "alibaba",
        description="Where the nodes come from: `alibaba`, new GPU ECS instances in a VPC of their own "
        "(infra/sources/alibaba); `hosts`, machines you already have, listed in `hosts` and reached over SSH "
        "(infra/sources/hosts; nothing is created in any cloud). With `hosts` the Alibaba-only keys (instanceTypes, "
        "zone, spot, spotPriceLimit, systemDiskGb, dataDiskGb, osImage, gpuDriver, driverVersion, cudaVersion, "
        "cudnnVersion, internetBandwidthMbps) are refused; see README, 'Your own servers'.",
    )
    count: int = Field(
        1, ge=1, le=256,
        description="GPU nodes; rank 0 is the Ray head and runs the training driver. With `hosts`: the number of "
        "hosts (derived from the list when left out; if given it must equal the list's length).",
    )
    instance_types: list[str] = Field(
        default_factory=list,
        description="ECS GPU instance types (e.g. `ecs.gn7i-c8g1.2xlarge`) in order of preference, each listed once "
        "and all with the same number of GPUs and the same bf16 support; every node gets the same type (ROLL needs "
        "identical nodes). The first type with stock in the region (or in `zone`) is taken. Once the cluster exists "
        "it keeps its type, even when that type has no stock left (see `placementGeneration`). Required with source "
        "`alibaba`.",
    )
    zone: str = Field(
        "auto",
        description="A zone id of the region (`cn-hangzhou-k`, `cn-wulanchabu-a`, `ap-southeast-1a`), or `auto` for "
        "a zone with stock for the chosen type. Once the cluster exists the zone is kept (see README, 'sticky "
        "placement').",
    )
    placement_generation: int = Field(
        0, ge=0, le=1000,
        description="Bump it (e.g. 0 -> 1) to move an existing cluster on purpose: the next `pulumi up` places it "
        "afresh by stock and replaces its vSwitch, nodes and NAS mount target (the NAS file system and its data "
        "stay). Unchanged, the cluster keeps its zone and type whatever the stock.",
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
    image: str | None = Field(
        None,
        description="An ECS image id (`m-...`) to boot from instead of `osImage`: an image baked by `bake: true` "
        "(see README, 'Baked images'; every bootstrap step then finds its work done), a custom image with the NVIDIA "
        "driver preinstalled (for `gpuDriver: preinstalled`) or a Marketplace image. It must be in the stack's "
        "region. null: the newest public image matching `osImage`.",
    )
    bake: bool = Field(
        False,
        description="Make an ECS custom image of the head once its bootstrap is done (driver, Docker, NVIDIA "
        "toolkit, the training image with the framework's requirements); its id is the output `bakedImageId`. The "
        "image is kept on `pulumi destroy` (README, 'Baked images', says how to delete it).",
    )
    gpu_driver: Literal["auto-install", "preinstalled"] = Field(
        "auto-install",
        description="`auto-install`: Alibaba's driver auto-install script (`auto_install_v4.0.sh`) runs at first "
        "boot (10-20 min, overlapped with the image pull), adding nvidia-fabricmanager on 8-GPU NVSwitch types "
        "(gn7, gn7e, gn8v, ebmgn8v). `preinstalled`: the image (`image`) already has the NVIDIA driver, and on "
        "NVSwitch types an enabled nvidia-fabricmanager of the same version.",
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
    accelerator: Literal["nvidia", "ascend"] = Field(
        "nvidia",
        description="The accelerators on the nodes: `nvidia` GPUs or `ascend` NPUs (Ascend 910B; `hosts` only, ECS "
        "sells none). Decides the readiness check (`nvidia-smi` / `npu-smi info`), the devices and driver mounts "
        "of the container and the Ray resource (`GPU` / `NPU`); see infra/node/accelerators.py.",
    )
    hosts: list[HostConfig] | None = Field(
        None,
        description="With source `hosts`: your machines, rank 0 (the Ray head) first. Each is reachable over SSH "
        "from the machine running `pulumi up` with `access.sshPrivateKeyPath`, as root or a user with passwordless "
        "sudo. No two hosts share an address; all private addresses lie in one network (see `privateNetwork`).",
    )
    host_defaults: HostDefaults = Field(
        default_factory=lambda: HostDefaults(),
        description="SSH user, port and network interface shared by every host that does not set its own.",
    )
    private_network: str | None = Field(
        None,
        description="With `hosts`: the CIDR (e.g. `10.0.0.0/16`) that holds every host's private address. Left "
        "out: the private addresses must share the head's /24 (IPv4) or /64 (IPv6), which catches a typo or a "
        "public address where a private one was meant; set it when your hosts span a wider network.",
    )
    accelerators_per_node: int | None = Field(
        None, ge=1, le=16,
        description="With `hosts`: GPUs or NPUs on every host (required). `pulumi preview` and `up` first count them "
        "on each host over SSH (`nvidia-smi -L` / `npu-smi info`) and stop, before anything runs, on a host that "
        "lists another number; the readiness step checks again before the container. With `alibaba` the instance "
        "type decides.",
    )
    accelerator_model: str | None = Field(
        None,
        description="With `hosts`: the model, e.g. `NVIDIA A100 80GB` or `Ascend 910B3`, shown in the outputs and "
        "used to tell bf16 support when `bf16` is left out. Default: `NVIDIA GPU` / `Ascend 910B`.",
    )
    bf16: bool | None = Field(
        None,
        description="With `hosts`: whether the accelerators support bf16 (frameworks switch to fp16 without it). "
        "Left out: true for Ascend and for NVIDIA models from Ampere on (A10, A100, H100, L20, ...; from "
        "`acceleratorModel`), false otherwise.",
    )

    @model_validator(mode="before")
    @classmethod
    def _keys_of_the_source(cls, data: Any) -> Any:
        """Each source has keys of its own: a key of the other source is refused (it would be silently unused)."""
        if not isinstance(data, dict):
            return data
        source = data.get("source", "alibaba")
        if source == "hosts":
            wrong = [key for key in ALIBABA_ONLY_NODE_KEYS if key in data]
            if wrong:
                raise _Problems(*(
                    ((key,), "applies to nodes.source alibaba only (it describes ECS instances; with `hosts` "
                     f"nothing is created and your hosts are used as they are): remove it; got {_shown(data[key])}")
                    for key in wrong
                ))
            hosts = data.get("hosts")
            data = {**data, "gpuDriver": "preinstalled"}  # a driver on hosts is checked, never installed
            if "count" not in data and isinstance(hosts, list) and hosts:
                data["count"] = len(hosts)
        elif source == "alibaba":
            if "instanceTypes" not in data:
                data = {**data, "instanceTypes": _NOT_GIVEN}  # reported as missing by _types_given
            wrong = [key for key in HOSTS_ONLY_NODE_KEYS if key in data]
            if wrong:
                raise _Problems(*(
                    ((key,), "applies to nodes.source hosts only (with `alibaba` the instance type decides the "
                     f"accelerators and the VPC the addresses): remove it; got {_shown(data[key])}")
                    for key in wrong
                ))
        return data

    @field_validator("instance_types", mode="before")
    @classmethod
    def _types_given(cls, types: Any) -> Any:
        if types is _NOT_GIVEN:
            raise _problem("required; got nothing")
        return types

    @field_validator("instance_types")
    @classmethod
    def _gpu_types(cls, types: list[str], info: ValidationInfo) -> list[str]:
        if not types and info.data.get("source", "alibaba") == "alibaba":
            raise _problem("must list at least 1 item (ECS GPU instance types such as `ecs.gn7i-c8g1.2xlarge`; "
                           "required with nodes.source alibaba); got []", "..", "instanceTypes")
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
        bf16 = {n: f.bf16 for n in types if (f := catalog.FAMILIES.get(catalog.family_of(n) or "")) is not None}
        if len(set(bf16.values())) > 1:
            detail = ", ".join(f"{n} ({'bf16' if b else 'no bf16'})" for n, b in bf16.items())
            problems.append((
                (),
                "all candidate types must agree on bf16 support (the training dtype is chosen from it, and a "
                f"fallback must not switch a run between bf16 and fp16); got {detail}",
            ))
        if problems:
            raise _Problems(*problems)
        return types

    @field_validator("zone")
    @classmethod
    def _zone(cls, zone: str) -> str:
        # The region's own check (ClusterConfig._zone_in_region) decides; this only catches what is no zone at all.
        if zone != "auto" and not re.fullmatch(r"[a-z]{2,3}-[a-z0-9]+(-[a-z0-9]+)*-?[a-z]", zone):
            raise _problem(
                "must be `auto` or a zone id such as `cn-hangzhou-k` or `ap-southeast-1a`; got " + _shown(zone)
            )
        return zone

    @field_validator("data_disk_gb")
    @classmethod
    def _data_disk(cls, size: int) -> int:
        if size != 0 and not 100 <= size <= 32768:
            raise _problem(f"must be 0 (no data disk) or between 100 and 32768; got {size}")
        return size

    @field_validator("image")
    @classmethod
    def _image_id(cls, image: str | None) -> str | None:
        if image is not None and not re.fullmatch(r"m-[a-z0-9]{8,}", image):
            raise _problem(f"must be an ECS image id such as `m-bp1a2b3c4d5e6f7g8h9i`, or null; got {_shown(image)}")
        return image

    @field_validator("os_image")
    @classmethod
    def _regex(cls, pattern: str) -> str:
        try:
            re.compile(pattern)
        except re.error as error:
            raise _problem(f"must be a valid regular expression ({error}); got {_shown(pattern)}") from None
        return pattern

    @field_validator("image")
    @classmethod
    def _custom_image(cls, image: str | None) -> str | None:
        # ECS image ids of custom images are `m-` and lower-case letters and digits (e.g. m-bp1g7004ksh0oeuc6v1h).
        if image is not None and not re.fullmatch(r"m-[a-z0-9]{8,40}", image):
            raise _problem(
                f"must be an ECS custom image id such as `m-bp1g7004ksh0oeuc6v1h` (the bakedImageId output of a "
                f"stack with nodes.bake: true), or be left out to boot from osImage; got {_shown(image)}"
            )
        return image

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

    @field_validator("accelerator")
    @classmethod
    def _ascend_needs_hosts(cls, accelerator: str, info: ValidationInfo) -> str:
        if accelerator == "ascend" and info.data.get("source") == "alibaba":
            raise _problem("`ascend` needs nodes.source hosts (Alibaba ECS sells no Ascend servers); got \"ascend\" "
                           "with source \"alibaba\"")
        return accelerator

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[HostConfig] | None, info: ValidationInfo) -> list[HostConfig] | None:
        if info.data.get("source") != "hosts":
            return hosts
        if not hosts:
            raise _problem("required with nodes.source hosts: at least one host `{address, privateAddress, user, "
                           f"port}}`, the Ray head first; got {_shown(hosts)}", "..", "hosts")
        problems: list[tuple[KeyPath, str]] = []
        for key in ("address", "privateAddress"):
            seen: dict[str, int] = {}
            for index, host in enumerate(hosts):
                value = host.address if key == "address" else host.private_ip
                where = "address" if key == "address" or host.private_address is None else key
                if value in seen and not any(path == (index, where) for path, _ in problems):
                    problems.append((
                        (index, where),
                        f"must differ from every other host's {key} (one machine is one node; Ray and the "
                        f"readiness gate tell nodes apart by address); got {_shown(value)}, as for "
                        f"nodes.hosts[{seen[value]}]",
                    ))
                else:
                    seen.setdefault(value, index)
        count = info.data.get("count")
        if count is not None and count != len(hosts):
            problems.append(((
                "..", "count"),
                f"must equal the number of nodes.hosts ({len(hosts)}), or be left out; got {count}",
            ))
        if problems:
            raise _Problems(*problems)
        return hosts

    @field_validator("private_network")
    @classmethod
    def _one_network(cls, network: str | None, info: ValidationInfo) -> str | None:
        """All private addresses must share one network: the given CIDR, or the head's /24 (/64 for IPv6)."""
        hosts: list[HostConfig] | None = info.data.get("hosts")
        cidr = None
        if network is not None:
            try:
                cidr = ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise _problem(f"must be a CIDR such as `10.0.0.0/16`; got {_shown(network)}") from None
        if info.data.get("source") != "hosts" or not hosts:
            return network
        head = ipaddress.ip_address(hosts[0].private_ip)
        if cidr is None:
            cidr = ipaddress.ip_network(f"{head}/{24 if head.version == 4 else 64}", strict=False)
            source = f"the head's network {cidr} (nodes.hosts[0]; set nodes.privateNetwork for a wider one)"
        else:
            source = f"nodes.privateNetwork {cidr}"
        problems: list[tuple[KeyPath, str]] = []
        for index, host in enumerate(hosts):
            address = ipaddress.ip_address(host.private_ip)
            if address.version != cidr.version or address not in cidr:
                key = "privateAddress" if host.private_address is not None else "address"
                problems.append((
                    ("..", "hosts", index, key),
                    f"must lie in {source}: every host reaches the others at its private address; got "
                    f"{_shown(host.private_ip)}",
                ))
        if problems:
            raise _Problems(*problems)
        return network

    @field_validator("accelerators_per_node")
    @classmethod
    def _count_needed(cls, count: int | None, info: ValidationInfo) -> int | None:
        if count is None and info.data.get("source") == "hosts":
            raise _problem("required with nodes.source hosts: the GPUs or NPUs every host has (e.g. 8), counted "
                           "on each host before anything runs; got nothing", "..", "acceleratorsPerNode")
        return count

    @property
    def gpus_per_node(self) -> int | None:
        """Accelerators per node: given for hosts; from the catalog for ECS (None when no candidate type is in it:
        the live answer decides)."""
        if self.source == "hosts":
            return self.accelerators_per_node
        return _catalog_gpus(self.instance_types)

    @property
    def model(self) -> str:
        """The accelerator model of hosts."""
        if self.accelerator_model:
            return self.accelerator_model
        return "Ascend 910B" if self.accelerator == "ascend" else "NVIDIA GPU"

    @property
    def has_bf16(self) -> bool:
        """bf16 support of hosts' accelerators (see the `bf16` field)."""
        if self.bf16 is not None:
            return self.bf16
        return self.accelerator == "ascend" or nvidia_model_has_bf16(self.model)

    @property
    def spot_strategy(self) -> str:
        if not self.spot:
            return "NoSpot"
        return "SpotWithPriceLimit" if self.spot_price_limit is not None else "SpotAsPriceGo"


# --------------------------------------------------------------------------------------------------- access
class AccessConfig(Section):
    admin_cidrs: list[str] = Field(
        default_factory=list,
        description="IPv4 CIDRs without host bits (e.g. `203.0.113.0/24`), each listed once: the only sources that "
        "may reach SSH and (in `admin-cidrs` mode) the dashboard. IPv6 CIDRs are refused: the cluster's VPC has no "
        "IPv6, so such a rule would never match. Required with nodes.source `alibaba` (the security group's rules); "
        "refused with `hosts`, whose firewalls are yours.",
    )
    allow_world: bool = Field(
        False,
        description="Must be true when `adminCidrs` covers the whole internet (`0.0.0.0/0`, or CIDRs whose union "
        "covers it). It opens SSH only: the dashboard is never opened to the world.",
    )
    ssh_public_key: str | None = Field(
        None,
        description="OpenSSH public key line (`ssh-ed25519 AAAA... comment`; ed25519, RSA or ECDSA, not a security "
        "key), installed for root on every node through the first-boot user data (ECS key pairs cannot hold "
        "ed25519; RSA and ECDSA keys also get one). Never a private key. Required with nodes.source `alibaba`; "
        "refused with `hosts` (the key must already be in each host's authorized_keys; nothing is installed there).",
    )
    ssh_private_key_path: str = Field(
        "~/.ssh/id_ed25519",
        description="The matching private key on the machine that runs `pulumi up`; used for the SSH steps. A key "
        "with a passphrase, or one only in ssh-agent, must be loaded in the agent (`ssh-add`): the steps run "
        "unattended and cannot ask for a passphrase.",
    )
    dashboard: Literal["admin-cidrs", "tunnel"] = Field(
        "tunnel",
        description="`tunnel` (the default): the dashboard and Jobs API listen on the head's 127.0.0.1 only; reach "
        "them through SSH with the `dashboardTunnel` output. `admin-cidrs` (opt-in): they listen on the head's "
        "address, reachable from `adminCidrs`. Ray's dashboard has no authentication: whoever reaches it can run "
        "code on your cluster and read its secrets (the W&B and Hugging Face tokens in the raylet's environment). "
        "Refused when `adminCidrs` covers the whole internet, even with `allowWorld`. With nodes.source `hosts` "
        "only `tunnel`: no rule of ours guards your hosts.",
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
    def _public_key(cls, key: str | None) -> str | None:
        if key is None:
            return None
        key = key.strip()
        if "PRIVATE KEY" in key:
            # The value is not echoed: it is a secret that must not reach the console or CI logs.
            raise _problem(
                "must be a public key (the contents of the .pub file); got a private key. Never put a private "
                "key in the stack config; give its location in access.sshPrivateKeyPath instead"
            )
        parts = key.split(maxsplit=2)
        shown = _shown(key if len(key) <= 40 else key[:40] + "...")
        if len(parts) >= 2 and parts[0] in SECURITY_KEY_TYPES:
            raise _problem(
                f"must not be a security-key type ({parts[0]}): it needs a touch of the token for every SSH "
                "connection, and a deployment opens dozens unattended (pulumi-command cannot use it either). Use "
                "an ed25519 key (`ssh-keygen -t ed25519`; a passphrase is fine with ssh-agent)"
            )
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


# ACR VPC endpoints (infra/image_path.py has the sources): Personal Edition, old and new, and Enterprise Edition.
_ACR_VPC_HOSTS = (
    re.compile(r"registry-vpc\.(?P<region>[a-z0-9-]+)\.aliyuncs\.com"),
    re.compile(r"crpi-[a-z0-9]+-vpc\.(?P<region>[a-z0-9-]+)\.personal\.cr\.aliyuncs\.com"),
    re.compile(r"[a-z0-9-]+-registry-vpc\.(?P<region>[a-z0-9-]+)\.cr\.aliyuncs\.com"),
)


def acr_vpc_region(host: str) -> str | None:
    """The region of an ACR VPC endpoint host, or None when the host is not one."""
    for pattern in _ACR_VPC_HOSTS:
        match = pattern.fullmatch(host)
        if match:
            return match.group("region")
    return None


class ContainerConfig(Section):
    image: str = Field(
        DEFAULT_ROLL_IMAGE,
        description="The training image `[registry/]repository[:tag][@sha256:digest]`, pulled on every node. The "
        "default is ROLL's torch 2.6 / vLLM 0.8.4 image (CUDA 12.4, runs on V100). For speed, mirror it into your own "
        "ACR in the training region.",
    )
    shm_size: str = Field(
        "16g",
        description="Size of /dev/shm in megabytes or gigabytes, e.g. `16g` or `512m`. The container shares the "
        "host's IPC namespace (NCCL and Ray need it), where Docker ignores a container shm size, so this sizes the "
        "host's /dev/shm (remounted, and kept in /etc/fstab). Ray's object store lives there.",
    )
    registry_username: str | None = Field(
        None, description="User for a private registry; the password is the secret `registryPassword`."
    )
    name: str = Field("roll", pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$", description="Container name on every node.")
    image_size_gb: float | None = Field(
        None, gt=0, le=1000,
        description="Compressed size of the training image in GB, for the plan's pull-time estimate; null: the "
        "known size of the default images (infra/image_path.py), else 20.",
    )
    registry_mirror: str | None = Field(
        None,
        description="A Docker Hub mirror (`host[:port][/path]`, e.g. your ACR mirror or `docker.m.daocloud.io`) "
        "the nodes pull Docker Hub images through: `verlai/verl:tag` is pulled as `<mirror>/verlai/verl:tag` "
        "(official images as `<mirror>/library/<name>`). Images of other registries are pulled as written. "
        "Required in mainland China regions (`cn-*` but `cn-hongkong`) for a Docker Hub image, which is not "
        "reachable from there.",
    )

    @field_validator("registry_mirror")
    @classmethod
    def _mirror(cls, mirror: str | None) -> str | None:
        if mirror is None:
            return None
        host_path = mirror.removeprefix("https://").rstrip("/")
        if not re.fullmatch(rf"[a-z0-9.-]+(?::[0-9]+)?(?:/{_IMAGE_PATH_COMPONENT})*", host_path) or "." not in (
            host_path.split("/", 1)[0]
        ):
            raise _problem(
                "must be a registry host with an optional path, such as `docker.m.daocloud.io` or "
                f"`registry.cn-hangzhou.aliyuncs.com/my-mirror`; got {_shown(mirror)}"
            )
        return host_path
    privileged: bool = Field(
        False,
        description="Run the container with `--privileged` (all host devices, no confinement). Off by default: the "
        "accelerators' devices and driver files are passed one by one (infra/node/accelerators.py).",
    )

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
    def from_docker_hub(self) -> bool:
        first = self.image.split("/", 1)[0]
        is_host = "." in first or ":" in first or first == "localhost"
        return not ("/" in self.image and is_host) or first in ("docker.io", "index.docker.io")

    @property
    def pull_image(self) -> str:
        """The reference the nodes pull: the image itself, or a Docker Hub image through `registryMirror`."""
        if self.registry_mirror is None or not self.from_docker_hub:
            return self.image
        path = self.image
        first = path.split("/", 1)[0]
        if first in ("docker.io", "index.docker.io"):
            path = path.split("/", 1)[1]
        if "/" not in path.split("@", 1)[0].split(":", 1)[0]:
            path = "library/" + path  # an official image: Docker Hub's implicit namespace
        return f"{self.registry_mirror}/{path}"

    @property
    def registry_host(self) -> str:
        """The registry the nodes log in to and pull from (after the mirror, if any)."""
        image = self.pull_image
        first = image.split("/", 1)[0]
        is_host = "." in first or ":" in first or first == "localhost"
        return first if "/" in image and is_host else "docker.io"


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
        description="Ray object store per node in GB; it lives in /dev/shm, so it must fit in container.shmSize "
        "(checked). null: Ray's default, 30% of the node's memory.",
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
    checkout: str | None = Field(
        None,
        description="A local ROLL checkout at `ref` on the machine that runs `pulumi up` (also the `ROLL_CHECKOUT` "
        "environment variable): the base config and its Hydra defaults are read from its `examples/`. Default: those "
        "files of `ref` fetched from GitHub and cached under `~/.cache/roll-cluster/roll/<ref>/`.",
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
    command: str = Field(
        description="Command that serves the reward model in the container on the head (`{port}` is replaced). "
        "It runs with `CUDA_VISIBLE_DEVICES` set to the head's last `gpus` GPUs."
    )
    port: int = Field(
        5000, ge=1024, le=65535,
        description="Port of the reward server. The job gets its URL as "
        "`http://${ROLL_CLUSTER_HEAD_IP}:<port>/get_reward` (the vLLM engines post to it from every node); the job "
        "step sets `ROLL_CLUSTER_HEAD_IP` to the head's private IP, so the configuration is known before the head "
        "exists.",
    )
    gpus: int = Field(
        1, ge=1,
        description="GPUs of the head the server uses (its last ones, given to it as `CUDA_VISIBLE_DEVICES`; "
        "`serve_rm` spreads the model over all it sees). Without `train.colocate_all` Ray on the head leaves them "
        "out (it starts with the other GPUs only), and the roles must fit the GPUs Ray has; with it they share GPUs "
        "with the colocated roles, so `vllm.gpu_memory_utilization` defaults to 0.5 (upstream's colocated example) "
        "and may not be higher.",
    )
    health_timeout_seconds: int = Field(
        900, ge=10, le=7200, description="How long to wait for the server to answer before failing."
    )


# What upstream's own image adds to nvcr.io/nvidia/pytorch:25.11-py3 at v0.10.2 (dockerfile/Dockerfile): the
# packages that conflict with OpenRLHF's pins are removed, then vLLM and a prebuilt flash-attn wheel go in.
OPENRLHF_UNINSTALL = ["xgboost", "transformer_engine", "flash_attn", "pynvml", "opencv-python-headless"]
OPENRLHF_PREINSTALL = [
    "vllm==0.19.1",
    "https://github.com/mjun0812/flash-attention-prebuild-wheels/releases/download/v0.7.16/"
    "flash_attn-2.8.3+cu130torch2.10-cp312-cp312-linux_x86_64.whl",
]


class OpenRlhfConfig(Section):
    repo: str = Field("https://github.com/OpenRLHF/OpenRLHF.git", description="Git URL of OpenRLHF.")
    ref: str = Field(
        "v0.10.2",
        description="Tag or commit of OpenRLHF, checked out on every node (the job and the reward server run "
        "from it, as upstream's README runs from its checkout); keep it at the version of `package`.",
    )
    archive_url: str | None = Field(
        None, description="Tarball of the same ref, used when GitHub is unreachable. Default: GitHub's archive."
    )
    package: str = Field(
        "openrlhf[vllm]==0.10.2",
        description="pip requirement installed in the container on every node (0.10.2 is the last release on "
        "Ray 2.48.0 and takes the dotted flag names).",
    )
    uninstall_packages: list[str] = Field(
        default_factory=lambda: list(OPENRLHF_UNINSTALL),
        description="Packages removed from the image first, as upstream's dockerfile does at v0.10.2 (they "
        "conflict with OpenRLHF's pins).",
    )
    preinstall_packages: list[str] = Field(
        default_factory=lambda: list(OPENRLHF_PREINSTALL),
        description="pip requirements installed with `package`, as upstream's dockerfile does at v0.10.2: the "
        "vLLM pin and a prebuilt flash-attn wheel for the NGC 25.11 image (Python 3.12, CUDA 13, torch 2.10), so "
        "that nothing compiles on the nodes. Change them with the image.",
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
    entrypoint: str = Field(
        description="Shell command submitted as a Ray job, run on the head in the container. The job's "
        "environment names its checkpoint directory (`ROLL_CLUSTER_CHECKPOINT_DIR`, on the shared storage when "
        "there is some), whether to resume from it (`ROLL_CLUSTER_RESUME`, 1 or 0, from `training.resume`) and "
        "the model source (`ROLL_CLUSTER_MODEL_SOURCE`, plus `HF_ENDPOINT` for `hf-mirror`)."
    )
    working_dir: str = Field("/workspace", description="Directory (in the container) the entrypoint runs from.")


def _absolute_path(path: str) -> str:
    if not path.startswith("/") or "\n" in path:
        raise _problem(
            "must be an absolute path in the container, the same on every node (MindSpeed-RL's workers resolve "
            f"relative paths against the directory Ray was started in, not the code directory); got {_shown(path)}"
        )
    return path


class _CodePin(Section):
    """One repository at one ref; the subclasses only differ in their defaults."""

    repo: str
    ref: str
    archive_url: str | None = Field(
        None,
        description="Tarball of the same ref, used when `git fetch` fails. Default: GitHub's archive of `ref` for a "
        "GitHub repo, the GitHub mirror (github.com/Ascend/...) for the Ascend repos on gitcode.",
    )


class MindSpeedPin(_CodePin):
    repo: str = Field(DEFAULT_MINDSPEED_REPO, description="Git URL of MindSpeed.")
    ref: str = Field(DEFAULT_MINDSPEED_REF, description="Commit (or tag) of MindSpeed; its `mindspeed/` is placed.")


class MegatronPin(_CodePin):
    repo: str = Field(DEFAULT_MEGATRON_REPO, description="Git URL of Megatron-LM.")
    ref: str = Field(
        DEFAULT_MEGATRON_REF, description="Commit (or tag) of Megatron-LM, core_r0.8.0; its `megatron/` is placed."
    )


class MindSpeedLlmPin(_CodePin):
    repo: str = Field(DEFAULT_MINDSPEED_LLM_REPO, description="Git URL of MindSpeed-LLM.")
    ref: str = Field(
        DEFAULT_MINDSPEED_LLM_REF, description="Commit (or tag) of MindSpeed-LLM; its `mindspeed_llm/` is placed."
    )


class MindSpeedRlConfig(Section):
    repo: str = Field(DEFAULT_MSRL_REPO, description="Git URL of MindSpeed-RL.")
    ref: str = Field(DEFAULT_MSRL_REF, description="Commit (or tag) of MindSpeed-RL; default: the 2.0.0 release.")
    archive_url: str | None = Field(
        None, description="Tarball of the same ref, used when `git fetch` fails; default: the GitHub mirror's archive."
    )
    mindspeed: MindSpeedPin = Field(default_factory=MindSpeedPin, description="MindSpeed, placed beside MindSpeed-RL.")
    megatron: MegatronPin = Field(default_factory=MegatronPin, description="Megatron-LM, placed beside MindSpeed-RL.")
    mindspeed_llm: MindSpeedLlmPin = Field(
        default_factory=MindSpeedLlmPin, description="MindSpeed-LLM, placed beside MindSpeed-RL."
    )
    code_dir: str = Field(
        "/workspace/MindSpeed-RL",
        description="MindSpeed-RL's directory in the container, the same on every node; `mindspeed/`, `megatron/` "
        "and `mindspeed_llm/` are copied into it.",
    )
    image_has_code: bool = Field(
        False,
        description="The image already holds the placed code and its requirements in `codeDir` (an image committed "
        "after the install, as seed 002 does): nothing is fetched or installed, and the head checks the four "
        "directories before submitting.",
    )
    example_config: str = Field(
        "grpo_qwen25_7b_A3",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
        description="Hydra config name under MindSpeed-RL's `configs/`, without `.yaml` (`--config-name`); the job "
        "starts from it, then the cluster's values and `training.overrides` (Hydra keys such as "
        "`actor_config.tensor_model_parallel_size: 4`) are applied.",
    )
    tokenizer_path: str = Field(
        description="Hugging Face model directory (the tokenizer) on every node: "
        "`megatron_training.tokenizer_name_or_path`."
    )
    data_path: str = Field(
        description="Prefix of the preprocessed dataset on every node (MindSpeed-RL's preprocess_data output, e.g. "
        "`/data/dataset/deepscaler/data`): `megatron_training.data_path`."
    )
    load_path: str = Field(
        description="Megatron-mcore weights converted with the actor's TP/PP, on every node: `actor_config.load`."
    )
    save_path: str | None = Field(
        None,
        description="Checkpoint directory: `actor_config.save`. Default: "
        "`<shared or data dir>/mindspeed-rl/<stack>/ckpt`.",
    )
    antlr_requirement: str = Field(
        "antlr4-python3-runtime==4.7.2",
        description="Installed with `--no-deps` after the requirements, as MindSpeed-RL 2.0.0's install guide does.",
    )
    pip_index_url: str = Field(DEFAULT_PIP_INDEX, description="pip index used on the nodes.")

    @field_validator("code_dir", "tokenizer_path", "data_path", "load_path", "save_path")
    @classmethod
    def _absolute(cls, path: str | None) -> str | None:
        return None if path is None else _absolute_path(path)

    @field_validator("example_config")
    @classmethod
    def _config_name(cls, name: str) -> str:
        if name.endswith((".yaml", ".yml")):
            raise _problem(
                f"is a Hydra config name, without the extension (MindSpeed-RL's examples say so); got {_shown(name)}"
            )
        return name


MODEL_SOURCES = ("huggingface", "modelscope", "hf-mirror")
DEFAULT_HF_MIRROR = "https://hf-mirror.com"


def is_mainland_region(region: str) -> bool:
    """Alibaba Cloud regions in mainland China, where Docker Hub and the Hugging Face Hub are not reachable."""
    return region.startswith("cn-") and region != "cn-hongkong"


class TrainingConfig(Section):
    framework: Literal["roll", "verl", "openrlhf", "mindspeed-rl", "custom"] = Field(
        "roll", description="What the job runs (`mindspeed-rl`: MindSpeed-RL GRPO on Ascend NPUs)."
    )
    auto_start: bool = Field(True, description="Submit the job during `pulumi up`; false prepares everything.")
    resume: bool | None = Field(
        None,
        description="Whether a job whose configuration changed resumes from the last checkpoint in its "
        "checkpoint directory (`<shared storage>/checkpoints/<stack>/<job>`) or starts fresh in a new one. "
        "null: the framework's default (ROLL: true, `resume_from_checkpoint: true`; verl: true, `trainer.resume_mode: "
        "auto`; OpenRLHF: true, "
        "`--ckpt.load_enable`; custom: true, given as `ROLL_CLUSTER_RESUME`). Checkpoints are per GPU count "
        "for verl and OpenRLHF (their sharded checkpoints cannot be loaded by another world size), so a resized "
        "cluster starts in its own directory.",
    )
    model_source: Literal[MODEL_SOURCES] | None = Field(  # type: ignore[valid-type]
        None,
        description="Where models and datasets are downloaded from: `huggingface` (the Hub), `hf-mirror` "
        "(a Hub mirror at `hfEndpoint`, given to the job as `HF_ENDPOINT`) or `modelscope` (verl: "
        "`VERL_USE_MODELSCOPE=True`; OpenRLHF: `--use_ms`; custom: `ROLL_CLUSTER_MODEL_SOURCE`; the image needs "
        "the `modelscope` package and model ids must be ModelScope's, and dataset downloads through the Hub's "
        "`datasets` library may still need the Hub, so `hf-mirror` is the default). null: `hf-mirror` in "
        "mainland China regions (`cn-*` but `cn-hongkong`), where the Hub is not reachable, else `huggingface`.",
    )
    hf_endpoint: str = Field(
        DEFAULT_HF_MIRROR,
        pattern=r"^https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._/-]*)?$",
        description="The Hugging Face mirror used with `modelSource: hf-mirror` (`HF_ENDPOINT`).",
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Deep-merged last into the framework's configuration: ROLL YAML keys, verl Hydra keys "
        "(`a.b.c: value`), OpenRLHF flags (`actor.num_nodes: 2`), MindSpeed-RL Hydra keys "
        "(`rl_config.n_samples_per_prompt: 8`). ROLL `device_mapping` values are checked against "
        "the cluster's GPUs (global indices 0 to nodes x GPUs per node - 1).",
    )
    roll: RollConfig = Field(default_factory=RollConfig, description="ROLL settings.")
    verl: VerlConfig = Field(default_factory=VerlConfig, description="verl settings.")
    openrlhf: OpenRlhfConfig = Field(default_factory=OpenRlhfConfig, description="OpenRLHF settings.")
    custom: CustomConfig | None = Field(None, description="Any Ray program; required when framework is `custom`.")
    mindspeed_rl: MindSpeedRlConfig | None = Field(
        None, description="MindSpeed-RL settings; required when framework is `mindspeed-rl`."
    )

    @field_validator("custom")
    @classmethod
    def _custom_needs_entrypoint(cls, custom: CustomConfig | None, info: ValidationInfo) -> CustomConfig | None:
        if custom is None and info.data.get("framework") == "custom":
            raise _problem(
                "required when framework is `custom`: the shell command submitted as the Ray job; got nothing",
                "entrypoint",
            )
        return custom

    @field_validator("mindspeed_rl")
    @classmethod
    def _mindspeed_rl_needs_paths(
        cls, settings: MindSpeedRlConfig | None, info: ValidationInfo
    ) -> MindSpeedRlConfig | None:
        if settings is None and info.data.get("framework") == "mindspeed-rl":
            raise _problem(
                "required when framework is `mindspeed-rl`: at least tokenizerPath, dataPath and loadPath (absolute "
                "paths on every node); got nothing",
                # An unset field is reported under its Python name: name the key as the user writes it.
                "..",
                "mindspeedRl",
            )
        return settings


# -------------------------------------------------------------------------------------------------- storage
class StorageConfig(Section):
    nas: bool = Field(
        False,
        description="A NAS file system mounted at /mnt/shared on every node and container (nodes.source `alibaba`).",
    )
    nfs_server: str | None = Field(
        None,
        description="With nodes.source `hosts`: an existing NFS server (IP or DNS name) whose `nfsPath` export is "
        "mounted at /mnt/shared on every host (fstab, `nofail`) and in every container.",
    )
    nfs_path: str = Field("/", description="The exported path on `nfsServer`.")
    shared_host_path: str | None = Field(
        None,
        description="With nodes.source `hosts`: a directory that already exists at this path on every host and is "
        "shared between them (your NFS/Lustre/CephFS mount); bind-mounted at /mnt/shared in every container. Not "
        "checked for being shared: the program only sees each host on its own.",
    )
    retain_on_destroy: bool = Field(True, description="`pulumi destroy` keeps the NAS file system and its data.")
    nas_storage_type: Literal["Capacity", "Performance", "Premium"] = Field(
        "Capacity", description="NAS storage class of a standard (General-purpose) NFS file system."
    )
    existing_file_system_id: str | None = Field(
        None,
        description="Id of a kept General-purpose NAS file system of the region (e.g. the `nasFileSystemId` output "
        "of an earlier deployment) to attach instead of creating one: its checkpoints are there again after "
        "`pulumi destroy` and `pulumi up`. Implies `nas: true`; the program then never deletes it.",
    )

    @model_validator(mode="before")
    @classmethod
    def _existing_implies_nas(cls, data: Any) -> Any:
        # An explicit `nas: false` is kept so that the contradiction is reported below.
        if isinstance(data, dict) and data.get("existingFileSystemId") is not None and "nas" not in data:
            data = {**data, "nas": True}
        return data

    @field_validator("existing_file_system_id")
    @classmethod
    def _file_system_id(cls, fs_id: str | None, info: ValidationInfo) -> str | None:
        if fs_id is None:
            return None
        # General-purpose NAS ids are lowercase hex-like (`31a8e4****`, CreateMountTarget's FileSystemId); Extreme
        # (`extreme-...`) and CPFS (`cpfs-...`) file systems are other products this program does not mount.
        if not re.fullmatch(r"[0-9a-z]{6,32}", fs_id):
            raise _problem(
                "must be the id of a General-purpose NAS file system, such as `31a8e4b0c2` (not `extreme-...` or "
                f"`cpfs-...`); got {_shown(fs_id)}"
            )
        if info.data.get("nas") is False:
            raise _problem(
                f"must not be set with nas: false (leave nas out or set it to true); got {_shown(fs_id)} with "
                "nas false",
                "..", "nas",
            )
        return fs_id

    @field_validator("nfs_server")
    @classmethod
    def _server(cls, server: str | None) -> str | None:
        if server is not None and not (_is_ip(server) or _HOST_NAME.fullmatch(server)):
            raise _problem(f"must be an IP address or a DNS name such as `nfs.example.com`; got {_shown(server)}")
        return server

    @field_validator("nfs_path", "shared_host_path")
    @classmethod
    def _path(cls, path: str | None) -> str | None:
        if (path is not None and not re.fullmatch(r"/[A-Za-z0-9._/-]*", path)) or (path is not None and ".." in path):
            raise _problem(f"must be an absolute path of letters, digits and ._/- (no `..`); got {_shown(path)}")
        return path

    @property
    def shared(self) -> bool:
        """Whether /mnt/shared is shared storage on every node (NAS, an NFS server or a shared host path)."""
        return self.nas or self.nfs_server is not None or self.shared_host_path is not None


# ---------------------------------------------------------------------------------------------------- whole
class ClusterConfig(Section):
    region: str | None = Field(
        None,
        description="`alicloud:region` of the stack (the provider's standard key), e.g. `cn-hangzhou`. Required with "
        "nodes.source `alibaba`; ignored with `hosts` (no Alibaba resource is created).",
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
    def _region(cls, region: str | None) -> str | None:
        if region is None:  # optional with nodes.source hosts
            return None
        if not regions.is_region(region):
            close = difflib.get_close_matches(region, regions.REGIONS, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise _problem(
                f"unknown region{hint}: must be an Alibaba Cloud region id such as `cn-hangzhou`, one of "
                f"{', '.join(regions.REGIONS)}; got {_shown(region)}"
            )
        return region

    @field_validator("nodes")
    @classmethod
    def _zone_in_region(cls, nodes: NodesConfig, info: ValidationInfo) -> NodesConfig:
        region = info.data.get("region")
        if region is not None and nodes.zone != "auto" and not regions.is_zone_of(nodes.zone, region):
            raise _problem(
                f"must be `auto` or a zone of alicloud:region {region} (such as `{regions.example_zone(region)}`); "
                f"got {_shown(nodes.zone)}",
                "zone",
            )
        return nodes

    @field_validator("container")
    @classmethod
    def _vpc_registry_in_region(cls, container: ContainerConfig, info: ValidationInfo) -> ContainerConfig:
        # A registry's VPC endpoint answers only inside its own region: from another region the pull would hang.
        region, vpc_region = info.data.get("region"), acr_vpc_region(container.registry_host)
        if region is not None and vpc_region is not None and vpc_region != region:
            raise _problem(
                f"uses the VPC endpoint of a registry in {vpc_region}, which nodes in alicloud:region {region} cannot "
                f"reach; use the registry's public endpoint, or copy the image into your registry in {region} "
                f"(registry-vpc.{region}.aliyuncs.com/...); got {_shown(container.image)}",
                "image",
            )
        nodes: NodesConfig | None = info.data.get("nodes")
        if nodes is not None and nodes.bake and "@" in container.image:
            # bake-prep commits the framework's requirements into the local tag of the image; a digest is no tag.
            raise _problem(
                "must be a tag (`repository:tag`), not a digest, with nodes.bake: true (the baked image keeps the "
                f"training image under its tag); got {_shown(container.image)}",
                "image",
            )
        return container

    @field_validator("container")
    @classmethod
    def _docker_hub_reachable(cls, container: ContainerConfig, info: ValidationInfo) -> ContainerConfig:
        region = info.data.get("region")
        mainland = region is not None and is_mainland_region(region)
        if mainland and container.from_docker_hub and container.registry_mirror is None:
            raise _problem(
                f"must not be a Docker Hub image in {region} without container.registryMirror: Docker Hub is not "
                "reachable from mainland China regions. Set container.registryMirror to a Docker Hub mirror (e.g. "
                "`docker.m.daocloud.io`), or push the image to your own ACR in the region and name that; got "
                + _shown(container.image),
                "image",
            )
        return container

    @field_validator("ray")
    @classmethod
    def _object_store_fits_shm(cls, ray: RayConfig, info: ValidationInfo) -> RayConfig:
        # `container` is declared before `ray`: info.data holds it when it is valid. Ray puts its object store in
        # /dev/shm; one larger than /dev/shm falls back to disk (slow) or fails, so it is refused here.
        container: ContainerConfig | None = info.data.get("container")
        store = ray.object_store_memory_gb
        if container is not None and store is not None and store * 1024 > container.shm_size_mb:
            raise _problem(
                f"must fit in /dev/shm, which container.shmSize makes {container.shm_size} (Ray's object store "
                f"lives there); got {_shown(store)} GB. Lower it, or raise container.shmSize",
                "objectStoreMemoryGb",
            )
        return ray

    @field_validator("access")
    @classmethod
    def _access_for_source(cls, access: AccessConfig, info: ValidationInfo) -> AccessConfig:
        nodes: NodesConfig | None = info.data.get("nodes")
        if nodes is None:
            return access
        problems: list[tuple[KeyPath, str]] = []
        if nodes.source == "alibaba":
            if not access.admin_cidrs:
                given = "[]" if "admin_cidrs" in access.model_fields_set else "nothing"
                problems.append((("adminCidrs",), "required with nodes.source alibaba: must list at least 1 item, "
                                 f"a CIDR that may reach SSH such as `203.0.113.7/32`; got {given}"))
            if access.ssh_public_key is None:
                problems.append((("sshPublicKey",), "required with nodes.source alibaba: the OpenSSH public key "
                                 "installed on the nodes (the contents of your .pub file); got nothing"))
        else:
            for name, key in (("admin_cidrs", "adminCidrs"), ("allow_world", "allowWorld"),
                              ("ssh_public_key", "sshPublicKey")):
                if name in access.model_fields_set:
                    problems.append(((key,), "applies to nodes.source alibaba only (with `hosts` no firewall rule "
                                     "or key is created: your hosts' own firewalls and authorized_keys apply): "
                                     "remove it"))
            if access.dashboard == "admin-cidrs":
                problems.append((("dashboard",), "must be \"tunnel\" with nodes.source hosts: the Ray dashboard "
                                 "runs any code it is sent, and no rule of this program guards your hosts (use the "
                                 "dashboardTunnel output); got \"admin-cidrs\""))
        if problems:
            raise _Problems(*problems)
        return access

    @model_validator(mode="before")
    @classmethod
    def _hosts_default_to_the_tunnel(cls, data: Any) -> Any:
        # With hosts the dashboard default is the tunnel (see access.dashboard); an explicit value is checked above.
        if not isinstance(data, dict):
            return data
        nodes, access = data.get("nodes"), data.get("access")
        on_hosts = isinstance(nodes, dict) and nodes.get("source") == "hosts"
        if on_hosts and isinstance(access, dict) and "dashboard" not in access:
            data = {**data, "access": {**access, "dashboard": "tunnel"}}
        return data

    @field_validator("training")
    @classmethod
    def _training_fits_nodes(cls, training: TrainingConfig, info: ValidationInfo) -> TrainingConfig:
        # A field validator sees `nodes` (declared before `training`) as soon as that section is valid, so these
        # rules are reported together with problems in other sections, not only after those are fixed.
        nodes: NodesConfig | None = info.data.get("nodes")
        if nodes is not None and nodes.accelerator == "ascend" and training.framework not in ASCEND_FRAMEWORKS:
            raise _problem(
                f"must be one of {', '.join(map(_shown, ASCEND_FRAMEWORKS))} with nodes.accelerator ascend (the "
                "other frameworks' images and settings are built for CUDA here); got "
                f"{_shown(training.framework)}",
                "framework",
            )
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

    @field_validator("storage")
    @classmethod
    def _storage_for_source(cls, storage: StorageConfig, info: ValidationInfo) -> StorageConfig:
        nodes: NodesConfig | None = info.data.get("nodes")
        problems: list[tuple[KeyPath, str]] = []
        if nodes is not None and nodes.source == "hosts":
            for name, key in (("nas", "nas"), ("nas_storage_type", "nasStorageType"),
                              ("retain_on_destroy", "retainOnDestroy")):
                if name in storage.model_fields_set:
                    problems.append(((key,), "applies to nodes.source alibaba only (a NAS file system in the "
                                     "cluster's VPC); with `hosts` use nfsServer or sharedHostPath: remove it"))
        elif nodes is not None:
            for name, key in (("nfs_server", "nfsServer"), ("nfs_path", "nfsPath"),
                              ("shared_host_path", "sharedHostPath")):
                if name in storage.model_fields_set:
                    problems.append(((key,), "applies to nodes.source hosts only (with `alibaba` use nas: true): "
                                     "remove it"))
        if storage.nfs_server is not None and storage.shared_host_path is not None:
            problems.append((("sharedHostPath",), "must not be set together with nfsServer: /mnt/shared is either "
                             "the NFS export or your shared directory; got both"))
        if "nfs_path" in storage.model_fields_set and storage.nfs_server is None and not problems:
            problems.append((("nfsPath",), "needs nfsServer (the server that exports it); got no nfsServer"))
        if problems:
            raise _Problems(*problems)
        return storage

    @property
    def model_source(self) -> str:
        """training.modelSource, or the region's default."""
        if self.training.model_source is not None:
            return str(self.training.model_source)
        return "hf-mirror" if self.region is not None and is_mainland_region(self.region) else "huggingface"

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


def _literal_values(annotation: Any) -> list[Any]:
    """The values a Literal field allows, also inside `Literal[...] | None` (then null too)."""
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    values: list[Any] = []
    for arg in typing.get_args(annotation):
        values += [None] if arg is type(None) else _literal_values(arg)
    return values


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
        return "must be one of " + ", ".join(_shown(v) for v in _literal_values(field.annotation))
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
    nodes = data.get("nodes")
    on_hosts = isinstance(nodes, dict) and nodes.get("source") == "hosts"
    if region is None and not on_hosts:
        problems.append("alicloud:region: required (pulumi config set alicloud:region cn-hangzhou); got nothing")
    elif region is not None and not on_hosts:
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
