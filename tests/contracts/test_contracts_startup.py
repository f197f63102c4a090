"""Contract tests past the parsers (issue 18 item 8): each shipped verl and OpenRLHF job goes through the checks
the framework's own driver runs before any GPU is touched, at the pinned versions: verl's validate_config as the
TaskRunner calls it, and OpenRLHF's train(args) up to the first model it would place. What of those needs torch
is said in tests/helpers/framework_contracts.py."""

from __future__ import annotations

from typing import Any

import pytest
from framework_contracts import (
    compose_verl,
    module_arguments,
    run_openrlhf_cli,
    run_openrlhf_train,
    run_verl_validate_config,
)
from test_contracts import FP16_REWARD_SERVER, V100_NODES, job_env


def entrypoint(stack: str, config: dict[str, Any] | None = None) -> str:
    return job_env(stack, config)["JOB_ENTRYPOINT"]


def verl_config(config: dict[str, Any] | None = None) -> dict[str, Any]:
    return compose_verl(module_arguments(entrypoint("verl", config), "verl.trainer.main_ppo"))


def openrlhf_args(config: dict[str, Any] | None = None) -> Any:
    arguments = module_arguments(entrypoint("openrlhf", config), "openrlhf.cli.train_ppo_ray")
    return run_openrlhf_cli("train_ppo_ray.py", arguments)


# --------------------------------------------------------------------------------------------------- verl
@pytest.mark.parametrize(
    "config",
    [{}, {"roll-cluster:nodes": {"count": 1}}, {"roll-cluster:nodes": V100_NODES}],
    ids=["as shipped", "one node", "V100"],
)
def test_verl_jobs_pass_verls_own_validate_config(config: dict[str, Any]) -> None:
    printed, validated = run_verl_validate_config(verl_config(config))
    assert "[validate_config] All configuration checks passed successfully!" in printed
    # The actor's dataclass validation was asked for with the cluster's GPU count and the batch
    # (verl/utils/config.py); its conditions are verl_violations' (tests/contracts/test_contracts.py).
    # see verified-facts#test-contracts-startup-config
    target, (n_gpus, batch, _model) = validated[0]
    assert target == "verl.workers.config.FSDPActorConfig"
    nodes = config.get("roll-cluster:nodes", {}).get("count", 2)
    assert (n_gpus, batch) == (8 * nodes, 256)


def test_verls_own_check_refuses_a_batch_the_gpus_do_not_divide() -> None:
    # The program refuses such an override itself before deploying; here verl's own check is the judge.
    config = verl_config()
    config["data"]["train_batch_size"] = 100
    with pytest.raises(AssertionError, match=r"real_train_batch_size \(\d+\) must be divisible by minimal possible"):
        run_verl_validate_config(config)


def test_verls_own_check_refuses_both_micro_batch_sizes_of_the_rollout() -> None:
    config = verl_config()
    config["actor_rollout_ref"]["rollout"]["log_prob_micro_batch_size"] = 32  # beside the _per_gpu one rendered
    with pytest.raises(ValueError, match=r"\[actor_rollout_ref.rollout\] You have set both"):
        run_verl_validate_config(config)


def test_verls_own_check_refuses_sampled_validation_at_temperature_zero() -> None:
    overrides = {"actor_rollout_ref.rollout.val_kwargs.do_sample": True, "actor_rollout_ref.rollout.temperature": 0}
    config = verl_config({"roll-cluster:training": {"overrides": overrides}})
    with pytest.raises(AssertionError, match="validation gen temperature should be greater than 0"):
        run_verl_validate_config(config)


# ---------------------------------------------------------------------------------------------- OpenRLHF
@pytest.mark.parametrize(
    "config",
    [{}, {"alicloud:region": "cn-hangzhou", "roll-cluster:nodes": V100_NODES}],
    ids=["as shipped", "V100"],
)
def test_openrlhf_jobs_pass_upstreams_train_up_to_the_vllm_engines(config: dict[str, Any]) -> None:
    if config:
        config = {**config, "roll-cluster:training": {"openrlhf": {"rewardServer": {"command": FP16_REWARD_SERVER}}}}
    assert run_openrlhf_train(openrlhf_args(config)) == "vllm engines"


def test_upstreams_train_refuses_colocated_engines_that_do_not_cover_the_actor() -> None:
    args = openrlhf_args()
    assert args.train.colocate_all  # the shipped recipe colocates everything
    args.vllm.num_engines = 3  # the program refuses this override itself before deploying
    with pytest.raises(AssertionError, match="actor_num_nodes \\* actor_num_gpus_per_node must be equal to"):
        run_openrlhf_train(args)


def test_upstreams_train_refuses_a_colocated_reference_of_another_size() -> None:
    args = openrlhf_args()
    args.ref.num_gpus_per_node = args.actor.num_gpus_per_node - 1  # what a user's override could do
    assert args.algo.kl.init_coef > 0
    with pytest.raises(AssertionError, match="num_nodes and num_gpus_per_node must be the same"):
        run_openrlhf_train(args)
