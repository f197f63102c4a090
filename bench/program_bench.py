"""The whole program under the offline cloud at 1, 8, 32 and 64 nodes: wall time, resources registered, and the
modelled bootstrap critical path (infra/schedule.py), which must not grow with the node count.

    python -m bench.program_bench [--repeat 3] [--stack multi]
"""

from __future__ import annotations

import argparse
import statistics
import time

from infra.offline import OfflineCloud, run_program
from infra.schedule import schedule

SIZES = (1, 8, 32, 64)


def measure(stack: str, nodes: int, repeat: int) -> tuple[float, int, float]:
    walls = []
    resources = 0
    critical = 0.0
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
        critical = schedule(result.steps).total
    return statistics.median(walls), resources, critical


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stack", default="multi")
    args = parser.parse_args()
    print(f"stack {args.stack}, median of {args.repeat} runs")
    print(f"{'nodes':>5} {'wall s':>8} {'resources':>10} {'critical path min':>18}")
    for nodes in SIZES:
        wall, resources, critical = measure(args.stack, nodes, args.repeat)
        print(f"{nodes:>5} {wall:>8.2f} {resources:>10} {critical:>18.1f}")


if __name__ == "__main__":
    main()
