"""No module-level state carries data between the program, the plan and the tests: what one run records (its
steps, notes, libraries, whether the configuration is a secret) lives in its RunContext (infra/node/steps.py),
made by __main__.py and passed explicitly."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# The program's modules and the tools that run it; __main__.py's own namespace is the run's (runpy reads it back).
FOLDERS = ("components", "infra", "devtools", "companion", "bench")
MUTATORS = {"append", "extend", "update", "setdefault", "clear", "pop", "add", "insert", "remove", "__setitem__"}
# Module-level containers that are not side channels, and why.
ALLOWED = {
    ("infra/frameworks/roll_sources.py", "_FETCHERS"),  # a memo of fetched examples per (repo, ref): same answer
    # A program of its own on the head (the readiness gate's loop), never imported: its state is its process's.
    ("infra/scripts/ray_ready.py", "stopping"),
}


def modules() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((REPO / folder).rglob("*.py")) if "__pycache__" not in p.parts]


def _empty_container(node: ast.expr | None) -> bool:
    if isinstance(node, ast.List | ast.Dict | ast.Set):
        return not (node.elts if isinstance(node, ast.List | ast.Set) else node.keys)
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("list", "dict", "set") \
        and not node.args and not node.keywords


def accumulators(text: str) -> list[str]:
    """Module-level names bound to an empty list, dict or set: only useful as something filled later."""
    found = []
    for node in ast.parse(text).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if _empty_container(value):
            found += [t.id for t in targets if isinstance(t, ast.Name)]
    return found


def writes_to_other_modules(text: str) -> list[str]:
    """Writes into another module's names: `module.NAME[...] = ...`, `module.NAME = ...`, `module.NAME.update(...)`."""
    tree = ast.parse(text)
    aliases = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    aliases |= {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}

    def module_global(node: ast.expr) -> bool:
        return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases \
            and node.attr.isupper()

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if module_global(target) or (isinstance(target, ast.Subscript) and module_global(target.value)):
                    found.append(f"{node.lineno}: {ast.unparse(target)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and module_global(node.func.value):
            found.append(f"{node.lineno}: {ast.unparse(node.func)}")
    return found


def test_no_module_keeps_an_accumulator() -> None:
    found = {(str(p.relative_to(REPO)), name) for p in modules() for name in accumulators(p.read_text())}
    assert found - ALLOWED == set()


def test_no_module_writes_into_another_modules_state() -> None:
    found = [f"{p.relative_to(REPO)}:{hit}" for p in [*modules(), REPO / "__main__.py"]
             for hit in writes_to_other_modules(p.read_text())]
    assert found == []


def test_the_checkers_see_the_old_side_channels() -> None:
    assert accumulators("NOTES: dict[str, Any] = {}\nRECORDED = []\nSECRET: dict[str, bool] = {'set': False}") == [
        "NOTES", "RECORDED"]
    old = ("from infra.node import remote, steps\n"
           "remote.SECRET_CONFIG['set'] = True\nsteps.NOTES.update(a=1)\nsteps.RECORDED.append(1)\n")
    assert len(writes_to_other_modules(old)) == 3
    assert writes_to_other_modules("from infra.node import steps\nrun = steps.RunContext()\nrun.notes.update(a=1)\n") \
        == []
