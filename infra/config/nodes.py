"""`roll-cluster:nodes`: where the machines come from (ECS instances or your own hosts) and what they carry."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from infra import sources
from infra.config.base import KeyPath, Section, _gpus, _problem, _Problems, _shown
from infra.config.hosts import HostConfig, HostDefaults
from infra.config.values import SSH_USER
from infra.sources.alibaba import catalog
from infra.sources.base import Capabilities

_SSH_USER = SSH_USER
# Public image names of other systems (ECS DescribeImages ImageName): an osImage pattern that matches them selects
# whatever image is newest, not a supported Linux.
# Names of the supported public images (Alibaba Cloud Linux 3, Ubuntu 22.04): osImage must select one of them.
_SUPPORTED_OS_IMAGES = (
    "aliyun_3_x64_20G_alibase_20240819.vhd", "aliyun_3_x64_20G_qboot_alibase_20240819.vhd",
    "ubuntu_22_04_x64_20G_alibase_20240926.vhd",
)
_OTHER_OS_IMAGES = (
    "win2022_21H2_x64_dtc_en-us_40G_alibase_20240117.vhd", "centos_7_9_x64_20G_alibase_20240628.vhd",
    "freebsd_13_2_x64_30G_alibase_20231011.vhd", "",
)
# NVIDIA models without bf16 (before Ampere): Volta, Turing, Pascal, Maxwell and Kepler.
_NVIDIA_NO_BF16_MODEL = re.compile(
    r"\b(V100S?|T4|P100|P40|P4|P6|K80|K40|M60|M40|TITAN V|TITAN RTX|RTX 20[0-9]0|GTX 1[0-9]{3}|QUADRO RTX [0-9]{4}|"
    r"RTX [0-9]000)\b"
)
_NOT_GIVEN = object()  # a required key of one source only, left out
# Keys of `nodes` that describe ECS instances: refused with source `hosts`, where no instance is created.
ALIBABA_ONLY_NODE_KEYS = (
    "instanceTypes", "zone", "spot", "spotPriceLimit", "systemDiskGb", "dataDiskGb", "dataDiskCategory",
    "dataDiskPerformanceLevel", "dataDiskBursting", "osImage", "gpuDriver", "driverVersion", "cudaVersion",
    "cudnnVersion", "internetBandwidthMbps", "paused", "spotHead", "image", "bake", "placementGeneration",
)
# The smallest cloud_essd data disk of each performance level, GiB (ECS CreateDisk/RunInstances; the provider's
# website/docs/r/ecs_disk.html.markdown at 81c43b67: PL0 1, PL1 20, PL2 461, PL3 1261 to 65536). Below it
# RunInstances refuses the disk.
# see verified-facts#nodes-ecs-disk-html
ESSD_MIN_GIB = {"PL0": 1, "PL1": 20, "PL2": 461, "PL3": 1261}
# Keys of `nodes` that only mean something for existing hosts: refused with source `alibaba`.
HOSTS_ONLY_NODE_KEYS = ("hosts", "hostDefaults", "privateNetwork", "acceleratorsPerNode", "acceleratorModel", "bf16")
# NVIDIA architectures from Ampere on have bf16 (A10, A30, A100, A800, H20, H100, H800, L4, L20, L40, B200, GH200,
# RTX 30xx/40xx/A6000); Volta (V100), Turing (T4) and Pascal (P100) have not.
_NVIDIA_BF16_MODEL = re.compile(
    r"\b(A[0-9]{1,4}|H[0-9]{2,3}|L[0-9]{1,2}S?|B[0-9]{2,3}|GH[0-9]{3}|RTX ?[34]0[0-9]0|RTX A[0-9]{4})\b"
)


MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}


def _driver_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isascii() and part.isdigit())


def nvidia_model_has_bf16(model: str) -> bool:
    return bool(_NVIDIA_BF16_MODEL.search(model.upper().replace("NVIDIA", "")))


# nodes.autostop.afterJobMinutes left out on Alibaba: an idle GPU cluster is the costliest default.
DEFAULT_AFTER_JOB_MINUTES = 30


class AutostopConfig(Section):
    """When the head stops the cluster by itself (docs/operations.md, 'Pause, resume and autostop')."""

    after_job_minutes: int | None = Field(
        None, ge=0, le=10080,
        description="Stop the cluster this many minutes after the job ended (SUCCEEDED, FAILED, STOPPED or LOST) "
        f"and no other job started. Left out: {DEFAULT_AFTER_JOB_MINUTES} with nodes.source alibaba, never on your "
        "own hosts. 0: never for this reason.",
    )
    idle_minutes: int | None = Field(
        None, ge=0, le=10080,
        description="Stop the cluster when no job has run and every GPU has been idle (0 % utilisation in "
        "`nvidia-smi`) for this many minutes. Left out or 0: never for this reason.",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.after_job_minutes) or bool(self.idle_minutes)


class NodesConfig(Section):
    source: str = Field(
        sources.DEFAULT,
        description="Where the nodes come from: `alibaba`, new GPU ECS instances in a VPC of their own "
        "(infra/sources/alibaba); `hosts`, machines you already have, listed in `hosts` and reached over SSH "
        "(infra/sources/hosts; nothing is created in any cloud). With `hosts` the Alibaba-only keys (instanceTypes, "
        "zone, spot, spotPriceLimit, systemDiskGb, dataDiskGb, dataDiskCategory, dataDiskPerformanceLevel, "
        "dataDiskBursting, osImage, gpuDriver, driverVersion, cudaVersion, "
        "cudnnVersion, internetBandwidthMbps, paused, spotHead, image, bake, placementGeneration) are refused; see "
        "docs/own-hosts.md.",
        json_schema_extra={"enum": list(sources.names())},
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
        "a zone with stock for the chosen type. Once the cluster exists the zone is kept (see docs/alibaba.md, 'sticky "
        "placement').",
    )
    placement_generation: int = Field(
        0, ge=0, le=1000,
        description="Bump it (e.g. 0 -> 1) to move an existing cluster on purpose: the next `pulumi up` places it "
        "afresh by stock and replaces its vSwitch, nodes and NAS mount target (the NAS file system and its data "
        "stay). Unchanged, the cluster keeps its zone and type whatever the stock.",
    )
    spot: bool = Field(
        False, description="Preemptible (spot) instances at the market price: the workers, and the head with "
        "`spotHead` (or when it is the only node). Changing it on a running cluster replaces every node "
        "(docs/alibaba.md, 'Changes that replace every node')."
    )
    spot_price_limit: float | None = Field(
        None, gt=0, description="Hourly price cap per instance; implies spot with a price limit. Changing it on a "
        "running cluster replaces every node."
    )
    spot_head: bool = Field(
        False,
        description="With spot: the head (rank 0) is a spot instance too. Alibaba may reclaim a spot instance at "
        "5 minutes' notice, and the head takes Ray, the job's driver and the dashboard with it, so by default the "
        "head is pay-as-you-go and only the workers are spot. On a one-node cluster `spot` can only mean the head, "
        "which is then spot without this.",
    )

    @property
    def head_on_spot(self) -> bool:
        return self.spot and (self.spot_head or self.count == 1)
    system_disk_gb: int = Field(200, ge=100, le=2048, description="ESSD system disk size in GB.")
    data_disk_gb: int = Field(
        0,
        description="ESSD data disk in GB (0, or 100 to 32768) mounted at `/data`: Docker's root, Ray's temp and "
        "spill directories. 0: no data disk. Changing it on a running cluster (0 to N too) replaces every node: "
        "/data starts empty.",
    )
    data_disk_category: Literal["cloud_essd", "cloud_auto"] = Field(
        "cloud_essd",
        description="The data disk's class. `cloud_essd`: an ESSD of `dataDiskPerformanceLevel` (PL1 by default: "
        "min{120 + 0.5 x GiB, 350} MB/s, 220 MB/s at 200 GiB). `cloud_auto`: an ESSD AutoPL disk, the same baseline "
        "and price as PL1, which with `dataDiskBursting` bursts up to 4 GB/s, billed per use. A tuned image pull "
        "moves about 4x the compressed layers through the disk (write, read back, write extracted), so a PL1 disk "
        "caps it (docs/performance.md, 'Image pulls and the data disk'). Changing it on a running cluster replaces "
        "every node.",
    )
    data_disk_performance_level: Literal["PL0", "PL1", "PL2", "PL3"] | None = Field(
        None,
        description="With `dataDiskCategory: cloud_essd`: the ESSD performance level. PL2 needs `dataDiskGb` >= 461 "
        "and PL3 >= 1261 (Alibaba's minimum sizes); throughput PL1 at most 350 MB/s (PL0 180, PL2 750, PL3 4000: "
        "UNCONFIRMED). Left out: Alibaba's default, PL1. Changing it on a running cluster replaces every node, "
        "setting it where it was left out too (even to PL1).",
    )
    data_disk_bursting: bool | None = Field(
        None,
        description="With `dataDiskCategory: cloud_auto`: the AutoPL performance burst (up to 4 GB/s while I/O "
        "peaks, such as an image pull; billed per use at a rate the plan cannot bound). Left out: true. Changing "
        "it on a running cluster replaces every node.",
    )
    os_image: str = Field(
        "^aliyun_3_x64_20G_alibase_.*",
        description="Regular expression for the public image name; the newest match is used. Alibaba Cloud Linux 3 "
        "and Ubuntu 22.04 (`^ubuntu_22_04_x64_20G_alibase_.*`) are supported.",
    )
    image: str | None = Field(
        None,
        description="An ECS image id (`m-...`) to boot from instead of `osImage`: an image baked by `bake: true` "
        "(see docs/performance.md, 'Baked images'; every bootstrap step then finds its work done), a custom image "
        "with the NVIDIA driver preinstalled (for `gpuDriver: preinstalled`) or a Marketplace image. It must be in "
        "the stack's region. null: the newest public image matching `osImage`.",
    )
    bake: bool = Field(
        False,
        description="Make an ECS custom image of the head once its bootstrap is done (driver, Docker, NVIDIA "
        "toolkit, the training image with the framework's requirements); its id is the output `bakedImageId`. The "
        "image is kept on `pulumi destroy` (docs/performance.md, 'Baked images', says how to delete it).",
    )
    gpu_driver: Literal["auto-install", "preinstalled"] = Field(
        "auto-install",
        description="`auto-install`: Alibaba's driver auto-install script (`auto_install_v4.0.sh`) runs at first "
        "boot (10-20 min, overlapped with the image pull), adding nvidia-fabricmanager on 8-GPU NVSwitch types "
        "(gn7, gn7e, gn8v, ebmgn8v). `preinstalled`: the image (`image`) already has the NVIDIA driver, and on "
        "NVSwitch types an enabled nvidia-fabricmanager of the same version.",
    )
    driver_version: str = Field(
        "550.127.08", pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$",
        description="NVIDIA driver for auto-install; must support the container image's CUDA (12.4 for torch260).",
    )
    cuda_version: str = Field(
        "12.4.1", pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$", description="CUDA version for auto-install."
    )
    cudnn_version: str = Field(
        "9.2.0.82", pattern=r"^[0-9]+(\.[0-9]+){1,3}$", description="cuDNN version for auto-install."
    )
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
    paused: bool = Field(
        False,
        description="Pause the cluster: every instance is stopped in Alibaba's economical mode (ECS `status: "
        "Stopped`, `stoppedMode: StopCharging`): compute, GPUs and the public IP stop billing; disks, NAS, snapshots "
        "and baked images keep billing. Remove it (or set false) and `pulumi up` starts them again: Ray comes back "
        "with the containers and the job is submitted again, resuming from its newest checkpoint (training.resume). "
        "A restart needs the instance type in stock in the zone again. Alibaba only; docs/operations.md, 'Pause, "
        "resume and autostop'.",
    )
    autostop: AutostopConfig = Field(
        default_factory=lambda: AutostopConfig(),
        description="Stop the cluster by itself when it idles: `afterJobMinutes` after the job ended (on Alibaba "
        f"{DEFAULT_AFTER_JOB_MINUTES} unless set; 0: never), `idleMinutes` with no job and idle GPUs. On Alibaba "
        "the head stops this stack's instances (StopCharging, through Alibaba's Python SDK) with an instance RAM "
        "role that may stop only instances tagged with this stack; `python3 -m companion resume` starts them "
        "again as after `paused`. On your own hosts it stops the job (freeing the GPUs), never the machines.",
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

    @field_validator("source", mode="before")
    @classmethod
    def _registered(cls, source: Any) -> Any:
        # The registry (infra/sources/__init__.py) says which sources exist.
        if sources.capabilities(source) is None:
            raise _problem(f"must be one of {', '.join(_shown(name) for name in sources.names())}; got "
                           f"{_shown(source)}")
        return source

    @model_validator(mode="before")
    @classmethod
    def _keys_of_the_source(cls, data: Any) -> Any:
        """Each source has keys of its own: a key of the other source is refused (it would be silently unused)."""
        if not isinstance(data, dict):
            return data
        capable = sources.capabilities(data.get("source", sources.DEFAULT))
        if capable is not None and capable.existing_machines:
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
        elif capable is not None and capable.instance_types:
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
        if not types and _capable(info.data.get("source", sources.DEFAULT)).instance_types:
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

    @field_validator("data_disk_performance_level")
    @classmethod
    def _performance_level(cls, level: str | None, info: ValidationInfo) -> str | None:
        if level is None:
            return level
        category, size = info.data.get("data_disk_category"), info.data.get("data_disk_gb")
        if size == 0:
            raise _problem(f"needs a data disk (nodes.dataDiskGb 100 or more); got {_shown(level)} with "
                           "dataDiskGb 0")
        if category == "cloud_auto":
            # The provider sends PerformanceLevel for cloud_essd only (TF resource_alicloud_instance.go at
            # 81c43b67): with cloud_auto it would be silently unused.
            # see verified-facts#nodes-instance
            raise _problem(f"applies to dataDiskCategory cloud_essd only (an AutoPL disk has no level: its "
                           f"baseline is PL1's, with dataDiskBursting above it); got {_shown(level)} with "
                           "dataDiskCategory \"cloud_auto\"")
        if isinstance(size, int) and size < ESSD_MIN_GIB[level]:
            raise _problem(f"{level} needs nodes.dataDiskGb >= {ESSD_MIN_GIB[level]} (Alibaba's smallest {level} "
                           f"ESSD); got {_shown(level)} with dataDiskGb {size}")
        return level

    @field_validator("data_disk_bursting")
    @classmethod
    def _bursting(cls, bursting: bool | None, info: ValidationInfo) -> bool | None:
        category = info.data.get("data_disk_category")
        if bursting is not None and category != "cloud_auto":
            # The provider sends BurstingEnabled for cloud_auto only (TF resource_alicloud_instance.go).
            # see verified-facts#nodes-instance-2
            raise _problem(f"applies to dataDiskCategory cloud_auto only (an ESSD AutoPL disk); got "
                           f"{_shown(bursting)} with dataDiskCategory {_shown(category)}")
        return bursting

    @field_validator("data_disk_category")
    @classmethod
    def _category_needs_a_disk(cls, category: str, info: ValidationInfo) -> str:
        if category != "cloud_essd" and info.data.get("data_disk_gb") == 0:
            raise _problem(f"needs a data disk (nodes.dataDiskGb 100 or more); got {_shown(category)} with "
                           "dataDiskGb 0")
        return category

    @property
    def data_disk_burst(self) -> bool:
        """Whether the data disk is an AutoPL disk with its performance burst on (dataDiskBursting left out: on)."""
        return self.data_disk_category == "cloud_auto" and self.data_disk_bursting is not False

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
            compiled = re.compile(pattern)
        except re.error as error:
            raise _problem(f"must be a valid regular expression ({error}); got {_shown(pattern)}") from None
        other = next((name for name in _OTHER_OS_IMAGES if compiled.search(name)), None)
        supported = any(compiled.search(name) for name in _SUPPORTED_OS_IMAGES)
        if other is not None or not supported:
            why = (f"it matches {_shown(other) if other else 'any name'}, so the newest image of any system "
                   "would boot" if other is not None else
                   f"it matches none of their names (such as {_SUPPORTED_OS_IMAGES[0]})")
            raise _problem(
                "must select Alibaba Cloud Linux 3 or Ubuntu 22.04 public images (e.g. `^aliyun_3_x64_20G_alibase_.*` "
                f"or `^ubuntu_22_04_x64_20G_alibase_.*`): {why}; got {_shown(pattern)}"
            )
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
    def _autostop_on_by_default(cls, data: Any) -> Any:
        """On Alibaba, autostop stops the cluster DEFAULT_AFTER_JOB_MINUTES after the job ended unless
        afterJobMinutes says otherwise (0: never)."""
        if not isinstance(data, dict) or not _capable(data.get("source", sources.DEFAULT)).autostop_stops_machines:
            return data
        autostop = data.get("autostop", {})
        if isinstance(autostop, dict) and "afterJobMinutes" not in autostop:
            data = {**data, "autostop": {**autostop, "afterJobMinutes": DEFAULT_AFTER_JOB_MINUTES}}
        return data

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
        if limit is not None and round(limit, 3) != limit:
            # RunInstances SpotPriceLimit: "three decimal places at most" (pulumi_alicloud ecs/instance.py
            # spot_price_limit docstring).
            raise _problem(f"must have at most three decimal places (Alibaba's precision); got {_shown(limit)}")
        if limit is not None and info.data.get("spot") is False:
            raise _problem(
                "must not be false when spotPriceLimit is set (a price limit implies spot: leave spot out or set "
                f"it to true); got false with spotPriceLimit {_shown(limit)}",
                "..", "spot",
            )
        return limit

    @field_validator("spot_head")
    @classmethod
    def _spot_head_needs_spot(cls, spot_head: bool, info: ValidationInfo) -> bool:
        if spot_head and info.data.get("spot") is False:
            raise _problem("applies with spot: true only (it makes the head a spot instance too); set spot: true, "
                           "or remove spotHead; got true without spot")
        return spot_head

    @field_validator("accelerator_model")
    @classmethod
    def _model_of_the_accelerator(cls, model: str | None, info: ValidationInfo) -> str | None:
        if model is None:
            return None
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9 ._()+/-]{0,63}", model):
            raise _problem(f"must be a model name such as `NVIDIA A100 80GB` or `Ascend 910B3` (letters, digits, "
                           f"spaces and ._()+/-, at most 64 characters); got {_shown(model)}")
        accelerator = info.data.get("accelerator")
        words = model.upper()
        if accelerator == "nvidia" and re.search(r"ASCEND|ATLAS|\b(910[A-C]?[0-9]?|310[PB]?)\b", words):
            raise _problem(f"names an Ascend NPU, but nodes.accelerator is \"nvidia\": set nodes.accelerator: "
                           f"ascend for Ascend hosts; got {_shown(model)}")
        nvidia = any(w in words for w in ("NVIDIA", "TESLA", "GEFORCE", "QUADRO", "RTX")) \
            or _NVIDIA_BF16_MODEL.search(words) is not None or _NVIDIA_NO_BF16_MODEL.search(words) is not None
        if accelerator == "ascend" and nvidia and "ASCEND" not in words:
            raise _problem(f"names an NVIDIA GPU, but nodes.accelerator is \"ascend\": set nodes.accelerator: "
                           f"nvidia for NVIDIA hosts; got {_shown(model)}")
        return model

    @field_validator("bf16")
    @classmethod
    def _bf16_of_the_model(cls, bf16: bool | None, info: ValidationInfo) -> bool | None:
        model = info.data.get("accelerator_model")
        if bf16 and info.data.get("accelerator") == "nvidia" and model \
                and _NVIDIA_NO_BF16_MODEL.search(model.upper().replace("NVIDIA", "")):
            raise _problem(f"must not be true for {model}: GPUs before Ampere (Volta V100, Turing T4, Pascal) have "
                           "no bf16, so the job would fail or crawl; leave it out (fp16 is chosen) or set false; "
                           "got true")
        return bf16

    @field_validator("cuda_version")
    @classmethod
    def _driver_supports_cuda(cls, cuda: str, info: ValidationInfo) -> str:
        # The oldest driver each CUDA major runs on (minor-version compatibility, NVIDIA CUDA release notes
        # table 2: >= 525.60.13 for 12.x, >= 580.65.06 for 13.x).
        driver = info.data.get("driver_version")
        major = int(cuda.split(".")[0]) if cuda.split(".")[0].isascii() and cuda.split(".")[0].isdigit() else 0
        minimum = MIN_DRIVER.get(major)
        if driver is not None and minimum is not None and _driver_version(driver) < _driver_version(minimum):
            raise _problem(f"must be at least {minimum} for CUDA {cuda} (nodes.cudaVersion); got {_shown(driver)}",
                           "..", "driverVersion")
        return cuda

    @field_validator("gpu_driver")
    @classmethod
    def _preinstalled_needs_image(cls, driver: str, info: ValidationInfo) -> str:
        if driver == "preinstalled" and _capable(info.data.get("source")).instance_types \
                and info.data.get("image") is None:
            raise _problem("`preinstalled` needs nodes.image, an image with the NVIDIA driver: the public images "
                           "have none, so no GPU would work; got \"preinstalled\" without nodes.image")
        return driver

    @field_validator("accelerator")
    @classmethod
    def _ascend_needs_hosts(cls, accelerator: str, info: ValidationInfo) -> str:
        capable = sources.capabilities(info.data.get("source"))
        if accelerator == "ascend" and capable is not None and accelerator not in capable.accelerators:
            raise _problem("`ascend` needs nodes.source hosts (Alibaba ECS sells no Ascend servers); got \"ascend\" "
                           "with source \"alibaba\"")
        return accelerator

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, hosts: list[HostConfig] | None, info: ValidationInfo) -> list[HostConfig] | None:
        if not _capable(info.data.get("source")).existing_machines:
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
        if not _capable(info.data.get("source")).existing_machines or not hosts:
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
            key = "privateAddress" if host.private_address is not None else "address"
            if address.version != cidr.version or address not in cidr:
                problems.append((
                    ("..", "hosts", index, key),
                    f"must lie in {source}: every host reaches the others at its private address; got "
                    f"{_shown(host.private_ip)}",
                ))
            elif network is None and cidr.version == 4 and address in (cidr.network_address,
                                                                            cidr.broadcast_address):
                problems.append((
                    ("..", "hosts", index, key),
                    f"must be a host's address, not the network or broadcast address of {source}; got "
                    f"{_shown(host.private_ip)}",
                ))
        if problems:
            raise _Problems(*problems)
        return network

    @field_validator("accelerators_per_node")
    @classmethod
    def _count_needed(cls, count: int | None, info: ValidationInfo) -> int | None:
        if count is None and _capable(info.data.get("source")).existing_machines:
            raise _problem("required with nodes.source hosts: the GPUs or NPUs every host has (e.g. 8), counted "
                           "on each host before anything runs; got nothing", "..", "acceleratorsPerNode")
        return count

    @property
    def capabilities(self) -> Capabilities:
        """What the source can do (declared in infra/sources/<source>/, found through the registry)."""
        return _capable(self.source)

    @property
    def gpus_per_node(self) -> int | None:
        """Accelerators per node: given for hosts; from the catalog for ECS (None when no candidate type is in it:
        the live answer decides)."""
        if self.capabilities.existing_machines:
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


# What a source no longer registered (a test's), or a value the `source` check refuses, can do: nothing.
_NO_CAPABILITIES = Capabilities(
    existing_machines=False, instance_types=False, region=False, firewall=False, pause=False,
    autostop_stops_machines=False, spot=False, managed_shared_storage=False, user_shared_storage=False,
    permissions=False, accelerators=(),
)


def _capable(source: object) -> Capabilities:
    """The capabilities of the source named `source` (a raw value too); none for a name no source has."""
    return sources.capabilities(source) or _NO_CAPABILITIES


def _catalog_gpus(instance_types: list[str]) -> int | None:
    """GPUs per node of the first candidate the catalog knows; None when it knows none (the live answer decides)."""
    known = [t for t in (catalog.lookup(n) for n in instance_types) if t is not None]
    return known[0].gpus if known else None
