"""The README, run: what it prints works as printed.

- Every ```python block of README.md runs, in order, in one process, in a temporary directory holding small
  synthetic data under the names the README uses (``shards/``, ``lerobot/``, ``episode.mp4``, the mixtures'
  directories, ``idle_ranges.json``; ``s3://bucket/...`` is moto's S3 server on 127.0.0.1). A block sees the data
  variables earlier blocks made (``ds``, ``window``, ``packing``, ...) but none of the names their imports bound,
  so a block that lacks an import it needs fails here, as it would for a reader who copies it alone. What the
  README promises of the results (shapes in its comments, keys) is asserted after the block that promises it.
- Nothing is skipped silently: a block is skipped only under an HTML comment ``<!-- readme-test: skip: REASON -->``
  right above it, and only where that reason holds (the GPU-decode block where CUDA is missing);
  the test asserts how many blocks carry a marker, so a new skip fails until it is counted here.
- Every ```bash block's command runs, less its ``pip install ... &&`` prefix (CI installs the package for real):
  ``mmfeed bench`` runs in this process through the CLI's ``main`` with ``--quick`` and a few flags that make it
  a short smoke run (stated in ``BENCH_SMOKE``); the test command ``python -m pytest -q`` is not run recursively:
  the test checks that it is the command ``.ci/run`` runs.
- Every ``mmfeed <command> ...`` in backticks (prose and code comments alike) parses with the real argument
  parser (``mmfeed.cli.build_parser()``, or a named benchmark's own), placeholders such as PATH and DIR replaced by
  real paths; a ``--flag`` in backticks after a command, in the same paragraph, must be one of that command's
  options. A renamed command or flag fails the test.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import socket
import time
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from mmfeed.testing import frame_pattern, make_episodes, write_embodiments, write_lerobot, write_video, write_webdataset

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
SKIP_MARK = re.compile(r"<!--\s*readme-test:\s*skip:\s*(.+?)\s*-->\s*$", re.S)

#: how many blocks carry a skip marker, each with its reason (the test fails when one is added or removed)
MARKED = {"python": 1, "bash": 0}

#: ``mmfeed bench`` as the bash block prints it, plus these flags: --quick (tiny videos, few steps, a smoke run),
#: one stretch of two batches, one episode per embodiment, no decode-limit measure, one worker, no progress bars
BENCH_SMOKE = ["--quick", "--repeats", "1", "--steps", "2", "--episodes", "1", "--no-limit", "--workers", "1",
               "--no-progress"]

H, W = 32, 48  # frame size of the synthetic cameras
EPISODES = dict(cameras=("cam_high",), camera_fps={"cam_high": 15.0}, height=H, width=W, min_length=24,
                max_length=40, state_dim=14, action_dim=14)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # line of README.md where the code starts
    skip: str | None  # the reason of a skip marker right above the block


def readme_blocks(text: str) -> list[Block]:
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = SKIP_MARK.search(before)
        out.append(Block(m.group(1), m.group(2), text.count("\n", 0, m.start(2)) + 1, mark.group(1) if mark else None))
    return out


def free_names(code: str) -> set[str]:
    """Names a block reads but neither binds nor finds among the builtins (a static look, for blocks skipped)."""
    import builtins

    loaded, bound = set(), set(imported_names(code))
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return loaded - bound - set(dir(builtins))


def imported_names(code: str) -> set[str]:
    """The names a block's import statements bind (``import a.b`` binds ``a``)."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


# ---------------------------------------------------------------------------------------------------- the data


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_data(root: Path) -> None:
    """Everything the README's blocks read, under the names they use."""
    episodes = make_episodes(3, seed=0, **EPISODES)
    write_webdataset(root / "shards", episodes, episodes_per_shard=2)
    # enough windows for 7 packed batches of the README's 4 rows of 8192 tokens (its StepTimer leaves 5 out)
    write_lerobot(root / "lerobot", make_episodes(8, seed=1, **{**EPISODES, "camera_fps": None, "min_length": 50,
                                                                 "max_length": 56}), codec="h264", gop=10)
    write_video(root / "episode.mp4", frame_pattern(12, height=H, width=W), gop=4)
    # "Mixtures": shards with one camera beside a LeRobot directory with a wrist camera as well
    write_webdataset(root / "robot_a", make_episodes(2, seed=2, **EPISODES), episodes_per_shard=2)
    write_lerobot(root / "lerobot_b", make_episodes(2, seed=3, **{**EPISODES, "camera_fps": None,
                                                                  "cameras": ("cam_high", "cam_wrist")}),
                  codec="h264", gop=10)
    # "Mixtures of robots": a 7-dim arm (LeRobot), a 14-dim bimanual robot (shards), a 2-dim base (LeRobot)
    # (about 3 batches of the README's 4 rows of 8192 tokens)
    robots = write_embodiments(root / "robots", episodes=4, min_length=40, max_length=60, height=H, width=W)
    for name, target in (("franka", "franka"), ("aloha", "aloha_shards"), ("base", "base")):
        os.rename(robots[name], root / target)
    (root / "idle_ranges.json").write_text(json.dumps(IDLE_RANGES))


#: openpi's DROID filter form per dataset: steps [start, end) kept of the episodes named
IDLE_RANGES = {"franka": {"0": [[2, 10]], "1": [[0, 4], [8, 14]]}, "base": {"1": [[3, 12]]}}


@pytest.fixture(scope="module")
def s3_bucket():
    """moto's S3 server on 127.0.0.1 (the dev extra), its endpoint and credentials in the environment."""
    pytest.importorskip("s3fs", reason="s3fs (the dev extra) reads s3:// URLs")
    from s3_server import moto_s3

    with moto_s3() as client:
        client.create_bucket(Bucket="bucket")
        yield client


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory, s3_bucket):
    root = tmp_path_factory.mktemp("readme")
    write_data(root)
    for path in (root / "lerobot").rglob("*"):
        if path.is_file():
            s3_bucket.upload_file(str(path), "bucket", f"my_lerobot_dataset/{path.relative_to(root / 'lerobot')}")
    return root


# ------------------------------------------------------------------------------------------- what blocks promise


def check_packing(ns):
    ev = lambda expr: eval(expr, ns)  # noqa: E731
    plan, lengths = ns["plan"], [600, 7000, 1200, 300, 5000]
    assert len(plan.bin_of) == len(lengths) and plan.num_bins >= ev("lower_bound([600, 7000, 1200, 300, 5000], 8192)")
    assert 0 < plan.efficiency <= 1
    assert ev("b.cu_seqlens").tolist() == [0, 5, 8, 15] and ev("b.max_seqlen") == 7
    mask = ev("b.attention_mask()")
    assert mask.dtype == torch.bool and tuple(mask.shape) == (2, 1, 8, 8)
    assert type(ev("b.block_mask()")).__name__ == "BlockMask"


def check_frames(ns):
    frames = ns["frames"]
    assert frames.dtype == np.uint8 and frames.shape == (3, H, W, 3)


def check_datasets(ns, root):
    from mmfeed.loaders.formats.lerobot.source import LeRobotSource

    ds = ns["ds"]
    features = eval("ds.features", ns)
    cam = features["observation.images.cam_high"]
    assert (cam.kind, cam.dtype, cam.shape, cam.fps) == ("video", "uint8", (H, W, 3), 15.0)
    state = features["observation.state"]
    assert (state.kind, state.dtype, state.shape, state.fps) == ("array", "float32", (14,), 30.0)
    assert {"action", "next.done"} <= set(features)
    assert {"mean", "std", "min", "max", "count"} <= set(ds.stats["observation.state"])
    ep = ns["ep"]
    assert {"task", "fps"} <= set(ep) and ep["observation.images.cam_high"].shape[1:] == (H, W, 3)
    assert len(ep["observation.state"]) == ds.lengths[0]
    lerobot = ns["lerobot"]
    assert isinstance(lerobot, LeRobotSource) and lerobot.files.remote
    assert lerobot.lengths.tolist() == ns["open_dataset"]("lerobot/").lengths.tolist()
    assert ns["small"].features["observation.images.cam_high"].shape == (224, 224, 3)
    planes = ns["planes"].episode(0)["observation.images.cam_high"]
    assert planes.shape[1:] == (H * 3 // 2, W)


def check_cache(ns, root):
    """The first read fills the store under frames/; frames read through it equal uncached ones, bit for bit."""
    from mmfeed.loaders import WindowSpec, open_dataset

    ds, spec = ns["ds"], WindowSpec.from_delta_timestamps({"observation.images.cam_high": [-1 / 15, 0.0]})
    assert ds.features["observation.images.cam_high"].shape == (224, 224, 3)
    first = ds.windows(spec)[5]["observation.images.cam_high"]
    stored = [p for p in (root / "frames").rglob("*") if p.is_file()]
    assert stored
    again = ds.windows(spec)[5]["observation.images.cam_high"]
    plain = open_dataset("lerobot/", frame_size=(224, 224)).windows(spec)[5]["observation.images.cam_high"]
    assert np.array_equal(first, plain) and np.array_equal(again, plain)


def check_gpu_decode(ns):
    batch = next(iter(ns["loader"]))
    frames = batch["observation.images.cam_high"]
    assert frames.is_cuda and frames.dtype == torch.uint8 and tuple(frames.shape[-3:]) == (H, W, 3)


def check_windows(ns):
    sample = ns["windows"][0]
    assert tuple(sample["action"].shape) == (50, 14) and tuple(sample["action_is_pad"].shape) == (50,)
    assert sample["action_is_pad"].dtype in (torch.bool, np.bool_)
    assert {"task", "episode_index"} <= set(sample)
    batch = next(iter(ns["loader"]))
    assert tuple(batch["action"].shape) == (32, 50, 14)


def check_packed(ns):
    batch, loader = ns["batch"], ns["loader"]
    rows, capacity = 4, 8192
    for ids in (batch.document_ids, batch.position_ids, batch.step_ids):
        assert tuple(ids.shape) == (rows, capacity)
    frames, action, is_pad = ns["frames"], ns["action"], ns["is_pad"]
    assert frames.dtype == torch.uint8 and tuple(frames.shape[1:]) == (224, 224, 3)
    assert action.shape[1:] == (14,) and is_pad.dtype == torch.bool and tuple(is_pad.shape) == (len(action),)
    assert len(action) == 50 * batch.num_documents and ns["text"].dtype == torch.int32
    report = loader.timer.report()
    assert report["steps"] == len(loader) > 1
    assert {"stage", "recommendation"} <= set(report["bottleneck"])
    assert isinstance(ns["state"], dict)


def check_timer(ns, root):
    report = ns["report"]
    assert set(report["phases"]) == {"wait", "copy", "transform", "compute", "comm"}
    assert report["steps"] == len(ns["loader"]) - 5 > 0  # warmup=5 left out
    assert report["comm_s"] is not None and report["comm_total_s"]["mean"] > 0  # the all-reduce was timed
    assert report["mfu"] is None or 0 < report["mfu"] < 1
    assert set(report["bottleneck"]) == {"stage", "recommendation"}
    summary = ns["timer"].summary().splitlines()
    assert f"bottleneck: {report['bottleneck']['stage']}: {report['bottleneck']['recommendation']}" in summary
    assert report["ranks"]["world_size"] == 1 and summary[-1].startswith("ranks: 1;")
    assert json.loads((root / "trace.json").read_text())["traceEvents"]


def check_transform(ns):
    from mmfeed import DataLoader

    batch = next(iter(DataLoader(ns["ds"], packing=ns["packing"])))  # the transform runs on every sample
    assert tuple(batch.data["observation.images.cam_high"].shape[1:]) == (224, 224, 3)
    assert abs(float(batch.data["observation.state"].mean())) < 2  # normalized


def check_device_transform(ns):
    batch = ns["batch"]
    frames = batch.data["observation.images.cam_high"]
    assert frames.dtype == torch.uint8 and tuple(frames.shape[1:]) == (160, 160, 3)
    assert abs(float(batch.data["observation.state"].mean())) < 2  # normalized
    loader = ns["augmented"]
    it = iter(loader)
    next(it), next(it)  # a step is counted when the loop asks for the next batch
    assert loader.timer.report()["transform_s"]["mean"] > 0  # timed as its own phase


def check_shards(ns):
    from mmfeed.loaders import open_dataset

    own = open_dataset("my_shards/")
    assert len(own) == 1 and own.lengths.tolist() == [50]
    assert (own.features["observation.state"].shape == (6,)
            and own.features["observation.gripper_closed"].dtype == "bool")
    top = own.features["observation.images.top"]
    assert (top.kind, top.shape, top.fps) == ("video", (224, 224, 3), 25.0)


def check_mixture(ns):
    mix = ns["mix"]
    assert {"observation.images.cam_high", "observation.images.cam_wrist"} <= set(mix.features)
    datasets = torch.cat([batch.metadata["dataset"] for batch in ns["loader"]])
    assert set(datasets.tolist()) == {0, 1}
    assert set(ns["both"].deltas) == {*ns["window"].deltas, "observation.images.cam_wrist"}


def check_robots(ns):
    """A whole epoch of the mixture of robots in worker processes (index 6 of the base's 2-dim action was an
    IndexError in a worker): 32-wide actions with their masks, and anchors only in the idle filter's ranges."""
    mix, loader = ns["mix"], ns["loader"]
    assert mix.dataset_names == ["franka", "aloha", "base"] and mix.features["action"].shape == (32,)
    anchors, robots = set(), set()
    for batch in loader:
        assert tuple(batch.data["action"].shape[1:]) == (32,) == tuple(batch.data["action_dim_mask"].shape[1:])
        widths = batch.data["action_dim_mask"].sum(1).unique().tolist()
        assert set(widths) <= {7, 14, 2}
        robots.update(batch.metadata["embodiment"].tolist())
        anchors.update(zip(batch.metadata["episode"].tolist(), batch.metadata["start_step"].tolist()))
    assert robots == {0, 1, 2}
    first = dict(zip(mix.dataset_names, np.concatenate([[0], np.cumsum([len(s) for s in mix.sources])])))
    filtered = 0
    for name, episodes in IDLE_RANGES.items():
        for episode, ranges in episodes.items():
            kept = {s for a, b in ranges for s in range(a, b)}
            steps = {s for e, s in anchors if e == first[name] + int(episode)}
            assert steps <= kept, (name, episode, sorted(steps - kept))
            filtered += bool(steps)
    assert filtered  # the filtered episodes were drawn, at kept steps only


def check_records(ns):
    batches = list(ns["DataLoader"](ns["dataset"]))
    assert sum(len(b.data["text"]) for b in batches) == 700 + 3000 + 120 + 4000
    for b in batches:  # position ids restart at 0 where a document starts, and only there
        ids, positions = b.document_ids, b.position_ids
        assert tuple(positions.shape) == (2, 4096)
        start = torch.ones_like(ids, dtype=torch.bool)
        start[:, 1:] = ids[:, 1:] != ids[:, :-1]
        real = ids >= 0
        assert (positions[start & real] == 0).all() and (positions[~start & real] > 0).all()
    assert tuple(ns["positions"].shape) == (2, 4096)


CHECKS = {  # the start of a line of one block -> what the block promises
    "plan = pack(": check_packing,
    "frames = read_frames(": check_frames,
    'ds = open_dataset("shards/")': check_datasets,
    'ds = open_dataset("lerobot/", frame_size=': check_cache,
    'gpu_ds = open_dataset("lerobot/", device="cuda")': check_gpu_decode,
    "windows = ds.windows(window)": check_windows,
    "print(loader.timer.summary())": check_packed,
    "report = timer.report()": check_timer,
    "def shift_and_normalize(": check_transform,
    "augment = DeviceCompose(": check_device_transform,
    "with ShardWriter(": check_shards,
    "both = WindowSpec.from_delta_timestamps(": check_mixture,
    "robots = WindowSpec.from_delta_timestamps(": check_robots,
    "dataset = PlannedDataset.records(": check_records,
}


def run_python(blocks: list[Block], root: Path, checks: dict | None = None) -> list[Block]:
    """Run the python blocks in order, each followed by the check of what it promises (``CHECKS``); returns the
    blocks skipped."""
    checks = CHECKS if checks is None else checks
    carried: dict = {}
    skipped, checked = [], set()
    gpu = gpu_decodes()
    for block in blocks:
        if block.skip and not gpu:
            # not run, but what it uses must exist by then (its imports, or data of the blocks before it)
            missing = free_names(block.code) - set(carried)
            assert not missing, f"README.md:{block.line}: the block uses {sorted(missing)} before they are defined"
            skipped.append(block)
            checked.update(k for k in checks if any(line.startswith(k) for line in block.code.splitlines()))
            continue
        ns = {"__name__": "__readme__", **carried}
        code = compile("\n" * (block.line - 1) + block.code, str(README), "exec")
        t0 = time.perf_counter()
        exec(code, ns)
        print(f"README.md:{block.line}: {time.perf_counter() - t0:.2f} s")
        for start, check in checks.items():
            if any(line.startswith(start) for line in block.code.splitlines()):
                assert start not in checked, f"{start!r} starts a line of two blocks; make it name one"
                check(*(ns, root)[: check.__code__.co_argcount])
                checked.add(start)
        imported = imported_names(block.code)  # the next block sees the data, not the imports
        carried = {k: v for k, v in ns.items() if not k.startswith("__") and k not in imported
                   and not isinstance(v, types.ModuleType)}
    assert checked == set(checks), f"checks that matched no block: {sorted(set(checks) - checked)}"
    return skipped


@pytest.mark.slow  # about 10 s on 2 cores: an epoch of each of the README's loaders, four with worker processes
def test_readme_python_blocks_run_in_order(readme_dir, monkeypatch):
    """Every python block of the README, in order, in one process (see the module docstring)."""
    monkeypatch.chdir(readme_dir)
    monkeypatch.setenv("MMFEED_CACHE", str(readme_dir / ".mmfeed-cache"))
    # what torchrun sets for one process: the DDP block's init_process_group reads it
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1",
                       "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    blocks = [b for b in readme_blocks(README.read_text(encoding="utf-8")) if b.lang == "python"]
    marked = [b for b in blocks if b.skip]
    assert len(marked) == MARKED["python"], [(b.line, b.skip) for b in marked]
    try:
        skipped = run_python(blocks, readme_dir)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    assert skipped == ([] if gpu_decodes() else marked)


def gpu_decodes() -> bool:
    """Whether the GPU-decode block can run here: CUDA (it decodes through PyAV's bundled FFmpeg)."""
    from mmfeed.codecs._nvdec import pyav_cuda_error

    return pyav_cuda_error("cuda") is None


def test_a_block_without_its_imports_fails_and_skips_are_marked(tmp_path):
    """The harness itself: a name an earlier block imported is not seen by a later one (a variable it made is),
    and a variable used before any block defines it fails."""
    blocks = readme_blocks("```python\nimport json\nx = json.dumps(1)\n```\n\n```python\ny = x + '2'\n```\n\n"
                           "```python\njson.dumps(y)\n```\n")
    with pytest.raises(NameError, match="'json' is not defined"):
        run_python(blocks, tmp_path, checks={})
    marked = readme_blocks("<!-- readme-test: skip: needs a GPU -->\n```python\nz = window\n```\n\n"
                           "```python\nwindow = 1\n```\n")
    assert [b.skip for b in marked] == ["needs a GPU", None]
    with pytest.raises((AssertionError, NameError), match="window"):  # skipped or not, it comes too early
        run_python(marked, tmp_path, checks={})
    with pytest.raises(NameError, match="'w' is not defined"):
        run_python(readme_blocks("```python\nv = w\n```\n```python\nw = 1\n```\n"), tmp_path, checks={})


# --------------------------------------------------------------------------------------------------- commands


def test_readme_bash_blocks_run(tmp_path, monkeypatch, capsys):
    """Each bash block: the ``pip install`` parts (CI installs the package in a fresh venv), then ``mmfeed bench``,
    run here with BENCH_SMOKE added, or the test command, which must be the one .ci/run runs."""
    from importlib.metadata import entry_points

    from mmfeed.cli import main

    monkeypatch.setenv("MMFEED_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    blocks = [b for b in readme_blocks(README.read_text(encoding="utf-8")) if b.lang == "bash"]
    assert sum(bool(b.skip) for b in blocks) == MARKED["bash"]
    ran = []
    for block in blocks:
        for line in block.code.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = [shlex.split(p) for p in line.split("&&")]
            while parts and parts[0][:2] == ["pip", "install"]:
                parts.pop(0)
            for argv in parts:
                if argv[0] == "mmfeed":
                    script = [e.value for e in entry_points(group="console_scripts") if e.name == "mmfeed"]
                    assert script == ["mmfeed.cli:main"]
                    assert main([*argv[1:], *BENCH_SMOKE]) == 0
                    out = capsys.readouterr().out
                    assert "useful tokens/s" in out and "bottleneck:" in out, out[-2000:]
                elif argv[:3] == ["python", "-m", "pytest"]:
                    ci = [shlex.split(x, comments=True) for x in (ROOT / ".ci" / "run").read_text().splitlines()]
                    assert any(c[-len(argv):][1:] == argv[1:] and c[-len(argv)] in ("python", "python3") for c in ci
                               if len(c) >= len(argv)), f"{' '.join(argv)} is not a command of .ci/run"
                else:
                    pytest.fail(f"README.md:{block.line}: {' '.join(argv)}: the test does not know how to run it")
                ran.append(argv[0] if argv[0] == "mmfeed" else "pytest")
    assert ran == ["mmfeed", "pytest"]


PLACEHOLDERS = {"PATH": "shards", "DIR": "frames", "SRC": "shards", "DST": "converted", "FILE": "out.json",
                "BASE.json": "base.json", "NEW.json": "new.json", "N": "2", "VENV/bin/python": "python3"}


def inline_commands(text: str) -> list[tuple[str, list[str]]]:
    """``(paragraph, span)`` of every span in backticks that runs mmfeed or python -m, or is a ``--flag``, in
    order: the prose (fenced blocks left out) by paragraph, then the comments of the code blocks."""
    prose = FENCE.sub("\n\n", text)
    comments = [line.split("#", 1)[1] for m in FENCE.finditer(text) for line in m.group(2).splitlines()
                if "#" in line]
    out = []
    for k, paragraph in enumerate([*re.split(r"\n\s*\n", prose), *comments]):
        for m in re.finditer(r"`([^`]+)`", paragraph):
            span = " ".join(m.group(1).split())
            if span.startswith(("mmfeed ", "python -m ", "--")):
                out.append((k, span))
    return out


def variants(span: str) -> list[list[str]]:
    """The command lines a span stands for: ``a|b`` alternatives and ``[optional]`` parts spelled out,
    placeholders replaced (``PATH...`` and ``...``: two datasets)."""
    optional = re.search(r"\[([^\]]+)\]", span)
    if optional:
        return [*variants(span[: optional.start()] + span[optional.end():]),
                *variants(span[: optional.start()] + optional.group(1) + span[optional.end():])]
    lines = [[]]
    for token in span.split():
        if token in ("PATH...", "..."):
            choices = ["shards lerobot"]
        elif "|" in token and not token.startswith("-"):
            choices = token.split("|")
        else:
            choices = [PLACEHOLDERS.get(token, token)]
        lines = [[*line, *c.split()] for line in lines for c in choices]
    return lines


def options_of(argv: list[str]) -> tuple[dict, str]:
    """The option strings a command takes ({flag: argparse action}) and its help text (a named benchmark or a
    ``python -m`` module: the help its main prints)."""
    from mmfeed.cli import NAMED_BENCHMARKS, build_parser

    if argv[0] == "python":
        module = argv[2]
    elif argv[1:2] == ["bench"] and argv[2:3] and argv[2] in NAMED_BENCHMARKS:
        module = NAMED_BENCHMARKS[argv[2]][0]
    else:
        parser = build_parser()
        sub = next(a for a in parser._actions if a.dest == "command").choices[argv[1]]
        return sub._option_string_actions, sub.format_help()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        importlib.import_module(module).main(["--help"])
    assert done.value.code == 0
    return {flag: None for flag in re.findall(r"(?<![\w-])(--[\w-]+)", out.getvalue())}, out.getvalue()


def check_command(argv: list[str], where: str) -> None:
    from mmfeed.cli import NAMED_BENCHMARKS, build_parser

    if argv[0] == "python":
        if argv[2] == "pytest":  # a marker given with -m is one pyproject.toml registers
            marks = [argv[i + 1] for i, a in enumerate(argv[3:], 3) if a == "-m"]
            text = (ROOT / "pyproject.toml").read_text()
            assert all(re.search(rf'^\s*"{m}:', text, re.M) for m in marks), (where, marks)
            return
        assert importlib.util.find_spec(argv[2]) is not None, (where, argv)
        flags, _ = options_of(argv)
        assert all(a in flags for a in argv[3:] if a.startswith("--")), (where, argv, sorted(flags))
        return
    if argv[1:2] == ["bench"] and argv[2:3] and argv[2] in NAMED_BENCHMARKS:
        flags, _ = options_of(argv)
        assert all(a in flags for a in argv[3:] if a.startswith("--")), (where, argv, sorted(flags))
        return
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    if argv[1:] == ["--help"]:
        return
    assert argv[1] in commands, (where, argv[1], sorted(commands))
    if len(argv) == 2:  # the command's name alone
        return
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(argv[1:])
    except SystemExit:
        pytest.fail(f"{where}: `{' '.join(argv)}` does not parse: {err.getvalue().strip()}")


def check_flag(span: str, command: list[str], where: str) -> None:
    """A ``--flag [value]`` span: an option of the command the paragraph last named, a value with ``a|b``
    alternatives each one of its choices."""
    flags, _ = options_of(command)
    flag, *value = span.split()
    assert flag in flags, f"{where}: `{span}` is not an option of `{' '.join(command)}`"
    action = flags[flag]
    if value and action is not None and action.choices is not None and "|" in value[0]:
        assert set(value[0].split("|")) <= set(action.choices), (where, span, action.choices)


def test_readme_inline_commands_parse(tmp_path, monkeypatch):
    """Every `mmfeed ...` and `python -m ...` in backticks parses (placeholders replaced), and every `--flag` in
    backticks is an option of the command last named in its paragraph (of each, where the span offers several)."""
    monkeypatch.chdir(tmp_path)
    spans = inline_commands(README.read_text(encoding="utf-8"))
    named, paragraph, checked = [], None, 0
    for k, span in spans:
        if k != paragraph:
            paragraph, named = k, []
        if span.startswith("--"):
            assert named, f"`{span}` follows no command in its paragraph: say which command it belongs to"
            for command in named:
                check_flag(span, command, span)
        else:
            named = variants(span)
            for argv in named:
                check_command(argv, span)
        checked += 1
    assert checked >= 40 and sum(s.startswith("mmfeed ") for _, s in spans) >= 20
