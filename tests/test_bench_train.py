"""``mmfeed bench train``: the quick run through the command line, and the property its loss comparison rests on.

- the quick run (``python -m mmfeed bench train --quick --json F``) writes a report ``mmfeed compare`` reads, in
  which every side trained on the same useful tokens in as many steps, packing pads less than pad-to-longest, and
  the packed and padded trainings (same samples in every step) end with the same loss per label term;
- one optimizer step on the same samples, packed into shared rows or one row each padded to the longest, gives
  the same per-document losses and the same gradients in float64 (so equal losses are no accident of the run);
- the workload is the mixture it claims: long world-model chunks beside short policy windows, both embodiments,
  each document's tokens the layout's price and its payload items whole.
"""

from __future__ import annotations

import copy
import json
import math
import sys

import numpy as np
import pytest
import torch

import procs
from mmfeed.bench import train
from mmfeed.bench.compare import compare, figures
from mmfeed.testing.model import TinyWorldModel


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as the benchmark runs on CPU (quicker and steadier on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-train") / "train.json"
    got = procs.run([sys.executable, "-m", "mmfeed", "bench", "train", "--quick", "--no-progress", "--json", str(out)],
                    timeout=120)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "packed / padded:" in got.stdout and f"wrote {out}" in got.stdout
    return json.loads(out.read_text())


@pytest.mark.slow  # trains a model on both sides
def test_quick_run_trains_every_side_on_the_same_useful_tokens(report):
    sides = [report[s] for s in train.SIDES]
    assert len({s["useful_tokens"] for s in sides}) == 1 and sides[0]["useful_tokens"] > 0
    assert len({s["steps"] for s in sides}) == 1
    for s in sides:
        assert len(s["repeats"]["useful_tokens_per_s"]) == train.QUICK.repeats
        assert all(v > 0 and math.isfinite(v) for v in s["repeats"]["useful_tokens_per_s"])
        assert s["token_slots"] == round(s["useful_tokens"] / (1 - s["padding_fraction"]))


def test_quick_run_packing_pads_less_than_pad_to_longest(report):
    packed, padded, fixed = (report[s]["padding_fraction"] for s in train.SIDES)
    assert 0 <= packed < 0.1 < padded and packed < fixed
    assert report["packed"]["row_tokens_per_step"] == train.QUICK.capacity


def test_quick_run_packed_and_padded_losses_agree(report):
    """Same samples in every step: the trainings differ by float rounding only, far inside the 1% target."""
    ratios = report["ratios"]
    assert ratios["train_loss_relative_difference_padded"] < 1e-4
    assert ratios["heldout_loss_relative_difference_padded"] < 1e-4
    assert report["target_checks"]["loss_relative_difference"] is True
    assert 0 < report["packed"]["train_loss"] < 10  # a real loss was computed, not 0 = 0


def test_mmfeed_compare_reads_the_report(report):
    found = figures(report)
    assert found["packed.useful_tokens_per_s"].kind == "throughput"
    assert found["packed.useful_tokens_per_s"].samples == tuple(report["packed"]["repeats"]["useful_tokens_per_s"])
    assert found["padded.stretch_s"].kind == "time" and found["ratios.packed_vs_padded"].kind == "info"
    assert compare(report, report).regressed == []


def _one_step():
    """A packed step holding a world-model chunk (so its padded twin pads a lot) and clamped actions, if any step
    has some (so the loss must leave them out), and its padded twin."""
    docs = train.corpus(train.QUICK, 8, seed=3)
    steps = train.packed_steps(docs, train.QUICK, 4, seed=3)
    rows = max(steps, key=lambda r: (any(docs[int(i)].pad.any() for i in np.concatenate(r)),
                                     max(docs[int(i)].tokens for i in np.concatenate(r))))
    samples = np.concatenate(rows)
    packed = train.build_batch(docs, rows, train.QUICK.capacity)
    padded = train.padded_batch(docs, samples)
    return docs, samples, packed, padded


def test_one_step_on_the_same_samples_gives_the_same_loss_and_gradients():
    docs, samples, packed, padded = _one_step()
    assert packed.num_rows < padded.num_rows == len(samples) > 2 and padded.capacity < packed.capacity
    torch.manual_seed(0)
    model = TinyWorldModel(train.model_config(train.QUICK)).double()
    a, b = model.loss(packed), model.loss(padded)
    torch.testing.assert_close(a.document_sum, b.document_sum, atol=1e-10, rtol=0)  # same document order
    assert a.document_count.tolist() == b.document_count.tolist()
    assert a.chunk_count["action"] < sum(len(docs[int(i)].pad) for i in samples)  # clamped actions left out
    params = list(model.parameters())
    ga = torch.autograd.grad(a.loss, params, allow_unused=True)
    gb = torch.autograd.grad(b.loss, params, allow_unused=True)
    for x, y in zip(ga, gb):
        assert (x is None) == (y is None)
        if x is not None:
            torch.testing.assert_close(x, y, atol=1e-10, rtol=0)
    # one AdamW step later (float32, as the benchmark trains) both models give the same loss per label term
    m1 = TinyWorldModel(train.model_config(train.QUICK))
    m2 = copy.deepcopy(m1)
    for m, batch in ((m1, packed), (m2, padded)):
        train.train_step(m, torch.optim.AdamW(m.parameters(), lr=1e-3), batch)
    with torch.no_grad():
        after = [float(m.loss(packed).loss) for m in (m1, m2)]
    assert abs(after[0] - after[1]) <= 1e-5 * abs(after[1])


def test_a_padded_row_that_leaked_into_attention_would_be_caught():
    """The comparison can fail: unmasked padding (every slot of a row attending to every other) changes the
    padded side's loss, so equal losses above do say the masks are exact."""
    _, _, packed, padded = _one_step()
    torch.manual_seed(0)
    model = TinyWorldModel(train.model_config(train.QUICK)).double()
    leaky = torch.ones(padded.num_rows, 1, padded.capacity, padded.capacity, dtype=torch.bool)
    with torch.no_grad():
        honest, leaked = float(model.loss(packed).loss), float(model.loss(padded, mask=leaky).loss)
    assert abs(honest - leaked) > 1e-4


def test_the_workload_mixes_long_chunks_short_windows_and_both_embodiments():
    docs = train.corpus(train.QUICK, 8, seed=1)
    kinds = {(d.kind, d.embodiment) for d in docs}
    assert kinds == {(k, e) for k in ("world_chunk", "policy_window") for e in train.EMBODIMENTS}
    chunk = max(d.tokens for d in docs if d.kind == "world_chunk")
    window = max(d.tokens for d in docs if d.kind == "policy_window")
    assert chunk > 2 * window
    names = train.modalities()
    for d in docs:
        assert d.tokens == sum(n for _, n in d.segments) == sum(d.steps)
        for m, items in d.items.items():
            per = 1 if m == "text" else train.LAYOUT.tokens(m)
            assert sum(n for i, n in d.segments if names[i] == m) == per * len(items)
        assert len(d.pad) == len(d.items["action"])
    assert any(d.pad.any() for d in docs)  # windows near an episode's end flag their clamped actions


def test_cuda_is_skipped_cleanly_without_a_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the benchmark would run on it")
    assert train.main(["--quick", "--device", "cuda"]) == 0
    assert "skipped" in capsys.readouterr().out


def test_bad_settings_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        train.main(["--steps", "0"])
    assert exit_.value.code == 2 and "--steps must be >= 1" in capsys.readouterr().err

