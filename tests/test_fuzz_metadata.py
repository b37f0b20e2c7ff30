"""Hostile metadata, fuzzed (``tests/fuzz_metadata.py``): one field of a small LeRobot directory's info.json,
episodes parquet or data file, or of a shard set's index, set to a hostile value, gives a clean one-line error
naming the dataset's file or exactly the pristine episodes; each example within seconds, the whole run within
1 GB, and no file outside the dataset opened. Every field with every hostile value once, and a bounded, seeded
random run over other rows here; a long one by hand (its docstring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.mark.slow  # each example copies, mutates, opens and reads a small dataset (about 0.03 s)
@pytest.mark.parametrize("args, examples", [(["--sweep"], None), (["--examples", "150", "--seed", "0"], 150)],
                         ids=["every-field-every-value", "random-rows-seed-0"])
def test_hostile_metadata_is_refused_cleanly_or_changes_nothing(args, examples):
    proc = subprocess.run([sys.executable, str(HERE / "fuzz_metadata.py"), *args],
                          capture_output=True, text=True, timeout=600)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failures"] == [], json.dumps(report["failures"], indent=1)[:6000]
    assert proc.returncode == 0
    assert report["examples"] == examples if examples else report["examples"] > 1000
    assert report["peak_rss_mib"] < 1024 and report["slowest_s"] < 20
    refused = sum(n for kind, n in report["outcomes"].items() if kind.startswith("refused"))
    assert refused > 50 and report["outcomes"].get("same episodes", 0) > 10, report["outcomes"]
