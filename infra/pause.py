"""nodes.paused: while the instances are stopped nothing may reach them, so every resource that works over SSH
(the node steps, the Docker provider and its image and container, the local steps keyed on a node's address)
keeps what the state holds. A stack transformation, registered before any resource; it registers none itself.

Stopping in economical mode releases the public IP (`stopped_mode` doc of pulumi_alicloud ecs/instance.py; the
provider's Read then sets `public_ip` "": terraform-provider-alicloud alicloud/resource_alicloud_instance.go
at 81c43b67), so without this every step's connection would change and run against a stopped node. With it the
paused update only stops the instances. When the setting is removed the instances start (a new public IP, a new
`start_time`), the steps whose connection changed run again (they are idempotent: the reboot path), Ray comes back
with its containers and the job step, which carries the head's start time, submits the job again.
See verified-facts#pause-instance.
"""

from __future__ import annotations

import pulumi

from infra.config import ClusterConfig

# Types that need a running node (their provider connects to it) or take a node's address.
NODE_BOUND_TYPES = ("command:remote:", "command:local:", "docker:", "pulumi:providers:docker")


def freeze_while_paused(config: ClusterConfig) -> None:
    """Before any resource: with nodes.paused, the node-bound resources registered after this ignore changes to
    every input they are given (ignore_changes on the input names), so the update does not touch them."""
    if not config.nodes.capabilities.pause or not config.nodes.paused:
        return

    def freeze(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
        if not args.type_.startswith(NODE_BOUND_TYPES):
            return None
        ignored = sorted({*(args.opts.ignore_changes or []), *(str(key) for key in args.props)})
        opts = pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(ignore_changes=ignored))
        return pulumi.ResourceTransformationResult(args.props, opts)

    pulumi.runtime.register_stack_transformation(freeze)
