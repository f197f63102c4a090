#!/usr/bin/env bash
# code (over SSH on the host, root; acts inside the training container with docker exec): the framework's code at a
# pinned ref in CODE_DIR and its Python requirements. git clone first (bounded retries, each with a timeout), then
# the archive of the same ref. A marker beside CODE_DIR records repo, ref, commit, what pip installed and in which
# container: a second run only verifies; another ref updates the checkout and reinstalls; a recreated container
# (CODE_DIR survives on its bind mount, the pip installs do not) gets the requirements installed again.
#
# Environment (defaults in brackets):
#   CONTAINER_NAME (required)     the running training container
#   CODE_REPO (required)          git URL
#   CODE_REF (required)           tag or full commit hash
#   CODE_DIR (required)           absolute path in the container, the same on every node (e.g. /workspace/ROLL)
#   CODE_MIRROR_REPO ['']         git URL of a mirror of CODE_REPO that works from mainland China (gitee), tried
#                                 first, MIRROR_ATTEMPTS [1] times; then CODE_REPO; empty: CODE_REPO only
#   CODE_ARCHIVE_URL ['']         .tar.gz/.tgz/.zip of the same ref, used when git fails; empty: no fallback
#   PIP_INDEX_URL [https://mirrors.aliyun.com/pypi/simple/]
#   REQUIREMENTS_FILE ['']        relative to CODE_DIR; empty: none
#   INSTALL_EDITABLE [0]          1: `pip install -e . --no-deps` in CODE_DIR afterwards
#   PIP_EXTRA_PACKAGES ['']       extra pip requirements, space separated
#   PIP_UNINSTALL_PACKAGES ['']   packages removed from the image before the installs, space separated (OpenRLHF's
#                                 dockerfile removes what conflicts with its pins)
#   CONTAINER_PYTHON [python3]    the container's interpreter; pip runs as `<it> -m pip`
#   CLONE_TIMEOUT_S [600], ARCHIVE_TIMEOUT_S [900], PIP_TIMEOUT_S [3600]   bounds for one attempt
#   CONTAINER_WAIT_TIMEOUT_S [120]   bound for the container to be running
#   CODE_MARKER [<CODE_DIR>.roll-cluster-code]   the marker file, in the container
#   lib.sh: RETRY_ATTEMPTS, RETRY_DELAY_S, ROLL_CLUSTER_LOG_DIR

: "${CODE_ARCHIVE_URL:=}"
: "${CODE_MIRROR_REPO:=}"
: "${MIRROR_ATTEMPTS:=1}"
: "${PIP_INDEX_URL:=https://mirrors.aliyun.com/pypi/simple/}"
: "${REQUIREMENTS_FILE:=}"
: "${INSTALL_EDITABLE:=0}"
: "${PIP_EXTRA_PACKAGES:=}"
: "${PIP_UNINSTALL_PACKAGES:=}"
: "${CONTAINER_PYTHON:=python3}"
: "${CLONE_TIMEOUT_S:=600}"
: "${ARCHIVE_TIMEOUT_S:=900}"
: "${PIP_TIMEOUT_S:=3600}"
: "${CONTAINER_WAIT_TIMEOUT_S:=120}"

check_settings() {
  require_env CONTAINER_NAME CODE_REPO CODE_REF CODE_DIR
  require_int CLONE_TIMEOUT_S ARCHIVE_TIMEOUT_S PIP_TIMEOUT_S CONTAINER_WAIT_TIMEOUT_S MIRROR_ATTEMPTS
  [[ "$CODE_DIR" == /?* ]] || fail "CODE_DIR must be an absolute path below /, got '$CODE_DIR'"
  CODE_DIR=${CODE_DIR%/}
  : "${CODE_MARKER:=$CODE_DIR.roll-cluster-code}"
  case $INSTALL_EDITABLE in
    0 | 1) ;;
    *) fail "INSTALL_EDITABLE must be 0 or 1, got '$INSTALL_EDITABLE'" ;;
  esac
  if [[ -n "$REQUIREMENTS_FILE" && "$REQUIREMENTS_FILE" == /* ]]; then
    fail "REQUIREMENTS_FILE is relative to CODE_DIR, got '$REQUIREMENTS_FILE'"
  fi
}

# ---- functions that run inside the container (shipped with declare -f; only bash, coreutils, git, python) ----

# The marker's lines, then what the directory holds: dir_state=absent|empty|nonempty, and for a git checkout its
# origin and HEAD.
container_code_state() {
  local dir=$1 marker=$2 value
  if [[ -f "$marker" ]]; then cat "$marker"; fi
  if [[ ! -d "$dir" ]]; then
    echo dir_state=absent
    return 0
  fi
  if [[ -z "$(ls -A "$dir")" ]]; then
    echo dir_state=empty
    return 0
  fi
  echo dir_state=nonempty
  if [[ -d "$dir/.git" ]]; then
    # A checkout without origin or commit (an interrupted first clone) reports them empty.
    if value=$(git -C "$dir" remote get-url origin 2>/dev/null); then echo "actual_origin=$value"; fi
    if value=$(git -C "$dir" rev-parse -q --verify HEAD 2>/dev/null); then echo "actual_commit=$value"; fi
    # Edited tracked files (untracked ones, such as pip's *.egg-info, do not count).
    if value=$(git -C "$dir" status --porcelain --untracked-files=no 2>/dev/null) && [[ -n "$value" ]]; then
      echo "local_changes=$(printf '%s' "$value" | head -n 3 | tr '\n' ' ')"
    fi
  fi
}

# Shallow fetch of one ref (tag or commit) and a detached checkout; prints the commit.
container_git_checkout() {
  local repo=$1 ref=$2 dir=$3 timeout_s=$4
  if [[ ! -d "$dir/.git" ]]; then
    mkdir -p "$dir"
    git -C "$dir" init -q
    # --end-of-options (git >= 2.24): a repo or ref is never read as an option (`--upload-pack=<cmd>` runs <cmd>).
    git -C "$dir" remote add --end-of-options origin "$repo"
  else
    git -C "$dir" remote set-url --end-of-options origin "$repo"  # the mirror, or the repo itself after a mirror's checkout
  fi
  timeout "$timeout_s" git -C "$dir" fetch -q --depth 1 --end-of-options origin "$ref"
  git -C "$dir" -c advice.detachedHead=false checkout -q FETCH_HEAD
  if [[ -f "$dir/.gitmodules" ]]; then
    timeout "$timeout_s" git -C "$dir" submodule update -q --init --recursive --depth 1
  fi
  git -C "$dir" rev-parse HEAD
}

# Download and unpack an archive into dir (its single top-level folder becomes dir), replacing dir.
container_fetch_archive() {
  local url=$1 dir=$2 timeout_s=$3 python=$4
  # The program arrives on stdin: archive_fetch.py, which the caller feeds (run_in_container -i).
  timeout "$timeout_s" "$python" - "$url" "$dir"
}

container_remove_dir() {
  rm -rf -- "$1"
}

container_file_exists() {
  [[ -f "$1" ]]
}

# A file's content, or nothing when it does not exist (a marker not written yet).
container_read_file() {
  if [[ -f "$1" ]]; then cat "$1"; fi
}

# Replace a file with stdin.
container_write_file() {
  mkdir -p "$(dirname "$1")"
  cat >"$1.tmp"
  mv -f "$1.tmp" "$1"
}

# ---- host side ----

# marker_matches MARKER EXPECTED: whether a marker file in the container records EXPECTED (a step's work done for
# these inputs in this container); a marker that cannot be read fails the step.
marker_matches() {
  local current
  current=$(run_in_container container_read_file "$1") || fail "could not read $1 in container $CONTAINER_NAME"
  [[ "$current" == "$2" ]]
}

# record_marker MARKER CONTENT: record CONTENT in a marker file in the container, once the work it stands for is done.
record_marker() {
  printf '%s\n' "$2" | run_in_container -i container_write_file "$1"
}

# read_code_state: the marker (M_* variables) and the directory (DIR_STATE, ACTUAL_ORIGIN, ACTUAL_COMMIT,
# LOCAL_CHANGES).
read_code_state() {
  local state line key value
  state=$(run_in_container container_code_state "$CODE_DIR" "$CODE_MARKER") \
    || fail "could not inspect $CODE_DIR in container $CONTAINER_NAME"
  M_REPO='' M_REF='' M_COMMIT='' M_SOURCE='' M_REQUIREMENTS='' M_EXTRA='' M_EDITABLE='' M_INDEX='' M_INSTALLED=''
  M_UNINSTALL=''
  DIR_STATE='' ACTUAL_ORIGIN='' ACTUAL_COMMIT='' LOCAL_CHANGES=''
  while IFS= read -r line; do
    key=${line%%=*} value=${line#*=}
    case $key in
      repo) M_REPO=$value ;;
      ref) M_REF=$value ;;
      commit) M_COMMIT=$value ;;
      source) M_SOURCE=$value ;;
      requirements) M_REQUIREMENTS=$value ;;
      extra) M_EXTRA=$value ;;
      uninstall) M_UNINSTALL=$value ;;
      editable) M_EDITABLE=$value ;;
      index) M_INDEX=$value ;;
      installed) M_INSTALLED=$value ;;
      dir_state) DIR_STATE=$value ;;
      actual_origin) ACTUAL_ORIGIN=$value ;;
      actual_commit) ACTUAL_COMMIT=$value ;;
      local_changes) LOCAL_CHANGES=$value ;;
    esac
  done <<<"$state"
}

# Whether CODE_DIR holds exactly what the marker says was fetched for this repo and ref.
code_is_current() {
  [[ "$M_REPO" == "$CODE_REPO" && "$M_REF" == "$CODE_REF" && "$DIR_STATE" == nonempty ]] || return 1
  case $M_SOURCE in
    git) [[ -n "$M_COMMIT" && "$ACTUAL_COMMIT" == "$M_COMMIT" ]] ;;
    archive) true ;;
    *) false ;;
  esac
}

# write_code_marker INSTALLED_IN: INSTALLED_IN is the id of the container pip installed the requirements in (empty:
# not yet).
write_code_marker() {
  record_marker "$CODE_MARKER" "$(printf '%s\n' "repo=$CODE_REPO" "ref=$CODE_REF" "commit=$FETCHED_COMMIT" \
    "source=$FETCHED_SOURCE" "requirements=$REQUIREMENTS_FILE" "extra=$PIP_EXTRA_PACKAGES" \
    "uninstall=$PIP_UNINSTALL_PACKAGES" "editable=$INSTALL_EDITABLE" "index=$PIP_INDEX_URL" "installed=$1")"
}

# Clear what is in the way of a fresh fetch: only content this script wrote (a marker exists) is removed, and
# never a checkout with edits (moving it to another ref, or the archive fallback, would lose them).
clear_code_dir() {
  if [[ "$DIR_STATE" != nonempty ]]; then
    return 0
  fi
  if [[ -n "$LOCAL_CHANGES" ]]; then
    fail "$CODE_DIR in container $CONTAINER_NAME has local changes ($LOCAL_CHANGES); commit, stash or discard them before moving it to $CODE_REF"
  fi
  if [[ "$ACTUAL_ORIGIN" == "$CODE_REPO" && "$M_SOURCE" != archive ]]; then
    banner "updating the existing checkout of $CODE_REPO in $CODE_DIR"
    return 0
  fi
  if [[ -n "$M_REPO" ]]; then
    banner "replacing $CODE_DIR (was ${M_REPO}@${M_REF}, from $M_SOURCE)"
    logged run_in_container container_remove_dir "$CODE_DIR"
    return 0
  fi
  fail "$CODE_DIR in container $CONTAINER_NAME already holds files that this step did not fetch${ACTUAL_ORIGIN:+ (a checkout of $ACTUAL_ORIGIN)}; remove it or choose another CODE_DIR"
}

# git_checkout_once [REPO]: one fetch of CODE_REF from REPO (default CODE_REPO) into CODE_DIR.
git_checkout_once() {
  local output repo=${1:-$CODE_REPO}
  printf '+ git fetch %s %s into %s\n' "$repo" "$CODE_REF" "$CODE_DIR" >>"$ROLL_CLUSTER_STEP_LOG"
  output=$(run_in_container container_git_checkout "$repo" "$CODE_REF" "$CODE_DIR" "$CLONE_TIMEOUT_S" \
    2>>"$ROLL_CLUSTER_STEP_LOG") || return $?
  FETCHED_COMMIT=${output##*$'\n'}
}

# The mirror's checkout names the mirror as origin; CODE_REPO's fetch must not reuse it (another remote's
# half-fetched state), so a failed mirror attempt leaves no checkout behind.
mirror_checkout_once() {
  if git_checkout_once "$CODE_MIRROR_REPO"; then
    return 0
  fi
  run_in_container container_remove_dir "$CODE_DIR"
  return 1
}

archive_once() {
  log_cmd run_in_container -i container_fetch_archive "$CODE_ARCHIVE_URL" "$CODE_DIR" "$ARCHIVE_TIMEOUT_S" \
    "$CONTAINER_PYTHON" <"$HELPER_ARCHIVE_FETCH"
}

# fetch_git: CODE_REF from the mirror first (when one is set), then from CODE_REPO. FETCHED_FROM names the mirror
# when it served.
fetch_git() {
  if [[ -n "$CODE_MIRROR_REPO" ]]; then
    if retry "$MIRROR_ATTEMPTS" "$RETRY_DELAY_S" mirror_checkout_once; then
      FETCHED_FROM=$CODE_MIRROR_REPO
      return 0
    fi
    banner "git fetch of the mirror $CODE_MIRROR_REPO@$CODE_REF failed; trying $CODE_REPO"
  fi
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" git_checkout_once
}

fetch_code() {
  read_code_state
  if code_is_current; then
    FETCHED_COMMIT=$M_COMMIT FETCHED_SOURCE=$M_SOURCE
    banner "verified: $CODE_DIR holds $CODE_REPO@$CODE_REF (${M_COMMIT:-from the archive}); fetch skipped"
    return 0
  fi
  clear_code_dir
  FETCHED_COMMIT='' FETCHED_SOURCE=git FETCHED_FROM=''
  if fetch_git; then
    banner "checked out $CODE_REPO@$CODE_REF ($FETCHED_COMMIT) in $CODE_DIR${FETCHED_FROM:+ from its mirror $FETCHED_FROM}"
  elif [[ -n "$CODE_ARCHIVE_URL" ]]; then
    banner "git fetch of $CODE_REPO@$CODE_REF failed; falling back to the archive $CODE_ARCHIVE_URL"
    FETCHED_SOURCE=archive
    retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" archive_once \
      || fail "could not fetch the code: git fetch of $CODE_REPO@$CODE_REF failed ($RETRY_ATTEMPTS attempts) and the archive $CODE_ARCHIVE_URL failed too ($RETRY_ATTEMPTS attempts)"
    banner "unpacked $CODE_ARCHIVE_URL into $CODE_DIR"
  else
    fail "could not fetch the code: git fetch of $CODE_REPO@$CODE_REF failed ($RETRY_ATTEMPTS attempts) and no CODE_ARCHIVE_URL is set"
  fi
  # Recorded before pip runs: a failed install is retried on the next run without fetching again.
  write_code_marker ''
  M_INSTALLED=''
}

# pip_install_in DIR ARGS...: pip install in the container from DIR, retried, bounded per attempt.
pip_install_in() {
  local dir=$1
  shift
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" log_cmd docker exec -w "$dir" "$CONTAINER_NAME" \
    timeout "$PIP_TIMEOUT_S" "$CONTAINER_PYTHON" -m pip install --progress-bar off -i "$PIP_INDEX_URL" "$@" \
    || fail "pip install $* in $dir failed after $RETRY_ATTEMPTS attempts"
}

pip_install() {
  pip_install_in "$CODE_DIR" "$@"
}

pip_uninstall() {
  # Removing what is not installed is a warning, not an error, for pip: a rerun passes.
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" log_cmd docker exec -w "$CODE_DIR" "$CONTAINER_NAME" \
    timeout "$PIP_TIMEOUT_S" "$CONTAINER_PYTHON" -m pip uninstall -y -- "$@" \
    || fail "pip uninstall $* in $CONTAINER_NAME failed after $RETRY_ATTEMPTS attempts"
}

install_requirements() {
  local extra_packages=() uninstall_packages=()
  if [[ "$M_INSTALLED" == "$CONTAINER_ID" && "$M_REQUIREMENTS" == "$REQUIREMENTS_FILE" && "$M_EXTRA" == "$PIP_EXTRA_PACKAGES" \
    && "$M_UNINSTALL" == "$PIP_UNINSTALL_PACKAGES" && "$M_EDITABLE" == "$INSTALL_EDITABLE" && "$M_INDEX" == "$PIP_INDEX_URL" ]]; then
    banner "requirements already installed for this checkout in this container; skipped"
    return 0
  fi
  read -r -a uninstall_packages <<<"$PIP_UNINSTALL_PACKAGES"
  if ((${#uninstall_packages[@]} > 0)); then
    pip_uninstall "${uninstall_packages[@]}"
  fi
  if [[ -n "$REQUIREMENTS_FILE" ]]; then
    run_in_container container_file_exists "$CODE_DIR/$REQUIREMENTS_FILE" \
      || fail "requirements file $REQUIREMENTS_FILE not found in $CODE_DIR ($CODE_REPO@$CODE_REF)"
    pip_install -r "$REQUIREMENTS_FILE"
  fi
  read -r -a extra_packages <<<"$PIP_EXTRA_PACKAGES"
  if ((${#extra_packages[@]} > 0)); then
    pip_install -- "${extra_packages[@]}"
  fi
  if [[ "$INSTALL_EDITABLE" == 1 ]]; then
    pip_install -e . --no-deps
  fi
  write_code_marker "$CONTAINER_ID"
  local editable=''
  if [[ "$INSTALL_EDITABLE" == 1 ]]; then editable=' and the code itself (editable)'; fi
  banner "${PIP_UNINSTALL_PACKAGES:+removed $PIP_UNINSTALL_PACKAGES; }installed${REQUIREMENTS_FILE:+ $REQUIREMENTS_FILE}${PIP_EXTRA_PACKAGES:+ $PIP_EXTRA_PACKAGES}$editable"
}

check_settings
run_step wait_for_container "container $CONTAINER_NAME"
run_step fetch_code "code $CODE_REPO@$CODE_REF in $CODE_DIR"
run_step install_requirements "Python requirements"
