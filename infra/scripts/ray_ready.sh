#!/usr/bin/env bash
# Step ray-ready (on the head): the readiness gate. Training starts only when every node is in the cluster with
# all its GPUs: on an existing cluster ROLL does not wait for nodes (roll.md §4.2), and verl / OpenRLHF fail
# with "Total available GPUs ... is less than total desired GPUs" when a node is late.
#
# The gate wants the alive nodes to be exactly EXPECTED_NODE_IPS, each with exactly GPUS_PER_NODE GPUs. An
# unexpected alive node keeps the gate waiting: ROLL and verl place work on every GPU node Ray reports, and a
# departing node would take that work with it. Such a node is one the configuration no longer has: a node removed by
# a scale-in, whose instance and teardown Pulumi deletes only after every other step of the `up` has finished
# (pulumi deployment_executor.go performPostSteps), so never before this gate; or a replaced instance's raylet.
# The gate takes it out of the cluster itself: a task pinned to that node (NodeAffinitySchedulingStrategy, hard)
# removes its Ray start record, so the container's main process does not start Ray again, and runs a graceful
# `ray stop` there. The node's teardown, later, then finds Ray stopped.
#
# Environment:
#   CONTAINER_NAME           the head's training container                                             required
#   HEAD_IP                  the head's private IP (the GCS address)                                   required
#   GCS_PORT                 the GCS port                                                              required
#   EXPECTED_NODE_IPS        space-separated private IPs of all nodes, head included                   required
#   GPUS_PER_NODE            GPUs (or NPUs) every node must announce                                   required
#   HEAD_GPUS                GPUs the head must announce (fewer when some are the reward server's)   GPUS_PER_NODE
#   ACCELERATOR_RESOURCE     the Ray resource counted: GPU, or NPU on Ascend                           GPU
#   READY_TIMEOUT_S          bound on the whole wait                                                   900
#   READY_POLL_INTERVAL_S    seconds between looks at the cluster                                      2
#   RAY_RECORD_DIR           the Ray start record's directory in the containers (ray_common.sh)

require_env CONTAINER_NAME HEAD_IP GCS_PORT EXPECTED_NODE_IPS GPUS_PER_NODE
READY_TIMEOUT_S=${READY_TIMEOUT_S:-900}
ACCELERATOR_RESOURCE=${ACCELERATOR_RESOURCE:-GPU}
[[ "$ACCELERATOR_RESOURCE" =~ ^[A-Za-z_]+$ ]] || fail "ACCELERATOR_RESOURCE must be a resource name, got '$ACCELERATOR_RESOURCE'"
READY_POLL_INTERVAL_S=${READY_POLL_INTERVAL_S:-2}
HEAD_GPUS=${HEAD_GPUS:-$GPUS_PER_NODE}
require_int GCS_PORT GPUS_PER_NODE HEAD_GPUS READY_TIMEOUT_S READY_POLL_INTERVAL_S

gcs_answers() {
  tcp_open "$HEAD_IP" "$GCS_PORT"
}

wait_until_ready() {
  local started=$SECONDS status=0 remaining reason
  local lines_file="$ROLL_CLUSTER_LOG_DIR/$ROLL_CLUSTER_STEP.lines"
  poll_until "$READY_TIMEOUT_S" 1 gcs_answers ||
    fail "the Ray GCS $HEAD_IP:$GCS_PORT is unreachable after ${READY_TIMEOUT_S}s"
  remaining=$((READY_TIMEOUT_S - (SECONDS - started)))
  ((remaining > 0)) || remaining=1
  # The driver, ray_ready.py (HELPER_RAY_READY), with the container's python3: it connects once and reads the
  # cluster until it matches, printing one line per change. `timeout` bounds it even if connecting to Ray hangs; the
  # driver bounds its own wait.
  timeout "$((remaining + 120))" docker exec -i "$CONTAINER_NAME" python3 - <"$HELPER_RAY_READY" \
    "$HEAD_IP:$GCS_PORT" "$EXPECTED_NODE_IPS" "$GPUS_PER_NODE" "$remaining" "$READY_POLL_INTERVAL_S" "$ACCELERATOR_RESOURCE" \
    "$HEAD_GPUS" "$RAY_RECORD_DIR" \
    2>>"$ROLL_CLUSTER_STEP_LOG" | banner_lines "$lines_file" || status=$?
  if ((status != 0)); then
    reason=$(tail -n 1 "$lines_file")
    [[ "$reason" == "not ready: "* ]] || reason="the check exited $status (last said: ${reason:-nothing})"
    fail "cluster not ready after ${READY_TIMEOUT_S}s: ${reason#not ready: }"
  fi
}

run_step require_container "check that container $CONTAINER_NAME runs"
run_step wait_until_ready "wait until nodes ${EXPECTED_NODE_IPS} are alive with $GPUS_PER_NODE ${ACCELERATOR_RESOURCE}s each\
 (the head $HEAD_GPUS)"
