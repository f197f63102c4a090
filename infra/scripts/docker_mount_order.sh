#!/usr/bin/env bash
# Part of the docker step (after install_docker.sh): after a reboot, Docker (and so the training container, restart
# policy unless-stopped) starts only once the data disk and the NAS are mounted, so the container never binds an
# empty mount point and writes checkpoints to the system disk. A systemd drop-in for docker.service:
#   After= and Wants= the mount units of MOUNTS (not Requires=: prepare_host.sh mounts them `nofail`, and a NAS that
#   is down must not keep Docker, and so Ray, from starting at all), plus After=remote-fs.target network-online.target.
# `nofail` mounts are not ordered before remote-fs.target (systemd.mount(5)), hence the explicit mount units.
#
# Environment (defaults in brackets):
#   MOUNTS ['']                   mount points the container binds (e.g. "/data /mnt/shared"); empty: only the targets
#   DOCKER_DROPIN_DIR [/etc/systemd/system/docker.service.d]

: "${MOUNTS:=}"
: "${DOCKER_DROPIN_DIR:=/etc/systemd/system/docker.service.d}"

# mount_unit PATH: the systemd mount unit of PATH (systemd-escape --path --suffix=mount, for plain paths).
mount_unit() {
  local path=${1#/}
  path=${path%/}
  path=${path//-/\\x2d}
  printf '%s.mount\n' "${path//\//-}"
}

order_docker_after_mounts() {
  local path units='' content
  for path in $MOUNTS; do
    [[ "$path" =~ ^/[A-Za-z0-9._/-]+$ ]] || fail "MOUNTS: '$path' is not an absolute plain path"
    units+=" $(mount_unit "$path")"
  done
  content="# roll-cluster: start Docker, and so the training container, after the file systems it binds are mounted.
[Unit]
Wants=network-online.target${units}
After=network-online.target remote-fs.target${units}"
  write_file_if_changed "$DOCKER_DROPIN_DIR/roll-cluster-mounts.conf" "$content"
  if ((FILE_CHANGED)); then
    logged systemctl daemon-reload
    banner "docker.service now starts after:${units:- the network and remote file systems}"
  else
    banner "docker.service already ordered after its mounts; skipped"
  fi
}

run_step order_docker_after_mounts "order docker.service after the mounts ${MOUNTS:-(none)}"
