"""Turn node scripts under infra/scripts/ into the command string a pulumi-command step runs.

The scripts reach a node once, as its script library (`library_archive`, copied by the node's `<node>-scripts`
step, a pulumi-command `remote.CopyToRemote`): every script in a directory named by its content's hash
(`<sha256 prefix>/ray_head.sh`), in LIBRARY_DIR on the node (a user other than root: LIBRARY_HOME_DIR in its
home). A step's command names the files it runs, so what Pulumi stores for a step is its environment and a few
lines, not the scripts' text; a changed script has a new name, so exactly the steps that run it change (and the
library step, which adds the new file beside the old one: a teardown recorded earlier still finds its file).

pulumi-command passes `environment` as SSH env requests, which a stock sshd refuses (AcceptEnv), so the
variables a script needs are exported at the top of the command itself. The command runs through the remote
login shell (sh or bash), so it only uses POSIX syntax before handing the scripts to bash:

    export ROLL_CLUSTER_STEP='docker'
    export NODE_NAME='roll-cluster-dev-0'
    exec bash -c 'for roll_script in <dir>/<hash>/lib.sh <dir>/<hash>/install_docker.sh; do [ -r ... ] || ...
    unset roll_script
    . <dir>/<hash>/lib.sh
    . <dir>/<hash>/install_docker.sh' roll-cluster-docker

Values are single-quoted with shlex.quote; secrets may be Outputs and keep their secretness in the result.

The steps send that text on the SSH channel's stdin, not as the command (`stdin_command`): sshd runs the command
as `$SHELL -c <command>`, in argv (`ps`, /proc/<pid>/cmdline, execve audit logs), and pulumi-command prints the
whole command of a failed step (remote/commandOutputs.go). The outer bash reads stdin whole before running
anything (`text=$(cat)`, then `eval "$text"`), so the script still finds stdin at EOF; an empty stdin fails the
step with a message naming it.

What runs before any library exists keeps the scripts' text inline (`render_inline`): the own-hosts probe before
`pulumi up` registers anything, and the first-boot user data (`render_user_data`, comments left out to stay small).
See verified-facts#remote-commandoutputs-2.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

import pulumi

from infra.layout import PROJECT_DIR

SCRIPTS_DIR = Path(__file__).resolve().parent.parent / "scripts"
LIB_SCRIPT = "lib.sh"
# Where a node keeps its script library: root's steps (the program's own instances) under /var/lib, beside the
# steps' other state; a user other than root (your own hosts, through sudo) cannot write there, so its library is
# in its home (SFTP resolves a relative path against the login directory: OpenSSH sftp-server(8), -d), read by root
# through `~user` (the user's home from the password database, expanded by bash).
LIBRARY_DIR = "/var/lib/roll-cluster/scripts"
LIBRARY_HOME_DIR = ".roll-cluster/scripts"
# Where the program stages the library it copies (relative to the project, like the teardowns' `bash infra/...`):
# one directory per library content, holding exactly the hashed files (a FileArchive is a path, and Pulumi's state
# keeps its path and hash, not its content).
STAGING_DIR = ".roll-cluster/library"
STALE_STAGING_S = 24 * 3600
HASH_CHARS = 16  # 64 bits of sha256: a name per content, with no practical chance of two contents sharing one


def script_path(name: str) -> Path:
    path = SCRIPTS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"node script {name} not found under {SCRIPTS_DIR}")
    return path


def _without_shebang(name: str) -> list[str]:
    lines = script_path(name).read_text().splitlines()
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    return lines


# A script names a Python helper of the library (infra/scripts/<name>.py, linted like the program) by the variable
# HELPER_<NAME>, which the step sets to that file's path in the library before sourcing the scripts: the helpers a
# step runs are the ones its scripts name, so a changed helper changes exactly those steps.
HELPER_VARIABLE = re.compile(r"\$\{?HELPER_([A-Z0-9_]+)")


def helpers(names: Sequence[str]) -> list[str]:
    """The Python helpers (file names) that lib.sh and the named scripts use, in order of first use."""
    found: list[str] = []
    for name in [LIB_SCRIPT, *names]:
        for variable in HELPER_VARIABLE.findall(script_path(name).read_text()):
            helper = variable.lower() + ".py"
            if helper not in found:
                script_path(helper)  # a helper that does not exist fails here, naming it
                found.append(helper)
    return found


def _helper_variable(helper: str) -> str:
    return "HELPER_" + helper.removesuffix(".py").upper()


def _no_helpers(names: Sequence[str], where: str) -> None:
    """What runs without the library (the user data, the own-hosts probe) has no helper to run."""
    used = helpers(names)
    if used:
        raise ValueError(f"{where} carries no script library, but {', '.join(names)} use(s) {', '.join(used)}")


def script_text(names: Sequence[str]) -> str:
    """lib.sh followed by the named scripts, each without its shebang line."""
    return "".join(f"# ---- {name} ----\n" + "\n".join(_without_shebang(name)) + "\n" for name in [LIB_SCRIPT, *names])


HEREDOC = re.compile(r"<<-?\s*['\"]?([A-Za-z_][A-Za-z0-9_]*)['\"]?")


def _heredoc_end(line: str) -> str | None:
    """The terminator of a here-document that `line` opens (`<<WORD`, `<<'WORD'`, `<<-WORD`), else None."""
    match = HEREDOC.search(line.replace("<<<", ""))
    return match.group(1) if match else None


def compact_text(names: Sequence[str]) -> str:
    """script_text without comment-only and blank lines (here-documents kept whole; the `# ---- name ----` headers
    stay): what the user data carries."""
    kept: list[str] = []
    for name in [LIB_SCRIPT, *names]:
        kept.append(f"# ---- {name} ----")
        heredoc: str | None = None
        for line in _without_shebang(name):
            if heredoc is not None:
                kept.append(line)
                if line.strip() == heredoc:
                    heredoc = None
                continue
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            kept.append(line)
            heredoc = _heredoc_end(line)
    return "\n".join(kept) + "\n"


@cache
def library_name(name: str) -> str:
    """The file a script has in the library: its name in a directory named by the hash of its content
    (`<hash>/ray_head.sh`)."""
    digest = hashlib.sha256(script_path(name).read_bytes()).hexdigest()[:HASH_CHARS]
    return f"{digest}/{name}"


def library_scripts() -> list[str]:
    """Every script a remote step can run and the Python helpers they use: the top level of infra/scripts (local/
    runs on the operator's machine)."""
    return sorted(p.name for p in [*SCRIPTS_DIR.glob("*.sh"), *SCRIPTS_DIR.glob("*.py")])


def library_dir(user: str) -> str:
    """The library's directory on the node as the step's bash names it."""
    return LIBRARY_DIR if user == "root" else f"~{user}/{LIBRARY_HOME_DIR}"


def library_remote_path(user: str) -> str:
    """The library's directory as the SFTP copy names it (relative: in the login user's home)."""
    return LIBRARY_DIR if user == "root" else LIBRARY_HOME_DIR


@cache
def staged_library() -> str:
    """The directory (relative to the project) holding exactly the library's hashed files, made if missing; its
    name is the hash of the whole library, so a changed script is a new directory and path."""
    names = library_scripts()
    whole = hashlib.sha256("".join(library_name(n) for n in names).encode()).hexdigest()[:HASH_CHARS]
    relative = f"{STAGING_DIR}/{whole}"
    target = PROJECT_DIR / relative
    if not all((target / library_name(n)).is_file() for n in names):
        (PROJECT_DIR / STAGING_DIR).mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=".building-", dir=PROJECT_DIR / STAGING_DIR))
        for name in names:
            (building / library_name(name)).parent.mkdir(exist_ok=True)
            shutil.copyfile(script_path(name), building / library_name(name))
            os.chmod(building / library_name(name), 0o644)
        shutil.rmtree(target, ignore_errors=True)
        try:
            building.rename(target)
        except OSError:  # another run staged it at the same moment: the same files
            shutil.rmtree(building, ignore_errors=True)
        # Libraries of earlier versions of the scripts, staged over a day ago: nothing reads them any more (the
        # state keeps the archive's hash, and `pulumi destroy` copies nothing).
        for old in (PROJECT_DIR / STAGING_DIR).iterdir():
            if old != target and time.time() - old.stat().st_mtime > STALE_STAGING_S:
                shutil.rmtree(old, ignore_errors=True)
    # The trailing slash: pulumi-command copies the directory's files into remotePath (remote/copyController.go
    # sftpCopy: "dir/ | dest/x for x in dir").
    return relative + "/"


def local_library() -> str:
    """The staged library's absolute path: the library directory of a step run on this machine (the tests)."""
    return str(PROJECT_DIR / staged_library().rstrip("/"))


def library_archive() -> pulumi.FileArchive:
    return pulumi.FileArchive(staged_library())


def _body(scripts: Sequence[str], library: str) -> str:
    """The inner bash's text: name the Python helpers the scripts use (HELPER_<NAME>), check that every file is
    there (naming the one missing), then source each script in turn. The check names a helper by its variable,
    so its path is written once: every step of every node stores this text."""
    used = helpers(scripts)
    named = "".join(f"{_helper_variable(h)}={library}/{library_name(h)}\n" for h in used)
    files = " ".join([*(f"{library}/{library_name(n)}" for n in [LIB_SCRIPT, *scripts]),
                      *(f'"${_helper_variable(h)}"' for h in used)])
    check = (f'for roll_script in {files}; do [ -r "$roll_script" ] || {{ echo "$0: $roll_script is missing: '
             'the node script library step (${NODE_NAME:-node}-scripts) installs it" >&2; exit 1; }; done')
    sources = "\n".join(f". {library}/{library_name(n)}" for n in [LIB_SCRIPT, *scripts])
    return f"{named}{check}\nunset roll_script\n{sources}\n"


def _exports(step: str, env: Mapping[str, str]) -> list[str]:
    exports = [f"export ROLL_CLUSTER_STEP={shlex.quote(step)}"]
    return exports + [f"export {key}={shlex.quote(str(value))}" for key, value in sorted(env.items())]


def _command(step: str, body: str, env: Mapping[str, str], sudo: bool) -> str:
    runner = "bash"
    if sudo:
        runner = "sudo -n --preserve-env=" + ",".join(["ROLL_CLUSTER_STEP", *sorted(env)]) + " bash"
    name = shlex.quote("roll-cluster-" + step)
    return "\n".join(_exports(step, env)) + f"\nexec {runner} -c {shlex.quote(body)} {name}\n"


def render_plain(step: str, scripts: Sequence[str], env: Mapping[str, str], sudo: bool = False,
                 library: str = LIBRARY_DIR) -> str:
    """The command for known, plain values (what tests and the e2e tier run), running the library's files in
    `library` (library_dir of the SSH user; a test's staged copy).

    sudo: the SSH user is not root (your own hosts): the script runs under `sudo -n`, which keeps exactly the
    exported variables (`--preserve-env=NAMES`; passwordless sudo for ALL commands implies that permission), so
    values stay off every command line as before."""
    return _command(step, _body(scripts, library), env, sudo)


def render_inline(step: str, scripts: Sequence[str], env: Mapping[str, str], sudo: bool = False) -> str:
    """As render_plain, with the scripts' whole text in the command: for what runs where no library is (the own
    hosts' probe before `pulumi up`)."""
    _no_helpers(scripts, f"the {step} step")
    return _command(step, script_text(scripts), env, sudo)


# How a step's SSH session is watched: pulumi-command ignores cancellation while a command runs (pulumi-command v1.2.1
# remote/commandOutputs.go, `session.Run(cmd)` without the context), so an interrupted `pulumi up` (a second
# Ctrl-C) kills the provider and drops the connection, and sshd, which gives these sessions no pty, does not signal
# the command: a 30-minute pull or the job's start gate would run on. The step runs in a process group of its own;
# a watcher looks every SESSION_POLL_S seconds whether the SSH session (the runner's parent: sshd's session process,
# or the one above sudo) still exists, and when it is gone stops the group: TERM, then KILL after STOP_GRACE_S. So a
# step ends within SESSION_POLL_S + STOP_GRACE_S of an interrupt; every step is idempotent, and the next `up`
# resumes it (a pull keeps its layers, the job step finds the job submitted and gates it again).
# see verified-facts#remote-commandoutputs
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


def sourced_scripts(command_text: str) -> list[str]:
    """The library files a rendered step runs, in order (`<hash>/lib.sh`, ...)."""
    return ["/".join(line.rsplit("/", 2)[1:]) for line in command_text.splitlines() if line.startswith(". ")]


def render(
    step: str, scripts: Sequence[str], env: pulumi.Input[Mapping[str, pulumi.Input[str]]], sudo: bool = False,
    library: str = LIBRARY_DIR, more_env: pulumi.Output[dict[str, str]] | None = None, *, secret: bool,
) -> pulumi.Input[str]:
    """The command for a step whose environment may hold Outputs (IPs, secrets), or be one Output as a whole;
    `more_env`, a whole environment known only later, is merged over it. An environment of plain strings renders at
    once, with no Output to resolve (most steps: the program's time per node is mostly Pulumi's work per Output).
    `secret`: the command is a Pulumi secret as a whole (a config section held as a secret: RunContext)."""
    if more_env is None and isinstance(env, Mapping) and all(isinstance(value, str) for value in env.values()):
        text = render_plain(step, scripts, env, sudo, library)  # type: ignore[arg-type]
        return pulumi.Output.secret(text) if secret else text
    resolved: pulumi.Output[Mapping[str, str]] = pulumi.Output.from_input(env)  # type: ignore[arg-type]
    if more_env is None:
        command = resolved.apply(lambda values: render_plain(step, scripts, values, sudo, library))
    else:
        command = pulumi.Output.all(resolved, more_env).apply(
            lambda parts: render_plain(step, scripts, {**parts[0], **parts[1]}, sudo, library))
    return pulumi.Output.secret(command) if secret else command


def render_user_data(script: str, env: Mapping[str, str]) -> str:
    """cloud-init user data running one node script as root at first boot: `#!/bin/bash`, exports, lib.sh, script,
    without their comments (the instance's input, in Pulumi's state: the scripts themselves are the reference).

    The step name is the script's stem with dashes (first_boot.sh -> first-boot). Values are plain strings;
    resolve Outputs first (e.g. with Output.all(...).apply).
    """
    step = Path(script).stem.replace("_", "-")
    _no_helpers([script], "the user data")
    return "#!/bin/bash\n" + "\n".join(_exports(step, env)) + "\n" + compact_text([script])
