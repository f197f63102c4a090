#!/usr/bin/env bash
# PID 1 of one e2e test host. The harness starts it as
#   ip netns exec <netns> unshare --mount --pid --fork --mount-proc --uts -- bash host_init.sh
# so the host has its own network (the netns), its own process table (`ray stop` and Ray's own process scans
# see only this host's Ray) and its own mounts: a private /tmp, /dev/shm and /var/log, so Ray sessions, the
# object store and the step logs of the hosts do not collide on the shared filesystem. The docker stand-in
# comes first in PATH through SetEnv in this host's sshd_config.
#
# Environment: E2E_HOST_DIR (this host's state directory), E2E_HOSTNAME, E2E_SSHD_CONFIG.
set -euo pipefail

hostname "$E2E_HOSTNAME"
mount --bind "$E2E_HOST_DIR/tmp" /tmp
mount -t tmpfs -o size=1g,mode=1777 e2e-shm /dev/shm
mount --bind "$E2E_HOST_DIR/log" /var/log
mkdir -p /run/sshd

# As dockerd does at boot: start the containers whose restart policy says so (after a simulated reboot).
"$E2E_HOST_DIR/bin/docker" _boot >>"$E2E_HOST_DIR/init.log" 2>&1 || echo "docker _boot failed" >&2

/usr/sbin/sshd -D -e -f "$E2E_SSHD_CONFIG" 2>>"$E2E_HOST_DIR/sshd.log" &
# As PID 1, bash also reaps the daemons `ray start` leaves behind; the host lives as long as its sshd.
wait "$!"
