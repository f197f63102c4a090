"""ROLL: the checkout and its requirements on every node, the training YAML rendered on the head from the base
example in that checkout (roll_render.py), and the launcher submitted from the repo root
(../shared/reference/roll.md sections 1-3 and 9)."""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.config import ContainerConfig, TrainingConfig
from infra.frameworks import roll_render
from infra.frameworks.base import (
    WHERE_FROM_ONLY,
    ClusterShape,
    CodeSpec,
    JobSpec,
    github_archive_url,
    image_facts,
    job_id,
    key,
)

ROLL_DIR = "/workspace/ROLL"
GENERATED_DIR = "examples/pulumi"  # a sibling of the example folders, so `../config/...` defaults still resolve
SUPPORT_DIR = f"{GENERATED_DIR}/.roll-cluster"
RENDERER_SOURCE = Path(roll_render.__file__)

# The requirements file that matches each ROLL image (roll.md 1.2), by the tag's torch/engine part.
REQUIREMENTS_BY_IMAGE_TAG: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"torch260-vllm"), "requirements_torch260_vllm.txt"),
    (re.compile(r"torch260-sglang"), "requirements_torch260_sglang.txt"),
    (re.compile(r"torch280-vllm"), "requirements_torch280_vllm.txt"),
    (re.compile(r"torch2100"), "requirements_torch2100_vllm.txt"),
)

CHECKS = (
    "every device_mapping within the cluster's GPUs; contiguous from 0 (warning, issue #205)",
    "rollout_batch_size % train_env_manager.group_size == 0",
    "val_batch_size % val_env_manager.group_size == 0",
    "val_batch_size % (val_env_manager.num_env_groups x group_size) == 0",
    "Megatron: rollout_batch_size % DP == 0, DP = len(actor_train.device_mapping) / (TP x PP x CP)",
    "actor_infer strategy is vllm or sglang",
    "response_length or sequence_length is set",
    "every `defaults:` file exists as seen from examples/pulumi/",
)


def image_tag(image: str) -> str:
    reference = image.split("@", 1)[0]
    last = reference.rsplit("/", 1)[-1]
    return last.split(":", 1)[1] if ":" in last else ""


def requirements_for_image(image: str) -> str | None:
    tag = image_tag(image)
    return next((name for pattern, name in REQUIREMENTS_BY_IMAGE_TAG if pattern.search(tag)), None)


def config_name(stack: str, base_config: str) -> str:
    """The generated file's name under examples/pulumi/ (Hydra's --config_name): stack and base example."""
    stem = posixpath.splitext(posixpath.basename(base_config))[0]
    return re.sub(r"[^A-Za-z0-9_-]+", "_", f"{stack}-{stem}")


class RollAdapter:
    name = "roll"

    def __init__(self, training: TrainingConfig, container: ContainerConfig, base_yaml_text: str | None = None):
        """base_yaml_text: the base example read from a local ROLL checkout, when there is one; the summary then
        shows the config exactly as the head will render it."""
        self.training = training
        self.container = container
        self.roll = training.roll
        self.base_yaml_text = base_yaml_text

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

    def code(self) -> CodeSpec:
        problem = self.requirements_problem()
        if problem is not None:
            raise ValueError(problem)
        return CodeSpec(
            repo=self.roll.repo,
            ref=self.roll.ref,
            archive_url=self.roll.archive_url or github_archive_url(self.roll.repo, self.roll.ref),
            code_dir=ROLL_DIR,
            requirements_file=self.requirements_file(),
            pip_index_url=self.roll.pip_index_url,
            install_editable=True,
            extra_packages="",
        )

    # ------------------------------------------------------------------------------------------------- job
    def paths(self, shape: ClusterShape) -> dict[str, str]:
        name = config_name(shape.stack, self.roll.base_config)
        return {
            "name": name,
            "base": f"examples/{self.roll.base_config}",
            "out": f"{GENERATED_DIR}/{name}.yaml",
            "renderer": f"{SUPPORT_DIR}/roll_render.py",
            "cluster": f"{SUPPORT_DIR}/cluster.json",
            "overrides": f"{SUPPORT_DIR}/overrides.json",
        }

    def job(self, shape: ClusterShape) -> JobSpec:
        paths = self.paths(shape)
        q = {name: shlex.quote(path) for name, path in paths.items()}
        cluster = roll_render.Cluster.of(shape)
        render = (
            f"cd {ROLL_DIR} && python3 {q['renderer']} --base {q['base']} --cluster {q['cluster']} "
            f"--overrides {q['overrides']} --out {q['out']}"
        )
        check = f"cd {ROLL_DIR} && python3 {q['renderer']} --check {q['out']} --cluster {q['cluster']}"
        entrypoint = (
            f"cd {ROLL_DIR} && PYTHONPATH={ROLL_DIR} python3 examples/start_{self.roll.pipeline}_pipeline.py "
            f"--config_path {GENERATED_DIR.rsplit('/', 1)[-1]} --config_name {q['name']}"
        )
        overrides_json = json.dumps(self.training.overrides, indent=2, sort_keys=True)
        files = {
            posixpath.join(ROLL_DIR, paths["renderer"]): RENDERER_SOURCE.read_text(encoding="utf-8"),
            posixpath.join(ROLL_DIR, paths["cluster"]): cluster.to_json() + "\n",
            posixpath.join(ROLL_DIR, paths["overrides"]): overrides_json + "\n",
        }
        configuration = {
            "roll": self.roll.model_dump(mode="json", exclude=set(WHERE_FROM_ONLY)),
            "overrides": self.training.overrides,
            **image_facts(self.container),
        }
        return JobSpec(
            job_id=job_id(self.name, shape, configuration),
            workdir=ROLL_DIR,
            entrypoint=entrypoint,
            runtime_env=None,
            files=files,
            prepare=render,
            pre_submit_check=check,
            reward_server=None,
            summary=self.summary(shape, paths, entrypoint),
        )

    def summary(self, shape: ClusterShape, paths: Mapping[str, str], entrypoint: str) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "framework": self.name,
            "cluster": shape.facts(),
            "code": {
                "repo": self.roll.repo,
                "ref": self.roll.ref,
                "dir": ROLL_DIR,
                "requirements_file": self.requirements_file(),
            },
            "pipeline": self.roll.pipeline,
            "base_config": paths["base"],
            "generated_config": f"{ROLL_DIR}/{paths['out']}",
            "hardware_defaults": self.default_rules(shape),
            "overrides": self.training.overrides,
            "command": entrypoint,
            "checks": list(CHECKS),
        }
        if self.base_yaml_text is not None:
            cluster = roll_render.Cluster.of(shape)
            rendered = roll_render.render(
                self.base_yaml_text, cluster, self.training.overrides, paths["base"], paths["out"]
            )
            result = roll_render.check(rendered.config, cluster)
            summary["hardware_defaults"] = {"applied": rendered.applied, "kept": rendered.kept}
            summary["rendered_config"] = rendered.yaml_text()
            summary["check_errors"] = result.errors
            summary["check_warnings"] = result.warnings
        return summary

    @staticmethod
    def default_rules(shape: ClusterShape) -> list[str]:
        """What the head's render will do, said without the base YAML (which lives on the head)."""
        root = roll_render.Cluster.of(shape).output_root
        rules = [
            "actor_train / actor_infer / reference / critic whose device_mapping covers all of the base's GPUs: "
            f"list(range(0,{shape.total_gpus})) ({shape.nodes} x {shape.gpus_per_node}); roles on a subset are "
            "kept as written",
        ]
        if not shape.bf16:
            rules.append("model_args.dtype: fp16 for every role (the GPUs have no bf16)")
        where = "shared storage" if shape.shared_dir else "each node's data dir: no shared storage"
        rules.append(
            f"output_dir, logging_dir, checkpoint_config.output_dir, tracker_kwargs.log_dir under {root} ({where})"
        )
        rules.append("training.overrides deep-merged last")
        return rules

    # ------------------------------------------------------------------------------------------ local checks
    def problems(self, shape: ClusterShape) -> list[str]:
        problems: list[str] = []
        requirement = self.requirements_problem()
        if requirement is not None:
            problems.append(requirement)
        cluster = roll_render.Cluster.of(shape)
        if self.base_yaml_text is not None:
            paths = self.paths(shape)
            try:
                rendered = roll_render.render(
                    self.base_yaml_text, cluster, self.training.overrides, paths["base"], paths["out"]
                )
            except roll_render.RenderError as error:
                return [*problems, f"{key('training.roll.baseConfig')}: {error}"]
            problems += [
                f"{key('training.overrides')}: the config rendered from {paths['base']} for {shape.nodes} x "
                f"{shape.gpus_per_node} GPUs fails ROLL's check: {error}"
                for error in roll_render.check(rendered.config, cluster).errors
            ]
            return problems
        # Without the base only what the overrides decide on their own can be checked here.
        try:
            overrides = roll_render.expand_dotted(self.training.overrides)
        except roll_render.RenderError as error:
            return [*problems, f"{key('training.overrides')}: {error}"]
        partial = roll_render.check(overrides, cluster, partial=True)
        problems += [key("training.overrides." + error) for error in partial.errors]
        return problems
