"""The engine's half of the offline cloud: what `pulumi up`, `preview` and `destroy` do with each resource.

Sources (pulumi/pulumi HEAD 1b5949891b, pulumi-command v1.2.1 on pulumi-go-provider v1.3.0; evidence in
reference/pulumi-engine-semantics.md):
- A changed input is an **update** unless the change replaces: a field the provider marks ForceNew, a path the
  resource's `replace_on_changes` contains (`PropertyPath.Contains`, sdk/go/common/resource/properties_path.go
 ), a `replacement_trigger` that differs from the recorded one (null on either side: no replace; unknown:
  replace; pkg/resource/deploy/step_generator.go), a `deleted_with`/`replace_with` resource that is
  replaced, or `pulumi up --replace`.
- pulumi-command: only `triggers` replaces (provider/pkg/provider/common/inputs.go); an update re-runs `update`
  or else `create` and never `delete` (local/commandController.go, remote/commandController.go);
  `delete` runs from the old state on destroy, removal or replacement.
- Replacement creates before it deletes, unless `delete_before_replace` (step_generator.go); the old
  resources of create-before-delete replacements and removed resources are deleted at the end, in
  reverse dependency order.
- A provider resource whose configuration changes (docker `host`) is updated, not replaced: pulumi-docker sets no
  ForcesProviderReplace on `host` (provider/resources.go); resources on it are diffed on their own inputs.
- Preview runs nothing: a new or replaced resource has no id and its computed outputs are unknown
  (pulumi-go-provider infer/resource.go; bridged providers the same).
- Destroy deletes in reverse dependency order and stops at the first failed delete (no --continue-on-error); a
  resource whose `deleted_with` resource is deleted too is dropped without its provider's Delete
  (pkg/resource/deploy/step.go); `retain_on_delete` drops it from the state only.
See verified-facts#engine-model-step-generator.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pulumi
from google.protobuf import json_format  # type: ignore[import-untyped]
from pulumi.runtime import rpc

from devtools import provider_rules
from devtools.mock_secrets import unwrap
from infra.layout import PROJECT_DIR

UNKNOWN = rpc.UNKNOWN
PROVIDER_PREFIX = "pulumi:providers:"
COMMAND_TYPES = ("command:local:Command", "command:remote:Command")
# pulumi-command's remote.CopyToRemote (the node's script library): `triggers` replaces (replaceOnChanges,
# remote/copy.go); an update copies again when the archive's hash or the remote path changed (copyController.go
# Update); it has no delete.
COPY_TYPE = "command:remote:CopyToRemote"

# kreuzwerker/terraform-provider-docker v4.5.0 internal/provider/resource_docker_container.go: every field is
# ForceNew except these (restart 272, must_run, memory*, cpu_* ; the rest of this list is UNCONFIRMED: taken
# from the provider's update function, resourceDockerContainerUpdate, which handles only these).
DOCKER_CONTAINER_UPDATABLE = frozenset({
    "restart", "maxRetryCount", "mustRun", "memory", "memorySwap", "cpuShares", "cpuSet", "start", "attach",
    "logs", "wait", "waitTimeout", "destroyGraceSeconds", "removeVolumes",
})
# resource_docker_image.go (RemoteImage): ForceNew `name`, `triggers` 84, `pull_triggers`, `platform`;
# `keep_locally` 55 is not.
DOCKER_IMAGE_FORCE_NEW = frozenset({"name", "triggers", "pullTriggers", "platform", "build"})
# pulumi-docker provider/resources.go: docker_container has DeleteBeforeReplace.
# see verified-facts#engine-model-resources
ALWAYS_DELETE_BEFORE_REPLACE = frozenset({"docker:index/container:Container"})


def forces_new(typ: str, path: str) -> bool:
    """Whether a change at `path` (top-level name first) makes the provider replace the resource.

    alicloud from the provider rules generated from terraform-provider-alicloud (devtools/provider_rules), docker
    from the kreuzwerker source above, commands from pulumi-command."""
    top = re.split(r"[.\[]", path, maxsplit=1)[0]
    if typ.startswith("alicloud:"):
        return provider_rules.force_new(typ, path) or provider_rules.force_new(typ, top)
    if typ == "docker:index/container:Container":
        return top not in DOCKER_CONTAINER_UPDATABLE
    if typ == "docker:index/remoteImage:RemoteImage":
        return top in DOCKER_IMAGE_FORCE_NEW
    if typ in COMMAND_TYPES or typ == COPY_TYPE:
        return top == "triggers"
    return False


@dataclass(frozen=True)
class Registration:
    """What the program asked of the engine for one resource (its RegisterResourceRequest)."""

    type: str
    name: str
    dependencies: frozenset[str] = frozenset()  # names of the resources it depends on (provider included)
    replace_on_changes: tuple[str, ...] = ()
    delete_before_replace: bool = False
    ignore_changes: tuple[str, ...] = ()
    replacement_trigger: str | None = None  # canonical JSON; None when unset
    deleted_with: str | None = None  # a resource name
    replace_with: tuple[str, ...] = ()
    retain_on_delete: bool = False
    aliases: tuple[str, ...] = ()  # former names


def name_of(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]


def registration(request: Any) -> Registration:
    """A Registration from the RegisterResourceRequest the Python SDK sends (pulumi/runtime/resource.py)."""
    trigger: str | None = None
    if request.HasField("replacement_trigger"):
        value = json_format.MessageToDict(request.replacement_trigger)
        trigger = None if value is None else json.dumps(value, sort_keys=True)
    dependencies = {name_of(u) for u in request.dependencies}
    if request.provider:
        dependencies.add(name_of(request.provider.rsplit("::", 1)[0]))  # a provider reference is "<urn>::<id>"
    aliases = tuple(a.spec.name if a.HasField("spec") else name_of(a.urn) for a in request.aliases) + tuple(
        name_of(u) for u in request.aliasURNs)
    return Registration(
        type=request.type, name=request.name, dependencies=frozenset(dependencies),
        replace_on_changes=tuple(request.replaceOnChanges), delete_before_replace=request.deleteBeforeReplace,
        ignore_changes=tuple(request.ignoreChanges), replacement_trigger=trigger,
        deleted_with=name_of(request.deletedWith) if request.deletedWith else None,
        replace_with=tuple(name_of(u) for u in request.replace_with),
        retain_on_delete=bool(request.retainOnDelete), aliases=aliases,
    )


# ------------------------------------------------------------------------------------------------ diffs
def _components(path: str) -> list[str]:
    return [p for p in re.split(r"[.\[\]\"]+", path) if p]


def contains(pattern: str, path: str) -> bool:
    """PropertyPath.Contains: `pattern` is a prefix of `path`, `*` matching any one component."""
    want, have = _components(pattern), _components(path)
    if len(want) > len(have):
        return False
    return all(w in ("*", h) for w, h in zip(want, have, strict=False))


ARCHIVE_SIG = "0def7320c3a5731c473e5ecbe6d01bc7"  # sdk/go/common/resource/archive/archive.go ArchiveSig
ASSET_SIG = "c44067f5952c0a294b673a41bacd8c17"  # sdk/go/common/resource/asset/asset.go AssetSig
SIG_KEY = "4dabf18193072939515e22adb298388d"


@functools.cache
def _content_hash(path_text: str) -> str:
    path = Path(path_text) if Path(path_text).is_absolute() else PROJECT_DIR / path_text
    digest = hashlib.sha256()
    for item in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if item.is_file():
            digest.update(str(item.relative_to(path) if path.is_dir() else item.name).encode())
            digest.update(item.read_bytes())
    return digest.hexdigest()


def state_json(value: Any) -> Any:
    """json.dumps' `default`: an asset or archive as Pulumi's state keeps it (archive.go / asset.go Serialize: its
    signature, hash and path; a path's content is never stored, a StringAsset's text is), anything else as str."""
    if isinstance(value, (pulumi.FileArchive, pulumi.FileAsset)):
        sig = ARCHIVE_SIG if isinstance(value, pulumi.FileArchive) else ASSET_SIG
        return {SIG_KEY: sig, "hash": _content_hash(value.path), "path": value.path}
    if isinstance(value, pulumi.StringAsset):
        return {SIG_KEY: ASSET_SIG, "hash": hashlib.sha256(value.text.encode()).hexdigest(), "text": value.text}
    return str(value)


def as_stored(value: Any) -> Any:
    """`value` with every asset and archive as the state stores it (state_json), so that inputs compare by content."""
    if isinstance(value, dict):
        return {k: as_stored(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [as_stored(v) for v in value]
    if isinstance(value, (pulumi.FileArchive, pulumi.FileAsset, pulumi.StringAsset)):
        return state_json(value)
    return value


def diff_paths(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The detailed diff's paths: nested keys and list elements that differ (`triggers[0]`, `connection.host`)."""
    old, new = unwrap(old), unwrap(new)
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        found: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old or key not in new:
                found.append(path)
            else:
                found.extend(diff_paths(old[key], new[key], path))
        return found
    if isinstance(old, list) and isinstance(new, list) and prefix:
        found = []
        for index in range(max(len(old), len(new))):
            path = f"{prefix}[{index}]"
            if index >= len(old) or index >= len(new):
                found.append(path)
            else:
                found.extend(diff_paths(old[index], new[index], path))
        return found
    if json.dumps(old, sort_keys=True, default=state_json) != json.dumps(new, sort_keys=True, default=state_json):
        return [prefix]
    return []


def decide(
    typ: str,
    inputs: Mapping[str, Any],
    reg: Registration | None,
    old_inputs: Mapping[str, Any] | None,
    old_reg: Registration | None,
    replaced: Iterable[str],
    forced: Iterable[str] = (),
) -> str:
    """create, same, update or replace: what the engine does with a resource this run registers."""
    if old_inputs is None:
        return "create"
    reg = reg or Registration(typ, "")
    replaced = set(replaced)
    if reg.name in set(forced):
        return "replace"
    if typ.startswith("alicloud:"):
        # The provider's own diff: Optional+Computed fields left out, DiffSuppressFuncs, ForceNew per path.
        diff = provider_rules.changed_paths(typ, old_inputs, inputs, set(reg.ignore_changes))
        if any(diff.values()):
            return "replace"
        paths = list(diff)
    else:
        paths = [p for p in diff_paths(dict(old_inputs), dict(inputs))
                 if not any(contains(ignored, p) for ignored in reg.ignore_changes)]
    if typ.startswith(PROVIDER_PREFIX):
        return "update" if paths else "same"
    if any(forces_new(typ, p) for p in paths):
        return "replace"
    if any(contains(pattern, p) for pattern in reg.replace_on_changes for p in paths):
        return "replace"
    old_trigger = old_reg.replacement_trigger if old_reg else None
    new_trigger = reg.replacement_trigger
    if old_trigger is not None and new_trigger is not None and (UNKNOWN in new_trigger or old_trigger != new_trigger):
        return "replace"
    if (reg.deleted_with and reg.deleted_with in replaced) or replaced & set(reg.replace_with):
        return "replace"
    return "update" if paths else "same"


def has_unknown(value: Any) -> bool:
    """Whether a mock input holds a value a preview does not know yet (the output of a resource not created)."""
    from pulumi.output import Unknown

    value = unwrap(value)
    if isinstance(value, Unknown) or value == UNKNOWN:
        return True
    if isinstance(value, Mapping):
        return any(has_unknown(v) for v in value.values())
    if isinstance(value, list):
        return any(has_unknown(v) for v in value)
    return False


def delete_first(typ: str, reg: Registration | None) -> bool:
    return typ in ALWAYS_DELETE_BEFORE_REPLACE or bool(reg and reg.delete_before_replace)


# ------------------------------------------------------------------------------------------------ operations
def dependents(names: Sequence[str], dependencies: Mapping[str, Iterable[str]], root: str) -> list[str]:
    """The resources that depend on `root`, directly or through others (their provider included), in `names`'
    (dependency) order."""
    found: set[str] = {root}
    ordered: list[str] = []
    for name in names:
        if name != root and found & set(dependencies.get(name, ())):
            found.add(name)
            ordered.append(name)
    return ordered


@dataclass
class Ops:
    """The steps an `up` takes, in order: (verb, name), verb one of create, update, same, replace (the creation
    half of a replacement) and delete. Deletes of create-before-delete replacements and of removed resources
    come last, in reverse dependency order (`finish`): the engine deletes them only once every other step is done
    (deployment_executor.go, performPostSteps), and not at all once a step failed (step_executor.go
    : the first error cancels the deployment; `execute` below). See verified-facts#engine-model-deployment-executor."""

    steps: list[tuple[str, str]] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)

    def record(self, change: str, name: str, dbr: bool) -> None:
        if change == "replace" and dbr:
            self.steps.append(("delete", name))
        elif change == "replace":
            self.deferred.append(name)
        self.steps.append((change, name))

    def finish(self, prior_names: list[str], current_names: Iterable[str],
               prior_dependencies: Mapping[str, Iterable[str]] | None = None) -> list[tuple[str, str]]:
        """The whole sequence. A delete-before-replace deletes first the prior resources that depend on it and that
        this run replaces, in reverse dependency order (step_generator.go, calculateDependentReplacements
        : a dependent whose inputs or provider would change with it is condemned with it); those are not deleted
        again later. See verified-facts#engine-model-step-generator-2."""
        kept = set(current_names)
        replaced = {n for verb, n in self.steps if verb == "replace"}
        early: set[str] = set()
        steps: list[tuple[str, str]] = []
        for verb, name in self.steps:
            if verb == "delete":
                if name in early:
                    continue
                if prior_dependencies is not None:
                    condemned = [d for d in dependents(prior_names, prior_dependencies, name)
                                 if d in replaced and d not in early]
                    for dependent in reversed(condemned):
                        steps.append(("delete", dependent))
                        early.add(dependent)
                early.add(name)
            steps.append((verb, name))
        late = [n for n in reversed(prior_names) if (n in self.deferred or n not in kept) and n not in early]
        return steps + [("delete", n) for n in late]


@dataclass
class Executed:
    """What an `up` did: the steps it ran (in order) and the first that failed, with its error. After a failure the
    engine starts nothing more: no later step and none of the deletes that come last."""

    done: list[tuple[str, str]]
    failed: tuple[str, str] | None = None
    error: str | None = None


def execute(ops: Sequence[tuple[str, str]], perform: Callable[[str, str], str | None]) -> Executed:
    """Run the steps in the engine's order; `perform(verb, name)` does one step and returns its error (None: done).
    `same` steps are not performed."""
    done: list[tuple[str, str]] = []
    for verb, name in ops:
        if verb == "same":
            continue
        error = perform(verb, name)
        if error is not None:
            return Executed(done, (verb, name), error)
        done.append((verb, name))
    return Executed(done)


# ------------------------------------------------------------------------------------------------ refresh
# What a Read does per provider (`pulumi refresh`, `pulumi up --refresh`): pkg/resource/deploy/step.go RefreshStep
# calls the provider's Read for every custom resource; an error fails the step and the refresh.
# - docker Container and RemoteImage: the provider's client dials its `ssh://` host (kreuzwerker/terraform-provider-
#   docker v4.5.0 resource_docker_container_funcs.go; resource_docker_image_funcs.go;
#   config.go): an unreachable host fails the Read.
# - pulumi-command: v1.2.1 implements no Read (provider/pkg/provider has none; pulumi-go-provider infer keeps the
#   state): nothing is dialled, nothing changes.
# - alicloud: the cloud's answer (DescribeInstances): a released instance is gone from the state, a stopped one
#   reads `Stopped` (inputs and outputs: the bridge extracts inputs from the read state).
# see verified-facts#engine-model-resource-docker-container-funcs
READ_DIALS_HOST = frozenset({"docker:index/container:Container", "docker:index/remoteImage:RemoteImage"})


@dataclass
class Refreshed:
    """A refresh: the state it leaves (the prior state when it failed), what it read, and its first failed Read."""

    state: list[Any]
    read: list[str]
    failed: str | None = None
    error: str | None = None


def refresh(resources: Sequence[Any], reachable: Callable[[str], bool],
            read_cloud: Callable[[Any], Mapping[str, Any] | None] = lambda r: r.outputs,
            targets: Callable[[Any], bool] = lambda _: True) -> Refreshed:
    """`pulumi refresh` (or the refresh of `up --refresh`) of `resources` (a state: Registered-like, with type,
    name, inputs, outputs, provider, custom). `reachable(host)`: whether a host answers over SSH. `read_cloud(r)`:
    an alicloud resource's outputs as the cloud reads them now (None: gone). `targets`: `--target` / `--exclude`."""
    by_name = {r.name: r for r in resources}
    state: list[Any] = []
    read: list[str] = []
    for r in resources:
        if not getattr(r, "custom", True) or r.type.startswith(PROVIDER_PREFIX) or not targets(r):
            state.append(r)
            continue
        read.append(r.name)
        if r.type in READ_DIALS_HOST:
            provider = by_name.get(name_of(r.provider.rsplit("::", 1)[0])) if r.provider else None
            host = provider_host(provider.inputs) if provider is not None else None
            if host is not None and not reachable(host):
                return Refreshed(list(resources), read, r.name,
                                 f"{r.name}: refreshing: error during connect: ssh: connect to host {host} port 22: "
                                 "Connection timed out")
            state.append(r)
        elif r.type.startswith("alicloud:"):
            outputs = read_cloud(r)
            if outputs is None:
                continue  # deleted outside the program: the refresh drops it from the state
            inputs = dict(r.inputs)
            for key in ("status", "publicIp"):
                if key in outputs and key in inputs:
                    inputs[key] = outputs[key]
            state.append(_with(r, inputs=inputs, outputs=dict(outputs)))
        else:
            state.append(r)
    return Refreshed(state, read)


def _with(r: Any, **changes: Any) -> Any:
    import dataclasses

    return dataclasses.replace(r, **changes)


def provider_host(provider_inputs: Mapping[str, Any]) -> str | None:
    """The address a docker provider's `ssh://user@host:port` dials."""
    host = str(unwrap(provider_inputs.get("host")) or "")
    match = re.match(r"ssh://(?:[^@]+@)?([^:/]+)", host)
    return match.group(1) if match else None


def urn_glob(pattern: str, typ: str, name: str) -> bool:
    """Whether `--target`/`--exclude` `pattern` matches the URN of a resource (deploy/deployment.go NewUrnTargets:
    `**` any text, `*` any text without `:`; the URN's project, stack and parent types are matched as anything)."""
    parts = [re.escape(p).replace(r"\*", "[^:]*") for p in pattern.split("**")]
    regex = "^" + ".*".join(parts) + "$"
    return re.match(regex, f"urn:pulumi:stack::project::parent${typ}::{name}") is not None


@dataclass
class Destroyed:
    """What `pulumi destroy` did: the resources it deleted (in order), those it dropped from the state without a
    provider Delete (deleted_with, retain_on_delete), and the first delete that failed (it stops there)."""

    deleted: list[str]
    dropped: list[str]
    failed: str | None
    error: str | None


def dialed_host(typ: str, inputs: Mapping[str, Any], provider_inputs: Mapping[str, Any] | None) -> str | None:
    """The host a resource's provider Delete connects to, if any: a docker container (its provider's ssh host)
    and a remote command that has a `delete`. Local commands run here."""
    if typ == "docker:index/container:Container" and provider_inputs is not None:
        return provider_host(provider_inputs)
    if typ == "command:remote:Command" and unwrap(inputs.get("delete")):
        connection = unwrap(inputs.get("connection")) or {}
        return str(connection.get("host")) if isinstance(connection, Mapping) else None
    return None


def kept_names(resources: Iterable[Any]) -> set[str]:
    """The names a run's resources hold in the state: their own and their aliases (a prior resource of such a name
    is kept, not deleted)."""
    names: set[str] = set()
    for r in resources:
        names.add(r.name)
        names |= set(r.registration.aliases) if r.registration is not None else set()
    return names


class _State(Protocol):
    type: str
    name: str
    inputs: dict[str, Any]
    provider: str | None
    registration: Registration | None


def run_local_delete(r: _State, cwd: str, only: Callable[[str], bool] = lambda _: True) -> str | None:
    """A local.Command's delete as pulumi-command runs it on destroy: `/bin/sh -c <delete>` from the old state, in
    the provider's working directory, with os.environ plus its `environment` (local/commandOutputs.go).
    Returns its error (stderr), None on success; `only` selects which deletes run (the others succeed).
    See verified-facts#engine-model-commandoutputs."""
    delete = unwrap(r.inputs.get("delete"))
    if r.type != "command:local:Command" or not delete or not only(str(delete)):
        return None
    env = {**os.environ, **{k: str(unwrap(v)) for k, v in (unwrap(r.inputs.get("environment")) or {}).items()}}
    done = subprocess.run(["/bin/sh", "-c", str(delete)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    return None if done.returncode == 0 else f"{r.name}: {done.stderr.strip()}"


def destroy(resources: Sequence[_State], unreachable: Iterable[str],
            local: Callable[[Any], str | None] | None = None) -> Destroyed:
    """`pulumi destroy`: reverse dependency (registration) order; a delete that dials an unreachable host fails
    and the destroy stops there (nothing it depends on is deleted). `local`: runs local commands' deletes
    (run_local_delete); a failure stops the destroy the same way."""
    unreachable = set(unreachable)
    gone = {r.name for r in resources}
    by_name = {r.name: r for r in resources}
    deleted: list[str] = []
    dropped: list[str] = []
    for r in reversed(resources):
        reg = r.registration
        if reg is not None and (reg.retain_on_delete or (reg.deleted_with and reg.deleted_with in gone)):
            dropped.append(r.name)
            continue
        provider = by_name.get(name_of(r.provider.rsplit("::", 1)[0])) if r.provider else None
        host = dialed_host(r.type, r.inputs, provider.inputs if provider else None)
        if host is not None and host in unreachable:
            return Destroyed(deleted, dropped, r.name, f"{r.name}: ssh: connect to host {host}: timed out")
        error = local(r) if local is not None else None
        if error is not None:
            return Destroyed(deleted, dropped, r.name, error)
        deleted.append(r.name)
    return Destroyed(deleted, dropped, None, None)


def record_registrations(monitor: Any, into: dict[str, Registration]) -> None:
    """Mocks hand new_resource the inputs only; the engine model needs the request's options (dependencies,
    replacement_trigger, deleted_with, aliases...): record each request before the mock monitor answers it."""
    register = monitor.RegisterResource

    def recording(request: Any) -> Any:
        if request.type != "pulumi:pulumi:Stack":
            into[request.name] = registration(request)
        return register(request)

    monitor.RegisterResource = recording
