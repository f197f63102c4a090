"""The short summary of a stack, at most 50 lines: placement, the four costs, exposure, the time to the first
training step, warnings, notes and what changes.

The offline plan prints it by default (devtools/plan.py; `--full` prints everything) and `pulumi up` logs it at its
start (__main__.py), so both read alike. It registers nothing and reads only the configuration, the source's facts
and the `cost` figures.

Adding a line: a note that follows from the configuration is a function of NOTE_SOURCES (ClusterConfig -> lines);
the plan and `pulumi up` both show it. A warning only the plan can know (it needs the offline run) goes into the
plan's warning sources (devtools/plan.py, WARNING_SOURCES).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.config import ClusterConfig
from infra.cost import RATE_SOURCE
from infra.layout import SHARED_MOUNT

MAX_LINES = 50
WIDTH = 118
LABEL = 14  # the label column


@dataclass
class Summary:
    """The summary's parts, each a list of items (an item may wrap onto several lines)."""

    heading: str
    placement: list[str] = field(default_factory=list)
    job: list[str] = field(default_factory=list)
    cost: list[str] = field(default_factory=list)
    exposure: list[str] = field(default_factory=list)
    time: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    next: list[str] = field(default_factory=list)


def _wrap(label: str, item: str, width: int) -> list[str]:
    lines = textwrap.wrap(item, width=width - LABEL, break_on_hyphens=False, break_long_words=True) or [""]
    first = f"{label:<{LABEL}}{lines[0]}"
    return [first.rstrip(), *(" " * (LABEL + 2) + line for line in lines[1:])]


def _block(label: str, items: Sequence[str], width: int, bullet: str = "") -> list[str]:
    out: list[str] = []
    for index, item in enumerate(items):
        out += _wrap(label if index == 0 else "", bullet + item, width)
    return out


def summary_lines(summary: Summary, width: int = WIDTH, max_lines: int = MAX_LINES) -> list[str]:
    """The summary's lines, never more than max_lines: warnings and notes that do not fit are counted, with where
    to read them (the full plan)."""
    head = [summary.heading, ""]
    body: list[str] = []
    for label, part in (("placement", summary.placement), ("job", summary.job), ("cost", summary.cost),
                        ("exposure", summary.exposure), ("time", summary.time), ("changes", summary.changes)):
        body += _block(label, part, width)
    tail = _block("next", summary.next, width)
    room = max_lines - len(head) - len(body) - len(tail)
    items = [("warnings", "! ", index, item) for index, item in enumerate(summary.warnings)]
    items += [("notes", "- ", index, item) for index, item in enumerate(summary.notes)]
    flagged: list[str] = []
    for position, (label, bullet, index, item) in enumerate(items):
        lines = _wrap(label if index == 0 else "", bullet + item, width)
        last = position == len(items) - 1
        if len(flagged) + len(lines) > room - (0 if last else 1):
            left = len(items) - position
            flagged.append(f"{'':<{LABEL}}... {left} more warnings or notes: the full plan (--full) lists them")
            break
        flagged += lines
    return [*head, *body, *flagged, *tail]


# ---------------------------------------------------------------------------------------------------- the parts
def placement(config: ClusterConfig, machine_type: str, location: str, per_node: int, model: str) -> str:
    nodes = config.nodes.count
    noun = "node" if nodes == 1 else "nodes"
    if config.nodes.capabilities.existing_machines:
        return f"{nodes} own {'host' if nodes == 1 else 'hosts'} x {per_node} {model}; no cloud resource"
    return f"{nodes} {noun} x {machine_type} ({per_node} x {model} each) in {location}"


def job(config: ClusterConfig, job_id: str | None) -> str:
    start = "submitted by `pulumi up`" if config.training.auto_start else "prepared, not submitted (autoStart false)"
    named = f" {job_id}" if job_id else ""
    return f"{config.training.framework} job{named}: {start}"


def cost_section(figures: Mapping[str, Any] | None, bootstrap_minutes: float | None, basis: str) -> list[str]:
    """The four costs (before the job runs, running, paused, after destroy) and when autostop fires. The disk, NAS
    and traffic rates are estimates (infra/cost.py, RATE_SOURCE): said once, not on every line."""
    if not isinstance(figures, Mapping):
        return ["not reported (own hosts: the program rents nothing)"]

    def short(text: object) -> str:
        return str(text).replace(f" ({RATE_SOURCE})", "")

    currency = figures["currency"]
    running, paused = figures["running"], figures["paused"]
    rate = float(running["perHour"])
    lines = []
    if bootstrap_minutes is not None:
        lines.append(f"{'before the job runs':20}{bootstrap_minutes / 60.0 * rate:.2f} {currency} "
                     f"({bootstrap_minutes:.0f} min modelled at the running rate)")
    lines.append(f"{'running':20}{rate:.2f} {currency}/h (instances {running['instances']['perHour']:.2f}, {basis}; "
                 f"disks {running['disks']['perHour']:.2f}, estimated; public traffic out extra)")
    lines.append(f"{'paused':20}{float(paused['perHour']):.2f} {paused['currency']}/h "
                 f"(keeps billing {short(paused['keepsBilling'])})")
    lines.append(f"{'after destroy':20}" + "; ".join(short(item) for item in figures["afterDestroy"]))
    lines.append(f"{'autostop':20}{figures['autostop']}")
    return lines


def exposure(config: ClusterConfig) -> list[str]:
    """Who can reach what: the security group's inbound rules and the dashboard's mode, in words."""
    port = config.ray.dashboard_port
    if not config.nodes.capabilities.firewall:
        return ["your hosts' firewalls decide (no rule is changed); Ray listens on their private addresses",
                f"Ray dashboard on the head's 127.0.0.1:{port} only: reach it with `python3 -m companion dashboard`"]
    cidrs = ", ".join(config.access.admin_cidrs) or "nobody"
    lines = [f"SSH (tcp 22) from {cidrs} only; Ray, NCCL and Gloo between the cluster's nodes only; everything "
             "else inbound denied"]
    if config.access.dashboard == "admin-cidrs":
        lines.append(f"Ray dashboard (tcp {port}, no authentication) from {cidrs}")
    else:
        lines.append(f"Ray dashboard on the head's 127.0.0.1:{port} only: `python3 -m companion dashboard` tunnels it")
    return lines


def checkpoints_note(config: ClusterConfig) -> list[str]:
    """Where the checkpoints go, and whether they survive `pulumi destroy`."""
    if config.storage.shared:
        yours = config.nodes.capabilities.user_shared_storage  # the user's storage: never deleted by the stack
        kept = ("they survive pulumi destroy" if yours or config.storage.retain_on_destroy
                or config.storage.existing_file_system_id else "DELETED with the NAS on pulumi destroy")
        return [f"checkpoints on the shared storage ({SHARED_MOUNT}): {kept}"]
    return ["checkpoints on each node's disk: they DIE WITH THE NODE on pulumi destroy (leave storage.nas and "
            "storage.retainOnDestroy unset to keep them on a NAS)"]


# Notes both the plan and `pulumi up` show, each a function of the configuration (see the module's docstring).
NOTE_SOURCES: list[Callable[[ClusterConfig], list[str]]] = [checkpoints_note]


def notes(config: ClusterConfig) -> list[str]:
    return [line for source in NOTE_SOURCES for line in source(config)]


def for_update(config: ClusterConfig, stack: str, machine_type: str, location: str, per_node: int, model: str,
               figures: Mapping[str, Any] | None) -> str:
    """The summary `pulumi up` logs at its start: what the offline plan says by default, from the live placement and
    price (the time to the first step is the plan's model, not repeated here)."""
    result = Summary(
        heading=f"roll-cluster: stack {stack} (the offline plan, `python3 -m companion plan {stack}`, says the same "
                "with the modelled times)",
        placement=[placement(config, machine_type, location, per_node, model)],
        job=[job(config, None)],
        cost=cost_section(figures, None, "the region's list price or the catalog's (the `cost` output says which)"),
        exposure=exposure(config),
        changes=["`pulumi preview` (or the update's own display) lists each resource; steps that find their work "
                 "done return at once"],
        notes=notes(config),
    )
    return "\n".join(summary_lines(result))
