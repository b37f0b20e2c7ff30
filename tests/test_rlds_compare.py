"""The RLDS benchmark against tf.data: its mmfeed side and decode limit on the committed corpus always; the whole
benchmark in quick mode where ``MMFEED_TF_PYTHON`` names a venv python with tensorflow and tensorflow-datasets
(otherwise that test skips and says why)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest

from mmfeed.bench.common import child_pids
from mmfeed.bench.rlds_compare import CHILD_SCRIPT, _decode_chunk, decode_limit, main, parse_args, time_mmfeed

VERSION = Path(__file__).parent / "rlds_corpus" / "mmfeed_rlds_corpus" / "1.0.0"


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MMFEED_CACHE", str(tmp_path_factory.getbasetemp() / "rlds-compare-cache"))


@pytest.fixture(scope="module")
def tf_python():
    python = os.environ.get("MMFEED_TF_PYTHON")
    if not python:
        pytest.skip("set MMFEED_TF_PYTHON to a venv python with tensorflow and tensorflow-datasets to run tf.data")
    if not os.path.exists(python):
        pytest.skip(f"MMFEED_TF_PYTHON={python} does not exist")
    probe = subprocess.run([python, "-c", "import tensorflow_datasets, tensorflow"], capture_output=True, text=True,
                           timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"MMFEED_TF_PYTHON={python} cannot import tensorflow_datasets: {probe.stderr[-300:]}")
    return python


def test_the_child_script_is_python_without_mmfeed():
    tree = ast.parse(CHILD_SCRIPT)
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert {"tensorflow", "tensorflow_datasets"} <= imported and "mmfeed" not in imported


def test_mmfeed_stretch_counts_samples_cpu_memory_and_its_workers_leave():
    before = set(child_pids())
    got = time_mmfeed(VERSION, steps=2, warmup=0, batch_size=4, workers=1)
    assert got["samples"] == 8 and got["batches"] == 2 and got["worker_processes"] == 1
    assert got["first_batch_s"] > 0 and got["cpu_s"] >= 0 and got["pss_bytes"] > 0
    assert got["rss_bytes"] >= got["pss_bytes"]
    assert set(child_pids()) <= before


def test_whole_epochs_through_the_frame_cache_fill_it_once(tmp_path):
    from mmfeed.loaders import open_dataset
    from mmfeed.loaders.stores.frame_store import FrameStore

    got = time_mmfeed(VERSION, steps=0, warmup=0, batch_size=4, workers=1, epochs=2, cache=tmp_path / "frames")
    steps = int(open_dataset(VERSION).lengths.sum())
    assert [e["samples"] for e in got["epochs"]] == [steps // 4 * 4] * 2 and got["epochs"][1]["pss_bytes"] > 0
    assert FrameStore(tmp_path / "frames").info().segments == 2 * len(open_dataset(VERSION))


def test_the_limit_decodes_three_pictures_a_sample_into_new_arrays_and_into_shared_memory():
    got = decode_limit(VERSION, samples=20, workers=1)
    assert got["samples"] == 20 and got["samples_per_s"] > 0 and got["bytes"] > 0
    assert got["samples_per_cpu_s"] > 0 and got["processes"] == 1
    for variant in ("shared_", "aligned_"):
        assert got[f"{variant}samples_per_s"] > 0 and got[f"{variant}cpu_s_per_1000_samples"] > 0


def test_the_limit_times_every_way_over_every_picture():
    from mmfeed.bench.rlds_compare import _chunk_blobs
    from mmfeed.loaders.formats.rlds.pictures import decode_picture

    steps = [0, 3, 7]
    got = _decode_chunk(str(VERSION), steps, warm=1)
    blobs = _chunk_blobs(str(VERSION), steps)
    assert got["pixels"] == sum(decode_picture(b, None, d, "rgb24", False, None).size for b, d in blobs)
    assert all(got[f"{v}{k}"] > 0 for v in ("", "shared_", "aligned_") for k in ("seconds", "cpu_s"))


def test_arguments(tmp_path):
    python = tmp_path / "python"
    python.write_text("")
    quick = parse_args(["--tf-python", str(python), "--quick"])
    assert (quick.episodes, quick.repeats, quick.workers) == (12, 1, 2)
    with pytest.raises(SystemExit):
        parse_args(["--tf-python", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):
        parse_args(["--tf-python", str(python), "--steps", "0"])


@pytest.mark.slow  # writes a 12-episode dataset with TFDS and runs tf.data in a child process
def test_quick_benchmark_against_tf_data(tf_python, tmp_path):
    out = tmp_path / "rlds.json"
    assert main(["--tf-python", tf_python, "--quick", "--cache", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["dataset"]["episodes"] == 12 and got["tf_data"]["runs"][0]["shapes"] == {
        "image": [32, 2, 256, 256, 3], "wrist": [32, 128, 128, 3], "state": [32, 8], "action": [32, 4, 7]}
    for side in ("tf_data", "mmfeed"):
        assert got[side]["samples_per_s"] > 0 and got[side]["first_batch_s"] > 0 and got[side]["rss_bytes"] > 0
        assert got[side]["runs"][0]["samples"] == 8 * 32
    assert got["limit"]["samples_per_s"] > 0 and got["mmfeed_over_tf"] > 0
    assert got["mmfeed_over_limit"] == got["mmfeed"]["samples_per_s"] / got["limit"]["samples_per_s"]  # one round
    assert got["mmfeed_over_limit_cpu_spread"]["range"] == 0
    assert got["mmfeed_over_shared_limit"] == got["mmfeed"]["samples_per_s"] / got["limit"]["shared_samples_per_s"]
    before, after = got["limit"]["runs"][0]["bracket"]  # the round's limit: right before and right after mmfeed
    assert before["samples"] == after["samples"] == 100
    assert got["limit"]["samples_per_s"] == (before["samples_per_s"] + after["samples_per_s"]) / 2
    assert [e["samples"] for e in got["cache"]["epochs"]] == [got["dataset"]["samples"] // 32 * 32] * 3
