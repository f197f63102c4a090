"""roll-cluster's command-line tool: the offline plan and what users do every day, as commands instead of
`pulumi stack output X | sh`.

Run it from the project directory: python3 -m companion COMMAND [--stack NAME]. `plan` needs neither the Pulumi CLI
nor a cloud account; the other commands read the stack's outputs with the Pulumi CLI and run the commands they
hold (over SSH to the head), so what they do is what docs/operations.md describes. Every question to the Pulumi
CLI and every SSH connection is bounded: a missing CLI, an unreachable state backend or an unreachable head ends
the command within seconds, with what to do.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent
NAMESPACE = "roll-cluster"
PULUMI_TIMEOUT_S = 20  # one question to the Pulumi CLI (stack ls, stack output, history); a backend answers in ~1 s
LIST_BUDGET_S = 25  # `list` asks once per stack: all of them together within this
SSH_UNREACHABLE = 255  # ssh's exit status when it could not connect or log in (ssh(1), EXIT STATUS)
INSTALL_PULUMI = "https://www.pulumi.com/docs/iac/download-install/"


class CompanionError(Exception):
    """Something the user can fix: printed without a traceback."""


# ------------------------------------------------------------------------------------------- the Pulumi CLI
def _require_pulumi() -> str:
    found = shutil.which("pulumi")
    if found is None:
        raise CompanionError(
            f"the Pulumi CLI is not on PATH: install it ({INSTALL_PULUMI}), then log in to a state backend "
            "(`pulumi login`, or `pulumi login --local` with PULUMI_CONFIG_PASSPHRASE set). The offline plan needs "
            "neither: python3 -m companion plan STACK")
    return found


def _hint(stderr: str) -> str:
    """What to do about the Pulumi CLI's commonest refusals."""
    text = stderr.lower()
    if "passphrase" in text:
        return (" With `pulumi login --local` (or any passphrase secrets provider) the CLI needs the stack's "
                "passphrase: export PULUMI_CONFIG_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE_FILE) in this shell.")
    if "no stack named" in text or "no stack selected" in text:
        return (" Create or select it: `pulumi stack select --create NAME`; `python3 -m companion list` lists the "
                "stacks.")
    if "login" in text or "not logged in" in text:
        return " Log in first: `pulumi login` (or `pulumi login --local`)."
    return ""


def pulumi_json(*args: str, timeout: float = PULUMI_TIMEOUT_S) -> Any:
    """A `pulumi ... --json` answer, or CompanionError naming the command, its complaint and what to do."""
    command = [_require_pulumi(), *args, "--json"]
    shown = "pulumi " + " ".join(args)
    try:
        done = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=max(1.0, timeout),
                              stdin=subprocess.DEVNULL, check=False,
                              env={**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "1"})
    except subprocess.TimeoutExpired:
        raise CompanionError(f"`{shown}` did not answer within {timeout:.0f} s: is the state backend reachable "
                             "(`pulumi whoami -v`)?") from None
    if done.returncode != 0:
        complaint = (done.stderr or done.stdout).strip().splitlines()
        raise CompanionError(f"`{shown}` failed: {' '.join(complaint[-3:]) or 'no message'}.{_hint(done.stderr)}")
    try:
        return json.loads(done.stdout or "null")
    except json.JSONDecodeError:
        raise CompanionError(f"`{shown}` answered no JSON: {done.stdout.strip()[:200]}") from None


def _pulumi(*args: str) -> int:
    """A `pulumi` command a user would type, in the foreground (up, destroy, config)."""
    return subprocess.run([_require_pulumi(), *args], cwd=PROJECT, check=False).returncode


def selected_stack(stack: str | None) -> str:
    if stack is not None:
        return stack
    stacks = pulumi_json("stack", "ls")
    current = [s.get("name") for s in stacks or [] if isinstance(s, dict) and s.get("current")]
    if not current:
        raise CompanionError("no stack selected: pass --stack NAME or run `pulumi stack select --create NAME`")
    return str(current[0]).rsplit("/", 1)[-1]


def stack_outputs(stack: str, show_secrets: bool = True, timeout: float = PULUMI_TIMEOUT_S) -> dict[str, Any]:
    """The stack's outputs (secrets in plain text, as `pulumi stack output --show-secrets`)."""
    flags = ["--show-secrets"] if show_secrets else []
    outputs = pulumi_json("stack", "output", "--stack", stack, *flags, timeout=timeout)
    return dict(outputs) if isinstance(outputs, dict) else {}


@dataclass(frozen=True)
class Context:
    stack: str
    outputs: Mapping[str, Any]
    args: argparse.Namespace


def _deployed(ctx: Context) -> None:
    if not ctx.outputs:
        raise CompanionError(f"stack {ctx.stack} has no outputs: it was never deployed (or is destroyed). "
                             f"`python3 -m companion plan {ctx.stack}` shows what `pulumi up` would build; "
                             "`pulumi up` deploys it")


# How the command outputs read while the instances are stopped (infra/outputs.py, PAUSED): no address to reach.
PAUSED_PREFIX = "the cluster is stopped"


def _output(ctx: Context, name: str, why: str = "") -> str:
    _deployed(ctx)
    if name not in ctx.outputs:
        raise CompanionError(f"the stack has no `{name}` output{why}; run `pulumi up` first")
    value = str(ctx.outputs[name])
    if value.startswith(PAUSED_PREFIX):
        raise CompanionError(f"{value}; `python3 -m companion resume` starts it")
    return value


# ------------------------------------------------------------------------------------------------ SSH
def admin_cidrs(stack: str) -> list[str]:
    """access.adminCidrs as the stack file says (read without the CLI; [] when it cannot be read)."""
    try:
        import yaml

        data = yaml.safe_load((PROJECT / f"Pulumi.{stack}.yaml").read_text()) or {}
        cidrs = (data.get("config") or {}).get(f"{NAMESPACE}:access", {}).get("adminCidrs") or []
    except (OSError, ImportError, AttributeError, ValueError):
        return []
    return [str(c) for c in cidrs] if isinstance(cidrs, list) else []


def unreachable_hint(ctx: Context) -> str:
    head = ((ctx.outputs.get("nodes") or [{}])[0] or {}).get("publicIp") or "the head"
    cidrs = admin_cidrs(ctx.stack)
    allowed = f" ({', '.join(cidrs)})" if cidrs else ""
    return (
        f"could not reach {head} over SSH (ssh exit {SSH_UNREACHABLE}). Is the cluster paused or stopped by autostop? "
        "`python3 -m companion resume`. Has your public address changed? Only access.adminCidrs"
        f"{allowed} may reach SSH: compare with `curl -4 -s https://ifconfig.me`, then `pulumi config set --path "
        f"'{NAMESPACE}:access.adminCidrs[0]' \"$(curl -4 -s https://ifconfig.me)/32\"` and `pulumi up`"
    )


def _sh(ctx: Context, command: str) -> int:
    """Run an output's shell command as `| sh` would: its quotes are the shell's, `~` expands. An SSH command that
    could not connect (ssh waits at most ConnectTimeout, infra/ray/user_commands.py) says why it may be."""
    status = subprocess.run(["sh", "-c", command], check=False).returncode
    if status == SSH_UNREACHABLE and command.lstrip().startswith("ssh "):
        raise CompanionError(unreachable_hint(ctx))
    return status


# ------------------------------------------------------------------------------------------------ commands
def status(ctx: Context) -> int:
    _deployed(ctx)
    out = ctx.outputs
    where = f"in {out['instanceType']} {out.get('zone') or ''}".rstrip() if out.get("instanceType") else "on your hosts"
    print(f"stack {ctx.stack}: {out.get('gpus', '?')} x {out.get('gpuModel', '?')} {where}")
    for node in out.get("nodes") or []:
        print(f"  {node.get('name')!s:8} public {node.get('publicIp') or '-'!s:16} private {node.get('privateIp')}")
    cost_figures = out.get("cost")
    if isinstance(cost_figures, dict):
        print(f"  cost: {cost_figures['running']['perHour']:.2f} {cost_figures['currency']}/h running, "
              f"{cost_figures['paused']['perHour']:.2f} paused; autostop: {cost_figures['autostop']}")
    if "jobStatus" not in out:
        print("  job: not submitted (training.autoStart false): `python3 -m companion resubmit` submits it")
        return 1
    return _sh(ctx, _output(ctx, "jobStatus"))


def logs(ctx: Context) -> int:
    return _sh(ctx, _output(ctx, "jobLogs", " (no job was submitted)"))


def ssh(ctx: Context) -> int:
    command = _output(ctx, "sshHead")
    if ctx.args.node:
        nodes = {n.get("name"): n for n in ctx.outputs.get("nodes") or []}
        head = (ctx.outputs.get("nodes") or [{}])[0].get("publicIp")
        if ctx.args.node not in nodes:
            raise CompanionError(f"no node {ctx.args.node!r}; the nodes are {', '.join(sorted(map(str, nodes)))}")
        # The same login, host-key file and key; only the address differs (every node's key is in that file).
        command = command.replace(f"@{head}", f"@{nodes[ctx.args.node].get('publicIp')}")
    return _sh(ctx, command)


def dashboard(ctx: Context) -> int:
    tunnel = _output(ctx, "dashboardTunnel")
    port = tunnel.split(" -L ", 1)[1].split(":", 1)[0] if " -L " in tunnel else "8265"
    print(f"dashboard on http://localhost:{port} while this runs (Ctrl-C ends the tunnel)", file=sys.stderr)
    return _sh(ctx, tunnel)


def stop(ctx: Context) -> int:
    return _sh(ctx, _output(ctx, "jobStop", " (no job was submitted)"))


def resubmit(ctx: Context) -> int:
    _deployed(ctx)
    return _sh(ctx, str(ctx.outputs.get("jobResubmit") or _output(ctx, "jobSubmit")))


def pause(ctx: Context) -> int:
    """nodes.paused true and `pulumi up`: every instance stops in economical mode (StopCharging)."""
    _deployed(ctx)
    status_code = _pulumi("config", "set", "--stack", ctx.stack, "--path", f"{NAMESPACE}:nodes.paused", "true")
    return status_code or _pulumi("up", "--stack", ctx.stack)


# The instances' URNs, as `--target` globs them (pulumi pkg/resource/deploy/deployment.go NewUrnTargets: `**` any
# text, `*` any text without `:`). A glob that matches nothing is no error (only literal targets are checked).
INSTANCES_GLOB = "**alicloud:ecs/instance:Instance::*"
# The job step: a stopped head kept no job, so the `up` submits it again. It would follow the head's new start_time
# anyway, but that is known only once the instance started, so a preview would not show it: replaced by name, the
# preview says so (no such resource with training.autoStart false: a glob that matches nothing is no error).
JOB_GLOB = "**::training-job"


def resume(ctx: Context) -> int:
    """nodes.paused removed, a refresh of the instances only, then `pulumi up`. The refresh sees instances that
    autostop stopped, and instances that are gone (a reclaimed spot node, one deleted in the console). Only the
    instances: a refresh Reads every resource, and a docker container's or image's Read dials its node over SSH at
    the address the state holds, which a stopped instance released, so a whole refresh (`up --refresh`) fails there.
    After autostop the setting was never there: the removal's complaint, if any, does not stop the update."""
    _deployed(ctx)
    _pulumi("config", "rm", "--stack", ctx.stack, "--path", f"{NAMESPACE}:nodes.paused")
    refreshed = _pulumi("refresh", "--stack", ctx.stack, "--yes", "--target", INSTANCES_GLOB)
    return refreshed or _pulumi("up", "--stack", ctx.stack, "--replace", JOB_GLOB)


def cost(ctx: Context) -> int:
    _deployed(ctx)
    figures = ctx.outputs.get("cost")
    if not isinstance(figures, dict):
        raise CompanionError(f"stack {ctx.stack} reports no `cost` output (own hosts, or deployed before it existed)")
    hours = _hours_since_last_update(ctx.stack)
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
    try:
        updates = pulumi_json("stack", "history", "--stack", stack)
        started = datetime.fromisoformat(str(updates[0]["startTime"]).replace("Z", "+00:00"))
    except (CompanionError, ValueError, LookupError, TypeError):
        return None
    return max(0.0, (time.time() - started.timestamp()) / 3600.0)


def stack_state(outputs: Mapping[str, Any]) -> tuple[str, str]:
    """(state, cost per hour) of a stack from its outputs."""
    if not outputs:
        return "never deployed (or destroyed)", "-"
    figures = outputs.get("cost")
    paused = str(outputs.get("sshHead", "")).startswith(PAUSED_PREFIX)
    if not isinstance(figures, dict):
        return ("paused" if paused else "deployed"), "- (own hosts)"
    rate = figures["paused" if paused else "running"]["perHour"]
    return ("paused" if paused else "running"), f"{rate:.2f} {figures['currency']}/h"


def list_stacks(args: argparse.Namespace) -> int:
    """The project's stacks in this backend: state, nodes and cost per hour (all within LIST_BUDGET_S)."""
    deadline = time.monotonic() + LIST_BUDGET_S
    stacks = [s for s in pulumi_json("stack", "ls") or [] if isinstance(s, dict)]
    if not stacks:
        print("no stacks in this backend yet: `pulumi stack select --create dev` creates one "
              "(the shipped stack files: " + ", ".join(sorted(p.name.split(".")[1]
                                                              for p in PROJECT.glob("Pulumi.*.yaml"))) + ")")
        return 0
    print(f"{'stack':16} {'state':30} {'nodes':>5}  {'cost':>16}  last update")
    for entry in stacks:
        name = str(entry.get("name", "?")).rsplit("/", 1)[-1]
        left = deadline - time.monotonic()
        try:
            if left < 1:
                raise CompanionError("no time left")
            outputs = stack_outputs(name, show_secrets=False, timeout=left)
            state, rate = stack_state(outputs)
            nodes = str(len(outputs.get("nodes") or [])) if outputs else "-"
        except CompanionError as error:
            state, rate, nodes = f"unknown ({str(error)[:60]})", "-", "-"
        mark = "*" if entry.get("current") else " "
        print(f"{name + mark:16} {state:30} {nodes:>5}  {rate:>16}  {entry.get('lastUpdate') or '-'}")
    return 0


def down(ctx: Context) -> int:
    """`pulumi destroy` after a confirmation that says what goes and what stays."""
    kept = (ctx.outputs.get("cost") or {}).get("afterDestroy") if isinstance(ctx.outputs.get("cost"), dict) else None
    nodes = len(ctx.outputs.get("nodes") or [])
    print(f"This destroys stack {ctx.stack}: the job, Ray, the containers and {nodes} node(s) "
          f"({'own hosts are kept' if not kept else 'instances, disks and network deleted'}).")
    for item in kept or []:
        print(f"  kept: {item}")
    if not ctx.args.yes:
        if not sys.stdin.isatty():
            raise CompanionError("not confirmed: run it in a terminal, or pass --yes")
        try:
            answer = input(f"Type the stack's name ({ctx.stack}) to destroy it: ").strip()
        except EOFError:
            answer = ""
        if answer != ctx.stack:
            print("not destroyed", file=sys.stderr)
            return 1
    return _pulumi("destroy", "--stack", ctx.stack, "--yes")


@dataclass(frozen=True)
class Command:
    run: Callable[[Context], int]
    summary: str
    description: str


COMMANDS: dict[str, Command] = {
    "status": Command(status, "the nodes, the cost and the job's Ray status",
                      "Lists the nodes and the cost, then asks the head for the job's status (RUNNING, SUCCEEDED, "
                      "FAILED, LOST: exit 3, never submitted: exit 1)."),
    "logs": Command(logs, "follow the job's log (Ctrl-C stops following, not the job)",
                    "Follows the job's log from the head until the job ends; Ctrl-C stops following, not the job."),
    "ssh": Command(ssh, "a shell on the head (or --node node-1)",
                   "Opens a shell on the head (or on --node), verified against the stack's own known-hosts file."),
    "dashboard": Command(dashboard, "the SSH tunnel to the Ray dashboard on localhost",
                         "Keeps an SSH tunnel to the head's Ray dashboard open: browse http://localhost:PORT while "
                         "it runs."),
    "stop": Command(stop, "stop the job; the nodes keep running (and billing)",
                    "Asks Ray to stop the job. The nodes, the containers and Ray keep running, and billing."),
    "resubmit": Command(resubmit, "submit the job again (pulumi up --replace of the job step)",
                        "Submits the job again through `pulumi up --replace` of its step; it resumes from its "
                        "checkpoints as training.resume says."),
    "pause": Command(pause, "stop every instance (StopCharging): nodes.paused true, then pulumi up",
                     "Sets nodes.paused and runs `pulumi up`: every instance stops in economical mode; disks and "
                     "NAS keep billing."),
    "resume": Command(resume, "start them again (also after autostop or a reclaim): nodes.paused removed, the "
                      "instances refreshed, then pulumi up",
                      "Removes nodes.paused, refreshes the instances only (a stopped, reclaimed or deleted one is "
                      "seen) and runs `pulumi up`: the nodes start or are replaced, Ray re-forms and the job is "
                      "submitted again."),
    "cost": Command(cost, "what the cluster costs per hour, paused, after destroy, and so far",
                    "Prints the cost per hour running and paused, an estimate since the last update, what outlives "
                    "destroy, and when autostop fires."),
    "down": Command(down, "pulumi destroy, after a confirmation (--yes skips it)",
                    "Destroys the stack with `pulumi destroy` after you type its name (--yes: no question), saying "
                    "first what is kept (the NAS with the checkpoints, a baked image)."),
}
PLAN_SUMMARY = "the offline plan: what `pulumi up` would build (no cloud, no Pulumi CLI; --full for everything)"
LIST_SUMMARY = "the project's stacks: state, nodes and cost per hour"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python3 -m companion", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--stack", help="the stack (default: the selected one)")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("plan", help=PLAN_SUMMARY, description=PLAN_SUMMARY, add_help=False)
    sub.add_parser("list", help=LIST_SUMMARY, description=LIST_SUMMARY + ", from `pulumi stack ls` and each "
                   "stack's outputs (the selected stack is marked *).")
    for name, command in COMMANDS.items():
        one = sub.add_parser(name, help=command.summary, description=command.description)
        one.add_argument("--stack", default=argparse.SUPPRESS, help="the stack (default: the selected one)")
        if name == "ssh":
            one.add_argument("--node", help="a node's name, e.g. node-1 (default: the head)")
        if name == "down":
            one.add_argument("--yes", action="store_true", help="destroy without asking")
    return top


def main(argv: Sequence[str]) -> int:
    argv = list(argv)
    try:
        if argv[:1] == ["plan"]:  # the plan has its own options (devtools/plan.py)
            from devtools import plan

            return plan.main(argv[1:], prog="python3 -m companion plan")
        args = parser().parse_args(argv)
        if args.command == "list":
            return list_stacks(args)
        stack = selected_stack(args.stack)
        return COMMANDS[args.command].run(Context(stack, stack_outputs(stack), args))
    except CompanionError as error:
        print(f"companion: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
