"""vLLM's own configuration checks on the arguments a ROLL vLLM worker hands it, run inside the engine venv
(tests/engines/requirements-vllm-0.8.4.txt), not in the project's .venv.

Reads a JSON list of cases on stdin; writes on stdout's last line {"vllm": version, "results": [...]}, one result
per case: {"name", "ok", "error" (type: message) or "config" (what vLLM settled on)}.

What is stood in, and only that: the device. vLLM's CUDA platform class itself (vllm/platforms/cuda.py
CudaPlatformBase: its check_and_update_config, worker class choice, async output rule) is used with its device
queries answered from the case (compute capability, name, memory, GPU count); `vllm._C`, the compiled kernels that
module imports and that need libcuda, is an empty module. Every rule of EngineArgs.create_engine_config and the
config classes it builds (ModelConfig, CacheConfig, ParallelConfig, SchedulerConfig, ...) is vLLM's own.

A case: {"name", "env": {"VLLM_USE_V1": "0"}, "capability": [7, 0], "device_name", "memory_gib", "gpus",
"engine_args": {...}} where engine_args are what ROLL passes to AsyncEngineArgs (its model a folder holding a
config.json written by the test).
"""

from __future__ import annotations

import json
import os
import sys
import types
from typing import Any

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.modules.setdefault("vllm._C", types.ModuleType("vllm._C"))  # kernels: need libcuda, unused by the checks

import vllm.platforms  # noqa: E402
from vllm.platforms.cuda import CudaPlatformBase  # noqa: E402
from vllm.platforms.interface import DeviceCapability  # noqa: E402


class Device:
    capability = DeviceCapability(7, 0)
    name = "Tesla V100-SXM2-16GB"
    memory = 16 << 30
    count = 1


class StandInCudaPlatform(CudaPlatformBase):
    """vLLM's CUDA platform; only its device queries answer from the case (Device)."""

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
        return Device.capability

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return Device.name

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return Device.memory

    @classmethod
    def is_fully_connected(cls, device_ids: list[int]) -> bool:
        return True


vllm.platforms._current_platform = StandInCudaPlatform()

import vllm.config  # noqa: E402
import vllm.utils  # noqa: E402
from vllm.engine.arg_utils import AsyncEngineArgs  # noqa: E402
from vllm.usage.usage_lib import UsageContext  # noqa: E402


def device_count() -> int:
    return Device.count


vllm.utils.cuda_device_count_stateless = device_count
vllm.config.cuda_device_count_stateless = device_count  # type: ignore[attr-defined]


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    for name, value in case.get("env", {}).items():
        os.environ[name] = str(value)
    Device.capability = DeviceCapability(*case.get("capability", (7, 0)))
    Device.name = case.get("device_name", Device.name)
    Device.memory = int(case.get("memory_gib", 16)) << 30
    Device.count = int(case.get("gpus", 1))
    try:
        # As ROLL's create_async_llm does (roll/third_party/vllm/__init__.py at ROLL 8eb27cc).
        # see verified-facts#vllm-oracle-init
        config = AsyncEngineArgs(**case["engine_args"]).create_engine_config(UsageContext.ENGINE_CONTEXT)
    except Exception as error:  # vLLM's own refusal is the answer
        return {"name": case["name"], "ok": False, "error": f"{type(error).__name__}: {error}"}
    import vllm.envs as envs

    return {
        "name": case["name"],
        "ok": True,
        "config": {
            "use_v1": bool(envs.VLLM_USE_V1),
            "max_model_len": config.model_config.max_model_len,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "chunked_prefill": bool(config.scheduler_config.chunked_prefill_enabled),
            "dtype": str(config.model_config.dtype),
            "enforce_eager": bool(config.model_config.enforce_eager),
            "prefix_caching": bool(config.cache_config.enable_prefix_caching),
            "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
            "worker_cls": config.parallel_config.worker_cls,
        },
    }


def main() -> None:
    cases = json.load(sys.stdin)
    results = [run_case(case) for case in cases]
    print(json.dumps({"vllm": vllm.__version__, "results": results}))


if __name__ == "__main__":
    main()
