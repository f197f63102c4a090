"""Node sources: one module per place the machines come from (see base.py for the interface)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.sources.base import ClusterFacts, Machine, NodeSource, ProvisionedCluster, SourceError

if TYPE_CHECKING:  # config imports the Alibaba catalog, which lives under this package
    from infra.config import ClusterConfig

__all__ = ["ClusterFacts", "Machine", "NodeSource", "ProvisionedCluster", "SourceError", "source_for"]


def source_for(config: ClusterConfig, stack: str) -> NodeSource:
    """The node source the configuration names (`nodes.source`)."""
    # Imported here: each source pulls in its own provider SDK, which the others need not load.
    if config.nodes.source == "alibaba":
        from infra.sources.alibaba.source import AlibabaSource

        return AlibabaSource(config, stack)
    if config.nodes.source == "hosts":
        from infra.sources.hosts.source import HostsSource

        return HostsSource(config, stack)
    raise SourceError(f"roll-cluster:nodes.source: unknown source {config.nodes.source!r}")
