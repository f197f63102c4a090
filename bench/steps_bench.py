"""How long the steps take that can run here, for the baked-image path (devtools/schedule.py MEASURED_SECONDS).

    python -m bench steps [--repeats 3] [--ray]      (--ray: root; builds the real-host tier's hosts)

node   The bootstrap steps on a node booted from a baked image, where the driver, Docker, the NVIDIA toolkit and the
       image are already there: the real scripts (first boot, prepare-host, docker, pull-image, gpu-ready over ssh),
       rendered as the program renders them, on a fake node (tests/helpers/baked_node.py) whose stand-ins answer for
       what
       cannot run here (package manager, systemd, dockerd, the GPU). Each step's wall time, median of the repeats.
ray    (--ray) The Ray and job steps over SSH on the real-host tier (network-namespace hosts, real sshd, Ray 2.48.0;
       tests/e2e): ray-head, the ray-worker steps in parallel, the readiness gate, the head's and the workers' steps
       again while Ray runs with their settings (what they do on a resumed cluster: find it and leave it), and the
       job submission (with its watch for an immediate failure). Run it under the tier's lock:
       flock /tmp/rc-e2e.lock python -m bench steps --ray

Not measurable here: the cloud's boot of an instance and the container start (no dockerd); the schedule keeps
nominal figures for those.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The test harnesses import each other as top-level modules (pytest's layout).
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from baked_node import STEPS, boot_from_image, new_node, run_bootstrap  # type: ignore[import-not-found]  # noqa: E402


def node_steps(repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {step: [] for step in STEPS}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="rc-steps-bench-") as tmp:
            node = new_node(Path(tmp))
            first = run_bootstrap(node)
            if any(first[s].returncode != 0 for s in STEPS):
                raise RuntimeError(f"new-node bootstrap failed: {first}")
            results = run_bootstrap(boot_from_image(node))
            for step in STEPS:
                if results[step].returncode != 0:
                    raise RuntimeError(f"{step} failed on the baked node: {results[step]}")
                times[step].append(results[step].seconds)
    return {step: statistics.median(values) for step, values in times.items()}


def ray_steps(repeats: int, hosts: int) -> dict[str, float]:
    import e2e_steps as steps  # type: ignore[import-not-found]
    from e2e_harness import hosts_for_script  # type: ignore[import-not-found]

    from infra.ray import step_env

    settings = step_env.RaySettings(container_name="roll", gpus_per_node=2, object_store_memory=100 * 1024 * 1024,
                              num_cpus=1, ready_timeout_s=300)
    times: dict[str, list[float]] = {"ssh-session": [], "ray-head": [], "ray-worker": [], "ray-ready": [],
                                     "ray-head-found": [], "ray-worker-found": [], "job": []}
    with hosts_for_script(hosts) as network:
        for host in network.hosts:
            network.create_container(host, "roll")
        head, workers = network.hosts[0], network.hosts[1:]

        def start_head() -> None:
            network.run(head, steps.head(settings, head)).check()

        def join_workers() -> None:
            for result in network.run_parallel(
                [(h, steps.worker(settings, h, head.ip, rank)) for rank, h in enumerate(workers, start=1)]
            ):
                result.check()

        def check_ready() -> None:
            network.run(head, steps.ready(settings, head, [h.ip for h in network.hosts])).check()

        def timed(key: str, action: Callable[[], None]) -> None:
            started = time.monotonic()
            action()
            times[key].append(time.monotonic() - started)

        for repeat in range(repeats):
            # What every remote step pays on top of its script: one SSH session (the node steps above ran locally).
            timed("ssh-session", lambda: network.run(head, "true").check())
            timed("ray-head", start_head)
            timed("ray-worker", join_workers)
            timed("ray-ready", check_ready)
            # The Ray steps again while Ray runs with the settings they ask for, as on a resumed cluster (the
            # container's main process restarted Ray at boot): each finds it and leaves it.
            timed("ray-head-found", start_head)
            timed("ray-worker-found", join_workers)
            job = step_env.JobSubmission(job_id=f"bench-steps-{repeat}", workdir="/tmp", entrypoint="sleep 60")
            started = time.monotonic()
            network.run(head, steps.submit(settings, head, job)).check()
            times["job"].append(time.monotonic() - started)
            network.run(head, steps.job_stop(settings, head, job.job_id)).check()
            for result in network.run_parallel([(h, steps.ray_stop(settings, h)) for h in network.hosts]):
                result.check()
    return {step: statistics.median(values) for step, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ray", action="store_true", help="also the Ray and job steps on the real-host tier (root)")
    parser.add_argument("--hosts", type=int, default=3)
    args = parser.parse_args()
    figures = node_steps(args.repeats)
    if args.ray:
        figures.update(ray_steps(args.repeats, args.hosts))
    print(f"median of {args.repeats} runs, seconds (baked-image path; node steps on a prepared fake node"
          + (f", Ray and job on {args.hosts} real-host-tier hosts)" if args.ray else ")"))
    for step, seconds in figures.items():
        print(f"  {step:14} {seconds:6.2f}")
    print(f"  {'total':14} {sum(figures.values()):6.2f}")


if __name__ == "__main__":
    main()
