"""The plan's look-up of the training image's compressed size in its registry's manifest (infra/image_manifest.py
has the protocol and its sources). Run by the plan only (`python -m devtools.plan`), never by the program, the
bench or the tests unless a test asks: `--no-registry` or ROLL_CLUSTER_NO_REGISTRY=1 turns it off.

Bounds: HTTPS only, no credentials sent (an anonymous token where the registry offers one), no redirects followed,
at most MAX_REQUESTS requests of REQUEST_TIMEOUT_S each and TOTAL_TIMEOUT_S in all (DNS included: the look-up runs
in a thread the plan stops waiting for), answers read up to MAX_BODY_BYTES. Any failure is a one-line reason; the
plan then uses its estimate.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from infra.image_manifest import (
    ACCEPT,
    DIGEST,
    INDEX_TYPES,
    MANIFEST_TYPES,
    MAX_BODY_BYTES,
    ImageRef,
    ManifestError,
    ManifestSize,
    bearer_challenge,
    manifest_size,
    media_type,
    parse_reference,
    select_platform,
    token_from,
)

DISABLE_ENV = "ROLL_CLUSTER_NO_REGISTRY"
SCHEME = "https"  # the tests' stand-in registry on 127.0.0.1 sets "http"; nothing else changes it
REQUEST_TIMEOUT_S = 5.0
TOTAL_TIMEOUT_S = 15.0
MAX_REQUESTS = 5  # manifest, 401 -> token, manifest again, the platform's manifest (+1 spare)


@dataclass(frozen=True)
class Lookup:
    size: ManifestSize | None
    reason: str  # why there is no size (empty when there is one)


NOT_LOOKED_UP = Lookup(None, "the registry was not asked (--no-registry or ROLL_CLUSTER_NO_REGISTRY)")


def disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "") not in ("", "0")


def look_up_manifest(image: str) -> Lookup:
    """The image's compressed size from its manifest, or why not; never raises, returns within TOTAL_TIMEOUT_S."""
    result: list[Lookup] = []

    def work() -> None:
        result.append(_lookup(image))

    # A daemon thread: a hung DNS query or a registry that trickles bytes cannot hold the plan (or its exit).
    thread = threading.Thread(target=work, name="registry-lookup", daemon=True)
    thread.start()
    thread.join(TOTAL_TIMEOUT_S)
    if not result:
        return Lookup(None, f"no answer from the registry within {TOTAL_TIMEOUT_S:g} s")
    return result[0]


def _lookup(image: str) -> Lookup:
    try:
        ref = parse_reference(image)
        return Lookup(_size(_Client(ref), ref), "")
    except ManifestError as error:
        return Lookup(None, _clean(str(error)))
    except TimeoutError:
        return Lookup(None, f"no answer from the registry within {REQUEST_TIMEOUT_S:g} s")
    except urllib.error.URLError as error:
        if isinstance(error.reason, TimeoutError):
            return Lookup(None, f"no answer from the registry within {REQUEST_TIMEOUT_S:g} s")
        return Lookup(None, _clean(f"cannot reach the registry: {error.reason}"))
    except Exception as error:  # the plan never fails for a look-up: it says why and estimates
        return Lookup(None, _clean(f"the look-up failed ({type(error).__name__})"))


def _size(client: _Client, ref: ImageRef) -> ManifestSize:
    body, content_type = client.get(ref.manifest_path())
    if ref.reference.startswith("sha256:"):
        _check_digest(body, ref.reference)
    kind = media_type(body, content_type)
    if kind in MANIFEST_TYPES:
        # No index: the one manifest's platform is in its config blob, not read here.
        return manifest_size(body, "single platform")
    if kind not in INDEX_TYPES:
        raise ManifestError(_clean(f"the registry answered a {kind[:80]!r} document (not an OCI or Docker v2 "
                                   "manifest)"))
    digest = select_platform(body)
    body, content_type = client.get(ref.manifest_path(digest))
    _check_digest(body, digest)
    if media_type(body, content_type) not in MANIFEST_TYPES:
        raise ManifestError("the index's linux/amd64 entry is not an image manifest")
    return manifest_size(body, "linux/amd64")


def _check_digest(body: bytes, digest: str) -> None:
    if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
        raise ManifestError("the manifest's content does not match its digest")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is refused (an HTTPError): the token travels to no host the plan did not name."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _Client:
    def __init__(self, ref: ImageRef) -> None:
        self.ref = ref
        self.token: str | None = None
        self.requests = 0
        self.opener = urllib.request.build_opener(_NoRedirect())

    def get(self, path: str) -> tuple[bytes, str | None]:
        url = f"{SCHEME}://{self.ref.api_host}{path}"
        try:
            return self._fetch(url, manifest=True)
        except urllib.error.HTTPError as error:
            error.close()
            if error.code != 401 or self.token is not None:
                raise ManifestError(self._status(error.code)) from None
            challenge = bearer_challenge(str(error.headers.get("WWW-Authenticate") or ""))
        self.token = self._token(challenge)
        try:
            return self._fetch(url, manifest=True)
        except urllib.error.HTTPError as error:
            raise ManifestError(self._status(error.code)) from None

    def _token(self, challenge: dict[str, str]) -> str:
        realm = urllib.parse.urlsplit(challenge["realm"])
        if realm.scheme != SCHEME or not realm.hostname:
            raise ManifestError(f"the registry's token service is not an {SCHEME.upper()} URL")
        query = {"scope": f"repository:{self.ref.name}:pull"}
        if challenge.get("service"):
            query["service"] = challenge["service"]
        extra = urllib.parse.urlencode(query)
        url = urllib.parse.urlunsplit(realm._replace(query=f"{realm.query}&{extra}" if realm.query else extra))
        try:
            body, _ = self._fetch(url, manifest=False)
        except urllib.error.HTTPError as error:
            if error.code in (401, 403):
                raise ManifestError(self._private()) from None
            raise ManifestError(f"the registry's token service answered HTTP {error.code}") from None
        return token_from(body)

    def _fetch(self, url: str, manifest: bool) -> tuple[bytes, str | None]:
        self.requests += 1
        if self.requests > MAX_REQUESTS:
            raise ManifestError(f"more than {MAX_REQUESTS} requests needed")
        headers = {"User-Agent": "roll-cluster-plan"}
        if manifest:
            headers["Accept"] = ACCEPT
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, headers=headers, method="GET")
        with self.opener.open(request, timeout=REQUEST_TIMEOUT_S) as response:
            length = response.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > MAX_BODY_BYTES:
                raise ManifestError(f"the registry's answer is larger than {MAX_BODY_BYTES // 2**20} MB")
            body = response.read(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                raise ManifestError(f"the registry's answer is larger than {MAX_BODY_BYTES // 2**20} MB")
            return body, response.headers.get("Content-Type")

    def _status(self, code: int) -> str:
        where = f"{self.ref.name}:{self.ref.reference}" if not DIGEST.fullmatch(self.ref.reference) else (
            f"{self.ref.name}@{self.ref.reference}")
        if code == 404:
            return f"{self.ref.api_host} has no manifest {where} (HTTP 404)"
        if code in (401, 403):
            return self._private()
        if 300 <= code < 400:
            return f"{self.ref.api_host} redirected the manifest request (not followed)"
        return f"{self.ref.api_host} answered HTTP {code} for {where}"

    def _private(self) -> str:
        return (f"{self.ref.api_host} refuses an anonymous pull of {self.ref.name} (a private image? the plan sends "
                "no credentials)")


def _clean(text: str) -> str:
    """One printable line of at most 200 characters (parts of it may come from the network)."""
    return re.sub(r"[^\x20-\x7e]", "?", " ".join(text.split()))[:200]
