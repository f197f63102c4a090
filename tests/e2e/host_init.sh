#!/usr/bin/env bash
# PID 1 of one e2e test host. The harness starts it as
#   nsenter --net=/var/run/netns/<netns> unshare --mount --pid --fork --mount-proc --uts -- bash host_init.sh
# (not `ip netns exec`, whose fresh /sys hides the cgroup mounts dockerd needs: "Devices cgroup isn't mounted"),
# so the host has its own network (the netns), its own process table (`ray stop` and Ray's own process scans
# see only this host's Ray) and its own mounts: a private /tmp, /dev/shm, /var/log, /run and /workspace, so Ray
# sessions, the object store, the step logs and the job's files of the hosts do not collide on the shared
# filesystem (an empty /workspace mount point is the only trace left on the test machine). Each host runs its own
# real dockerd (host_dockerd.sh), started here as a node's init starts docker.service.
#
# What the program's host steps write lands in private copies too, so that they run as on a real host without
# touching the test machine or each other: /etc (docker's daemon.json, fstab, ascend_install.info), /usr/local
# (the Ascend driver stand-in, npu-smi), /var/lib (the steps' state) and /dev (stand-in NPU device files) are
# overlays whose changes live in a tmpfs of this host only; /data is this host's own directory.
#
# Environment: E2E_HOST_DIR (this host's state directory), E2E_HOSTNAME, E2E_SSHD_CONFIG, E2E_SUPPORT_DIR (where
# host_dockerd.sh is), E2E_DAEMON_JSON (the daemon.json this host's image ships: the tier's registry, plain HTTP).
set -euo pipefail
# A real init runs in /. Everything this host starts inherits the directory, and the harness's (the checkout, say
# /tmp/<clone> in CI) is hidden by the private /tmp below: Ray's dashboard modules, spawned with multiprocessing,
# chdir to their parent's directory by name and die there ("Module MetricsHead failed to start"), so after a reboot
# the head's Jobs API never answered when the tests ran from a checkout under /tmp.
cd /

hostname "$E2E_HOSTNAME"
# This network namespace's own sysfs (/sys/class/net shows the host's interfaces, as `ip netns exec` arranged), with
# the machine's cgroup hierarchy moved over onto it (dockerd creates its containers' cgroups there).
cgroups=$(mktemp -d /dev/shm/e2e-cgroup.XXXXXX)
mount --rbind /sys/fs/cgroup "$cgroups"
mount -t sysfs e2e-sys /sys
mount --move "$cgroups" /sys/fs/cgroup
rmdir "$cgroups"
mount --bind "$E2E_HOST_DIR/tmp" /tmp
mount --bind "$E2E_HOST_DIR/log" /var/log
# A private /workspace: the job step writes the ROLL config to /workspace/ROLL in the "container" (the host).
mkdir -p /workspace
mount --bind "$E2E_HOST_DIR/workspace" /workspace
mount --bind "$E2E_HOST_DIR/data" /data

# Overlays: the test machine's files below, this host's changes above (in a tmpfs, so any filesystem works).
layers=$E2E_HOST_DIR/layers
mkdir -p "$layers"
mount -t tmpfs -o size=256m,mode=0755 e2e-layers "$layers"
for dir in /etc /usr/local /var/lib /dev; do
  name=${dir//\//_}
  mkdir -p "$layers/$name.upper" "$layers/$name.work"
  mount -t overlay "e2e$name" -o "lowerdir=$dir,upperdir=$layers/$name.upper,workdir=$layers/$name.work" "$dir"
done
# /dev's own submounts are not part of its overlay: a fresh /dev/shm (Ray's object store) and /dev/pts.
mkdir -p /dev/shm /dev/pts
mount -t tmpfs -o size=1g,mode=1777 e2e-shm /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 e2e-pts /dev/pts || true
# A fresh /run at every boot, as a node's tmpfs: dockerd's socket, pidfile and exec root, sshd's privilege separation.
mount -t tmpfs -o size=64m,mode=0755 e2e-run /run
mkdir -p /run/sshd

# Docker as the host's image ships it: Debian's dockerd and CLI (the machine's newer CLI in /usr/local/bin is hidden
# by this host's /usr/local overlay, so every session's `docker` is /usr/bin/docker), its data root on this host's
# own disk (the overlays above are in a tmpfs, where overlay2 cannot stack; a node's /var/lib/docker survives a
# reboot), and a daemon.json that trusts the tier's plain-HTTP registry; the program's docker step merges its own
# settings into it.
rm -f /usr/local/bin/docker
mkdir -p /var/lib/docker "$E2E_HOST_DIR/docker-data"
mount --bind "$E2E_HOST_DIR/docker-data" /var/lib/docker
mkdir -p /etc/docker
printf '%s\n' "$E2E_DAEMON_JSON" >/etc/docker/daemon.json
install -m 0755 "$E2E_SUPPORT_DIR/host_dockerd.sh" /usr/local/sbin/e2e-docker-service
# As a node's init starts docker.service: dockerd then starts again the containers whose restart policy says so
# (after a reboot), by itself.
/usr/local/sbin/e2e-docker-service start >>"$E2E_HOST_DIR/init.log" 2>&1 || echo "dockerd did not start" >&2

/usr/sbin/sshd -D -e -f "$E2E_SSHD_CONFIG" 2>>"$E2E_HOST_DIR/sshd.log" &
# As PID 1, bash also reaps the daemons `ray start` leaves behind; the host lives as long as its sshd.
wait "$!"
