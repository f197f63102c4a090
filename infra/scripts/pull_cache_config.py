"""The pull cache's registry configuration (pull_cache.sh cache_config_text), printed to stdout.

YAML whose strings are JSON strings (a subset of YAML), so no value can break out of its field. Everything comes
from the environment (CACHE_DIR, CACHE_LISTEN_ADDR, CACHE_PORT, CACHE_UPSTREAM, REGISTRY_USERNAME/PASSWORD): the
password never appears in argv.
"""

from __future__ import annotations

import json
import os


def cache_config(env: dict[str, str]) -> str:
    quote = json.dumps
    lines = [
        "# roll-cluster pull-through cache (infra/scripts/pull_cache.sh); written by the pull-cache step",
        "version: 0.1",
        "log:",
        "  level: info",
        "storage:",
        "  filesystem:",
        f"    rootdirectory: {quote(env['CACHE_DIR'] + '/registry')}",
        "http:",
        f"  addr: {quote(env['CACHE_LISTEN_ADDR'] + ':' + env['CACHE_PORT'])}",
        "proxy:",
        f"  remoteurl: {quote(env['CACHE_UPSTREAM'])}",
    ]
    if env.get("REGISTRY_USERNAME"):
        lines.append(f"  username: {quote(env['REGISTRY_USERNAME'])}")
        lines.append(f"  password: {quote(env['REGISTRY_PASSWORD'])}")
    return "\n".join(lines)


def main() -> None:
    print(cache_config(dict(os.environ)))


if __name__ == "__main__":
    main()
