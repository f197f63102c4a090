"""The offline cloud: Pulumi mocks that answer like Alibaba Cloud would, and a runner for the real program.

No credentials, no Pulumi CLI, no provider plugins: `pulumi.runtime.set_mocks` replaces the engine. Invokes get
what the ECS APIs return for a region (zones that have stock for a type, instance types with GPUs and prices,
public images); resources get ids and addresses in the shapes Alibaba Cloud uses (vpc-bp1..., i-bp1...,
private IPs from the vSwitch CIDR, public IPs from Alibaba's ranges). Used by the offline plan, the tests and the
benchmark. Stand-ins: remote and local commands are not executed (their stdout is empty); docker resources get
ids but no daemon is contacted.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import os
import re
import runpy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import yaml
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings

from infra.layout import PROJECT_DIR
from infra.sources.alibaba import catalog

SIG_KEY = "4dabf18193072939515e22adb298388d"
SECRET_SIG = "1b47061264138c4ac30d75fd1eb44270"

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


def reveal(value: Any) -> Any:
    """The plain value of a secret-wrapped mock input."""
    if isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG:
        return value["value"]
    return value


def is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SIG_KEY) == SECRET_SIG


@dataclass
class Registered:
    """One resource the program registered, as the engine saw it."""

    type: str
    name: str
    id: str | None
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    custom: bool
    provider: str | None


@dataclass
class OfflineCloud(pulumi.runtime.Mocks):
    """Answers invokes and creates resources like Alibaba Cloud.

    stock: family or exact type -> zones with stock (defaults: DEFAULT_FAMILY_ZONES).
    node_public_ips / node_private_ips: addresses to hand out to instances in creation order (the e2e tier
    uses its test hosts' addresses); by default public IPs come from 47.96.0.0/12 and private IPs from the
    vSwitch CIDR.
    previous: outputs a previous deployment left, by resource name, for properties the program marked
    ignore_changes (emulates the engine keeping them); see infra/sticky.py.
    """

    stock: dict[str, list[str]] = field(default_factory=lambda: dict(DEFAULT_FAMILY_ZONES))
    prices: dict[str, float] = field(default_factory=dict)
    node_public_ips: list[str] | None = None
    node_private_ips: list[str] | None = None
    preview: bool = False
    previous: dict[str, dict[str, Any]] = field(default_factory=dict)
    options: dict[str, pulumi.ResourceOptions] = field(default_factory=dict)
    resources: list[Registered] = field(default_factory=list)
    invokes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    missing_images: list[str] = field(default_factory=list)
    # node name -> what infra/scripts/local/host_key.sh would print (a real key pair), for hosts that must present
    # it (the e2e tier); others get a placeholder (offline_host_key).
    host_keys: dict[str, str] = field(default_factory=dict)
    _instances: int = 0

    # ------------------------------------------------------------------ invokes
    def call(self, args: pulumi.runtime.MockCallArgs) -> Any:
        self.invokes.append((args.token, dict(args.args)))
        handler = {
            "alicloud:index/getZones:getZones": self._zones,
            "alicloud:ecs/getInstanceTypes:getInstanceTypes": self._instance_types,
            "alicloud:ecs/getImages:getImages": self._images,
            "alicloud:ecs/getEcsDisks:getEcsDisks": self._disks,
        }.get(args.token)
        if handler is None:
            return {}
        return handler(dict(args.args))

    def zones_with_stock(self, type_name: str, region: str) -> list[str]:
        family = catalog.family_of(type_name) or ""
        listed = self.stock.get(type_name, self.stock.get(family, []))
        return [z for z in REGION_ZONES.get(region, []) if z in listed]

    @staticmethod
    def region() -> str:
        return str(pulumi.Config("alicloud").get("region") or "cn-hangzhou")

    def _zones(self, args: dict[str, Any]) -> dict[str, Any]:
        region = self.region()
        wanted = args.get("availableInstanceType")
        zones = self.zones_with_stock(wanted, region) if wanted else REGION_ZONES.get(region, [])
        return {
            "ids": zones,
            "zones": [
                {
                    "id": z,
                    "localName": f"{z.rsplit('-', 1)[-1].upper()} zone",
                    "availableInstanceTypes": [wanted] if wanted else [],
                    "availableResourceCreations": ["Instance", "VSwitch", "Disk"],
                    "availableDiskCategories": ["cloud_essd", "cloud_auto"],
                    "multiZoneIds": [],
                }
                for z in zones
            ],
        }

    def price(self, type_name: str) -> float | None:
        if type_name in self.prices:
            return self.prices[type_name]
        info = catalog.lookup(type_name)
        return info.hourly_price if info else None

    def _instance_types(self, args: dict[str, Any]) -> dict[str, Any]:
        region = self.region()
        name = args.get("instanceType")
        info = catalog.lookup(name) if name else None
        zone = args.get("availabilityZone")
        zones = self.zones_with_stock(name, region) if name else []
        if info is None or not zones or (zone and zone not in zones):
            return {"ids": [], "instanceTypes": []}  # sold-out types are omitted, like the real API
        price = self.price(info.name)
        return {
            "ids": [info.name],
            "instanceTypes": [
                {
                    "id": info.name,
                    "family": info.family.name,
                    "cpuCoreCount": info.vcpus,
                    "memorySize": float(info.memory_gib),
                    "gpus": [{"amount": str(info.gpus), "category": info.family.gpu_model}],
                    "price": f"{price:.2f}" if price is not None else None,
                    "availabilityZones": zones,
                }
            ],
        }

    def _disks(self, args: dict[str, Any]) -> dict[str, Any]:
        """DescribeDisks of one instance: its data disk (every instance here has at most one)."""
        instance_id = str(args.get("instanceId") or "")
        instance = next((r for r in self.of_type("alicloud:ecs/instance:Instance") if r.id == instance_id), None)
        if instance is None or not instance.inputs.get("dataDisks") or args.get("type") not in ("data", None):
            return {"ids": [], "disks": [], "totalCount": 0}
        disk_id = f"d-bp1{_digest(instance_id, 17)}"
        zone = str(self.of_type("alicloud:vpc/switch:Switch")[0].inputs.get("zoneId")) if self.of_type(
            "alicloud:vpc/switch:Switch") else ""
        size = int(instance.inputs["dataDisks"][0].get("size") or 0)
        disk: dict[str, Any] = {name: "" for name in _DISK_FIELDS}
        disk.update(
            id=disk_id, diskId=disk_id, instanceId=instance_id, type="data", category="cloud_essd",
            size=size, iops=0, iopsRead=0, iopsWrite=0, mountInstanceNum=1, status="In_use",
            availabilityZone=zone, zoneId=zone, regionId=self.region(), device="/dev/xvdb",
            deleteAutoSnapshot=False, deleteWithInstance=True, enableAutoSnapshot=False,
            enableAutomatedSnapshotPolicy=False, encrypted="off", portable=False, tags={},
            mountInstances=[], operationLocks=[],
        )
        return {"ids": [disk_id], "disks": [disk], "totalCount": 1}

    def _images(self, args: dict[str, Any]) -> dict[str, Any]:
        if args.get("imageId"):
            return self._image_by_id(str(args["imageId"]))
        pattern = re.compile(args.get("nameRegex") or ".*")
        matches = [(n, os_name) for n, os_name in OS_IMAGES if pattern.search(n)]
        if args.get("mostRecent"):
            matches = sorted(matches, reverse=True)[:1]
        images = [
            {
                "id": f"m-bp1{_digest(n, 17)}",
                "imageId": f"m-bp1{_digest(n, 17)}",
                "name": n,
                "osName": os_name,
                "osType": "linux",
                "architecture": "x86_64",
                "status": "Available",
                "size": 20,
            }
            for n, os_name in matches
        ]
        return {"ids": [i["id"] for i in images], "images": images}

    def _image_by_id(self, image_id: str) -> dict[str, Any]:
        """An explicit image (nodes.image): the region has it unless a test says otherwise (missing_images)."""
        if image_id in self.missing_images:
            return {"ids": [], "images": []}
        image = {
            "id": image_id, "imageId": image_id, "name": f"custom image {image_id}",
            "osName": "Alibaba Cloud Linux 3.2104 LTS 64 bit", "osType": "linux", "architecture": "x86_64",
            "status": "Available", "size": 100,
        }
        return {"ids": [image_id], "images": [image]}

    # ---------------------------------------------------------------- resources
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        inputs = dict(args.inputs)
        outputs = dict(inputs)
        prefix = _ID_PREFIX.get(args.typ, "res-")
        resource_id: str | None = f"{prefix}{_digest(args.typ + args.name, 17)}"
        typ = args.typ
        _refuse_like_alibaba(typ, args.name, inputs)
        if typ == "alicloud:ecs/instance:Instance":
            outputs.update(self._instance_addresses(inputs))
            outputs["status"] = "Running"
            outputs["osName"] = "Alibaba Cloud Linux 3.2104 LTS 64 bit"
        elif typ == "alicloud:vpc/switch:Switch":
            outputs["availabilityZone"] = inputs.get("zoneId")
        elif typ == "alicloud:nas/mountTarget:MountTarget":
            fs = str(inputs.get("fileSystemId", "0"))
            outputs["mountTargetDomain"] = f"{fs}-{_digest(args.name, 5)}.{self.region()}.nas.aliyuncs.com"
        elif typ == "alicloud:ecs/ecsKeyPair:EcsKeyPair":
            outputs["fingerPrint"] = ":".join(_digest(args.name, 32)[i : i + 2] for i in range(0, 32, 2))
        elif typ == "command:local:Command" and args.name.endswith("-host-key"):
            node = args.name.removesuffix("-host-key")
            outputs.update(stdout=self.host_keys.get(node) or offline_host_key(args.name), stderr="")
        elif typ in ("command:remote:Command", "command:local:Command"):
            outputs.update(stdout="", stderr="")
        elif typ == "docker:index/remoteImage:RemoteImage":
            outputs["imageId"] = f"sha256:{_digest(str(inputs.get('name')), 64)}"
            outputs["repoDigest"] = f"{inputs.get('name')}@sha256:{_digest('d' + str(inputs.get('name')), 64)}"
        elif typ == "docker:index/container:Container":
            resource_id = _digest(args.name, 64)
            outputs["exitCode"] = None
        # The engine keeps the state's value of a property in ignore_changes when the resource already exists.
        options = self.options.get(args.name)
        if args.name in self.previous and options is not None:
            for prop in options.ignore_changes or []:
                if prop in self.previous[args.name]:
                    outputs[prop] = self.previous[args.name][prop]
        if self.preview and typ == "alicloud:ecs/instance:Instance":
            resource_id = None
            outputs.pop("publicIp", None)
            outputs.pop("privateIp", None)
        self.resources.append(
            Registered(typ, args.name, resource_id, inputs, outputs, bool(args.custom), args.provider or None)
        )
        return resource_id, outputs

    def _instance_addresses(self, inputs: Mapping[str, Any]) -> dict[str, str]:
        index = self._instances
        self._instances += 1
        if self.node_private_ips is not None:
            private = self.node_private_ips[index]
        else:
            cidr = ipaddress.ip_network(self._vswitch_cidr())
            private = str(cidr.network_address + 100 + index)
        if self.node_public_ips is not None:
            public = self.node_public_ips[index]
        else:
            public = str(ipaddress.ip_address("47.96.0.0") + 0x10000 + 37 * index + 11)
        return {"privateIp": private, "publicIp": public, "primaryIpAddress": private}

    def _vswitch_cidr(self) -> str:
        for r in self.resources:
            if r.type == "alicloud:vpc/switch:Switch":
                return str(r.inputs.get("cidrBlock"))
        return "10.20.0.0/20"

    # ------------------------------------------------------------------ queries
    def of_type(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.type == typ]

    def named(self, name: str) -> Registered:
        found = [r for r in self.resources if r.name == name]
        if not found:
            raise KeyError(f"no resource named {name}; have {[r.name for r in self.resources]}")
        return found[0]


_ID_PREFIX = {
    "alicloud:vpc/network:Network": "vpc-bp1",
    "alicloud:vpc/switch:Switch": "vsw-bp1",
    "alicloud:ecs/securityGroup:SecurityGroup": "sg-bp1",
    "alicloud:ecs/securityGroupRule:SecurityGroupRule": "sgr-bp1",
    "alicloud:ecs/instance:Instance": "i-bp1",
    "alicloud:ecs/ecsKeyPair:EcsKeyPair": "kp-",
    "alicloud:nas/fileSystem:FileSystem": "",
    "alicloud:nas/accessGroup:AccessGroup": "",
    "alicloud:nas/accessRule:AccessRule": "",
    "alicloud:nas/mountTarget:MountTarget": "",
}


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


_DISK_FIELDS = (
    "attachedTime", "autoSnapshotPolicyId", "availabilityZone", "category", "creationTime", "deleteAutoSnapshot",
    "deleteWithInstance", "description", "detachedTime", "device", "diskId", "diskName", "diskType",
    "enableAutoSnapshot", "enableAutomatedSnapshotPolicy", "encrypted", "expirationTime", "expiredTime", "id",
    "imageId", "instanceId", "iops", "iopsRead", "iopsWrite", "kmsKeyId", "mountInstanceNum", "name", "paymentType",
    "performanceLevel", "portable", "productCode", "regionId", "resourceGroupId", "size", "snapshotId", "status",
    "type", "zoneId",
)

# ECS ImportKeyPair: "The imported key pair must support one of the following encryption methods: rsa, dsa,
# ssh-rsa, ssh-dss, ecdsa" (help/en/ecs/developer-reference/api-ecs-2014-05-26-importkeypair, Jun 2026; ed25519 is
# not listed): ../shared/reference/alibaba-cloud-verified.md 1.1.
IMPORT_KEY_PAIR_TYPES = ("ssh-rsa", "ssh-dss", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521")
# User data: "Before user data is encoded in Base64, the user data can only be up to 32 KB in size"
# (help/en/ecs/user-guide/overview-of-ecs-instance-user-data, Jun 2024): same file, 1.2.
USER_DATA_LIMIT_BYTES = 32 * 1024


class AlibabaRefused(RuntimeError):
    """What a real Alibaba Cloud API call would answer with an error for."""


def _refuse_like_alibaba(typ: str, name: str, inputs: Mapping[str, Any]) -> None:
    if typ == "alicloud:ecs/ecsKeyPair:EcsKeyPair":
        key_type = str(reveal(inputs.get("publicKey")) or "").split(maxsplit=1)[:1]
        if key_type and key_type[0] not in IMPORT_KEY_PAIR_TYPES:
            raise AlibabaRefused(
                f"{name}: ImportKeyPair refuses a {key_type[0]} key (it accepts rsa, dsa and ecdsa)"
            )
    if typ == "alicloud:ecs/instance:Instance":
        user_data = reveal(inputs.get("userData"))
        if user_data:
            size = len(base64.b64decode(str(user_data)))  # gzip-compressed or not: the bytes before Base64
            if size > USER_DATA_LIMIT_BYTES:
                raise AlibabaRefused(
                    f"{name}: user data of {size} bytes (before Base64) is over the {USER_DATA_LIMIT_BYTES}-byte limit"
                )


def offline_host_key(name: str) -> str:
    """What infra/scripts/local/host_key.sh prints, for the offline cloud: a placeholder private key (no key is
    generated offline) and a well-formed ssh-ed25519 public key line derived from the resource name."""
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + hashlib.sha256(name.encode()).digest()
    return (
        "-----BEGIN OPENSSH PRIVATE KEY-----\noffline-plan-placeholder\n-----END OPENSSH PRIVATE KEY-----\n"
        f"ssh-ed25519 {base64.b64encode(blob).decode()} roll-cluster-{name}\n"
    )


# ------------------------------------------------------------------------------------------------ the runner
def stack_config(stack: str) -> dict[str, Any]:
    """The `config:` block of Pulumi.<stack>.yaml."""
    path = PROJECT_DIR / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no stack file {path.name}; shipped: {', '.join(shipped_stacks())}")
    data = yaml.safe_load(path.read_text()) or {}
    return dict(data.get("config") or {})


def shipped_stacks() -> list[str]:
    return sorted(p.name.split(".")[1] for p in PROJECT_DIR.glob("Pulumi.*.yaml"))


def deep_merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


@dataclass
class OfflineRun:
    stack: str
    cloud: OfflineCloud
    outputs: dict[str, Any]
    steps: list[Any]


def run_program(
    stack: str,
    *,
    cloud: OfflineCloud | None = None,
    config: Mapping[str, Any] | None = None,
    replace_config: Mapping[str, Any] | None = None,
    secrets: Mapping[str, str] | None = None,
    organization: str = "organization",
) -> OfflineRun:
    """Run __main__.py for a stack under the offline cloud and return what it registered and exported.

    config: extra values deep-merged over the stack file's (keys like "roll-cluster:nodes").
    replace_config: values that replace the stack file's keys whole.
    secrets: secret values by key ("roll-cluster:hfToken").
    """
    from infra.node import steps as steps_module

    cloud = cloud or OfflineCloud()
    values = stack_config(stack)
    for key, value in (config or {}).items():
        values[key] = deep_merge(values[key], value) if isinstance(value, Mapping) and key in values else value
    values.update(replace_config or {})
    values.update(secrets or {})
    flat = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in values.items()}

    os.environ["ROLL_CLUSTER_OFFLINE"] = "1"
    pulumi_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(cloud, project="roll-cluster", stack=stack, preview=cloud.preview,
                             organization=organization)
    pulumi.runtime.set_all_config(flat, list((secrets or {}).keys()))
    cloud.options.clear()

    def capture_options(args: pulumi.ResourceTransformationArgs) -> None:
        # Mocks do not see resource options; the tests and the engine emulation above need them.
        cloud.options[args.name] = args.opts
        return None

    pulumi.runtime.register_stack_transformation(capture_options)
    steps_module.RECORDED.clear()
    steps_module.NOTES.clear()

    def program() -> pulumi.Output[Any]:
        runpy.run_path(str(PROJECT_DIR / "__main__.py"), run_name="__main__")
        root = pulumi_settings.get_root_resource()
        return pulumi.Output.from_input(getattr(root, "outputs", {}))

    outputs = _run_to_completion(program)
    return OfflineRun(stack, cloud, outputs, list(steps_module.RECORDED))


def _run_to_completion(program: Callable[[], pulumi.Output[Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def body() -> Any:
        output = program()

        async def resolve() -> None:
            value = await output.future()
            result.update(value or {})

        return pulumi_mocks._sync_await(resolve())  # type: ignore[attr-defined]

    pulumi_mocks._sync_await(pulumi_mocks.run_pulumi_func(body))  # type: ignore[attr-defined]
    return result


def unwrap(value: Any) -> Any:
    """Secret wrappers removed, recursively (for displaying inputs)."""
    value = reveal(value)
    if isinstance(value, dict):
        return {k: unwrap(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [unwrap(v) for v in value]
    return value


__all__: Sequence[str] = [
    "OfflineCloud",
    "OfflineRun",
    "Registered",
    "is_secret",
    "reveal",
    "run_program",
    "unwrap",
]
