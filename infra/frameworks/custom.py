"""Any Ray program: the user's entrypoint, run on the head in the container; no code is fetched."""

from __future__ import annotations

from infra.config import ContainerConfig, CustomConfig, TrainingConfig
from infra.frameworks.base import ClusterShape, CodeSpec, JobSpec, image_facts, job_id, key


class CustomAdapter:
    name = "custom"

    def __init__(self, training: TrainingConfig, container: ContainerConfig):
        if training.custom is None:  # TrainingConfig already refuses this; kept for direct callers
            raise ValueError(f"{key('training.custom')}: required when framework is `custom`; got nothing")
        self.training = training
        self.container = container
        self.custom: CustomConfig = training.custom

    def code(self) -> CodeSpec | None:
        return None  # nothing to fetch: the entrypoint uses what the image has

    def job(self, shape: ClusterShape) -> JobSpec:
        configuration = {"custom": self.custom.model_dump(mode="json"), **image_facts(self.container)}
        return JobSpec(
            job_id=job_id(self.name, shape, configuration),
            workdir=self.custom.working_dir,
            entrypoint=self.custom.entrypoint,
            runtime_env=None,
            files={},
            prepare=None,
            pre_submit_check=None,
            reward_server=None,
            summary={
                "framework": self.name,
                "cluster": shape.facts(),
                "working_dir": self.custom.working_dir,
                "command": self.custom.entrypoint,
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
