"""Issue 18: the job step finds the newest complete checkpoint of the job and hands it over, and returns only once
the job reached its first training step (the start gate), against the stand-in Jobs API of test_job_resubmit.py.
Also the finder itself (checkpoint_find.sh) on trees laid out as each framework writes them."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from script_harness import FakeNode, Result, assert_failed, assert_ok
from test_job_resubmit import jobs_api

from infra.frameworks import RollAdapter
from infra.frameworks.base import DOWNLOAD_PATTERN

FINDER = Path(__file__).resolve().parents[2] / "infra" / "scripts" / "checkpoint_find.sh"
ROLL_MARKER = "pipeline step 0 finished"  # roll/pipeline/agentic/agentic_pipeline.py at ROLL 8eb27cc
# see verified-facts#test-start-gate-agentic-pipeline


def gate(node: FakeNode, tmp_path: Path, state: Path, **env: str) -> Result:
    settings = {
        "CONTAINER_NAME": "rc", "DASHBOARD_PORT": "8265", "JOB_ID": "roll-dev-1", "JOB_ENTRYPOINT": "python3 train.py",
        "JOB_WORKDIR": str(tmp_path), "JOB_SETTLE_S": "0", "JOB_POLL_INTERVAL_S": "0", "JOB_RESUBMIT_DELAY_S": "0",
        "JOB_GATE_POLL_S": "0", "JOB_FIRST_STEP_PATTERN": RollAdapter.first_step_pattern,
        "JOB_DOWNLOAD_PATTERN": DOWNLOAD_PATTERN, "JOB_START_GATE_S": "600",
        "PYTHONPATH": str(tmp_path / "stub"), "JOBS_STATE": str(state), "SUBMITTED_JOBS_DIR": str(tmp_path / "marks"),
    }
    return node.run_step("job", ["ray_common.sh", "checkpoint_find.sh", "job_submit.sh"], **{**settings, **env})


def test_the_gate_passes_once_the_job_printed_its_first_step(node: FakeNode, tmp_path: Path) -> None:
    state = jobs_api(node, tmp_path, ("RUNNING", "", f"loading\n(driver) {ROLL_MARKER}\n"))
    result = gate(node, tmp_path, state)
    assert_ok(result)
    assert "job roll-dev-1 reached training step 0" in result.stdout


def test_a_job_that_dies_before_its_first_step_fails_the_step_with_its_log(node: FakeNode, tmp_path: Path) -> None:
    log = "Traceback (most recent call last):\nFileNotFoundError: /mnt/shared/checkpoints/dev/roll/20261125-101010\n"
    state = jobs_api(node, tmp_path, ("FAILED", "Job entrypoint command failed with exit code 1", log))
    result = gate(node, tmp_path, state)
    assert_failed(result, "job roll-dev-1 is FAILED before its first training step",
                  "FileNotFoundError: /mnt/shared/checkpoints/dev/roll/20261125-101010")


def test_a_job_still_downloading_at_the_bound_fails_the_step_and_says_so(node: FakeNode, tmp_path: Path) -> None:
    state = jobs_api(node, tmp_path, ("RUNNING", "", "Downloading Model to directory: /root/.cache/modelscope\n"))
    result = gate(node, tmp_path, state, JOB_START_GATE_S="1")
    assert_failed(result, "job roll-dev-1 has not reached its first training step within 1s",
                  "it is downloading and keeps running")


def test_a_running_job_that_prints_nothing_is_stopped_and_fails_the_gate(node: FakeNode, tmp_path: Path) -> None:
    state = jobs_api(node, tmp_path, ("RUNNING", "", "(driver) initializing NCCL\n"))
    result = gate(node, tmp_path, state, JOB_STALL_S="1", JOB_STOP_WAIT_S="30")
    assert_failed(result, "job roll-dev-1 made no progress: no new log output for",
                  "(training.noProgressMinutes: 1s)", "it was stopped", "(driver) initializing NCCL")
    jobs = json.loads(state.read_text())
    assert jobs["stopped"] == ["roll-dev-1"] and jobs["jobs"][0]["status"] == "STOPPED"


def test_a_job_that_keeps_printing_is_not_stopped_and_the_gate_reports_its_progress(
    node: FakeNode, tmp_path: Path
) -> None:
    state = jobs_api(node, tmp_path, ("RUNNING", "", "loading shards\n{grows}"))
    result = gate(node, tmp_path, state, JOB_STALL_S="5", JOB_START_GATE_S="2", JOB_GATE_REPORT_S="0")
    assert_failed(result, "has not reached its first training step within 2s", "keeps running")
    assert "made no progress" not in result.stdout
    # The progress line, and how long ago the job printed (each look found a new line).
    assert re.search(r"job roll-dev-1: starting, [0-9]+s of 2s, last output [01]s ago", result.stdout)
    assert "stopped" not in json.loads(state.read_text())


def test_without_a_first_step_line_the_step_only_watches_the_job_start(node: FakeNode, tmp_path: Path) -> None:
    state = jobs_api(node, tmp_path, ("RUNNING", "", "no marker here\n"))
    result = gate(node, tmp_path, state, JOB_FIRST_STEP_PATTERN="")
    assert_ok(result)
    assert "job roll-dev-1 is RUNNING" in result.stdout


def test_the_newest_complete_checkpoint_is_handed_to_the_job(node: FakeNode, tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    (directory / "global_step_20" / "actor").mkdir(parents=True)  # no data.pt: incomplete
    for step in (5, 10):
        (directory / f"global_step_{step}" / "actor").mkdir(parents=True)
        (directory / f"global_step_{step}" / "actor" / "model_world_size_2_rank_0.pt").write_text("w")
        (directory / f"global_step_{step}" / "data.pt").write_text("d")
    state = jobs_api(node, tmp_path, ("RUNNING", "", ROLL_MARKER))
    result = gate(node, tmp_path, state, JOB_CHECKPOINT_LAYOUT="verl", JOB_CHECKPOINT_DIR=str(directory))
    assert_ok(result)
    found = str(directory / "global_step_10")
    assert f"job roll-dev-1 resumes from {found}" in result.stdout
    job = json.loads(state.read_text())["jobs"][0]
    assert job["entrypoint"].startswith(f"export ROLL_CLUSTER_RESUME_FROM={found} && ")
    assert job["metadata"] == {"roll_cluster.resume_from": found}


def test_with_no_checkpoint_the_job_starts_fresh_and_the_step_says_so(node: FakeNode, tmp_path: Path) -> None:
    state = jobs_api(node, tmp_path, ("RUNNING", "", ROLL_MARKER))
    result = gate(node, tmp_path, state, JOB_CHECKPOINT_LAYOUT="roll", JOB_CHECKPOINT_DIR=str(tmp_path / "none"))
    assert_ok(result)
    assert "starts fresh: no complete roll checkpoint under" in result.stdout
    job = json.loads(state.read_text())["jobs"][0]
    assert "ROLL_CLUSTER_RESUME_FROM" not in job["entrypoint"]
    assert job["metadata"] == {"roll_cluster.resume_from": "fresh"}


# ------------------------------------------------------------------------------------------------- the finder
def latest(layout: str, directory: Path, world: int = 0) -> str:
    script = f'source {FINDER}\nlatest_checkpoint "$@"'
    return subprocess.run(["bash", "-c", script, "finder", layout, str(directory), str(world)],
                          check=True, capture_output=True, text=True).stdout.strip()


def roll_checkpoint(root: Path, run: str, step: int, complete: bool = True) -> Path:
    path = root / run / f"checkpoint-{step}"
    (path / "pipeline").mkdir(parents=True)
    (path / "model.safetensors").write_text("w")
    if complete:
        (path / "pipeline" / "worker_state_pipeline.json").write_text("{}")
    return path


def test_roll_newest_launch_then_highest_step_and_only_complete_ones(tmp_path: Path) -> None:
    roll_checkpoint(tmp_path, "20261120-090000", 90)
    roll_checkpoint(tmp_path, "20261121-090000", 9)
    wanted = roll_checkpoint(tmp_path, "20261121-090000", 19)
    roll_checkpoint(tmp_path, "20261121-090000", 29, complete=False)  # the upload was cut
    roll_checkpoint(tmp_path, "20261122-090000", 5, complete=False)  # a newer launch that never completed one
    roll_checkpoint(tmp_path, "not-a-launch", 99)
    assert latest("roll", tmp_path) == str(wanted)
    assert latest("roll", tmp_path / "missing") == ""


def test_verl_needs_data_pt_and_a_saved_actor(tmp_path: Path) -> None:
    for step, files in ((3, ["data.pt", "actor/m.pt"]), (12, ["data.pt", "actor/m.pt"]), (20, ["data.pt"]),
                        (30, ["actor/m.pt"])):
        for name in files:
            (tmp_path / f"global_step_{step}" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / f"global_step_{step}" / name).write_text("x")
    assert latest("verl", tmp_path) == str(tmp_path / "global_step_12")


@pytest.mark.parametrize(
    ("shards", "critic", "found"),
    [(2, True, True), (1, True, False), (2, False, False), (2, None, True)],
)
def test_openrlhf_takes_a_tag_when_every_shard_and_the_critics_save_are_there(
    tmp_path: Path, shards: int, critic: bool | None, found: bool
) -> None:
    tag = tmp_path / "_actor" / "global_step20"
    tag.mkdir(parents=True)
    (tmp_path / "_actor" / "latest").write_text("global_step20")
    (tag / "mp_rank_00_model_states.pt").write_text("m")
    for rank in range(shards):
        (tag / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_text("o")
    if critic is not None:
        (tmp_path / "_critic" / "global_step20").mkdir(parents=True)
        if critic:
            (tmp_path / "_critic" / "global_step20" / "mp_rank_00_model_states.pt").write_text("m")
    assert latest("openrlhf", tmp_path, world=2) == (str(tag) if found else "")
