"""The workload of ``mmfeed bench``: its settings, its synthetic datasets (cached), its samples, and the baseline.

The default workload is a mixture of two embodiments (two datasets, one list given to ``open_dataset``): an arm
with one 320x240 camera at the 30 Hz control clock, and a robot with two 256x192 cameras (a front camera at
15 fps, a wrist camera at 30 fps); tasks are texts of 5 to 600 bytes. Its samples are of two kinds, side by side in
one epoch (:class:`WindowsAndChunks`): windowed policy samples (the last ``history`` frames of every camera at
its own rate, ``observation.state`` at the anchor, a ``horizon``-step ``action`` chunk, LeRobot-style) and
whole-episode chunks for a world model (every frame of every camera, state and action over up to
``chunk_steps`` steps, cut shorter where a chunk would not fit a row). Samples thus cost from about 1,100 to
8,000 tokens, and padding them is what a per-sample loader pays.

The baseline (:class:`PerSampleDataset`, under ``torch.utils.data.DataLoader``) reads the very same samples with
the same prices: each sample opens, seeks and decodes its own frames (the way LeRobot reads video) and every
batch is padded to its longest sample (:func:`pad_collate`). ``python -m mmfeed.bench.loader``: the one-camera
windows-only workload of earlier versions (or ``--lerobot-style``) measured as ``mmfeed bench`` measures.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmfeed.bench.common import cache_dir, forever
from mmfeed.codecs._pyav import decode_totals
from mmfeed.codecs.video import read_frames
from mmfeed.inspection import robot_window
from mmfeed.loaders import DataLoader, Packing, PlanConfig, PlannedDataset, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.clock import stage
from mmfeed.loaders.planned.reads import EpisodeReads, SampleRead
from mmfeed.loaders.planned.items import EpisodeItems
from mmfeed.loaders.sources.base import EpisodeRequest, EpisodeSource
from mmfeed.packing.samples import SampleTable
from mmfeed.testing.synth_dataset import VARIED_TASKS, SyntheticDataset, write_synthetic
from mmfeed.testing.synth_episodes import IMAGE_PREFIX

__all__ = ["Embodiment", "LoaderBench", "PerSampleDataset", "VARIED_TASKS", "WindowsAndChunks", "data_spec",
           "dataset_path", "pad_collate", "run_mmfeed"]

log = logging.getLogger(__name__)

DATASET_VERSION = 2
"""Part of the cache key of the synthetic datasets: bumped when what they hold changes (2: features by name)."""


@dataclass(frozen=True, kw_only=True)
class Embodiment:
    """One robot of a synthetic mixture: its cameras (feature ``observation.images.<camera>``), their frame size,
    the cameras that run at their own rate (``camera_fps``: ``((camera, fps), ...)``; others at the control clock)
    and its episodes (None: ``LoaderBench.episodes``)."""

    name: str
    cameras: tuple[str, ...]
    height: int
    width: int
    camera_fps: tuple[tuple[str, float], ...] = ()
    episodes: int | None = None


@dataclass(frozen=True, kw_only=True)
class LoaderBench(SyntheticDataset):
    """Settings of one loader workload (see the module docstring).

    The synthetic dataset's settings (format, episodes, lengths, size, codec, rates, cameras, tasks, seed) are
    :class:`~mmfeed.testing.synth_dataset.SyntheticDataset`'s.
    embodiments: a mixture of synthetic datasets, one per embodiment (their own cameras, size and rates; the
        other dataset settings shared); empty: the one dataset above.
    videos, video_fps: the video features read and their rates, for a given dataset (None: the synthetic
        cameras' features, at their rates).
    state, action: the features read at the anchor and as the action chunk (None: the dataset has none).
    history, horizon, stride: frames of each video before and at the anchor, action steps from the anchor on,
        steps between anchors.
    chunk_steps: whole-episode chunks (world model) of at most this many steps beside the windows; None: none.
    tokens_per_frame, capacity, rows_per_batch, episode_block: prices and the plan (``episode_block`` 0: samples
        shuffled across the whole epoch, as torch's sampler does; B > 0: batches from blocks of B episodes).
    workers, steps, warmup: loader processes, batches per measured stretch (None: from the stretch's seconds) and
        the fewest untimed batches before each stretch.
    """

    embodiments: tuple[Embodiment, ...] = ()
    videos: tuple[str, ...] | None = None
    video_fps: tuple[float, ...] | None = None
    state: str | None = "observation.state"
    action: str | None = "action"
    history: int = 4
    horizon: int = 50
    stride: int = 1
    chunk_steps: int | None = None
    tokens_per_frame: int = 256
    capacity: int = 8192
    rows_per_batch: int = 2
    episode_block: int = 2
    workers: int = 2
    steps: int | None = 24
    warmup: int = 3
    backend: str = "auto"

    def datasets(self) -> list[LoaderBench]:
        """One single-dataset setting per embodiment (each its own seed), or ``[self]``."""
        if not self.embodiments:
            return [self]
        return [replace(self, embodiments=(), cameras=e.cameras, height=e.height, width=e.width,
                        camera_fps=e.camera_fps, episodes=e.episodes or self.episodes, seed=self.seed + 1000 * k)
                for k, e in enumerate(self.embodiments)]

    @property
    def video_rates(self) -> dict[str, float]:
        """Every video feature a sample may read -> its rate."""
        if self.videos is not None:
            return dict(zip(self.videos, self.video_fps or (self.fps,) * len(self.videos)))
        out: dict[str, float] = {}
        for d in self.datasets():
            rates = dict(d.camera_fps)
            out.update({IMAGE_PREFIX + c: float(rates.get(c, d.fps)) for c in d.cameras})
        return out

    def synthetic(self) -> SyntheticDataset:
        """The synthetic dataset of a single-dataset setting (its format, episodes, size, codec, ...)."""
        return SyntheticDataset(**{f.name: getattr(self, f.name) for f in fields(SyntheticDataset)})

    @property
    def video_features(self) -> tuple[str, ...]:
        """The video features a sample may read."""
        return tuple(self.video_rates)

    def window(self) -> WindowSpec:
        """``history`` frames of every video (at its own rate), the state at the anchor, ``horizon`` actions."""
        return robot_window(self.video_rates, fps=self.fps, history=self.history, horizon=self.horizon,
                            state=self.state, action=self.action)

    def layout(self) -> TokenLayout:
        """``tokens_per_frame`` tokens per video frame; one per state and per action step (which chunks read)."""
        prices = {f: self.tokens_per_frame for f in self.video_features}
        if self.chunk_steps is not None:
            prices.update({f: 1 for f in (self.state, self.action) if f is not None})
        return TokenLayout(tokens_per_frame=prices)

    def given(self, source: EpisodeSource) -> LoaderBench:
        """These settings reading a given dataset: every video feature at its own rate, ``state`` and ``action``
        where the dataset has them, at its control clock."""
        videos = tuple(f for f, feature in source.features.items() if feature.kind == "video")
        if not videos:
            raise ValueError(f"{source.name}: no video features; mmfeed bench measures video loading (its "
                             f"features: {sorted(source.features)})")
        return replace(self, format="given", embodiments=(), videos=videos, cameras=(), fps=float(source.fps[0]),
                       video_fps=tuple(float(source.rates(f)[0]) for f in videos),
                       state=self.state if self.state in source.features else None,
                       action=self.action if self.action in source.features else None)

    def plan(self) -> PlanConfig:
        return PlanConfig(capacity=self.capacity, rows_per_batch=self.rows_per_batch, episode_block=self.episode_block)

    def packing(self) -> Packing:
        """The windows as ``mmfeed.DataLoader(packing=...)`` takes them (windows only: chunks beside windows are
        :class:`WindowsAndChunks`, see :meth:`planned`)."""
        if self.chunk_steps is not None:
            raise ValueError("windows beside chunks are no Packing; use LoaderBench.planned(source)")
        return Packing(layout=self.layout(), window=self.window(), stride=self.stride, plan=self.plan(),
                       seed=self.seed)

    def items(self, source: EpisodeSource) -> EpisodeItems | WindowsAndChunks:
        """The samples of ``source``: windows, and beside them whole-episode chunks with ``chunk_steps``."""
        windows = EpisodeItems(source, layout=self.layout(), window=self.window(), stride=self.stride,
                               capacity=self.capacity)
        if self.chunk_steps is None:
            return windows
        chunks = EpisodeItems(source, layout=windows.layout, max_length=self.chunk_steps, capacity=self.capacity)
        return WindowsAndChunks(windows, chunks)

    def planned(self, source: EpisodeSource, dataset: type = PlannedDataset) -> PlannedDataset:
        """The planned dataset of ``source`` (one rank of one) that mmfeed's loader iterates."""
        return dataset(self.items(source), plan=self.plan(), seed=self.seed)


class WindowsAndChunks:
    """Windowed policy samples and whole-episode chunks of one source as one item kind of a planned dataset:
    ids ``0 .. len(windows) - 1`` are the windows, the rest the chunks. Both share the source, the layout and the
    tokenizer, so one collation packs them side by side (:func:`mmfeed.loaders.planned.collate.collate`); the plan sees
    their prices and episodes (:meth:`SampleTable.of_prices <mmfeed.packing.samples.SampleTable.of_prices>`)."""

    def __init__(self, windows: EpisodeItems, chunks: EpisodeItems) -> None:
        if windows.source is not chunks.source or windows.layout != chunks.layout:
            raise ValueError("windows and chunks must read one source with one layout")
        self.windows, self.chunks, self.offset = windows, chunks, len(windows)
        self.source, self.layout, self.window = windows.source, windows.layout, windows.window
        self.features = list(dict.fromkeys([*windows.features, *chunks.features]))
        self.tokenizer, self.text = windows.tokenizer, windows.text
        parts = [items.table for items in (windows, chunks)]
        ids = [np.arange(len(t), dtype=np.int64) for t in parts]
        self.episode, self.start = (np.concatenate(c) for c in zip(*(t.locate(i) for t, i in zip(parts, ids))))
        self.length = np.concatenate([t.lengths(i) for t, i in zip(parts, ids)])
        self.tokens = np.concatenate([t.tokens for t in parts])
        self.table = SampleTable.of_prices(self.tokens, groups=self.episode)
        self.is_chunk = np.arange(len(self.episode)) >= self.offset
        self.stats = dict(chunks.stats)

    def __len__(self) -> int:
        return len(self.episode)

    def requests(self, samples: np.ndarray) -> list[SampleRead]:
        """What each sample reads and how it is laid out, windows and chunks alike, in the order given."""
        samples = np.asarray(samples, dtype=np.int64)
        out: list[Any] = [None] * len(samples)
        chunk = samples >= self.offset
        for mask, items, shift in ((~chunk, self.windows, 0), (chunk, self.chunks, self.offset)):
            where = np.flatnonzero(mask)
            if len(where):
                for k, read in zip(where.tolist(), items.requests(samples[where] - shift)):
                    out[k] = replace(read, sample=int(samples[k]))
        return out

    def reads(self, samples: np.ndarray) -> EpisodeReads:
        """What ``samples`` read, for collation (:class:`~mmfeed.loaders.planned.reads.EpisodeReads`)."""
        return EpisodeReads(self.source, self.requests(samples), self.layout, self.features)


# ------------------------------------------------------------------------------------------- synthetic datasets


def data_spec(cfg: LoaderBench, *, progress: Callable[[int], object] | None = None) -> str | list[str]:
    """What ``open_dataset`` opens for ``cfg``: the cached dataset's path, or the list of a mixture's paths."""
    paths = [str(dataset_path(d, progress=progress)) for d in cfg.datasets()]
    return paths[0] if len(paths) == 1 else paths


def dataset_path(cfg: LoaderBench, *, progress: Callable[[int], object] | None = None) -> Path:
    """The synthetic dataset of a single-dataset ``cfg`` (no embodiments), written once and cached.

    progress: called with the number of episodes just written (shard by shard), e.g. ``tqdm.update``.
    """
    if cfg.embodiments:
        raise ValueError("a mixture has one path per embodiment: data_spec(cfg)")
    key = (f"v{DATASET_VERSION}-{cfg.format}-{cfg.episodes}ep-{cfg.min_length}-{cfg.max_length}-{cfg.width}x"
           f"{cfg.height}-{cfg.codec}-g{cfg.gop}-{cfg.fps:g}fps-{'+'.join(cfg.cameras)}")
    key += "".join(f"-{c}@{f:g}" for c, f in cfg.camera_fps) + ("" if cfg.tasks == "default" else f"-{cfg.tasks}")
    path = cache_dir("bench") / f"{key}-s{cfg.seed}"
    done = path / ".complete"
    if not done.exists():
        if path.exists():  # an interrupted earlier attempt: start again from nothing
            shutil.rmtree(path)
        log.info("writing synthetic %s dataset to %s", cfg.format, path)
        write_synthetic(path, cfg.synthetic(), progress=progress)
        done.write_text("ok")
    return path


def run_mmfeed(cfg: LoaderBench, path: Any, *, step_s: float = 0.0, timer: bool = False) -> dict[str, Any]:
    """Iterate mmfeed's loader for ``warmup + steps`` batches (on its own, not interleaved); figures over the
    measured ones."""
    loader = DataLoader(cfg.planned(open_dataset(path, backend=cfg.backend)), num_workers=cfg.workers,
                        timer=timer or None, persistent_workers=cfg.workers > 0)
    videos = cfg.video_features
    batches = forever(loader)
    for _ in range(cfg.warmup):
        next(batches)
    samples = frames = useful = slots = 0
    start = time.perf_counter()
    for _ in range(cfg.steps or 24):
        batch = next(batches)
        samples += batch.num_documents
        frames += sum(len(batch.data[f]) for f in videos if f in batch.data)
        useful += int((batch.document_ids >= 0).sum())
        slots += batch.document_ids.numel()
        if step_s:
            time.sleep(step_s)
    seconds = time.perf_counter() - start
    out = {"seconds": seconds, "samples_per_s": samples / seconds, "frames_per_s": frames / seconds,
           "tokens_per_s": useful / seconds, "packing_efficiency": useful / slots if slots else 0.0}
    return {**out, "timing": loader.timer.report()} if timer else out


# ----------------------------------------------------------------------------------------------- the baseline


class PerSampleDataset(torch.utils.data.Dataset):
    """The baseline: each sample reads its own bytes and opens, seeks and decodes its own frames.

    Its samples, prices and frames are those of mmfeed's loader (``cfg.items``: the same windows and chunks, the
    same layout): ``{feature: [K, ...], "text", "tokens", "frames", "frames_decoded", "readers_opened"}``
    (``frames``: video frames delivered; ``frames_decoded``: frames the decoder produced for them, GOP
    dependencies included; ``readers_opened``: videos opened for them).
    """

    def __init__(self, cfg: LoaderBench, path: Any) -> None:
        self.cfg = cfg
        source = open_dataset(path, backend=cfg.backend)
        self.items = cfg.items(source)
        self.videos = {f for f, feature in source.features.items() if feature.kind == "video"}

    @property
    def tokens(self) -> np.ndarray:
        """int64 ``[n]``: each sample's price in tokens."""
        return self.items.table.tokens

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        items, source = self.items, self.items.source
        before = decode_totals()
        (read,) = items.requests(np.array([i]))
        request = read.request
        arrays = {f: idx for f, idx in request.indices.items() if f not in self.videos}
        out = source.read_many([EpisodeRequest(request.episode, arrays)])[0]
        frames = 0
        for feature, idx in request.indices.items():
            if feature in self.videos:
                out[feature] = _decode_alone(source, request.episode, feature, idx, self.cfg.backend)
                frames += len(idx)
        sample = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}
        sample["text"] = torch.from_numpy(read.text)
        sample["tokens"] = torch.tensor(int(self.tokens[i]))
        sample["frames"] = torch.tensor(frames)
        after = decode_totals()
        sample["frames_decoded"] = torch.tensor(after["frames_decoded"] - before["frames_decoded"])
        sample["readers_opened"] = torch.tensor(after["opened"] - before["opened"])
        return sample


def _decode_alone(source: EpisodeSource, episode: int, feature: str, idx: np.ndarray, backend: str) -> np.ndarray:
    """One sample's frames of one video, opened, sought and decoded on their own (a fresh open every sample)."""
    from mmfeed.loaders.formats.lerobot.source import LeRobotSource

    source, episode = source.leaf(episode)
    if isinstance(source, LeRobotSource):
        path, times = source._frame_times(episode, feature, idx)
        with stage("decode"):
            return read_frames(str(path), timestamps=times, tolerance_s=source.tolerance_s, backend=backend)
    data = source._member(episode, feature)
    with stage("decode"):
        return read_frames(data, indices=idx, backend=backend)


def pad_collate(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad every field to the batch's longest sample (what a plain torch pipeline does); a field some samples
    lack (a camera of the other embodiment) is empty in those samples."""
    out: dict[str, torch.Tensor] = {}
    keys = list(dict.fromkeys(k for s in samples for k in s))
    for key in keys:
        ref = next(s[key] for s in samples if key in s)
        values = [s.get(key, ref.new_zeros((0, *ref.shape[1:]))) for s in samples]
        if ref.dim() == 0:
            out[key] = torch.stack(values)
        else:
            out[key] = torch.nn.utils.rnn.pad_sequence(values, batch_first=True)
    return out
