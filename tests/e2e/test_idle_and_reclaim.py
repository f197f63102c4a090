"""Autostop and reclaimed spot nodes (issue 22) on real hosts, with the program's own commands (program_commands.py):
a stack with `nodes.spot`, `nodes.autostop.afterJobMinutes: 1` and shared storage.

Real: the hosts (sshd, their own process tables and mounts), Ray 2.48 with the head and worker started by the
program's Ray steps, the job submitted by the program's job step, the autostop watcher installed on the head by the
program's own autostop step (its `create`, as pulumi-command runs it over SSH) and removed by its delete, the spot
notice watcher installed on the worker by the program's spot-notice step, `jobStatus` run as the user runs it, and
curl/openssl signing the ECS call on the head.

Stand-ins: Alibaba's metadata service and ECS endpoint (tests/helpers/alibaba_standin.py, on the bridge address the
hosts reach, 198.18.0.1; never an outside address), the NAS (one directory of the test machine mounted at /mnt/shared
on both hosts, and in their real containers) and systemd: the test hosts have none, so the autostop step takes its own
no-systemd path (the same script, with the same settings, as a detached process; the systemd unit would run that
script with those settings too). The endpoints and poll periods reach the scripts as environment variables the
program never sets (ECS_ENDPOINT, METADATA_URL, AUTOSTOP_POLL_S, SPOT_POLL_S: documented test seams), exported
before the step's own command as the hung-probe test of test_cluster_lifecycle.py does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest
from alibaba_standin import CREDENTIALS, AlibabaStandIn
from autostop_sdk import ensure_autostop_sdk
from e2e_harness import BRIDGE_IP, STATE_ROOT, CommandResult, TestHost, TestNetwork
from program_commands import ProgramCommands, render_cluster

from infra.autostop import role_name
from infra.ray.user_commands import JOBS_API_WAIT_S

pytestmark = pytest.mark.e2e

CONTAINER = "idle"
PORTS = (8200, 8201, 8202)
SHARED = STATE_ROOT / "idle-shared"  # the stand-in NAS: mounted at /mnt/shared on both hosts
RECLAIM_DIR = "/mnt/shared/.roll-cluster/reclaimed/multi"
WATCHER_STATE = "/var/lib/roll-cluster-autostop"  # the script's default AUTOSTOP_STATE_DIR (host's private /var/lib)
POLL_S = 2
BOOT_ID_FILE = "/tmp/e2e-boot-id"  # the head's boot id (BOOT_ID_FILE): a new value is a new boot
ROLE = role_name("roll-cluster", "multi", "cn-hangzhou")
T = TypeVar("T")


def wait_until(what: str, probe: Callable[[], T], done: Callable[[T], bool], timeout: float, every: float = 1) -> T:
    """probe() until done(result), at most `timeout` seconds; fails naming `what` and the last result."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if done(result):
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s; last: {result!r}"
        time.sleep(every)


@pytest.fixture(scope="module")
def standin() -> Iterator[AlibabaStandIn]:
    alibaba = AlibabaStandIn(BRIDGE_IP, ROLE, lifetime_s=900).start()
    yield alibaba
    alibaba.stop()


@pytest.fixture(scope="module")
def cluster(network: TestNetwork) -> Iterator[tuple[TestHost, TestHost, ProgramCommands]]:
    head, worker = network.hosts[:2]
    commands = render_cluster(
        [h.ip for h in (head, worker)], str(network.client_key), container=CONTAINER, ports=PORTS,
        entrypoint="python3 -c 'print(\"stand-in job done\")'",
        ray={"readyTimeoutSeconds": 60, "headWaitTimeoutSeconds": 120},
        storage={"nas": True},  # shared storage: where a worker's reclaim notice reaches the head's jobStatus
        nodes={"spot": True, "autostop": {"afterJobMinutes": 1}},
        host_key_files=[h.root / "ssh_host_ed25519_key" for h in (head, worker)],
    )
    network.run_user_command(commands.known_hosts, timeout=30).check()
    SHARED.mkdir(parents=True, exist_ok=True)
    for host in (head, worker):
        # Ray left running by another module in its own container would share this host's ports.
        for other in [name for name in network.containers(host) if name != CONTAINER]:
            network.run(host, f"docker exec {other} ray stop --force || true", timeout=120)
        # The NAS: the same directory at /mnt/shared on both hosts (a tmpfs over /mnt first, in the host's own
        # mount namespace, so that nothing is created in the test machine's /mnt); before the container, which
        # mounts it as the product's container mounts the NAS (a bind mount keeps what was mounted when it started).
        network.run(host, f"mountpoint -q /mnt/shared || {{ mount -t tmpfs e2e-mnt /mnt && mkdir -p /mnt/shared && "
                          f"mount --bind {SHARED} /mnt/shared; }}", timeout=30).check()
        network.create_container(host, CONTAINER, volumes=("/workspace", "/mnt/shared"))
    network.run(head, commands.head).check()
    network.run(worker, commands.workers[0]).check()
    network.run(head, commands.ready).check()
    yield head, worker, commands
    if commands.autostop_remove:
        network.run(head, commands.autostop_remove, timeout=60)
    for host, stop in zip((head, worker), commands.ray_stop, strict=True):
        network.run(host, stop, timeout=120)
        network.run(host, f"docker rm -f {CONTAINER}; umount /mnt/shared; umount /mnt", timeout=60)


def seams(standin: AlibabaStandIn) -> str:
    """The test seams the autostop step reads (never set by the program): the stand-ins, a quick poll, the SDK
    the node's own installation made outside the repository, and a boot id the test controls."""
    return (f"export ECS_ENDPOINT={standin.ecs_url} METADATA_URL={standin.metadata_url} AUTOSTOP_POLL_S={POLL_S} "
            f"AUTOSTOP_SDK_DIR={ensure_autostop_sdk()} BOOT_ID_FILE={BOOT_ID_FILE}\n")


def job_status(network: TestNetwork, commands: ProgramCommands) -> CommandResult:
    return network.run_user_command(commands.outputs["jobStatus"], timeout=JOBS_API_WAIT_S + 60)


def watcher_log(network: TestNetwork, head: TestHost) -> str:
    return network.run(head, f"cat {WATCHER_STATE}/watch.log {WATCHER_STATE}/*.log 2>/dev/null; true").output


def test_after_the_job_ends_autostop_stops_exactly_this_stacks_instances_with_the_roles_credentials(
    network: TestNetwork, cluster: tuple[TestHost, TestHost, ProgramCommands], standin: AlibabaStandIn
) -> None:
    head, _, commands = cluster
    assert commands.submit is not None and commands.autostop is not None and commands.autostop_remove is not None
    assert len(commands.instance_ids) == 2 and all(i.startswith("i-") for i in commands.instance_ids)
    network.run(head, commands.submit, timeout=300).check()
    # The program's autostop step, as `pulumi up` runs it on the head after the job step, pointed at the stand-ins.
    network.run(head, f"echo boot-1 >{BOOT_ID_FILE}").check()
    installed = network.run(head, commands.autostop.prefixed(seams(standin)), timeout=120).check()
    assert "autostop watcher running (no systemd: process" in installed.output, installed.output
    wait_until("the stand-in job succeeded", lambda: job_status(network, commands),
               lambda r: r.returncode == 0 and "succeeded" in r.stdout.lower(), timeout=120, every=2)
    assert standin.calls() == []  # not while it ran, nor the moment it ended: a whole minute after
    # afterJobMinutes: 1 -> the first StopInstances once the watcher has seen the job ended for a whole minute.
    calls = wait_until("a StopInstances call", standin.calls, lambda c: len(c) > 0, timeout=150)
    call = calls[0]
    assert call["Action"] == "StopInstances" and call["StoppedMode"] == "StopCharging", call
    assert call["BatchOptimization"] == "SuccessFirst" and call["method"] == "POST", call
    assert sorted(v for k, v in call.items() if k.startswith("InstanceId.")) == sorted(commands.instance_ids)
    assert call["RegionId"] == "cn-hangzhou"
    # Signed with the role's temporary credentials, which came from the metadata service for this stack's role.
    assert call["AccessKeyId"] == CREDENTIALS["AccessKeyId"] and call["SecurityToken"] == CREDENTIALS["SecurityToken"]
    assert call["signatureValid"] == "True", call
    assert f"/latest/meta-data/ram/security-credentials/{ROLE}" in standin.metadata_paths
    # Exactly one call: the watcher records the stop and keeps running without asking again. Its state says so;
    # then three more of its polls pass (the only way to see that something does not happen) with it alive.
    wait_until("the watcher's stop record", lambda: network.run(head, f"test -f {WATCHER_STATE}/stopped").returncode,
               lambda rc: rc == 0, timeout=30)
    alive = f"kill -0 \"$(cat {WATCHER_STATE}/watch.pid)\""
    settled = time.monotonic() + 3 * POLL_S
    while time.monotonic() < settled:
        assert network.run(head, alive).returncode == 0, watcher_log(network, head)
        time.sleep(0.5)
    assert len(standin.calls()) == 1, standin.calls()
    log = watcher_log(network, head)
    assert f"job {commands.outputs['jobId']} ended (SUCCEEDED)" in log, log
    assert CREDENTIALS["AccessKeySecret"] not in log and CREDENTIALS["SecurityToken"] not in log
    # `pulumi destroy` (or a stack without autostop): the step's delete ends the watcher.
    network.run(head, commands.autostop_remove, timeout=60).check()
    assert network.run(head, f"test -e {WATCHER_STATE}").returncode != 0


def test_after_a_pause_and_a_restart_the_watcher_waits_the_whole_time_again(
    network: TestNetwork, cluster: tuple[TestHost, TestHost, ProgramCommands], standin: AlibabaStandIn
) -> None:
    """nodes.paused, then resumed: the head stops and boots again. The watcher (a service) starts at boot with the
    clock it kept; it must not act on that clock, nor before `pulumi up` has formed the cluster again and run the
    autostop step (its trigger: the head's start time), and from then it waits the whole afterJobMinutes again."""
    head, _, commands = cluster
    assert commands.autostop is not None and commands.autostop_remove is not None
    wait_until("the stand-in job succeeded", lambda: job_status(network, commands),
               lambda r: r.returncode == 0 and "succeeded" in r.stdout.lower(), timeout=300, every=2)
    network.run(head, f"echo boot-1 >{BOOT_ID_FILE}").check()
    network.run(head, commands.autostop.prefixed(seams(standin)), timeout=120).check()
    wait_until("the watcher's clock", lambda: network.run(head, f"test -f {WATCHER_STATE}/ended_since").returncode,
               lambda rc: rc == 0, timeout=60)
    calls_before = len(standin.calls())
    # The pause: the head stops (its watcher with it), an hour after the job ended (the kept clock says so).
    network.run(head, f"kill \"$(cat {WATCHER_STATE}/watch.pid)\"; "
                      f"echo $(($(date +%s) - 3600)) >{WATCHER_STATE}/ended_since").check()
    # The resume: a new boot, and the service starts as the host comes up (as systemd would: the kept copy with the
    # kept settings; the test hosts have no systemd, so it is started here the way the no-systemd install does).
    network.run(head, f"echo boot-2 >{BOOT_ID_FILE}; (. {WATCHER_STATE}/settings.env && export AUTOSTOP_ACTION=watch "
                      f"ROLL_CLUSTER_STEP=autostop && exec setsid bash {WATCHER_STATE}/watcher.sh) </dev/null "
                      f">>{WATCHER_STATE}/watch.log 2>&1 & echo $! >{WATCHER_STATE}/watch.pid").check()
    wait_until("the booted watcher waiting for the step", lambda: watcher_log(network, head),
               lambda log: "this host booted since the step installed the watcher" in log, timeout=60)
    settled = time.monotonic() + 3 * POLL_S
    while time.monotonic() < settled:  # three polls with the hour-old clock: nothing may stop
        time.sleep(0.5)
    assert len(standin.calls()) == calls_before, standin.calls()
    assert network.run(head, f"test -e {WATCHER_STATE}/ended_since").returncode != 0  # the kept clock is gone
    # `pulumi up` formed the cluster again and runs the autostop step: from now, the whole minute again.
    reinstalled_at = time.monotonic()
    network.run(head, commands.autostop.prefixed(seams(standin)), timeout=120).check()
    wait_until("a StopInstances call after the reinstall", standin.calls, lambda c: len(c) > calls_before,
               timeout=180)
    waited = time.monotonic() - reinstalled_at
    assert waited >= 60, f"the watcher stopped the cluster {waited:.0f}s after the step, before afterJobMinutes: 1"
    network.run(head, commands.autostop_remove, timeout=60).check()


def test_a_reclaim_notice_on_a_worker_makes_job_status_say_reclaimed_with_the_node(
    network: TestNetwork, cluster: tuple[TestHost, TestHost, ProgramCommands], standin: AlibabaStandIn
) -> None:
    _, worker, commands = cluster
    assert sorted(commands.spot_notices) == ["node-1"]  # the head is pay-as-you-go
    assert RECLAIM_DIR in commands.outputs["jobStatus"]
    seams = f"export METADATA_URL={standin.metadata_url} SPOT_POLL_S=1\n"
    network.run(worker, commands.spot_notices["node-1"].prefixed(seams), timeout=60).check()
    before = job_status(network, commands)
    assert "RECLAIMED" not in before.output and before.returncode != 4, before.output
    standin.termination_time = "2026-11-25T15:04:00Z"
    reclaimed = wait_until("jobStatus saying RECLAIMED", lambda: job_status(network, commands),
                           lambda r: r.returncode == 4, timeout=60)
    job_id = commands.outputs["jobId"]
    assert reclaimed.stdout.startswith(
        f"job {job_id}: RECLAIMED: Alibaba reclaims spot node node-1 at 2026-11-25T15:04:00Z"), reclaimed.output
    assert "pulumi up --refresh" in reclaimed.stdout
    # The record went through the shared storage: the worker wrote it, the head read it.
    assert (SHARED / ".roll-cluster" / "reclaimed" / "multi" / "node-1").read_text().strip() == "2026-11-25T15:04:00Z"
