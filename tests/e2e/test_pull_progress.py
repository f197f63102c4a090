"""A long image pull on the test hosts shows its progress in the pull-image step's output, as `pulumi up` shows it.

The docker stand-in's pull lasts until the test opens its gate (tests/e2e/fake_docker.sh, pull-gate), so a pull
of half an hour is observed without waiting for one: the step's progress interval (PULL_PROGRESS_S, 30 s on the
nodes) is made 1 s, and the gate opens once the step's log shows a progress line. No timing is asserted.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from e2e_harness import REPO, TestNetwork
from program_commands import render_hosts_program

pytestmark = pytest.mark.e2e

IMAGE = "e2e.example/training:1"  # the image render_hosts_program configures


def test_the_default_progress_interval_is_at_most_a_minute() -> None:
    script = (REPO / "infra" / "scripts" / "pull_image.sh").read_text()
    default = re.search(r'^: "\$\{PULL_PROGRESS_S:=(\d+)\}"$', script, re.M)
    assert default is not None and 0 < int(default.group(1)) <= 60


def test_a_long_pull_prints_progress_in_the_steps_output(network: TestNetwork) -> None:
    host = network.hosts[2]
    program = render_hosts_program(
        "hosts", [host.ip], str(network.client_key), accelerators_per_node=2, container="rc-pull",
        ports=(8500, 8501, 8502), entrypoint="true", working_dir="/tmp/pull-job",
    )
    step = next(s for s in program.steps if s.key == "node-0/pull-image")
    state = host.root / "docker"
    for leftover in (state / "images" / IMAGE.replace("/", "_"),
                     host.private_path("/var/log/roll-cluster/pull-image.log")):
        leftover.unlink(missing_ok=True)
    gate = state / "pull-gate"
    gate.write_text("")
    try:
        running = network.start_command(host, step.command.prefixed("export PULL_PROGRESS_S=1\n"))
        log = host.private_path("/var/log/roll-cluster/pull-image.log")
        deadline = time.monotonic() + 120  # a bound for a broken step, not a measurement
        while not _shows_progress(log) and running.running() and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        gate.unlink(missing_ok=True)
    result = running.wait(120)
    assert result.returncode == 0, result.output
    lines = result.output.splitlines()
    progress = [i for i, line in enumerate(lines) if f"pull-image: still pulling {IMAGE}: " in line]
    pulled = next(i for i, line in enumerate(lines) if f"pull-image: pulled {IMAGE} in " in line)
    assert progress and progress[0] < pulled, result.output
    assert "1 of 2 layers done" in lines[progress[0]]
    assert "a progress line every 1s" in result.output


def _shows_progress(log: Path) -> bool:
    return log.exists() and "still pulling" in log.read_text(errors="replace")
