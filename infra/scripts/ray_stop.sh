#!/usr/bin/env bash
# Step ray-stop (every node, at destroy): stop Ray in the training container. A missing container or a Ray
# that is not running is success: on destroy either may already be gone, and that must not block destroy.
#
# Environment:
#   CONTAINER_NAME           the training container                                                    required
#   RAY_STOP_TIMEOUT_S       bound on waiting for Ray's processes to exit                              60

require_env CONTAINER_NAME
RAY_STOP_TIMEOUT_S=${RAY_STOP_TIMEOUT_S:-60}

stop_ray() {
  local addresses
  if ! container_is_running; then
    banner "container $CONTAINER_NAME is not running: Ray is not running there"
    return 0
  fi
  addresses=$(ray_local_gcs_addresses)
  if [[ -z "$addresses" ]]; then
    banner "Ray is not running in $CONTAINER_NAME"
    return 0
  fi
  banner "stopping Ray in $CONTAINER_NAME (cluster ${addresses//$'\n'/, })"
  logged docker exec "$CONTAINER_NAME" ray stop --force
  wait_for "Ray's processes in $CONTAINER_NAME to exit" "$RAY_STOP_TIMEOUT_S" 1 no_local_raylet
}

run_step stop_ray "stop Ray in $CONTAINER_NAME"
