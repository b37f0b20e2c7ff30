"""mmfeed's LeRobot windows against LeRobot's rule: the comparison logic always, real LeRobot when a venv has it.

Both sides name features alike: the ``delta_timestamps`` LeRobot gets are the window mmfeed reads. Set
``MMFEED_LEROBOT_PYTHON=/path/to/venv/bin/python`` (a venv with ``lerobot`` installed) to run the real comparison;
otherwise that test skips and says why.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from mmfeed.bench.common import child_pids
from mmfeed.bench.lerobot_compare import (CHILD_SCRIPT, check_small, compare_samples, default_window,
                                          delta_timestamps, edge_indices, ground_truth, limit_samples,
                                          load_window, main, mmfeed_loader, mmfeed_samples, parse_args,
                                          profile_mmfeed, sampling, time_mmfeed, torch_loader)
from mmfeed.bench.limit import LimitPool
from mmfeed.bench.loader import LoaderBench
from mmfeed.loaders import WindowSpec
from mmfeed.loaders.formats.lerobot.source import LeRobotSource
from mmfeed.testing import make_episodes, write_lerobot

FPS = 30.0
CAM = "observation.images.cam_high"
DELTA = {CAM: [-2 / FPS, 0.0], "observation.state": [-1 / FPS, 0.0], "action": [i / FPS for i in range(6)]}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Three short single-camera episodes: windows reach past both ends of every episode."""
    episodes = make_episodes(3, seed=3, cameras=("cam_high",), min_length=5, max_length=9, height=48, width=64)
    root = write_lerobot(tmp_path_factory.mktemp("lerobot") / "ds", episodes)
    indices = np.arange(sum(ep.length for ep in episodes))
    return episodes, root, DELTA, indices


def test_delta_timestamps_are_the_window_under_the_datasets_own_names(small):
    """The delta_timestamps given to LeRobot and the window mmfeed reads are one mapping: same feature names,
    same seconds, and every name is a feature of the LeRobot directory as LeRobot wrote it (no translation)."""
    _, root, delta, _ = small
    spec = WindowSpec.from_delta_timestamps(delta)
    assert delta_timestamps(spec) == delta
    assert WindowSpec.from_delta_timestamps(delta_timestamps(spec)) == spec
    bench = LoaderBench(format="lerobot", history=2, horizon=50).window()
    assert delta_timestamps(bench)[CAM] == [-1 / FPS, 0.0] and len(delta_timestamps(bench)["action"]) == 50
    assert set(bench.features) <= set(LeRobotSource(root).features)


def test_edge_indices_cover_every_episode_edge():
    """Every episode's first and last sample (and those a window can clamp at) are picked, all within range."""
    bounds = np.array([0, 5, 12, 20])
    picks = edge_indices(bounds, (-2, 3), extra=4, seed=0)
    assert set(bounds[:-1]) <= set(picks) and set(bounds[1:] - 1) <= set(picks)
    assert {1, 2, 8, 9, 10} <= set(picks)  # two steps of history after a start, three of future before an end
    assert picks.min() >= 0 and picks.max() < 20 and np.all(np.diff(picks) > 0)


def test_mmfeed_reads_equal_lerobots_rule_on_its_own_directory(small):
    """On every sample, mmfeed's clamped reads and pad flags equal LeRobot's rule computed from the episodes."""
    episodes, root, delta, indices = small
    truth = ground_truth(episodes, delta, indices, FPS)
    ours = mmfeed_samples(root, delta, indices)
    report = compare_samples(truth, ours, list(delta))
    assert report["ok"], report["problems"]
    assert set(report["keys"]) >= {CAM, "observation.state", "action", f"{CAM}_is_pad", "episode_index"}
    assert truth["action_is_pad"][-1].tolist() == [False] + [True] * 5  # the last step: only the anchor is real
    assert truth[f"{CAM}_is_pad"][0].tolist() == [True, False]


def test_any_feature_is_compared_under_its_own_name(small):
    """A feature beyond state and action (the reward, a scalar per step) is read and compared like the others."""
    episodes, root, _, indices = small
    delta = {"next.reward": [-1 / FPS, 0.0, 1 / FPS]}
    truth = ground_truth(episodes, delta, indices, FPS)
    ours = mmfeed_samples(root, delta, indices)
    report = compare_samples(truth, ours, list(delta))
    assert report["ok"], report["problems"]
    assert ours["next.reward"].shape == (len(indices), 3) and report["keys"]["next.reward"]["equal"]


def test_comparison_catches_a_flag_a_frame_and_one_ulp(small):
    """A flipped pad flag, a frame from the wrong step and a state one ulp off are each reported by key."""
    episodes, root, delta, indices = small
    truth = ground_truth(episodes, delta, indices, FPS)
    cases = {
        "action_is_pad": lambda d: d["action_is_pad"].__setitem__((0, 0), True),
        CAM: lambda d: d[CAM].__setitem__((3, 1), d[CAM][4, 1]),
        "observation.state": lambda d: d["observation.state"].__setitem__(
            (2, 1, 0), np.nextafter(d["observation.state"][2, 1, 0], np.float32(10))),
    }
    for key, spoil in cases.items():
        bad = {k: v.copy() for k, v in truth.items()}
        spoil(bad)
        report = compare_samples(truth, bad, list(delta))
        assert not report["ok"]
        assert [p.split(":")[0] for p in report["problems"]] == [key]


def test_comparison_reports_a_missing_key_and_a_shape_change(small):
    """A key absent on one side, or a window of another length, is a problem, never a silent pass."""
    episodes, root, delta, indices = small
    truth = ground_truth(episodes, delta, indices, FPS)
    bad = {k: v for k, v in truth.items() if k != "observation.state_is_pad"}
    bad["action"] = truth["action"][:, :5]
    problems = compare_samples(truth, bad, list(delta))["problems"]
    assert any(p.startswith("action: shape") for p in problems)
    assert any(p.startswith("observation.state_is_pad: missing") for p in problems)


def test_real_lerobot_returns_what_mmfeed_returns(lerobot_python):
    """Real LeRobotDataset (torchcodec) and mmfeed agree on every sample of a two-camera directory: frames
    (same pattern index, pixels), state, action, reward, every *_is_pad flag, episode and frame index, and task
    text, with the same feature names on both sides."""
    backend = os.environ.get("MMFEED_LEROBOT_BACKEND", "torchcodec")
    result = check_small(lerobot_python, video_backend=backend, lib_dirs=[])
    assert result["lerobot_vs_mmfeed"]["ok"], result["lerobot_vs_mmfeed"]["problems"]
    assert result["truth_vs_lerobot"]["ok"], result["truth_vs_lerobot"]["problems"]
    assert result["tasks_equal"]
    assert result["child"]["num_samples"] == result["samples"]


# ------------------------------------------------------------------ --root, the window and equal sampling


@pytest.fixture(scope="module")
def two_cams(tmp_path_factory):
    """Four two-camera AV1 episodes (GOP 2, as the benchmark writes them), long enough for batches of 32."""
    episodes = make_episodes(4, seed=5, cameras=("cam_high", "cam_wrist"), min_length=60, max_length=80, height=48,
                             width=64)
    root = write_lerobot(tmp_path_factory.mktemp("lerobot2") / "ds", episodes, codec="av1", gop=2)
    return episodes, root


def test_the_planned_batches_are_what_a_fresh_loader_delivers(two_cams):
    """The batches the limit decodes before a stretch (planned_batches: from the plan, no loader run) are the
    ones a fresh loader then delivers after its warmup, into the next epoch too."""
    from itertools import islice

    from mmfeed.bench.common import forever
    from mmfeed.bench.lerobot_compare import planned_batches

    _, root = two_cams
    delta = default_window(root)
    loader = mmfeed_loader(root, delta, batch_size=8, num_workers=0)
    per_epoch = loader.dataset.num_steps(0)
    got = [b.metadata["sample"].numpy() for b in islice(forever(loader), 2 + per_epoch + 3)][2:]
    planned = planned_batches(mmfeed_loader(root, delta, batch_size=8, num_workers=0).dataset, 2, per_epoch + 3)
    assert len(planned) == len(got) == per_epoch + 3
    assert all(np.array_equal(a, b) for a, b in zip(got, planned))
    assert not all(np.array_equal(a, b) for a, b in zip(got[:3], got[per_epoch:]))  # epoch 1 is its own plan


def test_the_window_is_every_camera_the_state_and_a_50_step_chunk(two_cams):
    """Built from the directory's own features: both cameras with two frames, the state at the anchor and 50
    action steps, nothing else (no reward, no velocity, no index column)."""
    _, root = two_cams
    assert default_window(root) == {"observation.images.cam_high": [-1 / FPS, 0.0],
                                    "observation.images.cam_wrist": [-1 / FPS, 0.0], "observation.state": [0.0],
                                    "action": [i / FPS for i in range(50)]}
    assert len(default_window(root, history=3, horizon=4)["observation.images.cam_wrist"]) == 3


def test_delta_json_replaces_the_window_and_names_are_checked(two_cams, tmp_path):
    _, root = two_cams
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"observation.images.cam_wrist": [0.0], "next.reward": [-1 / FPS, 0]}))
    assert load_window(root, good) == {"observation.images.cam_wrist": [0.0], "next.reward": [-1 / FPS, 0.0]}
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"observation.images.cam_top": [0.0]}))
    with pytest.raises(ValueError, match="cam_top"):
        load_window(root, unknown)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"action": []}))
    with pytest.raises(ValueError, match="feature"):
        load_window(root, empty)


def test_arguments(two_cams, tmp_path):
    """Defaults are the issue's (2 workers, batches of 32, the synthetic directory); a missing python, a folder
    that is no LeRobot directory, a missing window file and a batch size of 0 are usage errors."""
    _, root = two_cams
    args = parse_args(["--lerobot-python", sys.executable])
    assert (args.root, args.workers, args.batch_size, args.delta_json, args.repeats) == (None, 2, 32, None, 3)
    window = tmp_path / "w.json"
    window.write_text("{}")
    args = parse_args(["--lerobot-python", sys.executable, "--root", str(root), "--workers", "3", "--batch-size",
                       "16", "--delta-json", str(window), "--json", str(tmp_path / "o.json")])
    assert (args.root, args.workers, args.batch_size, args.delta_json) == (str(root), 3, 16, str(window))
    for bad in (["--lerobot-python", str(tmp_path / "nope")],
                ["--lerobot-python", sys.executable, "--root", str(tmp_path)],
                ["--lerobot-python", sys.executable, "--delta-json", str(tmp_path / "nope.json")],
                ["--lerobot-python", sys.executable, "--batch-size", "0"]):
        with pytest.raises(SystemExit) as err:
            parse_args(bad)
        assert err.value.code == 2


def test_both_sides_sample_alike(two_cams):
    """LeRobot's loader (the function the child runs, copied into its script) and mmfeed's are built from one
    :func:`sampling`: batch size, workers, a global shuffle; mmfeed's plan is fixed-size batches with no episode
    blocks, and an epoch of it is batches of exactly 32 distinct windows drawn from across the episodes."""
    episodes, root = two_cams
    same = sampling(32, 2, 0)
    theirs = torch_loader(list(range(100)), batch_size=same["batch_size"], num_workers=same["num_workers"],
                          seed=same["seed"])
    assert isinstance(theirs.sampler, torch.utils.data.RandomSampler)
    assert (theirs.batch_size, theirs.num_workers, theirs.persistent_workers) == (32, 2, True)
    assert inspect.getsource(torch_loader) in CHILD_SCRIPT and "torch_loader(ds, batch_size=" in CHILD_SCRIPT
    ours = mmfeed_loader(root, default_window(root), batch_size=same["batch_size"], num_workers=same["num_workers"],
                         seed=same["seed"])
    plan = ours.dataset.config
    assert (plan.mode, plan.batch_size, plan.episode_block, plan.shuffle, ours.num_workers) == ("fixed", 32, 0, True, 2)
    windows = sum(ep.length for ep in episodes)
    epoch = mmfeed_loader(root, default_window(root), batch_size=32, num_workers=0)
    batches = [(b.metadata["sample"].numpy(), b.metadata["episode"].numpy(), b.num_documents) for b in epoch]
    assert [n for _, _, n in batches] == [32] * (windows // 32)
    samples = np.concatenate([s for s, _, _ in batches])
    assert len(np.unique(samples)) == len(samples) and samples.max() < windows
    assert not np.all(np.diff(samples) > 0)  # shuffled
    assert min(len(np.unique(e)) for _, e, _ in batches) >= 3  # no episode blocks: every batch spans episodes


@pytest.mark.slow  # a timed loader stretch
def test_mmfeed_stretch_counts_samples_and_its_workers_cpu(two_cams):
    """A timed stretch of mmfeed's loader: 4 batches of 32 samples, CPU seconds of both worker processes, and the
    workers are gone afterwards."""
    _, root = two_cams
    others = set(child_pids())  # the test runner's own children, if any
    got = time_mmfeed(root, default_window(root), steps=4, warmup=1, batch_size=32, num_workers=2)
    assert (got["samples"], got["batches"], got["worker_processes"]) == (128, 4, 2)
    assert got["cpu_s_workers"] > 0 and got["cpu_s"] == pytest.approx(got["cpu_s_main"] + got["cpu_s_workers"])
    assert got["cpu_s_per_1000_samples"] == pytest.approx(1000 * got["cpu_s"] / 128)
    assert got["samples_per_s"] == pytest.approx(128 / got["seconds"])
    assert not set(child_pids()) - others


def test_the_limit_decodes_the_batches_mmfeed_delivered(two_cams):
    """A kept stretch's sample ids are the batches mmfeed delivered (32 distinct windows each); the limit decodes
    every other one of them in 2 plain-PyAV processes: samples/s with and without RGB conversion and into shared
    memory, each a rate (which is faster is the benchmark's to measure: on 3 batches of 48x64 frames, noise decides
    it), and no fewer frames decoded than delivered."""
    _, root = two_cams
    delta = default_window(root)
    items = mmfeed_loader(root, delta, batch_size=32, num_workers=0).dataset.items
    with LimitPool(items, 2) as pool:
        got = time_mmfeed(root, delta, steps=6, warmup=1, batch_size=32, num_workers=2, keep=True)
        batches = got["batches"]
        assert len(batches) == 6 and all(len(b) == 32 == len(np.unique(b)) for b in batches)
        assert np.concatenate(batches).max() < len(items)
        limit = limit_samples(pool, batches)
    assert limit["batches"] == 3
    for rate in ("samples_per_s", "raw_samples_per_s", "shared_samples_per_s", "samples_per_cpu_s",
                 "raw_samples_per_cpu_s", "shared_samples_per_cpu_s"):
        assert math.isfinite(limit[rate]) and limit[rate] > 0, (rate, limit[rate])
    assert limit["decoded_per_delivered"] >= 1.0 and limit["seeks_per_batch"] > 0


def test_the_profile_splits_a_batch_into_worker_stages(two_cams):
    """--profile: each worker stage's time per batch (decode and collate among them), shares adding up to one,
    and the CPU of the workers and of the main process per batch."""
    _, root = two_cams
    got = profile_mmfeed(root, default_window(root), steps=3, warmup=1, batch_size=32, num_workers=2)
    assert {"read", "decode", "collate"} <= set(got["stages"])
    assert all(v["ms_per_batch"] > 0 for v in got["stages"].values())
    assert sum(v["share"] for v in got["stages"].values()) == pytest.approx(1.0)
    assert got["worker_cpu_ms_per_batch"] == pytest.approx(1e3 * got["cpu_s_workers"] / 3) and got["samples"] == 96
    frames = 32 * 2 * 48 * 64 * 3  # a batch's two 48x64 frames of each of 32 windows, per camera
    assert got["batch_bytes"] > 2 * frames and got["torch_main_cpu_ms_per_batch"] > 0


def test_the_receive_floor_sends_batches_of_the_tensors_a_real_batch_holds():
    """batch_tensors finds every tensor of a packed batch (payloads, attention, metadata); receive_floor times a
    bare torch loader whose workers send batches of those shapes and dtypes."""
    from mmfeed.bench.common import batch_tensors, receive_floor

    tensors = batch_tensors({"a": torch.zeros(4, 3, dtype=torch.uint8), "b": [torch.ones(2, dtype=torch.int64)],
                             "c": "text", "d": {"e": torch.zeros(1, 5)}})
    assert tensors == [((4, 3), torch.uint8), ((2,), torch.int64), ((1, 5), torch.float32)]
    got = receive_floor(tensors, workers=1, steps=3, warmup=1)
    assert got["bytes"] == 12 + 16 + 20 and got["tensors"] == 3 and got["main_cpu_ms_per_batch"] >= 0


def test_mmfeed_can_deliver_i420_planes_instead_of_rgb(two_cams):
    """--frame-format yuv420: the same sampling, frames as I420 planes [H * 3 // 2, W] (half RGB's bytes)."""
    _, root = two_cams
    loader = mmfeed_loader(root, default_window(root), batch_size=32, num_workers=0, frame_format="yuv420")
    batch = next(iter(loader))
    assert tuple(batch.data["observation.images.cam_high"].shape) == (64, 72, 64) and batch.num_documents == 32


def test_cpu_seconds_of_other_processes_to_well_below_a_tick():
    """A child's CPU time to the nanosecond (the /proc ticks are 10 ms: a 2-batch stretch read 0): it grows while
    the child spins, stands while it waits, and a process that is gone counts 0."""
    from mmfeed.bench.common import cpu_seconds

    spin = ("import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 0.003: pass\n"
            "print('spun', flush=True)\nsys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"spun\n"
        waiting = cpu_seconds([child.pid])
        assert waiting >= 0.003 and waiting % 0.01 != 0  # imports and 3 ms of spinning, not whole ticks
        assert cpu_seconds([child.pid]) == waiting  # blocked on its stdin: its clock stands
    finally:
        child.communicate(b"")
    assert cpu_seconds([child.pid]) == 0.0


def test_the_child_script_is_python_without_mmfeed():
    compile(CHILD_SCRIPT, "<lerobot child>", "exec")
    assert "import mmfeed" not in CHILD_SCRIPT and "from mmfeed" not in CHILD_SCRIPT


def test_pixel_comparison_for_directories_without_the_pattern(small):
    """For any directory (no drawn index), frames are judged by their mean pixel difference."""
    episodes, _, delta, indices = small
    truth = ground_truth(episodes, delta, indices, FPS)
    assert compare_samples(truth, truth, list(delta), frames="pixels")["ok"]
    brighter = {**truth, CAM: np.clip(truth[CAM].astype(np.int16) + 10, 0, 255).astype(np.uint8)}
    report = compare_samples(truth, brighter, list(delta), frames="pixels")
    assert [p.split(":")[0] for p in report["problems"]] == [CAM]
    with pytest.raises(ValueError, match="frames"):
        compare_samples(truth, truth, list(delta), frames="exact")


def test_real_throughput_at_equal_sampling(lerobot_python, two_cams, tmp_path):
    """The command end to end with real LeRobot on a given directory: equal samples, both sides timed at the same
    sampling, figures in the JSON."""
    _, root = two_cams
    out = tmp_path / "out.json"
    window = tmp_path / "window.json"
    window.write_text(json.dumps({"observation.images.cam_wrist": [-1 / FPS, 0.0], "action": [0.0, 1 / FPS]}))
    assert main(["--lerobot-python", lerobot_python, "--root", str(root), "--steps", "2", "--lerobot-steps", "2",
                 "--warmup", "1", "--repeats", "1", "--profile", "--delta-json", str(window), "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["sampling"] == sampling(32, 2, 0) and not got["root"]["synthetic"]
    assert got["root"]["delta_timestamps"] == json.loads(window.read_text())
    assert got["root"]["lerobot_vs_mmfeed"]["ok"] and "index_equal" not in got["root"]["lerobot_vs_mmfeed"]["keys"][
        "observation.images.cam_wrist"]  # a given directory: frames compared by their pixels
    for side in ("lerobot", "mmfeed"):
        (run_,) = got[side]["runs"]
        assert (run_["samples"], run_["worker_processes"]) == (64, 2) and got[side]["cpu_s_per_1000_samples"] > 0
    assert got["ratio_samples_per_s"] == pytest.approx(got["mmfeed"]["samples_per_s"] / got["lerobot"]["samples_per_s"])
    assert got["mmfeed_profile"]["batches"] == 2 and "decode" in got["mmfeed_profile"]["stages"]
    limit = got["limit"]  # one of the stretch's two batches decoded by plain PyAV, right before and right after it
    before, after = limit["runs"][0]["bracket"]
    assert before["batches"] == after["batches"] == 1 and limit["raw_samples_per_s"] > 0 and limit["samples_per_s"] > 0
    assert limit["samples_per_s"] == pytest.approx((before["samples_per_s"] + after["samples_per_s"]) / 2)
    assert got["limit_fraction"] == pytest.approx(got["mmfeed"]["samples_per_s"] / limit["samples_per_s"])
    (ours,), (lim,) = got["mmfeed"]["runs"], limit["runs"]  # per CPU-second: main process and workers counted
    assert got["limit_fraction_cpu"] == pytest.approx(ours["samples"] / ours["cpu_s"] / lim["samples_per_cpu_s"])
    assert got["limit_vs_lerobot"] == pytest.approx(limit["samples_per_s"] / got["lerobot"]["samples_per_s"])
