#!/usr/bin/env bash
# pull-cache (over SSH, root): a cache of the training image on this node (infra/pull_cache.py): a plain distribution
# registry (`docker-registry` on Debian/Ubuntu, `docker-distribution` on EL-family systems; no proxy mode, no auth,
# no deletes), serving plain HTTP on CACHE_LISTEN_ADDR:CACHE_PORT inside the security group, its data under
# CACHE_DIR, run as the systemd unit CACHE_UNIT (or, without systemd, a detached process whose pid is in CACHE_DIR).
# Then the fill copies the image into it over the registry HTTP API ($HELPER_PULL_CACHE_FILL): every blob the cache
# lacks fetched once from the upstream, then the manifest under the tag, so the nodes' pulls find the cache full.
# The upstream's credentials reach the fill only, through its environment: never a file, a command line or a log.
# A second run changes nothing unless a setting changed (then the cache restarts with it) and fetches no blob. Fails
# by name: a cache that does not start, answer or fill stops this step, and every node that pulls through it waits.
#
# Environment (defaults in brackets):
#   CACHE_UPSTREAM (required)        the registry the cache fills from: https://registry.example.com, or another
#                                    cache http://10.20.0.1:5000 (a fan-out cache)
#   CACHE_REPOSITORY (required)      the image as pulled through the cache: path[:tag] (e.g. roll/pytorch:tag)
#   CACHE_LISTEN_ADDR (required)     the address the cache listens on (the node's private IP)
#   CACHE_PORT [5000]
#   CACHE_DIR (required)             the cache's data, config and (without systemd) pid and log
#   CACHE_UNIT [roll-pull-cache]     the systemd unit's name
#   CACHE_START_TIMEOUT_S [60]       bound for the cache to answer after a (re)start
#   CACHE_FILL_TIMEOUT_S [3600]      bound for one fill of the cache
#   CACHE_PLATFORM_ARCH ['']         the platform picked from a multi-platform image (empty: this host's)
#   REGISTRY_USERNAME [''], REGISTRY_PASSWORD ['']   the upstream's credentials (a private registry)
#   lib.sh: RETRY_ATTEMPTS, RETRY_DELAY_S, ROLL_CLUSTER_LOG_DIR, SYSTEMD_UNIT_DIR, SYSTEMD_RUN_DIR, package manager settings

: "${CACHE_PORT:=5000}"
: "${CACHE_UNIT:=roll-pull-cache}"
: "${CACHE_START_TIMEOUT_S:=60}"
: "${CACHE_FILL_TIMEOUT_S:=3600}"
: "${CACHE_PLATFORM_ARCH:=}"
: "${REGISTRY_USERNAME:=}"
: "${REGISTRY_PASSWORD:=}"
: "${CACHE_DIR:=}" # required: checked below

CACHE_BIN=''
CACHE_CONFIG_CHANGED=0

check_settings() {
  require_env CACHE_UPSTREAM CACHE_REPOSITORY CACHE_LISTEN_ADDR CACHE_DIR
  require_int CACHE_PORT CACHE_START_TIMEOUT_S CACHE_FILL_TIMEOUT_S
  [[ "$CACHE_UPSTREAM" =~ ^https?://[A-Za-z0-9.-]+(:[0-9]+)?$ ]] ||
    fail "CACHE_UPSTREAM must be http(s)://host[:port], got '$CACHE_UPSTREAM'"
  [[ "$CACHE_REPOSITORY" =~ ^[a-z0-9]+([._/-]+[a-z0-9]+)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$ ]] ||
    fail "CACHE_REPOSITORY must be path[:tag], got '$CACHE_REPOSITORY'"
  [[ "$CACHE_LISTEN_ADDR" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] ||
    fail "CACHE_LISTEN_ADDR must be an IPv4 address, got '$CACHE_LISTEN_ADDR'"
  [[ "$CACHE_DIR" == /* && "$CACHE_DIR" != *[[:space:]]* ]] ||
    fail "CACHE_DIR must be an absolute path without spaces, got '$CACHE_DIR'"
  [[ "$CACHE_UNIT" =~ ^[a-z0-9-]+$ ]] || fail "CACHE_UNIT must be a unit name (a-z, 0-9, -), got '$CACHE_UNIT'"
  if [[ -n "$REGISTRY_USERNAME" && -z "$REGISTRY_PASSWORD" ]]; then
    fail "REGISTRY_USERNAME is set but REGISTRY_PASSWORD is empty"
  fi
  [[ "$REGISTRY_PASSWORD" != *$'\n'* ]] || fail "REGISTRY_PASSWORD must be one line"
  # Only the fill gets the credentials (in its own environment): not the registry, curl or systemctl.
  export -n REGISTRY_USERNAME REGISTRY_PASSWORD
}

# The registry's binary: Debian/Ubuntu's docker-registry package installs /usr/bin/docker-registry, the EL-family
# docker-distribution package /usr/bin/registry (whether Alibaba Cloud Linux 3's repositories carry it is
# UNCONFIRMED: the install then fails naming the package).
find_registry_binary() {
  local name
  for name in docker-registry registry; do
    if command -v "$name" >/dev/null 2>&1 && "$name" --version >/dev/null 2>&1; then
      CACHE_BIN=$(command -v "$name")
      return 0
    fi
  done
  return 1
}

install_cache_registry() {
  if find_registry_binary; then
    banner "registry already installed: $CACHE_BIN ($("$CACHE_BIN" --version 2>&1 | head -n 1)); skipped"
  else
    detect_os
    case $PKG_FAMILY in
      apt) install_packages docker-registry ;;
      rpm) install_packages docker-distribution ;;
    esac
    find_registry_binary || fail "no docker-registry or registry binary after installing the package"
    banner "installed $CACHE_BIN ($("$CACHE_BIN" --version 2>&1 | head -n 1))"
  fi
  # The packages ship a service of their own on port 5000 with their own storage (Debian starts it at install):
  # this cache is the only registry the program runs here.
  local unit
  if [[ -d "$SYSTEMD_RUN_DIR" ]]; then
    for unit in docker-registry docker-distribution; do
      if systemctl is-enabled --quiet "$unit" 2>/dev/null || systemctl is-active --quiet "$unit" 2>/dev/null; then
        logged systemctl disable --now "$unit"
        banner "the package's own $unit service stopped and disabled (this cache is $CACHE_UNIT)"
      fi
    done
  fi
}

# The config, as YAML whose strings are JSON strings (a subset of YAML): no value can break out of its field. It
# holds no secret.
cache_config_text() {
  python3 "$HELPER_PULL_CACHE_CONFIG"
}

write_cache_config() {
  local text
  mkdir -p -- "$CACHE_DIR/registry"
  chmod 0700 -- "$CACHE_DIR"
  text=$(cache_config_text)
  write_file_if_changed "$CACHE_DIR/config.yml" "$text" 0600
  CACHE_CONFIG_CHANGED=$FILE_CHANGED
  if ((CACHE_CONFIG_CHANGED)); then
    banner "cache config written: $CACHE_DIR/config.yml"
  else
    banner "cache config unchanged ($CACHE_DIR/config.yml); skipped"
  fi
}

cache_answers() {
  curl -fsS -o /dev/null --max-time 5 -- "http://$CACHE_LISTEN_ADDR:$CACHE_PORT/v2/"
}

start_cache_unit() {
  local unit_file="$SYSTEMD_UNIT_DIR/$CACHE_UNIT.service"
  write_file_if_changed "$unit_file" "[Unit]
Description=roll-cluster pull cache of the training image
After=network-online.target local-fs.target
RequiresMountsFor=$CACHE_DIR

[Service]
ExecStart=$CACHE_BIN serve $CACHE_DIR/config.yml
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target"
  if ((FILE_CHANGED)); then
    logged systemctl daemon-reload
  fi
  if ((FILE_CHANGED || CACHE_CONFIG_CHANGED)) || ! systemctl is-active --quiet "$CACHE_UNIT"; then
    logged systemctl enable "$CACHE_UNIT"
    logged systemctl restart "$CACHE_UNIT"
    banner "started $CACHE_UNIT (systemd)"
  else
    banner "$CACHE_UNIT already running with this configuration; skipped"
  fi
}

cache_process_running() {
  local pid
  [[ -s "$CACHE_DIR/registry.pid" ]] || return 1
  pid=$(cat -- "$CACHE_DIR/registry.pid")
  [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null
}

old_cache_gone() {
  ! kill -0 "$OLD_CACHE_PID" 2>/dev/null
}

start_cache_process() {
  local pid
  if cache_process_running && ((!CACHE_CONFIG_CHANGED)); then
    banner "cache already running (pid $(cat -- "$CACHE_DIR/registry.pid")) with this configuration; skipped"
    return 0
  fi
  if cache_process_running; then
    pid=$(cat -- "$CACHE_DIR/registry.pid")
    kill -- "$pid"
    OLD_CACHE_PID=$pid wait_for "the old cache (pid $pid) to stop" 30 1 old_cache_gone
  fi
  # Detached from this step's session, so that it outlives the SSH connection.
  setsid "$CACHE_BIN" serve "$CACHE_DIR/config.yml" >>"$CACHE_DIR/registry.log" 2>&1 </dev/null &
  printf '%s\n' "$!" >"$CACHE_DIR/registry.pid"
  banner "started the cache as pid $(cat -- "$CACHE_DIR/registry.pid") (no systemd; log $CACHE_DIR/registry.log)"
}

start_cache() {
  if [[ -d "$SYSTEMD_RUN_DIR" ]]; then start_cache_unit; else start_cache_process; fi
  wait_for "the pull cache to answer on http://$CACHE_LISTEN_ADDR:$CACHE_PORT/v2/" "$CACHE_START_TIMEOUT_S" 1 \
    cache_answers
  banner "pull cache answers on $CACHE_LISTEN_ADDR:$CACHE_PORT"
}

platform_arch() {
  if [[ -n "$CACHE_PLATFORM_ARCH" ]]; then
    printf '%s\n' "$CACHE_PLATFORM_ARCH"
    return 0
  fi
  case $(uname -m) in
    x86_64 | amd64) echo amd64 ;;
    aarch64 | arm64) echo arm64 ;;
    *) uname -m ;;
  esac
}

# fill_cache: the image copied from CACHE_UPSTREAM into the cache (pull_cache_fill.py), bounded as a whole; its
# retries are its own (a transient failure only), so a failure here is final and its one-line reason is the step's.
fill_cache() {
  local started=$SECONDS status=0 reason
  REGISTRY_USERNAME=$REGISTRY_USERNAME REGISTRY_PASSWORD=$REGISTRY_PASSWORD \
    CACHE_URL="http://$CACHE_LISTEN_ADDR:$CACHE_PORT" CACHE_ARCH=$(platform_arch) \
    timeout "$CACHE_FILL_TIMEOUT_S" python3 "$HELPER_PULL_CACHE_FILL" >>"$ROLL_CLUSTER_STEP_LOG" 2>&1 || status=$?
  if ((status == 124)); then
    fail "filling the pull cache with $CACHE_REPOSITORY from $CACHE_UPSTREAM took over ${CACHE_FILL_TIMEOUT_S}s"
  elif ((status != 0)); then
    reason=$(grep '^pull-cache fill: ' -- "$ROLL_CLUSTER_STEP_LOG" | tail -n 1)
    fail "filling the pull cache with $CACHE_REPOSITORY from $CACHE_UPSTREAM failed: ${reason#pull-cache fill: }"
  fi
  banner "$(tail -n 1 -- "$ROLL_CLUSTER_STEP_LOG") in $((SECONDS - started))s"
}

check_settings
run_step install_cache_registry "the distribution registry"
run_step write_cache_config "the cache's configuration"
run_step start_cache "the pull cache on $CACHE_LISTEN_ADDR:$CACHE_PORT"
run_step fill_cache "the cache filled with $CACHE_REPOSITORY"
