"""The engine venv builder (tests/helpers/engine_venv.py): reused by the digest of its requirements, and a build that
cannot happen says why and leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import engine_venv
import pytest


def test_a_venv_is_kept_per_requirements_digest_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_venv, "CACHE", tmp_path)
    requirements = tmp_path / "requirements-vllm-9.9.9.txt"
    requirements.write_text("vllm==9.9.9\n")
    target = engine_venv.venv_path(requirements)
    assert target.parent == tmp_path and target.name.startswith("vllm-9.9.9-")
    (target / "bin").mkdir(parents=True)
    (target / "bin" / "python").write_text("")
    (target / ".requirements-sha256").write_text(engine_venv.requirements_digest(requirements) + "\n")
    assert engine_venv.ensure_engine_venv(requirements) == target  # complete: nothing built
    requirements.write_text("vllm==9.9.9\ntorch==0.0.1\n")
    assert engine_venv.venv_path(requirements) != target  # another pin set, another venv


def test_without_a_package_index_the_build_says_why_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_venv, "CACHE", tmp_path)
    # An index on a closed loopback port: pip cannot reach one (never another address).
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_NO_INDEX", "")
    requirements = tmp_path / "requirements-none-0.txt"
    requirements.write_text("roll-cluster-no-such-package==0.0.0\n")
    with pytest.raises(engine_venv.EngineVenvUnavailable) as refused:
        engine_venv.ensure_engine_venv(requirements)
    assert "pip install -r requirements-none-0.txt failed" in str(refused.value)
    assert "no package index reachable?" in str(refused.value)
    assert not engine_venv.venv_path(requirements).exists()
