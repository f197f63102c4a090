"""The resource graph: every ComponentResource and every resource the program registers, one module per stage in
the order data flows: the node source's resources (node_source routes to a folder per source: alibaba/ with its
cluster, network, shared_storage, gpu_node, baked_image and autostop_role), the stack's known-hosts (known_hosts),
node bootstrap (bootstrap), the Ray cluster (ray_cluster) and the training job (training_job); remote_steps
registers the step resources all of them use. Everything these compute from lives in infra/, which registers
nothing."""
