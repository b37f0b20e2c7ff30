"""A local server that answers the Hugging Face Hub's HTTP API for the calls huggingface_hub's filesystem
(``hf://datasets/<org>/<name>``, ``hf://buckets/<namespace>/<bucket>/<path>``) and ``snapshot_download`` make,
serving dataset repositories and storage buckets from folders: ``repos = {"org/name": folder}``,
``buckets = {"namespace/bucket": folder}``. Point huggingface_hub at it with ``HF_ENDPOINT=http://127.0.0.1:<port>``
(read when huggingface_hub is imported: set it in a fresh process). Every request is logged in ``server.requests``,
the ``Range`` header of every file request in ``server.ranges`` (``(path, header or None)``);
``server.throttle = n`` answers the next ``n`` file requests with HTTP 429 and ``Retry-After: 1``.

The bucket calls, as huggingface_hub 2.4 makes them (``HfApi.bucket_info``, ``list_bucket_tree``,
``get_bucket_paths_info``; ``HfFileSystem`` reads a file with ranged GETs of its ``resolve`` URL):

- ``GET /api/buckets/<id>``: ``{"id", "private", "createdAt", "size", "totalFiles"}``; a missing bucket is 404 with
  ``X-Error-Code: RepoNotFound`` (huggingface_hub's ``BucketNotFoundError``, a FileNotFoundError in the filesystem).
- ``GET /api/buckets/<id>/tree[/<prefix, quoted with its slashes>][?recursive=true|false]``: a JSON list (paginated by
  a ``Link`` header; one page here) of ``{"type": "file", "path", "size", "xetHash", "mtime", "uploadedAt"}`` and,
  when not recursive, ``{"type": "directory", "path", "uploadedAt"}``. The prefix is matched lexically (``logs`` also
  lists ``logs_old/...``; huggingface_hub drops those), a prefix naming a file lists that file, and a prefix matching
  nothing is an empty list (huggingface_hub makes it a FileNotFoundError). Recursive listings hold files only.
- ``POST /api/buckets/<id>/paths-info`` with JSON ``{"paths": [...]}``: the file entries of those that are files.
- ``GET``/``HEAD /buckets/<id>/resolve/<path>``: the bytes, ``Range`` answered with 206; a missing file is 404 with
  ``X-Error-Code: EntryNotFound``.
"""

import datetime
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


def _stamp(path: str) -> str:
    """A file's modification time as the Hub writes dates (``2024-09-25T15:31:02.346Z``)."""
    when = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def _bucket_files(root: str) -> list[str]:
    """Every file of a bucket's folder, as sorted bucket paths (a bucket holds files only; folders are implied)."""
    out = []
    for folder, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(folder, n), root).replace(os.sep, "/") for n in names]
    return sorted(out)


def _inside(rel: str) -> bool:
    """Whether the relative path ``rel`` stays inside its folder (no ``..`` part, not absolute)."""
    return not rel.startswith("/") and ".." not in rel.split("/")


def _bucket_file(root: str, rel: str) -> dict:
    path = os.path.join(root, rel)
    with open(path, "rb") as f:
        xet = hashlib.sha256(f.read()).hexdigest()
    return {"type": "file", "path": rel, "size": os.path.getsize(path), "xetHash": xet, "mtime": _stamp(path),
            "uploadedAt": _stamp(path)}


def _bucket_tree(root: str, prefix: str, recursive: bool) -> list[dict]:
    """A bucket's tree listing under ``prefix`` (see the module docstring)."""
    files = [rel for rel in _bucket_files(root) if rel.startswith(prefix)]
    if recursive or prefix in files:
        return [_bucket_file(root, rel) for rel in files]
    # the direct children of the folder ``prefix`` names, and, for a lexical match (``logs`` -> ``logs_old/x``),
    # the entry at the prefix's own depth
    folder = prefix.rstrip("/")
    depth = folder.count("/") + 1 if folder else 0
    out, seen = [], set()
    for rel in files:
        parts = rel.split("/")
        inside = not folder or rel.startswith(folder + "/")
        name = "/".join(parts[:depth + 1] if inside else parts[:depth])
        if name in seen:
            continue
        seen.add(name)
        out.append(_bucket_file(root, name) if name == rel else
                   {"type": "directory", "path": name, "uploadedAt": _stamp(os.path.join(root, name))})
    return out


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

    def _missing(self, code: str = "EntryNotFound") -> None:
        body = json.dumps({"error": "Bucket not found" if code == "RepoNotFound" else "Entry not found"}).encode()
        self.send_response(404)
        self.send_header("X-Error-Code", code)
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
        data = self.rfile.read(length).decode()
        match = re.fullmatch(r"/api/buckets/([^/]+/[^/]+)/paths-info", urllib.parse.unquote(url.path))
        if match:
            root = self.server.buckets.get(match.group(1))
            if root is None:
                return self._missing("RepoNotFound")
            wanted = json.loads(data or "{}").get("paths", [])
            return self._json([_bucket_file(root, rel) for rel in wanted if _inside(rel)
                               and os.path.isfile(os.path.join(root, rel))])
        form = urllib.parse.parse_qs(data)
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
            return self._file(self._repo(match.group(1)), match.group(3), body)
        match = re.fullmatch(r"/api/buckets/([^/]+/[^/]+)", path)
        if match:
            root = self.server.buckets.get(match.group(1))
            if root is None:
                return self._missing("RepoNotFound")
            files = _bucket_files(root)
            return self._json({"id": match.group(1), "private": False, "createdAt": _stamp(root),
                               "size": sum(os.path.getsize(os.path.join(root, f)) for f in files),
                               "totalFiles": len(files)})
        match = re.fullmatch(r"/api/buckets/([^/]+/[^/]+)/tree(?:/(.*))?", path)
        if match:
            root = self.server.buckets.get(match.group(1))
            if root is None:
                return self._missing("RepoNotFound")
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            return self._json(_bucket_tree(root, match.group(2) or "", recursive))
        match = re.fullmatch(r"/buckets/([^/]+/[^/]+)/resolve/(.+)", path)
        if match:
            return self._file(self.server.buckets.get(match.group(1)), match.group(2), body)
        self._missing()

    def _file(self, root: str | None, rel: str, body: bool) -> None:
        file = os.path.join(root, rel) if root and _inside(rel) else ""
        if not file or not os.path.isfile(file):
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
        self.server.ranges.append((rel, wanted))
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
def serve_hub(repos: dict[str, str], buckets: dict[str, str] | None = None):
    """The server on 127.0.0.1, serving ``repos`` ({"org/name": folder}) and ``buckets`` ({"namespace/bucket":
    folder}); yields it (its URL is ``server.url``). Stopped on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HubHandler)
    server.daemon_threads, server.block_on_close = True, False
    server.repos, server.requests, server.served = {k: str(v) for k, v in repos.items()}, [], []
    server.buckets, server.ranges = {k: str(v) for k, v in (buckets or {}).items()}, []
    server.throttle, server.throttled, server.lock = 0, 0, threading.Lock()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    with running(server):
        yield server
