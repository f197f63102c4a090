"""nodes.autostop: the watcher on the head (infra/scripts/autostop.sh), and on a source whose autostop stops the
instances, the attachment of the role it stops them with (the role itself: components/alibaba/autostop_role.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pulumi

from components import remote_steps
from components.alibaba.autostop_role import AutostopRole
from components.ray_cluster import RayNode
from infra import autostop
from infra.config import ClusterConfig
from infra.node import ssh_access, steps


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
        run: steps.RunContext,
        opts: pulumi.ResourceOptions | None = None,
    ):
        """The watcher on the head; on Alibaba (`role`: AutostopRole, registered before the nodes) the head gets
        the role first."""
        super().__init__("roll-cluster:index:Autostop", name, None, opts)
        head = nodes[0]
        role_attached: list[pulumi.Resource] = []
        ram_role = role.name if role is not None else ""
        if role is not None:
            role_attached.append(role.attach_to(head.machine.identity, self))
        ids = pulumi.Output.all(*[n.machine.identity for n in nodes])
        env = pulumi.Output.all(ids, instance_type or "").apply(
            lambda v: autostop.watcher_env(config, [str(i) for i in v[0]], config.region or "", ram_role, str(v[1]))
        )
        ctx = remote_steps.context_for(head.machine, private_key, self, login=login, run=run, running=True)
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
    login: ssh_access.LoginKey, run: steps.RunContext,
) -> list[pulumi.Resource]:
    """The spot notice watcher on every spot node (infra/scripts/spot_notice.sh), where shared storage can carry
    its record to the head's `jobStatus`. A child of each node's bootstrap: it runs once the node is ready."""
    directory = autostop.reclaim_dir(config, stack)
    if not directory:
        return []
    watchers: list[pulumi.Resource] = []
    for rank in autostop.spot_nodes(config):
        node = nodes[rank]
        ctx = remote_steps.context_for(node.machine, private_key, node.bootstrap, login=login, run=run, running=True)
        watchers.append(remote_steps.remote_step(
            ctx, "spot-notice", autostop.SPOT_NOTICE_SCRIPTS, {"SPOT_ACTION": "install", "RECLAIM_DIR": directory},
            after=[(node.bootstrap.ready_key, node.bootstrap.ready)],
            triggers=[node.machine.identity],
        ))
    return watchers
