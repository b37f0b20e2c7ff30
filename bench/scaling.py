"""``python -m mmfeed.bench.scaling``: how the epoch plan scales from 8 to 1024 ranks, from the planner alone.

No process is started and nothing is read: an index of synthetic episodes (one sample per episode, robot-like
token prices: 1-6 frames x 256 tokens + 2 state tokens per frame + a 50-token action chunk + 5-40 text tokens)
is planned with :func:`~mmfeed.packing.plan.plan_epoch` for each world size. Per world size the table gives the
steps every rank runs, the rows each rank gets over the epoch, the samples dropped so that every rank runs the
same number of steps, the packing efficiency, and the cost balance across ranks: ``epoch`` = mean / max of the
ranks' total attention cost over the epoch, ``step`` = the mean over steps of mean / max rank cost in that step
(ranks synchronise every step, so the slowest rank of each step sets the pace), beside ``shuffled``: the same
rows dealt to ranks in a random order (the baseline). ``plan_s`` is the planning time (median of ``repeats``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

import numpy as np

from mmfeed.packing.plan import PlanConfig, plan_epoch
from mmfeed.packing import row_costs
from mmfeed.packing.balance import step_balance

__all__ = ["COLUMNS", "RANKS", "episode_tokens", "format_table", "main", "plot", "simulate"]

RANKS = (8, 16, 32, 64, 128, 256, 512, 1024)
COLUMNS = ("ranks", "steps", "rows_per_rank", "samples_per_rank", "dropped", "dropped_fraction", "efficiency",
           "epoch_balance", "step_balance", "shuffled_step_balance", "plan_s")


def episode_tokens(num_episodes: int, *, seed: int = 0, capacity: int = 8192) -> np.ndarray:
    """int64 [num_episodes]: synthetic robot-sample token prices (see the module docstring), at most capacity."""
    if num_episodes < 0:
        raise ValueError(f"num_episodes must be >= 0, got {num_episodes}")
    rng = np.random.default_rng([seed, num_episodes])
    frames = rng.integers(1, 7, num_episodes)
    tokens = frames * 256 + 2 * frames + 50 + rng.integers(5, 41, num_episodes)
    return np.minimum(tokens, capacity).astype(np.int64)


def simulate(num_episodes: int = 1_000_000, ranks: Sequence[int] = RANKS, *, capacity: int = 8192,
             rows_per_batch: int = 4, seed: int = 0, repeats: int = 1) -> list[dict[str, float]]:
    """One row (dict of the ``COLUMNS``) per world size in ``ranks``, planning epoch 0 of ``num_episodes``.

        >>> rows = simulate(2000, ranks=(2, 4), capacity=2048, rows_per_batch=2)
        >>> [r["ranks"] for r in rows], rows[0]["steps"] >= rows[1]["steps"]
        ([2, 4], True)
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not ranks or any(int(r) < 1 for r in ranks):
        raise ValueError(f"ranks must be world sizes >= 1, got {list(ranks)}")
    tokens = episode_tokens(num_episodes, seed=seed, capacity=capacity)
    config = PlanConfig(capacity=capacity, rows_per_batch=rows_per_batch)
    plan_epoch(tokens[:1000], config, seed=seed, epoch=0, world_size=int(ranks[0]))  # warm-up: compile the kernels
    out = []
    for world in map(int, ranks):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            plan = plan_epoch(tokens, config, seed=seed, epoch=0, world_size=world)
            times.append(time.perf_counter() - start)
        out.append(_row(plan, world, float(np.median(times)), seed))
    return out


def _row(plan, world: int, seconds: float, seed: int) -> dict[str, float]:
    totals = plan.rank_costs().sum(axis=1)  # each rank's cost over the epoch
    used = plan.steps >= 0
    counts = np.diff(plan.row_offsets)
    per_rank_samples = np.where(used, counts[np.maximum(plan.steps, 0)], 0).sum(axis=(1, 2))
    lengths = plan.tokens[plan.row_samples]
    row_of = np.repeat(np.arange(plan.num_rows), counts)
    per_row = row_costs(lengths, row_of, plan.capacity, alpha=plan.config.alpha)
    # The baseline: the same rows in the same slots, dealt in a random order instead of balanced.
    shuffled = plan.steps.copy()
    shuffled[used] = np.random.default_rng([seed, world]).permutation(plan.steps[used])
    return {
        "ranks": world,
        "steps": plan.num_steps,
        "rows_per_rank": float(used.sum(axis=(1, 2)).mean()),
        "samples_per_rank": float(per_rank_samples.mean()),
        "dropped": int(len(plan.dropped)),
        "dropped_fraction": float(len(plan.dropped) / max(len(plan.tokens), 1)),
        "efficiency": plan.efficiency,
        "epoch_balance": float(totals.mean() / totals.max()) if totals.size and totals.max() > 0 else 1.0,
        "step_balance": float(step_balance(plan.steps, per_row).mean()) if plan.num_steps else 1.0,
        "shuffled_step_balance": float(step_balance(shuffled, per_row).mean()) if plan.num_steps else 1.0,
        "plan_s": seconds,
    }


def format_table(rows: list[dict[str, float]]) -> str:
    """The rows as a fixed-width text table."""
    head = ("ranks", "steps", "rows/rank", "samples/rank", "dropped", "drop%", "eff%", "bal.epoch", "bal.step",
            "bal.shuffled", "plan_s")
    lines = ["  ".join(f"{h:>12}" for h in head)]
    for r in rows:
        cells = (r["ranks"], r["steps"], f"{r['rows_per_rank']:.1f}", f"{r['samples_per_rank']:.0f}", r["dropped"],
                 f"{100 * r['dropped_fraction']:.3f}", f"{100 * r['efficiency']:.2f}", f"{r['epoch_balance']:.4f}",
                 f"{r['step_balance']:.4f}", f"{r['shuffled_step_balance']:.4f}", f"{r['plan_s']:.2f}")
        lines.append("  ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


def plot(rows: list[dict[str, float]], path: str) -> None:
    """Steps per epoch and per-step balance (planned vs shuffled) against ranks, to ``path`` (matplotlib Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = [r["ranks"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.loglog(ranks, [r["steps"] for r in rows], "o-", base=2)
    left.set(xlabel="ranks", ylabel="steps per epoch", title="steps (every rank the same)")
    right.semilogx(ranks, [r["step_balance"] for r in rows], "o-", base=2, label="planned")
    right.semilogx(ranks, [r["shuffled_step_balance"] for r in rows], "s--", base=2, label="shuffled")
    right.set(xlabel="ranks", ylabel="mean / max rank cost per step", title="cost balance")
    right.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Print the scaling table; ``--json FILE`` and ``--plot FILE`` write it out as well. Returns 0."""
    parser = argparse.ArgumentParser(prog="python -m mmfeed.bench.scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=lambda s: int(float(s)), default=1_000_000, help="index size (1e6)")
    parser.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=list(RANKS),
                        help="comma-separated world sizes, default 8,16,...,1024")
    parser.add_argument("--capacity", type=int, default=8192, help="tokens per row (8192)")
    parser.add_argument("--rows-per-batch", type=int, default=4, help="rows per rank per step (4)")
    parser.add_argument("--repeats", type=int, default=1, help="planning repeats per world size (median)")
    parser.add_argument("--json", metavar="FILE", help="write {rows, settings} to FILE")
    parser.add_argument("--plot", metavar="FILE", help="write a plot (PNG) to FILE")
    args = parser.parse_args(argv)
    rows = simulate(args.episodes, args.ranks, capacity=args.capacity, rows_per_batch=args.rows_per_batch,
                    repeats=args.repeats)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "settings": vars(args)}, f, indent=2)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
