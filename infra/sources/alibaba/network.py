"""The cluster's network: one VPC, one vSwitch in the chosen zone, and a hardened security group.

Inbound, only: every TCP/UDP port between members of the group (Ray and NCCL pick ports at random), SSH from
`access.adminCidrs`, and the Ray dashboard from `access.adminCidrs` when `access.dashboard` is `admin-cidrs`.
Nothing is opened to 0.0.0.0/0 unless the user opted in with `access.allowWorld`.

Sticky placement: the vSwitch is created in the zone chosen at the first `pulumi up` and records the chosen
instance type in a tag. Both are in ignore_changes, and the nodes read zone and type back from the vSwitch's
state, so a later `pulumi up` after stock moved keeps the existing vSwitch and nodes (and adds new nodes of the
same type in the same zone) instead of replacing the cluster. To move a cluster on purpose:
`pulumi up --replace <vSwitch URN>` (or destroy and up).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

import pulumi
import pulumi_alicloud as alicloud

INSTANCE_TYPE_TAG = "roll-cluster-instance-type"
VPC_CIDR = "10.20.0.0/16"
VSWITCH_CIDR = "10.20.0.0/20"  # 4096 addresses: room for 256 nodes and the NAS mount target


@dataclass(frozen=True)
class NetworkArgs:
    stack: str
    zone: str
    instance_type: str
    admin_cidrs: list[str]
    dashboard_port: int
    dashboard_open_to_admins: bool


@dataclass(frozen=True)
class IngressRule:
    """One inbound rule, as the plan shows it and the tests check it."""

    name: str
    protocol: str
    ports: str
    source: str
    description: str


def ingress_rules(args: NetworkArgs) -> list[IngressRule]:
    rules = [
        IngressRule("intra-tcp", "tcp", "1/65535", "this security group", "Ray, NCCL and Gloo between nodes"),
        IngressRule("intra-udp", "udp", "1/65535", "this security group", "NCCL and Gloo between nodes"),
    ]
    for index, cidr in enumerate(args.admin_cidrs):
        rules.append(IngressRule(f"ssh-{index}", "tcp", "22/22", cidr, "SSH from an admin CIDR"))
        if args.dashboard_open_to_admins:
            port = f"{args.dashboard_port}/{args.dashboard_port}"
            rules.append(IngressRule(f"dashboard-{index}", "tcp", port, cidr, "Ray dashboard from an admin CIDR"))
    return rules


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    vswitch_id: pulumi.Output[str]
    vswitch_cidr: str
    security_group_id: pulumi.Output[str]
    zone: pulumi.Output[str]
    instance_type: pulumi.Output[str]
    rules: list[IngressRule]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = {"roll-cluster-stack": args.stack}
        vpc = alicloud.vpc.Network(
            f"{name}-vpc", vpc_name=f"roll-cluster-{args.stack}", cidr_block=VPC_CIDR, tags=tags, opts=child
        )
        vswitch = alicloud.vpc.Switch(
            f"{name}-vswitch",
            vpc_id=vpc.id,
            cidr_block=VSWITCH_CIDR,
            zone_id=args.zone,
            vswitch_name=f"roll-cluster-{args.stack}",
            tags={**tags, INSTANCE_TYPE_TAG: args.instance_type},
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["zoneId", "tags"]),
        )
        group = alicloud.ecs.SecurityGroup(
            f"{name}-sg",
            security_group_name=f"roll-cluster-{args.stack}",
            vpc_id=vpc.id,
            security_group_type="normal",
            # Members reach each other through the explicit intra-group rules below, visible in the plan.
            inner_access_policy="Drop",
            description="roll-cluster: Ray and NCCL inside the group; SSH and dashboard from admin CIDRs only",
            tags=tags,
            opts=child,
        )
        self.rules = ingress_rules(args)
        for rule in self.rules:
            source_is_group = rule.source == "this security group"
            is_v6 = not source_is_group and ipaddress.ip_network(rule.source).version == 6
            alicloud.ecs.SecurityGroupRule(
                f"{name}-{rule.name}",
                type="ingress",
                ip_protocol=rule.protocol,
                port_range=rule.ports,
                security_group_id=group.id,
                source_security_group_id=group.id if source_is_group else None,
                cidr_ip=None if source_is_group or is_v6 else rule.source,
                ipv6_cidr_ip=rule.source if is_v6 else None,
                nic_type="intranet",
                policy="accept",
                priority=1,
                description=rule.description,
                opts=child,
            )
        self.vpc_id = vpc.id
        self.vswitch_id = vswitch.id
        self.vswitch_cidr = VSWITCH_CIDR
        self.security_group_id = group.id
        # Read back from state: unchanged after the first up even if the chosen zone or type moved.
        self.zone = vswitch.zone_id
        self.instance_type = vswitch.tags.apply(lambda t: (t or {}).get(INSTANCE_TYPE_TAG, args.instance_type))
        self.register_outputs(
            {"vpcId": self.vpc_id, "vswitchId": self.vswitch_id, "securityGroupId": self.security_group_id}
        )
