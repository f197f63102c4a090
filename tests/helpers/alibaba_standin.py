"""Stand-ins for the two Alibaba services the node scripts call: the instance metadata service (the RAM role's STS
credentials, the instance id and region, the spot termination-time notice) and the ECS RPC endpoint, which records
every call and checks its signature (RPC signature v1, HMAC-SHA1 with `<AccessKeySecret>&`) against the temporary
credentials the metadata service handed out.

The signature check follows Alibaba's documented RPC signature (V1), written here from the documentation and not
from any SDK: the request's parameters (query and form body) without `Signature`, sorted by name, each name and
value percent-encoded (RFC 3986: only A-Z a-z 0-9 - _ . ~ kept, space as %20), joined as `name=value` with `&`;
the string to sign is `<HTTP method>&%2F&<that, percent-encoded again>`; the signature is
Base64(HMAC-SHA1(AccessKeySecret + "&", string to sign)) (Alibaba Cloud, "Request syntax and signature method V1
for RPC APIs"). StopInstances answers as ECS documents it: with BatchOptimization=SuccessFirst every instance is
stopped on its own and answered for (`InstanceResponses.InstanceResponse[]`, Code "200" on success); without it
(AllTogether) one instance that fails the check fails the whole call.

Used by the real-host tier (tests/e2e/test_idle_and_reclaim.py), bound to the test network's address that the
hosts reach; each server answers on its own thread and shuts itself down after `lifetime_s` at the latest.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

# What the metadata service hands out for the role: temporary (STS) credentials, as ECS does
# (`/latest/meta-data/ram/security-credentials/<role>`; the AccessKeyId of STS credentials starts with `STS.`).
CREDENTIALS = {"AccessKeyId": "STS.NStandInTemporary", "AccessKeySecret": "stand-in-temporary-secret",
               "SecurityToken": "CAIS+stand/in==token"}


def percent_encode(text: str) -> str:
    """RFC 3986 as Alibaba's RPC signature requires (A-Z a-z 0-9 - _ . ~ kept)."""
    return urllib.parse.quote(text, safe="-_.~")


def signature_of(params: dict[str, str], secret: str, method: str = "GET") -> str:
    canonical = "&".join(f"{percent_encode(k)}={percent_encode(v)}" for k, v in sorted(params.items()))
    string_to_sign = f"{method}&%2F&{percent_encode(canonical)}"
    return base64.b64encode(hmac.new(f"{secret}&".encode(), string_to_sign.encode(), hashlib.sha1).digest()).decode()


@dataclass
class AlibabaStandIn:
    """One metadata service and one ECS endpoint on `address` (ephemeral ports)."""

    address: str
    role: str
    instance_id: str = "i-standin"
    region: str = "cn-hangzhou"
    lifetime_s: float = 600
    termination_time: str | None = None  # set it: the spot notice appears
    instances: set[str] | None = None  # the instances ECS knows (None: every id); others are InvalidInstanceId.NotFound
    all_together: bool = False  # answer a SuccessFirst call as AllTogether (one unknown id fails the whole call)
    ecs_calls: list[dict[str, str]] = field(default_factory=list)  # each with "signatureValid": "True"/"False"
    metadata_paths: list[str] = field(default_factory=list)
    _servers: list[http.server.ThreadingHTTPServer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> AlibabaStandIn:
        self._servers = [self._serve(self._metadata), self._serve(self._ecs)]
        timer = threading.Timer(self.lifetime_s, self.stop)  # stops by itself, whatever the test does
        timer.daemon = True
        timer.start()
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers = []

    @property
    def metadata_url(self) -> str:
        return f"http://{self.address}:{self._servers[0].server_address[1]}"

    @property
    def ecs_url(self) -> str:
        return f"http://{self.address}:{self._servers[1].server_address[1]}"

    def calls(self) -> list[dict[str, str]]:
        with self._lock:
            return list(self.ecs_calls)

    # ---- the two services
    def _metadata(self, path: str, query: str) -> tuple[int, str]:
        del query
        with self._lock:
            self.metadata_paths.append(path)
        answers = {
            f"/latest/meta-data/ram/security-credentials/{self.role}": json.dumps(
                {"Code": "Success", **CREDENTIALS, "Expiration": "2099-01-01T00:00:00Z"}, indent=2),
            "/latest/meta-data/instance-id": self.instance_id,
            "/latest/meta-data/region-id": self.region,
        }
        if self.termination_time:
            answers["/latest/meta-data/instance/spot/termination-time"] = self.termination_time
        return (200, answers[path]) if path in answers else (404, "")

    def _ecs(self, path: str, query: str, method: str = "GET", body: str = "") -> tuple[int, str]:
        params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
        params.update(urllib.parse.parse_qsl(body, keep_blank_values=True))
        signature = params.pop("Signature", "")
        expected = signature_of(params, CREDENTIALS["AccessKeySecret"], method)
        with self._lock:
            self.ecs_calls.append({**params, "path": path, "method": method,
                                   "signatureValid": str(signature == expected)})
        if signature != expected:
            return 400, json.dumps({"Code": "SignatureDoesNotMatch", "Message": "stand-in", "RequestId": "stand-in"})
        if params.get("Action") != "StopInstances":
            return 400, json.dumps({"Code": "InvalidAction.NotFound", "RequestId": "stand-in"})
        ids = [v for k, v in sorted(params.items(), key=lambda kv: _index(kv[0])) if k.startswith("InstanceId.")]
        unknown = [i for i in ids if self.instances is not None and i not in self.instances]
        if params.get("BatchOptimization") != "SuccessFirst" or self.all_together:
            if unknown:
                return 404, json.dumps({"Code": "InvalidInstanceId.NotFound", "RequestId": "stand-in",
                                        "Message": f"The specified InstanceId does not exist: {unknown[0]}"})
            return 200, json.dumps({"RequestId": "stand-in"})
        answers = [{"InstanceId": i, "Code": "InvalidInstanceId.NotFound" if i in unknown else "200",
                    "Message": "not found" if i in unknown else "success", "PreviousStatus": "Running",
                    "CurrentStatus": "Running" if i in unknown else "Stopping"} for i in ids]
        return 200, json.dumps({"RequestId": "stand-in", "InstanceResponses": {"InstanceResponse": answers}})

    def _serve(self, answer: Any) -> http.server.ThreadingHTTPServer:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._reply(*answer(*_split(self.path)))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                path, query = _split(self.path)
                self._reply(*(answer(path, query, "POST", body) if answer == self_ecs else answer(path, query)))

            def _reply(self, status: int, body: str) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body.encode())))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self_ecs = self._ecs
        server = http.server.ThreadingHTTPServer((self.address, 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        return server


def _split(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.path, parts.query


def _index(name: str) -> int:
    """InstanceId.N's N (the order ECS reads them in); other names first."""
    return int(name.split(".", 1)[1]) if name.startswith("InstanceId.") and name.split(".", 1)[1].isdigit() else 0
