"""The companion's commands. Each runs what a stack output holds (the outputs stay for scripts) or the `pulumi`
command a user would type, so what it does is what the README describes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent


class CompanionError(Exception):
    """Something the user can fix: printed without a traceback."""


def stack_outputs(stack: str | None) -> tuple[str, dict[str, Any]]:
    """The stack's name and outputs (secrets in plain text, as `pulumi stack output --show-secrets`)."""
    from pulumi import automation as auto

    try:
        workspace = auto.LocalWorkspace(work_dir=str(PROJECT))
        if stack is None:
            current = workspace.stack()
            if current is None:
                raise CompanionError("no stack selected: pass --stack NAME or run `pulumi stack select NAME`")
            stack = current.name
        outputs = workspace.stack_outputs(stack)
    except auto.CommandError as error:
        raise CompanionError(f"pulumi could not read stack {stack}: {str(error).strip()}") from None
    return stack, {name: value.value for name, value in outputs.items()}


def _output(outputs: Mapping[str, Any], name: str, why: str = "") -> str:
    if name not in outputs:
        raise CompanionError(f"the stack has no `{name}` output{why}; run `pulumi up` first")
    return str(outputs[name])


def _sh(command: str) -> int:
    """Run an output's shell command as `| sh` would: its quotes are the shell's, `~` expands."""
    return subprocess.run(["sh", "-c", command], check=False).returncode


def _pulumi(*args: str) -> int:
    return subprocess.run(["pulumi", *args], cwd=PROJECT, check=False).returncode


def status(stack: str, outputs: Mapping[str, Any], _: argparse.Namespace) -> int:
    print(f"stack {stack}: {outputs.get('gpus')} x {outputs.get('gpuModel')} "
          f"in {outputs.get('instanceType') or 'your hosts'} {outputs.get('zone') or ''}".rstrip())
    for node in outputs.get("nodes") or []:
        print(f"  {node.get('name'):8} public {node.get('publicIp') or '-':16} private {node.get('privateIp')}")
    cost = outputs.get("cost")
    if isinstance(cost, dict):
        print(f"  cost: {cost['running']['perHour']:.2f} {cost['currency']}/h running, "
              f"{cost['paused']['perHour']:.2f} paused; autostop: {cost['autostop']}")
    if "jobStatus" not in outputs:
        print("  job: not submitted (training.autoStart false): `python3 -m companion resubmit` submits it")
        return 1
    return _sh(_output(outputs, "jobStatus"))


def logs(_stack: str, outputs: Mapping[str, Any], _: argparse.Namespace) -> int:
    return _sh(_output(outputs, "jobLogs", " (no job was submitted)"))


def ssh(_stack: str, outputs: Mapping[str, Any], args: argparse.Namespace) -> int:
    command = _output(outputs, "sshHead")
    if args.node:
        nodes = {n.get("name"): n for n in outputs.get("nodes") or []}
        head = (outputs.get("nodes") or [{}])[0].get("publicIp")
        if args.node not in nodes:
            raise CompanionError(f"no node {args.node!r}; the nodes are {', '.join(sorted(map(str, nodes)))}")
        # The same login, host-key file and key; only the address differs (every node's key is in that file).
        command = command.replace(f"@{head}", f"@{nodes[args.node].get('publicIp')}")
    return _sh(command)


def dashboard(_stack: str, outputs: Mapping[str, Any], _: argparse.Namespace) -> int:
    print("dashboard on http://localhost:8265 while this runs (Ctrl-C ends the tunnel)", file=sys.stderr)
    return _sh(_output(outputs, "dashboardTunnel"))


def stop(_stack: str, outputs: Mapping[str, Any], _: argparse.Namespace) -> int:
    return _sh(_output(outputs, "jobStop", " (no job was submitted)"))


def resubmit(_stack: str, outputs: Mapping[str, Any], _: argparse.Namespace) -> int:
    return _sh(str(outputs.get("jobResubmit") or _output(outputs, "jobSubmit")))


def pause(stack: str, _outputs: Mapping[str, Any], _: argparse.Namespace) -> int:
    """nodes.paused true and `pulumi up`: every instance stops in economical mode (StopCharging)."""
    status = _pulumi("config", "set", "--stack", stack, "--path", "roll-cluster:nodes.paused", "true")
    return status or _pulumi("up", "--stack", stack)


# The instances' URNs, as `--target` globs them (pulumi pkg/resource/deploy/deployment.go NewUrnTargets: `**` any
# text, `*` any text without `:`). A glob that matches nothing is no error (only literal targets are checked).
INSTANCES_GLOB = "**alicloud:ecs/instance:Instance::*"
# The job step: a stopped head kept no job, so the `up` submits it again. It would follow the head's new start_time
# anyway, but that is known only once the instance started, so a preview would not show it: replaced by name, the
# preview says so (no such resource with training.autoStart false: a glob that matches nothing is no error).
JOB_GLOB = "**::training-job"


def resume(stack: str, _outputs: Mapping[str, Any], _: argparse.Namespace) -> int:
    """nodes.paused removed, a refresh of the instances only, then `pulumi up`. The refresh sees instances that
    autostop stopped, and instances that are gone (a reclaimed spot node, one deleted in the console). Only the
    instances: a refresh Reads every resource, and a docker container's or image's Read dials its node over SSH at
    the address the state holds, which a stopped instance released, so a whole refresh (`up --refresh`) fails there.
    After autostop the setting was never there: the removal's complaint, if any, does not stop the update."""
    _pulumi("config", "rm", "--stack", stack, "--path", "roll-cluster:nodes.paused")
    refreshed = _pulumi("refresh", "--stack", stack, "--yes", "--target", INSTANCES_GLOB)
    return refreshed or _pulumi("up", "--stack", stack, "--replace", JOB_GLOB)


def cost(stack: str, outputs: Mapping[str, Any], _: argparse.Namespace) -> int:
    figures = outputs.get("cost")
    if not isinstance(figures, dict):
        raise CompanionError(f"stack {stack} reports no `cost` output (own hosts, or deployed before it existed)")
    hours = _hours_since_last_update(stack)
    rate = figures["running"]["perHour"]
    print(f"running {rate:.2f} {figures['currency']}/h; paused {figures['paused']['perHour']:.2f}/h "
          f"(keeps billing {figures['paused']['keepsBilling']})")
    if hours is not None:
        print(f"since the last `pulumi up` ({hours:.1f} h ago): at most {hours * rate:.2f} {figures['currency']} "
              "(an estimate: a pause or an autostop since then bills less)")
    for item in figures["afterDestroy"]:
        print(f"after destroy: {item}")
    print(f"autostop: {figures['autostop']}")
    return 0


def _hours_since_last_update(stack: str) -> float | None:
    done = subprocess.run(["pulumi", "stack", "history", "--json", "--stack", stack], cwd=PROJECT,
                          capture_output=True, text=True, check=False)
    try:
        updates = json.loads(done.stdout or "[]")
        started = datetime.fromisoformat(str(updates[0]["startTime"]).replace("Z", "+00:00"))
    except (ValueError, LookupError, TypeError):
        return None
    return max(0.0, (time.time() - started.timestamp()) / 3600.0)


COMMANDS: dict[str, tuple[Callable[[str, Mapping[str, Any], argparse.Namespace], int], str]] = {
    "status": (status, "the nodes, the cost and the job's Ray status"),
    "logs": (logs, "follow the job's log (Ctrl-C stops following, not the job)"),
    "ssh": (ssh, "a shell on the head (or --node node-1)"),
    "dashboard": (dashboard, "the SSH tunnel to the Ray dashboard on localhost"),
    "stop": (stop, "stop the job; the nodes keep running (and billing)"),
    "resubmit": (resubmit, "submit the job again (pulumi up --replace of the job step)"),
    "pause": (pause, "stop every instance (StopCharging): nodes.paused true, then pulumi up"),
    "resume": (resume, "start them again (also after autostop or a reclaim): nodes.paused removed, the "
               "instances refreshed, then pulumi up"),
    "cost": (cost, "what the cluster costs per hour, paused, after destroy, and so far"),
}


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m companion", description=__doc__.splitlines()[0])
    parser.add_argument("--stack", help="the stack (default: the selected one)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text)
        command.add_argument("--stack", default=argparse.SUPPRESS, help="the stack (default: the selected one)")
        if name == "ssh":
            command.add_argument("--node", help="a node's name, e.g. node-1 (default: the head)")
    args = parser.parse_args(argv)
    try:
        stack, outputs = stack_outputs(args.stack)
        return COMMANDS[args.command][0](stack, outputs, args)
    except CompanionError as error:
        print(f"companion: {error}", file=sys.stderr)
        return 2
