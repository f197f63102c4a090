#!/usr/bin/env bash
# Shared helpers for every node step. Sourced (prepended) before each step script by infra/remote.py.
# Contract for step scripts:
#   - ROLL_STEP names the step (set by the renderer); every line printed carries it with a UTC timestamp,
#     so `pulumi up` shows where each node is.
#   - Failures are loud: the step name, the failing command and the tail of the step's log.
#   - Waits poll a condition with a bound; nothing sleeps a fixed time hoping something is ready.
set -euo pipefail

: "${ROLL_STEP:=step}"
: "${NODE_NAME:=$(hostname)}"
ROLL_LOG_DIR=${ROLL_LOG_DIR:-/var/log/roll-cluster}
mkdir -p "$ROLL_LOG_DIR" 2>/dev/null || ROLL_LOG_DIR=$(mktemp -d)
ROLL_STEP_LOG="$ROLL_LOG_DIR/${ROLL_STEP}.log"

banner() {
  printf '[%s] [%s] %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$NODE_NAME" "$ROLL_STEP" "$*"
}

# fail MESSAGE [LOGFILE]: stop the step, naming it, with the tail of LOGFILE (default: the step log).
fail() {
  local message=$1 logfile=${2:-$ROLL_STEP_LOG}
  {
    printf '[%s] [%s] %s: FAILED: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$NODE_NAME" "$ROLL_STEP" "$message"
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
  trap - ERR
  fail "command '$command' exited $status (line $line)"
}
trap 'on_unexpected_error $? $LINENO "$BASH_COMMAND"' ERR

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
  printf '+ %s\n' "$*" >>"$ROLL_STEP_LOG"
  "$@" >>"$ROLL_STEP_LOG" 2>&1 || status=$?
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

# wait_for DESCRIPTION TIMEOUT_S INTERVAL_S CMD...: poll CMD until it succeeds; fail after TIMEOUT_S.
wait_for() {
  local description=$1 timeout=$2 interval=$3
  shift 3
  local deadline=$((SECONDS + timeout)) next_report=$((SECONDS + 30))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      fail "timed out after ${timeout}s waiting for $description"
    fi
    if ((SECONDS >= next_report)); then
      banner "still waiting for $description ($((deadline - SECONDS))s left)"
      next_report=$((SECONDS + 30))
    fi
    sleep "$interval"
  done
}

# run_step FUNCTION DESCRIPTION: banners around one named function, with its duration.
run_step() {
  local function_name=$1 description=$2 started=$SECONDS
  banner "start: $description"
  "$function_name"
  banner "done: $description ($((SECONDS - started))s)"
}
