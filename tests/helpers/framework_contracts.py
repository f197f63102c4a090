"""The frameworks' own code as judges of a rendered job, without a GPU and without importing the frameworks.

verl (v0.7.0, the `verl` package installed without dependencies by dev.py from requirements-contract.txt):
its Hydra config files (verl/trainer/config/ppo_trainer.yaml and the files it composes) are composed with the
job's overrides by hydra-core exactly as `python3 -m verl.trainer.main_ppo` does (config_path "config",
config_name "ppo_trainer"): an unknown key or a value of the wrong type fails there. Then verl's own
`validate_config` (verl/utils/config.py), which the TaskRunner runs before any worker exists
(verl/trainer/main_ppo.py), runs on the composed config: the module imports only dataclasses, typing and
omegaconf, so it is loaded from its file, not through `verl/__init__.py` (which imports torch through
verl.protocol). Its two calls into the worker config dataclasses, `ActorConfig.validate` and
`CriticConfig.validate` (through `omega_conf_to_dataclass` and Hydra's instantiate of
`verl.workers.config.*`), need torch: `verl.workers.config` imports verl.utils.profiler, which imports
verl/utils/device.py, whose line 13 is `import torch`. Those two are stood in for by the conditions they assert,
evaluated here on the composed config (verl_violations), each citing its place in verl v0.7.0.

OpenRLHF (v0.10.2, the `openrlhf` package, likewise): the parser of `openrlhf.cli.train_ppo_ray` is built in the
module's `if __name__ == "__main__":` block, and the module imports Ray, vLLM and DeepSpeed at the top. The block
is taken from the installed file with `ast` and executed on its own, with argparse, after replacing only the
final `train(args)` call: upstream's parser and every check it makes after parsing (hierarchize, the estimator
and batch-size asserts) run as they would on the head. `openrlhf.utils.config` (hierarchize) is loaded from its
file (serve_rm's block uses it from the module's top-level imports); `modelscope` (for `--use_ms`) is a no-op
stand-in. Then upstream's own `train(args)` (train_ppo_ray.py) runs, taken from the file the same way, with
Ray, the strategy and the actor classes stood in for: its colocation asserts run as written, up
to the first thing that would place a model (vLLM engines, or the actor group without them). The strategy
(get_strategy, openrlhf/utils/utils.py) is a stand-in: DeepspeedStrategy imports deepspeed and torch at the
top of openrlhf/utils/deepspeed/deepspeed.py, and its checks (tensor parallelism) are not run.
See verified-facts#framework-contracts-config-3.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib.util
import io
import json
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar


def package_dir(name: str) -> Path:
    """Where an installed package lives, found without importing it (importing verl needs torch)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise AssertionError(
            f"the {name} package is not installed: dev.py installs it from requirements-contract.txt "
            "(pip install --no-deps); run `python3 dev.py test`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def module_arguments(entrypoint: str, module: str, resume_from: str = "") -> list[str]:
    """The arguments `python3 -m <module>` gets when the job's shell entrypoint runs: a fresh start, or handed
    `resume_from` as the job step hands the newest checkpoint ($ROLL_CLUSTER_RESUME_FROM)."""
    with tempfile.TemporaryDirectory() as bin_dir:
        stub = Path(bin_dir) / "python3"
        show = "import json, sys; print(json.dumps(sys.argv[1:]))"
        stub.write_text(f'#!/bin/sh\nexec "$PYTHON_REAL" -c \'{show}\' "$@"\n')
        stub.chmod(0o755)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PYTHON_REAL": sys.executable, "ROLL_CLUSTER_HEAD_IP": "10.0.0.5"}
        if resume_from:
            env["ROLL_CLUSTER_RESUME_FROM"] = resume_from
        shown = subprocess.run(["bash", "-c", entrypoint], env=env, capture_output=True, text=True, check=True).stdout
    words: list[str] = json.loads(shown.splitlines()[-1])
    assert words[:2] == ["-m", module], entrypoint
    return words[2:]


# --------------------------------------------------------------------------------------------------- verl
def compose_verl(overrides: list[str]) -> dict[str, Any]:
    """verl's ppo_trainer config composed with the overrides, all interpolations resolved."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    config_dir = package_dir("verl") / "trainer" / "config"
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        config = compose("ppo_trainer", overrides=overrides)
    missing = sorted(OmegaConf.missing_keys(config))
    if not config.reward_model.enable:
        # A disabled reward model's section is never read (verl's own examples leave reward_model.rollout.name
        # at ???).
        missing = [name for name in missing if not name.startswith("reward_model.")]
    assert not missing, f"verl config values still required (???): {missing}"
    resolved = OmegaConf.to_container(config, resolve=True)
    assert isinstance(resolved, dict)
    return resolved


def verl_violations(config: dict[str, Any]) -> list[str]:
    """What verl v0.7.0 asserts before or at the start of training, on a composed config (FSDP strategy)."""
    problems: list[str] = []
    trainer, data, algorithm = config["trainer"], config["data"], config["algorithm"]
    actor = config["actor_rollout_ref"]["actor"]
    rollout = config["actor_rollout_ref"]["rollout"]
    ref = config["actor_rollout_ref"]["ref"]
    n_gpus = trainer["n_gpus_per_node"] * trainer["nnodes"]
    if rollout["name"] not in ("vllm", "sglang", "hf"):
        problems.append(f"rollout.name {rollout['name']!r}")
    dynamic = actor["use_dynamic_bsz"]
    if not dynamic:
        # verl/utils/config.py: with FSDP the minimal batch is the GPU count.
        # see verified-facts#framework-contracts-config
        real = data["train_batch_size"] * rollout["n"]
        if real % n_gpus:
            problems.append(f"train_batch_size x rollout.n = {real} is not divisible by {n_gpus} GPUs")
        # verl/workers/config/actor.py: exactly one of the actor's micro-batch sizes.
        # see verified-facts#framework-contracts-actor
        both = (actor["ppo_micro_batch_size"], actor["ppo_micro_batch_size_per_gpu"])
        if both.count(None) != 1:
            problems.append(f"actor: exactly one of ppo_micro_batch_size(_per_gpu) must be set; got {both}")
        # verl/workers/config/actor.py
        # see verified-facts#framework-contracts-actor-2
        if data["train_batch_size"] < actor["ppo_mini_batch_size"]:
            problems.append("train_batch_size < actor.ppo_mini_batch_size")
        # verl/workers/fsdp_workers.py: the mini-batch per data-parallel rank, and the micro-batch in it.
        # see verified-facts#framework-contracts-fsdp-workers
        sp = actor.get("ulysses_sequence_parallel_size", 1)
        normalized = actor["ppo_mini_batch_size"] * rollout["n"] // (n_gpus // sp)
        micro = actor["ppo_micro_batch_size_per_gpu"]
        if normalized <= 0:
            problems.append(f"normalized ppo_mini_batch_size {normalized} is not > 0")
        elif isinstance(micro, int) and (normalized % micro or normalized // micro <= 0):
            problems.append(f"normalized ppo_mini_batch_size {normalized} not divisible by micro-batch {micro}")
        # verl/utils/config.py: the rollout's (and with a reference policy the ref's) log-prob micro-batch.
        # see verified-facts#framework-contracts-config-2
        sections = [("actor_rollout_ref.rollout", rollout)]
        # verl/trainer/main_ppo.py: the reference policy exists with a KL loss or a KL reward.
        # see verified-facts#framework-contracts-main-ppo
        if algorithm["use_kl_in_reward"] or actor["use_kl_loss"]:
            sections.append(("actor_rollout_ref.ref", ref))
        for name, section in sections:
            pair = (section["log_prob_micro_batch_size"], section["log_prob_micro_batch_size_per_gpu"])
            if not section.get("log_prob_use_dynamic_bsz") and pair.count(None) != 1:
                problems.append(f"{name}: exactly one of log_prob_micro_batch_size(_per_gpu) must be set; got {pair}")
    # verl/trainer/ppo/utils.py and verl/workers/config/critic.py: a critic needs its micro-batch.
    # see verified-facts#framework-contracts-utils
    critic = config["critic"]
    uses_critic = critic.get("enable") if critic.get("enable") is not None else algorithm["adv_estimator"] == "gae"
    if uses_critic and not critic.get("use_dynamic_bsz"):
        pair = (critic["ppo_micro_batch_size"], critic["ppo_micro_batch_size_per_gpu"])
        if pair.count(None) != 1:
            problems.append(f"critic: exactly one of ppo_micro_batch_size(_per_gpu) must be set; got {pair}")
    # Rollout engines of TP GPUs each: the GPUs divide into them (verl-openrlhf.md 1.5).
    tp = rollout["tensor_model_parallel_size"]
    if n_gpus % tp:
        problems.append(f"rollout TP {tp} does not divide {n_gpus} GPUs")
    # Relative paths land in Ray's temporary working dir.
    for path in (trainer["default_local_dir"], *_as_list(data["train_files"]), *_as_list(data["val_files"])):
        if not str(path).startswith("/"):
            problems.append(f"relative path {path!r}")
    return problems


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


class _VerlWorkerConfig:
    """Stands in for the dataclass `omega_conf_to_dataclass` builds of the actor or critic section (needs torch);
    its validate() is recorded, the conditions it asserts are verl_violations'."""

    calls: ClassVar[list[tuple[str, tuple[Any, ...]]]] = []

    def __init__(self, section: Any):
        self.target = str(section.get("_target_", "?"))

    def validate(self, *args: Any) -> None:
        _VerlWorkerConfig.calls.append((self.target, args))


def run_verl_validate_config(config: dict[str, Any]) -> tuple[str, list[tuple[str, tuple[Any, ...]]]]:
    """verl's own validate_config on a composed config, with the arguments the TaskRunner passes: a reference
    policy when the KL is in the reward or in the loss (verl/trainer/main_ppo.py adds Role.RefPolicy then;
    need_reference_policy, verl/trainer/ppo/utils.py), a critic as need_critic decides. Returns what
    it printed and the worker-config validations it asked for; raises what it raises (AssertionError, ValueError).
    See verified-facts#framework-contracts-main-ppo-2.
    """
    from omegaconf import OmegaConf

    path = package_dir("verl") / "utils" / "config.py"
    spec = importlib.util.spec_from_file_location("_verl_utils_config", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.omega_conf_to_dataclass = _VerlWorkerConfig  # the only name of the module that reaches torch
    composed = OmegaConf.create(config)
    actor = composed.actor_rollout_ref.actor
    use_reference_policy = bool(composed.algorithm.use_kl_in_reward or actor.use_kl_loss)
    critic = composed.critic.get("enable")
    use_critic = bool(critic) if critic is not None else composed.algorithm.adv_estimator == "gae"
    _VerlWorkerConfig.calls = []
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        module.validate_config(composed, use_reference_policy=use_reference_policy, use_critic=use_critic)
    return output.getvalue(), list(_VerlWorkerConfig.calls)


# ---------------------------------------------------------------------------------------------- OpenRLHF
class _Trained(Exception):
    """Raised by the stand-in train(args): parsing and every check before training passed."""

    def __init__(self, parsed: Any):
        super().__init__("train(args) reached")
        self.parsed = parsed


def _is_main_guard(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def _main_block(path: Path) -> list[ast.stmt]:
    tree = ast.parse(path.read_text(), filename=str(path))
    guards = [node for node in tree.body if _is_main_guard(node)]
    assert len(guards) == 1, f"{path}: expected one `if __name__ == '__main__':` block"
    block = guards[0]
    assert isinstance(block, ast.If)
    return block.body


@contextlib.contextmanager
def _openrlhf_light_modules() -> Iterator[None]:
    """openrlhf.utils.config from its file under the names the block imports, and a no-op modelscope."""
    root = package_dir("openrlhf")
    names = ["openrlhf", "openrlhf.utils", "openrlhf.utils.config", "modelscope", "modelscope.utils",
             "modelscope.utils.hf_util"]
    saved = {name: sys.modules.get(name) for name in names}
    try:
        for package in ("openrlhf", "openrlhf.utils", "modelscope", "modelscope.utils"):
            module = types.ModuleType(package)
            module.__path__ = []
            sys.modules[package] = module
        spec = importlib.util.spec_from_file_location("openrlhf.utils.config", root / "utils" / "config.py")
        assert spec is not None and spec.loader is not None
        config = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(config)
        sys.modules["openrlhf.utils.config"] = config
        hub = types.ModuleType("modelscope.utils.hf_util")
        hub.patch_hub = lambda: None  # type: ignore[attr-defined]
        sys.modules["modelscope.utils.hf_util"] = hub
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def run_openrlhf_cli(module_file: str, argv: list[str], *, stop_after_parse: bool = False) -> Any:
    """Run the `__main__` block of openrlhf/cli/<module_file> on argv up to train(args) (train_ppo_ray) or up to
    the parsed arguments (stop_after_parse, e.g. serve_rm, whose block then loads the model). Returns the parsed,
    hierarchized and validated args; raises SystemExit (argparse) or AssertionError (upstream's checks)."""
    path = package_dir("openrlhf") / "cli" / module_file
    body = _main_block(path)
    if stop_after_parse:
        cut = next(i for i, stmt in enumerate(body) if "parse_args" in ast.unparse(stmt))
        body = [*body[: cut + 1], ast.parse("raise _Trained(args)").body[0]]
    code = compile(ast.fix_missing_locations(ast.Module(body=body, type_ignores=[])), str(path), "exec")

    def train(args: Any) -> None:
        raise _Trained(args)

    namespace: dict[str, Any] = {
        "__name__": "__contract__",
        "argparse": argparse,
        "datetime": datetime,
        "os": __import__("os"),
        "train": train,
        "_Trained": _Trained,
    }
    saved_argv = sys.argv
    sys.argv = [str(path), *argv]
    try:
        with _openrlhf_light_modules():
            # serve_rm imports hierarchize at the top of the module, train_ppo_ray inside the block.
            namespace["hierarchize"] = sys.modules["openrlhf.utils.config"].hierarchize
            exec(code, namespace)
    except _Trained as reached:
        return reached.parsed
    finally:
        sys.argv = saved_argv
    raise AssertionError(f"{module_file}: the block ended without reaching train(args)")


def openrlhf_train_violations(args: Any) -> list[str]:
    """What train() in openrlhf/cli/train_ppo_ray.py (v0.10.2) asserts before it places anything."""
    problems: list[str] = []
    colocate = args.train.colocate_actor_ref or args.train.colocate_all
    # train_ppo_ray.py
    # see verified-facts#framework-contracts-train-ppo-ray
    if colocate and args.algo.kl.init_coef > 0 and (
        args.actor.num_nodes != args.ref.num_nodes or args.actor.num_gpus_per_node != args.ref.num_gpus_per_node
    ):
        problems.append("colocated actor and ref differ in nodes or GPUs")
    # train_ppo_ray.py
    # see verified-facts#framework-contracts-train-ppo-ray-2
    if args.vllm.num_engines and args.train.colocate_all and not args.train.async_enable:
        actor = args.actor.num_nodes * args.actor.num_gpus_per_node
        engines = args.vllm.num_engines * args.vllm.tensor_parallel_size
        if actor != engines:
            problems.append(f"colocate_all: actor GPUs {actor} != vLLM engines x TP {engines}")
    # openrlhf/datasets/prompts_dataset.py: a list of messages is a prompt only through the chat template.
    # see verified-facts#framework-contracts-prompts-dataset
    if args.data.input_key == "context_messages" and not args.data.apply_chat_template:
        problems.append("data.input_key context_messages without data.apply_chat_template")
    for name, path in (("ckpt.path", args.ckpt.path), ("ckpt.output_dir", args.ckpt.output_dir)):
        if not str(path).startswith("/"):
            problems.append(f"{name} is relative: {path!r}")
    return problems


class _Placed(Exception):
    """Raised by the stand-ins of what train() creates first: every check before placing a model passed."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


def _train_function(path: Path) -> ast.FunctionDef:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "train"]
    assert len(found) == 1, f"{path}: expected one `def train`"
    return found[0]


def run_openrlhf_train(args: Any) -> str:
    """Upstream's train(args) of openrlhf/cli/train_ppo_ray.py on parsed args, up to the first model it would
    place; returns what that was (`vllm engines` or `actor group`). Raises AssertionError from its own asserts."""
    path = package_dir("openrlhf") / "cli" / "train_ppo_ray.py"
    function = _train_function(path)
    code = compile(ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[])), str(path), "exec")

    class _Group:
        def ready(self) -> None:
            return None

    class _Strategy:
        def print(self, *values: Any) -> None:
            return None

    def placed(what: str) -> Any:
        def stand_in(*_args: Any, **_kwargs: Any) -> Any:
            raise _Placed(what)

        return stand_in

    ray = types.SimpleNamespace(is_initialized=lambda: True, init=placed("ray.init"), get=lambda value: value)
    namespace: dict[str, Any] = {
        "__name__": "__contract__",
        "os": __import__("os"),
        "ray": ray,
        "placement_group": lambda bundles, strategy: _Group(),
        "get_strategy": lambda parsed: _Strategy(),
        "create_vllm_engines": placed("vllm engines"),
        "RayActorGroup": placed("actor group"),
        "ReferenceModelActor": object,
        "RewardModelActor": object,
        "PolicyModelActor": object,
        "CriticModelActor": object,
    }
    exec(code, namespace)
    try:
        namespace["train"](args)
    except _Placed as reached:
        return reached.what
    raise AssertionError("train(args) ended without placing a model")
