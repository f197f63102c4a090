#!/usr/bin/env bash
# Step ray-stop (every node, at destroy, and on a node leaving the cluster): stop Ray in the training container.
# A missing container or a Ray that is not running is success: on destroy either may already be gone, and that
# must not block destroy.
#
# A plain `ray stop` (SIGTERM; Ray itself kills what is left after its grace period) rather than --force
# (SIGKILL): a raylet that stops gracefully leaves the cluster at once, while a killed one stays "alive" on
# the head until the GCS misses its heartbeats (about 17 s measured), and would hold the readiness gate.
#
# Environment:
#   CONTAINER_NAME           the training container                                                    required
#   RAY_STOP_TIMEOUT_S       bound on waiting for Ray's processes to exit                              60

require_env CONTAINER_NAME
RAY_STOP_TIMEOUT_S=${RAY_STOP_TIMEOUT_S:-60}
require_int RAY_STOP_TIMEOUT_S

stop_ray() {
  local addresses
  if ! container_is_running; then
    banner "container $CONTAINER_NAME is not running: Ray is not running there"
    return 0
  fi
  # First forget how Ray was started: the container's main process must not start it again.
  logged forget_ray_start
  addresses=$(ray_local_gcs_addresses)
  if [[ -z "$addresses" ]]; then
    banner "Ray is not running in $CONTAINER_NAME"
    return 0
  fi
  banner "stopping Ray in $CONTAINER_NAME (cluster ${addresses//$'\n'/, })"
  logged timeout -k 10 "$RAY_STOP_TIMEOUT_S" docker exec "$CONTAINER_NAME" ray stop
  wait_for "Ray's processes in $CONTAINER_NAME to exit" "$RAY_STOP_TIMEOUT_S" 1 no_ray_process
}

run_step stop_ray "stop Ray in $CONTAINER_NAME"
