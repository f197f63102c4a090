"""The node source's resources: what `nodes.source` needs registered before the machines can be bootstrapped.

A source that registers resources has an entry here, its components in a folder of its own: `alibaba` registers
its network, key pair, NAS and instances (components/alibaba/cluster.py) and, for autostop, the head's RAM role
(components/alibaba/autostop_role.py). A source that registers nothing (`hosts`) has no entry: it hands on the
user's machines itself (infra/sources/base.py ProvisionsItself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra import sources
from infra.config import ClusterConfig
from infra.sources.base import NodeSource, ProvisionedCluster, ProvisionsItself

if TYPE_CHECKING:
    from components.alibaba.autostop_role import AutostopRole


@dataclass(frozen=True)
class SourceResources:
    """What a source registers: its machines (and their network, storage, ...) and, where its autostop stops the
    machines (Capabilities.autostop_stops_machines), the access the head stops them with."""

    provision: Callable[[NodeSource], ProvisionedCluster]
    autostop_role: Callable[[ClusterConfig, str], AutostopRole] | None = None


def _alibaba() -> SourceResources:
    # Imported here: each source pulls in its own provider SDK, which the others need not load.
    from components.alibaba import cluster
    from components.alibaba.autostop_role import AutostopRole
    from infra.sources.alibaba.source import AlibabaSource

    def provision(source: NodeSource) -> ProvisionedCluster:
        assert isinstance(source, AlibabaSource)
        return cluster.provision_alibaba(source)

    return SourceResources(provision, lambda config, stack: AutostopRole("autostop-access", config, stack))


# nodes.source -> its resources (built when asked).
RESOURCES: dict[str, Callable[[], SourceResources]] = {"alibaba": _alibaba}


def provision(source: NodeSource) -> ProvisionedCluster:
    """The machines of the cluster, rank 0 (the Ray head) first, with whatever the source had to register."""
    resources = RESOURCES.get(source.name)
    if resources is not None:
        return resources().provision(source)
    if isinstance(source, ProvisionsItself):
        return source.provision()
    raise TypeError(f"no provisioning for node source {source.name!r}")


def autostop_role(source: NodeSource, config: ClusterConfig, stack: str) -> AutostopRole | None:
    """With nodes.autostop on a source whose autostop stops the machines: the head's access to stop them,
    registered before the nodes (every instance waits for it, so nothing bills before it exists). None otherwise."""
    capable = sources.capabilities(source.name)
    if not config.nodes.autostop.enabled or capable is None or not capable.autostop_stops_machines:
        return None
    resources = RESOURCES.get(source.name)
    factory = resources().autostop_role if resources is not None else None
    if factory is None:
        raise TypeError(f"node source {source.name!r} stops its machines on autostop but registers no role for it")
    return factory(config, stack)
