"""`roll-cluster:training`: which framework the job runs and how (the frameworks' own settings: frameworks.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from infra.config import values
from infra.config.base import Section, _problem, _Problems, _shown
from infra.config.frameworks import CustomConfig, MindSpeedRlConfig, OpenRlhfConfig, RollConfig, VerlConfig

if TYPE_CHECKING:
    from infra.frameworks.base import FrameworkAdapter



class RegisteredFrameworks:
    """The mark of training.framework: its allowed values are the registered frameworks' names
    (infra/frameworks/registry.py), asked when a configuration is validated, so that a framework registers in one
    place. The reference (devtools/reference.py) lists them from here too."""

    @staticmethod
    def names() -> tuple[str, ...]:
        from infra.frameworks.registry import framework_names  # here: the adapters import this package

        return framework_names()

    @staticmethod
    def facts(name: str) -> type[FrameworkAdapter]:
        from infra.frameworks.registry import adapter_class

        return adapter_class(name)


MODEL_SOURCES = ("huggingface", "modelscope", "hf-mirror")
DEFAULT_HF_MIRROR = "https://hf-mirror.com"


def is_mainland_region(region: str) -> bool:
    """Alibaba Cloud regions in mainland China, where Docker Hub and the Hugging Face Hub are not reachable."""
    return region.startswith("cn-") and region != "cn-hongkong"


class TrainingConfig(Section):
    framework: Annotated[str, RegisteredFrameworks] = Field(
        "roll", description="What the job runs (`mindspeed-rl`: MindSpeed-RL GRPO on Ascend NPUs)."
    )
    auto_start: bool = Field(True, description="Submit the job during `pulumi up`; false prepares everything.")
    resume: bool | None = Field(
        None,
        description="Whether a job whose configuration changed resumes from the last checkpoint in its "
        "checkpoint directory (`<shared storage>/checkpoints/<stack>/<job>`) or starts fresh in a new one. "
        "null: the framework's default (true for all; custom: given as `ROLL_CLUSTER_RESUME`). Resuming, the job "
        "step looks, at every submission, for the newest complete checkpoint in that directory and hands its path "
        "to the framework through its own documented input (ROLL: `resume_from_checkpoint: '<path>'`; verl: "
        "`trainer.resume_mode=resume_path trainer.resume_from_path=<path>`; OpenRLHF: `--ckpt.load_enable` with "
        "`latest` pointed at the tag found; MindSpeed-RL: `actor_config.load=<savePath>`, not as a fine-tune, with "
        "Megatron's tracker pointed at the iteration found), or "
        "starts fresh and says so (docs/frameworks.md, 'Checkpoints and resume'). Without shared storage on "
        "more than one node nothing is resumed (the checkpoints are node-local). Checkpoints are per GPU count "
        "for verl and OpenRLHF (their sharded checkpoints cannot be loaded by another world size), so a resized "
        "cluster starts in its own directory.",
    )
    checkpoint_every: int | None = Field(
        None,
        ge=0,
        description="Training steps between two checkpoints (ROLL `save_steps`, verl `trainer.save_freq`, OpenRLHF "
        "`--ckpt.save_steps`, MindSpeed-RL `actor_config.save_interval`); the final step is always saved, except by "
        "MindSpeed-RL, which saves only at multiples of its interval. 0: the final step only (MindSpeed-RL: its "
        "example's `train_iters` as the interval). null: the program's default (ROLL: the base config's "
        "`save_steps` when it is below `max_steps`, else a tenth of `max_steps`; verl, OpenRLHF and MindSpeed-RL: "
        "10). A value set in `training.overrides` wins. The plan shows the interval and where the checkpoints go.",
    )
    start_timeout_minutes: int = Field(
        60,
        ge=0,
        le=24 * 60,
        description="The start gate: the job step of `pulumi up` returns only once the job printed its "
        "framework's first-training-step line (docs/frameworks.md, 'The start gate'), and fails, naming the job "
        "and showing its log tail, when the job dies first or this many minutes pass. Counted from the start of "
        "the job step, so it includes the data preparation and the model and data downloads of the job. A job "
        "still starting at the bound keeps running (`jobStatus`, `jobLogs`, `jobStop`). 0: no gate (the step "
        "returns once the job runs). `custom` jobs have no known first-step line and are not gated. With shared "
        "storage the head's `model` step, which downloads the job's models once before the job "
        "(docs/performance.md, 'Model downloads'), is bounded by the same minutes (60 when 0).",
    )
    no_progress_minutes: int = Field(
        20,
        ge=0,
        le=24 * 60,
        description="The start gate also fails a job that makes no progress: once the job runs, if its log gains "
        "no new output (a line, or a download's progress) for this many minutes before its first training step, "
        "the job step shows the job's log tail, stops the job (its GPUs are free again, its checkpoints stay) "
        "and fails `pulumi up` naming this key. A hang before step 1 (a collective that never forms, a stuck "
        "download) is so caught within these minutes instead of at startTimeoutMinutes. 0: not watched; without "
        "a start gate (startTimeoutMinutes 0, `custom` jobs) nothing is watched.",
    )
    model_source: Literal[MODEL_SOURCES] | None = Field(  # type: ignore[valid-type]
        None,
        description="Where models and datasets are downloaded from: `huggingface` (the Hub), `hf-mirror` "
        "(a Hub mirror at `hfEndpoint`, given to the job as `HF_ENDPOINT`) or `modelscope` (verl: "
        "`VERL_USE_MODELSCOPE=True`; OpenRLHF: `--use_ms`; custom: `ROLL_CLUSTER_MODEL_SOURCE`; the image needs "
        "the `modelscope` package and model ids must be ModelScope's, and dataset downloads through the Hub's "
        "`datasets` library may still need the Hub, so `hf-mirror` is the default). null: `hf-mirror` in "
        "mainland China regions (`cn-*` but `cn-hongkong`), where the Hub is not reachable, else `huggingface`.",
    )
    hf_endpoint: str = Field(
        DEFAULT_HF_MIRROR,
        pattern=r"^https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._/-]*)?$",
        description="The Hugging Face mirror used with `modelSource: hf-mirror` (`HF_ENDPOINT`).",
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="Deep-merged last into the framework's configuration: ROLL YAML keys, verl Hydra keys "
        "(`a.b.c: value`), OpenRLHF flags (`actor.num_nodes: 2`), MindSpeed-RL Hydra keys "
        "(`rl_config.n_samples_per_prompt: 8`). ROLL `device_mapping` values are checked against "
        "the cluster's GPUs (global indices 0 to nodes x GPUs per node - 1).",
    )
    roll: RollConfig = Field(default_factory=RollConfig, description="ROLL settings.")
    verl: VerlConfig = Field(default_factory=VerlConfig, description="verl settings.")
    openrlhf: OpenRlhfConfig = Field(default_factory=OpenRlhfConfig, description="OpenRLHF settings.")
    custom: CustomConfig | None = Field(None, description="Any Ray program; required when framework is `custom`.")
    mindspeed_rl: MindSpeedRlConfig | None = Field(
        None, description="MindSpeed-RL settings; required when framework is `mindspeed-rl`."
    )

    @field_validator("framework")
    @classmethod
    def _registered(cls, name: str) -> str:
        names = RegisteredFrameworks.names()
        if name not in names:
            raise _problem(f"must be one of {', '.join(map(_shown, names))}; got {_shown(name)}")
        return name

    @field_validator("hf_endpoint")
    @classmethod
    def _mirror(cls, url: str) -> str:
        return values.mirror_endpoint(url)

    @field_validator("overrides")
    @classmethod
    def _no_credentials(cls, overrides: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        found = values.credentials_in_overrides(overrides)
        # verl and MindSpeed-RL hand the overrides to Hydra, OpenRLHF to argparse, each on a command line.
        framework = info.data.get("framework")
        facts = RegisteredFrameworks.facts(framework) if framework is not None else None
        found += values.option_like_overrides(overrides, facts is not None and facts.overrides_on_command_line)
        found += values.non_finite_text(overrides)
        if facts is None or not facts.checks_override_sizes:  # else its adapter checks them with the cluster's
            found += values.non_positive_sizes(overrides)
        if found:
            raise _Problems(*sorted(dict(found).items()))
        return overrides

    @model_validator(mode="after")
    def _reward_server_of_openrlhf_only(self) -> TrainingConfig:
        # The other frameworks' settings may stay while switching between frameworks; a reward server, though, is a
        # process the user expects on the head, and no other framework starts one.
        if self.framework != "openrlhf" and self.openrlhf.reward_server is not None:
            raise _problem(
                f"applies to framework \"openrlhf\" only (it starts OpenRLHF's remote reward server before the job); "
                f"framework is {_shown(self.framework)}, which would never start it: remove it, or set framework: "
                "openrlhf",
                "openrlhf", "rewardServer",
            )
        return self

    @field_validator("custom")
    @classmethod
    def _custom_needs_entrypoint(cls, custom: CustomConfig | None, info: ValidationInfo) -> CustomConfig | None:
        if custom is None and info.data.get("framework") == "custom":
            raise _problem(
                "required when framework is `custom`: the shell command submitted as the Ray job; got nothing",
                "entrypoint",
            )
        return custom

    @field_validator("mindspeed_rl")
    @classmethod
    def _mindspeed_rl_needs_paths(
        cls, settings: MindSpeedRlConfig | None, info: ValidationInfo
    ) -> MindSpeedRlConfig | None:
        if settings is None and info.data.get("framework") == "mindspeed-rl":
            raise _problem(
                "required when framework is `mindspeed-rl`: at least tokenizerPath, dataPath and loadPath (absolute "
                "paths on every node); got nothing",
                # An unset field is reported under its Python name: name the key as the user writes it.
                "..",
                "mindspeedRl",
            )
        return settings
