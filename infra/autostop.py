"""Autostop (nodes.autostop): the head's RAM role and its policy, as data, and the watcher step's settings.

The head stops the cluster with the temporary credentials of an instance RAM role (the metadata service's STS
credentials: never a long-lived key on a node). The role may do one thing: ECS StopInstances on instances that
carry this stack's tag. Tag conditions in RAM policies: `acs:ResourceTag/<key>` on `acs:ecs:*:*:instance/*`
(Alibaba, "Manage resource permissions with tags", www.alibabacloud.com/help/en/ecs/user-guide/manage-resource-
permissions-with-tags). The older ECS-specific key `ecs:tag/<key>` is UNCONFIRMED and not used. Whether ECS
evaluates the tag condition for every instance of one StopInstances call is UNCONFIRMED; the watcher names only
this stack's instances anyway (INSTANCE_IDS).
"""

from __future__ import annotations

import json
import re
from typing import Any

from infra.config import ClusterConfig
from infra.layout import SHARED_MOUNT
from infra.ray.commands import RAY_COMMON_SCRIPT

STACK_TAG = "roll-cluster-stack"  # the tag every instance carries (components/gpu_node.py)
AUTOSTOP_SCRIPTS = (RAY_COMMON_SCRIPT, "autostop.sh")
STOP_ACTIONS = ("ecs:StopInstances", "ecs:StopInstance")  # the batch API the watcher calls, and its single form


def role_name(stack: str) -> str:
    """RAM role names: letters, digits, `.` and `-`, at most 64 characters (UNCONFIRMED beyond the console's hint)."""
    return ("roll-cluster-" + re.sub(r"[^A-Za-z0-9.-]", "-", stack))[:55] + "-autostop"


def assume_role_policy(stack: str) -> str:
    """Who may take the role: the ECS service, on behalf of the instance it is attached to."""
    del stack
    return json.dumps({"Version": "1", "Statement": [
        {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": ["ecs.aliyuncs.com"]}}]})


def stop_policy(stack: str) -> dict[str, Any]:
    """The role's only permission: stop instances tagged with this stack."""
    return {
        "Version": "1",
        "Statement": [{
            "Effect": "Allow",
            "Action": list(STOP_ACTIONS),
            "Resource": "acs:ecs:*:*:instance/*",
            "Condition": {"StringEquals": {f"acs:ResourceTag/{STACK_TAG}": [stack]}},
        }],
    }


def watcher_env(config: ClusterConfig, job_id: str, instance_ids: list[str], region: str, stack: str) -> dict[str, str]:
    """The autostop step's environment (infra/scripts/autostop.sh documents each variable)."""
    auto = config.nodes.autostop
    env = {
        "AUTOSTOP_ACTION": "install",
        "AUTOSTOP_MODE": "ray" if config.nodes.source == "hosts" else "instances",
        "AUTOSTOP_AFTER_JOB_MINUTES": str(auto.after_job_minutes or 0),
        "AUTOSTOP_IDLE_MINUTES": str(auto.idle_minutes or 0),
        "CONTAINER_NAME": config.container.name,
        "DASHBOARD_PORT": str(config.ray.dashboard_port),
        "JOB_ID": job_id,
    }
    if config.nodes.source != "hosts":
        env.update(INSTANCE_IDS=" ".join(instance_ids), REGION_ID=region, RAM_ROLE=role_name(stack))
    return env


SPOT_NOTICE_SCRIPTS = ("spot_notice.sh",)


def reclaim_dir(config: ClusterConfig, stack: str) -> str:
    """Where spot nodes record Alibaba's reclaim notice (infra/scripts/spot_notice.sh) and `jobStatus` looks: on
    the shared storage, the same path on every host and in every container. Empty: no spot node, or no shared
    storage to carry a worker's notice to the head (then jobStatus cannot say RECLAIMED)."""
    if not config.nodes.spot or not config.storage.shared or config.nodes.source == "hosts":
        return ""
    return f"{SHARED_MOUNT}/.roll-cluster/reclaimed/{stack}"


def spot_nodes(config: ClusterConfig) -> list[int]:
    """The ranks that are spot instances (components/gpu_node.py: the head only with nodes.spotHead or alone)."""
    if not config.nodes.spot or config.nodes.source == "hosts":
        return []
    return [rank for rank in range(config.nodes.count) if rank > 0 or config.nodes.head_on_spot]
