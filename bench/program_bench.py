"""The whole program under the offline cloud at 1, 8, 32 and 64 nodes: wall time, resources registered, and the
modelled time to a running job (devtools/schedule.py) on each path: a new cluster with the image as configured, a new
cluster with the image in the region's registry (VPC), and nodes booted from a baked image. None may grow with the
node count.

    python -m bench [--repeat 3] [--stack multi]
"""

from __future__ import annotations

import argparse
import statistics
import time

from devtools.offline_cloud import OfflineCloud, run_program
from devtools.schedule import PATHS, profiles, schedule
from infra.node import steps

SIZES = (1, 8, 32, 64)


def measure(stack: str, nodes: int, repeat: int) -> tuple[float, int, dict[str, float]]:
    walls = []
    resources = 0
    totals: dict[str, float] = {}
    for _ in range(repeat):
        cloud = OfflineCloud()
        started = time.perf_counter()
        # ROLL checks rollout_batch_size against Megatron's data-parallel size (every GPU here): 128 fits all sizes.
        config = {
            "roll-cluster:nodes": {"count": nodes},
            "roll-cluster:training": {"overrides": {"rollout_batch_size": 128}},
        }
        result = run_program(stack, cloud=cloud, config=config)
        walls.append(time.perf_counter() - started)
        resources = len(cloud.resources)
        totals = {name: schedule(result.steps, p).total for name, p in profiles(steps.NOTES["config"]).items()}
    return statistics.median(walls), resources, totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stack", default="multi")
    args = parser.parse_args()
    print(f"stack {args.stack}, median of {args.repeat} runs; minutes to a running job per path")
    print(f"{'nodes':>5} {'wall s':>8} {'resources':>10} " + " ".join(f"{p:>10}" for p in PATHS))
    for nodes in SIZES:
        wall, resources, totals = measure(args.stack, nodes, args.repeat)
        print(f"{nodes:>5} {wall:>8.2f} {resources:>10} " + " ".join(f"{totals[p]:>10.1f}" for p in PATHS))


if __name__ == "__main__":
    main()
