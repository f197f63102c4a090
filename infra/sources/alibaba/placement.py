"""Where the cluster goes: the first instance type of `nodes.instanceTypes` that has stock in a zone of the region.

Runs at plan time with Alibaba's stock-aware data sources (sold-out zones and types are omitted from their
answers), before any resource is registered, so "no stock anywhere" stops the update with a useful message
instead of failing half-way. Stock can still vanish between plan and create; the vSwitch then keeps the choice
of the first successful `pulumi up` (see infra/sources/alibaba/network.py, sticky placement).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi_alicloud as alicloud

from infra.config import ClusterConfig
from infra.sources.alibaba import catalog


class PlacementError(RuntimeError):
    pass


@dataclass(frozen=True)
class Placement:
    zone: str
    instance_type: str
    gpus_per_node: int
    gpu_model: str
    bf16: bool
    hourly_price: float | None  # per instance, as the region reports it
    tried: tuple[str, ...]  # what was looked at before, for the plan
    image_id: str
    image_name: str
    nvswitch: bool = False  # 8-GPU NVSwitch type: nvidia-fabricmanager must run (catalog.NVSWITCH_FAMILIES)


def choose_placement(config: ClusterConfig) -> Placement:
    nodes = config.nodes
    tried: list[str] = []
    for type_name in nodes.instance_types:
        zones = alicloud.get_zones(
            available_instance_type=type_name,
            available_resource_creation="VSwitch",
            instance_charge_type="PostPaid",
            spot_strategy=nodes.spot_strategy,
        ).ids or []
        if nodes.zone != "auto":
            zones = [z for z in zones if z == nodes.zone]
        if not zones:
            where = f"zone {nodes.zone}" if nodes.zone != "auto" else f"any zone of {config.region}"
            tried.append(f"{type_name}: no stock in {where}")
            continue
        zone = sorted(zones)[0]
        live = alicloud.ecs.get_instance_types(
            instance_type=type_name, availability_zone=zone, spot_strategy=nodes.spot_strategy,
            instance_charge_type="PostPaid",
        ).instance_types
        known = catalog.lookup(type_name)
        gpus, model = _gpus(live[0].gpus if live else None, known)
        if gpus is None:
            tried.append(f"{type_name}: the region reports no GPUs for it")
            continue
        price = _price(live[0].price if live else None)
        image_id, image_name = _image(config, type_name)
        family = catalog.FAMILIES.get(catalog.family_of(type_name) or "")
        return Placement(
            zone=zone,
            instance_type=type_name,
            gpus_per_node=gpus,
            gpu_model=model,
            bf16=family.bf16 if family else True,
            hourly_price=price,
            tried=tuple(tried),
            image_id=image_id,
            image_name=image_name,
            nvswitch=catalog.family_of(type_name) in catalog.NVSWITCH_FAMILIES and gpus == 8,
        )
    spot_hint = "" if nodes.spot else ", or spot instances (nodes.spot: true), whose stock differs"
    raise PlacementError(
        f"no zone of {config.region} has stock for any of roll-cluster:nodes.instanceTypes:\n  - "
        + "\n  - ".join(tried)
        + f"\nTry other GPU types in nodes.instanceTypes, another region (alicloud:region){spot_hint}"
        + (", or nodes.zone: auto" if nodes.zone != "auto" else "")
        + ". Nothing was created."
    )


def _gpus(live: Sequence[object] | None, known: catalog.GpuInstanceType | None) -> tuple[int | None, str]:
    # pulumi-alicloud 4.x returns `gpus` as a list of {amount: str, category: str}; the live answer wins.
    if live:
        amount = sum(int(getattr(g, "amount", 0) or 0) for g in live)
        category = str(getattr(live[0], "category", "") or (known.family.gpu_model if known else "GPU"))
        if amount > 0:
            return amount, category
    if known:
        return known.gpus, known.family.gpu_model
    return None, ""


def _price(text: str | None) -> float | None:
    try:
        return float(text) if text else None
    except ValueError:
        return None


def _image(config: ClusterConfig, type_name: str) -> tuple[str, str]:
    if config.nodes.image is not None:
        # An explicit image: a custom image (baked, or with the driver for gpuDriver: preinstalled) or a
        # Marketplace one; any owner, so no `owners` filter.
        found = alicloud.ecs.get_images(image_id=config.nodes.image, instance_type=type_name).images
        if not found:
            raise PlacementError(
                f"roll-cluster:nodes.image: no image {config.nodes.image} that {type_name} can boot in "
                f"{config.region} (custom images are regional: copy it into this region, or share it with this "
                "account); nothing was created"
            )
        return found[0].id, found[0].name
    images = alicloud.ecs.get_images(
        name_regex=config.nodes.os_image, owners="system", most_recent=True, instance_type=type_name,
        architecture="x86_64",
    ).images
    if not images:
        raise PlacementError(
            f"roll-cluster:nodes.osImage: no public image of {config.region} matches {config.nodes.os_image!r} "
            "for " + type_name + "; use e.g. ^aliyun_3_x64_20G_alibase_.* or ^ubuntu_22_04_x64_20G_alibase_.*"
        )
    return images[0].id, images[0].name
