"""The layout the design card names: components/ registers the resources, infra/ computes and registers nothing,
devtools/ is never imported by the program, and no module is a grab-bag."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROVIDER_MODULES = {"pulumi_alicloud": "alicloud", "pulumi_command": "command", "pulumi_docker": "docker"}
RESOURCE_BASES = {"ComponentResource", "CustomResource", "Resource"}
COMPONENTS = {"Network", "GpuNode", "SharedStorage", "NodeBootstrap", "RayCluster", "TrainingJob", "Autostop",
              "AutostopRole"}
CONFIG_BEFORE_THE_SPLIT = 1813  # lines of infra/config.py before it was split by section


def modules(folder: str) -> Iterator[Path]:
    yield from sorted(p for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def provider_aliases(tree: ast.Module) -> set[str]:
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name in PROVIDER_MODULES}
    return aliases


def registrations(path: Path) -> list[str]:
    """What a module registers: provider resource constructors it calls (`alicloud.ecs.Instance(...)`; invokes are
    lower-case functions and `...Args` are inputs) and ComponentResource classes it defines."""
    tree = ast.parse(path.read_text())
    aliases = provider_aliases(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            chain: list[str] = []
            target: ast.expr = node.func
            while isinstance(target, ast.Attribute):
                chain.append(target.attr)
                target = target.value
            name = node.func.attr
            if isinstance(target, ast.Name) and target.id in aliases and name[:1].isupper() \
                    and not name.endswith("Args"):
                found.append(".".join([target.id, *reversed(chain)]))
        if isinstance(node, ast.ClassDef):
            bases = {b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases}
            if bases & RESOURCE_BASES:
                found.append(f"class {node.name}")
    return found


def component_classes(path: Path) -> set[str]:
    return {r.removeprefix("class ") for r in registrations(path) if r.startswith("class ")}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_module_under_infra_registers_a_resource() -> None:
    registering = {str(p.relative_to(REPO)): registrations(p) for p in modules("infra") if registrations(p)}
    assert registering == {}


def test_the_checker_sees_a_registration_where_there_is_one() -> None:
    # Guards the test above against passing because it can see nothing.
    assert "alicloud.ecs.Instance" in registrations(REPO / "components" / "alibaba" / "gpu_node.py")
    assert "command.local.Command" in registrations(REPO / "components" / "known_hosts.py")
    assert "class GpuNode" in registrations(REPO / "components" / "alibaba" / "gpu_node.py")


def test_components_holds_exactly_the_component_resources() -> None:
    everywhere = {c for folder in ("infra", "components", "devtools") for p in modules(folder)
                  for c in component_classes(p)} | {c for c in component_classes(REPO / "__main__.py")}
    in_components = {c for p in modules("components") for c in component_classes(p)}
    assert in_components == COMPONENTS == everywhere


def test_every_module_of_components_registers_or_composes_resources() -> None:
    idle = [str(p.relative_to(REPO)) for p in modules("components") if p.name != "__init__.py"
            and not registrations(p) and not any(m.startswith("components") for m in imported_modules(p))]
    assert idle == []


def test_the_program_never_imports_the_development_tools() -> None:
    program = [*modules("infra"), *modules("components"), REPO / "__main__.py"]
    importing = [str(p.relative_to(REPO)) for p in program
                 if any(m == "devtools" or m.startswith("devtools.") for m in imported_modules(p))]
    assert importing == []


def test_infra_never_imports_components_at_run_time() -> None:
    # infra/ is tested without Pulumi mocks; only type annotations may name a component.
    offenders = []
    for path in modules("infra"):
        tree = ast.parse(path.read_text())
        guarded = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("components") \
                    and id(node) not in guarded:
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == []


def test_no_module_is_a_grab_bag() -> None:
    python = [*modules("infra"), *modules("components"), *modules("devtools")]
    largest = max(python, key=lambda p: len(p.read_text().splitlines()))
    assert len(largest.read_text().splitlines()) < CONFIG_BEFORE_THE_SPLIT * 0.4, largest
    undocumented = [str(p.relative_to(REPO)) for p in python
                    if p.read_text().strip() and not ast.get_docstring(ast.parse(p.read_text()))]
    assert undocumented == []
