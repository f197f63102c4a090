"""The node bootstrap scripts, run for real with bash as infra/node/remote.py renders them.

Stand-ins (tests/standins/, first in PATH; see tests/helpers/script_harness.py) replace only what cannot exist on a test
machine: the vendor package repositories behind dnf/yum/apt-get (and rpm/dpkg's package database), systemd
(systemctl, systemd-run), dockerd behind the docker CLI, the NVIDIA driver (nvidia-smi) and toolkit (nvidia-ctk),
block devices and mounts (mkfs, blkid, mount, mountpoint), cloud-init, the ECS metadata service and mirrors (curl),
and the remote node behind ssh. Everything else is real: bash, git, python3, fuser, coreutils, the lock holders.
"""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from script_harness import FakeNode, Result, assert_failed, assert_ok, start_background, wait_until

# ---------------------------------------------------------------------------------------------------------------
# prepare-host


def test_prepare_host_formats_a_blank_disk_mounts_it_by_uuid_and_a_second_run_changes_nothing(node: FakeNode) -> None:
    disk = node.root / "dev-vdb"
    disk.write_text("")  # a blank disk: no signature

    first = node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE=str(disk))

    assert_ok(first)
    uuid = re.search(r"^UUID=(\S+)$", disk.read_text(), re.M)
    assert uuid, disk.read_text()
    fstab = (node.etc / "fstab").read_text()
    assert fstab == f"UUID={uuid.group(1)} {node.data_mount} ext4 defaults,nofail 0 2\n"
    assert node.mounts()[str(node.data_mount)][:2] == [f"UUID={uuid.group(1)}", "ext4"]
    for subdir in ("docker", "workspace", "ray/tmp", "ray/spill"):
        assert (node.data_mount / subdir).is_dir()

    before = node.snapshot()
    second = node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE=str(disk))

    assert_ok(second)
    assert node.snapshot() == before  # same files, none rewritten
    assert len(node.calls("mkfs")) == 1
    assert len(node.calls("mount")) == 1
    assert "never reformatted; mkfs skipped" in second.stdout
    assert "already present; skipped" in second.stdout
    assert "already mounted; skipped" in second.stdout


def test_prepare_host_never_reformats_a_disk_that_has_a_filesystem(node: FakeNode) -> None:
    disk = node.root / "dev-vdb"
    disk.write_text("TYPE=xfs\nUUID=0f1e2d3c-aaaa-bbbb-cccc-123456789abc\n")  # data from an earlier life
    (node.etc / "fstab").write_text("UUID=root-uuid / ext4 defaults 1 1\n# a comment\n")

    result = node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE=str(disk))

    assert_ok(result)
    assert node.calls("mkfs") == []
    assert disk.read_text() == "TYPE=xfs\nUUID=0f1e2d3c-aaaa-bbbb-cccc-123456789abc\n"
    assert (node.etc / "fstab").read_text() == (
        "UUID=root-uuid / ext4 defaults 1 1\n# a comment\n"
        f"UUID=0f1e2d3c-aaaa-bbbb-cccc-123456789abc {node.data_mount} xfs defaults,nofail 0 2\n"
    )


@pytest.mark.parametrize(("fs_type", "tool", "target"), [("xfs", "xfs_growfs", "mount"), ("ext4", "resize2fs", "disk")])
def test_prepare_host_grows_a_kept_filesystem_to_its_disk(node: FakeNode, fs_type: str, tool: str,
                                                          target: str) -> None:
    # A node booted from a baked image: its data disk is made from the image's snapshot at nodes.dataDiskGb, larger
    # than the filesystem on it; /data must get the whole disk.
    disk = node.root / "dev-vdb"
    disk.write_text(f"TYPE={fs_type}\nUUID=0f1e2d3c-aaaa-bbbb-cccc-123456789abc\n")

    result = node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE=str(disk))

    assert_ok(result)
    assert node.calls(tool) == [f"-- {node.data_mount if target == 'mount' else disk}"]


def test_prepare_host_does_not_grow_a_filesystem_it_just_made(node: FakeNode) -> None:
    disk = node.root / "dev-vdb"
    disk.write_text("")

    assert_ok(node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE=str(disk)))
    assert node.calls("resize2fs") == [] and node.calls("xfs_growfs") == []


def test_prepare_host_refuses_a_disk_with_a_partition_table_and_no_filesystem(node: FakeNode) -> None:
    disk = node.root / "dev-vdb"
    disk.write_text("PTTYPE=gpt\n")

    result = node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE=str(disk))

    assert_failed(result, "prepare-host: FAILED", f"{disk} has a partition table but no filesystem")
    assert node.calls("mkfs") == []


def test_prepare_host_without_a_data_disk_makes_data_a_plain_directory(node: FakeNode) -> None:
    result = node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE="")

    assert_ok(result)
    assert (node.data_mount / "docker").is_dir()
    assert not (node.etc / "fstab").exists()
    assert node.calls("mount") == [] and node.calls("mkfs") == []


def test_prepare_host_goes_on_when_cloud_init_ended_in_error(node: FakeNode) -> None:
    node.set_state("cloud-init-status", "status: error")  # and `cloud-init status` exits 1

    result = node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE="")

    assert_ok(result)
    assert "cloud-init finished with status 'error'" in result.stdout


def test_an_unexpected_failure_inside_a_step_names_the_step_and_the_command(node: FakeNode) -> None:
    blocker = node.root / "not-a-directory"
    blocker.write_text("")  # DATA_MOUNT below a file: mkdir fails deep inside a step function

    result = node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE="", DATA_MOUNT=f"{blocker}/data")

    assert_failed(result, """prepare-host: FAILED: command 'mkdir -p "$DATA_MOUNT"' exited 1""", "Not a directory")


def test_prepare_host_waits_for_cloud_init_then_fails_at_its_bound(node: FakeNode) -> None:
    node.fail_next("cloud-init-running-calls", 2)  # cloud-init still running for two polls, then done

    waited = node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE="")

    assert_ok(waited)
    assert "waiting up to 900s for cloud-init" in waited.stdout
    assert "cloud-init finished" in waited.stdout

    node.fail_next("cloud-init-running-calls", 1000)  # never finishes
    stuck = node.run_step("prepare-host", ["prepare_host.sh"], DATA_DISK_DEVICE="", CLOUD_INIT_TIMEOUT_S="1")

    assert_failed(stuck, "prepare-host: FAILED: timed out after 1s waiting for cloud-init to finish")


@pytest.mark.parametrize(
    ("os_id", "client", "tool"), [("alinux", "nfs-utils", "dnf"), ("ubuntu", "nfs-common", "apt-get")]
)
def test_prepare_host_mounts_the_nas_installing_the_nfs_client_and_retrying_the_mount(
    node: FakeNode, os_id: str, client: str, tool: str
) -> None:
    node.set_os(os_id)
    node.fail_next("mount-nfs", 2)  # the NAS mount target is not resolvable yet: two failures, then it mounts

    result = node.run_step("prepare-host", ["prepare_host.sh"], NAS_SERVER="abc123.cn-hangzhou.nas.aliyuncs.com")

    assert_ok(result)
    assert node.installed_packages() == [client]
    expected_line = (
        f"abc123.cn-hangzhou.nas.aliyuncs.com:/ {node.shared_mount} nfs vers=3,nolock,proto=tcp,rsize=1048576,"
        "wsize=1048576,hard,timeo=600,retrans=2,noresvport,_netdev,nofail 0 0"
    )
    assert expected_line in (node.etc / "fstab").read_text().splitlines()
    assert len(node.calls("mount")) == 3
    assert "retry 1/3" in result.stdout and "retry 2/3" in result.stdout
    assert node.mounts()[str(node.shared_mount)][:2] == ["abc123.cn-hangzhou.nas.aliyuncs.com:/", "nfs"]

    installs = len(node.calls(tool))
    again = node.run_step("prepare-host", ["prepare_host.sh"], NAS_SERVER="abc123.cn-hangzhou.nas.aliyuncs.com")

    assert_ok(again)
    assert len(node.calls(tool)) == installs
    assert f"already installed: {client}; skipped" in again.stdout
    assert len(node.calls("mount")) == 3


def test_prepare_host_mounts_a_changed_nas_in_place_of_the_old_one(node: FakeNode) -> None:
    old, new = "old111.cn-hangzhou.nas.aliyuncs.com", "new222.cn-hangzhou.nas.aliyuncs.com"
    assert_ok(node.run_step("prepare-host", ["prepare_host.sh"], NAS_SERVER=old))

    result = node.run_step("prepare-host", ["prepare_host.sh"], NAS_SERVER=new)

    assert_ok(result)
    assert node.mounts()[str(node.shared_mount)][:2] == [f"{new}:/", "nfs"]
    assert len(node.calls("umount")) == 1
    assert f"holds {old}:/, not {new}:/" in result.stdout
    fstab = (node.etc / "fstab").read_text()
    assert new in fstab and old not in fstab


def test_prepare_host_fails_naming_the_old_nas_when_it_cannot_be_unmounted(node: FakeNode) -> None:
    old, new = "old111.cn-hangzhou.nas.aliyuncs.com", "new222.cn-hangzhou.nas.aliyuncs.com"
    assert_ok(node.run_step("prepare-host", ["prepare_host.sh"], NAS_SERVER=old))
    node.fail_next("umount", 1)  # something on the node still uses the old NAS

    result = node.run_step("prepare-host", ["prepare_host.sh"], NAS_SERVER=new)

    assert_failed(result, "prepare-host", f"cannot unmount the old NAS {old}:/ from {node.shared_mount}")
    assert node.mounts()[str(node.shared_mount)][:2] == [f"{old}:/", "nfs"]


# ---------------------------------------------------------------------------------------------------------------
# docker


def docker_info(node: FakeNode) -> dict[str, object]:
    """What the stand-in dockerd was last (re)started with."""
    return dict(json.loads((node.state / "docker" / "running-config.json").read_text()))


def test_install_docker_on_alinux_then_a_second_run_changes_nothing(node: FakeNode) -> None:
    data_root = str(node.root / "data" / "docker")

    first = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT=data_root)

    assert_ok(first)
    docker_repo = (node.etc / "yum.repos.d" / "docker-ce.repo").read_text()
    # $releasever of Alibaba Cloud Linux 3 has no docker-ce repo: the CentOS 8 one is named explicitly.
    assert "baseurl=https://mirrors.aliyun.com/docker-ce/linux/centos/8/$basearch/stable" in docker_repo
    toolkit_repo = (node.etc / "yum.repos.d" / "nvidia-container-toolkit.repo").read_text()
    assert "baseurl=https://mirrors.aliyun.com/libnvidia-container/stable/rpm/$basearch" in toolkit_repo
    assert node.calls("dnf") == [
        "install -y docker-ce docker-ce-cli containerd.io nvidia-container-toolkit",
        "install -y pigz",  # unpigz on dockerd's PATH: layers decompress about twice as fast
    ]
    config = json.loads((node.etc / "docker" / "daemon.json").read_text())
    assert config["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert config["data-root"] == data_root
    assert config["max-concurrent-downloads"] == 10  # pulls fetch 10 layers at once, not Docker's 3
    assert docker_info(node) == config  # dockerd runs with the final configuration
    assert "enable --now docker" in node.calls("systemctl")
    assert not any(call.startswith("restart") for call in node.calls("systemctl"))

    before = node.snapshot()
    systemctl_calls = len(node.calls("systemctl"))
    second = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT=data_root)

    assert_ok(second)
    assert node.snapshot() == before
    assert len(node.calls("dnf")) == 2 and len(node.calls("nvidia-ctk")) == 1
    assert not any(call.startswith(("restart", "enable")) for call in node.calls("systemctl")[systemctl_calls:])
    for skipped in (
        "docker-ce.repo already configured; skipped",
        "already installed: docker-ce docker-ce-cli containerd.io nvidia-container-toolkit; skipped",
        "nvidia runtime already in",
        f"data-root already {data_root}",
        "max-concurrent-downloads already 10",
        "already installed: pigz (unpigz for layer decompression); skipped",
        "docker already enabled and running with this configuration; restart skipped",
    ):
        assert skipped in second.stdout


def test_install_docker_on_ubuntu_restarts_the_dockerd_the_package_started(node: FakeNode) -> None:
    node.set_os("ubuntu")
    # The Ubuntu package enables and starts dockerd at install time, before the nvidia runtime is configured.
    node.set_state("systemd/docker.enabled", "")
    node.set_state("systemd/docker.active", "")
    node.set_state("docker/running-config.json", "{}")

    result = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="")

    assert_ok(result)
    sources = node.etc / "apt" / "sources.list.d"
    keyrings = node.etc / "apt" / "keyrings"
    assert (sources / "docker-ce.list").read_text() == (
        f"deb [arch=amd64 signed-by={keyrings}/docker-ce.asc] "
        "https://mirrors.aliyun.com/docker-ce/linux/ubuntu jammy stable\n"
    )
    assert (sources / "nvidia-container-toolkit.list").read_text() == (
        f"deb [signed-by={keyrings}/nvidia-container-toolkit.asc] "
        "https://mirrors.aliyun.com/libnvidia-container/stable/deb/amd64 /\n"
    )
    assert "BEGIN PGP PUBLIC KEY BLOCK" in (keyrings / "docker-ce.asc").read_text()
    assert node.calls("apt-get")[0] == "update"
    assert node.calls("apt-get")[1].endswith(
        "install -y -o DPkg::Lock::Timeout=1800 docker-ce docker-ce-cli containerd.io nvidia-container-toolkit"
    )
    assert "restart docker" in node.calls("systemctl")
    assert "nvidia" in json.dumps(docker_info(node))

    restarts = node.calls("systemctl").count("restart docker")
    again = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="")

    assert_ok(again)
    assert node.calls("systemctl").count("restart docker") == restarts
    assert len(node.calls("curl")) == 2  # the keys were downloaded once


def test_install_docker_merges_into_an_existing_daemon_json(node: FakeNode) -> None:
    daemon_json = node.etc / "docker" / "daemon.json"
    daemon_json.parent.mkdir(parents=True)
    daemon_json.write_text('{"log-driver": "json-file", "log-opts": {"max-size": "100m"}}')

    result = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="/data/docker-root")

    assert_ok(result)
    config = json.loads(daemon_json.read_text())
    assert config["log-opts"] == {"max-size": "100m"} and config["log-driver"] == "json-file"
    assert config["data-root"] == "/data/docker-root" and "nvidia" in config["runtimes"]


def test_install_docker_waits_for_a_yum_lock_held_by_another_installer(node: FakeNode) -> None:
    pid_file = node.root / "run" / "yum.pid"
    # A package manager (the GPU driver installer's yum) holding the lock for 2 s; the dnf stand-in refuses to run
    # while it is held, as yum would, so a script that did not wait fails here.
    holder = start_background(["bash", "-c", f'echo $$ > "{pid_file}"; sleep 2; rm -f "{pid_file}"'])
    try:
        wait_until("the lock holder to write its pid", pid_file.exists)
        result = node.run_step("docker", ["install_docker.sh"])
    finally:
        holder.kill()

    assert_ok(result)
    assert f"package manager busy: {pid_file} (pid {holder.pid})" in result.stdout
    assert "package manager lock released" in result.stdout
    assert len([call for call in node.calls("dnf") if "docker-ce" in call]) == 1


def test_install_docker_fails_naming_a_lock_that_is_never_released(node: FakeNode) -> None:
    pid_file = node.root / "run" / "yum.pid"
    holder = start_background(["bash", "-c", f'echo $$ > "{pid_file}"; exec sleep 60'])
    try:
        wait_until("the lock holder to write its pid", pid_file.exists)
        result = node.run_step("docker", ["install_docker.sh"], PACKAGE_LOCK_TIMEOUT_S="1")
    finally:
        holder.kill()

    assert_failed(
        result,
        "docker: FAILED: timed out after 1s waiting for the package manager lock held by "
        f"{pid_file} (pid {holder.pid})",
    )
    assert node.calls("dnf") == []


def test_install_docker_waits_for_a_running_dnf_process(node: FakeNode) -> None:
    # A process with a name of its own (this machine's other processes must not count): what pgrep looks for.
    name = f"rcdnf{node.root.stat().st_ino % 100000}"
    fake_dnf = node.root / name
    fake_dnf.write_text("#!/bin/bash\nsleep 2\n")
    fake_dnf.chmod(0o755)
    holder = start_background([str(fake_dnf)])
    try:
        wait_until(
            "the dnf process to start",
            lambda: subprocess.run(["pgrep", "-x", name], capture_output=True).returncode == 0,
        )
        result = node.run_step("docker", ["install_docker.sh"], PACKAGE_MANAGER_PROCESSES=f"yum {name}")
    finally:
        holder.kill()

    assert_ok(result)
    assert f"package manager busy: a running {name} process (pid {holder.pid})" in result.stdout


def test_install_docker_waits_for_the_apt_lock_on_ubuntu(node: FakeNode) -> None:
    node.set_os("ubuntu")
    lock = node.apt_lock_files[0]
    lock.touch()
    holder = start_background(["bash", "-c", f'exec 9>"{lock}"; sleep 2'])  # holds the file open, as apt does
    try:
        wait_until(
            "the apt lock to be held", lambda: subprocess.run(["fuser", str(lock)], capture_output=True).returncode == 0
        )
        result = node.run_step("docker", ["install_docker.sh"])
    finally:
        holder.kill()

    assert_ok(result)
    assert f"package manager busy: {lock}" in result.stdout
    assert len([c for c in node.calls("apt-get") if " install " in f" {c} " and "docker-ce" in c]) == 1


def test_install_docker_retries_a_transient_package_failure(node: FakeNode) -> None:
    node.fail_next("dnf-install", 2)

    result = node.run_step("docker", ["install_docker.sh"])

    assert_ok(result)
    assert len(node.calls("dnf")) == 4  # 2 failed and 1 good try for Docker's packages, then pigz
    assert "retry 1/3" in result.stdout and "retry 2/3" in result.stdout


def test_a_node_without_pigz_in_its_repositories_still_gets_docker_and_says_pulls_are_slower(node: FakeNode) -> None:
    node.set_state("packages", "docker-ce\ndocker-ce-cli\ncontainerd.io\nnvidia-container-toolkit\n")
    node.fail_next("dnf-install", 1)  # the one install this run makes: pigz

    result = node.run_step("docker", ["install_docker.sh"])

    assert_ok(result)
    assert node.calls("dnf") == ["install -y pigz"]
    assert "WARNING: pigz could not be installed" in result.stdout
    assert "Docker's own gzip, about half as fast" in result.stdout
    assert "pigz" not in node.installed_packages()


def test_a_failing_package_install_names_the_step_and_shows_the_log_tail(node: FakeNode) -> None:
    node.fail_next("dnf-install", 1000)

    result = node.run_step("docker", ["install_docker.sh"], RETRY_ATTEMPTS="2")

    assert_failed(
        result,
        "docker: FAILED: installing docker-ce docker-ce-cli containerd.io nvidia-container-toolkit "
        "failed after 2 attempts",
        f"--- last 40 lines of {node.log_dir}/docker.log ---",
        "Error: Failed to download metadata for repo 'docker-ce-stable'",
    )
    assert len(node.calls("dnf")) == 2


def test_install_docker_fails_loudly_when_nvidia_ctk_fails(node: FakeNode) -> None:
    node.fail_next("nvidia-ctk", 1)

    result = node.run_step("docker", ["install_docker.sh"])

    assert_failed(result, "docker: FAILED: 'nvidia-ctk runtime configure --runtime=docker", "unable to load config")
    assert not (node.state / "systemd" / "docker.active").exists()


def test_install_docker_rejects_an_unsupported_os(node: FakeNode) -> None:
    node.set_os("centos7")

    result = node.run_step("docker", ["install_docker.sh"])

    assert_failed(result, "docker: FAILED: unsupported operating system ID='centos'")


# ---------------------------------------------------------------------------------------------------------------
# pull-image

PRIVATE_IMAGE = "myacr-registry-vpc.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-24.05-py3-torch260-vllm084"
PASSWORD = "s3cr3t-P@ss!w0rd"


def test_pull_image_logs_in_through_stdin_and_never_exposes_the_password(node: FakeNode) -> None:
    node.set_state("systemd/docker.active", "")
    node.set_state("docker/private-registry", "myacr-registry-vpc.cn-hangzhou.cr.aliyuncs.com")

    result = node.run_step(
        "pull-image",
        ["pull_image.sh"],
        IMAGE=PRIVATE_IMAGE,
        REGISTRY_USERNAME="puller@1234",
        REGISTRY_PASSWORD=PASSWORD,
    )

    assert_ok(result)
    assert (node.state / "docker" / "login-stdin").read_text() == PASSWORD  # it reached docker, through stdin
    docker_calls = node.calls("docker")
    # The image and its registry host come after `--`: operands for Docker's CLI, never options.
    assert (
        "login --username puller@1234 --password-stdin -- myacr-registry-vpc.cn-hangzhou.cr.aliyuncs.com"
        in docker_calls
    )
    assert f"pull -- {PRIVATE_IMAGE}" in docker_calls
    assert "logout -- myacr-registry-vpc.cn-hangzhou.cr.aliyuncs.com" in docker_calls
    assert all(c.endswith(f" -- {PRIVATE_IMAGE}") for c in docker_calls if c.startswith("image inspect"))
    everything_recorded = "\n".join(
        [result.output]
        + [p.read_text() for p in (node.state / "calls").iterdir()]
        + [p.read_text() for p in node.log_dir.iterdir()]
    )
    assert PASSWORD not in everything_recorded
    assert re.search(rf"pulled {re.escape(PRIVATE_IMAGE)} in \d+s \(sha256:[0-9a-f]{{64}}\)", result.stdout)


def test_pull_image_retries_then_skips_an_image_already_present(node: FakeNode) -> None:
    node.set_state("systemd/docker.active", "")
    node.fail_next("docker-pull", 2)
    image = "roll-registry.cn-hangzhou.cr.aliyuncs.com/roll/pytorch:nvcr-24.05-py3-torch260-vllm084"

    first = node.run_step("pull-image", ["pull_image.sh"], IMAGE=image)

    assert_ok(first)
    pulls = [c for c in node.calls("docker") if c.startswith("pull ")]
    assert len(pulls) == 3
    assert "retry 2/3" in first.stdout
    assert not any(c.startswith("login") for c in node.calls("docker"))

    second = node.run_step("pull-image", ["pull_image.sh"], IMAGE=image)

    assert_ok(second)
    assert f"{image} already present; pull skipped" in second.stdout
    assert len([c for c in node.calls("docker") if c.startswith("pull ")]) == 3


def test_pull_image_failure_names_the_step_and_the_registry_error(node: FakeNode) -> None:
    node.set_state("systemd/docker.active", "")
    node.fail_next("docker-pull", 1000)

    result = node.run_step("pull-image", ["pull_image.sh"], IMAGE="registry.example.test/x/y:1", RETRY_ATTEMPTS="2")

    assert_failed(
        result,
        "pull-image: FAILED: pulling registry.example.test/x/y:1 failed after 2 attempts",
        "connection reset by peer",
    )


# ---------------------------------------------------------------------------------------------------------------
# first-boot (user data) and gpu-check

DRIVER = {"DRIVER_VERSION": "550.127.08", "CUDA_VERSION": "12.4.1", "CUDNN_VERSION": "9.2.0.82"}


def gpu_check(node: FakeNode, **overrides: str) -> Result:
    settings = {"EXPECTED_GPUS": "2", "GPU_DRIVER": "auto-install", **overrides}
    return node.run_step("gpu-check", ["gpu_check.sh"], **settings)


def test_first_boot_runs_the_installer_in_the_background_and_defers_its_reboot(node: FakeNode) -> None:
    node.set_state("installer-seconds", "2")
    done_marker = node.roll_state / "driver-install.done"

    result = node.run_user_data("first_boot.sh", GPU_DRIVER="auto-install", **DRIVER)

    assert_ok(result)
    # Returned while the installer still works (it takes 2 s): the boot is not held up.
    assert not done_marker.exists()
    installing = gpu_check(node)
    assert installing.returncode == 3 and installing.stdout.startswith("INSTALLING"), str(installing)

    wait_until("the background installer to finish", done_marker.exists)
    assert "exit_status=0\nboot_id=boot-1\n" in done_marker.read_text()
    install_log = (node.auto_install_dir / "auto_install.log").read_text()
    assert "auto_install.sh args: 550.127.08 12.4.1 9.2.0.82 FALSE FALSE" in install_log
    # The first of the mirror addresses the metadata service lists.
    # Alibaba's current installer, v4.0 (RDMA and eRDMA flags last, in that order), not v3.1's auto_install.sh.
    assert node.calls("curl")[-1].endswith(
        "http://mirrors.cloud.example.test/opsx/ecs/linux/binary/script/auto_install_v4.0.sh"
    )
    # The installer's `reboot` hit the shim, not the machine.
    request = (node.roll_state / "reboot-requested").read_text()
    assert "boot_id=boot-1\n" in request and "command=reboot" in request
    assert not (node.state / "real-reboots").exists()

    pending = gpu_check(node)
    assert pending.returncode == 4 and pending.stdout.startswith("REBOOT_PENDING"), str(pending)

    node.boot_id_file.write_text("boot-2\n")  # the reboot gpu_ready makes; the driver is loaded afterwards
    node.set_state("nvidia-smi-gpus", "2")
    ready = gpu_check(node)
    assert ready.returncode == 0 and ready.stdout == "READY 2\n", str(ready)


def test_first_boot_run_again_starts_nothing(node: FakeNode) -> None:
    node.set_state("installer-seconds", "0")
    assert_ok(node.run_user_data("first_boot.sh", GPU_DRIVER="auto-install", **DRIVER))
    wait_until("the background installer to finish", (node.roll_state / "driver-install.done").exists)
    before = node.snapshot(node.roll_state, node.auto_install_dir)

    again = node.run_user_data("first_boot.sh", GPU_DRIVER="auto-install", **DRIVER)

    assert_ok(again)
    assert "GPU driver installer already started (boot_id=boot-1" in again.stdout and "skipped" in again.stdout
    assert len(node.calls("systemd-run")) == 1
    assert len(node.calls("curl")) == 2  # metadata + installer, once
    assert node.snapshot(node.roll_state, node.auto_install_dir) == before


def test_first_boot_with_a_preinstalled_driver_installs_nothing(node: FakeNode) -> None:
    result = node.run_user_data("first_boot.sh", GPU_DRIVER="preinstalled")

    assert_ok(result)
    assert "GPU_DRIVER=preinstalled: the image has the driver, nothing to install; skipped" in result.stdout
    assert node.calls("curl") == [] and node.calls("systemd-run") == []


def test_a_failed_installer_download_is_reported_by_gpu_check(node: FakeNode) -> None:
    node.fail_next("curl", 1000)

    result = node.run_user_data("first_boot.sh", GPU_DRIVER="auto-install", RETRY_ATTEMPTS="2", **DRIVER)

    assert_failed(
        result,
        "first-boot: FAILED: could not read the mirror address from http://100.100.100.200/latest/meta-data/source-address",
    )
    check = gpu_check(node)
    assert check.returncode == 2, str(check)
    assert check.stdout.startswith(
        "FAILED the GPU driver installer could not be started: could not read the mirror address"
    )


def test_gpu_check_reports_install_fail_with_the_last_40_lines_of_the_log(node: FakeNode) -> None:
    node.auto_install_dir.mkdir()
    lines = [f"install step {i}" for i in range(1, 61)] + ["INSTALL FAIL"]
    (node.auto_install_dir / "auto_install.log").write_text("\n".join(lines) + "\n")

    result = gpu_check(node)

    assert result.returncode == 2, str(result)
    assert result.stdout.startswith("FAILED GPU driver auto-install reported INSTALL FAIL")
    assert "install step 60\nINSTALL FAIL" in result.stdout
    assert "install step 22\n" in result.stdout and "install step 21\n" not in result.stdout


@pytest.mark.parametrize(
    ("log", "markers", "status", "line"),
    [
        ("", {}, 3, "INSTALLING installer not started yet (first-boot user data has not run)"),
        (
            "",
            {"driver-install.started": "boot_id=boot-0\nstarted_at=T0\n"},
            3,
            "INSTALLING installer started in an earlier boot at T0 and has not finished",
        ),
        # ALL INSTALL OK comes before the installer's end and its reboot request: not ready yet.
        (
            "ALL INSTALL OK\n",
            {"driver-install.started": "boot_id=boot-1\n"},
            3,
            "INSTALLING the installer reported ALL INSTALL OK and is finishing",
        ),
        (
            "step 1\n",
            {"driver-install.started": "boot_id=boot-1\n", "driver-install.done": "exit_status=7\nboot_id=boot-1\n"},
            2,
            "FAILED the GPU driver installer exited with status 7 without writing ALL INSTALL OK or INSTALL FAIL",
        ),
        # Installed in this boot, no reboot asked for, driver not loaded: a reboot is what loads it.
        (
            "ALL INSTALL OK\n",
            {"driver-install.started": "boot_id=boot-1\n", "driver-install.done": "exit_status=0\nboot_id=boot-1\n"},
            4,
            "REBOOT_PENDING driver installed in this boot but nvidia-smi cannot reach it yet",
        ),
        # A rerun of the installer appended a success after an earlier failure: the last verdict counts.
        (
            "INSTALL FAIL\nretrying\nALL INSTALL OK\n",
            {"driver-install.started": "boot_id=boot-0\n", "driver-install.done": "exit_status=0\nboot_id=boot-0\n"},
            5,
            "GPUS_MISSING 0 of 2 expected",
        ),
    ],
)
def test_gpu_check_reports_each_stage_of_the_auto_install(
    node: FakeNode, log: str, markers: dict[str, str], status: int, line: str
) -> None:
    if log:
        node.auto_install_dir.mkdir()
        (node.auto_install_dir / "auto_install.log").write_text(log)
    node.roll_state.mkdir()
    for name, content in markers.items():
        (node.roll_state / name).write_text(content)

    result = gpu_check(node)

    assert result.returncode == status, str(result)
    assert result.stdout.startswith(line), str(result)


@pytest.mark.parametrize(
    ("gpus", "status", "line"),
    [
        ("8", 0, "READY 8"),
        ("4", 5, "GPUS_MISSING 4 of 8 expected"),
        (None, 5, "GPUS_MISSING 0 of 8 expected; nvidia-smi failed"),
    ],
)
def test_gpu_check_with_a_preinstalled_driver_counts_gpus(
    node: FakeNode, gpus: str | None, status: int, line: str
) -> None:
    if gpus is not None:
        node.set_state("nvidia-smi-gpus", gpus)

    result = gpu_check(node, GPU_DRIVER="preinstalled", EXPECTED_GPUS="8")

    assert result.returncode == status, str(result)
    assert result.stdout.startswith(line)


# ---------------------------------------------------------------------------------------------------------------
# gpu-ready (local, over ssh)


def installed_driver_awaiting_reboot(node: FakeNode) -> None:
    """The node as first_boot.sh leaves it once the installer is done: ALL INSTALL OK, reboot deferred."""
    node.auto_install_dir.mkdir(exist_ok=True)
    (node.auto_install_dir / "auto_install.log").write_text("installing...\nALL INSTALL OK\n")
    node.roll_state.mkdir(exist_ok=True)
    (node.roll_state / "driver-install.started").write_text("boot_id=boot-1\nstarted_at=2026-01-01T00:00:00Z\n")
    (node.roll_state / "driver-install.done").write_text("exit_status=0\nboot_id=boot-1\n")
    (node.roll_state / "reboot-requested").write_text(
        "boot_id=boot-1\nrequested_at=2026-01-01T00:15:00Z\ncommand=reboot\n"
    )


def test_gpu_ready_reboots_the_node_once_and_survives_the_reboot(node: FakeNode) -> None:
    installed_driver_awaiting_reboot(node)
    node.set_state("nvidia-smi-gpus-after-reboot", "2")
    node.set_state("reboot-lag-calls", "2")  # still answers twice (REBOOT_PENDING) before it goes down
    node.set_state("reboot-down-calls", "4")  # then refuses ssh four times while it boots

    result = node.run_gpu_ready()

    assert_ok(result)
    assert len((node.state / "reboots").read_text().splitlines()) == 1
    assert [c for c in node.calls("ssh") if c.endswith("systemctl reboot")] != []
    assert len([c for c in node.calls("ssh") if c.endswith("systemctl reboot")]) == 1
    assert "rebooting 10.0.0.5 once to load it" in result.stdout
    assert "node not reachable over ssh (expected while it boots or reboots)" in result.stdout
    assert "READY 2" in result.stdout
    assert not (node.state / "real-reboots").exists()


def test_gpu_ready_tolerates_a_node_that_is_unreachable_for_a_while(node: FakeNode) -> None:
    node.set_state("nvidia-smi-gpus", "2")
    node.set_state("ssh-down-calls", "3")  # booting, or an unexpected reboot

    result = node.run_gpu_ready(GPU_DRIVER="preinstalled")

    assert_ok(result)
    assert len(node.calls("ssh")) == 4
    assert "Connection refused" in result.stdout
    assert not (node.state / "reboots").exists()


def test_gpu_ready_fails_when_gpus_stay_missing_after_the_driver_is_up(node: FakeNode) -> None:
    node.set_state("nvidia-smi-gpus", "1")

    result = node.run_gpu_ready(GPU_DRIVER="preinstalled", GPUS_MISSING_GRACE_S="1")

    assert_failed(
        result,
        "gpu-ready: FAILED: node test-node-0 (10.0.0.5) sees 1 GPU(s), expected 2, for 1s after the driver came up",
    )


def test_gpu_ready_times_out_naming_the_last_status_and_the_host(node: FakeNode) -> None:
    node.roll_state.mkdir()
    (node.roll_state / "driver-install.started").write_text("boot_id=boot-1\nstarted_at=2026-01-01T00:00:00Z\n")

    result = node.run_gpu_ready(TIMEOUT_S="1")

    assert_failed(
        result,
        "gpu-ready: FAILED: timed out after 1s waiting for GPUs on node test-node-0 (10.0.0.5); "
        "last status: INSTALLING since 2026-01-01T00:00:00Z",
    )


def test_gpu_ready_stops_at_once_on_install_fail_with_the_log_tail(node: FakeNode) -> None:
    node.auto_install_dir.mkdir()
    (node.auto_install_dir / "auto_install.log").write_text("nvidia driver build failed: gcc missing\nINSTALL FAIL\n")

    result = node.run_gpu_ready()

    assert_failed(result, "GPU driver installation failed on node test-node-0 (10.0.0.5): FAILED", "gcc missing")
    assert len(node.calls("ssh")) == 1


def test_gpu_ready_stops_at_once_when_the_host_key_changed(node: FakeNode) -> None:
    node.set_state("ssh-host-key-changed", "")

    result = node.run_gpu_ready()

    assert_failed(
        result,
        "the host key of 10.0.0.5 does not match the key recorded for node test-node-0 in",
        "another machine answers at this address",
    )
    assert len(node.calls("ssh")) == 1


# ---------------------------------------------------------------------------------------------------------------
# code


@pytest.fixture
def code_repo(tmp_path: Path) -> dict[str, str]:
    """A git repository with tags v1 and v2 (what CODE_REPO points at) and an archive of v1."""
    work = tmp_path / "upstream"
    work.mkdir()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(work), *args],
            check=True,
            capture_output=True,
            text=True,
            env={
                "PATH": "/usr/bin:/bin",
                "HOME": str(tmp_path),
                "GIT_AUTHOR_NAME": "t",
                "GIT_AUTHOR_EMAIL": "t@t",
                "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t",
            },
        ).stdout.strip()

    git("init", "-q")
    (work / "requirements.txt").write_text("ray==2.48.0\n")
    (work / "README.md").write_text("v1\n")
    git("add", ".")
    git("commit", "-q", "-m", "v1")
    git("tag", "v1")
    archive = tmp_path / "ROLL-v1.tar.gz"  # what GitHub serves as archive/v1.tar.gz: one top-level folder
    with tarfile.open(archive, "w:gz") as bundle:
        bundle.add(work / "README.md", arcname="ROLL-v1/README.md")
        bundle.add(work / "requirements.txt", arcname="ROLL-v1/requirements.txt")
    (work / "README.md").write_text("v2\n")
    git("commit", "-q", "-am", "v2")
    git("tag", "v2")
    bare = tmp_path / "ROLL.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, capture_output=True)
    # GitHub serves any reachable commit by hash; a local repository does so when told to.
    subprocess.run(["git", "-C", str(bare), "config", "uploadpack.allowAnySHA1InWant", "true"], check=True)
    return {"repo": str(bare), "v1": git("rev-parse", "v1"), "v2": git("rev-parse", "v2"), "archive": archive.as_uri()}


def run_code_step(node: FakeNode, **overrides: str) -> Result:
    settings = {
        "CONTAINER_NAME": "roll",
        "CODE_DIR": str(node.root / "container" / "workspace" / "ROLL"),
        "REQUIREMENTS_FILE": "requirements.txt",
        "INSTALL_EDITABLE": "1",
        "PIP_EXTRA_PACKAGES": "wandb tensorboard",
        **overrides,
    }
    return node.run_step("code", ["fetch_code.sh"], **settings)


def head_of(directory: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(directory), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_fetch_code_checks_out_the_ref_installs_and_a_second_run_only_verifies(
    node: FakeNode, code_repo: dict[str, str]
) -> None:
    node.set_state("docker/containers/roll", "true")
    code_dir = node.root / "container" / "workspace" / "ROLL"

    first = run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v1")

    assert_ok(first)
    assert head_of(code_dir) == code_repo["v1"]
    index = "-i https://mirrors.aliyun.com/pypi/simple/"
    assert node.calls("pip") == [
        f"cwd={code_dir} install --progress-bar off {index} -r requirements.txt",
        f"cwd={code_dir} install --progress-bar off {index} -- wandb tensorboard",
        f"cwd={code_dir} install --progress-bar off {index} -e . --no-deps",
    ]
    marker = Path(f"{code_dir}.roll-cluster-code").read_text()
    assert f"repo={code_repo['repo']}\nref=v1\ncommit={code_repo['v1']}\nsource=git\n" in marker

    second = run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v1")

    assert_ok(second)
    assert f"verified: {code_dir} holds {code_repo['repo']}@v1 ({code_repo['v1']}); fetch skipped" in second.stdout
    assert "requirements already installed for this checkout in this container; skipped" in second.stdout
    assert len(node.calls("pip")) == 3


def test_fetch_code_installs_again_in_a_recreated_container_without_fetching_again(
    node: FakeNode, code_repo: dict[str, str]
) -> None:
    node.set_state("docker/containers/roll", "true")
    node.set_state("docker/containers/roll.id", "aaaaaaaaaaaa-first")
    assert_ok(run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v1"))
    # pulumi-docker replaced the container: CODE_DIR survived on the /workspace bind mount, the pip installs did not.
    node.set_state("docker/containers/roll.id", "bbbbbbbbbbbb-second")

    result = run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v1")

    assert_ok(result)
    assert "fetch skipped" in result.stdout
    assert len(node.calls("pip")) == 6


def test_fetch_code_moves_the_checkout_to_another_ref_and_reinstalls(node: FakeNode, code_repo: dict[str, str]) -> None:
    node.set_state("docker/containers/roll", "true")
    code_dir = node.root / "container" / "workspace" / "ROLL"
    assert_ok(run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v1"))

    result = run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF=code_repo["v2"])  # a commit hash this time

    assert_ok(result)
    assert head_of(code_dir) == code_repo["v2"]
    assert (code_dir / "README.md").read_text() == "v2\n"
    assert "updating the existing checkout" in result.stdout
    assert len(node.calls("pip")) == 6


def test_fetch_code_keeps_a_checkout_with_local_edits(node: FakeNode, code_repo: dict[str, str]) -> None:
    node.set_state("docker/containers/roll", "true")
    code_dir = node.root / "container" / "workspace" / "ROLL"
    assert_ok(run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v1"))
    (code_dir / "README.md").write_text("my experiment\n")

    result = run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v2", CODE_ARCHIVE_URL=code_repo["archive"])

    assert_failed(result, f"code: FAILED: {code_dir} in container roll has local changes", "README.md")
    assert (code_dir / "README.md").read_text() == "my experiment\n"


def test_fetch_code_falls_back_to_the_archive_when_git_fails(
    node: FakeNode, code_repo: dict[str, str], tmp_path: Path
) -> None:
    node.set_state("docker/containers/roll", "true")
    code_dir = node.root / "container" / "workspace" / "ROLL"
    unreachable = str(tmp_path / "no-such-repo.git")

    result = run_code_step(node, CODE_REPO=unreachable, CODE_REF="v1", CODE_ARCHIVE_URL=code_repo["archive"])

    assert_ok(result)
    assert "falling back to the archive" in result.stdout
    assert (code_dir / "README.md").read_text() == "v1\n"
    assert "source=archive" in Path(f"{code_dir}.roll-cluster-code").read_text()
    assert len(node.calls("pip")) == 3

    again = run_code_step(node, CODE_REPO=unreachable, CODE_REF="v1", CODE_ARCHIVE_URL=code_repo["archive"])

    assert_ok(again)
    assert "from the archive); fetch skipped" in again.stdout
    assert len(node.calls("pip")) == 3


def test_fetch_code_takes_the_mirror_first_and_records_the_repo_itself(
    node: FakeNode, code_repo: dict[str, str], tmp_path: Path
) -> None:
    node.set_state("docker/containers/roll", "true")
    code_dir = node.root / "container" / "workspace" / "ROLL"
    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "clone", "-q", "--bare", code_repo["repo"], str(mirror)], check=True, capture_output=True)
    unreachable = str(tmp_path / "github-blocked.git")  # GitHub itself is not reached at all

    result = run_code_step(node, CODE_REPO=unreachable, CODE_REF="v1", CODE_MIRROR_REPO=str(mirror))

    assert_ok(result)
    assert f"checked out {unreachable}@v1 ({code_repo['v1']}) in {code_dir} from its mirror {mirror}" in result.stdout
    assert head_of(code_dir) == code_repo["v1"]
    assert f"repo={unreachable}\nref=v1\ncommit={code_repo['v1']}\nsource=git\n" in Path(
        f"{code_dir}.roll-cluster-code").read_text()
    again = run_code_step(node, CODE_REPO=unreachable, CODE_REF="v1", CODE_MIRROR_REPO=str(mirror))
    assert_ok(again)
    assert "fetch skipped" in again.stdout


def test_fetch_code_falls_back_from_a_failing_mirror_to_the_repo_then_to_the_archive(
    node: FakeNode, code_repo: dict[str, str], tmp_path: Path
) -> None:
    node.set_state("docker/containers/roll", "true")
    code_dir = node.root / "container" / "workspace" / "ROLL"
    stale_mirror = str(tmp_path / "stale-mirror.git")  # unreachable, or without the ref

    result = run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v2", CODE_MIRROR_REPO=stale_mirror)

    assert_ok(result)
    assert f"git fetch of the mirror {stale_mirror}@v2 failed; trying {code_repo['repo']}" in result.stdout
    assert head_of(code_dir) == code_repo["v2"]

    other = node.root / "container" / "workspace" / "OTHER"
    archived = run_code_step(
        node, CODE_DIR=str(other), CODE_REPO=str(tmp_path / "no-such-repo.git"), CODE_REF="v1",
        CODE_MIRROR_REPO=stale_mirror, CODE_ARCHIVE_URL=code_repo["archive"], RETRY_ATTEMPTS="1",
    )
    assert_ok(archived)
    assert "falling back to the archive" in archived.stdout and (other / "README.md").read_text() == "v1\n"


def test_fetch_code_fails_naming_both_sources_when_both_fail(node: FakeNode, tmp_path: Path) -> None:
    node.set_state("docker/containers/roll", "true")
    missing_archive = (tmp_path / "missing.tar.gz").as_uri()

    result = run_code_step(
        node,
        CODE_REPO=str(tmp_path / "no-such-repo.git"),
        CODE_REF="v1",
        CODE_ARCHIVE_URL=missing_archive,
        RETRY_ATTEMPTS="2",
    )

    assert_failed(
        result,
        f"code: FAILED: could not fetch the code: git fetch of {tmp_path}/no-such-repo.git@v1 failed (2 attempts) "
        f"and the archive {missing_archive} failed too (2 attempts)",
    )
    assert node.calls("pip") == []


def test_fetch_code_refuses_a_directory_it_did_not_fill(node: FakeNode, code_repo: dict[str, str]) -> None:
    node.set_state("docker/containers/roll", "true")
    code_dir = node.root / "container" / "workspace" / "ROLL"
    code_dir.mkdir(parents=True)
    (code_dir / "my-notes.txt").write_text("someone's work\n")

    result = run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v1")

    assert_failed(
        result, f"code: FAILED: {code_dir} in container roll already holds files that this step did not fetch"
    )
    assert (code_dir / "my-notes.txt").exists()


def test_fetch_code_retries_a_failing_pip_install_and_resumes_without_fetching_again(
    node: FakeNode, code_repo: dict[str, str]
) -> None:
    node.set_state("docker/containers/roll", "true")
    node.fail_next("pip", 1000)

    failed = run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v1", RETRY_ATTEMPTS="2")

    assert_failed(failed, "code: FAILED: pip install -r requirements.txt", "Could not find a version that satisfies")
    node.fail_next("pip", 0)
    resumed = run_code_step(node, CODE_REPO=code_repo["repo"], CODE_REF="v1")

    assert_ok(resumed)
    assert "fetch skipped" in resumed.stdout
    assert len(node.calls("pip")) == 2 + 3


def test_fetch_code_runs_the_openrlhf_spec_like_upstreams_dockerfile(node: FakeNode, code_repo: dict[str, str]) -> None:
    # The environment the program gives the OpenRLHF code step, as is, except what cannot exist here: the GitHub
    # repository (a local one at the same tag name) and /workspace (a directory of the fake node).
    from infra.config import ContainerConfig, TrainingConfig
    from infra.frameworks import OpenRlhfAdapter

    spec = OpenRlhfAdapter(TrainingConfig.model_validate({"framework": "openrlhf"}), ContainerConfig()).code()
    env = spec.env("roll")
    assert (env["CODE_REPO"], env["CODE_REF"]) == ("https://github.com/OpenRLHF/OpenRLHF.git", "v0.10.2")
    code_dir = node.root / "container" / env["CODE_DIR"].lstrip("/")
    subprocess.run(["git", "-C", code_repo["repo"], "tag", "v0.10.2", "v1"], check=True)
    node.set_state("docker/containers/roll", "true")
    settings = {**env, "CODE_REPO": code_repo["repo"], "CODE_DIR": str(code_dir), "CODE_ARCHIVE_URL": ""}

    first = node.run_step("code", ["fetch_code.sh"], **settings)

    assert_ok(first)
    assert head_of(code_dir) == code_repo["v1"]
    index = "-i https://mirrors.aliyun.com/pypi/simple/"
    calls = node.calls("pip")
    assert calls[0] == (
        f"cwd={code_dir} uninstall -y -- xgboost transformer_engine flash_attn pynvml opencv-python-headless"
    )
    assert calls[1].startswith(f"cwd={code_dir} install --progress-bar off {index} -- vllm==0.19.1 https://")
    assert calls[1].endswith(" openrlhf[vllm]==0.10.2") and len(calls) == 2
    assert "removed xgboost transformer_engine flash_attn pynvml opencv-python-headless; installed vllm" in first.stdout

    second = node.run_step("code", ["fetch_code.sh"], **settings)

    assert_ok(second)
    assert "requirements already installed for this checkout in this container; skipped" in second.stdout
    assert len(node.calls("pip")) == 2


def _restarts(node: FakeNode) -> int:
    return sum(call.startswith("restart") for call in node.calls("systemctl"))


def test_install_docker_lists_exactly_the_pull_caches_address_as_insecure_and_reloads_dockerd_when_it_changes(
        node: FakeNode) -> None:
    daemon_json = node.etc / "docker" / "daemon.json"
    daemon_json.parent.mkdir(parents=True, exist_ok=True)
    daemon_json.write_text(json.dumps({"insecure-registries": ["192.168.9.9:443"]}))  # the host's own entry

    first = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="", INSECURE_REGISTRIES="10.20.0.1:5000")
    assert_ok(first)
    assert json.loads(daemon_json.read_text())["insecure-registries"] == ["192.168.9.9:443", "10.20.0.1:5000"]
    assert docker_info(node)["insecure-registries"] == ["192.168.9.9:443", "10.20.0.1:5000"]  # dockerd has it
    restarts = _restarts(node)

    moved = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="", INSECURE_REGISTRIES="10.20.0.7:5000")
    assert_ok(moved)
    assert json.loads(daemon_json.read_text())["insecure-registries"] == ["192.168.9.9:443", "10.20.0.7:5000"]
    # The running dockerd has the new address through a reload (SIGHUP), not a restart.
    assert docker_info(node)["insecure-registries"] == ["192.168.9.9:443", "10.20.0.7:5000"]
    assert _restarts(node) == restarts and "reload docker" in node.calls("systemctl")
    assert "docker reloaded (SIGHUP through systemd)" in moved.stdout

    off = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="", INSECURE_REGISTRIES="")
    assert_ok(off)
    assert json.loads(daemon_json.read_text())["insecure-registries"] == ["192.168.9.9:443"]
    assert docker_info(node)["insecure-registries"] == ["192.168.9.9:443"] and _restarts(node) == restarts

    refused = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="", INSECURE_REGISTRIES="0.0.0.0/0")
    assert refused.returncode != 0 and "INSECURE_REGISTRIES must list IPv4:port addresses" in refused.stderr


def test_install_docker_reloads_a_running_dockerd_for_the_cache_and_leaves_its_container_running(
        node: FakeNode) -> None:
    # A running node of a cluster that grows past 32 nodes (the cache comes on), then shrinks below (it goes): its
    # dockerd gets the cache's address and then loses it by reloads, and the training container under it runs on.
    first = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="")
    assert_ok(first)
    node.set_state("docker/containers/roll", "true")
    restarts = _restarts(node)

    on = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="", INSECURE_REGISTRIES="10.20.0.1:5000")
    assert_ok(on)
    assert docker_info(node)["insecure-registries"] == ["10.20.0.1:5000"]
    off = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="", INSECURE_REGISTRIES="")
    assert_ok(off)
    # Emptied, the list stays as [] so that the reload clears the running dockerd's (it reloads the keys it finds).
    assert json.loads((node.etc / "docker" / "daemon.json").read_text())["insecure-registries"] == []
    assert docker_info(node)["insecure-registries"] == []
    assert _restarts(node) == restarts and node.calls("systemctl").count("reload docker") == 2
    assert (node.state / "docker" / "containers" / "roll").read_text().strip() == "true"


def test_install_docker_restarts_when_another_setting_changed_with_the_cache_address(node: FakeNode) -> None:
    first = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="")
    assert_ok(first)
    restarts = _restarts(node)

    both = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="", INSECURE_REGISTRIES="10.20.0.1:5000",
                         DOCKER_MAX_CONCURRENT_DOWNLOADS="7")
    assert_ok(both)
    assert _restarts(node) == restarts + 1 and "reload docker" not in node.calls("systemctl")
    assert docker_info(node)["max-concurrent-downloads"] == 7


def test_install_docker_fails_when_the_reload_leaves_the_old_list(node: FakeNode) -> None:
    first = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="")
    assert_ok(first)
    node.fail_next("docker-reload", 1)  # a dockerd that refuses the reloaded file keeps its list

    refused = node.run_step("docker", ["install_docker.sh"], DOCKER_DATA_ROOT="", INSECURE_REGISTRIES="10.20.0.1:5000",
                            DOCKER_START_TIMEOUT_S="2")
    assert refused.returncode != 0
    assert "dockerd did not apply insecure-registries '10.20.0.1:5000'" in refused.stderr, refused
