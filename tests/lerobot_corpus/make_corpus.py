r"""Regenerate the LeRobot conformance corpus: small datasets written by real LeRobot, with LeRobot's own samples.

Every directory here was written by LeRobot itself, in the layouts real datasets have and mmfeed's own writer
never produces; beside each, ``<name>.oracle.npz`` and ``<name>.oracle.json`` hold the samples
``LeRobotDataset(..., delta_timestamps=...)[i]`` returned for every index ``i`` (the oracle
``tests/test_lerobot_corpus.py`` compares mmfeed with, in CI, without LeRobot):

- ``rowgroups``: 25 episodes in LeRobot's default layout: ``meta/episodes`` in row groups of ten (LeRobot's
  ``metadata_buffer_size``), one data file of one row group per episode, one AV1 video of every episode.
- ``chunked``: 12 episodes with file-size limits so small, metadata flushed every 3 episodes and
  ``chunks_size=2``, that ``meta/episodes``, the data and the videos (two H.264 cameras) are spread over many
  files and chunks, each video file holding several episodes.
- ``images``: an image feature (PNG bytes in the parquet) beside an AV1 camera and a depth map (a video of
  depth rendered to 8 bits, as LeRobot stores depth: three equal channels).
- ``edge``: episodes of 1 step among longer ones, tasks shared between episodes and changing within episodes,
  scalar, boolean, integer and float64 features.
- ``v21``: a dataset written by LeRobot 0.3.3 in the v2.1 layout (a file per episode, jsonl metadata), converted
  to v3.0 by LeRobot 0.4.4's own converter (``lerobot.datasets.v30.convert_dataset_v21_to_v30``).
- ``v21_raw``: the same dataset (the same seeded values, frame for frame) as LeRobot 0.3.3 wrote it, unconverted,
  which mmfeed reads directly; it has no oracle of its own (LeRobot 0.4 refuses v2.1): its samples are ``v21``'s.
- ``v21_images``: LeRobot 0.3.3's v2.1 layout with an image feature (PNG in the parquet) beside an AV1 camera,
  ``chunks_size=2`` (the episodes' files over three chunks), tasks changing within some episodes; unconverted, its
  oracle LeRobot 0.3.3's own items (``record_items.py --v21``).

Frames carry their global frame index drawn into the pixels (:func:`mmfeed.testing.frame_pattern`), so a frame
can be checked exactly whatever two decoders' colour rounding; the oracle keeps that index of every delivered
frame and, for a few samples, the frames themselves.

Run from the repository root with the python of a LeRobot 0.4.4 venv (the recipe in
``mmfeed.bench.lerobot_compare``; it sees mmfeed through ``--system-site-packages``) and, for ``v21``, of a venv
with LeRobot 0.3.3::

    python3 -m venv --system-site-packages /work/lerobot21-venv
    /work/lerobot21-venv/bin/pip install --no-deps lerobot==0.3.3
    # 0.3.3 runs on the 0.4.4 venv's dependencies (datasets, huggingface-hub, ...):
    echo /work/lerobot-venv/lib/python3.11/site-packages \
        > /work/lerobot21-venv/lib/python3.11/site-packages/lerobot044.pth
    HF_HUB_OFFLINE=1 LD_LIBRARY_PATH=/work/lerobot-venv/ffmpeg-links /work/lerobot-venv/bin/python \
        tests/lerobot_corpus/make_corpus.py --v21-python /work/lerobot21-venv/bin/python

Everything is seeded; the videos' bytes depend on the encoder builds, the samples do not.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FPS = 10
FRAMES_KEPT = 12
"""Samples whose frames the oracle keeps whole (evenly spread); every sample's frame indices are kept."""


def pattern(index: int, height: int, width: int) -> np.ndarray:
    """The frame of global frame ``index``: its index drawn into the pixels (uint8 ``[H, W, 3]``)."""
    from mmfeed.testing import frame_pattern

    return frame_pattern(1, height=height, width=width, start=index)[0]


def depth(index: int, height: int, width: int) -> np.ndarray:
    """A depth map rendered to 8 bits (three equal channels, as LeRobot stores depth) under the pattern's index
    band: a ramp in depth over the grey of the pattern."""
    from mmfeed.testing.video import _band_height

    frame = pattern(index, height, width)
    grey = frame.mean(axis=2)
    band = _band_height(height)
    grey[band:] = (grey[band:] * 0.5 + np.linspace(0, 120, width)[None, :]).clip(0, 255)
    return np.repeat(grey.astype(np.uint8)[:, :, None], 3, axis=2)


CAMERA = (48, 64, 3)
WRIST = (24, 32, 3)


def video(shape=CAMERA) -> dict:
    return {"dtype": "video", "shape": shape, "names": ["height", "width", "channels"]}


def vector(n: int, dtype: str = "float32") -> dict:
    return {"dtype": dtype, "shape": (n,), "names": [f"d{i}" for i in range(n)]}


# name -> (features, episode lengths, tasks per episode (a list of per-step tasks or one text), settings)
def layouts() -> dict:
    rng = np.random.default_rng(0)
    tasks3 = ["pick the red cube", "place it in the bin", "open the drawer"]
    edge_lengths = [1, 7, 1, 1, 5, 2, 1, 9, 3]
    edge_tasks = []
    for e, n in enumerate(edge_lengths):  # some episodes change task midway
        edge_tasks.append([tasks3[(e + (t >= n // 2 if e % 2 else 0)) % 3] for t in range(n)])
    return {
        "rowgroups": dict(
            features={"observation.images.top": video(), "observation.state": vector(3), "action": vector(2)},
            lengths=rng.integers(2, 9, 25).tolist(), tasks=[tasks3[e % 3] for e in range(25)], vcodec="libsvtav1"),
        "chunked": dict(
            features={"observation.images.left": video(), "observation.images.right": video(WRIST),
                      "observation.state": vector(4), "action": vector(4)},
            lengths=rng.integers(3, 7, 12).tolist(), tasks=[tasks3[e % 2] for e in range(12)], vcodec="h264",
            chunks=dict(chunks_size=2, data_files_size_in_mb=0.002, video_files_size_in_mb=0.006),
            create=dict(metadata_buffer_size=3)),
        "images": dict(
            features={"observation.images.top": video(), "observation.images.depth": video(),
                      "observation.images.wrist": {"dtype": "image", "shape": WRIST,
                                                   "names": ["height", "width", "channels"]},
                      "observation.state": vector(2), "action": vector(2)},
            lengths=[4, 6, 3, 5, 2, 6], tasks=[tasks3[0]] * 6, vcodec="libsvtav1"),
        "edge": dict(
            features={"observation.images.top": video(), "observation.state": vector(3),
                      "observation.velocity": vector(3, "float64"), "action": vector(2),
                      "next.reward": {"dtype": "float32", "shape": (1,), "names": None},
                      "next.done": {"dtype": "bool", "shape": (1,), "names": None},
                      "observation.contact": {"dtype": "int64", "shape": (2,), "names": ["left", "right"]}},
            lengths=edge_lengths, tasks=edge_tasks, vcodec="libsvtav1"),
        "v21": dict(
            features={"observation.images.top": video(), "observation.state": vector(3), "action": vector(2)},
            lengths=[5, 1, 8, 4, 6, 3, 7, 2], tasks=[tasks3[e % 3] for e in range(8)], vcodec="libsvtav1"),
        "v21_images": dict(
            features={"observation.images.top": video(), "observation.images.wrist": {
                "dtype": "image", "shape": WRIST, "names": ["height", "width", "channels"]},
                "observation.state": vector(2), "action": vector(2)},
            lengths=[3, 5, 1, 4, 2, 3], tasks=[tasks3[e % 2] if e % 3 else [tasks3[(t >= 1) + 1] for t in range(n)]
                                              for e, n in enumerate([3, 5, 1, 4, 2, 3])],
            vcodec="libsvtav1", v21_chunks_size=2),
    }


WINDOWS = {  # what each sample asks (LeRobot's delta_timestamps); every other feature is read at the anchor
    "rowgroups": {"observation.images.top": [-2 / FPS, -1 / FPS, 0.0], "observation.state": [-1 / FPS, 0.0],
                  "action": [i / FPS for i in range(4)]},
    "chunked": {"observation.images.left": [-1 / FPS, 0.0], "observation.images.right": [0.0, 1 / FPS],
                "observation.state": [0.0], "action": [i / FPS for i in range(3)]},
    "images": {"observation.images.top": [-1 / FPS, 0.0], "observation.images.depth": [0.0],
               "observation.images.wrist": [-1 / FPS, 0.0], "action": [0.0, 1 / FPS]},
    "edge": {"observation.images.top": [-1 / FPS, 0.0], "observation.state": [0.0, 1 / FPS],
             "observation.velocity": [-1 / FPS, 0.0], "next.reward": [0.0, 1 / FPS], "next.done": [0.0],
             "observation.contact": [0.0], "action": [i / FPS for i in range(5)]},
    "v21": {"observation.images.top": [-1 / FPS, 0.0], "observation.state": [0.0],
            "action": [i / FPS for i in range(3)]},
    "v21_images": {"observation.images.top": [-1 / FPS, 0.0], "observation.images.wrist": [-1 / FPS, 0.0],
                   "observation.state": [0.0], "action": [i / FPS for i in range(3)]},
}


def frames_of(name: str, spec: dict, lengths: list[int], tasks: list) -> list[dict]:
    """Every frame of the dataset ``name`` as the dicts LeRobot's ``add_frame`` takes, episode by episode."""
    rng = np.random.default_rng(sum(map(ord, name)))
    out, index = [], 0
    for e, n in enumerate(lengths):
        episode = []
        for t in range(n):
            task = tasks[e][t] if isinstance(tasks[e], list) else tasks[e]
            frame: dict = {"task": task}
            for key, ft in spec.items():
                if ft["dtype"] in ("video", "image"):
                    h, w, _ = ft["shape"]
                    frame[key] = depth(index, h, w) if key.endswith("depth") else pattern(index, h, w)
                elif ft["dtype"] == "bool":
                    frame[key] = np.array([t == n - 1], dtype=bool)
                elif ft["dtype"] == "int64":
                    frame[key] = rng.integers(0, 5, ft["shape"]).astype(np.int64)
                else:
                    frame[key] = rng.standard_normal(ft["shape"]).astype(ft["dtype"])
            episode.append(frame)
            index += 1
        out.append(episode)
    return out


def write(name: str, root: Path) -> None:
    """Write the dataset ``name`` at ``root`` with the LeRobot of this python (0.4.4, or 0.3.3 for v21)."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    layout = layouts()[name]
    old = name.startswith("v21")  # written by 0.3.3, which encodes AV1 and has no vcodec argument
    codec = {"vcodec": layout["vcodec"]} if not old else {}
    ds = LeRobotDataset.create(f"local/{name}", fps=FPS, features=layout["features"], root=root, use_videos=True,
                               **codec, **layout.get("create", {}))
    if layout.get("chunks"):
        ds.meta.update_chunk_settings(**layout["chunks"])
    if layout.get("v21_chunks_size"):  # 0.3.3: episode_chunk = episode_index // chunks_size, kept in info.json
        ds.meta.info["chunks_size"] = layout["v21_chunks_size"]
    task_argument = "task" in inspect.signature(ds.add_frame).parameters  # 0.3.3: add_frame(frame, task)
    for episode in frames_of(name, layout["features"], layout["lengths"], layout["tasks"]):
        for frame in episode:
            frame = dict(frame)
            if task_argument:
                ds.add_frame(frame, task=frame.pop("task"))
            else:
                ds.add_frame(frame)
        ds.save_episode()
    if hasattr(ds, "finalize"):
        ds.finalize()


def oracle(name: str, root: Path) -> None:
    """LeRobot's samples of ``root`` for every index, saved beside the dataset as ``<name>.oracle.npz/.json``."""
    import torch
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    window = WINDOWS[name]
    ds = LeRobotDataset(f"local/{name}", root=root, delta_timestamps=window, video_backend="torchcodec")
    n = len(ds)
    keep = set(np.linspace(0, n - 1, min(FRAMES_KEPT, n)).round().astype(int).tolist())
    cameras = ds.meta.camera_keys
    arrays: dict[str, list] = {}
    tasks = []
    for i in range(n):
        sample = ds[i]
        tasks.append(sample.pop("task"))
        for key, value in sample.items():
            value = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            if key in cameras:  # float [0, 1] CHW -> uint8 HWC, exactly as decoded
                value = np.rint(value * 255).astype(np.uint8)
                value = np.moveaxis(value, -3, -1)
                from mmfeed.testing import read_index

                flat = value.reshape(-1, *value.shape[-3:])
                arrays.setdefault(f"{key}.pattern", []).append(read_index(flat).reshape(value.shape[:-3]))
                if i in keep:
                    arrays.setdefault(f"{key}.frames", []).append(value)
                continue
            arrays.setdefault(key, []).append(value)
    saved = {k: np.stack(v) for k, v in arrays.items()}
    saved["frames_kept"] = np.array(sorted(keep), dtype=np.int64)
    np.savez_compressed(HERE / f"{name}.oracle.npz", **saved)
    import lerobot

    (HERE / f"{name}.oracle.json").write_text(json.dumps({
        "lerobot": lerobot.__version__ if hasattr(lerobot, "__version__") else "0.4.4",
        "delta_timestamps": window, "samples": n, "tasks": tasks, "cameras": list(cameras),
        "written_by": "lerobot 0.3.3 (v2.1), converted by lerobot 0.4.4" if name == "v21" else "lerobot 0.4.4",
    }, indent=1) + "\n")


def convert_v21(parent: Path, name: str) -> None:
    """LeRobot 0.4.4's converter over ``parent/local/<name>`` (v2.1), in place, nothing pushed."""
    from lerobot.datasets.v30.convert_dataset_v21_to_v30 import convert_dataset

    convert_dataset(f"local/{name}", root=parent, push_to_hub=False, force_conversion=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="datasets to regenerate (default: all)")
    parser.add_argument("--v21-python", help="python of a venv with LeRobot 0.3.3 (for 'v21')")
    parser.add_argument("--write-only", metavar="DIR", help=argparse.SUPPRESS)  # child: write one dataset
    args = parser.parse_args()
    if args.write_only:
        write(args.only[0], Path(args.write_only))
        return
    names = args.only or [*layouts(), "v21_raw"]
    for name in names:
        if name == "v21_images":  # written by 0.3.3 and kept as it is
            if not args.v21_python:
                parser.error("--v21-python (a venv with lerobot 0.3.3) is needed for the v21_images dataset")
            with tempfile.TemporaryDirectory(prefix="mmfeed-corpus-") as tmp:
                root = Path(tmp) / "local" / name
                subprocess.run([args.v21_python, __file__, "--only", name, "--write-only", str(root)], check=True,
                               env={**os.environ, "PYTHONNOUSERSITE": "1"})
                shutil.rmtree(root / "images", ignore_errors=True)  # the PNGs LeRobot wrote before embedding them
                shutil.rmtree(HERE / name, ignore_errors=True)
                shutil.copytree(root, HERE / name)
            continue
        if name == "v21_raw":  # v21 as LeRobot 0.3.3 writes it, kept unconverted; v21's oracle is its oracle
            if not args.v21_python:
                parser.error("--v21-python (a venv with lerobot 0.3.3) is needed for the v21_raw dataset")
            with tempfile.TemporaryDirectory(prefix="mmfeed-corpus-") as tmp:
                root = Path(tmp) / "local" / "v21"
                subprocess.run([args.v21_python, __file__, "--only", "v21", "--write-only", str(root)], check=True,
                               env={**os.environ, "PYTHONNOUSERSITE": "1"})
                shutil.rmtree(root / "images", ignore_errors=True)  # empty: no image features
                shutil.rmtree(HERE / name, ignore_errors=True)
                shutil.copytree(root, HERE / name)
            continue
        with tempfile.TemporaryDirectory(prefix="mmfeed-corpus-") as tmp:
            root = Path(tmp) / "local" / name
            if name == "v21":
                if not args.v21_python:
                    parser.error("--v21-python (a venv with lerobot 0.3.3) is needed for the v21 dataset")
                subprocess.run([args.v21_python, __file__, "--only", name, "--write-only", str(root)], check=True,
                               env={**os.environ, "PYTHONNOUSERSITE": "1"})
                convert_v21(Path(tmp), name)
                shutil.rmtree(Path(tmp) / "local" / f"{name}_old", ignore_errors=True)
            else:
                write(name, root)
            target = HERE / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(root, target)
        oracle(name, target)
        size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
        print(f"{name}: {size / 1024:.0f} KB", file=sys.stderr)


if __name__ == "__main__":
    main()
