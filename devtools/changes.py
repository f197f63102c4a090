"""What a changed setting does to a running cluster, and what a reboot does: the offline plan and the README show
this table, and tests hold the program to it (tests/scripts/test_runtime_reliability.py).

How each effect comes about: a Ray step's command carries its settings (and the secrets, as secrets), so a change
reruns the step; the step compares the settings Ray was started with (recorded in the container, see
infra/scripts/ray_common.sh) and restarts Ray when they differ. The workers, the readiness gate and the job carry
the cluster's Ray generation (infra.ray.step_env.ray_generation), so they rerun when the head's Ray restarts.
The container is replaced when its image, shm size or NAS changes (pulumi-docker replaces a container whose
inputs change), and the Ray steps with it (their triggers hold the container id).
"""

from __future__ import annotations

# (what changes, what happens)
CHANGE_EFFECTS: tuple[tuple[str, str], ...] = (
    ("ray.gcsPort, ray.dashboardPort, ray.clientPort, ray.objectStoreMemoryGb, access.dashboard (the dashboard host)",
     "Ray restarts on every node with the new settings (the step names what differs); the job is submitted again"),
    ("wandbApiKey, hfToken (a rotated secret)",
     "Ray restarts on every node so the raylet and jobs get the new value; the job is submitted again"),
    ("container.image, container.shmSize, storage.nas (the NAS)",
     "the training containers are recreated (Ray stopped first), Ray starts in the new ones; the job is submitted "
     "again"),
    ("training.* (the job's configuration)",
     "only the job: the old one is stopped, the new one submitted under a new submission id; Ray keeps running"),
    ("training.openrlhf.rewardServer (added, removed, its gpus) or train.colocate_all with one",
     "the GPUs the head's Ray may use change (without colocate_all it leaves the server's out): Ray restarts on "
     "every node naming --num-gpus and CUDA_VISIBLE_DEVICES; the job is submitted again"),
    ("nodes.paused set (python3 -m companion pause)",
     "every instance stops in economical mode (StopCharging: compute, GPUs and public IPs stop billing; disks and NAS "
     "do not); no node step runs (tests/offline/test_pause_and_cost.py)"),
    ("nodes.paused removed (python3 -m companion resume, with --refresh)",
     "the instances start (stock in the zone needed), new public IPs: the node steps run again, Ray re-forms, and the "
     "job (it carries the head's start time) is submitted again and resumes from its newest checkpoint"),
    ("nodes.count",
     "Ray keeps running on the nodes that stay; new nodes join, removed ones leave (`ray stop`), the readiness gate "
     "checks again; a job whose configuration depends on the node count is replaced as for training.*"),
    # Alibaba: the provider's ForceNew fields of the instance (devtools/provider_rules/alicloud.json: data_disks.*
    # with category and bursting_enabled, spot_strategy, spot_price_limit, system_disk_category) and the program's
    # replace_on_changes (vswitchId, instanceType, dataDisks for its performanceLevel: components/alibaba/gpu_node.py).
    # tests/offline/test_alibaba_real_account.py holds the offline cloud to these rows.
    ("nodes.dataDiskGb (0 to N too), nodes.dataDiskCategory, nodes.dataDiskPerformanceLevel, nodes.dataDiskBursting, "
     "nodes.spot, nodes.spotPriceLimit (Alibaba); nodes.image set later with a data disk larger than "
     "nodes.dataDiskGb",
     "replaces every node: each new instance is created before its old one is deleted (twice the GPU quota and "
     "stock during the `up`), the nodes bootstrap again, /data and the containers are lost, the job is submitted "
     "again"),
    ("access.sshPublicKey (Alibaba)",
     "switching from ed25519 to an RSA or ECDSA key adds an ECS key pair to the running instances, which the provider "
     "applies in place by rebooting them; rotating a key changes no running node (user data is ignored on running "
     "instances): new nodes get the new key, running ones keep the old one"),
    ("nodes.placementGeneration (Alibaba: moving the cluster)",
     "replaces every node, in the newly placed zone and type (a new vSwitch beside the old one, a new NAS mount "
     "target); as above, /data and the containers are lost and the job is submitted again"),
)

REBOOT_EFFECTS: tuple[tuple[str, str], ...] = (
    ("a worker reboots",
     "Docker starts after the data disk and NAS mounts, restarts the container, and its main process rejoins Ray "
     "with the recorded settings; the job loses that node's tasks (whether it survives is the framework's call)"),
    ("the head reboots",
     "the head's Ray comes back by itself with the recorded settings and the workers rejoin it (their raylets exit "
     "once the old head's GCS is gone, and their main processes rejoin); the running job ends with the head (Ray "
     "keeps no job across a restart) and is not submitted again by itself: `jobStatus` then reports it LOST with "
     "the command that submits it again, the `jobResubmit` output (`pulumi up --replace <the training-job URN>`; "
     "ROLL/verl/OpenRLHF resume from their checkpoints on the NAS when configured to)"),
)
