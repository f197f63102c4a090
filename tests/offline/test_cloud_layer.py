"""The Alibaba Cloud layer under the offline cloud: placement by stock, sticky placement, the hardened security
group, nodes (disks, spot, key pair, tags), NAS kept on destroy, and the price."""

from __future__ import annotations

import base64

import pytest
from offline_helpers import INSTANCE, RULE, custom_resources, env_of, run, step_command

from devtools import plan
from devtools.offline_cloud import OfflineCloud
from infra.config import ConfigError
from infra.sources.alibaba.placement import PlacementError


def test_first_type_with_stock_wins_and_second_type_is_the_fallback():
    first = run("dev")
    assert first.outputs["instanceType"] == "ecs.gn6v-c8g1.2xlarge"
    no_v100_16 = OfflineCloud(stock={"ecs.gn6v": [], "ecs.gn6e": ["cn-hangzhou-i"]})
    fallback = run("dev", cloud=no_v100_16)
    assert fallback.outputs["instanceType"] == "ecs.gn6e-c12g1.3xlarge"
    assert fallback.outputs["zone"] == "cn-hangzhou-i"
    instance = no_v100_16.of_type(INSTANCE)[0]
    assert instance.inputs["instanceType"] == "ecs.gn6e-c12g1.3xlarge"


def test_pinned_zone_is_honoured_even_when_another_zone_sorts_first():
    result = run("dev", config={"roll-cluster:nodes": {"zone": "cn-hangzhou-k"}})
    assert result.outputs["zone"] == "cn-hangzhou-k"
    vswitch = result.cloud.of_type("alicloud:vpc/switch:Switch")[0]
    assert vswitch.inputs["zoneId"] == "cn-hangzhou-k"


def test_no_stock_stops_before_any_resource_with_what_was_tried_and_what_to_do():
    cloud = OfflineCloud(stock={})
    with pytest.raises(PlacementError) as error:
        run("dev", cloud=cloud)
    message = str(error.value)
    assert "ecs.gn6v-c8g1.2xlarge: no stock in any zone of cn-hangzhou" in message
    assert "ecs.gn6e-c12g1.3xlarge: no stock" in message
    assert "another region" in message and "spot" in message and "Nothing was created" in message
    assert custom_resources(cloud) == []


def test_pinned_zone_without_stock_names_the_zone():
    cloud = OfflineCloud()
    with pytest.raises(PlacementError, match="no stock in zone cn-hangzhou-b"):
        run("dev", cloud=cloud, config={"roll-cluster:nodes": {"zone": "cn-hangzhou-b"}})


def test_invalid_config_is_rejected_before_any_resource():
    cloud = OfflineCloud()
    with pytest.raises(ConfigError, match=r"roll-cluster:nodes\.count"):
        run("dev", cloud=cloud, config={"roll-cluster:nodes": {"count": 0}})
    assert custom_resources(cloud) == []
    assert cloud.invokes == []


def test_placement_is_sticky_when_stock_moves_after_the_cluster_exists():
    first_cloud = OfflineCloud(stock={"ecs.gn6v": ["cn-hangzhou-i"]})
    first = run("multi", cloud=first_cloud)
    # Later: the first type sold out in zone i, only zone k has the second type. The next `pulumi up` finds the
    # cluster's vSwitch (the offline cloud keeps the first run's resources as its state) and keeps zone and type.
    moved = first_cloud.next_run(stock={"ecs.gn6v": [], "ecs.gn6e": ["cn-hangzhou-k"]})
    second = run("multi", cloud=moved)
    assert second.outputs["zone"] == first.outputs["zone"] == "cn-hangzhou-i"
    assert second.outputs["instanceType"] == first.outputs["instanceType"] == "ecs.gn6v-c8g1.4xlarge"
    assert {r.inputs["instanceType"] for r in moved.of_type(INSTANCE)} == {"ecs.gn6v-c8g1.4xlarge"}
    assert moved.changed_nodes() == {}


def rules(result):
    return [r.inputs for r in result.cloud.of_type(RULE)]


def test_security_group_allows_members_everything_and_admins_only_ssh_in_tunnel_mode():
    result = run("dev")  # access.dashboard: tunnel
    found = {(r["ipProtocol"], r["portRange"], r.get("cidrIp") or "group") for r in rules(result)}
    assert found == {
        ("tcp", "1/65535", "group"),
        ("udp", "1/65535", "group"),
        ("tcp", "22/22", "203.0.113.0/24"),
    }
    group_rules = [r for r in rules(result) if "sourceSecurityGroupId" in r]
    assert all(r["sourceSecurityGroupId"] for r in group_rules) and len(group_rules) == 2
    assert all(r["type"] == "ingress" and r["policy"] == "accept" for r in rules(result))


def test_dashboard_rule_only_from_admin_cidrs_when_opted_in():
    access = {"adminCidrs": ["203.0.113.0/24", "198.51.100.0/24"], "dashboard": "admin-cidrs"}
    result = run("multi", config={"roll-cluster:access": access})
    found = {
        (r["portRange"], r.get("cidrIp") or r.get("ipv6CidrIp")) for r in rules(result) if r["portRange"] != "1/65535"
    }
    assert found == {
        ("22/22", "203.0.113.0/24"), ("8265/8265", "203.0.113.0/24"),
        ("22/22", "198.51.100.0/24"), ("8265/8265", "198.51.100.0/24"),
    }
    for stack in ("dev", "multi", "large", "verl", "openrlhf"):
        for rule in rules(run(stack)):
            assert rule.get("cidrIp") not in ("0.0.0.0/0",) and rule.get("ipv6CidrIp") != "::/0", (stack, rule)


def test_world_is_open_only_with_allow_world():
    with pytest.raises(ConfigError, match="allowWorld"):
        run("dev", config={"roll-cluster:access": {"adminCidrs": ["0.0.0.0/0"]}})
    opened = run("dev", config={"roll-cluster:access": {"adminCidrs": ["0.0.0.0/0"], "allowWorld": True}})
    assert ("22/22", "0.0.0.0/0") in {(r["portRange"], r.get("cidrIp")) for r in rules(opened)}


def test_custom_dashboard_port_is_the_one_opened():
    result = run("multi", config={"roll-cluster:ray": {"gcsPort": 8100, "dashboardPort": 8101, "clientPort": 8102},
                                  "roll-cluster:access": {"dashboard": "admin-cidrs"}})
    assert "8101/8101" in {r["portRange"] for r in rules(result)}
    assert "8265/8265" not in {r["portRange"] for r in rules(result)}


def test_nodes_have_essd_disks_public_ip_key_pair_tags_and_rank_host_names():
    # An RSA key (ImportKeyPair accepts it, unlike ed25519) also gets an ECS key pair.
    rsa = "ssh-rsa " + base64.b64encode(b"\x00\x00\x00\x07ssh-rsa" + bytes(64)).decode() + " alice"
    result = run("multi", config={"roll-cluster:access": {"sshPublicKey": rsa}})
    # The engine registers the instances concurrently, so their order is not the ranks' order.
    instances = sorted(result.cloud.of_type(INSTANCE), key=lambda i: i.inputs["hostName"])
    assert [i.inputs["hostName"] for i in instances] == ["roll-multi-0", "roll-multi-1"]
    assert [i.inputs["tags"]["roll-cluster-role"] for i in instances] == ["head", "worker"]
    assert [i.inputs["tags"]["roll-cluster-rank"] for i in instances] == ["0", "1"]
    key_pair = result.cloud.of_type("alicloud:ecs/ecsKeyPair:EcsKeyPair")[0]
    for instance in instances:
        inputs = instance.inputs
        assert inputs["systemDiskCategory"] == "cloud_essd" and inputs["systemDiskSize"] == 200
        assert inputs["dataDisks"] == [{"size": 200.0, "category": "cloud_essd", "name": inputs["hostName"] + "-data",
                                        "deleteWithInstance": True}]
        assert inputs["internetChargeType"] == "PayByTraffic" and inputs["internetMaxBandwidthOut"] == 100
        assert inputs["keyName"] == key_pair.inputs["keyPairName"]
        assert inputs["imageId"].startswith("m-") and inputs["spotStrategy"] == "NoSpot"
        assert "userData" in inputs
    assert key_pair.inputs["publicKey"] == rsa
    ips = [i.outputs["privateIp"] for i in instances]
    assert len(set(ips)) == 2 and all(ip.startswith("10.20.") for ip in ips)


def test_without_data_disk_docker_and_ray_stay_on_the_system_disk():
    result = run("multi", config={"roll-cluster:nodes": {"dataDiskGb": 0}})
    assert "dataDisks" not in result.cloud.of_type(INSTANCE)[0].inputs
    assert env_of(step_command(result, "node-0-docker"))["DOCKER_DATA_ROOT"] == ""
    assert env_of(step_command(result, "node-0-prepare-host"))["DATA_DISK_SERIAL"] == ""
    with_disk = run("multi")
    assert env_of(step_command(with_disk, "node-0-docker"))["DOCKER_DATA_ROOT"] == "/data/docker"
    # The disk is found by its identity (the disk id without d-), never by a device name such as /dev/vdb.
    instance = with_disk.cloud.named("node-0-instance")
    disk_id = with_disk.cloud._disks({"instanceId": instance.id, "type": "data"})["ids"][0]
    prepare = env_of(step_command(with_disk, "node-0-prepare-host"))
    assert prepare["DATA_DISK_SERIAL"] == disk_id.removeprefix("d-") and prepare["DATA_DISK_DEVICE"] == ""


def test_spot_options_reach_stock_queries_and_instances():
    cloud = OfflineCloud()
    run("dev", cloud=cloud, config={"roll-cluster:nodes": {"spotPriceLimit": 9.5, "spotHead": True}})
    instance = cloud.of_type(INSTANCE)[0].inputs
    assert instance["spotStrategy"] == "SpotWithPriceLimit" and instance["spotPriceLimit"] == 9.5
    stock_queries = [args for token, args in cloud.invokes
                     if token == "alicloud:ecs/getInstanceTypes:getInstanceTypes" and "sortedBy" not in args]
    assert stock_queries and all(q["spotStrategy"] == "SpotWithPriceLimit" for q in stock_queries)
    market = OfflineCloud()
    run("dev", cloud=market, config={"roll-cluster:nodes": {"spot": True, "spotHead": True}})
    assert market.of_type(INSTANCE)[0].inputs["spotStrategy"] == "SpotAsPriceGo"


def test_nas_is_kept_on_destroy_by_default_and_mounted_on_every_node():
    result = run("multi")
    fs = result.cloud.of_type("alicloud:nas/fileSystem:FileSystem")[0]
    assert result.cloud.options[fs.name].retain_on_delete is True
    domain = result.cloud.of_type("alicloud:nas/mountTarget:MountTarget")[0].outputs["mountTargetDomain"]
    assert domain.endswith(".cn-hangzhou.nas.aliyuncs.com")
    for node in ("node-0", "node-1"):
        assert env_of(step_command(result, f"{node}-prepare-host"))["NAS_SERVER"] == domain
    rule = result.cloud.of_type("alicloud:nas/accessRule:AccessRule")[0]
    assert rule.inputs["sourceCidrIp"] == "10.20.0.0/20"
    dropped = run("multi", config={"roll-cluster:storage": {"retainOnDestroy": False}})
    fs = dropped.cloud.of_type("alicloud:nas/fileSystem:FileSystem")[0]
    assert not dropped.cloud.options[fs.name].retain_on_delete


def test_a_single_node_stacks_checkpoints_survive_destroy_on_a_kept_nas_by_default(capsys):
    # Issue 27: dev sets nothing under storage; its checkpoints no longer sit on the data disk destroy deletes.
    result = run("dev")
    fs = result.cloud.of_type("alicloud:nas/fileSystem:FileSystem")[0]
    assert result.cloud.options[fs.name].retain_on_delete is True
    domain = result.cloud.of_type("alicloud:nas/mountTarget:MountTarget")[0].outputs["mountTargetDomain"]
    assert env_of(step_command(result, "node-0-prepare-host"))["NAS_SERVER"] == domain
    saves = result.notes["job_spec"].checkpoints
    assert saves.directory == "/mnt/shared/checkpoints/dev/roll" and saves.shared and saves.find
    assert result.outputs.get("nasFileSystemId")  # what storage.existingFileSystemId attaches again
    # The plan says where they survive.
    assert plan.main(["dev"]) == 0  # the default, short plan
    assert "checkpoints on the shared storage (/mnt/shared): they survive pulumi destroy" in capsys.readouterr().out
    assert plan.main(["--full", "dev"]) == 0
    text = capsys.readouterr().out
    assert "checkpoints on the NAS at /mnt/shared: they survive pulumi destroy (storage.retainOnDestroy" in text
    assert "to /mnt/shared/checkpoints/dev/roll (shared storage)" in text


@pytest.mark.parametrize("storage", [{"retainOnDestroy": False}, {"nas": False}])
def test_opting_out_keeps_checkpoints_on_the_node_and_the_plan_says_they_die(storage, capsys):
    result = run("dev", config={"roll-cluster:storage": storage})
    assert result.cloud.of_type("alicloud:nas/fileSystem:FileSystem") == []
    why = "storage.retainOnDestroy: false" if "retainOnDestroy" in storage else "storage.nas: false"
    assert result.notes["checkpoints"].startswith(f"checkpoints on the data disk (/data) of each node ({why}): they "
                                                 "DIE WITH THE INSTANCE on pulumi destroy")


def test_no_nas_means_no_file_system_and_no_mount():
    result = run("dev", config={"roll-cluster:storage": {"nas": False}})
    assert result.cloud.of_type("alicloud:nas/fileSystem:FileSystem") == []
    assert env_of(step_command(result, "node-0-prepare-host"))["NAS_SERVER"] == ""


def test_outputs_report_zone_type_nodes_gpus_and_hourly_price():
    cloud = OfflineCloud(prices={"ecs.gn6v-c8g1.4xlarge": 54.25})
    result = run("multi", cloud=cloud)
    out = result.outputs
    assert out["gpus"] == 4 and out["instanceType"] == "ecs.gn6v-c8g1.4xlarge"
    assert out["hourlyPrice"]["amount"] == 108.5 and out["hourlyPrice"]["currency"] == "CNY"
    assert [n["rank"] for n in out["nodes"]] == [0, 1]
    assert all(n["instanceId"].startswith("i-") and n["publicIp"] and n["privateIp"] for n in out["nodes"])


def test_live_gpu_count_wins_over_the_catalog(monkeypatch):
    cloud = OfflineCloud()
    original = cloud._instance_types

    def four_gpus(args):
        answer = original(args)
        for t in answer["instanceTypes"]:
            t["gpus"] = [{"amount": "2", "category": "NVIDIA V100"}]
        return answer

    monkeypatch.setattr(cloud, "_instance_types", four_gpus)
    assert run("dev", cloud=cloud).outputs["gpus"] == 2
