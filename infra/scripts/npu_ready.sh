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
#   NPU_SMI_PATHS [/usr/local/sbin/npu-smi /usr/local/bin/npu-smi]   where npu-smi is looked for besides PATH
#   INSTALL_HINT ['install the Ascend NPU driver and firmware']   what to do when the driver is missing
#   NPU_SMI_TIMEOUT_S [60]       bound for one `npu-smi info`
#   lib.sh: RETRY_ATTEMPTS, RETRY_DELAY_S, ROLL_LOG_DIR
#
# Counting: `npu-smi info` prints two table rows per NPU, the first `| <id>  <name, e.g. 910B4> | <health> ...`
# and the second `| <chip> | <bus id> ...`; the process table below starts its rows with two numbers. So an NPU is
# a row whose first cell is a number followed by a name that has a letter (../shared/reference/mindspeed-rl.md 4.4;
# the sample there is third-party and UNCONFIRMED as Huawei's official format).

: "${COUNT_KEY:=the configuration}"
: "${NPU_SMI_PATHS:=/usr/local/sbin/npu-smi /usr/local/bin/npu-smi}"
: "${INSTALL_HINT:=install the Ascend NPU driver and firmware}"
: "${NPU_SMI_TIMEOUT_S:=60}"

NPU_SMI=''

check_settings() {
  require_env EXPECTED_NPUS DEVICES DRIVER_PATHS
  require_int EXPECTED_NPUS NPU_SMI_TIMEOUT_S
  ((EXPECTED_NPUS >= 1)) || fail "EXPECTED_NPUS must be at least 1"
}

find_npu_smi() {
  local candidate
  if NPU_SMI=$(command -v npu-smi 2>/dev/null); then
    banner "npu-smi: $NPU_SMI"
    return 0
  fi
  for candidate in $NPU_SMI_PATHS; do
    if [[ -x "$candidate" ]]; then
      NPU_SMI=$candidate
      banner "npu-smi: $NPU_SMI"
      return 0
    fi
  done
  fail "npu-smi not found on this host (PATH, $NPU_SMI_PATHS): $INSTALL_HINT. This program checks the driver of your hosts and never installs one."
}

npu_smi_info() {
  timeout "$NPU_SMI_TIMEOUT_S" "$NPU_SMI" info >"$ROLL_LOG_DIR/npu-smi-info.txt" 2>&1
}

count_npus() {
  local seen
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" npu_smi_info || {
    tail -n 20 "$ROLL_LOG_DIR/npu-smi-info.txt" >>"$ROLL_STEP_LOG"
    fail "npu-smi info failed: the NPU driver does not answer; $INSTALL_HINT"
  }
  seen=$(grep -cE '^\|[[:space:]]*[0-9]+[[:space:]]+[0-9]*[A-Za-z]' "$ROLL_LOG_DIR/npu-smi-info.txt" || true)
  if ((seen != EXPECTED_NPUS)); then
    cat "$ROLL_LOG_DIR/npu-smi-info.txt" >>"$ROLL_STEP_LOG"
    fail "npu-smi info lists $seen NPUs, but $COUNT_KEY says $EXPECTED_NPUS: correct it to this host's NPUs (or repair the NPUs npu-smi does not list)"
  fi
  banner "npu-smi info lists $seen NPUs, as expected"
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
