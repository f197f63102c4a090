"""Contract tests: each shipped verl and OpenRLHF stack's job, as the program registers it, is judged by the
framework's own code at the pinned version (verl v0.7.0's Hydra config, OpenRLHF v0.10.2's argument parser and
its checks), without a GPU. How the frameworks are loaded without torch, Ray or vLLM:
tests/helpers/framework_contracts.py.

A missing package fails these tests (it never skips them): dev.py installs both from requirements-contract.txt.
"""

from __future__ import annotations

import importlib.metadata
import shlex
import tempfile
from pathlib import Path
from typing import Any

import pytest
from framework_contracts import (
    compose_verl,
    module_arguments,
    openrlhf_train_violations,
    run_openrlhf_cli,
    verl_violations,
)
from offline_helpers import env_of, run, step_command

from infra.config import OpenRlhfConfig, VerlConfig

V100_NODES = {"instanceTypes": ["ecs.gn6v-c10g1.20xlarge"]}  # 8 x V100: no bf16, no FlashAttention 2
FP16_REWARD_SERVER = (
    "python3 -m openrlhf.cli.serve_rm --reward.model_name_or_path OpenRLHF/Llama-3-8b-rm-700k --port {port} "
    "--host 0.0.0.0 --ds.param_dtype fp16 --ds.attn_implementation sdpa"
)


def job_env(stack: str, config: dict[str, Any] | None = None) -> dict[str, str]:
    """The job step's environment as the program registers it for the stack (what the head runs)."""
    return env_of(step_command(run(stack, config=config or {}), "training-job"))


def reward_env(stack: str, config: dict[str, Any] | None = None) -> dict[str, str]:
    return env_of(step_command(run(stack, config=config or {}), "reward-server"))


def test_the_contract_packages_are_the_versions_the_program_pins() -> None:
    assert importlib.metadata.version("verl") == "0.7.0" == VerlConfig().ref.lstrip("v")
    assert importlib.metadata.version("openrlhf") == "0.10.2"
    assert OpenRlhfConfig().package.endswith("==0.10.2") and OpenRlhfConfig().ref == "v0.10.2"


# --------------------------------------------------------------------------------------------------- verl
VERL_VARIANTS = {
    "as shipped": {},
    "one node": {"roll-cluster:nodes": {"count": 1}},
    "V100 fp16": {"roll-cluster:nodes": V100_NODES},
    "no resume": {"roll-cluster:training": {"resume": False}},
}


@pytest.mark.parametrize("variant", list(VERL_VARIANTS))
def test_verl_job_composes_in_verls_config_and_passes_its_start_up_checks(variant: str) -> None:
    entrypoint = job_env("verl", VERL_VARIANTS[variant])["JOB_ENTRYPOINT"]

    config = compose_verl(module_arguments(entrypoint, "verl.trainer.main_ppo"))

    assert verl_violations(config) == []
    actor = config["actor_rollout_ref"]["actor"]
    assert actor["ppo_micro_batch_size_per_gpu"] >= 1
    assert config["trainer"]["default_local_dir"].startswith("/mnt/shared/checkpoints/verl/")
    # A fresh start (the job step found no checkpoint, or training.resume is false): nothing is loaded.
    assert config["trainer"]["resume_mode"] == "disable"
    assert config["trainer"]["save_freq"] == 10
    resume = VERL_VARIANTS[variant].get("roll-cluster:training", {}).get("resume", True)
    if resume:
        # Handed the newest complete checkpoint: verl's explicit resume, which asserts a global_step_ folder
        # (verl/trainer/ppo/ray_trainer.py).
        # see verified-facts#test-contracts-ray-trainer
        found = config["trainer"]["default_local_dir"] + "/global_step_20"
        handed = compose_verl(module_arguments(entrypoint, "verl.trainer.main_ppo", resume_from=found))
        assert handed["trainer"]["resume_mode"] == "resume_path"
        assert handed["trainer"]["resume_from_path"] == found
    if variant == "V100 fp16":
        assert actor["fsdp_config"]["dtype"] == "float16"
        assert config["actor_rollout_ref"]["ref"]["fsdp_config"]["dtype"] == "float16"
        assert config["actor_rollout_ref"]["rollout"]["dtype"] == "float16"
        assert config["actor_rollout_ref"]["model"]["override_config"]["attn_implementation"] == "sdpa"


def test_verl_with_its_default_estimator_gets_the_critic_micro_batch_too() -> None:
    # gae trains a critic, which asserts its own micro-batch (verl/workers/config/critic.py).
    # see verified-facts#test-contracts-critic
    overrides = {"roll-cluster:training": {"overrides": {"algorithm.adv_estimator": "gae"}}}
    config = compose_verl(module_arguments(job_env("verl", overrides)["JOB_ENTRYPOINT"], "verl.trainer.main_ppo"))
    assert verl_violations(config) == []
    assert config["critic"]["ppo_micro_batch_size_per_gpu"] >= 1


def test_a_wrong_verl_key_is_rejected_by_verls_config() -> None:
    from hydra.errors import ConfigCompositionException

    entrypoint = job_env("verl", {"roll-cluster:training": {"overrides": {"trainer.total_epoch": 3}}})[
        "JOB_ENTRYPOINT"
    ]
    with pytest.raises(ConfigCompositionException, match="total_epoch"):
        compose_verl(module_arguments(entrypoint, "verl.trainer.main_ppo"))


def test_the_verl_judge_fails_a_job_without_micro_batch_sizes() -> None:
    # What the verl stack rendered before micro-batch sizes came from the cluster: verl stops at start-up.
    entrypoint = job_env("verl")["JOB_ENTRYPOINT"]
    arguments = [a for a in module_arguments(entrypoint, "verl.trainer.main_ppo") if "micro_batch" not in a]
    problems = verl_violations(compose_verl(arguments))
    assert any("actor: exactly one of ppo_micro_batch_size" in p for p in problems)
    assert any("actor_rollout_ref.rollout: exactly one of log_prob_micro_batch_size" in p for p in problems)


# ---------------------------------------------------------------------------------------------- OpenRLHF
OPENRLHF_VARIANTS = {
    "as shipped": {},
    "V100 fp16": {
        "alicloud:region": "cn-hangzhou",  # where the offline cloud has V100 stock
        "roll-cluster:nodes": V100_NODES,
        "roll-cluster:training": {"openrlhf": {"rewardServer": {"command": FP16_REWARD_SERVER}}},
    },
    "modelscope, no resume": {"roll-cluster:training": {"modelSource": "modelscope", "resume": False}},
}


@pytest.mark.parametrize("variant", list(OPENRLHF_VARIANTS))
def test_openrlhf_job_parses_in_openrlhfs_parser_and_passes_its_checks(variant: str) -> None:
    entrypoint = job_env("openrlhf", OPENRLHF_VARIANTS[variant])["JOB_ENTRYPOINT"]

    args = run_openrlhf_cli("train_ppo_ray.py", module_arguments(entrypoint, "openrlhf.cli.train_ppo_ray"))

    assert openrlhf_train_violations(args) == []
    assert args.data.apply_chat_template is True
    assert args.vllm.gpu_memory_utilization == 0.5  # colocated with the trained models and the reward server
    assert args.ckpt.path.startswith("/mnt/shared/checkpoints/openrlhf/")
    settings = OPENRLHF_VARIANTS[variant].get("roll-cluster:training", {})
    # Fresh start: no --ckpt.load_enable (with nothing to load, fit() fails on KeyError 'episode'); saves every 10.
    assert args.ckpt.load_enable is False and args.ckpt.save_steps == 10
    if settings.get("resume", True):
        # The entrypoint points `latest` at the tag handed over: the checkpoint folder is a temporary one here.
        with tempfile.TemporaryDirectory() as ckpt:
            (Path(ckpt) / "_actor").mkdir()
            handed = run_openrlhf_cli("train_ppo_ray.py", module_arguments(
                entrypoint.replace(args.ckpt.path, ckpt), "openrlhf.cli.train_ppo_ray",
                resume_from=ckpt + "/_actor/global_step20"))
            assert handed.ckpt.load_enable is True and handed.ckpt.path == ckpt
            assert (Path(ckpt) / "_actor" / "latest").read_text() == "global_step20"
    assert args.use_ms is (settings.get("modelSource") == "modelscope")
    if variant == "V100 fp16":
        assert (args.ds.param_dtype, args.ds.attn_implementation) == ("fp16", "sdpa")


@pytest.mark.parametrize("variant", list(OPENRLHF_VARIANTS))
def test_openrlhf_reward_server_command_parses_in_serve_rms_parser(variant: str) -> None:
    command = reward_env("openrlhf", OPENRLHF_VARIANTS[variant])["REWARD_COMMAND"]
    server = command.split("; ", 1)[1]  # after the exported CUDA_VISIBLE_DEVICES (and HF_ENDPOINT)

    args = run_openrlhf_cli("serve_rm.py", module_arguments(server, "openrlhf.cli.serve_rm"), stop_after_parse=True)

    assert args.port == 5001
    assert shlex.split(command)[1].startswith("CUDA_VISIBLE_DEVICES=")


def test_a_wrong_openrlhf_flag_is_rejected_by_openrlhfs_parser(capsys: pytest.CaptureFixture[str]) -> None:
    entrypoint = job_env("openrlhf", {"roll-cluster:training": {"overrides": {"rollout.n_sample_per_prompt": 4}}})[
        "JOB_ENTRYPOINT"
    ]
    with pytest.raises(SystemExit):
        run_openrlhf_cli("train_ppo_ray.py", module_arguments(entrypoint, "openrlhf.cli.train_ppo_ray"))
    assert "unrecognized arguments: --rollout.n_sample_per_prompt" in capsys.readouterr().err


def test_openrlhfs_own_checks_run_after_parsing() -> None:
    # Upstream's asserts after parsing run too: partial rollouts need async training (not a rule of ours).
    entrypoint = job_env("openrlhf", {"roll-cluster:training": {"overrides": {"train.partial_rollout_enable": True}}})[
        "JOB_ENTRYPOINT"
    ]
    with pytest.raises(AssertionError, match="--partial_rollout requires --async_train"):
        run_openrlhf_cli("train_ppo_ray.py", module_arguments(entrypoint, "openrlhf.cli.train_ppo_ray"))


def test_a_deprecated_global_micro_batch_size_of_the_user_is_not_doubled() -> None:
    # verl refuses both sizes of one section; the user's deprecated one stays alone.
    user = {"actor_rollout_ref.rollout.log_prob_micro_batch_size": 32}
    entrypoint = job_env("verl", {"roll-cluster:training": {"overrides": user}})["JOB_ENTRYPOINT"]
    config = compose_verl(module_arguments(entrypoint, "verl.trainer.main_ppo"))
    assert verl_violations(config) == []
    rollout = config["actor_rollout_ref"]["rollout"]
    assert (rollout["log_prob_micro_batch_size"], rollout["log_prob_micro_batch_size_per_gpu"]) == (32, None)
