"""Helpers for tests that run the real program under the offline cloud (devtools/offline_cloud.py)."""

from __future__ import annotations

from typing import Any

from devtools.offline_cloud import OfflineCloud, OfflineRun, Registered, run_program, unwrap
from infra.node import remote

INSTANCE = "alicloud:ecs/instance:Instance"
RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"
REMOTE = "command:remote:Command"
LOCAL = "command:local:Command"


def run(stack: str = "dev", **kwargs: Any) -> OfflineRun:
    return run_program(stack, **kwargs)


def custom_resources(cloud: OfflineCloud) -> list[Registered]:
    return [r for r in cloud.resources if r.custom]


def step_command(result: OfflineRun, resource_name: str) -> str:
    """A step's text: what a remote step sends on stdin (infra/node/remote.py), else its command."""
    inputs = result.cloud.named(resource_name).inputs
    return str(unwrap(inputs.get("stdin", inputs["create"])))


def env_of(command_text: str) -> dict[str, str]:
    return remote.exported_env(command_text)
