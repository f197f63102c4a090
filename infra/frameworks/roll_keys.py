"""ROLL's config keys, checked against the list generated from ROLL's own dataclasses at the pinned ref.

ROLL's launchers build their config with `dacite.from_dict(<Config>, ...)` (e.g. examples/start_agentic_pipeline.py
at 8eb27cc), which ignores unknown keys: a misspelt key is a setting that silently never takes effect, and a
value outside a `Literal[...]` fails only on the head, after provisioning. roll_config_keys.json is data,
regenerated from a ROLL checkout by tools/roll_config_keys.py; this module reads it.

What is allowed besides fields: `defaults` and `hydra` (Hydra's own), the keys a launcher reads itself
(`pipeline_cls`), and top-level keys that an interpolation `${name...}` refers to (YAML variables such as
`max_actions_per_traj` and `custom_env`, resolved before dacite sees the config). Below a field typed `dict`
or `Dict[str, Any]` (strategy_config, system_envs, tracker_kwargs, custom_envs, ...) anything goes.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("roll_config_keys.json")
HYDRA_KEYS = ("defaults", "hydra")
_INTERPOLATION = re.compile(r"\$\{([^${}]*)\}")


@dataclass(frozen=True)
class KeyProblem:
    key: str  # dotted YAML key
    message: str


class RollKeys:
    def __init__(self, data: Mapping[str, Any]):
        self.ref: str = data["ref"]
        self.launchers: dict[str, Any] = data["launchers"]
        self.classes: dict[str, Any] = data["classes"]

    def pipelines(self) -> list[str]:
        return sorted(self.launchers)

    def config_classes(self, pipeline: str) -> list[str]:
        entry = self.launchers.get(pipeline)
        return list(entry["classes"]) if entry else []

    def is_a(self, cls: str, ancestor_suffix: str) -> bool:
        """Whether cls is, or derives from, the class whose qualified name ends in ancestor_suffix."""
        pending, seen = [cls], set()
        while pending:
            name = pending.pop()
            if name in seen or name not in self.classes:
                continue
            seen.add(name)
            if name.endswith(ancestor_suffix):
                return True
            pending += self.classes[name]["bases"]
        return False

    def fields(self, cls: str) -> dict[str, Any]:
        """All fields of a dataclass, its bases' first (a subclass's field wins, as in dataclasses)."""
        entry = self.classes.get(cls)
        if entry is None:
            return {}
        merged: dict[str, Any] = {}
        for base in entry["bases"]:
            merged.update(self.fields(base))
        merged.update({name: {**spec, "owner": cls} for name, spec in entry["fields"].items()})
        return merged

    def where(self, cls: str) -> str:
        entry = self.classes.get(cls, {})
        return f"{cls.rsplit('.', 1)[-1]} ({entry.get('module', '?')}:{entry.get('line', '?')})"

    def check(self, config: Mapping[str, Any], pipeline: str) -> list[KeyProblem]:
        classes = self.config_classes(pipeline)
        if not classes:
            return [KeyProblem("", f"pipeline {pipeline!r} has no launcher at ROLL {self.ref[:7]}")]
        variables = referenced_top_level(config)
        extra = {*HYDRA_KEYS, *self.launchers[pipeline].get("reads", []), *variables}
        results = [self._walk(config, cls, "", extra) for cls in classes]
        return min(results, key=len)  # onpolicy_distill builds one of two classes: the one that fits

    def _walk(self, node: Mapping[str, Any], cls: str, prefix: str, extra: set[str] | frozenset[str]) -> list[
        KeyProblem
    ]:
        problems: list[KeyProblem] = []
        fields = self.fields(cls)
        for key, value in node.items():
            path = f"{prefix}{key}"
            spec = fields.get(str(key))
            if spec is None:
                if str(key) in extra:
                    continue
                near = difflib.get_close_matches(str(key), list(fields), n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                problems.append(KeyProblem(path, f"is not a field of ROLL's {self.where(cls)}{hint}"))
                continue
            problems += self._value(value, spec, path)
        for name, spec in fields.items():
            if spec.get("required") and name not in node:
                problems.append(KeyProblem(f"{prefix}{name}", f"is required by ROLL's {self.where(spec['owner'])}"))
        return problems

    def _value(self, value: Any, spec: Mapping[str, Any], path: str) -> list[KeyProblem]:
        if is_interpolation(value):
            return []
        choices = spec.get("choices")
        if choices is not None and not isinstance(value, (dict, list)) and value not in choices:
            shown = ", ".join(repr(c) for c in choices)
            return [KeyProblem(path, f"must be one of {shown} ({self.where(spec['owner'])}); got {value!r}")]
        targets = spec.get("classes") or []
        if not targets or not isinstance(value, Mapping):
            return []
        if spec.get("mapping"):
            cls = targets[0]
            if all(str(k) in self.fields(cls) for k in value):
                return self._walk(value, cls, path + ".", frozenset())  # Union[Dict[str, X], X] given as one X
            problems: list[KeyProblem] = []
            for name, child in value.items():
                if isinstance(child, Mapping):
                    problems += self._walk(child, cls, f"{path}.{name}.", frozenset())
            return problems
        candidates = [self._walk(value, cls, path + ".", frozenset()) for cls in targets]
        return min(candidates, key=len)


def is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def referenced_top_level(config: Any) -> set[str]:
    """First segments of every `${a.b}` in the tree (resolvers like `${oc.env:X}` name no key)."""
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, Mapping):
            for child in node.values():
                visit(child)
        elif isinstance(node, list):
            for child in node:
                visit(child)
        elif isinstance(node, str):
            for match in _INTERPOLATION.finditer(node):
                body = match.group(1).strip()
                if body and ":" not in body and not body.startswith("."):
                    found.add(re.split(r"[.\[]", body, maxsplit=1)[0])

    visit(config)
    return found


@cache
def load_roll_keys() -> RollKeys:
    return RollKeys(json.loads(DATA.read_text(encoding="utf-8")))
