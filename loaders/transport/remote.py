"""Remote shards: byte-range reads through fsspec URLs, with a bounded local cache.

The index says where every member of every episode lies (shard, offset, size), so a worker never streams a whole
remote shard: it asks for the byte ranges the batch needs, one range request per run of missing blocks. Fetched
blocks are kept in an LRU cache with a byte budget, so the members of an episode that consecutive samples
share, and the small members next to each other in a tar (``meta.json``, ``observation.state.npy``,
``action.npy``), cost one request::

    >>> import fsspec
    >>> with fsspec.open("memory://mmfeed-doc/a.bin", "wb") as f:
    ...     _ = f.write(bytes(range(256)) * 64)
    >>> cache = RangeCache(max_bytes=1 << 20, block_size=4096)
    >>> cache.read("memory://mmfeed-doc/a.bin", 5000, 4).hex(), cache.read("memory://mmfeed-doc/a.bin", 4100, 2).hex()
    ('88898a8b', '0405')
    >>> cache.stats.requests, cache.cached_bytes
    (1, 4096)

Any fsspec URL works (``s3://``, ``gs://``, ``az://``, ``https://``, ...; credentials come from the usual fsspec
places, or ``storage_options``). :func:`read_range` uses one cache per process, sized by the environment
variables ``MMFEED_REMOTE_CACHE_BYTES`` (default 256 MiB) and ``MMFEED_REMOTE_BLOCK_BYTES`` (default 1 MiB, a
good request size for object storage; 0 fetches exactly the ranges asked for); DataLoader workers each get their
own, so the bound holds per process.

Object stores and HTTP servers fail now and then. Every range request has its own timeout and is retried with
bounded exponential backoff on connection errors, timeouts and 5xx answers (never on 4xx: a missing file or a
refused credential does not heal), so a flaky server costs time, not the epoch; after the last try the error
names the URL, the byte range and the last cause (:class:`RetryPolicy`; ``MMFEED_REMOTE_RETRIES`` tries,
``MMFEED_REMOTE_TIMEOUT_S`` seconds per request). A host name that does not resolve is not retried either.

A failure that says what the user must change (no credentials, access refused, nothing at the URL, a host name
that does not resolve, the store's fsspec package missing) comes out of :func:`explained` as one line naming the
URL and what to set or install, instead of the storage client's own traceback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

__all__ = ["CacheStats", "RangeCache", "RemoteReadError", "RetryPolicy", "default_cache", "explain", "explained",
           "read_range"]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_CACHE_BYTES = 256 << 20
DEFAULT_BLOCK_BYTES = 1 << 20


@dataclass
class CacheStats:
    """Running counters of a :class:`RangeCache`: range requests sent, bytes they returned, block hits/misses,
    and tries that failed and were retried."""

    requests: int = 0
    fetched_bytes: int = 0
    hits: int = 0
    misses: int = 0
    retries: int = 0


class RemoteReadError(OSError):
    """A range request that failed on every try; the message names the URL, the byte range and the last cause."""


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How a range request survives a flaky server.

    attempts: tries per request, the first included (1: no retry).
    backoff_s: the wait before the second try; it doubles with each further try, up to ``max_backoff_s``.
    timeout_s: seconds one try may take (a server that stops answering fails the try instead of hanging the
        worker); 0 for none.
    """

    attempts: int = 5
    backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be an int >= 1 (tries per request), got {self.attempts!r}")
        for name in ("backoff_s", "max_backoff_s", "timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"RetryPolicy.{name} must be a number of seconds >= 0, got {value!r}")

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The policy ``MMFEED_REMOTE_RETRIES`` and ``MMFEED_REMOTE_TIMEOUT_S`` set (defaults otherwise)."""
        kwargs: dict[str, Any] = {}
        for name, field, kind in (("MMFEED_REMOTE_RETRIES", "attempts", int),
                                  ("MMFEED_REMOTE_TIMEOUT_S", "timeout_s", float)):
            raw = os.environ.get(name)
            if raw:
                try:
                    kwargs[field] = kind(raw)
                except ValueError:
                    raise ValueError(f"{name}={raw!r} must be a "
                                     f"{'whole number of tries' if kind is int else 'number of seconds'}") from None
        return cls(**kwargs)

    def wait(self, failed: int) -> float:
        """Seconds to wait after the ``failed``-th failed try."""
        return min(self.backoff_s * 2 ** (failed - 1), self.max_backoff_s)

    def run(self, attempt: Callable[[], T], what: str, on_retry: Callable[[], None] | None = None) -> T:
        """``attempt()``, tried again after a backoff while it fails in a way that may heal (:func:`retryable`),
        at most ``attempts`` times; ``on_retry`` is called before each further try. A failure that will not heal
        is raised as it is, or as :func:`explain` words it (naming the URL); after the last try a
        :class:`RemoteReadError` names ``what`` (the URL, and the byte range of a range read) and the last cause."""
        for tried in range(1, self.attempts + 1):
            try:
                return attempt()
            except (MemoryError, KeyboardInterrupt):
                raise
            except Exception as err:
                if not retryable(err):
                    better = explain(what.split(" ", 1)[0], err)  # no credentials, refused, missing, no such host
                    if better is None:
                        raise
                    raise better from None
                if tried == self.attempts:
                    raise RemoteReadError(f"{what}: {self.attempts} tries failed; last: {type(err).__name__}: "
                                          f"{err or 'no answer within the timeout'}") from err
                if on_retry is not None:
                    on_retry()
                log.debug("%s: try %d failed (%s: %s); retrying", what, tried, type(err).__name__, err)
                time.sleep(self.wait(tried))
        raise AssertionError("unreachable: attempts >= 1")


def retryable(err: BaseException) -> bool:
    """Whether a failed request may succeed if sent again: timeouts, dropped connections and 5xx (or 408/429)
    answers may; a 4xx answer, a missing file or a refused credential will not."""
    status = getattr(err, "status", None)
    if status is None:
        status = getattr(err, "code", None)
    if isinstance(status, int) and 100 <= status < 600:
        return status >= 500 or status in (408, 429)
    if _unresolved(err) is not None:  # a host name that does not exist will not exist on the next try either
        return False
    if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, ValueError, TypeError)):
        return False
    if isinstance(err, (TimeoutError, asyncio.TimeoutError, ConnectionError, OSError)):
        return True
    names = {c.__name__ for c in type(err).__mro__}
    return bool(names & {"ClientError", "FSTimeoutError", "IncompleteRead", "ProtocolError"})


class RangeCache:
    """Byte ranges of remote files, fetched in blocks of ``block_size`` and kept LRU up to ``max_bytes``.

    max_bytes: the most bytes kept (a read larger than that is served and not kept).
    retry: timeouts and retries of each range request (:class:`RetryPolicy`).
    block_size: fetch granularity; ranges are widened to whole blocks, and contiguous missing blocks of one read
        go in one request. 0 fetches and keeps exactly the ranges read.
    storage_options: keyword arguments for the fsspec filesystem (credentials, endpoint, ...).
    """

    def __init__(self, *, max_bytes: int = DEFAULT_CACHE_BYTES, block_size: int = DEFAULT_BLOCK_BYTES,
                 storage_options: dict[str, Any] | None = None, retry: RetryPolicy | None = None) -> None:
        for name, value, low in (("max_bytes", max_bytes, 0), ("block_size", block_size, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"RangeCache {name} must be an integer >= {low}, got {value!r}")
        self.max_bytes, self.block_size = max_bytes, block_size
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        self.stats = CacheStats()
        self._blocks: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()
        self._filesystems: dict[str, tuple[Any, str]] = {}

    @property
    def cached_bytes(self) -> int:
        """Bytes held now (never above ``max_bytes``)."""
        return self._size

    def read(self, url: str, offset: int, size: int) -> bytes:
        """The ``size`` bytes at ``offset`` of ``url`` (fewer only where the file ends first)."""
        offset, size = int(offset), int(size)
        if offset < 0 or size < 0:
            raise ValueError(f"offset {offset} and size {size} must be >= 0 (reading {url!r})")
        if size == 0:
            return b""
        if not self.block_size:
            return self._exact(url, offset, size)
        first, last = offset // self.block_size, (offset + size - 1) // self.block_size
        parts: dict[int, bytes] = {}
        missing: list[int] = []
        with self._lock:
            for block in range(first, last + 1):
                data = self._get((url, block, 0))
                if data is None:
                    missing.append(block)
                else:
                    parts[block] = data
        for start, stop in _runs(missing):  # one request per run of missing blocks
            data = self._fetch(url, start * self.block_size, (stop + 1) * self.block_size)
            for block in range(start, stop + 1):
                lo = (block - start) * self.block_size
                parts[block] = data[lo : lo + self.block_size]
                with self._lock:
                    self._put((url, block, 0), parts[block])
        joined = b"".join(parts[b] for b in range(first, last + 1))
        lo = offset - first * self.block_size
        return joined[lo : lo + size]

    def clear(self) -> None:
        """Drop every cached byte (the counters stay)."""
        with self._lock:
            self._blocks.clear()
            self._size = 0

    def __getstate__(self) -> dict:
        # a copy (a worker process) starts empty, with its own filesystem handles and lock
        return {"max_bytes": self.max_bytes, "block_size": self.block_size, "storage_options": self.storage_options,
                "retry": self.retry}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    # -- internals -----------------------------------------------------------------------------------------
    def _exact(self, url: str, offset: int, size: int) -> bytes:
        key = (url, offset, size)
        with self._lock:
            data = self._get(key)
        if data is None:
            data = self._fetch(url, offset, offset + size)
            with self._lock:
                self._put(key, data)
        return data

    def _get(self, key: tuple[str, int, int]) -> bytes | None:
        data = self._blocks.get(key)
        if data is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self._blocks.move_to_end(key)
        return data

    def _put(self, key: tuple[str, int, int], data: bytes) -> None:
        if len(data) > self.max_bytes or key in self._blocks:
            return
        self._blocks[key] = data
        self._size += len(data)
        while self._size > self.max_bytes:
            _, old = self._blocks.popitem(last=False)
            self._size -= len(old)

    def _fetch(self, url: str, start: int, end: int) -> bytes:
        """One range request for bytes ``[start, end)`` (the server may stop at the end of the file), each try
        under the policy's timeout, retried while the failure is one that may heal."""
        fs, path = self._filesystem(url)
        policy = self.retry
        timeout = {"timeout": policy.timeout_s} if policy.timeout_s and getattr(fs, "async_impl", False) else {}

        def retried() -> None:
            with self._lock:
                self.stats.retries += 1

        data = policy.run(lambda: fs.cat_file(path, start=start, end=end, **timeout), f"{url} bytes {start}-{end - 1}",
                          on_retry=retried)
        with self._lock:
            self.stats.requests += 1
            self.stats.fetched_bytes += len(data)
        if len(data) > end - start:  # the server ignored the Range header and sent the whole file
            log.warning("%s: the server ignored a range request and sent %d bytes; serve the shards from a server "
                        "that supports HTTP Range requests", url, len(data))
            data = data[start:end]
        return data

    def _filesystem(self, url: str) -> tuple[Any, str]:
        protocol = url.split("://", 1)[0]
        key = f"{os.getpid()}:{protocol}"  # fsspec handles are not shared across a fork
        if key not in self._filesystems:
            import fsspec

            self._filesystems[key] = (fsspec.filesystem(protocol, **self.storage_options), protocol)
        fs, _ = self._filesystems[key]
        return fs, url if protocol in ("http", "https") else fs._strip_protocol(url)


_NO_HOST = {socket.EAI_NONAME} | ({socket.EAI_NODATA} if hasattr(socket, "EAI_NODATA") else set())
"""getaddrinfo's answers for a name that does not exist (a temporary failure, EAI_AGAIN, is retried)."""
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                   "DefaultCredentialsError", "ClientAuthenticationError", "NoAuthTokenError"}
"""Error types of the storage clients (botocore, google-auth, azure, ...) that mean no credentials were found."""


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err``, its causes and contexts, and the errors they wrap (``reason``, ``os_error``), each once."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen or not isinstance(e, BaseException):
            continue
        seen.add(id(e))
        yield e
        todo.extend([e.__cause__, e.__context__, getattr(e, "reason", None), getattr(e, "os_error", None)])


def _unresolved(err: BaseException) -> str | None:
    """The resolver's words when ``err`` comes of a host name that does not exist, else None."""
    for e in _chain(err):
        if isinstance(e, socket.gaierror) and e.errno in _NO_HOST:
            return e.strerror or str(e)
    return None


def _status(err: BaseException) -> int | None:
    """The HTTP status a failed request was answered with, where any error of the chain carries one."""
    for e in _chain(err):
        for name in ("status", "code", "status_code"):
            value = getattr(e, name, None)
            if isinstance(value, int) and 100 <= value < 600:
                return value
        response = getattr(e, "response", None)  # botocore's ClientError
        if isinstance(response, dict):
            value = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(value, int):
                return value
    return None


def _credentials_hint(protocol: str, verb: str = "set") -> str:
    """What to set (or check: ``verb``) so that the store of ``protocol`` finds credentials that may read."""
    if protocol in ("s3", "s3a"):
        endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
        where = f" (the endpoint is AWS_ENDPOINT_URL={endpoint})" if endpoint else \
            " (and AWS_ENDPOINT_URL for an S3-compatible store other than AWS)"
        return f"{verb} AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE{where}"
    if protocol in ("gs", "gcs"):
        return (f"{verb} GOOGLE_APPLICATION_CREDENTIALS (a service account key file), or run `gcloud auth "
                "application-default login`")
    if protocol in ("az", "abfs", "abfss", "adl"):
        return f"{verb} AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY"
    if protocol in ("http", "https"):
        return "mmfeed sends no credentials over HTTP: serve the files to any client"
    return f"{verb} the credentials the {protocol}:// store's fsspec filesystem reads"


def explain(url: str, err: BaseException) -> BaseException | None:
    """A one-line error of the same kind naming ``url`` and what to set or install, for a failure to reach what
    ``url`` names (no credentials, 401/403, 404, a host name that does not resolve, the store's fsspec package
    missing, a protocol fsspec does not know); None for any other failure (raise it as it is)."""
    if getattr(err, "explained", False):
        return None  # worded already, naming the file's URL
    better = _explain(url, err)
    if better is not None:
        better.explained = True
    return better


def _explain(url: str, err: BaseException) -> BaseException | None:
    protocol = url.split("://", 1)[0] if "://" in url else "file"
    cause = " ".join(str(err).split())
    if isinstance(err, ImportError):
        package = _package_of(protocol)
        if package is None:
            return None
        return ImportError(f"{url}: reading {protocol}:// URLs needs the package {package}, which is not installed "
                           f"(pip install {package})")
    if isinstance(err, ValueError) and cause.startswith("Protocol not known"):
        return ValueError(f"{url}: fsspec knows no protocol {protocol!r}; check the URL (s3://, gs://, https://, "
                          "...) or install the package that reads it")
    names = {type(e).__name__ for e in _chain(err)}
    if names & _NO_CREDENTIALS:
        return PermissionError(f"{url}: no credentials for {protocol}:// were found; {_credentials_hint(protocol)}")
    host = _unresolved(err)
    if host is not None:
        name = urllib.parse.urlsplit(url).hostname if protocol in ("http", "https") else None
        endpoint = os.environ.get("AWS_ENDPOINT_URL") if protocol in ("s3", "s3a") else None
        if endpoint:
            name, what = urllib.parse.urlsplit(endpoint).hostname, f"the host of AWS_ENDPOINT_URL={endpoint}"
        else:
            what = "the host name in the URL" if name else "the store's host name"
        return OSError(f"{url}: cannot resolve host {name or '?'} ({host}); check {what}")
    if isinstance(err, RemoteReadError):
        return None  # a flaky store that failed every try: its message names the URL, the range and the cause
    status = _status(err)
    if status in (401, 403) or isinstance(err, PermissionError):
        why = "the server refuses it" if protocol in ("http", "https") else \
            "the credentials are refused or may not read it"
        return PermissionError(f"{url}: access denied ({status or cause or 'forbidden'}): {why}; "
                               f"{_credentials_hint(protocol, 'check')}")
    if status in (404, 410) or isinstance(err, FileNotFoundError):
        bucket = next((e for e in _chain(err) if type(e).__name__ == "BucketNotFoundError"), None)
        if bucket is not None:  # huggingface_hub's filesystem says only the path
            return FileNotFoundError(f"{url}: the Hub has no bucket {getattr(bucket, 'bucket_id', None) or '?'} "
                                     "(if it is private: log in with `hf auth login` or set HF_TOKEN)")
        if url in cause:
            return None  # it names the file that is missing already
        return FileNotFoundError(f"{url}: not found ({cause or status}); check the URL"
                                 + (" (bucket and prefix)" if protocol in ("s3", "s3a", "gs", "gcs") else ""))
    return None


def _package_of(protocol: str) -> str | None:
    """The package fsspec names for ``protocol``'s filesystem (``gcsfs`` for gs), or None."""
    try:
        from fsspec.registry import known_implementations
    except ImportError:
        return "fsspec"
    known = known_implementations.get(protocol)
    return known["class"].split(".", 1)[0] if known else None


@contextmanager
def explained(url: str) -> Iterator[None]:
    """Run the block; a failure to reach ``url`` that :func:`explain` knows is raised as its one-line error (the
    storage client's error stays reachable as the new error's ``__context__``)."""
    try:
        yield
    except Exception as err:
        better = explain(url, err)
        if better is None:
            raise
        raise better from None


def _runs(blocks: list[int]) -> list[tuple[int, int]]:
    """Sorted block numbers as inclusive runs of consecutive numbers."""
    runs: list[tuple[int, int]] = []
    for block in blocks:
        if runs and block == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], block)
        else:
            runs.append((block, block))
    return runs


# One cache per process and setting (a process-wide resource, like a connection pool).
_DEFAULT: dict[tuple[int, int, int, RetryPolicy], RangeCache] = {}


def default_cache() -> RangeCache:
    """This process's cache, sized from ``MMFEED_REMOTE_CACHE_BYTES`` / ``MMFEED_REMOTE_BLOCK_BYTES`` and retrying
    by ``MMFEED_REMOTE_RETRIES`` / ``MMFEED_REMOTE_TIMEOUT_S`` (read at each call: changed settings give a fresh
    cache; a forked worker drops its parent's)."""
    key = (os.getpid(), _env_bytes("MMFEED_REMOTE_CACHE_BYTES", DEFAULT_CACHE_BYTES),
           _env_bytes("MMFEED_REMOTE_BLOCK_BYTES", DEFAULT_BLOCK_BYTES), RetryPolicy.from_env())
    if key not in _DEFAULT:
        _DEFAULT.clear()
        _DEFAULT[key] = RangeCache(max_bytes=key[1], block_size=key[2], retry=key[3])
    return _DEFAULT[key]


def reset_default_cache() -> None:
    """Drop this process's cache: its blocks and the filesystems it keeps, which hold the endpoint and credentials
    they were made with (after ``AWS_ENDPOINT_URL`` or credentials change in a running process)."""
    _DEFAULT.clear()


def read_range(url: str, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` of the fsspec ``url``, through this process's :func:`default_cache`."""
    return default_cache().read(url, offset, size)


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(float(raw))
    except ValueError:
        raise ValueError(f"{name}={raw!r} must be a number of bytes, e.g. 268435456") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r} must be >= 0")
    return value
