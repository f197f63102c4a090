"""A cluster that stays right (issue 11), on real hosts with the program's own commands (program_commands.py): a
changed object-store size restarts Ray and shows in `ray status`; a rebooted node (every process of the host
killed, its init started again) rejoins without `pulumi up`, a rebooted head comes back with its workers and
`jobStatus` says the job was lost, with the command that submits it again; a hung probe is cut at its bound; a
teardown against a host whose key changed fails and stops nothing; `pulumi destroy`'s teardown commands finish with
one host gone.

Two of the session's hosts: e2e-h0 the head, e2e-h1 a worker. The containers run the program's own container
command (container_main.sh) with restart policy unless-stopped, which the host's real dockerd honours at boot.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from e2e_harness import REPO, CommandResult, TestHost, TestNetwork
from program_commands import ProgramCommands, render_cluster

from devtools.offline_cloud import unwrap
from infra.ray.user_commands import JOBS_API_WAIT_S

pytestmark = pytest.mark.e2e

CONTAINER = "life"
SECRET = "e2e-wandb-lifecycle-4f2a"
GIB = 1024**3


def commands_for(network: TestNetwork, object_store_gb: float, entrypoint: str | None = None) -> ProgramCommands:
    hosts = network.hosts[:2]
    return render_cluster(
        [h.ip for h in hosts], str(network.client_key), container=CONTAINER,
        **({"entrypoint": entrypoint} if entrypoint else {}),
        ray={"objectStoreMemoryGb": object_store_gb, "readyTimeoutSeconds": 90, "headWaitTimeoutSeconds": 120},
        secrets={"wandbApiKey": SECRET},
        # The hosts' real host keys, as if the program had generated them: its teardowns verify them.
        host_key_files=[h.root / "ssh_host_ed25519_key" for h in hosts],
    )


def ray_status(network: TestNetwork, head: TestHost) -> CommandResult:
    return network.run(head, f"docker exec {CONTAINER} ray status --address {head.ip}:6379", timeout=60)


def alive_nodes(status: str) -> int:
    active = status.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return len(re.findall(r"^\s*\d+ node_", active, flags=re.MULTILINE))


def wait_for_nodes(network: TestNetwork, head: TestHost, count: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        status = ray_status(network, head)
        if status.returncode == 0 and alive_nodes(status.stdout) == count:
            return status.stdout
        assert time.monotonic() < deadline, f"not {count} nodes after {timeout}s:\n{status.output}"
        time.sleep(2)


def object_store_mib(status: str) -> float:
    """The cluster's total object store in MiB from `ray status` (`0B/190.73MiB object_store_memory`)."""
    match = re.search(r"/([\d.]+)(GiB|MiB|KiB) object_store_memory", status)
    assert match, status
    scale = {"GiB": 1024.0, "MiB": 1.0, "KiB": 1 / 1024}[match.group(2)]
    return float(match.group(1)) * scale


def secret_on_a_command_line(host: TestHost) -> list[str]:
    pids = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if SECRET.encode() in cmdline:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace")[:200])
    return found


@pytest.fixture(scope="module")
def cluster(network: TestNetwork) -> Iterator[tuple[TestHost, TestHost, ProgramCommands]]:
    head, worker = network.hosts[:2]
    commands = commands_for(network, 0.1)
    # The stack's known-hosts file, written by the program's own local command (as `pulumi up` would).
    network.run_user_command(commands.known_hosts, timeout=30).check()
    for host in (head, worker):
        # Ray left running by another module in its own container would share this host's ports and GPUs.
        for other in [name for name in network.containers(host) if name != CONTAINER]:
            network.run(host, f"docker exec {other} ray stop --force || true", timeout=120)
        network.create_container(host, CONTAINER, command=commands.container_command)
    network.run(head, commands.head).check()
    network.run(worker, commands.workers[0]).check()
    network.run(head, commands.ready).check()
    yield head, worker, commands
    for host in (head, worker):
        network.run(host, f"docker rm -f {CONTAINER}", timeout=60)


def test_a_changed_object_store_size_restarts_ray_and_shows_in_ray_status(network, cluster):
    head, worker, _ = cluster
    # `ray status` shows the autoscaler's view, which follows the GCS (what the ready gate reads) by a few seconds.
    before = wait_for_nodes(network, head, 2, timeout=180)
    small = object_store_mib(before)
    after = commands_for(network, 0.2)
    restarted = network.run(head, after.head).check()
    assert "settings changed (--object-store-memory" in restarted.output, restarted.output
    # The worker's raylet left with the old head; the worker step joins again with the new size (or, had its
    # container's main process rejoined it first with the old record, names the difference and restarts it).
    rejoined = network.run(worker, after.workers[0]).check()
    assert "join 198.18.0.11:6379" in rejoined.output or "settings changed" in rejoined.output, rejoined.output
    network.run(head, after.ready).check()
    assert abs(small - 2 * 0.1 * 1024) < 2, before
    deadline = time.monotonic() + 60
    while True:
        big = object_store_mib(wait_for_nodes(network, head, 2, timeout=180))
        if abs(big - 2 * 0.2 * 1024) < 2:
            break
        assert time.monotonic() < deadline, (small, big)
        time.sleep(2)
    # The same settings again: Ray is left as it is.
    again = network.run(head, after.head).check()
    assert "leaving it as it is (it runs with the settings asked for)" in again.output
    for result in (restarted, rejoined, again):
        assert SECRET not in result.output


def test_a_rebooted_worker_rejoins_without_pulumi_up(network, cluster):
    head, worker, _ = cluster
    wait_for_nodes(network, head, 2, timeout=120)
    network.reboot(worker)
    # The host's dockerd restarted the container at boot; its main process rejoins from the recorded settings.
    wait_for_nodes(network, head, 2, timeout=300)
    log = network.run(worker, f"docker exec {CONTAINER} cat /var/lib/roll-cluster/ray/supervisor.log").check()
    assert "starting Ray (worker" in log.stdout and SECRET not in log.stdout
    for host in (head, worker):
        assert secret_on_a_command_line(host) == [], host.name


def job_status_until(network: TestNetwork, command: str, reached: Callable[[CommandResult], bool],
                     timeout: float) -> CommandResult:
    """Run the jobStatus output until it shows what `reached` wants (a job still PENDING on a loaded machine, a
    head whose Jobs API comes up late), bounded; the last answer otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        result = network.run_user_command(command, timeout=JOBS_API_WAIT_S + 60)
        if reached(result) or time.monotonic() > deadline:
            return result
        time.sleep(3)


def dashboard_log_tail(host: TestHost, lines: int = 40) -> str:
    """The end of the head's Ray dashboard logs (the Jobs API), for a failure message."""
    logs = sorted((host.root / "tmp" / "ray").glob("session_*/logs/dashboard*.*"), key=lambda p: p.stat().st_mtime)
    return "".join(f"\n--- {p}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) for p in logs[-3:])


def is_running(result: CommandResult) -> bool:
    return result.returncode == 0 and "RUNNING" in result.stdout


def supervisor_log(network: TestNetwork, host: TestHost) -> str:
    return network.run(host, f"docker exec {CONTAINER} cat /var/lib/roll-cluster/ray/supervisor.log").check().stdout


def test_a_rebooted_head_comes_back_the_workers_rejoin_and_job_status_says_the_job_was_lost(network, cluster):
    head, worker, _ = cluster
    wait_for_nodes(network, head, 2, timeout=180)
    # A job that runs until stopped, submitted by the program's own job step (as `pulumi up` does).
    long = commands_for(network, 0.2, entrypoint="sleep 3600")
    assert long.submit is not None and long.job_stop is not None
    network.run(head, long.submit, timeout=300).check()
    running = job_status_until(network, long.outputs["jobStatus"], is_running, timeout=300)
    assert is_running(running), running.output
    worker_starts = supervisor_log(network, worker).count("starting Ray (worker")
    try:
        network.reboot(head)
        # The head's main process starts the head from its record; each worker's raylet exits once it has lost the
        # old head's GCS (Ray's reconnect timeout, 60 s by default, or at once on meeting the new GCS), and the
        # worker's main process rejoins the new head. No `pulumi up`.
        wait_for_nodes(network, head, 2, timeout=480)
        assert "starting Ray (head" in supervisor_log(network, head)
        assert supervisor_log(network, worker).count("starting Ray (worker") > worker_starts
        # The job did not survive, and jobStatus says so in plain words, with the command that submits it again.
        # The head's Jobs API (its dashboard process) answers some time after the GCS that `ray status` reads:
        # jobStatus waits for it (bounded, saying so) and the test waits for the answer, not for a guessed time.
        lost = job_status_until(network, long.outputs["jobStatus"], lambda r: r.returncode == 3, timeout=600)
        assert lost.returncode == 3, lost.output + dashboard_log_tail(head)
        assert f"job {long.outputs['jobId']}: LOST" in lost.stdout and "Traceback" not in lost.output
        assert long.outputs["jobResubmit"] in lost.stdout
        # What `pulumi up --replace <job URN>` runs: the job's delete (nothing to stop), then its create, which
        # finds no job of its id on the new head and submits it.
        network.run(head, long.job_stop, timeout=180).check()
        again = network.run(head, long.submit, timeout=300).check()
        assert "already exists" not in again.output, again.output
        back = job_status_until(network, long.outputs["jobStatus"], is_running, timeout=300)
        assert is_running(back), back.output
        for host in (head, worker):
            assert secret_on_a_command_line(host) == [], host.name
    finally:
        network.run(head, long.job_stop, timeout=180)


def test_a_hung_probe_is_cut_at_its_bound(network, cluster):
    head, _, _ = cluster
    commands = commands_for(network, 0.2)
    # From now on every `ray status` in the head's container hangs (the image's `ray` moved aside for one that
    # sleeps, named e2e-hung-exec, on `status`): the probe's `docker exec` never returns.
    ray = "/opt/ray/bin/ray"
    hang = (f"mv {ray} {ray}.e2e-real && printf '%s\\n' '#!/bin/bash' "
            f"'[ \"$1\" != status ] || exec -a e2e-hung-exec sleep 3600' 'exec {ray}.e2e-real \"$@\"' >{ray} "
            f"&& chmod +x {ray}")
    network.run(head, f"docker exec {CONTAINER} sh -c {shlex.quote(hang)}", timeout=60).check()
    try:
        bound, probe = 6, 3
        started = time.monotonic()
        limits = f"export RAY_START_TIMEOUT_S={bound} PROBE_TIMEOUT_S={probe}\n"
        result = network.run(head, commands.head.prefixed(limits), timeout=120)
        seconds = time.monotonic() - started
    finally:
        # What the hung `ray status` calls left inside the container: Docker does not end an exec's process when
        # its client is killed, so the probe's watchdog (which ends the client) leaves them; the test removes them.
        restore = f"mv {ray}.e2e-real {ray}; pkill -f '[e]2e-hung-exec' || true"
        network.run(head, f"docker exec {CONTAINER} sh -c {shlex.quote(restore)}", timeout=60).check()
    assert result.returncode != 0 and f"timed out after {bound}s waiting for ray status" in result.output, result.output
    assert "did not answer within" in result.output
    assert seconds < bound + probe + 15, seconds  # the rest: ssh and the step's own checks before the wait
    # The watchdog ended the probe's whole process tree on the host: no `docker exec` client is left hanging.
    leftover = network.run(head, "pgrep -af '[d]ocker exec .*ray status' || true").stdout.strip()
    assert leftover == "", leftover


def run_teardown(network: TestNetwork, env: Mapping[str, str]) -> CommandResult:
    from e2e_harness import ADMIN_HOME, RunningCommand

    # As `pulumi destroy` runs it on the admin's machine, whose home holds the stack's known-hosts file.
    local_env = {**os.environ, **env, "PATH": f"{network.client_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
                 "HOME": str(ADMIN_HOME),
                 "ROLL_CLUSTER_LOG_DIR": str(network.client_bin.parent / "teardown-logs")}
    return RunningCommand("the admin machine", ["bash", "infra/scripts/local/teardown.sh"],
                          env=local_env, cwd=str(REPO)).wait(300)


def test_destroy_against_a_host_whose_key_changed_fails_and_stops_nothing(network, cluster, tmp_path):
    # Another machine answers at the worker's address (as after a replacement outside the program): the real ssh
    # refuses it against the host key the state recorded for the node (the teardown's HOST_PUBLIC_KEY), and the
    # teardown must fail naming where that key comes from, not count the node as gone.
    _, worker, commands = cluster
    (worker_teardown,) = [env for env in commands.teardowns if env["HOST"] == worker.ip]
    other_key = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    other_public = " ".join(other_key.with_name("other_host_key.pub").read_text().split()[:2])
    assert worker_teardown["HOST_PUBLIC_KEY"].split()[1] != other_public.split()[1]
    ray_record = f"docker exec {CONTAINER} ls /var/lib/roll-cluster/ray"
    assert "start" in network.run(worker, ray_record).check().stdout.split()  # Ray is recorded to run there
    result = run_teardown(network, {**worker_teardown, "HOST_PUBLIC_KEY": other_public})
    assert result.returncode == 1, result.output
    assert "nothing left to stop there" not in result.output  # not counted as gone
    assert f"the host key of {worker.ip} does not match" in result.output
    assert "the stack's state (this teardown's HOST_PUBLIC_KEY)" in result.output
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.output  # ssh's own words, from the step log
    # Nothing was stopped: `ray stop` would have removed the record (see the next test).
    assert "start" in network.run(worker, ray_record).check().stdout.split()


def test_destroy_with_one_host_gone_finishes(network, cluster):
    head, worker, _ = cluster
    commands = commands_for(network, 0.2)
    network.power_off(worker)
    try:
        started = time.monotonic()
        results: list[CommandResult] = []

        def teardown(resource: Any) -> str | None:
            # The destroy's local deletes that reach the nodes, for real; the engine model (devtools/engine_model.py)
            # orders them with every other delete and fails a delete that dials the unreachable worker itself.
            if not resource.name.endswith("-teardown"):
                return None
            env = {k: str(v) for k, v in unwrap(resource.inputs["environment"]).items()}
            results.append(run_teardown(network, env))
            return None if results[-1].returncode == 0 else results[-1].output

        destroyed = commands.cloud.destroy(unreachable={worker.ip}, local=teardown)
        seconds = time.monotonic() - started
        assert destroyed.failed is None, destroyed.error
        instances = {r.name for r in commands.cloud.of_type("alicloud:ecs/instance:Instance")}
        assert instances == {"node-0-instance", "node-1-instance"} and instances <= set(destroyed.deleted)
        assert len(results) == len(commands.teardowns)
        assert seconds < 120, seconds
        gone = [r for r in results if "is gone" in r.output]
        assert len(gone) == 1 and worker.ip in gone[0].output
        assert ray_status(network, head).returncode != 0  # the head's Ray is stopped
        record = network.run(head, f"docker exec {CONTAINER} ls /var/lib/roll-cluster/ray").check()
        assert "start" not in record.stdout.split()  # nothing restarts Ray there any more
    finally:
        network.reboot(worker)
