"""Issue 11: a cluster that stays right. Bounded probes, recorded Ray settings, reboots, teardown, quiet SSH.

The shell parts run for real (bash, the node scripts rendered as pulumi-command runs them); the program parts
run under the offline cloud.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from pathlib import Path

from infra.node.remote import SCRIPTS_DIR

LIB = SCRIPTS_DIR / "lib.sh"


def run_lib(
    snippet: str, tmp_path: Path, timeout: float = 60, **env: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "-c", f"source {LIB}\n{snippet}"],
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "ROLL_LOG_DIR": str(tmp_path / "log"), "ROLL_STEP": "probe-test",
             "NODE_NAME": "node-0", **env},
        capture_output=True, text=True, timeout=timeout, check=False,
    )
    return result, time.monotonic() - started


def leftover(marker: str) -> bool:
    return marker in subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout


# ------------------------------------------------------------------------------------ 4. bounded probes
def test_a_wait_whose_probe_hangs_fails_at_its_bound_and_the_hung_probe_is_killed(tmp_path: Path) -> None:
    marker = f"sleep 9{uuid.uuid4().int % 10**6}"  # a unique command line to look for afterwards
    snippet = f"hung_probe() {{ bash -c '{marker}'; }}\nwait_for 'the hung daemon' 4 1 hung_probe"
    result, seconds = run_lib(snippet, tmp_path, PROBE_TIMEOUT_S="3")
    assert result.returncode == 1, result
    assert "timed out after 4s waiting for the hung daemon" in result.stderr
    assert "did not answer within" in result.stdout and "cut off" in result.stdout
    # The bound (4 s) is exceeded by at most one probe timeout (3 s), never by the probe's own 900000 s.
    assert seconds < 4 + 3 + 1, seconds
    time.sleep(0.5)
    assert not leftover(marker), "the hung probe's processes outlive the wait"


def test_a_probe_that_hangs_once_is_cut_and_the_wait_goes_on_to_success(tmp_path: Path) -> None:
    flag = tmp_path / "hung-once"
    snippet = (f"probe() {{ if [[ ! -e {flag} ]]; then touch {flag}; sleep 600; fi; }}\n"
               "wait_for 'the daemon' 20 1 probe && echo READY")
    result, seconds = run_lib(snippet, tmp_path, PROBE_TIMEOUT_S="2")
    assert result.returncode == 0 and "READY" in result.stdout, result
    assert 2 <= seconds < 8, seconds


def test_bounded_keeps_the_probes_output_and_status(tmp_path: Path) -> None:
    result, _ = run_lib("out=$(bounded 5 bash -c 'echo hello; exit 3') || echo \"status $? $out\"", tmp_path)
    assert "status 3 hello" in result.stdout, result
