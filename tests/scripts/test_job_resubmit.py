"""The job step (job_submit.sh) against a stand-in Jobs API: a job that Ray failed before its entrypoint ran, because
its supervisor landed on a node that had just died (a rebooted node Ray still counted alive), is deleted and
submitted again; a job whose entrypoint failed is not, and the step fails naming it.

The stand-in is a `ray.job_submission` module on the container's PYTHONPATH whose answers come from a script file:
one line per submission, the state that submission ends in and its message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from script_harness import FakeNode, Result, assert_failed, assert_ok

LOST = ("Unexpected error occurred: The actor died unexpectedly before finishing this task. The actor died because "
        "its node has died. Node Id: 7dd0 the actor's node was terminated unexpectedly: health check failed due to "
        "missing too many heartbeats The actor never ran - it was cancelled before it started running.")

STUB = '''
import json, os
from types import SimpleNamespace

STATE = os.environ["JOBS_STATE"]

def _load():
    return json.load(open(STATE))

def _save(state):
    json.dump(state, open(STATE, "w"))

class JobSubmissionClient:
    def __init__(self, address):
        pass

    def list_jobs(self):
        state = _load()
        return [SimpleNamespace(submission_id=j["id"], status=SimpleNamespace(value=j["status"]))
                for j in state["jobs"]]

    def submit_job(self, entrypoint, submission_id, runtime_env=None, metadata=None):
        state = _load()
        if any(j["id"] == submission_id for j in state["jobs"]):
            raise RuntimeError("Job with submission_id " + submission_id + " already exists")
        status, message, *log = state["script"][len(state["submitted"])]
        state["submitted"].append(submission_id)
        state["jobs"].append({"id": submission_id, "status": status, "message": message,
                              "log": log[0] if log else "log of " + submission_id + "\\n",
                              "entrypoint": entrypoint, "metadata": metadata})
        _save(state)

    def get_job_info(self, submission_id):
        return SimpleNamespace(message=[j for j in _load()["jobs"] if j["id"] == submission_id][0]["message"])

    def get_job_logs(self, submission_id):
        state = _load()
        job = [j for j in state["jobs"] if j["id"] == submission_id][0]
        if "{grows}" in job["log"]:  # a job that prints a new line every time it is looked at
            job["reads"] = job.get("reads", 0) + 1
            _save(state)
            return job["log"].replace("{grows}", "".join("line %d\\n" % n for n in range(job["reads"])))
        return job["log"]

    def stop_job(self, submission_id):
        state = _load()
        for job in state["jobs"]:
            if job["id"] == submission_id and job["status"] in ("PENDING", "RUNNING"):
                job["status"] = "STOPPED"
        state.setdefault("stopped", []).append(submission_id)
        _save(state)

    def delete_job(self, submission_id):
        state = _load()
        state["jobs"] = [j for j in state["jobs"] if j["id"] != submission_id]
        state["deleted"].append(submission_id)
        _save(state)
'''


def jobs_api(node: FakeNode, tmp_path: Path, *script: tuple[str, ...]) -> Path:
    package = tmp_path / "stub" / "ray"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "job_submission.py").write_text(STUB)
    state = tmp_path / "jobs.json"
    state.write_text(json.dumps({"script": list(script), "submitted": [], "jobs": [], "deleted": []}))
    node.set_state("docker/containers/rc", "true")
    return state


def submit(node: FakeNode, tmp_path: Path, state: Path, **gate: str) -> Result:
    return node.run_step(
        "job", ["ray_common.sh", "job_submit.sh"],
        CONTAINER_NAME="rc", DASHBOARD_PORT="8265", JOB_ID="custom-multi-1", JOB_ENTRYPOINT="sleep 3600",
        JOB_WORKDIR=str(tmp_path), JOB_SETTLE_S="0", JOB_POLL_INTERVAL_S="0", JOB_RESUBMIT_DELAY_S="0",
        PYTHONPATH=str(tmp_path / "stub"), JOBS_STATE=str(state), SUBMITTED_JOBS_DIR=str(tmp_path / "marks"), **gate,
    )


def test_a_job_lost_with_a_dead_node_before_it_ran_is_submitted_again(node: FakeNode, tmp_path: Path) -> None:
    state = jobs_api(node, tmp_path, ("FAILED", LOST), ("RUNNING", ""))
    result = submit(node, tmp_path, state)
    assert_ok(result)
    jobs = json.loads(state.read_text())
    assert jobs["submitted"] == ["custom-multi-1", "custom-multi-1"] and jobs["deleted"] == ["custom-multi-1"]
    assert "failed before it ran: Ray placed its supervisor on a node that had just died" in result.stdout
    assert "job custom-multi-1 is RUNNING" in result.stdout
    assert (tmp_path / "marks" / "custom-multi-1").exists()  # jobStatus says LOST, not "never submitted", later


# Gated: the wait for the first training step (the start gate) tells a lost job from a failed one as well.
@pytest.mark.parametrize("gate", [{}, {"JOB_FIRST_STEP_PATTERN": "step [0-9]+", "JOB_START_GATE_S": "60"}])
def test_a_job_lost_every_time_fails_after_the_attempts(node: FakeNode, tmp_path: Path, gate: dict[str, str]) -> None:
    state = jobs_api(node, tmp_path, *[("FAILED", LOST)] * 3)
    result = submit(node, tmp_path, state, **gate)
    assert_failed(result, "job: FAILED: job custom-multi-1 failed before it ran, 3 times", "ray status")
    assert len(json.loads(state.read_text())["submitted"]) == 3


def test_a_job_whose_entrypoint_failed_is_not_submitted_again(node: FakeNode, tmp_path: Path) -> None:
    state = jobs_api(node, tmp_path, ("FAILED", "Job entrypoint command failed with exit code 1"), ("RUNNING", ""))
    result = submit(node, tmp_path, state)
    assert_failed(result, "job custom-multi-1 is FAILED right after its submission", "log of custom-multi-1")
    assert json.loads(state.read_text())["submitted"] == ["custom-multi-1"]
