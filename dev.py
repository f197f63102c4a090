#!/usr/bin/env python3
"""Developer entry point; needs only Python 3.11+. Creates .venv from the requirements files on first use
(and again when they change), then runs the command inside it.

    python3 dev.py plan dev     # the offline plan of a stack: an alias of `python3 -m companion plan dev`
    python3 dev.py test         # the whole suite: ruff, mypy, shellcheck and pytest (incl. the real-host tier)
    python3 dev.py bench        # benchmarks whose figures go into docs/performance.md
    python3 dev.py docs         # regenerate the configuration reference, docs/configuration.md
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PYTHON = VENV / "bin" / "python"
RUNTIME_REQUIREMENTS = ["requirements.txt"]  # what the program and its offline plan need
REQUIREMENTS = ["requirements.txt", "requirements-dev.txt", "requirements-contract.txt"]  # + tests, linters
# The frameworks the contract tests read (verl, OpenRLHF): their code only, never their dependencies (torch, Ray,
# vLLM), which a requirements file cannot say per line.
NO_DEPS_REQUIREMENTS = "requirements-contract.txt"


def requirements_digest(names: list[str]) -> str:
    digest = hashlib.sha256()
    for name in names:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def _stamp(level: str) -> Path:
    return VENV / f".requirements-{level}-sha256"


def _installed(level: str, names: list[str]) -> bool:
    stamp = _stamp(level)
    return PYTHON.exists() and stamp.exists() and stamp.read_text().strip() == requirements_digest(names)


def _pip(*args: str) -> None:
    subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args], check=True)


def ensure_venv(full: bool) -> None:
    """.venv with what the command needs: the runtime requirements for the plan and the reference (a quick start
    downloads no test toolchain), everything for the tests and the benchmarks."""
    if _installed("dev", REQUIREMENTS) or (not full and _installed("runtime", RUNTIME_REQUIREMENTS)):
        return
    if not PYTHON.exists():
        print(f"dev.py: creating {VENV.name} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if not full:
        print("dev.py: installing requirements.txt into .venv ...", flush=True)
        _pip("-r", str(ROOT / "requirements.txt"))
        _stamp("runtime").write_text(requirements_digest(RUNTIME_REQUIREMENTS) + "\n")
        return
    print("dev.py: installing requirements-dev.txt into .venv ...", flush=True)
    _pip("-r", str(ROOT / "requirements-dev.txt"))
    _pip("--no-deps", "-r", str(ROOT / NO_DEPS_REQUIREMENTS))
    _stamp("runtime").write_text(requirements_digest(RUNTIME_REQUIREMENTS) + "\n")
    _stamp("dev").write_text(requirements_digest(REQUIREMENTS) + "\n")


def run(*argv: str) -> int:
    print("$ " + " ".join(argv), flush=True)
    return subprocess.run(argv, cwd=ROOT).returncode


def main(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    ensure_venv(full=command in ("test", "bench"))
    py = str(PYTHON)
    if command == "plan":
        return run(py, "-m", "companion", "plan", *(rest or ["dev"]))
    if command == "test":
        for step in ([py, "-m", "ruff", "check", "."], [py, "-m", "mypy", "."]):
            if run(*step) != 0:
                return 1
        status = run(py, "-m", "pytest", "-q", *rest)
        # pytest exits 5 when it collected nothing: a suite that runs no test is a failure here.
        return 1 if status == 5 else status
    if command == "bench":
        return run(py, "-m", "bench", *rest)
    if command == "docs":
        return run(py, "-m", "devtools.reference", "--write", "docs/configuration.md")
    print(f"dev.py: unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main(sys.argv[1:]))
