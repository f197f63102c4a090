"""Day two on the real engine (issue 29): the operations users perform after the first `up`, driven through the
engine model (devtools/engine_model.py: refresh, delete-before-replace, deletes last and none after a failure) and
performed by tests/helpers/day_two_world.py (the local scripts run for real; the gate's driver runs against the world's
Ray). Each ends with Ray formed on the configuration's nodes and the job running, or deliberately stopped."""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from day_two_world import World, expected_ips, job_id

from companion import cli
from devtools import engine_model
from devtools.offline_cloud import OfflineCloud, OfflineRun, run_program
from infra.node import remote


def _up(world: World, stack: str, config: dict[str, Any] | None = None, prior: OfflineRun | None = None,
        **changes: Any) -> OfflineRun:
    cloud = prior.cloud.next_run(**changes) if prior is not None else None
    run = run_program(stack, cloud=cloud, config=config)
    result = world.up(run.cloud)
    assert result.failed is None, f"{result.failed}: {result.error}"
    return run


def _formed(world: World, run: OfflineRun) -> None:
    assert sorted(world.ray) == expected_ips(run.cloud)
    assert world.jobs.get(job_id(run.cloud)) == "RUNNING"


def test_scale_in_forms_ray_on_the_remaining_nodes_and_deletes_the_removed_one(tmp_path: Path) -> None:
    world = World(tmp_path)
    first = _up(world, "multi", {"roll-cluster:nodes": {"count": 3}})
    _formed(world, first)
    later = _up(world, "multi", {"roll-cluster:nodes": {"count": 2}}, prior=first)
    _formed(world, later)
    assert len(world.machines) == 2  # the removed instance is deleted (it stops billing)
    # Its teardown ran on it, after the known-hosts file was rewritten without it: the host key is in the state.
    assert "ray-worker-delete on node-2" in world.log


# ------------------------------------------------------------------------------------------------ the engine's rules
def test_a_delete_before_replace_deletes_the_dependents_it_condemns_first() -> None:
    ops = engine_model.Ops()
    ops.record("replace", "container", dbr=True)
    ops.record("replace", "ray-head", dbr=True)
    ops.record("replace", "job", dbr=False)
    ops.record("same", "other", dbr=False)
    prior = ["container", "ray-head", "job", "other", "removed"]
    dependencies = {"ray-head": {"container"}, "job": {"ray-head"}, "other": {"container"}, "removed": {"other"}}
    steps = ops.finish(prior, ["container", "ray-head", "job", "other"], dependencies)
    # The job (replaced, through ray-head) and ray-head go before the container, the job first; `other` is kept.
    assert steps[:3] == [("delete", "job"), ("delete", "ray-head"), ("delete", "container")]
    assert steps.count(("delete", "job")) == 1 and steps.count(("delete", "ray-head")) == 1
    assert steps[-1] == ("delete", "removed")  # a removed resource: last


def test_after_a_failed_step_nothing_more_runs_not_even_the_deletes() -> None:
    ops = [("create", "a"), ("update", "b"), ("create", "c"), ("delete", "removed")]
    result = engine_model.execute(ops, lambda verb, name: "boom" if name == "b" else None)
    assert result.failed == ("update", "b") and result.done == [("create", "a")]


def test_a_refresh_dials_every_docker_resource_and_fails_on_a_dead_host(tmp_path: Path) -> None:
    world = World(tmp_path)
    run = _up(world, "multi")
    world.autostop()
    refreshed = world.refresh(run.cloud.resources)
    assert refreshed.failed in ("node-0-image", "node-1-image", "node-0-container", "node-1-container")
    assert "ssh: connect to host" in str(refreshed.error)
    assert refreshed.state == run.cloud.resources  # a failed refresh changes nothing


def test_urn_globs_match_as_the_engine_does() -> None:
    instance = "alicloud:ecs/instance:Instance"
    assert engine_model.urn_glob("**alicloud:ecs/instance:Instance::*", instance, "node-0-instance")
    assert not engine_model.urn_glob("**alicloud:ecs/instance:Instance::*", "docker:index/container:Container",
                                     "node-0-container")


# ------------------------------------------------------------------------------------------------ case 3: host keys
def test_a_replaced_worker_is_torn_down_with_its_own_host_key_and_ray_forms_on_the_new_one(tmp_path: Path) -> None:
    world = World(tmp_path)
    first = _up(world, "multi")
    old_worker = first.cloud.named("node-1-instance").outputs["privateIp"]
    later = _up(world, "multi", prior=first, replace={"node-1-instance"})
    _formed(world, later)
    assert old_worker not in world.ray and len(world.machines) == 2
    assert world.log.count("ray-worker-delete on node-1") == 1


def test_destroy_from_a_clone_on_another_machine_stops_the_job_and_ray_first(tmp_path: Path) -> None:
    world = World(tmp_path)
    run = _up(world, "multi")
    teammate = tmp_path / "teammate-home"  # no ~/.ssh/roll-cluster/<stack>.known_hosts there
    teammate.mkdir()
    result = world.destroy(run.cloud.resources, home=teammate)
    assert result.failed is None, result.error
    assert {"job-delete on node-0", "ray-head-delete on node-0", "ray-worker-delete on node-1"} <= set(world.log)
    assert world.machines == {} and world.ray == []


# ------------------------------------------------------------------------------------------------ case 1: refresh
def _companion(world: World, monkeypatch: pytest.MonkeyPatch, command: str, last: OfflineRun,
               config: dict[str, Any], previews: list[dict[str, str]] | None = None
               ) -> tuple[int, OfflineRun, list[str]]:
    """Run `python3 -m companion <command>` with its pulumi commands performed by the engine model and the world:
    `config set/rm` edit `config`, `refresh [--target G]...` and `up [--refresh] [--replace G]...` as the engine
    runs them; each `up` previews first (its changes go to `previews`)."""
    state = list(last.cloud.resources)
    runs = [last]
    errors: list[str] = []

    def cloud_for(args: tuple[str, ...], preview: bool) -> OfflineCloud:
        cloud = runs[-1].cloud.next_run()
        cloud.prior, cloud.preview = list(state), preview
        globs = [args[i + 1] for i, a in enumerate(args) if a == "--replace"]
        cloud.replace = {r.name for r in state if any(engine_model.urn_glob(g, r.type, r.name) for g in globs)}
        return cloud

    def pulumi(*args: str) -> int:
        if args[:2] == ("config", "rm"):
            config.get("roll-cluster:nodes", {}).pop(args[-1].rsplit(".", 1)[-1], None)
            return 0
        if args[:2] == ("config", "set"):
            config.setdefault("roll-cluster:nodes", {})[args[-2].rsplit(".", 1)[-1]] = args[-1] == "true"
            return 0
        if args[0] == "refresh" or "--refresh" in args:
            globs = [args[i + 1] for i, a in enumerate(args) if a == "--target"]
            refreshed = world.refresh(state, lambda r: not globs or any(
                engine_model.urn_glob(g, r.type, r.name) for g in globs))
            if refreshed.failed is not None:
                errors.append(str(refreshed.error))
                return 255
            state[:] = refreshed.state
        if args[0] == "up":
            if previews is not None:
                previews.append(dict(run_program(last.stack, cloud=cloud_for(args, True), config=config).cloud.changes))
            run = run_program(last.stack, cloud=cloud_for(args, False), config=config)
            result = world.up(run.cloud)
            if result.failed is not None:
                errors.append(str(result.error))
                return 255
            runs.append(run)
            state[:] = run.cloud.resources
        return 0

    monkeypatch.setattr(cli, "_pulumi", pulumi)
    status = cli.COMMANDS[command].run(cli.Context(last.stack, last.outputs, argparse.Namespace()))
    return status, runs[-1], errors


@pytest.mark.parametrize("stopped_by", ["pause", "autostop"])
def test_the_readme_resume_brings_back_a_paused_or_autostopped_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stopped_by: str
) -> None:
    world = World(tmp_path)
    config: dict[str, Any] = {}
    first = _up(world, "multi")
    last = first
    if stopped_by == "pause":
        status, last, errors = _companion(world, monkeypatch, "pause", first, config)
        assert status == 0, errors
    else:
        world.autostop()
    assert world.ray == [] and not any(m.running for m in world.machines.values())
    previews: list[dict[str, str]] = []
    status, resumed, errors = _companion(world, monkeypatch, "resume", last, config, previews)
    assert status == 0, errors
    assert resumed is not last
    _formed(world, resumed)
    assert all(m.running for m in world.machines.values())
    # The preview the `up` shows before it asks: the job is submitted again (case 8).
    assert previews[-1]["training-job"] == "replace"


def test_the_resume_recovers_a_reclaimed_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    world = World(tmp_path)
    first = _up(world, "multi")
    worker = first.cloud.named("node-1-instance")
    world.machines.pop(str(worker.id))  # reclaimed (or deleted in the console): gone with its raylet
    world.ray.remove(str(worker.outputs["privateIp"]))
    status, recovered, errors = _companion(world, monkeypatch, "resume", first, {})
    assert status == 0, errors
    assert recovered.cloud.changes["node-1-instance"] == "create"
    _formed(world, recovered)


# ------------------------------------------------------------------------------------------------ case 4: revert
@pytest.mark.parametrize("b", [{"roll-cluster:training": {"checkpointEvery": 7}},
                               {"roll-cluster:nodes": {"count": 3}}])
def test_a_revert_a_b_a_submits_a_again(tmp_path: Path, b: dict[str, Any]) -> None:
    world = World(tmp_path)
    a = _up(world, "multi")
    job_a = job_id(a.cloud)
    changed = _up(world, "multi", b, prior=a)
    assert job_id(changed.cloud) != job_a
    _formed(world, changed)
    back = _up(world, "multi", prior=changed)  # the stack file's configuration again
    assert job_id(back.cloud) == job_a
    _formed(world, back)


# ------------------------------------------------------------------------------------------------ case 6: a move
def test_a_move_adds_the_new_nas_access_rule_and_removes_the_old_one_after_the_old_nodes() -> None:
    first = run_program("multi")
    moved = run_program("multi", cloud=first.cloud.next_run(stock={"ecs.gn6v": ["cn-hangzhou-k"],
                                                                   "ecs.gn6e": ["cn-hangzhou-k"]}),
                        config={"roll-cluster:nodes": {"placementGeneration": 1}})
    rule = "shared-access-rule"
    old_cidr = first.cloud.named(rule).inputs["sourceCidrIp"]
    assert moved.cloud.named(rule).inputs["sourceCidrIp"] != old_cidr
    ops = moved.cloud.ops
    assert moved.cloud.changes[rule] == "replace"  # not ModifyAccessRule in place at the start
    assert ops.index(("replace", rule)) < ops.index(("replace", "shared-mount"))
    for instance in ("node-0-instance", "node-1-instance"):
        assert ops.index(("delete", instance)) < ops.index(("delete", rule))


# ------------------------------------------------------------------------------------------------ case 7: Ctrl-C
SSHD = "import subprocess, sys; subprocess.run(['sh', '-c', sys.argv[1]])"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in state  # a zombie has ended (whoever reaps it)


def test_a_long_step_ends_within_its_bound_once_its_ssh_session_is_gone(tmp_path: Path) -> None:
    # A second Ctrl-C kills pulumi and its providers; the SSH connection drops and sshd's session process exits
    # without signalling a command that has no pty. Here "sshd" is a process running the step's exact command,
    # killed; the step (a loop that would run for ten minutes) must end with it, within the watcher's bound.
    pid_file = tmp_path / "step.pid"
    text = f"echo $$ > {pid_file}\nfor i in $(seq 600); do sleep 1; done\n"
    sshd = subprocess.Popen([sys.executable, "-c", SSHD, remote.stdin_command("pull-image")],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    assert sshd.stdin is not None
    sshd.stdin.write(text)
    sshd.stdin.close()
    step_pid = 0
    for _ in range(600):  # bounded waits (0.1 s steps), not timings
        if pid_file.exists() and pid_file.read_text().strip():
            step_pid = int(pid_file.read_text())
            break
        time.sleep(0.1)
    assert step_pid and _alive(step_pid)
    sshd.kill()
    sshd.wait()
    bound = remote.SESSION_POLL_S + remote.STOP_GRACE_S
    for _ in range(int(bound * 10 * 3)):  # three times the bound: the CI machine may be slow
        if not _alive(step_pid):
            break
        time.sleep(0.1)
    assert not _alive(step_pid), "the step still runs after its SSH session ended"


def test_a_step_that_finishes_keeps_its_output_and_status_with_the_watcher() -> None:
    done = subprocess.run(["sh", "-c", remote.stdin_command("code")], input="echo out; echo err >&2; exit 3\n",
                          capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


# ------------------------------------------------------------------------------------------------ case 8
def test_a_destroy_that_keeps_the_nas_records_its_id_for_the_next_up(tmp_path: Path) -> None:
    world = World(tmp_path)
    run = _up(world, "multi")  # storage.retainOnDestroy: true (the default)
    calls = tmp_path / "pulumi-calls"
    (world.bin / "pulumi").write_text(
        f"#!/bin/sh\necho \"$*\" >> {calls}\ncase $2 in get) echo true ;; esac\n")
    result = world.destroy(run.cloud.resources)
    assert result.failed is None, result.error
    kept = str(run.cloud.named("shared-fs").id)
    assert "shared-fs" in result.dropped  # the NAS is kept
    # The stack's outputs are gone with the destroy; its configuration keeps the id for the next `up`.
    assert (f"config set --stack organization/roll-cluster/multi --path roll-cluster:storage.existingFileSystemId "
            f"-- {kept}") in calls.read_text()


def test_the_older_images_of_the_repository_are_pruned_after_a_new_image(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.write_text("registry.example/roll:v1\nregistry.example/roll:v2\nregistry.example/roll:v3\n"
                      "registry.example/roll:<none>\n")
    docker = tmp_path / "docker"
    # A Docker with those images, where v1 is still used by a container; other repositories are not listed.
    docker.write_text(f"""#!/bin/sh
case "$1 $2" in
  "image ls") [ "$6" = registry.example/roll ] && cat {images} ;;
  "image rm") [ "$4" = registry.example/roll:v1 ] && {{ echo "conflict: image is being used" >&2; exit 1; }}
              grep -vxF "$4" {images} > {images}.new; mv {images}.new {images} ;;
esac
""")
    docker.chmod(0o755)
    text = remote.render_plain("prune-images", ["prune_images.sh"], {"IMAGE": "registry.example/roll:v3"},
                              library=remote.local_library())
    done = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
                               "ROLL_CLUSTER_LOG_DIR": str(tmp_path / "logs")})
    assert done.returncode == 0, done.stdout + done.stderr
    assert images.read_text().split() == ["registry.example/roll:v1", "registry.example/roll:v3",
                                          "registry.example/roll:<none>"]
    assert "removed 1 older image(s) of registry.example/roll, kept 1" in done.stdout


# ------------------------------------------------------------------------------------------------ case 5: key rotation
def _login_key(tmp_path: Path, name: str) -> tuple[str, str]:
    """A key file and its public key (the world's ssh reads only which file is given, not its text)."""
    blob = b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + hashlib.sha256(name.encode()).digest()
    public = f"ssh-ed25519 {base64.b64encode(blob).decode()} {name}"
    path = tmp_path / name
    path.write_text("a private key\n")
    return str(path), public


def _access(path: str, public: str) -> dict[str, Any]:
    return {"roll-cluster:access": {"sshPrivateKeyPath": path, "sshPublicKey": public}}


def _world_with_two_keys(tmp_path: Path) -> tuple[World, tuple[str, str], tuple[str, str]]:
    """A world whose user holds an old and a new login key pair, logging in with the old one."""
    world = World(tmp_path)
    old_path, old_public = _login_key(tmp_path, "old-key")
    new_path, new_public = _login_key(tmp_path, "new-key")
    world.identities = {old_path: old_public, new_path: new_public}
    world.login = old_path
    return world, (old_path, old_public), (new_path, new_public)


def test_rotating_the_login_key_on_a_running_stack_then_destroying_from_a_clone(tmp_path: Path) -> None:
    world, (old_path, old_public), (new_path, new_public) = _world_with_two_keys(tmp_path)
    first = _up(world, "multi", _access(old_path, old_public))
    _formed(world, first)
    world.login = new_path  # the user points the stack at the new key pair
    rotated = _up(world, "multi", _access(new_path, new_public), prior=first)
    _formed(world, rotated)
    for machine in world.machines.values():
        accepted = (Path(machine.home) / ".ssh" / "authorized_keys").read_text()
        assert new_public.split()[1] in accepted and old_public.split()[1] not in accepted
    Path(old_path).unlink()  # the old key is gone: the destroy uses the new one
    teammate = tmp_path / "teammate-home"
    teammate.mkdir()
    result = world.destroy(rotated.cloud.resources, home=teammate)
    assert result.failed is None, result.error
    assert "job-delete on node-0" in world.log and world.machines == {}


def test_a_rotation_without_the_previous_key_fails_naming_it(tmp_path: Path) -> None:
    world, (old_path, old_public), (new_path, new_public) = _world_with_two_keys(tmp_path)
    first = _up(world, "multi", _access(old_path, old_public))
    Path(old_path).unlink()
    world.login = new_path
    run = run_program("multi", cloud=first.cloud.next_run(), config=_access(new_path, new_public))
    result = world.up(run.cloud)
    assert result.failed is not None and result.failed[1].endswith("-login-key")
    assert f"Put the previous key back at {old_path}" in str(result.error)
