"""MindSpeed-RL (GRPO on Ascend NPUs, seed 002): MindSpeed-RL with MindSpeed, Megatron-LM's `megatron/` and
MindSpeed-LLM placed beside it on every node (or an image that already has them), and `cli/train_grpo.py`
submitted to the running Ray cluster with Hydra overrides sized from the cluster; the plan-time checks live in
mindspeed_rl_checks.py. Sources for every fact used here: docs/mindspeed-rl.md.

The cluster shape's `gpus_per_node` is the NPU count per node on Ascend hosts (the accelerator layer passes it
there); MindSpeed-RL asks Ray for bundles of `{"NPU": 1, "CPU": num_cpus_for_placement_group}`, so the Ray nodes
must offer a custom resource named exactly `NPU`.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from typing import Any, ClassVar

from infra.config import DEFAULT_MSRL_REF, ContainerConfig, MindSpeedPin, MindSpeedRlConfig, TrainingConfig
from infra.frameworks import mindspeed_rl_checks as checks
from infra.frameworks.base import (
    RESUME_VARIABLE,
    WHERE_FROM_ONLY,
    Checkpoints,
    ClusterShape,
    CodeSpec,
    FrameworkFacts,
    JobSpec,
    bare_key,
    checkpoints,
    flatten,
    github_archive_url,
    image_facts,
    job_id,
    key,
    merged_overrides,
    resume_of,
)
from infra.frameworks.mindspeed_rl_checks import (
    CHECKS,
    DATA,
    EXAMPLES,
    INTEGRATED,
    LOAD,
    NUM_NPUS,
    RESUME_KEYS,
    SAVE,
    SAVE_INTERVAL,
    TOKENIZER,
    TRAIN_ITERS,
    Value,
    whole,
)
from infra.frameworks.verl import hydra_value

DEFAULT_SAVE_INTERVAL = 10  # training.checkpointEvery null, as verl's and OpenRLHF's
ENTRY_SCRIPT = "cli/train_grpo.py"  # MindSpeed-RL@62e9928:cli/train_grpo.py (@hydra.main, configs/)
SOURCES_DIR_NAME = "mindspeed-rl-sources"  # beside code_dir: the three checkouts whose packages are copied in
# see verified-facts#mindspeed-rl-train-grpo
PLACED_PACKAGES = ("mindspeed", "megatron", "mindspeed_llm")
CODE_SCRIPTS = ("fetch_code.sh", "mindspeed_rl_code.sh")

# Values MindSpeed-RL's own launch script exports before `ray start` on every node; they must reach the raylets
# (the Ray/accelerator layer's business), not the job (examples/grpo/grpo_trainer_qwen25_7b.sh at 2.0.0;
# jemalloc: docs/install_guide.md).
# see verified-facts#mindspeed-rl-grpo-trainer-qwen25-7b
NODE_ENV_EXPECTED = {
    "LD_PRELOAD": "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2 (arm64)",
    "TASK_QUEUE_ENABLE": "2",
    "HCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME": "the node's NIC",
    "RAY_DEDUP_LOGS": "0",
}

# What MindSpeed-RL 2.0.0 needs in the container beside CANN (docs/install_guide.md,
# 149-165 at 2.0.0; seed 002 "安装环境"): torch and torch_npu 2.5.1, apex for Ascend, vLLM v0.7.3 and vllm-ascend
# v0.7.3-dev, and jemalloc (Ray's memory; ray_common.sh preloads it). Python module names, then the library.
# see verified-facts#mindspeed-rl-install-guide
RUNTIME_MODULES = ("torch", "torch_npu", "apex", "vllm", "vllm_ascend")
JEMALLOC = "libjemalloc.so.2"
JEMALLOC_DIRS = ("/usr/lib/aarch64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/local/lib", "/usr/lib64")
# The bare CANN base image (seed 002 pulls it, then installs the runtime above by hand): CANN alone. No public image
# with MindSpeed-RL 2.0.0's runtime is documented (the official MindSpeed-RL images are for 2.2.0 only, with CANN
# 8.3.RC1 and vLLM 0.9.1: docs/mindspeed-rl.md), and apex for Ascend has no published wheel (built from
# gitcode.com/Ascend/apex), so the program does not build the runtime on the nodes: it refuses this image.
BARE_CANN_IMAGE = re.compile(r"(?:^|/)ascendhub/cann(?::|@|$)")

_GITCODE_ASCEND = re.compile(r"^https://gitcode\.com/Ascend/([\w.-]+?)(?:\.git)?/?$")


def pin_archive_url(repo: str, ref: str, explicit: str | None) -> str | None:
    """The user's archive, else GitHub's archive of the ref: of the repo itself, or of the GitHub mirror
    (github.com/Ascend/<name>) for an Ascend repo on gitcode; the mirror carries the same commits."""
    if explicit:
        return explicit
    match = _GITCODE_ASCEND.match(repo)
    if match:
        return f"https://github.com/Ascend/{match.group(1)}/archive/{ref}.tar.gz"
    return github_archive_url(repo, ref)


class MindSpeedRlAdapter(FrameworkFacts):
    name = "mindspeed-rl"
    accelerators: ClassVar[tuple[str, ...]] = ("ascend",)
    # MindSpeed-RL 2.0.0 logs "iteration: N / M | ..." once per step (see verified-facts#base-loggers).
    first_step_pattern = "iteration: [0-9]+ / [0-9]+ [|]"
    overrides_on_command_line = True  # Hydra
    checks_override_sizes = True  # with the cluster's sizes (mindspeed_rl_checks.py)

    def __init__(self, training: TrainingConfig, container: ContainerConfig):
        if training.mindspeed_rl is None:  # TrainingConfig already refuses this; kept for direct callers
            raise ValueError(f"{key('training.mindspeedRl')}: required when framework is `mindspeed-rl`; got nothing")
        self.training = training
        self.container = container
        self.msrl: MindSpeedRlConfig = training.mindspeed_rl

    # ------------------------------------------------------------------------------------------------ code
    @property
    def sources_dir(self) -> str:
        return posixpath.join(posixpath.dirname(self.msrl.code_dir.rstrip("/")) or "/", SOURCES_DIR_NAME)

    def code(self) -> CodeSpec | None:
        if self.msrl.image_has_code:
            return None  # the image holds the placed code (seed 002 ends with `docker commit`); the head checks it
        pins = {
            "MINDSPEED": self.msrl.mindspeed,
            "MEGATRON": self.msrl.megatron,
            "MINDSPEED_LLM": self.msrl.mindspeed_llm,
        }
        extra: dict[str, str] = {
            "MSRL_SOURCES_DIR": self.sources_dir,
            "MSRL_ANTLR_REQUIREMENT": self.msrl.antlr_requirement,
            "MSRL_IMAGE": self.container.image,
            "MSRL_RUNTIME_MODULES": " ".join(RUNTIME_MODULES),
        }
        for prefix, pin in pins.items():
            extra[f"{prefix}_REPO"] = pin.repo
            extra[f"{prefix}_REF"] = pin.ref
            extra[f"{prefix}_ARCHIVE_URL"] = pin_archive_url(pin.repo, pin.ref, pin.archive_url) or ""
            extra[f"{prefix}_MIRROR_REPO"] = pin.mirror_repo or ""
        # fetch_code.sh checks out MindSpeed-RL itself and installs nothing: mindspeed_rl_code.sh installs the
        # requirements after the placement, in the install guide's order.
        return CodeSpec(
            repo=self.msrl.repo,
            ref=self.msrl.ref,
            archive_url=pin_archive_url(self.msrl.repo, self.msrl.ref, self.msrl.archive_url),
            code_dir=self.msrl.code_dir,
            requirements_file=None,
            pip_index_url=self.msrl.pip_index_url,
            install_editable=False,
            extra_packages="",
            scripts=CODE_SCRIPTS,
            extra_env=extra,
        )

    # -------------------------------------------------------------------------------------- configuration
    def example_values(self) -> dict[str, Any] | None:
        """The example's values, when known for the configured ref; None otherwise (then only the cluster's and
        the user's values are checked)."""
        if self.msrl.ref != DEFAULT_MSRL_REF:
            return None
        return EXAMPLES.get(self.msrl.example_config)

    def resume(self) -> bool:
        return resume_of(self.training, default=True)

    def save_dir(self, shape: ClusterShape) -> str:
        """training.mindspeedRl.savePath, else the job's own folder: one per stack when resuming (a changed
        configuration resumes there), one per configuration when starting fresh (training.resume: false)."""
        if self.msrl.save_path:
            return self.msrl.save_path
        leaf = "ckpt" if self.resume() else f"ckpt-{self.job_id(shape)}"
        return posixpath.join(shape.output_root(self.name), leaf)

    def save_interval(self) -> int | None:
        """training.checkpointEvery as actor_config.save_interval. MindSpeed-RL saves only at multiples of it
        (grpo_trainer_hybrid.py), so 0 (the final step only) is train_iters when known; None: unknown.
        See verified-facts#mindspeed-rl-grpo-trainer-hybrid."""
        every = self.training.checkpoint_every
        if every is None:
            return DEFAULT_SAVE_INTERVAL
        if every > 0:
            return every
        iters = (self.example_values() or {}).get(TRAIN_ITERS)
        user = flatten(self.training.overrides)
        iters = next((user[name] for name in (f"++{TRAIN_ITERS}", f"+{TRAIN_ITERS}", TRAIN_ITERS,
                                               "++actor_config.train_iters", "actor_config.train_iters")
                      if name in user), iters)
        return iters if isinstance(iters, int) and iters > 0 else None

    def cluster_overrides(self, shape: ClusterShape) -> dict[str, Any]:
        """What the cluster and training.mindspeedRl decide. `++` (Hydra's add-or-override) so that an example
        without one of these keys still takes it."""
        overrides: dict[str, Any] = {
            f"++{NUM_NPUS}": shape.total_gpus,
            f"++{TOKENIZER}": self.msrl.tokenizer_path,
            f"++{DATA}": self.msrl.data_path,
            f"++{LOAD}": self.msrl.load_path,
            f"++{SAVE}": self.save_dir(shape),
        }
        interval = self.save_interval()
        if interval is not None:
            overrides[f"++{SAVE_INTERVAL}"] = interval
        return overrides

    def effective_overrides(self, shape: ClusterShape) -> dict[str, Any]:
        return merged_overrides(self.cluster_overrides(shape), self.training.overrides)

    def arguments(self, shape: ClusterShape) -> list[str]:
        overrides = self.effective_overrides(shape)
        if self.checkpoints(shape).find:
            # The entrypoint adds actor_config.load itself: the base weights, or the checkpoint folder (resume).
            overrides.pop(f"++{LOAD}", None)
        return [f"{name}={hydra_value(value)}" for name, value in overrides.items()]

    def user_loads(self) -> bool:
        """training.overrides sets how the actor loads: the program then leaves checkpoint loading to it."""
        return any(bare_key(name) in RESUME_KEYS for name in flatten(self.training.overrides))

    def checkpoints(self, shape: ClusterShape) -> Checkpoints:
        interval = self.save_interval()
        every = (f"every {interval} iterations (actor_config.save_interval; MindSpeed-RL saves only at its "
                 "multiples)") if interval is not None else "as actor_config.save_interval says"
        directory = self.save_dir(shape)
        if self.user_loads():
            return Checkpoints("", directory, every, shape.shared_dir is not None, False,
                               f"as training.overrides says ({', '.join(RESUME_KEYS)})")
        return checkpoints(
            "megatron", shape, directory, every, self.resume(),
            "`actor_config.load=<savePath>` with finetune, no_load_optim and no_load_rng false, the iteration "
            "written into latest_checkpointed_iteration.txt (the reference keeps loadPath's weights: "
            "rl_config.integrated_mode_config.ref_model_load_path; complete: iter_N/mp_rank_* up to the "
            "iteration Megatron's tracker names)",
        )

    def resume_command(self, shape: ClusterShape) -> str:
        """The entrypoint's first part when a resume is possible: sets the Hydra arguments the command ends with.
        Fresh: actor_config.load is the base weights (loadPath). Resuming from `<save>/iter_<N>` (the job step
        found it; a path of [A-Za-z0-9._/-], checked there): Megatron loads the iteration its tracker file names
        (Megatron-LM core_r0.8.0 megatron/training/checkpointing.py), so the tracker is pointed at N;
        the actor loads with its optimizer and RNG states (not as a fine-tune, which would restart at
        iteration 0: integrated_worker.py restores the caller's args), and the integrated worker's
        reference keeps loading the base weights (integrated_worker.py; docs/features/
        integrated_worker.md at the pinned ref). See verified-facts#mindspeed-rl-checkpointing."""
        var = RESUME_VARIABLE
        save = self.save_dir(shape)
        fresh = shlex.quote(f"++{LOAD}={hydra_value(self.msrl.load_path)}")
        resumed = [f"++{LOAD}={hydra_value(save)}", "++actor_config.finetune=false",
                   "++actor_config.no_load_optim=false", "++actor_config.no_load_rng=false"]
        if self.values(shape).get(INTEGRATED, Value(False, "")).value is True:
            resumed.append(f"++rl_config.integrated_mode_config.ref_model_load_path="
                           f"{hydra_value(self.msrl.load_path)}")
        tracker = shlex.quote(posixpath.join(save, "latest_checkpointed_iteration.txt"))
        return (
            f'if [ -n "${{{var}:-}}" ]; then iteration=${{{var}##*/iter_}}; '
            f'printf %d "$((10#$iteration))" >{tracker} || '
            f'{{ echo "roll-cluster: could not write "{tracker} >&2; exit 2; }}; '
            f'echo "roll-cluster: MindSpeed-RL resumes from ${{{var}}}"; '
            f'set -- {" ".join(shlex.quote(argument) for argument in resumed)}; else set -- {fresh}; fi; '
        )

    def values(self, shape: ClusterShape) -> dict[str, Value]:
        """Every known value by its Hydra key, with where it comes from (the user's keys win)."""
        values: dict[str, Value] = {}
        for name, value in (self.example_values() or {}).items():
            values[name] = Value(value, "example")
        for name, value in self.cluster_overrides(shape).items():
            values[bare_key(name)] = Value(value, "cluster")
        for name, value in flatten(self.training.overrides).items():
            if not name.startswith("~"):
                values[bare_key(name)] = Value(value, "override")
        return values

    # ------------------------------------------------------------------------------------------------- job
    def runtime_env(self) -> dict[str, Any]:
        # MindSpeed-RL's driver calls ray.init(runtime_env=configs/envs/runtime_env.yaml); Ray merges that with the
        # job's runtime env and raises on a key set by both, so the job sets only PYTHONPATH, which no
        # MindSpeed-RL runtime_env.yaml sets. `${PYTHONPATH}` keeps what the node has (CANN's set_env.sh adds to it).
        return {"env_vars": {"PYTHONPATH": f"{self.msrl.code_dir}:${{PYTHONPATH}}"}}

    def entrypoint(self, shape: ClusterShape) -> str:
        code_dir = shlex.quote(self.msrl.code_dir)
        arguments = " ".join(shlex.quote(argument) for argument in self.arguments(shape))
        # The driver runs from MindSpeed-RL's root, as upstream's launch script does; RAY_OVERRIDE_JOB_RUNTIME_ENV
        # lets the driver's runtime env win should a later MindSpeed-RL ever set PYTHONPATH itself.
        command = (
            f"cd {code_dir} && export HYDRA_FULL_ERROR=1 RAY_OVERRIDE_JOB_RUNTIME_ENV=1 "
            f'PYTHONPATH={code_dir}"${{PYTHONPATH:+:$PYTHONPATH}}" && '
            f"python3 {ENTRY_SCRIPT} --config-name {shlex.quote(self.msrl.example_config)} {arguments}"
        )
        if not self.checkpoints(shape).find:
            return command
        return f'{self.resume_command(shape)}{command} "$@"'


    def pre_submit_check(self) -> str:
        """On the head, in the container, before submission: the placed code and the example are there (an image
        that claims to have the code is checked here too). That Ray offers the NPUs is the readiness gate's job."""
        code_dir = self.msrl.code_dir
        needed = [
            posixpath.join(code_dir, ENTRY_SCRIPT),
            posixpath.join(code_dir, "configs", f"{self.msrl.example_config}.yaml"),
        ]
        dirs = [posixpath.join(code_dir, name) for name in ("mindspeed_rl", *PLACED_PACKAGES)]
        where = "the image (training.mindspeedRl.imageHasCode is true)" if self.msrl.image_has_code else "the code step"
        tests = " && ".join(
            [*(f"test -f {shlex.quote(p)}" for p in needed), *(f"test -d {shlex.quote(d)}" for d in dirs)]
        )
        missing = (
            f"MindSpeed-RL is incomplete in {code_dir}: expected {', '.join(needed + dirs)} from {where}; "
            "see training.mindspeedRl.codeDir and exampleConfig"
        )
        return f"{self.runtime_check()} && {{ {tests} || {{ echo {shlex.quote(missing)} >&2; exit 1; }}; }}"

    def runtime_check(self) -> str:
        """In the container: MindSpeed-RL's runtime is installed (found, not imported: importing torch_npu needs
        CANN's environment, which the job has and a bare `docker exec` may not). Also the code step's first part."""
        probe = (
            "import importlib.util, sys; missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]; "
            "print(' '.join(missing)); sys.exit(1 if missing else 0)"
        )
        lacks = (
            f"{key('container.image')} {self.container.image} lacks MindSpeed-RL's runtime: "
            f"{', '.join(RUNTIME_MODULES)} and {JEMALLOC} are needed (docs/ascend.md)"
        )
        # jemalloc where ray_common.sh's add_jemalloc_preload looks (JEMALLOC_CANDIDATES there).
        candidates = " ".join(f"{d}/{JEMALLOC}" for d in JEMALLOC_DIRS)
        return (
            f"{{ python3 -c {shlex.quote(probe)} {' '.join(RUNTIME_MODULES)} >/dev/null && "
            f"( for f in ${{JEMALLOC_CANDIDATES:-{candidates}}}; do test -e \"$f\" && exit 0; done; exit 1 ); }} "
            f"|| {{ echo {shlex.quote(lacks)} >&2; exit 1; }}"
        )

    def image_problem(self) -> str | None:
        if not BARE_CANN_IMAGE.search(self.container.image.split("@", 1)[0]):
            return None
        return (
            f"{key('container.image')}: the bare CANN base image has none of MindSpeed-RL's runtime "
            f"({', '.join(RUNTIME_MODULES)}, {JEMALLOC}); build an image from it that adds them (seed 002's steps: "
            "docs/ascend.md) and name that image here; got " + repr(self.container.image)
        )

    @staticmethod
    def where_from_only() -> dict[str, Any]:
        """The settings of where the code comes from, also inside the three pins: not part of the job's id."""
        pin_fields = {name: True for name in WHERE_FROM_ONLY if name in MindSpeedPin.model_fields}
        return {
            **{name: True for name in WHERE_FROM_ONLY},
            **{pin: pin_fields for pin in ("mindspeed", "megatron", "mindspeed_llm")},
        }

    def job_id(self, shape: ClusterShape) -> str:
        configuration = {
            "mindspeed_rl": self.msrl.model_dump(mode="json", exclude=self.where_from_only()),
            "overrides": self.training.overrides,
            **image_facts(self.container),
        }
        return job_id(self.name, shape, configuration)

    def job(self, shape: ClusterShape) -> JobSpec:
        entrypoint = self.entrypoint(shape)
        check = self.pre_submit_check()
        return JobSpec(
            job_id=self.job_id(shape),
            workdir=self.msrl.code_dir,
            entrypoint=entrypoint,
            runtime_env=self.runtime_env(),
            files={},
            prepare=None,
            pre_submit_check=check,
            reward_server=None,
            summary=self.summary(shape, entrypoint, check),
            checkpoints=self.checkpoints(shape),
        )

    def summary(self, shape: ClusterShape, entrypoint: str, check: str) -> dict[str, Any]:
        values = self.values(shape)
        npus = values[NUM_NPUS].value
        cpus = whole(values, "rl_config.num_cpus_for_placement_group")
        per_node = min(shape.gpus_per_node, npus) if isinstance(npus, int) and shape.gpus_per_node else None
        code: dict[str, Any] = {"dir": self.msrl.code_dir, "image_has_code": self.msrl.image_has_code}
        if not self.msrl.image_has_code:
            code.update({
                "MindSpeed-RL": f"{self.msrl.repo}@{self.msrl.ref}",
                "placed": {
                    "mindspeed": f"{self.msrl.mindspeed.repo}@{self.msrl.mindspeed.ref}",
                    "megatron": f"{self.msrl.megatron.repo}@{self.msrl.megatron.ref}",
                    "mindspeed_llm": f"{self.msrl.mindspeed_llm.repo}@{self.msrl.mindspeed_llm.ref}",
                },
                "sources_dir": self.sources_dir,
                "scripts": list(CODE_SCRIPTS),
            })
        return {
            "framework": self.name,
            "cluster": shape.facts(),
            "code": code,
            "example_config": f"configs/{self.msrl.example_config}.yaml",
            "example_values_known": self.example_values() is not None,
            "hydra_overrides": self.arguments(shape),
            "overrides": self.training.overrides,
            "command": entrypoint,
            "runtime_env": self.runtime_env(),
            "ray_resources_expected": {
                "NPU": f"{shape.gpus_per_node} per node (custom resource named NPU)",
                "CPU": f">= {per_node} x {cpus} + 2 per node (placement bundles, the train task, a rule reward)"
                if per_node is not None and cpus is not None
                else "unknown",
            },
            "runtime_expected": {
                "image": self.container.image,
                "needs": [*RUNTIME_MODULES, JEMALLOC],
                "checked": "by the code step before any download, and before submission (docs/ascend.md)",
            },
            "node_env_expected": dict(NODE_ENV_EXPECTED),
            "checks": list(CHECKS),
            "pre_submit_check": check,
            "warnings": self.warnings(shape),
        }

    def warnings(self, shape: ClusterShape) -> list[str]:
        notes: list[str] = []
        if self.example_values() is None:
            notes.append(
                f"the values of {self.msrl.example_config}.yaml at ref {self.msrl.ref} are not known here: only the "
                "cluster's and training.overrides' values are checked before deployment"
            )
        npus = self.values(shape)[NUM_NPUS].value
        if isinstance(npus, int) and 0 < npus < shape.total_gpus:
            idle = shape.total_gpus - npus
            notes.append(f"{NUM_NPUS} is {npus}: {idle} of the cluster's {shape.total_gpus} NPUs stay idle")
        return notes

    # ------------------------------------------------------------------------------------------ local checks
    def problems(self, shape: ClusterShape) -> list[str]:
        """What MindSpeed-RL would refuse (or wait on forever) with these values on this cluster, by key."""
        image = self.image_problem()
        return ([image] if image else []) + checks.Checker(self.values(shape), self.msrl.example_config,
                                                           shape).problems()
