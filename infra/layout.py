"""Paths that are the same on every node and in every container, and the project's own root."""

import posixpath
import re
from pathlib import Path

DATA_MOUNT = "/data"  # the data disk (or a plain directory): Docker's root, Ray's temp and spill dirs
SHARED_MOUNT = "/mnt/shared"  # the NAS file system: checkpoints, logs, shared data
WORKSPACE = "/workspace"  # framework code in the container (host: /data/workspace, survives a new container)

# The project's root on the machine that runs `pulumi up` (stack files, __main__.py, local helper scripts).
PROJECT_DIR = Path(__file__).resolve().parent.parent

CHECKPOINTS = "checkpoints"


def path_part(name: str) -> str:
    """A stack or job name as one safe directory name: lower-case letters, digits, `.`, `_` and `-`."""
    part = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.")
    if not part:
        raise ValueError(f"{name!r} has no letter or digit to name a directory after")
    return part


def checkpoint_dir(stack: str, job_name: str, shared: bool = True) -> str:
    """Where one job of one stack keeps its checkpoints: `<root>/checkpoints/<stack>/<job_name>`, on the shared
    storage when there is some (it outlives the nodes and every node sees it), else on each node's data dir.

    job_name is the job's identity: a stable name when a changed configuration resumes (`training.resume`), the
    submission id when it starts fresh. Every framework adapter (ROLL included) takes its directory from here."""
    root = SHARED_MOUNT if shared else DATA_MOUNT
    return posixpath.join(root, CHECKPOINTS, path_part(stack), path_part(job_name))
