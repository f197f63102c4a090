"""Where the frameworks cache downloaded models and datasets inside the container, and ModelScope's in-cloud
download in the regions that have it. Passed as the container's environment (components/bootstrap.py), so every
process of every framework (the job's driver, Ray's workers, a reward server) sees it.

- The caches (`HF_HOME`: huggingface_hub and datasets; `MODELSCOPE_CACHE`: ModelScope's hub) go to the node's data
  disk, `/data/cache/...`, not the container's writable layer: a new container (new image, changed NAS) and a second
  job of the same model find the files and download nothing.
- Not on the shared storage (/mnt/shared), although that would fetch the model once per cluster: the NAS is mounted
  NFSv3 with `nolock` (prepare_host.sh NAS_MOUNT_OPTIONS), so the hubs' file locks (huggingface_hub's `filelock`
  on `<blob>.lock`) exclude only processes of the same node (nfs(5), nfs-utils utils/mount/nfs.man: local
  locks "provide exclusion only against other applications running on the same client", the `nolock` behaviour),
  and on the first job every node's workers would write the same `.incomplete` blobs at once. Sharing needs one
  node to download before the others read (a head-first prefetch step; not implemented, docs/performance.md
  'Modelled options').
- ModelScope's in-cloud acceleration: cloud instances get OSS-internal download URLs when their region has it.
  ModelScope's docs (`models/advanced-usage/cloud-accelerator/cloud-accelerator_CN.md`) list Hangzhou, Shanghai,
  Beijing, Zhangjiakou, Wulanchabu and US (Silicon Valley, us-west-1); all models in Hangzhou, Zhangjiakou and
  Wulanchabu, selected ones elsewhere; the region is detected automatically or set with
  `INTRA_CLOUD_ACCELERATION_REGION` (the hub client's newer name: `MODELSCOPE_DOWNLOAD_INTRA_CLOUD_REGION`,
  modelscope/hub/constants.py `ENV_INTRA_CLOUD_REGION`, deprecated name kept). The program sets both in those
  regions, so the detection (which may fail in a container) does not decide. Used only with
  `training.modelSource: modelscope`; with `hf-mirror` the configured mirror stays. Whether the docs' advance
  registration ("报备") is needed for an ECS account is UNCONFIRMED.
"""

from __future__ import annotations

import posixpath

from infra.config import ClusterConfig
from infra.layout import DATA_MOUNT

CACHE_DIR = posixpath.join(DATA_MOUNT, "cache")
HF_HOME = posixpath.join(CACHE_DIR, "huggingface")
MODELSCOPE_CACHE = posixpath.join(CACHE_DIR, "modelscope")
# ModelScope's cloud-accelerator doc, region table (see the module's docstring).
INTRA_CLOUD_REGIONS = ("cn-hangzhou", "cn-shanghai", "cn-beijing", "cn-zhangjiakou", "cn-wulanchabu", "us-west-1")


def intra_cloud_region(config: ClusterConfig) -> str | None:
    """The stack's region when ModelScope serves it over OSS's internal endpoint, else None."""
    return config.region if config.region in INTRA_CLOUD_REGIONS else None


def container_env(config: ClusterConfig) -> list[str]:
    """`NAME=value` entries for the container: the caches on the data disk, ModelScope's in-cloud region."""
    env = [f"HF_HOME={HF_HOME}", f"MODELSCOPE_CACHE={MODELSCOPE_CACHE}"]
    region = intra_cloud_region(config)
    if region is not None:
        env += [f"MODELSCOPE_DOWNLOAD_INTRA_CLOUD_REGION={region}", f"INTRA_CLOUD_ACCELERATION_REGION={region}"]
    return env
