"""A local server that answers the Hugging Face Hub's HTTP API for the calls huggingface_hub's filesystem
(``hf://datasets/<org>/<name>``) and ``snapshot_download`` make, serving dataset repositories from folders:
``repos = {"org/name": folder}``. Point huggingface_hub at it with ``HF_ENDPOINT=http://127.0.0.1:<port>`` (read
when huggingface_hub is imported: set it in a fresh process). Every request is logged in ``server.requests``;
``server.throttle = n`` answers the next ``n`` file requests with HTTP 429 and ``Retry-After: 1``."""

import hashlib
import http.server
import json
import os
import re
import threading
import urllib.parse
from contextlib import contextmanager

from http_server import running  # tests/ is on the path of every test that serves

SHA = "0123456789abcdef0123456789abcdef01234567"  # the one commit every repository is at


def _entries(root: str, relative: str, recursive: bool) -> list[dict]:
    """The tree entries under ``relative`` of ``root`` as the Hub lists them."""
    base = os.path.join(root, relative)
    out = []
    for name in sorted(os.listdir(base)):
        path = os.path.join(base, name)
        rel = f"{relative.strip('/')}/{name}".lstrip("/")
        if os.path.isdir(path):
            out.append({"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "size": 0, "path": rel})
            if recursive:
                out += _entries(root, rel, True)
        else:
            out.append(_file(root, rel))
    return out


def _file(root: str, rel: str) -> dict:
    path = os.path.join(root, rel)
    return {"type": "file", "oid": hashlib.sha1(rel.encode()).hexdigest(), "size": os.path.getsize(path),
            "path": rel}


class HubHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _json(self, value, status: int = 200) -> None:
        body = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _missing(self) -> None:
        body = b'{"error": "Entry not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "EntryNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _repo(self, repo: str):
        return self.server.repos.get(repo)

    def do_POST(self) -> None:
        self.server.requests.append(("POST", self.path))
        url = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        form = urllib.parse.parse_qs(self.rfile.read(length).decode())
        match = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/paths-info/([^/]+)", urllib.parse.unquote(url.path))
        root = self._repo(match.group(1)) if match else None
        if root is None:
            return self._missing()
        out = []
        for rel in form.get("paths", []):
            path = os.path.join(root, rel)
            if os.path.isfile(path):
                out.append(_file(root, rel))
            elif os.path.isdir(path):
                out.append({"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "size": 0,
                            "path": rel})
        self._json(out)

    def do_HEAD(self) -> None:
        self._get(body=False)

    def do_GET(self) -> None:
        self._get(body=True)

    def _get(self, body: bool) -> None:
        self.server.requests.append((self.command, self.path))
        url = urllib.parse.urlsplit(self.path)
        path, query = urllib.parse.unquote(url.path), urllib.parse.parse_qs(url.query)
        match = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if match:
            root = self._repo(match.group(1))
            if root is None:
                return self._missing()
            return self._json({"id": match.group(1), "sha": SHA, "private": False,
                               "siblings": [{"rfilename": e["path"]} for e in _entries(root, "", True)
                                            if e["type"] == "file"]})
        match = re.fullmatch(r"/api/datasets/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if match:
            root = self._repo(match.group(1))
            rel = (match.group(3) or "").strip("/")
            if root is None or not os.path.isdir(os.path.join(root, rel)):
                return self._missing()
            return self._json(_entries(root, rel, query.get("recursive", ["false"])[0].lower() == "true"))
        match = re.fullmatch(r"/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if match:
            return self._file(match.group(1), match.group(3), body)
        self._missing()

    def _file(self, repo: str, rel: str, body: bool) -> None:
        root = self._repo(repo)
        file = os.path.join(root, rel) if root else ""
        if not root or not os.path.isfile(file):
            return self._missing()
        with self.server.lock:
            throttled = self.server.throttle > 0
            self.server.throttle -= throttled
        if throttled:
            self.server.throttled += 1
            self.send_response(429)
            self.send_header("Retry-After", "1")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size, wanted = os.path.getsize(file), self.headers.get("Range")
        start, end = 0, size
        if wanted:
            first, last = re.fullmatch(r"bytes=(\d*)-(\d*)", wanted.strip()).groups()
            start, end = ((max(size - int(last), 0), size) if first == "" else
                          (int(first), min(int(last) + 1, size) if last else size))
        self.send_response(206 if wanted else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        self.send_header("ETag", f'"{hashlib.sha1(rel.encode()).hexdigest()}"')
        self.send_header("X-Repo-Commit", SHA)
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        if body:
            with open(file, "rb") as f:
                f.seek(start)
                data = f.read(end - start)
            self.server.served.append((rel, len(data)))
            self.wfile.write(data)


@contextmanager
def serve_hub(repos: dict[str, str]):
    """The server on 127.0.0.1, serving ``repos`` ({"org/name": folder}); yields it (its URL is
    ``server.url``). Stopped on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
    server.daemon_threads, server.block_on_close = True, False
    server.repos, server.requests, server.served = {k: str(v) for k, v in repos.items()}, [], []
    server.throttle, server.throttled, server.lock = 0, 0, threading.Lock()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    with running(server):
        yield server
