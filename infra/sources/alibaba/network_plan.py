"""The cluster network's addresses and inbound rules, as data: what components/alibaba/network.py registers and the plan
shows."""

from __future__ import annotations

from dataclasses import dataclass

VPC_CIDR = "10.20.0.0/16"
# 4096 addresses each: room for 256 nodes and the NAS mount target. Generations alternate between them, so that a
# move never needs two vSwitches with the same CIDR at once.
VSWITCH_CIDRS = ("10.20.0.0/20", "10.20.16.0/20")


def vswitch_cidr(generation: int) -> str:
    return VSWITCH_CIDRS[generation % 2]


@dataclass(frozen=True)
class NetworkArgs:
    stack: str
    zone: str
    instance_type: str
    generation: int
    vswitch_name: str
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
    # The name it had when rules were named by their position in adminCidrs (an alias: an unchanged list keeps
    # its rules on the upgrade).
    former_name: str = ""


def ingress_rules(args: NetworkArgs) -> list[IngressRule]:
    rules = [
        IngressRule("intra-tcp", "tcp", "1/65535", "this security group", "Ray, NCCL and Gloo between nodes"),
        IngressRule("intra-udp", "udp", "1/65535", "this security group", "NCCL and Gloo between nodes"),
    ]
    # Named by the CIDR, not by its position: every field of a rule forces a new one (TF
    # resource_alicloud_security_group_rule.go) and a replacement re-authorizes a rule that already exists
    # (accepted, adds nothing), so the delete of the old resource would revoke a rule that is still wanted. By CIDR,
    # reordering changes nothing, removing one deletes exactly its rules, adding one creates its rules.
    # see verified-facts#network-plan-security-group-rule
    for index, cidr in enumerate(args.admin_cidrs):
        key = rule_key(cidr)
        rules.append(IngressRule(f"ssh-{key}", "tcp", "22/22", cidr, "SSH from an admin CIDR", f"ssh-{index}"))
        if args.dashboard_open_to_admins:
            port = f"{args.dashboard_port}/{args.dashboard_port}"
            rules.append(IngressRule(f"dashboard-{key}", "tcp", port, cidr, "Ray dashboard from an admin CIDR",
                                     f"dashboard-{index}"))
    return rules


def rule_key(cidr: str) -> str:
    """A CIDR as part of a resource name (no `/`, no `:`): 203.0.113.0/24 -> 203.0.113.0_24."""
    return cidr.replace("/", "_").replace(":", "-")
