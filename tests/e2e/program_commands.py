"""The commands the Pulumi program itself renders, for a cluster whose nodes are the test hosts.

The program runs under the project's offline cloud (infra/offline.py) with the test hosts' addresses handed to
the instances, exactly as `python3 dev.py plan` runs it; the Ray and job steps' `create` and `delete` strings and
the stack outputs are taken from what it registered. Nothing is rebuilt here: a change in the components, the
Ray step builders or the scripts changes what the tier runs.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.node import steps
from infra.offline import OfflineCloud, run_program, unwrap

# V100 types of the catalog by GPUs per node: the GPU count is a test parameter (Ray is told --num-gpus).
TYPE_WITH_GPUS = {1: "ecs.gn6v-c8g1.2xlarge", 2: "ecs.gn6v-c8g1.4xlarge", 4: "ecs.gn6v-c8g1.8xlarge",
                  8: "ecs.gn6v-c8g1.16xlarge"}


@dataclass(frozen=True)
class ProgramCommands:
    head: str
    workers: list[str]  # rank 1.. in order
    ready: str
    submit: str | None  # None with training.autoStart false
    job_stop: str | None  # the job's delete command (pulumi destroy, or a replaced job)
    ray_stop: list[str]  # every node's Ray delete command, rank 0 first
    outputs: dict[str, Any]
    rendered_config: str | None  # the training configuration the job step ships (ROLL's YAML)
    known_hosts: str  # the stack's known-hosts local command (create, in its directory, with its environment)


def render_cluster(
    ips: Sequence[str],
    key_path: str,
    *,
    gpus_per_node: int = 2,
    ports: tuple[int, int, int] = (6379, 8265, 10001),
    entrypoint: str = "python3 -c 'import ray; ray.init(); print(ray.cluster_resources())'",
    working_dir: str = "/tmp",
    dashboard: str = "admin-cidrs",
    ray: Mapping[str, Any] | None = None,
    secrets: Mapping[str, str] | None = None,
    training: Mapping[str, Any] | None = None,
    host_key_files: Sequence[Path] = (),
) -> ProgramCommands:
    """Run the program on len(ips) nodes whose public and private addresses are `ips`, for a `custom` job of
    `entrypoint` or, given `training`, that training section (e.g. a ROLL job).

    host_key_files: each node's sshd host key (private; `.pub` beside it), handed to the program as the keys it
    generated, so that the SSH clients it configures verify the test hosts as they would verify real nodes."""
    host_keys = {
        f"node-{rank}": path.read_text() + path.with_name(path.name + ".pub").read_text()
        for rank, path in enumerate(host_key_files)
    }
    cloud = OfflineCloud(node_public_ips=list(ips), node_private_ips=list(ips), host_keys=host_keys)
    gcs, dashboard_port, client = ports
    result = run_program(
        "multi",
        cloud=cloud,
        replace_config={
            "roll-cluster:nodes": {"count": len(ips), "instanceTypes": [TYPE_WITH_GPUS[gpus_per_node]]},
            "roll-cluster:access": {
                "adminCidrs": ["198.18.0.0/24"],
                "sshPublicKey": _public_key_of(key_path),
                "sshPrivateKeyPath": key_path,
                "dashboard": dashboard,
            },
            "roll-cluster:ray": {"gcsPort": gcs, "dashboardPort": dashboard_port, "clientPort": client,
                                 "objectStoreMemoryGb": 0.1, **(ray or {})},
            "roll-cluster:training": training or {"framework": "custom",
                                                  "custom": {"entrypoint": entrypoint, "workingDir": working_dir}},
            "roll-cluster:storage": {"nas": False},
        },
        secrets={f"roll-cluster:{key}": value for key, value in (secrets or {}).items()},
    )

    def inputs(name: str) -> dict[str, Any]:
        return dict(unwrap(cloud.named(name).inputs))

    names = {r.name for r in cloud.resources}
    workers = [f"node-{rank}-ray-worker" for rank in range(1, len(ips))]
    job = inputs("training-job") if "training-job" in names else None
    return ProgramCommands(
        head=inputs("node-0-ray-head")["create"],
        workers=[inputs(name)["create"] for name in workers],
        ready=inputs("ray-ready")["create"],
        submit=job["create"] if job else None,
        job_stop=job["delete"] if job else None,
        ray_stop=[inputs(name)["delete"] for name in ["node-0-ray-head", *workers]],
        outputs=result.outputs,
        rendered_config=steps.NOTES["job_spec"].rendered_config if "job_spec" in steps.NOTES else None,
        known_hosts=_local_command(inputs("known-hosts")),
    )


def _local_command(inputs: Mapping[str, Any]) -> str:
    """A pulumi-command local.Command as one shell line: its `create` run in its `dir` with its `environment`."""
    env = " ".join(f"{key}={shlex.quote(str(value))}" for key, value in inputs["environment"].items())
    return f"cd {shlex.quote(inputs['dir'])} && env {env} {inputs['create']}"


def _public_key_of(private_key_path: str) -> str:
    import subprocess

    return subprocess.run(
        ["ssh-keygen", "-y", "-f", private_key_path], check=True, capture_output=True, text=True
    ).stdout.strip()
