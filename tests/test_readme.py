"""The README stays a ten-minute read whose every command runs as written, and the docs' links resolve."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_WORDS = 3000
# The order the README's sections keep: what it is, quick start, deploying, daily operation, troubleshooting, docs.
SECTIONS = ["Contents", "What it is", "Quick start", "Deploy for real", "Daily operation", "Troubleshooting",
            "Documentation"]
# Services that answer with the caller's public address: over IPv6 they answer with an IPv6 address, which
# access.adminCidrs refuses, so every call must ask for IPv4.
IP_SERVICES = ("ifconfig.me", "ifconfig.co", "icanhazip.com", "ipinfo.io", "api.ipify.org", "ipecho.net",
               "ident.me", "checkip.amazonaws.com", "myip.ipip.net", "ip.sb")
# Outputs that hold a whole shell command (infra/outputs.py): `$(pulumi stack output X)` would pass their quotes
# literally, so they are run through `| sh` or `eval "$(...)"`.
COMMAND_OUTPUTS = {"sshHead", "dashboardTunnel", "jobStatus", "jobLogs", "jobStop", "jobResubmit", "jobSubmit"}
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """The text outside fenced code blocks (lines inside fences become blank, so line numbers stay)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def _code_blocks(text: str) -> Iterator[str]:
    """The lines inside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            yield line


def _without_code_spans(line: str) -> str:
    return re.sub(r"`[^`]*`", "", line)


def headings(text: str) -> list[tuple[int, str]]:
    """(level, title) of every ATX heading outside code fences."""
    found = []
    for line in _prose(text).splitlines():
        match = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if match:
            found.append((len(match.group(1)), match.group(2)))
    return found


def github_slug(title: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link keeps its text
    text = text.replace("`", "").replace("*", "").lower()
    kept = []
    for char in text:
        if char in " -_" or unicodedata.category(char)[0] in ("L", "N"):
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor the headings of a Markdown file define (duplicates get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    result = set()
    for _, title in headings(text):
        slug = github_slug(title)
        if slug in seen:
            seen[slug] += 1
            slug = f"{slug}-{seen[slug]}"
        else:
            seen[slug] = 0
        result.add(slug)
    return result


def links(text: str) -> list[str]:
    """The targets of the Markdown links outside code (fences and code spans)."""
    return [m.group(1) for line in _prose(text).splitlines() for m in LINK.finditer(_without_code_spans(line))]


def table_of_contents(text: str) -> list[str]:
    """The anchors the README's `## Contents` section links to, in order."""
    lines = _prose(text).splitlines()
    start = lines.index("## Contents")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return [target[1:] for line in lines[start + 1 : end] for target in links(line) if target.startswith("#")]


# ------------------------------------------------------------------------------------------------ the README
def test_the_readme_is_under_the_word_limit() -> None:
    words = len(README.read_text(encoding="utf-8").split())
    assert words < MAX_WORDS, f"README.md has {words} words; keep it under {MAX_WORDS} and move depth to docs/"


def test_the_readme_sections_come_in_the_reader_s_order() -> None:
    top = [title for level, title in headings(README.read_text(encoding="utf-8")) if level == 2]
    assert top == SECTIONS


def test_every_readme_heading_is_reachable_from_the_table_of_contents() -> None:
    text = README.read_text(encoding="utf-8")
    toc = table_of_contents(text)
    defined = anchors(text)
    assert len(toc) == len(set(toc)), f"the table of contents repeats an entry: {toc}"
    assert [a for a in toc if a not in defined] == [], "table of contents entries that resolve to no heading"
    wanted = [github_slug(title) for level, title in headings(text) if level in (2, 3) and title != "Contents"]
    assert [a for a in wanted if a not in toc] == [], "## / ### headings missing from the table of contents"
    assert toc == wanted, "the table of contents lists the sections in another order than the README"


def test_the_slug_rules_are_github_s() -> None:
    assert github_slug("Deploy for real") == "deploy-for-real"
    assert github_slug("Other stacks, your own servers, Ascend") == "other-stacks-your-own-servers-ascend"
    assert github_slug("ROLL's base configs") == "rolls-base-configs"
    assert github_slug("Your own servers (`nodes.source: hosts`)") == "your-own-servers-nodessource-hosts"
    assert github_slug("1. ECS user data: gzip-compressed") == "1-ecs-user-data-gzip-compressed"
    assert anchors("## A\n\n## A\n") == {"a", "a-1"}


def test_the_quick_start_is_the_offline_plan_and_the_tests() -> None:
    text = README.read_text(encoding="utf-8")
    quick = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "python3 dev.py plan dev" in quick and "python3 dev.py test" in quick


def test_the_readme_links_the_configuration_reference() -> None:
    assert "docs/configuration.md" in links(README.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------ links everywhere
@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_at_an_existing_file(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    broken = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE):  # http:, https:, mailto:
            continue
        file_part, _, fragment = target.partition("#")
        linked = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target} (no file {linked})")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{target} (no heading #{fragment} in {linked.name})")
    assert broken == [], f"{path.relative_to(REPO)}: broken links"


def test_the_link_check_catches_a_missing_file_and_anchor() -> None:
    assert links("see [a](docs/nope.md#x), `[b](c.md)` and ![img](i.png)\n```\n[d](e.md)\n```\n") == [
        "docs/nope.md#x"
    ]


# ------------------------------------------------------------------------------ commands that run as written
def _commands(path: Path) -> list[str]:
    """Lines that show commands: code blocks and code spans of the prose."""
    text = path.read_text(encoding="utf-8")
    spans = [span for line in _prose(text).splitlines() for span in re.findall(r"`([^`]+)`", line)]
    return [*_code_blocks(text), *spans]


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_stack_select_creates_the_stack(path: Path) -> None:
    # A newcomer has no stack: `pulumi stack select dev` fails where `--create` (or `pulumi stack init`) works.
    text = path.read_text(encoding="utf-8")
    bad = [m.group(0) for m in re.finditer(r"pulumi stack select\b[^\n`]*", text)
           if not re.search(r"\s(--create|-c)\b", m.group(0)) and "stack init" not in m.group(0)]
    assert bad == [], f"{path.name}: `pulumi stack select` without --create"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_curl_of_an_ip_service_asks_for_ipv4(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    bad = []
    for match in re.finditer(r"curl\b[^\n`)]*", text):
        call = match.group(0)
        if any(service in call for service in IP_SERVICES) and not re.search(r"\s-(4|[a-zA-Z]*4[a-zA-Z]*)\b|--ipv4",
                                                                               call):
            bad.append(call)
    assert bad == [], f"{path.name}: curl of an IP service without -4 (it may return IPv6, which adminCidrs refuses)"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_command_outputs_are_never_run_through_a_bare_substitution(path: Path) -> None:
    bad = []
    for line in _commands(path):
        for match in re.finditer(r"(eval \")?\$\(pulumi stack output (\w+)[^)]*\)", line):
            if match.group(2) in COMMAND_OUTPUTS and not match.group(1):
                bad.append(line)
    assert bad == [], f"{path.name}: use `pulumi stack output X | sh` or `eval \"$(pulumi stack output X)\"`"


def test_the_command_checks_can_fail(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\npulumi stack select dev\n$(pulumi stack output sshHead)\n"
                   "curl -s https://ifconfig.me\n```\n", encoding="utf-8")
    with pytest.raises(AssertionError):
        test_stack_select_creates_the_stack(doc)
    with pytest.raises(AssertionError):
        test_every_curl_of_an_ip_service_asks_for_ipv4(doc)
    with pytest.raises(AssertionError):
        test_command_outputs_are_never_run_through_a_bare_substitution(doc)
    doc.write_text("```bash\npulumi stack select --create dev\neval \"$(pulumi stack output sshHead)\"\n"
                   "curl -4 -s https://ifconfig.me\n```\n", encoding="utf-8")
    test_stack_select_creates_the_stack(doc)
    test_every_curl_of_an_ip_service_asks_for_ipv4(doc)
    test_command_outputs_are_never_run_through_a_bare_substitution(doc)
