"""Frame filters: which steps of each episode may anchor a sample, from ranges to keep and ranges to drop.

A filter names, per episode, ranges of control steps ``[start, end)``: ranges to **keep** (an episode named there
keeps only those; an episode not named keeps all its steps) and ranges to **drop** (taken out of whatever is
kept). What is left is a list of **segments**, disjoint runs of kept steps: the sample table cuts windows
(anchors) and whole-episode chunks from segments instead of whole episodes, so a filter is applied in the plan,
from the index alone, and the plan stays a pure function of the index, ``(seed, epoch)`` and the world size (exact
and elastic resume hold as they do without it). openpi's DROID idle filter, for one, keeps the steps where the
robot moves. A window anchored at a kept step may still read frames outside it (its history, its action chunk).

Everything here is a function of integer arrays (ranges are clipped to the episode; empty ones count for
nothing)::

    >>> episode, start, end = kept_segments(np.array([10, 6]), keep=(np.array([0, 0]), np.array([0, 6]),
    ...                                     np.array([3, 9])), drop=(np.array([1]), np.array([2]), np.array([4])))
    >>> episode.tolist(), start.tolist(), end.tolist()
    ([0, 0, 1, 1], [0, 6, 0, 4], [3, 9, 2, 6])
"""

from __future__ import annotations

import numpy as np

__all__ = ["Ranges", "kept_segments", "whole_episodes"]

Ranges = tuple[np.ndarray, np.ndarray, np.ndarray]
"""``(episode, start, end)`` int64 arrays of one length: steps ``[start, end)`` of each named episode."""


def whole_episodes(lengths: np.ndarray) -> Ranges:
    """Every episode as one segment ``[0, length)`` (empty episodes too: they hold no sample either way)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    return np.arange(n, dtype=np.int64), np.zeros(n, dtype=np.int64), lengths.copy()


def kept_segments(lengths: np.ndarray, *, keep: Ranges | None = None, drop: Ranges | None = None) -> Ranges:
    """The segments of kept steps: ``(episode, start, end)`` int64, sorted by episode then start, disjoint,
    non-empty and maximal (two kept ranges that touch are one segment).

    lengths: int64 ``[E]`` steps of each episode. keep: ranges to keep (an episode named here keeps only these);
    drop: ranges taken out. Ranges are clipped to ``[0, length)``; ValueError names an episode out of range or a
    range whose end is before its start.
    """
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and (not np.issubdtype(lengths.dtype, np.integer) or lengths.min() < 0)):
        raise ValueError("episode lengths must be a 1-D array of integers >= 0")
    lengths = lengths.astype(np.int64)
    if keep is None and drop is None:
        return _non_empty(*whole_episodes(lengths))
    base = whole_episodes(lengths)
    if keep is not None:
        keep = _checked(keep, lengths, "keep")
        named = np.zeros(len(lengths), dtype=bool)
        named[keep[0]] = True
        base = tuple(np.concatenate([b[~named[base[0]]], k]) for b, k in zip(base, keep))
    kept = _union(*base, lengths)
    if drop is None:
        return kept
    drop = _union(*_checked(drop, lengths, "drop"), lengths)
    return _difference(kept, drop, lengths)


def _checked(ranges: Ranges, lengths: np.ndarray, what: str) -> Ranges:
    episode, start, end = (np.asarray(a, dtype=np.int64).reshape(-1) for a in ranges)
    if not len(episode) == len(start) == len(end):
        raise ValueError(f"{what} ranges need one episode, start and end each, got {len(episode)}, {len(start)} and "
                         f"{len(end)}")
    bad = np.flatnonzero((episode < 0) | (episode >= len(lengths)))
    if bad.size:
        raise ValueError(f"{what} range {int(bad[0])} names episode {int(episode[bad[0]])}; there are "
                         f"{len(lengths)} episodes (0..{len(lengths) - 1})")
    bad = np.flatnonzero(end < start)
    if bad.size:
        raise ValueError(f"{what} range {int(bad[0])} of episode {int(episode[bad[0]])} ends at step "
                         f"{int(end[bad[0]])}, before its start {int(start[bad[0]])}")
    size = lengths[episode]
    return episode, np.clip(start, 0, size), np.clip(end, 0, size)


def _non_empty(episode: np.ndarray, start: np.ndarray, end: np.ndarray) -> Ranges:
    keep = end > start
    return episode[keep], start[keep], end[keep]


def _keys(episode: np.ndarray, step: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Steps of all episodes on one axis (episode ``e`` from its offset): ranges of different episodes never
    meet there, since each lies within its episode's ``[0, length]``, and a gap of 1 separates episodes."""
    offsets = np.concatenate([[0], np.cumsum(lengths + 1)])
    return offsets[episode] + step


def _union(episode: np.ndarray, start: np.ndarray, end: np.ndarray, lengths: np.ndarray) -> Ranges:
    """The ranges merged where they overlap or touch, sorted."""
    episode, start, end = _non_empty(episode, start, end)
    if not len(episode):
        return episode, start, end
    lo, hi = _keys(episode, start, lengths), _keys(episode, end, lengths)
    order = np.lexsort((hi, lo))
    lo, hi, episode = lo[order], hi[order], episode[order]
    reach = np.maximum.accumulate(hi)  # ranges sorted by start: each run of overlapping ones reaches this far
    new = np.concatenate([[True], lo[1:] > reach[:-1]])
    first = np.flatnonzero(new)
    last = np.concatenate([first[1:], [len(lo)]]) - 1
    offsets = np.concatenate([[0], np.cumsum(lengths + 1)])
    ep = episode[first]
    return ep, lo[first] - offsets[ep], reach[last] - offsets[ep]


def _difference(kept: Ranges, drop: Ranges, lengths: np.ndarray) -> Ranges:
    """Kept ranges less the dropped ones (both sorted, disjoint): cut at every boundary of either, keep the
    pieces inside a kept range and outside every dropped one, then join the pieces that touch."""
    if not len(kept[0]) or not len(drop[0]):
        return kept
    k_lo, k_hi = _keys(kept[0], kept[1], lengths), _keys(kept[0], kept[2], lengths)
    d_lo, d_hi = _keys(drop[0], drop[1], lengths), _keys(drop[0], drop[2], lengths)
    points = np.unique(np.concatenate([k_lo, k_hi, d_lo, d_hi]))
    lo, hi = points[:-1], points[1:]
    inside_kept = _covered(lo, k_lo, k_hi)
    inside_drop = _covered(lo, d_lo, d_hi)
    pieces = inside_kept & ~inside_drop
    lo, hi = lo[pieces], hi[pieces]
    if not len(lo):
        empty = np.zeros(0, np.int64)
        return empty, empty.copy(), empty.copy()
    new = np.concatenate([[True], lo[1:] != hi[:-1]])
    first = np.flatnonzero(new)
    last = np.concatenate([first[1:], [len(lo)]]) - 1
    offsets = np.concatenate([[0], np.cumsum(lengths + 1)])
    episode = np.searchsorted(offsets, lo[first], side="right") - 1
    return episode.astype(np.int64), lo[first] - offsets[episode], hi[last] - offsets[episode]


def _covered(points: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Whether each point lies in one of the sorted, disjoint ranges ``[lo, hi)``."""
    i = np.searchsorted(lo, points, side="right") - 1
    return (i >= 0) & (hi[np.maximum(i, 0)] > points)
