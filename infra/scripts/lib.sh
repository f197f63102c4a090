#!/usr/bin/env bash
# Shared helpers for every node step. Sourced (prepended) before each step script by infra/node/remote.py.
# Contract for step scripts:
#   - ROLL_CLUSTER_STEP names the step (set by the renderer); every line printed carries it with a UTC timestamp,
#     so `pulumi up` shows where each node is.
#   - Failures are loud: the step name, the failing command and the tail of the step's log.
#   - Waits poll a condition with a bound; nothing sleeps a fixed time hoping something is ready.
# -E (errtrace) makes the ERR trap below fire inside functions too: without it a failing command inside a step
# function ends the script silently (set -e exits before the caller's trap runs) and the user sees no step name.
set -Eeuo pipefail

: "${ROLL_CLUSTER_STEP:=step}"
: "${NODE_NAME:=$(hostname)}"
ROLL_CLUSTER_LOG_DIR=${ROLL_CLUSTER_LOG_DIR:-/var/log/roll-cluster}
# Not root (a local step, the tests): the default log directory cannot be made; a private temporary one serves.
mkdir -p "$ROLL_CLUSTER_LOG_DIR" 2>/dev/null || ROLL_CLUSTER_LOG_DIR=$(mktemp -d)
ROLL_CLUSTER_STEP_LOG="$ROLL_CLUSTER_LOG_DIR/${ROLL_CLUSTER_STEP}.log"

banner() {
  printf '[%s] [%s] %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$NODE_NAME" "$ROLL_CLUSTER_STEP" "$*"
}

# fail MESSAGE [LOGFILE]: stop the step, naming it, with the tail of LOGFILE (default: the step log).
fail() {
  local message=$1 logfile=${2:-$ROLL_CLUSTER_STEP_LOG}
  {
    printf '[%s] [%s] %s: FAILED: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$NODE_NAME" "$ROLL_CLUSTER_STEP" "$message"
    if [[ -s "$logfile" ]]; then
      printf -- '--- last 40 lines of %s ---\n' "$logfile"
      tail -n 40 "$logfile"
      printf -- '--- end of %s ---\n' "$logfile"
    fi
  } >&2
  exit 1
}

on_unexpected_error() {
  local status=$1 line=$2 command=$3
  # errtrace also runs this trap inside command substitutions and subshells. Report only in the step's own shell:
  # a subshell behaves as without the trap, and its failure reaches the step as the failing command.
  if [[ "${BASHPID:-$$}" != "$$" ]]; then
    return "$status"
  fi
  trap - ERR
  fail "command '$command' exited $status (line $line)"
}
trap 'on_unexpected_error $? $LINENO "$BASH_COMMAND"' ERR

# home_path PATH: PATH with a leading `~/` made the home directory. A stack setting such as sshPrivateKeyPath may say
# ~/.ssh/...; nothing expands the tilde in an environment variable's value.
home_path() {
  # shellcheck disable=SC2088  # a literal "~/" is exactly what is looked for
  local tilde='~/'
  if [[ "$1" == "$tilde"* ]]; then printf '%s\n' "$HOME/${1#"$tilde"}"; else printf '%s\n' "$1"; fi
}

# require_env VAR...: every named variable must be set and non-empty.
require_env() {
  local name
  for name in "$@"; do
    [[ -n "${!name:-}" ]] || fail "environment variable $name is required"
  done
}

# logged CMD...: run CMD with its output appended to the step log; on failure fail with the log tail.
logged() {
  local status=0
  printf '+ %s\n' "$*" >>"$ROLL_CLUSTER_STEP_LOG"
  "$@" >>"$ROLL_CLUSTER_STEP_LOG" 2>&1 || status=$?
  if ((status != 0)); then
    fail "'$*' exited $status"
  fi
}

# retry ATTEMPTS FIRST_DELAY CMD...: rerun CMD on failure, doubling the delay (capped at 60 s).
# For transient network errors only; the last failure is returned to the caller.
retry() {
  local attempts=$1 delay=$2 attempt=1 status=0
  shift 2
  while true; do
    status=0
    "$@" || status=$?
    if ((status == 0)); then
      return 0
    fi
    if ((attempt >= attempts)); then
      banner "'$*' failed $attempt times (last exit $status), giving up"
      return "$status"
    fi
    banner "'$*' failed (exit $status), retry $attempt/$((attempts - 1)) in ${delay}s"
    sleep "$delay"
    attempt=$((attempt + 1))
    delay=$((delay * 2 > 60 ? 60 : delay * 2))
  done
}

# PROBE_TIMEOUT_S [30]: the bound on one probe of poll_until / wait_for (a `docker info`, `ray status`, Jobs API
# call or ssh that hangs is cut there), so a wait never exceeds its own bound by more than one probe timeout.
: "${PROBE_TIMEOUT_S:=30}"

# bounded LIMIT_S CMD...: run CMD (a command or a shell function; its stdin, stdout and stderr are the caller's); cut
# it, with everything it started, after LIMIT_S seconds (SIGTERM, then SIGKILL 5 s later) and return 124 then, else
# CMD's status. `timeout` cannot run shell functions (and macOS has none), so CMD runs as a background job and a
# watchdog job kills its whole process tree: a hung `docker exec` or `ssh` inside a probe function goes with it.
bounded() {
  local limit=$1 status=0 pid watchdog marker
  shift
  marker=$(mktemp "${TMPDIR:-/tmp}/roll-cluster-bounded.XXXXXX")
  # <&0: a background job's stdin would otherwise be /dev/null (the caller may feed CMD, e.g. a script to ssh).
  "$@" <&0 &
  pid=$!
  {
    sleep "$limit"
    printf 'cut\n' >"$marker"
    kill_tree TERM "$pid"
    sleep 5  # the grace period between TERM and KILL of a probe already cut at its bound
    kill_tree KILL "$pid"
  } </dev/null >/dev/null 2>&1 &
  watchdog=$!
  wait "$pid" || status=$?
  kill_tree TERM "$watchdog"
  # Expected to fail: the watchdog was just killed, and wait returns its signal status.
  wait "$watchdog" 2>/dev/null || :
  if [[ -s "$marker" ]]; then
    status=124
  fi
  rm -f "$marker"
  return "$status"
}

# kill_tree SIGNAL PID: signal PID and all its descendants. The tree is listed first and signalled from the top:
# a parent whose child died first would go on to its next command (the watchdog: to report a cut).
kill_tree() {
  local signal=$1 pid
  for pid in $(process_tree "$2"); do
    # Expected to fail for a process that exited since it was listed: nothing left to signal.
    kill "-$signal" "$pid" 2>/dev/null || :
  done
}

# process_tree PID: PID and its descendants, parents before their children.
process_tree() {
  local child
  printf '%s\n' "$1"
  # pgrep exits 1 when PID has no children (or is gone): then there is nothing below it.
  for child in $(pgrep -P "$1" 2>/dev/null || :); do
    process_tree "$child"
  done
}

# poll_until TIMEOUT_S INTERVAL_S CMD...: poll CMD until it succeeds; return 1 after TIMEOUT_S, for callers whose
# failure message and log tail are their own. POLL_WHAT (optional) names what is awaited in the progress banners.
# Each probe is bounded by PROBE_TIMEOUT_S (a probe that hangs counts as a failed one, and is named in a banner).
poll_until() {
  local timeout=$1 interval=$2 what=${POLL_WHAT:-} status limit
  shift 2
  local deadline=$((SECONDS + timeout)) next_report=$((SECONDS + 30))
  while true; do
    # No probe runs past the deadline by more than a second (nor longer than PROBE_TIMEOUT_S).
    limit=$((deadline - SECONDS < PROBE_TIMEOUT_S ? deadline - SECONDS : PROBE_TIMEOUT_S))
    limit=$((limit < 1 ? 1 : limit))
    status=0
    bounded "$limit" "$@" >/dev/null 2>&1 || status=$?
    ((status != 0)) || break
    if ((status == 124)); then
      banner "probe '$*' did not answer within ${limit}s: cut off"
    fi
    if ((SECONDS >= deadline)); then
      return 1
    fi
    if ((SECONDS >= next_report)); then
      banner "still waiting${what:+ for $what} ($((deadline - SECONDS))s left)"
      next_report=$((SECONDS + 30))
    fi
    sleep "$((interval < deadline - SECONDS ? interval : deadline - SECONDS))"
  done
}

# wait_for DESCRIPTION TIMEOUT_S INTERVAL_S CMD...: poll CMD until it succeeds; fail the step after TIMEOUT_S.
wait_for() {
  local description=$1 timeout=$2 interval=$3
  shift 3
  POLL_WHAT=$description poll_until "$timeout" "$interval" "$@" ||
    fail "timed out after ${timeout}s waiting for $description"
}

# run_step FUNCTION DESCRIPTION: banners around one named function, with its duration.
run_step() {
  local function_name=$1 description=$2 started=$SECONDS
  banner "start: $description"
  "$function_name"
  banner "done: $description ($((SECONDS - started))s)"
}

# ---- helpers shared by the node bootstrap steps ----
# Optional tunables (defaults in brackets):
#   RETRY_ATTEMPTS [4], RETRY_DELAY_S [10]: attempts and first back-off for network-bound commands
#     (downloads, package installs, image pulls); the delay doubles per attempt, capped at 60 s by retry.
#   OS_RELEASE_FILE [/etc/os-release]: read by detect_os.
#   PACKAGE_LOCK_TIMEOUT_S [1800]: how long to wait for a package manager run by someone else (cloud-init, the GPU
#     driver installer, unattended-upgrades) before failing.
#   YUM_PID_FILE [/var/run/yum.pid], PACKAGE_MANAGER_PROCESSES ["dnf yum"]: what counts as a busy dnf/yum.
#   APT_LOCK_FILES [/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock
#     /var/cache/apt/archives/lock]: what counts as a busy apt/dpkg.
: "${RETRY_ATTEMPTS:=4}"
: "${RETRY_DELAY_S:=10}"

# log_cmd CMD...: run CMD with its output appended to the step log and return its status. The variant of `logged`
# for use under retry (logged fails the step at the first error).
log_cmd() {
  printf '+ %s\n' "$*" >>"$ROLL_CLUSTER_STEP_LOG"
  "$@" >>"$ROLL_CLUSTER_STEP_LOG" 2>&1
}

# require_int VAR...: every named variable must be a non-negative integer (timeouts, counts).
require_int() {
  local name
  for name in "$@"; do
    [[ "${!name:-}" =~ ^[0-9]+$ ]] || fail "environment variable $name must be a non-negative integer, got '${!name:-}'"
  done
}

# write_file_if_changed PATH CONTENT [MODE]: make PATH hold CONTENT (plus a final newline). Writes only when the
# content differs, through a temp file renamed over PATH so a crash never leaves half a file (fstab!).
# Sets FILE_CHANGED=1 when it wrote, 0 when the file already had that content.
# shellcheck disable=SC2034  # FILE_CHANGED is read by the step scripts
FILE_CHANGED=0
# shellcheck disable=SC2034  # FILE_CHANGED is read by the step scripts
write_file_if_changed() {
  local path=$1 content=$2 mode=${3:-0644} tmp
  if [[ -f "$path" ]] && printf '%s\n' "$content" | cmp -s - "$path"; then
    FILE_CHANGED=0
    return 0
  fi
  mkdir -p "$(dirname "$path")"
  tmp=$(mktemp "$path.XXXXXX")
  printf '%s\n' "$content" >"$tmp"
  chmod "$mode" "$tmp"
  mv -f "$tmp" "$path"
  FILE_CHANGED=1
}

# detect_os: read OS_RELEASE_FILE; set OS_ID, OS_VERSION_ID, OS_CODENAME, PKG_FAMILY (rpm|apt) and, for rpm,
# RPM_TOOL (dnf, else yum). Supported: Alibaba Cloud Linux 3 (ID=alinux) and Ubuntu 22.04 (ID=ubuntu).
detect_os() {
  local file=${OS_RELEASE_FILE:-/etc/os-release} key value
  [[ -r "$file" ]] || fail "cannot read $file to detect the operating system"
  OS_ID='' OS_VERSION_ID='' OS_CODENAME=''
  while IFS='=' read -r key value || [[ -n "$key" ]]; do
    value=${value#\"} value=${value%\"}
    value=${value#\'} value=${value%\'}
    case $key in
      ID) OS_ID=$value ;;
      VERSION_ID) OS_VERSION_ID=$value ;;
      VERSION_CODENAME) OS_CODENAME=$value ;;
      UBUNTU_CODENAME) [[ -n "$OS_CODENAME" ]] || OS_CODENAME=$value ;;
    esac
  done <"$file"
  case $OS_ID in
    alinux)
      [[ "${OS_VERSION_ID%%.*}" == 3 ]] \
        || fail "Alibaba Cloud Linux $OS_VERSION_ID is not supported (version 3 is; $file)"
      PKG_FAMILY=rpm
      if command -v dnf >/dev/null 2>&1; then RPM_TOOL=dnf; else RPM_TOOL=yum; fi
      ;;
    ubuntu)
      [[ -n "$OS_CODENAME" ]] || fail "no VERSION_CODENAME in $file"
      PKG_FAMILY=apt
      ;;
    *)
      fail "unsupported operating system ID='$OS_ID' in $file (supported: alinux = Alibaba Cloud Linux 3, ubuntu = Ubuntu 22.04)"
      ;;
  esac
}

# package_installed PKG: whether the package is installed (detect_os first).
# shellcheck disable=SC2016  # '${Status}' is a dpkg-query format field, not a shell expansion
package_installed() {
  case $PKG_FAMILY in
    rpm) rpm -q "$1" >/dev/null 2>&1 ;;
    apt) [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]] ;;
  esac
}

# package_lock_holder: print who holds the package-manager lock and succeed, or fail when it is free.
package_lock_holder() {
  local lock_file pid pattern
  case $PKG_FAMILY in
    rpm)
      lock_file=${YUM_PID_FILE:-/var/run/yum.pid}
      if [[ -s "$lock_file" ]]; then
        pid=$(head -n 1 "$lock_file")
        if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
          printf '%s (pid %s)\n' "$lock_file" "$pid"
          return 0
        fi
      fi
      pattern=${PACKAGE_MANAGER_PROCESSES-dnf yum}
      pattern=${pattern// /|}
      if [[ -n "$pattern" ]] && pid=$(pgrep -o -x "$pattern"); then
        printf 'a running %s process (pid %s)\n' "$(cat "/proc/$pid/comm" 2>/dev/null)" "$pid"
        return 0
      fi
      ;;
    apt)
      for lock_file in ${APT_LOCK_FILES:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock}; do
        [[ -e "$lock_file" ]] || continue
        if apt_lock_file_busy "$lock_file"; then
          printf '%s\n' "$lock_file"
          return 0
        fi
      done
      ;;
  esac
  return 1
}

# apt and dpkg take fcntl locks, which flock(1) cannot see; fuser sees the process holding the file open. Without
# fuser (psmisc), the kernel's table of file locks: /proc/locks lists each lock with its file's device
# (major:minor, hex) and inode (proc(5), /proc/locks).
apt_lock_file_busy() {
  local device inode id
  if command -v fuser >/dev/null 2>&1; then
    fuser "$1" >/dev/null 2>&1
    return
  fi
  read -r device inode < <(stat -L -c '%d %i' -- "$1") || return 1
  id=$(printf '%02x:%02x:%d' "$(((device >> 8) & 0xfff))" "$(((device & 0xff) | ((device >> 12) & 0xfff00)))" "$inode")
  grep -q -- " $id " /proc/locks
}

package_lock_free() {
  ! package_lock_holder >/dev/null
}

# wait_for_package_lock: when another package manager is running, wait (bounded) until it is done.
wait_for_package_lock() {
  local holder timeout=${PACKAGE_LOCK_TIMEOUT_S:-1800}
  if holder=$(package_lock_holder); then
    banner "package manager busy: $holder; waiting up to ${timeout}s"
    wait_for "the package manager lock held by $holder to be released" "$timeout" 1 package_lock_free
    banner "package manager lock released"
  fi
}

# install_packages PKG...: install the missing packages (naming those already there), waiting for the package
# manager lock before each attempt and retrying transient (network) failures; fails with the log tail.
install_packages() {
  local pkg missing=()
  for pkg in "$@"; do
    package_installed "$pkg" || missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    banner "already installed: $*; skipped"
    return 0
  fi
  banner "installing ${missing[*]}"
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" install_packages_once "${missing[@]}" \
    || fail "installing ${missing[*]} failed after $RETRY_ATTEMPTS attempts"
  for pkg in "${missing[@]}"; do
    package_installed "$pkg" || fail "$pkg is not installed although the package manager reported success"
  done
}

install_packages_once() {
  wait_for_package_lock
  case $PKG_FAMILY in
    rpm) log_cmd "$RPM_TOOL" install -y "$@" ;;
    apt)
      # Cloud images ship without package lists, and new repositories need them: update on every attempt.
      log_cmd apt-get update \
        && log_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y \
          -o DPkg::Lock::Timeout="${PACKAGE_LOCK_TIMEOUT_S:-1800}" "$@"
      ;;
  esac
}

# ---- watchers: a step that goes on running after it returns (autostop.sh, spot_notice.sh) ----
# SYSTEMD_UNIT_DIR [/etc/systemd/system], SYSTEMD_RUN_DIR [/run/systemd/system]: where units go, and what says that
# systemd runs (sd_booted(3) looks for the same directory); test seams, the program never sets them.
: "${SYSTEMD_UNIT_DIR:=/etc/systemd/system}"
: "${SYSTEMD_RUN_DIR:=/run/systemd/system}"

# install_watcher WHAT UNIT DESCRIPTION AFTER RESTART_S STATE_DIR ACTION SETTING...: keep a copy of this step's text
# (lib.sh and the scripts after it: BASH_EXECUTION_STRING of `bash -c`) and the named settings in STATE_DIR, and run
# the copy with ACTION (NAME=value, e.g. SPOT_ACTION=watch) and this step's ROLL_CLUSTER_STEP as a service that comes back
# with the host: the systemd unit UNIT (restarted RESTART_S after it ends; started after the units AFTER), or
# without systemd a detached process (its pid in STATE_DIR/watch.pid, its output in STATE_DIR/watch.log) that
# replaces the one an earlier install started. WHAT names the watcher in the banners.
install_watcher() {
  local what=$1 unit=$2 description=$3 after=$4 restart_s=$5 state_dir=$6 action=$7 name
  shift 7
  [[ "$action" =~ ^[A-Z_]+=[a-z]+$ ]] || fail "install_watcher: ACTION must be NAME=value; got '$action'"
  mkdir -p -- "$state_dir"
  printf '%s\n' "$BASH_EXECUTION_STRING" >"$state_dir/watcher.sh"
  : >"$state_dir/settings.env"
  for name in "$@"; do
    # printf %q: each value is one shell word when the service sources the file; no value becomes code.
    printf 'export %s=%q\n' "$name" "${!name:-}" >>"$state_dir/settings.env"
  done
  if command -v systemctl >/dev/null 2>&1 && [[ -d "$SYSTEMD_RUN_DIR" ]]; then
    cat >"$SYSTEMD_UNIT_DIR/$unit.service" <<UNIT
[Unit]
Description=$description
After=$after

[Service]
ExecStart=/bin/bash -c '. $state_dir/settings.env && $action ROLL_CLUSTER_STEP=$ROLL_CLUSTER_STEP exec bash $state_dir/watcher.sh'
Restart=always
RestartSec=$restart_s

[Install]
WantedBy=multi-user.target
UNIT
    logged systemctl daemon-reload
    logged systemctl enable -- "$unit.service"
    logged systemctl restart -- "$unit.service"
    banner "$what running (systemd unit $unit)"
  else
    stop_detached_watcher "$state_dir"
    # The redirections on the whole background subshell, which execs the watcher (so $! is the watcher): had the
    # subshell kept the step's stdout, the SSH session of the step would never end (seen on the real-host tier).
    # shellcheck source=/dev/null # written just above
    (. "$state_dir/settings.env" && export "${action:?}" "ROLL_CLUSTER_STEP=$ROLL_CLUSTER_STEP" &&
      exec setsid bash -- "$state_dir/watcher.sh") </dev/null >>"$state_dir/watch.log" 2>&1 &
    echo $! >"$state_dir/watch.pid"
    banner "$what running (no systemd: process $(cat -- "$state_dir/watch.pid"))"
  fi
}

# stop_detached_watcher STATE_DIR: stop the process an install without systemd started (install_watcher).
stop_detached_watcher() {
  local pid
  # No pid file: no detached watcher was started (systemd runs it, or none was installed).
  pid=$(cat -- "$1/watch.pid" 2>/dev/null) || return 0
  # Expected to fail when the watcher has already exited (the recorded pid is gone): nothing left to stop.
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -- "$pid" 2>/dev/null || true
}

# ---- the training container (the steps that act inside it: code, bake-prep, model) ----

# run_in_container [-i] FUNCTION ARGS...: run one of the step's container_* functions inside $CONTAINER_NAME (-i:
# with stdin), with the step's EXEC_ENV (`-e NAME` entries) when it set any; `roll-cluster-<step>` is its $0, the
# name its errors carry.
run_in_container() {
  local exec_flags=() function_name
  if [[ "$1" == -i ]]; then
    exec_flags=(-i)
    shift
  fi
  function_name=$1
  shift
  docker exec "${exec_flags[@]}" ${EXEC_ENV[@]+"${EXEC_ENV[@]}"} "$CONTAINER_NAME" \
    bash -c "set -euo pipefail; $(declare -f "$function_name"); $function_name \"\$@\"" "roll-cluster-$ROLL_CLUSTER_STEP" "$@"
}

container_running() {
  [[ "$(docker inspect --format '{{.State.Running}}' "$CONTAINER_NAME" 2>/dev/null)" == true ]]
}

# wait_for_container: until $CONTAINER_NAME runs (bounded by CONTAINER_WAIT_TIMEOUT_S); sets CONTAINER_ID.
wait_for_container() {
  wait_for "container $CONTAINER_NAME to be running" "$CONTAINER_WAIT_TIMEOUT_S" 2 container_running
  CONTAINER_ID=$(docker inspect --format '{{.Id}}' "$CONTAINER_NAME")
  banner "container $CONTAINER_NAME is running (${CONTAINER_ID:0:12})"
}
