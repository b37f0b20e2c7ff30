r"""Real LeRobot beside mmfeed on the same LeRobot v3 directory: the same samples, and throughput side by side.

LeRobot lives in its own virtual environment (its torch and torchvision pins differ from mmfeed's), so this
module runs a small child script (:data:`CHILD_SCRIPT`) under that environment's python. The child opens
``LeRobotDataset(repo_id="local/synthetic", root=..., delta_timestamps=..., video_backend=...)`` fully offline
and either

- dumps the samples at given indices (frames converted back from LeRobot's float ``[0, 1]`` CHW to uint8 HWC,
  every array feature, every ``*_is_pad`` flag and the index columns) as ``.npy`` files, or
- times ``torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True, num_workers=2)`` after a warm-up.

Both sides read the same features under the same names: the ``delta_timestamps`` LeRobot gets are the window
mmfeed reads (``WindowSpec.from_delta_timestamps``), feature for feature. The parent reads the samples through
mmfeed's loader path (:class:`~mmfeed.loaders.sources.lerobot.LeRobotSource` and the window requests of
:class:`~mmfeed.loaders.items.EpisodeItems`; LeRobot's sample ``i`` is the global frame
``dataset_from_index[episode] + anchor``, which is also mmfeed's sample ``i`` with stride 1) and compares them
feature by feature: arrays and pad flags exactly, frames by the index pattern drawn into the pixels (both must
show the frame LeRobot's clamping asks for) plus the largest pixel difference. Then it measures mmfeed's loader
on the benchmark directory with :func:`mmfeed.bench.loader.run_mmfeed` and prints both throughputs::

    python -m mmfeed.bench.lerobot_compare --lerobot-python /work/lerobot-venv/bin/python --json out.json

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
(nor 0.29); use torchcodec. PyAV stays the system's 18 (lerobot pins av<16; it reads no video through PyAV with torchcodec).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from mmfeed.testing.video import read_index

__all__ = ["CHILD_SCRIPT", "check_small", "compare_samples", "delta_timestamps", "edge_indices", "ground_truth",
           "lerobot_child", "main", "mmfeed_samples", "run", "run_child"]

log = logging.getLogger(__name__)

CHILD_SCRIPT = r'''
import json, os, sys, time
import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

args = json.loads(sys.argv[1])
out = args["out"]
ds = LeRobotDataset(args["repo_id"], root=args["root"], delta_timestamps=args["delta_timestamps"],
                    video_backend=args["video_backend"])
result = {"num_samples": len(ds), "video_backend": ds.video_backend, "video_keys": list(ds.meta.video_keys),
          "versions": {}}
for name in ("lerobot", "torch", "torchvision", "torchcodec", "av", "datasets", "huggingface_hub", "numpy"):
    try:
        result["versions"][name] = __import__(name).__version__
    except Exception as err:
        result["versions"][name] = "unavailable: %s" % err


def to_uint8(frames):
    # LeRobot returns float32 [T, C, H, W] (or [C, H, W] for one timestamp) in [0, 1]
    arr = frames.numpy()
    if arr.ndim == 3:
        arr = arr[None]
    return np.clip(np.round(arr * 255.0), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)


if args["indices"]:
    items = [ds[i] for i in args["indices"]]
    keys = sorted(k for k, v in items[0].items() if torch.is_tensor(v))
    for key in keys:
        if key in ds.meta.video_keys:
            arr = np.stack([to_uint8(it[key]) for it in items])
        else:
            arr = np.stack([it[key].numpy() for it in items])
        np.save(os.path.join(out, key + ".npy"), arr)
    result["dumped"] = keys
    result["tasks"] = [it["task"] for it in items]

if args["steps"]:
    workers = args["num_workers"]
    loader = torch.utils.data.DataLoader(ds, batch_size=args["batch_size"], shuffle=True, num_workers=workers,
                                         generator=torch.Generator().manual_seed(args["seed"]),
                                         persistent_workers=workers > 0)

    def forever():
        while True:
            yield from loader

    batches = forever()
    for _ in range(args["warmup"]):
        next(batches)
    runs = []
    for _ in range(args["repeats"]):
        samples = frames = real = 0
        start = time.perf_counter()
        for _ in range(args["steps"]):
            batch = next(batches)
            for key in ds.meta.video_keys:
                value = batch[key]
                frames += value.shape[0] * (value.shape[1] if value.ndim == 5 else 1)
                pad = batch.get(key + "_is_pad")
                real += int((~pad).sum()) if pad is not None else value.shape[0]
            samples += len(batch["index"])
        seconds = time.perf_counter() - start
        runs.append({"seconds": seconds, "samples": samples, "frames": frames, "samples_per_s": samples / seconds,
                     "frames_per_s": frames / seconds, "non_pad_frames_per_s": real / seconds})
    median = sorted(runs, key=lambda r: r["frames_per_s"])[len(runs) // 2]
    result["timing"] = {**median, "repeats": runs, "batch_size": args["batch_size"], "num_workers": workers,
                        "steps": args["steps"], "warmup": args["warmup"]}

with open(os.path.join(out, "result.json"), "w") as f:
    json.dump(result, f)
'''
"""The script run under LeRobot's python (``python -c CHILD_SCRIPT ARGS_JSON``); it never imports mmfeed."""


def _lib_dirs(python: str | os.PathLike, extra: Sequence[str] = ()) -> list[str]:
    """Library folders for the child: ``extra``, ``<venv>/ffmpeg-links`` (FFmpeg under its standard sonames) and
    any FFmpeg unpacked under ``<venv>/ffmpeg/usr/lib``."""
    dirs = [str(d) for d in extra]
    venv = Path(python).absolute().parent.parent
    if (venv / "ffmpeg-links").is_dir():
        dirs.append(str(venv / "ffmpeg-links"))
    for lib in sorted((venv / "ffmpeg" / "usr" / "lib").glob("*-linux-gnu")):
        dirs.append(str(lib))
        dirs += [str(lib / sub) for sub in ("blas", "lapack", "pulseaudio") if (lib / sub).is_dir()]
    return dirs


def run_child(python: str, script: str, args: Mapping[str, Any], tmp: str | os.PathLike, *,
              lib_dirs: Sequence[str] = (), timeout_s: float = 1800.0) -> None:
    """Run ``python -c script ARGS_JSON`` in ``tmp``, offline (``HF_HUB_OFFLINE=1``, ``HF_DATASETS_OFFLINE=1``,
    a private ``HF_HOME`` under ``tmp``), without mmfeed or the system site-packages on its path and with the venv's
    FFmpeg folders on ``LD_LIBRARY_PATH``. Raises RuntimeError with the child's stderr when it fails."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(Path(tmp) / "hf"),
           "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    dirs = _lib_dirs(python, lib_dirs)
    if dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join([*dirs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
    proc = subprocess.run([python, "-c", script, json.dumps(args)], env=env, capture_output=True, text=True,
                          timeout=timeout_s, cwd=tmp)
    if proc.returncode != 0:
        raise RuntimeError(f"LeRobot child under {python} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")


def lerobot_child(
    python: str | os.PathLike,
    root: str | os.PathLike,
    delta_timestamps: Mapping[str, Sequence[float]],
    *,
    indices: Sequence[int] = (),
    steps: int = 0,
    warmup: int = 3,
    repeats: int = 1,
    batch_size: int = 32,
    num_workers: int = 2,
    seed: int = 0,
    video_backend: str = "torchcodec",
    lib_dirs: Sequence[str] = (),
    timeout_s: float = 1800.0,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Run :data:`CHILD_SCRIPT` under ``python``; return its result record and the dumped arrays by key.

    Run by :func:`run_child`, so nothing outside a temporary folder is written. Raises RuntimeError with the
    child's stderr when it fails.
    """
    python = str(python)
    if not Path(python).exists():
        raise ValueError(f"LeRobot python {python!r} does not exist; pass the venv's bin/python (--lerobot-python)")
    with tempfile.TemporaryDirectory(prefix="mmfeed-lerobot-") as tmp:
        out = Path(tmp) / "out"
        out.mkdir()
        args = {"repo_id": "local/synthetic", "root": str(root), "out": str(out),
                "delta_timestamps": {k: [float(t) for t in v] for k, v in delta_timestamps.items()},
                "indices": [int(i) for i in indices], "steps": int(steps), "warmup": int(warmup), "repeats": int(repeats),
                "batch_size": int(batch_size), "num_workers": int(num_workers), "seed": int(seed),
                "video_backend": video_backend}
        run_child(python, CHILD_SCRIPT, args, tmp, lib_dirs=lib_dirs, timeout_s=timeout_s)
        result = json.loads((out / "result.json").read_text())
        arrays = {key: np.load(out / f"{key}.npy") for key in result.get("dumped", [])}
    return result, arrays


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
    :class:`~mmfeed.loaders.items.EpisodeItems` (each feature at its own rate, clamping and ``is_pad``) and
    ``LeRobotSource.read_many``. Also returns ``episode_index`` and ``frame_index`` (the anchor) so they can be
    checked against LeRobot's columns.
    """
    from mmfeed.loaders import TokenLayout, WindowSpec
    from mmfeed.loaders.items import EpisodeItems
    from mmfeed.loaders.sources.lerobot import LeRobotSource

    source = LeRobotSource(root, backend=backend)
    window = WindowSpec.from_delta_timestamps(delta_timestamps)
    layout = TokenLayout(tokens_per_frame={f: 1 for f in window.features if source.features[f].kind == "video"})
    items = EpisodeItems(source, layout=layout, window=window)
    indices = np.asarray(indices, dtype=np.int64)
    if indices.size and (indices.min() < 0 or indices.max() >= len(items)):
        raise ValueError(f"sample indices must lie in [0, {len(items)}), got {indices.min()}..{indices.max()}")
    asked = items.requests(indices)
    reads = source.read_many([request for request, _, _ in asked])
    out: dict[str, np.ndarray] = {"episode_index": items.episode[indices], "frame_index": items.start[indices]}
    for name in window.features:
        out[name] = np.stack([got[name] for got in reads])
        out[f"{name}_is_pad"] = np.stack([pads[name] for _, pads, _ in asked])
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


def compare_samples(expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
                    keys: Sequence[str]) -> dict[str, Any]:
    """Compare two sample sets key by key; ``{"ok": bool, "keys": {key: details}, "problems": [str]}``.

    keys: feature names (the same on both sides: ``observation.images.<cam>``, ``observation.state``, ``action``,
    ...); each one's ``<key>_is_pad`` is compared too, and ``episode_index`` / ``frame_index`` where both sides have them.
    Non-video arrays must be equal exactly (same shape, bitwise for floats); frames must have the same shape and
    show the same pattern index in every frame (:func:`mmfeed.testing.read_index`); their largest pixel
    difference is reported, not judged (two decoders may round colour conversion differently).
    """
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
            flat = a.shape[0] * a.shape[1]
            ia = read_index(a.reshape(flat, *a.shape[2:])).reshape(a.shape[:2])
            ib = read_index(b.reshape(flat, *b.shape[2:])).reshape(b.shape[:2])
            diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
            details.update(index_equal=bool(np.array_equal(ia, ib)), max_pixel_diff=int(diff.max(initial=0)),
                           mean_pixel_diff=float(diff.mean()) if diff.size else 0.0)
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


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda r: r["frames_per_s"])[len(runs) // 2]


def _lerobot_style(workers: int, steps: int):
    from mmfeed.bench.loader import LoaderBench

    return replace(LoaderBench(format="lerobot", workers=workers, steps=steps), codec="av1", gop=2, height=240,
                   width=320, history=2, horizon=50, tokens_per_frame=64, capacity=1024, rows_per_batch=8)


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


def run(python: str, *, video_backend: str = "torchcodec", lib_dirs: Sequence[str] = (), workers: int = 2,
        steps: int = 120, lerobot_steps: int = 40, repeats: int = 3, batch_size: int = 32,
        extra: int = 32) -> dict[str, Any]:
    """The small equality check, the benchmark directory's edge samples, and both throughputs.

    Each throughput is the median of ``repeats`` runs, LeRobot's and mmfeed's interleaved; a run is a fresh loader
    measured over ``lerobot_steps`` (LeRobot) or ``steps`` (mmfeed) batches after the warm-up batches.
    """
    from mmfeed.bench.loader import dataset_path, run_mmfeed

    results: dict[str, Any] = {"small": check_small(python, video_backend=video_backend, lib_dirs=lib_dirs)}
    cfg = _lerobot_style(workers, steps)
    path = dataset_path(cfg)
    from mmfeed.loaders.sources.lerobot import LeRobotSource

    source = LeRobotSource(path)
    bounds = np.concatenate([[0], np.cumsum(source.lengths)])
    window = cfg.window()
    delta = delta_timestamps(window)
    span = tuple(int(round(t * cfg.fps)) for t in window.span_s())
    indices = edge_indices(bounds, span, extra=extra, seed=cfg.seed)
    child, theirs = lerobot_child(python, path, delta, indices=indices, video_backend=video_backend, lib_dirs=lib_dirs)
    ours = mmfeed_samples(path, delta, indices)
    results["bench_dir"] = {"path": str(path), "samples": len(indices),
                            "lerobot_vs_mmfeed": compare_samples(theirs, ours, list(delta))}
    lerobot_runs, mmfeed_runs = [], []
    for _ in range(max(1, repeats)):  # interleaved, so a change in background load hits both alike
        timed, _ = lerobot_child(python, path, delta, steps=lerobot_steps, warmup=cfg.warmup, batch_size=batch_size,
                                 num_workers=workers, seed=cfg.seed, video_backend=video_backend, lib_dirs=lib_dirs)
        lerobot_runs.append({k: v for k, v in timed["timing"].items() if k != "repeats"})
        mmfeed_runs.append(run_mmfeed(cfg, path))
    results["lerobot"] = {**_median(lerobot_runs), "repeats": lerobot_runs}
    results["mmfeed"] = {**_median(mmfeed_runs), "repeats": mmfeed_runs}
    results["ratio_frames_per_s"] = results["mmfeed"]["frames_per_s"] / results["lerobot"]["frames_per_s"]
    results["lerobot_versions"] = timed["versions"]
    results["video_backend"] = timed["video_backend"]
    results["settings"] = {**asdict(cfg), "delta_timestamps": delta, "lerobot_batch_size": batch_size}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mmfeed.bench.lerobot_compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lerobot-python", required=True, help="python of the venv where lerobot is installed")
    parser.add_argument("--video-backend", default="torchcodec", help="LeRobot's video_backend (torchcodec or pyav)")
    parser.add_argument("--lib-dir", action="append", default=[], help="extra LD_LIBRARY_PATH folder for the child")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=120, help="measured mmfeed batches per repeat")
    parser.add_argument("--lerobot-steps", type=int, default=40, help="measured LeRobot batches per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="throughput = median over this many repeats")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    start = time.perf_counter()
    results = run(args.lerobot_python, video_backend=args.video_backend, lib_dirs=args.lib_dir, workers=args.workers,
                  steps=args.steps, lerobot_steps=args.lerobot_steps, repeats=args.repeats)
    small = results["small"]
    _print_report(f"small directory, all {small['samples']} samples, LeRobot vs mmfeed", small["lerobot_vs_mmfeed"])
    _print_report("small directory, writer ground truth vs LeRobot", small["truth_vs_lerobot"])
    print(f"  tasks equal: {small['tasks_equal']}")
    bench = results["bench_dir"]
    _print_report(f"benchmark directory, {bench['samples']} edge + random samples, LeRobot vs mmfeed",
                  bench["lerobot_vs_mmfeed"])
    le, mm = results["lerobot"], results["mmfeed"]
    print(f"\nLeRobot {results['lerobot_versions'].get('lerobot')} ({results['video_backend']}), torch DataLoader "
          f"batch {le['batch_size']}, {le['num_workers']} workers: {le['frames_per_s']:.1f} frames/s, "
          f"{le['samples_per_s']:.1f} samples/s (median of {len(le['repeats'])})")
    print(f"mmfeed DataLoader (packed, {args.workers} workers): {mm['frames_per_s']:.1f} frames/s, "
          f"{mm['samples_per_s']:.1f} samples/s (median of {len(mm['repeats'])})")
    print(f"mmfeed / LeRobot (frames/s): {results['ratio_frames_per_s']:.2f}   ({time.perf_counter() - start:.0f} s)")
    if args.json:
        from mmfeed.bench.common import environment

        Path(args.json).write_text(json.dumps({**results, "environment": environment()}, indent=2, default=str))
    ok = small["lerobot_vs_mmfeed"]["ok"] and small["truth_vs_lerobot"]["ok"] and bench["lerobot_vs_mmfeed"]["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
