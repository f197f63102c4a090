"""Framework adapters: what code every node gets and what job the head submits, for ROLL, verl, OpenRLHF,
MindSpeed-RL and any Ray program. Pure Python (no Pulumi): the components call these with plain values.

    adapter = adapter_for(config.training, config.container)
    problems = check_before_deploy(config.training, config.container, shape_without_ip)
    code = adapter.code()          # CodeSpec -> code.scripts with code.env() on every node (None: nothing to fetch)
    job = adapter.job(shape)       # JobSpec -> env of job_submit.sh on the head
"""

from __future__ import annotations

from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks.base import (
    ClusterShape,
    CodeSpec,
    FrameworkAdapter,
    FrameworkFacts,
    JobSpec,
)
from infra.frameworks.custom import CustomAdapter
from infra.frameworks.mindspeed_rl import MindSpeedRlAdapter
from infra.frameworks.openrlhf import OpenRlhfAdapter
from infra.frameworks.registry import adapter_class, framework_names
from infra.frameworks.roll import RollAdapter
from infra.frameworks.verl import VerlAdapter

__all__ = [
    "ClusterShape",
    "CodeSpec",
    "CustomAdapter",
    "FrameworkAdapter",
    "FrameworkFacts",
    "JobSpec",
    "MindSpeedRlAdapter",
    "OpenRlhfAdapter",
    "RollAdapter",
    "VerlAdapter",
    "adapter_class",
    "adapter_for",
    "check_before_deploy",
    "framework_names",
    "head_reserved_gpus",
]

def adapter_for(training: TrainingConfig, container: ContainerConfig) -> FrameworkAdapter:
    return adapter_class(training.framework)(training, container)


def check_before_deploy(
    training: TrainingConfig,
    container: ContainerConfig,
    shape_without_ip: ClusterShape,
) -> list[str]:
    """Problems detectable before anything is created; each names its `roll-cluster:...` key. Empty: fine."""
    return adapter_for(training, container).problems(shape_without_ip)


def head_reserved_gpus(training: TrainingConfig, container: ContainerConfig, gpus_per_node: int) -> list[int]:
    """GPU ids of the head that the job holds outside Ray (OpenRLHF's reward server, unless the roles are colocated
    with it): the head's Ray must neither count nor hand them out. Empty for every other framework."""
    return adapter_for(training, container).head_reserved_gpus(gpus_per_node)
