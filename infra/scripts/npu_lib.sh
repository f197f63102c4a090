#!/usr/bin/env bash
# Ascend NPU helpers for the steps that look at a host's NPUs (accelerator_probe.sh before anything is registered,
# npu_ready.sh before the container). Rendered after lib.sh and before the step's own script; defines functions only.
#
# Environment (defaults in brackets):
#   NPU_SMI_PATHS [/usr/local/sbin/npu-smi /usr/local/bin/npu-smi]   where npu-smi is looked for besides PATH
#   INSTALL_HINT ['install the Ascend NPU driver and firmware']   what to do when the driver is missing
#   NPU_SMI_TIMEOUT_S [60]       bound for one `npu-smi info`
#
# Counting: `npu-smi info` prints two table rows per NPU, the first `| <id>  <name, e.g. 910B4> | <health> ...`
# and the second `| <chip> | <bus id> ...`; the process table below starts its rows with two numbers. So an NPU is
# a row whose first cell is a number followed by a name that has a letter (verified-facts#npu-lib-mindspeed-rl;
# the sample there is third-party and UNCONFIRMED as Huawei's official format).

: "${NPU_SMI_PATHS:=/usr/local/sbin/npu-smi /usr/local/bin/npu-smi}"
: "${INSTALL_HINT:=install the Ascend NPU driver and firmware}"
: "${NPU_SMI_TIMEOUT_S:=60}"

NPU_SMI=''
NPU_SMI_OUTPUT="$ROLL_CLUSTER_LOG_DIR/npu-smi-info.txt"

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
  bounded "$NPU_SMI_TIMEOUT_S" "$NPU_SMI" info </dev/null >"$NPU_SMI_OUTPUT" 2>&1
}

# count_listed_npus: sets NPUS_LISTED to how many NPUs `npu-smi info` lists (with a short retry for a busy
# npu-smi); fails the step, with npu-smi's output, when the driver does not answer.
# shellcheck disable=SC2034  # read by the step scripts rendered after this file
NPUS_LISTED=0
count_listed_npus() {
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" npu_smi_info || {
    tail -n 20 "$NPU_SMI_OUTPUT" >>"$ROLL_CLUSTER_STEP_LOG"
    fail "npu-smi info failed: the NPU driver does not answer; $INSTALL_HINT"
  }
  # grep exits 1 when it counts no row; the count (0) is what the callers check.
  # shellcheck disable=SC2034  # read by the step scripts rendered after this file
  NPUS_LISTED=$(grep -cE '^\|[[:space:]]*[0-9]+[[:space:]]+[0-9]*[A-Za-z]' "$NPU_SMI_OUTPUT" || true)
}
