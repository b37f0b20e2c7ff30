"""Read throughput of the HDF5 and Zarr demonstration formats: ``ds.windows(spec)`` through ``mmfeed.DataLoader``
beside a plain h5py / zarr loop that reads the same windows (alone, and as a map-style dataset in torch's
DataLoader with the same workers).

    python -m mmfeed.bench.demo_formats [--workers 2] [--batches 40] [--json out.json]

It writes three datasets into a temporary folder first (seeded): a robomimic file (two 84x84 cameras, as
robomimic's image datasets have), ACT/ALOHA episode files with three 240x320 JPEG cameras, and a pusht-like Zarr
ReplayBuffer (96x96 pictures); each window is a camera frame, the state and a chunk of 16 actions. Figures:
samples/s and the CPU seconds (all processes) per 1000 samples, the median of ``--repeats`` interleaved runs.
Needs h5py, Pillow, zarr and cv2 (to write the JPEG pictures as ALOHA does).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Any

import numpy as np

CHUNK = 16  # actions per window


def _pictures(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    base = rng.integers(0, 200, size=(n, 1, 1, 3))
    return np.clip(base + (y + x)[None, :, :, None] // 4 + rng.integers(0, 8, size=(n, h, w, 3)), 0, 255
                   ).astype(np.uint8)


def write_robomimic(path: str, demos: int = 20, steps: int = 100, seed: int = 0) -> None:
    import h5py

    rng = np.random.default_rng(seed)
    with h5py.File(path, "w") as f:
        for k in range(demos):
            g = f.create_group(f"data/demo_{k}")
            g["actions"] = rng.uniform(-1, 1, size=(steps, 7))
            g["obs/agentview_image"] = _pictures(rng, steps, 84, 84)
            g["obs/robot0_eye_in_hand_image"] = _pictures(rng, steps, 84, 84)
            g["obs/robot0_eef_pos"] = rng.normal(size=(steps, 3))
            g["obs/robot0_joint_pos"] = rng.normal(size=(steps, 7))


def write_aloha(folder: str, episodes: int = 16, steps: int = 100, seed: int = 1) -> None:
    import cv2
    import h5py

    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    cameras = ("cam_high", "cam_left_wrist", "cam_right_wrist")
    for k in range(episodes):
        encoded = {c: [cv2.imencode(".jpg", p, [int(cv2.IMWRITE_JPEG_QUALITY), 50])[1]
                       for p in _pictures(rng, steps, 240, 320)] for c in cameras}
        padded = max(len(b) for c in cameras for b in encoded[c])
        with h5py.File(os.path.join(folder, f"episode_{k}.hdf5"), "w") as root:
            root.attrs["compress"] = True
            for c in cameras:
                rows = np.zeros((steps, padded), np.uint8)
                for j, b in enumerate(encoded[c]):
                    rows[j, :len(b)] = b.reshape(-1)
                root.create_dataset(f"observations/images/{c}", data=rows, chunks=(1, padded))
            root["compress_len"] = np.array([[len(b) for b in encoded[c]] for c in cameras], np.float32)
            root["observations/qpos"] = rng.normal(size=(steps, 14)).astype(np.float32)
            root["action"] = rng.normal(size=(steps, 14)).astype(np.float32)


def write_replay(path: str, episodes: int = 30, steps: int = 100, seed: int = 2) -> None:
    import zarr

    rng = np.random.default_rng(seed)
    n = episodes * steps
    root = zarr.open_group(path, mode="w", zarr_format=2)
    data = root.require_group("data")
    for name, values, chunks in (("img", _pictures(rng, n, 96, 96), (steps, 96, 96, 3)),
                                 ("state", rng.normal(size=(n, 5)).astype(np.float32), (n, 5)),
                                 ("action", rng.normal(size=(n, 2)).astype(np.float32), (n, 2))):
        data.create_array(name, shape=values.shape, dtype=values.dtype, chunks=chunks)[...] = values
    ends = np.arange(1, episodes + 1, dtype=np.int64) * steps
    root.require_group("meta").create_array("episode_ends", shape=ends.shape, dtype=np.int64)[...] = ends


class PlainWindows:
    """The same windows read the plain way: for each sample, the camera row, the state row and the action rows
    (clamped at the episode's end, as the windows view pads), straight from h5py or zarr. A map-style dataset
    (each process opens its own handles)."""

    def __init__(self, kind: str, path: str, keys: dict[str, str], episodes: list[tuple[Any, int]]) -> None:
        self.kind, self.path, self.keys, self.episodes = kind, path, keys, episodes
        self.starts = np.concatenate([[0], np.cumsum([t for _, t in episodes])])
        self._open: dict = {}

    def __len__(self) -> int:
        return int(self.starts[-1])

    def _handle(self, where: Any) -> Any:
        if where not in self._open:
            if self.kind == "zarr":
                import zarr

                self._open[where] = zarr.open_group(self.path, mode="r")["data"]
            else:
                import h5py

                self._open[where] = h5py.File(where if self.kind == "aloha" else self.path, "r")
        return self._open[where]

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        e = int(np.searchsorted(self.starts, i, side="right")) - 1
        t = i - int(self.starts[e])
        where, length = self.episodes[e]
        h = self._handle(where if self.kind == "aloha" else "file")
        rows = np.minimum(np.arange(t, t + CHUNK), length - 1)
        if self.kind == "zarr":
            base = int(where)
            action = np.asarray(h[self.keys["action"]][base + rows[0]:base + rows[-1] + 1])
            return {"camera": np.asarray(h[self.keys["camera"]][base + t]),
                    "state": np.asarray(h[self.keys["state"]][base + t]), "action": action[rows - rows[0]]}
        group = "" if self.kind == "aloha" else f"{where}/"
        camera = h[group + self.keys["camera"]][t]
        if self.kind == "aloha":
            import cv2

            camera = cv2.imdecode(camera, 1)
        action = h[group + self.keys["action"]][rows[0]:rows[-1] + 1]
        return {"camera": camera, "state": h[group + self.keys["state"]][t], "action": action[rows - rows[0]]}


def _cpu() -> float:
    """CPU seconds of this process and its live children."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def _measure(loader: Any, batches: int, warmup: int = 2) -> dict[str, float]:
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    samples, cpu, start = 0, _cpu(), time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        samples += len(next(iter(batch.values())))
    wall, used = time.perf_counter() - start, _cpu() - cpu
    del it
    return {"samples_per_s": round(samples / wall, 1), "cpu_s_per_1000": round(1000 * used / samples, 3)}


def run(workers: int = 2, batches: int = 40, batch_size: int = 32, folder: str | None = None, repeats: int = 3
        ) -> dict:
    import torch

    from mmfeed import DataLoader
    from mmfeed.loaders import WindowSpec, open_dataset

    folder = folder or tempfile.mkdtemp(prefix="mmfeed-demo-bench-")
    cases = {
        "robomimic (h5py, 2x84x84 raw)": ("robomimic", os.path.join(folder, "robomimic.hdf5"), write_robomimic, 20.0,
                                          {"camera": "obs/agentview_image", "state": "obs/robot0_joint_pos",
                                           "action": "actions"}),
        "aloha (h5py, 240x320 JPEG)": ("aloha", os.path.join(folder, "aloha"), write_aloha, 50.0,
                                       {"camera": "observations/images/cam_high", "state": "observations/qpos",
                                        "action": "action"}),
        "pusht-like ReplayBuffer (zarr 2, 96x96)": ("zarr", os.path.join(folder, "pusht.zarr"), write_replay, 10.0,
                                                    {"camera": "img", "state": "state", "action": "action"}),
    }
    out: dict[str, Any] = {"workers": workers, "batch_size": batch_size, "batches": batches, "repeats": repeats,
                           "cpus": os.cpu_count(),
                           "load_avg": os.getloadavg()[0], "figures": {}}
    for label, (kind, path, write, fps, keys) in cases.items():
        if not os.path.exists(path):
            write(path)
        ds = open_dataset(path, fps=fps)
        spec = WindowSpec.from_delta_timestamps({keys["camera"].replace("/", "."): [0.0],
                                                 keys["state"].replace("/", "."): [0.0],
                                                 keys["action"].replace("/", "."): [k / fps for k in range(CHUNK)]})
        windows = ds.windows(spec)
        if kind == "zarr":
            starts = np.concatenate([[0], np.cumsum(ds.lengths)[:-1]])
            episodes = [(int(s), int(t)) for s, t in zip(starts, ds.lengths)]
        elif kind == "aloha":
            episodes = [(ds.describe(e).split()[0], int(ds.lengths[e])) for e in range(len(ds))]
        else:
            episodes = [(ds.describe(e).split()[-1], int(ds.lengths[e])) for e in range(len(ds))]
        plain = PlainWindows(kind, path, keys, episodes)
        assert len(plain) == len(windows)
        generator = lambda: torch.Generator().manual_seed(0)  # noqa: E731 - the same order for every loader
        loaders = {
            "mmfeed windows": lambda: (DataLoader(windows, batch_size=batch_size, shuffle=True, num_workers=workers,
                                                  generator=generator()), batches),
            "plain loop in torch DataLoader": lambda: (torch.utils.data.DataLoader(
                plain, batch_size=batch_size, shuffle=True, num_workers=workers, generator=generator()), batches),
            "plain loop, one process": lambda: (torch.utils.data.DataLoader(
                plain, batch_size=batch_size, shuffle=True, num_workers=0, generator=generator()), batches // 2),
        }
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in loaders}
        for _ in range(repeats):  # interleaved, so a busy moment of the machine falls on every loader alike
            for name, make in loaders.items():
                runs[name].append(_measure(*make()))
        out["figures"][label] = {name: {k: float(np.median([r[k] for r in rs])) for k in rs[0]}
                                 for name, rs in runs.items()}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="measurements of each figure, median reported")
    parser.add_argument("--folder", default=None, help="where the datasets are written (kept; default a new "
                        "temporary folder)")
    parser.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    result = run(args.workers, args.batches, args.batch_size, args.folder, args.repeats)
    text = json.dumps(result, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)  # noqa: T201 - a command-line tool's output


if __name__ == "__main__":
    main()
