"""Fast nodes (issue 13): baking an image of the head (nodes.bake), booting from it (nodes.image), the image's path
(public IP or the VPC) and the modelled time to a running job on each path, as the plan prints it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from offline_helpers import INSTANCE, env_of, run, step_command
from script_harness import FakeNode

from devtools import plan
from devtools.offline_cloud import OfflineCloud, unwrap
from devtools.schedule import configured_path, profiles, schedule
from infra.config import ConfigError, parse_cluster_config
from infra.node import steps
from infra.sources.alibaba.placement import PlacementError

IMAGE_RESOURCE = "alicloud:ecs/image:Image"
BAKED_ID = "m-bp1g7004ksh0oeuc6v1h"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test"


def config_problems(nodes: dict[str, Any] | None = None, container: dict[str, Any] | None = None) -> list[str]:
    raw = {
        "nodes": json.dumps({"instanceTypes": ["ecs.gn6v-c8g1.2xlarge"], **(nodes or {})}),
        "access": json.dumps({"adminCidrs": ["203.0.113.0/24"], "sshPublicKey": KEY}),
        "container": json.dumps(container or {}),
    }
    with pytest.raises(ConfigError) as caught:
        parse_cluster_config(raw, "cn-hangzhou")
    return caught.value.problems


# ------------------------------------------------------------------------------------------------ configuration
@pytest.mark.parametrize(
    ("nodes", "container", "key", "words"),
    [
        ({"image": "ubuntu_22_04_x64"}, None, "nodes.image", ("ECS image id", "m-bp1", 'got "ubuntu_22_04_x64"')),
        ({"image": "m-"}, None, "nodes.image", ("ECS image id", 'got "m-"')),
        ({"bake": "maybe"}, None, "nodes.bake", ("true or false", 'got "maybe"')),
        (None, {"image": "registry-vpc.cn-beijing.aliyuncs.com/me/roll:v1"}, "container.image",
         ("VPC endpoint of a registry in cn-beijing", "alicloud:region cn-hangzhou", "registry-vpc.cn-hangzhou")),
        ({"bake": True}, {"image": "registry.cn-hangzhou.aliyuncs.com/me/roll@sha256:" + "a" * 64},
         "container.image", ("must be a tag", "nodes.bake: true")),
        (None, {"imageSizeGb": 0}, "container.imageSizeGb", ("greater than 0", "got 0")),
    ],
)
def test_bad_fast_node_settings_are_rejected_at_their_key(
    nodes: dict[str, Any] | None, container: dict[str, Any] | None, key: str, words: tuple[str, ...]
) -> None:
    found = config_problems(nodes, container)
    assert len(found) == 1, found
    assert found[0].startswith(f"roll-cluster:{key}: "), found
    for word in words:
        assert word in found[0], (word, found[0])


# ------------------------------------------------------------------------------------------------------ baking
def test_bake_images_the_head_after_its_bootstrap_keeps_the_image_on_destroy_and_exports_its_id() -> None:
    cloud = OfflineCloud()
    result = run("multi", cloud=cloud, config={"roll-cluster:nodes": {"bake": True}})

    images = cloud.of_type(IMAGE_RESOURCE)
    assert len(images) == 1  # the head only
    image = images[0]
    head_id = result.outputs["nodes"][0]["instanceId"]
    assert image.inputs["instanceId"] == head_id
    assert image.inputs["imageName"] == f"roll-cluster-multi-{head_id}"
    options = cloud.options[image.name]
    assert options.retain_on_delete is True  # pulumi destroy leaves it for the stacks that boot from it
    assert options.custom_timeouts is not None and options.custom_timeouts.create == "60m"
    assert result.outputs["bakedImageId"] == image.id and image.id.startswith("m-")

    by_key = {r.key: r for r in result.steps}
    assert by_key["node-0/bake-prep"].depends_on == ("node-0/gpu-ready",)
    assert by_key["node-0/bake-prep"].scripts == ("bake_container.sh", "fetch_code.sh", "bake_finish.sh")
    assert by_key["node-0/bake-image"].depends_on == ("node-0/bake-prep",)
    # The container comes after the image: no node booted from it finds this node's container.
    assert "node-0/bake-image" in by_key["node-0/container"].depends_on
    assert "node-1/bake-prep" not in by_key  # workers are not baked and do not wait for the image
    assert by_key["node-1/container"].depends_on == ("node-1/gpu-ready", "node-1/image")
    env = env_of(step_command(result, "node-0-bake-prep"))
    assert env["CONTAINER_NAME"] == env["BAKE_CONTAINER"] == "roll-cluster-bake"
    assert env["IMAGE"] == "roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-24.05-py3-torch260-vllm084"


def test_without_bake_there_is_no_image_and_no_baked_image_id() -> None:
    cloud = OfflineCloud()
    result = run("multi", cloud=cloud)
    assert cloud.of_type(IMAGE_RESOURCE) == []
    assert "bakedImageId" not in result.outputs
    assert not any(r.step.startswith("bake") for r in result.steps)


def test_bake_prep_commits_the_requirements_into_the_image_and_a_second_run_changes_nothing(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.set_state("systemd/docker.active", "")
    image = "registry.example.test/me/roll:v1"
    node.set_state(f"docker/images/{image.replace('/', '_')}", "sha256:original\n")
    env = {"IMAGE": image, "WORKSPACE_HOST_DIR": str(tmp_path / "workspace"), "ROLL_STATE_DIR": str(node.roll_state)}

    first = node.run_step("bake-prep", ["bake_container.sh", "bake_finish.sh"], **env)

    assert first.returncode == 0, str(first)
    committed = (node.state / "docker" / "images" / image.replace("/", "_")).read_text()
    assert committed != "sha256:original\n"
    assert not (node.state / "docker" / "containers" / "roll-cluster-bake").exists()  # not in the baked image
    assert "committed the framework's requirements" in first.stdout and "disks flushed" in first.stdout

    again = node.run_step("bake-prep", ["bake_finish.sh"], **env)
    assert again.returncode == 0, str(again)
    assert "no framework requirements to commit; skipped" in again.stdout


# --------------------------------------------------------------------------------------- booting from an image
def test_nodes_image_boots_every_node_from_it_with_the_data_disk_from_its_snapshot() -> None:
    cloud = OfflineCloud()
    result = run("multi", cloud=cloud, config={"roll-cluster:nodes": {"image": BAKED_ID}})

    for instance in cloud.of_type(INSTANCE):
        assert instance.inputs["imageId"] == BAKED_ID
        (disk,) = unwrap(instance.inputs["dataDisks"])
        assert disk["snapshotId"].startswith("s-") and disk["size"] == 200
    lookups = [args for token, args in cloud.invokes if token == "alicloud:ecs/getImages:getImages"]
    # With an owner: the provider refuses a look-up without one of name_regex, owners, image_owner_id
    # (TF data_source_alicloud_images.go:29).
    assert lookups and all(args.get("imageId") == BAKED_ID and args.get("owners") == "self" for args in lookups)
    assert "bakedImageId" not in result.outputs


def test_a_missing_custom_image_stops_before_any_resource() -> None:
    cloud = OfflineCloud(missing_images={BAKED_ID})
    with pytest.raises(PlacementError, match=f"roll-cluster:nodes.image: no image {BAKED_ID} in cn-hangzhou"):
        run("multi", cloud=cloud, config={"roll-cluster:nodes": {"image": BAKED_ID}})
    assert cloud.of_type(INSTANCE) == []


def test_a_baked_image_with_a_data_disk_needs_one_on_the_nodes() -> None:
    cloud = OfflineCloud()
    with pytest.raises(PlacementError, match=r"roll-cluster:nodes\.dataDiskGb: the image .* carries a 200 GB data"):
        run("multi", cloud=cloud, config={"roll-cluster:nodes": {"image": BAKED_ID, "dataDiskGb": 0}})
    assert cloud.of_type(INSTANCE) == []


# ------------------------------------------------------------------------------------ time to a running job
def totals(stack: str, count: int, **nodes: Any) -> dict[str, float]:
    # 128 rollouts divide over Megatron's data-parallel ranks at every size here (ROLL refuses the demo's 64 on
    # 128 GPUs); the schedule does not depend on it.
    fits = {"roll-cluster:training": {"overrides": {"rollout_batch_size": 128}}}
    result = run(stack, config={"roll-cluster:nodes": {"count": count, **nodes}, **fits})
    config = steps.NOTES["config"]
    return {name: schedule(result.steps, profile).total for name, profile in profiles(config).items()}


def test_the_baked_path_of_the_multi_stack_takes_at_most_6_minutes_flat_from_1_to_64_nodes() -> None:
    by_count = {count: totals("multi", count) for count in (1, 8, 64)}
    for count, paths in by_count.items():
        assert paths["baked"] <= 6.0, (count, paths)
        assert paths["baked"] < paths["in-region"] < paths["new"], (count, paths)
    assert by_count[8]["baked"] == by_count[64]["baked"]
    assert by_count[64]["baked"] - by_count[1]["baked"] < 0.5  # one node has no worker to join


def test_the_model_uses_the_image_size_and_the_node_bandwidth() -> None:
    base = totals("multi", 2)
    half_bandwidth = totals("multi", 2, internetBandwidthMbps=50)
    result = run("multi", config={"roll-cluster:container": {"imageSizeGb": 50}})
    bigger = {n: schedule(result.steps, p).total for n, p in profiles(steps.NOTES["config"]).items()}
    # 25 GB over 100 Mbit/s is 33.3 min; at 50 Mbit/s twice that, and so is 50 GB at 100 Mbit/s.
    assert half_bandwidth["new"] - base["new"] == pytest.approx(33.3, abs=0.1)
    assert bigger["new"] - base["new"] == pytest.approx(33.3, abs=0.1)
    assert half_bandwidth["baked"] == base["baked"]  # nothing is pulled on a baked node


def test_the_plan_prints_each_path_with_its_critical_path_and_warns_about_the_public_pull(capsys) -> None:
    assert plan.main(["multi"]) == 0
    text = capsys.readouterr().out
    assert "== Time to a running job" in text
    for label in ("new cluster, image as configured", "image in your registry in the region (VPC)",
                  "baked image (nodes.image)"):
        line = next(line for line in text.splitlines() if label in line)
        assert " min" in line
    assert text.count("critical path: boot 2 -> ") == 3
    assert "node-0/pull-image 33.3" in text  # today's path: the pull dominates
    assert "WARNING  the 25 GB image comes over each node's public IP at 100 Mbit/s" in text
    assert "registry-vpc.cn-hangzhou.aliyuncs.com/<namespace>/<repo>:<tag>" in text
    for step in ("driver", "prepare-host", "docker", "pull-image", "gpu-ready", "code"):
        assert any(line.startswith(f"    {step} ") for line in text.splitlines()), step


def test_an_image_in_the_regions_registry_comes_over_the_vpc_without_a_warning(capsys) -> None:
    vpc_image = "registry-vpc.cn-hangzhou.aliyuncs.com/me/pytorch:nvcr-24.05-py3-torch260-vllm084"
    result = run("multi", config={"roll-cluster:container": {"image": vpc_image}})
    assert configured_path(steps.NOTES["config"]) == "in-region"
    text = plan.render(result)
    assert "25 GB from registry-vpc.cn-hangzhou.aliyuncs.com over the VPC" in text
    assert "  WARNING  " not in text
    assert "<- this stack" in next(line for line in text.splitlines() if "(VPC)" in line)


def test_a_registry_outside_china_in_a_mainland_region_is_warned_about() -> None:
    # Docker Hub itself is refused there without container.registryMirror (infra/config/cluster.py); other registries
    # abroad are allowed but warned about.
    abroad = "nvcr.io/nvidia/pytorch:nvcr-24.05-py3-torch260-vllm084"
    result = run("multi", config={"roll-cluster:container": {"image": abroad}})
    text = plan.render(result)
    assert "nvcr.io is outside China" in text
