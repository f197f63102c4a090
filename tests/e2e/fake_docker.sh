#!/usr/bin/env bash
# Stand-in for the docker CLI on the e2e test hosts. There is no dockerd (and no GPU) on the test machine, so a
# "container" is a PID namespace (with its own /proc) on the test host: host network, the host's filesystem,
# a clean environment with the Ray virtualenv first in PATH (the "image's" Python). Like a real container it
# hides the host's processes, which matters: `ray stop` kills every process whose command line matches Ray's
# names, and must not see the SSH session that runs the step. Everything else is real: SSH, bash, Ray.
#
# Supported, as the harness, the host steps (docker, pull-image) and the Ray and job steps use them:
#   docker run -d --name NAME [--init] [--network host] [-e NAME=VALUE]... IMAGE [CMD...]   (CMD: sleep infinity)
#     and what the program's container asks for, checked as dockerd checks it, then recorded in <name>.run:
#     --gpus all (needs the nvidia runtime in /etc/docker/daemon.json), --device PATH[:PATH[:rwm]] (must be a
#     device file), -v HOST:CONTAINER[:ro] (a missing host directory is created, as dockerd does), --privileged,
#     --ipc host, --shm-size N, --ulimit, --restart
#   docker info [--format '{{json .Runtimes}}' | '{{.DockerRootDir}}'], docker version --format ...: the "daemon"
#     reports the runtimes of /etc/docker/daemon.json (the host's own copy, see host_init.sh)
#   docker pull [--] IMAGE, docker image inspect [--format '{{.Id}}' | '{{.Architecture}}'] [--] IMAGE: images are names
#     recorded under images/, built for this machine's CPU; a pull waits while the file pull-gate exists
#     docker image ls --format F -- REPOSITORY, image rm -- IMAGE
#   docker run ... --restart POLICY: like a container's own filesystem, /var/lib/roll-cluster is private to the
#       container (a bind mount of <name>.lib in its mount namespace) and survives its restarts; its argv is kept
#       in <name>.argv for a restart at "boot".
#   docker _boot   (the stand-in's own: what dockerd does at boot) start again every container whose restart policy
#       is unless-stopped or always and whose processes are gone (a "rebooted" host, see host_init.sh)
#   docker exec [-i] [-t] [-d] [-e NAME[=VALUE]]... [-w DIR] CONTAINER CMD [ARG...]
#   docker inspect --format '{{.State.Running}}' | '{{.Id}}' CONTAINER   (the id: new for each `docker run`)
#   docker rm -f CONTAINER
# State: $E2E_DOCKER_STATE/containers/<name> holds the PID of the container's init (as the host sees it),
# <name>.env its environment (NAME=VALUE lines), <name>.run the `docker run` arguments (NUL-separated) and
# <name>.restart its restart policy.
#
# Environment (set by the per-host wrapper): E2E_DOCKER_STATE, E2E_RAY_VENV.
set -euo pipefail

containers="$E2E_DOCKER_STATE/containers"
base_env=("PATH=$E2E_RAY_VENV/bin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" HOME=/root LANG=C.UTF-8)

die() {
  printf '%s\n' "$1" >&2
  exit "${2:-1}"
}

# init_pid NAME: the PID of a running container's init; fails when there is no such running container.
init_pid() {
  local pid
  [[ -f "$containers/$1" ]] || return 1
  pid=$(<"$containers/$1")
  kill -0 "$pid" 2>/dev/null && printf '%s\n' "$pid"
}

# has_nvidia_runtime: whether daemon.json registers the nvidia runtime (what `--gpus` needs from dockerd).
has_nvidia_runtime() {
  [[ -s /etc/docker/daemon.json ]] && python3 -c '
import json, sys
sys.exit(0 if "nvidia" in json.load(open("/etc/docker/daemon.json")).get("runtimes", {}) else 1)'
}

docker_run() {
  local name='' launcher pid='' attempt spec restart=no
  local -a env_args=() init=() recorded=() argv=("$@")
  while (($#)); do
    case "$1" in
      -d | --detach) ;;
      --gpus)
        shift
        has_nvidia_runtime || die "docker: Error response from daemon: could not select device driver \"\" with capabilities: [[gpu]]"
        recorded+=("gpus $1")
        ;;
      --device)
        shift
        spec=${1%%:*}
        [[ -c "$spec" ]] || die "docker: Error response from daemon: error gathering device information while adding custom device \"$spec\": no such file or directory"
        recorded+=("device $1")
        ;;
      -v | --volume)
        shift
        spec=${1%%:*}
        [[ "$spec" == /* ]] || die "fake docker: only bind mounts"
        [[ -e "$spec" ]] || mkdir -p "$spec"
        recorded+=("volume $1")
        ;;
      --privileged) recorded+=(privileged) ;;
      --ipc) shift && recorded+=("ipc $1") ;;
      --shm-size) shift && recorded+=("shm-size $1") ;;
      --ulimit) shift && recorded+=("ulimit $1") ;;
      --restart) shift && restart=$1 && recorded+=("restart $1") ;;
      --restart=*) restart=${1#--restart=} && recorded+=("restart $restart") ;;
      # Docker's --init puts a reaper (tini) in front of CMD as PID 1; bash reaps orphans the same way. Without
      # it, daemons started by `docker exec` (Ray's) become zombies of CMD when they exit, as in real Docker.
      --init) init=(bash -c '"$@" & wait "$!"' init) ;;
      --name) shift && name=$1 ;;
      --name=*) name=${1#--name=} ;;
      --network | --net) shift && [[ "$1" == host ]] || die "fake docker: only host networking" ;;
      --network=host | --net=host) ;;
      -e | --env) shift && env_args+=("$1") ;;
      -*) die "fake docker: run: unsupported option $1" ;;
      *) break ;;
    esac
    shift
  done
  (($# >= 1)) && [[ -n "$name" ]] || die "fake docker: run needs -d --name NAME IMAGE"
  shift # the image: there are no images here
  (($#)) || set -- sleep infinity
  [[ ! -e "$containers/$name" ]] || die "docker: Error response from daemon: Conflict. The container name \"/$name\" is already in use."
  mkdir -p "$containers" "$containers/$name.lib" /var/lib/roll-cluster
  printf '%s\n' "${recorded[@]}" >"$containers/$name.run"
  : >"$containers/$name.env"
  if ((${#env_args[@]})); then
    printf '%s\n' "${env_args[@]}" >"$containers/$name.env"
  fi
  printf '%s\0' "${argv[@]}" >"$containers/$name.argv"
  head -c 32 /dev/urandom | sha256sum | cut -d ' ' -f 1 >"$containers/$name.id"
  printf '%s\n' "$restart" >"$containers/$name.restart"
  # shellcheck disable=SC2016 # $1 expands in the container's first shell
  setsid unshare --pid --fork --mount-proc -- \
    bash -c 'mount --bind "$1" /var/lib/roll-cluster && shift && exec "$@"' container "$containers/$name.lib" \
    env -i "${base_env[@]}" "${env_args[@]}" "${init[@]}" "$@" \
    </dev/null >>"$containers/$name.log" 2>&1 &
  launcher=$!
  # The container's init is the child unshare forks into the new PID namespace.
  for attempt in $(seq 100); do
    pid=$(pgrep -P "$launcher" || :) # pgrep exits 1 until the child exists
    [[ -z "$pid" ]] || break
    sleep 0.05
  done
  [[ -n "$pid" ]] || die "fake docker: the container did not start (attempt $attempt)"
  printf '%s\n' "$pid" >"$containers/$name"
  printf '%s\n' "$name"
}

docker_rm() {
  [[ "${1:-}" == -f ]] || die "fake docker: only rm -f"
  local pid
  if pid=$(init_pid "$2"); then
    kill -KILL "$pid" # the kernel ends every process of the container's PID namespace with it
  fi
  [[ -e "$containers/$2" ]] || die "Error response from daemon: No such container: $2"
  rm -rf "$containers/$2" "$containers/$2.env" "$containers/$2.run" "$containers/$2.argv" "$containers/$2.restart" "$containers/$2.lib" \
    "$containers/$2.id"
  printf '%s\n' "$2"
}

docker_inspect() {
  local format=''
  while (($#)); do
    case "$1" in
      -f | --format) shift && format=$1 ;;
      --format=*) format=${1#--format=} ;;
      -*) die "fake docker: inspect: unsupported option $1" ;;
      *) break ;;
    esac
    shift
  done
  (($# == 1)) || die "fake docker: inspect takes exactly one container"
  [[ -f "$containers/$1" ]] || die "Error: No such object: $1"
  case $format in
    '{{.State.Running}}') if init_pid "$1" >/dev/null; then echo true; else echo false; fi ;;
    '{{.Id}}') cat -- "$containers/$1.id" ;;
    *) die "fake docker: inspect: unsupported format '$format'" ;;
  esac
}

docker_exec() {
  local interactive=false detach=false workdir=/ variable name pid
  local -a env_args=()
  while (($#)); do
    variable=''
    case "$1" in
      -i | --interactive) interactive=true ;;
      -t | --tty) ;;
      -it | -ti) interactive=true ;;
      -d | --detach) detach=true ;;
      -e | --env) shift && variable=$1 ;;
      --env=*) variable=${1#--env=} ;;
      -w | --workdir) shift && workdir=$1 ;;
      --workdir=*) workdir=${1#--workdir=} ;;
      -*) die "fake docker: exec: unsupported option $1" ;;
      *) break ;;
    esac
    if [[ "$variable" == *=* ]]; then
      env_args+=("$variable")
    elif [[ -n "$variable" && -n "${!variable+set}" ]]; then
      # Like docker: NAME alone copies the client's value, and is skipped when the client has none.
      env_args+=("$variable=${!variable}")
    fi
    shift
  done
  (($# >= 2)) || die "fake docker: exec needs a container and a command"
  name=$1
  shift
  # A daemon that hangs, for the tests of bounded probes: $E2E_DOCKER_STATE/hang-exec holds a text; an exec whose
  # command contains it never returns (its process is named e2e-hung-exec).
  if [[ -s "$E2E_DOCKER_STATE/hang-exec" && "$*" == *"$(<"$E2E_DOCKER_STATE/hang-exec")"* ]]; then
    exec -a e2e-hung-exec sleep 3600
  fi
  pid=$(init_pid "$name") || die "Error response from daemon: No such container: $name"
  local -a container_env=()
  mapfile -t container_env <"$containers/$name.env"
  [[ -d "$workdir" ]] || die "OCI runtime exec failed: chdir to cwd (\"$workdir\"): no such file or directory" 126
  local -a command=(nsenter --target "$pid" --pid --mount --wd="$workdir" --
    env -i "${base_env[@]}" "HOSTNAME=$(hostname)" "${container_env[@]}" "${env_args[@]}" "$@")
  if [[ "$detach" == true ]]; then
    setsid -f "${command[@]}" </dev/null >/dev/null 2>&1
  elif [[ "$interactive" == true ]]; then
    exec "${command[@]}"
  else
    exec "${command[@]}" </dev/null
  fi
}

docker_info() {
  local format=''
  [[ "${1:-}" != --format ]] || format=$2
  python3 - "$format" <<'PY'
import json, os, sys
path = "/etc/docker/daemon.json"
config = json.load(open(path)) if os.path.exists(path) and os.path.getsize(path) else {}
runtimes = {"runc": {"path": "runc"}, **config.get("runtimes", {})}
root = config.get("data-root", "/var/lib/docker")
fmt = sys.argv[1]
if fmt == "{{json .Runtimes}}":
    print(json.dumps(runtimes, sort_keys=True))
elif fmt == "{{.DockerRootDir}}":
    print(root)
elif fmt == "":
    print("Server:\n Runtimes: " + " ".join(sorted(runtimes)) + "\n Docker Root Dir: " + root)
else:
    sys.exit("fake docker info: unsupported format " + fmt)
PY
}

docker_image() {
  local format='' image arch file
  if [[ "${1:-}" == ls ]]; then
    # docker image ls --format '{{.Repository}}:{{.Tag}}' -- REPOSITORY (prune_images.sh): the recorded images
    [[ "${2:-}" == --format && "${4:-}" == -- ]] || die "fake docker: image ls: only --format F -- REPOSITORY"
    for file in "$E2E_DOCKER_STATE/images/${5//\//_}":*; do
      [[ -f "$file" ]] || continue
      file=${file##*/}
      printf '%s:%s\n' "$5" "${file##*:}"
    done
    return 0
  fi
  if [[ "${1:-}" == rm ]]; then
    # docker image rm -- IMAGE: no container here runs from an image, so nothing refuses
    [[ "${2:-}" == -- ]] || die "fake docker: image rm: only -- IMAGE"
    rm -f "$E2E_DOCKER_STATE/images/${3//\//_}"
    return 0
  fi
  [[ "${1:-}" == inspect ]] || die "fake docker: image: only inspect, ls and rm"
  shift
  if [[ "${1:-}" == --format || "${1:-}" == -f ]]; then
    format=$2
    shift 2
  fi
  [[ "${1:-}" != -- ]] || shift  # `--` ends the options, as in Docker's CLI
  image=$1
  [[ -f "$E2E_DOCKER_STATE/images/${image//\//_}" ]] || die "Error response from daemon: No such image: $image"
  case $format in
    '') printf '[{"RepoTags": ["%s"]}]\n' "$image" ;;
    '{{.Id}}') cat "$E2E_DOCKER_STATE/images/${image//\//_}" ;;
    '{{.Architecture}}')
      arch=$(uname -m)
      case $arch in x86_64) echo amd64 ;; aarch64) echo arm64 ;; *) echo "$arch" ;; esac
      ;;
    *) die "fake docker: image inspect: unsupported format $format" ;;
  esac
}

# A pull that lasts until the test says: while $E2E_DOCKER_STATE/pull-gate exists (the test removes it) the pull
# has one of its two layers done, as docker prints layers without a terminal; bounded, so a test that never opens
# the gate fails the pull instead of hanging.
pull_gate() {
  local gate="$E2E_DOCKER_STATE/pull-gate" waited=0
  [[ -e "$gate" ]] || return 0
  printf '%s\n' "0123456789ab: Pulling fs layer" "ba9876543210: Pulling fs layer" "0123456789ab: Pull complete"
  while [[ -e "$gate" ]]; do
    ((waited < 3000)) || die "fake docker: pull-gate never removed"
    sleep 0.1
    waited=$((waited + 1))
  done
  printf '%s\n' "ba9876543210: Pull complete"
}

docker_pull() {
  local image=${*: -1}
  pull_gate
  mkdir -p "$E2E_DOCKER_STATE/images"
  echo "sha256:$(printf '%s' "$image" | sha256sum | cut -c 1-64)" >"$E2E_DOCKER_STATE/images/${image//\//_}"
  echo "Status: Downloaded newer image for $image"
}

docker_boot() {
  local state name policy
  local -a argv
  for state in "$containers"/*.restart; do
    [[ -e "$state" ]] || continue
    name=$(basename "$state" .restart)
    policy=$(<"$state")
    [[ "$policy" == unless-stopped || "$policy" == always ]] || continue
    ! init_pid "$name" >/dev/null || continue
    mapfile -d '' -t argv <"$containers/$name.argv"
    rm -f "$containers/$name"
    docker_run "${argv[@]}" >/dev/null
  done
}

(($#)) || die "fake docker: no command"
subcommand=$1
shift
case "$subcommand" in
  run) docker_run "$@" ;;
  rm) docker_rm "$@" ;;
  exec) docker_exec "$@" ;;
  inspect) docker_inspect "$@" ;;
  info) docker_info "$@" ;;
  version) echo 27.3.1-e2e ;;
  image) docker_image "$@" ;;
  pull) docker_pull "$@" ;;
  _boot) docker_boot ;;
  *) die "fake docker: unsupported command: $subcommand" ;;
esac
