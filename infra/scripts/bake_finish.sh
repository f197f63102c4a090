#!/usr/bin/env bash
# bake-prep, part 2 (over SSH on the head, root; only with nodes.bake): commit what fetch_code.sh installed in the
# throw-away container into the local tag IMAGE (so nodes booted from the baked image start their container with
# the framework's requirements already installed), remove that container, and flush the disks before the ECS
# custom image snapshots them.
# Without BAKE_CONTAINER running (a framework without code to fetch) only the flush is done.
#
# Environment (defaults in brackets):
#   IMAGE (required)                the training image tag the commit replaces locally
#   BAKE_CONTAINER [roll-cluster-bake]
#   ROLL_CLUSTER_STATE_DIR [/var/lib/roll-cluster]   baked.env records what was baked, for whoever inspects a node
#   lib.sh: ROLL_CLUSTER_LOG_DIR

: "${BAKE_CONTAINER:=roll-cluster-bake}"
: "${ROLL_CLUSTER_STATE_DIR:=/var/lib/roll-cluster}"

check_settings() {
  require_env IMAGE
}

commit_requirements() {
  if ! docker inspect --format '{{.Id}}' "$BAKE_CONTAINER" >/dev/null 2>&1; then
    banner "no container $BAKE_CONTAINER: no framework requirements to commit; skipped"
    return 0
  fi
  # The committed image keeps the original's entrypoint; its command is the throw-away container's (`infinity`),
  # which does not matter: the training container sets its own command.
  logged docker commit "$BAKE_CONTAINER" "$IMAGE"
  logged docker rm -f "$BAKE_CONTAINER"
  banner "committed the framework's requirements into the local $IMAGE"
}

flush_disks() {
  mkdir -p "$ROLL_CLUSTER_STATE_DIR"
  write_file_if_changed "$ROLL_CLUSTER_STATE_DIR/baked.env" "$(
    printf 'image=%s\n' "$IMAGE"
    printf 'baked_at=%s' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  )"
  # An image made from a running instance may miss what is still in the page cache (CreateImage's own advice).
  logged sync
  banner "disks flushed; ready for the ECS custom image"
}

check_settings
run_step commit_requirements "framework requirements into $IMAGE"
run_step flush_disks "flush before the image"
