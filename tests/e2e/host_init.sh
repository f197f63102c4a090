#!/usr/bin/env bash
# PID 1 of one e2e test host. The harness starts it as
#   ip netns exec <netns> unshare --mount --pid --fork --mount-proc --uts -- bash host_init.sh
# so the host has its own network (the netns), its own process table (`ray stop` and Ray's own process scans
# see only this host's Ray) and its own mounts: a private /tmp, /dev/shm, /var/log and /workspace, so Ray
# sessions, the object store, the step logs and the job's files of the hosts do not collide on the shared
# filesystem (an empty /workspace mount point is the only trace left on the test machine). The docker stand-in
# comes first in PATH through SetEnv in this host's sshd_config.
#
# Environment: E2E_HOST_DIR (this host's state directory), E2E_HOSTNAME, E2E_SSHD_CONFIG.
set -euo pipefail

hostname "$E2E_HOSTNAME"
mount --bind "$E2E_HOST_DIR/tmp" /tmp
mount -t tmpfs -o size=1g,mode=1777 e2e-shm /dev/shm
mount --bind "$E2E_HOST_DIR/log" /var/log
# A private /workspace: the job step writes the ROLL config to /workspace/ROLL in the "container" (the host).
mkdir -p /workspace
mount --bind "$E2E_HOST_DIR/workspace" /workspace
mkdir -p /run/sshd

/usr/sbin/sshd -D -e -f "$E2E_SSHD_CONFIG" 2>>"$E2E_HOST_DIR/sshd.log" &
# As PID 1, bash also reaps the daemons `ray start` leaves behind; the host lives as long as its sshd.
wait "$!"
