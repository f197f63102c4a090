#!/usr/bin/env bash
# code, second half for a ROLL config whose custom_envs use WebShop (env_type webshop; over SSH on the host, root;
# acts inside the training container with docker exec). Rendered AFTER fetch_code.sh in the same step, and only
# when the rendered config needs it (RollAdapter.code): fetch_code.sh has checked out ROLL in CODE_DIR, installed
# its requirements and left its functions defined; this script does what ROLL's own run script does by hand before
# the launcher (examples/qwen2.5-7B-agentic_megatron/run_agentic_pipeline_webshop.sh at ROLL 8eb27cc):
#   1. third_party/webshop-minimal, ROLL's git submodule (.gitmodules: ZihanWang314/webshop-minimal, pinned at
#      ec82552): a git checkout already has it (fetch_code.sh's `git submodule update --init`); a checkout from
#      the archive has an empty folder, so the submodule's own commit is fetched there (git, then its archive).
#      ROLL puts that folder on sys.path itself (roll/pipeline/agentic/env/__init__.py); nothing is built:
#      the Lucene indexes and the small product data are files of the repository (webshop_minimal/search_engine/,
#      webshop_minimal/data/small/), and ROLL's WebShopEnv loads the small data set (env/webshop/env.py).
#   2. `pip install -r third_party/webshop-minimal/requirements.txt` (pyserini, spacy, flask, ...).
#   3. `python -m spacy download en_core_web_sm` (webshop_minimal/goal.py loads it at import).
# First of all the container is checked for a Java runtime: webshop_minimal imports pyserini's LuceneSearcher
# (webshop_minimal/engine.py), which runs Lucene in a JVM; ROLL's images have OpenJDK 21 with JAVA_HOME set
# (docker/Dockerfile.torch260.vllm, docker/Dockerfile.torch280), and nothing here installs one.
# Idempotent: <CODE_DIR>.roll-cluster-webshop records the container, index and model it installed for; a
# recreated container installs again.
#
# Environment (besides fetch_code.sh's, whose CODE_* describe ROLL itself):
#   WEBSHOP_DIR (required)           the submodule's folder, relative to CODE_DIR (third_party/webshop-minimal)
#   WEBSHOP_REPO, WEBSHOP_COMMIT (required)   the submodule's repository and commit at ROLL's pinned ref
#   WEBSHOP_ARCHIVE_URL ['']         .tar.gz of that commit, used when git fails; empty: no fallback
#   WEBSHOP_SPACY_MODEL [en_core_web_sm]
#   WEBSHOP_IMAGE [unknown]          the training image, named when it has no Java runtime
# see verified-facts#roll-env-setup-run-agentic-pipeline-webshop

: "${WEBSHOP_ARCHIVE_URL:=}"
: "${WEBSHOP_SPACY_MODEL:=en_core_web_sm}"
: "${WEBSHOP_IMAGE:=unknown}"

check_webshop_settings() {
  require_env WEBSHOP_DIR WEBSHOP_REPO WEBSHOP_COMMIT
  case $WEBSHOP_DIR in
    /* | *..*) fail "WEBSHOP_DIR is a folder inside CODE_DIR, got '$WEBSHOP_DIR'" ;;
  esac
  WEBSHOP_PATH="$CODE_DIR/${WEBSHOP_DIR%/}"
  WEBSHOP_MARKER="$CODE_DIR.roll-cluster-webshop"
}

# ---- functions that run inside the container (shipped with declare -f) ----

# A JVM for pyjnius: JAVA_HOME's when set (what ROLL's images set), else `java` on PATH.
container_has_java() {
  if [[ -n "${JAVA_HOME:-}" ]]; then
    [[ -x "$JAVA_HOME/bin/java" ]]
  else
    command -v java >/dev/null
  fi
}

# ---- host side ----

check_java() {
  run_in_container container_has_java \
    || fail "roll-cluster:container.image $WEBSHOP_IMAGE has no Java runtime (JAVA_HOME/bin/java or java on PATH), which WebShop's search engine needs (pyserini's LuceneSearcher runs Lucene in a JVM: $WEBSHOP_DIR/webshop_minimal/engine.py:16); ROLL's images have OpenJDK 21 (docker/Dockerfile.torch260.vllm:51-52)"
  banner "verified: the container has a Java runtime for WebShop's search engine"
}

webshop_git_once() {
  printf '+ git fetch %s %s into %s\n' "$WEBSHOP_REPO" "$WEBSHOP_COMMIT" "$WEBSHOP_PATH" >>"$ROLL_CLUSTER_STEP_LOG"
  run_in_container container_git_checkout "$WEBSHOP_REPO" "$WEBSHOP_COMMIT" "$WEBSHOP_PATH" "$CLONE_TIMEOUT_S" \
    >>"$ROLL_CLUSTER_STEP_LOG" 2>&1
}

webshop_archive_once() {
  log_cmd run_in_container -i container_fetch_archive "$WEBSHOP_ARCHIVE_URL" "$WEBSHOP_PATH" "$ARCHIVE_TIMEOUT_S" \
    "$CONTAINER_PYTHON" <"$HELPER_ARCHIVE_FETCH"
}

webshop_code() {
  if run_in_container container_file_exists "$WEBSHOP_PATH/requirements.txt"; then
    banner "verified: $WEBSHOP_PATH holds webshop-minimal (ROLL's submodule); fetch skipped"
    return 0
  fi
  # An archive of ROLL leaves the submodule's folder empty (or absent): its pinned commit is fetched there.
  run_in_container container_remove_dir "$WEBSHOP_PATH"
  if retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" webshop_git_once; then
    banner "checked out $WEBSHOP_REPO@$WEBSHOP_COMMIT in $WEBSHOP_PATH"
    return 0
  fi
  run_in_container container_remove_dir "$WEBSHOP_PATH"
  [[ -n "$WEBSHOP_ARCHIVE_URL" ]] \
    || fail "could not fetch webshop-minimal: git fetch of $WEBSHOP_REPO@$WEBSHOP_COMMIT failed ($RETRY_ATTEMPTS attempts) and no WEBSHOP_ARCHIVE_URL is set"
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" webshop_archive_once \
    || fail "could not fetch webshop-minimal: git fetch of $WEBSHOP_REPO@$WEBSHOP_COMMIT failed and the archive $WEBSHOP_ARCHIVE_URL failed too ($RETRY_ATTEMPTS attempts each)"
  banner "unpacked $WEBSHOP_ARCHIVE_URL into $WEBSHOP_PATH"
}

spacy_download() {
  # spaCy's download command hands the model's wheel to pip; `--` ends its options (click).
  retry "$RETRY_ATTEMPTS" "$RETRY_DELAY_S" log_cmd docker exec -w "$CODE_DIR" "$CONTAINER_NAME" \
    timeout "$PIP_TIMEOUT_S" "$CONTAINER_PYTHON" -m spacy download -- "$WEBSHOP_SPACY_MODEL" \
    || fail "python -m spacy download $WEBSHOP_SPACY_MODEL in $CONTAINER_NAME failed after $RETRY_ATTEMPTS attempts"
}

install_webshop() {
  local expected
  expected=$(printf '%s\n' "container=$CONTAINER_ID" "index=$PIP_INDEX_URL" "dir=$WEBSHOP_DIR" \
    "model=$WEBSHOP_SPACY_MODEL")
  if marker_matches "$WEBSHOP_MARKER" "$expected"; then
    banner "WebShop's requirements and spaCy's $WEBSHOP_SPACY_MODEL already installed in this container; skipped"
    return 0
  fi
  pip_install -r "$WEBSHOP_DIR/requirements.txt"
  spacy_download
  record_marker "$WEBSHOP_MARKER" "$expected"
  banner "installed $WEBSHOP_DIR/requirements.txt and spaCy's $WEBSHOP_SPACY_MODEL"
}

check_webshop_settings
run_step check_java "a Java runtime for WebShop's search engine"
run_step webshop_code "WebShop (webshop-minimal) in $CODE_DIR/$WEBSHOP_DIR"
run_step install_webshop "WebShop's Python requirements and spaCy's $WEBSHOP_SPACY_MODEL"
