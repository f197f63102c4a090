"""infra/scripts/autostop.sh, rendered as the autostop step renders it, against stand-ins: a Jobs API answer
through a stand-in `docker`, a stand-in `nvidia-smi`, and a stand-in metadata service and ECS endpoint (HTTP on
127.0.0.1) that check the request's signature with the role's temporary credentials."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from infra.autostop import AUTOSTOP_SCRIPTS
from infra.node.remote import local_library, render_plain

ROLE = "roll-cluster-multi-autostop"
CREDENTIALS = {"AccessKeyId": "STS.NTemporary", "AccessKeySecret": "temporary-secret", "SecurityToken": "tok+en/=="}


class StandIn(http.server.BaseHTTPRequestHandler):
    calls: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path == f"/latest/meta-data/ram/security-credentials/{ROLE}":
            body = "{\n" + ",\n".join(f'  "{k}" : "{v}"' for k, v in {"Code": "Success", **CREDENTIALS}.items())
            self._answer(200, body + "\n}")
            return
        pairs = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
        params = dict(pairs)
        signature = params.pop("Signature", "")
        canonical = "&".join(f"{_enc(k)}={_enc(v)}" for k, v in sorted(params.items()))
        expected = base64.b64encode(hmac.new(f"{CREDENTIALS['AccessKeySecret']}&".encode(),
                                             f"GET&%2F&{_enc(canonical)}".encode(), hashlib.sha1).digest()).decode()
        params["signatureValid"] = str(signature == expected)
        StandIn.calls.append(params)
        self._answer(200, '{"RequestId": "stand-in"}')

    def _answer(self, status: int, body: str) -> None:
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


def _enc(text: str) -> str:
    return urllib.parse.quote(text, safe="-_.~")


@pytest.fixture
def endpoint() -> Iterator[str]:
    StandIn.calls = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _node(tmp: Path, job_state: str, gpu_load: str) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f"#!/bin/bash\n[[ \"$*\" == *' state '* ]] && echo {job_state}\n"
                                    "echo \"docker $*\" >>\"$(dirname \"$0\")/calls\"\nexit 0\n")
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/bash\nprintf '%s\\n' {gpu_load}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "ROLL_LOG_DIR": str(tmp / "log"), "HOME": str(tmp)}


def _run(
    tmp: Path, endpoint: str, mode: str, job_state: str, gpu_load: str, **env: str
) -> subprocess.CompletedProcess[str]:
    state = tmp / "state"
    state.mkdir(exist_ok=True)
    values = {
        "AUTOSTOP_ACTION": "once", "AUTOSTOP_MODE": mode, "CONTAINER_NAME": "roll", "DASHBOARD_PORT": "8265",
        "JOB_ID": "roll-multi-1", "INSTANCE_IDS": "i-head i-worker", "REGION_ID": "cn-hangzhou", "RAM_ROLE": ROLE,
        "ECS_ENDPOINT": endpoint, "METADATA_URL": endpoint, "AUTOSTOP_STATE_DIR": str(state), "NODE_NAME": "node-0",
        **env,
    }
    command = render_plain("autostop", AUTOSTOP_SCRIPTS, values, library=local_library())
    return subprocess.run(["bash", "-c", command], env=_node(tmp, job_state, gpu_load), capture_output=True,
                          text=True, timeout=60)


def _ended_long_ago(tmp: Path, name: str = "ended_since") -> None:
    (tmp / "state").mkdir(exist_ok=True)
    (tmp / "state" / name).write_text(str(int(time.time()) - 3600))


def test_after_the_job_ended_it_stops_exactly_this_stacks_instances_with_the_roles_credentials(tmp_path, endpoint):
    _ended_long_ago(tmp_path)
    result = _run(tmp_path, endpoint, "instances", "SUCCEEDED", "37", AUTOSTOP_AFTER_JOB_MINUTES="30")
    assert result.returncode == 0, result.stderr
    assert len(StandIn.calls) == 1, result.stderr
    call = StandIn.calls[0]
    assert call["Action"] == "StopInstances" and call["StoppedMode"] == "StopCharging"
    assert sorted(v for k, v in call.items() if k.startswith("InstanceId.")) == ["i-head", "i-worker"]
    assert call["AccessKeyId"] == CREDENTIALS["AccessKeyId"] and call["SecurityToken"] == CREDENTIALS["SecurityToken"]
    assert call["signatureValid"] == "True"
    assert "ended (SUCCEEDED)" in result.stdout


def test_a_running_job_is_never_stopped(tmp_path, endpoint):
    _ended_long_ago(tmp_path)
    _ended_long_ago(tmp_path, "idle_since")
    result = _run(tmp_path, endpoint, "instances", "RUNNING", "0", AUTOSTOP_AFTER_JOB_MINUTES="1",
                  AUTOSTOP_IDLE_MINUTES="1")
    assert result.returncode == 1 and StandIn.calls == []
    assert not (tmp_path / "state" / "ended_since").exists()  # the clock restarts when a job runs again


def test_a_job_that_just_ended_starts_the_clock_and_stops_nothing_yet(tmp_path, endpoint):
    result = _run(tmp_path, endpoint, "instances", "FAILED", "0", AUTOSTOP_AFTER_JOB_MINUTES="30")
    assert result.returncode == 1 and StandIn.calls == []
    assert (tmp_path / "state" / "ended_since").exists()


def test_idle_gpus_without_a_job_stop_the_cluster(tmp_path, endpoint):
    _ended_long_ago(tmp_path, "idle_since")
    result = _run(tmp_path, endpoint, "instances", "NOT_FOUND", "0 0", AUTOSTOP_IDLE_MINUTES="20")
    assert result.returncode == 0, result.stderr
    assert [c["Action"] for c in StandIn.calls] == ["StopInstances"]


def test_busy_gpus_are_not_idle(tmp_path, endpoint):
    _ended_long_ago(tmp_path, "idle_since")
    result = _run(tmp_path, endpoint, "instances", "NOT_FOUND", "0 55", AUTOSTOP_IDLE_MINUTES="20")
    assert result.returncode == 1 and StandIn.calls == []


def test_on_own_hosts_it_stops_the_job_never_the_machines(tmp_path, endpoint):
    _ended_long_ago(tmp_path)
    result = _run(tmp_path, endpoint, "ray", "STOPPED", "0", AUTOSTOP_AFTER_JOB_MINUTES="5")
    assert result.returncode == 0, result.stderr
    assert StandIn.calls == []  # no cloud API
    calls = (tmp_path / "bin" / "calls").read_text()
    assert "exec roll ray job stop --address http://127.0.0.1:8265 -- roll-multi-1" in calls


def test_with_systemd_the_watcher_is_a_unit_whose_command_stops_the_cluster_and_remove_takes_it_away(
    tmp_path: Path, endpoint: str
) -> None:
    units, run_dir, fake = tmp_path / "units", tmp_path / "run-systemd", tmp_path / "fake"
    for directory in (units, run_dir, fake):
        directory.mkdir()
    (fake / "systemctl").write_text('#!/bin/bash\necho "$*" >>"$(dirname "$0")/systemctl.calls"\n')
    (fake / "systemctl").chmod(0o755)
    seams = {"SYSTEMD_UNIT_DIR": str(units), "SYSTEMD_RUN_DIR": str(run_dir),
             "PATH": f"{fake}:{tmp_path / 'bin'}:/usr/local/bin:/usr/bin:/bin"}

    installed = _run(tmp_path, endpoint, "instances", "SUCCEEDED", "0", AUTOSTOP_ACTION="install",
                     AUTOSTOP_AFTER_JOB_MINUTES="1", **seams)

    assert installed.returncode == 0, installed.stderr
    assert "autostop watcher running (systemd unit roll-cluster-autostop)" in installed.stdout
    unit = (units / "roll-cluster-autostop.service").read_text().splitlines()
    assert "After=docker.service network-online.target" in unit and "RestartSec=30" in unit
    assert (fake / "systemctl.calls").read_text().splitlines() == [
        "daemon-reload", "enable -- roll-cluster-autostop.service", "restart -- roll-cluster-autostop.service"]
    # What systemd starts: the kept copy with the kept settings, as the watcher; the job ended an hour ago.
    _ended_long_ago(tmp_path)
    exec_start = next(line for line in unit if line.startswith("ExecStart=")).removeprefix("ExecStart=")
    (tmp_path / "watcher-node").mkdir()
    watcher = subprocess.Popen(["bash", "-c", exec_start], env=_node(tmp_path / "watcher-node", "SUCCEEDED", "0"),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not StandIn.calls and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [c["Action"] for c in StandIn.calls] == ["StopInstances"]
    finally:
        watcher.kill()
        watcher.wait(timeout=10)

    (tmp_path / "destroy").mkdir()  # _run's own stand-ins and log there; the watcher's state where it was installed
    removed = _run(tmp_path / "destroy", endpoint, "instances", "SUCCEEDED", "0", AUTOSTOP_ACTION="remove",
                   AUTOSTOP_STATE_DIR=str(tmp_path / "state"), **seams)

    assert removed.returncode == 0, removed.stderr
    assert "disable --now -- roll-cluster-autostop.service" in (fake / "systemctl.calls").read_text()
    assert not (units / "roll-cluster-autostop.service").exists() and not (tmp_path / "state").exists()
