"""Pulumi's parallelism against the node count. Pulumi runs at most `--parallel` resource operations at once,
by default 4 x the CPU count of the machine running `pulumi up` (pulumi/pulumi PR #15016, issue #14989;
`PULUMI_PARALLEL` since PR #18782: `defaultParallel = int32(runtime.NumCPU()) * 4`). Each node's bootstrap is a
chain of long SSH steps, each holding a slot while it runs, so with fewer slots than nodes the nodes bootstrap in
waves. The program cannot change the parallelism; it says when it is too low (at the start of `pulumi up`, and in
the offline plan)."""

from __future__ import annotations

import math
import os

SLOTS_PER_CPU = 4
# Slots beyond one per node: the cluster's other resources (network, NAS, known-hosts, Ray, job) run beside them.
MARGIN = 16


def default_slots(cpus: int | None = None) -> tuple[int, str]:
    """PULUMI_PARALLEL, else 4 x the CPU count; and where the figure came from."""
    env = os.environ.get("PULUMI_PARALLEL", "")
    if env.isdigit() and int(env) > 0:
        return int(env), f"PULUMI_PARALLEL={env}"
    count = cpus or os.cpu_count() or 1
    return SLOTS_PER_CPU * count, f"Pulumi's default 4 x {count} CPUs of this machine"


def engine_slots() -> tuple[int, str]:
    """The running engine's parallelism where the language host passes it to the program
    (pulumi.runtime.settings.SETTINGS.parallel; that it carries the CLI's `--parallel` is UNCONFIRMED), else
    default_slots()."""
    from pulumi.runtime import settings  # only under `pulumi up`: the plan and tests do not need the SDK here

    given = getattr(settings.SETTINGS, "parallel", None)
    if isinstance(given, int) and not isinstance(given, bool) and given > 0:
        return given, "the engine's --parallel"
    return default_slots()


def waves(nodes: int, slots: int) -> int:
    """How many groups the node bootstraps go in when each holds one of `slots` slots throughout."""
    return max(1, math.ceil(nodes / max(1, slots)))


def suggested(nodes: int) -> int:
    return nodes + MARGIN


def warning(nodes: int, slots: int, how: str) -> str | None:
    """What to say when `slots` would serialise the bootstraps of `nodes` nodes (None when they fit)."""
    if waves(nodes, slots) == 1:
        return None
    return (f"{nodes} nodes with {slots} Pulumi slots ({how}): each node's bootstrap holds a slot, so the nodes "
            f"bootstrap in {waves(nodes, slots)} waves, each as long as one node's bootstrap; run `pulumi up "
            f"--parallel {suggested(nodes)}` (or set PULUMI_PARALLEL={suggested(nodes)})")
