"""Download an archive (tar or zip) and unpack it into a directory, its single top-level folder becoming the
directory, which it replaces (fetch_code.sh and roll_env_setup.sh container_fetch_archive: where git cannot fetch).

Runs in the training container with its python (`run_in_container -i`: the program arrives on stdin): URL DEST.
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tempfile
import urllib.request
import zipfile

url, dest = sys.argv[1], sys.argv[2].rstrip("/")
parent = os.path.dirname(dest) or "/"
os.makedirs(parent, exist_ok=True)
work = tempfile.mkdtemp(prefix=".roll-cluster-archive-", dir=parent)
try:
    archive = os.path.join(work, "archive")
    with urllib.request.urlopen(url, timeout=60) as response, open(archive, "wb") as out:
        shutil.copyfileobj(response, out)
    tree = os.path.join(work, "tree")
    os.mkdir(tree)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as bundle:
            bundle.extractall(tree)
    else:
        with tarfile.open(archive) as bundle:
            if hasattr(tarfile, "data_filter"):
                bundle.extractall(tree, filter="data")
            else:
                bundle.extractall(tree)
    entries = os.listdir(tree)
    root = tree
    if len(entries) == 1 and os.path.isdir(os.path.join(tree, entries[0])):
        root = os.path.join(tree, entries[0])
    if os.path.lexists(dest):
        shutil.rmtree(dest)
    os.rename(root, dest)
finally:
    shutil.rmtree(work, ignore_errors=True)
