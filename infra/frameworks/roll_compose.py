"""A ROLL example with its Hydra `defaults` resolved into one self-contained mapping, as Hydra's compose() does.

ROLL's launchers call `compose(config_name=...)` on a file under examples/ (roll.md 2.1); the agentic examples
start with `defaults: [../config/traj_envs@_here_]`, which pulls the env definitions their `${...}` interpolations
need (issue #132: without it, InterpolationKeyError). The generated YAML carries the result of that merge, so it
no longer depends on where it is written or on other files of the checkout.

What is supported is what ROLL's examples use (Hydra 1.3 semantics, https://hydra.cc/docs/advanced/defaults_list/):
string entries `path[@package]` and `{group: option}` entries, relative or absolute (both from the primary
config's folder), packages `_here_`, `_global_`, a dotted package, or none (the entry's group); `_self_`
anywhere, implicitly last; nested defaults in the included files; `optional` entries (skipped when missing).
Entries for Hydra's own groups (`hydra/...`) and `override` entries are kept in a `defaults` list of the result.
Merging follows OmegaConf: mappings merge key by key, anything else replaces. Interpolations stay as written;
the launcher resolves them.
"""

from __future__ import annotations

import copy
import posixpath
import re
from collections.abc import Callable, Mapping
from typing import Any

import yaml

HYDRA_GROUP = re.compile(r"^(?:override\s+|optional\s+)*hydra(?:/|$|@)")
MAX_DEPTH = 8


class ComposeError(Exception):
    """The defaults cannot be resolved; the message names the file and the entry."""


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists, scalars, null) replaces (OmegaConf.merge)."""
    merged = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def load_yaml(text: str, name: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ComposeError(f"{name} is not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ComposeError(f"{name} must be a YAML mapping; got {type(data).__name__}")
    return data


def _place(content: dict[str, Any], package: str) -> dict[str, Any]:
    if package in ("", "_here_", "_global_"):
        return content
    for part in reversed(package.split(".")):
        content = {part: content}
    return content


def _entry(entry: Any, name: str) -> tuple[str, str, bool] | None:
    """(file path without .yaml, package, optional) of an entry that names a file; None for one kept as is."""
    if isinstance(entry, str):
        if entry == "_self_" or HYDRA_GROUP.match(entry):
            return None
        words = entry.split()
        if words[0] == "override":
            return None
        optional = words[0] == "optional"
        path, at, package = words[-1].partition("@")
        group = posixpath.dirname(path.lstrip("/"))
        return path, package if at else group.replace("/", "."), optional
    if isinstance(entry, dict) and len(entry) == 1:
        ((key, option),) = entry.items()
        if HYDRA_GROUP.match(str(key)) or str(key).split()[0] == "override":
            return None
        words = str(key).split()
        optional = words[0] == "optional"
        group, at, package = words[-1].partition("@")
        if option is None:
            return None  # `group: null` selects nothing
        if not isinstance(option, str):
            raise ComposeError(f"{name}: defaults entry {entry!r} must select one option by name")
        return f"{group}/{option}", package if at else group.strip("/").replace("/", "."), optional
    raise ComposeError(f"{name}: defaults entry {entry!r} is not a form Hydra reads")


def compose(read: Callable[[str], str | None], primary: str) -> tuple[dict[str, Any], list[str]]:
    """The primary config (a path under examples/) with its defaults merged in, and the files that were read
    (primary first). `read(path)` gives the text of examples/<path>, None when it does not exist."""
    root = posixpath.dirname(primary)
    used: list[str] = []

    def load(path: str, depth: int) -> tuple[dict[str, Any], list[Any]]:
        if depth > MAX_DEPTH:
            raise ComposeError(f"defaults nest deeper than {MAX_DEPTH} levels at {path}")
        text = read(path)
        if text is None:
            raise FileNotFoundError(path)
        used.append(path)
        config = load_yaml(text, f"examples/{path}")
        defaults = config.pop("defaults", [])
        if defaults is None:
            defaults = []
        if not isinstance(defaults, list):
            raise ComposeError(f"examples/{path}: `defaults` must be a list; got {defaults!r}")
        kept: list[Any] = []
        merged: dict[str, Any] = {}
        entries = defaults if "_self_" in defaults else [*defaults, "_self_"]
        for entry in entries:
            if entry == "_self_":
                merged = deep_merge(merged, config)
                continue
            parsed = _entry(entry, f"examples/{path}")
            if parsed is None:
                kept.append(entry)
                continue
            target, package, optional = parsed
            # Relative and absolute entries both start at the primary config's folder (Hydra's config root).
            file = posixpath.normpath(posixpath.join(root, target.lstrip("/"))) + ".yaml"
            if file.startswith("../"):
                raise ComposeError(f"examples/{path}: defaults entry {entry!r} points outside examples/")
            try:
                content, nested_kept = load(file, depth + 1)
            except FileNotFoundError:
                if optional:
                    continue
                raise ComposeError(
                    f"examples/{path}: defaults entry {entry!r} names examples/{file}, which does not exist"
                ) from None
            kept += nested_kept
            merged = deep_merge(merged, _place(content, package))
        return merged, kept

    try:
        config, kept = load(primary, 0)
    except FileNotFoundError:
        raise
    if kept:
        config = {"defaults": [*kept, "_self_"], **config}
    return config, used
