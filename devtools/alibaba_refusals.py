"""What a real Alibaba Cloud API call answers with an error for, beyond the provider's schema: the offline cloud
refuses the same inputs (ImportKeyPair's key types, the user-data size limit, an ESSD data disk smaller than its
performance level's minimum)."""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from devtools.alibaba_shapes import ESSD_MIN_GIB, IMPORT_KEY_PAIR_TYPES, REGION_ZONES, USER_DATA_LIMIT_BYTES
from devtools.mock_secrets import reveal
from infra.sources.alibaba import catalog

if TYPE_CHECKING:
    from devtools.offline_cloud import Registered


class AlibabaRefused(RuntimeError):
    """What a real Alibaba Cloud API call would answer with an error for."""


def _refuse_like_alibaba(typ: str, name: str, inputs: Mapping[str, Any]) -> None:
    if typ == "alicloud:ecs/ecsKeyPair:EcsKeyPair":
        key = reveal(inputs.get("publicKey"))  # unknown in a first preview: nothing to check yet
        key_type = (key if isinstance(key, str) else "").split(maxsplit=1)[:1]
        if key_type and key_type[0] not in IMPORT_KEY_PAIR_TYPES:
            raise AlibabaRefused(
                f"{name}: ImportKeyPair refuses a {key_type[0]} key (it accepts rsa, dsa and ecdsa)"
            )
    if typ == "alicloud:ecs/instance:Instance":
        user_data = reveal(inputs.get("userData"))
        if user_data and isinstance(user_data, str):
            size = len(base64.b64decode(str(user_data)))  # gzip-compressed or not: the bytes before Base64
            if size > USER_DATA_LIMIT_BYTES:
                raise AlibabaRefused(
                    f"{name}: user data of {size} bytes (before Base64) is over the {USER_DATA_LIMIT_BYTES}-byte limit"
                )
        for disk in inputs.get("dataDisks") or []:
            # The provider sends PerformanceLevel for cloud_essd only (TF resource_alicloud_instance.go).
            # see verified-facts#alibaba-refusals-instance
            level = disk.get("performanceLevel") if disk.get("category") == "cloud_essd" else None
            size = disk.get("size")
            if isinstance(level, str) and isinstance(size, (int, float)) and size < ESSD_MIN_GIB.get(level, 0):
                raise AlibabaRefused(
                    f"{name}: InvalidDataDiskSize.ValueNotSupported: a {level} ESSD data disk needs at least "
                    f"{ESSD_MIN_GIB[level]} GiB; got {size:g}"
                )


class CloudRefusal(RuntimeError):
    """What Alibaba Cloud would answer with an error: the code it uses (where documented) and why."""


class AccountView(Protocol):
    """What the refusals below read of the offline cloud: the account's resources as the engine left them."""

    resources: list[Registered]
    external_file_systems: dict[str, str]

    def region(self) -> str: ...
    def live(self, typ: str) -> list[Registered]: ...
    def by_id(self, typ: str, resource_id: Any) -> Registered | None: ...
    def zones_with_stock(self, type_name: str, region: str, table: dict[str, list[str]] | None = None
                         ) -> list[str]: ...


def refuse_against_account(cloud: AccountView, typ: str, name: str, inputs: Mapping[str, Any]) -> None:
    """What Alibaba refuses given the account's other resources (CloudRefusal), by resource type."""
    check = {
        "alicloud:vpc/switch:Switch": _refuse_vswitch,
        "alicloud:ecs/instance:Instance": _refuse_instance,
        "alicloud:ecs/securityGroupRule:SecurityGroupRule": _refuse_rule,
        "alicloud:nas/fileSystem:FileSystem": _refuse_file_system,
        "alicloud:nas/mountTarget:MountTarget": _refuse_mount_target,
    }.get(typ)
    if check is not None:
        check(cloud, name, inputs)


def _refuse_vswitch(cloud: AccountView, name: str, inputs: Mapping[str, Any]) -> None:
    region = cloud.region()
    zone = str(inputs.get("zoneId"))
    # CreateVSwitch's ZoneId must be a zone of the region (DescribeZones lists them).
    if zone not in REGION_ZONES.get(region, []):
        raise CloudRefusal(f"InvalidZoneId.NotFound: vSwitch {name}: {zone} is not a zone of {region}")
    cidr = ipaddress.IPv4Network(str(inputs.get("cidrBlock")))
    vpc = cloud.by_id("alicloud:vpc/network:Network", inputs.get("vpcId"))
    if vpc is not None and not cidr.subnet_of(ipaddress.IPv4Network(str(vpc.inputs.get("cidrBlock")))):
        # CreateVSwitch: "The CIDR block of the vSwitch must be a subset of the CIDR block of the VPC".
        raise CloudRefusal(f"InvalidCidrBlock.Malformed: vSwitch {name}: {cidr} is outside its VPC")
    # CreateVSwitch error 400 InvalidCidrBlock.Overlapped, "Specified CIDR block overlapped with other subnets"
    # (reference/alibaba-cloud-verified.md §7). A replaced vSwitch still exists while its replacement is created
    # (Pulumi creates before it deletes, unless delete_before_replace).
    for other in cloud.live("alicloud:vpc/switch:Switch"):
        if other.inputs.get("vpcId") != inputs.get("vpcId"):
            continue
        if cidr.overlaps(ipaddress.ip_network(str(other.inputs.get("cidrBlock")))):
            raise CloudRefusal(
                f"InvalidCidrBlock.Overlapped: vSwitch {name} ({cidr}) overlaps {other.name} "
                f"({other.inputs.get('cidrBlock')}) in the same VPC"
            )

def _refuse_instance(cloud: AccountView, name: str, inputs: Mapping[str, Any]) -> None:
    type_name = str(inputs.get("instanceType"))
    if catalog.lookup(type_name) is None:
        raise CloudRefusal(f"InvalidInstanceType.NotFound: {name}: {type_name} is not an instance type")
    vswitch = cloud.by_id("alicloud:vpc/switch:Switch", inputs.get("vswitchId"))
    if vswitch is None:
        raise CloudRefusal(f"InvalidVSwitchId.NotFound: {name}: no vSwitch {inputs.get('vswitchId')}")
    zone = str(vswitch.inputs.get("zoneId"))
    # RunInstances in a zone without stock of the type: "OperationDenied.NoStock" (reference/alibaba-cloud.md
    # §stock; the stock-aware data sources omit exactly these zones).
    if zone not in cloud.zones_with_stock(type_name, cloud.region()):
        raise CloudRefusal(f"OperationDenied.NoStock: {name}: {type_name} has no stock in {zone}")

def _refuse_rule(cloud: AccountView, name: str, inputs: Mapping[str, Any]) -> None:
    # AuthorizeSecurityGroup: "如果指定的安全组规则已存在，此次调用成功，但不会增加规则"
    # (if the rule exists, the call succeeds but adds no rule; help.aliyun.com/document_detail/25554.html).
    # Two resources would then own one rule, and deleting either removes it for both: refused here so the
    # program never declares one twice.
    identity = _rule_identity(inputs)
    for other in cloud.resources:
        if other.type == "alicloud:ecs/securityGroupRule:SecurityGroupRule" and _rule_identity(other.inputs) \
                == identity:
            raise CloudRefusal(f"duplicate security group rule: {name} is the same rule as {other.name}")

def _refuse_file_system(cloud: AccountView, name: str, inputs: Mapping[str, Any]) -> None:
    zone = inputs.get("zoneId")
    if zone is not None and zone not in REGION_ZONES.get(cloud.region(), []):
        raise CloudRefusal(f"InvalidZoneId.NotFound: NAS {name}: {zone} is not a zone of {cloud.region()}")

def _refuse_mount_target(cloud: AccountView, name: str, inputs: Mapping[str, Any]) -> None:
    fs_id = inputs.get("fileSystemId")
    known = {r.id for r in cloud.live("alicloud:nas/fileSystem:FileSystem")} | set(cloud.external_file_systems)
    if fs_id not in known:
        raise CloudRefusal(f"InvalidFileSystem.NotFound: mount target {name}: no file system {fs_id}")
    vswitch = cloud.by_id("alicloud:vpc/switch:Switch", inputs.get("vswitchId"))
    if vswitch is None or vswitch.inputs.get("vpcId") != inputs.get("vpcId"):
        # CreateMountTarget: VpcId and VSwitchId are required for a VPC mount target and must belong together.
        raise CloudRefusal(f"InvalidVSwitchId.NotFound: mount target {name}: vSwitch not in VPC "
                           f"{inputs.get('vpcId')}")
    # Not refused: a mount target in another zone than a standard file system ("file systems in different
    # zones in the same region communicate with ECS cloud servers", TF alicloud_nas_file_system `zone_id`).


def _rule_identity(inputs: Mapping[str, Any]) -> tuple[str, ...]:
    keys = ("securityGroupId", "type", "ipProtocol", "portRange", "nicType", "policy", "cidrIp", "ipv6CidrIp",
            "sourceSecurityGroupId")
    return tuple(str(inputs.get(k) or "") for k in keys)
