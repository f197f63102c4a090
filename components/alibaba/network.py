"""The cluster's network: one VPC, one vSwitch in the chosen zone, and a hardened security group.

Inbound, only: every TCP/UDP port between members of the group (Ray and NCCL pick ports at random), SSH from
`access.adminCidrs`, and the Ray dashboard from `access.adminCidrs` when `access.dashboard` is `admin-cidrs`.
Nothing is opened to 0.0.0.0/0 unless the user opted in with `access.allowWorld`.

Sticky placement: the vSwitch is created in the zone chosen at the first `pulumi up` and records the chosen
instance type and the placement generation in tags; placement.py finds it at plan time and keeps both, without
any stock look-up. To move a cluster on purpose, bump `nodes.placementGeneration`: the vSwitch gets the other
of two CIDRs, so its replacement is created beside the old one (Alibaba refuses overlapping vSwitch CIDRs in a
VPC: CreateVSwitch `InvalidCidrBlock.Overlapped`, reference/alibaba-cloud-verified.md §7) and the default
create-before-delete works; the NAS mount target (vswitch_id is ForceNew) and the instances follow it: the
instances by replace_on_changes on vswitchId and instanceType (components/alibaba/gpu_node.py; the provider itself would
move them in place, stopped, and refuse another zone).
"""

from __future__ import annotations

import ipaddress

import pulumi
import pulumi_alicloud as alicloud

from infra.sources.alibaba.network_plan import VPC_CIDR, IngressRule, NetworkArgs, ingress_rules, vswitch_cidr
from infra.sources.alibaba.placement import GENERATION_TAG, INSTANCE_TYPE_TAG, STACK_TAG


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    vswitch_id: pulumi.Output[str]
    vswitch_cidr: str
    security_group_id: pulumi.Output[str]
    zone: pulumi.Output[str]
    instance_type: str
    rules: list[IngressRule]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = {STACK_TAG: args.stack}
        cidr = vswitch_cidr(args.generation)
        vpc = alicloud.vpc.Network(
            f"{name}-vpc", vpc_name=f"roll-cluster-{args.stack}", cidr_block=VPC_CIDR, tags=tags, opts=child
        )
        vswitch = alicloud.vpc.Switch(
            f"{name}-vswitch",
            vpc_id=vpc.id,
            cidr_block=cidr,
            # Zone and type come from placement.py, which keeps those of an existing cluster (read from these tags).
            zone_id=args.zone,
            vswitch_name=args.vswitch_name,
            tags={**tags, INSTANCE_TYPE_TAG: args.instance_type, GENERATION_TAG: str(args.generation)},
            opts=child,
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
        # The rules that let `pulumi up`'s machine reach the nodes over SSH: every node's SSH steps, and so their
        # teardowns, depend on them, so that `pulumi destroy` revokes them only after the teardowns ran (it deletes
        # dependents first; a rule nothing depends on goes in the first wave, and the teardowns then find the nodes
        # unreachable and skip the graceful stop).
        self.ssh_rules: list[pulumi.Resource] = []
        for rule in self.rules:
            source_is_group = rule.source == "this security group"
            is_v6 = not source_is_group and ipaddress.ip_network(rule.source).version == 6
            resource = alicloud.ecs.SecurityGroupRule(
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
                opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(
                    aliases=[pulumi.Alias(name=f"{name}-{rule.former_name}")] if rule.former_name else None)),
            )
            if rule.ports == "22/22" and not source_is_group:
                self.ssh_rules.append(resource)
        self.vpc_id = vpc.id
        self.vswitch_id = vswitch.id
        self.vswitch_cidr = cidr
        self.security_group_id = group.id
        self.zone = vswitch.zone_id
        self.instance_type = args.instance_type
        self.register_outputs(
            {"vpcId": self.vpc_id, "vswitchId": self.vswitch_id, "securityGroupId": self.security_group_id}
        )
