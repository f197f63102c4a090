#!/usr/bin/env bash
# Step ray-head: start the Ray head inside the training container on node rank 0 (roll.md §4.3, Method B:
# Ray is started by us, ROLL / verl / OpenRLHF then find it running and only submit work).
#
# Environment:
#   CONTAINER_NAME           training container (host network, kept alive by `sleep infinity`)      required
#   NODE_IP                  this node's private IP; Ray binds and advertises it                      required
#   GCS_PORT                 Ray GCS port (`ray start --port`)                                         required
#   DASHBOARD_PORT           dashboard / Jobs API port                                                 required
#   CLIENT_PORT              Ray Client server port                                                    required
#   NUM_GPUS                 GPUs Ray announces for this node                                          required
#   RAY_CUDA_VISIBLE_DEVICES when set: the GPU ids Ray may hand out, given to `ray start` as
#                            CUDA_VISIBLE_DEVICES (the others are the reward server's); "" none        unset
#   DASHBOARD_HOST           address the dashboard binds: 0.0.0.0 or 127.0.0.1 (tunnel only)           127.0.0.1
#   NODE_RANK                exported into `ray start`: ROLL orders nodes by it                        0
#   RAY_TEMP_DIR             Ray's temp root, e.g. /data/ray/tmp on a data disk; empty: Ray's default  empty
#   RAY_SPILL_DIR            directory for object spilling; empty: Ray's default (under the temp dir)  empty
#   RAY_OBJECT_STORE_MEMORY  object store size in bytes; empty: Ray's default (30% of memory)          empty
#   RAY_NUM_CPUS             CPUs Ray announces; empty: all                                            empty
#   RAY_RESOURCES            custom resources as JSON, e.g. {"NPU": 8} on Ascend; empty: none          empty
#   RAY_PRELOAD_JEMALLOC     1: Ray starts with the container's jemalloc preloaded (ray_common.sh)     0
#   RAY_EXTRA_ENV_NAMES      names of exported variables passed into `ray start` (secrets such as
#                            WANDB_API_KEY, HF_TOKEN): the raylet and every job inherit them           empty
#   RAY_START_TIMEOUT_S      bound on waiting for the GCS and `ray status` after the start             180
#   RAY_GENERATION           the cluster's Ray generation (a hash of the head's settings): recorded    empty
#
# Ray already running as this head is left alone when the settings it was started with (recorded in the container,
# see ray_common.sh) are the ones asked for; otherwise the step names what differs and restarts Ray with them.

require_env CONTAINER_NAME NODE_IP GCS_PORT DASHBOARD_PORT CLIENT_PORT NUM_GPUS
DASHBOARD_HOST=${DASHBOARD_HOST:-127.0.0.1}
NODE_RANK=${NODE_RANK:-0}
RAY_TEMP_DIR=${RAY_TEMP_DIR:-}
RAY_SPILL_DIR=${RAY_SPILL_DIR:-}
RAY_OBJECT_STORE_MEMORY=${RAY_OBJECT_STORE_MEMORY:-}
RAY_NUM_CPUS=${RAY_NUM_CPUS:-}
RAY_RESOURCES=${RAY_RESOURCES:-}
RAY_START_TIMEOUT_S=${RAY_START_TIMEOUT_S:-180}
require_int GCS_PORT DASHBOARD_PORT CLIENT_PORT NUM_GPUS NODE_RANK RAY_START_TIMEOUT_S
[[ -z "$RAY_OBJECT_STORE_MEMORY" ]] || require_int RAY_OBJECT_STORE_MEMORY
[[ -z "$RAY_NUM_CPUS" ]] || require_int RAY_NUM_CPUS
if [[ -n "${RAY_CUDA_VISIBLE_DEVICES+set}" && ! "$RAY_CUDA_VISIBLE_DEVICES" =~ ^([0-9]+(,[0-9]+)*)?$ ]]; then
  fail "RAY_CUDA_VISIBLE_DEVICES must be comma-separated GPU ids, not '$RAY_CUDA_VISIBLE_DEVICES'"
fi
export NODE_RANK

head_already_running=false
declare -a head_args=()

# shellcheck disable=SC2153 # DASHBOARD_PORT is required above, from the step's environment
build_head_args() {
  head_args=(ray start --head --disable-usage-stats
    "--node-ip-address=$NODE_IP" "--port=$GCS_PORT"
    "--dashboard-host=$DASHBOARD_HOST" "--dashboard-port=$DASHBOARD_PORT"
    "--ray-client-server-port=$CLIENT_PORT" "--num-gpus=$NUM_GPUS")
  [[ -z "$RAY_TEMP_DIR" ]] || head_args+=("--temp-dir=$RAY_TEMP_DIR")
  [[ -z "$RAY_OBJECT_STORE_MEMORY" ]] || head_args+=("--object-store-memory=$RAY_OBJECT_STORE_MEMORY")
  [[ -z "$RAY_NUM_CPUS" ]] || head_args+=("--num-cpus=$RAY_NUM_CPUS")
  [[ -z "$RAY_RESOURCES" ]] || head_args+=("--resources=$RAY_RESOURCES")
  if [[ -n "$RAY_SPILL_DIR" ]]; then
    [[ "$RAY_SPILL_DIR" =~ ^/[A-Za-z0-9._/-]+$ ]] || fail "RAY_SPILL_DIR must be an absolute plain path: $RAY_SPILL_DIR"
    # Ray parses object_spilling_config as a JSON document held in a string of the JSON system config (a
    # nested object, as in some guides, makes `ray start` fail). The newer --object-spilling-directory flag
    # exists only from Ray 2.45 on; this form works with every Ray the frameworks use. Workers get it from the
    # head, so every node spills to the same path.
    local spilling='{"type":"filesystem","params":{"directory_path":"'"$RAY_SPILL_DIR"'"}}'
    head_args+=("--system-config={\"object_spilling_config\":\"${spilling//\"/\\\"}\"}")
  fi
}

check_existing_ray() {
  local addresses wanted recorded differences
  addresses=$(ray_local_gcs_addresses)
  # This node's own head on another port (gcsPort changed) is this cluster's head with a changed setting.
  if [[ "$addresses" == "$NODE_IP:$GCS_PORT" || ( "$addresses" == "$NODE_IP:"* && "$addresses" != *$'\n'* ) ]]; then
    wanted=$(ray_settings_text "${head_args[@]}")
    recorded=$(recorded_ray_settings) ||
      fail "could not read the recorded Ray settings $RAY_RECORD_DIR/settings in container $CONTAINER_NAME"
    if [[ "$recorded" == "$wanted" ]]; then
      head_already_running=true
      banner "the Ray head already runs in $CONTAINER_NAME at $NODE_IP:$GCS_PORT; leaving it as it is (it runs with\
 the settings asked for)"
      return 0
    fi
    differences=$(settings_differences "$recorded" "$wanted")
    banner "the Ray head in $CONTAINER_NAME: its settings changed ($differences): restarting it with the new\
 ones (a running job ends)"
    stop_local_ray
  elif [[ -n "$addresses" ]]; then
    fail "Ray already runs in container $CONTAINER_NAME as part of the cluster at ${addresses//$'\n'/, },\
 not as the head $NODE_IP:$GCS_PORT; stop it first (ray stop in the container, or the ray-stop step)"
  elif tcp_open "$NODE_IP" "$GCS_PORT"; then
    fail "port $GCS_PORT on $NODE_IP is taken by something other than Ray in $CONTAINER_NAME\
 (listener: $(port_listener "$GCS_PORT"))"
  fi
}

start_head() {
  if [[ -n "$RAY_SPILL_DIR" ]]; then
    logged docker exec "$CONTAINER_NAME" mkdir -p "$RAY_SPILL_DIR"
  fi
  collect_container_env
  add_jemalloc_preload
  # Recorded, then started from the record by the function the container's main process restarts Ray with after
  # a reboot: both starts are the same (arguments, variables, jemalloc preload).
  record_ray_start head "$NODE_IP:$GCS_PORT" "${head_args[@]}"
  if [[ -n "${RAY_CUDA_VISIBLE_DEVICES+set}" ]]; then
    # Ray counts and hands out only these GPUs; its workers inherit the list and map Ray's ids through it. The
    # start record exports it (record_ray_start), so a restart after a reboot uses the same GPUs.
    banner "Ray on this node uses GPUs '$RAY_CUDA_VISIBLE_DEVICES' only (CUDA_VISIBLE_DEVICES)"
  fi
  logged launch_ray_in_container
}

gcs_answers() {
  tcp_open "$NODE_IP" "$GCS_PORT"
}

ray_status_works() {
  docker exec "$CONTAINER_NAME" ray status --address "$NODE_IP:$GCS_PORT"
}

wait_head_ready() {
  wait_for "the Ray GCS on $NODE_IP:$GCS_PORT" "$RAY_START_TIMEOUT_S" 1 gcs_answers
  wait_for "ray status on $NODE_IP:$GCS_PORT" "$RAY_START_TIMEOUT_S" 1 ray_status_works
  banner "Ray head is up: address $NODE_IP:$GCS_PORT, dashboard $DASHBOARD_HOST:$DASHBOARD_PORT"
}

run_step require_container "check that container $CONTAINER_NAME runs"
build_head_args
# The container's main process must not start Ray from an old record while this step works on it.
pause_ray_supervision
trap resume_ray_supervision EXIT
run_step check_existing_ray "look for Ray already running in $CONTAINER_NAME"
if [[ "$head_already_running" == false ]]; then
  run_step start_head "start the Ray head ($NUM_GPUS GPUs, GCS port $GCS_PORT, node rank $NODE_RANK)"
fi
run_step wait_head_ready "wait until the head answers"
