"""The decode benchmark's smoke run: every figure present, positive and finite; torchcodec rows beside PyAV's when
torchcodec loads in this process; real LeRobot when a venv has it.

The LeRobot test runs when ``MMFEED_LEROBOT_PYTHON`` names a venv python with lerobot (the ``lerobot_python``
fixture) and skips, saying why, otherwise.
"""

from __future__ import annotations

import json
import math

import pytest

from mmfeed.bench import decode
from mmfeed.codecs._torchcodec import torchcodec_available, torchcodec_error

NEW_KEYS = [f"{prefix}{key}" for prefix in ("", "cpu_") for key in (
    "per_sample_frames_per_s", "per_sample_reopen_frames_per_s", "speedup_vs_per_sample_reopen",
    "fraction_of_sequential", "unique_fraction_of_sequential", "unique_frames_per_s")]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One folder for the quick videos, so that each is encoded once for this module."""
    return str(tmp_path_factory.mktemp("decode-bench"))


SPREADS = ["frames_per_s_spread"] + [f"{m}_frames_per_s_spread" for m in
                                     ("baseline", "per_sample", "per_sample_reopen", "sequential")]


@pytest.fixture(scope="module")
def quick_report(cache_dir, tmp_path_factory):
    """One quick run (2 measured repeats, so that each spread has two rates), its JSON report."""
    out = tmp_path_factory.mktemp("decode-report") / "decode.json"
    assert decode.main(["--quick", "--json", str(out), "--repeats", "2", "--cache-dir", cache_dir]) == 0
    return json.loads(out.read_text())


@pytest.mark.slow  # the decode benchmark's quick run
def test_quick_run_reports_every_figure(quick_report):
    """Every row has the like-for-like figures, each positive and finite, and the spread behind each median;
    without --lerobot-python the LeRobot figures are None and no target on them is claimed."""
    report = quick_report
    rows = report["results"]
    assert {(r["video"], r["workload"]) for r in rows} == {(v, w) for v in decode.VIDEOS for w in ("clips", "sparse")}
    for row in rows:
        for key in NEW_KEYS + ["frames_per_s", "speedup_vs_baseline", "speedup_vs_per_sample", "coverage"]:
            assert math.isfinite(row[key]) and row[key] > 0, (key, row[key])
        assert row["unique_fraction_of_sequential"] <= row["fraction_of_sequential"]  # distinct <= delivered
        for key in SPREADS:
            assert math.isfinite(row[key]) and row[key] >= 0, (key, row[key])
        for key in ("lerobot_frames_per_s", "torchcodec_frames_per_s", "speedup_vs_lerobot", "speedup_vs_torchcodec"):
            assert row[key] is None
    assert set(report["targets"]) == {"speedup_vs_lerobot_h264_gop30", "fraction_of_sequential_at_coverage_ge_0.25"}
    assert report["target_checks"]["speedup_vs_lerobot_h264_gop30"] is None


@pytest.mark.slow  # the decode benchmark's quick run (the module's fixture, shared with the test above)
def test_torchcodec_rows_beside_pyav_when_it_loads(quick_report):
    """Each video and workload has a torchcodec row beside PyAV's, on the same request sets (same coverage and
    frames per batch), never the auto backend; when torchcodec does not load the report says why."""
    rows = quick_report["results"]
    if not torchcodec_available():
        assert not any(r["backend"] == "torchcodec" for r in rows)
        assert quick_report["settings"]["torchcodec"] == torchcodec_error()
        pytest.skip(str(torchcodec_error()))
    assert quick_report["settings"]["torchcodec"] == "measured"
    by_key = {(r["video"], r["workload"], r["backend"]): r for r in rows}
    for video in decode.VIDEOS:
        for workload in ("clips", "sparse"):
            mine, pyav = by_key[(video, workload, "torchcodec")], by_key[(video, workload, "pyav")]
            assert not mine["auto"] and pyav["auto"]
            assert (mine["coverage"], mine["frames_per_batch"]) == (pyav["coverage"], pyav["frames_per_batch"])


def test_request_sets_are_seeded_and_in_range():
    """The same seed gives the same batches (so a child process can time exactly them); indices stay in range."""
    a, b = decode.request_sets(90, "sparse", 2, seed=3), decode.request_sets(90, "sparse", 2, seed=3)
    assert len(a) == 3 and all(len(batch) == decode.SAMPLES_PER_BATCH for batch in a)
    assert all((x == y).all() for ba, bb in zip(a, b) for x, y in zip(ba, bb))
    assert all(0 <= x.min() and x.max() < 90 for batch in a for x in batch)


def test_a_missing_lerobot_python_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit):
        decode.main(["--quick", "--lerobot-python", str(tmp_path / "no-python")])


def test_real_lerobot_times_the_same_requests(cache_dir, lerobot_python):
    """LeRobot's decode_video_frames and torchcodec alone, under LeRobot's python, time the benchmark's own
    request sets and report positive finite frames/s, from which the speedups follow."""
    path = decode._video(cache_dir, "h264", 30, 240, 320, 90)
    batches = decode.request_sets(90, "clips", 1, seed=0)
    theirs = decode.lerobot_rates(lerobot_python, path, batches)
    assert theirs["versions"]["lerobot"] and theirs["versions"]["torchcodec"]
    row = decode._with_lerobot({"frames_per_s": 1000.0}, {k: v for k, v in theirs.items() if k != "versions"})
    for key in ("lerobot_frames_per_s", "torchcodec_frames_per_s", "speedup_vs_lerobot", "speedup_vs_torchcodec"):
        assert math.isfinite(row[key]) and row[key] > 0, (key, row[key])
