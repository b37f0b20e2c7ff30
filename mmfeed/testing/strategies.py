"""Hypothesis strategies for packing research tests: length arrays, capacities and packed layouts.

Users import these in their own property tests::

    from hypothesis import given
    from mmfeed.testing.strategies import capacities, lengths

    @given(lengths(max_length=100), capacities(min_value=100, max_value=200))
    def test_every_item_is_placed(lens, cap):
        from mmfeed.packing import pack
        assert (pack(lens, cap).bin_of >= 0).all()

All strategies draw plain integers, so hypothesis shrinks failures to small, readable cases. They need
hypothesis, which mmfeed does not install by itself: ``pip install "mmfeed[testing]"``.
"""

from __future__ import annotations

import numpy as np

try:
    from hypothesis import strategies as st
    from hypothesis.strategies import SearchStrategy
except ModuleNotFoundError as exc:  # an optional extra: say which
    raise ModuleNotFoundError(f"mmfeed.testing.strategies needs hypothesis: pip install \"mmfeed[testing]\" ({exc})",
                              name=exc.name) from exc

__all__ = sorted(["capacities", "lengths", "packed_layouts", "step_sizes_for"])


def _positive(name: str, value: int, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def lengths(*, min_size: int = 0, max_size: int = 200, max_length: int = 1000) -> SearchStrategy[np.ndarray]:
    """1-D int64 arrays of item lengths in ``[0, max_length]`` with ``min_size..max_size`` items.

    Zero-length items are included on purpose (the packers place them and they cost nothing); filter them out
    with ``.map(lambda a: a[a > 0])`` when a test needs positive lengths.
    """
    _positive("min_size", min_size, 0)
    _positive("max_size", max_size, 0)
    _positive("max_length", max_length, 0)
    if min_size > max_size:
        raise ValueError(f"min_size={min_size} must be <= max_size={max_size}")
    return st.lists(st.integers(0, max_length), min_size=min_size, max_size=max_size).map(
        lambda xs: np.asarray(xs, dtype=np.int64).reshape(-1)
    )


def capacities(*, min_value: int = 1, max_value: int = 2048) -> SearchStrategy[int]:
    """Row capacities (plain ints) in ``[min_value, max_value]``, powers of two and others alike."""
    _positive("min_value", min_value)
    _positive("max_value", max_value)
    if min_value > max_value:
        raise ValueError(f"min_value={min_value} must be <= max_value={max_value}")
    return st.integers(min_value, max_value)


def step_sizes_for(length: int) -> SearchStrategy[list[int]]:
    """Per-step token counts of one document of ``length`` tokens (positive ints summing to ``length``).

    Draws one of three attention styles: token-causal (all ones), block-causal (equal blocks, e.g. a frame of
    ``b`` tokens per step, with a shorter last block when ``b`` does not divide ``length``) and bidirectional
    (one step holding the whole document).
    """
    _positive("length", length)

    @st.composite
    def _draw(draw: st.DrawFn) -> list[int]:
        kind = draw(st.sampled_from(["causal", "block", "bidirectional"]))
        if kind == "causal":
            return [1] * length
        if kind == "bidirectional":
            return [length]
        block = draw(st.integers(1, length))
        steps = [block] * (length // block)
        if length % block:
            steps.append(length % block)
        return steps

    return _draw()


def packed_layouts(
    *, max_rows: int = 4, max_capacity: int = 64, max_docs: int = 8
) -> SearchStrategy[tuple[list[list[int]], int, list[list[list[int]]]]]:
    """Packed batches as ``(rows, capacity, step_sizes)``.

    ``rows`` holds ``1..max_rows`` rows, each a list of at most ``max_docs`` document lengths (each >= 1) whose
    sum is <= ``capacity`` (a row may be empty, i.e. all padding); ``capacity`` is in ``[1, max_capacity]``;
    ``step_sizes[r][d]`` is a list of positive ints summing to ``rows[r][d]`` (token-causal, block-causal or
    bidirectional, see :func:`step_sizes_for`).
    """
    _positive("max_rows", max_rows)
    _positive("max_capacity", max_capacity)
    _positive("max_docs", max_docs, 0)

    @st.composite
    def _draw(draw: st.DrawFn) -> tuple[list[list[int]], int, list[list[list[int]]]]:
        capacity = draw(st.integers(1, max_capacity))
        num_rows = draw(st.integers(1, max_rows))
        rows: list[list[int]] = []
        steps: list[list[list[int]]] = []
        for _ in range(num_rows):
            num_docs = draw(st.integers(0, max_docs))
            row: list[int] = []
            row_steps: list[list[int]] = []
            free = capacity
            for _ in range(num_docs):
                if free < 1:
                    break
                length = draw(st.integers(1, free))
                free -= length
                row.append(length)
                row_steps.append(draw(step_sizes_for(length)))
            rows.append(row)
            steps.append(row_steps)
        return rows, capacity, steps

    return _draw()
