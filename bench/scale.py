"""``python -m mmfeed.bench.scale [--json PATH] [--quick] [--before]``: planning, windows, the index and BlockMask
at scale.

Every case runs in a fresh Python process (``python -m mmfeed.bench.scale --case KIND ARGS``) so its peak RSS is
its own: ``peak_rss_bytes`` is the child's ``ru_maxrss`` minus its RSS just before the timed call (numba kernels
compiled and the inputs generated first), so ``bytes_per_sample`` is what planning adds per sample.

- ``plan``: ``plan_epoch`` over lognormal token prices (median 600, sigma 1, clipped to [1, 8192]), capacity
  8192, 4 rows per batch, mode "pack"; ``efficiency`` is the plan's packing efficiency.
- ``block_mask``: :func:`mmfeed.packing.metadata.block_tables` (block 128) of one row filled with documents of
  64-4096 tokens (alternately token-causal text and block-causal video of 256-token frames), best of 3 calls;
  ``table_bytes`` the memory its tables span; ``block_mask_seconds_per_row`` the whole
  ``PackedBatch.block_mask()`` (the tables, their transposes and the ``BlockMask``), best of 3.
- ``open``: a :class:`~mmfeed.loaders.formats.webdataset.source.WebDatasetSource` over a synthetic shard index
  (:func:`mmfeed.testing.synth_index.write_synthetic_index`: two cameras, state, action; written once into the
  bench cache), opened ``cold`` (an empty index-array cache: the parquet is read and its arrays derived and
  cached) and then ``warm`` (a fresh process mapping the cached arrays); ``rss_bytes`` is what the open added
  to the process, and two forked workers then read every index column: ``worker_private_bytes`` is the most
  one of them grew its private memory by (what a worker adds beyond the shared index pages) and
  ``worker_pss_bytes`` its proportional set size after the read (the index's pages split between the
  processes that map them).

- ``windows``: the public path over per-frame windows of a LeRobot v3 directory (4 real AV1 episodes of 250
  frames grown to ``episodes`` by :func:`mmfeed.testing.grow_lerobot`, metadata and data rows, a data file per
  million rows; written once into the bench cache: a few minutes at a million episodes): ``open_dataset``,
  ``ds.windows(spec)``, then ``mmfeed.DataLoader(ds, packing=...)`` at rank 0 of ``world_size``
  (``RANK``/``WORLD_SIZE``), no worker processes, until its first batch. The window is 2
  camera frames, 1 state and a 50-step action chunk; capacity 8192, 4 rows per batch. ``prices`` "one": the task
  text goes through a ``FixedLengthTokenizer`` (48 ids), so every window costs the same and the plan is
  arithmetic; "varied": UTF-8 bytes, so prices differ with the task and the windows are planned by price class
  (:class:`~mmfeed.packing.classes.ClassPlan`).
  ``open_s`` is ``open_dataset``; ``first_batch_s`` from building the loader to holding its first batch;
  ``peak_rss_bytes`` the process's peak (``VmHWM``, torch and everything imported included) and
  ``peak_above_import_bytes`` that less its RSS once the imports are done.

- ``lerobot_open``: ``open_dataset`` of a LeRobot v3 directory of ``episodes`` 20-step episodes in LeRobot's own
  layout (4 real episodes grown by :func:`mmfeed.testing.grow_lerobot`, ``meta/episodes`` in 4 files of row groups
  of ten, as LeRobot flushes them), each in a fresh process after the imports: ``compile`` compiles the parquet
  kernels of :mod:`mmfeed.loaders.stores.parquet_direct` (about 40 s once per install; loading them where numba's
  cache has them), ``floor`` only parses those files' parquet footers with pyarrow (what any reader pays),
  ``cold`` is the node's first open (the derived columns then kept in ``$MMFEED_CACHE/derived``; ``from_bytes``:
  whether the kernels were there to read the files with), ``warm`` a later open mapping them; ``seconds``,
  ``rss_bytes`` (what the open left in the process) and the process's peak. ``--rounds`` rounds of the three
  (``round``), each cold open over the floor measured just before it, the median printed with its range.

- ``stats``: ``mmfeed stats`` (:func:`~mmfeed.loaders.conversion.statistics.compute_stats`, local processes) over
  a LeRobot v3 directory of ``episodes`` 20-step episodes of a 7-dim arm (state, action, velocity, reward, done:
  4 real episodes grown by :func:`mmfeed.testing.grow_lerobot`, each grown episode with rows of its own, so each
  episode's rows are read, checked and counted for real); ``seconds``, ``steps_per_s``
  and the peak RSS of the process and of its largest worker.

``--before CODE_DIR`` times modules copied from an earlier commit instead (``plan.py``, ``balance.py`` and
``metadata.py`` read from that folder by path, e.g. ``git show REV:packing/balance.py > DIR/balance.py``);
the ``windows``, ``open`` and ``stats`` sections are skipped then.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

__all__ = ["main"]

QUICK = {"plan": [(10**6, 8), (10**6, 1024), (10**6, 4096), (10**7, 1024)],
         "block_mask": [8192, 32768, 131072], "open": [10**5], "windows": [(10**4, 1024, "one")],
         "lerobot_open": [10**5], "stats": [(10**5, 1)]}
FULL = {"plan": [(10**6, 8), (10**6, 1024), (10**6, 4096), (10**7, 8), (10**7, 1024), (10**7, 4096),
                 (10**8, 8), (10**8, 4096)],
        "block_mask": [8192, 32768, 131072, 1048576], "open": [10**6],
        "windows": [(10**4, 1024, "varied"), (10**4, 1024, "one"), (54_000, 1024, "varied"), (54_000, 1024, "one"),
                    (10**6, 1024, "one"), (10**6, 1024, "varied")],
        "lerobot_open": [10**5, 10**6], "stats": [(10**5, 1), (10**6, 1), (10**6, 2)]}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _load(before: str | None, name: str):
    if not before:
        return importlib.import_module(f"mmfeed.packing.{name}")
    path = os.path.join(before, f"{name}.py")
    if not os.path.exists(path):
        return importlib.import_module(f"mmfeed.packing.{name}")
    spec = importlib.util.spec_from_file_location(f"_before_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is made
    spec.loader.exec_module(mod)
    return mod


def _case_plan(samples: int, world: int, before: str | None) -> dict:
    if before:  # the old plan module must call the old balance: load balance first and bind it
        old_balance = _load(before, "balance")
        plan = _load(before, "plan")
        plan.balance, plan.row_costs = old_balance.balance, old_balance.row_costs
    else:
        plan = _load(None, "plan")
    rng = np.random.default_rng(0)
    tokens = np.clip(rng.lognormal(np.log(600), 1.0, samples), 1, 8192).astype(np.int64)
    cfg = plan.PlanConfig(capacity=8192, rows_per_batch=4)
    plan.plan_epoch(tokens[:20000], cfg, seed=0, epoch=0, world_size=min(world, 4))  # compile the kernels
    base = _rss()
    start = time.perf_counter()
    result = plan.plan_epoch(tokens, cfg, seed=0, epoch=0, world_size=world)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    eff = _efficiency(result)
    return {"samples": samples, "world_size": world, "mode": "pack", "seconds": seconds,
            "peak_rss_bytes": max(0, peak - base), "bytes_per_sample": max(0, peak - base) / samples,
            "efficiency": eff}


def _efficiency(plan) -> float:
    """Tokens of the dealt rows / their slots (Plan.efficiency without its per-sample np.add.at)."""
    used = plan.steps[plan.steps >= 0]
    if not used.size:
        return 0.0
    csum = np.concatenate([[0], np.cumsum(plan.tokens[plan.row_samples])])
    row_tokens = csum[plan.row_offsets[1:]] - csum[plan.row_offsets[:-1]]
    return float(row_tokens[used].sum() / (used.size * plan.capacity))


def _case_block_mask(capacity: int, before: str | None) -> dict:
    meta = _load(before, "metadata")
    rng = np.random.default_rng(capacity)
    lengths, steps = [], []
    while True:
        n = int(rng.integers(64, 4097))
        if sum(lengths) + n > capacity:
            break
        video = len(lengths) % 2 == 1
        n = max(256, n // 256 * 256) if video else n
        if sum(lengths) + n > capacity:
            break
        lengths.append(n)
        steps.append([256] * (n // 256) if video else None)
    lay = meta.layout_from_rows([lengths], capacity, step_sizes=[steps])
    ids = meta.document_metadata(lay)
    meta.block_tables(ids.document_ids[:, :1024], ids.step_ids[:, :1024], 128)  # compile
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        tables = meta.block_tables(ids.document_ids, ids.step_ids, 128)
        best = min(best, time.perf_counter() - start)
    row = {"capacity": capacity, "documents": len(lengths), "seconds_per_row": best,
           "table_bytes": sum(_span(t) for t in tables)}
    if not before:  # the whole BlockMask FlexAttention takes: both tables, their transposes, the mask_mod
        from mmfeed import PackedBatch

        batch = PackedBatch.from_lengths([lengths], capacity, step_sizes=[steps])
        batch.block_mask(128)
        row["block_mask_seconds_per_row"] = min(_timed(lambda: batch.block_mask(128)) for _ in range(3))
    return row


def _span(array: np.ndarray) -> int:
    """Bytes of memory an array's elements span (a strided view of compact tables: its storage)."""
    from numpy.lib.array_utils import byte_bounds

    low, high = byte_bounds(array)
    return high - low


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _memory(pid: str = "self") -> dict[str, int]:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    kb = {k: int(v.split()[0]) * 1024 for k, v in fields.items() if v.strip().endswith("kB")}
    return {"private": kb["Private_Clean"] + kb["Private_Dirty"], "pss": kb["Pss"]}


def _mapping_private(path: str) -> int:
    """Private bytes (pages no other process maps) of this process's mappings of the file ``path``."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and ":" not in head[0]:  # a mapping's first line
                inside = len(head) >= 6 and head[-1] == path
            elif inside and head[0] in ("Private_Clean:", "Private_Dirty:"):
                total += int(head[1]) * 1024
    return total


def _high_water() -> int:
    """This address space's peak RSS (``VmHWM``; ``ru_maxrss`` carries the parent's peak across exec)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def _touch(source) -> int:
    """Read every index column a source holds (the pages of the mapped index arrays); their sum."""
    total = int(source._lengths.sum()) + int(source._fps.sum()) + int(source._shard_of.sum())
    for f in source.features:
        offsets, sizes = source._members[f]
        total += int(offsets.sum() + sizes.sum() + source._frames[f].sum() + source._rates[f].sum())
    return total


def _worker(source, conn) -> None:
    """In a forked worker: read every index column and send how much private memory that added (in all, and in
    the mapped index file alone), the PSS after it and the columns' sum."""
    before = _memory()
    total = _touch(source)
    after = _memory()
    mapped = source._index.path
    conn.send({"private": after["private"] - before["private"], "pss": after["pss"], "total": total,
               "index_private": _mapping_private(mapped) if mapped else None})


def _case_open(episodes: int, directory: str) -> dict:
    import multiprocessing as mp

    from mmfeed.loaders.formats.webdataset.source import WebDatasetSource

    base = _rss()
    start = time.perf_counter()
    source = WebDatasetSource(directory)
    seconds = time.perf_counter() - start
    rss = _rss() - base
    _touch(source)  # the training process reads its index too
    ctx = mp.get_context("fork")
    workers = []
    for _ in range(2):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(source, child))
        proc.start()
        workers.append(parent.recv())
        proc.join(60)
    return {"format": "webdataset", "episodes": episodes, "seconds": seconds, "rss_bytes": max(rss, 0),
            "peak_rss_bytes": _high_water(),
            "worker_private_bytes": max(w["private"] for w in workers),
            "worker_pss_bytes": max(w["pss"] for w in workers)}


def _case_windows(episodes: int, world: int, prices: str, root: str) -> dict:
    os.environ.update(RANK="0", WORLD_SIZE=str(world))
    import mmfeed
    from mmfeed.codecs import ByteTokenizer, FixedLengthTokenizer
    from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset

    spec = WindowSpec.from_delta_timestamps({"observation.images.cam_high": [-1 / 30, 0.0],
                                             "observation.state": [0.0], "action": [i / 30 for i in range(50)]})
    tokenizer = FixedLengthTokenizer(ByteTokenizer(), 48, pad_id=0) if prices == "one" else ByteTokenizer()
    packing = Packing(layout=TokenLayout(tokens_per_frame={"observation.images.cam_high": 64}), window=spec,
                      plan=PlanConfig(capacity=8192, rows_per_batch=4), tokenizer=tokenizer)
    base = _rss()
    start = time.perf_counter()
    ds = open_dataset(root)
    opened = time.perf_counter()
    windows = len(ds.windows(spec))
    loader = mmfeed.DataLoader(ds, packing=packing, num_workers=0)
    batch = next(iter(loader))
    done = time.perf_counter()
    assert int(batch.cu_seqlens[-1]) > 0
    peak = _high_water()
    return {"episodes": episodes, "windows": windows, "world_size": world, "prices": prices,
            "plan": type(loader.dataset.plan(0)).__name__, "steps": len(loader), "open_s": opened - start,
            "first_batch_s": done - opened, "peak_rss_bytes": peak, "peak_above_import_bytes": peak - base}


def _case_lerobot_open(episodes: int, mode: str, root: str) -> dict:
    import glob

    import pyarrow.parquet as pq

    import mmfeed.loaders.formats.lerobot.source  # noqa: F401 - imported before the clock starts, as in training
    from mmfeed.loaders import open_dataset

    from mmfeed.loaders.stores.parquet_direct import compile_kernels, direct_ready

    ready = direct_ready() if mode == "cold" else None
    base = _rss()
    start = time.perf_counter()
    if mode == "compile":
        assert compile_kernels()
    elif mode == "floor":
        for path in sorted(glob.glob(os.path.join(root, "meta", "episodes", "*", "*.parquet"))):
            pq.ParquetFile(path).metadata  # the footer, parsed
    else:
        assert len(open_dataset(root)) == episodes
    seconds = time.perf_counter() - start
    return {"episodes": episodes, "mode": mode, "seconds": seconds, "rss_bytes": max(_rss() - base, 0),
            "peak_rss_bytes": _high_water(), **({"from_bytes": ready} if ready is not None else {})}


def _lerobot_meta_root(episodes: int) -> str:
    """A LeRobot directory of 4 real 20-step arm episodes grown to ``episodes``, meta/episodes in 4 files of row
    groups of ten (in the bench cache)."""
    from mmfeed.bench.common import cache_dir
    from mmfeed.testing import grow_lerobot, make_episodes, write_lerobot

    root = cache_dir("scale-lerobot-meta") / str(episodes)
    if not (root / "meta" / "info.json").exists():
        write_lerobot(root, make_episodes(4, seed=0, min_length=20, max_length=20, cameras=(), state_dim=7,
                                          action_dim=7))
        grow_lerobot(root, episodes, files=4, row_group_size=10)
    return str(root)


def _lerobot_open_rows(episodes: int, timeout: float, rounds: int = 1) -> list[dict]:
    """After the parquet kernels are compiled (once per install: ``compile`` loads them from numba's cache where
    they are), ``rounds`` rounds of the footer floor, the node's first open and a later one, each in a fresh
    process, each round with a fresh cache (its row's ``round``)."""
    import tempfile

    root = _lerobot_meta_root(episodes)
    rows = [_child("lerobot_open", [episodes, "compile", root], None, max(timeout, 300))]
    for k in range(rounds):
        with tempfile.TemporaryDirectory() as cache:
            rows += [{**row, "round": k} if "error" not in row else row
                     for row in (_child("lerobot_open", [episodes, mode, root], None, timeout,
                                        env={"MMFEED_CACHE": cache}) for mode in ("floor", "cold", "warm"))]
    return rows


def _case_stats(episodes: int, workers: int, root: str) -> dict:
    from mmfeed.loaders.conversion.statistics import compute_stats

    base = _rss()
    start = time.perf_counter()
    stats = compute_stats(root, workers=workers)
    seconds = time.perf_counter() - start
    steps = int(stats.datasets[0]["action"]["count"][0])
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"episodes": episodes, "steps": steps, "workers": workers, "seconds": seconds,
            "steps_per_s": steps / seconds, "peak_rss_bytes": _high_water(), "peak_above_import_bytes":
            _high_water() - base, "worker_peak_rss_bytes": children if workers > 1 else None}


def _stats_root(episodes: int) -> str:
    """A LeRobot directory of 4 real 20-step arm episodes grown to ``episodes`` (in the bench cache)."""
    from mmfeed.bench.common import cache_dir
    from mmfeed.testing import grow_lerobot, make_episodes, write_lerobot

    root = cache_dir("scale-stats-rows") / str(episodes)  # grown with rows of their own
    if not (root / "meta" / "info.json").exists():
        write_lerobot(root, make_episodes(4, seed=0, min_length=20, max_length=20, cameras=(), state_dim=7,
                                          action_dim=7))
        grow_lerobot(root, episodes)
    return str(root)


def _windows_root(episodes: int) -> str:
    """A LeRobot directory of 4 real episodes grown to ``episodes``, metadata and rows (in the bench cache)."""
    from mmfeed.bench.common import cache_dir
    from mmfeed.testing import grow_lerobot, make_episodes, write_lerobot

    root = cache_dir("scale-lerobot-rows") / str(episodes)  # grown with rows of their own
    if not (root / "meta" / "info.json").exists():
        write_lerobot(root, make_episodes(4, seed=0, min_length=250, max_length=250, cameras=("cam_high",)))
        grow_lerobot(root, episodes)
    return str(root)


def _open_rows(episodes: int, timeout: float) -> list[dict]:
    """The cold and the warm open of the synthetic index of ``episodes`` (written into the bench cache once)."""
    import tempfile

    from mmfeed.bench.common import cache_dir
    from mmfeed.loaders.stores.index import INDEX_FILENAME
    from mmfeed.testing.synth_index import write_synthetic_index

    directory = cache_dir("scale-index") / str(episodes)
    if not (directory / INDEX_FILENAME).exists():
        write_synthetic_index(directory, episodes)
    rows = []
    with tempfile.TemporaryDirectory() as arrays:
        for state in ("cold", "warm"):
            row = _child("open", [episodes, str(directory)], None, timeout, env={"MMFEED_CACHE": arrays})
            rows.append({"cache": state, **row})
    return rows


def _child(kind: str, args: list, before: str | None, timeout: float,
           env: dict[str, str] | None = None) -> dict | None:
    cmd = [sys.executable, "-m", "mmfeed.bench.scale", "--case", kind, *map(str, args)]
    if before:
        cmd += ["--before", before]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True,
                             env={**os.environ, **(env or {})}).stdout
    except subprocess.TimeoutExpired:
        return {"kind": kind, "args": args, "error": f"over {timeout:.0f} s"}
    except subprocess.CalledProcessError as err:
        return {"kind": kind, "args": args, "error": err.stderr.strip().splitlines()[-1:]}
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="mmfeed bench scale", description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--quick", action="store_true", help="the small cases only (under a minute)")
    p.add_argument("--before", help="folder holding plan.py / balance.py / metadata.py of an earlier commit")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per case before it is given up")
    p.add_argument("--only", nargs="+", choices=sorted(FULL), help="run these tables only")
    p.add_argument("--rounds", type=int, help="rounds of the LeRobot floor, cold and warm opens (default: 1 with "
                   "--quick, else 3), each cold open over the floor measured just before it")
    p.add_argument("--case", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.case:
        kind, *nums = args.case
        if kind == "plan":
            print(json.dumps(_case_plan(int(nums[0]), int(nums[1]), args.before)))
        elif kind == "open":
            print(json.dumps(_case_open(int(nums[0]), nums[1])))
        elif kind == "stats":
            print(json.dumps(_case_stats(int(nums[0]), int(nums[1]), nums[2])))
        elif kind == "lerobot_open":
            print(json.dumps(_case_lerobot_open(int(nums[0]), nums[1], nums[2])))
        elif kind == "windows":
            print(json.dumps(_case_windows(int(nums[0]), int(nums[1]), nums[2], nums[3])))
        else:
            print(json.dumps(_case_block_mask(int(nums[0]), args.before)))
        return 0
    cases = {name: rows if not args.only or name in args.only else []
             for name, rows in (QUICK if args.quick else FULL).items()}
    rounds = args.rounds or (1 if args.quick else 3)
    out: dict = {"plan": [], "windows": [], "open": [], "lerobot_open": [], "block_mask": [], "stats": []}
    print(f"{'samples':>11} {'ranks':>6} {'seconds':>8} {'peak MB':>8} {'B/sample':>9} {'efficiency':>10}")
    for samples, world in cases["plan"]:
        row = _child("plan", [samples, world], args.before, args.timeout)
        out["plan"].append(row)
        if "error" in row:
            print(f"{samples:>11} {world:>6}  {row['error']}")
        else:
            print(f"{samples:>11} {world:>6} {row['seconds']:>8.3f} {row['peak_rss_bytes'] / 2**20:>8.1f} "
                  f"{row['bytes_per_sample']:>9.1f} {row['efficiency']:>10.5f}")
    print(f"\n{'capacity':>9} {'documents':>9} {'tables ms/row':>13} {'table MB':>8} {'BlockMask ms/row':>16}")
    for capacity in cases["block_mask"]:
        row = _child("block_mask", [capacity], args.before, args.timeout)
        out["block_mask"].append(row)
        if "error" in row:
            print(f"{capacity:>9}  {row['error']}")
        else:
            mask = row.get("block_mask_seconds_per_row")
            print(f"{capacity:>9} {row['documents']:>9} {row['seconds_per_row'] * 1e3:>13.2f} "
                  f"{row['table_bytes'] / 2**20:>8.2f} {'' if mask is None else f'{mask * 1e3:.2f}':>16}")
    print(f"\n{'episodes':>9} {'cache':>5} {'seconds':>8} {'RSS MB':>7} {'worker private MB':>17} "
          f"{'worker PSS MB':>13}")
    for episodes in cases["open"] if not args.before else ():
        for row in _open_rows(episodes, args.timeout):
            out["open"].append(row)
            if "error" in row:
                print(f"{episodes:>9} {row['cache']:>5}  {row['error']}")
            else:
                print(f"{episodes:>9} {row['cache']:>5} {row['seconds']:>8.2f} {row['rss_bytes'] / 2**20:>7.0f} "
                      f"{row['worker_private_bytes'] / 2**20:>17.1f} {row['worker_pss_bytes'] / 2**20:>13.0f}")
    print(f"\n{'LeRobot':>9} {'open':>7} {'seconds':>8} {'x floor':>7} {'RSS MB':>7} {'peak MB':>7}")
    for episodes in cases["lerobot_open"] if not args.before else ():
        floor, over = None, []
        for row in _lerobot_open_rows(episodes, args.timeout, rounds):
            out["lerobot_open"].append(row)
            if "error" in row:
                print(f"{episodes:>9} {'':>7}  {row['error']}")
                continue
            floor = row["seconds"] if row["mode"] == "floor" else floor
            ratio = row["seconds"] / floor if floor and row["mode"] != "compile" else None
            over += [ratio] if row["mode"] == "cold" and ratio else []
            print(f"{episodes:>9} {row['mode']:>7} {row['seconds']:>8.2f} {'' if ratio is None else f'{ratio:.2f}':>7} "
                  f"{row['rss_bytes'] / 2**20:>7.0f} {row['peak_rss_bytes'] / 2**20:>7.0f}")
        if over:
            print(f"{episodes:>9} cold over floor: median {np.median(over):.2f} ({min(over):.2f}-{max(over):.2f}, "
                  f"{len(over)} rounds)")
    print(f"\n{'episodes':>9} {'windows':>11} {'ranks':>5} {'prices':>6} {'plan':>11} {'open s':>6} "
          f"{'1st batch s':>11} {'peak MB':>7} {'above import MB':>15}")
    for episodes, world, prices in cases["windows"] if not args.before else ():
        row = _child("windows", [episodes, world, prices, _windows_root(episodes)], None, args.timeout)
        out["windows"].append(row)
        if "error" in row:
            print(f"{episodes:>9} {'':>11} {world:>5} {prices:>6}  {row['error']}")
        else:
            print(f"{episodes:>9} {row['windows']:>11} {world:>5} {prices:>6} {row['plan']:>11} "
                  f"{row['open_s']:>6.2f} {row['first_batch_s']:>11.2f} {row['peak_rss_bytes'] / 2**20:>7.0f} "
                  f"{row['peak_above_import_bytes'] / 2**20:>15.0f}")
    print(f"\n{'episodes':>9} {'steps':>10} {'workers':>7} {'stats s':>7} {'steps/s':>10} {'peak MB':>7} "
          f"{'worker peak MB':>14}")
    for episodes, workers in cases["stats"] if not args.before else ():
        row = _child("stats", [episodes, workers, _stats_root(episodes)], None, args.timeout)
        out["stats"].append(row)
        if "error" in row:
            print(f"{episodes:>9} {'':>10} {workers:>7}  {row['error']}")
        else:
            worker = row["worker_peak_rss_bytes"]
            print(f"{episodes:>9} {row['steps']:>10} {workers:>7} {row['seconds']:>7.2f} {row['steps_per_s']:>10.0f} "
                  f"{row['peak_rss_bytes'] / 2**20:>7.0f} {'' if worker is None else f'{worker / 2**20:.0f}':>14}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
