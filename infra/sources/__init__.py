"""Node sources: one module per place the machines come from (see base.py for the interface)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.sources.base import ClusterFacts, Machine, NodeSource, ProvisionedCluster, SourceError

if TYPE_CHECKING:  # config imports the Alibaba catalog, which lives under this package
    from infra.config import ClusterConfig
    from infra.node.ssh_access import LoginKey

__all__ = ["ClusterFacts", "Machine", "NodeSource", "ProvisionedCluster", "SourceError", "source_for"]


def source_for(config: ClusterConfig, stack: str, login: LoginKey) -> NodeSource:
    """The node source the configuration names (`nodes.source`); `login` is how the program reaches machines that
    already exist (your own hosts are looked at before anything is registered)."""
    # Imported here: each source pulls in its own provider SDK, which the others need not load.
    if config.nodes.source == "alibaba":
        from infra.sources.alibaba.source import AlibabaSource

        return AlibabaSource(config, stack)
    if config.nodes.source == "hosts":
        from infra import runmode
        from infra.node.known_hosts import known_hosts_path
        from infra.sources.hosts.probe import HostAccess
        from infra.sources.hosts.source import HostsSource

        # The offline plan and the tests have no hosts to look at: the plan says the look happens at preview.
        access = None if runmode.offline() else HostAccess(login.identity_file, known_hosts_path(stack))
        return HostsSource(config, stack, access)
    raise SourceError(f"roll-cluster:nodes.source: unknown source {config.nodes.source!r}")
