"""The step resources: every remote step is a pulumi-command `remote.Command` running scripts under infra/scripts
rendered by infra/node/remote.py, with an optional local teardown whose delete runs on the node over ssh. The
scripts reach each node once, by its script library step (`library_step`), which every step of the node depends on.

The record of each step (infra/node/steps.py) is kept alongside, for the offline plan and the tests.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_command as command

from infra.node import known_hosts, remote, ssh_access
from infra.node.steps import (
    DIAL_ERROR_LIMIT,
    PER_DIAL_TIMEOUT_S,
    RUNNING_NODE_DIAL_ERROR_LIMIT,
    TEARDOWN_REACH_ATTEMPTS,
    TEARDOWN_REACH_TIMEOUT_S,
    TEARDOWN_SCRIPT,
    TEARDOWN_TIMEOUT_S,
    RunContext,
)
from infra.sources.base import Machine


def connection(
    host: pulumi.Input[str],
    key: pulumi.Output[str] | None,
    user: str = "root",
    port: int = 22,
    host_key: pulumi.Input[str] | None = None,
    dial_error_limit: int = DIAL_ERROR_LIMIT,
) -> command.remote.ConnectionArgs:
    # key None: pulumi-command signs with the keys of the agent at $SSH_AUTH_SOCK (its default when no private key
    # is given). host_key None: pulumi-command cannot verify the host (it ignores the key then).
    return command.remote.ConnectionArgs(
        host=host,
        user=user,
        port=port,
        private_key=key,
        host_key=host_key,
        dial_error_limit=dial_error_limit,
        per_dial_timeout=PER_DIAL_TIMEOUT_S,
    )


@dataclass
class StepContext:
    """What every step of one node shares."""

    node: str
    host: pulumi.Input[str]
    key: pulumi.Output[str] | None
    parent: pulumi.Resource
    run: RunContext  # the program's run: its step records, its libraries, whether commands are secrets
    node_env: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)
    user: str = "root"
    port: int = 22
    depends_on: Sequence[pulumi.Resource] = ()  # what must exist before the first step (the machine)
    host_key: pulumi.Input[str] | None = None  # the host key the connection verifies
    # What the local teardown commands give the system ssh as -i: the login key's identity file (a private key file,
    # or the .pub file naming the key in ssh-agent), as for every other local client; "": ssh's default keys.
    identity_file: str = ""
    known_hosts_file: str = ""  # the stack's known-hosts file, for the local teardown commands
    host_key_checking: str = "yes"  # StrictHostKeyChecking of those: `accept-new` where the key is not known
    # Where the machine's host key came from: "generated" by the program (its own instances, infra/node/known_hosts.py)
    # or "recorded" at first contact (your own hosts); the teardown's advice on a changed key depends on it.
    host_key_origin: str = "generated"
    dial_error_limit: int = DIAL_ERROR_LIMIT
    identity: pulumi.Input[str] = ""  # the machine's identity (Machine.identity): its teardowns follow it


def context_for(
    machine: Machine, key: pulumi.Output[str] | None, parent: pulumi.Resource, *, login: ssh_access.LoginKey,
    run: RunContext, first: bool = False, running: bool = False,
) -> StepContext:
    """The step context of one machine. `login`: how the system ssh of the local teardowns logs in (the same
    identity as gpu-ready and the docker provider). `first`: the machine's first steps also wait for the machine
    itself. `running`: the steps run on a node known to be up (after gpu-ready), with short dial limits."""
    return StepContext(node=machine.name, host=machine.ssh_host, key=key, parent=parent, run=run,
                       user=machine.ssh_user,
                       port=machine.ssh_port, depends_on=machine.depends_on if first else (),
                       host_key=machine.host_key, identity_file=login.identity_file,
                       known_hosts_file=known_hosts.known_hosts_path(pulumi.get_stack()),
                       host_key_checking=known_hosts.host_key_checking(machine),
                       host_key_origin="recorded" if machine.existing else "generated",
                       dial_error_limit=RUNNING_NODE_DIAL_ERROR_LIMIT if running else DIAL_ERROR_LIMIT,
                       identity=machine.identity)


def library_step(ctx: StepContext) -> command.remote.CopyToRemote:
    """The node's script library (infra/node/remote.py): every script under a name made of its content's hash,
    copied over SFTP into the library directory. One per node and run, made by the node's first step.

    pulumi-command's CopyToRemote copies on create, and on update only when the archive's hash or the remote path
    changed (remote/copyController.go Update); it has no delete, so the files of an older library stay beside the
    new ones (what a teardown recorded before a script change runs). A new machine behind the same step (a replaced
    instance) must get its copy although the archive is the same: its identity is a trigger, which replaces."""
    found = ctx.run.libraries.get(ctx.node)
    if found is None:
        found = command.remote.CopyToRemote(
            f"{ctx.node}-scripts",
            connection=connection(ctx.host, ctx.key, ctx.user, ctx.port, ctx.host_key, DIAL_ERROR_LIMIT),
            source=remote.library_archive(),
            remote_path=remote.library_remote_path(ctx.user),
            triggers=[ctx.identity],
            opts=pulumi.ResourceOptions(parent=ctx.parent, depends_on=list(ctx.depends_on)),
        )
        ctx.run.libraries[ctx.node] = found
    return found


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
    replacement_trigger: pulumi.Input[str] | None = None,
) -> command.remote.Command:
    """A remote.Command running `scripts` on the node; `after` lists (step key, resource) it depends on.

    env: variables whose names are known up front (values may be Outputs); dynamic_env: a whole env dict that
    is only known once other resources exist (built from their addresses), merged over env.
    """
    resource_name = resource_name or f"{ctx.node}-{step}"
    static_env: dict[str, pulumi.Input[str]] = {"NODE_NAME": ctx.node, **ctx.node_env, **env}
    library = remote.library_dir(ctx.user)
    depends_on: list[pulumi.Resource] = [*ctx.depends_on, library_step(ctx), *(r for _, r in after)]
    if delete_scripts:
        # The step depends on its teardown, so Pulumi deletes the step first and then runs the teardown; a job's
        # teardown (stop the job) thus runs before Ray's (stop Ray), which runs before the container goes. The
        # same triggers replace both, so a replaced step is stopped (teardown's delete) before it starts again.
        depends_on = [*depends_on, teardown_step(ctx, step, delete_scripts, delete_env, triggers, depends_on,
                                                 f"{resource_name}-teardown", replacement_trigger)]
    resource = command.remote.Command(
        resource_name,
        connection=connection(ctx.host, ctx.key, ctx.user, ctx.port, ctx.host_key, ctx.dial_error_limit),
        # The text (exports, secrets among them, and the scripts) on stdin, off every command line and error
        # message (infra/node/remote.py); a changed text is an update that re-runs `create`, as before.
        create=remote.stdin_command(step, sudo=ctx.user != "root"),
        stdin=remote.render(step, scripts, static_env, library=library, more_env=dynamic_env,
                            secret=ctx.run.secret_config),
        triggers=list(triggers) if triggers is not None else None,
        # Without this pulumi-command sends PULUMI_COMMAND_STDOUT/STDERR as SSH env requests, which a stock sshd
        # refuses with a warning per step (AcceptEnv); the scripts never read them.
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=ctx.parent,
            depends_on=depends_on,
            delete_before_replace=delete_before_replace,
            # A change that must stop the old before the new starts (an update would only re-run `create`).
            replacement_trigger=replacement_trigger,
        ),
    )
    ctx.run.record(ctx.node, step, "remote", scripts, [k for k, _ in after], resource_name)
    return resource


def teardown_step(
    ctx: StepContext,
    step: str,
    delete_scripts: Sequence[str],
    delete_env: pulumi.Input[Mapping[str, pulumi.Input[str]]] | None,
    triggers: Sequence[pulumi.Input[str]] | None,
    depends_on: Sequence[pulumi.Resource],
    resource_name: str,
    replacement_trigger: pulumi.Input[str] | None = None,
) -> command.local.Command:
    """A local command whose delete runs `delete_scripts` on the node over ssh (infra/scripts/local/teardown.sh):
    it probes the node with short bounds first and treats a node that cannot be reached as gone (done), so a
    destroy never waits out pulumi-command's dial limits; a node that answers but refuses the login or shows
    another host key fails the step. It logs in with the login key's identity file, like every local client. Its
    create does nothing. The delete environment holds no secrets (a container name, a job id): it is a plain
    environment variable of a local process."""
    node_only: dict[str, pulumi.Input[str]] = {"NODE_NAME": ctx.node}
    delete_values: pulumi.Input[Mapping[str, pulumi.Input[str]]]
    if delete_env is None or isinstance(delete_env, Mapping):
        delete_values = {**node_only, **(delete_env or {})}  # values known or not: render resolves them
    else:
        delete_values = pulumi.Output.all(pulumi.Output.from_input(node_only), delete_env).apply(
            lambda p: {**p[0], **p[1]})
    remote_command = remote.render(f"{step}-delete", delete_scripts, delete_values, sudo=ctx.user != "root",
                                   library=remote.library_dir(ctx.user), secret=ctx.run.secret_config)
    resource = command.local.Command(
        resource_name,
        delete=f"bash infra/scripts/{TEARDOWN_SCRIPT}",  # no `dir`: see components/known_hosts.py
        environment={
            "HOST": ctx.host,
            "SSH_USER": ctx.user,
            "SSH_PORT": str(ctx.port),
            "SSH_KEY_PATH": ctx.identity_file,
            "KNOWN_HOSTS_FILE": ctx.known_hosts_file,
            # The node's host key itself, in the state: the delete runs from the old state's inputs, so a node
            # that the known-hosts file no longer lists (removed, replaced) and a machine without that file (a
            # clone, CI) are still checked strictly (infra/scripts/local/teardown.sh).
            "HOST_PUBLIC_KEY": ctx.host_key if ctx.host_key is not None else "",
            "HOST_KEY_CHECKING": ctx.host_key_checking,
            "HOST_KEY_ORIGIN": ctx.host_key_origin,
            "NODE_NAME": ctx.node,
            "ROLL_CLUSTER_STEP": f"{step}-delete",
            "REMOTE_COMMAND": remote_command,
            "REACH_ATTEMPTS": str(TEARDOWN_REACH_ATTEMPTS),
            "REACH_TIMEOUT_S": str(TEARDOWN_REACH_TIMEOUT_S),
            "TEARDOWN_TIMEOUT_S": str(TEARDOWN_TIMEOUT_S),
            # Named in the advice of a refused teardown (`pulumi state delete` of this resource).
            "TEARDOWN_RESOURCE": resource_name,
        },
        triggers=list(triggers) if triggers is not None else None,
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(
            parent=ctx.parent, depends_on=list(depends_on), delete_before_replace=True,
            # An update never runs `delete` (pulumi-command local/commandController.go): a teardown whose
            # machine or step changed must be replaced, so that its old delete stops the old thing on the old
            # machine. Null in stacks created before: no replacement on the upgrade (step_generator.go).
            # The machine is its identity (an instance id; an own host's address), not its public address: a paused
            # and resumed instance gets a new public IP and is still the same machine with the same Ray on it.
            # see verified-facts#remote-steps-commandcontroller
            replacement_trigger=pulumi.Output.all(ctx.identity, str(ctx.port), ctx.user,
                                                  replacement_trigger or "").apply(
                lambda parts: json.dumps(parts)),
        ),
    )
    return resource


def with_login_key(ctx: StepContext, public_key: str | None) -> StepContext:
    """The node's first steps, after its login-key step: a changed access.sshPublicKey is added on the node with the
    previous key, and the previous one removed, before any step logs in with the new one
    (infra/scripts/local/login_key.sh). Nothing to do without a public key in the config (your own hosts)."""
    if public_key is None:
        return ctx
    name = f"{ctx.node}-login-key"
    step = command.local.Command(
        name,
        create="bash infra/scripts/local/login_key.sh",  # no `dir`: see components/known_hosts.py
        environment={
            "HOST": ctx.host,
            "SSH_USER": ctx.user,
            "SSH_PORT": str(ctx.port),
            "SSH_KEY_PATH": ctx.identity_file,
            "HOST_PUBLIC_KEY": ctx.host_key if ctx.host_key is not None else "",
            "KNOWN_HOSTS_FILE": ctx.known_hosts_file,
            "HOST_KEY_CHECKING": ctx.host_key_checking,
            "LOGIN_PUBLIC_KEY": public_key,
            "NODE_NAME": ctx.node,
        },
        # Its previous output is the key the node accepted at its last run: pulumi-command hands it to an update as
        # PULUMI_COMMAND_STDOUT (local/commandOutputs.go, commandController.go Update keeps the old outputs).
        # see verified-facts#remote-steps-commandoutputs
        add_previous_output_in_env=True,
        opts=pulumi.ResourceOptions(parent=ctx.parent, depends_on=list(ctx.depends_on)),
    )
    ctx.run.record(ctx.node, "login-key", "local", ["local/login_key.sh"], [], name)
    return dataclasses.replace(ctx, depends_on=[*ctx.depends_on, step])
