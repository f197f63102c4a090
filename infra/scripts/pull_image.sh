#!/usr/bin/env bash
# pull-image (over SSH, root): the training image, pulled once per node before Ray starts (pulls take minutes).
# Skips when the image is already present. The registry password goes to `docker login --password-stdin` only: it
# is never printed, logged or put on a command line, and the login is removed again after the pull.
#
# Environment (defaults in brackets):
#   IMAGE (required)                 e.g. registry.cn-hangzhou.aliyuncs.com/ns/roll:torch260
#   REGISTRY_USERNAME ['']           log in to the image's registry first (private registry, e.g. your ACR copy)
#   REGISTRY_PASSWORD ['']           required with REGISTRY_USERNAME
#   PULL_TIMEOUT_S [3600]            bound for one pull attempt (a stalled pull is retried)
#   PULL_PROGRESS_S [30]             a progress line (time so far, layers done) this often while a pull runs:
#                                    a 25 GB image over a public IP takes half an hour, which is otherwise silent
#   PULL_CACHE ['']                  host:port of the pull cache inside the VPC to pull through
#                                    (infra/pull_cache.py): the image is pulled as PULL_CACHE/CACHE_REPOSITORY, then
#                                    tagged IMAGE (the name every later step uses) and the cache's name removed. No
#                                    login: the cache serves its own copy (its fill had the registry's credentials).
#                                    A failed pull through the cache fails this step naming the cache (no fallback to
#                                    the registry: at the node counts that use a cache, every node pulling directly
#                                    is what the cache avoids)
#   CACHE_REPOSITORY ['']            the image's path[:tag] behind the cache (required with PULL_CACHE)
#   CHECK_IMAGE_ARCH [0]             1: fail unless the image is built for this host's CPU (an amd64 image on an
#                                    arm64 Ascend server would only fail later, with `exec format error`). Docker
#                                    pulls the host's own platform of a multi-platform image by itself.
#   lib.sh: RETRY_ATTEMPTS, RETRY_DELAY_S, ROLL_CLUSTER_LOG_DIR

: "${REGISTRY_USERNAME:=}"
: "${REGISTRY_PASSWORD:=}"
: "${PULL_TIMEOUT_S:=3600}"
: "${PULL_PROGRESS_S:=30}"
: "${CHECK_IMAGE_ARCH:=0}"
: "${PULL_CACHE:=}"
: "${CACHE_REPOSITORY:=}"

check_settings() {
  require_env IMAGE
  require_int PULL_TIMEOUT_S PULL_PROGRESS_S
  ((PULL_PROGRESS_S > 0)) || fail "PULL_PROGRESS_S must be at least 1, got $PULL_PROGRESS_S"
  if [[ -n "$REGISTRY_USERNAME" && -z "$REGISTRY_PASSWORD" ]]; then
    fail "REGISTRY_USERNAME is set but REGISTRY_PASSWORD is empty"
  fi
  if [[ -n "$PULL_CACHE" ]]; then
    [[ "$PULL_CACHE" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}:[0-9]+$ ]] || fail "PULL_CACHE must be IPv4:port, got '$PULL_CACHE'"
    [[ "$CACHE_REPOSITORY" =~ ^[a-z0-9]+([._/-]+[a-z0-9]+)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$ ]] ||
      fail "CACHE_REPOSITORY must be path[:tag] with PULL_CACHE, got '$CACHE_REPOSITORY'"
  fi
}

# The registry host of IMAGE: the first path component when it looks like a host (has a dot or a port, or is
# localhost), else Docker Hub.
registry_host() {
  local first=${IMAGE%%/*}
  if [[ "$IMAGE" == */* && ("$first" == *.* || "$first" == *:* || "$first" == localhost) ]]; then
    printf '%s\n' "$first"
  else
    printf 'docker.io\n'
  fi
}

# Every docker call below takes IMAGE (or its registry host) after `--`: the Docker CLI's flag parser (cobra/pflag)
# ends the flags there, so a value starting with "-" is an operand, never an option (docker/cli v29.7.2-16-g28f7560
# vendor/github.com/spf13/pflag/flag.go; checked with Docker CLI 28.2.2: `docker pull -- -q` answers
# "invalid reference format").
# see verified-facts#pull-image-flag
image_present() {
  docker image inspect -- "$IMAGE" >/dev/null 2>&1
}

# One login attempt; the password reaches docker through a pipe from printf, a shell builtin (no argv anywhere).
registry_login_once() {
  printf '%s' "$REGISTRY_PASSWORD" \
    | docker login --username "$REGISTRY_USERNAME" --password-stdin -- "$REGISTRY_HOST" >>"$ROLL_CLUSTER_STEP_LOG" 2>&1
}

# layers_done FILE: "D of T layers done" from docker pull's output so far. Without a terminal the Docker CLI prints
# a line per layer and state ("<12-hex id>: Pulling fs layer", "...: Pull complete", "...: Already exists"), no bars.
layers_done() {
  local total finished
  total=$({ grep -oE '^[0-9a-f]{12}: ' -- "$1" || true; } | sort -u | wc -l)
  finished=$({ grep -E '^[0-9a-f]{12}: (Pull complete|Already exists)' -- "$1" || true; } | cut -d: -f1 | sort -u | wc -l)
  printf '%s of %s layers done' "$finished" "$total"
}

# pull_once [REFERENCE]: one pull attempt of REFERENCE (default IMAGE), bounded by PULL_TIMEOUT_S, with a progress
# line every PULL_PROGRESS_S on the step's output and in its log; docker's own output goes to the step log.
pull_once() {
  local reference=${1:-$IMAGE} pid status=0 started=$SECONDS next output="$ROLL_CLUSTER_STEP_LOG.pull"
  printf '+ timeout %s docker pull -- %s\n' "$PULL_TIMEOUT_S" "$reference" >>"$ROLL_CLUSTER_STEP_LOG"
  : >"$output"
  timeout "$PULL_TIMEOUT_S" docker pull -- "$reference" >>"$output" 2>&1 &
  pid=$!
  next=$((SECONDS + PULL_PROGRESS_S))
  while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS >= next)); then
      pull_progress "$((SECONDS - started))" "$output"
      next=$((SECONDS + PULL_PROGRESS_S))
    fi
    sleep 1
  done
  wait "$pid" || status=$?
  cat -- "$output" >>"$ROLL_CLUSTER_STEP_LOG"
  rm -f -- "$output"
  return "$status"
}

pull_progress() {
  local line
  line="still pulling $IMAGE: ${1}s so far, $(layers_done "$2") (this attempt ends at ${PULL_TIMEOUT_S}s)"
  banner "$line"
  banner "$line" >>"$ROLL_CLUSTER_STEP_LOG"
}

# pull_through_cache: IMAGE pulled as PULL_CACHE/CACHE_REPOSITORY, tagged IMAGE, the cache's name removed.
pull_through_cache() {
  local started=$SECONDS cached="$PULL_CACHE/$CACHE_REPOSITORY"
  unset REGISTRY_PASSWORD # the cache serves its own copy of the image: no login here
  banner "pulling $IMAGE through the pull cache as $cached (a progress line every ${PULL_PROGRESS_S}s)"
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" pull_once "$cached" ||
    fail "pulling $IMAGE through the pull cache at $PULL_CACHE failed after $RETRY_ATTEMPTS attempts: see the pull-cache step of the node at ${PULL_CACHE%:*} (/var/log/roll-cluster/pull-cache.log there); container.pullCache off pulls from the registry directly"
  logged docker tag -- "$cached" "$IMAGE"
  logged docker rmi -- "$cached"
  image_present || fail "$IMAGE is not present after the pull through the cache"
  banner "pulled $IMAGE through the pull cache in $((SECONDS - started))s ($(docker image inspect --format '{{.Id}}' -- "$IMAGE"))"
}

pull_image() {
  local started=$SECONDS
  REGISTRY_HOST=$(registry_host)
  if image_present; then
    banner "$IMAGE already present; pull skipped"
    return 0
  fi
  if [[ -n "$PULL_CACHE" ]]; then
    pull_through_cache
    return 0
  fi
  if [[ -n "$REGISTRY_USERNAME" ]]; then
    retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" registry_login_once \
      || fail "docker login to $REGISTRY_HOST as $REGISTRY_USERNAME failed"
    banner "logged in to $REGISTRY_HOST as $REGISTRY_USERNAME"
  fi
  # Nothing after the login needs the password: keep it out of the environment of every later command.
  unset REGISTRY_PASSWORD
  banner "pulling $IMAGE (a progress line every ${PULL_PROGRESS_S}s)"
  local status=0
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" pull_once || status=$?
  if [[ -n "$REGISTRY_USERNAME" ]]; then
    # The credential docker stored in ~/.docker/config.json is not needed once the image is local.
    logged docker logout -- "$REGISTRY_HOST"
  fi
  ((status == 0)) || fail "pulling $IMAGE failed after $RETRY_ATTEMPTS attempts"
  image_present || fail "$IMAGE is not present after a successful pull"
  banner "pulled $IMAGE in $((SECONDS - started))s ($(docker image inspect --format '{{.Id}}' -- "$IMAGE"))"
}

# Docker's name for this host's CPU architecture (the image's .Architecture).
host_docker_arch() {
  case $(uname -m) in
    x86_64 | amd64) echo amd64 ;;
    aarch64 | arm64) echo arm64 ;;
    *) uname -m ;;
  esac
}

check_image_arch() {
  local image_arch host_arch
  host_arch=$(host_docker_arch)
  image_arch=$(docker image inspect --format '{{.Architecture}}' -- "$IMAGE" 2>>"$ROLL_CLUSTER_STEP_LOG") ||
    fail "could not read the architecture of $IMAGE"
  [[ "$image_arch" == "$host_arch" ]] ||
    fail "$IMAGE is built for $image_arch, but this host is $host_arch ($(uname -m)): use an image for $host_arch (Ascend 910B servers are arm64)"
  banner "$IMAGE is built for $image_arch, like this host"
}

check_settings
run_step pull_image "image $IMAGE"
if [[ "$CHECK_IMAGE_ARCH" == 1 ]]; then
  run_step check_image_arch "image architecture"
fi
