"""ROLL's training YAML as built before deployment: the real example configs of the pinned ref (the snapshot in
tests/fixtures/roll) with their Hydra defaults merged in, sized for a cluster, fp16 where the GPUs need it, the
user's overrides last, and ROLL's own start-up rules checked, each problem naming its key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.offline_cloud import ROLL_SNAPSHOT
from infra.frameworks import roll_checks, roll_keys, roll_render, roll_sources
from infra.frameworks.roll_compose import ComposeError, compose

EXAMPLES = roll_sources.CheckoutExamples(ROLL_SNAPSHOT)
KEYS = roll_keys.load_roll_keys()
SINGLE = "agentic_demo/agent_val_frozen_lake_single_node_demo.yaml"
MULTI = "agentic_demo/agent_val_frozen_lake_multi_nodes_demo.yaml"
RLVR = "qwen2.5-7B-rlvr_megatron/rlvr_config.yaml"
RLVR_ASYNC = "qwen2.5-7B-rlvr_megatron/rlvr_config_async.yaml"

DEV = roll_render.Cluster("dev", 1, 1, False, None, "/data")  # 1 x V100
MULTI_SHAPE = roll_render.Cluster("multi", 2, 2, False, "/mnt/shared", "/data")  # 2 x 2 V100, NAS
LARGE = roll_render.Cluster("large", 2, 8, True, "/mnt/shared", "/data")  # 2 x 8 H20-class, bf16
V100_X16 = roll_render.Cluster("v", 2, 8, False, None, "/data")


def pipeline_of(name: str) -> str:
    return "rlvr" if "rlvr" in name else "agentic"


def rendered(name: str, cluster: roll_render.Cluster, overrides: dict[str, Any] | None = None) -> roll_render.Rendered:
    composed, _ = compose(EXAMPLES.read, name)
    return roll_render.render_roll_config(
        composed, cluster, roll_render.expand_dotted(overrides or {}), KEYS, pipeline_of(name)
    )


def check(name: str, cluster: roll_render.Cluster, overrides: dict[str, Any] | None = None) -> roll_checks.CheckResult:
    return roll_checks.check(rendered(name, cluster, overrides).config, cluster, pipeline_of(name), KEYS)


def errors(name: str, cluster: roll_render.Cluster, overrides: dict[str, Any] | None = None) -> list[str]:
    return [f"{p.key}: {p.message}" for p in check(name, cluster, overrides).errors]


def roles(config: dict[str, Any]) -> dict[str, str]:
    return {role: config[role]["device_mapping"] for role in ("actor_train", "actor_infer", "reference")}


# ------------------------------------------------------------------------------------------ the three stacks
def test_dev_stack_one_v100_gets_one_gpu_fp16_and_node_local_outputs() -> None:
    config = rendered(SINGLE, DEV).config
    assert roles(config) == dict.fromkeys(("actor_train", "actor_infer", "reference"), "list(range(0,1))")
    assert {config[r]["model_args"]["dtype"] for r in ("actor_train", "actor_infer", "reference")} == {"fp16"}
    # No NAS: outputs on the node's data dir instead of the example's internal mounts.
    assert config["checkpoint_config"]["output_dir"] == "/data/roll/dev/checkpoints"
    assert config["tracker_kwargs"]["log_dir"] == "/data/roll/dev/tensorboard"
    assert config["render_save_dir"] == "/data/roll/dev/render"
    assert config["num_gpus_per_node"] == 1
    assert errors(SINGLE, DEV) == []


def test_multi_stack_spans_four_gpus_across_two_nodes_with_shared_outputs() -> None:
    config = rendered(MULTI, MULTI_SHAPE).config
    assert set(roles(config).values()) == {"list(range(0,4))"}
    assert config["num_gpus_per_node"] == 2
    assert config["checkpoint_config"]["output_dir"] == "/mnt/shared/roll/multi/checkpoints"
    assert config["logging_dir"] == "/mnt/shared/roll/multi/logs"
    assert errors(MULTI, MULTI_SHAPE) == []


def test_device_mappings_follow_the_cluster_not_the_base() -> None:
    # The single-GPU demo on 2 x 2 GPUs, the 4-GPU demo on one 8-GPU node: all roles span the cluster.
    assert set(roles(rendered(SINGLE, MULTI_SHAPE).config).values()) == {"list(range(0,4))"}
    eight = roll_render.Cluster("one8", 1, 8, True, None, "/data")
    assert set(roles(rendered(MULTI, eight).config).values()) == {"list(range(0,8))"}


def test_large_stack_keeps_the_rollout_subset_and_bf16() -> None:
    result = rendered(RLVR, LARGE)
    config = result.config
    assert config["actor_train"]["device_mapping"] == "list(range(0,16))"
    assert config["reference"]["device_mapping"] == "list(range(0,16))"
    assert config["actor_infer"]["device_mapping"] == "list(range(0,12))"  # a subset of the base: kept
    assert config["rewards"]["llm_judge"]["device_mapping"] == "list(range(12,16))"
    assert {config[r]["model_args"]["dtype"] for r in ("actor_train", "actor_infer", "reference")} == {"bf16"}
    assert config["rewards"]["llm_judge"]["model_args"]["attn_implementation"] == "fa2"
    assert any(line.startswith("actor_infer.device_mapping: kept") for line in result.kept)
    assert errors(RLVR, LARGE) == []


def test_rlvr_on_one_node_reports_the_roles_that_no_longer_fit() -> None:
    one_node = roll_render.Cluster("small", 1, 8, True, None, "/data")
    found = errors(RLVR, one_node)
    assert [e.split(":")[0] for e in found] == ["actor_infer.device_mapping", "rewards.llm_judge.device_mapping"]
    assert found[0].startswith("actor_infer.device_mapping: GPU indices must be within 0..7")
    assert "'list(range(0,12))'" in found[0]
    assert errors("qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus.yaml", one_node) == []


# ---------------------------------------------------------------------------------------- fp16 on V100 / T4
def test_gpus_without_bf16_get_fp16_and_sdpa_on_every_model_including_reward_workers() -> None:
    result = rendered(RLVR, V100_X16)
    config = result.config
    dtypes = {
        "actor_train": config["actor_train"]["model_args"]["dtype"],
        "actor_infer": config["actor_infer"]["model_args"]["dtype"],
        "reference": config["reference"]["model_args"]["dtype"],
        "llm_judge": config["rewards"]["llm_judge"]["model_args"]["dtype"],
        "math_rule": config["rewards"]["math_rule"]["model_args"]["dtype"],
    }
    assert set(dtypes.values()) == {"fp16"}, dtypes
    # FlashAttention-2 needs sm80: the judge's fa2 becomes sdpa, a value ROLL's ModelArguments accepts.
    assert config["rewards"]["llm_judge"]["model_args"]["attn_implementation"] == "sdpa"
    assert "bf16" not in result.yaml_text() and "fa2" not in result.yaml_text()
    assert errors(RLVR, V100_X16) == []


def test_megatron_bf16_flags_turn_to_fp16_on_gpus_without_bf16() -> None:
    # rlvr_config_async.yaml sets strategy_config.bf16: true for Megatron, which wins over model_args.dtype in
    # ROLL's Megatron strategy; 24 V100s hold its train (0-15) and rollout (16-23) GPUs.
    v100_x24 = roll_render.Cluster("v", 3, 8, False, "/mnt/shared", "/data")
    config = rendered(RLVR_ASYNC, v100_x24).config
    for role in ("actor_train", "reference"):
        strategy_config = config[role]["strategy_args"]["strategy_config"]
        assert (strategy_config["bf16"], strategy_config["fp16"]) == (False, True), role
        assert config[role]["model_args"]["dtype"] == "fp16"
    assert rendered(RLVR_ASYNC, roll_render.Cluster("h", 3, 8, True, None, "/data")).config["actor_train"][
        "strategy_args"
    ]["strategy_config"]["bf16"] is True


def test_a_worker_on_gpus_without_model_args_gets_fp16_instead_of_rolls_bf16_default() -> None:
    critic = {"critic": {"device_mapping": "list(range(0,1))", "strategy_args": {"strategy_name": "hf_infer"}}}
    result = rendered(SINGLE, DEV, critic)
    assert result.config["critic"]["model_args"] == {"dtype": "fp16"}
    assert any(line.startswith("critic.model_args.dtype: fp16 (not set") for line in result.applied)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"actor_train.model_args.dtype": "bf16"}, "actor_train.model_args.dtype"),
        ({"reference.model_args.attn_implementation": "fa2"}, "reference.model_args.attn_implementation"),
        ({"actor_train.strategy_args.strategy_config.bf16": True}, "actor_train.strategy_args.strategy_config.bf16"),
        ({"actor_train.training_args.bf16": True}, "actor_train.training_args.bf16"),
    ],
)
def test_bf16_or_fa2_forced_by_an_override_on_v100_is_an_error_naming_the_key(
    overrides: dict[str, Any], key: str
) -> None:
    found = errors(SINGLE, DEV, overrides)
    assert [e.split(":")[0] for e in found] == [key], found
    assert errors(SINGLE, roll_render.Cluster("a10", 1, 1, True, None, "/data"), overrides) == []


def test_vllms_v0_engine_on_v100_gets_rolls_v0_example_settings_within_its_token_budget() -> None:
    """ROLL's own V0 example (atropos_gsm8k_grpo_qwen25_0.5b.yaml): max_model_len = sequence_length,
    enforce_eager, no prefix caching; vLLM 0.8.4's V0 scheduler refuses max_model_len above
    max_num_batched_tokens (ROLL's 8192) without chunked prefill (tests/engines asks vLLM itself).
    See verified-facts#test-roll-render-atropos-gsm8k-grpo-qwen25-0-5b."""
    engine = rendered(SINGLE, DEV).config["actor_infer"]["strategy_args"]["strategy_config"]
    assert engine["VLLM_USE_V1"] == 0 and engine["enable_prefix_caching"] is False and engine["enforce_eager"] is True
    assert engine["max_model_len"] == 4096 and "max_num_batched_tokens" not in engine  # ROLL's 8192 holds it
    long = rendered(SINGLE, DEV, {"sequence_length": 16384}).config["actor_infer"]["strategy_args"]
    assert long["strategy_config"]["max_model_len"] == 16384
    assert long["strategy_config"]["max_num_batched_tokens"] == 16384  # raised to hold one whole sequence
    chunked = rendered(SINGLE, DEV, {"sequence_length": 16384, "actor_infer.strategy_args.strategy_config."
                                     "enable_chunked_prefill": True}).config["actor_infer"]["strategy_args"]
    assert "max_num_batched_tokens" not in chunked["strategy_config"]  # chunked prefill: ROLL's budget stays
    rlvr = rendered(RLVR, V100_X16).config  # the base's own max_model_len (8000) is kept
    assert rlvr["actor_infer"]["strategy_args"]["strategy_config"]["max_model_len"] == 8000
    assert "max_num_batched_tokens" not in rlvr["actor_infer"]["strategy_args"]["strategy_config"]
    bf16 = rendered(SINGLE, roll_render.Cluster("a10", 1, 1, True, None, "/data")).config["actor_infer"]
    assert "max_model_len" not in bf16["strategy_args"]["strategy_config"]  # V1: chunked prefill is its default


# ----------------------------------------------------------------------------------------------- overrides
def test_overrides_are_merged_last_over_the_hardware_defaults() -> None:
    overrides = {
        "actor_train": {"device_mapping": "list(range(0,2))", "training_args": {"learning_rate": 5.0e-7}},
        "val_env_manager.tags": ["FrozenLake"],  # dotted key, list replaces
        "max_actions_per_traj": 5,  # the variable traj_envs.yaml defines, used by its interpolations
    }
    config = rendered(SINGLE, MULTI_SHAPE, overrides).config
    assert config["actor_train"]["device_mapping"] == "list(range(0,2))"
    assert config["actor_train"]["training_args"]["learning_rate"] == 5.0e-7
    assert config["actor_train"]["training_args"]["gradient_accumulation_steps"] == 16  # siblings stay
    assert config["val_env_manager"]["tags"] == ["FrozenLake"]
    assert config["val_env_manager"]["num_env_groups"] == 2
    assert config["actor_infer"]["device_mapping"] == "list(range(0,4))"
    assert config["max_actions_per_traj"] == 5


def test_a_null_override_removes_a_value() -> None:
    assert rendered(SINGLE, DEV, {"sequence_length": None}).config["sequence_length"] is None
    assert any(e.startswith("sequence_length: response_length or sequence_length must be set")
               for e in errors(SINGLE, DEV, {"sequence_length": None}))


def test_keys_of_the_base_that_are_no_rolls_fields_are_dropped_and_said_so() -> None:
    result = rendered(SINGLE, DEV)
    assert "flash_attn" not in result.config["actor_train"]["model_args"]
    assert any(line.startswith("actor_train.model_args.flash_attn: dropped") for line in result.applied)
    # YAML variables that interpolations use stay (they are resolved before ROLL sees the config).
    assert result.config["max_actions_per_traj"] == 10 and "custom_env" in result.config


# -------------------------------------------------------------------------------------------------- checks
@pytest.mark.parametrize(
    ("name", "cluster", "overrides", "expected"),
    [
        (SINGLE, DEV, {"actor_train.device_mapping": "list(range(0,8))"},
         "actor_train.device_mapping: GPU indices must be within 0..0 (the cluster has 1 node(s) x 1 GPU(s) = 1); "
         "got 'list(range(0,8))'"),
        (SINGLE, DEV, {"reference.device_mapping": "list(range(0"}, "reference.device_mapping: must be `list("),
        (SINGLE, DEV, {"train_env_manager.group_size": 3},
         "rollout_batch_size: must be a multiple of train_env_manager.group_size; got rollout_batch_size=16, "
         "group_size=3"),
        (SINGLE, DEV, {"val_env_manager.group_size": 3},
         "val_batch_size: must be a multiple of val_env_manager.group_size; got val_batch_size=16, group_size=3"),
        (SINGLE, DEV, {"val_batch_size": 6, "val_env_manager.group_size": 2},
         "val_batch_size: must be divisible by val_env_manager.num_env_groups x group_size = 2 x 2 = 4; got 6"),
        (SINGLE, DEV, {"train_env_manager.max_traj_per_env": 1, "train_env_manager.num_env_groups": 4},
         "train_env_manager.max_traj_per_env: must be at least 4 (batch 16 over 4 envs); got 1"),
        (SINGLE, DEV, {"max_steps": 0}, "max_steps: must be greater than 0, or -1; got 0"),
        (MULTI, MULTI_SHAPE, {"rollout_batch_size": 18},
         "rollout_batch_size: must be divisible by Megatron's data-parallel size 4 (4 GPUs of "
         "actor_train.device_mapping / TP=1 x PP=1 x CP=1 = 1); got 18"),
        (MULTI, MULTI_SHAPE, {"actor_train.strategy_args.strategy_config.tensor_model_parallel_size": 3},
         "actor_train.device_mapping: its 4 GPUs must be divisible by Megatron's model parallelism "
         "(TP=3 x PP=1 x CP=1 = 3)"),
        (MULTI, MULTI_SHAPE, {"actor_infer.strategy_args.strategy_config.tensor_parallel_size": 3},
         "actor_infer.device_mapping: must hold whole vLLM engines of tensor_parallel_size x pipeline_parallel_size "
         "= 3 x 1 = 3 GPUs; got 'list(range(0,4))'"),
        (SINGLE, DEV, {"actor_infer.strategy_args.strategy_name": "hf_infer"},
         "actor_infer.strategy_args.strategy_name: must be vllm or sglang; got 'hf_infer'"),
        (SINGLE, DEV, {"actor_infer.strategy_args.strategy_name": "vllm_v2"},
         "actor_infer.strategy_args.strategy_name: must be one of 'hf_infer', 'vllm'"),
        (SINGLE, DEV, {"sequence_length": None, "response_length": 512},
         "prompt_length: must be set when only response_length is"),
        (SINGLE, DEV, {"pretrain": None}, "pretrain: must name the model"),
        (SINGLE, DEV, {"custom_envs.FrozenLake": "${custom_env.FrozenLak}"},
         "custom_envs.FrozenLake: refers to ${custom_env.FrozenLak}, which is not a key of the config"),
        (RLVR, LARGE, {"prompt_length": None, "sequence_length": 6144},
         "prompt_length: must be set for rlvr"),
        (RLVR, LARGE, {"async_generation_ratio": 0.5}, "async_generation_ratio: must be 0 (synchronous) or at least"),
        (SINGLE, DEV, {"track_with": "wandb", "tracker_kwargs.api_key": "abc123"},
         "tracker_kwargs.api_key: must not hold a credential in plain text"),
    ],
)
def test_each_rule_names_the_key_and_the_values(
    name: str, cluster: roll_render.Cluster, overrides: dict[str, Any], expected: str
) -> None:
    found = errors(name, cluster, overrides)
    assert any(e.startswith(expected) for e in found), found
    assert errors(name, cluster) == []


def test_rules_of_one_pipeline_do_not_apply_to_another() -> None:
    # The env-manager batch rules are AgenticConfig's; an RLVR config has no env managers and is not held to them.
    overrides = {"val_batch_size": 7, "train_env_manager.group_size": 3}
    assert not any(e.startswith("val_batch_size") for e in errors(RLVR, LARGE, {"val_batch_size": 7}))
    assert any(e.startswith("val_batch_size") for e in errors(SINGLE, DEV, overrides))
    # Without a prompt_length an agentic config is fine (sequence_length is set); RLVR needs one.
    assert errors(SINGLE, DEV, {"prompt_length": None}) == []


def test_megatron_dp_follows_the_interpolated_batch_size() -> None:
    # rollout_batch_size given as `${...}` (as ROLL's YAMLs often do) is followed to its value.
    found = errors(MULTI, MULTI_SHAPE, {"max_actions_per_traj": 10, "rollout_batch_size": "${max_actions_per_traj}"})
    assert any(e.startswith("rollout_batch_size: must be divisible by Megatron's data-parallel size 4") for e in found)


def test_non_contiguous_mappings_are_warnings_not_errors() -> None:
    result = check(MULTI, MULTI_SHAPE, {"reference.device_mapping": "[0, 2]"})
    assert result.errors == []
    assert any(w.key == "reference.device_mapping" and "#205" in w.message for w in result.warnings)
    spread = {f"{r}.device_mapping": "[2, 3]" for r in ("actor_train", "actor_infer", "reference")}
    assert any("not a contiguous range from 0" in w.message for w in check(SINGLE, MULTI_SHAPE, spread).warnings)


# ------------------------------------------------------------------------------------------- Hydra defaults
def test_the_defaults_are_merged_in_and_hydra_composes_the_result_like_rolls_launcher(tmp_path: Path) -> None:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    composed, files = compose(EXAMPLES.read, MULTI)
    assert files == [MULTI, "config/traj_envs.yaml"]
    assert "defaults" not in composed
    assert composed["max_tokens_per_step"] == 64  # the example's own value wins over traj_envs.yaml's 128
    text = rendered(MULTI, MULTI_SHAPE, {"max_actions_per_traj": 5}).yaml_text()
    # Alone in a folder (nothing else of the checkout next to it), as the head's examples/pulumi/ may be.
    (tmp_path / "multi-demo.yaml").write_text(text)
    with initialize_config_dir(config_dir=str(tmp_path), job_name="app", version_base=None):
        config = OmegaConf.to_container(hydra_compose(config_name="multi-demo"), resolve=True)
    assert isinstance(config, dict)
    assert config["custom_envs"]["FrozenLake"]["max_steps"] == 5
    assert config["actor_train"]["device_mapping"] == "list(range(0,4))"


def test_compose_follows_hydras_order_packages_and_groups() -> None:
    files = {
        "demo/main.yaml": yaml.safe_dump({
            "defaults": ["common", {"grp@g": "opt"}, "_self_", "/late", "optional missing", "hydra/job_logging"],
            "a": 1, "b": 1,
        }),
        "demo/common.yaml": "a: 0\nc: 0\n",
        "demo/grp/opt.yaml": "x: 2\n",
        "demo/late.yaml": "b: 9\n",
    }
    config, used = compose(files.get, "demo/main.yaml")
    # Before _self_ the file's own values win, after it the later entry wins; `@g` places a group entry.
    assert config == {"defaults": ["hydra/job_logging", "_self_"], "a": 1, "c": 0, "g": {"x": 2}, "b": 9}
    assert used == ["demo/main.yaml", "demo/common.yaml", "demo/grp/opt.yaml", "demo/late.yaml"]
    with pytest.raises(ComposeError, match=r"defaults entry 'nothere' names examples/demo/nothere.yaml"):
        compose({"demo/main.yaml": "defaults: [nothere]\n"}.get, "demo/main.yaml")
    with pytest.raises(FileNotFoundError):
        compose(files.get, "demo/absent.yaml")
