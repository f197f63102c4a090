"""ROLL's checkpoints live in the job's own directory on the shared storage; training.resume says whether a
changed configuration resumes there or starts fresh in a directory of its own."""

from __future__ import annotations

import yaml
from offline_helpers import run

from infra.node import steps


def shipped_yaml(config: dict | None = None) -> dict:
    run("multi", config=config or {})
    text = steps.NOTES["job_spec"].rendered_config
    assert text is not None
    return yaml.safe_load(text)


def test_roll_resumes_from_the_jobs_own_directory_by_default() -> None:
    config = shipped_yaml()
    assert config["checkpoint_config"]["output_dir"] == "/mnt/shared/checkpoints/multi/roll"
    assert config["resume_from_checkpoint"] is True
    # A changed configuration keeps the directory, so it resumes from the last checkpoint there.
    changed = shipped_yaml({"roll-cluster:training": {"overrides": {"max_steps": 7}}})
    assert changed["checkpoint_config"]["output_dir"] == "/mnt/shared/checkpoints/multi/roll"


def test_a_fresh_start_gets_a_directory_of_its_own_per_configuration() -> None:
    fresh = {"resume": False}
    first = shipped_yaml({"roll-cluster:training": fresh})
    second = shipped_yaml({"roll-cluster:training": {**fresh, "overrides": {"max_steps": 7}}})
    assert first["resume_from_checkpoint"] is False
    dirs = {first["checkpoint_config"]["output_dir"], second["checkpoint_config"]["output_dir"]}
    assert len(dirs) == 2 and all(d.startswith("/mnt/shared/checkpoints/multi/roll-") for d in dirs)
