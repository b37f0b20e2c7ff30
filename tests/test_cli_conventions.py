"""What every ``mmfeed`` command shares: frame sizes written WIDTHxHEIGHT on every flag (and turned into the
``(height, width)`` the Python APIs take), progress bars drawn only on a terminal (and ``--no-progress``), and the
``mmfeed bench`` output saying what its figures are. Real commands on tiny real datasets, a real pseudo-terminal."""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import re
import select
import struct
import sys
import termios
from pathlib import Path

import numpy as np
import pytest

import procs
from mmfeed._parsing import FRAME_SIZE, FrameSize
from mmfeed._progress import shows_progress
from mmfeed.cli import NAMED_BENCHMARKS, build_parser
from mmfeed.cli import main as cli_main

CAM = "observation.images.cam_high"
TINY = ("--episodes", "2", "--min-length", "10", "--max-length", "12")
BAR_MARKS = ("\r", "%|", "\x1b[")  # what a tqdm bar writes: carriage returns, its frame, cursor moves


@pytest.fixture(scope="module")
def synth_64x48(tmp_path_factory) -> Path:
    """`mmfeed synth --size 64x48`: 64 wide, 48 high."""
    out = tmp_path_factory.mktemp("sizes") / "src"
    assert cli_main(["synth", str(out), "--size", "64x48", *TINY, "--no-progress"]) == 0
    return out


# ------------------------------------------------------------------------------------------------ frame sizes


def test_synth_convert_and_cache_read_frame_sizes_as_width_by_height(synth_64x48, tmp_path, capsys):
    from mmfeed.loaders import open_dataset

    assert open_dataset(synth_64x48).features[CAM].shape == (48, 64, 3)  # (H, W, 3): 48 high, 64 wide
    assert cli_main(["convert", str(synth_64x48), str(tmp_path / "small"), "--frame-size", "32x24",
                     "--no-progress"]) == 0
    small = open_dataset(tmp_path / "small")
    assert small.features[CAM].shape == (24, 32, 3)
    assert small.episode(0)[CAM].shape[1:] == (24, 32, 3)  # the frames themselves: 24 high, 32 wide
    cache = tmp_path / "cache"
    assert cli_main(["cache", str(synth_64x48), "--dir", str(cache), "--frame-size", "32x24", "--processes", "1",
                     "--no-progress"]) == 0
    stored = sorted(cache.rglob("*.npy"))
    assert len(stored) == 2  # one segment per episode, decoded at 24 high, 32 wide
    assert all(np.load(f, mmap_mode="r").shape[1:] == (24, 32, 3) for f in stored)
    # training opens the dataset with frame_size=(H, W) and finds those segments: cached equals decoded
    cached = open_dataset(synth_64x48, cache=cache, frame_size=(24, 32)).episode(1)[CAM]
    assert np.array_equal(cached, open_dataset(synth_64x48, frame_size=(24, 32)).episode(1)[CAM])
    assert len(sorted(cache.rglob("*.npy"))) == 2  # nothing new stored: the command filled what training reads
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:  # a size written another way is refused naming the order
        cli_main(["convert", str(synth_64x48), str(tmp_path / "x"), "--frame-size", "24"])
    assert exited.value.code == 2 and f"as {FRAME_SIZE}" in capsys.readouterr().err


def _commands() -> list[tuple[str, ...]]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [(name,) for name in sub.choices] + [("bench", name) for name in NAMED_BENCHMARKS]


def _option_blocks(text: str) -> list[str]:
    """The help of each option: its line (``  --flag ...``) and the deeper-indented lines after it."""
    blocks: list[str] = []
    for line in text.splitlines():
        if re.match(r"^  -", line):
            blocks.append(line)
        elif blocks and re.match(r"^ {3,}\S", line):
            blocks[-1] += "\n" + line
        elif blocks and line.strip():
            blocks.append("")  # a heading or the epilog ends the option
    return [b for b in blocks if b]


def test_every_frame_size_flag_of_every_command_says_width_by_height(capsys):
    found = []
    for command in _commands():
        capsys.readouterr()
        with pytest.raises(SystemExit):
            cli_main([*command, "--help"])
        text = capsys.readouterr().out
        assert "HxW" not in text and "HEIGHTxWIDTH" not in text, command
        for block in _option_blocks(text):
            flag = block.split()[0].rstrip(",")
            assert flag not in ("--height", "--width"), f"{command}: one {FRAME_SIZE} flag, not {flag}"
            if re.fullmatch(r"--(frame-)?size", flag):
                assert block.count(FRAME_SIZE) >= 2, f"{command} {flag}: metavar and help say {FRAME_SIZE}\n{block}"
                found.append((*command, flag))
    assert {("bench", "--size"), ("synth", "--size"), ("convert", "--frame-size"), ("cache", "--frame-size"),
            ("bench", "convert", "--size")} <= set(found), found
    # and each of mmfeed's own parses WIDTHxHEIGHT into a FrameSize (width first), whatever it is named
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, parser in sub.choices.items():
        for action in parser._actions:
            if {"--size", "--frame-size"} & set(action.option_strings):
                assert action.type("64x48") == FrameSize(width=64, height=48), name


# ------------------------------------------------------------------------------------------------- progress


def test_no_bar_is_drawn_when_stderr_is_not_a_terminal(synth_64x48, tmp_path, capsys):
    """synth, index, convert, stats and cache without --no-progress, stderr captured (not a terminal)."""
    out = tmp_path / "wds"
    runs = [["synth", str(out), "--size", "64x48", *TINY],
            ["index", str(out), "-o", str(tmp_path / "again.parquet")],
            ["convert", str(synth_64x48), str(tmp_path / "converted")],
            ["stats", str(synth_64x48)],
            ["cache", str(synth_64x48), "--dir", str(tmp_path / "cache"), "--processes", "1"]]
    for argv in runs:
        capsys.readouterr()
        assert cli_main(argv) == 0, argv
        err = capsys.readouterr().err
        assert not any(mark in err for mark in BAR_MARKS), (argv[0], err)
        for label in ("writing webdataset", "indexing", "convert:", "stats:", "decoding into the cache"):
            assert label not in err, (argv[0], err)


def test_every_command_that_decodes_or_writes_takes_no_progress():
    parser = build_parser()
    for argv in (["synth", "out"], ["index", "shards"], ["convert", "src", "dst"], ["stats", "path"],
                 ["cache", "path", "--dir", "d"], ["bench"]):
        assert parser.parse_args([*argv, "--no-progress"]).no_progress is True, argv
        assert parser.parse_args(argv).no_progress is False, argv


def test_shows_progress_on_a_terminal_only():
    master, slave = pty.openpty()
    read, write = os.pipe()
    try:
        with open(slave, "w", closefd=False) as terminal, open(write, "w", closefd=False) as piped:
            assert shows_progress(True, terminal) and not shows_progress(False, terminal)
            assert not shows_progress(True, piped)
    finally:
        for fd in (master, slave, read, write):
            os.close(fd)


def test_a_bar_is_drawn_on_a_real_terminal(tmp_path, monkeypatch, capsys):
    """`mmfeed synth` with stderr on a pseudo-terminal (100 columns) draws its bar there, and clears it; stdout
    gets the summary line alone."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        with open(slave, "w", closefd=False) as terminal:
            monkeypatch.setattr(sys, "stderr", terminal)
            assert cli_main(["synth", str(tmp_path / "s"), "--size", "64x48", *TINY]) == 0
            terminal.flush()
        seen = b""
        while select.select([master], [], [], 0.2)[0]:
            seen += os.read(master, 65536)
    finally:
        os.close(master)
        os.close(slave)
    text = seen.decode(errors="replace")
    assert "writing webdataset" in text and "/2 [" in text and "episode" in text, text
    assert text.startswith("\r") and text.rstrip(" ").endswith("\r"), repr(text)  # drawn in place, then cleared
    stdout = capsys.readouterr().out
    assert stdout.startswith("wrote 2 episodes (64x48 h264") and "\r" not in stdout, stdout


@pytest.mark.slow
def test_bench_draws_no_bar_into_a_pipe(tmp_path):
    out = procs.run([sys.executable, "-m", "mmfeed", "bench", "--quick", "--repeats", "1", "--no-limit"],
                    env={**os.environ, "MMFEED_CACHE": str(tmp_path / "cache")}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert not any(mark in out.stderr for mark in BAR_MARKS) and "interleaved" not in out.stderr, out.stderr


# --------------------------------------------------------------------------------------- bench's explanations


def _report(**breakdown) -> dict:
    """A report as run_bench makes it, with the figures that read as nonsense unexplained: a wait whose repeats
    run from 0.01 to 0.42 ms around a median of 0.03 (1367% of it), mmfeed at 102% of the limit, and a decode
    stage 5.03 ms faster than the limit's decode + conversion."""
    def figures(samples: float) -> dict:
        return {"samples_per_s": samples, "tokens_per_s": samples * 100, "delivered_frames_per_s": samples * 6,
                "decoded_frames_per_s": samples * 12, "tokens_per_cpu_second": samples * 90,
                "packing_efficiency": 0.8, "padding_fraction": 0.2, "stall_fraction": 0.002, "wait_s": 3e-5,
                "stage_s": {"decode": 0.01, "collate": 0.001}, "bottleneck": {"recommendation": "speed up the model"}}

    def spread(lo: float, mid: float, hi: float) -> dict:
        return {"min": lo, "max": hi, "range": (hi - lo) / mid}

    rates = {k: spread(0.9, 1.0, 1.1) for k in ("samples_per_s", "tokens_per_s", "delivered_frames_per_s")}
    mm = {**rates, "wait_s": spread(1e-5, 3e-5, 4.2e-4), "stall_fraction": spread(0.001, 0.002, 0.004),
          "limit_fraction": spread(0.9, 1.02, 1.3), "limit_fraction_cpu": spread(0.5, 0.6, 0.7),
          "decode_limit_frames_per_s": spread(900.0, 1000.0, 1100.0), "stage_s.decode": spread(0.009, 0.01, 0.012)}
    ours = figures(400.0)
    return {**ours, "baseline": figures(100.0), "ratios": {"samples_per_s": 4.0}, "readers_opened_per_batch": 0.0,
            "decode_limit_frames_per_s": 1000.0, "decode_limit_raw_frames_per_s": 1500.0, "limit_fraction": 1.02,
            "limit_fraction_cpu": 0.6, "bottleneck": ours["bottleneck"], "environment": {"cpu_count": 2},
            "settings": {"format": "given", "data": "shards", "chunk_steps": 0, "workers": 2, "capacity": 512,
                         "rows_per_batch": 2, "baseline_batch_size": 4, "episode_block": 0, "step_ms": None,
                         "load_fraction": 0.8, "repeats": 5},
            "details": {"step_s": 0.012, "steps": {"mmfeed": 8, "baseline": 8}, "wall_s": {"total": 4.0},
                        "loadavg": {"start": [3.2, 2, 1], "end": [3.4, 2, 1]},
                        "spread": {"mmfeed": mm, "baseline": rates},
                        "limit": {"processes": 2, "decoded_frames_per_s": 2800.0, "decoded_per_delivered": 2.8,
                                  "cpu_share": 0.3, "open_s": 0.012},
                        "breakdown": {"limit_decode_s": 0.008, "limit_convert_s": 0.007, "limit_seek_s": 2e-4,
                                      "stage_decode_s": 0.01, "stage_collate_s": 0.001,
                                      "decode_beyond_limit_s": -0.00503, "reopen_s": 0.0, "unstaged_s": 0.004,
                                      "worker_budget_s": 0.02, "wall_s": 0.01, **breakdown}}}


def test_bench_output_says_what_each_figure_is_and_explains_the_odd_ones():
    from mmfeed.bench.plot import render

    text = render(_report())
    lines = text.splitlines()
    flat = " ".join(text.split())  # the notes are wrapped
    wait = next(line for line in lines if line.startswith("wait per step (ms)"))
    assert "0.41 ms" in wait and "%" not in wait, wait  # a time's spread in ms, not 1367% of a tiny median
    assert "spread: how far the 5 stretches disagree: (max - min) / median for a rate" in text
    assert "max - min in points for a %, in ms for a time" in text
    assert "mmfeed/baseline: mmfeed's median over the baseline's" in text
    assert "mmfeed delivers 102.0% of the limit: its delivered frames/s over the limit's" in text
    assert "90.0%-130.0% across the 5 stretches" in text
    assert "above 100% does not mean mmfeed decodes faster than plain PyAV can" in flat
    assert "decoded fewer frames per delivered frame (2.00 against the limit's 2.80" in flat
    table = text[text.index("where a batch goes"):text.index("bottleneck:")]
    assert not re.search(r"\s-\d", table), table  # no negative part: a part below 0 is named for what it means
    row = next(line for line in table.splitlines() if "decode stage below the limit's decode + conversion" in line)
    assert row.split()[-1] == "5.03" and row.rstrip().split()[-2] == "*", row
    assert "* decode stage below the limit's decode + conversion, by: mmfeed's decode stage took less" in \
        " ".join(table.split())
    # the other differences of medians that can come out below 0 are named, not printed negative
    odd = render(_report(limit_convert_s=-0.001, unstaged_s=-0.002))
    assert "limit: RGB conversion below 0, by *" in odd and "stages beyond the worker budget, by *" in odd
    assert not re.search(r"\s-\d", odd[odd.index("where a batch goes"):])
    assert "a spread above 50%" not in text  # the rates agree within 20% here: no word about the load
    noisy = _report()
    noisy["details"]["spread"]["mmfeed"]["samples_per_s"] = {"min": 100.0, "max": 900.0, "range": 2.0}
    assert "a spread above 50% (up to 200% here): the stretches ran under different loads" in \
        " ".join(render(noisy).split())
