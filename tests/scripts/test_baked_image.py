"""A node booted from a baked image: every bootstrap step finds its work done, installs, pulls and reboots nothing,
and finishes in seconds. The real scripts run on a fake node (tests/helpers/script_harness.py, stand-ins in
tests/standins) that first bootstraps from scratch, as the head does before it is baked, then boots as a new
instance from its disks (tests/helpers/baked_node.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from baked_node import STEPS, boot_from_image, new_node, run_bootstrap
from script_harness import FakeNode

# Stand-ins whose calls mean work: package installs, the installer's download and start, mkfs, a pull, a reboot.
WORK = {
    "dnf": lambda call: call.startswith("install"),
    "yum": lambda call: call.startswith("install"),
    "apt-get": lambda call: call.startswith("install"),
    "curl": lambda call: True,
    "systemd-run": lambda call: True,
    "mkfs": lambda call: True,
    "nvidia-ctk": lambda call: True,
    "docker": lambda call: call.startswith(("pull", "login")),
    "ssh": lambda call: call.endswith("systemctl reboot"),
    "systemctl": lambda call: call.split()[0] in ("restart", "enable", "reboot"),
}


def work_done(node: FakeNode) -> dict[str, list[str]]:
    return {tool: calls for tool, is_work in WORK.items() if (calls := [c for c in node.calls(tool) if is_work(c)])}


@pytest.fixture
def baked(tmp_path: Path) -> FakeNode:
    """The head as it is baked: bootstrapped from scratch (installer, reboot, mkfs, packages, pull)."""
    node = new_node(tmp_path)
    results = run_bootstrap(node)
    for step in STEPS:
        assert results[step].returncode == 0, f"{step}: {results[step]}"
    # The new-node path does the work this test then expects to be skipped: the check is not vacuous.
    assert set(work_done(node)) >= {"dnf", "curl", "systemd-run", "mkfs", "docker", "ssh"}
    return node


def test_a_node_booted_from_a_baked_image_installs_pulls_and_reboots_nothing(baked: FakeNode) -> None:
    node = boot_from_image(baked)

    results = run_bootstrap(node)

    for step in STEPS:
        assert results[step].returncode == 0, f"{step}: {results[step]}"
    assert work_done(node) == {}
    assert not (node.state / "reboots").exists()
    said = {step: results[step].stdout for step in STEPS}
    assert "the NVIDIA driver already works (2 GPU(s) listed by nvidia-smi" in said["first-boot"]
    assert "installer skipped" in said["first-boot"]
    assert "already has a filesystem" in said["prepare-host"] and "already mounted; skipped" in said["prepare-host"]
    assert "already installed: docker-ce docker-ce-cli containerd.io nvidia-container-toolkit" in said["docker"]
    assert "restart skipped" in said["docker"]
    assert "already present; pull skipped" in said["pull-image"]
    assert "READY 2" in said["gpu-ready"] and "rebooting" not in said["gpu-ready"]
    # Seconds, not minutes: each step only checks (generous bound for a loaded 2-core machine).
    assert all(results[step].seconds < 20 for step in STEPS), {s: results[s].seconds for s in STEPS}


def test_first_boot_skips_the_installer_when_the_driver_works_even_without_earlier_state(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)
    node.set_state("nvidia-smi-gpus", "8")  # a custom image with the driver, but no roll-cluster state on it

    result = node.run_user_data("first_boot.sh", GPU_DRIVER="auto-install", DRIVER_VERSION="550.127.08",
                                CUDA_VERSION="12.4.1", CUDNN_VERSION="9.2.0.82")

    assert result.returncode == 0, str(result)
    assert node.calls("curl") == [] and node.calls("systemd-run") == []
    ready = node.run_step("gpu-check", ["gpu_check.sh"], EXPECTED_GPUS="8", GPU_DRIVER="auto-install")
    assert ready.returncode == 0 and ready.stdout == "READY 8\n", str(ready)


def test_first_boot_still_installs_when_nvidia_smi_fails(tmp_path: Path) -> None:
    node = FakeNode(tmp_path)  # nvidia-smi present (stand-in) but no driver loaded: it fails as the real one does

    result = node.run_user_data("first_boot.sh", GPU_DRIVER="auto-install", DRIVER_VERSION="550.127.08",
                                CUDA_VERSION="12.4.1", CUDNN_VERSION="9.2.0.82")

    assert result.returncode == 0, str(result)
    assert len(node.calls("systemd-run")) == 1
