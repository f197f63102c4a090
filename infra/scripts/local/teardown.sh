#!/usr/bin/env bash
# teardown: the delete command of a node step (stop the job, stop Ray, stop the reward server), run on the machine
# that runs `pulumi destroy` (a pulumi-command local.Command) as
#   bash infra/scripts/local/teardown.sh        with the environment below.
# It runs REMOTE_COMMAND (a step rendered by infra/node/remote.py, no secrets in it) on the node over ssh, fed on
# stdin, so it never shows in a process list. First it checks that the node answers at all, with short bounds: a
# node that is stopped, released or unreachable has nothing left to stop, and waiting for it would only hold
# `pulumi destroy` up (pulumi-command's own connection would retry for many minutes per step). Such a node counts
# as done, and the step says so.
# Only a node that cannot be reached counts as gone (ssh's own words decide, see classify_ssh_failure): one that
# answers but refuses us (another host key, our key not accepted) may still run the job, on a paid machine or on
# the user's own server, so the step fails, naming the known-hosts file or the key, and the destroy stops there.
#
# Environment (defaults in brackets):
#   HOST (required), SSH_USER [root], SSH_PORT [22], SSH_KEY_PATH [ssh's default keys]
#   HOST_PUBLIC_KEY ['']          the node's host public key (`ssh-ed25519 AAAA...`), as the state records it: when
#                             set, the node is checked against it alone (StrictHostKeyChecking=yes, a known-hosts
#                             file of one line written here), so the teardown needs no local file: it works after
#                             the stack's known-hosts file was rewritten without this node (scale-in, replacement)
#                             and from any machine (a clone, CI)
#   KNOWN_HOSTS_FILE [ssh's default]   the stack's known-hosts file (infra/node/known_hosts.py), without HOST_PUBLIC_KEY
#   HOST_KEY_CHECKING [yes with KNOWN_HOSTS_FILE, else accept-new]   StrictHostKeyChecking
#   HOST_KEY_ORIGIN [generated with HOST_KEY_CHECKING=yes, else recorded]   where the node's key in KNOWN_HOSTS_FILE
#                             came from: `generated` by the program (its own instances), or `recorded` at first
#                             contact (your own hosts); says what to do when the node answers with another key
#   REMOTE_COMMAND (required)    the rendered delete step
#   REACH_ATTEMPTS [2], REACH_TIMEOUT_S [20]   probes of the node before it counts as gone
#   TEARDOWN_TIMEOUT_S [300]     bound on the delete step itself
#   NODE_NAME [HOST], ROLL_CLUSTER_STEP [teardown], ROLL_CLUSTER_LOG_DIR [${TMPDIR:-/tmp}/roll-cluster-logs]
#   TEARDOWN_RESOURCE ['']        the name of the local.Command running this, named in the advice of a failure
# Portable to bash 3.2 (macOS): no `timeout` there, lib.sh's `bounded` cuts what hangs.

TEARDOWN_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${ROLL_CLUSTER_STEP:=teardown}"
: "${NODE_NAME:=${HOST:-}}"
: "${ROLL_CLUSTER_LOG_DIR:=${TMPDIR:-/tmp}/roll-cluster-logs}"
# shellcheck source=SCRIPTDIR/../lib.sh
source "$(dirname "$TEARDOWN_DIR")/lib.sh"
ROLL_CLUSTER_STEP_LOG="$ROLL_CLUSTER_LOG_DIR/${ROLL_CLUSTER_STEP}-${NODE_NAME//\//_}.log"

: "${SSH_USER:=root}"
: "${SSH_PORT:=22}"
: "${SSH_KEY_PATH:=}"
: "${KNOWN_HOSTS_FILE:=}"
: "${HOST_PUBLIC_KEY:=}"
: "${HOST_KEY_CHECKING:=}"
: "${HOST_KEY_ORIGIN:=}"
: "${REACH_ATTEMPTS:=2}"
: "${REACH_TIMEOUT_S:=20}"
: "${TEARDOWN_TIMEOUT_S:=300}"

# use_recorded_host_key: check the node against HOST_PUBLIC_KEY only, in a known-hosts file of one line.
use_recorded_host_key() {
  [[ "$HOST_PUBLIC_KEY" =~ ^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521))\ [A-Za-z0-9+/]+=*(\ .*)?$ ]] ||
    fail "HOST_PUBLIC_KEY must be an OpenSSH public key (ssh-ed25519 AAAA...), got '$HOST_PUBLIC_KEY'"
  local key_type key_data
  read -r key_type key_data _ <<<"$HOST_PUBLIC_KEY"
  RECORDED_KNOWN_HOSTS=$(mktemp "${TMPDIR:-/tmp}/roll-cluster-teardown-known-hosts.XXXXXX")
  printf '%s %s %s\n' "$(known_hosts_pattern)" "$key_type" "$key_data" >"$RECORDED_KNOWN_HOSTS"
  KNOWN_HOSTS_FILE=$RECORDED_KNOWN_HOSTS
  HOST_KEY_CHECKING=yes
  HOST_KEY_ORIGIN=generated
}

check_settings() {
  require_env HOST REMOTE_COMMAND
  require_int SSH_PORT REACH_ATTEMPTS REACH_TIMEOUT_S TEARDOWN_TIMEOUT_S
  if [[ -n "$HOST_PUBLIC_KEY" ]]; then use_recorded_host_key; fi
  if [[ -z "$HOST_KEY_CHECKING" ]]; then
    if [[ -n "$KNOWN_HOSTS_FILE" ]]; then HOST_KEY_CHECKING=yes; else HOST_KEY_CHECKING=accept-new; fi
  fi
  case $HOST_KEY_CHECKING in
    yes | accept-new) ;;
    *) fail "HOST_KEY_CHECKING must be yes or accept-new, got '$HOST_KEY_CHECKING'" ;;
  esac
  if [[ -z "$HOST_KEY_ORIGIN" ]]; then
    if [[ "$HOST_KEY_CHECKING" == yes ]]; then HOST_KEY_ORIGIN=generated; else HOST_KEY_ORIGIN=recorded; fi
  fi
  case $HOST_KEY_ORIGIN in
    generated | recorded) ;;
    *) fail "HOST_KEY_ORIGIN must be generated or recorded, got '$HOST_KEY_ORIGIN'" ;;
  esac
  SSH_OPTIONS=(-o BatchMode=yes -o StrictHostKeyChecking="$HOST_KEY_CHECKING" -o ConnectTimeout="$REACH_TIMEOUT_S"
    -o ServerAliveInterval=10 -o ServerAliveCountMax=3 -o LogLevel=ERROR -p "$SSH_PORT")
  if [[ -n "$SSH_KEY_PATH" ]]; then
    SSH_KEY_PATH=$(home_path "$SSH_KEY_PATH")
    SSH_OPTIONS+=(-i "$SSH_KEY_PATH" -o IdentitiesOnly=yes)
    # A private key file needs no agent: a stale $SSH_AUTH_SOCK is then not even dialled.
    if [[ "$SSH_KEY_PATH" != *.pub ]]; then SSH_OPTIONS+=(-o IdentityAgent=none); fi
  fi
  if [[ -n "$KNOWN_HOSTS_FILE" ]]; then
    KNOWN_HOSTS_FILE=$(home_path "$KNOWN_HOSTS_FILE")
    SSH_OPTIONS+=(-o UserKnownHostsFile="$KNOWN_HOSTS_FILE")
  fi
}

node_answers() {
  ssh "${SSH_OPTIONS[@]}" -- "$SSH_USER@$HOST" true </dev/null
}

# classify_ssh_failure STATUS ERRORS_FILE: print what a failed probe means, from its exit status and ssh's stderr
# (LogLevel=ERROR still prints these): `unreachable` (nothing answers: the node is gone as far as a delete goes),
# `host-key-changed`, `host-key-unknown`, `auth-refused`, or `other`. ssh exits 255 for all of the first four, so
# only its message tells them apart.
classify_ssh_failure() {
  local status=$1 errors=$2
  if ((status == 124)); then
    # Cut at REACH_TIMEOUT_S: no answer within the bound, like a connect timeout.
    echo unreachable
  elif grep -q -e 'REMOTE HOST IDENTIFICATION HAS CHANGED' -e 'Host key for .* has changed' "$errors"; then
    echo host-key-changed
  elif grep -q -e 'host key is known for' -e 'Host key verification failed' "$errors"; then
    echo host-key-unknown
  elif grep -q -e 'Permission denied' -e 'Too many authentication failures' \
    -e 'No more authentication methods' "$errors"; then
    echo auth-refused
  elif ((status == 255)) && grep -q -i -e 'connect to host .* port ' -e 'Could not resolve hostname' \
    -e 'Connection closed by' -e 'Connection reset by' -e 'Connection timed out' -e 'Connection refused' \
    -e 'kex_exchange_identification' -e 'ssh_exchange_identification' -e 'banner exchange' \
    -e 'No route to host' -e 'Network is unreachable' -e 'Host is down' -e 'Broken pipe' "$errors"; then
    # "connect to host X port N: ..." is how ssh reports every failed connect() (refused, timed out, no route);
    # the others are a name that does not resolve and a connection dropped before any login.
    echo unreachable
  else
    echo other
  fi
}

# The known-hosts entry ssh looks up for HOST (infra/node/known_hosts.py host_pattern), for `ssh-keygen -R`.
known_hosts_pattern() {
  if [[ "$SSH_PORT" == 22 ]]; then printf '%s' "$HOST"; else printf '[%s]:%s' "$HOST" "$SSH_PORT"; fi
}

# refuse_teardown KIND ERROR: fail the step for a node that answers but refuses us, saying what to do about it.
refuse_teardown() {
  local kind=$1 error=$2 file=$KNOWN_HOSTS_FILE key=$SSH_KEY_PATH resource=${TEARDOWN_RESOURCE:-this teardown}
  local not_run="the node answers, so it does NOT count as gone: $ROLL_CLUSTER_STEP did not run there, and what it stops may still be running"
  if [[ -z "$file" ]]; then file="ssh's default known-hosts file (~/.ssh/known_hosts)"; fi
  if [[ -n "$HOST_PUBLIC_KEY" ]]; then file="the stack's state (this teardown's HOST_PUBLIC_KEY)"; fi
  if [[ -z "$key" ]]; then key="ssh's default keys"; fi
  case $kind in
    host-key-changed)
      if [[ "$HOST_KEY_ORIGIN" == recorded ]]; then
        # A machine whose key the program could not know (your own host): its key was recorded at first contact.
        fail "the host key of $HOST does not match the key recorded for node $NODE_NAME in $file ($error); $not_run. If the machine at $HOST was reinstalled or replaced, check that first (with whoever runs it), then remove its line with \`ssh-keygen -R '$(known_hosts_pattern)' -f $file\` and destroy again: the step then runs on the machine that answers. If nothing changed there, someone may be in the middle: do not connect"
      fi
      # The program generated this node's host key: another key is another machine at this address.
      fail "the host key of $HOST does not match the key the program generated for node $NODE_NAME (recorded in $file; $error); $not_run. Another machine answers at this address (the instance was released, reclaimed or replaced outside the program and its address reused), or someone is in the middle: do not connect. If you have checked (the cloud console) that node $NODE_NAME's instance is gone, nothing of ours runs there: remove $resource from the state (\`pulumi stack --show-urns\` lists its URN; \`pulumi state delete <URN>\`) and destroy again. \`ssh-keygen -R '$(known_hosts_pattern)' -f $file\` does not help here: without the line, strict checking refuses the host too"
      ;;
    host-key-unknown)
      fail "no host key of $HOST is recorded for node $NODE_NAME in $file, and host keys are checked strictly ($error); $not_run. Run the destroy on the machine that ran \`pulumi up\` (the stack's known-hosts file is written there), or put the node's key back in $file"
      ;;
    auth-refused)
      fail "$SSH_USER@$HOST refused the login key $key for user $SSH_USER ($error); $not_run. Use the key the stack was deployed with (roll-cluster:access.sshPrivateKeyPath); a key with a passphrase or one held only in ssh-agent must be loaded (\`ssh-add\`) in the shell that runs \`pulumi destroy\`"
      ;;
    *)
      fail "ssh to $SSH_USER@$HOST failed with an error that does not say the node is unreachable ($error); $not_run. Check the node and the error below, then destroy again"
      ;;
  esac
}

RECORDED_KNOWN_HOSTS=''
remove_recorded_known_hosts() {
  if [[ -n "$RECORDED_KNOWN_HOSTS" ]]; then rm -f -- "$RECORDED_KNOWN_HOSTS"; fi
}
trap remove_recorded_known_hosts EXIT

NODE_GONE=false
probe_node() {
  local attempt status errors kind=unreachable error=''
  errors=$(mktemp "${TMPDIR:-/tmp}/roll-cluster-teardown-ssh.XXXXXX")
  for ((attempt = 1; attempt <= REACH_ATTEMPTS; attempt++)); do
    status=0
    bounded "$REACH_TIMEOUT_S" node_answers >>"$ROLL_CLUSTER_STEP_LOG" 2>"$errors" || status=$?
    # ssh's words go to the step log too: fail shows its tail.
    cat "$errors" >>"$ROLL_CLUSTER_STEP_LOG"
    if ((status == 0)); then
      rm -f "$errors"
      return 0
    fi
    kind=$(classify_ssh_failure "$status" "$errors")
    # grep exits 1 when ssh wrote nothing but banners or blank lines: then there is no error line to quote.
    error=$(grep -v -e '^@' -e '^ *$' "$errors" | tail -n 1 || :)
    if ((status == 124)); then error="no answer within ${REACH_TIMEOUT_S}s"; fi
    : "${error:=exit $status}"
    if [[ "$kind" == host-key-* || "$kind" == auth-refused ]]; then
      # A refusal is the same on every attempt: no point in waiting for another.
      rm -f "$errors"
      refuse_teardown "$kind" "$error"
    fi
    banner "ssh to $HOST failed (attempt $attempt/$REACH_ATTEMPTS, exit $status: $error)"
    ((attempt == REACH_ATTEMPTS)) || sleep 2
  done
  rm -f "$errors"
  # The last attempt decides: an answer we cannot read as "unreachable" may be a node that still runs.
  if [[ "$kind" != unreachable ]]; then
    refuse_teardown "$kind" "$error"
  fi
  NODE_GONE=true
}

run_delete() {
  local status=0
  bounded "$TEARDOWN_TIMEOUT_S" ssh "${SSH_OPTIONS[@]}" -- "$SSH_USER@$HOST" sh -s <<<"$REMOTE_COMMAND" || status=$?
  case $status in
    0) ;;
    # The node went away while the step ran (a reboot, a release): nothing is left running there.
    255) banner "the connection to $HOST dropped during the delete step; the node is going away: done" ;;
    124) fail "the delete step on $HOST did not finish within ${TEARDOWN_TIMEOUT_S}s" ;;
    *) fail "the delete step on $HOST exited $status" ;;
  esac
}

run_step check_settings "check the settings"
run_step probe_node "check that $HOST answers (${REACH_ATTEMPTS} x ${REACH_TIMEOUT_S}s at most)"
if [[ "$NODE_GONE" == true ]]; then
  banner "$HOST is gone (stopped, released or unreachable: nothing answers at its address): nothing left to stop there; done"
  exit 0
fi
run_step run_delete "run $ROLL_CLUSTER_STEP on $HOST"
