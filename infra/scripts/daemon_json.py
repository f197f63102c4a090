"""Docker's daemon.json as install_docker.sh reads and edits it, with the host's python3 (present on both supported
OSes). Usage:
  daemon_json.py has-nvidia-runtime PATH     exit 0 when the file registers the nvidia runtime, else 1
  daemon_json.py set PATH KEY JSON_VALUE     KEY set to the value, merged into what is there (nvidia-ctk's
                                             runtimes and whatever else), written atomically; prints `unchanged`
                                             or `changed`
  daemon_json.py set-text PATH KEY TEXT      the same with TEXT as a JSON string
  daemon_json.py replace-owned PATH KEY PREVIOUS WANTED
                                             KEY's list with the entries this program added last time (PREVIOUS,
                                             space-separated) replaced by WANTED, the host's own entries kept and
                                             an emptied list kept as [] (dockerd's reload changes only the keys
                                             the file has); prints `unchanged` or `changed`
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def has_nvidia_runtime(path: str) -> bool:
    with open(path) as f:
        config = json.load(f)
    return "nvidia" in config.get("runtimes", {})


def read_config(path: str) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path) as f:
            config = json.load(f)
    return config


def set_daemon_key(path: str, key: str, value: Any) -> str:
    config = read_config(path)
    if config.get(key) == value:
        return "unchanged"
    config[key] = value
    return write_config(path, config)


def replace_owned_entries(path: str, key: str, previous: list[str], wanted: list[str]) -> str:
    config = read_config(path)
    current = config.get(key, [])
    updated = [entry for entry in current if entry not in previous and entry not in wanted] + wanted
    if updated == current:
        return "unchanged"
    config[key] = updated
    return write_config(path, config)


def write_config(path: str, config: dict[str, Any]) -> str:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".roll-cluster.tmp"
    with open(tmp, "w") as f:
        json.dump(config, f, indent=4)
        f.write("\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return "changed"


def main() -> None:
    action, path = sys.argv[1], sys.argv[2]
    if action == "has-nvidia-runtime":
        sys.exit(0 if has_nvidia_runtime(path) else 1)
    if action in ("set", "set-text"):
        key, text = sys.argv[3], sys.argv[4]
        print(set_daemon_key(path, key, json.loads(text) if action == "set" else text))
        return
    if action == "replace-owned":
        key, previous, wanted = sys.argv[3], sys.argv[4], sys.argv[5]
        print(replace_owned_entries(path, key, previous.split(), wanted.split()))
        return
    sys.exit(f"daemon_json.py: unknown action {action}")


if __name__ == "__main__":
    main()
