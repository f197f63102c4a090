"""What the training image's registry manifest says about its size: the parsing and selection the plan's look-up
(devtools/registry.py) uses. Pure functions on values; no network, registers nothing.

Protocol (the OCI Distribution Specification, github.com/opencontainers/distribution-spec, spec.md, "Pulling
manifests"; the Docker Registry HTTP API v2 it is based on):

- `GET /v2/<name>/manifests/<reference>` with an Accept header naming the manifest types the client takes; the
  answer is an image manifest or an index (OCI image index / Docker manifest list) of per-platform manifests,
  which are fetched by digest the same way.
- A manifest's `config` and `layers` are descriptors whose `size` is the blob's size in bytes as stored, i.e.
  compressed for the layers (OCI image-spec, descriptor.md, "size"; manifest.md): their sum is what a pull
  downloads.
- A registry that wants a token answers 401 with `WWW-Authenticate: Bearer realm="...",service="...",scope="..."`;
  the client asks the realm for a token with `?service=<service>&scope=repository:<name>:pull` and retries with
  `Authorization: Bearer <token>` (Docker's token authentication specification, distribution/distribution
  docs/spec/auth/token.md, "How to authenticate" and "Requesting a Token"; the answer's `token`, or
  `access_token` for OAuth 2.0 compatibility).

Names follow Docker's normalisation (distribution/reference normalize.go, splitDockerDomain): the first component
is a registry host when it has a `.` or `:` or is `localhost`; otherwise the image is Docker Hub's (`docker.io`,
whose API host is `registry-1.docker.io`), and a one-component name there is under `library/`.

Everything here comes from the network in the plan: types are checked, sizes bounded, digests matched.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join((OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST))

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
# The nodes are x86_64 (every GPU instance type in infra/sources/alibaba/catalog.py).
PLATFORM = ("linux", "amd64")

MAX_BODY_BYTES = 4 * 1024 * 1024  # a manifest is kilobytes; anything near this is not one
MAX_LAYERS = 1000
MAX_IMAGE_BYTES = 1000 * 10**9  # container.imageSizeGb's own bound (1000 GB): more is not an image's size
MAX_TOKEN_CHARS = 64 * 1024

# distribution/reference regexp.go: path components and tags; a digest is algorithm:hex.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_HOST = re.compile(r"(?:localhost|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::[0-9]{1,5})?")
_TAG = re.compile(r"[\w][\w.-]{0,127}", re.ASCII)
DIGEST = re.compile(r"sha256:[a-f0-9]{64}")
_TOKEN = re.compile(r"[\x21-\x7e]+")  # printable ASCII, no space or line break: safe in a header


class ManifestError(ValueError):
    """A registry answer this module refuses; the message is the plan's one-line reason."""


@dataclass(frozen=True)
class ImageRef:
    host: str  # the registry as written (docker.io for Docker Hub)
    api_host: str  # the host the API is asked at
    name: str  # the repository, e.g. library/ubuntu
    reference: str  # a tag or a digest

    def manifest_path(self, reference: str | None = None) -> str:
        return f"/v2/{self.name}/manifests/{reference or self.reference}"


@dataclass(frozen=True)
class ManifestSize:
    compressed_bytes: int  # the layers' sizes plus the config blob's
    layers: int
    platform: str  # "linux/amd64", or "single platform" for a manifest that is no index

    @property
    def gb(self) -> float:
        return self.compressed_bytes / 1e9


def public_host(host: str) -> str:
    """The Internet endpoint of an ACR VPC endpoint (a plan runs outside the VPC): Personal Edition's
    `registry-vpc.<region>.aliyuncs.com` and `crpi-<id>-vpc.<region>.personal.cr.aliyuncs.com`, Enterprise Edition's
    `<instance>-registry-vpc.<region>.cr.aliyuncs.com` (infra/image_path.py has the sources), each without `-vpc`
    (the same repositories: UNCONFIRMED beyond the endpoints' naming in Alibaba's documentation)."""
    for vpc, public in (
        (r"registry-vpc\.([a-z0-9-]+)\.aliyuncs\.com", r"registry.\1.aliyuncs.com"),
        (r"(crpi-[a-z0-9]+)-vpc\.([a-z0-9-]+)\.personal\.cr\.aliyuncs\.com", r"\1.\2.personal.cr.aliyuncs.com"),
        (r"([a-z0-9-]+)-registry-vpc\.([a-z0-9-]+)\.cr\.aliyuncs\.com", r"\1-registry.\2.cr.aliyuncs.com"),
    ):
        if re.fullmatch(vpc, host):
            return re.sub(vpc, public, host)
    return host


def parse_reference(image: str) -> ImageRef:
    """`[host/]name[:tag][@digest]` -> where its manifest is; the digest wins over the tag, as in a pull."""
    rest, _, digest = image.partition("@")
    if digest and not DIGEST.fullmatch(digest):
        raise ManifestError(f"the image's digest {digest!r} is not sha256:<64 hex>")
    first, slash, remainder = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first != first.lower()):
        host, path = first, remainder
    else:
        host, path = DOCKER_HUB, rest
    if host == "index.docker.io":
        host = DOCKER_HUB
    if not _HOST.fullmatch(host):
        raise ManifestError(f"{host!r} is not a registry host")
    tag = "latest"
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, _, tag = path.rpartition(":")
    if host == DOCKER_HUB and "/" not in path:
        path = "library/" + path
    if not _NAME.fullmatch(path):
        raise ManifestError(f"{path!r} is not a repository name")
    if not _TAG.fullmatch(tag):
        raise ManifestError(f"{tag!r} is not a tag")
    api_host = DOCKER_HUB_API if host == DOCKER_HUB else public_host(host)
    return ImageRef(host=host, api_host=api_host, name=path, reference=digest or tag)


def bearer_challenge(header: str) -> dict[str, str]:
    """The parameters of a `WWW-Authenticate: Bearer k="v",...` challenge (token.md, "How to authenticate");
    refuses any other scheme (Basic means the registry wants credentials, which the plan never sends)."""
    scheme, _, params = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        raise ManifestError(f"the registry asks for {scheme or 'an unknown'} authentication (credentials)")
    found = dict(re.findall(r'([A-Za-z]+)="([^"\\]*)"', params))
    if not found.get("realm"):
        raise ManifestError("the registry's Bearer challenge names no realm")
    return found


def token_from(body: bytes) -> str:
    """The token of an authorization service's answer (token.md, "Token Response Fields")."""
    data = _json(body, "the token service's answer")
    token = data.get("token") or data.get("access_token")
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS or not _TOKEN.fullmatch(token):
        raise ManifestError("the token service's answer has no usable token")
    return token


def media_type(body: bytes, content_type: str | None) -> str:
    """The document's type: its `mediaType` field, else the Content-Type header (OCI image-spec: mediaType SHOULD
    be set), else what its fields say."""
    data = _json(body, "the manifest")
    declared = data.get("mediaType")
    if isinstance(declared, str) and declared:
        return declared
    header = (content_type or "").split(";", 1)[0].strip()
    if header in INDEX_TYPES + MANIFEST_TYPES:
        return header
    if "manifests" in data:
        return OCI_INDEX
    if "layers" in data:
        return OCI_MANIFEST
    raise ManifestError("the registry's answer is neither an index nor an image manifest")


def select_platform(body: bytes) -> str:
    """The digest of the linux/amd64 manifest of an index or manifest list."""
    data = _json(body, "the index")
    entries = data.get("manifests")
    if not isinstance(entries, list):
        raise ManifestError("the index has no list of manifests")
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        platform = entry.get("platform")
        if not isinstance(platform, dict):
            continue
        if (platform.get("os"), platform.get("architecture")) != PLATFORM:
            continue
        digest = entry.get("digest")
        if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
            raise ManifestError("the index's linux/amd64 entry has no sha256 digest")
        return digest
    raise ManifestError("the index has no linux/amd64 manifest")


def manifest_size(body: bytes, platform: str) -> ManifestSize:
    """The compressed size of an image manifest: the layers' `size` plus the config blob's."""
    data = _json(body, "the manifest")
    layers, config = data.get("layers"), data.get("config")
    if not isinstance(layers, list) or not layers:
        raise ManifestError("the manifest lists no layers")
    if len(layers) > MAX_LAYERS:
        raise ManifestError(f"the manifest lists {len(layers)} layers (more than {MAX_LAYERS})")
    if not isinstance(config, dict):
        raise ManifestError("the manifest has no config descriptor")
    total = 0
    for descriptor in (config, *layers):
        size = descriptor.get("size") if isinstance(descriptor, dict) else None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ManifestError("a descriptor of the manifest has no size in bytes")
        total += size
        if total > MAX_IMAGE_BYTES:
            raise ManifestError(f"the manifest's sizes add up to more than {MAX_IMAGE_BYTES // 10**9} GB")
    if total == 0:
        raise ManifestError("the manifest's sizes add up to 0 bytes")
    return ManifestSize(compressed_bytes=total, layers=len(layers), platform=platform)


def _json(body: bytes, what: str) -> dict[str, Any]:
    if len(body) > MAX_BODY_BYTES:
        raise ManifestError(f"{what} is larger than {MAX_BODY_BYTES // 2**20} MB")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise ManifestError(f"{what} is not JSON") from None
    if not isinstance(data, dict):
        raise ManifestError(f"{what} is not a JSON object")
    return data
