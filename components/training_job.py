"""The training job on the Ray cluster: the framework's job submitted from the head with `ray job submit`.

The submission id is derived from the job's configuration, so a change of the training config replaces only
this resource: the old job is stopped first (delete before replace: two jobs would fight over the GPUs), then
the new one is submitted. `pulumi destroy` stops the job before Ray and the nodes go (dependency order).
OpenRLHF's reward-model server runs supervised on the head and must answer before the job is submitted.
With shared storage the head's `model` step downloads the job's models into the hubs' caches there first, once,
beside the code step and Ray (infra/model_cache.py); the job waits for it, and for every node's weights-prefetch
step, which reads the models already in those caches into the node's page cache beside its pull and container.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi

from components import remote_steps
from components.ray_cluster import RayCluster, RayNode
from infra import model_cache
from infra.config import ClusterConfig, TrainingConfig
from infra.frameworks import JobSpec, adapter_for
from infra.frameworks.base import DOWNLOAD_PATTERN
from infra.frameworks.registry import adapter_class
from infra.node import ssh_access, steps
from infra.ray import step_env
from infra.stack_config import cluster_shape


@dataclass(frozen=True)
class TrainingJobArgs:
    config: ClusterConfig
    stack: str
    nodes: Sequence[RayNode]  # every node, the head first (the job runs there; each node prefetches the weights)
    ray: RayCluster
    gpus_per_node: int
    bf16: bool
    private_key: pulumi.Output[str] | None  # None: through ssh-agent (infra/node/ssh_access.py)
    login: ssh_access.LoginKey  # the identity the local teardowns (job stop, reward-server stop) give the system ssh
    run: steps.RunContext  # the program's run: its steps, whether the configuration is a secret
    secret_env: dict[str, pulumi.Output[str]]  # the job's prepare step (e.g. a dataset download) may need them

    @property
    def head(self) -> RayNode:
        return self.nodes[0]


class TrainingJob(pulumi.ComponentResource):
    spec: pulumi.Output[JobSpec]
    job_id: pulumi.Output[str]
    rendered_config: pulumi.Input[str] | None
    # The job step (None with training.autoStart false): its URN is what `pulumi up --replace` takes to submit the
    # job again after the head's Ray lost it (a reboot of the head).
    submission: pulumi.Resource | None

    def __init__(self, name: str, args: TrainingJobArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("roll-cluster:index:TrainingJob", name, None, opts)
        config = args.config
        adapter = adapter_for(config.training, config.container)
        shape = cluster_shape(config, args.stack, args.gpus_per_node, args.bf16, head_ip="")
        # The ROLL YAML is known before the head exists (it does not depend on its IP), so `pulumi preview` shows
        # it in full as the job step's trigger; a changed configuration replaces the job.
        spec = adapter.job(shape)
        # A training section held as a secret keeps everything derived from it secret: the job's id (and the
        # outputs built from it), its rendered configuration in the triggers, its commands (infra/node/remote.py).
        keep_secret = args.run.secret_config
        self.rendered_config = (pulumi.Output.secret(spec.rendered_config) if keep_secret and spec.rendered_config
                                else spec.rendered_config)
        # Built now, from the configuration alone: `pulumi preview` shows it in full (the jobConfig output). Where
        # the job must name the head (OpenRLHF's reward URL) it does so as $ROLL_CLUSTER_HEAD_IP, which the job
        # step below exports to the entrypoint's shell.
        self.spec = pulumi.Output.secret(spec) if keep_secret else pulumi.Output.from_input(spec)
        self.job_id = self.spec.apply(lambda spec: spec.job_id)
        ctx = remote_steps.context_for(args.head.machine, args.private_key, self, login=args.login, run=args.run,
                                       running=True)
        after: list[tuple[str, pulumi.Resource]] = [(f"{args.head.name}/ray-ready", args.ray.ready)]
        settings = args.ray.settings
        submission = self.spec.apply(lambda spec: to_submission(spec, config.training))
        # The head's last start (ECS start_time): a resumed cluster (nodes.paused removed, or autostop followed by
        # `pulumi up --refresh`) has no job and no reward server; a new start time reruns both, and the job resumes
        # from its newest checkpoint (training.resume). Own hosts: none (the program never starts them).
        started = [args.head.machine.started] if args.head.machine.started is not None else []
        fetched: list[tuple[str, pulumi.Resource]] = []  # the job waits for the model step, the reward server not
        if model_cache.fetched_once(config, spec.models):
            # The job's models into the caches on the shared storage, once, on the head, before the job (every
            # node reads them there) and beside the code and Ray steps (infra/model_cache.py). Runs again when the
            # models change (its environment names them) or the container does; not for every new job of the same
            # models, so that a training setting changes the job step alone (a run would find the files anyway).
            model = remote_steps.remote_step(
                remote_steps.context_for(args.head.machine, args.private_key, self, login=args.login, run=args.run,
                                         running=True),
                model_cache.MODEL_STEP,
                model_cache.MODEL_SCRIPTS,
                {**args.secret_env, **model_cache.step_env(config, spec.models, spec.workdir),
                 "RAY_EXTRA_ENV_NAMES": " ".join(sorted(args.secret_env))},
                after=[(f"{args.head.name}/container", args.head.bootstrap.container)],
                triggers=[args.head.bootstrap.container.id],
            )
            fetched = [(f"{args.head.name}/{model_cache.MODEL_STEP}", model)]
            # Every node reads the models already in the shared caches into its page cache, beside the pull, the
            # container, code and Ray (infra/scripts/weights_prefetch.sh); only the job waits for it. Reruns when
            # the models change (its environment) or the node does: another machine, or a new start (an empty
            # page cache); not for every new job of the same models.
            for node in args.nodes:
                started_at = [node.machine.started] if node.machine.started is not None else []
                prefetch = remote_steps.remote_step(
                    remote_steps.context_for(node.machine, args.private_key, node.bootstrap, login=args.login,
                                             run=args.run),
                    model_cache.PREFETCH_STEP,
                    model_cache.PREFETCH_SCRIPTS,
                    model_cache.prefetch_env(spec.models, node.bootstrap.shared_host_dir),
                    after=node.bootstrap.prefetch_after,
                    triggers=[node.machine.identity, *started_at],
                )
                fetched.append((f"{node.name}/{model_cache.PREFETCH_STEP}", prefetch))
        if config.training.framework == "openrlhf" and config.training.openrlhf.reward_server is not None:
            # The server downloads its model: it gets HF_TOKEN (and the other secrets) like the job's prepare step.
            # Removing it (destroy, or rewardServer dropped from the config) stops it.
            server = remote_steps.remote_step(
                ctx,
                step_env.REWARD_SERVER_STEP.step,
                step_env.REWARD_SERVER_STEP.scripts,
                args.secret_env,
                dynamic_env=self.spec.apply(
                    lambda spec: step_env.reward_server_env(
                        settings, reward_of(spec), extra_env_names=sorted(args.secret_env)
                    )
                ),
                after=after,
                delete_scripts=step_env.REWARD_STOP_STEP.scripts,
                delete_env=step_env.reward_stop_env(settings),
                # The stop ends every reward server in the container: the old one must go before the new starts.
                delete_before_replace=True,
                triggers=started or None,
                resource_name="reward-server",
                # A changed port or command is otherwise an update, which re-runs `create` only: the old server
                # would keep its port and GPU memory. Replaced instead: its teardown's delete stops it first.
                replacement_trigger=self.spec.apply(lambda spec: json.dumps(step_env.reward_server_env(
                    settings, reward_of(spec), extra_env_names=sorted(args.secret_env)), sort_keys=True)),
            )
            after = [*after, (f"{args.head.name}/{step_env.REWARD_SERVER_STEP.step}", server)]
        self.submission = None
        if config.training.auto_start:
            self.submission = remote_steps.remote_step(
                ctx,
                "job",
                # The reward server is its own step above, so the plain submit scripts.
                step_env.SUBMIT_STEP.scripts,
                args.secret_env,
                # RAY_GENERATION: when Ray restarts on the head (a changed Ray setting, secret or container) the
                # job ended with it; the step then runs again and submits it again (job_submit.sh finds no job).
                dynamic_env=pulumi.Output.all(submission, args.ray.generation, args.ray.head_private_ip).apply(
                    lambda v: {**step_env.submit_env(settings, v[0], extra_env_names=sorted(args.secret_env),
                                                         head_ip=v[2]),
                               "RAY_GENERATION": v[1]}
                ),
                after=[*after, *fetched],
                delete_scripts=step_env.JOB_STOP_STEP.scripts,
                delete_env=self.job_id.apply(lambda job_id: step_env.job_stop_env(settings, job_id)),
                triggers=[self.job_id, *([self.rendered_config] if self.rendered_config else []), *started],
                delete_before_replace=True,
                resource_name="training-job",
            )
        self.register_outputs({"jobId": self.job_id})


def reward_of(spec: JobSpec) -> step_env.RewardServer:
    if spec.reward_server is None:
        raise ValueError(f"job {spec.job_id} has no reward server")
    return spec.reward_server


def to_submission(spec: JobSpec, training: TrainingConfig) -> step_env.JobSubmission:
    """What job_submit.sh needs of the framework's job. The reward server is its own step (it must not be
    restarted when only the job changes). The start gate waits for the framework's first-step line, at most
    training.startTimeoutMinutes from the step's start (0, or a custom job: no gate), and stops a job whose log
    stays silent for training.noProgressMinutes before that line."""
    saves = spec.checkpoints
    return step_env.JobSubmission(
        job_id=spec.job_id,
        workdir=spec.workdir,
        entrypoint=spec.entrypoint,
        runtime_env=spec.runtime_env,
        files=spec.files,
        prepare=spec.prepare or "",
        pre_submit_check=spec.pre_submit_check or "",
        checkpoint_layout=saves.layout if saves is not None and saves.find else "",
        checkpoint_dir=saves.directory if saves is not None and saves.find else "",
        checkpoint_world=saves.world if saves is not None else 0,
        checkpoint_staging=saves.staging if saves is not None and saves.find else "",
        first_step_pattern=adapter_class(training.framework).first_step_pattern,
        download_pattern=DOWNLOAD_PATTERN,
        gate_s=training.start_timeout_minutes * 60,
        stall_s=training.no_progress_minutes * 60,
    )
