"""The plan reads the training image's compressed size from its registry's manifest (issue 21, item 1): against a
stand-in registry on 127.0.0.1 (OCI distribution API with Docker's anonymous token flow), and every way it falls
back to the estimate with its reason."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from devtools import plan, registry
from infra import image_manifest
from infra.image_manifest import ManifestError, parse_reference

REPO = "roll/pytorch"
TAG = "nvcr-24.05-py3-torch260-vllm084"  # a tag the ROLL adapter knows (its requirements file)
ESTIMATE_GB = 25  # KNOWN_IMAGE_SIZES_GB's figure for ROLL's images
AMD64_LAYERS = [6_000_000_000, 5_000_000_000, 3_200_000_000]  # + a 10 kB config: 14.20001 GB
ARM64_LAYERS = [20_000_000_000, 20_000_000_000]


def manifest(layers: list[int]) -> bytes:
    return json.dumps({
        "schemaVersion": 2,
        "mediaType": image_manifest.OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 10_000,
                   "digest": "sha256:" + "c" * 64},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": size,
                    "digest": "sha256:" + f"{i:x}" * 64} for i, size in enumerate(layers, 1)],
    }).encode()


def digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


AMD64, ARM64 = manifest(AMD64_LAYERS), manifest(ARM64_LAYERS)


def index(entries: list[tuple[str, str, bytes]]) -> bytes:
    return json.dumps({
        "schemaVersion": 2,
        "mediaType": image_manifest.OCI_INDEX,
        "manifests": [{"mediaType": image_manifest.OCI_MANIFEST, "digest": digest(body), "size": len(body),
                       "platform": {"os": os_, "architecture": arch}} for os_, arch, body in entries],
    }).encode()


# arm64 first: the plan must pick by platform, not by position; an attestation entry (unknown/unknown) as BuildKit
# writes one.
INDEX = index([("linux", "arm64", ARM64), ("unknown", "unknown", b"{}"), ("linux", "amd64", AMD64)])


@dataclass
class Registry:
    """A stand-in registry: `routes` maps a path to (status, headers, body); the token flow when `token` is set."""

    port: int = 0
    routes: dict[str, tuple[int, dict[str, str], bytes]] = field(default_factory=dict)
    token: str | None = None
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    hold: threading.Event | None = None  # set: every answer waits for it (a registry that does not answer)
    token_status: int = 200  # 401: the token service gives no anonymous token (a private repository)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def image(self, tag: str = TAG) -> str:
        return f"{self.host}/{REPO}:{tag}"

    def serve(self, path: str, body: bytes, status: int = 200, content_type: str = "") -> None:
        self.routes[path] = (status, {"Content-Type": content_type} if content_type else {}, body)

    def answer(self, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        self.requests.append((path, headers))
        if self.hold is not None:
            self.hold.wait(30)
        if path.startswith("/token?"):
            if self.token is None or self.token_status != 200:
                return self.token_status if self.token else 404, {}, b""
            return 200, {"Content-Type": "application/json"}, json.dumps({"token": self.token}).encode()
        if self.token is not None and headers.get("Authorization") != f"Bearer {self.token}":
            realm = f"http://{self.host}/token"
            challenge = f'Bearer realm="{realm}",service="standin",scope="repository:{REPO}:pull"'
            return 401, {"WWW-Authenticate": challenge}, b'{"errors":[{"code":"UNAUTHORIZED"}]}'
        return self.routes.get(path, (404, {}, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}'))


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Registry]:
    state = Registry()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, headers, body = state.answer(self.path, dict(self.headers.items()))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            # The plan stops reading an answer over its cap, as it should.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    # The plan asks (conftest turns the look-up off for every other test), over HTTP to this stand-in only.
    monkeypatch.delenv(registry.DISABLE_ENV, raising=False)
    monkeypatch.setattr(registry, "SCHEME", "http")
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    yield state
    if state.hold is not None:
        state.hold.set()
    server.shutdown()
    server.server_close()


def plan_text(capsys: pytest.CaptureFixture[str], image: str, *args: str, container: dict[str, Any] | None = None,
              ) -> str:
    value = json.dumps({"image": image, **(container or {})})
    assert plan.main(["--full", "multi", "--config", f"roll-cluster:container={value}", *args]) == 0
    return capsys.readouterr().out


def size_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("  size     "))


def time_section(text: str) -> str:
    """The modelled minutes: the table and critical paths, and the cost section's bootstrap line."""
    start = text.index("== Time to the first training step")
    bootstrap = next(line for line in text.splitlines() if line.startswith("  bootstrap "))
    return text[start:text.index("  With a baked image")] + bootstrap


def test_plan_uses_the_amd64_manifests_layers_after_an_anonymous_token(standin, capsys):
    standin.token = "anon-token-1"
    standin.serve(f"/v2/{REPO}/manifests/{TAG}", INDEX)
    standin.serve(f"/v2/{REPO}/manifests/{digest(AMD64)}", AMD64)
    standin.serve(f"/v2/{REPO}/manifests/{digest(ARM64)}", ARM64)
    text = plan_text(capsys, standin.image())
    assert size_line(text) == "  size     14.2 GB compressed (registry manifest, linux/amd64, 3 layers)"
    assert "  path     14.2 GB from " in text
    # The anonymous token flow: 401, the realm asked with the service and a pull scope (no credentials), then the
    # index and the amd64 manifest (never the arm64 one) with the token.
    paths = [path for path, _ in standin.requests]
    assert paths[1] == f"/token?scope=repository%3A{REPO.replace('/', '%2F')}%3Apull&service=standin"
    assert "Authorization" not in standin.requests[0][1] and "Authorization" not in standin.requests[1][1]
    assert paths[2:] == [f"/v2/{REPO}/manifests/{TAG}", f"/v2/{REPO}/manifests/{digest(AMD64)}"]
    assert all(headers["Authorization"] == "Bearer anon-token-1" for _, headers in standin.requests[2:])
    assert image_manifest.OCI_INDEX in standin.requests[0][1]["Accept"]
    # The modelled minutes are those of a 14.20001 GB image, not of the 25 GB estimate.
    exact = plan_text(capsys, standin.image(), "--no-registry",
                      container={"imageSizeGb": sum(AMD64_LAYERS, 10_000) / 1e9})
    estimate = plan_text(capsys, standin.image(), "--no-registry")
    assert time_section(text) == time_section(exact)
    assert time_section(text) != time_section(estimate)


def test_a_missing_manifest_falls_back_to_the_estimate_with_the_reason(standin, capsys):
    text = plan_text(capsys, standin.image())
    assert size_line(text) == (f"  size     {ESTIMATE_GB} GB (estimate: {standin.host} has no manifest {REPO}:{TAG} "
                               "(HTTP 404); set container.imageSizeGb)")
    assert time_section(text) == time_section(plan_text(capsys, standin.image(), "--no-registry"))


@pytest.mark.parametrize("bound", ["REQUEST_TIMEOUT_S", "TOTAL_TIMEOUT_S"])
def test_a_registry_that_does_not_answer_is_waited_for_a_bounded_time(standin, capsys, monkeypatch, bound):
    standin.hold = threading.Event()  # never set while the plan runs: only the plan's bound ends its wait
    monkeypatch.setattr(registry, "REQUEST_TIMEOUT_S", 60.0)
    monkeypatch.setattr(registry, "TOTAL_TIMEOUT_S", 60.0)
    monkeypatch.setattr(registry, bound, 0.3)
    text = plan_text(capsys, standin.image())
    assert size_line(text) == (f"  size     {ESTIMATE_GB} GB (estimate: no answer from the registry within 0.3 s; "
                               "set container.imageSizeGb)")
    assert standin.requests  # it was asked


BAD_ANSWERS: dict[str, tuple[Callable[[Registry], None], str]] = {
    "huge": (lambda r: r.serve(f"/v2/{REPO}/manifests/{TAG}", b" " * (5 * 2**20)),
             "the registry's answer is larger than 4 MB"),
    "not JSON": (lambda r: r.serve(f"/v2/{REPO}/manifests/{TAG}", b'{"layers": [1, 2'), "the manifest is not JSON"),
    "a size that is a string": (
        lambda r: r.serve(f"/v2/{REPO}/manifests/{TAG}", AMD64.replace(b'"size": 6000000000', b'"size": "6e9"')),
        "a descriptor of the manifest has no size in bytes"),
    "an absurd size": (
        lambda r: r.serve(f"/v2/{REPO}/manifests/{TAG}", AMD64.replace(b"6000000000", b"6000000000000000")),
        "the manifest's sizes add up to more than 1000 GB"),
    "no amd64": (lambda r: (r.serve(f"/v2/{REPO}/manifests/{TAG}", index([("linux", "arm64", ARM64)])),
                            r.serve(f"/v2/{REPO}/manifests/{digest(ARM64)}", ARM64)),
                 "the index has no linux/amd64 manifest"),
    "a manifest that is not the digest's": (
        lambda r: (r.serve(f"/v2/{REPO}/manifests/{TAG}", INDEX),
                   r.serve(f"/v2/{REPO}/manifests/{digest(AMD64)}", ARM64)),
        "the manifest's content does not match its digest"),
}


@pytest.mark.parametrize("case", list(BAD_ANSWERS))
def test_a_huge_or_malformed_answer_falls_back_to_the_estimate(standin, capsys, case):
    setup, reason = BAD_ANSWERS[case]
    setup(standin)
    text = plan_text(capsys, standin.image())
    assert size_line(text) == f"  size     {ESTIMATE_GB} GB (estimate: {reason}; set container.imageSizeGb)"


def test_a_private_image_falls_back_and_says_no_credentials_are_sent(standin, capsys):
    standin.token, standin.token_status = "never-given", 401
    standin.serve(f"/v2/{REPO}/manifests/{TAG}", AMD64)
    text = plan_text(capsys, standin.image())
    assert size_line(text) == (f"  size     {ESTIMATE_GB} GB (estimate: {standin.host} refuses an anonymous pull of "
                               f"{REPO} (a private image? the plan sends no credentials); set container.imageSizeGb)")
    standin.token = None
    standin.routes[f"/v2/{REPO}/manifests/{TAG}"] = (401, {"WWW-Authenticate": 'Basic realm="standin"'}, b"")
    text = plan_text(capsys, standin.image())
    assert size_line(text) == (f"  size     {ESTIMATE_GB} GB (estimate: the registry asks for Basic authentication "
                               "(credentials); set container.imageSizeGb)")
    assert all("Authorization" not in headers for _, headers in standin.requests)


def test_image_size_gb_set_by_the_user_wins_and_the_registry_is_not_asked(standin, capsys):
    standin.serve(f"/v2/{REPO}/manifests/{TAG}", AMD64)
    text = plan_text(capsys, standin.image(), container={"imageSizeGb": 30})
    assert size_line(text) == ("  size     30 GB compressed (container.imageSizeGb, set for this stack; the manifest "
                               "not read)")
    assert standin.requests == []


def test_no_registry_and_the_environment_switch_ask_nothing(standin, capsys, monkeypatch):
    standin.serve(f"/v2/{REPO}/manifests/{TAG}", AMD64)
    text = plan_text(capsys, standin.image(), "--no-registry")
    assert "(estimate: the registry was not asked (--no-registry or ROLL_CLUSTER_NO_REGISTRY)" in size_line(text)
    monkeypatch.setenv(registry.DISABLE_ENV, "1")
    plan_text(capsys, standin.image())
    assert standin.requests == []
    monkeypatch.delenv(registry.DISABLE_ENV)
    text = plan_text(capsys, standin.image())  # a single-platform manifest: no index to pick from
    assert size_line(text) == "  size     14.2 GB compressed (registry manifest, single platform, 3 layers)"


@pytest.mark.parametrize(("image", "api_host", "name", "reference"), [
    ("verlai/verl:vllm", "registry-1.docker.io", "verlai/verl", "vllm"),
    ("ubuntu", "registry-1.docker.io", "library/ubuntu", "latest"),
    ("docker.io/ubuntu:22.04", "registry-1.docker.io", "library/ubuntu", "22.04"),
    ("index.docker.io/library/ubuntu:22.04", "registry-1.docker.io", "library/ubuntu", "22.04"),
    ("localhost:5000/a/b:t", "localhost:5000", "a/b", "t"),
    ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io", "nvidia/pytorch", "24.05-py3"),
    ("registry-vpc.cn-hangzhou.aliyuncs.com/ns/img:t", "registry.cn-hangzhou.aliyuncs.com", "ns/img", "t"),
    ("crpi-abc123-vpc.cn-beijing.personal.cr.aliyuncs.com/ns/img:t", "crpi-abc123.cn-beijing.personal.cr.aliyuncs.com",
     "ns/img", "t"),
    ("inst-registry-vpc.cn-shanghai.cr.aliyuncs.com/ns/img:t", "inst-registry.cn-shanghai.cr.aliyuncs.com", "ns/img",
     "t"),
    (f"ghcr.io/o/r:t@sha256:{'a' * 64}", "ghcr.io", "o/r", f"sha256:{'a' * 64}"),
])
def test_image_names_are_normalised_as_docker_does(image, api_host, name, reference):
    ref = parse_reference(image)
    assert (ref.api_host, ref.name, ref.reference) == (api_host, name, reference)


@pytest.mark.parametrize("image", ["ghcr.io/o/r@sha256:short", "ghcr.io/O/R:t", "host/a//b:t", "ghcr.io/o/r:t$(id)"])
def test_image_names_that_are_not_references_are_refused(image):
    with pytest.raises(ManifestError):
        parse_reference(image)


@pytest.mark.parametrize("header", ['Bearer service="x"', "Basic realm=x", ""])
def test_a_challenge_without_an_anonymous_realm_is_refused(header):
    with pytest.raises(ManifestError, match=re.compile("realm|authentication")):
        image_manifest.bearer_challenge(header)
