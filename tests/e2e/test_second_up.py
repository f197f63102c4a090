"""The second `pulumi up` on real hosts (issue 20, items 3 and 4): a replaced worker gets its container and joins the
head; a second checkout path keeps the host keys the nodes present.

What is real: sshd and the SSH clients with their host-key checks, the node scripts, Ray 2.48.0, the program's own
step commands and its local known-hosts command run from two checkouts. What is modelled: the engine's decisions
(which resource is created, updated, replaced or deleted on the second `up`: devtools/engine_model.py through
`cloud.ops` / `cloud.changes`), and pulumi-docker's RemoteImage and Container, which the tier performs as the image
check and the `docker run` they amount to, against the hosts' real dockerd (program_commands.docker_run_command).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest
from e2e_harness import ADMIN_HOME, REPO, CommandResult, RunningCommand, TestHost, TestNetwork, ensure_jemalloc
from program_commands import HostsProgram, ProgramStep, _local_command, render_cluster, render_hosts_program
from test_program_on_own_hosts import install_standins, run_program_steps, run_step

from devtools.offline_cloud import Registered, unwrap

pytestmark = pytest.mark.e2e

CONTAINER = "rc-second-up"
PORTS = (8600, 8601, 8602)


def hosts_program(network: TestNetwork, hosts: list[TestHost], prior: HostsProgram | None = None) -> HostsProgram:
    return render_hosts_program(
        "hosts", [h.ip for h in hosts], str(network.client_key), accelerators_per_node=2, container=CONTAINER,
        ports=PORTS, entrypoint="python3 -c 'print(1)'", working_dir="/tmp",
        prior=prior.cloud if prior is not None else None)


def run_teardown_delete(network: TestNetwork, resource: Registered) -> CommandResult:
    """A local teardown's delete as pulumi-command runs it (from the old state's inputs) on the admin machine."""
    env = {**os.environ, **{k: str(v) for k, v in unwrap(resource.inputs["environment"]).items()},
           "PATH": f"{network.client_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(ADMIN_HOME),
           "ROLL_CLUSTER_LOG_DIR": str(network.client_bin.parent / "teardown-logs")}
    delete = str(unwrap(resource.inputs["delete"]))
    return RunningCommand("the admin machine", ["bash", "-c", delete], env=env, cwd=str(REPO)).wait(300)


def stop_other_rays(network: TestNetwork, host: TestHost) -> None:
    # Ray left running by another module in its own container would share this host's GPUs in `ray status`.
    for other in [name for name in network.containers(host) if name != CONTAINER]:
        network.run(host, f"docker exec {other} ray stop --force || true", timeout=120)


def test_a_replaced_worker_gets_its_container_and_joins_the_head(network: TestNetwork) -> None:
    head, old_worker, new_worker = network.hosts[:3]
    ensure_jemalloc()
    for host in (head, old_worker, new_worker):
        install_standins(network, host, "nvidia")
        stop_other_rays(network, host)
    first = hosts_program(network, [head, old_worker])
    try:
        # The first `up` (without the job: the second `up` does not change it).
        first_steps = HostsProgram([s for s in first.steps if s.node != "node-0" or not s.key.endswith("/job")],
                                   first.ray_stop, first.job_stop, first.outputs, first.cloud)
        run_program_steps(network, {"node-0": head, "node-1": old_worker}, first_steps)
        # The second `up`: nodes.hosts[1] is another machine (a swapped own host: its identity is its address).
        second = hosts_program(network, [head, new_worker], prior=first)
        assert second.cloud is not None and first.cloud is not None
        changes = second.cloud.changes
        assert changes["node-1-docker-engine"] == "update"  # the provider's host: an update, not a replace
        assert changes["node-1-image"] == "replace" and changes["node-1-container"] == "replace"
        assert changes["node-0-container"] == "same"
        by_resource: dict[str, ProgramStep] = {s.resource: s for s in second.steps}
        prior = {r.name: r for r in first.cloud.resources}
        by_node = {"node-0": head, "node-1": new_worker}
        done: list[tuple[str, str, CommandResult]] = []
        # What the engine does, in its order: a create, update or replace runs the step (pulumi-command re-runs
        # `create` on an update), a delete of a local teardown runs its old `delete`. The deletes of remote steps
        # without `delete`, of the image (keep_locally) and of the container are not run here: the container's
        # delete goes through the provider, now pointing at the new host, where the provider ignores "No such
        # container" (UNCONFIRMED on real pulumi-docker; here: nothing to remove there).
        for verb, name in second.cloud.ops:
            if verb in ("create", "update", "replace") and name in by_resource:
                step = by_resource[name]
                result = run_step(network, by_node, step)
            elif verb == "delete" and name.endswith("-teardown") and name in prior:
                result = run_teardown_delete(network, prior[name])
            else:
                continue
            done.append((verb, name, result))
            assert result.returncode == 0, f"{verb} {name} failed:\n{result.output}"
        ran = {name for _, name, _ in done}
        assert {"node-1-image", "node-1-container", "node-1-ray-worker", "ray-ready"} <= ran, ran
        assert not any("No such container" in r.output for _, _, r in done)
        running = network.run(new_worker, f"docker inspect --format '{{{{.State.Running}}}}' {CONTAINER}").check()
        assert running.stdout.strip() == "true", running.output
        # ray-ready (the program's gate: exactly the expected nodes alive, with their GPUs; it names a missing or an
        # unexpected one) passed, expecting the new host's address.
        ready = next(r for _, n, r in done if n == "ray-ready")
        # The head's own view, waited for (bounded): two alive nodes.
        deadline = time.monotonic() + 90
        while True:
            status = network.run(head, f"docker exec {CONTAINER} ray status --address {head.ip}:{PORTS[0]}")
            active = status.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
            if status.returncode == 0 and len(re.findall(r"^\s*\d+ node_", active, flags=re.MULTILINE)) == 2:
                break
            assert time.monotonic() < deadline, f"not 2 alive nodes on the head:\n{status.output}"
            time.sleep(2)
        gate = by_resource["ray-ready"].command
        assert new_worker.ip in gate + str(getattr(gate, "stdin", "")), "the gate does not expect the new host"
        assert "cluster ready: 2 of 2 nodes" in ready.output, ready.output
        # The old worker was stopped by its teardown (teardowns follow the machine they ran on).
        assert network.run(old_worker, "pgrep -x raylet || :").stdout.strip() == ""
    finally:
        for host, stop in ((head, first.ray_stop[0]), (old_worker, first.ray_stop[1]), (new_worker, first.ray_stop[1])):
            network.run(host, stop, timeout=180)
        for host in (head, old_worker, new_worker):
            network.run(host, f"docker rm -f {CONTAINER}", timeout=60)


def verifies(network: TestNetwork, host: TestHost, known_hosts: Path) -> CommandResult:
    """ssh with only `known_hosts` and StrictHostKeyChecking=yes (no test config), as the program's clients do."""
    argv = ["/usr/bin/ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "IdentityAgent=none", "-o", "ConnectTimeout=10", "-i", str(network.client_key),
            f"root@{host.ip}", "true"]
    return RunningCommand("the admin machine", argv).wait(60)


def test_a_second_checkout_path_keeps_the_host_keys(network: TestNetwork, tmp_path: Path) -> None:
    hosts = network.hosts[:2]
    first = render_cluster([h.ip for h in hosts], str(network.client_key),
                           host_key_files=[h.root / "ssh_host_ed25519_key" for h in hosts])
    network.run_user_command(first.known_hosts, timeout=30).check()
    known_hosts = Path(str(first.outputs["knownHostsFile"]).replace("~", str(ADMIN_HOME), 1))
    assert known_hosts.is_file(), known_hosts
    for host in hosts:
        verifies(network, host, known_hosts).check()

    # A teammate's checkout at another path (or CI's): the same commit, another directory.
    other = tmp_path / "teammate" / "roll-cluster"
    subprocess.run(["git", "clone", "-q", "--shared", str(REPO), str(other)], check=True)
    # Nothing the program registers names the checkout it runs from, so the teammate's program registers the same
    # inputs as this one (rendered here) and the engine compares them with the first run's state.
    assert not [r.name for r in first.cloud.resources if str(REPO) in repr(unwrap(r.inputs))]
    # No host key handed to the second run: a host-key command that ran again would produce another key.
    second = render_cluster([h.ip for h in hosts], str(network.client_key), prior=first.cloud)
    host_keys = {n: c for n, c in second.cloud.changes.items() if n.endswith("-host-key")}
    assert host_keys and set(host_keys.values()) == {"same"}, host_keys
    # The engine leaves the file as it is ("same"); the worst case, an update (its `create` again, from the
    # teammate's checkout, with the keys of the state), must keep it verifying too.
    inputs = dict(unwrap(second.cloud.named("known-hosts").inputs))
    from_other = _local_command(inputs, checkout=other)
    assert from_other.startswith(f"cd {shlex.quote(str(other))} && "), from_other
    network.run_user_command(from_other, timeout=30).check()
    for host in hosts:
        verifies(network, host, known_hosts).check()
    # The check can fail: a regenerated key (what host_key.sh would print again) is refused by the real host.
    fresh = tmp_path / "fresh_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(fresh)], check=True)
    wrong = tmp_path / "regenerated.known_hosts"
    wrong.write_text(f"{hosts[0].ip} {' '.join(fresh.with_name('fresh_key.pub').read_text().split()[:2])}\n")
    refused = verifies(network, hosts[0], wrong)
    assert refused.returncode != 0 and "Host key verification failed" in refused.output, refused.output
