"""Your own hosts are looked at before anything is registered (`pulumi preview` / `up`): a host whose driver lists
another accelerator count than nodes.acceleratorsPerNode, or that cannot be reached, stops the update with the key
named before any resource or step; the SSH key each host answers with is recorded once in the stack's own
known-hosts file and then pinned for every client.

The program runs as under `pulumi up` (not offline: the look happens) with the offline cloud's mocks; `ssh` is a
dispatcher (below) that reaches one fake node per address through the project's ssh stand-in, and behaves like
OpenSSH for the host key: accept-new records it, yes verifies it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from script_harness import FakeNode
from test_hosts import install_npu_smi

from devtools.offline_cloud import OfflineCloud, run_program, unwrap
from infra import runmode
from infra.config import ConfigError
from infra.node import accelerators
from infra.sources.base import SourceError
from infra.sources.hosts import probe

# Pulumi.hosts.yaml (2 x 2 NVIDIA A10) at benchmarking addresses (RFC 2544): a real `pulumi up` refuses the
# stack's documentation addresses (infra/config/first_time.py).
HOSTS = ("198.18.0.11", "198.18.0.12")

SSH_DISPATCHER = r"""#!/bin/bash
# ssh to a fake host: $FAKE_HOSTS/<address>/ holds the node's environment (env) and its host key (host_key).
known='' checking='' destination=''
args=("$@")
while (($#)); do
  case $1 in
    -o)
      case $2 in
        UserKnownHostsFile=*) known=${2#*=} ;;
        StrictHostKeyChecking=*) checking=${2#*=} ;;
      esac
      shift 2 ;;
    -p | -i | -l | -F) shift 2 ;;
    -*) shift ;;
    *) destination=$1; break ;;
  esac
done
host=${destination#*@}
dir=$FAKE_HOSTS/$host
echo "$*" >>"$FAKE_HOSTS/calls"
if [[ ! -d "$dir" ]]; then
  echo "ssh: connect to host $host port 22: No route to host" >&2
  exit 255
fi
key=$(cat "$dir/host_key")
recorded=$(awk -v h="$host" '$1 == h {print $2 " " $3; exit}' "$known" 2>/dev/null || true)
if [[ -z "$recorded" ]]; then
  if [[ "$checking" != accept-new ]]; then echo "Host key verification failed." >&2; exit 255; fi
  echo "$host $key" >>"$known"
elif [[ "$recorded" != "$key" ]]; then
  echo "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @" >&2
  echo "Host key verification failed." >&2
  exit 255
fi
set -a
source "$dir/env"
set +a
exec "$dir/bin/ssh" "${args[@]}"
"""


class FakeHosts:
    """Fake nodes by address, reached by the `ssh` dispatcher first in PATH."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root / "hosts"
        self.root.mkdir()
        local_bin = root / "local-bin"
        local_bin.mkdir()
        (local_bin / "ssh").write_text(SSH_DISPATCHER)
        (local_bin / "ssh").chmod(0o755)
        self.home = root / "home"
        self.home.mkdir()
        monkeypatch.setenv("HOME", str(self.home))
        monkeypatch.setenv("FAKE_HOSTS", str(self.root))
        monkeypatch.setenv("PATH", f"{local_bin}:{os.environ['PATH']}")
        self.nodes: dict[str, FakeNode] = {}

    def add(self, address: str, gpus: int | None = None, npus: int | None = None) -> FakeNode:
        directory = self.root / address
        directory.mkdir()
        node = FakeNode(directory)
        env = node.machine_env()
        (directory / "env").write_text("".join(f"{k}='{v}'\n" for k, v in env.items()))
        (directory / "host_key").write_text(f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5{address.replace('.', '')}\n")
        if gpus is not None:
            node.set_state("nvidia-smi-gpus", str(gpus))
        if npus is not None:
            install_npu_smi(node, npus)
        self.nodes[address] = node
        return node

    def rekey(self, address: str) -> None:
        (self.root / address / "host_key").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5reinstalled\n")

    @property
    def known_hosts(self) -> Path:
        return self.home / ".ssh" / "roll-cluster" / "hosts.known_hosts"

    def calls(self) -> list[str]:
        calls = self.root / "calls"
        return calls.read_text().splitlines() if calls.exists() else []


@pytest.fixture
def hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHosts:
    return FakeHosts(tmp_path, monkeypatch)


@pytest.fixture
def as_pulumi_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The program runs as under the Pulumi CLI: the look happens and the login key is read (a real key file)."""
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    monkeypatch.setattr(runmode, "offline", lambda: False)
    return key


def up(key: Path, cloud: OfflineCloud | None = None) -> OfflineCloud:
    cloud = cloud or OfflineCloud()
    hosts = [{"address": HOSTS[0], "privateAddress": "10.0.0.11"}, {"address": HOSTS[1], "privateAddress": "10.0.0.12"}]
    run_program("hosts", cloud=cloud, config={"roll-cluster:access": {"sshPrivateKeyPath": str(key)},
                                              "roll-cluster:nodes": {"hosts": hosts}})
    return cloud


def test_a_host_with_another_gpu_count_stops_the_update_before_any_resource_or_step(
    hosts: FakeHosts, as_pulumi_up: Path
) -> None:
    hosts.add(HOSTS[0], gpus=2)
    second = hosts.add(HOSTS[1], gpus=4)
    cloud = OfflineCloud()
    with pytest.raises(SourceError) as refused:
        up(as_pulumi_up, cloud)
    message = str(refused.value)
    for words in ("roll-cluster:nodes.acceleratorsPerNode: is 2", "`nvidia-smi -L` on roll-cluster:nodes.hosts[1]",
                  "(198.18.0.12) lists 4 GPUs", "nothing was changed"):
        assert words in message, message
    assert "nodes.hosts[0]" not in message  # the host that matches is not blamed
    assert cloud.resources == [] or not [r for r in cloud.resources if r.custom]
    # Only the driver's tool ran on the host: no package manager, no Docker, no systemd.
    assert second.calls("nvidia-smi") == ["-L"]
    for tool in ("dnf", "apt-get", "docker", "systemctl", "mount"):
        assert second.calls(tool) == [], tool


def test_an_unreachable_host_stops_the_update_naming_it(hosts: FakeHosts, as_pulumi_up: Path) -> None:
    hosts.add(HOSTS[0], gpus=2)  # the second address answers nothing
    with pytest.raises(SourceError) as refused:
        up(as_pulumi_up)
    assert "roll-cluster:nodes.hosts[1] (198.18.0.12): could not count its GPUs" in str(refused.value)
    assert "No route to host" in str(refused.value)


def test_matching_hosts_go_on_and_their_recorded_keys_are_pinned_for_every_client(
    hosts: FakeHosts, as_pulumi_up: Path
) -> None:
    for address in HOSTS:
        hosts.add(address, gpus=2)
    cloud = up(as_pulumi_up)
    # Recorded once, in the stack's own file.
    recorded = sorted(hosts.known_hosts.read_text().splitlines())  # the looks run in parallel
    assert recorded == [f"{a} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5{a.replace('.', '')}" for a in HOSTS]
    # pulumi-command verifies each host with that key; the local clients verify strictly against the file.
    prepare = dict(unwrap(cloud.named("node-1-prepare-host").inputs))
    assert prepare["connection"]["hostKey"] == "ssh-ed25519 AAAAC3NzaC1lZDI1NTE519818012"
    gpu_ready = dict(unwrap(cloud.named("node-1-gpu-ready").inputs))["environment"]
    assert gpu_ready["HOST_KEY_CHECKING"] == "yes"
    teardown = dict(unwrap(cloud.named("node-1-ray-worker-teardown").inputs))["environment"]
    assert (teardown["HOST_KEY_CHECKING"], teardown["HOST_KEY_ORIGIN"]) == ("yes", "recorded")
    written = dict(unwrap(cloud.named("known-hosts").inputs))["environment"]["KNOWN_HOSTS"]
    assert sorted(written.splitlines()) == recorded

    # The next preview verifies against the recorded key: a host that answers with another key is refused.
    hosts.rekey(HOSTS[0])
    with pytest.raises(SourceError) as refused:
        up(as_pulumi_up)
    message = str(refused.value)
    assert "198.18.0.11:22 answers with a host key other than the one recorded" in message
    assert f"ssh-keygen -R 198.18.0.11 -f {hosts.known_hosts}" in message


def test_npus_are_counted_with_npu_smi(hosts: FakeHosts) -> None:
    hosts.add(HOSTS[0], npus=8)
    access = probe.HostAccess(None, "~/.ssh/roll-cluster/ascend.known_hosts")
    target = probe.HostTarget("node-0", "roll-cluster:nodes.hosts[0]", HOSTS[0], "root", 22)
    look = probe.look_at(target, accelerators.ASCEND, access)
    assert look.problem is None and look.accelerators == 8
    refused = probe.problems([look], 16, "roll-cluster:nodes.acceleratorsPerNode", accelerators.ASCEND)
    assert refused == ["roll-cluster:nodes.acceleratorsPerNode: is 16, but `npu-smi info` on "
                       "roll-cluster:nodes.hosts[0] (198.18.0.11) lists 8 NPUs; every host must have the number this "
                       "key says (correct it, or leave that host out)"]


def test_a_host_without_the_driver_says_what_to_install(hosts: FakeHosts) -> None:
    hosts.add(HOSTS[0])  # no nvidia-smi answer: the driver is not loaded
    # An earlier look's long log on the host (the fake hosts share this machine's /tmp) must not bury the reason.
    earlier = Path("/tmp/roll-cluster-probe-node-0/accelerator-probe.log")
    earlier.parent.mkdir(parents=True, exist_ok=True)
    earlier.write_text("an earlier look\n" * 100)
    access = probe.HostAccess(None, "~/.ssh/roll-cluster/hosts.known_hosts")
    target = probe.HostTarget("node-0", "roll-cluster:nodes.hosts[0]", HOSTS[0], "root", 22)
    look = probe.look_at(target, accelerators.NVIDIA, access)
    assert look.accelerators is None and look.problem is not None
    assert look.problem.startswith("nvidia-smi -L failed: the NVIDIA driver does not answer; install the NVIDIA "
                                   "driver"), look.problem
    assert "an earlier look" not in look.problem


def test_the_offline_plan_does_not_look_and_says_when_the_look_happens(hosts: FakeHosts) -> None:
    result = run_program("hosts")  # no fake host answers: a look would fail the run
    assert hosts.calls() == []
    assert "count each host's accelerators over SSH (nvidia-smi -L)" in result.notes["host_look"]


def test_configuration_and_source_errors_are_shown_by_pulumi_without_a_traceback() -> None:
    # The Pulumi CLI prints a RunError's message only (pulumi/errors.py); any other exception as a traceback.
    from pulumi.errors import RunError

    from infra.sources.alibaba.placement import PlacementError

    assert issubclass(ConfigError, RunError) and issubclass(SourceError, RunError)
    assert issubclass(PlacementError, RunError)
    with pytest.raises(RunError, match=r"nodes\.acceleratorsPerNode"):
        run_program("hosts", config={"roll-cluster:nodes": {"acceleratorsPerNode": 0}})
