"""Fill the pull cache once (pull_cache.sh warm_once): every blob of the image's manifest (its platform's, from a
multi-platform index) that the cache's storage does not hold yet is fetched once through the cache, one request per
blob, then each blob's file in the storage awaited, so that no node's pull finds a blob still in flight (the
registry fetches a blob again when it is asked for it while the first fetch is running). A second run (a resumed
cluster) reads the manifest and fetches nothing.

Environment: CACHE_URL, CACHE_REPOSITORY (path:tag), CACHE_ARCH, CACHE_DIR.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import sys
import time
import urllib.request
from typing import IO, Any

ACCEPT = ", ".join([
    "application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json",
])
STORE_WAIT_S = 600


class Cache:
    def __init__(self, base: str, repository: str, storage_root: str) -> None:
        self.base, self.repository, self.root = base, repository, storage_root

    def get(self, path: str, accept: str | None = None) -> IO[bytes]:
        request = urllib.request.Request(f"{self.base}/v2/{self.repository}/{path}",
                                         headers={"Accept": accept} if accept else {})
        response: IO[bytes] = urllib.request.urlopen(request, timeout=600)
        return response

    def stored(self, digest: str) -> str:
        hexed = digest.split(":", 1)[1]
        return f"{self.root}/sha256/{hexed[:2]}/{hexed}/data"

    def fetch(self, digest: str) -> int:
        size = 0
        with self.get(f"blobs/{digest}") as response:
            while chunk := response.read(1 << 20):
                size += len(chunk)
        return size


def image_blobs(cache: Cache, tag: str, arch: str) -> list[str]:
    manifest: dict[str, Any] = json.load(cache.get(f"manifests/{tag}", ACCEPT))
    if "manifests" in manifest:
        chosen = [m for m in manifest["manifests"]
                  if m.get("platform", {}).get("os") == "linux" and m.get("platform", {}).get("architecture") == arch]
        if not chosen:
            sys.exit(f"no linux/{arch} manifest in {cache.repository}:{tag}")
        manifest = json.load(cache.get(f"manifests/{chosen[0]['digest']}", ACCEPT))
    return [manifest["config"]["digest"]] + [layer["digest"] for layer in manifest["layers"]]


def warm(cache: Cache, tag: str, arch: str) -> str:
    blobs = image_blobs(cache, tag, arch)
    missing = [digest for digest in blobs if not os.path.exists(cache.stored(digest))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        total = sum(pool.map(cache.fetch, missing))
    for digest in missing:
        deadline = time.monotonic() + STORE_WAIT_S
        while not os.path.exists(cache.stored(digest)):
            if time.monotonic() > deadline:
                sys.exit(f"blob {digest} fetched but not stored in the cache ({cache.stored(digest)})")
            time.sleep(0.5)
    return f"cache holds {len(blobs)} blobs ({len(missing)} fetched now, {total / 1e9:.2f} GB)"


def main() -> None:
    repository, _, tag = os.environ["CACHE_REPOSITORY"].partition(":")
    cache = Cache(os.environ["CACHE_URL"], repository, os.environ["CACHE_DIR"] + "/registry/docker/registry/v2/blobs")
    print(warm(cache, tag or "latest", os.environ["CACHE_ARCH"]))


if __name__ == "__main__":
    main()
