"""Real Docker for the real-host tier: Debian's docker.io and distribution registry, the test image, and registries
a test starts and reads the access log of.

- Every test host runs its own dockerd (host_dockerd.sh, started by host_init.sh in the host's namespaces).
- The test image is a minimal Debian root file system with Python and Ray (requirements-e2e.txt) in /opt/ray, made
  with mmdebstrap and `docker import`, plus a second tag with one more small layer (a changed image). It is built
  once into a registry's storage under /var/cache/roll-cluster-e2e (outside the clone and outside /tmp), keyed by
  its pins, so a second run on the same machine serves it from there without building anything.
- `Registry` runs the distribution registry (optionally behind htpasswd Basic auth), plain HTTP, with its HTTP
  access log in a file a test reads (`requests`, `blob_downloads`).

Nothing here imports the harness (the harness imports this); every process started here is found again and ended by
`remove_leftovers`, also after a crashed run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DOCKERD = Path("/usr/sbin/dockerd")
# Debian's CLI, the same release as its dockerd: the tier's hosts and its image build use it (a machine may have a
# newer CLI earlier in PATH, e.g. /usr/local/bin/docker; the hosts hide that one, see host_init.sh).
DOCKER_CLI = Path("/usr/bin/docker")
REGISTRY_BIN = Path("/usr/bin/docker-registry")
MMDEBSTRAP = Path("/usr/bin/mmdebstrap")
CACHE_ROOT = Path(os.environ.get("ROLL_E2E_CACHE", "/var/cache/roll-cluster-e2e"))
RAY_REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements-e2e.txt"

IMAGE_REPOSITORY = "roll-e2e/training"
IMAGE_TAG = "1"
CHANGED_IMAGE_TAG = "2"  # tag 1 and one small layer more: /etc/e2e-image-version says 2
IMAGE_PATH = "/opt/ray/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the image is made of: a change here, or in requirements-e2e.txt, builds a new one (a new cache key).
DEBIAN_SUITE = "bookworm"  # Python 3.11, as the wheels below are chosen for
DEBIAN_MIRROR = "http://deb.debian.org/debian"
# procps: `ray stop` and the steps' process probes; iproute2: Ray's address; git, curl, ca-certificates: the steps'
# code and model fetches in the container; libstdc++6: Ray's native parts; libjemalloc2: what MindSpeed-RL preloads.
IMAGE_PACKAGES = ("python3", "python3-venv", "procps", "iproute2", "curl", "ca-certificates", "libstdc++6", "git",
                  "libjemalloc2")
IMAGE_RECIPE = (DEBIAN_SUITE, DEBIAN_MIRROR, IMAGE_PACKAGES, IMAGE_PATH, "cp311", "recipe-1")
# Leftover processes and mounts of the tier on the test machine are those that name this directory.
STATE_ROOT = Path("/var/tmp/roll-cluster-e2e")
REGISTRIES_DIR = STATE_ROOT / "registries"
BUILD_DIR = STATE_ROOT / "image-build"
CGROUP_PREFIX = "rce2e-"  # dockerd's --cgroup-parent: rce2e-<host name>, rce2e-builder


def _run(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 1800,
         input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=timeout, input=input_text)
    if result.returncode != 0:
        output = result.stdout[-4000:] + result.stderr[-4000:]
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {output}")
    return result


def apt_install(package: str) -> None:
    """One Debian package, non-interactively (apt-get update only when the package is not found)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    if subprocess.run(install, capture_output=True, env=env).returncode != 0:
        _run(["apt-get", "update", "-q"], env=env)
        _run(install, env=env)


def ensure_docker() -> None:
    """Debian's docker.io (dockerd, containerd, runc, the CLI, docker-init) and docker-registry, installed once."""
    if not (DOCKERD.exists() and DOCKER_CLI.exists()):
        apt_install("docker.io")
    if not REGISTRY_BIN.exists():
        apt_install("docker-registry")


def _wait(what: str, ready: Callable[[], bool], timeout: float, log: Path | None = None) -> None:
    """Poll `ready` until it is true; bounded (a bound for a broken daemon, not a measurement)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
            raise RuntimeError(f"{what} did not happen within {timeout}s\n{tail}")
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------------ registries
@dataclass(frozen=True)
class RegistryRequest:
    client: str
    method: str
    path: str
    status: int


# The combined log format the registry writes per request (distribution 2.x registry.go: gorilla handlers'
# CombinedLoggingHandler on stdout unless log.accesslog.disabled).
_ACCESS_LINE = re.compile(r'^(\S+) \S+ \S+ \[[^\]]*\] "(\S+) (\S+) [^"]*" (\d{3}) ')


class Registry:
    """The distribution registry serving `storage` on `address` (HOST:PORT), plain HTTP, started by `start` and ended
    by `stop` (or by `remove_leftovers`). `htpasswd`: an htpasswd file (bcrypt) whose users alone may pull and push
    (Basic auth). `read_only`: pushes are refused (a shared, cached storage stays as it was).

    Its HTTP access log, one line per request, is `access_log`; `requests()` parses it and `blob_downloads()` lists
    the blobs it served (GET .../blobs/<digest> answered 200), for a test that counts what a pull fetched where."""

    def __init__(self, name: str, address: str, storage: Path, *, htpasswd: Path | None = None,
                 read_only: bool = False) -> None:
        self.name = name
        self.address = address
        self.storage = storage
        self.htpasswd = htpasswd
        self.read_only = read_only
        self.directory = REGISTRIES_DIR / name
        self.access_log = self.directory / "access.log"
        self.log = self.directory / "registry.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def image(self, repository: str, tag: str) -> str:
        return f"{self.address}/{repository}:{tag}"

    def _config(self) -> str:
        host, port = self.address.rsplit(":", 1)
        lines = [
            "version: 0.1",
            "log:",
            "  level: info",
            "  formatter: text",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {self.storage}",
            "  maintenance:",
            "    uploadpurging:",
            "      enabled: false",
            "    readonly:",
            f"      enabled: {'true' if self.read_only else 'false'}",
            "http:",
            f"  addr: {host}:{int(port)}",
        ]
        if self.htpasswd:
            lines += ["auth:", "  htpasswd:", "    realm: roll-cluster-e2e", f"    path: {self.htpasswd}"]
        return "\n".join(lines) + "\n"

    def start(self) -> Registry:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.storage.mkdir(parents=True, exist_ok=True)
        config = self.directory / "config.yml"
        config.write_text(self._config())
        with open(self.access_log, "ab") as access, open(self.log, "ab") as log:
            self._process = subprocess.Popen(
                [str(REGISTRY_BIN), "serve", str(config)], stdin=subprocess.DEVNULL, stdout=access, stderr=log,
                start_new_session=True,
            )
        (self.directory / "registry.pid").write_text(f"{self._process.pid}\n")
        _wait(f"the registry {self.name} answering on {self.url}/v2/", self._answers, 60, self.log)
        return self

    def _answers(self) -> bool:
        if self._process is not None and self._process.poll() is not None:
            raise RuntimeError(f"the registry {self.name} exited {self._process.returncode}:\n"
                               f"{self.log.read_text(errors='replace')[-3000:]}")
        try:
            # Straight to the registry, whatever proxy the environment names.
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(f"{self.url}/v2/", timeout=2) as response:
                return bool(response.status == 200)
        except urllib.error.HTTPError as error:  # behind auth, /v2/ answers 401 to a request without credentials
            return self.htpasswd is not None and error.code == 401
        except OSError:
            return False

    def stop(self) -> None:
        if self._process is not None:
            _end(self._process.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=30)
            self._process = None
        (self.directory / "registry.pid").unlink(missing_ok=True)

    def requests(self) -> list[RegistryRequest]:
        found = []
        text = self.access_log.read_text(errors="replace") if self.access_log.exists() else ""
        for line in text.splitlines():
            match = _ACCESS_LINE.match(line)
            if match:
                found.append(RegistryRequest(match[1], match[2], match[3], int(match[4])))
        return found

    def blob_downloads(self) -> list[str]:
        """The digests of the blobs this registry sent (GET, 200), once per download."""
        return [r.path.rsplit("/", 1)[1] for r in self.requests()
                if r.method == "GET" and r.status == 200 and "/blobs/" in r.path]


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# ------------------------------------------------------------------------------------------------ the test image
def image_key() -> str:
    recipe = repr(IMAGE_RECIPE).encode() + RAY_REQUIREMENTS.read_bytes()
    return hashlib.sha256(recipe).hexdigest()[:16]


def image_storage() -> Path:
    """The registry storage that holds the test image's two tags (built by ensure_test_image)."""
    return CACHE_ROOT / f"image-registry-{image_key()}"


def ensure_test_image() -> Path:
    """The test image in a registry storage under the cache, built when no earlier run left it there."""
    storage = image_storage()
    if (storage / ".complete").exists():
        return storage
    building = storage.with_name(storage.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    try:
        _build_image(building)
    finally:
        _stop_builder()
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
    (building / ".complete").write_text(image_key() + "\n")
    shutil.rmtree(storage, ignore_errors=True)
    building.rename(storage)
    # The images of earlier pins are of no further use: the cache keeps the current one only.
    for earlier in CACHE_ROOT.glob("image-registry-*"):
        if earlier != storage:
            shutil.rmtree(earlier, ignore_errors=True)
    return storage


def _build_image(storage: Path) -> None:
    if not MMDEBSTRAP.exists():
        apt_install("mmdebstrap")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    wheels = BUILD_DIR / "wheels"
    # The wheels come through this machine's pip (its index and certificates); the image's own pip installs them
    # offline. Chosen for the image's Python (Debian 12: CPython 3.11), whatever Python runs the tests.
    _run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
          "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "-d", str(wheels),
          "-r", str(RAY_REQUIREMENTS)])
    shutil.copyfile(RAY_REQUIREMENTS, BUILD_DIR / "requirements-e2e.txt")
    rootfs = BUILD_DIR / "rootfs.tar"
    hooks = [
        f"copy-in {BUILD_DIR / 'requirements-e2e.txt'} {wheels} /tmp",
        'chroot "$1" python3 -m venv /opt/ray',
        'chroot "$1" env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL /opt/ray/bin/pip install -q '
        "--no-cache-dir --disable-pip-version-check --no-index --find-links /tmp/wheels "
        "-r /tmp/requirements-e2e.txt",
        f'echo {IMAGE_TAG} >"$1/etc/e2e-image-version"',
        # Small is fast: every host pulls the image once per run.
        'rm -rf "$1"/tmp/* "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/usr/share/doc "$1"/usr/share/man '
        '"$1"/usr/share/locale',
    ]
    argv = [str(MMDEBSTRAP), "--quiet", "--variant=minbase", f"--include={','.join(IMAGE_PACKAGES)}"]
    argv += [f"--customize-hook={hook}" for hook in hooks]
    _run([*argv, DEBIAN_SUITE, str(rootfs), DEBIAN_MIRROR])
    docker = _start_builder()
    registry = Registry("image-build", f"127.0.0.1:{free_loopback_port()}", storage).start()
    try:
        first = registry.image(IMAGE_REPOSITORY, IMAGE_TAG)
        changes = [f"ENV PATH={IMAGE_PATH}", "ENV LANG=C.UTF-8", "ENV HOME=/root", 'CMD ["sleep", "infinity"]']
        _run([*docker, "import", *[arg for change in changes for arg in ("--change", change)], str(rootfs), first])
        _run([*docker, "push", first])
        context = BUILD_DIR / "changed"
        context.mkdir()
        (context / "e2e-image-version").write_text(f"{CHANGED_IMAGE_TAG}\n")
        (context / "Dockerfile").write_text(f"FROM {first}\nCOPY e2e-image-version /etc/e2e-image-version\n")
        second = registry.image(IMAGE_REPOSITORY, CHANGED_IMAGE_TAG)
        _run([*docker, "build", "-q", "-t", second, str(context)], env={**os.environ, "DOCKER_BUILDKIT": "0"})
        _run([*docker, "push", second])
    finally:
        registry.stop()


def _builder_paths() -> dict[str, Path]:
    base = BUILD_DIR / "docker"
    return {name: base / name for name in ("root", "exec", "docker.sock", "docker.pid", "daemon.json", "dockerd.log")}


def _start_builder() -> list[str]:
    """A dockerd of its own on the test machine for the image build (no bridge, no iptables, its own roots)."""
    paths = _builder_paths()
    paths["root"].mkdir(parents=True, exist_ok=True)
    paths["daemon.json"].write_text("{}\n")  # never the machine's own /etc/docker/daemon.json
    with open(paths["dockerd.log"], "ab") as log:
        subprocess.Popen(
            [str(DOCKERD), "--config-file", str(paths["daemon.json"]), "--data-root", str(paths["root"]),
             "--exec-root", str(paths["exec"]), "-H", f"unix://{paths['docker.sock']}",
             "--pidfile", str(paths["docker.pid"]), "--cgroup-parent", f"{CGROUP_PREFIX}builder",
             "--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-forward=false", "--ip-masq=false"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
        )
    docker = [str(DOCKER_CLI), "-H", f"unix://{paths['docker.sock']}"]

    def answers() -> bool:
        return subprocess.run([*docker, "info"], capture_output=True).returncode == 0

    _wait("the image builder's dockerd answering", answers, 120, paths["dockerd.log"])
    return docker


def _stop_builder() -> None:
    pidfile = _builder_paths()["docker.pid"]
    if pidfile.exists():
        with contextlib.suppress(ValueError):
            _end(int(pidfile.read_text().strip()))
    _end_state_processes([BUILD_DIR])
    _unmount_state()


# ------------------------------------------------------------------------------------------------ leftovers
def _end(pid: int, grace: float = 30) -> None:
    """SIGTERM (dockerd stops its containerd and containers), SIGKILL after `grace` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            os.kill(pid, 0)
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)


def _state_processes(directories: Sequence[Path]) -> Iterator[int]:
    """Processes whose command line names one of these directories of the tier's state: the registries (their
    configuration) and the image builder's dockerd, containerd and shims (their roots and sockets)."""
    markers = [str(directory).encode() + b"/" for directory in directories]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes()
            if any(marker in cmdline for marker in markers):
                yield int(entry.name)


def _end_state_processes(directories: Sequence[Path] = (REGISTRIES_DIR, BUILD_DIR)) -> None:
    for pid in list(_state_processes(directories)):
        _end(pid, grace=15)


def _unmount_state() -> None:
    """The image builder's overlay and shm mounts (the hosts' lie in their own mount namespaces, gone with them)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    points = [line.split()[1].replace("\\040", " ") for line in mounts]
    for point in reversed(points):
        if point.startswith(f"{STATE_ROOT}/"):
            subprocess.run(["umount", "-l", point], capture_output=True)


def _remove_cgroups() -> None:
    """The empty cgroups the hosts' dockerds left for their containers (rce2e-<host>/<container id>), deepest first."""
    root = Path("/sys/fs/cgroup")
    if not root.is_dir():
        return
    found: list[Path] = []
    for controller in [root, *(p for p in root.iterdir() if p.is_dir())]:
        with contextlib.suppress(OSError):
            for parent in controller.glob(f"{CGROUP_PREFIX}*"):
                found += sorted((p for p in parent.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
                found.append(parent)
    for cgroup in found:
        with contextlib.suppress(OSError):
            cgroup.rmdir()


def remove_docker_leftovers() -> None:
    """After the hosts' namespaces are gone: the registries and the image builder (also those of a crashed run), the
    mounts they left, and the hosts' containers' empty cgroups."""
    _end_state_processes()
    _unmount_state()
    _remove_cgroups()
