"""The sample table: every sample of an epoch and its price in tokens, from the index alone.

A sample is cut from an episode, either a **window** (anchored at a step, each feature read at the times of a
:class:`~mmfeed.packing.windows.WindowSpec`; one every ``stride`` steps) or a **chunk** (every frame of some
features over a run of consecutive steps, whole episodes split where a chunk would not fit a row). Its price is
what the :class:`~mmfeed.packing.layout.TokenLayout` charges for the frames it holds and its task text. The table
works from plain arrays of the index (:class:`EpisodeIndex`), never from pixels, and stores windows per episode
(their ids are located from cumulative counts: a quarter of a billion per-frame windows over a million episodes
cost 16 MB), so everything here is a function of integer arrays:

- the columns of any samples: :meth:`SampleTable.locate` (episode, start step), :meth:`SampleTable.tasks`,
  :meth:`SampleTable.prices`, and every sample's price and episode at once for a plan that needs them
  (:attr:`SampleTable.tokens`, :attr:`SampleTable.groups`);
- what the planner chooses by (:mod:`mmfeed.packing.epoch`): the one price of every sample when there is one
  (:attr:`SampleTable.uniform_price`), windows as runs of one price (:attr:`SampleTable.price_runs`), the cheapest
  price, and a mixture's weighted draw of an epoch's samples (:meth:`SampleTable.draw`).

Every price goes through one function (:meth:`SampleTable.prices`): the frames each feature reads times its
tokens, plus the text of the sample's task, which is its episode's, or its anchor step's where the episode changes
task::

    >>> import numpy as np
    >>> from mmfeed.packing.layout import TokenLayout
    >>> from mmfeed.packing.windows import WindowSpec
    >>> index = EpisodeIndex.of(lengths=[3, 2], fps=[10.0, 10.0], tasks=[0, 0], text_lengths=[4])
    >>> table = SampleTable.windows(index, TokenLayout(), WindowSpec.from_delta_timestamps({"state": [-0.1, 0.0]}))
    >>> len(table), table.prices(np.arange(5)).tolist(), table.uniform_price
    (5, [6, 6, 6, 6, 6], 6)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from mmfeed.packing.classes import PriceClasses
from mmfeed.packing.filters import Ranges
from mmfeed.packing.layout import TokenLayout
from mmfeed.packing.mixture import Weights, mixture_weights, weighted_draw
from mmfeed.packing.windows import WindowSpec, chunk_frames, episode_chunks

__all__ = ["LONG_EPISODES", "EpisodeIndex", "EpisodeWindows", "SampleTable"]

LONG_EPISODES = ("split", "truncate")
"""What happens to a whole-episode chunk that does not fit a row: split into consecutive chunks that do, or cut
after the first."""


@dataclass(frozen=True, eq=False, kw_only=True)
class EpisodeIndex:
    """What planning knows of each of ``E`` episodes, from the index alone.

    lengths: int64 ``[E]`` steps of the control clock; fps: float64 ``[E]`` its rate.
    rates, present: feature -> ``[E]`` arrays: the feature's rate, and whether the episode has it (a mixture's
        datasets may differ). A feature missing from ``rates`` runs at the clock, from ``present`` is in every
        episode. (Prices count the frames the clock implies: a stream that ended early is priced the same, its
        missing frame read as its last and flagged, so frame counts are not needed here.)
    tasks: int64 ``[E]``: each episode's task id, -1 where it changes within the episode (then ``step_tasks(e)``
        gives the task id of every step of episode ``e``).
    text_lengths: int64 ``[T]``: the tokens of each task's text.
    dataset: int64 ``[E]``: which dataset of a mixture each episode belongs to (None: one dataset).
    """

    lengths: np.ndarray
    fps: np.ndarray
    tasks: np.ndarray
    text_lengths: np.ndarray
    rates: Mapping[str, np.ndarray] = field(default_factory=dict)
    present: Mapping[str, np.ndarray] = field(default_factory=dict)
    step_tasks: Callable[[int], np.ndarray] | None = None
    dataset: np.ndarray | None = None

    @classmethod
    def of(cls, *, lengths, fps, tasks, text_lengths, **kwargs) -> EpisodeIndex:
        """An index from array-likes (converted to the dtypes above)."""
        return cls(lengths=np.asarray(lengths, dtype=np.int64), fps=np.asarray(fps, dtype=np.float64),
                   tasks=np.asarray(tasks, dtype=np.int64), text_lengths=np.asarray(text_lengths, dtype=np.int64),
                   **kwargs)

    def __len__(self) -> int:
        return len(self.lengths)

    def rate(self, feature: str) -> np.ndarray:
        rate = self.rates.get(feature)
        return self.fps if rate is None else rate

    def has(self, feature: str) -> np.ndarray:
        present = self.present.get(feature)
        return np.ones(len(self), dtype=bool) if present is None else present

    def step_task_ids(self, episode: int) -> np.ndarray:
        """The task id of every step of ``episode``."""
        task = int(self.tasks[episode])
        if task >= 0:
            return np.full(int(self.lengths[episode]), task, dtype=np.int64)
        if self.step_tasks is None:
            raise ValueError(f"episode {episode} changes task but the index gives no per-step tasks")
        return np.asarray(self.step_tasks(int(episode)), dtype=np.int64)


class EpisodeWindows:
    """The windows ``(episode, anchor step)`` taken every ``stride`` steps of every episode, episode-major, from
    cumulative counts per episode: memory per episode, not per window.

    segments: ``(episode, start, end)`` of the steps that may anchor a window (:mod:`mmfeed.packing.filters`,
    sorted by episode then start, disjoint), each anchoring one every ``stride`` steps from its start; None:
    every step of every episode (one segment per episode, ``[0, length)``), kept without per-segment arrays.
    """

    def __init__(self, lengths: np.ndarray, stride: int, segments: Ranges | None = None) -> None:
        if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
            raise ValueError(f"stride must be an integer >= 1 (steps between anchors), got {stride!r}")
        self.stride = int(stride)
        lengths = np.asarray(lengths, dtype=np.int64)
        self.segments = segments
        if segments is None:
            self.per_episode = (lengths + self.stride - 1) // self.stride
            self.ends = np.cumsum(self.per_episode)
            return
        episode, start, end = segments
        self._per_segment = (end - start + self.stride - 1) // self.stride
        self.ends = np.cumsum(self._per_segment)
        self.per_episode = np.bincount(episode, weights=self._per_segment, minlength=len(lengths)).astype(np.int64)
        self._episode_ends = np.cumsum(self.per_episode)

    def __len__(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    def locate(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int64 ``(episode, anchor step)`` of each sample id (what :func:`mmfeed.packing.windows.episode_windows`
        gives at that id, without segments)."""
        samples = np.asarray(samples, dtype=np.int64)
        k = np.searchsorted(self.ends, samples, side="right")
        if self.segments is None:
            first = self.ends[k] - self.per_episode[k]
            return k.astype(np.int64), (samples - first) * self.stride
        episode, start, _ = self.segments
        first = self.ends[k] - self._per_segment[k]
        return episode[k], start[k] + (samples - first) * self.stride

    def of_episode(self, episode: int) -> np.ndarray:
        """The sample ids of one episode's windows (consecutive: the windows are episode-major)."""
        ends = self.ends if self.segments is None else self._episode_ends
        return np.arange(ends[episode] - self.per_episode[episode], ends[episode], dtype=np.int64)


class SampleTable:
    """The samples of an epoch, priced; built by :meth:`windows`, :meth:`chunks`, :meth:`of_samples` or
    :meth:`of_prices` (see the module docstring).

    ``features`` are the features a sample reads, ``window`` the window spec (None for chunks and prices),
    ``stats`` what chunk cutting did (``split_episodes``, ``truncated_steps``).
    """

    index: EpisodeIndex | None
    layout: TokenLayout | None
    window: WindowSpec | None
    features: list[str]

    def __init__(self) -> None:
        raise TypeError("build a SampleTable with SampleTable.windows, .chunks, .of_samples or .of_prices")

    @classmethod
    def _new(cls, index: EpisodeIndex | None, layout: TokenLayout | None, window: WindowSpec | None,
             features: Sequence[str]) -> SampleTable:
        table = cls.__new__(cls)
        table.index, table.layout, table.window, table.features = index, layout, window, list(features)
        table.stats = {"split_episodes": 0, "truncated_steps": 0}
        table._windows = None
        table._episode = table._start = table._length = None
        table._tokens = table._groups = None
        table._draw = None
        return table

    # -- construction ----------------------------------------------------------------------------------------
    @classmethod
    def windows(cls, index: EpisodeIndex, layout: TokenLayout, window: WindowSpec, *, stride: int = 1,
                weights: Weights = None, segments: Ranges | None = None) -> SampleTable:
        """One window every ``stride`` steps of every episode, stored per episode only; ``weights``: each
        dataset's share of an epoch's samples in a mixture (:func:`~mmfeed.packing.mixture.mixture_weights`;
        None: every sample once); ``segments``: the runs of steps that may anchor a window
        (:func:`~mmfeed.packing.filters.kept_segments`; None: every step)."""
        table = cls._new(index, layout, window, window.features)
        table._windows = EpisodeWindows(index.lengths, stride, segments)
        table._set_draw(table._windows.per_episode, weights)
        return table

    @classmethod
    def chunks(cls, index: EpisodeIndex, layout: TokenLayout, features: Sequence[str], *,
               max_length: int | None = None, capacity: int | None = None, long_episodes: str = "split",
               weights: Weights = None, segments: Ranges | None = None) -> SampleTable:
        """Every frame of ``features`` in runs of at most ``max_length`` steps (None: whole episodes), shortened
        until every chunk fits ``capacity`` tokens; chunks past an episode's first are kept ("split") or dropped
        ("truncate"), counted in ``stats`` either way. ``segments``: cut chunks from these runs of kept steps
        (:func:`~mmfeed.packing.filters.kept_segments`) instead of whole episodes; ``weights`` as for windows."""
        if long_episodes not in LONG_EPISODES:
            raise ValueError(f"long_episodes must be one of {list(LONG_EPISODES)}, got {long_episodes!r}")
        table = cls._new(index, layout, None, features)
        lengths = index.lengths
        spans = lengths if segments is None else segments[2] - segments[1]
        longest = int(max_length or spans.max(initial=1))
        while True:
            piece, start, length = episode_chunks(spans, max(longest, 1))
            episode = piece if segments is None else segments[0][piece]
            if segments is not None:
                start = start + segments[1][piece]
            table._set_columns(episode, start, length)
            tokens = table._tokens
            if capacity is None or not len(tokens) or tokens.max() <= capacity:
                break
            if longest <= 1:
                raise ValueError(f"capacity {capacity} cannot hold one step of a whole-episode chunk "
                                 f"({int(tokens.max())} tokens with its text); raise the capacity or shrink the layout")
            # Shrink in proportion to the overshoot, at least one step a round.
            longest = max(1, min(longest - 1, int(longest * capacity / int(tokens.max()))))
        table.stats["split_episodes"] = int(np.sum(np.bincount(piece, minlength=len(spans)) > 1))
        if long_episodes == "truncate":
            first = start == (0 if segments is None else segments[1][piece])
            table.stats["truncated_steps"] = int(length[~first].sum())
            table.stats["split_episodes"] = 0
            table._episode, table._start, table._length = episode[first], start[first], length[first]
            table._task, table._tokens = table._task[first], tokens[first]
        table._set_draw(np.bincount(table._episode, minlength=len(lengths)), weights)
        return table

    @classmethod
    def of_samples(cls, index: EpisodeIndex, layout: TokenLayout, episode: np.ndarray, start: np.ndarray,
                   length: np.ndarray | None = None, *, window: WindowSpec | None = None,
                   features: Sequence[str] | None = None) -> SampleTable:
        """Samples already cut, ``(episode, start)`` windows of ``window``, or ``(episode, start, length)``
        chunks of ``features``: how a stream prices the samples it holds like planned ones."""
        table = cls._new(index, layout, window, window.features if window is not None else features)
        episode, start = np.asarray(episode, dtype=np.int64), np.asarray(start, dtype=np.int64)
        table._set_columns(episode, start, None if length is None else np.asarray(length, dtype=np.int64))
        return table

    @classmethod
    def of_prices(cls, tokens: np.ndarray, *, groups: np.ndarray | None = None) -> SampleTable:
        """Samples known only by their price (records of any dataset; samples of several kinds), optionally with
        the episode of each (``groups``, for episode blocks): nothing else, no draw."""
        table = cls._new(None, None, None, [])
        table._tokens = np.asarray(tokens, dtype=np.int64)
        table._groups = None if groups is None else np.asarray(groups, dtype=np.int64)
        return table

    def _set_columns(self, episode: np.ndarray, start: np.ndarray, length: np.ndarray | None) -> None:
        self._episode, self._start = episode, start
        self._length = np.ones(len(episode), dtype=np.int64) if length is None else length
        self._task = self._tasks_at(episode, start)
        self._tokens = self._priced(episode, start, self._length, self._task)

    def _set_draw(self, per_episode: np.ndarray, weights: Weights) -> None:
        if weights is None:
            return
        dataset = self.index.dataset if self.index.dataset is not None else np.zeros(len(self.index), np.int64)
        count = len(weights) if isinstance(weights, Sequence) and not isinstance(weights, str) else 0
        sizes = np.bincount(dataset, weights=per_episode, minlength=max(count, int(dataset.max(initial=-1)) + 1))
        sizes = sizes.astype(np.int64)
        resolved = mixture_weights(weights, sizes)
        if resolved is None:  # in proportion to size: every sample once, no draw
            return
        self._draw = (sizes, resolved)
        weighted_draw(sizes, self._draw[1], seed=0, epoch=0)  # validates the weights

    # -- columns ---------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        if self._windows is not None:
            return len(self._windows)
        return len(self._tokens)

    @property
    def kind(self) -> str:
        """"windows", "chunks" or "prices"."""
        return "windows" if self.window is not None else "prices" if self.index is None else "chunks"

    def locate(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """int64 ``(episode, start step)`` of each sample."""
        samples = np.asarray(samples, dtype=np.int64)
        if self._windows is not None:
            return self._windows.locate(samples)
        self._need_episodes()
        return self._episode[samples], self._start[samples]

    def lengths(self, samples: np.ndarray) -> np.ndarray:
        """Steps each sample covers (1 for a window)."""
        samples = np.asarray(samples, dtype=np.int64)
        if self._windows is not None:
            return np.ones(len(samples), dtype=np.int64)
        self._need_episodes()
        return self._length[samples]

    def tasks(self, samples: np.ndarray) -> np.ndarray:
        """The task id of each sample (-1: none): its episode's, or its first step's where the episode changes
        task."""
        samples = np.asarray(samples, dtype=np.int64)
        if self._windows is None:
            self._need_episodes()
            return self._task[samples]
        return self._tasks_at(*self._windows.locate(samples))

    def prices(self, samples: np.ndarray) -> np.ndarray:
        """The token price of each sample."""
        samples = np.asarray(samples, dtype=np.int64)
        if self._windows is None:
            return self._tokens[samples]
        episode, start = self._windows.locate(samples)
        return self._priced(episode, start, None, self._tasks_at(episode, start))

    @property
    def tokens(self) -> np.ndarray:
        """Every sample's price, int64 ``[n]`` (for windows computed per episode, then per sample only where an
        episode changes task: O(samples) memory, for the plan of samples one by one)."""
        if self._tokens is None:
            per_episode = self._windows.per_episode
            tokens = np.repeat(self._episode_prices(), per_episode)
            for e in self._changing():
                ids = self._windows.of_episode(e)
                tokens[ids] = self.prices(ids)
            self._tokens = tokens
        return self._tokens

    @property
    def groups(self) -> np.ndarray | None:
        """Each sample's episode, int64 ``[n]`` (None for prices without them): what episode blocks group by."""
        if self.index is None:
            return self._groups
        if self._windows is not None:
            per_episode = self._windows.per_episode
            return np.repeat(np.arange(len(per_episode), dtype=np.int64), per_episode)
        return self._episode

    # -- what planning chooses by ----------------------------------------------------------------------------
    @property
    def uniform_price(self) -> int | None:
        """The one price of every sample when all cost the same, else None: for windows, when every episode's
        windows cost one price and, should an episode change task, every task's text is as long; samples known by
        their price only are always planned one by one (None)."""
        if not hasattr(self, "_uniform"):
            self._uniform = self._find_uniform_price()
        return self._uniform

    def _find_uniform_price(self) -> int | None:
        if self.index is None:  # samples known by price only (records): planned one by one, as they always were
            return None
        if self._windows is None:
            prices = np.unique(self.tokens)
            return int(prices[0]) if len(prices) == 1 else None
        have = self._windows.per_episode > 0
        if not have.any():
            return None
        task = self.index.tasks[have]
        if (task < 0).any():  # some episode changes task: every task's text must then have one length
            if len(np.unique(self.index.text_lengths)) > 1:
                return None
            task = np.where(task < 0, 0, task)
        prices = np.unique(self._priced(np.flatnonzero(have), None, None, task))
        return int(prices[0]) if len(prices) == 1 else None

    @property
    def price_runs(self) -> tuple[np.ndarray, np.ndarray] | None:
        """``(run_lengths, run_prices)``, int64: windows as runs of consecutive ids of one price (each episode's
        windows, split where its task text changes length), or None for chunks and prices. A class plan packs
        windows from these (:class:`~mmfeed.packing.classes.ClassPlan`), nothing per sample."""
        if self._windows is None:
            return None
        if not hasattr(self, "_runs"):
            self._runs = self._find_price_runs()
        return self._runs

    def _find_price_runs(self) -> tuple[np.ndarray, np.ndarray]:
        per_episode = self._windows.per_episode
        prices = self._episode_prices()
        changing = self._changing()
        if not len(changing):
            return per_episode, prices
        lengths, values, done = [], [], 0
        for e in changing:  # such an episode: one run per stretch of windows of one price
            lengths.append(per_episode[done:e])
            values.append(prices[done:e])
            price = self.prices(self._windows.of_episode(e))
            starts = np.concatenate([[0], np.flatnonzero(np.diff(price)) + 1])
            lengths.append(np.diff(np.append(starts, len(price))))
            values.append(price[starts])
            done = e + 1
        lengths.append(per_episode[done:])
        values.append(prices[done:])
        return np.concatenate(lengths).astype(np.int64), np.concatenate(values).astype(np.int64)

    @property
    def classes(self) -> PriceClasses | None:
        """The windows by price class (from :attr:`price_runs`; made once), or None for chunks and prices."""
        runs = self.price_runs
        if runs is None:
            return None
        if getattr(self, "_classes", None) is None:
            self._classes = PriceClasses.from_runs(*runs)
        return self._classes

    @property
    def min_price(self) -> int:
        """The lowest price of a sample (1 when there are none)."""
        price = self.uniform_price
        if price is not None:
            return price
        runs = self.price_runs
        if runs is not None:
            prices = runs[1][runs[0] > 0]
            return int(prices.min()) if len(prices) else 1
        tokens = self.tokens
        return int(tokens.min()) if len(tokens) else 1

    def draw(self, seed: int, epoch: int) -> np.ndarray | None:
        """The samples of one epoch of a weighted mixture (ids, grouped by dataset; a sample may repeat), or None:
        every sample once."""
        if self._draw is None:
            return None
        return weighted_draw(*self._draw, seed=seed, epoch=epoch)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        for derived in ("_runs", "_classes"):  # per episode: a worker derives them again rather than receive them
            state.pop(derived, None)
        if self._windows is not None:
            state["_tokens"] = None  # O(samples): derived again where a plan needs it
        return state

    # -- pricing: the one way ----------------------------------------------------------------------------------
    def _tasks_at(self, episode: np.ndarray, start: np.ndarray) -> np.ndarray:
        """The task id at each ``(episode, start step)``: the episode's, or that step's where it changes task."""
        task = self.index.tasks[episode].astype(np.int64)
        varies = np.flatnonzero(task < 0)
        for e in np.unique(episode[varies]):
            mine = varies[episode[varies] == e]
            task[mine] = self.index.step_task_ids(int(e))[start[mine]]
        return task

    def _priced(self, episode: np.ndarray, start: np.ndarray | None, length: np.ndarray | None,
                task: np.ndarray) -> np.ndarray:
        """The price of samples in ``episode`` with ``task``: windows read the spec's frames of each feature the
        episode has; chunks of ``length`` steps from ``start`` every frame the clock implies there."""
        index = self.index
        if self.window is not None:
            counts = {f: len(d) * index.has(f)[episode] for f, d in self.window.deltas.items()}
        else:
            counts = {f: chunk_frames(start, start + length, length=index.lengths[episode], fps=index.fps[episode],
                                      rate=index.rate(f)[episode])[1] * index.has(f)[episode]
                      for f in self.features}
        text = np.append(index.text_lengths, 0)[np.where(task >= 0, task, len(index.text_lengths))]
        return self.layout.price(counts, text)

    def _episode_prices(self) -> np.ndarray:
        """The price of each episode's windows, by the episode's task (episodes that change task: see
        :meth:`_changing`)."""
        return self._priced(np.arange(len(self.index), dtype=np.int64), None, None, self.index.tasks)

    def _changing(self) -> np.ndarray:
        """Episodes with windows whose task changes within the episode."""
        return np.flatnonzero((self.index.tasks < 0) & (self._windows.per_episode > 0))

    def _need_episodes(self) -> None:
        if self._episode is None:
            raise ValueError("these samples are known by their price only: they have no episodes or steps")

