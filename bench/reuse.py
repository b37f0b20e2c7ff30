"""Decode reuse as a choice: what ``PlanConfig(reuse=k)`` buys in frames per CPU-second and costs in mixing.

With ``reuse=k`` the plan shuffles spans of ``k`` consecutive windows of one episode instead of single windows, so a
batch of 32 holds about ``32 / k`` spans; the workers decode each needed group of pictures once per batch, so the
``k`` windows of a span share their decodes. This runs ``lerobot_compare``'s sampling (global shuffle, batches of
32 windows of two frames plus the state and a 50-step action chunk, 2 persistent worker processes) on a LeRobot
directory (default: ``lerobot_compare``'s synthetic two-camera AV1 one) for each ``k``, the ``k`` values
interleaved round by round, and reports per ``k`` (medians of the rounds, with their min-max):

- samples/s, samples per CPU-second and delivered frames per CPU-second (CPU of the main process and the
  workers, their CPU-time clocks), and their ratio to ``k = 1`` in the same rounds;
- frames decoded per frame delivered (GOP dependencies included; counted in-process over the same number of
  batches), and from it frames decoded per CPU-second (delivered frames per CPU-second times that);
- the diversity a batch keeps: distinct episodes per batch and distinct spans (groups of consecutive windows of
  one episode) per batch, means over the measured batches.

::

    mmfeed bench reuse [--root DIR] [--ks 1,2,4,8] [--rounds 3] [--steps 40] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmfeed.bench.common import spread
from mmfeed.bench.lerobot_compare import default_window, mmfeed_loader, synthetic_root, time_mmfeed

__all__ = ["diversity", "main", "measure", "run"]


def diversity(groups: np.ndarray, batches: Sequence[np.ndarray]) -> dict[str, float]:
    """Mean distinct episodes and distinct spans (maximal runs of consecutive sample ids of one episode) per batch
    of sample ids, ``groups`` giving each sample's episode."""
    episodes, spans = [], []
    for ids in batches:
        ids = np.sort(np.asarray(ids, dtype=np.int64))
        episodes.append(len(np.unique(groups[ids])))
        breaks = (np.diff(ids) != 1) | (np.diff(groups[ids]) != 0)
        spans.append(int(breaks.sum()) + 1 if len(ids) else 0)
    return {"episodes_per_batch": float(np.mean(episodes)), "spans_per_batch": float(np.mean(spans))}


def decoded_per_delivered(root: str, delta: dict, videos: Sequence[str], k: int, batches: int) -> float:
    """Frames the decoder produced per frame of the video features ``videos`` delivered, over ``batches`` batches
    in this process."""
    from mmfeed.codecs._pyav import decode_totals

    before, delivered = decode_totals()["frames_decoded"], 0
    for n, batch in enumerate(mmfeed_loader(root, delta, num_workers=0, reuse=k)):
        if n == batches:
            break
        delivered += sum(int(batch.data[f].shape[0]) for f in videos if f in batch.data)
    return (decode_totals()["frames_decoded"] - before) / max(delivered, 1)


def measure(root: str, delta: dict, k: int, steps: int, groups: np.ndarray, frames: int) -> dict[str, Any]:
    """One timed stretch of the loader with ``reuse=k``: rates per second and per CPU-second (``frames``: the
    video frames a sample delivers), and its batches' diversity (``groups``: each sample's episode)."""
    got = time_mmfeed(root, delta, steps=steps, warmup=3, keep=True, reuse=k)
    # a stretch that used no CPU time at all has no figure
    per_cpu = got["samples"] / got["cpu_s"] if got["cpu_s"] > 0 else float("nan")
    return {"samples_per_s": got["samples_per_s"], "samples_per_cpu_s": per_cpu, "frames_per_cpu_s": frames * per_cpu,
            **diversity(groups, got["batches"])}


def run(root: str | None = None, ks: Sequence[int] = (1, 2, 4, 8), rounds: int = 3, steps: int = 40
        ) -> dict[str, Any]:
    """The table: for each ``k``, the medians of ``rounds`` interleaved stretches of ``steps`` batches."""
    root = str(root or synthetic_root())
    delta = default_window(root)
    items = mmfeed_loader(root, delta, num_workers=0).dataset.items  # the samples and episodes are the same for any k
    videos = [f for f in delta if items.source.features[f].kind == "video"]
    frames = sum(len(delta[f]) for f in videos)
    runs: dict[int, list[dict[str, Any]]] = {k: [] for k in ks}
    for r in range(rounds):
        for k in (ks if r % 2 == 0 else list(ks)[::-1]):  # alternate the order, so drift hits all alike
            runs[k].append(measure(root, delta, k, steps, items.table.groups, frames))
    base = runs[ks[0]]
    rows = []
    for k in ks:
        row: dict[str, Any] = {"k": k}
        for key in ("samples_per_s", "samples_per_cpu_s", "frames_per_cpu_s", "episodes_per_batch",
                    "spans_per_batch"):
            values = [m[key] for m in runs[k]]
            row[key] = statistics.median(values)
            row[f"{key}_spread"] = spread(values)
        for key in ("samples_per_s", "frames_per_cpu_s"):  # against k = ks[0] in the same rounds
            row[f"{key}_ratio"] = statistics.median(m[key] / b[key] for m, b in zip(runs[k], base))
        row["decoded_per_delivered"] = decoded_per_delivered(root, delta, videos, k, batches=steps)
        row["decoded_frames_per_cpu_s"] = row["frames_per_cpu_s"] * row["decoded_per_delivered"]
        rows.append(row)
    return {"root": root, "rounds": rounds, "steps": steps, "batch_size": 32, "workers": 2, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmfeed bench reuse", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="a LeRobot v3 directory (default: lerobot_compare's synthetic one)")
    parser.add_argument("--ks", default="1,2,4,8", help="the reuse values, comma-separated (the first is the base)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40, help="batches per timed stretch")
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args(argv)
    ks = [int(k) for k in args.ks.split(",")]
    report = run(args.root, ks, args.rounds, args.steps)
    print(f"{report['root']}: batches of 32 windows, 2 workers, median of {args.rounds} interleaved rounds")
    print(f"{'k':>3} {'samples/s':>10} {'x k=' + str(ks[0]):>7} {'frames/CPU-s':>13} {'x k=' + str(ks[0]):>7} "
          f"{'decoded/deliv':>13} {'decoded/CPU-s':>13} {'episodes/batch':>15} {'spans/batch':>12}")
    for row in report["rows"]:
        print(f"{row['k']:>3} {row['samples_per_s']:>10.0f} {row['samples_per_s_ratio']:>7.2f} "
              f"{row['frames_per_cpu_s']:>13.0f} {row['frames_per_cpu_s_ratio']:>7.2f} "
              f"{row['decoded_per_delivered']:>13.2f} {row['decoded_frames_per_cpu_s']:>13.0f} "
              f"{row['episodes_per_batch']:>15.1f} "
              f"{row['spans_per_batch']:>12.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
