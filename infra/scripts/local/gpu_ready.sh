#!/usr/bin/env bash
# gpu-ready: runs on the machine that runs `pulumi up` (a pulumi-command local.Command, after pull-image), as
#   bash infra/scripts/local/gpu_ready.sh        with the environment below.
# Polls the node over ssh with gpu_check.sh until its GPU driver is ready. When the driver auto-install is done and
# its reboot was deferred (first_boot.sh), it reboots the node exactly once and keeps polling. ssh failures
# (exit 255: the node is booting, rebooting, or cloud-init has not installed the key yet) are retried until the
# deadline, so an unexpected reboot is tolerated too.
#
# Environment (defaults in brackets):
#   HOST (required)           node address
#   SSH_USER [root]           other users need passwordless sudo
#   SSH_PORT [22]
#   SSH_KEY_PATH [ssh's default keys]   -i (a private key file, or a .pub file naming a key in ssh-agent), with
#                             IdentitiesOnly=yes so that other agent keys are not offered
#   KNOWN_HOSTS_FILE (required)   the stack's known-hosts file (infra/node/known_hosts.py), which holds the host
#                             key generated for the node; nothing else is read or written
#   HOST_KEY_CHECKING [yes]   StrictHostKeyChecking: yes (the key is known before the node exists), or accept-new
#                             for a machine whose key the program could not know (recorded in KNOWN_HOSTS_FILE)
#   EXPECTED_GPUS (required), GPU_DRIVER [auto-install], FABRIC_MANAGER [false]   passed to gpu_check.sh
#   TIMEOUT_S [2400]          overall deadline
#   INTERVAL_S [10]           pause between probes (fractions allowed)
#   GPUS_MISSING_GRACE_S [120]  how long fewer GPUs than expected are tolerated once the driver is up
#   SSH_PROBE_TIMEOUT_S [60]  bound on one ssh probe (a hung session is cut and counts as an ssh failure)
#   NODE_NAME [HOST]          shown in every line
#   ROLL_CLUSTER_LOG_DIR [${TMPDIR:-/tmp}/roll-cluster-logs]   local log of probes and ssh errors
#   Node-side overrides, forwarded to gpu_check.sh when set (tests point them into a temp dir):
#   AUTO_INSTALL_DIR, ROLL_CLUSTER_STATE_DIR, BOOT_ID_FILE, COUNT_KEY, and NODE_LOG_DIR (the node's ROLL_CLUSTER_LOG_DIR).
# Portable to bash 3.2 (macOS) and OpenSSH >= 7.6.

GPU_READY_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SCRIPTS_DIR=$(dirname "$GPU_READY_DIR")
: "${ROLL_CLUSTER_STEP:=gpu-ready}"
: "${NODE_NAME:=${HOST:-}}"
: "${ROLL_CLUSTER_LOG_DIR:=${TMPDIR:-/tmp}/roll-cluster-logs}"
# shellcheck source=SCRIPTDIR/../lib.sh
source "$SCRIPTS_DIR/lib.sh"

: "${SSH_USER:=root}"
: "${SSH_PORT:=22}"
: "${SSH_KEY_PATH:=}"
: "${KNOWN_HOSTS_FILE:=}"
: "${HOST_KEY_CHECKING:=yes}"
: "${FABRIC_MANAGER:=false}"
: "${GPU_DRIVER:=auto-install}"
: "${TIMEOUT_S:=2400}"
: "${INTERVAL_S:=10}"
: "${GPUS_MISSING_GRACE_S:=120}"
: "${SSH_PROBE_TIMEOUT_S:=60}"
# Several nodes are polled in parallel from the same machine: one log per node.
ROLL_CLUSTER_STEP_LOG="$ROLL_CLUSTER_LOG_DIR/gpu-ready-${NODE_NAME//\//_}.log"

check_settings() {
  require_env HOST EXPECTED_GPUS KNOWN_HOSTS_FILE
  require_int EXPECTED_GPUS SSH_PORT TIMEOUT_S GPUS_MISSING_GRACE_S SSH_PROBE_TIMEOUT_S
  [[ "$INTERVAL_S" =~ ^[0-9]+([.][0-9]+)?$ ]] || fail "INTERVAL_S must be a number of seconds, got '$INTERVAL_S'"
  case $HOST_KEY_CHECKING in
    yes | accept-new) ;;
    *) fail "HOST_KEY_CHECKING must be yes or accept-new, got '$HOST_KEY_CHECKING'" ;;
  esac
  # BatchMode: never a prompt (passphrase, unknown host) in an unattended step. The stack's own known-hosts file
  # only: a user's ~/.ssh/known_hosts may hold another machine's key for a recycled public address.
  SSH_OPTIONS=(-o BatchMode=yes -o StrictHostKeyChecking="$HOST_KEY_CHECKING"
    -o UserKnownHostsFile="$KNOWN_HOSTS_FILE" -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=10
    -o ServerAliveInterval=5 -o ServerAliveCountMax=3 -o LogLevel=ERROR -p "$SSH_PORT")
  if [[ -n "$SSH_KEY_PATH" ]]; then
    SSH_KEY_PATH=$(home_path "$SSH_KEY_PATH")
    [[ -r "$SSH_KEY_PATH" ]] || fail "SSH_KEY_PATH $SSH_KEY_PATH is not readable"
    SSH_OPTIONS+=(-i "$SSH_KEY_PATH" -o IdentitiesOnly=yes)
    # A private key file needs no agent: a stale $SSH_AUTH_SOCK is then not even dialled.
    if [[ "$SSH_KEY_PATH" != *.pub ]]; then SSH_OPTIONS+=(-o IdentityAgent=none); fi
  fi
  SUDO=''
  if [[ "$SSH_USER" != root ]]; then SUDO='sudo -n '; fi
}

strip_shebang() {
  sed '1{/^#!/d;}' "$1"
}

# The probe sent to the node on stdin (`bash -s`): exports, lib.sh and gpu_check.sh, as infra/node/remote.py renders a
# step. stdin rather than an argument keeps the quoting independent of the node's login shell.
render_check() {
  local name
  CHECK_SCRIPT=$(mktemp "${TMPDIR:-/tmp}/roll-cluster-gpu-check.XXXXXX")
  {
    printf 'export ROLL_CLUSTER_STEP=gpu-check\n'
    printf 'export NODE_NAME=%q\n' "$NODE_NAME"
    printf 'export EXPECTED_GPUS=%q\n' "$EXPECTED_GPUS"
    printf 'export GPU_DRIVER=%q\n' "$GPU_DRIVER"
    printf 'export FABRIC_MANAGER=%q\n' "$FABRIC_MANAGER"
    for name in AUTO_INSTALL_DIR ROLL_CLUSTER_STATE_DIR BOOT_ID_FILE COUNT_KEY; do
      if [[ -n "${!name:-}" ]]; then printf 'export %s=%q\n' "$name" "${!name}"; fi
    done
    if [[ -n "${NODE_LOG_DIR:-}" ]]; then printf 'export ROLL_CLUSTER_LOG_DIR=%q\n' "$NODE_LOG_DIR"; fi
    strip_shebang "$SCRIPTS_DIR/lib.sh"
    strip_shebang "$SCRIPTS_DIR/gpu_check.sh"
  } >"$CHECK_SCRIPT"
  trap 'rm -f "$CHECK_SCRIPT"' EXIT
}

# run_check: one probe; sets CHECK_STATUS (gpu_check's exit code, 255 for ssh errors), CHECK_OUTPUT, SSH_ERROR.
run_check() {
  local errors
  errors=$(mktemp "${TMPDIR:-/tmp}/roll-cluster-ssh-errors.XXXXXX")
  CHECK_STATUS=0
  # shellcheck disable=SC2029  # SUDO is meant to expand here: it selects the remote command
  # bounded: an ssh session that hangs (a node that accepts the connection and then freezes) counts as an ssh
  # failure after SSH_PROBE_TIMEOUT_S, so the deadline holds.
  CHECK_OUTPUT=$(bounded "$SSH_PROBE_TIMEOUT_S" ssh "${SSH_OPTIONS[@]}" -- "$SSH_USER@$HOST" "${SUDO}bash -s" \
    <"$CHECK_SCRIPT" 2>"$errors") || CHECK_STATUS=$?
  if ((CHECK_STATUS == 124)); then
    printf 'ssh probe cut off after %ss\n' "$SSH_PROBE_TIMEOUT_S" >>"$errors"
    CHECK_STATUS=255
  fi
  SSH_ERROR=$(tail -n 1 "$errors")
  {
    printf '[%s] exit %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$CHECK_STATUS" "${CHECK_OUTPUT%%$'\n'*}"
    cat "$errors"
  } >>"$ROLL_CLUSTER_STEP_LOG"
  if ((CHECK_STATUS == 255)) && grep -q -e 'REMOTE HOST IDENTIFICATION HAS CHANGED' -e 'Host key verification failed' "$errors"; then
    rm -f "$errors"
    fail "the host key of $HOST does not match the key recorded for node $NODE_NAME in $KNOWN_HOSTS_FILE: another machine answers at this address, or the node was not booted with the program's user data; refusing to connect"
  fi
  rm -f "$errors"
}

request_reboot() {
  local status=0
  banner "driver installed; rebooting $HOST once to load it (${CHECK_OUTPUT%%$'\n'*})"
  # shellcheck disable=SC2029  # SUDO is meant to expand here: it selects the remote command
  bounded "$SSH_PROBE_TIMEOUT_S" ssh "${SSH_OPTIONS[@]}" -- "$SSH_USER@$HOST" "${SUDO}systemctl reboot" </dev/null \
    >>"$ROLL_CLUSTER_STEP_LOG" 2>&1 || status=$?
  ((status != 124)) || status=255
  # 255: the connection dropped because the node went down, which is what was asked for.
  if ((status != 0 && status != 255)); then
    fail "'systemctl reboot' on $HOST exited $status"
  fi
  REBOOTED_AT=$SECONDS
}

# say LINE: print a banner when the status changes, and at least once a minute while it stays the same.
say() {
  if [[ "$1" != "$LAST_SAID" ]] || ((SECONDS - LAST_SAID_AT >= 60)); then
    banner "$1"
    LAST_SAID=$1 LAST_SAID_AT=$SECONDS
  fi
}

wait_until_gpus_ready() {
  local deadline=$((SECONDS + TIMEOUT_S)) status_line seen missing_since=-1 last_status='no answer from the node yet'
  REBOOTED_AT=-1 LAST_SAID='' LAST_SAID_AT=0
  while true; do
    run_check
    status_line=${CHECK_OUTPUT%%$'\n'*}
    if ((CHECK_STATUS != 5)); then missing_since=-1; fi
    case $CHECK_STATUS in
      0)
        banner "$status_line: driver up, GPUs visible (expected $EXPECTED_GPUS)"
        return 0
        ;;
      2)
        if [[ "$GPU_DRIVER" == preinstalled ]]; then
          fail "GPU check failed on node $NODE_NAME ($HOST): $CHECK_OUTPUT" /dev/null
        fi
        fail "GPU driver installation failed on node $NODE_NAME ($HOST): $CHECK_OUTPUT" /dev/null
        ;;
      3)
        last_status=$status_line
        say "$status_line ($((deadline - SECONDS))s left)"
        ;;
      4)
        last_status=$status_line
        if ((REBOOTED_AT < 0)); then
          request_reboot
        else
          say "reboot requested $((SECONDS - REBOOTED_AT))s ago; waiting for $HOST to come back"
        fi
        ;;
      5)
        last_status=$status_line
        seen=${status_line#GPUS_MISSING }
        seen=${seen%% *}
        if ((missing_since < 0)); then missing_since=$SECONDS; fi
        if ((SECONDS - missing_since >= GPUS_MISSING_GRACE_S)); then
          fail "node $NODE_NAME ($HOST) sees $seen GPU(s), expected $EXPECTED_GPUS, for ${GPUS_MISSING_GRACE_S}s after the driver came up (the count is from ${COUNT_KEY:-the instance type}): $status_line"
        fi
        say "$status_line; waiting up to ${GPUS_MISSING_GRACE_S}s for the rest"
        ;;
      255)
        last_status="ssh to $HOST failed: $SSH_ERROR"
        say "node not reachable over ssh (expected while it boots or reboots): $SSH_ERROR"
        ;;
      *)
        fail "the GPU check on $HOST exited $CHECK_STATUS: $CHECK_OUTPUT"
        ;;
    esac
    if ((SECONDS >= deadline)); then
      fail "timed out after ${TIMEOUT_S}s waiting for GPUs on node $NODE_NAME ($HOST); last status: $last_status"
    fi
    # A poll interval, not a wait for something to be ready: the loop above is the bounded wait.
    sleep "$INTERVAL_S"
  done
}

check_settings
render_check
run_step wait_until_gpus_ready "GPU driver readiness on $HOST (expecting $EXPECTED_GPUS GPU(s), deadline ${TIMEOUT_S}s)"
