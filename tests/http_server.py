"""A real HTTP file server on 127.0.0.1 for remote-read tests: range requests, and a log of what it served."""

import http.server
import os
import re
import threading
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
        self.server.served.append((self.command, url, len(data)))  # logged before the client can see the bytes
        self.wfile.write(data)

    def log_message(self, *args) -> None:  # keep the test output clean
        pass


@contextmanager
def serve(root):
    """An HTTP server on 127.0.0.1 serving the files under ``root``; yields it (``server.served`` logs requests,
    ``server.server_address[1]`` is its port). Stopped and closed on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    server.root, server.served = str(root), []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
