"""The node source's resources: what `nodes.source` needs registered before the machines can be bootstrapped.

`alibaba` registers its network, key pair, NAS and instances (components/alibaba_cluster.py); `hosts` registers
nothing and hands on the user's machines as they are (infra/sources/hosts/source.py).
"""

from __future__ import annotations

from infra.sources.base import NodeSource, ProvisionedCluster


def provision(source: NodeSource) -> ProvisionedCluster:
    """The machines of the cluster, rank 0 (the Ray head) first, with whatever the source had to register."""
    # Imported here: each source pulls in its own provider SDK, which the others need not load.
    from infra.sources.alibaba.source import AlibabaSource

    if isinstance(source, AlibabaSource):
        from components import alibaba_cluster

        return alibaba_cluster.provision_alibaba(source)
    from infra.sources.hosts.source import HostsSource

    if isinstance(source, HostsSource):
        return source.provision()
    raise TypeError(f"no provisioning for node source {source.name!r}")
