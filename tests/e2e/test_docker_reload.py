"""The pull cache's address on a running node's real dockerd (daemon.json's insecure-registries): dockerd re-reads the
list on SIGHUP, and the program's docker step applies a change of it by that reload, never a restart, so the training
container keeps running with the same id (see verified-facts#dockerd-reload-insecure-registries).

What is real: the host's dockerd (Debian's docker.io) with its pidfile and daemon.json, a running container, the
program's docker step over SSH (install_docker.sh as the program renders it for an own host: its Docker kept), and
the reload it asks systemd for, which the tier's systemctl stand-in performs as Docker CE's unit does (SIGHUP to
dockerd). One host.
"""

from __future__ import annotations

import json
import shlex
import time

import pytest
from e2e_harness import CommandResult, TestHost, TestNetwork
from e2e_steps import hosts_library
from test_program_on_own_hosts import install_standins

from infra.node.remote import render_plain

pytestmark = pytest.mark.e2e

CONTAINER = "rc-docker-reload"
# The registries dockerd treats as insecure by name (host:port entries; CIDR entries are listed apart).
INSECURE_FORMAT = ("{{range $name, $index := .RegistryConfig.IndexConfigs}}{{if not $index.Secure}}{{$name}} "
                   "{{end}}{{end}}")
LISTED_WITHIN_S = 60  # a bound for a dockerd that never applies the list, not a measurement


def insecure(network: TestNetwork, host: TestHost) -> set[str]:
    listed = network.run(host, f"docker info --format {shlex.quote(INSECURE_FORMAT)}", timeout=60).check()
    return set(listed.stdout.split())


def wait_listed(network: TestNetwork, host: TestHost, wanted: set[str], gone: set[str]) -> set[str]:
    deadline = time.monotonic() + LISTED_WITHIN_S
    while True:
        listed = insecure(network, host)
        if wanted <= listed and not gone & listed:
            return listed
        assert time.monotonic() < deadline, f"dockerd lists {sorted(listed)}, wanted {sorted(wanted)} without {gone}"
        time.sleep(0.5)


def daemon_and_container(network: TestNetwork, host: TestHost) -> tuple[str, str, str, str]:
    """(dockerd's pid, the container's id, when it started, whether it runs)."""
    pid = network.run(host, "cat /run/docker.pid", timeout=30).check().stdout.strip()
    inspect = network.run(host, "docker inspect --format '{{.Id}} {{.State.StartedAt}} {{.State.Running}}' "
                                f"{CONTAINER}", timeout=60).check()
    container_id, started, running = inspect.stdout.split()
    return pid, container_id, started, running


def docker_step(network: TestNetwork, host: TestHost, addresses: str) -> CommandResult:
    """The node's docker step as the program renders it for an own host (components/bootstrap.py)."""
    env = {"NODE_NAME": host.name, "DOCKER_DATA_ROOT": "", "NVIDIA_RUNTIME": "1", "KEEP_EXISTING_DOCKER": "1",
           "MOUNTS": "", "INSECURE_REGISTRIES": addresses}
    command = render_plain("docker", ["install_docker.sh", "docker_mount_order.sh"], env, library=hosts_library())
    return network.run(host, command, timeout=300)


def systemctl_calls(network: TestNetwork, host: TestHost) -> list[str]:
    return network.run(host, "cat /var/lib/e2e-systemctl.log", timeout=30).check().stdout.splitlines()


def test_a_changed_insecure_registry_reaches_the_running_dockerd_by_a_reload_and_the_container_runs_on(
    network: TestNetwork,
) -> None:
    host = network.hosts[0]
    install_standins(network, host, "nvidia")
    try:
        first = docker_step(network, host, "")  # registers the nvidia runtime: a restart, before any container
        assert first.returncode == 0, first.output
        network.create_container(host, CONTAINER)
        before = daemon_and_container(network, host)
        assert before[3] == "true"

        # The fact: daemon.json edited, SIGHUP to the pid in dockerd's pidfile; docker info lists the new entry, and
        # with the file put back and another SIGHUP, no longer.
        edit = ("cp /etc/docker/daemon.json /root/daemon.json.before && "
                "python3 -c 'import json, sys; p = \"/etc/docker/daemon.json\"; c = json.load(open(p)); "
                "c[\"insecure-registries\"] = c.get(\"insecure-registries\", []) + [sys.argv[1]]; "
                "json.dump(c, open(p, \"w\"))' 10.99.0.1:5000 && kill -HUP \"$(cat /run/docker.pid)\"")
        network.run(host, edit, timeout=60).check()
        wait_listed(network, host, {"10.99.0.1:5000"}, set())
        assert daemon_and_container(network, host) == before  # same dockerd, same container, never restarted
        back = "cp /root/daemon.json.before /etc/docker/daemon.json && kill -HUP \"$(cat /run/docker.pid)\""
        network.run(host, back, timeout=60).check()
        wait_listed(network, host, set(), {"10.99.0.1:5000"})
        assert daemon_and_container(network, host) == before

        # The program's step: the cache turned on (its address added), then off (removed), each by a reload.
        restarts = systemctl_calls(network, host).count("restart docker")
        on = docker_step(network, host, "10.99.0.2:5000")
        assert on.returncode == 0, on.output
        assert "docker reloaded (SIGHUP through systemd)" in on.stdout, on.output
        assert "10.99.0.2:5000" in insecure(network, host)  # the step waited for dockerd to list it
        off = docker_step(network, host, "")
        assert off.returncode == 0, off.output
        assert "10.99.0.2:5000" not in insecure(network, host)
        config = json.loads(network.run(host, "cat /etc/docker/daemon.json", timeout=30).check().stdout)
        assert "10.99.0.2:5000" not in config["insecure-registries"]
        calls = systemctl_calls(network, host)
        assert calls.count("restart docker") == restarts and calls.count("reload docker") == 2, calls
        assert daemon_and_container(network, host) == before
    finally:
        network.run(host, f"docker rm -f -- {CONTAINER}", timeout=120)
