"""One GPU node: an ECS instance of the chosen type with its disks, public IP, key pair and first-boot script.

The GPU driver comes from Alibaba's auto-install script, started by our first-boot user data
(infra/scripts/first_boot.sh) with driver and CUDA versions that suit the container image, or from the image
itself (`nodes.gpuDriver: preinstalled`).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

import pulumi
import pulumi_alicloud as alicloud

from infra.config import NodesConfig
from infra.node import remote

DATA_DISK_DEVICE = "/dev/vdb"  # the first data disk of a virtio ECS instance


@dataclass(frozen=True)
class GpuNodeArgs:
    stack: str
    rank: int
    nodes: NodesConfig
    instance_type: pulumi.Input[str]
    image_id: str
    vswitch_id: pulumi.Input[str]
    security_group_id: pulumi.Input[str]
    key_pair_name: pulumi.Input[str]
    data_snapshot: tuple[str, int] | None = None  # (snapshot id, GB) of a baked image's data disk

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


def first_boot_user_data(nodes: NodesConfig) -> str:
    """cloud-init user data: first_boot.sh with its parameters, as a bash script."""
    env = {
        "GPU_DRIVER": nodes.gpu_driver,
        "DRIVER_VERSION": nodes.driver_version,
        "CUDA_VERSION": nodes.cuda_version,
        "CUDNN_VERSION": nodes.cudnn_version,
    }
    return remote.render_user_data("first_boot.sh", env)


class GpuNode(pulumi.ComponentResource):
    instance_id: pulumi.Output[str]
    public_ip: pulumi.Output[str]
    private_ip: pulumi.Output[str]

    def __init__(self, name: str, args: GpuNodeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:GpuNode", name, None, opts)
        nodes = args.nodes
        host_name = f"roll-{args.stack}-{args.rank}"
        data_disks = None
        if nodes.data_disk_gb:
            data_disks = [
                alicloud.ecs.InstanceDataDiskArgs(
                    size=max(nodes.data_disk_gb, args.data_snapshot[1] if args.data_snapshot else 0),
                    category="cloud_essd", name=f"{host_name}-data", delete_with_instance=True,
                    # Booted from a baked image: the data disk is the image's (Docker's images are on it).
                    snapshot_id=args.data_snapshot[0] if args.data_snapshot else None,
                )
            ]
        user_data = base64.b64encode(first_boot_user_data(nodes).encode()).decode()
        instance = alicloud.ecs.Instance(
            f"{name}-instance",
            instance_type=args.instance_type,
            image_id=args.image_id,
            vswitch_id=args.vswitch_id,
            security_groups=[args.security_group_id],
            instance_name=host_name,
            host_name=host_name,
            instance_charge_type="PostPaid",
            system_disk_category="cloud_essd",
            system_disk_size=nodes.system_disk_gb,
            data_disks=data_disks,
            internet_charge_type="PayByTraffic",
            internet_max_bandwidth_out=nodes.internet_bandwidth_mbps,
            key_name=args.key_pair_name,
            spot_strategy=nodes.spot_strategy,
            spot_price_limit=nodes.spot_price_limit,
            user_data=user_data,
            tags={
                "roll-cluster-stack": args.stack,
                "roll-cluster-rank": str(args.rank),
                "roll-cluster-role": args.role,
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                # user_data is applied in place by rebooting the instance and cloud-init would not run it again:
                # a changed driver version takes effect on new nodes only (README, "Changing the driver"). Likewise
                # a new nodes.image, with the data disk made from its snapshot: an existing node keeps its disks.
                ignore_changes=["userData", "imageId", "dataDisks[0].snapshotId"],
            ),
        )
        self.instance_id = instance.id
        self.public_ip = instance.public_ip
        self.private_ip = instance.private_ip
        self.register_outputs(
            {"instanceId": self.instance_id, "publicIp": self.public_ip, "privateIp": self.private_ip}
        )
