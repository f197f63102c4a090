"""The whole program under the offline cloud at 1, 8, 32 and 64 nodes (wall time, resources registered), its CPU
time per node against the bare SDK's floor for the same resources (`run_bare`), the state's and the inputs' size
per node at 2, 64 and 256 nodes, and the modelled time from `pulumi up` to the first training step
(devtools/schedule.py) at 2, 16, 64 and 256 nodes on each path: a new cluster as configured, a new cluster with
the image in the region's registry and the model on the shared storage, and a warm start from a baked image; with
Pulumi's parallelism at least the node count (as the docs' commands set it) and at a laptop's default (4 x 8 CPUs
= 32 slots); and with the modelled options.

    python -m bench [--repeat 3] [--stack multi]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Mapping
from typing import Any

import pulumi
from pulumi.runtime import settings as pulumi_settings

from devtools import engine_model
from devtools.engine_model import PROVIDER_PREFIX, state_json
from devtools.offline_cloud import OfflineCloud, OfflineRun, Registered, _run_to_completion, run_program, unwrap
from devtools.schedule import (
    NO_OPTIONS,
    NO_SNAPSHOT_PREFETCH,
    NODE_COUNTS,
    OPTIONS,
    OPTIONS_ON_STACK_DISK,
    PATHS,
    RESUME,
    RESUMED,
    Options,
    Path,
    first_step,
    without_cache,
)

SIZES = (1, 8, 32, 64)
LAPTOP_SLOTS = 32  # Pulumi's default on an 8-CPU machine: 4 x NumCPU
# ROLL checks rollout_batch_size against Megatron's data-parallel size (every GPU here): 128 fits all sizes.
FITS = {"roll-cluster:training": {"overrides": {"rollout_batch_size": 128}}}


def measure(stack: str, nodes: int, repeat: int) -> tuple[float, int]:
    walls = []
    resources = 0
    for _ in range(repeat):
        cloud = OfflineCloud()
        started = time.perf_counter()
        run_program(stack, cloud=cloud, config={"roll-cluster:nodes": {"count": nodes}, **FITS})
        walls.append(time.perf_counter() - started)
        resources = len(cloud.resources)
    return statistics.median(walls), resources


OVERHEAD_SIZES = (1, 64)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def declared_outputs(stack: str, nodes: int) -> dict[str, list[str]]:
    """Each resource's declared properties (its typed class's, camelCase), from an untimed run of the program: a
    typed resource makes an Output for each of them, whether set or not, so the floor declares them too."""
    found: dict[str, list[str]] = {}
    original = pulumi.CustomResource.__init__

    def recording(self: pulumi.CustomResource, t: str, name: str, *args: Any, **kwargs: Any) -> None:
        found[name] = [_camel(n) for n, v in vars(type(self)).items() if isinstance(v, property)]
        original(self, t, name, *args, **kwargs)

    pulumi.CustomResource.__init__ = recording  # type: ignore[method-assign]
    try:
        run_program(stack, cloud=OfflineCloud(), config={"roll-cluster:nodes": {"count": nodes}, **FITS})
    finally:
        pulumi.CustomResource.__init__ = original  # type: ignore[method-assign]
    return found


def run_bare(resources: list[Registered], declared: Mapping[str, list[str]] | None = None) -> float:
    """The bare SDK's floor, in CPU seconds: a minimal program registering the same resources (type, name, the
    inputs the program gave them as plain values, the typed classes' other declared properties unset; components as
    components, providers as providers) with the same dependencies under the same mocks, with no configuration,
    rendering, Output chains or checks of its own."""
    cloud = OfflineCloud()
    pulumi.runtime.set_mocks(cloud, project="roll-cluster", stack="multi", preview=False, organization="organization")
    # The same mocks as the program's runs (devtools/offline_cloud.py run_program): the engine's record of each
    # registration, and each resource's options captured by a stack transformation.
    engine_model.record_registrations(pulumi_settings.SETTINGS.monitor, cloud.registrations)

    def capture_options(args: pulumi.ResourceTransformationArgs) -> None:
        cloud.options[args.name] = args.opts

    def props(r: Registered) -> dict[str, Any]:
        inputs = dict(unwrap(r.inputs))
        return {**{name: None for name in (declared or {}).get(r.name, []) if name not in inputs}, **inputs}

    def program() -> dict[str, Any]:
        pulumi.runtime.register_stack_transformation(capture_options)
        made: dict[str, pulumi.Resource] = {}
        for r in resources:
            names = r.registration.dependencies if r.registration is not None else frozenset()
            opts = pulumi.ResourceOptions(depends_on=[made[n] for n in sorted(names) if n in made])
            if not r.custom:
                made[r.name] = pulumi.ComponentResource(r.type, r.name, opts=opts)
            elif r.type.startswith(PROVIDER_PREFIX):
                made[r.name] = pulumi.ProviderResource(r.type.removeprefix(PROVIDER_PREFIX), r.name, props(r), opts)
            else:
                made[r.name] = pulumi.CustomResource(r.type, r.name, props(r), opts)
        return {}

    started = time.process_time()
    _run_to_completion(program)
    return time.process_time() - started


def measure_overhead(stack: str, repeat: int) -> tuple[float, list[tuple[float, float, float, float]]]:
    """The program's time per node over the bare SDK's for the same resources per node, from 1 to 64 nodes: the
    median of `repeat` ratios, each from runs side by side (program and floor, at both sizes). Also each repeat's
    (program at 1, program at 64, floor at 1, floor at 64) seconds. The times are this process's CPU seconds
    (time.process_time, the mocks' threads included), not wall time: the machine is shared, and another process's
    load would otherwise land on whichever run it overlapped."""
    runs = []
    declared = {nodes: declared_outputs(stack, nodes) for nodes in OVERHEAD_SIZES}
    for _ in range(repeat):
        row: list[float] = []
        floors: list[float] = []
        for nodes in OVERHEAD_SIZES:
            cloud = OfflineCloud()
            started = time.process_time()
            run_program(stack, cloud=cloud, config={"roll-cluster:nodes": {"count": nodes}, **FITS})
            row.append(time.process_time() - started)
            floors.append(run_bare(list(cloud.resources), declared[nodes]))
        runs.append((row[0], row[1], floors[0], floors[1]))
    ratios = [(p64 - p1) / (f64 - f1) for p1, p64, f1, f64 in runs]
    return statistics.median(ratios), runs


STATE_SIZES = (2, 64, 256)


def state_bytes(cloud: OfflineCloud) -> int:
    """What Pulumi would store for the resources the program registered: each one's inputs and outputs as JSON
    (the mocks' outputs repeat the inputs, without the commands' stdout)."""
    return sum(len(json.dumps(r.inputs, default=state_json)) + len(json.dumps(r.outputs, default=state_json))
               for r in cloud.resources)


def input_bytes(cloud: OfflineCloud) -> int:
    """The resources' inputs alone, as the state keeps them (what a `pulumi preview --diff` compares)."""
    return sum(len(json.dumps(r.inputs, default=state_json)) for r in cloud.resources)


def measure_inputs(stack: str, nodes: int) -> int:
    cloud = OfflineCloud()
    run_program(stack, cloud=cloud, config={"roll-cluster:nodes": {"count": nodes}, **FITS})
    return input_bytes(cloud)


def measure_state(stack: str, nodes: int) -> tuple[int, int]:
    """(resources, bytes of state) of the stack at `nodes` nodes under the offline cloud."""
    cloud = OfflineCloud()
    run_program(stack, cloud=cloud, config={"roll-cluster:nodes": {"count": nodes}, **FITS})
    return len(cloud.resources), state_bytes(cloud)


def first_step_rows(result: OfflineRun) -> list[tuple[str, list[float]]]:
    config = result.notes["config"]
    records = list(result.steps)

    def row(path: Path, options: Options, slots: int | None = None, stack: Any = None) -> list[float]:
        return [first_step(stack or config, records, path, n, slots or n, options).total for n in NODE_COUNTS]

    rows: list[tuple[str, list[float]]] = [(path, row(path, NO_OPTIONS)) for path in PATHS]
    rows += [(f"{path}, {LAPTOP_SLOTS} slots", row(path, NO_OPTIONS, LAPTOP_SLOTS)) for path in ("in-region",)]
    rows.append(("warm, resumed", row("warm", RESUMED)))
    rows.append(("in-region, no pull cache", row("in-region", NO_OPTIONS, stack=without_cache(config))))
    # Modelled options the program does not build (docs/performance.md, 'Modelled options, not built').
    rows += [(f"NOT BUILT {path} + options", row(path, OPTIONS)) for path in ("in-region", "warm")]
    rows.append(("NOT BUILT warm + opt., no prefetch", row("warm", NO_SNAPSHOT_PREFETCH)))
    rows.append(("NOT BUILT resumed + options", row("warm", RESUME)))
    rows.append(("NOT BUILT in-region + opt., PL1", row("in-region", OPTIONS_ON_STACK_DISK)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--stack", default="multi")
    args = parser.parse_args()
    print(f"stack {args.stack}, median of {args.repeat} runs: the program under the offline cloud")
    print(f"{'nodes':>5} {'wall s':>8} {'resources':>10}")
    for nodes in SIZES:
        wall, resources = measure(args.stack, nodes, args.repeat)
        print(f"{nodes:>5} {wall:>8.2f} {resources:>10}")
    ratio, runs = measure_overhead(args.stack, args.repeat)
    print(f"\nthe program's CPU time per node over the bare SDK's for the same resources, 1 to 64 nodes: {ratio:.2f}x"
          f" (median of {args.repeat}; the goal: at most 1.5x)")
    print(f"{'program 1':>10} {'program 64':>11} {'floor 1':>8} {'floor 64':>9} {'ratio':>6}")
    for p1, p64, f1, f64 in runs:
        print(f"{p1:>10.2f} {p64:>11.2f} {f1:>8.2f} {f64:>9.2f} {(p64 - p1) / (f64 - f1):>6.2f}")
    print("\nPulumi's state (inputs and outputs as JSON, without stdout): devtools/schedule_figures.py MEASURED_STATE")
    print(f"{'nodes':>5} {'resources':>10} {'MB':>8} {'KB per node':>12} {'inputs KB/node':>15}")
    _, base_bytes = measure_state(args.stack, 1)
    base_inputs = measure_inputs(args.stack, 1)
    for nodes in STATE_SIZES:
        resources, size = measure_state(args.stack, nodes)
        per_node = (size - base_bytes) / (nodes - 1) / 1000.0
        inputs_per_node = (measure_inputs(args.stack, nodes) - base_inputs) / (nodes - 1) / 1000.0
        print(f"{nodes:>5} {resources:>10} {size / 1e6:>8.1f} {per_node:>12.0f} {inputs_per_node:>15.1f}")
    print("\nminutes from `pulumi up` to the first training step (modelled; --parallel >= N unless said)")
    print(f"{'path':36}" + "".join(f"{n:>8}" for n in NODE_COUNTS))
    for label, cells in first_step_rows(run_program(args.stack, config=FITS)):
        print(f"{label:36}" + "".join(f"{cell:>8.1f}" for cell in cells))


if __name__ == "__main__":
    main()
