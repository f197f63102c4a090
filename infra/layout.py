"""Paths that are the same on every node and in every container, and the project's own root."""

from pathlib import Path

DATA_MOUNT = "/data"  # the data disk (or a plain directory): Docker's root, Ray's temp and spill dirs
SHARED_MOUNT = "/mnt/shared"  # the NAS file system: checkpoints, logs, shared data
WORKSPACE = "/workspace"  # framework code in the container (host: /data/workspace, survives a new container)

# The project's root on the machine that runs `pulumi up` (stack files, __main__.py, local helper scripts).
PROJECT_DIR = Path(__file__).resolve().parent.parent
