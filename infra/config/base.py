"""What every section shares: the `Section` base model, the project's key names, and the problems validators raise.

A validator raises `_Problems` (or `_problem(...)`), each problem at a key path relative to where pydantic reports
it; infra/config/cluster.py turns them into `ConfigError`'s lines.
"""

from __future__ import annotations

import ipaddress
import json
import re
import types
import typing
from typing import Any

from pulumi.errors import RunError
from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator
from pydantic.alias_generators import to_camel

PROJECT = "roll-cluster"
SECTIONS = ("nodes", "access", "container", "ray", "training", "storage")
SECRETS = ("wandbApiKey", "hfToken", "registryPassword")

KeyPath = tuple[int | str, ...]


class ConfigError(RunError, ValueError):
    """Invalid stack configuration; every line names a key path.

    A pulumi RunError: the Pulumi CLI shows its message and no traceback (pulumi/errors.py, RunError: "a clean
    exit rather than the usual verbose unhandled error logic")."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid stack configuration:\n  " + "\n  ".join(problems))


class _Problems(ValueError):
    """Raised by validators: problems, each at a key path relative to where pydantic reports the error (the field
    for a field validator, the model for a model validator). A `..` part steps up one level, so that a field
    validator, which sees the fields validated before it, can report a cross-field rule on the key at fault."""

    def __init__(self, *problems: tuple[KeyPath, str]):
        self.problems = list(problems)
        super().__init__("; ".join(message for _, message in problems))


def _problem(message: str, *path: int | str) -> _Problems:
    return _Problems((path, message))


def _shown(value: Any, limit: int = 100) -> str:
    """A given value as the user wrote it in the stack file (JSON: true, null, "text"), cut if long."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


class Section(BaseModel):
    # allow_inf_nan=False: `inf`, "NaN" and 1e400 are no count, size or price.
    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=False, frozen=True, validate_default=True,
        allow_inf_nan=False,
    )

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads `true` as 1 for an int field; text such as "2" (what `pulumi config set --path`
        # stores) is still read as its number.
        if isinstance(value, bool) and info.field_name is not None:
            annotation = cls.model_fields[info.field_name].annotation
            kinds = set(typing.get_args(annotation)) if isinstance(annotation, types.UnionType) else {annotation}
            if kinds & {int, float} and bool not in kinds:
                raise _problem(f"must be a number, not true or false; got {_shown(value)}")
        return value


_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
