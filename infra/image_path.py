"""Where the training image comes from, and how long its pull takes at the node's bandwidth.

A node pulls the image either over the VPC (the user's Container Registry in the node's region, through its VPC
endpoint) or over its public IP. Facts (verified-facts#image-path-vpc-endpoint):

- A pay-by-traffic public IP's outbound cap is at most 100 Mbit/s, and inbound (what a pull uses) equals outbound
  above 10 Mbit/s, else 10 Mbit/s (alibabacloud.com/help/doc-detail/40634.htm, doc-detail/419460.htm). Inbound
  traffic is free. Caps are upper limits, not guarantees.
- ACR Personal Edition VPC endpoints: `registry-vpc.<region>.aliyuncs.com` (instances before 9 Sep 2024) and
  `crpi-<id>-vpc.<region>.personal.cr.aliyuncs.com` (newer). Enterprise Edition instances are reached over the VPC
  only once the VPC is in the instance's ACL (acr/user-guide/configure-access-over-vpcs), at the VPC host
  `<instance>-registry-vpc.<region>.cr.aliyuncs.com` (Alibaba's Terraform provider,
  website/docs/r/cr_storage_domain_routing_rule.html.markdown: `instance_domain =
  "${alicloud_cr_ee_instance.default.instance_name}-registry-vpc.cn-hangzhou.cr.aliyuncs.com"`;
  docs/verified-facts.md 4).
- Layers pulled through a VPC endpoint come from OSS's internal same-region endpoint
  (acr/user-guide/custom-image-pull-oss-domain-routing-rules).
- Pulls from outside China (Docker Hub, GCR, Quay) from mainland regions "can fail due to network issues"
  (acr/user-guide/subscribe-to-image-tags); the per-account Docker Hub accelerator's current scope is UNCONFIRMED.

The VPC pull rate is not a documented Alibaba figure (UNCONFIRMED there): a pull over the VPC is bounded by the
node's layer decompression and extraction rather than the network; public measurements of a stock `docker pull` of
10-20 GB ML images give 17-40 MB/s (verified-facts#image-path-vpc-endpoint: moby #21814, Alibaba's
Compute Nest verl template, Tensorfuse, Union.ai), so 35 MB/s (280 Mbit/s) is used. With many nodes the registry's
shared backend bounds it further (devtools/schedule.py).

Image sizes are compressed sizes (what a pull downloads). The plan (`python3 dev.py plan <stack>`) reads the
training image's size from its registry's manifest (devtools/registry.py, infra/image_manifest.py: the linux/amd64
manifest's layers plus its config blob) and passes it here as `manifest_gb`; `container.imageSizeGb` set by the
user wins over it (the plan then does not ask). When the manifest cannot be read (no network, a private image: no
credentials are sent, a missing tag, a slow or malformed answer; `--no-registry`), the plan says why and uses the
estimate: the known sizes below (UNCONFIRMED estimates), else DEFAULT_IMAGE_SIZE_GB. The bench (bench/) and the
program never ask a registry: their figures use the estimates, so they are reproducible.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from infra.config import ClusterConfig, acr_vpc_region

VPC_PULL_MBPS = 280.0  # 35 MB/s: a stock docker pull of a large ML image (see above)
DEFAULT_IMAGE_SIZE_GB = 20.0
# Compressed sizes of images the shipped stacks use, found by repository and tag wherever they are copied to
# (pattern -> GB). Estimates: the "20-30 GB" for ROLL's images; NGC PyTorch and verl's vLLM images are
# around 10-15 GB (UNCONFIRMED).
KNOWN_IMAGE_SIZES_GB: tuple[tuple[re.Pattern[str], float], ...] = (
    (re.compile(r"(^|/)pytorch:nvcr-"), 25.0),  # ROLL's images (roll-registry.../roll/pytorch:nvcr-24.05-...)
    (re.compile(r"(^|/)nvidia/pytorch:"), 12.0),  # NGC PyTorch
    (re.compile(r"(^|/)verl:"), 15.0),  # verlai/verl
)
# A public-IP pull above this many minutes is worth a warning in the plan.
SLOW_PULL_MINUTES = 10.0

_ALIBABA_REGISTRY = re.compile(r".*\.aliyuncs\.com")


@dataclass(frozen=True)
class ImagePath:
    host: str  # the image's registry host (docker.io for Docker Hub)
    kind: Literal["vpc", "public"]
    size_gb: float
    size_known: bool  # from container.imageSizeGb, the manifest or the table, not the default
    rate_mbps: float  # what the pull gets: the VPC rate, or the public IP's inbound cap
    outside_china: bool  # a registry outside China pulled from a mainland region
    size_source: Literal["config", "manifest", "estimate"] = "estimate"  # container.imageSizeGb, the plan's look-up

    @property
    def size_text(self) -> str:
        """The size for the plan's lines: a manifest's exact size to 0.1 GB, the others as configured."""
        if self.size_source == "manifest":
            return f"{self.size_gb:.1f}".removesuffix(".0")
        return f"{self.size_gb:g}"

    @property
    def minutes(self) -> float:
        return minutes_at_rate(self.size_gb, self.rate_mbps)

    def describe(self) -> str:
        size = f"{self.size_text} GB" + ("" if self.size_known else " (assumed; set container.imageSizeGb)")
        if self.kind == "vpc":
            return (f"{size} from {self.host} over the VPC (ACR VPC endpoint; a stock docker pull, about "
                    f"{self.rate_mbps:g} Mbit/s): {self.minutes:.1f} min per node alone, more when many nodes share "
                    "the registry's backend")
        return (f"{size} from {self.host} over each node's public IP at {self.rate_mbps:g} Mbit/s: "
                f"{self.minutes:.1f} min per node")


def minutes_at_rate(size_gb: float, rate_mbps: float) -> float:
    """Minutes to move size_gb (10^9 bytes) at rate_mbps (10^6 bit/s)."""
    return size_gb * 8000.0 / rate_mbps / 60.0


def inbound_mbps(outbound_mbps: int) -> float:
    """A pay-by-traffic public IP's inbound cap: the outbound cap above 10 Mbit/s, else 10 (reference section 4)."""
    return float(max(10, outbound_mbps))


def image_size_gb(config: ClusterConfig) -> tuple[float, bool]:
    if config.container.image_size_gb is not None:
        return config.container.image_size_gb, True
    for pattern, size in KNOWN_IMAGE_SIZES_GB:
        if pattern.search(config.container.image):
            return size, True
    return DEFAULT_IMAGE_SIZE_GB, False


def image_path(config: ClusterConfig, manifest_gb: float | None = None) -> ImagePath:
    """The image's path; manifest_gb: the size the plan read from the registry's manifest (None: not read), which
    container.imageSizeGb overrides."""
    host = config.container.registry_host
    size, known = image_size_gb(config)
    source: Literal["config", "manifest", "estimate"] = "estimate"
    if config.container.image_size_gb is not None:
        source = "config"
    elif manifest_gb is not None:
        size, known, source = manifest_gb, True, "manifest"
    over_vpc = acr_vpc_region(host) == config.region
    return ImagePath(
        host=host,
        kind="vpc" if over_vpc else "public",
        size_gb=size,
        size_known=known,
        rate_mbps=VPC_PULL_MBPS if over_vpc else inbound_mbps(config.nodes.internet_bandwidth_mbps),
        outside_china=(config.region or "").startswith("cn-") and not _ALIBABA_REGISTRY.fullmatch(host),
        size_source=source,
    )


def in_region_host(config: ClusterConfig) -> str:
    """The ACR Personal Edition VPC endpoint of the stack's region (what the plan suggests)."""
    return f"registry-vpc.{config.region}.aliyuncs.com"


def warnings(config: ClusterConfig, manifest_gb: float | None = None) -> list[str]:
    """What the plan warns about the image's path (empty when it comes over the VPC)."""
    path = image_path(config, manifest_gb)
    lines: list[str] = []
    if path.kind == "public" and not config.nodes.image and path.minutes >= SLOW_PULL_MINUTES:
        lines.append(
            f"the {path.size_text} GB image comes over each node's public IP at {path.rate_mbps:g} Mbit/s "
            f"(nodes.internetBandwidthMbps; 100 is the pay-by-traffic maximum): about {path.minutes:.0f} min per "
            f"node. Copy it once into your Container Registry in {config.region} and use its VPC endpoint "
            f"({in_region_host(config)}/<namespace>/<repo>:<tag>; docs/performance.md, 'The in-region image path'), "
            "or boot from a baked image (nodes.image)."
        )
    if path.outside_china:
        lines.append(
            f"{path.host} is outside China: Alibaba Cloud notes that pulls from such registries into mainland "
            "regions can fail (acr/user-guide/subscribe-to-image-tags); copy the image into your Container "
            f"Registry in {config.region}."
        )
    return lines
