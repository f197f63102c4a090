"""One model into its hub's cache, through the hub's own client, the one the framework downloads with
(model_fetch.sh container_fetch_model). Exit 0: there (or a local directory of the job); 2: the hub says it does
not exist or is gated (not retried); 3: the hub's client is missing; anything else: a failure worth retrying.

Runs in the training container with its python (`run_in_container -i`: the program arrives on stdin):
HUB REPO_ID ENDPOINT WORKDIR.
"""

from __future__ import annotations

import os
import sys

hub, repo_id, endpoint, workdir = sys.argv[1:5]
if os.path.isabs(repo_id) or (workdir and os.path.isdir(os.path.join(workdir, repo_id))):
    print(f"{repo_id}: a local directory of the job, nothing to download", flush=True)
    sys.exit(0)
if hub == "huggingface":
    if endpoint:
        os.environ["HF_ENDPOINT"] = endpoint  # read when huggingface_hub is imported (constants.py)
    try:
        from huggingface_hub import snapshot_download  # type: ignore[import-not-found]
        from huggingface_hub.errors import (  # type: ignore[import-not-found]
            GatedRepoError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError as error:
        print(f"huggingface_hub is not in the image: {error}", file=sys.stderr)
        sys.exit(3)
    # Formats transformers and vLLM never read for a PyTorch model: not fetched (their size can double a repo's).
    ignored = ["*.h5", "*.msgpack", "*.ot", "*.tflite", "*.onnx", "*.onnx_data", "*.gguf", "*.mlmodel",
               "original/*", "coreml/*", "onnx/*"]
    try:
        path = snapshot_download(repo_id, ignore_patterns=ignored)
    except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError) as error:
        print(f"{repo_id}: {type(error).__name__}: {error}", file=sys.stderr)
        sys.exit(2)
elif hub == "modelscope":
    try:
        from modelscope.hub.snapshot_download import snapshot_download  # type: ignore[import-not-found]
    except ImportError as error:
        print(f"modelscope is not in the image: {error}", file=sys.stderr)
        sys.exit(3)
    path = snapshot_download(repo_id)
else:
    print(f"unknown hub {hub!r}", file=sys.stderr)
    sys.exit(2)
files = [os.path.join(root, name) for root, _, names in os.walk(path) for name in names]
size = sum(os.path.getsize(f) for f in files if os.path.exists(f))
print(f"{repo_id}: {len(files)} files, {size / 1e6:.1f} MB in {path}", flush=True)
