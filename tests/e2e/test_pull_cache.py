"""The pull cache on the real-host tier's own hosts (issue 34): the product's pull-cache step on the head starts a
plain distribution registry and fills it from an upstream registry that wants a password (Basic auth, htpasswd),
then the product's pull-image step on four hosts at once (the head and three workers, each with its own dockerd)
pulls the image through it. The upstream's access log shows every blob (each layer and the config) fetched exactly
once in the whole test, during the fill, and none during the four pulls; a second run of the step fetches nothing;
a fan-out cache on a fifth host fills from the head's cache, not from the upstream; and the password is on no
command line, in no process's environment after the step, in no log and in no file of the hosts.

The upstream (e2e_docker.Registry, on the tier's bridge beside its image registry) holds a small image of three
layers (busybox, a marker file, one more file) pushed over the registry HTTP API. The steps are rendered as the
program renders them (infra/node/remote.py) and sent as pulumi-command sends them: the step's text, with the
secret, on the SSH session's stdin. The two hosts beyond the tier's three are started for this module and removed
after it, with everything the steps started.
"""

from __future__ import annotations

import base64
import concurrent.futures
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_docker import REGISTRIES_DIR, Registry, apt_install
from e2e_harness import BRIDGE_IP, CommandResult, TestHost, TestNetwork
from e2e_steps import hosts_library
from program_commands import StepCommand

from infra import pull_cache
from infra.node.remote import render_plain, stdin_command

pytestmark = pytest.mark.e2e

UPSTREAM_ADDRESS = f"{BRIDGE_IP}:5002"  # beside the tier's image registry (5000) and test_pull_progress's gate (5001)
REPOSITORY, TAG = "e2e/tiny", "v1"
IMAGE = f"{UPSTREAM_ADDRESS}/{REPOSITORY}:{TAG}"  # the name the program uses for the image
USER = "e2e-puller"
SECRET = "pull-cache-e2e-password-7f3a"  # the upstream's password: it reaches the fill's environment only
# SECRET's bcrypt hash (cost 4), made with Python's crypt module: `crypt.crypt(SECRET, crypt.mksalt(METHOD_BLOWFISH,
# rounds=16))`; the test checks that the upstream refuses a wrong password and takes this one.
SECRET_BCRYPT = "$2b$04$PYuC72EcplfwhatPyztY2ewgGHqMuqSWkhhos3rhVfpjMHG9h0HAO"
CACHE_DIR = pull_cache.cache_dir("/data")  # a node's data disk: the host's own /data
MARKER = "pulled through the cache\n"
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)


def _tar_gz(files: dict[str, bytes], links: dict[str, str] | None = None) -> tuple[bytes, str]:
    """A layer: (its gzipped tar, the digest of the tar itself, the image config's diff_id)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return gzip.compress(raw.getvalue(), mtime=0), "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _push(upstream: Registry, password: str) -> tuple[list[str], str]:
    """The test image pushed over the registry HTTP API (a POST and a monolithic PUT per blob, then the manifest):
    (the blobs' digests, config first; the manifest's digest)."""
    busybox = Path(shutil.which("busybox") or "/bin/busybox").read_bytes()
    layers = [_tar_gz({"bin/busybox": busybox}, {"bin/sh": "busybox", "bin/cat": "busybox"}),
              _tar_gz({"marker.txt": MARKER.encode()}),
              _tar_gz({"etc/e2e-layer": b"three\n"})]
    config = json.dumps({"architecture": ARCH, "os": "linux", "config": {"Cmd": ["sh"]},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id for _, diff_id in layers]}}).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    auth = "Basic " + base64.b64encode(f"{USER}:{password}".encode()).decode()

    def call(method: str, url: str, body: bytes = b"", content_type: str = "application/octet-stream") -> str:
        request = urllib.request.Request(url, data=body, method=method,
                                         headers={"Authorization": auth, "Content-Type": content_type})
        with opener.open(request, timeout=60) as response:
            return str(response.headers.get("Location", ""))

    for blob in (config, *(layer for layer, _ in layers)):
        location = call("POST", f"{upstream.url}/v2/{REPOSITORY}/blobs/uploads/")
        location = location if location.startswith("http") else upstream.url + location
        call("PUT", f"{location}{'&' if '?' in location else '?'}digest={_digest(blob)}", blob)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                   "digest": _digest(config)},
        "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(layer),
                    "digest": _digest(layer)} for layer, _ in layers],
    }).encode()
    call("PUT", f"{upstream.url}/v2/{REPOSITORY}/manifests/{TAG}", manifest,
         "application/vnd.docker.distribution.manifest.v2+json")
    return [_digest(config), *(_digest(layer) for layer, _ in layers)], _digest(manifest)


def _refuses(upstream: Registry, password: str) -> bool:
    request = urllib.request.Request(f"{upstream.url}/v2/", headers={
        "Authorization": "Basic " + base64.b64encode(f"{USER}:{password}".encode()).decode()})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10):
            return False
    except urllib.error.HTTPError as error:
        return error.code == 401


@dataclass
class World:
    network: TestNetwork
    upstream: Registry
    head: TestHost
    workers: list[TestHost]  # the head pulls too: these are the other three
    fan_out: TestHost
    blobs: list[str]  # config, then the three layers


def _step(step: str, scripts: list[str], host: TestHost, env: dict[str, str]) -> StepCommand:
    """A product step as the program sends it: a constant command, its text (exports, secrets too) on stdin."""
    text = render_plain(step, scripts, {**env, "NODE_NAME": host.name}, library=hosts_library())
    return StepCommand(stdin_command(step), text)


def _cache_env(host: TestHost, upstream: str, credentials: bool) -> dict[str, str]:
    """What components/bootstrap.py gives a node's pull-cache step (the head's: the registry's credentials)."""
    env = {"CACHE_UPSTREAM": upstream, "CACHE_REPOSITORY": f"{REPOSITORY}:{TAG}", "CACHE_LISTEN_ADDR": host.ip,
           "CACHE_PORT": str(pull_cache.PORT), "CACHE_DIR": CACHE_DIR}
    if credentials:
        env |= {"REGISTRY_USERNAME": USER, "REGISTRY_PASSWORD": SECRET}
    return env


def _run(network: TestNetwork, host: TestHost, command: StepCommand | str, timeout: float = 300) -> CommandResult:
    return network.start_command(host, command).wait(timeout)


def _pull(network: TestNetwork, host: TestHost, cache: TestHost) -> CommandResult:
    env = {"IMAGE": IMAGE, "REGISTRY_USERNAME": "", "REGISTRY_PASSWORD": "", "CHECK_IMAGE_ARCH": "1",
           "PULL_CACHE": f"{cache.ip}:{pull_cache.PORT}", "CACHE_REPOSITORY": f"{REPOSITORY}:{TAG}"}
    return _run(network, host, _step("pull-image", ["pull_image.sh"], host, env))


def _stop_cache(network: TestNetwork, host: TestHost, cache_dir: str = CACHE_DIR) -> CommandResult:
    return _run(network, host, _step("pull-cache-delete", ["pull_cache_stop.sh"], host, {"CACHE_DIR": cache_dir}))


def _blob_gets(upstream: Registry) -> Counter[str]:
    return Counter(upstream.blob_downloads())


class SecretWatch:
    """Every process's command line on the test machine (the hosts' too: their PID namespaces lie below this one),
    read every 50 ms while it runs: `seen` lists those that held the secret."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> SecretWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _watch(self) -> None:
        while not self._stop.is_set():
            self.seen += _processes_holding(SECRET, "cmdline")
            time.sleep(0.05)


def _processes_holding(secret: str, what: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if secret.encode() in (entry / what).read_bytes():
                    found.append(f"{entry.name}: {(entry / 'cmdline').read_bytes()!r}")
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def world(network: TestNetwork) -> Iterator[World]:
    if shutil.which("busybox") is None and not Path("/bin/busybox").exists():
        apt_install("busybox-static")
    added = network.add_hosts(2)
    storage = REGISTRIES_DIR / "pull-cache-upstream-storage"
    htpasswd = REGISTRIES_DIR / "pull-cache-upstream.htpasswd"
    REGISTRIES_DIR.mkdir(parents=True, exist_ok=True)
    htpasswd.write_text(f"{USER}:{SECRET_BCRYPT}\n")
    upstream = Registry("pull-cache-upstream", UPSTREAM_ADDRESS, storage, htpasswd=htpasswd)
    head, fan_out = network.hosts[0], added[1]
    used = [head, fan_out, added[0]]
    try:
        upstream.start()
        assert _refuses(upstream, "wrong-" + SECRET) and not _refuses(upstream, SECRET)
        blobs, _ = _push(upstream, SECRET)
        yield World(network, upstream, head, [*network.hosts[1:3], added[0]], fan_out, blobs)
    finally:
        for host in used:
            _stop_cache(network, host)
        _stop_cache(network, added[0], "/data/missing/pull-cache")
        for host in network.hosts:
            network.run(host, f"docker image rm -f -- {IMAGE} >/dev/null 2>&1 || :", timeout=60)
        network.remove_hosts(added)
        upstream.stop()
        shutil.rmtree(upstream.directory, ignore_errors=True)
        shutil.rmtree(storage, ignore_errors=True)
        htpasswd.unlink(missing_ok=True)


def test_four_hosts_pull_through_the_cache_and_the_upstream_serves_each_blob_once(world: World) -> None:
    w = world
    assert len(w.blobs) == 4 and _blob_gets(w.upstream) == Counter()  # the config and three layers; none fetched yet
    with SecretWatch() as watch:
        step = _run(w.network, w.head, _step("pull-cache", ["pull_cache.sh"], w.head,
                                             _cache_env(w.head, w.upstream.url, credentials=True)))
    assert step.returncode == 0, step.output
    assert "cache holds 4 blobs (4 fetched now" in step.stdout, step.stdout
    assert watch.seen == []  # no command line held the password while the step ran
    filled = _blob_gets(w.upstream)
    assert filled == Counter({digest: 1 for digest in w.blobs}), filled
    assert {r.client for r in w.upstream.requests() if r.method == "GET" and "/blobs/" in r.path} == {w.head.ip}

    hosts = [w.head, *w.workers]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        results = list(pool.map(lambda host: _pull(w.network, host, w.head), hosts))
    for host, result in zip(hosts, results, strict=True):
        assert result.returncode == 0, f"{host.name}: {result.output}"
        assert "through the pull cache" in result.stdout
    for host in hosts:
        # Under the name the program uses, runnable, and without the cache's name.
        ran = w.network.run(host, f"docker run --rm --network host {IMAGE} cat /marker.txt", timeout=120).check()
        assert ran.stdout == MARKER
        names = w.network.run(host, "docker image ls --format '{{.Repository}}:{{.Tag}}'", timeout=60).check()
        assert IMAGE in names.stdout.split() and f"{w.head.ip}:{pull_cache.PORT}/" not in names.stdout, names.stdout
    # The four pulls fetched nothing from the upstream: each blob came from it once, during the fill.
    assert _blob_gets(w.upstream) == filled


def test_the_cache_step_again_fetches_nothing_and_the_password_is_nowhere(world: World) -> None:
    w = world
    before = _blob_gets(w.upstream)
    pid_file = w.head.root / "data" / "pull-cache" / "registry.pid"
    pid = pid_file.read_text().strip()
    step = _run(w.network, w.head, _step("pull-cache", ["pull_cache.sh"], w.head,
                                         _cache_env(w.head, w.upstream.url, credentials=True)))
    assert step.returncode == 0, step.output
    assert "already running" in step.stdout and "config unchanged" in step.stdout
    assert "cache holds 4 blobs (0 fetched now" in step.stdout  # a resumed cluster: no blob fetched
    assert _blob_gets(w.upstream) == before and pid_file.read_text().strip() == pid
    assert SECRET not in step.output
    # The cache holds no secret: its config (no proxy section, no credentials), its log, its process.
    config = (w.head.root / "data" / "pull-cache" / "config.yml").read_text()
    assert "proxy" not in config and USER not in config
    assert _processes_holding(SECRET, "cmdline") == [] and _processes_holding(SECRET, "environ") == []
    # No file of the head's, its step logs and /etc and /var/lib included (read on the host: its own mounts).
    search = StepCommand("grep -rlsF -f - /etc /var/lib/roll-cluster /var/log /tmp /data /run || :",
                         stdin=SECRET + "\n")
    found = _run(w.network, w.head, search)
    assert found.returncode == 0 and found.stdout == "", found.output
    # Nor what the tier keeps of the head on the test machine (its init's and sshd's logs), its image store aside.
    for directory, subdirectories, files in os.walk(w.head.root):
        subdirectories[:] = [d for d in subdirectories if d != "docker-data"]
        for name in files:
            path = Path(directory) / name
            try:
                content = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            except OSError:  # gone while the walk ran (a Ray session's socket, a temporary file)
                continue
            assert SECRET.encode() not in content, path


def test_a_fan_out_cache_fills_from_the_heads_cache_and_serves_its_node(world: World) -> None:
    w = world
    before = _blob_gets(w.upstream)
    head_cache = f"http://{w.head.ip}:{pull_cache.PORT}"
    step = _run(w.network, w.fan_out, _step("pull-cache", ["pull_cache.sh"], w.fan_out,
                                            _cache_env(w.fan_out, head_cache, credentials=False)))
    assert step.returncode == 0, step.output
    assert "cache holds 4 blobs (4 fetched now" in step.stdout
    pulled = _pull(w.network, w.fan_out, w.fan_out)
    assert pulled.returncode == 0, pulled.output
    assert _blob_gets(w.upstream) == before  # from the head's cache, never the upstream


def test_a_cache_that_cannot_fill_fails_the_step_with_its_reason(world: World) -> None:
    w = world
    host = w.workers[-1]
    env = {**_cache_env(host, w.upstream.url, credentials=True), "CACHE_REPOSITORY": "e2e/missing:v1",
           "CACHE_DIR": "/data/missing/pull-cache", "CACHE_PORT": "5003"}
    step = _run(w.network, host, _step("pull-cache", ["pull_cache.sh"], host, env))
    assert step.returncode != 0
    assert (f"pull-cache: FAILED: filling the pull cache with e2e/missing:v1 from {w.upstream.url} failed: GET "
            f"{w.upstream.url}/v2/e2e/missing/manifests/v1: HTTP 404") in step.stderr, step.output
    assert "Traceback" not in step.output and SECRET not in step.output


def test_the_caches_teardown_stops_it_and_removes_its_data(world: World) -> None:
    # Last in this module: it removes the caches the tests above used.
    w = world
    for host in (w.head, w.fan_out):
        pid = (host.root / "data" / "pull-cache" / "registry.pid").read_text().strip()  # in the host's PID namespace
        stopped = _stop_cache(w.network, host)
        assert stopped.returncode == 0, stopped.output
        assert not (host.root / "data" / "pull-cache").exists()
        deadline = time.monotonic() + 30
        while w.network.run(host, f"ps -o stat= -p {pid} | grep -qv '^Z'", timeout=30).returncode == 0:
            assert time.monotonic() < deadline, f"the cache's process {pid} on {host.name} still runs"
            time.sleep(0.2)
        again = _stop_cache(w.network, host)
        assert again.returncode == 0 and "nothing to remove" in again.stdout
