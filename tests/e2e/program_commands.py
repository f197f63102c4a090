"""The commands the Pulumi program itself renders, for a cluster whose nodes are the test hosts.

The program runs under the project's offline cloud (infra/offline.py) with the test hosts' addresses handed to
the instances, exactly as `python3 dev.py plan` runs it; the Ray and job steps' `create` and `delete` strings and
the stack outputs are taken from what it registered. Nothing is rebuilt here: a change in the components, the
Ray step builders or the scripts changes what the tier runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
    job_stop: str | None  # the job's delete command (pulumi destroy, or a replaced job), as it runs on the head
    ray_stop: list[str]  # every node's Ray delete command, rank 0 first, as it runs on the node
    outputs: dict[str, Any]
    container_command: list[str]  # the training container's command (its main process)
    # The local teardown commands `pulumi destroy` runs (job first, then Ray, rank 0 first): their environments.
    teardowns: list[dict[str, str]]


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
    container: str = "roll",
) -> ProgramCommands:
    """Run the program for a `custom` job on len(ips) nodes whose public and private addresses are `ips`."""
    cloud = OfflineCloud(node_public_ips=list(ips), node_private_ips=list(ips))
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
            "roll-cluster:training": {"framework": "custom",
                                      "custom": {"entrypoint": entrypoint, "workingDir": working_dir}},
            "roll-cluster:storage": {"nas": False},
            "roll-cluster:container": {"name": container},
        },
        secrets={f"roll-cluster:{key}": value for key, value in (secrets or {}).items()},
    )

    def inputs(name: str) -> dict[str, Any]:
        return dict(unwrap(cloud.named(name).inputs))

    names = {r.name for r in cloud.resources}
    workers = [f"node-{rank}-ray-worker" for rank in range(1, len(ips))]
    job = inputs("training-job") if "training-job" in names else None
    ray_steps = ["node-0-ray-head", *workers]
    teardowns = [inputs(f"{name}-teardown")["environment"] for name in ["training-job", *ray_steps]
                 if f"{name}-teardown" in names]
    return ProgramCommands(
        head=inputs("node-0-ray-head")["create"],
        workers=[inputs(name)["create"] for name in workers],
        ready=inputs("ray-ready")["create"],
        submit=job["create"] if job else None,
        job_stop=inputs("training-job-teardown")["environment"]["REMOTE_COMMAND"] if job else None,
        ray_stop=[inputs(f"{name}-teardown")["environment"]["REMOTE_COMMAND"] for name in ray_steps],
        outputs=result.outputs,
        container_command=list(inputs("node-0-container")["command"]),
        teardowns=[dict(env) for env in teardowns],
    )


def _public_key_of(private_key_path: str) -> str:
    import subprocess

    return subprocess.run(
        ["ssh-keygen", "-y", "-f", private_key_path], check=True, capture_output=True, text=True
    ).stdout.strip()
