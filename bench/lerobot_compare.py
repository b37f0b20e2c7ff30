r"""Real LeRobot beside mmfeed on the same LeRobot v3 directory: the same samples, and throughput at equal sampling.

LeRobot lives in its own virtual environment (its torch and torchvision pins differ from mmfeed's), so this
module runs a small child script (:data:`~mmfeed.bench.lerobot_child.CHILD_SCRIPT`, ``bench/lerobot_child.py``)
under that environment's python. The child opens ``LeRobotDataset(repo_id="local/synthetic", root=...,
delta_timestamps=..., video_backend=...)`` fully offline and either dumps the samples at given indices (frames
converted back from LeRobot's float ``[0, 1]`` CHW to uint8 HWC, every array feature, every ``*_is_pad`` flag and
the index columns) as ``.npy`` files, or times its loader.

Both sides read the same features under the same names: the ``delta_timestamps`` LeRobot gets are the window
mmfeed reads (``WindowSpec.from_delta_timestamps``). The parent reads the samples through mmfeed's loader path
(:class:`~mmfeed.loaders.formats.lerobot.source.LeRobotSource` and the window requests of
:class:`~mmfeed.loaders.planned.items.EpisodeItems`; LeRobot's sample ``i`` is the global frame
``dataset_from_index[episode] + anchor``, which is also mmfeed's sample ``i`` with stride 1) and compares them
feature by feature: arrays and pad flags exactly; frames of a synthetic directory by the index pattern drawn into
the pixels, those of any other directory by their mean pixel difference (:func:`compare_samples`).

Throughput, the same sampling on both sides (:func:`sampling`): a global shuffle over all windows, batches of
``batch_size``, ``workers`` persistent worker processes. LeRobot: ``torch.utils.data.DataLoader(LeRobotDataset(...),
batch_size=32, shuffle=True, num_workers=W)`` (:func:`torch_loader`); mmfeed: ``mmfeed.DataLoader(root,
packing=Packing(window=..., plan=PlanConfig(mode="fixed", batch_size=32)), num_workers=W)`` (:func:`mmfeed_loader`:
32 windows per batch in a global shuffle, padded, no episode blocks). Each side is timed over a stretch of batches
after a warm-up, with the CPU seconds of its process and its workers over that stretch (their CPU-time clocks), repeats
interleaved (LeRobot, mmfeed, LeRobot, ...), each repeat a fresh loader::

    python -m mmfeed.bench.lerobot_compare --lerobot-python /work/lerobot-venv/bin/python [--root DIR] \
        [--workers 2] [--batch-size 32] [--delta-json FILE] [--profile] [--json out.json]

The physical limit is measured in the same run (unless ``--no-limit``): right before and right after each mmfeed
stretch, every other batch the stretch delivers (every round's fresh loader delivers the same ones, the plan's) is
decoded again by plain PyAV in as many processes as the loaders have workers, one decoder thread each, videos kept
open, nothing but seeking, decoding and (for RGB) colour conversion (:func:`limit_samples`, ``bench/limit.py``);
the round's limit is the mean of the two, so a drift of the machine's speed during the round
cancels to first order. It reports mmfeed's fraction of that limit (``limit_fraction``, per
second; ``limit_fraction_cpu``, per CPU-second: mmfeed's samples per CPU-second of its main process and workers over
the limit's per CPU-second of its processes, which counts the main process's share of the cores and is disturbed
less by other work on the machine) and the limit / LeRobot: the most any loader could gain over LeRobot on these
processes while it decodes what the samples need.

``--profile`` adds one timed mmfeed stretch with the loader's timer: worker time per batch in read, decode and
collate, the loop's wait, and the CPU of the workers and of the main process per batch (:func:`profile_mmfeed`).

The window (:func:`default_window`): every camera of the directory with two frames ``[-1/fps, 0]``,
``observation.state`` at ``[0]`` and a 50-step ``action`` chunk ``[i/fps for i in range(50)]`` where present;
``--delta-json`` gives another ``{feature: [seconds]}``. Without ``--root`` a synthetic AV1 directory is written
once and cached (:data:`SYNTHETIC`: 20 episodes of 200 steps, two 240x320 cameras, GOP 2).

FFmpeg libraries for torchcodec: ``<venv>/ffmpeg-links`` (PyAV's bundled FFmpeg under the standard sonames, see
below) and any ``<venv>/ffmpeg/usr/lib/<triplet>`` (Debian packages unpacked there with ``dpkg -x``) are put on
the child's ``LD_LIBRARY_PATH``; ``--lib-dir`` adds more. A venv that works beside the system torch 2.13 CPU and
PyAV 18 (lerobot 0.4.4 pins torch<2.11, torchvision<0.26 and torchcodec<0.11, so those are installed without
dependencies; torchcodec 0.13 is built for torch 2.13 and loads FFmpeg 4 to 8)::

    python3 -m venv --system-site-packages /work/lerobot-venv && V=/work/lerobot-venv/bin
    SP=/work/lerobot-venv/lib/python3.11/site-packages
    printf 'torch==2.13.0\ntorchvision==0.28.0\n' > /work/lerobot-venv/constraints.txt
    $V/pip install --no-deps lerobot==0.4.4 torchvision==0.28.0
    $V/pip install --no-deps --ignore-installed torchcodec==0.13.0
    $V/pip install -c /work/lerobot-venv/constraints.txt "datasets>=4,<5" "huggingface-hub>=0.34.2,<0.36" \
        "packaging>=24.2,<26" jsonlines draccus==0.10.0 "einops>=0.8,<0.9" "termcolor>=2.4,<4" "accelerate>=1.10,<2"
    # PyPI's torchvision 0.28.0 is the CUDA build: its _C.so needs libtorch_cuda, which CPU torch lacks, and its
    # register_fake("torchvision::nms") then fails the import; LeRobot needs no torchvision op, so skip those two
    G='torch.library.register_fake if torchvision.extension._has_ops() else (lambda *a, **k: (lambda f: f))'
    sed -i "s/^@torch\.library\.register_fake(/@($G)(/" $SP/torchvision/_meta_registrations.py
    # FFmpeg 8 for torchcodec: PyAV's av.libs under their own (mangled) names, which their $ORIGIN run paths need,
    # and under the sonames libtorchcodec_core8.so asks for (libavcodec.so.62, ...)
    AVLIBS=$(python3 -c 'import av, os; print(os.path.join(os.path.dirname(av.__file__), os.pardir, "av.libs"))')
    mkdir -p /work/lerobot-venv/ffmpeg-links && cd /work/lerobot-venv/ffmpeg-links
    for f in "$AVLIBS"/*; do b=$(basename "$f"); ln -sf "$f" "$b"; case $b in libav*|libsw*)
        ln -sf "$f" "${b%%-*}.so.$(echo "$b" | sed -E 's/.*[.]so[.]([0-9]+).*/\1/')";; esac; done

LeRobot's ``video_backend="pyav"`` needs ``torchvision.io.VideoReader``, which torchvision 0.28 no longer has
(nor 0.29); use torchcodec. PyAV stays the system's 18 (lerobot pins av<16; with torchcodec it reads no video
through PyAV).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmfeed.bench.common import batch_tensors, bracket, child_pids, forever, receive_floor, spread
from mmfeed.bench.lerobot_child import CHILD_SCRIPT, lerobot_child, run_child, timed_stretch, torch_loader
from mmfeed.inspection import robot_window
from mmfeed.testing.video import read_index

__all__ = ["CHILD_SCRIPT", "SYNTHETIC", "check_small", "compare_samples", "compare_throughput", "default_window",
           "delta_timestamps", "edge_indices", "ground_truth", "lerobot_child", "load_window", "main",
           "mmfeed_loader", "mmfeed_samples", "parse_args", "profile_mmfeed", "run", "run_child", "sampling",
           "synthetic_root", "time_mmfeed", "timed_stretch", "torch_loader"]

log = logging.getLogger(__name__)


def sampling(batch_size: int = 32, num_workers: int = 2, seed: int = 0) -> dict[str, Any]:
    """The sampling both sides run: a global shuffle over all windows (seeded), ``batch_size`` windows a batch,
    ``num_workers`` persistent worker processes."""
    return {"shuffle": "global", "batch_size": int(batch_size), "num_workers": int(num_workers),
            "persistent_workers": num_workers > 0, "seed": int(seed)}


def delta_timestamps(spec) -> dict[str, list[float]]:
    """LeRobot's ``delta_timestamps`` for a :class:`~mmfeed.loaders.WindowSpec`: the same feature names, the same
    seconds (the inverse of ``WindowSpec.from_delta_timestamps``)."""
    return {feature: [float(t) for t in seconds] for feature, seconds in spec.deltas.items()}


def edge_indices(bounds: np.ndarray, span: tuple[int, int], *, extra: int = 0, seed: int = 0) -> np.ndarray:
    """Global sample indices near every episode's edges (where clamping happens), plus ``extra`` random ones.

    bounds: ``[E + 1]`` cumulative episode starts (``dataset_from_index`` then the total).
    span: the window's (lowest, highest) offset; indices within that many steps of an edge are taken.
    """
    bounds = np.asarray(bounds, dtype=np.int64)
    lo, hi = min(span[0], 0), max(span[1], 0)
    picks = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        near = np.concatenate([np.arange(start, min(stop, start - lo + 2)), np.arange(max(start, stop - hi - 2), stop)])
        picks.append(near)
    picks = np.unique(np.concatenate(picks)) if picks else np.zeros(0, np.int64)
    if extra and bounds[-1]:
        rng = np.random.default_rng(seed)
        picks = np.union1d(picks, rng.integers(0, bounds[-1], size=extra))
    return picks.astype(np.int64)


def mmfeed_samples(root: str | os.PathLike, delta_timestamps: Mapping[str, Sequence[float]], indices: Sequence[int],
                   *, backend: str = "auto") -> dict[str, np.ndarray]:
    """mmfeed's reads of LeRobot samples ``indices``, stacked per feature (frames uint8 HWC), with every
    ``<feature>_is_pad``.

    Goes through the loader's own path: ``WindowSpec.from_delta_timestamps``, the window requests of
    :class:`~mmfeed.loaders.planned.items.EpisodeItems` (each feature at its own rate, clamping and ``is_pad``) and
    ``LeRobotSource.read_many``. Also returns ``episode_index`` and ``frame_index`` (the anchor) so they can be
    checked against LeRobot's columns.
    """
    from mmfeed.loaders import TokenLayout, WindowSpec
    from mmfeed.loaders.planned.items import EpisodeItems
    from mmfeed.loaders.formats.lerobot.source import LeRobotSource

    source = LeRobotSource(root, backend=backend)
    window = WindowSpec.from_delta_timestamps(delta_timestamps)
    layout = TokenLayout(tokens_per_frame={f: 1 for f in window.features if source.features[f].kind == "video"})
    items = EpisodeItems(source, layout=layout, window=window)
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size and (indices.min() < 0 or indices.max() >= len(items)):
        raise ValueError(f"sample indices must lie in [0, {len(items)}), got {indices.min()}..{indices.max()}")
    asked = items.requests(indices)
    reads = source.read_many([read.request for read in asked])
    episode, start = items.table.locate(indices)
    out: dict[str, np.ndarray] = {"episode_index": episode, "frame_index": start}
    for name in window.features:
        out[name] = np.stack([got[name] for got in reads])
        out[f"{name}_is_pad"] = np.stack([read.pads[name] for read in asked])
    return out


def ground_truth(episodes, delta_timestamps: Mapping[str, Sequence[float]], indices: Sequence[int],
                 fps: float) -> dict[str, np.ndarray]:
    """What LeRobot's rule gives for ``indices`` on ``write_lerobot(episodes)``, computed from the episodes.

    LeRobot's rule: query ``clip(i + delta, ep_start, ep_end - 1)``, pad where ``i + delta`` leaves the episode.
    Frames are the pattern frames of the clamped GLOBAL index (what ``write_lerobot`` draws); arrays are the
    episodes' own (:meth:`~mmfeed.testing.SyntheticEpisode.arrays`, the names ``write_lerobot`` writes).
    """
    lengths = np.array([ep.length for ep in episodes], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    indices = np.asarray(indices, dtype=np.int64)
    episode = np.searchsorted(bounds, indices, side="right") - 1
    out: dict[str, np.ndarray] = {"episode_index": episode, "frame_index": indices - bounds[episode]}
    arrays = {int(e): episodes[e].arrays() for e in np.unique(episode)}
    for name, deltas in delta_timestamps.items():
        steps = np.round(np.asarray(deltas, dtype=np.float64) * fps).astype(np.int64)
        raw = indices[:, None] + steps[None, :]
        lo, hi = bounds[episode][:, None], bounds[episode + 1][:, None] - 1
        out[f"{name}_is_pad"] = (raw < lo) | (raw > hi)
        local = np.clip(raw, lo, hi) - lo
        rows = []
        for e, steps_e in zip(episode, local):
            ep = episodes[e]
            cameras = {ep.video_feature(c): c for c in ep.camera_names}
            if name in cameras:
                rows.append(ep.frames(cameras[name], start=int(bounds[e]))[steps_e])
            else:
                rows.append(arrays[int(e)][name][steps_e])
        out[name] = np.stack(rows)
    return out


PIXEL_TOLERANCE = 2.0
"""Largest mean absolute pixel difference of two reads of the same frames (``frames="pixels"``)."""


def compare_samples(expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
                    keys: Sequence[str], *, frames: str = "pattern") -> dict[str, Any]:
    """Compare two sample sets key by key; ``{"ok": bool, "keys": {key: details}, "problems": [str]}``.

    keys: feature names (the same on both sides: ``observation.images.<cam>``, ``observation.state``, ``action``,
    ...); each one's ``<key>_is_pad`` is compared too, and ``episode_index`` / ``frame_index`` where both sides
    have them.
    Non-video arrays must be equal exactly (same shape, bitwise for floats); frames must have the same shape and,
    with ``frames="pattern"`` (synthetic data), show the same pattern index in every frame
    (:func:`mmfeed.testing.read_index`), their pixel differences reported, not judged (two decoders may round
    colour conversion differently); with ``frames="pixels"`` (any other data) differ by at most
    :data:`PIXEL_TOLERANCE` on average.
    """
    if frames not in ("pattern", "pixels"):
        raise ValueError(f"frames must be 'pattern' or 'pixels', got {frames!r}")
    report: dict[str, Any] = {"keys": {}, "problems": []}
    problems = report["problems"]
    names = [*keys, *(f"{k}_is_pad" for k in keys), *(k for k in ("episode_index", "frame_index")
                                                       if k in expected and k in got)]
    for name in names:
        if name not in expected or name not in got:
            problems.append(f"{name}: missing on the {'expected' if name not in expected else 'compared'} side")
            continue
        a, b = np.asarray(expected[name]), np.asarray(got[name])
        if name in ("episode_index", "frame_index") or name.endswith("_is_pad"):
            a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
        if a.shape != b.shape:
            problems.append(f"{name}: shape {a.shape} != {b.shape}")
            continue
        details: dict[str, Any] = {"shape": list(a.shape)}
        if name.startswith("observation.images.") and not name.endswith("_is_pad"):
            diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
            details.update(max_pixel_diff=int(diff.max(initial=0)),
                           mean_pixel_diff=float(diff.mean()) if diff.size else 0.0)
            if frames == "pixels":
                if details["mean_pixel_diff"] > PIXEL_TOLERANCE:
                    problems.append(f"{name}: mean pixel difference {details['mean_pixel_diff']:.2f} > "
                                    f"{PIXEL_TOLERANCE}")
                report["keys"][name] = details
                continue
            flat = a.shape[0] * a.shape[1]
            ia = read_index(a.reshape(flat, *a.shape[2:])).reshape(a.shape[:2])
            ib = read_index(b.reshape(flat, *b.shape[2:])).reshape(b.shape[:2])
            details["index_equal"] = bool(np.array_equal(ia, ib))
            if not details["index_equal"]:
                where = np.argwhere(ia != ib)[:5].tolist()
                problems.append(f"{name}: frame pattern index differs at [sample, step] {where}: "
                                f"{ia[tuple(np.array(where).T)].tolist()} vs {ib[tuple(np.array(where).T)].tolist()}")
        else:
            equal = bool(np.array_equal(a, b))
            details["equal"] = equal
            if a.dtype.kind == "f" or b.dtype.kind == "f":
                details["max_abs_diff"] = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max(initial=0))
            if not equal:
                where = np.argwhere(a != b)[:5].tolist()
                problems.append(f"{name}: values differ at {where}")
        report["keys"][name] = details
    report["ok"] = not problems
    return report




def _print_report(title: str, report: dict[str, Any]) -> None:
    print(f"{title}: {'MATCH' if report['ok'] else 'MISMATCH'}")
    for name, details in report["keys"].items():
        print(f"  {name:42s} {json.dumps(details)}")
    for problem in report["problems"]:
        print(f"  ! {problem}")



def check_small(python: str, *, video_backend: str, lib_dirs: Sequence[str], seed: int = 0) -> dict[str, Any]:
    """Equality on a small two-camera directory with short episodes (clamping at both ends of every window), on
    five features: both cameras, the state, the action chunk and the reward."""
    from mmfeed.testing import make_episodes, write_lerobot

    episodes = make_episodes(4, seed=seed, min_length=6, max_length=14, height=48, width=64)
    step = 1 / 30.0
    delta = {"observation.images.cam_high": [-3 * step, -step, 0.0], "observation.images.cam_wrist": [0.0, 2 * step],
             "observation.state": [-step, 0.0], "action": [i * step for i in range(8)], "next.reward": [-step, 0.0]}
    with tempfile.TemporaryDirectory(prefix="mmfeed-lerobot-small-") as tmp:
        root = write_lerobot(Path(tmp) / "ds", episodes)
        indices = np.arange(sum(ep.length for ep in episodes))  # every sample
        result, theirs = lerobot_child(python, root, delta, indices=indices, video_backend=video_backend,
                                       lib_dirs=lib_dirs)
        ours = mmfeed_samples(root, delta, indices)
    truth = ground_truth(episodes, delta, indices, 30.0)
    return {"samples": len(indices), "lerobot_vs_mmfeed": compare_samples(theirs, ours, list(delta)),
            "truth_vs_lerobot": compare_samples(truth, theirs, list(delta)), "child": result,
            "tasks_equal": result["tasks"] == [episodes[e].task for e in truth["episode_index"]]}




SYNTHETIC = {"episodes": 20, "length": 200, "cameras": ("cam_high", "cam_wrist"), "height": 240, "width": 320,
             "codec": "av1", "gop": 2}
"""The directory written without ``--root`` (``write_lerobot(..., codec="av1", gop=2)``, 30 fps, seed 0)."""


def synthetic_root() -> Path:
    """The :data:`SYNTHETIC` LeRobot directory, written once under mmfeed's bench cache."""
    from mmfeed.bench.loader import LoaderBench, dataset_path

    s = SYNTHETIC
    return dataset_path(LoaderBench(format="lerobot", episodes=s["episodes"], min_length=s["length"],
                                    max_length=s["length"], cameras=s["cameras"], height=s["height"],
                                    width=s["width"], codec=s["codec"], gop=s["gop"]))


def default_window(root: str | os.PathLike, *, history: int = 2, horizon: int = 50) -> dict[str, list[float]]:
    """The compared window of a LeRobot directory, as ``delta_timestamps``: every video feature with ``history``
    frames at its own rate (``[-1/fps, 0]``), ``observation.state`` at ``[0]`` and a ``horizon``-step ``action``
    chunk where the directory has them."""
    from mmfeed.loaders.formats.lerobot.source import LeRobotSource

    source = LeRobotSource(root)
    videos = {f: float(source.rates(f)[0]) for f, feat in source.features.items() if feat.kind == "video"}
    if not videos:
        raise ValueError(f"{root}: no video features to compare (features: {sorted(source.features)})")
    spec = robot_window(videos, fps=float(source.fps[0]), history=history, horizon=horizon,
                        state="observation.state" if "observation.state" in source.features else None,
                        action="action" if "action" in source.features else None)
    return delta_timestamps(spec)


def load_window(root: str | os.PathLike, path: str | os.PathLike) -> dict[str, list[float]]:
    """``--delta-json``: ``{feature: [seconds]}`` from ``path``, every feature one of the directory's."""
    from mmfeed.loaders.formats.lerobot.source import LeRobotSource

    delta = json.loads(Path(path).read_text())
    if not isinstance(delta, dict) or not delta or not all(isinstance(v, list) and v for v in delta.values()):
        raise ValueError(f"{path}: expected a JSON object {{feature: [seconds, ...]}}, got {delta!r}")
    unknown = sorted(set(delta) - set(LeRobotSource(root).features))
    if unknown:
        raise ValueError(f"{path}: {unknown} are no features of {root}")
    return {str(k): [float(t) for t in v] for k, v in delta.items()}


def mmfeed_loader(root: str | os.PathLike, delta: Mapping[str, Sequence[float]], *, batch_size: int = 32,
                  num_workers: int = 2, seed: int = 0, tokens_per_frame: int = 64, backend: str = "auto",
                  frame_format: str = "rgb24", timer: bool = False, cache: str | None = None, reuse: int = 1):
    """mmfeed's side of :func:`sampling`: ``mmfeed.DataLoader(root, packing=Packing(window=...,
    plan=PlanConfig(mode="fixed", batch_size=batch_size)), num_workers=num_workers)`` with persistent workers;
    every video feature priced ``tokens_per_frame`` tokens a frame, its frames ``frame_format`` ("rgb24" as
    LeRobot's, or "yuv420": I420 planes, no colour conversion in the workers); ``cache``: a decoded-frame cache
    directory (``open_dataset(..., cache=)``); ``reuse``: ``PlanConfig(reuse=)``, spans of that many consecutive
    windows of an episode shuffled whole."""
    from mmfeed.loaders import DataLoader, Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset

    source = open_dataset(root, backend=backend, frame_format=frame_format, **({"cache": cache} if cache else {}))
    window = WindowSpec.from_delta_timestamps(delta)
    prices = {f: tokens_per_frame for f in window.features if source.features[f].kind == "video"}
    packing = Packing(layout=TokenLayout(tokens_per_frame=prices), window=window, seed=seed,
                      plan=PlanConfig(mode="fixed", batch_size=batch_size, shuffle=True, episode_block=0,
                                      reuse=reuse))
    return DataLoader(source, packing=packing, num_workers=num_workers, persistent_workers=num_workers > 0,
                      timer=timer or None)


def time_mmfeed(root: str | os.PathLike, delta: Mapping[str, Sequence[float]], *, steps: int, warmup: int = 3,
                timer: bool = False, keep: bool = False, **loader_args: Any) -> dict[str, Any]:
    """:func:`timed_stretch` of a fresh :func:`mmfeed_loader` after ``warmup`` batches; its workers are gone
    when this returns (so the next repeat of either side has the CPUs to itself). ``timer``: also the loader's
    :class:`~mmfeed.loaders.StepTimer` report (worker seconds per batch in read, decode and collate; the loop's
    wait) and the shapes and dtypes of a batch's tensors, for a profile; ``keep``: also the sample ids of each
    timed batch (``"batches"``), for the limit."""
    others = set(child_pids())  # children that are not this loader's workers (a test runner's, say)
    loader = mmfeed_loader(root, delta, timer=timer, **loader_args)
    batches = forever(loader)
    for _ in range(warmup):
        next(batches)
    kept: list[np.ndarray] = []
    tensors: list = []

    def count(batch: Any) -> int:
        if keep:
            kept.append(batch.metadata["sample"].numpy().copy())
        if timer and not tensors:
            tensors.extend(batch_tensors(batch))
        return batch.num_documents

    out = timed_stretch(batches, steps, count, exclude=others)
    if keep:
        out["batches"] = kept
    if timer:
        out["tensors"] = tensors
    if timer:
        out["timer"] = loader.timer.report()
    batches.close()
    del batches, loader
    gc.collect()
    deadline = time.monotonic() + 30.0
    while set(child_pids()) - others and time.monotonic() < deadline:
        time.sleep(0.05)
    return out


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [r["samples_per_s"] for r in runs]
    return {"samples_per_s": statistics.median(rates), "samples_per_s_spread": spread(rates),
            "cpu_s_per_1000_samples": statistics.median(r["cpu_s_per_1000_samples"] for r in runs), "runs": runs}


_LIMIT_RATES = ("samples_per_s", "raw_samples_per_s", "samples_per_cpu_s", "raw_samples_per_cpu_s",
                "shared_samples_per_s", "shared_samples_per_cpu_s")
"""The figures of :func:`limit_samples` a round's bracket averages."""


def limit_samples(limit: Any, batches: Sequence[np.ndarray]) -> dict[str, Any]:
    """The physical limit of a stretch of mmfeed's batches (``LimitPool.measure`` of ``bench/limit.py``: the
    frames the batches deliver, each reached from its keyframe, decoded with plain PyAV in as many processes as
    the loaders have workers, nothing else): samples/s with RGB conversion (``rgb``, what both loaders here
    deliver), without (``raw``) and with it into shared memory (``shared``: a batch's slots there, 4 KB pages),
    and the frames decoded per frame delivered."""
    measured = list(batches[1::2])  # every other batch: half the time
    got = limit.measure(measured, lead=2)  # each process decodes its first two untimed first (warm videos)
    samples = sum(len(b) for b in measured)
    rgb, raw, shared = got["rgb"], got["raw"], got["rgb_shared"]
    return {"samples_per_s": samples / rgb["seconds"], "raw_samples_per_s": samples / raw["seconds"],
            "samples_per_cpu_s": samples / max(rgb["cpu_s"], 1e-9),
            "raw_samples_per_cpu_s": samples / max(raw["cpu_s"], 1e-9),
            "shared_samples_per_s": samples / shared["seconds"],
            "shared_samples_per_cpu_s": samples / max(shared["cpu_s"], 1e-9),
            "decoded_per_delivered": rgb["decoded"] / max(rgb["delivered"], 1),
            "seeks_per_batch": raw["seeks"] / max(raw["batches"], 1), "batches": len(measured),
            "cpu_share": rgb["cpu_s"] / rgb["worker_s"] if rgb["worker_s"] else None}


def planned_batches(dataset: Any, first: int, count: int) -> list[np.ndarray]:
    """The sample ids of batches ``first .. first + count - 1`` a fresh loader of the planned ``dataset`` delivers
    (its epochs' plans one after the other), each as its ``metadata["sample"]`` holds them."""
    out, epoch, step = [], 0, first
    while len(out) < count:
        steps = dataset.num_steps(epoch)
        if step >= steps:
            epoch, step = epoch + 1, step - steps
            if steps == 0:
                raise ValueError("an epoch of the plan has no steps")
            continue
        out.append(np.concatenate(dataset.batch_samples(epoch, step)).astype(np.int64))
        step += 1
    return out


def compare_throughput(python: str, root: str | os.PathLike, delta: Mapping[str, Sequence[float]], *,
                       batch_size: int = 32, workers: int = 2, seed: int = 0, steps: int = 60,
                       lerobot_steps: int = 20, warmup: int = 3, repeats: int = 3, tokens_per_frame: int = 64,
                       backend: str = "auto", frame_format: str = "rgb24", video_backend: str = "torchcodec",
                       lib_dirs: Sequence[str] = (), limit: bool = True) -> dict[str, Any]:
    """Both loaders at the same :func:`sampling`, ``repeats`` times interleaved (LeRobot, limit, mmfeed, limit,
    ...): each side's median samples/s, its min-max spread, CPU seconds per 1000 samples, and the ratio mmfeed /
    LeRobot; with ``limit``, also the physical limit of each mmfeed stretch's batches (:func:`limit_samples`,
    right before and right after the stretch, their mean), mmfeed's fraction of it and the limit / LeRobot: the
    most any loader could gain over LeRobot on these processes while it decodes what the samples need."""
    from mmfeed.bench.limit import LimitPool

    same = sampling(batch_size, workers, seed)
    loader_args = dict(batch_size=batch_size, num_workers=workers, seed=seed, tokens_per_frame=tokens_per_frame,
                       backend=backend, frame_format=frame_format)
    # forked before any loader has started a thread; it reads the videos through the same items as mmfeed
    planned = mmfeed_loader(root, delta, **{**loader_args, "num_workers": 0}).dataset
    pool = LimitPool(planned.items, workers) if limit else None
    # every round's fresh loader delivers the same batches: the plan's, after the warmup
    stretch = planned_batches(planned, warmup, steps) if limit else []
    lerobot_runs, mmfeed_runs, limit_runs = [], [], []
    try:
        for _ in range(max(1, repeats)):  # interleaved, so a change in background load hits all alike
            child, _ = lerobot_child(python, root, delta, steps=lerobot_steps, warmup=warmup, batch_size=batch_size,
                                     num_workers=workers, seed=seed, video_backend=video_backend, lib_dirs=lib_dirs)
            lerobot_runs.append(child["timing"])
            before = limit_samples(pool, stretch) if pool is not None else None
            ours = time_mmfeed(root, delta, steps=steps, warmup=warmup, keep=pool is not None, **loader_args)
            if pool is not None:
                limit_runs.append(bracket(before, limit_samples(pool, ours.pop("batches")), _LIMIT_RATES,
                                          ("batches",)))
            mmfeed_runs.append(ours)
    finally:
        if pool is not None:
            pool.close()
    lerobot, mmfeed = _summary(lerobot_runs), _summary(mmfeed_runs)
    out = {"lerobot": lerobot, "mmfeed": mmfeed, "ratio_samples_per_s": mmfeed["samples_per_s"] /
           lerobot["samples_per_s"], "sampling": same, "lerobot_versions": child["versions"],
           "video_backend": child["video_backend"], "tokens_per_frame": tokens_per_frame, "mmfeed_backend": backend,
           "mmfeed_frame_format": frame_format}
    if limit_runs:
        med = statistics.median
        rates = [r["samples_per_s"] for r in limit_runs]
        out["limit"] = {"samples_per_s": med(rates), "samples_per_s_spread": spread(rates),
                        "raw_samples_per_s": med(r["raw_samples_per_s"] for r in limit_runs),
                        "shared_samples_per_s": med(r["shared_samples_per_s"] for r in limit_runs),
                        "decoded_per_delivered": med(r["decoded_per_delivered"] for r in limit_runs),
                        "seeks_per_batch": med(r["seeks_per_batch"] for r in limit_runs), "runs": limit_runs}
        # each mmfeed stretch against the limit of its own batches, measured right before and right after it, for
        # the frames it delivers (RGB: decode and conversion; yuv420: decode alone)
        def against(rate: str, cpu_rate: str) -> tuple[list[float], list[float]]:
            """mmfeed over the limit's ``rate``, round by round, and the same per CPU-second (mmfeed: its main
            process and workers; the limit: its decode processes), which other processes on the machine disturb
            less, and which counts the main process's share of the cores."""
            return ([m["samples_per_s"] / r[rate] for m, r in zip(mmfeed_runs, limit_runs)],
                    [m["samples"] / m["cpu_s"] / r[cpu_rate] if m["cpu_s"] > 0 else float("nan")  # no CPU time read
                     for m, r in zip(mmfeed_runs, limit_runs)])

        key = "samples_per_s" if frame_format == "rgb24" else "raw_samples_per_s"
        fractions, per_cpu = against(key, key.replace("samples_per_s", "samples_per_cpu_s"))
        out["limit_fraction"] = med(fractions)
        out["limit_fraction_spread"] = spread(fractions)
        out["limit_fraction_cpu"] = med(per_cpu)
        out["limit_fraction_cpu_spread"] = spread(per_cpu)
        out["limit_vs_lerobot"] = out["limit"][key] / lerobot["samples_per_s"]
        if frame_format == "rgb24":  # against the limit that converts into shared memory, as mmfeed's workers do
            for name, got in zip(("shared_limit_fraction", "shared_limit_fraction_cpu"),
                                 against("shared_samples_per_s", "shared_samples_per_cpu_s")):
                out[name], out[f"{name}_spread"] = med(got), spread(got)
    return out


def run(python: str, *, root: str | os.PathLike | None = None,
        delta: Mapping[str, Sequence[float]] | str | os.PathLike | None = None, extra: int = 32,
        profile: bool = False, cache: bool = False, **throughput: Any) -> dict[str, Any]:
    """The small equality check, the equality of ``root``'s edge samples (plus ``extra`` random ones) and
    :func:`compare_throughput` on ``root`` (None: :func:`synthetic_root`) with the window ``delta`` (a mapping, a
    JSON file for :func:`load_window`, or None: :func:`default_window`); ``profile``: then :func:`profile_mmfeed`;
    ``cache``: then three epochs through a cold decoded-frame cache (``bench/cache_epochs.py``), each against the
    limit measured here."""
    from mmfeed.loaders.formats.lerobot.source import LeRobotSource

    backend, lib_dirs = throughput.get("video_backend", "torchcodec"), throughput.get("lib_dirs", ())
    results: dict[str, Any] = {"small": check_small(python, video_backend=backend, lib_dirs=lib_dirs)}
    synthetic = root is None
    root = synthetic_root() if synthetic else Path(root)
    if isinstance(delta, (str, os.PathLike)):
        delta = load_window(root, delta)
    delta = dict(delta) if delta else default_window(root)
    source = LeRobotSource(root)
    bounds = np.concatenate([[0], np.cumsum(source.lengths)])
    fps = float(source.fps[0])
    steps = [round(t * fps) for seconds in delta.values() for t in seconds]
    indices = edge_indices(bounds, (min(steps), max(steps)), extra=extra, seed=throughput.get("seed", 0))
    _, theirs = lerobot_child(python, root, delta, indices=indices, video_backend=backend, lib_dirs=lib_dirs)
    ours = mmfeed_samples(root, delta, indices)
    results["root"] = {"path": str(root), "synthetic": synthetic, "samples": len(indices), "windows": int(bounds[-1]),
                       "episodes": len(source.lengths), "delta_timestamps": delta,
                       "lerobot_vs_mmfeed": compare_samples(theirs, ours, list(delta),
                                                            frames="pattern" if synthetic else "pixels")}
    if synthetic:
        results["root"]["written"] = SYNTHETIC
    results.update(compare_throughput(python, root, delta, **throughput))
    if profile:
        keys = ("steps", "warmup", "batch_size", "seed", "tokens_per_frame", "backend", "frame_format")
        results["mmfeed_profile"] = profile_mmfeed(root, delta, num_workers=throughput.get("workers", 2),
                                                   **{k: throughput[k] for k in keys if k in throughput})
    if cache:
        from mmfeed.bench.cache_epochs import cache_epochs, over_limit

        keys = ("batch_size", "seed", "tokens_per_frame", "backend", "frame_format")
        results["cache"] = cache_epochs(lambda **kw: mmfeed_loader(root, delta, **kw),
                                        num_workers=throughput.get("workers", 2),
                                        **{k: throughput[k] for k in keys if k in throughput})
        if "limit" in results:
            key = "samples_per_s" if throughput.get("frame_format", "rgb24") == "rgb24" else "raw_samples_per_s"
            results["cache"].update(over_limit(results["cache"], results["limit"][key]))
    return results


def profile_mmfeed(root: str | os.PathLike, delta: Mapping[str, Sequence[float]], *, steps: int = 60,
                   **loader_args: Any) -> dict[str, Any]:
    """Where mmfeed's time goes per batch: one :func:`time_mmfeed` stretch with the loader's timer; each worker
    stage's mean seconds per batch and share (read: parquet rows and frame times; decode: demux, decode, colour
    conversion and the copy into the batch's buffers; collate), the loop's wait, and the main process's CPU per
    batch (receiving the batches from the workers), beside that of a bare torch loader whose workers send batches
    of the same tensors (:func:`~mmfeed.bench.common.receive_floor`)."""
    got = time_mmfeed(root, delta, steps=steps, timer=True, **loader_args)
    report, tensors = got.pop("timer"), got.pop("tensors")
    stages = {name: {"ms_per_batch": 1e3 * v["mean_s"], "share": v["share"]} for name, v in report["stages"].items()}
    floor = receive_floor(tensors, workers=max(1, loader_args.get("num_workers") or 1), steps=steps)
    return {**got, "stages": stages, "wait_ms_per_batch": 1e3 * report["wait_s"]["mean"],
            "main_cpu_ms_per_batch": 1e3 * got["cpu_s_main"] / got["batches"],
            "worker_cpu_ms_per_batch": 1e3 * got["cpu_s_workers"] / got["batches"],
            "torch_main_cpu_ms_per_batch": floor["main_cpu_ms_per_batch"], "batch_bytes": floor["bytes"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from mmfeed.loaders.formats.lerobot.source import is_lerobot_dir

    parser = argparse.ArgumentParser(prog="python -m mmfeed.bench.lerobot_compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--lerobot-python", required=True, help="python of the venv where lerobot is installed")
    parser.add_argument("--root", help="a LeRobot v3 directory (default: a synthetic AV1 one, written once)")
    parser.add_argument("--delta-json", metavar="FILE", help="the window: {feature: [seconds]} (default: every "
                        "camera [-1/fps, 0], observation.state [0], action [i/fps for i in range(50)])")
    parser.add_argument("--workers", type=int, default=2, help="worker processes, both sides")
    parser.add_argument("--batch-size", type=int, default=32, help="windows per batch, both sides")
    parser.add_argument("--steps", type=int, default=60, help="measured mmfeed batches per repeat")
    parser.add_argument("--lerobot-steps", type=int, default=20, help="measured LeRobot batches per repeat")
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches before each measured stretch")
    parser.add_argument("--repeats", type=int, default=3, help="figures = median over this many repeats")
    parser.add_argument("--tokens-per-frame", type=int, default=64, help="mmfeed's price of a video frame")
    parser.add_argument("--backend", default="auto", help="mmfeed's video backend")
    parser.add_argument("--frame-format", default="rgb24", choices=("rgb24", "yuv420"),
                        help="mmfeed's frames: RGB as LeRobot's (default), or I420 planes (no conversion on CPU)")
    parser.add_argument("--video-backend", default="torchcodec", help="LeRobot's video_backend (torchcodec or pyav)")
    parser.add_argument("--lib-dir", action="append", default=[], help="extra LD_LIBRARY_PATH folder for the child")
    parser.add_argument("--profile", action="store_true", help="then one timed mmfeed stretch: time per batch "
                        "in each worker stage, the loop's wait, CPU of the main process and the workers")
    parser.add_argument("--no-limit", dest="limit", action="store_false", help="skip the decode limit (plain "
                        "PyAV decoding each mmfeed stretch's frames, measured after it)")
    parser.add_argument("--cache", action="store_true", help="then three mmfeed epochs through a cold decoded-frame "
                        "cache, each epoch's samples/s and cache.epoch3_over_limit")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    if not Path(args.lerobot_python).exists():
        parser.error(f"--lerobot-python {args.lerobot_python} does not exist; pass the venv's bin/python")
    if args.root is not None and not is_lerobot_dir(args.root):
        parser.error(f"--root {args.root} is no LeRobot v3 directory (no meta/info.json)")
    if args.delta_json is not None and not Path(args.delta_json).is_file():
        parser.error(f"--delta-json {args.delta_json} does not exist")
    for name in ("batch_size", "steps", "lerobot_steps", "repeats", "tokens_per_frame"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.workers < 0 or args.warmup < 0:
        parser.error("--workers and --warmup must be >= 0")
    return args


def _print_side(name: str, side: dict[str, Any]) -> None:
    s = side["samples_per_s_spread"]
    print(f"{name:8s} {side['samples_per_s']:9.1f} samples/s (min {s['min']:.1f}, max {s['max']:.1f}, median of "
          f"{len(side['runs'])})   {side['cpu_s_per_1000_samples']:.2f} CPU-s / 1000 samples")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    start = time.perf_counter()
    results = run(args.lerobot_python, root=args.root, delta=args.delta_json, batch_size=args.batch_size,
                  workers=args.workers, steps=args.steps, lerobot_steps=args.lerobot_steps, warmup=args.warmup,
                  repeats=args.repeats, tokens_per_frame=args.tokens_per_frame, backend=args.backend,
                  frame_format=args.frame_format, video_backend=args.video_backend, lib_dirs=args.lib_dir,
                  profile=args.profile, limit=args.limit, cache=args.cache)
    small, root = results["small"], results["root"]
    _print_report(f"small directory, all {small['samples']} samples, LeRobot vs mmfeed", small["lerobot_vs_mmfeed"])
    _print_report("small directory, writer ground truth vs LeRobot", small["truth_vs_lerobot"])
    print(f"  tasks equal: {small['tasks_equal']}")
    _print_report(f"{root['path']}: {root['samples']} edge + random samples, LeRobot vs mmfeed",
                  root["lerobot_vs_mmfeed"])
    same = results["sampling"]
    window = ", ".join(f"{k} {len(v)} x [{v[0]:.4g}..{v[-1]:.4g}] s" for k, v in root["delta_timestamps"].items())
    print(f"\n{root['episodes']} episodes, {root['windows']} windows; window: {window}\n"
          f"both: global shuffle, batch {same['batch_size']}, {same['num_workers']} workers; LeRobot "
          f"{results['lerobot_versions'].get('lerobot')} ({results['video_backend']}) torch DataLoader, mmfeed "
          f"DataLoader fixed plan ({results['mmfeed_backend']}, {results['mmfeed_frame_format']})")
    _print_side("LeRobot", results["lerobot"])
    _print_side("mmfeed", results["mmfeed"])
    if "limit" in results:
        lim, f = results["limit"], results["limit_fraction_spread"]
        s = lim["samples_per_s_spread"]
        print(f"limit    {lim['samples_per_s']:9.1f} samples/s (min {s['min']:.1f}, max {s['max']:.1f}) decoding "
              f"and converting mmfeed's batches with plain PyAV in {same['num_workers'] or 1} processes; "
              f"{lim['raw_samples_per_s']:.1f} without conversion; {lim['decoded_per_delivered']:.2f} frames "
              f"decoded per frame delivered")
        c = results["limit_fraction_cpu_spread"]
        # three decimals: the goal is read at 0.9, which two would round 0.895 up to
        print(f"mmfeed / limit: {results['limit_fraction']:.3f} (min {f['min']:.3f}, max {f['max']:.3f}); per "
              f"CPU-second {results['limit_fraction_cpu']:.3f} (min {c['min']:.3f}, max {c['max']:.3f}); "
              f"limit / LeRobot: {results['limit_vs_lerobot']:.2f}")
        if "shared_limit_fraction" in results:
            f, c = results["shared_limit_fraction_spread"], results["shared_limit_fraction_cpu_spread"]
            print(f"limit into shared memory {lim['shared_samples_per_s']:.1f} samples/s (converting into a batch's "
                  f"slots in shared memory, 4 KB pages); mmfeed / it: {results['shared_limit_fraction']:.3f} "
                  f"(min {f['min']:.3f}, max {f['max']:.3f}); per CPU-second "
                  f"{results['shared_limit_fraction_cpu']:.3f} (min {c['min']:.3f}, max {c['max']:.3f})")
    print(f"mmfeed / LeRobot (samples/s): {results['ratio_samples_per_s']:.2f}   ({time.perf_counter() - start:.0f} s)")
    if args.profile:
        prof = results["mmfeed_profile"]
        stages = ", ".join(f"{k} {v['ms_per_batch']:.1f} ms ({v['share']:.0%})" for k, v in prof["stages"].items())
        print(f"mmfeed per batch: {stages} of worker time; loop wait {prof['wait_ms_per_batch']:.1f} ms; CPU "
              f"{prof['worker_cpu_ms_per_batch']:.1f} ms workers, {prof['main_cpu_ms_per_batch']:.1f} ms main (a bare "
              f"torch loader's main process receiving batches of the same tensors, {prof['batch_bytes'] / 2**20:.1f} "
              f"MiB: {prof['torch_main_cpu_ms_per_batch']:.1f} ms)")
    if args.cache:
        got = results["cache"]
        rates = ", ".join(f"{r:.1f}" for r in got["samples_per_s"])
        print(f"mmfeed with a cold frame cache, epochs 1-{len(got['epochs'])}: {rates} samples/s; store "
              f"{got['store_segments']} segments, {got['store_bytes'] / 2**20:.0f} MiB"
              + (f"; epoch 3 / limit: {got['epoch3_over_limit']:.2f}" if "epoch3_over_limit" in got else ""))
    if args.json:
        from mmfeed.bench.common import environment

        Path(args.json).write_text(json.dumps({**results, "environment": environment()}, indent=2, default=str))
    ok = all(r["ok"] for r in (small["lerobot_vs_mmfeed"], small["truth_vs_lerobot"], root["lerobot_vs_mmfeed"]))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
