"""infra/scripts/autostop.sh, rendered as the autostop step renders it, against stand-ins: a Jobs API answer
through a stand-in `docker`, a stand-in `nvidia-smi`, and Alibaba's metadata service and ECS endpoint
(tests/helpers/alibaba_standin.py, HTTP on 127.0.0.1), whose ECS checks every request's signature with the role's
temporary credentials by Alibaba's documented RPC signature algorithm. The stop itself is made by Alibaba's
Python SDK (stop_instances.py) in the virtualenv the node's own installation makes (tests/helpers/autostop_sdk.py)."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from alibaba_standin import CREDENTIALS, AlibabaStandIn
from autostop_sdk import ensure_autostop_sdk

from infra.autostop import AUTOSTOP_SCRIPTS, SDK_REQUIREMENTS, STOPPER, file_b64
from infra.node.remote import local_library, render_plain

ROLE = "roll-cluster-multi-cn-hangzhou-0123456789-autostop"
JOB = "roll-multi-7"  # what the job step recorded on the head (CURRENT_JOB_FILE)


@pytest.fixture(scope="module")
def sdk() -> Path:
    return ensure_autostop_sdk()


@pytest.fixture
def standin() -> Iterator[AlibabaStandIn]:
    alibaba = AlibabaStandIn("127.0.0.1", ROLE, lifetime_s=300).start()
    yield alibaba
    alibaba.stop()


def _node(tmp: Path, job_state: str, gpu_load: str) -> dict[str, str]:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "docker").write_text(f"#!/bin/bash\n[[ \"$*\" == *' state '* ]] && echo {job_state}\n"
                                    "echo \"docker $*\" >>\"$(dirname \"$0\")/calls\"\nexit 0\n")
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/bash\nprintf '%s\\n' {gpu_load}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin", "ROLL_CLUSTER_LOG_DIR": str(tmp / "log"),
            "HOME": str(tmp)}


def _boot(tmp: Path, boot: str = "boot-1") -> None:
    """The host's boot id (BOOT_ID_FILE): a new value is a reboot."""
    (tmp / "boot_id").write_text(boot + "\n")


def _installed(tmp: Path) -> None:
    """What the install leaves for `once`: the watcher armed in this boot."""
    (tmp / "state").mkdir(exist_ok=True)
    if not (tmp / "boot_id").exists():
        _boot(tmp)
    (tmp / "state" / "armed").write_text((tmp / "boot_id").read_text())


def _run(
    tmp: Path, standin: AlibabaStandIn, sdk: Path, mode: str, job_state: str, gpu_load: str, **env: str
) -> subprocess.CompletedProcess[str]:
    state = tmp / "state"
    state.mkdir(exist_ok=True)
    if not (tmp / "boot_id").exists():
        _boot(tmp)
    (tmp / "current-job").write_text(JOB + "\n")
    values = {
        "AUTOSTOP_ACTION": "once", "AUTOSTOP_MODE": mode, "CONTAINER_NAME": "roll", "DASHBOARD_PORT": "8265",
        "INSTANCE_IDS": "i-head i-worker", "REGION_ID": "cn-hangzhou", "RAM_ROLE": ROLE,
        "AUTOSTOP_STOPPER_B64": file_b64(STOPPER), "AUTOSTOP_SDK_REQUIREMENTS_B64": file_b64(SDK_REQUIREMENTS),
        "ECS_ENDPOINT": standin.ecs_url, "METADATA_URL": standin.metadata_url, "AUTOSTOP_STATE_DIR": str(state),
        "AUTOSTOP_SDK_DIR": str(sdk), "BOOT_ID_FILE": str(tmp / "boot_id"),
        "CURRENT_JOB_FILE": str(tmp / "current-job"), "NODE_NAME": "node-0",
        **env,
    }
    if values["AUTOSTOP_ACTION"] == "once" and not (state / "armed").exists():
        _installed(tmp)
    # The stopper as install keeps it beside the watcher's state.
    (state / "stop_instances.py").write_text(STOPPER.read_text())
    command = render_plain("autostop", AUTOSTOP_SCRIPTS, values, library=local_library())
    return subprocess.run(["bash", "-c", command], env=_node(tmp, job_state, gpu_load), capture_output=True,
                          text=True, timeout=120)


def _log(tmp: Path) -> str:
    return "".join(f.read_text() for f in sorted((tmp / "log").glob("*.log")))


def _ended_long_ago(tmp: Path, name: str = "ended_since") -> None:
    (tmp / "state").mkdir(exist_ok=True)
    (tmp / "state" / name).write_text(str(int(time.time()) - 3600))


def _stopped(call: dict[str, str]) -> list[str]:
    """The instance ids of one StopInstances call, in the order of their InstanceId.N."""
    return [call[f"InstanceId.{n}"] for n in range(1, 101) if f"InstanceId.{n}" in call]


def test_after_the_job_ended_it_stops_exactly_this_stacks_instances_with_the_roles_credentials(
    tmp_path: Path, standin: AlibabaStandIn, sdk: Path
) -> None:
    _ended_long_ago(tmp_path)
    result = _run(tmp_path, standin, sdk, "instances", "SUCCEEDED", "37", AUTOSTOP_AFTER_JOB_MINUTES="30")
    assert result.returncode == 0, result.stdout + result.stderr
    (call,) = standin.calls()
    assert call["Action"] == "StopInstances" and call["StoppedMode"] == "StopCharging"
    assert call["BatchOptimization"] == "SuccessFirst" and call["RegionId"] == "cn-hangzhou"
    assert _stopped(call) == ["i-head", "i-worker"]
    assert call["AccessKeyId"] == CREDENTIALS["AccessKeyId"] and call["SecurityToken"] == CREDENTIALS["SecurityToken"]
    assert call["signatureValid"] == "True"
    assert f"job {JOB} ended (SUCCEEDED)" in result.stdout
    # The state asked for is the job's whose id the job step recorded on the host, not one fixed at install.
    assert f"state {JOB}" in (tmp_path / "bin" / "calls").read_text()
    log = _log(tmp_path)
    assert '"InstanceResponses"' in log  # Alibaba's answer, in the watcher's log
    assert CREDENTIALS["AccessKeySecret"] not in log + result.stdout and CREDENTIALS["SecurityToken"] not in log


def test_twelve_instances_one_of_them_gone_are_stopped_in_one_signed_call_and_the_rest_stop(
    tmp_path: Path, standin: AlibabaStandIn, sdk: Path
) -> None:
    ids = [f"i-node{n:02d}" for n in range(12)]
    standin.instances = set(ids) - {"i-node10"}  # a reclaimed spot worker: ECS no longer knows it
    _ended_long_ago(tmp_path)
    result = _run(tmp_path, standin, sdk, "instances", "SUCCEEDED", "0", AUTOSTOP_AFTER_JOB_MINUTES="30",
                  INSTANCE_IDS=" ".join(ids))
    assert result.returncode == 0, result.stdout + result.stderr + _log(tmp_path)
    (call,) = standin.calls()
    assert call["signatureValid"] == "True", call  # InstanceId.10 .. .12 sorted by name, as Alibaba does
    assert _stopped(call) == ids
    log = _log(tmp_path)
    assert "i-node10: InvalidInstanceId.NotFound" in log and "i-node11: 200" in log
    assert (tmp_path / "state" / "stopped").exists()


def test_when_ecs_refuses_the_whole_call_each_instance_is_stopped_on_its_own(
    tmp_path: Path, standin: AlibabaStandIn, sdk: Path
) -> None:
    ids = [f"i-node{n:02d}" for n in range(12)]
    standin.instances, standin.all_together = set(ids) - {"i-node03"}, True
    _ended_long_ago(tmp_path)
    result = _run(tmp_path, standin, sdk, "instances", "SUCCEEDED", "0", AUTOSTOP_AFTER_JOB_MINUTES="30",
                  INSTANCE_IDS=" ".join(ids))
    assert result.returncode == 0, result.stdout + result.stderr + _log(tmp_path)
    calls = standin.calls()
    assert all(c["signatureValid"] == "True" for c in calls)
    assert _stopped(calls[0]) == ids  # refused as a whole: one unknown id
    assert sorted(_stopped(c)[0] for c in calls[1:]) == ids  # then one by one
    assert "ECS refused StopInstances" in _log(tmp_path)


def test_a_stop_without_the_roles_credentials_fails_the_watcher_naming_the_role(
    tmp_path: Path, standin: AlibabaStandIn, sdk: Path
) -> None:
    _ended_long_ago(tmp_path)
    result = _run(tmp_path, standin, sdk, "instances", "SUCCEEDED", "0", AUTOSTOP_AFTER_JOB_MINUTES="30",
                  RAM_ROLE="roll-cluster-other-autostop")
    assert result.returncode != 0 and standin.calls() == []
    assert "no credentials for the instance RAM role roll-cluster-other-autostop" in result.stdout + result.stderr
    assert not (tmp_path / "state" / "stopped").exists()  # the next poll tries again


def test_a_running_job_is_never_stopped(tmp_path: Path, standin: AlibabaStandIn, sdk: Path) -> None:
    _ended_long_ago(tmp_path)
    _ended_long_ago(tmp_path, "idle_since")
    result = _run(tmp_path, standin, sdk, "instances", "RUNNING", "0", AUTOSTOP_AFTER_JOB_MINUTES="1",
                  AUTOSTOP_IDLE_MINUTES="1")
    assert result.returncode == 1 and standin.calls() == []
    assert not (tmp_path / "state" / "ended_since").exists()  # the clock restarts when a job runs again


def test_a_job_that_just_ended_starts_the_clock_and_stops_nothing_yet(
    tmp_path: Path, standin: AlibabaStandIn, sdk: Path
) -> None:
    result = _run(tmp_path, standin, sdk, "instances", "FAILED", "0", AUTOSTOP_AFTER_JOB_MINUTES="30")
    assert result.returncode == 1 and standin.calls() == []
    assert (tmp_path / "state" / "ended_since").exists()


def test_idle_gpus_without_a_job_stop_the_cluster(tmp_path: Path, standin: AlibabaStandIn, sdk: Path) -> None:
    _ended_long_ago(tmp_path, "idle_since")
    result = _run(tmp_path, standin, sdk, "instances", "NOT_FOUND", "0 0", AUTOSTOP_IDLE_MINUTES="20")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [c["Action"] for c in standin.calls()] == ["StopInstances"]


def test_busy_gpus_are_not_idle(tmp_path: Path, standin: AlibabaStandIn, sdk: Path) -> None:
    _ended_long_ago(tmp_path, "idle_since")
    result = _run(tmp_path, standin, sdk, "instances", "NOT_FOUND", "0 55", AUTOSTOP_IDLE_MINUTES="20")
    assert result.returncode == 1 and standin.calls() == []


def test_on_own_hosts_it_stops_the_job_never_the_machines(tmp_path: Path, standin: AlibabaStandIn, sdk: Path) -> None:
    _ended_long_ago(tmp_path)
    result = _run(tmp_path, standin, sdk, "ray", "STOPPED", "0", AUTOSTOP_AFTER_JOB_MINUTES="5")
    assert result.returncode == 0, result.stderr
    assert standin.calls() == []  # no cloud API
    calls = (tmp_path / "bin" / "calls").read_text()
    assert f"exec roll ray job stop --address http://127.0.0.1:8265 -- {JOB}" in calls


def test_after_a_boot_it_acts_only_once_the_step_installed_it_again_and_its_clocks_start_over(
    tmp_path: Path, standin: AlibabaStandIn, sdk: Path
) -> None:
    _installed(tmp_path)
    _ended_long_ago(tmp_path)  # the job ended an hour before the cluster was paused
    _boot(tmp_path, "boot-2")  # paused (stopped) and started again: a new boot
    refused = _run(tmp_path, standin, sdk, "instances", "SUCCEEDED", "0", AUTOSTOP_AFTER_JOB_MINUTES="30")
    assert refused.returncode != 0 and standin.calls() == []
    assert "acts only after the step installed it" in refused.stdout + refused.stderr
    # The service as it starts at boot: it clears the clocks and waits for the step.
    watch_env = {"AUTOSTOP_ACTION": "watch", "AUTOSTOP_POLL_S": "1"}
    command = render_plain("autostop", AUTOSTOP_SCRIPTS, {
        "AUTOSTOP_MODE": "instances", "CONTAINER_NAME": "roll", "DASHBOARD_PORT": "8265", "INSTANCE_IDS": "i-head",
        "REGION_ID": "cn-hangzhou", "RAM_ROLE": ROLE, "ECS_ENDPOINT": standin.ecs_url,
        "METADATA_URL": standin.metadata_url, "AUTOSTOP_STATE_DIR": str(tmp_path / "state"),
        "AUTOSTOP_SDK_DIR": str(sdk), "BOOT_ID_FILE": str(tmp_path / "boot_id"),
        "CURRENT_JOB_FILE": str(tmp_path / "current-job"), "AUTOSTOP_AFTER_JOB_MINUTES": "30", **watch_env},
        library=local_library())
    watcher = subprocess.Popen(["bash", "-c", command], env=_node(tmp_path, "SUCCEEDED", "0"), text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert watcher.stdout is not None
        # Bounded: the watcher says so at its first look (a poll of 1 s).
        assert select.select([watcher.stdout], [], [], 60)[0], "the watcher said nothing within 60 s"
        banner = watcher.stdout.readline()
        assert "this host booted since the step installed the watcher" in banner, banner
    finally:
        watcher.kill()
        watcher.wait(timeout=10)
    assert not (tmp_path / "state" / "ended_since").exists() and standin.calls() == []
    # `pulumi up` re-formed the cluster and installed the watcher again: armed, and the hour-old clock is gone.
    _ended_long_ago(tmp_path)  # even had a clock survived, install resets it
    installed = _run(tmp_path, standin, sdk, "instances", "SUCCEEDED", "0", AUTOSTOP_ACTION="install",
                     AUTOSTOP_AFTER_JOB_MINUTES="30", SYSTEMD_RUN_DIR=str(tmp_path / "no-systemd"))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    _kill_detached(tmp_path)
    assert (tmp_path / "state" / "armed").read_text().strip() == "boot-2"
    # The hour-old clock is gone (the watcher the install started may already have started a new one).
    clock = tmp_path / "state" / "ended_since"
    assert not clock.exists() or int(clock.read_text()) > time.time() - 600
    clock.unlink(missing_ok=True)
    first = _run(tmp_path, standin, sdk, "instances", "SUCCEEDED", "0", AUTOSTOP_AFTER_JOB_MINUTES="30")
    assert first.returncode == 1 and standin.calls() == []  # the clock starts now: 30 whole minutes to go


def _kill_detached(tmp: Path) -> None:
    """End the detached watcher an install without systemd started (its pid file)."""
    pid_file = tmp / "state" / "watch.pid"
    if pid_file.exists():
        subprocess.run(["kill", "--", pid_file.read_text().strip()], check=False)


def test_with_systemd_the_watcher_is_a_unit_whose_command_stops_the_cluster_and_remove_takes_it_away(
    tmp_path: Path, standin: AlibabaStandIn, sdk: Path
) -> None:
    units, run_dir, fake = tmp_path / "units", tmp_path / "run-systemd", tmp_path / "fake"
    for directory in (units, run_dir, fake):
        directory.mkdir()
    (fake / "systemctl").write_text('#!/bin/bash\necho "$*" >>"$(dirname "$0")/systemctl.calls"\n')
    (fake / "systemctl").chmod(0o755)
    seams = {"SYSTEMD_UNIT_DIR": str(units), "SYSTEMD_RUN_DIR": str(run_dir),
             "PATH": f"{fake}:{tmp_path / 'bin'}:/usr/local/bin:/usr/bin:/bin"}

    installed = _run(tmp_path, standin, sdk, "instances", "SUCCEEDED", "0", AUTOSTOP_ACTION="install",
                     AUTOSTOP_AFTER_JOB_MINUTES="1", **seams)

    assert installed.returncode == 0, installed.stdout + installed.stderr
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
        while not standin.calls() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert [c["Action"] for c in standin.calls()] == ["StopInstances"]
    finally:
        watcher.kill()
        watcher.wait(timeout=10)

    (tmp_path / "destroy").mkdir()  # _run's own stand-ins and log there; the watcher's state where it was installed
    removed = _run(tmp_path / "destroy", standin, sdk, "instances", "SUCCEEDED", "0", AUTOSTOP_ACTION="remove",
                   AUTOSTOP_STATE_DIR=str(tmp_path / "state"), **seams)

    assert removed.returncode == 0, removed.stderr
    assert "disable --now -- roll-cluster-autostop.service" in (fake / "systemctl.calls").read_text()
    assert not (units / "roll-cluster-autostop.service").exists() and not (tmp_path / "state").exists()


def test_on_alibaba_cloud_linux_the_sdk_gets_a_python_of_3_8_or_newer(node) -> None:
    """Alibaba Cloud Linux 3's python3 is 3.6, too old for the SDK: the step installs python39 and makes the
    virtualenv with it. (pip is pointed at an index that does not exist: this test stays offline and stops there.)"""
    real = sys.executable
    too_old = "#!/bin/bash\n[[ \"$*\" == *version_info* ]] && exit 1\nexit 127\n"  # python3 3.6: fails the check
    for name in ("python3", "python3.8", "python3.10", "python3.11", "python3.12"):
        (node.bin / name).write_text(too_old)
        (node.bin / name).chmod(0o755)
    # python3.9 exists once dnf installed python39 (the dnf stand-in records installed packages).
    (node.bin / "python3.9").write_text(
        f"#!/bin/bash\ngrep -qw python39 \"$STANDIN_STATE/packages\" 2>/dev/null || exit 127\nexec {real} \"$@\"\n")
    (node.bin / "python3.9").chmod(0o755)
    sdk = node.root / "opt" / "autostop-sdk"
    result = node.run_step("autostop-sdk", list(AUTOSTOP_SCRIPTS), AUTOSTOP_ACTION="sdk", AUTOSTOP_SDK_DIR=str(sdk),
                           AUTOSTOP_SDK_REQUIREMENTS_B64=file_b64(SDK_REQUIREMENTS), RETRY_ATTEMPTS="1",
                           PIP_INDEX_URL=f"file://{node.root}/no-index")
    assert result.returncode != 0 and "pip could not install Alibaba's SDK" in result.output, result
    assert "python39" in node.installed_packages()
    assert f"python3.9 -m venv -- {sdk}" in result.output, result
    assert not (sdk / "requirements.sha256").exists()  # no marker: the next run installs again
