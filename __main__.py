"""roll-cluster: an RL post-training cluster from one stack configuration.

Composition only, in the order data flows: configuration -> node source -> node bootstrap -> Ray -> training
job -> outputs. Each stage's resources are a module of components/; what they compute from (configuration,
placement, renderers, command builders, framework adapters) lives in infra/. Everything that can be wrong in
the configuration is rejected by stack_config.load(), the source's facts() and check_framework() before the first
resource is registered.
"""

import pulumi

from components import known_hosts, node_source
from components.autostop import Autostop, spot_notices
from components.bootstrap import NodeBootstrap, NodeBootstrapArgs
from components.ray_cluster import RayCluster, RayClusterArgs, RayNode
from components.training_job import TrainingJob, TrainingJobArgs
from infra import outputs, parallelism, pause, pull_cache, runmode, stack_config, summary
from infra.frameworks import adapter_for
from infra.node import accelerators, steps
from infra.sources import source_for

# This run's step records, notes and run-wide settings, handed to what needs them; whoever ran the program (the
# offline plan, the tests) reads it back from this namespace (devtools/offline_cloud.py).
run_context = steps.RunContext()
config, secrets = stack_config.load(run_context)
stack = pulumi.get_stack()
login = steps.stack_login_key(config.access.ssh_private_key_path, config.access.ssh_public_key, stack, run_context)
source = source_for(config, stack, login)
facts = source.facts()
stack_config.check_framework(config, stack, facts.accelerators_per_node, facts.bf16)
private_key = steps.private_key(login)
code = adapter_for(config.training, config.container).code()
if not runmode.offline():  # the offline plan prints the same line with its own figures
    slots_warning = parallelism.warning(config.nodes.count, *parallelism.engine_slots())
    if slots_warning:
        pulumi.log.warn(slots_warning)

pause.freeze_while_paused(config)  # nodes.paused: nothing that needs a running node changes
# nodes.autostop where it stops the machines: the head's access first; the instances wait for it (nothing bills
# before it exists).
autostop_role = node_source.autostop_role(source, config, stack)
cluster = node_source.provision(source)
if not runmode.offline():  # the update opens with the plan's summary (the offline plan prints its own)
    pulumi.log.info(summary.for_update(config, stack, facts.machine_type, facts.location,
                                       facts.accelerators_per_node, facts.accelerator_model,
                                       cluster.outputs.get("cost")))
known = known_hosts.register(stack, cluster.machines)
ray_nodes: list[RayNode] = []
cache_plan = pull_cache.plan_for(config)
for index, machine in enumerate(cluster.machines):
    head_ip = ray_nodes[0].private_ip if ray_nodes else machine.private_ip
    bootstrap = NodeBootstrap(
        f"{machine.name}-bootstrap",
        NodeBootstrapArgs(
            config=config,
            machine=machine,
            gpus_per_node=facts.accelerators_per_node,
            fabric_manager=facts.nvswitch,
            head_private_ip=head_ip,
            nas_server=cluster.shared_storage_server,
            nfs_export=cluster.shared_storage_export,
            nfs_options=cluster.shared_storage_options,
            shared_host_dir=cluster.shared_host_dir,
            accelerator=accelerators.accelerator(facts.accelerator),
            private_key=private_key,
            login=login,
            run=run_context,
            known_hosts=known,
            registry_password=secrets.registry_password,
            code_env=code.env(config.container.name) if code else None,
            code_scripts=code.scripts if code else (),
            cache_plan=cache_plan,
            node_index=index,
            caches={i: node.bootstrap.cache for i, node in enumerate(ray_nodes) if node.bootstrap.cache},
        ),
    )
    ray_nodes.append(RayNode(machine.name, machine, bootstrap))

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
        gpus_per_node=facts.accelerators_per_node,
        private_key=private_key,
        login=login,
        run=run_context,
        secret_env=secret_env,
    ),
)
job = TrainingJob(
    "training",
    TrainingJobArgs(
        config=config,
        stack=stack,
        nodes=ray_nodes,
        ray=ray,
        gpus_per_node=facts.accelerators_per_node,
        bf16=facts.bf16,
        private_key=private_key,
        login=login,
        run=run_context,
        secret_env=secret_env,
    ),
)

# RECLAIMED in jobStatus (spot nodes, shared storage)
spot_notices(config, stack, ray_nodes, private_key, login, run_context)
if config.nodes.autostop.enabled:
    Autostop(
        "autostop-cluster", config, stack, ray_nodes, autostop_role, cluster.outputs.get("instanceType"),
        after=[(f"{ray_nodes[0].name}/job", job.submission)] if job.submission is not None
        else [(f"{ray_nodes[0].name}/ray-ready", ray.ready)],
        private_key=private_key, login=login, run=run_context,
    )

outputs.export_all(config, facts, cluster, ray_nodes, job, login, known, run_context)
