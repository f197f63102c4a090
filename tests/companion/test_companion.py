"""The companion (`python3 -m companion`) and every command docs/operations.md's "Daily operation" tells a user to
run, as written, against a stand-in `pulumi` on PATH: it answers what the Automation API asks (version, stack ls, stack
output) with outputs whose commands only say that they ran, and records everything else it is asked."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
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
    """The command lines of docs/operations.md's "Daily operation" (and the README's code blocks that use the
    companion): code blocks and the table's `run it with` column, without comments; commands meant for the head's
    shell (docker exec) are left out."""
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
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
    readme, fenced = (REPO / "README.md").read_text(encoding="utf-8"), False
    for line in readme.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and line.startswith("python3 -m companion ") and " plan " not in f"{line} ":
            lines.append(line.split("  #", 1)[0].strip())
    unique = list(dict.fromkeys(lines))
    return [line for line in unique if line and not line.startswith("docker exec")]


def test_the_docs_show_the_companion_and_the_output_forms():
    commands = daily_operation_commands()
    for name in ("status", "logs", "dashboard", "ssh", "stop", "resubmit", "pause", "resume", "cost", "list", "down"):
        assert f"python3 -m companion {name}" in commands, name
    assert "pulumi stack output jobStatus | sh" in commands and 'eval "$(pulumi stack output sshHead)"' in commands


@pytest.mark.parametrize("line", daily_operation_commands())
def test_every_daily_operation_command_works_as_written(line: str, shell_env: dict[str, str]) -> None:
    result = _bash(line, shell_env)
    if line.endswith("companion down"):  # it asks first: without a terminal it refuses and destroys nothing
        assert result.returncode == 2 and "not confirmed" in result.stderr and "destroy" not in _calls(shell_env)
        return
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
    (tmp_path / "outputs.json").write_text(json.dumps({"sshHead": "echo x"}))  # deployed, with autoStart false
    result = _bash("python3 -m companion logs", shell_env)
    assert result.returncode == 2 and "no `jobLogs` output" in result.stderr and "Traceback" not in result.stderr


def test_the_program_never_imports_the_companion() -> None:
    sources = [*REPO.glob("components/*.py"), *REPO.glob("infra/**/*.py"), REPO / "__main__.py"]
    assert not [p for p in sources if re.search(r"^\s*(from|import) companion\b", p.read_text(), re.M)]


# ------------------------------------------------------------ no Pulumi CLI, an unreachable head: bounded, no traceback
USER_COMMANDS = ["status", "logs", "ssh", "dashboard", "stop", "resubmit", "pause", "resume", "cost", "list", "down"]


def _path_without_pulumi(tmp_path: Path) -> str:
    """A PATH with python3, sh and ssh only: no `pulumi`, whatever this machine has."""
    import shutil

    bin_dir = tmp_path / "no-pulumi-bin"
    bin_dir.mkdir()
    for tool in ("sh", "ssh"):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    # The interpreter itself, not a version manager's shim (a shell script that needs more of PATH).
    real = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                          check=True).stdout.strip()
    (bin_dir / "python3").symlink_to(Path(real).resolve())
    return str(bin_dir)


@pytest.mark.parametrize("command", USER_COMMANDS)
def test_without_the_pulumi_cli_every_command_says_what_to_do(command: str, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _path_without_pulumi(tmp_path)}
    result = subprocess.run(["python3", "-m", "companion", command], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode != 0
    assert "the Pulumi CLI is not on PATH: install it" in result.stderr and "companion plan" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_the_plan_needs_no_pulumi_cli(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": _path_without_pulumi(tmp_path), "ROLL_CLUSTER_NO_REGISTRY": "1"}
    result = subprocess.run(["python3", "-m", "companion", "plan", "dev"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("roll-cluster plan: stack dev") and len(result.stdout.splitlines()) <= 50


@pytest.fixture
def silent_head():
    """A TCP port on loopback that accepts connections and never says a word: a head that cannot be reached (an
    SSH server that never answers, as a filtered address would leave ssh waiting)."""
    import socket

    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    yield server.getsockname()[1]
    server.close()


def _unreachable_outputs(port: int, key: Path) -> dict[str, object]:
    from infra.ray import user_commands

    known = str(key.parent / "known_hosts")
    args = ("127.0.0.1", str(key), "roll")
    return {
        **OUTPUTS,
        "nodes": [{"name": "node-0", "publicIp": "127.0.0.1", "privateIp": "10.0.0.100"}],
        "sshHead": user_commands.ssh_command("127.0.0.1", str(key), known, "root", port),
        "dashboardTunnel": user_commands.dashboard_tunnel_command("127.0.0.1", str(key), 8265, known, "root", port),
        "jobStatus": user_commands.job_status_command(*args, "roll-multi-1", 8265, known, "root", port),
        "jobLogs": user_commands.job_logs_command(*args, "roll-multi-1", 8265, known, "root", port),
        "jobStop": user_commands.job_stop_command(*args, "roll-multi-1", 8265, known, "root", port),
    }


@pytest.mark.parametrize("command", ["status", "logs", "ssh", "dashboard", "stop"])
def test_an_unreachable_head_ends_the_command_with_the_address_hint(command: str, shell_env: dict[str, str],
                                                                    tmp_path: Path, silent_head: int) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("not used: the connection never gets that far\n")
    key.chmod(0o600)
    (tmp_path / "outputs.json").write_text(json.dumps(_unreachable_outputs(silent_head, key)))
    # Bounded by ssh's ConnectTimeout (infra/ray/user_commands.py), not by this test's limit.
    result = subprocess.run(["python3", "-m", "companion", command], cwd=REPO, env=shell_env, capture_output=True,
                            text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert result.returncode == 2, result.stderr
    assert "could not reach 127.0.0.1 over SSH" in result.stderr and "access.adminCidrs" in result.stderr
    assert "curl -4 -s https://ifconfig.me" in result.stderr and "Traceback" not in result.stderr


def test_a_never_deployed_stack_is_said_so(shell_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "outputs.json").write_text("{}")
    result = _bash("python3 -m companion status", shell_env)
    assert result.returncode == 2 and "None" not in result.stdout + result.stderr
    assert "stack multi has no outputs: it was never deployed" in result.stderr
    assert "python3 -m companion plan multi" in result.stderr


def test_list_shows_each_stack_with_its_state_and_cost_per_hour(shell_env: dict[str, str]) -> None:
    result = _bash("python3 -m companion list", shell_env)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("multi*"))
    assert "running" in row and "108.50 CNY/h" in row and " 2 " in row


def test_down_asks_first_and_destroys_only_when_confirmed(shell_env: dict[str, str]) -> None:
    refused = _bash("python3 -m companion down", shell_env)
    assert refused.returncode == 2 and "not confirmed" in refused.stderr and "destroy" not in _calls(shell_env)
    assert "kept: NAS kept" in refused.stdout
    done = _bash("python3 -m companion down --yes", shell_env)
    assert done.returncode == 0, done.stderr
    assert "destroy --stack multi --yes" in _calls(shell_env)


def test_a_passphrase_refusal_names_pulumi_config_passphrase(shell_env: dict[str, str], tmp_path: Path) -> None:
    failing = tmp_path / "bin" / "pulumi"
    failing.write_text("#!/bin/sh\necho 'error: passphrase must be set with PULUMI_CONFIG_PASSPHRASE or "
                       "PULUMI_CONFIG_PASSPHRASE_FILE environment variables' >&2\nexit 255\n")
    result = _bash("python3 -m companion --stack multi status", shell_env)
    assert result.returncode == 2 and "export PULUMI_CONFIG_PASSPHRASE" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_command_has_a_description_and_the_help_is_whole(shell_env: dict[str, str]) -> None:
    top = _bash("python3 -m companion --help", shell_env)
    assert top.returncode == 0
    description = top.stdout.split("\n\n", 1)[1].split("\npositional arguments", 1)[0]
    assert description.strip().endswith(".")
    for command in ["plan", *USER_COMMANDS]:
        assert f"\n    {command} " in top.stdout, command
        own = _bash(f"python3 -m companion {command} --help", shell_env)
        assert own.returncode == 0, command
        text = own.stdout.split("\n\n", 2)
        assert len(text) >= 2 and text[1].strip() and not text[1].startswith(("options", "positional")), command


def test_a_paused_cluster_is_said_so_instead_of_running_the_outputs_text(shell_env: dict[str, str],
                                                                         tmp_path: Path) -> None:
    from infra.outputs import PAUSED

    paused = {**OUTPUTS, **{name: PAUSED for name in ("sshHead", "dashboardTunnel", "jobStatus", "jobLogs", "jobStop")}}
    (tmp_path / "outputs.json").write_text(json.dumps(paused))
    for command in ("status", "logs", "ssh", "dashboard", "stop"):
        result = _bash(f"python3 -m companion {command}", shell_env)
        assert result.returncode == 2, (command, result.stderr)
        assert "the cluster is stopped" in result.stderr and "companion resume" in result.stderr
        assert "not found" not in result.stderr + result.stdout
    listed = _bash("python3 -m companion list", shell_env)
    assert "paused" in next(line for line in listed.stdout.splitlines() if line.startswith("multi*"))
