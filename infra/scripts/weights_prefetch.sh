#!/usr/bin/env bash
# weights-prefetch (over SSH on every node, root, on the host): the complete files of the job's models that are
# already in the hubs' caches on the shared storage read once into this node's page cache, from the host's mount
# of the shared storage, while the node pulls the image and starts its container (infra/model_cache.py). When the
# framework starts, every node then reads the weights from memory instead of every node reading the shared storage
# at once. It only reads: it never writes to the shared storage, and it never blocks a first job (a model that is
# not in the cache yet, on a new cluster, is downloaded later by the head's model step: nothing to prefetch).
#
# What counts as complete (only what the hub clients have finished is read):
#   huggingface_hub: the files under models--<org>--<name>/snapshots/<commit of refs/main>/, symlinks to blobs/;
#     a blob is downloaded as `<blob>.incomplete` and the snapshot's symlink is made only once it is complete
#     (huggingface_hub file_download.py, _download_to_tmp_and_move then _create_symlink, 0.36.0). Dangling
#     symlinks and `*.incomplete` are never read.
#   ModelScope: the model folder <MODELSCOPE_CACHE>/models/<org>/<name> (newer clients write '.' in the name as
#     '___'; older ones used hub/ instead of models/). The client downloads into a hidden temporary folder and
#     moves each finished file into the model folder. The layout and that rule at the version of the ROLL image are
#     UNCONFIRMED: hidden entries (the client's temporary folder and its records) and `*.incomplete` are skipped.
#
# Environment (defaults in brackets):
#   MODELS_JSON (required)          [[hub, repo_id, endpoint], ...] as the model step gets it
#   HF_HUB_CACHE_DIR (required)     the host's path of huggingface_hub's cache on the shared storage
#   MODELSCOPE_CACHE_DIR (required) the host's path of ModelScope's cache on the shared storage
#   PREFETCH_TIMEOUT_S (required)   the bound on the whole read; cut there, the step succeeds (the framework reads
#                                   the rest from the shared storage)
#   MEMINFO_FILE [/proc/meminfo]    where MemAvailable is read: the files must fit in half of it

: "${MEMINFO_FILE:=/proc/meminfo}"

check_settings() {
  require_env MODELS_JSON HF_HUB_CACHE_DIR MODELSCOPE_CACHE_DIR PREFETCH_TIMEOUT_S
  require_int PREFETCH_TIMEOUT_S
}

# read_models: MODELS (hub, id per line, tab-separated) from MODELS_JSON.
read_models() {
  MODELS=$(python3 "$HELPER_MODEL_LIST" "$MODELS_JSON" | cut -f 1,2) ||
    fail "MODELS_JSON is not a list of [hub, id, endpoint]"
}

# huggingface_files REPO_ID: "size path" of every complete file of the model's main snapshot, NUL-separated.
huggingface_files() {
  local repo_dir="$HF_HUB_CACHE_DIR/models--${1//\//--}" revision
  [[ -f "$repo_dir/refs/main" ]] || return 0
  revision=$(<"$repo_dir/refs/main")
  [[ "$revision" =~ ^[0-9a-f]+$ && -d "$repo_dir/snapshots/$revision" ]] || return 0
  # -L: the symlinks' blobs (a dangling symlink is of type l then, not f, and is not listed).
  find -L -- "$repo_dir/snapshots/$revision" -type f ! -name '*.incomplete' -printf '%s %p\0'
}

# modelscope_files REPO_ID: "size path" of every finished file of the model folder, NUL-separated.
modelscope_files() {
  local owner=${1%%/*} name=${1#*/} dir
  for dir in "$MODELSCOPE_CACHE_DIR/models/$owner/${name//./___}" "$MODELSCOPE_CACHE_DIR/models/$owner/$name" \
    "$MODELSCOPE_CACHE_DIR/hub/$owner/${name//./___}" "$MODELSCOPE_CACHE_DIR/hub/$owner/$name"; do
    if [[ -d "$dir" ]]; then
      find -- "$dir" -mindepth 1 -name '.*' -prune -o -type f ! -name '*.incomplete' -printf '%s %p\0'
      return 0
    fi
  done
}

# read_files: every file of FILES into the page cache, in order; the first that cannot be read is written to
# READ_ERROR_FILE (the step fails naming it).
read_files() {
  local file
  for file in "${FILES[@]}"; do
    if ! cat -- "$file" >/dev/null 2>>"$ROLL_CLUSTER_STEP_LOG"; then
      printf '%s\n' "$file" >"$READ_ERROR_FILE"
      return 1
    fi
  done
}

prefetch_weights() {
  local hub repo_id entry size lister found key value total=0 available_kb limit status=0 started=$SECONDS
  read_models
  FILES=()
  while IFS=$'\t' read -r hub repo_id; do
    [[ -n "$repo_id" ]] || continue
    case $hub in
      huggingface) lister=huggingface_files ;;
      modelscope) lister=modelscope_files ;;
      *) fail "MODELS_JSON: unknown hub '$hub' for $repo_id" ;;
    esac
    found=0
    while IFS= read -r -d '' entry; do
      size=${entry%% *}
      FILES+=("${entry#* }")
      total=$((total + size))
      found=$((found + 1))
    done < <("$lister" "$repo_id")
    if ((found == 0)); then
      banner "$repo_id ($hub): not in the shared cache yet: nothing to prefetch yet (the head's model step downloads it)"
    fi
  done <<<"$MODELS"
  if ((${#FILES[@]} == 0)); then
    banner "nothing to prefetch yet"
    return 0
  fi
  available_kb=''
  while read -r key value _; do
    if [[ "$key" == MemAvailable: ]]; then available_kb=$value; fi
  done <"$MEMINFO_FILE"
  [[ "$available_kb" =~ ^[0-9]+$ ]] || fail "no MemAvailable in $MEMINFO_FILE"
  limit=$((available_kb * 1024 / 2))
  if ((total > limit)); then
    banner "skipped: the models' $((total / 1000000)) MB do not fit in half of MemAvailable ($((limit / 1000000)) MB): the framework reads them from the shared storage"
    return 0
  fi
  READ_ERROR_FILE=$(mktemp "${TMPDIR:-/tmp}/roll-cluster-prefetch.XXXXXX")
  bounded "$PREFETCH_TIMEOUT_S" read_files </dev/null || status=$?
  if ((status == 124)); then
    rm -f -- "$READ_ERROR_FILE"
    banner "cut at PREFETCH_TIMEOUT_S=${PREFETCH_TIMEOUT_S}s: the framework reads the rest from the shared storage"
    return 0
  fi
  if ((status != 0)); then
    local failed
    failed=$(<"$READ_ERROR_FILE")
    rm -f -- "$READ_ERROR_FILE"
    fail "reading ${failed:-a model file} from the shared storage failed (exit $status)"
  fi
  rm -f -- "$READ_ERROR_FILE"
  banner "read ${#FILES[@]} files, $((total / 1000000)) MB, into the page cache ($((SECONDS - started))s)"
}

check_settings
run_step prefetch_weights "the job's models from the shared cache into the page cache"
