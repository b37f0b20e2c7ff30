"""The ``mmfeed`` command line, end to end through ``python -m mmfeed`` on tiny real data (real mp4s in real tars,
real parquet, real worker processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

COMMANDS = ("bench", "compare", "synth", "index", "inspect")
FIGURES = ("samples_per_s", "tokens_per_s", "frames_per_s", "stall_fraction", "packing_efficiency", "wait_s")
TINY = ("--size", "96x64", "--min-length", "20", "--max-length", "30")
# quick bench settings sized for the tiny dataset: 16 tokens per frame -> about 90 tokens per sample
QUICK_BENCH = ("--quick", "--no-progress", "--capacity", "512", "--tokens-per-frame", "16")


def mmfeed(*args: str, cache: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if cache is not None:
        env["MMFEED_CACHE"] = str(cache)
    return subprocess.run([sys.executable, "-m", "mmfeed", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def assert_one_line_error(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("mmfeed") and "error:" in last, out.stderr


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """Three tiny episodes (one 96x64 H.264 camera) written by `mmfeed synth`."""
    out = tmp_path_factory.mktemp("cli") / "shards"
    got = mmfeed("synth", str(out), "--episodes", "3", *TINY, "--no-progress")
    assert got.returncode == 0, got.stderr
    assert "wrote 3 episodes" in got.stdout
    return out


def test_help_lists_every_command_and_every_command_has_help():
    top = mmfeed("--help")
    assert top.returncode == 0
    for command in COMMANDS:
        assert command in top.stdout
        sub = mmfeed(command, "--help")
        assert sub.returncode == 0, sub.stderr
        assert f"mmfeed {command}" in sub.stdout and "exit status" in sub.stdout


def test_bench_packing_still_runs_the_packing_benchmark():
    out = mmfeed("bench", "packing", "--help")
    assert out.returncode == 0 and "mmfeed bench packing" in out.stdout and "--quick" in out.stdout


@pytest.mark.parametrize("args", [
    ("bench", "--workers", "-1"),
    ("bench", "--steps", "zero"),
    ("bench", "--sweep", "threads=1,2"),
    ("bench", "--data", "/nonexistent/mmfeed-data"),
    ("bench", "--quick", "packing"),
    ("compare", "only-one.json"),
    ("synth", "x", "--format", "tar"),
    ("synth", "x", "--size", "big"),
    ("inspect", "/nonexistent/mmfeed-data"),
    ("index", "/nonexistent/shards"),
    ("frobnicate",),
])
def test_bad_arguments_give_a_one_line_error_and_exit_2(args):
    assert_one_line_error(mmfeed(*args))


def test_synth_writes_shards_and_index_and_refuses_a_non_empty_directory(shards):
    assert sorted(p.name for p in shards.iterdir()) == ["mmfeed-index.parquet", "shard-000000.tar"]
    assert_one_line_error(mmfeed("synth", str(shards), "--episodes", "1"))


def test_index_rewrites_the_parquet_index_beside_the_shards(shards, tmp_path):
    index = shards / "mmfeed-index.parquet"
    before = index.read_bytes()
    index.unlink()
    out = mmfeed("index", str(shards))
    assert out.returncode == 0, out.stderr
    assert "3 episodes" in out.stdout and index.exists()
    import pyarrow.parquet as pq

    assert pq.read_table(index).num_rows == 3
    assert len(index.read_bytes()) == len(before)  # same schema, same rows


def test_inspect_forecast_is_the_plan_the_loader_would_make(shards, tmp_path):
    """Every figure of the forecast equals the epoch plan made in-process from the same index."""
    report = tmp_path / "inspect.json"
    out = mmfeed("inspect", str(shards), "--capacity", "512", "--tokens-per-frame", "16", "--rows-per-batch", "2",
                 "--json", str(report))
    assert out.returncode == 0, out.stderr
    for text in ("3 episodes", "episode length", "fps: 30", "cameras: cam_high", "forecast", "efficiency"):
        assert text in out.stdout
    info = json.loads(report.read_text())
    from mmfeed.bench.inspection import window_packing
    from mmfeed.codecs.text import ByteTokenizer
    from mmfeed.loaders import open_dataset, plan_epoch
    from mmfeed.loaders.samples import SamplingConfig, build_samples

    source = open_dataset(shards)
    packing = window_packing(["cam_high"], capacity=512, rows_per_batch=2, tokens_per_frame=16)
    table = build_samples(source, SamplingConfig(window=packing.window), packing.layout, ByteTokenizer())
    plan = plan_epoch(table.tokens, packing.plan, seed=0, epoch=0, groups=table.episode)
    packed = info["forecast"]["packed"]
    assert info["episodes"] == 3 and info["lengths"] == source.lengths.tolist()
    assert packed["efficiency"] == pytest.approx(plan.efficiency)
    assert packed["steps"] == plan.num_steps
    assert packed["samples"] + packed["dropped_samples"] == len(table.tokens)
    assert packed["tokens"] == pytest.approx(packed["token_slots"] * plan.efficiency, rel=1e-6)
    assert 0 < info["forecast"]["padded"]["efficiency"] <= 1


def _assert_figures(node: dict, where: str) -> None:
    for key in FIGURES:
        assert isinstance(node.get(key), (int, float)) and np.isfinite(node[key]), f"{where}.{key}: {node.get(key)}"
    assert 0 <= node["stall_fraction"] <= 1 and 0 < node["packing_efficiency"] <= 1
    assert node["samples_per_s"] > 0 and node["tokens_per_s"] > node["samples_per_s"]
    assert "decode" in node["stage_s"] and all(isinstance(v, float) and v >= 0 for v in node["stage_s"].values())


def test_bench_on_given_shards_writes_the_json_schema_and_a_plot(shards, tmp_path):
    report, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    out = mmfeed("bench", "--data", str(shards), *QUICK_BENCH, "--repeats", "2", "--json", str(report),
                 "--plot", str(plot))
    assert out.returncode == 0, out.stderr
    for text in ("samples/s", "useful tokens/s", "decoded frames/s", "packing efficiency", "stall fraction",
                 "decode (ms/batch", "mmfeed/baseline"):
        assert text in out.stdout
    doc = json.loads(report.read_text())
    _assert_figures(doc, "report")
    _assert_figures(doc["baseline"], "baseline")
    assert doc["ratios"]["samples_per_s"] == pytest.approx(doc["samples_per_s"] / doc["baseline"]["samples_per_s"])
    assert all(len(v) == 2 for v in doc["repeats"].values())
    assert doc["samples_per_s"] == pytest.approx(float(np.median(doc["repeats"]["samples_per_s"])))
    s = doc["settings"]
    assert (s["workers"], s["capacity"], s["repeats"], s["data"]) == (2, 512, 2, str(shards))
    env = doc["environment"]
    assert env["cpu_count"] >= 1 and "torch" in env["versions"] and "git_revision" in env
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    same = mmfeed("compare", str(report), str(report))
    assert same.returncode == 0, same.stdout + same.stderr


def test_plain_bench_synthesizes_its_dataset_into_the_cache_and_sweeps_workers(tmp_path):
    cache = tmp_path / "cache"
    report = tmp_path / "bench.json"
    out = mmfeed("bench", "--quick", "--no-progress", "--repeats", "1", "--workers", "1", "--sweep", "workers=0,1",
                 "--json", str(report), cache=cache)
    assert out.returncode == 0, out.stderr
    (dataset,) = (cache / "bench").iterdir()
    assert (dataset / ".complete").exists() and (dataset / "mmfeed-index.parquet").exists()
    doc = json.loads(report.read_text())
    _assert_figures(doc, "report")
    sweep = doc["sweep"]
    assert sweep["workers"] == [0, 1]
    assert len(sweep["mmfeed"]["samples_per_s"]) == len(sweep["baseline"]["samples_per_s"]) == 2
    assert sweep["mmfeed"]["samples_per_s"][1] == doc["samples_per_s"]  # the main run is the workers=1 point


def test_synth_lerobot_av1_is_inspectable_from_its_metadata(tmp_path):
    out_dir = tmp_path / "lerobot"
    made = mmfeed("synth", str(out_dir), "--format", "lerobot", "--episodes", "2", *TINY, "--no-progress")
    assert made.returncode == 0, made.stderr
    assert "av1" in made.stdout and (out_dir / "meta" / "info.json").exists()
    out = mmfeed("inspect", str(out_dir), "--capacity", "1024", "--max-length", "16", "--tokens-per-frame", "16")
    assert out.returncode == 0, out.stderr
    assert "2 episodes" in out.stdout and "chunks of <= 16 steps" in out.stdout
    assert_one_line_error(mmfeed("index", str(out_dir)))  # a LeRobot directory carries its own index
