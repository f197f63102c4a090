"""Node bootstrap under the offline cloud: each node's steps and their dependencies, the overlap of the image
pull with the driver installation, the training container, and a critical path that does not grow with the
node count."""

from __future__ import annotations

import pytest
from offline_helpers import env_of, run, step_command

from devtools.offline_cloud import is_secret, reveal, unwrap
from devtools.schedule import schedule
from infra.sources.alibaba.user_data import decode_user_data

BOOTSTRAP = ["prepare-host", "docker", "pull-image", "gpu-ready", "image", "container", "code"]


def graph(result):
    return {r.key: set(r.depends_on) for r in result.steps}


def ancestors(deps, key):
    seen, todo = set(), [key]
    while todo:
        for parent in deps.get(todo.pop(), ()):
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return seen


def test_every_node_runs_the_bootstrap_steps_in_order():
    result = run("multi")
    for node in ("node-0", "node-1"):
        names = [r.step for r in result.steps if r.node == node]
        assert [n for n in names if n in BOOTSTRAP] == BOOTSTRAP


def test_the_pull_does_not_wait_for_the_driver_and_the_container_waits_for_both():
    result = run("multi")
    deps = graph(result)
    for node in ("node-0", "node-1"):
        assert ancestors(deps, f"{node}/pull-image") == {f"{node}/docker", f"{node}/prepare-host"}
        container = deps[f"{node}/container"]
        assert container == {f"{node}/gpu-ready", f"{node}/image"}
    # The driver installer starts at first boot (user data), in parallel with prepare-host, docker and the pull.
    user_data = run("dev").cloud.of_type("alicloud:ecs/instance:Instance")[0].inputs["userData"]

    assert "first_boot.sh" in decode_user_data(reveal(user_data))


def test_no_worker_step_depends_on_another_worker_and_bootstrap_never_crosses_nodes():
    result = run("multi", config={"roll-cluster:nodes": {"count": 4}})
    deps = graph(result)
    for key in deps:
        node, step = key.split("/")
        others = {a.split("/")[0] for a in ancestors(deps, key)} - {node}
        if step in BOOTSTRAP:
            assert others == set(), key
        elif node != "node-0":
            assert others <= {"node-0"}, key  # a worker joins the head, never another worker


@pytest.mark.parametrize("count", [2, 8, 32])
def test_critical_path_does_not_grow_with_node_count(count):
    base = schedule(run("multi", config={"roll-cluster:nodes": {"count": 2}}).steps).total
    total = schedule(run("multi", config={"roll-cluster:nodes": {"count": count}}).steps).total
    assert total == base  # the graph alone (every node in one wave, no shared backend): workers wait only for the head


def test_critical_path_goes_through_the_later_of_pull_and_driver_not_their_sum():
    plan = schedule(run("dev").steps)
    assert plan.finish["node-0/gpu-ready"] < 2 + 1 + 2 + 15 + 15  # sequential pull after the driver would be more
    assert "node-0/pull-image" in plan.critical_path or "node-0/driver" in plan.critical_path


def test_gpu_readiness_is_a_local_poll_that_survives_the_reboot():
    result = run("multi")
    gpu = result.cloud.named("node-1-gpu-ready")
    assert gpu.type == "command:local:Command"
    assert gpu.inputs["create"] == "bash infra/scripts/local/gpu_ready.sh"
    env = gpu.inputs["environment"]
    assert env["EXPECTED_GPUS"] == "2" and env["GPU_DRIVER"] == "auto-install"
    assert env["HOST"] == result.outputs["nodes"][1]["publicIp"]
    assert gpu.inputs["triggers"] == [result.outputs["nodes"][1]["instanceId"]]


def test_training_container_has_gpus_host_network_ipc_shm_mounts_and_node_env():
    result = run("multi")
    head_private = result.outputs["nodes"][0]["privateIp"]
    container = result.cloud.named("node-1-container").inputs
    assert container["gpus"] == "all" and container["networkMode"] == "host" and container["ipcMode"] == "host"
    assert container["shmSize"] == 16 * 1024 and container["restart"] == "unless-stopped" and container["mustRun"]
    mounts = {(v["hostPath"], v["containerPath"]) for v in container["volumes"]}
    assert {("/data", "/data"), ("/mnt/shared", "/mnt/shared")} <= mounts
    envs = dict(e.split("=", 1) for e in container["envs"])
    assert envs.pop("ROLL_CLUSTER_NAS").endswith(".nas.aliyuncs.com")  # a new NAS recreates the container
    assert envs == {
        "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "MASTER_ADDR": head_private,
        "MASTER_PORT": "6379", "RANK": "1", "NODE_RANK": "1",
        # The hubs' caches on the shared storage (the head's model step fills them), HF_HOME on the data disk,
        # ModelScope's in-cloud download in cn-hangzhou (infra/model_cache.py).
        "HF_HOME": "/data/cache/huggingface", "HF_HUB_CACHE": "/mnt/shared/cache/huggingface/hub",
        "MODELSCOPE_CACHE": "/mnt/shared/cache/modelscope",
        "MODELSCOPE_DOWNLOAD_INTRA_CLOUD_REGION": "cn-hangzhou", "INTRA_CLOUD_ACCELERATION_REGION": "cn-hangzhou",
    }
    assert container["image"].startswith("sha256:")  # the pulled image's id


def test_growing_the_cluster_does_not_change_a_running_nodes_container():
    # 48 rollouts divide over Megatron's 4 and 6 data-parallel ranks (ROLL refuses 64 on 6 GPUs).
    fits = {"roll-cluster:training": {"overrides": {"rollout_batch_size": 48}}}
    two = run("multi", config={"roll-cluster:nodes": {"count": 2}, **fits})
    three = run("multi", config={"roll-cluster:nodes": {"count": 3}, **fits})
    for name in ("node-0-container", "node-1-container", "node-1-code", "node-1-pull-image", "node-1-docker"):
        assert unwrap(two.cloud.named(name).inputs) == unwrap(three.cloud.named(name).inputs), name


def test_docker_provider_runs_over_ssh_only_after_docker_is_installed():
    result = run("multi")
    provider = result.cloud.named("node-1-docker-engine")
    assert provider.type == "pulumi:providers:docker"
    assert provider.inputs["host"] == "ssh://root@" + result.outputs["nodes"][1]["publicIp"] + ":22"
    assert provider.inputs["disableDockerDaemonCheck"] in (True, "true")
    assert result.cloud.options["node-1-docker-engine"].depends_on


def test_registry_password_is_secret_everywhere():
    result = run("multi", config={"roll-cluster:container": {"registryUsername": "puller"}},
                 secrets={"roll-cluster:registryPassword": "s3cret-pw"})
    pull = result.cloud.named("node-0-pull-image").inputs["stdin"]
    assert is_secret(pull) and env_of(reveal(pull))["REGISTRY_PASSWORD"] == "s3cret-pw"
    provider = result.cloud.named("node-0-docker-engine").inputs
    assert "s3cret-pw" in str(provider["registryAuth"])
    for resource in result.cloud.resources:
        for key, value in resource.inputs.items():
            if "s3cret-pw" in str(value) and resource.type != "pulumi:providers:docker":
                assert is_secret(value), (resource.name, key)
    assert "s3cret-pw" not in str(result.outputs)


def test_prepare_docker_and_pull_steps_get_their_parameters():
    result = run("large")
    assert env_of(step_command(result, "node-1-pull-image"))["IMAGE"].endswith("torch260-vllm084")
    assert env_of(step_command(result, "node-1-docker"))["DOCKER_DATA_ROOT"] == "/data/docker"
    prepare = env_of(step_command(result, "node-1-prepare-host"))
    assert prepare["SHARED_MOUNT"] == "/mnt/shared" and prepare["DATA_MOUNT"] == "/data"
    assert prepare["NODE_NAME"] == "node-1" and prepare["ROLL_CLUSTER_STEP"] == "prepare-host"
