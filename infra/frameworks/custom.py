"""Any Ray program: the user's entrypoint, run on the head in the container; no code is fetched."""

from __future__ import annotations

from typing import ClassVar

from infra.config import ContainerConfig, CustomConfig, TrainingConfig
from infra.frameworks.base import (
    ClusterShape,
    CodeSpec,
    FrameworkFacts,
    JobSpec,
    image_facts,
    job_id,
    job_name,
    key,
    resume_of,
)

# The environment the job gets (Ray's runtime_env), documented in training.custom's description.
CHECKPOINT_ENV = "ROLL_CLUSTER_CHECKPOINT_DIR"
RESUME_ENV = "ROLL_CLUSTER_RESUME"
MODEL_SOURCE_ENV = "ROLL_CLUSTER_MODEL_SOURCE"


class CustomAdapter(FrameworkFacts):
    name = "custom"
    accelerators: ClassVar[tuple[str, ...]] = ("nvidia", "ascend")

    def __init__(self, training: TrainingConfig, container: ContainerConfig):
        if training.custom is None:  # TrainingConfig already refuses this; kept for direct callers
            raise ValueError(f"{key('training.custom')}: required when framework is `custom`; got nothing")
        self.training = training
        self.container = container
        self.custom: CustomConfig = training.custom

    def code(self) -> CodeSpec | None:
        return None  # nothing to fetch: the entrypoint uses what the image has

    def resume(self) -> bool:
        return resume_of(self.training, default=True)

    def env_vars(self, shape: ClusterShape, job: str) -> dict[str, str]:
        """What the user's program is told: where its checkpoints go (created by nobody: the program decides its
        layout under it), whether a changed configuration should resume, and where to download from."""
        identity = job_name(self.name, shape, self.resume(), job, per_world_size=False)
        return {
            CHECKPOINT_ENV: shape.checkpoint_dir(identity),
            RESUME_ENV: "1" if self.resume() else "0",
            MODEL_SOURCE_ENV: shape.model_source,
            **shape.download_env(),
        }

    def job(self, shape: ClusterShape) -> JobSpec:
        configuration = {
            "custom": self.custom.model_dump(mode="json"),
            "resume": self.resume(),
            **image_facts(self.container),
        }
        submission = job_id(self.name, shape, configuration)
        runtime_env = {"env_vars": self.env_vars(shape, submission)}
        return JobSpec(
            job_id=submission,
            workdir=self.custom.working_dir,
            entrypoint=self.custom.entrypoint,
            runtime_env=runtime_env,
            files={},
            prepare=None,
            pre_submit_check=None,
            reward_server=None,
            summary={
                "framework": self.name,
                "cluster": shape.facts(),
                "working_dir": self.custom.working_dir,
                "command": self.custom.entrypoint,
                "runtime_env": runtime_env,
            },
        )

    def problems(self, shape: ClusterShape) -> list[str]:
        if self.training.overrides:
            # Nothing would read them; saying so beats a silently ignored setting.
            return [
                f"{key('training.overrides')}: not used by framework `custom` (put settings in "
                f"training.custom.entrypoint); got {self.training.overrides!r}"
            ]
        return []
