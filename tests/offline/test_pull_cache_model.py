"""The pull cache inside the VPC (issue 34): when the program uses one (container.pullCache), which nodes run a cache
and which each node pulls through, and the steps the program declares for it (offline cloud). The cache itself, with
real Docker, is tests/e2e/test_pull_cache.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from offline_helpers import run, step_command

from devtools.offline_cloud import unwrap
from infra import pull_cache
from infra.config import ConfigError, parse_cluster_config
from infra.sources.alibaba.network_plan import NetworkArgs, ingress_rules

PASSWORD = "registry-secret-for-the-cache-test"


KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test"


VPC_IMAGE = "registry-vpc.cn-hangzhou.aliyuncs.com/me/roll:v1"


def _parsed(count: int, **container: Any) -> Any:
    container = {"image": VPC_IMAGE, **container}
    raw = {
        "nodes": json.dumps({"instanceTypes": ["ecs.gn6v-c8g1.4xlarge"], "count": count}),
        "access": json.dumps({"adminCidrs": ["203.0.113.0/24"], "sshPublicKey": KEY}),
        "container": json.dumps(container),
    }
    return parse_cluster_config(raw, "cn-hangzhou")


@pytest.mark.parametrize(("count", "setting", "used"), [
    (2, "auto", False), (32, "auto", False), (33, "auto", True), (2, "on", True), (256, "off", False)])
def test_the_cache_is_chosen_above_32_nodes_or_when_forced(count: int, setting: str, used: bool) -> None:
    config = _parsed(count, pullCache=setting)
    assert (pull_cache.plan_for(config) is not None) is used, pull_cache.why_not(config)


def test_auto_leaves_an_image_pulled_over_the_public_ips_to_a_direct_pull() -> None:
    public = _parsed(64, image="roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:v1")
    assert "public IP" in (pull_cache.why_not(public) or "")
    assert pull_cache.plan_for(_parsed(64, image="roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:v1",
                                       pullCache="on")) is not None


def test_no_cache_for_a_baked_image_or_an_image_pinned_by_digest() -> None:
    baked = _parsed(64, pullCache="on")
    baked = baked.model_copy(update={"nodes": baked.nodes.model_copy(update={"image": "m-bp1abc"})})
    assert "baked image" in (pull_cache.why_not(baked) or "")
    pinned = _parsed(64, image="registry-vpc.cn-hangzhou.aliyuncs.com/me/roll@sha256:" + "a" * 64)
    assert "digest" in (pull_cache.why_not(pinned) or "")


def test_a_wrong_setting_is_rejected_naming_the_key() -> None:
    with pytest.raises(ConfigError) as raised:
        _parsed(2, pullCache="yes")
    problems = " ".join(raised.value.problems)
    assert "container.pullCache" in problems and "auto" in problems and "yes" in problems, problems


@pytest.mark.parametrize(("nodes", "caches"), [(2, (0,)), (16, (0,)), (17, (0, 16)), (64, (0, 16, 32, 48)),
                                                (256, tuple(range(0, 256, 16)))])
def test_one_cache_per_16_nodes_each_node_pulling_through_its_own_group(nodes: int, caches: tuple[int, ...]) -> None:
    plan = pull_cache.layout(nodes)
    assert plan.caches == caches
    served = {cache: plan.pulls_from.count(cache) for cache in plan.caches}
    assert all(1 <= count <= pull_cache.NODES_PER_CACHE for count in served.values())
    assert all(plan.pulls_from[cache] == cache for cache in caches)  # a cache's node pulls through itself


@pytest.mark.parametrize(("image", "expected"), [
    (VPC_IMAGE, ("https://registry-vpc.cn-hangzhou.aliyuncs.com", "me/roll:v1")),
    ("verlai/verl:tag", ("https://registry-1.docker.io", "verlai/verl:tag")),
    ("ubuntu:22.04", ("https://registry-1.docker.io", "library/ubuntu:22.04")),
    ("docker.io/ubuntu", ("https://registry-1.docker.io", "library/ubuntu")),
])
def test_the_upstream_and_the_path_behind_the_cache(image: str, expected: tuple[str, str]) -> None:
    assert pull_cache.upstream(image) == expected


def test_the_cache_port_is_never_opened_to_the_admin_cidrs() -> None:
    rules = ingress_rules(NetworkArgs("s", "cn-hangzhou-h", "ecs.gn6v-c8g1.4xlarge", 0, "vsw", ["203.0.113.0/24"],
                                      8265, True))
    for rule in rules:
        if rule.source != "this security group":
            low, high = (int(p) for p in rule.ports.split("/"))
            assert not low <= pull_cache.PORT <= high, rule
    assert any(r.source == "this security group" and r.protocol == "tcp" and r.ports == "1/65535" for r in rules)


def _env(result: Any, name: str) -> str:
    return step_command(result, name)


def test_with_the_cache_the_head_runs_it_and_every_node_pulls_through_it_without_the_password() -> None:
    result = run("multi", config={"roll-cluster:container": {"pullCache": "on", "registryUsername": "me"}},
                 secrets={"roll-cluster:registryPassword": PASSWORD})
    cache = _env(result, "node-0-pull-cache")
    assert "pull_cache" in cache and "CACHE_UPSTREAM=https://roll-registry.cn-hangzhou.cr.aliyuncs.com" in cache
    assert "CACHE_REPOSITORY=roll/pytorch:nvcr-24.05-py3-torch260-vllm084" in cache
    assert PASSWORD in cache  # the cache's fill gets it (on stdin, a secret: infra/node/remote.py), no config file
    assert "node-1-pull-cache" not in {r.name for r in result.cloud.resources}
    # Turned off or destroyed, the cache leaves the node (its teardown runs pull_cache_stop.sh there).
    teardown = str(unwrap(result.cloud.named("node-0-pull-cache-teardown").inputs)["environment"]["REMOTE_COMMAND"])
    assert "pull_cache_stop" in teardown and "CACHE_DIR=/data/pull-cache" in teardown
    head_ip = unwrap(result.cloud.named("node-0-instance").outputs)["primaryIpAddress"]
    for node in ("node-0", "node-1"):
        pull = _env(result, f"{node}-pull-image")
        assert f"PULL_CACHE={head_ip}:5000" in pull, pull[-2000:]
        assert PASSWORD not in pull and "REGISTRY_USERNAME=''" in pull  # no login: pull_image.sh needs both
        assert f"INSECURE_REGISTRIES={head_ip}:5000" in _env(result, f"{node}-docker")
        record = next(r for r in result.steps if r.key == f"{node}/pull-image")
        assert "node-0/pull-cache" in record.depends_on


def test_without_the_cache_nothing_changes() -> None:
    result = run("multi")
    assert "node-0-pull-cache" not in {r.name for r in result.cloud.resources}
    assert "PULL_CACHE" not in _env(result, "node-1-pull-image")
    assert "INSECURE_REGISTRIES=''" in _env(result, "node-1-docker")


# ------------------------------------------------------------------------------------------------ the model and plan
def _multi(**overrides: Any) -> tuple[list[Any], Any]:

    fits = {"roll-cluster:training": {"overrides": {"rollout_batch_size": 128}}}
    result = run("multi", config={**fits, **overrides})
    return list(result.steps), result.notes["config"]


def test_the_model_builds_the_cache_where_the_program_would() -> None:
    from devtools import schedule

    _, config = _multi()
    # multi pulls ROLL's public image: the new path pulls directly at every count; in the region's registry the
    # cache comes above 32 nodes, as infra/pull_cache.py chooses.
    assert not schedule.cache_used(config, "new", 256)
    assert [schedule.cache_used(config, "in-region", n) for n in (2, 32, 33, 256)] == [False, False, True, True]
    assert not schedule.cache_used(config, "warm", 256)
    assert not schedule.cache_used(schedule.without_cache(config), "in-region", 256)


def test_with_the_cache_the_registry_serves_each_cache_once_and_the_nodes_pull_at_their_own_rate() -> None:
    from devtools import schedule

    records, config = _multi()
    fill, pull, how = schedule.cache_minutes(config, "in-region", 64)
    # The head: 1 fetch of 25 GB at 625 MB/s (5 Gbit/s) = 0.7 min, bounded by its 200 GiB PL1 disk (220 MB/s): 1.9.
    # Three fan-out caches from the head's 5 Gbit/s: 3 x 1 x 25 GB / 625 MB/s = 2.0. Each node: 25 GB at 35 MB/s.
    assert fill == pytest.approx(25_000 / 220 / 60 + 75_000 / 625 / 60, abs=0.01)
    assert pull == pytest.approx(25_000 / 35 / 60, abs=0.01)
    assert "3 fan-out caches" in how
    cached = schedule.first_step(config, records, "in-region", 64, 64)
    direct = schedule.first_step(schedule.without_cache(config), records, "in-region", 64, 64)
    assert "node-0/pull-cache" in cached.critical_path and "node-0/pull-cache" not in direct.critical_path
    assert cached.step_minutes("node-0/pull-image") < direct.step_minutes("node-0/pull-image")
    assert cached.total == pytest.approx(39.4, abs=0.05) and direct.total == pytest.approx(46.9, abs=0.05)
    # Every node's pull waits for the cache, in the graph the program declares.
    worker_pull = next(r for r in schedule.with_cache(schedule.template(records), True) if r.key == "node-1/pull-image")
    assert "node-0/pull-cache" in worker_pull.depends_on


def test_the_dataset_download_is_a_term_of_its_own() -> None:
    from devtools import schedule

    result = run("verl")
    verl = result.notes["config"]
    records = list(result.steps)
    new = schedule.first_step(verl, records, "new", 2, 2)
    assert "node-0/dataset" in new.finish and "GSM8K" in new.profile.dataset_how
    _, roll = _multi()
    assert "repository" in schedule.profile_for(roll, "new", 64, 64).dataset_how


def test_the_plan_prints_built_paths_only_with_and_without_the_cache(capsys: pytest.CaptureFixture[str]) -> None:
    from devtools import plan

    text = plan.plan_text(run("multi"), parallel=8)
    assert "NOT BUILT" not in text and "P2P" not in text.split("Constants")[0].split("Time to the first")[1]
    assert "in-region without the pull cache (container.pullCache off)" in text
    assert "pull cache: the head's cache fills from the registry" in text
    assert "`auto` builds it above 32 nodes for an image in the region's registry" in text


def test_the_plan_advises_a_baked_image_for_a_large_cluster_with_the_command_and_its_cost() -> None:
    from devtools import plan

    summary = plan.render_summary(run("multi", config={"roll-cluster:nodes": {"count": 64}}), parallel=64)
    advice = next(line for line in summary.splitlines() if "advice: boot from a baked image" in line
                  or "advice:" in line)
    joined = " ".join(line.strip() for line in summary.splitlines())
    assert "pulumi up --config-path -c roll-cluster:nodes.bake=true" in joined, advice
    assert "keeping the image costs at most 48 CNY a month (snapshots of 400 GB at 0.12 CNY per GB-month" in joined
    small = plan.render_summary(run("multi"), parallel=8)
    assert "advice: boot from a baked image" not in small


def test_above_16_nodes_fan_out_caches_fill_from_the_heads_and_serve_their_group() -> None:
    image = "registry-vpc.cn-hangzhou.aliyuncs.com/me/pytorch:nvcr-24.05-py3-torch260-vllm084"
    result = run("multi", config={"roll-cluster:nodes": {"count": 40}, "roll-cluster:container": {"image": image},
                                  "roll-cluster:training": {"overrides": {"rollout_batch_size": 128}}})
    caches = sorted(r.name for r in result.cloud.resources if r.name.endswith("-pull-cache"))
    assert caches == ["node-0-pull-cache", "node-16-pull-cache", "node-32-pull-cache"]  # auto: 40 > 32, over the VPC

    def ip(node: str) -> str:
        return str(unwrap(result.cloud.named(f"{node}-instance").outputs)["primaryIpAddress"])

    fan_out = _env(result, "node-16-pull-cache")
    assert f"CACHE_UPSTREAM=http://{ip('node-0')}:5000" in fan_out and "REGISTRY_PASSWORD" not in fan_out
    for node, cache in (("node-5", "node-0"), ("node-16", "node-16"), ("node-20", "node-16"), ("node-39", "node-32")):
        assert f"PULL_CACHE={ip(cache)}:5000" in _env(result, f"{node}-pull-image"), node
        record = next(r for r in result.steps if r.key == f"{node}/pull-image")
        assert f"{cache}/pull-cache" in record.depends_on, node
    head_fill = next(r for r in result.steps if r.key == "node-16/pull-cache")
    assert "node-0/pull-cache" in head_fill.depends_on
