#!/usr/bin/env python3
"""Generate the list of valid ROLL config keys from ROLL's own config dataclasses, without importing ROLL.

ROLL's launchers turn the composed YAML into a dataclass with `dacite.from_dict(<Config>, ...)`, which silently
ignores unknown keys (a typo in a key is a setting that never takes effect). This script reads the dataclasses
of a ROLL checkout with `ast` (importing ROLL needs torch) and writes, for every dataclass under `roll/`, its
fields (type as written, the dataclasses its type names, the choices of a Literal, whether a default exists),
and for every launcher `examples/start_<pipeline>_pipeline.py` the dataclass it builds and the YAML keys it
reads itself. infra/frameworks/roll_keys.py checks rendered configs against that data.

    python3 tools/roll_config_keys.py /path/to/ROLL > infra/frameworks/roll_config_keys.json

The checkout must be at the ref the program pins (infra/config/frameworks.py DEFAULT_ROLL_REF); the ref is recorded.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Names in annotations that carry no key structure of their own.
_WRAPPERS = {"Optional", "Union", "List", "list", "Dict", "dict", "Tuple", "tuple", "Sequence", "Mapping"}


@dataclass
class ModuleInfo:
    name: str  # roll.configs.model_args
    path: str  # relative to the checkout
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)  # local name -> qualified name
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, target] if target else base)


def is_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "dataclass":
            return True
    return False


def load_modules(root: Path) -> dict[str, ModuleInfo]:
    modules: dict[str, ModuleInfo] = {}
    for path in sorted((root / "roll").rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except SyntaxError:
            continue
        name = module_name(path, root)
        info = ModuleInfo(name, path.relative_to(root).as_posix(), tree)
        is_package = path.name == "__init__.py"
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                source = resolve_relative(name, is_package, node.level, node.module) if node.level else node.module
                for alias in node.names:
                    info.imports[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.ClassDef):
                info.classes[node.name] = node
        modules[name] = info
    return modules


class Resolver:
    """Qualified names of classes, following `from x import Y` chains through packages' __init__ files."""

    def __init__(self, modules: dict[str, ModuleInfo]):
        self.modules = modules

    def qualify(self, module: ModuleInfo, name: str) -> str | None:
        if name in module.classes:
            return f"{module.name}.{name}"
        target = module.imports.get(name)
        return self.follow(target) if target else None

    def follow(self, qualified: str, depth: int = 0) -> str | None:
        owner, _, name = qualified.rpartition(".")
        info = self.modules.get(owner)
        if info is None or depth > 8:
            return None
        if name in info.classes:
            return qualified
        target = info.imports.get(name)
        return self.follow(target, depth + 1) if target else None


def annotation_names(node: ast.expr | None) -> list[str]:
    """Every bare name in an annotation, e.g. Optional[Dict[str, RewardConfig]] -> [..., 'RewardConfig']."""
    if node is None:
        return []
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        try:
            return annotation_names(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return []
    return [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]


def literal_choices(node: ast.expr | None) -> list[Any] | None:
    """The values of a Literal[...] in the annotation (None when there is no Literal); `None` counts when the
    annotation is Optional or a Literal lists None."""
    if node is None:
        return None
    literal: list[Any] | None = None
    optional = False
    for sub in ast.walk(node):
        if isinstance(sub, ast.Subscript) and getattr(sub.value, "id", None) == "Literal":
            elements = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
            literal = [e.value for e in elements if isinstance(e, ast.Constant)]
        if isinstance(sub, ast.Subscript) and getattr(sub.value, "id", None) == "Optional":
            optional = True
    if literal is not None and optional and None not in literal:
        literal.append(None)
    return literal


def is_mapping_of(node: ast.expr | None) -> bool:
    """Dict[str, X] / dict: the keys under it are names the user picks, not fields."""
    if node is None:
        return False
    return any(
        isinstance(sub, ast.Subscript) and getattr(sub.value, "id", None) in ("Dict", "dict", "Mapping")
        for sub in ast.walk(node)
    )


def has_default(value: ast.expr | None) -> bool:
    if value is None:
        return False
    if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "field":
        keywords = {k.arg for k in value.keywords}
        return bool({"default", "default_factory"} & keywords)
    return True


def class_entry(resolver: Resolver, module: ModuleInfo, node: ast.ClassDef) -> dict[str, Any]:
    bases: list[str] = []
    open_bases: list[str] = []
    for base in node.bases:
        name = base.id if isinstance(base, ast.Name) else ast.unparse(base)
        qualified = resolver.qualify(module, name) if isinstance(base, ast.Name) else None
        if qualified:
            bases.append(qualified)
        elif name not in ("object",):
            open_bases.append(name)  # defined outside roll/: its fields are unknown here
    fields: dict[str, Any] = {}
    for stmt in node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        if getattr(stmt.annotation, "id", None) == "ClassVar" or "ClassVar" in ast.unparse(stmt.annotation):
            continue
        names = [n for n in annotation_names(stmt.annotation) if n not in _WRAPPERS]
        refs = sorted({q for n in names if (q := resolver.qualify(module, n))})
        entry: dict[str, Any] = {
            "type": ast.unparse(stmt.annotation),
            "required": not has_default(stmt.value),
            "line": stmt.lineno,
        }
        if refs:
            entry["classes"] = refs
            if is_mapping_of(stmt.annotation):
                entry["mapping"] = True  # Dict[str, Config]: user-chosen names, each a Config
        choices = literal_choices(stmt.annotation)
        if choices is not None:
            entry["choices"] = choices
        fields[stmt.target.id] = entry
    result: dict[str, Any] = {"module": module.path, "line": node.lineno, "bases": bases, "fields": fields}
    if open_bases:
        result["open_bases"] = open_bases
    return result


def launcher_entry(resolver: Resolver, modules: dict[str, ModuleInfo], path: Path) -> dict[str, Any]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imports: dict[str, str] = {}
    for statement in tree.body:
        if isinstance(statement, ast.ImportFrom) and statement.module:
            for alias in statement.names:
                imports[alias.asname or alias.name] = f"{statement.module}.{alias.name}"
    classes: list[str] = []
    read_keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "data_class" and isinstance(keyword.value, ast.Name):
                    target = imports.get(keyword.value.id)
                    qualified = resolver.follow(target) if target else None
                    if qualified and qualified not in classes:
                        classes.append(qualified)
            # getattr(cfg, "pipeline_cls", ...): a key the launcher reads from the composed config itself.
            if getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2:
                owner, key = node.args[0], node.args[1]
                if isinstance(owner, ast.Name) and owner.id == "cfg" and isinstance(key, ast.Constant):
                    read_keys.add(str(key.value))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cfg":
            read_keys.add(node.attr)
    return {"file": f"examples/{path.name}", "classes": classes, "reads": sorted(read_keys)}


def git_head(root: Path) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def generate(root: Path, ref: str | None) -> dict[str, Any]:
    modules = load_modules(root)
    resolver = Resolver(modules)
    classes: dict[str, Any] = {}
    for info in modules.values():
        for node in info.classes.values():
            if is_dataclass(node):
                classes[f"{info.name}.{node.name}"] = class_entry(resolver, info, node)
    launchers: dict[str, Any] = {}
    for path in sorted((root / "examples").glob("start_*_pipeline.py")):
        pipeline = path.name[len("start_") : -len("_pipeline.py")]
        launchers[pipeline] = launcher_entry(resolver, modules, path)
    # Only dataclasses reachable from a launcher's config are kept: the rest are not configuration.
    reachable: set[str] = set()
    pending = [c for entry in launchers.values() for c in entry["classes"]]
    while pending:
        name = pending.pop()
        if name in reachable or name not in classes:
            continue
        reachable.add(name)
        pending += classes[name]["bases"]
        for spec in classes[name]["fields"].values():
            pending += spec.get("classes", [])
    return {
        "generator": "tools/roll_config_keys.py",
        "repo": "https://github.com/alibaba/ROLL",
        "ref": ref or git_head(root),
        "launchers": launchers,
        "classes": {name: classes[name] for name in sorted(reachable)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("checkout", type=Path, help="a ROLL checkout (its roll/ and examples/ folders)")
    parser.add_argument("--ref", help="the ref the checkout is at (default: its git HEAD)")
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    args = parser.parse_args(argv)
    if not (args.checkout / "roll").is_dir() or not (args.checkout / "examples").is_dir():
        print(f"roll_config_keys: {args.checkout} is not a ROLL checkout (no roll/ and examples/)", file=sys.stderr)
        return 2
    data = generate(args.checkout, args.ref)
    if not data["ref"]:
        print("roll_config_keys: the checkout's ref is unknown (no git); pass --ref", file=sys.stderr)
        return 2
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if args.out:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
