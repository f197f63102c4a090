"""The companion (`python3 -m companion`) and every command the README's "Daily operation" tells a user to run, as
written, against a stand-in `pulumi` on PATH: it answers what the Automation API asks (version, stack ls, stack
output) with outputs whose commands only say that they ran, and records everything else it is asked."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAD_IP, WORKER_IP = "47.96.1.11", "47.96.1.48"
OUTPUTS = {
    "gpus": 4, "gpuModel": "V100", "instanceType": "ecs.gn6v-c8g1.4xlarge", "zone": "cn-hangzhou-i",
    "nodes": [{"name": "node-0", "publicIp": HEAD_IP, "privateIp": "10.0.0.100"},
              {"name": "node-1", "publicIp": WORKER_IP, "privateIp": "10.0.0.101"}],
    # What the real outputs hold has quotes and `~`: run as `$(...)` they would break; the companion must not.
    "jobStatus": "echo 'RAN jobStatus' RUNNING",
    "jobLogs": "echo 'RAN jobLogs'",
    "jobStop": "echo 'RAN jobStop'",
    "dashboardTunnel": "echo 'RAN dashboardTunnel'",
    "sshHead": f"echo 'RAN sshHead' -o 'UserKnownHostsFile=~/x y' root@{HEAD_IP}",
    "jobResubmit": "pulumi up --replace 'urn:pulumi:multi::roll-cluster::x$command:remote:Command::training-job'",
    "jobId": "roll-multi-1",
    "cost": {"currency": "CNY", "running": {"perHour": 108.5}, "paused": {"perHour": 0.9, "keepsBilling": "disks"},
             "afterDestroy": ["NAS kept"], "autostop": "off"},
}
STANDIN = r"""#!/usr/bin/env python3
# A stand-in `pulumi`: answers the Automation API's questions and `stack output`, records every call.
import json, os, sys
args = sys.argv[1:]
with open(os.environ["STANDIN_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
outputs = json.load(open(os.environ["STANDIN_OUTPUTS"]))
words = [a for a in args if not a.startswith("--") and a != os.environ.get("STANDIN_STACK")]
if args[:1] == ["version"]:
    print("v3.272.0")
elif words[:2] == ["stack", "ls"]:
    print(json.dumps([{"name": "multi", "current": True}]))
elif words[:2] == ["stack", "output"]:
    if len(words) > 2:  # one output: a string as it is (what `| sh` and `eval` get), else JSON
        value = outputs[words[2]]
        print(value if isinstance(value, str) else json.dumps(value))
    else:
        print(json.dumps(outputs))
elif words[:2] == ["stack", "history"]:
    print(json.dumps([{"kind": "update", "startTime": "2026-01-01T00:00:00Z"}]))
"""


@pytest.fixture
def shell_env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text(STANDIN)
    (bin_dir / "pulumi").chmod(0o755)
    (tmp_path / "outputs.json").write_text(json.dumps(OUTPUTS))
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STANDIN_LOG": str(tmp_path / "calls"),
            "STANDIN_OUTPUTS": str(tmp_path / "outputs.json"), "STANDIN_STACK": "multi"}


def _bash(line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def _calls(env: dict[str, str]) -> str:
    path = Path(env["STANDIN_LOG"])
    return path.read_text() if path.exists() else ""


def daily_operation_commands() -> list[str]:
    """The command lines of the README's "Daily operation": its code blocks and the table's `run it with`
    column, without comments; commands meant for the head's shell (docker exec) are left out."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Daily operation", 1)[1].split("\n## ", 1)[0]
    lines: list[str] = []
    fenced = False
    for line in section.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            lines.append(line.split("  #", 1)[0].strip())
        elif line.startswith("| `") and "run it with" not in line:
            cell = [c.strip() for c in re.split(r"(?<!\\)\|", line) if c.strip()][-1]
            if cell.startswith("`pulumi stack output") or cell.startswith("`eval"):
                lines.append(cell.strip("`").replace("\\|", "|"))
    return [line for line in lines if line and not line.startswith("docker exec")]


def test_the_readme_shows_the_companion_and_the_output_forms():
    commands = daily_operation_commands()
    for name in ("status", "logs", "dashboard", "ssh", "stop", "resubmit", "pause", "resume", "cost"):
        assert f"python3 -m companion {name}" in commands, name
    assert "pulumi stack output jobStatus | sh" in commands and 'eval "$(pulumi stack output sshHead)"' in commands


@pytest.mark.parametrize("line", daily_operation_commands())
def test_every_daily_operation_command_works_as_written(line: str, shell_env: dict[str, str]) -> None:
    result = _bash(line, shell_env)
    assert result.returncode == 0, f"{line}\n{result.stdout}{result.stderr}"
    ran = re.search(r"(jobStatus|jobLogs|jobStop|dashboardTunnel|sshHead)", line)
    name = ran.group(1) if ran else {"status": "jobStatus", "logs": "jobLogs", "stop": "jobStop",
                                     "dashboard": "dashboardTunnel", "ssh": "sshHead"}.get(line.split()[-1])
    if name:  # the output's own command ran, quotes and all
        # At the start of the line: through a bare $(...) the quote would come first ('RAN ...').
        assert re.search(rf"^RAN {name}", result.stdout, re.M), f"{line}\n{result.stdout}{result.stderr}"
    calls = _calls(shell_env)
    if "resubmit" in line or "jobResubmit" in line:
        assert "up --replace urn:pulumi:multi::roll-cluster::x$command:remote:Command::training-job" in calls
    if line.endswith("companion pause"):
        assert "config set --stack multi --path roll-cluster:nodes.paused true\nup --stack multi" in calls
    if line.endswith("companion resume"):
        assert ("config rm --stack multi --path roll-cluster:nodes.paused\nrefresh --stack multi --yes --target "
                "**alicloud:ecs/instance:Instance::*\nup --stack multi --replace **::training-job") in calls
    if line.endswith("companion cost"):
        assert "108.50 CNY/h" in result.stdout and "after destroy: NAS kept" in result.stdout


def test_ssh_to_another_node_keeps_the_login_and_changes_only_the_address(shell_env: dict[str, str]) -> None:
    result = _bash("python3 -m companion ssh --node node-1", shell_env)
    assert result.returncode == 0, result.stderr
    assert f"root@{WORKER_IP}" in result.stdout and "UserKnownHostsFile=~/x y" in result.stdout
    wrong = _bash("python3 -m companion ssh --node node-7", shell_env)
    assert wrong.returncode == 2 and "no node 'node-7'" in wrong.stderr and "Traceback" not in wrong.stderr


def test_a_bare_substitution_would_have_broken_where_the_companion_works(shell_env: dict[str, str]) -> None:
    # Guards the test above: the output's quotes reach the command literally through $(...).
    bare = _bash("$(pulumi stack output sshHead)", shell_env)
    assert "'RAN" in bare.stdout and not re.search(r"^RAN sshHead", bare.stdout, re.M)


def test_no_stack_output_is_a_plain_message(shell_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "outputs.json").write_text("{}")
    result = _bash("python3 -m companion logs", shell_env)
    assert result.returncode == 2 and "no `jobLogs` output" in result.stderr and "Traceback" not in result.stderr


def test_the_program_never_imports_the_companion() -> None:
    sources = [*REPO.glob("components/*.py"), *REPO.glob("infra/**/*.py"), REPO / "__main__.py"]
    assert not [p for p in sources if re.search(r"^\s*(from|import) companion\b", p.read_text(), re.M)]
