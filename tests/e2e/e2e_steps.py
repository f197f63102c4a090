"""How the real-host tier obtains the commands it runs: the environments from infra.ray.commands, rendered by
infra.node.remote.render_plain exactly as the Pulumi components render them. This is the one place to change when
the tier takes its commands from the Pulumi program under mocks instead; the harness only runs strings.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from e2e_docker import CACHE_ROOT
from e2e_harness import TestHost

from infra.node.remote import local_library, render_plain
from infra.ray import commands as rc


def hosts_library() -> str:
    """The staged script library where the hosts see it: the repository may lie under /tmp (a CI clone), and every
    host mounts a private /tmp; the tier's cache (beside the test image) is shared with them and outlives a run
    (commands may be rendered before the session's hosts start and wipe the tier's state)."""
    source = Path(local_library())
    target = CACHE_ROOT / "library" / source.name  # the name is the library's hash: a changed script, a new copy
    if not target.is_dir():
        staging = target.with_name(target.name + ".copying")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(source, staging)
        staging.rename(target)
    return str(target)


def _render(step: rc.StepScripts, host: TestHost, env: Mapping[str, str], secrets: Mapping[str, str] | None) -> str:
    return render_plain(step.step, step.scripts, {**env, "NODE_NAME": host.name, **(secrets or {})},
                        library=hosts_library())


def head(settings: rc.RaySettings, host: TestHost, secrets: Mapping[str, str] | None = None) -> str:
    return _render(rc.HEAD_STEP, host, rc.head_env(settings, host.ip), secrets)


def worker(
    settings: rc.RaySettings, host: TestHost, head_ip: str, rank: int, secrets: Mapping[str, str] | None = None
) -> str:
    return _render(rc.WORKER_STEP, host, rc.worker_env(settings, host.ip, head_ip, rank), secrets)


def ready(settings: rc.RaySettings, head_host: TestHost, node_ips: Sequence[str]) -> str:
    return _render(rc.READY_STEP, head_host, rc.ready_env(settings, head_host.ip, node_ips), {})


def ray_stop(settings: rc.RaySettings, host: TestHost) -> str:
    return _render(rc.RAY_STOP_STEP, host, rc.ray_stop_env(settings), {})


def submit(
    settings: rc.RaySettings, head_host: TestHost, job: rc.JobSpec, secrets: Mapping[str, str] | None = None
) -> str:
    return _render(rc.submit_step(job), head_host, rc.submit_env(settings, job), secrets)


def job_stop(settings: rc.RaySettings, head_host: TestHost, job_id: str) -> str:
    return _render(rc.JOB_STOP_STEP, head_host, rc.job_stop_env(settings, job_id), {})


def reward_server(settings: rc.RaySettings, head_host: TestHost, reward: rc.RewardServer) -> str:
    return _render(rc.REWARD_SERVER_STEP, head_host, rc.reward_server_env(settings, reward), {})


def reward_stop(settings: rc.RaySettings, head_host: TestHost) -> str:
    return _render(rc.REWARD_STOP_STEP, head_host, rc.reward_stop_env(settings), {})
