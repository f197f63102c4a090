"""The bootstrap schedule as a graph: earliest finish of every node step, from the dependencies the program
declares (infra/node/steps.py records them) and the duration of each kind of step on the path the nodes take.

Used by the offline plan, the tests and the benchmark: nodes bootstrap in parallel, the image pull overlaps the
driver installation, the critical path does not grow with the node count, and the time to a running job on each
of three paths:

- new:       a new node from the public OS image: the driver installer at first boot, the image pulled at the
             rate its path allows (infra/image_path.py: the public IP's inbound cap, or the VPC);
- in-region: the same with the image in the user's Container Registry in the region, pulled over the VPC;
- baked:     a node booted from a baked custom image (nodes.image): every bootstrap step finds its work done.

Where the figures come from (docs/performance.md, 'Benchmarks'):
- MEASURED_SECONDS: measured here by `python3 dev.py bench steps` (bench/steps_bench.py): the node scripts on a
  node where everything is already installed (the baked path), and the Ray and job steps on the real-host tier.
- NEW_NODE_MINUTES: nominal figures from the reference notes (driver auto-install "10 to 20 minutes", Alibaba's
  doc) and typical installs; not measured (no cloud here).
- The instance's boot (the cloud's part) is nominal on every path: INSTANCE_BOOT_MINUTES (UNCONFIRMED).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from infra.config import ClusterConfig
from infra.image_path import VPC_PULL_MBPS, image_path, pull_minutes
from infra.node.steps import StepRecord

Path = Literal["new", "in-region", "baked"]
PATHS: tuple[Path, ...] = ("new", "in-region", "baked")

INSTANCE_BOOT_MINUTES = 2.0  # RunInstances to sshd answering; nominal (UNCONFIRMED)
DRIVER_INSTALL_MINUTES = 15.0  # Alibaba's auto-install "may take 10 to 20 minutes" (reference, section 2.2)

# Measured by bench/steps_bench.py on the 2-core development machine while other work ran on it (seconds, median
# of 3 runs, 2026-11-23). Node steps: the real scripts on a node where the driver, Docker, the toolkit and the
# image are present (the baked path), with stand-ins only for what cannot run here (package manager, systemd,
# dockerd, GPU), plus one SSH session (0.57 s, measured on the real-host tier) each. Ray and job: the project's
# steps over SSH on the real-host tier (3 network-namespace hosts, real sshd, Ray 2.48.0); the job step includes
# its 10 s watch for an immediate failure.
MEASURED_SECONDS: Mapping[str, float] = {
    "prepare-host": 0.13 + 0.57,
    "docker": 0.68 + 0.57,
    "pull-image": 0.06 + 0.57,
    "gpu-ready": 0.12 + 0.57,
    "ray-head": 33.8,
    "ray-worker": 11.0,
    "ray-ready": 6.4,
    "job": 24.5,
}

# Minutes on a new node (nominal). "pull-image" comes from the image path instead; the Ray and job steps from
# MEASURED_SECONDS on every path (they do the same work wherever the node came from).
NEW_NODE_MINUTES: Mapping[str, float] = {
    "prepare-host": 1.0,  # cloud-init, mkfs of the data disk, the NFS client
    "docker": 2.0,  # Docker CE and the NVIDIA toolkit from Alibaba's mirrors
    "gpu-ready": 2.0,  # after both the pull and the driver: the reboot and nvidia-smi
    "image": 0.1,
    "container": 0.5,
    "code": 5.0,  # clone the framework, pip install its requirements into the container
    "reward-server": 3.0,
    "bake-prep": 5.0,  # the requirements installed in a throw-away container and committed (nodes.bake)
    "bake-image": 10.0,  # CreateImage: a snapshot of every disk; no documented figure (UNCONFIRMED)
}

# Minutes on a node booted from a baked image where not measured: the container start (no dockerd here) and the
# code step, which finds the checkout and the committed requirements and only lets pip confirm them (UNCONFIRMED).
BAKED_NODE_MINUTES: Mapping[str, float] = {
    "image": 0.1,
    "container": 0.5,
    "code": 0.5,
}


@dataclass(frozen=True)
class Profile:
    """How the nodes of one path spend their time."""

    path: Path = "new"
    pull_minutes: float = 15.0  # the image pull on a new node
    driver_install: bool = True  # the driver installer runs from first boot

    def minutes(self, step: str) -> float:
        if step in MEASURED_SECONDS and (self.path == "baked" or step.startswith(("ray-", "job"))):
            return MEASURED_SECONDS[step] / 60.0
        if self.path == "baked" and step in BAKED_NODE_MINUTES:
            return BAKED_NODE_MINUTES[step]
        if step == "pull-image":
            return self.pull_minutes
        return NEW_NODE_MINUTES.get(step, 0.0)

    @property
    def driver_minutes(self) -> float:
        return DRIVER_INSTALL_MINUTES if self.driver_install and self.path != "baked" else 0.0


# What a step does on a node booted from a baked image instead of its work (the plan prints it).
BAKED_SKIPS: Mapping[str, str] = {
    "driver": "first boot finds the driver working (nvidia-smi lists the GPUs): installer not started",
    "prepare-host": "data disk from the image's snapshot already has its filesystem and fstab entry: no mkfs",
    "docker": "Docker CE, the NVIDIA toolkit and the nvidia runtime present, dockerd running: nothing installed",
    "pull-image": "the training image is on the disk: pull skipped",
    "gpu-ready": "no installer ran, so no reboot: the first probe sees the GPUs",
    "code": "checkout present, requirements already in the committed image: pip only confirms them",
}


@dataclass(frozen=True)
class Schedule:
    finish: dict[str, float]  # step key -> earliest finish (minutes after `pulumi up` starts)
    critical_path: list[str]
    profile: Profile = field(default_factory=Profile)

    @property
    def total(self) -> float:
        return max(self.finish.values()) if self.finish else 0.0

    def step_minutes(self, key: str) -> float:
        """How long one step of the schedule takes (the virtual <node>/driver step included)."""
        step = key.split("/", 1)[1]
        return self.profile.driver_minutes if step == "driver" else self.profile.minutes(step)


def schedule(records: Iterable[StepRecord], profile: Profile | None = None) -> Schedule:
    profile = profile or Profile()
    by_key = {r.key: r for r in records}
    finish: dict[str, float] = {}
    previous: dict[str, str | None] = {}
    driver_done = INSTANCE_BOOT_MINUTES + profile.driver_minutes

    def visit(key: str, trail: tuple[str, ...] = ()) -> float:
        if key in finish:
            return finish[key]
        if key in trail:
            raise ValueError(f"dependency cycle: {' -> '.join((*trail, key))}")
        record = by_key[key]
        start, before = INSTANCE_BOOT_MINUTES, None
        for dependency in record.depends_on:
            done = visit(dependency, (*trail, key))
            if done > start:
                start, before = done, dependency
        # The driver installer starts at first boot (user data), on its own: a virtual step gpu-ready waits for.
        if record.step == "gpu-ready" and driver_done > start:
            start, before = driver_done, f"{record.node}/driver"
        finish[key] = start + profile.minutes(record.step)
        previous[key] = before
        return finish[key]

    for key in by_key:
        visit(key)
    last = max(finish, key=lambda k: finish[k]) if finish else None
    path: list[str] = []
    while last is not None:
        path.append(last)
        last = previous.get(last)
    return Schedule(finish, list(reversed(path)), profile)


def profiles(config: ClusterConfig) -> dict[Path, Profile]:
    """The three paths for a stack: its image's own path, the same image over the VPC, and a baked image."""
    image = image_path(config)
    driver = config.nodes.gpu_driver == "auto-install"
    return {
        "new": Profile("new", image.minutes, driver),
        "in-region": Profile("in-region", pull_minutes(image.size_gb, VPC_PULL_MBPS), driver),
        "baked": Profile("baked", 0.0, False),
    }


def configured_path(config: ClusterConfig) -> Path:
    """The path this stack's nodes take as configured."""
    if config.nodes.image is not None:
        return "baked"
    return "in-region" if image_path(config).kind == "vpc" else "new"
