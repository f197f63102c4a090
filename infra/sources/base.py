"""The node-source interface: where the cluster's machines come from.

Every later stage (bootstrap, container, Ray, job, outputs, plan) takes what a source hands on and never asks
which source it was. A source is one module under infra/sources/<name>/ that implements `NodeSource`:

- `facts()`: what every node has (accelerator kind, count and model, bf16), known before any resource exists.
  The framework checks and the training configuration are sized from it, so a bad configuration stops the
  update before anything is created or touched. Raises `SourceError` with the key named.
- its resources: components/node_source.py registers whatever the source needs (ECS instances, a VPC, a NAS;
  nothing for existing hosts) and hands on the machines (`Machine`), the shared-storage server if any, and the
  source's own stack outputs and plan lines (`ProvisionedCluster`).

Optional abilities (stock-aware placement, shared storage, baked images) stay inside the source that has them;
the caller only sees their results in `ProvisionedCluster`, and asks what a source can do through its declared
`Capabilities` (as SkyPilot's CloudImplementationFeatures, dstack's ComputeWith*Support), never its name. Adding
another cloud or Kubernetes is one folder and one line in the registry (infra/sources/__init__.py), plus one in
components/node_source.py if it registers resources: docs/adding-a-source.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import pulumi
from pulumi.errors import RunError

if TYPE_CHECKING:  # the configuration imports this package (the Alibaba catalog): only annotations name it
    from infra.config import ClusterConfig
    from infra.node.ssh_access import LoginKey

Accelerator = Literal["nvidia", "ascend"]


class SourceError(RunError):
    """A configuration the source cannot serve, found before any resource exists (message names the key).
    A pulumi RunError: the CLI shows the message without a traceback."""


@dataclass(frozen=True)
class Capabilities:
    """What a node source can do, declared once in its folder. Everything outside infra/sources/<name>/,
    components/<name>/ and the registry asks these (through the registry, by the source's name), never which
    source it is; a new source states each one."""

    # The nodes are machines the user already has (nodes.hosts): nothing is rented or created in a cloud, they
    # and their disks outlive `pulumi destroy`, and the plan cannot model their disks and network.
    existing_machines: bool
    # nodes.instanceTypes picks the machines from a catalog of instance types (infra/sources/alibaba/catalog.py)
    # booted from images (osImage, image, gpuDriver), whose memory bounds /dev/shm.
    instance_types: bool
    # The provider needs `alicloud:region`.
    region: bool
    # The program creates the nodes' firewall (access.adminCidrs, allowWorld, the dashboard's `admin-cidrs` mode)
    # and installs the login key (access.sshPublicKey).
    firewall: bool
    # nodes.paused stops the machines, and what needs a running node keeps its state meanwhile (infra/pause.py).
    pause: bool
    # Autostop stops the machines (with a role the head holds: AutostopRole); without it, only the job.
    autostop_stops_machines: bool
    # nodes.spot: spot machines, whose reclaim notice reaches jobStatus (spot_notice.sh).
    spot: bool
    # storage.nas: the program creates the shared storage (a NAS in the cluster's network).
    managed_shared_storage: bool
    # storage.nfsServer / sharedHostPath: the user's own shared storage.
    user_shared_storage: bool
    # The first `up` needs cloud permissions, which the plan lists per feature (infra/permissions.py).
    permissions: bool
    # The accelerators its machines can have (nodes.accelerator).
    accelerators: tuple[Accelerator, ...] = ("nvidia",)


@dataclass(frozen=True)
class SourceEntry:
    """One node source in the registry (infra/sources/__init__.py): its name (nodes.source), what it can do, and
    how to make it (imported when asked: each source pulls in its own provider SDK, which the others need not load)."""

    name: str
    capabilities: Capabilities
    make: Callable[[ClusterConfig, str, LoginKey], NodeSource]


@dataclass(frozen=True)
class ClusterFacts:
    """What every node of the cluster has; known at plan time and the same on every node."""

    accelerator: Accelerator
    accelerators_per_node: int
    accelerator_model: str
    bf16: bool
    machine_type: str  # the instance type, or a description of the hosts
    location: str  # the zone, or "existing hosts"
    nvswitch: bool = False  # GPUs joined by NVSwitch: nvidia-fabricmanager must run on every node


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
    # How prepare-host finds the data disk (prepare_host.sh): by the disk's serial (an ECS disk id without `d-`,
    # the virtio and NVMe serial alike: /dev/disk/by-id/virtio-<serial> or ...nvme-..._<serial>), or by an
    # explicit block device path for hosts whose layout is known. Neither: /data lives on the system disk.
    data_disk_serial: pulumi.Input[str] | None = None
    data_disk: str | None = None
    # The machine's SSH host key (`ssh-ed25519 AAAA...`) when the program knows it before connecting
    # (infra/node/known_hosts.py); None: its clients record the key they first see, in the stack's own file.
    host_key: pulumi.Input[str] | None = None
    # The NIC of private_ip: NCCL/Gloo/HCCL bind to it. None: unknown (NCCL then only avoids docker0 and lo).
    network_interface: str | None = "eth0"
    depends_on: Sequence[pulumi.Resource] = ()  # what must exist before the first SSH step
    # When the machine was last started (an ECS instance's `start_time`); None where the program does not start
    # machines (own hosts). The job step carries the head's, so a resumed cluster (nodes.paused removed, or after
    # autostop with `pulumi up --refresh`) submits its job again (docs/operations.md, 'Pause, resume and autostop').
    started: pulumi.Input[str] | None = None
    # The resource whose deletion takes the machine's container with it (an instance): a destroy then deletes no
    # container over SSH, which fails on a node that cannot be reached. None: own hosts (the container is deleted).
    deleted_with: pulumi.Resource | None = None
    # Baking (a source that can image its machines, with nodes.bake): called by the bootstrap once the machine is
    # prepared, with the step(s) to wait for and the parent for the image; returns the image resource (later steps
    # wait for it) and its id.
    bake: Callable[[Sequence[pulumi.Resource], pulumi.Resource], tuple[pulumi.Resource, pulumi.Output[str]]] | None = (
        None
    )
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


@runtime_checkable
class ProvisionsItself(NodeSource, Protocol):
    """A source that registers no resource (your own hosts): it hands on its machines itself, so it needs no entry
    in components/node_source.py."""

    def provision(self) -> ProvisionedCluster:
        """The machines, rank 0 (the Ray head) first; registers nothing."""
        ...
