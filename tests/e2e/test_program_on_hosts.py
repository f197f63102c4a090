"""The program's own commands on real hosts: the Pulumi program runs under the offline cloud with the test hosts'
addresses (program_commands.py), and the Ray and job steps it registered run over SSH exactly as pulumi-command
would run them, with seed 004's ports. Then the user's jobStatus and jobLogs outputs, a ROLL job whose YAML was
built by the program before deployment and is submitted through the program's own job step, and the delete
commands that `pulumi destroy` runs.

Stand-ins: GPUs (Ray is told --num-gpus=2; the containers are real, on each host's dockerd) and
ROLL's launcher (a script at examples/start_agentic_pipeline.py that reads and checks the shipped YAML against
the running cluster instead of training: there is no ROLL, torch or GPU here).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
from e2e_harness import TestHost, TestNetwork
from program_commands import ProgramCommands, render_cluster

pytestmark = pytest.mark.e2e

CONTAINER = "roll"
SECRET = "e2e-hf-token-program-9c1f"
PROBE = """
import os
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init()

@ray.remote(num_cpus=0)
def where():
    return ray.util.get_node_ip_address()

alive = [n for n in ray.nodes() if n["Alive"]]
refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote()
        for n in alive]
for ip in sorted(ray.get(refs)):
    print("probe ran on", ip, flush=True)
print("checkpoint dir", os.environ.get("ROLL_CLUSTER_CHECKPOINT_DIR"), "resume", os.environ.get("ROLL_CLUSTER_RESUME"),
      flush=True)
"""


@pytest.fixture(scope="module")
def cluster(network: TestNetwork) -> Iterator[tuple[list[TestHost], ProgramCommands]]:
    hosts = network.hosts
    commands = render_cluster(
        [h.ip for h in hosts],
        str(network.client_key),
        ports=(8100, 8101, 8102),
        entrypoint="python3 probe.py",
        working_dir="/workspace/program-job",
        ray={"readyTimeoutSeconds": 60, "headWaitTimeoutSeconds": 120},
        secrets={"hfToken": SECRET},
        host_key_files=[h.root / "ssh_host_ed25519_key" for h in hosts],
    )
    # The stack's known-hosts file, written by the program's own local command: the output commands verify the
    # hosts against it (StrictHostKeyChecking=yes), as they verify real nodes.
    network.run_user_command(commands.known_hosts, timeout=30).check()
    for host in hosts:
        network.create_container(host, CONTAINER)
    # The job's file in the head's /workspace, which its container mounts (as the product's mounts /data/workspace).
    network.run(hosts[0], f"mkdir -p /workspace/program-job && cat > /workspace/program-job/probe.py <<'EOF'\n"
                          f"{PROBE}\nEOF").check()
    yield hosts, commands
    network.run_parallel([(host, stop) for host, stop in zip(hosts, commands.ray_stop, strict=True)])


# ROLL's launcher, stood in: resolves --config_path from its own folder as Hydra's initialize() does, reads the
# YAML the job step wrote, and checks it against the Ray cluster it runs on.
ROLL_LAUNCHER = """
import argparse, os, sys
import ray, yaml
parser = argparse.ArgumentParser()
parser.add_argument("--config_path")
parser.add_argument("--config_name")
args = parser.parse_args()
path = os.path.join(os.path.dirname(os.path.realpath(__file__)), args.config_path, args.config_name + ".yaml")
config = yaml.safe_load(open(path))
ray.init()
gpus = int(ray.cluster_resources().get("GPU", 0))
print("stand-in ROLL launcher read", os.path.relpath(path), "on a cluster of", gpus, "GPUs", flush=True)
for role in ("actor_train", "actor_infer", "reference"):
    mapping = config[role]["device_mapping"]
    indices = eval(mapping, {"__builtins__": {}}, {"list": list, "range": range})  # as ROLL does
    print(role, mapping, config[role]["model_args"]["dtype"], flush=True)
    if max(indices) >= gpus:
        sys.exit(f"{role}.device_mapping {mapping} is beyond the cluster's {gpus} GPUs")
if "defaults" in config or "custom_env" not in config:
    sys.exit("the Hydra defaults were not merged in")
print("stand-in ROLL launcher: config fits", flush=True)
"""


def wait_for(network: TestNetwork, command: str, wanted: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while True:
        output = network.run_user_command(command).output
        if wanted in output.lower():
            return output
        assert time.monotonic() < deadline, f"{wanted!r} not seen after {timeout}s:\n{output}"
        time.sleep(1)


def test_the_programs_steps_form_the_cluster_and_run_the_job_on_every_node(network, cluster):
    hosts, commands = cluster
    head = network.run(hosts[0], commands.head).check()
    joins = network.run_parallel(list(zip(hosts[1:], commands.workers, strict=True)))
    for result in joins:
        result.check()
    ready = network.run(hosts[0], commands.ready).check()
    assert "ray-ready" in ready.output
    assert commands.submit is not None
    submit = network.run(hosts[0], commands.submit).check()
    for result in (head, *joins, ready, submit):
        assert SECRET not in result.output
    outputs = commands.outputs
    assert outputs["rayAddress"] == f"{hosts[0].ip}:8100"
    wait_for(network, outputs["jobStatus"], "succeeded")
    logs = network.run_user_command(outputs["jobLogs"]).check().output
    for host in hosts:
        assert f"probe ran on {host.ip}" in logs
    # The custom job is told its checkpoint directory through the runtime env the program submits.
    assert "checkpoint dir /data/checkpoints/" in logs and "/custom resume 1" in logs


def test_every_program_step_run_again_changes_nothing(network, cluster):
    hosts, commands = cluster
    assert commands.submit is not None
    again = [
        network.run(hosts[0], commands.head),
        *network.run_parallel(list(zip(hosts[1:], commands.workers, strict=True))),
        network.run(hosts[0], commands.ready),
        network.run(hosts[0], commands.submit),
    ]
    for result in again:
        result.check()
    assert "already" in again[0].output.lower()


def test_the_roll_yaml_built_before_deployment_is_submitted_through_the_programs_job_step(network, cluster):
    hosts, _ = cluster
    roll = render_cluster(
        [h.ip for h in hosts],
        str(network.client_key),
        ports=(8100, 8101, 8102),
        ray={"readyTimeoutSeconds": 60, "headWaitTimeoutSeconds": 120},
        # ROLL's multi-node demo; 48 rollouts divide over the 6 GPUs' Megatron data-parallel ranks.
        training={
            "framework": "roll",
            "roll": {"baseConfig": "agentic_demo/agent_val_frozen_lake_multi_nodes_demo.yaml"},
            "overrides": {"rollout_batch_size": 48},
        },
    )
    assert roll.submit is not None and roll.job_stop is not None and roll.rendered_config is not None
    launcher = hosts[0].private_path("/workspace/ROLL/examples/start_agentic_pipeline.py")
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(ROLL_LAUNCHER)
    submit = network.run(hosts[0], roll.submit).check()
    assert "write the job's files" in submit.output and "prepare the job" not in submit.output
    shipped = hosts[0].private_path("/workspace/ROLL/examples/pulumi/multi-agent_val_frozen_lake_multi_nodes_demo.yaml")
    assert shipped.read_text() == roll.rendered_config  # the head wrote it as is, it rendered nothing
    wait_for(network, roll.outputs["jobStatus"], "succeeded")
    logs = network.run_user_command(roll.outputs["jobLogs"]).check().output
    assert "stand-in ROLL launcher read examples/pulumi/multi-agent_val_frozen_lake_multi_nodes_demo.yaml" in logs
    assert "on a cluster of 6 GPUs" in logs
    assert "actor_train list(range(0,6)) fp16" in logs
    assert "stand-in ROLL launcher: config fits" in logs
    network.run(hosts[0], roll.job_stop).check()


# ROLL's launcher, stood in for the start gate and the resume (issue 18): by the YAML's exp_name it dies before its
# first step as ROLL did with `resume_from_checkpoint: true`, hangs silently before it (issue 27: a collective that
# never forms), or it prints ROLL's first-step line after saving a complete checkpoint the way ROLL lays it out
# (<output_dir>/<launch timestamp>/checkpoint-N/pipeline/...).
ROLL_TRAINING_LAUNCHER = """
import argparse, datetime, os, sys, time
import yaml
parser = argparse.ArgumentParser()
parser.add_argument("--config_path")
parser.add_argument("--config_name")
args = parser.parse_args()
path = os.path.join(os.path.dirname(os.path.realpath(__file__)), args.config_path, args.config_name + ".yaml")
config = yaml.safe_load(open(path))
resume = config["resume_from_checkpoint"]
print("stand-in ROLL resume_from_checkpoint:", resume, flush=True)
if config["exp_name"] == "dies":
    sys.exit("FileNotFoundError: [Errno 2] No such file or directory: stand-in start-up crash")
if config["exp_name"] == "silent":
    print("stand-in ROLL: waiting for a collective that never forms", flush=True)
    time.sleep(3600)
step = int(resume.rsplit("-", 1)[1]) + 1 if isinstance(resume, str) else 0
launch = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
time.sleep(1.1)  # a later launch gets a later timestamp, as a real one (minutes long) does
saved = os.path.join(config["checkpoint_config"]["output_dir"], launch, f"checkpoint-{step}", "pipeline")
os.makedirs(saved)
open(os.path.join(saved, "worker_state_pipeline.json"), "w").write("{}")
print(f"pipeline step {step} finished", flush=True)
time.sleep(2)
"""
GATE_CHECKPOINTS = "/tmp/roll-gate-checkpoints"  # the head's private /tmp: only the head runs the stand-in


def ray_up_with_the_stand_in_launcher(network, hosts, commands) -> None:
    """Ray up (idempotent: a no-op after the first test, so that a test also runs alone) and the stand-in ROLL
    launcher in the head's workspace."""
    network.run(hosts[0], commands.head).check()
    for result in network.run_parallel(list(zip(hosts[1:], commands.workers, strict=True))):
        result.check()
    network.run(hosts[0], commands.ready).check()
    launcher = hosts[0].private_path("/workspace/ROLL/examples/start_agentic_pipeline.py")
    launcher.parent.mkdir(parents=True, exist_ok=True)
    launcher.write_text(ROLL_TRAINING_LAUNCHER)


def test_the_start_gate_fails_a_dying_job_passes_a_training_one_and_a_rerun_resumes(network, cluster):
    hosts, commands = cluster
    ray_up_with_the_stand_in_launcher(network, hosts, commands)
    network.run(hosts[0], f"rm -rf {GATE_CHECKPOINTS}").check()

    def rendered(exp_name: str) -> ProgramCommands:
        return render_cluster(
            [h.ip for h in hosts], str(network.client_key), ports=(8100, 8101, 8102),
            ray={"readyTimeoutSeconds": 60, "headWaitTimeoutSeconds": 120},
            storage={"nas": True},  # shared storage: the job step looks for a checkpoint to resume from
            training={
                "framework": "roll",
                "roll": {"baseConfig": "agentic_demo/agent_val_frozen_lake_multi_nodes_demo.yaml"},
                "overrides": {"rollout_batch_size": 48, "exp_name": exp_name,
                              "checkpoint_config": {"output_dir": GATE_CHECKPOINTS}},
            },
        )

    dies = rendered("dies")
    assert dies.submit is not None and dies.job_stop is not None
    job_id = dies.outputs["jobId"]
    failed = network.run(hosts[0], dies.submit)
    assert failed.returncode != 0  # the job step fails, so does `pulumi up`
    assert f"job {job_id} is FAILED before its first training step" in failed.output
    assert "stand-in start-up crash" in failed.output  # the job's log tail
    assert "phase: failed" in network.run_user_command(dies.outputs["jobStatus"]).output
    network.run(hosts[0], dies.job_stop).check()

    first = rendered("first")
    assert first.submit is not None and first.job_stop is not None
    passed = network.run(hosts[0], first.submit).check()
    assert f"starts fresh: no complete roll checkpoint under {GATE_CHECKPOINTS}" in passed.output
    assert f"job {first.outputs['jobId']} reached training step 0" in passed.output
    wait_for(network, first.outputs["jobStatus"], "succeeded")
    network.run(hosts[0], first.job_stop).check()

    second = rendered("second")
    assert second.submit is not None and second.job_stop is not None
    resumed = network.run(hosts[0], second.submit).check()
    saved = [c for c in hosts[0].private_path(GATE_CHECKPOINTS).glob("*/checkpoint-0")]
    assert len(saved) == 1
    checkpoint = f"{GATE_CHECKPOINTS}/{saved[0].parent.name}/checkpoint-0"
    assert f"resumes from {checkpoint}" in resumed.output
    assert f"job {second.outputs['jobId']} reached training step 1" in resumed.output
    status = wait_for(network, second.outputs["jobStatus"], "succeeded")
    assert f"ROLL resumes from {checkpoint}" in status
    logs = network.run_user_command(second.outputs["jobLogs"]).check().output
    assert f"stand-in ROLL resume_from_checkpoint: {checkpoint}" in logs  # the YAML ROLL read named it
    network.run(hosts[0], second.job_stop).check()
    network.run(hosts[0], f"rm -rf {GATE_CHECKPOINTS}").check()


def test_the_start_gate_stops_a_job_that_prints_nothing_within_the_configured_minutes(network, cluster):
    hosts, commands = cluster
    ray_up_with_the_stand_in_launcher(network, hosts, commands)
    silent = render_cluster(
        [h.ip for h in hosts], str(network.client_key), ports=(8100, 8101, 8102),
        ray={"readyTimeoutSeconds": 60, "headWaitTimeoutSeconds": 120},
        training={
            "framework": "roll",
            "roll": {"baseConfig": "agentic_demo/agent_val_frozen_lake_multi_nodes_demo.yaml"},
            # 1 minute of silence, far inside the 30-minute gate: only the no-progress rule can end the step.
            "startTimeoutMinutes": 30, "noProgressMinutes": 1,
            "overrides": {"rollout_batch_size": 48, "exp_name": "silent"},
        },
    )
    assert silent.submit is not None and silent.job_stop is not None
    job_id = silent.outputs["jobId"]
    failed = network.run(hosts[0], silent.submit)
    assert failed.returncode != 0  # the job step fails, so does `pulumi up`
    assert f"job {job_id} made no progress: no new log output for" in failed.output
    assert "(training.noProgressMinutes: 60s)" in failed.output and "it was stopped" in failed.output
    assert "waiting for a collective that never forms" in failed.output  # the job's log tail
    assert "has not reached its first training step within" not in failed.output  # not the 30-minute bound
    assert re.search(f"job {job_id}: (pending|starting), [0-9]+s of 1800s", failed.output)  # the gate's progress
    # Stopped, not left holding the GPUs: Ray says so.
    assert f"Job '{job_id}' was stopped" in network.run_user_command(silent.outputs["jobStatus"]).output
    network.run(hosts[0], silent.job_stop).check()


def test_destroy_commands_stop_the_job_and_ray(network, cluster):
    hosts, commands = cluster
    assert commands.job_stop is not None
    network.run(hosts[0], commands.job_stop).check()
    for host, stop in zip(hosts, commands.ray_stop, strict=True):
        network.run(host, stop).check()
        network.run(host, stop).check()  # idempotent: nothing left to stop
    probe = network.run(hosts[0], f"docker exec {CONTAINER} ray status --address {hosts[0].ip}:8100")
    assert probe.returncode != 0
