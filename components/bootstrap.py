"""Bootstrap one node: host preparation, Docker + NVIDIA toolkit, the image pull overlapping the driver
installation, GPU readiness that survives the installer's reboot, the training container, framework code.

Order on a node (nothing here waits for another node):

    prepare-host -> docker -> pull-image -> gpu-ready | npu-ready -> image, container -> code
                                  (driver installs since first boot, in parallel with all of the above)

With nodes.bake the head takes a detour before its container: bake-prep (the framework's requirements committed
into the local training image, disks flushed) -> bake-image (the ECS custom image, components/alibaba/baked_image.py)
-> container. The container comes after the image so that no node booted from it finds this node's container.
On a node booted from a baked image every step finds its work done and says so (docs/performance.md, 'Baked images').

What depends on the accelerator (readiness step, devices, driver mounts, NCCL/HCCL environment, NVIDIA runtime)
comes from infra/node/accelerators.py. On a machine the program did not create (Machine.existing: your own host)
an existing Docker and NVIDIA toolkit are used as they are and only what is missing is installed; the driver is
checked, never installed.

The image pull starts as soon as Docker runs, while the driver installer (started by the first-boot user data)
is still working. gpu-ready comes after the pull because it is the step that reboots the node when the
installer asks for it: so no step is ever running while the node reboots. It is a local command that polls the
node over ssh and reconnects across the reboot (a remote command would fail with the dropped connection).
The container is created by pulumi-docker over SSH, through a provider that is only used once Docker is
installed, and only after gpu-ready: nothing talks to the node while it may reboot. Values that depend on the
cluster's size (WORLD_SIZE, device mappings) are not in the container: they belong to the job, so growing the
cluster never recreates a running node's container.

After a reboot the node rejoins by itself: the docker step orders docker.service after the data disk and NAS
mounts (docker_mount_order.sh), Docker restarts the container (unless-stopped), and the container's main process
(container_main.sh) starts Ray from the settings the Ray steps recorded in it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_command as command
import pulumi_docker as docker

from components import remote_steps
from infra import model_cache, pull_cache
from infra.config import ClusterConfig
from infra.layout import DATA_MOUNT, SHARED_MOUNT, WORKSPACE
from infra.node import accelerators, remote, ssh_access, steps
from infra.node import known_hosts as known_hosts_module
from infra.ray import step_env
from infra.sources.base import Machine

GPU_READY_TIMEOUT_S = 2400
BAKE_CONTAINER = "roll-cluster-bake"  # the throw-away container bake-prep installs the requirements in
CONTAINER_MAIN_SCRIPT = "container_main.sh"


def container_command() -> list[str]:
    """The training container's command: container_main.sh (keeps the container up and Ray running as recorded),
    after ray_launch.sh (the start function it shares with the Ray steps). The same text for every setting, so a
    changed setting never recreates the container."""
    parts = []
    # ray_launch.sh: launch_recorded_ray, the function the Ray steps start Ray with; the main process restarts
    # Ray through it too.
    for name in (step_env.RAY_LAUNCH_SCRIPT, CONTAINER_MAIN_SCRIPT):
        lines = remote.script_path(name).read_text().splitlines()
        if lines and lines[0].startswith("#!"):
            lines = lines[1:]
        parts.append(f"# ---- {name} ----\n" + "\n".join(lines) + "\n")
    return ["bash", "-c", "".join(parts), "container-main"]


@dataclass(frozen=True)
class CacheRef:
    """A pull cache another node's steps use: its step (what pulls wait for) and the address it serves."""

    key: str  # its step key ("node-0/pull-cache")
    step: pulumi.Resource
    address: pulumi.Input[str]  # the private IP of the node that runs it


@dataclass(frozen=True)
class NodeBootstrapArgs:
    config: ClusterConfig
    machine: Machine
    gpus_per_node: int
    fabric_manager: bool  # an 8-GPU NVSwitch type: nvidia-fabricmanager must run (infra/sources/alibaba/catalog.py)
    head_private_ip: pulumi.Input[str]
    nas_server: pulumi.Input[str] | None
    private_key: pulumi.Output[str] | None  # None: through ssh-agent
    login: ssh_access.LoginKey
    run: steps.RunContext  # the program's run: the steps are recorded there
    known_hosts: known_hosts_module.KnownHosts
    registry_password: pulumi.Output[str] | None
    code_env: dict[str, str] | None
    code_scripts: tuple[str, ...] = ("fetch_code.sh",)  # the framework's code step, in order
    accelerator: accelerators.Accelerator = accelerators.NVIDIA
    nfs_export: str = "/"  # the path nas_server exports
    nfs_options: str | None = None  # NFS mount options; None: prepare_host.sh's defaults (Alibaba NAS)
    shared_host_dir: str | None = None  # a host directory that is already shared, bind-mounted at SHARED_MOUNT
    # The pull cache (infra/pull_cache.py): the stack's layout (None: no cache), this node's index in the cluster and
    # the caches the nodes before it run (by node index); a node whose index is in the layout's caches runs one.
    cache_plan: pull_cache.CachePlan | None = None
    node_index: int = 0
    caches: dict[int, CacheRef] | None = None


class NodeBootstrap(pulumi.ComponentResource):
    container_name: str
    container: docker.Container
    ready: pulumi.Resource  # the last bootstrap step: Ray steps depend on it
    ready_key: str  # its step key ("node-1/code")
    # What the node's weights-prefetch step (components/training_job.py) waits for: prepare-host (the shared storage
    # is mounted then), and the accelerator's readiness where it may reboot the node (the driver installer).
    prefetch_after: list[tuple[str, pulumi.Resource]]
    shared_host_dir: str  # the host's path of the shared storage (SHARED_MOUNT, or storage.sharedHostPath)
    baked_image_id: pulumi.Output[str] | None = None  # the custom image baked from this node (nodes.bake)
    cache: CacheRef | None = None  # the pull cache this node runs, for the nodes that pull through it

    def _pull_cache(self, args: NodeBootstrapArgs, ctx: remote_steps.StepContext,
                    prepared: tuple[str, pulumi.Resource], has_data_disk: bool) -> CacheRef | None:
        """The cache this node pulls through (None: none), after the pull-cache step of a node that runs one: the
        head's fills from the image's registry with its credentials; a fan-out cache fills from the head's."""
        plan, index = args.cache_plan, args.node_index
        if plan is None:
            return None
        caches = args.caches or {}
        if index not in plan.caches:
            return caches[plan.pulls_from[index]]
        config, machine = args.config, args.machine
        registry_url, repository = pull_cache.upstream(config.container.pull_image)
        head = caches.get(0) if index != 0 else None
        env: dict[str, pulumi.Input[str]] = {
            "CACHE_REPOSITORY": repository,
            "CACHE_LISTEN_ADDR": machine.private_ip,
            "CACHE_PORT": str(pull_cache.PORT),
            "CACHE_DIR": pull_cache.cache_dir(DATA_MOUNT if has_data_disk else None),
        }
        if head is None:
            env |= {"CACHE_UPSTREAM": registry_url,
                    "REGISTRY_USERNAME": config.container.registry_username or "",
                    "REGISTRY_PASSWORD": args.registry_password or ""}
        else:
            env["CACHE_UPSTREAM"] = pulumi.Output.concat("http://", head.address, f":{pull_cache.PORT}")
        step = remote_steps.remote_step(
            ctx, "pull-cache", ["pull_cache.sh"], env,
            after=[prepared, *([(head.key, head.step)] if head is not None else [])],
            # Turned off, or at destroy: the cache leaves the node (your own hosts keep nothing of it).
            delete_scripts=["pull_cache_stop.sh"], delete_env={"CACHE_DIR": str(env["CACHE_DIR"])})
        self.cache = CacheRef(f"{machine.name}/pull-cache", step, machine.private_ip)
        return self.cache

    def __init__(self, name: str, args: NodeBootstrapArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:NodeBootstrap", name, None, opts)
        config = args.config
        machine = args.machine
        node_name = machine.name
        ctx = remote_steps.with_login_key(
            remote_steps.context_for(machine, args.private_key, self, login=args.login, run=args.run, first=True),
            config.access.ssh_public_key)
        has_data_disk = machine.data_disk is not None or machine.data_disk_serial is not None
        checking = known_hosts_module.host_key_checking(machine)
        kind = args.accelerator
        count_key = "roll-cluster:nodes.acceleratorsPerNode" if machine.existing else "the instance type"
        nfs_env = {"NAS_REMOTE_PATH": args.nfs_export}
        if args.nfs_options:
            nfs_env["NAS_MOUNT_OPTIONS"] = args.nfs_options

        prepare = remote_steps.remote_step(
            ctx,
            "prepare-host",
            ["prepare_host.sh"],
            {
                "DATA_DISK_DEVICE": machine.data_disk or "",
                "DATA_DISK_SERIAL": machine.data_disk_serial or "",
                "DATA_MOUNT": DATA_MOUNT,
                "SHM_SIZE": config.container.shm_size,
                "SHM_NEVER_SHRINK": "1" if machine.existing else "0",  # own hosts: never shrink their /dev/shm
                "OBJECT_STORE_MEMORY_GB": _gb(config.ray.object_store_memory_gb),
                "NAS_SERVER": args.nas_server or "",
                "SHARED_MOUNT": SHARED_MOUNT,
                "SHARED_HOST_DIR": args.shared_host_dir or "",
                **nfs_env,
            },
        )
        # What Docker must wait for at boot (docker_mount_order.sh): the data disk, the NFS share mounted here.
        nfs_mounted = config.storage.shared and not args.shared_host_dir
        mounts = [m for m, used in ((DATA_MOUNT, has_data_disk), (SHARED_MOUNT, nfs_mounted)) if used]
        through = self._pull_cache(args, ctx, (f"{node_name}/prepare-host", prepare), has_data_disk)
        cache_address: pulumi.Input[str] = ""
        cache_env: dict[str, pulumi.Input[str]] = {}
        if through is not None:
            cache_address = pulumi.Output.concat(through.address, f":{pull_cache.PORT}")
            cache_env = {"PULL_CACHE": cache_address,
                         "CACHE_REPOSITORY": pull_cache.upstream(config.container.pull_image)[1]}
        install_docker = remote_steps.remote_step(
            ctx,
            "docker",
            ["install_docker.sh", "docker_mount_order.sh"],
            {
                "DOCKER_DATA_ROOT": f"{DATA_MOUNT}/docker" if has_data_disk else "",
                "NVIDIA_RUNTIME": "1" if kind.nvidia_runtime else "0",
                "KEEP_EXISTING_DOCKER": "1" if machine.existing else "0",
                "MOUNTS": " ".join(mounts),
                "INSECURE_REGISTRIES": cache_address,  # the cache's plain HTTP, exactly its address
            },
            after=[(f"{node_name}/prepare-host", prepare)],
        )
        pull = remote_steps.remote_step(
            ctx,
            "pull-image",
            ["pull_image.sh"],
            {
                "IMAGE": config.container.pull_image,
                # Through a cache the node never logs in to the registry: the head's fill had the credentials.
                "REGISTRY_USERNAME": (config.container.registry_username or "") if through is None else "",
                "REGISTRY_PASSWORD": (args.registry_password or "") if through is None else "",
                "CHECK_IMAGE_ARCH": "1",
                **cache_env,
            },
            after=[(f"{node_name}/docker", install_docker),
                   *([(through.key, through.step)] if through is not None else [])],
        )
        accelerators_ready: pulumi.Resource
        if kind.kind == "ascend":
            # No reboot, no installer: one look on the node over SSH (npu_ready.sh names what to install).
            accelerators_ready = remote_steps.remote_step(
                ctx,
                kind.ready_step,
                ["npu_lib.sh", "npu_ready.sh"],
                {
                    "EXPECTED_NPUS": str(args.gpus_per_node),
                    "COUNT_KEY": count_key,
                    "DEVICES": " ".join(kind.devices(args.gpus_per_node)),
                    "DRIVER_PATHS": " ".join(kind.driver_mounts),
                    "INSTALL_HINT": kind.install_hint,
                },
                after=[(f"{node_name}/pull-image", pull)],
                triggers=[machine.identity],
            )
        else:
            accelerators_ready = command.local.Command(
                f"{node_name}-gpu-ready",
                create="bash infra/scripts/local/gpu_ready.sh",  # no `dir`: see components/known_hosts.py
                environment={
                    "HOST": machine.ssh_host,
                    "SSH_USER": machine.ssh_user,
                    "SSH_PORT": str(machine.ssh_port),
                    "SSH_KEY_PATH": args.login.identity_file,
                    "KNOWN_HOSTS_FILE": args.known_hosts.path,
                    "HOST_KEY_CHECKING": checking,
                    "EXPECTED_GPUS": str(args.gpus_per_node),
                    "GPU_DRIVER": config.nodes.gpu_driver,
                    "FABRIC_MANAGER": "true" if args.fabric_manager else "false",
                    "COUNT_KEY": count_key,
                    "TIMEOUT_S": str(GPU_READY_TIMEOUT_S),
                    "NODE_NAME": node_name,
                },
                # Reruns when the node is replaced (new instance id), not on every up.
                triggers=[machine.identity],
                add_previous_output_in_env=False,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[pull, args.known_hosts.written]),
            )
            args.run.record(node_name, kind.ready_step, "local", ["local/gpu_ready.sh", "gpu_check.sh"],
                         [f"{node_name}/pull-image"], f"{node_name}-gpu-ready")

        # The prefetch runs beside docker, the pull and the container, but never while gpu-ready may reboot the
        # node: a reboot drops the SSH session (the step would fail) and the page cache (the read would be lost).
        # gpu_ready.sh reboots only for the driver installer (GPU_DRIVER auto-install), which never runs on your own
        # hosts or on a node booted from a baked image (first boot finds the driver working).
        may_reboot = (kind.kind != "ascend" and config.nodes.gpu_driver == "auto-install" and not machine.existing
                      and config.nodes.image is None)
        self.prefetch_after = [(f"{node_name}/prepare-host", prepare)]
        if may_reboot:
            self.prefetch_after.append((f"{node_name}/{kind.ready_step}", accelerators_ready))
        self.shared_host_dir = args.shared_host_dir or SHARED_MOUNT
        before_container: list[pulumi.Resource] = [accelerators_ready]
        container_after = [f"{node_name}/{kind.ready_step}"]
        if machine.bake is not None:
            bake_prep = remote_steps.remote_step(
                ctx,
                "bake-prep",
                [*(["bake_container.sh", "fetch_code.sh"] if args.code_env is not None else []), "bake_finish.sh"],
                {
                    **(args.code_env or {}),
                    "CONTAINER_NAME": BAKE_CONTAINER,
                    "BAKE_CONTAINER": BAKE_CONTAINER,
                    "IMAGE": config.container.image,
                    "WORKSPACE_HOST_DIR": f"{DATA_MOUNT}/workspace",
                    "WORKSPACE": WORKSPACE,
                },
                after=[(f"{node_name}/{kind.ready_step}", accelerators_ready)],
            )
            baked, self.baked_image_id = machine.bake([bake_prep], self)
            args.run.record(node_name, "bake-image", "cloud", [], [f"{node_name}/bake-prep"],
                            baked.pulumi_resource_name)
            before_container.append(baked)
            container_after.append(f"{node_name}/bake-image")

        registry_auth = None
        if config.container.registry_username and args.registry_password is not None:
            registry_auth = [
                docker.ProviderRegistryAuthArgs(
                    address=config.container.registry_host,
                    username=config.container.registry_username,
                    password=args.registry_password,
                )
            ]
        provider = docker.Provider(
            f"{node_name}-docker-engine",
            host=pulumi.Output.concat("ssh://", machine.ssh_user, "@", machine.ssh_host, ":", str(machine.ssh_port)),
            # The system ssh: the stack's known-hosts file only, the login key only, never a prompt.
            ssh_opts=[*known_hosts_module.ssh_options(args.login.identity_file, args.known_hosts.path, checking),
                      "-o", "ConnectTimeout=15"],
            # The daemon exists only after the docker step; the provider must not probe it at configure time.
            disable_docker_daemon_check=True,
            registry_auth=registry_auth,
            # gpu-ready may reboot the node: nothing that talks to it may run beside it.
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[install_docker, accelerators_ready, args.known_hosts.written]
            ),
        )
        on_node = pulumi.ResourceOptions(parent=self, provider=provider)
        image = docker.RemoteImage(
            f"{node_name}-image",
            name=config.container.pull_image,
            keep_locally=True,
            # A changed provider `host` (a replaced worker, a swapped own host) is an update of the provider, and the
            # image's own inputs are unchanged: without this it would stay "same" and never reach the new machine.
            opts=pulumi.ResourceOptions.merge(on_node, pulumi.ResourceOptions(
                depends_on=[pull, accelerators_ready], replacement_trigger=machine.identity)),
        )
        args.run.record(node_name, "image", "docker", [],
                        [f"{node_name}/pull-image", f"{node_name}/{kind.ready_step}"], f"{node_name}-image")
        self.container_name = config.container.name
        volumes = [
            docker.ContainerVolumeArgs(host_path=DATA_MOUNT, container_path=DATA_MOUNT),
            docker.ContainerVolumeArgs(host_path=f"{DATA_MOUNT}/workspace", container_path=WORKSPACE),
        ]
        labels = None
        if args.shared_host_dir:
            volumes.append(docker.ContainerVolumeArgs(host_path=args.shared_host_dir, container_path=SHARED_MOUNT))
        elif config.storage.shared:
            volumes.append(docker.ContainerVolumeArgs(host_path=SHARED_MOUNT, container_path=SHARED_MOUNT))
            # A bind mount keeps what was mounted when the container started: when prepare-host mounts another NAS,
            # this label changes and the container is recreated on the new mount (`labels` is ForceNew:
            # kreuzwerker/terraform-provider-docker internal/provider/resource_docker_container.go).
            labels = [docker.ContainerLabelArgs(label="roll-cluster.shared-storage",
                                                value=pulumi.Output.from_input(args.nas_server or ""))]
        # The accelerator's driver files, read-only at the same path (checked to exist by the readiness step).
        volumes += [docker.ContainerVolumeArgs(host_path=path, container_path=path, read_only=True)
                    for path in kind.driver_mounts]
        self.container = docker.Container(
            f"{node_name}-container",
            name=config.container.name,
            image=image.image_id,
            command=container_command(),
            gpus=kind.docker_gpus,
            devices=[docker.ContainerDeviceArgs(host_path=device, container_path=device, permissions="rwm")
                     for device in kind.devices(args.gpus_per_node)] or None,
            privileged=config.container.privileged or None,
            network_mode="host",
            ipc_mode="host",
            # Docker ignores a shm size with the host's IPC namespace: prepare-host sizes the host's /dev/shm
            # (container.shmSize). Still passed, so that containers created before that change are not replaced.
            shm_size=config.container.shm_size_mb,
            volumes=volumes,
            envs=[
                *kind.container_env(machine.network_interface),
                pulumi.Output.concat("MASTER_ADDR=", args.head_private_ip),
                f"MASTER_PORT={config.ray.gcs_port}",
                f"RANK={machine.rank}",
                f"NODE_RANK={machine.rank}",
                # A changed NAS recreates the container (env, like command and shm_size, is ForceNew in
                # terraform-provider-docker's resource_docker_container.go, which pulumi-docker wraps): its bind
                # mount of SHARED_MOUNT would otherwise keep the old file system after prepare-host remounts it.
                pulumi.Output.concat("ROLL_CLUSTER_NAS=", args.nas_server or ""),
                # Model caches on the data disk and ModelScope's in-cloud region (infra/model_cache.py).
                *model_cache.container_env(config),
            ],
            labels=labels,
            restart="unless-stopped",
            # An init process reaps Ray's exited children: without it they linger as zombies of the main process
            # and every `ray stop` waits out its grace period.
            init=True,
            must_run=True,
            ulimits=[docker.ContainerUlimitArgs(name="memlock", soft=-1, hard=-1),
                     docker.ContainerUlimitArgs(name="nofile", soft=1048576, hard=1048576)],
            # The name is fixed, and Docker refuses a second container of the same name ("Conflict. The container
            # name ... is already in use"): a replacement (new image, new NAS) must delete the old one first.
            opts=pulumi.ResourceOptions.merge(
                on_node, pulumi.ResourceOptions(
                    depends_on=[*before_container, image], delete_before_replace=True,
                    # Another machine behind the same provider: create the container there (see the image). Null
                    # before (stacks created earlier) does not replace (step_generator.go).
                    # see verified-facts#bootstrap-step-generator
                    replacement_trigger=machine.identity,
                    # Destroy: no container delete over SSH when its instance goes too (an unreachable node would
                    # stop the destroy before the instance; deploy/step.go).
                    # see verified-facts#bootstrap-step
                    deleted_with=machine.deleted_with),
            ),
        )
        args.run.record(node_name, "container", "docker", [], [*container_after, f"{node_name}/image"],
                     f"{node_name}-container")
        self.ready = self.container
        self.ready_key = f"{node_name}/container"
        # The older images of the repository go once the container runs the new one; nothing waits for this.
        remote_steps.remote_step(
            remote_steps.context_for(machine, args.private_key, self, login=args.login, run=args.run, running=True),
            "prune-images",
            ["prune_images.sh"],
            {"IMAGE": config.container.pull_image},
            after=[(f"{node_name}/container", self.container)],
            triggers=[self.container.id],
        )
        if args.code_env is not None:
            self.ready = remote_steps.remote_step(
                remote_steps.context_for(machine, args.private_key, self, login=args.login, run=args.run, running=True),
                "code",
                list(args.code_scripts),
                args.code_env,
                after=[(f"{node_name}/container", self.container)],
                # A recreated container lost its pip installs: install again.
                triggers=[self.container.id],
            )
            self.ready_key = f"{node_name}/code"
        self.register_outputs({"container": self.container.id})


def _gb(value: float | None) -> str:
    return "" if value is None else f"{value:g}"
