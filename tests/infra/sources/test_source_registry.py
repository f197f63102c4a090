"""Node sources: the registry alone adds one (a test-only source runs the offline plan), nothing outside the
sources' folders and the registry asks a source's name, and docs/adding-a-source.md lists the files a new source
touches."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from components import node_source
from devtools import plan
from devtools.offline_cloud import run_program
from infra import sources
from infra.config import ClusterConfig
from infra.node.ssh_access import LoginKey
from infra.sources.base import Capabilities, ClusterFacts, Machine, NodeSource, ProvisionedCluster, SourceEntry

REPO = Path(__file__).resolve().parents[3]
DUMMY = "dummy"
# A cloud that can do nothing optional: no region, firewall, pause, spot, storage or permissions of its own.
DUMMY_CAPABILITIES = Capabilities(
    existing_machines=False, instance_types=False, region=False, firewall=False, pause=False,
    autostop_stops_machines=False, spot=False, managed_shared_storage=False, user_shared_storage=False,
    permissions=False, accelerators=("nvidia",),
)


class DummySource:
    """Two machines of 4 GPUs each at documentation addresses; registers nothing."""

    name = DUMMY

    def __init__(self, config: ClusterConfig, stack: str) -> None:
        self.config = config
        self.stack = stack

    def facts(self) -> ClusterFacts:
        return ClusterFacts(accelerator="nvidia", accelerators_per_node=4, accelerator_model="NVIDIA L20", bf16=True,
                            machine_type="dummy.4gpu", location="dummy-zone")

    def provision(self) -> ProvisionedCluster:
        machines = [Machine(name=f"node-{rank}", rank=rank, ssh_host=f"198.51.100.{rank + 10}",
                            private_ip=f"10.9.0.{rank + 10}", identity=f"dummy-{rank}")
                    for rank in range(self.config.nodes.count)]
        return ProvisionedCluster(machines=machines, outputs={"dummyMachines": [m.ssh_host for m in machines]})


def make_dummy(config: ClusterConfig, stack: str, login: LoginKey) -> DummySource:
    del login
    return DummySource(config, stack)


@pytest.fixture
def dummy_source(monkeypatch: pytest.MonkeyPatch) -> SourceEntry:
    entry = SourceEntry(DUMMY, DUMMY_CAPABILITIES, make_dummy)
    monkeypatch.setitem(sources.SOURCES, DUMMY, entry)
    return entry


def dummy_run() -> Any:
    return run_program("hosts", replace_config={
        "roll-cluster:nodes": {"source": DUMMY, "count": 2},
        "roll-cluster:storage": {},
    })


def test_a_source_added_through_the_registry_alone_runs_the_offline_plan(dummy_source: SourceEntry) -> None:
    result = dummy_run()
    assert [str(m) for m in result.outputs["dummyMachines"]] == ["198.51.100.10", "198.51.100.11"]
    assert result.outputs["gpus"] == 8
    text = plan.render_summary(result)
    assert "2 nodes x dummy.4gpu (4 x NVIDIA L20 each) in dummy-zone" in text
    full = plan.plan_text(result)
    assert "node-1" in full


class DummyCloudSource(DummySource):
    """The same machines, but behind a resource the source registers (components/node_source.py RESOURCES)."""

    name = "dummy-cloud"

    def provision(self) -> ProvisionedCluster:  # never called: the registry's resources provision it
        raise AssertionError("a source with resources is provisioned by its components")


def provision_dummy_cloud(source: NodeSource) -> ProvisionedCluster:
    import pulumi_command as command

    assert isinstance(source, DummyCloudSource)
    machines = [dataclasses.replace(m, depends_on=[command.local.Command(f"dummy-machine-{m.rank}", create="true")])
                for m in DummySource.provision(source).machines]
    return ProvisionedCluster(machines=machines)


def test_a_source_with_resources_is_provisioned_through_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sources.SOURCES, "dummy-cloud", SourceEntry(
        "dummy-cloud", DUMMY_CAPABILITIES, lambda config, stack, login: DummyCloudSource(config, stack)))
    monkeypatch.setitem(node_source.RESOURCES, "dummy-cloud",
                        lambda: node_source.SourceResources(provision_dummy_cloud))
    result = run_program("hosts", replace_config={
        "roll-cluster:nodes": {"source": "dummy-cloud", "count": 2}, "roll-cluster:storage": {}})
    assert {r.name for r in result.cloud.resources if r.name.startswith("dummy-machine-")} == {
        "dummy-machine-0", "dummy-machine-1"}
    assert "node-1" in plan.plan_text(result)


# ------------------------------------------------------------------------------------- nothing asks a source's name
# Where a source's name may be tested: its own folders and the two registries.
SOURCE_FOLDERS = ("infra/sources/", "components/alibaba/", "components/hosts/")
REGISTRIES = ("components/node_source.py",)
PRODUCT = ("__main__.py", "components", "infra", "devtools", "companion")


def product_modules() -> list[Path]:
    found: list[Path] = []
    for top in PRODUCT:
        path = REPO / top
        found += [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)
    return found


def _names_in(node: ast.expr) -> set[str]:
    """The string constants a comparison operand is, or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def source_name_tests(text: str, names: set[str]) -> list[str]:
    """Comparisons of something named *source* with a source's name: `nodes.source == "hosts"`,
    `data.get("source") != "alibaba"`, `source in ("hosts",)`, `match nodes.source: case "hosts"`."""
    found: list[str] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = set().union(*(_names_in(o) for o in operands)) & names
            if named and any("source" in ast.unparse(o).lower() for o in operands if not _names_in(o)):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Match) and "source" in ast.unparse(node.subject).lower():
            cases = {c.pattern.value.value for c in node.cases if isinstance(c.pattern, ast.MatchValue)
                     and isinstance(c.pattern.value, ast.Constant)}
            if cases & names:
                found.append(f"{node.lineno}: match {ast.unparse(node.subject)}")
    return found


# A shell test of a source's name: `[[ $X == hosts ]]`, `[ "$X" = "alibaba" ]` or a case arm `hosts)`.
SHELL_TEST = re.compile(r"""(==|!=|\s=)\s*['"]?(alibaba|hosts)['"]?\s*(\]|;|$)|^\s*['"]?(alibaba|hosts)['"]?\)""")


def test_nothing_outside_the_sources_and_the_registry_asks_a_sources_name() -> None:
    names = set(sources.names())
    offenders: list[str] = []
    for path in product_modules():
        where = str(path.relative_to(REPO))
        if where.startswith(SOURCE_FOLDERS) or where in REGISTRIES:
            continue
        offenders += [f"{where}:{hit}" for hit in source_name_tests(path.read_text(), names)]
    for path in sorted((REPO / "infra" / "scripts").rglob("*.sh")):
        offenders += [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
                      for number, line in enumerate(path.read_text().splitlines(), 1) if SHELL_TEST.search(line)]
    assert offenders == []


@pytest.mark.parametrize("code", [
    'if config.nodes.source == "hosts": pass',
    'x = data.get("source", "alibaba") != "alibaba"',
    'y = nodes.source in ("hosts", "other")',
    'match config.nodes.source:\n    case "alibaba": pass',
])
def test_the_checker_sees_a_source_name_test(code: str) -> None:
    assert source_name_tests(code, {"alibaba", "hosts"})


def test_the_checker_leaves_other_sources_alone() -> None:
    # model_source, a rule's source: not node sources.
    assert source_name_tests('a = shape.model_source == "modelscope"\nb = rule.source == "this security group"',
                             {"alibaba", "hosts"}) == []
    assert SHELL_TEST.search('if [[ "$NODES_SOURCE" == hosts ]]; then')
    assert SHELL_TEST.search('  [ "$KIND" = "alibaba" ] && stop')
    assert SHELL_TEST.search('    alibaba) stop_instances ;;')
    assert not SHELL_TEST.search('  banner "stopping job $JOB_ID (own hosts: the machines stay up)"')


# The provider SDK of each source that registers resources: only its own folder under components/ imports it.
SOURCE_SDKS = {"alibaba": "pulumi_alicloud"}


def test_a_sources_resources_live_in_its_own_folder() -> None:
    assert set(SOURCE_SDKS) == set(node_source.RESOURCES)
    outside = []
    for name, sdk in SOURCE_SDKS.items():
        for path in sorted((REPO / "components").rglob("*.py")):
            imported = {a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import)
                        for a in n.names} | {n.module or "" for n in ast.walk(ast.parse(path.read_text()))
                                             if isinstance(n, ast.ImportFrom)}
            if sdk in imported and path.parent != REPO / "components" / name:
                outside.append(str(path.relative_to(REPO)))
    assert outside == []


# ----------------------------------------------------------------------------------------- docs/adding-a-source.md
DOC = REPO / "docs" / "adding-a-source.md"


def _section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def documented_files() -> set[str]:
    """The first column of the files table."""
    return {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", _section("The files"), re.MULTILINE)}


def _relative(module: Any) -> str:
    return str(Path(module.__file__).resolve().relative_to(REPO))


def registry_files() -> set[str]:
    """What the registry routes through, from the code: the registries, the interface, each source's entry module
    and its NodeSource, the resources folder of a source with resources, the `nodes` section and its reference."""
    import importlib

    import infra.config.nodes
    import infra.sources.base

    found = {_relative(sources), _relative(node_source), _relative(infra.sources.base), _relative(infra.config.nodes),
             "docs/configuration.md"}
    for name, entry in sources.SOURCES.items():
        found.add(_relative(importlib.import_module(entry.make.__module__)).replace(f"/{name}/", "/<name>/"))
    if node_source.RESOURCES:
        found.add("components/<name>/")
    found.add("infra/sources/<name>/source.py")  # the NodeSource `make` builds (imported only when made)
    return found


def test_the_doc_lists_exactly_the_files_a_source_touches() -> None:
    assert documented_files() == registry_files()


def test_every_documented_file_exists_for_every_source() -> None:
    missing = []
    for path in documented_files():
        names = list(node_source.RESOURCES) if path.startswith("components/<name>") else list(sources.SOURCES)
        for name in names if "<name>" in path else [""]:
            if not (REPO / path.replace("<name>", name)).exists():
                missing.append(path.replace("<name>", name))
    assert missing == []


def test_the_doc_states_every_capability_and_entry_point() -> None:
    import infra.sources.base

    table = _section("The capabilities")
    fields = [f.name for f in dataclasses.fields(Capabilities)]
    assert sorted(re.findall(r"^\| `([a-z_]+)` \|", table, re.MULTILINE)) == sorted(fields)
    files = _section("The files")
    points = {"CAPABILITIES": sources.alibaba, "ENTRY": sources.alibaba, "SOURCES": sources,
              "RESOURCES": node_source, "SourceResources": node_source, "SourceEntry": infra.sources.base,
              "ProvisionsItself": infra.sources.base, "NodeSource": infra.sources.base}
    assert [p for p, module in points.items() if f"`{p}`" not in files or not hasattr(module, p)] == []
    assert all(hasattr(module, "CAPABILITIES") and hasattr(module, "ENTRY") for module in (sources.alibaba,
                                                                                             sources.hosts))
