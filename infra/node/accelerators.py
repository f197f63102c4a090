"""Accelerators, one interface: everything that differs between NVIDIA GPUs and Ascend NPUs lives here.

What a kind decides: the readiness step (its name, script and what to install when the driver is missing), the
container's devices, driver mounts and environment, the Ray resource the nodes announce, whether Docker needs the
NVIDIA runtime, and whether Ray gets jemalloc preloaded. Plain data: the bootstrap turns it into pulumi-docker
arguments, the Ray steps into their environment, and the offline plan prints it.

Sources (see also verified-facts#accelerators-msrl-docker):
- Ascend devices and driver mounts: MindSpeed-RL's container guide (branch 2.2.0, docs/msrl_docker.md, no
  --privileged), ROLL's Ascend guide (docs_roll/.../ascend_docker_usage.md) and vllm-ascend's
  installation.md: /dev/davinci0..N-1, /dev/davinci_manager, /dev/devmm_svm, /dev/hisi_hdc;
  /usr/local/Ascend/driver, /usr/local/Ascend/add-ons, /usr/local/dcmi, npu-smi, /etc/ascend_install.info.
  The seed guide (seeds/002) runs --privileged with /usr/local/sbin mounted; here only npu-smi itself is mounted
  (from /usr/local/sbin, where the seed has it) and --privileged only on `container.privileged: true`.
- The Ray resource name "NPU", given explicitly as MindSpeed-RL's launch scripts do
  (examples/grpo/grpo_trainer_qwen25_7b.sh: `ray start ... --resources='{"NPU": N}'`); MindSpeed-RL's workers read
  their device from `get_accelerator_ids()["NPU"]`, so the name must be exactly "NPU".
- jemalloc for Ray: MindSpeed-RL install_guide.md (`LD_PRELOAD=/usr/lib/<arch>-linux-gnu/libjemalloc.so.2`,
  /usr/local/lib on openEuler source builds); the Ray steps look for it in the container (ray_common.sh).
UNCONFIRMED without Ascend hardware: that /usr/local/Ascend/add-ons exists on every driver release (ROLL mounts it;
MindSpeed-RL's guide does not), and that npu-smi lies in /usr/local/sbin on every host (vllm-ascend mounts
/usr/local/bin/npu-smi). The readiness step checks every path before the container is created and names what is
missing, so a different layout fails there, not inside training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["nvidia", "ascend"]

# Ascend driver files the container needs, mounted read-only at the same path (the CANN runtime finds the driver
# there; npu-smi is how users and the readiness step look at the NPUs).
ASCEND_DRIVER_MOUNTS = (
    "/usr/local/Ascend/driver",
    "/usr/local/Ascend/add-ons",
    "/usr/local/dcmi",
    "/usr/local/sbin/npu-smi",
    "/etc/ascend_install.info",
)
ASCEND_CONTROL_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")


@dataclass(frozen=True)
class Accelerator:
    kind: Kind
    ray_resource: str  # what Ray counts: "GPU" (--num-gpus) or "NPU" (a custom resource)
    ready_step: str  # the readiness step's name
    driver_tool: str  # what lists the devices on the host
    install_hint: str  # what to install when the driver is missing (the readiness step says it)
    nvidia_runtime: bool  # the docker step installs and registers the NVIDIA container runtime
    preload_jemalloc: bool  # Ray starts with jemalloc in LD_PRELOAD (found in the container)

    def devices(self, count: int) -> list[str]:
        """Device files passed into the container (`--device`), the same path inside."""
        if self.kind == "ascend":
            return [*(f"/dev/davinci{i}" for i in range(count)), *ASCEND_CONTROL_DEVICES]
        return []  # NVIDIA: `--gpus all` through the NVIDIA runtime

    @property
    def docker_gpus(self) -> str | None:
        return "all" if self.kind == "nvidia" else None

    @property
    def driver_mounts(self) -> tuple[str, ...]:
        """Host paths bind-mounted read-only at the same path (NVIDIA: the runtime injects the driver itself)."""
        return ASCEND_DRIVER_MOUNTS if self.kind == "ascend" else ()

    def container_env(self, interface: str | None) -> list[str]:
        """The container's environment for collective communication on the node's private NIC."""
        if interface is None:
            # Unknown NIC: NCCL's own choice minus Docker's bridge and loopback. Gloo and HCCL have no exclusion
            # syntax; they pick the interface of the host's address themselves.
            return ["NCCL_SOCKET_IFNAME=^docker,lo"]
        env = [f"NCCL_SOCKET_IFNAME={interface}", f"GLOO_SOCKET_IFNAME={interface}"]
        if self.kind == "ascend":
            # MindSpeed-RL docs/zh/algorithms/grpo.md and RL-2.2 msrl_docker.md: HCCL and the tensor
            # transport bind to the NIC of the node's IP.
            # see verified-facts#accelerators-grpo
            env += [f"HCCL_SOCKET_IFNAME={interface}", f"TP_SOCKET_IFNAME={interface}"]
        return env

    def ray_resources(self, count: int) -> tuple[int, dict[str, int]]:
        """(--num-gpus, --resources) for `ray start`."""
        if self.kind == "ascend":
            return 0, {"NPU": count}
        return count, {}


NVIDIA = Accelerator(
    kind="nvidia",
    ray_resource="GPU",
    ready_step="gpu-ready",
    driver_tool="nvidia-smi",
    install_hint="install the NVIDIA driver (one that supports the image's CUDA) so that `nvidia-smi -L` lists "
    "every GPU",
    nvidia_runtime=True,
    preload_jemalloc=False,
)
ASCEND = Accelerator(
    kind="ascend",
    ray_resource="NPU",
    ready_step="npu-ready",
    driver_tool="npu-smi",
    install_hint="install the Ascend NPU driver and firmware (Ascend HDK, e.g. 25.0.RC1 for CANN 8.1.RC1) so that "
    "`npu-smi info` lists every NPU",
    nvidia_runtime=False,
    preload_jemalloc=True,
)
_KINDS = {"nvidia": NVIDIA, "ascend": ASCEND}


def accelerator(kind: str) -> Accelerator:
    try:
        return _KINDS[kind]
    except KeyError:
        raise ValueError(f"roll-cluster:nodes.accelerator: unknown accelerator {kind!r}") from None
