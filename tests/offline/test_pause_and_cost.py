"""Pause and resume (nodes.paused), autostop's settings and the whole cost (the `cost` output and the plan)."""

from __future__ import annotations

import pytest
from offline_helpers import INSTANCE, run

from devtools import plan
from devtools.offline_cloud import OfflineRun, unwrap
from infra.config import ConfigError

PAUSED = {"roll-cluster:nodes": {"paused": True}}


def _cycle(stack: str = "multi") -> tuple[OfflineRun, OfflineRun, OfflineRun]:
    first = run(stack)
    paused = run(stack, cloud=first.cloud.next_run(), config=PAUSED)
    resumed = run(stack, cloud=paused.cloud.next_run())
    return first, paused, resumed


def test_pause_stops_every_instance_in_economical_mode_and_touches_no_node_step():
    _, paused, _ = _cycle()
    instances = paused.cloud.of_type(INSTANCE)
    assert len(instances) == 2
    for node in instances:
        assert node.inputs["status"] == "Stopped" and node.inputs["stoppedMode"] == "StopCharging", node.name
        assert node.outputs["publicIp"] == ""  # released under StopCharging
        assert paused.cloud.changes[node.name] == "update"
    # Nothing that needs a running node runs while it is stopped: no SSH step, container or image changes.
    changed = {name: change for name, change in paused.cloud.changes.items()
               if change != "same" and not name.endswith("-instance")}
    assert changed == {}, changed


def test_resume_starts_the_instances_and_submits_the_job_again():
    first, _, resumed = _cycle()
    for node in resumed.cloud.of_type(INSTANCE):
        assert node.inputs["status"] == "Running", node.name
        assert node.outputs["publicIp"], node.name
    changes = resumed.cloud.changes
    # The job step carries the head's start time: after the start it runs again; with training.resume the
    # framework resumes from the newest checkpoint (the resume itself: the first-step issue's branch).
    assert changes["training-job"] == "replace"
    before = unwrap(first.cloud.named("training-job").inputs["triggers"])
    after = unwrap(resumed.cloud.named("training-job").inputs["triggers"])
    assert before != after and before[0] == after[0]  # same submission id, new start of the head


def test_an_unpaused_update_changes_nothing():
    first = run("multi")
    again = run("multi", cloud=first.cloud.next_run())
    assert {n: c for n, c in again.cloud.changes.items() if c != "same"} == {}


def test_paused_is_refused_on_own_hosts_naming_the_key():
    with pytest.raises(ConfigError, match=r"roll-cluster:nodes.*paused"):
        run("hosts", config=PAUSED)


def test_the_cost_output_has_running_paused_and_after_destroy_with_currency_and_sources():
    cost = run("large").outputs["cost"]
    assert cost["currency"] == "CNY"
    assert cost["running"]["perHour"] > cost["running"]["instances"]["perHour"] > 0
    assert "estimate" in cost["running"]["disks"]["source"]
    assert 0 < cost["paused"]["perHour"] < cost["running"]["perHour"]
    assert "disks" in cost["paused"]["keepsBilling"] and "NAS" in cost["paused"]["keepsBilling"]
    assert "stock" in cost["paused"]["restart"]
    assert any("NAS" in item and "kept" in item for item in cost["afterDestroy"])


def test_plan_shows_the_whole_cost_and_labels_offline_prices_as_the_catalogs(capsys):
    assert plan.main(["--full", "large"]) == 0
    text = capsys.readouterr().out
    assert "live pay-as-you-go" not in text
    assert "the offline catalog's estimate" in text
    cost = text.split("== Cost", 1)[1].split("\n== ", 1)[0]
    for label in ("bootstrap", "running", "paused", "after destroy", "autostop"):
        assert f"\n  {label}" in cost, label
    assert "min modelled (devtools/schedule.py)" in cost and "CNY" in cost
    assert "keeps billing disks" in cost and "stock in the zone" in cost


def test_plan_says_when_autostop_fires(capsys):
    auto = '{"autostop": {"afterJobMinutes": 30, "idleMinutes": 60}}'
    assert plan.main(["--full", "large", "--config", f"roll-cluster:nodes={auto}"]) == 0
    text = capsys.readouterr().out
    assert "30 min after the job ended" in text and "after 60 min with no job and idle GPUs" in text



def test_with_spot_the_head_is_pay_as_you_go_unless_opted_in():
    workers_only = run("multi", config={"roll-cluster:nodes": {"spot": True}})
    strategies = {n.name: n.inputs["spotStrategy"] for n in workers_only.cloud.of_type(INSTANCE)}
    assert strategies == {"node-0-instance": "NoSpot", "node-1-instance": "SpotAsPriceGo"}
    everything = run("multi", config={"roll-cluster:nodes": {"spot": True, "spotHead": True}})
    assert {n.inputs["spotStrategy"] for n in everything.cloud.of_type(INSTANCE)} == {"SpotAsPriceGo"}


def test_spot_on_a_one_node_cluster_is_the_head_on_spot():
    only = run("dev", config={"roll-cluster:nodes": {"spot": True}})
    assert [n.inputs["spotStrategy"] for n in only.cloud.of_type(INSTANCE)] == ["SpotAsPriceGo"]
