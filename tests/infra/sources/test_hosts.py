"""Your own servers (nodes.source hosts) and Ascend NPUs: the configuration rules a user meets first, the program
under the offline cloud (no cloud resource, the hosts' users and ports, sudo for a non-root user), and the node
scripts that differ on hosts (npu-ready, the docker step keeping an existing Docker, the image architecture check).
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import pytest
from offline_helpers import REMOTE, env_of, run, step_command
from script_harness import FakeNode
from test_config import ED25519_KEY, PROJECT, hosts_stack, only_problem, parse, problems

from devtools.offline_cloud import unwrap

H0 = {"address": "192.0.2.11", "privateAddress": "10.0.0.11"}
H1 = {"address": "192.0.2.12", "privateAddress": "10.0.0.12"}


def assert_words(message: str, *words: str) -> None:
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"


# ------------------------------------------------------------------------------------------ configuration
def test_a_host_list_gives_the_count_the_accelerators_and_a_tunnel_only_dashboard() -> None:
    config = parse(hosts_stack(acceleratorModel="NVIDIA A100 80GB"), region=None)
    assert config.nodes.count == 2 and config.nodes.gpus_per_node == 8
    assert config.nodes.has_bf16 and config.nodes.gpu_driver == "preinstalled"
    assert config.access.dashboard == "tunnel"
    assert config.region is None  # no Alibaba resource: the provider's region is not needed
    assert not parse(hosts_stack(acceleratorModel="Tesla V100-SXM2-32GB"), region=None).nodes.has_bf16
    ascend = hosts_stack(accelerator="ascend")
    ascend["training"] = {"framework": "custom", "custom": {"entrypoint": "python3 cli/train_grpo.py"}}
    ascend["container"] = {"image": "registry.example.com/me/cann-runtime:8.1.rc1-910b"}  # not the CUDA default
    assert parse(ascend, region=None).nodes.has_bf16


BAD_HOST_LISTS: list[tuple[dict[str, Any], str, tuple[str, ...]]] = [
    ({"hosts": []}, "nodes.hosts", ("at least one host", "got []")),
    ({"hosts": None}, "nodes.hosts", ("required with nodes.source hosts", "got null")),
    ({"hosts": [H0, {**H1, "address": "192.0.2.11"}]}, "nodes.hosts[1].address",
     ("must differ", "192.0.2.11", "nodes.hosts[0]")),
    ({"hosts": [H0, {**H1, "privateAddress": "10.0.0.11"}]}, "nodes.hosts[1].privateAddress",
     ("must differ", "10.0.0.11")),
    ({"hosts": [H0, {**H1, "privateAddress": "10.0.7.12"}]}, "nodes.hosts[1].privateAddress",
     ("must lie in the head's network 10.0.0.0/24", "nodes.privateNetwork", "10.0.7.12")),
    ({"hosts": [H0, H1], "privateNetwork": "10.0.0.8/30"}, "nodes.hosts[1].privateAddress",
     ("must lie in nodes.privateNetwork 10.0.0.8/30", "10.0.0.12")),
    ({"hosts": [H0, {"address": "gpu-2.example.com"}]}, "nodes.hosts[1].privateAddress",
     ("required when address is a DNS name", "gpu-2.example.com")),
    ({"hosts": [H0, {"address": "not a host!"}]}, "nodes.hosts[1].address", ("IP address or a DNS name",)),
    ({"hosts": [H0, H1], "count": 3}, "nodes.count", ("must equal the number of nodes.hosts (2)", "got 3")),
    ({"acceleratorsPerNode": None}, "nodes.acceleratorsPerNode", ("required with nodes.source hosts",)),
    ({"instanceTypes": ["ecs.gn7i-c8g1.2xlarge"]}, "nodes.instanceTypes",
     ("applies to nodes.source alibaba only", "remove it")),
    ({"dataDiskGb": 200}, "nodes.dataDiskGb", ("applies to nodes.source alibaba only",)),
    ({"gpuDriver": "auto-install"}, "nodes.gpuDriver", ("applies to nodes.source alibaba only",)),
    ({"hostDefaults": {"port": 70000}}, "nodes.hostDefaults.port", ("between 1 and 65535",)),
    ({"hostDefaults": {"networkInterface": "eth0; rm"}}, "nodes.hostDefaults.networkInterface",
     ("network interface name",)),
]


@pytest.mark.parametrize(("nodes", "path", "words"), BAD_HOST_LISTS, ids=[p for _, p, _ in BAD_HOST_LISTS])
def test_a_bad_host_list_is_refused_with_the_key_named(
    nodes: dict[str, Any], path: str, words: tuple[str, ...]
) -> None:
    sections = hosts_stack(**nodes)
    sections["nodes"] = {k: v for k, v in sections["nodes"].items() if v is not None or k == "hosts"}
    found_path, message = only_problem(sections, region=None)
    assert found_path == f"{PROJECT}:{path}"
    assert_words(message, *words)


@pytest.mark.parametrize(
    ("sections", "path", "words"),
    [
        ({"access": {"dashboard": "admin-cidrs"}}, "access.dashboard", ('must be "tunnel"', "runs any code")),
        ({"access": {"adminCidrs": ["203.0.113.0/24"]}}, "access.adminCidrs", ("alibaba only",)),
        ({"access": {"sshPublicKey": ED25519_KEY}}, "access.sshPublicKey", ("authorized_keys",)),
        ({"storage": {"nas": True}}, "storage.nas", ("alibaba only", "nfsServer or sharedHostPath")),
        ({"storage": {"nfsServer": "10.0.0.5", "sharedHostPath": "/shared/roll"}}, "storage.sharedHostPath",
         ("not be set together with nfsServer",)),
        ({"storage": {"nfsPath": "/export"}}, "storage.nfsPath", ("needs nfsServer",)),
        ({"storage": {"sharedHostPath": "shared"}}, "storage.sharedHostPath", ("absolute path",)),
        ({"training": {"framework": "verl"}, "nodes": {"accelerator": "ascend"}}, "training.framework",
         ("with nodes.accelerator ascend", '"verl"')),
    ],
)
def test_keys_that_do_not_fit_your_own_hosts_are_refused(
    sections: dict[str, Any], path: str, words: tuple[str, ...]
) -> None:
    stack = hosts_stack(**sections.pop("nodes", {}))
    for name, fields in sections.items():
        stack[name] = {**stack.get(name, {}), **fields}
    found_path, message = only_problem(stack, region=None)
    assert found_path == f"{PROJECT}:{path}"
    assert_words(message, *words)


def test_keys_of_hosts_are_refused_with_alibaba_and_ascend_needs_hosts() -> None:
    alibaba = {"instanceTypes": ["ecs.gn7i-c8g1.2xlarge"]}
    access = {"adminCidrs": ["203.0.113.0/24"], "sshPublicKey": ED25519_KEY}
    found = problems({"nodes": {**alibaba, "hosts": [H0]}, "access": access})
    assert found == [f"{PROJECT}:nodes.hosts: applies to nodes.source hosts only (with `alibaba` the instance type "
                     "decides the accelerators and the VPC the addresses): remove it; got " + json.dumps([H0])]
    (ascend,) = problems({"nodes": {**alibaba, "accelerator": "ascend"}, "access": access})
    assert ascend.startswith(f"{PROJECT}:nodes.accelerator: `ascend` needs nodes.source hosts")
    (nfs,) = problems({"nodes": alibaba, "access": access, "storage": {"nfsServer": "10.0.0.5"}})
    assert nfs.startswith(f"{PROJECT}:storage.nfsServer: applies to nodes.source hosts only")


# ------------------------------------------------------------------------------- the program on the hosts
def test_the_hosts_stack_creates_no_cloud_resource_and_reaches_each_host_as_configured() -> None:
    nodes = {
        "hosts": [
            {"address": "gpu-0.example.com", "privateAddress": "10.0.0.11", "user": "ops", "port": 2222},
            {"address": "192.0.2.12", "privateAddress": "10.0.0.12", "networkInterface": "bond0"},
        ],
        "hostDefaults": {"networkInterface": "eth1"},
    }
    result = run("hosts", config={"roll-cluster:nodes": nodes})
    types = {r.type for r in result.cloud.resources}
    assert not any(t.startswith("alicloud:") for t in types)
    head_steps = [r for r in result.cloud.of_type(REMOTE) if r.name.startswith("node-0-")]
    assert head_steps and all(unwrap(r.inputs["connection"])["user"] == "ops" for r in head_steps)
    assert all(unwrap(r.inputs["connection"])["port"] == 2222 for r in head_steps)
    # A non-root user runs every step's text (stdin) in a root bash under sudo; root runs it in a plain bash.
    assert unwrap(result.cloud.named("node-0-prepare-host").inputs["create"]).startswith("exec sudo -n bash -c ")
    assert unwrap(result.cloud.named("node-1-prepare-host").inputs["create"]).startswith("exec bash -c ")
    docker_env = env_of(step_command(result, "node-1-docker"))
    assert docker_env["KEEP_EXISTING_DOCKER"] == "1" and docker_env["NVIDIA_RUNTIME"] == "1"
    nfs = env_of(step_command(result, "node-1-prepare-host"))
    assert (nfs["NAS_SERVER"], nfs["NAS_REMOTE_PATH"]) == ("10.0.0.5", "/export/roll")
    envs = unwrap(result.cloud.named("node-1-container").inputs["envs"])
    assert "NCCL_SOCKET_IFNAME=bond0" in envs and "GLOO_SOCKET_IFNAME=bond0" in envs
    assert "NCCL_SOCKET_IFNAME=eth1" in unwrap(result.cloud.named("node-0-container").inputs["envs"])
    gpu_ready = unwrap(result.cloud.named("node-0-gpu-ready").inputs["environment"])
    assert gpu_ready["GPU_DRIVER"] == "preinstalled" and gpu_ready["COUNT_KEY"].endswith("acceleratorsPerNode")
    assert result.outputs["sshHead"] == (
        "ssh -i ~/.ssh/id_ed25519 -o IdentitiesOnly=yes -o ConnectTimeout=10 "
        "-o UserKnownHostsFile=~/.ssh/roll-cluster/hosts.known_hosts "
        "-o StrictHostKeyChecking=accept-new -p 2222 -- ops@gpu-0.example.com"
    )
    assert "-p 2222 -- ops@gpu-0.example.com" in result.outputs["jobLogs"]


def test_the_ascend_stack_checks_npus_and_passes_devices_not_privileged() -> None:
    result = run("ascend")
    npu = env_of(step_command(result, "node-0-npu-ready"))
    assert npu["EXPECTED_NPUS"] == "8" and npu["COUNT_KEY"] == "roll-cluster:nodes.acceleratorsPerNode"
    assert npu["DEVICES"].split() == [*(f"/dev/davinci{i}" for i in range(8)), "/dev/davinci_manager",
                                      "/dev/devmm_svm", "/dev/hisi_hdc"]
    assert "/usr/local/Ascend/driver" in npu["DRIVER_PATHS"].split()
    container = unwrap(result.cloud.named("node-0-container").inputs)
    assert container.get("gpus") is None and not container.get("privileged")
    assert env_of(step_command(result, "node-0-docker"))["NVIDIA_RUNTIME"] == "0"
    head = env_of(step_command(result, "node-0-ray-head"))
    assert (head["NUM_GPUS"], json.loads(head["RAY_RESOURCES"]), head["RAY_PRELOAD_JEMALLOC"]) == ("0", {"NPU": 8}, "1")
    assert env_of(step_command(result, "ray-ready"))["ACCELERATOR_RESOURCE"] == "NPU"
    privileged = run("ascend", config={"roll-cluster:container": {"privileged": True}})
    assert unwrap(privileged.cloud.named("node-1-container").inputs)["privileged"] is True


# ------------------------------------------------------------------------------------------- node scripts
NPU_SMI_INFO = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.rc3                 Version: 23.0.rc3                                              |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
{rows}+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 4242          | python                   | 1024                    |
+===========================+===============+====================================================+
"""
NPU_ROW = """\
| {i}     910B4               | OK            | 88.9        39                0    / 0             |
| 0                         | 0000:C{i}:00.0  | 0           0    / 0          2858 / 32768         |
"""


def install_npu_smi(node: FakeNode, npus: int) -> None:
    (node.state / "npu-smi-info.txt").write_text(NPU_SMI_INFO.format(rows="".join(NPU_ROW.format(i=i)
                                                                                    for i in range(npus))))
    tool = node.bin / "npu-smi"
    tool.write_text(f'#!/bin/bash\n[[ "$1" == info ]] && cat {node.state / "npu-smi-info.txt"}\n')
    tool.chmod(0o755)


def npu_ready(node: FakeNode, tmp_path: Path, **overrides: str) -> Any:
    driver = tmp_path / "Ascend" / "driver"
    driver.mkdir(parents=True, exist_ok=True)
    settings = {"EXPECTED_NPUS": "2", "COUNT_KEY": "roll-cluster:nodes.acceleratorsPerNode",
                "DEVICES": "/dev/null /dev/zero", "DRIVER_PATHS": str(driver), "NPU_SMI_PATHS": "",
                "INSTALL_HINT": "install the Ascend NPU driver", "RETRY_ATTEMPTS": "1", **overrides}
    return node.run_step("npu-ready", ["npu_lib.sh", "npu_ready.sh"], **settings)


def test_npu_ready_counts_the_npus_npu_smi_lists(node: FakeNode, tmp_path: Path) -> None:
    install_npu_smi(node, 2)
    result = npu_ready(node, tmp_path)
    assert result.returncode == 0, result
    assert "npu-smi info lists 2 NPUs, as expected" in result.stdout


def test_npu_ready_fails_naming_the_key_when_the_count_differs(node: FakeNode, tmp_path: Path) -> None:
    install_npu_smi(node, 8)
    result = npu_ready(node, tmp_path)
    assert result.returncode != 0
    assert_words(result.stderr, "npu-ready", "npu-smi info lists 8 NPUs",
                 "roll-cluster:nodes.acceleratorsPerNode says 2")


def test_npu_ready_without_a_driver_says_what_to_install(node: FakeNode, tmp_path: Path) -> None:
    result = npu_ready(node, tmp_path)
    assert result.returncode != 0
    assert_words(result.stderr, "npu-ready", "npu-smi not found", "install the Ascend NPU driver", "never installs")


def test_npu_ready_names_missing_device_and_driver_files(node: FakeNode, tmp_path: Path) -> None:
    install_npu_smi(node, 2)
    missing_device = npu_ready(node, tmp_path, DEVICES="/dev/null /dev/davinci97")
    assert missing_device.returncode != 0
    assert "device files missing on this host: /dev/davinci97" in missing_device.stderr
    missing_file = npu_ready(node, tmp_path, DRIVER_PATHS=str(tmp_path / "no-such-dcmi"))
    assert missing_file.returncode != 0 and "driver files missing on this host" in missing_file.stderr


def test_an_existing_docker_is_kept_and_nothing_is_installed(node: FakeNode) -> None:
    for name in ("systemd/docker.active", "systemd/docker.enabled"):
        node.set_state(name, "")
    node.set_state("docker/running-config.json", "{}")
    result = node.run_step("docker", ["install_docker.sh"], KEEP_EXISTING_DOCKER="1", NVIDIA_RUNTIME="0")
    assert result.returncode == 0, result
    assert node.calls("dnf") == [] and node.calls("nvidia-ctk") == []
    assert "used as it is, never reinstalled or upgraded" in result.stdout
    assert not any(call.startswith("restart") for call in node.calls("systemctl"))


def test_the_image_must_be_built_for_the_hosts_cpu(node: FakeNode) -> None:
    node.set_state("systemd/docker.active", "")
    other = "amd64" if platform.machine() in ("aarch64", "arm64") else "arm64"
    node.set_state("docker/image-arch", other)
    node.set_state("docker/running-config.json", "{}")
    result = node.run_step("pull-image", ["pull_image.sh"], IMAGE="example.com/rl:1", CHECK_IMAGE_ARCH="1")
    assert result.returncode != 0
    assert_words(result.stderr, "pull-image", f"is built for {other}", "use an image for")


def test_a_bad_host_list_stops_the_program_before_any_resource_or_step() -> None:
    from devtools.offline_cloud import OfflineCloud
    from infra.config import ConfigError

    cloud = OfflineCloud()
    duplicate = {"hosts": [H0, {**H1, "address": H0["address"]}]}
    with pytest.raises(ConfigError, match=r"roll-cluster:nodes\.hosts\[1\]\.address: must differ"):
        run("hosts", cloud=cloud, config={"roll-cluster:nodes": duplicate})
    assert [r for r in cloud.resources if r.custom] == []
