"""``mmfeed bench gpu``: without CUDA one line and exit 0 (through the CLI entry, in this process), its help, and
the CPU side of every part on tiny sizes: the videos it writes and their decode figures (PyAV), the packed rows
and their block masks, the FlexAttention-against-SDPA check (and that it fails on a wrong attention), the
prefetch-overlap measurement on the CPU, and the device-transform rows on the CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from mmfeed.bench import gpu
from mmfeed.cli import main as cli_main

from flex import eager_flex


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the benchmark measures instead")
def test_without_cuda_it_prints_one_line_and_exits_0(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    capsys.readouterr()
    assert cli_main(["bench", "gpu", "--json", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "mmfeed bench gpu: no CUDA device (torch.cuda.is_available() is False); nothing to measure"]
    report = json.loads(out.read_text())
    assert report["skipped"] == gpu.NO_CUDA and "versions" in report["environment"]
    assert cli_main(["bench", "gpu", "--quick"]) == 0
    assert capsys.readouterr().out.splitlines() == [gpu.NO_CUDA]


def test_help_names_the_command_and_its_options(capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["bench", "gpu", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "usage: mmfeed bench gpu" in text and "--json OUT" in text and "--quick" in text
    assert "5 minutes" in text


def test_the_videos_it_writes_have_their_sizes_and_decode_on_the_cpu(tmp_path):
    from mmfeed.codecs import probe

    paths = gpu.write_videos(tmp_path, gpu.DECODE_SIZES, frames=6)
    assert [(probe(p).height, probe(p).width, probe(p).num_frames) for p in paths] == [(224, 224, 6), (720, 1280, 6)]
    rows = gpu.measure_decode(paths[0], {"pyav": {"backend": "pyav"}}, repeats=1)
    assert [r["workload"] for r in rows] == ["sequential", "windows"]
    for row in rows:
        assert row["video"] == "h264 224x224" and "nvdec" not in row
        assert math.isfinite(row["pyav_frames_per_s"]) and row["pyav_frames_per_s"] > 0
        assert math.isfinite(row["pyav_cpu_s_per_1000"]) and row["pyav_cpu_s_per_1000"] > 0


@pytest.mark.parametrize("capacity", gpu.ROW_TOKENS)
def test_packed_rows_fill_their_length_with_causal_and_block_causal_documents(capacity):
    batch = gpu.packed_row(capacity)
    lengths = (batch.cu_seqlens[1:] - batch.cu_seqlens[:-1]).tolist()
    assert batch.capacity == capacity and batch.num_rows == 1
    assert sum(lengths) > 0.85 * capacity and max(lengths) <= 4096 and batch.num_documents >= 4
    steps = batch.step_ids[0, : lengths[0] + lengths[1]]
    assert steps[lengths[0] - 1] == lengths[0] - 1  # the first document token-causal
    assert steps[lengths[0]:].max() == lengths[1] // 256 - 1  # the second in 256-token frames
    assert torch.equal(gpu.packed_row(capacity).document_ids, batch.document_ids)  # seeded


def test_block_mask_of_a_small_row_has_the_row_shape_and_equals_the_dense_mask():
    batch = gpu.packed_row(512)
    mask = batch.block_mask(128)
    assert mask.shape == (1, 1, 512, 512) and tuple(mask.kv_num_blocks.shape) == (1, 1, 4)
    dense = batch.attention_mask()
    assert dense.shape == (1, 1, 512, 512)
    # every block the mask skips is empty in the dense mask
    blocks = mask.to_dense()[0, 0].bool()
    assert not (dense[0, 0].reshape(4, 128, 4, 128).any(dim=(1, 3)) & ~blocks).any()


def test_flex_against_sdpa_check_agrees_on_the_cpu_and_fails_on_a_wrong_attention():
    batch = gpu.packed_row(512, seed=1)
    same = gpu.flex_matches_sdpa(batch, flex=eager_flex, dtype=torch.float64, block_size=128, atol=1e-10, rtol=0)
    assert same["allclose"] is True and same["max_abs_diff"] < 1e-10

    def unmasked(q, k, v, block_mask):  # attends across documents: the check must catch it
        return sdpa(q, k, v)

    wrong = gpu.flex_matches_sdpa(batch, flex=unmasked, dtype=torch.float64)
    assert wrong["allclose"] is False and wrong["max_abs_diff"] > 0.1


def test_prefetch_overlap_measures_both_modes_on_the_cpu():
    step, model_ms = gpu.matmul_step("cpu", 2.0, size=64)
    assert model_ms > 0
    rows = gpu.measure_overlap("cpu", quick=True, workers=0, step=step, model_ms=model_ms, steps=6)
    assert [r["case"] for r in rows] == ["prefetch=2", "copy in the loop"]
    for row in rows:
        assert row["steps"] == 6 - gpu.WARMUP_STEPS and row["step_ms"] > 0 and row["compute_ms"] >= 0
        assert row["frames_mb_per_batch"] > 0 and isinstance(row["copy_hidden"], bool)
    assert rows[0]["copy_ms"] is None  # no copy on the CPU
    assert rows[1]["copy_ms"] >= 0 and rows[1]["copy_hidden"] is False


def test_bad_sizes_are_refused_naming_the_value():
    with pytest.raises(ValueError, match="target_ms must be > 0, got 0.0"):
        gpu.matmul_step("cpu", 0.0)
    with pytest.raises(ValueError, match="steps must be an int > 2"):
        gpu.measure_overlap("cpu", quick=True, workers=0, step=lambda b: None, model_ms=1.0, steps=2)
    with pytest.raises(ValueError, match="capacity must be an int >= 256 tokens, got 100"):
        gpu.packed_row(100)


def test_device_transform_rows_on_the_cpu_give_one_row_per_way():
    rows = gpu.device_transform_rows(quick=True, device="cpu", episodes=2, rounds=1, workers=0, height=48, width=64,
                                     crop=32)
    assert [r["case"] for r in rows] == ["none (64x48 -> 32)", "workers (64x48 -> 32)", "device (64x48 -> 32)"]
    for row in rows:
        assert row["part"] == "device transforms" and row["samples_per_s"] > 0 and row["samples"] > 0
        assert row["gpu"].startswith(f"{row['samples_per_s']:.0f} samples/s")
    assert rows[1]["gain"] == 1.0 and rows[2]["transform_ms_per_batch"] > 0 and "transform" in rows[2]["gpu"]


def test_every_part_that_runs_on_the_cpu_fills_its_rows_and_a_failing_part_is_one_row():
    """The parts' own row code on the CPU, tiny: decode with PyAV standing in for the GPU decoder, attention with
    eager FlexAttention (float64), and a part that raises."""
    from functools import partial

    def broken(quick):
        raise RuntimeError("no\nluck")

    parts = {"decode": partial(gpu.decode_rows, repeats=1, gpus={"pyav_again": {"backend": "pyav"}},
                               sizes=[(224, 224)], frames=6),
             "attention": partial(gpu.attention_rows, device="cpu", flex=eager_flex, sizes=[512], check_tokens=256,
                                  heads=2, dim=8, dtype=torch.float64),
             "broken": broken}
    rows, seconds = gpu.run_parts(parts, quick=True)
    assert list(seconds) == ["decode", "attention", "broken"]
    assert [r["part"] for r in rows] == ["decode", "decode", "attention", "attention", "broken"]
    for row in rows[:2]:
        assert row["gain"] > 0 and row["baseline"].startswith("pyav ") and row["gpu"].startswith("pyav_again ")
    check, long = rows[2], rows[3]
    assert check["allclose"] is True and check["note"].startswith("allclose=True")
    assert long["tokens"] == 512 and long["sdpa_ms"] > 0 and long["flex_ms"] > 0 and long["block_mask_ms"] > 0
    assert long["max_abs_diff"] < 1e-10 and 0 <= long["block_sparsity_pct"] <= 100
    assert rows[4] == {"part": "broken", "case": "-", "note": "failed: RuntimeError: no luck"}
    text = gpu.table(rows, gpu.COLUMNS)
    assert text.splitlines()[0].split() == ["part", "case", "baseline", "on", "the", "GPU", "gain", "note"]
