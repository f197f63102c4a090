#!/usr/bin/env bash
# model (over SSH on the head, root; acts inside the training container with docker exec): the job's models
# downloaded once into the hubs' caches on the shared storage (the container's HF_HUB_CACHE and MODELSCOPE_CACHE,
# infra/model_cache.py), through the hub client the framework itself calls (huggingface_hub's or ModelScope's
# snapshot_download), before the job and beside the code and Ray steps. Every node's framework then finds the files
# and downloads nothing. A second run finds them too: the clients compare the cache with the hub's file list and
# download only what is missing (huggingface_hub resumes a partial `.incomplete` blob), so a retry after a cut
# connection continues where it stopped.
#
# Environment (defaults in brackets):
#   CONTAINER_NAME (required)   the running training container
#   MODELS_JSON (required)      [[hub, repo_id, endpoint], ...]: hub huggingface|modelscope; endpoint: HF_ENDPOINT
#                               for huggingface_hub ('' for the client's default)
#   MODEL_TIMEOUT_S (required)  the bound on all the downloads together (training.startTimeoutMinutes)
#   JOB_WORKDIR ['']            the job's working directory: a name that is a directory there (or anywhere as an
#                               absolute path) is the framework's local path, nothing to download
#   RAY_EXTRA_ENV_NAMES ['']    names of exported variables passed into the container (HF_TOKEN for gated models)
#   CONTAINER_PYTHON [python3], CONTAINER_WAIT_TIMEOUT_S [120]
#   CLIENT_WAIT_TIMEOUT_S [900] how long to wait for the hub client in the container: ModelScope's may come with
#                               the framework's requirements, which the code step installs beside this one
#   lib.sh: RETRY_ATTEMPTS, RETRY_DELAY_S, ROLL_CLUSTER_LOG_DIR

: "${JOB_WORKDIR:=}"
: "${CONTAINER_PYTHON:=python3}"
: "${CONTAINER_WAIT_TIMEOUT_S:=120}"
: "${CLIENT_WAIT_TIMEOUT_S:=900}"

check_settings() {
  require_env CONTAINER_NAME MODELS_JSON MODEL_TIMEOUT_S
  require_int MODEL_TIMEOUT_S CONTAINER_WAIT_TIMEOUT_S CLIENT_WAIT_TIMEOUT_S
  EXEC_ENV=()
  local name
  for name in ${RAY_EXTRA_ENV_NAMES:-}; do
    [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || fail "RAY_EXTRA_ENV_NAMES: '$name' is not a variable name"
    [[ -n "${!name:-}" ]] && EXEC_ENV+=(-e "$name")  # `-e NAME`: docker takes the value from this environment
  done
  MODEL_DEADLINE=$((SECONDS + MODEL_TIMEOUT_S))
}

# ---- run inside the container (shipped with declare -f) ----

# container_fetch_model PYTHON HUB REPO_ID ENDPOINT WORKDIR: one model into its hub's cache. Exit 0: there (or a
# local directory); 2: the hub says it does not exist or is gated (not retried); 3: the hub's client is missing;
# anything else: a failure worth retrying.
container_fetch_model() {
  # The program arrives on stdin: model_download.py, which the caller feeds (run_in_container -i).
  "$1" - "${@:2}"
}

# container_has_client PYTHON HUB: whether the hub's client can be imported.
container_has_client() {
  case $2 in
    huggingface) "$1" -c 'import huggingface_hub' ;;
    modelscope) "$1" -c 'import modelscope.hub.snapshot_download' ;;
    *) return 1 ;;
  esac
}

# ---- host side ----

# read_models: MODELS (hub, id, endpoint per line, tab-separated) from MODELS_JSON.
read_models() {
  MODELS=$(python3 "$HELPER_MODEL_LIST" "$MODELS_JSON") || fail "MODELS_JSON is not a list of [hub, id, endpoint]"
}

left_s() {
  local left=$((MODEL_DEADLINE - SECONDS))
  printf '%s\n' "$((left > 0 ? left : 0))"
}

# fetch_once HUB REPO_ID ENDPOINT: one attempt, bounded by what is left of MODEL_TIMEOUT_S, its output in the log.
fetch_once() {
  local status=0 limit
  limit=$(left_s)
  if ((limit == 0)); then
    FETCH_STATUS=124
    return 0
  fi
  printf '+ fetch %s %s %s\n' "$1" "$2" "${3:-(default endpoint)}" >>"$ROLL_CLUSTER_STEP_LOG"
  bounded "$limit" run_in_container -i container_fetch_model "$CONTAINER_PYTHON" "$1" "$2" "$3" "$JOB_WORKDIR" \
    <"$HELPER_MODEL_DOWNLOAD" >>"$ROLL_CLUSTER_STEP_LOG" 2>&1 || status=$?
  # Not worth retrying: the hub refused the model (2), the client is missing (3), the bound is spent (124).
  if ((status == 2 || status == 3 || status == 124)); then
    FETCH_STATUS=$status
    return 0
  fi
  FETCH_STATUS=$status
  return "$status"
}

fetch_models() {
  local hub repo_id endpoint started limit
  read_models
  if [[ -z "$MODELS" ]]; then
    banner "no model named by hub id: nothing to download"
    return 0
  fi
  while IFS=$'\t' read -r hub repo_id endpoint; do
    started=$SECONDS
    limit=$(left_s)
    limit=$((limit < CLIENT_WAIT_TIMEOUT_S ? limit : CLIENT_WAIT_TIMEOUT_S))
    POLL_WHAT="the $hub client in container $CONTAINER_NAME (the code step may be installing it)" \
      poll_until "$limit" 5 run_in_container container_has_client "$CONTAINER_PYTHON" "$hub" </dev/null \
      || fail "the $hub hub client is not in container $CONTAINER_NAME after ${limit}s: the framework downloads $repo_id with it, so the image (or the framework's requirements) must provide it"
    FETCH_STATUS=0
    retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" fetch_once "$hub" "$repo_id" "$endpoint" </dev/null || :
    case $FETCH_STATUS in
      0) banner "$repo_id from $hub${endpoint:+ ($endpoint)} is in the cache ($((SECONDS - started))s)" ;;
      2) fail "the $hub hub refused $repo_id (not found, gated without a token, or no such revision)" ;;
      3) fail "the $hub hub client disappeared from container $CONTAINER_NAME" ;;
      124) fail "downloading $repo_id from $hub did not finish within MODEL_TIMEOUT_S=${MODEL_TIMEOUT_S}s (training.startTimeoutMinutes)" ;;
      *) fail "downloading $repo_id from $hub failed $RETRY_ATTEMPTS times (last exit $FETCH_STATUS)" ;;
    esac
  done <<<"$MODELS"
}

check_settings
run_step wait_for_container "container $CONTAINER_NAME"
run_step fetch_models "the job's models into the shared cache"
