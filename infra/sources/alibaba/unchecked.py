"""What a real Alibaba account may refuse that nothing checks before resources are created: the offline plan lists
these lines for the stack (verified-facts#unchecked-alibaba-real-account), each UNCONFIRMED, so that a
reader knows what the first real `pulumi up` is the first test of."""

from __future__ import annotations

from infra.config import ClusterConfig
from infra.sources.alibaba import catalog
from infra.sources.alibaba.placement import Placement

# Driver / CUDA / cuDNN triples seen in Alibaba's own material (Compute Nest init_gpu.sh copies,
# verified-facts#unchecked-alibaba-cloud-verified): the installer downloads from Alibaba's mirror, not NVIDIA's.
SEEN_ON_ALIBABAS_MIRROR = {("550.127.08", "12.4.1", "9.2.0.82"), ("570.133.20", "12.8.1", "9.8.0.87")}
# Families Alibaba sells only after approval (GPU families page: "contact Alibaba Cloud sales personnel" / ticket).
RESTRICTED_FAMILIES = ("ecs.gn8v", "ecs.gn8is", "ecs.ebmgn8v", "ecs.gn7s")


def unchecked(config: ClusterConfig, placement: Placement) -> list[str]:
    nodes = config.nodes
    lines = []
    triple = (nodes.driver_version, nodes.cuda_version, nodes.cudnn_version)
    if nodes.gpu_driver == "auto-install" and triple not in SEEN_ON_ALIBABAS_MIRROR:
        lines.append(
            f"UNCONFIRMED: Alibaba's installer mirror holds driver {triple[0]} / CUDA {triple[1]} / cuDNN {triple[2]} "
            "(seen there: 550.127.08/12.4.1/9.2.0.82, 570.133.20/12.8.1/9.8.0.87); a missing file fails gpu-ready "
            "10-20 min into the bootstrap"
        )
    if placement.nvswitch and nodes.gpu_driver == "auto-install":
        lines.append(
            f"UNCONFIRMED: the guest of {placement.instance_type} sees its NVSwitches; if Alibaba's hypervisor manages "
            "them, nvidia-fabricmanager does not start and gpu-ready waits to its timeout"
        )
    family = catalog.family_of(placement.instance_type) or ""
    vcpus = (info.vcpus * nodes.count) if (info := catalog.lookup(placement.instance_type)) else None
    quota = f"{vcpus} pay-as-you-go vCPUs" if vcpus else "the vCPUs"
    lines.append(
        f"not checked: the account's quota for {quota} of GPU instances in {config.region} "
        "(RunInstances QuotaExceed.ElasticQuota after the network and NAS exist)"
        + (f"; {family} is sold only after Alibaba's approval (InvalidInstanceType.*)" if family in RESTRICTED_FAMILIES
           else "")
    )
    if family == "ecs.ebmgn8v":
        lines.append("UNCONFIRMED: the OS image boots with UEFI, which ebmgn8v requires; if not, no image matches "
                     "and placement stops with an error")
    if nodes.image is not None and config.storage.nas:
        lines.append("UNCONFIRMED: a baked image's fstab entry for its stack's NAS (hard, nofail) delays each boot by "
                     "the mount timeout when this stack's NAS is another one")
    lines.append("note: each node's SSH host private key travels in its user data, which any process on the node "
                 "(the training container too) and any RAM user with ecs:DescribeUserData can read")
    if config.storage.nas and not config.storage.existing_file_system_id:
        lines.append("UNCONFIRMED: NAS accepts the file system's description with spaces (its documented character "
                     "set is letters, digits, ':', '_' and '-'); the storage type per zone is checked at placement")
    return lines
