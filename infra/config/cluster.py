"""The whole configuration: ClusterConfig's rules across sections, the error lines, and parse_cluster_config.

`parse_cluster_config` validates the `roll-cluster:*` values as Pulumi hands them over. Every error names the key
path as the user writes it (`roll-cluster:nodes.count`), what is allowed and what was given. Unknown fields are
errors that suggest the nearest valid name.
"""

from __future__ import annotations

import difflib
import json
import typing
from collections.abc import Mapping
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo

from infra import sources
from infra.config.access import AccessConfig
from infra.config.base import (
    PROJECT,
    SECRETS,
    SECTIONS,
    ConfigError,
    KeyPath,
    Section,
    _gpus,
    _problem,
    _Problems,
    _shown,
)
from infra.config.container import DEFAULT_ROLL_IMAGE, ContainerConfig, acr_vpc_region
from infra.config.nodes import NodesConfig
from infra.config.ray import RAY_FIXED_PORTS, RAY_PORT_KEYS, RayConfig
from infra.config.storage import StorageConfig
from infra.config.training import RegisteredFrameworks, TrainingConfig, is_mainland_region
from infra.config.values import text_problems
from infra.device_mapping import DeviceMappingError, parse_device_mapping
from infra.sources.alibaba import catalog, regions


class ClusterConfig(Section):
    region: str | None = Field(
        None,
        description="`alicloud:region` of the stack (the provider's standard key), e.g. `cn-hangzhou`. Required with "
        "nodes.source `alibaba`; ignored with `hosts` (no Alibaba resource is created).",
    )
    nodes: NodesConfig = Field(description="The GPU instances.")
    access: AccessConfig = Field(description="Who may reach the nodes, and with which SSH key.")
    container: ContainerConfig = Field(
        default_factory=ContainerConfig, description="The training container started on every node."
    )
    ray: RayConfig = Field(
        default_factory=RayConfig, description="The Ray cluster formed by the containers."
    )
    training: TrainingConfig = Field(
        default_factory=TrainingConfig, description="The training job submitted to the Ray cluster."
    )
    storage: StorageConfig = Field(
        default_factory=StorageConfig, description="Storage shared by all nodes."
    )

    @field_validator("region")
    @classmethod
    def _region(cls, region: str | None) -> str | None:
        if region is None:  # optional with nodes.source hosts
            return None
        if not regions.is_region(region):
            close = difflib.get_close_matches(region, regions.REGIONS, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise _problem(
                f"unknown region{hint}: must be an Alibaba Cloud region id such as `cn-hangzhou`, one of "
                f"{', '.join(regions.REGIONS)}; got {_shown(region)}"
            )
        return region

    @field_validator("nodes")
    @classmethod
    def _zone_in_region(cls, nodes: NodesConfig, info: ValidationInfo) -> NodesConfig:
        region = info.data.get("region")
        if region is not None and nodes.zone != "auto" and not regions.is_zone_of(nodes.zone, region):
            raise _problem(
                f"must be `auto` or a zone of alicloud:region {region} (such as `{regions.example_zone(region)}`); "
                f"got {_shown(nodes.zone)}",
                "zone",
            )
        return nodes

    @field_validator("container")
    @classmethod
    def _vpc_registry_in_region(cls, container: ContainerConfig, info: ValidationInfo) -> ContainerConfig:
        # A registry's VPC endpoint answers only inside its own region: from another region the pull would hang.
        region, vpc_region = info.data.get("region"), acr_vpc_region(container.registry_host)
        if region is not None and vpc_region is not None and vpc_region != region:
            raise _problem(
                f"uses the VPC endpoint of a registry in {vpc_region}, which nodes in alicloud:region {region} cannot "
                f"reach; use the registry's public endpoint, or copy the image into your registry in {region} "
                f"(registry-vpc.{region}.aliyuncs.com/...); got {_shown(container.image)}",
                "image",
            )
        nodes: NodesConfig | None = info.data.get("nodes")
        if nodes is not None and nodes.bake and "@" in container.image:
            # bake-prep commits the framework's requirements into the local tag of the image; a digest is no tag.
            raise _problem(
                "must be a tag (`repository:tag`), not a digest, with nodes.bake: true (the baked image keeps the "
                f"training image under its tag); got {_shown(container.image)}",
                "image",
            )
        return container

    @field_validator("container")
    @classmethod
    def _docker_hub_reachable(cls, container: ContainerConfig, info: ValidationInfo) -> ContainerConfig:
        region = info.data.get("region")
        mainland = region is not None and is_mainland_region(region)
        if mainland and container.from_docker_hub and container.registry_mirror is None:
            raise _problem(
                f"must not be a Docker Hub image in {region} without container.registryMirror: Docker Hub is not "
                "reachable from mainland China regions. Set container.registryMirror to a Docker Hub mirror (e.g. "
                "`docker.m.daocloud.io`), or push the image to your own ACR in the region and name that; got "
                + _shown(container.image),
                "image",
            )
        return container

    @field_validator("container")
    @classmethod
    def _shm_fits_memory(cls, container: ContainerConfig, info: ValidationInfo) -> ContainerConfig:
        # /dev/shm is a tmpfs in the node's memory: sized beyond it, the node swaps or the OOM killer stops Ray.
        nodes: NodesConfig | None = info.data.get("nodes")
        if nodes is None or not nodes.capabilities.instance_types:
            return container  # own hosts: the first look compares with each host's MemTotal
        known = [t for t in (catalog.lookup(n) for n in nodes.instance_types) if t is not None]
        small = min(known, key=lambda t: t.memory_gib, default=None)
        if small is not None and container.shm_size_mb > small.memory_gib * 1024:
            raise _problem(
                f"must fit in the memory of every candidate type: {small.name} has {small.memory_gib} GiB, and "
                f"/dev/shm lives in memory; got {_shown(container.shm_size)}",
                "shmSize",
            )
        return container

    @field_validator("ray")
    @classmethod
    def _object_store_fits_shm(cls, ray: RayConfig, info: ValidationInfo) -> RayConfig:
        # `container` is declared before `ray`: info.data holds it when it is valid. Ray puts its object store in
        # /dev/shm; one larger than /dev/shm falls back to disk (slow) or fails, so it is refused here.
        container: ContainerConfig | None = info.data.get("container")
        store = ray.object_store_memory_gb
        if container is not None and store is not None and store * 1024 > container.shm_size_mb:
            raise _problem(
                f"must fit in /dev/shm, which container.shmSize makes {container.shm_size} (Ray's object store "
                f"lives there); got {_shown(store)} GB. Lower it, or raise container.shmSize",
                "objectStoreMemoryGb",
            )
        return ray

    @field_validator("ray")
    @classmethod
    def _ray_ports_free_on_hosts(cls, ray: RayConfig, info: ValidationInfo) -> RayConfig:
        # On own hosts sshd listens on each host's port, in the host network namespace the container shares.
        nodes: NodesConfig | None = info.data.get("nodes")
        if nodes is None or not nodes.capabilities.existing_machines or not nodes.hosts:
            return ray
        ssh = {host.port or nodes.host_defaults.port: index for index, host in enumerate(nodes.hosts)}
        problems: list[tuple[KeyPath, str]] = []
        for key, port in zip(RAY_PORT_KEYS, (ray.gcs_port, ray.dashboard_port, ray.client_port), strict=True):
            if port in ssh:
                problems.append(((key,), f"must differ from the SSH port of nodes.hosts[{ssh[port]}] (sshd listens "
                                 f"there, and Ray shares the host's network); got {port}"))
        if problems:
            raise _Problems(*problems)
        return ray

    @field_validator("access")
    @classmethod
    def _access_for_source(cls, access: AccessConfig, info: ValidationInfo) -> AccessConfig:
        nodes: NodesConfig | None = info.data.get("nodes")
        if nodes is None:
            return access
        problems: list[tuple[KeyPath, str]] = []
        if nodes.capabilities.firewall:
            if not access.admin_cidrs:
                given = "[]" if "admin_cidrs" in access.model_fields_set else "nothing"
                problems.append((("adminCidrs",), "required with nodes.source alibaba: must list at least 1 item, "
                                 f"a CIDR that may reach SSH such as `203.0.113.7/32`; got {given}"))
            if access.ssh_public_key is None:
                problems.append((("sshPublicKey",), "required with nodes.source alibaba: the OpenSSH public key "
                                 "installed on the nodes (the contents of your .pub file); got nothing"))
        else:
            for name, key in (("admin_cidrs", "adminCidrs"), ("allow_world", "allowWorld"),
                              ("ssh_public_key", "sshPublicKey")):
                if name in access.model_fields_set:
                    problems.append(((key,), "applies to nodes.source alibaba only (with `hosts` no firewall rule "
                                     "or key is created: your hosts' own firewalls and authorized_keys apply): "
                                     "remove it"))
            if access.dashboard == "admin-cidrs":
                problems.append((("dashboard",), "must be \"tunnel\" with nodes.source hosts: the Ray dashboard "
                                 "runs any code it is sent, and no rule of this program guards your hosts (use the "
                                 "dashboardTunnel output); got \"admin-cidrs\""))
        if problems:
            raise _Problems(*problems)
        return access

    @model_validator(mode="before")
    @classmethod
    def _hosts_default_to_the_tunnel(cls, data: Any) -> Any:
        # With hosts the dashboard default is the tunnel (see access.dashboard); an explicit value is checked above.
        if not isinstance(data, dict):
            return data
        nodes, access = data.get("nodes"), data.get("access")
        capable = sources.capabilities(nodes.get("source")) if isinstance(nodes, dict) else None
        no_firewall = capable is not None and not capable.firewall
        if no_firewall and isinstance(access, dict) and "dashboard" not in access:
            data = {**data, "access": {**access, "dashboard": "tunnel"}}
        return data

    @field_validator("training")
    @classmethod
    def _training_fits_nodes(cls, training: TrainingConfig, info: ValidationInfo) -> TrainingConfig:
        # A field validator sees `nodes` (declared before `training`) as soon as that section is valid, so these
        # rules are reported together with problems in other sections, not only after those are fixed.
        nodes: NodesConfig | None = info.data.get("nodes")
        runs_on = RegisteredFrameworks.facts(training.framework).accelerators
        if nodes is not None and nodes.accelerator not in runs_on:
            fits = [f for f in RegisteredFrameworks.names()
                    if nodes.accelerator in RegisteredFrameworks.facts(f).accelerators]
            raise _problem(
                f"must be one of {', '.join(map(_shown, fits))} with nodes.accelerator {nodes.accelerator} "
                f"({training.framework} runs on {' or '.join(runs_on)} only: its "
                f"images and settings are built for it); got {_shown(training.framework)}",
                "framework",
            )
        container: ContainerConfig | None = info.data.get("container")
        unfit = _image_for_the_accelerator(container, nodes.accelerator) if container and nodes else None
        if unfit is not None:
            # Here rather than under `container`: a framework that does not run on the accelerator is said first.
            raise _problem(unfit, "..", "container", "image")
        ray: RayConfig | None = info.data.get("ray")
        server = training.openrlhf.reward_server if training.framework == "openrlhf" else None
        if ray is not None and server is not None:
            used = dict(zip((ray.gcs_port, ray.dashboard_port, ray.client_port),
                            (f"ray.{key}" for key in RAY_PORT_KEYS), strict=True))
            used.update({port: name for port, name in RAY_FIXED_PORTS.items()})
            if nodes is not None and nodes.capabilities.existing_machines:
                used.update({h.port or nodes.host_defaults.port: "the hosts' SSH port" for h in nodes.hosts or []})
            else:
                used[22] = "SSH"
            if server.port in used:
                raise _problem(f"must differ from {used[server.port]}, which listens on the head too; got "
                               f"{server.port}", "openrlhf", "rewardServer", "port")
        per_node = nodes.gpus_per_node if nodes is not None else None
        if nodes is None or per_node is None:
            # No candidate type is in the catalog (or nodes is invalid): the GPU count is known only at deployment.
            return training
        gpus = per_node * nodes.count
        cluster = f"{nodes.count} node{'s' if nodes.count > 1 else ''} x {_gpus(per_node)} = {_gpus(gpus)}"
        problems: list[tuple[KeyPath, str]] = []
        if training.framework == "roll":
            problems += _roll_device_mappings_fit(training.overrides, gpus, cluster, ("overrides",))
        problems += _overrides_contradicting_the_cluster(training, nodes.count, per_node)
        if training.framework == "openrlhf":
            engines, tp = training.openrlhf.vllm_num_engines, training.openrlhf.vllm_tensor_parallel_size
            if engines * tp > gpus:
                problems.append((
                    ("openrlhf", "vllmNumEngines"),
                    f"vllmNumEngines x vllmTensorParallelSize must fit the cluster's {cluster}; got {engines} x {tp} "
                    f"= {_gpus(engines * tp)}",
                ))
        if problems:
            raise _Problems(*problems)
        return training

    @field_validator("storage")
    @classmethod
    def _storage_for_source(cls, storage: StorageConfig, info: ValidationInfo) -> StorageConfig:
        nodes: NodesConfig | None = info.data.get("nodes")
        problems: list[tuple[KeyPath, str]] = []
        if nodes is not None and not nodes.capabilities.managed_shared_storage:
            existing = storage.existing_file_system_id is not None
            if existing:
                problems.append((("existingFileSystemId",), "applies to nodes.source alibaba only (a NAS file system "
                                 "of the region, mounted in the cluster's VPC); with `hosts` use nfsServer or "
                                 f"sharedHostPath: remove it; got {_shown(storage.existing_file_system_id)}"))
            for name, key in (("nas", "nas"), ("nas_storage_type", "nasStorageType"),
                              ("retain_on_destroy", "retainOnDestroy")):
                if name == "nas" and existing:
                    continue  # implied by existingFileSystemId, reported above
                if name in storage.model_fields_set:
                    problems.append(((key,), "applies to nodes.source alibaba only (a NAS file system in the "
                                     "cluster's VPC); with `hosts` use nfsServer or sharedHostPath: remove it"))
        if nodes is not None and not nodes.capabilities.user_shared_storage:
            for name, key in (("nfs_server", "nfsServer"), ("nfs_path", "nfsPath"),
                              ("shared_host_path", "sharedHostPath")):
                if name in storage.model_fields_set:
                    problems.append(((key,), "applies to nodes.source hosts only (with `alibaba` use nas: true): "
                                     "remove it"))
        if nodes is not None and nodes.capabilities.managed_shared_storage and "nas" not in storage.model_fields_set \
                and storage.retain_on_destroy and not problems:
            # Checkpoints survive `pulumi destroy` by default: on Alibaba they go to a kept NAS (issue 27).
            storage = storage.model_copy(update={"nas": True})
        if storage.nfs_server is not None and storage.shared_host_path is not None:
            problems.append((("sharedHostPath",), "must not be set together with nfsServer: /mnt/shared is either "
                             "the NFS export or your shared directory; got both"))
        if "nfs_path" in storage.model_fields_set and storage.nfs_server is None and not problems:
            problems.append((("nfsPath",), "needs nfsServer (the server that exports it); got no nfsServer"))
        if problems:
            raise _Problems(*problems)
        return storage

    @property
    def model_source(self) -> str:
        """training.modelSource, or the region's default."""
        if self.training.model_source is not None:
            return str(self.training.model_source)
        return "hf-mirror" if self.region is not None and is_mainland_region(self.region) else "huggingface"

    @property
    def instance_type_info(self) -> catalog.GpuInstanceType | None:
        return catalog.lookup(self.nodes.instance_types[0])

    @property
    def gpus_per_node(self) -> int:
        """From the catalog; 1 when no candidate type is in it (the live answer at deployment decides)."""
        return self.nodes.gpus_per_node or 1


def _image_for_the_accelerator(container: ContainerConfig, accelerator: str) -> str | None:
    """Why the image cannot run on the accelerator, or None. Checked at plan time, not on the host after Docker and
    the pull: a CUDA image has no CANN or torch_npu (and is x86_64, where Ascend servers are arm64); a CANN image
    has no CUDA."""
    image = container.image.lower()
    cuda = image == DEFAULT_ROLL_IMAGE or any(w in image for w in _CUDA_IMAGE_WORDS)
    cann = any(w in image for w in ("cann", "ascend", "mindspeed", "torch_npu", "torch-npu"))
    if accelerator == "ascend" and cuda and not cann:
        default = " (the default, ROLL's CUDA image)" if container.image == DEFAULT_ROLL_IMAGE else ""
        return (f"must be an image for Ascend NPUs (CANN and torch_npu, arm64; docs/ascend.md, \"The image\") with "
                f"nodes.accelerator ascend, not a CUDA image{default}; got {_shown(container.image)}")
    if accelerator == "nvidia" and cann and not cuda:
        return ("must be a CUDA image with nodes.accelerator nvidia, not an Ascend (CANN) image; got "
                + _shown(container.image))
    return None


# Image names that say CUDA: NVIDIA's NGC images, and the tags of ROLL's, verl's and OpenRLHF's images.
_CUDA_IMAGE_WORDS = ("nvcr.io/nvidia", "cuda", "cu12", "cu11", "cu13", "verlai/verl", "openrlhf", "nvidia/")


def _overrides_contradicting_the_cluster(training: TrainingConfig, nodes: int, per_node: int
                                         ) -> list[tuple[KeyPath, str]]:
    """Overrides that would win over the values the program sizes the job with: the node count and the GPUs per
    node (verl's trainer.nnodes and n_gpus_per_node, ROLL's num_gpus_per_node; OpenRLHF's roles on more nodes or
    GPUs than there are)."""
    flat = {bare: (path, value) for path, bare, value in _flat_overrides(training.overrides, ())}
    problems: list[tuple[KeyPath, str]] = []
    cluster = f"the cluster's {nodes} node{'s' if nodes > 1 else ''} x {_gpus(per_node)}"

    def number(value: Any) -> int | None:
        # `pulumi config set --path` stores "2" as text; the frameworks read it as the number.
        if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
            return int(value)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    sizes = {"nodes": nodes, "gpus_per_node": per_node}
    own = [(name, sizes[size]) for name, size in RegisteredFrameworks.facts(training.framework).cluster_keys]
    if own:
        for name, expected in own:
            if name in flat and number(flat[name][1]) != expected:
                path, value = flat[name]
                problems.append((path, f"must be left out: the program sets it from {cluster} ({expected}), and "
                                 f"another value would leave GPUs idle or wait forever for GPUs that do not exist; "
                                 f"got {_shown(value)}"))
    if training.framework == "openrlhf":
        for role in ("actor", "ref", "critic", "reward"):
            for name, limit, what in ((f"{role}.num_nodes", nodes, "nodes"),
                                      (f"{role}.num_gpus_per_node", per_node, "GPUs per node")):
                value = number(flat.get(name, ((), None))[1])
                if name in flat and (value is None or not 1 <= value <= limit):
                    problems.append((flat[name][0], f"must be a whole number between 1 and {limit} ({what} of "
                                     f"{cluster}); got {_shown(flat[name][1])}"))
    return [(("overrides", *path), message) for path, message in problems]


def _flat_overrides(tree: Mapping[str, Any], path: tuple[str, ...]) -> list[tuple[tuple[str, ...], str, Any]]:
    """(key path as written, dotted name without Hydra's prefixes, value) for every leaf of the overrides."""
    leaves: list[tuple[tuple[str, ...], str, Any]] = []
    for key, value in tree.items():
        here = (*path, str(key))
        if isinstance(value, Mapping) and value:
            leaves += _flat_overrides(value, here)
        else:
            leaves.append((here, ".".join(p.lstrip("+~") for p in here), value))
    return leaves


def _roll_device_mappings_fit(value: Any, gpus: int, cluster: str, path: KeyPath) -> list[tuple[KeyPath, str]]:
    """Every `device_mapping` anywhere in ROLL overrides must name GPUs the cluster has (ROLL's indices are global
    across nodes). A dotted key (`actor_train.device_mapping`) counts as well; null means "no such worker"."""
    problems: list[tuple[KeyPath, str]] = []
    children: list[tuple[int | str, Any]] = []
    if isinstance(value, Mapping):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    for key, child in children:
        here = (*path, key)
        if isinstance(key, str) and key.split(".")[-1] == "device_mapping" and child is not None:
            try:
                indices = parse_device_mapping(child)
            except DeviceMappingError as error:
                problems.append((here, f"{error}; got {_shown(child)}"))
                continue
            repeated = sorted({i for i in indices if indices.count(i) > 1})
            if repeated:
                problems.append((here, f"must name each GPU once (one worker per GPU); got {_shown(child)}, which "
                                 f"lists GPU {', '.join(map(str, repeated))} more than once"))
                continue
            if indices and max(indices) >= gpus:
                problems.append((
                    here,
                    f"GPU indices must be within 0..{gpus - 1}, because the cluster has {cluster}; got "
                    f"{_shown(child)}, which uses index {max(indices)}",
                ))
        else:
            problems += _roll_device_mappings_fit(child, gpus, cluster, here)
    return problems


# ---------------------------------------------------------------------------------------------- error format
#
# Every problem is one line `<key path>: <what is allowed>; got <given value>`, with the key path as the user writes
# it (`roll-cluster:nodes.instanceTypes[1]`, `alicloud:region`) and the given value as JSON, the way the stack file
# spells it (`true`, `null`, `"16G"`). Private keys are never echoed.


def _field_at(model: type[BaseModel], name: str) -> FieldInfo | None:
    return next((f for n, f in model.model_fields.items() if (f.alias or n) == name), None)


def _model_at(model: type[BaseModel], loc: KeyPath) -> type[BaseModel] | None:
    """The model class that owns the field at loc (for suggestions on unknown fields)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or isinstance(part, int):
            continue
        field = _field_at(current, part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *typing.get_args(annotation)]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return current


def _field_of(loc: KeyPath) -> FieldInfo | None:
    """The field definition at loc, if loc ends at a field (not inside a list)."""
    if not loc or not isinstance(loc[-1], str):
        return None
    owner = _model_at(ClusterConfig, loc[:-1])
    return _field_at(owner, loc[-1]) if owner else None


def _join(loc: KeyPath, relative: KeyPath) -> KeyPath:
    parts = list(loc)
    for part in relative:
        if part == "..":
            parts.pop()
        else:
            parts.append(part)
    return tuple(parts)


def _format(loc: KeyPath) -> str:
    if loc[:1] == ("region",):
        return "alicloud:region"
    path = PROJECT + ":"
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("" if i == 0 else ".") + part
    return path


def _literal_values(annotation: Any) -> list[Any]:
    """The values a Literal field allows, also inside `Literal[...] | None` (then null too)."""
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    values: list[Any] = []
    for arg in typing.get_args(annotation):
        values += [None] if arg is type(None) else _literal_values(arg)
    return values


def _allowed(item: Any, loc: KeyPath) -> str:
    """What a built-in pydantic check allows, in the stack file's terms."""
    kind, ctx = item["type"], item.get("ctx", {})
    field = _field_of(loc)
    if kind in ("greater_than_equal", "less_than_equal") and field is not None:
        low = next((m.ge for m in field.metadata if isinstance(m, annotated_types.Ge)), None)
        high = next((m.le for m in field.metadata if isinstance(m, annotated_types.Le)), None)
        if low is not None and high is not None:
            return f"must be between {low} and {high}"
    if kind == "literal_error" and field is not None:
        return "must be one of " + ", ".join(_shown(v) for v in _literal_values(field.annotation))
    if kind == "string_pattern_mismatch":
        example = f" such as {_shown(field.default)}" if field is not None and isinstance(field.default, str) else ""
        return f"must match the regular expression `{ctx.get('pattern')}`{example}"
    simple = {
        "greater_than_equal": f"must be at least {ctx.get('ge')}",
        "less_than_equal": f"must be at most {ctx.get('le')}",
        "greater_than": f"must be greater than {ctx.get('gt')}",
        "int_type": "must be a whole number",
        "int_parsing": "must be a whole number",
        "int_from_float": "must be a whole number",
        "float_type": "must be a number",
        "float_parsing": "must be a number",
        "finite_number": "must be a finite number",
        "bool_type": "must be true or false",
        "bool_parsing": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "dict_type": "must be an object with fields",
        "model_type": "must be an object with fields",
        "model_attributes_type": "must be an object with fields",
    }
    if kind == "too_short":
        count = ctx.get("min_length")
        return f"must list at least {count} {'item' if count == 1 else 'items'}"
    if kind in simple:
        return simple[kind]
    message = str(item["msg"])
    return message[0].lower() + message[1:]


def _messages(error: ValidationError) -> list[str]:
    problems: list[str] = []
    for item in error.errors():
        loc: KeyPath = tuple(item["loc"])
        cause = item.get("ctx", {}).get("error")
        if isinstance(cause, _Problems):
            problems += [f"{_format(_join(loc, path))}: {message}" for path, message in cause.problems]
        elif item["type"] == "extra_forbidden":
            owner = _model_at(ClusterConfig, loc[:-1])
            names = [f.alias or n for n, f in owner.model_fields.items()] if owner else []
            if not loc[:-1]:
                names = list(SECTIONS)
            guess = difflib.get_close_matches(str(loc[-1]), names, n=1, cutoff=0.5)
            hint = f"; did you mean {guess[0]!r}?" if guess else "."
            problems.append(f"{_format(loc)}: unknown field{hint} Allowed: {', '.join(names)}")
        elif item["type"] == "missing":
            problems.append(f"{_format(loc)}: required; got nothing")
        elif isinstance(cause, ValueError):
            problems.append(f"{_format(loc)}: {cause}; got {_shown(item.get('input'))}")
        else:
            problems.append(f"{_format(loc)}: {_allowed(item, loc)}; got {_shown(item.get('input'))}")
    return problems


def _section_of_field(name: str) -> str | None:
    """The section that has a field of this name, for a key set at the top level by mistake."""
    for section in SECTIONS:
        model = _model_at(ClusterConfig, (section,))
        if model is not None and _field_at(model, name) is not None:
            return section
    return None


def _unknown_key(key: str) -> str:
    allowed = ", ".join([*SECTIONS, *SECRETS])
    section, dot, field = key.partition(".")
    if dot and section in SECTIONS:
        # `pulumi config set roll-cluster:nodes.count 2` without --path makes a key named "nodes.count".
        return (
            f"{PROJECT}:{key}: unknown key; to set {field!r} inside the {section} section use "
            f"`pulumi config set --path '{PROJECT}:{key}' <value>` (without --path the dot is part of the key name)"
        )
    owner = _section_of_field(key)
    if owner is not None:
        return f"{PROJECT}:{key}: unknown key; did you mean '{owner}.{key}'? (fields belong inside their section)"
    guess = difflib.get_close_matches(key, [*SECTIONS, *SECRETS], n=1, cutoff=0.5)
    hint = f"; did you mean {guess[0]!r}?" if guess else "."
    return f"{PROJECT}:{key}: unknown key{hint} Allowed: {allowed}"


class _NotFinite:
    """What json.loads reads NaN, Infinity and -Infinity as here: a marker found again at its key path."""

    def __init__(self, name: str):
        self.name = name


def _not_finite_at(value: Any, path: KeyPath) -> list[tuple[KeyPath, str]]:
    """(key path, the constant) for every NaN or Infinity in a parsed section."""
    if isinstance(value, _NotFinite):
        return [(path, value.name)]
    children: list[tuple[int | str, Any]] = []
    if isinstance(value, dict):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    return [found for key, child in children for found in _not_finite_at(child, (*path, key))]


def parse_cluster_config(raw: Mapping[str, str | None], region: str | None) -> ClusterConfig:
    """Validate the `roll-cluster:*` values as Pulumi hands them over (structured values are JSON strings).

    `raw` maps the key without the project prefix ("nodes") to its text; None or a missing key means not set.
    Secrets are skipped if present. Raises ConfigError listing every problem, each with its key path.
    """
    problems: list[str] = []
    data: dict[str, Any] = {}
    malformed: set[str] = set()
    for key, text in raw.items():
        if key in SECRETS or text is None:
            continue
        if key not in SECTIONS:
            problems.append(_unknown_key(key))
            continue
        how = (
            f"nest its fields under `{PROJECT}:{key}` in Pulumi.<stack>.yaml, or set one with "
            f"`pulumi config set --path '{PROJECT}:{key}.<field>' <value>`"
        )
        try:
            value = json.loads(text, parse_constant=_NotFinite)
        except json.JSONDecodeError:
            malformed.add(key)
            problems.append(f"{PROJECT}:{key}: must be an object with fields ({how}); got {_shown(text)}")
            continue
        if not isinstance(value, dict):
            malformed.add(key)
            problems.append(f"{PROJECT}:{key}: must be an object with fields ({how}); got {_shown(value)}")
            continue
        # json.loads reads NaN, Infinity and -Infinity as floats; no setting or override may be one.
        not_finite = _not_finite_at(value, (key,))
        unreadable = text_problems(value, (key,))
        if not_finite or unreadable:
            malformed.add(key)
            problems += [f"{_format(path)}: must be a finite number (not NaN or Infinity); got {name}"
                         for path, name in not_finite]
            problems += [f"{_format(path)}: {message}" for path, message in unreadable]
            continue
        data[key] = value
    nodes = data.get("nodes")
    capable = sources.capabilities(nodes.get("source")) if isinstance(nodes, dict) else None
    regionless = capable is not None and not capable.region
    if region is None and not regionless:
        problems.append("alicloud:region: required (pulumi config set alicloud:region cn-hangzhou); got nothing")
    elif region is not None and not regionless:
        data["region"] = region
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as error:
        # A section already reported as malformed, or the region reported above, is not "required" again.
        repeated = {"alicloud:region: required; got nothing"} | {
            f"{PROJECT}:{key}: required; got nothing" for key in malformed
        }
        problems += [p for p in _messages(error) if p not in repeated]
    if problems:
        raise ConfigError(problems)
    return config
