#!/bin/bash
# Served by the curl stand-in as Alibaba's GPU driver auto_install.sh (which installs the NVIDIA driver, CUDA and
# cuDNN, logs to auto_install.log beside itself and reboots the instance when done). This one logs its arguments
# and 45 progress lines, waits $STANDIN_STATE/installer-seconds (default 0.2), writes the verdict from
# $STANDIN_STATE/installer-result (default "ALL INSTALL OK") and, on success, calls `reboot` by name, as the real one is
# documented to reboot; first_boot.sh's shim must catch it.
log=./auto_install.log
echo "auto_install.sh args: $*" >>"$log"
for i in $(seq 1 45); do echo "progress $i/45: installing driver $1, CUDA $2, cuDNN $3" >>"$log"; done
sleep "$(cat "$STANDIN_STATE/installer-seconds" 2>/dev/null || echo 0.2)"
result=$(cat "$STANDIN_STATE/installer-result" 2>/dev/null || echo "ALL INSTALL OK")
echo "$result" >>"$log"
if [[ "$result" == *"INSTALL FAIL"* ]]; then
  exit 1
fi
reboot
