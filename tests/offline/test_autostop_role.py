"""nodes.autostop under the offline cloud: the head's RAM role may only stop this stack's instances, and the
watcher step on the head gets exactly this stack's instances and that role."""

from __future__ import annotations

import base64
import json

from offline_helpers import INSTANCE, env_of, run, step_command

from devtools import plan
from devtools.offline_cloud import stack_config, unwrap

AUTOSTOP = {"roll-cluster:nodes": {"autostop": {"afterJobMinutes": 30, "idleMinutes": 60}}}
RAM = ("alicloud:ram/role:Role", "alicloud:ram/policy:Policy", "alicloud:ram/rolePolicyAttachment:RolePolicyAttachment",
       "alicloud:ecs/ramRoleAttachment:RamRoleAttachment")


def test_the_roles_policy_allows_only_stopping_instances_tagged_with_this_stack():
    result = run("multi", config=AUTOSTOP)
    (policy,) = result.cloud.of_type("alicloud:ram/policy:Policy")
    document = json.loads(unwrap(policy.inputs["policyDocument"]))
    (statement,) = document["Statement"]
    assert statement["Effect"] == "Allow"
    assert set(statement["Action"]) <= {"ecs:StopInstances", "ecs:StopInstance"}
    assert "ecs:StopInstances" in statement["Action"]
    assert statement["Resource"] == "acs:ecs:*:*:instance/*"
    assert statement["Condition"] == {"StringEquals": {"acs:ResourceTag/roll-cluster-stack": ["multi"]}}
    # ... and that tag is the one every instance of the stack carries.
    assert {n.inputs["tags"]["roll-cluster-stack"] for n in result.cloud.of_type(INSTANCE)} == {"multi"}
    (role,) = result.cloud.of_type("alicloud:ram/role:Role")
    trust = json.loads(unwrap(role.inputs["assumeRolePolicyDocument"]))
    assert trust["Statement"][0]["Principal"] == {"Service": ["ecs.aliyuncs.com"]}
    (attachment,) = result.cloud.of_type("alicloud:ram/rolePolicyAttachment:RolePolicyAttachment")
    assert attachment.inputs["policyType"] == "Custom"


def test_only_the_head_carries_the_role_and_its_watcher_stops_exactly_this_stacks_instances():
    result = run("multi", config=AUTOSTOP)
    instances = {n.name: n.id for n in result.cloud.of_type(INSTANCE)}
    (on_head,) = result.cloud.of_type("alicloud:ecs/ramRoleAttachment:RamRoleAttachment")
    assert on_head.inputs["instanceId"] == instances["node-0-instance"]
    env = env_of(step_command(result, "autostop"))
    assert sorted(env["INSTANCE_IDS"].split()) == sorted(instances.values())
    assert env["RAM_ROLE"] == result.cloud.of_type("alicloud:ram/role:Role")[0].inputs["roleName"]
    assert env["AUTOSTOP_MODE"] == "instances"
    assert (env["AUTOSTOP_AFTER_JOB_MINUTES"], env["AUTOSTOP_IDLE_MINUTES"]) == ("30", "60")
    # No key travels to the node: the step's environment names the role, the metadata service has its credentials.
    assert not [name for name in env if "KEY" in name or "SECRET" in name or "TOKEN" in name]
    # The stopper and the SDK it needs travel with the step (the training images do not carry the SDK).
    assert "StopInstancesRequest" in base64.b64decode(env["AUTOSTOP_STOPPER_B64"]).decode()
    assert "aliyun-python-sdk-ecs==" in base64.b64decode(env["AUTOSTOP_SDK_REQUIREMENTS_B64"]).decode()


def test_a_new_training_job_leaves_the_autostop_step_as_it_is():
    """The watcher reads the current job's id on the head: a changed training setting (a new job id) does not
    change the autostop step's inputs, so `pulumi up` neither reinstalls the watcher nor restarts its clocks."""
    before = run("multi", config=AUTOSTOP)
    after = run("multi", config={**AUTOSTOP, "roll-cluster:training": {"checkpointEvery": 7}})
    assert before.outputs["jobId"] != after.outputs["jobId"]  # a new job
    assert before.cloud.named("autostop").inputs == after.cloud.named("autostop").inputs


def test_two_stacks_named_alike_in_two_regions_get_different_ram_names():
    names = set()
    for region in ("cn-hangzhou", "cn-beijing"):
        result = run("multi", config={**AUTOSTOP, "alicloud:region": region})
        (role,) = result.cloud.of_type("alicloud:ram/role:Role")
        (policy,) = result.cloud.of_type("alicloud:ram/policy:Policy")
        assert role.inputs["roleName"] == policy.inputs["policyName"]
        assert len(role.inputs["roleName"]) <= 64 and region in role.inputs["roleName"]
        names.add(role.inputs["roleName"])
    assert len(names) == 2


def test_with_autostop_off_there_is_no_role_and_no_watcher():
    result = run("multi", config={"roll-cluster:nodes": {"autostop": {"afterJobMinutes": 0}}})
    assert not [r for r in result.cloud.resources if r.type in RAM]
    assert not [r for r in result.cloud.resources if r.name == "autostop"]


def test_on_own_hosts_autostop_stops_the_job_and_creates_no_cloud_role():
    result = run("hosts", config=AUTOSTOP)
    assert not [r for r in result.cloud.resources if r.type in RAM]
    env = env_of(step_command(result, "autostop"))
    assert env["AUTOSTOP_MODE"] == "ray" and "INSTANCE_IDS" not in env


def test_autostop_is_on_by_default_on_alibaba_and_every_shipped_cloud_stack_plans_when_it_fires(capsys):
    cloud_stacks = [s for s in plan.shipped_stacks() if stack_config(s).get("roll-cluster:nodes", {}).get(
        "source", "alibaba") == "alibaba"]
    assert len(cloud_stacks) >= 5
    for stack in cloud_stacks:
        # The default plan's cost says when; the full plan has the section with the permissions.
        assert plan.main([stack, "--no-registry"]) == 0, stack
        assert "autostop            stops every instance of this stack (StopCharging) 30 min after the job ended" in (
            capsys.readouterr().out), stack
        assert plan.main(["--full", stack, "--no-registry"]) == 0, stack
        text = capsys.readouterr().out
        section = text.split("== Autostop and permissions", 1)[1].split("\n== ", 1)[0]
        assert "stops every instance of this stack (StopCharging) 30 min after the job ended" in section, stack
        # ... and the RAM permissions that default needs, before the first `up` meets them.
        assert "ram:CreateRole" in section and "ram:PassRole" in section and "ram:AttachPolicyToRole" in section
    result = run("multi")
    assert env_of(step_command(result, "autostop"))["AUTOSTOP_AFTER_JOB_MINUTES"] == "30"


def test_the_plan_lists_only_the_permissions_of_the_features_a_stack_uses(capsys):
    assert plan.main(["--full", "multi", "--no-registry", "--config",
                      'roll-cluster:nodes={"autostop": {"afterJobMinutes": 0}}']) == 0
    section = capsys.readouterr().out.split("== Autostop and permissions", 1)[1].split("\n== ", 1)[0]
    assert "off (nodes.autostop.afterJobMinutes: 0)" in section
    assert "ram:" not in section and "AliyunNASFullAccess" in section  # multi has NAS, autostop is off
    assert plan.main(["--full", "hosts", "--no-registry"]) == 0
    section = capsys.readouterr().out.split("== Autostop and permissions", 1)[1].split("\n== ", 1)[0]
    assert "none in any cloud" in section


def test_no_instance_is_created_before_ram_agreed_to_the_role_and_its_policy():
    """A caller without ram:CreateRole, CreatePolicy or AttachPolicyToRole fails the first `up` before anything that
    bills exists: every instance waits for the role's policy attachment."""
    result = run("multi", config=AUTOSTOP)
    (attachment,) = result.cloud.of_type("alicloud:ram/rolePolicyAttachment:RolePolicyAttachment")
    for node in result.cloud.of_type(INSTANCE):
        waits_for = result.cloud.options[node.name].depends_on or []
        assert any(getattr(r, "_name", None) == attachment.name for r in waits_for), node.name


def test_a_new_role_is_attached_to_the_head_only_after_the_old_one_is_detached():
    """ECS gives an instance one RAM role: the attachment's replacement (the role renamed, the head replaced) must
    detach the old role first, or AttachInstanceRamRole is refused."""
    result = run("multi", config=AUTOSTOP)
    assert result.cloud.options["autostop-role-attachment"].delete_before_replace is True
