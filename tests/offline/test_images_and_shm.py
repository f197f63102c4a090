"""Issue 9, points 2 and 8 in the program: an explicit image for preinstalled drivers, nvidia-fabricmanager on
8-GPU NVSwitch types only, and /dev/shm sized on the host with Ray's object store refused when it cannot fit."""

from __future__ import annotations

import pytest
from offline_helpers import INSTANCE, custom_resources, env_of, run, step_command

from devtools.offline_cloud import OfflineCloud, reveal, unwrap
from infra.config import ConfigError
from infra.sources.alibaba.placement import PlacementError
from infra.sources.alibaba.user_data import decode_user_data


def first_boot_env(result, node: str = "node-0") -> str:  # type: ignore[no-untyped-def]
    return decode_user_data(str(reveal(result.cloud.named(f"{node}-instance").inputs["userData"])))


@pytest.mark.parametrize("owner", ["self", "others", "marketplace"])
def test_an_explicit_image_id_is_booted_whoever_owns_it(owner: str) -> None:
    cloud = OfflineCloud(image_owners={"m-bp1custom0driver550": (owner, "Available")})
    result = run("dev", cloud=cloud, config={"roll-cluster:nodes": {"image": "m-bp1custom0driver550",
                                                                     "gpuDriver": "preinstalled"}})

    assert cloud.of_type(INSTANCE)[0].inputs["imageId"] == "m-bp1custom0driver550"
    lookups = [args for token, args in cloud.invokes if token == "alicloud:ecs/getImages:getImages"]
    # Own, shared and Marketplace images alike; each look-up names an owner, which the provider requires
    # (TF data_source_alicloud_images.go AtLeastOneOf name_regex/owners/image_owner_id).
    # see verified-facts#test-images-and-shm-images
    assert lookups and all(args.get("owners") in ("self", "others", "marketplace") for args in lookups)
    assert any(args.get("owners") == owner for args in lookups)
    assert "export GPU_DRIVER=preinstalled" in first_boot_env(result)


def test_an_image_the_region_does_not_have_stops_before_any_resource() -> None:
    cloud = OfflineCloud(missing_images={"m-bp1elsewhere0000000"})
    with pytest.raises(PlacementError, match=r"roll-cluster:nodes\.image: no image m-bp1elsewhere0000000"):
        run("dev", cloud=cloud, config={"roll-cluster:nodes": {"image": "m-bp1elsewhere0000000"}})
    assert custom_resources(cloud) == []


@pytest.mark.parametrize("image", ["ubuntu_22_04", "m-short", "M-BP1ABCDEFGH"])
def test_an_image_that_is_not_an_ecs_image_id_is_refused(image: str) -> None:
    cloud = OfflineCloud()
    with pytest.raises(ConfigError, match=r"roll-cluster:nodes\.image: must be an ECS image id"):
        run("dev", cloud=cloud, config={"roll-cluster:nodes": {"image": image}})
    assert custom_resources(cloud) == []


@pytest.mark.parametrize(("stack", "nvswitch"), [("large", True), ("openrlhf", True), ("verl", False), ("dev", False)])
def test_fabric_manager_goes_to_8_gpu_nvswitch_types_only(stack: str, nvswitch: bool) -> None:
    result = run(stack)
    flag = "true" if nvswitch else "false"
    assert f"export FABRIC_MANAGER={flag}" in first_boot_env(result)
    assert unwrap(result.cloud.named("node-0-gpu-ready").inputs["environment"])["FABRIC_MANAGER"] == flag


def test_shm_size_reaches_the_host_and_the_object_store_is_checked_there_too() -> None:
    result = run("multi", config={"roll-cluster:container": {"shmSize": "32g"},
                                  "roll-cluster:ray": {"objectStoreMemoryGb": 20}})
    env = env_of(step_command(result, "node-1-prepare-host"))
    assert env["SHM_SIZE"] == "32g" and env["OBJECT_STORE_MEMORY_GB"] == "20"


def test_an_object_store_larger_than_shm_is_refused_before_any_resource() -> None:
    cloud = OfflineCloud()
    with pytest.raises(ConfigError) as error:
        run("multi", cloud=cloud, config={"roll-cluster:container": {"shmSize": "16g"},
                                          "roll-cluster:ray": {"objectStoreMemoryGb": 24}})
    assert "roll-cluster:ray.objectStoreMemoryGb: must fit in /dev/shm, which container.shmSize makes 16g" in str(
        error.value
    )
    assert custom_resources(cloud) == []
