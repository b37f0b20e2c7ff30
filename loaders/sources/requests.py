"""Requests: what a source reads, and the one place where samples become reads.

An :class:`EpisodeRequest` names frames of one episode, per feature, at each feature's own rate. A window
``(episode, anchor step)`` asks each feature for the frames at its times (:func:`window_requests`), a chunk of
steps every frame the clock implies there (:func:`chunk_requests`); both say which of those frames are padding
(``is_pad``: a time outside the episode, or a frame a stream lacks), for the packed loader, the stream and
``ds.windows`` alike. A leaf of the sources: it imports no source (they are read through what they index).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from mmfeed.packing.windows import WindowSpec, chunk_frames, clamp_to_stream, window_indices

__all__ = ["EpisodeRequest", "Indexed", "WindowArrays", "chunk_requests", "per_sample", "window_arrays",
           "window_requests"]


class Indexed(Protocol):
    """What requests read of a source (every :class:`~mmfeed.loaders.sources.base.EpisodeSource` is one): the
    episodes' lengths and control rates, and each feature's rate, frame count, presence and zero fill."""

    @property
    def lengths(self) -> np.ndarray: ...

    @property
    def fps(self) -> np.ndarray: ...

    def rates(self, feature: str) -> np.ndarray: ...

    def frames(self, feature: str) -> np.ndarray: ...

    def present(self, feature: str) -> np.ndarray: ...

    def filled(self, feature: str) -> np.ndarray | None: ...


@dataclass(frozen=True)
class EpisodeRequest:
    """Frames of one episode to read: feature -> frame indices at that feature's rate (int64, any order, repeats
    allowed).

    out: optional feature -> preallocated uint8 ``[n, H, W, 3]`` array for a video feature's frames, which the
        source decodes into (and returns) instead of allocating; a source may ignore it.
    """

    episode: int
    indices: Mapping[str, np.ndarray]
    out: Mapping[str, np.ndarray] | None = None


@dataclass(frozen=True, eq=False)
class WindowArrays:
    """The windows of a batch whose every sample reads every feature, as arrays: each sample's ``episodes``
    (int64 ``[B]``) and, per feature, the frame ``indices`` (int64 ``[B, n]``) and ``pads`` (bool ``[B, n]``)
    it reads, in sample order: what a source reads a batch from in one call
    (:meth:`~mmfeed.loaders.sources.base.EpisodeSource.read_windows`)."""

    episodes: np.ndarray
    indices: dict[str, np.ndarray]
    pads: dict[str, np.ndarray]


def window_arrays(source: Indexed, spec: WindowSpec, episodes: np.ndarray, anchors: np.ndarray
                  ) -> tuple[WindowArrays, dict[str, list[bool]]]:
    """What the windows ``(episode, anchor step)`` read, as arrays (:class:`WindowArrays`), and, for each feature
    some of their episodes lack (a mixture's), which samples hold it (empty: every sample reads every feature)."""
    episodes = np.asarray(episodes, dtype=np.int64)
    anchors = np.asarray(anchors, dtype=np.int64)
    lengths, fps = source.lengths[episodes], source.fps[episodes]
    indices, pads, here = {}, {}, {}
    for feature, deltas in spec.deltas.items():
        idx, pad = window_indices(
            deltas, anchor_steps=anchors, fps=fps, length=lengths, rate=source.rates(feature)[episodes],
            frames=source.frames(feature)[episodes], tolerance_s=spec.tolerance_s)
        filled = source.filled(feature)
        if filled is not None:  # delivered as zeros: every frame is padding
            pad = pad | filled[episodes][:, None]
        indices[feature], pads[feature] = idx, pad
        present = source.present(feature)[episodes]
        if not present.all():
            here[feature] = present.tolist()
    return WindowArrays(episodes, indices, pads), here


def window_requests(source: Indexed, spec: WindowSpec, episodes: np.ndarray, anchors: np.ndarray
                    ) -> list[tuple[EpisodeRequest, dict[str, np.ndarray]]]:
    """What each window ``(episode, anchor step)`` reads (frame indices per feature at its own rate) and its
    ``is_pad`` flags per feature; the one place where windows become reads, for the packed loader and
    ``ds.windows`` alike."""
    return per_sample(*window_arrays(source, spec, episodes, anchors))


def per_sample(windows: WindowArrays, here: Mapping[str, list[bool]]
               ) -> list[tuple[EpisodeRequest, dict[str, np.ndarray]]]:
    """:func:`window_requests` of arrays: each sample's request and ``is_pad`` flags (``here``: which samples hold
    the features only some hold)."""
    # per-sample rows and flags taken out as lists once: indexing numpy per sample and feature costs more
    rows = {f: list(v) for f, v in windows.indices.items()}
    flags = {f: list(v) for f, v in windows.pads.items()}
    names, ids = list(rows), windows.episodes.tolist()
    if not here:  # the usual batch: every sample reads every feature
        return [(EpisodeRequest(e, dict(zip(names, r))), dict(zip(names, p)))
                for e, r, p in zip(ids, zip(*rows.values()), zip(*flags.values()))]
    keep = [[f for f in names if f not in here or here[f][k]] for k in range(len(ids))]
    return [(EpisodeRequest(e, {f: rows[f][k] for f in fs}), {f: flags[f][k] for f in fs})
            for k, (e, fs) in enumerate(zip(ids, keep))]


def chunk_requests(source: Indexed, features: Sequence[str], episodes: np.ndarray, starts: np.ndarray,
                   lengths: np.ndarray) -> list[tuple[EpisodeRequest, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """What each chunk of control steps ``[start, start + length)`` reads: every frame the clock implies of each
    feature in the chunk's time span, its ``is_pad`` flags (True for a frame the stream lacks, having ended early;
    its last frame is read instead) and each frame's time from the chunk's first step."""
    episodes = np.asarray(episodes, dtype=np.int64)
    starts, lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
    fps = source.fps[episodes]
    spans = {}
    for feature in features:
        rate = source.rates(feature)[episodes]
        first, count = chunk_frames(starts, starts + lengths, length=source.lengths[episodes], fps=fps, rate=rate)
        filled = source.filled(feature)
        spans[feature] = (first, count, rate, source.frames(feature)[episodes], source.present(feature)[episodes],
                          np.zeros(len(episodes), bool) if filled is None else filled[episodes])
    out = []
    for k, e in enumerate(episodes):
        indices, pads, times = {}, {}, {}
        for feature, (first, count, rate, frames, present, filled) in spans.items():
            if not present[k]:
                continue
            j = np.arange(first[k], first[k] + count[k], dtype=np.int64)
            indices[feature], pads[feature] = clamp_to_stream(j, frames[k])
            if filled[k]:  # delivered as zeros: every frame is padding
                pads[feature] = np.ones(len(j), bool)
            times[feature] = j / rate[k] - starts[k] / fps[k]
        out.append((EpisodeRequest(int(e), indices), pads, times))
    return out
