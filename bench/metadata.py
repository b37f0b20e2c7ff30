"""Benchmarks of the attention metadata: ids + cu_seqlens throughput and block_mask() build time.

Each figure is the median of several timed repeats after a warm-up, beside a baseline measured in the same run:
a straightforward numpy implementation for the ids, torch's eager ``create_block_mask`` for the BlockMask.
``mmfeed bench packing`` prints these rows next to the bin-packing ones::

    >>> rows = metadata_benchmarks(quick=True)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from mmfeed.packing.metadata import Layout, block_tables, document_metadata, make_layout

__all__ = ["metadata_benchmarks", "numpy_metadata"]

log = logging.getLogger(__name__)


def _median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _fill_rows(rng: np.random.Generator, num_rows: int, capacity: int, median: float) -> Layout:
    """Rows filled next-fit with lognormal document lengths (the last document of a row is cut to fit)."""
    lengths, offsets = [], [0]
    for _ in range(num_rows):
        free = capacity
        while free > 0:
            n = int(min(free, max(1, rng.lognormal(np.log(median), 1.0))))
            lengths.append(n)
            free -= n
            if rng.random() < 0.05:  # leave some padding now and then
                break
        offsets.append(len(lengths))
    return make_layout(np.asarray(lengths, np.int64), offsets, capacity)


def numpy_metadata(layout: Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The straightforward vectorized numpy version (token-causal), the baseline of the kernel."""
    num_rows, capacity = layout.num_rows, layout.capacity
    lengths = layout.lengths
    docs_per_row = np.diff(layout.row_offsets)
    row_of_doc = np.repeat(np.arange(num_rows), docs_per_row)
    csum = np.concatenate([[0], np.cumsum(lengths)])
    start_in_row = csum[:-1] - csum[layout.row_offsets[:-1]][row_of_doc]
    flat_start = row_of_doc * capacity + start_in_row
    token_flat = np.repeat(flat_start, lengths) + (np.arange(csum[-1]) - np.repeat(csum[:-1], lengths))
    doc = np.full(num_rows * capacity, -1, np.int32)
    pos = np.zeros(num_rows * capacity, np.int64)
    step = np.full(num_rows * capacity, -1, np.int32)
    doc[token_flat] = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    local = np.arange(csum[-1]) - np.repeat(csum[:-1], lengths)
    pos[token_flat] = local
    step[token_flat] = local
    cu = csum.astype(np.int32)
    return doc.reshape(num_rows, capacity), pos.reshape(num_rows, capacity), step.reshape(num_rows, capacity), cu


def _row(name: str, value: float, unit: str, baseline: float | None, target: str, ok: bool | None,
         higher_is_better: bool = True) -> dict:
    ratio = None
    if baseline:
        ratio = value / baseline if higher_is_better else baseline / value
    return dict(name=name, value=float(value), unit=unit, baseline=None if baseline is None else float(baseline),
                ratio=None if ratio is None else float(ratio), target=target, ok=ok)


def metadata_benchmarks(quick: bool = False) -> list[dict]:
    """Run the metadata benchmarks; one dict per figure: name, value, unit, baseline, ratio, target, ok.

    ``ratio`` is always "times better than the baseline" (throughput / baseline throughput, or baseline time /
    time). ``quick`` uses fewer repeats and a smaller id batch.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # single thread, as the targets are stated
    try:
        return _run(quick)
    finally:
        torch.set_num_threads(threads)


def _run(quick: bool) -> list[dict]:
    from torch.nn.attention.flex_attention import create_block_mask  # torch only when benchmarking

    from mmfeed.packing.batch import PackedBatch

    repeats = 3 if quick else 15
    rng = np.random.default_rng(0)
    num_rows, capacity = (16, 8192) if quick else (64, 8192)
    layout = _fill_rows(rng, num_rows, capacity, median=600.0)
    slots = num_rows * capacity

    t_kernel = _median_seconds(lambda: document_metadata(layout), repeats)
    t_numpy = _median_seconds(lambda: numpy_metadata(layout), repeats)
    ref, fast = numpy_metadata(layout), document_metadata(layout)
    assert np.array_equal(ref[0], fast.document_ids) and np.array_equal(ref[3], fast.cu_seqlens)
    out = [_row(f"metadata ids+cu_seqlens, {num_rows}x{capacity}", slots / t_kernel / 1e6, "M tokens/s",
                slots / t_numpy / 1e6, ">= 300 M tokens/s", slots / t_kernel >= 300e6)]

    # one 8192-token row holding 200 documents
    lengths = rng.multinomial(8192 - 200, np.full(200, 1 / 200)) + 1
    batch = PackedBatch.from_lengths([lengths.tolist()], 8192)
    doc, step = batch.document_ids.numpy(), batch.step_ids.numpy()
    t_tables = _median_seconds(lambda: block_tables(doc, step, 128), repeats * 4)
    t_block = _median_seconds(batch.block_mask, repeats * 4)
    mod = batch.mask_mod(128)
    t_create = _median_seconds(lambda: create_block_mask(mod, 1, 1, 8192, 8192, device="cpu"),
                               1 if quick else 3)
    out.append(_row("block tables kernel, 1x8192, 200 docs", t_tables * 1e3, "ms", None, "(part of block_mask)",
                    None))
    out.append(_row("block_mask(), 1x8192, 200 docs", t_block * 1e3, "ms", t_create * 1e3,
                    "< 5 ms (baseline: eager create_block_mask)", t_block < 5e-3, higher_is_better=False))
    for row in out:
        log.info("%s: %.3g %s (baseline %s)", row["name"], row["value"], row["unit"], row["baseline"])
    return out


if __name__ == "__main__":  # pragma: no cover
    for r in metadata_benchmarks(quick=False):
        base = "" if r["baseline"] is None else f"  baseline {r['baseline']:.4g}  x{r['ratio']:.1f}"
        print(f"{r['name']:<45} {r['value']:>10.4g} {r['unit']:<11}{base}  target {r['target']}  ok={r['ok']}")
