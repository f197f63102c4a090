"""`roll-cluster:container`: the training image and the container started from it on every node."""

from __future__ import annotations

import difflib
import re
from typing import Literal

from pydantic import Field, field_validator

from infra.config import values
from infra.config.base import Section, _problem, _shown
from infra.sources.alibaba import regions

DEFAULT_ROLL_IMAGE = "roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-24.05-py3-torch260-vllm084"
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


# Every ACR endpoint, public or VPC: the region it names must be a region (a typo there hangs every pull).
_ACR_HOSTS = (
    re.compile(r"registry(?:-vpc)?\.(?P<region>[a-z0-9-]+)\.aliyuncs\.com"),
    re.compile(r"crpi-[a-z0-9]+(?:-vpc)?\.(?P<region>[a-z0-9-]+)\.personal\.cr\.aliyuncs\.com"),
    re.compile(r"[a-z0-9-]+-registry(?:-vpc)?\.(?P<region>[a-z0-9-]+)\.cr\.aliyuncs\.com"),
)


def acr_region(host: str) -> str | None:
    """The region an ACR endpoint host names (public or VPC), or None when the host is not one."""
    for pattern in _ACR_HOSTS:
        match = pattern.fullmatch(host)
        if match:
            return match.group("region")
    return None


def acr_vpc_region(host: str) -> str | None:
    """The region of an ACR VPC endpoint host, or None when the host is not one."""
    for pattern in _ACR_VPC_HOSTS:
        match = pattern.fullmatch(host)
        if match:
            return match.group("region")
    return None


SHM_FLOOR_MB = 1024
SHM_CEILING_MB = 4 * 1024 * 1024


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
        description="Compressed size of the training image in GB, for the plan's pull-time estimate; it wins over "
        "the registry's manifest. null: the plan reads the size from the image's manifest in its registry "
        "(anonymously, over HTTPS; docs/performance.md, 'The image's size'), and where it cannot (no network, a "
        "private image) uses the known size of the default images (infra/image_path.py, estimates), else 20.",
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
    pull_cache: Literal["auto", "on", "off"] = Field(
        "auto",
        description="A cache of the training image inside the VPC (a plain distribution registry on the head, "
        "filled from the image's registry with one fetch per layer, plus one fan-out cache on a worker for every 16 "
        "nodes beyond the head's, filled from the head's): the image's "
        "registry serves each layer once per cluster instead of once per node, and the nodes pull from the cache "
        "over the VPC (plain HTTP on port 5000, open only inside the cluster's security group). `auto`: on above 32 "
        "nodes pulling an image from the region's Container Registry over the VPC (not with nodes.image, not for "
        "an image pinned by digest, not over the public IPs, where the cache's fill would come over the head's "
        "public IP): where 33 nodes' pulls at a stock 35 MB/s each exceed the 10 Gbit/s OSS cap behind most "
        "regions' registries (docs/performance.md, 'The pull cache'). `on`: from 2 nodes, any registry. "
        "`off`: every node pulls from the registry. "
        "Every node lists its cache's address in daemon.json's insecure-registries; on a running node a change of "
        "it (the cache turned on or off, the cluster grown or shrunk across 32 nodes) is applied by a reload of "
        "dockerd (SIGHUP), never a restart: a running training container keeps running.",
    )
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

    @field_validator("image")
    @classmethod
    def _registry_region(cls, image: str) -> str:
        host = image.split("/", 1)[0] if "/" in image else ""
        region = acr_region(host)
        if region is not None and not regions.is_region(region):
            close = difflib.get_close_matches(region, regions.REGIONS, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise _problem(f"names an Alibaba Cloud Container Registry in an unknown region {region}{hint}: the pull "
                           f"would never reach it; got {_shown(image)}")
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
        canonical = match.group(1) + match.group(2).lower()
        megabytes = int(match.group(1)) * (1024 if canonical.endswith("g") else 1)
        # Below 1 GiB NCCL and Ray fail in odd ways (and on own hosts the remount would shrink a working /dev/shm);
        # above 4 TiB no machine has the memory behind it.
        if not SHM_FLOOR_MB <= megabytes <= SHM_CEILING_MB:
            raise _problem(f"must be between 1g and 4096g (/dev/shm of the host is sized to it); got {_shown(size)}")
        return canonical

    @field_validator("registry_username")
    @classmethod
    def _username(cls, name: str | None) -> str | None:
        if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}", name):
            raise _problem(f"must be a registry user name (letters, digits and ._@+-); got {_shown(name)}")
        return None if name is None else values.registry_user(name)

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
