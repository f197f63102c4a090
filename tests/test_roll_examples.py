"""ROLL's own example configs as `training.roll.baseConfig` (issue 18 item 6): the valid ones are accepted on
1 x 8 and 2 x 8, those that need setup roll-cluster cannot do or paths of another site are refused naming why,
a cluster of another size than the base's is said in the plan, and tools/render_roll_examples.py reports it all.
The examples come from the sparse snapshot in tests/fixtures/roll (ROLL at the pinned ref)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from devtools.offline_cloud import ROLL_SNAPSHOT
from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks import roll_sources
from infra.frameworks.base import ClusterShape
from infra.frameworks.roll import RollAdapter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import render_roll_examples

GEM = "qwen3_agentic_gem/gem_rg_letter_counting.yaml"
WEBSHOP = "qwen2.5-7B-agentic_megatron/agentic_val_webshop.yaml"
SEPARATE = "qwen2.5-7B-rlvr_megatron/rlvr_qwen2.5_7B_seperate.yaml"
FROZEN_LAKE = "qwen2.5-0.5B-agentic/agent_val_frozen_lake.yaml"
RLVR_8 = "qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus.yaml"
RLVR_ASYNC = "qwen2.5-7B-rlvr_megatron/rlvr_config_async.yaml"


def shape(nodes: int) -> ClusterShape:
    return ClusterShape("x", nodes, 8, True, "", "/mnt/shared", "/data", 8265)


def adapter(base: str, pipeline: str = "agentic", overrides: dict[str, object] | None = None) -> RollAdapter:
    training = TrainingConfig.model_validate({
        "framework": "roll",
        "roll": {"pipeline": pipeline, "baseConfig": base},
        "overrides": overrides or {},
    })
    return RollAdapter(training, ContainerConfig(), roll_sources.CheckoutExamples(ROLL_SNAPSHOT))


@pytest.mark.parametrize("nodes", [1, 2])
def test_a_gem_example_whose_custom_env_is_dropped_is_accepted(nodes: int) -> None:
    # Dropping `gem_rg` (no ROLL field) leaves the YAML variables only it referred to (`rg_agent_template`, ...)
    # unreferenced: they are dropped too, as ROLL ignores them, instead of being reported as keys the user cannot
    # delete (one pass used to refuse this example on every cluster).
    chosen = adapter(GEM)
    assert chosen.problems(shape(nodes)) == []
    applied = chosen.build(shape(nodes)).rendered.applied  # type: ignore[union-attr]
    assert any(line.startswith("gem_rg: dropped") for line in applied)
    assert any(line.startswith("rg_agent_template: dropped") for line in applied)


def test_a_list_of_a_literal_list_as_device_mapping_is_read() -> None:
    problems = adapter(SEPARATE, "rlvr").problems(shape(2))
    assert not any("device_mapping: must be" in p for p in problems), problems


def test_webshop_is_refused_naming_the_setup_it_needs() -> None:
    problems = adapter(WEBSHOP).problems(shape(1))
    assert len(problems) == 1
    assert problems[0].startswith("roll-cluster:training.overrides.custom_envs.WebShopEnv.env_type: the WebShop")
    assert "spacy download en_core_web_sm" in problems[0] and "run_agentic_pipeline_webshop.sh" in problems[0]


def test_a_path_of_another_site_is_refused_and_an_override_to_a_mounted_path_is_accepted() -> None:
    problems = adapter(RLVR_ASYNC, "rlvr").problems(shape(2))
    assert any(
        p.startswith("roll-cluster:training.overrides.pretrain: is a path of the site") and "/data/cpfs_0/" in p
        for p in problems
    ), problems
    fixed = adapter(RLVR_ASYNC, "rlvr", {"pretrain": "/mnt/shared/models/Qwen2.5-7B"}).problems(shape(2))
    assert not any(p.startswith("roll-cluster:training.overrides.pretrain:") for p in fixed)


def test_a_rock_sandbox_on_localhost_is_refused_and_a_reachable_service_is_not() -> None:
    overrides = {"custom_env.SimpleSokoban.env_type": "sokoban_sandbox"}
    problems = adapter(FROZEN_LAKE, overrides=overrides).problems(shape(1))
    assert any("needs a ROCK sandbox service at http://localhost:8080" in p for p in problems), problems
    overrides["custom_env.SimpleSokoban.env_config.base_url"] = "http://10.0.0.5:8080"
    assert adapter(FROZEN_LAKE, overrides=overrides).problems(shape(1)) == []


def test_another_gpu_count_than_the_bases_is_stated_with_the_batch_it_changes() -> None:
    notes = adapter(FROZEN_LAKE).build(shape(2)).warnings
    assert any(
        "samples per optimizer step (per_device_train_batch_size x gradient_accumulation_steps x DP) 1024 -> 2048"
        in note and "gradient_accumulation_steps: 32" in note
        for note in notes
    ), notes
    assert any("'copy' adds 1024 copies of trajectories" in note for note in notes), notes
    assert adapter(FROZEN_LAKE).build(shape(1)).warnings == []  # the base's own 8 GPUs: nothing changes


def test_roles_kept_on_a_subset_leave_gpus_without_generation_and_say_so() -> None:
    notes = adapter(RLVR_8, "rlvr").build(shape(2)).warnings
    assert any("actor_infer generates on GPUs 0-5 only" in note and "6-15" in note for note in notes), notes


def test_the_tool_reports_what_renders_and_what_is_refused_with_the_reason() -> None:
    outcomes = {o.example: o for o in render_roll_examples.render_all(ROLL_SNAPSHOT)}
    assert "config/traj_envs.yaml" not in outcomes  # an included file, not an example
    assert outcomes[GEM].results["2x8"][0] and outcomes[GEM].pipeline == "agentic" and outcomes[GEM].colocated
    renders, reason, _ = outcomes[WEBSHOP].results["1x8"]
    assert not renders and "WebShop" in reason
    text = render_roll_examples.table(list(outcomes.values()), "8eb27cc")
    # The snapshot has no run scripts: the pipeline is guessed from the keys, and marked so.
    assert f"| `{WEBSHOP}` | agentic* | yes | refused: custom_envs.WebShopEnv.env_type: the WebShop" in text
    assert f"| `{GEM}` | agentic* | yes | renders | renders; actor_train: 8 -> 16 GPUs" in text


def test_the_snapshot_keeps_only_a_few_examples() -> None:
    files = [p for p in (ROLL_SNAPSHOT / "examples").rglob("*") if p.is_file()]
    assert len(files) <= 15, "tests/fixtures/roll is a sparse snapshot: add only what a test needs"
