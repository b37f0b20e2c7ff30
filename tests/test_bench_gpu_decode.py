"""The GPU decode benchmark: without GPU decode it prints one line saying what is missing and exits 0 (checked in
a fresh python, as run from the command line); with it (on a GPU, skipped here) the quick run reports every
figure, positive and finite."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from mmfeed.codecs._torchcodec import cuda_decode_error

gpu_error = cuda_decode_error("cuda")


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


@pytest.mark.skipif(gpu_error is not None, reason=f"GPU decode unavailable: {gpu_error}")
def test_quick_run_on_a_gpu_reports_every_figure(tmp_path):
    from mmfeed.bench import gpu_decode

    out = tmp_path / "gpu.json"
    assert gpu_decode.main(["--quick", "--repeats", "2", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(r["video"], r["workload"]) for r in rows} == {
        (v, w) for v in ("h264_gop30_240x320", "av1_gop2_240x320") for w in ("windows", "sequential")}
    for row in rows:
        for key in ("pyav_frames_per_s", "torchcodec_cpu_frames_per_s", "torchcodec_cuda_frames_per_s",
                    "gpu_over_pyav", "cpu_gpu_over_torchcodec_cpu"):
            assert math.isfinite(row[key]) and row[key] > 0, (row["video"], key, row[key])
        assert row["nvdec"] in (True, False)
