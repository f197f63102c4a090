"""What a free-text value is, validated as that: git refs, repository and archive URLs, pip requirements, module
names, paths, host addresses, and the credential rule.

Each value reaches a shell, git, ssh or pip on a node. None may start with `-` (it would be read as an option:
`git fetch origin --upload-pack=<cmd>` runs <cmd>; `ssh -oProxyCommand=<cmd>@host` runs it on the machine that runs
`pulumi up`), and every rule matches the whole value (`re.fullmatch`; pydantic's `pattern=` is a search).
See docs/security.md, "What is refused".
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from infra.config.base import _HOST_NAME, _problem, _Problems, _shown

# A git ref name (`man git-check-ref-format`) narrowed to what tags, branches and commits use: no `..`, `@{`, `//`,
# component starting with `.`, `.lock` component end, trailing `/` or `.`; never a leading `-`; no quote, space or
# shell metacharacter (git itself accepts `'`).
GIT_REF = re.compile(r"(?!.*(?:\.\.|@\{|//|/\.|\.lock(?:/|$)))[A-Za-z0-9][A-Za-z0-9._/+-]{0,254}(?<![./])")
# A login name as useradd accepts it (`NAME_REGEX` of adduser.conf): no leading `-`, no shell metacharacter.
SSH_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_PKG_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
PACKAGE_NAME = re.compile(_PKG_NAME)
# A PEP 508 requirement without markers or URLs: `name[extra,...]` and version clauses.
REQUIREMENT = re.compile(
    rf"{_PKG_NAME}(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
    r"(?:(?:===?|!=|<=?|>=?|~=)[A-Za-z0-9.*+!_-]+(?:,(?:===?|!=|<=?|>=?|~=)[A-Za-z0-9.*+!_-]+)*)?"
)
_URL_SAFE = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]+")
_SCP_LIKE = re.compile(r"(?:[a-z_][a-z0-9_.-]{0,31}@)?[A-Za-z0-9.-]+:[A-Za-z0-9._~/+-]+")
_PATH = re.compile(r"/[A-Za-z0-9._/@+,=:-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _redacted(url: str) -> str:
    """A URL with its user info hidden: it may hold a token, which must not reach the console or CI logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://***@{host}/..." if parts.scheme else "***"


def _no_credentials(url: str, what: str) -> None:
    try:
        parts = urlsplit(url)
        has_user = parts.username is not None or parts.password is not None
    except ValueError:
        has_user = "@" in url
    if has_user:
        raise _problem(
            f"must not carry credentials in the URL ({what}): the stack config is stored in plain text. Use a "
            "public mirror, or put the credentials in the image; got " + _shown(_redacted(url))
        )


def git_ref(ref: str) -> str:
    if not GIT_REF.fullmatch(ref):
        raise _problem(
            "must be a git tag, branch or commit name: letters, digits and ._/+-, not starting with `-` (it would be "
            "read as a git option), without `..`, `@{`, `//` or a trailing `/`, `.` or `.lock`; got " + _shown(ref)
        )
    return ref


def git_repo(url: str) -> str:
    """https://host/path, ssh://[user@]host[:port]/path or user@host:path; no credentials, no remote helper
    (`ext::<cmd>` runs a command), no local path or `file:`."""
    _no_credentials(url, "git repository") if "://" in url else None
    parts = urlsplit(url) if "://" in url else None
    ok = False
    if parts is not None:
        ok = (parts.scheme in ("https", "http", "ssh", "git") and bool(parts.hostname)
              and _URL_SAFE.fullmatch(url) is not None and "::" not in url)
    else:
        # user@host:path, or a directory on the node (a mirror there; absolute, in normal form).
        ok = _SCP_LIKE.fullmatch(url) is not None or (
            _PATH.fullmatch(url) is not None and posixpath.normpath(url) == url
        )
    if not ok or url.startswith("-"):
        raise _problem(
            "must be a git URL such as `https://github.com/alibaba/ROLL.git`, `ssh://git@host/x.git` or "
            "`git@host:x.git` (or an absolute directory on the node; no `file:` or `ext::` remote helper, no spaces or "
            "quotes); got " + _shown(url)
        )
    return url


def archive_url(url: str | None) -> str | None:
    if url is None:
        return None
    _no_credentials(url, "archive")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname or not _URL_SAFE.fullmatch(url):
        raise _problem(
            "must be an http(s) URL of a .tar.gz/.tgz/.zip, such as "
            f"`https://github.com/alibaba/ROLL/archive/<ref>.tar.gz` (no `file:`, spaces or quotes); got {_shown(url)}"
        )
    return url


def pip_index(url: str) -> str:
    _no_credentials(url, "pip index")
    parts = urlsplit(url)
    private = False
    try:
        private = parts.hostname is not None and ipaddress.ip_address(parts.hostname).is_private
    except ValueError:
        private = False
    if (parts.scheme != "https" and not (parts.scheme == "http" and private)) or not parts.hostname \
            or not _URL_SAFE.fullmatch(url):
        raise _problem(
            "must be an https URL of a pip index such as `https://mirrors.aliyun.com/pypi/simple/` (http only for a "
            f"private address); got {_shown(url)}"
        )
    return url


def requirement(spec: str) -> str:
    """A pip requirement (`name[extra]==1.0`) or an https wheel URL: never an option such as `--index-url=...`."""
    if spec.startswith("https://") and spec.endswith(".whl"):
        _no_credentials(spec, "wheel")
        if _URL_SAFE.fullmatch(spec) and urlsplit(spec).hostname:
            return spec
    elif REQUIREMENT.fullmatch(spec):
        return spec
    raise _problem(
        "must be a pip requirement such as `openrlhf[vllm]==0.10.2` or an https URL of a .whl (no option, space or "
        f"environment marker); got {_shown(spec)}"
    )


def package_name(name: str) -> str:
    if not PACKAGE_NAME.fullmatch(name):
        raise _problem(f"must be a Python package name such as `flash_attn`; got {_shown(name)}")
    return name


def module_name(name: str) -> str:
    if not MODULE.fullmatch(name):
        raise _problem(f"must be a dotted Python module name such as `verl.trainer.main_ppo`; got {_shown(name)}")
    return name


def absolute_path(path: str, why: str = "") -> str:
    """An absolute, normalised path (`/a/b`, not `/a/../b` or `a/b`) without control characters; it travels as a
    quoted variable, so other characters are data."""
    if not path.startswith("/") or _CONTROL.search(path) or posixpath.normpath(path) != path or path.startswith("//"):
        raise _problem(
            "must be an absolute path in normal form (`/a/b`: no `..`, `.`, `//`, trailing `/` or control "
            f"characters){why}; got {_shown(path)}"
        )
    return path


def relative_path(path: str) -> str:
    if (not re.fullmatch(r"[A-Za-z0-9._/-]+", path) or path.startswith(("/", "-"))
            or posixpath.normpath(path) != path or ".." in path.split("/")):
        raise _problem(
            "must be a relative path inside the checkout (`requirements_torch260_vllm.txt`, no `..`, no leading `/` "
            f"or `-`); got {_shown(path)}"
        )
    return path


def canonical_host(address: str) -> str:
    """An IP address in its usual form, or a DNS name lower-cased: the form hosts are compared in.

    glibc's inet_aton (ssh, docker) reads `10.11`, `012.0.0.11`, `0x0a.0.0.11` and `167772171` all as 10.0.0.11,
    while `ipaddress` refuses them; such spellings are refused, as are IPv4-mapped IPv6 and scoped addresses."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is not None:
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            raise _problem(f"must be written as an IPv4 address ({ip.ipv4_mapped}); got {_shown(address)}")
        return str(ip)
    if "%" in address:
        raise _problem(f"must be an IP address without a scope (`%...`) or a DNS name; got {_shown(address)}")
    try:
        read_as = socket.inet_ntoa(socket.inet_aton(address))
    except OSError:
        read_as = None
    if read_as is not None:
        raise _problem(f"must be an IPv4 address in dotted decimal (ssh reads this as {read_as}); write "
                       f"{read_as}; got {_shown(address)}")
    name = address.lower().removesuffix(".")
    if not _HOST_NAME.fullmatch(name) or name.rsplit(".", 1)[-1].isdigit():
        raise _problem(f"must be an IP address or a DNS name such as `gpu-1.example.com`; got {_shown(address)}")
    return name


# ------------------------------------------------------------------------------------------- credentials
# Keys and values known to carry tokens. The message names the secret to use instead.
_CREDENTIAL_KEY = re.compile(
    r"(?:^|_)(?:api_?key|token|password|passwd|secret|access_key|secret_key|credentials?)$", re.IGNORECASE
)
_TOKEN_VALUE = re.compile(
    r"hf_[A-Za-z0-9]{30,}|gh[pousr]_\w{36,}|github_pat_\w+|glpat-[\w-]{20}|LTAI[A-Za-z0-9]{12,30}|AKIA[0-9A-Z]{16}"
)
_ASSIGNED = re.compile(
    r"(?:^|[\s;&|(])(?:export\s+)?([A-Z_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD)[A-Z_]*)=(?!\$|\"\$|'?$|\s)\S"
)
_FLAG = re.compile(r"--([\w.-]*(?:key|token|password)[\w.-]*)[ =](?!\$|\"\$)\S", re.IGNORECASE)


def secret_for(name: str) -> str:
    lowered = name.lower()
    if "wandb" in lowered:
        return "the secret `roll-cluster:wandbApiKey` (pulumi config set --secret roll-cluster:wandbApiKey ...)"
    if "hf" in lowered or "hugging" in lowered:
        return "the secret `roll-cluster:hfToken` (pulumi config set --secret roll-cluster:hfToken ...)"
    if "registry" in lowered or "docker" in lowered:
        return "the secret `roll-cluster:registryPassword`"
    return ("a secret: `roll-cluster:wandbApiKey` or `roll-cluster:hfToken`; for git or pip, a public mirror or "
            "credentials in the image")


def credentials_in_overrides(overrides: Mapping[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...],
                                                                                                      str]]:
    """Override keys and values that carry a credential, each at its key path under `overrides`."""
    found: list[tuple[tuple[str, ...], str]] = []
    for key, value in overrides.items():
        here = (*path, str(key))
        dotted = ".".join(here)
        last = str(key).split(".")[-1]
        if isinstance(value, Mapping):
            found += credentials_in_overrides(value, here)
            continue
        if value is None or value == "" or isinstance(value, bool):
            continue
        text = str(value)
        if (last == "key" and "wandb" in dotted.lower()) or _CREDENTIAL_KEY.search(last) \
                or _TOKEN_VALUE.search(text):
            found.append((here, f"must not hold a credential in plain config: use {secret_for(dotted + text[:3])}; "
                                "got a value (not shown)"))
    return found


def credentials_in_command(command: str) -> str | None:
    """Why a shell command given in the config carries a credential, or None."""
    match = _ASSIGNED.search(command) or _FLAG.search(command)
    if match is not None:
        return f"must not set a credential in the command ({match.group(1)}): use {secret_for(match.group(1))}"
    token = _TOKEN_VALUE.search(command)
    if token is not None:
        return f"must not hold a token in the command: use {secret_for(token.group(0)[:3])}"
    return None


def refuse_credentials(command: str) -> str:
    why = credentials_in_command(command)
    if why is not None:
        raise _Problems(((), why + "; got a command (not shown)"))
    return command
