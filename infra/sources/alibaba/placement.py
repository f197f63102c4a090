"""Where the cluster goes, and what its nodes are: decided at plan time, before any resource is registered.

- A cluster that already exists keeps its zone and instance type: its vSwitch (found by name and tags with
  `vpc.get_switches`) records both, and no stock look-up is made for it, so an update succeeds even when that type
  has no stock left anywhere. GPU count, model, bf16 and price are those of the type it runs.
- A new cluster (or one moved on purpose with `nodes.placementGeneration`) takes the first type of
  `nodes.instanceTypes` that has stock in a zone of the region, by the type's own availability answer
  (get_instance_types: sold-out zones are omitted), so "no stock anywhere" stops the update with a useful message
  before the network or the NAS exists, instead of failing half-way at RunInstances with NoStock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_alicloud as alicloud
from pulumi.errors import RunError

from infra.config import ClusterConfig, ConfigError
from infra.sources.alibaba import catalog

INSTANCE_TYPE_TAG = "roll-cluster-instance-type"
GENERATION_TAG = "roll-cluster-placement-generation"
STACK_TAG = "roll-cluster-stack"


class PlacementError(RunError):
    """No zone or type can serve the configuration (a pulumi RunError: shown without a traceback)."""


@dataclass(frozen=True)
class Price:
    """The hourly price of the cluster's instances, and what it is."""

    per_instance: float
    currency: str
    basis: str  # where the number comes from, in words

    def total(self, count: int) -> dict[str, Any]:
        return {
            "amount": round(self.per_instance * count, 2),
            "currency": self.currency,
            "per": "hour",
            "basis": self.basis,
            "includes": f"instances only ({count} x {self.per_instance:.2f})",
            "excludes": "disks, NAS, public traffic, snapshots",
        }


@dataclass(frozen=True)
class Placement:
    zone: str
    instance_type: str
    gpus_per_node: int
    gpu_model: str
    bf16: bool
    price: Price
    tried: tuple[str, ...]  # what was looked at before, for the plan
    image_id: str
    image_name: str
    existing: bool  # kept from the existing cluster's vSwitch, without stock look-ups
    vswitch_name: str
    nvswitch: bool = False  # 8-GPU NVSwitch type: nvidia-fabricmanager must run (catalog.NVSWITCH_FAMILIES)


@dataclass(frozen=True)
class ExistingCluster:
    zone: str
    instance_type: str
    vswitch_id: str


def vswitch_name(stack: str) -> str:
    return f"roll-cluster-{stack}"


def find_existing(config: ClusterConfig, stack: str) -> ExistingCluster | None:
    """The zone and type of this stack's cluster if its vSwitch exists (same placement generation), else None."""
    found = alicloud.vpc.get_switches(
        vswitch_name=vswitch_name(stack), tags={STACK_TAG: stack}
    ).vswitches or []
    generation = str(config.nodes.placement_generation)
    for vswitch in found:
        tags = dict(vswitch.tags or {})
        # A vSwitch made before the generation tag existed is generation 0.
        if tags.get(GENERATION_TAG, "0") != generation or not tags.get(INSTANCE_TYPE_TAG):
            continue
        return ExistingCluster(vswitch.zone_id, tags[INSTANCE_TYPE_TAG], vswitch.id)
    return None


def choose_placement(config: ClusterConfig, stack: str) -> Placement:
    existing = find_existing(config, stack)
    if existing is not None:
        return _keep(config, stack, existing)
    if config.nodes.paused:
        # No vSwitch of this stack (of this placement generation): no node exists to pause, and the first `up`
        # would create the network, the NAS and instances that never start.
        raise ConfigError([
            "roll-cluster:nodes.paused: applies to a cluster that exists; this stack has none yet (no network of "
            f"stack {stack} at placementGeneration {config.nodes.placement_generation}), so there is nothing to pause: "
            "remove it for the first `pulumi up`; got true"
        ])
    return _place_by_stock(config, stack)


def _keep(config: ClusterConfig, stack: str, existing: ExistingCluster) -> Placement:
    type_name = existing.instance_type
    live = _live_price(type_name)
    known = catalog.lookup(type_name)
    gpus, model = _gpus_and_model(live.gpus if live else None, known)
    family = catalog.FAMILIES.get(catalog.family_of(type_name) or "")
    if gpus is None or family is None:
        raise PlacementError(
            f"the existing cluster runs {type_name}, which neither the region's answer nor the program's catalog "
            "describes (GPUs per node unknown); add it to infra/sources/alibaba/catalog.py. Nothing was changed."
        )
    notes = [f"kept: the cluster exists in {existing.zone} with {type_name} (vSwitch {existing.vswitch_id}); "
             "no stock look-up"]
    if type_name not in config.nodes.instance_types or config.nodes.zone not in ("auto", existing.zone):
        notes.append(
            "nodes.instanceTypes / nodes.zone no longer match the running cluster; they apply when it is moved "
            "(bump nodes.placementGeneration)"
        )
    _check_growth(config, stack, existing)
    image_id, image_name = _image(config, type_name)
    return Placement(
        zone=existing.zone, instance_type=type_name, gpus_per_node=gpus, gpu_model=model, bf16=family.bf16,
        price=_price(config, type_name, live), tried=tuple(notes), image_id=image_id, image_name=image_name,
        existing=True, vswitch_name=vswitch_name(stack),
        nvswitch=catalog.family_of(type_name) in catalog.NVSWITCH_FAMILIES and gpus == 8,
    )


def _check_growth(config: ClusterConfig, stack: str, existing: ExistingCluster) -> None:
    """New nodes of an existing cluster need stock of its type in its zone: asked only when the cluster grows, so
    that a sold-out type stops the update before anything is touched, not half-way through creating nodes. A
    cluster whose network exists but no node runs yet (an earlier `up` stopped) is no reason to keep a zone that
    has no stock: the message then says where there is some."""
    nodes = config.nodes
    running = alicloud.ecs.get_instances(vswitch_id=existing.vswitch_id, tags={STACK_TAG: stack}).ids or []
    if nodes.count <= len(running):
        return
    live = _available(config, existing.instance_type)
    if existing.zone in (live.availability_zones if live is not None else []):
        return
    elsewhere = sorted(live.availability_zones) if live is not None else []
    if not running:
        raise PlacementError(
            f"roll-cluster:nodes.placementGeneration: this stack's network is in {existing.zone} (kept from an earlier "
            f"`pulumi up`), where {existing.instance_type} has no stock now, and no node runs yet; bump "
            f"nodes.placementGeneration (now {nodes.placement_generation}) to place the cluster anew"
            + (f" (stock now in {', '.join(elsewhere)})" if elsewhere else " (no zone of the region has stock now)")
            + ". Nothing was changed."
        )
    raise PlacementError(
        f"roll-cluster:nodes.count: the cluster runs {len(running)} nodes of {existing.instance_type} in "
        f"{existing.zone}, which has no stock of that type now, so {nodes.count - len(running)} more cannot be "
        f"created. The running nodes are untouched; keep nodes.count at {len(running)}, try again later, or "
        "move the cluster (bump nodes.placementGeneration). Nothing was changed."
    )


def _available(config: ClusterConfig, type_name: str) -> Any:
    """The type's own availability answer, or None when it has no stock anywhere in the region.

    get_instance_types asks DescribeAvailableResource for the type and omits sold-out zones and types from
    `availability_zones` (TF data_source_alicloud_instance_types.go). get_zones does not: it lists the
    zones that sell the type (DescribeZones) and drops only a zone sold out as a whole (TF
    data_source_alicloud_zones.go), so a zone it names can still answer RunInstances with NoStock.
    No zone and no sorted_by here: a sold-out zone makes the data source fail (TF service_alicloud_ecs.go),
    and the price needs billing permission (_live_price).
    See verified-facts#placement-instance-types.
    """
    answer = alicloud.ecs.get_instance_types(
        instance_type=type_name, instance_charge_type="PostPaid", spot_strategy=config.nodes.spot_strategy,
        # The nodes' system disk (components/alibaba/gpu_node.py): a zone without ESSD for the type is no zone for it
        # (DescribeAvailableResource SystemDiskCategory, TF service_alicloud_ecs.go; RunInstances would
        # answer OperationDenied.ZoneSystemCategoryNotMatch).
        # see verified-facts#placement-service-alicloud-ecs
        system_disk_category="cloud_essd",
    ).instance_types or []
    found = [t for t in answer if t.id == type_name and t.availability_zones]
    return found[0] if found else None


def _place_by_stock(config: ClusterConfig, stack: str) -> Placement:
    nodes = config.nodes
    tried: list[str] = []
    nas = _nas_zones(config)
    unknown: list[str] = []
    for type_name in nodes.instance_types:
        live = _available(config, type_name)
        zones = list(live.availability_zones) if live is not None else []
        if nodes.zone != "auto":
            zones = [z for z in zones if z == nodes.zone]
        if not zones and catalog.lookup(type_name) is None:
            # Neither the catalog nor any zone knows it: a typo or another region's type, not a stock problem.
            close = catalog.similar_types(type_name)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            unknown.append(f"{type_name}: unknown instance type in {config.region}{hint}")
            tried.append(unknown[-1])
            continue
        if not zones:
            where = f"zone {nodes.zone}" if nodes.zone != "auto" else f"any zone of {config.region}"
            request = catalog.on_request(type_name)
            tried.append(f"{type_name}: no stock in {where}"
                         + (f" (a family sold only on request: {request})" if request else ""))
            continue
        nas_zones = zones if nas is None else [z for z in zones if z in nas]
        if not nas_zones:
            tried.append(f"{type_name}: stock in {', '.join(sorted(zones))}, where NAS does not sell "
                         f"roll-cluster:storage.nasStorageType {config.storage.nas_storage_type}")
            continue
        zone = sorted(nas_zones)[0]
        known = catalog.lookup(type_name)
        gpus, model = _gpus_and_model(live.gpus, known)
        if gpus is None:
            tried.append(f"{type_name}: the region reports no GPUs for it")
            continue
        image_id, image_name = _image(config, type_name)
        family = catalog.FAMILIES.get(catalog.family_of(type_name) or "")
        return Placement(
            zone=zone, instance_type=type_name, gpus_per_node=gpus, gpu_model=model,
            bf16=family.bf16 if family else True, price=_price(config, type_name, _live_price(type_name)),
            tried=tuple(tried), image_id=image_id, image_name=image_name, existing=False,
            vswitch_name=vswitch_name(stack),
            nvswitch=catalog.family_of(type_name) in catalog.NVSWITCH_FAMILIES and gpus == 8,
        )
    if len(unknown) == len(nodes.instance_types):
        raise PlacementError(
            "roll-cluster:nodes.instanceTypes: " + "; ".join(unknown) + ("" if unknown[-1].endswith("?") else ".")
            + " Use a type that the region sells "
            "(infra/sources/alibaba/catalog.py lists the known ones). Nothing was created."
        )
    if nodes.zone != "auto":
        _refuse_unknown_zone(config)
    spot_hint = "" if nodes.spot else ", or spot instances (nodes.spot: true), whose stock differs"
    raise PlacementError(
        f"no zone of {config.region} has stock for any of roll-cluster:nodes.instanceTypes:\n  - "
        + "\n  - ".join(tried)
        + f"\nTry other GPU types in nodes.instanceTypes, another region (alicloud:region){spot_hint}"
        + (", or nodes.zone: auto" if nodes.zone != "auto" else "")
        + ". Nothing was created."
    )


def _refuse_unknown_zone(config: ClusterConfig) -> None:
    """A nodes.zone that no type has stock in may be no zone of the region at all (a typo with a zone's shape,
    `cn-hangzhou-q`): then say so with the nearest zone, not "no stock". get_zones without a filter lists the
    region's zones (DescribeZones; TF data_source_alicloud_zones.go); asked only on this failing path."""
    zones = sorted(alicloud.get_zones().ids or [])
    wanted = config.nodes.zone
    if not zones or wanted in zones:
        return
    # Zone ids differ in their last letter: the nearest is the closest letter (cn-hangzhou-q -> ...-k).
    nearest = min(zones, key=lambda zone: (abs(ord(zone[-1]) - ord(wanted[-1])), zone))
    raise PlacementError(
        f"roll-cluster:nodes.zone: {wanted} is no zone of {config.region}; did you mean {nearest}? The zones of "
        f"{config.region}: {', '.join(zones)} (or `auto`: a zone with stock). Nothing was created."
    )


def _nas_zones(config: ClusterConfig) -> set[str] | None:
    """Zones where the cluster's new NAS file system can be created (None: no NAS is created, any zone).

    NAS DescribeZones lists per zone the storage types it sells (alicloud.nas.get_zones, TF
    data_source_alicloud_nas_zones.go), and not every zone sells every type: CreateFileSystem would fail after the
    network exists. Asked once per placement, only for a new cluster (an existing one keeps its NAS)."""
    storage = config.storage
    if not storage.nas or storage.existing_file_system_id:
        return None
    answer = alicloud.nas.get_zones(file_system_type="standard").zones or []
    return {z.zone_id for z in answer
            if any(t.storage_type == storage.nas_storage_type for t in (z.instance_types or []))}


def _live_price(type_name: str) -> Any:
    """The region's description of the type with its pay-as-you-go list price, or None.

    `price` is filled only with sorted_by="Price" (pulumi_alicloud ecs/outputs.py, the `price` docstring), for
    which the provider asks BSS GetPayAsYouGoPrice (TF data_source_alicloud_instance_types.go): an account
    without billing-read permission (AliyunBSSReadOnlyAccess) gets an error. The price is information, so any
    failure is a warning and the catalog's labelled estimate stands in.
    See verified-facts#placement-instance-types-2.
    """
    try:
        answer = alicloud.ecs.get_instance_types(
            instance_type=type_name, instance_charge_type="PostPaid", sorted_by="Price",
        ).instance_types
    except Exception as error:  # the price only; its absence is stated in the plan and the output's basis
        pulumi.log.warn(
            f"no live price for {type_name} (the price look-up needs billing read permission, e.g. "
            f"AliyunBSSReadOnlyAccess): {str(error).splitlines()[0][:300]}; the catalog's estimate is shown instead"
        )
        return None
    return answer[0] if answer else None


def _gpus_and_model(live: Sequence[object] | None, known: catalog.GpuInstanceType | None) -> tuple[int | None, str]:
    # pulumi-alicloud 4.x returns `gpus` as a list of {amount: str, category: str}; the live answer wins.
    if live:
        amount = sum(int(getattr(g, "amount", 0) or 0) for g in live)
        category = str(getattr(live[0], "category", "") or (known.family.gpu_model if known else "GPU"))
        if amount > 0:
            return amount, category
    if known:
        return known.gpus, known.family.gpu_model
    return None, ""


def _price(config: ClusterConfig, type_name: str, live: Any) -> Price:
    """Never empty: the live list price with the account's currency, else the catalog's estimate.

    Spot: Alibaba bills the market price, which no data source of the provider reports (there is no spot price
    history data source in pulumi_alicloud 4.0). What is shown is the ceiling: `SpotAsPriceGo` bids up to the
    pay-as-you-go price ("A price that is based on the highest Pay-As-You-Go instance", pulumi_alicloud
    ecs/instance.py), `SpotWithPriceLimit` up to nodes.spotPriceLimit.
    """
    nodes = config.nodes
    amount = _number(getattr(live, "price", None) if live is not None else None)
    if amount is not None:
        currency, known_currency = _currency(type_name)
        basis = "live pay-as-you-go list price of the region"
        if not known_currency:
            basis += " (currency assumed: the provider's price carries none and Cloud Control did not answer)"
    else:
        estimate = catalog.estimated_price(type_name)
        amount, currency = estimate, "CNY"
        basis = ("estimate from the program's catalog (cn-hangzhou list prices, 2025): the region reported no "
                 "live price")
    if nodes.spot:
        if nodes.spot_price_limit is not None and nodes.spot_price_limit < amount:
            amount = nodes.spot_price_limit
            basis = "spot: at most nodes.spotPriceLimit per instance; the market price is usually lower"
        else:
            basis = ("spot: at most the pay-as-you-go price (" + basis + "); the market price, which no data "
                     "source reports, is usually much lower")
    return Price(per_instance=round(amount, 4), currency=currency, basis=basis)


def _currency(type_name: str) -> tuple[str, bool]:
    """The account's billing currency from Cloud Control's price answer (`currency`: CNY, USD or JPY).

    The BSS list price behind get_instance_types is in the account's currency (China site: CNY; international
    site: USD; UNCONFIRMED as an explicit Alibaba statement), but the data source drops it, so Cloud Control's
    GetPrice for the same type is asked for it. Its failure (API not enabled, no permission) is no reason to fail
    the update: CNY is then assumed and the plan says so.
    """
    try:
        prices = alicloud.cloudcontrol.get_prices(
            product="ECS", resource_code="Instance",
            desire_attributes={"InstanceType": type_name, "PaymentType": "PayAsYouGo"},
        ).prices or []
    except Exception:  # only the currency's source; its absence is stated in the plan
        return "CNY", False
    currency = str(getattr(prices[0], "currency", "") or "") if prices else ""
    return (currency, True) if currency else ("CNY", False)


def _number(text: object) -> float | None:
    try:
        value = float(str(text)) if text not in (None, "") else None
    except ValueError:
        return None
    return value if value is not None and value > 0 else None


def _image(config: ClusterConfig, type_name: str) -> tuple[str, str]:
    if config.nodes.image is not None:
        return _custom_image(config, type_name)
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


def _custom_image(config: ClusterConfig, type_name: str) -> tuple[str, str]:
    """nodes.image: a custom image (baked by nodes.bake, or one with the driver for gpuDriver: preinstalled) or a
    Marketplace one."""
    image = _own_image(config, type_name)
    return image.id, image.name


# Who may own nodes.image: the account itself, another account that shared it, or the Marketplace. get_images needs
# one of name_regex, owners or image_owner_id (TF data_source_alicloud_images.go AtLeastOneOf; `owners` allows
# system, self, others, marketplace:), so each owner is asked in turn.
# see verified-facts#placement-images
IMAGE_OWNERS = ("self", "others", "marketplace")
# Its `status` filter defaults to "Available" and takes one value (:55-59): an image still being made is only
# found by asking for these.
NOT_READY_STATUSES = ("Creating", "Waiting")


def _own_image(config: ClusterConfig, type_name: str | None = None) -> Any:
    image_id = config.nodes.image
    for owners in IMAGE_OWNERS:
        images = alicloud.ecs.get_images(image_id=image_id, owners=owners, instance_type=type_name).images
        if images:
            return images[0]
    for status in NOT_READY_STATUSES:
        for owners in IMAGE_OWNERS:
            if alicloud.ecs.get_images(image_id=image_id, owners=owners, status=status).images:
                raise PlacementError(
                    f"roll-cluster:nodes.image: {image_id} is {status}, not Available yet (an image is usable once "
                    "a snapshot of every disk is made); run again when it is. Nothing was created."
                )
    raise PlacementError(
        f"roll-cluster:nodes.image: no image {image_id} in {config.region}"
        + (f" that {type_name} can boot" if type_name else "")
        + " (images are regional: bake in this region, copy the image here, or share it with this account); "
        "leave nodes.image out to boot from nodes.osImage. Nothing was created."
    )


def image_data_disk(config: ClusterConfig) -> tuple[str, int, str] | None:
    """The data-disk snapshot (id, GB, device) of nodes.image, or None. A baked image carries the head's data disk
    (Docker's images are on it when nodes.dataDiskGb > 0): the nodes' data disks are made from that snapshot, each
    at the device of the image's mapping, so that it sets the size of the disk ECS makes from the image.

    The device names of DescribeImages' disk mappings (/dev/xvda for the system disk) are the convention of the
    API's examples; that the system disk is always `...a` is UNCONFIRMED.
    """
    if config.nodes.image is None:
        return None
    for mapping in getattr(_own_image(config), "disk_device_mappings", None) or []:
        device, snapshot = str(getattr(mapping, "device", "") or ""), getattr(mapping, "snapshot_id", None)
        if snapshot and device and not device.endswith("a"):
            size = int(float(getattr(mapping, "size", 0) or 0))
            if config.nodes.data_disk_gb == 0:
                raise PlacementError(
                    f"roll-cluster:nodes.dataDiskGb: the image {config.nodes.image} carries a {size} GB data disk "
                    f"(Docker's images are on it); set nodes.dataDiskGb to at least {max(size, 100)}; got 0. "
                    "Nothing was created."
                )
            return str(snapshot), size, device
    return None
