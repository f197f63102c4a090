"""How the real-host tier obtains the commands it runs: the environments from infra.ray.step_env, rendered by
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
from infra.ray import step_env


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


def _render(
    step: step_env.StepScripts, host: TestHost, env: Mapping[str, str], secrets: Mapping[str, str] | None
) -> str:
    return render_plain(step.step, step.scripts, {**env, "NODE_NAME": host.name, **(secrets or {})},
                        library=hosts_library())


def head(settings: step_env.RaySettings, host: TestHost, secrets: Mapping[str, str] | None = None) -> str:
    return _render(step_env.HEAD_STEP, host, step_env.head_env(settings, host.ip), secrets)


def worker(
    settings: step_env.RaySettings, host: TestHost, head_ip: str, rank: int, secrets: Mapping[str, str] | None = None
) -> str:
    return _render(step_env.WORKER_STEP, host, step_env.worker_env(settings, host.ip, head_ip, rank), secrets)


def ready(settings: step_env.RaySettings, head_host: TestHost, node_ips: Sequence[str]) -> str:
    return _render(step_env.READY_STEP, head_host, step_env.ready_env(settings, head_host.ip, node_ips), {})


def ray_stop(settings: step_env.RaySettings, host: TestHost) -> str:
    return _render(step_env.RAY_STOP_STEP, host, step_env.ray_stop_env(settings), {})


def submit(
    settings: step_env.RaySettings, head_host: TestHost, job: step_env.JobSubmission,
    secrets: Mapping[str, str] | None = None,
) -> str:
    return _render(step_env.submit_step(job), head_host, step_env.submit_env(settings, job), secrets)


def job_stop(settings: step_env.RaySettings, head_host: TestHost, job_id: str) -> str:
    return _render(step_env.JOB_STOP_STEP, head_host, step_env.job_stop_env(settings, job_id), {})


def reward_server(settings: step_env.RaySettings, head_host: TestHost, reward: step_env.RewardServer) -> str:
    return _render(step_env.REWARD_SERVER_STEP, head_host, step_env.reward_server_env(settings, reward), {})


def reward_stop(settings: step_env.RaySettings, head_host: TestHost) -> str:
    return _render(step_env.REWARD_STOP_STEP, head_host, step_env.reward_stop_env(settings), {})
