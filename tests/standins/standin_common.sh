# Shared by the stand-in executables in this directory (sourced, not run). They replace, for the node-script tests,
# what cannot exist on a test machine: vendor package repositories, systemd and dockerd, a GPU and its driver, block
# devices and mounts, cloud-init, the ECS metadata service, a remote node reached over ssh.
# Every stand-in records its argv in $STANDIN_STATE/calls/<tool>.log (one call per line, arguments joined with
# spaces, unescaped, so a test can search it for a secret) and keeps its state under $STANDIN_STATE.
set -euo pipefail
: "${STANDIN_STATE:?the stand-ins need STANDIN_STATE}"
STANDIN_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

record_call() {
  local tool=$1
  shift
  mkdir -p "$STANDIN_STATE/calls"
  printf '%s\n' "$*" >>"$STANDIN_STATE/calls/$tool.log"
}

# should_fail KEY: consume one scripted failure from $STANDIN_STATE/fail/KEY (a count written by the test).
should_fail() {
  local file=$STANDIN_STATE/fail/$1 count
  [[ -f "$file" ]] || return 1
  count=$(cat "$file")
  ((count > 0)) || return 1
  echo $((count - 1)) >"$file"
  return 0
}

package_is_installed() {
  grep -qxF -- "$1" "$STANDIN_STATE/packages" 2>/dev/null
}

mark_package_installed() {
  package_is_installed "$1" || echo "$1" >>"$STANDIN_STATE/packages"
}

unit_name() {
  local unit=$1
  printf '%s\n' "${unit%.service}"
}

# apply_reboot: the node comes back from a reboot: a new boot id, the GPU count after the reboot, and ssh refusing
# connections for the next $STANDIN_STATE/reboot-down-calls calls (default 2) while it boots.
apply_reboot() {
  echo "$(date +%s.%N) from boot $(cat "$STANDIN_STATE/boot_id" 2>/dev/null)" >>"$STANDIN_STATE/reboots"
  echo "boot-after-reboot-$(wc -l <"$STANDIN_STATE/reboots")" >"$STANDIN_STATE/boot_id"
  if [[ -f "$STANDIN_STATE/nvidia-smi-gpus-after-reboot" ]]; then
    mv -f "$STANDIN_STATE/nvidia-smi-gpus-after-reboot" "$STANDIN_STATE/nvidia-smi-gpus"
  fi
  if [[ -f "$STANDIN_STATE/reboot-down-calls" ]]; then
    cp "$STANDIN_STATE/reboot-down-calls" "$STANDIN_STATE/ssh-down-calls"
  else
    echo 2 >"$STANDIN_STATE/ssh-down-calls"
  fi
}
