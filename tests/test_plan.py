"""The offline plan (`python3 dev.py plan <stack>`) for every shipped stack: what a user reads before `pulumi up`."""

from __future__ import annotations

import base64

import pytest
from offline_helpers import run

from infra import plan
from infra.offline import shipped_stacks

STACKS = ["dev", "large", "multi", "openrlhf", "verl"]


def test_the_five_contract_stacks_are_shipped():
    assert shipped_stacks() == STACKS


@pytest.mark.parametrize("stack", STACKS)
def test_plan_shows_placement_network_nodes_steps_job_outputs_and_price(stack, capsys):
    assert plan.main([stack]) == 0
    text = capsys.readouterr().out
    for heading in ("Placement", "Network", "Nodes", "Steps per node", "Training job", "Stack outputs", "Resources"):
        assert f"== {heading} " in text, heading
    assert "per hour" in text and "tcp  22/22" in text and "from members of this security group" in text
    for step, script in (("prepare-host", "prepare_host.sh"), ("docker", "install_docker.sh"),
                         ("pull-image", "pull_image.sh"), ("gpu-ready", "local/gpu_ready.sh"),
                         ("ray-head", "ray_head.sh"), ("ray-ready", "ray_ready.sh"), ("job", "job_submit.sh")):
        assert any(step in line and script in line for line in text.splitlines()), (step, script)
    assert "submission id" in text and "generated configuration" in text
    assert "0.0.0.0/0" not in text


def test_plan_of_a_bigger_cluster_and_a_bad_config(capsys):
    assert plan.main(["multi", "--nodes", "4"]) == 0
    assert "node-3" in capsys.readouterr().out
    assert plan.main(["nonexistent"]) == 1
    assert "no stack file Pulumi.nonexistent.yaml" in capsys.readouterr().err


def test_first_boot_user_data_fits_alibabas_limit():
    # ECS accepts at most 32 KB of user data; stay under it even counting the Base64 encoding.
    for stack in STACKS:
        user_data = run(stack).cloud.of_type("alicloud:ecs/instance:Instance")[0].inputs["userData"]
        assert len(user_data) < 32 * 1024, stack
        assert base64.b64decode(user_data).startswith(b"#!/bin/bash\n")


@pytest.mark.parametrize("stack", ["multi", "large", "verl"])
def test_plan_shows_the_dashboard_reached_through_the_tunnel_by_default(stack, capsys):
    assert plan.main([stack]) == 0
    text = capsys.readouterr().out
    assert "dashboardTunnel" in text and "-N -L 8265:127.0.0.1:8265" in text
    assert "dashboardUrl" not in text and "8265/8265" not in text  # no output and no security group rule
    result = run(stack)
    head = next(r for r in result.cloud.resources if r.name == "node-0-ray-head")
    assert "export DASHBOARD_HOST=127.0.0.1" in str(head.inputs["create"])
