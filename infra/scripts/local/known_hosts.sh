#!/usr/bin/env bash
# known-hosts: runs on the machine that runs `pulumi up` (a pulumi-command local.Command for the stack).
# Writes the stack's known-hosts file: one line per node, with the host key the program generated for it
# (infra/node/known_hosts.py). Every SSH client of the program reads this file only (UserKnownHostsFile) with
# StrictHostKeyChecking=yes, never the user's ~/.ssh/known_hosts, where a recycled public address may still have
# another machine's key. Rewritten whole (atomically) when a node's address or key changes; removed on destroy.
#
#   bash infra/scripts/local/known_hosts.sh [--delete]
# Environment:
#   KNOWN_HOSTS_FILE (required)   path; a leading ~/ is the home directory
#   KNOWN_HOSTS ['']              the lines to write (`<host> ssh-ed25519 AAAA...`, `[host]:port ...`)
set -euo pipefail

: "${KNOWN_HOSTS:=}"

expand_path() {
  # shellcheck disable=SC2088  # a literal "~/" is exactly what is looked for
  local tilde_prefix='~/'
  case $KNOWN_HOSTS_FILE in
    "$tilde_prefix"*) KNOWN_HOSTS_FILE=$HOME/${KNOWN_HOSTS_FILE#"$tilde_prefix"} ;;
  esac
}

write_known_hosts() {
  local dir tmp
  dir=$(dirname "$KNOWN_HOSTS_FILE")
  mkdir -p "$dir"
  chmod 700 "$dir"
  tmp=$(mktemp "$KNOWN_HOSTS_FILE.XXXXXX")
  if [[ -n "$KNOWN_HOSTS" ]]; then printf '%s\n' "$KNOWN_HOSTS" >"$tmp"; fi
  chmod 600 "$tmp"
  mv -f "$tmp" "$KNOWN_HOSTS_FILE"
  # grep -c prints 0 and exits 1 for an empty file (no host keys given): the count is still right.
  echo "known-hosts: wrote $(grep -c . "$KNOWN_HOSTS_FILE" || true) host key(s) to $KNOWN_HOSTS_FILE"
}

: "${KNOWN_HOSTS_FILE:?KNOWN_HOSTS_FILE is required}"
expand_path
if [[ "${1:-}" == --delete ]]; then
  rm -f "$KNOWN_HOSTS_FILE"
  echo "known-hosts: removed $KNOWN_HOSTS_FILE"
else
  write_known_hosts
fi
