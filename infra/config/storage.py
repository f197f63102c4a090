"""`roll-cluster:storage`: the storage shared by all nodes (a NAS file system, an NFS export or a shared path)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from infra.config.base import _HOST_NAME, Section, _is_ip, _problem, _shown


class StorageConfig(Section):
    nas: bool = Field(
        False,
        description="A NAS file system mounted at /mnt/shared on every node and container (nodes.source `alibaba`).",
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
    retain_on_destroy: bool = Field(True, description="`pulumi destroy` keeps the NAS file system and its data.")
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
        if server is not None and not (_is_ip(server) or _HOST_NAME.fullmatch(server)):
            raise _problem(f"must be an IP address or a DNS name such as `nfs.example.com`; got {_shown(server)}")
        return server

    @field_validator("nfs_path", "shared_host_path")
    @classmethod
    def _path(cls, path: str | None) -> str | None:
        if (path is not None and not re.fullmatch(r"/[A-Za-z0-9._/-]*", path)) or (path is not None and ".." in path):
            raise _problem(f"must be an absolute path of letters, digits and ._/- (no `..`); got {_shown(path)}")
        return path

    @property
    def shared(self) -> bool:
        """Whether /mnt/shared is shared storage on every node (NAS, an NFS server or a shared host path)."""
        return self.nas or self.nfs_server is not None or self.shared_host_path is not None
