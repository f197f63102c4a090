"""Model downloads (issue 21): every node's container caches models on its data disk, so a new container or a
second job of the same model downloads nothing, and ModelScope's in-cloud download is named in its regions."""

from __future__ import annotations

from typing import Any

import pytest
from offline_helpers import run

from devtools.offline_cloud import unwrap
from infra import model_cache, parallelism


def container_envs(result: Any, node: str) -> dict[str, str]:
    return dict(e.split("=", 1) for e in unwrap(result.cloud.named(f"{node}-container").inputs["envs"]))


@pytest.mark.parametrize("stack", ["multi", "hosts"])
def test_every_nodes_container_caches_models_on_its_data_disk_which_the_container_mounts(stack: str) -> None:
    result = run(stack)
    for node in ("node-0", "node-1"):
        envs = container_envs(result, node)
        assert envs["HF_HOME"] == "/data/cache/huggingface"
        assert envs["MODELSCOPE_CACHE"] == "/data/cache/modelscope"
        volumes = unwrap(result.cloud.named(f"{node}-container").inputs["volumes"])
        assert {"hostPath": "/data", "containerPath": "/data"}.items() <= next(
            v for v in volumes if v["containerPath"] == "/data").items()  # the cache outlives the container


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
