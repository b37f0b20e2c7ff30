"""A behaviour digest of mmfeed's loaders: one sha256 per configuration of everything it plans, yields and saves,
so that a restructuring of ``loaders/`` can show it changed no byte of behaviour.

Usage::

    python tests/house_digest.py [--json OUT] [--only NAME ...] [--sections]
    python tests/house_digest.py --write-states

It prints one JSON object ``{configuration name: sha256 hex, ..., "total": sha256 hex}`` (``--json OUT`` also
writes it to OUT; ``--only NAME``, repeatable, runs only those configurations and ``total`` covers those;
``--sections`` adds each configuration's per-section digests, batch counts and run time under ``"sections"``).
It is importable too: :data:`CONFIGS` lists the 18 configurations, :func:`run_config` digests one,
:func:`digest_all` several, :func:`digest_of` any value. The 18 run in about 15-25 s on 2 cores.

The configurations (:data:`CONFIGS`) cover windows, whole-episode chunks and records of a map-style dataset
through the planned dataset; the three planners (classes, uniform, samples: ``packing/epoch.py``); static shapes;
a transform (Normalize and a seeded CameraDropout); weighted mixtures of a webdataset and a LeRobot directory
(weights ``[2, 1]`` and ``SizeWeights(0.5)``); ranks 0 and 1 of world size 2; 0 and 2 worker processes; chained
epochs over persistent workers; the windows view (``ds.windows(spec)``) and plain map-style datasets shuffled by a
generator and by torch's seeded RNG through ``mmfeed.DataLoader``; and the streaming dataset. The datasets are
tiny (3-4 episodes of 8-16 steps, 32x48 frames), written with ``mmfeed.testing`` to a temporary directory.

What is hashed, for each configuration, in this order (each section its own sha256; the configuration's digest is
the sha256 of ``section=digest`` lines in this order):

1. ``plan``: for a planned dataset, for epochs 0 and 1, ``PlannedDataset.planned(epoch)``: the planner and its
   reason, the weighted draw (``drawn``), steps, capacity, row slots, world size, dropped and replicated sample
   ids, the efficiency, and for every rank and step the table's sample ids of each row. For other datasets the
   number of items and of batches.
2. ``epoch0``, ``epoch1``: every batch of two epochs, in order, and their count. A
   :class:`~mmfeed.packing.PackedBatch` is its public fields (modalities, ``max_seqlen``, rows, documents,
   capacity, the id tensors, ``cu_seqlens``, ``data``, ``metadata``); anything else is walked: dicts in sorted key
   order, lists and tuples in order (tagged apart); a tensor or numpy array is its dtype, shape and raw bytes;
   strings, ints, floats, bools and None by type and repr, numpy scalars by dtype and bytes. Any other type is a
   TypeError, so nothing unstable (pickle bytes of an object, an address) can enter a digest. The temporary
   directory is replaced by ``$ROOT`` in every string (``metadata["source"]`` holds a path).
3. ``state``: the loader's ``state_dict()`` after ``Config.cut`` batches of epoch 1 (the second epoch), encoded
   as above (a shuffle generator's state is a uint8 tensor, hashed by its bytes).
4. ``resumed``: every batch a fresh loader of the same configuration yields after ``load_state_dict(state)``, to
   the end of epoch 1. (That they equal the uninterrupted run's is checked too, outside the digest:
   ``Result.resume_matches``; the command line reports a mismatch on stderr.)

``"total"`` is the sha256 of the ``name=digest`` lines in the order of :data:`CONFIGS`. Everything is seeded (plan
seeds, shuffle generators, and ``torch.manual_seed`` from the configuration's name before it is built), so digests
are the same across runs, processes and ``PYTHONHASHSEED`` values. They do depend on the versions of torch, numpy
and FFmpeg (video is encoded and decoded), so compare two commits in one environment.

Comparing two commits: run ``python tests/house_digest.py --json before.json`` at the first (e.g. in a git worktree
using the same virtual environment, with ``mmfeed`` imported from that worktree) and ``--json after.json`` at the
second, and compare the two files: equal ``total``, equal behaviour. For a configuration that differs, rerun it
with ``--only NAME --sections`` on both sides to see whether its plan, its batches, its saved state or only its
resumed batches changed. ``tests/saved_states/digest.json`` holds the digests of the commit that wrote it:
``tests/test_saved_states.py`` compares three cheap configurations with it by default and all 18 under
``-m slow``.

Saved states (``--write-states``): runs every configuration and writes ``tests/saved_states/``: for the four
configurations of :data:`SAVED` (a planned packed loader, chained epochs of persistent workers, a shuffled
map-style loader, the windows view) the ``state`` above saved with ``torch.save`` as ``<name>.pt``;
``states.json`` with, for each, the sha256 of the state and of the batches that follow it when a fresh loader
resumes from it, and their count; and ``digest.json``, every configuration's digest and the total.
``tests/test_saved_states.py`` loads each state with ``torch.load(file, weights_only=True)`` (they hold only
ints, strings, bools, lists and uint8 tensors), resumes a fresh loader from it and checks those batches, so a later
version shows that states saved by this one resume exactly. Regenerate them only for a change of behaviour that
is meant, and say so in the commit.
"""

from __future__ import annotations

import argparse
import copy
import gc
import hashlib
import json
import logging
import math
import os
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmfeed import DataLoader
from mmfeed.codecs.text import ByteTokenizer, FixedLengthTokenizer
from mmfeed.loaders import (CameraDropout, Compose, Normalize, Packing, PlanConfig, PlannedDataset, TokenLayout,
                            WindowSpec, open_dataset)
from mmfeed.loaders.sources.arrays import ArraySource
from mmfeed.loaders.streaming.dataset import StreamConfig, StreamingPackedDataset
from mmfeed.packing import PackedBatch, SizeWeights
from mmfeed.testing import make_episodes, write_lerobot, write_webdataset

__all__ = ["BY_NAME", "CONFIGS", "SAVED", "STATES_DIR", "Config", "Data", "Encoder", "Result", "batches_digest",
           "digest_all", "digest_of", "resume", "run_config", "seed_torch", "total_digest", "write_states"]

log = logging.getLogger("house_digest")

STATES_DIR = Path(__file__).resolve().parent / "saved_states"
ROOT_TOKEN = "$ROOT"

CAM = "observation.images.cam_high"
SPEC = WindowSpec.from_delta_timestamps({CAM: [-2 / 15, 0.0], "observation.state": [0.0],
                                         "action": [i / 30 for i in range(4)]})
LAYOUT = TokenLayout(tokens_per_frame={CAM: 8})
CHUNKS = TokenLayout(tokens_per_frame={CAM: 4, "observation.state": 1, "action": 1})
FRAME = {"height": 32, "width": 48, "cameras": ("cam_high",)}


# -- canonical encoding ------------------------------------------------------------------------------------------

class Encoder:
    """Feeds a canonical, type-tagged, length-prefixed byte encoding of values into a sha256."""

    def __init__(self, roots: tuple[str, ...] = ()) -> None:
        self.hash = hashlib.sha256()
        # longest first, so that a root's realpath inside another root is replaced whole
        self.roots = tuple(sorted({r for r in roots if r}, key=len, reverse=True))

    def _put(self, tag: bytes, payload: bytes = b"") -> None:
        self.hash.update(tag + struct.pack("<Q", len(payload)) + payload)

    def text(self, value: str) -> str:
        for root in self.roots:
            value = value.replace(root, ROOT_TOKEN)
        return value

    def feed(self, value: Any) -> None:
        if value is None:
            self._put(b"N")
        elif isinstance(value, (bool, np.bool_)):
            self._put(b"B" if isinstance(value, bool) else b"b", repr(bool(value)).encode())
        elif isinstance(value, np.generic):  # a numpy scalar: its dtype and bytes
            self._put(b"G", np.dtype(value.dtype).str.encode() + b":" + np.asarray(value).tobytes())
        elif isinstance(value, int):
            self._put(b"I", repr(int(value)).encode())
        elif isinstance(value, float):
            self._put(b"F", repr(float(value)).encode() if not math.isnan(value) else b"nan")
        elif isinstance(value, str):
            self._put(b"S", self.text(value).encode("utf-8"))
        elif isinstance(value, bytes):
            self._put(b"Y", value)
        elif isinstance(value, torch.Tensor):
            self._tensor(value)
        elif isinstance(value, np.ndarray):
            self._array(value)
        elif isinstance(value, PackedBatch):
            self._packed(value)
        elif isinstance(value, dict):
            self._put(b"D", repr(len(value)).encode())
            for key in sorted(value, key=self._key):
                self.feed(key)
                self.feed(value[key])
        elif isinstance(value, (list, tuple)):
            self._put(b"L" if isinstance(value, list) else b"U", repr(len(value)).encode())
            for item in value:
                self.feed(item)
        elif isinstance(value, (set, frozenset)):
            self._put(b"E", repr(len(value)).encode())
            for item in sorted(value, key=self._key):
                self.feed(item)
        elif isinstance(value, torch.dtype):
            self._put(b"t", str(value).encode())
        else:
            raise TypeError(f"the digest has no stable encoding for {type(value).__module__}.{type(value).__name__}; "
                            "add one to house_digest.Encoder (never its pickle bytes)")

    def _key(self, key: Any) -> bytes:
        sub = Encoder(self.roots)
        sub.feed(key)
        return sub.hash.digest()

    def _tensor(self, t: torch.Tensor) -> None:
        t = t.detach().cpu().contiguous()
        head = f"{t.dtype}|{tuple(t.shape)}".encode()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        self._put(b"T", head)
        self._put(b"R", raw)

    def _array(self, a: np.ndarray) -> None:
        if a.dtype == object:
            self._put(b"O", repr(a.shape).encode())
            for item in a.reshape(-1).tolist():
                self.feed(item)
            return
        self._put(b"A", f"{a.dtype.str}|{a.shape}".encode())
        self._put(b"R", np.ascontiguousarray(a).tobytes())

    def _packed(self, b: PackedBatch) -> None:
        self._put(b"P")
        for name in ("modalities", "max_seqlen", "num_rows", "num_documents", "capacity", "document_ids",
                     "position_ids", "step_ids", "modality_ids", "cu_seqlens", "data", "metadata"):
            self.feed(name)
            self.feed(getattr(b, name))

    def hexdigest(self) -> str:
        return self.hash.hexdigest()


def digest_of(value: Any, roots: tuple[str, ...] = ()) -> str:
    enc = Encoder(roots)
    enc.feed(value)
    return enc.hexdigest()


# -- datasets ----------------------------------------------------------------------------------------------------

class Data:
    """The datasets the configurations read, written once each on first use under ``root`` (a new temporary
    directory by default, removed by :meth:`close`)."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self._tmp = None
        if root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="mmfeed-digest-")
            root = self._tmp.name
        self.root = Path(root)
        self._cache: dict[str, Any] = {}

    @property
    def roots(self) -> tuple[str, ...]:
        return (str(self.root), os.path.realpath(self.root))

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Data:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def wds(self) -> str:
        """4 episodes of 10-16 steps in 2 webdataset shards, one 15 fps camera."""
        def make() -> str:
            out = self.root / "wds"
            write_webdataset(out, make_episodes(4, seed=3, min_length=10, max_length=16,
                                                camera_fps={"cam_high": 15.0}, **FRAME), episodes_per_shard=2)
            return str(out)
        return self._once("wds", make)

    def lerobot(self) -> str:
        """3 episodes of 8-14 steps as a LeRobot v3 directory (AV1 video, as LeRobot writes it)."""
        def make() -> str:
            return write_lerobot(self.root / "lerobot", make_episodes(3, seed=4, min_length=8, max_length=14,
                                                                      **FRAME))
        return self._once("lerobot", make)

    def arrays(self) -> ArraySource:
        """4 episodes of 8-16 steps held in memory."""
        def make() -> ArraySource:
            eps = make_episodes(4, seed=0, min_length=8, max_length=16, camera_fps={"cam_high": 15.0}, **FRAME)
            return ArraySource([{**e.features(), "task": e.task, "fps": e.fps, "rates": e.rates()} for e in eps])
        return self._once("arrays", make)


# -- map-style datasets ------------------------------------------------------------------------------------------

class Records(torch.utils.data.Dataset):
    """Token sequences of seeded lengths: bare 1-D tensors of ids, or (``fields``) dicts of the ids, per-token
    labels and a record name (which goes to the batch's metadata)."""

    def __init__(self, lengths: list[int], seed: int, fields: bool = False) -> None:
        self.lengths, self.seed, self.fields = lengths, seed, fields

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> Any:
        g = torch.Generator().manual_seed(self.seed * 1000 + int(i))
        ids = torch.randint(0, 50_000, (self.lengths[i],), generator=g, dtype=torch.int32)
        if not self.fields:
            return ids
        return {"text": ids, "labels": torch.roll(ids, -1).to(torch.int64), "name": f"record-{i}"}


class Rows(torch.utils.data.Dataset):
    """A map-style dataset of mixed values: a float vector, an int, a string and a nested dict."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(int(i))
        return {"x": torch.randn(5, generator=g), "i": int(i), "name": f"row-{i}",
                "nested": {"even": i % 2 == 0, "pair": (i, float(i) / 3)}}


def record_lengths(n: int, seed: int, low: int, high: int) -> list[int]:
    return np.random.default_rng(seed).integers(low, high, size=n).tolist()


# -- configurations ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """One configuration: ``build(data)`` makes a fresh loader; ``cut`` batches of epoch 1 run before its state
    is taken; ``before_epoch(loader, epoch)`` runs before each epoch (a stream's set_epoch)."""

    name: str
    build: Callable[[Data], DataLoader]
    cut: int = 2
    before_epoch: Callable[[DataLoader, int], None] | None = None


def packing(**kwargs: Any) -> Packing:
    plan = kwargs.pop("plan", PlanConfig(capacity=96, rows_per_batch=2))
    return Packing(layout=kwargs.pop("layout", LAYOUT), window=kwargs.pop("window", SPEC), plan=plan, **kwargs)


def planned_loader(source: Any, pack: Packing, *, rank: int = 0, world_size: int = 1, **kwargs: Any) -> DataLoader:
    return DataLoader(pack.dataset(source, rank=rank, world_size=world_size), **kwargs)


def stream_epoch(loader: DataLoader, epoch: int) -> None:
    loader.dataset.set_epoch(epoch)


UNIFORM_TEXT = FixedLengthTokenizer(ByteTokenizer(), 8, pad_id=0)


def augmented(data: Data) -> DataLoader:
    """Windows of the shards normalized with their stats and a camera dropped at random, in 2 workers."""
    source = open_dataset(data.wds())
    transform = Compose(Normalize(source), CameraDropout(0.5))
    return DataLoader(source, packing=packing(seed=2, transform=transform), num_workers=2)


def _configs() -> list[Config]:
    return [
        # windows of one dataset, by the three planners
        Config("windows-classes-arrays-w0", lambda d: planned_loader(d.arrays(), packing(seed=1))),
        Config("windows-classes-augment-wds-w2", augmented),
        Config("windows-classes-lerobot-w0", lambda d: planned_loader(open_dataset(d.lerobot()), packing(seed=3))),
        Config("windows-uniform-wds-w0",
               lambda d: planned_loader(open_dataset(d.wds()), packing(
                   seed=4, layout=TokenLayout(tokens_per_frame={}), tokenizer=UNIFORM_TEXT,
                   window=WindowSpec.from_delta_timestamps({"observation.state": [0.0],
                                                            "action": [i / 30 for i in range(4)]}),
                   plan=PlanConfig(capacity=64, rows_per_batch=2)))),
        Config("windows-samples-nf-static-arrays-w0",
               lambda d: planned_loader(d.arrays(), packing(seed=5, static_shapes=True, plan=PlanConfig(
                   capacity=96, rows_per_batch=2, algorithm="nf")))),
        # whole-episode chunks
        Config("chunks-arrays-w0",
               lambda d: planned_loader(d.arrays(), packing(seed=6, window=None, layout=CHUNKS, max_length=6,
                                                            plan=PlanConfig(capacity=64, rows_per_batch=2)))),
        Config("chunks-wds-static-w2",
               lambda d: planned_loader(open_dataset(d.wds()), packing(
                   seed=7, window=None, layout=CHUNKS, max_length=8, static_shapes=True,
                   plan=PlanConfig(capacity=80, rows_per_batch=2)), num_workers=2)),
        # records of a map-style dataset
        Config("records-w0",
               lambda d: DataLoader(PlannedDataset.records(Records(record_lengths(40, 8, 1, 60), 8),
                                                           record_lengths(40, 8, 1, 60),
                                                           plan=PlanConfig(capacity=64, rows_per_batch=2), seed=8))),
        Config("records-fields-static-w2",
               lambda d: DataLoader(PlannedDataset.records(Records(record_lengths(30, 9, 4, 20), 9, fields=True),
                                                           record_lengths(30, 9, 4, 20), static_shapes=True,
                                                           plan=PlanConfig(capacity=40, rows_per_batch=2), seed=9),
                                    num_workers=2)),
        # weighted mixtures
        Config("mixture-weighted-wds-lerobot-w0",
               lambda d: planned_loader(open_dataset([d.wds(), d.lerobot()]), packing(seed=10, weights=[2.0, 1.0]))),
        Config("mixture-sizeweights-w2",
               lambda d: planned_loader(open_dataset([d.wds(), d.lerobot()]),
                                        packing(seed=11, weights=SizeWeights(0.5)), num_workers=2)),
        # two ranks
        Config("world2-rank0-wds-w0",
               lambda d: planned_loader(open_dataset(d.wds()), packing(seed=12), rank=0, world_size=2), cut=1),
        Config("world2-rank1-wds-w0",
               lambda d: planned_loader(open_dataset(d.wds()), packing(seed=12), rank=1, world_size=2), cut=1),
        # chained epochs: persistent workers
        Config("chained-persistent-wds-w2",
               lambda d: DataLoader(d.wds(), packing=packing(seed=13), num_workers=2, persistent_workers=True),
               cut=3),
        # the windows view, a plain map-style dataset of LeRobot-shaped samples
        Config("windows-view-shuffle-wds-w2",
               lambda d: DataLoader(open_dataset(d.wds()).windows(SPEC), batch_size=6, shuffle=True, num_workers=2,
                                    generator=torch.Generator().manual_seed(14))),
        # shuffled map-style datasets: the order from a generator, or from torch's RNG (seeded)
        Config("map-shuffle-generator-w0",
               lambda d: DataLoader(Rows(), batch_size=4, shuffle=True,
                                    generator=torch.Generator().manual_seed(15))),
        Config("map-shuffle-seeded-w2", lambda d: DataLoader(Rows(), batch_size=3, shuffle=True, num_workers=2)),
        # streaming: shards front to back through the online packer
        Config("stream-wds-w0",
               lambda d: DataLoader(StreamingPackedDataset(d.wds(), packing=packing(seed=16), config=StreamConfig(
                   window_items=6, shuffle_shards=True)), batch_size=None), before_epoch=stream_epoch),
    ]


CONFIGS: list[Config] = _configs()
BY_NAME: dict[str, Config] = {c.name: c for c in CONFIGS}
SAVED = ("windows-classes-arrays-w0", "chained-persistent-wds-w2", "map-shuffle-generator-w0",
         "windows-view-shuffle-wds-w2")
"""The configurations whose mid-epoch state ``--write-states`` saves."""
SECTIONS = ("plan", "epoch0", "epoch1", "state", "resumed")


# -- running -----------------------------------------------------------------------------------------------------

@dataclass
class Result:
    """What one configuration gave: its digest, each section's, the state, and whether the resumed batches are
    the batches the uninterrupted epoch 1 yielded after the cut (a check, not part of the digest)."""

    name: str
    digest: str
    sections: dict[str, str]
    state: dict[str, Any]
    batches: dict[str, int]
    resume_matches: bool
    seconds: float


def plan_record(ds: PlannedDataset, epoch: int) -> dict[str, Any]:
    planned = ds.planned(epoch)
    plan = planned.plan
    world = ds.world_size
    rows = [[[np.asarray(r) for r in planned.samples(plan.batch_rows(rank, step))] for step in range(plan.num_steps)]
            for rank in range(world)]
    return {"epoch": epoch, "planner": planned.planner, "reason": planned.reason, "drawn": planned.drawn,
            "num_steps": plan.num_steps, "capacity": int(plan.capacity), "max_rows": int(plan.max_rows),
            "world_size": world, "dropped": np.asarray(plan.dropped), "replicated": np.asarray(plan.replicated),
            "efficiency": float(plan.efficiency), "rows": rows}


def seed_torch(name: str) -> None:
    """torch's RNG seeded from the configuration's name (the order of a shuffle without a generator)."""
    torch.manual_seed(int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little"))


def batches_digest(batches: Any, roots: tuple[str, ...]) -> tuple[str, list[str]]:
    """The sha256 of a run of batches (and each batch's own digest)."""
    enc = Encoder(roots)
    each = []
    for batch in batches:
        enc.feed(batch)
        each.append(digest_of(batch, roots))
    enc.feed(("batches", len(each)))
    return enc.hexdigest(), each


def _epoch(config: Config, loader: DataLoader, epoch: int) -> Any:
    if config.before_epoch is not None:
        config.before_epoch(loader, epoch)
    return iter(loader)


def resume(config: Config, data: Data, state: dict[str, Any]) -> tuple[str, list[str]]:
    """Digest of the batches a fresh loader of ``config`` yields after loading ``state`` (to the epoch's end)."""
    seed_torch(config.name + "/resumed")
    loader = config.build(data)
    loader.load_state_dict(copy.deepcopy(state))
    try:
        return batches_digest(iter(loader), data.roots)
    finally:
        del loader
        gc.collect()


def run_config(config: Config | str, data: Data) -> Result:
    """Digest ``config`` (see the module docstring for what is hashed)."""
    config = BY_NAME[config] if isinstance(config, str) else config
    start = time.perf_counter()
    roots = data.roots
    seed_torch(config.name)
    loader = config.build(data)
    sections: dict[str, str] = {}
    if isinstance(loader.dataset, PlannedDataset):
        sections["plan"] = digest_of([plan_record(loader.dataset, e) for e in (0, 1)], roots)
    else:
        iterable = isinstance(loader.dataset, torch.utils.data.IterableDataset)
        sections["plan"] = digest_of({"items": None if iterable else len(loader.dataset),
                                      "batches": None if iterable else len(loader)}, roots)
    counts = {}
    sections["epoch0"], first = batches_digest(_epoch(config, loader, 0), roots)
    counts["epoch0"] = len(first)
    # epoch 1: the state after `cut` batches, then the rest of the epoch
    state = None
    enc, each = Encoder(roots), []
    for i, batch in enumerate(_epoch(config, loader, 1)):
        enc.feed(batch)
        each.append(digest_of(batch, roots))
        if i + 1 == config.cut:
            state = copy.deepcopy(loader.state_dict())
    enc.feed(("batches", len(each)))
    sections["epoch1"], counts["epoch1"] = enc.hexdigest(), len(each)
    if state is None:
        raise RuntimeError(f"{config.name}: epoch 1 has {len(each)} batches, fewer than the cut {config.cut}")
    del loader
    gc.collect()
    sections["state"] = digest_of(state, roots)
    sections["resumed"], rest = resume(config, data, state)
    counts["resumed"] = len(rest)
    total = hashlib.sha256("".join(f"{k}={sections[k]}\n" for k in SECTIONS).encode()).hexdigest()
    return Result(config.name, total, sections, state, counts, rest == each[config.cut:],
                  time.perf_counter() - start)


def total_digest(digests: dict[str, str]) -> str:
    return hashlib.sha256("".join(f"{n}={digests[n]}\n" for n in digests if n != "total").encode()).hexdigest()


def digest_all(names: list[str] | None = None, data: Data | None = None) -> dict[str, Result]:
    """Run the configurations ``names`` (default all, in the order of :data:`CONFIGS`)."""
    unknown = sorted(set(names or ()) - set(BY_NAME))
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; the configurations are {list(BY_NAME)}")
    chosen = [c for c in CONFIGS if names is None or c.name in names]
    own = data is None
    data = data or Data()
    try:
        results = {}
        for c in chosen:
            results[c.name] = run_config(c, data)
            log.info("%s: %s in %.1f s", c.name, results[c.name].digest[:16], results[c.name].seconds)
        return results
    finally:
        if own:
            data.close()


# -- saved states ------------------------------------------------------------------------------------------------

def write_states(out: Path = STATES_DIR) -> dict[str, Any]:
    """Run every configuration; write the states of :data:`SAVED` (``<name>.pt``, by ``torch.save``),
    ``states.json`` (the digest of the batches that follow each) and ``digest.json`` (every configuration's digest
    and the total) to ``out``. Return what ``states.json`` holds."""
    results = digest_all()
    bad = [name for name, r in results.items() if not r.resume_matches]
    if bad:
        raise RuntimeError(f"the resumed batches differ from the uninterrupted run's in {bad}: not saving states")
    out.mkdir(parents=True, exist_ok=True)
    record = {}
    for name in SAVED:
        result = results[name]
        torch.save(result.state, out / f"{name}.pt")
        record[name] = {"file": f"{name}.pt", "state_sha256": result.sections["state"],
                        "resumed_sha256": result.sections["resumed"], "resumed_batches": result.batches["resumed"]}
    (out / "states.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    digests: dict[str, str] = {name: r.digest for name, r in results.items()}
    digests["total"] = total_digest(digests)
    (out / "digest.json").write_text(json.dumps(digests, indent=2) + "\n")
    return record


# -- command line ------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", metavar="OUT", help="also write the JSON object to OUT")
    parser.add_argument("--only", metavar="NAME", action="append", choices=list(BY_NAME),
                        help="run only this configuration (repeatable)")
    parser.add_argument("--sections", action="store_true", help="add each configuration's section digests")
    parser.add_argument("--write-states", action="store_true",
                        help="run every configuration, rewrite the saved states, states.json and digest.json in "
                             "tests/saved_states/, and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    log.setLevel(logging.INFO)
    if args.write_states:
        record = write_states()
        json.dump(record, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    start = time.perf_counter()
    results = digest_all(args.only)
    out: dict[str, Any] = {name: r.digest for name, r in results.items()}
    out["total"] = total_digest(out)
    if args.sections:
        out["sections"] = {name: {**r.sections, "batches": r.batches, "resume_matches": r.resume_matches,
                                  "seconds": round(r.seconds, 2)} for name, r in results.items()}
    text = json.dumps(out, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    sys.stdout.write(text + "\n")
    sys.stderr.write(f"{len(results)} configurations in {time.perf_counter() - start:.1f} s\n")
    mismatched = [name for name, r in results.items() if not r.resume_matches]
    if mismatched:
        sys.stderr.write(f"resumed batches differ from the uninterrupted run in: {mismatched}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
