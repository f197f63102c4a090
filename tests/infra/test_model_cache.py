"""Model downloads (issue 21): every node's container caches models on its data disk, so a new container or a
second job of the same model downloads nothing, and ModelScope's in-cloud download is named in its regions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from offline_helpers import ancestors, env_of, run, step_command
from script_harness import FakeNode, assert_failed, assert_ok

from devtools.offline_cloud import unwrap
from infra import model_cache, parallelism


def container_envs(result: Any, node: str) -> dict[str, str]:
    return dict(e.split("=", 1) for e in unwrap(result.cloud.named(f"{node}-container").inputs["envs"]))


@pytest.mark.parametrize("stack", ["multi", "hosts"])
def test_with_shared_storage_every_nodes_container_reads_the_hub_caches_from_it(stack: str) -> None:
    result = run(stack)
    for node in ("node-0", "node-1"):
        envs = container_envs(result, node)
        assert envs["HF_HUB_CACHE"] == "/mnt/shared/cache/huggingface/hub"
        assert envs["MODELSCOPE_CACHE"] == "/mnt/shared/cache/modelscope"
        assert envs["HF_HOME"] == "/data/cache/huggingface"  # token, datasets' processed cache: per node
        assert "HF_HUB_OFFLINE" not in envs  # datasets from the Hub must still load (infra/model_cache.py)
        volumes = unwrap(result.cloud.named(f"{node}-container").inputs["volumes"])
        assert any(v["containerPath"] == "/mnt/shared" for v in volumes)  # the cache is where every node sees it


@pytest.mark.parametrize("config", [
    {"roll-cluster:storage": {"nas": False}},  # no shared storage: per-node caches, as before
    {"roll-cluster:training": {"framework": "custom", "custom": {"entrypoint": "python3 train.py"}}},  # models unknown
])
def test_otherwise_every_nodes_container_caches_models_on_its_data_disk_and_no_node_fetches_first(config) -> None:
    result = run("multi", config=config)
    for node in ("node-0", "node-1"):
        envs = container_envs(result, node)
        assert envs["HF_HOME"] == "/data/cache/huggingface" and "HF_HUB_CACHE" not in envs
        assert envs["MODELSCOPE_CACHE"] == "/data/cache/modelscope"
        volumes = unwrap(result.cloud.named(f"{node}-container").inputs["volumes"])
        assert {"hostPath": "/data", "containerPath": "/data"}.items() <= next(
            v for v in volumes if v["containerPath"] == "/data").items()  # the cache outlives the container
    assert not [r for r in result.steps if r.step == "model"]


@pytest.mark.parametrize("stack", ["multi", "verl", "openrlhf", "hosts"])
def test_the_model_step_runs_on_the_head_alone_after_its_container_before_the_job_beside_code_and_ray(stack) -> None:
    records = list(run(stack).steps)
    model = [r for r in records if r.step == "model"]
    assert [r.node for r in model] == ["node-0"]  # the head only: one download per cluster
    assert model[0].depends_on == ("node-0/container",)  # the container (on its mounted shared storage) first
    assert not {k for k in ancestors(records, "node-0/model") if k.split("/")[1] in ("code", "ray-head", "ray-ready")}
    assert "node-0/model" in ancestors(records, "node-0/job")
    assert not any("model" in d for r in records if r.step.startswith("ray-") for d in ancestors(records, r.key))


def test_the_model_step_gets_the_models_through_its_environment_with_the_frameworks_hub_and_mirror() -> None:
    result = run("verl", config={"roll-cluster:training": {"startTimeoutMinutes": 30}})
    text = step_command(result, "node-0-model")
    env = env_of(text)
    assert json.loads(env["MODELS_JSON"]) == [["huggingface", "Qwen/Qwen2.5-0.5B-Instruct", "https://hf-mirror.com"]]
    assert env["MODEL_TIMEOUT_S"] == "1800"  # training.startTimeoutMinutes
    assert env["CONTAINER_NAME"] == "roll" and env["JOB_WORKDIR"] == "/workspace/verl"
    body = text.split("\nexec ", 1)[1]
    assert "Qwen2.5" not in body  # the id travels as a quoted variable, never as script text
    gate_off = env_of(step_command(run("verl", config={"roll-cluster:training": {"startTimeoutMinutes": 0}}),
                                   "node-0-model"))
    assert gate_off["MODEL_TIMEOUT_S"] == str(model_cache.DEFAULT_MODEL_TIMEOUT_S)
    ms = env_of(step_command(run("verl", config={"roll-cluster:training": {"modelSource": "modelscope"}}),
                             "node-0-model"))
    assert json.loads(ms["MODELS_JSON"]) == [["modelscope", "Qwen/Qwen2.5-0.5B-Instruct", ""]]


def test_roll_fetches_through_its_download_type_and_a_local_path_needs_no_step() -> None:
    roll = env_of(step_command(run("multi"), "node-0-model"))
    assert json.loads(roll["MODELS_JSON"]) == [["modelscope", "Qwen/Qwen2.5-0.5B-Instruct", ""]]  # ROLL's default
    hub = run("multi", config={"roll-cluster:training": {"overrides": {"model_download_type": "HUGGINGFACE_HUB"}}})
    assert json.loads(env_of(step_command(hub, "node-0-model"))["MODELS_JSON"])[0][0] == "huggingface"
    local = {"actor_rollout_ref.model.path": "/mnt/shared/models/qwen"}
    result = run("verl", config={"roll-cluster:training": {"overrides": local}})
    assert not [r for r in result.steps if r.step == "model"]  # nothing to download: no step
    assert [d for r in result.steps if r.step == "job" for d in r.depends_on] == ["node-0/ray-ready"]


def test_modelscope_in_cloud_region_is_set_only_where_modelscope_serves_it() -> None:
    wulanchabu = container_envs(run("large"), "node-0")
    assert wulanchabu["MODELSCOPE_DOWNLOAD_INTRA_CLOUD_REGION"] == "cn-wulanchabu"
    assert wulanchabu["INTRA_CLOUD_ACCELERATION_REGION"] == "cn-wulanchabu"
    hosts = container_envs(run("hosts"), "node-0")  # your own machines: no region, no in-cloud download
    assert not any(name.startswith(("MODELSCOPE_DOWNLOAD", "INTRA_CLOUD")) for name in hosts)
    assert "cn-shenzhen" not in model_cache.INTRA_CLOUD_REGIONS


def test_pulumi_up_reads_the_engines_parallelism_when_the_language_host_passes_it(monkeypatch) -> None:
    from pulumi.runtime import settings

    monkeypatch.setattr(settings.SETTINGS, "parallel", 24, raising=False)
    assert parallelism.engine_slots() == (24, "the engine's --parallel")
    monkeypatch.setattr(settings.SETTINGS, "parallel", None, raising=False)
    monkeypatch.setenv("PULUMI_PARALLEL", "40")
    assert parallelism.engine_slots() == (40, "PULUMI_PARALLEL=40")
    monkeypatch.delenv("PULUMI_PARALLEL")
    assert parallelism.default_slots(cpus=8) == (32, "Pulumi's default 4 x 8 CPUs of this machine")
    assert parallelism.warning(32, 32, "x") is None
    assert "in 2 waves" in (parallelism.warning(33, 32, "x") or "")


# ------------------------------------------------------------------ model_fetch.sh on a fake node (tests/standins)
# The container's Python for the step: the hub client imports, and each download attempt exits with the next code
# of `plan` (then 0), recording its arguments, as huggingface_hub's snapshot_download would succeed or raise.
FAKE_PYTHON = """#!/usr/bin/env bash
state={state}
if [[ "$1" == -c ]]; then exit 0; fi
cat >/dev/null  # the step's program
printf '%s\\n' "${{*:2}}" >>"$state/attempts"
code=$(head -n 1 "$state/plan" 2>/dev/null || echo 0)
sed -i 1d "$state/plan" 2>/dev/null || :
case $code in
  hang) echo "$3: Fetching 3 files" >&2; sleep 60 ;;
  0) echo "$3: 3 files, 1.0 MB in /cache/$3" ;;
  2) echo "$3: RepositoryNotFoundError: 404 Client Error" >&2 ;;
  *) echo "$3: ConnectionError: Read timed out" >&2 ;;
esac
exit "$code"
"""
MODELS = json.dumps([["huggingface", "Qwen/Qwen2.5-0.5B-Instruct", "https://hf-mirror.com"]])


def run_model_step(node: FakeNode, tmp_path: Any, plan: list[Any], **overrides: str) -> Any:
    state = tmp_path / "python-state"
    state.mkdir(exist_ok=True)
    (state / "plan").write_text("".join(f"{code}\n" for code in plan))
    python = tmp_path / "container-python"
    python.write_text(FAKE_PYTHON.format(state=state))
    python.chmod(0o755)
    node.set_state("docker/containers/roll", "true")
    settings = {"CONTAINER_NAME": "roll", "MODELS_JSON": MODELS, "MODEL_TIMEOUT_S": "60",
                "CONTAINER_PYTHON": str(python), "RETRY_DELAY_S": "1", **overrides}
    return node.run_step("model", ["model_fetch.sh"], **settings)


def attempts(tmp_path: Any) -> list[str]:
    path = tmp_path / "python-state" / "attempts"
    return path.read_text().splitlines() if path.exists() else []


def test_the_model_step_retries_a_transient_failure_and_says_where_the_model_is(node, tmp_path) -> None:
    result = run_model_step(node, tmp_path, [1, 1, 0])
    assert_ok(result)
    assert attempts(tmp_path) == ["huggingface Qwen/Qwen2.5-0.5B-Instruct https://hf-mirror.com "] * 3
    assert "Qwen/Qwen2.5-0.5B-Instruct from huggingface (https://hf-mirror.com) is in the cache" in result.output


def test_the_model_step_fails_at_once_naming_itself_and_the_model_when_the_hub_refuses_it(node, tmp_path) -> None:
    result = run_model_step(node, tmp_path, [2])
    assert_failed(result, "model: FAILED: the huggingface hub refused Qwen/Qwen2.5-0.5B-Instruct",
                  "RepositoryNotFoundError: 404 Client Error")  # the download's log tail
    assert len(attempts(tmp_path)) == 1  # not retried


def test_the_model_step_gives_up_after_its_attempts_with_the_log_tail(node, tmp_path) -> None:
    result = run_model_step(node, tmp_path, [1, 1, 1, 1], RETRY_ATTEMPTS="3")
    assert_failed(result, "model: FAILED: downloading Qwen/Qwen2.5-0.5B-Instruct from huggingface failed 3 times",
                  "ConnectionError: Read timed out")
    assert len(attempts(tmp_path)) == 3


def test_the_model_step_is_cut_at_its_bound_naming_the_setting(node, tmp_path) -> None:
    result = run_model_step(node, tmp_path, ["hang"], MODEL_TIMEOUT_S="3")
    assert_failed(result, "model: FAILED: downloading Qwen/Qwen2.5-0.5B-Instruct from huggingface did not finish "
                  "within MODEL_TIMEOUT_S=3s (training.startTimeoutMinutes)", "Fetching 3 files")
    assert len(attempts(tmp_path)) == 1  # not retried: the bound is for all attempts together


def test_the_model_step_with_no_hub_model_downloads_nothing(node, tmp_path) -> None:
    result = run_model_step(node, tmp_path, [], MODELS_JSON="[]")
    assert_ok(result)
    assert "no model named by hub id: nothing to download" in result.output and attempts(tmp_path) == []
