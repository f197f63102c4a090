"""The pull cache with real Docker (issue 34): the product's pull-cache step (infra/scripts/pull_cache.sh) starts the
distribution registry in proxy mode in front of an upstream registry holding a small test image, four real dockerd
daemons pull the image through it at once with the product's pull-image step (pull_image.sh), and the upstream's
access log shows that the four pulls fetched no blob from it: every layer came from the upstream only during the
cache's fill, which the distribution registry 2.8 (Debian 12's, Ubuntu's) does with two GETs per blob (one streams
to the requester, one stores it in the background: registry/proxy/proxyblobstore.go ServeBlob at v2.8), however
many nodes then pull.

Self-contained: its own daemons (each with its own data root, exec root, socket and pidfile, and no bridge, iptables
or forwarding: see verified-facts#real-docker-here), its own loopback ports and a root under /var/tmp, all stopped and
removed at the end. Run it under the real-host tier's lock:
    flock /tmp/rce2e.lock .venv/bin/python -m pytest -q -p no:cacheprovider tests/e2e/test_pull_cache.py
It installs what it needs from Debian's packages when missing (docker.io, docker-registry, busybox-static).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_docker import Registry, apt_install, ensure_docker, free_loopback_port

from infra.node.remote import local_library, render_plain

DAEMONS = 4
IMAGE_PATH = "e2e/tiny:v1"
SECRET = "pull-cache-e2e-password-7f3a"  # stands in for the upstream's password: must reach the config file only
READY_TIMEOUT_S = 120


def _wait(what: str, check: object, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, f"{argv}: {result.stdout}{result.stderr}"
    return result  # type: ignore[no-any-return]


@dataclass
class Daemon:
    root: Path

    @property
    def host(self) -> str:
        return f"unix://{self.root}/docker.sock"

    def env(self) -> dict[str, str]:
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_CONFIG": str(self.root / "cli")}

    def start(self) -> subprocess.Popen[bytes]:
        self.root.mkdir(parents=True)
        log = open(self.root / "dockerd.log", "wb")  # noqa: SIM115 - kept open for the daemon's life
        return subprocess.Popen(
            ["dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none", "--ip-forward=false",
             "--ip-masq=false", "--data-root", str(self.root / "data"), "--exec-root", str(self.root / "exec"),
             "-H", self.host, "--pidfile", str(self.root / "docker.pid")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def answers(self) -> bool:
        return subprocess.run(["docker", "info"], env=self.env(), capture_output=True).returncode == 0

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        return _run(["docker", *args], env=self.env())


def _step(step: str, scripts: list[str], env: dict[str, str], extra: dict[str, str] | None = None,
          ) -> subprocess.CompletedProcess[str]:
    """A product step run here as pulumi-command runs it on a node: its rendered command over the staged library."""
    command = render_plain(step, scripts, env, library=local_library())
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(extra or {})})


def _blob_gets(registry: Registry) -> Counter[str]:
    return Counter(registry.blob_downloads())


@dataclass
class World:
    root: Path
    upstream: Registry
    cache_port: int
    daemons: list[Daemon]
    image: str  # the name the program uses: the upstream's reference
    layers: list[str]
    config_digest: str


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _install() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (dockerd)")
    ensure_docker()
    if shutil.which("curl") is None:
        apt_install("curl")
    if not Path("/bin/busybox").exists() and shutil.which("busybox") is None:
        apt_install("busybox-static")


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    _install()
    root = Path(tempfile.mkdtemp(prefix="roll-cluster-e2e-pull-cache-", dir="/var/tmp"))
    processes: list[subprocess.Popen[bytes]] = []
    cache_pid = root / "pull-cache" / "registry.pid"
    upstream_port, cache_port = free_loopback_port(), free_loopback_port()
    upstream = Registry("pull-cache-upstream", f"127.0.0.1:{upstream_port}", root / "upstream")
    try:
        daemons = [Daemon(root / f"node-{i}") for i in range(DAEMONS + 1)]  # the last one builds and pushes
        processes += [d.start() for d in daemons]
        upstream.start()
        for d in daemons:
            _wait(f"dockerd in {d.root}", d.answers)
        image = f"{upstream.address}/{IMAGE_PATH}"
        builder = daemons[-1]
        rootfs = root / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        busybox = shutil.which("busybox") or "/bin/busybox"
        shutil.copy(busybox, rootfs / "bin" / "busybox")
        for tool in ("sh", "cat", "true"):
            (rootfs / "bin" / tool).symlink_to("busybox")
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(["docker", "import", "-", "e2e-base:v1"], stdin=tar.stdout, env=builder.env(), check=True,
                       capture_output=True, timeout=300)
        tar.wait(timeout=60)
        context = root / "context"
        context.mkdir()
        (context / "marker.txt").write_text("pulled through the cache\n")
        (context / "Dockerfile").write_text("FROM e2e-base:v1\nCOPY marker.txt /marker.txt\n")
        builder.docker("build", "--network", "none", "-t", image, str(context))
        builder.docker("push", image)
        manifest = _run(["curl", "-fsS", "-H", "Accept: application/vnd.docker.distribution.manifest.v2+json",
                         f"{upstream.url}/v2/e2e/tiny/manifests/v1"]).stdout
        layers = re.findall(r'"digest":\s*"(sha256:[0-9a-f]{64})"', manifest)
        yield World(root, upstream, cache_port, daemons[:DAEMONS], image, layers[1:], layers[0])
    finally:
        if cache_pid.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(cache_pid.read_text().strip()), signal.SIGTERM)
        upstream.stop()
        shutil.rmtree(upstream.directory, ignore_errors=True)
        for process in reversed(processes):
            _stop(process)
        _unmount_under(root)
        shutil.rmtree(root)


def _unmount_under(root: Path) -> None:
    """What the daemons left mounted under root (dockerd keeps its exec root's netns/default mounted after it
    stops), deepest first."""
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(f"{root}/")), key=len, reverse=True):
        subprocess.run(["umount", mount], check=True, capture_output=True, timeout=60)


def _cache_env(w: World) -> dict[str, str]:
    return {
        "CACHE_UPSTREAM": w.upstream.url,
        "CACHE_REPOSITORY": IMAGE_PATH,
        "CACHE_LISTEN_ADDR": "127.0.0.1",
        "CACHE_PORT": str(w.cache_port),
        "CACHE_DIR": str(w.root / "pull-cache"),
        "REGISTRY_USERNAME": "e2e-user",
        "REGISTRY_PASSWORD": SECRET,
        "ROLL_CLUSTER_LOG_DIR": str(w.root / "cache-logs"),
        "NODE_NAME": "node-0",
        # No systemd on this machine: the step runs the cache as a detached process (its pid in CACHE_DIR).
        "SYSTEMD_RUN_DIR": str(w.root / "no-systemd"),
    }


def test_four_daemons_pull_through_the_cache_and_the_upstream_serves_each_layer_once(world: World) -> None:
    w = world
    assert len(w.layers) == 2, w.layers  # the imported root file system and the COPY
    before = _blob_gets(w.upstream)
    step = _step("pull-cache", ["pull_cache.sh"], _cache_env(w))
    assert step.returncode == 0, step.stdout + step.stderr
    assert "cache holds 3 blobs (3 fetched now" in step.stdout
    filled = _blob_gets(w.upstream) - before
    # The fill: each blob's two fetches by distribution 2.8's proxy (one to the requester, one stored), and no more.
    assert filled == Counter({digest: 2 for digest in (*w.layers, w.config_digest)}), filled

    def pull(daemon: Daemon) -> subprocess.CompletedProcess[str]:
        env = {"IMAGE": w.image, "PULL_CACHE": f"127.0.0.1:{w.cache_port}", "CACHE_REPOSITORY": IMAGE_PATH,
               "ROLL_CLUSTER_LOG_DIR": str(daemon.root / "logs"), "NODE_NAME": daemon.root.name,
               "CHECK_IMAGE_ARCH": "1"}
        return _step("pull-image", ["pull_image.sh"], env,
                     {"DOCKER_HOST": daemon.host, "DOCKER_CONFIG": str(daemon.root / "cli")})

    with concurrent.futures.ThreadPoolExecutor(max_workers=DAEMONS) as pool:
        results = list(pool.map(pull, w.daemons))
    for daemon, result in zip(w.daemons, results, strict=True):
        assert result.returncode == 0, f"{daemon.root.name}: {result.stdout}{result.stderr}"
        assert "through the pull cache" in result.stdout
        # Under the name the program uses, runnable, and without the cache's name.
        assert daemon.docker("run", "--rm", "--network", "host", w.image, "cat", "/marker.txt").stdout == (
            "pulled through the cache\n")
        tags = daemon.docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
        assert tags == [w.image], tags
    after = _blob_gets(w.upstream) - before
    # Every layer's blob (and the config's) came from the upstream once per cache, during its fill; the four pulls
    # fetched nothing more from it.
    assert after == filled, (after, filled)


def test_the_cache_step_again_changes_nothing_and_keeps_the_password_in_its_config_only(world: World) -> None:
    w = world
    pid = (w.root / "pull-cache" / "registry.pid").read_text().strip()
    step = _step("pull-cache", ["pull_cache.sh"], _cache_env(w))
    assert step.returncode == 0, step.stdout + step.stderr
    assert "already running" in step.stdout and "config unchanged" in step.stdout
    assert "cache holds 3 blobs (0 fetched now" in step.stdout  # a second run (a resumed cluster) fetches nothing
    assert (w.root / "pull-cache" / "registry.pid").read_text().strip() == pid
    config = w.root / "pull-cache" / "config.yml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert SECRET in config.read_text()
    assert SECRET not in step.stdout + step.stderr
    for log in (w.root / "cache-logs").iterdir():
        assert SECRET not in log.read_text(errors="replace"), log
    assert SECRET not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


def test_a_cache_that_cannot_fill_fails_the_step_by_name(world: World) -> None:
    w = world
    env = {**_cache_env(w), "CACHE_REPOSITORY": "e2e/missing:v1", "CACHE_DIR": str(w.root / "missing" / "pull-cache"),
           "CACHE_PORT": str(free_loopback_port()), "RETRY_ATTEMPTS": "1"}
    step = _step("pull-cache", ["pull_cache.sh"], env)
    try:
        assert step.returncode != 0
        assert "pull-cache: FAILED: filling the pull cache with e2e/missing:v1" in step.stderr
    finally:
        pid_file = w.root / "missing" / "pull-cache" / "registry.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)


def test_the_caches_teardown_stops_it_and_removes_its_data(world: World) -> None:
    # Last in this module: it removes the cache the tests above used (started here when run alone).
    w = world
    started = _step("pull-cache", ["pull_cache.sh"], _cache_env(w))
    assert started.returncode == 0, started.stdout + started.stderr
    pid = int((w.root / "pull-cache" / "registry.pid").read_text().strip())
    env = {"CACHE_DIR": str(w.root / "pull-cache"), "ROLL_CLUSTER_LOG_DIR": str(w.root / "cache-logs"),
           "NODE_NAME": "node-0",
           "SYSTEMD_RUN_DIR": str(w.root / "no-systemd")}
    step = _step("pull-cache-delete", ["pull_cache_stop.sh"], env)
    assert step.returncode == 0, step.stdout + step.stderr
    _wait("the cache's process to end", lambda: not Path(f"/proc/{pid}").exists() or
          "zombie" in Path(f"/proc/{pid}/status").read_text(errors="replace").lower(), timeout=30)
    assert not (w.root / "pull-cache").exists()
    again = _step("pull-cache-delete", ["pull_cache_stop.sh"], env)
    assert again.returncode == 0 and "nothing to remove" in again.stdout
