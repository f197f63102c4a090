#!/usr/bin/env bash
# Step job-submit (on the head): write the job's files into the container, prepare, check, then submit the
# training job through the Ray Jobs API of the head (the driver runs on the head, in the container).
#
# Environment:
#   CONTAINER_NAME           the head's training container                                             required
#   DASHBOARD_PORT           the dashboard / Jobs API port (reached at 127.0.0.1 on the head)          required
#   JOB_ID                   the submission id; [A-Za-z0-9._-], unique per configuration              required
#   JOB_WORKDIR              directory in the container the entrypoint runs from (unless the runtime
#                            env has a working_dir: then Ray's unpacked copy of it)                     required
#   JOB_ENTRYPOINT           shell command of the driver, run with bash exactly as written              required
#   JOB_RUNTIME_ENV_JSON     Ray runtime_env as JSON; a relative working_dir is relative to JOB_WORKDIR empty
#   JOB_FILES_B64            base64 of a gzipped tar whose member paths are relative to / in the
#                            container (infra.ray.step_env.files_archive_b64), written before anything
#                            else, e.g. the generated ROLL YAML                                        empty
#   JOB_PREPARE              shell command run in JOB_WORKDIR before submission (data preparation);
#                            it must be idempotent itself                                              empty
#   JOB_PRE_SUBMIT_CHECK     shell command that must succeed before submission (a config check)       empty
#   JOB_HEAD_IP              the head's private IP, exported to the entrypoint's shell as
#                            ROLL_CLUSTER_HEAD_IP (OpenRLHF's reward URL names the head by it)          empty
#   RAY_EXTRA_ENV_NAMES      names of exported variables passed to JOB_PREPARE and the check           empty
#   JOB_API_TIMEOUT_S        bound on waiting for the Jobs API to answer                               300
#   JOB_START_TIMEOUT_S      bound on waiting for the job to leave PENDING; a job still PENDING then
#                            (Ray may be installing its runtime env) is reported, not failed           60
#   JOB_SETTLE_S             seconds a RUNNING job is watched for an immediate failure                 10
#   JOB_POLL_INTERVAL_S      seconds between looks at the job                                          2
#   JOB_CHECKPOINT_LAYOUT    roll | verl | openrlhf | megatron: before submitting, look for the newest complete checkpoint
#                            of the job (checkpoint_find.sh) and hand its path to the entrypoint's shell as
#                            ROLL_CLUSTER_RESUME_FROM (and to jobStatus in the job's metadata); empty: no resume  empty
#   JOB_CHECKPOINT_DIR       the job's checkpoint directory in the container                           with a layout
#   JOB_CHECKPOINT_WORLD     OpenRLHF: the actor's GPUs, one optimizer shard each (0: not checked)     0
#   JOB_CHECKPOINT_STAGING   ROLL: its local save folder (output_dir), where a failed copy is left
#                            behind: a checkpoint with a copy left there is not complete               empty
#   JOB_FIRST_STEP_PATTERN   ERE of the line the framework prints when a training step is done: the start gate
#                            waits for it; empty: no gate, the job is watched for JOB_SETTLE_S only   empty
#   JOB_DOWNLOAD_PATTERN     ERE of a model/data download line: the phase the gate reports             empty
#   JOB_START_GATE_S         the gate's bound, counted from the start of this step (preparation and the
#                            job's downloads included): past it the step fails, the job keeps running 3600
#   JOB_STALL_S              the gate also fails a RUNNING job whose log has not grown for this many
#                            seconds (a hang before the first step): it stops the job and shows its log
#                            tail; 0: not watched                                                       1200
#   JOB_STOP_WAIT_S          bound on waiting for such a job to reach a final state once stopped       120
#   JOB_GATE_POLL_S          seconds between the gate's looks at the job's state and log               5
#   JOB_GATE_REPORT_S        seconds between the gate's progress lines (they keep pulumi's output alive;
#                            at most 60: one a minute whatever the poll or a slow Jobs API answer)     60
#   JOB_GATE_CLIENT_TIMEOUT_S bound on each of the gate's Jobs API calls, so that a progress line
#                            still comes every minute                                                  45
#   JOB_SUBMIT_ATTEMPTS      submissions of a job that fails before its entrypoint ran because Ray placed
#                            its supervisor on a node that had just died (see supervisor_lost)          3
#   JOB_RESUBMIT_DELAY_S     pause before such a resubmission                                          5
#   SUBMITTED_JOBS_DIR       where the step marks, in the container, each job id it submitted or found
#                            (jobStatus tells a job Ray lost from one never submitted by it)           /var/lib/roll-cluster/jobs
#   REWARD_*                 see reward_server.sh, which runs before this script when given

require_env CONTAINER_NAME DASHBOARD_PORT JOB_ID JOB_WORKDIR JOB_ENTRYPOINT
JOB_RUNTIME_ENV_JSON=${JOB_RUNTIME_ENV_JSON:-}
JOB_FILES_B64=${JOB_FILES_B64:-}
JOB_PREPARE=${JOB_PREPARE:-}
JOB_PRE_SUBMIT_CHECK=${JOB_PRE_SUBMIT_CHECK:-}
JOB_HEAD_IP=${JOB_HEAD_IP:-}
JOB_API_TIMEOUT_S=${JOB_API_TIMEOUT_S:-300}
JOB_START_TIMEOUT_S=${JOB_START_TIMEOUT_S:-60}
JOB_SETTLE_S=${JOB_SETTLE_S:-10}
JOB_POLL_INTERVAL_S=${JOB_POLL_INTERVAL_S:-2}
JOB_SUBMIT_ATTEMPTS=${JOB_SUBMIT_ATTEMPTS:-3}
JOB_RESUBMIT_DELAY_S=${JOB_RESUBMIT_DELAY_S:-5}
SUBMITTED_JOBS_DIR=${SUBMITTED_JOBS_DIR:-/var/lib/roll-cluster/jobs}
JOB_CHECKPOINT_LAYOUT=${JOB_CHECKPOINT_LAYOUT:-}
JOB_CHECKPOINT_DIR=${JOB_CHECKPOINT_DIR:-}
JOB_CHECKPOINT_WORLD=${JOB_CHECKPOINT_WORLD:-0}
JOB_CHECKPOINT_STAGING=${JOB_CHECKPOINT_STAGING:-}
JOB_FIRST_STEP_PATTERN=${JOB_FIRST_STEP_PATTERN:-}
JOB_DOWNLOAD_PATTERN=${JOB_DOWNLOAD_PATTERN:-}
JOB_START_GATE_S=${JOB_START_GATE_S:-3600}
JOB_GATE_POLL_S=${JOB_GATE_POLL_S:-5}
JOB_GATE_REPORT_S=${JOB_GATE_REPORT_S:-60}
JOB_STALL_S=${JOB_STALL_S:-1200}
JOB_STOP_WAIT_S=${JOB_STOP_WAIT_S:-120}
JOB_GATE_CLIENT_TIMEOUT_S=${JOB_GATE_CLIENT_TIMEOUT_S:-45}
require_int DASHBOARD_PORT JOB_API_TIMEOUT_S JOB_START_TIMEOUT_S JOB_SETTLE_S JOB_POLL_INTERVAL_S \
  JOB_SUBMIT_ATTEMPTS JOB_RESUBMIT_DELAY_S JOB_CHECKPOINT_WORLD JOB_START_GATE_S JOB_GATE_POLL_S JOB_GATE_REPORT_S \
  JOB_STALL_S JOB_STOP_WAIT_S JOB_GATE_CLIENT_TIMEOUT_S
((JOB_GATE_REPORT_S <= 60)) || JOB_GATE_REPORT_S=60
[[ -z "$JOB_CHECKPOINT_LAYOUT" || "$JOB_CHECKPOINT_DIR" == /* ]] ||
  fail "JOB_CHECKPOINT_DIR must be an absolute path with JOB_CHECKPOINT_LAYOUT $JOB_CHECKPOINT_LAYOUT: $JOB_CHECKPOINT_DIR"
JOB_RESUME_FROM=''
export JOB_ENTRYPOINT JOB_WORKDIR JOB_RUNTIME_ENV_JSON JOB_HEAD_IP JOB_RESUME_FROM

[[ "$JOB_ID" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || fail "JOB_ID may hold only letters, digits, '.', '_' and '-': $JOB_ID"

job_exists=false
existing_state=''

jobs_api_answers() {
  job_client ping
}

wait_for_jobs_api() {
  wait_for "the Ray Jobs API on 127.0.0.1:$DASHBOARD_PORT" "$JOB_API_TIMEOUT_S" 2 jobs_api_answers
}

check_existing_job() {
  local state
  state=$(job_state) || fail "could not read the state of job $JOB_ID from the Jobs API on port $DASHBOARD_PORT"
  case "$state" in
    NOT_FOUND) ;;
    PENDING | RUNNING | SUCCEEDED)
      job_exists=true
      existing_state=$state
      mark_job_submitted
      banner "job $JOB_ID already exists ($state): not submitting it again"
      ;;
    FAILED | STOPPED)
      job_log_tail
      fail "job $JOB_ID already exists and is $state. Fix the cause, then delete the job (ray job delete $JOB_ID in\
 container $CONTAINER_NAME) or give the job a new id, and run again"
      ;;
    *) fail "job $JOB_ID is in a state this step does not know: $state" ;;
  esac
}

extract_job_files() {
  base64 -d <<<"$JOB_FILES_B64" | docker exec -i "$CONTAINER_NAME" tar -xzf - -C / --no-same-owner
}

write_job_files() {
  local names
  names=$(base64 -d <<<"$JOB_FILES_B64" | tar -tzf - | sed 's|^|/|' | paste -sd ' ' -) ||
    fail "JOB_FILES_B64 is not a base64-encoded tar.gz"
  logged extract_job_files
  banner "wrote $names"
}

prepare_job() {
  collect_container_env
  logged exec_with_env -w "$JOB_WORKDIR" -- bash -c "$JOB_PREPARE"
}

check_before_submit() {
  collect_container_env
  printf '+ %s\n' "$JOB_PRE_SUBMIT_CHECK" >>"$ROLL_CLUSTER_STEP_LOG"
  exec_with_env -w "$JOB_WORKDIR" -- bash -c "$JOB_PRE_SUBMIT_CHECK" >>"$ROLL_CLUSTER_STEP_LOG" 2>&1 ||
    fail "the pre-submit check failed, the job was not submitted: $JOB_PRE_SUBMIT_CHECK"
}

# find_checkpoint: the newest complete checkpoint of this job (checkpoint_find.sh, run in the container, where the
# checkpoint directory is), handed to submit_job as JOB_RESUME_FROM; none: the job starts fresh, said here.
find_checkpoint() {
  local found
  # shellcheck disable=SC2016 # "$@" expands in the container's shell
  found=$(docker exec "$CONTAINER_NAME" bash -c "$(declare -f latest_checkpoint)"$'\n''latest_checkpoint "$@"' \
    find "$JOB_CHECKPOINT_LAYOUT" "$JOB_CHECKPOINT_DIR" "$JOB_CHECKPOINT_WORLD" "$JOB_CHECKPOINT_STAGING" \
    2>>"$ROLL_CLUSTER_STEP_LOG") ||
    fail "could not look for checkpoints of job $JOB_ID under $JOB_CHECKPOINT_DIR in container $CONTAINER_NAME"
  if [[ -z "$found" ]]; then
    banner "job $JOB_ID starts fresh: no complete $JOB_CHECKPOINT_LAYOUT checkpoint under $JOB_CHECKPOINT_DIR"
    return 0
  fi
  # Our checkpoint directories are made of these characters (infra/layout.py path_part); the entrypoints write
  # the path into a YAML line and a Hydra argument.
  [[ "$found" =~ ^/[A-Za-z0-9._/-]+$ ]] || fail "job $JOB_ID: the checkpoint path found is not a plain path: $found"
  JOB_RESUME_FROM=$found
  banner "job $JOB_ID resumes from $JOB_RESUME_FROM"
}

submit_job() {
  banner "entrypoint: $JOB_ENTRYPOINT"
  logged job_client submit -w "$JOB_WORKDIR" -e JOB_ENTRYPOINT -e JOB_WORKDIR -e JOB_RUNTIME_ENV_JSON -e JOB_HEAD_IP \
    -e JOB_RESUME_FROM
  mark_job_submitted
}

# mark_job_submitted: the job id, in the container (kept across its restarts): jobStatus says LOST, not "never
# submitted", when the head's Ray no longer knows a job marked here; and on the host, for the autostop watcher.
mark_job_submitted() {
  # shellcheck disable=SC2016 # $1 and $2 expand in the container's shell
  logged docker exec "$CONTAINER_NAME" sh -c 'mkdir -p "$1" && : >"$1/$2"' mark "$SUBMITTED_JOBS_DIR" "$JOB_ID"
  record_current_job
}

# supervisor_lost: the job FAILED before its entrypoint ran because Ray placed its supervisor actor on a node that
# had died. A node that rebooted is still counted alive by the head until Ray's health check gives up on it (some
# 15 s), and a job submitted then can land there: seen on the real-host tier with Ray 2.48.0, whose message says
# "The actor died because its node has died" and "The actor never ran". Transient: the same job, submitted again
# once that node is marked dead, runs. Anything else (the entrypoint ran and failed) is not retried.
supervisor_lost() {
  local message
  message=$(job_client message 2>>"$ROLL_CLUSTER_STEP_LOG") || return 1
  printf 'job message: %s\n' "$message" >>"$ROLL_CLUSTER_STEP_LOG"
  grep -q -e 'its node has died' -e 'node was terminated unexpectedly' <<<"$message" &&
    grep -q -e 'never ran' <<<"$message"
}

# lost_before_start STATE: true, with JOB_LOST_BEFORE_START set for the caller, when the job is FAILED because its
# supervisor was lost before it ran (supervisor_lost); both waits below return then, and the job is submitted again.
lost_before_start() {
  if [[ "$1" == FAILED ]] && supervisor_lost; then
    JOB_LOST_BEFORE_START=true
    return 0
  fi
  return 1
}

# wait_job_started: fail when the job fails at once (a bad entrypoint, a missing module); a job that is still
# RUNNING after JOB_SETTLE_S, or SUCCEEDED, is fine; one still PENDING at the bound is reported, not failed.
# A job whose supervisor was lost before it ran (supervisor_lost) sets JOB_LOST_BEFORE_START for the caller.
JOB_LOST_BEFORE_START=false
wait_job_started() {
  local state started=$SECONDS running_since=''
  while true; do
    state=$(job_state) || fail "could not read the state of job $JOB_ID"
    case "$state" in
      PENDING | NOT_FOUND) ;;
      RUNNING) running_since=${running_since:-$SECONDS} ;;
      SUCCEEDED)
        banner "job $JOB_ID has already SUCCEEDED"
        return 0
        ;;
      FAILED | STOPPED)
        if lost_before_start "$state"; then return 0; fi
        job_log_tail
        fail "job $JOB_ID is $state right after its submission"
        ;;
      *) fail "job $JOB_ID is in a state this step does not know: $state" ;;
    esac
    if [[ -n "$running_since" ]] && ((SECONDS - running_since >= JOB_SETTLE_S)); then
      banner "job $JOB_ID is RUNNING"
      return 0
    fi
    if [[ -z "$running_since" ]] && ((SECONDS - started >= JOB_START_TIMEOUT_S)); then
      banner "job $JOB_ID is still $state after ${JOB_START_TIMEOUT_S}s (Ray may still be setting up its runtime env)"
      return 0
    fi
    sleep "$JOB_POLL_INTERVAL_S"
  done
}

# first_step_in LOG: the step number of the last first-step line in LOG (the first integer of the match), or nothing.
first_step_in() {
  # `|| true`: grep exits 1 when no line matches (no step logged yet), which is the answer "nothing".
  grep -oE -- "$JOB_FIRST_STEP_PATTERN" <<<"$1" | tail -n 1 | grep -oE '[0-9]+' | head -n 1 || true
}

job_is_final() {
  case "$(job_state)" in SUCCEEDED | FAILED | STOPPED | NOT_FOUND) return 0 ;; esac
  return 1
}

# stop_stalled_job WHY: the gate gave up on a job that makes no progress: its log tail for fail, then Ray stops it
# (its GPUs are free again; its checkpoints stay), at most JOB_STOP_WAIT_S.
stop_stalled_job() {
  job_log_tail
  banner "job $JOB_ID $1: stopping it"
  logged job_client stop || fail "job $JOB_ID $1, and asking Ray to stop it failed (jobStop stops it)"
  POLL_WHAT="job $JOB_ID to stop" poll_until "$JOB_STOP_WAIT_S" 2 job_is_final ||
    fail "job $JOB_ID $1, and it is still $(job_state || true) ${JOB_STOP_WAIT_S}s after Ray was asked to stop it"
}

# wait_first_step: the start gate. Returns once the job printed its framework's first-step line (or SUCCEEDED);
# fails, with the job's log tail, when the job FAILED or STOPPED first, when a RUNNING job's log has not grown for
# JOB_STALL_S (the job is stopped then), or when JOB_START_GATE_S passed since this step started (the job keeps
# running then: it may still be downloading). One loop: every pass reads the state and the log once, and a
# progress line comes at least every JOB_GATE_REPORT_S (<= 60 s: each Jobs API call is bounded by
# JOB_GATE_CLIENT_TIMEOUT_S). A job whose supervisor was lost before it ran (supervisor_lost) sets
# JOB_LOST_BEFORE_START for the caller, as wait_job_started does.
wait_first_step() {
  # reported: the first pass prints a progress line at once, then one every JOB_GATE_REPORT_S.
  local state log read_log step phase=pending reported=$((SECONDS - JOB_GATE_REPORT_S)) size=-1 grown_at=''
  # shellcheck disable=SC2034 # job_client (ray_common.sh) reads it: every Jobs API call of the gate is bounded
  local JOB_CLIENT_TIMEOUT_S=$JOB_GATE_CLIENT_TIMEOUT_S
  while true; do
    state=$(job_state) || fail "could not read the state of job $JOB_ID"
    case "$state" in
      PENDING | NOT_FOUND) phase=pending ;;
      RUNNING | SUCCEEDED)
        read_log=true
        log=$(job_client logs 2>>"$ROLL_CLUSTER_STEP_LOG") || { log='' read_log=false; }
        step=$(first_step_in "$log")
        if [[ -n "$step" ]]; then
          banner "job $JOB_ID reached training step $step, ${SECONDS}s after this step started"
          return 0
        fi
        if [[ "$state" == SUCCEEDED ]]; then
          banner "job $JOB_ID SUCCEEDED without printing a training step line (/$JOB_FIRST_STEP_PATTERN/)"
          return 0
        fi
        phase=starting
        if [[ -n "$JOB_DOWNLOAD_PATTERN" ]] && tail -n 20 <<<"$log" | grep -qE -- "$JOB_DOWNLOAD_PATTERN"; then
          phase=downloading
        fi
        # Progress is any new output (a download's progress bar included), counted from the first RUNNING look; a
        # log the Jobs API did not hand over this time is no news either way.
        if [[ "$read_log" == true ]] && ((${#log} != size)); then
          size=${#log} grown_at=$SECONDS
        fi
        ;;
      FAILED | STOPPED)
        if lost_before_start "$state"; then return 0; fi
        job_log_tail
        fail "job $JOB_ID is $state before its first training step (it was $phase); the end of its log is above"
        ;;
      *) fail "job $JOB_ID is in a state this step does not know: $state" ;;
    esac
    if [[ -n "$grown_at" ]] && ((JOB_STALL_S > 0 && SECONDS - grown_at >= JOB_STALL_S)); then
      stop_stalled_job "has printed nothing for $((SECONDS - grown_at))s before its first training step"
      fail "job $JOB_ID made no progress: no new log output for $((SECONDS - grown_at))s (training.noProgressMinutes:\
 ${JOB_STALL_S}s) while $phase, before its first training step; it was stopped, the end of its log is\
 above. Fix the cause, delete the job (ray job delete $JOB_ID in container $CONTAINER_NAME) and run again"
    fi
    if ((SECONDS >= JOB_START_GATE_S)); then
      job_log_tail
      fail "job $JOB_ID has not reached its first training step within ${JOB_START_GATE_S}s of this step\
 (training.startTimeoutMinutes): it is $phase and keeps running (jobStatus, jobLogs; jobStop stops it)"
    fi
    if ((SECONDS - reported >= JOB_GATE_REPORT_S)); then
      banner "job $JOB_ID: $phase, ${SECONDS}s of ${JOB_START_GATE_S}s${grown_at:+, last output $((SECONDS - grown_at))s ago}"
      reported=$SECONDS
    fi
    sleep "$JOB_GATE_POLL_S"
  done
}

gated() {
  [[ -n "$JOB_FIRST_STEP_PATTERN" ]] && ((JOB_START_GATE_S > 0))
}

run_step require_container "check that container $CONTAINER_NAME runs"
run_step wait_for_jobs_api "wait for the Ray Jobs API"
run_step check_existing_job "look for job $JOB_ID"
if [[ "$job_exists" == false ]]; then
  [[ -z "$JOB_FILES_B64" ]] || run_step write_job_files "write the job's files into $CONTAINER_NAME"
  [[ -z "$JOB_PREPARE" ]] || run_step prepare_job "prepare the job: $JOB_PREPARE"
  [[ -z "$JOB_PRE_SUBMIT_CHECK" ]] || run_step check_before_submit "check before submitting: $JOB_PRE_SUBMIT_CHECK"
  [[ -z "$JOB_CHECKPOINT_LAYOUT" ]] || run_step find_checkpoint "find the newest checkpoint of job $JOB_ID"
  for ((attempt = 1; ; attempt++)); do
    JOB_LOST_BEFORE_START=false
    run_step submit_job "submit job $JOB_ID"
    if gated; then
      run_step wait_first_step "wait until job $JOB_ID reaches its first training step (at most ${JOB_START_GATE_S}s)"
    else
      run_step wait_job_started "wait until job $JOB_ID runs"
    fi
    [[ "$JOB_LOST_BEFORE_START" == true ]] || break
    if ((attempt >= JOB_SUBMIT_ATTEMPTS)); then
      job_log_tail
      fail "job $JOB_ID failed before it ran, $attempt times: Ray placed its supervisor on a node that had died (see the job message above); check \`ray status\` on the head"
    fi
    banner "job $JOB_ID failed before it ran: Ray placed its supervisor on a node that had just died; deleting it and submitting it again in ${JOB_RESUBMIT_DELAY_S}s (attempt $((attempt + 1))/$JOB_SUBMIT_ATTEMPTS)"
    logged job_client delete
    sleep "$JOB_RESUBMIT_DELAY_S"
  done
elif [[ "$existing_state" != SUCCEEDED ]] && gated; then
  # A job an earlier `pulumi up` submitted and left before its first step (an interrupted or failed gate).
  run_step wait_first_step "wait until job $JOB_ID reaches its first training step (at most ${JOB_START_GATE_S}s)"
fi
