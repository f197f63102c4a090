"""The walker (issue 19): hostile values in every free-text field of every shipped stack, and every rendered command
checked. No user-supplied value may appear unquoted in a rendered script, or as an option of git, ssh or pip.

For each base (the shipped stacks, plus variants that reach optional fields) and each hostile shape, every field is
given a value holding a unique marker. A value the configuration refuses must be refused as a ConfigError naming
the field, before any resource. A value it accepts is rendered by the real program on the offline cloud, and:

- R1: every remote step's script (and the teardown's REMOTE_COMMAND, and the instances' user data) carries user
  values only in its `export NAME='...'` lines, each exactly as `shlex.quote` writes it; the static body after
  them never holds a marker.
- R2: a variable that holds shell code (the job's entrypoint, preparation and pre-submit check, the reward
  server's command) holds a marker only inside single quotes, or as a plain word of characters the shell reads
  as data that does not start with `-`. The three fields that are shell code by design are exempt for their own
  marker.
- R3: the commands in the stack outputs follow R2's rule, and `user@host` comes after `--`.
- R4: a field whose value reaches git, ssh or pip as data (refs, repositories, URLs, packages, users, hosts)
  accepts no value starting with `-` and no shell metacharacter; the scripts' own `--` are checked by
  tests/offline/test_untrusted_input.py::test_git_ssh_and_pip_end_options_before_config_values.
"""

from __future__ import annotations

import copy
import re
import shlex
import typing
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from devtools.offline_cloud import OfflineCloud, OfflineRun, run_program, shipped_stacks, stack_config, unwrap
from infra.config import PROJECT, ClusterConfig, ConfigError, ContainerConfig, parse_cluster_config
from infra.sources.alibaba.placement import PlacementError
from infra.sources.alibaba.user_data import decode_user_data
from infra.sources.base import SourceError

Path_ = tuple[str, ...]


def _fields(model: type[BaseModel], path: Path_ = ()) -> Iterator[Path_]:
    """Every free-text leaf: `*` steps into the first element of a list of objects, `[]` is one list item."""
    for name, field in model.model_fields.items():
        alias = field.alias or name
        annotation = field.annotation
        candidates = [annotation, *typing.get_args(annotation)]
        sub = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if sub is not None:
            yield from _fields(sub, (*path, alias))
            continue
        lists = [c for c in candidates if typing.get_origin(c) is list]
        if lists:
            inner = typing.get_args(lists[0])[0]
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                yield from _fields(inner, (*path, alias, "*"))
            elif inner is str:
                yield (*path, alias, "[]")
            continue
        if typing.get_origin(annotation) is dict:
            yield (*path, alias, "{}")
        elif annotation is str or str in candidates:
            yield (*path, alias)


FIELDS = [p for p in _fields(ClusterConfig) if p[0] != "region"]

# Fields that stay shell code by design (the user's own command): exempt for their own marker only.
CODE_FIELDS = {
    ("training", "custom", "entrypoint"), ("training", "verl", "dataPreparation"),
    ("training", "openrlhf", "rewardServer", "command"),
}
# Fields that may still hold shell metacharacters after validation: they are data (quoted where used) or never
# reach a shell (osImage is a regex for the getImages API; acceleratorModel is display text; overrides go into the
# framework's YAML or JSON; the key's comment; paths, which travel quoted).
FREE_TEXT = CODE_FIELDS | {
    ("training", "overrides", "{}"), ("nodes", "acceleratorModel"), ("nodes", "osImage"),
    ("access", "sshPublicKey"), ("training", "verl", "dataDir"), ("training", "custom", "workingDir"),
    ("training", "mindspeedRl", "codeDir"), ("training", "mindspeedRl", "tokenizerPath"),
    ("training", "mindspeedRl", "dataPath"), ("training", "mindspeedRl", "loadPath"),
    ("training", "mindspeedRl", "savePath"), ("training", "roll", "checkout"), ("access", "sshPrivateKeyPath"),
}
WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"
REAL_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMR+SbE52JYp8zoMUnNK2iR+m4SPaijZ3p3gcG/0NCwD"


def shapes(marker: str) -> dict[str, str]:
    """Hostile values, each holding the marker once."""
    return {
        "squote": f"v1'{marker};touch /tmp/w;'",
        "subst": f'x"$(touch /tmp/w){marker}`id`',
        "dash": f"-o{marker}=touch",
        "dashlong": f"--upload-pack={marker}",
        "space": f"a {marker} --index-url=https://e.invalid/",
        "newline": f"a\n{marker}",
        "path": f"/srv/{marker}$(id)'x",
        "url": f"https://e.invalid/{marker}$(id)';x",
        "userinfo": f"https://u:{marker}@e.invalid/x.git",
        "pkg": f"pkg==1{marker};id",
        # Round four (issue 28): option-like override keys, URL schemes, credentials, control characters, sizes.
        "optkey": f"--config-dir=/srv/{marker}",
        "http": f"http://e.invalid/{marker}.git",
        "gitproto": f"git://e.invalid/{marker}.git",
        "sshdash": f"ssh://-oProxyCommand={marker}/x.git",
        "query": f"https://e.invalid/{marker}.tar.gz?token=abc",
        "cred": f"wandb login {WANDB_KEY} && python3 {marker}.py",
        "nul": f"a\x00{marker}",
        "bidi": f"a\u202e{marker}",
        "huge": "x" * 100_000 + marker,
    }


SHAPES = list(shapes("M"))


def hostile(path: Path_, marker: str, shape: str) -> str:
    value = shapes(marker)[shape]
    if path == ("access", "sshPublicKey"):
        return f"{REAL_KEY} {value}"  # a real key with a hostile comment
    return value


# Bases: the shipped stacks, and variants that reach optional fields.
def bases() -> dict[str, tuple[str, dict[str, Any], dict[str, str]]]:
    out: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
        name: (name, copy.deepcopy(stack_config(name)), {}) for name in shipped_stacks()
    }
    custom = copy.deepcopy(stack_config("dev"))
    custom[f"{PROJECT}:training"] = {"framework": "custom", "custom": {"entrypoint": "python3 train.py"}}
    out["dev-custom"] = ("dev", custom, {})
    registry = copy.deepcopy(stack_config("dev"))
    registry[f"{PROJECT}:container"] = {**registry.get(f"{PROJECT}:container", {}), "registryUsername": "me"}
    out["dev-registry"] = ("dev", registry, {f"{PROJECT}:registryPassword": "x"})
    shared = copy.deepcopy(stack_config("hosts"))
    shared[f"{PROJECT}:storage"] = {"sharedHostPath": "/mnt/nfs/shared"}
    out["hosts-shared"] = ("hosts", shared, {})
    # A ROLL config that uses WebShop: the code step renders roll_env_setup.sh and its WEBSHOP_* settings.
    webshop = copy.deepcopy(stack_config("large"))
    webshop[f"{PROJECT}:training"] = {"framework": "roll", "roll": {
        "pipeline": "agentic", "baseConfig": "qwen2.5-7B-agentic_megatron/agentic_val_webshop.yaml"}}
    out["large-webshop"] = ("large", webshop, {})
    return out


FRAMEWORK_OF = {"roll": "roll", "verl": "verl", "openrlhf": "openrlhf", "custom": "custom",
                "mindspeedRl": "mindspeed-rl"}


def applies(config: dict[str, Any], path: Path_) -> bool:
    if path[0] == "training" and len(path) > 2 and path[1] in FRAMEWORK_OF:
        framework = config.get(f"{PROJECT}:training", {}).get("framework", "roll")
        return bool(framework == FRAMEWORK_OF[path[1]])
    return True


def put(config: dict[str, Any], path: Path_, value: str, shape: str = "") -> bool:
    node: Any = config.setdefault(f"{PROJECT}:{path[0]}", {})
    parts = list(path[1:])
    while len(parts) > 1:
        key = parts.pop(0)
        if parts[0] == "*":
            items = node.get(key)
            if not isinstance(items, list) or not items:
                return False
            parts.pop(0)
            node = items[0]
            continue
        if parts[0] in ("[]", "{}"):
            # An override's key is the value itself for `optkey` (a key that would be an option), else `a.<value>`.
            node[key] = [value] if parts[0] == "[]" else {value if shape == "optkey" else f"a.{value}": value}
            return True
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    node[parts[0]] = value
    return True


def key_of(path: Path_) -> str:
    return ".".join(p for p in path if p not in ("*", "[]", "{}"))


# ------------------------------------------------------------------------------------------------ the checks
def quoting_at(code: str, index: int) -> str:
    """The shell's quoting state at code[index]: plain, single or double."""
    i, state = 0, "plain"
    while i < index:
        c = code[i]
        if state == "plain":
            if c == "\\":
                i += 2
                continue
            state = {"'": "single", '"': "double"}.get(c, "plain")
        elif state == "single" and c == "'":
            state = "plain"
        elif state == "double":
            if c == "\\":
                i += 2
                continue
            if c == '"':
                state = "plain"
        i += 1
    return state


_SAFE_WORD = re.compile(r"[\w@%+=:,./-]+")
_STOP = set("'\";|&()<>` \t\n")


def check_code(where: str, code: str, marker: str, findings: list[str]) -> None:
    for match in re.finditer(re.escape(marker), code):
        state = quoting_at(code, match.start())
        if state == "single":
            continue
        start, end = match.start(), match.end()
        while start > 0 and code[start - 1] not in _STOP:
            start -= 1
        while end < len(code) and code[end] not in _STOP:
            end += 1
        word = code[start:end]
        if state == "plain" and _SAFE_WORD.fullmatch(word) and not word.startswith("-"):
            continue
        findings.append(f"{where}: marker in {state} context: {code[max(0, match.start() - 60):end + 20]!r}")


CODE_VARS = {"JOB_ENTRYPOINT", "JOB_PREPARE", "JOB_PRE_SUBMIT_CHECK", "REWARD_COMMAND"}
OWN_CODE_VARS = {"JOB_ENTRYPOINT", "JOB_PREPARE", "REWARD_COMMAND"}


_QUOTED_WORD = re.compile(r"(?:'[^']*'|\"'\"|[\w@%+=:,./-])*")
_EXPORT = re.compile(r"^export ([A-Za-z_][A-Za-z0-9_]*)=", re.MULTILINE)


def exports(text: str) -> tuple[dict[str, str], str]:
    """The `export NAME=<word>` values of a script, each word read as shlex.quote writes one (single-quoted
    segments, `"'"` for a quote, or bare safe characters), and the script without them."""
    env: dict[str, str] = {}
    body: list[str] = []
    position = 0
    for match in _EXPORT.finditer(text):
        if match.start() < position:
            continue  # inside a value that spans lines
        word = _QUOTED_WORD.match(text, match.end())
        assert word is not None
        body.append(text[position:match.start()])
        env[match.group(1)] = "".join(shlex.split(word.group(0))) if word.group(0) else ""
        position = word.end()
    body.append(text[position:])
    return env, "".join(body)


def check_script(where: str, text: str, marker: str, own_code: bool, findings: list[str]) -> None:
    env, body = exports(text)
    for name, value in env.items():
        if marker in value and f"export {name}={shlex.quote(value)}" not in text:
            findings.append(f"{where}: export of {name} is not as shlex.quote writes it")
    if marker in body:
        findings.append(f"{where}: marker in the static body of the script")
    for name, value in env.items():
        if marker not in value:
            continue
        if name == "REMOTE_COMMAND":
            check_script(f"{where}/REMOTE_COMMAND", value, marker, own_code, findings)
        elif name in CODE_VARS and not (own_code and name in OWN_CODE_VARS):
            check_code(f"{where}/{name}", value, marker, findings)


def leaves(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    value = unwrap(value)
    if isinstance(value, dict):
        for key, child in value.items():
            yield from leaves(child, f"{path}.{key}")
    elif isinstance(value, list | tuple):
        for index, child in enumerate(value):
            yield from leaves(child, f"{path}[{index}]")
    elif isinstance(value, str):
        yield path, value


OUTPUT_COMMANDS = {"sshHead", "dashboardTunnel", "jobStatus", "jobLogs", "jobStop", "jobSubmit", "jobResubmit"}


def examine(result: OfflineRun, marker: str, own_code: bool) -> list[str]:
    findings: list[str] = []
    for resource in result.cloud.resources:
        for path, text in leaves(resource.inputs):
            if resource.type == "alicloud:ecs/instance:Instance" and path == ".userData":
                text = decode_user_data(text)
                if marker in text:
                    check_script(f"{resource.name}/userData", text, marker, own_code, findings)
            elif marker not in text:
                continue
            elif resource.type == "command:remote:Command" and path in (".create", ".stdin"):  # stdin: the script
                check_script(resource.name, text, marker, own_code, findings)
            elif resource.type == "command:local:Command" and path == ".environment.REMOTE_COMMAND":
                check_script(f"{resource.name}/REMOTE_COMMAND", text, marker, own_code, findings)
    for name, value in result.outputs.items():
        if name not in OUTPUT_COMMANDS:
            continue
        for _, text in leaves(value):
            if marker in text:
                check_code(f"output {name}", text, marker, findings)
                try:
                    words = shlex.split(text)
                except ValueError:
                    findings.append(f"output {name}: not one shell command: {text[:160]!r}")
                    continue
                logins = [i for i, w in enumerate(words) if re.fullmatch(r"[a-z_][a-z0-9_.-]*@\S+", w)]
                if logins and words[logins[0] - 1] != "--":
                    findings.append(f"output {name}: user@host not after --")
    return findings


# ------------------------------------------------------------------------------------------------ the walk
def refusal_names(error: Exception, path: Path_) -> bool:
    text = str(error)
    key = key_of(path)
    parent = key.rsplit(".", 1)[0]
    return f"{PROJECT}:{key}" in text or f"{PROJECT}:{parent}" in text or "roll-cluster:nodes.hosts[0]" in text


def walk(base: str, shape: str) -> tuple[list[str], set[Path_]]:
    """(problems, the fields that accepted the shape) for one base and one shape."""
    stack_name, config, secrets = bases()[base]
    problems: list[str] = []
    accepted: dict[Path_, str] = {}
    for index, path in enumerate(FIELDS):
        if not applies(config, path):
            continue
        marker = f"QZX{index:03d}{shape[:3]}Q"
        one = copy.deepcopy(config)
        if not put(one, path, hostile(path, marker, shape), shape):
            continue
        raw = {k.split(":", 1)[1]: (v if isinstance(v, str) else __import__("json").dumps(v))
               for k, v in one.items() if k.startswith(f"{PROJECT}:")}
        try:
            parse_cluster_config(raw, one.get("alicloud:region"))
        except ConfigError as error:
            if not refusal_names(error, path):
                problems.append(f"{base}/{shape}: {key_of(path)} refused under another key: {error}")
            continue
        accepted[path] = marker
    # One program run with every accepted field at once; each alone when that run is refused.
    combined = copy.deepcopy(config)
    for path, marker in accepted.items():
        put(combined, path, hostile(path, marker, shape), shape)
    runs: list[tuple[dict[Path_, str], dict[str, Any]]] = [(accepted, combined)]
    results: list[tuple[dict[Path_, str], OfflineRun]] = []
    while runs:
        fields, values = runs.pop()
        cloud = OfflineCloud()
        try:
            results.append((fields, run_program(stack_name, replace_config=values, cloud=cloud, secrets=secrets)))
        except (ConfigError, SourceError, PlacementError) as error:
            if any(r.custom for r in cloud.resources):
                problems.append(f"{base}/{shape}: refused after resources: {error}")
            if len(fields) > 1:
                for path, marker in fields.items():
                    alone = copy.deepcopy(config)
                    put(alone, path, hostile(path, marker, shape), shape)
                    runs.append(({path: marker}, alone))
        except Exception as error:
            problems.append(f"{base}/{shape}: {sorted(map(key_of, fields))[:3]}: crash {type(error).__name__}: "
                            f"{str(error)[:200]}")
    for fields, result in results:
        for path, marker in fields.items():
            for finding in examine(result, marker, path in CODE_FIELDS):
                problems.append(f"{base}/{shape}: {key_of(path)}: {finding}")
    return problems, set(accepted)


DATA_SHAPES = {"squote", "subst", "dash", "dashlong", "space", "newline", "optkey"}
# Shapes no field may take: control and invisible characters, and a value larger than one environment string.
NO_FIELD_SHAPES = {"nul", "bidi", "huge"}
URL_KEYS = {"repo", "mirrorRepo", "archiveUrl", "pipIndexUrl", "hfEndpoint", "registryMirror"}
URL_SHAPES = {"http", "gitproto", "sshdash", "query", "userinfo"}
OVERRIDES = ("training", "overrides", "{}")


@pytest.mark.parametrize("shape", SHAPES)
def test_no_hostile_value_is_rendered_as_code_or_an_option(shape: str) -> None:
    problems: list[str] = []
    accepted: set[Path_] = set()
    for base in bases():
        found, fields = walk(base, shape)
        problems += found
        accepted |= fields
    assert problems == [], "\n".join(problems[:20])
    # R4: only the free-text fields take a value that starts with `-` or holds a shell metacharacter.
    if shape in DATA_SHAPES:
        assert accepted <= FREE_TEXT, sorted(map(key_of, accepted - FREE_TEXT))
    if shape in NO_FIELD_SHAPES:
        assert accepted == set(), sorted(map(key_of, accepted))
    if shape in URL_SHAPES:
        # Plain http or git://, a host that is an option, a token in the query or user info: no URL field takes it.
        urls = {p for p in accepted if p[-1] in URL_KEYS or (p[-1] == "[]" and p[-2] == "preinstallPackages")}
        assert urls == set(), sorted(map(key_of, urls))
    if shape == "cred":
        # A key in a command or an override is refused, naming the secret to use.
        assert not accepted & (CODE_FIELDS | {OVERRIDES}), sorted(map(key_of, accepted & (CODE_FIELDS | {OVERRIDES})))
    if shape == "optkey":
        assert OVERRIDES not in accepted


def test_the_walk_covers_every_free_text_field() -> None:
    # A new field must be walked (and, if it may hold metacharacters, listed in FREE_TEXT on purpose).
    assert len(FIELDS) >= 70
    assert {key_of(p) for p in FREE_TEXT} <= {key_of(p) for p in FIELDS}


def test_the_webshop_base_walks_the_webshop_setup_of_the_code_step() -> None:
    # The variant must reach roll_env_setup.sh with its settings, or the walk above proves nothing about them.
    stack_name, config, secrets = bases()["large-webshop"]
    result = run_program(stack_name, replace_config=config, cloud=OfflineCloud(), secrets=secrets)
    scripts = [
        text for resource in result.cloud.resources if resource.type == "command:remote:Command"
        for path, text in leaves(resource.inputs) if path == ".stdin" and "/roll_env_setup.sh\n" in text
    ]
    assert scripts, "no code step renders roll_env_setup.sh"
    env, _ = exports(scripts[0])
    assert env["WEBSHOP_IMAGE"] == ContainerConfig().image and env["WEBSHOP_DIR"] == "third_party/webshop-minimal"
