"""A framework is its adapter, its config and one line in the registry (docs/adding-a-framework.md): a dummy one,
registered by this test alone, runs through the whole offline plan, and the guide's list of files stays true."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from offline_helpers import env_of, run, step_command

from devtools import plan
from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks import registry
from infra.frameworks.base import ClusterShape, CodeSpec, FrameworkFacts, JobSpec, image_facts, job_id
from infra.ray.step_env import CHECKPOINT_LAYOUTS

ROOT = Path(__file__).resolve().parents[3]
GUIDE = ROOT / "docs" / "adding-a-framework.md"


class DummyAdapter(FrameworkFacts):
    """A framework the program has never heard of: no code to fetch, one entrypoint, its own first-step line."""

    name = "dummy"
    first_step_pattern = "dummy step [0-9]+ done"

    def __init__(self, training: TrainingConfig, container: ContainerConfig) -> None:
        self.training = training
        self.container = container

    def code(self) -> CodeSpec | None:
        return None

    def job(self, shape: ClusterShape) -> JobSpec:
        configuration = {"steps": 3, **image_facts(self.container)}
        return JobSpec(
            job_id=job_id(self.name, shape, configuration), workdir="/", entrypoint="python3 -m dummy.train",
            runtime_env=None, files={}, prepare=None, pre_submit_check=None, reward_server=None,
            summary={"framework": "dummy", "steps": 3},
        )

    def problems(self, shape: ClusterShape) -> list[str]:
        return []


@pytest.fixture
def dummy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one line a new framework adds to the registry, for this test only."""
    monkeypatch.setitem(registry.FRAMEWORKS, DummyAdapter.name, DummyAdapter)


DUMMY = {"roll-cluster:training": {"framework": "dummy"}}


@pytest.mark.usefixtures("dummy_registered")
def test_a_framework_registered_alone_runs_through_the_offline_plan(capsys: pytest.CaptureFixture[str]) -> None:
    result = run("dev", config=DUMMY)
    env = env_of(step_command(result, "training-job"))
    assert env["JOB_ENTRYPOINT"] == "python3 -m dummy.train"
    assert env["JOB_ID"].startswith("dummy-dev-")
    assert env["JOB_FIRST_STEP_PATTERN"] == DummyAdapter.first_step_pattern
    # No code to fetch: no code step on any node.
    assert not any(r.name.endswith("-code") for r in result.cloud.resources)

    text = plan.plan_text(result)
    assert "python3 -m dummy.train" in text
    assert f"for the line /{DummyAdapter.first_step_pattern}/" in text


def test_without_its_registry_line_the_framework_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(Exception, match=r'training\.framework: must be one of "roll", .*; got "dummy"'):
        run("dev", config=DUMMY)


@pytest.mark.usefixtures("dummy_registered")
def test_the_registered_framework_is_among_the_allowed_values() -> None:
    assert "dummy" in registry.framework_names()
    assert TrainingConfig.model_validate({"framework": "dummy"}).framework == "dummy"


def guide_files() -> list[str]:
    """The repository paths the guide lists (backquoted, with a slash)."""
    return re.findall(r"`((?:infra|components|devtools|docs|tests)/[^`*<>]+)`", GUIDE.read_text())


def test_the_guide_lists_files_that_exist() -> None:
    files = guide_files()
    assert files
    missing = [path for path in files if not (ROOT / path).exists()]
    assert not missing, f"docs/adding-a-framework.md lists files that do not exist: {missing}"


def test_the_guide_names_every_framework_module_and_every_fact_an_adapter_sets() -> None:
    text = GUIDE.read_text()
    for adapter in registry.FRAMEWORKS.values():
        module = adapter.__module__.replace(".", "/") + ".py"
        assert f"`{module}`" in text, module
    facts = [name for name, value in vars(FrameworkFacts).items() if not name.startswith("_")]
    undocumented = [fact for fact in facts if f"`{fact}" not in text]
    assert not undocumented, f"docs/adding-a-framework.md does not say what these facts are: {undocumented}"


def test_the_checkpoint_layouts_are_the_ones_the_finder_searches() -> None:
    finder = (ROOT / "infra" / "scripts" / "checkpoint_find.sh").read_text()
    cases = re.findall(r"^    ([a-z-]+)\)$", finder, re.M)
    assert tuple(cases) == CHECKPOINT_LAYOUTS
