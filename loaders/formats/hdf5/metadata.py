"""What an HDF5 demonstration file holds, read from its metadata alone (group and dataset headers, attributes, the
small ``mask/`` and ``compress_len`` datasets), and checked against what the episode reader needs: every episode
has every feature, with the first episode's dtype and step shape and one row per step. What disagrees is a one-line
ValueError naming the file and the key.

Two layouts:

- ``robomimic`` (also LIBERO's): one file, many episodes, ``data/demo_<k>/{actions, obs/<name>, next_obs/<name>,
  rewards, dones, states, ...}``; ``mask/<split>`` lists the demos of each split by name; ``data`` attributes
  ``env_args`` and, in LIBERO, ``problem_info`` (JSON, with the ``language_instruction``). A folder of such files
  (LIBERO's suites: one file per task) reads as their episodes one after the other.
- ``aloha`` (ACT/ALOHA): one file per episode in a folder, ``/action``, ``/observations/qpos``, ``qvel``,
  ``effort`` and ``/observations/images/<camera>``: raw uint8 ``[T, H, W, 3]``, or JPEG (as ``cv2.imencode``
  wrote it) zero-padded to ``[T, width]`` with the picture lengths in ``/compress_len`` ``[cameras, T]``.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmfeed.loaders.transport.json_limits import check_json

__all__ = ["HDF5_SUFFIXES", "LAYOUTS", "Episode", "Layout", "h5py_module", "hdf5_files", "natural_key", "read_layout"]

HDF5_SUFFIXES = (".hdf5", ".h5", ".he5", ".hdf")
LAYOUTS = ("robomimic", "aloha")
log = logging.getLogger(__name__)
_IMAGES = "observations/images"


def h5py_module() -> Any:
    """The h5py module, or an ImportError naming the extra that installs it."""
    try:
        import h5py
    except ImportError as err:
        raise ImportError("reading HDF5 demonstrations needs h5py: pip install 'mmfeed[hdf5]' (or pip install h5py)"
                          ) from err
    return h5py


def natural_key(name: str) -> tuple:
    """Sort key that orders the numbers inside names by value: ``demo_2`` before ``demo_10``."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part)


def hdf5_files(path: str) -> list[str]:
    """The HDF5 files of ``path``: the file itself, or a folder's ``*.hdf5`` / ``*.h5`` files in natural order."""
    if os.path.isdir(path):
        files = sorted((e.path for e in os.scandir(path) if e.is_file() and e.name.lower().endswith(HDF5_SUFFIXES)),
                       key=lambda p: natural_key(os.path.basename(p)))
        if not files:
            raise FileNotFoundError(f"{path}: the folder holds no HDF5 files ({', '.join(HDF5_SUFFIXES)})")
        return files
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such HDF5 file or folder")
    return [path]


def open_file(path: str) -> Any:
    """``h5py.File(path, "r")``; a file HDF5 cannot open (truncated, not HDF5) is a ValueError naming it."""
    h5py = h5py_module()
    try:
        return h5py.File(path, "r")
    except OSError as err:
        if isinstance(err, FileNotFoundError):
            raise
        reason = " ".join(str(err).split())
        raise ValueError(f"{path}: not a readable HDF5 file ({reason}); is it truncated or still being written?"
                         ) from err


@dataclass(frozen=True)
class Column:
    """One dataset of an episode's group: its path there (``obs/agentview_rgb``), dtype and step shape;
    ``compressed``: JPEG pictures zero-padded to a width (the step shape is then ``(width,)``)."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    compressed: bool = False

    @property
    def name(self) -> str:
        return self.path.replace("/", ".")


@dataclass
class Episode:
    """One episode: its file (index into the source's files), its group (``data/demo_3``; ``""`` for the whole
    file), its length and, for JPEG cameras, each one's picture lengths ``[T]`` (None where the file has none)."""

    file: int
    group: str
    length: int
    compress_len: dict[str, np.ndarray | None] = field(default_factory=dict)

    def key(self, path: str) -> str:
        return f"{self.group}/{path}" if self.group else path


@dataclass
class Layout:
    """What one file holds: its layout, episodes, task text and, for the message asking for ``fps=``, the control
    frequency its ``env_args`` name (robomimic), if any."""

    layout: str
    episodes: list[Episode]
    task: str = ""
    control_freq: float | None = None


def _walk(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every dataset under ``group`` with its path relative to it, in name order."""
    h5py = h5py_module()
    for name in sorted(group, key=natural_key):
        item = group.get(name, getlink=False)
        path = f"{prefix}{name}"
        if isinstance(item, h5py.Group):
            yield from _walk(item, f"{path}/")
        elif isinstance(item, h5py.Dataset):
            yield path, item


def columns_of(f: Any, episode: Episode, layout: str, where: str) -> list[Column]:
    """The per-step datasets of ``episode`` (numbers and booleans with one row per step; ``compress_len``,
    scalars, text and datasets of another number of rows left out, the last with a log line), as the features
    every episode must have."""
    group = f[episode.group] if episode.group else f
    out = []
    for path, ds in _walk(group):
        if layout == "aloha" and path == "compress_len":
            continue
        if ds.ndim == 0 or ds.dtype.kind not in "biuf":
            continue
        if ds.shape[0] != episode.length:
            log.info("%s: dataset %r has %d rows, not one per step (%d): left out", where, episode.key(path),
                     ds.shape[0], episode.length)
            continue
        compressed = layout == "aloha" and path.startswith(f"{_IMAGES}/") and ds.dtype == np.uint8 and ds.ndim == 2
        out.append(Column(path, str(ds.dtype), tuple(ds.shape[1:]), compressed))
    if not out:
        raise ValueError(f"{where}: {episode.group or '/'} holds no per-step numeric datasets")
    return out


def check_episode(f: Any, episode: Episode, columns: list[Column], path: str, first: str) -> None:
    """``episode`` has every column, with its dtype and step shape (a JPEG camera: any padded width) and one row
    per step; ValueError naming the file and key otherwise."""
    h5py = h5py_module()
    for column in columns:
        key = episode.key(column.path)
        ds = f.get(key)
        if not isinstance(ds, h5py.Dataset):
            raise ValueError(f"{path}: dataset {key!r} is missing ({first} has {column.path!r}); every episode "
                             "needs the same datasets")
        shape = tuple(ds.shape[1:]) if ds.ndim else None
        same = ds.ndim == 2 if column.compressed else shape == column.shape
        if str(ds.dtype) != column.dtype or not same:
            raise ValueError(f"{path}: dataset {key!r} is {ds.dtype} {list(ds.shape)}, but {first} has "
                             f"{column.dtype} {['T', *column.shape]}")
        if ds.shape[0] != episode.length:
            raise ValueError(f"{path}: dataset {key!r} has {ds.shape[0]} rows, but the episode has {episode.length} "
                             f"steps; every per-step dataset has one row per step")


def detect_layout(f: Any) -> str | None:
    """``"robomimic"`` when the file has a ``data`` group of demos, ``"aloha"`` when it has ``/action`` and
    ``/observations``, else None."""
    data = f.get("data")
    if data is not None and hasattr(data, "keys") and any(k.startswith("demo") for k in data.keys()):
        return "robomimic"
    if "action" in f and "observations" in f:
        return "aloha"
    return None


def read_layout(f: Any, path: str, layout: str | None, split: str | None) -> Layout:
    """The episodes of one open file, in ``layout`` (None: detected)."""
    found = detect_layout(f)
    if layout is None:
        if found is None:
            raise ValueError(f"{path}: neither a robomimic/LIBERO file (data/demo_<k> groups) nor an ACT/ALOHA "
                             "episode (/action and /observations); pass layout= if it is one of them")
        layout = found
    if layout == "robomimic":
        return _robomimic(f, path, split)
    if split is not None:
        raise ValueError(f"{path}: split={split!r} names a robomimic mask, but the file is read in the aloha layout "
                         "(one episode per file, no masks); drop split=")
    return _aloha(f, path)


def _json_attr(attrs: Any, name: str, where: str) -> Any:
    raw = attrs.get(name)
    if raw is None:
        return None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", "replace")
    check_json(str(raw), f"{where}: attribute {name!r} of 'data'")  # the limits of every metadata file's JSON
    try:
        return json.loads(str(raw))
    except ValueError as err:
        raise ValueError(f"{where}: attribute {name!r} of 'data' is not JSON ({err})") from err


def _robomimic(f: Any, path: str, split: str | None) -> Layout:
    h5py = h5py_module()
    data = f.get("data")
    if not isinstance(data, h5py.Group):
        raise ValueError(f"{path}: no group 'data' (the robomimic layout keeps its demos in data/demo_<k>)")
    names = sorted((k for k in data.keys() if isinstance(data.get(k, getlink=False), h5py.Group)), key=natural_key)
    if split is not None:
        masks = f.get("mask")
        available = sorted(masks.keys()) if isinstance(masks, h5py.Group) else []
        if split not in available:
            raise ValueError(f"{path}: no mask {f'mask/{split}'!r} for split={split!r}; the file's splits are "
                             f"{available or 'none (no mask group)'}")
        listed = [n.decode() if isinstance(n, bytes) else str(n) for n in np.asarray(masks[split][()]).reshape(-1)]
        unknown = [n for n in listed if n not in names]
        if unknown:
            raise ValueError(f"{path}: mask/{split} lists {unknown[:3]}, which data has no group for")
        wanted = set(listed)
        names = [n for n in names if n in wanted]
    episodes = []
    for name in names:
        demo = data[name]
        clock = demo.get("actions")
        if not isinstance(clock, h5py.Dataset) or clock.ndim == 0:
            raise ValueError(f"{path}: dataset 'data/{name}/actions' is missing; a robomimic demo keeps its actions "
                             "there, one row per step")
        episodes.append(Episode(0, f"data/{name}", int(clock.shape[0])))
    problem = _json_attr(data.attrs, "problem_info", path)
    task = str(problem.get("language_instruction", "")) if isinstance(problem, dict) else ""
    if isinstance(problem, dict) and isinstance(problem.get("language_instruction"), list):
        task = " ".join(map(str, problem["language_instruction"]))
    env_args = _json_attr(data.attrs, "env_args", path)
    freq = None
    if isinstance(env_args, dict) and isinstance(env_args.get("env_kwargs"), dict):
        value = env_args["env_kwargs"].get("control_freq")
        freq = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    return Layout("robomimic", episodes, task.strip(), freq)


def _aloha(f: Any, path: str) -> Layout:
    h5py = h5py_module()
    action = f.get("action")
    if not isinstance(action, h5py.Dataset) or action.ndim == 0:
        raise ValueError(f"{path}: dataset 'action' is missing; an ACT/ALOHA episode keeps its actions in /action, "
                         "one row per step")
    if not isinstance(f.get("observations"), h5py.Group):
        raise ValueError(f"{path}: group 'observations' is missing; an ACT/ALOHA episode keeps qpos and images there")
    episode = Episode(0, "", int(action.shape[0]))
    images = f.get(_IMAGES)
    cameras = sorted(images.keys(), key=natural_key) if isinstance(images, h5py.Group) else []
    jpeg = [c for c in cameras if isinstance(images[c], h5py.Dataset) and images[c].ndim == 2
            and images[c].dtype == np.uint8]
    lengths = f.get("compress_len")
    table = None
    if jpeg and lengths is not None:
        table = np.asarray(lengths[()])
        if table.ndim != 2 or table.shape[0] != len(jpeg) or table.shape[1] != episode.length:
            raise ValueError(f"{path}: dataset 'compress_len' is {list(table.shape)}, but the file has "
                             f"{len(jpeg)} JPEG cameras and {episode.length} steps ([cameras, T] expected)")
    for row, camera in enumerate(jpeg):
        name = f"{_IMAGES}/{camera}".replace("/", ".")
        if table is None:
            episode.compress_len[name] = None
            continue
        width = images[camera].shape[1]
        sizes = table[row].astype(np.int64)
        if (sizes <= 0).any() or (sizes > width).any():
            raise ValueError(f"{path}: dataset 'compress_len' row {row} ({camera}) has picture lengths "
                             f"{int(sizes.min())}..{int(sizes.max())}, outside 1..{width} (the padded width of "
                             f"{_IMAGES}/{camera})")
        episode.compress_len[name] = sizes
    return Layout("aloha", [episode])
