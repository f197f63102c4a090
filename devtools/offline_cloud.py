"""The offline cloud: Pulumi mocks that answer like Alibaba Cloud would, and a runner for the real program.

No credentials, no Pulumi CLI, no provider plugins: `pulumi.runtime.set_mocks` replaces the engine. Invokes get
what the ECS APIs return for a region (zones that have stock for a type, instance types with GPUs and prices,
public images); resources get ids and addresses in the shapes Alibaba Cloud uses (vpc-bp1..., i-bp1...,
private IPs from the vSwitch CIDR, public IPs from Alibaba's ranges). Used by the offline plan, the tests and the
benchmark. Stand-ins: remote and local commands are not executed (their stdout is empty); docker resources get
ids but no daemon is contacted.

Strict: it refuses what Alibaba refuses (see `_refuse_*` below, each rule with its source), so that a program
that passes here does not fail on its first real `pulumi up` for a reason the mocks hid. And it keeps state:
`cloud.next_run()` is the cloud of the next `pulumi up` of the same stack, holding this run's resources (the
data sources see them, unchanged resources keep their ids and outputs, `changes` says what the engine would do).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import json
import os
import re
import runpy
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import settings as pulumi_settings

from devtools import alibaba_shapes, engine_model, provider_rules, stack_file
from devtools.alibaba_refusals import AlibabaRefused as AlibabaRefused
from devtools.alibaba_refusals import CloudRefusal as CloudRefusal
from devtools.alibaba_refusals import _refuse_like_alibaba, refuse_against_account
from devtools.alibaba_shapes import (
    DEFAULT_FAMILY_ZONES,
    DISK_FIELDS,
    ID_PREFIX,
    OS_IMAGES,
    REGION_ZONES,
    offline_host_key,
    power_state,
)
from devtools.mock_secrets import is_secret, reveal, unwrap
from devtools.stack_file import secure_values
from infra import runmode
from infra.layout import PROJECT_DIR
from infra.node.steps import RunContext
from infra.sources.alibaba import catalog, regions

ROLL_SNAPSHOT = PROJECT_DIR / "tests" / "fixtures" / "roll"

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
    registration: engine_model.Registration | None = None  # its options as the engine recorded them


@dataclass
class OfflineCloud(pulumi.runtime.Mocks):
    """Answers invokes and creates resources like Alibaba Cloud.

    stock: family or exact type -> zones with stock (defaults: DEFAULT_FAMILY_ZONES).
    node_public_ips / node_private_ips: addresses to hand out to instances by node rank (the e2e tier
    uses its test hosts' addresses); by default public IPs come from 47.96.0.0/12 and private IPs from the
    vSwitch CIDR.
    previous: outputs a previous deployment left, by resource name, for properties the program marked
    ignore_changes (emulates the engine keeping them).
    prior: the resources a previous `pulumi up` left (its state; see next_run()).
    external_file_systems: NAS file systems of the account that no stack owns (id -> zone), e.g. kept ones.
    currency: the account's billing currency (Cloud Control's GetPrice answer); None: that API fails.
    """

    stock: dict[str, list[str]] = field(default_factory=lambda: dict(DEFAULT_FAMILY_ZONES))
    prices: dict[str, float] = field(default_factory=dict)
    node_public_ips: list[str] | None = None
    node_private_ips: list[str] | None = None
    preview: bool = False
    previous: dict[str, dict[str, Any]] = field(default_factory=dict)
    missing_images: set[str] = field(default_factory=set)  # custom image ids the account does not have
    image_owners: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (owner, status); ("self", Available)
    catalogue: dict[str, list[str]] | None = None  # zones that sell a type (get_zones' answer); None: the stock ones
    nas_types: dict[str, list[str]] = field(default_factory=dict)  # zone -> NAS storage types sold (default: all)
    bss_denied: bool = False  # the account may not read prices (BSS): get_instance_types(sorted_by="Price") fails
    prior: list[Registered] = field(default_factory=list)
    external_file_systems: dict[str, str] = field(default_factory=dict)
    currency: str | None = "CNY"
    changes: dict[str, str] = field(default_factory=dict)  # resource name -> create | update | replace | same
    options: dict[str, pulumi.ResourceOptions] = field(default_factory=dict)
    resources: list[Registered] = field(default_factory=list)
    invokes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    # node name -> what infra/scripts/local/host_key.sh would print (a real key pair), for hosts that must present
    # it (the e2e tier); others get a placeholder (offline_host_key).
    host_keys: dict[str, str] = field(default_factory=dict)
    replace: set[str] = field(default_factory=set)  # `pulumi up --replace` of these resource names
    registrations: dict[str, engine_model.Registration] = field(default_factory=dict)
    # Ids and addresses the stack's resources held in earlier runs: a new instance (one recreated after a reclaim
    # included) gets another id, and a started one another public IP, as Alibaba hands them out.
    retired_ids: set[str] = field(default_factory=set)
    retired_addresses: set[str] = field(default_factory=set)
    _ops: engine_model.Ops = field(default_factory=engine_model.Ops)
    # One registration at a time: the SDK sends them from executor threads (pulumi/runtime/resource.py).
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _instances: int = 0

    def next_run(self, **changes: Any) -> OfflineCloud:
        """The cloud as the next `pulumi up` of the same stack finds it (its state: this run's resources), with
        `changes`: the fields that differ next time (stock, prices, ...)."""
        fields: dict[str, Any] = {
            "stock": self.stock, "prices": self.prices, "external_file_systems": self.external_file_systems,
            "currency": self.currency, "catalogue": self.catalogue, "bss_denied": self.bss_denied,
            "retired_ids": self.retired_ids | {str(r.id) for r in [*self.prior, *self.resources] if r.id},
            "retired_addresses": self.retired_addresses | {
                str(r.outputs[k]) for r in [*self.prior, *self.resources] if r.type == "alicloud:ecs/instance:Instance"
                for k in ("publicIp", "privateIp") if r.outputs.get(k)},
            **changes}
        return OfflineCloud(prior=list(self.resources), **fields)

    # ------------------------------------------------------------------ the engine (devtools/engine_model.py)
    @property
    def ops(self) -> list[tuple[str, str]]:
        """What this `up` does, in order: (create | update | same | replace | delete, resource name)."""
        dependencies = {r.name: r.registration.dependencies for r in self.prior if r.registration is not None}
        return self._ops.finish([r.name for r in self.prior], engine_model.kept_names(self.resources), dependencies)

    def _engine_change(self, typ: str, name: str, inputs: Mapping[str, Any]) -> tuple[str, Registered | None]:
        reg = self.registrations.get(name)
        old = self._prior(typ, name)
        for alias in reg.aliases if reg is not None and old is None else ():
            old = self._prior(typ, alias)
            if old is not None:
                break
        replaced = {n for n, c in self.changes.items() if c == "replace"}
        change = engine_model.decide(typ, inputs, reg, old.inputs if old else None,
                                     old.registration if old else None, replaced, self.replace)
        self.changes[name] = change
        self._ops.record(change, name, engine_model.delete_first(typ, reg))
        return change, old

    def destroy(self, unreachable: set[str] | frozenset[str] = frozenset(),
                local: Callable[[Registered], str | None] | None = None) -> engine_model.Destroyed:
        """`pulumi destroy` of this run's state; a delete that dials an unreachable host fails (engine_model)."""
        return engine_model.destroy(self.resources, unreachable, local)

    # ------------------------------------------------------------------ invokes
    def call(self, args: pulumi.runtime.MockCallArgs) -> Any:
        self.invokes.append((args.token, dict(args.args)))
        handler: Callable[[dict[str, Any]], Any] | None = {
            "alicloud:index/getZones:getZones": self._zones,
            "alicloud:ecs/getInstanceTypes:getInstanceTypes": self._instance_types,
            "alicloud:ecs/getImages:getImages": self._images,
            "alicloud:vpc/getSwitches:getSwitches": self._switches,
            "alicloud:ecs/getInstances:getInstances": self._instances_answer,
            "alicloud:cloudcontrol/getPrices:getPrices": self._prices,
            "alicloud:ecs/getEcsDisks:getEcsDisks": self._disks,
            "alicloud:nas/getZones:getZones": lambda _: alibaba_shapes.nas_zones(self.region(), self.nas_types),
        }.get(args.token)
        if handler is None:
            return {}
        try:
            self._check_region()
            _refuse_by_rules(provider_rules.check_invoke(args.token, args.args))
            return handler(dict(args.args))
        except CloudRefusal as refusal:
            # The engine reports a data source's error as a failed invoke: the program sees an exception.
            return {}, [("", str(refusal))]

    def _check_region(self) -> None:
        region = self.region()
        if not regions.is_region(region):
            # The provider's own region list (regions.py); DescribeRegions would not list it either.
            raise CloudRefusal(f"InvalidRegionId.NotFound: {region} is not an Alibaba Cloud region")
        if region not in REGION_ZONES:
            raise CloudRefusal(f"the offline cloud does not model region {region} (it knows {', '.join(REGION_ZONES)})")

    def zones_with_stock(self, type_name: str, region: str, table: dict[str, list[str]] | None = None) -> list[str]:
        family, table = catalog.family_of(type_name) or "", self.stock if table is None else table
        listed = table.get(type_name, table.get(family, []))
        return [z for z in REGION_ZONES.get(region, []) if z in listed]

    @staticmethod
    def region() -> str:
        return str(pulumi.Config("alicloud").get("region") or "cn-hangzhou")

    def _zones(self, args: dict[str, Any]) -> dict[str, Any]:
        region = self.region()
        wanted = args.get("availableInstanceType")
        # DescribeZones' catalogue: a zone that sells the type, stock or not (TF data_source_alicloud_zones.go).
        # see verified-facts#offline-cloud-zones
        zones = self.zones_with_stock(wanted, region, self.catalogue) if wanted else REGION_ZONES.get(region, [])
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
        if zone and zone not in REGION_ZONES[region]:
            # alicloud/service_alicloud_ecs.go DescribeAvailableResources: "Availability zone %s status is not
            # available in the region %s" (the data source fails; it does not answer empty).
            raise CloudRefusal(f"Availability zone {zone} status is not available in the region {region}")
        zones = self.zones_with_stock(name, region) if name else []
        if zone and zone not in zones:  # TF service_alicloud_ecs.go: the data source fails
        # see verified-facts#offline-cloud-service-alicloud-ecs
            raise CloudRefusal(f"Availability zone {zone} status is sold out")
        if args.get("sortedBy") == "Price" and self.bss_denied:  # BSS GetPayAsYouGoPrice (instance_types.go)
        # see verified-facts#offline-cloud-instance-types
            raise CloudRefusal("Forbidden.RAM: User not authorized to operate on the specified resource (BSS)")
        if info is None or not zones:
            return {"ids": [], "instanceTypes": []}  # sold-out types are omitted, like the real API
        # `price` only with sorted_by = "Price" (data_source_alicloud_instance_types.go; the `price` docstring).
        price = self.price(info.name) if args.get("sortedBy") == "Price" else None
        return {
            "ids": [info.name],
            "instanceTypes": [
                {
                    "id": info.name,
                    "family": info.family.name,
                    "cpuCoreCount": info.vcpus,
                    "memorySize": float(info.memory_gib),
                    "gpus": [{"amount": str(info.gpus), "category": info.family.gpu_model}],
                    "price": f"{price:.4f}" if price is not None else "",
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
        first = instance.inputs["dataDisks"][0]  # the category's default is TF's (:249), an ESSD's level PL1
        size, category, level = int(first.get("size") or 0), first.get("category"), first.get("performanceLevel")
        disk: dict[str, Any] = {name: "" for name in DISK_FIELDS}
        disk.update(
            id=disk_id, diskId=disk_id, instanceId=instance_id, type="data", category=category or "cloud_efficiency",
            performanceLevel=level or ("PL1" if category == "cloud_essd" else ""), size=size, iops=0, iopsRead=0,
            iopsWrite=0, mountInstanceNum=1, status="In_use", availabilityZone=zone, zoneId=zone, tags={},
            regionId=self.region(), device="/dev/xvdb", deleteAutoSnapshot=False, deleteWithInstance=True,
            enableAutoSnapshot=False, enableAutomatedSnapshotPolicy=False, encrypted="off", portable=False,
            mountInstances=[], operationLocks=[],
        )
        return {"ids": [disk_id], "disks": [disk], "totalCount": 1}

    def _images(self, args: dict[str, Any]) -> dict[str, Any]:
        if args.get("imageId"):  # owners and status filter as the API does (status default Available)
            owner, status = self.image_owners.get(str(args["imageId"]), ("self", "Available"))
            found = self._custom_image(str(args["imageId"])) if args.get("owners") in (owner, None) else {}
            return found if found and status == (args.get("status") or "Available") else {"ids": [], "images": []}
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

    def _custom_image(self, image_id: str) -> dict[str, Any]:
        """A custom image baked by a stack (nodes.image): the system disk and a 200 GB data disk, as snapshots."""
        if image_id in self.missing_images:
            return {"ids": [], "images": []}
        image = {
            "id": image_id,
            "imageId": image_id,
            "name": f"roll-cluster-baked-{image_id}",
            "osName": "Alibaba Cloud Linux 3.2104 LTS 64 bit",
            "osType": "linux",
            "architecture": "x86_64",
            "status": "Available",
            "size": 200,
            "diskDeviceMappings": [
                {"device": "/dev/xvda", "size": "200", "snapshotId": f"s-bp1{_digest(image_id + 'a', 17)}"},
                {"device": "/dev/xvdb", "size": "200", "snapshotId": f"s-bp1{_digest(image_id + 'b', 17)}"},
            ],
        }
        return {"ids": [image_id], "images": [image]}

    def _switches(self, args: dict[str, Any]) -> dict[str, Any]:
        """vpc.get_switches over the vSwitches that exist (a previous run's state), filtered like the API."""
        wanted_tags = dict(args.get("tags") or {})
        found = []
        for r in self.prior:
            if r.type != "alicloud:vpc/switch:Switch":
                continue
            tags = dict(r.outputs.get("tags") or {})
            if args.get("vswitchName") and r.outputs.get("vswitchName") != args["vswitchName"]:
                continue
            if any(tags.get(k) != v for k, v in wanted_tags.items()):
                continue
            found.append({
                "id": r.id, "vswitchId": r.id, "name": r.outputs.get("vswitchName"),
                "vswitchName": r.outputs.get("vswitchName"), "cidrBlock": r.outputs.get("cidrBlock"),
                "zoneId": r.outputs.get("zoneId"), "vpcId": r.outputs.get("vpcId"), "tags": tags,
                "status": "Available",
            })
        return {"ids": [v["id"] for v in found], "names": [v["name"] for v in found], "vswitches": found}

    def _instances_answer(self, args: dict[str, Any]) -> dict[str, Any]:
        """ecs.get_instances over the instances that exist (a previous run's state), by vSwitch and tags."""
        wanted_tags = dict(args.get("tags") or {})
        found = [
            r for r in self.prior
            if r.type == "alicloud:ecs/instance:Instance"
            and (not args.get("vswitchId") or r.outputs.get("vswitchId") == args["vswitchId"])
            and all(dict(r.outputs.get("tags") or {}).get(k) == v for k, v in wanted_tags.items())
        ]
        return {"ids": [r.id for r in found], "names": [r.outputs.get("instanceName") for r in found],
                "instances": [{"id": r.id, "name": r.outputs.get("instanceName"), "status": "Running"}
                              for r in found]}

    def _prices(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.currency is None:
            raise CloudRefusal("Forbidden.RAM: the account may not call Cloud Control GetPrice")
        attributes = dict(args.get("desireAttributes") or {})
        price = self.price(str(attributes.get("InstanceType"))) or 0.0
        return {"prices": [{"currency": self.currency, "originalPrice": price, "discountPrice": 0.0,
                            "tradePrice": price, "moduleDetails": [], "promotionDetails": []}]}

    # ---------------------------------------------------------------- resources
    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[str, Any]]:
        with self._lock:
            # Assets and archives as the state keeps them: a path and a hash (engine_model.state_json).
            inputs = engine_model.as_stored(dict(args.inputs))
            outputs = dict(inputs)
            prefix = ID_PREFIX.get(args.typ, "res-")
            resource_id: str | None = f"{prefix}{_digest(args.typ + args.name, 17)}"
            typ = args.typ
            _refuse_like_alibaba(typ, args.name, inputs)
            _refuse_by_rules(provider_rules.check_resource(typ, args.name, inputs, self.preview))
            change, old = self._engine_change(typ, args.name, inputs)
            reg = self.registrations.get(args.name)
            if old is not None and change in ("same", "update"):
                # The engine keeps the state's value of every input in ignore_changes (top-level names here:
                # step_generator.go processIgnoreChanges), and the state records that value, not the program's.
                ignored = set(reg.ignore_changes) if reg is not None else set()
                inputs = {k: old.inputs[k] if k in ignored and k in old.inputs else v for k, v in inputs.items()}
                # The engine keeps the resource: same id, its outputs (addresses, domains) as they were.
                outputs = {**old.outputs, **inputs}
                if typ == "alicloud:ecs/instance:Instance" and not self.preview:
                    # A preview of an update does not start or stop anything: the computed outputs (public IP,
                    # start_time) stay the state's (the provider's plan keeps a Computed attribute it does not
                    # mark as changing), so a resume's new start_time shows only in the `up`.
                    addresses = lambda: self._instance_addresses(args.name)  # noqa: E731 (only if it restarts)
                    outputs.update(power_state(inputs, old.outputs, self._instances, addresses))
                self.resources.append(Registered(typ, args.name, old.id, inputs, outputs, bool(args.custom),
                                                 args.provider or None, reg))
                if change == "update":
                    self._refuse(typ, args.name, inputs, replacing=None)
                return old.id, outputs
            if old is not None:  # replaced: a new cloud resource with a new id
                resource_id = f"{prefix}{_digest(args.typ + args.name + str(old.id), 17)}"
            elif resource_id in self.retired_ids:  # created again (its predecessor went outside the program)
                resource_id = f"{prefix}{_digest(args.typ + args.name + str(sorted(self.retired_ids)), 17)}"
            self._refuse(typ, args.name, inputs, replacing=old)
            if typ == "alicloud:ecs/instance:Instance":
                outputs.update(self._instance_addresses(args.name))
                # The start time by the node's rank too: by creation order, two runs of one configuration would
                # give the head different start times (the autostop step's trigger) as the nodes register.
                outputs.update(power_state(inputs, None, _node_rank(args.name, self._instances),
                                           lambda: self._instance_addresses(args.name)))
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
                resource_id = _digest(args.name + (str(old.id) if old else ""), 64)  # a new container: a new id
                outputs["exitCode"] = None
            # The engine keeps the state's value of a property in ignore_changes when the resource already exists.
            options = self.options.get(args.name)
            if args.name in self.previous and options is not None:
                for prop in options.ignore_changes or []:
                    if prop in self.previous[args.name]:
                        outputs[prop] = self.previous[args.name][prop]
            if self.preview:  # a first preview: no id, and only the inputs are known (every computed output unknown)
                resource_id, outputs = None, dict(inputs)
            self.resources.append(
                Registered(typ, args.name, resource_id, inputs, outputs, bool(args.custom), args.provider or None, reg)
            )
            return resource_id, outputs

    # ------------------------------------------------------------------ state
    def _prior(self, typ: str, name: str) -> Registered | None:
        for r in self.prior:
            if r.type == typ and r.name == name:
                return r
        return None

    def live(self, typ: str) -> list[Registered]:
        """Resources of a type that exist while this run creates: this run's, and the prior ones not yet deleted
        (the engine deletes replaced and removed resources after the creations, unless delete_before_replace)."""
        current = [r for r in self.resources if r.type == typ]
        kept_ids = {r.id for r in current}
        names = {r.name for r in current}
        for r in self.prior:
            if r.type != typ or r.id in kept_ids:
                continue
            options = self.options.get(r.name)
            if r.name in names and options is not None and options.delete_before_replace:
                continue
            current.append(r)
        return current

    def changed_nodes(self) -> dict[str, str]:
        """Instances the run would create, update or replace (empty: no node changes)."""
        return {r.name: self.changes[r.name] for r in self.of_type("alicloud:ecs/instance:Instance")
                if self.changes.get(r.name) != "same"}

    def _refuse(self, typ: str, name: str, inputs: Mapping[str, Any], replacing: Registered | None) -> None:
        # A preview checks what it knows: a property that is another resource's unknown output is checked when
        # the `up` knows it (the providers' Check skips unknowns), so the check waits too.
        if not engine_model.has_unknown(dict(inputs)):
            refuse_against_account(self, typ, name, inputs)

    def by_id(self, typ: str, resource_id: Any) -> Registered | None:
        for r in self.live(typ):
            if r.id == resource_id:
                return r
        return None

    def _instance_addresses(self, name: str) -> dict[str, str]:
        # By the node's rank in the name ("node-1-instance"), not by creation order: the program registers its
        # nodes concurrently, and two runs of one configuration must hand out the same addresses.
        index = _node_rank(name, self._instances)
        self._instances += 1
        # Addresses of instances that still exist (a previous run's included) are never handed out twice.
        live = self.live("alicloud:ecs/instance:Instance")
        taken = {r.outputs.get(k) for r in live for k in ("privateIp", "publicIp")} | self.retired_addresses
        if self.node_private_ips is not None:
            private = self.node_private_ips[index]
        else:
            cidr = ipaddress.ip_network(self._vswitch_cidr())
            private = next(str(cidr.network_address + 100 + i) for i in range(index, 4000)
                           if str(cidr.network_address + 100 + i) not in taken)
        if self.node_public_ips is not None:
            public = self.node_public_ips[index]
        else:
            base = ipaddress.ip_address("47.96.0.0") + 0x10000 + 11
            public = next(str(base + 37 * i) for i in range(index, 100000) if str(base + 37 * i) not in taken)
        return {"privateIp": private, "publicIp": public, "primaryIpAddress": private}

    def _vswitch_cidr(self) -> str:
        for r in reversed(self.resources):
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


def _refuse_by_rules(errors: Sequence[str]) -> None:  # the provider's schema validation (devtools/provider_rules)
    if errors:
        raise CloudRefusal("; ".join(errors))


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


# ------------------------------------------------------------------------------------------------ the runner
def stack_config(stack: str) -> dict[str, Any]:
    """The `config:` block of Pulumi.<stack>.yaml (devtools/stack_file.py)."""
    return stack_file.read_stack_config(PROJECT_DIR, stack)


def shipped_stacks() -> list[str]:
    return stack_file.stacks_in(PROJECT_DIR)


def merge_config(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_config(merged[key], value)
        else:
            merged[key] = value
    return merged


@dataclass
class OfflineRun:
    stack: str
    cloud: OfflineCloud
    outputs: dict[str, Any]
    steps: list[Any]
    # The outputs Pulumi would store as secrets (the values above are resolved, their secretness dropped).
    secret_outputs: set[str] = field(default_factory=set)
    # What the program noted for the plan (its RunContext's notes: placement, the job spec, config warnings).
    notes: dict[str, Any] = field(default_factory=dict)


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
    cloud = cloud or OfflineCloud()
    values = stack_config(stack)
    for key, value in (config or {}).items():
        values[key] = merge_config(values[key], value) if isinstance(value, Mapping) and key in values else value
    values.update(replace_config or {})
    values, secure_keys = secure_values(values)
    values.update(secrets or {})
    flat = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in values.items()}

    os.environ[runmode.OFFLINE_ENV] = "1"
    # ROLL's base configs come from the snapshot of the pinned ref shipped with the tests, never from the network
    # (infra/frameworks/roll_sources.py); a ROLL_CHECKOUT the user set wins.
    os.environ.setdefault("ROLL_CHECKOUT", str(ROLL_SNAPSHOT))
    pulumi_settings.ROOT.set(None)
    pulumi.runtime.set_mocks(cloud, project="roll-cluster", stack=stack, preview=cloud.preview,
                             organization=organization)
    pulumi.runtime.set_all_config(flat, sorted({*secure_keys, *(secrets or {})}))
    cloud.options.clear()

    def capture_options(args: pulumi.ResourceTransformationArgs) -> None:
        # Mocks do not see resource options; the tests and the engine emulation above need them: as the program's
        # own stack transformations (registered after this one, e.g. components/pause.py) leave them.
        later = pulumi_settings.get_root_resource()._transformations  # type: ignore[union-attr]
        for transformation in later[later.index(capture_options) + 1:]:
            result = transformation(args)
            args = pulumi.ResourceTransformationArgs(args.resource, args.type_, args.name, result.props, result.opts) \
                if result is not None else args
        cloud.options[args.name] = args.opts
        return None

    pulumi.runtime.register_stack_transformation(capture_options)
    engine_model.record_registrations(pulumi_settings.SETTINGS.monitor, cloud.registrations)
    namespace: dict[str, Any] = {}

    def program() -> dict[str, Any]:
        # The program's own namespace holds its RunContext (__main__.py): read back, never shared through a module.
        namespace.update(runpy.run_path(str(PROJECT_DIR / "__main__.py"), run_name="__main__"))
        root = pulumi_settings.get_root_resource()
        return dict(getattr(root, "outputs", {}) or {})

    secret_outputs: set[str] = set()
    outputs = _run_to_completion(program, secret_outputs)
    context: RunContext = namespace["run_context"]
    return OfflineRun(stack, cloud, outputs, list(context.steps), secret_outputs, context.notes)


def _run_to_completion(program: Callable[[], dict[str, Any]], secret_outputs: set[str] | None = None
                       ) -> dict[str, Any]:
    result: dict[str, Any] = {}

    def body() -> Any:
        outputs = program()

        async def resolve() -> None:
            # Each output on its own: a preview knows some (engine_model.UNKNOWN for the others).
            for key, value in outputs.items():
                output = pulumi.Output.from_input(value)
                known = await output.future(with_unknowns=True)
                result[key] = engine_model.UNKNOWN if isinstance(known, pulumi.output.Unknown) else known
                if secret_outputs is not None and await output.is_secret():
                    secret_outputs.add(key)

        return pulumi_mocks._sync_await(resolve())  # type: ignore[attr-defined]

    try:
        pulumi_mocks._sync_await(pulumi_mocks.run_pulumi_func(body))  # type: ignore[attr-defined]
    except BaseException:
        _cancel_leftovers()
        raise
    return result


def _cancel_leftovers() -> None:
    """A run that failed (a refusal, a program error) leaves registrations pending on the event loop; they would
    wake up inside the next run and fail it. Cancel them."""
    loop = asyncio.get_event_loop()
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    with pulumi_settings.SETTINGS.lock:
        pulumi_settings.SETTINGS.outputs.clear()
    pulumi_settings.SETTINGS.rpc_manager.clear()


__all__: Sequence[str] = [
    "CloudRefusal",
    "OfflineCloud",
    "OfflineRun",
    "Registered",
    "is_secret",
    "reveal",
    "run_program",
    "unwrap",
]


def _node_rank(name: str, otherwise: int) -> int:
    """The node's rank in an instance's name ("node-1-instance"), else `otherwise` (the creation order)."""
    rank = re.fullmatch(r"node-(\d+)-instance", name)
    return int(rank.group(1)) if rank else otherwise
