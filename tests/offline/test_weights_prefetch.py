"""Every node's weights-prefetch (issue 21): with shared storage and a job that names hub models, every node reads
the complete files already in the shared caches into its page cache while it pulls the image, so the framework
reads the weights from memory instead of every node reading the shared storage at once."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from offline_helpers import ancestors, env_of, run, step_command
from script_harness import FakeNode, assert_failed, assert_ok

from devtools import schedule
from devtools.offline_cloud import unwrap
from devtools.schedule import CONSTANTS, first_step
from infra import model_cache
from infra.node import steps

STEP = model_cache.PREFETCH_STEP
FITS = {"roll-cluster:training": {"overrides": {"rollout_batch_size": 128}}}


def prefetch_records(records: list[steps.StepRecord]) -> list[steps.StepRecord]:
    return [r for r in records if r.step == STEP]


@pytest.mark.parametrize("stack", ["multi", "verl", "openrlhf", "hosts"])
def test_every_node_prefetches_after_prepare_host_and_only_the_job_waits_for_it(stack: str) -> None:
    records = list(run(stack).steps)
    prefetches = prefetch_records(records)
    assert [r.node for r in prefetches] == ["node-0", "node-1"]  # head and worker
    for record in prefetches:
        assert f"{record.node}/prepare-host" in record.depends_on  # the shared storage is mounted then
        # Beside the container, code and Ray: none of them before it.
        assert not {k for k in ancestors(records, record.key) if k.split("/")[1] in ("container", "code", "ray-head")}
        assert record.key in ancestors(records, "node-0/job")  # the job starts with warm page caches
    # Steps after the job (autostop's watcher) wait for it anyway.
    waiting = [r.key for r in records if r.step != "job" and "node-0/job" not in ancestors(records, r.key)
               and any(p.key in ancestors(records, r.key) for p in prefetches)]
    assert waiting == []  # nothing else waits: the pull, the container, code, Ray run beside it


@pytest.mark.parametrize(("stack", "config"), [
    ("multi", {"roll-cluster:nodes": {"image": "m-bp1g7004ksh0oeuc6v1h"}}),  # a baked image: no installer
    ("hosts", {}),  # your own hosts: the driver is checked, never installed
])
def test_where_no_reboot_can_come_the_prefetch_overlaps_docker_and_the_pull(stack: str, config: dict[str, Any]) -> None:
    records = list(run(stack, config=config).steps)
    for record in prefetch_records(records):
        assert record.depends_on == (f"{record.node}/prepare-host",)
        assert not {k for k in ancestors(records, record.key) if k.split("/")[1] in ("docker", "pull-image")}


def test_where_the_driver_installer_may_reboot_the_node_the_prefetch_comes_after_gpu_ready() -> None:
    # gpu-ready reboots the node for the installer: a step running then would lose its SSH session, and the
    # reboot would empty the page cache it filled.
    records = list(run("multi").steps)
    for record in prefetch_records(records):
        assert record.depends_on == (f"{record.node}/prepare-host", f"{record.node}/gpu-ready")


@pytest.mark.parametrize("config", [
    {"roll-cluster:storage": {"nas": False}},  # no shared storage: per-node caches
    {"roll-cluster:training": {"framework": "custom", "custom": {"entrypoint": "python3 train.py"}}},
])
def test_without_shared_storage_or_known_models_no_node_prefetches(config: dict[str, Any]) -> None:
    assert prefetch_records(list(run("multi", config=config).steps)) == []


def test_a_job_of_local_paths_only_has_nothing_to_prefetch() -> None:
    local = {"actor_rollout_ref.model.path": "/mnt/shared/models/qwen"}
    result = run("verl", config={"roll-cluster:training": {"overrides": local}})
    assert prefetch_records(list(result.steps)) == []


def test_the_prefetch_gets_the_models_and_the_hosts_cache_paths_through_its_environment() -> None:
    text = step_command(run("verl"), f"node-1-{STEP}")
    env = env_of(text)
    assert json.loads(env["MODELS_JSON"]) == [["huggingface", "Qwen/Qwen2.5-0.5B-Instruct", "https://hf-mirror.com"]]
    assert env["HF_HUB_CACHE_DIR"] == "/mnt/shared/cache/huggingface/hub"  # the host's NAS mount
    assert env["MODELSCOPE_CACHE_DIR"] == "/mnt/shared/cache/modelscope"
    assert env["PREFETCH_TIMEOUT_S"] == str(model_cache.PREFETCH_TIMEOUT_S)
    assert "Qwen2.5" not in text.split("\nexec ", 1)[1]  # the id travels as a quoted variable, never as script text
    # Your own hosts with a directory that is already shared: the caches under it on the host.
    shared = run("hosts", replace_config={"roll-cluster:storage": {"sharedHostPath": "/srv/shared"}})
    host_env = env_of(step_command(shared, f"node-0-{STEP}"))
    assert host_env["HF_HUB_CACHE_DIR"] == "/srv/shared/cache/huggingface/hub"
    assert host_env["MODELSCOPE_CACHE_DIR"] == "/srv/shared/cache/modelscope"


def test_the_prefetch_reruns_for_other_models_or_another_node_not_for_every_new_job() -> None:
    base = run("verl")
    other_job = run("verl", config={"roll-cluster:training": {"overrides": {"trainer.total_epochs": 17}}})
    other_model = run("verl", config={"roll-cluster:training": {"overrides": {
        "actor_rollout_ref.model.path": "Qwen/Qwen2.5-7B-Instruct"}}})

    def inputs(result: Any, name: str) -> tuple[Any, Any]:
        resource = result.cloud.named(name)
        return unwrap(resource.inputs["stdin"]), unwrap(resource.inputs.get("triggers"))

    assert base.outputs["jobId"] != other_job.outputs["jobId"]
    assert inputs(base, "node-0-model") == inputs(other_job, "node-0-model")  # the model step: same models, not again
    for node in ("node-0", "node-1"):
        name = f"{node}-{STEP}"
        stdin, triggers = inputs(base, name)
        # The same models: the same text and the same machine (the offline cloud numbers the instances' start times
        # in the order it registers them, which varies between runs: compared by what they are, not by value).
        assert stdin == inputs(other_job, name)[0] and triggers[0] == inputs(other_job, name)[1][0]
        assert stdin != inputs(other_model, name)[0]  # other models: its create runs again
        # Another machine, or a new start of it (an empty page cache), replaces it.
        node_output = base.outputs["nodes"][int(node[-1])]
        assert triggers[0] == node_output["instanceId"] and len(triggers) == 2
        instance = next(r for r in base.cloud.resources if r.id == node_output["instanceId"])
        assert triggers[1] == instance.outputs["startTime"]


# ------------------------------------------------------------- weights_prefetch.sh on a fake node (tests/standins)
REPO = "Qwen/Qwen2.5-0.5B-Instruct"
COMMIT = "7ae557604adf67be50417f59c2c2f167def9a775"
# A `cat` first in PATH that records what the step reads, fails on a file whose name is in CAT_FAIL_ON and hangs
# (a stalled NFS read) on one in CAT_HANG_ON.
CAT_STUB = """#!/usr/bin/env bash
for arg in "$@"; do
  [[ "$arg" == -- ]] && continue
  printf '%s\\n' "$arg" >>{log}
  if [[ -n "${{CAT_FAIL_ON:-}}" && "$arg" == *"$CAT_FAIL_ON"* ]]; then
    echo "cat: $arg: Input/output error" >&2
    exit 1
  fi
  if [[ -n "${{CAT_HANG_ON:-}}" && "$arg" == *"$CAT_HANG_ON"* ]]; then
    sleep 60
  fi
done
exec /bin/cat "$@"
"""


def hf_cache(root: Path, complete: bool = True) -> Path:
    """huggingface_hub's layout: refs/main -> the commit, snapshots/<commit>/ symlinks to blobs/."""
    repo = root / "huggingface" / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for name, blob, content in (("config.json", "a1", b"{}"), ("model.safetensors", "b2", b"x" * 4096)):
        (repo / "blobs" / blob).write_bytes(content)
        os.symlink(f"../../blobs/{blob}", snapshot / name)
    # A blob still downloading: its `.incomplete` file, and (a broken cache) a symlink to the blob not there yet.
    (repo / "blobs" / "c3.incomplete").write_bytes(b"y" * 100)
    os.symlink("../../blobs/c3", snapshot / "model-00002-of-00002.safetensors")
    if not complete:
        for path in snapshot.iterdir():
            path.unlink()
    return repo


def run_prefetch(node: FakeNode, tmp_path: Path, models: list[list[str]] | None = None, **overrides: str) -> Any:
    stub = tmp_path / "stub-bin"
    stub.mkdir(exist_ok=True)
    (stub / "cat").write_text(CAT_STUB.format(log=tmp_path / "reads"))
    (stub / "cat").chmod(0o755)
    meminfo = tmp_path / "meminfo"
    if not meminfo.exists():
        meminfo.write_text("MemTotal:       263000000 kB\nMemAvailable:   200000000 kB\n")
    cache = tmp_path / "cache"
    settings = {
        "PATH": f"{stub}:{node.path}",
        "MODELS_JSON": json.dumps(models if models is not None else [["huggingface", REPO, "https://hf-mirror.com"]]),
        "HF_HUB_CACHE_DIR": str(cache / "huggingface" / "hub"),
        "MODELSCOPE_CACHE_DIR": str(cache / "modelscope"),
        "PREFETCH_TIMEOUT_S": "30",
        "MEMINFO_FILE": str(meminfo),
        **overrides,
    }
    return node.run_step(STEP, list(model_cache.PREFETCH_SCRIPTS), **settings)


def reads(tmp_path: Path) -> list[str]:
    path = tmp_path / "reads"
    cache = str(tmp_path / "cache")
    return [line for line in path.read_text().splitlines() if line.startswith(cache)] if path.exists() else []


def test_the_prefetch_reads_the_complete_snapshot_files_and_never_writes_the_cache(node, tmp_path) -> None:
    repo = hf_cache(tmp_path / "cache")
    before = node.snapshot(tmp_path / "cache")
    result = run_prefetch(node, tmp_path)
    assert_ok(result)
    snapshot = repo / "snapshots" / COMMIT
    assert sorted(reads(tmp_path)) == [str(snapshot / "config.json"), str(snapshot / "model.safetensors")]
    assert "read 2 files" in result.output
    assert node.snapshot(tmp_path / "cache") == before  # nothing written to the shared storage


def test_the_prefetch_reads_modelscopes_finished_model_folder_only(node, tmp_path) -> None:
    folder = tmp_path / "cache" / "modelscope" / "models" / "Qwen" / "Qwen2___5-0___5B-Instruct"
    (folder / "._____temp").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 4096)
    (folder / ".msc").write_bytes(b"record")  # the client's record, not the model
    (folder / "._____temp" / "model-00002.safetensors").write_bytes(b"y" * 10)  # still downloading
    (folder / "tokenizer.json.incomplete").write_bytes(b"z")
    result = run_prefetch(node, tmp_path, [["modelscope", REPO, ""]])
    assert_ok(result)
    assert sorted(reads(tmp_path)) == [str(folder / "config.json"), str(folder / "model.safetensors")]


def test_the_prefetch_with_no_model_in_the_cache_yet_succeeds_at_once(node, tmp_path) -> None:
    hf_cache(tmp_path / "cache", complete=False)  # refs/main written, no finished file yet
    result = run_prefetch(node, tmp_path, [["huggingface", REPO, ""], ["modelscope", "Qwen/Other", ""]])
    assert_ok(result)
    assert "nothing to prefetch yet" in result.output and reads(tmp_path) == []
    assert not (tmp_path / "cache" / "modelscope").exists()  # nothing made on the shared storage


def test_the_prefetch_skips_models_that_do_not_fit_in_half_the_available_memory(node, tmp_path) -> None:
    hf_cache(tmp_path / "cache")
    (tmp_path / "meminfo").write_text("MemTotal:       8 kB\nMemAvailable:   6 kB\n")  # 3 kB < the 4 kB model
    result = run_prefetch(node, tmp_path)
    assert_ok(result)
    assert "skipped: the models' 0 MB do not fit in half of MemAvailable" in result.output
    assert reads(tmp_path) == []


def test_a_read_error_fails_the_prefetch_naming_the_file(node, tmp_path) -> None:
    repo = hf_cache(tmp_path / "cache")
    result = run_prefetch(node, tmp_path, CAT_FAIL_ON="model.safetensors")
    assert_failed(result, f"{STEP}: FAILED: reading {repo / 'snapshots' / COMMIT / 'model.safetensors'} from the "
                  "shared storage failed", "Input/output error")


def test_a_stalled_read_is_cut_at_the_bound_and_the_job_is_not_held(node, tmp_path) -> None:
    hf_cache(tmp_path / "cache")
    result = run_prefetch(node, tmp_path, CAT_HANG_ON="model.safetensors", PREFETCH_TIMEOUT_S="1")
    assert_ok(result)
    assert "cut at PREFETCH_TIMEOUT_S=1s: the framework reads the rest from the shared storage" in result.output


# ----------------------------------------------------------------------------------------- the schedule model
def plan_config() -> Any:
    return run("multi", config=FITS).notes["config"]


def plans(path: str) -> dict[int, Any]:
    result = run("multi", config=FITS)
    # Without the pull cache (container.pullCache off), the figures these tests compare with
    # (tests/offline/test_pull_cache_model.py models the cache).
    config, records = schedule.without_cache(result.notes["config"]), list(result.steps)
    return {n: first_step(config, records, path, n, n) for n in (64, 256)}  # type: ignore[arg-type]


def test_with_the_model_on_the_shared_storage_the_prefetch_hides_every_nodes_read_at_start_up() -> None:
    page_cache = CONSTANTS["page-cache-read"].value
    for nodes, read, before, after in ((64, 1.6, 40.6, 39.3), (256, 6.4, 109.4, 103.3)):
        plan = plans("in-region")[nodes]
        # Every node's prefetch: nodes x 15 GB at the NAS's 10 GB/s, beside the container, code and Ray.
        assert plan.step_minutes(f"node-1/{STEP}") == pytest.approx(read, abs=0.01)
        assert plan.step_minutes("node-0/weights") == page_cache  # from memory after the job's submission
        # Without the terms that grow with the count alone (API throttling, Pulumi's saves, the start-up's growth).
        assert plan.total - schedule.scale_minutes(plan_config(), nodes) == pytest.approx(after, abs=0.05)
        # The figure falls by the read the prefetch hides (before it: `before`, docs/performance.md's old table).
        assert before - (plan.total - schedule.scale_minutes(plan_config(), nodes)) == pytest.approx(
            read - page_cache, abs=0.1)


def test_on_a_new_cluster_the_prefetch_finds_nothing_and_the_read_at_start_up_stays() -> None:
    for nodes, read, total in ((64, 1.6, 52.6), (256, 6.4, 109.4)):
        plan = plans("new")[nodes]
        assert plan.step_minutes(f"node-1/{STEP}") == CONSTANTS["prefetch-empty"].value
        assert plan.step_minutes("node-0/weights") == pytest.approx(read, abs=0.01)
        assert plan.total - schedule.scale_minutes(plan_config(), nodes) == pytest.approx(total, abs=0.05)
