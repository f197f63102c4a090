"""Node steps: the remote and local commands that bootstrap nodes and run Ray, with a record of each.

Every step is a pulumi-command resource whose `create` is a script under infra/scripts rendered by
infra/node/remote.py. The record (node, step, scripts, dependencies) is what the offline plan prints and what the
tests and the benchmark analyse (ordering, parallelism, critical path); it is kept alongside the resources
because Pulumi's mocks do not expose resource options.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command as command

from infra.node import known_hosts, remote, ssh_access
from infra.sources.base import Machine

# Generous dial limits: nodes are new (sshd may not be up yet) and the GPU driver installer reboots them.
DIAL_ERROR_LIMIT = 120
PER_DIAL_TIMEOUT_S = 15
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


RECORDED: list[StepRecord] = []
# Facts the offline plan shows that are not resource inputs (placement notes, the job spec); reset per run.
NOTES: dict[str, Any] = {}


def record(node: str, step: str, kind: str, scripts: Sequence[str], depends_on: Sequence[str], resource: str) -> None:
    RECORDED.append(StepRecord(node, step, kind, tuple(scripts), tuple(depends_on), resource))


def login_key(private_key_path: str, public_key: str | None, stack: str) -> ssh_access.LoginKey:
    """How every SSH client logs in (infra/node/ssh_access.py); raises ConfigError before any resource.
    Offline runs (plan, tests) never read a key or ask an agent."""
    if os.environ.get("ROLL_CLUSTER_OFFLINE") == "1":
        return ssh_access.LoginKey(private_key=OFFLINE_PRIVATE_KEY, identity_file=private_key_path, via_agent=False)
    return ssh_access.login_key(
        private_key_path, public_key, Path(known_hosts.agent_public_key_path(stack)).expanduser()
    )


def private_key(login: ssh_access.LoginKey) -> pulumi.Output[str] | None:
    """The key text for pulumi-command as a secret; None when it signs through ssh-agent."""
    return pulumi.Output.secret(login.private_key) if login.private_key is not None else None


def connection(
    host: pulumi.Input[str],
    key: pulumi.Output[str] | None,
    user: str = "root",
    port: int = 22,
    host_key: pulumi.Input[str] | None = None,
) -> command.remote.ConnectionArgs:
    # key None: pulumi-command signs with the keys of the agent at $SSH_AUTH_SOCK (its default when no private key
    # is given). host_key None: pulumi-command cannot verify the host (it ignores the key then).
    return command.remote.ConnectionArgs(
        host=host,
        user=user,
        port=port,
        private_key=key,
        host_key=host_key,
        dial_error_limit=DIAL_ERROR_LIMIT,
        per_dial_timeout=PER_DIAL_TIMEOUT_S,
    )


@dataclass
class StepContext:
    """What every step of one node shares."""

    node: str
    host: pulumi.Input[str]
    key: pulumi.Output[str] | None
    parent: pulumi.Resource
    node_env: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    user: str = "root"
    port: int = 22
    depends_on: Sequence[pulumi.Resource] = ()  # what must exist before the first step (the machine)
    host_key: pulumi.Input[str] | None = None  # the host key the connection verifies


def context_for(
    machine: Machine, key: pulumi.Output[str] | None, parent: pulumi.Resource, *, first: bool = False
) -> StepContext:
    """The step context of one machine. `first`: the machine's first steps also wait for the machine itself."""
    return StepContext(node=machine.name, host=machine.ssh_host, key=key, parent=parent, user=machine.ssh_user,
                       port=machine.ssh_port, depends_on=machine.depends_on if first else (),
                       host_key=machine.host_key)


def remote_step(
    ctx: StepContext,
    step: str,
    scripts: Sequence[str],
    env: Mapping[str, pulumi.Input[str]],
    *,
    dynamic_env: pulumi.Output[dict[str, str]] | None = None,
    after: Sequence[tuple[str, pulumi.Resource]] = (),
    delete_scripts: Sequence[str] = (),
    delete_env: pulumi.Input[Mapping[str, pulumi.Input[str]]] | None = None,
    triggers: Sequence[pulumi.Input[str]] | None = None,
    delete_before_replace: bool = False,
    resource_name: str | None = None,
) -> command.remote.Command:
    """A remote.Command running `scripts` on the node; `after` lists (step key, resource) it depends on.

    env: variables whose names are known up front (values may be Outputs); dynamic_env: a whole env dict that
    is only known once other resources exist (built from their addresses), merged over env.
    """
    resource_name = resource_name or f"{ctx.node}-{step}"
    static_env: dict[str, pulumi.Input[str]] = {"NODE_NAME": ctx.node, **ctx.node_env, **env}
    full_env: pulumi.Input[Mapping[str, pulumi.Input[str]]] = static_env
    if dynamic_env is not None:
        full_env = pulumi.Output.all(pulumi.Output.from_input(static_env), dynamic_env).apply(
            lambda parts: {**parts[0], **parts[1]}
        )
    delete = None
    if delete_scripts:
        node_only: dict[str, pulumi.Input[str]] = {"NODE_NAME": ctx.node}
        delete_values = pulumi.Output.all(
            pulumi.Output.from_input(node_only), pulumi.Output.from_input(delete_env or {})
        )
        delete = remote.render(f"{step}-delete", delete_scripts, delete_values.apply(lambda p: {**p[0], **p[1]}),
                               sudo=ctx.user != "root")
    resource = command.remote.Command(
        resource_name,
        connection=connection(ctx.host, ctx.key, ctx.user, ctx.port, ctx.host_key),
        create=remote.render(step, scripts, full_env, sudo=ctx.user != "root"),
        delete=delete,
        triggers=list(triggers) if triggers is not None else None,
        opts=pulumi.ResourceOptions(
            parent=ctx.parent,
            depends_on=[*ctx.depends_on, *(r for _, r in after)],
            delete_before_replace=delete_before_replace,
        ),
    )
    record(ctx.node, step, "remote", scripts, [k for k, _ in after], resource_name)
    return resource
