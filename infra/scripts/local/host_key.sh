#!/usr/bin/env bash
# host-key: runs on the machine that runs `pulumi up` (a pulumi-command local.Command per node, created once).
# Generates an ed25519 SSH host key for a node that does not exist yet and prints it: the private key (OpenSSH
# format), then the public key line last. The local.Command keeps its stdout in the Pulumi state as a secret
# (additionalSecretOutputs, logging none), so the key is stable across updates and never shown; the node gets it
# through its first-boot user data and every SSH client of the program verifies it (infra/node/known_hosts.py).
#
# Environment: NODE_NAME (shown in the key's comment), ROLL_CLUSTER_LOG_DIR [${TMPDIR:-/tmp}/roll-cluster-logs]
set -euo pipefail

: "${NODE_NAME:=node}"

generate_host_key() {
  KEY_DIR=$(mktemp -d "${TMPDIR:-/tmp}/roll-cluster-host-key.XXXXXX")
  # The private key exists on disk only inside this private directory, for the moment ssh-keygen needs.
  chmod 700 "$KEY_DIR"
  trap 'rm -rf "$KEY_DIR"' EXIT
  ssh-keygen -q -t ed25519 -N '' -C "roll-cluster-$NODE_NAME-host" -f "$KEY_DIR/key" </dev/null >/dev/null
  cat "$KEY_DIR/key"
  cat "$KEY_DIR/key.pub"
}

generate_host_key
