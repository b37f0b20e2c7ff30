"""Where a dataset's files are: a local directory or any fsspec URL, read the same way.

A LeRobot directory is read in place, on local disk or in object storage (``s3://``, ``gs://``, ``https://``,
any fsspec URL): :class:`DatasetFiles` reads small metadata files whole (once, when the dataset opens) and
opens data parquet files and videos as seekable files whose bytes come by range through this process's bounded
block cache (:func:`~mmfeed.loaders.transport.remote.default_cache`), so a worker fetches the parquet footers,
the columns it reads, and the video headers and groups of pictures its batches need, never whole files. Every
remote operation, listing, size, whole-file and range reads alike, is retried under the one
:class:`~mmfeed.loaders.transport.remote.RetryPolicy` (``MMFEED_REMOTE_RETRIES``, ``MMFEED_REMOTE_TIMEOUT_S``):
a flaky store costs time, not the epoch; after the last try the error names the URL, the range and the cause.

    >>> import fsspec
    >>> with fsspec.open("memory://mmfeed-files-doc/meta/info.json", "w") as f:
    ...     _ = f.write('{"fps": 30}')
    >>> files = DatasetFiles("memory://mmfeed-files-doc")
    >>> files.read_json("meta/info.json"), files.exists("meta/tasks.parquet")
    ({'fps': 30}, False)
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from mmfeed.loaders.transport.confine import Confined, UnsafePathError, shorten
from mmfeed.loaders.transport.json_limits import check_json, check_json_size
from mmfeed.loaders.transport.remote import RetryPolicy, default_cache

__all__ = ["DatasetFiles", "RemoteFile", "is_url", "open_remote", "remote_info"]


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def _filesystem(url: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` (fsspec keeps one per process and arguments) and the path it takes."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return fs, url if url.split("://", 1)[0] in ("http", "https") else path


def _retried(attempt: Any, what: str) -> Any:
    return RetryPolicy.from_env().run(attempt, what)


def remote_info(url: str) -> dict[str, Any]:
    """What the store says of the file at ``url`` (``size``, ``mtime`` where known), retried; a missing file is
    FileNotFoundError and a folder IsADirectoryError. Over HTTP it is asked with a HEAD request of its own:
    fsspec's HTTP ``info`` reports any failed answer, a 500 included, as a missing file, which would make a
    flaky server look like a dataset with fewer files."""
    if url.split("://", 1)[0] in ("http", "https"):
        return _retried(lambda: _http_info(url), url)
    fs, path = _filesystem(url)
    info = _retried(lambda: _fs_info(fs, path, url), url)
    if info.get("type") == "directory":
        raise IsADirectoryError(f"{url} is a directory, not a file")
    return info


def _fs_info(fs: Any, path: str, url: str) -> dict[str, Any]:
    """``fs.info(path)``; huggingface_hub's filesystem (2.4) answers a path below a file of a storage bucket
    (``hf://buckets/ns/b/meta/info.json/x``) with a KeyError of its listing cache: that is a missing file."""
    try:
        return fs.info(path)
    except KeyError as err:
        if "hf" not in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
            raise
        raise FileNotFoundError(f"{url}: no such file") from err


def _http_info(url: str) -> dict[str, Any]:
    """``{"size"}`` of ``url`` from a HEAD request (a one-byte range request where the server sends no length);
    404 is FileNotFoundError, other failures raise as urllib reports them (with their status)."""
    import urllib.error
    import urllib.request

    timeout = RetryPolicy.from_env().timeout_s or None
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout) as answer:
            length = answer.headers.get("Content-Length")
        if length is None:
            ranged = urllib.request.Request(url, headers={"Range": "bytes=0-0"})
            with urllib.request.urlopen(ranged, timeout=timeout) as answer:
                length = (answer.headers.get("Content-Range") or "").rpartition("/")[2] or None
    except urllib.error.HTTPError as err:
        if err.code in (404, 410):
            raise FileNotFoundError(f"{url} does not exist ({err.code})") from err
        raise
    if length is None or not length.isdigit():
        raise ValueError(f"{url}: the server gives no length for the file (no Content-Length or Content-Range)")
    return {"size": int(length), "type": "file"}


def open_remote(url: str, size: int | None = None) -> BinaryIO:
    """The remote file ``url`` as a seekable binary file read by range through the block cache, retried."""
    return RemoteFile(url, int(remote_info(url)["size"]) if size is None else int(size)).open()


@dataclass(frozen=True)
class RemoteFile:
    """A remote file of known size, opened as a seekable binary file that reads through the process's range cache
    (a :class:`~mmfeed.codecs.demux.FileOpener`: PyAV decodes it, fetching only what it reads)."""

    url: str
    size: int

    @property
    def name(self) -> str:
        return self.url

    @property
    def key(self) -> tuple[str, str, int]:
        return ("remote", self.url, self.size)

    def open(self) -> BinaryIO:
        return _RangeReader(self.url, self.size)  # unbuffered: the range cache holds whole blocks already


class _RangeReader(io.RawIOBase):
    """The bytes of a remote file, read at any offset through :func:`default_cache` (blocks, retries)."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self._pos = url, int(size), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.url}: seek to {base + offset}, before the start of the file")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        want = min(len(buffer), max(self.size - self._pos, 0))
        if want <= 0:
            return 0
        data = default_cache().read(self.url, self._pos, want)
        memoryview(buffer)[: len(data)] = data
        self._pos += len(data)
        return len(data)


class DatasetFiles:
    """The files of one dataset under ``root``, a local directory or an fsspec URL; paths given to the methods are
    relative to it (``"meta/info.json"``). Pickles without open handles: each worker opens its own.

    Credentials and endpoints come from the usual fsspec places (environment variables such as
    ``AWS_ENDPOINT_URL``, config files), as for remote shards.

    Every file read lies inside the root (:mod:`~mmfeed.loaders.transport.confine`: relative, no ``..``, locally
    not through a symbolic link out of it; remotely under the same scheme, host and prefix): anything else is an
    :class:`~mmfeed.loaders.transport.confine.UnsafePathError` naming the path, judged once per distinct path.
    """

    def __init__(self, root: str | os.PathLike) -> None:
        self.remote = is_url(root)
        self.root = os.fspath(root).rstrip("/") if self.remote else os.fspath(Path(os.fspath(root)))
        self._sizes: dict[str, int] = {}
        self._confined = Confined(self.root, self.remote)

    def __repr__(self) -> str:
        return f"DatasetFiles({self.root!r})"

    def where(self, relative: str) -> str:
        """The full path or URL of ``relative``, as messages name it."""
        return f"{self.root}/{relative}" if self.remote else os.path.join(self.root, relative)

    def outside(self, relative: str) -> str | None:
        """Why ``relative`` lies outside the dataset (``"it climbs out with '..'"``, ...), or None where it may be
        read (:class:`~mmfeed.loaders.transport.confine.Confined`; no request is made)."""
        return self._confined.outside(relative)

    def local_path(self, relative: str) -> str:
        """The path of ``relative`` on this machine (a local dataset's file), which must lie inside the dataset."""
        if self.remote:
            raise ValueError(f"{self.where(relative)} is not on this machine")
        return self._inside(relative)

    def _inside(self, relative: str) -> str:
        """The full path or URL of ``relative``, which must lie inside the dataset."""
        reason = self._confined.outside(relative)
        if reason is not None:
            raise UnsafePathError(f"{self.root}: {shorten(relative)} lies outside the dataset ({reason}); mmfeed "
                                  "reads only files inside a dataset's directory")
        return self.where(relative)

    def exists(self, relative: str) -> bool:
        """Whether ``relative`` is a file (remote: a missing file is the answer, any other failure retried)."""
        if not self.remote:
            return os.path.isfile(self._inside(relative))
        self._inside(relative)
        try:
            self.size(relative)
            return True
        except (FileNotFoundError, IsADirectoryError):
            return False

    def size(self, relative: str) -> int:
        """Bytes in ``relative`` (remote sizes asked once per process)."""
        if not self.remote:
            return os.path.getsize(self._inside(relative))
        size = self._sizes.get(relative)
        if size is None:
            size = self._sizes[relative] = int(remote_info(self._inside(relative))["size"])
        return size

    def read_bytes(self, relative: str) -> bytes:
        """The whole file ``relative`` (for small metadata files)."""
        path = self._inside(relative)
        if not self.remote:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path} does not exist")
            with open(path, "rb") as f:
                return f.read()
        fs, inner = _filesystem(path)
        return _retried(lambda: fs.cat_file(inner), path)

    def read_json(self, relative: str) -> Any:
        """The JSON file ``relative``; malformed JSON is a ValueError naming the file, and so is one larger or
        nested deeper than metadata may be (:mod:`~mmfeed.loaders.transport.json_limits`: its size is checked
        before it is read, its depth before it is parsed)."""
        if self.exists(relative):
            check_json_size(self.size(relative), self.where(relative))
        data = self.read_bytes(relative)
        check_json(data, self.where(relative))
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{self.where(relative)}: malformed JSON ({err})") from err

    def open(self, relative: str) -> BinaryIO:
        """``relative`` as a seekable binary file (remote: read by range through the block cache)."""
        if not self.remote:
            return open(self._inside(relative), "rb")
        return open_remote(self._inside(relative), self.size(relative))

    def parquet(self, relative: str) -> pq.ParquetFile:
        """The parquet file ``relative``, opened to read its footer, then whichever columns and row groups the
        caller reads (remote: only those bytes are fetched). A local file is read by Arrow's own file, outside
        the GIL: through a Python file object every column chunk of every row group is a Python call under the
        GIL, which at LeRobot's row groups of ten episodes is hundreds of thousands of calls in one file."""
        try:
            if not self.remote:
                return pq.ParquetFile(pa.OSFile(self._inside(relative)))
            return pq.ParquetFile(self.open(relative))
        except pa.ArrowInvalid as err:
            raise ValueError(f"{self.where(relative)}: not a readable parquet file: {err}") from err

    def video(self, relative: str) -> str | RemoteFile:
        """What the decoders open for the video ``relative``: its local path, or a :class:`RemoteFile`."""
        if not self.remote:
            return self._inside(relative)
        return RemoteFile(self._inside(relative), self.size(relative))

    def glob(self, pattern: str) -> list[str] | None:
        """Relative paths of the files matching ``pattern`` (``*`` within one folder), or None where the store
        cannot list folders (plain HTTP servers)."""
        if not self.remote:
            return [Path(p).relative_to(self.root).as_posix() for p in Path(self.root).glob(pattern) if p.is_file()]
        fs, root = _filesystem(self.root)
        if root == self.root:  # http(s): no listing
            return None
        found = _retried(lambda: fs.glob(f"{root}/{pattern}"), f"{self.root}/{pattern}")
        return [p[len(root) + 1:] for p in found]

    def __getstate__(self) -> dict:
        return {"root": self.root, "remote": self.remote}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._sizes = {}
        self._confined = Confined(self.root, self.remote)
