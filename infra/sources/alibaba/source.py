"""The `alibaba` node source: new GPU ECS instances in a VPC of their own, placed by stock, with optional NAS.

This module decides (placement.py, at plan time) and registers nothing; components/alibaba/cluster.py registers the
network, key pair, NAS and instances it chose. What it hands on is the same as any other source's
(infra/sources/base.py).
"""

from __future__ import annotations

import functools

from infra.config import ClusterConfig
from infra.sources.alibaba.placement import Placement, choose_placement
from infra.sources.base import ClusterFacts


class AlibabaSource:
    name = "alibaba"

    def __init__(self, config: ClusterConfig, stack: str) -> None:
        self.config = config
        self.stack = stack

    @functools.cached_property
    def placement(self) -> Placement:
        return choose_placement(self.config, self.stack)

    def facts(self) -> ClusterFacts:
        placement = self.placement
        return ClusterFacts(
            accelerator="nvidia",
            accelerators_per_node=placement.gpus_per_node,
            accelerator_model=placement.gpu_model,
            bf16=placement.bf16,
            machine_type=placement.instance_type,
            location=placement.zone,
            nvswitch=placement.nvswitch,
        )


def checkpoint_note(config: ClusterConfig) -> str:
    """Where checkpoints live and whether they outlive the instances: the plan states it plainly."""
    if config.storage.nas:
        if config.storage.existing_file_system_id:
            kept = f"they survive pulumi destroy (the attached file system {config.storage.existing_file_system_id} " \
                "is never deleted by this stack)"
        elif config.storage.retain_on_destroy:
            kept = "they survive pulumi destroy (storage.retainOnDestroy; the nasFileSystemId output, given as\n" \
                "  storage.existingFileSystemId, attaches them to the next deployment)"
        else:
            kept = "DELETED on pulumi destroy (storage.retainOnDestroy: false)"
        return f"checkpoints on the NAS at /mnt/shared: {kept}"
    where = "the data disk (/data)" if config.nodes.data_disk_gb else "the system disk"
    why = "storage.retainOnDestroy: false" if not config.storage.retain_on_destroy else "storage.nas: false"
    return (f"checkpoints on {where} of each node ({why}): they DIE WITH THE INSTANCE on pulumi destroy or a\n"
            "  replacement of the node; to keep them: leave storage.nas and storage.retainOnDestroy unset")
