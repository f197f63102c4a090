"""Read and validate the stack's configuration from the Pulumi runtime, before any resource exists."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass

import pulumi
from pulumi.runtime import config as runtime_config

from infra import runmode
from infra.config import PROJECT, SECRETS, ClusterConfig, ConfigError, parse_cluster_config
from infra.config.first_time import first_time_mistakes
from infra.config.values import MAX_ARG_STRLEN
from infra.frameworks import ClusterShape, adapter_for, check_before_deploy
from infra.frameworks.base import JobSpec
from infra.layout import DATA_MOUNT, SHARED_MOUNT
from infra.node import steps
from infra.ray.step_env import files_archive_b64

# Sections that may not be held as a secret, and why: what they hold becomes resource names, connection hosts and
# outputs that Pulumi cannot keep secret, and none of it is a credential. `training`, which may carry values
# someone wants kept out of sight, may be secret: every command and output derived from it is then secret too
# (infra/node/remote.py, infra/outputs.py).
SECRET_SECTIONS_REFUSED = {
    "nodes": "it holds no credential, and the host addresses reach the SSH connections, the docker provider's host, "
             "the local steps' environment and the outputs hosts, nodes, sshHead, dashboardTunnel, jobStatus and "
             "jobLogs",
    "access": "it holds no credential (the key is the public one, the private key is only named), and the admin "
              "CIDRs reach the security group rules and their names",
    "container": "it holds no credential (the registry password is the secret roll-cluster:registryPassword), and "
                 "the image name reaches the image and container inputs",
    "storage": "it holds no credential, and the file system id and NFS server reach the mount target, the mounts "
               "and the nasFileSystemId output",
    "ray": "it holds no credential, and its ports reach the commands and the dashboardTunnel output",
}

# The provider's own credentials: in plain config Pulumi stores and shows them in clear text.
PROVIDER_SECRETS = ("alicloud:accessKey", "alicloud:secretKey", "alicloud:securityToken")
# The namespaces whose keys anything reads: the program's, its providers' (alicloud, docker, command) and Pulumi's
# own (pulumi:tags, pulumi:disable-default-providers). A key under any other namespace is read by nothing, so a
# misspelt project name (`rollcluster:nodes`) would be silently ignored.
KNOWN_NAMESPACES = (PROJECT, "alicloud", "docker", "command", "pulumi")


def namespace_problems(keys: list[str]) -> list[str]:
    """Config keys under a namespace nothing reads, each with the nearest known namespace."""
    problems = []
    for key in sorted(keys):
        namespace, _, name = key.partition(":") if ":" in key else ("", "", key)
        if namespace in KNOWN_NAMESPACES:
            continue
        close = [PROJECT] if not namespace else difflib.get_close_matches(namespace, KNOWN_NAMESPACES, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}:{name}`? " if close else ""
        problems.append(f"{key}: unknown namespace `{namespace or '(none)'}`: nothing reads this key; {hint}"
                        f"the namespaces read are {', '.join(KNOWN_NAMESPACES)}")
    return problems


@dataclass(frozen=True)
class StackSecrets:
    wandb_api_key: pulumi.Output[str] | None
    hf_token: pulumi.Output[str] | None
    registry_password: pulumi.Output[str] | None


def _project_keys() -> list[str]:
    keys = set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())
    return sorted(k.split(":", 1)[1] for k in keys if k.startswith(PROJECT + ":"))


def load(run: steps.RunContext) -> tuple[ClusterConfig, StackSecrets]:
    """The stack configuration, validated, and its secrets; `run` gets whether a section is secret and the
    warnings the offline plan shows."""
    keys = _project_keys()
    raw = {key: runtime_config.get_config(f"{PROJECT}:{key}") for key in keys}
    problems = namespace_problems(sorted(set(runtime_config.CONFIG.get()) | set(runtime_config.get_config_env())))
    for key in SECRETS:
        if key in keys and not runtime_config.is_config_secret(f"{PROJECT}:{key}"):
            problems.append(
                f"{PROJECT}:{key}: must be a secret (pulumi config set --secret {PROJECT}:{key} ...); "
                "got a plain value, which Pulumi would store and show in clear text"
            )
    for key in PROVIDER_SECRETS:
        if runtime_config.get_config(key) is not None and not runtime_config.is_config_secret(key):
            problems.append(
                f"{key}: must not be a plain value (Pulumi would store and show it in clear text); better, leave it "
                "out and use the ALIBABA_CLOUD_ACCESS_KEY_ID / ALIBABA_CLOUD_ACCESS_KEY_SECRET environment variables "
                f"or an `aliyun configure` profile, or set it as a secret: pulumi config set --secret {key} ...; "
                "got a plain value (not shown)"
            )
    for key in keys:
        if key in SECRET_SECTIONS_REFUSED and runtime_config.is_config_secret(f"{PROJECT}:{key}"):
            problems.append(
                f"{PROJECT}:{key}: must not be a secret (`pulumi config set --secret --path '{PROJECT}:{key}...'` "
                f"makes the whole section one): {SECRET_SECTIONS_REFUSED[key]}, which Pulumi shows in plain. Set it "
                f"in plain: `pulumi config rm {PROJECT}:{key}`, then "
                f"`pulumi config set --path '{PROJECT}:{key}.<field>' <value>` for each field. The secrets are "
                "roll-cluster:wandbApiKey, roll-cluster:hfToken and roll-cluster:registryPassword (and training may "
                "be secret as a whole); got a secret section"
            )
    try:
        config = parse_cluster_config(raw, runtime_config.get_config("alicloud:region"))
    except ConfigError as error:
        raise ConfigError(error.problems + problems) from None
    if problems:
        raise ConfigError(problems)
    # A section Pulumi holds as a secret keeps every command derived from it secret (infra/node/remote.py).
    run.secret_config = any(
        runtime_config.is_config_secret(f"{PROJECT}:{key}") for key in keys if key not in SECRETS
    )
    mistakes = first_time_mistakes(config)
    if mistakes and not runmode.offline():
        raise ConfigError(mistakes)
    # The offline plan runs the shipped stacks as written: there they are warnings (devtools/plan.py prints them).
    run.notes["config_warnings"] = mistakes + _undecrypted(raw)
    settings = pulumi.Config(PROJECT)
    secrets = StackSecrets(
        wandb_api_key=settings.get_secret("wandbApiKey"),
        hf_token=settings.get_secret("hfToken"),
        registry_password=settings.get_secret("registryPassword"),
    )
    if config.container.registry_username and secrets.registry_password is None:
        raise ConfigError([
            f"{PROJECT}:registryPassword: required when container.registryUsername is set "
            f"(pulumi config set --secret {PROJECT}:registryPassword ...); got nothing"
        ])
    return config, secrets


def _undecrypted(raw: dict[str, str | None]) -> list[str]:
    """The secret values the offline plan could not read (runmode.UNDECRYPTED), each named: checked by a preview."""
    lines: list[str] = []

    def walk(value: object, path: str) -> None:
        if value == runmode.UNDECRYPTED:
            lines.append(f"{path}: a secret the offline plan cannot decrypt; the plan used a placeholder, and "
                         "`pulumi preview` checks the value itself")
        elif isinstance(value, dict):
            for key, child in value.items():
                walk(child, f"{path}.{key}")
        elif isinstance(value, list):
            for index, child in enumerate(value):
                walk(child, f"{path}[{index}]")

    for key, text in raw.items():
        if text is None:
            continue
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        walk(value, f"{PROJECT}:{key}")
    return lines


def cluster_shape(config: ClusterConfig, stack: str, gpus_per_node: int, bf16: bool, head_ip: str) -> ClusterShape:
    """What the framework adapters size the job from."""
    return ClusterShape(
        stack=stack,
        nodes=config.nodes.count,
        gpus_per_node=gpus_per_node,
        bf16=bf16,
        head_ip=head_ip,
        shared_dir=SHARED_MOUNT if config.storage.shared else None,
        data_dir=DATA_MOUNT,
        dashboard_port=config.ray.dashboard_port,
        model_source=config.model_source,
        hf_endpoint=config.training.hf_endpoint,
    )


def check_framework(config: ClusterConfig, stack: str, gpus_per_node: int, bf16: bool) -> None:
    """Framework rules that need the chosen GPUs (batch sizes, engines x TP, requirements for the image); for ROLL
    the whole training YAML is built and checked here."""
    shape = cluster_shape(config, stack, gpus_per_node, bf16, head_ip="")
    problems = check_before_deploy(config.training, config.container, shape)
    if problems:
        raise ConfigError(problems)
    problems = command_sizes(adapter_for(config.training, config.container).job(shape))
    if problems:
        raise ConfigError(problems)


def command_sizes(job: JobSpec) -> list[str]:
    """Each command reaches the head as one environment string (JOB_ENTRYPOINT, JOB_PREPARE, REWARD_COMMAND), which
    Linux refuses beyond MAX_ARG_STRLEN (execve: E2BIG): refused here, naming what makes it large, not on the node
    after paying. The step adds its own text to each, hence the margin."""
    limit = MAX_ARG_STRLEN - 8 * 1024
    commands = {
        "the job's command (the framework's flags with training.overrides, or training.custom.entrypoint)":
            job.entrypoint,
        "the data preparation (training.verl.dataPreparation)": job.prepare,
        "the reward server's command (training.openrlhf.rewardServer.command)":
            job.reward_server.command if job.reward_server is not None else None,
        "the job's check before submission": job.pre_submit_check,
        "the job's files (the framework's configuration with training.overrides)":
            files_archive_b64(job.files) if job.files else None,
        "the job's runtime environment (training.overrides)":
            json.dumps(dict(job.runtime_env), sort_keys=True) if job.runtime_env else None,
    }
    return [
        f"{PROJECT}:training: {what} must be at most {limit // 1024} KiB (it reaches the node as one environment "
        f"string, and Linux refuses one over {MAX_ARG_STRLEN // 1024} KiB); got {size:,} bytes"
        for what, text in commands.items()
        if text is not None and (size := len(text.encode("utf-8", "surrogatepass"))) > limit
    ]
