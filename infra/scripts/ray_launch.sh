#!/usr/bin/env bash
# The one way Ray is started in the training container: from the start record a Ray step wrote there
# (ray_common.sh record_ray_start). Two callers run this same function, so a start by a Ray step and a restart
# after a reboot cannot differ in arguments, variables or preload:
#   - the Ray steps (ray_head.sh, ray_worker.sh) ship it into the container (`declare -f`, ray_common.sh
#     launch_ray_in_container) right after writing the record;
#   - the container's main process (container_main.sh, which components/bootstrap.py prefixes with this file)
#     calls it when the container's raylet is gone.
# It only defines a function. It runs in the container with plain bash (no Ray import); its text is part of the
# container's command line, so it must never name one of Ray's own scripts (`ray stop` matches command lines).

# launch_recorded_ray RECORD TIMEOUT_S: `ray start` as RECORD says, bounded by TIMEOUT_S. The record exports
# NODE_RANK and the secrets (the raylet, and so every job, inherits them) and names the library Ray runs with in
# LD_PRELOAD (RAY_PRELOAD: MindSpeed-RL's jemalloc on Ascend), which only `ray start` and its children get, not
# `timeout`. In a subshell: the record's variables stay out of the caller.
launch_recorded_ray() (
  RAY_PRELOAD=''
  RAY_START_ARGS=()
  # shellcheck source=/dev/null
  source "$1" || exit 1
  if ((${#RAY_START_ARGS[@]} == 0)); then
    echo "launch_recorded_ray: $1 records no ray start command" >&2
    exit 1
  fi
  if [[ -n "$RAY_PRELOAD" ]]; then
    exec timeout -k 10 "$2" env "LD_PRELOAD=$RAY_PRELOAD" "${RAY_START_ARGS[@]}"
  fi
  exec timeout -k 10 "$2" "${RAY_START_ARGS[@]}"
)
