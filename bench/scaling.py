"""``python -m mmfeed.bench.scaling``: how the epoch plan scales from 8 to 1024 ranks, from the planner alone.

No process is started and nothing is read: an index of synthetic episodes (one sample per episode, robot-like
token prices: 1-6 frames x 256 tokens + 2 state tokens per frame + a 50-token action chunk + 5-40 text tokens)
is planned with :func:`~mmfeed.packing.plan.plan_epoch` for each world size. Per world size the table gives the
steps every rank runs, the rows each rank gets over the epoch, the samples dropped so that every rank runs the
same number of steps, the packing efficiency, and the cost balance across ranks: ``epoch`` = mean / max of the
ranks' total attention cost over the epoch, ``step`` = the mean over steps of mean / max rank cost in that step
(ranks synchronise every step, so the slowest rank of each step sets the pace), beside ``shuffled``: the same
rows dealt to ranks in a random order (the baseline). ``plan_s`` is the planning time (median of ``repeats``).

``--measure`` runs real jobs instead: for each of ``--world-sizes`` (default 1, 2, 4, ... up to the CPU count,
at most 8) ``torchrun --standalone --nproc_per_node=W python -m mmfeed.bench.scaling_job`` trains a small MLP
under DistributedDataParallel (gloo) fed by mmfeed.DataLoader with a fixed per-rank batch (weak scaling), its
StepTimer watching the model (see :mod:`mmfeed.bench.scaling_job`). Each job measures ``--repeats`` stretches
of ``--steps`` steps after ``--warmup``. Per world size the curve gives the step time and its phases (mean over
ranks, seconds per step): ``wait`` (input), ``copy`` (host to device; none on CPU), ``compute`` (minus exposed
comm), ``comm`` (exposed: not overlapped with backward, including the wait for a slower rank) and ``comm_total``
(all collective time), the weak-scaling ``efficiency`` (step_s at the smallest world size / step_s at W),
``samples_per_s`` over all ranks and the stall fraction of the slowest rank. Each figure is the median of the
stretches; the JSON's ``measured`` section holds one row per world size (``{"name": "w2", "step_s": ...,
"compute_s": ...}``) and ``repeats`` (``{"w2.compute_s": [per stretch]}``), which ``mmfeed compare`` reads as
``measured.w2.compute_s`` with the stretches' spread as its noise. ``--compute-ms`` (sleep in the model's
forward: a bigger model), ``--decode-ms`` (per sample, in the workers' stage "decode") and ``--comm-delay-ms``
(a sleep chained to each bucket's allreduce in the comm hook) move one phase each.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmfeed._parsing import positive as _positive  # the one parser of "a number >= minimum" for every command line
from mmfeed.packing import row_costs
from mmfeed.packing.balance import step_balance
from mmfeed.packing.plan import PlanConfig, plan_epoch

__all__ = ["COLUMNS", "JOB_DEFAULTS", "QUICK", "RANKS", "default_world_sizes", "episode_tokens", "format_curve",
           "format_table", "main", "measure", "plot", "simulate"]

logger = logging.getLogger(__name__)

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


# -- the measured curve ---------------------------------------------------------------------------------------
# Job settings of the measured curve (see mmfeed.bench.scaling_job); --quick replaces some with QUICK.
JOB_DEFAULTS = {"steps": 10, "warmup": 5, "repeats": 5, "batch": 32, "workers": 2, "prefetch": 2, "decode_ms": 0.5,
                "compute_ms": 10.0, "comm_delay_ms": 0.0, "hidden": 1024}
QUICK = {"steps": 5, "warmup": 2, "repeats": 5, "batch": 16, "hidden": 512, "decode_ms": 0.25}
# figures of a row, each from every stretch: (row key, timer figure averaged over the ranks)
_PHASE_FIGURES = (("step_s", "step_s"), ("wait_s", "wait_s"), ("copy_s", "copy_s"), ("compute_s", "compute_s"),
                  ("comm_s", "comm_s"), ("comm_total_s", "comm_total_s"))


def default_world_sizes(cpus: int | None = None) -> list[int]:
    """1, 2, 4, ... up to the CPU count (at least 1, 2; at most 8)."""
    cpus = max(int(cpus or os.cpu_count() or 1), 2)
    out, w = [], 1
    while w <= min(cpus, 8):
        out.append(w)
        w *= 2
    return out


def _job_args(settings: Mapping[str, Any]) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in settings.items()]


def _launch(world: int, settings: Mapping[str, Any], out: Path, timeout: float) -> dict[str, Any]:
    """Run the job at ``world`` ranks under torchrun and return rank 0's result; ChildProcessError if it fails.

    The job runs in a session of its own and its whole process group (torchrun, the ranks, their workers) is
    killed when it ends or times out, so that nothing is left running."""
    env = dict(os.environ)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
        env.pop(name, None)  # a launcher itself started by torchrun must not hand its ranks down
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
           "--monitor-interval=0.1", "-m", "mmfeed.bench.scaling_job", f"--json={out}", *_job_args(settings)]
    logger.info("measuring %d rank(s): %s", world, " ".join(cmd))
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ChildProcessError(f"the {world}-rank job ran past {timeout:.0f} s and was killed") from None
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    if proc.returncode != 0 or not out.exists():
        tail = "\n".join(output.strip().splitlines()[-40:])
        raise ChildProcessError(f"the {world}-rank job failed (torchrun exit {proc.returncode}):\n{tail}")
    return json.loads(out.read_text(encoding="utf-8"))


def _stretch(report: Mapping[str, Any], world: int, batch: int) -> dict[str, float | None]:
    """One stretch's figures: per-step means averaged over the ranks, the slowest rank's stall fraction."""
    ranks = report.get("ranks") or {}
    mean, top = ranks.get("mean", {}), ranks.get("max", {})
    out: dict[str, float | None] = {}
    for key, figure in _PHASE_FIGURES:
        value = mean.get(f"{figure}.mean")
        if value is None and report.get(figure):  # a figure the ranks' summary does not carry: rank 0's
            value = report[figure]["mean"]
        out[key] = None if value is None else float(value)
    out["stall_fraction"] = float(top.get("stall_fraction", report["stall_fraction"]))
    out["samples_per_s"] = world * batch / out["step_s"] if out["step_s"] else None
    for name, vals in report.get("stages", {}).items():
        out[f"stage_s.{name}"] = float(mean.get(f"stages.{name}.mean_s", vals["mean_s"]))
    return out


def measure(world_sizes: Sequence[int], settings: Mapping[str, Any] | None = None, *,
            timeout: float = 300.0) -> dict[str, Any]:
    """The measured weak-scaling curve: ``{"world_sizes", "rows": [one per world size], "repeats": {"w2.step_s":
    [per stretch], ...}}`` (see the module docstring); ``settings`` override :data:`JOB_DEFAULTS`."""
    settings = {**JOB_DEFAULTS, **(settings or {})}
    sizes = [int(w) for w in world_sizes]
    if not sizes or any(w < 1 for w in sizes):
        raise ValueError(f"world sizes must be >= 1, got {list(world_sizes)}")
    if max(sizes) > (os.cpu_count() or 1):
        logger.warning("%d ranks on %s CPUs: the ranks share cores, the curve measures that too", max(sizes),
                       os.cpu_count())
    rows, repeats = [], {}
    with tempfile.TemporaryDirectory(prefix="mmfeed-scaling-") as tmp:
        for world in sizes:
            result = _launch(world, settings, Path(tmp) / f"w{world}.json", timeout)
            stretches = [_stretch(r, world, settings["batch"]) for r in result["reports"]]
            name = f"w{world}"
            row: dict[str, Any] = {"name": name, "world_size": world, "batch_per_rank": settings["batch"],
                                   "steps": settings["steps"], "stage_s": {}}
            for key in stretches[0]:
                values = [s[key] for s in stretches if s.get(key) is not None]
                value = statistics.median(values) if values else None
                if key.startswith("stage_s."):
                    row["stage_s"][key.split(".", 1)[1]] = value
                else:
                    row[key] = value
                if values:
                    repeats[f"{name}.{key}"] = values
            rows.append(row)
    smallest = min(rows, key=lambda r: r["world_size"])
    for row in rows:
        row["efficiency"] = smallest["step_s"] / row["step_s"] if row["step_s"] else None
    return {"world_sizes": sizes, "rows": rows, "repeats": repeats}


def format_curve(measured: Mapping[str, Any]) -> str:
    """The measured curve as a fixed-width text table (times in ms per step)."""
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1e3:.2f}"

    head = ("ranks", "step_ms", "wait_ms", "copy_ms", "compute_ms", "comm_ms", "comm_total_ms", "efficiency",
            "samples/s", "stall_max")
    lines = ["  ".join(f"{h:>13}" for h in head)]
    for r in measured["rows"]:
        cells = (r["world_size"], ms(r["step_s"]), ms(r["wait_s"]), ms(r["copy_s"]), ms(r["compute_s"]),
                 ms(r["comm_s"]), ms(r["comm_total_s"]),
                 "-" if r["efficiency"] is None else f"{100 * r['efficiency']:.1f}%",
                 "-" if r["samples_per_s"] is None else f"{r['samples_per_s']:.0f}",
                 f"{100 * r['stall_fraction']:.2f}%")
        lines.append("  ".join(f"{c:>13}" for c in cells))
    return "\n".join(lines)


def _world_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of world sizes") from None
    if not sizes or any(w < 1 for w in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: world sizes must be >= 1")
    return sizes




_int0, _int1, _ms = _positive(int, 0), _positive(int, 1), _positive(float, 0.0)


def _measure_main(args: argparse.Namespace) -> int:
    settings = dict(JOB_DEFAULTS)
    if args.quick:
        settings.update(QUICK)
    for key in JOB_DEFAULTS:
        if getattr(args, key, None) is not None:
            settings[key] = getattr(args, key)
    sizes = args.world_sizes or default_world_sizes()
    measured = measure(sizes, settings, timeout=args.timeout)
    print(f"weak scaling, measured: {settings['batch']} samples per rank per step, {settings['repeats']} x "
          f"{settings['steps']} steps per world size (medians), torchrun on gloo")
    print(format_curve(measured))
    if args.json:
        from mmfeed.bench.common import environment

        report = {"benchmark": "mmfeed bench scaling --measure", "measured": measured,
                  "settings": {**settings, "world_sizes": sizes}, "environment": environment()}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Print the scaling table (or with ``--measure`` the measured curve); ``--json FILE`` and ``--plot FILE``
    write it out as well. Returns 0."""
    parser = argparse.ArgumentParser(prog="python -m mmfeed.bench.scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=lambda s: int(float(s)), default=1_000_000, help="index size (1e6)")
    parser.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=list(RANKS),
                        help="comma-separated world sizes, default 8,16,...,1024")
    parser.add_argument("--capacity", type=int, default=8192, help="tokens per row (8192)")
    parser.add_argument("--rows-per-batch", type=int, default=4, help="rows per rank per step (4)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="planning repeats per world size (median; default 1); with --measure: measured "
                             f"stretches per job (default {JOB_DEFAULTS['repeats']})")
    parser.add_argument("--json", metavar="FILE", help="write {rows, settings} (with --measure: {measured, "
                        "settings, environment}, input of `mmfeed compare`) to FILE")
    parser.add_argument("--plot", metavar="FILE", help="write a plot (PNG) of the plan's table to FILE")
    m = parser.add_argument_group("measured curve (--measure)")
    m.add_argument("--measure", action="store_true",
                   help="run real torchrun jobs (gloo) and print the measured weak-scaling curve instead")
    m.add_argument("--world-sizes", type=_world_sizes, metavar="1,2",
                   help=f"ranks of each job (default {','.join(map(str, default_world_sizes()))} here)")
    for key, kind, text in (("steps", _int1, "steps per measured stretch"), ("warmup", _int0, "steps before them"),
                            ("batch", _int1, "samples per rank per step"),
                            ("workers", _int0, "loader workers per rank"),
                            ("prefetch", _int0, "batches a loader thread receives ahead (0: none)"),
                            ("hidden", _int1, "width of the MLP"),
                            ("compute_ms", _ms, "sleep in each forward (a bigger model)"),
                            ("decode_ms", _ms, "sleep per sample in the workers' stage 'decode'"),
                            ("comm_delay_ms", _ms, "sleep after each bucket's allreduce (a slower network)")):
        quick = f", --quick {QUICK[key]}" if key in QUICK else ""
        m.add_argument(f"--{key.replace('_', '-')}", type=kind, default=None,
                       help=f"{text} (default {JOB_DEFAULTS[key]}{quick})")
    m.add_argument("--quick", action="store_true", help="small jobs (for tests)")
    m.add_argument("--timeout", type=float, default=300.0, help="seconds one job may run (default 300)")
    args = parser.parse_args(argv)
    job_only = [f"--{k.replace('_', '-')}" for k in (*JOB_DEFAULTS, "world_sizes") if k != "repeats"
                and getattr(args, k, None) is not None] + ["--quick"] * args.quick
    if job_only and not args.measure:
        parser.error(f"{', '.join(job_only)} set the measured jobs: add --measure")
    if args.measure:
        if args.plot:
            parser.error("--plot draws the plan's table; it does not go with --measure")
        if args.repeats is not None and args.repeats < 1:
            parser.error(f"--repeats must be >= 1, got {args.repeats}")
        return _measure_main(args)
    rows = simulate(args.episodes, args.ranks, capacity=args.capacity, rows_per_batch=args.rows_per_batch,
                    repeats=1 if args.repeats is None else args.repeats)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "settings": vars(args)}, f, indent=2)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
