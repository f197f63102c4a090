"""The framework adapters: what every node installs, what the head submits, and what is refused before deploy.

Shell commands the adapters produce (ROLL's render and check, verl's data preparation) are run for real with
bash in a temporary directory standing in for the container's /workspace/<repo> (no container here); the path
is the only thing substituted."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from framework_contracts import module_arguments

from infra.config import SECRETS, ContainerConfig, TrainingConfig
from infra.frameworks import (
    ClusterShape,
    CodeSpec,
    CustomAdapter,
    JobSpec,
    OpenRlhfAdapter,
    RollAdapter,
    VerlAdapter,
    adapter_for,
    check_before_deploy,
)
from infra.frameworks.roll import roll_resume_command
from infra.frameworks.verl import hydra_value

RAY_SUBMISSION_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
SHARED = "/mnt/shared"


def training(**fields: Any) -> TrainingConfig:
    return TrainingConfig.model_validate(fields)


def container(image: str | None = None) -> ContainerConfig:
    return ContainerConfig.model_validate({"image": image} if image else {})


def shape(
    nodes: int = 2,
    gpus: int = 8,
    *,
    bf16: bool = True,
    shared: str | None = SHARED,
    stack: str = "large",
    head_ip: str = "10.0.0.5",
) -> ClusterShape:
    return ClusterShape(stack, nodes, gpus, bf16, head_ip, shared, "/data", 8265)


def job_of(config: TrainingConfig, cluster: ClusterShape | None = None, image: str | None = None) -> JobSpec:
    return adapter_for(config, container(image)).job(cluster or shape())


def in_bash(command: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # The venv's python3 first on PATH: the commands call `python3`, as the container's does.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


# ------------------------------------------------------------------------------------------------- job ids
FRAMEWORK_CONFIGS: dict[str, dict[str, Any]] = {
    "roll": {
        "framework": "roll",
        "roll": {"baseConfig": "agentic_demo/agent_val_frozen_lake_multi_nodes_demo.yaml"},
        # Divisible by Megatron's data-parallel size on every shape below (8, 16 and 24 GPUs).
        "overrides": {"rollout_batch_size": 48},
    },
    "verl": {"framework": "verl"},
    "openrlhf": {
        "framework": "openrlhf",
        "openrlhf": {"vllmNumEngines": 16},
        "overrides": {"train.colocate_all": True},
    },
    "custom": {"framework": "custom", "custom": {"entrypoint": "python3 train.py"}},
    "mindspeed-rl": {
        "framework": "mindspeed-rl",
        "mindspeedRl": {"tokenizerPath": "/m/Qwen2.5-7B", "dataPath": "/m/data", "loadPath": "/m/Qwen2.5-7B-mcore"},
    },
}
SECTION_OF = {"roll": "roll", "verl": "verl", "openrlhf": "openrlhf", "mindspeed-rl": "mindspeedRl"}


@pytest.mark.parametrize("framework", FRAMEWORK_CONFIGS)
def test_job_id_is_stable_for_the_same_config_and_valid_for_ray(framework: str) -> None:
    first = job_of(training(**FRAMEWORK_CONFIGS[framework])).job_id
    again = job_of(training(**json.loads(json.dumps(FRAMEWORK_CONFIGS[framework])))).job_id
    assert first == again
    assert RAY_SUBMISSION_ID.match(first), first
    assert first.startswith(f"{framework}-large-")
    # Neither a new head IP (a replaced node) nor autoStart make it another training run.
    assert job_of(training(**FRAMEWORK_CONFIGS[framework]), shape(head_ip="10.0.0.9")).job_id == first
    assert job_of(training(**FRAMEWORK_CONFIGS[framework], autoStart=False)).job_id == first


@pytest.mark.parametrize("framework", ["roll", "verl", "openrlhf", "mindspeed-rl"])
def test_job_id_ignores_where_the_code_is_downloaded_from(framework: str) -> None:
    base = FRAMEWORK_CONFIGS[framework]
    name = SECTION_OF[framework]
    section = {**base.get(name, {}), "pipIndexUrl": "https://pypi.example.com/simple/"}
    if framework != "openrlhf":
        section["archiveUrl"] = "https://oss.example.com/code.tar.gz"
    assert job_of(training(**{**base, name: section})).job_id == job_of(training(**base)).job_id


@pytest.mark.parametrize(
    ("framework", "change"),
    [
        ("roll", {"overrides": {"max_steps": 10}}),
        ("roll", {"roll": {"ref": "v0.2.0"}}),
        ("verl", {"overrides": {"data.train_batch_size": 256}}),
        ("verl", {"verl": {"ref": "v0.6.0"}}),
        ("openrlhf", {"overrides": {"train.colocate_all": True, "rollout.batch_size": 64}}),
        ("custom", {"custom": {"entrypoint": "python3 train.py --lr 1e-5"}}),
        ("mindspeed-rl", {"overrides": {"rl_config.n_samples_per_prompt": 16}}),
        ("mindspeed-rl", {"mindspeedRl": {"megatron": {"ref": "core_r0.8.0"}}}),
    ],
)
def test_job_id_changes_with_the_config_or_the_code_ref(framework: str, change: dict[str, Any]) -> None:
    base = FRAMEWORK_CONFIGS[framework]
    changed = {**base, **{k: {**base.get(k, {}), **v} for k, v in change.items()}}
    assert job_of(training(**changed)).job_id != job_of(training(**base)).job_id


@pytest.mark.parametrize("framework", FRAMEWORK_CONFIGS)
def test_job_id_changes_with_the_cluster_shape_and_image(framework: str) -> None:
    config = training(**FRAMEWORK_CONFIGS[framework])
    reference = job_of(config).job_id
    assert job_of(config, shape(nodes=3)).job_id != reference
    assert job_of(config, shape(gpus=4)).job_id != reference
    assert job_of(config, shape(shared=None)).job_id != reference
    other_image = "roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-24.05-py3-torch260-sglang046"
    assert job_of(config, image=other_image).job_id != reference


# ---------------------------------------------------------------------------------------------------- ROLL
DEV_CONFIG = {"framework": "roll"}  # the defaults: agentic, frozen-lake single-node demo


def test_roll_code_is_the_pinned_checkout_with_the_image_s_requirements() -> None:
    env = RollAdapter(training(**DEV_CONFIG), container()).code().env("roll")
    ref = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"
    assert env == {
        "CONTAINER_NAME": "roll",
        "CODE_REPO": "https://github.com/alibaba/ROLL.git",
        "CODE_REF": ref,
        "CODE_MIRROR_REPO": "",  # no mainland mirror of ROLL is known (docs/frameworks.md)
        "CODE_DIR": "/workspace/ROLL",
        "CODE_ARCHIVE_URL": f"https://github.com/alibaba/ROLL/archive/{ref}.tar.gz",
        "PIP_INDEX_URL": "https://mirrors.aliyun.com/pypi/simple/",
        "REQUIREMENTS_FILE": "requirements_torch260_vllm.txt",
        "INSTALL_EDITABLE": "1",
        "PIP_EXTRA_PACKAGES": "",
        "PIP_UNINSTALL_PACKAGES": "",
    }


@pytest.mark.parametrize(
    ("tag", "requirements"),
    [
        ("nvcr-24.05-py3-torch260-vllm084", "requirements_torch260_vllm.txt"),
        ("nvcr-24.05-py3-torch260-sglang046", "requirements_torch260_sglang.txt"),
        ("nvcr-25.06-py3-torch280-vllm0110", "requirements_torch280_vllm.txt"),
        ("nvcr-25.06-py3-torch280-vllm0102", "requirements_torch280_vllm.txt"),
        ("nvcr-25.11-py3-torch2100-mcore0160dev-vllm016dev", "requirements_torch2100_vllm.txt"),
    ],
)
def test_roll_requirements_follow_the_image_tag_even_in_a_mirror(tag: str, requirements: str) -> None:
    for registry in ("roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch", "registry.example.com:5000/me/roll"):
        code = RollAdapter(training(**DEV_CONFIG), container(f"{registry}:{tag}")).code()
        assert code.requirements_file == requirements


def test_roll_requirements_file_setting_wins_and_an_unknown_tag_is_refused() -> None:
    custom_image = "registry.example.com/me/roll:latest"
    chosen = training(framework="roll", roll={"requirementsFile": "requirements_torch280_sglang.txt"})
    assert RollAdapter(chosen, container(custom_image)).code().requirements_file == "requirements_torch280_sglang.txt"
    assert check_before_deploy(chosen, container(custom_image), shape(1, 1, bf16=False)) == []

    problems = check_before_deploy(training(**DEV_CONFIG), container(custom_image), shape(1, 1, bf16=False))
    assert len(problems) == 1
    assert problems[0].startswith(
        "roll-cluster:container.image: no ROLL requirements file is known for the tag 'latest'"
    )
    assert "roll-cluster:training.roll.requirementsFile" in problems[0]
    with pytest.raises(ValueError, match=re.escape("roll-cluster:training.roll.requirementsFile")):
        adapter_for(training(**DEV_CONFIG), container(custom_image)).code()


def test_roll_job_submits_the_launcher_on_the_config_built_before_deployment() -> None:
    job = job_of(training(**DEV_CONFIG), shape(1, 1, bf16=False, shared=None, stack="dev"))
    assert job.workdir == "/workspace/ROLL"
    assert job.entrypoint == (
        "cd /workspace/ROLL && "
        + roll_resume_command("examples/pulumi/dev-agent_val_frozen_lake_single_node_demo.yaml")
        + " && PYTHONPATH=/workspace/ROLL python3 examples/start_agentic_pipeline.py "
        "--config_path pulumi --config_name dev-agent_val_frozen_lake_single_node_demo"
    )
    # One file travels: the YAML itself. Nothing is rendered on the head.
    path = "/workspace/ROLL/examples/pulumi/dev-agent_val_frozen_lake_single_node_demo.yaml"
    assert list(job.files) == [path]
    assert job.files[path] == job.rendered_config
    assert job.prepare is None
    config = yaml.safe_load(job.files[path])
    assert "defaults" not in config and config["custom_env"]["FrozenLake"]["env_type"] == "frozen_lake"
    assert {config[r]["model_args"]["dtype"] for r in ("actor_train", "actor_infer", "reference")} == {"fp16"}
    assert job.runtime_env is None and job.reward_server is None


def here(command: str | None, container_dir: str, local_dir: Path) -> str:
    """A job's shell command with the container's checkout path replaced by a local stand-in."""
    assert command is not None
    return command.replace(container_dir, shlex.quote(str(local_dir)))


def test_roll_pre_submit_check_refuses_a_checkout_without_the_launcher(tmp_path: Path) -> None:
    job = job_of(training(**DEV_CONFIG), shape(1, 1, bf16=False, stack="dev"))
    (tmp_path / "examples").mkdir()
    missing = in_bash(here(job.pre_submit_check, "/workspace/ROLL", tmp_path))
    assert missing.returncode == 1
    assert "no examples/start_agentic_pipeline.py" in missing.stderr
    (tmp_path / "examples" / "start_agentic_pipeline.py").write_text("")
    assert in_bash(here(job.pre_submit_check, "/workspace/ROLL", tmp_path)).returncode == 0


def test_roll_summary_says_where_the_config_came_from_and_what_was_applied() -> None:
    summary = job_of(training(**DEV_CONFIG), shape(1, 1, bf16=False, shared=None, stack="dev")).summary
    assert summary["base_config"] == "examples/agentic_demo/agent_val_frozen_lake_single_node_demo.yaml"
    assert summary["files_read"] == [
        "examples/agentic_demo/agent_val_frozen_lake_single_node_demo.yaml",
        "examples/config/traj_envs.yaml",
    ]
    assert summary["read_from"] == os.environ["ROLL_CHECKOUT"]
    assert summary["generated_config"] == (
        "/workspace/ROLL/examples/pulumi/dev-agent_val_frozen_lake_single_node_demo.yaml"
    )
    applied = " | ".join(summary["hardware_defaults"]["applied"])
    assert "list(range(0,1))" in applied and "/data/roll/dev" in applied
    assert "actor_train.model_args.flash_attn: dropped" in applied
    assert any("rollout_batch_size" in check for check in summary["checks"])


def test_roll_summary_shows_what_was_kept() -> None:
    config = training(
        framework="roll", roll={"pipeline": "rlvr", "baseConfig": "qwen2.5-7B-rlvr_megatron/rlvr_config.yaml"}
    )
    job = job_of(config)
    assert "device_mapping: list(range(0,12))" in (job.rendered_config or "")
    kept = job.summary["hardware_defaults"]["kept"]
    assert any(line.startswith("actor_infer.device_mapping: kept") for line in kept)


def test_roll_checks_before_deploy_name_the_override_key() -> None:
    config = training(
        framework="roll",
        roll={"pipeline": "rlvr", "baseConfig": "qwen2.5-7B-rlvr_megatron/rlvr_config.yaml"},
        overrides={"actor_infer.strategy_args.strategy_name": "hf_infer"},
    )
    problems = check_before_deploy(config, container(), shape(2, 8))
    assert problems == [
        "roll-cluster:training.overrides.actor_infer.strategy_args.strategy_name: must be vllm or sglang; got "
        "'hf_infer'"
    ]


@pytest.mark.parametrize(
    ("engine", "refused_key"),
    [
        ({"max_model_len": None}, "max_model_len"),
        ({"max_model_len": 16384, "max_num_batched_tokens": 8192}, "max_num_batched_tokens"),
        ({"max_model_len": 16384}, None),  # the program raises ROLL's 8192 to hold it
        ({"max_model_len": 16384, "max_num_batched_tokens": 16384}, None),
        ({"max_model_len": 16384, "enable_chunked_prefill": True}, None),
    ],
)
def test_roll_v0_engine_on_v100_beyond_its_token_budget_is_refused_naming_the_key(
    engine: dict[str, Any], refused_key: str | None
) -> None:
    config = training(
        framework="roll", roll={"baseConfig": "agentic_demo/agent_val_frozen_lake_single_node_demo.yaml"},
        overrides={f"actor_infer.strategy_args.strategy_config.{k}": v for k, v in engine.items()},
    )
    problems = check_before_deploy(config, container(), shape(1, 1, bf16=False, shared=None, stack="dev"))
    if refused_key is None:
        assert problems == []
    else:
        assert len(problems) == 1, problems
        assert problems[0].startswith(
            f"roll-cluster:training.overrides.actor_infer.strategy_args.strategy_config.{refused_key}: vLLM's V0 engine"
        ), problems
        assert "SchedulerConfig._verify_args" in problems[0]


@pytest.mark.parametrize(
    ("image", "said"),
    [
        (None, "the image ships 0.11.0 (docker/Dockerfile.torch260.vllm:21), mcore_adapter needs >=0.15.0,<0.19.0"),
        ("roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-25.06-py3-torch280-vllm0110",
         "the image ships 0.13 (docker/Dockerfile.torch280:22"),
        ("roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-25.11-py3-torch2100-mcore0160dev-vllm016dev",
         "the image's 0.16.0 (docker/Dockerfile.torch2100:21 (core_dev_r0.16.0)) meets mcore_adapter's"),
    ],
)
def test_roll_plan_says_whether_the_images_megatron_core_meets_mcore_adapters_pin(image: str | None,
                                                                                   said: str) -> None:
    """ROLL's requirements install ./mcore_adapter (megatron-core >=0.15,<0.19); the default torch260 image, the only
    one that runs on V100, ships 0.11.0: the plan says the code step replaces it with a prebuilt wheel."""
    config = training(framework="roll", roll={"baseConfig": "agentic_demo/agent_val_frozen_lake_multi_nodes_demo.yaml"})
    summary = job_of(config, image=image).summary
    assert summary["code"]["megatron_core"].startswith(said), summary["code"]["megatron_core"]
    if image is None:
        assert "a prebuilt cp310 wheel, torch>=2.6.0, nothing compiled" in summary["code"]["megatron_core"]


def test_roll_base_values_that_do_not_fit_name_the_key_and_the_base() -> None:
    fits = training(
        framework="roll", roll={"pipeline": "rlvr", "baseConfig": "qwen2.5-7B-rlvr_megatron/rlvr_config.yaml"}
    )
    problems = check_before_deploy(fits, container(), shape(1, 8))
    assert len(problems) == 2, problems  # rollout on 0-11 and the judge on 12-15 do not fit one 8-GPU node
    assert problems[0].startswith(
        "roll-cluster:training.overrides.actor_infer.device_mapping: GPU indices must be within 0..7"
    )
    assert problems[1].startswith("roll-cluster:training.overrides.rewards.llm_judge.device_mapping:")
    assert all("roll-cluster:training.roll.baseConfig qwen2.5-7B-rlvr_megatron/rlvr_config.yaml" in p for p in problems)
    assert check_before_deploy(fits, container(), shape(2, 8)) == []
    one_node = training(
        framework="roll", roll={"pipeline": "rlvr", "baseConfig": "qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus.yaml"}
    )
    assert check_before_deploy(one_node, container(), shape(1, 8)) == []


def test_roll_a_misspelt_override_key_is_refused_with_the_nearest_field() -> None:
    config = training(framework="roll", overrides={"actor_train.model_args.dtpye": "fp16", "max_step": 3})
    problems = check_before_deploy(config, container(), shape(1, 1, bf16=False, stack="dev"))
    assert sorted(problems) == [
        "roll-cluster:training.overrides.actor_train.model_args.dtpye: is not a field of ROLL's ModelArguments "
        "(roll/configs/model_args.py:53); did you mean 'dtype'?",
        "roll-cluster:training.overrides.max_step: is not a field of ROLL's AgenticConfig "
        "(roll/pipeline/agentic/agentic_config.py:186); did you mean 'max_steps'?",
    ]


def test_roll_a_missing_base_config_is_named_with_what_exists() -> None:
    config = training(framework="roll", roll={"baseConfig": "agentic_demo/frozen_lake.yaml"})
    problems = check_before_deploy(config, container(), shape(1, 1, bf16=False, stack="dev"))
    assert len(problems) == 1
    assert problems[0].startswith("roll-cluster:training.roll.baseConfig: must name a file under ROLL's examples/")
    assert "got 'agentic_demo/frozen_lake.yaml', which does not exist" in problems[0]
    assert "agentic_demo/agent_val_frozen_lake_single_node_demo.yaml" in problems[0]


# ---------------------------------------------------------------------------------------------------- verl
def test_verl_command_line_for_two_nodes_of_eight_gpus() -> None:
    config = training(
        framework="verl",
        overrides={
            "algorithm.adv_estimator": "grpo",
            "actor_rollout_ref": {"rollout": {"n": 5, "name": "sglang"}, "model": {"path": "Qwen/Qwen2.5-7B-Instruct"}},
            "trainer.logger": ["console", "tensorboard"],
            "+actor_rollout_ref.model.override_config.attn_implementation": "eager",
            "trainer.experiment_name": "gsm8k, 2 nodes",
            "actor_rollout_ref.actor.use_kl_loss": True,
        },
    )
    job = job_of(config, shape(2, 8, stack="verl"))
    args = ["python3", "-m", "verl.trainer.main_ppo", *module_arguments(job.entrypoint, "verl.trainer.main_ppo")]
    assert args[3:] == [
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=8",
        "data.train_files=/mnt/shared/data/gsm8k/train.parquet",
        "data.val_files=/mnt/shared/data/gsm8k/test.parquet",
        # Per stack and job; resumed after a config change; per GPU count (FSDP shards are per rank).
        "trainer.default_local_dir=/mnt/shared/checkpoints/verl/verl-16gpu",
        "trainer.save_freq=10",  # verl's -1 saves nothing
        "actor_rollout_ref.rollout.name=sglang",  # the user's value replaces the default in place
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "trainer.logger=[console,tensorboard]",
        # From the cluster: the mini-batch per GPU is 256 x 5 // 16 = 80, so 4 divides it.
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=5",
        "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        'trainer.experiment_name="gsm8k, 2 nodes"',
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.resume_mode=disable",  # no checkpoint handed over by the job step: a fresh start
    ]
    assert job.workdir == "/workspace/verl"
    assert job.runtime_env == {"env_vars": {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}}
    assert job.summary["hydra_overrides"] == args[3:-1]  # the plan-time ones; the resume mode is chosen at submission


def test_verl_defaults_without_overrides_use_vllm_console_and_node_local_checkpoints() -> None:
    args = shlex.split(job_of(training(framework="verl"), shape(1, 4, shared=None, stack="one")).entrypoint)
    assert "actor_rollout_ref.rollout.name=vllm" in args
    assert "trainer.logger=[console]" in args
    assert "trainer.default_local_dir=/data/checkpoints/one/verl-4gpu" in args


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("console", "console"),
        (["a", "b"], "[a,b]"),
        ({"x": 1, "y": [1, "a b"]}, '{x:1,y:[1,"a b"]}'),
        (1e-6, "1e-06"),
        (True, "true"),
        (None, "null"),
        ("true", '"true"'),
        ("123", '"123"'),
        ("a,b", '"a,b"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("http://1.2.3.4:5000/x", "http://1.2.3.4:5000/x"),
        ("${x.y}", '"${x.y}"'),
        ("", '""'),
        ("end\\", '"end\\\\"'),
    ],
)
def test_verl_values_are_written_in_hydra_override_grammar(value: Any, text: str) -> None:
    assert hydra_value(value) == text


def test_verl_values_read_back_through_hydra_when_available() -> None:
    parser_module = pytest.importorskip(
        "hydra.core.override_parser.overrides_parser", reason="hydra-core not installed"
    )
    parser = parser_module.OverridesParser.create()
    for value in ["x", ["console", "tb"], {"k": {"n": "v w"}}, 0.5, "a,b", 'q"', "back\\slash", "1e5", "~/x", "中文"]:
        assert parser.parse_override("k=" + hydra_value(value)).value() == value


def test_verl_data_preparation_runs_once_and_the_check_guards_submission(tmp_path: Path) -> None:
    data_dir = tmp_path / "shared data" / "gsm8k"
    marker = tmp_path / "runs"
    preparation = (
        f"echo run >> {shlex.quote(str(marker))} && "
        'python3 -c \'import pathlib,sys; d=pathlib.Path(sys.argv[1]); [(d/n).write_text("x") '
        'for n in ("train.parquet", "test.parquet")]\' {data_dir}'
    )
    config = training(framework="verl", verl={"dataDir": str(data_dir), "dataPreparation": preparation})
    job = job_of(config, shape(1, 8))
    checkout = tmp_path / "verl"
    checkout.mkdir()
    as_here = {
        "prepare": here(job.prepare, "/workspace/verl", checkout),
        "pre_submit_check": here(job.pre_submit_check, "/workspace/verl", checkout),
    }
    refused = in_bash(as_here["pre_submit_check"])
    assert refused.returncode == 1 and "verl data missing" in refused.stderr
    assert in_bash(as_here["prepare"]).returncode == 0
    again = in_bash(as_here["prepare"])
    assert again.returncode == 0 and "preparation skipped" in again.stdout
    assert marker.read_text() == "run\n"  # the second run did not prepare again
    assert in_bash(as_here["pre_submit_check"]).returncode == 0


def test_verl_failed_data_preparation_fails_the_prepare_step(tmp_path: Path) -> None:
    config = training(framework="verl", verl={"dataDir": str(tmp_path / "d"), "dataPreparation": "false || exit 3"})
    job = job_of(config, shape(1, 8))
    (tmp_path / "verl").mkdir()
    assert in_bash(here(job.prepare, "/workspace/verl", tmp_path / "verl")).returncode != 0


def test_verl_code_is_an_editable_checkout_without_requirements() -> None:
    code = VerlAdapter(training(framework="verl"), container()).code()
    assert (code.repo, code.ref, code.code_dir) == (
        "https://github.com/volcengine/verl.git",
        "v0.7.0",
        "/workspace/verl",
    )
    assert code.archive_url == "https://github.com/volcengine/verl/archive/v0.7.0.tar.gz"
    assert code.env("roll")["INSTALL_EDITABLE"] == "1" and code.env("roll")["REQUIREMENTS_FILE"] == ""
    # From mainland China regions gitee's mirror first, GitHub after it (docs/frameworks.md).
    assert code.env("roll")["CODE_MIRROR_REPO"] == "https://gitee.com/mirrors/verl.git"


def test_verl_checks_before_deploy() -> None:
    bad_batch = training(
        framework="verl",
        overrides={
            "data.train_batch_size": 100,
            "actor_rollout_ref.rollout.n": 1,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
        },
    )
    assert check_before_deploy(bad_batch, container(), shape(2, 8)) == [
        "roll-cluster:training.overrides.data.train_batch_size: data.train_batch_size x actor_rollout_ref.rollout.n "
        "must be divisible by the cluster's 16 GPUs (2 x 8); got 100 x 1 = 100"
    ]
    bad_tp = training(framework="verl", overrides={"actor_rollout_ref": {"rollout": {"tensor_model_parallel_size": 3}}})
    assert check_before_deploy(bad_tp, container(), shape(2, 8)) == [
        "roll-cluster:training.overrides.actor_rollout_ref.rollout.tensor_model_parallel_size: must divide the "
        "cluster's 16 GPUs (2 x 8); got 3"
    ]
    no_nas = check_before_deploy(training(framework="verl"), container(), shape(2, 8, shared=None))
    assert len(no_nas) == 1 and no_nas[0].startswith(
        "roll-cluster:training.verl.dataDir: must be on the shared storage"
    )
    good = training(framework="verl", overrides={"data.train_batch_size": 256, "actor_rollout_ref.rollout.n": 5})
    assert check_before_deploy(good, container(), shape(2, 8)) == []
    assert check_before_deploy(training(framework="verl"), container(), shape(1, 8, shared=None)) == []


# ------------------------------------------------------------------------------------------------ OpenRLHF
OPENRLHF = {
    "framework": "openrlhf",
    "openrlhf": {
        "vllmNumEngines": 8,
        "vllmTensorParallelSize": 2,
        "rewardServer": {
            "command": "python3 -m openrlhf.cli.serve_rm --port {port} --reward.model_name_or_path rm",
            "port": 5001,
            "healthTimeoutSeconds": 600,
        },
    },
    "overrides": {
        "train.colocate_all": True,
        "vllm.enable_sleep": True,
        "ds.enable_sleep": False,
        "actor": {"model_name_or_path": "Qwen/Qwen2.5-7B-Instruct"},
        "algo.advantage.estimator": "group_norm",
        "rollout.n_samples_per_prompt": 4,  # group_norm needs a group per prompt (upstream asserts it)
    },
}


def test_openrlhf_command_line_for_two_nodes_of_eight_gpus() -> None:
    job = job_of(training(**OPENRLHF), shape(2, 8, stack="rlhf", head_ip="172.16.0.10"))
    module = "openrlhf.cli.train_ppo_ray"
    args = ["python3", "-m", module, *module_arguments(job.entrypoint, module)]
    assert args[3:] == [
        "--actor.num_nodes",
        "2",
        "--actor.num_gpus_per_node",
        "8",
        "--ref.num_nodes",
        "2",
        "--ref.num_gpus_per_node",
        "8",
        "--vllm.num_engines",
        "8",
        "--vllm.tensor_parallel_size",
        "2",
        "--vllm.gpu_memory_utilization",  # colocated: upstream's colocated example, not the parser's 0.95
        "0.5",
        "--reward.remote_url",
        "http://10.0.0.5:5001/get_reward",  # in double quotes: the job's shell puts the head's IP in
        "--ckpt.path",
        "/mnt/shared/checkpoints/rlhf/openrlhf-16gpu",
        "--ckpt.output_dir",
        "/mnt/shared/checkpoints/rlhf/openrlhf-16gpu/model",
        "--ckpt.save_steps",
        "10",  # OpenRLHF's -1 saves no resumable state; --ckpt.load_enable only with a checkpoint handed over
        "--train.colocate_all",
        "--vllm.enable_sleep",  # true -> bare flag; false (ds.enable_sleep) -> omitted
        "--actor.model_name_or_path",
        "Qwen/Qwen2.5-7B-Instruct",
        "--algo.advantage.estimator",
        "group_norm",
        "--rollout.n_samples_per_prompt",
        "4",
    ]
    assert job.workdir == "/workspace/OpenRLHF"
    assert check_before_deploy(training(**OPENRLHF), container(), shape(2, 8)) == []


def test_openrlhf_reward_server_gets_its_port_and_the_job_its_url() -> None:
    job = job_of(training(**OPENRLHF), shape(head_ip="172.16.0.10"))
    assert job.reward_server is not None
    # The head's last GPU, explicitly: serve_rm spreads over every GPU it sees (device_map="auto").
    assert job.reward_server.command == (
        "export CUDA_VISIBLE_DEVICES=7; python3 -m openrlhf.cli.serve_rm --port 5001 --reward.model_name_or_path rm"
    )
    assert job.reward_server.workdir == "/workspace/OpenRLHF"
    assert (job.reward_server.port, job.reward_server.health_timeout_s) == (5001, 600)
    assert job.summary["reward_server"]["url"] == "http://${ROLL_CLUSTER_HEAD_IP}:5001/get_reward"
    assert '--reward.remote_url "http://${ROLL_CLUSTER_HEAD_IP}:5001/get_reward"' in job.entrypoint
    # The job does not depend on the head's address: the same before the head exists (a first preview).
    assert job_of(training(**OPENRLHF), shape(head_ip="")).entrypoint == job.entrypoint
    without = training(framework="openrlhf", openrlhf={"vllmNumEngines": 16}, overrides={"train.colocate_all": True})
    no_server = job_of(without)
    assert no_server.reward_server is None and "--reward.remote_url" not in no_server.entrypoint


def test_openrlhf_code_is_the_pinned_checkout_installed_as_upstreams_dockerfile_does() -> None:
    env = OpenRlhfAdapter(training(framework="openrlhf"), container()).code().env("roll")
    assert (env["CODE_REPO"], env["CODE_REF"], env["CODE_DIR"]) == (
        "https://github.com/OpenRLHF/OpenRLHF.git",
        "v0.10.2",
        "/workspace/OpenRLHF",
    )
    assert env["CODE_ARCHIVE_URL"] == "https://github.com/OpenRLHF/OpenRLHF/archive/v0.10.2.tar.gz"
    # dockerfile/Dockerfile at v0.10.2: uninstall the conflicting packages, the vLLM pin, a prebuilt flash-attn.
    assert env["PIP_UNINSTALL_PACKAGES"] == "xgboost transformer_engine flash_attn pynvml opencv-python-headless"
    packages = env["PIP_EXTRA_PACKAGES"].split()
    assert packages[0] == "vllm==0.19.1" and packages[-1] == "openrlhf[vllm]==0.10.2"
    assert re.search(r"/flash_attn-2\.8\.3\+cu130torch2\.10-cp312-cp312-linux_x86_64\.whl$", packages[1])
    assert (env["INSTALL_EDITABLE"], env["REQUIREMENTS_FILE"]) == ("0", "")


def test_openrlhf_user_flags_replace_the_cluster_defaults() -> None:
    config = training(
        framework="openrlhf",
        overrides={"ref.num_gpus_per_node": 4, "train.colocate_actor_ref": True, "ref.num_nodes": 2},
    )
    args = shlex.split(job_of(config).entrypoint)
    assert args.count("--ref.num_gpus_per_node") == 1
    assert args[args.index("--ref.num_gpus_per_node") + 1] == "4"


def test_openrlhf_checks_before_deploy() -> None:
    too_many = training(framework="openrlhf", openrlhf={"vllmNumEngines": 4, "vllmTensorParallelSize": 2})
    problems = check_before_deploy(too_many, container(), shape(1, 4))
    assert problems == [
        "roll-cluster:training.openrlhf.vllmNumEngines: vLLM engines x tensor parallel size must fit the cluster's "
        "4 GPUs (1 x 4); got 4 x 2 = 8"
    ]
    colocated = training(framework="openrlhf", openrlhf={"vllmNumEngines": 4}, overrides={"train.colocate_all": True})
    problems = check_before_deploy(colocated, container(), shape(2, 8))
    assert len(problems) == 1
    assert problems[0].startswith(
        "roll-cluster:training.openrlhf.vllmNumEngines: with train.colocate_all, vLLM engines"
    )
    assert "got 4 x 1 = 4 and actor 16" in problems[0]
    # Separate actor, reference, vLLM and (no remote reward server) reward-model GPUs: Ray would wait forever.
    separate = check_before_deploy(training(framework="openrlhf"), container(), shape(2, 8))
    assert len(separate) == 1 and "the roles need 42 GPUs (actor 16, ref 16, vLLM 2, reward model 8)" in separate[0]
    override_engines = training(framework="openrlhf", overrides={"train.colocate_all": True, "vllm.num_engines": 3})
    assert check_before_deploy(override_engines, container(), shape(2, 8))[0].startswith(
        "roll-cluster:training.overrides.vllm.num_engines: with train.colocate_all"
    )


# -------------------------------------------------------------------------------------------------- custom
def test_custom_job_runs_the_entrypoint_from_its_working_dir() -> None:
    config = training(
        framework="custom", custom={"entrypoint": "python3 my_rl.py --steps 3", "workingDir": "/workspace/me"}
    )
    adapter = adapter_for(config, container())
    assert isinstance(adapter, CustomAdapter) and adapter.code() is None
    job = adapter.job(shape())
    assert (job.workdir, job.entrypoint) == ("/workspace/me", "python3 my_rl.py --steps 3")
    assert (job.files, job.prepare, job.pre_submit_check, job.reward_server) == ({}, None, None, None)
    assert job.runtime_env == {
        "env_vars": {
            "ROLL_CLUSTER_CHECKPOINT_DIR": "/mnt/shared/checkpoints/large/custom",
            "ROLL_CLUSTER_RESUME": "1",
            "ROLL_CLUSTER_MODEL_SOURCE": "huggingface",
        }
    }
    assert check_before_deploy(config, container(), shape()) == []
    ignored = training(framework="custom", custom={"entrypoint": "x"}, overrides={"lr": 1})
    assert check_before_deploy(ignored, container(), shape())[0].startswith(
        "roll-cluster:training.overrides: not used by framework `custom`"
    )


def test_adapter_for_picks_the_framework() -> None:
    assert isinstance(adapter_for(training(), container()), RollAdapter)
    assert isinstance(adapter_for(training(framework="verl"), container()), VerlAdapter)
    assert isinstance(adapter_for(training(framework="openrlhf"), container()), OpenRlhfAdapter)


# ------------------------------------------------------------------------------------------------- secrets
SECRET_NAMES = [*SECRETS, "WANDB_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "REGISTRY_PASSWORD", "ALICLOUD"]


@pytest.mark.parametrize("framework", FRAMEWORK_CONFIGS)
def test_no_secret_name_reaches_any_job_field(framework: str) -> None:
    config = training(**FRAMEWORK_CONFIGS[framework])
    adapter = adapter_for(config, container())
    job = adapter.job(shape())
    code: CodeSpec | None = adapter.code()
    text = json.dumps(dataclasses.asdict(job), default=str) + json.dumps(code.env("roll") if code else {})
    text += json.dumps(job.runtime_env or {})
    for name in SECRET_NAMES:
        assert name.lower() not in text.lower(), f"{name} in the {framework} job"


# ------------------------------------------------------------------------ checkpoints, resume, model source
def test_checkpoint_dir_is_named_by_stack_and_job_on_the_shared_storage() -> None:
    from infra.layout import checkpoint_dir

    assert checkpoint_dir("large", "roll") == "/mnt/shared/checkpoints/large/roll"
    assert checkpoint_dir("My Stack", "job/1", shared=False) == "/data/checkpoints/my-stack/job-1"
    with pytest.raises(ValueError, match="no letter or digit"):
        checkpoint_dir("large", "..")


@pytest.mark.parametrize("framework", ["verl", "openrlhf", "custom"])
def test_resume_keeps_the_checkpoint_dir_across_config_changes_and_fresh_starts_get_their_own(framework: str) -> None:
    def checkpoints(resume: bool | None, overrides: dict[str, Any]) -> str:
        fields: dict[str, Any] = {"framework": framework, "resume": resume}
        if framework == "custom":
            fields["custom"] = {"entrypoint": f"python3 train.py {overrides}"}
        else:
            fields["overrides"] = overrides
        job = job_of(training(**fields))
        if framework == "custom":
            return str(job.runtime_env["env_vars"]["ROLL_CLUSTER_CHECKPOINT_DIR"])  # type: ignore[index]
        return str(job.summary["checkpoints"])

    a, b = {"trainer.total_epochs": 1}, {"trainer.total_epochs": 2}
    if framework == "openrlhf":
        a, b = {"train.max_epochs": 1}, {"train.max_epochs": 2}
    assert checkpoints(None, a) == checkpoints(True, b)  # the default resumes
    assert checkpoints(None, a).startswith("/mnt/shared/checkpoints/large/")
    fresh_a, fresh_b = checkpoints(False, a), checkpoints(False, b)
    assert fresh_a != fresh_b and fresh_a.split("/")[-1].startswith(f"{framework}-large-")


def test_resume_flags_follow_training_resume() -> None:
    verl_fresh = job_of(training(framework="verl", resume=False)).entrypoint
    assert "trainer.resume_mode=disable" in verl_fresh and "ROLL_CLUSTER_RESUME_FROM" not in verl_fresh
    # Resuming: the path the job step found is handed to verl's explicit resume, or verl starts fresh.
    verl = job_of(training(framework="verl")).entrypoint
    assert module_arguments(verl, "verl.trainer.main_ppo")[-1] == "trainer.resume_mode=disable"
    assert module_arguments(verl, "verl.trainer.main_ppo", resume_from="/c/global_step_3")[-2:] == [
        "trainer.resume_mode=resume_path", "trainer.resume_from_path=/c/global_step_3"]
    assert "--ckpt.load_enable" not in job_of(training(**{**OPENRLHF, "resume": False})).entrypoint
    # A user's explicit verl resume mode wins: nothing is handed over.
    own = job_of(training(framework="verl", overrides={"trainer.resume_mode": "auto"}))
    assert "ROLL_CLUSTER_RESUME_FROM" not in own.entrypoint and "trainer.resume_mode=auto" in own.entrypoint
    custom = job_of(training(framework="custom", custom={"entrypoint": "x"}, resume=False))
    assert custom.runtime_env is not None and custom.runtime_env["env_vars"]["ROLL_CLUSTER_RESUME"] == "0"


def test_a_resized_cluster_gets_its_own_verl_and_openrlhf_checkpoints() -> None:
    # Their sharded checkpoints cannot be loaded by another world size.
    for framework in ("verl", "openrlhf"):
        two = job_of(training(framework=framework), shape(2, 8)).summary["checkpoints"]
        one = job_of(training(framework=framework), shape(1, 8)).summary["checkpoints"]
        assert (two, one) == (
            f"/mnt/shared/checkpoints/large/{framework}-16gpu",
            f"/mnt/shared/checkpoints/large/{framework}-8gpu",
        )


def test_models_and_datasets_come_from_the_configured_source() -> None:
    mirror = dataclasses.replace(shape(), model_source="hf-mirror", hf_endpoint="https://hf-mirror.com")
    scope = dataclasses.replace(shape(), model_source="modelscope")
    verl = job_of(training(framework="verl"), mirror)
    assert verl.runtime_env is not None and verl.runtime_env["env_vars"]["HF_ENDPOINT"] == "https://hf-mirror.com"
    assert verl.prepare is not None and "export HF_ENDPOINT=https://hf-mirror.com; python3 examples/" in verl.prepare
    verl_scope = job_of(training(framework="verl"), scope)
    assert verl_scope.runtime_env is not None
    assert verl_scope.runtime_env["env_vars"]["VERL_USE_MODELSCOPE"] == "True"
    assert "--use_ms" in job_of(training(**OPENRLHF), scope).entrypoint
    rlhf = job_of(training(**OPENRLHF), mirror)
    assert rlhf.runtime_env == {"env_vars": {"HF_ENDPOINT": "https://hf-mirror.com"}}
    assert rlhf.reward_server is not None and "HF_ENDPOINT=https://hf-mirror.com;" in rlhf.reward_server.command
    hub = job_of(training(**OPENRLHF))
    assert hub.runtime_env is None and "--use_ms" not in hub.entrypoint


# ----------------------------------------------------------------------------------- GPUs without bf16
def test_verl_on_gpus_without_bf16_runs_fp16_with_sdpa() -> None:
    args = shlex.split(job_of(training(framework="verl", overrides={"algorithm.adv_estimator": "grpo"}),
                              shape(1, 8, bf16=False)).entrypoint)
    for override in (
        "actor_rollout_ref.actor.fsdp_config.dtype=float16",
        "actor_rollout_ref.ref.fsdp_config.dtype=float16",
        "actor_rollout_ref.rollout.dtype=float16",
        "++actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    ):
        assert override in args
    assert not any("float16" in a for a in shlex.split(job_of(training(framework="verl")).entrypoint))


def test_verl_refuses_what_needs_bf16_on_gpus_without_it() -> None:
    v100 = shape(1, 8, bf16=False, shared=None)
    critic = check_before_deploy(training(framework="verl"), container(), v100)
    assert len(critic) == 1 and critic[0].startswith(
        "roll-cluster:training.overrides.algorithm.adv_estimator: `gae` trains a critic, which verl v0.7.0 runs in bf16"
    )
    forced = training(framework="verl", overrides={"algorithm.adv_estimator": "grpo",
                                                   "actor_rollout_ref.actor.fsdp_config.dtype": "bf16"})
    assert check_before_deploy(forced, container(), v100) == [
        "roll-cluster:training.overrides.actor_rollout_ref.actor.fsdp_config.dtype: must not be bf16: the cluster's "
        "GPUs have no bf16 (V100/T4); use float16; got 'bf16'"
    ]
    assert check_before_deploy(forced, container(), shape(1, 8, shared=None)) == []


def test_verl_micro_batch_rules_are_checked_before_deploy() -> None:
    bad_micro = training(framework="verl", overrides={
        "data.train_batch_size": 256, "actor_rollout_ref.actor.ppo_mini_batch_size": 64,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 3})
    assert check_before_deploy(bad_micro, container(), shape(2, 8)) == [
        "roll-cluster:training.overrides.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu: must divide the "
        "mini-batch per GPU (actor_rollout_ref.actor.ppo_mini_batch_size x actor_rollout_ref.rollout.n // 16 GPUs "
        "= 4); got 3"
    ]
    too_small = training(framework="verl", overrides={
        "data.train_batch_size": 16, "actor_rollout_ref.actor.ppo_mini_batch_size": 8})
    problems = check_before_deploy(too_small, container(), shape(2, 8))
    assert len(problems) == 1 and "must be at least the data-parallel ranks (16 GPUs); got 8 x 1 = 8" in problems[0]


def test_openrlhf_on_gpus_without_bf16_runs_fp16_with_sdpa() -> None:
    v100 = shape(2, 8, bf16=False)
    args = shlex.split(job_of(training(**OPENRLHF), v100).entrypoint)
    assert args[args.index("--ds.param_dtype") + 1] == "fp16"
    assert args[args.index("--ds.attn_implementation") + 1] == "sdpa"
    problems = check_before_deploy(training(**OPENRLHF), container(), v100)
    assert problems == [
        "roll-cluster:training.openrlhf.rewardServer.command: serve_rm must run with --ds.param_dtype fp16 and "
        "--ds.attn_implementation sdpa: the cluster's GPUs have no bf16 (V100/T4); got --ds.param_dtype bf16 "
        "--ds.attn_implementation flash_attention_2"
    ]
    forced = training(**{**OPENRLHF, "openrlhf": {"vllmNumEngines": 8, "vllmTensorParallelSize": 2},
                         "overrides": {**OPENRLHF["overrides"], "ds.param_dtype": "bf16"}})
    assert check_before_deploy(forced, container(), v100) == [
        "roll-cluster:training.overrides.ds.param_dtype: must be fp16: the cluster's GPUs have no bf16 (V100/T4); "
        "got 'bf16'"
    ]


def test_openrlhf_batch_rules_are_checked_before_deploy() -> None:
    def problems_of(overrides: dict[str, Any]) -> list[str]:
        config = training(**{**OPENRLHF, "overrides": {**OPENRLHF["overrides"], **overrides}})
        return check_before_deploy(config, container(), shape(2, 8))

    assert problems_of({}) == []
    assert problems_of({"rollout.n_samples_per_prompt": 1}) == [
        "roll-cluster:training.overrides.rollout.n_samples_per_prompt: must be more than 1 with "
        "algo.advantage.estimator group_norm; got 1"
    ]
    assert problems_of({"rollout.n_samples_per_prompt": 4, "train.batch_size": 120}) == [
        "roll-cluster:training.overrides.train.batch_size: must be a multiple of train.micro_batch_size x the "
        "actor's data-parallel ranks (1 x 16 = 16); got 120"
    ]
    small = problems_of({"rollout.n_samples_per_prompt": 2, "rollout.batch_size": 4, "rollout.micro_batch_size": 1})
    assert len(small) == 1 and "must be at least the actor's 16 data-parallel ranks; got 2 x 4 // 1" in small[0]


def test_openrlhf_checkout_and_package_must_be_the_same_release() -> None:
    other = training(**{**OPENRLHF, "openrlhf": {**OPENRLHF["openrlhf"], "ref": "v0.10.3"}})
    assert check_before_deploy(other, container(), shape(2, 8)) == [
        "roll-cluster:training.openrlhf.ref: must be the release of training.openrlhf.package (v0.10.2); got 'v0.10.3'"
    ]
    commit = training(**{**OPENRLHF, "openrlhf": {**OPENRLHF["openrlhf"], "ref": "3c3be6234e0cb353e76bb8019947db9d"}})
    assert check_before_deploy(commit, container(), shape(2, 8)) == []  # a commit cannot be compared: allowed


def test_the_verl_start_gate_needs_its_console_metrics_line() -> None:
    quiet = training(framework="verl", overrides={"trainer.logger": ["tensorboard"]})
    problems = check_before_deploy(quiet, container(), shape())
    assert any(p.startswith("roll-cluster:training.overrides.trainer.logger: must include `console`") for p in problems)
    ungated = training(framework="verl", startTimeoutMinutes=0, overrides={"trainer.logger": ["tensorboard"]})
    assert not any("trainer.logger" in p for p in check_before_deploy(ungated, container(), shape()))
