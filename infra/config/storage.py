"""`roll-cluster:storage`: the storage shared by all nodes (a NAS file system, an NFS export or a shared path)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from infra.config.base import Section, _problem, _shown
from infra.config.values import absolute_path, canonical_host

# System locations of a host: bind-mounting one of them (or a directory inside) into the container hands the
# training job the host's configuration, binaries or Docker's own data.
SYSTEM_PATHS = (
    "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/dev", "/proc", "/sys", "/run",
    "/var/run", "/var/lib/docker", "/var/lib/containerd", "/var/lib/roll-cluster", "/root", "/data/docker", "/var/lib",
    "/var/log", "/snap",
)
# Top-level directories of the filesystem hierarchy: a whole /home or /opt is no shared data directory.
_TOP_LEVEL = ("/", "/opt", "/home", "/mnt", "/srv", "/var", "/tmp", "/media", "/data", "/usr", "/lost+found")
# Where shared storage is mounted (an allow rule: everything else, /var/spool, /opt/<vendor> or a system tree, is
# refused): a directory inside one of these, never one of them whole, and no hidden directory on the way (a user's
# `.ssh` or `.docker` under /home).
SHARED_ROOTS = ("/mnt", "/media", "/srv", "/data", "/home", "/shared", "/share", "/nfs", "/scratch", "/export",
                "/exports", "/lustre", "/gpfs", "/cpfs", "/ceph", "/cephfs", "/storage", "/datasets", "/work")


class StorageConfig(Section):
    nas: bool = Field(
        False,
        description="A NAS file system mounted at /mnt/shared on every node and container (nodes.source `alibaba`), "
        "where the checkpoints go. Not set: true on `alibaba` unless retainOnDestroy is false, so that "
        "checkpoints survive `pulumi destroy` on every stack, single-node ones included (a pay-as-you-go "
        "General-purpose NAS kept on destroy; attach it again with existingFileSystemId). false: checkpoints stay "
        "on each node's data disk and are deleted with it.",
    )
    nfs_server: str | None = Field(
        None,
        description="With nodes.source `hosts`: an existing NFS server (IP or DNS name) whose `nfsPath` export is "
        "mounted at /mnt/shared on every host (fstab, `nofail`) and in every container.",
    )
    nfs_path: str = Field("/", description="The exported path on `nfsServer`.")
    shared_host_path: str | None = Field(
        None,
        description="With nodes.source `hosts`: a directory that already exists at this path on every host and is "
        "shared between them (your NFS/Lustre/CephFS mount); bind-mounted at /mnt/shared in every container. Not "
        "checked for being shared: the program only sees each host on its own.",
    )
    retain_on_destroy: bool = Field(
        True,
        description="`pulumi destroy` keeps the NAS file system and its data (the checkpoints). false: it deletes "
        "them, and a stack that leaves `nas` unset gets no NAS (its checkpoints die with the nodes).",
    )
    nas_storage_type: Literal["Capacity", "Performance", "Premium"] = Field(
        "Capacity", description="NAS storage class of a standard (General-purpose) NFS file system."
    )
    existing_file_system_id: str | None = Field(
        None,
        description="Id of a kept General-purpose NAS file system of the region (e.g. the `nasFileSystemId` output "
        "of an earlier deployment) to attach instead of creating one: its checkpoints are there again after "
        "`pulumi destroy` and `pulumi up`. Implies `nas: true`; the program then never deletes it.",
    )

    @model_validator(mode="before")
    @classmethod
    def _existing_implies_nas(cls, data: Any) -> Any:
        # An explicit `nas: false` is kept so that the contradiction is reported below.
        if isinstance(data, dict) and data.get("existingFileSystemId") is not None and "nas" not in data:
            data = {**data, "nas": True}
        return data

    @field_validator("existing_file_system_id")
    @classmethod
    def _file_system_id(cls, fs_id: str | None, info: ValidationInfo) -> str | None:
        if fs_id is None:
            return None
        # General-purpose NAS ids are lowercase hex-like (`31a8e4****`, CreateMountTarget's FileSystemId); Extreme
        # (`extreme-...`) and CPFS (`cpfs-...`) file systems are other products this program does not mount.
        if not re.fullmatch(r"[0-9a-z]{6,32}", fs_id):
            raise _problem(
                "must be the id of a General-purpose NAS file system, such as `31a8e4b0c2` (not `extreme-...` or "
                f"`cpfs-...`); got {_shown(fs_id)}"
            )
        if info.data.get("nas") is False:
            raise _problem(
                f"must not be set with nas: false (leave nas out or set it to true); got {_shown(fs_id)} with "
                "nas false",
                "..", "nas",
            )
        return fs_id

    @field_validator("nfs_server")
    @classmethod
    def _server(cls, server: str | None) -> str | None:
        if server is None:
            return None
        server = canonical_host(server)
        try:
            ip = ipaddress.ip_address(server)
        except ValueError:
            ip = None
        local = server == "localhost" or server.endswith(".localhost")
        if local or (ip is not None and (ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_reserved
                                         or ip.is_link_local)):
            raise _problem(
                "must be the NFS server's address that every host reaches (not loopback, where each host would mount "
                f"itself, nor unspecified, multicast, link-local or reserved); got {_shown(server)}"
            )
        return server

    @field_validator("nfs_path", "shared_host_path")
    @classmethod
    def _path(cls, path: str | None) -> str | None:
        if (path is not None and not re.fullmatch(r"/[A-Za-z0-9._/-]*", path)) or (path is not None and ".." in path):
            raise _problem(f"must be an absolute path of letters, digits and ._/- (no `..`); got {_shown(path)}")
        return path

    @field_validator("shared_host_path")
    @classmethod
    def _not_a_system_path(cls, path: str | None) -> str | None:
        if path is None:
            return None
        absolute_path(path)
        system = next((p for p in SYSTEM_PATHS if path == p or path.startswith(p + "/")), None)
        if path in _TOP_LEVEL or system is not None:
            raise _problem(
                "must be a directory of your shared storage (e.g. `/mnt/nfs/shared`), not "
                f"a system location{' (' + system + ')' if system else ''}: it is bind-mounted read-write into the "
                f"container; got {_shown(path)}"
            )
        parts = path.split("/")[1:]
        root = "/" + parts[0]
        if root not in SHARED_ROOTS or len(parts) < 2 or any(p.startswith(".") for p in parts):
            raise _problem(
                "must be a directory of your shared storage inside one of "
                f"{', '.join(r + '/' for r in SHARED_ROOTS)} (e.g. `/mnt/nfs/shared`), without hidden directories "
                "such as `.ssh`: it is bind-mounted read-write into the container, which runs as root; got "
                + _shown(path)
            )
        return path

    @model_validator(mode="after")
    def _existing_is_never_deleted(self) -> StorageConfig:
        if self.existing_file_system_id is not None and "retain_on_destroy" in self.model_fields_set \
                and not self.retain_on_destroy:
            raise _problem(
                "must not be false with existingFileSystemId: the program never deletes a file system it did not "
                "create, so `pulumi destroy` keeps it whatever this says; remove retainOnDestroy; got false with "
                f"existingFileSystemId {_shown(self.existing_file_system_id)}",
                "retainOnDestroy",
            )
        return self

    @property
    def shared(self) -> bool:
        """Whether /mnt/shared is shared storage on every node (NAS, an NFS server or a shared host path)."""
        return self.nas or self.nfs_server is not None or self.shared_host_path is not None
