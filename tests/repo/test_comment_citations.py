"""Comments say why and cite facts by name: no comment or docstring of the product or the tests points at a file
outside the repository or at an upstream file's line numbers (which go stale with every upstream release); the
evidence lives in docs/verified-facts.md, one anchor per fact, and every `verified-facts#<anchor>` a comment cites
exists there."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ["components", "infra", "devtools", "companion", "tests", "tools", "bench", "dev.py", "__main__.py"]
# tests/fixtures holds upstream's own files (a ROLL snapshot), not ours.
SKIPPED_PARTS = {".venv", "fixtures", "__pycache__"}

# A file name with an extension, then a line number after a colon (`<file>.go:<n>-<m>`, `<file>.py:<n>`, also a
# Dockerfile's `Dockerfile.<variant>:<n>` and a reference broken after the colon) or GitHub's `#L<n>`.
UPSTREAM_LINE = re.compile(r"[\w-]+(?:\.[\w-]+)*\.[A-Za-z]\w*(?::(?:\n[\s#]*)?\d+|#L\d+)")
# The team's notes beside the repository, by relative or absolute path.
OUTSIDE = re.compile(r"\.\./shared\b|/work/shared\b")
CITATION = re.compile(r"verified-facts#([\w-]+)")


def scanned_files(root: Path) -> Iterator[Path]:
    for name in SCANNED:
        path = root / name
        if path.is_file():
            yield path
        elif path.is_dir():
            for found in sorted(path.rglob("*")):
                if found.suffix in (".py", ".sh") and not SKIPPED_PARTS & set(found.relative_to(root).parts):
                    yield found


def comment_texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring; consecutive comment lines come as one text, so that a
    reference broken across two lines is seen whole."""
    source = path.read_text()
    if path.suffix == ".py":
        lines: list[tuple[int, str]] = [
            (token.start[0], token.string)
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type == tokenize.COMMENT
        ]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    value = first.value.value
                    if isinstance(value, str):
                        yield first.lineno, value
    else:
        lines = []
        for number, line in enumerate(source.splitlines(), 1):
            found = re.search(r"(?:^|\s)(#(?![!{]).*)$", line)
            if found:
                lines.append((number, found.group(1)))
    block: list[tuple[int, str]] = []
    for number, text in lines:
        if block and block[-1][0] != number - 1:
            yield block[0][0], "\n".join(t for _, t in block)
            block = []
        block.append((number, text))
    if block:
        yield block[0][0], "\n".join(t for _, t in block)


def offending_citations(root: Path) -> list[str]:
    found = []
    for path in scanned_files(root):
        for line, text in comment_texts(path):
            for pattern in (UPSTREAM_LINE, OUTSIDE):
                found += [f"{path.relative_to(root)}:{line}: {m.group(0)!r}" for m in pattern.finditer(text)]
    return found


def test_no_comment_cites_upstream_line_numbers_or_a_path_outside_the_repository() -> None:
    offending = offending_citations(ROOT)
    assert not offending, "cite a fact of docs/verified-facts.md instead:\n" + "\n".join(offending)


def test_every_cited_fact_exists() -> None:
    anchors = set(re.findall(r'<a id="([\w-]+)"></a>', (ROOT / "docs" / "verified-facts.md").read_text()))
    cited = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in scanned_files(ROOT)
        for _, text in comment_texts(path)
        for name in CITATION.findall(text)
        if name not in anchors
    }
    assert not cited, f"cited facts missing from docs/verified-facts.md: {sorted(cited)}"


def test_the_scan_sees_the_citations_it_forbids(tmp_path: Path) -> None:
    """The scan reads real comments: the tree has thousands, and each kind of old citation is caught."""
    assert sum(1 for path in scanned_files(ROOT) for _ in comment_texts(path)) > 1000
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "old.py").write_text(
        '"""Module (roll/configs/base_config.py:303-307)."""\n'
        "x = 1  # the engine (local/commandOutputs.go:73-80)\n"
        "# a note (../shared/reference/roll.md 2.1) and a broken one (file_download.py:\n"
        "#   1154-1155), GitHub's (ray_trainer.py#L938)\n"
        "y = 'strings are not comments: step.go:603'\n"
    )
    (tmp_path / "infra" / "old.sh").write_text("#!/bin/bash\n# ROLL's image (docker/Dockerfile.torch260.vllm:51)\n")
    assert [entry.split(": ", 1)[1] for entry in offending_citations(tmp_path)] == [
        "'base_config.py:303'",
        "'commandOutputs.go:73'",
        "'file_download.py:\\n#   1154'",
        "'ray_trainer.py#L938'",
        "'../shared'",
        "'Dockerfile.torch260.vllm:51'",
    ]
