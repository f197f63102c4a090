"""The bootstrap schedule as a graph: earliest finish of every node step, from the dependencies the program
declares (infra/node/steps.py records them) and nominal durations of each kind of step.

Used by the offline plan, the tests and the benchmark to show that nodes bootstrap in parallel, that the image
pull overlaps the driver installation, and that the critical path does not grow with the node count.
Durations are typical figures from the reference notes (driver auto-install 10-20 min, first pull of a ROLL
image 15-20 min), not measurements: what matters is the shape of the graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from infra.node.steps import StepRecord

# Minutes. The driver installer starts at first boot, on its own (user data), so it is a virtual step.
NOMINAL_MINUTES: Mapping[str, float] = {
    "instance": 2.0,
    "driver": 15.0,
    "prepare-host": 1.0,
    "docker": 2.0,
    "pull-image": 15.0,
    "gpu-ready": 2.0,  # after both the pull and the driver: the reboot and nvidia-smi
    "image": 0.1,
    "container": 0.5,
    "code": 5.0,
    "ray-head": 0.5,
    "ray-worker": 0.5,
    "ray-ready": 0.2,
    "reward-server": 3.0,
    "job": 0.5,
}


@dataclass(frozen=True)
class Schedule:
    finish: dict[str, float]  # step key -> earliest finish (minutes after `pulumi up` starts)
    critical_path: list[str]

    @property
    def total(self) -> float:
        return max(self.finish.values()) if self.finish else 0.0


def schedule(records: Iterable[StepRecord]) -> Schedule:
    by_key = {r.key: r for r in records}
    finish: dict[str, float] = {}
    previous: dict[str, str | None] = {}

    def node_start(node: str) -> float:
        return NOMINAL_MINUTES["instance"]

    def driver_done(node: str) -> float:
        return node_start(node) + NOMINAL_MINUTES["driver"]

    def visit(key: str, trail: tuple[str, ...] = ()) -> float:
        if key in finish:
            return finish[key]
        if key in trail:
            raise ValueError(f"dependency cycle: {' -> '.join((*trail, key))}")
        record = by_key[key]
        start, before = node_start(record.node), None
        for dependency in record.depends_on:
            done = visit(dependency, (*trail, key))
            if done > start:
                start, before = done, dependency
        if record.step == "gpu-ready" and driver_done(record.node) > start:
            start, before = driver_done(record.node), f"{record.node}/driver"
        finish[key] = start + NOMINAL_MINUTES.get(record.step, 0.0)
        previous[key] = before
        return finish[key]

    for key in by_key:
        visit(key)
    last = max(finish, key=lambda k: finish[k]) if finish else None
    path: list[str] = []
    while last is not None:
        path.append(last)
        last = previous.get(last)
    return Schedule(finish, list(reversed(path)))

