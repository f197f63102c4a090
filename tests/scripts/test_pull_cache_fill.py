"""The pull cache's fill (infra/scripts/pull_cache_fill.py), run as the pull-cache step runs it, against two small
registries in this process: an upstream (anonymous, Basic or Bearer-token authorization, an image or a
multi-platform index, blobs that fail once or lie about their digest) and a cache that takes uploads as the
distribution registry does (a POST, then the whole blob in a PUT ?digest=, checked against the digest)."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

HELPER = Path(__file__).resolve().parents[2] / "infra" / "scripts" / "pull_cache_fill.py"
REPOSITORY = "team/trainer"
USER, PASSWORD = "robot", "fill-secret-5c1e"
TOKEN = "token-for-team-trainer"
MANIFEST_V2 = "application/vnd.docker.distribution.manifest.v2+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry(ThreadingHTTPServer):
    """A registry of one repository. `auth`: "none", "basic" or "bearer" (a token from /token for the repository's
    pull scope, granted for USER/PASSWORD). Counts the blob GETs it answered with content (`served`)."""

    daemon_threads = True

    def __init__(self, auth: str = "none") -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.auth = auth
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[bytes, str]] = {}
        self.uploads: dict[str, bool] = {}
        self.served: Counter[str] = Counter()
        self.unavailable: Counter[str] = Counter()  # blob digest -> how many GETs answer 503 first
        self.lying: dict[str, bytes] = {}  # blob digest -> the content sent instead
        self.token_requests: list[dict[str, list[str]]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add_image(self, tag: str, layers: list[bytes], arch: str = "amd64") -> tuple[bytes, list[str]]:
        config = json.dumps({"architecture": arch, "os": "linux", "layers": len(layers)}).encode()
        for blob in (config, *layers):
            self.blobs[digest_of(blob)] = blob
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST_V2,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                       "digest": digest_of(config)},
            "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(layer),
                        "digest": digest_of(layer)} for layer in layers],
        }, indent=3).encode()  # not the canonical form: the cache must get these bytes exactly
        self.manifests[tag] = self.manifests[digest_of(manifest)] = (manifest, MANIFEST_V2)
        return manifest, [digest_of(config), *map(digest_of, layers)]

    def add_index(self, tag: str, platforms: dict[str, bytes]) -> None:
        index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"mediaType": MANIFEST_V2, "size": len(manifest), "digest": digest_of(manifest),
             "platform": {"os": "linux", "architecture": arch}} for arch, manifest in platforms.items()]}).encode()
        self.manifests[tag] = (index, OCI_INDEX)


class Handler(BaseHTTPRequestHandler):
    server: Registry
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorized(self) -> bool:
        given = self.headers.get("Authorization", "")
        basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if self.server.auth == "basic" and given != basic:
            self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": 'Basic realm="test"'})
            return False
        if self.server.auth == "bearer" and given != f"Bearer {TOKEN}":
            challenge = f'Bearer realm="{self.server.url}/token",service="test-registry"'
            self._send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}', {"WWW-Authenticate": challenge})
            return False
        return True

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/token":
            query = parse_qs(url.query)
            self.server.token_requests.append(query)
            basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
            granted = (self.headers.get("Authorization") == basic and query.get("scope") ==
                       [f"repository:{REPOSITORY}:pull"] and query.get("service") == ["test-registry"])
            self._send(200 if granted else 401, json.dumps({"token": TOKEN} if granted else {}).encode())
            return
        if not self._authorized():
            return
        prefix = f"/v2/{REPOSITORY}/"
        if url.path.startswith(prefix + "manifests/"):
            found = self.server.manifests.get(url.path.rsplit("/", 1)[1])
            if found is None:
                self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')
            else:
                self._send(200, found[0], {"Content-Type": found[1], "Docker-Content-Digest": digest_of(found[0])})
        elif url.path.startswith(prefix + "blobs/"):
            digest = url.path.rsplit("/", 1)[1]
            with self.server.lock:
                failing = self.command == "GET" and self.server.unavailable[digest] > 0
                if failing:
                    self.server.unavailable[digest] -= 1
            if failing:
                self._send(503, b"busy")
            elif digest not in self.server.blobs:
                self._send(404)
            else:
                if self.command == "GET":
                    with self.server.lock:
                        self.server.served[digest] += 1
                self._send(200, self.server.lying.get(digest, self.server.blobs[digest]))
        else:
            self._send(200 if url.path == "/v2/" else 404, b"{}")

    def do_POST(self) -> None:
        if urlsplit(self.path).path != f"/v2/{REPOSITORY}/blobs/uploads/":
            self._send(404)
            return
        upload = uuid.uuid4().hex
        self.server.uploads[upload] = True
        self._send(202, headers={"Location": f"{self.server.url}/v2/{REPOSITORY}/blobs/uploads/{upload}?_state=s1"})

    def do_PUT(self) -> None:
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if url.path.startswith(f"/v2/{REPOSITORY}/manifests/"):
            self.server.manifests[url.path.rsplit("/", 1)[1]] = (body, self.headers.get("Content-Type", ""))
            self._send(201)
            return
        query = parse_qs(url.query)
        upload = url.path.rsplit("/", 1)[1]
        if not self.server.uploads.pop(upload, False) or query.get("_state") != ["s1"]:
            self._send(404, b'{"errors":[{"code":"BLOB_UPLOAD_UNKNOWN"}]}')
        elif digest_of(body) != query["digest"][0]:
            self._send(400, b'{"errors":[{"code":"DIGEST_INVALID"}]}')
        else:
            self.server.blobs[digest_of(body)] = body
            self._send(201)


@contextlib.contextmanager
def serving(auth: str) -> Iterator[Registry]:
    yield from serve(Registry(auth))


def serve(server: Registry) -> Iterator[Registry]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def cache() -> Iterator[Registry]:
    yield from serve(Registry())


@pytest.fixture(params=["none", "basic", "bearer"])
def upstream(request: pytest.FixtureRequest) -> Iterator[Registry]:
    yield from serve(Registry(request.param))


def fill(upstream: Registry, cache: Registry, tag: str = "v1", **extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CACHE_UPSTREAM": upstream.url,
           "CACHE_REPOSITORY": f"{REPOSITORY}:{tag}", "CACHE_URL": cache.url, "CACHE_ARCH": "amd64",
           "CACHE_FILL_RETRY_DELAY_S": "0", "CACHE_FILL_STALL_S": "10"}
    if upstream.auth != "none":
        env |= {"REGISTRY_USERNAME": USER, "REGISTRY_PASSWORD": PASSWORD}
    env |= extra
    result = subprocess.run([sys.executable, str(HELPER)], capture_output=True, text=True, env=env, timeout=60)
    assert PASSWORD not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


LAYERS = [b"layer-one" * 1000, b"layer-two" * 300_000, b"layer-three"]


def test_every_blob_is_fetched_once_and_the_manifest_lands_under_the_tag_with_its_exact_bytes(
        upstream: Registry, cache: Registry) -> None:
    manifest, digests = upstream.add_image("v1", LAYERS)
    result = fill(upstream, cache)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("cache holds 4 blobs (4 fetched now, 0.00 GB)")
    assert upstream.served == Counter({digest: 1 for digest in digests})
    assert {d: cache.blobs[d] for d in digests} == {d: upstream.blobs[d] for d in digests}
    assert cache.manifests["v1"] == (manifest, MANIFEST_V2)
    if upstream.auth == "bearer":
        # A token for the repository's pull scope, asked for with the credentials.
        assert upstream.token_requests and all(q["scope"] == [f"repository:{REPOSITORY}:pull"]
                                               for q in upstream.token_requests)


def test_a_second_fill_fetches_nothing_and_a_new_tag_copies_only_its_new_blobs(cache: Registry) -> None:
    with serving("bearer") as upstream:
        upstream.add_image("v1", LAYERS)
        assert fill(upstream, cache).returncode == 0
        again = fill(upstream, cache)
        assert again.returncode == 0 and "cache holds 4 blobs (0 fetched now" in again.stdout
        first = Counter(upstream.served)
        _, digests = upstream.add_image("v2", [*LAYERS, b"one more layer"])
        newer = fill(upstream, cache, "v2")
        assert newer.returncode == 0 and "cache holds 5 blobs (2 fetched now" in newer.stdout  # the config, the layer
        assert upstream.served - first == Counter({digests[0]: 1, digests[-1]: 1})
        assert first == Counter({digest: 1 for digest in first})


def test_an_index_fills_the_cache_with_this_platforms_manifest(cache: Registry) -> None:
    with serving("none") as upstream:
        amd64, amd64_blobs = upstream.add_image("amd64-only", [b"x86 layer"], "amd64")
        arm64, arm64_blobs = upstream.add_image("arm64-only", [b"arm layer"], "arm64")
        upstream.add_index("multi", {"amd64": amd64, "arm64": arm64})
        result = fill(upstream, cache, "multi", CACHE_ARCH="arm64")
        assert result.returncode == 0, result.stderr
        assert cache.manifests["multi"] == (arm64, MANIFEST_V2)
        assert set(upstream.served) == set(arm64_blobs) and not set(amd64_blobs) & set(cache.blobs)
        missing = fill(upstream, cache, "multi", CACHE_ARCH="riscv64")
        assert missing.returncode == 1
        assert missing.stderr.strip() == f"pull-cache fill: no linux/riscv64 manifest in {REPOSITORY}:multi"


def test_a_blob_whose_content_does_not_match_its_digest_fails_the_fill_naming_it(cache: Registry) -> None:
    with serving("none") as upstream:
        _, digests = upstream.add_image("v1", LAYERS)
        upstream.lying[digests[2]] = b"X" * len(LAYERS[1])
        result = fill(upstream, cache)
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"pull-cache fill: blob {digests[2]}: the upstream sent "
                                                       "content whose digest is sha256:"), result.stderr
        assert digests[2] not in cache.blobs and "v1" not in cache.manifests


def test_a_busy_upstream_is_asked_again_and_the_fill_succeeds(cache: Registry) -> None:
    with serving("bearer") as upstream:
        _, digests = upstream.add_image("v1", LAYERS)
        upstream.unavailable[digests[1]] = 2
        result = fill(upstream, cache)
        assert result.returncode == 0, result.stderr
        assert "HTTP 503; attempt 2 of 5" in result.stderr
        assert upstream.served == Counter({digest: 1 for digest in digests})
        assert upstream.unavailable[digests[1]] == 0


def test_a_bounded_number_of_attempts_then_one_line_naming_what_failed(cache: Registry) -> None:
    with serving("none") as upstream:
        _, digests = upstream.add_image("v1", LAYERS)
        upstream.unavailable[digests[0]] = 100
        result = fill(upstream, cache, CACHE_FILL_ATTEMPTS="3")
        assert result.returncode == 1
        assert result.stderr.strip().splitlines()[-1].startswith("pull-cache fill: ")
        assert f"blobs/{digests[0]}: HTTP 503 (3 attempts)" in result.stderr
        assert 100 - upstream.unavailable[digests[0]] <= 9  # bounded: at most attempts x attempts GETs


@pytest.mark.parametrize("auth", ["basic", "bearer"])
def test_refused_credentials_fail_with_one_line_that_holds_no_secret(cache: Registry, auth: str) -> None:
    with serving(auth) as upstream:
        upstream.add_image("v1", LAYERS)
        env = {"REGISTRY_USERNAME": USER, "REGISTRY_PASSWORD": "wrong-" + PASSWORD}
        result = fill(upstream, cache, **env)
        assert result.returncode == 1 and not upstream.served
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert env["REGISTRY_PASSWORD"] not in result.stdout + result.stderr
        anonymous = fill(upstream, cache, REGISTRY_USERNAME="", REGISTRY_PASSWORD="")
        assert anonymous.returncode == 1 and not upstream.served


def test_the_caches_registry_config_is_plain_and_holds_no_secret_whatever_the_environment() -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "CACHE_DIR": "/data/pull-cache",
           "CACHE_LISTEN_ADDR": "10.20.0.1", "CACHE_PORT": "5000", "CACHE_UPSTREAM": "https://registry.example.com",
           "REGISTRY_USERNAME": USER, "REGISTRY_PASSWORD": PASSWORD}
    config = subprocess.run([sys.executable, str(HELPER.with_name("pull_cache_config.py"))], capture_output=True,
                            text=True, env=env, timeout=60, check=True).stdout
    assert PASSWORD not in config and USER not in config and "proxy" not in config
    assert 'addr: "10.20.0.1:5000"' in config and 'rootdirectory: "/data/pull-cache/registry"' in config
    assert "delete:\n    enabled: false" in config
