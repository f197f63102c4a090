"""The offline plan: run the real program for a stack under the offline cloud and print what `pulumi up` would
build. By default a summary of at most 50 lines (infra/summary.py: placement, the four costs, exposure, the time
to the first training step, warnings, what changes); with --full everything: network and rules, nodes, each node's
steps with their scripts, the Ray cluster, the job with its generated configuration, the stack outputs.

    python3 -m companion plan dev [--full] [--nodes N] [--no-registry]   (also: python3 dev.py plan dev)

No credentials, no Pulumi CLI: see devtools/offline_cloud.py for what the offline cloud answers. The one request
the plan makes: the training image's manifest from its registry, for the image's size (devtools/registry.py;
`--no-registry` or ROLL_CLUSTER_NO_REGISTRY=1 turns it off, and any failure falls back to the estimate).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from devtools import registry, schedule
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
from devtools.plan_time import backend_lines, time_to_first_step
from infra import cost, image_path, parallelism, summary
from infra.autostop import plan_lines as autostop_plan_lines
from infra.config import ClusterConfig, ConfigError
from infra.frameworks.registry import adapter_class
from infra.node import remote, steps
from infra.sources.alibaba import catalog
from infra.sources.alibaba.placement import PlacementError
from infra.sources.base import ClusterFacts, SourceError

RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"


def section(title: str) -> str:
    return f"\n== {title} " + "=" * max(0, 96 - len(title)) + "\n"


OFFLINE_PRICE = ("the offline catalog's estimate (the offline cloud answers the region's price look-up from "
                 "infra/sources/alibaba/catalog.py, cn-hangzhou list prices, 2025; a real `pulumi up` shows the "
                 "region's live list price)")
LIVE_PRICE = "live pay-as-you-go list price of the region"


def offline_labels(value: Any) -> Any:
    """The offline cloud's price is the catalog's, not a live one: every label that says "live" says so instead."""
    if isinstance(value, str):
        return value.replace(LIVE_PRICE, OFFLINE_PRICE)
    if isinstance(value, dict):
        return {key: offline_labels(item) for key, item in value.items()}
    if isinstance(value, list):
        return [offline_labels(item) for item in value]
    return value


def _existing_machines(config: object) -> bool:
    """Whether the nodes are the user's own machines (the source's declared capability): the plan then lists them,
    and models no boot time, image pull or backend, as their disks and network are unknown to it."""
    return isinstance(config, ClusterConfig) and config.nodes.capabilities.existing_machines


def plan_text(run: OfflineRun, parallel: int | None = None, lookup: registry.Lookup | None = None) -> str:
    """The plan's text; lookup: what the registry's manifest said of the image's size (None: not asked)."""
    run.outputs.update(offline_labels(run.outputs))
    lines: list[str] = [
        f"roll-cluster offline plan: stack {run.stack} (no cloud contacted; see devtools/offline_cloud.py)"
    ]
    warnings = run.notes.get("config_warnings") or []
    if warnings:
        # `pulumi preview`/`up` refuse these (infra/config/first_time.py); the offline plan runs on.
        lines.append(section("Before pulumi up (refused there: set your own values)"))
        lines += [f"  WARNING {warning}" for warning in warnings]
    on_hosts = _existing_machines(run.notes.get("config"))
    if on_hosts:
        lines += _hosts_section(run)
    else:
        lines += _cloud_sections(run, lookup)
    # When autostop fires and the permissions the stack's features need.
    if isinstance(plan_config := run.notes.get("config"), ClusterConfig):
        lines += [section("Autostop and permissions"), *autostop_plan_lines(plan_config)]
    lines += _steps_section(run, first_boot=not on_hosts, parallel=parallel, lookup=lookup)
    lines += _container_and_ray_sections(run)
    lines += _changes_section()
    lines += _job_and_outputs_sections(run)
    return "\n".join(lines) + "\n"


def _hosts_section(run: OfflineRun) -> list[str]:
    out = run.outputs
    lines = [section("Hosts (nodes.source hosts: existing machines, no cloud resource is created)")]
    lines.append(f"  accelerators  {out.get('gpus')} x {out.get('gpuModel')} in {len(out.get('nodes') or [])} hosts")
    lines.append(f"  first look    {run.notes.get('host_look')}")
    for host in run.notes.get("hosts") or []:
        lines.append(f"  {host['name']:8} ssh {host['ssh']:28} private {host['private']:16} NIC {host['interface']}")
    shared = run.notes.get("shared_storage")
    lines.append(f"  shared        {shared or 'none: /mnt/shared is not mounted; checkpoints stay on each host'}")
    # Own hosts: destroy stops the job, Ray and the container, and deletes no file on them (issue 27).
    where = "the shared storage" if shared else "each host's data dir"
    lines.append(f"  checkpoints   on {where}: they survive pulumi destroy (nothing on your hosts is deleted)")
    return lines


def _cloud_sections(run: OfflineRun, lookup: registry.Lookup | None = None) -> list[str]:
    cloud, out = run.cloud, run.outputs
    lines: list[str] = []
    lines.append(section("Placement"))
    tried = run.notes.get("placement_tried") or []
    for note in tried:
        lines.append(f"  skipped  {note}")
    for note in run.notes.get("placement_kept") or []:
        lines.append(f"  {note}")
    lines.append(f"  zone          {out.get('zone')}")
    lines.append(f"  instance type {out.get('instanceType')}  ({out.get('gpuModel')}, "
                 f"{out.get('gpus')} GPUs in {len(out.get('nodes') or [])} nodes)")
    lines.append(f"  OS image      {run.notes.get('image_name')}")
    request = catalog.on_request(str(out.get("instanceType") or ""))
    if request:
        lines.append(f"  on request    {out.get('instanceType')} is of a family Alibaba sells only on request: "
                     f"{request} before `pulumi up`, or the account gets no instance whatever the stock")
    if run.notes.get("fabric_manager"):
        lines.append("  NVSwitch      8 GPUs on NVSwitch: nvidia-fabricmanager (driver version) runs on every node")
    if run.notes.get("ssh_login"):
        lines.append(f"  SSH login     {run.notes.get('ssh_login')}")
    if run.notes.get("ssh_client"):
        lines.append(f"  SSH clients   {run.notes.get('ssh_client')}")
    lines.extend(price_lines(out.get("hourlyPrice")))
    for note in run.notes.get("unchecked") or []:  # infra/sources/alibaba/unchecked.py
        lines.append(f"  ! {note}")
    lines.extend(cost_lines(out.get("cost"), out.get("hourlyPrice"), run, lookup))

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
    existing = run.notes.get("nas_existing")
    if existing:
        lines.append(f"  NAS {existing} (existing, attached: never created or deleted here), mounted at /mnt/shared "
                     "on every node and container")
    for r in cloud.of_type("alicloud:nas/fileSystem:FileSystem"):
        keep = "kept on pulumi destroy" if run.notes.get("nas_retained") else "DELETED on pulumi destroy"
        lines.append(f"  NAS {r.inputs.get('protocolType')} {r.inputs.get('storageType')} in {r.inputs.get('zoneId')}, "
                     f"mounted at /mnt/shared on every node and container; {keep}")
    if cloud.of_type("alicloud:nas/mountTarget:MountTarget"):
        lines.append(f"  mount target in the cluster's vSwitch; access rule: {cloud_rule_cidr(run)} read-write, "
                     "created before the mount target")
    if run.notes.get("checkpoints"):
        lines.append(f"  {run.notes['checkpoints']}")

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


def _steps_section(run: OfflineRun, first_boot: bool, parallel: int | None = None,
                   lookup: registry.Lookup | None = None) -> list[str]:
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
    config = run.notes.get("config")
    if config is not None and first_boot:  # the schedule model is of new cloud nodes (boot, driver, pull)
        lines += image_and_time(config, run.steps, parallel, lookup)
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
    spec = run.notes.get("job_spec")
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
        lines.append(f"  auto start     {run.notes.get('auto_start')}")
        lines += start_gate_lines(spec, run.notes.get("config"))
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


def start_gate_lines(spec: Any, config: ClusterConfig | None) -> list[str]:
    """Checkpoints, resume and the start gate of the job (issue 18)."""
    unmanaged = ("checkpoints  where and when the job's own configuration says (the program finds none to resume; "
                 "custom jobs are told ROLL_CLUSTER_CHECKPOINT_DIR and ROLL_CLUSTER_RESUME)")
    lines = [f"  {line}" for line in (spec.checkpoints.lines() if spec.checkpoints else [unmanaged])]
    if config is None:
        return lines
    minutes = config.training.start_timeout_minutes
    pattern = adapter_class(config.training.framework).first_step_pattern
    if not pattern or minutes == 0:
        why = (f"a {config.training.framework} job prints no known first-step line" if not pattern
               else "training.startTimeoutMinutes: 0")
        lines.append(f"  start gate   none ({why}): the job step returns once the job runs")
    else:
        lines.append(f"  start gate   the job step waits up to {minutes} min (training.startTimeoutMinutes, from the "
                     f"step's start: preparation and the job's model and data downloads included) for the line "
                     f"/{pattern}/; the job dying first fails `pulumi up` with its log tail")
        stall = config.training.no_progress_minutes
        lines.append(
            f"  no progress  a running job that prints nothing for {stall} min before that line is stopped and "
            "fails `pulumi up` with its log tail (training.noProgressMinutes)" if stall else
            "  no progress  not watched (training.noProgressMinutes: 0)")
    return lines


def manifest_gb(config: ClusterConfig, lookup: registry.Lookup | None) -> float | None:
    """The image's size the registry's manifest gave, unless container.imageSizeGb (the user's) overrides it."""
    if lookup is None or lookup.size is None or config.container.image_size_gb is not None:
        return None
    return lookup.size.gb


def image_lookup(config: Any, asked: bool) -> registry.Lookup | None:
    """Ask the registry for the training image's manifest when the plan needs its size: new cloud nodes pull it,
    and container.imageSizeGb does not say it. asked: not --no-registry."""
    if (not isinstance(config, ClusterConfig) or _existing_machines(config)
            or config.nodes.image is not None or config.container.image_size_gb is not None):
        return None
    if not asked or registry.disabled():
        return registry.NOT_LOOKED_UP
    return registry.look_up_manifest(config.container.image)


def size_line(path: image_path.ImagePath, lookup: registry.Lookup | None) -> str:
    """Where the image's size comes from: container.imageSizeGb, the registry's manifest, or the estimate and why."""
    if path.size_source == "config":
        return f"{path.size_text} GB compressed (container.imageSizeGb, set for this stack; the manifest not read)"
    if path.size_source == "manifest" and lookup is not None and lookup.size is not None:
        return (f"{path.size_text} GB compressed (registry manifest, {lookup.size.platform}, {lookup.size.layers} "
                "layers)")
    reason = lookup.reason if lookup is not None else "the registry was not asked"
    what = "estimate" if path.size_known else "assumed default"
    return f"{path.size_text} GB ({what}: {reason}; set container.imageSizeGb)"


def image_and_time(config: ClusterConfig, records: Sequence[steps.StepRecord],
                   parallel: int | None = None, lookup: registry.Lookup | None = None) -> list[str]:
    """The training image's path (with warnings) and the modelled time to the first training step on each path."""
    lines = [section("Training image")]
    size = manifest_gb(config, lookup)
    path = image_path.image_path(config, size)
    lines.append(f"  image    {config.container.image}")
    if config.nodes.image is not None:
        lines.append(f"  path     already on the disks of the baked image {config.nodes.image} (pull skipped)")
    else:
        lines.append(f"  size     {size_line(path, lookup)}")
        lines.append(f"  path     {path.describe()}")
    for warning in image_path.warnings(config, size):
        lines.append(f"  WARNING  {warning}")
    if config.nodes.bake:
        lines.append("  bake     after gpu-ready the head bakes an ECS custom image (bake-prep, bake-image): kept on "
                     "pulumi destroy, output bakedImageId; the head's container waits for it this time")
    return [*lines, section("Time to the first training step (modelled: devtools/schedule.py; docs/performance.md)"),
            *time_to_first_step(config, records, parallel, size)]


# ------------------------------------------------------------------------------------------------ the summary
@dataclass(frozen=True)
class PlanContext:
    """What the summary's sources read: the offline run, the stack's configuration, the image's size, the slots."""

    run: OfflineRun
    config: ClusterConfig
    lookup: registry.Lookup | None
    slots: int
    slots_how: str


def config_warnings(ctx: PlanContext) -> list[str]:
    """What `pulumi up` refuses that the offline plan runs on (placeholders, the local key checks)."""
    return [f"refused by `pulumi up`: {warning}" for warning in ctx.run.notes.get("config_warnings") or []]


def on_request_warning(ctx: PlanContext) -> list[str]:
    request = catalog.on_request(str(ctx.run.outputs.get("instanceType") or ""))
    return [f"{ctx.run.outputs.get('instanceType')} is sold only on request: {request} before `pulumi up`, or "
            "the account gets no instance whatever the stock"] if request else []


def image_warnings(ctx: PlanContext) -> list[str]:
    if _existing_machines(ctx.config) or ctx.config.nodes.image is not None:
        return []
    return image_path.warnings(ctx.config, manifest_gb(ctx.config, ctx.lookup))


def parallelism_warnings(ctx: PlanContext) -> list[str]:
    warning = parallelism.warning(ctx.config.nodes.count, ctx.slots, ctx.slots_how)
    return [warning] if warning else []


def backend_warnings(ctx: PlanContext) -> list[str]:
    if _existing_machines(ctx.config):
        return []
    return [line.removeprefix("  WARNING  ") for line in
            backend_lines(ctx.config, ctx.slots, manifest_gb(ctx.config, ctx.lookup))]


def unchecked_notes(ctx: PlanContext) -> list[str]:
    """What the offline plan cannot check (quotas, ...): infra/sources/alibaba/unchecked.py."""
    return [str(note) for note in ctx.run.notes.get("unchecked") or []]


# The summary's warnings and the plan-only notes, in order: add a function here (PlanContext -> lines) for a new
# kind; notes that follow from the configuration alone belong in infra/summary.py, NOTE_SOURCES (`pulumi up` too).
WARNING_SOURCES: list[Callable[[PlanContext], list[str]]] = [
    config_warnings, on_request_warning, image_warnings, parallelism_warnings, backend_warnings,
]
PLAN_NOTE_SOURCES: list[Callable[[PlanContext], list[str]]] = [unchecked_notes]

FRIENDLY_TYPES = {
    "alicloud:vpc/network:Network": "VPC", "alicloud:vpc/switch:Switch": "vSwitch",
    "alicloud:ecs/securityGroup:SecurityGroup": "security group", RULE: "security group rule",
    "alicloud:ecs/instance:Instance": "ECS instance", "alicloud:ecs/keyPair:KeyPair": "key pair",
    "alicloud:nas/fileSystem:FileSystem": "NAS file system", "alicloud:nas/mountTarget:MountTarget": "NAS mount target",
    "alicloud:nas/accessGroup:AccessGroup": "NAS access group", "alicloud:nas/accessRule:AccessRule": "NAS access rule",
}


def changes(run: OfflineRun) -> list[str]:
    """What `pulumi up` changes: offline the stack is new, so everything is created."""
    counts: dict[str, int] = {}
    for r in run.cloud.resources:
        if not r.type.startswith(("command:", "docker:", "pulumi:", "roll-cluster:")):
            name = FRIENDLY_TYPES.get(r.type, r.type.rsplit(":", 1)[-1])
            counts[name] = counts.get(name, 0) + 1
    created = ", ".join(f"{count} {name}{'s' if count > 1 else ''}" for name, count in counts.items()) \
        or "no cloud resource"
    head = [record.step for record in run.steps if record.node == "node-0"]
    span = f" ({head[0]} ... {head[-1]})" if head else ""
    return [f"a new stack: creates {created}; then {len(head)} steps on the head{span} and as many on each node, "
            "each idempotent",
            "an existing stack: `pulumi preview` lists what changes; what each later change does: --full"]


def time_line(ctx: PlanContext) -> list[str]:
    if _existing_machines(ctx.config):
        return ["not modelled for own hosts (their disks and network are unknown to the plan)"]
    image_gb = manifest_gb(ctx.config, ctx.lookup)
    path = schedule.configured_path(ctx.config)
    count = ctx.config.nodes.count
    here = schedule.first_step(ctx.config, ctx.run.steps, path, count, ctx.slots, schedule.NO_OPTIONS, image_gb)
    longest = max(here.critical_path, key=here.step_minutes)
    def total(other: schedule.Path) -> float:
        return schedule.first_step(ctx.config, ctx.run.steps, other, count, ctx.slots, schedule.NO_OPTIONS,
                                   image_gb).total

    others = ", ".join(f"{PATH_SHORT[other]} {total(other):.0f} min" for other in schedule.PATHS if other != path)
    lines = [f"{here.total:.0f} min to the first training step, modelled ({PATH_SHORT[path]}; longest step "
             f"{longest} {here.step_minutes(longest):.0f} min); {others}"]
    advice = baked_advice(ctx.config, total("warm"), here.total)
    return lines + ([advice] if advice else [])


# Above this many nodes the plan advises booting from a baked image (where the stack pulls its image): every node's
# bootstrap then finds its work done, and no registry or cache carries the image to N nodes.
BAKED_ADVICE_ABOVE = 16


def baked_advice(config: ClusterConfig, warm: float, here: float) -> str | None:
    """The advice for a large cluster that pulls its image: bake once, boot from the image; with the cost of keeping
    the image (infra/cost.py baked_image_cost)."""
    if (config.nodes.count <= BAKED_ADVICE_ABOVE or config.nodes.image is not None or config.nodes.bake
            or config.nodes.capabilities.existing_machines):
        return None
    size, monthly = cost.baked_image_cost(config)
    return (f"advice: boot from a baked image: {warm:.0f} min instead of {here:.0f}. Bake once: `pulumi up "
            f"--config-path -c roll-cluster:nodes.bake=true` (output bakedImageId), then set nodes.image to it; "
            f"keeping the image costs at most {monthly:.0f} CNY a month (snapshots of {size} GB at "
            f"{cost.SNAPSHOT_CNY_PER_GB_MONTH:g} CNY per GB-month, by the blocks written)")


PATH_SHORT: dict[schedule.Path, str] = {
    "new": "image and model as configured",
    "in-region": "image in the region's registry",
    "warm": "from a baked image",
}


def render_summary(run: OfflineRun, parallel: int | None = None, lookup: registry.Lookup | None = None) -> str:
    """The default plan: at most 50 lines (infra/summary.py)."""
    config = run.notes.get("config")
    out = offline_labels(run.outputs)
    slots, how = (parallel, "--parallel given to the plan") if parallel else schedule.default_parallel()
    heading = f"roll-cluster plan: stack {run.stack} (offline: no cloud contacted; --full for everything)"
    if not isinstance(config, ClusterConfig):
        return heading + "\n"
    ctx = PlanContext(run, config, lookup, slots, how)
    spec = run.notes.get("job_spec")
    facts: ClusterFacts | None = run.notes.get("facts")
    machine_type, location = (facts.machine_type, facts.location) if facts else ("unknown", "unknown")
    on_hosts = _existing_machines(config)
    per_node = int(out.get("gpus") or 0) // max(1, config.nodes.count)
    minutes = None if on_hosts else bootstrap_minutes(run, lookup)
    result = summary.Summary(
        heading=heading,
        placement=[summary.placement(config, machine_type, location, per_node,
                                     str(out.get("gpuModel")))],
        job=[summary.job(config, getattr(spec, "job_id", None))],
        cost=summary.cost_section(out.get("cost"), minutes, "the offline catalog's estimate"),
        exposure=summary.exposure(config),
        time=time_line(ctx),
        changes=changes(run),
        warnings=[line for source in WARNING_SOURCES for line in source(ctx)],
        notes=[*summary.notes(config), *(line for source in PLAN_NOTE_SOURCES for line in source(ctx))],
        next=["`pulumi up` (it opens with this summary); the whole plan: `python3 -m companion plan "
              f"{run.stack} --full`"],
    )
    return "\n".join(summary.summary_lines(result)) + "\n"


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


def bootstrap_minutes(run: OfflineRun, lookup: registry.Lookup | None = None) -> float | None:
    """The modelled minutes from `pulumi up` to the first training step on this stack's path (devtools/schedule.py):
    what the GPUs bill before training starts."""
    config = run.notes.get("config")
    if not isinstance(config, ClusterConfig):
        return None
    return schedule.minutes_to_first_step(config, run.steps, image_gb=manifest_gb(config, lookup))


def cost_lines(cost: Any, price: Any, run: OfflineRun, lookup: registry.Lookup | None = None) -> list[str]:
    """The whole cost: bootstrap, running, paused, after destroy, and when autostop fires; each with its source."""
    if not isinstance(cost, dict) or not isinstance(price, dict):
        return []
    running, paused = cost["running"], cost["paused"]
    currency = cost["currency"]
    lines = [section("Cost (currency and source of each figure)")]
    minutes = bootstrap_minutes(run, lookup)
    if minutes is not None:
        amount = minutes / 60.0 * float(running["perHour"])
        lines.append(f"  bootstrap     {amount:.2f} {currency} before the job runs: {minutes:.1f} min modelled "
                     f"(devtools/schedule.py) x {running['perHour']:.2f} {currency}/h running")
    lines.append(f"  running       {running['perHour']:.2f} {currency} per hour: instances "
                 f"{running['instances']['perHour']:.2f} ({running['instances']['source']})")
    disks = running["disks"]
    lines.append(f"                + disks {disks['perHour']:.2f} {disks['currency']}/h for {disks['gb']} GB ESSD "
                 f"({disks['source']})")
    lines.append(f"                  ({disks['classes']})")
    lines.extend(f"                + {extra}" for extra in disks["extras"])
    lines.append(f"                + {running['nas']}")
    lines.append(f"                + public traffic {running['publicTraffic']}")
    lines.append(f"  paused        {paused['perHour']:.2f} {paused['currency']} per hour (nodes.paused or autostop): "
                 f"keeps billing {paused['keepsBilling']}")
    lines.append(f"                stops billing: {paused['stopsBilling']}; restart {paused['restart']}")
    lines.append(f"                ({paused['source']})")
    for item in cost["afterDestroy"]:
        lines.append(f"  after destroy {item}")
    lines.append(f"  autostop      {cost['autostop']}")
    return lines


def cloud_rule_cidr(run: OfflineRun) -> str:
    rules = run.cloud.of_type("alicloud:nas/accessRule:AccessRule")
    return str(rules[0].inputs.get("sourceCidrIp")) if rules else "none"


DESCRIPTION = ("What `pulumi up` would build, offline (no cloud, no credentials, no Pulumi CLI): placement, the "
               "costs, exposure, the time to the first training step, warnings and what changes; --full for "
               "everything.")


def main(argv: Sequence[str] | None = None, prog: str = "python3 -m devtools.plan") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    parser.add_argument("stack", nargs="?", default="dev", help=f"one of: {', '.join(shipped_stacks())}")
    parser.add_argument("--full", action="store_true", help="everything, not only the summary: network, nodes, "
                        "each node's steps, the container, Ray, the job's generated configuration, the outputs")
    parser.add_argument("--nodes", type=int, help="override nodes.count")
    parser.add_argument("--parallel", type=int, help="Pulumi's parallelism to model (default: PULUMI_PARALLEL, else "
                        "4 x this machine's CPU count, as `pulumi up`)")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=JSON",
        help="deep-merge a value over the stack file's, e.g. "
        "'roll-cluster:training={\"roll\": {\"baseConfig\": \"x/y.yaml\"}}' (repeatable)",
    )
    parser.add_argument("--no-registry", action="store_true", help="do not ask the image's registry for its "
                        "manifest (the image's size is then the estimate; also ROLL_CLUSTER_NO_REGISTRY=1)")
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
    lookup = image_lookup(run.notes.get("config"), asked=not args.no_registry)
    sys.stdout.write(plan_text(run, args.parallel, lookup) if args.full else render_summary(run, args.parallel, lookup))
    return 0


if __name__ == "__main__":
    sys.exit(main())

