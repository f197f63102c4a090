"""The data disk's class (nodes.dataDiskCategory, dataDiskPerformanceLevel, dataDiskBursting): what is refused before
any resource exists, what the instance is created with, what a later change does, its price, and how it bounds a
node's image pull in the model (a pull moves ~4x the compressed layers through the disk)."""

from __future__ import annotations

from typing import Any

import pytest
from offline_helpers import INSTANCE, run
from test_config import PROJECT, assert_words, hosts_stack, only_problem, parse, stack

from devtools import plan, schedule
from devtools.alibaba_refusals import AlibabaRefused, _refuse_like_alibaba
from devtools.offline_cloud import OfflineCloud
from infra.node import steps

FITS = {"roll-cluster:training": {"overrides": {"rollout_batch_size": 128}}}


# ------------------------------------------------------------------------------------------ refused before anything
@pytest.mark.parametrize("nodes,key,words", [
    ({"dataDiskGb": 200, "dataDiskBursting": True}, "dataDiskBursting",
     ("applies to dataDiskCategory cloud_auto only", 'got true with dataDiskCategory "cloud_essd"')),
    ({"dataDiskGb": 200, "dataDiskCategory": "cloud_auto", "dataDiskPerformanceLevel": "PL2"},
     "dataDiskPerformanceLevel", ("applies to dataDiskCategory cloud_essd only", 'got "PL2"', "cloud_auto")),
    ({"dataDiskGb": 200, "dataDiskPerformanceLevel": "PL2"}, "dataDiskPerformanceLevel",
     ("PL2 needs nodes.dataDiskGb >= 461", 'got "PL2" with dataDiskGb 200')),
    ({"dataDiskGb": 1000, "dataDiskPerformanceLevel": "PL3"}, "dataDiskPerformanceLevel",
     ("PL3 needs nodes.dataDiskGb >= 1261", 'got "PL3" with dataDiskGb 1000')),
    ({"dataDiskCategory": "cloud_auto"}, "dataDiskCategory",
     ("needs a data disk (nodes.dataDiskGb 100 or more)", 'got "cloud_auto" with dataDiskGb 0')),
    ({"dataDiskPerformanceLevel": "PL0"}, "dataDiskPerformanceLevel", ("needs a data disk", 'got "PL0"')),
    ({"dataDiskGb": 200, "dataDiskCategory": "cloud_ssd"}, "dataDiskCategory",
     ('"cloud_essd", "cloud_auto"', 'got "cloud_ssd"')),
    ({"dataDiskGb": 500, "dataDiskPerformanceLevel": "PL4"}, "dataDiskPerformanceLevel",
     ('"PL0", "PL1", "PL2", "PL3"', 'got "PL4"')),
])
def test_an_invalid_data_disk_class_is_refused_naming_the_key_what_is_allowed_and_what_was_given(
        nodes: dict[str, Any], key: str, words: tuple[str, ...]) -> None:
    path, message = only_problem(stack(nodes=nodes))
    assert path == f"{PROJECT}:nodes.{key}"
    assert_words(message, *words)


@pytest.mark.parametrize("key,value", [
    ("dataDiskCategory", "cloud_auto"), ("dataDiskPerformanceLevel", "PL2"), ("dataDiskBursting", True)])
def test_the_data_disk_class_is_refused_on_own_hosts(key: str, value: Any) -> None:
    path, message = only_problem(hosts_stack(**{key: value}))
    assert path == f"{PROJECT}:nodes.{key}"
    assert_words(message, "applies to nodes.source alibaba only")


def test_the_smallest_disk_of_each_level_is_accepted() -> None:
    assert parse(stack(nodes={"dataDiskGb": 461, "dataDiskPerformanceLevel": "PL2"})).nodes.data_disk_gb == 461
    assert parse(stack(nodes={"dataDiskGb": 1261, "dataDiskPerformanceLevel": "PL3"})).nodes.data_disk_gb == 1261
    auto = parse(stack(nodes={"dataDiskGb": 100, "dataDiskCategory": "cloud_auto"})).nodes
    assert auto.data_disk_burst  # left out: burst on
    assert not parse(stack(nodes={"dataDiskGb": 100, "dataDiskCategory": "cloud_auto",
                                  "dataDiskBursting": False})).nodes.data_disk_burst


# ------------------------------------------------------------------------------------------ what the instance gets
def data_disks(nodes: dict[str, Any]) -> list[Any]:
    instances = run("multi", config={"roll-cluster:nodes": nodes}).cloud.of_type(INSTANCE)
    return [instance.inputs["dataDisks"] for instance in instances]


def test_the_default_data_disk_keeps_its_inputs() -> None:
    # No performanceLevel and no burstingEnabled input: an existing stack sees no change (and no replacement).
    for disks in data_disks({}):
        assert [sorted(disk) for disk in disks] == [["category", "deleteWithInstance", "name", "size"]]
        assert disks[0]["category"] == "cloud_essd"


def test_an_autopl_data_disk_is_created_with_its_burst() -> None:
    for disks in data_disks({"dataDiskCategory": "cloud_auto"}):
        assert disks[0]["category"] == "cloud_auto" and disks[0]["burstingEnabled"] is True
        assert "performanceLevel" not in disks[0]
    for disks in data_disks({"dataDiskCategory": "cloud_auto", "dataDiskBursting": False}):
        assert disks[0]["burstingEnabled"] is False


def test_an_essd_data_disk_is_created_at_its_level() -> None:
    for disks in data_disks({"dataDiskGb": 500, "dataDiskPerformanceLevel": "PL2"}):
        assert disks[0]["category"] == "cloud_essd" and disks[0]["performanceLevel"] == "PL2"
        assert disks[0]["size"] == 500 and "burstingEnabled" not in disks[0]


def test_describe_disks_answers_with_the_data_disks_class() -> None:
    cloud = run("multi", config={"roll-cluster:nodes": {"dataDiskCategory": "cloud_auto"}}).cloud
    for instance in cloud.of_type(INSTANCE):
        disk = cloud._disks({"instanceId": instance.id, "type": "data"})["disks"][0]
        assert disk["category"] == "cloud_auto" and disk["performanceLevel"] == ""


def test_the_offline_cloud_refuses_an_essd_smaller_than_its_levels_minimum_as_alibaba_does() -> None:
    disk = {"category": "cloud_essd", "size": 460, "performanceLevel": "PL2"}
    with pytest.raises(AlibabaRefused, match="PL2 ESSD data disk needs at least 461 GiB; got 460"):
        _refuse_like_alibaba(INSTANCE, "node-0-instance", {"dataDisks": [disk]})
    _refuse_like_alibaba(INSTANCE, "node-0-instance", {"dataDisks": [{**disk, "size": 461}]})
    # The provider sends no PerformanceLevel for cloud_auto (resource_alicloud_instance.go): nothing to refuse.
    # see verified-facts#test-data-disk-instance
    _refuse_like_alibaba(INSTANCE, "node-0-instance", {"dataDisks": [{**disk, "category": "cloud_auto"}]})


# ------------------------------------------------------------------------------------------ a later change
@pytest.mark.parametrize("before,after", [
    ({}, {"dataDiskCategory": "cloud_auto"}),
    ({"dataDiskCategory": "cloud_auto"}, {"dataDiskCategory": "cloud_auto", "dataDiskBursting": False}),
    ({"dataDiskGb": 500}, {"dataDiskGb": 500, "dataDiskPerformanceLevel": "PL2"}),
])
def test_a_changed_data_disk_class_replaces_every_node(before: dict[str, Any], after: dict[str, Any]) -> None:
    first = OfflineCloud()
    run("multi", cloud=first, config={"roll-cluster:nodes": before})
    later = first.next_run()
    run("multi", cloud=later, config={"roll-cluster:nodes": after})
    assert later.changed_nodes() == {"node-0-instance": "replace", "node-1-instance": "replace"}


def test_the_plan_says_a_changed_data_disk_class_replaces_every_node(capsys: Any) -> None:
    assert plan.main(["--full", "multi"]) == 0
    section = capsys.readouterr().out.split("== What a later change or a reboot does", 1)[1].splitlines()
    for key in ("nodes.dataDiskCategory", "nodes.dataDiskPerformanceLevel", "nodes.dataDiskBursting"):
        line = next(i for i, row in enumerate(section) if key in row)
        assert "replaces every node" in " ".join(section[line:line + 3]), key


# ------------------------------------------------------------------------------------------ cost
def disks_cost(nodes: dict[str, Any]) -> dict[str, Any]:
    cost: dict[str, Any] = run("multi", config={"roll-cluster:nodes": nodes}).outputs["cost"]["running"]["disks"]
    return cost


def test_the_cost_prices_the_data_disks_class_and_names_the_burst_as_an_extra() -> None:
    pl1, pl2 = disks_cost({"dataDiskGb": 500}), disks_cost({"dataDiskGb": 500, "dataDiskPerformanceLevel": "PL2"})
    # 2 nodes x 500 GB at 1 CNY (PL1) or 2 CNY (PL2) per GB and month, plus 2 x 200 GB system disks at PL1.
    assert pl1["perHour"] == round((1000 * 1.0 + 400 * 1.0) / 730, 2)
    assert pl2["perHour"] == round((1000 * 2.0 + 400 * 1.0) / 730, 2)
    assert "data ESSD PL2 1000 GB (2 CNY per GB and month)" in pl2["classes"] and pl2["extras"] == []
    auto = disks_cost({"dataDiskCategory": "cloud_auto"})
    assert auto["perHour"] == disks_cost({})["perHour"]  # AutoPL's baseline is billed as PL1 [28]
    assert "ESSD AutoPL with burst" in auto["classes"]
    assert any("burst billed per use" in extra and "cannot bound" in extra for extra in auto["extras"])
    assert disks_cost({"dataDiskCategory": "cloud_auto", "dataDiskBursting": False})["extras"] == []


def test_the_plans_cost_shows_the_disk_classes_and_the_burst(capsys: Any) -> None:
    nodes = '{"dataDiskGb": 200, "dataDiskCategory": "cloud_auto"}'
    assert plan.main(["--full", "multi", "--config", f"roll-cluster:nodes={nodes}"]) == 0
    cost = capsys.readouterr().out.split("== Cost", 1)[1].split("\n== ", 1)[0]
    assert "(system ESSD PL1 400 GB, data ESSD AutoPL with burst 400 GB (1 CNY per GB and month))" in cost
    assert "+ AutoPL performance burst billed per use" in cost


# ------------------------------------------------------------------------------------------ the model's disk bound
def config_of(nodes: dict[str, Any]) -> tuple[list[steps.StepRecord], Any]:
    result = run("multi", config={"roll-cluster:nodes": nodes, **FITS})
    return list(result.steps), result.notes["config"]


def test_a_200_gib_pl1_disk_keeps_up_with_a_tuned_pull_and_a_smaller_disk_caps_it() -> None:
    _, pl1 = config_of({})
    assert schedule.disk_mbyte_s(pl1) == 220.0  # min{120 + 0.5 x 200, 350} [28]
    # The sourced tuned pull (~50 MB/s) fits under the default disk's 55 MB/s bound.
    assert schedule.disk_bound_mbyte_s(pl1) == 55.0 > schedule.constant("tuned-pull")
    _, auto = config_of({"dataDiskCategory": "cloud_auto"})
    assert schedule.disk_bound_mbyte_s(auto) == 1000.0 > schedule.constant("tuned-pull")
    _, no_burst = config_of({"dataDiskCategory": "cloud_auto", "dataDiskBursting": False})
    assert schedule.disk_bound_mbyte_s(no_burst) == 55.0
    _, pl3 = config_of({"dataDiskGb": 1300, "dataDiskPerformanceLevel": "PL3"})
    assert schedule.disk_bound_mbyte_s(pl3) == (120 + 0.5 * 1300) / 4
    # Without a data disk Docker's images are on the system disk, an ESSD PL1 of systemDiskGb: below the pull.
    _, system = config_of({"dataDiskGb": 0, "systemDiskGb": 100})
    assert schedule.disk_bound_mbyte_s(system) == 42.5 < schedule.constant("tuned-pull")


def test_the_tuned_pull_on_a_small_disk_takes_longer_and_the_stock_pull_does_not_move() -> None:
    records, small = config_of({"dataDiskGb": 0, "systemDiskGb": 100})
    _, auto = config_of({"dataDiskCategory": "cloud_auto"})
    on_disk = schedule.first_step(small, records, "in-region", 64, 64, schedule.OPTIONS_ON_STACK_DISK)
    burst = schedule.first_step(small, records, "in-region", 64, 64, schedule.OPTIONS)
    # 25 GB at 42.5 MB/s (9.8 min) instead of 50 MB/s (8.3 min).
    assert on_disk.step_minutes("node-0/pull-image") == pytest.approx(25 * 1000 / 42.5 / 60)
    assert burst.step_minutes("node-0/pull-image") == pytest.approx(25 * 1000 / 50 / 60)
    assert on_disk.total - burst.total == pytest.approx(25 * 1000 / 42.5 / 60 - 25 * 1000 / 50 / 60, abs=0.01)
    # The stack's own AutoPL disk with burst lifts the cap as the option does.
    assert schedule.first_step(auto, records, "in-region", 64, 64, schedule.OPTIONS_ON_STACK_DISK).total == (
        pytest.approx(burst.total))
    # A stock pull (35 MB/s) is under the PL1 disk's 55 MB/s: the class does not move it.
    _, pl1 = config_of({})
    assert schedule.first_step(pl1, records, "in-region", 2, 2).total == pytest.approx(
        schedule.first_step(auto, records, "in-region", 2, 2).total)


def test_the_plan_prints_figures_for_built_paths_only(capsys: Any) -> None:
    assert plan.main(["--full", "multi", "--parallel", "64"]) == 0
    text = capsys.readouterr().out
    timing = text.split("== Time to the first training step", 1)[1].split("\n== ", 1)[0]
    # No row credits P2P, a maintained base image, tuned pulls or snapshot prefetch: none is built.
    for unbuilt in ("P2P", "options", "tuned pull", "snapshot prefetch)", "base image"):
        rows = [line for line in timing.splitlines() if "minutes" not in line and unbuilt in line
                and "not built" not in line and not line.startswith("    ")]
        assert not rows, (unbuilt, rows)
    assert "modelled options that are not built: docs/performance.md, 'Modelled options, not built'" in timing
    assert "warm, resumed after an economical-mode stop (nodes.paused)" in timing
