"""The `hosts` node source: machines that already exist (on-premises, another cloud, ECS instances made by hand).

Nothing is created: provision() registers no resource and hands on one Machine per entry of `nodes.hosts`, rank 0
(the Ray head) first. What the hosts have comes from the configuration (`nodes.accelerator`, `acceleratorsPerNode`,
`acceleratorModel`, `bf16`); facts() looks at every host over SSH (probe.py) and refuses the update, before any
resource or step, when a host's driver lists another count or the host cannot be reached. The look also records
each host's SSH key, which provision() hands on so that every client pins it. The readiness step
(infra/node/accelerators.py) checks again before the container. The host list itself (addresses, one private
network, the count) is checked by the configuration model (infra/config/nodes.py, NodesConfig) before anything runs.

Shared storage is the user's: an existing NFS export mounted at /mnt/shared by prepare-host (`storage.nfsServer`),
or a directory the user says is already shared (`storage.sharedHostPath`), bind-mounted into the container.
"""

from __future__ import annotations

from infra.config import PROJECT, ClusterConfig, HostConfig
from infra.node.accelerators import accelerator
from infra.sources.base import ClusterFacts, Machine, ProvisionedCluster, SourceError
from infra.sources.hosts import probe

# Generic NFS options: the kernel negotiates the version; `hard` with a long timeout rides out a server restart.
NFS_MOUNT_OPTIONS = "proto=tcp,hard,timeo=600,retrans=2"


class HostsSource:
    name = "hosts"

    def __init__(self, config: ClusterConfig, stack: str, access: probe.HostAccess | None) -> None:
        """access: how to look at the hosts before anything is registered; None: no look (the offline plan)."""
        self.config = config
        self.stack = stack
        self.access = access
        self.host_keys: dict[str, str] = {}  # address -> the key the look found, pinned for every client

    @property
    def hosts(self) -> list[HostConfig]:
        return list(self.config.nodes.hosts or [])

    def facts(self) -> ClusterFacts:
        nodes = self.config.nodes
        count = nodes.accelerators_per_node
        if count is None:  # the configuration model requires it with `hosts`; kept for the type checker
            raise ValueError("roll-cluster:nodes.acceleratorsPerNode: required with nodes.source hosts")
        if self.access is not None:
            self._look_at_hosts(count)
        return ClusterFacts(
            accelerator=nodes.accelerator,
            accelerators_per_node=count,
            accelerator_model=nodes.model,
            bf16=nodes.has_bf16,
            machine_type=f"{len(self.hosts)} existing host{'s' if len(self.hosts) != 1 else ''}",
            location="existing hosts",
        )

    def targets(self) -> list[probe.HostTarget]:
        """Each host as the program reaches it (its name, key path, address, SSH user and port, defaults applied):
        what the first look and the machines are made from."""
        defaults = self.config.nodes.host_defaults
        return [
            probe.HostTarget(f"node-{rank}", f"{PROJECT}:nodes.hosts[{rank}]", host.address, host.user or defaults.user,
                             host.port or defaults.port)
            for rank, host in enumerate(self.hosts)
        ]

    def _look_at_hosts(self, expected: int) -> None:
        assert self.access is not None
        kind = accelerator(self.config.nodes.accelerator)
        looks = probe.look_at_all(self.targets(), kind, self.access)
        found = probe.problems(looks, expected, f"{PROJECT}:nodes.acceleratorsPerNode", kind)
        if found:
            raise SourceError("your hosts do not match the configuration (nothing was changed on them):\n  "
                              + "\n  ".join(found))
        self.host_keys = {look.target.address: look.host_key for look in looks if look.host_key}

    def provision(self) -> ProvisionedCluster:
        defaults = self.config.nodes.host_defaults
        storage = self.config.storage
        machines = [
            Machine(
                name=target.name,
                rank=rank,
                ssh_host=target.address,
                private_ip=host.private_ip,
                # A different machine at the same place is a different address; what the steps rerun on.
                identity=f"{target.address}:{target.port}",
                ssh_user=target.user,
                ssh_port=target.port,
                network_interface=host.network_interface or defaults.network_interface,
                host_key=self.host_keys.get(target.address),
                existing=True,
            )
            for rank, (host, target) in enumerate(zip(self.hosts, self.targets(), strict=True))
        ]
        return ProvisionedCluster(
            machines=machines,
            shared_storage_server=storage.nfs_server,
            shared_storage_export=storage.nfs_path,
            shared_storage_options=NFS_MOUNT_OPTIONS,
            shared_host_dir=storage.shared_host_path,
            outputs={"hosts": [h.address for h in self.hosts]},
            notes={
                "host_look": (
                    f"`pulumi preview` and `up` first count each host's accelerators over SSH "
                    f"({'nvidia-smi -L' if self.config.nodes.accelerator == 'nvidia' else 'npu-smi info'}) and "
                    "record its SSH key; a count other than nodes.acceleratorsPerNode or an unreachable host stops "
                    "the update before anything runs (not done in this offline plan)"
                ),
                "hosts": [
                    {"name": m.name, "ssh": f"{m.ssh_user}@{m.ssh_host}:{m.ssh_port}", "private": m.private_ip,
                     "interface": m.network_interface or "auto"}
                    for m in machines
                ],
                "shared_storage": (
                    f"NFS {storage.nfs_server}:{storage.nfs_path} mounted at /mnt/shared" if storage.nfs_server
                    else f"{storage.shared_host_path} (yours, shared) bind-mounted at /mnt/shared"
                    if storage.shared_host_path else None
                ),
            },
        )
