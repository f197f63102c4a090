"""Economical mode (StopCharging) per instance family: whether a stopped instance stops billing its compute.

Alibaba, "Economical mode for pay-as-you-go instances (including spot instances)" (help.aliyun.com/en/ecs/user-
guide/economical-mode): it applies to pay-as-you-go and spot instances in a VPC (every node here); "The following
instance families do NOT support economical mode because they have local storage or persistent memory: all
instance families with local SSDs (i series), all big data instance families (d series), and the gn5, re6p,
re6p-redis, and ebmre6p instance families." Of the GPU families, gn5 (local NVMe SSDs) is the one concerned.

Such an instance, stopped (nodes.paused or autostop), keeps billing its compute and GPUs: the program asks for
StopCharging only where it applies (components/alibaba/gpu_node.py, the autostop watcher) and the cost output says so.
Whether ECS refuses StoppedMode=StopCharging for such a family or ignores it is UNCONFIRMED; neither is asked.
"""

from __future__ import annotations

import re

from infra.sources.alibaba.catalog import family_of

NO_ECONOMICAL_MODE = ("ecs.gn5", "ecs.re6p", "ecs.ebmre6p")  # re6p-redis reads as family ecs.re6p
_LOCAL_DISK_SERIES = re.compile(r"^ecs\.(ebm)?[id][0-9]")  # the i (local SSD) and d (big data) series


def economical_mode(instance_type: str) -> bool:
    """Whether instances of this type stop billing their compute when stopped with StopCharging."""
    family = family_of(instance_type) or ""
    return family not in NO_ECONOMICAL_MODE and not _LOCAL_DISK_SERIES.match(family)


def stopped_mode(instance_type: str) -> str:
    """The StoppedMode a stop of this type asks for."""
    return "StopCharging" if economical_mode(instance_type) else "KeepCharging"
