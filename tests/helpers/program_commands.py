"""The commands the Pulumi program itself renders, for a cluster whose nodes are the test hosts.

The program runs under the project's offline cloud (devtools/offline_cloud.py) with the test hosts' addresses handed to
the instances, exactly as `python3 dev.py plan` runs it; the Ray and job steps' `create` and `delete` strings and
the stack outputs are taken from what it registered. Nothing is rebuilt here: a change in the components, the
Ray step builders or the scripts changes what the tier runs.
"""

from __future__ import annotations

import resource
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.offline_cloud import OfflineCloud, run_program, stack_config, unwrap
from infra.layout import PROJECT_DIR
from infra.node import remote

# V100 types of the catalog by GPUs per node: the GPU count is a test parameter (Ray is told --num-gpus).
TYPE_WITH_GPUS = {1: "ecs.gn6v-c8g1.2xlarge", 2: "ecs.gn6v-c8g1.4xlarge", 4: "ecs.gn6v-c8g1.8xlarge",
                  8: "ecs.gn6v-c8g1.16xlarge"}


@dataclass(frozen=True)
class ProgramCommands:
    head: StepCommand
    workers: list[str]  # rank 1.. in order
    ready: str
    submit: str | None  # None with training.autoStart false
    job_stop: str | None  # the job's delete command (pulumi destroy, or a replaced job), as it runs on the head
    ray_stop: list[str]  # every node's Ray delete command, rank 0 first, as it runs on the node
    outputs: dict[str, Any]
    rendered_config: str | None  # the training configuration the job step ships (ROLL's YAML)
    known_hosts: str  # the stack's known-hosts local command (create, in its directory, with its environment)
    container_command: list[str]  # the training container's command (its main process)
    # The local teardown commands `pulumi destroy` runs (job first, then Ray, rank 0 first): their environments.
    teardowns: list[dict[str, str]]
    cloud: OfflineCloud  # the run's state: what `pulumi destroy` would delete, and in which order (engine_model)
    # nodes.autostop: the head's watcher step and its delete, as they run on the head; None without it.
    autostop: StepCommand | None = None
    autostop_remove: str | None = None
    spot_notices: dict[str, StepCommand] = field(default_factory=dict)  # node name -> its spot-notice step (create)
    instance_ids: list[str] = field(default_factory=list)  # the ECS instances the offline cloud made, rank 0 first


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
    container: str = "roll",
    storage: Mapping[str, Any] | None = None,
    nodes: Mapping[str, Any] | None = None,
    prior: OfflineCloud | None = None,
) -> ProgramCommands:
    """Run the program on len(ips) nodes whose public and private addresses are `ips`, for a `custom` job of
    `entrypoint` or, given `training`, that training section (e.g. a ROLL job).

    host_key_files: each node's sshd host key (private; `.pub` beside it), handed to the program as the keys it
    generated, so that the SSH clients it configures verify the test hosts as they would verify real nodes.
    nodes: further nodes settings (spot, autostop).
    prior: the cloud of an earlier run of the same stack: this run is the next `pulumi up` (cloud.changes, cloud.ops
    say what the engine does)."""
    host_keys = {
        f"node-{rank}": path.read_text() + path.with_name(path.name + ".pub").read_text()
        for rank, path in enumerate(host_key_files)
    }
    cloud = OfflineCloud(node_public_ips=list(ips), node_private_ips=list(ips), host_keys=host_keys,
                         prior=list(prior.resources) if prior is not None else [])
    gcs, dashboard_port, client = ports
    result = run_program(
        "multi",
        cloud=cloud,
        replace_config={
            "roll-cluster:nodes": {"count": len(ips), "instanceTypes": [TYPE_WITH_GPUS[gpus_per_node]],
                                   **(nodes or {})},
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
            "roll-cluster:storage": dict(storage) if storage is not None else {"nas": False},
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
    # Every local teardown that reaches a node (autostop's watcher too, on by default on Alibaba).
    teardowns = [inputs(f"{name}-teardown")["environment"] for name in ["training-job", "autostop", *ray_steps]
                 if f"{name}-teardown" in names]
    return ProgramCommands(
        head=ssh_command(inputs("node-0-ray-head")),
        workers=[ssh_command(inputs(name)) for name in workers],
        ready=ssh_command(inputs("ray-ready")),
        submit=ssh_command(job) if job else None,
        job_stop=inputs("training-job-teardown")["environment"]["REMOTE_COMMAND"] if job else None,
        ray_stop=[inputs(f"{name}-teardown")["environment"]["REMOTE_COMMAND"] for name in ray_steps],
        outputs=result.outputs,
        rendered_config=result.notes["job_spec"].rendered_config if "job_spec" in result.notes else None,
        known_hosts=_local_command(inputs("known-hosts")),
        container_command=list(inputs("node-0-container")["command"]),
        teardowns=[dict(env) for env in teardowns],
        cloud=cloud,
        autostop=ssh_command(inputs("autostop")) if "autostop" in names else None,
        autostop_remove=_teardown_command(cloud, "autostop") if "autostop" in names else None,
        spot_notices={name.removesuffix("-spot-notice"): ssh_command(inputs(name)) for name in sorted(names)
                      if name.endswith("-spot-notice")},
        instance_ids=[str(cloud.named(f"node-{rank}-instance").id) for rank in range(len(ips))],
    )


@dataclass(frozen=True)
class LibraryCopy:
    """A node's script library step (pulumi-command CopyToRemote): the staged directory whose files it copies over
    SFTP, as the connection's user, into `remote_path` (infra/node/remote.py)."""

    source: Path
    remote_path: str
    user: str = "root"


def library_copy(inputs: Mapping[str, Any]) -> LibraryCopy:
    """The copy a CopyToRemote's inputs specify (its archive's path is relative to the project)."""
    return LibraryCopy(PROJECT_DIR / str(inputs["source"]["path"]), str(inputs["remotePath"]),
                       str(inputs["connection"]["user"]))


class StepCommand(str):
    """A remote step as pulumi-command runs it: the command (`create`) and the text it reads on the SSH session's
    stdin (infra/node/remote.py); the harness's runner sends `stdin` (e2e_harness.RunningCommand). `library`: the
    node's script library the step sources, which the harness copies to the host first, as the node's library step
    (every step depends on it) would have."""

    stdin: str | None
    library: LibraryCopy | None

    def __new__(cls, command: str, stdin: str | None = None, library: LibraryCopy | None = None) -> StepCommand:
        made = super().__new__(cls, command)
        made.stdin = stdin
        made.library = library
        return made

    def prefixed(self, exports: str) -> StepCommand:
        """The same step with `exports` run first (variables the step's bash inherits)."""
        return StepCommand(exports + self, self.stdin, self.library)


def ssh_command(inputs: Mapping[str, Any]) -> StepCommand:
    text = inputs.get("stdin")
    user = str(inputs["connection"]["user"])
    # The library every node's step registers (tests/offline/test_script_library.py checks the program registers
    # this one).
    library = LibraryCopy(PROJECT_DIR / remote.staged_library(), remote.library_remote_path(user), user)
    return StepCommand(str(inputs["create"]), None if text is None else str(text), library)


def _local_command(inputs: Mapping[str, Any], checkout: Path = PROJECT_DIR) -> str:
    """A pulumi-command local.Command as one shell line: its `create` run with its `environment` in the project root
    of the checkout that runs `up` (`checkout`; no `dir`: the provider's working directory,
    local/commandOutputs.go). See verified-facts#program-commands-commandoutputs."""
    env = " ".join(f"{key}={shlex.quote(str(value))}" for key, value in inputs["environment"].items())
    return f"cd {shlex.quote(str(inputs.get('dir', checkout)))} && env {env} {inputs['create']}"


def _public_key_of(private_key_path: str) -> str:
    import subprocess

    return subprocess.run(
        ["ssh-keygen", "-y", "-f", private_key_path], check=True, capture_output=True, text=True
    ).stdout.strip()


# ------------------------------------------------------------------------------ the whole program on hosts
@dataclass(frozen=True)
class ProgramStep:
    """One step the program registered, as the test tier runs it.

    kind: "remote" (`command` over SSH on `node`), "local" (`command` with `env` on the machine running `pulumi
    up`), "copy" (the node's script library, copied over SFTP: `library`), "image" (the RemoteImage: the image
    must be on the node) or "container" (the docker.Container, turned into the `docker run` it stands for:
    `command`)."""

    key: str  # "node-0/docker"
    node: str
    kind: str
    depends_on: tuple[str, ...]
    command: str
    env: dict[str, str]
    user: str = "root"  # the SSH user of a remote step (its connection's)
    resource: str = ""  # the Pulumi resource the step is (cloud.ops names it)
    library: LibraryCopy | None = None  # kind "copy": the node's script library


@dataclass(frozen=True)
class HostsProgram:
    steps: list[ProgramStep]  # in the order the program registered them
    ray_stop: list[str]  # every node's Ray delete command, rank 0 first
    job_stop: str | None
    outputs: dict[str, Any]
    cloud: OfflineCloud | None = None  # the run's state (the next run's prior; cloud.ops: what this `up` does)


def render_hosts_program(
    stack: str,
    hosts: Sequence[str],
    key_path: str,
    *,
    accelerators_per_node: int,
    container: str,
    ports: tuple[int, int, int],
    entrypoint: str,
    working_dir: str,
    shared_host_path: str | None = None,
    user: str = "root",
    prior: OfflineCloud | None = None,
    training: Mapping[str, Any] | None = None,
    image: str | None = None,
) -> HostsProgram:
    """Run the program for `stack` (a `hosts` stack) with the test hosts as nodes.hosts and a `custom` job (or,
    given `training`, that training section); given `prior` (an earlier run's cloud), as the next `pulumi up` of
    that state. `image`: the container image (by default the tier's test image, e2e_harness.TEST_IMAGE)."""
    from e2e_harness import TEST_IMAGE

    gcs, dashboard_port, client = ports
    base = stack_config(stack)["roll-cluster:nodes"]
    nodes = {
        "source": "hosts",
        "accelerator": base.get("accelerator", "nvidia"),
        "acceleratorsPerNode": accelerators_per_node,
        "hosts": [{"address": ip} for ip in hosts],
        "hostDefaults": {"networkInterface": "eth0", "user": user},
    }
    result = run_program(
        stack,
        cloud=prior.next_run() if prior is not None else None,
        replace_config={
            "roll-cluster:nodes": nodes,
            "roll-cluster:access": {"sshPrivateKeyPath": key_path},
            "roll-cluster:container": {"name": container, "image": image or TEST_IMAGE, "shmSize": "1g"},
            "roll-cluster:ray": {"gcsPort": gcs, "dashboardPort": dashboard_port, "clientPort": client,
                                 "objectStoreMemoryGb": 0.1, "readyTimeoutSeconds": 90,
                                 "headWaitTimeoutSeconds": 120},
            "roll-cluster:training": dict(training) if training is not None else {
                "framework": "custom", "custom": {"entrypoint": entrypoint, "workingDir": working_dir}},
            "roll-cluster:storage": {"sharedHostPath": shared_host_path} if shared_host_path else {},
        },
    )
    cloud = result.cloud
    steps: list[ProgramStep] = []
    # Each node's script library first (its CopyToRemote: every remote step of the node depends on it).
    libraries = {r.name.removesuffix("-scripts"): library_copy(dict(unwrap(r.inputs)))
                 for r in cloud.of_type("command:remote:CopyToRemote")}
    for node, copy in libraries.items():
        steps.append(ProgramStep(f"{node}/scripts", node, "copy", (), "", {}, copy.user, f"{node}-scripts", copy))
    for record in result.steps:
        inputs = dict(unwrap(cloud.named(record.resource_name).inputs))
        command, env, login = "", {}, "root"
        kind = record.kind
        if kind == "remote":
            command, login = ssh_command(inputs), inputs["connection"]["user"]
        elif kind == "local":
            command, env = inputs["create"], dict(inputs.get("environment") or {})
        elif record.step == "image":
            kind, command = "image", f"docker image inspect {shlex.quote(inputs['name'])} >/dev/null"
        else:
            node_image = dict(unwrap(cloud.named(f"{record.node}-image").inputs))["name"]
            kind, command = "container", docker_run_command(inputs, node_image)
        depends_on = (*record.depends_on, f"{record.node}/scripts") if kind == "remote" else record.depends_on
        steps.append(ProgramStep(f"{record.node}/{record.step}", record.node, kind, depends_on, command, env,
                                 login, record.resource_name))
    names = {r.name for r in cloud.resources}
    ray_names = ["node-0-ray-head", *sorted(n for n in names if n.endswith("-ray-worker"))]
    job = dict(unwrap(cloud.named("training-job").inputs)) if "training-job" in names else None
    return HostsProgram(
        steps=steps,
        # The delete steps run through each step's local teardown (infra/node/steps.py): their remote command.
        ray_stop=[_teardown_command(cloud, n) for n in ray_names],
        job_stop=_teardown_command(cloud, "training-job") if job else None,
        outputs=result.outputs,
        cloud=cloud,
    )


def _teardown_command(cloud: OfflineCloud, step_resource: str) -> str:
    """The command a step's teardown runs on the node when the step is deleted (its REMOTE_COMMAND)."""
    environment = dict(unwrap(cloud.named(f"{step_resource}-teardown").inputs)["environment"])
    return str(environment["REMOTE_COMMAND"])


# CAP_SYS_RESOURCE, bit 24 of a capability set (linux/capability.h).
_CAP_SYS_RESOURCE = 1 << 24
_RLIMITS = {"memlock": resource.RLIMIT_MEMLOCK, "nofile": resource.RLIMIT_NOFILE, "stack": resource.RLIMIT_STACK}


def _ulimit_here(name: str, soft: int, hard: int) -> str:
    """`--ulimit NAME=SOFT:HARD`, as this machine can grant it. runc sets a container's limits with the capabilities
    of dockerd, and raising a hard limit needs CAP_SYS_RESOURCE: a real node's root has it, a test machine that is
    itself a container may not (ours has not: "error setting rlimit type 8: operation not permitted"). There a limit
    above the machine's hard limit becomes that hard limit: the one part of the container's specification the tier
    cannot reproduce (program_commands' callers assert the program's own inputs, -1:-1 for memlock)."""
    effective = next(line for line in Path("/proc/self/status").read_text().splitlines()
                     if line.startswith("CapEff:"))
    limit = _RLIMITS.get(name)
    if limit is None or int(effective.split()[1], 16) & _CAP_SYS_RESOURCE:
        return f"{name}={soft}:{hard}"
    ceiling = resource.getrlimit(limit)[1]
    if ceiling == resource.RLIM_INFINITY:
        return f"{name}={soft}:{hard}"

    def clamp(value: int) -> int:
        return ceiling if value < 0 or value > ceiling else value

    return f"{name}={clamp(soft)}:{clamp(hard)}"


def docker_run_command(inputs: Mapping[str, Any], image_name: str) -> str:
    """The `docker run` that pulumi-docker's Container with these inputs amounts to (the provider creates the
    container through the Docker API; under mocks it does not run, so the tier performs the same creation with the
    node's real dockerd). Every input the program sets is translated; an input this does not know fails the test.
    The container's `image` is the RemoteImage's imageId, which the mocks make up: on the node it is the real ID of
    the image named `image_name` (the RemoteImage's name), as the provider reads it."""
    known = {"name", "image", "command", "gpus", "networkMode", "ipcMode", "shmSize", "volumes", "devices", "envs",
             "restart", "init", "mustRun", "ulimits", "privileged"}
    unknown = sorted(set(inputs) - known)
    if unknown:
        raise AssertionError(f"docker.Container inputs the e2e translation does not know: {unknown}")
    args = ["docker", "run", "-d", "--name", inputs["name"]]
    if inputs.get("init"):
        args.append("--init")
    args += ["--network", inputs["networkMode"]]
    if inputs.get("ipcMode"):
        args += ["--ipc", inputs["ipcMode"]]
    if inputs.get("shmSize"):
        args += ["--shm-size", f"{int(inputs['shmSize'])}m"]
    if inputs.get("restart"):
        args += ["--restart", inputs["restart"]]
    if inputs.get("gpus"):
        args += ["--gpus", inputs["gpus"]]
    if inputs.get("privileged"):
        args.append("--privileged")
    for device in inputs.get("devices") or []:
        args += ["--device", f"{device['hostPath']}:{device.get('containerPath', device['hostPath'])}:"
                             f"{device.get('permissions', 'rwm')}"]
    for volume in inputs.get("volumes") or []:
        mode = ":ro" if volume.get("readOnly") else ""
        args += ["-v", f"{volume['hostPath']}:{volume['containerPath']}{mode}"]
    for limit in inputs.get("ulimits") or []:
        args += ["--ulimit", _ulimit_here(limit["name"], int(limit["soft"]), int(limit["hard"]))]
    for env in inputs.get("envs") or []:
        args += ["-e", env]
    image_id = f"\"$(docker image inspect --format '{{{{.Id}}}}' -- {shlex.quote(image_name)})\""
    run = " ".join([*(shlex.quote(str(a)) for a in args), image_id,
                    *(shlex.quote(str(a)) for a in inputs.get("command") or [])])
    # must_run: an existing running container of that name is kept, as the provider keeps its resource.
    name = shlex.quote(inputs["name"])
    return f"docker inspect --format '{{{{.State.Running}}}}' {name} >/dev/null 2>&1 || {run}"
