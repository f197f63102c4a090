"""One name per concept: no top-level class or function name is defined in two modules of the product (what the
program, its plan and its tools are made of: components/, infra/, devtools/, companion/, __main__.py, dev.py), so a
name found in a traceback, a grep or a review leads to one definition."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("components", "infra", "devtools", "companion")
# `main`: the entry point of a module run as a program (`python -m devtools.plan`, a node's stop_instances.py), the
# one name Python's convention gives every such module.
ENTRY_POINT = "main"


def product_modules() -> list[Path]:
    found = [p for folder in PRODUCT for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts]
    return sorted([*found, REPO / "__main__.py", REPO / "dev.py"])


def collisions(sources: dict[str, str]) -> dict[str, list[str]]:
    """Top-level class and function names defined in more than one of `sources` (module name -> its text)."""
    defined: dict[str, list[str]] = defaultdict(list)
    for module, text in sources.items():
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name != ENTRY_POINT:
                defined[node.name].append(module)
    return {name: modules for name, modules in sorted(defined.items()) if len(modules) > 1}


def test_no_top_level_name_is_defined_in_two_modules_of_the_product() -> None:
    sources = {str(p.relative_to(REPO)): p.read_text() for p in product_modules()}
    assert len(sources) > 50
    assert not (found := collisions(sources)), f"names defined in two modules: {found}"


def test_the_check_finds_a_class_or_function_defined_twice_and_nothing_else() -> None:
    sources = {
        "a.py": "class JobSpec:\n    def c(self): ...\ndef _helper(): ...\ndef main(): ...\nX = 1\n",
        "b.py": "def JobSpec(): ...\ndef c(): ...\ndef main(): ...\nX = 2\n",
        "c.py": "async def _helper(): ...\n",
    }
    assert collisions(sources) == {"JobSpec": ["a.py", "b.py"], "_helper": ["a.py", "c.py"]}
