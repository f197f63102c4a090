"""The stack configuration as a user meets it: every rule of infra/config/ with a bad value, the key path and the
words of the message they read, the defaults of the contract (verified-facts#test-config-stack-config), and the stack
files that ship with the project.

Values go through parse_cluster_config exactly as Pulumi hands them over: each `roll-cluster:<section>` as a JSON
string, `alicloud:region` as plain text.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from infra.config import (
    DEFAULT_ROLL_IMAGE,
    DEFAULT_ROLL_REF,
    PROJECT,
    SECRETS,
    SECTIONS,
    ClusterConfig,
    ConfigError,
    parse_cluster_config,
)
from infra.sources.alibaba import catalog

REPO = Path(__file__).resolve().parents[3]

# Real public keys made with `ssh-keygen -t <type> -C alice@laptop` (their private halves were thrown away).
ED25519_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMR+SbE52JYp8zoMUnNK2iR+m4SPaijZ3p3gcG/0NCwD alice@laptop"
RSA_KEY = (
    "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC6XqMvxhvgYzy1nyr0CA9RelAsAFuwE5kGnHAJFXpqU4h6xLVT7wJnDB9kZKdZsBkeIOnH"
    "me8SXcwyFEpkSwKL1uKFIxaxQmFqsV1NHCG4Jie0RkFJfsTd7ZP1Ub2eXE7WLGsFO8ks0/nFIZEJS48y5+cEy2X+AlD9if21lGzInJNPm+kV"
    "ipkUtBVSTrT0NRAA7mEOhtw47rKvrhORMWAs3me7siC/+PwqiBM2PC4x3MAlzJBpdxgmiQo6hT9cfEJArzrt92Itv5mKSMSKKaC5OORXuvuI"
    "sxnT4mZ0Ciix8XtoJXLr0GYSdT8pLzh2YBF87okg3F/3eDspe+xvv4jt alice@laptop"
)
ECDSA_KEY = (
    "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBEAGQKD9/Rnz2FBOtdYBUXki6XYFBOu/cyWdC8"
    "uaMcUTtlvPhgxtTCsG3SZ2EWTPIpxml7r23zjBSip1rjgLT4E= alice@laptop"
)
# The body is made up: the header is what a user pastes by mistake, and the body must never be echoed back.
PRIVATE_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwSECRETBODY\n"
    "-----END OPENSSH PRIVATE KEY-----\n"
)

ONE_V100 = "ecs.gn6v-c8g1.2xlarge"  # 1 GPU
TWO_V100 = "ecs.gn6v-c8g1.4xlarge"  # 2 GPUs
EIGHT_H20 = "ecs.gn8v-8x.48xlarge"  # 8 GPUs
EIGHT_A100 = "ecs.gn7e-c16g1.32xlarge"  # 8 GPUs


# ------------------------------------------------------------------------------------------------ helpers
def stack(**sections: Any) -> dict[str, Any]:
    """A valid one-node stack; each keyword is merged (shallowly) into that section, None removes it."""
    result: dict[str, Any] = {
        "nodes": {"instanceTypes": [ONE_V100]},
        "access": {"adminCidrs": ["203.0.113.0/24"], "sshPublicKey": ED25519_KEY},
    }
    for name, fields in sections.items():
        if fields is None:
            result.pop(name, None)
        elif isinstance(fields, dict):
            result[name] = {**result.get(name, {}), **fields}
        else:
            result[name] = fields
    return result


def hosts_stack(**nodes: Any) -> dict[str, Any]:
    """A valid two-host stack (nodes.source hosts); keywords are merged into `nodes`."""
    return {
        "nodes": {
            "source": "hosts",
            "acceleratorsPerNode": 8,
            "hosts": [{"address": "192.0.2.11", "privateAddress": "10.0.0.11"},
                      {"address": "192.0.2.12", "privateAddress": "10.0.0.12"}],
            **nodes,
        },
        "access": {"sshPrivateKeyPath": "~/.ssh/id_ed25519"},
    }


def as_pulumi(sections: dict[str, Any]) -> dict[str, str | None]:
    """Structured values as the JSON text Pulumi hands over; strings (already text) and None are passed as is."""
    return {k: v if isinstance(v, str) or v is None else json.dumps(v) for k, v in sections.items()}


def parse(sections: dict[str, Any], region: str | None = "cn-hangzhou") -> ClusterConfig:
    return parse_cluster_config(as_pulumi(sections), region)


def problems(sections: dict[str, Any], region: str | None = "cn-hangzhou") -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(sections, region)
    # The text the user sees lists every problem.
    for problem in caught.value.problems:
        assert problem in str(caught.value)
    return caught.value.problems


def only_problem(sections: dict[str, Any], region: str | None = "cn-hangzhou") -> tuple[str, str]:
    """(key path, message) of the single problem the configuration has."""
    found = problems(sections, region)
    assert len(found) == 1, found
    path, _, message = found[0].partition(": ")
    return path, message


def assert_words(message: str, *words: str) -> None:
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"


# ------------------------------------------------------------------------------------- a valid configuration
def test_minimal_stack_is_valid_and_has_the_contract_defaults() -> None:
    config = parse(stack())
    assert config.region == "cn-hangzhou"
    nodes = config.nodes
    assert (nodes.count, nodes.zone, nodes.system_disk_gb, nodes.data_disk_gb) == (1, "auto", 200, 0)
    assert nodes.gpu_driver == "auto-install"
    assert (nodes.spot, nodes.spot_price_limit, nodes.spot_strategy) == (False, None, "NoSpot")
    assert nodes.os_image.startswith("^aliyun_3_x64_")
    access = config.access
    assert (access.allow_world, access.dashboard, access.ssh_private_key_path) == (
        False, "tunnel", "~/.ssh/id_ed25519"
    )
    assert config.container.image == DEFAULT_ROLL_IMAGE
    assert "nvcr-24.05-py3-torch260-vllm084" in config.container.image
    assert (config.container.shm_size, config.container.shm_size_mb) == ("16g", 16 * 1024)
    assert config.container.registry_username is None
    assert (config.ray.gcs_port, config.ray.dashboard_port, config.ray.client_port) == (6379, 8265, 10001)
    training = config.training
    assert (training.framework, training.auto_start, training.overrides) == ("roll", True, {})
    assert training.roll.repo == "https://github.com/alibaba/ROLL.git"
    assert training.roll.pipeline == "agentic"
    assert training.roll.base_config == "agentic_demo/agent_val_frozen_lake_single_node_demo.yaml"
    assert training.custom is None
    # On alibaba an unset nas follows retainOnDestroy: checkpoints survive pulumi destroy by default (issue 27).
    assert (config.storage.nas, config.storage.retain_on_destroy) == (True, True)
    assert config.gpus_per_node == 1


def test_default_roll_ref_is_a_pinned_commit_not_a_branch() -> None:
    # A moving branch would change the training code under a running stack; a full commit hash cannot move.
    assert len(DEFAULT_ROLL_REF) == 40
    assert all(c in "0123456789abcdef" for c in DEFAULT_ROLL_REF)
    assert parse(stack()).training.roll.ref == DEFAULT_ROLL_REF


def test_every_section_and_field_can_be_set_with_its_contract_name() -> None:
    config = parse(stack(
        nodes={
            "count": 2, "instanceTypes": [EIGHT_H20, EIGHT_A100], "zone": "cn-wulanchabu-c", "spot": True,
            "spotPriceLimit": 80.5, "systemDiskGb": 500, "dataDiskGb": 2000, "gpuDriver": "preinstalled",
            "image": "m-bp1g7004ksh0oeuc6v1h",
            "osImage": "^ubuntu_22_04_x64_20G_alibase_.*", "driverVersion": "550.127.08", "cudaVersion": "12.4.1",
            "cudnnVersion": "9.2.0.82", "internetBandwidthMbps": 50,
        },
        access={
            "adminCidrs": ["203.0.113.0/24", "198.51.100.0/24"], "allowWorld": False, "dashboard": "admin-cidrs",
            "sshPrivateKeyPath": "~/.ssh/roll", "sshPublicKey": RSA_KEY,
        },
        container={"image": "registry.cn-wulanchabu.aliyuncs.com/me/roll:v1", "shmSize": "64g",
                   "registryUsername": "me@example.com", "name": "trainer"},
        ray={"gcsPort": 6380, "dashboardPort": 8266, "clientPort": 10002, "readyTimeoutSeconds": 1800},
        training={"framework": "roll", "autoStart": False, "overrides": {"max_steps": 10},
                  "roll": {"pipeline": "rlvr", "baseConfig": "qwen2.5-7B-rlvr_megatron/rlvr_config.yaml"}},
        storage={"nas": True, "retainOnDestroy": False, "nasStorageType": "Performance"},
    ), region="cn-wulanchabu")
    assert config.nodes.spot_strategy == "SpotWithPriceLimit"
    assert config.gpus_per_node == 8
    assert config.access.ssh_public_key == RSA_KEY
    assert config.container.registry_host == "registry.cn-wulanchabu.aliyuncs.com"
    assert config.training.roll.pipeline == "rlvr"
    assert config.storage.nas_storage_type == "Performance"


def test_scalars_set_as_text_with_pulumi_config_set_path_are_read_as_their_type() -> None:
    # `pulumi config set --path 'roll-cluster:nodes.count' 2` may store the value as the string "2".
    config = parse(stack(nodes={"count": "2", "spot": "true", "spotPriceLimit": "4.5"}, storage={"nas": "false"}))
    assert (config.nodes.count, config.nodes.spot, config.nodes.spot_price_limit) == (2, True, 4.5)
    assert config.storage.nas is False


def test_snake_case_field_names_are_unknown_fields() -> None:
    # The contract's names are camelCase; the Python names must not leak into the stack file.
    path, message = only_problem(stack(nodes={"instanceTypes": [ONE_V100], "system_disk_gb": 300}))
    assert path == "roll-cluster:nodes.system_disk_gb"
    assert_words(message, "unknown field", "did you mean 'systemDiskGb'?")


# ------------------------------------------------------------------------- bounds, patterns and literals
# (sections, key path, words the message must contain: what is allowed, and what was given)
BAD_VALUES: list[tuple[dict[str, Any], str, tuple[str, ...]]] = [
    # nodes
    (stack(nodes={"count": 0}), "nodes.count", ("between 1 and 256", "got 0")),
    (stack(nodes={"count": 257}), "nodes.count", ("between 1 and 256", "got 257")),
    (stack(nodes={"count": "two"}), "nodes.count", ("whole number", 'got "two"')),
    (stack(nodes={"count": 1.5}), "nodes.count", ("whole number", "got 1.5")),
    (stack(nodes={"instanceTypes": []}), "nodes.instanceTypes", ("at least 1 item", "got []")),
    (stack(nodes={"instanceTypes": ONE_V100}), "nodes.instanceTypes", ("must be a list", f'got "{ONE_V100}"')),
    (stack(nodes={"zone": "Hangzhou K"}), "nodes.zone", ("`auto` or a zone id", 'got "Hangzhou K"')),
    (stack(nodes={"spot": "maybe"}), "nodes.spot", ("true or false", 'got "maybe"')),
    (stack(nodes={"spotPriceLimit": 0}), "nodes.spotPriceLimit", ("greater than 0", "got 0")),
    (stack(nodes={"spotPriceLimit": -2.5}), "nodes.spotPriceLimit", ("greater than 0", "got -2.5")),
    (stack(nodes={"spotPriceLimit": "cheap"}), "nodes.spotPriceLimit", ("must be a number", 'got "cheap"')),
    (stack(nodes={"spotPriceLimit": 4.1234}), "nodes.spotPriceLimit", ("at most three decimal places", "got 4.1234")),
    (stack(nodes={"systemDiskGb": 99}), "nodes.systemDiskGb", ("between 100 and 2048", "got 99")),
    (stack(nodes={"systemDiskGb": 2049}), "nodes.systemDiskGb", ("between 100 and 2048", "got 2049")),
    (stack(nodes={"dataDiskGb": 50}), "nodes.dataDiskGb", ("0 (no data disk) or between 100 and 32768", "got 50")),
    (stack(nodes={"dataDiskGb": 32769}), "nodes.dataDiskGb", ("between 100 and 32768", "got 32769")),
    (stack(nodes={"osImage": "^aliyun_3_(["}), "nodes.osImage", ("valid regular expression", 'got "^aliyun_3_(["')),
    (stack(nodes={"gpuDriver": "yes"}), "nodes.gpuDriver", ('one of "auto-install", "preinstalled"', 'got "yes"')),
    (stack(nodes={"driverVersion": "latest"}), "nodes.driverVersion",
     ("regular expression", 'such as "550.127.08"', 'got "latest"')),
    (stack(nodes={"cudaVersion": "12"}), "nodes.cudaVersion", ('such as "12.4.1"', 'got "12"')),
    (stack(nodes={"cudnnVersion": "nine"}), "nodes.cudnnVersion", ('such as "9.2.0.82"', 'got "nine"')),
    (stack(nodes={"internetBandwidthMbps": 0}), "nodes.internetBandwidthMbps", ("between 1 and 100", "got 0")),
    (stack(nodes={"internetBandwidthMbps": 200}), "nodes.internetBandwidthMbps", ("between 1 and 100", "got 200")),
    # access
    (stack(access={"adminCidrs": []}), "access.adminCidrs", ("at least 1 item", "got []")),
    (stack(access={"adminCidrs": "203.0.113.0/24"}), "access.adminCidrs", ("must be a list", 'got "203.0.113.0/24"')),
    (stack(access={"adminCidrs": ["my office"]}), "access.adminCidrs[0]", ("must be a CIDR", 'got "my office"')),
    (stack(access={"adminCidrs": ["203.0.113.0/24", "198.51.100.0/33"]}), "access.adminCidrs[1]",
     ("must be a CIDR", 'got "198.51.100.0/33"')),
    (stack(access={"adminCidrs": [24]}), "access.adminCidrs[0]", ("must be a string", "got 24")),
    (stack(access={"allowWorld": "please"}), "access.allowWorld", ("true or false", 'got "please"')),
    (stack(access={"dashboard": "public"}), "access.dashboard", ('one of "admin-cidrs", "tunnel"', 'got "public"')),
    (stack(access={"sshPrivateKeyPath": 7}), "access.sshPrivateKeyPath", ("must be a string", "got 7")),
    # container
    (stack(container={"image": "Roll Image"}), "container.image", ("image reference", 'got "Roll Image"')),
    (stack(container={"image": "registry.example.com/Me/Roll:v1"}), "container.image",
     ("in lower case", 'got "registry.example.com/Me/Roll:v1"')),
    (stack(container={"image": "roll:"}), "container.image", ("image reference", 'got "roll:"')),
    (stack(container={"image": "roll@sha256:123"}), "container.image", ("@sha256:digest", 'got "roll@sha256:123"')),
    (stack(container={"shmSize": "16"}), "container.shmSize", ("such as `16g` or `512m`", 'got "16"')),
    (stack(container={"shmSize": "0g"}), "container.shmSize", ("whole number of megabytes or gigabytes", 'got "0g"')),
    (stack(container={"shmSize": "1t"}), "container.shmSize", ("megabytes or gigabytes", 'got "1t"')),
    (stack(container={"shmSize": "1.5g"}), "container.shmSize", ("whole number", 'got "1.5g"')),
    (stack(container={"name": "-roll"}), "container.name", ("regular expression", 'such as "roll"', 'got "-roll"')),
    (stack(container={"name": "my roll"}), "container.name", ("regular expression", 'got "my roll"')),
    (stack(container={"registryUsername": 42}), "container.registryUsername", ("must be a string", "got 42")),
    # ray
    (stack(ray={"gcsPort": 0}), "ray.gcsPort", ("between 1 and 65535", "got 0")),
    (stack(ray={"dashboardPort": 65536}), "ray.dashboardPort", ("between 1 and 65535", "got 65536")),
    (stack(ray={"clientPort": -1}), "ray.clientPort", ("between 1 and 65535", "got -1")),
    (stack(ray={"gcsPort": "default"}), "ray.gcsPort", ("whole number", 'got "default"')),
    (stack(ray={"readyTimeoutSeconds": 29}), "ray.readyTimeoutSeconds", ("between 30 and 7200", "got 29")),
    (stack(ray={"readyTimeoutSeconds": 7201}), "ray.readyTimeoutSeconds", ("between 30 and 7200", "got 7201")),
    # training
    (stack(training={"framework": "deepspeed"}), "training.framework",
     ('one of "roll", "verl", "openrlhf", "mindspeed-rl", "custom"', 'got "deepspeed"')),
    (stack(training={"autoStart": "later"}), "training.autoStart", ("true or false", 'got "later"')),
    (stack(training={"overrides": ["max_steps=10"]}), "training.overrides",
     ("object with fields", 'got ["max_steps=10"]')),
    (stack(training={"roll": "v0.3.0"}), "training.roll", ("object with fields", 'got "v0.3.0"')),
    (stack(training={"roll": {"pipeline": "ppo"}}), "training.roll.pipeline",
     ('one of "agentic", "agentic_rollout", "rlvr"', '"onpolicy_distill"', 'got "ppo"')),
    (stack(training={"roll": {"ref": None}}), "training.roll.ref", ("must be a string", "got null")),
    (stack(training={"verl": {"dataDir": "data/gsm8k"}}), "training.verl.dataDir",
     ("absolute path", 'got "data/gsm8k"')),
    (stack(training={"openrlhf": {"vllmNumEngines": 0}}), "training.openrlhf.vllmNumEngines", ("at least 1", "got 0")),
    (stack(training={"openrlhf": {"vllmTensorParallelSize": 0}}), "training.openrlhf.vllmTensorParallelSize",
     ("at least 1", "got 0")),
    (stack(training={"openrlhf": {"rewardServer": "http://rm:5000"}}), "training.openrlhf.rewardServer",
     ("object with fields", 'got "http://rm:5000"')),
    (stack(training={"openrlhf": {"rewardServer": {"command": "serve {port}", "port": 80}}}),
     "training.openrlhf.rewardServer.port", ("between 1024 and 65535", "got 80")),
    (stack(training={"openrlhf": {"rewardServer": {"command": "serve {port}", "healthTimeoutSeconds": 5}}}),
     "training.openrlhf.rewardServer.healthTimeoutSeconds", ("between 10 and 7200", "got 5")),
    (stack(training={"openrlhf": {"rewardServer": {"port": 5000}}}), "training.openrlhf.rewardServer.command",
     ("required", "got nothing")),
    (stack(training={"custom": {"entrypoint": ["python3", "train.py"]}}), "training.custom.entrypoint",
     ("must be a string", 'got ["python3", "train.py"]')),
    # storage
    (stack(storage={"nas": "yes please"}), "storage.nas", ("true or false", 'got "yes please"')),
    (stack(storage={"retainOnDestroy": None}), "storage.retainOnDestroy", ("true or false", "got null")),
    (stack(storage={"nasStorageType": "Extreme"}), "storage.nasStorageType",
     ('one of "Capacity", "Performance", "Premium"', 'got "Extreme"')),
]


@pytest.mark.parametrize(
    ("sections", "path", "words"), BAD_VALUES, ids=[f"{path}={i}" for i, (_, path, _) in enumerate(BAD_VALUES)]
)
def test_a_bad_value_is_reported_at_its_key_with_what_is_allowed_and_what_was_given(
    sections: dict[str, Any], path: str, words: tuple[str, ...]
) -> None:
    found_path, message = only_problem(sections)
    assert found_path == f"{PROJECT}:{path}"
    assert_words(message, *words)


# (sections, the field the value lands in, the value as the model holds it)
GOOD_EDGE_VALUES: list[tuple[dict[str, Any], str, Any]] = [
    (stack(nodes={"count": 256}), "nodes.count", 256),
    (stack(nodes={"dataDiskGb": 100}), "nodes.data_disk_gb", 100),
    (stack(nodes={"dataDiskGb": 32768}), "nodes.data_disk_gb", 32768),
    (stack(nodes={"systemDiskGb": 100}), "nodes.system_disk_gb", 100),
    (stack(nodes={"zone": "cn-hangzhou-k"}), "nodes.zone", "cn-hangzhou-k"),
    (stack(nodes={"cudnnVersion": "9.2"}), "nodes.cudnn_version", "9.2"),
    (stack(nodes={"driverVersion": "550.127"}), "nodes.driver_version", "550.127"),
    (stack(container={"image": "docker.io/library/ubuntu:22.04", "registryMirror": "docker.m.daocloud.io"}),
     "container.image",
     "docker.io/library/ubuntu:22.04"),
    (stack(container={"image": "localhost:5000/roll__x/py-torch@sha256:" + "a" * 64}), "container.image",
     "localhost:5000/roll__x/py-torch@sha256:" + "a" * 64),
    (stack(container={"shmSize": "1024m"}), "container.shm_size_mb", 1024),
    (stack(container={"shmSize": "24G"}), "container.shm_size", "24g"),  # Docker's spelling, made canonical
    (stack(container={"shmSize": "10gb"}), "container.shm_size_mb", 10 * 1024),
    (stack(ray={"gcsPort": 1, "dashboardPort": 65535}), "ray.dashboard_port", 65535),
    (stack(access={"adminCidrs": ["198.51.100.7"]}), "access.admin_cidrs", ["198.51.100.7/32"]),  # one address
    (stack(access={"adminCidrs": ["203.0.112.0/20"]}), "access.admin_cidrs", ["203.0.112.0/20"]),  # under a /16
    (stack(access={"sshPublicKey": ED25519_KEY + "\n"}), "access.ssh_public_key", ED25519_KEY),
    (stack(training={"roll": {"baseConfig": "qwen2.5-7B-rlvr_megatron/rlvr_config.yml"}}),
     "training.roll.base_config", "qwen2.5-7B-rlvr_megatron/rlvr_config.yml"),
    (stack(training={"verl": {"dataPreparation": None}}), "training.verl.data_preparation", None),
]


@pytest.mark.parametrize(("sections", "attribute", "expected"), GOOD_EDGE_VALUES)
def test_values_at_the_edge_of_a_rule_are_accepted(sections: dict[str, Any], attribute: str, expected: Any) -> None:
    value: Any = parse(sections)
    for part in attribute.split("."):
        value = getattr(value, part)
    assert value == expected


# --------------------------------------------------------------------------------------------- unknown fields
def _models_by_path() -> list[tuple[tuple[str, ...], type[BaseModel]]]:
    """Every section model and nested model with its key path, found from the models themselves, so that a new
    nested object is covered without editing this test."""
    found: list[tuple[tuple[str, ...], type[BaseModel]]] = []

    def walk(model: type[BaseModel], path: tuple[str, ...]) -> None:
        for name, field in model.model_fields.items():
            candidates = [field.annotation, *getattr(field.annotation, "__args__", ())]
            nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
            if nested is not None:
                found.append(((*path, field.alias or name), nested))
                walk(nested, (*path, field.alias or name))

    walk(ClusterConfig, ())
    return found


# What a nested object needs besides the misspelt key, so that the unknown field is its only problem.
REQUIRED_IN = {
    ("training", "openrlhf", "rewardServer"): {"command": "python3 -m reward_server --port {port}"},
    ("training", "custom"): {"entrypoint": "python3 train.py"},
    ("training", "mindspeedRl"): {"tokenizerPath": "/m", "dataPath": "/d", "loadPath": "/l"},
}


def _with_key_at(path: tuple[str, ...], key: str) -> dict[str, Any]:
    sections = stack()
    if path[:2] == ("nodes", "hostDefaults"):  # a key of the hosts source only
        sections = hosts_stack()
    target = sections
    for depth, part in enumerate(path):
        target = target.setdefault(part, dict(REQUIRED_IN.get(path[: depth + 1], {})))
    target[key] = "x"
    return sections


UNKNOWN_FIELD_CASES = [
    (path, alias)
    for path, model in _models_by_path()
    for alias in (field.alias for field in model.model_fields.values())
    if alias is not None
]


def test_the_unknown_field_cases_cover_every_section_and_nested_object() -> None:
    paths = {".".join(path) for path, _ in UNKNOWN_FIELD_CASES}
    assert paths == {
        *SECTIONS, "training.roll", "training.verl", "training.openrlhf", "training.openrlhf.rewardServer",
        "training.custom", "training.mindspeedRl", "training.mindspeedRl.mindspeed", "training.mindspeedRl.megatron",
        "training.mindspeedRl.mindspeedLlm", "nodes.hostDefaults", "nodes.autostop",
    }


@pytest.mark.parametrize(
    ("path", "alias"), UNKNOWN_FIELD_CASES, ids=[".".join((*p, a)) for p, a in UNKNOWN_FIELD_CASES]
)
def test_a_misspelt_field_names_the_field_it_probably_meant(path: tuple[str, ...], alias: str) -> None:
    typo = alias[:-1] if len(alias) > 3 else alias + "s"  # `instanceType` for `instanceTypes`, `refs` for `ref`
    found_path, message = only_problem(_with_key_at(path, typo))
    assert found_path == f"{PROJECT}:{'.'.join((*path, typo))}"
    assert_words(message, "unknown field", f"did you mean {alias!r}?", "Allowed: ", alias)


def test_the_documented_typo_suggests_instance_types() -> None:
    found = problems({"nodes": {"instanceType": [ONE_V100]}, "access": stack()["access"]})
    assert found[0] == f"{PROJECT}:nodes.instanceTypes: required; got nothing"
    assert found[1].startswith(
        f"{PROJECT}:nodes.instanceType: unknown field; did you mean 'instanceTypes'? Allowed: "
    )
    allowed = found[1].split("Allowed: ", 1)[1].split(", ")
    assert {"count", "instanceTypes", "zone", "spot", "dataDiskGb"} <= set(allowed)
    assert len(found) == 2


def test_an_unknown_field_with_no_near_name_lists_the_allowed_ones() -> None:
    path, message = only_problem(stack(ray={"xyzzy": 1}))
    assert path == f"{PROJECT}:ray.xyzzy"
    assert "did you mean" not in message
    assert_words(message, "unknown field", "Allowed: gcsPort, dashboardPort, clientPort, readyTimeoutSeconds")


def test_overrides_take_any_keys_of_the_framework() -> None:
    overrides = {"actor_train": {"model_args": {"dtype": "fp16"}}, "trainer.total_epochs": 3, "anything_else": [1]}
    assert parse(stack(training={"overrides": overrides})).training.overrides == overrides


# ----------------------------------------------------------------------------------------- top-level keys
def test_a_misspelt_section_suggests_the_section() -> None:
    found = problems(stack(storag={"nas": True}))
    assert found == [
        f"{PROJECT}:storag: unknown key; did you mean 'storage'? Allowed: nodes, access, container, ray, training, "
        "storage, wandbApiKey, hfToken, registryPassword"
    ]


def test_a_misspelt_secret_suggests_the_secret() -> None:
    path, message = only_problem({**stack(), "wandbApiKy": "secret-value"})
    assert path == f"{PROJECT}:wandbApiKy"
    assert_words(message, "unknown key", "did you mean 'wandbApiKey'?")


def test_a_field_set_outside_its_section_names_the_section() -> None:
    path, message = only_problem({**stack(), "instanceTypes": json.dumps([ONE_V100])})
    assert path == f"{PROJECT}:instanceTypes"
    assert_words(message, "unknown key", "did you mean 'nodes.instanceTypes'?")


def test_a_dotted_key_set_without_path_explains_pulumi_config_set_path() -> None:
    # `pulumi config set roll-cluster:nodes.count 2` (no --path) stores a key literally named "nodes.count".
    path, message = only_problem({**stack(), "nodes.count": "2"})
    assert path == f"{PROJECT}:nodes.count"
    assert_words(message, "unknown key", "pulumi config set --path 'roll-cluster:nodes.count' <value>")


def test_an_unrelated_key_lists_the_allowed_keys_without_a_guess() -> None:
    path, message = only_problem({**stack(), "zzz": "1"})
    assert path == f"{PROJECT}:zzz"
    assert "did you mean" not in message
    assert_words(message, "unknown key", "Allowed: nodes, access, container, ray, training, storage")


def test_secrets_are_not_sections_and_are_ignored_here() -> None:
    # Their values are read as secrets elsewhere (infra/stack_config.py); here they must not be parsed as objects.
    raw = {**as_pulumi(stack()), **{name: "not an object" for name in SECRETS}}
    assert parse_cluster_config(raw, "cn-hangzhou").nodes.count == 1


# -------------------------------------------------------------------------------- section values themselves
@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("gn6v", '"gn6v"'),  # a plain string, not JSON
        ("{count: 2", '"{count: 2"'),  # broken JSON
        ("[1, 2]", "[1, 2]"),  # JSON, but a list
        ("2", "2"),
        ('"ecs.gn6v-c8g1.2xlarge"', '"ecs.gn6v-c8g1.2xlarge"'),
        ("true", "true"),
    ],
)
def test_a_section_must_be_an_object(text: str, shown: str) -> None:
    path, message = only_problem({**stack(), "nodes": text})
    # Reported once: the section is not also reported as missing.
    assert path == f"{PROJECT}:nodes"
    assert_words(message, "must be an object with fields", f"got {shown}", "pulumi config set --path")


def test_a_section_given_as_none_is_not_set() -> None:
    assert parse({**stack(), "storage": None}).storage == parse(stack()).storage
    path, message = only_problem({**stack(), "nodes": None})
    assert (path, message) == (f"{PROJECT}:nodes", "required; got nothing")


# ---------------------------------------------------------------------------------------------- required
@pytest.mark.parametrize(
    ("sections", "path"),
    [
        ({**stack(), "nodes": {"count": 2}}, "nodes.instanceTypes"),
        ({**stack(), "access": {"sshPublicKey": ED25519_KEY}}, "access.adminCidrs"),
        ({**stack(), "access": {"adminCidrs": ["203.0.113.0/24"]}}, "access.sshPublicKey"),
        (stack(nodes=None), "nodes"),
        (stack(access=None), "access"),
        (stack(training={"framework": "custom", "custom": {"workingDir": "/workspace/job"}}),
         "training.custom.entrypoint"),
    ],
)
def test_a_missing_required_key_is_named(sections: dict[str, Any], path: str) -> None:
    found_path, message = only_problem(sections)
    assert found_path == f"{PROJECT}:{path}"
    assert_words(message, "required", "got nothing")


def test_instance_types_given_as_null_is_a_type_error_not_a_crash() -> None:
    path, message = only_problem(stack(nodes={"instanceTypes": None}))
    assert path == f"{PROJECT}:nodes.instanceTypes"
    assert_words(message, "must be a list", "got null")


def test_an_empty_configuration_names_both_required_sections_and_the_region() -> None:
    assert problems({}, region=None) == [
        "alicloud:region: required (pulumi config set alicloud:region cn-hangzhou); got nothing",
        f"{PROJECT}:nodes: required; got nothing",
        f"{PROJECT}:access: required; got nothing",
    ]


def test_region_is_required_and_said_how_to_set() -> None:
    path, message = only_problem(stack(), region=None)
    assert path == "alicloud:region"
    assert_words(message, "required", "pulumi config set alicloud:region cn-hangzhou", "got nothing")


@pytest.mark.parametrize("region", ["Hangzhou", "cn hangzhou", "CN-HANGZHOU", ""])
def test_a_malformed_region_is_reported_under_its_provider_key(region: str) -> None:
    path, message = only_problem(stack(), region=region)
    assert path == "alicloud:region"
    assert_words(message, "region id such as `cn-hangzhou`", f"got {json.dumps(region)}")


# ---------------------------------------------------------------------------------------------- ray ports
@pytest.mark.parametrize("key", ["gcsPort", "dashboardPort", "clientPort"])
def test_no_ray_port_may_be_ssh(key: str) -> None:
    path, message = only_problem(stack(ray={key: 22}))
    assert path == f"{PROJECT}:ray.{key}"
    assert_words(message, "must not be 22", "SSH", "got 22")


@pytest.mark.parametrize(
    ("ports", "clashes"),
    [
        ({"gcsPort": 8265}, {"dashboardPort": "gcsPort"}),  # dashboard keeps its default 8265
        ({"clientPort": 6379}, {"clientPort": "gcsPort"}),
        ({"clientPort": 8265}, {"clientPort": "dashboardPort"}),
        ({"gcsPort": 7000, "dashboardPort": 7000, "clientPort": 7000}, {"dashboardPort": "gcsPort",
                                                                         "clientPort": "gcsPort"}),
    ],
)
def test_ray_ports_must_be_distinct(ports: dict[str, int], clashes: dict[str, str]) -> None:
    found = problems(stack(ray=ports))
    assert len(found) == len(clashes), found
    for problem, (key, other) in zip(found, clashes.items(), strict=True):
        path, _, message = problem.partition(": ")
        assert path == f"{PROJECT}:ray.{key}"
        assert_words(message, f"must be distinct from {other}", "for both")


def test_ssh_port_and_a_clash_are_reported_together() -> None:
    found = problems(stack(ray={"gcsPort": 22, "dashboardPort": 10001}))
    assert [p.partition(":")[2].partition(":")[0] for p in found] == ["ray.gcsPort", "ray.clientPort"]
    assert "must not be 22" in found[0]
    assert "must be distinct from dashboardPort" in found[1]


# ------------------------------------------------------------------------------------------ admin CIDRs
def test_the_whole_internet_needs_allow_world() -> None:
    path, message = only_problem(stack(access={"adminCidrs": ["203.0.113.0/24", "0.0.0.0/0"]}))
    assert path == f"{PROJECT}:access.adminCidrs"
    assert_words(message, "0.0.0.0/0", "whole internet", "allowWorld: true", 'got ["0.0.0.0/0"] without allowWorld')


def test_cidrs_whose_union_is_the_whole_internet_need_allow_world_too() -> None:
    path, message = only_problem(stack(access={"adminCidrs": ["0.0.0.0/1", "128.0.0.0/1"]}))
    assert path == f"{PROJECT}:access.adminCidrs"
    assert_words(message, "whole internet", "allowWorld: true")


@pytest.mark.parametrize("world", [["0.0.0.0/0"], ["0.0.0.0/1", "128.0.0.0/1"]])
def test_the_whole_internet_is_accepted_with_allow_world_for_ssh_through_the_tunnel(world: list[str]) -> None:
    config = parse(stack(access={"adminCidrs": world, "allowWorld": True}))
    assert (config.access.admin_cidrs, config.access.dashboard) == (world, "tunnel")


@pytest.mark.parametrize(
    "world", [["0.0.0.0/0"], ["0.0.0.0/1", "128.0.0.0/1"], ["0.0.0.0/2", "64.0.0.0/2", "128.0.0.0/1"]]
)
def test_the_dashboard_is_never_opened_to_the_world_even_with_allow_world(world: list[str]) -> None:
    path, message = only_problem(stack(access={"adminCidrs": world, "allowWorld": True, "dashboard": "admin-cidrs"}))
    assert path == f"{PROJECT}:access.dashboard"
    assert_words(message, "whole internet", "run code on your cluster and read its secrets", "even with allowWorld",
                 "tunnel", 'got "admin-cidrs"')


def test_the_dashboard_defaults_to_the_tunnel_and_admin_cidrs_is_an_opt_in() -> None:
    assert parse(stack()).access.dashboard == "tunnel"
    assert parse(stack(access={"dashboard": "admin-cidrs"})).access.dashboard == "admin-cidrs"


def test_a_cidr_listed_twice_is_refused() -> None:
    path, message = only_problem(stack(access={"adminCidrs": ["203.0.113.0/24", "10.0.0.0/8", "203.0.113.0/24"]}))
    assert path == f"{PROJECT}:access.adminCidrs[2]"
    assert_words(message, "repeats adminCidrs[0]", "list each CIDR once", 'got "203.0.113.0/24" twice')


@pytest.mark.parametrize("cidr", ["2001:db8::/32", "::/0"])
def test_ipv6_cidrs_are_refused_while_the_vpc_has_no_ipv6(cidr: str) -> None:
    path, message = only_problem(stack(access={"adminCidrs": ["203.0.113.0/24", cidr], "allowWorld": True}))
    assert path == f"{PROJECT}:access.adminCidrs[1]"
    assert_words(message, "must be an IPv4 CIDR", "VPC has no IPv6", f'got "{cidr}"')


def test_allow_world_false_explicitly_still_refuses_the_world() -> None:
    path, _ = only_problem(stack(access={"adminCidrs": ["0.0.0.0/0"], "allowWorld": False}))
    assert path == f"{PROJECT}:access.adminCidrs"


def test_allow_world_alone_changes_nothing_for_normal_ranges() -> None:
    assert parse(stack(access={"allowWorld": True})).access.admin_cidrs == ["203.0.113.0/24"]


def test_the_world_rule_is_reported_even_when_the_key_is_wrong_too() -> None:
    found = problems(stack(access={"adminCidrs": ["0.0.0.0/0"], "sshPublicKey": "nope"}))
    assert [p.split(": ")[0] for p in found] == [f"{PROJECT}:access.adminCidrs", f"{PROJECT}:access.sshPublicKey"]


@pytest.mark.parametrize(
    ("cidr", "suggestion"),
    [("10.0.0.1/8", "10.0.0.0/8"), ("203.0.113.7/24", "203.0.113.0/24")],
)
def test_a_cidr_with_host_bits_is_rejected_with_the_network_it_probably_meant(cidr: str, suggestion: str) -> None:
    path, message = only_problem(stack(access={"adminCidrs": [cidr]}))
    assert path == f"{PROJECT}:access.adminCidrs[0]"
    assert_words(message, "must be a CIDR", "host bits set", f"did you mean {suggestion}?", f'got "{cidr}"')


def test_every_bad_cidr_is_reported_with_its_index() -> None:
    found = problems(stack(access={"adminCidrs": ["bad", "203.0.113.0/24", "10.1.1.1/16"]}))
    assert [p.split(": ")[0] for p in found] == [f"{PROJECT}:access.adminCidrs[0]", f"{PROJECT}:access.adminCidrs[2]"]


# ------------------------------------------------------------------------------------------------- spot
def test_a_price_limit_implies_spot() -> None:
    nodes = parse(stack(nodes={"spotPriceLimit": 12.5})).nodes
    assert (nodes.spot, nodes.spot_price_limit, nodes.spot_strategy) == (True, 12.5, "SpotWithPriceLimit")


def test_spot_without_a_limit_follows_the_market_price() -> None:
    nodes = parse(stack(nodes={"spot": True})).nodes
    assert (nodes.spot, nodes.spot_price_limit, nodes.spot_strategy) == (True, None, "SpotAsPriceGo")


def test_spot_true_with_a_limit_is_accepted() -> None:
    assert parse(stack(nodes={"spot": True, "spotPriceLimit": 3})).nodes.spot_strategy == "SpotWithPriceLimit"


def test_explicit_spot_false_with_a_price_limit_is_a_contradiction() -> None:
    path, message = only_problem(stack(nodes={"spot": False, "spotPriceLimit": 3}))
    assert path == f"{PROJECT}:nodes.spot"
    assert_words(message, "must not be false when spotPriceLimit is set", "got false with spotPriceLimit 3")


def test_the_spot_contradiction_is_reported_with_other_problems_of_the_section() -> None:
    found = problems(stack(nodes={"spot": False, "spotPriceLimit": 3, "count": 0}))
    assert sorted(p.split(": ")[0] for p in found) == [f"{PROJECT}:nodes.count", f"{PROJECT}:nodes.spot"]


# ---------------------------------------------------------------------------------------- instance types
@pytest.mark.parametrize("name", ["ecs.g7.2xlarge", "ecs.c7.large", "gn6v-c8g1.2xlarge", "ecs.gn5-c4g1.xlarge", ""])
def test_an_instance_type_must_be_a_gpu_type_of_a_known_family(name: str) -> None:
    path, message = only_problem(stack(nodes={"instanceTypes": [ONE_V100, name]}))
    assert path == f"{PROJECT}:nodes.instanceTypes[1]"
    assert_words(message, "ECS GPU instance type of a known family", "ecs.gn6v", "ecs.gn8v", f'got "{name}"')


def test_every_type_of_the_catalog_is_accepted() -> None:
    for name in catalog.INSTANCE_TYPES:
        assert parse(stack(nodes={"instanceTypes": [name]})).gpus_per_node == catalog.INSTANCE_TYPES[name].gpus


def test_a_size_the_catalog_lacks_is_left_to_the_live_answer() -> None:
    # A known GPU family with a size that is not in the catalog: the region's live instance-type list decides.
    config = parse(stack(nodes={"instanceTypes": ["ecs.gn7i-c64g1.64xlarge"]}))
    assert config.nodes.instance_types == ["ecs.gn7i-c64g1.64xlarge"]
    assert config.nodes.gpus_per_node is None


def test_an_instance_type_listed_twice_is_named() -> None:
    path, message = only_problem(stack(nodes={"instanceTypes": [ONE_V100, "ecs.gn6e-c12g1.3xlarge", ONE_V100]}))
    assert path == f"{PROJECT}:nodes.instanceTypes"
    assert_words(message, "must list each type once", f'got "{ONE_V100}" more than once')


def test_candidates_must_have_the_same_number_of_gpus() -> None:
    path, message = only_problem(stack(nodes={"instanceTypes": [ONE_V100, TWO_V100]}))
    assert path == f"{PROJECT}:nodes.instanceTypes"
    assert_words(message, "same number of GPUs per node", f"{ONE_V100} (1 GPU)", f"{TWO_V100} (2 GPUs)")


def test_candidates_of_different_families_with_the_same_gpu_count_are_fine() -> None:
    config = parse(stack(nodes={"instanceTypes": [EIGHT_H20, EIGHT_A100, "ecs.gn7i-8x.32xlarge"]}))
    assert config.gpus_per_node == 8
    assert config.instance_type_info is not None
    assert config.instance_type_info.name == EIGHT_H20


def test_every_bad_instance_type_is_reported() -> None:
    found = problems(stack(nodes={"instanceTypes": ["ecs.g7.large", ONE_V100, "ecs.c7.large"]}))
    assert [p.split(": ")[0] for p in found] == [
        f"{PROJECT}:nodes.instanceTypes[0]", f"{PROJECT}:nodes.instanceTypes[2]"
    ]


def test_a_zone_must_belong_to_the_region() -> None:
    path, message = only_problem(stack(nodes={"zone": "cn-beijing-a"}), region="cn-hangzhou")
    assert path == f"{PROJECT}:nodes.zone"
    assert_words(message, "zone of alicloud:region cn-hangzhou", "`cn-hangzhou-k`", 'got "cn-beijing-a"')


# ----------------------------------------------------------------------------------------- device mapping
def two_by_two(**training: Any) -> dict[str, Any]:
    """2 nodes x 2 V100 (4 GPUs, global indices 0..3), like Pulumi.multi.yaml."""
    return stack(nodes={"count": 2, "instanceTypes": [TWO_V100]}, training=training)


def test_device_mappings_within_the_cluster_are_accepted() -> None:
    overrides = {
        "actor_train": {"device_mapping": "list(range(0,4))"},
        "actor_infer": {"device_mapping": "list(range(0, 2)) + [2, 3]"},
        "reference": {"device_mapping": [0, 1, 2, 3]},
        "critic": {"device_mapping": None},  # ROLL's "no such worker"
    }
    assert parse(two_by_two(overrides=overrides)).training.overrides == overrides


def test_a_device_mapping_beyond_the_cluster_names_its_full_path() -> None:
    path, message = only_problem(two_by_two(overrides={"actor_train": {"device_mapping": "list(range(0,8))"}}))
    assert path == f"{PROJECT}:training.overrides.actor_train.device_mapping"
    assert_words(
        message, "within 0..3", "2 nodes x 2 GPUs = 4 GPUs", 'got "list(range(0,8))"', "uses index 7"
    )


def test_a_device_mapping_on_one_gpu_says_so() -> None:
    path, message = only_problem(stack(training={"overrides": {"actor_infer": {"device_mapping": "[0, 1]"}}}))
    assert path == f"{PROJECT}:training.overrides.actor_infer.device_mapping"
    assert_words(message, "within 0..0", "1 node x 1 GPU = 1 GPU", 'got "[0, 1]"')


def test_device_mappings_are_found_at_any_depth_and_all_reported() -> None:
    overrides = {
        "actor_train": {"device_mapping": "list(range(0,16))"},
        "rewards": {"math_rule": {"device_mapping": "list(range(12,16))"}, "code": {"device_mapping": "[0]"}},
        "actor_infer.device_mapping": "[4]",  # a dotted key counts too
        "envs": [{"device_mapping": "[9]"}],
    }
    found = problems(two_by_two(overrides=overrides))
    assert [p.split(": ")[0] for p in found] == [
        f"{PROJECT}:training.overrides.actor_train.device_mapping",
        f"{PROJECT}:training.overrides.rewards.math_rule.device_mapping",
        f"{PROJECT}:training.overrides.actor_infer.device_mapping",
        f"{PROJECT}:training.overrides.envs[0].device_mapping",
    ]


def test_device_mappings_scale_with_the_node_count() -> None:
    overrides = {"actor_train": {"device_mapping": "list(range(0,16))"}}
    two_nodes = stack(nodes={"count": 2, "instanceTypes": [EIGHT_H20]}, training={"overrides": overrides})
    assert parse(two_nodes).training.overrides == overrides
    one_node = stack(nodes={"count": 1, "instanceTypes": [EIGHT_H20]}, training={"overrides": overrides})
    _, message = only_problem(one_node)
    assert_words(message, "within 0..7", "1 node x 8 GPUs = 8 GPUs")


@pytest.mark.parametrize(
    ("mapping", "words"),
    [
        ("__import__('os').system('reboot')", ("`list(range(a,b))`", "is none of those")),
        ("range(0,4)", ("`list(range(a,b))`", "`range(0,4)` is none of those")),
        ("list(range(0,4,0))", ("step", "must not be 0")),
        (4, ("`list(range(a,b))`",)),
        ([0, "1"], ("whole numbers",)),
    ],
)
def test_a_device_mapping_that_is_not_a_known_form_is_rejected_not_evaluated(
    mapping: Any, words: tuple[str, ...]
) -> None:
    path, message = only_problem(two_by_two(overrides={"actor_train": {"device_mapping": mapping}}))
    assert path == f"{PROJECT}:training.overrides.actor_train.device_mapping"
    assert_words(message, *words, f"got {json.dumps(mapping)}")


def test_device_mappings_are_only_roll_keys() -> None:
    # verl and OpenRLHF have no device_mapping; such a key is passed through untouched.
    overrides = {"actor_train": {"device_mapping": "list(range(0,64))"}}
    config = parse(two_by_two(framework="verl", overrides=overrides))
    assert config.training.overrides == overrides


def test_device_mappings_are_not_checked_when_the_gpu_count_is_unknown() -> None:
    # No candidate is in the catalog: the GPU count comes from the region at deployment.
    sections = stack(
        nodes={"instanceTypes": ["ecs.gn7i-c64g1.64xlarge"]},
        training={"overrides": {"actor_train": {"device_mapping": "list(range(0,8))"}}},
    )
    assert parse(sections).gpus_per_node == 1  # the documented fallback of the property


# ----------------------------------------------------------------------------------------- roll settings
@pytest.mark.parametrize(
    "base_config",
    [
        "/etc/passwd.yaml",  # absolute
        "/workspace/ROLL/examples/agentic_demo/x.yaml",
        "../../etc/x.yaml",  # climbs out of examples/
        "agentic_demo/../../x.yaml",
        "agent_val_frozen_lake_single_node_demo.yaml",  # no directory part
        "./agent_val_frozen_lake_single_node_demo.yaml",
        "agentic_demo/agent_val_frozen_lake_single_node_demo",  # not a YAML file
        "agentic_demo/",
        "",
    ],
)
def test_base_config_must_stay_inside_roll_examples(base_config: str) -> None:
    path, message = only_problem(stack(training={"roll": {"baseConfig": base_config}}))
    assert path == f"{PROJECT}:training.roll.baseConfig"
    assert_words(message, "`<dir>/<name>.yaml` inside ROLL's examples/", "no absolute path", "no `..`",
                 f"got {json.dumps(base_config)}")


def test_framework_custom_requires_its_entrypoint() -> None:
    path, message = only_problem(stack(training={"framework": "custom"}))
    assert path == f"{PROJECT}:training.custom.entrypoint"
    assert_words(message, "required when framework is `custom`", "got nothing")


def test_framework_custom_with_an_entrypoint_is_accepted() -> None:
    config = parse(stack(training={"framework": "custom", "custom": {"entrypoint": "python3 my_ray_job.py"}}))
    assert config.training.custom is not None
    assert (config.training.custom.entrypoint, config.training.custom.working_dir) == (
        "python3 my_ray_job.py", "/workspace"
    )


def test_a_custom_section_is_harmless_for_other_frameworks() -> None:
    assert parse(stack(training={"custom": {"entrypoint": "true"}})).training.framework == "roll"


# ---------------------------------------------------------------------------------------------- openrlhf
def openrlhf(engines: int, tp: int) -> dict[str, Any]:
    return stack(
        nodes={"count": 2, "instanceTypes": [EIGHT_H20]},
        training={"framework": "openrlhf", "openrlhf": {"vllmNumEngines": engines, "vllmTensorParallelSize": tp}},
    )


def test_openrlhf_engines_that_fit_are_accepted() -> None:
    assert parse(openrlhf(8, 2)).training.openrlhf.vllm_num_engines == 8


def test_openrlhf_engines_must_fit_the_gpus() -> None:
    path, message = only_problem(openrlhf(9, 2))
    assert path == f"{PROJECT}:training.openrlhf.vllmNumEngines"
    assert_words(message, "vllmNumEngines x vllmTensorParallelSize", "2 nodes x 8 GPUs = 16 GPUs",
                 "got 9 x 2 = 18 GPUs")


def test_openrlhf_defaults_do_not_fit_one_gpu() -> None:
    # Two engines by default: a one-GPU stack must say so rather than hang waiting for GPUs.
    path, message = only_problem(stack(training={"framework": "openrlhf"}))
    assert path == f"{PROJECT}:training.openrlhf.vllmNumEngines"
    assert_words(message, "1 node x 1 GPU = 1 GPU", "got 2 x 1 = 2 GPUs")


def test_openrlhf_engine_limits_are_not_applied_to_other_frameworks() -> None:
    sections = stack(training={"openrlhf": {"vllmNumEngines": 64}})
    assert parse(sections).training.framework == "roll"


# ----------------------------------------------------------------------------------------------- ssh key
@pytest.mark.parametrize("key", [ED25519_KEY, RSA_KEY, ECDSA_KEY, ED25519_KEY.rsplit(" ", 1)[0]])
def test_real_public_keys_are_accepted(key: str) -> None:
    assert parse(stack(access={"sshPublicKey": key})).access.ssh_public_key == key


@pytest.fixture(scope="module")
def fresh_public_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed; the constant keys above cover the same forms")
    folder = tmp_path_factory.mktemp("keys")
    keys = []
    for kind, bits in [("ed25519", None), ("rsa", "3072"), ("ecdsa", "256"), ("ecdsa", "384"), ("ecdsa", "521")]:
        path = folder / f"id_{kind}_{bits}"
        command = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "bob@ci", "-f", str(path)]
        subprocess.run([*command, *(["-b", bits] if bits else [])], check=True, timeout=60)
        keys.append(Path(f"{path}.pub").read_text())
    yield keys


def test_keys_fresh_from_ssh_keygen_are_accepted_as_pasted(fresh_public_keys: list[str]) -> None:
    for key in fresh_public_keys:  # with the trailing newline of the .pub file
        assert parse(stack(access={"sshPublicKey": key})).access.ssh_public_key == key.strip()


def test_a_private_key_is_rejected_without_echoing_it() -> None:
    found = problems(stack(access={"sshPublicKey": PRIVATE_KEY}))
    assert len(found) == 1
    path, _, message = found[0].partition(": ")
    assert path == f"{PROJECT}:access.sshPublicKey"
    assert_words(message, "must be a public key", "got a private key", "sshPrivateKeyPath")
    assert "SECRETBODY" not in message and "b3BlbnNzaC1rZXkt" not in message


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("garbage", ("one OpenSSH public key line", "ssh-ed25519", 'got "garbage"')),
        ("AAAAC3NzaC1lZDI1NTE5AAAAIMR+SbE52JYp8zoMUnNK2iR+m4SPaijZ3p3gcG/0NCwD", ("<type> <base64 key data>",)),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", ("type one of", 'got "ssh-dss AAAAB3NzaC1kc3MAAACBAP"')),
        ("ssh-ed25519", ("one OpenSSH public key line",)),
        (ED25519_KEY + "\n" + RSA_KEY, ("one OpenSSH public key line",)),  # two keys pasted
        ("ssh-ed25519 !!!notbase64!!! alice@laptop", ("not base64", 'got "ssh-ed25519 !!!notbase64!!!')),
        ("ssh-ed25519 " + RSA_KEY.split()[1] + " alice@laptop", ("valid ssh-ed25519 key", "key data is for ssh-rsa")),
        ("ssh-rsa " + ED25519_KEY.split()[1], ("valid ssh-rsa key", "key data is for ssh-ed25519")),
        ("ecdsa-sha2-nistp384 " + ECDSA_KEY.split()[1], ("key data is for ecdsa-sha2-nistp256",)),
        ("ssh-ed25519 aGVsbG8gd29ybGQ= alice@laptop", ("valid ssh-ed25519 key", "not an SSH key")),
    ],
)
def test_a_broken_public_key_is_rejected_clearly(key: str, words: tuple[str, ...]) -> None:
    path, message = only_problem(stack(access={"sshPublicKey": key}))
    assert path == f"{PROJECT}:access.sshPublicKey"
    assert_words(message, "got ", *words)


# ------------------------------------------------------------------------------------ all problems at once
def test_problems_in_every_section_are_reported_in_one_error() -> None:
    sections = {
        "nodes": {"count": 0, "instanceTypes": [ONE_V100, "ecs.g7.large"], "instanceType": "x"},
        "access": {"adminCidrs": ["0.0.0.0/0"], "sshPublicKey": PRIVATE_KEY},
        "container": {"shmSize": "lots"},
        "ray": {"gcsPort": 22},
        "training": {"framework": "custom", "roll": {"baseConfig": "/abs.yaml"}},
        "storage": {"nasStorageType": "fast"},
        "nodez": {},
    }
    found = problems(sections, region="Hangzhou")
    assert sorted(p.split(": ")[0] for p in found) == sorted([
        f"{PROJECT}:nodez",
        "alicloud:region",
        f"{PROJECT}:nodes.count",
        f"{PROJECT}:nodes.instanceTypes[1]",
        f"{PROJECT}:nodes.instanceType",
        f"{PROJECT}:access.adminCidrs",
        f"{PROJECT}:access.sshPublicKey",
        f"{PROJECT}:container.shmSize",
        f"{PROJECT}:ray.gcsPort",
        f"{PROJECT}:training.roll.baseConfig",
        f"{PROJECT}:training.custom.entrypoint",
        f"{PROJECT}:storage.nasStorageType",
    ])


def test_cross_section_rules_are_reported_with_problems_elsewhere() -> None:
    # The device mapping needs nodes; it must not wait until an unrelated storage typo is fixed.
    sections = stack(
        training={"overrides": {"actor_train": {"device_mapping": "list(range(0,2))"}}},
        storage={"nas": "maybe"},
        container={"shmSize": "huge"},
    )
    assert sorted(p.split(": ")[0] for p in problems(sections)) == [
        f"{PROJECT}:container.shmSize",
        f"{PROJECT}:storage.nas",
        f"{PROJECT}:training.overrides.actor_train.device_mapping",
    ]


def test_the_error_text_has_one_line_per_problem() -> None:
    with pytest.raises(ConfigError) as caught:
        parse(stack(nodes={"count": 0}, ray={"gcsPort": 22}))
    assert str(caught.value).splitlines() == [
        "invalid stack configuration:",
        "  roll-cluster:nodes.count: must be between 1 and 256; got 0",
        "  roll-cluster:ray.gcsPort: must not be 22, the nodes' SSH port; got 22",
    ]


def test_every_problem_names_a_key_path() -> None:
    # Every line, whatever rule produced it, starts with `roll-cluster:` or `alicloud:region`, then ": ".
    sections = {
        "nodes": {"count": "x", "instanceTypes": [], "zone": 5, "spotPriceLimit": 1, "spot": False},
        "access": {"adminCidrs": ["::/0", "1.2.3.4/8"], "sshPublicKey": "ssh-rsa AAAA", "extra": 1},
        "ray": {"clientPort": 6379},
        "training": {"framework": "openrlhf", "openrlhf": {"rewardServer": {}}, "verl": {"dataDir": "x"}},
        "container": "[]",
    }
    for problem in problems(sections, region="x"):
        path, separator, message = problem.partition(": ")
        assert separator and message, problem
        assert path.startswith((f"{PROJECT}:", "alicloud:region")), problem
        assert not path.endswith((":", ".")), problem
        assert "got " in message or "unknown" in message, problem


# ----------------------------------------------------------------------------------------- shipped stacks
STACK_FILES = sorted(REPO.glob("Pulumi.*.yaml"))


@pytest.mark.skipif(not STACK_FILES, reason="no Pulumi.<stack>.yaml in the repository yet")
@pytest.mark.parametrize("stack_file", STACK_FILES, ids=[p.name for p in STACK_FILES])
def test_every_shipped_stack_file_is_valid(stack_file: Path) -> None:
    settings = yaml.safe_load(stack_file.read_text())["config"]
    raw = {
        key.split(":", 1)[1]: json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        for key, value in settings.items()
        if key.startswith(f"{PROJECT}:")
    }
    config = parse_cluster_config(raw, settings.get("alicloud:region"))
    if config.nodes.source == "hosts":
        assert config.nodes.hosts and config.nodes.count == len(config.nodes.hosts)
    else:
        assert config.nodes.instance_types


# ---------------------------------------------------------------------------------- mainland China regions
@pytest.mark.parametrize("image", ["verlai/verl:vllm012.dev3", "docker.io/library/ubuntu:22.04", "ubuntu:22.04"])
def test_a_docker_hub_image_in_a_mainland_region_needs_a_mirror(image: str) -> None:
    path, message = only_problem(stack(container={"image": image}), region="cn-beijing")
    assert path == "roll-cluster:container.image"
    assert_words(message, "Docker Hub", "cn-beijing", "container.registryMirror", "your own ACR", json.dumps(image))
    # Outside the mainland, and through a mirror, it is fine.
    assert parse(stack(container={"image": image}), region="cn-hongkong").container.pull_image == image
    assert parse(stack(container={"image": image}), region="ap-southeast-1").container.pull_image == image


@pytest.mark.parametrize(
    ("image", "mirror", "pulled", "host"),
    [
        ("verlai/verl:vllm012.dev3", "docker.m.daocloud.io", "docker.m.daocloud.io/verlai/verl:vllm012.dev3",
         "docker.m.daocloud.io"),
        ("ubuntu:22.04", "https://registry.example.com/hub/", "registry.example.com/hub/library/ubuntu:22.04",
         "registry.example.com"),
        ("docker.io/library/ubuntu@sha256:" + "b" * 64, "mirror.example.com:5000",
         "mirror.example.com:5000/library/ubuntu@sha256:" + "b" * 64, "mirror.example.com:5000"),
        # Not from Docker Hub: pulled as written, whatever the mirror.
        ("nvcr.io/nvidia/pytorch:25.11-py3", "docker.m.daocloud.io", "nvcr.io/nvidia/pytorch:25.11-py3", "nvcr.io"),
    ],
)
def test_docker_hub_images_are_pulled_through_the_mirror(image: str, mirror: str, pulled: str, host: str) -> None:
    container = parse(stack(container={"image": image, "registryMirror": mirror})).container
    assert (container.pull_image, container.registry_host, container.image) == (pulled, host, image)


def test_a_registry_mirror_must_be_a_registry_host() -> None:
    path, message = only_problem(stack(container={"registryMirror": "not a host"}))
    assert path == "roll-cluster:container.registryMirror"
    assert_words(message, "registry host", '"not a host"')


@pytest.mark.parametrize(
    ("region", "setting", "source"),
    [
        ("cn-hangzhou", None, "hf-mirror"),
        ("cn-wulanchabu", None, "hf-mirror"),
        ("cn-hongkong", None, "huggingface"),
        ("ap-southeast-1", None, "huggingface"),
        ("cn-hangzhou", "modelscope", "modelscope"),
        ("cn-hangzhou", "huggingface", "huggingface"),
    ],
)
def test_the_model_source_defaults_per_region(region: str, setting: str | None, source: str) -> None:
    training = {"modelSource": setting} if setting else {}
    assert parse(stack(training=training), region=region).model_source == source


def test_model_source_and_resume_are_checked() -> None:
    path, message = only_problem(stack(training={"modelSource": "hf"}))
    assert path == "roll-cluster:training.modelSource"
    assert_words(message, '"huggingface"', '"modelscope"', '"hf-mirror"', '"hf"')
    assert only_problem(stack(training={"resume": "sometimes"}))[0] == "roll-cluster:training.resume"
    assert only_problem(stack(training={"hfEndpoint": "hf-mirror.com"}))[0] == "roll-cluster:training.hfEndpoint"
    reward = {"framework": "openrlhf", "openrlhf": {"rewardServer": {"command": "x {port}", "gpus": 0}}}
    assert only_problem(stack(training=reward))[0] == "roll-cluster:training.openrlhf.rewardServer.gpus"
