"""The real-host tier's hosts: network namespaces on one bridge, each with its own sshd, reached over real SSH.

Each test host is a network namespace (its own address in 198.18.0.0/15, the benchmarking range, on a bridge in
the root namespace) whose PID 1 (host_init.sh) runs in its own mount, PID and UTS namespaces with a private /tmp,
/dev/shm, /run and /var/log, starts the host's own real dockerd (host_dockerd.sh) and a stock sshd (own config and
host key, port 22, root by key only). Commands reach a host exactly as pulumi-command sends them: `ssh root@<ip>
'<rendered command>'`, run by the remote login shell. The hosts pull the test image (e2e_docker.py: Debian with
Python and Ray 2.48.0) from a real registry on the bridge (TEST_IMAGE), and Ray runs in real containers.

This module knows how to make hosts and run a command on one; how the commands are made is e2e_steps.py's job.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e_docker import (
    CHANGED_IMAGE_TAG,
    DOCKER_CLI,
    IMAGE_REPOSITORY,
    IMAGE_TAG,
    STATE_ROOT,
    Registry,
    apt_install,
    ensure_docker,
    ensure_test_image,
    remove_docker_leftovers,
)

REPO = Path(__file__).resolve().parents[2]
E2E_DIR = REPO / "tests" / "e2e"
# STATE_ROOT (e2e_docker): /var/tmp/roll-cluster-e2e, fixed, so a crashed run's leftovers are found and removed
NETNS_PREFIX = "rce2e-"
BRIDGE = "rce2e-br0"
SUBNET = "198.18.0"
BRIDGE_IP = f"{SUBNET}.1"
UNREACHABLE_IP = f"{SUBNET}.250"  # on the bridge's subnet, held by no host
# The tier's registry, on the bridge: the hosts pull the test image from it. Plain HTTP, which dockerd allows for
# 127.0.0.0/8 only: each host's daemon.json (as its image ships it, host_init.sh) lists the bridge's subnet in
# insecure-registries; the program's docker step merges its own keys into that file (install_docker.sh).
REGISTRY_ADDRESS = f"{BRIDGE_IP}:5000"
TEST_IMAGE = f"{REGISTRY_ADDRESS}/{IMAGE_REPOSITORY}:{IMAGE_TAG}"
CHANGED_TEST_IMAGE = f"{REGISTRY_ADDRESS}/{IMAGE_REPOSITORY}:{CHANGED_IMAGE_TAG}"  # TEST_IMAGE and one layer more
HOST_DAEMON_JSON = json.dumps({"insecure-registries": [f"{SUBNET}.0/24"]})
ADMIN_HOME = STATE_ROOT / "admin-home"  # HOME of the user-facing commands (the stack's known-hosts file is there)
SUPPORT_DIR = STATE_ROOT / "support"  # copies of host_init.sh and host_dockerd.sh, visible inside the hosts
SSHD = Path("/usr/sbin/sshd")


def unavailable_reason() -> str | None:
    """Why the tier cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "the real-host tier needs root (network namespaces, mounts, sshd)"
    for tool in ("ip", "unshare", "nsenter", "ssh", "ssh-keygen", "setsid"):
        if shutil.which(tool) is None:
            return f"the real-host tier needs `{tool}`, which this machine lacks"
    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` is unavailable here"
    return None


def _run(argv: Sequence[str], env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stdout}{result.stderr}")
    return result


def ensure_sshd() -> None:
    """Debian's openssh-server, installed once."""
    if not SSHD.exists():
        apt_install("openssh-server")


def ensure_sudo() -> None:
    """Debian's sudo (the own-hosts run as a user other than root), installed once."""
    if not shutil.which("sudo"):
        apt_install("sudo")


def ensure_jemalloc() -> Path:
    """Debian's libjemalloc2 (what MindSpeed-RL preloads for Ray), installed once."""
    multiarch = {"x86_64": "x86_64-linux-gnu", "aarch64": "aarch64-linux-gnu"}.get(os.uname().machine, "")
    library = Path(f"/usr/lib/{multiarch}/libjemalloc.so.2")
    if not library.exists():
        apt_install("libjemalloc2")
    return library


@dataclass(frozen=True)
class TestHost:
    name: str
    ip: str
    netns: str
    root: Path  # the host's state directory on the test machine

    __test__ = False  # not a pytest test class

    def private_path(self, path: str) -> Path:
        """Where a path under this host's private /tmp, /var/log or /workspace lies on the test machine."""
        for mount, backing in (("/tmp/", "tmp"), ("/var/log/", "log"), ("/workspace/", "workspace")):
            if path.startswith(mount):
                return self.root / backing / path[len(mount) :]
        raise ValueError(f"{path} is not under a private directory of {self.name}")


@dataclass(frozen=True)
class CommandResult:
    where: str
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def check(self) -> CommandResult:
        if self.returncode != 0:
            raise AssertionError(f"command on {self.where} exited {self.returncode}:\n{self.output}")
        return self


class RunningCommand:
    """A command started in the background (say a worker that waits for a head not started yet)."""

    def __init__(
        self, where: str, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None,
        stdin_text: str | None = None,
    ) -> None:
        self.where = where
        self.started = time.monotonic()
        stdin: Any = subprocess.DEVNULL
        if stdin_text is not None:
            stdin = tempfile.TemporaryFile()  # noqa: SIM115 - the child reads it; closed with the process below
            stdin.write(stdin_text.encode())
            stdin.seek(0)
        self.process = subprocess.Popen(
            list(argv), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
        )
        if stdin is not subprocess.DEVNULL:
            stdin.close()  # the child holds its own descriptor

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float) -> CommandResult:
        try:
            stdout, stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            stdout, stderr = self.process.communicate()
            stderr += f"\n[e2e harness: killed after {timeout}s]"
        return CommandResult(self.where, self.process.returncode, stdout, stderr, time.monotonic() - self.started)


class TestNetwork:
    """`count` hosts e2e-h0.. at 198.18.0.11.. with sshd and dockerd each, and the registry on the bridge that serves
    the test image (`registry`, from `image_storage`: e2e_docker.ensure_test_image)."""

    __test__ = False

    def __init__(self, count: int, image_storage: Path) -> None:
        self.image_storage = image_storage
        self.registry = Registry("hosts", REGISTRY_ADDRESS, image_storage, read_only=True)
        self.hosts = [
            TestHost(f"e2e-h{i}", f"{SUBNET}.{11 + i}", f"{NETNS_PREFIX}h{i}", STATE_ROOT / "hosts" / f"e2e-h{i}")
            for i in range(count)
        ]
        self.client_key = STATE_ROOT / "client" / "id_ed25519"
        self.ssh_config = STATE_ROOT / "client" / "ssh_config"
        self.client_bin = STATE_ROOT / "client" / "bin"
        self._inits: list[subprocess.Popen[bytes]] = []
        self._libraries: set[tuple[str, str, str, str]] = set()  # (host, user, remote path, source) copied
        self._init_of: dict[str, subprocess.Popen[bytes]] = {}
        self._init_argv: dict[str, tuple[list[str], dict[str, str]]] = {}
        self._extra: list[TestHost] = []  # add_hosts

    # ---- life cycle ----

    def start(self) -> None:
        remove_leftovers()
        try:
            self._write_client()
            _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
            _run(["ip", "addr", "add", f"{BRIDGE_IP}/24", "dev", BRIDGE])
            _run(["ip", "link", "set", BRIDGE, "up"])
            self.registry.start()
            self._write_support_files()
            for index, host in enumerate(self.hosts):
                self._start_host(index, host)
            for host in self.hosts:
                self._wait_for_ssh(host)
        except BaseException:
            self.stop(keep_state=True)
            raise

    def stop(self, keep_state: bool = False) -> None:
        """Kill every process of every host, delete the namespaces and the bridge; keep the hosts' files (Ray and
        step logs) for a look after a failure, else remove them."""
        self.registry.stop()
        remove_leftovers(remove_state=not keep_state)
        for init in self._inits:
            with contextlib.suppress(subprocess.TimeoutExpired):
                init.wait(timeout=10)
        self._inits.clear()
        self._libraries.clear()
        self._extra.clear()

    def _write_client(self) -> None:
        self.client_key.parent.mkdir(parents=True, exist_ok=True)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "roll-cluster-e2e", "-f", str(self.client_key)])
        (STATE_ROOT / "authorized_keys").write_text(self.client_key.with_suffix(".pub").read_text())
        self.ssh_config.write_text(
            "Host *\n"
            "  User root\n"
            f"  IdentityFile {self.client_key}\n"
            "  IdentitiesOnly yes\n"
            "  BatchMode yes\n"
            "  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n"
            "  GlobalKnownHostsFile /dev/null\n"
            "  LogLevel ERROR\n"
            "  ConnectTimeout 10\n"
        )
        # The user-facing commands are plain `ssh -i KEY root@IP ...`; this wrapper adds the test's client config
        # (no known_hosts prompts) without changing the command under test.
        self.client_bin.mkdir(parents=True, exist_ok=True)
        wrapper = self.client_bin / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {self.ssh_config} "$@"\n')
        wrapper.chmod(0o755)

    @staticmethod
    def _write_support_files() -> None:
        """Once, before any host starts, and each file replaced whole (a new inode): bash reads a script as it runs,
        so rewriting host_init.sh in place while a host's init was reading it ended that init early (no sshd)."""
        SUPPORT_DIR.mkdir(parents=True, exist_ok=True)
        for script in ("host_init.sh", "host_dockerd.sh"):
            staged = SUPPORT_DIR / f".{script}.new"
            shutil.copyfile(E2E_DIR / script, staged)
            staged.replace(SUPPORT_DIR / script)

    def _start_host(self, index: int, host: TestHost) -> None:
        # The hosts mount their own /data over this one (host_init.sh); a machine without /data gets an empty one.
        Path("/data").mkdir(exist_ok=True)
        for sub in ("tmp", "log", "workspace", "data", "docker-data"):
            (host.root / sub).mkdir(parents=True, exist_ok=True)
        (host.root / "tmp").chmod(0o1777)
        veth = f"{NETNS_PREFIX}v{index}"
        _run(["ip", "netns", "add", host.netns])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns])
        _run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
        for argv in (
            ["link", "set", "lo", "up"],
            ["addr", "add", f"{host.ip}/24", "dev", "eth0"],
            ["link", "set", "eth0", "up"],
            # ROLL and Ray find "their" address through the default route, as on a real node.
            ["route", "add", "default", "via", BRIDGE_IP],
        ):
            _run(["ip", "-n", host.netns, *argv])
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host.root / "ssh_host_ed25519_key")])
        config = host.root / "sshd_config"
        config.write_text(
            "Port 22\n"
            f"ListenAddress {host.ip}\n"
            f"HostKey {host.root / 'ssh_host_ed25519_key'}\n"
            "PermitRootLogin prohibit-password\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            f"AuthorizedKeysFile {STATE_ROOT / 'authorized_keys'}\n"
            # The keys lie under /var/tmp, which is world-writable: StrictModes would refuse them.
            "StrictModes no\n"
            "UsePAM no\n"
            "PidFile none\n"
            "MaxStartups 100\n"
            "MaxSessions 100\n"
            # A stock sshd's SFTP subsystem (pulumi-command's CopyToRemote copies the script library over SFTP).
            "Subsystem sftp internal-sftp\n"
        )
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "E2E_HOST_DIR": str(host.root),
            "E2E_HOSTNAME": host.name,
            "E2E_SSHD_CONFIG": str(config),
            "E2E_SUPPORT_DIR": str(SUPPORT_DIR),
            "E2E_DAEMON_JSON": HOST_DAEMON_JSON,
        }
        # nsenter, not `ip netns exec`: that one mounts a fresh /sys, without the cgroup mounts dockerd needs
        # ("Devices cgroup isn't mounted"); host_init.sh mounts the namespace's sysfs itself, cgroups kept.
        argv = ["nsenter", f"--net=/var/run/netns/{host.netns}", "--", "unshare", "--mount", "--pid", "--fork",
                "--mount-proc", "--uts"]
        argv += ["--", "bash", str(SUPPORT_DIR / "host_init.sh")]
        self._init_argv[host.name] = (argv, env)
        self._launch_init(host)

    def _launch_init(self, host: TestHost) -> None:
        argv, env = self._init_argv[host.name]
        with open(host.root / "init.log", "ab") as log:
            init = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        self._inits.append(init)
        self._init_of[host.name] = init

    # ---- hosts beyond the session's ----

    def add_hosts(self, count: int) -> list[TestHost]:
        """`count` more hosts, started as the session's (their addresses after them), for a test that needs more;
        not in `hosts` (the other tests use those), and gone with `remove_hosts` or the session."""
        first = len(self.hosts) + len(self._extra)
        added = [TestHost(f"e2e-h{i}", f"{SUBNET}.{11 + i}", f"{NETNS_PREFIX}h{i}", STATE_ROOT / "hosts" / f"e2e-h{i}")
                 for i in range(first, first + count)]
        self._extra += added
        for offset, host in enumerate(added):
            self._start_host(first + offset, host)
        for host in added:
            self._wait_for_ssh(host)
        return added

    def remove_hosts(self, hosts: Sequence[TestHost]) -> None:
        """Every process of these added hosts killed (their dockerd and containers too) and their namespaces gone."""
        for host in hosts:
            _kill_namespace_processes(host.netns)
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True)
            self._extra.remove(host)
            self._libraries = {entry for entry in self._libraries if entry[0] != host.name}

    # ---- a host going away, or rebooting ----

    def power_off(self, host: TestHost) -> None:
        """Kill every process of the host (sshd, containers, Ray) at once, as a power loss would; the address stays
        on the bridge and refuses connections."""
        _kill_namespace_processes(host.netns)
        init = self._init_of.get(host.name)
        if init is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                init.wait(timeout=10)

    def reboot(self, host: TestHost) -> None:
        """power_off, then start the host's init again (which starts dockerd, which starts again the containers
        whose restart policy says so, then sshd); returns once sshd answers."""
        self.power_off(host)
        self._launch_init(host)
        self._wait_for_ssh(host)
        # A node's script library is on its disk and survives the reboot; the tier's /var/lib is an overlay in a
        # tmpfs that does not: put back what the library steps had copied.
        for name, user, remote_path, source in sorted(self._libraries):
            if name == host.name:
                self.copy_library(host, Path(source), remote_path, user).check()

    def _wait_for_ssh(self, host: TestHost, timeout: float = 240) -> None:
        """Until sshd answers (the host's init starts it once dockerd answers: a bound for a broken host, under load
        three dockerds start at once)."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError), socket.create_connection((host.ip, 22), timeout=1):
                result = self.run(host, "command -v docker && docker version --format '{{.Server.Version}}'",
                                  timeout=60)
                if result.returncode == 0:
                    docker = result.stdout.split()[0]
                    if docker != str(DOCKER_CLI):
                        raise RuntimeError(f"on {host.name}, `docker` is {docker}, not {DOCKER_CLI}")
                    return
                dockerd_log = (host.root / "log" / "dockerd.log")
                raise RuntimeError(f"dockerd on {host.name} does not answer:\n{result.output}\n"
                                   f"{dockerd_log.read_text()[-3000:] if dockerd_log.exists() else ''}")
            if time.monotonic() > deadline:
                log = (host.root / "sshd.log").read_text() if (host.root / "sshd.log").exists() else ""
                init = self._init_of.get(host.name)
                state = "not started" if init is None else (
                    "still running" if init.poll() is None else f"exited {init.returncode}")
                init_log = (host.root / "init.log").read_text()[-2000:] if (host.root / "init.log").exists() else ""
                raise RuntimeError(f"sshd on {host.name} ({host.ip}) did not answer within {timeout}s (the host's "
                                   f"init: {state})\nsshd.log:\n{log}\ninit.log:\n{init_log}")
            time.sleep(0.2)

    # ---- containers ----

    def create_container(
        self, host: TestHost, name: str, env: Mapping[str, str] | None = None, command: Sequence[str] = (),
        image: str = TEST_IMAGE, volumes: Sequence[str] = ("/workspace", "/tmp"),
    ) -> None:
        """`docker run -d --init --restart unless-stopped --name NAME --network host -v PATH:PATH... IMAGE CMD`
        (CMD: the given command, by default `sleep infinity`; the image pulled from the tier's registry when the
        host lacks it), unless it runs already. The host's /workspace is the container's, as the product mounts
        the node's /data/workspace there, and so is the host's private /tmp: a test puts the job's files on the
        host and reads what the steps and Ray left in the container (job files, spilled objects, Ray's logs)
        through TestHost.private_path. The program's own containers (program_commands) mount what it says only."""
        options = " ".join(f"-e {shlex.quote(f'{key}={value}')}" for key, value in (env or {}).items())
        options += "".join(f" -v {shlex.quote(f'{path}:{path}')}" for path in volumes)
        argv = " ".join(shlex.quote(word) for word in (command or ["sleep", "infinity"]))
        script = (
            f"docker inspect --format '{{{{.State.Running}}}}' {name} >/dev/null 2>&1 || "
            f"docker run -d --init --restart unless-stopped --name {name} --network host {options} "
            f"{image} {argv}"
        )
        self.run(host, script, timeout=300).check()

    def containers(self, host: TestHost) -> list[str]:
        """The names of the host's containers, running or not."""
        listing = self.run(host, "docker ps -a --format '{{.Names}}'", timeout=60).check()
        return listing.stdout.split()

    def remove_container(self, host: TestHost, name: str) -> None:
        self.run(host, f"docker rm -f {name}", timeout=30).check()

    # ---- running commands ----

    def ssh_argv(self, host: TestHost, command: str, user: str = "root") -> list[str]:
        return ["ssh", "-F", str(self.ssh_config), f"{user}@{host.ip}", command]

    def run(self, host: TestHost, command: str, timeout: float = 300, user: str = "root") -> CommandResult:
        """Run `command` on `host` as pulumi-command does: one SSH session whose login shell runs the string."""
        return self.start_command(host, command, user).wait(timeout)

    def copy_library(self, host: TestHost, source: Path, remote_path: str, user: str = "root") -> CommandResult:
        """What pulumi-command's CopyToRemote does with a directory whose path ends in `/` (remote/copyController.go
        sftpCopy, copyDir): over SFTP as `user`, make `remote_path` and its parents, then each subdirectory and
        file of `source` in it (a relative `remote_path` is in the user's home)."""
        batch = []
        parts = remote_path.strip("/").split("/")
        prefix = "/" if remote_path.startswith("/") else ""
        for index in range(1, len(parts) + 1):
            batch.append(f"-mkdir {prefix}{'/'.join(parts[:index])}")
        for item in sorted(source.rglob("*")):
            target = f"{remote_path.rstrip('/')}/{item.relative_to(source)}"
            batch.append(f"-mkdir {target}" if item.is_dir() else f"put {item} {target}")
        result = RunningCommand(host.name, ["sftp", "-F", str(self.ssh_config), "-b", "-", f"{user}@{host.ip}"],
                                stdin_text="\n".join(batch) + "\n").wait(120)
        if result.returncode == 0:
            self._libraries.add((host.name, user, remote_path, str(source)))
        return result

    def start_command(self, host: TestHost, command: str, user: str = "root") -> RunningCommand:
        # A program step (program_commands.StepCommand) reads its text on the session's stdin, as from
        # pulumi-command, and sources the node's script library, which its library step copied first.
        library = getattr(command, "library", None)
        if library is not None and (host.name, library.user, library.remote_path, str(library.source)) \
                not in self._libraries:
            self.copy_library(host, library.source, library.remote_path, library.user).check()
        return RunningCommand(host.name, self.ssh_argv(host, command, user), stdin_text=getattr(command, "stdin", None))

    def run_parallel(self, runs: Sequence[tuple[TestHost, str]], timeout: float = 300) -> list[CommandResult]:
        with ThreadPoolExecutor(max_workers=max(1, len(runs))) as pool:
            return list(pool.map(lambda run: self.run(run[0], run[1], timeout), runs))

    def run_user_command(self, command: str, timeout: float = 120) -> CommandResult:
        """Run a command a user copies from the stack outputs (`ssh -i KEY root@IP ...`) on the test machine, as
        the admin whose home is ADMIN_HOME (where the program's known-hosts file goes, ~/.ssh/roll-cluster/)."""
        ADMIN_HOME.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PATH": f"{self.client_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               "HOME": str(ADMIN_HOME)}
        return RunningCommand("the admin machine", ["bash", "-c", command], env=env).wait(timeout)


def _namespaces() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith(NETNS_PREFIX)]


def _kill_namespace_processes(netns: str) -> None:
    """SIGKILL every process in the namespace (our hosts' init, sshd, Ray) until none is left."""
    for _ in range(50):
        pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.1)
    raise RuntimeError(f"processes of {netns} survive SIGKILL")


def remove_leftovers(remove_state: bool = True) -> None:
    """Remove this tier's namespaces (with every process of the hosts: their dockerd, containerd and containers),
    registries, bridge and (optionally) files, also those of a run that crashed."""
    for netns in _namespaces():
        _kill_namespace_processes(netns)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
    remove_docker_leftovers()
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
        _run(["ip", "link", "del", BRIDGE])
    # A run killed between creating a host's veth pair and moving its peer leaves the host end behind.
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    for name in {line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ":" in line}:
        if name.startswith(f"{NETNS_PREFIX}v"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)
    if remove_state and STATE_ROOT.exists():
        shutil.rmtree(STATE_ROOT)


@contextlib.contextmanager
def hosts_for_script(count: int, keep_state_on_error: bool = True) -> Iterator[TestNetwork]:
    """Hosts for a script (the benchmark); tests use the session fixture in conftest.py."""
    reason = unavailable_reason()
    if reason is not None:
        sys.exit(f"cannot run: {reason}")
    ensure_sshd()
    ensure_docker()
    network = TestNetwork(count, ensure_test_image())
    network.start()
    failed = True
    try:
        yield network
        failed = False
    finally:
        network.stop(keep_state=failed and keep_state_on_error)
