"""The framework settings inside `roll-cluster:training`: one model per framework key, and the refs they pin.

`training.roll` (RollConfig), `training.verl` (VerlConfig), `training.openrlhf` (OpenRlhfConfig, with its
`rewardServer`), `training.custom` (CustomConfig) and `training.mindspeedRl` (MindSpeedRlConfig, with its
`mindspeed`, `megatron` and `mindspeedLlm` pins).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from infra.config import values
from infra.config.base import Section, _problem, _shown

DEFAULT_ROLL_REPO = "https://github.com/alibaba/ROLL.git"
# v0.3.0, the ref whose configs, launchers and requirements files verified-facts#frameworks-roll describes.
DEFAULT_ROLL_REF = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"
DEFAULT_PIP_INDEX = "https://mirrors.aliyun.com/pypi/simple/"
# MindSpeed-RL and the three repositories placed beside it, at the refs of seed 002 (docs/mindspeed-rl.md section 3):
# the seed pins MindSpeed and MindSpeed-LLM to the commits that MindSpeed-RL's 2.0.0 install guide names
# (Ascend/MindSpeed-RL@62e9928:docs/install_guide.md); the seed clones MindSpeed-RL without a ref, so
# the default is the head of that 2.0.0 branch. Upstream moved from gitee to gitcode (master's install guide); the
# archive fallback is the GitHub mirror of the same commit.
# see verified-facts#frameworks-install-guide
DEFAULT_MSRL_REPO = "https://gitcode.com/Ascend/MindSpeed-RL.git"
DEFAULT_MSRL_REF = "62e9928ae89d9570f659b46e816bc55e1191b5e7"  # branch 2.0.0 (2025-05-30)
DEFAULT_MINDSPEED_REPO = "https://gitcode.com/Ascend/MindSpeed.git"
DEFAULT_MINDSPEED_REF = "0dfa0035ec54d9a74b2f6ee2867367df897299df"
DEFAULT_MEGATRON_REPO = "https://github.com/NVIDIA/Megatron-LM.git"
# Mirrors on gitee.com of GitHub repos, reachable from mainland China regions, tried before `repo` (docs/frameworks.md,
# "Where the code comes from"). Used by public install scripts (Ascend's MindSpeed-Core-MS clones
# gitee.com/mirrors/Megatron-LM); that they carry the pinned refs is UNCONFIRMED: `repo` and the archive follow.
DEFAULT_VERL_MIRROR = "https://gitee.com/mirrors/verl.git"
DEFAULT_MEGATRON_MIRROR = "https://gitee.com/mirrors/Megatron-LM.git"
MIRROR_REPO_HELP = (
    "Git URL of a mirror of `repo` that works from mainland China regions, tried first (once); then `repo`, then "
    "`archiveUrl`. null: `repo` only (outside mainland China GitHub itself is the faster source)."
)
DEFAULT_MEGATRON_REF = "baf94af3c667248865f23df73b9fb8e2395e6fd0"  # core_r0.8.0 (branch and tag point here)
DEFAULT_MINDSPEED_LLM_REPO = "https://gitcode.com/Ascend/MindSpeed-LLM.git"
DEFAULT_MINDSPEED_LLM_REF = "421ef7bcb83fb31844a1efb688cde71705c0526e"
ROLL_PIPELINES = (
    "agentic", "agentic_rollout", "rlvr", "rlvr_rollout", "rlvr_vl", "distill", "distill_vl", "dpo", "sft",
    "onpolicy_distill",
)


class _GitSourced(Section):
    """What every section that fetches code has in common: its repository, mirror, ref, archive and pip index
    are validated as what they are (infra/config/values.py), whichever of them the section has."""

    @field_validator("repo", "mirror_repo", check_fields=False)
    @classmethod
    def _repo(cls, url: str | None) -> str | None:
        return None if url is None else values.git_repo(url)

    @field_validator("ref", check_fields=False)
    @classmethod
    def _ref(cls, ref: str) -> str:
        return values.git_ref(ref)

    @field_validator("archive_url", check_fields=False)
    @classmethod
    def _archive(cls, url: str | None) -> str | None:
        return values.archive_url(url)

    @field_validator("pip_index_url", check_fields=False)
    @classmethod
    def _index(cls, url: str) -> str:
        return values.pip_index(url)


class RollConfig(_GitSourced):
    repo: str = Field(DEFAULT_ROLL_REPO, description="Git URL of ROLL.")
    ref: str = Field(DEFAULT_ROLL_REF, description="Tag or commit of ROLL; never a moving branch by default.")
    archive_url: str | None = Field(
        None,
        description="Tarball of the same ref, used when GitHub is unreachable from the region. Default: GitHub's "
        "archive of `ref` (set your own mirror, e.g. an OSS URL, where GitHub is blocked).",
    )
    mirror_repo: str | None = Field(
        None, description=MIRROR_REPO_HELP + " Default null: no mainland mirror of ROLL is known (UNCONFIRMED)."
    )
    pipeline: Literal[ROLL_PIPELINES] = Field(  # type: ignore[valid-type]
        "agentic", description="Selects `examples/start_<pipeline>_pipeline.py`."
    )
    base_config: str = Field(
        "agentic_demo/agent_val_frozen_lake_single_node_demo.yaml",
        description="`<dir>/<name>.yaml` under ROLL's `examples/`: the example the generated config starts from.",
    )
    checkout: str | None = Field(
        None,
        description="A local ROLL checkout at `ref` on the machine that runs `pulumi up` (also the `ROLL_CHECKOUT` "
        "environment variable): the base config and its Hydra defaults are read from its `examples/`. Default: those "
        "files of `ref` fetched from GitHub and cached under `~/.cache/roll-cluster/roll/<ref>/`.",
    )
    requirements_file: str | None = Field(
        None,
        description="ROLL requirements file installed in the container; default: the one matching the image tag "
        "(e.g. `requirements_torch260_vllm.txt`).",
    )
    pip_index_url: str = Field(DEFAULT_PIP_INDEX, description="pip index used on the nodes (Alibaba's mirror).")

    @field_validator("requirements_file")
    @classmethod
    def _requirements(cls, path: str | None) -> str | None:
        return None if path is None else values.relative_path(path)

    @field_validator("base_config")
    @classmethod
    def _inside_examples(cls, path: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+\.ya?ml", path) or {".", ".."} & set(path.split("/")):
            raise _problem(
                "must be `<dir>/<name>.yaml` inside ROLL's examples/ (no absolute path, no `..`, a directory "
                f"part), e.g. `agentic_demo/agent_val_frozen_lake_single_node_demo.yaml`; got {_shown(path)}"
            )
        return path


class VerlConfig(_GitSourced):
    repo: str = Field("https://github.com/volcengine/verl.git", description="Git URL of verl.")
    ref: str = Field("v0.7.0", description="Tag or commit of verl.")
    archive_url: str | None = Field(None, description="Tarball of the same ref, used when GitHub is unreachable.")
    mirror_repo: str | None = Field(DEFAULT_VERL_MIRROR, description=MIRROR_REPO_HELP)
    entrypoint_module: str = Field("verl.trainer.main_ppo", description="Module run with `python3 -m`.")
    data_dir: str = Field(
        "/mnt/shared/data/gsm8k",
        description="Absolute directory of the prepared parquet files; must be readable on every node "
        "(verl's TaskRunner runs on any node), hence the shared storage.",
    )
    data_preparation: str | None = Field(
        "python3 examples/data_preprocess/gsm8k.py --local_save_dir {data_dir}",
        description="Shell command run once in the verl checkout on the head before submission (`{data_dir}` is "
        "replaced); skipped when `{data_dir}/train.parquet` exists. null: the data is already there.",
    )
    pip_index_url: str = Field(DEFAULT_PIP_INDEX, description="pip index used on the nodes.")

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/"):
            raise _problem(
                f"must be an absolute path (relative paths land in Ray's temporary working_dir); got {_shown(path)}"
            )
        return values.absolute_path(path)

    @field_validator("entrypoint_module")
    @classmethod
    def _module(cls, name: str) -> str:
        return values.module_name(name)

    @field_validator("data_preparation")
    @classmethod
    def _no_credentials(cls, command: str | None) -> str | None:
        return None if command is None else values.refuse_credentials(command)


class RewardServerConfig(Section):
    command: str = Field(
        description="Command that serves the reward model in the container on the head (`{port}` is replaced). "
        "It runs with `CUDA_VISIBLE_DEVICES` set to the head's last `gpus` GPUs."
    )
    port: int = Field(
        5000, ge=1024, le=65535,
        description="Port of the reward server. The job gets its URL as "
        "`http://${ROLL_CLUSTER_HEAD_IP}:<port>/get_reward` (the vLLM engines post to it from every node); the job "
        "step sets `ROLL_CLUSTER_HEAD_IP` to the head's private IP, so the configuration is known before the head "
        "exists.",
    )
    gpus: int = Field(
        1, ge=1,
        description="GPUs of the head the server uses (its last ones, given to it as `CUDA_VISIBLE_DEVICES`; "
        "`serve_rm` spreads the model over all it sees). Without `train.colocate_all` Ray on the head leaves them "
        "out (it starts with the other GPUs only), and the roles must fit the GPUs Ray has; with it they share GPUs "
        "with the colocated roles, so `vllm.gpu_memory_utilization` defaults to 0.5 (upstream's colocated example) "
        "and may not be higher.",
    )
    health_timeout_seconds: int = Field(
        900, ge=10, le=7200, description="How long to wait for the server to answer before failing."
    )

    @field_validator("command")
    @classmethod
    def _command(cls, command: str) -> str:
        if "{port}" not in command:
            raise _problem("must contain `{port}`, where the server's port is put (the job posts to that port); got "
                           + _shown(command))
        return values.refuse_credentials(command)


# What upstream's own image adds to nvcr.io/nvidia/pytorch:25.11-py3 at v0.10.2 (dockerfile/Dockerfile): the
# packages that conflict with OpenRLHF's pins are removed, then vLLM and a prebuilt flash-attn wheel go in.
OPENRLHF_UNINSTALL = ["xgboost", "transformer_engine", "flash_attn", "pynvml", "opencv-python-headless"]
OPENRLHF_PREINSTALL = [
    "vllm==0.19.1",
    "https://github.com/mjun0812/flash-attention-prebuild-wheels/releases/download/v0.7.16/"
    "flash_attn-2.8.3+cu130torch2.10-cp312-cp312-linux_x86_64.whl",
]


class OpenRlhfConfig(_GitSourced):
    repo: str = Field("https://github.com/OpenRLHF/OpenRLHF.git", description="Git URL of OpenRLHF.")
    ref: str = Field(
        "v0.10.2",
        description="Tag or commit of OpenRLHF, checked out on every node (the job and the reward server run "
        "from it, as upstream's README runs from its checkout); keep it at the version of `package`.",
    )
    archive_url: str | None = Field(
        None, description="Tarball of the same ref, used when GitHub is unreachable. Default: GitHub's archive."
    )
    mirror_repo: str | None = Field(
        None, description=MIRROR_REPO_HELP + " Default null: no mainland mirror of OpenRLHF is known (UNCONFIRMED)."
    )
    package: str = Field(
        "openrlhf[vllm]==0.10.2",
        description="pip requirement installed in the container on every node (0.10.2 is the last release on "
        "Ray 2.48.0 and takes the dotted flag names).",
    )
    uninstall_packages: list[str] = Field(
        default_factory=lambda: list(OPENRLHF_UNINSTALL),
        description="Packages removed from the image first, as upstream's dockerfile does at v0.10.2 (they "
        "conflict with OpenRLHF's pins).",
    )
    preinstall_packages: list[str] = Field(
        default_factory=lambda: list(OPENRLHF_PREINSTALL),
        description="pip requirements installed with `package`, as upstream's dockerfile does at v0.10.2: the "
        "vLLM pin and a prebuilt flash-attn wheel for the NGC 25.11 image (Python 3.12, CUDA 13, torch 2.10), so "
        "that nothing compiles on the nodes. Change them with the image.",
    )
    entrypoint_module: str = Field("openrlhf.cli.train_ppo_ray", description="Module run with `python3 -m`.")
    vllm_num_engines: int = Field(
        2, ge=1,
        description="vLLM engines (`--vllm.num_engines`); engines x `vllmTensorParallelSize` must fit the cluster's "
        "GPUs.",
    )
    vllm_tensor_parallel_size: int = Field(1, ge=1, description="GPUs per vLLM engine.")
    reward_server: RewardServerConfig | None = Field(
        None, description="A remote reward-model server started on the head and health-checked before the job."
    )
    pip_index_url: str = Field(DEFAULT_PIP_INDEX, description="pip index used on the nodes.")

    @field_validator("entrypoint_module")
    @classmethod
    def _module(cls, name: str) -> str:
        return values.module_name(name)

    @field_validator("package")
    @classmethod
    def _package(cls, spec: str) -> str:
        return values.requirement(spec)

    @field_validator("preinstall_packages")
    @classmethod
    def _preinstall(cls, specs: list[str]) -> list[str]:
        return [values.requirement(spec) for spec in specs]

    @field_validator("uninstall_packages")
    @classmethod
    def _uninstall(cls, names: list[str]) -> list[str]:
        return [values.package_name(name) for name in names]


class CustomConfig(Section):
    entrypoint: str = Field(
        description="Shell command submitted as a Ray job, run on the head in the container. The job's "
        "environment names its checkpoint directory (`ROLL_CLUSTER_CHECKPOINT_DIR`, on the shared storage when "
        "there is some), whether to resume from it (`ROLL_CLUSTER_RESUME`, 1 or 0, from `training.resume`) and "
        "the model source (`ROLL_CLUSTER_MODEL_SOURCE`, plus `HF_ENDPOINT` for `hf-mirror`)."
    )
    working_dir: str = Field("/workspace", description="Directory (in the container) the entrypoint runs from.")

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, command: str) -> str:
        if not command.strip():
            raise _problem(f"must be a shell command (not blank); got {_shown(command)}")
        return values.refuse_credentials(command)

    @field_validator("working_dir")
    @classmethod
    def _working_dir(cls, path: str) -> str:
        return values.absolute_path(path)


def _absolute_path(path: str) -> str:
    if not path.startswith("/") or "\n" in path:
        raise _problem(
            "must be an absolute path in the container, the same on every node (MindSpeed-RL's workers resolve "
            f"relative paths against the directory Ray was started in, not the code directory); got {_shown(path)}"
        )
    return values.absolute_path(path)


class _CodePin(_GitSourced):
    """One repository at one ref; the subclasses only differ in their defaults."""

    repo: str
    ref: str
    archive_url: str | None = Field(
        None,
        description="Tarball of the same ref, used when `git fetch` fails. Default: GitHub's archive of `ref` for a "
        "GitHub repo, the GitHub mirror (github.com/Ascend/...) for the Ascend repos on gitcode.",
    )
    mirror_repo: str | None = Field(None, description=MIRROR_REPO_HELP)


class MindSpeedPin(_CodePin):
    repo: str = Field(DEFAULT_MINDSPEED_REPO, description="Git URL of MindSpeed.")
    ref: str = Field(DEFAULT_MINDSPEED_REF, description="Commit (or tag) of MindSpeed; its `mindspeed/` is placed.")


class MegatronPin(_CodePin):
    repo: str = Field(DEFAULT_MEGATRON_REPO, description="Git URL of Megatron-LM.")
    mirror_repo: str | None = Field(DEFAULT_MEGATRON_MIRROR, description=MIRROR_REPO_HELP)
    ref: str = Field(
        DEFAULT_MEGATRON_REF, description="Commit (or tag) of Megatron-LM, core_r0.8.0; its `megatron/` is placed."
    )


class MindSpeedLlmPin(_CodePin):
    repo: str = Field(DEFAULT_MINDSPEED_LLM_REPO, description="Git URL of MindSpeed-LLM.")
    ref: str = Field(
        DEFAULT_MINDSPEED_LLM_REF, description="Commit (or tag) of MindSpeed-LLM; its `mindspeed_llm/` is placed."
    )


class MindSpeedRlConfig(_GitSourced):
    repo: str = Field(DEFAULT_MSRL_REPO, description="Git URL of MindSpeed-RL.")
    ref: str = Field(DEFAULT_MSRL_REF, description="Commit (or tag) of MindSpeed-RL; default: the 2.0.0 release.")
    archive_url: str | None = Field(
        None, description="Tarball of the same ref, used when `git fetch` fails; default: the GitHub mirror's archive."
    )
    mindspeed: MindSpeedPin = Field(default_factory=MindSpeedPin, description="MindSpeed, placed beside MindSpeed-RL.")
    megatron: MegatronPin = Field(default_factory=MegatronPin, description="Megatron-LM, placed beside MindSpeed-RL.")
    mindspeed_llm: MindSpeedLlmPin = Field(
        default_factory=MindSpeedLlmPin, description="MindSpeed-LLM, placed beside MindSpeed-RL."
    )
    code_dir: str = Field(
        "/workspace/MindSpeed-RL",
        description="MindSpeed-RL's directory in the container, the same on every node; `mindspeed/`, `megatron/` "
        "and `mindspeed_llm/` are copied into it.",
    )
    image_has_code: bool = Field(
        False,
        description="The image already holds the placed code and its requirements in `codeDir` (an image committed "
        "after the install, as seed 002 does): nothing is fetched or installed, and the head checks the four "
        "directories before submitting.",
    )
    example_config: str = Field(
        "grpo_qwen25_7b_A3",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
        description="Hydra config name under MindSpeed-RL's `configs/`, without `.yaml` (`--config-name`); the job "
        "starts from it, then the cluster's values and `training.overrides` (Hydra keys such as "
        "`actor_config.tensor_model_parallel_size: 4`) are applied.",
    )
    tokenizer_path: str = Field(
        description="Hugging Face model directory (the tokenizer) on every node: "
        "`megatron_training.tokenizer_name_or_path`."
    )
    data_path: str = Field(
        description="Prefix of the preprocessed dataset on every node (MindSpeed-RL's preprocess_data output, e.g. "
        "`/data/dataset/deepscaler/data`): `megatron_training.data_path`."
    )
    load_path: str = Field(
        description="Megatron-mcore weights converted with the actor's TP/PP, on every node: `actor_config.load`."
    )
    save_path: str | None = Field(
        None,
        description="Checkpoint directory: `actor_config.save`. Default: "
        "`<shared or data dir>/mindspeed-rl/<stack>/ckpt`.",
    )
    antlr_requirement: str = Field(
        "antlr4-python3-runtime==4.7.2",
        description="Installed with `--no-deps` after the requirements, as MindSpeed-RL 2.0.0's install guide does.",
    )
    pip_index_url: str = Field(DEFAULT_PIP_INDEX, description="pip index used on the nodes.")

    @field_validator("antlr_requirement")
    @classmethod
    def _antlr(cls, spec: str) -> str:
        return values.requirement(spec)

    @field_validator("code_dir", "tokenizer_path", "data_path", "load_path", "save_path")
    @classmethod
    def _absolute(cls, path: str | None) -> str | None:
        return None if path is None else _absolute_path(path)

    @field_validator("example_config")
    @classmethod
    def _config_name(cls, name: str) -> str:
        if name.endswith((".yaml", ".yml")):
            raise _problem(
                f"is a Hydra config name, without the extension (MindSpeed-RL's examples say so); got {_shown(name)}"
            )
        return name
