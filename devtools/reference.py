"""The configuration reference (docs/configuration.md), generated from the models of infra/config/.

    .venv/bin/python -m devtools.reference                                 # print the reference (Markdown)
    .venv/bin/python -m devtools.reference --write docs/configuration.md   # replace the text between its markers

The reference has one table per `roll-cluster:<section>` object (key, type, default, description), a table for
`alicloud:region` and one for the secrets. Keys are camelCase as the user writes them, nested keys dotted within
their section (`roll.baseConfig` in `roll-cluster:training`). Descriptions come from the fields' `description`,
so the models stay the single source of the documentation; tests/devtools/test_reference.py fails when
docs/configuration.md is stale or a field has no description.
"""

from __future__ import annotations

import argparse
import json
import sys
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import NoneType, UnionType
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from infra.config import PROJECT, SECRETS, SECTIONS, ClusterConfig
from infra.config.training import RegisteredFrameworks

START_MARKER = "<!-- config-reference:start -->"
END_MARKER = "<!-- config-reference:end -->"
TARGET = "docs/configuration.md"  # where `python3 dev.py docs` writes the reference
COMMAND = f".venv/bin/python -m devtools.reference --write {TARGET}"  # as written, from the project directory

# Secrets are not part of the models (they never pass through them), so their documentation lives here.
SECRET_DESCRIPTIONS: dict[str, str] = {
    "wandbApiKey": "Weights & Biases API key: `WANDB_API_KEY` in the environment of every Ray node, so of the job.",
    "hfToken": "Hugging Face token (gated models and datasets): `HF_TOKEN` in the environment of every Ray node.",
    "registryPassword": "Password of `container.registryUsername` for a private registry; required when that is set.",
}


class MarkerError(ValueError):
    """The target file lacks the marker lines that delimit the generated reference."""


# ------------------------------------------------------------------------------------------- rendering
def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (also through `X | None`), or None for a plain value."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _bounds(field: FieldInfo) -> str:
    low = next((f">= {m.ge}" for m in field.metadata if isinstance(m, annotated_types.Ge)), None)
    low = low or next((f"> {m.gt}" for m in field.metadata if isinstance(m, annotated_types.Gt)), None)
    high = next((m.le for m in field.metadata if isinstance(m, annotated_types.Le)), None)
    if low is not None and low.startswith(">= ") and high is not None:
        return f"{low[3:]}..{high}"
    return ", ".join(part for part in (low, f"<= {high}" if high is not None else None) if part)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{value}`" for value in typing.get_args(annotation))
    if origin in (UnionType, typing.Union):
        members = [a for a in typing.get_args(annotation) if a is not NoneType]
        name = " or ".join(_type_name(m) for m in members)
        return f"{name} or null" if len(members) < len(typing.get_args(annotation)) else name
    if origin is list:
        (item,) = typing.get_args(annotation)
        return f"list of {_type_name(item)}s"
    if origin is dict:
        return "object (any keys)"
    if _nested_model(annotation) is not None:
        return "object"
    names = {bool: "bool", int: "integer", float: "number", str: "string"}
    if annotation in names:
        return names[annotation]
    raise TypeError(f"no reference name for the type {annotation!r}; add one to devtools/reference.py")


def _type(field: FieldInfo) -> str:
    registered = next((m for m in field.metadata if m is RegisteredFrameworks), None)
    if registered is not None:  # training.framework: the registry's names, as a Literal would show them
        return "one of " + ", ".join(f"`{name}`" for name in registered.names())
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    enum = extra.get("enum")  # a string checked against a registry (nodes.source): its values, as a Literal's
    parts = ["one of " + ", ".join(f"`{value}`" for value in enum) if isinstance(enum, list)
             else _type_name(field.annotation)]
    bounds = _bounds(field)
    if bounds:
        parts.append(bounds)
    pattern = next((getattr(m, "pattern", None) for m in field.metadata if getattr(m, "pattern", None)), None)
    if pattern:
        parts.append(f"matching `{pattern}`")
    min_length = next((m.min_length for m in field.metadata if isinstance(m, annotated_types.MinLen)), None)
    if min_length:
        parts.append(f"at least {min_length}")
    return ", ".join(parts)


def _value(value: Any) -> str:
    if isinstance(value, str):
        return f"`{value}`"
    return f"`{json.dumps(value)}`"


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        if _nested_model(field.annotation) is not None:
            return "see its fields"
        return _value(field.default_factory())  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "required"
    return _value(field.default)


def _cell(text: str) -> str:
    """Markdown table cells cannot hold `|` or line breaks."""
    return " ".join(text.replace("|", "\\|").split())


def _rows(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, str, str, str]]:
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        yield f"`{key}`", _type(field), _default(field), field.description or ""
        nested = _nested_model(field.annotation)
        if nested is not None:
            yield from _rows(nested, key + ".")


def _table(rows: Sequence[tuple[str, str, str, str]]) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return lines


def undocumented_fields(model: type[BaseModel] = ClusterConfig, prefix: str = "") -> list[str]:
    """Key paths of fields without a description: each would be a blank cell in the reference."""
    missing: list[str] = []
    for name, field in model.model_fields.items():
        key = prefix + (field.alias or name)
        if not (field.description or "").strip():
            missing.append(key)
        nested = _nested_model(field.annotation)
        if nested is not None:
            missing += undocumented_fields(nested, key + ".")
    return missing


def section_model(section: str) -> type[BaseModel]:
    model = _nested_model(ClusterConfig.model_fields[section].annotation)
    if model is None:
        raise TypeError(f"ClusterConfig.{section} is not a model")
    return model


def reference() -> str:
    """The configuration reference as Markdown, without the marker lines."""
    region = ClusterConfig.model_fields["region"]
    lines = [
        f"<!-- Generated from infra/config/ by `{COMMAND}`; edit the models, not this text. -->",
        "",
        "## Configuration reference",
        "",
        f"Each `{PROJECT}:<section>` is an object in `Pulumi.<stack>.yaml`; set one field from the command line "
        f"with `pulumi config set --path '{PROJECT}:nodes.count' 2`. Unknown keys are errors.",
        "",
        "### `alicloud:region`",
        "",
        *_table([("`alicloud:region`", _type(region), _default(region), region.description or "")]),
    ]
    for section in SECTIONS:
        field = ClusterConfig.model_fields[section]
        need = "Required." if field.is_required() else "Optional."
        lines += ["", f"### `{PROJECT}:{section}`", "", f"{field.description} {need}", ""]
        lines += _table(list(_rows(section_model(section))))
    lines += [
        "",
        "### Secrets",
        "",
        f"Set with `pulumi config set --secret {PROJECT}:<key> <value>`; each is optional and never appears in "
        "plain text in a resource, an output or a log.",
        "",
        *_table([(f"`{PROJECT}:{name}`", "secret string", "none", SECRET_DESCRIPTIONS[name]) for name in SECRETS]),
    ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ the target file
def _marker_line(lines: list[str], marker: str, path: str) -> int:
    found = [index for index, line in enumerate(lines) if line.strip() == marker]
    if len(found) != 1:
        problem = "no line" if not found else f"{len(found)} lines"
        raise MarkerError(
            f"{path}: {problem} with exactly `{marker}`; the reference goes between the lines `{START_MARKER}` "
            f"and `{END_MARKER}`, each on a line of its own"
        )
    return found[0]


def current_section(text: str, path: str = TARGET) -> str:
    """The text between the marker lines of the target file."""
    lines = text.splitlines(keepends=True)
    start, end = _marker_line(lines, START_MARKER, path), _marker_line(lines, END_MARKER, path)
    if end < start:
        raise MarkerError(f"{path}: `{END_MARKER}` comes before `{START_MARKER}`")
    return "".join(lines[start + 1 : end])


def with_section(text: str, section: str, path: str = TARGET) -> str:
    """The target file's text with the part between the marker lines replaced by section."""
    lines = text.splitlines(keepends=True)
    start, end = _marker_line(lines, START_MARKER, path), _marker_line(lines, END_MARKER, path)
    if end < start:
        raise MarkerError(f"{path}: `{END_MARKER}` comes before `{START_MARKER}`")
    return "".join([*lines[: start + 1], section, *lines[end:]])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=".venv/bin/python -m devtools.reference", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", metavar="FILE", help=f"replace the text between `{START_MARKER}` and `{END_MARKER}` in FILE"
    )
    args = parser.parse_args(argv)
    text = reference()
    if args.write is None:
        sys.stdout.write(text)
        return 0
    target = Path(args.write)
    try:
        updated = with_section(target.read_text(encoding="utf-8"), text, args.write)
    except (OSError, MarkerError) as error:
        print(f"devtools.reference: cannot write the reference: {error}", file=sys.stderr)
        return 1
    target.write_text(updated, encoding="utf-8")
    print(f"devtools.reference: wrote the configuration reference into {args.write}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
