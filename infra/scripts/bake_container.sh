#!/usr/bin/env bash
# bake-prep, part 1 (over SSH on the head, root; only with nodes.bake): a throw-away container of the training image
# in which fetch_code.sh (rendered right after this script) installs the framework's code and requirements, so that
# bake_finish.sh can commit them into the image the baked node image carries. The node's own training container
# is not used: it must not be in the baked image (a node booted from it would find a container of another node).
#
# Environment (defaults in brackets):
#   IMAGE (required)                the training image, already pulled (pull-image)
#   BAKE_CONTAINER [roll-cluster-bake]   name of the throw-away container
#   WORKSPACE_HOST_DIR (required)   host directory mounted at WORKSPACE (the training container mounts the same)
#   WORKSPACE [/workspace]
#   lib.sh: ROLL_CLUSTER_LOG_DIR

: "${BAKE_CONTAINER:=roll-cluster-bake}"
: "${WORKSPACE:=/workspace}"

check_settings() {
  require_env IMAGE WORKSPACE_HOST_DIR
}

bake_container_running() {
  [[ "$(docker inspect --format '{{.State.Running}}' "$BAKE_CONTAINER" 2>/dev/null)" == true ]]
}

start_bake_container() {
  if bake_container_running; then
    banner "container $BAKE_CONTAINER already running; skipped"
    return 0
  fi
  # A stopped one from an interrupted run: start over.
  if docker inspect --format '{{.Id}}' "$BAKE_CONTAINER" >/dev/null 2>&1; then logged docker rm -f "$BAKE_CONTAINER"; fi
  mkdir -p "$WORKSPACE_HOST_DIR"
  logged docker run -d --name "$BAKE_CONTAINER" --network host -v "$WORKSPACE_HOST_DIR:$WORKSPACE" \
    --entrypoint sleep "$IMAGE" infinity
  bake_container_running || fail "container $BAKE_CONTAINER is not running after docker run"
  banner "started $BAKE_CONTAINER from $IMAGE for the framework's requirements"
}

check_settings
run_step start_bake_container "throw-away container $BAKE_CONTAINER"
