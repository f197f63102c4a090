"""Node sources: one folder per place the machines come from (see base.py for the interface), and the registry
that routes to them by `nodes.source`. The registry is the only place that names a source; everything else asks
its declared `Capabilities`. Adding a source: docs/adding-a-source.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.sources import alibaba, hosts
from infra.sources.base import (
    Capabilities,
    ClusterFacts,
    Machine,
    NodeSource,
    ProvisionedCluster,
    ProvisionsItself,
    SourceEntry,
    SourceError,
)

if TYPE_CHECKING:  # config imports the Alibaba catalog, which lives under this package
    from infra.config import ClusterConfig
    from infra.node.ssh_access import LoginKey

__all__ = ["SOURCES", "Capabilities", "ClusterFacts", "Machine", "NodeSource", "ProvisionedCluster",
           "ProvisionsItself", "SourceEntry", "SourceError", "capabilities", "names", "source_for"]

DEFAULT = "alibaba"  # nodes.source left out
# name -> entry, in the order the reference lists them. Tests may add a test-only source here (and take it out).
SOURCES: dict[str, SourceEntry] = {entry.name: entry for entry in (alibaba.ENTRY, hosts.ENTRY)}


def names() -> tuple[str, ...]:
    """The values nodes.source allows."""
    return tuple(SOURCES)


def capabilities(name: object) -> Capabilities | None:
    """What the source named `name` can do; None for a name no source has (the configuration reports it)."""
    entry = SOURCES.get(name) if isinstance(name, str) else None
    return entry.capabilities if entry is not None else None


def source_for(config: ClusterConfig, stack: str, login: LoginKey) -> NodeSource:
    """The node source the configuration names (`nodes.source`); `login` is how the program reaches machines that
    already exist (your own hosts are looked at before anything is registered)."""
    entry = SOURCES.get(config.nodes.source)
    if entry is None:
        raise SourceError(f"roll-cluster:nodes.source: unknown source {config.nodes.source!r}")
    return entry.make(config, stack, login)
