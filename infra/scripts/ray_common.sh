#!/usr/bin/env bash
# Helpers shared by the Ray and job steps (ray_*.sh, job_*.sh, reward_server.sh). infra/node/remote.py concatenates
# lib.sh, this file and the step's own script, so this file only defines functions; it runs nothing itself.
#
# The steps run on the host over SSH and act inside the long-running training container (host network) with
# `docker exec`. The container does not inherit the SSH session's environment, so every variable a command in
# the container needs is passed by name with `docker exec -e NAME`: the value never appears on a command line.

# CURRENT_JOB_FILE [/var/lib/roll-cluster/current-job]: on the head host, the id of the job the job step submitted
# (or found) last (record_current_job); the autostop watcher reads it, so a new job does not change its step.
: "${CURRENT_JOB_FILE:=/var/lib/roll-cluster/current-job}"

# record_current_job: write JOB_ID to CURRENT_JOB_FILE (renamed over it: never half an id).
record_current_job() {
  mkdir -p -- "$(dirname -- "$CURRENT_JOB_FILE")"
  printf '%s\n' "$JOB_ID" >"$CURRENT_JOB_FILE.new"
  mv -f -- "$CURRENT_JOB_FILE.new" "$CURRENT_JOB_FILE"
}

container_state() {
  docker inspect --format '{{.State.Running}}' "$CONTAINER_NAME"
}

# container_is_running: true when CONTAINER_NAME exists and runs (no output, no failure).
container_is_running() {
  [[ "$(container_state 2>/dev/null)" == true ]]
}

# require_container: fail the step unless the training container runs.
require_container() {
  local state
  if ! state=$(container_state 2>>"$ROLL_CLUSTER_STEP_LOG"); then
    fail "container $CONTAINER_NAME does not exist on this host (the container step creates it)"
  fi
  [[ "$state" == true ]] || fail "container $CONTAINER_NAME exists but is not running (Running=$state)"
}

# collect_container_env: prepare the `-e NAME` options of exec_with_env for RAY_EXTRA_ENV_NAMES (space-separated
# variable names, e.g. "WANDB_API_KEY HF_TOKEN"). A listed variable that is not set fails the step: a secret the
# user configured must not go missing silently and surface later as a login error deep inside training.
container_env_args=()
collect_container_env() {
  local name
  container_env_args=()
  for name in ${RAY_EXTRA_ENV_NAMES:-}; do
    [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || fail "RAY_EXTRA_ENV_NAMES: '$name' is not a variable name"
    [[ -n "${!name+set}" ]] || fail "RAY_EXTRA_ENV_NAMES lists $name, but $name is not set in this step"
    export "${name?}"
    container_env_args+=(-e "$name")
  done
}

# add_jemalloc_preload: with RAY_PRELOAD_JEMALLOC=1, start Ray with the container's jemalloc in LD_PRELOAD: sets
# ray_preload, which record_ray_start records (RAY_PRELOAD) and launch_recorded_ray applies, so a restart after a
# reboot preloads it too. MindSpeed-RL's install guide (docs/zh/install_guide.md) asks for it so that
# Ray's processes return memory; its paths: /usr/lib/<arch>-linux-gnu from Ubuntu's libjemalloc2, /usr/local/lib
# from a source build, /usr/lib64 from openEuler's jemalloc package. Only Ray gets it, not every command on the
# host. (JEMALLOC_CANDIDATES is overridable for tests only.)
# see verified-facts#ray-common-install-guide
JEMALLOC_CANDIDATES=${JEMALLOC_CANDIDATES:-'/usr/lib/aarch64-linux-gnu/libjemalloc.so.2 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 /usr/local/lib/libjemalloc.so.2 /usr/lib64/libjemalloc.so.2'}
ray_preload=''
add_jemalloc_preload() {
  local path
  ray_preload=''
  [[ "${RAY_PRELOAD_JEMALLOC:-0}" == 1 ]] || return 0
  for path in $JEMALLOC_CANDIDATES; do
    if docker exec "$CONTAINER_NAME" test -f "$path" 2>/dev/null; then
      ray_preload=$path
      banner "Ray starts with jemalloc preloaded ($path)"
      return 0
    fi
  done
  fail "jemalloc (libjemalloc.so.2) is not in container $CONTAINER_NAME (looked at $JEMALLOC_CANDIDATES): install it in the image (apt install libjemalloc2, or yum install jemalloc); MindSpeed-RL needs it preloaded for Ray"
}

# exec_with_env [DOCKER_EXEC_OPTION...] -- CMD...: docker exec CMD in the container with the collected variables.
exec_with_env() {
  local -a options=()
  while (($#)) && [[ "$1" != -- ]]; do
    options+=("$1")
    shift
  done
  shift
  docker exec "${options[@]}" "${container_env_args[@]}" "$CONTAINER_NAME" "$@"
}

# tcp_open HOST PORT: true when a TCP connection to HOST:PORT succeeds within 3 s (bash's /dev/tcp).
tcp_open() {
  # shellcheck disable=SC2016 # $1 and $2 expand in the inner bash, which gets HOST and PORT as arguments
  timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' tcp_open "$1" "$2" 2>/dev/null
}

# port_listener PORT: who listens on PORT on this host, for error messages (empty when unknown).
port_listener() {
  if command -v ss >/dev/null 2>&1; then
    ss -Htlnp "sport = :$1" 2>/dev/null | awk '{print $4, $6}' | paste -sd ';' -
  fi
}

# banner_lines FILE: banner every line read from stdin and keep the lines in FILE (the caller reads the last).
banner_lines() {
  local line
  : >"$1"
  while IFS= read -r line; do
    banner "$line"
    printf '%s\n' "$line" >>"$1"
  done
}

# The container's Ray processes, read from /proc by ray_processes.py (HELPER_RAY_PROCESSES) with the container's
# python3: `gcs` the raylets' GCS addresses, `all` every live Ray process.
ray_processes() {
  docker exec -i "$CONTAINER_NAME" python3 - "$1" <"$HELPER_RAY_PROCESSES"
}

ray_local_gcs_addresses() {
  timeout -k 5 "${PROBE_TIMEOUT_S:-30}" docker exec -i "$CONTAINER_NAME" python3 - gcs <"$HELPER_RAY_PROCESSES" \
    2>>"$ROLL_CLUSTER_STEP_LOG" ||
    fail "could not list the Ray processes in container $CONTAINER_NAME (is python3 there?)"
}

no_ray_process() {
  [[ -z "$(ray_processes all)" ]]
}

# The Jobs API client of the job steps: ray_job_client.py (HELPER_RAY_JOB_CLIENT), the same public
# JobSubmissionClient that `ray job` wraps, run in the head container with its python3 and RAY_JOB_API (the
# dashboard URL); its docstring lists the actions.
# job_client ACTION [DOCKER_EXEC_OPTION...]: run the Jobs API client for JOB_ID in the head container.
# shellcheck disable=SC2153 # DASHBOARD_PORT is required by the job steps, from their environment
# A Jobs API that accepts the connection and never answers would hang the step: every call is bounded by
# JOB_CLIENT_TIMEOUT_S [120] (exit 124 when cut).
job_client() {
  local action=$1
  shift
  RAY_JOB_API="http://127.0.0.1:$DASHBOARD_PORT" timeout -k 10 "${JOB_CLIENT_TIMEOUT_S:-120}" \
    docker exec -i -e RAY_JOB_API "$@" "$CONTAINER_NAME" python3 - "$action" "$JOB_ID" <"$HELPER_RAY_JOB_CLIENT"
}

# job_state: prints the job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED) or NOT_FOUND.
job_state() {
  job_client state 2>>"$ROLL_CLUSTER_STEP_LOG"
}

# job_log_tail: append the last 40 lines of the job's log to the step log, where fail shows them.
job_log_tail() {
  local log
  if ! log=$(job_client logs 2>&1); then
    log="could not read the log of job $JOB_ID: $log"
  fi
  {
    printf -- '--- last 40 lines of the log of Ray job %s ---\n' "$JOB_ID"
    tail -n 40 <<<"$log"
  } >>"$ROLL_CLUSTER_STEP_LOG"
}

# ---- the recorded Ray settings (issue 11: changes applied, reboots survived) ----
# Each Ray step records, inside the container, how it started Ray:
#   $RAY_RECORD_DIR/settings   what Ray runs with, one setting a line, secrets only as a hash of their values
#                              (computed here, from the step's environment, never on a command line)
#   $RAY_RECORD_DIR/start      (mode 0600) the `ray start` arguments and the variables it needs, secrets included:
#                              the container's main process (container_main.sh) starts Ray from it after a
#                              reboot or a container restart, and rejoins a worker whenever its Ray is gone
# A step that finds Ray running compares the recorded settings with its own: equal, Ray is left alone; different,
# it names what differs, stops Ray and starts it with the new settings. While a step works on Ray it pauses the
# main process's supervision ($RAY_PAUSE_FILE, on the container's /dev/shm: a restart clears it).
# Both paths are container_main.sh's defaults (overridable for tests only, like there).
RAY_RECORD_DIR=${RAY_RECORD_DIR:-/var/lib/roll-cluster/ray}
RAY_PAUSE_FILE=${RAY_PAUSE_FILE:-/dev/shm/roll-cluster-ray.pause}

# ray_settings_text ARG...: the settings record for `ray start ARG...` with this step's RAY_EXTRA_ENV_NAMES,
# NODE_RANK, RAY_PRELOAD_JEMALLOC and RAY_GENERATION (the cluster's Ray generation: a worker restarts when the
# head's settings change), and the GPUs Ray may use when the step restricts them (RAY_CUDA_VISIBLE_DEVICES set: a
# line of its own only then, so that a node without it keeps the record it had).
ray_settings_text() {
  local name digest
  printf '%s\n' "$@"
  if [[ -n "${RAY_CUDA_VISIBLE_DEVICES+set}" ]]; then
    printf 'CUDA_VISIBLE_DEVICES=%s\n' "$RAY_CUDA_VISIBLE_DEVICES"
  fi
  printf 'NODE_RANK=%s\n' "${NODE_RANK:-}"
  printf 'RAY_PRELOAD_JEMALLOC=%s\n' "${RAY_PRELOAD_JEMALLOC:-0}"
  printf 'RAY_GENERATION=%s\n' "${RAY_GENERATION:-}"
  printf 'RAY_EXTRA_ENV_NAMES=%s\n' "${RAY_EXTRA_ENV_NAMES:-}"
  if [[ -n "${RAY_EXTRA_ENV_NAMES:-}" ]]; then
    # printf is a shell builtin: the values go through a pipe, not through any process's arguments.
    digest=$(for name in $RAY_EXTRA_ENV_NAMES; do printf '%s=%s\0' "$name" "${!name:-}"; done | sha256sum)
    printf 'sha256 of the values of %s=%s\n' "$RAY_EXTRA_ENV_NAMES" "${digest%% *}"
  fi
}

# recorded_ray_settings: the settings record in the container (empty when there is none). No record (Ray never
# started in this container) is the one expected case; a read that fails otherwise (docker exec cut at its bound)
# returns its status (the caller fails): read as "no record", it would restart a Ray whose settings did not change
# and end its job.
recorded_ray_settings() {
  # shellcheck disable=SC2016 # $1 expands in the container's shell
  timeout -k 5 "${PROBE_TIMEOUT_S:-30}" docker exec "$CONTAINER_NAME" sh -c 'if [ -e "$1" ]; then cat -- "$1"; fi' \
    read-settings "$RAY_RECORD_DIR/settings" 2>>"$ROLL_CLUSTER_STEP_LOG"
}

# settings_differences OLD NEW: the names of the settings that differ ("--object-store-memory", "RAY_GENERATION",
# "the values of WANDB_API_KEY", ...), comma-separated; "no record" when OLD is empty.
settings_differences() {
  local old=$1 new=$2 line key
  local -a keys=()
  if [[ -z "$old" ]]; then
    printf 'no record of the settings it runs with'
    return 0
  fi
  while IFS= read -r line; do
    [[ -n "$line" ]] || continue
    key=${line%%=*}
    key=${key#sha256 of }
    if ! grep -qxF -- "$line" <<<"$old" || ! grep -qxF -- "$line" <<<"$new"; then
      [[ " ${keys[*]} " == *" $key "* ]] || keys+=("$key")
    fi
  done < <(printf '%s\n%s\n' "$old" "$new")
  local IFS=,
  printf '%s' "${keys[*]}" | sed 's/,/, /g'
}

# write_in_container PATH: write stdin to PATH in the container (mode 0600, through a temp file renamed over it).
write_in_container() {
  # shellcheck disable=SC2016 # $1 expands in the container's shell
  docker exec -i "$CONTAINER_NAME" sh -c 'umask 077 && mkdir -p "$(dirname "$1")" && cat >"$1.tmp" && mv -f "$1.tmp" "$1"' \
    write_in_container "$1"
}

# record_ray_start ROLE HEAD_ADDRESS ARG...: record the settings and the start command of `ray start ARG...`
# (after collect_container_env and add_jemalloc_preload): everything launch_recorded_ray (ray_launch.sh) starts
# Ray with, for the step and for the container's main process alike.
record_ray_start() {
  local role=$1 head=$2 name
  shift 2
  ray_settings_text "$@" | write_in_container "$RAY_RECORD_DIR/settings"
  {
    printf 'RAY_ROLE=%q\nRAY_HEAD_ADDRESS=%q\n' "$role" "$head"
    printf 'RAY_PRELOAD=%q\n' "$ray_preload"
    printf 'export NODE_RANK=%q\n' "${NODE_RANK:-0}"
    if [[ -n "${RAY_CUDA_VISIBLE_DEVICES+set}" ]]; then
      printf 'export CUDA_VISIBLE_DEVICES=%q\n' "$RAY_CUDA_VISIBLE_DEVICES"
    fi
    for name in ${RAY_EXTRA_ENV_NAMES:-}; do
      printf 'export %s=%q\n' "$name" "${!name:-}"
    done
    printf 'RAY_START_ARGS=('
    printf ' %q' "$@"
    printf ' )\n'
  } | write_in_container "$RAY_RECORD_DIR/start"
}

# launch_ray_in_container: start Ray in the container from the start record just written, through the same
# function the container's main process restarts it with (ray_launch.sh, shipped with `declare -f`: its text holds
# no secret; the secrets are read from the record inside the container). Bounded by RAY_LAUNCH_TIMEOUT_S [300].
launch_ray_in_container() {
  # shellcheck disable=SC2016 # "$@" expands in the container's bash
  docker exec "$CONTAINER_NAME" bash -c "$(declare -f launch_recorded_ray)"$'\n''launch_recorded_ray "$@"' \
    launch-ray "$RAY_RECORD_DIR/start" "${RAY_LAUNCH_TIMEOUT_S:-300}"
}

# forget_ray_start: remove the start record, so that nothing starts Ray again in this container (ray-stop).
forget_ray_start() {
  docker exec "$CONTAINER_NAME" rm -f "$RAY_RECORD_DIR/start" "$RAY_RECORD_DIR/settings"
}

# pause_ray_supervision: write the pause file, then wait (bounded) for a start the main process has under way.
pause_ray_supervision() {
  # shellcheck disable=SC2016 # $1 and $2 expand in the container's shell
  timeout -k 5 360 docker exec "$CONTAINER_NAME" sh -c \
    ': >"$1" && mkdir -p "$(dirname "$2")" && if command -v flock >/dev/null 2>&1; then flock "$2" true; fi' \
    pause "$RAY_PAUSE_FILE" "$RAY_RECORD_DIR/supervisor.lock" >>"$ROLL_CLUSTER_STEP_LOG" 2>&1 ||
    fail "could not pause the supervision of Ray in container $CONTAINER_NAME"
}

# resume_ray_supervision (on the step's exit, after success or failure): a container that is not running has no
# pause file left (it is on the container's /dev/shm, which a restart clears), so nothing is left to resume; any
# other failure would leave Ray unsupervised and is loud.
resume_ray_supervision() {
  docker exec "$CONTAINER_NAME" rm -f -- "$RAY_PAUSE_FILE" 2>>"$ROLL_CLUSTER_STEP_LOG" || ! container_is_running ||
    fail "could not resume the supervision of Ray in container $CONTAINER_NAME (remove $RAY_PAUSE_FILE there)"
}

# stop_local_ray: stop Ray in the container (`ray stop`, bounded) and wait until its processes are gone.
stop_local_ray() {
  logged timeout -k 10 "${RAY_STOP_TIMEOUT_S:-60}" docker exec "$CONTAINER_NAME" ray stop
  wait_for "the old Ray processes in $CONTAINER_NAME to exit" "${RAY_STOP_TIMEOUT_S:-60}" 1 no_ray_process
}
