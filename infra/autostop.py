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

import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from infra.config import DEFAULT_PIP_INDEX, ClusterConfig
from infra.cost import autostop_note
from infra.economical import stopped_mode
from infra.layout import SHARED_MOUNT
from infra.node.remote import SCRIPTS_DIR
from infra.permissions import permission_lines
from infra.ray.step_env import RAY_COMMON_SCRIPT

STACK_TAG = "roll-cluster-stack"  # the tag every instance carries (components/alibaba/gpu_node.py)
AUTOSTOP_SCRIPTS = (RAY_COMMON_SCRIPT, "autostop.sh")
STOP_ACTIONS = ("ecs:StopInstances", "ecs:StopInstance")  # the batch API the watcher calls, and its single form
STOPPER = SCRIPTS_DIR / "stop_instances.py"  # runs on the head host with Alibaba's SDK (autostop.sh)
SDK_REQUIREMENTS = SCRIPTS_DIR / "autostop-requirements.txt"
# RAM names: RoleName 1-64 characters (letters, digits, `.`, `-`); PolicyName 1-128 (letters, digits, `-`)
# (Alibaba RAM API, CreateRole and CreatePolicy; UNCONFIRMED beyond those pages). One name serves both: 64.
RAM_NAME_MAX = 64
RAM_NAME_SUFFIX = "-autostop"
# How long the program waits between creating the role (with its policy) and attaching it to the head: RAM is
# eventually consistent, and the provider's AttachInstanceRamRole retries only throttling (terraform-provider-
# alicloud resource_alicloud_ecs_ram_role_attachment.go). The lag's length is UNCONFIRMED; seconds in practice.
ROLE_SETTLE_S = 20


def role_name(project: str, stack: str, region: str) -> str:
    """The role's and its policy's name: RAM names are account-wide, so they hold the project, the stack and the
    region. The readable part is cut to fit RAM's 64 characters; the hash of all three, which makes the name unique
    per (project, stack, region), is never cut."""
    digest = hashlib.sha256("\0".join((project, stack, region)).encode()).hexdigest()[:10]
    readable = re.sub(r"[^A-Za-z0-9-]+", "-", f"roll-cluster-{stack}-{region}").strip("-")
    room = RAM_NAME_MAX - len(RAM_NAME_SUFFIX) - len(digest) - 1
    return f"{readable[:room].rstrip('-')}-{digest}{RAM_NAME_SUFFIX}"


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


def file_b64(path: Path) -> str:
    """A file the step carries, as one line (step environments are one `export` line per variable)."""
    return base64.b64encode(path.read_bytes()).decode()


def watcher_env(
    config: ClusterConfig, instance_ids: list[str], region: str, ram_role: str, instance_type: str = ""
) -> dict[str, str]:
    """The autostop step's environment (infra/scripts/autostop.sh documents each variable). It names no job: the
    watcher reads the current job's id on the head (the job step records it), so a new job leaves this step as it
    is."""
    auto = config.nodes.autostop
    env = {
        "AUTOSTOP_ACTION": "install",
        "AUTOSTOP_MODE": "instances" if config.nodes.capabilities.autostop_stops_machines else "ray",
        "AUTOSTOP_AFTER_JOB_MINUTES": str(auto.after_job_minutes or 0),
        "AUTOSTOP_IDLE_MINUTES": str(auto.idle_minutes or 0),
        "CONTAINER_NAME": config.container.name,
        "DASHBOARD_PORT": str(config.ray.dashboard_port),
    }
    if config.nodes.capabilities.autostop_stops_machines:
        env.update(INSTANCE_IDS=" ".join(instance_ids), REGION_ID=region, RAM_ROLE=ram_role,
                   STOPPED_MODE=stopped_mode(instance_type),
                   AUTOSTOP_STOPPER_B64=file_b64(STOPPER), AUTOSTOP_SDK_REQUIREMENTS_B64=file_b64(SDK_REQUIREMENTS),
                   PIP_INDEX_URL=DEFAULT_PIP_INDEX)
    return env


SPOT_NOTICE_SCRIPTS = ("spot_notice.sh",)


def reclaim_dir(config: ClusterConfig, stack: str) -> str:
    """Where spot nodes record Alibaba's reclaim notice (infra/scripts/spot_notice.sh) and `jobStatus` looks: on
    the shared storage, the same path on every host and in every container. Empty: no spot node, or no shared
    storage to carry a worker's notice to the head (then jobStatus cannot say RECLAIMED)."""
    if not config.nodes.spot or not config.storage.shared or not config.nodes.capabilities.spot:
        return ""
    return f"{SHARED_MOUNT}/.roll-cluster/reclaimed/{stack}"


def spot_nodes(config: ClusterConfig) -> list[int]:
    """The ranks that are spot instances (components/alibaba/gpu_node.py: the head only with nodes.spotHead or
    alone)."""
    if not config.nodes.spot or not config.nodes.capabilities.spot:
        return []
    return [rank for rank in range(config.nodes.count) if rank > 0 or config.nodes.head_on_spot]


def plan_lines(config: ClusterConfig) -> list[str]:
    """The plan's section on autostop and permissions (devtools/plan.py): when the cluster stops by itself, and
    what RAM must allow for a first `pulumi up` of this stack, feature by feature (infra/permissions.py)."""
    return [f"  autostop      {autostop_note(config)}",
            "  permissions   what a first `pulumi up` needs, per feature:",
            *permission_lines(config)]
