"""GPU instance types of Alibaba Cloud ECS that the program knows, from the ECS documentation.

Used to validate `nodes.instanceTypes` before anything is created, to size the training configuration
(GPUs per node, bf16 support) and, in the offline plan, to answer like `ecs.get_instance_types` would.
At deploy time the live `ecs.get_instance_types` answer wins for GPU count and price (placement.py).

Prices are approximate pay-as-you-go list prices in CNY per hour (cn-hangzhou, 2025): the offline plan's, and the
estimate shown (labelled as such) when the region reports no live price for a type, e.g. a sold-out type an
existing cluster runs. The real region reports its own.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuFamily:
    name: str  # "ecs.gn6v"
    gpu_model: str  # what get_instance_types reports as the GPU category
    gpu_memory_gb: int
    bf16: bool  # Volta and Turing lack bf16: ROLL configs switch to fp16 there
    memory_gib_per_vcpu: int
    price_per_gpu_hour: float  # approximate, offline plan only
    verified_model: bool  # False where the ECS doc does not name the GPU


@dataclass(frozen=True)
class GpuInstanceType:
    name: str
    family: GpuFamily
    gpus: int
    vcpus: int
    memory_gib: int

    @property
    def nvswitch(self) -> bool:
        """Whether the GPUs hang off NVSwitch, so that nvidia-fabricmanager must run in the instance."""
        return self.family.name in NVSWITCH_FAMILIES and self.gpus == 8

    @property
    def hourly_price(self) -> float:
        return round(self.family.price_per_gpu_hour * self.gpus + 0.12 * self.vcpus, 2)


FAMILIES: dict[str, GpuFamily] = {
    f.name: f
    for f in [
        GpuFamily("ecs.gn6v", "NVIDIA V100", 16, False, 4, 26.0, True),
        GpuFamily("ecs.gn6e", "NVIDIA V100", 32, False, 8, 30.0, True),
        GpuFamily("ecs.gn6i", "NVIDIA T4", 16, False, 4, 11.0, True),
        GpuFamily("ecs.gn7i", "NVIDIA A10", 24, True, 4, 14.0, True),
        GpuFamily("ecs.gn7s", "NVIDIA A30", 24, True, 8, 17.0, True),
        GpuFamily("ecs.gn7", "NVIDIA A100 40GB", 40, True, 8, 32.0, False),
        GpuFamily("ecs.gn7e", "NVIDIA A100 80GB", 80, True, 8, 38.0, False),
        GpuFamily("ecs.gn8is", "NVIDIA L20", 48, True, 8, 18.0, True),
        GpuFamily("ecs.gn8v", "NVIDIA H20", 96, True, 8, 40.0, False),
        GpuFamily("ecs.ebmgn8v", "NVIDIA H20", 96, True, 5, 41.0, False),
    ]
}

# Families Alibaba sells only on request (GPU families page, verified-facts#catalog-alibaba-real-account:
# gn8v, gn8is and ebmgn8v "contact Alibaba Cloud sales personnel"; gn7s "submit a ticket to apply"): an account
# without that approval gets no instance, whatever the stock.
ON_REQUEST: dict[str, str] = {
    "ecs.gn8v": "contact Alibaba Cloud sales to enable it for your account",
    "ecs.ebmgn8v": "contact Alibaba Cloud sales to enable it for your account",
    "ecs.gn8is": "contact Alibaba Cloud sales to enable it for your account",
    "ecs.gn7s": "submit a ticket in the Alibaba Cloud console to apply for it",
}

# Families whose 8-GPU types are whole HGX baseboards (SXM GPUs on NVSwitch): gn7/gn7e (A100 SXM4) and gn8v/ebmgn8v
# (H20, "8卡之间支持NVLINK互联", "通过900 GB/s NVLINK互联" in the gn8v doc). NVIDIA: on NVSwitch systems the Fabric
# Manager must be installed at the driver's version and started; Alibaba's ACK guide to custom GPU drivers takes a
# Fabric Manager rpm with every custom driver ("The version of NVIDIA Fabric Manager must be the same as that of the
# NVIDIA driver"). No Alibaba document found says which instance types need it inside the instance (UNCONFIRMED,
# docs/verified-facts.md 3; verified-facts#catalog-alibaba-cloud-verified): the full 8-GPU shapes are
# assumed to pass the NVSwitches through; smaller shapes of these families and the V100 (NVLink without NVSwitch)
# and PCIe families are not.
NVSWITCH_FAMILIES = ("ecs.gn7", "ecs.gn7e", "ecs.gn8v", "ecs.ebmgn8v")

# (type, GPUs) from alibaba-cloud.md §1; vCPUs follow Alibaba's naming: "Nxlarge" = 4N vCPUs.
_TYPES: list[tuple[str, int]] = [
    ("ecs.gn6v-c8g1.2xlarge", 1), ("ecs.gn6v-c8g1.4xlarge", 2), ("ecs.gn6v-c8g1.8xlarge", 4),
    ("ecs.gn6v-c8g1.16xlarge", 8), ("ecs.gn6v-c10g1.20xlarge", 8),
    ("ecs.gn6e-c12g1.3xlarge", 1), ("ecs.gn6e-c12g1.6xlarge", 2), ("ecs.gn6e-c12g1.12xlarge", 4),
    ("ecs.gn6e-c12g1.24xlarge", 8),
    ("ecs.gn6i-c4g1.xlarge", 1), ("ecs.gn6i-c8g1.2xlarge", 1), ("ecs.gn6i-c16g1.4xlarge", 1),
    ("ecs.gn6i-c24g1.6xlarge", 1), ("ecs.gn6i-c40g1.10xlarge", 1), ("ecs.gn6i-c24g1.12xlarge", 2),
    ("ecs.gn6i-c24g1.24xlarge", 4),
    ("ecs.gn7i-c8g1.2xlarge", 1), ("ecs.gn7i-c16g1.4xlarge", 1), ("ecs.gn7i-c32g1.8xlarge", 1),
    ("ecs.gn7i-c48g1.12xlarge", 1), ("ecs.gn7i-c56g1.14xlarge", 1), ("ecs.gn7i-c32g1.16xlarge", 2),
    ("ecs.gn7i-c32g1.32xlarge", 4), ("ecs.gn7i-2x.8xlarge", 2), ("ecs.gn7i-4x.8xlarge", 4),
    ("ecs.gn7i-4x.16xlarge", 4), ("ecs.gn7i-8x.16xlarge", 8), ("ecs.gn7i-8x.32xlarge", 8),
    ("ecs.gn7s-c8g1.2xlarge", 1), ("ecs.gn7s-c16g1.4xlarge", 1), ("ecs.gn7s-c32g1.8xlarge", 1),
    ("ecs.gn7s-c48g1.12xlarge", 1), ("ecs.gn7s-c56g1.14xlarge", 1), ("ecs.gn7s-c32g1.16xlarge", 2),
    ("ecs.gn7s-c32g1.32xlarge", 4),
    ("ecs.gn7-c12g1.3xlarge", 1), ("ecs.gn7-c13g1.13xlarge", 4), ("ecs.gn7-c13g1.26xlarge", 8),
    ("ecs.gn7e-c16g1.4xlarge", 1), ("ecs.gn7e-c16g1.8xlarge", 2), ("ecs.gn7e-c16g1.16xlarge", 4),
    ("ecs.gn7e-c16g1.32xlarge", 8),
    ("ecs.gn8is.2xlarge", 1), ("ecs.gn8is.4xlarge", 1), ("ecs.gn8is-2x.8xlarge", 2),
    ("ecs.gn8is-4x.16xlarge", 4), ("ecs.gn8is-8x.32xlarge", 8),
    ("ecs.gn8v.4xlarge", 1), ("ecs.gn8v.6xlarge", 1), ("ecs.gn8v-2x.8xlarge", 2),
    ("ecs.gn8v-2x.12xlarge", 2), ("ecs.gn8v-4x.8xlarge", 4), ("ecs.gn8v-4x.24xlarge", 4),
    ("ecs.gn8v-8x.16xlarge", 8), ("ecs.gn8v-8x.48xlarge", 8),
    ("ecs.ebmgn8v.48xlarge", 8),
]

_SIZE = re.compile(r"\.(\d*)xlarge$")
_FAMILY = re.compile(r"^(ecs\.[a-z]+[0-9]+[a-z]*)[-.]")


def family_of(type_name: str) -> str | None:
    match = _FAMILY.match(type_name)
    return match.group(1) if match else None


def _vcpus(type_name: str) -> int:
    match = _SIZE.search(type_name)
    if not match:
        raise ValueError(f"cannot read the size of {type_name}")
    return 4 * int(match.group(1) or 1)


def _build() -> dict[str, GpuInstanceType]:
    types = {}
    for name, gpus in _TYPES:
        family_name = family_of(name)
        assert family_name in FAMILIES, name
        family = FAMILIES[family_name]
        vcpus = _vcpus(name)
        types[name] = GpuInstanceType(name, family, gpus, vcpus, vcpus * family.memory_gib_per_vcpu)
    return types


INSTANCE_TYPES: dict[str, GpuInstanceType] = _build()


def lookup(type_name: str) -> GpuInstanceType | None:
    return INSTANCE_TYPES.get(type_name)


def on_request(type_name: str) -> str | None:
    """What to do before this type can be bought, for a family sold only on request; None otherwise."""
    return ON_REQUEST.get(family_of(type_name) or "")


def similar_types(type_name: str) -> list[str]:
    """Catalog types whose names are close to this one (for "did you mean")."""
    return difflib.get_close_matches(type_name, INSTANCE_TYPES, n=2, cutoff=0.6)


def is_gpu_family(type_name: str) -> bool:
    """A GPU family we know, even if this exact size is missing from the catalog (the live answer decides)."""
    return family_of(type_name) in FAMILIES


def estimated_price(type_name: str) -> float:
    """Approximate CNY per hour (the offline plan, and the fallback when the region reports no live price)."""
    known = lookup(type_name)
    if known is not None:
        return known.hourly_price
    family = FAMILIES.get(family_of(type_name) or "")
    # An unlisted size of a known family: one GPU's price, the smallest such type (config admits known families only).
    return family.price_per_gpu_hour if family is not None else 0.0
