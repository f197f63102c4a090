"""python3 -m companion COMMAND [--stack NAME]: plan, list, status, logs, ssh, dashboard, stop, resubmit, pause,
resume, cost, down.

Run it from the project directory (where Pulumi.yaml is). Without the project's virtualenv on the path it starts
itself again with .venv/bin/python (the environment `pulumi install` creates), which has the Pulumi SDK.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def _in_project_venv() -> None:
    """Re-run under the project's virtualenv when this Python lacks the Pulumi SDK (a plain `python3`)."""
    try:
        import pulumi.automation  # noqa: F401  (only whether it imports)
    except ImportError:
        venv_python = PROJECT / ".venv" / "bin" / "python"
        # Compared by prefix: a virtualenv's python is usually a symlink to the system's, so the resolved
        # executables of the two are the same file.
        if not venv_python.exists() or Path(sys.prefix).resolve() == (PROJECT / ".venv").resolve():
            sys.exit("companion: the Pulumi SDK is missing: run `pulumi install` (or `python3 dev.py plan`) in "
                     f"{PROJECT} first")
        os.execv(str(venv_python), [str(venv_python), "-m", "companion", *sys.argv[1:]])


if __name__ == "__main__":
    _in_project_venv()
    from companion.cli import main

    sys.exit(main(sys.argv[1:]))
