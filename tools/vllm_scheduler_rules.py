#!/usr/bin/env python3
"""Generate the rule table of vLLM's scheduler checks from vLLM's own source, for the engines whose package cannot
run in the tests (tests/engines/vllm_scheduler_rules.json; applied by tests/engines/test_engine_rule_tables.py).

    python3 tools/vllm_scheduler_rules.py vllm-0.7.3-cp38-abi3-manylinux1_x86_64.whl --version 0.7.3 \\
        --used-by "MindSpeed-RL 62e9928 (vllm-ascend 0.7.3)" --write tests/engines/vllm_scheduler_rules.json

The input is a vLLM wheel (e.g. from `pip download vllm==X --no-deps`) or an unpacked `vllm` package directory.
From `class SchedulerConfig` (vllm/config.py up to 0.8, vllm/config/scheduler.py later) it takes, as text of
vLLM's own expressions with their file and line:

- `rules`: every `raise` of the method that verifies the scheduler's arguments (`_verify_args`, or
  `verify_max_model_len` from 0.11), with the conjunction of the `if` conditions around it;
- `defaults`: the class's constant field defaults (e.g. `enable_chunked_prefill: bool = True`);
- `fill_in`: how `__post_init__` fills `max_num_batched_tokens` when it is None (each assignment with the
  conditions around it, in source order).

A parameter `max_model_len` of the verifying method is written `self.max_model_len`, so that every expression reads
one namespace. Existing versions in the output file are kept; the one generated replaces its entry.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

CANDIDATES = ("vllm/config.py", "vllm/config/scheduler.py")
VERIFY_METHODS = ("_verify_args", "verify_max_model_len")
FILLED = "max_num_batched_tokens"


class _SelfMaxModelLen(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == "max_model_len":
            return ast.copy_location(ast.Attribute(ast.Name("self", ast.Load()), "max_model_len", ast.Load()), node)
        return node


def _text(node: ast.AST) -> str:
    return ast.unparse(_SelfMaxModelLen().visit(ast.parse(ast.unparse(node), mode="eval")).body)


def _negate(condition: str) -> str:
    return f"not ({condition})"


def _walk(statements: list[ast.stmt], path: list[str], visit: Any) -> None:
    """Calls visit(statement, conditions) for every statement, nested ifs flattened into their conditions."""
    for statement in statements:
        if isinstance(statement, ast.If):
            condition = _text(statement.test)
            _walk(statement.body, [*path, condition], visit)
            _walk(statement.orelse, [*path, _negate(condition)], visit)
        else:
            visit(statement, path)


def _conjunction(path: list[str]) -> str:
    return " and ".join(f"({c})" for c in path) if path else "True"


def _constant_default(value: ast.expr | None) -> ast.Constant | None:
    """`x: T = <constant>` or `x: T = field(default=<constant>)` (pydantic's Field alike)."""
    if isinstance(value, ast.Constant):
        return value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("field", "Field"):
        for keyword in value.keywords:
            if keyword.arg == "default" and isinstance(keyword.value, ast.Constant):
                return keyword.value
    return None


def read_sources(source: Path) -> dict[str, str]:
    if source.suffix == ".whl":
        with zipfile.ZipFile(source) as wheel:
            names = set(wheel.namelist())
            return {name: wheel.read(name).decode() for name in CANDIDATES if name in names}
    root = source.parent if source.name == "vllm" else source
    return {name: (root / name).read_text() for name in CANDIDATES if (root / name).is_file()}


def scheduler_table(sources: dict[str, str]) -> dict[str, Any]:
    for path, text in sources.items():
        tree = ast.parse(text)
        found = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "SchedulerConfig"), None)
        if found is None:
            continue
        methods = {n.name: n for n in found.body if isinstance(n, ast.FunctionDef)}
        verify = next((methods[name] for name in VERIFY_METHODS if name in methods), None)
        if verify is None:
            raise SystemExit(f"{path}: SchedulerConfig has none of {VERIFY_METHODS}")
        rules: list[dict[str, Any]] = []

        def on_verify(statement: ast.stmt, path_conditions: list[str], rules: list[dict[str, Any]] = rules) -> None:
            if isinstance(statement, ast.Raise) and isinstance(statement.exc, ast.Call):
                message = statement.exc.args[0] if statement.exc.args else ast.Constant("")
                rules.append({
                    "when": _conjunction(path_conditions),
                    "raises": ast.unparse(statement.exc.func),
                    "message": _text(message),
                    "line": statement.lineno,
                })

        _walk(verify.body, [], on_verify)
        defaults = {}
        for item in found.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                constant = _constant_default(item.value)
                if constant is not None:
                    defaults[item.target.id] = {"value": constant.value, "line": item.lineno}
        fill_in: list[dict[str, Any]] = []
        post_init = methods.get("__post_init__")
        if post_init is not None:
            def on_post_init(statement: ast.stmt, path_conditions: list[str],
                             fill_in: list[dict[str, Any]] = fill_in) -> None:
                if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                        and ast.unparse(statement.targets[0]) == f"self.{FILLED}"
                        and any(f"self.{FILLED} is None" in c for c in path_conditions)):
                    fill_in.append({"when": _conjunction(path_conditions), "value": _text(statement.value),
                                    "line": statement.lineno})

            _walk(post_init.body, [], on_post_init)
        return {"source": path, "method": verify.name, "rules": rules, "defaults": defaults, "fill_in": fill_in}
    raise SystemExit(f"no SchedulerConfig in {', '.join(sources) or 'any of ' + ', '.join(CANDIDATES)}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path, help="a vLLM wheel or an unpacked vllm package directory")
    parser.add_argument("--version", required=True, help="the vLLM version the source is (e.g. 0.7.3)")
    parser.add_argument("--used-by", required=True, help="which shipped stack's image runs this version")
    parser.add_argument("--write", type=Path, required=True, help="the JSON table to update")
    args = parser.parse_args(argv)
    table = json.loads(args.write.read_text()) if args.write.exists() else {}
    entry = scheduler_table(read_sources(args.source))
    table[args.version] = {"used_by": args.used_by, **entry}
    args.write.write_text(json.dumps(dict(sorted(table.items())), indent=1, sort_keys=False) + "\n")
    print(f"{args.write}: vLLM {args.version}: {len(entry['rules'])} rules from {entry['source']}:{entry['method']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
