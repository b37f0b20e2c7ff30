"""The plan of an epoch whose samples all cost the same: arithmetic, O(1) memory at any number of samples.

Per-frame windows of a robot dataset (one sample per step, every window the same features and text budget) all
have one token price. Packing them is then arithmetic: each row holds ``capacity // price`` samples, rows are
consecutive runs of the epoch's shuffled order (:func:`~mmfeed.packing.shuffle.index_shuffle`, computed per
position), and every row costs the same, so rank ``r`` runs rows ``step * R * k + r * k + j`` of each step (R
ranks, k rows per batch). Nothing is stored per sample or per row: a batch's sample ids are computed when it is
loaded, so a quarter of a billion windows plan in microseconds.

The first ``s`` steps at world size ``R`` consume exactly the first ``s * R * k * per_row`` positions of the order,
so an elastic resume (:func:`uniform_remainder`) continues the same order at another world size: nothing is lost
or repeated.

    >>> from mmfeed.packing.plan import PlanConfig
    >>> plan = UniformPlan(num_samples=100, price=10, config=PlanConfig(capacity=32, rows_per_batch=2), seed=0,
    ...                    epoch=0, world_size=2)
    >>> plan.per_row, plan.num_steps, len(plan.dropped)   # 3 samples a row, 4 rows a step: 8 steps, 4 left over
    (3, 8, 4)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mmfeed.packing.plan import _check_done
from mmfeed.packing.shuffle import index_shuffle

if TYPE_CHECKING:
    from mmfeed.packing.plan import PlanConfig

__all__ = ["RowSteps", "UniformPlan", "remainder_offset", "uniform_consumed", "uniform_remainder"]


class RowSteps:
    """Steps cut from an epoch's order of rows, what the plans that hold no order share: each step takes the next
    ``world_size * rows_per_batch`` rows; rows that fill no whole last step are dropped, or that step is completed
    with empty rows ("pad") or rows from the start of the order ("replicate"), per ``config.remainder``."""

    config: PlanConfig
    world_size: int

    @property
    def num_rows(self) -> int:
        raise NotImplementedError

    @property
    def rows_per_step(self) -> int:
        """Rows of all ranks in one step (world size x rows per batch)."""
        return self.world_size * self.config.rows_per_batch

    @property
    def num_steps(self) -> int:
        full, extra = divmod(self.num_rows, self.rows_per_step)
        return full + (1 if extra and self.config.remainder != "drop" else 0)

    @property
    def dealt_rows(self) -> int:
        """Rows dealt over all steps and ranks: replicas included, empty ("pad") rows not."""
        slots = self.num_steps * self.rows_per_step
        return slots if self.config.remainder == "replicate" else min(slots, self.num_rows)

    @property
    def capacity(self) -> int:
        return self.config.capacity

    @property
    def max_rows(self) -> int:
        """Rows in one batch of one rank."""
        return self.config.rows_per_batch

    def batch_rows(self, rank: int, step: int) -> list[np.ndarray]:
        raise NotImplementedError

    def batch_samples(self, rank: int, step: int) -> np.ndarray:
        rows = self.batch_rows(rank, step)
        return np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64)


def remainder_offset(plan_at: Callable[[int, int], RowSteps], done: Sequence[tuple[int, int]],
                     consumed: Callable[[RowSteps, int], int]) -> int:
    """Where the rest of an epoch starts in its order after the segments ``done`` (``(world_size, steps)`` each):
    ``plan_at(world_size, offset)`` is a segment's plan, ``consumed(plan, steps)`` what its first steps took."""
    offset = 0
    for seg_world, seg_steps in _check_done(done):
        plan = plan_at(seg_world, offset)
        if seg_steps > plan.num_steps:
            raise ValueError(f"a segment of {seg_steps} steps at world size {seg_world} is longer than its plan "
                             f"({plan.num_steps} steps); the state does not belong to this dataset and plan")
        offset += consumed(plan, seg_steps)
    return offset


@dataclass(frozen=True, eq=False)
class UniformPlan(RowSteps):
    """An epoch of ``num_samples`` samples of ``price`` tokens each, packed ``capacity // price`` to a row.

    It answers what a :class:`~mmfeed.packing.plan.Plan` answers (``num_steps``, ``batch_rows``,
    ``batch_samples``, ``row``, ``steps``, ``dropped``, ``replicated``, ``efficiency``) without holding the
    order. ``offset`` positions of the shuffled order were consumed by earlier segments of the epoch (see
    :func:`uniform_remainder`); this plan deals the rest.
    """

    num_samples: int
    price: int
    config: PlanConfig
    seed: int
    epoch: int
    world_size: int = 1
    offset: int = 0
    _shape: tuple[int, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.config.mode != "pack" or self.config.episode_block:
            raise ValueError("a uniform plan packs rows (mode 'pack') over the whole epoch (episode_block 0)")
        if not 1 <= self.price <= self.config.capacity:
            raise ValueError(f"a uniform plan needs 1 <= price <= capacity, got price {self.price} and capacity "
                             f"{self.config.capacity}")
        if not 0 <= self.offset <= self.num_samples or self.world_size < 1:
            raise ValueError(f"offset {self.offset} not in [0, {self.num_samples}] or world size {self.world_size}")
        per_row = self.config.capacity // self.price
        object.__setattr__(self, "_shape", (per_row, -(-(self.num_samples - self.offset) // per_row)))

    # -- shape ---------------------------------------------------------------------------------------------------
    @property
    def per_row(self) -> int:
        """Samples in a full row."""
        return self._shape[0]

    @property
    def num_rows(self) -> int:
        """Rows holding this plan's samples (the last may be partial); rows dealt beyond them are replicas."""
        return self._shape[1]

    # -- what a batch holds ----------------------------------------------------------------------------------------
    def _ids(self, start: int, stop: int) -> np.ndarray:
        """The sample ids at positions ``[start, stop)`` of this plan (from :attr:`offset` on)."""
        positions = np.arange(self.offset + start, self.offset + stop, dtype=np.int64)
        if not self.config.shuffle:
            return positions
        return index_shuffle(positions, self.num_samples, seed=self.seed, epoch=self.epoch)

    def row(self, row: int) -> np.ndarray:
        """Sample ids of ``row`` (rows past :attr:`num_rows` replicate rows from the start of the order)."""
        if not 0 <= row < max(self.dealt_rows, self.num_rows):
            raise IndexError(f"row {row} out of range ({self.num_rows} rows)")
        if row >= self.num_rows:
            row = (row - self.num_rows) % self.num_rows
        start = row * self.per_row
        return self._ids(start, min(start + self.per_row, self.num_samples - self.offset))

    def step_rows(self, rank: int, step: int) -> np.ndarray:
        """int64 [rows per batch]: the row ids of ``rank``'s batch at ``step`` (-1 = none, remainder "pad")."""
        if not 0 <= rank < self.world_size or not 0 <= step < self.num_steps:
            raise IndexError(f"(rank {rank}, step {step}) out of range: {self.world_size} ranks, "
                             f"{self.num_steps} steps")
        k = self.config.rows_per_batch
        rows = step * self.rows_per_step + rank * k + np.arange(k, dtype=np.int64)
        if self.config.remainder == "pad":
            rows[rows >= self.num_rows] = -1
        return rows

    def batch_rows(self, rank: int, step: int) -> list[np.ndarray]:
        """The sample ids of each row of ``rank``'s batch at ``step``."""
        rows = self.step_rows(rank, step)
        if rows[-1] >= self.num_rows or (rows < 0).any():  # replicas or empty rows in the last step
            return [self.row(int(r)) for r in rows if r >= 0]
        # the batch's rows are consecutive: one run of positions
        start = int(rows[0]) * self.per_row
        ids = self._ids(start, min(start + len(rows) * self.per_row, self.num_samples - self.offset))
        return np.split(ids, np.arange(self.per_row, len(ids), self.per_row))

    @property
    def steps(self) -> np.ndarray:
        """int64 ``[world_size, num_steps, rows per batch]`` row ids, as :attr:`Plan.steps` (materialized: O(rows))."""
        k = self.config.rows_per_batch
        rows = np.arange(self.num_steps * self.rows_per_step, dtype=np.int64)
        if self.config.remainder == "pad":
            rows[rows >= self.num_rows] = -1
        return rows.reshape(self.num_steps, self.world_size, k).transpose(1, 0, 2).copy()

    # -- what the epoch leaves out or repeats ----------------------------------------------------------------------
    def positions_in(self, steps: int) -> int:
        """Positions of the order (from :attr:`offset`) that the first ``steps`` steps hold (replicas not
        counted): a prefix, whatever the world size."""
        rows = min(steps * self.rows_per_step, self.num_rows)
        return min(rows * self.per_row, self.num_samples - self.offset)

    @property
    def consumed_positions(self) -> int:
        """Positions of the order (from :attr:`offset`) that this plan's batches hold (replicas not counted)."""
        return self.positions_in(self.num_steps)

    @property
    def dropped(self) -> np.ndarray:
        """Sorted sample ids in no batch: the rows that do not fill a last step of all ranks (remainder "drop")."""
        return np.sort(self._ids(self.consumed_positions, self.num_samples - self.offset))

    @property
    def replicated(self) -> np.ndarray:
        """Sorted sample ids dealt twice (remainder "replicate")."""
        extra = self.dealt_rows - self.num_rows
        if extra <= 0:
            return np.zeros(0, dtype=np.int64)
        rows = [self.row(self.num_rows + j) for j in range(extra)]
        return np.sort(np.concatenate(rows))

    @property
    def efficiency(self) -> float:
        """Tokens of the dealt samples / token slots of the dealt rows."""
        samples = self.consumed_positions + self.replicated.size
        rows = self.dealt_rows
        return float(samples * self.price / (rows * self.capacity)) if rows else 0.0


def uniform_remainder(num_samples: int, price: int, config: PlanConfig, *, seed: int, epoch: int,
                      world_size: int = 1, done: Sequence[tuple[int, int]] = ()) -> UniformPlan:
    """The uniform plan of what is left of an epoch after the segments ``done`` (``(world_size, steps)`` each, as
    :func:`~mmfeed.packing.plan.plan_remainder` takes them): the same shuffled order from the first position no
    segment consumed, dealt to ``world_size`` ranks."""
    offset = remainder_offset(lambda world, at: UniformPlan(num_samples, price, config, seed, epoch, world, at), done,
                              UniformPlan.positions_in)
    return UniformPlan(num_samples, price, config, seed, epoch, world_size, offset)


def uniform_consumed(num_samples: int, price: int, config: PlanConfig, *, seed: int, epoch: int,
                     done: Sequence[tuple[int, int]]) -> np.ndarray:
    """Sorted sample ids the segments ``done`` consumed (a prefix of the shuffled order)."""
    rest = uniform_remainder(num_samples, price, config, seed=seed, epoch=epoch, done=done)
    ids = rest._ids(-rest.offset, 0) if rest.offset else np.zeros(0, np.int64)
    return np.sort(ids)
