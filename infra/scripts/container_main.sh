#!/usr/bin/env bash
# The training container's main process (the container's command, under Docker's init: `bash -c <this file>`).
# It keeps the container alive, as `sleep infinity` did, and keeps Ray running as the Ray steps last started it:
# every RAY_SUPERVISE_INTERVAL_S it looks for this container's raylet, and when there is none but a start record
# exists (written by ray_head.sh / ray_worker.sh, see ray_common.sh) it starts Ray with the recorded settings.
# So after a reboot (Docker restarts the container: restart policy unless-stopped) the head comes back by itself,
# and a worker rejoins as soon as the head's GCS port answers, also when only the head rebooted (a worker's
# raylet exits once it loses its head). Nothing is started while a Ray step works on Ray (the pause file) or after
# the ray-stop step removed the record. Its log: /var/lib/roll-cluster/ray/supervisor.log in the container
# (`docker logs` shows the same lines).
#
# `ray stop` kills every process whose command line contains the name of one of Ray's own scripts, and this text is
# this process's command line: it must never name them (tests/scripts/test_runtime_reliability.py checks).
# This text is the same for every cluster and every setting (settings live in the record), so changing a setting
# never recreates the container. It is deliberately plain bash: no Ray import, whatever Ray version the image has.
# The container's command is ray_launch.sh (launch_recorded_ray, the start the Ray steps use) followed by this
# file (components/bootstrap.py container_command).
set -uo pipefail

# The two paths are ray_common.sh's RAY_RECORD_DIR and RAY_PAUSE_FILE (overridable here for tests only).
RECORD_DIR=${RAY_RECORD_DIR:-/var/lib/roll-cluster/ray}
PAUSE_FILE=${RAY_PAUSE_FILE:-/dev/shm/roll-cluster-ray.pause}
RAYLET_NAME=${RAY_RAYLET_NAME:-raylet} # tests only: a test machine may run real raylets of its own
INTERVAL_S=${RAY_SUPERVISE_INTERVAL_S:-10}
START_TIMEOUT_S=${RAY_SUPERVISE_START_TIMEOUT_S:-300}

say() {
  local line
  line=$(printf '[%s] container-main: %s' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*")
  printf '%s\n' "$line"
  if mkdir -p "$RECORD_DIR" 2>/dev/null; then
    printf '%s\n' "$line" >>"$RECORD_DIR/supervisor.log"
  fi
}

# raylet_running: whether a raylet runs in this container (the process name; command lines would also match
# this very script's text).
raylet_running() {
  local comm name
  for comm in /proc/[0-9]*/comm; do
    name=''
    # Expected to fail for a process that exited since the glob listed it: it is no raylet any more.
    read -r name <"$comm" 2>/dev/null || continue
    [[ "$name" != "$RAYLET_NAME" ]] || return 0
  done
  return 1
}

head_answers() {
  # shellcheck disable=SC2016 # $1 and $2 expand in the inner bash
  timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' head_answers "${1%:*}" "${1##*:}" 2>/dev/null
}

# start_from_record: in a subshell, so the record's variables (secrets among them) stay out of this loop.
start_from_record() (
  local RAY_ROLE='' RAY_HEAD_ADDRESS='' status=0
  local -a RAY_START_ARGS=()
  # shellcheck source=/dev/null
  source "$RECORD_DIR/start" || exit 0
  ((${#RAY_START_ARGS[@]})) || exit 0
  if [[ "$RAY_ROLE" == worker ]] && ! head_answers "$RAY_HEAD_ADDRESS"; then
    exit 0 # the head is not back yet: look again next round
  fi
  say "no raylet in this container: starting Ray ($RAY_ROLE, head $RAY_HEAD_ADDRESS) with the recorded settings"
  # The Ray step started Ray with this same function and record: same arguments, variables and preload.
  launch_recorded_ray "$RECORD_DIR/start" "$START_TIMEOUT_S" >>"$RECORD_DIR/supervisor.log" 2>&1 || status=$?
  if ((status == 0)); then
    say "Ray started"
  else
    say "ray start exited $status; trying again in ${INTERVAL_S}s"
  fi
)

# A Ray step writes the pause file and then takes this lock (ray_common.sh pause_ray_supervision): a start under
# way finishes before the step looks at Ray, and none begins after the pause (checked again under the lock).
locked_start() {
  if command -v flock >/dev/null 2>&1; then
    (
      flock -n 9 || exit 0
      [[ ! -e "$PAUSE_FILE" ]] || exit 0
      start_from_record
    ) 9>"$RECORD_DIR/supervisor.lock"
  else
    start_from_record
  fi
}

say "started (supervising Ray every ${INTERVAL_S}s)"
while true; do
  if [[ -f "$RECORD_DIR/start" && ! -e "$PAUSE_FILE" ]] && ! raylet_running; then
    locked_start
  fi
  sleep "$INTERVAL_S" &
  wait "$!"
done
