"""MindSpeed-RL (training.framework: mindspeed-rl): the stack keys, the code placed on every node, the job the head
submits and what is refused before anything exists.

The code step runs for real (lib.sh + fetch_code.sh + mindspeed_rl_code.sh, rendered as infra/remote.py renders
them) on a FakeNode against four local git repositories shaped like MindSpeed-RL, MindSpeed, Megatron-LM and
MindSpeed-LLM; the entrypoint and the pre-submit check run with bash against a directory standing in for the
container's MindSpeed-RL checkout, with a stand-in `cli/train_grpo.py` that records what it was given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from script_harness import FakeNode, Result

from infra.config import ConfigError, ContainerConfig, TrainingConfig, parse_cluster_config
from infra.frameworks import ClusterShape, MindSpeedRlAdapter, adapter_for, check_before_deploy

SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test"
PATHS = {
    "tokenizerPath": "/data/models/Qwen2.5-7B",
    "dataPath": "/data/dataset/deepscaler/data",
    "loadPath": "/data/models/Qwen2.5-7B-mcore-tp4",
}


def settings(**fields: Any) -> dict[str, Any]:
    return {**PATHS, **fields}


def training(overrides: dict[str, Any] | None = None, **fields: Any) -> TrainingConfig:
    return TrainingConfig.model_validate(
        {"framework": "mindspeed-rl", "overrides": overrides or {}, "mindspeedRl": settings(**fields)}
    )


def adapter(overrides: dict[str, Any] | None = None, **fields: Any) -> MindSpeedRlAdapter:
    chosen = adapter_for(training(overrides, **fields), ContainerConfig())
    assert isinstance(chosen, MindSpeedRlAdapter)
    return chosen


def shape(nodes: int = 2, npus: int = 8, shared: str | None = None) -> ClusterShape:
    """2 hosts x 8 NPUs (Atlas 800T A2 / 910B): the NPU count travels in gpus_per_node."""
    return ClusterShape("ascend", nodes, npus, True, "10.0.0.5", shared, "/data", 8260)


def stack_problems(training_section: dict[str, Any]) -> list[str]:
    raw = {
        "nodes": json.dumps({"count": 2, "instanceTypes": ["ecs.gn7i-8x.32xlarge"]}),
        "access": json.dumps({"adminCidrs": ["203.0.113.0/24"], "sshPublicKey": SSH_KEY}),
        "training": json.dumps(training_section),
    }
    with pytest.raises(ConfigError) as error:
        parse_cluster_config(raw, "cn-hangzhou")
    return error.value.problems


# ------------------------------------------------------------------------------------------------ configuration
def test_the_framework_needs_its_section_named_by_key() -> None:
    problems = stack_problems({"framework": "mindspeed-rl"})

    assert problems == [
        "roll-cluster:training.mindspeedRl: required when framework is `mindspeed-rl`: at least tokenizerPath, "
        "dataPath and loadPath (absolute paths on every node); got nothing"
    ]


def test_unknown_keys_are_refused_with_the_nearest_name() -> None:
    problems = stack_problems({
        "framework": "mindspeed-rl",
        "mindspeedRl": settings(megatron={"reff": "core_r0.8.0"}, imageHasCod=True),
    })

    assert "roll-cluster:training.mindspeedRl.megatron.reff: unknown field; did you mean 'ref'? Allowed: repo, ref, " \
        "archiveUrl, mirrorRepo" in problems
    assert any(p.startswith("roll-cluster:training.mindspeedRl.imageHasCod: unknown field; did you mean "
                            "'imageHasCode'?") for p in problems)


def test_missing_relative_and_misnamed_values_are_refused_each_by_key() -> None:
    problems = stack_problems({
        "framework": "mindspeed-rl",
        "mindspeedRl": {"tokenizerPath": "./Qwen2.5-7B", "dataPath": "/d", "exampleConfig": "grpo_qwen25_7b_A3.yaml"},
    })

    assert any(p.startswith('roll-cluster:training.mindspeedRl.tokenizerPath: must be an absolute path in the '
                            'container') and p.endswith('got "./Qwen2.5-7B"') for p in problems)
    assert "roll-cluster:training.mindspeedRl.loadPath: required; got nothing" in problems
    assert any(p.startswith("roll-cluster:training.mindspeedRl.exampleConfig: is a Hydra config name, without the "
                            "extension") for p in problems)
    assert len(problems) == 3


def test_the_refs_of_seed_002_are_pinned_by_default() -> None:
    msrl = training().mindspeed_rl
    assert msrl is not None

    # MindSpeed and MindSpeed-LLM at the seed's commits, Megatron-LM at core_r0.8.0, MindSpeed-RL at 2.0.0.
    assert msrl.mindspeed.ref == "0dfa0035ec54d9a74b2f6ee2867367df897299df"
    assert msrl.mindspeed_llm.ref == "421ef7bcb83fb31844a1efb688cde71705c0526e"
    assert msrl.megatron.ref == "baf94af3c667248865f23df73b9fb8e2395e6fd0"
    assert msrl.ref == "62e9928ae89d9570f659b46e816bc55e1191b5e7"


# ------------------------------------------------------------------------------------------------------- code
def test_code_spec_places_the_three_repos_beside_mindspeed_rl_with_archive_fallbacks() -> None:
    code = adapter().code()
    assert code is not None

    env = code.env("msrl")

    assert code.scripts == ("fetch_code.sh", "mindspeed_rl_code.sh")
    assert env["CODE_DIR"] == "/workspace/MindSpeed-RL"
    assert env["REQUIREMENTS_FILE"] == "" and env["INSTALL_EDITABLE"] == "0"  # installed after the placement
    assert env["MSRL_SOURCES_DIR"] == "/workspace/mindspeed-rl-sources"
    assert env["MEGATRON_REPO"] == "https://github.com/NVIDIA/Megatron-LM.git"
    assert env["MINDSPEED_ARCHIVE_URL"] == (
        "https://github.com/Ascend/MindSpeed/archive/0dfa0035ec54d9a74b2f6ee2867367df897299df.tar.gz"
    )
    assert env["CODE_ARCHIVE_URL"] == (
        "https://github.com/Ascend/MindSpeed-RL/archive/62e9928ae89d9570f659b46e816bc55e1191b5e7.tar.gz"
    )
    assert env["MSRL_ANTLR_REQUIREMENT"] == "antlr4-python3-runtime==4.7.2"


def test_an_image_that_has_the_code_skips_the_code_step() -> None:
    assert adapter(imageHasCode=True).code() is None


# -------------------------------------------------------------------------------------------------------- job
def test_the_job_runs_train_grpo_from_the_code_dir_with_the_cluster_values() -> None:
    job = adapter().job(shape())

    assert job.workdir == "/workspace/MindSpeed-RL"
    assert job.entrypoint.startswith("cd /workspace/MindSpeed-RL && ")
    assert "python3 cli/train_grpo.py --config-name grpo_qwen25_7b_A3 " in job.entrypoint
    assert job.summary["hydra_overrides"] == [
        "++rl_config.actor_resource.num_npus=16",
        "++megatron_training.tokenizer_name_or_path=/data/models/Qwen2.5-7B",
        "++megatron_training.data_path=/data/dataset/deepscaler/data",
        "++actor_config.load=/data/models/Qwen2.5-7B-mcore-tp4",
        "++actor_config.save=/data/mindspeed-rl/ascend/ckpt",
        "++actor_config.save_interval=10",  # training.checkpointEvery null
    ]
    # Only PYTHONPATH: MindSpeed-RL's own ray.init(runtime_env=...) raises on a variable both set.
    assert job.runtime_env == {"env_vars": {"PYTHONPATH": "/workspace/MindSpeed-RL:${PYTHONPATH}"}}
    assert job.summary["warnings"] == []


def test_a_user_override_replaces_the_cluster_value_of_the_same_key() -> None:
    job = adapter({"rl_config": {"actor_resource": {"num_npus": 8}}, "+rl_config.use_tensorboard": False}).job(shape())

    arguments = job.summary["hydra_overrides"]
    assert "rl_config.actor_resource.num_npus=8" in arguments
    assert not any(a.startswith("++rl_config.actor_resource.num_npus") for a in arguments)
    assert "+rl_config.use_tensorboard=false" in arguments
    assert job.summary["warnings"] == ["rl_config.actor_resource.num_npus is 8: 8 of the cluster's 16 NPUs stay idle"]


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    """The container's MindSpeed-RL checkout after the code step, with a train_grpo.py that records its call."""
    root = tmp_path / "MindSpeed-RL"
    for package in ("mindspeed_rl", "mindspeed", "megatron", "mindspeed_llm"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "configs").mkdir()
    (root / "configs" / "grpo_qwen25_7b_A3.yaml").write_text("rl_config: {}\n")
    (root / "cli").mkdir()
    (root / "cli" / "train_grpo.py").write_text(
        "import json, os, sys\n"
        "import mindspeed_rl, megatron, mindspeed, mindspeed_llm\n"
        "json.dump({'argv': sys.argv[1:], 'cwd': os.getcwd(), 'hydra': os.environ.get('HYDRA_FULL_ERROR')},\n"
        "          open(os.environ['RECORD'], 'w'))\n"
    )
    return root


def run_bash(command: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # `python3` is the venv's, as the image's would be
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env={**os.environ, "PATH": path, **env},
        capture_output=True, text=True, timeout=60,
    )


def test_the_entrypoint_runs_the_driver_with_the_placed_packages_importable(code_dir: Path, tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    job = adapter({"rl_config.n_samples_per_prompt": 16}, codeDir=str(code_dir)).job(shape())

    result = run_bash(job.entrypoint, tmp_path, RECORD=str(record), PYTHONPATH="/cann/python/site-packages")

    assert result.returncode == 0, result.stderr
    called = json.loads(record.read_text())
    assert called["cwd"] == str(code_dir)
    assert called["hydra"] == "1"
    assert called["argv"][:2] == ["--config-name", "grpo_qwen25_7b_A3"]
    assert "++rl_config.actor_resource.num_npus=16" in called["argv"]
    assert "rl_config.n_samples_per_prompt=16" in called["argv"]


def test_the_pre_submit_check_passes_on_complete_code_and_names_what_is_missing(code_dir: Path) -> None:
    check = adapter(codeDir=str(code_dir), imageHasCode=True).job(shape()).pre_submit_check
    assert check is not None
    runtime = fake_runtime(code_dir.parent / "image")

    assert run_bash(check, code_dir, **runtime).returncode == 0, run_bash(check, code_dir, **runtime).stderr
    (code_dir / "megatron" / "__init__.py").unlink()
    (code_dir / "megatron").rmdir()
    failed = run_bash(check, code_dir, **runtime)
    assert failed.returncode == 1
    assert f"MindSpeed-RL is incomplete in {code_dir}" in failed.stderr
    assert "from the image (training.mindspeedRl.imageHasCode is true)" in failed.stderr


def test_the_job_id_follows_the_training_configuration_only() -> None:
    first = adapter().job(shape()).job_id
    assert first.startswith("mindspeed-rl-ascend-")
    assert adapter().job(shape()).job_id == first
    # Where the code comes from is not what is trained.
    assert adapter(pipIndexUrl="https://pypi.org/simple/").job(shape()).job_id == first
    assert adapter(megatron={"archiveUrl": "https://oss.example.com/megatron.tar.gz"}).job(shape()).job_id == first
    assert adapter(megatron={"ref": "core_r0.8.0"}).job(shape()).job_id != first
    assert adapter({"rl_config.n_samples_per_prompt": 16}).job(shape()).job_id != first
    assert adapter(imageHasCode=True).job(shape()).job_id != first


@pytest.mark.parametrize("lacking", [("torch_npu",), ("vllm_ascend", "apex"), ("jemalloc",)])
def test_an_image_without_the_runtime_is_named_before_the_job_and_before_any_download(
    code_dir: Path, node: FakeNode, repos: dict[str, tuple[str, str]], lacking: tuple[str, ...]
) -> None:
    runtime = fake_runtime(code_dir.parent / "lacking", lacking)
    check = adapter(codeDir=str(code_dir), imageHasCode=True).job(shape()).pre_submit_check
    assert check is not None
    failed = run_bash(check, code_dir, **runtime)
    assert failed.returncode == 1
    assert "roll-cluster:container.image" in failed.stderr and "lacks MindSpeed-RL's runtime" in failed.stderr

    env = {**code_env(node, repos), **fake_runtime(node.root / "lacking", lacking)}
    result = run_code(node, env)
    assert result.returncode != 0
    missing = " ".join("libjemalloc.so.2" if m == "jemalloc" else m for m in sorted(lacking, key=RUNTIME.index))
    assert f"roll-cluster:container.image {ContainerConfig().image} lacks MindSpeed-RL's runtime: missing {missing}" \
        in result.stderr
    assert node.calls("pip") == [] and not Path(env["MSRL_SOURCES_DIR"]).exists()


def test_the_bare_cann_base_image_and_paths_outside_the_containers_mounts_are_refused_before_any_step() -> None:
    bare = ContainerConfig(image="swr.cn-south-1.myhuaweicloud.com/ascendhub/cann:8.1.rc1-910b-ubuntu22.04-py3.10")
    training_config = TrainingConfig.model_validate({"framework": "mindspeed-rl", "mindspeedRl": settings(
        tokenizerPath="/home/data/models/Qwen2.5-7B", savePath="/mnt/shared/ckpt")})
    problems = check_before_deploy(training_config, bare, shape(2, 8, "/mnt/shared"))
    assert problems[0].startswith("roll-cluster:container.image: the bare CANN base image has none of MindSpeed-RL's "
                                  "runtime (torch, torch_npu, apex, vllm, vllm_ascend, libjemalloc.so.2)")
    assert problems[1].startswith("roll-cluster:training.mindspeedRl.tokenizerPath: must lie under a directory the "
                                  "container mounts (/mnt/shared, /data, /workspace;")
    assert "'/home/data/models/Qwen2.5-7B'" in problems[1]
    assert len(problems) == 2  # /data/... and /mnt/shared/... are mounted


# --------------------------------------------------------------------------------------------- plan-time checks
def test_the_seed_example_fits_two_hosts_of_eight_npus() -> None:
    assert check_before_deploy(training(), ContainerConfig(), shape(2, 8)) == []


def test_more_npus_than_the_cluster_has_are_refused_by_key() -> None:
    problems = check_before_deploy(
        training({"rl_config.actor_resource.num_npus": 24}), ContainerConfig(), shape(2, 8)
    )

    assert problems[0] == (
        "roll-cluster:training.overrides.rl_config.actor_resource.num_npus: must be at most the cluster's 2 nodes x "
        "8 NPUs = 16 (MindSpeed-RL reserves one STRICT_PACK placement group of 8 NPUs per node, so it needs 3 nodes "
        "and would wait forever); got rl_config.actor_resource.num_npus 24 (from training.overrides)"
    )
    # 24 NPUs also break the example's batch split (DP 6 does not divide 32): every problem is reported at once.
    assert problems[1].startswith("roll-cluster:training.overrides.megatron_training.global_batch_size: ")


def test_parallel_sizes_that_do_not_divide_the_npus_are_refused_by_key() -> None:
    problems = check_before_deploy(
        training({"actor_config": {"tensor_model_parallel_size": 3}}), ContainerConfig(), shape(2, 8)
    )

    assert len(problems) == 1
    assert problems[0].startswith(
        "roll-cluster:training.overrides.actor_config.tensor_model_parallel_size: rl_config.actor_resource.num_npus "
        "must be divisible by TP x PP x CP (MindSpeed-RL validate_config); got 16 and 3 x 1 x 1 = 3"
    )
    assert "actor_config.tensor_model_parallel_size 3 (from training.overrides)" in problems[0]


def test_the_example_on_one_host_of_four_npus_is_refused_naming_the_example_values() -> None:
    """grpo_qwen25_7b_A3 (TP 4, infer TP 4, batch 32) on 1 x 4 NPUs: DP 1, so the batch fits; on 1 x 2 NPUs TP 4
    cannot divide 2."""
    problems = check_before_deploy(training(), ContainerConfig(), shape(1, 2))

    assert problems[0].startswith("roll-cluster:training.overrides.actor_config.tensor_model_parallel_size: ")
    assert "actor_config.tensor_model_parallel_size 4 (from grpo_qwen25_7b_A3.yaml)" in problems[0]
    assert "rl_config.actor_resource.num_npus 2 (set from the cluster)" in problems[0]


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (
            {"megatron_training.global_batch_size": 30},
            "megatron_training.global_batch_size",
            "must be divisible by the actor's data-parallel size DP = num_npus / (TP x PP x CP) = 16 / 4 = 4",
        ),
        (
            {"actor_config.micro_batch_size": 3},
            "actor_config.micro_batch_size",
            "global_batch_size x n_samples_per_prompt must be divisible by micro_batch_size; got 32 x 8 and 3",
        ),
        (
            {"generate_config.infer_tensor_parallel_size": 3},
            "generate_config.infer_tensor_parallel_size",
            "must divide the training TP 4 when not larger",
        ),
        (
            {"generate_config.max_model_len": 1024},
            "generate_config.max_model_len",
            "must be at least seq_length 2048",
        ),
        (
            {"rl_config.verifier_weight": [0.5, 0.5]},
            "rl_config.verifier_weight",
            "must have one weight per verifier_function",
        ),
        (
            {"actor_config.save": "./ckpt"},
            "actor_config.save",
            "must be an absolute path, the same on every node",
        ),
    ],
)
def test_mindspeed_rl_rules_are_checked_before_deploy_naming_the_key(
    overrides: dict[str, Any], key: str, fragment: str
) -> None:
    problems = check_before_deploy(training(overrides), ContainerConfig(), shape(2, 8))

    # A value may break more than one rule (a batch of 30 splits neither over the actor's DP 4 nor the rollout's 4):
    # each is reported, all naming the same key.
    assert problems, "nothing refused"
    assert all(p.startswith(f"roll-cluster:training.overrides.{key}: ") for p in problems), problems
    assert fragment in problems[0]


def test_sizes_that_are_not_whole_positive_numbers_are_refused_by_key() -> None:
    problems = check_before_deploy(
        training({"actor_config.micro_batch_size": "2", "rl_config.n_samples_per_prompt": 0}),
        ContainerConfig(),
        shape(2, 8),
    )

    assert problems == [
        "roll-cluster:training.overrides.actor_config.micro_batch_size: must be a whole number, at least 1; got "
        "actor_config.micro_batch_size '2' (from training.overrides)",
        "roll-cluster:training.overrides.rl_config.n_samples_per_prompt: must be a whole number, at least 1; got "
        "rl_config.n_samples_per_prompt 0 (from training.overrides)",
    ]


def test_an_example_unknown_at_the_ref_is_checked_only_on_what_is_known() -> None:
    chosen = adapter({"actor_config.tensor_model_parallel_size": 3}, exampleConfig="grpo_qwen3_8b_A3")

    problems = chosen.problems(shape(2, 8))
    summary = chosen.job(shape(2, 8)).summary

    assert problems[0].startswith("roll-cluster:training.overrides.actor_config.tensor_model_parallel_size: ")
    assert summary["example_values_known"] is False
    assert summary["warnings"][0].startswith("the values of grpo_qwen3_8b_A3.yaml at ref 62e9928")


# ----------------------------------------------------------------------------------------------- the code step
def git(directory: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(directory), *args], check=True, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(directory.parent), "GIT_AUTHOR_NAME": "t",
             "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"},
    ).stdout.strip()


def upstream(tmp_path: Path, name: str, files: dict[str, str]) -> tuple[str, str]:
    """A bare repository holding `files` (path -> text) in one commit; returns its path and the commit."""
    work = tmp_path / "upstream" / name
    work.mkdir(parents=True)
    git(work, "init", "-q")
    for path, text in files.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_text(text)
    git(work, "add", ".")
    git(work, "commit", "-q", "-m", name)
    bare = tmp_path / "upstream" / f"{name}.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, capture_output=True)
    subprocess.run(["git", "-C", str(bare), "config", "uploadpack.allowAnySHA1InWant", "true"], check=True)
    return str(bare), git(work, "rev-parse", "HEAD")


@pytest.fixture
def repos(tmp_path: Path) -> dict[str, tuple[str, str]]:
    return {
        "msrl": upstream(tmp_path, "MindSpeed-RL", {
            "cli/train_grpo.py": "", "mindspeed_rl/__init__.py": "", "requirements.txt": "hydra-core==1.3.2\n",
        }),
        "mindspeed": upstream(tmp_path, "MindSpeed", {
            "mindspeed/__init__.py": "# MindSpeed\n", "requirements.txt": "einops\n", "setup.py": "",
        }),
        "megatron": upstream(tmp_path, "Megatron-LM", {
            "megatron/core/__init__.py": "# core\n", "megatron/training/__init__.py": "", "setup.py": "",
        }),
        "llm": upstream(tmp_path, "MindSpeed-LLM", {"mindspeed_llm/__init__.py": "# LLM\n", "setup.py": ""}),
    }


def code_env(node: FakeNode, repos: dict[str, tuple[str, str]], **fields: Any) -> dict[str, str]:
    """The env of the code step exactly as the adapter makes it, with the repositories and dirs swapped for local
    ones (they are plain stack settings)."""
    pins = {
        "repo": repos["msrl"][0], "ref": repos["msrl"][1],
        "mindspeed": {"repo": repos["mindspeed"][0], "ref": repos["mindspeed"][1]},
        "megatron": {"repo": repos["megatron"][0], "ref": repos["megatron"][1]},
        "mindspeedLlm": {"repo": repos["llm"][0], "ref": repos["llm"][1]},
        "codeDir": str(node.root / "container" / "workspace" / "MindSpeed-RL"),
    }
    code = adapter(**{**pins, **fields}).code()
    assert code is not None
    return {**code.env("msrl"), **fake_runtime(node.root / "image")}


RUNTIME = ("torch", "torch_npu", "apex", "vllm", "vllm_ascend", "jemalloc")


def fake_runtime(root: Path, lacking: tuple[str, ...] = ()) -> dict[str, str]:
    """An image's MindSpeed-RL runtime as the code step looks for it: importable packages and jemalloc's file."""
    for module in ("torch", "torch_npu", "apex", "vllm", "vllm_ascend"):
        if module not in lacking:
            (root / "site-packages" / module).mkdir(parents=True, exist_ok=True)
            (root / "site-packages" / module / "__init__.py").write_text("")
    jemalloc = root / "lib" / "libjemalloc.so.2"
    if "jemalloc" not in lacking:
        jemalloc.parent.mkdir(parents=True, exist_ok=True)
        jemalloc.write_text("")
    return {
        "PYTHONPATH": str(root / "site-packages"),
        "JEMALLOC_CANDIDATES": f"/nonexistent/libjemalloc.so.2 {jemalloc}",
    }


def run_code(node: FakeNode, env: dict[str, str]) -> Result:
    return node.run_step("code", ["fetch_code.sh", "mindspeed_rl_code.sh"], **env)


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    machine = FakeNode(tmp_path / "node")
    machine.set_state("docker/containers/msrl", "true")
    machine.set_state("docker/containers/msrl.id", "aaaaaaaaaaaa-first")
    return machine


def test_the_code_step_places_the_packages_and_installs_in_the_guides_order(
    node: FakeNode, repos: dict[str, tuple[str, str]]
) -> None:
    env = code_env(node, repos)
    code_dir = Path(env["CODE_DIR"])
    sources = Path(env["MSRL_SOURCES_DIR"])

    result = run_code(node, env)

    assert result.returncode == 0, str(result)
    assert (code_dir / "mindspeed" / "__init__.py").read_text() == "# MindSpeed\n"
    assert (code_dir / "megatron" / "core" / "__init__.py").read_text() == "# core\n"
    assert (code_dir / "mindspeed_llm" / "__init__.py").read_text() == "# LLM\n"
    assert (code_dir / "cli" / "train_grpo.py").exists()
    index = "-i https://mirrors.aliyun.com/pypi/simple/"
    assert node.calls("pip") == [
        f"cwd={sources}/MindSpeed install --progress-bar off {index} -r requirements.txt",
        f"cwd={code_dir} install --progress-bar off {index} -r requirements.txt",
        f"cwd={code_dir} install --progress-bar off {index} --no-deps -- antlr4-python3-runtime==4.7.2",
    ]
    # MindSpeed-RL's checkout stays clean for fetch_code.sh: the copies are untracked.
    assert git(code_dir, "status", "--porcelain", "--untracked-files=no") == ""


def test_a_second_code_step_only_verifies(node: FakeNode, repos: dict[str, tuple[str, str]]) -> None:
    env = code_env(node, repos)
    assert run_code(node, env).returncode == 0

    again = run_code(node, env)

    assert again.returncode == 0, str(again)
    assert "copy skipped" in again.stdout
    assert "requirements already installed for these sources in this container; skipped" in again.stdout
    assert len(node.calls("pip")) == 3


def test_a_recreated_container_installs_again_without_copying(
    node: FakeNode, repos: dict[str, tuple[str, str]]
) -> None:
    env = code_env(node, repos)
    assert run_code(node, env).returncode == 0
    node.set_state("docker/containers/msrl.id", "bbbbbbbbbbbb-second")

    result = run_code(node, env)

    assert result.returncode == 0, str(result)
    assert "copy skipped" in result.stdout
    assert len(node.calls("pip")) == 6


def test_a_missing_copy_or_a_moved_source_is_placed_again(
    node: FakeNode, repos: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    env = code_env(node, repos)
    code_dir = Path(env["CODE_DIR"])
    assert run_code(node, env).returncode == 0
    subprocess.run(["rm", "-rf", str(code_dir / "megatron")], check=True)

    repaired = run_code(node, env)

    assert repaired.returncode == 0, str(repaired)
    assert (code_dir / "megatron" / "core" / "__init__.py").exists()
    assert "placed mindspeed, megatron and mindspeed_llm" in repaired.stdout

    work = tmp_path / "upstream" / "MindSpeed-LLM"
    (work / "mindspeed_llm" / "__init__.py").write_text("# LLM v2\n")
    git(work, "commit", "-q", "-am", "v2")
    git(work, "push", "-q", repos["llm"][0], "HEAD:refs/heads/main")
    moved = {**env, "MINDSPEED_LLM_REF": git(work, "rev-parse", "HEAD")}

    result = run_code(node, moved)

    assert result.returncode == 0, str(result)
    assert (code_dir / "mindspeed_llm" / "__init__.py").read_text() == "# LLM v2\n"
    assert len(node.calls("pip")) == 6  # the repair copied only; new sources: the requirements again


def test_a_source_that_cannot_be_fetched_fails_the_step_naming_it(
    node: FakeNode, repos: dict[str, tuple[str, str]], tmp_path: Path
) -> None:
    env = {**code_env(node, repos), "MEGATRON_REPO": str(tmp_path / "no-such-repo.git"), "MEGATRON_ARCHIVE_URL": "",
           "RETRY_ATTEMPTS": "1"}

    result = run_code(node, env)

    assert result.returncode != 0
    assert f"code: FAILED: could not fetch the code: git fetch of {tmp_path}/no-such-repo.git@" in result.stderr
    assert not (Path(env["CODE_DIR"]) / "megatron").exists()
    assert node.calls("pip") == []
