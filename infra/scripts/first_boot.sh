#!/usr/bin/env bash
# first-boot: cloud-init user data (root, first boot). Starts Alibaba's GPU driver auto-installer in the
# background and defers the reboot it makes when it is done; returns within seconds so the boot (and the SSH
# steps waiting for cloud-init) are not held up for the 10-20 minutes the install takes.
# Rendered by infra.node.remote.render_user_data: `#!/bin/bash` + exports + lib.sh + this file.
#
# Environment (defaults in brackets):
#   GPU_DRIVER [auto-install]   auto-install | preinstalled (the image has the driver: nothing to do)
#   DRIVER_VERSION, CUDA_VERSION, CUDNN_VERSION   required for auto-install, e.g. 550.127.08 12.4.1 9.2.0.82
#   INSTALL_RDMA [FALSE], INSTALL_ERDMA [FALSE]   the installer's IS_INSTALL_RDMA and IS_INSTALL_eRDMA arguments
#   METADATA_URL [http://100.100.100.200/latest/meta-data]   ECS metadata; source-address names the mirror host
#   AUTO_INSTALL_SCRIPT [auto_install.sh]   file under <source-address>/opsx/ecs/linux/binary/script/
#   AUTO_INSTALL_DIR [/root/auto_install]   where the installer runs; it writes auto_install.log there
#   ROLL_STATE_DIR [/var/lib/roll-cluster]  state shared with gpu_check.sh (below)
#   BOOT_ID_FILE [/proc/sys/kernel/random/boot_id]   identifies the current boot; a reboot changes it
#   DRIVER_INSTALL_UNIT [roll-cluster-gpu-driver-install]   transient systemd unit the installer runs in
#   lib.sh: RETRY_ATTEMPTS, RETRY_DELAY_S, ROLL_LOG_DIR
#
# State under ROLL_STATE_DIR, read by gpu_check.sh:
#   driver-install.started   boot_id, started_at: the installer was launched (a second run skips)
#   driver-install.done      exit_status, boot_id, finished_at: the installer process ended
#   driver-install.failed    why the installer could not be started (e.g. the download failed)
#   reboot-requested         boot_id, requested_at, command: a reboot the installer asked for, deferred
#   reboot-shims/            the reboot stand-ins put first in the installer's PATH
#   driver-installer-output.log   the installer's stdout and stderr
#   driver-present           boot_id, checked_at, gpus: the driver already worked at first boot (a baked image),
#                            so the installer was not started

: "${GPU_DRIVER:=auto-install}"
: "${INSTALL_RDMA:=FALSE}"
: "${INSTALL_ERDMA:=FALSE}"
: "${METADATA_URL:=http://100.100.100.200/latest/meta-data}"
: "${AUTO_INSTALL_SCRIPT:=auto_install.sh}"
: "${AUTO_INSTALL_DIR:=/root/auto_install}"
: "${ROLL_STATE_DIR:=/var/lib/roll-cluster}"
: "${BOOT_ID_FILE:=/proc/sys/kernel/random/boot_id}"
: "${DRIVER_INSTALL_UNIT:=roll-cluster-gpu-driver-install}"

SHIM_DIR=$ROLL_STATE_DIR/reboot-shims
STARTED_MARKER=$ROLL_STATE_DIR/driver-install.started
DONE_MARKER=$ROLL_STATE_DIR/driver-install.done
FAILED_MARKER=$ROLL_STATE_DIR/driver-install.failed
REBOOT_REQUEST=$ROLL_STATE_DIR/reboot-requested
INSTALLER_OUTPUT=$ROLL_STATE_DIR/driver-installer-output.log
INSTALLER_WRAPPER=$ROLL_STATE_DIR/run-driver-installer.sh
PRESENT_MARKER=$ROLL_STATE_DIR/driver-present

check_settings() {
  case $GPU_DRIVER in
    auto-install) require_env DRIVER_VERSION CUDA_VERSION CUDNN_VERSION ;;
    preinstalled) ;;
    *) fail "GPU_DRIVER must be auto-install or preinstalled, got '$GPU_DRIVER'" ;;
  esac
  mkdir -p "$ROLL_STATE_DIR" "$AUTO_INSTALL_DIR"
}

# Whether this or an earlier run already launched the installer (or it already finished).
installer_already_started() {
  [[ -f "$STARTED_MARKER" ]] || systemctl is-active --quiet "$DRIVER_INSTALL_UNIT"
}

# The body of every reboot shim. It is written into the shim files with `declare -f` (so shellcheck checks it
# here). A shim that forwards (systemctl, init) only intercepts the arguments that mean reboot or power-off.
reboot_shim_main() {
  local forward_to=$1 reboot_words=$2 request_file=$3 boot_id_file=$4 arg word is_reboot=1
  shift 4
  if [[ -n "$forward_to" ]]; then
    is_reboot=0
    for arg in "$@"; do
      for word in $reboot_words; do
        if [[ "$arg" == "$word" ]]; then is_reboot=1; fi
      done
    done
  fi
  if ((is_reboot == 0)); then
    exec "$forward_to" "$@"
  fi
  {
    printf 'boot_id=%s\n' "$(cat "$boot_id_file")"
    printf 'requested_at=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    printf 'command=%s\n' "${0##*/} $*"
  } >"$request_file.tmp"
  mv -f "$request_file.tmp" "$request_file"
  printf 'roll-cluster: reboot deferred, recorded in %s; gpu_ready reboots the node once the image is pulled\n' \
    "$request_file" >&2
}

# Defence, not a documented interface: Alibaba documents only that the installer reboots the instance when it is
# done, not how. Every reboot-like command it could call by name is shadowed, in its PATH only, by a shim that
# records the request, so the node does not reboot under the docker/pull-image SSH steps. The only reboot is
# then made by gpu_ready.sh after the image pull; gpu_ready.sh still tolerates an unexpected reboot (an absolute
# path such as /sbin/reboot bypasses the shims).
install_reboot_shims() {
  local name forward_to reboot_words changed=0
  mkdir -p "$SHIM_DIR"
  for name in reboot shutdown poweroff halt systemctl init telinit; do
    forward_to='' reboot_words=''
    case $name in
      systemctl)
        reboot_words='reboot poweroff halt kexec soft-reboot reboot.target poweroff.target halt.target'
        forward_to=$(command -v systemctl) || fail "systemctl not found"
        ;;
      init | telinit)
        reboot_words='0 6'
        # No init command: nothing to forward to and nothing the installer could call.
        forward_to=$(command -v "$name") || continue
        ;;
    esac
    write_file_if_changed "$SHIM_DIR/$name" "$(
      printf '#!/bin/bash\n# Written by roll-cluster first_boot.sh: defers reboots requested by the GPU driver installer.\n'
      printf 'set -euo pipefail\n'
      declare -f reboot_shim_main
      printf 'reboot_shim_main %q %q %q %q "$@"\n' "$forward_to" "$reboot_words" "$REBOOT_REQUEST" "$BOOT_ID_FILE"
    )" 0755
    changed=$((changed + FILE_CHANGED))
  done
  if ((changed == 0)); then
    banner "reboot shims already in $SHIM_DIR; skipped"
  else
    banner "reboot shims written to $SHIM_DIR"
  fi
}

record_start_failure() {
  printf '%s\n' "$1" >"$FAILED_MARKER"
  fail "$1"
}

download_installer() {
  local target=$AUTO_INSTALL_DIR/$AUTO_INSTALL_SCRIPT address_file source_address url
  if [[ -s "$target" ]]; then
    banner "installer already downloaded to $target; skipped"
    return 0
  fi
  address_file=$(mktemp)
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" log_cmd curl -fsS --max-time 10 -o "$address_file" \
    "$METADATA_URL/source-address" \
    || record_start_failure "could not read the mirror address from $METADATA_URL/source-address"
  # The metadata service may list several mirror addresses, one per line; the documented user data takes the first.
  source_address=$(head -n 1 "$address_file" | tr -d '\r')
  rm -f "$address_file"
  [[ "$source_address" == http* ]] \
    || record_start_failure "unexpected mirror address '$source_address' from $METADATA_URL/source-address"
  url="${source_address%/}/opsx/ecs/linux/binary/script/$AUTO_INSTALL_SCRIPT"
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" log_cmd curl -fsSL --max-time 300 -o "$target.part" "$url" \
    || record_start_failure "could not download the GPU driver installer from $url"
  mv -f "$target.part" "$target"
  banner "downloaded $url"
}

# Runs as the transient unit's main process (written to a file with `declare -f`): the installer with the shims
# first in PATH, then a marker with its exit status and boot, written whatever the result.
driver_installer_main() {
  local shim_dir=$1 install_dir=$2 script=$3 output=$4 done_file=$5 boot_id_file=$6 path=$7 status=0
  shift 7
  export PATH="$shim_dir:$path"
  if cd "$install_dir"; then
    bash "./$script" "$@" >>"$output" 2>&1 </dev/null || status=$?
  else
    status=1
  fi
  {
    printf 'exit_status=%s\n' "$status"
    printf 'boot_id=%s\n' "$(cat "$boot_id_file")"
    printf 'finished_at=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  } >"$done_file.tmp"
  mv -f "$done_file.tmp" "$done_file"
  return "$status"
}

# systemd-run rather than nohup/setsid: the installer gets its own unit and cgroup, so it outlives the cloud-init
# service that runs this user data (systemd may kill what is left in that service's cgroup when it ends), its state
# is visible with `systemctl status $DRIVER_INSTALL_UNIT`, and systemd-run returns as soon as it has started.
# --collect unloads the unit when it ends, so a later run can reuse the name.
start_installer() {
  write_file_if_changed "$INSTALLER_WRAPPER" "$(
    printf '#!/bin/bash\n# Written by roll-cluster first_boot.sh: runs the GPU driver installer with reboots deferred.\n'
    printf 'set -euo pipefail\n'
    declare -f driver_installer_main
    printf 'driver_installer_main %q %q %q %q %q %q %q %q %q %q %q %q\n' \
      "$SHIM_DIR" "$AUTO_INSTALL_DIR" "$AUTO_INSTALL_SCRIPT" "$INSTALLER_OUTPUT" "$DONE_MARKER" "$BOOT_ID_FILE" \
      "$PATH" "$DRIVER_VERSION" "$CUDA_VERSION" "$CUDNN_VERSION" "$INSTALL_RDMA" "$INSTALL_ERDMA"
  )" 0755
  rm -f "$DONE_MARKER" "$REBOOT_REQUEST"
  logged systemd-run --unit="$DRIVER_INSTALL_UNIT" --description="roll-cluster: Alibaba GPU driver auto-install" \
    --collect "$(command -v bash)" "$INSTALLER_WRAPPER"
  write_file_if_changed "$STARTED_MARKER" "$(
    printf 'boot_id=%s\n' "$(cat "$BOOT_ID_FILE")"
    printf 'started_at=%s' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  )"
  rm -f "$FAILED_MARKER"
  banner "driver $DRIVER_VERSION, CUDA $CUDA_VERSION, cuDNN $CUDNN_VERSION installing in unit $DRIVER_INSTALL_UNIT" \
    "(log: $AUTO_INSTALL_DIR/auto_install.log); the reboot it requests is deferred to gpu-ready"
}

# A node booted from a baked (or any driver-carrying) custom image has a working driver: nvidia-smi lists its GPUs.
# Running the installer again would rebuild the driver and reboot for nothing. Bounded: a wedged driver must not
# hold up the boot.
driver_works() {
  local listing
  command -v nvidia-smi >/dev/null 2>&1 || return 1
  listing=$(timeout 60 nvidia-smi -L </dev/null 2>/dev/null) || return 1
  DRIVER_GPUS=$(grep -c '^GPU [0-9]' <<<"$listing") || return 1
}

install_gpu_driver() {
  if [[ "$GPU_DRIVER" == preinstalled ]]; then
    banner "GPU_DRIVER=preinstalled: the image has the driver, nothing to install; skipped"
    return 0
  fi
  if driver_works; then
    write_file_if_changed "$PRESENT_MARKER" "$(
      printf 'boot_id=%s\n' "$(cat "$BOOT_ID_FILE")"
      printf 'checked_at=%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
      printf 'gpus=%s' "$DRIVER_GPUS"
    )"
    banner "the NVIDIA driver already works ($DRIVER_GPUS GPU(s) listed by nvidia-smi; a baked image?): installer skipped"
    return 0
  fi
  if installer_already_started; then
    local detail="unit $DRIVER_INSTALL_UNIT is running"
    if [[ -f "$STARTED_MARKER" ]]; then detail=$(tr '\n' ' ' <"$STARTED_MARKER"); fi
    banner "GPU driver installer already started ($detail); skipped"
    return 0
  fi
  run_step install_reboot_shims "reboot shims for the driver installer"
  run_step download_installer "download of Alibaba's GPU driver installer"
  run_step start_installer "start of the GPU driver installer in the background"
}

check_settings
run_step install_gpu_driver "GPU driver ($GPU_DRIVER)"
