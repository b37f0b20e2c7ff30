"""Real LeRobot in a child process under its own virtual environment: the script it runs and how it is run.

LeRobot's torch and torchvision pins differ from mmfeed's, so :mod:`mmfeed.bench.lerobot_compare` runs
:data:`CHILD_SCRIPT` under that environment's python (the recipe for the environment is in that module's
docstring). The child opens ``LeRobotDataset(repo_id="local/synthetic", root=..., delta_timestamps=...,
video_backend=...)`` fully offline and either dumps the samples at given indices (frames converted back from
LeRobot's float ``[0, 1]`` CHW to uint8 HWC, every array feature, every ``*_is_pad`` flag and the index columns) as
``.npy`` files, or times its loader (:func:`torch_loader`, :func:`timed_stretch`: the same timing mmfeed's side gets).
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mmfeed.bench.common import child_pids, cpu_seconds

__all__ = ["CHILD_SCRIPT", "lerobot_child", "run_child", "timed_stretch", "torch_loader"]


def torch_loader(dataset, *, batch_size: int, num_workers: int, seed: int):
    """LeRobot's side of :func:`sampling`: ``torch.utils.data.DataLoader(dataset, batch_size=batch_size,
    shuffle=True, num_workers=num_workers)``, seeded, with persistent workers (run in the child)."""
    import torch

    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=num_workers,
                                       generator=torch.Generator().manual_seed(seed),
                                       persistent_workers=num_workers > 0)


def timed_stretch(batches: Iterator[Any], steps: int, count: Callable[[Any], int],
                  exclude: Collection[int] = ()) -> dict[str, Any]:
    """Time ``steps`` batches of ``batches``: wall seconds, samples (``count(batch)`` summed) and the CPU seconds
    of this process and of its child processes (the loader's workers; children in ``exclude``, there before the
    loader, are not counted) over the stretch (each process's CPU-time clock:
    :func:`~mmfeed.bench.common.cpu_seconds`)."""
    workers = sorted(set(child_pids()) - set(exclude))
    self0, workers0 = cpu_seconds([os.getpid()]), cpu_seconds(workers)
    start, samples = time.perf_counter(), 0
    for _ in range(steps):
        samples += int(count(next(batches)))
    seconds = time.perf_counter() - start
    cpu_main, cpu_workers = cpu_seconds([os.getpid()]) - self0, cpu_seconds(workers) - workers0
    return {"seconds": seconds, "samples": samples, "batches": steps, "samples_per_s": samples / seconds,
            "cpu_s": cpu_main + cpu_workers, "cpu_s_main": cpu_main, "cpu_s_workers": cpu_workers,
            "worker_processes": len(workers), "cpu_s_per_1000_samples": 1000.0 * (cpu_main + cpu_workers) / samples}


_CHILD_HEAD = """from __future__ import annotations
import json, os, sys, time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
"""

_CHILD_BODY = r"""
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
        if key in ds.meta.camera_keys:  # videos and images alike come as float CHW
            arr = np.stack([to_uint8(it[key]) for it in items])
        else:
            arr = np.stack([it[key].numpy() for it in items])
        np.save(os.path.join(out, key + ".npy"), arr)
    result["dumped"] = keys
    result["tasks"] = [it["task"] for it in items]

if args["steps"]:
    loader = torch_loader(ds, batch_size=args["batch_size"], num_workers=args["num_workers"], seed=args["seed"])

    def forever():
        while True:
            yield from loader

    batches = forever()
    for _ in range(args["warmup"]):
        next(batches)
    result["timing"] = timed_stretch(batches, args["steps"], lambda batch: len(batch["index"]))

with open(os.path.join(out, "result.json"), "w") as f:
    json.dump(result, f)
"""

CHILD_SCRIPT = "\n\n".join([_CHILD_HEAD, *(inspect.getsource(fn) for fn in (child_pids, cpu_seconds, torch_loader,
                                                                             timed_stretch)), _CHILD_BODY])
"""The script run under LeRobot's python (``python -c CHILD_SCRIPT ARGS_JSON``); it never imports mmfeed: the
helpers it shares with the parent (:func:`torch_loader`, :func:`timed_stretch` and the CPU-time reading) are
copied into it as source."""


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
    a private ``HF_HOME`` under ``tmp``), without ``PYTHONPATH`` or user site-packages (the child imports no
    mmfeed; a ``--system-site-packages`` venv still sees the system's torch and PyAV) and with the venv's FFmpeg
    folders on ``LD_LIBRARY_PATH``. Raises RuntimeError with the child's stderr when it fails."""
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


def lerobot_child(python: str | os.PathLike, root: str | os.PathLike, delta_timestamps: Mapping[str, Sequence[float]],
                  *, indices: Sequence[int] = (), steps: int = 0, warmup: int = 3, batch_size: int = 32,
                  num_workers: int = 2, seed: int = 0, video_backend: str = "torchcodec", lib_dirs: Sequence[str] = (),
                  timeout_s: float = 1800.0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
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
        # the child runs in the temporary folder: a relative root must not be read from there
        args = {"repo_id": "local/synthetic", "root": os.path.abspath(root), "out": str(out),
                "delta_timestamps": {k: [float(t) for t in v] for k, v in delta_timestamps.items()},
                "indices": [int(i) for i in indices], "steps": int(steps), "warmup": int(warmup),
                "batch_size": int(batch_size), "num_workers": int(num_workers), "seed": int(seed),
                "video_backend": video_backend}
        run_child(python, CHILD_SCRIPT, args, tmp, lib_dirs=lib_dirs, timeout_s=timeout_s)
        result = json.loads((out / "result.json").read_text())
        arrays = {key: np.load(out / f"{key}.npy") for key in result.get("dumped", [])}
    return result, arrays
