"""The `hosts` node source: machines you already have (see source.py). What it can do, for the registry
(infra/sources/__init__.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.sources.base import Capabilities, NodeSource, SourceEntry

if TYPE_CHECKING:
    from infra.config import ClusterConfig
    from infra.node.ssh_access import LoginKey

CAPABILITIES = Capabilities(
    existing_machines=True,
    instance_types=False,
    region=False,
    firewall=False,
    pause=False,
    autostop_stops_machines=False,
    spot=False,
    managed_shared_storage=False,
    user_shared_storage=True,
    permissions=False,
    accelerators=("nvidia", "ascend"),
)


def make_hosts_source(config: ClusterConfig, stack: str, login: LoginKey) -> NodeSource:
    """The source for a stack: `login` is how it looks at the hosts before anything is registered."""
    from infra import runmode
    from infra.node.known_hosts import known_hosts_path
    from infra.sources.hosts.probe import HostAccess
    from infra.sources.hosts.source import HostsSource

    # The offline plan and the tests have no hosts to look at: the plan says the look happens at preview.
    access = None if runmode.offline() else HostAccess(login.identity_file, known_hosts_path(stack))
    return HostsSource(config, stack, access)


ENTRY = SourceEntry("hosts", CAPABILITIES, make_hosts_source)
