"""Deal packed rows to ranks so that every rank runs the same number of steps with nearly equal attention cost.

Ranks synchronise every optimizer step, so what matters is the slowest rank *in each step*. :func:`balance`
shuffles the rows with ``(seed, epoch)``, cuts them into steps of ``num_ranks * micro_batches`` rows (one global
batch), and within each step deals the rows so that every rank gets exactly ``micro_batches`` rows and the largest
rank cost is small: longest-processing-time first under the cardinality limit (each row, costliest first, goes to
the least-loaded rank that still has room), then pairwise swaps between the costliest rank and the others while a
swap lowers the larger of the two.

>>> import numpy as np
>>> from mmfeed.packing import balance
>>> plan = balance(np.array([9.0, 1, 5, 5, 8, 2, 3, 7]), num_ranks=2, micro_batches=2, seed=0)
>>> plan.assignment.shape   # [ranks, steps, micro_batches]
(2, 2, 2)

Row cost (:func:`row_costs`) models a packed attention pass: ``tokens + alpha * sum(doc_len**2) / capacity``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from mmfeed.packing._validate import as_capacity, as_int, as_lengths, check_choice

__all__ = sorted(["REMAINDER_POLICIES", "RankPlan", "balance", "row_costs", "step_balance"])

#: What happens to the rows that do not fill a whole last step.
REMAINDER_POLICIES = {
    "drop": "leave them out (listed in RankPlan.dropped); every step is full",
    "replicate": "complete the last step with rows from the start of the shuffled order (listed in .replicated)",
    "pad": "complete the last step with -1 (no row); ranks keep equal step counts, some micro-batches are empty",
}


def row_costs(
    lengths: np.ndarray | list[int], bin_of: np.ndarray | list[int], capacity: int, alpha: float = 0.67
) -> np.ndarray:
    """float64 [num_rows]: ``tokens + alpha * sum(doc_len ** 2) / capacity`` of each packed row.

    ``bin_of`` is :attr:`PackPlan.bin_of` (-1 items are ignored); ``num_rows = bin_of.max() + 1``.
    """
    lens = as_lengths(lengths)
    rows = np.asarray(bin_of)
    if rows.shape != lens.shape or rows.dtype.kind not in "iu":
        raise ValueError(f"bin_of must be an integer array shaped like lengths {lens.shape}, got {rows.shape}")
    cap = as_capacity(capacity)
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
    placed = rows >= 0
    num_rows = int(rows.max()) + 1 if placed.any() else 0
    lp = lens[placed].astype(np.float64)
    tokens = np.bincount(rows[placed], weights=lp, minlength=num_rows)
    square = np.bincount(rows[placed], weights=lp * lp, minlength=num_rows)
    return tokens + alpha * square / cap


@njit(cache=True)
def _deal_kernel(costs, rows, num_ranks, k):
    """rows: int64 [steps, R*k] row ids (-1 = none, cost 0). Returns int64 [R, steps, k] row ids."""
    steps = rows.shape[0]
    out = np.full((num_ranks, steps, k), -1, dtype=np.int64)
    m = num_ranks * k
    for t in range(steps):
        c = np.zeros(m)
        for i in range(m):
            if rows[t, i] >= 0:
                c[i] = costs[rows[t, i]]
        order = np.argsort(-c, kind="mergesort")  # costliest first, ties by position
        load = np.zeros(num_ranks)
        fill = np.zeros(num_ranks, dtype=np.int64)
        slot = np.empty((num_ranks, k), dtype=np.int64)  # positions in the step
        for o in range(m):
            i = order[o]
            best = -1
            for r in range(num_ranks):
                if fill[r] < k and (best < 0 or load[r] < load[best]):
                    best = r
            slot[best, fill[best]] = i
            fill[best] += 1
            load[best] += c[i]
        for _ in range(4 * m):  # swaps between the costliest rank and another, while that lowers their max
            a = 0
            for r in range(1, num_ranks):
                if load[r] > load[a]:
                    a = r
            target = load[a]
            bb, bi, bj = -1, -1, -1
            for b in range(num_ranks):
                if b == a:
                    continue
                for i in range(k):
                    for j in range(k):
                        d = c[slot[a, i]] - c[slot[b, j]]
                        if d > 0:
                            worse = max(load[a] - d, load[b] + d)
                            if worse < target:
                                target, bb, bi, bj = worse, b, i, j
            if bb < 0:
                break
            d = c[slot[a, bi]] - c[slot[bb, bj]]
            load[a] -= d
            load[bb] += d
            tmp = slot[a, bi]
            slot[a, bi] = slot[bb, bj]
            slot[bb, bj] = tmp
        for r in range(num_ranks):
            for i in range(k):
                out[r, t, i] = rows[t, slot[r, i]]
    return out


@dataclass(frozen=True, eq=False)
class RankPlan:
    """Rows dealt to ranks.

    Attributes:
        assignment: int64 [num_ranks, steps, micro_batches]; ``assignment[r, s, m]`` is the row that rank r
            runs as micro-batch m of step s (-1 = no row, only under ``remainder="pad"``).
        dropped: row ids left out (``remainder="drop"``), in shuffled order.
        replicated: row ids dealt a second time to complete the last step (``remainder="replicate"``).
    """

    assignment: np.ndarray
    dropped: np.ndarray
    replicated: np.ndarray

    @property
    def steps(self) -> int:
        """Steps every rank runs."""
        return int(self.assignment.shape[1])


def step_balance(assignment: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """float64 [steps]: mean rank cost / max rank cost of each step (1.0 = perfectly balanced; 1.0 if all zero)."""
    c = np.concatenate([np.asarray(costs, dtype=np.float64), [0.0]])
    rank_cost = c[np.where(assignment >= 0, assignment, -1)].sum(axis=2)  # [R, steps]
    top = rank_cost.max(axis=0)
    return np.where(top > 0, rank_cost.mean(axis=0) / np.where(top > 0, top, 1.0), 1.0)


def balance(
    costs: np.ndarray | list[float],
    num_ranks: int,
    micro_batches: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    remainder: str = "drop",
) -> RankPlan:
    """Deal rows (by cost) to ``num_ranks`` ranks x ``micro_batches`` per step; a pure function of its arguments.

    Args:
        costs: float [num_rows], e.g. :func:`row_costs`; finite and >= 0.
        num_ranks: data-parallel ranks (world size).
        micro_batches: rows per rank per optimizer step (gradient-accumulation micro-batches).
        seed, epoch: the shuffle of rows into steps; same inputs -> same plan on every rank.
        remainder: a key of :data:`REMAINDER_POLICIES` for rows that do not fill a whole last step.

    Returns:
        A :class:`RankPlan`; every rank gets exactly ``steps * micro_batches`` entries, and every row appears once
        in ``assignment`` or ``dropped`` (rows in ``replicated`` appear twice).
    """
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1 or not np.isfinite(c).all() or (c < 0).any():
        raise ValueError(f"costs must be a 1-D array of finite numbers >= 0, got shape {c.shape}")
    ranks = as_int("num_ranks", num_ranks, 1)
    k = as_int("micro_batches", micro_batches, 1)
    check_choice("remainder", remainder, REMAINDER_POLICIES)
    rng = np.random.default_rng([as_int("seed", seed, 0), as_int("epoch", epoch, 0)])
    order = rng.permutation(c.size).astype(np.int64)
    per_step = ranks * k
    full, extra = divmod(c.size, per_step)
    none = np.zeros(0, dtype=np.int64)
    dropped, replicated = none, none
    if extra and remainder == "drop":
        dropped = order[full * per_step :]
        order = order[: full * per_step]
    elif extra and remainder == "replicate":
        replicated = order[: per_step - extra].copy()  # fewer rows than one step repeat in full, cyclically
        if replicated.size < per_step - extra:
            replicated = np.resize(order, per_step - extra)
        order = np.concatenate([order, replicated])
    elif extra:
        order = np.concatenate([order, np.full(per_step - extra, -1, dtype=np.int64)])
    rows = order.reshape(-1, per_step)
    return RankPlan(assignment=_deal_kernel(c, rows, ranks, k), dropped=dropped, replicated=replicated)
