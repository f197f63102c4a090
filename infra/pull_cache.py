"""The cache of the training image inside the VPC (container.pullCache): whether the stack uses one, which nodes
run a cache and which cache each node pulls through. Registers nothing; components/bootstrap.py builds the steps
(infra/scripts/pull_cache.sh, pull_image.sh) and devtools/schedule.py models the time.

Why a plain distribution registry (`docker-registry` on Debian/Ubuntu, `docker-distribution` on EL-family systems)
filled by the program's own copier (infra/scripts/pull_cache_fill.py, over the registry HTTP API): the registry is
the reference one, packaged by the distributions whose mirrors the nodes already use, a single static binary with no
database; the copier speaks to any registry (ACR, Docker Hub: Basic or Bearer-token auth) with the upstream's
credentials in its own environment only, and fetches each blob from the upstream exactly once per fill. The
registry's proxy mode fetches a missing blob twice (a background store beside the stream to the client) and again
for every request that comes while it is in flight (see verified-facts#pull-cache-fill). Dragonfly needs a
scheduler, a seed peer, a manager and dockerd's HTTP proxy with its own CA; overlaybd needs containerd's image store
and an ACR EE instance (reference, performance-frontier "Techniques usable on plain ECS + Docker").

How the nodes use it:
- The head runs the cache and, before anything pulls through it, fills it: the image's platform manifest read from
  the registry, every blob the cache lacks streamed from one GET into an upload to the cache, then the manifest put
  under the tag. A second fill (a resumed cluster) fetches no blob; a new tag copies only its new blobs.
- Above NODES_PER_CACHE nodes, fan-out caches on evenly spaced workers fill the same way from the head's cache;
  every node pulls through one cache (the head's own pull too), named in the image reference (dockerd's
  registry-mirrors applies to Docker Hub only), then tags the image with the name the rest of the program uses.
- The caches speak plain HTTP on PORT inside the security group (its intra-cluster rule; never the admin CIDRs):
  every node lists exactly its cache's address in daemon.json's insecure-registries. The registry takes pushes
  from anyone who reaches it there (it has no auth): the security group is what keeps others out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.config import ClusterConfig
from infra.image_path import image_path

PORT = 5000  # the distribution registry's own default; outside Ray's ports (6379, 8265, 10001, 10002-19999)
# auto: on above this many nodes, for an image pulled over the VPC (the region's ACR). At a stock pull of 35 MB/s per
# node (infra/image_path.py), 33 nodes draw 9.2 Gbit/s, about the 10 Gbit/s OSS cap behind the registry in
# cn-hangzhou and most mainland regions (reference, performance-frontier); below it each node's own rate bounds its
# pull and a cache would only add a hop. Not for an image pulled over the public IPs: the cache's fill would come
# over the head's public IP (at most 100 Mbit/s), as long as one node's direct pull before any node could start its
# own (the fill fetches each blob once: tests/e2e/test_pull_cache.py), for no gain over pulling directly.
AUTO_ABOVE = 32
# Nodes one cache serves (itself included): a 2-GPU gn6v's VPC bandwidth, about 5 Gbit/s (an estimate between the
# 2.5 and 10 Gbit/s of the 1- and 4-GPU types, reference [27]), over a stock pull's 35 MB/s (0.28 Gbit/s) per node
# is 17.9 nodes; 16 keeps every cache's NIC below its limit with the smallest multi-GPU V100 head.
NODES_PER_CACHE = 16
DATA_SUBDIR = "pull-cache"  # under the data disk's mount (or /var/lib without one)


@dataclass(frozen=True)
class CachePlan:
    """Which nodes run a cache and which cache every node pulls through (indices into the cluster's nodes)."""

    caches: tuple[int, ...]  # node indices that run a cache; caches[0] is the head (0), the others fan-out caches
    pulls_from: tuple[int, ...]  # per node: the index of the node whose cache it pulls through

    def upstream_of(self, node: int) -> int | None:
        """The node whose cache a fan-out cache fills from (the head's); None for the head's (the registry)."""
        return None if node == 0 else 0


def why_not(config: ClusterConfig) -> str | None:
    """Why the stack pulls without a cache (None: it uses one)."""
    setting = config.container.pull_cache
    if setting == "off":
        return "container.pullCache is off"
    if config.nodes.image is not None:
        return "the nodes boot from a baked image (nodes.image): nothing is pulled"
    if "@" in config.container.pull_image:
        return ("the image is pinned by digest: a digest reference cannot be tagged with the program's name after "
                "a pull through the cache")
    if config.nodes.count < 2:
        return "one node: nothing to share"
    if setting == "auto" and config.nodes.count <= AUTO_ABOVE:
        return f"{config.nodes.count} nodes, at most {AUTO_ABOVE}: each node's own pull rate bounds its pull"
    if setting == "auto" and image_path(config).kind != "vpc":
        return ("the image comes over the nodes' public IPs: the cache would fill over the head's public IP, as long "
                "as one node's pull (copy the image into your ACR in the region: docs/performance.md)")
    return None


def plan_for(config: ClusterConfig) -> CachePlan | None:
    """The cache layout of the stack's nodes, or None without a cache."""
    if why_not(config) is not None:
        return None
    return layout(config.nodes.count)


def layout(nodes: int) -> CachePlan:
    """ceil(nodes / NODES_PER_CACHE) caches, the head's first, the fan-out caches on evenly spaced workers; node i
    pulls through cache i // NODES_PER_CACHE (so each cache serves at most NODES_PER_CACHE nodes, itself included)."""
    count = max(1, math.ceil(nodes / NODES_PER_CACHE))
    caches = tuple(i * NODES_PER_CACHE for i in range(count))
    return CachePlan(caches=caches, pulls_from=tuple(caches[i // NODES_PER_CACHE] for i in range(nodes)))


def upstream(pull_image: str) -> tuple[str, str]:
    """(the upstream registry's URL for the head's cache, the repository path and tag the nodes pull through it).
    Docker Hub's registry answers at registry-1.docker.io; its official images live under `library/`."""
    first, _, rest = pull_image.partition("/")
    is_host = bool(rest) and ("." in first or ":" in first or first == "localhost")
    if is_host and first not in ("docker.io", "index.docker.io"):
        return f"https://{first}", rest
    path = rest if is_host else pull_image
    if "/" not in path.split(":", 1)[0]:
        path = f"library/{path}"
    return "https://registry-1.docker.io", path


def cache_dir(data_mount: str | None) -> str:
    return f"{data_mount}/{DATA_SUBDIR}" if data_mount else f"/var/lib/roll-cluster/{DATA_SUBDIR}"
