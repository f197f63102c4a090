"""A fake node's whole bootstrap, new and "booted from a baked image", with the real scripts (script_harness).

Used by tests/scripts/test_baked_image.py (no step installs, pulls or reboots on a baked node) and by
bench/steps_bench.py (how long each step takes there). The order is the program's on one node
(components/bootstrap.py): first boot (user data), prepare-host, docker, pull-image, gpu-ready.

"Baking" keeps the node's disks (the temp dir: system disk files and the data-disk stand-in). "Booting" a new
instance from them happens in place (the same contents at the same paths) and changes what a new instance changes:
the boot id, cloud-init's per-instance state (user data runs again), the record of stand-in calls. What systemd does
at boot is kept: docker enabled, hence running; the fstab mounts; the driver loaded, so nvidia-smi sees the GPUs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from script_harness import FakeNode, Result, wait_until

IMAGE = "roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-24.05-py3-torch260-vllm084"
DRIVER = {"DRIVER_VERSION": "550.127.08", "CUDA_VERSION": "12.4.1", "CUDNN_VERSION": "9.2.0.82"}
STEPS = ("first-boot", "prepare-host", "docker", "pull-image", "gpu-ready")


def data_disk(node: FakeNode) -> Path:
    return node.root / "dev-vdb"


def step_settings(node: FakeNode) -> dict[str, dict[str, str]]:
    return {
        "prepare-host": {"DATA_DISK_DEVICE": str(data_disk(node))},
        "docker": {"DOCKER_DATA_ROOT": str(node.data_mount / "docker")},
        "pull-image": {"IMAGE": IMAGE},
    }


def run_bootstrap(node: FakeNode) -> dict[str, Result]:
    """Every bootstrap step once, as the program orders them on one node; stops at the first failure."""
    settings = step_settings(node)
    results: dict[str, Result] = {}
    results["first-boot"] = node.run_user_data("first_boot.sh", GPU_DRIVER="auto-install", **DRIVER)
    # cloud-init is done once the user data returned (first_boot.sh starts the installer in the background).
    (node.root / "cloud-init-boot-finished").write_text("")
    scripts = {"prepare-host": "prepare_host.sh", "docker": "install_docker.sh", "pull-image": "pull_image.sh"}
    for step, script in scripts.items():
        results[step] = node.run_step(step, [script], **settings[step])
        if results[step].returncode != 0:
            return results
    done = node.roll_state / "driver-install.done"
    if (node.roll_state / "driver-install.started").exists():
        wait_until("the background driver installer to finish", done.exists)
    results["gpu-ready"] = node.run_gpu_ready()
    return results


def new_node(root: Path) -> FakeNode:
    """A new instance from the public OS image: a blank data disk, no driver; the installer takes 0.2 s here."""
    node = FakeNode(root)
    data_disk(node).write_text("")
    node.set_state("nvidia-smi-gpus-after-reboot", "2")  # the driver loads at the reboot gpu-ready makes
    return node


def boot_from_image(node: FakeNode) -> FakeNode:
    """A new instance booted from an image of `node`: the same disk contents at the same paths (the node itself,
    with what a new instance changes)."""
    shutil.rmtree(node.state / "calls", ignore_errors=True)
    for name in ("reboots", "ssh-down-calls", "reboot-lag-calls", "reboot-down-calls"):
        (node.state / name).unlink(missing_ok=True)
    node.boot_id_file.write_text("boot-of-a-new-instance\n")
    # A new instance id: cloud-init runs the user data again and writes boot-finished afterwards.
    (node.root / "cloud-init-boot-finished").unlink(missing_ok=True)
    return node
