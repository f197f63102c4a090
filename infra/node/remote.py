"""Turn a node script under infra/scripts/ into the command string a pulumi-command step runs.

pulumi-command passes `environment` as SSH env requests, which a stock sshd refuses (AcceptEnv), so the
variables a script needs are exported at the top of the command itself. The command runs through the remote
login shell (sh or bash), so it only uses POSIX syntax before handing the script to bash:

    export ROLL_STEP='docker'
    export NODE_NAME='roll-cluster-dev-0'
    exec bash -c '<lib.sh><script>' roll-cluster-docker

Values are single-quoted with shlex.quote; secrets may be Outputs and keep their secretness in the result.

The steps send that text on the SSH channel's stdin, not as the command (`stdin_command`): sshd runs the command
as `$SHELL -c <command>`, in argv (`ps`, /proc/<pid>/cmdline, execve audit logs), and pulumi-command prints the
whole command of a failed step (remote/commandOutputs.go:100-101). The outer bash reads stdin whole before running
anything (`text=$(cat)`, then `eval "$text"`), so the script still finds stdin at EOF; an empty stdin fails the
step with a message naming it. The script text itself, which holds no secret, is the inner bash's argument as before.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

import pulumi

SCRIPTS_DIR = Path(__file__).resolve().parent.parent / "scripts"
LIB_SCRIPT = "lib.sh"


def script_path(name: str) -> Path:
    path = SCRIPTS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"node script {name} not found under {SCRIPTS_DIR}")
    return path


def script_text(names: Sequence[str]) -> str:
    """lib.sh followed by the named scripts, each without its shebang line."""
    parts = []
    for name in [LIB_SCRIPT, *names]:
        lines = script_path(name).read_text().splitlines()
        if lines and lines[0].startswith("#!"):
            lines = lines[1:]
        parts.append(f"# ---- {name} ----\n" + "\n".join(lines) + "\n")
    return "".join(parts)


def render_plain(step: str, scripts: Sequence[str], env: Mapping[str, str], sudo: bool = False) -> str:
    """The command for known, plain values (what tests and the e2e tier run).

    sudo: the SSH user is not root (your own hosts): the script runs under `sudo -n`, which keeps exactly the
    exported variables (`--preserve-env=NAMES`; passwordless sudo for ALL commands implies that permission), so
    values stay off every command line as before."""
    exports = [f"export ROLL_STEP={shlex.quote(step)}"]
    exports += [f"export {key}={shlex.quote(str(value))}" for key, value in sorted(env.items())]
    body = script_text(scripts)
    runner = "bash"
    if sudo:
        runner = "sudo -n --preserve-env=" + ",".join(["ROLL_STEP", *sorted(env)]) + " bash"
    return "\n".join(exports) + f"\nexec {runner} -c {shlex.quote(body)} {shlex.quote('roll-cluster-' + step)}\n"


# How a step's SSH session is watched: pulumi-command ignores cancellation while a command runs (pulumi-command v1.2.1
# remote/commandOutputs.go:95, `session.Run(cmd)` without the context), so an interrupted `pulumi up` (a second
# Ctrl-C) kills the provider and drops the connection, and sshd, which gives these sessions no pty, does not signal
# the command: a 30-minute pull or the job's start gate would run on. The step runs in a process group of its own;
# a watcher looks every SESSION_POLL_S seconds whether the SSH session (the runner's parent: sshd's session process,
# or the one above sudo) still exists, and when it is gone stops the group: TERM, then KILL after STOP_GRACE_S. So a
# step ends within SESSION_POLL_S + STOP_GRACE_S of an interrupt; every step is idempotent, and the next `up`
# resumes it (a pull keeps its layers, the job step finds the job submitted and gates it again).
SESSION_POLL_S = 2
STOP_GRACE_S = 10


def stdin_command(step: str, sudo: bool = False) -> str:
    """The short, constant command of a step whose text (`render`, sudo=False) arrives on stdin; with `sudo` the
    whole text runs in a root bash, so its exports need no --preserve-env. The step is stopped when its SSH session
    ends (see SESSION_POLL_S above)."""
    runner = "sudo -n bash" if sudo else "bash"
    # An empty stdin would eval nothing and exit 0: a step whose text never arrived would pass. It fails instead,
    # naming the step ($0 is the name after the -c text).
    check = '[ -n "$text" ] || { echo "$0: no script text arrived on stdin" >&2; exit 1; }'
    # Compact (it is every step's command line and appears in pulumi-command's error of a failed step): p the SSH
    # session's process (above sudo, when sudo runs the shell), s the step's process group, w the watcher's. The
    # shell's own job notices go to /dev/null; the step keeps the original stderr (fd 3).
    body = (f'text=$(cat) && {check}; p=$PPID; [ "$(ps -o comm= -p $p 2>/dev/null)" = sudo ] && '
            'p=$(ps -o ppid= -p $p); exec 3>&2 2>/dev/null; set -m; (exec 2>&3 3>&-; eval "$text") & s=$!; '
            f'(while kill -0 $p; do sleep {SESSION_POLL_S}; done; kill -- -$s; sleep {STOP_GRACE_S}; kill -9 -- -$s) '
            '>/dev/null 2>&1 </dev/null & w=$!; wait $s; r=$?; kill -- -$w; exit $r')
    return f"exec {runner} -c '{body}' {shlex.quote('roll-cluster-' + step)}"


def exported_env(command_text: str) -> dict[str, str]:
    """The variables a rendered step exports: the inverse of render_plain (the plan and the tests read them)."""
    env: dict[str, str] = {}
    for line in command_text.splitlines():
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            env[name] = shlex.split(value)[0] if value else ""
        elif line.startswith("exec "):
            break
    return env


# Whether a section of the stack config is held as a secret (`pulumi config set --secret --path ...`): then every
# command derived from the config is a secret too, so that no part of the section reaches the state in clear text.
# Set by stack_config.load() on every run of the program.
SECRET_CONFIG: dict[str, bool] = {"set": False}


def render(
    step: str, scripts: Sequence[str], env: pulumi.Input[Mapping[str, pulumi.Input[str]]], sudo: bool = False
) -> pulumi.Output[str]:
    """The command for a step whose environment may hold Outputs (IPs, secrets), or be one Output as a whole."""
    resolved: pulumi.Output[Mapping[str, str]] = pulumi.Output.from_input(env)  # type: ignore[arg-type]
    command = resolved.apply(lambda values: render_plain(step, scripts, values, sudo))
    return pulumi.Output.secret(command) if SECRET_CONFIG["set"] else command


def render_user_data(script: str, env: Mapping[str, str]) -> str:
    """cloud-init user data running one node script as root at first boot: `#!/bin/bash`, exports, lib.sh, script.

    The step name is the script's stem with dashes (first_boot.sh -> first-boot). Values are plain strings;
    resolve Outputs first (e.g. with Output.all(...).apply).
    """
    step = Path(script).stem.replace("_", "-")
    exports = [f"export ROLL_STEP={shlex.quote(step)}"]
    exports += [f"export {key}={shlex.quote(str(value))}" for key, value in sorted(env.items())]
    return "#!/bin/bash\n" + "\n".join(exports) + "\n" + script_text([script])
