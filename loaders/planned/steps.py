"""The steps every item kind's collation shares, one function per job, so that an option means the same for
every kind: read under the error policy (:func:`read_under_policy`), find and mask or fail non-finite floats
(:func:`find_nonfinite`, :func:`fail_nonfinite`), transform (:func:`transform_each`) and lay out
(:func:`batch_layout`, :func:`pad_static`, :func:`packed`).

Each step is a function of what it is given: the reading functions of the data (a source's ``read_many``, a
record source's ``read``) and plain data (what was read, each sample's ``is_pad`` flags, the failure records'
places, the transform's inputs); none calls back into the collation that runs it (see
:mod:`mmfeed.loaders.planned.collate`).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from mmfeed.loaders.planned.errors import ErrorCounter
from mmfeed.loaders.transport.errors import SampleError
from mmfeed.packing import PackedBatch
from mmfeed.packing.metadata import Layout, Metadata, document_metadata, make_layout

__all__ = ["Places", "batch_layout", "fail_nonfinite", "find_nonfinite", "pad_static", "packed", "read_under_policy",
           "sample_generator", "samples_of", "transform_each", "without_failures"]


def sample_generator(seed: int, epoch: int, sample: int) -> torch.Generator:
    """The generator a transform gets for one sample: a pure function of ``(seed, epoch, sample id)``."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch), int(sample)]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def samples_of(rows: Sequence[np.ndarray]) -> np.ndarray:
    """The sample ids of a batch, row after row (int64)."""
    return np.concatenate(rows).astype(np.int64) if len(rows) else np.zeros(0, np.int64)


@dataclass(frozen=True)
class Places:
    """Where each sample of a batch lies, for its failure record: ``places(k)`` is ``{"sample", "source"}`` (and
    ``"episode"`` for episode samples), ``source`` being what ``describe`` (the source's) calls the episode, or the
    record, that sample ``k`` reads."""

    samples: Sequence[int]
    describe: Callable[[int], str]
    episodes: Sequence[int] | None = None

    def __call__(self, k: int) -> dict:
        if self.episodes is None:
            return {"sample": int(self.samples[k]), "source": self.describe(int(self.samples[k]))}
        episode = int(self.episodes[k])
        return {"sample": int(self.samples[k]), "episode": episode, "source": self.describe(episode)}


def read_under_policy(items: Sequence[Any], read_many: Callable[[Sequence[Any]], list] | None,
                      read_one: Callable[[Any], Any] | None, places: Places,
                      errors: ErrorCounter | None) -> tuple[list, list[dict]]:
    """Read a batch's ``items`` (``read_many(items)``, at once; None: one by one with ``read_one(item)``) under the
    error policy. Under skip/warn a failing batch is read again item by item (``read_many([item])``) and each
    failing sample comes back as None with a record ``{**places(k), "reason": ...}`` (where it lies, why it
    failed), counted by ``errors``; under raise (or without a counter) the first error propagates as it is.
    MemoryError and KeyboardInterrupt always do."""
    if read_many is not None:
        try:
            read = read_many(items)
        except MemoryError:
            raise
        except Exception:
            if errors is None or errors.policy.on_error == "raise":
                raise
        else:
            if errors is not None and len(items):
                errors.succeeded()
            return read, []
    read, failures = [], []
    for k, item in enumerate(items):
        try:
            read.append(read_one(item) if read_many is None else read_many([item])[0])
        except MemoryError:
            raise
        except Exception as err:
            if errors is None or errors.policy.on_error == "raise":
                raise
            read.append(None)
            failures.append({**places(k), "reason": f"{type(err).__name__}: {err}"})
            errors.failed(failures[-1])
        else:
            if errors is not None:
                errors.succeeded()
    return read, failures


def find_nonfinite(read: list, pads: list, keys: Sequence[str] | None, mask: bool) -> list[tuple[int, str, Any]]:
    """NaN or inf in the float arrays of ``keys`` (None: every key of a sample) of the samples ``read``. With
    ``mask`` each such value becomes 0 and its rows are flagged in the sample's ``pads`` (nothing is returned);
    else each sample's first such key comes back as ``(k, key, bad rows)``, in sample order."""
    found: list[tuple[int, str, Any]] = []
    if keys is not None and _all_finite(read, keys):  # the usual batch: one check per key, not one per sample
        return found
    for i, data in enumerate(read):
        if data is None:
            continue
        for key in list(data) if keys is None else keys:
            values = data.get(key)
            finite = None if values is None else _finiteness(values)
            if finite is None:
                continue
            bad = np.asarray(~finite.reshape(len(values), -1).all(1))
            if mask:
                data[key] = (torch.where(finite, values, 0) if isinstance(values, torch.Tensor)
                             else np.where(finite, values, 0).astype(values.dtype))
                pads[i][key] = pads[i][key] | bad
                continue
            found.append((i, key, bad))
            break
    return found


def fail_nonfinite(found: list[tuple[int, str]], read: list, places: Places,
                   errors: ErrorCounter | None, failures: list) -> None:
    """Samples with non-finite values (``(k, where the value lies)``, from :func:`find_nonfinite`) under the error
    policy: raise SampleError on the first, or leave each out (None in ``read``) with its failure record."""
    for k, reason in found:
        if errors is None or errors.policy.on_error == "raise":
            raise SampleError(reason + "; fix the data or use ErrorPolicy(nonfinite='mask')")
        read[k] = None
        failures.append({**places(k), "reason": f"SampleError: {reason}"})
        errors.failed(failures[-1])


def _all_finite(read: list, keys: Sequence[str]) -> bool:
    """True when every numpy array of ``keys`` in the samples ``read`` is finite (False may also mean: not only
    numpy float arrays, so look sample by sample)."""
    for key in keys:
        parts = []
        for data in read:
            values = None if data is None else data.get(key)
            if values is None:
                continue
            if not isinstance(values, np.ndarray) or values.dtype.kind != "f":
                return False
            parts.append(values.reshape(-1))
        if parts and not np.isfinite(np.concatenate(parts)).all():
            return False
    return True


def _finiteness(values: Any) -> Any:
    """Elementwise finiteness of a float array (numpy or torch); None when it is not float or is all finite."""
    if isinstance(values, torch.Tensor):
        finite = torch.isfinite(values) if values.is_floating_point() else None
    else:
        finite = np.isfinite(values) if values.dtype.kind == "f" else None
    return None if finite is None or bool(finite.all()) else finite


def transform_each(inputs: Iterable[dict | None], read: list, samples: Sequence[int], transform: Callable,
                   epoch: int, seed: int, unit: str, pads: list | None = None) -> list:
    """Run the user's transform on each sample read, given ``inputs`` (what the transform gets of each sample in
    turn, None where ``read`` holds None: tensors in, tensors out), each with its own generator, from
    ``(seed, epoch, sample id)`` (``samples``); ``unit``: what the first dimension of an array counts. Each array
    comes back from its result with its first dimension (frames, or a record's tokens) unchanged: tokens were
    planned before anything was read. With ``pads`` (each
    sample's ``is_pad`` flags by feature), a transform may flag more frames as padding (a camera it drops): the
    ``<feature>_is_pad`` it returns, one flag a frame, replaces the sample's."""
    out = []
    for k, (s, data, given) in enumerate(zip(samples, read, inputs)):
        if data is None:
            out.append(None)
            continue
        result = transform(given, sample_generator(seed, epoch, int(s)))
        if not isinstance(result, Mapping):
            raise TypeError(f"the transform must return a dict of tensors, got {type(result).__name__}")
        new = {}
        for key, before in data.items():
            after = result.get(key)
            if after is None:
                raise ValueError(f"the transform dropped {key!r} of sample {int(s)}; it may change values (and frame "
                                 "sizes) only")
            if isinstance(before, np.ndarray):
                after = after.numpy() if isinstance(after, torch.Tensor) else np.asarray(after)
            elif not isinstance(after, torch.Tensor):
                after = torch.as_tensor(after)
            if len(after) != len(before):
                raise ValueError(f"the transform changed the number of {unit} of {key!r} in sample {int(s)} "
                                 f"from {len(before)} to {len(after)}; tokens are planned before reading, so counts "
                                 "must stay")
            new[key] = after
            flags = result.get(f"{key}_is_pad")
            if pads is not None and key in pads[k] and flags is not None:
                flags = np.asarray(flags.numpy() if isinstance(flags, torch.Tensor) else flags, dtype=bool)
                if flags.shape != pads[k][key].shape:
                    raise ValueError(f"the transform returned {key}_is_pad of shape {list(flags.shape)} for sample "
                                     f"{int(s)}; it holds one flag per frame, {list(pads[k][key].shape)}")
                pads[k][key] = flags
        out.append(new)
    return out


def without_failures(rows: Sequence[np.ndarray], samples: np.ndarray, failures: list[dict]
                     ) -> tuple[list[np.ndarray], list[int]]:
    """The rows without the samples that failed, and the positions in ``samples`` of those kept."""
    bad = {f["sample"] for f in failures}
    keep = [i for i, s in enumerate(samples) if int(s) not in bad]
    return [np.asarray([s for s in row if int(s) not in bad], dtype=np.int64) for row in rows], keep


def batch_layout(rows: Sequence[np.ndarray], nrows: int, capacity: int, doc_tokens: Sequence[int],
                 segments: list[np.ndarray] | None = None, steps: list[np.ndarray] | None = None,
                 num_modalities: int = 1) -> Layout:
    """The batch's :class:`~mmfeed.packing.metadata.Layout` from the documents' arrays (segments ``[n, 2]`` and
    step sizes of each document, in row order; None: one token a step, all of modality 0), validated by
    ``make_layout``; ``nrows - len(rows)`` empty rows pad the batch. The same Layout object for the same arrays as
    one of the last few batches of this process (see :class:`_Layouts`)."""
    runs = None if segments is None else np.concatenate(segments) if segments else np.zeros((0, 2), np.int64)
    step_sizes = None if steps is None else np.concatenate(steps) if steps else np.zeros(0, np.int64)
    lengths = np.asarray(doc_tokens, dtype=np.int64)
    key = (nrows, capacity, num_modalities, tuple(map(len, rows)), lengths.tobytes(),
           None if runs is None else (runs.dtype.str, runs.tobytes(), tuple(map(len, segments))),
           None if step_sizes is None else (step_sizes.dtype.str, step_sizes.tobytes(), tuple(map(len, steps))))
    return _LAYOUTS.get(key, lambda: _new_layout(rows, nrows, capacity, lengths, segments, runs, steps, step_sizes,
                                                 num_modalities))


def _new_layout(rows: Sequence[np.ndarray], nrows: int, capacity: int, lengths: np.ndarray,
                segments: list[np.ndarray] | None, runs: np.ndarray | None, steps: list[np.ndarray] | None,
                step_sizes: np.ndarray | None, num_modalities: int) -> Layout:
    def offsets(sizes: list[int]) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    row_offsets = offsets([len(row) for row in rows] + [0] * (nrows - len(rows)))
    if runs is None:
        return make_layout(lengths, row_offsets, capacity, num_modalities=num_modalities)
    return make_layout(lengths, row_offsets, capacity, step_sizes=step_sizes,
                       step_offsets=offsets([len(p) for p in steps]), segment_modalities=runs[:, 0],
                       segment_lengths=runs[:, 1], segment_offsets=offsets([len(p) for p in segments]),
                       num_modalities=num_modalities)


class _Layouts:
    """The layouts of the last few batch shapes this process built, and the attention metadata of those met again.
    A fixed-mode plan gives every batch the same documents' tokens, steps and modality runs, so its batches share
    one layout, whose metadata is then made once; each batch gets its own copy of it (it may change its arrays).
    Metadata is kept only for a layout met at least twice and only up to ``keep_bytes`` (a pack-mode batch, whose
    layout is new batch after batch, or a very large one, keeps nothing but its small layout)."""

    def __init__(self, size: int = 8, keep_bytes: int = 1 << 20) -> None:
        self.size, self.keep_bytes = size, keep_bytes
        self._by_key: OrderedDict[tuple, Layout] = OrderedDict()
        self._kept: dict[int, _Kept] = {}  # id(layout) -> what is kept of it
        self._lock = threading.Lock()  # a thread-mode loader's workers collate side by side
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it as this process was forked

    def get(self, key: tuple, make: Callable[[], Layout]) -> Layout:
        """The layout of ``key`` (the arrays it is made of), made by ``make()`` the first time."""
        with self._lock:
            layout = self._by_key.get(key)
            if layout is not None:
                self._by_key.move_to_end(key)
                self._kept[id(layout)].met += 1
                return layout
        layout = make()
        with self._lock:
            self._by_key[key] = layout
            self._kept[id(layout)] = _Kept(layout)
            if len(self._by_key) > self.size:
                _, old = self._by_key.popitem(last=False)
                del self._kept[id(old)]
        return layout

    def metadata(self, layout: Layout) -> Metadata:
        """``document_metadata(layout)``, its arrays the caller's own; made once for a layout met again."""
        with self._lock:
            kept = self._kept.get(id(layout))
        if kept is None or kept.layout is not layout:  # not one of these layouts (its id taken again)
            return document_metadata(layout)
        if kept.meta is not None:
            return _copied(kept.meta)
        meta = document_metadata(layout)
        if kept.met and sum(a.nbytes for a in meta if isinstance(a, np.ndarray)) <= self.keep_bytes:
            kept.meta = _copied(meta)  # let go with its entry if the layout was let go meanwhile
        return meta


@dataclass
class _Kept:
    """What :class:`_Layouts` keeps of a layout: the layout, the times it was met again, its metadata once kept."""

    layout: Layout
    met: int = 0
    meta: Metadata | None = None


def _copied(meta: Metadata) -> Metadata:
    """``meta`` with arrays of its own."""
    return Metadata(*(a.copy() if isinstance(a, np.ndarray) else a for a in meta))


_LAYOUTS = _Layouts()


def pad_static(payload: dict[str, Any], per_entry: dict[str, int], slots: int) -> None:
    """Pad each payload ``key`` of ``per_entry`` (tokens one entry takes) to the most ``slots`` tokens could
    hold; padded entries are flagged in its ``_is_pad``, where it has one."""
    for key, tokens in per_entry.items():
        extra = slots // tokens - len(payload[key])
        payload[key] = _grown(payload[key], extra, 0)
        if f"{key}_is_pad" in payload:
            payload[f"{key}_is_pad"] = _grown(payload[f"{key}_is_pad"], extra, 1)
        if f"{key}_dim_mask" in payload:
            payload[f"{key}_dim_mask"] = _grown(payload[f"{key}_dim_mask"], extra, 0)


def _grown(values: Any, extra: int, fill: int) -> Any:
    """``values`` (numpy or torch) with ``extra`` entries of ``fill`` appended along the first dimension."""
    if isinstance(values, torch.Tensor):
        return torch.cat([values, values.new_full((extra, *values.shape[1:]), fill)])
    return np.concatenate([values, np.full((extra, *values.shape[1:]), fill, values.dtype)])


def packed(layout: Layout, modalities: list[str], payload: dict[str, Any], metadata: dict[str, Any],
           failures: list[dict], static_shapes: bool, max_documents: int | None) -> PackedBatch:
    """The PackedBatch of a laid-out batch; skipped samples listed in ``metadata["errors"]``; with static shapes
    ``cu_seqlens`` padded to ``max_documents + 1`` entries."""
    if failures:
        metadata["errors"] = failures
    batch = PackedBatch.from_metadata(_LAYOUTS.metadata(layout), modalities=modalities, data=payload,
                                      metadata=metadata)
    if static_shapes and max_documents is not None:
        batch = batch.pad_documents(max_documents)
    return batch
