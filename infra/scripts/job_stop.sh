#!/usr/bin/env bash
# Step job-stop (on the head, at destroy, and before a changed job replaces this one): stop the training job so it
# does not write half a checkpoint while the nodes go away. Nothing to stop is success: on destroy the job may have
# finished, the container may be gone or Ray may be down already, and none of these may block `pulumi destroy`.
# A job that ends STOPPED or FAILED here is then deleted from Ray: job ids are derived from the configuration, so a
# revert (A, then B, then A again) submits A's id again, and the job step refuses an id Ray holds as STOPPED or
# FAILED. Its driver log stays on the head in Ray's session logs. A SUCCEEDED job is kept: the same configuration
# again does not train again.
#
# Environment:
#   CONTAINER_NAME           the head's training container                                             required
#   DASHBOARD_PORT           the dashboard / Jobs API port                                             required
#   JOB_ID                   the submission id                                                         required
#   JOB_STOP_TIMEOUT_S       bound on waiting for the job to reach a final state                       120

require_env CONTAINER_NAME DASHBOARD_PORT JOB_ID
JOB_STOP_TIMEOUT_S=${JOB_STOP_TIMEOUT_S:-120}
require_int DASHBOARD_PORT JOB_STOP_TIMEOUT_S

job_is_final() {
  [[ "$(job_state)" =~ ^(SUCCEEDED|FAILED|STOPPED|NOT_FOUND)$ ]]
}

stop_job() {
  local state
  if ! container_is_running; then
    banner "container $CONTAINER_NAME is not running: no job to stop"
    return 0
  fi
  if ! tcp_open 127.0.0.1 "$DASHBOARD_PORT"; then
    banner "nothing answers on the Jobs API port $DASHBOARD_PORT: Ray is down and the job with it"
    return 0
  fi
  state=$(job_state) || fail "could not read the state of job $JOB_ID from the Jobs API on port $DASHBOARD_PORT"
  case "$state" in
    NOT_FOUND)
      banner "there is no job $JOB_ID: nothing to stop"
      return 0
      ;;
    SUCCEEDED | FAILED | STOPPED)
      banner "job $JOB_ID has already finished ($state)"
      forget_ended_job "$state"
      return 0
      ;;
  esac
  banner "job $JOB_ID is $state: stopping it"
  logged docker exec "$CONTAINER_NAME" ray job stop --no-wait --address "http://127.0.0.1:$DASHBOARD_PORT" "$JOB_ID"
  wait_for "job $JOB_ID to stop" "$JOB_STOP_TIMEOUT_S" 2 job_is_final
  state=$(job_state)
  banner "job $JOB_ID is $state"
  forget_ended_job "$state"
}

# forget_ended_job STATE: delete a STOPPED or FAILED job from Ray, so that its id can be submitted again.
forget_ended_job() {
  case $1 in
    STOPPED | FAILED)
      job_client delete >>"$ROLL_CLUSTER_STEP_LOG" 2>&1 ||
        fail "could not delete the ended job $JOB_ID from Ray (a later submission of the same configuration would be refused)"
      banner "deleted job $JOB_ID ($1) from Ray: its id can be submitted again"
      ;;
  esac
}

run_step stop_job "stop job $JOB_ID"
