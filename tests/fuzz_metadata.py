"""Fuzz the metadata of small datasets: each example copies a pristine LeRobot v3 directory or shard set, changes
one metadata field (info.json, the episodes parquet, a data file's episode_index, the shards' index) to a hostile
value, opens it and reads every episode. An example passes when the dataset either refuses with a clean error (a
ValueError, TypeError or OSError, one line, naming the dataset's file) or gives exactly the pristine episodes, in
bounded time; and no file outside the dataset is opened (an audit hook watches every ``open`` that Python makes: a
copy of the dataset lies beside it, so a path that escapes would find real files to read).

Run by hand for a long run (``python tests/fuzz_metadata.py --examples 2000 --seed 1``), every field with every
hostile value once (``--sweep``), or by
``tests/test_fuzz_metadata.py`` with a bounded number of examples. Prints one JSON line: the examples tried, the
outcomes by kind, the failures (each with its mutation), the slowest example's seconds and the peak RSS.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from mmfeed.loaders import open_dataset
from mmfeed.testing import make_episodes, write_lerobot, write_webdataset

CAMERA = "observation.images.cam_high"
SECONDS_PER_EXAMPLE = 20.0

# values no field may hold without a refusal or an unchanged dataset
HOSTILE_SCALARS = [0, -1, 1, 2, 7, 10**12, -(10**12), 2**63 - 1, 0.5, float("nan"), float("inf"), -float("inf"), None,
                   True, "", "x", "nan", [], {}, [1], [0, 0], [16384, 16384, 3], [-1], "a" * 100_000]
HOSTILE_PATHS = ["../secret/data/chunk-000/file-000.parquet", "../secret/videos/{video_key}/chunk-000/file-000.mp4",
                 "{secret}/data/chunk-000/file-000.parquet", "/etc/passwd", "{video_key.__class__}",
                 "{chunk_index.__doc__}", "{chunk_index:>3000000000}", "{nope}", "{chunk_index!r}", "{0}",
                 "http://127.0.0.1:9/x.parquet", "data/chunk-{chunk_index:03d}/../../../secret/x.parquet",
                 "data/chunk-{chunk_index:03d}/file-{file_index:03d}.m3u8", "file:///etc/passwd"]


def build(base: Path) -> dict[str, Path]:
    """The pristine datasets, and a copy of each beside them (what an escaping path would find)."""
    episodes = make_episodes(3, seed=0, cameras=("cam_high",), height=32, width=48, min_length=8, max_length=12,
                             state_dim=3, action_dim=2)
    out = {"lerobot": Path(write_lerobot(base / "pristine-lerobot", episodes)), "shards": base / "pristine-shards"}
    write_webdataset(out["shards"], episodes, episodes_per_shard=2)
    return out


def read_all(path: Path) -> dict:
    ds = open_dataset(str(path))
    episodes = []
    for i in range(len(ds)):
        ep = ds.episode(i)
        episodes.append({k: np.asarray(v) for k, v in ep.items() if k not in ("task", "fps")} | {
            "task": ep.get("task"), "fps": float(ep["fps"])})
    return {"len": len(ds), "features": sorted(ds.features), "episodes": episodes}


def same(a: dict, b: dict) -> bool:
    if a["len"] != b["len"] or a["features"] != b["features"]:
        return False
    for x, y in zip(a["episodes"], b["episodes"]):
        if x.keys() != y.keys():
            return False
        for k in x:
            if isinstance(x[k], np.ndarray):
                if x[k].shape != y[k].shape or x[k].dtype != y[k].dtype or not np.array_equal(
                        x[k], y[k], equal_nan=x[k].dtype.kind == "f"):
                    return False
            elif x[k] != y[k]:
                return False
    return True


# ------------------------------------------------------------------------------------------------ mutations
def _set(tree, path, value):
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def mutate_info(root: Path, path: tuple, value) -> None:
    info_path = root / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    if isinstance(value, str):
        value = value.replace("{secret}", str(root.parent / "secret"))
    _set(info, path, value)
    info_path.write_text(json.dumps(info))


def mutate_parquet(file: Path, column: str, row: int, value) -> None:
    table = pq.read_table(file)
    rows = table.to_pylist()
    rows[row][column] = value
    try:
        new = pa.Table.from_pylist(rows, schema=table.schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return  # a value this column's type cannot hold: the file keeps its pristine value
    pq.write_table(new, file)


def mutate_index(root: Path, row: int, where: tuple, value) -> None:
    file = root / "mmfeed-index.parquet"
    table = pq.read_table(file)
    rows = table.to_pylist()
    target = rows[row]
    if isinstance(value, str):
        value = value.replace("{secret}", str(root.parent / "secret"))
    _set(target, where, value)
    try:
        new = pa.Table.from_pylist(rows, schema=table.schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        return
    pq.write_table(new, file)


INFO_FIELDS = [("fps",), ("features",), ("data_path",), ("video_path",), ("total_episodes",), ("chunks_size",),
               ("features", CAMERA, "shape"), ("features", CAMERA, "dtype"), ("features", CAMERA),
               ("features", CAMERA, "info", "video.fps"), ("features", "observation.state", "shape"),
               ("features", "observation.state", "dtype"), ("features", "action", "shape"), ("features", "action"),
               ("codebase_version",)]
EPISODE_COLUMNS = ["length", "dataset_from_index", "dataset_to_index", "data/chunk_index", "data/file_index",
                   f"videos/{CAMERA}/chunk_index", f"videos/{CAMERA}/file_index", f"videos/{CAMERA}/from_timestamp",
                   f"videos/{CAMERA}/to_timestamp", "episode_index"]
INDEX_FIELDS = [("length",), ("fps",), ("shard",), ("features", 0, "shape"), ("features", 0, "fps"),
                ("features", 0, "frames"), ("features", 0, "offset"), ("features", 0, "size"),
                ("features", 0, "member"),
                ("features", 1, "shape"), ("features", 1, "offset"), ("features", 1, "size"), ("features", 1, "dtype"),
                ("shard_size",)]  # not episode_id: a label, renaming it may legally reorder the episodes


def mutations():
    value = st.sampled_from(HOSTILE_SCALARS + HOSTILE_PATHS)
    number = st.sampled_from([0, -1, 1, 5, 8, 11, 12, 1000, 10**12, -(10**12), 2**62])
    info = st.tuples(st.just("info"), st.sampled_from(INFO_FIELDS), value)
    episodes = st.tuples(st.just("episodes"), st.sampled_from(EPISODE_COLUMNS), st.integers(0, 2),
                         st.one_of(number, st.sampled_from([0.0, -1.0, 1e9, float("nan"), 0.25])))
    data = st.tuples(st.just("data"), st.integers(0, 30), st.sampled_from([0, 1, 2, 3, -1]))
    index = st.tuples(st.just("index"), st.integers(0, 2), st.sampled_from(INDEX_FIELDS),
                      st.one_of(value, number))
    return st.one_of(info, episodes, data, index).filter(lambda m: not _legal_rate(m))


def _legal_rate(mutation) -> bool:
    """A finite positive rate is a legal, different dataset (its windows change), not a hostile one."""
    field, value = mutation[-2], mutation[-1]
    rate = isinstance(field, tuple) and field[-1] in ("fps", "video.fps")
    return rate and isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def apply(mutation, work: Path, pristine: dict[str, Path]) -> Path:
    kind = mutation[0]
    source = pristine["shards" if kind == "index" else "lerobot"]
    root = work / "dataset"
    shutil.copytree(source, root)
    shutil.copytree(source, work / "secret")
    if kind == "info":
        mutate_info(root, mutation[1], copy.deepcopy(mutation[2]))
    elif kind == "episodes":
        mutate_parquet(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet", *mutation[1:])
    elif kind == "data":
        mutate_parquet(root / "data" / "chunk-000" / "file-000.parquet", "episode_index", *mutation[1:])
    else:
        mutate_index(root, mutation[1], mutation[2], copy.deepcopy(mutation[3]))
    return root


# ----------------------------------------------------------------------------------------------------- run
class Watch:
    """An audit hook that records every file Python opens inside ``secret`` (never removed: hooks cannot be)."""

    def __init__(self) -> None:
        self.secret: str | None = None
        self.escapes: list[str] = []
        sys.addaudithook(self)

    def __call__(self, event: str, args: tuple) -> None:
        if event == "open" and self.secret and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if path.startswith(self.secret + os.sep):
                self.escapes.append(path)


def describe(mutation) -> str:
    text = repr(mutation)
    return text if len(text) < 300 else text[:300] + "..."


def sweep() -> list:
    """Every field with every hostile value, once (the first row or episode where a row is named): the exhaustive
    counterpart of the seeded random draw."""
    values = HOSTILE_SCALARS + HOSTILE_PATHS
    out = [("info", f, v) for f in INFO_FIELDS for v in values]
    out += [("index", 0, f, v) for f in INDEX_FIELDS for v in values]
    out += [("episodes", c, 0, v) for c in EPISODE_COLUMNS for v in [0, -1, 1, 5, 8, 11, 12, 1000, 10**12,
                                                                      -(10**12), 2**62, 0.0, -1.0, 1e9,
                                                                      float("nan"), 0.25]]
    out += [("data", r, v) for r in (0, 11, 30) for v in (0, 1, 2, 3, -1)]
    return [m for m in out if not _legal_rate(m)]


class Trial:
    """Applies one mutation at a time to fresh copies of the pristine datasets and judges the outcome."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.pristine = build(base)
        self.want = {kind: read_all(path) for kind, path in self.pristine.items()}
        self.watch = Watch()
        self.outcomes: Counter = Counter()
        self.failures: list[dict] = []
        self.slowest = 0.0
        self.count = 0

    def __call__(self, mutation) -> None:
        work = self.base / f"ex-{self.count:06d}"
        self.count += 1
        work.mkdir()
        root = apply(mutation, work, self.pristine)
        watch = self.watch
        watch.secret, watch.escapes = os.path.realpath(work / "secret"), []
        start = time.perf_counter()
        os.environ["MMFEED_CACHE"] = str(work / "cache")
        try:
            got = read_all(root)
        except (ValueError, TypeError, OSError) as exc:
            message = str(exc)
            clean = "\n" not in message and len(message) < 2000 and str(root) in message
            self.outcomes[f"refused ({type(exc).__name__})" if clean else "unclean error"] += 1
            if not clean:
                self.failures.append({"mutation": describe(mutation), "why": "error not one line naming the dataset",
                                      "error": f"{type(exc).__name__}: {message[:500]}"})
        except Exception as exc:  # noqa: BLE001 - a bare traceback of any other kind is what the fuzz looks for
            self.outcomes["crash"] += 1
            self.failures.append({"mutation": describe(mutation), "why": "not a clean error",
                                  "error": f"{type(exc).__name__}: {str(exc)[:500]}"})
        else:
            kind = "shards" if mutation[0] == "index" else "lerobot"
            if same(got, self.want[kind]):
                self.outcomes["same episodes"] += 1
            else:
                self.outcomes["different episodes"] += 1
                self.failures.append({"mutation": describe(mutation), "why": "opened and read episodes that differ"})
        finally:
            seconds = time.perf_counter() - start
            watch.secret = None
            shutil.rmtree(work, ignore_errors=True)
        self.slowest = max(self.slowest, seconds)
        if seconds > SECONDS_PER_EXAMPLE:
            self.failures.append({"mutation": describe(mutation), "why": f"took {seconds:.1f} s"})
        if watch.escapes:
            self.failures.append({"mutation": describe(mutation), "why": "opened a file outside the dataset",
                                  "files": sorted(set(watch.escapes))[:5]})

    def report(self, **extra) -> dict:
        with open("/proc/self/status") as status:  # this process's own peak (ru_maxrss carries a parent's across exec)
            peak_mib = int(next(line.split()[1] for line in status if line.startswith("VmHWM:"))) / 1024
        return {"examples": sum(self.outcomes.values()), "outcomes": dict(self.outcomes), "failures": self.failures,
                "slowest_s": round(self.slowest, 2), "peak_rss_mib": round(peak_mib, 1), **extra}


def run(examples: int, seed_value: int, base: Path) -> dict:
    """``examples`` mutations drawn by hypothesis from ``seed_value``."""
    trial = Trial(base)

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(mutations())
    def example(mutation):
        trial(mutation)

    example()
    return trial.report(seed=seed_value)


def run_sweep(base: Path) -> dict:
    """Every mutation of :func:`sweep`."""
    trial = Trial(base)
    for mutation in sweep():
        trial(mutation)
    return trial.report(sweep=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sweep", action="store_true", help="every field with every hostile value, no random draw")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mmfeed-fuzz-") as tmp:
        report = run_sweep(Path(tmp)) if args.sweep else run(args.examples, args.seed, Path(tmp))
    print(json.dumps(report))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
