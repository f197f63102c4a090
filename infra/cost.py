"""The whole cost of a cluster, as the `cost` stack output and the plan show it: what bills while it runs, while it
is paused (nodes.paused or autostop: StopCharging), and after `pulumi destroy`, each figure with its currency and
its source.

The instance price is the placement's (the region's list price or the catalog's estimate, infra/sources/alibaba/
placement.py `_price`). Disks, NAS, public traffic and snapshots have no price data source in pulumi_alicloud 4.0:
the rates below are estimates of the China site's pay-as-you-go list prices (cn-hangzhou) and are labelled so
(UNCONFIRMED: not read from a price API; Cloud Control GetPrice could answer them per region).
"""

from __future__ import annotations

from typing import Any

from infra.config import ClusterConfig

HOURS_PER_MONTH = 730.0
RATE_SOURCE = "estimate: China-site list price, cn-hangzhou, UNCONFIRMED (no price API asked)"
ESSD_PL1_CNY_PER_GB_MONTH = 1.0  # cloud_essd PL1 (UNCONFIRMED)
# The data disk's class (nodes.dataDiskCategory, nodes.dataDiskPerformanceLevel), CNY per GB and month. An ESSD AutoPL
# disk's baseline is billed as a PL1 ESSD of its size ("The baseline performance and pricing of an ESSD AutoPL disk
# is equivalent to ... a PL1 ESSD", https://alibabacloud.com/help/en/ecs/user-guide/essd-autopl-disks, Dec 2024,
# reference [28]); PL0, PL2 and PL3 at half, twice and four times PL1 (UNCONFIRMED: from memory of the China site's
# list, no price API asked).
DATA_DISK_CNY_PER_GB_MONTH = {"PL0": 0.5, "PL1": ESSD_PL1_CNY_PER_GB_MONTH, "PL2": 2.0, "PL3": 4.0,
                              "cloud_auto": ESSD_PL1_CNY_PER_GB_MONTH}
# AutoPL burst is billed per use, by the burst I/O (same page, "Billing"); its rate is UNCONFIRMED here, and what a
# pull uses of it depends on the image: the plan names it as an extra it cannot bound.
BURST_NOTE = ("AutoPL performance burst billed per use (by the I/O above the baseline; rate UNCONFIRMED, the plan "
              "cannot bound it: a pull bursts for minutes per node)")


def data_disk_class(config: ClusterConfig) -> str:
    """The data disk's class in words: `ESSD PL1`, `ESSD AutoPL with burst`."""
    nodes = config.nodes
    if nodes.data_disk_category == "cloud_auto":
        return "ESSD AutoPL" + (" with burst" if nodes.data_disk_burst else " without burst")
    return f"ESSD {nodes.data_disk_performance_level or 'PL1'}"


def _data_disk_rate(config: ClusterConfig) -> float:
    nodes = config.nodes
    key = "cloud_auto" if nodes.data_disk_category == "cloud_auto" else nodes.data_disk_performance_level or "PL1"
    return DATA_DISK_CNY_PER_GB_MONTH[key]
NAS_CNY_PER_GB_MONTH = {"Capacity": 0.35, "Performance": 1.85, "Premium": 1.85}  # by used GB (UNCONFIRMED)
# A baked image's snapshots, by the blocks written (never-written blocks are not billed; 5 GiB free per month):
# "the price per GiB for snapshot storage is the same as that for the OSS Standard storage class"
# (alibabacloud.com/help/doc-detail/56159.htm); the snapshot billing page's example prices a standard snapshot in
# cn-hangzhou at USD 0.0173 per GB-month (alibabacloud.com/help/en/ecs/snapshots-1), about 0.12 CNY
# (docs/performance-sources.md [43]). Regional list prices: the ECS pricing page's Snapshot tab (not asked here).
SNAPSHOT_CNY_PER_GB_MONTH = 0.12
TRAFFIC_CNY_PER_GB = 0.8  # outbound public traffic, PayByTraffic (UNCONFIRMED)


def baked_image_cost(config: ClusterConfig) -> tuple[int, float]:
    """(GB at most, CNY per month at most) of keeping an image baked from this stack's head: the snapshots of its
    system and data disks, billed by the blocks written, so the disks' sizes bound it."""
    size = config.nodes.system_disk_gb + config.nodes.data_disk_gb
    return size, size * SNAPSHOT_CNY_PER_GB_MONTH


def _disk_gb(config: ClusterConfig) -> int:
    return (config.nodes.system_disk_gb + config.nodes.data_disk_gb) * config.nodes.count


def cost_summary(config: ClusterConfig, hourly_price: dict[str, Any], economical: bool = True) -> dict[str, Any]:
    """The `cost` output of an Alibaba stack: running, paused and after-destroy figures and when autostop fires.
    economical: whether the instance type's family has economical mode (infra/economical.py); without it a stopped
    instance keeps billing its compute, so pausing saves nothing on the instances."""
    currency = str(hourly_price.get("currency", "CNY"))
    instances = float(hourly_price.get("amount") or 0.0)
    disk_gb = _disk_gb(config)
    system_gb = config.nodes.system_disk_gb * config.nodes.count
    data_gb = config.nodes.data_disk_gb * config.nodes.count
    monthly = system_gb * ESSD_PL1_CNY_PER_GB_MONTH + data_gb * _data_disk_rate(config)
    disks = round(monthly / HOURS_PER_MONTH, 2)
    data_class = data_disk_class(config) if data_gb else "no data disk"
    extras = [BURST_NOTE] if data_gb and config.nodes.data_disk_burst else []
    nas_rate = NAS_CNY_PER_GB_MONTH.get(config.storage.nas_storage_type) if config.storage.nas else None
    nas_note = (f"NAS {config.storage.nas_storage_type}: {nas_rate} CNY per used GB and month ({RATE_SOURCE})"
                if nas_rate is not None else "no NAS")
    kept: list[str] = []
    if config.storage.nas and (config.storage.retain_on_destroy or config.storage.existing_file_system_id):
        kept.append(nas_note + " (kept on destroy: delete it in the NAS console when done)")
    if config.nodes.bake:
        kept.append(f"baked image: snapshots of about {config.nodes.system_disk_gb + config.nodes.data_disk_gb} GB, "
                    f"{SNAPSHOT_CNY_PER_GB_MONTH} CNY per GB and month ({RATE_SOURCE}); bakedImageId")
    return {
        "currency": currency,
        "running": {
            "perHour": round(instances + (disks if currency == "CNY" else 0.0), 2),
            "instances": {"perHour": instances, "source": hourly_price.get("basis")},
            "disks": {"perHour": disks, "currency": "CNY", "gb": disk_gb, "source": RATE_SOURCE,
                      "classes": f"system ESSD PL1 {system_gb} GB, data {data_class} {data_gb} GB"
                      + (f" ({_data_disk_rate(config):g} CNY per GB and month)" if data_gb else ""),
                      "extras": extras},
            "nas": nas_note,
            "publicTraffic": f"{TRAFFIC_CNY_PER_GB} CNY per GB out ({RATE_SOURCE}); inbound is free",
        },
        "paused": {
            "perHour": disks if economical else round(instances + (disks if currency == "CNY" else 0.0), 2),
            "currency": "CNY" if economical else currency,
            "keepsBilling": ("" if economical else "instances (compute and GPUs: this family has no economical "
                             "mode), ") + f"disks ({disk_gb} GB ESSD), {nas_note}"
            + ("; baked image snapshots" if config.nodes.bake else ""),
            "stopsBilling": "instances (compute and GPUs) and the public IP (released under StopCharging)"
            if economical else "nothing but the running job: this instance family has no economical mode "
            "(StopCharging), so a stopped instance keeps billing (infra/economical.py)",
            "restart": "needs the instance type in stock in the zone again; the public IPs may change"
            if economical else "keeps the instances' resources and public IPs",
            "source": RATE_SOURCE,
        },
        "afterDestroy": kept or ["nothing: every resource is deleted"],
        "autostop": autostop_note(config),
    }


def autostop_note(config: ClusterConfig) -> str:
    """When autostop fires, in words (the plan and the `cost` output)."""
    auto = config.nodes.autostop
    if not auto.enabled:
        if config.nodes.capabilities.existing_machines:
            return "off: nothing stops the job on your hosts"
        return "off (nodes.autostop.afterJobMinutes: 0): the cluster bills until `pulumi destroy` or nodes.paused"
    what = ("stops the job (own hosts: never the machines)" if not config.nodes.capabilities.autostop_stops_machines
            else "stops every instance of this stack (StopCharging)")
    when = []
    if auto.after_job_minutes:
        when.append(f"{auto.after_job_minutes} min after the job ended")
    if auto.idle_minutes:
        when.append(f"after {auto.idle_minutes} min with no job and idle GPUs")
    return f"{what} {' or '.join(when)}"
