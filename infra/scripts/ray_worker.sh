#!/usr/bin/env bash
# Step ray-worker: join this node's training container to the Ray head (roll.md §4.3, Method B). Workers may
# start before the head: the step waits, bounded, until the head's GCS port answers.
#
# Environment:
#   CONTAINER_NAME           training container (host network)                                         required
#   NODE_IP                  this node's private IP                                                    required
#   HEAD_IP                  the head's private IP                                                     required
#   GCS_PORT                 the head's GCS port                                                       required
#   NUM_GPUS                 GPUs Ray announces for this node                                          required
#   NODE_RANK                exported into `ray start`: ROLL orders nodes by it                        required
#   HEAD_WAIT_TIMEOUT_S      bound on waiting for the head's GCS port                                  900
#   HEAD_POLL_INTERVAL_S     seconds between connection attempts to the head                           2
#   RAY_TEMP_DIR             the head's temp root: workers use the head's (Ray ignores --temp-dir on
#                            workers), so it is only created here                                      empty
#   RAY_OBJECT_STORE_MEMORY  object store size in bytes; empty: Ray's default                          empty
#   RAY_NUM_CPUS             CPUs Ray announces; empty: all                                            empty
#   RAY_RESOURCES            custom resources as JSON, e.g. {"NPU": 8} on Ascend; empty: none          empty
#   RAY_PRELOAD_JEMALLOC     1: Ray starts with the container's jemalloc preloaded (ray_common.sh)     0
#   RAY_EXTRA_ENV_NAMES      names of exported variables passed into `ray start` (see ray_head.sh)     empty
#   RAY_START_ATTEMPTS       attempts of `ray start` (a head that just came up may refuse briefly)     3
#   RAY_GENERATION           the cluster's Ray generation (a hash of the head's settings): when it
#                            changes the head restarted, and so does this worker                       empty
#
# Ray already joined to the head is left alone when the recorded settings (ray_common.sh) are the ones asked for;
# otherwise the step names what differs and rejoins with the new ones.

require_env CONTAINER_NAME NODE_IP HEAD_IP GCS_PORT NUM_GPUS NODE_RANK
HEAD_WAIT_TIMEOUT_S=${HEAD_WAIT_TIMEOUT_S:-900}
HEAD_POLL_INTERVAL_S=${HEAD_POLL_INTERVAL_S:-2}
RAY_TEMP_DIR=${RAY_TEMP_DIR:-}
RAY_OBJECT_STORE_MEMORY=${RAY_OBJECT_STORE_MEMORY:-}
RAY_NUM_CPUS=${RAY_NUM_CPUS:-}
RAY_RESOURCES=${RAY_RESOURCES:-}
RAY_START_ATTEMPTS=${RAY_START_ATTEMPTS:-3}
require_int GCS_PORT NUM_GPUS NODE_RANK HEAD_WAIT_TIMEOUT_S HEAD_POLL_INTERVAL_S RAY_START_ATTEMPTS
[[ -z "$RAY_OBJECT_STORE_MEMORY" ]] || require_int RAY_OBJECT_STORE_MEMORY
[[ -z "$RAY_NUM_CPUS" ]] || require_int RAY_NUM_CPUS
export NODE_RANK

head_address="$HEAD_IP:$GCS_PORT"
already_joined=false
declare -a join_args=()

build_join_args() {
  join_args=(ray start --disable-usage-stats "--address=$head_address"
    "--node-ip-address=$NODE_IP" "--num-gpus=$NUM_GPUS")
  [[ -z "$RAY_OBJECT_STORE_MEMORY" ]] || join_args+=("--object-store-memory=$RAY_OBJECT_STORE_MEMORY")
  [[ -z "$RAY_NUM_CPUS" ]] || join_args+=("--num-cpus=$RAY_NUM_CPUS")
  [[ -z "$RAY_RESOURCES" ]] || join_args+=("--resources=$RAY_RESOURCES")
}

check_existing_ray() {
  local addresses wanted recorded
  addresses=$(ray_local_gcs_addresses)
  if [[ "$addresses" == "$head_address" ]]; then
    wanted=$(ray_settings_text "${join_args[@]}")
    recorded=$(recorded_ray_settings) ||
      fail "could not read the recorded Ray settings $RAY_RECORD_DIR/settings in container $CONTAINER_NAME"
    if [[ "$recorded" == "$wanted" ]]; then
      already_joined=true
      banner "Ray in $CONTAINER_NAME has already joined the head $head_address; leaving it as it is (it runs with\
 the settings asked for)"
      return 0
    fi
    banner "Ray in $CONTAINER_NAME: its settings changed ($(settings_differences "$recorded" "$wanted")):\
 stopping it to rejoin with the new ones"
    stop_local_ray
  elif [[ -n "$addresses" ]]; then
    banner "Ray in $CONTAINER_NAME belongs to ${addresses//$'\n'/, }, not $head_address: stopping it to rejoin"
    stop_local_ray
  fi
}

head_answers() {
  tcp_open "$HEAD_IP" "$GCS_PORT"
}

wait_for_head() {
  local started=$SECONDS
  if ! head_answers; then
    banner "waiting up to ${HEAD_WAIT_TIMEOUT_S}s for the head $head_address"
    poll_until "$HEAD_WAIT_TIMEOUT_S" "$HEAD_POLL_INTERVAL_S" head_answers ||
      fail "head $head_address unreachable after $((SECONDS - started))s"
  fi
  banner "head $head_address answers"
}

join_head() {
  if [[ -n "$RAY_TEMP_DIR" ]]; then
    logged docker exec "$CONTAINER_NAME" mkdir -p "$RAY_TEMP_DIR"
  fi
  collect_container_env
  add_jemalloc_preload
  # Recorded, then joined from the record by the function the container's main process rejoins with whenever
  # this worker's Ray is gone (a reboot of this node, or of the head): both joins are the same.
  record_ray_start worker "$head_address" "${join_args[@]}"
  retry "$RAY_START_ATTEMPTS" 5 log_cmd launch_ray_in_container ||
    fail "ray start --address=$head_address failed $RAY_START_ATTEMPTS times"
}

run_step require_container "check that container $CONTAINER_NAME runs"
build_join_args
# The container's main process must not rejoin from an old record while this step works on Ray.
pause_ray_supervision
trap resume_ray_supervision EXIT
run_step check_existing_ray "look for Ray already running in $CONTAINER_NAME"
if [[ "$already_joined" == false ]]; then
  run_step wait_for_head "wait for the head $head_address"
  run_step join_head "join $head_address ($NUM_GPUS GPUs, node rank $NODE_RANK)"
fi
