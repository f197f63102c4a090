"""A changed image tag on a real node (issue 33): the second `pulumi up` with `container.image` naming a new tag pulls
it, and the node runs a new container of the new image; the old container is gone.

What is real: the program's own steps (prepare-host to the container) over SSH, the node's dockerd, the pull from the
tier's registry (the two tags of the test image: tag 2 is tag 1 and one small layer more, whose
/etc/e2e-image-version says 2), the container's creation and removal. What is modelled: the engine's decisions (which
resource is created, updated, replaced or deleted on the second `up`, and in which order: devtools/engine_model.py
through `cloud.ops`), and pulumi-docker's RemoteImage and Container, which the tier performs as the image check and
the `docker run` they amount to (program_commands.docker_run_command), and the Container's delete as the `docker rm
-f` it amounts to. No Ray here: the container is what changes.
"""

from __future__ import annotations

import pytest
from e2e_docker import CHANGED_IMAGE_TAG
from e2e_harness import CHANGED_TEST_IMAGE, TEST_IMAGE, TestHost, TestNetwork
from program_commands import HostsProgram, render_hosts_program
from test_program_on_own_hosts import install_standins, run_step

pytestmark = pytest.mark.e2e

CONTAINER = "rc-image-change"
# The node's steps up to its container (registration order is dependency order).
BOOTSTRAP = ("scripts", "prepare-host", "docker", "pull-image", "gpu-ready", "image", "container")


def program(network: TestNetwork, host: TestHost, image: str, prior: HostsProgram | None = None) -> HostsProgram:
    return render_hosts_program(
        "hosts", [host.ip], str(network.client_key), accelerators_per_node=2, container=CONTAINER,
        ports=(8700, 8701, 8702), entrypoint="true", working_dir="/tmp", image=image,
        prior=prior.cloud if prior is not None else None)


def container_state(network: TestNetwork, host: TestHost) -> tuple[str, str, str, str]:
    """(container id, its image's id, running, the image's /etc/e2e-image-version as the container reads it)."""
    inspect = network.run(host, f"docker inspect --format '{{{{.Id}}}} {{{{.Image}}}} {{{{.State.Running}}}}' "
                                f"{CONTAINER}", timeout=60).check()
    version = network.run(host, f"docker exec {CONTAINER} cat /etc/e2e-image-version", timeout=60).check()
    container_id, image_id, running = inspect.stdout.split()
    return container_id, image_id, running, version.stdout.strip()


def image_id(network: TestNetwork, host: TestHost, image: str) -> str:
    inspect = network.run(host, f"docker image inspect --format '{{{{.Id}}}}' -- {image}", timeout=60).check()
    return inspect.stdout.strip()


def test_a_changed_image_tag_leaves_a_new_container_of_the_new_image(network: TestNetwork) -> None:
    host = network.hosts[2]
    install_standins(network, host, "nvidia")
    by_node = {"node-0": host}
    first = program(network, host, TEST_IMAGE)
    try:
        for step in [s for s in first.steps if s.key.split("/")[1] in BOOTSTRAP]:
            result = run_step(network, by_node, step)
            assert result.returncode == 0, f"step {step.key} failed:\n{result.output}"
        old_id, old_image, running, version = container_state(network, host)
        assert (old_image, running, version) == (image_id(network, host, TEST_IMAGE), "true", "1")

        second = program(network, host, CHANGED_TEST_IMAGE, prior=first)
        assert second.cloud is not None
        changes = second.cloud.changes
        assert changes["node-0-image"] == "replace" and changes["node-0-container"] == "replace", changes
        ops = second.cloud.ops
        # pulumi-docker's Container is replaced delete-first (its provider's DeleteBeforeReplace).
        assert ops.index(("delete", "node-0-container")) < ops.index(("replace", "node-0-container")), ops
        by_resource = {s.resource: s for s in second.steps if s.key.split("/")[1] in BOOTSTRAP}
        ran = []
        for verb, name in ops:
            if verb == "delete" and name == "node-0-container":
                result = network.run(host, f"docker rm -f -- {CONTAINER}", timeout=120)
            elif verb in ("create", "update", "replace") and name in by_resource:
                result = run_step(network, by_node, by_resource[name])
            else:
                continue
            assert result.returncode == 0, f"{verb} {name} failed:\n{result.output}"
            ran.append((verb, name))
        assert ("replace", "node-0-image") in ran and ("replace", "node-0-container") in ran, ran

        new_id, new_image, running, version = container_state(network, host)
        assert new_id != old_id
        assert (new_image, running, version) == (image_id(network, host, CHANGED_TEST_IMAGE), "true", "2")
        assert new_image != old_image
        names = network.run(host, "docker ps -a --no-trunc --format '{{.ID}} {{.Names}}'", timeout=60).check()
        assert old_id not in names.stdout and names.stdout.count(f" {CONTAINER}\n") == 1, names.stdout
        # The new tag came from the registry, to this node: its manifest asked for by tag, then its layers fetched.
        asked = [r for r in network.registry.requests() if r.client == host.ip and r.status == 200]
        assert any(r.path.endswith(f"/manifests/{CHANGED_IMAGE_TAG}") for r in asked), asked
        assert any(r.method == "GET" and "/blobs/" in r.path for r in asked), asked
    finally:
        network.run(host, f"docker rm -f -- {CONTAINER}", timeout=120)
