"""What a RAM user needs to run the first `pulumi up` of a stack, feature by feature (the plan lists it;
docs/operations.md, 'Permissions', explains it).

Each feature names the RAM actions the alicloud provider calls for its resources (terraform-provider-alicloud, the
resource files named in docs/verified-facts.md) and, where one exists, the Alibaba system policy that grants them
all. Which exact actions every provider Read and Delete call needs is UNCONFIRMED beyond the files cited; the
system policies are the safe grant. Nothing here can be checked offline: whether the caller holds these
permissions is known only to RAM (there is no offline policy simulator); the program creates the autostop role, its
policy and their attachment, all free, before the role is given to the head.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from infra.config import ClusterConfig


@dataclass(frozen=True)
class Permission:
    feature: str  # what needs it, in the config's words
    policy: str  # the Alibaba system policy that grants it ("" when none does on its own)
    actions: tuple[str, ...]


BASE = Permission(
    "every Alibaba stack (VPC, vSwitch, security group, instances, disks, pause)",
    "AliyunECSFullAccess + AliyunVPCFullAccess",
    ("ecs:RunInstances", "ecs:DescribeInstances", "ecs:StopInstance", "ecs:StartInstance", "ecs:DeleteInstance",
     "ecs:DescribeAvailableResource", "ecs:DescribeInstanceTypes", "ecs:DescribeImages", "ecs:DescribeDisks",
     "ecs:CreateSecurityGroup", "ecs:AuthorizeSecurityGroup", "ecs:DeleteSecurityGroup", "ecs:TagResources",
     "vpc:CreateVpc", "vpc:DeleteVpc", "vpc:CreateVSwitch", "vpc:DeleteVSwitch", "vpc:DescribeVSwitches"),
)
PRICES = Permission(
    "placement by price (a new cluster picks the cheapest type with stock)",
    "AliyunBSSReadOnlyAccess",
    ("bss:DescribePrice",),
)
NAS = Permission(
    "storage.nas",
    "AliyunNASFullAccess",
    ("nas:CreateFileSystem", "nas:DeleteFileSystem", "nas:CreateMountTarget", "nas:DeleteMountTarget",
     "nas:CreateAccessRule", "nas:DeleteAccessRule", "nas:DescribeFileSystems"),
)
# The role's own resources (alicloud ram Role, Policy, RolePolicyAttachment) and its attachment to the head (ecs
# RamRoleAttachment: AttachInstanceRamRole, DescribeInstanceRamRole, DetachInstanceRamRole). Giving an instance a
# role needs ram:PassRole on that role; AliyunECSFullAccess does not grant it.
AUTOSTOP = Permission(
    "nodes.autostop (the head's RAM role that may stop this stack's instances)",
    "AliyunRAMFullAccess (or the actions listed)",
    ("ram:CreateRole", "ram:GetRole", "ram:DeleteRole", "ram:CreatePolicy", "ram:GetPolicy", "ram:DeletePolicy",
     "ram:ListPolicyVersions", "ram:AttachPolicyToRole", "ram:DetachPolicyFromRole", "ram:ListPoliciesForRole",
     "ram:ListTagResources", "ram:PassRole", "ecs:AttachInstanceRamRole", "ecs:DescribeInstanceRamRole",
     "ecs:DetachInstanceRamRole"),
)
BAKE = Permission(
    "nodes.bake (an image of the prepared head)",
    "AliyunECSFullAccess",
    ("ecs:CreateImage", "ecs:DescribeImages", "ecs:DeleteImage", "ecs:DescribeSnapshots"),
)


def needed(config: ClusterConfig) -> list[Permission]:
    """The permissions this stack's features need, in the order the first `up` uses them. Own hosts: none."""
    if not config.nodes.capabilities.permissions:
        return []
    found = [BASE, PRICES]
    if config.storage.nas:
        found.append(NAS)
    if config.nodes.autostop.enabled:
        found.append(AUTOSTOP)
    if config.nodes.bake:
        found.append(BAKE)
    return found


def permission_lines(config: ClusterConfig) -> list[str]:
    """The plan's lines: one per feature, its system policy, then its actions."""
    permissions = needed(config)
    if not permissions:
        return ["  none in any cloud: your own hosts (nodes.source hosts)"]
    lines = []
    for permission in permissions:
        lines.append(f"  {permission.feature}: {permission.policy}")
        lines += textwrap.wrap(", ".join(permission.actions), 116, initial_indent="    ", subsequent_indent="    ")
    lines.append("  (not checked offline: only RAM knows what the caller may do; docs/operations.md, 'Permissions')")
    return lines
