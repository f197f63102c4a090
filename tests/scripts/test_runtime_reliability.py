"""Issue 11: a cluster that stays right. Bounded probes, recorded Ray settings, reboots, teardown, quiet SSH.

The shell parts run for real (bash, the node scripts rendered as pulumi-command runs them); the program parts
run under the offline cloud.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from offline_helpers import LOCAL, REMOTE, env_of, run
from script_harness import FakeNode

from components.bootstrap import container_command
from devtools import plan
from devtools.offline_cloud import is_secret, reveal, unwrap
from infra.node import remote, steps
from infra.node.remote import SCRIPTS_DIR
from infra.ray import step_env

LIB = SCRIPTS_DIR / "lib.sh"
STANDINS = Path(__file__).resolve().parents[1] / "standins"


def run_lib(
    snippet: str, tmp_path: Path, timeout: float = 60, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", f"source {LIB}\n{snippet}"],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "ROLL_CLUSTER_LOG_DIR": str(tmp_path / "log"),
             "ROLL_CLUSTER_STEP": "probe-test", "NODE_NAME": "node-0", **env},
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    return result, time.monotonic() - started


def leftover(marker: str) -> bool:
    return marker in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


# ------------------------------------------------------------------------------------ 4. bounded probes
def test_a_wait_whose_probe_hangs_fails_at_its_bound_and_the_hung_probe_is_killed(tmp_path: Path) -> None:
    marker = f"sleep 9{uuid.uuid4().int % 10**6}"  # a unique command line to look for afterwards
    snippet = f"hung_probe() {{ bash -c '{marker}'; }}\nwait_for 'the hung daemon' 4 1 hung_probe"
    result, seconds = run_lib(snippet, tmp_path, PROBE_TIMEOUT_S="3")
    assert result.returncode == 1, result
    assert "timed out after 4s waiting for the hung daemon" in result.stderr
    assert "did not answer within" in result.stdout and "cut off" in result.stdout
    # The bound (4 s) is exceeded by at most one probe timeout (3 s), never by the probe's own 900000 s.
    assert seconds < 4 + 3 + 1, seconds
    time.sleep(0.5)
    assert not leftover(marker), "the hung probe's processes outlive the wait"


def test_a_probe_that_hangs_once_is_cut_and_the_wait_goes_on_to_success(tmp_path: Path) -> None:
    flag = tmp_path / "hung-once"
    snippet = (f"probe() {{ if [[ ! -e {flag} ]]; then touch {flag}; sleep 600; fi; }}\n"
               "wait_for 'the daemon' 20 1 probe && echo READY")
    result, seconds = run_lib(snippet, tmp_path, PROBE_TIMEOUT_S="2")
    assert result.returncode == 0 and "READY" in result.stdout, result
    assert 2 <= seconds < 8, seconds


def test_gpu_ready_cuts_an_ssh_session_that_hangs_and_goes_on(node: FakeNode) -> None:
    node.set_state("nvidia-smi-gpus", "2")
    node.set_state("ssh-hang-calls", "1")  # the node accepts the connection, then freezes once
    started = time.monotonic()
    result = node.run_gpu_ready(GPU_DRIVER="preinstalled", SSH_PROBE_TIMEOUT_S="2")
    assert result.returncode == 0, result
    assert "ssh probe cut off after 2s" in result.stdout and time.monotonic() - started < 10
    assert len(node.calls("ssh")) == 2


def test_bounded_keeps_the_probes_output_and_status(tmp_path: Path) -> None:
    result, _ = run_lib("out=$(bounded 5 bash -c 'echo hello; exit 3') || echo \"status $? $out\"", tmp_path)
    assert "status 3 hello" in result.stdout, result


# ------------------------------------------------------------------- 2. changed settings are applied
RAY_COMMON = SCRIPTS_DIR / "ray_common.sh"


def ray_common(snippet: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", f"source {LIB}\nsource {RAY_COMMON}\n{snippet}"],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "ROLL_CLUSTER_LOG_DIR": str(tmp_path / "log"), **env},
        capture_output=True, text=True, timeout=30, check=False,
    )


def test_the_settings_record_holds_a_digest_of_the_secrets_never_their_values(tmp_path: Path) -> None:
    snippet = 'ray_settings_text ray start --head --object-store-memory=1000'
    env = {"RAY_EXTRA_ENV_NAMES": "WANDB_API_KEY", "NODE_RANK": "0", "RAY_GENERATION": "g1"}
    first = ray_common(snippet, tmp_path, WANDB_API_KEY="wandb-secret-one", **env)
    rotated = ray_common(snippet, tmp_path, WANDB_API_KEY="wandb-secret-two", **env)
    assert first.returncode == 0 and "wandb-secret" not in first.stdout + first.stderr, first
    assert "--object-store-memory=1000" in first.stdout and "sha256 of the values of WANDB_API_KEY=" in first.stdout
    assert first.stdout != rotated.stdout  # a rotated secret is a changed setting


def test_what_differs_is_named_by_setting(tmp_path: Path) -> None:
    old = "ray\nstart\n--object-store-memory=1000\n--port=6379\nsha256 of the values of WANDB_API_KEY=aa"
    new = "ray\nstart\n--object-store-memory=2000\n--port=6379\nsha256 of the values of WANDB_API_KEY=bb"
    result = ray_common('settings_differences "$OLD" "$NEW"', tmp_path, OLD=old, NEW=new)
    assert result.stdout == "--object-store-memory, the values of WANDB_API_KEY", result
    result = ray_common('settings_differences "" "$NEW"', tmp_path, NEW=new)
    assert result.stdout == "no record of the settings it runs with"


def _inputs(result: Any, name: str) -> Any:
    return unwrap(result.cloud.named(name).inputs)


def test_a_changed_ray_setting_reruns_ray_on_every_node_the_gate_and_the_job_but_keeps_the_containers() -> None:
    base = run("multi")
    bigger = run("multi", config={"roll-cluster:ray": {"objectStoreMemoryGb": 2}})
    for name in ("node-0-ray-head", "node-1-ray-worker", "ray-ready", "training-job"):
        assert _inputs(base, name)["stdin"] != _inputs(bigger, name)["stdin"], name
    for name in ("node-0-container", "node-1-container"):
        assert _inputs(base, name) == _inputs(bigger, name), name
    generation = env_of(str(_inputs(bigger, "node-1-ray-worker")["stdin"]))["RAY_GENERATION"]
    assert generation and generation == env_of(str(_inputs(bigger, "ray-ready")["stdin"]))["RAY_GENERATION"]
    assert generation != env_of(str(_inputs(base, "node-1-ray-worker")["stdin"]))["RAY_GENERATION"]


def test_a_rotated_secret_reruns_ray_the_gate_and_the_job_and_the_gate_learns_it_only_as_a_digest() -> None:
    one = run("multi", secrets={"roll-cluster:wandbApiKey": "wandb-rotation-one"})
    two = run("multi", secrets={"roll-cluster:wandbApiKey": "wandb-rotation-two"})
    gate_one, gate_two = (r.cloud.named("ray-ready").inputs["stdin"] for r in (one, two))
    assert is_secret(gate_one)
    assert reveal(gate_one) != reveal(gate_two) and "wandb-rotation" not in reveal(gate_two)
    for name in ("node-0-ray-head", "node-1-ray-worker", "training-job"):
        assert reveal(one.cloud.named(name).inputs["stdin"]) != reveal(two.cloud.named(name).inputs["stdin"])


def test_the_plan_says_which_changes_restart_ray_or_the_job_and_what_a_reboot_does(capsys: Any) -> None:
    assert plan.main(["--full", "multi"]) == 0
    text = capsys.readouterr().out
    assert "== What a later change or a reboot does" in text
    assert "ray.objectStoreMemoryGb" in text and "Ray restarts on every node" in text
    assert "rotated secret" in text and "the job is submitted again" in text
    assert "container.image" in text and "storage.nas" in text and "containers are recreated" in text
    assert "the head reboots" in text and "the running job ends" in text and "jobStatus" in text


# ------------------------------------------------------------------------------------------ 3. reboots
def depends_on_names(result: Any, name: str) -> set[str]:
    return {d._name for d in (result.cloud.options[name].depends_on or [])}


def test_nothing_talks_to_a_node_while_gpu_ready_may_reboot_it() -> None:
    result = run("multi")
    for node in ("node-0", "node-1"):
        assert f"{node}-gpu-ready" in depends_on_names(result, f"{node}-image")
        assert f"{node}-gpu-ready" in depends_on_names(result, f"{node}-docker-engine")
        assert f"{node}-gpu-ready" in depends_on_names(result, f"{node}-container")


def test_the_container_runs_the_supervisor_and_a_new_nas_recreates_it() -> None:
    result = run("multi")
    container = _inputs(result, "node-1-container")
    assert container["command"][:2] == ["bash", "-c"] and "start_from_record" in container["command"][2]
    assert container["restart"] == "unless-stopped"
    assert result.cloud.options["node-1-container"].delete_before_replace is True
    assert any(e.startswith("ROLL_CLUSTER_NAS=") and e.endswith(".nas.aliyuncs.com") for e in container["envs"])
    docker_step = env_of(str(_inputs(result, "node-1-docker")["stdin"]))
    assert docker_step["MOUNTS"] == "/data /mnt/shared"


def test_ray_stop_never_kills_the_containers_main_process() -> None:
    # `ray stop` matches these in full command lines (Ray 2.48: ray/autoscaler/_private/constants.py RAY_PROCESSES,
    # the entries filtered "by args"; ray/scripts/scripts.py stop()).
    keywords = ("monitor.py", "ray.util.client.server", "default_worker.py", "setup_worker.py", "ray::",
                "io.ray.runtime.runner.worker.DefaultWorker", "log_monitor.py", "reporter.py", "dashboard/agent.py",
                "dashboard/dashboard.py", "runtime_env/agent/main.py", "ray_process_reaper.py")
    text = " ".join(container_command())
    assert not [k for k in keywords if k in text]


# What a fake head's GCS does: accept connections on the port given, until killed.
GCS_LISTENER_PY = (
    "import socket, sys, time\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1])))\n"
    "s.listen()\n"
    "time.sleep(3600)\n"
)


class FakeRay:
    """A `ray` on PATH whose `start` records its arguments and environment and starts a process named raylet
    (and, given --port, a fake GCS listening there); its other commands (`status`) succeed and do nothing."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir(parents=True)
        self.calls = root / "ray-calls"
        shutil.copy(shutil.which("sleep") or "/bin/sleep", self.bin / FAKE_RAYLET)
        ray = self.bin / "ray"
        ray.write_text(
            "#!/bin/bash\n"
            '[[ "$1" == start ]] || exit 0\n'
            f'printf "%s NODE_RANK=%s SECRET_SET=%s LD_PRELOAD=%s\\n" "$*" "$NODE_RANK" "${{WANDB_API_KEY:+yes}}" '
            f'"${{LD_PRELOAD:-}}" >>{self.calls}\n'
            f"setsid {self.bin}/{FAKE_RAYLET} {RAYLET_MARKER} </dev/null >/dev/null 2>&1 &\n"
            'for arg in "$@"; do\n'
            '  [[ "$arg" == --port=* ]] || continue\n'
            f'  setsid {shlex.quote(os.path.realpath(shutil.which("python3") or "/usr/bin/python3"))} -c '
            f'{shlex.quote(GCS_LISTENER_PY)} "${{arg#--port=}}" {self.bin}/gcs </dev/null >/dev/null 2>&1 &\n'
            "done\n"
        )
        ray.chmod(0o755)

    def starts(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []

    def kill(self) -> None:
        """End this fake's raylets and GCS (their command lines name this fake's directory; no other test's)."""
        subprocess.run(["pkill", "-f", re.escape(str(self.bin)) + "/"], check=False)


RAYLET_MARKER = "31337"
FAKE_RAYLET = "rc-test-raylet"  # not `raylet`: this machine may run real Ray (the real-host tier)


def wait_until(predicate: Any, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def write_record(record_dir: Path, role: str, head: str, args: list[str]) -> None:
    record_dir.mkdir(parents=True, exist_ok=True)
    quoted = " ".join(shlex.quote(a) for a in args)
    (record_dir / "start").write_text(
        f"RAY_ROLE={role}\nRAY_HEAD_ADDRESS={head}\nexport NODE_RANK=1\nexport WANDB_API_KEY=s3\n"
        f"RAY_START_ARGS=( {quoted} )\n"
    )


def test_the_container_main_process_restarts_ray_from_the_record_and_a_worker_waits_for_its_head(
    tmp_path: Path,
) -> None:
    fake = FakeRay(tmp_path)
    record = tmp_path / "record"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    write_record(record, "worker", f"127.0.0.1:{port}", ["ray", "start", f"--address=127.0.0.1:{port}"])
    main = subprocess.Popen(
        container_command(),
        env={"PATH": f"{fake.bin}:/usr/local/bin:/usr/bin:/bin", "RAY_RECORD_DIR": str(record),
             "RAY_PAUSE_FILE": str(tmp_path / "pause"), "RAY_SUPERVISE_INTERVAL_S": "0.2",
             "RAY_RAYLET_NAME": FAKE_RAYLET},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        time.sleep(1.5)
        assert fake.starts() == []  # the head does not answer yet: a worker waits
        with socket.socket() as head:
            head.bind(("127.0.0.1", port))
            head.listen()
            assert wait_until(lambda: len(fake.starts()) == 1), fake.starts()
        assert fake.starts()[0] == f"start --address=127.0.0.1:{port} NODE_RANK=1 SECRET_SET=yes LD_PRELOAD="
        # Ray is running (a raylet exists): nothing more is started.
        time.sleep(1)
        assert len(fake.starts()) == 1
        # While a Ray step works (the pause file), a lost raylet is not restarted; afterwards it is.
        (tmp_path / "pause").touch()
        write_record(record, "head", "127.0.0.1:1", ["ray", "start", "--head"])
        fake.kill()
        time.sleep(1)
        assert len(fake.starts()) == 1
        (tmp_path / "pause").unlink()
        assert wait_until(lambda: len(fake.starts()) == 2), fake.starts()
        assert fake.starts()[1].startswith("start --head ")
        assert "supervising Ray" in (record / "supervisor.log").read_text()
    finally:
        os.killpg(main.pid, signal.SIGKILL)
        main.wait()
        fake.kill()


def a_loadable_library() -> str:
    """A shared library this machine really has (libm, as this interpreter maps it), to stand for jemalloc: the
    preload then loads without the dynamic loader's complaint."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "/libm.so" in path or "/libm-" in path:
            return path
    pytest.skip("no libm mapped in this interpreter")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.mark.parametrize("role", ["head", "worker"])
def test_after_a_reboot_ray_starts_exactly_as_the_ray_step_started_it_jemalloc_preload_included(
    node: FakeNode, tmp_path: Path, role: str
) -> None:
    """Ascend: the Ray step preloads the container's jemalloc for Ray (MindSpeed-RL). The restart by the container's
    main process after a reboot must start Ray the same way: same arguments, NODE_RANK, secrets and LD_PRELOAD."""
    fake = FakeRay(tmp_path / "fake-ray")
    (node.bin / "ray").symlink_to(fake.bin / "ray")  # `ray` on the node's PATH, as in the container
    # The step's look for Ray already running scans /proc: this test machine's, where other tests may run Ray.
    scan = node.bin / "container" / "python3"
    scan.write_text('#!/bin/bash\nif [[ "${1:-}" == -c && "${3:-}" =~ ^(gcs|all)$ ]]; then exit 0; fi\n'
                    'exec "${STANDIN_REAL_PYTHON:?}" "$@"\n')
    node.set_state("docker/containers/rl", "true")
    jemalloc = a_loadable_library()
    record, pause, port = tmp_path / "record", tmp_path / "pause", free_port()
    env = {"CONTAINER_NAME": "rl", "NODE_IP": "127.0.0.1", "GCS_PORT": str(port), "NUM_GPUS": "0",
           "RAY_RESOURCES": '{"NPU": 2}', "RAY_PRELOAD_JEMALLOC": "1",
           "JEMALLOC_CANDIDATES": f"{tmp_path}/absent/libjemalloc.so.2 {jemalloc}",
           "RAY_EXTRA_ENV_NAMES": "WANDB_API_KEY", "WANDB_API_KEY": "s3cret-value",
           "RAY_RECORD_DIR": str(record), "RAY_PAUSE_FILE": str(pause), "PROBE_TIMEOUT_S": "10"}
    head: socket.socket | None = None
    main: subprocess.Popen[bytes] | None = None
    try:
        if role == "head":
            step = step_env.HEAD_STEP
            env.update(DASHBOARD_PORT=str(free_port()), CLIENT_PORT=str(free_port()), NODE_RANK="0",
                       RAY_START_TIMEOUT_S="20")
        else:
            step = step_env.WORKER_STEP
            env.update(HEAD_IP="127.0.0.1", NODE_RANK="1", HEAD_WAIT_TIMEOUT_S="20", HEAD_POLL_INTERVAL_S="1")
            head = socket.socket()  # the head's GCS answers
            head.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            head.bind(("127.0.0.1", port))
            head.listen()
        result = node.run_step(step.step, list(step.scripts), **env)
        assert result.returncode == 0, result
        assert len(fake.starts()) == 1, fake.starts()
        by_step = fake.starts()[0]
        assert f"LD_PRELOAD={jemalloc}" in by_step and "SECRET_SET=yes" in by_step
        assert f"NODE_RANK={env['NODE_RANK']}" in by_step and "--resources={\"NPU\": 2}" in by_step
        assert "s3cret-value" not in " ".join(node.calls("docker"))  # read from the record in the container
        assert not pause.exists()  # the step resumed the supervision
        # The node reboots: Ray is gone, the container (and the record in it) comes back with its main process.
        fake.kill()
        main = subprocess.Popen(
            container_command(),
            env={"PATH": f"{fake.bin}:/usr/local/bin:/usr/bin:/bin", "RAY_RECORD_DIR": str(record),
                 "RAY_PAUSE_FILE": str(pause), "RAY_SUPERVISE_INTERVAL_S": "0.2", "RAY_RAYLET_NAME": FAKE_RAYLET},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        assert wait_until(lambda: len(fake.starts()) == 2), (record / "supervisor.log").read_text()
        assert fake.starts()[1] == by_step  # the very same start, jemalloc preload included
    finally:
        if main is not None:
            os.killpg(main.pid, signal.SIGKILL)
            main.wait()
        if head is not None:
            head.close()
        fake.kill()


def test_a_changed_jemalloc_preload_is_a_changed_ray_setting(tmp_path: Path) -> None:
    with_preload = ray_common("ray_settings_text ray start", tmp_path, RAY_PRELOAD_JEMALLOC="1")
    without = ray_common("ray_settings_text ray start", tmp_path, RAY_PRELOAD_JEMALLOC="0")
    result = ray_common('settings_differences "$OLD" "$NEW"', tmp_path, OLD=without.stdout, NEW=with_preload.stdout)
    assert result.stdout == "RAY_PRELOAD_JEMALLOC", result


@pytest.mark.parametrize("record", ["--num-gpus=8\n", None])
def test_the_recorded_ray_settings_read_empty_only_when_there_is_no_record(tmp_path: Path, record: str | None) -> None:
    state, record_dir = tmp_path / "state", tmp_path / "ray"
    container = state / "docker" / "containers" / "roll"  # tests/standins/docker: the container runs
    container.parent.mkdir(parents=True)
    container.write_text("true\n")
    record_dir.mkdir()
    if record is not None:
        (record_dir / "settings").write_text(record)
    env = {"PATH": f"{STANDINS}:/usr/local/bin:/usr/bin:/bin", "STANDIN_STATE": str(state), "CONTAINER_NAME": "roll",
           "RAY_RECORD_DIR": str(record_dir)}
    snippet = f"source {SCRIPTS_DIR / 'ray_common.sh'}\nrecorded_ray_settings"

    read, _ = run_lib(snippet, tmp_path, 60, **env)
    assert read.returncode == 0 and read.stdout == (record or ""), read

    # A read that fails is not "no record": taken as one, the Ray step would restart a Ray whose settings did not
    # change, ending its job.
    container.write_text("false\n")
    failed, _ = run_lib(snippet, tmp_path, 60, **env)
    assert failed.returncode != 0 and failed.stdout == "", failed


def test_docker_starts_after_the_data_disk_and_the_nas_are_mounted(node: FakeNode) -> None:
    dropins = node.root / "docker.service.d"
    result = node.run_step("docker", ["docker_mount_order.sh"], MOUNTS="/data /mnt/shared",
                           DOCKER_DROPIN_DIR=str(dropins))
    assert result.returncode == 0, result
    conf = (dropins / "roll-cluster-mounts.conf").read_text()
    assert "After=network-online.target remote-fs.target data.mount mnt-shared.mount" in conf
    assert "Wants=network-online.target data.mount mnt-shared.mount" in conf and "Requires" not in conf
    assert "daemon-reload" in node.calls("systemctl")
    again = node.run_step("docker", ["docker_mount_order.sh"], MOUNTS="/data /mnt/shared",
                          DOCKER_DROPIN_DIR=str(dropins))
    assert "already ordered" in again.stdout and node.calls("systemctl").count("daemon-reload") == 1


# ------------------------------------------------------------------------------ 5. teardown that finishes
def run_teardown(node: FakeNode, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(SCRIPTS_DIR / "local" / "teardown.sh")],
        env={**node.machine_env(), "HOST": "10.0.0.9", "NODE_NAME": "node-1", "ROLL_CLUSTER_STEP": "ray-head-delete",
             "ROLL_CLUSTER_LOG_DIR": str(node.root / "local-logs"), **env},
        capture_output=True, text=True, timeout=120, check=False,
    )
    return result, time.monotonic() - started


def test_teardown_of_a_node_that_is_gone_finishes_at_once_and_counts_as_done(node: FakeNode) -> None:
    node.set_state("ssh-down-calls", "1000")  # every ssh fails: the node was released
    result, seconds = run_teardown(node, REMOTE_COMMAND="touch should-not-run", REACH_TIMEOUT_S="5")
    assert result.returncode == 0, result
    assert "is gone" in result.stdout and "nothing left to stop" in result.stdout
    assert seconds < 2 * 5 + 5, seconds


def test_teardown_runs_the_delete_step_on_a_live_node_through_stdin(node: FakeNode) -> None:
    result, _ = run_teardown(node, REMOTE_COMMAND="echo stopped-it-on-the-node")
    assert result.returncode == 0 and "stopped-it-on-the-node" in result.stdout, result
    assert all("stopped-it" not in call for call in node.calls("ssh"))  # not on the ssh command line


def test_teardown_fails_loudly_when_the_delete_step_hangs_past_its_bound(node: FakeNode) -> None:
    result, seconds = run_teardown(node, REMOTE_COMMAND="sleep 600", TEARDOWN_TIMEOUT_S="2")
    assert result.returncode == 1 and "did not finish within 2s" in result.stderr, result
    assert seconds < 15


TEARDOWN_KNOWN_HOSTS = "/home/admin/.ssh/roll-cluster/dev.known_hosts"


def test_teardown_of_a_node_whose_host_key_changed_fails_naming_the_known_hosts_file(node: FakeNode) -> None:
    # Another machine answers at the node's address: it is not gone, and what the step stops may still run.
    node.set_state("ssh-host-key-changed", "")
    result, seconds = run_teardown(node, REMOTE_COMMAND="touch should-not-run", REACH_TIMEOUT_S="5",
                                   KNOWN_HOSTS_FILE=TEARDOWN_KNOWN_HOSTS, TEARDOWN_RESOURCE="node-1-ray-head-teardown")
    assert result.returncode == 1, result
    assert "is gone" not in result.stdout and "done" not in result.stdout.splitlines()[-1]
    assert "ray-head-delete: FAILED: the host key of 10.0.0.9 does not match" in result.stderr
    assert TEARDOWN_KNOWN_HOSTS in result.stderr and "does NOT count as gone" in result.stderr
    assert "pulumi state delete" in result.stderr and "node-1-ray-head-teardown" in result.stderr
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr  # the log tail shows ssh's own words
    assert len(node.calls("ssh")) == 1 and seconds < 5  # a refusal is not retried
    assert not (node.root / "home" / "should-not-run").exists()


def test_teardown_of_an_own_host_whose_host_key_changed_says_how_to_forget_the_old_key(node: FakeNode) -> None:
    node.set_state("ssh-host-key-changed", "")
    # The own host's key was recorded at first contact and is checked strictly since (infra/sources/hosts/probe.py).
    result, _ = run_teardown(node, REMOTE_COMMAND="true", KNOWN_HOSTS_FILE=TEARDOWN_KNOWN_HOSTS, SSH_PORT="2222",
                             HOST_KEY_CHECKING="yes", HOST_KEY_ORIGIN="recorded")
    assert result.returncode == 1, result
    assert f"ssh-keygen -R '[10.0.0.9]:2222' -f {TEARDOWN_KNOWN_HOSTS}" in result.stderr
    assert "pulumi state delete" not in result.stderr


def test_teardown_refused_by_the_node_fails_naming_the_key_and_the_user(node: FakeNode) -> None:
    node.set_state("ssh-error", "admin@10.0.0.9: Permission denied (publickey).\n")
    result, _ = run_teardown(node, REMOTE_COMMAND="true", SSH_USER="admin",
                             SSH_KEY_PATH="/home/admin/.ssh/roll-cluster/dev.agent-key.pub")
    assert result.returncode == 1, result
    assert "is gone" not in result.stdout
    assert "admin@10.0.0.9 refused the login key /home/admin/.ssh/roll-cluster/dev.agent-key.pub for user admin" in (
        result.stderr)
    assert "Permission denied (publickey)" in result.stderr and "ssh-add" in result.stderr


def test_teardown_with_no_recorded_host_key_fails_instead_of_counting_the_node_gone(node: FakeNode) -> None:
    # The destroy runs where the stack's known-hosts file is missing: strict checking refuses a node that answers.
    node.set_state("ssh-error", "No ED25519 host key is known for 10.0.0.9 and you have requested strict checking.\n"
                                "Host key verification failed.\n")
    result, _ = run_teardown(node, REMOTE_COMMAND="true", KNOWN_HOSTS_FILE=TEARDOWN_KNOWN_HOSTS)
    assert result.returncode == 1, result
    assert f"no host key of 10.0.0.9 is recorded for node node-1 in {TEARDOWN_KNOWN_HOSTS}" in result.stderr


@pytest.mark.parametrize("error", [
    "ssh: connect to host 10.0.0.9 port 22: Connection timed out",
    "ssh: connect to host 10.0.0.9 port 22: No route to host",
    "ssh: Could not resolve hostname node-1.example: Name or service not known",
    "kex_exchange_identification: read: Connection reset by peer",
    "Connection closed by 10.0.0.9 port 22",
])
def test_teardown_of_an_unreachable_node_counts_it_as_gone_and_says_why(node: FakeNode, error: str) -> None:
    node.set_state("ssh-error", error + "\n")
    result, _ = run_teardown(node, REMOTE_COMMAND="touch should-not-run", REACH_TIMEOUT_S="5")
    assert result.returncode == 0, result
    assert "is gone" in result.stdout and error in result.stdout  # each attempt names ssh's error
    assert len(node.calls("ssh")) == 2


def test_teardown_fails_on_an_ssh_error_it_cannot_read_as_unreachable(node: FakeNode) -> None:
    node.set_state("ssh-error", "Bad owner or permissions on /home/admin/.ssh/config\n")
    result, _ = run_teardown(node, REMOTE_COMMAND="true", REACH_TIMEOUT_S="5")
    assert result.returncode == 1 and "is gone" not in result.stdout, result
    assert "does not say the node is unreachable (Bad owner or permissions" in result.stderr


@pytest.mark.parametrize("stack", ["multi", "openrlhf"])
def test_every_delete_is_a_local_teardown_and_steps_on_running_nodes_dial_briefly(stack: str) -> None:
    result = run(stack)
    for resource in result.cloud.resources:
        if resource.type == REMOTE:
            assert "delete" not in resource.inputs, resource.name
            connection = unwrap(resource.inputs["connection"])
            if resource.name.endswith(("ray-head", "ray-worker", "ray-ready", "training-job", "reward-server")):
                assert connection["dialErrorLimit"] == steps.RUNNING_NODE_DIAL_ERROR_LIMIT, resource.name
        if resource.type == LOCAL and resource.name.endswith("-teardown"):
            env = unwrap(resource.inputs["environment"])
            assert int(env["REACH_ATTEMPTS"]) * int(env["REACH_TIMEOUT_S"]) <= 60
    teardowns = {r.name for r in result.cloud.of_type(LOCAL) if r.name.endswith("-teardown")}
    assert {"node-0-ray-head-teardown", "node-1-ray-worker-teardown", "training-job-teardown"} <= teardowns


# -------------------------------------------------------------------------------- 6. quieter, safer SSH
@pytest.mark.parametrize("stack", ["multi", "verl", "openrlhf"])
def test_no_command_asks_sshd_to_set_the_previous_output_as_environment(stack: str) -> None:
    result = run(stack)
    commands = [r for r in result.cloud.resources if r.type in (REMOTE, LOCAL)]
    assert commands
    for resource in commands:
        if resource.type == LOCAL and resource.name.endswith("-login-key"):
            # Local (no sshd involved): it reads its previous output, the key the node accepted (login_key.sh).
            assert resource.inputs.get("addPreviousOutputInEnv") in (True, "true"), resource.name
            continue
        assert resource.inputs.get("addPreviousOutputInEnv") in (False, "false"), resource.name


@pytest.mark.parametrize("stack", ["verl", "openrlhf"])
def test_secrets_reach_steps_only_as_exported_secrets_never_in_a_script_teardown_or_record(stack: str) -> None:
    values = {"roll-cluster:wandbApiKey": "wandb-never-shown-77", "roll-cluster:hfToken": "hf_never_shown_77"}
    result = run(stack, secrets=values)
    seen_in_a_step = False
    for resource in result.cloud.resources:
        for key, value in resource.inputs.items():
            text = reveal(value) if is_secret(value) else str(unwrap(value))
            if not any(v in text for v in values.values()):
                continue
            assert is_secret(value), (resource.name, key)
            # On the step's stdin, never in its command (sshd's `sh -c` argv, pulumi-command's error message).
            assert resource.type == REMOTE and key == "stdin", (resource.name, key)
            create = str(unwrap(resource.inputs["create"]))
            # A short constant: the runner with its session watcher (infra/node/remote.py stdin_command), no script.
            assert len(create) < 512 and not any(v in create for v in values.values()), resource.name
            seen_in_a_step = True
            # Only on the `export NAME=...` lines the login shell runs before `exec bash -c <script>`: never inside
            # the script text, which is the command line of the step's bash.
            for line in text.splitlines():
                if any(v in line for v in values.values()):
                    assert line.startswith(("export WANDB_API_KEY=", "export HF_TOKEN=")), (resource.name, line)
    assert seen_in_a_step


def run_stdin_command(step: str, text: str) -> subprocess.CompletedProcess[str]:
    """The exact command a remote step runs, through sh as sshd would, with `text` on its stdin."""
    return subprocess.run(["sh", "-c", remote.stdin_command(step)], input=text, capture_output=True, text=True,
                          timeout=30, check=False)


def test_a_step_whose_text_never_arrived_on_stdin_fails_naming_the_step() -> None:
    result = run_stdin_command("ray-head", "")
    assert result.returncode != 0
    assert "roll-cluster-ray-head: no script text arrived on stdin" in result.stderr


def test_the_step_runner_runs_the_text_on_its_stdin_and_keeps_its_exit_status() -> None:
    result = run_stdin_command("ray-head", "echo \"ran as $0\"\nexit 7\n")
    assert result.returncode == 7 and result.stdout == "ran as roll-cluster-ray-head\n", result
