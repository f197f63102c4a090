"""One run of the program (RunContext: its step records, notes and run-wide settings), the step bounds, and the
login key.

The step resources themselves are registered by components/remote_steps.py. The record (node, step, scripts,
dependencies) is what the offline plan prints and what the tests and the benchmark analyse (ordering,
parallelism, critical path); it is kept alongside the resources because Pulumi's mocks do not expose resource options.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi

from infra import runmode
from infra.node import known_hosts, ssh_access

# Generous dial limits for the first steps of a node: it is new (sshd may not be up yet). pulumi-command's
# connection is one per resource, shared by create and delete (ConnectionArgs: dial_error_limit, per_dial_timeout).
DIAL_ERROR_LIMIT = 120
PER_DIAL_TIMEOUT_S = 15
# Steps that run once the node is known to be up (after gpu-ready: the container, Ray, the job): a few minutes at
# most, so an `up` against a node that went away fails in minutes, not half an hour per step.
RUNNING_NODE_DIAL_ERROR_LIMIT = 10
# Delete commands do not use pulumi-command's SSH connection at all: a local command (teardown.sh) probes the node
# with these bounds and treats a node that cannot be reached as gone, so `pulumi destroy` of a cluster whose nodes
# are stopped, reclaimed or unreachable finishes in about TEARDOWN_REACH_ATTEMPTS x TEARDOWN_REACH_TIMEOUT_S per step.
# A node that answers but refuses the login or shows another host key is not gone: the step fails.
TEARDOWN_REACH_ATTEMPTS = 2
TEARDOWN_REACH_TIMEOUT_S = 20
TEARDOWN_TIMEOUT_S = 300
TEARDOWN_SCRIPT = "local/teardown.sh"
OFFLINE_PRIVATE_KEY = "offline-plan-placeholder: no private key is read offline"


@dataclass(frozen=True)
class StepRecord:
    node: str  # "node-0"
    step: str  # "docker"
    kind: str  # "remote", "local" or "docker"
    scripts: tuple[str, ...]
    depends_on: tuple[str, ...]  # "node-0/docker", ...
    resource_name: str

    @property
    def key(self) -> str:
        return f"{self.node}/{self.step}"


@dataclass
class RunContext:
    """One run of the program: made by __main__.py and handed explicitly to what reads or adds to it; whoever ran
    the program (the offline plan, the tests, the benchmark) reads it back from the program's namespace
    (devtools/offline_cloud.py). Nothing of it outlives the run."""

    # A section of the stack config is held as a secret (`pulumi config set --secret --path ...`): then every
    # command derived from the config is a secret too, so that no part of the section reaches the state in clear
    # text. Set by stack_config.load().
    secret_config: bool = False
    steps: list[StepRecord] = field(default_factory=list)  # every node step, in the order registered
    # The script library step of each node (components/remote_steps.py library_step), by node name.
    libraries: dict[str, Any] = field(default_factory=dict)
    # Facts the offline plan shows that are not resource inputs (placement notes, the job spec, config warnings).
    notes: dict[str, Any] = field(default_factory=dict)

    def record(self, node: str, step: str, kind: str, scripts: Sequence[str], depends_on: Sequence[str],
               resource: str) -> None:
        self.steps.append(StepRecord(node, step, kind, tuple(scripts), tuple(depends_on), resource))


def stack_login_key(private_key_path: str, public_key: str | None, stack: str, run: RunContext) -> ssh_access.LoginKey:
    """How every SSH client logs in (infra/node/ssh_access.py); raises ConfigError before any resource.
    Offline runs (plan, tests) never read a key or ask an agent; what `up` would refuse goes to the run's notes."""
    if runmode.offline():
        local_key_warnings(private_key_path, public_key, run)
        # The key file's path stands for its text: another key is another connection, as on a real run.
        return ssh_access.LoginKey(private_key=f"{OFFLINE_PRIVATE_KEY} ({private_key_path})",
                                   identity_file=private_key_path, via_agent=False)
    return ssh_access.login_key(
        private_key_path, public_key, Path(known_hosts.agent_public_key_path(stack)).expanduser()
    )


def local_key_warnings(private_key_path: str, public_key: str | None, run: RunContext) -> None:
    """The offline plan runs `pulumi up`'s local key checks on this machine (missing key file, a passphrase without
    ssh-agent, a public key of another pair, a stale agent socket) and lists what they would refuse among the
    warnings; the key itself is neither kept nor used. The shipped placeholder public key has its own warning, so
    the pair is then checked against the key file's own .pub."""
    from infra.config import ConfigError
    from infra.config.first_time import PLACEHOLDER_KEY_BLOB

    if public_key is not None and PLACEHOLDER_KEY_BLOB in public_key:
        public_key = None
    with tempfile.TemporaryDirectory() as scratch:
        try:
            ssh_access.login_key(private_key_path, public_key, Path(scratch) / "agent.pub")
        except ConfigError as error:
            run.notes.setdefault("config_warnings", []).extend(error.problems)


def private_key(login: ssh_access.LoginKey) -> pulumi.Output[str] | None:
    """The key text for pulumi-command as a secret; None when it signs through ssh-agent."""
    return pulumi.Output.secret(login.private_key) if login.private_key is not None else None
