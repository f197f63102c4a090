#!/usr/bin/env bash
# Stand-in for the docker CLI on the e2e test hosts. There is no dockerd (and no GPU) on the test machine, so a
# "container" here is the test host itself: `docker exec` runs the command on the host, with a container-like
# environment (a clean environment, not the SSH session's; the Ray virtualenv first in PATH, like an image's
# Python) plus the variables given with -e. Everything else the node scripts do is real: SSH, bash, Ray.
#
# Supported, as the Ray and job steps use them:
#   docker exec [-i] [-t] [-d] [-e NAME[=VALUE]]... [-w DIR] CONTAINER CMD [ARG...]
#   docker inspect --format '{{.State.Running}}' CONTAINER
# A container exists while $E2E_DOCKER_STATE/containers/<name> does (the harness creates and removes it);
# that file may hold NAME=VALUE lines, the container's own environment (`docker run -e`).
#
# Environment (set by the per-host wrapper): E2E_DOCKER_STATE, E2E_RAY_VENV.
set -euo pipefail

container_file() {
  printf '%s/containers/%s' "$E2E_DOCKER_STATE" "$1"
}

die() {
  printf '%s\n' "$1" >&2
  exit "${2:-1}"
}

docker_inspect() {
  local format='' name
  while (($#)); do
    case "$1" in
      -f | --format)
        format=$2
        shift 2
        ;;
      --format=*)
        format=${1#--format=}
        shift
        ;;
      -*) die "fake docker: inspect: unsupported option $1" ;;
      *) break ;;
    esac
  done
  (($# == 1)) || die "fake docker: inspect takes exactly one container"
  name=$1
  [[ -f "$(container_file "$name")" ]] || die "Error: No such object: $name"
  case "$format" in
    '{{.State.Running}}') echo true ;;
    *) die "fake docker: inspect: unsupported format '$format'" ;;
  esac
}

docker_exec() {
  local interactive=false detach=false workdir=/ name variable
  local -a env_args=()
  while (($#)); do
    case "$1" in
      -i | --interactive) interactive=true ;;
      -t | --tty) ;;
      -it | -ti) interactive=true ;;
      -d | --detach) detach=true ;;
      -e | --env)
        shift
        variable=$1
        ;;
      --env=*) variable=${1#--env=} ;;
      -w | --workdir)
        shift
        workdir=$1
        ;;
      --workdir=*) workdir=${1#--workdir=} ;;
      -*) die "fake docker: exec: unsupported option $1" ;;
      *) break ;;
    esac
    if [[ -n "${variable:-}" ]]; then
      # Like docker: NAME alone copies the client's value, and is skipped when the client has none.
      if [[ "$variable" == *=* ]]; then
        env_args+=("$variable")
      elif [[ -n "${!variable+set}" ]]; then
        env_args+=("$variable=${!variable}")
      fi
      variable=''
    fi
    shift
  done
  (($# >= 2)) || die "fake docker: exec needs a container and a command"
  name=$1
  shift
  [[ -f "$(container_file "$name")" ]] || die "Error response from daemon: No such container: $name"
  local -a container_env=()
  # grep exits 1 for a container without variables of its own: an empty list, not an error.
  mapfile -t container_env < <(grep -E '^[A-Za-z_][A-Za-z0-9_]*=' "$(container_file "$name")" || :)
  cd "$workdir" 2>/dev/null || die "OCI runtime exec failed: chdir to cwd (\"$workdir\"): no such file or directory" 126
  local -a command=(env -i "PATH=$E2E_RAY_VENV/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME=/root
    LANG=C.UTF-8 "HOSTNAME=$(hostname)" "${container_env[@]}" "${env_args[@]}" "$@")
  if [[ "$detach" == true ]]; then
    setsid -f "${command[@]}" </dev/null >/dev/null 2>&1
  elif [[ "$interactive" == true ]]; then
    exec "${command[@]}"
  else
    exec "${command[@]}" </dev/null
  fi
}

(($#)) || die "fake docker: no command"
subcommand=$1
shift
case "$subcommand" in
  exec) docker_exec "$@" ;;
  inspect) docker_inspect "$@" ;;
  container)
    [[ "${1:-}" == inspect ]] || die "fake docker: unsupported: docker container ${1:-}"
    shift
    docker_inspect "$@"
    ;;
  *) die "fake docker: unsupported command: $subcommand" ;;
esac
