#!/usr/bin/env bash
# pull-cache-delete (over SSH, root; at destroy, when container.pullCache is turned off, or when the node stops
# running a cache): the pull cache stopped and removed from this node, its systemd unit (or, without systemd, its
# detached process) and its data directory, so that nothing of it stays on your own host. A cache that is already
# gone is success: a teardown must never block a destroy.
#
# Environment (defaults in brackets):
#   CACHE_DIR (required)             the cache's data, config and (without systemd) pid
#   CACHE_UNIT [roll-pull-cache]     the systemd unit's name
#   lib.sh: SYSTEMD_UNIT_DIR, SYSTEMD_RUN_DIR

: "${CACHE_UNIT:=roll-pull-cache}"
: "${CACHE_DIR:=}" # required: checked below

check_settings() {
  require_env CACHE_DIR
  [[ "$CACHE_DIR" == /*/pull-cache && "$CACHE_DIR" != *[[:space:]]* && "$CACHE_DIR" != *..* ]] ||
    fail "CACHE_DIR must be an absolute path ending in /pull-cache, got '$CACHE_DIR'"
  [[ "$CACHE_UNIT" =~ ^[a-z0-9-]+$ ]] || fail "CACHE_UNIT must be a unit name (a-z, 0-9, -), got '$CACHE_UNIT'"
}

stop_cache() {
  local unit_file="$SYSTEMD_UNIT_DIR/$CACHE_UNIT.service" pid
  if [[ -d "$SYSTEMD_RUN_DIR" && -f "$unit_file" ]]; then
    logged systemctl disable --now "$CACHE_UNIT"
    rm -f -- "$unit_file"
    logged systemctl daemon-reload
    banner "$CACHE_UNIT stopped and removed"
  fi
  if [[ -s "$CACHE_DIR/registry.pid" ]]; then
    pid=$(cat -- "$CACHE_DIR/registry.pid")
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
      kill -- "$pid"
      banner "the cache's process $pid stopped"
    fi
  fi
  if [[ -d "$CACHE_DIR" ]]; then
    rm -rf -- "$CACHE_DIR"
    banner "removed $CACHE_DIR"
  else
    banner "no pull cache here ($CACHE_DIR); nothing to remove"
  fi
}

check_settings
run_step stop_cache "the pull cache removed"
