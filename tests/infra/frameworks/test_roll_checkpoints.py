"""ROLL's checkpoints live in the job's own directory on the shared storage; training.resume says whether a
changed configuration resumes there or starts fresh in a directory of its own. A resume is handed the path of the
newest complete checkpoint (the job step finds it), never ROLL's `resume_from_checkpoint: true`, which fails at
start-up at the pinned ref (issue 18)."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from offline_helpers import run

from infra.frameworks.roll import roll_resume_command

ROLL_STACKS = ("dev", "multi", "large", "hosts")


def job_spec(config: dict | None = None, stack: str = "multi") -> Any:
    """The job the program builds for a stack (its run's notes)."""
    return run(stack, config=config or {}).notes["job_spec"]


def shipped_yaml(config: dict | None = None, stack: str = "multi") -> dict:
    text = job_spec(config, stack).rendered_config
    assert text is not None
    return yaml.safe_load(text)


def test_roll_resumes_from_the_jobs_own_directory_by_default() -> None:
    config = shipped_yaml()
    assert config["checkpoint_config"]["output_dir"] == "/mnt/shared/checkpoints/multi/roll"
    # A changed configuration keeps the directory, so it resumes from the last checkpoint there.
    changed = shipped_yaml({"roll-cluster:training": {"overrides": {"max_steps": 7}}})
    assert changed["checkpoint_config"]["output_dir"] == "/mnt/shared/checkpoints/multi/roll"
    spec = job_spec({"roll-cluster:training": {"overrides": {"max_steps": 7}}})
    assert spec.checkpoints.find and spec.checkpoints.layout == "roll"
    assert spec.checkpoints.directory == "/mnt/shared/checkpoints/multi/roll"


def test_a_fresh_start_gets_a_directory_of_its_own_per_configuration() -> None:
    fresh = {"resume": False}
    first = shipped_yaml({"roll-cluster:training": fresh})
    assert not job_spec({"roll-cluster:training": fresh}).checkpoints.find  # the job step looks for nothing
    second = shipped_yaml({"roll-cluster:training": {**fresh, "overrides": {"max_steps": 7}}})
    assert first["resume_from_checkpoint"] is False
    dirs = {first["checkpoint_config"]["output_dir"], second["checkpoint_config"]["output_dir"]}
    assert len(dirs) == 2 and all(d.startswith("/mnt/shared/checkpoints/multi/roll-") for d in dirs)


@pytest.mark.parametrize("stack", ROLL_STACKS)
def test_every_roll_stack_saves_periodically_and_never_asks_roll_to_find_a_checkpoint(stack: str) -> None:
    config = shipped_yaml(stack=stack)
    assert config["resume_from_checkpoint"] is False
    # Synchronous uploads: pipeline/worker_state_pipeline.json is then the completeness mark the finder reads.
    assert config["checkpoint_config"]["async_upload"] is False
    assert 0 < config["save_steps"] < config["max_steps"]
    text = job_spec(stack=stack).rendered_config
    assert text.count("\nresume_from_checkpoint: false\n") == 1  # the one line the entrypoint replaces


def test_checkpoint_every_sets_the_interval_and_zero_keeps_the_final_step_only() -> None:
    assert shipped_yaml({"roll-cluster:training": {"checkpointEvery": 7}})["save_steps"] == 7
    final_only = shipped_yaml({"roll-cluster:training": {"checkpointEvery": 0}})
    assert final_only["save_steps"] == final_only["max_steps"]  # ROLL saves step max_steps - 1 whatever the interval
    assert shipped_yaml({"roll-cluster:training": {"checkpointEvery": 7, "overrides": {"save_steps": 3}}})[
        "save_steps"] == 3


def test_every_vllm_worker_runs_vllms_v0_engine_on_v100() -> None:
    for stack in ("dev", "multi"):  # V100 stacks
        config = shipped_yaml(stack=stack)
        vllm = [role for role, section in config.items()
                if isinstance(section, dict) and (section.get("strategy_args") or {}).get("strategy_name") == "vllm"]
        assert vllm
        for role in vllm:
            assert config[role]["strategy_args"]["strategy_config"]["VLLM_USE_V1"] == 0, role
    assert "VLLM_USE_V1" not in str(shipped_yaml(stack="large"))  # A100/H800-class: V1 as ROLL wants


def test_a_multi_node_cluster_without_shared_storage_resumes_nothing_and_the_plan_says_why() -> None:
    saves = job_spec({"roll-cluster:storage": {"nas": False}}).checkpoints
    assert not saves.find
    assert "node-local on 2 nodes" in saves.resume
    assert any("DIE WITH THE NODE" in line for line in saves.lines())


def entrypoint_resume(tmp_path: Path, text: str, resume_from: str) -> tuple[subprocess.CompletedProcess[str], str]:
    out = "examples/pulumi/x.yaml"
    (tmp_path / "examples" / "pulumi").mkdir(parents=True)
    (tmp_path / out).write_text(text)
    result = subprocess.run(["bash", "-c", roll_resume_command(out)], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "ROLL_CLUSTER_RESUME_FROM": resume_from})
    return result, (tmp_path / out).read_text()


def test_the_entrypoint_hands_roll_the_path_the_job_step_found(tmp_path: Path) -> None:
    spec = job_spec()
    text = spec.rendered_config
    path = "/mnt/shared/checkpoints/multi/roll/20261125-101010/checkpoint-9"
    result, written = entrypoint_resume(tmp_path, text, path)
    assert result.returncode == 0, result.stderr
    assert f"ROLL resumes from {path}" in result.stdout
    assert yaml.safe_load(written)["resume_from_checkpoint"] == path  # a str: ROLL loads exactly that
    shipped = "examples/pulumi/multi-agent_val_frozen_lake_multi_nodes_demo.yaml"
    assert f"cd /workspace/ROLL && {roll_resume_command(shipped)} && " in spec.entrypoint


def test_the_entrypoint_refuses_to_run_when_it_cannot_hand_over_the_path(tmp_path: Path) -> None:
    result, _ = entrypoint_resume(tmp_path, "resume_from_checkpoint: true\n", "/mnt/shared/checkpoints/x/checkpoint-1")
    assert result.returncode == 2 and "could not set resume_from_checkpoint" in result.stderr


def test_an_override_that_asks_roll_to_find_its_checkpoint_is_refused() -> None:
    from infra.config import ContainerConfig, TrainingConfig
    from infra.frameworks import ClusterShape, check_before_deploy

    training = TrainingConfig.model_validate({"overrides": {"resume_from_checkpoint": True}})
    v100 = ClusterShape("dev", 1, 1, False, "", None, "/data", 8265)
    problems = check_before_deploy(training, ContainerConfig(), v100)
    assert any(p.startswith("roll-cluster:training.overrides.resume_from_checkpoint: `true` fails before the first "
                            "step") for p in problems), problems


# ROLL 8eb27cc, as it runs: what BaseConfig.__post_init__ does to a file_system checkpoint_config
# (roll/configs/base_config.py) and how the pipeline then resolves `resume_from_checkpoint`
# (roll/pipeline/base_pipeline.py -> roll/utils/checkpoint_manager.py ->
# FileSystemUploader.get_latest_ckpt, roll/utils/upload_utils.py). ROLL is no installable package: these
# lines are copied from the pinned ref.
# see verified-facts#test-roll-checkpoints-base-config
def roll_resolves(config: dict[str, Any]) -> str | None:
    checkpoint_config = dict(config["checkpoint_config"])
    if checkpoint_config.get("type") == "file_system":
        checkpoint_config["output_dir"] = os.path.join(checkpoint_config["output_dir"],
                                                       datetime.now().strftime("%Y%m%d-%H%M%S"))
    resume = config.get("resume_from_checkpoint", False)
    if resume is True:
        content = os.listdir(checkpoint_config["output_dir"])  # upload_utils.py
        # see verified-facts#test-roll-checkpoints-upload-utils
        found = [p for p in content if p.startswith("checkpoint-")]
        return os.path.join(checkpoint_config["output_dir"], max(found)) if found else None
    return resume or None


def test_the_rendered_resume_rule_gets_past_rolls_start_up(tmp_path: Path) -> None:
    config = shipped_yaml()
    config["checkpoint_config"]["output_dir"] = str(tmp_path)
    # An earlier run left a complete checkpoint in its own launch folder.
    earlier = tmp_path / "20261120-090000" / "checkpoint-9"
    (earlier / "pipeline").mkdir(parents=True)
    (earlier / "pipeline" / "worker_state_pipeline.json").write_text("{}")
    assert roll_resolves(config) is None  # fresh start: no FileNotFoundError
    assert roll_resolves({**config, "resume_from_checkpoint": str(earlier)}) == str(earlier)  # what the step hands
    # What the program rendered before issue 18: ROLL dies before its first step and never finds the earlier run.
    with pytest.raises(FileNotFoundError):
        roll_resolves({**config, "resume_from_checkpoint": True})


def test_a_roll_image_whose_torch_or_vllm_cannot_run_on_v100_is_refused_naming_the_image() -> None:
    from infra.config import ContainerConfig, TrainingConfig
    from infra.frameworks import ClusterShape, check_before_deploy

    image = "roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-25.06-py3-torch280-vllm0102"
    container = ContainerConfig.model_validate({"image": image})
    v100 = ClusterShape("dev", 1, 1, False, "", None, "/data", 8265)
    problems = check_before_deploy(TrainingConfig(), container, v100)
    assert any(p.startswith("roll-cluster:container.image: the GPUs have no bf16") and image in p for p in problems)
    a100 = ClusterShape("dev", 1, 1, True, "", None, "/data", 8265)
    assert not any("container.image" in p for p in check_before_deploy(TrainingConfig(), container, a100))
