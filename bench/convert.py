"""Throughput of ``mmfeed convert``: one synthetic LeRobot AV1 dataset converted to H.264 shards by the local
engine with 1 and 2 worker processes and by Ray tasks on 2 CPUs, runs interleaved, median and spread.

Each run is a fresh ``convert`` into a new directory and reports episodes/s, MB/s written and the share of the
workers' time spent encoding; Ray runs join one local cluster started beforehand (as a job joins a running
cluster; its start-up is reported on its own line). A short job is dominated by fixed costs (spawning and
importing workers, the index), so the table also gives the steady-state worker seconds per episode (the time
inside shards over the episodes), measured with two workers busy at once. From that it projects a 100k-episode
conversion per added machine like this one: each machine converts ``CPUs / (worker seconds per episode)``
episodes a second (shards are independent; the shared filesystem keeps up), and the index is built once, on the
driver, at the measured index seconds per episode::

    python -m mmfeed.bench.convert --episodes 40 --frames 100 --runs 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from mmfeed._parsing import FRAME_SIZE, frame_size

__all__ = ["main", "measure"]

log = logging.getLogger(__name__)

CONFIGS = (("local, 1 worker", "local", 1), ("local, 2 workers", "local", 2), ("ray, 2 CPUs", "ray", 2))


def measure(episodes: int = 40, frames: int = 100, height: int = 96, width: int = 128, runs: int = 3,
            root: str | None = None) -> dict:
    """Every run of every configuration on one dataset: ``{"dataset": ..., "ray_start_seconds", "runs": {config:
    [summary fields]}}``."""
    from mmfeed.loaders.conversion.job import convert
    from mmfeed.testing import make_episodes, write_lerobot

    work = tempfile.mkdtemp(prefix="mmfeed-bench-convert-", dir=root)
    try:
        source = os.path.join(work, "lerobot")
        eps = make_episodes(episodes, seed=0, min_length=frames, max_length=frames, height=height, width=width,
                            cameras=("cam_high", "cam_wrist"))
        start = time.perf_counter()
        write_lerobot(source, eps, codec="av1")
        made = time.perf_counter() - start
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(source) for f in fs)
        out: dict = {"dataset": {"episodes": episodes, "frames": frames, "cameras": 2, "height": height,
                                 "width": width, "source_codec": "av1", "target_codec": "h264",
                                 "source_mb": size / 1e6, "write_seconds": made}, "runs": {c[0]: [] for c in CONFIGS}}
        ray = None
        if any(engine == "ray" for _, engine, _ in CONFIGS):
            import ray

            start = time.perf_counter()
            ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
            out["ray_start_seconds"] = time.perf_counter() - start
        try:
            for run in range(runs):
                for name, engine, workers in CONFIGS:
                    dst = os.path.join(work, f"out-{run}-{engine}-{workers}")
                    s = convert(source, dst, codec="h264", gop=30, episodes_per_shard=4, workers=workers,
                                engine=engine, progress=False)
                    out["runs"][name].append({"seconds": s.seconds, "episodes": s.episodes, "bytes": s.bytes,
                                              "busy_seconds": s.busy_seconds, "encode_seconds": s.encode_seconds,
                                              "read_seconds": s.read_seconds, "index_seconds": s.index_seconds,
                                              "open_seconds": s.open_seconds})
                    log.info("%s run %d: %.2f s", name, run, s.seconds)
                    shutil.rmtree(dst)
        finally:
            if ray is not None:
                ray.shutdown()
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(result: dict) -> list[dict]:
    """Per configuration: median and (min, max) of episodes/s, MB/s and encode share."""
    rows = []
    for name, runs in result["runs"].items():
        eps = [r["episodes"] / r["seconds"] for r in runs]
        mbs = [r["bytes"] / 1e6 / r["seconds"] for r in runs]
        share = [r["encode_seconds"] / r["busy_seconds"] for r in runs]
        index = [r["index_seconds"] / r["episodes"] for r in runs]
        worker = [r["busy_seconds"] / r["episodes"] for r in runs]
        rows.append({"config": name, "episodes_per_s": _spread(eps), "mb_per_s": _spread(mbs),
                     "encode_share": _spread(share), "worker_s_per_episode": _spread(worker),
                     "index_s_per_episode": float(np.median(index))})
    return rows


def projection(result: dict, episodes: int = 100_000, machines: tuple[int, ...] = (1, 2, 4, 8, 16),
               cpus: int = 2) -> list[dict]:
    """Hours for ``episodes`` on n machines of ``cpus`` CPUs, each converting ``cpus / (median worker seconds per
    episode with two workers busy)`` episodes a second, plus the index on the driver."""
    two = [r for name, runs in result["runs"].items() if "2" in name for r in runs]
    per_episode = float(np.median([r["busy_seconds"] / r["episodes"] for r in two]))
    index_hours = float(np.median([r["index_seconds"] / r["episodes"] for r in two])) * episodes / 3600
    rate = cpus / per_episode
    return [{"machines": n, "hours": episodes / (rate * n) / 3600 + index_hours, "index_hours": index_hours,
             "per_machine_rate": rate, "worker_s_per_episode": per_episode} for n in machines]


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": float(np.median(values)), "min": float(np.min(values)), "max": float(np.max(values))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmfeed.bench.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--frames", type=int, default=100, help="steps (and frames per camera) of every episode")
    parser.add_argument("--size", type=frame_size(min_width=32, min_height=16), default="128x96", metavar=FRAME_SIZE,
                        help=f"frame size of both cameras, {FRAME_SIZE} (default 128x96: 128 wide, 96 high)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", metavar="FILE", help="also write every run and the table as JSON")
    args = parser.parse_args(argv)
    result = measure(args.episodes, args.frames, args.size.height, args.size.width, args.runs)
    rows = table(result)
    d = result["dataset"]
    print(f"{d['episodes']} LeRobot AV1 episodes x {d['frames']} frames, 2 cameras {d['width']}x{d['height']} "
          f"({d['source_mb']:.1f} MB) -> H.264 shards of 4 episodes; {args.runs} runs each, interleaved; "
          f"{os.cpu_count()} CPUs")
    if "ray_start_seconds" in result:
        print(f"local Ray cluster start (once, before the runs): {result['ray_start_seconds']:.1f} s")
    print(f"{'config':<18} {'episodes/s':>20} {'MB/s written':>20} {'encode share':>18} {'worker s/episode':>22}")
    for r in rows:
        cells = [f"{r[k]['median']:.2f} ({r[k]['min']:.2f}-{r[k]['max']:.2f})"
                 for k in ("episodes_per_s", "mb_per_s")]
        share, worker = r["encode_share"], r["worker_s_per_episode"]
        print(f"{r['config']:<18} {cells[0]:>20} {cells[1]:>20} "
              f"{share['median']:>6.0%} ({share['min']:.0%}-{share['max']:.0%}) "
              f"{worker['median']:>8.3f} ({worker['min']:.3f}-{worker['max']:.3f})")
    plan = projection(result)
    print(f"100k episodes on n machines of 2 CPUs, each at 2 / {plan[0]['worker_s_per_episode']:.3f} = "
          f"{plan[0]['per_machine_rate']:.1f} episodes/s, index on the driver:")
    for p in plan:
        print(f"  {p['machines']:>3} machine(s): {p['hours']:.2f} h (of which index {p['index_hours'] * 60:.0f} min)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**result, "table": rows, "projection": plan}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
