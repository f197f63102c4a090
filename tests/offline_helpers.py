"""Helpers for tests that run the real program under the offline cloud (infra/offline.py)."""

from __future__ import annotations

from typing import Any

from infra.offline import OfflineCloud, OfflineRun, Registered, run_program, unwrap

INSTANCE = "alicloud:ecs/instance:Instance"
RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"
REMOTE = "command:remote:Command"
LOCAL = "command:local:Command"


def run(stack: str = "dev", **kwargs: Any) -> OfflineRun:
    return run_program(stack, **kwargs)


def custom_resources(cloud: OfflineCloud) -> list[Registered]:
    return [r for r in cloud.resources if r.custom]


def step_command(result: OfflineRun, resource_name: str) -> str:
    return str(unwrap(result.cloud.named(resource_name).inputs["create"]))


def env_of(command_text: str) -> dict[str, str]:
    """The variables a rendered step exports (see infra/node/remote.py)."""
    import shlex

    env = {}
    for line in command_text.splitlines():
        if line.startswith("export "):
            key, _, value = line[len("export "):].partition("=")
            env[key] = shlex.split(value)[0] if value else ""
        elif line.startswith("exec "):
            break
    return env
