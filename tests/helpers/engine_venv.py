"""The engines' own virtualenvs for the oracle tests (tests/engines): built by the test tier itself, outside the
clone, once per requirements file (keyed by its digest), and reused by every later run and every worktree.

An engine venv is large (vLLM 0.8.4 with torch 2.6.0's CUDA wheels: about 8 GB, about 5 minutes to install), so it
lives under /var/cache/roll-cluster-engines (else ~/.cache/roll-cluster-engines; $ROLL_CLUSTER_ENGINES_CACHE wins),
never in the repository. A build holds a lock, so two test runs never build the same venv at once, and is marked
complete only at its end: a build cut short is removed and redone by the next run.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import venv
from pathlib import Path


def _cache() -> Path:
    """$ROLL_CLUSTER_ENGINES_CACHE, else /var/cache/roll-cluster-engines where this user may write there (root, as
    the real-host tier's /var/cache/roll-cluster-e2e), else the user's cache directory."""
    if os.environ.get("ROLL_CLUSTER_ENGINES_CACHE"):
        return Path(os.environ["ROLL_CLUSTER_ENGINES_CACHE"])
    system = Path("/var/cache/roll-cluster-engines")
    if os.access(system if system.exists() else system.parent, os.W_OK):
        return system
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "roll-cluster-engines"


CACHE = _cache()
# What a vLLM venv takes on disk (7.8 GB measured, verified-facts#engine-venv-engines-own-checks), with room.
NEEDED_FREE_BYTES = 10 << 30
PIP_TIMEOUT_S = 45 * 60  # a slow mirror on 2 cores; measured about 5 minutes
STAMP = ".requirements-sha256"


class EngineVenvUnavailable(Exception):
    """The engine venv cannot be built here (no package index, no space, no write access); the message says why."""


def requirements_digest(requirements: Path) -> str:
    return hashlib.sha256(requirements.read_bytes()).hexdigest()


def venv_path(requirements: Path) -> Path:
    """<cache>/<name>-<digest>: requirements-vllm-0.8.4.txt gives vllm-0.8.4-<first 16 hex digits>."""
    name = requirements.stem.removeprefix("requirements-")
    return CACHE / f"{name}-{requirements_digest(requirements)[:16]}"


def _complete(target: Path, digest: str) -> bool:
    stamp = target / STAMP
    return (target / "bin" / "python").exists() and stamp.exists() and stamp.read_text().strip() == digest


def ensure_engine_venv(requirements: Path) -> Path:
    """The venv of `requirements`, built first if needed; raises EngineVenvUnavailable saying why it cannot be."""
    digest = requirements_digest(requirements)
    target = venv_path(requirements)
    if _complete(target, digest):
        return target
    try:
        CACHE.mkdir(parents=True, exist_ok=True)
        lock_file = (CACHE / f".{target.name}.lock").open("w")
    except OSError as error:
        raise EngineVenvUnavailable(f"cannot write the engine venv cache {CACHE}: {error}") from error
    with lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # another run building the same venv: wait for it
        if _complete(target, digest):
            return target
        free = shutil.disk_usage(CACHE).free
        if free < NEEDED_FREE_BYTES:
            raise EngineVenvUnavailable(
                f"the engine venv needs about {NEEDED_FREE_BYTES >> 30} GiB free under {CACHE}; {free >> 30} GiB free"
            )
        shutil.rmtree(target, ignore_errors=True)  # a build cut short
        venv.EnvBuilder(with_pip=True).create(target)
        command = [str(target / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                   "--no-cache-dir", "-r", str(requirements)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired as error:
            shutil.rmtree(target, ignore_errors=True)
            raise EngineVenvUnavailable(f"pip install -r {requirements.name} took over {PIP_TIMEOUT_S} s") from error
        if result.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-8:])
            raise EngineVenvUnavailable(
                f"pip install -r {requirements.name} failed (exit {result.returncode}; no package index "
                f"reachable?):\n{tail}"
            )
        (target / STAMP).write_text(digest + "\n")
    return target
