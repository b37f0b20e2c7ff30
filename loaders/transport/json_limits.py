"""Bounds on the metadata JSON a dataset brings (LeRobot's ``info.json`` and ``stats.json``, a shard's
``meta.json`` members, an index's schema metadata): checked before the JSON is read or parsed, so that a file
written to exhaust memory or the parser's stack is refused in one line naming it.

- :data:`MAX_JSON_BYTES`: its size, known before reading (a file's size, a tar member's header): real metadata
  is kilobytes, a 60 MB ``info.json`` took 1.8 GB to parse.
- :data:`MAX_JSON_DEPTH`: how deeply its arrays and objects nest, found by a scan of the bytes (vectorized, no
  recursion) before ``json.loads``, whose recursion a 200,000-deep document exhausts.

>>> check_json(b'{"fps": 30, "features": {"a": {"shape": [2]}}}', "info.json")
>>> check_json(b"[" * 200 + b"]" * 200, "info.json")
Traceback (most recent call last):
...
ValueError: info.json: JSON nested 200 levels deep, more than the 100 a metadata file may have; mmfeed does not parse it
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_JSON_BYTES", "MAX_JSON_DEPTH", "check_json", "check_json_size", "json_depth"]

MAX_JSON_BYTES = 16 * 2**20
"""The largest metadata JSON file (or tar member) read: 16 MiB."""

MAX_JSON_DEPTH = 100
"""The deepest nesting of arrays and objects a metadata JSON document may have (LeRobot's stats nest 5 deep)."""

_OPEN, _CLOSE = (0x5B, 0x7B), (0x5D, 0x7D)  # [ {  and  ] }
_QUOTE, _BACKSLASH = 0x22, 0x5C


def check_json_size(size: int, where: str, limit: int = MAX_JSON_BYTES) -> None:
    """Raise ValueError naming ``where`` when a JSON file of ``size`` bytes is larger than ``limit``."""
    if size > limit:
        raise ValueError(f"{where}: {size} bytes of JSON, more than the {limit / 2**20:g} MiB a metadata file may "
                         "have; mmfeed does not read it")


def check_json(data: bytes | bytearray | memoryview | str, where: str, *, max_bytes: int = MAX_JSON_BYTES,
               max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ValueError naming ``where`` when the JSON ``data`` is larger than ``max_bytes`` or nests arrays and
    objects deeper than ``max_depth``; call it before ``json.loads``."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    check_json_size(memoryview(raw).nbytes, where, max_bytes)
    depth = json_depth(raw)
    if depth > max_depth:
        raise ValueError(f"{where}: JSON nested {depth} levels deep, more than the {max_depth} a metadata file may "
                         "have; mmfeed does not parse it")


def json_depth(data: bytes | bytearray | memoryview) -> int:
    """How deeply arrays and objects nest in the JSON ``data`` (0 for a scalar), brackets inside strings not
    counted; a scan with numpy over the bytes (no recursion, memory a few times the size of ``data``)."""
    a = np.frombuffer(data, np.uint8)
    brackets = np.flatnonzero((a == _OPEN[0]) | (a == _OPEN[1]) | (a == _CLOSE[0]) | (a == _CLOSE[1]))
    if not brackets.size:
        return 0
    quotes = np.flatnonzero(a == _QUOTE)
    if quotes.size:
        slashes = np.flatnonzero(a == _BACKSLASH)
        if slashes.size:  # a quote right after an odd run of backslashes is escaped: part of its string
            breaks = np.flatnonzero(np.diff(slashes) != 1)
            ends, starts = slashes[np.r_[breaks, len(slashes) - 1]], slashes[np.r_[0, breaks + 1]]
            run = np.minimum(np.searchsorted(ends, quotes - 1), len(ends) - 1)
            escaped = (ends[run] == quotes - 1) & ((ends[run] - starts[run]) % 2 == 0)
            quotes = quotes[~escaped]
        brackets = brackets[np.searchsorted(quotes, brackets) % 2 == 0]  # an even number of quotes before: outside
        if not brackets.size:
            return 0
    opening = (a[brackets] == _OPEN[0]) | (a[brackets] == _OPEN[1])
    return max(int(np.cumsum(np.where(opening, 1, -1), dtype=np.int64).max()), 0)
