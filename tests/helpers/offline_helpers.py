"""Helpers for tests that run the real program under the offline cloud (devtools/offline_cloud.py)."""

from __future__ import annotations

from typing import Any

from devtools.offline_cloud import OfflineCloud, OfflineRun, Registered, run_program, unwrap
from infra.node import remote
from infra.node.steps import StepRecord

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


def ancestors(records: list[StepRecord], key: str) -> set[str]:
    """Every step the step `key` waits for, directly or through others."""
    by_key = {r.key: r for r in records}
    found: set[str] = set()
    pending = list(by_key[key].depends_on)
    while pending:
        current = pending.pop()
        if current not in found:
            found.add(current)
            pending += list(by_key[current].depends_on) if current in by_key else []
    return found
