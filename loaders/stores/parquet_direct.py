"""Flat numeric columns and lists of texts of a local parquet file, read straight from its bytes.

LeRobot flushes meta/episodes every ten episodes, so a million episodes are 100k row groups whose footers hold
tens of MB. Arrow's reader first builds the whole footer as C++ objects (every column of every row group, the
statistics included: about 0.6 s a 25k-row-group file here), then reads each column chunk through a reader of
its own (about 8 µs a chunk, 0.2 s a column of such a file). :func:`read_direct` walks the footer's Thrift
encoding once in numba, keeping only where the asked columns' chunks lie, and decodes those chunks' pages in the
same compiled loop: the parquet that pyarrow writes (what LeRobot and ``datasets`` write), which is

- pages v1 and v2, PLAIN or dictionary encoded (``PLAIN_DICTIONARY``, ``RLE_DICTIONARY``), levels in the RLE /
  bit-packed hybrid, SNAPPY compressed or not;
- flat INT32 / INT64 (signed) / FLOAT / DOUBLE columns without nulls, and lists of texts (``list<string>``,
  three-level as the spec writes them).

Anything else (another codec, a null, an unsigned or timestamp column, encryption, a column chunk in another
file, a footer or page that does not parse) makes :func:`read_direct` return None, and the caller reads the
file with pyarrow, whose errors name what is wrong. Every read of the file's bytes is bounds-checked, a snappy
page may not claim more than its bytes can expand to, a v2 page's null count must be what its levels say, and
the rows a footer claims are bounded by the file's size, so a broken file costs at most one pass over its bytes.

    >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> path = os.path.join(tempfile.mkdtemp(), "t.parquet")
    >>> pq.write_table(pa.table({"n": [3, 1, 2], "t": [["a"], [], ["b", "a"]]}), path, row_group_size=2)
    >>> read = read_direct(path, ["n"], ["t"])
    >>> read.numbers["n"].tolist(), read.lists["t"].counts.tolist(), read.lists["t"].texts()
    ([3, 1, 2], [1, 0, 2], ['a', 'b', 'a'])
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit

__all__ = ["DirectRead", "TextLists", "compile_kernels", "direct_ready", "main", "read_direct"]

_MAGIC = b"PAR1"
_MAX_DEPTH = 64  # nesting of Thrift containers a footer or page header may use
# Thrift compact types
_T_STOP, _T_TRUE, _T_FALSE, _T_BYTE, _T_I16, _T_I32, _T_I64, _T_DOUBLE, _T_BINARY, _T_LIST, _T_SET, _T_MAP, \
    _T_STRUCT = range(13)
# parquet
_INT32, _INT64, _FLOAT, _DOUBLE, _BYTE_ARRAY = 1, 2, 4, 5, 6
_PLAIN, _PLAIN_DICTIONARY, _RLE, _RLE_DICTIONARY = 0, 2, 3, 8
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 1, 2, 3
_UNCOMPRESSED, _SNAPPY = 0, 1
_REQUIRED, _OPTIONAL, _REPEATED = 0, 1, 2
_SIGNED_INTS = {15: np.int8, 16: np.int16, 17: np.int32, 18: np.int64}  # converted types INT_8 .. INT_64
_PHYSICAL = {_INT32: np.int32, _INT64: np.int64, _FLOAT: np.float32, _DOUBLE: np.float64}
_LOGICAL_STRING, _LOGICAL_LIST, _LOGICAL_INTEGER = 1, 3, 10
_CONVERTED_UTF8, _CONVERTED_LIST = 0, 3


log = logging.getLogger(__name__)


class _Unsupported(Exception):
    """The file is outside what :func:`read_direct` reads (or broken): read it with pyarrow."""


# --- Thrift compact protocol ---------------------------------------------------------------------------------


@njit(cache=True, nogil=True, boundscheck=True, inline="always")
def _uvarint(b: np.ndarray, p: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if p >= b.shape[0] or shift > 63:
            raise ValueError("parquet: a varint runs past its bytes")
        x = np.int64(b[p])
        p += 1
        value |= (x & 0x7F) << shift
        if x < 0x80:
            return value, p
        shift += 7


@njit(cache=True, nogil=True, boundscheck=True, inline="always")
def _varint(b: np.ndarray, p: int) -> tuple[int, int]:
    v, p = _uvarint(b, p)
    return (v >> 1) ^ -(v & 1), p


@njit(cache=True, nogil=True, boundscheck=True, inline="always")
def _field(b: np.ndarray, p: int, last: int) -> tuple[int, int, int]:
    """The next field header of a struct: (field id, type, position after it); type 0 is the struct's end."""
    h = np.int64(b[p])
    p += 1
    kind = h & 0x0F
    if kind == _T_STOP:
        return 0, 0, p
    delta = h >> 4
    if delta:
        return last + delta, kind, p
    fid, p = _varint(b, p)
    return fid, kind, p


@njit(cache=True, nogil=True, boundscheck=True, inline="always")
def _list_header(b: np.ndarray, p: int) -> tuple[int, int, int]:
    h = np.int64(b[p])
    p += 1
    n = h >> 4
    if n == 15:
        n, p = _uvarint(b, p)
    return n, h & 0x0F, p


@njit(cache=True, nogil=True, boundscheck=True)
def _skip(b: np.ndarray, p: int, kind: int, st: np.ndarray) -> int:
    """The position after a value of compact type ``kind`` at ``p``, containers walked with the stack ``st``
    (:func:`_stack`; each element takes at least a byte, so a claimed size bounds nothing but the bytes do)."""
    depth = 0
    while True:
        if kind == _T_TRUE or kind == _T_FALSE:
            pass  # a struct field's bool is its header
        elif kind == _T_BYTE:
            p += 1
        elif kind == _T_I16 or kind == _T_I32 or kind == _T_I64:
            _, p = _uvarint(b, p)
        elif kind == _T_DOUBLE:
            p += 8
        elif kind == _T_BINARY:
            n, p = _uvarint(b, p)
            p += n
        elif kind == _T_LIST or kind == _T_SET or kind == _T_MAP or kind == _T_STRUCT:
            if depth == _MAX_DEPTH:
                raise ValueError("parquet: Thrift nesting too deep")
            st[0, depth], st[1, depth], st[4, depth] = 0, 0, 0
            if kind == _T_STRUCT:
                st[0, depth] = 0
            elif kind == _T_MAP:
                n, p = _uvarint(b, p)
                st[0, depth], st[1, depth] = 2, 2 * n
                if n:
                    kv = np.int64(b[p])
                    p += 1
                    st[2, depth], st[3, depth] = kv >> 4, kv & 0x0F
            else:
                n, element, p = _list_header(b, p)
                st[0, depth], st[1, depth], st[2, depth] = 1, n, element
            depth += 1
        else:
            raise ValueError("parquet: unknown Thrift type")
        if p > b.shape[0]:
            raise ValueError("parquet: a Thrift value runs past its bytes")
        while True:  # the next value to skip, or done
            if depth == 0:
                return p
            d = depth - 1
            if st[0, d] == 0:
                fid, kind, p = _field(b, p, st[4, d])
                if kind == _T_STOP:
                    depth -= 1
                    continue
                st[4, d] = fid
                break
            if st[1, d] == 0:
                depth -= 1
                continue
            st[1, d] -= 1
            kind = st[2, d] if st[0, d] == 1 or st[1, d] % 2 == 1 else st[3, d]
            if kind == _T_TRUE or kind == _T_FALSE:
                kind = _T_BYTE  # a bool inside a container is a byte
            break


@njit(cache=True, nogil=True)
def _stack() -> np.ndarray:
    """Scratch for :func:`_skip`: per level a container's kind (0 struct, 1 list, 2 map), the elements to go (a
    map counts keys and values), its element (a map's key) type, a map's value type, a struct's last field id."""
    return np.zeros((5, _MAX_DEPTH), np.int64)


# --- the footer ----------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True, boundscheck=True)
def _logical(b: np.ndarray, p: int, st: np.ndarray) -> tuple[int, int, int]:
    """A LogicalType union: (its member's field id, whether an INTEGER is signed (1) or not (0), position)."""
    member, signed, last = 0, 1, 0
    while True:
        fid, kind, p = _field(b, p, last)
        if kind == _T_STOP:
            return member, signed, p
        last = fid
        member = fid
        if fid == _LOGICAL_INTEGER and kind == _T_STRUCT:
            inner = 0
            while True:
                f2, k2, p = _field(b, p, inner)
                if k2 == _T_STOP:
                    break
                inner = f2
                if f2 == 2 and (k2 == _T_TRUE or k2 == _T_FALSE):
                    signed = 1 if k2 == _T_TRUE else 0
                else:
                    p = _skip(b, p, k2, st)
        else:
            p = _skip(b, p, kind, st)


@njit(cache=True, nogil=True, boundscheck=True)
def _schema(b: np.ndarray, p: int, st: np.ndarray) -> tuple[np.ndarray, int]:
    """FileMetaData.schema: per element [type, repetition, name offset, name length, children, converted type,
    logical member, signed], -1 where absent."""
    n, element, p = _list_header(b, p)
    if element != _T_STRUCT or n > b.shape[0]:
        raise ValueError("parquet: a schema that is no list of structs")
    out = np.full((n, 8), -1, np.int64)
    for k in range(n):
        last = 0
        while True:
            fid, kind, p = _field(b, p, last)
            if kind == _T_STOP:
                break
            last = fid
            if fid == 1 and kind == _T_I32:
                out[k, 0], p = _varint(b, p)
            elif fid == 3 and kind == _T_I32:
                out[k, 1], p = _varint(b, p)
            elif fid == 4 and kind == _T_BINARY:
                length, p = _uvarint(b, p)
                out[k, 2], out[k, 3] = p, length
                p += length
            elif fid == 5 and kind == _T_I32:
                out[k, 4], p = _varint(b, p)
            elif fid == 6 and kind == _T_I32:
                out[k, 5], p = _varint(b, p)
            elif fid == 10 and kind == _T_STRUCT:
                out[k, 6], out[k, 7], p = _logical(b, p, st)
            else:
                p = _skip(b, p, kind, st)
    return out, p


@njit(cache=True, nogil=True, boundscheck=True)
def _column_meta(b: np.ndarray, p: int, chunks: np.ndarray, g: int, c: int, st: np.ndarray) -> int:
    """ColumnMetaData into ``chunks[g, c]``: [type, codec, values, compressed size, data page, dictionary
    page]."""
    last = 0
    while True:
        fid, kind, p = _field(b, p, last)
        if kind == _T_STOP:
            return p
        last = fid
        if fid == 1 and kind == _T_I32:
            chunks[g, c, 0], p = _varint(b, p)
        elif fid == 4 and kind == _T_I32:
            chunks[g, c, 1], p = _varint(b, p)
        elif fid == 5 and kind == _T_I64:
            chunks[g, c, 2], p = _varint(b, p)
        elif fid == 7 and kind == _T_I64:
            chunks[g, c, 3], p = _varint(b, p)
        elif fid == 9 and kind == _T_I64:
            chunks[g, c, 4], p = _varint(b, p)
        elif fid == 11 and kind == _T_I64:
            chunks[g, c, 5], p = _varint(b, p)
        else:
            p = _skip(b, p, kind, st)


@njit(cache=True, nogil=True, boundscheck=True)
def _footer(b: np.ndarray, leaves: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """FileMetaData: its schema (:func:`_schema`), each row group's rows, and each row group's column chunks
    ([row group, leaf, :func:`_column_meta`'s six]). ``leaves`` < 0 parses the schema alone."""
    schema = np.full((0, 8), -1, np.int64)
    rows = np.zeros(0, np.int64)
    chunks = np.full((0, 0, 6), -1, np.int64)
    st = _stack()
    p, last = 0, 0
    while True:
        fid, kind, p = _field(b, p, last)
        if kind == _T_STOP:
            return schema, rows, chunks
        last = fid
        if fid == 2 and kind == _T_LIST:
            schema, p = _schema(b, p, st)
            if leaves < 0:
                return schema, rows, chunks
        elif fid == 4 and kind == _T_LIST and leaves >= 0:
            n, element, p = _list_header(b, p)
            if element != _T_STRUCT or n > b.shape[0]:
                raise ValueError("parquet: row groups that are no list of structs")
            rows = np.full(n, -1, np.int64)
            chunks = np.full((n, leaves, 6), -1, np.int64)
            for g in range(n):
                last_g = 0
                while True:
                    fg, kg, p = _field(b, p, last_g)
                    if kg == _T_STOP:
                        break
                    last_g = fg
                    if fg == 3 and kg == _T_I64:
                        rows[g], p = _varint(b, p)
                    elif fg == 1 and kg == _T_LIST:
                        m, element, p = _list_header(b, p)
                        if element != _T_STRUCT or m != leaves:
                            raise ValueError("parquet: a row group whose columns are not the schema's")
                        for c in range(m):
                            last_c = 0
                            while True:
                                fc, kc, p = _field(b, p, last_c)
                                if kc == _T_STOP:
                                    break
                                last_c = fc
                                if fc == 3 and kc == _T_STRUCT:
                                    p = _column_meta(b, p, chunks, g, c, st)
                                elif fc == 1 or fc == 8:  # a chunk in another file; an encrypted one
                                    raise ValueError("parquet: a column chunk read elsewhere")
                                else:
                                    p = _skip(b, p, kc, st)
                    else:
                        p = _skip(b, p, kg, st)
        elif fid == 8:
            raise ValueError("parquet: an encrypted file")
        else:
            p = _skip(b, p, kind, st)


# --- pages ---------------------------------------------------------------------------------------------------
# A page's row in a chunk's table: its PageHeader's fields, then where its body lies in the file.
_H_TYPE, _H_SIZE, _H_STORED, _H_VALUES, _H_ENCODING, _H_NULLS, _H_DEF_BYTES, _H_REP_BYTES, _H_COMPRESSED, \
    _H_DEF_ENCODING, _H_REP_ENCODING, _H_START, _H_END = range(13)


@njit(cache=True, nogil=True, boundscheck=True)
def _page_header(b: np.ndarray, p: int, st: np.ndarray, h: np.ndarray) -> int:
    """A PageHeader at ``p`` into ``h`` (its first 11 of :data:`_H_TYPE`..); the position after it."""
    h[:] = -1
    h[_H_COMPRESSED] = 1
    last = 0
    while True:
        fid, kind, p = _field(b, p, last)
        if kind == _T_STOP:
            return p
        last = fid
        if fid <= 3 and kind == _T_I32:
            h[fid - 1], p = _varint(b, p)  # type, uncompressed size, compressed size
        elif (fid == 5 or fid == 7 or fid == 8) and kind == _T_STRUCT:  # data page, dictionary page, data page v2
            inner = 0
            while True:
                f2, k2, p = _field(b, p, inner)
                if k2 == _T_STOP:
                    break
                inner = f2
                if f2 == 1 and k2 == _T_I32:
                    h[_H_VALUES], p = _varint(b, p)
                elif (fid == 8 and f2 == 4 or fid != 8 and f2 == 2) and k2 == _T_I32:
                    h[_H_ENCODING], p = _varint(b, p)
                elif fid == 8 and f2 == 2 and k2 == _T_I32:
                    h[_H_NULLS], p = _varint(b, p)
                elif fid == 8 and f2 == 5 and k2 == _T_I32:
                    h[_H_DEF_BYTES], p = _varint(b, p)
                elif fid == 8 and f2 == 6 and k2 == _T_I32:
                    h[_H_REP_BYTES], p = _varint(b, p)
                elif fid == 8 and f2 == 7 and (k2 == _T_TRUE or k2 == _T_FALSE):
                    h[_H_COMPRESSED] = 1 if k2 == _T_TRUE else 0
                elif fid == 5 and f2 == 3 and k2 == _T_I32:
                    h[_H_DEF_ENCODING], p = _varint(b, p)
                elif fid == 5 and f2 == 4 and k2 == _T_I32:
                    h[_H_REP_ENCODING], p = _varint(b, p)
                else:
                    p = _skip(b, p, k2, st)
        else:
            p = _skip(b, p, kind, st)


@njit(cache=True, nogil=True, boundscheck=True)
def _grow(a: np.ndarray, need: int) -> np.ndarray:
    if need <= a.shape[0]:
        return a
    bigger = np.empty(max(need, 2 * a.shape[0]), a.dtype)
    bigger[:a.shape[0]] = a
    return bigger


@njit(cache=True, nogil=True, boundscheck=True)
def _snappy(src: np.ndarray, size: int, out: np.ndarray) -> None:
    """A snappy block of ``size`` bytes uncompressed (its own length prefix must agree) into ``out[:size]``."""
    n, p = _uvarint(src, 0)
    if n != size or n > 32 * src.shape[0] + 64:  # a snappy op expands at most 64 bytes from 3
        raise ValueError("parquet: a snappy page whose size disagrees with its header")
    o = 0
    end = src.shape[0]
    while p < end:
        tag = np.int64(src[p])
        p += 1
        op = tag & 3
        if op == 0:  # literal
            length = tag >> 2
            if length >= 60:
                extra = length - 59
                length = 0
                for k in range(extra):
                    length |= np.int64(src[p + k]) << (8 * k)
                p += extra
            length += 1
            if p + length > end or o + length > n:
                raise ValueError("parquet: a snappy literal runs past its bytes")
            out[o:o + length] = src[p:p + length]
            o += length
            p += length
            continue
        if op == 1:
            length = ((tag >> 2) & 7) + 4
            offset = ((tag >> 5) << 8) | np.int64(src[p])
            p += 1
        elif op == 2:
            length = (tag >> 2) + 1
            offset = np.int64(src[p]) | (np.int64(src[p + 1]) << 8)
            p += 2
        else:
            length = (tag >> 2) + 1
            offset = (np.int64(src[p]) | (np.int64(src[p + 1]) << 8) | (np.int64(src[p + 2]) << 16)
                      | (np.int64(src[p + 3]) << 24))
            p += 4
        if offset == 0 or offset > o or o + length > n:
            raise ValueError("parquet: a snappy copy outside its output")
        for k in range(length):  # byte by byte: a copy may overlap what it writes
            out[o + k] = out[o - offset + k]
        o += length
    if o != n:
        raise ValueError("parquet: a snappy block shorter than it says")


@njit(cache=True, nogil=True, boundscheck=True)
def _body(src: np.ndarray, codec: int, size: int, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A page body as stored (``src``) uncompressed: (its bytes, the scratch ``buf``, grown where it had to)."""
    if codec == _SNAPPY:
        if size < 0:
            raise ValueError("parquet: a page with no size")
        buf = _grow(buf, size)
        _snappy(src, size, buf)
        return buf[:size], buf
    if codec != _UNCOMPRESSED or src.shape[0] != size:
        raise ValueError("parquet: a codec not read here")
    return src, buf


@njit(cache=True, nogil=True, boundscheck=True)
def _hybrid(d: np.ndarray, p: int, end: int, width: int, n: int, out: np.ndarray) -> int:
    """``n`` values of the RLE / bit-packed hybrid of ``width`` bits at ``d[p:end]`` into ``out[:n]``; the
    position after the runs read."""
    if width < 0 or width > 32 or end > d.shape[0]:
        raise ValueError("parquet: a hybrid run of a bad width")
    got = 0
    nbytes = (width + 7) // 8
    mask = (1 << width) - 1
    while got < n:
        if p >= end:
            raise ValueError("parquet: levels or indices run past their bytes")
        header, p = _uvarint(d, p)
        if header & 1:  # bit-packed groups of 8
            take = min((header >> 1) * 8, n - got)
            if p + ((take * width + 7) // 8) > end:
                raise ValueError("parquet: bit-packed values run past their bytes")
            for k in range(take):
                bit = k * width
                q = p + (bit >> 3)
                shift = bit & 7
                v = 0
                for j in range((shift + width + 7) // 8):
                    v |= np.int64(d[q + j]) << (8 * j)
                out[got + k] = (v >> shift) & mask
            got += take
            p += (header >> 1) * width
        else:
            if p + nbytes > end:
                raise ValueError("parquet: a repeated value runs past its bytes")
            v = 0
            for j in range(nbytes):
                v |= np.int64(d[p + j]) << (8 * j)
            p += nbytes
            take = min(header >> 1, n - got)
            out[got:got + take] = v
            got += take
    return p


@njit(cache=True, nogil=True, boundscheck=True)
def _width(value: int) -> int:
    w = 0
    while value >> w:
        w += 1
    return w


@njit(cache=True, nogil=True, boundscheck=True)
def _plain_numbers(d: np.ndarray, p: int, physical: int, n: int, out: np.ndarray, at: int) -> None:
    """``n`` PLAIN values of ``physical`` type at ``d[p:]`` into ``out[at:at + n]``."""
    size = 4 if physical == _INT32 or physical == _FLOAT else 8
    if p + n * size > d.shape[0] or at + n > out.shape[0]:
        raise ValueError("parquet: values run past their page")
    raw = d[p:p + n * size]
    if physical == _INT32:
        out[at:at + n] = raw.view(np.int32)
    elif physical == _INT64:
        out[at:at + n] = raw.view(np.int64)
    elif physical == _FLOAT:
        out[at:at + n] = raw.view(np.float32)
    else:
        out[at:at + n] = raw.view(np.float64)


@njit(cache=True, nogil=True, boundscheck=True)
def _levels(d: np.ndarray, p: int, end: int, max_level: int, n: int, out: np.ndarray, v1: bool) -> int:
    """``n`` levels at ``p`` (v1: behind their 4-byte length; v2: ``end`` is theirs) into ``out``."""
    if max_level == 0:
        out[:n] = 0
        return p
    if v1:
        if p + 4 > d.shape[0]:
            raise ValueError("parquet: levels run past their page")
        length = np.int64(d[p]) | (np.int64(d[p + 1]) << 8) | (np.int64(d[p + 2]) << 16) | (np.int64(d[p + 3]) << 24)
        p += 4
        end = p + length
    _hybrid(d, p, end, _width(max_level), n, out)
    return end


@njit(cache=True, nogil=True, boundscheck=True)
def _pages(b: np.ndarray, chunk: np.ndarray, st: np.ndarray, pages: np.ndarray) -> tuple[np.ndarray, int]:
    """One column chunk's pages in the order written, each a row of ``pages`` (grown where it must be, and
    returned with the count)."""
    start = chunk[4]
    if 0 < chunk[5] < start:
        start = chunk[5]
    end = start + chunk[3]
    if start < 4 or chunk[3] < 0 or end > b.shape[0]:
        raise ValueError("parquet: a column chunk outside its file")
    if chunk[2] < 0 or chunk[2] > 64 * b.shape[0]:  # what every page's arrays are bounded by
        raise ValueError("parquet: a column chunk with more values than its file can hold")
    got, count = 0, 0
    p = start
    while got < chunk[2]:
        if p >= end:
            raise ValueError("parquet: a column chunk with fewer values than it says")
        if count == pages.shape[0]:
            pages = np.concatenate((pages, np.empty_like(pages)))
        h = pages[count]
        p = _page_header(b, p, st, h)
        if h[_H_STORED] < 0 or p + h[_H_STORED] > end:
            raise ValueError("parquet: a page runs past its column chunk")
        h[_H_START], h[_H_END] = p, p + h[_H_STORED]
        p += h[_H_STORED]
        count += 1
        if h[_H_TYPE] == _DATA_PAGE or h[_H_TYPE] == _DATA_PAGE_V2:
            if h[_H_VALUES] < 0:
                raise ValueError("parquet: a data page with no value count")
            got += h[_H_VALUES]
    if got != chunk[2]:
        raise ValueError("parquet: a column chunk with more values than it says")
    return pages, count


@njit(cache=True, nogil=True, boundscheck=True)
def _data(b: np.ndarray, h: np.ndarray, codec: int, max_def: int, max_rep: int, defs: np.ndarray,
          reps: np.ndarray, buf: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """A data page's levels into ``defs`` / ``reps`` (their first ``h[_H_VALUES]``): (its values' bytes, where
    they start, the scratch ``buf``)."""
    n = h[_H_VALUES]
    src = b[h[_H_START]:h[_H_END]]
    if h[_H_TYPE] == _DATA_PAGE:
        if max_rep and h[_H_REP_ENCODING] != _RLE or max_def and h[_H_DEF_ENCODING] != _RLE:
            raise ValueError("parquet: levels in an encoding not read here")
        d, buf = _body(src, codec, h[_H_SIZE], buf)
        p = _levels(d, 0, 0, max_rep, n, reps, True)
        p = _levels(d, p, 0, max_def, n, defs, True)
        return d, p, buf
    rep_bytes, def_bytes = h[_H_REP_BYTES], h[_H_DEF_BYTES]
    if rep_bytes < 0 or def_bytes < 0 or rep_bytes + def_bytes > src.shape[0]:
        raise ValueError("parquet: a v2 page whose levels run past it")
    _levels(src, 0, rep_bytes, max_rep, n, reps, False)
    _levels(src, rep_bytes, rep_bytes + def_bytes, max_def, n, defs, False)
    rest = src[rep_bytes + def_bytes:]
    if h[_H_COMPRESSED] == 1:
        rest, buf = _body(rest, codec, h[_H_SIZE] - rep_bytes - def_bytes, buf)
    return rest, 0, buf


@njit(cache=True, nogil=True, boundscheck=True)
def _check_nulls(h: np.ndarray, n: int, values: int) -> None:
    """A v2 data page says how many of its ``n`` levels hold no value (``num_nulls``, a required field): it must be
    what its levels say, ``n - values``."""
    if h[_H_TYPE] == _DATA_PAGE_V2 and h[_H_NULLS] != n - values:
        raise ValueError("parquet: a v2 page whose null count disagrees with its levels")


@njit(cache=True, nogil=True, boundscheck=True)
def _indices(d: np.ndarray, p: int, n: int, size: int, out: np.ndarray) -> None:
    """``n`` dictionary indices at ``d[p:]`` (a width byte, then the hybrid) into ``out``, each checked below
    ``size``."""
    if n == 0:
        return
    _hybrid(d, p + 1, d.shape[0], np.int64(d[p]), n, out)
    for k in range(n):
        if out[k] < 0 or out[k] >= size:
            raise ValueError("parquet: a dictionary index past its dictionary")


@njit(cache=True, nogil=True, boundscheck=True)
def _dictionary_indices(h: np.ndarray, d: np.ndarray, p: int, n: int, size: int, out: np.ndarray) -> bool:
    """Whether data page ``h``'s ``n`` values at ``d[p:]`` are dictionary indices, then read into ``out`` (each
    checked below ``size``, the page's dictionary; -1: none came before it); False where they are PLAIN; an error
    for another encoding."""
    encoding = h[_H_ENCODING]
    if encoding == _PLAIN:
        return False
    if encoding != _PLAIN_DICTIONARY and encoding != _RLE_DICTIONARY:
        raise ValueError("parquet: values in an encoding not read here")
    if size < 0:
        raise ValueError("parquet: dictionary indices with no dictionary")
    _indices(d, p, n, size, out)
    return True


@njit(cache=True, nogil=True, boundscheck=True)
def _kind_of(h: np.ndarray) -> int:
    """A page's type, checked: an index page (skipped), a PLAIN dictionary, or a data page (v1 or v2)."""
    kind = h[_H_TYPE]
    if kind == _DICTIONARY_PAGE and (h[_H_ENCODING] != _PLAIN and h[_H_ENCODING] != _PLAIN_DICTIONARY
                                     or h[_H_VALUES] < 0):
        raise ValueError("parquet: a dictionary in an encoding not read here")
    if kind != _INDEX_PAGE and kind != _DICTIONARY_PAGE and kind != _DATA_PAGE and kind != _DATA_PAGE_V2:
        raise ValueError("parquet: a page of a type not read here")
    return kind


@njit(cache=True, nogil=True, boundscheck=True)
def _numbers(b: np.ndarray, chunks: np.ndarray, rows: np.ndarray, physical: int, max_def: int,
             out: np.ndarray) -> None:
    """A flat column with no nulls, every row group's chunk in turn, into ``out`` (its file's rows)."""
    st = _stack()
    pages = np.empty((4, 13), np.int64)
    levels = np.empty(1024, np.int64)
    dictionary = np.empty(1024, out.dtype)
    buf = np.empty(4096, np.uint8)
    at = 0
    for g in range(chunks.shape[0]):
        chunk = chunks[g]
        if chunk[0] != physical or chunk[2] != rows[g]:
            raise ValueError("parquet: a column chunk unlike its schema")
        pages, count = _pages(b, chunk, st, pages)
        size = -1
        for k in range(count):
            h = pages[k]
            kind, n = _kind_of(h), h[_H_VALUES]
            if kind == _INDEX_PAGE:
                continue
            if kind == _DICTIONARY_PAGE:
                d, buf = _body(b[h[_H_START]:h[_H_END]], chunk[1], h[_H_SIZE], buf)
                dictionary = _grow(dictionary, n)
                _plain_numbers(d, 0, physical, n, dictionary, 0)
                size = n
                continue
            if at + n > out.shape[0]:
                raise ValueError("parquet: more values than rows")
            levels = _grow(levels, n)
            d, p, buf = _data(b, h, chunk[1], max_def, 0, levels, levels, buf)
            if max_def:
                for j in range(n):
                    if levels[j] != max_def:
                        raise ValueError("parquet: a null")
            _check_nulls(h, n, n)
            if _dictionary_indices(h, d, p, n, size, levels):
                for j in range(n):
                    out[at + j] = dictionary[levels[j]]
            else:
                _plain_numbers(d, p, physical, n, out, at)
            at += n
    if at != out.shape[0]:
        raise ValueError("parquet: fewer values than rows")


@njit(cache=True, nogil=True, boundscheck=True)
def _plain_texts(d: np.ndarray, p: int, n: int, pool: np.ndarray, used: int, bounds: np.ndarray, entries: int
                 ) -> tuple[np.ndarray, int, np.ndarray, int]:
    """``n`` PLAIN byte arrays at ``d[p:]`` appended to ``pool`` (``used`` bytes so far) as entries
    ``entries..`` of ``bounds`` (start, end in the pool, flat)."""
    bounds = _grow(bounds, 2 * (entries + n))
    for k in range(n):
        if p + 4 > d.shape[0]:
            raise ValueError("parquet: a text runs past its page")
        length = np.int64(d[p]) | (np.int64(d[p + 1]) << 8) | (np.int64(d[p + 2]) << 16) | (np.int64(d[p + 3]) << 24)
        p += 4
        if p + length > d.shape[0]:
            raise ValueError("parquet: a text runs past its page")
        pool = _grow(pool, used + length)
        pool[used:used + length] = d[p:p + length]
        bounds[2 * (entries + k)] = used
        bounds[2 * (entries + k) + 1] = used + length
        used += length
        p += length
    return pool, used, bounds, p


@njit(cache=True, nogil=True, boundscheck=True)
def _text_lists(b: np.ndarray, chunks: np.ndarray, rows: np.ndarray, max_def: int, max_rep: int,
                null_element: int, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A column of lists of texts: each row's count of texts into ``counts``, and (the texts' bytes, each
    entry's [start, end] in them, each text's entry in row order). Level ``max_def`` is a text, from
    ``null_element`` up a null text (an error), below it an empty or null list."""
    st = _stack()
    pages = np.empty((4, 13), np.int64)
    defs = np.empty(1024, np.int64)
    reps = np.empty(1024, np.int64)
    buf = np.empty(4096, np.uint8)
    pool = np.empty(1024, np.uint8)
    bounds = np.empty(256, np.int64)
    element = np.empty(1024, np.int64)
    used, entries, texts, row = 0, 0, 0, -1
    for g in range(chunks.shape[0]):
        chunk = chunks[g]
        if chunk[0] != _BYTE_ARRAY:
            raise ValueError("parquet: a column chunk unlike its schema")
        first_row = row + 1
        pages, count = _pages(b, chunk, st, pages)
        base, size = 0, -1
        for k in range(count):
            h = pages[k]
            kind, n = _kind_of(h), h[_H_VALUES]
            if kind == _INDEX_PAGE:
                continue
            if kind == _DICTIONARY_PAGE:
                d, buf = _body(b[h[_H_START]:h[_H_END]], chunk[1], h[_H_SIZE], buf)
                pool, used, bounds, _ = _plain_texts(d, 0, n, pool, used, bounds, entries)
                base, size = entries, n
                entries += n
                continue
            defs = _grow(defs, n)
            reps = _grow(reps, n)
            d, p, buf = _data(b, h, chunk[1], max_def, max_rep, defs, reps, buf)
            values = 0
            for j in range(n):
                if reps[j] == 0:
                    row += 1
                    if row >= counts.shape[0]:
                        raise ValueError("parquet: more lists than rows")
                    counts[row] = 0
                elif row < first_row:
                    raise ValueError("parquet: a row group that starts inside a list")
                if defs[j] == max_def:
                    values += 1
                    counts[row] += 1
                elif defs[j] >= null_element:
                    raise ValueError("parquet: a null text")
            _check_nulls(h, n, values)
            element = _grow(element, texts + values)
            defs = _grow(defs, values)
            if _dictionary_indices(h, d, p, values, size, defs):
                for j in range(values):
                    element[texts + j] = base + defs[j]
            else:
                pool, used, bounds, _ = _plain_texts(d, p, values, pool, used, bounds, entries)
                for j in range(values):
                    element[texts + j] = entries + j
                entries += values
            texts += values
        if row + 1 - first_row != rows[g]:
            raise ValueError("parquet: a row group with another count of lists")
    if row + 1 != counts.shape[0]:
        raise ValueError("parquet: fewer lists than rows")
    return pool[:used], bounds[:2 * entries].reshape(-1, 2), element[:texts]


# --- Python side ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextLists:
    """A column of lists of texts: ``counts[row]`` texts a row; ``elements`` each text's entry, row after row;
    an entry's text is ``pool[bounds[e, 0]:bounds[e, 1]]`` (UTF-8)."""

    counts: np.ndarray
    elements: np.ndarray
    pool: np.ndarray
    bounds: np.ndarray

    def entry_texts(self) -> list[str]:
        """Every entry's text (each dictionary's once)."""
        data = self.pool.tobytes()
        return [data[s:e].decode("utf-8") for s, e in self.bounds.tolist()]

    def texts(self) -> list[str]:
        """Every text, row after row."""
        entries = self.entry_texts()
        return [entries[e] for e in self.elements.tolist()]


@dataclass(frozen=True)
class DirectRead:
    """What :func:`read_direct` read: ``rows``; the numeric columns asked for that the file has, in their
    Arrow dtype; the list-of-text columns asked for that it has."""

    rows: int
    numbers: dict[str, np.ndarray]
    lists: dict[str, TextLists]


@dataclass(frozen=True)
class _Leaf:
    name: str
    physical: int
    dtype: type | None
    max_def: int
    max_rep: int
    leaf_optional: bool
    is_text_list: bool


def _leaves(schema: np.ndarray, footer: np.ndarray) -> list[_Leaf]:
    """The schema's leaf columns in order: their top-level name, physical type, numpy dtype where a flat signed
    int or float, levels, and whether they are a three-level list of texts."""
    out: list[_Leaf] = []
    k = 1

    def name_of(i: int) -> str:
        start, length = int(schema[i, 2]), int(schema[i, 3])
        if start < 0:
            raise _Unsupported("a schema element with no name")
        return footer[start:start + length].tobytes().decode("utf-8")

    def walk(i: int, top: str, max_def: int, max_rep: int, depth: int, path: list[int]) -> int:
        if i >= len(schema) or depth > 16:
            raise _Unsupported("a schema tree that does not close")
        rep = int(schema[i, 1])
        max_def += rep in (_OPTIONAL, _REPEATED)
        max_rep += rep == _REPEATED
        children = int(schema[i, 4])
        if children <= 0:
            physical, converted, logical = int(schema[i, 0]), int(schema[i, 5]), int(schema[i, 6])
            dtype = None
            if depth == 0 and rep != _REPEATED and physical in _PHYSICAL:
                plain = converted < 0 and logical < 0
                if physical in (_INT32, _INT64) and converted in _SIGNED_INTS and logical in (-1, _LOGICAL_INTEGER) \
                        and schema[i, 7] != 0:
                    dtype = _SIGNED_INTS[converted]
                elif plain:
                    dtype = _PHYSICAL[physical]
            text_list = False
            if depth == 2 and physical == _BYTE_ARRAY and converted in (-1, _CONVERTED_UTF8) and \
                    logical in (-1, _LOGICAL_STRING):
                outer, middle = path
                text_list = (int(schema[outer, 1]) != _REPEATED and int(schema[middle, 1]) == _REPEATED
                             and int(schema[middle, 4]) == 1 and rep != _REPEATED
                             and (int(schema[outer, 5]) == _CONVERTED_LIST or int(schema[outer, 6]) == _LOGICAL_LIST))
            out.append(_Leaf(top, physical, dtype, max_def, max_rep, rep == _OPTIONAL, text_list))
            return i + 1
        j = i + 1
        for _ in range(children):
            j = walk(j, top, max_def, max_rep, depth + 1, [*path, i])
        return j

    while k < len(schema):
        k = walk(k, name_of(k), 0, 0, 0, [])
    return out


def read_direct(path: str | os.PathLike, numbers: Sequence[str], lists: Sequence[str] = ()) -> DirectRead | None:
    """The columns of ``numbers`` (flat signed ints and floats with no nulls) and ``lists`` (lists of texts) that
    the local parquet file ``path`` has, read from its bytes; None where the file or one of those columns is
    outside what this reads or does not parse (read it with pyarrow then). Columns it lacks are left out."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="c")  # writable (never written): one array type
    except (OSError, ValueError):  # an empty file cannot be mapped
        return None
    try:
        return _read(data, numbers, lists)
    except (_Unsupported, ValueError, IndexError, UnicodeDecodeError, OverflowError, MemoryError):
        return None
    finally:
        mm = getattr(data, "_mmap", None)
        del data
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # an array still looks at it: it closes when that goes
                pass


def _read(data: np.ndarray, numbers: Sequence[str], lists: Sequence[str]) -> DirectRead:
    size = data.shape[0]
    if size < 12 or data[:4].tobytes() != _MAGIC or data[-4:].tobytes() != _MAGIC:
        raise _Unsupported("no parquet magic")
    length = int(data[-8:-4].view(np.uint32)[0])
    if length + 12 > size:
        raise _Unsupported("a footer longer than the file")
    footer = np.array(data[size - 8 - length:size - 8])
    schema, _, _ = _footer(footer, -1)
    if len(schema) == 0 or schema[0, 4] <= 0:
        raise _Unsupported("no schema")
    leaves = _leaves(schema, footer)
    _, rows, chunks = _footer(footer, len(leaves))
    total = int(rows.sum())
    if (rows < 0).any() or total > 64 * size:
        raise _Unsupported("row counts the file cannot hold")
    index = {leaf.name: c for c, leaf in enumerate(leaves)}
    if len(index) != len(leaves):  # a name with several leaves (a struct, a map): not one of ours
        index = {name: c for name, c in index.items() if sum(leaf.name == name for leaf in leaves) == 1}
    out_numbers, out_lists = {}, {}
    for name in numbers:
        if name not in index:
            if any(leaf.name == name for leaf in leaves):
                raise _Unsupported(f"{name} is no flat column")
            continue
        leaf = leaves[index[name]]
        if leaf.dtype is None:
            raise _Unsupported(f"{name} is of a type not read here")
        values = np.empty(total, np.float64 if leaf.physical in (_FLOAT, _DOUBLE) else np.int64)
        _numbers(data, chunks[:, index[name]], rows, leaf.physical, leaf.max_def, values)
        out_numbers[name] = values.astype(leaf.dtype, copy=False)
    for name in lists:
        if name not in index:
            if any(leaf.name == name for leaf in leaves):
                raise _Unsupported(f"{name} is no list of texts")
            continue
        leaf = leaves[index[name]]
        if not leaf.is_text_list:
            raise _Unsupported(f"{name} is no list of texts")
        counts = np.zeros(total, np.int64)
        null_element = leaf.max_def - 1 if leaf.leaf_optional else leaf.max_def + 1
        pool, bounds, elements = _text_lists(data, chunks[:, index[name]], rows, leaf.max_def, leaf.max_rep,
                                             null_element, counts)
        out_lists[name] = TextLists(counts, elements, pool, bounds)
    return DirectRead(total, out_numbers, out_lists)


# --- compiled once per install -------------------------------------------------------------------------------

_ENTRIES = ("_footer", "_numbers", "_text_lists")
_warming = threading.Lock()
_started = False


def direct_ready() -> bool:
    """Whether the kernels are compiled in numba's on-disk cache, so that :func:`read_direct` starts in a fraction
    of a second (compiling them takes about 40 s once per install). Where they are not, a child process of the
    lowest priority compiles them in the background (once per process that asks), for the next open on this
    machine, and the caller reads another way this time. ``python -m mmfeed.loaders.stores.parquet_direct``
    compiles them ahead (in a container image's build, say)."""
    if os.environ.get("NUMBA_DISABLE_JIT", "0") not in ("", "0"):
        return True  # nothing to compile: the kernels run as Python
    try:
        ready = all(os.path.exists(globals()[name]._cache._cache_file._index_path) for name in _ENTRIES)
    except Exception:  # noqa: BLE001 (a numba without this layout: take it as not compiled)
        ready = False
    if not ready:
        _warm_up()
    return ready


_MACHINE_LOCK_S = 600.0  # a compile started on this machine this recently is left to finish


def _warm_up() -> None:
    """Starts the background compile, unless this process or another on the machine (the ranks of a node open
    the same dataset at once) started one in the last :data:`_MACHINE_LOCK_S`."""
    global _started
    with _warming:
        if _started:
            return
        _started = True
    user = os.getuid() if hasattr(os, "getuid") else 0
    lock = os.path.join(tempfile.gettempdir(), f"mmfeed-parquet-kernels-{user}")
    try:
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            if time.time() - os.path.getmtime(lock) < _MACHINE_LOCK_S:
                return
            os.utime(lock)  # a compile that did not finish long ago: start another
    except OSError as err:  # no temporary folder to mark it in: compile anyway
        log.debug("could not mark the parquet kernels' compile: %s", err)
    try:
        subprocess.Popen([sys.executable, "-m", __name__, "--nice"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as err:  # no interpreter to start: the next open asks again
        log.debug("could not start compiling the parquet kernels: %s", err)


def compile_kernels() -> bool:
    """Compiles (or loads) the kernels for every array type :func:`read_direct` passes them, by reading a small
    file of each kind of column; whether it read back what was written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"i": pa.array([3, 1, 2], pa.int64()), "f": pa.array([0.5, 1.5, 2.5]),
                      "t": [["a"], [], ["b", "a"]]})
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "t.parquet")
        pq.write_table(table, path, row_group_size=2)
        read = read_direct(path, ["i", "f"], ["t"])
    return read is not None and read.numbers["i"].tolist() == [3, 1, 2] and read.lists["t"].texts() == ["a", "b", "a"]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m mmfeed.loaders.stores.parquet_direct",
                                description="Compile the parquet kernels into numba's cache (once per install).")
    p.add_argument("--nice", action="store_true", help="at the lowest priority (the background compile)")
    args = p.parse_args(argv)
    if args.nice and hasattr(os, "nice"):
        os.nice(19)
    return 0 if compile_kernels() else 1


if __name__ == "__main__":
    sys.exit(main())
