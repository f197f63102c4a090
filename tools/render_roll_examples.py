#!/usr/bin/env python3
"""Render every example config of a ROLL checkout as `training.roll.baseConfig` on 1 x 8 and 2 x 8 GPUs (bf16,
shared storage) and report which render and which are refused, with the first reason.

It runs exactly what `pulumi up` runs before any resource exists (RollAdapter.build: compose, render, checks,
and the notes of a cluster of another size than the base's), with the checkout as `training.roll.checkout`.

    python3 tools/render_roll_examples.py /path/to/ROLL              # the table on stdout
    python3 tools/render_roll_examples.py /path/to/ROLL --write docs/roll-examples.md

The checkout must be at the ref the program pins (infra/config/frameworks.py DEFAULT_ROLL_REF) when it is a git
work tree or holds a .roll-ref file; an exported tree (`git archive <ref> examples roll`) is taken as it is. The
pipeline of an example is the one its directory's run script starts for it (`examples/start_<pipeline>_pipeline.py
... --config_name <name>`), else guessed from its keys and directory name (marked `*`).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.config import DEFAULT_ROLL_REF, ContainerConfig, TrainingConfig
from infra.device_mapping import DeviceMappingError, parse_device_mapping
from infra.frameworks import roll_sources
from infra.frameworks.base import ClusterShape
from infra.frameworks.roll import RollAdapter
from infra.frameworks.roll_compose import ComposeError, compose

SHAPES = (("1x8", 1), ("2x8", 2))
ROLES = ("actor_train", "actor_infer", "reference", "critic")
_RUN = re.compile(r"examples/start_(\w+)_pipeline\.py.*?--config_name\s+([\w.-]+)", re.DOTALL)


@dataclass(frozen=True)
class Outcome:
    example: str
    pipeline: str
    guessed: bool
    colocated: bool | None  # None: no training roles or unreadable mappings
    results: dict[str, tuple[bool, str, list[str]]]  # shape -> (renders, first problem, notes)
    clauses: dict[str, set[str]] = field(default_factory=dict)  # shape -> the clauses of item 6 of every problem


def run_script_pipelines(root: Path) -> dict[str, str]:
    """examples/<dir>/<name>.yaml -> the pipeline its directory's run scripts start for it."""
    found: dict[str, str] = {}
    for script in sorted((root / "examples").rglob("*.sh")):
        text = script.read_text(encoding="utf-8", errors="replace")
        folder = script.parent.relative_to(root / "examples").as_posix()
        for pipeline, name in _RUN.findall(text):
            found.setdefault(f"{folder}/{name}.yaml", pipeline)
    return found


def guess_pipeline(example: str, config: dict[str, object]) -> str:
    lowered = example.lower()
    if "custom_envs" in config or "train_env_manager" in config:
        return "agentic_rollout" if "rollout" in lowered else "agentic"
    for word, pipeline in (("sft", "sft"), ("dpo", "dpo"), ("onpolicy", "onpolicy_distill")):
        if word in lowered:
            return pipeline
    vision = "-vl" in lowered or "_vl" in lowered or "omni" in lowered
    if "distill" in lowered:
        return "distill_vl" if vision else "distill"
    return "rlvr_vl" if vision else "rlvr"


def colocated(config: dict[str, object]) -> bool | None:
    spans: list[set[int]] = []
    for role in ROLES:
        section = config.get(role)
        if isinstance(section, dict) and section.get("device_mapping") is not None:
            try:
                spans.append(set(parse_device_mapping(section["device_mapping"])))
            except DeviceMappingError:
                return None
    if not spans:
        return None
    return all(span == spans[0] for span in spans)


def shape(nodes: int) -> ClusterShape:
    return ClusterShape(
        stack="examples", nodes=nodes, gpus_per_node=8, bf16=True, head_ip="", shared_dir="/mnt/shared",
        data_dir="/data", dashboard_port=8265,
    )


def render_all(root: Path) -> list[Outcome]:
    examples = roll_sources.CheckoutExamples(root)
    scripted = run_script_pipelines(root)
    outcomes: list[Outcome] = []
    for path in sorted((root / "examples").rglob("*.yaml")):
        example = path.relative_to(root / "examples").as_posix()
        if example.startswith("pulumi/"):
            continue  # what roll-cluster itself writes into a checkout
        try:
            composed, _ = compose(examples.read, example)
        except (ComposeError, FileNotFoundError):
            composed = {}
        if example not in scripted and "actor_train" not in composed and "actor_infer" not in composed:
            try:
                raw = path.read_text(encoding="utf-8")
            except OSError:
                raw = ""
            if "actor_train" not in raw and "actor_infer" not in raw:
                continue  # no training roles: a file other examples include (config/, deepspeed settings, ...)
        pipeline = scripted.get(example) or guess_pipeline(example, composed)
        training = TrainingConfig.model_validate({
            "framework": "roll",
            "roll": {"pipeline": pipeline, "baseConfig": example, "checkout": str(root)},
        })
        adapter = RollAdapter(training, ContainerConfig(), examples)
        results: dict[str, tuple[bool, str, list[str]]] = {}
        clauses: dict[str, set[str]] = {}
        setup = adapter.environment_setup()
        for label, nodes in SHAPES:
            cluster = shape(nodes)
            problems = adapter.problems(cluster)
            notes = setup + adapter.build(cluster).warnings
            first = problems[0] if problems else ""
            if len(problems) > 1:
                first += f" (+{len(problems) - 1} more)"
            results[label] = (not problems, first, notes)
            clauses[label] = {clause(problem) for problem in problems}
        outcomes.append(Outcome(example, pipeline, example not in scripted, colocated(composed), results, clauses))
    return outcomes


# The clauses of issue 18 item 6 under which an example may be refused, by what the refusal says
# (infra/frameworks/roll_checks.py writes these phrases).
CLAUSES = (
    ("setup the program cannot do",
     ("which roll-cluster does not provide", "roll-cluster neither installs nor starts")),
    ("another site's paths", ("is a path of the site ROLL's example was written at",)),
    ("a size that cannot hold one model replica", ("GPUs for one model replica; the cluster has",)),
)


def clause(reason: str) -> str:
    """The clause of item 6 a refusal falls under; "other" for any other reason (a colocated agentic or RLVR
    example refused for another reason is a defect of roll-cluster or of the example)."""
    return next((name for name, phrases in CLAUSES if any(p in reason for p in phrases)), "other")


def refused_summary(colocated_rl: list[Outcome]) -> str:
    """Which colocated agentic/RLVR examples are refused, where, and under which clause."""
    refused: list[str] = []
    for outcome in colocated_rl:
        where = [label for label, _ in SHAPES if not outcome.results[label][0]]
        if not where:
            continue
        clauses = sorted(set().union(*(outcome.clauses[label] for label in where)))
        sizes = "both sizes" if len(where) == len(SHAPES) else " and ".join(w.replace("x", " x ") for w in where)
        refused.append(f"`{outcome.example}` ({sizes}: {', '.join(clauses)})")
    if not refused:
        return "None is refused."
    return f"Refused: {'; '.join(refused)}."


def _cell(text: str, limit: int = 360) -> str:
    short = text.replace("roll-cluster:training.overrides.", "").replace("|", "\\|").replace("\n", " ")
    return short if len(short) <= limit else short[: limit - 3] + "..."


def table(outcomes: list[Outcome], ref: str) -> str:
    colocated_rl = [o for o in outcomes if o.colocated and o.pipeline in ("agentic", "rlvr")]
    lines = [
        "# ROLL's own examples on 1 x 8 and 2 x 8 GPUs",
        "",
        f"Generated by `python3 tools/render_roll_examples.py <ROLL checkout at {ref}> --write docs/roll-examples.md`"
        ": every example config of ROLL at the pinned ref, used as `training.roll.baseConfig` on a cluster of 1 x 8"
        " and 2 x 8 bf16 GPUs with shared storage, through the same render and checks as `pulumi up` (nothing is"
        " deployed). \"renders\" means the plan accepts it; notes say what a cluster of another size than the"
        " example's changes (samples per optimizer step, idle GPUs), which the plan shows as check warnings.",
        "",
        f"{len(outcomes)} examples; on 1 x 8 {sum(o.results['1x8'][0] for o in outcomes)} render, on 2 x 8 "
        f"{sum(o.results['2x8'][0] for o in outcomes)}. Colocated agentic/RLVR examples (every training role on "
        f"the same GPUs): {len(colocated_rl)}, of which "
        f"{sum(o.results['1x8'][0] and o.results['2x8'][0] for o in colocated_rl)} render on both. "
        + refused_summary(colocated_rl),
        "",
        "Item 6 of issue 18 lets a colocated agentic or RLVR example be refused only under one of three clauses:"
        " setup the program cannot do (a ROCK sandbox service that ROLL's run script starts by hand, the"
        " openreward package and key; WebShop's setup the code step does itself), another site's paths (an input"
        " under `/data/cpfs_0`, `/data/oss_bucket_0` or `/home/ubuntu`: an override to a mounted path fixes it;"
        " folders ROLL only writes to move to the job's output folder), or a size that cannot hold one model"
        " replica (its model parallelism needs more GPUs than the cluster has). Where resizing an example's device"
        " mappings to the cluster would break a rule ROLL enforces, its own mappings are kept and the idle GPUs"
        " stated. The checks and the upstream lines they cite: infra/frameworks/roll_checks.py.",
        "",
        "Pipeline marked `*`: no run script names the example; guessed from its keys and directory.",
        "",
        "| example | pipeline | colocated | 1 x 8 | 2 x 8 |",
        "|---|---|---|---|---|",
    ]
    for outcome in outcomes:
        cells = []
        for label, _ in SHAPES:
            ok, reason, notes = outcome.results[label]
            cell = "renders" if ok else f"refused: {_cell(reason)}"
            if ok and notes:
                cell += "; " + "; ".join(_cell(note, 600) for note in notes)
            cells.append(cell)
        together = {True: "yes", False: "no", None: "-"}[outcome.colocated]
        pipeline = outcome.pipeline + ("*" if outcome.guessed else "")
        lines.append(f"| `{outcome.example}` | {pipeline} | {together} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=Path, help="a ROLL checkout (a folder with examples/)")
    parser.add_argument("--write", type=Path, help="write the Markdown table to this file instead of stdout")
    args = parser.parse_args(argv)
    if not (args.checkout / "examples").is_dir():
        parser.error(f"{args.checkout} has no examples/: not a ROLL checkout")
    ref = roll_sources.checkout_ref(args.checkout) or DEFAULT_ROLL_REF
    text = table(render_all(args.checkout), ref)
    if args.write:
        args.write.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
