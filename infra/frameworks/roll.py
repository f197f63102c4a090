"""ROLL: the checkout and its requirements on every node, the training YAML built on the machine that runs
`pulumi up` from the base example of the pinned ref (roll_sources.py, roll_compose.py, roll_render.py), checked
there against ROLL's own rules (roll_checks.py, roll_keys.py), shipped to the head as a file under examples/,
and the launcher submitted from the repo root (verified-facts#roll-roll)."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks import roll_checks, roll_images, roll_keys, roll_render, roll_sources
from infra.frameworks.base import (
    RESUME_VARIABLE,
    WHERE_FROM_ONLY,
    Checkpoints,
    ClusterShape,
    CodeSpec,
    FrameworkFacts,
    JobSpec,
    ModelRef,
    checkpoints,
    every_steps,
    github_archive_url,
    hub_models,
    image_facts,
    job_id,
    job_name,
    key,
    resume_of,
)
from infra.frameworks.roll_compose import ComposeError, compose, deep_merge

ROLL_DIR = "/workspace/ROLL"
# WebShop (custom_envs env_type `webshop`): ROLL's git submodule at the pinned ref 8eb27cc (.gitmodules:1-3, the
# gitlink third_party/webshop-minimal -> ec82552), set up by the code step (infra/scripts/roll_env_setup.sh) when
# the rendered config uses it. UNCONFIRMED for another training.roll.ref: a git checkout gets that ref's own
# submodule commit; only the archive fallback takes this one.
WEBSHOP_ENV_TYPE = "webshop"
WEBSHOP_DIR = "third_party/webshop-minimal"
WEBSHOP_REPO = "https://github.com/ZihanWang314/webshop-minimal.git"
WEBSHOP_COMMIT = "ec82552d2458efb486701b138c9d038e1759489c"
WEBSHOP_SPACY_MODEL = "en_core_web_sm"
ENV_SETUP_SCRIPTS = ("fetch_code.sh", "roll_env_setup.sh")
GENERATED_DIR = "examples/pulumi"  # under examples/, where the launchers' --config_path is resolved (roll.md 2.2)

# The requirements file that matches each ROLL image (roll.md 1.2), by the tag's torch/engine part.
REQUIREMENTS_BY_IMAGE_TAG: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"torch260-vllm"), "requirements_torch260_vllm.txt"),
    (re.compile(r"torch260-sglang"), "requirements_torch260_sglang.txt"),
    (re.compile(r"torch280-vllm"), "requirements_torch280_vllm.txt"),
    (re.compile(r"torch2100"), "requirements_torch2100_vllm.txt"),
)


def image_tag(image: str) -> str:
    reference = image.split("@", 1)[0]
    last = reference.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def requirements_for_image(image: str) -> str | None:
    tag = image_tag(image)
    return next((name for pattern, name in REQUIREMENTS_BY_IMAGE_TAG if pattern.search(tag)), None)


# ROLL's download_model (roll/utils/checkpoint_manager.py): a directory is used as it is, anything else goes
# to the snapshot_download of MODEL_DOWNLOAD_TYPE, ModelScope's unless set (the YAML's model_download_type
# sets it, roll/configs/base_config.py): huggingface_hub's or ModelScope's, with
# local_dir None, i.e. into the client's cache.
# see verified-facts#roll-checkpoint-manager
ROLL_HUBS = {"MODELSCOPE": "modelscope", "HUGGINGFACE_HUB": "huggingface"}


def models(config: dict[str, Any]) -> tuple[ModelRef, ...]:
    """The models ROLL's workers download: `pretrain`, `reward_pretrain` and every worker's
    model_args.model_name_or_path (which default to them, roll/configs/base_config.py). Another download
    type (OPENLM_HUB in ROLL's tests) is not one roll-cluster can fetch: nothing.
    See verified-facts#roll-base-config."""
    hub = ROLL_HUBS.get(str(config.get("model_download_type") or "MODELSCOPE"))
    if hub is None:
        return ()
    names = [config.get("pretrain"), config.get("reward_pretrain")]
    names += [(section.get("model_args") or {}).get("model_name_or_path") for _, section in roll_render.workers(config)]
    return hub_models(hub, names)


def config_name(stack: str, base_config: str) -> str:
    """The generated file's name under examples/pulumi/ (Hydra's --config_name): stack and base example."""
    stem = posixpath.splitext(posixpath.basename(base_config))[0]
    return re.sub(r"[^A-Za-z0-9_-]+", "_", f"{stack}-{stem}")


@dataclass(frozen=True)
class Built:
    """The configuration for one cluster shape: the YAML text shipped to the head, or the problems that stop it."""

    text: str | None
    rendered: roll_render.Rendered | None
    problems: list[str]
    warnings: list[str]
    source: str  # where the base files were read
    files: list[str]  # the examples/ files that were read: the base, then what its defaults pull in


class RollAdapter(FrameworkFacts):
    name = "roll"
    # ROLL 8eb27cc logs "pipeline step N finished" at the end of every step, agentic and RLVR pipelines alike
    # (see verified-facts#base-agentic-pipeline).
    first_step_pattern = "pipeline step [0-9]+ finished"
    prefetches_models = True
    # ROLL's default download type is ModelScope's; a YAML model_download_type may say otherwise (see
    # verified-facts#model-cache-checkpoint-manager).
    own_hub = "modelscope"
    cluster_keys: ClassVar[tuple[tuple[str, str], ...]] = (("num_gpus_per_node", "gpus_per_node"),)

    def __init__(
        self, training: TrainingConfig, container: ContainerConfig, examples: roll_sources.Examples | None = None
    ):
        """examples: where the base configs are read (default: roll_sources.resolve(training.roll), on first use)."""
        self.training = training
        self.container = container
        self.roll = training.roll
        self._examples = examples
        self._built: dict[tuple[Any, ...], Built] = {}

    # ------------------------------------------------------------------------------------------------ code
    def requirements_file(self) -> str | None:
        return self.roll.requirements_file or requirements_for_image(self.container.image)

    def requirements_problem(self) -> str | None:
        if self.requirements_file() is not None:
            return None
        known = ", ".join(pattern.pattern for pattern, _ in REQUIREMENTS_BY_IMAGE_TAG)
        return (
            f"{key('container.image')}: no ROLL requirements file is known for the tag "
            f"{image_tag(self.container.image)!r} "
            f"(known: {known}); set {key('training.roll.requirementsFile')} to the file in the ROLL checkout that "
            f"matches the image; got image {self.container.image!r}"
        )

    def webshop_envs(self) -> list[str]:
        """The custom_envs of the configuration (base and overrides) whose env_type is webshop; the cluster's size
        does not change them. A base that cannot be read gives none (problems() reports it)."""
        try:
            examples = self._examples or roll_sources.resolve(self.roll)
            self._examples = examples
            composed, _ = compose(examples.read, self.roll.base_config)
            config = deep_merge(composed, roll_render.expand_dotted(self.training.overrides))
        except (FileNotFoundError, ComposeError, roll_sources.RollSourceError, roll_render.RenderError):
            return []
        return [name for name, env_type in roll_checks.env_types(config).items() if env_type == WEBSHOP_ENV_TYPE]

    def environment_setup(self) -> list[str]:
        """What the code step sets up for the configuration's environments, for the plan (empty: nothing)."""
        envs = self.webshop_envs()
        if not envs:
            return []
        return [
            f"WebShop (custom_envs {', '.join(envs)}): the code step sets up what ROLL's run script does by hand "
            "(examples/qwen2.5-7B-agentic_megatron/run_agentic_pipeline_webshop.sh:2,6-7): ROLL's submodule "
            f"{WEBSHOP_DIR} ({WEBSHOP_REPO}@{WEBSHOP_COMMIT[:7]}; fetched when the checkout came from the archive), "
            f"`pip install -r {WEBSHOP_DIR}/requirements.txt` and `python -m spacy download {WEBSHOP_SPACY_MODEL}`"
            "; its search engine (pyserini) needs the Java runtime ROLL's images have (checked there)"
        ]

    def code(self) -> CodeSpec:
        problem = self.requirements_problem()
        if problem is not None:
            raise ValueError(problem)
        setup: dict[str, Any] = {}
        if self.webshop_envs():
            setup = {
                "scripts": ENV_SETUP_SCRIPTS,
                "extra_env": {
                    "WEBSHOP_DIR": WEBSHOP_DIR,
                    "WEBSHOP_REPO": WEBSHOP_REPO,
                    "WEBSHOP_COMMIT": WEBSHOP_COMMIT,
                    "WEBSHOP_ARCHIVE_URL": github_archive_url(WEBSHOP_REPO, WEBSHOP_COMMIT) or "",
                    "WEBSHOP_SPACY_MODEL": WEBSHOP_SPACY_MODEL,
                    "WEBSHOP_IMAGE": self.container.image,
                },
            }
        return CodeSpec(
            repo=self.roll.repo,
            ref=self.roll.ref,
            archive_url=self.roll.archive_url or github_archive_url(self.roll.repo, self.roll.ref),
            mirror_repo=self.roll.mirror_repo,
            code_dir=ROLL_DIR,
            requirements_file=self.requirements_file(),
            pip_index_url=self.roll.pip_index_url,
            install_editable=True,
            extra_packages="",
            **setup,
        )

    # ------------------------------------------------------------------------------------------ the config
    def build(self, shape: ClusterShape) -> Built:
        """Compose, render and check the YAML for this shape (once per shape; the head's IP does not matter)."""
        cache_key = tuple(sorted(shape.facts().items()))
        if cache_key not in self._built:
            self._built[cache_key] = self._build(shape)
        return self._built[cache_key]

    def _build(self, shape: ClusterShape) -> Built:
        base = self.roll.base_config
        try:
            examples = self._examples or roll_sources.resolve(self.roll)
            self._examples = examples
        except roll_sources.RollSourceError as error:
            return Built(None, None, [str(error)], [], "", [])
        try:
            composed, files = compose(examples.read, base)
        except FileNotFoundError:
            return Built(None, None, [roll_sources.missing_base_message(examples, base, self.roll.ref)], [],
                         examples.where, [])
        except (ComposeError, roll_sources.RollSourceError) as error:
            return Built(None, None, [f"{key('training.roll.baseConfig')}: {error}"], [], examples.where, [])
        keys = roll_keys.load_roll_keys()
        cluster = replace(
            roll_render.Cluster.of(shape), checkpoint_dir=self.checkpoint_dir(shape), resume=self.resume(),
            checkpoint_every=self.training.checkpoint_every,
        )
        try:
            overrides = roll_render.expand_dotted(self.training.overrides)
        except roll_render.RenderError as error:
            return Built(None, None, [f"{key('training.overrides')}: {error}"], [], examples.where, files)
        rendered = roll_render.render_roll_config(composed, cluster, overrides, keys, self.roll.pipeline)
        result = roll_checks.check(rendered.config, cluster, self.roll.pipeline, keys)
        kept = self.keep_base_mappings(composed, cluster, overrides, keys, result)
        if kept is not None:
            rendered, result = kept
        overridden = roll_render.leaf_keys(overrides)
        problems = [self.user_message(p, overridden) for p in result.errors]
        warnings = rendered.notes + [self.user_message(p, overridden) for p in result.warnings]
        # A cluster of another size than the base's changes training: said in the plan, not corrected (F7).
        warnings += roll_checks.scaling(composed, rendered.config, cluster, self.roll.pipeline)
        text = rendered.yaml_text(
            roll_render.header(base, self.roll.ref, cluster, self.training.overrides, rendered)
        )
        return Built(None if problems else text, rendered, problems, warnings, examples.where, files)

    def keep_base_mappings(
        self,
        composed: dict[str, Any],
        cluster: roll_render.Cluster,
        overrides: dict[str, Any],
        keys: roll_keys.RollKeys,
        resized: roll_checks.CheckResult,
    ) -> tuple[roll_render.Rendered, roll_checks.CheckResult] | None:
        """The base's own device mappings, when resizing them to the cluster breaks a rule ROLL enforces that the
        base's own sizes keep (a rollout batch smaller than the new data-parallel size, a model parallelism that
        does not divide the new GPU count) and the base fits on the cluster: training then runs as the example
        says, on fewer GPUs, and the plan says which GPUs stay idle and why (never a silent change of batch
        sizes). None: the resized render stands."""
        span = roll_checks.span(composed)
        if not resized.errors or not span or not roll_render.is_contiguous_from_zero(sorted(span)):
            return None
        if len(span) >= cluster.total_gpus:
            return None  # the same size (nothing was resized) or larger than the cluster (nothing to keep)
        placeholder = "resizing breaks a rule of ROLL"
        kept = roll_render.render_roll_config(composed, cluster, overrides, keys, self.roll.pipeline,
                                              keep_mappings=placeholder)
        result = roll_checks.check(kept.config, cluster, self.roll.pipeline, keys)
        if not set(result.errors) < set(resized.errors):
            return None  # resizing is not what breaks it: the resized render's problems are the ones to fix
        broken = "; ".join(f"{p.key}: {p.message}" for p in resized.errors if p not in result.errors)
        reason = (
            f"kept as in the base (GPUs 0-{len(span) - 1}, sized for {len(span)}): resized to the cluster's "
            f"{cluster.total_gpus} GPUs they break a rule ROLL enforces ({broken}); training runs as in the base"
        )
        kept = roll_render.render_roll_config(composed, cluster, overrides, keys, self.roll.pipeline,
                                              keep_mappings=reason)
        kept.notes.insert(0, f"every device_mapping {reason}")
        return kept, result

    def user_message(self, problem: roll_checks.Problem, overridden: set[str]) -> str:
        """A problem of the YAML as the user fixes it: the `training.overrides` key that sets that YAML key, and
        where the value came from when it is not an override."""
        name = key(f"training.overrides.{problem.key}") if problem.key else key("training.overrides")
        parts = problem.key.split(".")
        from_override = any(".".join(parts[:i]) in overridden for i in range(1, len(parts) + 1))
        if from_override:
            return f"{name}: {problem.message}"
        return (
            f"{name}: {problem.message} (the value of {key('training.roll.baseConfig')} "
            f"{self.roll.base_config} for {self.roll.pipeline}: set this key, or choose another base config)"
        )

    def resume(self) -> bool:
        return resume_of(self.training, default=True)

    def checkpoint_dir(self, shape: ClusterShape) -> str:
        """The job's checkpoint directory. Fresh starts (training.resume: false) get one per configuration,
        named by a digest of what the user configured (the YAML itself names this directory)."""
        configured = {
            "roll": self.roll.model_dump(mode="json", exclude={*WHERE_FROM_ONLY, "checkout"}),
            "overrides": self.training.overrides,
            **image_facts(self.container),
        }
        # One directory per job whatever the cluster size: ROLL 8eb27cc loads a checkpoint saved at another
        # data-parallel size (docs/verified-facts.md 5): FSDP2 through torch DCP (fsdp2_strategy.py),
        # Megatron weights per tensor/pipeline rank or dist_checkpointing (mcore_adapter checkpointing.py),
        # its optimizer through dist_checkpointing or per model-parallel rank (megatron_strategy.py), a
        # missing per-rank RNG file skipped (megatron_strategy.py). Tensor/pipeline sizes come from the config,
        # which names the directory. verl and OpenRLHF use one per GPU count.
        # see verified-facts#roll-fsdp2-strategy
        identity = job_name(self.name, shape, self.resume(), job_id(self.name, shape, configured),
                            per_world_size=False)
        return shape.checkpoint_dir(identity)

    # ------------------------------------------------------------------------------------------------- job
    def paths(self, shape: ClusterShape) -> dict[str, str]:
        name = config_name(shape.stack, self.roll.base_config)
        return {"name": name, "out": f"{GENERATED_DIR}/{name}.yaml"}

    def job(self, shape: ClusterShape) -> JobSpec:
        built = self.build(shape)
        if built.text is None:
            raise ValueError("; ".join(built.problems))
        paths = self.paths(shape)
        launcher = f"examples/start_{self.roll.pipeline}_pipeline.py"
        saves = self.checkpoints(shape, built)
        entrypoint = (
            f"cd {ROLL_DIR} && {roll_resume_command(paths['out']) + ' && ' if saves.find else ''}"
            f"PYTHONPATH={ROLL_DIR} python3 {launcher} "
            f"--config_path {GENERATED_DIR.rsplit('/', 1)[-1]} --config_name {shlex.quote(paths['name'])}"
        )
        # The config needs no other file; the launcher must be there (a checkout at another ref may lack it).
        check = (
            # The message is quoted as a whole: the ref is data, never shell text (docs/security.md).
            f"cd {ROLL_DIR} && test -f {shlex.quote(launcher)} || {{ echo "
            f"{shlex.quote(f'no {launcher} in {ROLL_DIR}: is the checkout at {self.roll.ref}?')} >&2; exit 1; }}"
        )
        configuration = {
            "roll": self.roll.model_dump(mode="json", exclude={*WHERE_FROM_ONLY, "checkout"}),
            "config": built.text,
            **image_facts(self.container),
        }
        return JobSpec(
            job_id=job_id(self.name, shape, configuration),
            workdir=ROLL_DIR,
            entrypoint=entrypoint,
            runtime_env=None,
            files={posixpath.join(ROLL_DIR, paths["out"]): built.text},
            prepare=None,
            pre_submit_check=check,
            reward_server=None,
            summary=self.summary(shape, built, paths, entrypoint),
            rendered_config=built.text,
            checkpoints=saves,
            models=models(built.rendered.config if built.rendered else {}),
        )

    def checkpoints(self, shape: ClusterShape, built: Built) -> Checkpoints:
        config = built.rendered.config if built.rendered else {}
        save_steps, max_steps = config.get("save_steps"), config.get("max_steps")
        if isinstance(save_steps, int) and isinstance(max_steps, int):
            every = every_steps(0 if save_steps >= max_steps else save_steps) + f" of {max_steps} (save_steps)"
        else:
            every = "as ROLL's save_steps says, and the final step"
        saving = config.get("checkpoint_config") or {}
        directory = str(saving.get("output_dir") or self.checkpoint_dir(shape))
        # ROLL saves into output_dir/<worker>/checkpoint-N, copies that to the directory above and deletes it
        # only when the copy succeeded (roll/utils/checkpoint_manager.py, which logs a failed copy and goes
        # on): a copy left there marks the step incomplete. keep_local_file (FSDP2's, fsdp2_strategy.py) keeps
        # every local copy: nothing can be told from them then.
        # see verified-facts#roll-checkpoint-manager-2
        output = config.get("output_dir")
        staging = str(output) if isinstance(output, str) and output.startswith("/") and \
            not saving.get("keep_local_file") else ""
        verified = f", and no copy of step N left under {staging}/*/ (a copy ROLL failed)" if staging else ""
        return checkpoints(
            "roll", shape, directory, every, self.resume(),
            "`resume_from_checkpoint: '<path>'` (written into the shipped YAML by the entrypoint; complete: "
            f"<run>/checkpoint-N/pipeline/worker_state_pipeline.json, ROLL's async_upload off{verified})",
            staging=staging,
        )

    def summary(self, shape: ClusterShape, built: Built, paths: dict[str, str], entrypoint: str) -> dict[str, Any]:
        rendered = built.rendered
        return {
            "framework": self.name,
            "cluster": shape.facts(),
            "code": {
                "repo": self.roll.repo,
                "ref": self.roll.ref,
                "dir": ROLL_DIR,
                "requirements_file": self.requirements_file(),
                "megatron_core": roll_images.megatron_core_note(image_tag(self.container.image)),
                "environment_setup": self.environment_setup(),
            },
            "pipeline": self.roll.pipeline,
            "base_config": f"examples/{self.roll.base_config}",
            "read_from": built.source,
            "files_read": [f"examples/{name}" for name in built.files],
            "generated_config": f"{ROLL_DIR}/{paths['out']}",
            "hardware_defaults": {
                "applied": rendered.applied if rendered else [],
                "kept": rendered.kept if rendered else [],
            },
            "overrides": self.training.overrides,
            "command": entrypoint,
            "checks": list(roll_checks.RULES),
            "check_warnings": built.warnings,
        }

    # ------------------------------------------------------------------------------------------ local checks
    def problems(self, shape: ClusterShape) -> list[str]:
        problems: list[str] = []
        requirement = self.requirements_problem()
        if requirement is not None:
            problems.append(requirement)
        image = self.image_problem(shape)
        if image is not None:
            problems.append(image)
        built = self.build(shape)
        return problems + built.problems + (self.rendered_problems(shape, built) if built.rendered else [])

    def image_problem(self, shape: ClusterShape) -> str | None:
        """On GPUs without bf16 (V100 sm70, T4 sm75) only ROLL's torch 2.6 / vLLM 0.8.4 image runs: torch 2.8's
        cu128 builds dropped sm70 (pytorch#157517), CUDA 13 (torch2100) dropped Volta, and ROLL 8eb27cc has no
        vLLM V0 executor for vLLM 0.12+ (roll/third_party/vllm/__init__.py) while V1 needs sm80 before
        vLLM 0.10.2 (verified-facts#roll-init). A tag of none of ROLL's known kinds is not judged."""
        tag = image_tag(self.container.image)
        if shape.bf16 or requirements_for_image(self.container.image) is None or "torch260-vllm084" in tag:
            return None
        return (
            f"{key('container.image')}: the GPUs have no bf16 (V100/T4) and ROLL's image {tag!r} does not run there "
            "(torch 2.8+/CUDA 13 builds dropped sm70, and ROLL's vLLM V0 engine, which these GPUs need, exists only "
            "up to vLLM 0.11); use a `...-torch260-vllm084` image; got "
            f"{self.container.image!r}"
        )

    def rendered_problems(self, shape: ClusterShape, built: Built) -> list[str]:
        """Rules on the final YAML that the program relies on (values set through training.overrides)."""
        assert built.rendered is not None
        config = built.rendered.config
        found: list[str] = []
        if config.get("resume_from_checkpoint") is True:
            found.append(
                f"{key('training.overrides.resume_from_checkpoint')}: `true` fails before the first step at ROLL "
                "8eb27cc (roll/configs/base_config.py:303-307 adds a new timestamp to checkpoint_config.output_dir, "
                "roll/utils/upload_utils.py:35-36 then lists that missing folder); leave it out (training.resume "
                "hands ROLL the newest complete checkpoint's path) or give a path; got true"
            )
        if shape.bf16:
            return found
        for name, worker in roll_render.workers(config):
            strategy_args = worker.get("strategy_args")
            if not isinstance(strategy_args, dict):
                continue
            strategy_config = strategy_args.get("strategy_config")
            strategy_config = strategy_config if isinstance(strategy_config, dict) else {}
            strategy = strategy_args.get("strategy_name")
            if strategy == "vllm" and str(strategy_config.get("VLLM_USE_V1", 0)) not in ("0", "False", "false"):
                found.append(
                    f"{key(f'training.overrides.{name}.strategy_args.strategy_config.VLLM_USE_V1')}: must be 0 on "
                    "GPUs without bf16 (vLLM 0.8.4's V1 engine needs compute capability 8.0; ROLL "
                    "roll/distributed/strategy/vllm_strategy.py:79-80); got "
                    f"{strategy_config.get('VLLM_USE_V1')!r}"
                )
            if strategy == "vllm":
                found += v0_budget_problems(name, strategy_config)
            if strategy in ("fsdp2_train", "fsdp2_infer"):
                for dtype in ("param_dtype", "reduce_dtype"):
                    if str(strategy_config.get(dtype, "")).lower() in ("bf16", "bfloat16"):
                        found.append(
                            f"{key(f'training.overrides.{name}.strategy_args.strategy_config.{dtype}')}: the GPUs "
                            f"have no bf16 (fp16 or fp32; ROLL fsdp2_strategy.py:68-90); got "
                            f"{strategy_config.get(dtype)!r}"
                        )
        return found


def v0_budget_problems(name: str, strategy_config: Mapping[str, Any]) -> list[str]:
    """vLLM 0.8.4's V0 scheduler refuses max_num_batched_tokens below max_model_len unless chunked prefill is on
    (vllm/config.py SchedulerConfig._verify_args), and turns chunked prefill on by itself only above 32,768 tokens
    (vllm/engine/arg_utils.py _set_default_args_v0); without max_model_len it takes the model's, which the plan
    cannot read (32,768 for Qwen2.5)."""
    prefix = f"training.overrides.{name}.strategy_args.strategy_config"
    if strategy_config.get("enable_chunked_prefill") is True:
        return []
    max_model_len = strategy_config.get("max_model_len")
    budget = roll_render.v0_token_budget(strategy_config)
    if not isinstance(max_model_len, int) or isinstance(max_model_len, bool) or max_model_len <= 0:
        return [
            f"{key(prefix + '.max_model_len')}: vLLM's V0 engine (GPUs without bf16) needs a max_model_len of at "
            f"most max_num_batched_tokens ({budget}, ROLL vllm_strategy.py:118), or enable_chunked_prefill: true; "
            "without it vLLM takes the model's (32768 for Qwen2.5) and refuses to start (vllm/config.py "
            f"SchedulerConfig._verify_args); got {max_model_len!r}"
        ]
    if max_model_len > budget:
        return [
            f"{key(prefix + '.max_num_batched_tokens')}: vLLM's V0 engine (GPUs without bf16) refuses "
            f"max_num_batched_tokens below max_model_len ({max_model_len}) without chunked prefill (vllm/config.py "
            f"SchedulerConfig._verify_args); raise it to at least {max_model_len}, lower max_model_len, or set "
            f"enable_chunked_prefill: true; got {budget}"
        ]
    return []


def roll_resume_command(yaml_path: str) -> str:
    """The entrypoint's first part when a resume is possible: the path the job step found (a path of
    [A-Za-z0-9._/-] only, checked there) replaces the rendered `resume_from_checkpoint: false` line of the shipped
    YAML, which the job step writes anew at every submission. ROLL takes a str as the checkpoint to load
    (roll/configs/base_config.py, roll/pipeline/base_pipeline.py); its launchers take no command-line
    overrides (verified-facts#roll-base-config-2)."""
    var = RESUME_VARIABLE
    wanted = f"resume_from_checkpoint: '${{{var}}}'"
    return (
        f'if [ -n "${{{var}:-}}" ]; then '
        rf'sed -i "s|^resume_from_checkpoint: false\$|{wanted}|" {yaml_path} && '
        f'grep -qxF "{wanted}" {yaml_path} || '
        f'{{ echo "roll-cluster: could not set resume_from_checkpoint in {yaml_path}" >&2; exit 2; }}; '
        f'echo "roll-cluster: ROLL resumes from ${{{var}}}"; fi'
    )
