"""The offline plan: run the real program for a stack under the offline cloud and print what `pulumi up` would
build: placement, network and rules, nodes, each node's steps with their scripts, the Ray cluster, the job with
its generated configuration, the stack outputs and the hourly price.

    python -m infra.plan dev [--nodes N]

No credentials, no Pulumi CLI: see infra/offline.py for what the offline cloud answers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from infra.changes import CHANGE_EFFECTS, REBOOT_EFFECTS
from infra.config import ConfigError
from infra.node import steps
from infra.offline import OfflineCloud, OfflineRun, run_program, shipped_stacks
from infra.sources.alibaba.placement import PlacementError

RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"


def section(title: str) -> str:
    return f"\n== {title} " + "=" * max(0, 96 - len(title)) + "\n"


def render(run: OfflineRun) -> str:
    cloud, out = run.cloud, run.outputs
    lines: list[str] = [f"roll-cluster offline plan: stack {run.stack} (no cloud contacted; see infra/offline.py)"]
    lines.append(section("Placement"))
    tried = steps.NOTES.get("placement_tried") or []
    for note in tried:
        lines.append(f"  skipped  {note}")
    lines.append(f"  zone          {out.get('zone')}")
    lines.append(f"  instance type {out.get('instanceType')}  ({out.get('gpuModel')}, "
                 f"{out.get('gpus')} GPUs in {len(out.get('nodes') or [])} nodes)")
    lines.append(f"  OS image      {steps.NOTES.get('image_name')}")
    price = out.get("hourlyPrice")
    lines.append(f"  price         {f'{price:.2f} per hour (region list price)' if price else 'not reported'}")

    lines.append(section("Network"))
    for r in cloud.resources:
        if r.type == "alicloud:vpc/network:Network":
            lines.append(f"  VPC       {r.inputs.get('vpcName')}  {r.inputs.get('cidrBlock')}")
        if r.type == "alicloud:vpc/switch:Switch":
            name, cidr = r.inputs.get("vswitchName"), r.inputs.get("cidrBlock")
            lines.append(f"  vSwitch   {name}  {cidr}  in {r.inputs.get('zoneId')}")
    lines.append("  Security group, inbound (everything else is denied):")
    for r in cloud.of_type(RULE):
        source = r.inputs.get("cidrIp") or r.inputs.get("ipv6CidrIp") or "members of this security group"
        lines.append(f"    {r.inputs.get('ipProtocol'):4} {r.inputs.get('portRange'):12} from {source:32} "
                     f"{r.inputs.get('description')}")
    for r in cloud.of_type("alicloud:nas/fileSystem:FileSystem"):
        lines.append(section("Shared storage"))
        keep = "kept on pulumi destroy" if steps.NOTES.get("nas_retained") else "DELETED on pulumi destroy"
        lines.append(f"  NAS {r.inputs.get('protocolType')} {r.inputs.get('storageType')}, mounted at /mnt/shared "
                     f"on every node and container; {keep}")

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

    lines.append(section("Steps per node (in order; '<-' lists what a step waits for)"))
    by_node: dict[str, list[steps.StepRecord]] = {}
    for record in run.steps:
        by_node.setdefault(record.node, []).append(record)
    for node, records in by_node.items():
        lines.append(f"  {node}:")
        for record in records:
            scripts = ", ".join(record.scripts) if record.scripts else f"pulumi-docker ({record.kind})"
            deps = ", ".join(record.depends_on) or "first boot"
            lines.append(f"    {record.step:14} {scripts:44} <- {deps}")
    lines.append("  (first boot: infra/scripts/first_boot.sh as user data; it starts the GPU driver installer)")

    lines.append(section("What a later change or a reboot does"))
    for what, effect in (*CHANGE_EFFECTS, *REBOOT_EFFECTS):
        lines.append(f"  {what}:")
        lines.append(f"      {effect}")

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
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.plan", description=__doc__.splitlines()[0])
    parser.add_argument("stack", nargs="?", default="dev", help=f"one of: {', '.join(shipped_stacks())}")
    parser.add_argument("--nodes", type=int, help="override nodes.count")
    args = parser.parse_args(argv)
    config: dict[str, Any] = {}
    if args.nodes is not None:
        config["roll-cluster:nodes"] = {"count": args.nodes}
    try:
        run = run_program(args.stack, cloud=OfflineCloud(), config=config)
    except (ConfigError, PlacementError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(render(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())

