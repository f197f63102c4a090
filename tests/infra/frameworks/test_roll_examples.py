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

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))
import render_roll_examples

GEM = "qwen3_agentic_gem/gem_rg_letter_counting.yaml"
WEBSHOP = "qwen2.5-7B-agentic_megatron/agentic_val_webshop.yaml"
SEPARATE = "qwen2.5-7B-rlvr_megatron/rlvr_qwen2.5_7B_seperate.yaml"
FROZEN_LAKE = "qwen2.5-0.5B-agentic/agent_val_frozen_lake.yaml"
RLVR_8 = "qwen2.5-7B-rlvr_megatron/rlvr_config_8gpus.yaml"
RLVR_ASYNC = "qwen2.5-7B-rlvr_megatron/rlvr_config_async.yaml"
MOCK_DUMP = "qwen2.5-7B-rlvr_megatron/rlvr_rollout_mock_dump.yaml"
PPU = "qwen3.5-35BA3-rlvr_megatron/rlvr_megatron_ppu.yaml"
PPU_DATA = {
    "actor_train.data_args.file_name": ["/mnt/shared/data/train.parquet"],
    "validation.data_args.file_name": ["/mnt/shared/data/test.parquet"],
}


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


@pytest.mark.parametrize("nodes", [1, 2])
def test_webshop_renders_and_the_code_step_sets_it_up(nodes: int) -> None:
    chosen = adapter(WEBSHOP)
    assert chosen.problems(shape(nodes)) == []
    code = chosen.code()
    assert code.scripts == ("fetch_code.sh", "roll_env_setup.sh")
    env = code.env("roll")
    assert (env["WEBSHOP_DIR"], env["WEBSHOP_COMMIT"]) == (
        "third_party/webshop-minimal", "ec82552d2458efb486701b138c9d038e1759489c"
    )
    assert env["WEBSHOP_SPACY_MODEL"] == "en_core_web_sm" and env["WEBSHOP_IMAGE"] == ContainerConfig().image
    setup = chosen.job(shape(nodes)).summary["code"]["environment_setup"]
    assert len(setup) == 1 and setup[0].startswith("WebShop (custom_envs WebShopEnv): the code step sets up")


def test_the_webshop_setup_is_only_in_the_code_step_of_a_config_that_uses_webshop() -> None:
    plain = adapter(FROZEN_LAKE)
    assert plain.code().scripts == ("fetch_code.sh",)
    assert not any(name.startswith("WEBSHOP_") for name in plain.code().env("roll"))
    assert plain.job(shape(1)).summary["code"]["environment_setup"] == []
    # An override that turns an environment into WebShop brings the setup with it.
    turned = adapter(FROZEN_LAKE, overrides={"custom_env.SimpleSokoban.env_type": "webshop"})
    assert turned.code().scripts == ("fetch_code.sh", "roll_env_setup.sh")


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


def test_resized_mappings_that_break_a_rule_of_roll_are_kept_as_the_base_says_with_the_idle_gpus_stated() -> None:
    # 8 GPUs, rollout_batch_size 8: resized to 16, Megatron's data-parallel size 16 no longer divides the batch
    # (ROLL asserts it); the example's own 8 GPUs train as it says, and the plan says why GPUs 8-15 stay idle.
    chosen = adapter(MOCK_DUMP, "rlvr")
    assert chosen.problems(shape(2)) == []
    built = chosen.build(shape(2))
    assert built.rendered is not None
    config = built.rendered.config
    assert {config[role]["device_mapping"] for role in ("actor_train", "actor_infer", "reference")} == {
        "list(range(0,8))"
    }
    assert config["rollout_batch_size"] == 8
    assert built.warnings[0].startswith(
        "every device_mapping kept as in the base (GPUs 0-7, sized for 8): resized to the cluster's 16 GPUs they "
        "break a rule ROLL enforces (rollout_batch_size: must be divisible by Megatron's data-parallel size 16"
    )
    assert "GPUs 8-15 of the cluster's 16 are in no role's device_mapping: idle" in built.warnings
    assert "every device_mapping kept as in the base" in (built.text or "")  # the shipped YAML's header says so
    assert chosen.build(shape(1)).warnings == []  # its own size: nothing kept, nothing idle


def test_mappings_are_resized_when_keeping_them_would_not_help() -> None:
    # A batch that breaks the rule at the base's own size too: the resized render's problem is the one reported.
    problems = adapter(MOCK_DUMP, "rlvr", {"rollout_batch_size": 12}).problems(shape(2))
    assert any("must be divisible by Megatron's data-parallel size 16" in p for p in problems), problems


def test_a_folder_roll_only_writes_to_moves_to_the_jobs_output_folder_and_inputs_stay_refused() -> None:
    problems = adapter(PPU, "rlvr").problems(shape(1))
    assert not any("profiler_output_dir" in p for p in problems), problems
    assert {p.split(":", 2)[1] for p in problems} == {
        "training.overrides.actor_train.data_args.file_name", "training.overrides.validation.data_args.file_name"
    }
    chosen = adapter(PPU, "rlvr", PPU_DATA)
    assert chosen.problems(shape(1)) == []
    built = chosen.build(shape(1))
    assert built.rendered is not None
    assert built.rendered.config["profiler_output_dir"] == "/mnt/shared/roll/x/profiler"
    assert built.warnings[0] == (
        "profiler_output_dir: /mnt/shared/roll/x/profiler (was '/data/oss_bucket_0/xxxxx', a path of the site "
        "ROLL's example was written at; ROLL only writes there; shared storage)"
    )
    # The user's own value is the user's: another site's path set as an override is refused.
    mine = adapter(PPU, "rlvr", {**PPU_DATA, "profiler_output_dir": "/data/cpfs_0/prof"}).problems(shape(1))
    assert [p.split(":", 2)[1] for p in mine] == ["training.overrides.profiler_output_dir"]


def test_a_model_replica_larger_than_the_cluster_is_refused_plainly() -> None:
    problems = adapter(RLVR_8, "rlvr", {
        "actor_train.strategy_args.strategy_config.pipeline_model_parallel_size": 8,
        "actor_train.strategy_args.strategy_config.tensor_model_parallel_size": 2,
    }).problems(shape(1))
    assert [p for p in problems if "model replica" in p] == [
        "roll-cluster:training.overrides.actor_train.strategy_args.strategy_config: needs at least 16 GPUs for one "
        "model replica; the cluster has 8 (Megatron's TP=2 x PP=8 x CP=1 = 16 GPUs per replica; 1 node(s) x 8 "
        "GPU(s))"
    ]
    assert not any("must be divisible by Megatron's model parallelism" in p for p in problems), problems


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
    renders, _, notes = outcomes[WEBSHOP].results["1x8"]
    assert renders and notes[0].startswith("WebShop (custom_envs WebShopEnv): the code step sets up")
    assert outcomes[MOCK_DUMP].results["2x8"][0]
    text = render_roll_examples.table(list(outcomes.values()), "8eb27cc")
    # The snapshot has no run scripts: the pipeline is guessed from the keys, and marked so.
    assert f"| `{WEBSHOP}` | agentic* | yes | renders; WebShop (custom_envs WebShopEnv): the code step" in text
    assert f"| `{GEM}` | agentic* | yes | renders | renders; actor_train: 8 -> 16 GPUs" in text
    # The summary names each refused colocated agentic/RLVR example with the clause of item 6 it falls under.
    assert f"`{PPU}` (both sizes: another site's paths)" in text
    assert "other)" not in text


def test_each_refusal_falls_under_a_clause_of_item_6() -> None:
    assert render_roll_examples.clause(adapter(PPU, "rlvr").problems(shape(1))[0]) == "another site's paths"
    rock = adapter(FROZEN_LAKE, overrides={"custom_env.SimpleSokoban.env_type": "sokoban_sandbox"})
    assert render_roll_examples.clause(rock.problems(shape(1))[0]) == "setup the program cannot do"
    large = adapter(RLVR_8, "rlvr", {"actor_train.strategy_args.strategy_config.pipeline_model_parallel_size": 16})
    found = {render_roll_examples.clause(p) for p in large.problems(shape(1))}
    assert "a size that cannot hold one model replica" in found


def test_the_snapshot_keeps_only_a_few_examples() -> None:
    files = [p for p in (ROLL_SNAPSHOT / "examples").rglob("*") if p.is_file()]
    assert len(files) <= 15, "tests/fixtures/roll is a sparse snapshot: add only what a test needs"
