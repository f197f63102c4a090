"""The shipped stacks whose engine cannot run in the tests (docs/testing.md, "The engines' own checks"): verl's
image (vLLM 0.12), OpenRLHF's (vLLM 0.19.1) and MindSpeed-RL's (vLLM 0.7.3 with vllm-ascend, NPU only) are judged
by the rule table of vLLM's scheduler checks, generated from each version's own source by
tools/vllm_scheduler_rules.py (tests/engines/vllm_scheduler_rules.json), on the values each framework hands its
engine, read in the framework's own code at the pinned ref."""

from __future__ import annotations

from typing import Any

import pytest
from framework_contracts import compose_verl, module_arguments, run_openrlhf_cli
from model_configs import MODEL_CONFIGS
from offline_helpers import env_of, run, step_command
from rule_table import Verdict, load, verdicts

from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks import ClusterShape, adapter_for

# Which vLLM each stack's engine is (tests/engines/vllm_scheduler_rules.json `used_by`).
ENGINE_OF = {"verl": "0.12.0", "openrlhf": "0.19.1", "ascend": "0.7.3"}
BUDGET_RULE = "self.max_num_batched_tokens < self.max_model_len"  # the V0 crash of dev and multi (issue 27)
# MindSpeed-RL 62e9928's example, for what the plan's values do not hold: configs/grpo_qwen25_7b_A3.yaml
# (max_num_seqs); num_scheduler_steps: mindspeed_rl/config_cls/generate_config.py (default 1).
# see verified-facts#test-engine-rule-tables-grpo-qwen25-7b-a3
MINDSPEED_EXAMPLE = {"generate_config.max_num_seqs": 1024, "generate_config.num_scheduler_steps": 1}


def job_entrypoint(stack: str, config: dict[str, Any] | None = None) -> str:
    return env_of(step_command(run(stack, config=config or {}), "training-job"))["JOB_ENTRYPOINT"]


def verl_engine(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """What verl v0.7.0 hands vLLM (verl/workers/rollout/vllm_rollout/vllm_async_server.py), max_model_len
    being the model's max_position_embeddings whatever the config says.
    See verified-facts#test-engine-rule-tables-vllm-async-server."""
    composed = compose_verl(module_arguments(job_entrypoint("verl", config), "verl.trainer.main_ppo"))
    rollout = composed["actor_rollout_ref"]["rollout"]
    model = MODEL_CONFIGS[composed["actor_rollout_ref"]["model"]["path"]]
    return {"max_model_len": model["max_position_embeddings"], "max_num_seqs": rollout["max_num_seqs"],
            "enable_chunked_prefill": rollout["enable_chunked_prefill"],
            "max_num_batched_tokens": rollout["max_num_batched_tokens"]}


def openrlhf_engine() -> dict[str, Any]:
    """What OpenRLHF 0.10.2 hands vLLM: max_model_len = --data.max_len (openrlhf/cli/train_ppo_ray.py;
    trainer/ray/vllm_engine.py), nothing about batching or chunked prefill (vLLM's defaults).
    See verified-facts#test-engine-rule-tables-train-ppo-ray."""
    arguments = module_arguments(job_entrypoint("openrlhf"), "openrlhf.cli.train_ppo_ray")
    args = run_openrlhf_cli("train_ppo_ray.py", arguments)
    return {"max_model_len": args.data.max_len}


def mindspeed_engine(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """What MindSpeed-RL 62e9928 hands vLLM's LLM (mindspeed_rl/models/rollout/vllm_engine.py from
    workers/actor_hybrid_worker.py): max_model_len, max_num_seqs, num_scheduler_steps; no
    max_num_batched_tokens (the YAML's generate_config.max_num_batched_tokens is never passed) and no chunked prefill
    (vLLM 0.7.3's V0 turns it on by itself only above 32K tokens on CUDA; vllm-ascend is not CUDA).
    See verified-facts#test-engine-rule-tables-vllm-engine."""
    training = TrainingConfig.model_validate({
        "framework": "mindspeed-rl",
        "mindspeedRl": {"exampleConfig": "grpo_qwen25_7b_A3", "tokenizerPath": "/mnt/shared/models/Qwen2.5-7B",
                        "dataPath": "/mnt/shared/dataset/deepscaler/data",
                        "loadPath": "/mnt/shared/models/Qwen2.5-7B-mcore-tp4"},
        "overrides": overrides or {},
    })
    adapter = adapter_for(training, ContainerConfig.model_validate({}))
    shape = ClusterShape("ascend", 2, 8, True, "10.0.0.5", "/mnt/shared", "/data", 8265)
    values = {**MINDSPEED_EXAMPLE, **{k: v.value for k, v in adapter.values(shape).items()}}  # type: ignore[attr-defined]
    return {"max_model_len": values["generate_config.max_model_len"],
            "max_num_seqs": values["generate_config.max_num_seqs"],
            "num_scheduler_steps": values["generate_config.num_scheduler_steps"],
            "enable_chunked_prefill": False, "runner_type": "generate", "is_multimodal_model": False}


def budget_rule(found: list[Verdict]) -> Verdict:
    version_rules = [v for v in found if v.message.startswith("f'max_num_batched_tokens (")
                     and "is smaller than max_model_len" in v.message]
    assert len(version_rules) == 1, found
    return version_rules[0]


def test_the_table_holds_every_shipped_engines_vllm_from_its_own_source() -> None:
    table = load()
    assert set(ENGINE_OF.values()) | {"0.8.4"} <= set(table)
    for entry in table.values():
        assert any(BUDGET_RULE in rule["when"] for rule in entry["rules"]), entry["source"]


@pytest.mark.parametrize(("stack", "engine"), [("verl", verl_engine), ("openrlhf", openrlhf_engine),
                                               ("ascend", mindspeed_engine)])
def test_every_other_shipped_stacks_engine_passes_its_vllm_rule_table(stack: str, engine: Any) -> None:
    found = verdicts(ENGINE_OF[stack], engine())
    assert not [v for v in found if v.violated], found
    assert budget_rule(found).violated is False  # decided by what the framework passes


def test_the_rule_table_fails_a_verl_job_without_chunked_prefill() -> None:
    """The table can fail: verl gives vLLM the model's 32768 tokens (vllm_async_server.py) against its
    max_num_batched_tokens 8192, so without chunked prefill vLLM would refuse to start.
    See verified-facts#test-engine-rule-tables-vllm-async-server-2."""
    off = verl_engine({"roll-cluster:training": {"overrides": {
        "actor_rollout_ref.rollout.enable_chunked_prefill": False}}})
    assert budget_rule(verdicts(ENGINE_OF["verl"], off)).violated is True


def test_the_rule_table_fails_a_mindspeed_job_with_more_sequences_than_tokens() -> None:
    """vLLM 0.7.3 fills max_num_batched_tokens with max(max_model_len, 2048) (vllm/config.py) and refuses it
    below max_num_seqs. See verified-facts#test-engine-rule-tables-config."""
    found = verdicts(ENGINE_OF["ascend"], mindspeed_engine({"generate_config.max_num_seqs": 8192}))
    assert [v.line for v in found if v.violated] == [1586]
