"""The real-host tier: three test hosts (network namespaces with their own sshd and dockerd, see e2e_harness.py) and
the registry that serves them the test image, for the whole session. Set-up installs what the tier needs (Debian's
openssh-server, docker.io and docker-registry; the test image with Ray 2.48.0, built once into a registry storage
under /var/cache/roll-cluster-e2e, see e2e_docker.py) and removes what a crashed earlier run left (namespaces with
their daemons and containers, registries); teardown removes the hosts also when tests fail (their files are kept
then, under /var/tmp/roll-cluster-e2e, for a look at the Ray, step and dockerd logs).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_docker import ensure_docker, ensure_test_image
from e2e_harness import TestNetwork, ensure_sshd, unavailable_reason

HOST_COUNT = 3


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: the real-host tier (network-namespace hosts, real sshd, Docker and Ray)")


@pytest.fixture(scope="session")
def network(request: pytest.FixtureRequest) -> Iterator[TestNetwork]:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    ensure_sshd()
    ensure_docker()
    hosts = TestNetwork(HOST_COUNT, ensure_test_image())
    hosts.start()
    try:
        yield hosts
    finally:
        hosts.stop(keep_state=request.session.testsfailed > 0)
