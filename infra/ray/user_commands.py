"""The commands users run against the cluster, as stack outputs: a shell on a node, the dashboard and its
tunnel, the job's status, log, stop and resubmission. Each is a command line for the user's own shell: every value in
it is checked (IPs, names, ports) and quoted, and nothing secret is in it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from infra.ray.step_env import REMOTE_USER, _check_container_name, _check_job_id, _check_port, _ip


def _check_stack(stack: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+){0,2}", stack):
        raise ValueError(f"stack name {stack!r} is not a Pulumi stack name")


_DNS_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


def _host(host: str) -> str:
    """An SSH address: an IP address, or a DNS name (your own hosts may be reached by name)."""
    try:
        return _ip(host)
    except ValueError:
        if not _DNS_NAME.match(host):
            raise ValueError(f"{host!r} is neither an IP address nor a DNS name") from None
        return host


def _login(host: str, user: str, port: int) -> str:
    """`[-p PORT ]-- user@host` for ssh (the port only when it is not 22)."""
    if not re.fullmatch(r"[a-z_][a-z0-9_.-]{0,31}", user):
        raise ValueError(f"{user!r} is not a user name")
    _check_port("SSH port", port)
    # `--`: the destination is never read as an option (`-oProxyCommand=...` as a user would run a command).
    return ("" if port == 22 else f"-p {port} ") + f"-- {user}@{_host(host)}"


def _key_argument(key_path: str) -> str:
    """The key path quoted for a POSIX shell, leaving a leading ~/ unquoted so that the shell expands it."""
    if key_path.startswith("~/"):
        return "~/" + shlex.quote(key_path[2:])
    return shlex.quote(key_path)


def ray_address(head_private_ip: str, gcs_port: int) -> str:
    """`rayAddress`: the GCS address that `ray start --address` and drivers inside the cluster use."""
    _check_port("GCS port", gcs_port)
    return f"{_ip(head_private_ip)}:{gcs_port}"


SSH_CONNECT_TIMEOUT_S = 10


def _ssh(key_path: str, known_hosts: str | None, pinned: bool = True) -> str:
    """`ssh` with the login key only (IdentitiesOnly: other agent keys are not offered) and, given the stack's
    known-hosts file (infra/node/known_hosts.py), the node's host key verified: strictly where the program knows
    it (`pinned`: a key it generated), else recorded on first use in that file, never in ~/.ssh/known_hosts (your
    own hosts, whose keys the program cannot know). No BatchMode: these are commands a person runs, where a
    passphrase prompt is fine. ConnectTimeout: an unreachable node (stopped, or your address no longer among
    access.adminCidrs) fails within seconds instead of after the system's TCP timeout of minutes."""
    words = f"ssh -i {_key_argument(key_path)} -o IdentitiesOnly=yes -o ConnectTimeout={SSH_CONNECT_TIMEOUT_S}"
    if known_hosts is not None:
        checking = "yes" if pinned else "accept-new"
        words += f" -o UserKnownHostsFile={_key_argument(known_hosts)} -o StrictHostKeyChecking={checking}"
    return words


def ssh_command(
    public_ip: str, key_path: str, known_hosts: str | None = None, user: str = REMOTE_USER, port: int = 22,
    pinned: bool = True,
) -> str:
    """`sshHead`: a shell on the node."""
    return f"{_ssh(key_path, known_hosts, pinned)} {_login(public_ip, user, port)}"


def dashboard_url(head_public_ip: str, dashboard_port: int) -> str:
    """`dashboardUrl`, when the dashboard is open to the admin CIDRs."""
    _check_port("dashboard port", dashboard_port)
    return f"http://{_host(head_public_ip)}:{dashboard_port}"


def dashboard_tunnel_command(
    head_public_ip: str, key_path: str, dashboard_port: int, known_hosts: str | None = None,
    user: str = REMOTE_USER, port: int = 22, pinned: bool = True,
) -> str:
    """`dashboardTunnel`: forwards localhost:<port> to the head's dashboard (then http://localhost:<port>)."""
    _check_port("dashboard port", dashboard_port)
    return (
        f"{_ssh(key_path, known_hosts, pinned)} -N -L {dashboard_port}:127.0.0.1:{dashboard_port} "
        f"{_login(head_public_ip, user, port)}"
    )


def _in_head_container(
    head_public_ip: str, key_path: str, container_name: str, words: Sequence[str], known_hosts: str | None,
    user: str, port: int, pinned: bool = True,
) -> str:
    _check_container_name(container_name)
    remote = " ".join(shlex.quote(word) for word in ["docker", "exec", container_name, *words])
    return f"{ssh_command(head_public_ip, key_path, known_hosts, user, port, pinned)} {shlex.quote(remote)}"


# The job status as `ray job status` prints it. A job the head's Ray does not know is said so in plain words instead
# of the Jobs API's 404 traceback: LOST (exit 3, with the command that submits it again) when the job step submitted
# it from this container (its mark in SUBMITTED_JOBS_DIR, which a restart of the container keeps): Ray restarted
# after the submission (Ray keeps no job across a restart, so a reboot of the head ends the job); else not
# submitted (exit 1): the job step stopped before submitting it, or training.autoStart is false.
# Right after a restart of the head the GCS answers before the dashboard process that serves the Jobs API does: a
# Jobs API that does not answer yet is waited for, at most JOBS_API_WAIT_S, saying so once; past the bound the last
# line of Ray's error is printed (exit 1), never its traceback.
# $1 job id, $2 Jobs API address, $3 the resubmit command, $4 SUBMITTED_JOBS_DIR, $5 the wait bound in seconds.
SUBMITTED_JOBS_DIR = "/var/lib/roll-cluster/jobs"
JOBS_API_WAIT_S = 120
# $6 the framework's first-step ERE, $7 its download ERE ("": no phase line): after the status, the job's phase
# from its log (`phase: pending | downloading | starting | training step N | finished | failed`).
_JOB_PHASE_SH = (
    "show_phase() {\n"
    '  [ -n "$6" ] || return 0\n'
    '  log=$(ray job logs "$1" --address "$2" 2>/dev/null) || log=""\n'
    '  step=$(printf "%s\\n" "$log" | grep -oE -- "$6" | tail -n 1 | grep -oE "[0-9]+" | head -n 1)\n'
    '  case $out in\n'
    # As `ray job status` words it (ray/dashboard/modules/job/cli.py _log_job_status, Ray 2.48).
    '    *"\' failed"* | *"\' was stopped"*) printf "phase: failed%s\\n" "${step:+ after training step $step}" ;;\n'
    '    *"\' succeeded"*) printf "phase: finished\\n" ;;\n'
    '    *": PENDING"*) printf "phase: pending\\n" ;;\n'
    '    *) if [ -n "$step" ]; then printf "phase: training step %s\\n" "$step"\n'
    '       elif [ -n "$7" ] && printf "%s\\n" "$log" | tail -n 20 | grep -qE -- "$7"; then'
    ' printf "phase: downloading\\n"\n'
    '       else printf "phase: starting\\n"; fi ;;\n'
    "  esac\n"
    '  resumed=$(printf "%s\\n" "$log" | grep -m 1 -oE -- "roll-cluster: [A-Za-z]+ resumes from [^ ]+")\n'
    '  [ -z "$resumed" ] || printf "%s\\n" "${resumed#roll-cluster: }"\n'
    "}\n"
)
_JOB_STATUS_SH = _JOB_PHASE_SH + (
    # $8: the shared directory where spot nodes record Alibaba's reclaim notice (infra/scripts/spot_notice.sh).
    'if [ -n "${8:-}" ] && [ -n "$(ls -A "$8" 2>/dev/null)" ]; then\n'
    '  for f in "$8"/*; do printf "job %s: RECLAIMED: Alibaba reclaims spot node %s at %s\\n" "$1" "${f##*/}"'
    ' "$(cat "$f")"; done\n'
    '  printf "%s\\n" "The job ends with that node. Run pulumi up --refresh to replace it (a new head resubmits the'
    ' job; otherwise: $3); the job resumes from its newest checkpoint as training.resume says."\n'
    "  exit 4\n"
    "fi\n"
    'deadline=$((SECONDS + $5)); said=""\n'
    "while :; do\n"
    '  if out=$(ray job status "$1" --address "$2" 2>&1); then printf "%s\\n" "$out"; show_phase "$@"; exit 0; fi\n'
    '  case $out in *"does not exist"* | *"status code 404"*) break ;; esac\n'
    # Only a Jobs API that does not answer (yet) is waited for; any other error is said at once, its last line.
    '  case $out in *"Failed to connect"* | *"Connection refused"* | *"status code 5"[0-9][0-9]*) ;;\n'
    '    *) printf "%s\\n" "ray job status failed: ${out##*$\'\\n\'}" >&2; exit 1 ;;\n'
    "  esac\n"
    '  if [ "$SECONDS" -ge "$deadline" ]; then\n'
    '    printf "%s\\n" "the Ray head\'s Jobs API ($2) did not answer within $5 s: ${out##*$\'\\n\'}" >&2\n'
    "    exit 1\n"
    "  fi\n"
    '  if [ -z "$said" ]; then\n'
    '    printf "%s\\n" "the Ray head\'s Jobs API does not answer yet (Ray is starting, after a restart of the head?):'
    ' waiting for it, at most $5 s" >&2\n'
    "    said=1\n"
    "  fi\n"
    "  sleep 2\n"
    "done\n"
    'if [ ! -e "$4/$1" ]; then\n'
    '  printf "%s\\n" "job $1 does not exist on the Ray head: it was never submitted (the job step of pulumi up'
    ' stopped before submitting it, or training.autoStart is false: the jobSubmit output submits it)" >&2\n'
    "  exit 1\n"
    "fi\n"
    'printf "%s\\n" "job $1: LOST. The Ray head does not know it: Ray on the head restarted after the job was'
    " submitted (a reboot of the head, or of its container), Ray keeps no job across a restart, and a job still"
    " running then ended with it (one that had finished before is simply forgotten). Its checkpoints are kept."
    ' To submit it again (it resumes from them as training.resume says): $3"\n'
    "exit 3"
)


def job_resubmit_command(stack: str, job_urn: str) -> str:
    """`jobResubmit`: submits the unchanged job again through the program's own job step (its files, preparation and
    checks included), for when the head's Ray lost it (a reboot of the head). `job_urn`: the training-job step's."""
    _check_stack(stack)
    if not job_urn.startswith("urn:pulumi:") or "'" in job_urn:
        raise ValueError(f"{job_urn!r} is not a Pulumi URN")
    return f"pulumi up --stack {stack} --replace '{job_urn}'"


def job_status_command(
    head_public_ip: str, key_path: str, container_name: str, job_id: str, dashboard_port: int,
    known_hosts: str | None = None, user: str = REMOTE_USER, port: int = 22,
    pinned: bool = True, resubmit: str = "", api_wait_s: int = JOBS_API_WAIT_S,
    first_step_pattern: str = "", download_pattern: str = "", reclaim_dir: str = "",
) -> str:
    """`jobStatus`: prints the job's status from the head, or, when the head's Ray no longer knows the job (it
    restarted: a reboot of the head), that the job was lost and `resubmit` (job_resubmit_command), exit 3. Waits
    at most `api_wait_s` for a Jobs API that does not answer yet. With `reclaim_dir` (spot nodes and shared
    storage): RECLAIMED with the node when a spot node recorded Alibaba's reclaim notice there, exit 4."""
    _check_port("dashboard port", dashboard_port)
    _check_job_id(job_id)
    resubmit = resubmit or "pulumi up --replace <the training-job URN> (the jobResubmit output)"
    words = ["bash", "-c", _JOB_STATUS_SH, "job-status", job_id, f"http://127.0.0.1:{dashboard_port}", resubmit,
             SUBMITTED_JOBS_DIR, str(api_wait_s), first_step_pattern, download_pattern, reclaim_dir]
    return _in_head_container(head_public_ip, key_path, container_name, words, known_hosts, user, port, pinned)


def job_logs_command(
    head_public_ip: str, key_path: str, container_name: str, job_id: str, dashboard_port: int,
    known_hosts: str | None = None, user: str = REMOTE_USER, port: int = 22,
    pinned: bool = True,
) -> str:
    """`jobLogs`: follows the job's log until the job ends."""
    _check_port("dashboard port", dashboard_port)
    _check_job_id(job_id)
    words = ["ray", "job", "logs", "--follow", job_id, "--address", f"http://127.0.0.1:{dashboard_port}"]
    return _in_head_container(head_public_ip, key_path, container_name, words, known_hosts, user, port, pinned)


def job_stop_command(
    head_public_ip: str, key_path: str, container_name: str, job_id: str, dashboard_port: int,
    known_hosts: str | None = None, user: str = REMOTE_USER, port: int = 22,
    pinned: bool = True,
) -> str:
    """`jobStop`: asks Ray to stop the job (its checkpoints stay; a later `pulumi up` does not resubmit an
    unchanged job, a changed configuration does)."""
    _check_port("dashboard port", dashboard_port)
    _check_job_id(job_id)
    words = ["ray", "job", "stop", job_id, "--address", f"http://127.0.0.1:{dashboard_port}"]
    return _in_head_container(head_public_ip, key_path, container_name, words, known_hosts, user, port, pinned)


def job_submit_command(stack: str) -> str:
    """`jobSubmit` (training.autoStart: false): turns auto start on and lets `pulumi up` submit the prepared job
    through the program's own job step (its files, preparation and checks included)."""
    _check_stack(stack)
    return (
        f"pulumi config set --stack {stack} --path 'roll-cluster:training.autoStart' true && "
        f"pulumi up --stack {stack}"
    )
