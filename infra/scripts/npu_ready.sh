#!/usr/bin/env bash
# npu-ready (over SSH, root): the Ascend NPU driver of this host is there and sees the expected NPUs, and every
# device and driver file the training container gets exists. Checked, never installed: the hosts are yours.
# One look (with a short retry for a busy npu-smi), no long wait: a driver that is missing will not appear by itself.
#
# Environment (defaults in brackets):
#   EXPECTED_NPUS (required)     NPUs this host must have
#   COUNT_KEY [the configuration]  the key that says so, named in the messages
#   DEVICES (required)           device files passed into the container, space-separated
#   DRIVER_PATHS (required)      driver files and directories mounted into the container, space-separated
#   npu_lib.sh (rendered before this script): NPU_SMI_PATHS, INSTALL_HINT, NPU_SMI_TIMEOUT_S; how NPUs are counted
#   lib.sh: RETRY_ATTEMPTS, RETRY_DELAY_S, ROLL_CLUSTER_LOG_DIR

: "${COUNT_KEY:=the configuration}"

check_settings() {
  require_env EXPECTED_NPUS DEVICES DRIVER_PATHS
  require_int EXPECTED_NPUS NPU_SMI_TIMEOUT_S
  ((EXPECTED_NPUS >= 1)) || fail "EXPECTED_NPUS must be at least 1"
}

count_npus() {
  count_listed_npus
  if ((NPUS_LISTED != EXPECTED_NPUS)); then
    cat "$NPU_SMI_OUTPUT" >>"$ROLL_CLUSTER_STEP_LOG"
    fail "npu-smi info lists $NPUS_LISTED NPUs, but $COUNT_KEY says $EXPECTED_NPUS: correct it to this host's NPUs (or repair the NPUs npu-smi does not list)"
  fi
  banner "npu-smi info lists $NPUS_LISTED NPUs, as expected"
}

check_devices() {
  local device missing=()
  for device in $DEVICES; do
    [[ -c "$device" ]] || missing+=("$device")
  done
  if ((${#missing[@]})); then
    fail "device files missing on this host: ${missing[*]} (the container gets them with --device); $INSTALL_HINT"
  fi
  banner "device files present: $DEVICES"
}

check_driver_paths() {
  local path missing=()
  for path in $DRIVER_PATHS; do
    [[ -e "$path" ]] || missing+=("$path")
  done
  if ((${#missing[@]})); then
    # Docker would create a missing mount source as an empty directory on the host: stop before that happens.
    fail "driver files missing on this host: ${missing[*]} (mounted into the container); $INSTALL_HINT"
  fi
  banner "driver files present: $DRIVER_PATHS"
}

check_settings
run_step find_npu_smi "find npu-smi"
run_step count_npus "count the NPUs (expecting $EXPECTED_NPUS)"
run_step check_devices "NPU device files"
run_step check_driver_paths "driver files for the container"
