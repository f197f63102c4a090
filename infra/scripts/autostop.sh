#!/usr/bin/env bash
# Step autostop (on the head host): the watcher that stops an idle cluster (nodes.autostop).
#
# AUTOSTOP_ACTION=install (the Pulumi step) keeps a copy of this step's text (lib.sh, ray_common.sh and this file:
# BASH_EXECUTION_STRING of `bash -c`) and its settings on the host and starts it as a service that comes back
# with the host (systemd; without systemd, a detached process: install_watcher in lib.sh). AUTOSTOP_ACTION=watch
# is that service: every AUTOSTOP_POLL_S it reads the job's state (Jobs API) and the GPUs' utilisation, and once
#   - the job has ended (SUCCEEDED, FAILED, STOPPED, or gone) for AUTOSTOP_AFTER_JOB_MINUTES, or
#   - no job runs and every GPU has been idle for AUTOSTOP_IDLE_MINUTES
# it stops the cluster. On Alibaba (AUTOSTOP_MODE=instances) that is ECS StopInstances with StoppedMode
# StopCharging for INSTANCE_IDS, signed with the temporary credentials of the head's instance RAM role from the
# metadata service (never a long-lived key on a node; the role may stop only this stack's instances:
# infra/autostop.py). On your own hosts (AUTOSTOP_MODE=ray) it stops the job, which frees the GPUs, and never
# the machines; Ray's daemons stay (they hold no GPU, and the container's main process would start a stopped Ray
# again: container_main.sh), so the next job needs no Ray step.
#
# Environment:
#   AUTOSTOP_ACTION             install | watch | once (one decision, for tests) | remove         required
#   AUTOSTOP_MODE               instances | ray                                                    required
#   AUTOSTOP_AFTER_JOB_MINUTES  minutes after the job ended; 0: never for this reason              0
#   AUTOSTOP_IDLE_MINUTES       minutes with no job and idle GPUs; 0: never for this reason        0
#   AUTOSTOP_POLL_S             seconds between looks                                              60
#   CONTAINER_NAME, DASHBOARD_PORT, JOB_ID   the head's container and the job to watch             required
#   INSTANCE_IDS                space-separated ECS instance ids of this stack          required for instances
#   REGION_ID                   the region of the instances                             required for instances
#   RAM_ROLE                    the head's instance RAM role                            required for instances
#   ECS_ENDPOINT                ECS API endpoint                              https://ecs.$REGION_ID.aliyuncs.com
#   METADATA_URL                the instance metadata service                          http://100.100.100.200
#     (ECS_ENDPOINT, METADATA_URL and AUTOSTOP_POLL_S are test seams too: the program never sets them; the real-
#     host tier, tests/e2e/test_idle_and_reclaim.py, points them at stand-ins on the test network)
#   AUTOSTOP_STATE_DIR          where the watcher keeps its copy, settings and clock  /var/lib/roll-cluster-autostop

require_env AUTOSTOP_ACTION
AUTOSTOP_STATE_DIR=${AUTOSTOP_STATE_DIR:-/var/lib/roll-cluster-autostop}

# remove_watcher (at destroy; own hosts keep running): stop the service and forget its copy and settings.
remove_watcher() {
  if command -v systemctl >/dev/null 2>&1 && [[ -f "$SYSTEMD_UNIT_DIR/roll-cluster-autostop.service" ]]; then
    logged systemctl disable --now -- roll-cluster-autostop.service
    rm -f -- "$SYSTEMD_UNIT_DIR/roll-cluster-autostop.service"
  fi
  stop_detached_watcher "$AUTOSTOP_STATE_DIR"
  rm -rf -- "$AUTOSTOP_STATE_DIR"
}

if [[ "$AUTOSTOP_ACTION" == remove ]]; then
  run_step remove_watcher "remove the autostop watcher"
  exit 0
fi
require_env AUTOSTOP_MODE CONTAINER_NAME DASHBOARD_PORT JOB_ID
AUTOSTOP_AFTER_JOB_MINUTES=${AUTOSTOP_AFTER_JOB_MINUTES:-0}
AUTOSTOP_IDLE_MINUTES=${AUTOSTOP_IDLE_MINUTES:-0}
AUTOSTOP_POLL_S=${AUTOSTOP_POLL_S:-60}
METADATA_URL=${METADATA_URL:-http://100.100.100.200}
require_int AUTOSTOP_AFTER_JOB_MINUTES AUTOSTOP_IDLE_MINUTES AUTOSTOP_POLL_S DASHBOARD_PORT
if [[ "$AUTOSTOP_MODE" == instances ]]; then
  require_env INSTANCE_IDS REGION_ID RAM_ROLE
  ECS_ENDPOINT=${ECS_ENDPOINT:-https://ecs.$REGION_ID.aliyuncs.com}
fi
SETTINGS_NAMES=(AUTOSTOP_MODE AUTOSTOP_AFTER_JOB_MINUTES AUTOSTOP_IDLE_MINUTES AUTOSTOP_POLL_S CONTAINER_NAME
  DASHBOARD_PORT JOB_ID INSTANCE_IDS REGION_ID RAM_ROLE ECS_ENDPOINT METADATA_URL AUTOSTOP_STATE_DIR NODE_NAME)

install_autostop_watcher() {
  mkdir -p -- "$AUTOSTOP_STATE_DIR"
  chmod 700 -- "$AUTOSTOP_STATE_DIR"
  rm -f -- "$AUTOSTOP_STATE_DIR/ended_since" "$AUTOSTOP_STATE_DIR/idle_since" "$AUTOSTOP_STATE_DIR/stopped"
  install_watcher "autostop watcher" roll-cluster-autostop "roll-cluster autostop (stops this cluster when it idles)" \
    "docker.service network-online.target" 30 "$AUTOSTOP_STATE_DIR" AUTOSTOP_ACTION=watch "${SETTINGS_NAMES[@]}"
}

# gpus_idle: every GPU at 0 % utilisation (no nvidia-smi, e.g. Ascend: never idle by this test).
gpus_idle() {
  local load
  load=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits 2>/dev/null) || return 1
  [[ -n "$load" ]] && ! grep -qv -- '^ *0 *$' <<<"$load"
}

# minutes_since FILE: whole minutes since the time recorded in FILE (written when the condition began).
minutes_since() {
  local since
  since=$(cat -- "$1")
  echo $((($(date +%s) - since) / 60))
}

# decide: prints "stop: <why>" when the cluster should stop now, nothing otherwise; keeps the clocks.
decide() {
  local state ended=false idle=false
  state=$(JOB_CLIENT_TIMEOUT_S=60 job_state 2>/dev/null) || state=UNKNOWN
  case "$state" in
    SUCCEEDED | FAILED | STOPPED | NOT_FOUND) ended=true ;;
  esac
  if $ended && ((AUTOSTOP_AFTER_JOB_MINUTES > 0)); then
    [[ -f "$AUTOSTOP_STATE_DIR/ended_since" ]] || date +%s >"$AUTOSTOP_STATE_DIR/ended_since"
    if (($(minutes_since "$AUTOSTOP_STATE_DIR/ended_since") >= AUTOSTOP_AFTER_JOB_MINUTES)); then
      echo "stop: job $JOB_ID ended ($state) at least $AUTOSTOP_AFTER_JOB_MINUTES min ago"
      return 0
    fi
  elif ! $ended; then
    rm -f -- "$AUTOSTOP_STATE_DIR/ended_since"
  fi
  [[ "$state" == RUNNING || "$state" == PENDING ]] || ! gpus_idle || idle=true
  if $idle && ((AUTOSTOP_IDLE_MINUTES > 0)); then
    [[ -f "$AUTOSTOP_STATE_DIR/idle_since" ]] || date +%s >"$AUTOSTOP_STATE_DIR/idle_since"
    if (($(minutes_since "$AUTOSTOP_STATE_DIR/idle_since") >= AUTOSTOP_IDLE_MINUTES)); then
      echo "stop: no job running and the GPUs idle for at least $AUTOSTOP_IDLE_MINUTES min"
    fi
  elif ! $idle; then
    rm -f -- "$AUTOSTOP_STATE_DIR/idle_since"
  fi
}

# percent_encode TEXT: RFC 3986, as Alibaba's RPC signature requires (A-Z a-z 0-9 - _ . ~ kept).
percent_encode() {
  local text=$1 out="" char i
  for ((i = 0; i < ${#text}; i++)); do
    char=${text:i:1}
    case "$char" in
      [A-Za-z0-9._~-]) out+=$char ;;
      *) out+=$(printf '%%%02X' "'$char") ;;
    esac
  done
  printf '%s' "$out"
}

# json_field NAME: the string value of NAME in the JSON object on stdin (the metadata service's flat answer).
json_field() {
  sed -n -e "s/.*\"$1\" *: *\"\\([^\"]*\\)\".*/\\1/p" | head -n 1
}

# role_credentials: the RAM role's temporary credentials from the metadata service (STS; they rotate).
role_credentials() {
  local answer
  answer=$(curl -fsS --max-time 10 -- "$METADATA_URL/latest/meta-data/ram/security-credentials/$RAM_ROLE") ||
    fail "no credentials for the instance RAM role $RAM_ROLE from the metadata service"
  ACCESS_KEY_ID=$(json_field AccessKeyId <<<"$answer")
  ACCESS_KEY_SECRET=$(json_field AccessKeySecret <<<"$answer")
  SECURITY_TOKEN=$(json_field SecurityToken <<<"$answer")
  [[ -n "$ACCESS_KEY_ID" && -n "$ACCESS_KEY_SECRET" && -n "$SECURITY_TOKEN" ]] ||
    fail "the metadata service's answer for role $RAM_ROLE lacks AccessKeyId, AccessKeySecret or SecurityToken"
}

# stop_instances: ECS StopInstances (API version 2014-05-26, RPC signature v1, HMAC-SHA1) for INSTANCE_IDS.
stop_instances() {
  local -a params=() ids
  local query="" pair signature string_to_sign n=1 id
  role_credentials
  read -r -a ids <<<"$INSTANCE_IDS"
  params=("AccessKeyId=$ACCESS_KEY_ID" "Action=StopInstances" "Format=JSON" "RegionId=$REGION_ID"
    "SecurityToken=$SECURITY_TOKEN" "SignatureMethod=HMAC-SHA1" "SignatureNonce=$(date +%s%N)-$$"
    "SignatureVersion=1.0" "StoppedMode=StopCharging" "Timestamp=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    "Version=2014-05-26")
  for id in "${ids[@]}"; do
    params+=("InstanceId.$n=$id")
    n=$((n + 1))
  done
  while IFS= read -r pair; do
    query+="${query:+&}$(percent_encode "${pair%%=*}")=$(percent_encode "${pair#*=}")"
  done < <(printf '%s\n' "${params[@]}" | LC_ALL=C sort)
  string_to_sign="GET&%2F&$(percent_encode "$query")"
  signature=$(printf '%s' "$string_to_sign" | openssl dgst -sha1 -hmac "$ACCESS_KEY_SECRET&" -binary | base64)
  banner "stopping instances $INSTANCE_IDS (StopInstances, StopCharging) with role $RAM_ROLE"
  curl -fsS --max-time 60 -- "$ECS_ENDPOINT/?$query&Signature=$(percent_encode "$signature")" >>"$ROLL_STEP_LOG" ||
    fail "StopInstances was refused (see the answer above)"
}

# stop_job_on_hosts: own hosts: the machines and Ray's daemons stay up; the job stops and frees the GPUs.
stop_job_on_hosts() {
  banner "stopping job $JOB_ID (own hosts: the machines stay up)"
  # Tolerated: autostop acts only once the job is neither RUNNING nor PENDING, so there is nothing left to stop.
  # Ray answers a stop of an ended job with success (stopped: false); the command fails when the job is gone
  # (404 "Job ... does not exist": NOT_FOUND) or the Jobs API does not answer (Ray down: UNKNOWN), and neither
  # leaves a job to stop (ray/dashboard/modules/job/job_head.py stop_job, read on Ray's master branch; at
  # 2.48.0 UNCONFIRMED). The watcher must go on either way; `logged` keeps Ray's answer in its log.
  logged timeout -k 10 120 docker exec "$CONTAINER_NAME" ray job stop --address "http://127.0.0.1:$DASHBOARD_PORT" \
    -- "$JOB_ID" || true
}

act() {
  local why
  why=$(decide)
  [[ -n "$why" ]] || return 1
  banner "$why"
  if [[ "$AUTOSTOP_MODE" == instances ]]; then
    stop_instances
  else
    stop_job_on_hosts
  fi
  # Stopped once: the head goes down with the instances (or, on own hosts, the job is gone); until the step
  # installs the watcher again (the next `pulumi up` starts the head), asking again would only be refused.
  date +%s >"$AUTOSTOP_STATE_DIR/stopped"
}

watch_cluster() {
  mkdir -p -- "$AUTOSTOP_STATE_DIR"
  while true; do
    # Once stopped, nothing is left to stop until the step installs the watcher again (install clears it).
    # `|| true`: act returns 1 when nothing should stop yet (the usual poll). A stop that fails ends the watcher
    # through fail (exit): systemd starts it again (Restart=always); a detached watcher (no systemd) stays gone.
    [[ -f "$AUTOSTOP_STATE_DIR/stopped" ]] || act || true
    sleep "$AUTOSTOP_POLL_S"
  done
}

case "$AUTOSTOP_ACTION" in
  install) run_step install_autostop_watcher "install the autostop watcher" ;;
  watch) watch_cluster ;;
  once) mkdir -p -- "$AUTOSTOP_STATE_DIR" && act ;;
  *) fail "AUTOSTOP_ACTION must be install, watch or once; got '$AUTOSTOP_ACTION'" ;;
esac
