"""The rates the time-to-first-step model (devtools/schedule.py) moves bytes at: a node's disk, the region's
registry backend, one node's pull among many, and the modelled options (docs/performance.md, 'Modelled options')
that change them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from devtools.schedule_figures import constant
from infra.config import ClusterConfig
from infra.config.training import is_mainland_region

Path = Literal["new", "in-region", "warm"]


def registry_backend_gbit_s(config: ClusterConfig) -> float:
    """The OSS bandwidth cap behind the region's registry [26]: 100 Gbit/s for downloads in Beijing, Shanghai and
    Shenzhen, 10 in the other mainland regions, 5 outside the mainland."""
    region = config.region or ""
    if region in ("cn-beijing", "cn-shanghai", "cn-shenzhen"):
        return constant("registry-backend-large")
    return constant("registry-backend") if is_mainland_region(region) else constant("registry-backend-abroad")


def transfer_minutes(size_gb: float, mbyte_s: float) -> float:
    """Minutes to move size_gb (10^9 bytes) at mbyte_s (10^6 bytes/s)."""
    return size_gb * 1000.0 / mbyte_s / 60.0


def pull_minutes(size_gb: float, node_mbyte_s: float, backend_gbit_s: float, pullers: int, p2p: bool) -> float:
    """One node's pull while `pullers` nodes pull at once: the node's own rate, or its share of the backend."""
    own = transfer_minutes(size_gb, node_mbyte_s)
    copies = min(pullers, constant("p2p-seed-copies")) if p2p else pullers
    shared = copies * size_gb * 8.0 / backend_gbit_s / 60.0
    return max(own, shared)


@dataclass(frozen=True)
class Options:
    """The modelled techniques (docs/performance.md, 'Modelled options'): which are on."""

    base_image: bool = False  # driver, Docker, the toolkit (and pigz) in a maintained boot image
    tuned_pull: bool = False  # unpigz, more concurrent downloads, a disk that keeps up
    p2p: bool = False  # P2P image distribution above CONSTANTS["p2p-above"] nodes
    requirements_in_image: bool = False
    snapshot_prefetch: bool = False  # the baked disk's data is there at first read [7]
    model_on_local_disk: bool = False  # the weights in the baked data disk (with prefetch)
    resume: bool = False  # the nodes restart from an economical-mode stop: no new resources, disks intact [36b]
    # The data disk the tuned pull assumes (nodes.dataDiskCategory cloud_auto with dataDiskBursting): its burst
    # does not cap the pull. False: the stack's own disk bounds it (disk_mbyte_s / pull-io-factor).
    burst_disk: bool = False


NO_OPTIONS = Options()
OPTIONS = Options(True, True, True, True, True, True, burst_disk=True)
RESUME = Options(True, True, True, True, True, True, resume=True, burst_disk=True)
# What the program builds today for a resume (nodes.paused removed): the same nodes started again, no option.
RESUMED = Options(resume=True)
# The options with the stack's own data disk (PL1 by default): what a tuned pull gets without AutoPL's burst.
OPTIONS_ON_STACK_DISK = replace(OPTIONS, burst_disk=False)
NO_SNAPSHOT_PREFETCH = replace(OPTIONS, snapshot_prefetch=False)  # the options as implementable today (no API)


def disk_mbyte_s(config: ClusterConfig, options: Options = NO_OPTIONS) -> float:
    """The throughput of the disk Docker's images land on: the data disk (nodes.dataDiskCategory, its level and
    size), or the system disk (an ESSD PL1 of nodes.systemDiskGb) without one; AutoPL's burst with the option."""
    nodes = config.nodes  # own hosts: their disks are unknown; the system disk default stands in (no stock cap)
    if options.burst_disk or (nodes.data_disk_gb and nodes.data_disk_burst):
        return constant("autopl-burst")
    size, level = (nodes.data_disk_gb, nodes.data_disk_performance_level or "PL1") if nodes.data_disk_gb else (
        nodes.system_disk_gb, "PL1")
    auto = nodes.data_disk_category == "cloud_auto"
    cap = constant("essd-pl1-max") if auto else constant(f"essd-{level.lower()}-max")
    return min(constant("essd-base") + constant("essd-per-gib") * size, cap)


def disk_bound_mbyte_s(config: ClusterConfig, options: Options = NO_OPTIONS) -> float:
    """The fastest a node can pull onto its disk: the disk's throughput / the pull's I/O factor."""
    return disk_mbyte_s(config, options) / constant("pull-io-factor")
