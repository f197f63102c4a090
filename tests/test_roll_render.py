"""ROLL's config renderer, run for real: as the head runs it (a python3 subprocess in a ROLL-like checkout) and as
an import, on stand-ins of ROLL's example YAMLs (tests/fixtures/roll_examples, written for these tests).

The checkout here is a copy of the fixtures laid out like ROLL's examples/; the only stand-in is that these are
not ROLL's real files (there is no ROLL checkout on the test machine)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.frameworks import roll_render
from infra.frameworks.base import ClusterShape

FIXTURES = Path(__file__).parent / "fixtures" / "roll_examples"
RENDERER = Path(roll_render.__file__)
SINGLE = "agentic_demo/agent_val_frozen_lake_single_node_demo.yaml"
MULTI = "agentic_demo/agent_val_frozen_lake_multi_nodes_demo.yaml"
RLVR = "qwen2.5-7B-rlvr_megatron/rlvr_config.yaml"

DEV = roll_render.Cluster("dev", 1, 1, False, None, "/data")  # 1 x V100
MULTI_SHAPE = roll_render.Cluster("multi", 2, 2, False, "/mnt/shared", "/data")  # 2 x 2 V100, NAS
LARGE = roll_render.Cluster("large", 2, 8, True, "/mnt/shared", "/data")  # 2 x 8 H20-class, bf16


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def rendered(name: str, cluster: roll_render.Cluster, overrides: dict[str, Any] | None = None) -> roll_render.Rendered:
    return roll_render.render(fixture(name), cluster, overrides or {}, f"examples/{name}", "examples/pulumi/t.yaml")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A directory laid out like the ROLL checkout on the head: <root>/examples/<dir>/<name>.yaml."""
    shutil.copytree(FIXTURES, tmp_path / "examples")
    return tmp_path


def run_renderer(checkout: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # python3 as on the head; the test interpreter's, so PyYAML is the one the suite installs.
    return subprocess.run(
        [sys.executable, str(RENDERER), *args], cwd=checkout, capture_output=True, text=True, timeout=60
    )


def render_cli(
    checkout: Path, base: str, cluster: roll_render.Cluster, overrides: dict[str, Any] | None = None, name: str = "out"
) -> dict[str, Any]:
    (checkout / "cluster.json").write_text(cluster.to_json())
    (checkout / "overrides.json").write_text(json.dumps(overrides or {}))
    out = f"examples/pulumi/{name}.yaml"
    result = run_renderer(
        checkout,
        "--base",
        f"examples/{base}",
        "--cluster",
        "cluster.json",
        "--overrides",
        "overrides.json",
        "--out",
        out,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = yaml.safe_load((checkout / out).read_text())
    return config


def roles(config: dict[str, Any]) -> dict[str, str]:
    return {role: config[role]["device_mapping"] for role in ("actor_train", "actor_infer", "reference")}


# ------------------------------------------------------------------------------------------ the three stacks
def test_dev_stack_one_v100_gets_one_gpu_fp16_and_node_local_outputs(checkout: Path) -> None:
    config = render_cli(checkout, SINGLE, DEV, name="dev-demo")
    assert roles(config) == dict.fromkeys(("actor_train", "actor_infer", "reference"), "list(range(0,1))")
    assert {config[r]["model_args"]["dtype"] for r in ("actor_train", "actor_infer", "reference")} == {"fp16"}
    # No NAS: outputs on the node's data dir instead of the example's internal mounts.
    assert config["checkpoint_config"]["output_dir"] == "/data/roll/dev/checkpoints"
    assert config["tracker_kwargs"]["log_dir"] == "/data/roll/dev/tensorboard"
    assert config["render_save_dir"] == "/data/roll/dev/render"
    assert config["num_gpus_per_node"] == 1
    check = run_renderer(checkout, "--check", "examples/pulumi/dev-demo.yaml", "--cluster", "cluster.json")
    assert check.returncode == 0, check.stderr


def test_multi_stack_spans_four_gpus_across_two_nodes_with_shared_outputs(checkout: Path) -> None:
    config = render_cli(checkout, MULTI, MULTI_SHAPE)
    assert set(roles(config).values()) == {"list(range(0,4))"}
    assert config["num_gpus_per_node"] == 2
    assert config["checkpoint_config"]["output_dir"] == "/mnt/shared/roll/multi/checkpoints"
    assert config["logging_dir"] == "/mnt/shared/roll/multi/logs"
    assert config["output_dir"] == "/mnt/shared/roll/multi/output"


def test_device_mappings_follow_the_cluster_not_the_base() -> None:
    # The single-GPU demo on 2 x 2 GPUs, the 4-GPU demo on one 8-GPU node: all roles span the cluster.
    assert set(roles(rendered(SINGLE, MULTI_SHAPE).config).values()) == {"list(range(0,4))"}
    eight = roll_render.Cluster("one8", 1, 8, True, None, "/data")
    assert set(roles(rendered(MULTI, eight).config).values()) == {"list(range(0,8))"}


def test_large_stack_keeps_the_rollout_subset_and_bf16(checkout: Path) -> None:
    config = render_cli(checkout, RLVR, LARGE)
    assert config["actor_train"]["device_mapping"] == "list(range(0,16))"
    assert config["reference"]["device_mapping"] == "list(range(0,16))"
    assert config["actor_infer"]["device_mapping"] == "list(range(0,12))"  # a subset of the base: kept
    assert config["rewards"]["llm_judge"]["device_mapping"] == "list(range(12,16))"
    assert {config[r]["model_args"]["dtype"] for r in ("actor_train", "actor_infer", "reference")} == {"bf16"}
    header = (checkout / "examples/pulumi/out.yaml").read_text().splitlines()
    assert any(line.startswith("# kept: actor_infer.device_mapping") for line in header)


def test_gpus_without_bf16_get_fp16_on_every_model_including_reward_workers() -> None:
    v100s = roll_render.Cluster("v", 2, 8, False, None, "/data")
    config = rendered(RLVR, v100s).config
    dtypes = {
        "actor_train": config["actor_train"]["model_args"]["dtype"],
        "actor_infer": config["actor_infer"]["model_args"]["dtype"],
        "reference": config["reference"]["model_args"]["dtype"],
        "llm_judge": config["rewards"]["llm_judge"]["model_args"]["dtype"],
        "math_rule": config["rewards"]["math_rule"]["model_args"]["dtype"],
    }
    assert set(dtypes.values()) == {"fp16"}, dtypes
    assert "bf16" not in rendered(RLVR, v100s).yaml_text()


def test_rlvr_on_one_node_reports_the_roles_that_no_longer_fit() -> None:
    one_node = roll_render.Cluster("small", 1, 8, True, None, "/data")
    result = rendered(RLVR, one_node)
    assert result.config["actor_train"]["device_mapping"] == "list(range(0,8))"
    errors = roll_render.check(result.config, one_node).errors
    assert any(
        e.startswith("actor_infer.device_mapping: GPU indices must be within 0..7") and "'list(range(0,12))'" in e
        for e in errors
    ), errors
    assert any(e.startswith("rewards.llm_judge.device_mapping:") for e in errors), errors


# ----------------------------------------------------------------------------------------------- overrides
def test_overrides_are_merged_last_over_the_hardware_defaults() -> None:
    overrides = {
        "actor_train": {"device_mapping": "list(range(0,2))", "training_args": {"learning_rate": 5.0e-7}},
        "val_env_manager.tags": ["FrozenLake"],  # dotted key, list replaces
        "reference.model_args.dtype": "bf16",  # the user wins over the fp16 default
        "max_actions_per_traj": 5,  # a new top-level variable for the traj_envs include
    }
    config = rendered(SINGLE, MULTI_SHAPE, overrides).config
    assert config["actor_train"]["device_mapping"] == "list(range(0,2))"
    assert config["actor_train"]["training_args"] == {
        "learning_rate": 5.0e-7,
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 16,
    }
    assert config["val_env_manager"]["tags"] == ["FrozenLake"]
    assert config["val_env_manager"]["num_env_groups"] == 2  # siblings of a merged dict stay
    assert config["reference"]["model_args"] == {"dtype": "bf16", "model_type": None}
    assert config["actor_infer"]["device_mapping"] == "list(range(0,4))"
    assert config["max_actions_per_traj"] == 5
    warnings = roll_render.check(config, MULTI_SHAPE).warnings
    assert any(w.startswith("reference.model_args.dtype: bf16 on GPUs without bf16") for w in warnings)


def test_a_null_override_removes_a_value() -> None:
    config = rendered(SINGLE, DEV, {"sequence_length": None}).config
    assert config["sequence_length"] is None
    assert any(e.startswith("response_length / sequence_length") for e in roll_render.check(config, DEV).errors)


# -------------------------------------------------------------------------------------------------- checks
@pytest.mark.parametrize(
    ("cluster", "overrides", "expected"),
    [
        (
            DEV,
            {"actor_train.device_mapping": "list(range(0,8))"},
            "actor_train.device_mapping: GPU indices must be within 0..0 (the cluster has 1 node(s) x 1 GPU(s) = 1); "
            "got 'list(range(0,8))'",
        ),
        (DEV, {"reference.device_mapping": "list(range(0"}, "reference.device_mapping: must be `list(range(a,b))`"),
        (
            DEV,
            {"train_env_manager.group_size": 3},
            "rollout_batch_size: must be a multiple of train_env_manager.group_size; got rollout_batch_size=16, "
            "train_env_manager.group_size=3",
        ),
        (
            DEV,
            {"val_env_manager.group_size": 3},
            "val_batch_size: must be a multiple of val_env_manager.group_size; got val_batch_size=16, "
            "val_env_manager.group_size=3",
        ),
        (
            DEV,
            {"val_batch_size": 6, "val_env_manager.group_size": 2},
            "val_batch_size: must be divisible by val_env_manager.num_env_groups x group_size; got val_batch_size=6, "
            "num_env_groups=2, group_size=2 (= 4)",
        ),
        (
            MULTI_SHAPE,
            {"rollout_batch_size": 18},
            "rollout_batch_size: must be divisible by Megatron's data-parallel size 4 (4 GPUs of "
            "actor_train.device_mapping / TP=1 x PP=1 x CP=1 = 1); got rollout_batch_size=18",
        ),
        (
            MULTI_SHAPE,
            {"actor_train.strategy_args.strategy_config.tensor_model_parallel_size": 3},
            "actor_train.device_mapping: its 4 GPUs must be divisible by the model parallelism "
            "(TP=3 x PP=1 x CP=1 = 3)",
        ),
        (
            DEV,
            {"actor_infer.strategy_args.strategy_name": "hf_infer"},
            "actor_infer.strategy_args.strategy_name: must be vllm or sglang (ROLL asserts it); got 'hf_infer'",
        ),
        (
            DEV,
            {"sequence_length": None},
            "response_length / sequence_length: one of them must be set (ROLL asserts it); got response_length=None, "
            "sequence_length=None",
        ),
    ],
)
def test_each_constraint_names_the_key_and_the_values(
    cluster: roll_render.Cluster, overrides: dict[str, Any], expected: str
) -> None:
    base = MULTI if cluster is MULTI_SHAPE else SINGLE
    errors = roll_render.check(rendered(base, cluster, overrides).config, cluster).errors
    assert any(e.startswith(expected) for e in errors), errors
    assert roll_render.check(rendered(base, cluster).config, cluster).errors == []


def test_megatron_dp_follows_the_interpolated_batch_size() -> None:
    # rollout_batch_size given as `${...}` (as ROLL's YAMLs often do) is followed to its value.
    config = rendered(MULTI, MULTI_SHAPE, {"my_batch": 10, "rollout_batch_size": "${my_batch}"}).config
    errors = roll_render.check(config, MULTI_SHAPE).errors
    assert any(e.startswith("rollout_batch_size: must be divisible by Megatron's data-parallel size 4") for e in errors)


def test_non_contiguous_mappings_are_warnings_not_errors() -> None:
    config = rendered(MULTI, MULTI_SHAPE, {"reference.device_mapping": "[0, 2]"}).config
    result = roll_render.check(config, MULTI_SHAPE)
    assert result.errors == []
    assert any(
        w.startswith("reference.device_mapping: not a contiguous range") and "#205" in w for w in result.warnings
    )
    spread = rendered(
        SINGLE,
        MULTI_SHAPE,
        {
            "actor_train.device_mapping": "[2, 3]",
            "actor_infer.device_mapping": "[2, 3]",
            "reference.device_mapping": "[2, 3]",
        },
    ).config
    assert any("not a contiguous range from 0" in w for w in roll_render.check(spread, MULTI_SHAPE).warnings)


def test_check_cli_refuses_a_bad_config_naming_the_key(checkout: Path) -> None:
    render_cli(checkout, SINGLE, DEV, {"actor_infer": {"device_mapping": "list(range(0,2))"}})
    result = run_renderer(checkout, "--check", "examples/pulumi/out.yaml", "--cluster", "cluster.json")
    assert result.returncode == 1
    assert "ERROR actor_infer.device_mapping: GPU indices must be within 0..0" in result.stderr
    assert "'list(range(0,2))'" in result.stderr


# ------------------------------------------------------------------------------- output place and defaults
def test_output_lives_under_examples_pulumi_and_its_defaults_resolve(checkout: Path) -> None:
    config = render_cli(checkout, SINGLE, DEV, name="dev-demo")
    out_dir = checkout / "examples" / "pulumi"
    assert (out_dir / "dev-demo.yaml").is_file()
    assert config["defaults"] == ["../config/traj_envs@_here_"]  # a sibling folder: the same text still works
    assert (out_dir / "../config/traj_envs.yaml").resolve().is_file()
    check = run_renderer(checkout, "--check", "examples/pulumi/dev-demo.yaml", "--cluster", "cluster.json")
    assert check.returncode == 0, check.stderr
    # Without the included file the check says so before anything is submitted.
    (checkout / "examples/config/traj_envs.yaml").unlink()
    missing = run_renderer(checkout, "--check", "examples/pulumi/dev-demo.yaml", "--cluster", "cluster.json")
    assert missing.returncode == 1
    assert "defaults: '../config/traj_envs@_here_' resolves to" in missing.stderr


def test_defaults_relative_to_the_base_folder_are_re_aimed(checkout: Path) -> None:
    demo = checkout / "examples" / "agentic_demo"
    (demo / "common.yaml").write_text("from_common: 1\n")
    (demo / "grp").mkdir()
    (demo / "grp" / "opt.yaml").write_text("from_group: 2\n")
    base = yaml.safe_load(fixture(SINGLE))
    base["defaults"] = ["../config/traj_envs@_here_", "common", {"grp@g": "opt"}, "_self_"]
    (demo / "with_defaults.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    config = render_cli(checkout, "agentic_demo/with_defaults.yaml", DEV)
    # Same files, and the same packages Hydra would have used from the base's folder.
    assert config["defaults"] == [
        "../config/traj_envs@_here_",
        "../agentic_demo/common@_here_",
        {"../agentic_demo/grp@g": "opt"},
        "_self_",
    ]
    assert run_renderer(checkout, "--check", "examples/pulumi/out.yaml", "--cluster", "cluster.json").returncode == 0


@pytest.mark.skipif(importlib.util.find_spec("hydra") is None, reason="hydra-core is not installed in this venv")
def test_hydra_composes_the_generated_config_like_rolls_launcher(checkout: Path) -> None:
    from hydra import compose, initialize_config_dir  # type: ignore[import-not-found, unused-ignore]
    from omegaconf import OmegaConf  # type: ignore[import-not-found, unused-ignore]

    render_cli(checkout, MULTI, MULTI_SHAPE, {"max_actions_per_traj": 5}, name="multi-demo")
    with initialize_config_dir(config_dir=str(checkout / "examples" / "pulumi"), job_name="app", version_base=None):
        config = OmegaConf.to_container(compose(config_name="multi-demo"), resolve=True)
    assert config["custom_envs"]["FrozenLake"]["max_steps"] == 5
    assert config["actor_train"]["device_mapping"] == "list(range(0,4))"


# ------------------------------------------------------------------------------------------------- the CLI
def test_render_is_idempotent_and_matches_the_offline_preview(checkout: Path) -> None:
    overrides = {"max_steps": 3}
    render_cli(checkout, MULTI, MULTI_SHAPE, overrides, name="multi-demo")
    first = (checkout / "examples/pulumi/multi-demo.yaml").read_bytes()
    render_cli(checkout, MULTI, MULTI_SHAPE, overrides, name="multi-demo")
    assert (checkout / "examples/pulumi/multi-demo.yaml").read_bytes() == first
    shape = ClusterShape("multi", 2, 2, False, "10.0.0.1", "/mnt/shared", "/data", 8265)
    preview = roll_render.render_preview(fixture(MULTI), shape, overrides, MULTI, "multi-demo")
    assert preview == first.decode()
    assert not list((checkout / "examples/pulumi").glob("*.tmp"))


def test_a_missing_base_fails_naming_the_setting(checkout: Path) -> None:
    (checkout / "cluster.json").write_text(DEV.to_json())
    result = run_renderer(
        checkout, "--base", "examples/nope/missing.yaml", "--cluster", "cluster.json", "--out", "examples/pulumi/x.yaml"
    )
    assert result.returncode == 2
    assert "examples/nope/missing.yaml does not exist" in result.stderr
    assert "training.roll.baseConfig" in result.stderr
    assert not (checkout / "examples/pulumi/x.yaml").exists()


def test_the_renderer_runs_alone_as_shipped_to_the_head(checkout: Path) -> None:
    # Only its own text travels to the head: a lone copy, run isolated (-I: no PYTHONPATH, no cwd on sys.path).
    lone = checkout / "examples" / "pulumi" / ".roll-cluster" / "roll_render.py"
    lone.parent.mkdir(parents=True)
    shutil.copy(RENDERER, lone)
    (checkout / "cluster.json").write_text(DEV.to_json())
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            str(lone),
            "--base",
            f"examples/{SINGLE}",
            "--cluster",
            "cluster.json",
            "--out",
            "examples/pulumi/alone.yaml",
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((checkout / "examples/pulumi/alone.yaml").read_text())["num_gpus_per_node"] == 1
