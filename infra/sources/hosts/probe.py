"""A look at your own hosts before anything is registered: how many accelerators each one's driver lists, and the
SSH host key it answers with.

The `hosts` source runs this while the program is evaluated (`pulumi preview` and `pulumi up`), so a host whose
count disagrees with `nodes.acceleratorsPerNode`, or that cannot be reached, stops the update before any resource
exists and before any step touches a host (issue 12). The look is read-only: infra/scripts/accelerator_probe.sh
over the system ssh, every host at once, each bounded.

Host keys: the program cannot know the keys of machines it did not create, so the first look records each host's
key in the stack's own known-hosts file (`StrictHostKeyChecking=accept-new`, never the user's ~/.ssh/known_hosts)
and every later look and every step verifies against it (`yes`): the key is trusted on first use once per stack,
and the source hands it on as `Machine.host_key`, which pins it for pulumi-command's connections too
(infra/node/known_hosts.py). A host whose key changed is refused, naming the file and the line to remove.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from infra.node import remote
from infra.node.accelerators import Accelerator
from infra.node.known_hosts import host_pattern

PROBE_STEP = "accelerator-probe"
PROBE_SCRIPTS = ("npu_lib.sh", "accelerator_probe.sh")
CONNECT_TIMEOUT_S = 10
# One host's whole look: connect, then the driver's tool (bounded at 60 s on the host, two tries 2 s apart).
PROBE_TIMEOUT_S = 150
MAX_PARALLEL = 32
RESULT_PREFIX = "ACCELERATORS "


@dataclass(frozen=True)
class HostAccess:
    """How the machine evaluating the program logs in: the same identity and known-hosts file as every step."""

    identity_file: str | None  # a private key file, or a .pub file naming an ssh-agent key; None: ssh's defaults
    known_hosts_file: str  # the stack's known-hosts file; a leading ~/ is the home directory


@dataclass(frozen=True)
class HostTarget:
    name: str  # "node-1", as the steps name it
    key: str  # the configuration key of the host, for messages: "roll-cluster:nodes.hosts[1]"
    address: str
    user: str
    port: int


@dataclass(frozen=True)
class HostLook:
    target: HostTarget
    accelerators: int | None = None  # None: the look failed (problem says why)
    host_key: str | None = None  # `<type> <base64>` as recorded in the known-hosts file
    problem: str | None = None


def expand_home(path: str) -> Path:
    return Path(path).expanduser()


def probe_command(accelerator: Accelerator, target: HostTarget) -> str:
    """The command run on a host: the probe script with its settings, under sudo for a user that is not root."""
    env = {
        "NODE_NAME": target.name,
        "ACCELERATOR": accelerator.kind,
        "INSTALL_HINT": accelerator.install_hint,
        # A short retry: a busy driver tool answers within seconds, a missing driver never does.
        "RETRY_ATTEMPTS": "2",
        "RETRY_DELAY_S": "2",
        # Nothing under /var/log: the look leaves only its log in /tmp, per node for hosts that share one /tmp.
        "ROLL_CLUSTER_LOG_DIR": f"/tmp/roll-cluster-probe-{target.name}",
    }
    return remote.render_inline(PROBE_STEP, PROBE_SCRIPTS, env, sudo=target.user != "root")


def ssh_argv(target: HostTarget, access: HostAccess, checking: str) -> list[str]:
    argv = [
        "ssh",
        "-o", "BatchMode=yes",
        "-o", f"StrictHostKeyChecking={checking}",
        "-o", f"UserKnownHostsFile={expand_home(access.known_hosts_file)}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        # Plain lines, one key: the file is read back here to pin the key (infra/node/known_hosts.py).
        "-o", "HashKnownHosts=no",
        "-o", "UpdateHostKeys=no",
        "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
        "-o", "ServerAliveInterval=5",
        "-o", "ServerAliveCountMax=3",
        "-o", "LogLevel=ERROR",
        "-p", str(target.port),
    ]
    if access.identity_file:
        argv += ["-i", str(expand_home(access.identity_file)), "-o", "IdentitiesOnly=yes"]
    return [*argv, "--", f"{target.user}@{target.address}"]  # the destination is never read as an option


def recorded_key(known_hosts_file: str, address: str, port: int) -> str | None:
    """The key the stack's known-hosts file holds for a host (`<type> <base64>`), if any."""
    path = expand_home(known_hosts_file)
    if not path.is_file():
        return None
    pattern = host_pattern(address, port)
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and pattern in fields[0].split(","):
            return f"{fields[1]} {fields[2]}"
    return None


def look_at(target: HostTarget, accelerator: Accelerator, access: HostAccess) -> HostLook:
    """Run the probe on one host; a failed look carries the reason a user can act on."""
    known = recorded_key(access.known_hosts_file, target.address, target.port)
    # A key already recorded for this stack must match; the first look records it.
    checking = "yes" if known else "accept-new"
    argv = [*ssh_argv(target, access, checking), probe_command(accelerator, target)]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return HostLook(target, problem=f"no answer within {PROBE_TIMEOUT_S}s (ssh to {target.address}:{target.port} "
                                        f"hung); is the host up and its SSH reachable from here?")
    except FileNotFoundError:
        return HostLook(target, problem="no `ssh` client on this machine (install OpenSSH's client)")
    output = (result.stderr or "").strip()
    if result.returncode == 255:
        return HostLook(target, problem=ssh_problem(target, access, output))
    lines = [line for line in (result.stdout or "").splitlines() if line.startswith(RESULT_PREFIX)]
    if result.returncode != 0 or not lines:
        return HostLook(target, problem=probe_failure(result.returncode, output or result.stdout or ""))
    key = recorded_key(access.known_hosts_file, target.address, target.port)
    return HostLook(target, accelerators=int(lines[-1][len(RESULT_PREFIX):]), host_key=key)


def ssh_problem(target: HostTarget, access: HostAccess, stderr: str) -> str:
    """What an ssh failure (exit 255) means for the user, from ssh's own message."""
    where = f"{target.user}@{target.address}:{target.port}"
    if "Host key verification failed" in stderr or "IDENTIFICATION HAS CHANGED" in stderr:
        file = expand_home(access.known_hosts_file)
        return (f"{where} answers with a host key other than the one recorded for this stack in {file}. If the "
                f"host was reinstalled on purpose, remove its line (ssh-keygen -R "
                f"{shlex.quote(host_pattern(target.address, target.port))} -f {file}) and run again; otherwise "
                "something else answers at that address")
    if "Permission denied" in stderr:
        identity = access.identity_file or "ssh's default keys"
        return (f"{where} refuses the login key ({identity}): add its public key to ~{target.user}/.ssh/"
                "authorized_keys on the host")
    return f"cannot reach {where} over SSH: {tail(stderr, 3) or 'ssh exited 255'}"


def probe_failure(status: int, output: str) -> str:
    """The probe's own reason first (lib.sh's `<step>: FAILED: <reason>` line), then the end of its output."""
    reasons = [line.split(" FAILED: ", 1)[1] for line in output.splitlines() if " FAILED: " in line]
    detail = tail(output)
    if reasons:
        return f"{reasons[-1]}\n{detail}"
    return f"the accelerator probe failed on the host (exit {status}):\n{detail}"


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def look_at_all(targets: Sequence[HostTarget], accelerator: Accelerator, access: HostAccess) -> list[HostLook]:
    """Every host at once (the update waits for the slowest one, not for their sum)."""
    directory = expand_home(access.known_hosts_file).parent
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(targets))) as pool:
        return list(pool.map(lambda target: look_at(target, accelerator, access), targets))


def problems(looks: Sequence[HostLook], expected: int, count_key: str, accelerator: Accelerator) -> list[str]:
    """The lines that refuse the update: hosts that could not be looked at, and counts other than `expected`."""
    noun = "GPUs" if accelerator.kind == "nvidia" else "NPUs"
    tool = "nvidia-smi -L" if accelerator.kind == "nvidia" else "npu-smi info"
    found: list[str] = []
    for look in looks:
        target = look.target
        if look.problem is not None:
            found.append(f"{target.key} ({target.address}): could not count its {noun} before the update: "
                         f"{look.problem}")
        elif look.accelerators != expected:
            found.append(f"{count_key}: is {expected}, but `{tool}` on {target.key} ({target.address}) lists "
                         f"{look.accelerators} {noun}; every host must have the number this key says (correct it, "
                         "or leave that host out)")
    return found
