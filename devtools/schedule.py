"""Time from `pulumi up` to the first training step, modelled: the bootstrap step graph the program declares
(infra/node/steps.py records it), the duration of each step on the path the nodes take, the image pull as
max(size / the node's rate, concurrent nodes x size / the registry backend's rate), Pulumi's parallelism (node
bootstraps in waves when it is below the node count), the model's download or read and the framework's start-up.

Three paths (the plan prints each at 2, 16, 64 and 256 nodes, with its critical path):

- new:       a new cluster as configured: the image pulled over its path (infra/image_path.py), the driver
             installer at first boot, and the model from the framework's hub: with shared storage the head's `model`
             step downloads it once (beside the code step and Ray, before the job) and every node reads it from
             the shared storage at start-up; without, every node downloads it on the first job;
- in-region: a new cluster with the image in the user's Container Registry in the region (pulled over the VPC at a
             stock `docker pull` rate) and the model already on the shared storage (a second job, or staged);
- warm:      nodes booted from a baked image (nodes.image): every bootstrap step finds its work done; the model in
             the cache on the shared storage (or the data disk). The data disk is made from the image's snapshot and
             loads from OSS on its first read [7]: the framework's start reads part of the training image's extracted
             files there (and the weights, where they are on that disk), at a first-read rate no source gives; with
             snapshot prefetch (an option) there is no such penalty.

`RESUME` is the other warm path: the same nodes started again after an economical-mode stop (nodes.paused removed).
Its disks are the ones they had (no first read from OSS); every node step runs again because the node's public IP
changed and finds its work done; Docker restarts the container at boot and the container's main process starts Ray
from its record, so the Ray steps find it running; every node's weights-prefetch reads the weights again (the page
cache is empty); the job is submitted again and the framework loads its newest checkpoint (docs/performance.md).

The node's pull rate is bounded by its disk: a pull moves about `pull-io-factor` x the compressed layers through
it, so a rate above the disk's throughput / that factor is capped (a 200 GiB ESSD PL1, 220 MB/s, caps it at 55 MB/s).

`OPTIONS` applies the modelled techniques of the performance notes (maintained base image with the driver, tuned
pulls on an AutoPL data disk with burst, P2P above a node count, requirements in the image, snapshot prefetch);
most are modelled, not implemented (docs/performance.md says which). Every constant is in `CONSTANTS`, with its
source or labelled ASSUMPTION; the sources' [n] tags are listed in docs/performance-sources.md.

`minutes_to_first_step(config, records)` is the figure for the stack as configured (path, node count, parallelism).
`image_gb` (profile_for, first_step, minutes_to_first_step): the image's compressed size the plan read from the
registry's manifest (devtools/registry.py); None, as in the bench, uses infra/image_path.py's estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from devtools.schedule_cache import cache_minutes, cache_used, with_cache, without_cache
from devtools.schedule_figures import (
    BAKED_NODE_MINUTES,
    BASE_IMAGE_STEPS,
    CONSTANTS,
    JOB_WATCH_SECONDS,
    MEASURED_SECONDS,
    MEASURED_STATE,
    NEW_NODE_MINUTES,
    Constant,
    constant,
)
from devtools.schedule_rates import (
    NO_OPTIONS,
    NO_SNAPSHOT_PREFETCH,
    OPTIONS,
    OPTIONS_ON_STACK_DISK,
    RESUME,
    RESUMED,
    Options,
    Path,
    disk_bound_mbyte_s,
    disk_mbyte_s,
    pull_minutes,
    registry_backend_gbit_s,
    transfer_minutes,
)
from infra import model_cache, parallelism
from infra.config import ClusterConfig
from infra.image_path import ImagePath, image_path, inbound_mbps
from infra.node.steps import StepRecord

PATHS: tuple[Path, ...] = ("new", "in-region", "warm")
NODE_COUNTS: tuple[int, ...] = (2, 16, 64, 256)
# The figures live in devtools/schedule_figures.py, the rates and options in schedule_rates.py, the pull cache's
# terms in schedule_cache.py; the plan, the bench and the tests read them here as well.
__all__ = [
    "BAKED_NODE_MINUTES",
    "BASE_IMAGE_STEPS",
    "CONSTANTS",
    "JOB_WATCH_SECONDS",
    "MEASURED_SECONDS",
    "MEASURED_STATE",
    "NEW_NODE_MINUTES",
    "NO_OPTIONS",
    "NO_SNAPSHOT_PREFETCH",
    "OPTIONS",
    "OPTIONS_ON_STACK_DISK",
    "RESUME",
    "RESUMED",
    "Constant",
    "Options",
    "Path",
    "cache_minutes",
    "cache_used",
    "constant",
    "disk_bound_mbyte_s",
    "disk_mbyte_s",
    "pull_minutes",
    "registry_backend_gbit_s",
    "transfer_minutes",
    "with_cache",
    "without_cache",
]




@dataclass(frozen=True)
class Profile:
    """How the nodes of one path spend their time, and what comes after the job's submission."""

    path: Path = "new"
    pull_minutes: float = 15.0  # the image pull on one node, alone on the backend
    driver_install: bool = True  # the driver installer runs from first boot
    baked: bool = False  # every bootstrap step finds its work done (nodes.image)
    base_image: bool = False  # option: driver, Docker and the toolkit in the boot image
    requirements_in_image: bool = False  # option: the code step only confirms the requirements
    boot_minutes: float = CONSTANTS["boot"].value
    preamble_minutes: float = CONSTANTS["preamble"].value
    model_minutes: float = 0.0  # every node's download or read of the weights after the job's submission
    model_how: str = ""
    prefetch_minutes: float = 0.0  # the head's model step (shared storage): one download, or finding it cached
    prefetch_how: str = ""
    page_cache_minutes: float = 0.0  # every node's weights-prefetch step (shared storage): its read of the cache
    page_cache_how: str = ""
    framework_minutes: float = 0.0
    first_read_minutes: float = 0.0  # the framework's start reading the image's files from a disk not yet loaded
    first_read_how: str = ""
    resumed: bool = False  # the same nodes started again after an economical-mode stop (RESUME)
    checkpoint_minutes: float = 0.0  # the resumed job's read of its newest checkpoint
    checkpoint_how: str = ""
    state_write_minutes: float = 0.0  # Pulumi's checkpoint saves (self-managed backend), before the job's step ends
    dataset_minutes: float = 0.0  # the job's dataset download before its start (verl's preparation on the head)
    dataset_how: str = ""
    cache_fill_minutes: float = 0.0  # the pull cache's step (the head's fill, then the fan-out caches'), if any
    cache_how: str = ""

    def minutes(self, step: str) -> float:
        if self.resumed and step in RESUMED_MINUTES:
            return RESUMED_MINUTES[step]
        if step in MEASURED_SECONDS and (
            self.baked or step.startswith(("ray-", "job")) or (self.base_image and step in BASE_IMAGE_STEPS)
        ):
            seconds = MEASURED_SECONDS[step] - (JOB_WATCH_SECONDS if step == "job" else 0.0)
            return seconds / 60.0
        if self.baked and step in BAKED_NODE_MINUTES:
            return BAKED_NODE_MINUTES[step]
        if step == "code" and self.requirements_in_image:
            return BAKED_NODE_MINUTES["code"]
        if step == "pull-image":
            return self.pull_minutes
        if step == "model":
            return self.prefetch_minutes
        if step == model_cache.PREFETCH_STEP:
            return self.page_cache_minutes
        if step == "weights":
            return self.model_minutes
        if step == "start-up":
            return self.framework_minutes
        if step == "first-read":
            return self.first_read_minutes
        if step == "checkpoint":
            return self.checkpoint_minutes
        if step == "state-writes":
            return self.state_write_minutes
        if step == "pull-cache":
            return self.cache_fill_minutes
        if step == "dataset":
            return self.dataset_minutes
        return NEW_NODE_MINUTES.get(step, 0.0)

    def restarted(self, step: str) -> float | None:
        """On a resumed node, when Ray is back by itself (minutes after boot): Docker restarts the container at boot
        (restart unless-stopped, components/bootstrap.py) and its main process (container_main.sh) looks for its
        raylet at once and then every supervision interval, and starts Ray from the record: the head at once (the
        measured head start), a worker at its first look after the head's GCS answers (at most one interval later,
        then the measured join). None where no restart applies."""
        if not self.resumed or step not in ("ray-head", "ray-worker"):
            return None
        head = MEASURED_SECONDS["ray-head"]
        if step == "ray-head":
            return head / 60.0
        return (head + constant("ray-supervise-interval") + MEASURED_SECONDS["ray-worker"]) / 60.0

    @property
    def driver_minutes(self) -> float:
        return constant("driver") if self.driver_install and not self.baked and not self.base_image else 0.0


# What each step does when the nodes are started again after an economical-mode stop (nodes.paused removed;
# `python3 -m companion resume`), and how long it takes then. Every remote step's connection names the node's public
# IP, which the start changes, so pulumi-command runs each again (an update re-runs `create`); the docker provider's
# host changes too, but the image and the container keep their inputs and their identity (the instance id:
# replacement_trigger), so neither is touched. tests/offline/test_fast_nodes.py checks this list against the offline
# cloud.
RESUMED_STEPS: Mapping[str, str] = {
    "prepare-host": "runs again (new public IP): disk, fstab and mounts in place, nothing to do",
    "docker": "runs again: packages, runtime and dockerd in place (dockerd started at boot), no restart",
    "pull-image": "runs again: the image is on the disk, no pull",
    "gpu-ready": "runs again (its HOST changed): no installer, no reboot, the first probe sees the GPUs",
    "image": "not touched: same inputs, same instance",
    "container": "not touched: Docker restarted it at boot (restart unless-stopped)",
    "code": "runs again: the same container id in its marker, so it verifies the checkout and skips pip",
    "ray-head": "runs again: Ray is already back (the container's main process started it from its record at boot) "
                "with the settings asked for, so it leaves it as it is",
    "ray-worker": "runs again: pauses the container's supervision; finds the worker rejoined by itself (once the "
                  "head answered) and leaves it, or, coming first, joins it itself",
    "ray-ready": "runs again: waits until every node and GPU is registered",
    "model": "runs again: finds the model in the shared cache",
    model_cache.PREFETCH_STEP: "runs again (it carries the node's start time): the page cache is empty after the "
                               "stop, so every node reads the weights again",
    "job": "runs again (it carries the head's start time): submits the job, which loads its newest checkpoint",
}
RESUMED_MINUTES: Mapping[str, float] = {
    "image": 0.0,
    "container": 0.0,  # its restart is part of the boot (dockerd starts it)
    "code": constant("resume-code"),
    "ray-head": MEASURED_SECONDS["ray-head-found"] / 60.0,
    "ray-worker": MEASURED_SECONDS["ray-worker-found"] / 60.0,
}

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
    waves: int = 1  # node bootstraps one after another in this many groups (Pulumi's parallelism)
    took: dict[str, float] = field(default_factory=dict)  # steps whose duration differs from the profile's

    @property
    def total(self) -> float:
        return max(self.finish.values()) if self.finish else 0.0

    def step_minutes(self, key: str) -> float:
        """How long one step of the schedule takes (the virtual driver, wait, model and start-up steps included)."""
        if key == "preamble":
            return self.profile.preamble_minutes
        if key == "boot":
            return self.profile.boot_minutes
        step = key.split("/", 1)[1]
        if step == "driver":
            return self.profile.driver_minutes
        if step in ("slot", "ray-restart"):  # waits that start at boot
            return self.finish[key] - self.profile.preamble_minutes - self.profile.boot_minutes
        return self.took.get(key, self.profile.minutes(step))


def schedule(records: Iterable[StepRecord], profile: Profile | None = None, worker_start: float | None = None,
             to_first_step: bool = False) -> Schedule:
    """Earliest finish of every step. Nodes other than node-0 start their steps at worker_start (minutes after
    boot; a later wave of Pulumi's parallelism), else at boot. to_first_step adds the model and the framework's
    start-up after the job's submission."""
    profile = profile or Profile()
    by_key = {r.key: r for r in records}
    booted = profile.preamble_minutes + profile.boot_minutes
    driver_done = booted + profile.driver_minutes
    finish: dict[str, float] = {"preamble": profile.preamble_minutes, "boot": booted}
    previous: dict[str, str | None] = {"preamble": None, "boot": "preamble"}
    took: dict[str, float] = {}

    def visit(key: str, trail: tuple[str, ...] = ()) -> float:
        if key in finish:
            return finish[key]
        if key in trail:
            raise ValueError(f"dependency cycle: {' -> '.join((*trail, key))}")
        record = by_key[key]
        start, before = booted, "boot"
        if record.node != "node-0" and worker_start is not None and worker_start > 0:
            wait = f"{record.node}/slot"
            finish[wait], previous[wait] = booted + worker_start, "boot"
            start, before = finish[wait], wait
        for dependency in record.depends_on:
            done = visit(dependency, (*trail, key))
            if done > start:
                start, before = done, dependency
        duration = profile.minutes(record.step)
        # A resumed node's Ray comes back by itself after boot (virtual step ray-restart). The Ray step pauses the
        # container's supervision and takes its lock (ray_common.sh pause_ray_supervision), so a restart under way
        # finishes first; then it finds Ray running with the settings asked for and leaves it. The head's step
        # always finds it (its restart starts at boot); a worker's step that comes first joins by itself.
        restarted = profile.restarted(record.step)
        if restarted is not None:
            back_at = booted + restarted
            join = MEASURED_SECONDS[record.step] / 60.0
            if record.step == "ray-worker" and start + join < max(start, back_at) + duration:
                duration = took[key] = join
            elif back_at > start:
                back = f"{record.node}/ray-restart"
                finish[back], previous[back] = back_at, "boot"
                start, before = back_at, back
        # The driver installer starts at first boot (user data), on its own: a virtual step gpu-ready waits for.
        if record.step == "gpu-ready" and driver_done > start:
            driver = f"{record.node}/driver"
            finish[driver], previous[driver] = driver_done, "boot"
            start, before = driver_done, driver
        finish[key] = start + duration
        previous[key] = before
        return finish[key]

    for key in by_key:
        visit(key)
    job = next((k for k in by_key if by_key[k].step == "job"), None)
    if to_first_step and job is not None:
        submitted = job
        if profile.state_write_minutes > 0:  # Pulumi's saves, served one at a time, hold the steps up to the job's
            finish["node-0/state-writes"] = finish[job] + profile.state_write_minutes
            previous["node-0/state-writes"], submitted = job, "node-0/state-writes"
        if profile.dataset_minutes > 0:  # the job's data, downloaded on the head before the training starts
            finish["node-0/dataset"] = finish[submitted] + profile.dataset_minutes
            previous["node-0/dataset"], submitted = submitted, "node-0/dataset"
        finish["node-0/weights"], previous["node-0/weights"] = finish[submitted] + profile.model_minutes, submitted
        last_read = "node-0/weights"
        # Where they apply: the image's files read from a disk not yet loaded from OSS (warm, no snapshot prefetch),
        # and the resumed job's checkpoint; both during the framework's start, before its first step.
        for step, minutes in (("first-read", profile.first_read_minutes), ("checkpoint", profile.checkpoint_minutes)):
            if minutes > 0:
                finish[f"node-0/{step}"], previous[f"node-0/{step}"] = finish[last_read] + minutes, last_read
                last_read = f"node-0/{step}"
        finish["node-0/start-up"] = finish[last_read] + profile.framework_minutes
        previous["node-0/start-up"] = last_read
    last = max(finish, key=lambda k: finish[k]) if finish else None
    path: list[str] = []
    while last is not None:
        path.append(last)
        last = previous.get(last)
    return Schedule(finish, list(reversed(path)), profile, took=took)


# ------------------------------------------------------------------------------------------- node count and paths
default_parallel = parallelism.default_slots
waves = parallelism.waves


def framework_start_minutes(config: ClusterConfig, nodes: int) -> float:
    """The framework's start-up at `nodes` nodes: the 2-node build-up, plus framework-start-growth per doubling of
    the ranks beyond 16 (an assumption: nothing measures it at scale)."""
    ranks = nodes * (config.nodes.gpus_per_node or 8)
    doublings = max(0.0, math.log2(ranks / 16.0))
    return constant("framework-start") + doublings * constant("framework-start-growth")


def api_wait_minutes(nodes: int) -> float:
    """The last instance's wait for the ECS API: past ecs-api-per-minute calls, a throttled RunInstances (or
    StartInstances) waits for the next minute."""
    return float((max(nodes, 1) - 1) // int(constant("ecs-api-per-minute")))


def state_resources(nodes: int) -> int:
    return int(MEASURED_STATE["resources-fixed"] + MEASURED_STATE["resources-per-node"] * nodes)


def state_megabytes(nodes: int) -> float:
    """The stack's state at `nodes` nodes (MEASURED_STATE), in MB."""
    return (MEASURED_STATE["kb-fixed"] + MEASURED_STATE["kb-per-node"] * nodes) / 1000.0


def state_write_minutes(nodes: int) -> float:
    """Pulumi's checkpoint saves during the `up` with a self-managed backend (`pulumi login --local`, a bucket):
    every created resource saves the whole state twice, one save at a time, so a step waits behind the saves of the
    steps that ended with it. Nodes move through their steps together, so the saves add to the path rather than
    hide behind it. The state grows from its fixed part to its full size as resources are created: the mean save
    is half way. Quadratic in the node count: the reason a large stack needs a small state (or Pulumi Cloud's
    journal, or PULUMI_SKIP_CHECKPOINTS at its risk: docs/performance.md)."""
    mean_mb = (MEASURED_STATE["kb-fixed"] / 1000.0 + state_megabytes(nodes)) / 2.0
    saves = state_resources(nodes) * constant("state-writes-per-step")
    return saves * mean_mb / constant("state-write-rate") / 60.0


def scale_minutes(config: ClusterConfig, nodes: int) -> float:
    """The terms that grow with the node count alone, whatever the path: the ECS API's throttling, Pulumi's state
    saves and the start-up's growth with the ranks."""
    growth = framework_start_minutes(config, nodes) - constant("framework-start")
    return api_wait_minutes(nodes) + state_write_minutes(nodes) + growth


def _download(config: ClusterConfig, nodes: int) -> tuple[float, str]:
    """`nodes` nodes downloading the model at once from the framework's hub (model_cache.framework_hub): ModelScope's
    in-cloud endpoint in its regions (a share of the backend when many), else each node's public IP."""
    size = constant("model-size")
    hub = model_cache.framework_hub(config)
    who = "the head" if nodes == 1 else "every node"
    if model_cache.intra_cloud_region(config) and hub == "modelscope":
        rate = constant("modelscope-intra-cloud")
        shared = nodes * size * 8.0 / constant("registry-backend") / 60.0
        return max(transfer_minutes(size, rate), shared), f"{who} from ModelScope in-cloud ({rate:g} MB/s)"
    source = "ModelScope" if hub == "modelscope" else config.model_source
    rate = min(constant("hub-public"), inbound_mbps(config.nodes.internet_bandwidth_mbps) / 8.0)
    return transfer_minutes(size, rate), f"{who} from {source} over its public IP ({rate:g} MB/s, best case)"


def _prefetch(config: ClusterConfig, path: Path) -> tuple[float, str]:
    """The head's model step (with shared storage, infra/model_cache.py): one download on a new cluster, finding the
    files on the others (a second job, or a cache kept on the file system)."""
    if not model_cache.shared_cache(config):
        return 0.0, ""
    if path == "new":
        minutes, how = _download(config, 1)
        return minutes, f"{how} into the shared storage, beside the code step and Ray"
    return constant("model-check"), "finds the model in the shared cache (one listing of the repository)"


def _nas_read(per_node_gb: float, total_gb: float) -> float:
    """Every node reading per_node_gb from the shared storage at once (total_gb in all): one client's rate, or the
    nodes' share of the file system's read cap."""
    return max(transfer_minutes(per_node_gb, constant("client-read")), transfer_minutes(total_gb, constant("nas-read")))


def _shared_read(nodes: int) -> float:
    """Every node reading the model from the shared storage at once."""
    return _nas_read(constant("model-size"), nodes * constant("model-size"))


def _local_read(loaded: bool = True) -> float:
    """One node reading the model from its own data disk; `loaded` False: a disk just made from a snapshot, whose
    first read loads the data from OSS (no snapshot prefetch)."""
    rate = constant("local-disk") if loaded else min(constant("local-disk"), constant("snapshot-first-read"))
    return transfer_minutes(constant("model-size"), rate)


def _disk_loaded(path: Path, options: Options) -> bool:
    """Whether the nodes' data disks hold their data when first read: a new disk (new, in-region), a disk kept
    through an economical-mode stop (resume) or one made from a prefetched snapshot [7]; not a disk just made from
    the baked image's snapshot without prefetch, which loads from OSS on first read."""
    return path != "warm" or options.snapshot_prefetch or options.resume


def _first_read(config: ClusterConfig, path: Path, options: Options,
                image_gb: float | None = None) -> tuple[float, str]:
    """The part of the training image's extracted files the container start and the framework's imports read, from
    a data disk made from the baked image's snapshot and not yet loaded: at the first-read rate (every node at once,
    each from its own disk). Reading them from a loaded disk is part of the framework's start-up assumption."""
    if _disk_loaded(path, options):
        return 0.0, ""
    size = image_path(config, image_gb).size_gb * constant("image-extracted-ratio") * constant("start-read-fraction")
    rate = constant("snapshot-first-read")
    return transfer_minutes(size, rate), (f"the start reads {size:.1f} GB of the image's files from a disk made from "
                                         f"the snapshot, loading from OSS at {rate:g} MB/s (no snapshot prefetch)")


def _checkpoint(config: ClusterConfig, path: Path, nodes: int, options: Options) -> tuple[float, str]:
    """The resumed job's read of its newest checkpoint: every node its copy of the weights and its share of the
    optimizer states, from the shared storage (the client's rate, or its share of the file system's cap), or from
    its own data disk without shared storage."""
    if not options.resume or path != "warm":
        return 0.0, ""
    weights, optimizer = constant("checkpoint-weights"), constant("checkpoint-optimizer")
    per_node = weights + optimizer / nodes
    if not model_cache.shared_cache(config):
        minutes = transfer_minutes(per_node, constant("local-disk"))
        return minutes, f"every node reads {per_node:.1f} GB from its data disk"
    total = optimizer + nodes * weights
    return _nas_read(per_node, total), (f"every node reads {per_node:.1f} GB of the newest checkpoint from the "
                                        f"shared storage ({total:g} GB in all)")


def _dataset(config: ClusterConfig, path: Path) -> tuple[float, str]:
    """The job's dataset download before its start: verl's preparation on the head (one download from the hub over
    the head's public IP, skipped where the parquets are on the shared storage already); ROLL's data comes with its
    repository (the code step)."""
    framework = config.training.framework
    if framework == "roll":
        return 0.0, "ROLL's data is in its repository (data/*.jsonl): the code step's clone brings it"
    if framework != "verl":
        return 0.0, f"not modelled for {framework} (its data is the user's; UNCONFIRMED how large)"
    if path != "new" and model_cache.shared_cache(config):
        return constant("model-check"), "verl's train.parquet is on the shared storage: preparation skipped"
    rate = min(constant("hub-public"), inbound_mbps(config.nodes.internet_bandwidth_mbps) / 8.0)
    return (transfer_minutes(constant("dataset-verl"), rate),
            f"the head prepares GSM8K ({constant('dataset-verl'):g} GB from the hub at {rate:g} MB/s) before the job")


def _page_cache(config: ClusterConfig, path: Path) -> bool:
    """Whether every node's weights-prefetch step finds the model in the shared cache and leaves it in its page
    cache before the job: with shared storage, when the model is there before the cluster starts (in-region, warm)."""
    return model_cache.shared_cache(config) and path != "new"


def _weights_prefetch(config: ClusterConfig, path: Path, nodes: int, options: Options) -> tuple[float, str]:
    """Every node's weights-prefetch step (infra/scripts/weights_prefetch.sh), beside the pull and the container."""
    if not model_cache.shared_cache(config):
        return 0.0, ""
    if options.model_on_local_disk and path == "warm":
        # The modelled option puts the weights on the baked data disk: the prefetch reads them from there (each node
        # its own disk, so no shared cap), beside the container, Ray and the job's submission; from a disk just made
        # from the snapshot without prefetch, at the first-read rate.
        loaded = _disk_loaded(path, options)
        return _local_read(loaded), ("every node reads the weights from its data disk (baked"
                                     + (", prefetched" if loaded else ", loading from OSS") + ") into its page cache")
    if not _page_cache(config, path):
        return constant("prefetch-empty"), "nothing to prefetch yet (the head's model step downloads it later)"
    return _shared_read(nodes), "every node reads the model from the shared cache into its page cache"


def _model_step(config: ClusterConfig, path: Path, nodes: int, options: Options) -> tuple[float, str]:
    """Every node's download or read of the weights between the job's submission and its start-up."""
    if path == "new" and not model_cache.shared_cache(config):
        # Every node's job processes fetch the weights on the first job, each over its own path.
        return _download(config, nodes)
    if options.model_on_local_disk and path == "warm":
        why = "read from each node's page cache (its weights-prefetch step read the data disk)"
        return constant("page-cache-read"), why
    if not model_cache.shared_cache(config):
        # Caches on the data disks: each node's holds the model from an earlier job.
        return _local_read(), "read from each node's cache on its data disk (an earlier job)"
    if _page_cache(config, path):
        # Every node's weights-prefetch step read it before the job: the framework reads it from memory.
        return constant("page-cache-read"), "read from each node's page cache (its weights-prefetch step read it)"
    # Read from the shared storage by every node at once: the client's rate or its share of the file system's cap.
    return _shared_read(nodes), "read from the cache on the shared storage by every node"


def _pull_rates(config: ClusterConfig, path: Path, options: Options, image: ImagePath) -> tuple[float, float]:
    """A node's pull rate (MB/s; never above what its disk takes) and the shared source's (Gbit/s): the public
    registry's over the public IP on the new path, the region's registry over the VPC otherwise."""
    disk = disk_bound_mbyte_s(config, options)
    if path == "new" and image.kind == "public":
        return min(image.rate_mbps / 8.0, disk), constant("public-source")
    rate = constant("tuned-pull") if options.tuned_pull else constant("vpc-pull")
    return min(rate, disk), registry_backend_gbit_s(config)


def backend_bound_pull(config: ClusterConfig, parallel: int,
                       image_gb: float | None = None) -> tuple[float, float] | None:
    """(one node's pull, the same node alone) in minutes when the stack's nodes pulling at once (as many as Pulumi's
    parallelism lets start together) share the registry's backend so that each takes longer than alone; None when
    they do not, or nothing is pulled (a baked image)."""
    path = configured_path(config)
    if path == "warm" or cache_used(config, path, config.nodes.count):
        return None
    image = image_path(config, image_gb)
    rate, backend = _pull_rates(config, path, NO_OPTIONS, image)
    alone = pull_minutes(image.size_gb, rate, backend, 1, False)
    shared = pull_minutes(image.size_gb, rate, backend, min(config.nodes.count, parallel), False)
    return (shared, alone) if shared > alone else None


def profile_for(config: ClusterConfig, path: Path, nodes: int, parallel: int,
                options: Options = NO_OPTIONS, image_gb: float | None = None) -> Profile:
    image = image_path(config, image_gb)
    pullers = min(nodes, parallel)
    p2p = options.p2p and nodes > constant("p2p-above")
    rate, backend = _pull_rates(config, path, options, image)
    pull = pull_minutes(image.size_gb, rate, backend, pullers, p2p)
    dataset, dataset_how = _dataset(config, path)
    fill, cache_how = 0.0, ""
    if cache_used(config, path, nodes) and not p2p:
        fill, pull, cache_how = cache_minutes(config, path, nodes, options, image_gb)
    model, how = _model_step(config, path, nodes, options)
    prefetch, prefetch_how = _prefetch(config, path)
    page_cache, page_cache_how = _weights_prefetch(config, path, nodes, options)
    driver = config.nodes.gpu_driver == "auto-install"
    first_read, first_read_how = _first_read(config, path, options, image_gb)
    checkpoint, checkpoint_how = _checkpoint(config, path, nodes, options)
    return Profile(
        path=path,
        pull_minutes=0.0 if path == "warm" else pull,
        driver_install=driver,
        baked=path == "warm",
        base_image=options.base_image,
        requirements_in_image=options.requirements_in_image,
        model_minutes=model,
        model_how=how,
        prefetch_minutes=prefetch,
        prefetch_how=prefetch_how,
        page_cache_minutes=page_cache,
        page_cache_how=page_cache_how,
        framework_minutes=framework_start_minutes(config, nodes),
        boot_minutes=(constant("resume-boot") if options.resume else constant("boot")) + api_wait_minutes(nodes),
        state_write_minutes=state_write_minutes(nodes),
        preamble_minutes=constant("resume-preamble") if options.resume else constant("preamble"),
        first_read_minutes=first_read,
        first_read_how=first_read_how,
        resumed=options.resume and path == "warm",
        checkpoint_minutes=checkpoint,
        checkpoint_how=checkpoint_how,
        dataset_minutes=dataset,
        dataset_how=dataset_how,
        cache_fill_minutes=fill,
        cache_how=cache_how,
    )


def template(records: Sequence[StepRecord]) -> list[StepRecord]:
    """The head's steps and one worker's (node-1): every worker of a cluster does what node-1 does."""
    kept = [r for r in records if r.node in ("node-0", "node-1")]
    keys = {r.key for r in kept}
    return [replace(r, depends_on=tuple(d for d in r.depends_on if d in keys)) for r in kept]


def first_step(config: ClusterConfig, records: Sequence[StepRecord], path: Path, nodes: int, parallel: int,
               options: Options = NO_OPTIONS, image_gb: float | None = None) -> Schedule:
    """The schedule to the first training step of `nodes` nodes on `path` with `parallel` Pulumi slots: node-0 in
    the first wave, node-1 standing for a worker of the last one."""
    steps = with_cache(template(records), cache_used(config, path, nodes) and not (options.p2p and
                                                                                   nodes > constant("p2p-above")))
    if path == "warm" or options.base_image:
        # No driver installer, so no reboot: the weights-prefetch overlaps docker and the pull, as the program
        # orders it on a node booted from a baked or maintained image (components/bootstrap.py, prefetch_after).
        steps = [replace(r, depends_on=tuple(d for d in r.depends_on if d.split("/", 1)[1] == "prepare-host"))
                 if r.step == model_cache.PREFETCH_STEP else r for r in steps]
    profile = profile_for(config, path, nodes, parallel, options, image_gb)
    count = waves(nodes, parallel)
    if count == 1 or not any(r.node == "node-1" for r in steps):
        return replace(schedule(steps, profile, to_first_step=True), waves=count)
    # A wave ends when its nodes' last bootstrap step (before Ray) ends; the next wave's nodes start then.
    bootstrap = [r for r in steps if r.node == "node-1" and not r.step.startswith(("ray-", "job"))]
    # The worker's pull waits for the head's cache (when there is one): its steps come along, from boot.
    bootstrap += [r for r in steps if r.key in ("node-0/pull-cache", "node-0/prepare-host")
                  and any(r.key == "node-0/pull-cache" for r in steps)]
    start = 0.0
    for _ in range(count - 1):
        alone = schedule(bootstrap, profile, worker_start=start)
        start = max(alone.finish[r.key] for r in bootstrap) - profile.preamble_minutes - profile.boot_minutes
    return replace(schedule(steps, profile, worker_start=start, to_first_step=True), waves=count)


def configured_path(config: ClusterConfig) -> Path:
    """The path this stack's nodes take as configured."""
    if config.nodes.image is not None:
        return "warm"
    return "in-region" if image_path(config).kind == "vpc" else "new"


def minutes_to_first_step(config: ClusterConfig, records: Sequence[StepRecord], parallel: int | None = None,
                          options: Options = NO_OPTIONS, image_gb: float | None = None) -> float:
    """Modelled minutes from `pulumi up` to the first training step for the stack as configured: its path, its
    node count (config.nodes.count) and Pulumi's parallelism (default: this machine's, default_parallel())."""
    slots = parallel if parallel is not None else default_parallel()[0]
    path = configured_path(config)
    return first_step(config, records, path, config.nodes.count, slots, options, image_gb).total

