#!/usr/bin/env bash
# teardown: the delete command of a node step (stop the job, stop Ray, stop the reward server), run on the machine
# that runs `pulumi destroy` (a pulumi-command local.Command) as
#   bash infra/scripts/local/teardown.sh        with the environment below.
# It runs REMOTE_COMMAND (a step rendered by infra/node/remote.py, no secrets in it) on the node over ssh, fed on
# stdin, so it never shows in a process list. First it checks that the node answers at all, with short bounds: a
# node that is stopped, released or unreachable has nothing left to stop, and waiting for it would only hold
# `pulumi destroy` up (pulumi-command's own connection would retry for many minutes per step). Such a node counts
# as done, and the step says so.
#
# Environment (defaults in brackets):
#   HOST (required), SSH_USER [root], SSH_PORT [22], SSH_KEY_PATH [ssh's default keys]
#   KNOWN_HOSTS_FILE [ssh's default]   the stack's known-hosts file (infra/node/known_hosts.py)
#   HOST_KEY_CHECKING [yes with KNOWN_HOSTS_FILE, else accept-new]   StrictHostKeyChecking
#   REMOTE_COMMAND (required)    the rendered delete step
#   REACH_ATTEMPTS [2], REACH_TIMEOUT_S [20]   probes of the node before it counts as gone
#   TEARDOWN_TIMEOUT_S [300]     bound on the delete step itself
#   NODE_NAME [HOST], ROLL_STEP [teardown], ROLL_LOG_DIR [${TMPDIR:-/tmp}/roll-cluster-logs]
# Portable to bash 3.2 (macOS): no `timeout` there, lib.sh's `bounded` cuts what hangs.

TEARDOWN_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${ROLL_STEP:=teardown}"
: "${NODE_NAME:=${HOST:-}}"
: "${ROLL_LOG_DIR:=${TMPDIR:-/tmp}/roll-cluster-logs}"
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "$TEARDOWN_DIR")/lib.sh"
ROLL_STEP_LOG="$ROLL_LOG_DIR/${ROLL_STEP}-${NODE_NAME//\//_}.log"

: "${SSH_USER:=root}"
: "${SSH_PORT:=22}"
: "${SSH_KEY_PATH:=}"
: "${KNOWN_HOSTS_FILE:=}"
: "${HOST_KEY_CHECKING:=}"
: "${REACH_ATTEMPTS:=2}"
: "${REACH_TIMEOUT_S:=20}"
: "${TEARDOWN_TIMEOUT_S:=300}"

check_settings() {
  require_env HOST REMOTE_COMMAND
  require_int SSH_PORT REACH_ATTEMPTS REACH_TIMEOUT_S TEARDOWN_TIMEOUT_S
  if [[ -z "$HOST_KEY_CHECKING" ]]; then
    if [[ -n "$KNOWN_HOSTS_FILE" ]]; then HOST_KEY_CHECKING=yes; else HOST_KEY_CHECKING=accept-new; fi
  fi
  case $HOST_KEY_CHECKING in
    yes | accept-new) ;;
    *) fail "HOST_KEY_CHECKING must be yes or accept-new, got '$HOST_KEY_CHECKING'" ;;
  esac
  SSH_OPTIONS=(-o BatchMode=yes -o StrictHostKeyChecking="$HOST_KEY_CHECKING" -o ConnectTimeout="$REACH_TIMEOUT_S"
    -o ServerAliveInterval=10 -o ServerAliveCountMax=3 -o LogLevel=ERROR -p "$SSH_PORT")
  if [[ -n "$SSH_KEY_PATH" ]]; then
    # shellcheck disable=SC2088  # a literal "~/" is exactly what is looked for
    local tilde_prefix='~/'
    if [[ "$SSH_KEY_PATH" == "$tilde_prefix"* ]]; then SSH_KEY_PATH=$HOME/${SSH_KEY_PATH#"$tilde_prefix"}; fi
    SSH_OPTIONS+=(-i "$SSH_KEY_PATH" -o IdentitiesOnly=yes)
  fi
  if [[ -n "$KNOWN_HOSTS_FILE" ]]; then
    # shellcheck disable=SC2088  # a literal "~/" is exactly what is looked for
    local home_prefix='~/'
    if [[ "$KNOWN_HOSTS_FILE" == "$home_prefix"* ]]; then KNOWN_HOSTS_FILE=$HOME/${KNOWN_HOSTS_FILE#"$home_prefix"}; fi
    SSH_OPTIONS+=(-o UserKnownHostsFile="$KNOWN_HOSTS_FILE")
  fi
}

node_answers() {
  ssh "${SSH_OPTIONS[@]}" "$SSH_USER@$HOST" true </dev/null
}

NODE_GONE=false
probe_node() {
  local attempt status
  for ((attempt = 1; attempt <= REACH_ATTEMPTS; attempt++)); do
    status=0
    bounded "$REACH_TIMEOUT_S" node_answers >>"$ROLL_STEP_LOG" 2>&1 || status=$?
    if ((status == 0)); then
      return 0
    fi
    banner "$HOST does not answer over ssh (attempt $attempt/$REACH_ATTEMPTS, exit $status)"
    ((attempt == REACH_ATTEMPTS)) || sleep 2
  done
  NODE_GONE=true
}

run_delete() {
  local status=0
  bounded "$TEARDOWN_TIMEOUT_S" ssh "${SSH_OPTIONS[@]}" "$SSH_USER@$HOST" sh -s <<<"$REMOTE_COMMAND" || status=$?
  case $status in
    0) ;;
    # The node went away while the step ran (a reboot, a release): nothing is left running there.
    255) banner "the connection to $HOST dropped during the delete step; the node is going away: done" ;;
    124) fail "the delete step on $HOST did not finish within ${TEARDOWN_TIMEOUT_S}s" ;;
    *) fail "the delete step on $HOST exited $status" ;;
  esac
}

run_step check_settings "check the settings"
run_step probe_node "check that $HOST answers (${REACH_ATTEMPTS} x ${REACH_TIMEOUT_S}s at most)"
if [[ "$NODE_GONE" == true ]]; then
  banner "$HOST is gone (stopped, released or unreachable): nothing left to stop there; done"
  exit 0
fi
run_step run_delete "run $ROLL_STEP on $HOST"
