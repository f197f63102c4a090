"""The offline plan (`python3 dev.py plan <stack>`) for every shipped stack: what a user reads before `pulumi up`."""

from __future__ import annotations

import base64
import textwrap
from pathlib import Path

import pytest
import yaml
from offline_helpers import run

from devtools import plan
from devtools.offline_cloud import reveal, shipped_stacks
from infra.sources.alibaba.user_data import decode_user_data

STACKS = ["ascend", "dev", "hosts", "large", "multi", "openrlhf", "verl"]
CLOUD_STACKS = ["dev", "large", "multi", "openrlhf", "verl"]
HOST_STACKS = ["ascend", "hosts"]


def test_the_contract_stacks_and_the_host_stacks_are_shipped():
    assert shipped_stacks() == STACKS


@pytest.mark.parametrize("stack", CLOUD_STACKS)
def test_plan_shows_placement_network_nodes_steps_job_outputs_and_price(stack, capsys):
    assert plan.main(["--full", stack]) == 0
    text = capsys.readouterr().out
    for heading in ("Placement", "Network", "Nodes", "Steps per node", "Training job", "Stack outputs", "Resources"):
        assert f"== {heading} " in text, heading
    assert "per hour" in text and "tcp  22/22" in text and "from members of this security group" in text
    for step, script in (("prepare-host", "prepare_host.sh"), ("docker", "install_docker.sh"),
                         ("pull-image", "pull_image.sh"), ("gpu-ready", "local/gpu_ready.sh"),
                         ("ray-head", "ray_head.sh"), ("ray-ready", "ray_ready.sh"), ("job", "job_submit.sh")):
        assert any(step in line and script in line for line in text.splitlines()), (step, script)
    assert "submission id" in text and "generated configuration" in text
    assert "0.0.0.0/0" not in text


def test_plan_of_a_bigger_cluster_and_a_bad_config(capsys):
    assert plan.main(["--full", "multi", "--nodes", "4"]) == 0
    assert "node-3" in capsys.readouterr().out
    assert plan.main(["--full", "nonexistent"]) == 1
    assert "no stack file Pulumi.nonexistent.yaml" in capsys.readouterr().err


@pytest.mark.parametrize("stack", HOST_STACKS)
def test_plan_of_own_hosts_shows_no_cloud_resource_and_every_node_container_ray_and_job(stack, capsys):
    assert plan.main(["--full", stack]) == 0
    text = capsys.readouterr().out
    assert "== Hosts " in text and "== Placement " not in text and "== Network " not in text
    assert "cloud resources: none" in text and "alicloud:" not in text
    assert "first boot" not in text  # no user data on hosts that exist already
    for node in ("node-0", "node-1"):
        assert f"  {node}:" in text
    for heading in ("Container", "Ray", "Training job", "Stack outputs"):
        assert f"== {heading} " in text, heading
    assert "submission id" in text
    if stack == "ascend":
        assert "npu-ready      npu_lib.sh, npu_ready.sh" in text
        for device in ("/dev/davinci0", "/dev/davinci7", "/dev/davinci_manager", "/dev/hisi_hdc", "/dev/devmm_svm"):
            assert f"device      {device}\n" in text
        assert "/dev/davinci8" not in text
        for path in ("/usr/local/Ascend/driver", "/usr/local/dcmi", "/usr/local/sbin/npu-smi",
                     "/etc/ascend_install.info"):
            assert f"mount       {path} -> {path} (ro)" in text
        assert "privileged False" in text and "gpus        none" in text
        assert '--num-gpus=0  --resources={"NPU": 8}  jemalloc preloaded: yes' in text
        assert "env         HCCL_SOCKET_IFNAME=" in text
    else:
        assert "gpu-ready      local/gpu_ready.sh" in text and "gpus        all" in text
        assert "--num-gpus=2  --resources=none  jemalloc preloaded: no" in text
        assert "/dev/davinci" not in text


def test_first_boot_user_data_fits_alibabas_limit():
    # ECS accepts at most 32 KB of user data before Base64 (16 KB on older pages). It is plain text (a bash script
    # that unpacks the gzip+Base64 first-boot script and runs it): no binary that a metadata service could mangle.
    for stack in CLOUD_STACKS:
        user_data = reveal(run(stack).cloud.of_type("alicloud:ecs/instance:Instance")[0].inputs["userData"])
        text = base64.b64decode(user_data)
        assert len(text) < 20 * 1024, (stack, len(text))
        assert text.isascii() and text.startswith(b"#!/bin/bash\n"), stack
        assert decode_user_data(user_data).startswith("#!/bin/bash\n")


def test_plan_of_dev_prints_the_whole_roll_yaml_with_fp16_over_the_clusters_gpu(capsys):
    assert plan.main(["--full", "dev"]) == 0
    text = capsys.readouterr().out
    shipped = text.split("the configuration file shipped to the head, exactly:\n", 1)[1].split("\n== ", 1)[0]
    config = yaml.safe_load(textwrap.dedent(shipped))
    for role in ("actor_train", "actor_infer", "reference"):
        assert config[role]["model_args"]["dtype"] == "fp16", role
        assert config[role]["device_mapping"] == "list(range(0,1))", role
    assert config["custom_env"]["FrozenLake"]["env_type"] == "frozen_lake"  # the Hydra defaults, merged in


@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["large", "--nodes", "1"], "roll-cluster:training.overrides.actor_infer.device_mapping: GPU indices must be"),
        (["dev", "--config", 'roll-cluster:training={"roll": {"baseConfig": "agentic_demo/nope.yaml"}}'],
         "roll-cluster:training.roll.baseConfig: must name a file under ROLL's examples/"),
        (["dev", "--config", 'roll-cluster:training={"overrides": {"actor_train.model_args.dtype": "bf16"}}'],
         "roll-cluster:training.overrides.actor_train.model_args.dtype: must be fp16 or fp32"),
    ],
)
def test_plan_refuses_a_roll_config_that_would_fail_on_the_head_before_any_resource(args, key, capsys, monkeypatch):
    clouds = []
    real = plan.offline_cloud_for
    monkeypatch.setattr(plan, "offline_cloud_for", lambda stack: clouds.append(real(stack)) or clouds[-1])
    assert plan.main(args) == 1
    err = capsys.readouterr().err
    assert key in err, err
    assert [r.name for r in clouds[0].resources if r.custom] == []


@pytest.mark.parametrize("stack", ["multi", "large", "verl"])
def test_plan_shows_the_dashboard_reached_through_the_tunnel_by_default(stack, capsys):
    assert plan.main(["--full", stack]) == 0
    text = capsys.readouterr().out
    assert "dashboardTunnel" in text and "-N -L 8265:127.0.0.1:8265" in text
    assert "dashboardUrl" not in text and "8265/8265" not in text  # no output and no security group rule
    result = run(stack)
    head = next(r for r in result.cloud.resources if r.name == "node-0-ray-head")
    assert "export DASHBOARD_HOST=127.0.0.1" in str(head.inputs["stdin"])


@pytest.mark.parametrize("stack", ["dev", "multi", "large", "hosts"])
def test_roll_plans_show_checkpoints_resume_and_the_start_gate_never_rolls_own_resume(stack, capsys):
    assert plan.main(["--full", stack]) == 0
    text = capsys.readouterr().out
    assert "resume_from_checkpoint: true" not in text and "resume_from_checkpoint: false" in text
    assert "  checkpoints  every " in text and " steps and the final step of " in text
    assert "  start gate   the job step waits up to 60 min (training.startTimeoutMinutes" in text
    assert "/pipeline step [0-9]+ finished/" in text
    if stack in ("dev", "multi"):  # V100: vLLM's V0 engine for every vLLM worker
        config = yaml.safe_load(run(stack).notes["job_spec"].rendered_config)
        vllm = [c for c in config.values() if isinstance(c, dict)
                and (c.get("strategy_args") or {}).get("strategy_name") == "vllm"]
        assert vllm and all(c["strategy_args"]["strategy_config"]["VLLM_USE_V1"] == 0 for c in vllm)
        # ... whose max_model_len fits ROLL's token budget (vLLM 0.8.4's V0 scheduler refuses it otherwise)
        assert all(c["strategy_args"]["strategy_config"]["max_model_len"] <= c["strategy_args"]["strategy_config"].get(
            "max_num_batched_tokens", 8192) for c in vllm)
        assert "actor_infer: vLLM V0 max_model_len 4096 within max_num_batched_tokens 8192" in text
    assert "  no progress  a running job that prints nothing for 20 min before that line is stopped" in text
    if stack == "dev":  # one node, storage unset: a kept NAS all the same (issue 27)
        assert "checkpoints on the NAS at /mnt/shared: they survive pulumi destroy" in text
        assert "DIE WITH THE" not in text


@pytest.mark.parametrize("stack", ["verl", "openrlhf"])
def test_verl_and_openrlhf_plans_show_a_save_interval_on_shared_storage_and_how_a_resume_finds_it(stack, capsys):
    assert plan.main(["--full", stack]) == 0
    text = capsys.readouterr().out
    assert "  checkpoints  every 10 steps and the final step (" in text
    assert f"to /mnt/shared/checkpoints/{stack}/{stack}-16gpu (shared storage)" in text
    assert "  resume       at each submission the job step finds the newest complete checkpoint under" in text


# ------------------------------------------------------------------------------------ the default plan: a summary
SUMMARY_LABELS = ("placement", "job", "cost", "exposure", "time", "changes", "warnings", "notes", "next")


@pytest.mark.parametrize("stack", STACKS)
def test_the_default_plan_is_a_summary_of_at_most_50_lines_that_a_user_reads(stack, capsys):
    assert plan.main([stack, "--no-registry"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) <= 50, len(lines)
    assert max(len(line) for line in lines) <= 120
    labels = [line.split()[0] for line in lines[2:] if line and not line.startswith(" ")]
    assert [label for label in SUMMARY_LABELS if label in labels] == labels, labels
    assert "== " not in text and "generated configuration" not in text  # the details are --full's
    if stack in CLOUD_STACKS:
        for cost in ("before the job runs", "running", "paused", "after destroy"):
            assert any(line.startswith(("cost ", " ")) and f" {cost} " in line for line in lines), cost
        assert "SSH (tcp 22) from 203.0.113.0/24 only" in text
        assert "min to the first training step, modelled" in text


def test_the_summary_counts_what_it_leaves_out_instead_of_passing_50_lines():
    from infra import summary

    many = summary.Summary(heading="h", placement=["p"], warnings=[f"warning {i} " + "x" * 200 for i in range(40)],
                           notes=["a note"], next=["n"])
    lines = summary.summary_lines(many)
    assert len(lines) == 50
    assert lines[-2].strip().startswith("... ") and "more warnings or notes: the full plan (--full)" in lines[-2]
    assert lines[-1].startswith("next")


def _dev_with(extra: dict[str, object]) -> dict[str, object]:
    from devtools import offline_cloud

    return {**offline_cloud.stack_config("dev"), **extra}


def test_a_secure_value_in_the_stack_file_is_a_set_secret_never_printed(monkeypatch, capsys):
    # What `pulumi config set --secret roll-cluster:wandbApiKey ...` writes into Pulumi.dev.yaml.
    from devtools import offline_cloud

    ciphertext = "v1:fAKEcIPHERtext0123456789"
    values = _dev_with({"roll-cluster:wandbApiKey": {"secure": ciphertext}, "roll-cluster:hfToken": {"secure": "v1:x"}})
    monkeypatch.setattr(offline_cloud, "stack_config", lambda stack: values)
    assert plan.main(["dev", "--no-registry"]) == 0
    out = capsys.readouterr()
    assert ciphertext not in out.out + out.err and "must be a secret" not in out.err
    assert plan.main(["dev", "--no-registry", "--full"]) == 0
    full = capsys.readouterr().out
    assert ciphertext not in full and "v1:x" not in full


def test_dev_py_plan_with_a_secure_value_succeeds_in_at_most_50_lines():
    import subprocess
    import sys
    from pathlib import Path

    secret = "v1:sECUREvalue"
    done = subprocess.run(
        [sys.executable, "dev.py", "plan", "dev", "--no-registry", "--config",
         f'roll-cluster:wandbApiKey={{"secure": "{secret}"}}'],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    printed = [line for line in done.stdout.splitlines() if not line.startswith("$ ")]  # dev.py echoes its command
    assert len(printed) <= 50 and secret not in "\n".join(printed)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("config:\n  - roll-cluster:nodes: {}\n", "Pulumi.broken.yaml: config: must be a mapping"),
        ("- config\n", "Pulumi.broken.yaml: must be a mapping with a `config:` section"),
        ("config:\n  roll-cluster:nodes:\n   count: 1\n  bad\n", "Pulumi.broken.yaml:5:1: not valid YAML"),
    ],
)
def test_a_malformed_stack_file_is_an_error_naming_the_file_without_a_traceback(document, message, tmp_path,
                                                                                 monkeypatch, capsys):
    from devtools import offline_cloud

    (tmp_path / "Pulumi.broken.yaml").write_text(document)
    monkeypatch.setattr(offline_cloud, "PROJECT_DIR", tmp_path)
    assert plan.main(["broken", "--no-registry"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_unknown_namespace_is_refused_with_the_nearest_one(capsys):
    assert plan.main(["dev", "--config", 'rollcluster:nodes={"count": 2}']) == 1
    err = capsys.readouterr().err
    assert "rollcluster:nodes: unknown namespace `rollcluster`" in err and "did you mean `roll-cluster:nodes`" in err
    assert plan.main(["dev", "--config", 'nodes={"count": 2}']) == 1  # no namespace at all
    assert "nodes: unknown namespace `(none)`" in capsys.readouterr().err


def test_a_zone_typo_names_the_nearest_zone_not_stock(capsys):
    assert plan.main(["dev", "--config", 'roll-cluster:nodes={"zone": "cn-hangzhou-q"}']) == 1
    err = capsys.readouterr().err
    assert "roll-cluster:nodes.zone: cn-hangzhou-q is no zone of cn-hangzhou; did you mean cn-hangzhou-k?" in err
    assert "no stock" not in err


@pytest.mark.parametrize("kind", ["missing", "passphrase"])
def test_the_plan_runs_the_local_key_checks_and_warns(kind, tmp_path, monkeypatch, capsys):
    import subprocess

    key = tmp_path / "id_ed25519"
    if kind == "passphrase":
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f", str(key)], check=True)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    path = json_text(str(key))
    assert plan.main(["dev", "--no-registry", "--config", f'roll-cluster:access={{"sshPrivateKeyPath": {path}}}']) == 0
    text = " ".join(capsys.readouterr().out.split())  # the summary wraps long lines
    expected = "no private key at" if kind == "missing" else "is protected by a passphrase"
    assert "refused by `pulumi up`: roll-cluster:access.sshPrivateKeyPath: " in text and expected in text, text
    assert str(key) in text


def json_text(value: str) -> str:
    import json

    return json.dumps(value)


def test_pulumi_up_opens_with_the_same_summary_from_the_live_placement() -> None:
    from offline_helpers import run as run_stack

    from infra import summary

    result = run_stack("multi")
    config = result.notes["config"]
    text = summary.for_update(config, "multi", "ecs.gn6v-c8g1.4xlarge", "cn-hangzhou-i", 2, "NVIDIA V100",
                              result.outputs["cost"])
    lines = text.splitlines()
    assert len(lines) <= 50 and lines[0].startswith("roll-cluster: stack multi")
    assert "placement     2 nodes x ecs.gn6v-c8g1.4xlarge (2 x NVIDIA V100 each) in cn-hangzhou-i" in text
    for cost in ("running", "paused", "after destroy", "autostop"):
        assert any(line[14:].startswith(cost) for line in lines), cost
    assert "SSH (tcp 22) from 203.0.113.0/24 only" in text
    # The program logs it (pulumi.log.info) once the placement is known; the offline plan prints its own.
    main = (Path(__file__).resolve().parents[2] / "__main__.py").read_text()
    assert "pulumi.log.info(summary.for_update(" in main
