"""The stack's known-hosts: each new instance's generated SSH host key, and the local file every client reads.

What the keys and the file are for, and the pure helpers (paths, line format, ssh options): infra/node/known_hosts.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command

from infra.node.known_hosts import HostKey, KnownHosts, known_hosts_line, known_hosts_path, split_host_key
from infra.sources.base import Machine


def host_key(name: str, parent: pulumi.Resource | None = None) -> HostKey:
    generated = command.local.Command(
        f"{name}-host-key",
        # No `dir`: pulumi-command runs a local command in the provider's working directory, the project root of
        # the checkout running `up`/`destroy` (local/commandOutputs.go; the engine starts plugins in the
        # project root, sdk/go/common/resource/plugin/plugin.go). An absolute path would tie the state to one
        # checkout.
        # see verified-facts#known-hosts-commandoutputs
        create="bash infra/scripts/local/host_key.sh",
        environment={"NODE_NAME": name},
        # The private key must never reach the console or the logs; the output is a secret in the state.
        logging=command.local.Logging.NONE,
        add_previous_output_in_env=False,
        # Any input change is an update, and an update re-runs `create` (pulumi-command local/commandController.go
        # :67-90): a new key pair the node, booted with the first, never presents. So no input may ever change it:
        # not another checkout (the `dir` of stacks created before), not a pulumi-command upgrade.
        opts=pulumi.ResourceOptions(parent=parent, additional_secret_outputs=["stdout"], ignore_changes=[
            "dir", "create", "update", "delete", "environment", "logging", "addPreviousOutputInEnv", "interpreter",
            "stdin", "triggers"]),
    )
    parts = generated.stdout.apply(split_host_key)
    return HostKey(
        private_key=pulumi.Output.secret(parts.apply(lambda p: p[0])),
        # The public half is no secret: it goes into known-hosts files and the plan.
        public_key=pulumi.Output.unsecret(parts.apply(lambda p: p[1])),
    )


def register(stack: str, machines: Sequence[Machine]) -> KnownHosts:
    """The local.Command that writes the stack's known-hosts file from the machines' addresses and host keys."""
    path = known_hosts_path(stack)
    lines = [_line(m) for m in machines if m.host_key is not None]
    content = pulumi.Output.all(*lines).apply(lambda v: "\n".join(str(line) for line in v))
    written = command.local.Command(
        "known-hosts",
        create="bash infra/scripts/local/known_hosts.sh",
        delete="bash infra/scripts/local/known_hosts.sh --delete",
        environment={"KNOWN_HOSTS_FILE": path, "KNOWN_HOSTS": content},
        # A changed node address or key changes KNOWN_HOSTS: the update runs `create` again (rewrites the file) and
        # never `delete`. No `triggers`: a replacement would create the new file, then run the old one's delete
        # (create before delete), which removes it.
        add_previous_output_in_env=False,
        # A replacement all the same (`pulumi up --replace`, or the `triggers` of stacks created before) deletes
        # the old file first, then writes the new one (step_generator.go).
        # see verified-facts#known-hosts-step-generator
        opts=pulumi.ResourceOptions(delete_before_replace=True),
    )
    return KnownHosts(path=path, written=written)


def _line(machine: Machine) -> pulumi.Output[str]:
    port = machine.ssh_port
    return pulumi.Output.all(machine.ssh_host, machine.host_key).apply(
        lambda v: known_hosts_line(str(v[0]), port, str(v[1]))
    )


