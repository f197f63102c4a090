#!/usr/bin/env bash
# The project's own environment and shell variables carry the project's prefix, ROLL_CLUSTER_ (as the user-facing
# ROLL_CLUSTER_RESUME, ROLL_CLUSTER_HEAD_IP, ... already do), so that a bare ROLL_ names the ROLL framework only
# (ROLL_CHECKOUT, ROLL_DIR, ROLL_PIPELINES, ...). Re-apply it to code merged from a branch made before the rename:
#   bash tools/rename_project_env.sh        (from the repository root; idempotent)
set -euo pipefail

readonly RENAMED='STEP_LOG|STEP|STATE_DIR|LOG_DIR|TEST_AUTOSTOP_SDK_ROOT|E2E_RAY_VENV'

rename_in_tracked_files() {
  local pattern="\\bROLL_(${RENAMED})\\b"
  git grep -lzE -e "$pattern" -- . ':!tests/fixtures' ':!tools/rename_project_env.sh' \
    | xargs -0 --no-run-if-empty sed -i -E -e "s/${pattern}/ROLL_CLUSTER_\\1/g"
}

rename_in_tracked_files
