"""The stack's known-hosts: each new instance's generated SSH host key, and the local file every client reads.

What the keys and the file are for, and the pure helpers (paths, line format, ssh options): infra/node/known_hosts.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_command as command

from infra.layout import PROJECT_DIR
from infra.node.known_hosts import HostKey, KnownHosts, known_hosts_line, known_hosts_path, split_host_key
from infra.sources.base import Machine


def host_key(name: str, parent: pulumi.Resource | None = None) -> HostKey:
    generated = command.local.Command(
        f"{name}-host-key",
        create="bash infra/scripts/local/host_key.sh",
        dir=str(PROJECT_DIR),
        environment={"NODE_NAME": name},
        # The private key must never reach the console or the logs; the output is a secret in the state.
        logging=command.local.Logging.NONE,
        add_previous_output_in_env=False,
        opts=pulumi.ResourceOptions(parent=parent, additional_secret_outputs=["stdout"]),
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
        dir=str(PROJECT_DIR),
        environment={"KNOWN_HOSTS_FILE": path, "KNOWN_HOSTS": content},
        # A changed node address or key changes KNOWN_HOSTS: the update runs `create` again (rewrites the file).
        triggers=[content],
        add_previous_output_in_env=False,
    )
    return KnownHosts(path=path, written=written)


def _line(machine: Machine) -> pulumi.Output[str]:
    port = machine.ssh_port
    return pulumi.Output.all(machine.ssh_host, machine.host_key).apply(
        lambda v: known_hosts_line(str(v[0]), port, str(v[1]))
    )


