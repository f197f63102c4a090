#!/usr/bin/env bash
# Step reward-server (OpenRLHF, on the head): keep a remote reward server running inside the container, or stop
# it on destroy. A supervisor started with `docker exec -d` restarts the server with backoff when it exits and
# lives on after the SSH session; a lock makes it one instance per port.
#
# Environment:
#   CONTAINER_NAME           the head's training container                                             required
#   REWARD_ACTION            start, or stop (every reward server in the container; nothing else needed) start
#   REWARD_COMMAND           the server command, e.g. python3 -m openrlhf.cli.serve_rm ... --port 5001  required
#   REWARD_PORT              the port the server listens on (host network)                             required
#   REWARD_HEALTH_TIMEOUT_S  bound on waiting until the port answers (models load slowly)              600
#   REWARD_WORKDIR           directory in the container the server runs from                           /
#   RAY_EXTRA_ENV_NAMES      names of exported variables passed to the server (e.g. HF_TOKEN)          empty
#
# The upstream server has no health route (verl-openrlhf.md §2.4), so "answers" means a TCP connection.
# The server's output is in the container at /tmp/roll-cluster-reward-<port>/server.log.

require_env CONTAINER_NAME
REWARD_ACTION=${REWARD_ACTION:-start}
REWARD_STATE_PREFIX=/tmp/roll-cluster-reward-
case "$REWARD_ACTION" in
  start)
    require_env REWARD_COMMAND REWARD_PORT
    REWARD_HEALTH_TIMEOUT_S=${REWARD_HEALTH_TIMEOUT_S:-600}
    require_int REWARD_PORT REWARD_HEALTH_TIMEOUT_S
    REWARD_WORKDIR=${REWARD_WORKDIR:-/}
    REWARD_STATE_DIR="$REWARD_STATE_PREFIX$REWARD_PORT"
    export REWARD_COMMAND REWARD_WORKDIR REWARD_STATE_DIR
    ;;
  stop) ;;
  *) fail "REWARD_ACTION must be start or stop, not $REWARD_ACTION" ;;
esac

# reward_supervise runs inside the container, detached, as the leader of its own session (so that stopping it
# stops the server too).
reward_supervise() {
  local log="$REWARD_STATE_DIR/server.log" delay=1 started status
  mkdir -p "$REWARD_STATE_DIR" || exit 1
  exec 9>>"$REWARD_STATE_DIR/supervisor.lock"
  # A second supervisor (say a rerun racing this one) leaves at once: one instance only.
  flock -n 9 || exit 0
  printf '%s\n' "$$" >"$REWARD_STATE_DIR/supervisor.pid"
  printf '%s\n' "$REWARD_COMMAND" >"$REWARD_STATE_DIR/command"
  cd "$REWARD_WORKDIR" || exit 1
  while true; do
    started=$SECONDS
    printf '[%s] supervisor: starting: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$REWARD_COMMAND" >>"$log"
    status=0
    bash -c "$REWARD_COMMAND" >>"$log" 2>&1 </dev/null 9>&- || status=$?
    # A server that ran for a while restarts at once; one that keeps crashing backs off up to 60 s.
    if ((SECONDS - started > 60)); then
      delay=1
    fi
    printf '[%s] supervisor: the server exited with status %s; restarting in %ss\n' \
      "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$status" "$delay" >>"$log"
    sleep "$delay"
    delay=$((delay * 2 > 60 ? 60 : delay * 2))
  done
}

supervisor_running() {
  # shellcheck disable=SC2016 # $1 expands in the container's bash
  docker exec "$CONTAINER_NAME" bash -c 'mkdir -p "$1" && ! flock -n "$1/supervisor.lock" true' _ "$REWARD_STATE_DIR"
}

supervisor_stopped() {
  ! supervisor_running
}

reward_port_answers() {
  tcp_open 127.0.0.1 "$REWARD_PORT"
}

server_log_tail() {
  {
    printf -- '--- last 40 lines of %s/server.log in %s ---\n' "$REWARD_STATE_DIR" "$CONTAINER_NAME"
    docker exec "$CONTAINER_NAME" tail -n 40 "$REWARD_STATE_DIR/server.log" 2>&1
  } >>"$ROLL_CLUSTER_STEP_LOG"
}

start_reward_server() {
  local running_command
  if supervisor_running; then
    running_command=$(docker exec "$CONTAINER_NAME" cat "$REWARD_STATE_DIR/command")
    if [[ "$running_command" == "$REWARD_COMMAND" ]]; then
      banner "the reward server already runs under its supervisor in $CONTAINER_NAME"
      return 0
    fi
    banner "the reward server command changed: stopping the old server"
    # shellcheck disable=SC2016 # $1 expands in the container's bash
    logged docker exec "$CONTAINER_NAME" bash -c 'kill -TERM -- "-$(cat "$1/supervisor.pid")"' _ "$REWARD_STATE_DIR"
    wait_for "the old reward server to exit" 60 1 supervisor_stopped
  fi
  if reward_port_answers; then
    fail "port $REWARD_PORT is taken by something other than the reward server (listener: $(port_listener "$REWARD_PORT"))"
  fi
  collect_container_env
  # No setsid: `docker exec` starts its command as the leader of a session of its own already (runc; seen on Docker
  # 20.10), so setsid would fork and leave the supervisor a child of the container's init, where real Docker ended
  # it together with its server the first time the server exited: nothing restarted it (the real-host tier).
  logged exec_with_env -d -e REWARD_COMMAND -e REWARD_WORKDIR -e REWARD_STATE_DIR -- \
    bash -c "$(declare -f reward_supervise); reward_supervise"
  banner "started the reward server; its log: $REWARD_STATE_DIR/server.log in $CONTAINER_NAME"
}

wait_reward_server() {
  if ! poll_until "$REWARD_HEALTH_TIMEOUT_S" 2 reward_port_answers; then
    server_log_tail
    fail "the reward server did not answer on port $REWARD_PORT within ${REWARD_HEALTH_TIMEOUT_S}s"
  fi
  banner "the reward server answers on port $REWARD_PORT"
}

# reward_stop_all runs inside the container: signals every running supervisor's process group (the supervisor
# and its server) and prints the state directories it stopped.
reward_stop_all() {
  local dir
  for dir in "$1"*; do
    [[ -f "$dir/supervisor.pid" ]] || continue
    if flock -n "$dir/supervisor.lock" true; then
      continue # nobody holds the lock: that supervisor is gone already
    fi
    kill -TERM -- "-$(cat "$dir/supervisor.pid")"
    printf '%s\n' "$dir"
  done
}

# reward_running_any runs inside the container: true while some supervisor still holds its lock.
reward_running_any() {
  local dir
  for dir in "$1"*; do
    [[ -f "$dir/supervisor.lock" ]] || continue
    flock -n "$dir/supervisor.lock" true || return 0
  done
  return 1
}

no_reward_server() {
  ! docker exec "$CONTAINER_NAME" bash -c "$(declare -f reward_running_any); reward_running_any $REWARD_STATE_PREFIX"
}

stop_reward_servers() {
  local stopped
  if ! container_is_running; then
    banner "container $CONTAINER_NAME is not running: no reward server to stop"
    return 0
  fi
  stopped=$(docker exec "$CONTAINER_NAME" bash -c "$(declare -f reward_stop_all); reward_stop_all $REWARD_STATE_PREFIX" \
    2>>"$ROLL_CLUSTER_STEP_LOG") || fail "could not stop the reward servers in $CONTAINER_NAME"
  if [[ -z "$stopped" ]]; then
    banner "no reward server runs in $CONTAINER_NAME"
    return 0
  fi
  banner "stopping the reward servers of ${stopped//$'\n'/, }"
  wait_for "the reward servers in $CONTAINER_NAME to exit" 60 1 no_reward_server
}

if [[ "$REWARD_ACTION" == stop ]]; then
  run_step stop_reward_servers "stop the reward servers in $CONTAINER_NAME"
else
  run_step require_container "check that container $CONTAINER_NAME runs"
  run_step start_reward_server "start the reward server on port $REWARD_PORT"
  run_step wait_reward_server "wait until the reward server answers"
fi
