"""The stack files (Pulumi.<stack>.yaml) as the offline plan reads them: the `config:` block, checked for its shape
without a traceback, and the `secure:` values `pulumi config set --secret` writes, which the plan holds as set
secrets without decrypting them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from infra import runmode
from infra.config import ConfigError


def read_stack_config(project: Path, stack: str) -> dict[str, Any]:
    """The `config:` block of Pulumi.<stack>.yaml in the project directory."""
    path = project / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no stack file {path.name}; shipped: {', '.join(stacks_in(project))}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        # The file and line, not a traceback (the Pulumi CLI reports its own parse error the same way).
        mark = getattr(error, "problem_mark", None)
        where = f"{path.name}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path.name
        raise ConfigError([f"{where}: not valid YAML: {getattr(error, 'problem', None) or error}"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{path.name}: must be a mapping with a `config:` section (as `pulumi config set` writes "
                           f"it); got {yaml_kind(data)}"])
    config = data.get("config") or {}
    if not isinstance(config, dict):
        raise ConfigError([f"{path.name}: config: must be a mapping of `namespace:key: value` lines (e.g. "
                           f"`roll-cluster:nodes:`); got {yaml_kind(config)}"])
    return dict(config)


def stacks_in(project: Path) -> list[str]:
    return sorted(p.name.split(".")[1] for p in project.glob("Pulumi.*.yaml"))


def yaml_kind(value: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(value), type(value).__name__)


def secure_values(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The stack file's `secure:` values (what `pulumi config set --secret` writes: `key: {secure: <ciphertext>}`,
    also inside a section set with --path) replaced by a placeholder, and the keys that hold one: the offline plan
    cannot decrypt them and never needs to. Pulumi holds such a key as a secret as a whole (the runtime's secret
    keys are top-level keys)."""

    def replace(value: Any) -> tuple[Any, bool]:
        if isinstance(value, Mapping):
            if set(value) == {"secure"} and isinstance(value["secure"], str):
                return runmode.UNDECRYPTED, True  # what validation reads as "set, not read offline"
            found = False
            replaced = {}
            for key, item in value.items():
                replaced[key], held = replace(item)
                found = found or held
            return replaced, found
        if isinstance(value, list):
            items = [replace(item) for item in value]
            return [item for item, _ in items], any(held for _, held in items)
        return value, False

    plain: dict[str, Any] = {}
    secret: list[str] = []
    for key, value in values.items():
        plain[key], held = replace(value)
        if held:
            secret.append(key)
    return plain, secret
