"""Secrets as Pulumi's mocks hand them over: a wrapper around the value, seen through or removed here."""

from __future__ import annotations

from typing import Any

SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"


def reveal(value: Any) -> Any:
    """The plain value of a secret-wrapped mock input."""
    if isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG:
        return value["value"]
    return value


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG


def unwrap(value: Any) -> Any:
    """Secret wrappers removed, recursively (for displaying inputs)."""
    value = reveal(value)
    if isinstance(value, dict):
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [unwrap(v) for v in value]
    return value
