"""A ``tf.train.Example`` decoder of its own: protobuf wire format to numpy, without TensorFlow or protobuf.

The message is small and fixed (``tensorflow/core/example/{example,feature}.proto``)::

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }        // entries: { string key = 1; Feature value = 2; }
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }  FloatList { repeated float value = 1; }
    Int64List { repeated int64 value = 1; }

:func:`parse_example` walks the map entries in Python (an RLDS record has a few dozen keys) and decodes each
list with numpy: packed floats are one ``frombuffer``, unpacked ones (tag byte then 4 bytes each) a strided view,
int64 varints, packed or not, one vectorized pass; bytes values are memoryviews of the record (no copy). Unknown
fields are skipped as protobuf does, and a key given twice keeps its last value (protobuf's map rule).

    >>> record = bytes.fromhex("0a300a110a0162120c120a0a080000c03f000010c00a1b0a016112161a140a1201fbffffffffffffffff01"
    ...                        "80808080802000")  # tf.train.Example: a = [1, -5, 2**40, 0], b = [1.5, -2.25]
    >>> parsed = parse_example(record)
    >>> parsed["a"].values.tolist(), parsed["b"].values.tolist()
    ([1, -5, 1099511627776, 0], [1.5, -2.25])
"""

from __future__ import annotations

import numpy as np

__all__ = ["ExampleError", "Values", "bytes_spans", "parse_example", "parse_feature"]

BYTES, FLOAT, INT64 = "bytes", "float", "int64"


class ExampleError(ValueError):
    """A record that is no well-formed ``tf.train.Example``."""


class Values:
    """One key's list: ``kind`` ("bytes", "float" or "int64") and ``values`` (a list of memoryviews, or a numpy
    float32 or int64 array). A bytes list is split into its values when they are first asked for (a record holds a
    picture per step of every camera; a sample wants a few of them): :class:`ExampleError` then, where it is
    malformed."""

    __slots__ = ("kind", "_values", "_region")

    def __init__(self, kind: str, values: list | np.ndarray | None = None, region: tuple | None = None) -> None:
        self.kind, self._values, self._region = kind, values, region

    @property
    def values(self) -> list | np.ndarray:
        if self._values is None:
            buf, mv, start, stop = self._region
            self._values = [mv[x:y] for n, w, x, y in _fields(buf, start, stop) if n == 1 and w == 2]
        return self._values

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"Values({self.kind!r}, {len(self)} values)"


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ExampleError("a varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ExampleError("a varint longer than 10 bytes")


def _skip(buf: bytes, pos: int, end: int, wire: int) -> int:
    if wire == 0:
        return _varint(buf, pos, end)[1]
    if wire == 1:
        pos += 8
    elif wire == 2:
        n, pos = _varint(buf, pos, end)
        pos += n
    elif wire == 5:
        pos += 4
    else:
        raise ExampleError(f"wire type {wire} (groups or an invalid type) in a tf.train.Example")
    if pos > end:
        raise ExampleError("a field runs past the end of its message")
    return pos


def _fields(buf: bytes, pos: int, end: int):
    """``(field number, wire type, start, stop)`` of each field in ``buf[pos:end]`` (for wire type 2, the
    payload; else the value's bytes)."""
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                raise ExampleError(f"field {number} holds {n} bytes, past the end of its message")
            yield number, wire, pos, pos + n
            pos += n
        else:
            start = pos
            pos = _skip(buf, pos, end, wire)
            yield number, wire, start, pos


def varints(data: np.ndarray) -> np.ndarray:
    """The unsigned varints packed back to back in ``data`` (uint8), as uint64, in one vectorized pass."""
    if not data.size:
        return np.zeros(0, np.uint64)
    last = data < 0x80
    if last.all():
        return data.astype(np.uint64)
    ends = np.flatnonzero(last)
    if not ends.size or ends[-1] != data.size - 1:
        raise ExampleError("packed varints end inside a value")
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    widths = ends - starts + 1
    if widths.max() > 10:
        raise ExampleError("a varint longer than 10 bytes")
    position = np.arange(data.size, dtype=np.int64) - np.repeat(starts, widths)
    parts = (data & 0x7F).astype(np.uint64) << (7 * position).astype(np.uint64)
    return np.add.reduceat(parts, starts)


def _floats(buf: bytes, view: np.ndarray, start: int, stop: int) -> np.ndarray:
    """FloatList's values: packed (one or more runs) or one fixed32 field each."""
    runs = []
    unpacked_at = None
    for number, wire, a, b in _fields(buf, start, stop):
        if number != 1:
            continue
        if wire == 2:
            if (b - a) % 4:
                raise ExampleError(f"a packed float list of {b - a} bytes (not a multiple of 4)")
            runs.append(view[a:b].view("<f4"))
        elif wire == 5:
            unpacked_at = a - 1
            break
        else:
            raise ExampleError(f"a float list's value has wire type {wire}")
    if unpacked_at is not None:  # every value its own field: tag 0x0d then 4 bytes, usually back to back
        region = view[unpacked_at:stop]
        if region.size % 5 == 0 and (region[::5] == 0x0D).all():
            runs.append(np.ascontiguousarray(region.reshape(-1, 5)[:, 1:]).view("<f4").reshape(-1))
        else:  # mixed or with unknown fields between: field by field
            runs = [view[a:b].view("<f4") if wire == 2 else view[a:a + 4].view("<f4")
                    for number, wire, a, b in _fields(buf, start, stop) if number == 1]
    if not runs:
        return np.zeros(0, np.float32)
    return (runs[0] if len(runs) == 1 else np.concatenate(runs)).astype(np.float32)


def _ints(buf: bytes, view: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Int64List's values: packed varints, or one varint field each."""
    runs = []
    unpacked = False
    for number, wire, a, b in _fields(buf, start, stop):
        if number != 1:
            continue
        if wire == 2:
            runs.append(varints(view[a:b]))
        elif wire == 0:
            unpacked = True
            break
        else:
            raise ExampleError(f"an int64 list's value has wire type {wire}")
    if unpacked:  # tag 0x08 then the varint, per value: every other varint of the region
        region = varints(view[start:stop])
        if region.size % 2 == 0 and (region[::2] == 0x08).all():
            runs = [region[1::2]]
        else:
            runs = []
            for number, wire, a, b in _fields(buf, start, stop):
                if number == 1:
                    runs.append(varints(view[a:b]) if wire == 2 else np.array([_varint(buf, a, b)[0]], np.uint64))
    if not runs:
        return np.zeros(0, np.int64)
    return (runs[0] if len(runs) == 1 else np.concatenate(runs)).view(np.int64)


def _feature(buf: bytes, view: np.ndarray, mv: memoryview, start: int, stop: int) -> Values:
    kind = None
    for number, wire, a, b in _fields(buf, start, stop):
        if wire != 2 or number not in (1, 2, 3):
            continue
        if number == 1:
            kind = Values(BYTES, region=(buf, mv, a, b))
        elif number == 2:
            kind = Values(FLOAT, _floats(buf, view, a, b))
        else:
            kind = Values(INT64, _ints(buf, view, a, b))
    return kind if kind is not None else Values(BYTES, [])  # an empty Feature: no kind set


def parse_feature(data: bytes) -> Values:
    """One serialized ``Feature`` message (a key's value, read alone by its byte range) as :class:`Values`."""
    view = np.frombuffer(data, np.uint8)
    return _feature(data, view, memoryview(data), 0, len(data))


def bytes_spans(values: Values) -> list[tuple[int, int]]:
    """Where each value of a bytes list lies in the record it was parsed from: ``(start, stop)`` byte offsets, in
    order (a picture's bytes, to be read alone later)."""
    if values.kind != BYTES or values._region is None:
        raise ValueError("bytes_spans: a bytes list as parse_example made it")
    buf, _, start, stop = values._region
    return [(x, y) for n, w, x, y in _fields(buf, start, stop) if n == 1 and w == 2]


def parse_example(record: bytes | bytearray | memoryview, start: int = 0, end: int | None = None,
                  regions: dict[str, tuple[int, int]] | None = None) -> dict[str, Values]:
    """The keys of one serialized ``tf.train.Example`` (``record[start:end]``, read in place: a framed record's
    payload needs no copy) and their lists; :class:`ExampleError` when it is not one. With ``regions``, each
    key's ``Feature`` message is recorded there as its ``(start, stop)`` byte offsets in ``record``
    (:func:`parse_feature` decodes it alone)."""
    buf = record if isinstance(record, bytes) else bytes(record)
    end = len(buf) if end is None else end
    if not 0 <= start <= end <= len(buf):
        raise ExampleError(f"bytes {start}..{end} of a record of {len(buf)}")
    view = np.frombuffer(buf, np.uint8)
    mv = memoryview(buf)
    out: dict[str, Values] = {}
    try:
        for number, wire, a, b in _fields(buf, start, end):
            if number != 1 or wire != 2:
                continue
            for n, w, c, d in _fields(buf, a, b):
                if n != 1 or w != 2:
                    continue
                key, value = None, None
                for field, kind, x, y in _fields(buf, c, d):
                    if field == 1 and kind == 2:
                        key = buf[x:y].decode("utf-8")
                    elif field == 2 and kind == 2:
                        value = (x, y)
                if key is None:
                    raise ExampleError("a feature map entry without a key")
                out[key] = _feature(buf, view, mv, *value) if value is not None else Values(BYTES, [])
                if regions is not None:
                    regions[key] = value if value is not None else (d, d)
    except UnicodeDecodeError as err:
        raise ExampleError(f"a feature key is not UTF-8 ({err})") from err
    return out
