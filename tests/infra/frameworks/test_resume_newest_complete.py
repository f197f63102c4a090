"""Issue 27: for every framework, given checkpoint folders whose newest is incomplete, the job resumes from the
newest complete one, handed over by explicit path or tag: the finder (checkpoint_find.sh) picks it, and the job's
own entrypoint, run here with ROLL_CLUSTER_RESUME_FROM set as the job step sets it, hands exactly that one to the
framework. MindSpeed-RL saves every training.checkpointEvery iterations."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from offline_helpers import run
from test_frameworks import OPENRLHF, job_of, shape, training
from test_mindspeed_rl import PATHS
from test_mindspeed_rl import shape as npu_shape

from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks import adapter_for, openrlhf
from infra.frameworks.base import RESUME_VARIABLE
from infra.frameworks.mindspeed_rl import MindSpeedRlAdapter
from infra.frameworks.roll import roll_resume_command

FINDER = Path(__file__).resolve().parents[3] / "infra" / "scripts" / "checkpoint_find.sh"


def newest_complete(layout: str, directory: Path, world: int = 0, staging: str = "") -> str:
    script = f'source {FINDER}\nlatest_checkpoint "$@"'
    return subprocess.run(["bash", "-c", script, "finder", layout, str(directory), str(world), staging],
                          check=True, capture_output=True, text=True).stdout.strip()


def handed(prefix: str, resume_from: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Runs an entrypoint's resume part, then prints the arguments it set for the framework's command."""
    script = prefix + ' for a in "$@"; do printf "%s\\n" "$a"; done'
    result = subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                            env={**os.environ, RESUME_VARIABLE: resume_from})
    return result, [line for line in result.stdout.splitlines() if not line.startswith("roll-cluster:")]


def write(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ------------------------------------------------------------------------------------------------------ ROLL
def test_roll_skips_a_marked_checkpoint_whose_copy_failed_and_resumes_from_the_one_before(tmp_path: Path) -> None:
    spec = run("multi").notes["job_spec"]
    staging = spec.checkpoints.staging
    # ROLL's local save folder (its output_dir) is where a copy that failed stays behind.
    assert staging == yaml.safe_load(spec.rendered_config)["output_dir"] and staging.startswith("/mnt/shared/")
    ckpt, local = tmp_path / "ckpt", tmp_path / "output"
    run_dir = ckpt / "20261125-101010"
    for step in (10, 20, 30):
        write(run_dir / f"checkpoint-{step}" / "actor_train" / "model.safetensors")
    for step in (10, 20):  # the driver's marker, written whatever the workers' copies did
        write(run_dir / f"checkpoint-{step}" / "pipeline" / "worker_state_pipeline.json", "{}")
    # checkpoint-20: the critic's copy raised (disk full), ROLL logged it and went on: its local copy is left.
    write(local / "critic" / "checkpoint-20" / "critic" / "model.safetensors")
    write(local / "actor_train" / "checkpoint-10-not-a-step" / "x")
    found = newest_complete("roll", ckpt, staging=str(local))
    assert found == str(run_dir / "checkpoint-10")
    # Without the staging check the marker alone would have picked the failed copy.
    assert newest_complete("roll", ckpt) == str(run_dir / "checkpoint-20")

    yaml_path = "examples/pulumi/x.yaml"
    write(tmp_path / yaml_path, spec.rendered_config)
    result = subprocess.run(["bash", "-c", roll_resume_command(yaml_path)], cwd=tmp_path, capture_output=True,
                            text=True,
                            env={**os.environ, RESUME_VARIABLE: found})
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((tmp_path / yaml_path).read_text())["resume_from_checkpoint"] == found


def test_roll_checks_no_staging_copies_when_roll_keeps_them_all() -> None:
    result = run("multi", config={"roll-cluster:training": {"overrides": {"checkpoint_config": {
        "keep_local_file": True}}}})
    saves = result.notes["job_spec"].checkpoints
    assert saves.find and saves.staging == ""


# ------------------------------------------------------------------------------------------------------ verl
def test_verl_resumes_from_the_newest_global_step_with_data_pt(tmp_path: Path) -> None:
    for step in (10, 20):
        write(tmp_path / f"global_step_{step}" / "actor" / "model_world_size_16_rank_0.pt")
        write(tmp_path / f"global_step_{step}" / "data.pt")
    write(tmp_path / "global_step_30" / "actor" / "model_world_size_16_rank_0.pt")  # cut before data.pt
    write(tmp_path / "latest_checkpointed_iteration.txt", "30")
    found = newest_complete("verl", tmp_path)
    assert found == str(tmp_path / "global_step_20")

    job = job_of(training(framework="verl"))
    prefix = job.entrypoint.split(" exec ", 1)[0]
    result, arguments = handed(prefix, found, tmp_path)
    assert result.returncode == 0, result.stderr
    assert arguments == ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={found}"]


# --------------------------------------------------------------------------------------------------- OpenRLHF
def deepspeed_tag(root: Path, role: str, tag: str, shards: int) -> None:
    write(root / role / tag / "mp_rank_00_model_states.pt")
    for rank in range(shards):
        write(root / role / tag / f"bf16_zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")


def test_openrlhf_resumes_by_tag_from_the_newest_complete_one_not_from_latest(tmp_path: Path) -> None:
    job = job_of(training(**OPENRLHF), shape(2, 8, stack="rlhf"))
    saves = job.checkpoints
    assert saves is not None and saves.find and saves.world == 16
    deepspeed_tag(tmp_path, "_actor", "global_step10", 16)
    deepspeed_tag(tmp_path, "_actor", "global_step20", 16)
    deepspeed_tag(tmp_path, "_actor", "global_step30", 9)  # rank 0 wrote `latest`, 7 ranks were still writing
    write(tmp_path / "_actor" / "latest", "global_step30")
    deepspeed_tag(tmp_path, "_critic", "global_step10", 16)
    (tmp_path / "_critic" / "global_step20").mkdir(parents=True)  # the critic's save of 20 never happened
    write(tmp_path / "_critic" / "latest", "global_step10")
    found = newest_complete("openrlhf", tmp_path, world=16)
    assert found == str(tmp_path / "_actor" / "global_step10")

    # The job's entrypoint starts with the resume part for its own checkpoint directory.
    assert job.entrypoint.startswith(openrlhf.openrlhf_resume_command(saves.directory) + " exec python3 -m ")
    result, arguments = handed(openrlhf.openrlhf_resume_command(str(tmp_path)), found, tmp_path)
    assert result.returncode == 0, result.stderr
    assert arguments == ["--ckpt.load_enable"]
    # DeepSpeed loads the tag `latest` names: both now name the one found.
    assert (tmp_path / "_actor" / "latest").read_text() == "global_step10"
    assert (tmp_path / "_critic" / "latest").read_text() == "global_step10"


def test_openrlhf_without_a_checkpoint_starts_fresh(tmp_path: Path) -> None:
    result, arguments = handed(openrlhf.openrlhf_resume_command(str(tmp_path)), "", tmp_path)
    assert result.returncode == 0 and arguments == []
    assert not (tmp_path / "_actor").exists()


# ------------------------------------------------------------------------------------------------ MindSpeed-RL
def megatron_iteration(root: Path, iteration: int, ranks: int = 4) -> None:
    for rank in range(ranks):
        write(root / f"iter_{iteration:07d}" / f"mp_rank_{rank:02d}" / "model_optim_rng.pt")


def msrl(tmp_path: Path, overrides: dict[str, Any] | None = None, **training_fields: Any) -> MindSpeedRlAdapter:
    config = TrainingConfig.model_validate({
        "framework": "mindspeed-rl", "overrides": overrides or {}, **training_fields,
        "mindspeedRl": {**PATHS, "savePath": str(tmp_path / "ckpt")},
    })
    chosen = adapter_for(config, ContainerConfig())
    assert isinstance(chosen, MindSpeedRlAdapter)
    return chosen


def test_mindspeed_rl_resumes_from_save_path_at_the_newest_iteration_megatron_finished(tmp_path: Path) -> None:
    adapter = msrl(tmp_path)
    one_node = npu_shape(nodes=1, npus=16)
    saves = adapter.checkpoints(one_node)
    assert saves.find and saves.layout == "megatron" and saves.directory == str(tmp_path / "ckpt")
    ckpt = tmp_path / "ckpt"
    megatron_iteration(ckpt, 10)
    megatron_iteration(ckpt, 20)
    megatron_iteration(ckpt, 30, ranks=2)  # cut mid-save: the tracker was never moved to 30
    write(ckpt / "latest_checkpointed_iteration.txt", "20")
    found = newest_complete("megatron", ckpt)
    assert found == str(ckpt / "iter_0000020")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("30")  # a tracker ahead of a folder that is gone
    (ckpt / "iter_0000030").rename(ckpt / "gone")
    assert newest_complete("megatron", ckpt) == str(ckpt / "iter_0000020")

    entrypoint = adapter.entrypoint(one_node)
    prefix = adapter.resume_command(one_node)
    assert entrypoint.startswith(prefix) and entrypoint.endswith(' "$@"')
    assert "++actor_config.load=" not in entrypoint[len(prefix):]  # only the resume part names what to load
    result, arguments = handed(prefix, found, tmp_path)
    assert result.returncode == 0, result.stderr
    assert arguments == [
        f"++actor_config.load={ckpt}",
        "++actor_config.finetune=false",
        "++actor_config.no_load_optim=false",
        "++actor_config.no_load_rng=false",
        "++rl_config.integrated_mode_config.ref_model_load_path=/data/models/Qwen2.5-7B-mcore-tp4",
    ]
    # Megatron loads the iteration its tracker names: the one found.
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "20"

    result, arguments = handed(prefix, "", tmp_path)
    assert result.returncode == 0 and arguments == ["++actor_config.load=/data/models/Qwen2.5-7B-mcore-tp4"]


@pytest.mark.parametrize(("every", "interval"), [(None, 10), (7, 7), (0, 1000)])
def test_mindspeed_rl_saves_every_checkpoint_every_iterations(tmp_path: Path, every: int | None,
                                                              interval: int) -> None:
    fields: dict[str, Any] = {} if every is None else {"checkpointEvery": every}
    adapter = msrl(tmp_path, **fields)
    arguments = adapter.arguments(npu_shape())
    # 0, the final step only: grpo_qwen25_7b_A3's train_iters, since MindSpeed-RL saves only at multiples.
    assert f"++actor_config.save_interval={interval}" in arguments
    assert f"every {interval} iterations" in adapter.checkpoints(npu_shape()).every


def test_mindspeed_rl_leaves_loading_to_overrides_that_set_it(tmp_path: Path) -> None:
    adapter = msrl(tmp_path, overrides={"actor_config": {"finetune": False}})
    saves = adapter.checkpoints(npu_shape(nodes=1, npus=16))
    assert not saves.find and "training.overrides" in saves.resume
    assert "ROLL_CLUSTER_RESUME_FROM" not in adapter.entrypoint(npu_shape(nodes=1, npus=16))

