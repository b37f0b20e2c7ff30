"""The plan of an epoch whose samples fall into a few price classes: memory per run of samples, not per sample.

Per-frame windows take their token price from their episode (the features it has, the length of its task text),
so a quarter of a billion windows over a million episodes fall into a few dozen prices. A decreasing packing
("bfd", "ffd") of them depends only on how many samples each price has, so :class:`ClassPlan` packs those counts
in run-length form (:func:`pack_classes`: groups of identical rows, O(classes x groups)) and stores nothing per
sample or per row:

- the rows run in a seeded, bijective order (:func:`~mmfeed.packing.shuffle.index_shuffle`, computed per
  position), cut into steps of ``R * k`` rows (R ranks, k rows per batch);
- a row of group ``g`` holds ``patterns[g, c]`` samples of each class ``c``: the next positions of that class's
  own shuffled order (one shuffle stream per class), found from the row's place in its group;
- the class's ``j``-th sample is found by binary search in cumulative counts over its runs (consecutive sample ids
  of one price, e.g. one episode's windows), so the index costs O(runs);
- each step's rows are dealt to ranks by attention cost when the step is asked (longest-processing-time first,
  then swaps, as :func:`~mmfeed.packing.balance.balance` deals a step): every rank runs the same number of steps.

The rows do not depend on the world size, and the first ``s`` steps at world size R hold the first ``s * R * k``
rows of the order, so an elastic resume (:func:`class_remainder`) deals the rows left at another world size:
nothing is lost or repeated.

    >>> from mmfeed.packing.plan import PlanConfig
    >>> classes = PriceClasses.from_runs(run_lengths=[40, 25, 35], run_prices=[10, 12, 10])
    >>> plan = ClassPlan(classes, PlanConfig(capacity=32, rows_per_batch=2), seed=0, epoch=0, world_size=2)
    >>> classes.prices.tolist(), classes.counts.tolist()
    ([12, 10], [25, 75])
    >>> plan.num_rows, plan.num_steps   # 4 rows a step: 9 steps, the 2 rows left over dropped
    (38, 9)
    >>> ran = np.concatenate([plan.batch_samples(r, s) for r in range(2) for s in range(9)])
    >>> sorted(ran.tolist() + plan.dropped.tolist()) == list(range(100))
    True
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from mmfeed.packing._validate import as_capacity, check_choice
from mmfeed.packing.balance import _MAX_SWAPS, _NO_START, _WINDOW, _deal_kernel
from mmfeed.packing.bins import _DECREASING
from mmfeed.packing.shuffle import index_shuffle
from mmfeed.packing.uniform import RowSteps, remainder_offset

if TYPE_CHECKING:
    from mmfeed.packing.plan import PlanConfig

__all__ = ["ClassPlan", "PriceClasses", "class_remainder", "pack_classes"]


# -- packing counts of a few prices, in run-length form -----------------------------------------------------------
@njit(cache=True)
def _grow(patterns, repeats, free, size):
    """The group arrays with room for at least one more group."""
    if size < repeats.size:
        return patterns, repeats, free
    more = 2 * repeats.size
    p2 = np.zeros((more, patterns.shape[1]), np.int64)
    p2[:size] = patterns[:size]
    r2 = np.zeros(more, np.int64)
    r2[:size] = repeats[:size]
    f2 = np.zeros(more, np.int64)
    f2[:size] = free[:size]
    return p2, r2, f2


@njit(cache=True)
def _no_groups(K):
    """Empty group arrays (patterns, repeats, free space) with room for a few groups of ``K`` classes."""
    return np.zeros((2 * K + 4, K), np.int64), np.zeros(2 * K + 4, np.int64), np.zeros(2 * K + 4, np.int64)


@njit(cache=True)
def _ffd_classes(prices, counts, capacity):
    """First fit decreasing over counts: rows filled one at a time, each with the largest samples that still fit
    (what FFD places, row by row), a row repeated while the counts allow the same fill."""
    K = prices.size
    patterns, repeats, free = _no_groups(K)
    rem = counts.copy()
    left = rem.sum()
    g = 0
    x = np.zeros(K, np.int64)
    while left > 0:
        space = capacity
        for c in range(K):
            x[c] = 0
            if rem[c] > 0 and prices[c] <= space:
                x[c] = min(rem[c], space // prices[c])
                space -= x[c] * prices[c]
        times = left
        for c in range(K):
            if x[c] > 0:
                times = min(times, rem[c] // x[c])
        patterns, repeats, free = _grow(patterns, repeats, free, g)
        for c in range(K):
            patterns[g, c] = x[c]
            rem[c] -= times * x[c]
            left -= times * x[c]
        repeats[g], free[g] = times, space
        g += 1
    return patterns[:g].copy(), repeats[:g].copy(), free[:g].copy()


@njit(cache=True)
def _bfd_classes(prices, counts, capacity):
    """Best fit decreasing over counts: the rows as groups of equal content; each sample goes to the row with the
    least free space that holds it, and such a row keeps taking samples of its class until it has no room for
    one more (no other row fits better meanwhile), so a whole group takes ``free // price`` each at once."""
    K = prices.size
    patterns, repeats, free = _no_groups(K)
    G = 0
    for c in range(K):
        n, p = counts[c], prices[c]
        while n > 0:
            best = -1
            for g in range(G):
                if repeats[g] > 0 and free[g] >= p and (best < 0 or free[g] < free[best]):
                    best = g
            if best < 0:  # new rows, each filled with this class until full, the last with what is left
                per = capacity // p
                for take, rows in ((per, n // per), (n % per, 1 if n % per else 0)):
                    if rows > 0:
                        patterns, repeats, free = _grow(patterns, repeats, free, G)
                        patterns[G, c], repeats[G], free[G] = take, rows, capacity - take * p
                        G += 1
                n = 0
                continue
            q = free[best] // p
            if n >= q * repeats[best]:  # every row of the group takes q
                patterns[best, c] += q
                free[best] -= q * p
                n -= q * repeats[best]
                continue
            whole, part = n // q, n % q  # some rows take q, one takes the rest, the others nothing
            for take, rows in ((q, whole), (part, 1 if part else 0)):
                if rows > 0:
                    patterns, repeats, free = _grow(patterns, repeats, free, G)
                    patterns[G] = patterns[best]
                    patterns[G, c] += take
                    repeats[G], free[G] = rows, free[best] - take * p
                    repeats[best] -= rows
                    G += 1
            n = 0
    keep = np.flatnonzero(repeats[:G] > 0)
    return patterns[keep].copy(), repeats[keep].copy(), free[keep].copy()


_CLASS_PACKERS = {"bfd": _bfd_classes, "ffd": _ffd_classes}


def pack_classes(prices: Sequence[int] | np.ndarray, counts: Sequence[int] | np.ndarray, capacity: int,
                 algorithm: str = "bfd") -> tuple[np.ndarray, np.ndarray]:
    """Pack ``counts[c]`` samples of price ``prices[c]`` into rows of ``capacity`` tokens with a decreasing
    algorithm, in run-length form: ``(patterns int64 [G, K], repeats int64 [G])``, ``repeats[g]`` rows holding
    ``patterns[g, c]`` samples of each class ``c``.

    ``prices`` are distinct, decreasing and at most ``capacity``. The rows are those :func:`~mmfeed.packing.pack`
    gives the samples listed one by one: the same rows for "ffd"; for "bfd" as many rows with the same free space
    each (where rows of equal free space compete, bfd's choice may pair classes otherwise).

    >>> patterns, repeats = pack_classes([5, 3], [3, 4], capacity=8)
    >>> sorted(zip(patterns.tolist(), repeats.tolist()))   # 3 rows of 5 + 3, one of 3
    [([0, 1], 1), ([1, 1], 3)]
    """
    cap = as_capacity(capacity)
    check_choice("algorithm", algorithm, _CLASS_PACKERS)
    p = np.asarray(prices)
    n = np.asarray(counts)
    if p.ndim != 1 or n.shape != p.shape or (p.size and (p.dtype.kind not in "iu" or n.dtype.kind not in "iu")):
        raise ValueError(f"prices and counts must be 1-D integer arrays of one length, got {p.shape} and {n.shape}")
    if p.size and (p.min() < 1 or p.max() > cap or (np.diff(p) >= 0).any() or n.min() < 0):
        raise ValueError(f"prices must be distinct, decreasing and in [1, {cap}], counts >= 0; got prices "
                         f"{p.tolist()[:8]}... and counts {n.tolist()[:8]}...")
    patterns, repeats, _ = _CLASS_PACKERS[algorithm](p.astype(np.int64), n.astype(np.int64), cap)
    return patterns, repeats


# -- the samples of each class ----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class PriceClasses:
    """Samples grouped by token price, from runs of consecutive sample ids of one price (an episode's windows):
    what a :class:`ClassPlan` reads of the index, in O(runs) memory. Build with :meth:`from_runs`.

    prices: int64 ``[K]``, the distinct prices, decreasing; counts: int64 ``[K]``, samples of each.
    starts: int64 ``[runs]``, the first sample id of each run (runs cover ``[0, num_samples)`` in order).
    runs, offsets, ends: the runs of class ``c`` are ``runs[offsets[c]:offsets[c + 1]]`` (increasing), and
        ``ends`` the class's cumulative sample count through each of them.
    """

    prices: np.ndarray
    counts: np.ndarray
    starts: np.ndarray
    runs: np.ndarray
    offsets: np.ndarray
    ends: np.ndarray

    @classmethod
    def from_runs(cls, run_lengths: Sequence[int] | np.ndarray, run_prices: Sequence[int] | np.ndarray
                  ) -> PriceClasses:
        """Classes of the samples ``[0, sum(run_lengths))``, run ``i`` holding the next ``run_lengths[i]`` ids,
        each priced ``run_prices[i]`` tokens."""
        lengths, prices = np.asarray(run_lengths), np.asarray(run_prices)
        if lengths.ndim != 1 or prices.shape != lengths.shape or (lengths.size and (
                lengths.dtype.kind not in "iu" or prices.dtype.kind not in "iu")):
            raise ValueError(f"run_lengths and run_prices must be 1-D integer arrays of one length, got "
                             f"{lengths.shape} and {prices.shape}")
        if lengths.size and (lengths.min() < 0 or prices.min() < 1):
            raise ValueError("run lengths must be >= 0 and run prices >= 1")
        lengths, prices = lengths.astype(np.int64), prices.astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if lengths.size else lengths
        runs = np.flatnonzero(lengths > 0)
        runs = runs[np.argsort(-prices[runs], kind="stable")]  # by price, costliest first; runs increasing
        values, first = np.unique(-prices[runs], return_index=True)
        offsets = np.append(first, runs.size).astype(np.int64)
        cum = np.concatenate([[0], np.cumsum(lengths[runs])]).astype(np.int64)  # samples before each run
        ends = cum[1:] - np.repeat(cum[offsets[:-1]], np.diff(offsets))  # ... counted from its class's first
        return cls(prices=(-values).astype(np.int64), counts=np.diff(cum[offsets]), starts=starts,
                   runs=runs.astype(np.int64), offsets=offsets, ends=ends)

    @property
    def num_samples(self) -> int:
        return int(self.counts.sum())

    def samples(self, c: int, members: np.ndarray) -> np.ndarray:
        """int64: the sample ids of members ``members`` (indices in ``[0, counts[c])``, increasing sample id
        order) of class ``c``."""
        lo, hi = int(self.offsets[c]), int(self.offsets[c + 1])
        ends = self.ends[lo:hi]
        i = np.searchsorted(ends, members, side="right")
        before = np.where(i > 0, ends[np.maximum(i - 1, 0)], 0)
        return self.starts[self.runs[lo + i]] + (members - before)

    def members(self, c: int) -> np.ndarray:
        """Sorted sample ids of class ``c`` (O(its samples))."""
        return self.samples(c, np.arange(self.counts[c], dtype=np.int64))


# -- the plan -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ClassPlan(RowSteps):
    """An epoch over :class:`PriceClasses`, packed by counts and dealt per step (see the module docstring).

    It answers what a :class:`~mmfeed.packing.plan.Plan` answers (``num_steps``, ``batch_rows``,
    ``batch_samples``, ``row``, ``steps``, ``dropped``, ``replicated``, ``efficiency``) without holding the
    order. Its row ids are positions in the epoch's row order from ``offset``, the rows earlier segments of the
    epoch consumed (see :func:`class_remainder`). Samples priced above the capacity fit no row: ``dropped``.
    """

    classes: PriceClasses
    config: PlanConfig
    seed: int
    epoch: int
    world_size: int = 1
    offset: int = 0
    _groups: tuple = field(init=False, repr=False)
    _deals: dict = field(init=False, repr=False, default_factory=dict)  # the last steps dealt (threads share it)
    _lock: threading.Lock = field(init=False, repr=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        config = self.config
        if config.mode != "pack" or config.episode_block or not _DECREASING.get(config.algorithm, False):
            raise ValueError("a class plan packs rows (mode 'pack') over the whole epoch (episode_block 0) with a "
                             f"decreasing algorithm ('bfd', 'ffd'), got {config.mode!r}, {config.episode_block}, "
                             f"{config.algorithm!r}")
        if self.world_size < 1:
            raise ValueError(f"world size must be >= 1, got {self.world_size}")
        fit = int(np.searchsorted(-self.classes.prices, -config.capacity))  # classes that fit: a prefix
        patterns, repeats = pack_classes(self.classes.prices[fit:], self.classes.counts[fit:], config.capacity,
                                         config.algorithm)
        prices = self.classes.prices[fit:]
        ends = np.cumsum(repeats)
        total = int(ends[-1]) if ends.size else 0
        if not 0 <= self.offset <= total:
            raise ValueError(f"offset {self.offset} not in [0, {total}] rows")
        # class positions a group's first row starts at: what the groups before it took of each class
        base = np.cumsum(patterns * repeats[:, None], axis=0) - patterns * repeats[:, None]
        tokens = patterns @ prices
        costs = tokens + config.alpha * (patterns @ (prices * prices)) / config.capacity
        object.__setattr__(self, "_groups", (fit, patterns, ends, base, tokens, costs, total))

    # -- shape ---------------------------------------------------------------------------------------------------
    @property
    def total_rows(self) -> int:
        """Rows of the whole epoch (all segments)."""
        return self._groups[6]

    @property
    def num_rows(self) -> int:
        """Rows of this plan (from :attr:`offset`); rows dealt beyond them are replicas."""
        return self.total_rows - self.offset

    # -- rows ----------------------------------------------------------------------------------------------------
    def _row_ids(self, positions: np.ndarray) -> np.ndarray:
        """Rows of the epoch at these positions of this plan (replicas mapped to the rows they repeat)."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.num_rows:
            positions = np.where(positions < self.num_rows, positions, (positions - self.num_rows) % self.num_rows)
        return self._epoch_rows(positions + self.offset)

    def _epoch_rows(self, positions: np.ndarray) -> np.ndarray:
        """Rows at these positions of the whole epoch's order (earlier segments' included)."""
        if not self.config.shuffle:
            return positions
        return index_shuffle(positions, self.total_rows, seed=self.seed, epoch=self.epoch)

    def _group_of(self, rows: np.ndarray) -> np.ndarray:
        return np.searchsorted(self._groups[2], rows, side="right")

    def _groups_at(self, positions: np.ndarray) -> np.ndarray:
        """The group of the row at each position of this plan."""
        return self._group_of(self._row_ids(positions))

    def row(self, row: int) -> np.ndarray:
        """Sample ids of the row at position ``row`` of this plan (positions past :attr:`num_rows` replicate rows
        from the start of the order), costliest class first."""
        if not 0 <= row < max(self.dealt_rows, self.num_rows):
            raise IndexError(f"row {row} out of range ({self.num_rows} rows)")
        return self._rows(np.array([row], dtype=np.int64))[1]

    def _rows(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows at ``positions`` in CSR form: ``(offsets int64 [n + 1], samples int64)``, one numpy pass per
        class present, not per row."""
        fit, patterns, ends, base, _, _, _ = self._groups
        rows = self._row_ids(positions)
        g = self._group_of(rows)
        q = rows - np.where(g > 0, ends[np.maximum(g - 1, 0)], 0)  # the row's place in its group
        counts = patterns[g]  # [n, K]: samples of each class in each row
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(counts.sum(axis=1), out=offsets[1:])
        first_slot = offsets[:-1, None] + np.cumsum(counts, axis=1) - counts  # classes in order within a row
        first_member = base[g] + q[:, None] * counts  # the class position the row's samples of it start at
        out = np.empty(int(offsets[-1]), np.int64)
        for c in np.flatnonzero(counts.any(axis=0)):
            x = counts[:, c]
            has = x > 0
            x = x[has]
            within = np.arange(int(x.sum())) - np.repeat(np.cumsum(x) - x, x)
            members = np.repeat(first_member[has, c], x) + within
            cls = fit + int(c)
            if self.config.shuffle:
                members = index_shuffle(members, int(self.classes.counts[cls]), seed=self.seed, epoch=self.epoch,
                                        stream=1 + cls)
            out[np.repeat(first_slot[has, c], x) + within] = self.classes.samples(cls, members)
        return offsets, out

    def _deal(self, step: int) -> np.ndarray:
        """int64 ``[R, k]``: the positions each rank runs at ``step`` (-1 = none), rows dealt by cost."""
        with self._lock:
            deal = self._deals.get(step)
        if deal is None:
            m = self.rows_per_step
            positions = step * m + np.arange(m, dtype=np.int64)
            real = positions < (self.dealt_rows if self.config.remainder == "replicate" else self.num_rows)
            costs = np.zeros(m)
            costs[real] = self._groups[5][self._groups_at(positions[real])]
            slots = np.where(real, np.arange(m, dtype=np.int64), -1).reshape(1, m)
            dealt = _deal_kernel(costs.reshape(1, m), slots, self.world_size, self.config.rows_per_batch, _WINDOW,
                                 _MAX_SWAPS, _NO_START)[:, 0, :]
            deal = np.where(dealt >= 0, positions[np.maximum(dealt, 0)], -1)
            with self._lock:
                if len(self._deals) >= 8:
                    self._deals.pop(next(iter(self._deals)))
                self._deals[step] = deal
        return deal

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("_deals", "_lock")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _deals={}, _lock=threading.Lock())

    def step_rows(self, rank: int, step: int) -> np.ndarray:
        """int64 [rows per batch]: the rows (positions) of ``rank``'s batch at ``step``, costliest first; -1 =
        none (remainder "pad")."""
        if not 0 <= rank < self.world_size or not 0 <= step < self.num_steps:
            raise IndexError(f"(rank {rank}, step {step}) out of range: {self.world_size} ranks, "
                             f"{self.num_steps} steps")
        return self._deal(int(step))[rank]

    def batch_rows(self, rank: int, step: int) -> list[np.ndarray]:
        """The sample ids of each row of ``rank``'s batch at ``step``."""
        positions = self.step_rows(rank, step)
        offsets, samples = self._rows(positions[positions >= 0])
        return [samples[a:b] for a, b in zip(offsets[:-1], offsets[1:])]

    @property
    def steps(self) -> np.ndarray:
        """int64 ``[world_size, num_steps, rows per batch]`` positions, as :attr:`Plan.steps` (every step dealt:
        O(rows))."""
        deals = [self._deal(s) for s in range(self.num_steps)]
        if not deals:
            return np.zeros((self.world_size, 0, self.config.rows_per_batch), np.int64)
        return np.stack(deals, axis=1)

    def rank_costs(self) -> np.ndarray:
        """float64 ``[world_size, num_steps]``: each rank's attention cost per step, as
        :meth:`Plan.rank_costs <mmfeed.packing.plan.Plan.rank_costs>` (every step dealt: O(rows))."""
        steps = self.steps
        costs = np.zeros(steps.shape)
        used = steps >= 0
        costs[used] = self._groups[5][self._groups_at(steps[used])]
        return costs.sum(axis=2)

    # -- what the epoch leaves out or repeats ----------------------------------------------------------------------
    def positions_in(self, steps: int) -> int:
        """Rows of the order (from :attr:`offset`) that the first ``steps`` steps hold (replicas not counted)."""
        return min(steps * self.rows_per_step, self.num_rows)

    @property
    def oversize(self) -> np.ndarray:
        """Sorted sample ids priced above the capacity: in no row."""
        fit = self._groups[0]
        parts = [self.classes.members(c) for c in range(fit)]
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    def _samples_of(self, positions: range) -> np.ndarray:
        return self._rows(np.arange(positions.start, positions.stop, dtype=np.int64))[1]

    @property
    def dropped(self) -> np.ndarray:
        """Sorted sample ids in no batch: priced above the capacity, or in the rows that do not fill a last step
        of all ranks (remainder "drop")."""
        cut = self._samples_of(range(self.positions_in(self.num_steps), self.num_rows))
        return np.sort(np.concatenate([self.oversize, cut]))

    @property
    def replicated(self) -> np.ndarray:
        """Sorted sample ids dealt twice (remainder "replicate")."""
        return np.sort(self._samples_of(range(self.num_rows, self.dealt_rows)))

    @property
    def efficiency(self) -> float:
        """Tokens of the dealt rows / their token slots (O(rows) when a resumed plan leaves many rows before it)."""
        dealt = self.dealt_rows
        if not dealt:
            return 0.0
        ends, tokens = self._groups[2], self._groups[4]
        total = int(np.diff(ends, prepend=0) @ tokens)
        before = self._epoch_rows(np.arange(self.offset, dtype=np.int64))  # the earlier segments' rows
        cut = np.arange(self.positions_in(self.num_steps), self.num_rows, dtype=np.int64)
        extra = np.arange(self.num_rows, dealt, dtype=np.int64)
        used = total - tokens[self._group_of(before)].sum() - tokens[self._groups_at(cut)].sum() \
            + tokens[self._groups_at(extra)].sum()
        return float(used / (dealt * self.capacity))


def class_remainder(classes: PriceClasses, config: PlanConfig, *, seed: int, epoch: int, world_size: int = 1,
                    done: Sequence[tuple[int, int]] = ()) -> ClassPlan:
    """The class plan of what is left of an epoch after the segments ``done`` (``(world_size, steps)`` each, as
    :func:`~mmfeed.packing.plan.plan_remainder` takes them): the same rows in the same order from the first one
    no segment consumed, dealt to ``world_size`` ranks."""
    offset = remainder_offset(lambda world, at: ClassPlan(classes, config, seed, epoch, world, at), done,
                              ClassPlan.positions_in)
    return ClassPlan(classes, config, seed, epoch, world_size, offset)
