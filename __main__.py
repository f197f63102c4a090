"""roll-cluster: an RL post-training cluster on Alibaba Cloud GPU ECS, from one stack configuration.

Composition only; each part lives in components/ (resources) or infra/ (configuration, catalogs, scripts).
Everything that can be wrong in the configuration is rejected by stack_config.load() and choose_placement()
before the first resource is registered.
"""

import pulumi
import pulumi_alicloud as alicloud

from infra import outputs, stack_config
from infra.frameworks import adapter_for
from infra.frameworks.job import TrainingJob, TrainingJobArgs
from infra.node import steps
from infra.node.bootstrap import NodeBootstrap, NodeBootstrapArgs
from infra.ray.cluster import RayCluster, RayClusterArgs, RayNode
from infra.sources.alibaba.instance import GpuNode, GpuNodeArgs
from infra.sources.alibaba.network import Network, NetworkArgs
from infra.sources.alibaba.placement import choose_placement
from infra.sources.alibaba.storage import SharedStorage, SharedStorageArgs

config, secrets = stack_config.load()
placement = choose_placement(config)
stack = pulumi.get_stack()
stack_config.check_framework(config, stack, placement.gpus_per_node, placement.bf16)
private_key = steps.private_key(config.access.ssh_private_key_path)
code = adapter_for(config.training, config.container).code()

network = Network(
    "network",
    NetworkArgs(
        stack=stack,
        zone=placement.zone,
        instance_type=placement.instance_type,
        admin_cidrs=config.access.admin_cidrs,
        dashboard_port=config.ray.dashboard_port,
        dashboard_open_to_admins=config.access.dashboard == "admin-cidrs",
    ),
)
key_pair = alicloud.ecs.EcsKeyPair(
    "key-pair", key_pair_name=f"roll-cluster-{stack}", public_key=config.access.ssh_public_key
)
storage = None
if config.storage.nas:
    storage = SharedStorage(
        "shared",
        SharedStorageArgs(
            stack=stack,
            vpc_id=network.vpc_id,
            vswitch_id=network.vswitch_id,
            vswitch_cidr=network.vswitch_cidr,
            storage_type=config.storage.nas_storage_type,
            retain_on_destroy=config.storage.retain_on_destroy,
        ),
    )

ray_nodes: list[RayNode] = []
for rank in range(config.nodes.count):
    name = f"node-{rank}"
    node = GpuNode(
        name,
        GpuNodeArgs(
            stack=stack,
            rank=rank,
            nodes=config.nodes,
            instance_type=network.instance_type,
            image_id=placement.image_id,
            vswitch_id=network.vswitch_id,
            security_group_id=network.security_group_id,
            key_pair_name=key_pair.key_pair_name,
        ),
    )
    head_ip = ray_nodes[0].node.private_ip if ray_nodes else node.private_ip
    bootstrap = NodeBootstrap(
        f"{name}-bootstrap",
        NodeBootstrapArgs(
            config=config,
            node=node,
            node_name=name,
            rank=rank,
            gpus_per_node=placement.gpus_per_node,
            head_private_ip=head_ip,
            nas_server=storage.mount_domain if storage else None,
            private_key=private_key,
            registry_password=secrets.registry_password,
            code_env=code.env(config.container.name) if code else None,
        ),
    )
    ray_nodes.append(RayNode(name, node, bootstrap))

secret_env = {
    name: value
    for name, value in (("WANDB_API_KEY", secrets.wandb_api_key), ("HF_TOKEN", secrets.hf_token))
    if value is not None
}
ray = RayCluster(
    "ray",
    RayClusterArgs(
        config=config,
        nodes=ray_nodes,
        gpus_per_node=placement.gpus_per_node,
        private_key=private_key,
        secret_env=secret_env,
    ),
)
job = TrainingJob(
    "training",
    TrainingJobArgs(
        config=config,
        stack=stack,
        head=ray_nodes[0],
        ray=ray,
        gpus_per_node=placement.gpus_per_node,
        bf16=placement.bf16,
        private_key=private_key,
        secret_env=secret_env,
    ),
)

outputs.export_all(config, placement, network, ray_nodes, job)
