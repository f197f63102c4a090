"""The pull cache in the time-to-first-step model (devtools/schedule.py): whether the program builds it
(infra/pull_cache.py's choice), its fill and a node's pull through it, and the step graph with or without it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from devtools.schedule_figures import constant
from devtools.schedule_rates import (
    NO_OPTIONS,
    Options,
    Path,
    disk_bound_mbyte_s,
    disk_mbyte_s,
    registry_backend_gbit_s,
    transfer_minutes,
)
from infra import pull_cache
from infra.config import ClusterConfig
from infra.image_path import image_path
from infra.node.steps import StepRecord


def cache_used(config: ClusterConfig, path: Path, nodes: int) -> bool:
    """Whether the program builds the pull cache for `nodes` nodes on `path` (infra/pull_cache.py's choice, with the
    image in the region's registry on the in-region path)."""
    if path == "warm" or nodes < 2 or "@" in config.container.pull_image:
        return False
    setting = config.container.pull_cache
    if setting != "auto":
        return setting == "on"
    over_vpc = path == "in-region" or image_path(config).kind == "vpc"
    return nodes > pull_cache.AUTO_ABOVE and over_vpc


def cache_minutes(config: ClusterConfig, path: Path, nodes: int, options: Options = NO_OPTIONS,
                  image_gb: float | None = None) -> tuple[float, float, str]:
    """(the cache step: the head's fill and then the fan-out caches', one node's pull through its cache, how): the
    head fetches every blob cache-fill-fetches times from the registry (over the VPC at its NIC or the backend's cap,
    over its public IP on the new path) and writes it once to its data disk; each fan-out cache does the same from
    the head, all sharing the head's NIC; a node then pulls at its own rate or its share of its cache's NIC."""
    image = image_path(config, image_gb)
    size, fetches = image.size_gb, constant("cache-fill-fetches")
    nic = constant("cache-nic") * 1000.0 / 8.0  # MB/s
    if path == "new" and image.kind == "public":
        upstream = min(image.rate_mbps / 8.0, nic)
    else:
        upstream = min(nic, registry_backend_gbit_s(config) * 1000.0 / 8.0)
    disk = disk_mbyte_s(config, options)
    head = max(transfer_minutes(fetches * size, upstream), transfer_minutes(size, disk))
    caches = len(pull_cache.layout(nodes).caches)
    fan_out = 0.0
    if caches > 1:
        fan_out = max(transfer_minutes((caches - 1) * fetches * size, nic), transfer_minutes(size, disk))
    node_rate = min(constant("tuned-pull") if options.tuned_pull else constant("vpc-pull"),
                    disk_bound_mbyte_s(config, options))
    served = min(nodes, pull_cache.NODES_PER_CACHE)
    pull = max(transfer_minutes(size, node_rate), transfer_minutes(served * size, nic))
    plural = "" if fetches == 1 else "es"
    how = (f"the head's cache fills from the registry ({fetches:g} fetch{plural} per blob at {upstream:g} MB/s, "
           f"{head:.1f} min)" + (f", then {caches - 1} fan-out caches from the head's ({fan_out:.1f} min)"
                                 if caches > 1 else "")
           + f"; each node pulls through its cache, {served} nodes per cache: {pull:.1f} min")
    return head + fan_out, pull, how


def without_cache(config: ClusterConfig) -> ClusterConfig:
    """The stack with container.pullCache off (the plan's comparison row)."""
    return config.model_copy(update={"container": config.container.model_copy(update={"pull_cache": "off"})})


def with_cache(records: Sequence[StepRecord], used: bool) -> list[StepRecord]:
    """The step graph with the head's pull-cache step before every pull (used), or without it: the program's choice
    at a node count other than the recorded one."""
    key = "node-0/pull-cache"
    kept = [r for r in records if r.key != key]
    kept = [replace(r, depends_on=tuple(d for d in r.depends_on if d != key)) for r in kept]
    if not used:
        return kept
    cache = StepRecord("node-0", "pull-cache", "remote", ("pull_cache.sh",), ("node-0/prepare-host",),
                       "node-0-pull-cache")
    return [cache, *(replace(r, depends_on=(*r.depends_on, key)) if r.step == "pull-image" else r for r in kept)]
