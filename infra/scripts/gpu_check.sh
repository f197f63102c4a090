#!/usr/bin/env bash
# gpu-check (on the node): one short probe of the GPU driver, no waiting. local/gpu_ready.sh runs it over ssh in a
# loop. Prints one status line (FAILED adds the log tail below it) and exits with its code:
#   READY <n>                 0  driver usable (preinstalled, already working at first boot as on a baked image,
#                                or auto-install said ALL INSTALL OK and has ended)
#                                and `nvidia-smi -L` lists at least EXPECTED_GPUS GPUs
#   FAILED <why>              2  auto-install wrote INSTALL FAIL, or the installer could not start or ended without
#                                a result, or an NVSwitch node has no nvidia-fabricmanager; followed by the last 40
#                                lines of the install log
#   INSTALLING <detail>       3  the installer is running (or user data has not started it yet)
#   REBOOT_PENDING <detail>   4  ALL INSTALL OK and a reboot was requested in this boot (first_boot.sh deferred it),
#                                or the driver was installed in this boot and nvidia-smi cannot reach it yet
#   GPUS_MISSING <seen> ...   5  the install is done but nvidia-smi lists fewer GPUs (0 when nvidia-smi fails)
#   FAILED (preinstalled)     2  nvidia-smi is not there at all (nothing will install it), or it lists more GPUs than
#                                expected (the configuration names another machine than this one)
# Exit 1 means the check itself is broken (bad settings): gpu_ready.sh stops on it.
#
# Environment (defaults in brackets): EXPECTED_GPUS (required, >= 1), GPU_DRIVER [auto-install],
#   FABRIC_MANAGER [false] (true on 8-GPU NVSwitch types: nvidia-fabricmanager must be enabled and running),
#   COUNT_KEY [the instance type] what says how many GPUs there are, named in the messages,
#   AUTO_INSTALL_DIR [/root/auto_install], ROLL_CLUSTER_STATE_DIR [/var/lib/roll-cluster],
#   BOOT_ID_FILE [/proc/sys/kernel/random/boot_id]. The state files are described in first_boot.sh.

: "${GPU_DRIVER:=auto-install}"
: "${FABRIC_MANAGER:=false}"
: "${AUTO_INSTALL_DIR:=/root/auto_install}"
: "${ROLL_CLUSTER_STATE_DIR:=/var/lib/roll-cluster}"
: "${BOOT_ID_FILE:=/proc/sys/kernel/random/boot_id}"
: "${COUNT_KEY:=the instance type}"

INSTALL_LOG=$AUTO_INSTALL_DIR/auto_install.log
STARTED_MARKER=$ROLL_CLUSTER_STATE_DIR/driver-install.started
DONE_MARKER=$ROLL_CLUSTER_STATE_DIR/driver-install.done
FAILED_MARKER=$ROLL_CLUSTER_STATE_DIR/driver-install.failed
REBOOT_REQUEST=$ROLL_CLUSTER_STATE_DIR/reboot-requested
INSTALLER_OUTPUT=$ROLL_CLUSTER_STATE_DIR/driver-installer-output.log
PRESENT_MARKER=$ROLL_CLUSTER_STATE_DIR/driver-present
FABRIC_MANAGER_FAILED=$ROLL_CLUSTER_STATE_DIR/fabric-manager.failed

check_settings() {
  require_int EXPECTED_GPUS
  ((EXPECTED_GPUS >= 1)) || fail "EXPECTED_GPUS must be at least 1"
  case $GPU_DRIVER in
    auto-install | preinstalled) ;;
    *) fail "GPU_DRIVER must be auto-install or preinstalled, got '$GPU_DRIVER'" ;;
  esac
  CURRENT_BOOT_ID=$(cat "$BOOT_ID_FILE")
}

# report CODE LINE: print the status line and end the check with CODE.
report() {
  printf '%s\n' "$2"
  exit "$1"
}

# report_failure WHY: FAILED with the tail of the install log (or of the installer's output when it wrote no log).
report_failure() {
  local log=$INSTALL_LOG
  [[ -s "$log" ]] || log=$INSTALLER_OUTPUT
  printf 'FAILED %s\n' "$1"
  if [[ -s "$log" ]]; then
    printf -- '--- last 40 lines of %s ---\n' "$log"
    tail -n 40 "$log"
    printf -- '--- end of %s ---\n' "$log"
  fi
  exit 2
}

# state_value FILE KEY: the value of KEY=... in a state file (empty when absent).
state_value() {
  local line
  if [[ -f "$1" ]] && line=$(grep -m 1 "^$2=" "$1"); then
    printf '%s\n' "${line#*=}"
  fi
}

# The installer's verdict: the last ALL INSTALL OK / INSTALL FAIL line of its log (a rerun appends to the log).
install_verdict() {
  local line
  if [[ -f "$INSTALL_LOG" ]] && line=$(grep -E 'ALL INSTALL OK|INSTALL FAIL' "$INSTALL_LOG" | tail -n 1); then
    case $line in
      *"ALL INSTALL OK"*) echo ok ;;
      *) echo fail ;;
    esac
  fi
}

# Exits unless the auto-install has finished successfully and no deferred reboot is outstanding.
check_auto_install() {
  local verdict started_boot
  verdict=$(install_verdict)
  started_boot=$(state_value "$STARTED_MARKER" boot_id)
  case $verdict in
    fail) report_failure "GPU driver auto-install reported INSTALL FAIL ($INSTALL_LOG)" ;;
    ok)
      # ALL INSTALL OK is written before the installer ends (and asks for its reboot), and nvidia-fabricmanager is
      # installed after it: wait for the whole unit to end before the reboot.
      if [[ ! -f "$DONE_MARKER" && "$started_boot" == "$CURRENT_BOOT_ID" ]]; then
        report 3 "INSTALLING the installer reported ALL INSTALL OK and is finishing"
      fi
      if [[ -f "$FABRIC_MANAGER_FAILED" ]]; then
        report_failure "nvidia-fabricmanager (needed by this 8-GPU NVSwitch type) could not be installed: $(cat "$FABRIC_MANAGER_FAILED")"
      fi
      if [[ -f "$REBOOT_REQUEST" && "$(state_value "$REBOOT_REQUEST" boot_id)" == "$CURRENT_BOOT_ID" ]]; then
        report 4 "REBOOT_PENDING driver installed; the installer asked for a reboot at $(state_value "$REBOOT_REQUEST" requested_at) ($(state_value "$REBOOT_REQUEST" command)), deferred"
      fi
      return 0
      ;;
  esac
  if [[ -f "$FAILED_MARKER" ]]; then
    report_failure "the GPU driver installer could not be started: $(cat "$FAILED_MARKER")"
  fi
  if [[ -f "$DONE_MARKER" ]]; then
    report_failure "the GPU driver installer exited with status $(state_value "$DONE_MARKER" exit_status) without writing ALL INSTALL OK or INSTALL FAIL to $INSTALL_LOG"
  fi
  if [[ -z "$started_boot" ]]; then
    report 3 "INSTALLING installer not started yet (first-boot user data has not run)"
  fi
  if [[ "$started_boot" != "$CURRENT_BOOT_ID" ]]; then
    report 3 "INSTALLING installer started in an earlier boot at $(state_value "$STARTED_MARKER" started_at) and has not finished (interrupted by a reboot?)"
  fi
  local last_line=''
  if [[ -s "$INSTALL_LOG" ]]; then last_line=$(tail -n 1 "$INSTALL_LOG" | tr -d '\r' | cut -c 1-120); fi
  report 3 "INSTALLING since $(state_value "$STARTED_MARKER" started_at)${last_line:+; log: $last_line}"
}

# 8-GPU NVSwitch types: CUDA reports "system not yet initialized" (error 802) until nvidia-fabricmanager has set up
# the NVSwitch fabric, so the node is not ready without it.
check_fabric_manager() {
  [[ "$FABRIC_MANAGER" == true ]] || return 0
  if systemctl is-active --quiet nvidia-fabricmanager; then
    return 0
  fi
  if systemctl is-enabled --quiet nvidia-fabricmanager; then
    report 3 "INSTALLING nvidia-fabricmanager is enabled and not running yet (it starts after the driver loads)"
  fi
  local source="auto-install adds it to the driver"
  if [[ "$GPU_DRIVER" == preinstalled ]]; then source="the image must have it (nodes.image), at the driver's version"; fi
  report_failure "this 8-GPU NVSwitch type needs nvidia-fabricmanager, which is neither running nor enabled ($source)"
}

check_gpus() {
  local listing line seen=0
  if [[ "$GPU_DRIVER" == preinstalled ]] && ! command -v nvidia-smi >/dev/null 2>&1; then
    # Nothing installs a driver here (your own host, or a preinstalled image): waiting cannot help.
    printf 'FAILED nvidia-smi not found on this host: install the NVIDIA driver (one that supports the CUDA of the image) so that nvidia-smi -L lists all %s GPUs; this program never installs drivers on hosts with a preinstalled driver\n' "$EXPECTED_GPUS"
    exit 2
  fi
  if ! listing=$(nvidia-smi -L </dev/null 2>&1); then
    if [[ "$GPU_DRIVER" == auto-install && "$(state_value "$DONE_MARKER" boot_id)" == "$CURRENT_BOOT_ID" ]]; then
      report 4 "REBOOT_PENDING driver installed in this boot but nvidia-smi cannot reach it yet: ${listing%%$'\n'*}"
    fi
    report 5 "GPUS_MISSING 0 of $EXPECTED_GPUS expected; nvidia-smi failed: ${listing%%$'\n'*}"
  fi
  while IFS= read -r line; do
    if [[ "$line" == "GPU "[0-9]* ]]; then seen=$((seen + 1)); fi
  done <<<"$listing"
  if ((seen > EXPECTED_GPUS)); then
    printf 'FAILED nvidia-smi -L lists %s GPUs, but %s says %s: correct it to the GPUs of the host\n' "$seen" "$COUNT_KEY" "$EXPECTED_GPUS"
    exit 2
  fi
  if ((seen == EXPECTED_GPUS)); then
    check_fabric_manager
    report 0 "READY $seen"
  fi
  report 5 "GPUS_MISSING $seen of $EXPECTED_GPUS expected"
}

# first_boot.sh found the driver working in this boot (a baked image) and started no installer: nothing to wait for.
driver_present_this_boot() {
  [[ "$(state_value "$PRESENT_MARKER" boot_id)" == "$CURRENT_BOOT_ID" ]]
}

check_settings
if [[ "$GPU_DRIVER" == auto-install ]] && ! driver_present_this_boot; then
  check_auto_install
fi
check_gpus
