"""The GPU decode benchmark: without GPU decode it prints one line saying what is missing and exits 0 (checked in
a fresh python, as run from the command line); its rows with a CPU decoder standing in for a GPU one; with a GPU
(skipped here) the quick run reports every figure, positive and finite."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from mmfeed.bench import gpu_decode

gpu_error = gpu_decode.unavailable()


@pytest.mark.skipif(gpu_error is None, reason="this machine decodes onto a GPU: the benchmark runs instead")
def test_without_gpu_decode_it_says_what_is_missing_and_exits_0(tmp_path):
    out = tmp_path / "gpu.json"
    done = subprocess.run([sys.executable, "-m", "mmfeed", "bench", "gpu-decode", "--json", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_decode: skipped, GPU decode is unavailable here: ")
    assert lines[0].endswith(gpu_error)
    report = json.loads(out.read_text())
    assert report["skipped"] == gpu_error and "versions" in report["environment"]


def test_rows_with_a_cpu_decoder_standing_in_for_a_gpu_one(tmp_path):
    """The rows' figures and ratios, PyAV standing in for the GPU decoder (its options given a device key would
    ask for CUDA): every figure positive and finite."""
    from mmfeed.testing import frame_pattern, write_video

    path = write_video(tmp_path / "v.mp4", frame_pattern(40, height=48, width=64), gop=10)
    stand_in = {"pyav": {"backend": "pyav"}, "pyav_cuda": {"backend": "pyav", "device": None}}
    rows = gpu_decode.measure_video(str(path), repeats=1, decoders=stand_in)
    assert [r["workload"] for r in rows] == ["windows", "sequential"]
    for row in rows:
        for key in ("pyav_frames_per_s", "pyav_cuda_frames_per_s", "cpu_pyav_frames_per_s"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["workload"], key, row[key])
        assert "pyav_cuda_over_pyav" not in row  # no device: not a GPU decoder


@pytest.mark.skipif(gpu_error is not None, reason=f"GPU decode unavailable: {gpu_error}")
def test_quick_run_on_a_gpu_reports_every_figure(tmp_path):
    out = tmp_path / "gpu.json"
    assert gpu_decode.main(["--quick", "--repeats", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["video"], r["workload"]) for r in rows} == {
        (v, w) for v in ("h264_gop30_240x320", "av1_gop2_240x320") for w in ("windows", "sequential")}
    gpus = [name for name, opts in gpu_decode.usable_decoders()[0].items() if opts.get("device")]
    for row in rows:
        for gpu in gpus:
            for key in (f"{gpu}_frames_per_s", f"{gpu}_over_pyav", f"cpu_{gpu}_over_pyav"):
                assert math.isfinite(row[key]) and row[key] > 0, (row["video"], key, row[key])
            assert row[f"nvdec_{gpu}"] in (True, False)
