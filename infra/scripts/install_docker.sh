#!/usr/bin/env bash
# docker (over SSH, root): Docker CE and the NVIDIA Container Toolkit from Alibaba's mirrors, the nvidia runtime
# registered with Docker, Docker's data root on the data disk, Docker enabled and running.
# Alibaba Cloud Linux 3 (dnf/yum) and Ubuntu 22.04 (apt). A second run changes nothing and says what it skipped.
#
# Environment (defaults in brackets):
#   DOCKER_CE_MIRROR [https://mirrors.aliyun.com/docker-ce]
#   NVIDIA_CT_MIRROR [https://mirrors.aliyun.com/libnvidia-container]
#   DOCKER_CE_CENTOS_RELEASE [8]   CentOS release of the docker-ce repo used on Alibaba Cloud Linux 3, whose own
#                                  $releasever (3) has no docker-ce repo
#   DOCKER_DATA_ROOT ['']          Docker's data-root (e.g. /data/docker); empty: Docker's default
#   DOCKER_DAEMON_JSON [/etc/docker/daemon.json]
#   DOCKER_MAX_CONCURRENT_DOWNLOADS [10]   layers a pull downloads at once (Docker's default 3); Alibaba's ACR P2P
#                                  guide recommends 5-20 (doc-detail/120603); not applied with KEEP_EXISTING_DOCKER=1
#   INSECURE_REGISTRIES ['']      host:port of the pull cache this node pulls through over plain HTTP inside the
#                                  security group (infra/pull_cache.py): listed in daemon.json's insecure-registries,
#                                  beside any the host already lists; the one this step added before is removed
#                                  when it changes or is emptied (recorded in ROLL_CLUSTER_STATE_DIR). A change of
#                                  only this entry is applied by a reload of the running dockerd (SIGHUP), never by a
#                                  restart: a training container keeps running when the cache is turned on or off
#   DOCKER_PIDFILE [/var/run/docker.pid]   dockerd's pidfile: the reload's SIGHUP goes to its pid where systemd
#                                  cannot reload docker
#   DOCKER_START_TIMEOUT_S [120]   bound for dockerd to answer after a (re)start
#   PARALLEL_GUNZIP_PACKAGE [pigz] the package that puts `unpigz` on dockerd's PATH (best effort, see below)
#   YUM_REPOS_DIR [/etc/yum.repos.d], APT_SOURCES_DIR [/etc/apt/sources.list.d], APT_KEYRINGS_DIR [/etc/apt/keyrings]
#   ROLL_CLUSTER_STATE_DIR [/var/lib/roll-cluster]   remembers the daemon.json Docker was last restarted with
#   NVIDIA_RUNTIME [1]             0: no NVIDIA Container Toolkit and runtime (Ascend NPUs are passed as devices)
#   KEEP_EXISTING_DOCKER [0]       1 (your own hosts): a docker or nvidia-ctk already on the host is used as it is,
#                                  never reinstalled, replaced (docker.io by docker-ce) or upgraded; only what is
#                                  missing is installed (then the OS must be Alibaba Cloud Linux 3 or Ubuntu)
#   lib.sh: OS_RELEASE_FILE, PACKAGE_LOCK_TIMEOUT_S, YUM_PID_FILE, PACKAGE_MANAGER_PROCESSES, APT_LOCK_FILES,
#           RETRY_ATTEMPTS, RETRY_DELAY_S, ROLL_CLUSTER_LOG_DIR

: "${DOCKER_CE_MIRROR:=https://mirrors.aliyun.com/docker-ce}"
: "${NVIDIA_CT_MIRROR:=https://mirrors.aliyun.com/libnvidia-container}"
: "${DOCKER_CE_CENTOS_RELEASE:=8}"
: "${DOCKER_DATA_ROOT:=}"
: "${DOCKER_DAEMON_JSON:=/etc/docker/daemon.json}"
: "${DOCKER_MAX_CONCURRENT_DOWNLOADS:=10}"
: "${DOCKER_START_TIMEOUT_S:=120}"
: "${INSECURE_REGISTRIES:=}"
: "${DOCKER_PIDFILE:=/var/run/docker.pid}"
: "${PARALLEL_GUNZIP_PACKAGE:=pigz}"
: "${YUM_REPOS_DIR:=/etc/yum.repos.d}"
: "${APT_SOURCES_DIR:=/etc/apt/sources.list.d}"
: "${APT_KEYRINGS_DIR:=/etc/apt/keyrings}"
: "${ROLL_CLUSTER_STATE_DIR:=/var/lib/roll-cluster}"

: "${NVIDIA_RUNTIME:=1}"
: "${KEEP_EXISTING_DOCKER:=0}"

ENGINE_PACKAGES=(docker-ce docker-ce-cli containerd.io)
TOOLKIT_PACKAGES=(nvidia-container-toolkit)
DOCKER_PACKAGES=()
DAEMON_JSON_CHANGED=0 # a setting that dockerd applies at start only changed: a restart is due
INSECURE_REGISTRIES_CHANGED=0 # the program's insecure-registries entry changed: a reload applies it
INSECURE_PRIOR_DIGEST=''      # daemon.json's digest before that change
INSECURE_REMOVED=''           # the program's addresses that change took out of the list
# `docker info`: the registries the running dockerd treats as insecure by name (host:port entries; CIDRs are apart).
# shellcheck disable=SC2016  # a Go template for docker, written literally
INSECURE_INFO_FORMAT='{{range $name, $index := .RegistryConfig.IndexConfigs}}{{if not $index.Secure}}{{$name}} {{end}}{{end}}'
# The digest of the daemon.json dockerd was last (re)started with by this script: a restart is due when it differs.
APPLIED_CONFIG_RECORD=$ROLL_CLUSTER_STATE_DIR/docker-daemon-json.applied

check_settings() {
  require_int DOCKER_START_TIMEOUT_S
  require_int DOCKER_MAX_CONCURRENT_DOWNLOADS
  local address
  for address in $INSECURE_REGISTRIES; do
    [[ "$address" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}:[0-9]+$ ]] ||
      fail "INSECURE_REGISTRIES must list IPv4:port addresses, got '$address'"
  done
  if [[ -n "$DOCKER_DATA_ROOT" && "$DOCKER_DATA_ROOT" != /* ]]; then
    fail "DOCKER_DATA_ROOT must be an absolute path, got '$DOCKER_DATA_ROOT'"
  fi
  [[ "$NVIDIA_RUNTIME" == 0 || "$NVIDIA_RUNTIME" == 1 ]] || fail "NVIDIA_RUNTIME must be 0 or 1, got '$NVIDIA_RUNTIME'"
  if [[ "$KEEP_EXISTING_DOCKER" == 1 ]] && command -v docker >/dev/null 2>&1; then
    banner "docker already on this host ($(command -v docker)): used as it is, never reinstalled or upgraded"
  else
    DOCKER_PACKAGES+=("${ENGINE_PACKAGES[@]}")
  fi
  if [[ "$NVIDIA_RUNTIME" == 1 ]]; then
    if [[ "$KEEP_EXISTING_DOCKER" == 1 ]] && command -v nvidia-ctk >/dev/null 2>&1; then
      banner "NVIDIA Container Toolkit already on this host: used as it is"
    else
      DOCKER_PACKAGES+=("${TOOLKIT_PACKAGES[@]}")
    fi
  fi
  if ((${#DOCKER_PACKAGES[@]} == 0)); then
    return 0 # nothing to install: the host's OS does not matter
  fi
  detect_os
  banner "operating system: $OS_ID $OS_VERSION_ID (${RPM_TOOL:-apt})"
}

# wants PACKAGE: whether this run installs PACKAGE.
wants() {
  local pkg
  for pkg in "${DOCKER_PACKAGES[@]}"; do
    [[ "$pkg" != "$1" ]] || return 0
  done
  return 1
}

# configure_repo_file PATH CONTENT: write a repository definition, saying whether it was already there.
configure_repo_file() {
  write_file_if_changed "$1" "$2" 0644
  if ((FILE_CHANGED)); then
    banner "wrote $1"
  else
    banner "$1 already configured; skipped"
  fi
}

# download_key URL PATH: a repository signing key (ASCII-armoured .asc, which apt's signed-by accepts as is).
download_key() {
  local url=$1 path=$2
  if [[ -s "$path" ]]; then
    banner "$path already present; skipped"
    return 0
  fi
  mkdir -p "$(dirname "$path")"
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" log_cmd curl -fsSL --max-time 60 -o "$path.part" "$url" \
    || fail "downloading the signing key $url failed"
  chmod 0644 "$path.part"
  mv -f "$path.part" "$path"
  banner "downloaded $url to $path"
}

configure_repositories() {
  if ((${#DOCKER_PACKAGES[@]} == 0)); then
    banner "nothing to install; repositories left as they are"
    return 0
  fi
  if [[ "$PKG_FAMILY" == rpm ]]; then
    # Written by hand rather than downloaded: the CentOS repo file says $releasever, which is 3 on Alibaba Cloud
    # Linux 3 and has no docker-ce repository; Alibaba Cloud Linux 3 is binary compatible with EL8.
    # shellcheck disable=SC2016  # $basearch is a dnf/yum variable, written literally
    configure_repo_file "$YUM_REPOS_DIR/docker-ce.repo" "$(printf '%s\n' \
      '[docker-ce-stable]' \
      'name=Docker CE Stable - $basearch' \
      "baseurl=$DOCKER_CE_MIRROR/linux/centos/$DOCKER_CE_CENTOS_RELEASE/\$basearch/stable" \
      'enabled=1' \
      'gpgcheck=1' \
      "gpgkey=$DOCKER_CE_MIRROR/linux/centos/gpg")"
    # The mirror of NVIDIA's libnvidia-container repository, with NVIDIA's own repo settings.
    wants nvidia-container-toolkit || return 0
    configure_repo_file "$YUM_REPOS_DIR/nvidia-container-toolkit.repo" "$(printf '%s\n' \
      '[nvidia-container-toolkit]' \
      'name=nvidia-container-toolkit' \
      "baseurl=$NVIDIA_CT_MIRROR/stable/rpm/\$basearch" \
      'enabled=1' \
      'gpgcheck=0' \
      'repo_gpgcheck=1' \
      "gpgkey=$NVIDIA_CT_MIRROR/gpgkey")"
  else
    local arch
    arch=$(dpkg --print-architecture)
    download_key "$DOCKER_CE_MIRROR/linux/ubuntu/gpg" "$APT_KEYRINGS_DIR/docker-ce.asc"
    configure_repo_file "$APT_SOURCES_DIR/docker-ce.list" \
      "deb [arch=$arch signed-by=$APT_KEYRINGS_DIR/docker-ce.asc] $DOCKER_CE_MIRROR/linux/ubuntu $OS_CODENAME stable"
    wants nvidia-container-toolkit || return 0
    download_key "$NVIDIA_CT_MIRROR/gpgkey" "$APT_KEYRINGS_DIR/nvidia-container-toolkit.asc"
    # The mirror has no ready-made .list file (NVIDIA's upstream one points at its own host): a flat repository.
    configure_repo_file "$APT_SOURCES_DIR/nvidia-container-toolkit.list" \
      "deb [signed-by=$APT_KEYRINGS_DIR/nvidia-container-toolkit.asc] $NVIDIA_CT_MIRROR/stable/deb/$arch /"
  fi
}

install_docker_packages() {
  if ((${#DOCKER_PACKAGES[@]} == 0)); then
    banner "nothing to install; skipped"
    return 0
  fi
  install_packages "${DOCKER_PACKAGES[@]}"
}

# install_parallel_gunzip: dockerd decompresses pulled layers with `unpigz` when one is on its PATH, looked up at
# each layer (the dockerd reference, "Environment variables": MOBY_DISABLE_PIGZ "Do not use unpigz to decompress
# layers in parallel when pulling images, even if it is installed"; moby/go-archive compression/compression.go),
# about twice Go's own gzip for large layers (performance-frontier.md [20][21]). Best effort: that Alibaba Cloud
# Linux 3's repositories carry `pigz` is UNCONFIRMED (Ubuntu 22.04's main does), and without it a pull still works
# at Go's rate, so a failed install says so and the step goes on. Not on the user's own Docker (KEEP_EXISTING_DOCKER).
install_parallel_gunzip() {
  if [[ "$KEEP_EXISTING_DOCKER" == 1 ]]; then
    banner "KEEP_EXISTING_DOCKER=1: no package added for parallel layer decompression; skipped"
    return 0
  fi
  if package_installed "$PARALLEL_GUNZIP_PACKAGE"; then
    banner "already installed: $PARALLEL_GUNZIP_PACKAGE (unpigz for layer decompression); skipped"
    return 0
  fi
  if install_packages_once "$PARALLEL_GUNZIP_PACKAGE" && package_installed "$PARALLEL_GUNZIP_PACKAGE"; then
    banner "installed $PARALLEL_GUNZIP_PACKAGE: dockerd decompresses layers with unpigz"
  else
    banner "WARNING: $PARALLEL_GUNZIP_PACKAGE could not be installed (log: $ROLL_CLUSTER_STEP_LOG); pulls decompress layers with Docker's own gzip, about half as fast"
  fi
}

# daemon_json_has_nvidia_runtime: whether daemon.json already registers the nvidia runtime.
daemon_json_has_nvidia_runtime() {
  [[ -s "$DOCKER_DAEMON_JSON" ]] && python3 "$HELPER_DAEMON_JSON" has-nvidia-runtime "$DOCKER_DAEMON_JSON"
}

configure_nvidia_runtime() {
  if [[ "$NVIDIA_RUNTIME" == 0 ]]; then
    banner "no NVIDIA runtime wanted (NVIDIA_RUNTIME=0); skipped"
    return 0
  fi
  if daemon_json_has_nvidia_runtime; then
    banner "nvidia runtime already in $DOCKER_DAEMON_JSON; skipped"
    return 0
  fi
  mkdir -p "$(dirname "$DOCKER_DAEMON_JSON")"
  logged nvidia-ctk runtime configure --runtime=docker --config="$DOCKER_DAEMON_JSON"
  daemon_json_has_nvidia_runtime || fail "nvidia-ctk did not register the nvidia runtime in $DOCKER_DAEMON_JSON"
  DAEMON_JSON_CHANGED=1
  banner "nvidia runtime registered in $DOCKER_DAEMON_JSON"
}

# set_daemon_json KEY JSON_VALUE: KEY set to the value in daemon.json, merged into what nvidia-ctk wrote (and whatever
# else is there), not written over it; written atomically. Prints `unchanged` or `changed`.
set_daemon_json() {
  python3 "$HELPER_DAEMON_JSON" set "$DOCKER_DAEMON_JSON" "$1" "$2"
}

configure_data_root() {
  local result
  if [[ -z "$DOCKER_DATA_ROOT" ]]; then
    banner "DOCKER_DATA_ROOT empty: Docker keeps its default data root; skipped"
    return 0
  fi
  mkdir -p "$DOCKER_DATA_ROOT"
  result=$(python3 "$HELPER_DAEMON_JSON" set-text "$DOCKER_DAEMON_JSON" data-root "$DOCKER_DATA_ROOT")
  if [[ "$result" == unchanged ]]; then
    banner "data-root already $DOCKER_DATA_ROOT in $DOCKER_DAEMON_JSON; skipped"
  else
    banner "data-root set to $DOCKER_DATA_ROOT in $DOCKER_DAEMON_JSON"
    DAEMON_JSON_CHANGED=1
  fi
}

# configure_pull_concurrency: more layers downloaded at once (dockerd's --max-concurrent-downloads, default 3:
# moby daemon/config/config.go DefaultMaxConcurrentDownloads). Not on the user's own Docker
# (KEEP_EXISTING_DOCKER=1): a changed daemon.json restarts dockerd.
configure_pull_concurrency() {
  local result
  if [[ "$KEEP_EXISTING_DOCKER" == 1 ]]; then
    banner "KEEP_EXISTING_DOCKER=1: max-concurrent-downloads left as the host has it; skipped"
    return 0
  fi
  [[ "$DOCKER_MAX_CONCURRENT_DOWNLOADS" =~ ^[0-9]+$ ]] || fail "DOCKER_MAX_CONCURRENT_DOWNLOADS must be a number"
  result=$(set_daemon_json max-concurrent-downloads "$DOCKER_MAX_CONCURRENT_DOWNLOADS")
  if [[ "$result" == unchanged ]]; then
    banner "max-concurrent-downloads already $DOCKER_MAX_CONCURRENT_DOWNLOADS in $DOCKER_DAEMON_JSON; skipped"
  else
    banner "max-concurrent-downloads set to $DOCKER_MAX_CONCURRENT_DOWNLOADS in $DOCKER_DAEMON_JSON"
    DAEMON_JSON_CHANGED=1
  fi
}

# configure_insecure_registries: the pull cache's address (plain HTTP inside the security group) in daemon.json's
# insecure-registries, and nothing else of the program's: the addresses this step added last time (its record) are
# replaced, the host's own kept. Applied on every node, one that has the image too (its next pull of a new tag goes
# through the cache). dockerd re-reads the list on SIGHUP without a restart: start_docker reloads it when nothing
# else changed (see verified-facts#dockerd-reload-insecure-registries). An emptied list stays in the file as []:
# dockerd's reload changes only the keys the file has.
configure_insecure_registries() {
  local record="$ROLL_CLUSTER_STATE_DIR/insecure-registries.added" previous='' result address
  if [[ -f "$record" ]]; then previous=$(cat -- "$record"); fi
  if [[ -z "$INSECURE_REGISTRIES" && -z "$previous" ]]; then
    banner "no pull cache to reach over plain HTTP; skipped"
    return 0
  fi
  INSECURE_PRIOR_DIGEST=$(daemon_json_digest)
  result=$(python3 "$HELPER_DAEMON_JSON" replace-owned "$DOCKER_DAEMON_JSON" insecure-registries "$previous" \
    "$INSECURE_REGISTRIES")
  mkdir -p -- "$ROLL_CLUSTER_STATE_DIR"
  write_file_if_changed "$record" "$INSECURE_REGISTRIES"
  if [[ "$result" == unchanged ]]; then
    banner "insecure-registries already lists '${INSECURE_REGISTRIES}' in $DOCKER_DAEMON_JSON; skipped"
    return 0
  fi
  for address in $previous; do
    [[ " $INSECURE_REGISTRIES " == *" $address "* ]] || INSECURE_REMOVED+="$address "
  done
  banner "insecure-registries in $DOCKER_DAEMON_JSON: '${INSECURE_REGISTRIES}' (the pull cache, plain HTTP inside the security group)"
  INSECURE_REGISTRIES_CHANGED=1
}

# insecure_registries_applied: whether the running dockerd lists every address of INSECURE_REGISTRIES as insecure and
# none of those this run removed.
insecure_registries_applied() {
  local listed address
  listed=" $(docker info --format "$INSECURE_INFO_FORMAT" 2>/dev/null) " || return 1
  for address in $INSECURE_REGISTRIES; do
    [[ "$listed" == *" $address "* ]] || return 1
  done
  for address in $INSECURE_REMOVED; do
    [[ "$listed" != *" $address "* ]] || return 1
  done
}

# reload_docker: SIGHUP to the running dockerd, which re-reads daemon.json and applies insecure-registries without a
# restart; its containers keep running (see verified-facts#dockerd-reload-insecure-registries). Through systemd where
# it runs dockerd (Docker CE's unit reloads with `kill -s HUP $MAINPID`), else to the pid in dockerd's pidfile. A
# daemon.json dockerd refuses leaves its old list (its log says why): the step fails saying so.
reload_docker() {
  local pid=''
  if log_cmd systemctl reload docker; then
    banner "docker reloaded (SIGHUP through systemd): insecure-registries applied without a restart"
  else
    if [[ -s "$DOCKER_PIDFILE" ]]; then pid=$(cat -- "$DOCKER_PIDFILE"); fi
    if [[ ! "$pid" =~ ^[0-9]+$ ]] || ! kill -0 "$pid" 2>/dev/null; then
      fail "docker could not be reloaded: 'systemctl reload docker' failed and $DOCKER_PIDFILE names no running dockerd; send SIGHUP to dockerd (it re-reads insecure-registries from $DOCKER_DAEMON_JSON) and run again"
    fi
    kill -HUP "$pid"
    banner "docker reloaded (SIGHUP to dockerd, pid $pid): insecure-registries applied without a restart"
  fi
  POLL_WHAT="dockerd to list insecure-registries '${INSECURE_REGISTRIES}'" \
    poll_until "$DOCKER_START_TIMEOUT_S" 1 insecure_registries_applied ||
    fail "dockerd did not apply insecure-registries '${INSECURE_REGISTRIES}' from $DOCKER_DAEMON_JSON after its reload within ${DOCKER_START_TIMEOUT_S}s: its log (journalctl -u docker) says why it refused the file"
}

daemon_json_digest() {
  if [[ -f "$DOCKER_DAEMON_JSON" ]]; then
    sha256sum "$DOCKER_DAEMON_JSON" | cut -d ' ' -f 1
  else
    echo absent
  fi
}

# enable --now when needed; restart only a dockerd that was running before with another daemon.json (the Ubuntu
# package starts dockerd before the nvidia runtime is configured; a dockerd started by enable --now already has it).
# A running dockerd whose daemon.json changed in the program's insecure-registries entry only is reloaded instead.
start_docker() {
  local digest applied='' enabled=0 active=0
  digest=$(daemon_json_digest)
  if [[ -f "$APPLIED_CONFIG_RECORD" ]]; then applied=$(cat "$APPLIED_CONFIG_RECORD"); fi
  if systemctl is-enabled --quiet docker; then enabled=1; fi
  if systemctl is-active --quiet docker; then active=1; fi
  if ((enabled && active)) && [[ "$digest" == "$applied" ]]; then
    banner "docker already enabled and running with this configuration; restart skipped"
    return 0
  fi
  if ((!enabled || !active)); then
    banner "enabling and starting docker"
    logged systemctl enable --now docker
  fi
  # A dockerd this script never restarted (no record: say on your own host) is restarted only when this run changed
  # daemon.json; a recorded one whenever its configuration differs from what it was restarted with.
  if ((active)) && [[ "$digest" != "$applied" ]]; then
    if ((INSECURE_REGISTRIES_CHANGED && !DAEMON_JSON_CHANGED)) &&
      [[ -z "$applied" || "$INSECURE_PRIOR_DIGEST" == "$applied" ]]; then
      reload_docker
    elif ((DAEMON_JSON_CHANGED)) || [[ -n "$applied" ]]; then
      banner "docker was running with another configuration: restarting it"
      logged systemctl restart docker
    fi
  fi
  mkdir -p "$ROLL_CLUSTER_STATE_DIR"
  write_file_if_changed "$APPLIED_CONFIG_RECORD" "$digest"
}

verify_docker() {
  local runtimes root_dir
  wait_for "dockerd to answer 'docker info'" "$DOCKER_START_TIMEOUT_S" 2 docker info
  runtimes=$(docker info --format '{{json .Runtimes}}')
  if [[ "$NVIDIA_RUNTIME" == 1 && "$runtimes" != *'"nvidia"'* ]]; then
    fail "docker info does not list the nvidia runtime (runtimes: $runtimes); restart docker after checking $DOCKER_DAEMON_JSON"
  fi
  root_dir=$(docker info --format '{{.DockerRootDir}}')
  if [[ -n "$DOCKER_DATA_ROOT" && "$root_dir" != "$DOCKER_DATA_ROOT" ]]; then
    fail "docker's root dir is $root_dir, expected $DOCKER_DATA_ROOT"
  fi
  banner "docker $(docker version --format '{{.Server.Version}}') running; runtimes: $runtimes; root: $root_dir"
}

check_settings
run_step configure_repositories "package repositories (Docker CE, NVIDIA Container Toolkit)"
run_step install_docker_packages "Docker CE and NVIDIA Container Toolkit packages"
run_step install_parallel_gunzip "parallel layer decompression (unpigz)"
run_step configure_nvidia_runtime "nvidia runtime in $DOCKER_DAEMON_JSON"
run_step configure_data_root "Docker data root"
run_step configure_pull_concurrency "concurrent layer downloads"
run_step configure_insecure_registries "the pull cache's address"
run_step start_docker "docker service"
if [[ "$NVIDIA_RUNTIME" == 1 ]]; then
  run_step verify_docker "docker with the nvidia runtime"
else
  run_step verify_docker "docker"
fi
