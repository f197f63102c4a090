#!/usr/bin/env bash
# Step autostop (on the head host): the watcher that stops an idle cluster (nodes.autostop).
#
# AUTOSTOP_ACTION=install (the Pulumi step) installs Alibaba's Python SDK in a virtualenv of its own (instances
# mode; install_sdk, skipped when the same requirements are already there), keeps a copy of this step's text (lib.sh,
# ray_common.sh and this file: BASH_EXECUTION_STRING of `bash -c`), the stopper (stop_instances.py) and its settings
# on the host, and starts the watcher as a service that comes back with the host (systemd; without systemd, a
# detached process: install_watcher in lib.sh). AUTOSTOP_ACTION=watch is that service: every AUTOSTOP_POLL_S it
# reads the state of the current job (the id the job step recorded on this host: CURRENT_JOB_FILE, ray_common.sh)
# and the GPUs' utilisation, and once
#   - the job has ended (SUCCEEDED, FAILED, STOPPED, or gone) for AUTOSTOP_AFTER_JOB_MINUTES, or
#   - no job runs and every GPU has been idle for AUTOSTOP_IDLE_MINUTES
# it stops the cluster. On Alibaba (AUTOSTOP_MODE=instances) that is ECS StopInstances (StopCharging, SuccessFirst)
# for INSTANCE_IDS through Alibaba's SDK (stop_instances.py), with the temporary credentials of the head's
# instance RAM role from the metadata service (never a long-lived key on a node; the role may stop only this
# stack's instances: infra/autostop.py). On your own hosts (AUTOSTOP_MODE=ray) it stops the job, which frees the
# GPUs, and never the machines; Ray's daemons stay (they hold no GPU, and the container's main process would start
# a stopped Ray again: container_main.sh), so the next job needs no Ray step.
#
# Its clocks start again at every install and every boot, and after a boot it does nothing until the step installs
# it again: the `pulumi up` that resumes a paused cluster re-forms it (Ray, the job) and then runs this step (its
# trigger is the head's start time). Until then the job and the GPUs say nothing about the cluster's use.
#
# Environment:
#   AUTOSTOP_ACTION             install | watch | once (one decision, for tests) | sdk (only the SDK) | remove  required
#   AUTOSTOP_MODE               instances | ray                                                    required
#   AUTOSTOP_AFTER_JOB_MINUTES  minutes after the job ended; 0: never for this reason              0
#   AUTOSTOP_IDLE_MINUTES       minutes with no job and idle GPUs; 0: never for this reason        0
#   AUTOSTOP_POLL_S             seconds between looks                                              60
#   CONTAINER_NAME, DASHBOARD_PORT   the head's container and its Jobs API port                  required
#   INSTANCE_IDS                space-separated ECS instance ids of this stack          required for instances
#   REGION_ID                   the region of the instances                             required for instances
#   RAM_ROLE                    the head's instance RAM role                            required for instances
#   STOPPED_MODE                StopCharging | KeepCharging (a family without economical mode)   StopCharging
#   AUTOSTOP_STOPPER_B64        stop_instances.py, base64 (one line)                    required for instances
#   AUTOSTOP_SDK_REQUIREMENTS_B64  autostop-requirements.txt (the pinned SDK), base64   required for install, sdk
#   PIP_INDEX_URL               the index pip installs the SDK from; empty: pip's own configuration   empty
#   ECS_ENDPOINT                ECS API endpoint                              https://ecs.$REGION_ID.aliyuncs.com
#   METADATA_URL                the instance metadata service                          http://100.100.100.200
#   AUTOSTOP_SDK_DIR            the SDK's virtualenv                              /opt/roll-cluster/autostop-sdk
#   BOOT_ID_FILE                what names this boot                         /proc/sys/kernel/random/boot_id
#     (ECS_ENDPOINT, METADATA_URL, AUTOSTOP_POLL_S, AUTOSTOP_SDK_DIR and BOOT_ID_FILE are test seams too:
#     the program never sets them; the tests point them at stand-ins, a prepared SDK and a boot they control)
#   AUTOSTOP_STATE_DIR          where the watcher keeps its copy, settings and clock  /var/lib/roll-cluster-autostop

require_env AUTOSTOP_ACTION
AUTOSTOP_STATE_DIR=${AUTOSTOP_STATE_DIR:-/var/lib/roll-cluster-autostop}
AUTOSTOP_SDK_DIR=${AUTOSTOP_SDK_DIR:-/opt/roll-cluster/autostop-sdk}
BOOT_ID_FILE=${BOOT_ID_FILE:-/proc/sys/kernel/random/boot_id}
PIP_INDEX_URL=${PIP_INDEX_URL:-}
CLOCKS=(ended_since idle_since stopped)

# remove_watcher (at destroy; own hosts keep running): stop the service and forget its copy and settings.
remove_watcher() {
  if command -v systemctl >/dev/null 2>&1 && [[ -f "$SYSTEMD_UNIT_DIR/roll-cluster-autostop.service" ]]; then
    logged systemctl disable --now -- roll-cluster-autostop.service
    rm -f -- "$SYSTEMD_UNIT_DIR/roll-cluster-autostop.service"
  fi
  stop_detached_watcher "$AUTOSTOP_STATE_DIR"
  rm -rf -- "$AUTOSTOP_STATE_DIR"
}

# sdk_requirements_hash: the SHA-256 of the requirements this step carries.
sdk_requirements_hash() {
  base64 -d <<<"$AUTOSTOP_SDK_REQUIREMENTS_B64" | sha256sum | cut -d ' ' -f 1
}

# sdk_ready: the virtualenv holds the SDK of exactly these requirements (its marker: their SHA-256).
sdk_ready() {
  [[ -x "$AUTOSTOP_SDK_DIR/bin/python" && -f "$AUTOSTOP_SDK_DIR/requirements.sha256" ]] &&
    [[ "$(cat -- "$AUTOSTOP_SDK_DIR/requirements.sha256")" == "$(sdk_requirements_hash)" ]]
}

pip_install_sdk() {
  local index=()
  [[ -z "$PIP_INDEX_URL" ]] || index=(-i "$PIP_INDEX_URL")
  log_cmd timeout -k 10 600 "$AUTOSTOP_SDK_DIR/bin/python" -m pip install --disable-pip-version-check \
    --progress-bar off "${index[@]}" -r "$AUTOSTOP_SDK_DIR/requirements.txt"
}

# host_python: the path of a Python 3.8 or newer on the host (the SDK needs 3.7; stop_instances.py is written for
# 3.8). Alibaba Cloud Linux 3's python3 is 3.6 (its platform Python, as RHEL 8's); Ubuntu 22.04's is 3.10.
host_python() {
  local candidate version
  for candidate in python3.12 python3.11 python3.10 python3.9 python3.8 python3; do
    command -v -- "$candidate" >/dev/null 2>&1 || continue
    # `Python 3.10.12` (Python 2 says it on stderr)
    version=$("$candidate" --version 2>&1) || continue
    if [[ "$version" =~ ^Python\ ([0-9]+)\.([0-9]+) ]] &&
      ((BASH_REMATCH[1] > 3 || (BASH_REMATCH[1] == 3 && BASH_REMATCH[2] >= 8))); then
      command -v -- "$candidate"
      return 0
    fi
  done
  return 1
}

# install_host_python: what host_python needs. Alibaba Cloud Linux 3: python39 from its AppStream (RHEL 8 names
# the package so; that Alibaba Cloud Linux 3 carries it: UNCONFIRMED). Ubuntu: python3-venv (its python3 lacks
# venv and ensurepip without it).
install_host_python() {
  detect_os
  case "$PKG_FAMILY" in
    rpm) install_packages python39 ;;
    apt) install_packages python3 python3-venv ;;
  esac
}

# install_sdk: Alibaba's Python SDK (autostop-requirements.txt) in a virtualenv of the host's Python, once per
# set of requirements; the marker is written last, so an interrupted install is done again.
install_sdk() {
  local python
  require_env AUTOSTOP_SDK_REQUIREMENTS_B64
  # It is removed and made again below: never a path that could be anything else.
  [[ "$AUTOSTOP_SDK_DIR" =~ ^/[A-Za-z0-9._-]+/[A-Za-z0-9._/-]+$ && "$AUTOSTOP_SDK_DIR" != *..* ]] ||
    fail "AUTOSTOP_SDK_DIR must be an absolute path two levels deep or more, of letters, digits, '.', '_', '-'; got '$AUTOSTOP_SDK_DIR'"
  if sdk_ready; then
    banner "Alibaba's SDK already in $AUTOSTOP_SDK_DIR; skipped"
    return 0
  fi
  if ! python=$(host_python) || ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    install_host_python
    python=$(host_python) || fail "no Python 3.8 or newer on this host for the autostop stopper, even after installing one"
    "$python" -c 'import ensurepip, venv' >/dev/null 2>&1 ||
      fail "$python on this host cannot make a virtualenv (no venv/ensurepip module)"
  fi
  rm -rf -- "$AUTOSTOP_SDK_DIR"
  mkdir -p -- "$AUTOSTOP_SDK_DIR"
  logged "$python" -m venv -- "$AUTOSTOP_SDK_DIR"
  base64 -d <<<"$AUTOSTOP_SDK_REQUIREMENTS_B64" >"$AUTOSTOP_SDK_DIR/requirements.txt"
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" pip_install_sdk ||
    fail "pip could not install Alibaba's SDK (autostop-requirements.txt) in $AUTOSTOP_SDK_DIR"
  logged "$AUTOSTOP_SDK_DIR/bin/python" -c 'import aliyunsdkcore.client, aliyunsdkecs.request.v20140526.StopInstancesRequest'
  sdk_requirements_hash >"$AUTOSTOP_SDK_DIR/requirements.sha256"
  banner "Alibaba's SDK installed in $AUTOSTOP_SDK_DIR (with $python)"
}

case "$AUTOSTOP_ACTION" in
  remove)
    run_step remove_watcher "remove the autostop watcher"
    exit 0
    ;;
  sdk)
    run_step install_sdk "install Alibaba's Python SDK for the autostop watcher"
    exit 0
    ;;
esac
require_env AUTOSTOP_MODE CONTAINER_NAME DASHBOARD_PORT
AUTOSTOP_AFTER_JOB_MINUTES=${AUTOSTOP_AFTER_JOB_MINUTES:-0}
AUTOSTOP_IDLE_MINUTES=${AUTOSTOP_IDLE_MINUTES:-0}
AUTOSTOP_POLL_S=${AUTOSTOP_POLL_S:-60}
METADATA_URL=${METADATA_URL:-http://100.100.100.200}
require_int AUTOSTOP_AFTER_JOB_MINUTES AUTOSTOP_IDLE_MINUTES AUTOSTOP_POLL_S DASHBOARD_PORT
if [[ "$AUTOSTOP_MODE" == instances ]]; then
  require_env INSTANCE_IDS REGION_ID RAM_ROLE
  ECS_ENDPOINT=${ECS_ENDPOINT:-https://ecs.$REGION_ID.aliyuncs.com}
  STOPPED_MODE=${STOPPED_MODE:-StopCharging}
  [[ "$STOPPED_MODE" == StopCharging || "$STOPPED_MODE" == KeepCharging ]] ||
    fail "STOPPED_MODE must be StopCharging or KeepCharging; got '$STOPPED_MODE'"
fi
SETTINGS_NAMES=(AUTOSTOP_MODE AUTOSTOP_AFTER_JOB_MINUTES AUTOSTOP_IDLE_MINUTES AUTOSTOP_POLL_S CONTAINER_NAME
  DASHBOARD_PORT INSTANCE_IDS REGION_ID RAM_ROLE STOPPED_MODE ECS_ENDPOINT METADATA_URL AUTOSTOP_STATE_DIR
  AUTOSTOP_SDK_DIR BOOT_ID_FILE CURRENT_JOB_FILE NODE_NAME)

boot_id() {
  cat -- "$BOOT_ID_FILE"
}

# armed: the step installed the watcher during this boot (install_autostop_watcher records the boot).
armed() {
  [[ "$(cat -- "$AUTOSTOP_STATE_DIR/armed" 2>/dev/null)" == "$(boot_id)" ]]
}

reset_clocks() {
  local clock
  for clock in "${CLOCKS[@]}"; do
    rm -f -- "$AUTOSTOP_STATE_DIR/$clock"
  done
}

install_autostop_watcher() {
  mkdir -p -- "$AUTOSTOP_STATE_DIR"
  chmod 700 -- "$AUTOSTOP_STATE_DIR"
  if [[ "$AUTOSTOP_MODE" == instances ]]; then
    require_env AUTOSTOP_STOPPER_B64
    install_sdk
    base64 -d <<<"$AUTOSTOP_STOPPER_B64" >"$AUTOSTOP_STATE_DIR/stop_instances.py"
  fi
  reset_clocks
  boot_id >"$AUTOSTOP_STATE_DIR/armed"
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

# current_job: the id of the job the job step submitted last on this host (NOT_FOUND's stand-in when none was).
current_job() {
  local id
  id=$(cat -- "$CURRENT_JOB_FILE" 2>/dev/null) || return 1
  [[ "$id" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || return 1
  printf '%s\n' "$id"
}

# decide: prints "stop: <why>" when the cluster should stop now, nothing otherwise; keeps the clocks.
decide() {
  local state ended=false idle=false
  if JOB_ID=$(current_job); then
    state=$(JOB_CLIENT_TIMEOUT_S=60 job_state 2>/dev/null) || state=UNKNOWN
  else
    JOB_ID="(none submitted)" state=NOT_FOUND
  fi
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

# stop_instances: ECS StopInstances for INSTANCE_IDS through Alibaba's SDK (stop_instances.py prints Alibaba's
# answers into the log; its settings are this step's, in the environment).
stop_instances() {
  banner "stopping instances $INSTANCE_IDS (StopInstances, $STOPPED_MODE, SuccessFirst) with role $RAM_ROLE"
  export INSTANCE_IDS REGION_ID RAM_ROLE STOPPED_MODE ECS_ENDPOINT METADATA_URL
  logged "$AUTOSTOP_SDK_DIR/bin/python" -- "$AUTOSTOP_STATE_DIR/stop_instances.py"
}

# stop_job_on_hosts: own hosts: the machines and Ray's daemons stay up; the job stops and frees the GPUs.
stop_job_on_hosts() {
  local JOB_ID
  JOB_ID=$(current_job) || {
    banner "no job was submitted on this host: nothing to stop (own hosts: the machines stay up)"
    return 0
  }
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

# watch_cluster: the service. A start in a boot the step has not installed it in (the host was stopped and
# started) clears the clocks and waits for the step; a restart after a failed stop (systemd) keeps them.
watch_cluster() {
  local waiting=false
  mkdir -p -- "$AUTOSTOP_STATE_DIR"
  while true; do
    if ! armed; then
      reset_clocks
      $waiting || banner "this host booted since the step installed the watcher: nothing stops until \`pulumi up\` has formed the cluster again and installed it"
      waiting=true
    elif [[ ! -f "$AUTOSTOP_STATE_DIR/stopped" ]]; then
      # `|| true`: act returns 1 when nothing should stop yet (the usual poll). A stop that fails ends the watcher
      # through fail (exit): systemd starts it again (Restart=always); a detached watcher (no systemd) stays gone.
      act || true
    fi
    sleep "$AUTOSTOP_POLL_S"
  done
}

case "$AUTOSTOP_ACTION" in
  install) run_step install_autostop_watcher "install the autostop watcher" ;;
  watch) watch_cluster ;;
  once)
    mkdir -p -- "$AUTOSTOP_STATE_DIR"
    armed || fail "the watcher was not installed during this boot: it acts only after the step installed it"
    act
    ;;
  *) fail "AUTOSTOP_ACTION must be install, watch, once, sdk or remove; got '$AUTOSTOP_ACTION'" ;;
esac
