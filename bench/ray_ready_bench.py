"""Ray readiness benchmark on the real-host test hosts (tests/e2e): from "all hosts up" to "cluster ready".

    python -m bench ray [--hosts 3] [--repeats 3]      (root; builds the hosts like the e2e tier)

Two ways to the same cluster (3 hosts, 2 GPUs announced per host, the same Ray options), each timed end to end:
  project  the project's steps over SSH: ray-head, then the ray-worker steps in parallel, then the readiness gate
  bare     what a guide does by hand over SSH: `ray start --head`, then `ray start --address` on the workers in
           parallel, then `ray status` every second until it lists every node
Prints every run, the medians and the ratio project / bare (goal: at most 1.2). Ray is stopped between runs.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

# The e2e tier's harness and steps, which import each other as top-level modules (pytest's layout).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))

import e2e_steps as steps  # type: ignore[import-not-found]  # mypy does not follow the sys.path line above
from e2e_harness import TestHost, TestNetwork, hosts_for_script  # type: ignore[import-not-found]

from infra.ray import step_env

CONTAINER = "roll"
SETTINGS = step_env.RaySettings(
    container_name=CONTAINER, gpus_per_node=2, object_store_memory=100 * 1024 * 1024, num_cpus=1, ready_timeout_s=300
)
COMMON_OPTIONS = "--num-gpus=2 --num-cpus=1 --object-store-memory=104857600 --disable-usage-stats"


def project_run(network: TestNetwork) -> float:
    head, workers = network.hosts[0], network.hosts[1:]
    started = time.monotonic()
    network.run(head, steps.head(SETTINGS, head)).check()
    for result in network.run_parallel(
        [(host, steps.worker(SETTINGS, host, head.ip, rank)) for rank, host in enumerate(workers, start=1)]
    ):
        result.check()
    network.run(head, steps.ready(SETTINGS, head, [h.ip for h in network.hosts])).check()
    return time.monotonic() - started


def bare_run(network: TestNetwork) -> float:
    head, workers = network.hosts[0], network.hosts[1:]
    started = time.monotonic()
    network.run(
        head,
        f"docker exec {CONTAINER} ray start --head --node-ip-address={head.ip} --port=6379 "
        f"--dashboard-host=0.0.0.0 {COMMON_OPTIONS}",
    ).check()
    for result in network.run_parallel(
        [
            (
                host,
                f"docker exec {CONTAINER} ray start --address={head.ip}:6379 "
                f"--node-ip-address={host.ip} {COMMON_OPTIONS}",
            )
            for host in workers
        ]
    ):
        result.check()
    deadline = time.monotonic() + 300
    while True:
        status = network.run(head, f"docker exec {CONTAINER} ray status --address={head.ip}:6379").stdout
        active = status.split("Pending:")[0]
        if len(re.findall(r"^\s*1 node_", active, flags=re.MULTILINE)) == len(network.hosts):
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise RuntimeError(f"bare cluster not complete after 300s:\n{status}")
        time.sleep(1)


def stop_ray(network: TestNetwork, hosts: list[TestHost]) -> None:
    for result in network.run_parallel([(host, steps.ray_stop(SETTINGS, host)) for host in hosts]):
        result.check()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with hosts_for_script(args.hosts) as network:
        for host in network.hosts:
            network.create_container(host, CONTAINER)
        times: dict[str, list[float]] = {"project": [], "bare": []}
        for repeat in range(args.repeats):
            # Alternate the order so that neither way always runs on a machine warmed up by the other.
            order = ["project", "bare"] if repeat % 2 == 0 else ["bare", "project"]
            for way in order:
                seconds = project_run(network) if way == "project" else bare_run(network)
                times[way].append(seconds)
                print(f"run {repeat + 1} {way:8s} {seconds:6.1f} s", flush=True)
                stop_ray(network, network.hosts)
        project, bare = statistics.median(times["project"]), statistics.median(times["bare"])
        print(f"hosts {args.hosts}, repeats {args.repeats}")
        print(f"median project steps (head, workers, readiness gate): {project:.1f} s")
        print(f"median bare ray start + polling ray status:           {bare:.1f} s")
        print(f"ratio project / bare: {project / bare:.2f} (goal <= 1.2)")


if __name__ == "__main__":
    main()
