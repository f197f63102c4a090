"""The pull cache's registry configuration (pull_cache.sh cache_config_text), printed to stdout.

A plain registry (no proxy section, no auth, deletes off): the fill (pull_cache_fill.py) puts the image into it, the
nodes pull from it. YAML whose strings are JSON strings (a subset of YAML), so no value can break out of its field.
Everything comes from the environment (CACHE_DIR, CACHE_LISTEN_ADDR, CACHE_PORT); it holds no secret.
"""

from __future__ import annotations

import json
import os


def cache_config(env: dict[str, str]) -> str:
    quote = json.dumps
    return "\n".join([
        "# roll-cluster pull cache (infra/scripts/pull_cache.sh); written by the pull-cache step",
        "version: 0.1",
        "log:",
        "  level: info",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {quote(env['CACHE_DIR'] + '/registry')}",
        "  delete:",
        "    enabled: false",
        "http:",
        f"  addr: {quote(env['CACHE_LISTEN_ADDR'] + ':' + env['CACHE_PORT'])}",
    ])


def main() -> None:
    print(cache_config(dict(os.environ)))


if __name__ == "__main__":
    main()
