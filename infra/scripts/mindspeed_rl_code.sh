#!/usr/bin/env bash
# code, second half for MindSpeed-RL (over SSH on the host, root; acts inside the training container with docker
# exec). Rendered AFTER fetch_code.sh in the same step: fetch_code.sh has already checked out MindSpeed-RL itself in
# CODE_DIR (with no requirements installed) and left its functions defined; this script reuses them to fetch
# MindSpeed, Megatron-LM and MindSpeed-LLM at their pinned refs into MSRL_SOURCES_DIR, copies their packages
# (`mindspeed/`, `megatron/`, `mindspeed_llm/`) into CODE_DIR and installs the requirements in the order of
# MindSpeed-RL 2.0.0's install guide and seed 002 ("准备源码"): MindSpeed's requirements.txt, MindSpeed-RL's, then
# the antlr4 runtime with --no-deps (docs/mindspeed-rl.md section 4).
#
# Every part is idempotent: each source has fetch_code.sh's marker; the copies are recorded in
# <CODE_DIR>.roll-cluster-placed (source commits) and redone only when a source moved or a copy is missing; the pip
# installs are recorded in <CODE_DIR>.roll-cluster-pip with the container's id (a recreated container installs again).
#
# Environment (besides fetch_code.sh's, whose CODE_* describe MindSpeed-RL itself):
#   MSRL_SOURCES_DIR (required)          absolute directory (in the container) holding the three source checkouts
#   MINDSPEED_REPO, MINDSPEED_REF (required), MINDSPEED_ARCHIVE_URL [''], MINDSPEED_MIRROR_REPO ['']
#   MEGATRON_REPO, MEGATRON_REF (required), MEGATRON_ARCHIVE_URL [''], MEGATRON_MIRROR_REPO ['']
#   MINDSPEED_LLM_REPO, MINDSPEED_LLM_REF (required), MINDSPEED_LLM_ARCHIVE_URL [''], MINDSPEED_LLM_MIRROR_REPO ['']
#   (a *_MIRROR_REPO is tried first, as fetch_code.sh's CODE_MIRROR_REPO)
#   MSRL_ANTLR_REQUIREMENT [antlr4-python3-runtime==4.7.2]   installed last, with --no-deps
#   MSRL_IMAGE [unknown]                 the training image, named when the runtime is missing
#   MSRL_RUNTIME_MODULES [torch torch_npu apex vllm vllm_ascend]   Python modules the image must have
#
# First of all the image is checked for MindSpeed-RL's runtime (the modules above and libjemalloc.so.2): nothing
# here installs it (docs/ascend.md says why and how to build such an image), so a missing part stops the step
# before any download, naming roll-cluster:container.image.

: "${MINDSPEED_ARCHIVE_URL:=}"
: "${MEGATRON_ARCHIVE_URL:=}"
: "${MINDSPEED_LLM_ARCHIVE_URL:=}"
: "${MINDSPEED_MIRROR_REPO:=}"
: "${MEGATRON_MIRROR_REPO:=}"
: "${MINDSPEED_LLM_MIRROR_REPO:=}"
: "${MSRL_ANTLR_REQUIREMENT:=antlr4-python3-runtime==4.7.2}"
: "${MSRL_IMAGE:=unknown}"
# Where libjemalloc.so.2 is looked for: the same places as ray_common.sh's add_jemalloc_preload.
: "${JEMALLOC_CANDIDATES:=/usr/lib/aarch64-linux-gnu/libjemalloc.so.2 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2 /usr/local/lib/libjemalloc.so.2 /usr/lib64/libjemalloc.so.2}"
: "${MSRL_RUNTIME_MODULES:=torch torch_npu apex vllm vllm_ascend}"

# What fetch_code.sh placed: MindSpeed-RL's own directory and commit (CODE_* are reused for each source below).
MSRL_DIR=$CODE_DIR
MSRL_COMMIT=${FETCHED_COMMIT:-$CODE_REF}
MSRL_REQUIREMENTS=requirements.txt
PLACED_MARKER="$MSRL_DIR.roll-cluster-placed"
PIP_MARKER="$MSRL_DIR.roll-cluster-pip"
declare -A SOURCE_COMMIT=()

check_placement_settings() {
  require_env MSRL_SOURCES_DIR MINDSPEED_REPO MINDSPEED_REF MEGATRON_REPO MEGATRON_REF MINDSPEED_LLM_REPO \
    MINDSPEED_LLM_REF
  [[ "$MSRL_SOURCES_DIR" == /?* ]] || fail "MSRL_SOURCES_DIR must be an absolute path below /, got '$MSRL_SOURCES_DIR'"
  MSRL_SOURCES_DIR=${MSRL_SOURCES_DIR%/}
  case "$MSRL_SOURCES_DIR/" in
    "$MSRL_DIR"/*) fail "MSRL_SOURCES_DIR ($MSRL_SOURCES_DIR) must not lie inside MindSpeed-RL's CODE_DIR ($MSRL_DIR)" ;;
  esac
}

# fetch_source NAME REPO REF ARCHIVE_URL MIRROR_REPO: one source checkout under MSRL_SOURCES_DIR with fetch_code.sh's own fetch
# (git, then the archive; a marker; never over local edits). Nothing is pip-installed here.
# The CODE_* and install settings below are read by fetch_code.sh's functions, rendered before this script.
# shellcheck disable=SC2034
fetch_source() {
  local name=$1
  CODE_REPO=$2 CODE_REF=$3 CODE_ARCHIVE_URL=$4 CODE_MIRROR_REPO=$5
  CODE_DIR="$MSRL_SOURCES_DIR/$name"
  CODE_MARKER="$CODE_DIR.roll-cluster-code"
  REQUIREMENTS_FILE='' PIP_EXTRA_PACKAGES='' INSTALL_EDITABLE=0
  fetch_code
  SOURCE_COMMIT[$name]=${FETCHED_COMMIT:-$CODE_REF}
}

fetch_mindspeed() {
  fetch_source MindSpeed "$MINDSPEED_REPO" "$MINDSPEED_REF" "$MINDSPEED_ARCHIVE_URL" "$MINDSPEED_MIRROR_REPO"
}
fetch_megatron() {
  fetch_source Megatron-LM "$MEGATRON_REPO" "$MEGATRON_REF" "$MEGATRON_ARCHIVE_URL" "$MEGATRON_MIRROR_REPO"
}
fetch_mindspeed_llm() {
  fetch_source MindSpeed-LLM "$MINDSPEED_LLM_REPO" "$MINDSPEED_LLM_REF" "$MINDSPEED_LLM_ARCHIVE_URL" \
    "$MINDSPEED_LLM_MIRROR_REPO"
}

# ---- functions that run inside the container (shipped with declare -f) ----

# container_missing_runtime PYTHON JEMALLOC_CANDIDATES MODULE...: print what of MindSpeed-RL's runtime is missing
# (nothing: all there). Modules are found, not imported: importing torch_npu needs CANN's environment, which a bare
# docker exec may lack. jemalloc is looked for where ray_common.sh's add_jemalloc_preload looks.
container_missing_runtime() {
  local python=$1 candidates=$2 lib
  shift 2
  # The program arrives on stdin: missing_modules.py, which the caller feeds (run_in_container -i).
  "$python" - "$@" || echo "$@"
  for lib in $candidates; do
    [[ -e "$lib" ]] && return 0
  done
  echo libjemalloc.so.2
}

# container_place SOURCE_PACKAGE_DIR TARGET_DIR: replace TARGET_DIR with a copy of SOURCE_PACKAGE_DIR; the copy is
# made beside the target first, so an interrupted run never leaves half a package in place.
container_place() {
  local source=$1 target=$2
  [[ -d "$source" ]] || { echo "no directory $source" >&2; return 1; }
  rm -rf -- "$target.roll-cluster-tmp"
  cp -r -- "$source" "$target.roll-cluster-tmp"
  rm -rf -- "$target"
  mv -- "$target.roll-cluster-tmp" "$target"
}

# container_placed_state MARKER DIR...: the marker's text, then `missing=<dir>` for each DIR that is not there.
container_placed_state() {
  local marker=$1 dir
  shift
  if [[ -f "$marker" ]]; then cat "$marker"; fi
  for dir in "$@"; do
    [[ -d "$dir" ]] || echo "missing=$dir"
  done
}

# ---- host side ----

check_runtime() {
  local missing modules
  read -r -a modules <<<"$MSRL_RUNTIME_MODULES"
  missing=$(run_in_container -i container_missing_runtime "$CONTAINER_PYTHON" "$JEMALLOC_CANDIDATES" "${modules[@]}" \
    <"$HELPER_MISSING_MODULES") \
    || fail "could not inspect the Python runtime of container $CONTAINER_NAME"
  missing=${missing//$'\n'/ }
  missing=${missing# }
  [[ -z "$missing" ]] \
    || fail "roll-cluster:container.image $MSRL_IMAGE lacks MindSpeed-RL's runtime: missing $missing (needed: $MSRL_RUNTIME_MODULES, libjemalloc.so.2; docs/ascend.md)"
  banner "verified: the image has $MSRL_RUNTIME_MODULES and libjemalloc.so.2"
}

placement_record() {
  printf '%s\n' "MindSpeed-RL=$MSRL_COMMIT" "MindSpeed=${SOURCE_COMMIT[MindSpeed]}" \
    "Megatron-LM=${SOURCE_COMMIT[Megatron-LM]}" "MindSpeed-LLM=${SOURCE_COMMIT[MindSpeed-LLM]}"
}

place_packages() {
  local expected state
  expected=$(placement_record)
  state=$(run_in_container container_placed_state "$PLACED_MARKER" \
    "$MSRL_DIR/mindspeed" "$MSRL_DIR/megatron" "$MSRL_DIR/mindspeed_llm") \
    || fail "could not inspect $MSRL_DIR in container $CONTAINER_NAME"
  if [[ "$state" == "$expected" ]]; then
    banner "verified: mindspeed, megatron and mindspeed_llm in $MSRL_DIR are from the pinned sources; copy skipped"
    return 0
  fi
  logged run_in_container container_place "$MSRL_SOURCES_DIR/MindSpeed/mindspeed" "$MSRL_DIR/mindspeed"
  logged run_in_container container_place "$MSRL_SOURCES_DIR/Megatron-LM/megatron" "$MSRL_DIR/megatron"
  logged run_in_container container_place "$MSRL_SOURCES_DIR/MindSpeed-LLM/mindspeed_llm" "$MSRL_DIR/mindspeed_llm"
  record_marker "$PLACED_MARKER" "$expected"
  banner "placed mindspeed, megatron and mindspeed_llm in $MSRL_DIR"
}

install_placed_requirements() {
  local expected
  expected=$(printf '%s\n' "container=$CONTAINER_ID" "index=$PIP_INDEX_URL" "antlr=$MSRL_ANTLR_REQUIREMENT" \
    "$(placement_record)")
  if marker_matches "$PIP_MARKER" "$expected"; then
    banner "requirements already installed for these sources in this container; skipped"
    return 0
  fi
  run_in_container container_file_exists "$MSRL_SOURCES_DIR/MindSpeed/requirements.txt" \
    || fail "requirements.txt not found in $MSRL_SOURCES_DIR/MindSpeed ($MINDSPEED_REPO@$MINDSPEED_REF)"
  run_in_container container_file_exists "$MSRL_DIR/$MSRL_REQUIREMENTS" \
    || fail "$MSRL_REQUIREMENTS not found in $MSRL_DIR (MindSpeed-RL@$MSRL_COMMIT)"
  pip_install_in "$MSRL_SOURCES_DIR/MindSpeed" -r requirements.txt
  pip_install_in "$MSRL_DIR" -r "$MSRL_REQUIREMENTS"
  pip_install_in "$MSRL_DIR" --no-deps -- "$MSRL_ANTLR_REQUIREMENT"
  record_marker "$PIP_MARKER" "$expected"
  banner "installed MindSpeed's and MindSpeed-RL's requirements and $MSRL_ANTLR_REQUIREMENT (--no-deps)"
}

check_placement_settings
run_step check_runtime "MindSpeed-RL's runtime in the image"
run_step fetch_mindspeed "code $MINDSPEED_REPO@$MINDSPEED_REF in $MSRL_SOURCES_DIR/MindSpeed"
run_step fetch_megatron "code $MEGATRON_REPO@$MEGATRON_REF in $MSRL_SOURCES_DIR/Megatron-LM"
run_step fetch_mindspeed_llm "code $MINDSPEED_LLM_REPO@$MINDSPEED_LLM_REF in $MSRL_SOURCES_DIR/MindSpeed-LLM"
run_step place_packages "mindspeed, megatron and mindspeed_llm placed in $MSRL_DIR"
run_step install_placed_requirements "MindSpeed-RL's Python requirements"
