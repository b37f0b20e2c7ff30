"""The ``mmfeed`` command line, end to end through ``python -m mmfeed`` on tiny real data (real mp4s in real tars,
real parquet, real worker processes)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import procs
from mmfeed.cli import main as cli_main

COMMANDS = ("bench", "compare", "synth", "index", "inspect", "convert")
CAM = "observation.images.cam_high"
FIGURES = ("samples_per_s", "tokens_per_s", "frames_per_s", "stall_fraction", "packing_efficiency", "wait_s",
           "padding_fraction", "delivered_frames_per_s", "decoded_frames_per_s")
TINY = ("--size", "96x64", "--min-length", "20", "--max-length", "30")
# quick bench settings sized for the tiny dataset: 16 tokens per frame -> about 90 tokens per sample
QUICK_BENCH = ("--quick", "--no-progress", "--capacity", "512", "--tokens-per-frame", "16")


def mmfeed(*args: str, cache: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if cache is not None:
        env["MMFEED_CACHE"] = str(cache)
    return procs.run([sys.executable, "-m", "mmfeed", *args], env=env, timeout=timeout)


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
    assert "wrote 3 episodes" in got.stdout and CAM in got.stdout
    return out


def help_of(capsys, *args: str) -> str:
    """What ``mmfeed ARGS --help`` prints, run in this process (``mmfeed --help`` itself runs as a subprocess
    below: a fresh interpreter per command would cost a second each, for the same parser)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli_main([*args, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_help_lists_every_command_and_every_command_has_help(capsys):
    top = mmfeed("--help")
    assert top.returncode == 0
    for command in COMMANDS:
        assert command in top.stdout
        out = help_of(capsys, command)
        assert f"mmfeed {command}" in out and "exit status" in out


def test_the_parser_imports_neither_torch_nor_a_decoder():
    # `mmfeed --help`, `--version` and every argument error answer in a fraction of a second, not after torch loads
    code = ("import sys; from mmfeed.cli import build_parser; build_parser(); "
            "heavy = sorted(m for m in ('torch', 'av', 'numba', 'pyarrow', 'mmfeed.codecs') if m in sys.modules); "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bench_packing_still_runs_the_packing_benchmark(capsys):
    out = help_of(capsys, "bench", "packing")
    assert "mmfeed bench packing" in out and "--quick" in out


def test_named_benchmarks_answer_under_their_names(capsys):
    for name, flag in (("reuse", "--ks"), ("gpu-decode", "--quick"), ("startup", "--json")):
        out = help_of(capsys, "bench", name)
        assert f"mmfeed bench {name}" in out and flag in out, out


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
def test_bad_arguments_give_a_one_line_error_and_exit_2(args, capsys):
    """Run in this process (the subprocess path is checked by the tests that call assert_one_line_error): the
    status, and one line on stderr, whether argparse or the command refused the arguments."""
    capsys.readouterr()
    try:
        code = cli_main(list(args))
    except SystemExit as exited:  # argparse's own refusal
        code = exited.code
    assert code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("mmfeed") and "error:" in last and "Traceback" not in err, err


def test_synth_writes_v2_shards_and_index_and_refuses_a_non_empty_directory(shards):
    assert sorted(p.name for p in shards.iterdir()) == ["mmfeed-index.parquet", "shard-000000.tar"]
    import tarfile

    with tarfile.open(shards / "shard-000000.tar") as tar:
        names = {m.name for m in tar.getmembers()}
    assert {f"episode_000000.{CAM}.mp4", "episode_000000.observation.state.npy", "episode_000000.action.npy",
            "episode_000000.meta.json"} <= names  # every feature a member under its own name
    from mmfeed.loaders import open_dataset
    from mmfeed.testing import make_episodes

    ds = open_dataset(shards)
    episodes = make_episodes(3, cameras=("cam_high",), height=64, width=96, min_length=20, max_length=30)
    assert sorted(ds.features) == sorted(episodes[0].features())
    np.testing.assert_array_equal(ds.episode(1)["observation.state"], episodes[1].state)
    assert_one_line_error(mmfeed("synth", str(shards), "--episodes", "1"))


def test_index_rewrites_the_parquet_index_beside_the_shards(shards):
    index = shards / "mmfeed-index.parquet"
    before = index.read_bytes()
    index.unlink()
    out = mmfeed("index", str(shards))
    assert out.returncode == 0, out.stderr
    assert "3 episodes" in out.stdout and index.exists()
    import pyarrow.parquet as pq

    assert pq.read_table(index).num_rows == 3
    assert len(index.read_bytes()) == len(before)  # same schema, same rows, same merged stats
    for feature in (CAM, "observation.state", "action", "next.reward"):
        assert feature in out.stdout


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def hand_shards(tmp_path_factory) -> tuple[Path, dict[str, np.ndarray]]:
    """Two episodes written by hand with webdataset's TarWriter, as a user would: one npy member per array
    feature, one mp4 per camera and a meta.json with fps, length and task only (no `features`, no stats)."""
    import webdataset

    from mmfeed.testing import frame_pattern, write_video

    out = tmp_path_factory.mktemp("hand")
    rng = np.random.default_rng(7)
    arrays: dict[str, list[np.ndarray]] = {"observation.state": [], "gripper.force": []}
    with open(out / "shard-000000.tar", "wb") as stream, webdataset.TarWriter(stream, encoder=False) as tar:
        for i, length in enumerate((12, 9)):
            state = rng.normal(size=(length, 3)).astype(np.float32)
            force = rng.integers(0, 50, size=length).astype(np.int16)
            arrays["observation.state"].append(state)
            arrays["gripper.force"].append(force)
            video = out / f"ep{i}.mp4"
            write_video(video, frame_pattern(length, height=32, width=48), fps=10.0, codec="h264", gop=4)
            tar.write({"__key__": f"ep{i}", "observation.state.npy": _npy(state), "gripper.force.npy": _npy(force),
                       "observation.images.top.mp4": video.read_bytes(),
                       "meta.json": json.dumps({"fps": 10.0, "length": length, "task": f"task {i}"}).encode()})
            video.unlink()
    return out, {k: np.concatenate(v) for k, v in arrays.items()}


def test_index_of_hand_written_shards_computes_features_and_stats(hand_shards):
    """`mmfeed index` on shards that carry no feature list: every member becomes a feature of the right kind,
    dtype, shape and rate, and the stats of the numeric arrays over both episodes are the arrays' own."""
    shards, arrays = hand_shards
    out = mmfeed("index", str(shards))
    assert out.returncode == 0, out.stderr
    assert "2 episodes, 21 steps, 1 shard(s)" in out.stdout
    from mmfeed.loaders import open_dataset

    ds = open_dataset(shards)
    assert {f: (v.kind, v.dtype, v.shape, v.fps) for f, v in ds.features.items()} == {
        "observation.state": ("array", "float32", (3,), 10.0), "gripper.force": ("array", "int16", (), 10.0),
        "observation.images.top": ("video", "uint8", (32, 48, 3), 10.0)}
    for feature, values in arrays.items():
        stats = ds.stats[feature]
        wide = values.astype(np.float64)
        np.testing.assert_allclose(stats["mean"], wide.mean(axis=0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(stats["std"], wide.std(axis=0), rtol=1e-6)
        np.testing.assert_array_equal(stats["min"], wide.min(axis=0))
        np.testing.assert_array_equal(stats["max"], wide.max(axis=0))
        assert int(np.asarray(stats["count"]).reshape(-1)[0]) == len(values)
    assert "observation.images.top" not in ds.stats  # a video has no stats
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("  ")}
    assert lines["gripper.force"].split()[1:3] == ["array", "int16"] and "(n=21)" in lines["gripper.force"]
    assert "video" in lines["observation.images.top"] and "no stats" in lines["observation.images.top"]


def test_inspect_lists_every_feature_with_its_stats(hand_shards, tmp_path):
    """`mmfeed inspect` on the hand-written shards (indexed in memory if `mmfeed index` has not run) lists each
    feature with its kind, dtype, shape, rate and stats, and windows read the features the dataset has."""
    shards, arrays = hand_shards
    report = tmp_path / "inspect.json"
    out = mmfeed("inspect", str(shards), "--capacity", "1024", "--tokens-per-frame", "8", "--history", "2",
                 "--json", str(report))
    assert out.returncode == 0, out.stderr
    assert "features (3):" in out.stdout
    for feature in ("observation.state", "gripper.force", "observation.images.top"):
        assert any(line.split()[:1] == [feature] for line in out.stdout.splitlines()), feature
    info = json.loads(report.read_text())
    state = info["features"]["observation.state"]
    assert (state["kind"], state["dtype"], state["shape"], state["fps"]) == ("array", "float32", [3], 10.0)
    np.testing.assert_allclose(state["stats"]["mean"], arrays["observation.state"].mean(axis=0), rtol=1e-6)
    assert info["features"]["observation.images.top"]["stats"] == {}
    # no `action` in these shards: the windows read the video and the state only
    assert info["forecast"]["features"] == ["observation.images.top", "observation.state"]
    # 2 frames x 8 tokens + 1 state token + the task text ("task 0": 6 bytes)
    assert info["forecast"]["sample_tokens"]["min"] == 2 * 8 + 1 + 6


def test_inspect_forecast_is_the_plan_the_loader_would_make(shards, tmp_path):
    """Every figure of the forecast equals the epoch plan made in-process from the same index."""
    report = tmp_path / "inspect.json"
    out = mmfeed("inspect", str(shards), "--capacity", "512", "--tokens-per-frame", "16", "--rows-per-batch", "2",
                 "--json", str(report))
    assert out.returncode == 0, out.stderr
    for text in ("3 episodes", "episode length", "fps: 30", CAM, "video", "observation.state", "forecast",
                 "efficiency"):
        assert text in out.stdout
    info = json.loads(report.read_text())
    from mmfeed.inspection import window_packing
    from mmfeed.loaders import open_dataset
    from mmfeed.loaders.planned.items import EpisodeItems
    from mmfeed.packing import plan_epoch

    source = open_dataset(shards)
    packing = window_packing(source, capacity=512, rows_per_batch=2, tokens_per_frame=16)
    assert packing.window.deltas[CAM] == (-3 / 30, -2 / 30, -1 / 30, 0.0)  # 4 history frames, in seconds
    items = EpisodeItems(source, layout=packing.layout, window=packing.window)
    plan = plan_epoch(items.table.tokens, packing.plan, seed=0, epoch=0, groups=items.table.groups)
    packed = info["forecast"]["packed"]
    assert info["episodes"] == 3 and info["lengths"] == source.lengths.tolist()
    assert len(items) == int(source.lengths.sum())  # one window per step
    assert packed["efficiency"] == pytest.approx(plan.efficiency)
    assert packed["steps"] == plan.num_steps
    assert packed["samples"] + packed["dropped_samples"] == len(items.table)
    assert packed["tokens"] == pytest.approx(packed["token_slots"] * plan.efficiency, rel=1e-6)
    assert 0 < info["forecast"]["padded"]["efficiency"] <= 1
    chosen = packing.dataset(source).planned(0)  # which planner the loader runs, and why, said by inspect
    assert (info["forecast"]["planner"], info["forecast"]["planner_reason"]) == (chosen.planner, chosen.reason)
    assert f"planner: {chosen.planner} ({chosen.reason})" in out.stdout


def _assert_figures(node: dict, where: str) -> None:
    for key in FIGURES:
        assert isinstance(node.get(key), (int, float)) and np.isfinite(node[key]), f"{where}.{key}: {node.get(key)}"
    assert 0 <= node["stall_fraction"] <= 1 and 0 < node["packing_efficiency"] <= 1
    assert node["padding_fraction"] == pytest.approx(1 - node["packing_efficiency"])
    assert node["samples_per_s"] > 0 and node["tokens_per_s"] > node["samples_per_s"]
    assert node["delivered_frames_per_s"] == node["frames_per_s"] > 0 and node["decoded_frames_per_s"] > 0
    assert "decode" in node["stage_s"] and all(isinstance(v, float) and v >= 0 for v in node["stage_s"].values())


# a report as `mmfeed bench --json` wrote it at schema version 1 (mmfeed and baseline one after the other)
V1_REPORT = {
    "benchmark": "mmfeed bench", "schema_version": 1, "samples_per_s": 700.0, "tokens_per_s": 770000.0,
    "frames_per_s": 2800.0, "packing_efficiency": 0.93, "stall_fraction": 0.2, "wait_s": 0.007,
    "stage_s": {"collate": 0.0008, "decode": 0.06, "read": 1e-05},
    "repeats": {"samples_per_s": [690.0, 700.0, 720.0], "stage_s.decode": [0.059, 0.06, 0.062]},
    "baseline": {"name": "torch", "samples_per_s": 110.0, "tokens_per_s": 120000.0, "frames_per_s": 437.0,
                 "packing_efficiency": 0.999, "stall_fraction": 0.79, "wait_s": 0.1, "batch_size": 14,
                 "stage_s": {"collate": 0.006, "decode": 0.27}, "repeats": {"samples_per_s": [100.0, 110.0, 112.0]}},
    "ratios": {"samples_per_s": 6.4, "tokens_per_s": 6.4, "frames_per_s": 6.4, "packing_efficiency": 0.93,
               "stall_fraction": 0.27},
    "bottleneck": {"recommendation": "more workers"}, "settings": {"workers": 2, "episode_block": 2},
    "environment": {"git_revision": "f225c8a"}, "details": {"step_s": 0.025}}


@pytest.mark.slow  # a benchmark, AV1 encoding or a conversion run end to end
def test_bench_on_given_shards_writes_the_json_schema_and_a_plot(shards, tmp_path):
    report, plot = tmp_path / "bench.json", tmp_path / "bench.png"
    out = mmfeed("bench", "--data", str(shards), *QUICK_BENCH, "--repeats", "2", "--json", str(report),
                 "--plot", str(plot))
    assert out.returncode == 0, out.stderr
    for text in ("samples/s", "useful tokens/s", "delivered frames/s", "decoded frames/s", "packing efficiency",
                 "padding fraction", "stall fraction", "decode (ms/batch", "mmfeed/baseline", "spread",
                 "decode limit", "of the limit", "where a batch goes"):
        assert text in out.stdout
    doc = json.loads(report.read_text())
    assert doc["schema_version"] == 2
    _assert_figures(doc, "report")
    _assert_figures(doc["baseline"], "baseline")
    assert doc["ratios"]["samples_per_s"] == pytest.approx(doc["samples_per_s"] / doc["baseline"]["samples_per_s"])
    assert all(len(v) == 2 for v in doc["repeats"].values())
    assert doc["samples_per_s"] == pytest.approx(float(np.median(doc["repeats"]["samples_per_s"])))
    # the decode limit of the same batches, with and without conversion, and mmfeed's share of it round by round
    assert doc["decode_limit_frames_per_s"] > 0 and doc["decode_limit_raw_frames_per_s"] > 0
    assert doc["limit_fraction"] == pytest.approx(float(np.median(doc["repeats"]["limit_fraction"])))
    assert doc["limit_fraction_cpu"] > 0 and doc["tokens_per_cpu_second"] > 0 < doc["baseline"]["tokens_per_cpu_second"]
    d = doc["details"]
    rounds = [doc["repeats"]["delivered_frames_per_s"][k] / doc["repeats"]["decode_limit_frames_per_s"][k]
              for k in range(2)]
    assert doc["repeats"]["limit_fraction"] == pytest.approx(rounds)
    assert d["limit"]["decoded_per_delivered"] >= d["limit"]["wanted_per_delivered"] > 0  # GOP dependencies
    spread = d["spread"]["mmfeed"]["tokens_per_s"]
    assert spread["min"] <= doc["tokens_per_s"] <= spread["max"]
    assert spread["range"] == pytest.approx((spread["max"] - spread["min"]) / doc["tokens_per_s"])
    assert len(d["paired_ratios"]["tokens_per_s"]) == 2
    s = doc["settings"]
    assert (s["workers"], s["capacity"], s["repeats"], s["data"], s["episode_block"]) == (2, 512, 2, str(shards), 0)
    assert (s["videos"], s["state"], s["action"]) == ([CAM], "observation.state", "action")  # read by name
    env = doc["environment"]
    assert env["cpu_count"] >= 1 and "torch" in env["versions"] and "git_revision" in env
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    per_step = d["per_step"]  # what the plot's step-by-step panel draws
    assert d["slot_fraction"]["mmfeed"] == 1.0 and 0 < d["slot_fraction"]["baseline"] <= 1
    for name in ("mmfeed", "baseline"):
        assert len(per_step[name]["wait_s"]) == len(per_step[name]["compute_s"]) == s["steps"]
        # the simulated step of a batch is in proportion to its token slots (padding included)
        mean = sum(per_step[name]["compute_s"]) / len(per_step[name]["compute_s"])
        assert mean >= d["step_s"] * d["slot_fraction"][name] * 0.9
    same = mmfeed("compare", str(report), str(report))
    assert same.returncode == 0, same.stdout + same.stderr
    old = tmp_path / "v1.json"  # a report of schema version 1 compares with this one, both ways
    old.write_text(json.dumps(V1_REPORT))
    for base, new in ((old, report), (report, old)):
        got = mmfeed("compare", str(base), str(new))
        assert got.returncode in (0, 1), got.stdout + got.stderr
        assert "samples_per_s" in got.stdout and "padding_fraction" in got.stdout


@pytest.mark.slow  # a benchmark, AV1 encoding or a conversion run end to end
def test_plain_bench_synthesizes_its_dataset_into_the_cache_and_sweeps_workers(tmp_path):
    cache = tmp_path / "cache"
    report = tmp_path / "bench.json"
    out = mmfeed("bench", "--quick", "--no-progress", "--repeats", "1", "--workers", "1", "--sweep", "workers=0,1",
                 "--json", str(report), cache=cache)
    assert out.returncode == 0, out.stderr
    datasets = sorted((cache / "bench").iterdir())  # one dataset per embodiment: the mixture
    assert len(datasets) == 2
    assert all((d / ".complete").exists() and (d / "mmfeed-index.parquet").exists() for d in datasets)
    doc = json.loads(report.read_text())
    _assert_figures(doc, "report")
    assert sorted(doc["settings"]["data"]) == [str(d) for d in datasets]
    assert [e["cameras"] for e in doc["settings"]["embodiments"]] == [["cam_high"], ["cam_front", "cam_wrist"]]
    sweep = doc["sweep"]
    assert sweep["workers"] == [0, 1]
    assert len(sweep["mmfeed"]["samples_per_s"]) == len(sweep["baseline"]["samples_per_s"]) == 2
    assert sweep["mmfeed"]["samples_per_s"][1] == doc["samples_per_s"]  # the main run is the workers=1 point


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    """The quick workload's two embodiments (one camera; two cameras at another size, one at 15 fps)."""
    from mmfeed.testing.synth_dataset import write_synthetic
    from mmfeed.bench.run import QUICK_DATASET

    root = tmp_path_factory.mktemp("mixture")
    paths = [str(write_synthetic(root / f"e{k}", d.synthetic(), processes=1))
             for k, d in enumerate(QUICK_DATASET.datasets())]
    return QUICK_DATASET, paths


def test_the_workload_mixes_embodiments_and_puts_world_model_chunks_beside_windows(mixture):
    from mmfeed.bench.loader import PerSampleDataset, WindowsAndChunks
    from mmfeed.loaders import open_dataset

    cfg, paths = mixture
    source = open_dataset(paths)
    items = cfg.items(source)
    assert isinstance(items, WindowsAndChunks)
    chunk = items.is_chunk
    assert chunk.any() and (~chunk).any() and set(source.dataset_of[items.episode].tolist()) == {0, 1}
    assert items.tokens[chunk].max() > items.tokens[~chunk].max()  # chunks are the long samples
    high, front, wrist = (f"observation.images.{c}" for c in ("cam_high", "cam_front", "cam_wrist"))
    for s, request in enumerate(read.request for read in items.requests(np.arange(len(items)))):
        cameras = {high} if source.dataset_of[items.episode[s]] == 0 else {front, wrist}
        assert {f for f in request.indices if f.startswith("observation.images.")} == cameras
        steps = len(request.indices["action"])
        if chunk[s]:  # every step of the chunk; the 15 fps camera has half the frames of the 30 fps ones
            assert steps == len(request.indices["observation.state"]) == items.length[s]
            if front in cameras:
                assert len(request.indices[front]) == pytest.approx(steps / 2, abs=1)
                assert len(request.indices[wrist]) == steps
        else:  # a window: history frames of each camera, the state at the anchor, the action chunk
            assert steps == cfg.horizon and len(request.indices["observation.state"]) == 1
            assert all(len(request.indices[c]) == cfg.history for c in cameras)
    baseline = PerSampleDataset(cfg, paths)  # the very same samples and prices
    assert np.array_equal(baseline.tokens, items.tokens)
    ds = cfg.planned(source)
    batch = ds[0, 0]
    got = batch.metadata["sample"].numpy()
    assert batch.num_documents == len(got) and int((batch.document_ids >= 0).sum()) == int(items.tokens[got].sum())


def test_decoded_frames_counted_per_batch_are_the_limits_plan_of_that_batch(mixture):
    """mmfeed's count (decode_totals in the worker) equals the frames the limit's plan decodes: per video the
    batch's frames from their keyframes; the baseline's per-sample count likewise for each sample."""
    import av

    from mmfeed.bench.limit import _aligned, _Video, batch_work, decode_work
    from mmfeed.bench.loader import PerSampleDataset
    from mmfeed.bench.run import _Counted
    from mmfeed.loaders import open_dataset

    cfg, paths = mixture

    def plan(work):
        total = 0
        for _, video, targets in work:
            v = _Video(video)
            total += decode_work(v, targets, convert=False)[0]
            v.close()
        return total

    decoded = wanted = 0
    for step in range(3):
        ds = cfg.planned(open_dataset(paths), dataset=_Counted)  # a fresh source: no reader open yet
        batch = ds[0, step]
        work, delivered = batch_work(ds.items, batch.metadata["sample"].numpy())
        assert delivered == sum(len(batch.data[f]) for f in cfg.video_features if f in batch.data)
        assert batch.metadata["frames_decoded"] == plan(work)
        assert batch.metadata["readers_opened"] == len(work)
        decoded += batch.metadata["frames_decoded"]
        wanted += sum(len(t) for _, _, t in work)
    assert decoded > wanted  # the GOP dependencies: frames before the wanted ones, back to their keyframes
    baseline = PerSampleDataset(cfg, paths)
    for i in (0, len(baseline) - 1):  # a window and a chunk
        sample = baseline[i]
        work, delivered = batch_work(baseline.items, np.array([i]))
        assert int(sample["frames"]) == delivered and int(sample["frames_decoded"]) == plan(work)
    v = _Video(work[0][1])  # the limit's conversion is the array frame.to_ndarray(format="rgb24") gives
    frame = next(v.container.decode(v.stream))
    assert isinstance(frame, av.VideoFrame)
    assert np.array_equal(v.rgb(frame), frame.to_ndarray(format="rgb24"))
    # converted into a batch's slots: each wanted frame in its own slot
    _, video, targets = work[0]
    with av.open(io.BytesIO(video) if isinstance(video, (bytes, bytearray)) else video) as container:
        every = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    slots = _aligned(len(targets), *every[0].shape[:2])
    decode_work(v, targets, True, slots)
    assert np.array_equal(slots, np.stack([every[i] for i in targets.tolist()]))
    v.close()


def test_decode_totals_count_the_frames_the_decoder_produced_gop_dependencies_included(tmp_path):
    """The counter `mmfeed bench` reads decoded frames from: a frame costs the frames from its keyframe on."""
    from mmfeed.codecs._pyav import decode_totals
    from mmfeed.codecs.video import read_frames
    from mmfeed.testing import frame_pattern, read_index, write_video

    path = write_video(tmp_path / "v.mp4", frame_pattern(40, height=48, width=64), gop=10)
    before = decode_totals()
    frames = read_frames(path, indices=[3, 25, 26])
    after = decode_totals()
    assert read_index(frames).tolist() == [3, 25, 26]
    # keyframes 0 and 20: frames 0..3, then a seek and 20..26
    assert {k: after[k] - before[k] for k in after} == {"opened": 1, "frames_decoded": 4 + 7, "seeks": 2}


@pytest.mark.slow  # a benchmark, AV1 encoding or a conversion run end to end
def test_synth_lerobot_av1_is_inspectable_from_its_metadata(tmp_path):
    out_dir = tmp_path / "lerobot"
    made = mmfeed("synth", str(out_dir), "--format", "lerobot", "--episodes", "2", *TINY, "--no-progress")
    assert made.returncode == 0, made.stderr
    assert "av1" in made.stdout and (out_dir / "meta" / "info.json").exists()
    out = mmfeed("inspect", str(out_dir), "--capacity", "1024", "--max-length", "16", "--tokens-per-frame", "16")
    assert out.returncode == 0, out.stderr
    assert "2 episodes" in out.stdout and "chunks of <= 16 steps" in out.stdout
    assert CAM in out.stdout and "q50" in out.stdout  # the features, and the quantiles of LeRobot's stats.json
    assert_one_line_error(mmfeed("index", str(out_dir)))  # a LeRobot directory carries its own index


@pytest.mark.slow  # a benchmark, AV1 encoding or a conversion run end to end
def test_convert_turns_a_lerobot_directory_into_shards_open_dataset_reads(tmp_path):
    """`mmfeed convert SRC DST`: every feature and the tasks of the source, from the command line."""
    from mmfeed.loaders import open_dataset
    from mmfeed.testing import make_episodes, write_lerobot

    src = write_lerobot(tmp_path / "lr", make_episodes(3, seed=2, min_length=10, max_length=14, cameras=("cam_high",),
                                                        height=32, width=32), codec="h264")
    out = mmfeed("convert", str(src), str(tmp_path / "shards"), "--episodes-per-shard", "2", "--no-progress")
    assert out.returncode == 0, out.stderr
    source, shards = open_dataset(src), open_dataset(tmp_path / "shards")
    assert set(shards.features) >= set(source.features) - {"index"} and len(shards) == 3
    for e in range(3):
        assert np.array_equal(shards.episode(e)["observation.state"], source.episode(e)["observation.state"])
        assert shards.task(e) == source.task(e)
    again = mmfeed("convert", str(src), str(tmp_path / "shards"), "--no-progress")
    assert_one_line_error(again)  # DST already holds a dataset: refused without --resume/--overwrite


@pytest.mark.slow
def test_bench_scale_quick_writes_the_plan_block_mask_open_windows_and_stats_figures(tmp_path):
    out = mmfeed("bench", "scale", "--quick", "--json", str(tmp_path / "scale.json"), cache=tmp_path / "cache",
                 timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "scale.json").read_text())
    plan, masks = report["plan"], report["block_mask"]
    assert plan and {"samples", "world_size", "seconds", "peak_rss_bytes", "bytes_per_sample",
                     "efficiency"} <= set(plan[0])
    assert all(r["seconds"] > 0 and 0.9 < r["efficiency"] <= 1 for r in plan)
    assert masks and all(r["seconds_per_row"] > 0 for r in masks)
    cold, warm = report["open"]  # a 1e5-episode index: derived once, then mapped
    assert (cold["cache"], warm["cache"]) == ("cold", "warm") and cold["episodes"] == warm["episodes"] == 10**5
    assert warm["rss_bytes"] < cold["rss_bytes"] and warm["worker_private_bytes"] < 20 * 2**20
    windows, = report["windows"]  # 1e4 LeRobot episodes of 250 steps, one price: planned arithmetically
    assert windows["windows"] == 250 * 10**4 and windows["plan"] == "UniformPlan" and windows["steps"] > 0
    assert windows["first_batch_s"] > 0 and windows["peak_rss_bytes"] > windows["peak_above_import_bytes"] > 0
    stats, = report["stats"]  # mmfeed stats over 1e5 episodes of 20 steps
    assert stats["steps"] == 20 * 10**5 and stats["seconds"] > 0 and stats["steps_per_s"] > 0
    compiled, floor, cold, warm = report["lerobot_open"]  # 1e5 episodes in LeRobot's layout, row groups of ten
    assert [r["mode"] for r in (compiled, floor, cold, warm)] == ["compile", "floor", "cold", "warm"]
    assert cold["from_bytes"] is True and cold["episodes"] == 10**5  # compiled first, so read from the bytes
    assert warm["seconds"] < cold["seconds"]


def test_the_backend_choices_are_the_decoders_mmfeed_has():
    from mmfeed.cli import VIDEO_BACKENDS
    from mmfeed.codecs.video import BACKENDS

    assert VIDEO_BACKENDS == ["auto", *sorted(BACKENDS)]
