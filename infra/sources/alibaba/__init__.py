"""The `alibaba` node source: new GPU ECS instances in a VPC of their own (source.py), placed by stock
(placement.py); its resources are components/alibaba/. What it can do, for the registry (infra/sources/__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.sources.base import Capabilities, NodeSource, SourceEntry

if TYPE_CHECKING:
    from infra.config import ClusterConfig
    from infra.node.ssh_access import LoginKey

CAPABILITIES = Capabilities(
    existing_machines=False,
    instance_types=True,
    region=True,
    firewall=True,
    pause=True,
    autostop_stops_machines=True,
    spot=True,
    managed_shared_storage=True,
    user_shared_storage=False,
    permissions=True,
    accelerators=("nvidia",),  # ECS sells no Ascend servers
)


def make_alibaba_source(config: ClusterConfig, stack: str, login: LoginKey) -> NodeSource:
    """The source for a stack; it reaches no machine before they exist, so the login is not needed."""
    from infra.sources.alibaba.source import AlibabaSource

    del login
    return AlibabaSource(config, stack)


ENTRY = SourceEntry("alibaba", CAPABILITIES, make_alibaba_source)
