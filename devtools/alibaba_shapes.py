"""The Alibaba Cloud the offline cloud models: its zones, stock, images, answer shapes and two of its limits.

The regions' zones, the zones with stock of each GPU family and the public images; the shapes of its answers
(resource ids, disk records, generated host keys); the key types
ImportKeyPair takes and the size of user data. Data only, kept apart from the mocks in devtools/offline_cloud.py
that answer with it."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

# Zones of the regions the shipped stacks use, as DescribeZones lists them.
REGION_ZONES: dict[str, list[str]] = {
    "cn-hangzhou": [f"cn-hangzhou-{z}" for z in "bghijk"],
    "cn-beijing": [f"cn-beijing-{z}" for z in "acdefghijkl"],
    "cn-shanghai": [f"cn-shanghai-{z}" for z in "befglmn"],
    "cn-wulanchabu": ["cn-wulanchabu-a", "cn-wulanchabu-b", "cn-wulanchabu-c"],
    "ap-southeast-1": [f"ap-southeast-1{z}" for z in "abc"],
}

# Which zones have stock of a family; a plausible picture, not a live one (stock moves: tests vary it).
DEFAULT_FAMILY_ZONES: dict[str, list[str]] = {
    "ecs.gn6v": ["cn-hangzhou-i", "cn-hangzhou-k", "cn-beijing-h", "cn-shanghai-f"],
    "ecs.gn6e": ["cn-hangzhou-i", "cn-beijing-h"],
    "ecs.gn6i": ["cn-hangzhou-h", "cn-hangzhou-i", "cn-beijing-g", "cn-shanghai-g"],
    "ecs.gn7i": ["cn-hangzhou-h", "cn-hangzhou-i", "cn-hangzhou-j", "cn-beijing-i", "cn-shanghai-l"],
    "ecs.gn7e": ["cn-hangzhou-k", "cn-wulanchabu-b"],
    "ecs.gn7": ["cn-beijing-h"],
    "ecs.gn8is": ["cn-hangzhou-j", "ap-southeast-1c"],
    "ecs.gn8v": ["cn-wulanchabu-a", "cn-wulanchabu-c", "cn-beijing-l"],
    "ecs.ebmgn8v": ["cn-wulanchabu-c"],
}

OS_IMAGES = [
    ("aliyun_3_x64_20G_alibase_20250117.vhd", "Alibaba Cloud Linux 3.2104 LTS 64 bit"),
    ("aliyun_3_x64_20G_alibase_20250629.vhd", "Alibaba Cloud Linux 3.2104 LTS 64 bit"),
    ("ubuntu_22_04_x64_20G_alibase_20250722.vhd", "Ubuntu 22.04 64 bit"),
    ("ubuntu_24_04_x64_20G_alibase_20250722.vhd", "Ubuntu 24.04 64 bit"),
]


ID_PREFIX = {
    "alicloud:vpc/network:Network": "vpc-bp1",
    "alicloud:vpc/switch:Switch": "vsw-bp1",
    "alicloud:ecs/securityGroup:SecurityGroup": "sg-bp1",
    "alicloud:ecs/securityGroupRule:SecurityGroupRule": "sgr-bp1",
    "alicloud:ecs/instance:Instance": "i-bp1",
    "alicloud:ecs/ecsKeyPair:EcsKeyPair": "kp-",
    "alicloud:ecs/image:Image": "m-bp1",
    "alicloud:nas/fileSystem:FileSystem": "",
    "alicloud:nas/accessGroup:AccessGroup": "",
    "alicloud:nas/accessRule:AccessRule": "",
    "alicloud:nas/mountTarget:MountTarget": "",
}


# Which property changes replace a resource: the provider's own rules, devtools/provider_rules (generated).


DISK_FIELDS = (
    "attachedTime", "autoSnapshotPolicyId", "availabilityZone", "category", "creationTime", "deleteAutoSnapshot",
    "deleteWithInstance", "description", "detachedTime", "device", "diskId", "diskName", "diskType",
    "enableAutoSnapshot", "enableAutomatedSnapshotPolicy", "encrypted", "expirationTime", "expiredTime", "id",
    "imageId", "instanceId", "iops", "iopsRead", "iopsWrite", "kmsKeyId", "mountInstanceNum", "name", "paymentType",
    "performanceLevel", "portable", "productCode", "regionId", "resourceGroupId", "size", "snapshotId", "status",
    "type", "zoneId",
)


def offline_host_key(name: str) -> str:
    """What infra/scripts/local/host_key.sh prints, for the offline cloud: a placeholder private key (no key is
    generated offline) and a well-formed ssh-ed25519 public key line derived from the resource name."""
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + hashlib.sha256(name.encode()).digest()
    return (
        "-----BEGIN OPENSSH PRIVATE KEY-----\noffline-plan-placeholder\n-----END OPENSSH PRIVATE KEY-----\n"
        f"ssh-ed25519 {base64.b64encode(blob).decode()} roll-cluster-{name}\n"
    )


# ECS ImportKeyPair: "The imported key pair must support one of the following encryption methods: rsa, dsa,
# ssh-rsa, ssh-dss, ecdsa" (help/en/ecs/developer-reference/api-ecs-2014-05-26-importkeypair, Jun 2026; ed25519 is
# not listed): verified-facts#alibaba-shapes-alibaba-cloud-verified.
IMPORT_KEY_PAIR_TYPES = ("ssh-rsa", "ssh-dss", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
# User data: "Before user data is encoded in Base64, the user data can only be up to 32 KB in size"
# (help/en/ecs/user-guide/overview-of-ecs-instance-user-data, Jun 2024): same file, 1.2; counted on the bytes
# before Base64, as the RunInstances UserData parameter states (docs/verified-facts.md 1).
USER_DATA_LIMIT_BYTES = 32 * 1024
# The smallest cloud_essd disk of each performance level, GiB: "If `performance_level` is set to `PL2`. Valid
# values: `461` to `65536`", PL3 `1261`, PL1 `20`, PL0 `1` (terraform-provider-alicloud website/docs/r/
# ecs_disk.html.markdown at 81c43b67; the same minimums in cs_kubernetes_node_pool.html.markdown).
# RunInstances refuses a smaller data disk of that level; the provider does not check it (data_disks.size has no
# ValidateFunc, resource_alicloud_instance.go).
# see verified-facts#alibaba-shapes-ecs-disk-html
ESSD_MIN_GIB = {"PL0": 1, "PL1": 20, "PL2": 461, "PL3": 1261}


def nas_zones(region: str, sold: dict[str, list[str]]) -> dict[str, object]:
    """NAS DescribeZones (alicloud.nas.get_zones): per zone the storage types it sells; `sold` overrides a zone's
    (default: Capacity, Performance and Premium everywhere, a plausible picture, not a live one)."""
    default = ["Capacity", "Performance", "Premium"]
    return {"zones": [{"zoneId": z, "instanceTypes": [{"storageType": t, "protocolType": "NFS"}
                                                      for t in sold.get(z, default)]} for z in REGION_ZONES[region]]}


def power_state(
    inputs: Mapping[str, Any], old: Mapping[str, Any] | None, serial: int, addresses: Callable[[], dict[str, str]]
) -> dict[str, Any]:
    """An instance's `status`, `publicIp` and `startTime` as StopInstance/StartInstance leave them (nodes.paused,
    autostop). The provider's Read sets `public_ip` "" when the instance has none (terraform-provider-alicloud
    alicloud/resource_alicloud_instance.go at 81c43b67), which is the case after a stop in economical mode
    ("its resources such as vCPUs, memory, and public IP address are released", pulumi_alicloud's `stopped_mode`
    doc); a start assigns one from the pool (`addresses`) and sets `start_time`.
    See verified-facts#alibaba-shapes-instance."""
    stopped = inputs.get("status") == "Stopped"
    if old is None:
        return {"status": "Stopped", "publicIp": ""} if stopped else {
            "status": "Running", "startTime": f"2026-01-01T00:00:{serial:02d}Z"}
    if stopped:
        released = inputs.get("stoppedMode") == "StopCharging"
        return {"status": "Stopped", "publicIp": "" if released else old.get("publicIp")}
    if old.get("status") == "Stopped":  # started again: a public IP from the pool and a new start time
        first, _, restarts = str(old.get("startTime", "")).partition("+")
        public = old.get("publicIp") or addresses()["publicIp"]
        return {"status": "Running", "publicIp": public, "startTime": f"{first}+{int(restarts or 0) + 1}"}
    return {"status": "Running"}
