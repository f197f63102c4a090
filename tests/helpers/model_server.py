"""A stand-in model hub for the real-host tier: the part of the Hugging Face Hub's HTTP API that huggingface_hub's
snapshot_download and hf_hub_download use (the client the frameworks download with, pointed at it by HF_ENDPOINT as
`training.hfEndpoint` does), serving one small repository and counting who fetched which file.

Requests (huggingface_hub 0.36.0, requirements-e2e.txt):
- GET /api/models/<repo>/revision/<rev>: the repository's commit and file list (hf_api.py `model_info`;
  snapshot_download's `repo_info`);
- HEAD /<repo>/resolve/<rev>/<file>: the file's commit, ETag and size (file_download.py `get_hf_file_metadata`),
  asked before a download (and by hf_hub_download before it uses a cached copy);
- GET /<repo>/resolve/<rev>/<file>: the file itself: a download, counted per client address.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class ModelHub:
    """Serves `files` as repository `repo_id` at one commit on address:port; `downloads` counts (client, file)."""

    def __init__(self, address: str, port: int, repo_id: str, files: dict[str, bytes]) -> None:
        self.repo_id = repo_id
        self.files = files
        self.commit = hashlib.sha1(b"".join(files[name] for name in sorted(files))).hexdigest()
        self.downloads: Counter[tuple[str, str]] = Counter()
        self.lookups: Counter[tuple[str, str]] = Counter()  # HEAD: a client checking a file's metadata
        self.listings: Counter[tuple[str, str]] = Counter()  # the repository's file list: every snapshot_download
        self.unknown: list[str] = []
        self._lock = threading.Lock()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:  # quiet: the counters are the record
                pass

            def do_GET(self) -> None:
                hub.answer(self, body=True)

            def do_HEAD(self) -> None:
                hub.answer(self, body=False)

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.endpoint = f"http://{address}:{port}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ModelHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def downloads_by_file(self) -> dict[str, int]:
        with self._lock:
            counts: Counter[str] = Counter()
            for (_, name), count in self.downloads.items():
                counts[name] += count
            return dict(counts)

    def clients_of(self, counter: Counter[tuple[str, str]]) -> set[str]:
        with self._lock:
            return {client for client, _ in counter}

    def answer(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(request.path).path)
        client = request.client_address[0]
        info = f"/api/models/{self.repo_id}/revision/"
        resolve = f"/{self.repo_id}/resolve/"
        if body and path.startswith(info):
            with self._lock:
                self.listings[(client, self.repo_id)] += 1
            siblings = [{"rfilename": name} for name in sorted(self.files)]
            self._send(request, 200, json.dumps({"id": self.repo_id, "sha": self.commit, "siblings": siblings})
                       .encode(), {"Content-Type": "application/json"}, body)
            return
        if path.startswith(resolve):
            name = path[len(resolve):].split("/", 1)[1] if "/" in path[len(resolve):] else ""
            if name in self.files:
                content = self.files[name]
                with self._lock:
                    (self.downloads if body else self.lookups)[(client, name)] += 1
                self._send(request, 200, content, {
                    "X-Repo-Commit": self.commit,
                    "ETag": f'"{hashlib.sha256(content).hexdigest()}"',
                    "Content-Type": "application/octet-stream",
                }, body)
                return
        with self._lock:
            self.unknown.append(f"{request.command} {request.path}")
        self._send(request, 404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound"}, body)

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, status: int, content: bytes, headers: dict[str, str],
              body: bool) -> None:
        request.send_response(status)
        for name, value in headers.items():
            request.send_header(name, value)
        request.send_header("Content-Length", str(len(content)))
        request.end_headers()
        if body:
            request.wfile.write(content)
