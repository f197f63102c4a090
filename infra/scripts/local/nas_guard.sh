#!/usr/bin/env bash
# nas-guard: runs on the machine that runs `pulumi destroy` (the delete of a pulumi-command local.Command that
# depends on the stack's NAS file system, so the engine runs it just before it would delete the file system).
# `storage.retainOnDestroy` reaches the engine as the file system's retain_on_delete option, which is recorded by
# `pulumi up` only: `pulumi destroy` runs no program, so a value changed to true since the last `up` would not keep
# the file system. This step reads the stack's configuration as it is now and refuses the destroy then.
#
#   bash infra/scripts/local/nas_guard.sh
# Environment:
#   STACK (required)     the stack, fully qualified (org/project/stack)
#   RETAIN (required)    the value the last `up` recorded: true | false
#   GUARD_RESOURCE       this resource's name, for the advice
#   FILE_SYSTEM_ID       the file system's id: when the destroy keeps it, recorded as storage.existingFileSystemId in
#                        the stack's configuration, so that the next `pulumi up` attaches it instead of creating a new
#                        one (the stack's outputs, nasFileSystemId among them, are gone after the destroy)
set -euo pipefail

: "${GUARD_RESOURCE:=shared-fs-guard}"

fail() {
  printf 'nas-guard: %s\n' "$*" >&2
  exit 1
}

current_setting() {
  local out
  if ! command -v pulumi >/dev/null 2>&1; then
    fail "cannot read storage.retainOnDestroy of $STACK (no pulumi command on PATH), so cannot tell whether the" \
      "NAS file system must be kept: run \`pulumi up\` first, or, to delete it anyway, \`pulumi state delete\`" \
      "this step ($GUARD_RESOURCE) and destroy again"
  fi
  # An unset key is the default, true (infra/config/storage.py).
  if ! out=$(pulumi config get --stack "$STACK" --path 'roll-cluster:storage.retainOnDestroy' 2>&1); then
    case $out in
      *"not found"*) out=true ;;
      *) fail "cannot read storage.retainOnDestroy of $STACK: $out" ;;
    esac
  fi
  printf '%s\n' "$out"
}

check_retain() {
  local now
  now=$(current_setting)
  if [[ "$RETAIN" == false && "$now" != false ]]; then
    fail "storage.retainOnDestroy is now $now but was false at the last \`pulumi up\`, and \`pulumi destroy\`" \
      "uses the value recorded then: it would delete the NAS file system and its checkpoints. Run \`pulumi up\`" \
      "first (it records the new value), then destroy; nothing was deleted by this step"
  fi
}

record_kept_file_system() {
  local id=${FILE_SYSTEM_ID:-}
  [[ "$RETAIN" == true && -n "$id" ]] || return 0
  if [[ ! "$id" =~ ^[0-9a-z]{6,32}$ ]]; then
    printf 'nas-guard: not recording the kept file system: FILE_SYSTEM_ID is not a NAS id\n' >&2
    return 0
  fi
  # A failure here must not stop the destroy: the id is printed either way.
  if pulumi config set --stack "$STACK" --path 'roll-cluster:storage.existingFileSystemId' -- "$id" >/dev/null 2>&1; then
    printf 'nas-guard: kept NAS file system %s; recorded as roll-cluster:storage.existingFileSystemId, so the next pulumi up attaches it\n' "$id"
  else
    printf 'nas-guard: kept NAS file system %s; to attach it again: pulumi config set --stack %s --path roll-cluster:storage.existingFileSystemId %s\n' "$id" "$STACK" "$id" >&2
  fi
}

check_retain
record_kept_file_system
