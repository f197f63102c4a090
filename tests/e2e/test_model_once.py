"""The model downloaded once, read by every node (issue 21): the program's own steps on three test hosts with shared
storage, a verl job naming a model by hub id, and a stand-in hub (model_server.py) that counts the downloads.

The program runs in `hosts` mode (program_commands.render_hosts_program) with `storage.sharedHostPath: /mnt/shared`
(one directory of the test machine, mounted at /mnt/shared on every host, as an NFS mount would be) and
`training.modelSource: hf-mirror` pointing `hfEndpoint` at the stand-in hub on the bridge. Every node's bootstrap
steps run as pulumi-command would run them (prepare-host to the container, whose environment carries the caches), then
the head's `model` step. Then every node, head and workers, reads the model the way the frameworks do: huggingface_hub
in the container, with the container's environment and the job's HF_ENDPOINT. The hub must have sent each file
exactly once, to the head, and every node must hold the model's bytes. A second run of the step downloads nothing.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
from collections.abc import Iterator

import pytest
from e2e_harness import BRIDGE_IP, STATE_ROOT, TestHost, TestNetwork
from model_server import ModelHub
from program_commands import HostsProgram, render_hosts_program
from test_program_on_own_hosts import PER_NODE, install_standins, run_step

pytestmark = pytest.mark.e2e

CONTAINER = "rc-model"
REPO = "e2e-org/tiny-model"
HUB_PORT = 8599
SHARED = STATE_ROOT / "model-shared"  # the stand-in shared file system: /mnt/shared on every host
FILES = {
    "config.json": b'{"model_type": "e2e-tiny"}\n',
    "tokenizer.json": b'{"version": "1.0"}\n',
    "model.safetensors": os.urandom(3 * 1024 * 1024),
}
BOOTSTRAP = ("scripts", "prepare-host", "docker", "pull-image", "gpu-ready", "image", "container")
# What the frameworks do with a model id (ROLL's download_model with HUGGINGFACE_HUB, vLLM's weight download): the
# hub client's snapshot_download into the cache the container's environment names; then the files' digests.
READER = """
import hashlib, os, sys
from huggingface_hub import snapshot_download
path = snapshot_download(sys.argv[1])
print("cache", os.environ["HF_HUB_CACHE"], path)
for name in sorted(os.listdir(path)):
    with open(os.path.join(path, name), "rb") as f:
        print("file", name, hashlib.sha256(f.read()).hexdigest())
"""


@pytest.fixture(scope="module")
def cluster(network: TestNetwork) -> Iterator[tuple[list[TestHost], HostsProgram, ModelHub]]:
    hosts = network.hosts[:3]
    shutil.rmtree(SHARED, ignore_errors=True)  # a clean shared cache: nothing fetched before
    SHARED.mkdir(parents=True)
    with ModelHub(BRIDGE_IP, HUB_PORT, REPO, FILES) as hub:
        program = render_hosts_program(
            "hosts", [h.ip for h in hosts], str(network.client_key), accelerators_per_node=PER_NODE,
            container=CONTAINER, ports=(8500, 8501, 8502), entrypoint="", working_dir="/tmp",
            shared_host_path="/mnt/shared",
            training={
                "framework": "verl", "modelSource": "hf-mirror", "hfEndpoint": hub.endpoint,
                "verl": {"dataDir": "/mnt/shared/data/gsm8k"},
                "overrides": {"actor_rollout_ref.model.path": REPO, "algorithm.adv_estimator": "grpo",
                              "data.train_batch_size": 60, "actor_rollout_ref.rollout.n": 2,
                              "actor_rollout_ref.actor.ppo_mini_batch_size": 12},
            },
        )
        for host in hosts:
            install_standins(network, host, "nvidia")
            # The shared file system at /mnt/shared (a tmpfs over /mnt first, in the host's own mount namespace),
            # before the container, whose mount namespace is a copy taken when it starts.
            network.run(host, f"mountpoint -q /mnt/shared || {{ mount -t tmpfs e2e-mnt /mnt && mkdir -p /mnt/shared "
                              f"&& mount --bind {SHARED} /mnt/shared; }}", timeout=30).check()
        yield hosts, program, hub
        for host in hosts:
            network.run(host, f"docker rm -f {CONTAINER}; umount /mnt/shared; umount /mnt", timeout=60)


def read_model_everywhere(network: TestNetwork, hosts: list[TestHost], endpoint: str) -> list[str]:
    """Every node at once, as the job's workers start together."""
    command = (f"docker exec -e HF_ENDPOINT={shlex.quote(endpoint)} {CONTAINER} python3 -c {shlex.quote(READER)} "
               f"{REPO}")
    return [result.check().stdout for result in network.run_parallel([(host, command) for host in hosts],
                                                                     timeout=120)]


def test_the_head_downloads_the_model_once_and_every_node_reads_it(network, cluster) -> None:
    hosts, program, hub = cluster
    by_node = {f"node-{rank}": host for rank, host in enumerate(hosts)}
    steps = {s.key: s for s in program.steps}
    assert [k for k in steps if k.endswith("/model")] == ["node-0/model"]  # the head's step only
    done: list[str] = []
    for step in [s for s in program.steps if s.key.split("/")[1] in BOOTSTRAP]:  # registration order = dependencies
        assert all(d in done for d in step.depends_on), (step.key, step.depends_on)
        result = run_step(network, by_node, step)
        assert result.returncode == 0, f"step {step.key} failed:\n{result.output}"
        done.append(step.key)
    model = steps["node-0/model"]
    assert set(model.depends_on) <= set(done)
    fetched = run_step(network, by_node, model)
    assert fetched.returncode == 0, fetched.output
    assert f"{REPO} from huggingface ({hub.endpoint}) is in the cache" in fetched.output
    assert hub.downloads_by_file() == dict.fromkeys(FILES, 1)
    assert hub.clients_of(hub.downloads) == {hosts[0].ip}  # the head fetched it

    digests = {name: hashlib.sha256(content).hexdigest() for name, content in FILES.items()}
    before = dict(hub.downloads)
    for output in read_model_everywhere(network, hosts, hub.endpoint):
        assert "cache /mnt/shared/cache/huggingface/hub /mnt/shared/cache/huggingface/hub/models--e2e-org--tiny-model" \
            in output, output
        for name, digest in digests.items():
            assert f"file {name} {digest}" in output, output
    # Every node asked the hub for the repository (it read through the hub client, online), and none downloaded
    # anything at start-up: on a real NAS (NFSv3 nolock, whose locks do not reach across nodes) concurrent first
    # downloads would write the same files at once; here the hosts share one kernel, whose locks would hide that.
    assert hub.clients_of(hub.listings) == {h.ip for h in hosts}
    assert dict(hub.downloads) == before, hub.downloads
    assert not hub.unknown, hub.unknown

    again = run_step(network, by_node, model)  # a second `up` (or a second job): the files are found
    assert again.returncode == 0, again.output
    assert hub.downloads_by_file() == dict.fromkeys(FILES, 1)
