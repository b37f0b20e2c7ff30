"""The epoch plan: a pure function of sample prices, ``(seed, epoch)`` and the world size.

From the token price of every sample (computed from the index alone, see :mod:`mmfeed.packing.layout`) the
planner shuffles, packs samples into rows of ``capacity`` tokens, groups rows into per-rank batches with equal
step counts and balanced attention cost, and deals batches to workers. The result is small integer arrays:
nothing is read or decoded. Because the plan is deterministic, resuming is a cursor into it, and every rank
knows how many steps every other rank runs::

    >>> plan = plan_epoch(np.array([30, 20, 10, 40, 25, 33, 12, 50]), PlanConfig(capacity=64), seed=0, epoch=0)
    >>> plan.num_steps, plan.efficiency > 0.8
    (4, True)
    >>> sorted(np.concatenate([plan.batch_samples(0, s) for s in range(plan.num_steps)]).tolist())
    [0, 1, 2, 3, 4, 5, 6, 7]

Modes:
- ``"pack"``: rows of whole samples back to back (the default; no compute is spent on padding);
- ``"bucket"``: samples of similar length batched under a token budget that counts padding;
- ``"fixed"``: ``batch_size`` samples per batch in shuffled order, padded to the longest (what torch does).
In the bucket and fixed modes each sample is its own row; the batch's row capacity is its longest sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numba import njit

from mmfeed.packing.balance import REMAINDER_POLICIES, _below, _shuffle_segments, _xorshift, balance, row_costs
from mmfeed.packing.bins import _DECREASING, ALGORITHMS, pack, pack_counts
from mmfeed.packing.bucketing import bucket_batches, bucket_boundaries

__all__ = ["MODES", "Plan", "PlanConfig", "consumed_samples", "plan_epoch", "plan_remainder", "worker_steps"]

MODES = ("pack", "bucket", "fixed")


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    """How an epoch is cut into batches.

    capacity: tokens per packed row (pack mode) or the token budget per batch, padding counted (bucket mode).
    rows_per_batch: packed rows in one batch of one rank (pack mode).
    mode: "pack", "bucket" or "fixed" (see the module docstring).
    batch_size: samples per batch (fixed mode).
    num_buckets: length buckets, boundaries estimated from the data (bucket mode).
    algorithm: a key of ``mmfeed.packing.ALGORITHMS``.
    shuffle: shuffle samples (and rows) with ``(seed, epoch)``; off keeps the index order where the mode allows.
    alpha: weight of the quadratic attention term in a row's cost, ``tokens + alpha * sum(len^2) / capacity``.
    episode_block: 0 shuffles samples across the whole epoch. ``B > 0`` shuffles the episodes, cuts them into
        blocks of ``B``, shuffles samples within each block and packs and steps block by block, so the samples of
        one batch come from a few episodes and the workers decode each group of pictures once for many samples
        (the plan needs each sample's episode, ``plan_epoch(..., groups=)``). Rows are dealt to ranks within each
        step as usual.
    reuse: 1 shuffles samples one by one. ``k > 1`` shuffles *spans* of ``k`` consecutive samples of one episode
        (consecutive windows: their frames overlap or lie in the same groups of pictures) and lays each span out
        whole, so a batch of ``B`` windows holds about ``B / k`` spans and the workers decode each span's pictures
        once for its ``k`` windows: more frames per CPU-second, fewer distinct episodes per batch (``mmfeed bench
        reuse`` measures the trade). Every sample still comes once an epoch; batch size, ranks, remainder and
        resume are as without it. Modes "fixed" and "bucket", and "pack" with an algorithm that keeps the order
        (not "bfd"/"ffd", which sort by length); not with episode blocks or samples drawn by weight (the plan
        needs each sample's episode, ``plan_epoch(..., groups=)``).
    remainder: rows that do not fill the last step of all ranks (a key of ``mmfeed.packing.REMAINDER_POLICIES``):
        "drop" leaves them for no batch (listed in ``Plan.dropped``; the next epoch reshuffles), "replicate"
        completes the step with rows from the start (listed in ``Plan.replicated``), "pad" with empty rows.
    """

    capacity: int = 8192
    rows_per_batch: int = 1
    mode: str = "pack"
    batch_size: int = 8
    num_buckets: int = 8
    algorithm: str = "bfd"
    shuffle: bool = True
    alpha: float = 0.67
    episode_block: int = 0
    remainder: str = "drop"
    reuse: int = 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown plan mode {self.mode!r}; choose one of {list(MODES)}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"unknown packing algorithm {self.algorithm!r}; choose one of {sorted(ALGORITHMS)}")
        for name in ("capacity", "rows_per_batch", "batch_size", "num_buckets"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"PlanConfig.{name} must be an integer >= 1, got {value!r}")
        if self.remainder not in REMAINDER_POLICIES:
            raise ValueError(f"unknown remainder policy {self.remainder!r}; choose one of {sorted(REMAINDER_POLICIES)}")
        if isinstance(self.episode_block, bool) or not isinstance(self.episode_block, (int, np.integer)) \
                or self.episode_block < 0:
            raise ValueError(f"PlanConfig.episode_block must be an integer >= 0, got {self.episode_block!r}")
        if self.alpha < 0:
            raise ValueError(f"PlanConfig.alpha must be >= 0, got {self.alpha}")
        if isinstance(self.reuse, bool) or not isinstance(self.reuse, (int, np.integer)) or self.reuse < 1:
            raise ValueError(f"PlanConfig.reuse must be an integer >= 1, got {self.reuse!r}")
        if self.reuse > 1 and self.episode_block:
            raise ValueError(f"PlanConfig.reuse={self.reuse} and episode_block={self.episode_block} both group a "
                             "batch's samples by episode: choose one")
        if self.reuse > 1 and self.mode == "pack" and _DECREASING[self.algorithm]:
            raise ValueError(f"PlanConfig.reuse={self.reuse} keeps each span's windows together, which algorithm "
                             f"{self.algorithm!r} undoes (it sorts samples by length); use mode 'fixed' or 'bucket', "
                             "or a packing algorithm that keeps the order ('nf')")

    def most_documents(self, cheapest: int) -> int:
        """The most documents one batch can hold when the cheapest sample costs ``cheapest`` tokens:
        ``rows_per_batch`` rows of ``capacity // cheapest`` each (at least one a row): what ``cu_seqlens`` is
        padded to, minus one, under static shapes."""
        return self.rows_per_batch * max(self.capacity // max(int(cheapest), 1), 1)


@dataclass(frozen=True, eq=False)
class Plan:
    """One epoch's batches for every rank.

    tokens: int64 ``[n_samples]``, each sample's price.
    row_offsets, row_samples: rows in CSR form: the samples of row ``i`` are
        ``row_samples[row_offsets[i]:row_offsets[i + 1]]``, in layout order. ``row_offsets`` is int64;
        ``row_samples`` is int32 when the plan packs with a decreasing algorithm ("bfd", "ffd"; fewer than
        2**31 samples) and int64 otherwise: index with it, do not rely on its width.
    steps: int64 ``[world_size, num_steps, max_rows]``: the rows of each rank's batch at each step, -1 = none.
    capacity: row capacity (pack mode); 0 means "the longest sample of the batch" (bucket and fixed modes).
    dropped: sample ids in no batch (longer than capacity, or in rows cut so that every rank runs the same
        number of steps); planned, counted and reported, never silently.
    replicated: sample ids planned twice this epoch (``remainder="replicate"``).
    """

    tokens: np.ndarray
    row_offsets: np.ndarray
    row_samples: np.ndarray
    steps: np.ndarray
    capacity: int
    dropped: np.ndarray
    replicated: np.ndarray
    config: PlanConfig = field(repr=False)

    @property
    def world_size(self) -> int:
        return int(self.steps.shape[0])

    @property
    def num_steps(self) -> int:
        """Steps every rank runs this epoch (the same for all ranks)."""
        return int(self.steps.shape[1])

    @property
    def num_rows(self) -> int:
        return len(self.row_offsets) - 1

    @property
    def max_rows(self) -> int:
        """Row slots in one batch of one rank (the last axis of :attr:`steps`)."""
        return int(self.steps.shape[2])

    def row(self, row: int) -> np.ndarray:
        return self.row_samples[self.row_offsets[row] : self.row_offsets[row + 1]]

    def batch_rows(self, rank: int, step: int) -> list[np.ndarray]:
        """The sample ids of each row of ``rank``'s batch at ``step``."""
        rows = self.steps[rank, step]
        rows = rows[rows >= 0]
        samples = self.row_samples  # each row's slice, as row() takes it (no call a row: a batch has hundreds)
        return [samples[a:b] for a, b in zip(self.row_offsets[rows].tolist(), self.row_offsets[rows + 1].tolist())]

    def batch_samples(self, rank: int, step: int) -> np.ndarray:
        rows = self.batch_rows(rank, step)
        return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)

    @property
    def efficiency(self) -> float:
        """Tokens of planned samples / token slots of all planned rows (padding to capacity counted)."""
        used = self.steps[self.steps >= 0]
        if not used.size:
            return 0.0
        counts = np.diff(self.row_offsets)
        tokens = np.zeros(self.num_rows, dtype=np.int64)
        np.add.at(tokens, np.repeat(np.arange(self.num_rows), counts), self.tokens[self.row_samples])
        if self.capacity:
            return float(tokens[used].sum() / (len(used) * self.capacity))
        # One sample per row, padded to the longest of its batch.
        slots = 0
        for rank in range(self.world_size):
            for step in range(self.num_steps):
                rows = self.steps[rank, step]
                rows = rows[rows >= 0]
                slots += len(rows) * int(tokens[rows].max()) if len(rows) else 0
        return float(tokens[used].sum() / slots) if slots else 0.0

    def rank_costs(self) -> np.ndarray:
        """float64 ``[world_size, num_steps]``: each rank's attention cost per step (see PlanConfig.alpha)."""
        lengths = self.tokens[self.row_samples]
        row_of = np.repeat(np.arange(self.num_rows), np.diff(self.row_offsets))
        capacity = self.capacity or max(int(self.tokens.max(initial=1)), 1)
        costs = row_costs(lengths, row_of, capacity, alpha=self.config.alpha)
        padded = np.append(costs, 0.0)
        return padded[self.steps].sum(axis=2)


def plan_epoch(tokens: np.ndarray, config: PlanConfig, *, seed: int, epoch: int, world_size: int = 1,
               groups: np.ndarray | None = None) -> Plan:
    """Plan one epoch over samples priced ``tokens`` (int64 ``[n]``) for ``world_size`` ranks.

    groups: each sample's episode (int ``[n]``), needed by ``config.episode_block``.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or (tokens.size and (not np.issubdtype(tokens.dtype, np.integer) or tokens.min() < 1)):
        raise ValueError("sample tokens must be a 1-D array of integers >= 1")
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    rng = np.random.default_rng([int(seed), int(epoch)])
    by_episode = "reuse" if config.reuse > 1 else "episode_block" if config.episode_block else None
    if by_episode is not None and (groups is None or np.shape(groups) != tokens.shape):
        raise ValueError(f"PlanConfig.{by_episode} needs groups=: one episode id per sample")
    if config.reuse > 1:
        order = _reuse_order(np.asarray(groups), config.reuse, rng, config.shuffle)
    elif config.episode_block:
        blocks = _episode_blocks(np.asarray(groups), config.episode_block, rng, config.shuffle)
        if config.mode == "pack":
            return _plan_packed_blocks(tokens, blocks, config, seed=seed, epoch=epoch, world_size=world_size)
        order = np.concatenate(blocks) if blocks else np.zeros(0, np.int64)
    elif config.mode == "pack" and _DECREASING[config.algorithm] and len(tokens) < 2**31:
        return _plan_sorted(tokens, config, rng, seed=seed, epoch=epoch, world_size=world_size)
    else:
        order = rng.permutation(len(tokens)) if config.shuffle else np.arange(len(tokens), dtype=np.int64)
    if config.mode == "pack":
        return _plan_packed(tokens, order, config, seed=seed, epoch=epoch, world_size=world_size)
    return _plan_padded(tokens, order, config, seed=seed, epoch=epoch, world_size=world_size)


@njit(cache=True)
def _rows_by_counting(bin_of, order, lengths, num_bins, capacity, alpha):
    """Rows in CSR form by a counting sort on ``bin_of`` (O(n + rows), samples of a row in shuffled order) and
    each row's cost ``tokens + alpha * sum(len^2) / capacity``, summed in the order :func:`row_costs` sums."""
    offsets = np.zeros(num_bins + 1, np.int64)
    tokens = np.zeros(num_bins)
    square = np.zeros(num_bins)
    for i in range(bin_of.size):
        b = bin_of[i]
        if b >= 0:
            offsets[b + 1] += 1
            x = np.float64(lengths[i])
            tokens[b] += x
            square[b] += x * x
    for b in range(num_bins):
        offsets[b + 1] += offsets[b]
    cursor = offsets[:-1].copy()
    samples = np.empty(offsets[num_bins], np.int64)
    for i in range(bin_of.size):
        b = bin_of[i]
        if b >= 0:
            samples[cursor[b]] = order[i]
            cursor[b] += 1
    costs = np.empty(num_bins)
    for b in range(num_bins):
        costs[b] = tokens[b] + alpha * square[b] / capacity
    return offsets, samples, costs


def _plan_packed(tokens, order, config, *, seed, epoch, world_size) -> Plan:
    lengths = tokens[order]
    packed = pack(lengths, config.capacity, config.algorithm)
    # Rows in CSR form, samples of a row in shuffled order; balance() shuffles rows into steps by (seed, epoch).
    row_offsets, row_samples, costs = _rows_by_counting(packed.bin_of, np.asarray(order, dtype=np.int64), lengths,
                                                        packed.num_bins, float(config.capacity),
                                                        float(config.alpha))
    dealt = balance(costs, world_size, config.rows_per_batch, seed=seed, epoch=epoch, remainder=config.remainder)
    oversize = order[packed.bin_of < 0]
    dropped = np.concatenate([oversize, _members(row_offsets, row_samples, dealt.dropped)])
    replicated = _members(row_offsets, row_samples, dealt.replicated)
    return Plan(tokens, row_offsets, row_samples, dealt.assignment, config.capacity, np.sort(dropped),
                np.sort(replicated), config)


# ----------------------------------------------------------------------------------------------------------------
# Pack mode with a decreasing algorithm. Such a packing depends only on how many samples have each length, so the
# shuffle only decides which sample of a length takes which place of that length: the samples are sorted by
# length with a counting sort and shuffled within each length (Fisher-Yates over a few thousand ids, in cache,
# instead of one over all n), the rows come from the counts alone (bins.pack_counts), and each row's samples are
# shuffled in place. The plan has the distribution of "shuffle everything, then pack", at a fraction of the cost.
# Random numbers: xorshift64 seeded from (seed, epoch), high 32 bits scaled to the range (multiply-shift).


@njit(cache=True)
def _by_length(tokens, capacity, state, shuffle):
    """Samples that fit by decreasing length (int32, within a length in increasing id, then shuffled when
    ``shuffle``), counts per length, and the ids of samples longer than ``capacity`` (int64, increasing)."""
    counts = np.zeros(capacity + 1, np.int64)
    over = 0
    for i in range(tokens.size):
        if tokens[i] <= capacity:
            counts[tokens[i]] += 1
        else:
            over += 1
    starts = np.empty(capacity + 2, np.int64)  # starts[capacity - L] = first place of length L
    acc = 0
    for v in range(capacity + 1):
        starts[v] = acc
        acc += counts[capacity - v]
    starts[capacity + 1] = acc
    ids = np.empty(acc, np.int32)
    oversize = np.empty(over, np.int64)
    cursor = starts[:-1].copy()
    o = 0
    for i in range(tokens.size):
        t = tokens[i]
        if t <= capacity:
            ids[cursor[capacity - t]] = i
            cursor[capacity - t] += 1
        else:
            oversize[o] = i
            o += 1
    if shuffle:
        _shuffle_segments(ids, starts, state)
    return ids, counts, oversize


@njit(cache=True)
def _rows_sorted(assigned, ids, counts, num_bins, capacity, alpha, state, shuffle):
    """Rows in CSR form from the row of each sorted place (``assigned``) and the sample in it (``ids``): row
    offsets (int64), row samples (int32; each row shuffled, or in increasing id without ``shuffle``) and each
    row's cost ``tokens + alpha * sum(len^2) / capacity``. The sums are of integers below 2**53, exact in any
    order, so the costs equal :func:`row_costs` bit for bit."""
    offsets = np.zeros(num_bins + 1, np.int64)
    total = np.zeros(num_bins, np.int32)  # a row holds at most capacity < 2**31 tokens
    square = np.zeros(num_bins, np.int64)
    j = 0
    for length in range(counts.size - 1, -1, -1):  # the places hold decreasing lengths
        for _ in range(counts[length]):
            b = assigned[j]
            offsets[b + 1] += 1
            total[b] += length
            square[b] += length * length
            j += 1
    for b in range(num_bins):
        offsets[b + 1] += offsets[b]
    cursor = offsets[:-1].copy()
    samples = np.empty(assigned.size, np.int32)
    for j in range(assigned.size):
        b = assigned[j]
        samples[cursor[b]] = ids[j]
        cursor[b] += 1
    costs = np.empty(num_bins)
    for b in range(num_bins):
        lo, hi = offsets[b], offsets[b + 1]
        if shuffle:
            for i in range(hi - lo - 1, 0, -1):
                state = _xorshift(state)
                j = lo + _below(state, i + 1)
                t = samples[lo + i]
                samples[lo + i] = samples[j]
                samples[j] = t
        else:
            samples[lo:hi].sort()
        costs[b] = np.float64(total[b]) + alpha * np.float64(square[b]) / capacity
    return offsets, samples, costs


def _seed_state(rng: np.random.Generator) -> np.uint64:
    return np.uint64(rng.integers(1, 2**63))  # xorshift needs a non-zero state


def _plan_sorted(tokens, config, rng, *, seed, epoch, world_size) -> Plan:
    """Pack mode with a decreasing algorithm (see the notes above the kernels)."""
    by_length, by_row = _seed_state(rng), _seed_state(rng)
    ids, counts, oversize = _by_length(tokens, int(config.capacity), by_length, bool(config.shuffle))
    assigned, num_bins = pack_counts(counts, config.capacity, config.algorithm)
    row_offsets, row_samples, costs = _rows_sorted(assigned, ids, counts, num_bins, float(config.capacity),
                                                   float(config.alpha), by_row, bool(config.shuffle))
    del assigned, ids
    dealt = balance(costs, world_size, config.rows_per_batch, seed=seed, epoch=epoch, remainder=config.remainder)
    dropped = np.concatenate([oversize, _members(row_offsets, row_samples, dealt.dropped)])
    replicated = _members(row_offsets, row_samples, dealt.replicated)
    return Plan(tokens, row_offsets, row_samples, dealt.assignment, config.capacity, np.sort(dropped),
                np.sort(replicated), config)


def _reuse_order(groups: np.ndarray, k: int, rng: np.random.Generator, shuffle: bool) -> np.ndarray:
    """Sample ids in spans of ``k`` consecutive samples of one episode (a span ends early where its episode does),
    the spans shuffled, each span's samples kept together in id order."""
    n = len(groups)
    if n == 0:
        return np.zeros(0, np.int64)
    first = np.flatnonzero(np.r_[True, groups[1:] != groups[:-1]])  # where each run of one episode starts
    position = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    starts = np.flatnonzero(position % k == 0)  # a span starts every k samples of a run
    spans = rng.permutation(len(starts)) if shuffle else np.arange(len(starts))
    lengths = np.diff(np.r_[starts, n])
    taken = lengths[spans]
    # each chosen span's ids: its start, then start + 1, ... (a vectorized concatenation of the spans in order)
    within = np.arange(int(taken.sum())) - np.repeat(np.cumsum(taken) - taken, taken)
    return np.repeat(starts[spans], taken) + within


def _episode_blocks(groups: np.ndarray, block: int, rng: np.random.Generator, shuffle: bool) -> list[np.ndarray]:
    """Sample ids cut into blocks of ``block`` episodes (episodes shuffled, samples shuffled within a block)."""
    episodes, inverse = np.unique(groups, return_inverse=True)
    rank = rng.permutation(len(episodes)) if shuffle else np.arange(len(episodes))
    block_of = rank[inverse.reshape(-1)] // block
    by_block = np.argsort(block_of, kind="stable")
    bounds = np.flatnonzero(np.diff(block_of[by_block])) + 1
    blocks = np.split(by_block.astype(np.int64), bounds) if len(by_block) else []
    return [rng.permutation(b) for b in blocks] if shuffle else blocks


def _plan_packed_blocks(tokens, blocks, config, *, seed, epoch, world_size) -> Plan:
    """Pack each block of episodes on its own; consecutive rows form the steps, dealt to ranks step by step."""
    rows, oversize = [], []
    for block in blocks:
        packed = pack(tokens[block], config.capacity, config.algorithm)
        oversize.append(block[packed.bin_of < 0])
        rows.extend(block[b] for b in packed.bins())
    row_offsets, row_samples = _csr(rows)
    row_of = np.repeat(np.arange(len(rows)), np.diff(row_offsets))
    costs = row_costs(tokens[row_samples], row_of, config.capacity, alpha=config.alpha)
    per_step = world_size * config.rows_per_batch
    full = len(rows) // per_step
    steps = []
    for s in range(full):
        ids = np.arange(s * per_step, (s + 1) * per_step)
        dealt = balance(costs[ids], world_size, config.rows_per_batch, seed=seed, epoch=epoch)
        steps.append(ids[dealt.assignment[:, 0, :]])
    rest = np.arange(full * per_step, len(rows))
    dropped, replicated = list(oversize), np.zeros(0, np.int64)
    if len(rest):  # the last, partial step follows the remainder policy
        dealt = balance(costs[rest], world_size, config.rows_per_batch, seed=seed, epoch=epoch,
                        remainder=config.remainder)
        mapped = np.where(dealt.assignment >= 0, rest[np.maximum(dealt.assignment, 0)], -1)
        steps.extend(mapped[:, s, :] for s in range(mapped.shape[1]))
        dropped.append(_members(row_offsets, row_samples, rest[dealt.dropped]))
        replicated = _members(row_offsets, row_samples, rest[dealt.replicated])
    assignment = np.stack(steps, axis=1) if steps else np.zeros((world_size, 0, config.rows_per_batch), np.int64)
    return Plan(tokens, row_offsets, row_samples, assignment, config.capacity,
                np.sort(np.concatenate([np.zeros(0, np.int64), *dropped])), np.sort(replicated), config)


def _plan_padded(tokens, order, config, *, seed, epoch, world_size) -> Plan:
    # Batches as one flat array of sample ids and their sizes.
    if config.mode == "fixed":
        n_batches = len(order) // config.batch_size
        flat = order[: n_batches * config.batch_size]
        sizes = np.full(n_batches, config.batch_size, dtype=np.int64)
        leftover = order[n_batches * config.batch_size :]
    else:
        batches = []
        if len(tokens):
            boundaries = bucket_boundaries(tokens, config.num_buckets)
            batches = bucket_batches(tokens, boundaries, config.capacity, seed=seed, epoch=epoch,
                                     shuffle=config.shuffle, on_oversize="skip")
        sizes = np.fromiter(map(len, batches), dtype=np.int64, count=len(batches))
        flat = np.concatenate(batches).astype(np.int64) if batches else np.zeros(0, dtype=np.int64)
        unplaced = np.ones(len(tokens), dtype=bool)
        unplaced[flat] = False
        leftover = np.flatnonzero(unplaced)
    num_steps = len(sizes) // world_size
    kept_sizes = sizes[: num_steps * world_size]
    kept = int(kept_sizes.sum())
    # Every sample is a row of its own, row ids in batch order; batch i goes to rank i % world_size at step
    # i // world_size.
    row_samples = flat[:kept].astype(np.int64)
    row_offsets = np.arange(kept + 1, dtype=np.int64)
    width = int(kept_sizes.max(initial=0))
    first = np.cumsum(kept_sizes) - kept_sizes
    slot = np.arange(width)[None, :]
    cells = np.where(slot < kept_sizes[:, None], first[:, None] + slot, -1)
    steps = cells.reshape(num_steps, world_size, width).transpose(1, 0, 2).copy()
    dropped = np.sort(np.concatenate([leftover, flat[kept:]]).astype(np.int64))
    return Plan(tokens, row_offsets, row_samples, steps, 0, dropped, np.zeros(0, np.int64), config)


def plan_remainder(tokens: np.ndarray, config: PlanConfig, *, seed: int, epoch: int, world_size: int = 1,
                   done: Sequence[tuple[int, int]] = (), groups: np.ndarray | None = None) -> Plan:
    """The plan of what is left of an epoch after the segments ``done`` ran, for ``world_size`` ranks.

    done: ``(world_size, steps)`` of each earlier segment of the epoch, in order: the job ran ``steps`` steps at
        that world size, then was restarted at another. The first segment ran :func:`plan_epoch`'s plan; each
        later one ran the remainder plan left by those before it. The samples consumed so far are therefore a
        pure function of ``(seed, epoch, done)``, and the rest of the epoch is every sample not yet consumed,
        planned for ``world_size`` ranks like an epoch of its own (same seed and epoch; equal steps per rank).

    The result's sample ids index the full ``tokens``; its ``dropped`` lists the remaining samples it leaves out.
    With ``done=()`` it is exactly ``plan_epoch(tokens, config, seed=seed, epoch=epoch, world_size=world_size)``::

        >>> t = np.array([30, 20, 10, 40, 25, 33, 12, 50, 7, 60])
        >>> first = plan_epoch(t, PlanConfig(capacity=64), seed=0, epoch=0, world_size=2)
        >>> rest = plan_remainder(t, PlanConfig(capacity=64), seed=0, epoch=0, world_size=1, done=[(2, 1)])
        >>> seen = consumed_samples(t, PlanConfig(capacity=64), seed=0, epoch=0, done=[(2, 1)])
        >>> ran = [rest.batch_samples(0, s) for s in range(rest.num_steps)]
        >>> sorted(np.concatenate([seen, *ran, rest.dropped]).tolist()) == list(range(10))
        True
    """
    tokens = np.asarray(tokens)
    remaining = np.arange(len(tokens), dtype=np.int64)
    for seg_world, seg_steps in _check_done(done):
        plan = _subset_plan(tokens, remaining, config, seed, epoch, seg_world, groups)
        if seg_steps > plan.num_steps:
            raise ValueError(f"a segment of {seg_steps} steps at world size {seg_world} is longer than its plan "
                             f"({plan.num_steps} steps); the state does not belong to this dataset and plan")
        remaining = np.setdiff1d(remaining, _ran(plan, seg_steps), assume_unique=True)
    return _subset_plan(tokens, remaining, config, seed, epoch, world_size, groups)


def consumed_samples(tokens: np.ndarray, config: PlanConfig, *, seed: int, epoch: int,
                     done: Sequence[tuple[int, int]], groups: np.ndarray | None = None) -> np.ndarray:
    """Sorted unique sample ids that the segments ``done`` (see :func:`plan_remainder`) handed out, all ranks."""
    tokens = np.asarray(tokens)
    done = _check_done(done)
    seen = [np.zeros(0, np.int64)]
    for i, (seg_world, seg_steps) in enumerate(done):
        plan = plan_remainder(tokens, config, seed=seed, epoch=epoch, world_size=seg_world, done=done[:i],
                              groups=groups)
        seen.append(_ran(plan, min(seg_steps, plan.num_steps)))
    return np.unique(np.concatenate(seen))


def _check_done(done) -> list[tuple[int, int]]:
    out = []
    for item in done:
        try:
            seg_world, seg_steps = (int(v) for v in item)
        except (TypeError, ValueError):
            raise ValueError(f"done must hold (world_size, steps) pairs of integers, got {item!r}") from None
        if seg_world < 1 or seg_steps < 0:
            raise ValueError(f"a done segment needs world_size >= 1 and steps >= 0, got {item!r}")
        out.append((seg_world, seg_steps))
    return out


def _ran(plan: Plan, steps: int) -> np.ndarray:
    """Samples in the first ``steps`` steps of every rank of ``plan``."""
    rows = plan.steps[:, :steps]
    return np.unique(_members(plan.row_offsets, plan.row_samples, rows[rows >= 0]))


def _subset_plan(tokens, subset, config, seed, epoch, world_size, groups) -> Plan:
    """plan_epoch over the samples ``subset`` (sorted ids), with ids mapped back to the full table."""
    if len(subset) == len(tokens):
        return plan_epoch(tokens, config, seed=seed, epoch=epoch, world_size=world_size, groups=groups)
    sub_groups = None if groups is None else np.asarray(groups)[subset]
    plan = plan_epoch(tokens[subset], config, seed=seed, epoch=epoch, world_size=world_size, groups=sub_groups)
    return Plan(tokens.astype(np.int64), plan.row_offsets, subset[plan.row_samples], plan.steps, plan.capacity,
                np.sort(subset[plan.dropped]), np.sort(subset[plan.replicated]), config)


def worker_steps(num_steps: int, num_workers: int, worker: int, *, start: int = 0) -> np.ndarray:
    """The steps ``worker`` of ``num_workers`` loads when loading resumes at ``start``: round robin, as torch's
    DataLoader hands out work, so the batches come back in step order whatever the number of workers."""
    if num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError(f"worker {worker} is not in range for num_workers={num_workers}")
    return np.arange(start + worker, num_steps, num_workers, dtype=np.int64)


def _members(row_offsets: np.ndarray, row_samples: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The samples of ``rows`` (row ids), concatenated."""
    parts = [row_samples[row_offsets[r] : row_offsets[r + 1]] for r in np.asarray(rows, dtype=np.int64)]
    return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)


def _csr(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    samples = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, dtype=np.int64)
    return offsets, samples
