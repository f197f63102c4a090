"""One GPU node: an ECS instance of the chosen type with its disks, public IP, host key and first-boot script.

The first-boot user data (infra/scripts/first_boot.sh) installs the node's SSH host key, which the program
generated so that its clients can verify the node (infra/node/known_hosts.py), and `access.sshPublicKey` for
root (every key type works this way; an ECS key pair is added only for the types ImportKeyPair accepts, see
components/alibaba/cluster.py). The GPU driver comes from Alibaba's auto-install script, started by the same user
data with driver and CUDA versions that suit the container image (plus nvidia-fabricmanager on NVSwitch types),
or from the image itself (`nodes.gpuDriver: preinstalled`).

The data disk is handed on by its serial, the disk id without `d-`, which the guest sees as the virtio and the
NVMe serial alike (/dev/disk/by-id/virtio-<serial>, nvme-Alibaba_Cloud_Elastic_Block_Storage_<serial>; Alibaba's
CSI driver pkg/disk/device_manager.go, verified-facts#gpu-node-alibaba-cloud-verified): NVMe families (gn8v,
gn8is) do not call it /dev/vdb.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_alicloud as alicloud

from components.known_hosts import host_key as generate_host_key
from infra.config import NodesConfig
from infra.economical import economical_mode
from infra.sources.alibaba.user_data import encode_user_data, first_boot_user_data


@dataclass(frozen=True)
class GpuNodeArgs:
    stack: str
    rank: int
    nodes: NodesConfig
    instance_type: pulumi.Input[str]
    image_id: str
    vswitch_id: pulumi.Input[str]
    security_group_id: pulumi.Input[str]
    key_pair_name: pulumi.Input[str] | None  # an ECS key pair for importable key types; None: user data only
    ssh_public_key: str
    fabric_manager: bool
    data_snapshot: tuple[str, int, str] | None = None  # (snapshot id, GB, device) of a baked image's data disk

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"


class GpuNode(pulumi.ComponentResource):
    instance_id: pulumi.Output[str]
    public_ip: pulumi.Output[str]
    private_ip: pulumi.Output[str]
    host_public_key: pulumi.Output[str]
    start_time: pulumi.Output[str]
    data_disk_serial: pulumi.Output[str] | None

    def __init__(self, name: str, args: GpuNodeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:GpuNode", name, None, opts)
        nodes = args.nodes
        host_name = f"roll-{args.stack}-{args.rank}"
        data_disks = None
        if nodes.data_disk_gb:
            data_disks = [
                alicloud.ecs.InstanceDataDiskArgs(
                    size=max(nodes.data_disk_gb, args.data_snapshot[1] if args.data_snapshot else 0),
                    category=nodes.data_disk_category, name=f"{host_name}-data", delete_with_instance=True,
                    # nodes.dataDiskPerformanceLevel (cloud_essd) and nodes.dataDiskBursting (cloud_auto); left out
                    # (None) they add no input, so a stack that sets neither keeps its inputs. The provider sends
                    # PerformanceLevel for cloud_essd and BurstingEnabled for cloud_auto only (TF
                    # resource_alicloud_instance.go at 81c43b67).
                    # see verified-facts#gpu-node-instance
                    performance_level=nodes.data_disk_performance_level,
                    bursting_enabled=nodes.data_disk_burst if nodes.data_disk_category == "cloud_auto" else None,
                    # Booted from a baked image: the data disk is the image's (Docker's images are on it).
                    snapshot_id=args.data_snapshot[0] if args.data_snapshot else None,
                    # The image's own disk mapping: ECS creates a full image's data disks by itself, and this entry
                    # then sets that disk's size and category instead of adding a second disk (TF
                    # resource_alicloud_instance.go data_disks.device, added for this case in PR #5290;
                    # aliyun/terraform-provider-alicloud#1595). UNCONFIRMED on a real account.
                    # see verified-facts#gpu-node-instance-2
                    device=args.data_snapshot[2] if args.data_snapshot else None,
                )
            ]
        host_key = generate_host_key(name, parent=self)
        # A secret: it carries the node's private host key (kept encrypted in the state).
        user_data = pulumi.Output.all(host_key.private_key, host_key.public_key).apply(
            lambda keys: encode_user_data(
                first_boot_user_data(
                    nodes,
                    ssh_public_key=args.ssh_public_key,
                    host_key_private=keys[0],
                    host_key_public=keys[1],
                    fabric_manager=args.fabric_manager,
                )
            )
        )
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
            # nodes.spotHead: the head is pay-as-you-go unless opted in (a reclaimed head ends Ray and the job).
            spot_strategy=nodes.spot_strategy if args.rank > 0 or nodes.head_on_spot else "NoSpot",
            spot_price_limit=nodes.spot_price_limit if args.rank > 0 or nodes.head_on_spot else None,
            user_data=user_data,
            # nodes.paused: stopped in economical mode, started again when it is removed. The provider stops with
            # StopInstance(StoppedMode) and starts with StartInstance on a `status` change (terraform-provider-
            # alicloud alicloud/resource_alicloud_instance.go at 81c43b67; `status` Running|Stopped,
            # `stopped_mode` StopCharging|KeepCharging|Not-applicable).
            # see verified-facts#gpu-node-instance-3
            status="Stopped" if nodes.paused else "Running",
            # Only where the family has economical mode (infra/economical.py): elsewhere the instance cannot keep
            # StopCharging, the provider reads back another mode (which one: UNCONFIRMED), and asking for it would
            # show a change on every `up` while paused.
            stopped_mode=pulumi.Output.from_input(args.instance_type).apply(
                lambda t: "StopCharging" if economical_mode(t) else None) if nodes.paused else None,
            tags={
                "roll-cluster-stack": args.stack,
                "roll-cluster-rank": str(args.rank),
                "roll-cluster-role": args.role,
            },
            opts=pulumi.ResourceOptions(
                parent=self,
                # user_data is applied in place by rebooting the instance and cloud-init would not run it again:
                # a changed driver version takes effect on new nodes only (docs/operations.md, 'What a later change
                # does'). Likewise a new nodes.image, with the data disk made from its snapshot: an existing node keeps
                # its disks.
                ignore_changes=["userData", "imageId", "dataDisks[0].snapshotId", "dataDisks[0].device"],
                # Moving the cluster (nodes.placementGeneration: a new vSwitch, maybe another zone or type) must
                # replace the node: the provider updates both fields in place (TF resource_alicloud_instance.go
                # vswitch_id and instance_type are not ForceNew; the update stops the instance, then
                # ModifyInstanceVpcAttribute refuses another zone and leaves it stopped).
                # A new data disk performance level too: the provider neither forces a new instance for it nor
                # applies it to the running disk (data_disks.performance_level is not ForceNew, and the update
                # has no data_disks branch, no ModifyDiskSpec), so the state would claim a level the disk has not.
                # The whole `dataDisks` list, not its element's path: the engine marks a replacement where a
                # replaceOnChanges path contains a path of the provider's detailed diff or a changed top-level key
                # (pulumi/pulumi pkg/resource/deploy/step_generator.go applyReplaceOnChanges, PropertyPath.Contains),
                # so this holds however the bridge names the nested change; every other field under data_disks is
                # ForceNew already (kms_key_id is never set here).
                # see verified-facts#gpu-node-instance-4
                replace_on_changes=["vswitchId", "instanceType", "dataDisks"],
            ),
        )
        self.instance = instance  # the bootstrap deletes the node's container with it (Machine.deleted_with)
        self.instance_id = instance.id
        self.public_ip = instance.public_ip
        self.private_ip = instance.private_ip
        self.host_public_key = host_key.public_key
        self.start_time = instance.start_time
        self.data_disk_serial = None
        if nodes.data_disk_gb:
            # The instance's outputs do not carry the data disk's id; DescribeDisks of the instance does.
            disks = alicloud.ecs.get_ecs_disks_output(instance_id=instance.id, type="data")
            self.data_disk_serial = disks.disks.apply(lambda found: _serial(found, host_name))
        self.register_outputs(
            {"instanceId": self.instance_id, "publicIp": self.public_ip, "privateIp": self.private_ip}
        )


def _serial(disks: list[alicloud.ecs.outputs.GetEcsDisksDiskResult], host_name: str) -> str:
    if len(disks) != 1:
        raise RuntimeError(f"{host_name}: expected one data disk attached, DescribeDisks lists {len(disks)}")
    disk_id = disks[0].disk_id or disks[0].id
    return disk_id.removeprefix("d-")
