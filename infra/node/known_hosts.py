"""The nodes' SSH host keys: known to the program before it first connects, verified by every SSH client.

Public IPs are recycled: a user's ~/.ssh/known_hosts may hold another machine's key for a new node's address, and
`StrictHostKeyChecking=accept-new` would trust whatever answers the first time. So:

1. `host_key()` (components/known_hosts.py): the program generates each node's ed25519 host key
   (infra/scripts/local/host_key.sh, ssh-keygen on the machine that runs `pulumi up`) in a pulumi-command
   local.Command whose stdout is a secret output kept in the state: stable across updates, never logged, no extra
   provider. A source installs it through the node's
   first-boot user data (infra/scripts/first_boot.sh), before any client connects.
2. `register()` (components/known_hosts.py): one local.Command writes the stack's known-hosts file
   (`known_hosts_path`) with every node's address and key; it is the only known-hosts file the program's
   clients read.
3. The clients: pulumi-command's remote steps get the key as `connection.hostKey` (FixedHostKey, and
   HostKeyAlgorithms set to its type: pulumi-command provider/pkg/provider/remote/connection.go); the docker
   provider, gpu_ready.sh and the commands in the stack outputs run the system ssh with
   `UserKnownHostsFile=<file> StrictHostKeyChecking=yes`.

Your own hosts (infra/sources/hosts): the program cannot generate their keys, so the source's first look
(infra/sources/hosts/probe.py, at preview) records the key each host answers with in the stack's file, once, and
hands it on as `Machine.host_key`: from then on they are verified like the program's own nodes. A machine whose key
is still unknown (the offline plan, which looks at nothing) gets no line; its clients use `accept-new` on the
stack's own file, which at least starts empty instead of trusting a stale entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from infra.sources.base import Machine

KNOWN_HOSTS_DIR = "~/.ssh/roll-cluster"


def known_hosts_path(stack: str) -> str:
    """The stack's known-hosts file; `~/` is left for ssh (and the scripts) to expand on the machine using it."""
    return f"{KNOWN_HOSTS_DIR}/{stack}.known_hosts"


def agent_public_key_path(stack: str) -> str:
    return f"{KNOWN_HOSTS_DIR}/{stack}.agent-key.pub"


@dataclass(frozen=True)
class HostKey:
    private_key: pulumi.Output[str]  # OpenSSH format, secret
    public_key: pulumi.Output[str]  # `ssh-ed25519 AAAA... comment`


def split_host_key(stdout: str) -> tuple[str, str]:
    """host_key.sh's output: the private key, then the public key line last."""
    lines = stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("ssh-ed25519 "):
        raise ValueError("host_key.sh printed no ssh-ed25519 public key line")
    return "\n".join(lines[:-1]) + "\n", lines[-1]


def host_pattern(host: str, port: int) -> str:
    """How OpenSSH writes a host in known_hosts: the bare address on port 22, `[address]:port` elsewhere."""
    return host if port == 22 else f"[{host}]:{port}"


def known_hosts_line(host: str, port: int, public_key: str) -> str:
    key_type, key_data = public_key.split()[:2]
    return f"{host_pattern(host, port)} {key_type} {key_data}"


@dataclass(frozen=True)
class KnownHosts:
    path: str
    written: pulumi.Resource  # the clients that read the file depend on it


def host_key_checking(machine: Machine) -> str:
    """StrictHostKeyChecking for a machine: `yes` when its key is known up front (see the module docstring)."""
    return "yes" if machine.host_key is not None else "accept-new"


def ssh_options(identity_file: str, known_hosts: str, checking: str) -> list[str]:
    """Options of every system `ssh` the program runs itself (the docker provider's ssh_opts). A private key file
    needs no agent: IdentityAgent=none (a stale $SSH_AUTH_SOCK is then not dialled); a `.pub` file names an agent
    key."""
    agent = [] if identity_file.endswith(".pub") else ["-o", "IdentityAgent=none"]
    return [
        "-i", identity_file,
        "-o", "IdentitiesOnly=yes",
        *agent,
        "-o", "BatchMode=yes",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", f"StrictHostKeyChecking={checking}",
    ]
