"""Paths that are the same on every node and in every container."""

DATA_MOUNT = "/data"  # the data disk (or a plain directory): Docker's root, Ray's temp and spill dirs
SHARED_MOUNT = "/mnt/shared"  # the NAS file system: checkpoints, logs, shared data
WORKSPACE = "/workspace"  # framework code in the container (host: /data/workspace, survives a new container)
