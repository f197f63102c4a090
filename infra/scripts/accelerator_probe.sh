#!/usr/bin/env bash
# accelerator-probe (over SSH, as root or through sudo): how many accelerators this host's driver lists. Run by the
# `hosts` node source while the program is evaluated (`pulumi preview` and `pulumi up`), before any resource or step
# exists (infra/sources/hosts/probe.py), so that a count that disagrees with nodes.acceleratorsPerNode stops the
# update before anything touches a host. It only looks: nothing on the host changes but this probe's log.
# The readiness step (gpu-ready / npu-ready) checks again before the container, after a reboot too.
#
# Prints, as its last line:   ACCELERATORS <count>
# Fails (exit 1, the step's name and the reason on stderr) when the driver's tool is missing or does not answer.
#
# Environment (defaults in brackets):
#   ACCELERATOR (required)        nvidia (counts `nvidia-smi -L` lines) or ascend (npu_lib.sh, rendered before this)
#   NVIDIA_SMI_TIMEOUT_S [60]     bound for one `nvidia-smi -L`
#   INSTALL_HINT                  what to install when the driver is missing (npu_lib.sh's default otherwise)
#   lib.sh: ROLL_CLUSTER_LOG_DIR, RETRY_ATTEMPTS, RETRY_DELAY_S

: "${NVIDIA_SMI_TIMEOUT_S:=60}"

COUNTED=0

check_settings() {
  require_env ACCELERATOR
  require_int NVIDIA_SMI_TIMEOUT_S
  case $ACCELERATOR in
    nvidia | ascend) ;;
    *) fail "ACCELERATOR must be nvidia or ascend, got '$ACCELERATOR'" ;;
  esac
}

nvidia_smi_list() {
  bounded "$NVIDIA_SMI_TIMEOUT_S" nvidia-smi -L </dev/null >"$ROLL_CLUSTER_LOG_DIR/nvidia-smi-list.txt" 2>&1
}

count_gpus() {
  local line
  command -v nvidia-smi >/dev/null 2>&1 ||
    fail "nvidia-smi not found on this host: $INSTALL_HINT. This program checks the driver of your hosts and never installs one."
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" nvidia_smi_list || {
    tail -n 20 "$ROLL_CLUSTER_LOG_DIR/nvidia-smi-list.txt" >>"$ROLL_CLUSTER_STEP_LOG"
    fail "nvidia-smi -L failed: the NVIDIA driver does not answer; $INSTALL_HINT"
  }
  # The line format gpu_check.sh counts too: `GPU <index>: <name> (UUID: ...)`.
  while IFS= read -r line; do
    if [[ "$line" == "GPU "[0-9]* ]]; then COUNTED=$((COUNTED + 1)); fi
  done <"$ROLL_CLUSTER_LOG_DIR/nvidia-smi-list.txt"
  banner "nvidia-smi -L lists $COUNTED GPUs"
}

count_npus() {
  find_npu_smi
  count_listed_npus
  COUNTED=$NPUS_LISTED
  banner "npu-smi info lists $COUNTED NPUs"
}

check_settings
# Each look starts its own log: only the latest one explains a refusal.
: >"$ROLL_CLUSTER_STEP_LOG"
if [[ "$ACCELERATOR" == nvidia ]]; then
  : "${INSTALL_HINT:=install the NVIDIA driver}"
  run_step count_gpus "count the GPUs"
else
  run_step count_npus "count the NPUs"
fi
printf 'ACCELERATORS %s\n' "$COUNTED"
