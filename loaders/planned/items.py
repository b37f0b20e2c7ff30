"""Items: what a planned dataset plans over. Each kind prices its samples from the index and reads them.

- :class:`EpisodeItems`: samples cut from an episode source, either windows (one per ``stride`` steps, each feature
  at its window times, LeRobot-style) or whole-episode chunks (every frame of every feature the layout prices,
  split at ``max_length`` steps or where a chunk would not fit a row). A source made of several datasets
  (``open_dataset([a, b])``) is a mixture: ``weights`` set each dataset's share of an epoch's samples.
- :class:`RecordItems` (:mod:`mmfeed.loaders.planned.records`): the samples of any map-style dataset, priced by a
  given length.

Every item kind is an :class:`~mmfeed.loaders.planned.reads.Items`: a ``table``
(:class:`~mmfeed.packing.samples.SampleTable`: its samples, priced from the index, what the epoch is planned from)
and ``reads(samples)`` (what those samples read, as data: :class:`~mmfeed.loaders.planned.reads.EpisodeReads` or
:class:`~mmfeed.loaders.planned.reads.RecordReads`). The planned dataset (:mod:`mmfeed.loaders.planned.dataset`)
plans over the table and hands a step's reads to :func:`~mmfeed.loaders.planned.collate.collate_batch`; items
never collate, and collation never calls them back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmfeed.codecs.text import ByteTokenizer
from mmfeed.loaders.planned.filters import FrameFilter
from mmfeed.loaders.planned.reads import EpisodeReads, SampleRead, WindowSamples
from mmfeed.loaders.planned.records import RecordItems
from mmfeed.loaders.sources.base import EpisodeSource
from mmfeed.loaders.sources.options import device_of
from mmfeed.loaders.sources.requests import WindowArrays, chunk_requests, per_sample, window_arrays
from mmfeed.packing.layout import SampleLayout, TokenLayout
from mmfeed.packing.mixture import Weights
from mmfeed.packing.samples import LONG_EPISODES, EpisodeIndex, SampleTable
from mmfeed.packing.windows import WindowSpec

__all__ = ["EpisodeItems", "RecordItems", "episode_index"]


class EpisodeItems:
    """Samples of an episode source: its sample table (:class:`~mmfeed.packing.samples.SampleTable`, priced from
    the index) and how they are read.

    source: the episodes (:func:`mmfeed.loaders.open_dataset`).
    layout: token prices by feature name; ``window``: the features and times of windowed samples, or None for
        whole-episode chunks of the features ``layout.tokens_per_frame`` names.
    stride: steps between window anchors; max_length: longest chunk in steps (None: whole episodes).
    capacity: the row size chunks must fit; long_episodes: chunks that do not fit are "split" into consecutive
        chunks that do (default) or cut after the first ("truncate"), counted in ``stats`` either way.
    tokenizer: ``encode(str) -> ids`` for task text (default UTF-8 bytes).
    weights: for a source of several datasets, each one's share of an epoch's samples (one number per dataset,
        "size" or :class:`~mmfeed.packing.mixture.SizeWeights`; None: every sample once).
    frame_filter: the steps that may anchor a window or be covered by a chunk
        (:class:`~mmfeed.loaders.planned.filters.FrameFilter`; None: every step).
    """

    def __init__(self, source: EpisodeSource, *, layout: TokenLayout, window: WindowSpec | None = None,
                 stride: int = 1, max_length: int | None = None, capacity: int | None = None,
                 long_episodes: str = "split", tokenizer: Any = None, weights: Weights = None,
                 frame_filter: FrameFilter | None = None) -> None:
        if long_episodes not in LONG_EPISODES:
            raise ValueError(f"long_episodes must be one of {list(LONG_EPISODES)}, got {long_episodes!r}")
        index = self._setup(source, layout, window, tokenizer)
        segments = None if frame_filter is None else frame_filter.segments(source)
        if window is not None:
            self.table = SampleTable.windows(index, layout, window, stride=stride, weights=weights, segments=segments)
        else:
            self.table = SampleTable.chunks(index, layout, self.features, max_length=max_length, capacity=capacity,
                                            long_episodes=long_episodes, weights=weights, segments=segments)

    @classmethod
    def of_samples(cls, source: EpisodeSource, episode: np.ndarray, start: np.ndarray, length: np.ndarray | None,
                   *, layout: TokenLayout, window: WindowSpec | None = None, tokenizer: Any = None) -> EpisodeItems:
        """Items of samples already cut, ``(episode, start[, length])`` (length for chunks): how a stream collates
        the samples it holds with the very code that collates planned ones."""
        items = cls.__new__(cls)
        index = items._setup(source, layout, window, tokenizer)
        items.table = SampleTable.of_samples(index, layout, episode, start, length, window=window,
                                             features=items.features)
        return items

    def _setup(self, source: EpisodeSource, layout: TokenLayout, window: WindowSpec | None,
               tokenizer: Any) -> EpisodeIndex:
        """Check the features, encode the task texts; the index the sample table is made from."""
        device = device_of(source)
        if device is not None:
            raise ValueError(f"{source.name}: the packed loader lays samples out in host (shared) memory, but the "
                             f"dataset decodes frames onto {device} (device=); read it through windows() with the "
                             "drop-in DataLoader, or open it without device= and give DataLoader(device=...)")
        self.source, self.layout, self.window = source, layout, window
        self.features = window.features if window is not None else list(layout.tokens_per_frame)
        _check_features(source, layout, self.features, chunked=window is None)
        self.tokenizer = tokenizer or ByteTokenizer()
        self.text = [np.asarray(self.tokenizer.encode(t), dtype=np.int32) for t in source.tasks]
        self._layouts: dict[Any, SampleLayout] = {}
        return episode_index(source, self.features, np.array([len(t) for t in self.text], dtype=np.int64))

    @property
    def stats(self) -> dict[str, int]:
        """What cutting whole-episode chunks did: ``split_episodes``, ``truncated_steps``."""
        return self.table.stats

    def __len__(self) -> int:
        return len(self.table)

    # -- reading -------------------------------------------------------------------------------------------------
    def requests(self, samples: np.ndarray) -> list[SampleRead]:
        """What each sample reads and how it is laid out (:class:`SampleRead`), in the order given."""
        return list(self._requests(samples)[0])

    def _requests(self, samples: np.ndarray) -> tuple[Sequence[SampleRead], WindowArrays | None]:
        """:meth:`requests`, and the windows as arrays where every sample reads every feature (else None); the
        reads are then a :class:`~mmfeed.loaders.planned.reads.WindowSamples`, made sample by sample only when
        asked."""
        samples = np.asarray(samples, dtype=np.int64)
        tasks = self.table.tasks(samples)
        episodes, starts = self.table.locate(samples)
        tasks = np.asarray(tasks).tolist()
        texts = {task: self._text(task) for task in set(tasks)}
        if self.window is not None:
            windows, here = window_arrays(self.source, self.window, episodes, starts)
            if not here:  # every sample reads every feature: one layout a task
                names = tuple(windows.indices)
                by_task = {task: self._window_layout(names, task) for task in texts}
                return WindowSamples(samples, windows, [by_task[t] for t in tasks], tasks, [texts[t] for t in tasks],
                                     starts), windows
            reads = per_sample(windows, here)
            layouts = [self._window_layout(tuple(request.indices), task) for task, (request, _) in zip(tasks, reads)]
            pads = [p for _, p in reads]
        else:
            reads = chunk_requests(self.source, self.features, episodes, starts, self.table.lengths(samples))
            layouts = [self.sample_layout(times, task) for task, (_, _, times) in zip(tasks, reads)]
            pads = [p for _, p, _ in reads]
        return [SampleRead(s, read[0], pad, lay, task, texts[task], start)
                for s, read, pad, lay, task, start in zip(samples.tolist(), reads, pads, layouts, tasks,
                                                          np.asarray(starts).tolist())], None

    def _window_layout(self, names: tuple[str, ...], task: int) -> SampleLayout:
        """:meth:`sample_layout` of a window: its pieces are the spec's times of the features present, so the
        names alone key it (the pieces are built only the first time)."""
        cached = self._layouts.get((task, ("window", names)))
        if cached is None:
            cached = self.sample_layout({f: self.window.deltas[f] for f in names}, task, key=("window", names))
        return cached

    def _text(self, task: int) -> np.ndarray:
        return self.text[task] if task >= 0 else _NO_TEXT

    def sample_layout(self, pieces: Mapping[str, Sequence[float]], task: int, key: Any = None) -> SampleLayout:
        """The token layout of a sample with these frame times and task (cached: few distinct ones exist);
        ``key``, when given, identifies ``pieces`` without reading every time."""
        if key is None:
            key = tuple((f, tuple(np.round(np.asarray(t, dtype=np.float64) * 1e6).astype(np.int64).tolist()))
                        for f, t in pieces.items())
        key = (task, key)
        cached = self._layouts.get(key)
        if cached is None:
            cached = self._layouts[key] = self.layout.sample(pieces, len(self.text[task]) if task >= 0 else 0)
        return cached

    def reads(self, samples: np.ndarray) -> EpisodeReads:
        """What ``samples`` read, for collation: the source, their :meth:`requests`, the layout and features (and
        windows as arrays, where every sample reads every feature)."""
        reads, windows = self._requests(samples)
        return EpisodeReads(self.source, reads, self.layout, self.features, windows=windows)


_NO_TEXT = np.zeros(0, np.int32)


def episode_index(source: EpisodeSource, features: Sequence[str], text_lengths: np.ndarray) -> EpisodeIndex:
    """What the sample table needs of ``source`` for ``features``: lengths, rates, tasks, presence, datasets."""
    return EpisodeIndex(lengths=np.asarray(source.lengths, dtype=np.int64), fps=source.fps,
                        tasks=np.asarray(source.episode_tasks, dtype=np.int64), text_lengths=text_lengths,
                        rates={f: source.rates(f) for f in features}, present={f: source.present(f) for f in features},
                        step_tasks=source.step_tasks, dataset=_dataset_of(source))


def _check_features(source: EpisodeSource, layout: TokenLayout, features: Sequence[str], *, chunked: bool) -> None:
    if not features:
        raise ValueError("whole-episode chunks read the features TokenLayout.tokens_per_frame prices; it names none"
                         if chunked else "the window names no feature")
    for feature in features:
        if feature not in source.features:
            raise ValueError(f"{source.name}: the {'layout' if chunked else 'window'} names feature {feature!r}, "
                             f"which the dataset does not have; its features are {sorted(source.features)}")
        if source.features[feature].kind == "video" and feature not in layout.tokens_per_frame:
            raise ValueError(f"video feature {feature!r} has no price: give TokenLayout(tokens_per_frame="
                             f"{{{feature!r}: n}}), the tokens one frame becomes")


def _dataset_of(source: EpisodeSource) -> np.ndarray:
    """Which dataset of a mixed source each episode comes from (all 0 for a single dataset)."""
    of = getattr(source, "dataset_of", None)
    return np.asarray(of, dtype=np.int64) if of is not None else np.zeros(len(source), dtype=np.int64)
