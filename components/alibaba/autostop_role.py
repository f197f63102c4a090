"""nodes.autostop on Alibaba: the head's instance RAM role, which the watcher (components/autostop.py) stops the
cluster with.

The role (alicloud ram Role, Policy, RolePolicyAttachment; attached to the head with ecs RamRoleAttachment, the
provider's replacement for the instance's deprecated `role_name`: see verified-facts#autostop-instance) may only stop
instances tagged with this stack (infra/autostop.py). Only the head carries it.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_alicloud as alicloud
import pulumi_command as command

from infra import autostop
from infra.config import ClusterConfig

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

    def attach_to(self, instance_id: pulumi.Input[str], parent: pulumi.Resource) -> pulumi.Resource:
        """The role on the head instance, a child of `parent` (the watcher's component, components/autostop.py)."""
        # An instance holds one RAM role: a new role (a renamed one, or a replaced head) is attached only once the
        # old attachment is gone, so the replacement deletes first (Pulumi creates first by default).
        return alicloud.ecs.RamRoleAttachment(
            "autostop-role-attachment", instance_id=instance_id, ram_role_name=self.role_name,
            opts=pulumi.ResourceOptions(parent=parent, depends_on=[self.attached, self.settled],
                                        delete_before_replace=True),
        )
