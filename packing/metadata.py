"""Attention metadata of packed rows: document, position, step and modality ids, cu_seqlens, block tables.

Pure numpy + numba (no torch): :class:`mmfeed.packing.PackedBatch` turns these arrays into tensors and masks.

A packed batch is described by a :class:`Layout`, flat arrays in CSR form: the document lengths of all rows
back to back (row-major, so the global document number is the index into ``lengths``), ``row_offsets`` saying
which documents belong to which row, and optionally each document's step sizes (tokens per attention step) and
segments (runs of ``(modality index, n_tokens)``)::

    >>> lay = layout_from_rows([[5, 3], [7]], capacity=8)
    >>> meta = document_metadata(lay)
    >>> meta.document_ids.tolist()
    [[0, 0, 0, 0, 0, 1, 1, 1], [2, 2, 2, 2, 2, 2, 2, -1]]
    >>> meta.cu_seqlens.tolist(), meta.max_seqlen
    ([0, 5, 8, 15], 7)

Attention rule (what :func:`block_tables` and the masks encode): query q may attend key k iff both are real
tokens of the same document and ``step[k] <= step[q]``; a padding token attends only to itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

__all__ = sorted(["BlockTables", "Layout", "Metadata", "block_tables", "document_metadata", "layout_from_rows",
                  "make_layout", "transpose_tables"])

_INT32_MAX = np.iinfo(np.int32).max


@dataclass(frozen=True, eq=False)
class Layout:
    """Validated, flat description of a packed batch (build it with :func:`make_layout` or
    :func:`layout_from_rows`, which check every field).

    Attributes:
        capacity: tokens per row.
        lengths: int64 ``[n_docs]``, document lengths of all rows, row-major.
        row_offsets: int64 ``[R + 1]``, documents of row r are ``lengths[row_offsets[r]:row_offsets[r + 1]]``.
        step_sizes: int64 ``[n_steps]`` tokens per step of every document back to back, or None for one token
            per step everywhere (token-causal).
        step_offsets: int64 ``[n_docs + 1]``, steps of document g are ``step_sizes[step_offsets[g]:...[g + 1]]``.
        segment_modalities: int64 ``[n_runs]`` modality index of each run, or None (every token modality 0).
        segment_lengths: int64 ``[n_runs]`` tokens of each run.
        segment_offsets: int64 ``[n_docs + 1]``, runs of document g are ``segment_*[segment_offsets[g]:...]``.
    """

    capacity: int
    lengths: np.ndarray
    row_offsets: np.ndarray
    step_sizes: np.ndarray | None = None
    step_offsets: np.ndarray | None = None
    segment_modalities: np.ndarray | None = None
    segment_lengths: np.ndarray | None = None
    segment_offsets: np.ndarray | None = None

    @property
    def num_rows(self) -> int:
        return len(self.row_offsets) - 1

    @property
    def num_documents(self) -> int:
        return len(self.lengths)


class Metadata(NamedTuple):
    """Per-token ids of a packed batch (numpy), as documented on :class:`mmfeed.packing.PackedBatch`."""

    document_ids: np.ndarray  # int32 [R, C], -1 on padding
    position_ids: np.ndarray  # int64 [R, C], 0 on padding
    step_ids: np.ndarray  # int32 [R, C], -1 on padding
    modality_ids: np.ndarray  # int8 [R, C], -1 on padding
    cu_seqlens: np.ndarray  # int32 [n_docs + 1]
    max_seqlen: int


class BlockTables(NamedTuple):
    """FlexAttention block-sparse tables (the arguments of ``BlockMask.from_kv_blocks``), int32, head dim 1.

    ``kv_num_blocks[r, 0, i]`` partial kv blocks of query block i (they need the mask_mod), listed ascending at
    the start of ``kv_indices[r, 0, i]``; ``full_*`` likewise for blocks where every pair may attend. Only those
    first ``num`` entries of a row mean anything (torch reads no others).

    Storage is compact: ``width = max(1, kv_num_blocks.max())`` entries per query block (the listed blocks, then
    the others ascending: torch's ``create_block_mask`` layout cut to ``width`` columns), not ``nb``. Torch 2.13
    reads the number of kv blocks from ``kv_indices.shape[-1]`` (``from_kv_blocks``' transpose, ``to_dense``,
    the CPU kernel's checks), so ``kv_indices`` is an ``[R, 1, nb, nb]`` strided view of that storage whose
    entries past ``width`` of row i are the start of row i + 1 (never write through it); :meth:`compact` gives
    the ``[R, 1, nb, width]`` tables.
    """

    kv_num_blocks: np.ndarray  # [R, 1, nb]
    kv_indices: np.ndarray  # [R, 1, nb, nb] view of [R, 1, nb, width] storage
    full_kv_num_blocks: np.ndarray  # [R, 1, nb]
    full_kv_indices: np.ndarray  # [R, 1, nb, nb] view of [R, 1, nb, full width] storage

    def compact(self) -> BlockTables:
        """The tables with ``kv_indices [R, 1, nb, width]`` (and the full ones ``[R, 1, nb, full width]``), no copy."""
        cut = [idx[..., : max(1, int(num.max())) if num.size else 1] for num, idx in zip(self[::2], self[1::2])]
        return BlockTables(self.kv_num_blocks, cut[0], self.full_kv_num_blocks, cut[1])


def _int_array(name: str, values: object) -> np.ndarray:
    if type(values) is np.ndarray and values.dtype == np.int64 and values.ndim == 1 and values.flags.c_contiguous:
        return values  # what loaders pass: nothing to convert
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}; pass ints")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check_capacity(capacity: object) -> int:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)):
        raise TypeError(f"capacity must be an int, got {capacity!r}")
    if capacity < 1:
        raise ValueError(f"capacity must be >= 1, got {capacity}")
    return int(capacity)


def _check_offsets(name: str, offsets: np.ndarray, n: int, what: str) -> None:
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != n or (np.diff(offsets) < 0).any():
        raise ValueError(f"{name} must start at 0, never decrease and end at the number of {what} ({n}), "
                         f"got {offsets[:8].tolist()}{'...' if len(offsets) > 8 else ''}")


def _where(row_offsets: np.ndarray, doc: int) -> str:
    row = int(np.searchsorted(row_offsets, doc, side="right")) - 1
    return f"row {row}, document {doc - int(row_offsets[row])}"


def _check_runs(kind: str, sizes: np.ndarray, offsets: np.ndarray, lengths: np.ndarray,
                row_offsets: np.ndarray) -> None:
    _check_offsets(f"{kind} offsets", offsets, len(sizes), kind)
    if len(offsets) != len(lengths) + 1:
        raise ValueError(f"{kind} offsets must have n_docs + 1 = {len(lengths) + 1} entries, got {len(offsets)}")
    bad = np.flatnonzero(sizes < 1)
    if bad.size:
        doc = int(np.searchsorted(offsets, bad[0], side="right")) - 1
        raise ValueError(f"{kind} of {_where(row_offsets, doc)} must be positive, got {int(sizes[bad[0]])}")
    csum = np.concatenate([[0], np.cumsum(sizes)])
    sums = csum[offsets[1:]] - csum[offsets[:-1]]
    bad = np.flatnonzero(sums != lengths)
    if bad.size:
        g = int(bad[0])
        raise ValueError(f"{kind} of {_where(row_offsets, g)} sum to {int(sums[g])} but the document has "
                         f"{int(lengths[g])} tokens; make them cover the document exactly")


def make_layout(lengths: object, row_offsets: object, capacity: int, *, step_sizes: object = None,
                step_offsets: object = None, segment_modalities: object = None, segment_lengths: object = None,
                segment_offsets: object = None, num_modalities: int | None = None) -> Layout:
    """Validate flat arrays (see :class:`Layout`) and return a :class:`Layout`.

    Raises ValueError naming the row, document and value when a document is not positive, a row holds more
    than ``capacity`` tokens, step sizes or segments do not cover their document exactly, or a modality index
    is outside ``[0, num_modalities)``.
    """
    capacity = _check_capacity(capacity)
    lengths = _int_array("lengths", lengths)
    row_offsets = _int_array("row_offsets", row_offsets)
    if (step_sizes is None) != (step_offsets is None):
        raise ValueError("pass step_sizes and step_offsets together, or neither")
    if step_sizes is not None:
        step_sizes = _int_array("step_sizes", step_sizes)
        step_offsets = _int_array("step_offsets", step_offsets)
    given = [x is None for x in (segment_modalities, segment_lengths, segment_offsets)]
    if any(given) and not all(given):
        raise ValueError("pass segment_modalities, segment_lengths and segment_offsets together, or none")
    top = 127 if num_modalities is None else min(int(num_modalities), 128) - 1
    if segment_modalities is not None:
        segment_modalities = _int_array("segment_modalities", segment_modalities)
        segment_lengths = _int_array("segment_lengths", segment_lengths)
        segment_offsets = _int_array("segment_offsets", segment_offsets)
    empty = np.zeros(0, np.int64)
    if len(lengths) > _INT32_MAX or not _layout_valid(
            lengths, row_offsets, capacity, step_sizes is not None, empty if step_sizes is None else step_sizes,
            empty if step_offsets is None else step_offsets, segment_modalities is not None,
            empty if segment_modalities is None else segment_modalities,
            empty if segment_lengths is None else segment_lengths,
            empty if segment_offsets is None else segment_offsets, top):
        _explain_layout(lengths, row_offsets, capacity, step_sizes, step_offsets, segment_modalities,
                        segment_lengths, segment_offsets, top)
    return Layout(capacity, lengths, row_offsets, step_sizes, step_offsets, segment_modalities, segment_lengths,
                  segment_offsets)


def _explain_layout(lengths: np.ndarray, row_offsets: np.ndarray, capacity: int, step_sizes: np.ndarray | None,
                    step_offsets: np.ndarray | None, segment_modalities: np.ndarray | None,
                    segment_lengths: np.ndarray | None, segment_offsets: np.ndarray | None, top: int) -> None:
    """Raise the ValueError that says what :func:`_layout_valid` found wrong with a layout (the checks one by one,
    in numpy; none raises where nothing is wrong)."""
    _check_offsets("row_offsets", row_offsets, len(lengths), "documents")
    if len(lengths) > _INT32_MAX:
        raise ValueError(f"{len(lengths)} documents do not fit int32 document ids")
    bad = np.flatnonzero(lengths < 1)
    if bad.size:
        g = int(bad[0])
        raise ValueError(f"{_where(row_offsets, g)} has length {int(lengths[g])}; lengths must be >= 1")
    if lengths.size:
        csum = np.concatenate([[0], np.cumsum(lengths)])
        row_tokens = csum[row_offsets[1:]] - csum[row_offsets[:-1]]
        bad = np.flatnonzero(row_tokens > capacity)
        if bad.size:
            r = int(bad[0])
            raise ValueError(f"row {r} holds {int(row_tokens[r])} tokens, more than capacity {capacity}; "
                             "move a document to another row or raise capacity")
    if step_sizes is not None:
        _check_runs("step sizes", step_sizes, step_offsets, lengths, row_offsets)
    if segment_modalities is not None:
        if len(segment_modalities) != len(segment_lengths):
            raise ValueError(f"segment_modalities ({len(segment_modalities)}) and segment_lengths "
                             f"({len(segment_lengths)}) must have the same length")
        _check_runs("segments", segment_lengths, segment_offsets, lengths, row_offsets)
        bad = np.flatnonzero((segment_modalities < 0) | (segment_modalities > top))
        if bad.size:
            doc = int(np.searchsorted(segment_offsets, bad[0], side="right")) - 1
            raise ValueError(f"segment of {_where(row_offsets, doc)} has modality index "
                             f"{int(segment_modalities[bad[0]])}, outside [0, {top}]")


@njit(cache=True, nogil=True)
def _runs_valid(sizes: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> bool:
    """Runs (step sizes or segment lengths) that cover each document exactly: offsets from 0 to the last run,
    never decreasing, one a document and one more; every run positive; each document's runs summing to its
    length."""
    if offsets.shape[0] != lengths.shape[0] + 1 or offsets[0] != 0 or offsets[-1] != sizes.shape[0]:
        return False
    for d in range(lengths.shape[0]):  # never decreasing from 0 to the last run: every run below is inside
        if offsets[d + 1] < offsets[d]:
            return False
    for d in range(lengths.shape[0]):
        total = 0
        for i in range(offsets[d], offsets[d + 1]):
            if sizes[i] < 1:
                return False
            total += sizes[i]
        if total != lengths[d]:
            return False
    return True


@njit(cache=True, nogil=True)
def _layout_valid(lengths: np.ndarray, row_offsets: np.ndarray, capacity: int, has_steps: bool,
                  step_sizes: np.ndarray, step_offsets: np.ndarray, has_segments: bool, segment_modalities: np.ndarray,
                  segment_lengths: np.ndarray, segment_offsets: np.ndarray, top: int) -> bool:
    """Whether :func:`make_layout`'s checks all pass, in one pass over the arrays (its numpy checks then run only
    to say what failed)."""
    n = lengths.shape[0]
    if row_offsets.shape[0] < 1 or row_offsets[0] != 0 or row_offsets[-1] != n:
        return False
    for r in range(row_offsets.shape[0] - 1):  # never decreasing from 0 to n: every document below is inside
        if row_offsets[r + 1] < row_offsets[r]:
            return False
    for r in range(row_offsets.shape[0] - 1):
        tokens = 0
        for d in range(row_offsets[r], row_offsets[r + 1]):
            if lengths[d] < 1:
                return False
            tokens += lengths[d]
        if tokens > capacity:
            return False
    if has_steps and not _runs_valid(step_sizes, step_offsets, lengths):
        return False
    if has_segments:
        if segment_modalities.shape[0] != segment_lengths.shape[0] \
                or not _runs_valid(segment_lengths, segment_offsets, lengths):
            return False
        for i in range(segment_modalities.shape[0]):
            if segment_modalities[i] < 0 or segment_modalities[i] > top:
                return False
    return True


def _flatten(kind: str, nested: Sequence, rows: Sequence[Sequence[int]]) -> tuple[list, list[int]]:
    if len(nested) != len(rows):
        raise ValueError(f"{kind} has {len(nested)} rows but rows has {len(rows)}")
    flat: list = []
    offsets = [0]
    for r, (row, row_items) in enumerate(zip(rows, nested)):
        if len(row_items) != len(row):
            raise ValueError(f"{kind}[{r}] has {len(row_items)} entries but row {r} has {len(row)} documents")
        for d, items in enumerate(row_items):
            if items is None and kind == "step_sizes":
                items = [1] * int(row[d])
            elif items is None or isinstance(items, (int, np.integer)):
                raise TypeError(f"{kind}[{r}][{d}] must be a list, got {items!r}")
            flat.extend(items)
            offsets.append(len(flat))
    return flat, offsets


def layout_from_rows(rows: Sequence[Sequence[int]], capacity: int, *,
                     step_sizes: Sequence[Sequence[Sequence[int] | None]] | None = None,
                     segments: Sequence[Sequence[Sequence[tuple[int, int]]]] | None = None,
                     num_modalities: int | None = None) -> Layout:
    """Build a validated :class:`Layout` from nested lists.

    Args:
        rows: ``rows[r]`` the document lengths of row r, in order (a row may be empty: all padding).
        capacity: tokens per row.
        step_sizes: ``step_sizes[r][d]`` tokens per step of that document, summing to its length; None (for the
            whole batch or one document) means one token per step.
        segments: ``segments[r][d]`` runs ``(modality index, n_tokens)`` covering the document in order; None
            means every real token has modality 0.
        num_modalities: bound for the modality indices in ``segments``.

    >>> layout_from_rows([[3]], 4, step_sizes=[[[2, 1]]]).step_sizes.tolist()
    [2, 1]
    """
    if isinstance(rows, np.ndarray) or not isinstance(rows, Sequence):
        raise TypeError(f"rows must be a list of lists of document lengths, got {type(rows).__name__}")
    lengths: list[int] = []
    row_offsets = [0]
    for r, row in enumerate(rows):
        if isinstance(row, (int, np.integer)) or not isinstance(row, (Sequence, np.ndarray)):
            raise TypeError(f"rows[{r}] must be a list of document lengths, got {row!r}")
        lengths.extend(row)
        row_offsets.append(len(lengths))
    kwargs: dict = {}
    if step_sizes is not None:
        flat, offs = _flatten("step_sizes", step_sizes, rows)
        kwargs.update(step_sizes=np.asarray(flat), step_offsets=offs)
    if segments is not None:
        flat, offs = _flatten("segments", segments, rows)
        runs = np.asarray(flat) if flat else np.zeros((0, 2), np.int64)
        if runs.ndim != 2 or runs.shape[1] != 2:
            raise ValueError("segments[r][d] must be lists of (modality index, n_tokens) pairs")
        kwargs.update(segment_modalities=runs[:, 0], segment_lengths=runs[:, 1], segment_offsets=offs)
    return make_layout(np.asarray(lengths), row_offsets, capacity,
                       num_modalities=num_modalities, **kwargs)


@njit(cache=True)
def _metadata_kernel(lengths, row_offsets, step_sizes, step_offsets, seg_mod, seg_len, seg_offsets,
                     has_steps, has_segments, doc_out, pos_out, step_out, mod_out, cu_out):
    num_rows, capacity = doc_out.shape
    cu_out[0] = 0
    total = 0
    for r in range(num_rows):
        t = 0
        for g in range(row_offsets[r], row_offsets[r + 1]):
            n = lengths[g]
            doc_row = doc_out[r, t:t + n]
            pos_row = pos_out[r, t:t + n]
            step_row = step_out[r, t:t + n]
            mod_row = mod_out[r, t:t + n]
            for j in range(n):
                doc_row[j] = g
                pos_row[j] = j
            if has_steps:
                j = 0
                for s in range(step_offsets[g + 1] - step_offsets[g]):
                    for _ in range(step_sizes[step_offsets[g] + s]):
                        step_row[j] = s
                        j += 1
            else:
                for j in range(n):
                    step_row[j] = j
            if has_segments:
                j = 0
                for i in range(seg_offsets[g], seg_offsets[g + 1]):
                    m = seg_mod[i]
                    for _ in range(seg_len[i]):
                        mod_row[j] = m
                        j += 1
            else:
                for j in range(n):
                    mod_row[j] = 0
            t += n
            total += n
            cu_out[g + 1] = total
        for j in range(t, capacity):
            doc_out[r, j] = -1
            pos_out[r, j] = 0
            step_out[r, j] = -1
            mod_out[r, j] = -1


def _carve(shape: tuple[int, int], n_cu: int) -> tuple[np.ndarray, ...]:
    """Views of one allocation for the five outputs (int64 first so every view stays aligned).

    One large buffer instead of five arrays: separate multi-megabyte arrays each get fresh pages (and numpy's
    huge-page advice) from the allocator, which made page faults cost more than the kernel itself.
    """
    n = shape[0] * shape[1]
    buf = np.empty(8 * n + 4 * n + 4 * n + 4 * n_cu + n, np.uint8)
    pos = buf[: 8 * n].view(np.int64).reshape(shape)
    doc = buf[8 * n : 12 * n].view(np.int32).reshape(shape)
    step = buf[12 * n : 16 * n].view(np.int32).reshape(shape)
    cu = buf[16 * n : 16 * n + 4 * n_cu].view(np.int32)
    mod = buf[16 * n + 4 * n_cu :].view(np.int8).reshape(shape)
    return pos, doc, step, mod, cu


def document_metadata(layout: Layout) -> Metadata:
    """Per-token document, position, step and modality ids, cu_seqlens and max_seqlen of a :class:`Layout`.

    Documents are numbered 0, 1, 2, ... across the batch, row by row; positions restart at 0 with each
    document; step ids count the document's steps (one per token unless ``step_sizes`` says otherwise).
    """
    if not isinstance(layout, Layout):
        raise TypeError(f"layout must be a Layout (see make_layout), got {type(layout).__name__}")
    shape = (layout.num_rows, layout.capacity)
    if layout.lengths.sum() > _INT32_MAX:
        raise ValueError(f"{int(layout.lengths.sum())} tokens do not fit int32 cu_seqlens")
    pos, doc, step, mod, cu = _carve(shape, layout.num_documents + 1)
    def or_empty(a: np.ndarray | None) -> np.ndarray:
        return np.zeros(0, np.int64) if a is None else a

    _metadata_kernel(layout.lengths, layout.row_offsets, or_empty(layout.step_sizes), or_empty(layout.step_offsets),
                     or_empty(layout.segment_modalities), or_empty(layout.segment_lengths),
                     or_empty(layout.segment_offsets), layout.step_sizes is not None,
                     layout.segment_modalities is not None, doc, pos, step, mod, cu)
    max_seqlen = int(layout.lengths.max()) if layout.lengths.size else 0
    return Metadata(doc, pos, step, mod, cu, max_seqlen)


@njit(cache=True, inline="always")
def _pair_kind(q, k, block_size, lo, hi, lo_min, lo_max, hi_min, hi_max, one):
    """0 empty, 1 partial, 2 full: the tile (query block q, kv block k) from the two blocks' document/step spans
    (``one[b]``: the document filling all of block b, or -1)."""
    if q == k:  # every token sees itself: never empty; full for one-token blocks
        return 2 if block_size == 1 or (one[q] >= 0 and lo_max[q] <= lo_min[q]) else 1
    a, z = max(lo[q], lo[k]), min(hi[q], hi[k])
    if hi[q] < 0 or hi[k] < 0 or a > z:  # no real document in common
        return 0
    if a != z:  # more than one shared document: cannot happen for contiguous documents
        return 1
    if a != lo[q] and a != hi[q] or a != lo[k] and a != hi[k]:  # shared document only inside a block
        return 1
    q_max = lo_max[q] if a == lo[q] else hi_max[q]
    k_min = lo_min[k] if a == lo[k] else hi_min[k]
    if k_min > q_max:  # every key of the shared document is later than every query
        return 0
    return 2 if one[q] >= 0 and one[q] == one[k] and lo_max[k] <= lo_min[q] else 1


@njit(cache=True)
def _block_spans(doc, step, r, block_size, lo, hi, lo_min, lo_max, hi_min, hi_max, one):
    """Row r, per block: lowest/highest real document, the step range of each of those two, the document filling
    the whole block (-1 if none). Returns whether documents are contiguous runs (ids never decrease, no real
    token follows padding)."""
    capacity = doc.shape[1]
    big = np.iinfo(np.int64).max
    contiguous, prev, padded = True, -1, False
    for b in range(lo.shape[0]):
        start = b * block_size
        stop = min(start + block_size, capacity)
        d0 = doc[r, start] if stop > start else -1
        same = 0
        for i in range(start, stop):  # one document only (the usual block): vectorized scans
            same += doc[r, i] == d0
        if d0 >= 0 and same == stop - start:
            smin = smax = step[r, start]
            for i in range(start + 1, stop):
                smin, smax = min(smin, step[r, i]), max(smax, step[r, i])
            contiguous &= not padded and d0 >= prev
            prev = d0
            lo[b], hi[b], one[b] = d0, d0, d0 if stop - start == block_size else -1
            lo_min[b], lo_max[b], hi_min[b], hi_max[b] = smin, smax, smin, smax
            continue
        all_real = stop - start == block_size
        dl, dh = big, -1
        lmin = lmax = hmin = hmax = 0
        for i in range(start, stop):
            d = doc[r, i]
            if d < 0:
                all_real = False
                padded = True
                continue
            if padded or d < prev:
                contiguous = False
            prev = d
            s = step[r, i]
            if d < dl:
                dl, lmin, lmax = d, s, s
            elif d == dl:
                lmin, lmax = min(lmin, s), max(lmax, s)
            if d > dh:
                dh, hmin, hmax = d, s, s
            elif d == dh:
                hmin, hmax = min(hmin, s), max(hmax, s)
        lo[b], hi[b], one[b] = dl, dh, dl if all_real and dl == dh else -1
        lo_min[b], lo_max[b], hi_min[b], hi_max[b] = lmin, lmax, hmin, hmax
    return contiguous


@njit(cache=True)
def _classify_kernel(doc, step, block_size, nb):
    """Tile counts ``[2, R, 1, nb]`` (partial, full) and the kind (0 empty, 1 partial, 2 full) of every tile a
    query block can reach, flat: query block q of row r reaches kv blocks ``first[r, q] + j`` for
    ``j < offsets[r * nb + q + 1] - offsets[r * nb + q]``. Returns (counts, first, offsets, kinds)."""
    num_rows = doc.shape[0]
    nums = np.empty((2, num_rows, 1, nb), np.int32)
    first = np.empty((num_rows, nb), np.int64)
    offsets = np.empty(num_rows * nb + 1, np.int64)
    spans = np.empty((num_rows, 7, nb), np.int64)  # lo, hi, lo_min, lo_max, hi_min, hi_max, one
    last = np.empty(nb, np.int64)
    offsets[0] = 0
    for r in range(num_rows):
        lo, hi = spans[r, 0], spans[r, 1]
        contiguous = _block_spans(doc, step, r, block_size, lo, hi, spans[r, 2], spans[r, 3], spans[r, 4],
                                  spans[r, 5], spans[r, 6])
        # documents are contiguous runs: the blocks sharing one with query block q run from the first block of
        # q's lowest document to the last block of its highest; otherwise every block may
        for b in range(nb):
            first[r, b] = b
            if b > 0 and hi[b - 1] >= 0 and lo[b] == hi[b - 1]:
                first[r, b] = first[r, b - 1] if lo[b - 1] == hi[b - 1] else b - 1
        for b in range(nb - 1, -1, -1):
            last[b] = b
            if b < nb - 1 and hi[b] >= 0 and hi[b] == lo[b + 1]:
                last[b] = last[b + 1] if lo[b + 1] == hi[b + 1] else b + 1
        for q in range(nb):
            if not contiguous:
                first[r, q], last[q] = 0, nb - 1
            elif hi[q] < 0:
                first[r, q], last[q] = q, q
            offsets[r * nb + q + 1] = offsets[r * nb + q] + last[q] - first[r, q] + 1
    kinds = np.empty(offsets[-1], np.int8)
    for r in range(num_rows):
        lo, hi, lo_min, lo_max, hi_min, hi_max, one = spans[r]
        for q in range(nb):
            at, k0, d = offsets[r * nb + q], first[r, q], one[q]
            n_part = n_full = 0
            for j in range(offsets[r * nb + q + 1] - at):
                k = k0 + j
                if d >= 0 and one[k] == d:  # both blocks inside one document: compare their step ranges
                    kind = (lo_min[k] <= lo_max[q]) * (1 + (lo_max[k] <= lo_min[q]))
                else:
                    kind = _pair_kind(q, k, block_size, lo, hi, lo_min, lo_max, hi_min, hi_max, one)
                kinds[at + j] = kind
                n_part += kind == 1
                n_full += kind == 2
            nums[0, r, 0, q], nums[1, r, 0, q] = n_part, n_full
    return nums, first, offsets, kinds


@njit(cache=True)
def _indices_kernel(kinds, first, offsets, want, out, width):
    """Per query block: its kv blocks of kind ``want`` ascending, then the others ascending up to ``width``
    entries (torch's ``create_block_mask`` order, cut to ``width`` columns)."""
    num_rows, nb = first.shape
    for g in range(num_rows * nb):
        at, k0, n = offsets[g], first.flat[g], 0
        span = offsets[g + 1] - at
        row = out[g * width:(g + 1) * width]
        for j in range(span):
            if kinds[at + j] == want:
                row[n] = k0 + j
                n += 1
        k = 0
        while n < width:
            if k < k0 or k >= k0 + span or kinds[at + k - k0] != want:
                row[n] = k
                n += 1
            k += 1


def block_tables(document_ids: np.ndarray, step_ids: np.ndarray, block_size: int = 128) -> BlockTables:
    """Classify the (query block, kv block) pairs of each row as empty, partial or full under the attention rule.

    Works from per-block minima/maxima of the document and step ids: each query block is compared only with the
    kv blocks its first and last documents span (found at block granularity from where documents start), so
    time and table memory are O(R * C + R * nb * span), ``nb = ceil(C / block_size)``, span the most kv blocks a
    query block's documents cover (see :class:`BlockTables` for the layout); a capacity that is not a multiple
    of ``block_size`` is padded logically (the missing tokens count as padding). Exact for layouts whose
    documents are contiguous runs (everything :func:`document_metadata` produces); for other id arrays it
    compares every pair of blocks (span nb) and stays correct by calling more blocks partial.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    doc = np.ascontiguousarray(document_ids, dtype=np.int32)
    step = np.ascontiguousarray(step_ids, dtype=np.int32)
    if doc.ndim != 2 or doc.shape != step.shape:
        raise ValueError(f"document_ids and step_ids must both be [R, C], got {doc.shape} and {step.shape}")
    num_rows, capacity = doc.shape
    nb = max(1, -(-capacity // int(block_size)))
    nums, first, offsets, kinds = _classify_kernel(doc, step, int(block_size), nb)
    tables = []
    for want, num in ((1, nums[0]), (2, nums[1])):
        width = max(1, int(num.max())) if num.size else 1
        storage = _compact_storage(num_rows, nb, width)
        _indices_kernel(kinds, first, offsets, want, storage, width)
        tables += [num, _square_view(storage, num_rows, nb, width)]
    return BlockTables(*tables)


def _compact_storage(num_rows: int, nb: int, width: int) -> np.ndarray:
    """int32 storage for ``[R, 1, nb, width]`` rows back to back, then ``nb - width`` spare (zero) entries so that
    the last row of the ``[nb]``-wide view stays in bounds."""
    storage = np.empty(num_rows * nb * width + nb - width, np.int32)
    storage[num_rows * nb * width:] = 0
    return storage


def _square_view(storage: np.ndarray, num_rows: int, nb: int, width: int) -> np.ndarray:
    """The ``[R, 1, nb, nb]`` view torch reads of compact ``[R, 1, nb, width]`` rows (see :class:`BlockTables`)."""
    return np.ndarray((num_rows, 1, nb, nb), np.int32, storage, 0, (4 * nb * width,) * 2 + (4 * width, 4))


@njit(cache=True)
def _transpose_kernel(num, idx, nb, storage, width):
    """Rows of kv blocks -> rows of query blocks: kv block j lists, ascending, the query blocks whose row lists
    j, then the query blocks that do not, ascending, up to ``width`` entries."""
    fill = np.zeros(nb, np.int64)
    for r in range(num.shape[0]):
        fill[:] = 0
        for q in range(nb):
            for j in range(num[r, 0, q]):
                kv = idx[r, 0, q, j]
                storage[(r * nb + kv) * width + fill[kv]] = q
                fill[kv] += 1
        for kv in range(nb):
            base = (r * nb + kv) * width
            listed, q, at = fill[kv], 0, fill[kv]
            p = 0
            while at < width:  # the unlisted query blocks, ascending, merged past the listed ones
                if p < listed and storage[base + p] == q:
                    p += 1
                else:
                    storage[base + at] = q
                    at += 1
                q += 1


def transpose_tables(tables: BlockTables) -> BlockTables:
    """The query-block tables of ``tables`` (what ``BlockMask`` needs for the backward pass): ``q_num[r, 0, j]``
    query blocks attend kv block j partially, listed ascending in ``q_indices[r, 0, j]`` (then ``full_*``), in
    the compact layout of :class:`BlockTables`. Equal to torch's ``_transpose_ordered`` on the first ``num``
    entries of every row, in O(R * nb * width) instead of torch's dense ``[nb, nb]`` grid and its sort."""
    out = []
    c = tables.compact()
    for num, idx in ((c.kv_num_blocks, c.kv_indices), (c.full_kv_num_blocks, c.full_kv_indices)):
        num_rows, _, nb = num.shape
        listed = np.arange(idx.shape[-1]) < num[..., None]  # the entries that mean something
        row = np.broadcast_to(np.arange(num_rows).reshape(-1, 1, 1, 1), idx.shape)
        # how many query blocks list each kv block of each row: the transposed counts, and their widest
        q_num = np.bincount((row * nb + idx)[listed], minlength=num_rows * nb).astype(np.int32)
        q_num = q_num.reshape(num_rows, 1, nb)
        width = max(1, int(q_num.max())) if q_num.size else 1
        storage = _compact_storage(num_rows, nb, width)
        _transpose_kernel(num, idx, nb, storage, width)
        out += [q_num, _square_view(storage, num_rows, nb, width)]
    return BlockTables(*out)
