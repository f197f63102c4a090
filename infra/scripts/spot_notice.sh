#!/usr/bin/env bash
# Step spot-notice (on every spot node, with shared storage): notice that Alibaba reclaims this node.
#
# Alibaba announces the release of a spot instance about 5 minutes ahead in the instance metadata:
# `instance/spot/termination-time` answers the time then, and nothing (or 404) before
# (verified-facts#spot-notice-alibaba-cloud; the exact answer while safe is UNCONFIRMED, both are handled).
# SPOT_ACTION=install keeps a copy of this step's text (BASH_EXECUTION_STRING) and runs it as a service (systemd;
# else a detached process: install_watcher in lib.sh) with SPOT_ACTION=watch, which polls the metadata every
# SPOT_POLL_S and, on a notice, writes RECLAIM_DIR/NODE_NAME with the termination time.
# RECLAIM_DIR is on the shared storage, so `jobStatus` on the head reports RECLAIMED with the node whichever node
# it is. Installing clears this node's own record: a replaced node is no longer reclaimed.
#
# Environment:
#   SPOT_ACTION        install | watch | once (one look, for tests)                                   required
#   RECLAIM_DIR        the shared directory of reclaim records (/mnt/shared/.roll-cluster/...)        required
#   NODE_NAME          this node's name (node-1)                                                      required
#   SPOT_POLL_S        seconds between looks                                                          15
#   METADATA_URL       the instance metadata service                                  http://100.100.100.200
#   SPOT_STATE_DIR     where the watcher keeps its copy and settings            /var/lib/roll-cluster-spot
#   (METADATA_URL and SPOT_POLL_S are test seams too: the program never sets them; tests/e2e/test_idle_and_reclaim.py
#   points them at a stand-in metadata service)

require_env SPOT_ACTION RECLAIM_DIR NODE_NAME
SPOT_POLL_S=${SPOT_POLL_S:-15}
METADATA_URL=${METADATA_URL:-http://100.100.100.200}
SPOT_STATE_DIR=${SPOT_STATE_DIR:-/var/lib/roll-cluster-spot}
require_int SPOT_POLL_S

install_spot_watcher() {
  mkdir -p -- "$RECLAIM_DIR"
  rm -f -- "${RECLAIM_DIR:?}/$NODE_NAME"
  install_watcher "spot notice watcher" roll-cluster-spot-notice \
    "roll-cluster spot notice (records Alibaba's reclaim notice for jobStatus)" \
    "network-online.target remote-fs.target" 10 "$SPOT_STATE_DIR" SPOT_ACTION=watch \
    RECLAIM_DIR NODE_NAME SPOT_POLL_S METADATA_URL SPOT_STATE_DIR
  banner "a reclaim notice goes to $RECLAIM_DIR/$NODE_NAME"
}

# look_for_notice: true (and the record written) when the metadata announces this instance's release.
look_for_notice() {
  local when
  when=$(curl -fsS --max-time 5 -- "$METADATA_URL/latest/meta-data/instance/spot/termination-time" 2>/dev/null) ||
    return 1
  [[ -n "$when" ]] || return 1
  mkdir -p -- "$RECLAIM_DIR"
  printf '%s\n' "$when" >"$RECLAIM_DIR/$NODE_NAME"
  banner "Alibaba reclaims this spot instance at $when: recorded for jobStatus"
}

case "$SPOT_ACTION" in
  install) run_step install_spot_watcher "install the spot notice watcher" ;;
  watch)
    until look_for_notice; do sleep "$SPOT_POLL_S"; done
    ;;
  once) look_for_notice ;;
  *) fail "SPOT_ACTION must be install, watch or once; got '$SPOT_ACTION'" ;;
esac
