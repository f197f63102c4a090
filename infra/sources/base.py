"""The node-source interface: where the cluster's machines come from.

Every later stage (bootstrap, container, Ray, job, outputs, plan) takes what a source hands on and never asks
which source it was. A source is one module under infra/sources/<name>/ that implements `NodeSource`:

- `facts()`: what every node has (accelerator kind, count and model, bf16), known before any resource exists.
  The framework checks and the training configuration are sized from it, so a bad configuration stops the
  update before anything is created or touched. Raises `SourceError` with the key named.
- `provision()`: registers whatever the source needs (ECS instances, a VPC, a NAS; nothing for existing hosts)
  and hands on the machines (`Machine`), the shared-storage server if any, and the source's own stack outputs
  and plan lines.

Optional abilities (stock-aware placement, shared storage, baked images) stay inside the source that has them;
the caller only sees their results in `ProvisionedCluster`. Adding another cloud or Kubernetes is one more module
and one line in infra/sources/__init__.py, as in SkyPilot's sky/provision/<cloud>/.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import pulumi

Accelerator = Literal["nvidia", "ascend"]


class SourceError(RuntimeError):
    """A configuration the source cannot serve, found before any resource exists (message names the key)."""


@dataclass(frozen=True)
class ClusterFacts:
    """What every node of the cluster has; known at plan time and the same on every node."""

    accelerator: Accelerator
    accelerators_per_node: int
    accelerator_model: str
    bf16: bool
    machine_type: str  # the instance type, or a description of the hosts
    location: str  # the zone, or "existing hosts"


@dataclass(frozen=True)
class Machine:
    """One machine handed on to the bootstrap: how to reach it over SSH and who it is."""

    name: str  # "node-0": the step names and the plan use it
    rank: int  # 0 is the Ray head
    ssh_host: pulumi.Input[str]  # the address the machine running `pulumi up` reaches
    private_ip: pulumi.Input[str]  # the address the other nodes reach (Ray, NCCL)
    identity: pulumi.Input[str]  # changes when the machine is a different one (instance id, host address)
    ssh_user: str = "root"
    ssh_port: int = 22
    data_disk: str | None = None  # how prepare-host finds the data disk (see prepare_host.sh), or None
    # The NIC of private_ip: NCCL/Gloo/HCCL bind to it. None: unknown (NCCL then only avoids docker0 and lo).
    network_interface: str | None = "eth0"
    depends_on: Sequence[pulumi.Resource] = ()  # what must exist before the first SSH step
    # A machine this program did not create (your own host): its Docker and drivers are used as they are, only
    # what is missing is installed, and its driver is checked, never installed.
    existing: bool = False


@dataclass
class ProvisionedCluster:
    machines: list[Machine]
    shared_storage_server: pulumi.Input[str] | None = None  # an NFS server that every node mounts, if any
    shared_storage_export: str = "/"  # the path it exports
    shared_storage_options: str | None = None  # NFS mount options; None: prepare_host.sh's (Alibaba NAS) defaults
    shared_host_dir: str | None = None  # a host directory that is already shared (the user's), if any
    outputs: Mapping[str, Any] = field(default_factory=dict)  # the source's own stack outputs
    notes: Mapping[str, Any] = field(default_factory=dict)  # the source's lines for the offline plan


class NodeSource(Protocol):
    """Where the nodes come from. Implementations: infra/sources/alibaba, infra/sources/hosts."""

    name: str

    def facts(self) -> ClusterFacts:
        """What every node has, before any resource; raises SourceError naming the key."""
        ...

    def provision(self) -> ProvisionedCluster:
        """Register the source's resources and hand on the machines, rank 0 first."""
        ...
