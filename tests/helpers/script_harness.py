"""Run the node scripts for real, rendered exactly as infra/node/remote.py renders them, on a fake node.

A FakeNode is a temp dir standing in for one ECS node: the files the scripts write (os-release, fstab, daemon.json,
repo files, /root/auto_install, /var/lib/roll-cluster, mount points) live under it through the scripts' path
variables, and tests/standins/ is first in PATH for what cannot exist on a test machine (package repositories,
systemd and dockerd, a GPU, block devices and mounts, cloud-init, the metadata service, ssh to a node). The
stand-ins keep their state and a record of every call under `state`.

PATH holds only the stand-ins and /usr/local/bin, /usr/bin, /bin: a tool a script calls without a stand-in that
lives in /usr/sbin (mkfs.*, reboot, ...) is then "not found" and fails the test instead of touching this machine.
"""

from __future__ import annotations

import base64
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infra.node.remote import local_library, render_plain, render_user_data
from infra.sources.alibaba.user_data import encode_user_data

REPO_ROOT = Path(__file__).resolve().parents[2]
STANDINS_DIR = REPO_ROOT / "tests" / "standins"
GPU_READY_SCRIPT = REPO_ROOT / "infra" / "scripts" / "local" / "gpu_ready.sh"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
STEP_TIMEOUT_S = 60

OS_RELEASE = {
    "alinux": (
        'NAME="Alibaba Cloud Linux"\nVERSION="3 (OpenAnolis Edition)"\nID="alinux"\n'
        'ID_LIKE="rhel fedora centos anolis"\nVERSION_ID="3"\nPRETTY_NAME="Alibaba Cloud Linux 3"\n'
    ),
    "ubuntu": (
        'PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\nVERSION_CODENAME=jammy\n'
        "ID=ubuntu\nID_LIKE=debian\nUBUNTU_CODENAME=jammy\n"
    ),
    "centos7": 'NAME="CentOS Linux"\nVERSION="7 (Core)"\nID="centos"\nVERSION_ID="7"\n',
}


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    def __str__(self) -> str:  # what a failed assertion shows
        return f"exit {self.returncode}\n--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"


class FakeNode:
    """One fake node under `root`; `os_id` picks its /etc/os-release (alinux, ubuntu, centos7)."""

    def __init__(self, root: Path, os_id: str = "alinux") -> None:
        self.root = root
        self.bin = root / "bin"
        shutil.copytree(STANDINS_DIR, self.bin)
        for path in self.bin.rglob("*"):
            if path.is_file() and not path.name.endswith("_common.sh"):
                path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.state = root / "state"
        self.etc = root / "etc"
        self.log_dir = root / "var-log-roll-cluster"
        self.roll_state = root / "var-lib-roll-cluster"
        self.auto_install_dir = root / "root-auto_install"
        self.data_mount = root / "data"
        self.shared_mount = root / "mnt-shared"
        for directory in (self.state, self.etc, root / "home", root / "run", root / "dpkg"):
            directory.mkdir(parents=True, exist_ok=True)
        (self.state / "boot_id").write_text("boot-1\n")
        self.set_os(os_id)

    def set_os(self, os_id: str) -> None:
        (self.etc / "os-release").write_text(OS_RELEASE[os_id])

    @property
    def path(self) -> str:
        return f"{self.bin}:{SYSTEM_PATH}"

    @property
    def boot_id_file(self) -> Path:
        return self.state / "boot_id"

    @property
    def apt_lock_files(self) -> list[Path]:
        return [self.root / "dpkg" / "lock-frontend", self.root / "dpkg" / "lock"]

    def machine_env(self) -> dict[str, str]:
        """The environment of the shell that runs a command on the node (what sshd or cloud-init provides)."""
        return {
            "PATH": self.path,
            "HOME": str(self.root / "home"),
            "LANG": "C.UTF-8",
            "STANDIN_STATE": str(self.state),
            "STANDIN_REMOTE_PATH": self.path,
            "STANDIN_REAL_PYTHON": sys.executable,
            # Only the stand-ins read these two, to behave like the package managers they replace.
            "YUM_PID_FILE": str(self.root / "run" / "yum.pid"),
            "APT_LOCK_FILES": " ".join(str(p) for p in self.apt_lock_files),
        }

    def step_env(self, **overrides: str) -> dict[str, str]:
        """The variables a step gets through the rendered exports: its settings, with paths inside the fake node."""
        env = {
            "NODE_NAME": "test-node-0",
            "ROLL_CLUSTER_LOG_DIR": str(self.log_dir),
            "ROLL_CLUSTER_STATE_DIR": str(self.roll_state),
            "AUTO_INSTALL_DIR": str(self.auto_install_dir),
            "BOOT_ID_FILE": str(self.boot_id_file),
            "CURRENT_JOB_FILE": str(self.roll_state / "current-job"),  # the job step's record for autostop
            "OS_RELEASE_FILE": str(self.etc / "os-release"),
            "FSTAB_FILE": str(self.etc / "fstab"),
            "DOCKER_DAEMON_JSON": str(self.etc / "docker" / "daemon.json"),
            "YUM_REPOS_DIR": str(self.etc / "yum.repos.d"),
            "APT_SOURCES_DIR": str(self.etc / "apt" / "sources.list.d"),
            "APT_KEYRINGS_DIR": str(self.etc / "apt" / "keyrings"),
            "YUM_PID_FILE": str(self.root / "run" / "yum.pid"),
            "APT_LOCK_FILES": " ".join(str(p) for p in self.apt_lock_files),
            # Processes of this shared test machine are not the node's; the process check has its own test.
            "PACKAGE_MANAGER_PROCESSES": "",
            "CLOUD_INIT_BOOT_FINISHED": str(self.root / "cloud-init-boot-finished"),
            "DATA_MOUNT": str(self.data_mount),
            "SHARED_MOUNT": str(self.shared_mount),
            "RETRY_DELAY_S": "0",
        }
        env.update(overrides)
        return env

    def run_step(self, step: str, scripts: list[str], **overrides: str) -> Result:
        """Run a remote step as pulumi-command does: the command render_plain makes, through a shell."""
        command = render_plain(step, scripts, self.step_env(**overrides), library=local_library())
        return self._run(["bash", "-c", command], self.machine_env())

    def run_user_data(self, script: str, **overrides: str) -> Result:
        """Run a first-boot script as cloud-init runs user data: an executable file holding what the instance's
        user_data decodes to (the unpacking script of infra/sources/alibaba/user_data.py around the rendered one)."""
        user_data = self.root / "user-data"
        rendered = render_user_data(script, self.step_env(**overrides))
        user_data.write_bytes(base64.b64decode(encode_user_data(rendered)))
        user_data.chmod(0o755)
        return self._run([str(user_data)], self.machine_env())

    def run_gpu_ready(self, **overrides: str) -> Result:
        """Run local/gpu_ready.sh as the lead's local.Command does, with `ssh` reaching this fake node."""
        node = self.step_env()
        env = {
            **self.machine_env(),
            "HOST": "10.0.0.5",
            "NODE_NAME": "test-node-0",
            "EXPECTED_GPUS": "2",
            "GPU_DRIVER": "auto-install",
            "KNOWN_HOSTS_FILE": str(self.root / "local-known_hosts"),
            "INTERVAL_S": "0.1",
            "TIMEOUT_S": "30",
            "ROLL_CLUSTER_LOG_DIR": str(self.root / "local-logs"),
            # The node side of the probe, inside this fake node.
            "AUTO_INSTALL_DIR": node["AUTO_INSTALL_DIR"],
            "ROLL_CLUSTER_STATE_DIR": node["ROLL_CLUSTER_STATE_DIR"],
            "BOOT_ID_FILE": node["BOOT_ID_FILE"],
            "NODE_LOG_DIR": node["ROLL_CLUSTER_LOG_DIR"],
        }
        env.update(overrides)
        return self._run(["bash", str(GPU_READY_SCRIPT)], env)

    @staticmethod
    def _run(argv: list[str], env: dict[str, str], timeout: float = STEP_TIMEOUT_S) -> Result:
        started = time.monotonic()
        try:
            completed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as expired:  # a hung script: its output so far, not the whole command
            return Result(-9, _text(expired.stdout), _text(expired.stderr) + f"\n(killed after {timeout}s)", timeout)
        return Result(completed.returncode, completed.stdout, completed.stderr, time.monotonic() - started)

    # ---- stand-in state ----

    def calls(self, tool: str) -> list[str]:
        """Every recorded call of a stand-in, arguments joined with spaces."""
        log = self.state / "calls" / f"{tool}.log"
        return log.read_text().splitlines() if log.exists() else []

    def fail_next(self, key: str, times: int) -> None:
        """Make the stand-in failure point `key` fail the next `times` times (see tests/standins/)."""
        (self.state / "fail").mkdir(exist_ok=True)
        (self.state / "fail" / key).write_text(f"{times}\n")

    def set_state(self, name: str, content: str) -> None:
        (self.state / name).parent.mkdir(parents=True, exist_ok=True)
        (self.state / name).write_text(content)

    def installed_packages(self) -> list[str]:
        packages = self.state / "packages"
        return packages.read_text().split() if packages.exists() else []

    def mounts(self) -> dict[str, list[str]]:
        """Mounted paths -> [source, fs type, options], from the mount stand-in."""
        mounts = self.state / "mounts"
        lines = mounts.read_text().splitlines() if mounts.exists() else []
        return {line.split("\t")[0]: line.split("\t")[1:] for line in lines}

    def snapshot(self, *directories: Path) -> dict[str, tuple[bytes, int]]:
        """Content and modification time of every file under the given directories (default: what steps write)."""
        roots = directories or (self.etc, self.roll_state, self.auto_install_dir, self.data_mount)
        files: dict[str, tuple[bytes, int]] = {}
        for directory in roots:
            if directory.exists():
                for path in sorted(directory.rglob("*")):
                    if path.is_file():
                        files[str(path)] = (path.read_bytes(), path.stat().st_mtime_ns)
        return files


def wait_until(predicate_description: str, predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    """Poll a condition of the fake node (e.g. a background installer finishing) with a bound."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {predicate_description}")
        time.sleep(0.05)


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def start_background(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A helper process (a package manager holding its lock); the caller kills it when done.

    It is reaped as soon as it exits, as a real package manager is by its parent: a zombie would still be seen
    by pgrep and kill -0 and look like a lock that is never released.
    """
    process = subprocess.Popen(
        argv,
        env=env or dict(os.environ),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    threading.Thread(target=process.wait, daemon=True).start()
    return process


def assert_ok(result: Result) -> None:
    assert result.returncode == 0, str(result)


def assert_failed(result: Result, *fragments: str) -> None:
    assert result.returncode != 0, str(result)
    for fragment in fragments:
        assert fragment in result.output, f"{fragment!r} not in:\n{result}"
