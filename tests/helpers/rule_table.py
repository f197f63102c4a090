"""Applies the rule table of vLLM's scheduler checks (tests/engines/vllm_scheduler_rules.json, generated from vLLM's
own source by tools/vllm_scheduler_rules.py) to the values an engine is given.

A value the framework does not pass and the table does not default is unknown: the expressions are evaluated with
three-valued logic, so a rule is violated (True), passes (False) or is not decided (None) by what is known.
"""

from __future__ import annotations

import ast
import json
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parents[1] / "engines" / "vllm_scheduler_rules.json"


class Unknown:
    def __repr__(self) -> str:
        return "unknown"


UNKNOWN = Unknown()
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
            ast.Eq: operator.eq, ast.NotEq: operator.ne}
_ARITHMETIC = {ast.Mult: operator.mul, ast.Add: operator.add, ast.Sub: operator.sub}


def load() -> dict[str, Any]:
    table: dict[str, Any] = json.loads(TABLE.read_text())
    return table


def _eval(node: ast.AST, values: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return values.get(node.attr, UNKNOWN)
    if isinstance(node, ast.Name):
        return values.get(node.id, UNKNOWN)
    if isinstance(node, ast.BoolOp):
        parts = [_eval(v, values) for v in node.values]
        decisive = isinstance(node.op, ast.Or)  # True decides `or`, False decides `and`
        if any(p is not UNKNOWN and bool(p) is decisive for p in parts):
            return decisive
        return UNKNOWN if any(p is UNKNOWN for p in parts) else not decisive
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        operand = _eval(node.operand, values)
        return UNKNOWN if operand is UNKNOWN else not operand
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        left, right = _eval(node.left, values), _eval(node.comparators[0], values)
        if isinstance(node.ops[0], ast.Eq | ast.NotEq) and (left is None or right is None):
            return _COMPARE[type(node.ops[0])](left, right)
        if left is UNKNOWN or right is UNKNOWN or left is None or right is None:
            return UNKNOWN
        return _COMPARE[type(node.ops[0])](left, right)
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Is | ast.IsNot):
        left, right = _eval(node.left, values), _eval(node.comparators[0], values)
        if left is UNKNOWN:
            return UNKNOWN
        same = left is right
        return same if isinstance(node.ops[0], ast.Is) else not same
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left, right = _eval(node.left, values), _eval(node.right, values)
        return UNKNOWN if UNKNOWN in (left, right) else _ARITHMETIC[type(node.op)](left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("max", "min"):
        args = [_eval(a, values) for a in node.args]
        return UNKNOWN if any(a is UNKNOWN for a in args) else (max if node.func.id == "max" else min)(*args)
    return UNKNOWN  # anything else vLLM computes (a method call, a module constant): not decided here


def evaluate(expression: str, values: Mapping[str, Any]) -> Any:
    return _eval(ast.parse(expression, mode="eval").body, values)


@dataclass(frozen=True)
class Verdict:
    line: int
    message: str
    violated: bool | None  # None: not decided by the known values


def settled(version: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The scheduler's values: what the framework passes, else the class defaults of the table, then
    max_num_batched_tokens filled in as __post_init__ does (conditions read on the values before it)."""
    entry = load()[version]
    values = {name: default["value"] for name, default in entry["defaults"].items()}
    values.update({k: v for k, v in given.items() if v is not None or k not in values})
    values.setdefault("chunked_prefill_enabled", values.get("enable_chunked_prefill", UNKNOWN))
    before = dict(values)
    for fill in entry["fill_in"]:
        if evaluate(fill["when"], before) is True:
            values["max_num_batched_tokens"] = evaluate(fill["value"], values)
    return values


def verdicts(version: str, given: Mapping[str, Any]) -> list[Verdict]:
    values = settled(version, given)
    found = []
    for rule in load()[version]["rules"]:
        outcome = evaluate(rule["when"], values)
        found.append(Verdict(rule["line"], rule["message"], None if outcome is UNKNOWN else bool(outcome)))
    return found
