#!/usr/bin/env bash
# The docker service of one e2e test host: what systemd's docker.service is on a real node, for a host that has no
# systemd. It runs Debian's real dockerd inside the host's namespaces (its network namespace, its mounts, its PID
# table), so containers run with `--network host` see exactly this host's interfaces. host_init.sh starts it at
# boot (dockerd then restarts the containers whose restart policy says so, as at a real boot), and the systemctl
# stand-in (standins/systemctl) starts, restarts and probes it for the program's docker step.
#
#   host_dockerd.sh start | stop | restart | reload | is-active
#
# Everything dockerd keeps is this host's own: the default socket, exec root and pidfile under /run (a tmpfs of the
# host, gone at a reboot as on a real node), the default data root /var/lib/docker (host_init.sh mounts the host's
# own directory there; a daemon.json data-root, as install_docker.sh writes it, is honoured), the configuration
# /etc/docker/daemon.json (the host's private /etc). dockerd leaves the machine's network alone: no bridge, no
# iptables rules, no forwarding (containers use the host network, as the product's do). Its containers' cgroups
# lie under rce2e-<hostname>, which the harness removes with the hosts.
#
# Environment: E2E_DOCKERD_READY_S [120] bound for dockerd to answer after a start.
set -euo pipefail

: "${E2E_DOCKERD_READY_S:=120}"
PIDFILE=/run/docker.pid
LOG=/var/log/dockerd.log
DOCKER=/usr/bin/docker

die() {
  printf 'e2e docker service: %s\n' "$1" >&2
  exit 1
}

running() {
  [[ -s "$PIDFILE" ]] && kill -0 "$(<"$PIDFILE")" 2>/dev/null
}

start_dockerd() {
  local waited=0
  if running; then
    return 0
  fi
  mkdir -p -- "$(dirname -- "$LOG")"
  printf '%s e2e docker service: starting dockerd\n' "$(date -u +%FT%TZ)" >>"$LOG"
  setsid /usr/sbin/dockerd --pidfile "$PIDFILE" --cgroup-parent "rce2e-$(hostname)" \
    --iptables=false --ip6tables=false --bridge=none --ip-forward=false --ip-masq=false \
    </dev/null >>"$LOG" 2>&1 &
  # Ready once it answers (and its pidfile names it); bounded, with dockerd's log when it never does.
  until "$DOCKER" info >/dev/null 2>&1 && running; do
    if ((waited >= E2E_DOCKERD_READY_S * 5)); then
      tail -n 40 -- "$LOG" >&2
      die "dockerd did not answer within ${E2E_DOCKERD_READY_S}s"
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
}

stop_dockerd() {
  local pid waited=0
  running || return 0
  pid=$(<"$PIDFILE")
  # SIGTERM: dockerd stops its containers (their restart policy keeps them for the next start) and exits.
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null; do
    if ((waited >= 600)); then
      kill -KILL "$pid" 2>/dev/null || true
      die "dockerd (pid $pid) did not stop within 120s: killed"
    fi
    sleep 0.2
    waited=$((waited + 1))
  done
}

# reload_dockerd: what systemd's reload of Docker CE's unit does (ExecReload=/bin/kill -s HUP $MAINPID): SIGHUP,
# on which dockerd re-reads daemon.json and applies what it can without a restart.
reload_dockerd() {
  running || die "dockerd is not running: nothing to reload"
  kill -HUP "$(<"$PIDFILE")"
}

case "${1:-}" in
  start) start_dockerd ;;
  stop) stop_dockerd ;;
  restart) stop_dockerd && start_dockerd ;;
  reload) reload_dockerd ;;
  is-active) running ;;
  *) die "usage: host_dockerd.sh start|stop|restart|reload|is-active (got '$*')" ;;
esac
