#!/usr/bin/env bash
# login-key: the login key a node accepts, changed before any step uses a new one. Runs on the machine that runs
# `pulumi up` (a pulumi-command local.Command per node, before the node's first step) as
#   bash infra/scripts/local/login_key.sh        with the environment below.
# A node gets access.sshPublicKey once, through its first-boot user data, which a running instance never reads
# again. So when the key changes (a rotation), every step's connection would present a key the node refuses. This
# step runs first: it logs in with the key recorded at its last run (its previous output, PULUMI_COMMAND_STDOUT,
# which pulumi-command hands to an update), adds the new public key to the login user's authorized_keys beside the
# old one, checks that the new key logs in, and only then removes the old one. It prints the new record. At a
# first run (or a run without a change) it only prints the record: nothing is dialled.
#
# Environment (defaults in brackets):
#   HOST (required), SSH_USER [root], SSH_PORT [22]
#   HOST_PUBLIC_KEY ['']         the node's host key (strict checking against it alone, as teardown.sh); without it
#                                KNOWN_HOSTS_FILE with HOST_KEY_CHECKING [yes with a file, else accept-new]
#   LOGIN_PUBLIC_KEY (required)  access.sshPublicKey: the key the node must accept from now on
#   SSH_KEY_PATH ['']            the new key's identity for the system ssh (-i: a private key file, or the .pub file
#                                naming a key held in ssh-agent)
#   PULUMI_COMMAND_STDOUT ['']   this step's previous output: `login-key: <identity file> <public key>`
#   REACH_TIMEOUT_S [20]         bound on each ssh
#   BOOT_WAIT_S [600]            how long a node that does not answer yet (booting) is waited for
#   NODE_NAME [HOST], ROLL_CLUSTER_LOG_DIR [${TMPDIR:-/tmp}/roll-cluster-logs]

LOGIN_KEY_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROLL_CLUSTER_STEP=login-key
: "${NODE_NAME:=${HOST:-}}"
: "${ROLL_CLUSTER_LOG_DIR:=${TMPDIR:-/tmp}/roll-cluster-logs}"
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "$LOGIN_KEY_DIR")/lib.sh"
ROLL_CLUSTER_STEP_LOG="$ROLL_CLUSTER_LOG_DIR/${ROLL_CLUSTER_STEP}-${NODE_NAME//\//_}.log"

: "${SSH_USER:=root}"
: "${SSH_PORT:=22}"
: "${SSH_KEY_PATH:=}"
: "${HOST_PUBLIC_KEY:=}"
: "${KNOWN_HOSTS_FILE:=}"
: "${HOST_KEY_CHECKING:=}"
: "${REACH_TIMEOUT_S:=20}"
: "${BOOT_WAIT_S:=600}"
: "${PULUMI_COMMAND_STDOUT:=}"

KEY_PATTERN='^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/]+=*( .*)?$'
KNOWN_FILE=''
OLD_IDENTITY=''
OLD_KEY=''
NEW_KEY_ANSWER=''

check_settings() {
  require_env HOST LOGIN_PUBLIC_KEY
  require_int SSH_PORT REACH_TIMEOUT_S BOOT_WAIT_S
  [[ "$LOGIN_PUBLIC_KEY" =~ $KEY_PATTERN ]] ||
    fail "LOGIN_PUBLIC_KEY must be an OpenSSH public key (ssh-ed25519 AAAA...), got '$LOGIN_PUBLIC_KEY'"
  local record
  record=$(printf '%s\n' "$PULUMI_COMMAND_STDOUT" | grep '^login-key: ' | tail -n 1 || :)
  if [[ -n "$record" ]]; then
    read -r _ OLD_IDENTITY OLD_KEY <<<"$record"
    [[ "$OLD_KEY" =~ $KEY_PATTERN ]] || OLD_KEY=''
  fi
}

# key_data KEY: the base64 blob of a public key line (what identifies the key; type and comment aside).
key_data() {
  local _type data
  read -r _type data _ <<<"$1"
  printf '%s\n' "$data"
}

ssh_options() {
  local identity=$1 options
  options=(-o BatchMode=yes -o ConnectTimeout="$REACH_TIMEOUT_S" -o LogLevel=ERROR -p "$SSH_PORT")
  if [[ -n "$HOST_PUBLIC_KEY" ]]; then
    options+=(-o StrictHostKeyChecking=yes -o UserKnownHostsFile="$KNOWN_FILE")
  elif [[ -n "$KNOWN_HOSTS_FILE" ]]; then
    options+=(-o StrictHostKeyChecking="${HOST_KEY_CHECKING:-yes}" -o UserKnownHostsFile="$(home_path "$KNOWN_HOSTS_FILE")")
  else
    options+=(-o StrictHostKeyChecking="${HOST_KEY_CHECKING:-accept-new}")
  fi
  if [[ -n "$identity" ]]; then
    identity=$(home_path "$identity")
    options+=(-i "$identity" -o IdentitiesOnly=yes)
    if [[ "$identity" != *.pub ]]; then options+=(-o IdentityAgent=none); fi
  fi
  printf '%s\n' "${options[@]}"
}

# on_node IDENTITY STEP: run stdin on the node as the login user, logged in with IDENTITY.
on_node() {
  local identity=$1 line options=()
  if [[ "$identity" == - ]]; then identity=''; fi
  while IFS= read -r line; do options+=("$line"); done < <(ssh_options "$identity")
  (
    export ROLL_CLUSTER_STEP=$2
    bounded "$((REACH_TIMEOUT_S * 3))" ssh "${options[@]}" -- "$SSH_USER@$HOST" sh -s
  )
}

logs_in_with() {
  on_node "$1" login-key-check <<<"true" >>"$ROLL_CLUSTER_STEP_LOG" 2>&1
}

# new_key_answer: sets NEW_KEY_ANSWER to `accepted` or `refused` (the node answers, but not to the new key), once the
# node answers at all:
# a node that is still booting (a replacement in the same `up`) is waited for, up to BOOT_WAIT_S.
new_key_answer() {
  local errors deadline=$((SECONDS + BOOT_WAIT_S)) status
  errors=$(mktemp "${TMPDIR:-/tmp}/roll-cluster-login-key-ssh.XXXXXX")
  while true; do
    status=0
    on_node "$SSH_KEY_PATH" login-key-check <<<"true" >>"$ROLL_CLUSTER_STEP_LOG" 2>"$errors" || status=$?
    cat "$errors" >>"$ROLL_CLUSTER_STEP_LOG"
    if ((status == 0)); then
      rm -f "$errors"
      NEW_KEY_ANSWER=accepted
      return 0
    fi
    if grep -q -e 'Permission denied' -e 'Too many authentication failures' -e 'No more authentication methods' \
      "$errors"; then
      rm -f "$errors"
      NEW_KEY_ANSWER=refused
      return 0
    fi
    if ((SECONDS >= deadline)); then
      rm -f "$errors"
      fail "$HOST did not answer over SSH within ${BOOT_WAIT_S}s (last: $(tail -n 1 "$ROLL_CLUSTER_STEP_LOG")); a key rotation needs every node running"
    fi
    sleep 5
  done
}

write_known_host() {
  local key_type key_data
  [[ -n "$HOST_PUBLIC_KEY" ]] || return 0
  [[ "$HOST_PUBLIC_KEY" =~ $KEY_PATTERN ]] || fail "HOST_PUBLIC_KEY must be an OpenSSH public key, got '$HOST_PUBLIC_KEY'"
  read -r key_type key_data _ <<<"$HOST_PUBLIC_KEY"
  KNOWN_FILE=$(mktemp "${TMPDIR:-/tmp}/roll-cluster-login-key-known-hosts.XXXXXX")
  if [[ "$SSH_PORT" == 22 ]]; then
    printf '%s %s %s\n' "$HOST" "$key_type" "$key_data" >"$KNOWN_FILE"
  else
    printf '[%s]:%s %s %s\n' "$HOST" "$SSH_PORT" "$key_type" "$key_data" >"$KNOWN_FILE"
  fi
}

remove_known_file() {
  if [[ -n "$KNOWN_FILE" ]]; then rm -f -- "$KNOWN_FILE"; fi
}
trap remove_known_file EXIT

# The remote halves: plain sh on the node, the key inside the text (a validated public key: no quote can occur).
# shellcheck disable=SC2016 # $HOME expands on the node
install_script() {
  local key_type key_data
  read -r key_type key_data _ <<<"$LOGIN_PUBLIC_KEY"
  printf '%s\n' 'umask 077' 'mkdir -p "$HOME/.ssh"' 'touch "$HOME/.ssh/authorized_keys"' \
    "grep -qF '$key_data' \"\$HOME/.ssh/authorized_keys\" || printf '%s\\n' '$key_type $key_data roll-cluster-login' >>\"\$HOME/.ssh/authorized_keys\""
}

# shellcheck disable=SC2016 # $HOME expands on the node
revoke_script() {
  local old_data=$1
  # Rewritten in place (cat >), so the file keeps its owner, mode and SELinux label.
  printf '%s\n' 'umask 077' "grep -vF '$old_data' \"\$HOME/.ssh/authorized_keys\" >\"\$HOME/.ssh/authorized_keys.roll-cluster\" || :" \
    'cat "$HOME/.ssh/authorized_keys.roll-cluster" >"$HOME/.ssh/authorized_keys"' \
    'rm -f "$HOME/.ssh/authorized_keys.roll-cluster"'
}

rotate() {
  local new_data old_data
  new_data=$(key_data "$LOGIN_PUBLIC_KEY")
  if [[ -z "$OLD_KEY" ]]; then
    banner "no key recorded for $HOST yet: the node got access.sshPublicKey at its first boot"
    return 0
  fi
  old_data=$(key_data "$OLD_KEY")
  if [[ "$old_data" == "$new_data" ]]; then
    banner "the login key of $HOST is unchanged"
    return 0
  fi
  write_known_host
  new_key_answer
  if [[ "$NEW_KEY_ANSWER" == refused ]]; then
    banner "$HOST does not accept the new key yet: adding it with the previous one ($OLD_IDENTITY)"
    install_script | on_node "$OLD_IDENTITY" login-key-install >>"$ROLL_CLUSTER_STEP_LOG" 2>&1 ||
      fail "could not log in to $SSH_USER@$HOST with the previous login key ($OLD_IDENTITY) to add the new access.sshPublicKey. Put the previous key back at $OLD_IDENTITY (or load it in ssh-agent) and run again, or add the new public key to $SSH_USER's ~/.ssh/authorized_keys on node $NODE_NAME yourself"
    logs_in_with "$SSH_KEY_PATH" ||
      fail "$HOST still refuses the new login key ($SSH_KEY_PATH) after it was added to $SSH_USER's authorized_keys"
  fi
  revoke_script "$old_data" | on_node "$SSH_KEY_PATH" login-key-revoke >>"$ROLL_CLUSTER_STEP_LOG" 2>&1 ||
    fail "could not remove the previous login key from $SSH_USER's authorized_keys on $HOST"
  banner "$HOST accepts the new login key; the previous one is removed"
}

run_step check_settings "check the settings"
run_step rotate "make $SSH_USER@$HOST accept access.sshPublicKey"
# The record pulumi-command keeps as this step's output, read back at its next run.
printf 'login-key: %s %s\n' "${SSH_KEY_PATH:--}" "$LOGIN_PUBLIC_KEY"
