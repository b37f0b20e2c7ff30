"""A real HTTP file server on 127.0.0.1 for remote-read tests: range requests, a log of what it served, and
faults on demand (``server.fault(n, path)`` -> None, "500", "404", "403", "drop" (half the body, then the connection
is closed) or "stall" (no answer for ``server.stall_s`` seconds) for the n-th request)."""

import http.server
import itertools
import os
import re
import threading
import time
import urllib.parse
from contextlib import contextmanager


class RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves the files of ``server.root`` with HTTP Range support (the stdlib handler has none) and logs every
    request as ``(method, path, bytes sent)`` in ``server.served``."""

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        url = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        path = os.path.join(self.server.root, url.lstrip("/"))
        fault = self.server.fault(next(self.server.count), url) if self.server.fault else None
        if fault in ("500", "404", "403"):
            self.server.faults.append((fault, url))
            return self.send_error(int(fault), {"500": "flaky", "404": "gone", "403": "forbidden"}[fault])
        if fault == "stall":
            self.server.faults.append((fault, url))
            time.sleep(self.server.stall_s)
            self.close_connection = True
            return
        if not os.path.isfile(path):
            return self.send_error(404)
        size, wanted = os.path.getsize(path), self.headers.get("Range")
        start, end = 0, size
        if wanted:
            match = re.fullmatch(r"bytes=(\d*)-(\d*)", wanted.strip())
            if not match or match.groups() == ("", ""):
                return self.send_error(416)
            first, last = match.groups()
            start, end = ((max(size - int(last), 0), size) if first == "" else
                          (int(first), min(int(last) + 1, size) if last else size))
            if start >= size:
                return self.send_error(416)
        self.send_response(206 if wanted else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start))
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.end_headers()
        data = b""
        if body:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(end - start)
        if fault == "drop" and len(data) > 1:
            self.server.faults.append((fault, url))
            self.wfile.write(data[: len(data) // 2])
            self.close_connection = True
            return
        self.server.served.append((self.command, url, len(data)))  # logged before the client can see the bytes
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@contextmanager
def serve(root, *, fault=None, stall_s: float = 3.0):
    """An HTTP server on 127.0.0.1 serving the files under ``root``; yields it (``server.served`` logs the answered
    requests, ``server.faults`` the faults it made, ``server.server_address[1]`` is its port). Stopped and closed
    on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    server.daemon_threads, server.block_on_close = True, False  # a stalled answer does not hold up the close
    server.root, server.served, server.faults = str(root), [], []
    server.fault, server.stall_s, server.count = fault, stall_s, itertools.count()
    with running(server):
        yield server


@contextmanager
def running(server: http.server.HTTPServer):
    """``server`` answering on a thread of its own while the block runs; stopped and closed after."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
