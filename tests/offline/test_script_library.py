"""Scripts shipped once per node (issue 32): each node's script library step (a pulumi-command CopyToRemote of the
scripts under content-hashed names) and steps whose inputs are their environment and the files they source, so
that what Pulumi stores per node stays in kilobytes and a change shows only where it applies."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from offline_helpers import LOCAL, REMOTE, run

from bench.program_bench import measure_inputs
from devtools.offline_cloud import OfflineCloud, OfflineRun, run_program, unwrap
from infra.layout import PROJECT_DIR
from infra.node import remote

COPY = "command:remote:CopyToRemote"
# Resource inputs per node (bytes, as the state keeps them): the bound.
INPUT_BYTES_PER_NODE = 40_000


def text_of(result: OfflineRun, name: str) -> str:
    inputs = unwrap(result.cloud.named(name).inputs)
    return str(inputs.get("stdin") or inputs.get("environment", {}).get("REMOTE_COMMAND", ""))


def script_lines() -> set[str]:
    """Every distinctive line of every node script (long enough not to be a common word like `fi`)."""
    return {line.strip() for path in remote.SCRIPTS_DIR.glob("*.sh") for line in path.read_text().splitlines()
            if len(line.strip()) > 30}


def test_inputs_grow_by_at_most_40_kb_per_node() -> None:
    one, three = measure_inputs("multi", 1), measure_inputs("multi", 3)
    per_node = (three - one) / 2
    assert per_node <= INPUT_BYTES_PER_NODE, f"{per_node:.0f} bytes of inputs per node"


def test_no_step_carries_script_text_only_the_files_it_sources() -> None:
    result = run("multi")
    lines = script_lines()
    steps = [r for r in result.cloud.resources if r.type == REMOTE]
    teardowns = [r for r in result.cloud.resources if r.type == LOCAL and r.name.endswith("-teardown")]
    assert steps and teardowns
    for r in [*steps, *teardowns]:
        text = text_of(result, r.name)
        assert not lines & {line.strip() for line in text.splitlines()}, r.name
        sourced = remote.sourced_scripts(text)
        assert sourced and sourced[0] == remote.library_name(remote.LIB_SCRIPT), r.name
        # Every file it sources is in the library the node's step copies.
        staged = PROJECT_DIR / remote.staged_library()
        assert all((staged / name).is_file() for name in sourced), r.name


def test_every_step_and_teardown_waits_for_its_node_library() -> None:
    result = run("multi")
    libraries = {r.name: r for r in result.cloud.of_type(COPY)}
    assert set(libraries) == {"node-0-scripts", "node-1-scripts"}
    for name, library in libraries.items():
        inputs = unwrap(library.inputs)
        assert inputs["remotePath"] == remote.LIBRARY_DIR
        # Stored as Pulumi stores an archive: its path and hash, never the files' content.
        assert set(inputs["source"]) == {"4dabf18193072939515e22adb298388d", "hash", "path"}
        assert inputs["source"]["path"] == remote.staged_library()
        node = name.removesuffix("-scripts")
        assert inputs["triggers"] == [result.cloud.named(f"{node}-instance").id]
    for r in result.cloud.resources:
        if r.type == REMOTE or (r.type == LOCAL and r.name.endswith("-teardown")):
            node = "node-1" if r.name.startswith("node-1-") else "node-0"
            depends_on = result.cloud.options[r.name].depends_on or []
            assert libraries and any(getattr(d, "_name", None) == f"{node}-scripts" for d in depends_on), r.name


def test_a_training_setting_changes_the_job_step_only_and_its_diff_holds_no_script_text() -> None:
    base = run("multi")
    tuned = run_program("multi", cloud=OfflineCloud(prior=list(base.cloud.resources)),
                        config={"roll-cluster:training": {"overrides": {"max_steps": 50}}})
    changed = sorted(name for name, change in tuned.cloud.changes.items() if change != "same")
    # The job step and its teardown (its delete side) only: the model step reruns for other models, not a new job.
    assert changed == ["training-job", "training-job-teardown"]
    lines = script_lines()
    for name in changed:
        old, new = text_of(base, name).splitlines(), text_of(tuned, name).splitlines()
        diff = {line.strip() for line in set(old) ^ set(new)}
        assert diff and not diff & lines, name
        assert not any("set -Eeuo pipefail" in line for line in diff)


@pytest.fixture
def edited_scripts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A copy of infra/scripts the test may edit, standing in for the real one."""
    copy = tmp_path / "scripts"
    shutil.copytree(remote.SCRIPTS_DIR, copy)
    monkeypatch.setattr(remote, "SCRIPTS_DIR", copy)
    remote.library_name.cache_clear()
    remote.staged_library.cache_clear()
    yield copy
    remote.library_name.cache_clear()
    remote.staged_library.cache_clear()


def test_a_script_change_reruns_exactly_the_steps_that_run_it(edited_scripts: Path) -> None:
    base = run("multi")
    with (edited_scripts / "ray_stop.sh").open("a") as script:
        script.write("# a changed line\n")
    remote.library_name.cache_clear()
    remote.staged_library.cache_clear()
    again = run_program("multi", cloud=OfflineCloud(prior=list(base.cloud.resources)))
    changed = {name: change for name, change in again.cloud.changes.items() if change != "same"}
    # The libraries update (a new file beside the old: no replacement), and only the teardowns that stop Ray.
    assert changed == {"node-0-scripts": "update", "node-1-scripts": "update",
                       "node-0-ray-head-teardown": "update", "node-1-ray-worker-teardown": "update"}


def test_a_replaced_instance_gets_its_library_again() -> None:
    base = run("multi")
    again = run_program("multi", cloud=OfflineCloud(prior=list(base.cloud.resources), replace={"node-1-instance"}))
    # A new machine behind the same archive: the library's trigger (the instance id) replaces it, so it is copied.
    assert again.cloud.changes["node-1-instance"] == "replace"
    assert again.cloud.changes["node-1-scripts"] == "replace"
    assert again.cloud.changes["node-0-scripts"] == "same"


def test_own_hosts_as_a_user_keep_the_library_in_its_home() -> None:
    command = remote.render_plain("docker", ["install_docker.sh"], {"A": "b"}, sudo=True,
                                  library=remote.library_dir("ops"))
    assert f". ~ops/{remote.LIBRARY_HOME_DIR}/{remote.library_name('install_docker.sh')}" in command
    assert remote.library_remote_path("ops") == remote.LIBRARY_HOME_DIR
    assert remote.library_remote_path("root") == remote.LIBRARY_DIR == remote.library_dir("root")


def test_a_step_whose_library_file_is_missing_fails_naming_it(tmp_path: Path) -> None:
    command = remote.render_plain("docker", ["install_docker.sh"], {"NODE_NAME": "node-1"}, library=str(tmp_path))
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
    missing = f"{tmp_path}/{remote.library_name('lib.sh')}"
    assert result.returncode == 1
    assert f"roll-cluster-docker: {missing} is missing: the node script library step (node-1-scripts)" in result.stderr


def test_a_step_runs_the_library_files_in_order_with_its_exports() -> None:
    command = remote.render_plain("ray-stop", ["ray_common.sh"], {"NODE_NAME": "node-1", "X": "it's"},
                                  library=remote.local_library())
    probe = command.replace("' roll-cluster-ray-stop\n", 'banner "X=$X"\n\' roll-cluster-ray-stop\n')
    result = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30,
                            env={"PATH": "/usr/bin:/bin", "ROLL_CLUSTER_LOG_DIR": "/tmp"})
    assert result.returncode == 0, result.stderr
    assert "[node-1] ray-stop: X=it's" in result.stdout


def test_the_user_data_leaves_comments_out_but_keeps_here_documents() -> None:
    text = remote.render_user_data("first_boot.sh", {"A": "b"})
    assert "\n# Shared helpers" not in text and "# ---- first_boot.sh ----" in text
    assert "[Service]\n" in text  # lib.sh's unit file, a here-document, whole
    assert subprocess.run(["bash", "-n", "-c", text], capture_output=True).returncode == 0


# Python in a shell string or here-document: a line of Python statements (an import, a def, a print, a loop over
# sys.argv or json) or a `-c` program beyond a bare import, which only checks that a module is there.
PYTHON_LINE = re.compile(r"^\s*(import \w|from [\w.]+ import |def \w+\(|print\(|for .* in .*(sys\.argv|json\.))")
PYTHON_PROGRAM = re.compile(r"""-c\s+(['"])(?!import [\w.]+(, [\w.]+)*\1)[^'"]*(\bimport\b|print\(|sys\.)""")


def python_in_shell(text: str) -> list[str]:
    return [line for line in text.splitlines()
            if not line.lstrip().startswith("#") and (PYTHON_LINE.match(line) or PYTHON_PROGRAM.search(line))]


def test_no_python_inside_the_shell_scripts() -> None:
    """Node logic in Python lives in infra/scripts/*.py (ruff and mypy check it), shipped in the library."""
    scripts = sorted((remote.SCRIPTS_DIR).rglob("*.sh"))
    assert len(scripts) > 30
    found = {str(p.relative_to(remote.SCRIPTS_DIR)): lines
             for p in scripts if (lines := python_in_shell(p.read_text()))}
    assert not found, f"Python inside shell scripts: {found}"


def test_the_python_check_sees_python_where_there_is_some() -> None:
    assert python_in_shell("X='\nimport os, sys\nprint(1)\n'")
    assert python_in_shell("python3 - <<'PY'\nfrom a.b import c\nPY")
    assert python_in_shell("""python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' x""")
    assert python_in_shell("""MODELS=$(python3 -c 'import json, sys\nfor a in json.loads(sys.argv[1]):""")
    assert not python_in_shell("""  "$python" -c 'import ensurepip, venv' >/dev/null 2>&1 ||""")
    assert not python_in_shell("""python3 "$HELPER_MODEL_LIST" "$MODELS_JSON"\n# import os: a comment""")


def test_a_step_names_the_python_helpers_its_scripts_use_and_its_node_has_them() -> None:
    command = remote.render_plain("ray-ready", ["ray_common.sh", "ray_ready.sh"], {"NODE_NAME": "node-0"})
    for helper in ("ray_processes.py", "ray_job_client.py", "ray_ready.py"):
        variable = "HELPER_" + helper.removesuffix(".py").upper()
        assert f"{variable}={remote.LIBRARY_DIR}/{remote.library_name(helper)}\n" in command, helper
        assert (PROJECT_DIR / remote.staged_library() / remote.library_name(helper)).is_file()
    # A step whose scripts use no helper names none.
    assert "HELPER_" not in remote.render_plain("prepare-host", ["prepare_host.sh"], {})


def test_every_helper_a_script_names_exists_and_nothing_without_a_library_needs_one() -> None:
    for script in sorted(p.name for p in remote.SCRIPTS_DIR.glob("*.sh")):
        remote.helpers([script])  # raises for a helper that is not there
    assert remote.helpers(["first_boot.sh"]) == []  # the user data carries no library
    with pytest.raises(ValueError, match="carries no script library"):
        remote.render_inline("probe", ["ray_ready.sh"], {})
