"""The time model's figures: every constant with its source or labelled ASSUMPTION, the steps measured by the
benchmarks, and the nominal minutes of a step on a new or a baked node (devtools/schedule.py uses them; the plan
prints them with their sources)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from infra.image_path import VPC_PULL_MBPS


@dataclass(frozen=True)
class Constant:
    value: float
    unit: str
    source: str  # "[n] ..." (docs/performance-sources.md), "measured: ...", or "ASSUMPTION: ..."


CONSTANTS: Mapping[str, Constant] = {
    "preamble": Constant(1.0, "min", "ASSUMPTION: preview, data-source look-ups, VPC -> vSwitch -> SG before the "
                         "first instance; estimate 0.5-1.5 (reference A6)"),
    "boot": Constant(2.0, "min", "ASSUMPTION: RunInstances to sshd; GPU nodes 80-120 s [3], 1m15s-2m20s with "
                     "custom images [5]"),
    "driver": Constant(15.0, "min", "[9] Alibaba's auto-installer 'may take 10 to 20 minutes' (reboot after)"),
    "pulumi-slots-per-cpu": Constant(4.0, "slots", "[35][35b] default --parallel = 4 x NumCPU; `pulumi up "
                                     "--parallel N` or PULUMI_PARALLEL changes it"),
    "vpc-pull": Constant(VPC_PULL_MBPS / 8.0, "MB/s", "[3][20][22][37] stock `docker pull` of 10-20 GB ML "
                         "images: 17-40 MB/s observed (not on Alibaba: UNCONFIRMED there)"),
    "tuned-pull": Constant(50.0, "MB/s", "[20][21] (option, not built) the best sourced tuned pull: 10 GB in 3 min "
                           "18 s (~50 MB/s) with pigz and core pinning (Dstack-TEE/meta-dstack PR #13); layers are "
                           "extracted one after another (moby #37957), so more concurrent downloads add little"),
    "pull-io-factor": Constant(4.0, "x", "ASSUMPTION (estimate, reference 2.3): a pull writes the compressed "
                               "layers, reads them back and writes them extracted: ~4x the compressed size in disk "
                               "I/O, so a node pulls at most at the disk's throughput / 4"),
    "essd-base": Constant(120.0, "MB/s", "[28] ESSD throughput min{120 + 0.5 x GiB, level's max} MB/s: the constant "
                          "term (AutoPL's baseline; that PL0, PL2 and PL3 follow it is an inference, UNCONFIRMED)"),
    "essd-per-gib": Constant(0.5, "MB/s per GiB", "[28] the same formula's term per GiB of the disk"),
    "essd-pl1-max": Constant(350.0, "MB/s", "[28] PL1 and AutoPL baseline at most 350 MB/s per disk"),
    "essd-pl0-max": Constant(180.0, "MB/s", "ASSUMPTION: PL0 at most 180 MB/s (Alibaba's ESSD page; not found in "
                             "the reference, UNCONFIRMED)"),
    "essd-pl2-max": Constant(750.0, "MB/s", "ASSUMPTION: PL2 at most 750 MB/s (Alibaba's ESSD page; not found in "
                             "the reference, UNCONFIRMED)"),
    "essd-pl3-max": Constant(4000.0, "MB/s", "ASSUMPTION: PL3 at most 4,000 MB/s (Alibaba's ESSD page; not found in "
                             "the reference, UNCONFIRMED)"),
    "autopl-burst": Constant(4000.0, "MB/s", "[28] ESSD AutoPL with performance burst: up to 4 GB/s per disk"),
    # The region's registry is backed by OSS; its per-account bandwidth cap is the shared backend every pulling node
    # draws on. (The 10 Gbit/s of ACR's P2P page [16] is its 1,000-node test's network, not a cap.)
    "registry-backend": Constant(10.0, "Gbit/s", "[26] OSS per-account bandwidth cap in mainland regions other than "
                                 "the three below (cn-hangzhou 10 Gbit/s); raisable by ticket; whether ACR's "
                                 "traffic counts against the user's cap: UNCONFIRMED"),
    "registry-backend-large": Constant(100.0, "Gbit/s", "[26] OSS's download cap in cn-beijing, cn-shanghai and "
                                       "cn-shenzhen (same UNCONFIRMED as registry-backend)"),
    "registry-backend-abroad": Constant(5.0, "Gbit/s", "[26] OSS's cap outside the mainland (cn-hongkong included; "
                                        "same UNCONFIRMED as registry-backend)"),
    # The pull cache the program builds (infra/pull_cache.py, container.pullCache): the head's cache fills from the
    # registry once, fan-out caches (one per 16 nodes) fill from the head's, and every node pulls through its cache.
    "cache-nic": Constant(5.0, "Gbit/s", "[27] estimate: a cache node's VPC bandwidth; gn6v gets 2.5 / 10 / 20 "
                          "Gbit/s with 1 / 4 / 8 V100, so a 2-V100 gn6v-c8g1.4xlarge (multi) about 5 (UNCONFIRMED for "
                          "that type; larger types get more, so this is a floor for the V100 stacks)"),
    "cache-fill-fetches": Constant(1.0, "x", "program: infra/scripts/pull_cache_fill.py copies each blob with one "
                                   "GET from the upstream into the cache's plain registry; measured by "
                                   "tests/e2e/test_pull_cache.py on the real-host tier (each blob fetched once in "
                                   "the whole test, none by the nodes' pulls; see verified-facts#pull-cache-fill)"),
    "cache-serves-from-memory": Constant(1.0, "yes", "ASSUMPTION: a cache serves the image from its page cache (the "
                                         "25 GB image fits in a GPU node's memory), so its disk does not bound "
                                         "serving; its NIC does (cache-nic)"),
    "public-source": Constant(10.0, "Gbit/s", "ASSUMPTION: the public registry owner's cap is unknown (reference "
                              "section 3 table)"),
    "p2p-above": Constant(16.0, "nodes", "[16][16d][24] P2P (ACR EE, Kraken, Dragonfly) pays off above ~16 nodes "
                          "(reference technique 9)"),
    "p2p-seed-copies": Constant(2.0, "copies", "ASSUMPTION: with P2P the backend serves about 2 copies whatever N "
                                "(ACR: -95% at 1,000 nodes [16]; Kraken 2,600 hosts p50 10 s [24])"),
    "model-size": Constant(15.0, "GB", "ASSUMPTION: a 7B model in bf16 (reference 2.4); the plan cannot read the "
                           "model's size"),
    "modelscope-intra-cloud": Constant(50.0, "MB/s", "[30][31] ModelScope over OSS's internal endpoint in its "
                                       "regions; 50-100 MB/s from one anecdote (UNCONFIRMED)"),
    "dataset-verl": Constant(0.01, "GB", "ASSUMPTION: verl's default data preparation (examples/data_preprocess/"
                             "gsm8k.py) downloads GSM8K, 7,473 + 1,319 problems, a few MB of parquet, on the head "
                             "before the job, skipped when train.parquet is there (reference frameworks-at-runtime "
                             "F10); ROLL reads data/*.jsonl from its own repository, cloned by the code step"),
    "model-check": Constant(0.1, "min", "ASSUMPTION: the model step finding the model in the cache: the hub "
                            "client lists the repository's files (one API call) and compares them with the cache"),
    "hub-public": Constant(12.5, "MB/s", "[29] at most the node's public IP (100 Mbit/s); hf-mirror observed "
                           "~1 MB/s [31] (UNCONFIRMED), so this is a best case"),
    "nas-read": Constant(10000.0, "MB/s", "[32] a general-purpose NAS's read cap, 10 GB/s, is published only for "
                         "Hong Kong and regions outside the mainland; its throughput grows linearly with the data "
                         "stored [32b] and the program's NAS (Capacity, pay by use) holds little: the figure for a "
                         "small NAS in a mainland region is UNCONFIRMED, so this is a best case"),
    "client-read": Constant(300.0, "MB/s", "ASSUMPTION: one NFS client's read rate, under the node's VPC "
                            "bandwidth (2.5-100 Gbit/s [27])"),
    "local-disk": Constant(220.0, "MB/s", "[28] ESSD baseline max{min{120 + 0.5 x GiB, 350}, 125} MB/s at 200 GiB"),
    "page-cache-read": Constant(0.25, "min", "ASSUMPTION: the framework's reads of weights a node's prefetch left "
                                "in its page cache, beyond vLLM's (inside framework-start): in the colocated layouts "
                                "each of 8 ranks reads the 7B weights for Megatron and for the reference model, ~240 "
                                "GB of page-cache copies per node at ~15 GB/s; one read alone is 2 s (vLLM, 7B, from "
                                "RAM: vllm-startup-profiler)"),
    "prefetch-empty": Constant(0.02, "min", "ASSUMPTION: the prefetch step finding no model in the shared cache: "
                               "one SSH session (0.57 s measured, MEASURED_SECONDS) and a directory look-up"),
    "framework-start": Constant(3.0, "min", "ASSUMPTION (central value of a build-up, range 2-4): ROLL creates and "
                                "initialises its clusters one after another (docs/performance.md, 'The framework's "
                                "start-up'); verl with Qwen2-7B takes 3.7 min to start (verl #384); one vLLM engine "
                                "for 7B 25-46 s (vllm-startup-profiler); Megatron's 7B load 25-109 s (verl PR #1030); "
                                "[37] about 2-4 min from start to the first step (3B, 2xL20)"),
    "framework-start-growth": Constant(0.5, "min per doubling", "ASSUMPTION (UNCONFIRMED): the start-up's build-up "
                                       "(framework-start) is for 2 nodes (16 ranks); each doubling of the ranks "
                                       "beyond adds this much (Ray actors created one cluster after another, NCCL "
                                       "communicators over more ranks); no source measures it at 512-2,048 ranks"),
    "ecs-api-per-minute": Constant(60.0, "calls", "ASSUMPTION (UNCONFIRMED): RunInstances calls per minute before "
                                   "ECS throttles the account in the region; a throttled call waits for the next "
                                   "minute (alibabacloud.com/help/doc-detail/437902.htm); one call per instance "
                                   "(the provider creates each instance with its own RunInstances)"),
    "state-writes-per-step": Constant(2.0, "writes", "[pulumi pkg/backend/snapshot.go] doCreate, doUpdate: one save "
                                      "when the step begins, one when it ends; mutations are served one at a time, "
                                      "defaultServiceLoop, and each step waits for its save"),
    "state-write-rate": Constant(20.0, "MB/s", "ASSUMPTION (UNCONFIRMED): a self-managed backend's save of the whole "
                                 "checkpoint (pulumi pkg/backend/diy/state.go saveCheckpoint: marshal, back up the "
                                 "old file, write the new one); pulumi/pulumi #10960 reports 1-3 s per save, #14967 "
                                 "a 16 MB state's refresh at ~30 min against 29 s with PULUMI_SKIP_CHECKPOINTS. "
                                 "Pulumi Cloud journals each step instead (httpstate, journaling): about 0"),
    "resume-preamble": Constant(0.5, "min", "ASSUMPTION (option): a `pulumi up` that only restarts stopped "
                                "instances: refresh and one update per instance, no new network"),
    "resume-boot": Constant(1.0, "min", "ASSUMPTION (option): restart of an economical-mode stopped instance "
                            "[36b]; 17 s to Running on a CPU type [2] (GPU: UNCONFIRMED)"),
    # A disk made from a snapshot (the baked image's data disk) loads its data from OSS on first read [7].
    "snapshot-first-read": Constant(100.0, "MB/s", "ASSUMPTION, UNCONFIRMED: the first read of a disk made from a "
                                    "snapshot, before its data is loaded from OSS [7]; no Alibaba figure found. "
                                    "Analogue only (AWS): EBS's provisioned volume-initialization rate is 100-300 "
                                    "MiB/s and its default rate 'fluctuates' (AWS EBS guide, 'Initialize Amazon EBS "
                                    "volumes'); with snapshot prefetch there is no penalty [7]"),
    "image-extracted-ratio": Constant(2.0, "x", "ASSUMPTION: extracted size / compressed size of the training "
                                      "image (25 GB compressed, ~50 GB extracted: reference section 4, UNCONFIRMED)"),
    "start-read-fraction": Constant(0.064, "of image", "[3] containers read 6.4% of their image's data at start "
                                    "(Slacker, via Tensorfuse): the part of the extracted image the container start "
                                    "and the framework's imports read"),
    "checkpoint-weights": Constant(14.0, "GB", "ASSUMPTION: the 7B actor's bf16 weights in its checkpoint, "
                                   "7e9 x 2 bytes; every node loads at least one data-parallel replica's copy"),
    "checkpoint-optimizer": Constant(84.0, "GB", "ASSUMPTION: the 7B actor's optimizer states, 7e9 x 12 bytes (fp32 "
                                     "master weights, Adam's two moments), sharded over the nodes (distributed "
                                     "optimizer): each node reads its share"),
    "ray-supervise-interval": Constant(10.0, "s", "program: infra/scripts/container_main.sh looks for its raylet "
                                       "at its start and then every RAY_SUPERVISE_INTERVAL_S (default 10), and "
                                       "starts Ray from its record (a worker once the head answers)"),
    "resume-code": Constant(0.05, "min", "ASSUMPTION: the code step on a restarted container (same container id): "
                            "fetch_code.sh compares its marker and the checkout and skips pip; a few docker exec "
                            "calls over one SSH session (the measured node steps take 0.6-1.3 s)"),
}


def constant(key: str) -> float:
    return CONSTANTS[key].value


# Measured by bench/steps_bench.py on the 2-core development machine while other work ran on it (seconds, median
# of 3 runs, 2026-11-23). Node steps: the real scripts on a node where the driver, Docker, the toolkit and the
# image are present (the baked path), with stand-ins only for what cannot run here (package manager, systemd,
# dockerd, GPU), plus one SSH session (0.57 s, measured on the real-host tier) each. Ray and job: the project's
# steps over SSH on the real-host tier (3 network-namespace hosts, real sshd, Ray 2.48.0); the job step includes
# its 10 s watch for an immediate failure, which runs beside the job's start, so the first step waits only for the
# submission (JOB_WATCH_SECONDS less).
MEASURED_SECONDS: Mapping[str, float] = {
    "prepare-host": 0.13 + 0.57,
    "docker": 0.68 + 0.57,
    "pull-image": 0.06 + 0.57,
    "gpu-ready": 0.12 + 0.57,
    "ray-head": 33.8,
    "ray-worker": 11.0,
    "ray-ready": 6.4,
    "job": 24.5,
    # The head's and the workers' steps again while Ray runs with the settings they ask for (what they do on a
    # resumed cluster: find it and leave it). Measured 2026-11-25 in a run where ray-head took 20.05 s, on a
    # quieter machine than the figures above (UNCONFIRMED how they scale with the load).
    "ray-head-found": 1.14,
    "ray-worker-found": 0.81,
}
JOB_WATCH_SECONDS = 10.0

# What Pulumi stores for the stack: every resource's inputs and outputs as JSON, measured under the offline cloud on
# `multi` (python3 dev.py bench, 'state'; bench/program_bench.py measure_state). The mocks' outputs repeat the
# inputs as a provider's do, without the commands' stdout and stderr (a real state holds those too, so this is a
# floor). tests/offline/test_fast_nodes.py checks the figures against the program as it is.
MEASURED_STATE: Mapping[str, float] = {
    "resources-fixed": 29,  # provider, network, security group, storage, autostop's RAM role, the job's local steps
    "resources-per-node": 18,  # the instance, its script library, login key, steps, the image and the container
    "kb-fixed": 105.0,
    "kb-per-node": 78.0,  # the scripts travel once per node as a library (an archive's path and hash in the state)
}

# Minutes on a new node (nominal). "pull-image" comes from the image path instead; the Ray and job steps from
# MEASURED_SECONDS on every path (they do the same work wherever the node came from).
NEW_NODE_MINUTES: Mapping[str, float] = {
    "prepare-host": 1.0,  # cloud-init, mkfs of the data disk, the NFS client
    "docker": 2.0,  # Docker CE and the NVIDIA toolkit from Alibaba's mirrors
    "gpu-ready": 2.0,  # after both the pull and the driver: the reboot and nvidia-smi
    "image": 0.1,
    "container": 0.5,
    "code": 5.0,  # clone the framework, pip install its requirements into the container
    "reward-server": 3.0,
    "bake-prep": 5.0,  # the requirements installed in a throw-away container and committed (nodes.bake)
    "bake-image": 10.0,  # CreateImage: a snapshot of every disk; no documented figure (UNCONFIRMED)
}

# Minutes on a node booted from a baked image where not measured: the container start (no dockerd here) and the
# code step, which finds the checkout and the committed requirements and only lets pip confirm them (UNCONFIRMED).
BAKED_NODE_MINUTES: Mapping[str, float] = {
    "image": 0.1,
    "container": 0.5,
    "code": 0.5,
}
# The steps that find their work done on a node booted from an image with the driver, Docker and the toolkit
# (a maintained base image, OPTIONS' "driver in the image"): measured like the baked path's.
BASE_IMAGE_STEPS = ("docker", "gpu-ready")
