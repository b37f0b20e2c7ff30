r"""Record real LeRobot's ``LeRobotDataset[i]`` items and ``meta`` on the corpus, the oracle of ``mmfeed.lerobot``.

For every dataset of the corpus (``make_corpus.py``) and a spread of indices (the first and last samples, the
edges of episodes, a few between), in three settings: no ``delta_timestamps``, the corpus's window
(``make_corpus.WINDOWS``), and that window over a subset of the episodes (``episodes=``), it saves every key of
LeRobot 0.4.4's item: its type (a tensor's dtype and shape, or a str), and its values: ``items.npz`` holds the
arrays (camera frames, float32 in [0, 1], kept as uint8 ``round(x * 255)``, so within 1/255 of LeRobot's, for
every other sample; for every sample the frame index drawn into each picture, ``mmfeed.testing.read_index``),
``items.json`` the types, texts and what ``LeRobotDataset`` and its ``meta`` say: ``len``, ``num_frames``,
``num_episodes``, ``fps``, ``features``, ``meta.info``, ``meta.stats``, ``meta.episodes`` (its columns),
``meta.tasks``, the key lists, ``robot_type``, ``total_episodes`` and ``total_frames``; and the keys, dtypes and
shapes of the first batch ``torch.utils.data.DataLoader(ds, batch_size=4)`` makes. ``tests/test_lerobot_class.py``
compares ``mmfeed.lerobot.LeRobotDataset`` with them in CI, without LeRobot.

Run from the repository root with the python of a LeRobot 0.4.4 venv (the recipe in
``mmfeed.bench.lerobot_compare``)::

    HF_HUB_OFFLINE=1 LD_LIBRARY_PATH=/work/lerobot-venv/ffmpeg-links /work/lerobot-venv/bin/python \
        tests/lerobot_corpus/record_items.py

``--v21`` records, with the python of the LeRobot 0.3.3 venv (``make_corpus.py``'s recipe), the v2.1 directories
LeRobot 0.3.3 reads and 0.4 refuses (``v21_raw``, ``v21_images``) into ``items_v21.json`` and ``items_v21.npz``:
the same items, without ``meta`` (0.3.3 keeps it in other shapes)::

    HF_HUB_OFFLINE=1 LD_LIBRARY_PATH=/work/lerobot-venv/ffmpeg-links /work/lerobot21-venv/bin/python \
        tests/lerobot_corpus/record_items.py --v21
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SPREAD = 8
"""Samples recorded per dataset and setting."""
SUBSETS = {"rowgroups": [3, 7, 8, 20], "chunked": [1, 4, 5, 11], "images": [0, 2, 5], "edge": [1, 3, 4, 7],
           "v21": [2, 3, 6], "v21_raw": [2, 3, 6], "v21_images": [1, 2, 5]}
V21 = {"v21_raw": "v21", "v21_images": "v21_images"}
"""The v2.1 directories ``--v21`` records, and whose window (``make_corpus.WINDOWS``) each takes."""
"""The episodes of the ``episodes=`` setting, per dataset."""


def corpus_windows() -> dict:
    spec = importlib.util.spec_from_file_location("make_corpus", HERE / "make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.WINDOWS


def indices(ds) -> list[int]:
    """A spread of the dataset's indices: the first and last, an episode's first and last step, a few between."""
    n = len(ds)
    episode = [int(x) for x in ds.hf_dataset["episode_index"]]
    edges = [i for i in range(1, n) if episode[i] != episode[i - 1]]
    picked = {0, n - 1, *np.linspace(0, n - 1, SPREAD - 4).round().astype(int).tolist()}
    if edges:
        picked |= {edges[0] - 1, edges[0], edges[len(edges) // 2]}
    return sorted(picked)[:SPREAD + 2]


def jsonable(value):
    """numpy and tuples as JSON."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return {"ndarray": value.tolist(), "dtype": str(value.dtype), "shape": list(value.shape)}
    if isinstance(value, np.generic):
        return value.item()
    return value


def record_item(item: dict, cameras: list[str], prefix: str, arrays: dict, frames: bool) -> dict:
    """The type of every key of ``item`` (its values into ``arrays`` under ``prefix/key``; a camera's frames only
    where ``frames``, and always the frame index drawn into each of its pictures, under ``prefix/key.pattern``)."""
    import torch

    from mmfeed.testing import read_index

    out = {}
    for key, value in item.items():
        if isinstance(value, str):
            out[key] = {"type": "str", "value": value}
            continue
        assert isinstance(value, torch.Tensor), (key, type(value))
        array = value.numpy()
        entry = {"type": "tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
        if key in cameras:
            entry["min"], entry["max"] = float(array.min()), float(array.max())
            array = np.rint(array * 255).astype(np.uint8)
            hwc = np.moveaxis(array, -3, -1)
            arrays[f"{prefix}/{key}.pattern"] = read_index(hwc.reshape(-1, *hwc.shape[-3:])).reshape(hwc.shape[:-3])
            entry["stored"] = "uint8 round(x*255)" if frames else "pattern"
            if not frames:
                out[key] = entry
                continue
        arrays[f"{prefix}/{key}"] = array
        out[key] = entry
    return out


def record(name: str, window: dict, arrays: dict, meta: bool = True) -> dict:
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = HERE / name
    out = {}
    settings = [("plain", {}), ("delta", {"delta_timestamps": window})]
    if meta:  # LeRobot 0.3.3 indexes its episode ranges by episode_index with episodes= and delta_timestamps,
        # which fails for any subset but the first episodes: the setting is recorded from 0.4.4 only
        settings.append(("episodes", {"delta_timestamps": window, "episodes": SUBSETS[name]}))
    for setting, kwargs in settings:
        ds = LeRobotDataset(f"local/{name}", root=root, video_backend="torchcodec", **kwargs)
        cameras = list(ds.meta.camera_keys)
        items = {}
        for k, i in enumerate(indices(ds)):
            items[str(i)] = record_item(ds[i], cameras, f"{name}/{setting}/{i}", arrays, frames=k % 2 == 0)
        batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False)))
        out[setting] = {
            "kwargs": jsonable(kwargs), "len": len(ds), "num_frames": ds.num_frames, "num_episodes": ds.num_episodes,
            "items": items,
            "batch": {k: ({"type": "list", "value": v} if isinstance(v, list) else
                          {"type": "tensor", "dtype": str(v.dtype).removeprefix("torch."), "shape": list(v.shape)})
                      for k, v in batch.items()},
        }
        if setting == "plain" and meta:
            meta = ds.meta
            episodes = meta.episodes
            out["meta"] = {
                "fps": ds.fps, "features": jsonable(ds.features), "info": jsonable(meta.info),
                "stats": jsonable(meta.stats),
                "episodes": {c: jsonable(list(episodes[c])) for c in episodes.column_names},
                "tasks": {"index": list(meta.tasks.index), "columns": {c: jsonable(meta.tasks[c].tolist())
                                                                       for c in meta.tasks.columns}},
                "camera_keys": meta.camera_keys, "video_keys": meta.video_keys, "image_keys": meta.image_keys,
                "robot_type": meta.robot_type, "total_episodes": meta.total_episodes,
                "total_frames": meta.total_frames, "total_tasks": meta.total_tasks,
                "stats_types": {f: {s: [str(v.dtype), list(v.shape)] for s, v in st.items()}
                                for f, st in meta.stats.items()},
            }
    return out


def main() -> None:
    import lerobot

    windows = corpus_windows()
    v21 = "--v21" in sys.argv[1:]
    names = [a for a in sys.argv[1:] if a != "--v21"] or (sorted(V21) if v21 else
                                                           sorted(n for n in windows if n not in V21))
    arrays: dict[str, np.ndarray] = {}
    version = getattr(lerobot, "__version__", None) or ("0.3.3" if v21 else "0.4.4")
    oracle = {"lerobot": version, "datasets": {}}
    for name in names:
        oracle["datasets"][name] = record(name, windows[V21.get(name, name)], arrays, meta=not v21)
        print(f"{name}: recorded", file=sys.stderr)
    stem = "items_v21" if v21 else "items"
    np.savez_compressed(HERE / f"{stem}.npz", **arrays)
    (HERE / f"{stem}.json").write_text(json.dumps(oracle, indent=None, separators=(",", ":")) + "\n")
    size = (HERE / f"{stem}.npz").stat().st_size + (HERE / f"{stem}.json").stat().st_size
    print(f"{stem}.npz + {stem}.json: {size / 1024:.0f} KB", file=sys.stderr)


if __name__ == "__main__":
    main()
