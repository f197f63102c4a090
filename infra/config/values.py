"""What a free-text value is, validated as that: git refs, repository and archive URLs, pip requirements, module
names, paths, host addresses, and the credential rule.

Each value reaches a shell, git, ssh or pip on a node. None may start with `-` (it would be read as an option:
`git fetch origin --upload-pack=<cmd>` runs <cmd>; `ssh -oProxyCommand=<cmd>@host` runs it on the machine that runs
`pulumi up`), and every rule matches the whole value (`re.fullmatch`; pydantic's `pattern=` is a search).
See docs/security.md, "What is refused".
"""

from __future__ import annotations

import ipaddress
import json
import posixpath
import re
import socket
import unicodedata
from collections.abc import Mapping
from typing import Any
from urllib.parse import SplitResult, parse_qsl, urlsplit

from infra.config.base import _HOST_NAME, _problem, _Problems, _shown

# A git ref name (`man git-check-ref-format`) narrowed to what tags, branches and commits use: no `..`, `@{`, `//`,
# component starting with `.`, `.lock` component end, trailing `/` or `.`; never a leading `-`; no quote, space or
# shell metacharacter (git itself accepts `'`).
GIT_REF = re.compile(r"(?!.*(?:\.\.|@\{|//|/\.|\.lock(?:/|$)))[A-Za-z0-9][A-Za-z0-9._/+-]{0,254}(?<![./])")
# A login name as useradd accepts it (`NAME_REGEX` of adduser.conf): no leading `-`, no shell metacharacter.
SSH_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_PKG_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
PACKAGE_NAME = re.compile(_PKG_NAME)
# A PEP 508 requirement without markers or URLs: `name[extra,...]` and version clauses.
REQUIREMENT = re.compile(
    rf"{_PKG_NAME}(?:\[[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*\])?"
    r"(?:(?:===?|!=|<=?|>=?|~=)[A-Za-z0-9.*+!_-]+(?:,(?:===?|!=|<=?|>=?|~=)[A-Za-z0-9.*+!_-]+)*)?"
)
_URL_SAFE = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]+")
_SCP_LIKE = re.compile(r"(?:[a-z_][a-z0-9_.-]{0,31}@)?[A-Za-z0-9][A-Za-z0-9.-]*:[A-Za-z0-9._~/+-]+")
_PATH = re.compile(r"/[A-Za-z0-9._/@+,=:-]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _redacted(url: str) -> str:
    """A URL with its user info hidden: it may hold a token, which must not reach the console or CI logs."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://***@{host}/..." if parts.scheme else "***"


# Query parameters that carry a credential: tokens, API keys, and the signatures of presigned URLs (OSS
# `OSSAccessKeyId`/`Signature`/`security-token`, S3 `X-Amz-Signature`/`X-Amz-Credential`).
_CREDENTIAL_PARAM = re.compile(
    r"(?:^|[_.-])(?:token|access_?token|api_?key|apikey|key|secret|password|passwd|pwd|signature|sig|credential|"
    r"auth|accesskeyid|ossaccesskeyid)$",
    re.IGNORECASE,
)


def _no_credentials(url: str, what: str) -> None:
    try:
        parts = urlsplit(url)
        # ssh://git@host/x.git names the login, which is no credential (the key is); a password would be one.
        login = parts.scheme == "ssh" and parts.password is None and SSH_USER.fullmatch(parts.username or "")
        has_user = (parts.username is not None or parts.password is not None) and not login
        query = parse_qsl(parts.query, keep_blank_values=True) + parse_qsl(parts.fragment, keep_blank_values=True)
    except ValueError:
        has_user, query = "@" in url, []
    if has_user:
        raise _problem(
            f"must not carry credentials in the URL ({what}): the stack config is stored in plain text. Use a "
            "public mirror, or put the credentials in the image; got " + _shown(_redacted(url))
        )
    named = [name for name, _ in query if _CREDENTIAL_PARAM.search(name)]
    if named or _TOKEN_VALUE.search(url):
        raise _problem(
            f"must not carry a token in the URL ({what}"
            f"{': the query parameter ' + repr(named[0]) if named else ''}): the stack config is stored in plain "
            "text, and the URL reaches the step logs. Use a public URL (or a mirror), or put the credentials in the "
            f"image; got {_shown(_redacted(url).split('/...')[0] + '/...')}"
        )


def _url_host(parts: SplitResult) -> bool:
    """A host that is a host: an IP address or DNS name, never an option (`ssh://-oProxyCommand=...`)."""
    host = parts.hostname or ""
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is no number (`:-oProxyCommand=...`)
    except ValueError:
        return False
    if not host or host.startswith("-"):
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return _HOST_NAME.fullmatch(host) is not None


def git_ref(ref: str) -> str:
    if not GIT_REF.fullmatch(ref):
        raise _problem(
            "must be a git tag, branch or commit name: letters, digits and ._/+-, not starting with `-` (it would be "
            "read as a git option), without `..`, `@{`, `//` or a trailing `/`, `.` or `.lock`; got " + _shown(ref)
        )
    return ref


def git_repo(url: str) -> str:
    """https://host/path, ssh://[user@]host[:port]/path or user@host:path; no credentials, no remote helper
    (`ext::<cmd>` runs a command), no local path or `file:`, no plain `http://` or `git://` (unauthenticated: anyone
    on the path can change the code every node runs)."""
    _no_credentials(url, "git repository") if "://" in url else None
    parts = urlsplit(url) if "://" in url else None
    ok = False
    if parts is not None:
        ok = (parts.scheme in ("https", "ssh") and _url_host(parts)
              and _URL_SAFE.fullmatch(url) is not None and "::" not in url)
    else:
        # user@host:path, or a directory on the node (a mirror there; absolute, in normal form).
        ok = _SCP_LIKE.fullmatch(url) is not None or (
            _PATH.fullmatch(url) is not None and posixpath.normpath(url) == url
        )
    if not ok or url.startswith("-"):
        raise _problem(
            "must be a git URL such as `https://github.com/alibaba/ROLL.git`, `ssh://git@host/x.git` or "
            "`git@host:x.git` (or an absolute directory on the node; https or ssh only, not http:// or git://, whose "
            "code anyone on the path can change; no `file:` or `ext::` remote helper, no host starting with `-`, no "
            "spaces or quotes); got " + _shown(url)
        )
    return url


def archive_url(url: str | None) -> str | None:
    if url is None:
        return None
    _no_credentials(url, "archive")
    parts = urlsplit(url)
    if parts.scheme != "https" or not _url_host(parts) or not _URL_SAFE.fullmatch(url):
        raise _problem(
            "must be an https URL of a .tar.gz/.tgz/.zip, such as "
            "`https://github.com/alibaba/ROLL/archive/<ref>.tar.gz` (not http://, whose content anyone on the path "
            f"can change; no `file:`, spaces or quotes); got {_shown(url)}"
        )
    return url


def _private_host(parts: SplitResult) -> bool:
    try:
        return parts.hostname is not None and ipaddress.ip_address(parts.hostname).is_private
    except ValueError:
        return False


def pip_index(url: str) -> str:
    _no_credentials(url, "pip index")
    parts = urlsplit(url)
    if (parts.scheme != "https" and not (parts.scheme == "http" and _private_host(parts))) \
            or not _url_host(parts) or not _URL_SAFE.fullmatch(url):
        raise _problem(
            "must be an https URL of a pip index such as `https://mirrors.aliyun.com/pypi/simple/` (http only for a "
            f"private address); got {_shown(url)}"
        )
    return url


def mirror_endpoint(url: str) -> str:
    """A Hugging Face mirror (`HF_ENDPOINT`): https, or http on a private address."""
    _no_credentials(url, "mirror")
    parts = urlsplit(url)
    if (parts.scheme != "https" and not (parts.scheme == "http" and _private_host(parts))) \
            or not _url_host(parts) or parts.query or parts.fragment \
            or not re.fullmatch(r"https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._/-]*)?", url):
        raise _problem(
            "must be an https URL of a Hugging Face mirror such as `https://hf-mirror.com` (http only for a private "
            f"address; no query); got {_shown(url)}"
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
# A setting's or flag's name that says it holds a credential, judged by its last words (`hf_token`, `api-key`,
# `wandb.key`, `password`), not by a substring: `max_new_tokens`, `pad_token`, `input_key` and `tokenizer` are
# settings of the model or the data.
_SECRET_WORDS = {"token", "password", "passwd", "pwd", "secret", "credential", "credentials", "apikey", "auth"}
_KEY_OWNERS = {"api", "access", "secret", "private", "wandb", "hf", "hub", "auth", "license", "openai", "ssh"}
_TOKENIZER_TOKENS = {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "start", "end", "stop", "image",
                     "video", "audio", "think", "answer", "placeholder"}


def credential_name(name: str) -> bool:
    words = [w for w in re.split(r"[._\-]+", name.lower()) if w]
    if not words:
        return False
    last, before = words[-1], (words[-2] if len(words) > 1 else "")
    if last in ("token", "tokens") and (last == "tokens" or before in _TOKENIZER_TOKENS):
        return False
    if last in _SECRET_WORDS or last.endswith(("password", "passwd", "secret", "token", "apikey")):
        return True  # also one word: PGPASSWORD, GITHUBTOKEN
    return last == "key" and (len(words) == 1 or before in _KEY_OWNERS)


# Tokens by their published shapes: Hugging Face, GitHub, GitLab, Alibaba Cloud and AWS access key ids, Docker Hub
# personal access tokens, OpenAI-style keys, Slack, Google API keys, npm and PyPI tokens, JWTs and private keys.
_TOKEN_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9_]{36,}|github_pat_[A-Za-z0-9_]+|glpat-[A-Za-z0-9_-]{20}"
    r"|LTAI[A-Za-z0-9]{12,30}|AKIA[0-9A-Z]{16}|dckr_pat_[A-Za-z0-9_-]{20,}|sk-(?:proj-)?[A-Za-z0-9_-]{20,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{50,}"
    r"|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}|-----BEGIN [A-Z ]*PRIVATE KEY-----)"
)
# A key as W&B and others hand it out: one long word of letters and digits (W&B's are 40 hex digits, 86 characters
# for newer ones).
_KEY_WORD = re.compile(r"[A-Za-z0-9_-]{32,}")
# `NAME=value` with a credential-like NAME, unless the value is a variable (`$WANDB_API_KEY`).
_ASSIGNED = re.compile(
    r"(?:^|[\s;&|(])(?:export\s+)?([A-Z_]*(?:TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?|_PWD)[A-Z_]*)"
    r"=(?!\$|\"\$|'?$|\s)\S"
)
# `--<name> value` or `--<name>=value` (the name is judged by credential_name), unless the value is a variable.
_FLAG = re.compile(r"--([A-Za-z0-9_.-]+)[ =]\s*(?!\$|\"\$|-)\S")
# Commands whose arguments carry a credential: `wandb login <key>`, `mysql -p<password>`, `sshpass -p <password>`,
# `docker login -p <password>`, `curl -u user:password`, a URL with a password, an Authorization header.
_CREDENTIAL_ARGUMENT = (
    ("wandb login", re.compile(
        r"\bwandb\s+login\b(?:\s+--?[A-Za-z-]+(?:=\S+)?)*\s+(?!\$|\"\$)['\"]?[A-Za-z0-9_-]{20,}"
    )),
    ("mysql -p", re.compile(r"\bmysql(?:dump|admin|import)?\b[^;&|\n]*\s-p(?!\s|$|\$|\"\$)\S")),
    ("sshpass -p", re.compile(r"\bsshpass\b[^;&|\n]*\s-p\s*(?!\$|\"\$)\S")),
    ("docker login -p", re.compile(r"\b(?:docker|podman|nerdctl)\s+login\b[^;&|\n]*\s-p\s*(?!\$|\"\$)\S")),
    ("curl -u user:password", re.compile(r"(?:\s-u\s*|--user[ =])['\"]?[^\s:'\"$]+:(?!\$)[^\s'\"]+")),
    ("a URL with a password", re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@'\"]+:(?!\$)[^/\s@'\"]+@")),
    ("an Authorization header", re.compile(r"\b(?:Bearer|Basic|token)\s+(?!\$|\"\$)[A-Za-z0-9._~+/=-]{16,}")),
    ("an API key header", re.compile(
        r"\b(?:X-)?(?:API-?Key|Private-Token|Auth-Token|X-Auth-Token|X-Api-Token)\s*:\s*(?!\$|\"\$)[^\s'\"]{8,}",
        re.IGNORECASE,
    )),
    ("smbclient -U user%password", re.compile(r"\s-U\s*['\"]?[^\s%'\"]+%(?!\$)[^\s'\"]+")),
    ("aws configure set", re.compile(
        r"\baws\s+configure\s+set\s+(?:\S+\.)?aws_(?:secret_access_key|session_token)\s+(?!\$|\"\$)\S"
    )),
    ("a .netrc password", re.compile(r"\bmachine\s+\S+\s+(?:login\s+\S+\s+)?password\s+(?!\$|\"\$)\S")),
)


def secret_for(name: str) -> str:
    lowered = name.lower()
    if "wandb" in lowered:
        return "the secret `roll-cluster:wandbApiKey` (pulumi config set --secret roll-cluster:wandbApiKey ...)"
    if "hf" in lowered or "hugging" in lowered:
        return "the secret `roll-cluster:hfToken` (pulumi config set --secret roll-cluster:hfToken ...)"
    if "registry" in lowered or "docker" in lowered:
        return ("the secret `roll-cluster:registryPassword` (pulumi config set --secret "
                "roll-cluster:registryPassword ...)")
    return ("a secret: `roll-cluster:wandbApiKey` or `roll-cluster:hfToken` (pulumi config set --secret ...); for "
            "git, pip or a data source, a public mirror or credentials in the image")


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
        items = value if isinstance(value, list) else [value]
        texts = [str(item) for item in items if isinstance(item, str | int | float) and not isinstance(item, bool)]
        # OpenRLHF's `--use_wandb` (and W&B settings elsewhere) take the API key itself as their value.
        wandb_key = "wandb" in dotted.lower() and any(_KEY_WORD.fullmatch(t) for t in texts)
        token = next((t for t in texts if _TOKEN_VALUE.search(t) or credentials_in_command(t)), None)
        if (last == "key" and "wandb" in dotted.lower()) or credential_name(last) or wandb_key \
                or token is not None:
            hint = "hf_" if token is not None and token.startswith("hf_") else ""
            found.append((here, f"must not hold a credential in plain config: use {secret_for(dotted + ' ' + hint)}; "
                                "got a value (not shown)"))
    return found


def credentials_in_command(command: str) -> str | None:
    """Why a shell command given in the config carries a credential, or None."""
    match = next((found for pattern in (_ASSIGNED, _FLAG) for found in pattern.finditer(command)
                  if credential_name(found.group(1))), None)
    if match is not None:
        # The words around it tell which secret it is (`huggingface-cli login --token hf_...`).
        around = command[max(0, match.start() - 40):match.end() + 4]
        return f"must not set a credential in the command ({match.group(1)}): use {secret_for(around)}"
    for what, pattern in _CREDENTIAL_ARGUMENT:
        found = pattern.search(command)
        if found is not None:
            return f"must not pass a credential in the command ({what}): use {secret_for(found.group(0)[:60])}"
    token = _TOKEN_VALUE.search(command)
    if token is not None:
        return f"must not hold a token in the command: use {secret_for(token.group(0)[:3])}"
    return None


def registry_user(name: str) -> str:
    """A registry user name, not a token pasted in its place (the password is the secret registryPassword)."""
    looks_like_key = _KEY_WORD.fullmatch(name) is not None and any(c.isdigit() for c in name) \
        and any(c.isalpha() for c in name)
    if _TOKEN_VALUE.search(name) or looks_like_key:
        raise _problem(
            "must be the registry's user name, not a token or password: put that in "
            f"{secret_for('registry')}; got a value (not shown)"
        )
    return name


def refuse_credentials(command: str) -> str:
    why = credentials_in_command(command)
    if why is not None:
        raise _Problems(((), why + "; got a command (not shown)"))
    return command


# ------------------------------------------------------------------------------------------- characters and sizes
# The fields that hold shell code by design (several lines are fine there), and the framework overrides (text for the
# framework's YAML, or one argument each).
CODE_KEYS = (
    ("training", "custom", "entrypoint"), ("training", "verl", "dataPreparation"),
    ("training", "openrlhf", "rewardServer", "command"),
)
# Linux refuses an environment string longer than MAX_ARG_STRLEN (32 pages, 128 KiB: execve fails with E2BIG), and
# a command travels to the job as one (JOB_ENTRYPOINT, JOB_PREPARE, REWARD_COMMAND): what the program adds to it
# (exports, the checkpoint lookup) must still fit.
MAX_ARG_STRLEN = 128 * 1024
MAX_TEXT_BYTES = 96 * 1024
# Invisible or control characters: C0/C1 controls (NUL, escape sequences), format characters (bidi overrides such as
# U+202E, zero-width spaces), line and paragraph separators, private-use and surrogate code points. They make a value
# read differently from what runs (CVE-2021-42574, "Trojan Source"), or end a C string early (NUL).
_HIDDEN_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Co", "Cs")


def _hidden(text: str, multiline: bool) -> str | None:
    for char in text:
        if multiline and char in "\n\t":
            continue
        if unicodedata.category(char) in _HIDDEN_CATEGORIES:
            return f"U+{ord(char):04X}" + (f" ({unicodedata.name(char)})" if unicodedata.name(char, "") else "")
    return None


def _escaped(text: str, limit: int = 60) -> str:
    shown = json.dumps(text[:limit], ensure_ascii=True)
    return shown if len(text) <= limit else shown[:-1] + '..."'


def text_problems(value: Any, path: tuple[int | str, ...]) -> list[tuple[tuple[int | str, ...], str]]:
    """Every key and text value of a section: no control or invisible character (NUL, bidi controls), and no
    value larger than one environment string may be. Run on the raw section, before its model reads it."""
    found: list[tuple[tuple[int | str, ...], str]] = []
    names = tuple(p for p in path if isinstance(p, str))
    # The public key's own rule reads it after stripping the newline a pasted .pub file ends with.
    multiline = names in CODE_KEYS or names[:2] == ("training", "overrides") or names == ("access", "sshPublicKey")
    if isinstance(value, str):
        hidden = _hidden(value, multiline)
        size = len(value.encode("utf-8", "surrogatepass"))
        token = _TOKEN_VALUE.search(value)
        if token is not None and names[-1:] != ("sshPublicKey",):
            # Wherever it is, a known token shape in plain config is stored and shown in clear text.
            found.append((path, f"must not hold a token in plain config (the stack file and `pulumi config` show it "
                                f"in clear text): use {secret_for(token.group(0)[:3] + ' ' + '.'.join(names))}; got a "
                                "value (not shown)"))
        elif hidden is not None:
            found.append((path, f"must not contain control or invisible characters (NUL, escape, bidi controls "
                                f"such as U+202E, zero-width spaces: the value would not read as what runs"
                                f"{'; newlines and tabs are fine here' if multiline else ''}); got {hidden} in "
                                f"{_escaped(value)}"))
        elif size > MAX_TEXT_BYTES:
            found.append((path, f"must be at most {MAX_TEXT_BYTES // 1024} KiB (a command reaches the node as one "
                                f"environment string, and Linux refuses one over {MAX_ARG_STRLEN // 1024} KiB); got "
                                f"{size:,} bytes: put a long script in your code and run that"))
        return found
    children: list[tuple[int | str, Any]] = []
    if isinstance(value, dict):
        for key, child in value.items():
            hidden = _hidden(str(key), False)
            if _TOKEN_VALUE.search(str(key)):
                found.append((path, f"must not name a key with a token (the stack file shows it in clear text): use "
                                    f"{secret_for(str(key)[:3])}; got a key (not shown)"))
                continue
            if hidden is not None:
                found.append(((*path, str(key)), f"must be a key without control or invisible characters; got "
                                                 f"{hidden} in {_escaped(str(key))}"))
                continue
            children.append((key, child))
    elif isinstance(value, list):
        children = list(enumerate(value))
    for key, child in children:
        found += text_problems(child, (*path, key))
    return found


# ------------------------------------------------------------------------------------------- framework overrides
# A key as the frameworks name settings (`actor_rollout_ref.rollout.n`, `ds.param_dtype`), with Hydra's `+`, `++`
# and `~` in front where wanted; never a leading `-`, which a command line reads as an option (Hydra's
# `--config-dir`, argparse's flags).
_OVERRIDE_KEY = re.compile(r"(?:\+\+|\+|~)?[A-Za-z0-9_][A-Za-z0-9_.@/-]*")
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# Sizes and counts every framework needs positive: batch sizes and samples per prompt (ROLL rollout_batch_size,
# verl data.train_batch_size and ppo_mini_batch_size, OpenRLHF rollout.batch_size), and epochs.
_POSITIVE = re.compile(
    r"(?:batch_size|batch_size_per_gpu|n_samples_per_prompt|num_return_sequences_in_group|total_epochs|max_epochs"
    r"|num_episodes|num_train_epochs|ppo_epochs|max_steps|total_training_steps|rollout\.n)$"
)
# Learning rates: positive, not necessarily whole.
_RATE = re.compile(r"(?:^|[._])(?:lr|learning_rate)$")


def option_like_overrides(overrides: Mapping[str, Any], on_command_line: bool,
                          path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Override keys (and, where the framework takes them on a command line, values) that would be options."""
    found: list[tuple[tuple[str, ...], str]] = []
    for key, value in overrides.items():
        name = str(key)
        here = (*path, name)
        if not _OVERRIDE_KEY.fullmatch(name):
            found.append((here, "must be a setting's name such as `trainer.total_epochs` (letters, digits and "
                                "_.@/-, Hydra's `+`/`++`/`~` in front; not starting with `-`, which the framework's "
                                f"command line reads as an option of its own); got {_escaped(name)}"))
            continue
        bare = ".".join((*path, name)).lstrip("+~").split(".")
        if on_command_line and bare[0] == "hydra":
            found.append((here, "must not set Hydra's own settings (`hydra.searchpath` adds a config directory, "
                                "`hydra.run.dir` moves the outputs): the program runs the job with Hydra's defaults; "
                                f"got {_escaped(name)}"))
            continue
        if isinstance(value, Mapping):
            found += option_like_overrides(value, on_command_line, here)
            continue
        items = value if isinstance(value, list) else [value]
        dashed = [item for item in items if isinstance(item, str) and item.startswith("-")
                  and not _NUMBER.fullmatch(item)]
        if on_command_line and dashed:
            found.append((here, "must not start with `-` (the framework's command line would read it as an option, "
                                "e.g. `--config-dir` or another flag; a negative number is fine); got "
                                f"{_escaped(dashed[0])}"))
    return found


def non_positive_sizes(overrides: Mapping[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Batch sizes, samples per prompt and epochs that are not whole numbers of at least 1."""
    found: list[tuple[tuple[str, ...], str]] = []
    for key, value in overrides.items():
        here = (*path, str(key))
        if isinstance(value, Mapping):
            found += non_positive_sizes(value, here)
            continue
        dotted = ".".join(here).lstrip("+~")
        whole, rate = _POSITIVE.search(dotted) is not None, _RATE.search(dotted) is not None
        if not (whole or rate) or value is None:
            continue
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
            number = float(value)
        if whole and (isinstance(value, bool) or (number is not None and (number < 1 or number != int(number)))):
            found.append((here, f"must be a whole number of at least 1 (a size or count the framework divides by); "
                                f"got {_shown(value)}"))
        elif rate and (isinstance(value, bool) or (number is not None and number <= 0)):
            found.append((here, f"must be a number greater than 0 (a learning rate); got {_shown(value)}"))
    return found


_NON_FINITE_TEXT = re.compile(r"[+-]?(?:nan|inf|infinity|\.nan|\.inf)", re.IGNORECASE)


def non_finite_text(overrides: Mapping[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str]]:
    """Override text that a framework reads as NaN or infinity (Hydra and argparse's float() parse `nan`, `inf`;
    YAML `.nan`, `.inf`)."""
    found: list[tuple[tuple[str, ...], str]] = []
    for key, value in overrides.items():
        here = (*path, str(key))
        if isinstance(value, Mapping):
            found += non_finite_text(value, here)
            continue
        items = value if isinstance(value, list) else [value]
        bad = next((item for item in items if isinstance(item, str) and _NON_FINITE_TEXT.fullmatch(item.strip())),
                   None)
        if bad is not None:
            found.append((here, f"must be a finite number (the framework reads {_shown(bad)} as NaN or infinity); "
                                f"got {_shown(bad)}"))
    return found
