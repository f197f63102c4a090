"""Fill the pull cache (pull_cache.sh fill_cache): copy the image from its registry into this node's plain registry
over the registry HTTP API (the Docker Registry HTTP API v2, the OCI distribution spec).

The image's manifest is read from the upstream (from a multi-platform index, the linux/CACHE_ARCH manifest); every
blob it names (the config and the layers) that the cache does not have yet (HEAD) is streamed from one upstream GET
into one upload to the cache (POST, then PUT ?digest=), a few blobs at once and none held in memory whole; then the
manifest is put under the tag, with its exact bytes and media type. So the upstream serves each blob once per fill,
a second fill (a resumed cluster) fetches no blob, and a new tag of the image copies only its new blobs.

Upstream credentials (REGISTRY_USERNAME, REGISTRY_PASSWORD) come from the environment only, for a Basic or a Bearer
challenge (a token for `repository:<path>:pull` from the challenge's realm). Transient failures (a broken
connection, 5xx, 429) are retried with a bound; a blob whose content does not match its digest fails naming it.
An expected failure ends with one line on stderr and exit status 1 (never a traceback, never a credential).

Environment (defaults in brackets): CACHE_UPSTREAM (http(s)://host[:port]), CACHE_REPOSITORY (path[:tag]),
CACHE_URL (the cache: http://addr:port), CACHE_ARCH [amd64], REGISTRY_USERNAME [''], REGISTRY_PASSWORD [''],
CACHE_FILL_THREADS [4], CACHE_FILL_ATTEMPTS [5], CACHE_FILL_RETRY_DELAY_S [2], CACHE_FILL_STALL_S [120] (a bound
on every connect and read).
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import http.client
import json
import os
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
IMAGE_TYPES = ("application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json")
ACCEPT = ", ".join(INDEX_TYPES + IMAGE_TYPES)
CHUNK = 1 << 20
MAX_REDIRECTS = 5
T = TypeVar("T")


class FillError(Exception):
    """An expected failure: its message is the step's one-line reason."""


class Transient(Exception):
    """A failure worth another attempt (a broken connection, 5xx, 429)."""

    def __init__(self, message: str, wait_s: float | None = None) -> None:
        super().__init__(message)
        self.wait_s = wait_s


@dataclass(frozen=True)
class Settings:
    attempts: int
    delay_s: float
    stall_s: float


@dataclass(frozen=True)
class Blob:
    digest: str
    size: int


def _connection(url: urllib.parse.SplitResult, stall_s: float) -> http.client.HTTPConnection:
    host, port = url.hostname or "", url.port
    if url.scheme == "https":
        return http.client.HTTPSConnection(host, port, timeout=stall_s, blocksize=CHUNK)
    if url.scheme == "http":
        return http.client.HTTPConnection(host, port, timeout=stall_s, blocksize=CHUNK)
    raise FillError(f"unsupported URL scheme in {url.scheme}://{url.netloc}")


class Response:
    """An open response (and its connection): read it, then close it."""

    def __init__(self, connection: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        self.connection, self.raw = connection, response
        self.status = response.status

    def header(self, name: str) -> str:
        return self.raw.getheader(name) or ""

    def read(self, size: int | None = None) -> bytes:
        return self.raw.read(size)

    def close(self) -> None:
        self.raw.close()
        self.connection.close()


def request(method: str, url: str, settings: Settings, headers: Mapping[str, str] | None = None,
            body: Any = None) -> Response:
    """One request, redirects followed (an Authorization header only ever goes to the host it was made for: a
    registry's blob redirect points at storage that signs its URL itself). A broken connection is Transient."""
    sent = dict(headers or {})
    origin = urllib.parse.urlsplit(url).netloc
    for _ in range(MAX_REDIRECTS + 1):
        parts = urllib.parse.urlsplit(url)
        if parts.netloc != origin:
            sent.pop("Authorization", None)
        connection = _connection(parts, settings.stall_s)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            connection.request(method, target, body=body, headers=sent)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            connection.close()
            raise Transient(f"{method} {parts.scheme}://{parts.netloc}{parts.path}: {error}") from None
        except BaseException:  # the body's own failure (a blob that does not match its digest)
            connection.close()
            raise
        if response.status in (301, 302, 303, 307, 308) and body is None:
            url = urllib.parse.urljoin(url, response.getheader("Location") or "")
            response.close()
            connection.close()
            continue
        result = Response(connection, response)
        if response.status == 429 or response.status >= 500:
            retry_after = response.getheader("Retry-After") or ""
            result.close()
            raise Transient(f"{method} {parts.scheme}://{parts.netloc}{parts.path}: HTTP {response.status}",
                            float(retry_after) if retry_after.isdigit() else None)
        return result
    raise FillError(f"{method} {url}: more than {MAX_REDIRECTS} redirects")


def retried(settings: Settings, what: str, action: Callable[[], T]) -> T:
    """`action` until it succeeds, at most settings.attempts times; waits double from delay_s (at most 60 s)."""
    for attempt in range(1, settings.attempts + 1):
        try:
            return action()
        except Transient as error:
            if attempt == settings.attempts:
                raise FillError(f"{what}: {error} ({attempt} attempts)") from None
            wait = error.wait_s if error.wait_s is not None else settings.delay_s * 2 ** (attempt - 1)
            print(f"{what}: {error}; attempt {attempt + 1} of {settings.attempts} in {min(wait, 60):.0f}s",
                  file=sys.stderr)
            time.sleep(min(wait, 60))
    raise AssertionError("unreachable")


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.strip().partition(" ")
    return scheme.lower(), dict(re.findall(r'(\w+)="([^"]*)"', rest))


def _error_codes(response: Response) -> str:
    """The registry's error codes (its JSON body's errors[].code), never the body itself."""
    try:
        codes = [str(e.get("code")) for e in json.loads(response.read(65536)).get("errors", [])]
    except (ValueError, AttributeError, OSError, http.client.HTTPException):
        codes = []
    return f" ({', '.join(codes)})" if codes else ""


def _getter(url: str, settings: Settings, headers: Mapping[str, str]) -> Callable[[], Response]:
    return lambda: request("GET", url, settings, headers)


class Upstream:
    """The registry the image comes from, with the authorization its challenge asks for (shared by the threads)."""

    def __init__(self, base: str, repository: str, username: str, password: str, settings: Settings) -> None:
        self.base, self.repository, self.settings = base.rstrip("/"), repository, settings
        self._username, self._password = username, password
        self._authorization: str | None = None
        self._lock = threading.Lock()

    def _basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self._username}:{self._password}".encode()).decode()

    def _authorize(self, challenge: str) -> None:
        scheme, params = _challenge(challenge)
        if scheme == "basic":
            if not self._username:
                raise FillError(f"{self.base} asks for credentials: set the registry's username and password")
            self._authorization = self._basic()
        elif scheme == "bearer" and params.get("realm"):
            query = {"scope": f"repository:{self.repository}:pull"}
            if params.get("service"):
                query["service"] = params["service"]
            token_url = params["realm"] + ("&" if "?" in params["realm"] else "?") + urllib.parse.urlencode(query)
            headers = {"Authorization": self._basic()} if self._username else {}
            response = retried(self.settings, f"a token from {params['realm']}",
                               lambda: request("GET", token_url, self.settings, headers))
            try:
                if response.status != 200:
                    raise FillError(f"the token service {params['realm']} answered HTTP {response.status} for "
                                    f"repository:{self.repository}:pull"
                                    + (f" as {self._username}" if self._username else " (anonymous)"))
                answer = json.loads(response.read())
            finally:
                response.close()
            token = answer.get("token") or answer.get("access_token")
            if not token:
                raise FillError(f"the token service {params['realm']} answered without a token")
            self._authorization = f"Bearer {token}"
        else:
            raise FillError(f"{self.base} asks for an authorization this fill does not speak: {scheme or 'none'}")

    def get(self, path: str, accept: str | None = None) -> Response:
        """GET <base>/v2/<repository>/<path>, authorized (again, once, when the upstream refuses: a token expires);
        a status other than 200 fails naming the path."""
        url = f"{self.base}/v2/{self.repository}/{path}"
        for renewed in (False, True):
            headers = {"Accept": accept} if accept else {}
            with self._lock:
                authorization = self._authorization
            if authorization:
                headers["Authorization"] = authorization
            response = retried(self.settings, f"GET {url}", _getter(url, self.settings, headers))
            if response.status == 401 and not renewed:
                challenge = response.header("WWW-Authenticate")
                response.close()
                with self._lock:
                    if self._authorization == authorization:
                        self._authorize(challenge)
                continue
            if response.status != 200:
                reason = _error_codes(response)
                response.close()
                refused = " (check the registry's username and password)" if response.status in (401, 403) else ""
                raise FillError(f"GET {url}: HTTP {response.status}{reason}{refused}")
            return response
        raise AssertionError("unreachable")

    def manifest(self, reference: str) -> tuple[bytes, str]:
        response = self.get(f"manifests/{reference}", ACCEPT)
        try:
            body, media_type = response.read(), response.header("Content-Type").split(";")[0].strip()
        finally:
            response.close()
        return body, media_type


class Cache:
    """This node's registry (plain HTTP, no authorization)."""

    def __init__(self, base: str, repository: str, settings: Settings) -> None:
        self.base, self.repository, self.settings = base.rstrip("/"), repository, settings

    def url(self, path: str) -> str:
        return f"{self.base}/v2/{self.repository}/{path}"

    def has(self, blob: Blob) -> bool:
        response = retried(self.settings, f"HEAD {self.url('blobs/' + blob.digest)}",
                           lambda: request("HEAD", self.url(f"blobs/{blob.digest}"), self.settings))
        response.close()
        if response.status not in (200, 404):
            raise FillError(f"the cache answered HTTP {response.status} to HEAD blobs/{blob.digest}")
        return response.status == 200

    def upload(self, blob: Blob, content: Any) -> None:
        """POST an upload, then PUT the whole blob into it (streamed from `content`)."""
        started = request("POST", self.url("blobs/uploads/"), self.settings, body=b"")
        location = started.header("Location")
        started.close()
        if started.status != 202 or not location:
            raise FillError(f"the cache answered HTTP {started.status} to an upload of {blob.digest}")
        # The cache's own address (its Location names the Host it was asked by): path and query only.
        target = urllib.parse.urlsplit(urllib.parse.urljoin(self.base + "/", location))
        digest = urllib.parse.urlencode({"digest": blob.digest})
        put_url = f"{self.base}{target.path}?{target.query + '&' if target.query else ''}{digest}"
        done = request("PUT", put_url, self.settings, body=content,
                       headers={"Content-Type": "application/octet-stream", "Content-Length": str(blob.size)})
        reason = _error_codes(done) if done.status != 201 else ""
        done.close()
        if done.status != 201:
            raise FillError(f"the cache refused blob {blob.digest}: HTTP {done.status}{reason}")

    def put_manifest(self, tag: str, body: bytes, media_type: str) -> None:
        response = retried(self.settings, f"PUT {self.url('manifests/' + tag)}", lambda: request(
            "PUT", self.url(f"manifests/{tag}"), self.settings, body=body, headers={"Content-Type": media_type}))
        reason = _error_codes(response) if response.status != 201 else ""
        response.close()
        if response.status != 201:
            raise FillError(f"the cache refused the manifest of {self.repository}:{tag}: HTTP {response.status}"
                            f"{reason}")


class Verified:
    """The upstream's blob as the upload's body: at most `size` bytes, read CHUNK at a time; the last read checks
    the digest first (a mismatch fails naming the blob, and the cache never gets the whole blob)."""

    def __init__(self, response: Response, blob: Blob) -> None:
        self.response, self.blob, self.left = response, blob, blob.size
        algorithm, _, self.expected = blob.digest.partition(":")
        try:
            self.hash = hashlib.new(algorithm)
        except ValueError:
            raise FillError(f"blob {blob.digest}: unsupported digest algorithm") from None

    def read(self, size: int = CHUNK) -> bytes:
        if self.left == 0:
            return b""
        try:
            data = self.response.read(min(size if size > 0 else CHUNK, self.left))
        except (OSError, http.client.HTTPException) as error:
            raise Transient(f"blob {self.blob.digest}: the upstream's stream broke: {error}") from None
        if not data:
            raise Transient(f"blob {self.blob.digest}: the upstream closed after {self.blob.size - self.left} of "
                            f"{self.blob.size} bytes")
        self.hash.update(data)
        self.left -= len(data)
        if self.left == 0 and self.hash.hexdigest() != self.expected:
            raise FillError(f"blob {self.blob.digest}: the upstream sent content whose digest is "
                            f"{self.blob.digest.partition(':')[0]}:{self.hash.hexdigest()}")
        return data


def copy_blob(upstream: Upstream, cache: Cache, blob: Blob) -> int:
    """One upstream GET streamed into one upload (again only after a transient failure); the bytes copied."""
    def once() -> int:
        response = upstream.get(f"blobs/{blob.digest}")
        try:
            cache.upload(blob, Verified(response, blob))
        finally:
            response.close()
        return blob.size

    return retried(upstream.settings, f"copying blob {blob.digest}", once)


def platform_manifest(upstream: Upstream, tag: str, arch: str) -> tuple[bytes, str, dict[str, Any]]:
    body, media_type = upstream.manifest(tag)
    manifest: dict[str, Any] = json.loads(body)
    media_type = media_type or str(manifest.get("mediaType", ""))
    if media_type in INDEX_TYPES or "manifests" in manifest:
        chosen = [m for m in manifest.get("manifests", []) if m.get("platform", {}).get("os") == "linux"
                  and m.get("platform", {}).get("architecture") == arch]
        if not chosen:
            raise FillError(f"no linux/{arch} manifest in {upstream.repository}:{tag}")
        digest = str(chosen[0]["digest"])
        body, media_type = upstream.manifest(digest)
        algorithm, _, expected = digest.partition(":")
        if hashlib.new(algorithm, body).hexdigest() != expected:
            raise FillError(f"the linux/{arch} manifest of {upstream.repository}:{tag} does not match {digest}")
        manifest = json.loads(body)
        media_type = media_type or str(manifest.get("mediaType", ""))
    if media_type not in IMAGE_TYPES or "layers" not in manifest:
        raise FillError(f"{upstream.repository}:{tag} has a manifest of type '{media_type}', which the cache "
                        "cannot fill (an OCI or Docker v2 image manifest is needed)")
    return body, media_type, manifest


def fill(upstream: Upstream, cache: Cache, tag: str, arch: str, threads: int) -> str:
    body, media_type, manifest = platform_manifest(upstream, tag, arch)
    blobs = [Blob(str(d["digest"]), int(d["size"])) for d in [manifest["config"], *manifest["layers"]]]
    unique = list({blob.digest: blob for blob in blobs}.values())
    missing = [blob for blob in unique if not cache.has(blob)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        copied = sum(pool.map(lambda blob: copy_blob(upstream, cache, blob), missing))
    cache.put_manifest(tag, body, media_type)
    return f"cache holds {len(unique)} blobs ({len(missing)} fetched now, {copied / 1e9:.2f} GB)"


def _float_setting(env: Mapping[str, str], name: str, default: str) -> float:
    value = env.get(name) or default
    try:
        return float(value)
    except ValueError:
        raise FillError(f"{name} must be a number, got '{value}'") from None


def fill_from_env(env: Mapping[str, str]) -> str:
    settings = Settings(attempts=max(1, int(_float_setting(env, "CACHE_FILL_ATTEMPTS", "5"))),
                        delay_s=_float_setting(env, "CACHE_FILL_RETRY_DELAY_S", "2"),
                        stall_s=_float_setting(env, "CACHE_FILL_STALL_S", "120"))
    missing = [name for name in ("CACHE_UPSTREAM", "CACHE_REPOSITORY", "CACHE_URL") if not env.get(name)]
    if missing:
        raise FillError(f"{', '.join(missing)} not set")
    repository, _, tag = env["CACHE_REPOSITORY"].partition(":")
    upstream = Upstream(env["CACHE_UPSTREAM"], repository, env.get("REGISTRY_USERNAME", ""),
                        env.get("REGISTRY_PASSWORD", ""), settings)
    cache = Cache(env["CACHE_URL"], repository, settings)
    threads = int(_float_setting(env, "CACHE_FILL_THREADS", "4"))
    return fill(upstream, cache, tag or "latest", env.get("CACHE_ARCH") or "amd64", threads)


def main() -> int:
    password = os.environ.get("REGISTRY_PASSWORD", "")
    try:
        print(fill_from_env(os.environ))
        return 0
    except (FillError, OSError, http.client.HTTPException) as error:
        reason = str(error) if isinstance(error, FillError) else f"{type(error).__name__}: {error}"
        if password:
            reason = reason.replace(password, "***")
        print(f"pull-cache fill: {reason}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
