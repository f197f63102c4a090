"""The whole program in `hosts` mode on the test hosts (nodes.source hosts, over real sshd): every step it registers,
from host preparation to the job, runs there in the order of its dependencies, exactly as pulumi-command would
run it; then the user's jobStatus and jobLogs outputs, and the delete commands of `pulumi destroy`.

The program runs under the offline cloud (program_commands.render_hosts_program) with the test hosts as
`nodes.hosts`. Stand-ins, only for what cannot exist on a test machine:
- the accelerators and their drivers: nvidia-smi / npu-smi (tests/e2e/standins), NPU device files (character
  devices made with mknod in the host's private /dev) and empty Ascend driver directories;
- the NVIDIA Container Toolkit: nvidia-ctk (registers the runtime in daemon.json, as the real one does) and
  nvidia-container-runtime-hook (the prestart hook real dockerd runs for `--gpus`; with no GPU it mounts nothing);
- systemd: a systemctl that starts, restarts and probes the host's real dockerd (tests/e2e/host_dockerd.sh);
- pulumi-docker: under mocks its RemoteImage and Container do not run, so the tier performs what they specify:
  the image must be on the node, and the Container's inputs become the `docker run` they amount to
  (program_commands.docker_run_command), run against the host's real dockerd.
Everything else is real: SSH, the node scripts, dockerd and the docker step's changes to its daemon.json, the pull
from the tier's registry, the containers, Ray 2.48.0 in them with its GPU or NPU resources and jemalloc preloaded
(Debian's libjemalloc2 in the test image), the job.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from e2e_harness import REPO, CommandResult, RunningCommand, TestHost, TestNetwork, ensure_jemalloc, ensure_sudo
from program_commands import HostsProgram, ProgramStep, render_hosts_program

pytestmark = pytest.mark.e2e

STANDINS = Path(__file__).resolve().parent / "standins"
PER_NODE = 2
PROBE = """
import os, time, ray
ray.init()
resource = os.environ["E2E_RESOURCE"]
print("cluster", resource, ray.cluster_resources().get(resource), flush=True)

@ray.remote(num_cpus=0, resources={resource: 1} if resource != "GPU" else None, num_gpus=1 if resource == "GPU" else 0)
def where():
    # Held for a while, so that the tasks, submitted together, need every accelerator of the cluster at once
    # (a task that ended at once would free its unit for the next, all on the head).
    time.sleep(5)
    return ray.util.get_node_ip_address(), os.environ.get("LD_PRELOAD", "")

for ip, preload in sorted(ray.get([where.remote() for _ in range(TASKS)])):
    print("probe ran on", ip, "LD_PRELOAD=" + preload, flush=True)
""".replace("TASKS", str(2 * PER_NODE))


def install_standins(network: TestNetwork, host: TestHost, accelerator: str) -> None:
    """What a real host would have: the accelerator driver (stand-ins), the NVIDIA toolkit CLI and its OCI hook,
    systemd for docker."""
    files = {"systemctl": "/usr/local/bin/systemctl", "nvidia-ctk": "/usr/local/bin/nvidia-ctk"}
    if accelerator == "nvidia":
        files["nvidia-smi"] = "/usr/local/bin/nvidia-smi"
        # dockerd looks for it when it starts: the docker step restarts dockerd after registering the runtime.
        files["nvidia-container-runtime-hook"] = "/usr/local/bin/nvidia-container-runtime-hook"
    else:
        files["npu-smi"] = "/usr/local/sbin/npu-smi"
    script = ["set -euo pipefail"]
    for name, target in files.items():
        script.append(f"install -D -m 0755 /dev/stdin {target} <<'STANDIN'\n{(STANDINS / name).read_text()}STANDIN")
    if accelerator == "nvidia":
        script.append(f"echo {PER_NODE} > /etc/e2e-gpus")
    else:
        devices = [f"davinci{i}" for i in range(PER_NODE)] + ["davinci_manager", "devmm_svm", "hisi_hdc"]
        script.append(f"echo {PER_NODE} > /etc/e2e-npus")
        script += [f"[ -c /dev/{d} ] || mknod -m 0666 /dev/{d} c 1 3" for d in devices]
        script.append("mkdir -p /usr/local/Ascend/driver/lib64 /usr/local/Ascend/add-ons /usr/local/dcmi")
        script.append("echo 'Driver_Install_Path_Param=/usr/local/Ascend' > /etc/ascend_install.info")
    network.run(host, "\n".join(script) + "\n", timeout=60).check()


def add_sudo_user(network: TestNetwork, host: TestHost, user: str) -> None:
    """A login user with passwordless sudo, as the README asks of a user other than root (in the host's private /etc;
    its key is the tier's client key, which every host's sshd accepts for any user). Its password is `*` (none),
    not useradd's locked `!`: sshd without PAM refuses a locked account even a key."""
    script = (
        f"set -euo pipefail\nid {user} >/dev/null 2>&1 || useradd -M -p '*' -d /tmp/home-{user} -s /bin/bash {user}\n"
        f"mkdir -p /tmp/home-{user} && chown {user} /tmp/home-{user}\n"
        f"install -m 0440 /dev/stdin /etc/sudoers.d/{user} <<<'{user} ALL=(ALL) NOPASSWD:ALL'\n"
        # sudo looks the host's name up: without it every call warns.
        'grep -q " $(hostname)$" /etc/hosts || echo "127.0.1.1 $(hostname)" >>/etc/hosts\n'
    )
    network.run(host, script, timeout=60).check()
    whoami = network.run(host, "id -un && sudo -n id -un", user=user).check().stdout.split()
    assert whoami == [user, "root"], whoami


def variant_of(name: str) -> tuple[str, str]:
    """(accelerator, SSH user) of an own_hosts variant: "nvidia", "ascend", "nvidia-as-ops"."""
    return name.split("-")[0], ("ops" if name.endswith("-as-ops") else "root")


def as_root(command: str, user: str) -> str:
    """A user-facing command (docker exec in the head's container) as root: the test user is not in the host's
    docker group, which lets the user in on a real host (README, 'Your own servers')."""
    return command.replace(f" {user}@", " root@")


def run_step(network: TestNetwork, hosts: dict[str, TestHost], step: ProgramStep) -> CommandResult:
    host = hosts[step.node]
    if step.kind == "local":
        # As pulumi-command runs a local.Command: from the project's directory with its environment; ssh finds the
        # test's client config through the wrapper first in PATH, and probes every second instead of ten.
        env = {**os.environ, **step.env, "INTERVAL_S": "1",
               "PATH": f"{network.client_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        return RunningCommand("the admin machine", ["bash", "-c", f"cd {REPO} && {step.command}"], env=env).wait(300)
    if step.kind == "copy" and step.library is not None:
        # As pulumi-command's CopyToRemote: over SFTP, as the connection's user.
        return network.copy_library(host, step.library.source, step.library.remote_path, step.library.user)
    if step.kind == "remote":
        # As pulumi-command logs in: the step's connection user (its scripts run under `sudo -n` when not root).
        return network.run(host, step.command, timeout=300, user=step.user)
    # The image check and the docker run stand for pulumi-docker's API calls: as root (dockerd's socket is root's).
    return network.run(host, step.command, timeout=300)


def run_program_steps(network: TestNetwork, hosts: dict[str, TestHost], program: HostsProgram) -> list[str]:
    """Every step once its dependencies are done, independent ones in parallel; fails on the first failing step."""
    done: list[str] = []
    pending = list(program.steps)
    with ThreadPoolExecutor(max_workers=8) as pool:
        while pending:
            ready = [s for s in pending if all(d in done for d in s.depends_on)]
            assert ready, f"steps wait for something that never runs: {[(s.key, s.depends_on) for s in pending]}"
            results = list(pool.map(lambda s: (s, run_step(network, hosts, s)), ready))
            for step, result in results:
                assert result.returncode == 0, f"step {step.key} ({step.kind}) failed:\n{result.output}"
                done.append(step.key)
                pending.remove(step)
    return done


@pytest.fixture(scope="module", params=["nvidia", "ascend", "nvidia-as-ops"])
def own_hosts(
    request: pytest.FixtureRequest, network: TestNetwork
) -> Iterator[tuple[str, list[TestHost], HostsProgram]]:
    """The program on two test hosts: NVIDIA and Ascend as root, and NVIDIA as `ops`, a user with sudo."""
    accelerator, user = variant_of(request.param)
    ensure_jemalloc()
    hosts = network.hosts[:2]
    if user != "root":
        ensure_sudo()
        for host in hosts:
            add_sudo_user(network, host, user)
    container = f"rc-{request.param}"
    program = render_hosts_program(
        "hosts" if accelerator == "nvidia" else "ascend",
        [h.ip for h in hosts],
        str(network.client_key),
        accelerators_per_node=PER_NODE,
        container=container,
        ports={"nvidia": (8200, 8201, 8202), "ascend": (8300, 8301, 8302), "nvidia-as-ops": (8400, 8401, 8402)}[
            request.param],
        entrypoint=f"E2E_RESOURCE={'GPU' if accelerator == 'nvidia' else 'NPU'} python3 probe.py",
        working_dir="/workspace/own-hosts-job",
        user=user,
    )
    for host in hosts:
        install_standins(network, host, accelerator)
    # The job's file where the program's container finds it: the node's /data/workspace is its /workspace.
    network.run(hosts[0], f"mkdir -p /data/workspace/own-hosts-job && cat > /data/workspace/own-hosts-job/probe.py "
                          f"<<'EOF'\n{PROBE}\nEOF").check()
    yield request.param, hosts, program
    if program.job_stop:
        network.run(hosts[0], program.job_stop)
    network.run_parallel([(host, stop) for host, stop in zip(hosts, program.ray_stop, strict=True)])
    for host in hosts:
        network.run(host, f"docker rm -f {container}")


def wait_for(network: TestNetwork, command: str, wanted: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while True:
        output = network.run_user_command(command).output
        if wanted in output.lower():
            return output
        assert time.monotonic() < deadline, f"{wanted!r} not seen after {timeout}s:\n{output}"
        time.sleep(1)


def test_the_first_look_counts_each_hosts_accelerators_over_real_ssh_and_records_its_key(
    network, own_hosts, tmp_path, monkeypatch
):
    """What `pulumi preview` does first on your own hosts (infra/sources/hosts/probe.py), before any step: the
    count each host's driver tool lists, over real sshd, and a count other than the configuration refused."""
    from infra.node import accelerators
    from infra.sources.hosts import probe

    variant, hosts, _ = own_hosts
    accelerator, user = variant_of(variant)
    monkeypatch.setenv("PATH", f"{network.client_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    kind = accelerators.accelerator(accelerator)
    access = probe.HostAccess(str(network.client_key), str(tmp_path / "ssh" / "stack.known_hosts"))
    targets = [probe.HostTarget(f"node-{rank}", f"roll-cluster:nodes.hosts[{rank}]", host.ip, user, 22)
               for rank, host in enumerate(hosts)]
    looks = probe.look_at_all(targets, kind, access)
    assert [(look.problem, look.accelerators) for look in looks] == [(None, PER_NODE)] * len(hosts)
    assert all(look.host_key and look.host_key.startswith(("ssh-", "ecdsa-")) for look in looks)
    # The second look verifies the recorded keys (StrictHostKeyChecking=yes) and finds the same.
    again = probe.look_at_all(targets, kind, access)
    assert [look.host_key for look in again] == [look.host_key for look in looks]
    refused = probe.problems(again, PER_NODE + 1, "roll-cluster:nodes.acceleratorsPerNode", kind)
    noun = "GPUs" if accelerator == "nvidia" else "NPUs"
    assert len(refused) == len(hosts)
    assert f"is {PER_NODE + 1}, but" in refused[0] and f"({hosts[0].ip}) lists {PER_NODE} {noun}" in refused[0]


def test_every_program_step_runs_on_the_hosts_and_the_job_uses_every_accelerator(network, own_hosts):
    variant, hosts, program = own_hosts
    accelerator, user = variant_of(variant)
    by_node = {f"node-{rank}": host for rank, host in enumerate(hosts)}
    done = run_program_steps(network, by_node, program)
    assert {s.user for s in program.steps if s.kind == "remote"} == {user}

    ready_step = "gpu-ready" if accelerator == "nvidia" else "npu-ready"
    expected = ["prepare-host", "docker", "pull-image", ready_step, "image", "container"]
    for node in by_node:
        keys = [k.split("/", 1)[1] for k in done if k.startswith(node + "/")]
        assert set(expected) <= set(keys), keys
        assert keys.index("container") > keys.index(ready_step) > keys.index("pull-image") > keys.index("docker")
    assert done[-1] == "node-0/job" and done.index("node-0/ray-ready") > done.index("node-1/ray-worker")

    # The container got what the program specified, as the worker's dockerd recorded it.
    inspect = network.run(hosts[1], f"docker inspect --format '{{{{json .HostConfig}}}}' rc-{variant}").check()
    spec = json.loads(inspect.stdout)
    devices = {f"{d['PathOnHost']}:{d['PathInContainer']}:{d['CgroupPermissions']}" for d in spec["Devices"] or []}
    if accelerator == "nvidia":
        assert [r["Capabilities"] for r in spec["DeviceRequests"] or []] == [[["gpu"]]] and not devices, spec
    else:
        assert {"/dev/davinci1:/dev/davinci1:rwm", "/dev/hisi_hdc:/dev/hisi_hdc:rwm"} <= devices, spec
        assert "/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro" in spec["Binds"], spec
        assert not spec["DeviceRequests"] and not spec["Privileged"], spec

    outputs = program.outputs
    assert f" {user}@{hosts[0].ip}" in outputs["jobStatus"]
    status = wait_for(network, as_root(outputs["jobStatus"], user), "succeeded")
    assert "succeeded" in status.lower()
    logs = network.run_user_command(as_root(outputs["jobLogs"], user)).check().output
    resource = "GPU" if accelerator == "nvidia" else "NPU"
    assert f"cluster {resource} {float(2 * PER_NODE)}" in logs
    for host in hosts:
        assert f"probe ran on {host.ip}" in logs
    if accelerator == "ascend":
        assert logs.count("LD_PRELOAD=/usr/lib/") == 2 * PER_NODE and "libjemalloc.so.2" in logs


def test_the_host_steps_run_again_change_nothing(network, own_hosts):
    _, hosts, program = own_hosts
    by_node = {f"node-{rank}": host for rank, host in enumerate(hosts)}
    for step in program.steps:
        if step.key.endswith(("/prepare-host", "/docker", "/pull-image", "/npu-ready", "/container")):
            result = run_step(network, by_node, step)
            assert result.returncode == 0, f"{step.key} again:\n{result.output}"
            if step.key.endswith("/docker"):
                assert "restart docker" not in result.output and "never reinstalled or upgraded" in result.output
            if step.key.endswith("/pull-image"):
                assert "already present; pull skipped" in result.output
