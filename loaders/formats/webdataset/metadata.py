"""A webdataset shard index checked against the shards' members, cheaply, when the shards open
(:func:`index_episodes`): lengths >= 0, fps and every feature's rate finite and > 0, and each feature's frame count
what the episode's length needs at its rate (the rule of :func:`~mmfeed.packing.windows.fewest_frames`) and no
more than its member's bytes hold, so a length is bounded by what the members hold. What disagrees is a
:class:`~mmfeed.loaders.sources.consistency.Verdict`, refused or skipped by
:func:`~mmfeed.loaders.sources.consistency.settle`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmfeed.loaders.sources.consistency import Verdict
from mmfeed.packing.windows import check_stream_frames, fewest_frames

__all__ = ["index_episodes"]

_TINY_VIDEO = 64  # a member this small is no video: it fails when read, naming what is wrong with it


def _row_bytes(column: Mapping[str, Any]) -> int:
    """Bytes of one frame of an index's array feature (its step shape times its dtype's size)."""
    try:
        return int(np.prod(column["shape"], dtype=object)) * np.dtype(column["dtype"]).itemsize
    except TypeError:
        return 0


def index_episodes(arrays: Any, shards: Sequence[str], name: str) -> Verdict:
    """The episodes of a shard index (:class:`~mmfeed.loaders.stores.index_arrays.IndexArrays`; ``shards``
    resolved) whose lengths, rates or frame counts are impossible: a negative length, an fps or a feature rate
    that is not a finite number > 0, a negative frame count, a feature with fewer frames than the episode's
    length needs at its rate (:func:`~mmfeed.packing.windows.fewest_frames`: at most one frame short), or a video
    member claiming more frames than it has bytes (members under 64 bytes, no video at all, fail when read) or an
    array member more frames than its bytes hold. Vectorized over the episodes, feature by feature."""
    length = np.asarray(arrays.lengths, np.int64)
    fps = np.asarray(arrays.fps, np.float64)
    n = len(length)
    negative = length < 0
    bad_fps = ~(np.isfinite(fps) & (fps > 0))
    columns = list(arrays.features.items())
    problems = np.full(n, -1, np.int64)  # the first feature that fails, per episode
    kinds = np.zeros(n, np.int8)  # 1 rate, 2 frames < 0, 3 too few frames, 4 frames beyond the member's bytes
    ok_clock = ~(negative | bad_fps)
    safe_fps = np.where(ok_clock, fps, 1.0)
    safe_length = np.where(ok_clock, length, 0)
    for j, (feature, column) in enumerate(columns):
        rate = np.asarray(column["fps"], np.float64)
        frames = np.asarray(column["frames"], np.int64)
        bad_rate = ~(np.isfinite(rate) & (rate > 0))
        with np.errstate(invalid="ignore", over="ignore"):  # an absurd rate ratio overflows: negative, refused
            need = fewest_frames(safe_length, safe_fps, np.where(bad_rate, safe_fps, rate))
        short = ok_clock & ~bad_rate & ((frames < need) | (need < 0))
        size = np.asarray(column["size"], np.float64)
        if column["kind"] == "video":  # a frame takes a byte at least
            over = frames > np.maximum(size, _TINY_VIDEO)
        else:  # an array's frames take their bytes (floats: a lying count cannot overflow)
            over = frames.astype(np.float64) * _row_bytes(column) > size
        for kind, mask in ((1, bad_rate), (2, frames < 0), (3, short), (4, over)):
            new = mask & (problems < 0)
            problems[new], kinds[new] = j, kind
    bad = negative | bad_fps | (problems >= 0)

    def where(k: int) -> str:
        return f"{name}: {shards[arrays.shard_of[k]]} key {arrays.ids[k].as_py()!r}"

    def reason(k: int) -> str:
        at = where(k)
        if negative[k]:
            return f"{at}: length {length[k]} is negative; an episode has 0 steps or more"
        if bad_fps[k]:
            return f"{at}: fps {float(fps[k])!r} must be a finite number > 0"
        feature, column = columns[problems[k]]
        rate, frames = float(column["fps"][k]), int(column["frames"][k])
        if kinds[k] == 1:
            return f"{at}: feature {feature!r} has rate {rate!r}; a rate is a finite number > 0"
        if kinds[k] == 2:
            return f"{at}: feature {feature!r} has {frames} frames; a member holds 0 frames or more"
        if kinds[k] == 4 and column["kind"] == "video":
            return (f"{at}: feature {feature!r} claims {frames} frames, but its video member has "
                    f"{int(column['size'][k])} bytes")
        if kinds[k] == 4:
            return (f"{at}: feature {feature!r} claims {frames} frames of {column['dtype']} {list(column['shape'])} "
                    f"({_row_bytes(column)} bytes each), but its .npy member has {int(column['size'][k])} bytes")
        try:
            check_stream_frames(frames, length=int(length[k]), fps=float(fps[k]), rate=rate,
                                where=f"{at} feature {feature!r}")
        except ValueError as err:
            return f"{err} (length {int(length[k])} in the index)"
        return f"{at} feature {feature!r}: {frames} frames for length {int(length[k])}"  # not reached

    def what(k: int) -> tuple[Any, str]:
        return arrays.ids[k].as_py(), shards[arrays.shard_of[k]]

    return Verdict(bad, reason, what)
