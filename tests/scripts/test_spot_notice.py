"""Reclaimed spot nodes: infra/scripts/spot_notice.sh against a stand-in metadata service records Alibaba's notice
on the shared storage, `jobStatus` then says RECLAIMED with the node; the program puts the watcher on exactly the
spot nodes (the head is pay-as-you-go unless nodes.spotHead)."""

from __future__ import annotations

import http.server
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from offline_helpers import env_of, run, step_command
from test_ray_commands import run_job_status

from infra.node.remote import local_library, render_plain

SPOT = {"roll-cluster:nodes": {"spot": True}}
RECLAIM = "/mnt/shared/.roll-cluster/reclaimed/multi"


class Metadata(http.server.BaseHTTPRequestHandler):
    termination: ClassVar[str | None] = None

    def do_GET(self) -> None:
        if self.path == "/latest/meta-data/instance/spot/termination-time" and Metadata.termination:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(Metadata.termination.encode())
        else:
            self.send_response(404)
            self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def metadata() -> Iterator[str]:
    Metadata.termination = None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _look(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    env = {"SPOT_ACTION": "once", "RECLAIM_DIR": str(tmp_path / "reclaimed"), "NODE_NAME": "node-1",
           "METADATA_URL": url, "SPOT_STATE_DIR": str(tmp_path / "state")}
    command = render_plain("spot-notice", ("spot_notice.sh",), env, library=local_library())
    return subprocess.run(["bash", "-c", command],
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin", "ROLL_CLUSTER_LOG_DIR": str(tmp_path / "log")},
                          capture_output=True, text=True, timeout=60)


def test_no_notice_records_nothing_and_jobstatus_shows_the_job(tmp_path: Path, metadata: str) -> None:
    assert _look(tmp_path, metadata).returncode == 1
    assert not (tmp_path / "reclaimed" / "node-1").exists()
    status = run_job_status(tmp_path / "status", "Status for job 'job-1': RUNNING", 0,
                            reclaim_dir=str(tmp_path / "reclaimed"))
    assert status.returncode == 0 and "RUNNING" in status.stdout and "RECLAIMED" not in status.stdout


def test_a_reclaim_notice_makes_jobstatus_say_reclaimed_with_the_node(tmp_path: Path, metadata: str) -> None:
    Metadata.termination = "2026-11-25T15:04:00Z"
    result = _look(tmp_path, metadata)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "reclaimed" / "node-1").read_text().strip() == "2026-11-25T15:04:00Z"
    status = run_job_status(tmp_path / "status", "Status for job 'job-1': RUNNING", 0,
                            reclaim_dir=str(tmp_path / "reclaimed"))
    assert status.returncode == 4, status
    assert status.stdout.startswith("job job-1: RECLAIMED: Alibaba reclaims spot node node-1 at 2026-11-25T15:04:00Z")
    assert "pulumi up --refresh" in status.stdout


def test_the_watcher_runs_on_the_spot_workers_and_jobstatus_looks_where_they_write() -> None:
    result = run("multi", config=SPOT)
    watchers = sorted(r.name for r in result.cloud.resources if r.name.endswith("-spot-notice"))
    assert watchers == ["node-1-spot-notice"]  # the head is pay-as-you-go
    assert env_of(step_command(result, "node-1-spot-notice"))["RECLAIM_DIR"] == RECLAIM
    assert RECLAIM in result.outputs["jobStatus"]
    both = run("multi", config={"roll-cluster:nodes": {"spot": True, "spotHead": True}})
    assert sorted(r.name for r in both.cloud.resources if r.name.endswith("-spot-notice")) == [
        "node-0-spot-notice", "node-1-spot-notice"]


def test_without_spot_there_is_no_watcher_and_no_reclaim_check() -> None:
    result = run("multi")
    assert not [r for r in result.cloud.resources if r.name.endswith("-spot-notice")]
    assert "reclaimed" not in result.outputs["jobStatus"]


def _alive(pid: int) -> bool:
    """Running, not a zombie: the watcher is orphaned, and a PID 1 that reaps nothing keeps it as one."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait(what: str, done: Callable[[], bool], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s}s"
        time.sleep(0.2)


def test_without_systemd_the_watcher_runs_detached_a_reinstall_replaces_it_and_it_records_the_notice(
    tmp_path: Path, metadata: str
) -> None:
    state = tmp_path / "state"
    env = {"SPOT_ACTION": "install", "RECLAIM_DIR": str(tmp_path / "reclaimed"), "NODE_NAME": "node-1",
           "METADATA_URL": metadata, "SPOT_STATE_DIR": str(state), "SPOT_POLL_S": "1",
           "SYSTEMD_RUN_DIR": str(tmp_path / "no-systemd")}

    def install() -> int:
        command = render_plain("spot-notice", ("spot_notice.sh",), env, library=local_library())
        result = subprocess.run(["bash", "-c", command],
                                env={"PATH": "/usr/local/bin:/usr/bin:/bin",
                                     "ROLL_CLUSTER_LOG_DIR": str(tmp_path / "log")},
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and "spot notice watcher running (no systemd: process" in result.stdout, result
        return int((state / "watch.pid").read_text())

    pids: list[int] = []
    try:
        pids.append(install())
        pids.append(install())
        first, second = pids
        _wait("the first watcher to be stopped by the second install", lambda: not _alive(first))
        assert _alive(second)
        Metadata.termination = "2026-11-25T15:04:00Z"
        record = tmp_path / "reclaimed" / "node-1"
        _wait("the watcher to record the notice", lambda: record.exists() and record.read_text().strip() != "")
        assert record.read_text().strip() == "2026-11-25T15:04:00Z"
    finally:
        for pid in pids:
            if _alive(pid):
                subprocess.run(["kill", "--", str(pid)], check=False)
