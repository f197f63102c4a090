"""Day two of the pull cache (container.pullCache, infra/pull_cache.py) on the engine: a 64-node stack whose image is
in the region's registry (so `auto` builds the cache: the head's on node 0, fan-out caches on nodes 16, 32, 48) scaled
in and out across AUTO_ABOVE, and a fan-out cache's instance replaced. The program runs under the offline cloud, the
engine model (devtools/engine_model.py) decides each `up`, and tests/helpers/day_two_world.py performs it (teardowns
run for real over its ssh stand-in, which checks host keys strictly). A node's docker step, as the program renders
it for each `up`, runs for real on a fake node (tests/helpers/script_harness.py) whose training container runs: what
its dockerd does when the cache's address comes or goes (install_docker.sh)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from day_two_world import World, expected_ips, job_id
from offline_helpers import env_of, step_command
from script_harness import FakeNode

from devtools.offline_cloud import OfflineRun, run_program, unwrap
from infra import pull_cache

IMAGE = "registry-vpc.cn-hangzhou.aliyuncs.com/me/pytorch:nvcr-24.05-py3-torch260-vllm084"  # the region's registry
BOOTSTRAP_STEPS = ("docker", "pull-image")  # what the cache's address changes on a node that pulls through one


def _config(count: int) -> dict[str, Any]:
    return {"roll-cluster:nodes": {"count": count}, "roll-cluster:container": {"image": IMAGE},
            "roll-cluster:training": {"overrides": {"rollout_batch_size": 128}}}


def _up(world: World, count: int, prior: OfflineRun | None = None, **changes: Any) -> OfflineRun:
    cloud = prior.cloud.next_run(**changes) if prior is not None else None
    run = run_program("multi", cloud=cloud, config=_config(count))
    result = world.up(run.cloud)
    assert result.failed is None, f"{result.failed}: {result.error}"
    assert sorted(world.ray) == expected_ips(run.cloud)  # Ray formed on the configuration's nodes
    assert world.jobs.get(job_id(run.cloud)) == "RUNNING"
    return run


def _changed(run: OfflineRun, node: int) -> dict[str, str]:
    """What this `up` does to node `node`'s resources (create, update, replace or delete), `same` left out."""
    prefix = f"node-{node}-"
    changed = {n: c for n, c in run.cloud.changes.items() if n.startswith(prefix) and c != "same"}
    kept = set(run.cloud.changes)
    return changed | {n: "delete" for verb, n in run.cloud.ops if verb == "delete" and n.startswith(prefix)
                      and n not in kept}


def _ran(world: World, since: int) -> list[str]:
    return world.log[since:]


def _private_ip(run: OfflineRun, node: int) -> str:
    return str(unwrap(run.cloud.named(f"node-{node}-instance").outputs)["privateIp"])


def _record(run: OfflineRun, key: str) -> Any:
    return next(r for r in run.steps if r.key == key)


def _docker_steps_in_turn(fake: FakeNode, runs: list[OfflineRun], node: int) -> list[str]:
    """Node `node`'s docker step as each run renders it, in turn, on one fake node; its training container runs from
    the first on. Returns the systemctl calls of the later steps (what they did to dockerd)."""
    seen = 0
    for index, run in enumerate(runs):
        env = env_of(step_command(run, f"node-{node}-docker"))
        settings = {k: env[k] for k in ("INSECURE_REGISTRIES", "NVIDIA_RUNTIME", "KEEP_EXISTING_DOCKER")}
        done = fake.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT=str(fake.data_mount / "docker"),
                             **settings)
        assert done.returncode == 0, done
        if index == 0:
            fake.set_state("docker/containers/roll", "true")
            seen = len(fake.calls("systemctl"))
    return fake.calls("systemctl")[seen:]


def _running_insecure(fake: FakeNode) -> list[str]:
    import json

    return list(json.loads((fake.state / "docker" / "running-config.json").read_text()).get("insecure-registries", []))


def test_scale_in_64_to_40_keeps_the_caches_that_stay_and_tears_down_node_48s_on_its_own_host(tmp_path: Path) -> None:
    world = World(tmp_path)
    first = _up(world, 64)
    assert pull_cache.plan_for(first.notes["config"]) is not None  # auto: 64 > 32, over the VPC
    old = first.cloud.named("node-48-instance")
    machine = world.machines[str(old.id)]
    since = len(world.log)

    later = _up(world, 40, prior=first)

    # The caches on nodes 0, 16 and 32 and every remaining node's pull and docker steps: untouched.
    for node in range(40):
        assert _changed(later, node) == {}, (node, _changed(later, node))
    for cache in (0, 16, 32):
        assert not any(line.startswith("pull-cache") and line.endswith(f" on node-{cache}")
                       for line in _ran(world, since)), cache
    assert not any(line.split(" on ")[0] in BOOTSTRAP_STEPS for line in _ran(world, since))
    # Nodes 40..63 are deleted, with node 48's cache: its teardown ran pull_cache_stop on node 48 itself, reached at
    # its own address and checked against its own host key (the ssh stand-in refuses any other).
    assert len(world.machines) == 40 and str(old.id) not in world.machines
    assert {("delete", "node-48-pull-cache"), ("delete", "node-48-pull-cache-teardown")} <= set(later.cloud.ops)
    teardown = unwrap(first.cloud.named("node-48-pull-cache-teardown").inputs)["environment"]
    assert teardown["HOST"] == machine.public_ip and "pull_cache_stop" in teardown["REMOTE_COMMAND"]
    assert teardown["HOST_PUBLIC_KEY"].split()[:2] == machine.host_key.split()[:2]
    assert _ran(world, since).count("pull-cache-delete on node-48") == 1


def test_scale_in_64_to_20_turns_the_cache_off_and_reloads_dockerd_under_the_running_container(
    tmp_path: Path, node: FakeNode
) -> None:
    world = World(tmp_path)
    first = _up(world, 64)
    since = len(world.log)

    later = _up(world, 20, prior=first)

    assert pull_cache.plan_for(later.notes["config"]) is None  # 20 nodes: auto leaves the cache off
    # On each remaining node the docker step (its insecure-registries entry goes) and the pull step (from the
    # registry now, the image present: nothing pulled) run again; nothing else of the node changes.
    for index in range(20):
        expected = {f"node-{index}-docker": "update", f"node-{index}-pull-image": "update"}
        if index in (0, 16):
            expected |= {f"node-{index}-pull-cache": "delete", f"node-{index}-pull-cache-teardown": "delete"}
        assert _changed(later, index) == expected, index
        assert "PULL_CACHE" not in env_of(step_command(later, f"node-{index}-pull-image"))
    # Every cache is torn down on its node: 0 and 16 (which stay), 32 and 48 (deleted with their nodes); after the
    # remaining nodes stopped naming them.
    ran = _ran(world, since)
    for cache in (0, 16, 32, 48):
        assert ran.count(f"pull-cache-delete on node-{cache}") == 1, cache
    ops = later.cloud.ops
    assert ops.index(("update", "node-5-docker")) < ops.index(("delete", "node-0-pull-cache"))
    # The docker step, as the program renders it on both days, on a node whose training container runs: the cache's
    # address leaves dockerd by a reload, never a restart.
    calls = _docker_steps_in_turn(node, [first, later], 5)
    assert "reload docker" in calls and not any(call.startswith("restart") for call in calls), calls
    assert _running_insecure(node) == []
    assert (node.state / "docker" / "containers" / "roll").read_text().strip() == "true"


def test_scale_out_20_to_64_fills_the_fan_out_caches_from_the_heads_before_their_nodes_pull(
    tmp_path: Path, node: FakeNode
) -> None:
    world = World(tmp_path)
    first = _up(world, 20)
    assert pull_cache.plan_for(first.notes["config"]) is None
    since = len(world.log)

    later = _up(world, 64, prior=first)

    # The 20 nodes that have the image: only their docker and pull steps run again (the cache's address comes; the
    # image is present, nothing pulled), and nodes 0 and 16 start their caches. No container or Ray step reruns.
    for index in range(20):
        expected = {f"node-{index}-docker": "update", f"node-{index}-pull-image": "update"}
        if index in (0, 16):
            expected |= {f"node-{index}-pull-cache": "create", f"node-{index}-pull-cache-teardown": "create"}
        assert _changed(later, index) == expected, index
    calls = _docker_steps_in_turn(node, [first, later], 5)
    assert "reload docker" in calls and not any(call.startswith("restart") for call in calls), calls
    assert _running_insecure(node) == [f"{_private_ip(later, 0)}:5000"]
    # The new nodes pull through their group's cache; each fan-out cache fills from the head's first.
    for index in range(20, 64):
        cache = index // 16 * 16
        assert env_of(step_command(later, f"node-{index}-pull-image"))["PULL_CACHE"] == \
            f"{_private_ip(later, cache)}:5000", index
        assert f"node-{cache}/pull-cache" in _record(later, f"node-{index}/pull-image").depends_on, index
        assert f"node-{cache}-pull-cache" in later.cloud.registrations[f"node-{index}-pull-image"].dependencies
    ran = _ran(world, since)
    for cache in (16, 32, 48):
        assert "node-0/pull-cache" in _record(later, f"node-{cache}/pull-cache").depends_on
        assert "node-0-pull-cache" in later.cloud.registrations[f"node-{cache}-pull-cache"].dependencies
        assert ran.index("pull-cache on node-0") < ran.index(f"pull-cache on node-{cache}")
        first_pull = min(ran.index(f"pull-image on node-{i}") for i in range(max(cache, 20), cache + 16))
        assert ran.index(f"pull-cache on node-{cache}") < first_pull, cache


def test_a_replaced_fan_out_cache_node_serves_again_before_any_new_pull_through_it(
    tmp_path: Path, node: FakeNode
) -> None:
    world = World(tmp_path)
    first = _up(world, 64)
    since = len(world.log)

    later = _up(world, 64, prior=first, replace={"node-16-instance"})

    instance = later.cloud.named("node-16-instance")
    assert instance.id != first.cloud.named("node-16-instance").id
    # The cache step runs again on the new instance (the same step, its connection now the new machine's)...
    connection = unwrap(later.cloud.named("node-16-pull-cache").inputs)["connection"]
    assert world.machines[str(instance.id)].public_ip == connection["host"]
    assert later.cloud.changes["node-16-pull-cache"] in ("update", "replace")
    # ...before any pull through it: the new instance's own, and those of nodes 17..31 (the cache's new address).
    ran = _ran(world, since)
    cache_ran = ran.index("pull-cache on node-16")
    for index in range(16, 32):
        assert "node-16-pull-cache" in later.cloud.registrations[f"node-{index}-pull-image"].dependencies
        assert cache_ran < ran.index(f"pull-image on node-{index}"), index
    # Nodes 17..31 have the image: their docker step (the cache's new address, by a reload) and their pull step (the
    # image present) run again, nothing else; their containers and Ray stay.
    for index in range(17, 32):
        assert set(_changed(later, index)) <= {f"node-{index}-docker", f"node-{index}-pull-image"}, index
        assert set(_changed(later, index).values()) <= {"update"}, index
    calls = _docker_steps_in_turn(node, [first, later], 17)
    assert not any(call.startswith("restart") for call in calls), calls
    assert _running_insecure(node) == [f"{_private_ip(later, 16)}:5000"]
