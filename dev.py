#!/usr/bin/env python3
"""Developer entry point; needs only Python 3.11+. Creates .venv from the requirements files on first use
(and again when they change), then runs the command inside it.

    python3 dev.py plan dev     # the offline plan of a stack (no cloud, no credentials, no Pulumi CLI)
    python3 dev.py test         # the whole suite: ruff, mypy, shellcheck and pytest (incl. the real-host tier)
    python3 dev.py bench        # benchmarks whose figures go into the README
    python3 dev.py docs         # regenerate the README's configuration reference
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
STAMP = VENV / ".requirements-sha256"
REQUIREMENTS = ["requirements.txt", "requirements-dev.txt", "requirements-contract.txt"]
# The frameworks the contract tests read (verl, OpenRLHF): their code only, never their dependencies (torch, Ray,
# vLLM), which a requirements file cannot say per line.
NO_DEPS_REQUIREMENTS = "requirements-contract.txt"


def requirements_digest() -> str:
    digest = hashlib.sha256()
    for name in REQUIREMENTS:
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def ensure_venv() -> None:
    wanted = requirements_digest()
    if PYTHON.exists() and STAMP.exists() and STAMP.read_text().strip() == wanted:
        return
    if not PYTHON.exists():
        print(f"dev.py: creating {VENV.name} ...", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("dev.py: installing requirements-dev.txt into .venv ...", flush=True)
    subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "-r", str(ROOT / "requirements-dev.txt")], check=True)
    subprocess.run([str(PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "-r", str(ROOT / NO_DEPS_REQUIREMENTS)], check=True)
    STAMP.write_text(wanted + "\n")


def run(*argv: str) -> int:
    print("$ " + " ".join(argv), flush=True)
    return subprocess.run(argv, cwd=ROOT).returncode


def main(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if args else 2
    ensure_venv()
    command, rest = args[0], args[1:]
    py = str(PYTHON)
    if command == "plan":
        return run(py, "-m", "infra.plan", *(rest or ["dev"]))
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
        return run(py, "-m", "infra.reference", "--write", "README.md")
    print(f"dev.py: unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main(sys.argv[1:]))
