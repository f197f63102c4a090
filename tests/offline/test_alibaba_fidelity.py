"""Alibaba Cloud fidelity (issue 9, points 4-7 and 9): sticky placement across runs, regions and zones, the price,
the NAS, and the strict offline cloud refusing what Alibaba refuses."""

from __future__ import annotations

import pytest
from offline_helpers import INSTANCE, RULE, env_of, run, step_command

from devtools import plan
from devtools.offline_cloud import CloudRefusal, OfflineCloud, Registered, _digest
from infra.config import ConfigError
from infra.sources.alibaba import catalog
from infra.sources.alibaba.placement import PlacementError

SWITCH = "alicloud:vpc/switch:Switch"
FILE_SYSTEM = "alicloud:nas/fileSystem:FileSystem"
MOUNT_TARGET = "alicloud:nas/mountTarget:MountTarget"
STACKS = ["dev", "large", "multi", "openrlhf", "verl"]


# ------------------------------------------------------------------------------------------- 4. sticky placement
@pytest.mark.parametrize("stack", STACKS)
def test_an_existing_cluster_updates_when_its_type_has_no_stock_left_anywhere(stack):
    first_cloud = OfflineCloud()
    first = run(stack, cloud=first_cloud)
    # Later: no GPU type has stock anywhere in the region.
    later = first_cloud.next_run(stock={})
    second = run(stack, cloud=later)

    assert later.changed_nodes() == {}
    assert {name: change for name, change in later.changes.items() if change != "same"} == {}
    for key in ("zone", "instanceType", "gpuModel", "gpus", "jobId", "nodes"):
        assert second.outputs[key] == first.outputs[key], key
    # The price is still the running type's; sold-out types are missing from the live answer, so it is the
    # catalog's estimate now, and says so.
    assert second.outputs["hourlyPrice"]["amount"] == first.outputs["hourlyPrice"]["amount"]
    assert second.outputs["hourlyPrice"]["basis"].startswith("estimate")
    # No stock look-up was made for the existing cluster.
    assert not [token for token, _ in later.invokes if token == "alicloud:index/getZones:getZones"]
    assert later.changes["network-vswitch"] == "same"


def test_facts_and_price_come_from_the_running_type_not_from_todays_first_choice():
    prices = {"ecs.gn6v-c8g1.4xlarge": 50.0, "ecs.gn6e-c12g1.6xlarge": 70.0}
    first_cloud = OfflineCloud(stock={"ecs.gn6v": ["cn-hangzhou-i"], "ecs.gn6e": ["cn-hangzhou-i"]}, prices=prices)
    first = run("multi", cloud=first_cloud)
    assert first.outputs["instanceType"] == "ecs.gn6v-c8g1.4xlarge"
    # The first type sold out; the second has stock in another zone. A third node joins.
    later = first_cloud.next_run(stock={"ecs.gn6v": [], "ecs.gn6e": ["cn-hangzhou-k"]})
    with pytest.raises(PlacementError, match=r"roll-cluster:nodes\.count: the cluster runs 2 nodes of ecs\.gn6v"):
        # A new node of a sold-out type cannot be created: said before anything is touched.
        run("multi", cloud=later, config={"roll-cluster:nodes": {"count": 3}})
    assert later.resources == []
    second = run("multi", cloud=later)
    assert second.outputs["zone"] == "cn-hangzhou-i"
    assert second.outputs["instanceType"] == "ecs.gn6v-c8g1.4xlarge"
    # The running type's price (sold out, so the catalog's estimate for it), never the second type's 2 x 70.
    assert second.outputs["hourlyPrice"]["amount"] == round(2 * catalog.estimated_price("ecs.gn6v-c8g1.4xlarge"), 2)
    assert {r.inputs["instanceType"] for r in later.of_type(INSTANCE)} == {"ecs.gn6v-c8g1.4xlarge"}
    assert later.changed_nodes() == {}


def test_the_plan_says_the_placement_was_kept_without_a_stock_look_up(capsys):
    first_cloud = OfflineCloud()
    run("dev", cloud=first_cloud)
    later = first_cloud.next_run(stock={})
    from devtools.offline_cloud import run_program

    text = plan.plan_text(run_program("dev", cloud=later))
    assert "kept: the cluster exists in cn-hangzhou-i with ecs.gn6v-c8g1.2xlarge" in text
    assert "no stock look-up" in text


def test_a_fallback_list_mixing_bf16_and_fp16_gpus_is_refused_naming_the_key():
    cloud = OfflineCloud()
    with pytest.raises(ConfigError) as error:
        run("dev", cloud=cloud, config={"roll-cluster:nodes": {
            "instanceTypes": ["ecs.gn6v-c8g1.2xlarge", "ecs.gn7i-c8g1.2xlarge"]}})
    message = str(error.value)
    assert "roll-cluster:nodes.instanceTypes" in message and "bf16" in message
    assert "ecs.gn6v-c8g1.2xlarge (no bf16)" in message and "ecs.gn7i-c8g1.2xlarge (bf16)" in message
    assert cloud.invokes == []


def test_moving_a_cluster_on_purpose_replaces_its_vswitch_beside_the_old_one():
    first_cloud = OfflineCloud(stock={"ecs.gn6v": ["cn-hangzhou-i"]})
    first = run("multi", cloud=first_cloud)
    later = first_cloud.next_run(stock={"ecs.gn6v": ["cn-hangzhou-k"]})
    moved = run("multi", cloud=later, config={"roll-cluster:nodes": {"placementGeneration": 1}})

    assert first.outputs["zone"] == "cn-hangzhou-i" and moved.outputs["zone"] == "cn-hangzhou-k"
    vswitch = later.named("network-vswitch")
    assert vswitch.inputs["cidrBlock"] == "10.20.16.0/20"  # the other CIDR: no overlap with the old vSwitch
    assert later.changes["network-vswitch"] == "replace"
    assert later.changed_nodes() == {"node-0-instance": "replace", "node-1-instance": "replace"}
    assert later.changes["shared-mount"] == "replace" and later.changes["shared-fs"] == "same"
    assert later.named("shared-access-rule").inputs["sourceCidrIp"] == "10.20.16.0/20"
    # Running the same generation again keeps the moved cluster.
    again = later.next_run(stock={})
    run("multi", cloud=again, config={"roll-cluster:nodes": {"placementGeneration": 1}})
    assert again.changed_nodes() == {}


def test_a_replacement_with_the_same_cidr_is_refused_like_alibaba_refuses_it():
    first_cloud = OfflineCloud(stock={"ecs.gn6v": ["cn-hangzhou-i"]})
    run("dev", cloud=first_cloud)
    later = first_cloud.next_run(stock={"ecs.gn6v": ["cn-hangzhou-k"]})
    # Generation 2 has the CIDR of generation 0: only delete-before-replace could make room, so it is refused.
    with pytest.raises(CloudRefusal, match=r"InvalidCidrBlock\.Overlapped"):
        run("dev", cloud=later, config={"roll-cluster:nodes": {"placementGeneration": 2}})


# -------------------------------------------------------------------------------------------- 5. regions and zones
@pytest.mark.parametrize(("region", "zone", "types"), [
    ("ap-southeast-1", "ap-southeast-1c", ["ecs.gn8is-8x.32xlarge"]),
    ("cn-wulanchabu", "cn-wulanchabu-a", ["ecs.gn8v-8x.48xlarge"]),
    ("cn-hangzhou", "cn-hangzhou-i", ["ecs.gn7i-8x.32xlarge"]),
])
def test_zone_ids_of_every_region_format_are_accepted(region, zone, types):
    result = run("verl", replace_config={"alicloud:region": region},
                 config={"roll-cluster:nodes": {"zone": zone, "instanceTypes": types}})
    assert result.outputs["zone"] == zone


def test_an_unknown_region_is_reported_as_unknown_not_as_no_stock():
    cloud = OfflineCloud()
    with pytest.raises(ConfigError) as error:
        run("dev", cloud=cloud, replace_config={"alicloud:region": "cn-hangzou"})
    message = str(error.value)
    assert "alicloud:region: unknown region (did you mean `cn-hangzhou`?)" in message
    assert "stock" not in message and cloud.invokes == []


@pytest.mark.parametrize(("zone", "example"), [
    ("ap-southeast-1-a", "ap-southeast-1a"), ("cn-beijing-a", "cn-hangzhou-k"), ("cn-hangzhoua", "cn-hangzhou-k"),
])
def test_a_zone_of_another_region_or_format_names_the_key_and_an_example(zone, example):
    with pytest.raises(ConfigError) as error:
        region = "ap-southeast-1" if zone.startswith("ap-") else "cn-hangzhou"
        run("dev", replace_config={"alicloud:region": region}, config={"roll-cluster:nodes": {"zone": zone}})
    assert "roll-cluster:nodes.zone" in str(error.value) and example in str(error.value)


# --------------------------------------------------------------------------------------------------------- 6. price
@pytest.mark.parametrize("stack", STACKS)
def test_every_shipped_stack_reports_a_price_with_currency_and_what_it_covers(stack, capsys):
    result = run(stack)
    price = result.outputs["hourlyPrice"]
    assert price["amount"] > 0 and price["currency"] == "CNY" and price["per"] == "hour"
    assert "instances only" in price["includes"] and "disks, NAS, public traffic" in price["excludes"]
    assert plan.main(["--full", stack]) == 0
    text = capsys.readouterr().out
    assert f"{price['amount']:.2f} CNY per hour: instances only" in text
    assert "not included: disks, NAS, public traffic" in text


def test_the_live_price_is_asked_for_with_sorted_by_price_and_the_currency_is_the_accounts():
    cloud = OfflineCloud(prices={"ecs.gn6v-c8g1.2xlarge": 30.5}, currency="USD")
    out = run("dev", cloud=cloud).outputs["hourlyPrice"]
    assert out["amount"] == 30.5 and out["currency"] == "USD" and out["basis"].startswith("live")
    queries = [a for token, a in cloud.invokes if token == "alicloud:ecs/getInstanceTypes:getInstanceTypes"]
    # The price is asked for with sorted_by="Price" (the only way the data source fills it); the stock without
    # (the price needs billing permission, which placement must not depend on).
    assert [q for q in queries if q.get("sortedBy") == "Price"]
    assert [q for q in queries if "sortedBy" not in q and q.get("spotStrategy")]


def test_without_cloud_control_the_currency_is_said_to_be_assumed():
    out = run("dev", cloud=OfflineCloud(currency=None)).outputs["hourlyPrice"]
    assert out["currency"] == "CNY" and "currency assumed" in out["basis"]


def test_spot_prices_are_shown_as_their_ceiling():
    market = run("dev", config={"roll-cluster:nodes": {"spot": True}}).outputs["hourlyPrice"]
    assert market["amount"] > 0 and market["basis"].startswith("spot: at most the pay-as-you-go price")
    capped = run("dev", config={"roll-cluster:nodes": {"spotPriceLimit": 9.5}}).outputs["hourlyPrice"]
    assert capped["amount"] == 9.5 and "spotPriceLimit" in capped["basis"]


# ---------------------------------------------------------------------------------------------------------- 7. NAS
def test_the_nas_is_created_in_the_nodes_zone_and_its_id_is_an_output():
    result = run("multi")
    fs = result.cloud.of_type(FILE_SYSTEM)[0]
    assert fs.inputs["zoneId"] == result.outputs["zone"]
    assert result.outputs["nasFileSystemId"] == fs.id
    assert "zoneId" in (result.cloud.options[fs.name].ignore_changes or [])  # a moved cluster keeps its data


def test_the_access_rule_exists_before_the_mount_target_and_so_before_any_mount():
    result = run("multi")
    options = result.cloud.options["shared-mount"]
    assert [d._name for d in options.depends_on] == ["shared-access-rule"]  # type: ignore[attr-defined]
    domain = result.cloud.named("shared-mount").outputs["mountTargetDomain"]
    assert env_of(step_command(result, "node-0-prepare-host"))["NAS_SERVER"] == domain


def test_an_existing_file_system_is_attached_not_created_and_survives_a_destroy():
    first = run("multi")
    kept = first.outputs["nasFileSystemId"]
    assert first.cloud.options["shared-fs"].retain_on_delete is True
    # `pulumi destroy` deletes everything but the retained file system; the next `up` attaches it.
    cloud = OfflineCloud(external_file_systems={kept: first.outputs["zone"]})
    result = run("multi", cloud=cloud, config={"roll-cluster:storage": {"existingFileSystemId": kept}})
    assert cloud.of_type(FILE_SYSTEM) == []
    assert result.outputs["nasFileSystemId"] == kept
    assert cloud.named("shared-mount").inputs["fileSystemId"] == kept
    assert cloud.of_type("alicloud:nas/accessRule:AccessRule")


def test_existing_file_system_id_is_validated_naming_the_key():
    with pytest.raises(ConfigError, match=r"roll-cluster:storage\.existingFileSystemId: must be the id of a General"):
        run("multi", config={"roll-cluster:storage": {"existingFileSystemId": "extreme-0015ab"}})
    with pytest.raises(ConfigError, match=r"roll-cluster:storage\.nas: must not be set with nas: false"):
        run("multi", config={"roll-cluster:storage": {"nas": False, "existingFileSystemId": "31a8e4b0c2"}})


def test_a_changed_nas_recreates_the_container_on_the_new_mount():
    result = run("multi")
    labels = result.cloud.named("node-0-container").inputs["labels"]
    domain = result.cloud.named("shared-mount").outputs["mountTargetDomain"]
    assert {"label": "roll-cluster.shared-storage", "value": domain} in labels
    # Same container name: the old container must go before the new one starts.
    assert result.cloud.options["node-0-container"].delete_before_replace is True


def test_the_dev_plan_says_its_checkpoints_survive_destroy_and_die_with_the_instance_only_when_opted_out(capsys):
    assert plan.main(["--full", "dev"]) == 0
    text = capsys.readouterr().out
    assert "checkpoints on the NAS at /mnt/shared: they survive pulumi destroy" in text
    opted_out = run("dev", config={"roll-cluster:storage": {"retainOnDestroy": False}})
    assert "of each node (storage.retainOnDestroy: false): they DIE WITH THE INSTANCE" in opted_out.notes["checkpoints"]


# ----------------------------------------------------------------------------------------- 9. strict offline cloud
def _vpc_id() -> str:
    return "vpc-bp1" + _digest("alicloud:vpc/network:Network" + "network-vpc", 17)


def test_the_offline_cloud_refuses_an_overlapping_vswitch_in_the_same_vpc():
    other = {"vpcId": _vpc_id(), "cidrBlock": "10.20.8.0/24", "zoneId": "cn-hangzhou-i", "vswitchName": "x"}
    prior = [Registered(SWITCH, "someone-else", "vsw-x", other, {**other, "tags": {}}, True, None)]
    with pytest.raises(CloudRefusal, match=r"InvalidCidrBlock\.Overlapped"):
        run("dev", cloud=OfflineCloud(prior=prior))


def test_the_offline_cloud_refuses_an_instance_type_without_stock_in_the_vswitch_zone():
    cloud = OfflineCloud()
    original = cloud.zones_with_stock
    # Stock vanishes between the plan-time look-up and the creation of the instance.
    calls = {"n": 0}

    def vanishing(type_name, region):
        calls["n"] += 1
        return original(type_name, region) if calls["n"] <= 1 else []

    cloud.zones_with_stock = vanishing  # type: ignore[method-assign]
    with pytest.raises(CloudRefusal, match=r"OperationDenied\.NoStock"):
        run("dev", cloud=cloud)


def test_the_offline_cloud_refuses_duplicate_security_group_rules():
    with pytest.raises(CloudRefusal, match="duplicate security group rule"):
        run("dev", config={"roll-cluster:access": {"adminCidrs": ["203.0.113.0/24", "198.51.100.0/24"]}},
            cloud=_duplicating_cloud())


def _duplicating_cloud() -> OfflineCloud:
    """A cloud that sees the second admin CIDR's rule as the first one's (as if the program declared it twice)."""
    cloud = OfflineCloud()
    original = cloud.new_resource

    def twice(args):  # type: ignore[no-untyped-def]
        if args.typ == RULE and args.inputs.get("cidrIp") == "198.51.100.0/24":
            args.inputs["cidrIp"] = "203.0.113.0/24"
        return original(args)

    cloud.new_resource = twice  # type: ignore[method-assign]
    return cloud


def test_the_offline_cloud_refuses_unknown_zones_and_regions_in_its_answers():
    cloud = OfflineCloud()
    import pulumi
    from pulumi.runtime import MockCallArgs
    pulumi.runtime.set_all_config({"alicloud:region": "cn-hangzhou"})
    answer = cloud.call(MockCallArgs("alicloud:ecs/getInstanceTypes:getInstanceTypes",
                                     {"instanceType": "ecs.gn6v-c8g1.2xlarge", "availabilityZone": "cn-hangzhou-z"},
                                     ""))
    assert isinstance(answer, tuple) and "not available in the region" in answer[1][0][1]
    pulumi.runtime.set_all_config({"alicloud:region": "xx-nowhere-1"})
    answer = cloud.call(MockCallArgs("alicloud:index/getZones:getZones", {}, ""))
    assert isinstance(answer, tuple) and "InvalidRegionId.NotFound" in answer[1][0][1]


def test_the_instance_types_answer_has_a_price_only_when_sorted_by_price():
    cloud = OfflineCloud()
    import pulumi
    from pulumi.runtime import MockCallArgs
    pulumi.runtime.set_all_config({"alicloud:region": "cn-hangzhou"})
    token = "alicloud:ecs/getInstanceTypes:getInstanceTypes"
    plain = cloud.call(MockCallArgs(token, {"instanceType": "ecs.gn6v-c8g1.2xlarge"}, ""))
    priced = cloud.call(MockCallArgs(token, {"instanceType": "ecs.gn6v-c8g1.2xlarge", "sortedBy": "Price"}, ""))
    assert plain["instanceTypes"][0]["price"] == "" and float(priced["instanceTypes"][0]["price"]) > 0


def test_placement_errors_still_come_before_any_resource():
    cloud = OfflineCloud(stock={})
    with pytest.raises(PlacementError):
        run("dev", cloud=cloud)
    assert [r for r in cloud.resources if r.custom] == []


def test_the_plan_of_a_stack_that_attaches_a_kept_file_system(monkeypatch, capsys):
    import devtools.offline_cloud

    original = devtools.offline_cloud.stack_config

    def attaching(stack):  # type: ignore[no-untyped-def]
        values = original(stack)
        values["roll-cluster:storage"] = {"existingFileSystemId": "31a8e4b0c2"}
        return values

    monkeypatch.setattr(devtools.offline_cloud, "stack_config", attaching)
    monkeypatch.setattr(plan, "stack_config", attaching)
    assert plan.main(["--full", "multi"]) == 0
    text = capsys.readouterr().out
    assert "NAS 31a8e4b0c2 (existing, attached: never created or deleted here)" in text
    assert "nasFileSystemId  31a8e4b0c2" in text


def test_an_existing_cluster_grows_with_its_own_type_in_its_own_zone():
    first_cloud = OfflineCloud(stock={"ecs.gn6v": ["cn-hangzhou-i"]})
    run("multi", cloud=first_cloud)
    # The first choice would now be zone k, but the cluster lives in zone i, where its type still has stock.
    later = first_cloud.next_run(stock={"ecs.gn6v": ["cn-hangzhou-i", "cn-hangzhou-b"]})
    # 48 rollouts divide over Megatron's 6 data-parallel ranks (ROLL refuses the demo's 64 on 6 GPUs).
    fits = {"roll-cluster:training": {"overrides": {"rollout_batch_size": 48}}}
    grown = run("multi", cloud=later, config={"roll-cluster:nodes": {"count": 3}, **fits})
    assert later.changed_nodes() == {"node-2-instance": "create"}
    assert grown.outputs["zone"] == "cn-hangzhou-i"
    assert {r.inputs["instanceType"] for r in later.of_type(INSTANCE)} == {"ecs.gn6v-c8g1.4xlarge"}
