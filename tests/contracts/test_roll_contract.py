"""Contract: every shipped ROLL stack's configuration, as the program ships it to the head, is one that ROLL at the
pinned ref accepts. No GPU and no ROLL install: the keys are checked against the list generated from ROLL's own
config dataclasses (infra/frameworks/roll_config_keys.json, by tools/roll_config_keys.py), the file is composed
with Hydra the way ROLL's launchers do (interpolations resolved), and ROLL's start-up rules are applied."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from offline_helpers import run

from devtools.offline_cloud import OfflineCloud
from infra.config import DEFAULT_ROLL_REF, ROLL_PIPELINES, ConfigError
from infra.frameworks import roll_checks, roll_keys, roll_render
from infra.frameworks.roll_keys import RollKeys

ROLL_STACKS = {"dev": "agentic", "multi": "agentic", "large": "rlvr"}
GENERATOR = Path(__file__).resolve().parents[2] / "tools" / "roll_config_keys.py"


def shipped(stack: str, **kwargs: Any) -> tuple[str, dict[str, Any]]:
    spec = run(stack, **kwargs).notes["job_spec"]
    assert spec.rendered_config is not None
    return spec.rendered_config, spec.summary["cluster"]


@pytest.mark.parametrize("stack", sorted(ROLL_STACKS))
def test_every_key_of_the_shipped_config_is_a_roll_field_with_an_allowed_value(stack: str) -> None:
    text, _ = shipped(stack)
    config = yaml.safe_load(text)
    assert roll_keys.load_roll_keys().check(config, ROLL_STACKS[stack]) == []


@pytest.mark.parametrize("stack", sorted(ROLL_STACKS))
def test_the_shipped_config_passes_rolls_start_up_rules(stack: str) -> None:
    text, facts = shipped(stack)
    cluster = roll_render.Cluster(
        facts["stack"], facts["nodes"], facts["gpus_per_node"], facts["bf16"], facts["shared_dir"], facts["data_dir"]
    )
    result = roll_checks.check(yaml.safe_load(text), cluster, ROLL_STACKS[stack], roll_keys.load_roll_keys())
    assert result.errors == []


@pytest.mark.parametrize("stack", sorted(ROLL_STACKS))
def test_hydra_composes_and_resolves_the_shipped_file_as_rolls_launcher_does(stack: str, tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    text, facts = shipped(stack)
    (tmp_path / "job.yaml").write_text(text)
    with initialize_config_dir(config_dir=str(tmp_path), job_name="app", version_base=None):
        config = OmegaConf.to_container(compose(config_name="job"), resolve=True)
    assert isinstance(config, dict)
    dtypes = {config[r]["model_args"]["dtype"] for r in ("actor_train", "actor_infer", "reference")}
    assert dtypes == ({"bf16"} if facts["bf16"] else {"fp16"})


def test_a_wrong_key_or_a_missing_required_value_fails() -> None:
    text, _ = shipped("dev")
    config = yaml.safe_load(text)
    keys = roll_keys.load_roll_keys()
    config["actor_train"]["model_args"]["dtpye"] = "fp16"
    config["rollout_batchsize"] = 16
    problems = {p.key: p.message for p in keys.check(config, "agentic")}
    assert problems.keys() == {"actor_train.model_args.dtpye", "rollout_batchsize"}
    assert "did you mean 'dtype'" in problems["actor_train.model_args.dtpye"]
    config = yaml.safe_load(text)
    config["actor_infer"]["model_args"]["dtype"] = "float16"
    assert [p.key for p in keys.check(config, "agentic")] == ["actor_infer.model_args.dtype"]
    config = yaml.safe_load(text)
    del config["sequence_length"]
    cluster = roll_render.Cluster("dev", 1, 1, False, None, "/data")
    missing = roll_checks.check(config, cluster, "agentic", keys).errors
    assert [p.key for p in missing] == ["sequence_length"]


def test_a_misspelt_override_stops_the_program_before_any_resource() -> None:
    cloud = OfflineCloud()
    with pytest.raises(ConfigError, match=r"roll-cluster:training\.overrides\.max_step: is not a field"):
        run("dev", cloud=cloud, config={"roll-cluster:training": {"overrides": {"max_step": 3}}})
    assert cloud.resources == []


def test_the_key_list_is_of_the_pinned_ref_and_covers_every_pipeline_the_config_allows() -> None:
    keys = roll_keys.load_roll_keys()
    assert keys.ref == DEFAULT_ROLL_REF
    assert set(ROLL_PIPELINES) <= set(keys.pipelines())
    fields = keys.fields("roll.configs.model_args.ModelArguments")
    assert fields["attn_implementation"]["choices"] == ["sdpa", "fa2", "auto", None]
    assert fields["dtype"]["choices"] == ["fp32", "bf16", "fp16", None]


def test_the_generator_reads_dataclasses_without_importing_them(tmp_path: Path) -> None:
    """tools/roll_config_keys.py on a small ROLL-shaped tree: fields, bases across modules, Dict[str, X] fields,
    Literal choices, required fields, the launcher's class and the keys it reads itself. The tree imports torch,
    which is not installed: the generator must not import it."""
    (tmp_path / "roll" / "configs").mkdir(parents=True)
    (tmp_path / "roll" / "pipeline").mkdir(parents=True)
    (tmp_path / "examples").mkdir()
    (tmp_path / "roll" / "__init__.py").write_text("")
    (tmp_path / "roll" / "configs" / "__init__.py").write_text("from .worker import Worker\n")
    (tmp_path / "roll" / "configs" / "worker.py").write_text(textwrap.dedent("""
        import torch
        from dataclasses import dataclass, field
        from typing import Literal, Optional

        @dataclass
        class Args:
            dtype: Optional[Literal["fp16", "bf16"]] = field(default="bf16")

        @dataclass
        class Worker:
            model_args: Args = field(default_factory=Args)
            device_mapping: str = None
    """))
    (tmp_path / "roll" / "pipeline" / "my_config.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass, field
        from typing import Dict, Optional
        from roll.configs import Worker

        @dataclass
        class Base:
            seed: int = 1

        @dataclass
        class MyConfig(Base):
            name: str
            actor: Worker = field(default_factory=Worker)
            rewards: Optional[Dict[str, Worker]] = None
    """))
    (tmp_path / "examples" / "start_my_pipeline.py").write_text(textwrap.dedent("""
        from dacite import from_dict
        from roll.pipeline.my_config import MyConfig
        def main(cfg):
            config = from_dict(data_class=MyConfig, data=cfg)
            cls = getattr(cfg, "pipeline_cls", None)
    """))
    out = tmp_path / "keys.json"
    done = subprocess.run(
        [sys.executable, str(GENERATOR), str(tmp_path), "--ref", "abc", "--out", str(out)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["launchers"]["my"] == {
        "classes": ["roll.pipeline.my_config.MyConfig"], "file": "examples/start_my_pipeline.py",
        "reads": ["pipeline_cls"],
    }
    keys = RollKeys(data)
    fields = keys.fields("roll.pipeline.my_config.MyConfig")
    assert set(fields) == {"seed", "name", "actor", "rewards"}
    assert fields["name"]["required"] is True and fields["seed"]["required"] is False
    assert fields["rewards"]["mapping"] is True
    good = {"name": "x", "actor": {"model_args": {"dtype": "fp16"}}, "rewards": {"judge": {"device_mapping": "[0]"}},
            "pipeline_cls": "a.B"}
    assert keys.check(good, "my") == []
    bad = {"actor": {"model_args": {"dtype": "fp8"}}, "rewards": {"judge": {"device_map": "[0]"}}}
    problems = {p.key: p.message for p in keys.check(bad, "my")}
    assert sorted(problems) == ["actor.model_args.dtype", "name", "rewards.judge.device_map"]
    assert problems["name"] == "is required by ROLL's MyConfig (roll/pipeline/my_config.py:11)"
