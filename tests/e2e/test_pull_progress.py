"""A long image pull on the test hosts shows its progress in the pull-image step's output, as `pulumi up` shows it.

The pull is real (the host's dockerd, the tier's registry), through a gate in front of the registry (SlowRegistry):
the changed test image (tag 2: tag 1, already on the host, and one small layer more) is pulled through it, and the
gate holds that one layer until the test opens it, so a pull of half an hour is observed without waiting for one: the
step's progress interval (PULL_PROGRESS_S, 30 s on the nodes) is made 1 s, and the gate opens once the step's log
shows a progress line. No timing is asserted.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from e2e_docker import CHANGED_IMAGE_TAG, IMAGE_REPOSITORY
from e2e_harness import BRIDGE_IP, CHANGED_TEST_IMAGE, REGISTRY_ADDRESS, REPO, TEST_IMAGE, TestNetwork
from program_commands import render_hosts_program

pytestmark = pytest.mark.e2e

GATE_PORT = 5001
IMAGE = f"{BRIDGE_IP}:{GATE_PORT}/{IMAGE_REPOSITORY}:{CHANGED_IMAGE_TAG}"  # the changed image, through the gate
MANIFEST_TYPES = "application/vnd.docker.distribution.manifest.v2+json"


class SlowRegistry(ThreadingHTTPServer):
    """Forwards every request to the tier's registry; a GET of the blob `held` waits until `gate` is set (bounded:
    a test that never opens it fails the pull instead of hanging)."""

    daemon_threads = True

    def __init__(self, held: str) -> None:
        super().__init__((BRIDGE_IP, GATE_PORT), _Forward)
        self.held = held
        self.gate = threading.Event()


class _Forward(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: SlowRegistry

    def do_GET(self) -> None:
        if self.path.endswith(f"/blobs/{self.server.held}"):
            self.server.gate.wait(timeout=300)
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def _forward(self) -> None:
        host, port = REGISTRY_ADDRESS.rsplit(":", 1)
        upstream = http.client.HTTPConnection(host, int(port), timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        upstream.request(self.command, self.path, headers=headers)
        response = upstream.getresponse()
        body = response.read()
        self.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("connection", "transfer-encoding"):
                self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        upstream.close()

    def log_message(self, format: str, *args: object) -> None:
        pass


def top_layer() -> str:
    """The digest of the layer that tag 2 adds to tag 1, from the registry's manifest."""
    host, port = REGISTRY_ADDRESS.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("GET", f"/v2/{IMAGE_REPOSITORY}/manifests/{CHANGED_IMAGE_TAG}",
                       headers={"Accept": MANIFEST_TYPES})
    manifest = json.loads(connection.getresponse().read())
    return str(manifest["layers"][-1]["digest"])


@pytest.fixture
def slow_registry() -> Iterator[SlowRegistry]:
    server = SlowRegistry(top_layer())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.gate.set()
        server.shutdown()
        server.server_close()


def test_the_default_progress_interval_is_at_most_a_minute() -> None:
    script = (REPO / "infra" / "scripts" / "pull_image.sh").read_text()
    default = re.search(r'^: "\$\{PULL_PROGRESS_S:=(\d+)\}"$', script, re.M)
    assert default is not None and 0 < int(default.group(1)) <= 60


def test_a_long_pull_prints_progress_in_the_steps_output(network: TestNetwork, slow_registry: SlowRegistry) -> None:
    host = network.hosts[2]
    program = render_hosts_program(
        "hosts", [host.ip], str(network.client_key), accelerators_per_node=2, container="rc-pull",
        ports=(8500, 8501, 8502), entrypoint="true", working_dir="/tmp/pull-job", image=IMAGE,
    )
    step = next(s for s in program.steps if s.key == "node-0/pull-image")
    # Tag 1 on the node, tag 2's own layer not: the pull has one layer to fetch, the one the gate holds.
    network.run(host, f"docker pull -q -- {TEST_IMAGE} && {{ docker image rm -- {IMAGE} {CHANGED_TEST_IMAGE} "
                      ">/dev/null 2>&1 || :; }", timeout=300).check()
    host.private_path("/var/log/roll-cluster/pull-image.log").unlink(missing_ok=True)
    try:
        running = network.start_command(host, step.command.prefixed("export PULL_PROGRESS_S=1\n"))
        log = host.private_path("/var/log/roll-cluster/pull-image.log")
        deadline = time.monotonic() + 120  # a bound for a broken step, not a measurement
        while not _shows_progress(log) and running.running() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        slow_registry.gate.set()
    result = running.wait(120)
    assert result.returncode == 0, result.output
    lines = result.output.splitlines()
    progress = [i for i, line in enumerate(lines) if f"pull-image: still pulling {IMAGE}: " in line]
    pulled = next(i for i, line in enumerate(lines) if f"pull-image: pulled {IMAGE} in " in line)
    assert progress and progress[0] < pulled, result.output
    assert "1 of 2 layers done" in lines[progress[0]]
    assert "a progress line every 1s" in result.output
    network.run(host, f"docker image rm -- {IMAGE}", timeout=60)


def _shows_progress(log: Path) -> bool:
    return log.exists() and "still pulling" in log.read_text(errors="replace")
