"""The offline plan: run the real program for a stack under the offline cloud and print what `pulumi up` would
build: placement, network and rules, nodes, each node's steps with their scripts, the Ray cluster, the job with
its generated configuration, the stack outputs and the hourly price.

    python -m devtools.plan dev [--nodes N]

No credentials, no Pulumi CLI: see devtools/offline_cloud.py for what the offline cloud answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from devtools import schedule
from devtools.changes import CHANGE_EFFECTS, REBOOT_EFFECTS
from devtools.offline_cloud import (
    CloudRefusal,
    OfflineCloud,
    OfflineRun,
    run_program,
    shipped_stacks,
    stack_config,
    unwrap,
)
from infra import image_path
from infra.config import ClusterConfig, ConfigError
from infra.node import remote, steps
from infra.sources.alibaba.placement import PlacementError
from infra.sources.base import SourceError

RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"


def section(title: str) -> str:
    return f"\n== {title} " + "=" * max(0, 96 - len(title)) + "\n"


def render(run: OfflineRun) -> str:
    lines: list[str] = [
        f"roll-cluster offline plan: stack {run.stack} (no cloud contacted; see devtools/offline_cloud.py)"
    ]
    on_hosts = steps.NOTES.get("source") == "hosts"
    if on_hosts:
        lines += _hosts_section(run)
    else:
        lines += _cloud_sections(run)
    lines += _steps_section(run, first_boot=not on_hosts)
    lines += _container_and_ray_sections(run)
    lines += _changes_section()
    lines += _job_and_outputs_sections(run)
    return "\n".join(lines) + "\n"


def _hosts_section(run: OfflineRun) -> list[str]:
    out = run.outputs
    lines = [section("Hosts (nodes.source hosts: existing machines, no cloud resource is created)")]
    lines.append(f"  accelerators  {out.get('gpus')} x {out.get('gpuModel')} in {len(out.get('nodes') or [])} hosts")
    lines.append(f"  first look    {steps.NOTES.get('host_look')}")
    for host in steps.NOTES.get("hosts") or []:
        lines.append(f"  {host['name']:8} ssh {host['ssh']:28} private {host['private']:16} NIC {host['interface']}")
    shared = steps.NOTES.get("shared_storage")
    lines.append(f"  shared        {shared or 'none: /mnt/shared is not mounted; checkpoints stay on each host'}")
    return lines


def _cloud_sections(run: OfflineRun) -> list[str]:
    cloud, out = run.cloud, run.outputs
    lines: list[str] = []
    lines.append(section("Placement"))
    tried = steps.NOTES.get("placement_tried") or []
    for note in tried:
        lines.append(f"  skipped  {note}")
    for note in steps.NOTES.get("placement_kept") or []:
        lines.append(f"  {note}")
    lines.append(f"  zone          {out.get('zone')}")
    lines.append(f"  instance type {out.get('instanceType')}  ({out.get('gpuModel')}, "
                 f"{out.get('gpus')} GPUs in {len(out.get('nodes') or [])} nodes)")
    lines.append(f"  OS image      {steps.NOTES.get('image_name')}")
    if steps.NOTES.get("fabric_manager"):
        lines.append("  NVSwitch      8 GPUs on NVSwitch: nvidia-fabricmanager (driver version) runs on every node")
    if steps.NOTES.get("ssh_login"):
        lines.append(f"  SSH login     {steps.NOTES.get('ssh_login')}")
    if steps.NOTES.get("ssh_client"):
        lines.append(f"  SSH clients   {steps.NOTES.get('ssh_client')}")
    lines.extend(price_lines(out.get("hourlyPrice")))

    lines.append(section("Network"))
    for r in cloud.resources:
        if r.type == "alicloud:vpc/network:Network":
            lines.append(f"  VPC       {r.inputs.get('vpcName')}  {r.inputs.get('cidrBlock')}")
        if r.type == "alicloud:vpc/switch:Switch":
            name, cidr = r.inputs.get("vswitchName"), r.inputs.get("cidrBlock")
            lines.append(f"  vSwitch   {name}  {cidr}  in {r.inputs.get('zoneId')}")
    lines.append("  Security group, inbound (everything else is denied):")
    for r in sorted(cloud.of_type(RULE), key=lambda rule: rule.name):  # registered concurrently: any order
        source = r.inputs.get("cidrIp") or r.inputs.get("ipv6CidrIp") or "members of this security group"
        lines.append(f"    {r.inputs.get('ipProtocol'):4} {r.inputs.get('portRange'):12} from {source:32} "
                     f"{r.inputs.get('description')}")
    lines.append(section("Shared storage"))
    existing = steps.NOTES.get("nas_existing")
    if existing:
        lines.append(f"  NAS {existing} (existing, attached: never created or deleted here), mounted at /mnt/shared "
                     "on every node and container")
    for r in cloud.of_type("alicloud:nas/fileSystem:FileSystem"):
        keep = "kept on pulumi destroy" if steps.NOTES.get("nas_retained") else "DELETED on pulumi destroy"
        lines.append(f"  NAS {r.inputs.get('protocolType')} {r.inputs.get('storageType')} in {r.inputs.get('zoneId')}, "
                     f"mounted at /mnt/shared on every node and container; {keep}")
    if cloud.of_type("alicloud:nas/mountTarget:MountTarget"):
        lines.append(f"  mount target in the cluster's vSwitch; access rule: {cloud_rule_cidr(run)} read-write, "
                     "created before the mount target")
    if steps.NOTES.get("checkpoints"):
        lines.append(f"  {steps.NOTES['checkpoints']}")

    lines.append(section("Nodes"))
    for r in cloud.of_type("alicloud:ecs/instance:Instance"):
        disks = f"system {int(r.inputs.get('systemDiskSize', 0))} GB ESSD"
        for d in r.inputs.get("dataDisks") or []:
            disks += f", data {int(d.get('size', 0))} GB ESSD at /data"
        lines.append(
            f"  {r.inputs.get('hostName'):16} {r.inputs.get('tags', {}).get('roll-cluster-role'):6} "
            f"{r.inputs.get('instanceType')}  private {r.outputs.get('privateIp')}  public {r.outputs.get('publicIp')}"
        )
        lines.append(f"  {'':16} {disks}; spot {r.inputs.get('spotStrategy')}; "
                     f"{int(r.inputs.get('internetMaxBandwidthOut', 0))} Mbit/s public IP (pay by traffic)")

    return lines


def _steps_section(run: OfflineRun, first_boot: bool) -> list[str]:
    lines = [section("Steps per node (in order; '<-' lists what a step waits for)")]
    by_node: dict[str, list[steps.StepRecord]] = {}
    for record in run.steps:
        by_node.setdefault(record.node, []).append(record)
    for node, records in by_node.items():
        lines.append(f"  {node}:")
        for record in records:
            scripts = ", ".join(record.scripts) if record.scripts else f"pulumi-docker ({record.kind})"
            deps = ", ".join(record.depends_on) or ("first boot" if first_boot else "the host, as it is")
            lines.append(f"    {record.step:14} {scripts:44} <- {deps}")
    if first_boot:
        lines.append("  (first boot: infra/scripts/first_boot.sh as user data; it starts the GPU driver installer)")
    config = steps.NOTES.get("config")
    if config is not None and first_boot:  # the schedule model is of new cloud nodes (boot, driver, pull)
        lines += image_and_time(config, run.steps)
    return lines


def _container_and_ray_sections(run: OfflineRun) -> list[str]:
    cloud = run.cloud
    lines = [section("Container (node-0; every node alike)")]
    containers = [r for r in cloud.of_type("docker:index/container:Container") if r.name == "node-0-container"]
    if containers:
        inputs = unwrap(containers[0].inputs)
        image = cloud.of_type("docker:index/remoteImage:RemoteImage")[0].inputs.get("name")
        lines.append(f"  image       {image}")
        lines.append(f"  gpus        {inputs.get('gpus') or 'none'}; privileged {bool(inputs.get('privileged'))}; "
                     f"network {inputs.get('networkMode')}; ipc {inputs.get('ipcMode')}; "
                     f"shm {int(inputs.get('shmSize') or 0)} MB")
        for device in inputs.get("devices") or []:
            lines.append(f"  device      {device.get('hostPath')}")
        for volume in inputs.get("volumes") or []:
            mode = "ro" if volume.get("readOnly") else "rw"
            lines.append(f"  mount       {volume.get('hostPath')} -> {volume.get('containerPath')} ({mode})")
        for env in inputs.get("envs") or []:
            lines.append(f"  env         {env}")
    lines.append(section("Ray"))
    heads = [r for r in cloud.of_type("command:remote:Command") if r.name == "node-0-ray-head"]
    if heads:
        env = remote.exported_env(str(unwrap(heads[0].inputs.get("stdin"))))
        resources = env.get("RAY_RESOURCES") or "none"
        lines.append(f"  per node    --num-gpus={env.get('NUM_GPUS')}  --resources={resources}  "
                     f"jemalloc preloaded: {'yes' if env.get('RAY_PRELOAD_JEMALLOC') == '1' else 'no'}")
        lines.append(f"  head        {env.get('NODE_IP')}:{env.get('GCS_PORT')}, dashboard {env.get('DASHBOARD_HOST')}:"
                     f"{env.get('DASHBOARD_PORT')}")
        if "RAY_CUDA_VISIBLE_DEVICES" in env:
            devices = env["RAY_CUDA_VISIBLE_DEVICES"]
            lines.append(f"  head GPUs   Ray gets GPUs '{devices}' only (CUDA_VISIBLE_DEVICES of `ray start`); the "
                         "others are the reward server's")
    return lines


def _changes_section() -> list[str]:
    lines = [section("What a later change or a reboot does")]
    for what, effect in (*CHANGE_EFFECTS, *REBOOT_EFFECTS):
        lines.append(f"  {what}:")
        lines.append(f"      {effect}")
    return lines


def _job_and_outputs_sections(run: OfflineRun) -> list[str]:
    cloud, out = run.cloud, run.outputs
    lines: list[str] = []
    spec = steps.NOTES.get("job_spec")
    lines.append(section("Training job"))
    if spec is not None:
        lines.append(f"  submission id  {spec.job_id}")
        lines.append(f"  runs in        {spec.workdir}")
        lines.append(f"  entrypoint     {spec.entrypoint}")
        if spec.prepare:
            lines.append(f"  prepare        {spec.prepare}")
        if spec.reward_server:
            lines.append(f"  reward server  {spec.reward_server.command}  (port {spec.reward_server.port}, "
                         "health-checked before submission)")
        lines.append(f"  auto start     {steps.NOTES.get('auto_start')}")
        lines.append("  generated configuration:")
        for line in json.dumps(spec.summary, indent=2, default=str).splitlines():
            lines.append("    " + line)
        if spec.rendered_config:
            lines.append("  the configuration file shipped to the head, exactly:")
            lines += ["    " + line for line in spec.rendered_config.splitlines()]

    lines.append(section("Stack outputs"))
    for key in sorted(out):
        value = out[key]
        text = json.dumps(value) if not isinstance(value, str) else value
        lines.append(f"  {key:16} {text}")
    lines.append(section("Resources"))
    counts: dict[str, int] = {}
    for r in cloud.resources:
        counts[r.type] = counts.get(r.type, 0) + 1
    for typ, count in sorted(counts.items()):
        lines.append(f"  {count:4}  {typ}")
    cloud_types = sorted(t for t in counts if not t.startswith(("command:", "docker:", "pulumi:", "roll-cluster:")))
    lines.append(f"  cloud resources: {', '.join(cloud_types) if cloud_types else 'none'}")
    return lines


PATH_LABELS: dict[schedule.Path, str] = {
    "new": "new cluster, image as configured",
    "in-region": "new cluster, image in your registry in the region (VPC)",
    "baked": "baked image (nodes.image)",
}


def image_and_time(config: ClusterConfig, records: Sequence[steps.StepRecord]) -> list[str]:
    """The training image's path (with warnings) and the modelled time to a running job on each path."""
    lines = [section("Training image")]
    path = image_path.image_path(config)
    lines.append(f"  image    {config.container.image}")
    if config.nodes.image is not None:
        lines.append(f"  path     already on the disks of the baked image {config.nodes.image} (pull skipped)")
    else:
        lines.append(f"  path     {path.describe()}")
    for warning in image_path.warnings(config):
        lines.append(f"  WARNING  {warning}")
    if config.nodes.bake:
        lines.append("  bake     after gpu-ready the head bakes an ECS custom image (bake-prep, bake-image): kept on "
                     "pulumi destroy, output bakedImageId; the head's container waits for it this time")

    lines.append(section("Time to a running job (modelled: devtools/schedule.py; docs/performance.md, 'Benchmarks')"))
    configured = schedule.configured_path(config)
    for name, profile in schedule.profiles(config).items():
        plan = schedule.schedule(records, profile)
        mark = "  <- this stack" if name == configured else ""
        lines.append(f"  {PATH_LABELS[name]:58} {plan.total:5.1f} min{mark}")
        lines.append("    critical path: " + " -> ".join(
            [f"boot {schedule.INSTANCE_BOOT_MINUTES:g}"]
            + [f"{key} {plan.step_minutes(key):.1f}" for key in plan.critical_path]))
    lines.append("  With a baked image (nodes.image) these steps find their work done and take seconds:")
    for step, what in schedule.BAKED_SKIPS.items():
        lines.append(f"    {step:13} {what}")
    return lines


def offline_cloud_for(stack: str) -> OfflineCloud:
    """The offline cloud for a stack's plan: a NAS file system the stack attaches (storage.existingFileSystemId)
    exists in the account, as it must for the real `pulumi up`."""
    storage = stack_config(stack).get("roll-cluster:storage") if stack in shipped_stacks() else None
    kept = storage.get("existingFileSystemId") if isinstance(storage, dict) else None
    return OfflineCloud(external_file_systems={str(kept): "unknown"} if kept else {})


def price_lines(price: Any) -> list[str]:
    """The cost line: the amount with its currency, where it comes from, and what it does not include."""
    if not isinstance(price, dict) or not price.get("amount"):
        return ["  price         not reported"]
    return [
        f"  price         {price['amount']:.2f} {price['currency']} per {price['per']}: {price['includes']}",
        f"                ({price['basis']}); not included: {price['excludes']}",
    ]


def cloud_rule_cidr(run: OfflineRun) -> str:
    rules = run.cloud.of_type("alicloud:nas/accessRule:AccessRule")
    return str(rules[0].inputs.get("sourceCidrIp")) if rules else "none"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.plan", description=__doc__.splitlines()[0])
    parser.add_argument("stack", nargs="?", default="dev", help=f"one of: {', '.join(shipped_stacks())}")
    parser.add_argument("--nodes", type=int, help="override nodes.count")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="deep-merge a value over the stack file's, e.g. "
        "'roll-cluster:training={\"roll\": {\"baseConfig\": \"x/y.yaml\"}}' (repeatable)",
    )
    args = parser.parse_args(argv)
    config: dict[str, Any] = {}
    for item in args.config:
        name, _, text = item.partition("=")
        try:
            config[name] = json.loads(text)
        except json.JSONDecodeError as error:
            print(f"error: --config {item!r}: the value must be JSON ({error})", file=sys.stderr)
            return 2
    if args.nodes is not None:
        config["roll-cluster:nodes"] = {**config.get("roll-cluster:nodes", {}), "count": args.nodes}
    try:
        run = run_program(args.stack, cloud=offline_cloud_for(args.stack), config=config)
    except (ConfigError, PlacementError, SourceError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except CloudRefusal as refusal:
        print(f"error: Alibaba Cloud would refuse this (offline cloud): {refusal}", file=sys.stderr)
        return 1
    sys.stdout.write(render(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())

