"""Economical mode per instance family (infra/economical.py): where a stopped instance stops billing its compute,
and what pause, autostop and the cost output do where it does not (Alibaba: the i and d series, gn5, re6p)."""

from __future__ import annotations

import pytest
from offline_helpers import INSTANCE, env_of, run, step_command

from components.alibaba import gpu_node
from infra.config import ClusterConfig
from infra.cost import cost_summary
from infra.economical import economical_mode, stopped_mode
from infra.sources.alibaba.catalog import FAMILIES

PAUSED = {"roll-cluster:nodes": {"paused": True}}


@pytest.mark.parametrize(("instance_type", "economical"), [
    ("ecs.gn7i-c8g1.2xlarge", True), ("ecs.gn6v-c8g1.4xlarge", True), ("ecs.gn5i-c4g1.xlarge", True),
    ("ecs.ebmgn8v.48xlarge", True), ("ecs.gn5-c4g1.xlarge", False), ("ecs.i2.xlarge", False),
    ("ecs.d1ne.2xlarge", False), ("ecs.re6p-redis.2xlarge", False),
])
def test_economical_mode_follows_alibabas_list_of_families(instance_type: str, economical: bool) -> None:
    assert economical_mode(instance_type) is economical
    assert stopped_mode(instance_type) == ("StopCharging" if economical else "KeepCharging")


def test_every_family_the_config_accepts_has_economical_mode() -> None:
    """nodes.instanceTypes accepts the catalog's GPU families only; none is on Alibaba's list without economical
    mode, so pausing and autostop stop the compute's billing for every stack the config accepts today."""
    assert FAMILIES and all(economical_mode(f"{family}-c8g1.2xlarge") for family in FAMILIES)


def test_without_economical_mode_the_cost_says_a_paused_cluster_keeps_billing_its_instances() -> None:
    config = run("multi").notes["config"]
    assert isinstance(config, ClusterConfig)
    price = {"amount": 20.0, "currency": "CNY", "basis": "catalog"}
    economical = cost_summary(config, price)
    kept = cost_summary(config, price, economical=False)
    assert economical["paused"]["perHour"] < economical["running"]["perHour"]
    assert kept["paused"]["perHour"] == kept["running"]["perHour"]
    assert "no economical mode" in kept["paused"]["stopsBilling"]
    assert kept["paused"]["keepsBilling"].startswith("instances")


def test_a_paused_family_without_economical_mode_asks_for_no_stop_mode_and_stays_unchanged(monkeypatch) -> None:
    """The provider reads back a mode other than StopCharging for such a family: asking for StopCharging would
    show a change on every `up` while paused. Leaving the mode out asks for nothing it cannot keep."""
    monkeypatch.setattr(gpu_node, "economical_mode", lambda instance_type: False)
    first = run("multi")
    paused = run("multi", cloud=first.cloud.next_run(), config=PAUSED)
    again = run("multi", cloud=paused.cloud.next_run(), config=PAUSED)
    for node in paused.cloud.of_type(INSTANCE):
        assert node.inputs["status"] == "Stopped" and node.inputs.get("stoppedMode") is None, node.name
    assert {again.cloud.changes[n.name] for n in again.cloud.of_type(INSTANCE)} == {"same"}


def test_autostop_asks_for_the_stop_mode_of_the_placed_family() -> None:
    env = env_of(step_command(run("multi"), "autostop"))
    assert env["STOPPED_MODE"] == "StopCharging"  # gn6v has economical mode
