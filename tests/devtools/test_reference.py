"""docs/configuration.md holds the configuration reference generated from the models, and every field is documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from devtools import reference
from devtools.reference import COMMAND, END_MARKER, START_MARKER, TARGET
from infra.config import PROJECT, SECRETS, SECTIONS, ClusterConfig

REPO = Path(__file__).resolve().parents[2]
CONFIGURATION = REPO / "docs" / "configuration.md"
CONTRACT = REPO.parent / "shared" / "design" / "stack-config.md"


def _rows(markdown: str) -> dict[str, list[str]]:
    """Table rows of the reference by heading: `### <heading>` -> the key cells under it."""
    tables: dict[str, list[str]] = {}
    heading = ""
    for line in markdown.splitlines():
        if line.startswith("### "):
            heading = line[4:].strip("`")
            tables[heading] = []
        elif line.startswith("| `") and heading:
            tables[heading].append(line.split("|")[1].strip().strip("`"))
    return tables


def test_the_configuration_doc_is_the_generated_one() -> None:
    assert CONFIGURATION.exists(), (
        f"docs/configuration.md is missing; create it with the lines {START_MARKER} and {END_MARKER}"
    )
    current = reference.current_section(CONFIGURATION.read_text(encoding="utf-8"))
    assert current == reference.reference(), (
        f"the configuration reference in docs/configuration.md is out of date with infra/config/: run `{COMMAND}` "
        "(or `python3 dev.py docs`)"
    )


def test_the_docs_command_writes_the_configuration_doc() -> None:
    # `python3 dev.py docs`, the COMMAND the generated text names and the file the test above reads are one file.
    assert TARGET == "docs/configuration.md" and REPO / TARGET == CONFIGURATION
    assert f".venv/bin/python -m devtools.reference --write {TARGET}" == COMMAND  # runs as written (test_readme)
    dev = (REPO / "dev.py").read_text(encoding="utf-8")
    assert '"devtools.reference", "--write", "docs/configuration.md"' in dev
    assert f"`{COMMAND}`" in reference.reference()
    # The README no longer carries a copy: it links the generated file.
    assert START_MARKER not in (REPO / "README.md").read_text(encoding="utf-8")


def test_a_stale_configuration_doc_is_caught(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    body = f"{reference.reference()}| `gone` | x | y | z |\n"
    stale.write_text(f"# Configuration\n\n{START_MARKER}\n{body}{END_MARKER}\n", encoding="utf-8")
    assert reference.current_section(stale.read_text(encoding="utf-8")) != reference.reference()
    assert reference.main(["--write", str(stale)]) == 0
    assert reference.current_section(stale.read_text(encoding="utf-8")) == reference.reference()


def test_every_field_has_a_description() -> None:
    missing = reference.undocumented_fields()
    assert missing == [], f"fields without a description (add Field(description=...) in infra/config/): {missing}"


def test_a_field_without_a_description_is_caught() -> None:
    # The check above must be able to fail: a model like those in infra/config/ with one undocumented field,
    # nested, as a new section would be.
    class Inner(BaseModel):
        documented: int = Field(1, description="Has one.")
        bare: int = 2

    class Outer(BaseModel):
        inner: Inner | None = Field(None, description="Nested.")
        plain: str = "x"

    assert reference.undocumented_fields(Outer) == ["inner.bare", "plain"]


def test_every_section_has_a_table_with_every_field_in_camel_case() -> None:
    tables = _rows(reference.reference())
    assert list(tables) == ["alicloud:region", *(f"{PROJECT}:{s}" for s in SECTIONS), "Secrets"]
    assert tables["alicloud:region"] == ["alicloud:region"]
    assert tables["Secrets"] == [f"{PROJECT}:{name}" for name in SECRETS]
    training = tables[f"{PROJECT}:training"]
    assert {"framework", "roll.baseConfig", "openrlhf.rewardServer.healthTimeoutSeconds", "custom.entrypoint"} <= set(
        training
    )
    for section in SECTIONS:
        keys = tables[f"{PROJECT}:{section}"]
        model = reference.section_model(section)
        top_level = [k for k in keys if "." not in k]
        assert top_level == [f.alias for f in model.model_fields.values()]
        assert all("_" not in key for key in keys), keys  # camelCase, never the Python name


def test_rows_show_types_defaults_and_required_keys() -> None:
    text = reference.reference()
    assert "| `count` | integer, 1..256 | `1` | GPU nodes;" in text
    assert "| `instanceTypes` | list of strings | `[]` |" in text  # required with source alibaba (the text says)
    assert "| `gpuDriver` | one of `auto-install`, `preinstalled` | `auto-install` |" in text
    assert "| `spotPriceLimit` | number or null, > 0 | `null` |" in text
    assert "| `overrides` | object (any keys) | `{}` |" in text
    assert "| `roll` | object | see its fields | ROLL settings. |" in text
    assert "| `custom.entrypoint` | string | required |" in text
    assert "| `alicloud:region` | string or null | `null` |" in text  # required with source alibaba
    assert "| `roll-cluster:hfToken` | secret string | none |" in text


def test_every_table_row_has_four_cells() -> None:
    # A `|` inside a description or a pattern would break the table; the generator escapes it.
    for line in reference.reference().splitlines():
        if line.startswith("|"):
            cells = re.split(r"(?<!\\)\|", line)[1:-1]
            assert len(cells) == 4, line


@pytest.mark.skipif(not CONTRACT.exists(), reason="the design contract is not next to this checkout")
def test_every_key_of_the_contract_is_documented() -> None:
    tables = _rows(reference.reference())
    documented = {f"{section.split(':')[1]}.{key}" for section, keys in tables.items() if ":" in section
                  for key in keys if section.startswith(PROJECT)}
    contract_keys = re.findall(r"^\| `([a-zA-Z.]+)` \|", CONTRACT.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert contract_keys, "the contract's key table was not found"
    missing = [key for key in contract_keys if "." in key and key not in documented]
    assert missing == []


# --------------------------------------------------------------------------------------------- the command
def _readme(body: str) -> str:
    return f"# title\n\nintro\n\n{START_MARKER}\n{body}{END_MARKER}\n\n## after\n\ntext\n"


def test_write_replaces_only_the_text_between_the_markers(tmp_path: Path) -> None:
    target = tmp_path / "README.md"
    target.write_text(_readme("stale reference\n| old | table |\n"), encoding="utf-8")
    assert reference.main(["--write", str(target)]) == 0
    written = target.read_text(encoding="utf-8")
    assert written == _readme(reference.reference())
    # A second run changes nothing.
    assert reference.main(["--write", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == written


def test_write_fills_empty_markers(tmp_path: Path) -> None:
    target = tmp_path / "README.md"
    target.write_text(_readme(""), encoding="utf-8")
    assert reference.main(["--write", str(target)]) == 0
    assert reference.current_section(target.read_text(encoding="utf-8")) == reference.reference()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("# no markers\n", (START_MARKER, "no line")),
        (f"{START_MARKER}\nonly the start\n", (END_MARKER, "no line")),
        (f"{END_MARKER}\nx\n{START_MARKER}\n", ("comes before",)),
        (f"{START_MARKER}\n{START_MARKER}\n{END_MARKER}\n", ("2 lines", START_MARKER)),
        (f"text {START_MARKER} inline\n{END_MARKER}\n", (START_MARKER, "on a line of its own")),
    ],
)
def test_write_fails_clearly_and_leaves_the_file_alone_without_proper_markers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, words: tuple[str, ...]
) -> None:
    target = tmp_path / "README.md"
    target.write_text(text, encoding="utf-8")
    assert reference.main(["--write", str(target)]) == 1
    error = capsys.readouterr().err
    assert "cannot write the reference" in error and str(target) in error
    for word in words:
        assert word in error, error
    assert target.read_text(encoding="utf-8") == text


def test_write_to_a_missing_file_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert reference.main(["--write", str(tmp_path / "nope.md")]) == 1
    assert "nope.md" in capsys.readouterr().err
    assert not (tmp_path / "nope.md").exists()


def test_the_module_prints_the_reference() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devtools.reference"], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout == reference.reference()
    assert "roll-cluster:nodes" in result.stdout


def test_the_reference_documents_the_models_not_a_copy() -> None:
    # Descriptions come from the models: the generator has no text of its own for any field.
    text = reference.reference()
    for name, field in ClusterConfig.model_fields.items():
        if name != "region" and field.description:
            assert field.description in text
