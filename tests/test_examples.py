"""Every example runs as a user would run it (``python examples/x.py --quick``) and prints what it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
slow = pytest.mark.slow  # each example is a fresh interpreter: a few seconds of imports and work


def run_example(name: str) -> str:
    env = {**os.environ, "PYTHONWARNINGS": "default"}
    env.pop("MMFEED_EXAMPLE_QUICK", None)
    proc = subprocess.run([sys.executable, str(EXAMPLES / name), "--quick"], capture_output=True, text=True,
                          timeout=120, env=env, cwd=EXAMPLES.parent)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_every_example_is_tested():
    """A new example gets a test here: the set of scripts is the set this file runs."""
    assert {p.name for p in EXAMPLES.glob("*.py")} == {"train_world_model.py", "lm_packing.py",
                                                        "lerobot_dataset.py", "webdataset_shards.py"}


@slow
def test_train_world_model_trains_and_reports_stalls():
    """Four optimizer steps, each printing a finite loss, then the stall report with stages and a bottleneck;
    the loss goes down from the first step to the last."""
    out = run_example("train_world_model.py")
    losses = [float(x) for x in re.findall(r"^step +\d+ .* loss (\S+)", out, flags=re.M)]
    assert len(losses) == 4 and all(0 < x < 100 for x in losses), out
    assert losses[-1] < losses[0], out
    assert re.search(r"stall report: stall_fraction \d+\.\d%", out), out
    assert "stage decode" in out and "bottleneck:" in out, out


@slow
def test_lm_packing_paths_agree():
    """SDPA with attention_mask(), FlexAttention with block_mask() and per-document attention over
    cu_seqlens agree, packing is efficient, and the missing flash_attn is a note, not a failure."""
    out = run_example("lm_packing.py")
    eff = float(re.search(r"efficiency (\d+\.\d)%", out).group(1))
    assert eff > 90, out
    diffs = [float(x) for x in re.findall(r"max \|diff\|(?: on real tokens)? = (\S+)", out)]
    assert len(diffs) >= 2 and max(diffs) < 1e-5, out
    assert "flash_attn is not installed" in out or "flash-attention varlen" in out, out
    assert "DataLoader(PackedMapDataset)" in out, out


@slow
def test_lerobot_dataset_reads_action_chunks_with_pad_flags():
    """Batches from an AV1 LeRobot v3 directory hold 2 history frames and 50 actions per sample, with
    _is_pad counts for every windowed key."""
    out = run_example("lerobot_dataset.py")
    batches = re.findall(r"^batch \d+: (\d+) samples.*frames\.cam_high \((\d+), 48, 64, 3\).*action \((\d+), 14\)"
                         r".*is_pad counts \{.*'action': (\d+)\}", out, flags=re.M)
    assert len(batches) == 2, out
    for samples, frames, actions, _ in batches:
        assert int(frames) == 2 * int(samples) and int(actions) == 50 * int(samples)
    assert sum(int(b[3]) for b in batches) > 0, "anchors near episode ends must flag padded action steps"


@slow
def test_webdataset_shards_write_index_and_load():
    """Shards are written, indexed, read by the webdataset library itself and loaded as packed batches."""
    out = run_example("webdataset_shards.py")
    assert re.search(r"index mmfeed-index\.parquet: 4 episodes", out), out
    assert "webdataset reads shard 0 as it is: key 'episode_000000'" in out, out
    assert re.search(r"batch: 2 rows x 1024 tokens, \d+ documents", out), out
    assert "data['frames.cam_high']" in out and "uint8" in out, out


@slow
@pytest.mark.skipif(not os.environ.get("MMFEED_EXAMPLES_FULL"), reason="set MMFEED_EXAMPLES_FULL=1 to run")
def test_train_world_model_full_run_learns():
    """The full (non-quick) run: 40 steps with worker processes; the last losses are well below the first."""
    proc = subprocess.run([sys.executable, str(EXAMPLES / "train_world_model.py")], capture_output=True, text=True,
                          timeout=300, cwd=EXAMPLES.parent)
    assert proc.returncode == 0, proc.stderr
    losses = [float(x) for x in re.findall(r"^step +\d+ .* loss (\S+)", proc.stdout, flags=re.M)]
    assert len(losses) == 40 and sum(losses[-5:]) < 0.5 * sum(losses[:5]), proc.stdout
