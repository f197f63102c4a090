"""Untrusted input (issue 19): every bad value refused before anything exists, and none reaches a shell, ssh, git or
pip as code or as an option. One group per class of the issue; the walker at the end renders every shipped stack
with hostile values in every free-text field (verified-facts#test-untrusted-input-untrusted-input lists the classes)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from offline_helpers import custom_resources, run
from pydantic import BaseModel
from script_harness import FakeNode
from test_config import as_pulumi, parse, stack
from test_node_identity_scripts import shm_env

from devtools import offline_cloud, plan
from devtools.mock_secrets import is_secret
from devtools.offline_cloud import OfflineCloud, stack_config
from infra import runmode
from infra.config import ClusterConfig, ConfigError, ContainerConfig, RollConfig, TrainingConfig, parse_cluster_config
from infra.frameworks import ClusterShape, adapter_for
from infra.node import ssh_access
from infra.sources.alibaba.placement import PlacementError
from infra.sources.base import SourceError
from infra.sources.hosts import probe

REPO = Path(__file__).resolve().parents[2]
REFUSALS = (ConfigError, PlacementError, SourceError)


def refused(stack_name: str, key: str, *, config: dict[str, Any] | None = None,
            replace: dict[str, Any] | None = None, secrets: dict[str, str] | None = None) -> str:
    """Run the program on the offline cloud: it must refuse, naming `key`, before any resource (no traceback)."""
    cloud = OfflineCloud()
    with pytest.raises(REFUSALS) as caught:
        run(stack_name, cloud=cloud, config=config or {}, replace_config=replace or {}, secrets=secrets or {})
    text = str(caught.value)
    assert key in text, text
    assert "Traceback" not in text
    assert custom_resources(cloud) == []
    return text


def hosts_with(**changes: Any) -> dict[str, Any]:
    """The shipped hosts stack's config, with `section.field` values replaced (None removes the field)."""
    values = copy.deepcopy(stack_config("hosts"))
    for dotted, value in changes.items():
        section, _, field = dotted.partition("__")
        target = values.setdefault(f"roll-cluster:{section}", {})
        if value is None:
            target.pop(field, None)
        else:
            target[field] = value
    return values


# ------------------------------------------------------------------------------ 1. one validation layer, strict
@pytest.mark.parametrize("stack_name,config,key", [
    ("dev", {"roll-cluster:nodes": {"count": True}}, "roll-cluster:nodes.count"),
    ("dev", {"roll-cluster:nodes": {"internetBandwidthMbps": True}}, "roll-cluster:nodes.internetBandwidthMbps"),
    ("dev", {"roll-cluster:nodes": {"spotPriceLimit": "Infinity"}}, "roll-cluster:nodes.spotPriceLimit"),
    ("dev", {"roll-cluster:nodes": {"placementGeneration": True}}, "roll-cluster:nodes.placementGeneration"),
    # glibc reads 0x0a.0.0.21 as 10.0.0.21: one machine in two spellings would be two Ray nodes
    ("hosts", {"roll-cluster:nodes": {"hosts": [{"address": "0x0a.0.0.21", "privateAddress": "10.0.0.11"},
                                                {"address": "10.0.0.21", "privateAddress": "10.0.0.12"}]}},
     "roll-cluster:nodes.hosts[0].address"),
    ("hosts", {"roll-cluster:nodes": {"hosts": [{"address": "GPU-A.Lab.example.net", "privateAddress": "10.0.0.11"},
                                                {"address": "gpu-a.lab.example.net", "privateAddress": "10.0.0.12"}]}},
     "roll-cluster:nodes.hosts[1].address"),
    ("hosts", {"roll-cluster:nodes": {"hosts": [{"address": "::ffff:10.0.0.21", "privateAddress": "10.0.0.11"},
                                                {"address": "10.0.0.22", "privateAddress": "10.0.0.12"}]}},
     "roll-cluster:nodes.hosts[0].address"),
])
def test_strict_layer_refuses_bools_non_finite_numbers_and_aliased_hosts(
    stack_name: str, config: dict[str, Any], key: str
) -> None:
    refused(stack_name, key, config=config)


@pytest.mark.parametrize("text,key", [
    ('{"overrides": {"max_steps": -Infinity}}', "roll-cluster:training.overrides.max_steps"),
    ('{"overrides": {"actor_train": {"lr": [1, NaN]}}}', "roll-cluster:training.overrides.actor_train.lr[1]"),
    ('{"openrlhf": {"vllmNumEngines": Infinity}}', "roll-cluster:training.openrlhf.vllmNumEngines"),
])
def test_non_finite_json_is_refused_at_its_key(text: str, key: str) -> None:
    raw = {**as_pulumi(stack()), "training": text}
    with pytest.raises(ConfigError, match=re.escape(key) + r": must be a finite number") as caught:
        parse_cluster_config(raw, "cn-hangzhou")
    assert "roll-cluster:training: " not in str(caught.value)


@pytest.mark.parametrize("value", ["nan", "-inf", "Infinity", ".nan"])
def test_text_a_framework_reads_as_non_finite_is_refused_at_its_key(value: str) -> None:
    # Hydra and argparse's float() read `nan` and `inf` as numbers: verl would train with lr NaN.
    refused("verl", "roll-cluster:training.overrides.actor_rollout_ref.actor.optim.lr",
            config={"roll-cluster:training": {"overrides": {"actor_rollout_ref.actor.optim.lr": value}}})


def test_cidrs_are_stored_canonical() -> None:
    config = parse(stack(access={"adminCidrs": ["198.51.100.0/0.0.0.255", "203.0.113.0/255.255.255.0"]}))
    assert config.access.admin_cidrs == ["198.51.100.0/24", "203.0.113.0/24"]


def _fields(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    for name, field in model.model_fields.items():
        here = (*path, field.alias or name)
        yield here, field
        for candidate in (field.annotation, *typing.get_args(field.annotation)):
            inner = typing.get_args(candidate)[0] if typing.get_origin(candidate) is list else candidate
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                yield from _fields(inner, here)


def test_every_pattern_matches_the_whole_value() -> None:
    # pydantic's `pattern=` is a search: an unanchored one accepts `-oProxyCommand=...` for `[a-z_]...`.
    patterns = [(path, m.pattern) for path, field in _fields(ClusterConfig) for m in field.metadata
                if getattr(m, "pattern", None)]
    assert patterns, "the walk found no pattern: it walks nothing"
    for path, pattern in patterns:
        assert pattern.startswith("^") and pattern.endswith("$"), (path, pattern)


# ------------------------------------------------------------------- 2. no value becomes code or an option
@pytest.mark.parametrize("stack_name,config,key", [
    *[("dev", {"roll-cluster:training": {"roll": {"ref": ref}}}, "roll-cluster:training.roll.ref")
      for ref in ("--upload-pack=touch /tmp/x", "v0.3.0';id;'", "refs/tags/a..b", "v1 v2", "x.lock", "-x")],
    ("verl", {"roll-cluster:training": {"verl": {"ref": "--filter=blob:none"}}}, "roll-cluster:training.verl.ref"),
    ("dev", {"roll-cluster:training": {"roll": {"repo": "ext::sh -c touch% /tmp/x"}}},
     "roll-cluster:training.roll.repo"),
    ("dev", {"roll-cluster:training": {"roll": {"repo": "--upload-pack=touch /tmp/x"}}},
     "roll-cluster:training.roll.repo"),
    ("dev", {"roll-cluster:training": {"roll": {"archiveUrl": "file:///etc/shadow"}}},
     "roll-cluster:training.roll.archiveUrl"),
    ("dev", {"roll-cluster:training": {"roll": {"requirementsFile": "../../etc/passwd"}}},
     "roll-cluster:training.roll.requirementsFile"),
    ("openrlhf", {"roll-cluster:training": {"openrlhf": {"package": "--index-url=https://evil.test/"}}},
     "roll-cluster:training.openrlhf.package"),
    ("openrlhf", {"roll-cluster:training": {"openrlhf": {"uninstallPackages": ["-r/etc/passwd"]}}},
     "roll-cluster:training.openrlhf.uninstallPackages"),
    ("openrlhf", {"roll-cluster:training": {"openrlhf": {"entrypointModule": "--help"}}},
     "roll-cluster:training.openrlhf.entrypointModule"),
    ("hosts", {"roll-cluster:nodes": {"hostDefaults": {"user": "-oProxyCommand=touch /tmp/x"}}},
     "roll-cluster:nodes.hostDefaults.user"),
    ("hosts", {"roll-cluster:nodes": {"hostDefaults": {"user": "ops;id"}}}, "roll-cluster:nodes.hostDefaults.user"),
    ("dev", {"roll-cluster:container": {"registryUsername": "-u x"}}, "roll-cluster:container.registryUsername"),
])
def test_values_that_would_be_code_or_an_option_are_refused(stack_name: str, config: dict[str, Any], key: str) -> None:
    refused(stack_name, key, config=config)


def test_roll_pre_submit_check_quotes_the_ref(tmp_path: Path) -> None:
    # The renderer itself quotes: a ref that bypassed validation still creates no file.
    training = TrainingConfig(roll=RollConfig().model_copy(update={"ref": "v1'$(touch pwned)'"}))
    shape = ClusterShape(stack="t", nodes=1, gpus_per_node=1, bf16=False, head_ip="10.0.0.1", shared_dir=None,
                         data_dir="/data", dashboard_port=8265, model_source="huggingface",
                         hf_endpoint="https://hf-mirror.com")
    adapter: Any = adapter_for(training, ContainerConfig())
    check = adapter.job(shape).pre_submit_check
    subprocess.run(["bash", "-c", check], cwd=tmp_path, capture_output=True, check=False)
    assert not (tmp_path / "pwned").exists()


def _script_lines() -> Iterator[tuple[str, str]]:
    for path in sorted((REPO / "infra" / "scripts").rglob("*.sh")):
        joined = re.sub(r"\\\n\s*", " ", path.read_text())
        for line in joined.splitlines():
            if not line.lstrip().startswith("#"):
                yield path.name, line


def test_git_ssh_and_pip_end_options_before_config_values() -> None:
    checked = 0
    for name, line in _script_lines():
        code = re.sub(r"'[^']*'", "''", line)  # a message in single quotes runs nothing
        if re.search(r'(^|[\s;&|(])git\s+(-C\s+\S+\s+)?(fetch|remote add|clone)\b.*"\$', code):
            assert "--end-of-options" in line, (name, line)
            checked += 1
        if 'ssh "${SSH_OPTIONS[@]}"' in line:
            assert ' -- "$SSH_USER@$HOST"' in line, (name, line)
            checked += 1
        if re.search(r"\bpip_install\b.*\"\$\{|\bmsrl_pip\b.*--no-deps|-m pip uninstall", line):
            assert " -- " in line, (name, line)
            checked += 1
    assert checked >= 7


def test_probe_and_output_commands_end_ssh_options_before_the_destination() -> None:
    target = probe.HostTarget(name="node-0", key="roll-cluster:nodes.hosts[0]", address="10.0.0.11", user="root",
                              port=22)
    access = probe.HostAccess(identity_file=None, known_hosts_file="/tmp/k")
    assert probe.ssh_argv(target, access, "yes")[-2:] == ["--", "root@10.0.0.11"]
    outputs = run("hosts").outputs
    for name in ("sshHead", "dashboardTunnel", "jobLogs"):
        assert " -- root@" in str(outputs[name]), outputs[name]


# ----------------------------------------------------------------------- 3. exposure computed, not matched
@pytest.mark.parametrize("access,key", [
    ({"adminCidrs": ["64.0.0.0/3", "160.0.0.0/3"]}, "roll-cluster:access.adminCidrs"),
    ({"adminCidrs": [f"{a}.0.0.0/8" for a in range(11, 20)]}, "roll-cluster:access.adminCidrs"),
    ({"adminCidrs": ["8.0.0.0/255.0.0.0"]}, "roll-cluster:access.adminCidrs"),  # netmask spelling of a /8
    ({"adminCidrs": ["8.0.0.0/9"], "allowWorld": True, "dashboard": "admin-cidrs"}, "roll-cluster:access.dashboard"),
    ({"adminCidrs": ["8.8.0.0/21"], "allowWorld": True, "dashboard": "admin-cidrs"}, "roll-cluster:access.dashboard"),
])
def test_exposure_is_measured_in_public_addresses(access: dict[str, Any], key: str) -> None:
    text = refused("dev", key, replace={"roll-cluster:access": {**stack_config("dev")["roll-cluster:access"],
                                                                 **access}})
    assert "public addresses" in text


def test_private_ranges_do_not_count_as_exposure() -> None:
    assert parse(stack(access={"adminCidrs": ["10.0.0.0/8", "172.16.0.0/12", "203.0.113.7/32"]}))


# ---------------------------------------------------------------------------- 4. credentials only as secrets
@pytest.mark.parametrize("stack_name,config,key,token", [
    ("dev", {"roll-cluster:training": {"roll": {"repo": "https://ci:glpat-aaaaaaaaaaaaaaaaaaaa@git.example.org/x.git"}}},
     "roll-cluster:training.roll.repo", "glpat-a"),
    ("dev", {"roll-cluster:training": {"roll": {"pipIndexUrl": "https://u:s3cret@pypi.example.org/simple/"}}},
     "roll-cluster:training.roll.pipIndexUrl", "s3cret"),
    ("dev", {"roll-cluster:training": {"framework": "custom",
                                       "custom": {"entrypoint": "HF_TOKEN=hf_" + "b" * 34 + " python3 t.py"}}},
     "roll-cluster:training.custom.entrypoint", "hf_b"),
    ("dev", {"roll-cluster:training": {"framework": "custom",
                                       "custom": {"entrypoint": "python3 t.py --wandb_key " + "d" * 40}}},
     "roll-cluster:training.custom.entrypoint", "dddd"),
    ("openrlhf", {"roll-cluster:training": {"overrides": {"logger.wandb.key": "c" * 40}}},
     "roll-cluster:training.overrides.logger.wandb.key", "cccc"),
    ("dev", {"alicloud:secretKey": "not-a-real-key-value"}, "alicloud:secretKey", "not-a-real"),
])
def test_credentials_in_plain_config_are_refused_naming_the_secret(
    stack_name: str, config: dict[str, Any], key: str, token: str
) -> None:
    text = refused(stack_name, key, config=config)
    assert token not in text  # the value is never echoed
    assert "secret" in text or "mirror" in text


# ------------------------------------------------------------------------------ 5. your own hosts undamaged
@pytest.mark.parametrize("path", ["/", "/etc/ssh", "/var/lib/docker/volumes", "/run/containerd", "/boot", "/opt",
                                  "/home", "/root/.ssh", "/var/run/docker.sock"])
def test_system_directories_are_never_bind_mounted(path: str) -> None:
    refused("hosts", "roll-cluster:storage.sharedHostPath",
            replace={"roll-cluster:storage": {"sharedHostPath": path}})


@pytest.mark.parametrize("replace,key", [
    ({"container__shmSize": "200m"}, "roll-cluster:container.shmSize"),
    ({"nodes__hosts": [{"address": "198.18.0.11", "privateAddress": "127.0.1.1"},
                       {"address": "198.18.0.12", "privateAddress": "127.0.1.2"}]},
     "roll-cluster:nodes.hosts[0].privateAddress"),
    ({"nodes__hosts": [{"address": "198.18.0.11", "privateAddress": "169.254.0.11"},
                       {"address": "198.18.0.12", "privateAddress": "169.254.0.12"}]},
     "roll-cluster:nodes.hosts[1].privateAddress"),
    ({"nodes__hostDefaults": {"networkInterface": "lo"}}, "roll-cluster:nodes.hostDefaults.networkInterface"),
    ({"nodes__hostDefaults": {"port": 2200}, "ray__gcsPort": 2200}, "roll-cluster:ray.gcsPort"),
    ({"ray__dashboardPort": 52365}, "roll-cluster:ray.dashboardPort"),
])
def test_own_hosts_are_not_damaged(replace: dict[str, Any], key: str) -> None:
    values = hosts_with(**replace)
    refused("hosts", key, replace={k: v for k, v in values.items() if k.startswith("roll-cluster:")})


def test_a_reward_server_on_a_ray_port_is_refused() -> None:
    gcs = stack_config("openrlhf").get("roll-cluster:ray", {}).get("gcsPort", 6379)
    refused("openrlhf", "roll-cluster:training.openrlhf.rewardServer.port",
            config={"roll-cluster:training": {"openrlhf": {"rewardServer": {
                "command": "python3 -m openrlhf.cli.serve_rm --port {port}", "port": gcs}}}})


# ------------------------------------------------------------------------- 6. checked before paying
@pytest.mark.parametrize("stack_name,config,key", [
    ("dev", {"roll-cluster:container": {"shmSize": "512g"}}, "roll-cluster:container.shmSize"),
    ("dev", {"roll-cluster:training": {"framework": "mindspeed-rl", "mindspeedRl": {
        "tokenizerPath": "/m/t", "dataPath": "/m/d", "loadPath": "/m/l"}}}, "roll-cluster:training.framework"),
    ("dev", {"roll-cluster:nodes": {"gpuDriver": "preinstalled"}}, "roll-cluster:nodes.gpuDriver"),
    ("dev", {"roll-cluster:nodes": {"driverVersion": "470.82.01"}}, "roll-cluster:nodes.driverVersion"),
    ("openrlhf", {"roll-cluster:training": {"openrlhf": {"rewardServer": {"command": "serve_rm --port 5000"}}}},
     "roll-cluster:training.openrlhf.rewardServer.command"),
    ("dev", {"roll-cluster:training": {"overrides": {"actor_train": {"device_mapping": "[0, 0]"}}}},
     "roll-cluster:training.overrides.actor_train.device_mapping"),
    ("verl", {"roll-cluster:training": {"verl": {"dataDir": "/mnt/shared/x/../../data"}}},
     "roll-cluster:training.verl.dataDir"),
    ("dev", {"roll-cluster:training": {"framework": "custom", "custom": {"entrypoint": "  "}}},
     "roll-cluster:training.custom.entrypoint"),
    ("dev", {"roll-cluster:training": {"framework": "custom", "custom": {"entrypoint": "python3 t.py",
                                                                          "workingDir": "work"}}},
     "roll-cluster:training.custom.workingDir"),
    ("hosts", {"roll-cluster:nodes": {"bake": True}}, "roll-cluster:nodes.bake"),
    ("dev", {"roll-cluster:container": {"image": "registry.cn-hangzou.aliyuncs.com/me/roll:v1"}},
     "roll-cluster:container.image"),
    ("hosts", {"roll-cluster:nodes": {"placementGeneration": 1}}, "roll-cluster:nodes.placementGeneration"),
])
def test_what_fails_on_the_node_is_refused_before_paying(stack_name: str, config: dict[str, Any], key: str) -> None:
    refused(stack_name, key, config=config)


# ----------------------------------------------------------------------- 7. the costly first-time mistakes
def _keygen(tmp_path: Path, name: str) -> Path:
    key = tmp_path / name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key), "-C", name], check=True)
    return key


def test_preview_refuses_the_placeholder_key_and_documentation_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = _keygen(tmp_path, "k")
    monkeypatch.setattr(runmode, "offline", lambda: False)
    text = refused("dev", "roll-cluster:access.sshPublicKey",
                   config={"roll-cluster:access": {"sshPrivateKeyPath": str(key)}})
    assert "roll-cluster:access.adminCidrs[0]" in text
    assert "pulumi config set --path 'roll-cluster:access.sshPublicKey'" in text
    assert "pulumi config set --path 'roll-cluster:access.adminCidrs[0]'" in text


def test_the_offline_plan_of_dev_warns_and_still_works(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main(["--full", "dev"]) == 0
    out = capsys.readouterr().out
    assert "WARNING roll-cluster:access.sshPublicKey" in out and "placeholder" in out
    assert "WARNING roll-cluster:access.adminCidrs[0]: 203.0.113.0/24" in out


def test_a_real_preview_refuses_the_ascend_stacks_placeholder_image_and_the_plan_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The shipped ascend stack names an image you build (no public image has MindSpeed-RL's runtime): until you
    # push yours, a real preview stops on it, naming container.image, instead of failing at the pull on every host.
    assert plan.main(["--full", "ascend"]) == 0
    out = capsys.readouterr().out
    assert "WARNING roll-cluster:container.image: registry.example.com/me/mindspeed-rl-runtime" in out

    key = _keygen(tmp_path, "k")
    monkeypatch.setattr(runmode, "offline", lambda: False)
    text = refused("ascend", "roll-cluster:container.image",
                   config={"roll-cluster:access": {"sshPrivateKeyPath": str(key)}})
    assert "registry.example.com, a documentation domain" in text
    assert "pulumi config set --path 'roll-cluster:container.image'" in text


def test_the_public_key_must_belong_to_the_private_key(tmp_path: Path) -> None:
    a, b = _keygen(tmp_path, "a"), _keygen(tmp_path, "b")
    with pytest.raises(ConfigError, match=r"access\.sshPublicKey.*SHA256:"):
        ssh_access.login_key(str(a), Path(f"{b}.pub").read_text(), tmp_path / "x.pub", agent_keys=lambda: None)
    with pytest.raises(ConfigError, match=r"access\.sshPrivateKeyPath.*public key"):
        ssh_access.login_key(f"{a}.pub", None, tmp_path / "x.pub", agent_keys=lambda: None)


def test_an_unknown_instance_type_is_not_no_stock() -> None:
    text = refused("dev", "roll-cluster:nodes.instanceTypes",
                   replace={"roll-cluster:nodes": {**stack_config("dev")["roll-cluster:nodes"],
                                                   "instanceTypes": ["ecs.gn6v-c8g1.3xlarge"]}})
    assert "unknown instance type" in text and "did you mean ecs.gn6v-c8g1." in text and "no stock" not in text


def test_a_yaml_error_names_the_stack_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "Pulumi.bad.yaml").write_text("config:\n  roll-cluster:nodes: {count: 1\n")
    monkeypatch.setattr(offline_cloud, "PROJECT_DIR", tmp_path)
    assert plan.main(["--full", "bad"]) == 1
    err = capsys.readouterr().err
    assert "Pulumi.bad.yaml:3:" in err and "not valid YAML" in err and "Traceback" not in err


def test_the_plan_names_a_family_sold_on_request(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main(["--full", "large"]) == 0
    assert "sells only on request: contact Alibaba Cloud sales" in capsys.readouterr().out


def test_own_hosts_shm_is_never_shrunk(tmp_path: Path) -> None:
    # A host of yours whose /dev/shm is larger than container.shmSize keeps it (with a warning): other programs on
    # the host may rely on it. ECS nodes, which the program owns, are still sized exactly.
    node = FakeNode(tmp_path)
    shm = str(node.root / "dev-shm")
    node.set_state("tmpfs-sizes", f"{shm}\t{32 * 1024 * 1024}\n")  # 32 GiB today
    env = shm_env(node, "16g")
    kept = node.run_step("prepare-host", ["prepare_host.sh"], SHM_NEVER_SHRINK="1", **env)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert [c for c in node.calls("mount") if "remount" in c] == []
    assert "WARNING" in kept.stdout and "kept as it is" in kept.stdout
    sized = node.run_step("prepare-host", ["prepare_host.sh"], SHM_NEVER_SHRINK="0", **env)
    assert sized.returncode == 0
    assert [c for c in node.calls("mount") if "remount" in c] == [f"-o remount,size=16g {shm}"]


def test_a_section_set_as_secret_stays_secret_in_every_command() -> None:
    # `pulumi config set --secret --path 'roll-cluster:training.overrides...'` makes the whole section a secret.
    training = stack_config("verl")["roll-cluster:training"]
    cloud = OfflineCloud()
    run("verl", cloud=cloud, secrets={"roll-cluster:training": json.dumps(training)})
    commands = [r for r in cloud.resources if r.type == "command:remote:Command"]
    # The step's text (its exports and scripts) travels on stdin (components/remote_steps.py): that is what holds
    # values derived from the section.
    assert commands and all(is_secret(r.inputs["stdin"]) for r in commands)
    plain = run("verl", cloud=OfflineCloud())
    assert not any(is_secret(r.inputs["create"]) for r in plain.cloud.resources if r.type == "command:remote:Command")


# =============================================================================================== round four (issue 28)
def _plain_leaves(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string of a resource's inputs that Pulumi would store in plain (secret-wrapped values left out)."""
    if is_secret(value):
        return
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _plain_leaves(child, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, child in enumerate(value):
            yield from _plain_leaves(child, f"{path}[{index}]")
    elif isinstance(value, str):
        yield path, value


# ---------------------------------------------------------------------------------- 8. secret sections stay secret
@pytest.mark.parametrize("stack_name,section", [
    ("hosts", "nodes"), ("dev", "access"), ("dev", "container"), ("dev", "storage"), ("dev", "ray"),
    ("multi", "storage"),
])
def test_a_section_that_cannot_stay_secret_is_refused_as_a_secret(stack_name: str, section: str) -> None:
    # `pulumi config set --secret --path 'roll-cluster:nodes.hosts[0].address' ...` makes all of `nodes` a secret;
    # its addresses would reach the docker provider's host and the outputs in plain. Refused, naming the key and
    # how to set it in plain.
    value = stack_config(stack_name).get(f"roll-cluster:{section}", {"nas": True} if section == "storage" else {})
    if section == "container":
        value = {"image": "registry.cn-hangzhou.aliyuncs.com/me/roll:v1"}
    text = refused(stack_name, f"roll-cluster:{section}: must not be a secret",
                   secrets={f"roll-cluster:{section}": json.dumps(value)})
    assert f"pulumi config rm roll-cluster:{section}" in text
    assert "roll-cluster:wandbApiKey" in text


@pytest.mark.parametrize("stack_name,changes,needle", [
    ("verl", {"overrides": {"trainer.project_name": "zqx-secret-project"},
              "verl": {"dataDir": "/mnt/shared/zqx-secret-data"}}, "zqx"),
    # ROLL's rendered YAML is the job step's trigger, and the job id names the framework.
    ("dev", {"roll": {"baseConfig": "agentic_demo/agent_val_frozen_lake_single_node_demo.yaml"}},
     "agent_val_frozen_lake_single_node_demo"),
    ("ascend", {"mindspeedRl": {"exampleConfig": "grpo_qwen25_7b_A3", "tokenizerPath": "/mnt/shared/zqx/tok",
                                "dataPath": "/mnt/shared/zqx/data", "loadPath": "/mnt/shared/zqx/load"}}, "zqx"),
])
def test_a_secret_training_section_leaves_no_plain_trace(stack_name: str, changes: dict[str, Any], needle: str) -> None:
    # The training section may be secret as a whole: every input and output derived from it is then a secret.
    training = copy.deepcopy(stack_config(stack_name)["roll-cluster:training"])
    for key, value in changes.items():
        training[key] = {**training.get(key, {}), **value}
    cloud = OfflineCloud()
    result = run(stack_name, cloud=cloud, secrets={"roll-cluster:training": json.dumps(training)})
    leaks = [f"{r.name}{path}" for r in cloud.resources for path, text in _plain_leaves(r.inputs) if needle in text]
    assert leaks == []
    shown = [name for name, value in result.outputs.items()
             if needle in json.dumps(value, default=str) and name not in result.secret_outputs]
    assert shown == []
    assert {"jobConfig", "jobId"} <= result.secret_outputs
    # The same values in plain config are plain (the checks above can fail).
    plain = run(stack_name, replace_config={"roll-cluster:training": training})
    assert "jobConfig" not in plain.secret_outputs
    assert any(needle in text for r in plain.cloud.resources for _, text in _plain_leaves(r.inputs))


# --------------------------------------------------------------- 9. no value becomes an option of a framework's command
VERL_NODES = {"roll-cluster:nodes": {"count": 2, "instanceTypes": ["ecs.gn7i-8x.32xlarge"]}}


@pytest.mark.parametrize("stack_name,overrides,key", [
    ("verl", {"--config-dir": "/tmp/x"}, "roll-cluster:training.overrides.--config-dir"),
    ("verl", {"trainer": {"-cd": "/tmp/x"}}, "roll-cluster:training.overrides.trainer.-cd"),
    ("verl", {"trainer.default_local_dir": "--config-dir=/tmp/x"},
     "roll-cluster:training.overrides.trainer.default_local_dir"),
    ("verl", {"hydra.searchpath": "[file:///tmp/x]"}, "roll-cluster:training.overrides.hydra.searchpath"),
    ("verl", {"trainer.logger": ["console", "-x"]}, "roll-cluster:training.overrides.trainer.logger"),
    ("openrlhf", {"ckpt.path": "--pretrain=/tmp/x"}, "roll-cluster:training.overrides.ckpt.path"),
    ("openrlhf", {"--pretrain": "/tmp/x"}, "roll-cluster:training.overrides.--pretrain"),
    ("openrlhf", {"data.prompt_dataset": "-x"}, "roll-cluster:training.overrides.data.prompt_dataset"),
])
def test_override_keys_and_values_that_would_be_options_are_refused(
    stack_name: str, overrides: dict[str, Any], key: str
) -> None:
    text = refused(stack_name, key, config={"roll-cluster:training": {"overrides": overrides}})
    assert "`-`" in text or "Hydra" in text


@pytest.mark.parametrize("stack_name,overrides,key,words", [
    ("verl", {"trainer.nnodes": 4}, "roll-cluster:training.overrides.trainer.nnodes", "2 nodes x 8 GPUs"),
    ("verl", {"trainer": {"n_gpus_per_node": 16}}, "roll-cluster:training.overrides.trainer.n_gpus_per_node",
     "(8)"),
    ("openrlhf", {"actor.num_gpus_per_node": 16}, "roll-cluster:training.overrides.actor.num_gpus_per_node",
     "between 1 and 8"),
    ("openrlhf", {"ref.num_nodes": 3}, "roll-cluster:training.overrides.ref.num_nodes", "between 1 and 2"),
    ("multi", {"num_gpus_per_node": 16}, "roll-cluster:training.overrides.num_gpus_per_node", "x 2 GPUs (2)"),
])
def test_overrides_contradicting_the_cluster_are_refused(
    stack_name: str, overrides: dict[str, Any], key: str, words: str
) -> None:
    nodes = {"roll-cluster:nodes": {**stack_config(stack_name)["roll-cluster:nodes"], "count": 2}}
    text = refused(stack_name, key, config={**nodes, "roll-cluster:training": {"overrides": overrides}})
    assert words in text


def test_negative_numbers_and_the_clusters_own_values_are_still_accepted() -> None:
    # A negative number is a value, not an option (OpenRLHF's `--ckpt.save_steps -1`); the cluster's own value
    # may be repeated.
    run("openrlhf", config={"roll-cluster:training": {"overrides": {"ckpt.max_num": -1}}})
    run("verl", config={"roll-cluster:training": {"overrides": {"trainer.nnodes": 2, "trainer.n_gpus_per_node": 8}}})


# ------------------------------------------------------------------------------------------------------- 10. URLs
@pytest.mark.parametrize("stack_name,config,key", [
    ("verl", {"roll-cluster:training": {"verl": {"mirrorRepo": "http://gitee.com/mirrors/verl.git"}}},
     "roll-cluster:training.verl.mirrorRepo"),
    ("dev", {"roll-cluster:training": {"roll": {"repo": "git://github.com/alibaba/ROLL.git"}}},
     "roll-cluster:training.roll.repo"),
    ("dev", {"roll-cluster:training": {"roll": {"repo": "ssh://-oProxyCommand=touch%20x/ROLL.git"}}},
     "roll-cluster:training.roll.repo"),
    ("dev", {"roll-cluster:training": {"roll": {"repo": "git@-oProxyCommand=x:ROLL.git"}}},
     "roll-cluster:training.roll.repo"),
    ("dev", {"roll-cluster:training": {"roll": {"repo": "ssh://git@github.com:-oProxyCommand=x/ROLL.git"}}},
     "roll-cluster:training.roll.repo"),
    ("dev", {"roll-cluster:training": {"roll": {"archiveUrl": "http://mirror.example.org/roll.tar.gz"}}},
     "roll-cluster:training.roll.archiveUrl"),
    ("dev", {"roll-cluster:training": {"hfEndpoint": "http://hf-mirror.com"}}, "roll-cluster:training.hfEndpoint"),
])
def test_urls_are_https_or_ssh_to_a_real_host(stack_name: str, config: dict[str, Any], key: str) -> None:
    refused(stack_name, key, config=config)


@pytest.mark.parametrize("url,key", [
    ("https://oss.example.org/roll.tar.gz?OSSAccessKeyId=x&Expires=1&Signature=abc", "archiveUrl"),
    ("https://h.example.org/roll.tar.gz?token=abc123", "archiveUrl"),
    ("https://mirrors.example.org/pypi/simple/?api_key=abc", "pipIndexUrl"),
    ("https://gitlab.example.org/x/ROLL.git#glpat-aaaaaaaaaaaaaaaaaaaa", "repo"),
])
def test_tokens_in_a_urls_query_are_refused_and_not_echoed(url: str, key: str) -> None:
    text = refused("dev", f"roll-cluster:training.roll.{key}",
                   config={"roll-cluster:training": {"roll": {key: url}}})
    assert "abc" not in text and "glpat" not in text


# ----------------------------------------------------------------------------------- 11. credentials in plain fields
KEY40 = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize("stack_name,config,key,secret", [
    ("dev", {"roll-cluster:container": {"registryUsername": "dckr_pat_" + "A" * 27}},
     "roll-cluster:container.registryUsername", "registryPassword"),
    ("dev", {"roll-cluster:container": {"registryUsername": "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6"}},
     "roll-cluster:container.registryUsername", "registryPassword"),
    ("dev", {"roll-cluster:training": {"framework": "custom", "custom": {
        "entrypoint": f"wandb login {KEY40} && python3 train.py"}}},
     "roll-cluster:training.custom.entrypoint", "wandbApiKey"),
    ("verl", {"roll-cluster:training": {"verl": {"dataPreparation": "mysqldump -u etl -pHunter2pass db > d.sql"}}},
     "roll-cluster:training.verl.dataPreparation", "secret"),
    ("verl", {"roll-cluster:training": {"verl": {
        "dataPreparation": "curl -u etl:Hunter2pass -o /tmp/d https://data.example.org/d"}}},
     "roll-cluster:training.verl.dataPreparation", "secret"),
    ("verl", {"roll-cluster:training": {"verl": {
        "dataPreparation": "wget https://etl:Hunter2pass@data.example.org/d.tar"}}},
     "roll-cluster:training.verl.dataPreparation", "secret"),
    ("dev", {"roll-cluster:training": {"framework": "custom", "custom": {
        "entrypoint": "curl -H 'Authorization: Bearer Hunter2passHunter2pass' https://x.example.org && python3 t.py"}}},
     "roll-cluster:training.custom.entrypoint", "secret"),
    ("openrlhf", {"roll-cluster:training": {"overrides": {"use_wandb": KEY40}}},
     "roll-cluster:training.overrides.use_wandb", "wandbApiKey"),
])
def test_credentials_in_plain_fields_are_refused_naming_the_secret_setting(
    stack_name: str, config: dict[str, Any], key: str, secret: str
) -> None:
    text = refused(stack_name, key, config=config)
    assert secret in text
    assert "Hunter2" not in text and KEY40 not in text and "dckr_pat" not in text


def test_variables_in_commands_are_not_credentials() -> None:
    # The secret's own variable is the way to use it.
    run("dev", config={"roll-cluster:training": {"framework": "custom", "custom": {
        "entrypoint": 'wandb login "$WANDB_API_KEY" && python3 train.py --hf_token "$HF_TOKEN"'}}})


# ------------------------------------------------------------------------------------------ 12. characters and sizes
@pytest.mark.parametrize("stack_name,config,key", [
    ("dev", {"roll-cluster:training": {"framework": "custom", "custom": {"entrypoint": "python3 t.py\x00; id"}}},
     "roll-cluster:training.custom.entrypoint"),
    ("verl", {"roll-cluster:training": {"verl": {"dataPreparation": "python3 prep.py # \u202e;id\u2066"}}},
     "roll-cluster:training.verl.dataPreparation"),
    ("openrlhf", {"roll-cluster:training": {"openrlhf": {"rewardServer": {
        "command": "python3 -m openrlhf.cli.serve_rm --port {port}\u200b"}}}},
     "roll-cluster:training.openrlhf.rewardServer.command"),
    ("hosts", {"roll-cluster:nodes": {"acceleratorModel": "NVIDIA A10\x1b[2J"}}, "roll-cluster:nodes.acceleratorModel"),
    ("dev", {"roll-cluster:training": {"overrides": {"actor_train\u202e": 1}}},
     "roll-cluster:training.overrides.actor_train"),
    ("dev", {"roll-cluster:training": {"roll": {"checkout": "/tmp/roll\nid"}}}, "roll-cluster:training.roll.checkout"),
])
def test_control_and_invisible_characters_are_refused_in_any_text(
    stack_name: str, config: dict[str, Any], key: str
) -> None:
    text = refused(stack_name, key, config=config)
    assert "invisible" in text and "U+" in text


def test_a_command_larger_than_one_environment_string_is_refused_before_paying() -> None:
    entrypoint = "python3 train.py " + "--x " * 40_000  # 160 KB: execve would fail on the head with E2BIG
    text = refused("dev", "roll-cluster:training.custom.entrypoint",
                   config={"roll-cluster:training": {"framework": "custom", "custom": {"entrypoint": entrypoint}}})
    assert "128 KiB" in text
    # Many overrides, each small, make one verl command line too large for the job's environment string.
    many = {f"+extra.k{i}": "v" * 60 for i in range(2000)}
    text = refused("verl", "roll-cluster:training", config={"roll-cluster:training": {"overrides": many}})
    assert "128 KiB" in text


@pytest.mark.parametrize("field,value", [
    ("driverVersion", "\uff15\uff15\uff10.127.08"), ("cudaVersion", "\uff11\uff12.4.1"),
    ("cudnnVersion", "9.\uff12.0.82"),
])
def test_full_width_digits_are_not_digits(field: str, value: str) -> None:
    refused("dev", f"roll-cluster:nodes.{field}", config={"roll-cluster:nodes": {field: value}})


# ----------------------------------------------------------------------------------------------- 13. paths and hosts
@pytest.mark.parametrize("path", ["/proc/self/environ", "/dev/stdin", "/sys/kernel/notes", "/proc/../proc/1/environ"])
def test_a_private_key_path_in_the_kernels_trees_is_refused(path: str) -> None:
    refused("dev", "roll-cluster:access.sshPrivateKeyPath", config={"roll-cluster:access": {"sshPrivateKeyPath": path}})


@pytest.mark.parametrize("path", ["/var/spool/cron", "/opt/containerd", "/home/alice/.ssh", "/mnt/.docker/x",
                                  "/usr/local/share", "/tmp/shared", "/mnt"])
def test_host_shared_paths_follow_an_allow_rule(path: str) -> None:
    text = refused("hosts", "roll-cluster:storage.sharedHostPath",
                   replace={"roll-cluster:storage": {"sharedHostPath": path}})
    assert "/mnt/nfs/shared" in text


@pytest.mark.parametrize("path", ["/mnt/nfs/shared", "/home/data", "/srv/shared", "/data/roll"])
def test_host_shared_paths_in_the_allowed_places_are_accepted(path: str) -> None:
    assert parse({**{k.split(":")[1]: v for k, v in stack_config("hosts").items()},
                  "storage": {"sharedHostPath": path}}, region=None).storage.shared_host_path == path


@pytest.mark.parametrize("replace,key", [
    ({"nodes__hosts": [{"address": "0.0.0.0", "privateAddress": "10.0.0.11"},
                       {"address": "198.18.0.12", "privateAddress": "10.0.0.12"}]},
     "roll-cluster:nodes.hosts[0].address"),
    ({"nodes__hosts": [{"address": "198.18.0.11", "privateAddress": "10.0.0.11"},
                       {"address": "224.0.0.251", "privateAddress": "10.0.0.12"}]},
     "roll-cluster:nodes.hosts[1].address"),
    ({"nodes__hosts": [{"address": "255.255.255.255", "privateAddress": "10.0.0.11"},
                       {"address": "198.18.0.12", "privateAddress": "10.0.0.12"}]},
     "roll-cluster:nodes.hosts[0].address"),
    ({"nodes__hosts": [{"address": "198.18.0.11", "privateAddress": "10.0.0.255"},
                       {"address": "198.18.0.12", "privateAddress": "10.0.0.12"}]},
     "roll-cluster:nodes.hosts[0].privateAddress"),
    ({"storage__nfsServer": "127.0.0.1"}, "roll-cluster:storage.nfsServer"),
    ({"storage__nfsServer": "localhost"}, "roll-cluster:storage.nfsServer"),
    ({"storage__nfsServer": "0.0.0.0"}, "roll-cluster:storage.nfsServer"),
    ({"nodes__hostDefaults": {"networkInterface": "docker0"}}, "roll-cluster:nodes.hostDefaults.networkInterface"),
    ({"nodes__hostDefaults": {"networkInterface": "br-3f2a9c1d0e4b"}},
     "roll-cluster:nodes.hostDefaults.networkInterface"),
    ({"nodes__acceleratorModel": "Ascend 910B3"}, "roll-cluster:nodes.acceleratorModel"),
    ({"nodes__acceleratorModel": "Atlas 800T A2"}, "roll-cluster:nodes.acceleratorModel"),
    ({"nodes__hostDefaults": {"networkInterface": "lo0"}}, "roll-cluster:nodes.hostDefaults.networkInterface"),
])
def test_hosts_and_interfaces_that_cannot_work_are_refused(replace: dict[str, Any], key: str) -> None:
    values = hosts_with(**replace)
    refused("hosts", key, replace={k: v for k, v in values.items() if k.startswith("roll-cluster:")})


def test_an_nvidia_model_on_ascend_hosts_is_refused() -> None:
    refused("ascend", "roll-cluster:nodes.acceleratorModel",
            config={"roll-cluster:nodes": {"acceleratorModel": "NVIDIA A100"}})


# ----------------------------------------------------------------------------------------------- 14. contradictions
@pytest.mark.parametrize("stack_name,config,key", [
    ("multi", {"roll-cluster:nodes": {"spotHead": True}}, "roll-cluster:nodes.spotHead"),
    ("dev", {"roll-cluster:training": {"openrlhf": {"rewardServer": {"command": "serve --port {port}"}}}},
     "roll-cluster:training.openrlhf.rewardServer"),
    ("multi", {"roll-cluster:storage": {"existingFileSystemId": "31a8e4b0c2", "retainOnDestroy": False}},
     "roll-cluster:storage.retainOnDestroy"),
    ("hosts", {"roll-cluster:storage": {"existingFileSystemId": "31a8e4b0c2"}},
     "roll-cluster:storage.existingFileSystemId"),
    ("dev", {"roll-cluster:nodes": {"osImage": ".*"}}, "roll-cluster:nodes.osImage"),
    ("dev", {"roll-cluster:nodes": {"osImage": "x64"}}, "roll-cluster:nodes.osImage"),
    ("dev", {"roll-cluster:nodes": {"osImage": "^centos_7"}}, "roll-cluster:nodes.osImage"),
])
def test_contradictions_are_refused_not_ignored(stack_name: str, config: dict[str, Any], key: str) -> None:
    refused(stack_name, key, config=config)


def test_paused_on_a_stack_with_no_cluster_yet_is_refused() -> None:
    # The first `up` finds no network of the stack (first-time detection: no vSwitch of this stack and
    # generation), so there is nothing to pause; an existing cluster is paused as before (test_pause_and_cost.py).
    text = refused("multi", "roll-cluster:nodes.paused", config={"roll-cluster:nodes": {"paused": True}})
    assert "has none yet" in text
    first = run("multi")
    paused = run("multi", cloud=first.cloud.next_run(), config={"roll-cluster:nodes": {"paused": True}})
    assert paused.cloud.of_type("alicloud:ecs/instance:Instance")


# ------------------------------------------------------------------- 15. the rest of the earlier hidden set, by key
@pytest.mark.parametrize("stack_name,config,key", [
    ("hosts", {"roll-cluster:nodes": {"acceleratorModel": "Tesla V100-SXM2-32GB", "bf16": True}},
     "roll-cluster:nodes.bf16"),
    ("dev", {"roll-cluster:training": {"overrides": {"rollout_batch_size": -8}}},
     "roll-cluster:training.overrides.rollout_batch_size"),
    ("verl", {"roll-cluster:training": {"overrides": {"data.train_batch_size": 0}}},
     "roll-cluster:training.overrides.data.train_batch_size"),
    ("openrlhf", {"roll-cluster:training": {"overrides": {"rollout.n_samples_per_prompt": 2.5}}},
     "roll-cluster:training.overrides.rollout.n_samples_per_prompt"),
    ("hosts", {"roll-cluster:nodes": {"accelerator": "ascend", "acceleratorModel": "Ascend 910B"},
               "roll-cluster:training": {"framework": "custom", "custom": {"entrypoint": "python3 t.py"}}},
     "roll-cluster:container.image"),
])
def test_what_the_earlier_hidden_set_still_passed_is_refused(
    stack_name: str, config: dict[str, Any], key: str
) -> None:
    refused(stack_name, key, config=config)


# --------------------------------------------------------------------------- 16. the false refusal, outside offline
@pytest.mark.parametrize("access", [
    {"adminCidrs": ["0.0.0.0/0"], "allowWorld": True},
    {"adminCidrs": ["198.51.0.0/16"]},  # an ISP's range that holds the documentation range 198.51.100.0/24
])
def test_a_real_preview_accepts_ranges_that_merely_contain_a_documentation_range(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, access: dict[str, Any]
) -> None:
    key = _keygen(tmp_path, "k")
    monkeypatch.setattr(runmode, "offline", lambda: False)
    settings = {"sshPrivateKeyPath": str(key), "sshPublicKey": Path(f"{key}.pub").read_text().strip(), **access}
    config = {"roll-cluster:access": {**stack_config("dev")["roll-cluster:access"], **settings}}
    result = run("dev", replace_config=config)  # a real preview's checks, with no refusal
    rules = [r.inputs.get("cidrIp") for r in result.cloud.of_type("alicloud:ecs/securityGroupRule:SecurityGroupRule")]
    assert access["adminCidrs"][0] in rules
    # A range wholly inside a documentation range is still nobody's address.
    text = refused("dev", "roll-cluster:access.adminCidrs[0]", replace={"roll-cluster:access": {
        **config["roll-cluster:access"], "adminCidrs": ["198.51.100.16/28"], "allowWorld": False}})
    assert "documentation range" in text


def test_the_offline_plan_names_the_secrets_it_cannot_decrypt() -> None:
    # A stack file holds `secure:` values (`pulumi config set --secret`, with --path inside a section). Offline they
    # cannot be decrypted: the keys stay secret, a placeholder stands in, and each is named as not checked.
    result = run("verl", config={
        "roll-cluster:wandbApiKey": {"secure": "v1:AAAA"},
        "roll-cluster:training": {"overrides": {"trainer.project_name": {"secure": "v1:BBBB"}}},
    })
    warnings = result.notes["config_warnings"]
    assert any(w.startswith("roll-cluster:wandbApiKey: a secret the offline plan cannot decrypt") for w in warnings)
    assert any(w.startswith("roll-cluster:training.overrides.trainer.project_name: a secret") for w in warnings)
    assert "jobConfig" in result.secret_outputs  # the section is a secret, as Pulumi reports it
    assert not any("v1:" in text for r in result.cloud.resources for _, text in _plain_leaves(r.inputs))


@pytest.mark.parametrize("entrypoint", [
    "python3 -m openrlhf.cli.train_ppo_ray --input_key context_messages --max_new_tokens 512 --pad_token '<pad>'",
    "TOKENIZERS_PARALLELISM=false python3 train.py --tokenizer_path /mnt/shared/tok",
])
def test_model_and_data_settings_named_like_credentials_are_not_refused(entrypoint: str) -> None:
    # Judged by the name's last words: `input_key`, `max_new_tokens`, `pad_token` and TOKENIZERS_* hold no secret.
    run("dev", config={"roll-cluster:training": {"framework": "custom", "custom": {"entrypoint": entrypoint}}})


@pytest.mark.parametrize("config,key", [
    ({"roll-cluster:training": {"roll": {"baseConfig": "hf_" + "a" * 34 + "/x.yaml"}}},
     "roll-cluster:training.roll.baseConfig"),
    ({"roll-cluster:nodes": {"osImage": "^aliyun_3_x64_20G_alibase_.*|ghp_" + "a" * 36}}, "roll-cluster:nodes.osImage"),
    ({"roll-cluster:training": {"overrides": {"glpat-" + "b" * 20: 1}}}, "roll-cluster:training.overrides"),
])
def test_a_known_token_shape_is_refused_in_any_field(config: dict[str, Any], key: str) -> None:
    text = refused("dev", key, config=config)
    assert "aaaa" not in text and "bbbb" not in text and "secret" in text
