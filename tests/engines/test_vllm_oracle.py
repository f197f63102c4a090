"""vLLM's own configuration checks as the oracle for every shipped ROLL stack: the arguments each vLLM worker of
the rendered YAML hands vLLM (as ROLL 8eb27cc's vllm strategy builds them) go through vLLM 0.8.4's
EngineArgs.create_engine_config, the version ROLL's torch260 image installs (docker/Dockerfile.torch260.vllm),
with only the device stood in (tests/helpers/vllm_oracle.py). The venv is built by the test itself, outside the
clone (tests/helpers/engine_venv.py); where it cannot be (no package index) the tests skip saying why, and under
CI (`CI` set) they fail instead.

What this does not cover: whether the KV cache fits in memory, kernels chosen at run time (docs/testing.md).
See verified-facts#test-vllm-oracle-dockerfile-torch260."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import rule_table
import yaml
from engine_venv import EngineVenvUnavailable, ensure_engine_venv
from model_configs import MODEL_CONFIGS
from offline_helpers import run
from omegaconf import OmegaConf

from infra.frameworks import roll_render
from infra.frameworks.roll import v0_budget_problems
from infra.sources.alibaba.catalog import FAMILIES, family_of
from tools.vllm_scheduler_rules import read_sources, scheduler_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REQUIREMENTS = HERE / "requirements-vllm-0.8.4.txt"
ORACLE = HERE.parent / "helpers" / "vllm_oracle.py"
ROLL_STACKS = ("dev", "multi", "large", "hosts")
ORACLE_TIMEOUT_S = 15 * 60  # importing torch and vLLM on 2 busy cores

# The device answers (compute capability) of the GPU models the shipped stacks run on (NVIDIA's CUDA GPUs list).
CAPABILITY = {"V100": (7, 0), "T4": (7, 5), "A10": (8, 6), "A30": (8, 0), "A100": (8, 0), "L20": (8, 9),
              "H20": (9, 0)}

V100_16GB = {"capability": [7, 0], "device_name": "Tesla V100-SXM2-16GB", "memory_gib": 16}


@pytest.fixture(scope="module")
def engine_python() -> Path:
    try:
        return ensure_engine_venv(REQUIREMENTS) / "bin" / "python"
    except EngineVenvUnavailable as error:
        if os.environ.get("CI"):
            pytest.fail(f"vLLM 0.8.4's venv could not be built, and under CI the engine oracle must run: {error}")
        pytest.skip(f"vLLM 0.8.4's venv could not be built here: {error}")


def ask_vllm(python: Path, cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """vLLM's answer for each case, by name (tests/helpers/vllm_oracle.py, run in the engine venv)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "PYTHON", "CUDA_"))}
    result = subprocess.run([str(python), str(ORACLE)], input=json.dumps(cases), capture_output=True, text=True,
                            timeout=ORACLE_TIMEOUT_S, env=env, cwd=HERE)
    assert result.returncode == 0, f"the oracle failed to run:\n{result.stderr[-4000:]}"
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["vllm"] == "0.8.4"
    return {item["name"]: item for item in answer["results"]}


def model_folder(root: Path, model_id: str) -> str:
    assert model_id in MODEL_CONFIGS, f"the oracle has no config.json for {model_id!r}: add its public values"
    folder = root / model_id.replace("/", "--")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(MODEL_CONFIGS[model_id]))
    return str(folder)


def roll_engine_args(pipeline: dict[str, Any], worker: dict[str, Any], model_dir: str) -> tuple[str, dict[str, Any]]:
    """VLLM_USE_V1 and the AsyncEngineArgs a ROLL 8eb27cc vLLM worker builds from its section of the YAML:
    roll/distributed/strategy/vllm_strategy.py (initialize) then roll/third_party/vllm/__init__.py
    (create_async_llm). The model is the folder holding the test's config.json; skip_tokenizer_init stands in for
    the tokenizer files that folder lacks. See verified-facts#test-vllm-oracle-vllm-strategy."""
    strategy_config = (worker.get("strategy_args") or {}).get("strategy_config") or {}
    vllm_config = copy.deepcopy(strategy_config)
    use_v1 = str(vllm_config.pop("VLLM_USE_V1", 1))
    vllm_config.pop("sleep_level", None)
    assert vllm_config.get("data_parallel_size", 1) == 1, "vLLM data parallelism is not modelled here"
    model_args = worker.get("model_args") or {}
    dtype = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}.get(model_args.get("dtype", "bf16"), "auto")
    vllm_config.update({
        "model": model_dir,
        "dtype": dtype,
        "enforce_eager": vllm_config.get("enforce_eager", False),
        "trust_remote_code": True,
        "seed": pipeline.get("seed", 42),
        "disable_custom_all_reduce": vllm_config.get("disable_custom_all_reduce", True),
        "enable_prefix_caching": vllm_config.get("enable_prefix_caching", True),
        "load_format": vllm_config.get("load_format", "dummy"),
        "max_num_batched_tokens": vllm_config.get("max_num_batched_tokens", 8192),
    })
    if model_args.get("lora_target") is not None:
        vllm_config.update({"enable_lora": True, "max_loras": 1, "max_lora_rank": model_args.get("lora_rank"),
                            "load_format": "auto"})
    vllm_config["enable_sleep_mode"] = True
    vllm_config.setdefault("worker_extension_cls", "roll.third_party.vllm.worker.WorkerV1" if use_v1 not in
                           ("0", "False", "false") else "roll.third_party.vllm.worker.WorkerBase")
    vllm_config["skip_tokenizer_init"] = True
    return use_v1, vllm_config


def stack_gpus(stack: str) -> list[dict[str, Any]]:
    """The device answers for every GPU model the stack may get (each instance type it lists, or its hosts')."""
    nodes = yaml.safe_load((ROOT / f"Pulumi.{stack}.yaml").read_text())["config"]["roll-cluster:nodes"]
    models: list[tuple[str, int]] = []
    if nodes.get("source") == "hosts":
        models.append((nodes["acceleratorModel"], 24))
    for type_name in nodes.get("instanceTypes", []):
        family = FAMILIES[family_of(type_name) or ""]
        models.append((family.gpu_model, family.gpu_memory_gb))
    answers = []
    for model, memory in models:
        short = next((name for name in CAPABILITY if name in model.split()), None)
        assert short is not None, f"no compute capability known for {model!r} ({stack}): add it to CAPABILITY"
        answers.append({"capability": list(CAPABILITY[short]), "device_name": model, "memory_gib": memory})
    return answers


def rendered_pipeline(stack: str, config: dict[str, Any] | None = None) -> dict[str, Any]:
    text = run(stack, config=config or {}).notes["job_spec"].rendered_config
    assert text is not None
    resolved = OmegaConf.to_container(OmegaConf.create(yaml.safe_load(text)), resolve=True)
    assert isinstance(resolved, dict)
    return {str(k): v for k, v in resolved.items()}


def vllm_workers(pipeline: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(name, worker) for name, worker in roll_render.workers(pipeline)
            if (worker.get("strategy_args") or {}).get("strategy_name") == "vllm"]


def worker_cases(stack: str, pipeline: dict[str, Any], models: Path) -> list[dict[str, Any]]:
    cases = []
    for name, worker in vllm_workers(pipeline):
        model_id = (worker.get("model_args") or {}).get("model_name_or_path") or pipeline["pretrain"]
        use_v1, engine_args = roll_engine_args(pipeline, worker, model_folder(models, model_id))
        strategy_config = (worker.get("strategy_args") or {}).get("strategy_config") or {}
        gpus = int(strategy_config.get("tensor_parallel_size", 1)) * int(strategy_config.get(
            "pipeline_parallel_size", 1))
        for device in stack_gpus(stack):
            label = f"{stack}/{name}/{device['device_name']} {device['memory_gib']} GB"
            cases.append({"name": label, "env": {"VLLM_USE_V1": use_v1}, "gpus": gpus, "engine_args": engine_args,
                          **device})
    return cases


def test_every_shipped_roll_stacks_vllm_workers_pass_vllms_own_checks(engine_python: Path, tmp_path: Path) -> None:
    cases: list[dict[str, Any]] = []
    for stack in ROLL_STACKS:
        found = worker_cases(stack, rendered_pipeline(stack), tmp_path)
        assert found, f"{stack}: no vLLM worker in the rendered YAML"
        cases += found
    answers = ask_vllm(engine_python, cases)
    refused = {name: answer["error"] for name, answer in answers.items() if not answer["ok"]}
    assert not refused, f"vLLM 0.8.4 refuses these workers' arguments: {json.dumps(refused, indent=1)}"
    for stack in ("dev", "multi"):  # V100: the V0 engine, within ROLL's token budget, no chunked prefill
        settled = [a["config"] for n, a in answers.items() if n.startswith(f"{stack}/")]
        assert settled and all(not c["use_v1"] and c["max_model_len"] <= c["max_num_batched_tokens"]
                               and not c["chunked_prefill"] and c["dtype"] == "torch.float16" for c in settled)


def todays_dev_worker(pipeline: dict[str, Any]) -> dict[str, Any]:
    """dev's actor_infer as the program rendered it before the V0 token budget was fitted (ff86bee): VLLM_USE_V1 0
    and prefix caching off, no max_model_len."""
    worker = copy.deepcopy(pipeline["actor_infer"])
    for added in ("max_model_len", "enforce_eager", "max_num_batched_tokens"):
        worker["strategy_args"]["strategy_config"].pop(added, None)
    return worker


def test_vllm_refuses_todays_dev_and_the_plans_own_rule_agrees_case_by_case(engine_python: Path,
                                                                             tmp_path: Path) -> None:
    """The oracle can fail: dev's V0 worker as rendered before this fix is refused by vLLM itself, as the issue
    reports. The plan-time rule (RollAdapter's v0_budget_problems) agrees with vLLM on every variant."""
    pipeline = rendered_pipeline("dev")
    model = model_folder(tmp_path, pipeline["pretrain"])
    base = todays_dev_worker(pipeline)
    variants: dict[str, dict[str, Any]] = {
        "todays-dev": {},
        "sequence-length": {"max_model_len": 4096},
        "beyond-the-budget": {"max_model_len": 16384},
        "budget-raised": {"max_model_len": 16384, "max_num_batched_tokens": 16384},
        "chunked-prefill": {"max_model_len": 16384, "enable_chunked_prefill": True},
    }
    cases = []
    for name, change in variants.items():
        worker = copy.deepcopy(base)
        worker["strategy_args"]["strategy_config"].update(change)
        use_v1, engine_args = roll_engine_args(pipeline, worker, model)
        cases.append({"name": name, "env": {"VLLM_USE_V1": use_v1}, "engine_args": engine_args, **V100_16GB})
    cases.append({**cases[1], "name": "v1-on-v100", "env": {"VLLM_USE_V1": "1"}})
    answers = ask_vllm(engine_python, cases)

    assert answers["todays-dev"]["error"].startswith(
        "ValueError: max_num_batched_tokens (8192) is smaller than max_model_len (32768)")
    assert answers["v1-on-v100"]["error"].startswith("NotImplementedError: VLLM_USE_V1=1 is not supported")
    for name, change in variants.items():
        worker = copy.deepcopy(base)
        worker["strategy_args"]["strategy_config"].update(change)
        strategy_config = worker["strategy_args"]["strategy_config"]
        plan_refuses = bool(v0_budget_problems("actor_infer", strategy_config))
        assert plan_refuses == (not answers[name]["ok"]), (name, answers[name])
        # The rule table generated from vLLM 0.8.4's source (what judges the engines that cannot run here) agrees
        # with vLLM itself. V0 turns chunked prefill on only above 32K tokens (arg_utils.py).
        # see verified-facts#test-vllm-oracle-arg-utils
        max_model_len = strategy_config.get("max_model_len", MODEL_CONFIGS[pipeline["pretrain"]][
            "max_position_embeddings"])
        chunked = strategy_config.get("enable_chunked_prefill", max_model_len > 32768)
        table_refuses = any(v.violated for v in rule_table.verdicts("0.8.4", {
            "max_model_len": max_model_len, "enable_chunked_prefill": chunked, "chunked_prefill_enabled": chunked,
            "max_num_batched_tokens": strategy_config.get("max_num_batched_tokens", 8192)}))
        assert table_refuses == (not answers[name]["ok"]), (name, answers[name])


def test_the_rule_table_of_vllm_0_8_4_is_what_the_tool_reads_from_the_installed_vllm(engine_python: Path) -> None:
    """tools/vllm_scheduler_rules.py on the engine venv's own vLLM gives the committed table's 0.8.4 entry, rule for
    rule (the other versions' entries were generated the same way from their wheels)."""
    packages = sorted((engine_python.parent.parent / "lib").glob("python3*/site-packages/vllm"))
    assert len(packages) == 1, packages
    package = packages[0]
    committed = rule_table.load()["0.8.4"]
    assert {k: v for k, v in committed.items() if k != "used_by"} == scheduler_table(read_sources(package))

