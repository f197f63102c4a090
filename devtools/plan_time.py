"""The offline plan's time to the first training step (devtools/plan.py prints it): the modelled minutes on each
path at 2, 16, 64 and 256 nodes and for this stack, Pulumi's parallelism against the node count, the registry
backend's share when many nodes pull at once, the critical paths and the model's constants (devtools/schedule.py)."""

from __future__ import annotations

from collections.abc import Sequence

from devtools import schedule
from infra import model_cache, parallelism, pull_cache
from infra.config import ClusterConfig
from infra.node import steps

PATH_LABELS: dict[schedule.Path, str] = {
    "new": "new cluster, image and model as configured",
    "in-region": "new, image in the region's registry, model on shared storage",
    "warm": "warm start: baked image (nodes.image), model on shared storage",
}


def time_to_first_step(config: ClusterConfig, records: Sequence[steps.StepRecord],
                       parallel: int | None = None, image_gb: float | None = None) -> list[str]:
    """Minutes from `pulumi up` to the first training step: each path at 2/16/64/256 nodes (Pulumi's parallelism
    sized from the node count, and as configured here), the critical paths, the options, the constants (the
    section's body: the plan puts its heading above)."""
    slots, how = (parallel, "--parallel given to the plan") if parallel else schedule.default_parallel()
    count = config.nodes.count
    lines: list[str] = []
    lines += parallelism_lines(count, slots, how)
    lines += backend_lines(config, slots, image_gb)
    configured = schedule.configured_path(config)
    sizes = schedule.NODE_COUNTS
    header = f"  {'minutes to the first step at N nodes':62}" + "".join(f"{n:>8}" for n in sizes)
    lines.append(header + f"   this stack ({count} nodes, {slots} slots)")

    def row(label: str, path: schedule.Path, options: schedule.Options, mark: bool,
            stack: ClusterConfig = config) -> str:
        cells = "".join(f"{schedule.first_step(stack, records, path, n, max(n, slots), options, image_gb).total:8.1f}"
                        for n in sizes)
        here = schedule.first_step(stack, records, path, count, slots, options, image_gb)
        suffix = f"   {here.total:.1f}" + (f" ({here.waves} waves)" if here.waves > 1 else "")
        return f"  {label:62}{cells}{suffix}" + ("  <- this stack" if mark else "")

    for name in schedule.PATHS:
        label = PATH_LABELS[name]
        if not model_cache.shared_cache(config):
            label = label.replace("model on shared storage", "model on the data disks")
        lines.append(row(label, name, schedule.NO_OPTIONS, name == configured))
        if name == "in-region" and config.container.pull_cache != "off":
            lines.append(row("  in-region without the pull cache (container.pullCache off)", name,
                             schedule.NO_OPTIONS, False, schedule.without_cache(config)))
    lines.append(row("  warm, resumed after an economical-mode stop (nodes.paused)", "warm", schedule.RESUMED, False))
    lines.append(f"  (the pull cache: container.pullCache {config.container.pull_cache}; `auto` builds it above "
                 f"{pull_cache.AUTO_ABOVE} nodes for an image in the region's registry, one cache per "
                 f"{pull_cache.NODES_PER_CACHE} nodes; docs/performance.md, 'The pull cache')")
    writes = schedule.state_write_minutes(count)
    lines.append(f"  (each figure includes Pulumi's state saves with a self-managed backend: {writes:.1f} min at "
                 f"{count} nodes, {schedule.state_write_minutes(64):.1f} at 64, "
                 f"{schedule.state_write_minutes(256):.0f} at 256; with Pulumi Cloud as the backend (it journals "
                 "each step) every figure is that much lower, and `PULUMI_SKIP_CHECKPOINTS=true pulumi up` saves once "
                 "at the end, at the risk of instances the state does not know after a crash; docs/performance.md, "
                 "'Pulumi's state saves')")
    lines.append("  (figures for what the program builds; modelled options that are not built: docs/performance.md, "
                 "'Modelled options, not built')")
    lines.append("  (columns: `pulumi up --parallel N` or more; last column: this machine's parallelism)")
    paths: list[tuple[str, schedule.Path, schedule.Options]] = [(name, name, schedule.NO_OPTIONS)
                                                                 for name in schedule.PATHS]
    for label, name, options in [*paths, ("warm, resumed", "warm", schedule.RESUMED)]:
        plan = schedule.first_step(config, records, name, 64, 64, options, image_gb)
        lines.append(f"  critical path, {label}, 64 nodes: " + " -> ".join(
            f"{key} {plan.step_minutes(key):.1f}" for key in plan.critical_path))
        lines.append(f"      model: {plan.profile.model_how}")
        if plan.profile.dataset_how:
            lines.append(f"      dataset: {plan.profile.dataset_how}")
        if plan.profile.cache_how:
            lines.append(f"      pull cache: {plan.profile.cache_how}")
        if plan.profile.first_read_how:
            lines.append(f"      first read: {plan.profile.first_read_how}")
        if plan.profile.checkpoint_how:
            lines.append(f"      checkpoint: {plan.profile.checkpoint_how}")
        if plan.profile.prefetch_how:
            lines.append(f"      head's model step: {plan.profile.prefetch_how}")
        if plan.profile.page_cache_how:
            lines.append(f"      every node's weights-prefetch: {plan.profile.page_cache_how}")
    lines.append("  With a baked image (nodes.image) these steps find their work done and take seconds:")
    for step, what in schedule.BAKED_SKIPS.items():
        lines.append(f"    {step:13} {what}")
    lines.append("  Resumed after an economical-mode stop (nodes.paused removed), each step:")
    for step, what in schedule.RESUMED_STEPS.items():
        lines.append(f"    {step:16} {what}")
    lines.append("  Constants (sources: [n] = docs/performance-sources.md):")
    for key, constant in schedule.CONSTANTS.items():
        lines.append(f"    {key:24} {constant.value:>8g} {constant.unit:7} {constant.source}")
    lines.append(f"    {'measured steps':24} {'':>8} {'s':7} measured: bench/steps_bench.py (node steps on a baked "
                 "node, Ray and job on the real-host tier): " + ", ".join(
                     f"{k} {v:g}" for k, v in schedule.MEASURED_SECONDS.items()))
    lines.append(f"    {'new-node steps':24} {'':>8} {'min':7} ASSUMPTION (nominal): " + ", ".join(
        f"{k} {v:g}" for k, v in schedule.NEW_NODE_MINUTES.items()))
    return lines


def parallelism_lines(count: int, slots: int, how: str) -> list[str]:
    """Pulumi's parallelism against the node count: a warning when the node bootstraps would go in waves."""
    lines = [f"  Pulumi parallelism: {slots} slots ({how}); `pulumi up --parallel N` (or PULUMI_PARALLEL) "
             "changes it"]
    warning = parallelism.warning(count, slots, how)
    if warning:
        lines.append(f"  WARNING  {warning}")
    return lines


def backend_lines(config: ClusterConfig, slots: int, image_gb: float | None) -> list[str]:
    """A warning when the stack's nodes pulling at once share the registry's backend so that each pull is slower
    than one node's alone (the backend's rate is modelled: devtools/schedule.py, 'registry-backend')."""
    bound = schedule.backend_bound_pull(config, slots, image_gb)
    if bound is None:
        return []
    shared, alone = bound
    pullers = min(config.nodes.count, slots)
    return [f"  WARNING  {pullers} nodes pulling the image at once share the registry's backend "
            f"({schedule.registry_backend_gbit_s(config):g} Gbit/s modelled, the region's OSS cap): "
            f"{shared:.0f} min per node instead of "
            f"{alone:.0f} alone. Boot from a baked image (nodes.image) or pause and resume the cluster "
            "(nodes.paused) instead of pulling on every new node, or pull through the cache inside the VPC "
            "(container.pullCache on; docs/performance.md, 'The pull cache')"]
