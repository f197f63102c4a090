"""Issue 9 on the node scripts, run for real (tests/helpers/script_harness.py): the SSH host and login keys installed by
first boot, the driver installer and nvidia-fabricmanager, the gpu-ready loop's SSH options, the data disk found
by its serial on virtio and NVMe layouts, and /dev/shm sized for the container and Ray's object store."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_harness import FakeNode, assert_failed, assert_ok, wait_until

DRIVER = {"DRIVER_VERSION": "550.127.08", "CUDA_VERSION": "12.4.1", "CUDNN_VERSION": "9.2.0.82"}
HOST_PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDIKVIo8CcWgYjuIcYfPrgOgGbII roll-cluster-node-0-host"
HOST_PRIVATE = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"
LOGIN = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop"
SERIAL = "2ze6szkj0e6s0hsl6w5d"  # ECS disk d-2ze6szkj0e6s0hsl6w5d


# ---------------------------------------------------------------------------------------------------- first boot


def ssh_paths(node: FakeNode) -> dict[str, str]:
    return {"SSH_CONFIG_DIR": str(node.root / "etc-ssh"), "ROOT_SSH_DIR": str(node.root / "root-ssh")}


def test_first_boot_installs_the_generated_host_key_and_the_login_key_once(node: FakeNode) -> None:
    node.set_state("systemd/sshd.active", "")
    settings = {**ssh_paths(node), "GPU_DRIVER": "preinstalled", "SSH_HOST_KEY_ED25519": HOST_PRIVATE,
                "SSH_HOST_KEY_ED25519_PUB": HOST_PUB, "ROOT_AUTHORIZED_KEY": LOGIN}

    first = node.run_user_data("first_boot.sh", **settings)

    assert_ok(first)
    key = node.root / "etc-ssh" / "ssh_host_ed25519_key"
    assert key.read_text() == HOST_PRIVATE + "\n" and key.stat().st_mode & 0o777 == 0o600
    assert (node.root / "etc-ssh" / "ssh_host_ed25519_key.pub").read_text() == HOST_PUB + "\n"
    assert (node.state / "reloads").read_text() == "sshd\n"  # sshd serves the new key
    authorized = node.root / "root-ssh" / "authorized_keys"
    assert authorized.read_text() == LOGIN + "\n" and authorized.stat().st_mode & 0o777 == 0o600
    assert (node.root / "root-ssh").stat().st_mode & 0o777 == 0o700
    assert "PRIVATE KEY" not in first.output  # the key is never echoed

    again = node.run_user_data("first_boot.sh", **settings)

    assert_ok(again)
    assert authorized.read_text() == LOGIN + "\n"
    assert (node.state / "reloads").read_text() == "sshd\n"
    assert "host key already installed" in again.stdout and "login key already in" in again.stdout


def test_first_boot_labels_both_keys_for_selinux_and_fails_naming_restorecon_when_a_label_cannot_be_set(
    node: FakeNode,
) -> None:
    settings = {**ssh_paths(node), "GPU_DRIVER": "preinstalled", "SSH_HOST_KEY_ED25519": HOST_PRIVATE,
                "SSH_HOST_KEY_ED25519_PUB": HOST_PUB, "ROOT_AUTHORIZED_KEY": LOGIN}
    key = node.root / "etc-ssh" / "ssh_host_ed25519_key"

    assert_ok(node.run_user_data("first_boot.sh", **settings))
    assert node.calls("restorecon") == [f"-- {key} {key}.pub", f"-R -- {node.root / 'root-ssh'}"]

    node.fail_next("restorecon", 1)
    failed = node.run_user_data("first_boot.sh", **{**settings, "ROOT_AUTHORIZED_KEY": LOGIN + "2"})

    # A login key sshd may refuse under SELinux is named at first boot, not left to a refused login later.
    assert_failed(failed, "restorecon -R --", "Could not set context")


def test_first_boot_keeps_the_other_keys_of_root(node: FakeNode) -> None:
    (node.root / "root-ssh").mkdir()
    (node.root / "root-ssh" / "authorized_keys").write_text("ssh-rsa AAAAexisting ops@bastion\n")

    assert_ok(node.run_user_data("first_boot.sh", **ssh_paths(node), GPU_DRIVER="preinstalled",
                                 ROOT_AUTHORIZED_KEY=LOGIN))

    assert (node.root / "root-ssh" / "authorized_keys").read_text() == f"ssh-rsa AAAAexisting ops@bastion\n{LOGIN}\n"


@pytest.mark.parametrize(
    ("os_id", "manager", "package"),
    [
        ("alinux", "dnf", "rhel8/x86_64/nvidia-fabric-manager-550.127.08-1.x86_64.rpm"),
        ("ubuntu", "apt-get", "ubuntu2204/x86_64/nvidia-fabricmanager-550_550.127.08-1_amd64.deb"),
    ],
)
def test_first_boot_adds_fabric_manager_at_the_drivers_version_on_nvswitch_types(
    node: FakeNode, os_id: str, manager: str, package: str
) -> None:
    node.set_os(os_id)
    node.set_state("installer-seconds", "0")

    result = node.run_user_data("first_boot.sh", **ssh_paths(node), GPU_DRIVER="auto-install",
                                FABRIC_MANAGER="true", **DRIVER)

    assert_ok(result)
    wait_until("the installer unit to end", (node.roll_state / "driver-install.done").exists)
    downloads = [c for c in node.calls("curl") if "compute/cuda/repos" in c]
    assert len(downloads) == 1 and downloads[0].endswith(
        "https://developer.download.nvidia.com/compute/cuda/repos/" + package
    )
    installs = [c for c in node.calls(manager) if c.startswith("install")]
    assert len(installs) == 1 and installs[0].endswith(package.rsplit("/", 1)[1])
    assert (node.state / "systemd" / "nvidia-fabricmanager.enabled").exists()
    # The reboot the installer asked for waits until the fabric manager is in (the whole unit has ended).
    check = node.run_step("gpu-check", ["gpu_check.sh"], EXPECTED_GPUS="8", FABRIC_MANAGER="true")
    assert check.returncode == 4 and check.stdout.startswith("REBOOT_PENDING"), str(check)
    # After the reboot the service runs (the stand-in starts what is enabled only when told): ready once it does.
    node.boot_id_file.write_text("boot-2\n")
    node.set_state("nvidia-smi-gpus", "8")
    starting = node.run_step("gpu-check", ["gpu_check.sh"], EXPECTED_GPUS="8", FABRIC_MANAGER="true")
    assert starting.returncode == 3 and "nvidia-fabricmanager is enabled and not running yet" in starting.stdout
    node.set_state("systemd/nvidia-fabricmanager.active", "")
    ready = node.run_step("gpu-check", ["gpu_check.sh"], EXPECTED_GPUS="8", FABRIC_MANAGER="true")
    assert ready.returncode == 0 and ready.stdout == "READY 8\n", str(ready)


@pytest.mark.parametrize(
    ("os_id", "manager", "missing", "package"),
    [
        # From the 580 branch NVIDIA's CUDA repository drops the old names (docs/verified-facts.md 3): the rpm is
        # nvidia-fabricmanager with an el8 dist tag, the deb has no branch suffix.
        ("alinux", "dnf", "", "rhel8/x86_64/nvidia-fabricmanager-580.126.09-1.el8.x86_64.rpm"),
        ("ubuntu", "apt-get", "", "ubuntu2204/x86_64/nvidia-fabricmanager_580.126.09-1_amd64.deb"),
        # The other spelling is tried when the first is not there.
        ("alinux", "dnf", "nvidia-fabricmanager-580.126.09-1.el8.x86_64.rpm",
         "rhel8/x86_64/nvidia-fabricmanager-580.126.09-1.x86_64.rpm"),
        ("ubuntu", "apt-get", "nvidia-fabricmanager_580.126.09-1_amd64.deb",
         "ubuntu2204/x86_64/nvidia-fabricmanager-580_580.126.09-1_amd64.deb"),
    ],
)
def test_fabric_manager_from_the_580_branch_uses_the_repositorys_new_file_names(
    node: FakeNode, os_id: str, manager: str, missing: str, package: str
) -> None:
    node.set_os(os_id)
    node.set_state("installer-seconds", "0")
    node.set_state("repo-missing", missing + "\n")

    result = node.run_user_data("first_boot.sh", **ssh_paths(node), GPU_DRIVER="auto-install", FABRIC_MANAGER="true",
                                **{**DRIVER, "DRIVER_VERSION": "580.126.09", "CUDA_VERSION": "12.8.1"})

    assert_ok(result)
    wait_until("the installer unit to end", (node.roll_state / "driver-install.done").exists)
    assert not (node.roll_state / "fabric-manager.failed").exists()
    downloads = [c for c in node.calls("curl") if "compute/cuda/repos" in c]
    assert downloads[-1].endswith("https://developer.download.nvidia.com/compute/cuda/repos/" + package)
    assert len(downloads) == (2 if missing else 1)
    installs = [c for c in node.calls(manager) if c.startswith("install")]
    assert len(installs) == 1 and installs[0].endswith(package.rsplit("/", 1)[1])
    assert (node.state / "systemd" / "nvidia-fabricmanager.enabled").exists()


def test_first_boot_without_nvswitch_installs_no_fabric_manager(node: FakeNode) -> None:
    node.set_state("installer-seconds", "0")
    assert_ok(node.run_user_data("first_boot.sh", **ssh_paths(node), GPU_DRIVER="auto-install", **DRIVER))
    wait_until("the installer unit to end", (node.roll_state / "driver-install.done").exists)
    assert [c for c in node.calls("curl") if "compute/cuda/repos" in c] == []


def test_a_failed_fabric_manager_download_fails_the_gpu_check_with_the_reason(node: FakeNode) -> None:
    node.set_state("installer-seconds", "0")
    (node.auto_install_dir).mkdir(parents=True, exist_ok=True)
    result = node.run_user_data("first_boot.sh", **ssh_paths(node), GPU_DRIVER="auto-install",
                                FABRIC_MANAGER="true", FABRIC_MANAGER_REPO="https://nowhere.example.test/repos",
                                **DRIVER)
    assert_ok(result)
    wait_until("the installer unit to end", (node.roll_state / "driver-install.done").exists)

    check = node.run_step("gpu-check", ["gpu_check.sh"], EXPECTED_GPUS="8", FABRIC_MANAGER="true")

    assert check.returncode == 2, str(check)
    assert check.stdout.startswith("FAILED nvidia-fabricmanager (needed by this 8-GPU NVSwitch type) could not be "
                                   "installed: could not download https://nowhere.example.test/repos/rhel8/")


def test_a_preinstalled_image_without_fabric_manager_fails_on_an_nvswitch_type(node: FakeNode) -> None:
    node.set_state("nvidia-smi-gpus", "8")

    check = node.run_step("gpu-check", ["gpu_check.sh"], EXPECTED_GPUS="8", GPU_DRIVER="preinstalled",
                          FABRIC_MANAGER="true")

    assert check.returncode == 2, str(check)
    assert "needs nvidia-fabricmanager, which is neither running nor enabled" in check.stdout
    assert "the image must have it (nodes.image)" in check.stdout
    node.set_state("systemd/nvidia-fabricmanager.active", "")
    ready = node.run_step("gpu-check", ["gpu_check.sh"], EXPECTED_GPUS="8", GPU_DRIVER="preinstalled",
                          FABRIC_MANAGER="true")
    assert ready.returncode == 0, str(ready)


# ---------------------------------------------------------------------------------------------------- gpu-ready


def test_gpu_ready_verifies_the_node_against_the_stacks_known_hosts_and_never_prompts(node: FakeNode) -> None:
    node.set_state("nvidia-smi-gpus", "2")
    key = node.root / "id_ed25519"
    key.write_text("key")

    result = node.run_gpu_ready(GPU_DRIVER="preinstalled", SSH_KEY_PATH=str(key),
                                KNOWN_HOSTS_FILE="~/.ssh/roll-cluster/dev.known_hosts")

    assert_ok(result)
    call = node.calls("ssh")[0]
    for option in ("-o BatchMode=yes", "-o StrictHostKeyChecking=yes",
                   "-o UserKnownHostsFile=~/.ssh/roll-cluster/dev.known_hosts", "-o GlobalKnownHostsFile=/dev/null",
                   f"-i {key} -o IdentitiesOnly=yes"):
        assert option in call, call
    assert "accept-new" not in call


def test_gpu_ready_needs_the_known_hosts_file(node: FakeNode) -> None:
    assert_failed(node.run_gpu_ready(KNOWN_HOSTS_FILE=""), "KNOWN_HOSTS_FILE is required")


# ---------------------------------------------------------------------------------------------------- data disk


def disk_layout(node: FakeNode, layout: str) -> Path:
    """A blank data disk as the guest shows it: under /dev/disk/by-id by its serial (virtio or NVMe naming), or
    only in sysfs (no udev link)."""
    dev = node.root / "dev"
    by_id = dev / "disk" / "by-id"
    by_id.mkdir(parents=True)
    sys_block = node.root / "sys-block"
    sys_block.mkdir()
    (dev / "vda").write_text("TYPE=ext4\nUUID=11111111-2222-3333-4444-555555555555\n")  # the system disk
    (by_id / "virtio-2zeSYSTEMDISK000000").symlink_to(dev / "vda")
    if layout == "virtio":
        device = dev / "vdb"
        device.write_text("")
        (by_id / f"virtio-{SERIAL}").symlink_to(device)
    elif layout == "nvme":
        device = dev / "nvme1n1"
        device.write_text("")
        (by_id / f"nvme-Alibaba_Cloud_Elastic_Block_Storage_{SERIAL}").symlink_to(device)
        (by_id / f"nvme-nvme.1d0f-{SERIAL}-Alibaba").symlink_to(device)  # another udev name for the same disk
    else:  # sysfs only
        device = dev / "nvme1n1"
        device.write_text("")
        (sys_block / "nvme0n1" / "device").mkdir(parents=True)
        (sys_block / "nvme0n1" / "device" / "serial").write_text("2zeSYSTEMDISK000000\n")
        (sys_block / "nvme1n1" / "device").mkdir(parents=True)
        (sys_block / "nvme1n1" / "device" / "serial").write_text(f"{SERIAL}    \n")
    return device


def disk_env(node: FakeNode) -> dict[str, str]:
    return {"DATA_DISK_SERIAL": SERIAL, "DISK_BY_ID_DIR": str(node.root / "dev" / "disk" / "by-id"),
            "SYS_BLOCK_DIR": str(node.root / "sys-block"), "DEV_DIR": str(node.root / "dev")}


@pytest.mark.parametrize("layout", ["virtio", "nvme", "sysfs"])
def test_prepare_host_finds_the_data_disk_by_its_serial(node: FakeNode, layout: str) -> None:
    device = disk_layout(node, layout)

    result = node.run_step("prepare-host", ["prepare_host.sh"], **disk_env(node))

    assert_ok(result)
    assert device.read_text().startswith("TYPE=ext4\nUUID=")  # formatted: this disk and no other
    assert (node.root / "dev" / "vda").read_text().startswith("TYPE=ext4\nUUID=11111111")
    assert len(node.calls("mkfs")) == 1
    assert f"data disk d-{SERIAL} is" in result.stdout
    assert node.mounts()[str(node.data_mount)][1] == "ext4"


def test_prepare_host_fails_naming_the_disk_id_when_no_disk_has_the_serial(node: FakeNode) -> None:
    disk_layout(node, "virtio")
    env = {**disk_env(node), "DATA_DISK_SERIAL": "bp1nosuchdisk0000000", "DATA_DISK_WAIT_TIMEOUT_S": "1"}

    result = node.run_step("prepare-host", ["prepare_host.sh"], **env)

    assert_failed(result, "no disk with serial bp1nosuchdisk0000000 (the ECS data disk d-bp1nosuchdisk0000000)")
    assert node.calls("mkfs") == []


# ---------------------------------------------------------------------------------------------------- /dev/shm


def shm_env(node: FakeNode, size: str, store: str = "") -> dict[str, str]:
    meminfo = node.root / "meminfo"
    meminfo.write_text("MemTotal:       65536000 kB\nMemFree:        60000000 kB\n")
    return {"SHM_SIZE": size, "SHM_MOUNT": str(node.root / "dev-shm"), "OBJECT_STORE_MEMORY_GB": store,
            "MEMINFO_FILE": str(meminfo)}


def test_prepare_host_sizes_the_hosts_shm_for_the_container_and_keeps_it_across_reboots(node: FakeNode) -> None:
    shm = str(node.root / "dev-shm")
    node.set_state("tmpfs-sizes", f"{shm}\t4096000\n")  # what the OS made it

    first = node.run_step("prepare-host", ["prepare_host.sh"], **shm_env(node, "16g", "12"))

    assert_ok(first)
    assert f"tmpfs {shm} tmpfs defaults,size=16g 0 0" in (node.etc / "fstab").read_text().splitlines()
    assert [c for c in node.calls("mount") if "remount" in c] == [f"-o remount,size=16g {shm}"]
    assert "resized to 16g" in first.stdout and "object store (12 GB) fits" in first.stdout

    again = node.run_step("prepare-host", ["prepare_host.sh"], **shm_env(node, "16g", "12"))

    assert_ok(again)
    assert len([c for c in node.calls("mount") if "remount" in c]) == 1
    assert "already 16g; skipped" in again.stdout


def test_prepare_host_fails_when_ray_object_store_does_not_fit_in_shm(node: FakeNode) -> None:
    shm = str(node.root / "dev-shm")
    node.set_state("tmpfs-sizes", f"{shm}\t4096000\n")

    result = node.run_step("prepare-host", ["prepare_host.sh"], **shm_env(node, "", "12"))

    assert_failed(result, "ray.objectStoreMemoryGb (12 GB) does not fit in", "raise container.shmSize")


def test_prepare_host_refuses_a_shm_larger_than_the_nodes_memory(node: FakeNode) -> None:
    result = node.run_step("prepare-host", ["prepare_host.sh"], **shm_env(node, "128g"))
    assert_failed(result, "container.shmSize 128g is more than this node's memory")
