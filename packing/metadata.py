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
                  "make_layout"])

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

    ``kv_num_blocks[r, 0, i]`` partial kv blocks of query block i (they need the mask_mod), listed first and in
    ascending order in ``kv_indices[r, 0, i]`` (followed by the remaining block indices, ascending, as torch's
    own ``create_block_mask`` lays them out); ``full_*`` likewise for blocks where every pair may attend.
    """

    kv_num_blocks: np.ndarray  # [R, 1, nb]
    kv_indices: np.ndarray  # [R, 1, nb, nb]
    full_kv_num_blocks: np.ndarray  # [R, 1, nb]
    full_kv_indices: np.ndarray  # [R, 1, nb, nb]


def _int_array(name: str, values: object) -> np.ndarray:
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
    if (step_sizes is None) != (step_offsets is None):
        raise ValueError("pass step_sizes and step_offsets together, or neither")
    if step_sizes is not None:
        step_sizes = _int_array("step_sizes", step_sizes)
        step_offsets = _int_array("step_offsets", step_offsets)
        _check_runs("step sizes", step_sizes, step_offsets, lengths, row_offsets)
    given = [x is None for x in (segment_modalities, segment_lengths, segment_offsets)]
    if any(given) and not all(given):
        raise ValueError("pass segment_modalities, segment_lengths and segment_offsets together, or none")
    if segment_modalities is not None:
        segment_modalities = _int_array("segment_modalities", segment_modalities)
        segment_lengths = _int_array("segment_lengths", segment_lengths)
        segment_offsets = _int_array("segment_offsets", segment_offsets)
        if len(segment_modalities) != len(segment_lengths):
            raise ValueError(f"segment_modalities ({len(segment_modalities)}) and segment_lengths "
                             f"({len(segment_lengths)}) must have the same length")
        _check_runs("segments", segment_lengths, segment_offsets, lengths, row_offsets)
        top = 127 if num_modalities is None else min(int(num_modalities), 128) - 1
        bad = np.flatnonzero((segment_modalities < 0) | (segment_modalities > top))
        if bad.size:
            doc = int(np.searchsorted(segment_offsets, bad[0], side="right")) - 1
            raise ValueError(f"segment of {_where(row_offsets, doc)} has modality index "
                             f"{int(segment_modalities[bad[0]])}, outside [0, {top}]")
    return Layout(capacity, lengths, row_offsets, step_sizes, step_offsets, segment_modalities, segment_lengths,
                  segment_offsets)


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


@njit(cache=True)
def _block_tables_kernel(doc, step, block_size, kv_num, kv_idx, full_num, full_idx):
    num_rows, capacity = doc.shape
    nb = kv_num.shape[2]
    big = np.iinfo(np.int64).max
    # per block: lowest/highest real document, the step range of each of those two documents, all tokens real
    lo = np.empty(nb, np.int64)
    hi = np.empty(nb, np.int64)
    lo_min = np.empty(nb, np.int64)
    lo_max = np.empty(nb, np.int64)
    hi_min = np.empty(nb, np.int64)
    hi_max = np.empty(nb, np.int64)
    real = np.empty(nb, np.bool_)
    kind = np.empty(nb, np.int8)  # 0 empty, 1 partial, 2 full
    first = np.empty(nb, np.int64)
    last = np.empty(nb, np.int64)
    for r in range(num_rows):
        contiguous = True  # real document ids never decrease and no real token follows padding
        prev, padded = -1, False
        for i in range(capacity):
            d = doc[r, i]
            if d < 0:
                padded = True
            else:
                if padded or d < prev:
                    contiguous = False
                prev = d
        for b in range(nb):
            start = b * block_size
            stop = min(start + block_size, capacity)
            all_real = stop - start == block_size
            dl, dh = big, -1
            lmin = lmax = hmin = hmax = 0
            for i in range(start, stop):
                d = doc[r, i]
                if d < 0:
                    all_real = False
                    continue
                s = step[r, i]
                if d < dl:
                    dl, lmin, lmax = d, s, s
                elif d == dl:
                    lmin, lmax = min(lmin, s), max(lmax, s)
                if d > dh:
                    dh, hmin, hmax = d, s, s
                elif d == dh:
                    hmin, hmax = min(hmin, s), max(hmax, s)
            lo[b], hi[b], real[b] = dl, dh, all_real
            lo_min[b], lo_max[b], hi_min[b], hi_max[b] = lmin, lmax, hmin, hmax
        # kv blocks that can share a document with query block q lie in [first[q], last[q]]: from the first block
        # of q's lowest document to the last block of its highest (documents are contiguous runs)
        for b in range(nb):
            first[b] = b
            if b > 0 and hi[b - 1] >= 0 and lo[b] == hi[b - 1]:
                first[b] = first[b - 1] if lo[b - 1] == hi[b - 1] else b - 1
        for b in range(nb - 1, -1, -1):
            last[b] = b
            if b < nb - 1 and hi[b] >= 0 and hi[b] == lo[b + 1]:
                last[b] = last[b + 1] if lo[b + 1] == hi[b + 1] else b + 1
        for q in range(nb):
            k0, k1 = (first[q], last[q]) if hi[q] >= 0 else (q, q)
            if not contiguous:
                k0, k1 = 0, nb - 1
            for k in range(k0, k1 + 1):
                single = real[q] and real[k] and lo[q] == hi[q] and lo[k] == hi[k] and lo[q] == lo[k]
                if q == k:  # every token sees itself: never empty; full for one-token blocks
                    kind[k] = 2 if block_size == 1 or (single and lo_max[q] <= lo_min[q]) else 1
                    continue
                a, z = max(lo[q], lo[k]), min(hi[q], hi[k])
                if hi[q] < 0 or hi[k] < 0 or a > z:  # no real document in common
                    kind[k] = 0
                    continue
                if a != z:  # more than one shared document: cannot happen for contiguous documents
                    kind[k] = 1
                    continue
                if a == lo[q]:
                    q_max, q_min_ok = lo_max[q], True
                elif a == hi[q]:
                    q_max, q_min_ok = hi_max[q], True
                else:
                    q_max, q_min_ok = 0, False
                if a == lo[k]:
                    k_min, k_ok = lo_min[k], True
                elif a == hi[k]:
                    k_min, k_ok = hi_min[k], True
                else:
                    k_min, k_ok = 0, False
                if not (q_min_ok and k_ok):
                    kind[k] = 1
                elif k_min > q_max:  # every key of the shared document is later than every query
                    kind[k] = 0
                elif single and lo_max[k] <= lo_min[q]:
                    kind[k] = 2
                else:
                    kind[k] = 1
            n_part = n_full = 0
            for k in range(k0, k1 + 1):
                if kind[k] == 1:
                    kv_idx[r, 0, q, n_part] = k
                    n_part += 1
                elif kind[k] == 2:
                    full_idx[r, 0, q, n_full] = k
                    n_full += 1
            kv_num[r, 0, q], full_num[r, 0, q] = n_part, n_full
            for k in range(nb):
                if k < k0 or k > k1 or kind[k] != 1:
                    kv_idx[r, 0, q, n_part] = k
                    n_part += 1
                if k < k0 or k > k1 or kind[k] != 2:
                    full_idx[r, 0, q, n_full] = k
                    n_full += 1


def block_tables(document_ids: np.ndarray, step_ids: np.ndarray, block_size: int = 128) -> BlockTables:
    """Classify every (query block, kv block) pair of each row as empty, partial or full under the attention rule.

    Works from per-block minima/maxima of the document and step ids: each query block is compared only with the
    kv blocks its first and last documents span (found at block granularity from where documents start), so the
    classification costs O(R * C + R * sum of spans) and the only O(nb^2) work is writing the tables in torch's
    layout (``nb = ceil(C / block_size)``); a capacity that is not a multiple of ``block_size`` is padded logically
    (the missing tokens count as padding). Exact for layouts whose documents are contiguous runs (everything
    :func:`document_metadata` produces); for other id arrays it stays correct by calling more blocks partial.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) or block_size < 1:
        raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
    doc = np.ascontiguousarray(document_ids, dtype=np.int32)
    step = np.ascontiguousarray(step_ids, dtype=np.int32)
    if doc.ndim != 2 or doc.shape != step.shape:
        raise ValueError(f"document_ids and step_ids must both be [R, C], got {doc.shape} and {step.shape}")
    num_rows, capacity = doc.shape
    nb = max(1, -(-capacity // int(block_size)))
    kv_num = np.empty((num_rows, 1, nb), np.int32)
    kv_idx = np.empty((num_rows, 1, nb, nb), np.int32)
    full_num = np.empty((num_rows, 1, nb), np.int32)
    full_idx = np.empty((num_rows, 1, nb, nb), np.int32)
    _block_tables_kernel(doc, step, int(block_size), kv_num, kv_idx, full_num, full_idx)
    return BlockTables(kv_num, kv_idx, full_num, full_idx)
