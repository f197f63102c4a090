"""Where the frameworks cache downloaded models and datasets inside the container, the head's one download of the
job's models before the job (the `model` step), and ModelScope's in-cloud download in the regions that have it.
The cache variables are the container's environment (components/bootstrap.py), so every process of every framework
(the job's driver, Ray's workers, a reward server) sees them.

- With shared storage (storage.nas, nfsServer or sharedHostPath) and a framework whose models the program knows
  (ROLL, verl, OpenRLHF: `JobSpec.models`), the hubs' caches are on the shared storage: huggingface_hub's
  `HF_HUB_CACHE` at /mnt/shared/cache/huggingface/hub and ModelScope's `MODELSCOPE_CACHE` at
  /mnt/shared/cache/modelscope. The head's `model` step (components/training_job.py, infra/scripts/model_fetch.sh)
  downloads the job's models there once, through the hub client the framework itself calls, before the job step
  and beside the code and Ray steps; every node's framework then finds the files and downloads nothing, and so
  does a second job of the same model, on this cluster or the next one that mounts the same file system.
- Why the head alone, first: the NAS is mounted NFSv3 with `nolock` (prepare_host.sh NAS_MOUNT_OPTIONS), so the
  hubs' file locks (huggingface_hub's `filelock` on `.locks/<repo>/<etag>.lock`, file_download.py at
  0.36.0) exclude only processes of the same node (nfs(5), nfs-utils utils/mount/nfs.man: local locks "provide
  exclusion only against other applications running on the same client"). Without the step, every node's workers
  would write the same `<blob>.incomplete` files at once on the first job.
- No offline switch for the job. On a cache hit huggingface_hub (0.36.0) writes nothing a reader depends on:
  hf_hub_download asks the server for the file's metadata and returns the cached pointer (file_download.py),
  rewriting `refs/<revision>` only when it changed; snapshot_download rewrites
  `refs/<revision>` with the same commit (_snapshot_download.py). `HF_HUB_OFFLINE=1` would close that
  last gap (a model whose `main` moved between the step and the job's load is downloaded again by every node at
  once), but it blocks every repository type, the datasets the jobs load from the Hub among them (OpenRLHF's
  PPOTrainer, a Ray actor on any node, loads `data.prompt_dataset` through `datasets`, openrlhf/trainer/
  ppo_trainer.py at v0.10.2; verl's data preparation). The step runs again before every new job (its
  triggers hold the job id), so the cache follows the hub's `main` up to the job's start. ModelScope's hub client
  documents no process-wide offline switch (UNCONFIRMED for the images' versions). The lines cited are
  huggingface_hub 0.36.0's, the last 0.x (transformers 4.x requires <1.0); OpenRLHF 0.10.2 requires >=1.0, whose
  cache-hit writes are UNCONFIRMED.
- `HF_HOME` stays on the node's data disk (/data/cache/huggingface): the token, `datasets`' processed Arrow cache
  (`HF_DATASETS_CACHE`, written under its own file locks) and the Xet chunk cache are per node, only the hub's file
  cache is shared (huggingface_hub constants.py: `HF_HUB_CACHE` overrides `$HF_HOME/hub`).
- Every node's `weights-prefetch` step (host side, infra/scripts/weights_prefetch.sh) reads the complete files of
  the job's models already in the shared caches into the node's page cache before the job, beside the pull and the
  container, so the framework reads them from memory rather than every node reading the NAS at once at start-up.
  It reads only, finds nothing on a new cluster (the model step downloads later) and is bounded (PREFETCH_TIMEOUT_S,
  half the host's MemAvailable).
- Without shared storage, or for `custom` and MindSpeed-RL jobs (the program does not know their models), the caches
  stay on each node's data disk, `/data/cache/...`, as before: no shared file system, no concurrent writers, and a
  head-first download would only serve the head; each node's framework downloads its own copy on the first job, and
  a new container (new image, changed NAS) or a second job finds the files.
- A changed cache location is a changed container environment: the containers are recreated once (Ray restarts),
  and a model cached on the data disks before is downloaded once more into the shared cache.
- ModelScope's in-cloud acceleration: cloud instances get OSS-internal download URLs when their region has it.
  ModelScope's docs (`models/advanced-usage/cloud-accelerator/cloud-accelerator_CN.md`) list Hangzhou, Shanghai,
  Beijing, Zhangjiakou, Wulanchabu and US (Silicon Valley, us-west-1); all models in Hangzhou, Zhangjiakou and
  Wulanchabu, selected ones elsewhere; the region is detected automatically or set with
  `INTRA_CLOUD_ACCELERATION_REGION` (the hub client's newer name: `MODELSCOPE_DOWNLOAD_INTRA_CLOUD_REGION`,
  modelscope/hub/constants.py `ENV_INTRA_CLOUD_REGION`, deprecated name kept). The program sets both in those
  regions, so the detection (which may fail in a container) does not decide. Used where the job downloads from
  ModelScope (`training.modelSource: modelscope`; ROLL's default download type); with `hf-mirror` the configured
  mirror stays. Whether the docs' advance registration ("报备") is needed for an ECS account is UNCONFIRMED.

How each framework fetches a model named by id, at the pinned refs (what the step reproduces):
- ROLL 8eb27cc: download_model (roll/utils/checkpoint_manager.py) uses a directory as it is, else the
  snapshot_download registered for MODEL_DOWNLOAD_TYPE (default MODELSCOPE; the YAML's model_download_type
  sets it, roll/configs/base_config.py): ModelScope's or huggingface_hub's, local_dir
  None, so into MODELSCOPE_CACHE or HF_HUB_CACHE.
- verl v0.7.0: copy_to_local leaves a hub id as it is (verl/utils/fs.py, only hdfs:// is copied) and
  transformers' from_pretrained downloads it with huggingface_hub into HF_HUB_CACHE; VERL_USE_MODELSCOPE=True
  patches the hub to ModelScope's (verl/__init__.py).
- OpenRLHF v0.10.2: from_pretrained of `--actor.model_name_or_path` (and critic, reward), huggingface_hub's cache;
  `--use_ms` patches the hub to ModelScope's in the driver (openrlhf/cli/train_ppo_ray.py).
See verified-facts#model-cache-file-download.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence

from infra.config import ClusterConfig
from infra.frameworks.base import ModelRef
from infra.frameworks.registry import adapter_class
from infra.layout import DATA_MOUNT, SHARED_MOUNT

CACHE_DIR = posixpath.join(DATA_MOUNT, "cache")
HF_HOME = posixpath.join(CACHE_DIR, "huggingface")
MODELSCOPE_CACHE = posixpath.join(CACHE_DIR, "modelscope")
SHARED_CACHE_DIR = posixpath.join(SHARED_MOUNT, "cache")
SHARED_HF_HUB_CACHE = posixpath.join(SHARED_CACHE_DIR, "huggingface", "hub")
SHARED_MODELSCOPE_CACHE = posixpath.join(SHARED_CACHE_DIR, "modelscope")
MODEL_STEP = "model"
MODEL_SCRIPTS = ("model_fetch.sh",)
# The step's bound when the start gate is off (training.startTimeoutMinutes 0): the gate's default, 60 minutes.
DEFAULT_MODEL_TIMEOUT_S = 3600
# ModelScope's cloud-accelerator doc, region table (see the module's docstring).
INTRA_CLOUD_REGIONS = ("cn-hangzhou", "cn-shanghai", "cn-beijing", "cn-zhangjiakou", "cn-wulanchabu", "us-west-1")


def intra_cloud_region(config: ClusterConfig) -> str | None:
    """The stack's region when ModelScope serves it over OSS's internal endpoint, else None."""
    return config.region if config.region in INTRA_CLOUD_REGIONS else None


def shared_cache(config: ClusterConfig) -> bool:
    """Whether the hubs' caches are on the shared storage, filled by the head's model step."""
    return config.storage.shared and adapter_class(config.training.framework).prefetches_models


def framework_hub(config: ClusterConfig) -> str:
    """The hub the framework downloads from as configured: its own (ROLL: ModelScope), else modelSource's."""
    own = adapter_class(config.training.framework).own_hub
    if own:
        return own
    return "modelscope" if config.model_source == "modelscope" else "huggingface"


def container_env(config: ClusterConfig) -> list[str]:
    """`NAME=value` entries for the container: the caches (shared or on the data disk), ModelScope's region."""
    env = [f"HF_HOME={HF_HOME}"]
    if shared_cache(config):
        env += [f"HF_HUB_CACHE={SHARED_HF_HUB_CACHE}", f"MODELSCOPE_CACHE={SHARED_MODELSCOPE_CACHE}"]
    else:
        env += [f"MODELSCOPE_CACHE={MODELSCOPE_CACHE}"]
    region = intra_cloud_region(config)
    if region is not None:
        env += [f"MODELSCOPE_DOWNLOAD_INTRA_CLOUD_REGION={region}", f"INTRA_CLOUD_ACCELERATION_REGION={region}"]
    return env


def model_timeout_s(config: ClusterConfig) -> int:
    """The model step's bound: training.startTimeoutMinutes (the budget the user gives a job's start, downloads
    included), or DEFAULT_MODEL_TIMEOUT_S when the gate is off."""
    minutes = config.training.start_timeout_minutes
    return minutes * 60 if minutes > 0 else DEFAULT_MODEL_TIMEOUT_S


def models_json(models: Sequence[ModelRef]) -> str:
    """The models as the steps' scripts read them: [[hub, repo id, endpoint], ...]."""
    return json.dumps([[m.hub, m.repo_id, m.endpoint] for m in models])


def step_env(config: ClusterConfig, models: Sequence[ModelRef], workdir: str) -> dict[str, str]:
    """The model step's environment (model_fetch.sh): the models as JSON, never in the script's text."""
    return {
        "CONTAINER_NAME": config.container.name,
        "MODELS_JSON": models_json(models),
        "JOB_WORKDIR": workdir,
        "MODEL_TIMEOUT_S": str(model_timeout_s(config)),
    }


# ---- every node's prefetch of the cached weights into its page cache (infra/scripts/weights_prefetch.sh) ----
# With shared storage and hub models, every node reads the complete files of the job's models already in the shared
# caches into its page cache, from the host's mount, while it pulls the image and starts its container; the job
# waits for every node's prefetch, so the framework reads the weights from memory instead of every node reading
# the shared storage at once at start-up. A model not in the cache yet (a new cluster) is nothing to prefetch.
PREFETCH_STEP = "weights-prefetch"
PREFETCH_SCRIPTS = ("weights_prefetch.sh",)
# The bound on one node's whole read: 256 nodes reading a 15 GB model at the NAS's 10 GB/s read cap take 6.4
# minutes (devtools/schedule.py); 20 minutes leaves three times that. Cut there, the step succeeds and the framework
# reads the rest from the shared storage, as without the prefetch.
PREFETCH_TIMEOUT_S = 1200


def fetched_once(config: ClusterConfig, models: Sequence[ModelRef]) -> bool:
    """Whether the head's model step fetches the job's models into the shared caches and every node's prefetch
    step reads them: the caches are on the shared storage and the job names models by hub id."""
    return shared_cache(config) and bool(models)


def prefetch_env(models: Sequence[ModelRef], host_shared_dir: str) -> dict[str, str]:
    """The prefetch step's environment: the models as JSON and the caches' paths on the host's mount of the shared
    storage (SHARED_MOUNT, or storage.sharedHostPath on your own hosts), never in the script's text."""
    cache = posixpath.join(host_shared_dir, posixpath.relpath(SHARED_CACHE_DIR, SHARED_MOUNT))
    return {
        "MODELS_JSON": models_json(models),
        "HF_HUB_CACHE_DIR": posixpath.join(cache, posixpath.relpath(SHARED_HF_HUB_CACHE, SHARED_CACHE_DIR)),
        "MODELSCOPE_CACHE_DIR": posixpath.join(cache, posixpath.relpath(SHARED_MODELSCOPE_CACHE, SHARED_CACHE_DIR)),
        "PREFETCH_TIMEOUT_S": str(PREFETCH_TIMEOUT_S),
    }
