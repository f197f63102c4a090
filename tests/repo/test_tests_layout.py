"""tests/ mirrors the code: unit tests sit in the folder named after their package (tests/infra/config/ for
infra/config/, ...), each tier has its own folder, and helper modules live in tests/helpers/ alone. A test added at
the top of tests/, a helper beside the tests, or a folder that mirrors no package fails here (docs/testing.md,
"Where a test goes")."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Folders of tests/ that are tiers or data, not packages of the product.
TIERS = {"offline", "scripts", "contracts", "engines", "e2e", "repo"}
HELPERS = "helpers"
DATA = {"fixtures", "standins", "__pycache__"}
# Top-level folders of the product a unit-test folder may mirror.
PACKAGES = {"infra", "components", "devtools", "companion", "bench", "tools"}


def python_files(root: Path) -> list[Path]:
    tests = root / "tests"
    return sorted(p for p in tests.rglob("*.py") if not DATA & set(p.relative_to(tests).parts[:-1]))


def is_test_module(path: Path) -> bool:
    return path.name.startswith("test_") or path.name == "conftest.py"


def misplaced(root: Path) -> list[str]:
    tests = root / "tests"
    found = []
    for path in python_files(root):
        relative = path.relative_to(tests)
        top = relative.parts[0]
        if len(relative.parts) == 1:
            if path.name != "conftest.py":
                found.append(f"tests/{relative}: a module at the top of tests/ (tests go in a tier or package folder)")
        elif top == HELPERS:
            if is_test_module(path):
                found.append(f"tests/{relative}: a test module among the helpers")
        elif not is_test_module(path):
            found.append(f"tests/{relative}: a helper module outside tests/helpers/")
        elif top not in TIERS:
            mirrored = root.joinpath(*relative.parts[:-1])
            if top not in PACKAGES or not mirrored.is_dir():
                found.append(f"tests/{relative}: tests/{'/'.join(relative.parts[:-1])}/ mirrors no package of the code")
    return found


def test_every_test_sits_in_its_tier_or_package_folder_and_helpers_in_one_place() -> None:
    assert misplaced(ROOT) == []


def test_test_module_names_are_unique() -> None:
    """pytest imports test modules by their name (no __init__.py): two of the same name would clash."""
    names: dict[str, list[str]] = {}
    for path in python_files(ROOT):
        if path.name != "conftest.py":
            names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in names.items() if len(paths) > 1} == {}


def test_a_test_module_imported_from_another_folder_is_on_the_pythonpath() -> None:
    """Helpers, and the few test modules whose names other folders' tests import, are found through pytest's
    `pythonpath` (pyproject.toml), so that a single file runs alone as in the whole suite."""
    pytest_options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    pythonpath = set(pytest_options["pythonpath"])
    modules = {path.stem: path for path in python_files(ROOT)}
    unreachable = set()
    for path in python_files(ROOT):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                imported = modules.get(name)
                if imported is None or imported.parent == path.parent:
                    continue
                if str(imported.parent.relative_to(ROOT)) not in pythonpath:
                    unreachable.add(f"{path.relative_to(ROOT)} imports {imported.relative_to(ROOT)}")
    assert sorted(unreachable) == []


def test_the_layout_check_catches_tests_at_the_old_places(tmp_path: Path) -> None:
    for name in ("tests/test_new_feature.py", "tests/new_helpers.py", "tests/offline/standin.py",
                 "tests/helpers/test_helper.py", "tests/infra/nowhere/test_x.py", "tests/offline/test_fine.py",
                 "tests/infra/config/test_fine_too.py", "tests/conftest.py", "infra/config/__init__.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    assert [entry.split(":")[0] for entry in misplaced(tmp_path)] == [
        "tests/helpers/test_helper.py",
        "tests/infra/nowhere/test_x.py",
        "tests/new_helpers.py",
        "tests/offline/standin.py",
        "tests/test_new_feature.py",
    ]
