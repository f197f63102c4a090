"""A cluster's life on three real hosts, with seed 004's ports (GCS 8100, dashboard 8101, client 8102): workers
that start before the head, the readiness gate, a custom job with a task on every node, the user's jobStatus and
jobLogs commands, the reward server, a worker moving to another head (Ray's default ports), and teardown. Every
step runs twice and the second run changes nothing.

Stand-ins: GPUs (Ray is told `--num-gpus=2` per node; nothing here uses a GPU) and the reward model (a plain HTTP
server in place of OpenRLHF's serve_rm, which needs a GPU and a model). SSH, sshd, bash, the scripts, each host's
dockerd with its containers and Ray 2.48.0 in them are real.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections.abc import Iterator

import e2e_steps as steps
import pytest
from e2e_harness import UNREACHABLE_IP, CommandResult, TestHost, TestNetwork

from infra.ray import step_env, user_commands

pytestmark = pytest.mark.e2e

CONTAINER = "roll"
SECRET = "e2e-wandb-secret-5b8d1c"  # must never appear in any step's output or log
SECRETS = {"WANDB_API_KEY": SECRET}
SETTINGS = step_env.RaySettings(
    container_name=CONTAINER,
    gpus_per_node=2,
    ports=step_env.RayPorts(gcs=8100, dashboard=8101, client=8102),
    dashboard_host="0.0.0.0",
    temp_dir="/tmp/ray-data",  # the hosts' /tmp is private to each
    spill_dir="/tmp/ray-spill",
    object_store_memory=100 * 1024 * 1024,  # small: three Ray nodes share one machine
    num_cpus=1,
    extra_env_names=("WANDB_API_KEY",),
    head_wait_timeout_s=180,
    ready_timeout_s=60,
)

# The job: one task pinned to every alive node reports the node's IP, NODE_RANK and (a digest of) the secret the
# raylet got; then the driver overfills the 100 MB object store so that Ray spills to the spill directory.
SPREAD_PY = """
import hashlib, os, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

print("argv:", sys.argv[1:], flush=True)
print("prepared:", open("prepared.txt").read().split(), flush=True)
ray.init()

@ray.remote(num_cpus=1)
def where():
    key = os.environ.get("WANDB_API_KEY", "")
    digest = hashlib.sha256(key.encode()).hexdigest()[:16] if key else "unset"
    return ray.util.get_node_ip_address(), os.environ.get("NODE_RANK", "unset"), digest

nodes = [node for node in ray.nodes() if node["Alive"]]
pinned = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()
          for node in nodes]
for ip, rank, digest in sorted(ray.get(pinned)):
    print(f"task on node {ip} rank {rank} key {digest}", flush=True)
held = [ray.put(b"x" * 30_000_000) for _ in range(6)]
print("objects held:", len(held), flush=True)
"""
DEFAULT_PORTS = dataclasses.replace(
    SETTINGS, ports=step_env.RayPorts(), dashboard_host="127.0.0.1", temp_dir="", spill_dir="", extra_env_names=()
)
JOB_DIR = "/tmp/e2e-job"
SPREAD_JOB = step_env.JobSubmission(
    job_id="e2e-spread-1",
    workdir=JOB_DIR,
    # Quotes and a dollar sign: the entrypoint must reach bash exactly as written.
    entrypoint="""python3 spread.py --label "two words" '$HOME stays'""",
    files={f"{JOB_DIR}/spread.py": SPREAD_PY},
    prepare="echo prepared-once >> prepared.txt",
    pre_submit_check="python3 -c 'import ray' && test -s spread.py",
)


@pytest.fixture(scope="module")
def hosts(network: TestNetwork) -> Iterator[list[TestHost]]:
    for host in network.hosts:
        network.create_container(host, CONTAINER)
    yield network.hosts
    # Leave the hosts clean for the next module, also when a test here failed.
    network.run(network.hosts[0], steps.reward_stop(SETTINGS, network.hosts[0]))
    network.run_parallel([(host, steps.ray_stop(SETTINGS, host)) for host in network.hosts])


def alive_node_ids(network: TestNetwork, head: TestHost) -> list[str]:
    probe = (
        f"docker exec {CONTAINER} python3 -c \"import ray; ray.init(address='{head.ip}:8100', logging_level='ERROR');"
        " print(sorted(n['NodeID'] for n in ray.nodes() if n['Alive']), len(ray.nodes()))\""
    )
    return network.run(head, probe).check().stdout.strip().splitlines()[-1:]


def job_status(network: TestNetwork, head: TestHost, job_id: str) -> CommandResult:
    return network.run_user_command(
        user_commands.job_status_command(head.ip, str(network.client_key), CONTAINER, job_id, SETTINGS.ports.dashboard)
    )


def wait_for_job(network: TestNetwork, head: TestHost, job_id: str, wanted: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while True:
        output = job_status(network, head, job_id).output
        if wanted in output:
            return output
        assert time.monotonic() < deadline, f"job {job_id} not {wanted} after {timeout}s:\n{output}"
        time.sleep(1)


def assert_secret_hidden(network: TestNetwork, *results: CommandResult) -> None:
    for result in results:
        assert SECRET not in result.output
    for host in network.hosts:
        for log in host.private_path("/var/log/roll-cluster").glob("*"):
            assert SECRET not in log.read_text(errors="replace"), f"{log} holds the secret"


def test_worker_started_before_the_head_joins_once_the_head_is_up(network: TestNetwork, hosts: list[TestHost]) -> None:
    head, early = hosts[0], hosts[1]
    waiting = network.start_command(early, steps.worker(SETTINGS, early, head.ip, 1, SECRETS))
    started = network.run(head, steps.head(SETTINGS, head, SECRETS)).check()
    joined = waiting.wait(timeout=180).check()

    assert "start the Ray head (2 GPUs, GCS port 8100, node rank 0)" in started.stdout
    assert "Ray head is up: address 198.18.0.11:8100, dashboard 0.0.0.0:8101" in started.stdout
    assert "waiting up to 180s for the head 198.18.0.11:8100" in joined.stdout
    assert "join 198.18.0.11:8100 (2 GPUs, node rank 1)" in joined.stdout
    assert_secret_hidden(network, started, joined)


def test_readiness_gate_passes_with_every_node_and_gpu(network: TestNetwork, hosts: list[TestHost]) -> None:
    head, late = hosts[0], hosts[2]
    network.run(late, steps.worker(SETTINGS, late, head.ip, 2, SECRETS)).check()
    ready = network.run(head, steps.ready(SETTINGS, head, [h.ip for h in hosts])).check()
    assert "cluster ready: 3 of 3 nodes, 6 of 6 GPUs" in ready.stdout


def test_every_cluster_step_run_twice_changes_nothing(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    before = alive_node_ids(network, head)
    again = network.run_parallel(
        [
            (head, steps.head(SETTINGS, head, SECRETS)),
            (hosts[1], steps.worker(SETTINGS, hosts[1], head.ip, 1, SECRETS)),
            (hosts[2], steps.worker(SETTINGS, hosts[2], head.ip, 2, SECRETS)),
        ]
    )
    for result in again:
        result.check()
    ready = network.run(head, steps.ready(SETTINGS, head, [h.ip for h in hosts])).check()

    assert "the Ray head already runs in roll at 198.18.0.11:8100; leaving it as it is" in again[0].stdout
    for result in again[1:]:
        assert "has already joined the head 198.18.0.11:8100; leaving it as it is" in result.stdout
        assert "join 198.18.0.11" not in result.stdout
    assert "cluster ready: 3 of 3 nodes, 6 of 6 GPUs" in ready.stdout
    # Same alive nodes, and no node that died and came back (the count includes dead nodes).
    assert alive_node_ids(network, head) == before


def test_readiness_gate_names_a_missing_node_and_the_gpu_shortfall(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    impatient = dataclasses.replace(SETTINGS, ready_timeout_s=3)
    result = network.run(head, steps.ready(impatient, head, [*(h.ip for h in hosts), UNREACHABLE_IP]))
    assert result.returncode != 0
    assert f"cluster not ready after 3s: 3 of 4 nodes, 6 of 8 GPUs (short by 2); missing nodes: {UNREACHABLE_IP}" in (
        result.stderr
    )
    assert result.seconds < 60


def test_readiness_gate_takes_an_unexpected_node_out(network: TestNetwork, hosts: list[TestHost]) -> None:
    # A node the configuration no longer has (a scale-in: Pulumi deletes it only after every other step, so after
    # this gate): the gate stops its Ray with a task pinned to it, and the cluster is the expected one.
    head, removed = hosts[0], hosts[2]
    result = network.run(head, steps.ready(SETTINGS, head, [hosts[0].ip, hosts[1].ip])).check()
    assert "stopping Ray on 198.18.0.13: not a node of this cluster any more" in result.stdout
    assert "cluster ready: 2 of 2 nodes, 4 of 4 GPUs" in result.stdout
    # Its start record went with it: the container's main process does not start it again. Its worker step does.
    network.run(removed, steps.worker(SETTINGS, removed, head.ip, 2, SECRETS)).check()
    network.run(head, steps.ready(SETTINGS, head, [h.ip for h in hosts])).check()


def test_readiness_gate_names_nodes_with_too_few_gpus(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    wants_four = dataclasses.replace(SETTINGS, gpus_per_node=4, ready_timeout_s=2)
    result = network.run(head, steps.ready(wants_four, head, [h.ip for h in hosts]))
    assert result.returncode != 0
    assert (
        "6 of 12 GPUs (short by 6); nodes without 4 GPUs: 198.18.0.11 has 2, 198.18.0.12 has 2, 198.18.0.13 has 2"
        in (result.stderr)
    )


def test_custom_job_runs_a_task_on_every_node(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    submitted = network.run(head, steps.submit(SETTINGS, head, SPREAD_JOB)).check()
    assert "wrote /tmp/e2e-job/spread.py" in submitted.stdout
    assert re.search(r"job e2e-spread-1 (is RUNNING|has already SUCCEEDED)", submitted.stdout)

    wait_for_job(network, head, "e2e-spread-1", "Job 'e2e-spread-1' succeeded")
    logs = network.run_user_command(
        user_commands.job_logs_command(head.ip, str(network.client_key), CONTAINER, "e2e-spread-1",
                                       SETTINGS.ports.dashboard)
    ).check()

    digest = hashlib.sha256(SECRET.encode()).hexdigest()[:16]
    for rank, host in enumerate(hosts):
        assert f"task on node {host.ip} rank {rank} key {digest}" in logs.stdout
    assert "argv: ['--label', 'two words', '$HOME stays']" in logs.stdout
    assert "prepared: ['prepared-once']" in logs.stdout  # JOB_PREPARE ran in JOB_WORKDIR, the job runs there
    assert "objects held: 6" in logs.stdout
    assert list(head.private_path("/tmp/ray-spill").glob("ray_spilled_objects*")), "nothing spilled to RAY_SPILL_DIR"
    assert_secret_hidden(network, submitted, logs)


def test_job_submit_run_twice_does_not_submit_again(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    again = network.run(head, steps.submit(SETTINGS, head, SPREAD_JOB)).check()
    assert "job e2e-spread-1 already exists (SUCCEEDED): not submitting it again" in again.stdout
    assert head.private_path(f"{JOB_DIR}/prepared.txt").read_text() == "prepared-once\n"


def test_a_job_that_fails_at_once_fails_the_step_with_its_log(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    failing = step_env.JobSubmission(job_id="e2e-fails", workdir="/tmp", entrypoint="echo exploding-marker-42; exit 3")
    first = network.run(head, steps.submit(SETTINGS, head, failing))
    second = network.run(head, steps.submit(SETTINGS, head, failing))

    assert first.returncode != 0
    assert "job e2e-fails is FAILED right after its submission" in first.stderr
    assert "exploding-marker-42" in first.stderr
    assert second.returncode != 0
    assert "job e2e-fails already exists and is FAILED" in second.stderr
    assert "exploding-marker-42" in second.stderr


def test_a_failed_pre_submit_check_submits_nothing(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    checked = step_env.JobSubmission(
        job_id="e2e-unchecked", workdir="/tmp", entrypoint="true", pre_submit_check="test -f /tmp/no-such-config.yaml"
    )
    result = network.run(head, steps.submit(SETTINGS, head, checked))
    assert result.returncode != 0
    assert "the pre-submit check failed, the job was not submitted: test -f /tmp/no-such-config.yaml" in result.stderr
    assert "does not exist" in job_status(network, head, "e2e-unchecked").output


def test_job_stop_stops_a_running_job_and_tolerates_none(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    sleeper = step_env.JobSubmission(job_id="e2e-sleeper", workdir="/tmp", entrypoint="sleep 600", settle_s=1)
    network.run(head, steps.submit(SETTINGS, head, sleeper)).check()
    stopped = network.run(head, steps.job_stop(SETTINGS, head, "e2e-sleeper")).check()
    again = network.run(head, steps.job_stop(SETTINGS, head, "e2e-sleeper")).check()
    unknown = network.run(head, steps.job_stop(SETTINGS, head, "e2e-never-submitted")).check()

    assert "job e2e-sleeper is RUNNING: stopping it" in stopped.stdout
    assert "job e2e-sleeper is STOPPED" in stopped.stdout
    # Deleted from Ray once stopped: a revert submits the same id again (job_submit.sh refuses a STOPPED one).
    assert "deleted job e2e-sleeper (STOPPED) from Ray" in stopped.stdout
    assert "The Ray head does not know it" in job_status(network, head, "e2e-sleeper").output
    assert "there is no job e2e-sleeper: nothing to stop" in again.stdout
    network.run(head, steps.submit(SETTINGS, head, sleeper)).check()  # the same id, accepted again
    network.run(head, steps.job_stop(SETTINGS, head, "e2e-sleeper")).check()
    assert "there is no job e2e-never-submitted: nothing to stop" in unknown.stdout


def reward_server_pid(network: TestNetwork, head: TestHost, port: int) -> str:
    result = network.run(head, f"pgrep -f '^python3 -m http[.]server {port}' || :")
    return result.stdout.strip()


def reward_port_answers(network: TestNetwork, head: TestHost, port: int) -> bool:
    probe = f"timeout 3 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'"
    return network.run(head, probe).returncode == 0


def test_reward_server_is_supervised_single_and_stoppable(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    # Stand-in for OpenRLHF's serve_rm (needs a GPU and a model): any server that listens on the port.
    server = step_env.RewardServer(
        command="exec python3 -m http.server 5001 --bind 127.0.0.1", port=5001, health_timeout_s=30
    )
    started = network.run(head, steps.reward_server(SETTINGS, head, server)).check()
    first_pid = reward_server_pid(network, head, 5001)
    again = network.run(head, steps.reward_server(SETTINGS, head, server)).check()

    assert "the reward server answers on port 5001" in started.stdout
    assert "the reward server already runs under its supervisor in roll" in again.stdout
    assert first_pid and reward_server_pid(network, head, 5001) == first_pid  # one instance, not restarted

    network.run(head, f"kill {first_pid}").check()
    deadline = time.monotonic() + 30
    while not (
        reward_server_pid(network, head, 5001) not in ("", first_pid) and reward_port_answers(network, head, 5001)
    ):
        assert time.monotonic() < deadline, "the supervisor did not restart the reward server"
        time.sleep(0.5)

    stopped = network.run(head, steps.reward_stop(SETTINGS, head)).check()
    stopped_again = network.run(head, steps.reward_stop(SETTINGS, head)).check()
    assert "stopping the reward servers of /tmp/roll-cluster-reward-5001" in stopped.stdout
    assert reward_server_pid(network, head, 5001) == ""
    assert not reward_port_answers(network, head, 5001)
    assert "no reward server runs in roll" in stopped_again.stdout


def test_a_head_refuses_a_container_that_runs_another_clusters_ray(network: TestNetwork, hosts: list[TestHost]) -> None:
    worker = hosts[1]  # a worker of the 8100 cluster
    result = network.run(worker, steps.head(DEFAULT_PORTS, worker))
    assert result.returncode != 0
    assert "Ray already runs in container roll as part of the cluster at 198.18.0.11:8100" in result.stderr
    assert network.run(hosts[0], steps.ready(SETTINGS, hosts[0], [h.ip for h in hosts])).returncode == 0


def test_a_worker_of_another_cluster_leaves_it_and_joins_a_new_head(
    network: TestNetwork, hosts: list[TestHost]
) -> None:
    old_head, new_head, worker = hosts
    network.run(new_head, steps.ray_stop(SETTINGS, new_head)).check()
    network.run(new_head, steps.head(DEFAULT_PORTS, new_head)).check()

    moved = network.run(worker, steps.worker(DEFAULT_PORTS, worker, new_head.ip, 1)).check()
    ready = network.run(new_head, steps.ready(DEFAULT_PORTS, new_head, [new_head.ip, worker.ip])).check()
    # Both nodes left the old cluster with a graceful `ray stop`: its head knows at once, the gate need not wait.
    alone = network.run(
        old_head, steps.ready(dataclasses.replace(SETTINGS, ready_timeout_s=5), old_head, [old_head.ip])
    )

    assert "belongs to 198.18.0.11:8100, not 198.18.0.12:6379: stopping it to rejoin" in moved.stdout
    assert "cluster ready: 2 of 2 nodes, 4 of 4 GPUs" in ready.stdout
    assert "cluster ready: 1 of 1 nodes, 2 of 2 GPUs" in alone.check().stdout


def test_teardown_stops_ray_everywhere_and_tolerates_what_is_gone(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    stops = network.run_parallel([(host, steps.ray_stop(SETTINGS, host)) for host in hosts])
    for result in stops:
        result.check()
    assert "stopping Ray in roll (cluster 198.18.0.11:8100)" in stops[0].stdout
    assert "stopping Ray in roll (cluster 198.18.0.12:6379)" in stops[1].stdout
    assert "stopping Ray in roll (cluster 198.18.0.12:6379)" in stops[2].stdout
    for host in hosts:
        assert network.run(host, "pgrep -x raylet || :").stdout.strip() == ""
    again = network.run(hosts[1], steps.ray_stop(SETTINGS, hosts[1])).check()
    job_gone = network.run(head, steps.job_stop(SETTINGS, head, "e2e-spread-1")).check()
    network.remove_container(hosts[2], CONTAINER)
    try:
        no_container = network.run(hosts[2], steps.ray_stop(SETTINGS, hosts[2])).check()
        no_job_container = network.run(hosts[2], steps.job_stop(SETTINGS, hosts[2], "e2e-spread-1")).check()
    finally:
        network.create_container(hosts[2], CONTAINER)

    assert "Ray is not running in roll" in again.stdout
    assert "nothing answers on the Jobs API port 8101: Ray is down and the job with it" in job_gone.stdout
    assert "container roll is not running: Ray is not running there" in no_container.stdout
    assert "container roll is not running: no job to stop" in no_job_container.stdout


def reward_server_ops(port: int) -> list[tuple[str, str]]:
    """What the next `pulumi up` of the openrlhf stack does to the reward server when its port changes from 5001
    to `port`: the engine model's steps (devtools/engine_model.py) for the server and its teardown, in order."""
    from devtools.offline_cloud import run_program

    first = run_program("openrlhf")
    config = {"roll-cluster:training": {"openrlhf": {"rewardServer": {"port": port}}}}
    later = run_program("openrlhf", cloud=first.cloud.next_run(), config=config)
    return [op for op in later.cloud.ops if op[1] in ("reward-server", "reward-server-teardown")]


def test_a_changed_reward_server_port_stops_the_old_server(network: TestNetwork, hosts: list[TestHost]) -> None:
    head = hosts[0]
    old, new = (step_env.RewardServer(command=f"exec python3 -m http.server {p} --bind 127.0.0.1", port=p,
                                health_timeout_s=30) for p in (5001, 5002))
    network.run(head, steps.reward_server(SETTINGS, head, old)).check()
    try:
        # The program's second `up` as the engine runs it: a delete runs the teardown's stop, a create, update or
        # replace runs the step (pulumi-command re-runs `create` on an update and never `delete`).
        ops = reward_server_ops(5002)
        assert ops, "the engine model has no step for the reward server"
        for verb, name in ops:
            if verb == "delete" and name == "reward-server-teardown":
                network.run(head, steps.reward_stop(SETTINGS, head)).check()
            elif verb in ("create", "update", "replace") and name == "reward-server":
                network.run(head, steps.reward_server(SETTINGS, head, new)).check()
        deadline = time.monotonic() + 30
        while reward_port_answers(network, head, 5001) or not reward_port_answers(network, head, 5002):
            assert time.monotonic() < deadline, f"after {ops}: 5001 still answers or 5002 does not"
            time.sleep(0.5)
        assert reward_server_pid(network, head, 5001) == ""
    finally:
        network.run(head, steps.reward_stop(SETTINGS, head))
