"""The real-host tier: three test hosts (network namespaces with their own sshd, see e2e_harness.py) for the whole
session. Set-up installs what the tier needs (Debian's openssh-server, Ray 2.48.0 in a virtualenv under
/var/cache/roll-cluster-e2e) and removes what a crashed earlier run left; teardown removes the hosts also when
tests fail (their files are kept then, under /var/tmp/roll-cluster-e2e, for a look at the Ray and step logs).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_harness import TestNetwork, ensure_ray_venv, ensure_sshd, unavailable_reason

HOST_COUNT = 3


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: the real-host tier (network-namespace hosts, real sshd and Ray)")


@pytest.fixture(scope="session")
def network(request: pytest.FixtureRequest) -> Iterator[TestNetwork]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    ensure_sshd()
    hosts = TestNetwork(HOST_COUNT, ensure_ray_venv())
    hosts.start()
    try:
        yield hosts
    finally:
        hosts.stop(keep_state=request.session.testsfailed > 0)
