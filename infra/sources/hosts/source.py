"""The `hosts` node source: machines that already exist (on-premises, another cloud, ECS instances made by hand).

Nothing is created: provision() registers no resource and hands on one Machine per entry of `nodes.hosts`, rank 0
(the Ray head) first. What the hosts have is known from the configuration at plan time (`nodes.accelerator`,
`acceleratorsPerNode`, `acceleratorModel`, `bf16`) and checked on each host by the readiness step
(infra/node/accelerators.py). The host list itself (addresses, one private network, the count) is checked by the
configuration model (infra/config.py, NodesConfig) before anything runs.

Shared storage is the user's: an existing NFS export mounted at /mnt/shared by prepare-host (`storage.nfsServer`),
or a directory the user says is already shared (`storage.sharedHostPath`), bind-mounted into the container.
"""

from __future__ import annotations

from infra.config import ClusterConfig, HostConfig
from infra.sources.base import ClusterFacts, Machine, ProvisionedCluster

# Generic NFS options: the kernel negotiates the version; `hard` with a long timeout rides out a server restart.
NFS_MOUNT_OPTIONS = "proto=tcp,hard,timeo=600,retrans=2"


class HostsSource:
    name = "hosts"

    def __init__(self, config: ClusterConfig, stack: str) -> None:
        self.config = config
        self.stack = stack

    @property
    def hosts(self) -> list[HostConfig]:
        return list(self.config.nodes.hosts or [])

    def facts(self) -> ClusterFacts:
        nodes = self.config.nodes
        count = nodes.accelerators_per_node
        if count is None:  # the configuration model requires it with `hosts`; kept for the type checker
            raise ValueError("roll-cluster:nodes.acceleratorsPerNode: required with nodes.source hosts")
        return ClusterFacts(
            accelerator=nodes.accelerator,
            accelerators_per_node=count,
            accelerator_model=nodes.model,
            bf16=nodes.has_bf16,
            machine_type=f"{len(self.hosts)} existing host{'s' if len(self.hosts) != 1 else ''}",
            location="existing hosts",
        )

    def provision(self) -> ProvisionedCluster:
        defaults = self.config.nodes.host_defaults
        storage = self.config.storage
        machines = [
            Machine(
                name=f"node-{rank}",
                rank=rank,
                ssh_host=host.address,
                private_ip=host.private_ip,
                # A different machine at the same place is a different address; what the steps rerun on.
                identity=f"{host.address}:{host.port or defaults.port}",
                ssh_user=host.user or defaults.user,
                ssh_port=host.port or defaults.port,
                network_interface=host.network_interface or defaults.network_interface,
                existing=True,
            )
            for rank, host in enumerate(self.hosts)
        ]
        return ProvisionedCluster(
            machines=machines,
            shared_storage_server=storage.nfs_server,
            shared_storage_export=storage.nfs_path,
            shared_storage_options=NFS_MOUNT_OPTIONS,
            shared_host_dir=storage.shared_host_path,
            outputs={"hosts": [h.address for h in self.hosts]},
            notes={
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
