"""Items: what a planned dataset plans over. Each kind prices its samples from the index and reads them.

- :class:`EpisodeItems`: samples cut from an episode source, either windows (one per ``stride`` steps, each feature
  at its window times, LeRobot-style) or whole-episode chunks (every frame of every feature the layout prices,
  split at ``max_length`` steps or where a chunk would not fit a row). A source made of several datasets
  (``open_dataset([a, b])``) is a mixture: ``weights`` set each dataset's share of an epoch's samples.
- :class:`RecordItems` (:mod:`mmfeed.loaders.records`): the samples of any map-style dataset, priced by a
  given length.

An item kind has ``tokens`` (int64 ``[n]``: each sample's price), ``groups`` (each sample's episode, or None),
``draw(seed, epoch)`` (the samples of an epoch, or None for each once) and ``collate(rows, ...)`` (the
:class:`~mmfeed.packing.PackedBatch` of one planned batch); the planned dataset
(:mod:`mmfeed.loaders.planned`) does the rest once for all kinds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mmfeed.codecs.text import ByteTokenizer
from mmfeed.loaders.records import RecordItems
from mmfeed.loaders.sources.base import EpisodeRequest, EpisodeSource
from mmfeed.packing import PackedBatch
from mmfeed.packing.layout import SampleLayout, TokenLayout
from mmfeed.packing.mixture import weighted_draw
from mmfeed.packing.windows import WindowSpec, chunk_frames, clamp_to_stream, episode_chunks, window_indices

__all__ = ["LONG_EPISODES", "EpisodeItems", "EpisodeWindows", "RecordItems", "SampleColumn", "chunk_requests",
           "window_requests"]

LONG_EPISODES = ("split", "truncate")


def window_requests(source: EpisodeSource, spec: WindowSpec, episodes: np.ndarray, anchors: np.ndarray
                    ) -> list[tuple[EpisodeRequest, dict[str, np.ndarray]]]:
    """What each window ``(episode, anchor step)`` reads (frame indices per feature at its own rate) and its
    ``is_pad`` flags per feature; the one place where windows become reads, for the packed loader and
    ``ds.windows`` alike."""
    episodes = np.asarray(episodes, dtype=np.int64)
    anchors = np.asarray(anchors, dtype=np.int64)
    lengths, fps = source.lengths[episodes], source.fps[episodes]
    idx, pad, present = {}, {}, {}
    for feature, deltas in spec.deltas.items():
        idx[feature], pad[feature] = window_indices(
            deltas, anchor_steps=anchors, fps=fps, length=lengths, rate=source.rates(feature)[episodes],
            frames=source.frames(feature)[episodes], tolerance_s=spec.tolerance_s)
        present[feature] = source.present(feature)[episodes]
    return [(EpisodeRequest(int(e), {f: v[k] for f, v in idx.items() if present[f][k]}),
             {f: v[k] for f, v in pad.items() if present[f][k]}) for k, e in enumerate(episodes)]


def chunk_requests(source: EpisodeSource, features: Sequence[str], episodes: np.ndarray, starts: np.ndarray,
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
        spans[feature] = (first, count, rate, source.frames(feature)[episodes], source.present(feature)[episodes])
    out = []
    for k, e in enumerate(episodes):
        indices, pads, times = {}, {}, {}
        for feature, (first, count, rate, frames, present) in spans.items():
            if not present[k]:
                continue
            j = np.arange(first[k], first[k] + count[k], dtype=np.int64)
            indices[feature], pads[feature] = clamp_to_stream(j, frames[k])
            times[feature] = j / rate[k] - starts[k] / fps[k]
        out.append((EpisodeRequest(int(e), indices), pads, times))
    return out


class EpisodeItems:
    """Samples of an episode source, priced from its index.

    source: the episodes (:func:`mmfeed.loaders.open_dataset`).
    layout: token prices by feature name; ``window``: the features and times of windowed samples, or None for
        whole-episode chunks of the features ``layout.tokens_per_frame`` names.
    stride: steps between window anchors; max_length: longest chunk in steps (None: whole episodes).
    capacity: the row size chunks must fit; long_episodes: chunks that do not fit are "split" into consecutive
        chunks that do (default) or cut after the first ("truncate"), counted in ``stats`` either way.
    tokenizer: ``encode(str) -> ids`` for task text (default UTF-8 bytes).
    weights: for a source of several datasets, each one's share of an epoch's samples (None: every sample once).
    """

    def __init__(self, source: EpisodeSource, *, layout: TokenLayout, window: WindowSpec | None = None,
                 stride: int = 1, max_length: int | None = None, capacity: int | None = None,
                 long_episodes: str = "split", tokenizer: Any = None,
                 weights: Sequence[float] | None = None) -> None:
        if long_episodes not in LONG_EPISODES:
            raise ValueError(f"long_episodes must be one of {list(LONG_EPISODES)}, got {long_episodes!r}")
        self._setup(source, layout, window, tokenizer)
        lengths = np.asarray(source.lengths, dtype=np.int64)
        if window is not None:
            self._set_windows(lengths, stride)
            per_episode = self._windows.per_episode
        else:
            self._cut_chunks(lengths, max_length, capacity, long_episodes)
            per_episode = np.bincount(self.episode, minlength=len(lengths))
        self.groups = self.episode
        self._draw = None
        if weights is not None:
            sizes = np.bincount(_dataset_of(source), weights=per_episode, minlength=len(weights)).astype(np.int64)
            self._draw = (sizes, np.asarray(weights, dtype=np.float64))
            weighted_draw(sizes, self._draw[1], seed=0, epoch=0)  # validates the weights

    @classmethod
    def of_samples(cls, source: EpisodeSource, episode: np.ndarray, start: np.ndarray, length: np.ndarray | None,
                   *, layout: TokenLayout, window: WindowSpec | None = None, tokenizer: Any = None) -> EpisodeItems:
        """Items of samples already cut, ``(episode, start[, length])`` (length for chunks): how a stream collates
        the samples it holds with the very code that collates planned ones."""
        items = cls.__new__(cls)
        items._setup(source, layout, window, tokenizer)
        items._set_samples(np.asarray(episode, dtype=np.int64), np.asarray(start, dtype=np.int64),
                           None if length is None else np.asarray(length, dtype=np.int64))
        items.groups, items._draw = items.episode, None
        return items

    def _setup(self, source: EpisodeSource, layout: TokenLayout, window: WindowSpec | None, tokenizer: Any) -> None:
        self.source, self.layout, self.window = source, layout, window
        self.features = window.features if window is not None else list(layout.tokens_per_frame)
        _check_features(source, layout, self.features, chunked=window is None)
        self.tokenizer = tokenizer or ByteTokenizer()
        self.text = [np.asarray(self.tokenizer.encode(t), dtype=np.int32) for t in source.tasks]
        self.stats: dict[str, int] = {"split_episodes": 0, "truncated_steps": 0}
        self._layouts: dict[Any, SampleLayout] = {}

    def _set_samples(self, episode: np.ndarray, start: np.ndarray, length: np.ndarray | None = None) -> None:
        """Take these samples and price them: windows (``length`` None) or chunks of ``length`` steps."""
        self._windows = None
        self.episode, self.start = episode, start
        self.length = np.ones(len(episode), dtype=np.int64) if length is None else length
        self.task = self._sample_tasks(episode, start)
        if self.window is not None:
            self.tokens = self._window_prices(episode, self.task)
        else:
            self.tokens = self.layout.price(self._chunk_counts(episode, start, self.length),
                                            self._text_lengths(self.task))

    def _set_windows(self, lengths: np.ndarray, stride: int) -> None:
        """One window every ``stride`` steps of every episode, stored per episode only: the per-sample columns
        (``episode``, ``start``, ``length``, ``task``, ``tokens``) compute the samples asked of them."""
        self._windows = EpisodeWindows(lengths, stride)
        n = len(self._windows)
        self.episode, self.start, self.length, self.task, self.tokens = (
            SampleColumn(self, name, n) for name in ("episode", "start", "length", "task", "tokens"))

    @property
    def uniform_price(self) -> int | None:
        """The one token price of every sample, when all samples cost the same (per-frame windows whose features
        and task text have one size across episodes), else None. A planned dataset then plans arithmetically,
        without a price per sample (:class:`~mmfeed.packing.uniform.UniformPlan`)."""
        if not hasattr(self, "_uniform"):
            self._uniform = self._find_uniform_price()
        return self._uniform

    def _find_uniform_price(self) -> int | None:
        if self._windows is None:
            prices = np.unique(np.asarray(self.tokens))
            return int(prices[0]) if len(prices) == 1 else None
        have = self._windows.per_episode > 0
        if not have.any():
            return None
        task = self.source.episode_tasks[have].astype(np.int64)
        if (task < 0).any():  # some episode changes task: every task's text must then have one length
            text = np.unique(self._text_lengths(np.arange(len(self.text), dtype=np.int64)))
            if len(text) > 1:
                return None
            task = np.where(task < 0, 0, task)
        prices = np.unique(self._window_prices(np.flatnonzero(have), task))
        return int(prices[0]) if len(prices) == 1 else None

    @property
    def price_runs(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(run_lengths, run_prices)``, int64: windowed samples as runs of consecutive ids of one price (each
        episode's windows, split where its task text changes length), or None for chunks. A planned dataset packs
        windows by price class from these (:class:`~mmfeed.packing.classes.ClassPlan`), nothing per sample."""
        if self._windows is None:
            return None
        if not hasattr(self, "_runs"):
            self._runs = self._find_price_runs()
        return self._runs

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_runs", None)  # per episode: a worker derives it again rather than receive it
        return state

    def _find_price_runs(self) -> tuple[np.ndarray, np.ndarray]:
        per_episode = self._windows.per_episode
        task = self.source.episode_tasks.astype(np.int64)
        prices = self._window_prices(np.arange(len(per_episode)), task)
        changing = np.flatnonzero((task < 0) & (per_episode > 0))
        if not len(changing):
            return per_episode, prices
        lengths, values, done = [], [], 0
        for e in changing:  # such an episode: one run per stretch of windows of one price
            lengths.append(per_episode[done:e])
            values.append(prices[done:e])
            first = self._windows.ends[e] - per_episode[e]
            price = self._column("tokens", np.arange(first, first + per_episode[e], dtype=np.int64))
            starts = np.concatenate([[0], np.flatnonzero(np.diff(price)) + 1])
            lengths.append(np.diff(np.append(starts, len(price))))
            values.append(price[starts])
            done = e + 1
        lengths.append(per_episode[done:])
        values.append(prices[done:])
        return np.concatenate(lengths).astype(np.int64), np.concatenate(values).astype(np.int64)

    @property
    def min_price(self) -> int:
        """The lowest token price of a sample (1 when there are none)."""
        price = self.uniform_price
        if price is not None:
            return price
        runs = self.price_runs
        if runs is not None:
            prices = runs[1][runs[0] > 0]
            return int(prices.min()) if len(prices) else 1
        tokens = np.asarray(self.tokens)
        return int(tokens.min()) if len(tokens) else 1

    def _whole_column(self, name: str) -> np.ndarray:
        """Every sample's value of the column ``name``, built per episode where the value is the episode's (one
        array of the samples' size, not a temporary per step of the computation)."""
        per_episode = self._windows.per_episode
        if name == "episode":
            return np.repeat(np.arange(len(per_episode), dtype=np.int64), per_episode)
        if name not in ("task", "tokens"):
            return self._column(name, np.arange(len(self._windows), dtype=np.int64))
        task = self.source.episode_tasks.astype(np.int64)
        if name == "task":
            values = np.repeat(task, per_episode)
        else:
            values = np.repeat(self._window_prices(np.arange(len(per_episode)), task), per_episode)
        changing = np.flatnonzero((task < 0) & (per_episode > 0))
        if len(changing):  # episodes whose task changes: their samples one by one
            ends = self._windows.ends
            ids = np.concatenate([np.arange(ends[e] - per_episode[e], ends[e]) for e in changing])
            values[ids] = self._column(name, ids)
        return values

    def _column(self, name: str, samples: np.ndarray) -> np.ndarray:
        """Values of the per-sample column ``name`` for ``samples`` (windows stored per episode)."""
        episode, start = self._windows.locate(samples)
        if name == "episode":
            return episode
        if name == "start":
            return start
        if name == "length":
            return np.ones(len(samples), dtype=np.int64)
        task = self._sample_tasks(episode, start)
        return task if name == "task" else self._window_prices(episode, task)

    def _window_prices(self, episode: np.ndarray, task: np.ndarray) -> np.ndarray:
        """The token price of windows in episodes ``episode`` with tasks ``task`` (the features they read are the
        spec's features present in the episode)."""
        counts = {f: len(d) * self.source.present(f)[episode] for f, d in self.window.deltas.items()}
        return self.layout.price(counts, self._text_lengths(task))

    def __len__(self) -> int:
        return len(self.episode)

    def draw(self, seed: int, epoch: int) -> np.ndarray | None:
        """The samples of one epoch (ids, any order; a sample may repeat), or None: every sample once."""
        if self._draw is None:
            return None
        return weighted_draw(*self._draw, seed=seed, epoch=epoch)

    # -- reading -------------------------------------------------------------------------------------------------
    def requests(self, samples: np.ndarray) -> list[tuple[EpisodeRequest, dict, SampleLayout]]:
        """``(request, is_pad flags, layout)`` of each sample."""
        samples = np.asarray(samples, dtype=np.int64)
        tasks = np.asarray(self.task[samples])
        if self.window is not None:
            reads = window_requests(self.source, self.window, self.episode[samples], self.start[samples])
            out = []
            for task, (request, pads) in zip(tasks, reads):
                # a window's pieces are the spec's times of the features present: the names alone key its layout
                names = tuple(request.indices)
                pieces = {f: self.window.deltas[f] for f in names}
                out.append((request, pads, self.sample_layout(pieces, int(task), key=("window", names))))
            return out
        reads = chunk_requests(self.source, self.features, self.episode[samples], self.start[samples],
                               self.length[samples])
        return [(request, pads, self.sample_layout(times, int(task)))
                for task, (request, pads, times) in zip(tasks, reads)]

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

    def collate(self, rows: Sequence[np.ndarray], capacity: int, **kwargs: Any) -> PackedBatch:
        """The PackedBatch of ``rows`` (sample ids per row); see :func:`mmfeed.loaders.collate.collate`."""
        from mmfeed.loaders.collate import collate

        return collate(self, rows, capacity, **kwargs)

    # -- pricing -------------------------------------------------------------------------------------------------
    def _sample_tasks(self, episode: np.ndarray, start: np.ndarray) -> np.ndarray:
        """The task id of each sample: its episode's, or its anchor step's where the episode changes task."""
        task = self.source.episode_tasks[episode].astype(np.int64)
        varies = np.flatnonzero(task < 0)
        if len(varies):
            for e in np.unique(episode[varies]):
                mine = varies[episode[varies] == e]
                task[mine] = self.source.step_tasks(int(e))[start[mine]]
        return task

    def _text_lengths(self, task: np.ndarray) -> np.ndarray:
        per_task = np.array([len(t) for t in self.text] + [0], dtype=np.int64)
        return per_task[np.where(task >= 0, task, len(self.text))]

    def _chunk_counts(self, episode: np.ndarray, start: np.ndarray, length: np.ndarray) -> dict[str, np.ndarray]:
        src = self.source
        return {f: chunk_frames(start, start + length, length=src.lengths[episode], fps=src.fps[episode],
                                rate=src.rates(f)[episode])[1] * src.present(f)[episode]
                for f in self.features}

    def _cut_chunks(self, lengths: np.ndarray, max_length: int | None, capacity: int | None, policy: str) -> None:
        longest = int(max_length or lengths.max(initial=1))
        while True:
            episode, start, length = episode_chunks(lengths, max(longest, 1))
            self._set_samples(episode, start, length)
            tokens = self.tokens
            if capacity is None or not len(tokens) or tokens.max() <= capacity:
                break
            if longest <= 1:
                raise ValueError(f"capacity {capacity} cannot hold one step of a whole-episode chunk "
                                 f"({int(tokens.max())} tokens with its text); raise the capacity or shrink the layout")
            # Shrink in proportion to the overshoot, at least one step a round.
            longest = max(1, min(longest - 1, int(longest * capacity / int(tokens.max()))))
        self.stats["split_episodes"] = int(np.sum(np.bincount(episode, minlength=len(lengths)) > 1))
        if policy == "truncate":
            first = start == 0
            self.stats["truncated_steps"] = int(length[~first].sum())
            self.stats["split_episodes"] = 0
            self.episode, self.start, self.length = episode[first], start[first], length[first]
            self.task, self.tokens = self.task[first], tokens[first]


class EpisodeWindows:
    """The windows ``(episode, anchor step)`` taken every ``stride`` steps of every episode, episode-major, from
    cumulative counts per episode: memory per episode, not per window (a quarter of a billion per-frame windows
    over a million episodes cost 16 MB)."""

    def __init__(self, lengths: np.ndarray, stride: int) -> None:
        if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
            raise ValueError(f"stride must be an integer >= 1 (steps between anchors), got {stride!r}")
        self.stride = int(stride)
        self.per_episode = (np.asarray(lengths, dtype=np.int64) + self.stride - 1) // self.stride
        self.ends = np.cumsum(self.per_episode)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def locate(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int64 ``(episode, anchor step)`` of each sample id (what :func:`mmfeed.packing.windows.episode_windows`
        gives at that id)."""
        samples = np.asarray(samples, dtype=np.int64)
        episode = np.searchsorted(self.ends, samples, side="right")
        first = self.ends[episode] - self.per_episode[episode]
        return episode.astype(np.int64), (samples - first) * self.stride


class SampleColumn:
    """One per-sample column of windowed items, computed for the samples indexed (``column[ids]``, ``column[i]``,
    a slice or a mask); ``np.asarray(column)`` computes every sample's value (O(samples), for the eager plan)."""

    def __init__(self, items: EpisodeItems, name: str, size: int) -> None:
        self._items, self._name, self._size = items, name, size

    def __len__(self) -> int:
        return self._size

    @property
    def shape(self) -> tuple[int]:
        return (self._size,)

    ndim, dtype = 1, np.dtype(np.int64)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not -self._size <= key < self._size:
                raise IndexError(f"sample {key} out of range ({self._size} samples)")
            return self._items._column(self._name, np.array([int(key) % self._size]))[0]
        if isinstance(key, slice):
            return self._items._column(self._name, np.arange(self._size, dtype=np.int64)[key])
        ids = np.asarray(key)
        if ids.dtype == bool:
            if ids.shape != (self._size,):
                raise IndexError(f"a mask over {self._size} samples has shape {ids.shape}")
            ids = np.flatnonzero(ids)
        if ids.size and (ids.dtype.kind not in "iu" or ids.min() < -self._size or ids.max() >= self._size):
            raise IndexError(f"sample ids out of range ({self._size} samples)")
        return self._items._column(self._name, ids.astype(np.int64) % max(self._size, 1)).reshape(ids.shape)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = self._items._whole_column(self._name)
        return values if dtype is None else values.astype(dtype)

    def __iter__(self):
        return iter(self[:])

    # comparisons as numpy's, over every sample (``items.episode == 3``)
    __hash__ = None

    def __eq__(self, other: Any) -> np.ndarray:  # type: ignore[override]
        return self[:] == other

    def __ne__(self, other: Any) -> np.ndarray:  # type: ignore[override]
        return self[:] != other

    def __lt__(self, other: Any) -> np.ndarray:
        return self[:] < other

    def __le__(self, other: Any) -> np.ndarray:
        return self[:] <= other

    def __gt__(self, other: Any) -> np.ndarray:
        return self[:] > other

    def __ge__(self, other: Any) -> np.ndarray:
        return self[:] >= other

    def __repr__(self) -> str:
        return f"SampleColumn({self._name!r}, {self._size} samples)"


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
