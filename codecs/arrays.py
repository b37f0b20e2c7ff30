"""Arrays from bytes and parquet columns without extra copies, checked against what the metadata promises.

- :func:`load_npy` parses the ``.npy`` header itself and returns ``np.frombuffer`` over the payload: a read-only
  view of the caller's bytes (pass ``copy=True`` for a writable array of its own). The header, a Python dict
  literal, is read by a small parser of exactly the literals numpy writes (strings, integers, booleans, tuples,
  lists, one dict), never by ``ast`` or ``compile``: those are not safe when several threads parse at once
  (``worker_mode="thread"`` reads arrays in threads), and they would spend unbounded time and memory on a hostile
  header. Headers are capped at numpy's own limit (:data:`MAX_HEADER_BYTES`), and parsed once per distinct header.
  The payload must be exactly the bytes the header promises: shorter is truncated, longer (trailing bytes) is
  refused too. :func:`npy_header` reads the header alone, to check a member's size before reading it.
- :func:`load_npz` reads every member of an ``.npz``; stored (uncompressed, ``np.savez``) members are views of the
  caller's bytes, compressed ones are inflated once.
- :func:`column_to_numpy` turns a pyarrow column of fixed-size lists (or lists that all have one length, nested
  to any depth) into an ``[N, ...]`` array by reshaping the flat values buffer, a zero-copy view when the column
  is a single chunk without nulls.

>>> import io, numpy as np
>>> buf = io.BytesIO(); np.save(buf, np.arange(6, dtype=np.float32).reshape(2, 3))
>>> load_npy(buf.getvalue(), key="ep0.observation.state.npy", expect_dtype=np.float32, expect_shape=(None, 3)).shape
(2, 3)
"""

from __future__ import annotations

import functools
import io
import math
import re
import struct
import zipfile
from typing import Any, Sequence

import numpy as np

from mmfeed.codecs.errors import DecodeError

__all__ = ["MAX_HEADER_BYTES", "check_array", "column_to_numpy", "check_npy_size", "load_npy", "load_npz",
           "npy_header"]

_MAGIC = b"\x93NUMPY"

#: the longest ``.npy`` header read, numpy's own default (``np.load(max_header_size=10000)``)
MAX_HEADER_BYTES = 10_000


def check_array(
    array: np.ndarray,
    *,
    key: str = "array",
    expect_dtype: Any = None,
    expect_shape: Sequence[int | None] | None = None,
) -> np.ndarray:
    """Return ``array`` when its dtype and shape are as promised, else raise :class:`DecodeError` naming ``key``.

    ``expect_shape`` entries that are None match any size (``(None, 7)``: any number of rows of 7).
    """
    if expect_dtype is not None and array.dtype != np.dtype(expect_dtype):
        raise DecodeError(f"{key}: dtype is {array.dtype}, expected {np.dtype(expect_dtype)}", path=key)
    if expect_shape is not None:
        want = tuple(expect_shape)
        ok = len(want) == array.ndim and all(w is None or w == s for w, s in zip(want, array.shape))
        if not ok:
            shown = "(" + ", ".join("*" if w is None else str(w) for w in want) + ("," if len(want) == 1 else "") + ")"
            raise DecodeError(f"{key}: shape is {array.shape}, expected {shown} (* = any size)", path=key)
    return array


def load_npy(
    data: bytes | bytearray | memoryview,
    *,
    key: str = "npy",
    expect_dtype: Any = None,
    expect_shape: Sequence[int | None] | None = None,
    copy: bool = False,
) -> np.ndarray:
    """The array in ``.npy`` bytes, as a view of ``data`` (read-only if ``data`` is) unless ``copy``.

    Object arrays (which would need pickle) are refused. Errors name ``key``.
    """
    view = memoryview(data)
    if not view.c_contiguous:
        raise DecodeError(f"{key}: the .npy buffer is not contiguous", path=key)
    view = view.cast("B")
    dtype, shape, fortran, offset = npy_header(view, key=key)
    count = math.prod(shape)
    need = count * dtype.itemsize
    if len(view) - offset < need:
        raise DecodeError(
            f"{key}: truncated .npy: header promises {shape} {dtype} ({need} bytes) but {len(view) - offset} follow",
            path=key,
        )
    if len(view) - offset > need:
        raise DecodeError(
            f"{key}: {len(view) - offset - need} trailing bytes after the {shape} {dtype} array ({need} bytes) the "
            ".npy header promises: a .npy file holds its array and nothing after it",
            path=key,
        )
    array = np.frombuffer(view, dtype=dtype, count=count, offset=offset)
    array = array.reshape(shape[::-1]).T if fortran else array.reshape(shape)
    if copy:
        array = np.array(array, order="C")
    return check_array(array, key=key, expect_dtype=expect_dtype, expect_shape=expect_shape)


def npy_header(data: bytes | bytearray | memoryview, *, key: str = "npy"
               ) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """``(dtype, shape, fortran_order, data offset)`` of ``.npy`` bytes, from their first bytes alone (at most
    ``12 + MAX_HEADER_BYTES`` are looked at: enough to check a member's size before reading the rest of it).
    Object dtypes are refused; errors are :class:`DecodeError` naming ``key``.

    >>> buf = io.BytesIO(); np.save(buf, np.zeros((4, 3), np.float32))
    >>> npy_header(buf.getvalue()[:128], key="a.npy")
    (dtype('float32'), (4, 3), False, 128)
    """
    view = memoryview(data).cast("B")
    if bytes(view[:6]) != _MAGIC or len(view) < 10:
        raise DecodeError(f"{key}: not .npy bytes (the file does not start with the NUMPY magic)", path=key)
    major = view[6]
    if major == 1:
        (header_len,) = struct.unpack("<H", view[8:10])
        start = 10
    elif major in (2, 3):
        if len(view) < 12:
            raise DecodeError(f"{key}: truncated .npy: {len(view)} bytes end inside the header", path=key)
        (header_len,) = struct.unpack("<I", view[8:12])
        start = 12
    else:
        raise DecodeError(f"{key}: unsupported .npy format version {major}", path=key)
    if header_len > MAX_HEADER_BYTES:
        raise DecodeError(f"{key}: .npy header of {header_len} bytes is longer than {MAX_HEADER_BYTES}, numpy's limit",
                          path=key)
    raw = bytes(view[start : start + header_len])
    if len(raw) < header_len:
        raise DecodeError(f"{key}: truncated .npy: the header needs {header_len} bytes, {len(raw)} follow", path=key)
    try:
        dtype, shape, fortran = _header(raw, "utf-8" if major == 3 else "latin1")
    except (ValueError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise DecodeError(f"{key}: malformed .npy header {raw[:80]!r}: {_short(exc)}", path=key) from exc
    if dtype.hasobject:
        raise DecodeError(f"{key}: object arrays need pickle, which mmfeed never loads; save a numeric array", path=key)
    return dtype, shape, fortran, start + header_len


def check_npy_size(head: bytes | bytearray | memoryview, size: int, *, key: str = "npy"
                   ) -> tuple[np.dtype, tuple[int, ...], bool, int]:
    """:func:`npy_header` of a ``.npy`` file (a tar member, say) of ``size`` bytes whose first bytes are ``head``
    (``12 + MAX_HEADER_BYTES`` of them, or all), checked to be no longer than the header and the array it
    promises, before the rest is read: a :class:`DecodeError` naming ``key`` for trailing bytes (a valid array
    followed by gigabytes of anything). A shorter file costs nothing to read; :func:`load_npy` calls it
    truncated."""
    dtype, shape, fortran, offset = npy_header(head, key=key)
    need = offset + math.prod(shape) * dtype.itemsize
    if size > need:
        shown = f"{dtype} {list(shape[:8])}{'...' if len(shape) > 8 else ''}"
        raise DecodeError(f"{key}: {size - need} trailing bytes: the .npy holds {size} bytes but its header "
                          f"promises {need} ({shown}); a .npy file holds its array and nothing after it", path=key)
    return dtype, shape, fortran, offset


@functools.lru_cache(maxsize=1024)
def _header(raw: bytes, encoding: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    """``(dtype, shape, fortran_order)`` of a ``.npy`` header; ValueError/TypeError/KeyError when malformed."""
    header = _Literal(raw.decode(encoding)).read()
    if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
        raise ValueError("the header must be a dict of exactly 'descr', 'fortran_order' and 'shape'")
    shape, fortran = header["shape"], header["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(s) is int and s >= 0 for s in shape):
        raise ValueError("'shape' must be a tuple of non-negative integers")
    if len(shape) > 64:
        raise ValueError(f"'shape' has {len(shape)} dimensions (at most 64)")
    if not isinstance(fortran, bool):
        raise ValueError("'fortran_order' must be True or False")
    count = math.prod(shape)  # Python integers: an overflowing shape is refused here, not wrapped by int64
    if count > 2**62:
        raise ValueError(f"'shape' holds {count:.3g} elements")
    return np.lib.format.descr_to_dtype(header["descr"]), shape, fortran


def _short(exc: BaseException, limit: int = 200) -> str:
    text = str(exc)
    return text if len(text) <= limit else text[:limit] + "..."


class _Literal:
    """A reader of the Python literals a ``.npy`` header holds: ``{'descr': '<f4', 'fortran_order': False,
    'shape': (2, 3), }``, structured ``descr`` lists of tuples included. Nesting is bounded (``MAX_DEPTH``)."""

    MAX_DEPTH = 32
    _TOKEN = re.compile(r"""\s*(?:(?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")"""
                        r"""|(?P<int>-?\d+)(?:L)?|(?P<name>True|False|None)|(?P<punct>[{}()\[\]:,]))""")
    _ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "0": "\0"}

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def read(self) -> object:
        value = self._value(0)
        if self.text[self.pos :].strip():
            raise ValueError(f"unexpected text at offset {self.pos}")
        return value

    def _token(self) -> tuple[str, str]:
        match = self._TOKEN.match(self.text, self.pos)
        if match is None:
            raise ValueError(f"unexpected text at offset {self.pos}")
        self.pos = match.end()
        kind = match.lastgroup
        return kind, match.group(kind)

    def _peek(self) -> str:
        rest = self.text[self.pos :].lstrip()
        return rest[:1]

    def _value(self, depth: int) -> object:
        if depth > self.MAX_DEPTH:
            raise ValueError(f"nested deeper than {self.MAX_DEPTH}")
        kind, token = self._token()
        if kind == "str":
            return re.sub(r"\\(.)", lambda m: self._ESCAPES.get(m.group(1), "\\" + m.group(1)), token[1:-1])
        if kind == "int":
            return int(token)
        if kind == "name":
            return {"True": True, "False": False, "None": None}[token]
        if token == "{":
            out = {}
            for key in self._items("}", depth):
                if not isinstance(key, str):
                    raise ValueError("dict keys must be strings")
                if self._token() != ("punct", ":"):
                    raise ValueError(f"expected ':' at offset {self.pos}")
                out[key] = self._value(depth + 1)
            return out
        if token in "([":
            items = list(self._items(")" if token == "(" else "]", depth))
            return tuple(items) if token == "(" else items
        raise ValueError(f"unexpected {token!r} at offset {self.pos}")

    def _items(self, close: str, depth: int):
        """Yield the values of a comma-separated sequence up to ``close`` (a trailing comma allowed); a dict's
        caller reads each key's ':' and value itself."""
        while True:
            if self._peek() == close:
                self._token()
                return
            yield self._value(depth + 1)
            _, token = self._token()
            if token == close:
                return
            if token != ",":
                raise ValueError(f"expected ',' or {close!r} at offset {self.pos}")


def load_npz(data: bytes | bytearray | memoryview, *, key: str = "npz") -> dict[str, np.ndarray]:
    """Every array in ``.npz`` bytes, by member name without ``.npy``; stored members are views of ``data``."""
    view = memoryview(data).cast("B")
    try:
        archive = zipfile.ZipFile(io.BytesIO(view))
    except zipfile.BadZipFile as exc:
        raise DecodeError(f"{key}: not .npz bytes: {exc}", path=key) from exc
    out: dict[str, np.ndarray] = {}
    with archive:
        for member in archive.infolist():
            name = member.filename[:-4] if member.filename.endswith(".npy") else member.filename
            where = f"{key}[{name}]"
            if member.compress_type == zipfile.ZIP_STORED:
                local = view[member.header_offset : member.header_offset + 30]
                if len(local) < 30 or bytes(local[:4]) != b"PK\x03\x04":
                    raise DecodeError(f"{where}: corrupt zip local header", path=where)
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                begin = member.header_offset + 30 + name_len + extra_len
                payload = view[begin : begin + member.file_size]
            else:
                try:
                    payload = archive.read(member)
                except (zipfile.BadZipFile, OSError, EOFError) as exc:
                    raise DecodeError(f"{where}: cannot inflate member: {exc}", path=where) from exc
            out[name] = load_npy(payload, key=where)
    return out


def column_to_numpy(
    column: Any,
    *,
    key: str = "column",
    expect_dtype: Any = None,
    expect_shape: Sequence[int | None] | None = None,
) -> np.ndarray:
    """A pyarrow column (Array or ChunkedArray) as an ``[N, ...]`` numpy array.

    Fixed-size-list columns, and list columns whose rows all have one length, become extra dimensions (nested
    lists give more). The result is a zero-copy view when the column is one chunk without nulls and of a
    numeric type; several chunks are combined first (one copy). Nulls, ragged lists and unmet ``expect_dtype`` /
    ``expect_shape`` raise :class:`DecodeError` naming ``key``.
    """
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if not isinstance(column, pa.Array):
        raise TypeError(f"{key}: expected a pyarrow Array or ChunkedArray, got {type(column).__name__}")
    array = _to_numpy(column, key)
    return check_array(array, key=key, expect_dtype=expect_dtype, expect_shape=expect_shape)


def _to_numpy(arr, key: str) -> np.ndarray:
    import pyarrow as pa

    if arr.null_count:
        raise DecodeError(f"{key}: holds {arr.null_count} null values; fill or drop them first", path=key)
    n = len(arr)
    if pa.types.is_fixed_size_list(arr.type):
        inner = _to_numpy(arr.flatten(), key)
        return inner.reshape((n, arr.type.list_size) + inner.shape[1:])
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        lengths = arr.value_lengths().to_numpy(zero_copy_only=False)
        if n and (lengths != lengths[0]).any():
            raise DecodeError(
                f"{key}: rows hold lists of different lengths ({int(lengths.min())}..{int(lengths.max())}); "
                "a 2-D array needs one length per column (store it as a fixed_size_list)",
                path=key,
            )
        inner = _to_numpy(arr.flatten(), key)
        width = int(lengths[0]) if n else 0
        return inner.reshape((n, width) + inner.shape[1:])
    try:
        return arr.to_numpy(zero_copy_only=True)
    except (pa.ArrowInvalid, NotImplementedError):
        return arr.to_numpy(zero_copy_only=False)
