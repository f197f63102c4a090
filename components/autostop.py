"""nodes.autostop: the watcher on the head (infra/scripts/autostop.sh) and, on Alibaba, the instance RAM role it
stops the cluster with.

The role (alicloud ram Role, Policy, RolePolicyAttachment; attached to the head with ecs RamRoleAttachment, the
provider's replacement for the instance's deprecated `role_name`: terraform-provider-alicloud
alicloud/resource_alicloud_instance.go and resource_alicloud_ecs_ram_role_attachment.go at 81c43b67)
may only stop instances tagged with this stack (infra/autostop.py). Only the head carries it.
See verified-facts#autostop-instance.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import pulumi
import pulumi_alicloud as alicloud
import pulumi_command as command

from components import remote_steps
from components.ray_cluster import RayNode
from infra import autostop
from infra.config import ClusterConfig
from infra.node import ssh_access

INSTANCE_TYPE = "alicloud:ecs/instance:Instance"


class AutostopRole(pulumi.ComponentResource):
    """The head's instance RAM role, its policy and their attachment: registered before the nodes, and every ECS
    instance waits for them (a stack transformation), so a first `up` whose caller may not create RAM roles and
    policies stops before anything that bills exists. ram:PassRole is asked for only when the role is attached to
    the head (Autostop), after the instances exist: nothing offline can check it (docs/operations.md,
    'Permissions')."""

    def __init__(self, name: str, config: ClusterConfig, stack: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:AutostopRole", name, None, opts)
        self.name = autostop.role_name(pulumi.get_project(), stack, config.region or "")
        role = alicloud.ram.Role(
            "autostop-role", role_name=self.name,
            assume_role_policy_document=autostop.assume_role_policy(stack),
            description=f"roll-cluster {stack}: the head stops this stack's instances when they idle",
            opts=pulumi.ResourceOptions(parent=self),
        )
        policy = alicloud.ram.Policy(
            "autostop-policy", policy_name=self.name,
            policy_document=json.dumps(autostop.stop_policy(stack)),
            description=f"roll-cluster {stack}: StopInstances on instances tagged {autostop.STACK_TAG}={stack}",
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.attached = alicloud.ram.RolePolicyAttachment(
            "autostop-policy-attachment", role_name=role.role_name, policy_name=policy.policy_name,
            policy_type="Custom", opts=pulumi.ResourceOptions(parent=self),
        )
        self.role_name = role.role_name
        # RAM's propagation lag: a role attached to an instance right after CreateRole can be refused, and the
        # provider retries only throttling (infra/autostop.py ROLE_SETTLE_S). A new role (or policy attachment)
        # waits, while the instances are created; an unchanged one does not, as the wait's triggers do not change.
        self.settled = command.local.Command(
            "autostop-role-settle", create=f"sleep {autostop.ROLE_SETTLE_S}", add_previous_output_in_env=False,
            triggers=[role.role_id, self.attached.id],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.attached]),
        )
        attached = self.attached

        def instances_wait(args: pulumi.ResourceTransformationArgs) -> pulumi.ResourceTransformationResult | None:
            if args.type_ != INSTANCE_TYPE:
                return None
            opts = pulumi.ResourceOptions.merge(args.opts, pulumi.ResourceOptions(depends_on=[attached]))
            return pulumi.ResourceTransformationResult(args.props, opts)

        pulumi.runtime.register_stack_transformation(instances_wait)
        self.register_outputs({})


class Autostop(pulumi.ComponentResource):
    def __init__(
        self,
        name: str,
        config: ClusterConfig,
        stack: str,
        nodes: Sequence[RayNode],
        role: AutostopRole | None,
        instance_type: pulumi.Input[str] | None,
        after: Sequence[tuple[str, pulumi.Resource]],
        private_key: pulumi.Output[str] | None,
        login: ssh_access.LoginKey,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """The watcher on the head; on Alibaba (`role`: AutostopRole, registered before the nodes) the head gets
        the role first."""
        super().__init__("roll-cluster:index:Autostop", name, None, opts)
        head = nodes[0]
        role_attached: list[pulumi.Resource] = []
        ram_role = role.name if role is not None else ""
        if role is not None:
            # An instance holds one RAM role: a new role (a renamed one, or a replaced head) is attached only once
            # the old attachment is gone, so the replacement deletes first (Pulumi creates first by default).
            on_head = alicloud.ecs.RamRoleAttachment(
                "autostop-role-attachment", instance_id=head.machine.identity, ram_role_name=role.role_name,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[role.attached, role.settled],
                                            delete_before_replace=True),
            )
            role_attached.append(on_head)
        ids = pulumi.Output.all(*[n.machine.identity for n in nodes])
        env = pulumi.Output.all(ids, instance_type or "").apply(
            lambda v: autostop.watcher_env(config, [str(i) for i in v[0]], config.region or "", ram_role, str(v[1]))
        )
        ctx = remote_steps.context_for(head.machine, private_key, self, login=login, running=True)
        ctx = dataclasses.replace(ctx, depends_on=[*ctx.depends_on, *role_attached])
        self.watcher = remote_steps.remote_step(
            ctx, "autostop", autostop.AUTOSTOP_SCRIPTS, {}, dynamic_env=env, after=after,
            triggers=[head.machine.started] if head.machine.started is not None else None,
            delete_scripts=autostop.AUTOSTOP_SCRIPTS, delete_env={"AUTOSTOP_ACTION": "remove"},
            resource_name="autostop",
        )
        self.register_outputs({})


def spot_notices(
    config: ClusterConfig, stack: str, nodes: Sequence[RayNode], private_key: pulumi.Output[str] | None,
    login: ssh_access.LoginKey,
) -> list[pulumi.Resource]:
    """The spot notice watcher on every spot node (infra/scripts/spot_notice.sh), where shared storage can carry
    its record to the head's `jobStatus`. A child of each node's bootstrap: it runs once the node is ready."""
    directory = autostop.reclaim_dir(config, stack)
    if not directory:
        return []
    steps: list[pulumi.Resource] = []
    for rank in autostop.spot_nodes(config):
        node = nodes[rank]
        ctx = remote_steps.context_for(node.machine, private_key, node.bootstrap, login=login, running=True)
        steps.append(remote_steps.remote_step(
            ctx, "spot-notice", autostop.SPOT_NOTICE_SCRIPTS, {"SPOT_ACTION": "install", "RECLAIM_DIR": directory},
            after=[(node.bootstrap.ready_key, node.bootstrap.ready)],
            triggers=[node.machine.identity],
        ))
    return steps
