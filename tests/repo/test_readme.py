"""The README stays a ten-minute read whose every command runs as written, and the docs' links resolve."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_WORDS = 1500
# The ten-minute guide's order: what it is, set-up, the plan, `pulumi up`, watch, pause, destroy, then the docs.
# Daily operation and troubleshooting live in docs/operations.md and docs/troubleshooting.md.
SECTIONS = ["Contents", "What it is", "Set up", "The plan", "Deploy", "Watch", "Pause", "Destroy", "Documentation"]
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
    """Every anchor the headings of a Markdown file define (duplicates get -1, -2, ... as on GitHub), and the
    explicit ones (`<a id="..."></a>`, one per fact in docs/verified-facts.md)."""
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
    return result | set(re.findall(r'<a id="([^"]+)"></a>', text))


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
    assert words <= MAX_WORDS, f"README.md has {words} words; keep it at most {MAX_WORDS} and move depth to docs/"


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


def test_the_plan_section_shows_the_plan_and_its_full_form() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("## The plan", 1)[1].split("\n## ", 1)[0]
    assert "python3 -m companion plan dev" in section and "python3 -m companion plan dev --full" in section
    assert "python3 dev.py plan dev" in section  # the alias other docs and issues name


def test_troubleshooting_and_daily_operation_have_their_own_files() -> None:
    readme = README.read_text(encoding="utf-8")
    assert "docs/troubleshooting.md" in links(readme) and "docs/operations.md" in links(readme)
    assert "## Daily operation" in (DOCS / "operations.md").read_text(encoding="utf-8")
    assert "| symptom | cause | what to do |" in (DOCS / "troubleshooting.md").read_text(encoding="utf-8")


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


# ----------------------------------------------------------------------- nothing points outside the repository
@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_reference_points_outside_the_repository(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "../shared" not in text, f"{path.name} cites a file outside the repository"
    outside = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.IGNORECASE):
            continue
        linked = (path.parent / unquote(target.partition("#")[0])).resolve()
        if REPO.resolve() not in (linked, *linked.parents):
            outside.append(target)
    assert outside == [], f"{path.name}: links outside the repository"


def test_the_full_plan_cites_nothing_outside_the_repository(capsys: pytest.CaptureFixture[str]) -> None:
    from devtools import plan

    assert plan.main(["multi", "--full", "--no-registry"]) == 0
    assert "../shared" not in capsys.readouterr().out


# ------------------------------------------------------- every command that can run offline runs, as written
# What a command in a code block needs when it cannot run here; a new command must fit one of these, or run.
NEEDS = {
    "pulumi ": "the Pulumi CLI and a cloud account",
    "python3 -m companion ": (
        "the Pulumi CLI and a deployed stack (tests/companion/test_companion.py runs them on a stand-in)"
    ),
    "python3 dev.py test": "the whole suite (CI runs it)",
    "python3 dev.py bench": "the benchmarks",
    "docker ": "a node's Docker", "skopeo ": "two registries", "ssh": "a node", "curl ": "the network",
    "git ": "the network", "aliyun ": "an Alibaba account", "eval ": "a deployed stack",
    "python3 tools/render_roll_examples.py": "a ROLL checkout",
}
OFFLINE = re.compile(r"^(python3 -m companion plan\b|python3 -m companion( [a-z]+)? --help$"
                     r"|python3 dev\.py (plan|docs)\b|\.venv/bin/python -m devtools\.(reference|plan)\b)")


def _block_commands(text: str) -> list[str]:
    """The command lines of ```bash blocks: continuations joined, trailing comments dropped."""
    commands, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = line.strip() in ("```bash", "```sh") if not fenced else False
            continue
        if not fenced:
            continue
        line = pending + line.split("  #", 1)[0].strip()
        if line.endswith("\\"):
            pending = line[:-1].rstrip() + " "
            continue
        pending = ""
        if line and not line.startswith("#"):
            commands.append(line)
    return commands


def documented_commands() -> list[tuple[str, str]]:
    """(file, command) of every command in README.md and docs/: code blocks, and the prose's code spans that are
    offline commands."""
    found: list[tuple[str, str]] = []
    for path in markdown_files():
        text = path.read_text(encoding="utf-8")
        name = str(path.relative_to(REPO))
        found += [(name, c) for c in _block_commands(text)]
        spans = {span for line in _prose(text).splitlines() for span in re.findall(r"`([^`]+)`", line)}
        found += [(name, s) for s in sorted(spans) if OFFLINE.match(s)]
    return list(dict.fromkeys(found))


def offline_commands() -> list[tuple[str, str]]:
    return [(f, c) for f, c in documented_commands() if OFFLINE.match(c) and "<" not in c]


def test_every_documented_command_runs_offline_or_says_what_it_needs() -> None:
    unknown = [(f, c) for f, c in documented_commands()
               if not OFFLINE.match(c) and not any(c.startswith(prefix) for prefix in NEEDS)]
    assert unknown == [], "commands that neither run offline nor name what they need (NEEDS)"
    assert len(offline_commands()) >= 5


@pytest.mark.parametrize(("doc", "command"), offline_commands(), ids=lambda v: str(v)[:60])
def test_every_offline_command_runs_as_written(doc: str, command: str) -> None:
    import subprocess

    generated = DOCS / "configuration.md"
    before = generated.read_bytes()
    env = {**__import__("os").environ, "ROLL_CLUSTER_NO_REGISTRY": "1"}  # no registry look-up from the tests
    done = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL, check=False)
    assert done.returncode == 0, f"{doc}: `{command}`\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    assert "Traceback" not in done.stdout + done.stderr
    # A regeneration command leaves the (up-to-date) reference as it is: the docs describe what is.
    assert generated.read_bytes() == before, f"{doc}: `{command}` changed docs/configuration.md"
