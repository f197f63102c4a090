"""OpenRLHF's reward server on the head: Ray leaves its GPUs out unless the roles are colocated with it, the job's
placement must fit the GPUs Ray has, and the reward URL names the head without knowing its address, so the
job's configuration is known in a first `pulumi preview`."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from offline_helpers import env_of, run, step_command

from devtools.offline_cloud import OfflineCloud
from infra.config import ConfigError
from infra.node.remote import SCRIPTS_DIR

# Not colocated: actor and ref share 8 GPUs, vLLM 3 engines x TP 2 = 6: 14 of the 15 GPUs Ray has (2 x 8 less the
# reward server's one on the head).
SEPARATE: dict[str, Any] = {"roll-cluster:training": {"overrides": {
    "train.colocate_all": False, "train.colocate_actor_ref": True, "vllm.enable_sleep": False,
    "ds.enable_sleep": False, "actor.num_nodes": 1, "ref.num_nodes": 1, "vllm.num_engines": 3,
    "vllm.gpu_memory_utilization": 0.9}}}


def with_overrides(**overrides: Any) -> dict[str, Any]:
    return {"roll-cluster:training": {"overrides": {**SEPARATE["roll-cluster:training"]["overrides"], **overrides}}}


def test_without_colocate_all_the_heads_ray_announces_and_hands_out_only_the_gpus_the_reward_server_leaves():
    result = run("openrlhf", config=SEPARATE)
    head = env_of(step_command(result, "node-0-ray-head"))
    worker = env_of(step_command(result, "node-1-ray-worker"))
    ready = env_of(step_command(result, "ray-ready"))
    server = env_of(step_command(result, "reward-server"))
    assert server["REWARD_COMMAND"].startswith("export CUDA_VISIBLE_DEVICES=7 ")
    # `ray start --num-gpus=7` with CUDA_VISIBLE_DEVICES=0..6: GPU 7 is never Ray's to hand out.
    assert (head["NUM_GPUS"], head["RAY_CUDA_VISIBLE_DEVICES"]) == ("7", "0,1,2,3,4,5,6")
    assert worker["NUM_GPUS"] == "8" and "RAY_CUDA_VISIBLE_DEVICES" not in worker
    assert (ready["GPUS_PER_NODE"], ready["HEAD_GPUS"]) == ("8", "7")
    two_gpus = {"roll-cluster:training": {**SEPARATE["roll-cluster:training"],
                                          "openrlhf": {"rewardServer": {"gpus": 2}}}}
    two = env_of(step_command(run("openrlhf", config=two_gpus), "node-0-ray-head"))
    assert (two["NUM_GPUS"], two["RAY_CUDA_VISIBLE_DEVICES"]) == ("6", "0,1,2,3,4,5")


def test_with_colocate_all_the_server_shares_the_heads_gpus_and_ray_keeps_them_all():
    result = run("openrlhf")  # the shipped stack: train.colocate_all, vLLM at 0.5 of the memory
    head = env_of(step_command(result, "node-0-ray-head"))
    assert head["NUM_GPUS"] == "8" and "RAY_CUDA_VISIBLE_DEVICES" not in head
    assert env_of(step_command(result, "ray-ready"))["HEAD_GPUS"] == "8"


def test_leaving_the_reward_gpus_out_is_a_ray_setting_change_that_restarts_ray_and_the_job():
    shared, separate = run("openrlhf"), run("openrlhf", config=SEPARATE)
    generations = [env_of(step_command(r, "node-1-ray-worker"))["RAY_GENERATION"] for r in (shared, separate)]
    assert generations[0] != generations[1]  # the head's settings changed: workers rejoin, the gate and job rerun
    assert env_of(step_command(separate, "training-job"))["RAY_GENERATION"] == generations[1]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # vLLM alone: 8 x 2 = 16 GPUs, the cluster's 16 but Ray's 15.
        ({"vllm.num_engines": 8},
         "roll-cluster:training.overrides.vllm.num_engines: vLLM engines x tensor parallel size must fit the 15 GPUs "
         "Ray has: the cluster's 16 GPUs (2 x 8) less the reward server's 1 on the head "
         "(roll-cluster:training.openrlhf.rewardServer.gpus)"),
        # actor and ref 8 + vLLM 4 x 2 = 16 of Ray's 15.
        ({"vllm.num_engines": 4},
         "roll-cluster:training.overrides.actor.num_nodes: the roles need 16 GPUs (actor 8, vLLM 8), more than the "
         "15 GPUs Ray has"),
    ],
)
def test_a_placement_that_needs_the_reward_servers_gpus_is_refused_at_plan_time_naming_its_key(overrides, message):
    cloud = OfflineCloud()
    with pytest.raises(ConfigError, match=re.escape(message)):
        run("openrlhf", cloud=cloud, config=with_overrides(**overrides))
    assert cloud.resources == []


def test_job_config_is_known_in_a_first_preview_with_a_reward_server():
    # A first preview: no instance exists, so the head's private IP is unknown. The job does not depend on it.
    previewed = run("openrlhf", cloud=OfflineCloud(preview=True)).notes.get("job_spec")
    assert previewed is not None
    assert '--reward.remote_url "http://${ROLL_CLUSTER_HEAD_IP}:5001/get_reward"' in previewed.entrypoint
    deployed = run("openrlhf")
    assert previewed == deployed.notes["job_spec"]
    assert deployed.outputs["jobConfig"]["command"] == previewed.entrypoint


def test_the_submitted_job_gets_the_heads_address_in_its_reward_url(tmp_path: Path):
    """The submit client (ray_job_client.py) against a stand-in Jobs API: the entrypoint Ray would run
    with /bin/sh, run here with a printf for python3, passes OpenRLHF the head's private IP."""
    result = run("openrlhf")
    head_ip = result.outputs["nodes"][0]["privateIp"]
    env = env_of(step_command(result, "training-job"))
    stub = tmp_path / "stub" / "ray"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    (stub / "job_submission.py").write_text(
        "import os\n"
        "class JobSubmissionClient:\n"
        "    def __init__(self, address):\n"
        "        pass\n"
        "    def submit_job(self, entrypoint, submission_id, runtime_env, metadata=None):\n"
        "        open(os.environ['SUBMITTED'], 'w').write(entrypoint)\n"
    )
    submitted = tmp_path / "entrypoint"
    entry = env["JOB_ENTRYPOINT"].replace("python3 -m openrlhf.cli.train_ppo_ray", "printf '%s\\n'")
    done = subprocess.run(
        ["python3", str(SCRIPTS_DIR / "ray_job_client.py"), "submit", "job-1"],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": str(stub.parent), "SUBMITTED": str(submitted),
             "RAY_JOB_API": "http://127.0.0.1:1", "JOB_ENTRYPOINT": entry, "JOB_WORKDIR": str(tmp_path),
             "JOB_HEAD_IP": env["JOB_HEAD_IP"], "ROLL_CLUSTER_LOG_DIR": str(tmp_path / "log"),
             "ROLL_CLUSTER_STEP": "job"},
        capture_output=True, text=True, check=False,
    )
    assert done.returncode == 0, done.stderr
    words = subprocess.run(["sh", "-c", submitted.read_text()], env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert words[words.index("--reward.remote_url") + 1] == f"http://{head_ip}:5001/get_reward"


def ray_settings_text(tmp_path: Path, **env: str) -> str:
    done = subprocess.run(
        ["bash", "-c", f'source {SCRIPTS_DIR / "lib.sh"}; source {SCRIPTS_DIR / "ray_common.sh"}; '
                       'ray_settings_text ray start --head --num-gpus="$NUM_GPUS"'],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "ROLL_CLUSTER_LOG_DIR": str(tmp_path / "log"),
             "ROLL_CLUSTER_STEP": "t", **env},
        capture_output=True, text=True, check=True,
    )
    return done.stdout


def test_the_ray_gpus_are_a_recorded_setting_named_when_they_change(tmp_path: Path):
    every = ray_settings_text(tmp_path, NUM_GPUS="8")
    assert "CUDA_VISIBLE_DEVICES" not in every  # a node that never had the setting keeps its record as it was
    fewer = ray_settings_text(tmp_path, NUM_GPUS="7", RAY_CUDA_VISIBLE_DEVICES="0,1,2,3,4,5,6")
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6\n" in fewer
    named = subprocess.run(
        ["bash", "-c", f'source {SCRIPTS_DIR / "lib.sh"}; source {SCRIPTS_DIR / "ray_common.sh"}; '
                       'settings_differences "$OLD" "$NEW"'],
        env={"PATH": "/usr/bin:/bin", "ROLL_CLUSTER_LOG_DIR": str(tmp_path / "log"), "ROLL_CLUSTER_STEP": "t",
             "OLD": every, "NEW": fewer},
        capture_output=True, text=True, check=True,
    ).stdout
    assert named == "--num-gpus, CUDA_VISIBLE_DEVICES"
