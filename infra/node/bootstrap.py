"""Bootstrap one node: host preparation, Docker + NVIDIA toolkit, the image pull overlapping the driver
installation, GPU readiness that survives the installer's reboot, the training container, framework code.

Order on a node (nothing here waits for another node):

    prepare-host -> docker -> pull-image -> gpu-ready -> image, container -> code
                                  (driver installs since first boot, in parallel with all of the above)

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

from infra.config import ClusterConfig
from infra.layout import DATA_MOUNT, PROJECT_DIR, SHARED_MOUNT, WORKSPACE
from infra.node import remote, steps
from infra.sources.base import Machine

NIC = "eth0"  # the primary NIC of ECS instances: NCCL and Gloo must not pick docker0 or lo
GPU_READY_TIMEOUT_S = 2400
CONTAINER_MAIN_SCRIPT = "container_main.sh"


def container_command() -> list[str]:
    """The training container's command: container_main.sh (keeps the container up and Ray running as recorded).
    The same text for every setting, so a changed setting never recreates the container."""
    return ["bash", "-c", remote.script_path(CONTAINER_MAIN_SCRIPT).read_text(), "container-main"]


@dataclass(frozen=True)
class NodeBootstrapArgs:
    config: ClusterConfig
    machine: Machine
    gpus_per_node: int
    head_private_ip: pulumi.Input[str]
    nas_server: pulumi.Input[str] | None
    private_key: pulumi.Output[str]
    registry_password: pulumi.Output[str] | None
    code_env: dict[str, str] | None


class NodeBootstrap(pulumi.ComponentResource):
    container_name: str
    container: docker.Container
    ready: pulumi.Resource  # the last bootstrap step: Ray steps depend on it
    ready_key: str  # its step key ("node-1/code")

    def __init__(self, name: str, args: NodeBootstrapArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:NodeBootstrap", name, None, opts)
        config = args.config
        machine = args.machine
        node_name = machine.name
        ctx = steps.context_for(machine, args.private_key, self, first=True)
        has_data_disk = machine.data_disk is not None

        prepare = steps.remote_step(
            ctx,
            "prepare-host",
            ["prepare_host.sh"],
            {
                "DATA_DISK_DEVICE": machine.data_disk or "",
                "DATA_MOUNT": DATA_MOUNT,
                "NAS_SERVER": args.nas_server or "",
                "SHARED_MOUNT": SHARED_MOUNT,
            },
        )
        mounts = [m for m, used in ((DATA_MOUNT, has_data_disk), (SHARED_MOUNT, bool(config.storage.nas))) if used]
        install_docker = steps.remote_step(
            ctx,
            "docker",
            ["install_docker.sh", "docker_mount_order.sh"],
            {"DOCKER_DATA_ROOT": f"{DATA_MOUNT}/docker" if has_data_disk else "", "MOUNTS": " ".join(mounts)},
            after=[(f"{node_name}/prepare-host", prepare)],
        )
        pull = steps.remote_step(
            ctx,
            "pull-image",
            ["pull_image.sh"],
            {
                "IMAGE": config.container.image,
                "REGISTRY_USERNAME": config.container.registry_username or "",
                "REGISTRY_PASSWORD": args.registry_password or "",
            },
            after=[(f"{node_name}/docker", install_docker)],
        )
        gpu_ready = command.local.Command(
            f"{node_name}-gpu-ready",
            create="bash infra/scripts/local/gpu_ready.sh",
            dir=str(PROJECT_DIR),
            environment={
                "HOST": machine.ssh_host,
                "SSH_USER": machine.ssh_user,
                "SSH_PORT": str(machine.ssh_port),
                "SSH_KEY_PATH": config.access.ssh_private_key_path,
                "EXPECTED_GPUS": str(args.gpus_per_node),
                "GPU_DRIVER": config.nodes.gpu_driver,
                "TIMEOUT_S": str(GPU_READY_TIMEOUT_S),
                "NODE_NAME": node_name,
            },
            # Reruns when the node is replaced (new instance id), not on every up.
            triggers=[machine.identity],
            add_previous_output_in_env=False,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[pull]),
        )
        steps.record(node_name, "gpu-ready", "local", ["local/gpu_ready.sh", "gpu_check.sh"],
                     [f"{node_name}/pull-image"], f"{node_name}-gpu-ready")

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
            ssh_opts=["-i", config.access.ssh_private_key_path, "-o", "StrictHostKeyChecking=accept-new",
                      "-o", "ConnectTimeout=15"],
            # The daemon exists only after the docker step; the provider must not probe it at configure time.
            disable_docker_daemon_check=True,
            registry_auth=registry_auth,
            # gpu-ready may reboot the node: nothing that talks to it may run beside it.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[install_docker, gpu_ready]),
        )
        on_node = pulumi.ResourceOptions(parent=self, provider=provider)
        image = docker.RemoteImage(
            f"{node_name}-image",
            name=config.container.image,
            keep_locally=True,
            opts=pulumi.ResourceOptions.merge(on_node, pulumi.ResourceOptions(depends_on=[pull, gpu_ready])),
        )
        steps.record(node_name, "image", "docker", [], [f"{node_name}/pull-image", f"{node_name}/gpu-ready"],
                     f"{node_name}-image")
        self.container_name = config.container.name
        volumes = [
            docker.ContainerVolumeArgs(host_path=DATA_MOUNT, container_path=DATA_MOUNT),
            docker.ContainerVolumeArgs(host_path=f"{DATA_MOUNT}/workspace", container_path=WORKSPACE),
        ]
        if config.storage.nas:
            volumes.append(docker.ContainerVolumeArgs(host_path=SHARED_MOUNT, container_path=SHARED_MOUNT))
        self.container = docker.Container(
            f"{node_name}-container",
            name=config.container.name,
            image=image.image_id,
            command=container_command(),
            gpus="all",
            network_mode="host",
            ipc_mode="host",
            shm_size=config.container.shm_size_mb,
            volumes=volumes,
            envs=[
                f"NCCL_SOCKET_IFNAME={NIC}",
                f"GLOO_SOCKET_IFNAME={NIC}",
                pulumi.Output.concat("MASTER_ADDR=", args.head_private_ip),
                f"MASTER_PORT={config.ray.gcs_port}",
                f"RANK={machine.rank}",
                f"NODE_RANK={machine.rank}",
                # A changed NAS recreates the container (env, like command and shm_size, is ForceNew in
                # terraform-provider-docker's resource_docker_container.go, which pulumi-docker wraps): its bind
                # mount of SHARED_MOUNT would otherwise keep the old file system after prepare-host remounts it.
                pulumi.Output.concat("ROLL_CLUSTER_NAS=", args.nas_server or ""),
            ],
            restart="unless-stopped",
            # An init process reaps Ray's exited children: without it they linger as zombies of the main process
            # and every `ray stop` waits out its grace period.
            init=True,
            must_run=True,
            ulimits=[docker.ContainerUlimitArgs(name="memlock", soft=-1, hard=-1),
                     docker.ContainerUlimitArgs(name="nofile", soft=1048576, hard=1048576)],
            # The name is fixed: the old container must go before a new one of the same name is created.
            opts=pulumi.ResourceOptions.merge(
                on_node, pulumi.ResourceOptions(depends_on=[gpu_ready, image], delete_before_replace=True)
            ),
        )
        steps.record(node_name, "container", "docker", [],
                     [f"{node_name}/gpu-ready", f"{node_name}/image"], f"{node_name}-container")
        self.ready = self.container
        self.ready_key = f"{node_name}/container"
        if args.code_env is not None:
            self.ready = steps.remote_step(
                steps.context_for(machine, args.private_key, self, running=True),
                "code",
                ["fetch_code.sh"],
                args.code_env,
                after=[(f"{node_name}/container", self.container)],
                # A recreated container lost its pip installs: install again.
                triggers=[self.container.id],
            )
            self.ready_key = f"{node_name}/code"
        self.register_outputs({"container": self.container.id})
