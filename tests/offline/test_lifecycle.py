"""The second `pulumi up`, a first preview and a destroy, as the engine does them (devtools/engine_model.py).

Issue 20: each test here failed on the code before the lifecycle fixes (known-hosts replaced and deleted, host keys
regenerated from another checkout, no container on a replaced worker, destroy stopped at an unreachable node, SSH
revoked by a reordered admin CIDR list, the old reward server kept on a changed port)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from devtools import engine_model
from devtools.offline_cloud import OfflineCloud, OfflineRun, Registered, run_program, shipped_stacks
from infra.layout import PROJECT_DIR

RULE = "alicloud:ecs/securityGroupRule:SecurityGroupRule"
INSTANCE = "alicloud:ecs/instance:Instance"


def _second_up(stack: str, first: OfflineRun, config: dict[str, Any] | None = None, **changes: Any) -> OfflineRun:
    return run_program(stack, cloud=first.cloud.next_run(**changes), config=config)


# ------------------------------------------------------------------------------------------------ the engine's rules
def test_an_update_of_a_command_reruns_create_and_only_triggers_replace() -> None:
    old = {"create": "a", "environment": {"X": "1"}, "triggers": ["t"]}
    reg = engine_model.Registration("command:local:Command", "c", replace_on_changes=("triggers[*]",))
    assert engine_model.decide("command:local:Command", {**old, "environment": {"X": "2"}}, reg, old, reg, ()) \
        == "update"
    assert engine_model.decide("command:local:Command", {**old, "triggers": ["u"]}, reg, old, reg, ()) == "replace"
    # Dropping the whole list: the provider's own diff (top-level `triggers` key) replaces.
    assert engine_model.decide("command:local:Command", {"create": "a", "environment": {"X": "1"}}, reg, old, reg,
                               ()) == "replace"
    ops = engine_model.Ops()
    ops.record("update", "c", dbr=False)
    assert ops.finish(["c"], ["c"]) == [("update", "c")]  # an update never deletes


def test_a_provider_whose_host_changes_is_updated_and_its_resources_stay() -> None:
    typ = "pulumi:providers:docker"
    assert engine_model.decide(typ, {"host": "ssh://root@b:22"}, None, {"host": "ssh://root@a:22"}, None, ()) \
        == "update"
    image = {"name": "img", "keepLocally": True}
    assert engine_model.decide("docker:index/remoteImage:RemoteImage", image, None, image, None, ()) == "same"


def test_replacement_trigger_null_on_either_side_does_not_replace_unknown_does() -> None:
    typ = "docker:index/container:Container"
    old = engine_model.Registration(typ, "c")
    new = engine_model.Registration(typ, "c", replacement_trigger='"i-1"')
    assert engine_model.decide(typ, {}, new, {}, old, ()) == "same"
    assert engine_model.decide(typ, {}, dataclasses.replace(new, replacement_trigger='"i-2"'), {}, new, ()) \
        == "replace"
    unknown = dataclasses.replace(new, replacement_trigger=f'"{engine_model.UNKNOWN}"')
    assert engine_model.decide(typ, {}, unknown, {}, new, ()) == "replace"


@pytest.mark.parametrize("stack", shipped_stacks())
def test_a_first_preview_of_every_shipped_stack_leaves_new_outputs_unknown(stack: str) -> None:
    run = run_program(stack, cloud=OfflineCloud(preview=True))
    new = [r for r in run.cloud.resources if run.cloud.changes[r.name] == "create"]
    assert new and all(r.id is None for r in new)
    assert all(set(r.outputs) <= set(r.inputs) for r in new)  # no computed output is known
    for known in ("jobId", "jobConfig", "gpus", "gpuModel", "knownHostsFile"):
        assert run.outputs[known] != engine_model.UNKNOWN, known
    if run.cloud.of_type(INSTANCE):  # Alibaba: the addresses exist only once the instances do
        for unknown in ("sshHead", "rayAddress"):
            assert run.outputs[unknown] == engine_model.UNKNOWN, unknown
        for known in ("zone", "instanceType", "hourlyPrice"):
            assert run.outputs[known] != engine_model.UNKNOWN, known


# ------------------------------------------------------------------------------------------------ item 1
def test_a_new_node_address_rewrites_the_known_hosts_file_and_never_deletes_it() -> None:
    first = run_program("multi")
    later = _second_up("multi", first, replace={"node-1-instance"})  # a new address and host key
    assert later.cloud.changes["known-hosts"] == "update"
    assert ("delete", "known-hosts") not in later.cloud.ops


def test_a_replaced_known_hosts_command_deletes_the_old_file_before_writing_the_new() -> None:
    first = run_program("multi")
    later = _second_up("multi", first, replace={"known-hosts"})
    ops = later.cloud.ops
    assert ops.index(("delete", "known-hosts")) < ops.index(("replace", "known-hosts"))
    assert ops.count(("delete", "known-hosts")) == 1


# ------------------------------------------------------------------------------------------------ items 4 and 8a
def test_no_local_command_records_the_checkout_path() -> None:
    run = run_program("multi")
    local = run.cloud.of_type("command:local:Command")
    assert local and all("dir" not in r.inputs for r in local)


def test_another_checkout_or_any_input_change_keeps_the_host_keys() -> None:
    first = run_program("multi")
    # The state of a stack created from another checkout (the `dir` of earlier versions) and an older
    # pulumi-command (another input): the host keys must not be generated again.
    prior = [dataclasses.replace(r, inputs={**r.inputs, "dir": "/home/teammate/roll-cluster", "create": "old"})
             if r.name.endswith("-host-key") else r for r in first.cloud.resources]
    later = run_program("multi", cloud=OfflineCloud(prior=prior))
    host_keys = {n: c for n, c in later.cloud.changes.items() if n.endswith("-host-key")}
    assert host_keys and set(host_keys.values()) == {"same"}


# ------------------------------------------------------------------------------------------------ item 3
def test_a_replaced_worker_gets_its_image_and_container() -> None:
    first = run_program("multi")
    later = _second_up("multi", first, replace={"node-1-instance"})
    changes = later.cloud.changes
    assert changes["node-1-instance"] == "replace"
    assert changes["node-1-docker-engine"] == "update"  # the provider's host: an update, not a replace
    assert changes["node-1-image"] == "replace"
    assert changes["node-1-container"] == "replace"
    assert changes["node-1-ray-worker"] == "replace"
    assert changes["node-0-container"] == "same"


# ------------------------------------------------------------------------------------------------ item 2
def test_destroy_with_one_node_unreachable_deletes_every_instance() -> None:
    run = run_program("multi")
    gone = str(run.cloud.named("node-1-instance").outputs["publicIp"])
    result = run.cloud.destroy(unreachable={gone})
    assert result.failed is None, result.error
    instances = {r.name for r in run.cloud.of_type(INSTANCE)}
    assert instances and instances <= set(result.deleted)
    assert "node-1-container" in result.dropped  # deleted with its instance, no docker call over SSH


# ------------------------------------------------------------------------------------------------ item 5
def _live_rules(cloud: OfflineCloud) -> set[tuple[str, ...]]:
    """The account's rule set after the `up`: AuthorizeSecurityGroup adds a rule if absent (accepted, no-op if
    present), RevokeSecurityGroup removes it whoever declared it; in the engine's order."""
    def ident(r: Registered) -> tuple[str, ...]:
        return (str(r.inputs.get("cidrIp")), str(r.inputs.get("portRange")))

    prior = {r.name: r for r in cloud.prior if r.type == RULE}
    current = {r.name: r for r in cloud.resources if r.type == RULE}
    live = {ident(r) for r in prior.values()}
    for verb, name in cloud.ops:
        if verb in ("create", "replace") and name in current:
            live.add(ident(current[name]))
        elif verb == "delete" and name in prior:
            live.discard(ident(prior[name]))
    return live


@pytest.mark.parametrize("second", [["198.51.100.0/24"], ["198.51.100.0/24", "203.0.113.0/24"]])
def test_reordering_or_removing_an_admin_cidr_keeps_ssh_from_the_others(second: list[str]) -> None:
    cidrs = {"roll-cluster:access": {"adminCidrs": ["203.0.113.0/24", "198.51.100.0/24"]}}
    first = run_program("multi", config=cidrs)
    later = _second_up("multi", first, {"roll-cluster:access": {"adminCidrs": second}})
    live = _live_rules(later.cloud)
    assert {(cidr, "22/22") for cidr in second} <= live
    assert len([n for n, c in later.cloud.changes.items() if n.startswith("network-ssh") and c != "same"]) == 0


def test_rules_of_a_stack_named_by_index_are_kept_on_the_upgrade() -> None:
    first = run_program("multi")
    prior = [dataclasses.replace(r, name="network-ssh-0") if r.name == "network-ssh-203.0.113.0_24" else r
             for r in first.cloud.resources]
    later = run_program("multi", cloud=OfflineCloud(prior=prior))
    assert later.cloud.changes["network-ssh-203.0.113.0_24"] == "same"
    assert ("delete", "network-ssh-0") not in later.cloud.ops


# ------------------------------------------------------------------------------------------------ item 7
def test_a_changed_reward_server_port_stops_the_old_server_first() -> None:
    first = run_program("openrlhf")
    port = {"roll-cluster:training": {"openrlhf": {"rewardServer": {"port": 5002}}}}
    later = _second_up("openrlhf", first, port)
    ops = later.cloud.ops
    assert later.cloud.changes["reward-server"] == "replace"
    assert ops.index(("delete", "reward-server-teardown")) < ops.index(("replace", "reward-server"))


# ------------------------------------------------------------------------------------------------ item 8b
def _pulumi_standin(tmp_path: Path, answer: str) -> dict[str, str]:
    """A `pulumi` on PATH whose `config get` answers `answer` (or fails like an unset key: `not found`)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "pulumi"
    reply = ('echo "error: configuration key \'roll-cluster:storage\' not found for stack" >&2; exit 255'
             if answer == "unset" else f"echo {answer}")
    script.write_text(f"#!/bin/sh\n{reply}\n")
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize(("now", "refused"), [("true", True), ("unset", True), ("false", False)])
def test_destroy_after_retain_on_destroy_changed_to_true_stops_before_the_nas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, now: str, refused: bool
) -> None:
    run = run_program("multi", config={"roll-cluster:storage": {"retainOnDestroy": False}})
    monkeypatch.setenv("PATH", _pulumi_standin(tmp_path, now)["PATH"])
    result = run.cloud.destroy(local=lambda r: engine_model.run_local_delete(
        r, str(PROJECT_DIR), only=lambda delete: "nas_guard.sh" in delete))
    if refused:
        assert result.failed == "shared-fs-guard" and "Run `pulumi up` first" in str(result.error)
        assert "shared-fs" not in result.deleted
    else:
        assert result.failed is None and "shared-fs" in result.deleted


def test_a_retained_nas_is_dropped_from_the_state_and_its_guard_lets_the_destroy_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_program("multi")  # retainOnDestroy: true (the default)
    monkeypatch.setenv("PATH", _pulumi_standin(tmp_path, "false")["PATH"])
    result = run.cloud.destroy(local=lambda r: engine_model.run_local_delete(r, str(PROJECT_DIR)))
    assert result.failed is None and "shared-fs" in result.dropped


def test_the_offline_engine_decides_one_registration_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pulumi's SDK sends RegisterResource from executor threads; the engine model's decision reads what earlier
    # ones decided (the replaced resources), so concurrent decisions once broke a 64-node plan with "dictionary
    # changed size during iteration". Widen the window: without one-at-a-time registration, decisions overlap.
    decide = engine_model.decide
    inside, most = [0], [0]
    guard = threading.Lock()

    def slow_decide(*args: Any, **kwargs: Any) -> str:
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.005)
        with guard:
            inside[0] -= 1
        return decide(*args, **kwargs)

    monkeypatch.setattr(engine_model, "decide", slow_decide)
    run_program("multi")
    assert most[0] == 1
