"""Faults that need no running cluster, on real hosts with Ray's default ports: an unreachable head, a missing
container, a configured secret that is not set. (A worker of another cluster and a head whose container runs
another cluster's Ray are in test_ray_cluster.py, which has clusters to spare.)

Stand-ins as in test_ray_cluster.py: `docker` (a container is a PID namespace on the host) and GPUs.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import e2e_steps as steps
import pytest
from e2e_harness import UNREACHABLE_IP, TestHost, TestNetwork

from infra.ray import step_env

pytestmark = pytest.mark.e2e

CONTAINER = "roll"
SETTINGS = step_env.RaySettings(
    container_name=CONTAINER,
    gpus_per_node=2,
    object_store_memory=100 * 1024 * 1024,
    num_cpus=1,
    head_wait_timeout_s=120,
    ready_timeout_s=60,
)


@pytest.fixture(scope="module")
def hosts(network: TestNetwork) -> Iterator[list[TestHost]]:
    for host in network.hosts:
        network.create_container(host, CONTAINER)
    yield network.hosts
    network.run_parallel([(host, steps.ray_stop(SETTINGS, host)) for host in network.hosts])


def test_a_worker_fails_bounded_naming_an_unreachable_head(network: TestNetwork, hosts: list[TestHost]) -> None:
    impatient = dataclasses.replace(SETTINGS, head_wait_timeout_s=4)
    result = network.run(hosts[1], steps.worker(impatient, hosts[1], UNREACHABLE_IP, 1), timeout=60)
    assert result.returncode != 0
    assert re.search(rf"FAILED: head {re.escape(UNREACHABLE_IP)}:6379 unreachable after [4-9]s", result.stderr)
    assert result.seconds < 30


def test_steps_fail_naming_a_missing_container(network: TestNetwork, hosts: list[TestHost]) -> None:
    elsewhere = dataclasses.replace(SETTINGS, container_name="not-created")
    result = network.run(hosts[0], steps.head(elsewhere, hosts[0]))
    assert result.returncode != 0
    assert "FAILED: container not-created does not exist on this host (the container step creates it)" in result.stderr


def test_a_configured_secret_that_is_not_set_fails_before_ray_starts(
    network: TestNetwork, hosts: list[TestHost]
) -> None:
    wants_key = dataclasses.replace(SETTINGS, extra_env_names=("WANDB_API_KEY",))
    result = network.run(hosts[0], steps.head(wants_key, hosts[0]))  # no secrets given
    assert result.returncode != 0
    assert "RAY_EXTRA_ENV_NAMES lists WANDB_API_KEY, but WANDB_API_KEY is not set in this step" in result.stderr
    assert network.run(hosts[0], "pgrep -x raylet || :").stdout.strip() == ""
