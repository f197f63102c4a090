"""The stack configuration: one pydantic model per `roll-cluster:<section>` object, one module per section.

The models follow the contract (verified-facts#init-stack-config) and are validated as a whole before any resource
is registered. One module per section, named after its key, so a key's rules are found from its name:

- nodes.py: `roll-cluster:nodes` (NodesConfig, with HostConfig and HostDefaults for `nodes.hosts`)
- access.py: `roll-cluster:access` (AccessConfig)
- container.py: `roll-cluster:container` (ContainerConfig)
- ray.py: `roll-cluster:ray` (RayConfig)
- training.py: `roll-cluster:training` (TrainingConfig)
- frameworks.py: the framework settings inside it, `training.roll`, `training.verl`, `training.openrlhf`,
  `training.custom` and `training.mindspeedRl`
- storage.py: `roll-cluster:storage` (StorageConfig)
- cluster.py: the whole (ClusterConfig), the rules across sections, the error lines and `parse_cluster_config`
- base.py: what they share (Section, ConfigError, the problems validators raise, the project's key names)

Every error names the key path as the user writes it (`roll-cluster:nodes.count`), what is allowed and what
was given. Unknown fields are errors that suggest the nearest valid name. The configuration reference
(docs/configuration.md) is generated from these models (devtools/reference.py), so descriptions here are user
documentation.
"""

from __future__ import annotations

from infra.config.access import SECURITY_KEY_TYPES, SSH_KEY_TYPES, WORLD_CIDRS, AccessConfig, covers_the_world
from infra.config.base import PROJECT, SECRETS, SECTIONS, ConfigError, KeyPath, Section
from infra.config.cluster import ClusterConfig, parse_cluster_config
from infra.config.container import DEFAULT_ROLL_IMAGE, ContainerConfig, acr_vpc_region
from infra.config.frameworks import (
    DEFAULT_MEGATRON_REF,
    DEFAULT_MEGATRON_REPO,
    DEFAULT_MINDSPEED_LLM_REF,
    DEFAULT_MINDSPEED_LLM_REPO,
    DEFAULT_MINDSPEED_REF,
    DEFAULT_MINDSPEED_REPO,
    DEFAULT_MSRL_REF,
    DEFAULT_MSRL_REPO,
    DEFAULT_PIP_INDEX,
    DEFAULT_ROLL_REF,
    DEFAULT_ROLL_REPO,
    OPENRLHF_PREINSTALL,
    OPENRLHF_UNINSTALL,
    ROLL_PIPELINES,
    CustomConfig,
    MegatronPin,
    MindSpeedLlmPin,
    MindSpeedPin,
    MindSpeedRlConfig,
    OpenRlhfConfig,
    RewardServerConfig,
    RollConfig,
    VerlConfig,
)
from infra.config.hosts import HostConfig, HostDefaults
from infra.config.nodes import (
    ALIBABA_ONLY_NODE_KEYS,
    HOSTS_ONLY_NODE_KEYS,
    AutostopConfig,
    NodesConfig,
    nvidia_model_has_bf16,
)
from infra.config.ray import RAY_PORT_KEYS, RayConfig
from infra.config.storage import StorageConfig
from infra.config.training import (
    DEFAULT_HF_MIRROR,
    MODEL_SOURCES,
    TrainingConfig,
    is_mainland_region,
)

__all__ = [
    "ALIBABA_ONLY_NODE_KEYS",
    "DEFAULT_HF_MIRROR",
    "DEFAULT_MEGATRON_REF",
    "DEFAULT_MEGATRON_REPO",
    "DEFAULT_MINDSPEED_LLM_REF",
    "DEFAULT_MINDSPEED_LLM_REPO",
    "DEFAULT_MINDSPEED_REF",
    "DEFAULT_MINDSPEED_REPO",
    "DEFAULT_MSRL_REF",
    "DEFAULT_MSRL_REPO",
    "DEFAULT_PIP_INDEX",
    "DEFAULT_ROLL_IMAGE",
    "DEFAULT_ROLL_REF",
    "DEFAULT_ROLL_REPO",
    "HOSTS_ONLY_NODE_KEYS",
    "MODEL_SOURCES",
    "OPENRLHF_PREINSTALL",
    "OPENRLHF_UNINSTALL",
    "PROJECT",
    "RAY_PORT_KEYS",
    "ROLL_PIPELINES",
    "SECRETS",
    "SECTIONS",
    "SECURITY_KEY_TYPES",
    "SSH_KEY_TYPES",
    "WORLD_CIDRS",
    "AccessConfig",
    "AutostopConfig",
    "ClusterConfig",
    "ConfigError",
    "ContainerConfig",
    "CustomConfig",
    "HostConfig",
    "HostDefaults",
    "KeyPath",
    "MegatronPin",
    "MindSpeedLlmPin",
    "MindSpeedPin",
    "MindSpeedRlConfig",
    "NodesConfig",
    "OpenRlhfConfig",
    "RayConfig",
    "RewardServerConfig",
    "RollConfig",
    "Section",
    "StorageConfig",
    "TrainingConfig",
    "VerlConfig",
    "acr_vpc_region",
    "covers_the_world",
    "is_mainland_region",
    "nvidia_model_has_bf16",
    "parse_cluster_config",
]
