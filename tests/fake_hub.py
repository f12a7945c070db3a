"""A local stand-in for the Hugging Face Hub: a real HTTP server on 127.0.0.1 with the routes
huggingface_hub calls, so the real client (get_hf_file_metadata, hf_hub_download, list_repo_tree)
runs against it unchanged.

- HEAD/GET /{repo}/resolve/{revision}/{file}: for an LFS file, as the real hub, a 302 to a CDN on
  another host name (`localhost` for `127.0.0.1`) carrying X-Repo-Commit, X-Linked-Etag (the sha256
  of the bytes, quoted) and X-Linked-Size; the client reads the metadata from the 302 and downloads
  from the CDN URL. A plain git file answers 200 with a sha1-like ETag. GET honours
  `Range: bytes=N-` (resumed downloads).
- GET /api/models/{repo}/tree/{revision}?recursive=…: the file listing (path, size, oid, lfs).

`publish(repo, name, data)` serves bytes; `lie_about` makes the listed digest differ from the bytes;
`not_lfs` serves a file as a plain git blob (a sha1-like etag, no sha256); `status` forces an HTTP
error on a path. Every request path is recorded.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self):
        self.files: dict[tuple[str, str], bytes] = {}
        self.digest: dict[tuple[str, str], str] = {}
        self.not_lfs: set[tuple[str, str]] = set()
        self.status: dict[str, int] = {}  # path prefix -> HTTP status to answer with
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.hub = self
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def publish(self, repo: str, name: str, data: bytes) -> None:
        self.files[(repo, name)] = data
        self.digest[(repo, name)] = hashlib.sha256(data).hexdigest()

    def lie_about(self, repo: str, name: str) -> None:
        self.digest[(repo, name)] = hashlib.sha256(b"other bytes").hexdigest()

    def downloads(self) -> list[str]:
        """`repo/file` of every file body served (GET from the CDN, or of a plain git file)."""
        served = []
        for method, path in self.requests:
            if method == "GET" and path.startswith("/cdn/"):
                served.append(urllib.parse.unquote(path[len("/cdn/"):]))
            elif method == "GET" and "/resolve/" in path:
                repo, _, rest = path.lstrip("/").partition("/resolve/")
                served.append(f"{repo}/{urllib.parse.unquote(rest.partition('/')[2])}")
        return served

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_HEAD(self):
        self._answer(body=False)

    def do_GET(self):
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        hub: FakeHub = self.server.hub
        path = urllib.parse.urlsplit(self.path).path
        hub.requests.append((self.command, path))
        for prefix, status in hub.status.items():
            if path.startswith(prefix):
                return self._send(status, b'{"error": "forced"}', {"Content-Type": "application/json", "X-Error-Message": "forced error"}, body)
        if path.startswith("/api/models/"):
            return self._tree(path, body)
        if path.startswith("/cdn/"):
            repo, name = _split_cdn(path)
            return self._bytes((repo, name), {"Accept-Ranges": "bytes"}, body)
        if "/resolve/" not in path:
            return self._send(404, b"not found", {}, body)
        repo, _, rest = path.lstrip("/").partition("/resolve/")
        _, _, name = rest.partition("/")
        key = (repo, urllib.parse.unquote(name))
        if key not in hub.files:
            return self._send(404, b"Entry not found", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}, body)
        if key in hub.not_lfs:
            return self._bytes(key, {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha1(hub.files[key]).hexdigest()}"'}, body)
        cdn = f"http://localhost:{self.server.server_port}/cdn/{urllib.parse.quote(key[0])}/{urllib.parse.quote(key[1])}"
        headers = {"X-Repo-Commit": COMMIT, "X-Linked-Etag": f'"{hub.digest[key]}"', "X-Linked-Size": str(len(hub.files[key])),
                   "ETag": f'"{hashlib.sha1(b"pointer" + key[1].encode()).hexdigest()}"', "Location": cdn}
        self._send(302, b"", headers, body)

    def _bytes(self, key: tuple[str, str], headers: dict, body: bool) -> None:
        hub: FakeHub = self.server.hub
        if key not in hub.files:
            return self._send(404, b"not found", {}, body)
        data = hub.files[key]
        start = _range_start(self.headers.get("Range"))
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            return self._send(206, data[start:], headers, body)
        self._send(200, data, headers, body)

    def _tree(self, path: str, body: bool) -> None:
        hub: FakeHub = self.server.hub
        repo = path[len("/api/models/"):].split("/tree/")[0]
        entries = [
            {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest(),
             "lfs": {"oid": hub.digest[(r, name)], "size": len(data), "pointerSize": 134}}
            for (r, name), data in sorted(hub.files.items()) if r == repo
        ]
        if not entries:
            return self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, body)
        self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, body)

    def _send(self, status: int, data: bytes, headers: dict, body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, *args):
        pass


def _split_cdn(path: str) -> tuple[str, str]:
    """/cdn/{owner}/{repo}/{file…} -> ("owner/repo", "file…")."""
    owner, repo, name = urllib.parse.unquote(path[len("/cdn/"):]).split("/", 2)
    return f"{owner}/{repo}", name


def _range_start(header: str | None) -> int:
    if not header or not header.startswith("bytes="):
        return 0
    return int(header[len("bytes="):].split("-")[0] or 0)
