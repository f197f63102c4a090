"""The Ray cluster and the training job under the offline cloud: each shipped stack's submission (ROLL dev,
multi and large with their generated configs, verl, OpenRLHF with its reward server), custom ports, scaling,
config changes that replace only the job, autoStart, teardown order and secrets."""

from __future__ import annotations

import base64
import io
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from offline_helpers import env_of, run, step_command

from devtools.offline_cloud import is_secret, reveal, unwrap


def job_env(result):
    return env_of(step_command(result, "training-job"))


def render_on_stand_in_head(result, tmp_path: Path) -> dict:
    """Write the job's files and run its pre-submit check the way job_submit.sh does on the head, in a temp
    directory standing in for /workspace/ROLL (a checkout with only the launchers), and read the YAML back: the
    file the launcher reads is the one built before deployment, nothing is rendered on the head."""
    env = job_env(result)
    assert env["JOB_PREPARE"] == ""
    checkout = tmp_path / "ROLL"
    (checkout / "examples").mkdir(parents=True)
    for pipeline in ("agentic", "rlvr"):
        (checkout / "examples" / f"start_{pipeline}_pipeline.py").write_text("")
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(env["JOB_FILES_B64"])), mode="r:gz") as archive:
        names = archive.getnames()
        for member in archive.getmembers():
            target = tmp_path / Path(member.name).relative_to("workspace")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.extractfile(member).read())
    name = env["JOB_ENTRYPOINT"].split("--config_name ")[1].split()[0]
    assert names == [f"workspace/ROLL/examples/pulumi/{name}.yaml"]
    done = subprocess.run(["bash", "-c", env["JOB_PRE_SUBMIT_CHECK"].replace("/workspace/ROLL", str(checkout))],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (checkout / "examples" / "pulumi" / f"{name}.yaml").read_text()
    assert text == result.cloud.named("training-job").inputs["triggers"][1]  # what `pulumi preview` shows
    return yaml.safe_load(text)


def test_dev_submits_roll_agentic_with_fp16_on_one_v100(tmp_path):
    result = run("dev")
    env = job_env(result)
    assert env["JOB_WORKDIR"] == "/workspace/ROLL"
    assert "examples/start_agentic_pipeline.py --config_path pulumi --config_name" in env["JOB_ENTRYPOINT"]
    assert env["JOB_ID"] == result.outputs["jobId"] and env["JOB_ID"].startswith("roll-dev-")
    config = render_on_stand_in_head(result, tmp_path)
    for role in ("actor_train", "actor_infer", "reference"):
        assert config[role]["model_args"]["dtype"] == "fp16", role
        assert config[role]["device_mapping"] == "list(range(0,1))", role


def test_multi_maps_roles_across_both_nodes_and_checkpoints_to_nas(tmp_path):
    result = run("multi")
    config = render_on_stand_in_head(result, tmp_path)
    assert config["actor_train"]["device_mapping"] == "list(range(0,4))"
    assert config["actor_infer"]["model_args"]["dtype"] == "fp16"
    assert config["checkpoint_config"]["output_dir"].startswith("/mnt/shared/")


def test_large_runs_rlvr_on_16_gpus_in_bf16(tmp_path):
    result = run("large")
    env = job_env(result)
    assert "examples/start_rlvr_pipeline.py" in env["JOB_ENTRYPOINT"]
    config = render_on_stand_in_head(result, tmp_path)
    assert config["actor_train"]["device_mapping"] == "list(range(0,16))"
    assert config["actor_train"]["model_args"]["dtype"] == "bf16"
    assert config["rewards"]["llm_judge"]["model_args"]["attn_implementation"] == "fa2"  # H20/A100: sm80+


def test_verl_gets_nodes_and_gpus_from_the_cluster_and_prepares_data():
    env = job_env(run("verl"))
    entry = env["JOB_ENTRYPOINT"]
    assert "python3 -m verl.trainer.main_ppo" in entry
    assert "trainer.nnodes=2" in entry and "trainer.n_gpus_per_node=8" in entry
    assert "algorithm.adv_estimator=grpo" in entry
    assert "gsm8k" in env["JOB_PREPARE"]


def test_openrlhf_reward_server_is_up_before_the_job_and_the_job_gets_its_url():
    result = run("openrlhf")
    head_ip = result.outputs["nodes"][0]["privateIp"]
    server = env_of(step_command(result, "reward-server"))
    assert server["REWARD_PORT"] == "5001" and "serve_rm" in server["REWARD_COMMAND"]
    job = next(r for r in result.steps if r.step == "job")
    assert "node-0/reward-server" in job.depends_on
    env = job_env(result)
    entry = env["JOB_ENTRYPOINT"]
    # The vLLM engines post to it from any node: the head's private IP, put in by the entrypoint's shell from
    # ROLL_CLUSTER_HEAD_IP, which the job step exports (ray_common.sh); the configuration itself names no address.
    assert '--reward.remote_url "http://${ROLL_CLUSTER_HEAD_IP}:5001/get_reward"' in entry
    assert env["JOB_HEAD_IP"] == head_ip and head_ip not in entry
    assert "--actor.num_nodes 2" in entry and "--vllm.num_engines 8" in entry
    words = subprocess.run(
        ["bash", "-c", entry.replace("python3 -m openrlhf.cli.train_ppo_ray", "printf '%s\\n'")],
        env={"ROLL_CLUSTER_HEAD_IP": head_ip, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert words[words.index("--reward.remote_url") + 1] == f"http://{head_ip}:5001/get_reward"


def test_custom_ports_reach_every_step_output_and_rule():
    result = run("openrlhf", config={"roll-cluster:access": {"dashboard": "admin-cidrs"}})
    head = env_of(step_command(result, "node-0-ray-head"))
    assert (head["GCS_PORT"], head["DASHBOARD_PORT"], head["CLIENT_PORT"]) == ("8100", "8101", "8102")
    assert env_of(step_command(result, "node-1-ray-worker"))["GCS_PORT"] == "8100"
    assert env_of(step_command(result, "ray-ready"))["GCS_PORT"] == "8100"
    assert job_env(result)["DASHBOARD_PORT"] == "8101"
    out = result.outputs
    assert out["rayAddress"].endswith(":8100") and out["dashboardUrl"].endswith(":8101")
    assert "127.0.0.1:8101" in out["jobStatus"] and "127.0.0.1:8101" in out["jobLogs"]
    container = result.cloud.named("node-1-container").inputs
    assert "MASTER_PORT=8100" in container["envs"]


def test_dashboard_listens_on_loopback_in_tunnel_mode_and_on_all_addresses_for_admin_cidrs():
    assert env_of(step_command(run("dev"), "node-0-ray-head"))["DASHBOARD_HOST"] == "127.0.0.1"
    assert env_of(step_command(run("multi"), "node-0-ray-head"))["DASHBOARD_HOST"] == "127.0.0.1"
    opted_in = run("multi", config={"roll-cluster:access": {"dashboard": "admin-cidrs"}})
    assert env_of(step_command(opted_in, "node-0-ray-head"))["DASHBOARD_HOST"] == "0.0.0.0"
    assert "dashboardUrl" not in run("dev").outputs


def test_ray_head_and_workers_get_their_addresses_gpus_and_disks():
    result = run("large")
    ips = [n["privateIp"] for n in result.outputs["nodes"]]
    head = env_of(step_command(result, "node-0-ray-head"))
    worker = env_of(step_command(result, "node-1-ray-worker"))
    assert head["NODE_IP"] == ips[0] and head["NUM_GPUS"] == "8" and head["RAY_TEMP_DIR"] == "/data/ray/tmp"
    assert worker["HEAD_IP"] == ips[0] and worker["NODE_IP"] == ips[1] and worker["NODE_RANK"] == "1"
    ready = env_of(step_command(result, "ray-ready"))
    assert ready["EXPECTED_NODE_IPS"].split() == ips and ready["GPUS_PER_NODE"] == "8"


def test_scaling_from_two_to_three_nodes_leaves_head_and_first_worker_unchanged():
    # 48 rollouts divide over Megatron's 4 and 6 data-parallel ranks (ROLL refuses the demo's 64 on 6 GPUs).
    fits = {"roll-cluster:training": {"overrides": {"rollout_batch_size": 48}}}
    two = run("multi", config=fits)
    # The second `up` of the same stack: the instances that stay keep their ids and start times.
    three = run("multi", cloud=two.cloud.next_run(), config={"roll-cluster:nodes": {"count": 3}, **fits})
    before = {r.name: unwrap(r.inputs) for r in two.cloud.resources if r.name.startswith(("node-0", "node-1"))}
    after = {r.name: unwrap(r.inputs) for r in three.cloud.resources if r.name.startswith(("node-0", "node-1"))}
    assert before.keys() == after.keys()
    # Nothing of the head and the first worker: the model step reruns for other models, not for the new job.
    assert [name for name in before if before[name] != after[name]] == []
    added = {r.name for r in three.cloud.resources} - {r.name for r in two.cloud.resources}
    assert "node-2-ray-worker" in added and "node-2-instance" in added
    # The gate and the job see the new size.
    assert len(env_of(step_command(three, "ray-ready"))["EXPECTED_NODE_IPS"].split()) == 3
    assert two.outputs["jobId"] != three.outputs["jobId"]


def test_a_training_override_changes_only_the_job():
    base = run("dev")
    tuned = run("dev", config={"roll-cluster:training": {"overrides": {"max_steps": 50}}})
    before = {r.name: unwrap(r.inputs) for r in base.cloud.resources}
    after = {r.name: unwrap(r.inputs) for r in tuned.cloud.resources}
    # The job step and its teardown only (the model step reruns for other models, not for a new job).
    changed = [name for name in before if before[name] != after.get(name)]
    assert changed == ["training-job-teardown", "training-job"]
    assert base.outputs["jobId"] != tuned.outputs["jobId"]
    job = tuned.cloud.named("training-job")
    assert job.inputs["triggers"][0] == tuned.outputs["jobId"]
    # The second trigger is the whole ROLL YAML, readable in `pulumi preview --diff`.
    assert "max_steps: 50\n" in job.inputs["triggers"][1]
    for name in ("training-job", "training-job-teardown"):  # replaced together: the old job is stopped first
        assert tuned.cloud.named(name).inputs["triggers"][0] == tuned.outputs["jobId"]
        assert tuned.cloud.options[name].delete_before_replace is True


def test_teardown_stops_the_job_and_ray_before_the_nodes_go():
    result = run("multi")
    job = result.cloud.named("training-job-teardown").inputs
    stop_job = reveal(job["environment"]["REMOTE_COMMAND"])
    assert "job_stop.sh" in stop_job and result.outputs["jobId"] in stop_job
    assert job["delete"] == "bash infra/scripts/local/teardown.sh" and "create" not in job
    for name in ("node-0-ray-head", "node-1-ray-worker", "training-job"):
        # The step itself has no delete over pulumi-command's connection; it depends on its local teardown.
        assert "delete" not in result.cloud.named(name).inputs
        depends_on = result.cloud.options[name].depends_on or []
        assert f"{name}-teardown" in {d._name for d in depends_on}  # type: ignore[union-attr]
    for name in ("node-0-ray-head", "node-1-ray-worker"):
        assert "ray_stop.sh" in reveal(result.cloud.named(f"{name}-teardown").inputs["environment"]["REMOTE_COMMAND"])
    # Deletion runs in reverse dependency order: job -> gate -> Ray steps -> containers -> instances.
    deps = {r.key: set(r.depends_on) for r in result.steps}
    assert "node-0/ray-ready" in deps["node-0/job"]
    assert {"node-0/ray-head", "node-1/ray-worker"} <= deps["node-0/ray-ready"]


def test_auto_start_false_prepares_everything_and_submits_nothing():
    result = run("dev", config={"roll-cluster:training": {"autoStart": False}})
    names = {r.name for r in result.cloud.resources}
    assert "training-job" not in names and "ray-ready" in names
    assert result.outputs["jobSubmitted"] is False and result.outputs["jobId"].startswith("roll-dev-")


def test_custom_framework_submits_the_entrypoint():
    result = run("dev", replace_config={"roll-cluster:training": {
        "framework": "custom", "custom": {"entrypoint": "python3 probe.py --all-nodes", "workingDir": "/workspace"}}})
    env = job_env(result)
    assert env["JOB_ENTRYPOINT"] == "python3 probe.py --all-nodes" and env["JOB_WORKDIR"] == "/workspace"
    assert "node-0-code" not in {r.name for r in result.cloud.resources}


@pytest.mark.parametrize("stack", ["dev", "multi", "large", "verl", "openrlhf"])
def test_wandb_and_hf_tokens_reach_ray_as_secrets_and_never_appear_in_plain(stack):
    secrets = {"roll-cluster:wandbApiKey": "wandb-0123456789", "roll-cluster:hfToken": "hf_abcdefghijkl"}
    result = run(stack, secrets=secrets)
    head = result.cloud.named("node-0-ray-head").inputs["stdin"]
    assert is_secret(head)
    env = env_of(reveal(head))
    assert env["WANDB_API_KEY"] == "wandb-0123456789" and env["HF_TOKEN"] == "hf_abcdefghijkl"
    assert env["RAY_EXTRA_ENV_NAMES"] == "HF_TOKEN WANDB_API_KEY"
    for resource in result.cloud.resources:
        for key, value in resource.inputs.items():
            if any(s in str(value) for s in secrets.values()):
                assert is_secret(value), (resource.name, key)
    assert not any(s in str(result.outputs) for s in secrets.values())
    for record in result.steps:
        assert not any(s in str(record) for s in secrets.values())


def test_a_secret_given_in_plain_text_is_rejected():
    from infra.config import ConfigError

    with pytest.raises(ConfigError, match="roll-cluster:hfToken: must be a secret"):
        run("dev", config={"roll-cluster:hfToken": "hf_plain"})


@pytest.mark.parametrize("stack", ["dev", "multi", "large", "verl", "openrlhf"])
def test_every_shipped_stack_exports_the_contracts_outputs(stack):
    out = run(stack).outputs
    for key in ("dashboardTunnel", "sshHead", "rayAddress", "zone", "instanceType", "nodes", "gpus",
                "hourlyPrice", "jobId", "jobStatus", "jobLogs"):
        assert out.get(key) not in (None, ""), key
    assert out["sshHead"].startswith(
        f"ssh -i ~/.ssh/id_ed25519 -o IdentitiesOnly=yes -o ConnectTimeout=10 "
        f"-o UserKnownHostsFile=~/.ssh/roll-cluster/{stack}.known_hosts "
        "-o StrictHostKeyChecking=yes -- root@"
    )


def test_object_store_size_reaches_every_ray_node():
    result = run("multi", config={"roll-cluster:ray": {"objectStoreMemoryGb": 2}})
    for name in ("node-0-ray-head", "node-1-ray-worker"):
        assert env_of(step_command(result, name))["RAY_OBJECT_STORE_MEMORY"] == str(2 * 1024**3)
    assert env_of(step_command(run("multi"), "node-0-ray-head"))["RAY_OBJECT_STORE_MEMORY"] == ""


def test_worker_and_gate_timeouts_come_from_the_config():
    result = run("multi", config={"roll-cluster:ray": {"headWaitTimeoutSeconds": 45, "readyTimeoutSeconds": 60}})
    assert env_of(step_command(result, "node-1-ray-worker"))["HEAD_WAIT_TIMEOUT_S"] == "45"
    assert env_of(step_command(result, "ray-ready"))["READY_TIMEOUT_S"] == "60"


def test_the_job_step_gets_the_secrets_for_its_preparation_but_only_as_secrets():
    result = run("verl", secrets={"roll-cluster:hfToken": "hf_prepare_token"})
    create = result.cloud.named("training-job").inputs["stdin"]
    assert is_secret(create)
    env = env_of(reveal(create))
    assert env["HF_TOKEN"] == "hf_prepare_token" and "HF_TOKEN" in env["RAY_EXTRA_ENV_NAMES"]


def test_ray_steps_and_the_container_are_replaced_cleanly():
    result = run("multi")
    for name in ("node-0-ray-head", "node-1-ray-worker"):
        assert result.cloud.options[name].delete_before_replace is True
    assert result.cloud.named("node-1-container").inputs["init"] is True


# ------------------------------------------------------------------------------------ issue 10: jobs that start
def test_the_reward_server_gets_hf_token_as_a_secret_and_is_stopped_when_removed():
    result = run("openrlhf", secrets={"roll-cluster:hfToken": "hf_reward_token"})
    server = result.cloud.named("reward-server").inputs
    assert is_secret(server["stdin"])
    env = env_of(reveal(server["stdin"]))
    assert env["HF_TOKEN"] == "hf_reward_token" and "HF_TOKEN" in env["RAY_EXTRA_ENV_NAMES"]
    # Removed, it is stopped by its teardown (a local command that reaches the head briefly; infra/node/steps.py).
    teardown = result.cloud.named("reward-server-teardown").inputs["environment"]
    stop = reveal(teardown["REMOTE_COMMAND"])
    assert env_of(stop)["REWARD_ACTION"] == "stop" and "reward_server.sh" in stop and "hf_reward_token" not in stop
    # Its stop ends every reward server in the container: the old one goes before a changed one starts.
    assert result.cloud.options["reward-server"].delete_before_replace is True


def test_the_reward_server_runs_on_explicit_gpus_of_the_head():
    server = env_of(step_command(run("openrlhf"), "reward-server"))
    assert server["REWARD_COMMAND"].startswith("export CUDA_VISIBLE_DEVICES=7 HF_ENDPOINT=https://hf-mirror.com; ")
    two = env_of(step_command(run("openrlhf", config={"roll-cluster:training": {"openrlhf": {"rewardServer": {
        "gpus": 2}}}}), "reward-server"))
    assert two["REWARD_COMMAND"].startswith("export CUDA_VISIBLE_DEVICES=6,7 ")


def test_job_stop_and_the_full_job_configuration_are_outputs():
    out = run("verl").outputs
    assert out["jobStop"].endswith(f"'docker exec roll ray job stop {out['jobId']} --address http://127.0.0.1:8265'")
    # After a reboot of the head: the job step replaced by its URN, and jobStatus names that very command.
    urn = "urn:pulumi:verl::roll-cluster::roll-cluster:index:TrainingJob$command:remote:Command::training-job"
    assert out["jobResubmit"] == f"pulumi up --stack verl --replace '{urn}'"
    assert urn in out["jobStatus"] and "LOST" in out["jobStatus"]
    config = out["jobConfig"]
    assert config["command"] == job_env(run("verl"))["JOB_ENTRYPOINT"]
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4" in config["command"]
    assert config["runtimeEnv"]["env_vars"]["HF_ENDPOINT"] == "https://hf-mirror.com"
    assert "gsm8k" in config["prepare"]


def test_auto_start_false_gives_the_submit_command_instead_of_status_and_logs():
    out = run("verl", config={"roll-cluster:training": {"autoStart": False}}).outputs
    assert "jobStatus" not in out and "jobLogs" not in out and "jobStop" not in out and "jobResubmit" not in out
    assert out["jobSubmit"] == (
        "pulumi config set --stack verl --path 'roll-cluster:training.autoStart' true && pulumi up --stack verl"
    )
    command = out["jobConfig"]["command"]
    assert command.endswith(' "$@"') and "exec python3 -m verl.trainer.main_ppo " in command


@pytest.mark.parametrize(
    ("stack", "config", "message"),
    [
        ("verl", {"roll-cluster:nodes": {"instanceTypes": ["ecs.gn6v-c10g1.20xlarge"]},
                  "roll-cluster:training": {"overrides": {"actor_rollout_ref.rollout.dtype": "bfloat16"}}},
         "roll-cluster:training.overrides.actor_rollout_ref.rollout.dtype: must not be bf16"),
        ("verl", {"roll-cluster:nodes": {"instanceTypes": ["ecs.gn6v-c10g1.20xlarge"]},
                  "roll-cluster:training": {"overrides": {
                      "+actor_rollout_ref.model.override_config.attn_implementation": "flash_attention_2"}}},
         "attn_implementation: must not be flash_attention_2"),
        ("verl", {"roll-cluster:training": {"overrides": {"actor_rollout_ref.actor.ppo_mini_batch_size": 512}}},
         "actor_rollout_ref.actor.ppo_mini_batch_size: must be at most data.train_batch_size (256)"),
        ("openrlhf", {"alicloud:region": "cn-hangzhou",
                      "roll-cluster:nodes": {"instanceTypes": ["ecs.gn6v-c10g1.20xlarge"]}},
         "roll-cluster:training.openrlhf.rewardServer.command: serve_rm must run with --ds.param_dtype fp16"),
        ("openrlhf", {"roll-cluster:training": {"overrides": {"vllm.num_engines": 16}}},
         "roll-cluster:training.overrides.vllm.num_engines: vLLM engines x tensor parallel size must fit"),
        ("openrlhf", {"roll-cluster:training": {"overrides": {"vllm.gpu_memory_utilization": 0.9}}},
         "roll-cluster:training.overrides.vllm.gpu_memory_utilization: must be at most 0.5"),
        ("openrlhf", {"roll-cluster:training": {"overrides": {"data.apply_chat_template": False}}},
         "roll-cluster:training.overrides.data.apply_chat_template: must be true with data.input_key"),
    ],
)
def test_a_job_that_would_fail_on_the_head_fails_the_plan_naming_its_key(stack, config, message):
    from devtools.offline_cloud import OfflineCloud
    from infra.config import ConfigError

    cloud = OfflineCloud()
    with pytest.raises(ConfigError, match=re.escape(message)):
        run(stack, cloud=cloud, config=config)
    assert cloud.resources == []


def test_the_reward_servers_gpus_count_when_the_roles_are_not_colocated():
    from infra.config import ConfigError

    def separate(reward_gpus):
        return {"roll-cluster:training": {
            "openrlhf": {"rewardServer": {"gpus": reward_gpus}},
            "overrides": {"train.colocate_all": False, "train.colocate_actor_ref": True, "vllm.enable_sleep": False,
                          "ds.enable_sleep": False, "actor.num_nodes": 1, "ref.num_nodes": 1, "vllm.num_engines": 4,
                          "vllm.gpu_memory_utilization": 0.9}}}

    # actor and ref 8 (colocated) + vLLM 4 x 2 = 16 GPUs: the cluster's 16, but Ray leaves the reward server's
    # GPU out, so it has 15. The refusal names the first placement key the user set.
    with pytest.raises(ConfigError, match=re.escape(
            "roll-cluster:training.overrides.actor.num_nodes: the roles need 16 GPUs (actor 8, vLLM 8), more than "
            "the 15 GPUs Ray has: the cluster's 16 GPUs (2 x 8) less the reward server's 1 on the head")):
        run("openrlhf", config=separate(1))
    with pytest.raises(ConfigError, match=re.escape("rewardServer.gpus: the reward server runs on the head, which")):
        run("openrlhf", config=separate(9))


@pytest.mark.parametrize("stack", ["dev", "verl"])
def test_pulumi_preview_knows_the_job_configuration_before_any_node_exists(stack):
    # In a first preview the nodes' addresses are unknown; the job (the jobConfig output) does not depend on them.
    from devtools.offline_cloud import OfflineCloud

    previewed = run(stack, cloud=OfflineCloud(preview=True)).notes.get("job_spec")
    assert previewed is not None
    assert previewed == run(stack).notes["job_spec"]
