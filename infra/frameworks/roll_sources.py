"""Where ROLL's example configs come from on the machine that runs `pulumi up`: the files of the pinned ref.

The training YAML is built there from a base example under ROLL's `examples/` (roll_render.py), so the files of
exactly the ref the nodes will check out must be readable there. In order:

1. `training.roll.checkout`, or the `ROLL_CHECKOUT` environment variable: a local checkout of ROLL (its
   `examples/` folder is read). When it is a git work tree, or holds a `.roll-ref` file (the snapshot shipped with
   the tests), its commit must be `training.roll.ref`.
2. Otherwise the files are fetched over HTTPS from GitHub's raw file host at `training.roll.ref`, one file per
   request (the base example and the files its Hydra `defaults` pull in), and cached under
   `$XDG_CACHE_HOME/roll-cluster/roll/<ref>/` (default `~/.cache/...`) when the ref is a full commit hash (a
   commit's files never change; a branch's do, so those are fetched on every run).

The offline plan and the tests use a snapshot of the pinned ref's files (tests/fixtures/roll, a sparse
checkout); devtools/offline_cloud.py points `ROLL_CHECKOUT` at it.
"""

from __future__ import annotations

import os
import posixpath
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from infra.config import RollConfig

CHECKOUT_ENV = "ROLL_CHECKOUT"
REF_MARKER = ".roll-ref"  # a snapshot's ref, where there is no .git to ask
FETCH_TIMEOUT_S = 20
FETCH_ATTEMPTS = 3
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_GITHUB = re.compile(r"^(?:https://|git@|ssh://git@)github\.com[/:]([\w.-]+)/([\w.-]+?)(?:\.git)?/?$")


class RollSourceError(Exception):
    """The examples cannot be read; the message names the setting to change."""


class Examples(Protocol):
    """Files under ROLL's examples/ at one ref."""

    where: str  # shown in the plan: a checkout path or a URL

    def read(self, path: str) -> str | None:
        """The text of examples/<path>; None when the ref has no such file."""
        ...

    def listing(self, folder: str) -> list[str] | None:
        """The YAML files of examples/<folder>/ (None: not known here), for "what exists" in an error."""
        ...


@dataclass
class CheckoutExamples:
    root: Path
    where: str = ""

    def __post_init__(self) -> None:
        self.where = str(self.root)

    def read(self, path: str) -> str | None:
        file = self.root / "examples" / path
        return file.read_text(encoding="utf-8") if file.is_file() else None

    def listing(self, folder: str) -> list[str] | None:
        base = self.root / "examples"
        pattern = f"{folder}/*.yaml" if folder else "*/*.yaml"
        return sorted(p.relative_to(base).as_posix() for p in base.glob(pattern))


Opener = Callable[[str, float], bytes]


def urlopen_bytes(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # https URLs built by raw_base_url
        data: bytes = response.read()
        return data


@dataclass
class FetchedExamples:
    """The files of one ref from a raw-file URL (`<base_url>/examples/<path>`), cached on disk when `cache_dir`
    is given. `open_url` is urllib's by default; a test hands in a local server's URL instead."""

    base_url: str
    cache_dir: Path | None
    browse_url: str  # where a person sees the ref's examples/ (for error messages)
    open_url: Opener = urlopen_bytes
    where: str = ""
    _memory: dict[str, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.where = self.base_url

    def read(self, path: str) -> str | None:
        if path in self._memory:
            return self._memory[path]
        cached = self.cache_dir / "examples" / path if self.cache_dir else None
        if cached is not None and cached.is_file():
            text: str | None = cached.read_text(encoding="utf-8")
        else:
            text = self._fetch(f"{self.base_url}/examples/{path}")
            if text is not None and cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                partial = cached.with_name(cached.name + f".{os.getpid()}.tmp")
                partial.write_text(text, encoding="utf-8")
                os.replace(partial, cached)  # never a half-written file in the cache
        self._memory[path] = text
        return text

    def _fetch(self, url: str) -> str | None:
        last = ""
        for attempt in range(FETCH_ATTEMPTS):
            try:
                return self.open_url(url, FETCH_TIMEOUT_S).decode("utf-8")
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return None
                last = f"HTTP {error.code}"
                if error.code < 500 and error.code != 429:
                    break
            except (urllib.error.URLError, TimeoutError, OSError) as error:
                last = str(getattr(error, "reason", error))
            if attempt + 1 < FETCH_ATTEMPTS:
                time.sleep(1.0 * (attempt + 1))
        raise RollSourceError(
            f"cannot fetch {url} ({last}, {FETCH_ATTEMPTS} attempts); set roll-cluster:training.roll.checkout (or "
            f"{CHECKOUT_ENV}) to a local ROLL checkout at the pinned ref instead"
        )

    def listing(self, folder: str) -> list[str] | None:
        return None  # a raw-file host has no listing; the error points at browse_url instead


_FETCHERS: dict[tuple[str, str, Opener], FetchedExamples] = {}


def cache_root(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "roll-cluster" / "roll"


def raw_base_url(repo: str, ref: str) -> tuple[str, str] | None:
    """(raw file URL of the ref, browsable URL of its examples/) for a GitHub repository; None for others."""
    match = _GITHUB.match(repo)
    if not match:
        return None
    owner, name = match.groups()
    return (
        f"https://raw.githubusercontent.com/{owner}/{name}/{ref}",
        f"https://github.com/{owner}/{name}/tree/{ref}/examples",
    )


def checkout_ref(root: Path) -> str | None:
    """The commit of a local checkout: its .roll-ref marker, else `git rev-parse HEAD`; None when unknown."""
    marker = root / REF_MARKER
    if marker.is_file():
        return marker.read_text(encoding="utf-8").strip()
    if not (root / ".git").exists():
        return None
    try:
        return subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], check=True, capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _checkout(root_text: str, setting: str, roll: RollConfig) -> CheckoutExamples:
    root = Path(root_text).expanduser()
    if not (root / "examples").is_dir():
        raise RollSourceError(
            f"{setting}: must be a ROLL checkout (a folder with examples/); got {root_text!r}, which has no examples/"
        )
    head = checkout_ref(root)
    if head is not None and _COMMIT.match(roll.ref) and head != roll.ref:
        raise RollSourceError(
            f"{setting}: the checkout at {root_text!r} is at {head}, but roll-cluster:training.roll.ref is "
            f"{roll.ref}: the configs would not be the ones the nodes run (git -C {root_text} checkout {roll.ref})"
        )
    return CheckoutExamples(root)


def resolve(roll: RollConfig, env: Mapping[str, str] | None = None, open_url: Opener = urlopen_bytes) -> Examples:
    """The examples of `roll.ref`, by the order in the module docstring."""
    env = os.environ if env is None else env
    if roll.checkout:
        return _checkout(roll.checkout, "roll-cluster:training.roll.checkout", roll)
    if env.get(CHECKOUT_ENV):
        return _checkout(env[CHECKOUT_ENV], f"{CHECKOUT_ENV} (environment)", roll)
    urls = raw_base_url(roll.repo, roll.ref)
    if urls is None:
        raise RollSourceError(
            f"roll-cluster:training.roll.checkout: required when training.roll.repo is not on GitHub (the base "
            f"config is read before deployment, from a local checkout at training.roll.ref); got repo {roll.repo!r}"
        )
    cache = cache_root(env) / roll.ref if _COMMIT.match(roll.ref) else None
    # One fetcher per ref and process: the checks before deployment and the job step read the same files once
    # (a branch's files are not cached on disk, so this also keeps both on the same version).
    memo = (urls[0], str(cache), open_url)
    if memo not in _FETCHERS:
        _FETCHERS[memo] = FetchedExamples(urls[0], cache, urls[1], open_url)
    return _FETCHERS[memo]


def missing_base_message(examples: Examples, base_config: str, ref: str) -> str:
    folder = posixpath.dirname(base_config)
    listing = examples.listing(folder)
    if listing is None:
        where = getattr(examples, "browse_url", examples.where)
        known = f"see {where} for the examples of that ref"
    elif listing:
        known = "that folder has: " + ", ".join(listing)
    else:
        top = examples.listing("") or []
        folders = sorted({posixpath.dirname(p) for p in top})
        known = f"there is no folder {folder}/ (folders: {', '.join(folders) or 'none'})"
    return (
        f"roll-cluster:training.roll.baseConfig: must name a file under ROLL's examples/ at ref {ref} (read from "
        f"{examples.where}); got {base_config!r}, which does not exist; {known}"
    )
