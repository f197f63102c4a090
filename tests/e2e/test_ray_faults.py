"""Faults on real hosts with Ray's default ports: an unreachable head, a missing container, a missing secret, a
worker that belongs to another cluster, a head whose container already runs someone else's Ray.

Stand-ins as in test_ray_cluster.py: `docker` (the container is the host itself) and GPUs (`--num-gpus=2`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import e2e_steps as steps
import pytest
from e2e_harness import UNREACHABLE_IP, TestHost, TestNetwork

from infra import ray_commands as rc

pytestmark = pytest.mark.e2e

CONTAINER = "roll"
SETTINGS = rc.RaySettings(
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


def test_a_worker_of_another_cluster_leaves_it_and_joins_this_head(network: TestNetwork, hosts: list[TestHost]) -> None:
    head, other_head, worker = hosts
    network.run_parallel([(head, steps.head(SETTINGS, head)), (other_head, steps.head(SETTINGS, other_head))])
    network.run(worker, steps.worker(SETTINGS, worker, other_head.ip, 1)).check()

    moved = network.run(worker, steps.worker(SETTINGS, worker, head.ip, 1)).check()
    ready = network.run(head, steps.ready(SETTINGS, head, [head.ip, worker.ip])).check()
    other_alone = network.run(other_head, steps.ready(SETTINGS, other_head, [other_head.ip])).check()

    assert f"belongs to {other_head.ip}:6379, not {head.ip}:6379: stopping it to rejoin" in moved.stdout
    assert "cluster ready: 2 of 2 nodes, 4 of 4 GPUs" in ready.stdout
    assert "cluster ready: 1 of 1 nodes, 2 of 2 GPUs" in other_alone.stdout


def test_a_head_refuses_a_container_that_runs_another_clusters_ray(network: TestNetwork, hosts: list[TestHost]) -> None:
    head, worker = hosts[0], hosts[2]  # the worker joined the head in the test above
    result = network.run(worker, steps.head(SETTINGS, worker))
    assert result.returncode != 0
    assert f"Ray already runs in container roll as part of the cluster at {head.ip}:6379" in result.stderr
    assert network.run(head, steps.ready(SETTINGS, head, [head.ip, worker.ip])).returncode == 0
