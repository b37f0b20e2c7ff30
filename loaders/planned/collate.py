"""Collation: the samples of one planned batch read, checked, transformed and laid out as a PackedBatch.

:func:`collate_batch` takes what a batch reads (:mod:`mmfeed.loaders.planned.reads`: :class:`EpisodeReads` from
episode windows and chunks, :class:`RecordReads` from records) and runs one straight pipeline per kind,
:func:`collate` for episode samples and :func:`collate_records` for records, through the same steps
(:mod:`mmfeed.loaders.planned.steps`): read under the error policy -> check -> transform -> lay out. Each step gets
explicit inputs (the source's reading functions, what was read, each sample's flags, the transform's inputs) and
returns data; what differs between the kinds (how a sample is read, where a failure lies, what a transform is
shown) is written here, in small functions of the source and the sample.

Each sample becomes one document; its pieces follow the token layout (:mod:`mmfeed.packing.layout`) and each
feature's payload is flat over the batch in the order its tokens appear: ``data[feature]`` ``[n, *shape]``
(video frames stay uint8 ``[n, H, W, 3]``, or I420 planes ``[n, H * 3 // 2, W]`` from a source opened with
``frame_format="yuv420"``, all the way to the device), ``data["text"]`` int32 ``[n]`` and
``data[f"{feature}_is_pad"]`` bool ``[n]`` beside each feature (LeRobot's convention for clamped times), and for a
feature a mixture pads (``pad_to``) ``data[f"{feature}_dim_mask"]`` bool ``[n, width]``, one mask row per payload
row. ``metadata`` holds per-document ``sample``, ``episode``, ``start_step``, ``start_time`` (seconds) and, for a
mixture, ``dataset`` (and ``embodiment``, given embodiments).

In a DataLoader worker the frames of a batch are decoded straight into one shared-memory buffer per feature
(recycled between batches, :mod:`mmfeed.loaders.shm`), so handing the batch to the training process copies
nothing. A transform (``Packing(transform=fn)``, ``PlannedDataset.records(..., transform=fn)``) runs on each
sample after it is read, with a generator seeded from ``(seed, epoch, sample id)``: the same augmentation for any
number of workers, replayed exactly after a resume.

With ``static_shapes`` every payload is padded to the most the batch could ever hold (from the rows, the
capacity and the layout; padded entries flagged in ``_is_pad``) and ``cu_seqlens`` to the most documents a batch
can hold (repeating its last value), so every batch of the epoch has the same tensor shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import torch

from mmfeed.codecs.colour import frame_step_shape
from mmfeed.loaders.clock import stage
from mmfeed.loaders.planned.errors import ErrorCounter, ErrorPolicy
from mmfeed.loaders.planned.reads import (DocumentNames, EpisodeReads, RecordReads, RecordSource, SampleRead,
                                          WindowSamples, episode_sample, record_sample)
from mmfeed.loaders.planned.steps import (
    Places,
    batch_layout,
    fail_nonfinite,
    find_nonfinite,
    packed,
    pad_static,
    read_under_policy,
    sample_generator,
    samples_of,
    transform_each,
    without_failures,
)
from mmfeed.loaders.shm import give_back, phase_headroom, phase_offset, pooled_buffer
from mmfeed.loaders.sources.base import EpisodeRequest, EpisodeSource, WindowArrays
from mmfeed.packing import PackedBatch
from mmfeed.packing.batch import BY_VALUE_BYTES
from mmfeed.packing.layout import TEXT, SampleLayout, TokenLayout

__all__ = ["SampleRead", "collate", "collate_batch", "collate_records", "sample_generator", "samples_of"]


_IN_ORDER = object()  # marker: a feature's payload items are its read array in order


def collate_batch(reads: EpisodeReads | RecordReads, rows: Sequence[np.ndarray], capacity: int,
                  **kwargs: Any) -> PackedBatch:
    """The PackedBatch of ``rows`` (sample ids per row) from what their samples read (``items.reads(ids)``, the
    ids row after row): :func:`collate` for episode samples, :func:`collate_records` for records; ``kwargs`` as
    there."""
    if isinstance(reads, RecordReads):
        return collate_records(reads.records, rows, capacity, **kwargs)
    if isinstance(reads, EpisodeReads):
        return collate(reads.source, reads.samples, rows, capacity, layout=reads.layout, features=reads.features,
                       names=reads.names, windows=reads.windows, **kwargs)
    raise TypeError(f"collate_batch takes EpisodeReads or RecordReads (what items.reads(samples) returns), got "
                    f"{type(reads).__name__}")


def collate(source: EpisodeSource, reads: Sequence[SampleRead], rows: Sequence[np.ndarray], capacity: int, *,
            layout: TokenLayout, features: Sequence[str], num_rows: int | None = None, static_shapes: bool = False,
            max_documents: int | None = None, errors: ErrorCounter | None = None, epoch: int = 0, seed: int = 0,
            transform: Callable | None = None, names: DocumentNames | None = None,
            windows: WindowArrays | None = None) -> PackedBatch:
    """Read the samples ``reads`` describe (one :class:`SampleRead` per sample id of
    ``rows``, row after row) from ``source`` and pack them into a PackedBatch whose modalities are the task text
    and ``features``, laid out by ``layout``.

    capacity: tokens per row; 0 pads to the longest document of the batch (bucket and fixed modes).
    num_rows: rows of the batch (empty rows appended as padding); default ``len(rows)``.
    max_documents: with ``static_shapes``, the length ``cu_seqlens`` is padded to, minus one.
    errors: the error policy's running counter; None raises on the first failure. Samples that fail under
        "skip"/"warn" are left out of their rows (the batch still goes out) and listed in ``metadata["errors"]``.
    names: how the documents are named in ``metadata`` when not by ``rows``' ids and the source
        (:class:`~mmfeed.loaders.planned.reads.DocumentNames`).
    windows: the same samples' windows as arrays, where every one reads every feature: without a transform the
        source reads them in one call (``read_windows``) where it can, else request by request.
    """
    policy = errors.policy if errors is not None else ErrorPolicy()
    samples = samples_of(rows)
    lazy = reads if isinstance(reads, WindowSamples) else None  # its reads made only if asked for below
    reads = None if lazy is not None else list(reads)
    layouts = lazy.layouts if lazy is not None else [r.layout for r in reads]
    plans = _payload_plans(layouts, layout, [TEXT, *features])
    whole = _read_windows(source, windows, plans) if windows is not None and transform is None else None
    floats = [f for f, feat in source.features.items() if feat.kind == "array" and np.dtype(feat.dtype).kind == "f"]
    arrays, read, failures, direct = None, None, [], {}  # arrays: feature -> [B, n, ...], while the payload can
    # be laid out from them; read: each sample's data, made only where a step works sample by sample
    if whole is not None:  # the batch read in one call; checked once
        data, direct, arrays = whole
        if arrays is not None and not all(np.isfinite(arrays[f]).all() for f in floats if f in arrays):
            arrays = None  # masked or failed sample by sample below
    if arrays is None:  # sample by sample from here
        reads = reads if reads is not None else lazy.reads()
        pads = [r.pads for r in reads]
        requests = [r.request for r in reads]
        places = Places([r.sample for r in reads], source.describe, [r.episode for r in requests])
        if whole is None:
            if transform is None:
                requests, direct = _decode_in_place(source, requests, plans)
            # read under the error policy
            read, failures = read_under_policy(requests, source.read_many, None, places, errors)
            _fill_direct(requests, read, direct)
        else:
            read = _samples_of(data)
        # check
        found = find_nonfinite(read, pads, floats, policy.nonfinite == "mask")
        fail_nonfinite([(k, _episode_located(source, requests[k], key, bad)) for k, key, bad in found], read,
                       places, errors, failures)
    # transform
    if transform is not None:
        inputs = map(partial(episode_sample, source), reads, read)  # made as the transform asks, one at a time
        read = transform_each(inputs, read, [r.sample for r in reads], transform, epoch, seed, "frames", pads)
    if failures:
        rows, keep = without_failures(rows, samples, failures)
        samples = samples[keep]
        read, pads, reads, plans = ([x[i] for i in keep] for x in (read, pads, reads, plans))
        if names is not None:
            names = replace(names, sample=names.sample[keep], episode=names.episode[keep])
        direct = {}  # the decoded-in-place buffers now have holes: gather the kept pieces instead
    # lay out
    with stage("collate"):
        if arrays is not None:  # no sample failed: all of them were read and checked as arrays
            texts = lazy.texts if lazy is not None else [r.text for r in reads]
            payload, segments, steps, doc_tokens = _window_payload(texts, layouts, arrays, windows, plans, direct)
        else:
            payload, segments, steps, doc_tokens = _episode_payload(source, reads, read, pads, plans, direct)
        row_capacity = capacity or max(doc_tokens, default=1)
        nrows = len(rows) if num_rows is None else num_rows
        _add_absent(payload, source, features, read or [])
        if static_shapes:
            per_entry = {f: layout.tokens(f) for f in features}
            pad_static(payload, {TEXT: layout.tokens_per_text_token, **per_entry}, nrows * row_capacity)
        batch_lay = batch_layout(rows, nrows, row_capacity, doc_tokens, segments, steps, len(features) + 1)
        if reads is None:
            episodes, starts = lazy.episodes, lazy.starts
        else:
            episodes, starts = [r.request.episode for r in reads], [r.start for r in reads]
        metadata = _episode_metadata(source, samples, episodes, starts, names)
        if names is not None:
            failures = failures + names.errors
        return packed(batch_lay, [TEXT, *features], payload, metadata, failures, static_shapes, max_documents)


def collate_records(records: RecordSource, rows: Sequence[np.ndarray], capacity: int, *,
                    num_rows: int | None = None, static_shapes: bool = False, max_documents: int | None = None,
                    errors: ErrorCounter | None = None, epoch: int = 0, seed: int = 0,
                    transform: Callable | None = None) -> PackedBatch:
    """Read the records of ``rows`` (record ids per row) from ``records`` (:class:`~mmfeed.loaders.planned.reads.
    RecordSource`, e.g. :class:`~mmfeed.loaders.planned.records.Records`) and pack them into a PackedBatch, one
    document per record, token-causal: the same steps and keywords as :func:`collate`. Each record tensor is flat
    over the batch under its key, one entry per token; with ``ErrorPolicy(nonfinite="mask")`` every float key has
    its ``<key>_is_pad`` beside it. ``metadata`` holds per-document ``sample``, the records' other entries in
    ``samples`` and the skipped ones in ``errors``."""
    policy = errors.policy if errors is not None else ErrorPolicy()
    samples = samples_of(rows)

    places = Places(samples, records.describe)
    # read under the error policy: each record's tensors and its other entries
    pairs, failures = read_under_policy(samples.tolist(), None, records.read, places, errors)
    read = [None if p is None else p[0] for p in pairs]
    extras = [None if p is None else p[1] for p in pairs]
    pads = [_record_pads(data, policy) for data in read]
    # check
    found = find_nonfinite(read, pads, None, policy.nonfinite == "mask")
    fail_nonfinite([(k, _record_located(records, int(samples[k]), key, bad)) for k, key, bad in found], read,
                   places, errors, failures)
    # transform
    if transform is not None:
        inputs = map(partial(record_sample, records), samples.tolist(), read, extras)  # one at a time
        read = transform_each(inputs, read, samples, transform, epoch, seed, "tokens")
    if failures:
        rows, keep = without_failures(rows, samples, failures)
        samples = samples[keep]
        read, pads, extras = [read[i] for i in keep], [pads[i] for i in keep], [extras[i] for i in keep]
    # lay out
    with stage("collate"):
        if not read:  # every record of the batch failed: its keys still come, empty
            empty = records.empty_record(policy.max_consecutive_errors)
            read, pads = [empty], [_record_pads(empty, policy)]
        payload = _record_payload(records, samples, read, pads)
        doc_tokens = records.tokens[samples]
        row_capacity = capacity or int(doc_tokens.max(initial=1))
        nrows = len(rows) if num_rows is None else num_rows
        if static_shapes:
            pad_static(payload, dict.fromkeys(read[0], 1), nrows * row_capacity)
        layout = batch_layout(rows, nrows, row_capacity, doc_tokens)
        metadata: dict[str, Any] = {"sample": torch.from_numpy(samples)}
        extras = [e for e in extras if e is not None]
        if extras:
            metadata["samples"] = extras
        return packed(layout, [TEXT], payload, metadata, failures, static_shapes, max_documents)


# -- episode samples: where a failure lies, what a transform gets, the payload and metadata ---------------------
def _episode_located(source: EpisodeSource, request: EpisodeRequest, key: str, bad: np.ndarray) -> str:
    frames = np.asarray(request.indices[key])[bad].tolist()
    return f"{source.describe(request.episode)} feature {key!r}: NaN or inf at frames {frames}"


def _payload_plans(layouts: Sequence[SampleLayout], layout: TokenLayout, modalities: list[str]) -> list[tuple]:
    """:func:`_payload_plan` of each sample's layout (computed once per distinct sample layout)."""
    index = {m: i for i, m in enumerate(modalities)}
    plans: dict[int, tuple] = {}
    for lay in layouts:
        if id(lay) not in plans:
            plans[id(lay)] = _payload_plan(lay, layout, index)
    return [plans[id(lay)] for lay in layouts]


def _episode_payload(source: EpisodeSource, reads: list[SampleRead], read: list, pads: list, plans: list,
                     direct: dict) -> tuple[dict[str, Any], list, list, list]:
    """The batch's payload (each feature flat in token order, its ``_is_pad`` flags and ``_dim_mask`` rows, the
    task text; ``direct``: features already decoded in place) and each document's segments, steps and tokens."""
    pieces: dict[str, list[np.ndarray]] = {}
    pad_pieces: dict[str, list[np.ndarray]] = {}
    mask_pieces: dict[str, list[np.ndarray]] = {}
    segments, steps, doc_tokens = [], [], []
    for r, data, pad, (order, doc_segments, doc_steps) in zip(reads, read, pads, plans):
        if len(r.text):
            pieces.setdefault(TEXT, []).append(r.text)
        for feature, positions in order.items():
            if feature in direct:  # already decoded into its place in the payload
                pad_pieces.setdefault(feature, []).append(pad[feature])
                continue
            values = data[feature]
            # Positions in read order (the usual case) take the array as it is: no copy before the concat.
            pieces.setdefault(feature, []).append(values if positions is _IN_ORDER else values[positions])
            pad_pieces.setdefault(feature, []).append(
                pad[feature] if positions is _IN_ORDER else pad[feature][positions])
            mask = source.dim_mask(r.request.episode, feature)
            if mask is not None:  # one mask row per payload row of the feature
                mask_pieces.setdefault(feature, []).append(np.broadcast_to(mask, (len(pieces[feature][-1]),
                                                                                  len(mask))))
        segments.append(doc_segments)
        steps.append(doc_steps)
        doc_tokens.append(r.layout.num_tokens)
    payload = {key: _concat(parts) for key, parts in pieces.items()}
    payload.update(direct)
    payload.update({f"{key}_is_pad": np.concatenate(parts) for key, parts in pad_pieces.items()})
    payload.update({f"{key}_dim_mask": np.concatenate(parts) for key, parts in mask_pieces.items()})
    return payload, segments, steps, doc_tokens


def _episode_metadata(source: EpisodeSource, samples: np.ndarray, episodes: Sequence[int] | np.ndarray,
                      starts: Sequence[int] | np.ndarray, names: DocumentNames | None) -> dict[str, Any]:
    """Per document: ``sample``, ``episode``, ``start_step``, ``start_time``; the ``source``'s name; in a mixture
    each document's ``dataset`` (and ``embodiment``). ``names``, when given, names the samples, episodes and
    source instead (and no dataset)."""
    episode = np.array(episodes, dtype=np.int64)
    start = np.array(starts, dtype=np.int64)
    metadata: dict[str, Any] = {
        "sample": torch.from_numpy(samples if names is None else names.sample),
        "episode": torch.from_numpy(episode if names is None else names.episode),
        "start_step": torch.from_numpy(start),
        "start_time": torch.from_numpy(start / np.maximum(source.fps[episode], 1e-12)),
        "source": source.name if names is None else names.source,
    }
    if names is not None:
        return metadata
    dataset_of = getattr(source, "dataset_of", None)
    if dataset_of is not None:
        metadata["dataset"] = torch.from_numpy(np.asarray(dataset_of)[episode].astype(np.int64))
        embodiment_of = getattr(source, "embodiment_of_dataset", None)
        if embodiment_of is not None:
            metadata["embodiment"] = torch.from_numpy(embodiment_of[metadata["dataset"].numpy()])
    return metadata


def _payload_plan(lay: SampleLayout, layout,
                  index: dict[str, int]) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """Where a sample's payload items come from, in token order (positions among each feature's read frames),
    its segments ``(modality index, tokens)`` and its step sizes."""
    order: dict[str, list[int]] = {}
    for feature, position, tokens in lay.runs:
        if feature != TEXT:
            order.setdefault(feature, []).extend(range(position, position + tokens // layout.tokens(feature)))
    segments = np.array([(index[feature], tokens) for feature, _, tokens in lay.runs], np.int64).reshape(-1, 2)
    # Every read position of a feature appears once, so 0, 1, 2, ... means "the read array as it is".
    positions = {k: _IN_ORDER if v == list(range(len(v))) else np.asarray(v, dtype=np.int64) for k, v in order.items()}
    return positions, segments, np.asarray(lay.step_sizes, dtype=np.int64)


def _read_windows(source: EpisodeSource, windows: WindowArrays, plans: list
                  ) -> tuple[dict, dict, dict | None] | None:
    """The batch's windows read in one call (``source.read_windows``): its arrays (feature -> ``[B, n, ...]``),
    each camera's payload buffer, which the frames were decoded into, and the arrays again where the payload
    may be laid out from them (None where a mixture pads a feature: sample by sample). None
    where the source reads request by request, where a sample takes a feature's frames out of read order, or
    where anything fails (a pooled buffer taken is given back): the request path then reads the batch, naming
    a failing request and applying the error policy."""
    features = list(windows.indices)
    distinct = {id(plan): plan for plan in plans}.values()  # samples of one layout share their plan
    if any(plan[0].get(f) is not _IN_ORDER for plan in distinct for f in features):
        return None
    episodes = np.unique(windows.episodes).tolist()
    steps = {f: _frame_step(source, f, episodes) for f in features if source.features[f].kind == "video"}
    if None in steps.values():
        return None
    batch, taken = len(windows.episodes), {}

    def buffer(feature: str, phase: int = 0) -> np.ndarray:
        n = windows.indices[feature].shape[1]
        taken[feature], view = _alloc(feature, (batch * n, *steps[feature]), phase)
        return view.reshape(batch, n, *steps[feature])

    try:
        data = source.read_windows(windows, buffer)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 (the request path meets it again and names the request)
        data = None
    if data is None:
        for value in taken.values():
            give_back(value)
        return None
    padded = type(source).dim_mask is not EpisodeSource.dim_mask and any(  # a mixture's pad_to
        source.dim_mask(e, f) is not None for e in episodes for f in features)
    direct = {f: taken[f] for f in source.features if f in taken}  # in the order the request path gives them
    return data, direct, None if padded else data


def _samples_of(data: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Each sample's data (views) of a batch read in one call, for the sample-by-sample steps."""
    return [dict(zip(data, values)) for values in zip(*data.values())]


def _window_payload(texts: list[np.ndarray], layouts: list[SampleLayout], arrays: dict[str, np.ndarray],
                    windows: WindowArrays, plans: list, direct: dict) -> tuple[dict[str, Any], list, list, list]:
    """:func:`_episode_payload` of a batch read in one call whose every sample takes every feature's frames in
    read order (no per-sample work but the task texts, ``texts`` and ``layouts`` each sample's): each feature's
    payload is its ``[B, n, ...]`` array as rows (a camera's: the buffer its frames were decoded into), its
    ``_is_pad`` flags the batch's; the keys in the order :func:`_episode_payload` gives them."""
    first_text = len(texts[0]) if texts else 0
    texts = [t for t in texts if len(t)]
    first = plans[0][0]  # every sample's features, in the order its token runs name them
    payload: dict[str, Any] = {TEXT: _concat(texts)} if texts and first_text else {}
    for feature in first:
        if feature not in direct:
            values = arrays[feature]
            payload[feature] = _concat([values.reshape(-1, *values.shape[2:])])
    if texts and TEXT not in payload:  # the first sample has no text: the key comes after its features
        payload[TEXT] = _concat(texts)
    payload.update(direct)
    payload.update({f"{f}_is_pad": windows.pads[f].reshape(-1) for f in first})
    return payload, [p[1] for p in plans], [p[2] for p in plans], [lay.num_tokens for lay in layouts]


def _decode_in_place(source: EpisodeSource, requests: list, sample_plans: list) -> tuple[list, dict]:
    """Give each request's frames a slice of one payload buffer per video feature (shared memory in a worker), so
    the decoder writes every frame straight to where the batch holds it: no gather, no concatenation. Only for
    features whose frames every sample reading them takes in read order, from sources that know their frame size.
    In a mixture a sample of a dataset without the feature takes no frames of it (its slice is empty), so each
    camera of each embodiment is decoded in place too."""
    if not requests:
        return requests, {}
    videos = [f for f, feat in source.features.items() if feat.kind == "video"]
    buffers, outs = {}, [{} for _ in requests]
    for feature in videos:
        having = [k for k, r in enumerate(requests) if feature in r.indices]
        if not having or any(sample_plans[k][0].get(feature) is not _IN_ORDER for k in having):
            continue
        step = _frame_step(source, feature, [requests[k].episode for k in having])
        if step is None:
            continue
        counts = [len(r.indices[feature]) if feature in r.indices else 0 for r in requests]
        buffer, view = _alloc(feature, (sum(counts), *step))
        start = 0
        for k in having:
            out, n = outs[k], counts[k]
            out[feature] = view[start : start + n]
            start += n
        buffers[feature] = buffer
    if not buffers:
        return requests, {}
    # built directly: dataclasses.replace costs 3 us a request
    return [EpisodeRequest(r.episode, r.indices, o) for r, o in zip(requests, outs)], buffers


def _fill_direct(requests: list, read: list, direct: dict) -> None:
    """Copy frames a source returned elsewhere (it may ignore ``out``) into their place in the payload."""
    for request, data in zip(requests, read):
        if data is None or not request.out:
            continue
        for feature, out in request.out.items():
            if feature in direct and not np.may_share_memory(data[feature], out):
                out[...] = data[feature]
                data[feature] = out


def _frame_step(source: EpisodeSource, feature: str, episodes: Sequence[int]) -> tuple[int, ...] | None:
    """The shape of one of a video feature's frames in the payload, where every one of ``episodes`` gives the same
    known frame size; None otherwise, or where a video cannot be read (the read meets it again, under the error
    policy)."""
    try:
        shapes = source.frame_shapes(episodes, feature)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 (an unreadable video)
        return None
    if len(shapes) != 1 or None in shapes:
        return None
    return frame_step_shape(*shapes.pop(), source.features[feature].frame_format or "rgb24")


def _alloc(key: str, shape: tuple[int, ...], phase: int = 0) -> tuple[np.ndarray | torch.Tensor, np.ndarray]:
    """A uint8 buffer for payload ``key`` and a numpy view of it, starting ``phase`` bytes past a 64-byte boundary
    (:func:`~mmfeed.loaders.shm.phase_offset`); in a DataLoader worker a shared-memory tensor, which the training
    process maps as is (a recycled one when the worker recycles buffers, see :mod:`mmfeed.loaders.shm`)."""
    if torch.utils.data.get_worker_info() is None:
        size = int(np.prod(shape))
        raw = np.empty(size + phase_headroom(phase), dtype=np.uint8)
        at = phase_offset(raw.ctypes.data, phase)
        buffer = raw[at:at + size].reshape(shape)
        return buffer, buffer
    pooled = pooled_buffer(key, shape, phase=phase)
    buffer = pooled if pooled is not None else _shared(shape, torch.uint8, phase)
    return buffer, buffer.numpy()


def _shared(shape: tuple[int, ...], dtype: torch.dtype, phase: int = 0) -> torch.Tensor:
    """An uninitialised tensor allocated in shared memory (``share_memory_()`` would allocate, then copy), starting
    ``phase`` bytes past a 64-byte boundary."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    storage = torch.UntypedStorage._new_shared(int(np.prod(shape)) * itemsize + phase_headroom(phase))
    offset = phase_offset(storage.data_ptr(), phase, itemsize) // itemsize
    return torch.empty(0, dtype=dtype).set_(storage, offset, shape)


def _concat(parts: list[np.ndarray]) -> np.ndarray | torch.Tensor:
    """``np.concatenate(parts)``; in a DataLoader worker a large result is written straight into shared memory, so
    that handing the batch to the training process costs no second copy (torch would copy it there when
    pickling). Small ones stay plain: a PackedBatch pickles them by value, which is cheaper than a shared file."""
    nbytes = sum([p.nbytes for p in parts])  # a list: no generator resumed a part
    if torch.utils.data.get_worker_info() is None or len(parts) == 0 or nbytes <= BY_VALUE_BYTES \
            or parts[0].dtype == object:
        return np.concatenate(parts)
    shape = (sum(len(p) for p in parts), *parts[0].shape[1:])
    out = _shared(shape, torch.from_numpy(np.ascontiguousarray(parts[0][:0])).dtype)
    np.concatenate(parts, out=out.numpy())
    return out


# -- records: where a failure lies, what a transform gets, the payload ----------------------------------------------
def _record_located(records: RecordSource, index: int, key: str, bad: np.ndarray) -> str:
    return f"{records.describe(index)} key {key!r}: NaN or inf at positions {np.flatnonzero(bad).tolist()}"


def _record_pads(data: dict | None, policy: ErrorPolicy) -> dict[str, np.ndarray]:
    """A record's ``is_pad`` flags: under ``nonfinite="mask"`` one per float key (all False until masked)."""
    if data is None or policy.nonfinite != "mask":
        return {}
    return {key: np.zeros(len(v), bool) for key, v in data.items() if v.is_floating_point()}


def _record_payload(records: RecordSource, samples: np.ndarray, read: list[dict], pads: list[dict]
                    ) -> dict[str, Any]:
    """The records' tensors concatenated key by key (and their ``_is_pad`` flags); every record of a batch must
    hold the same keys."""
    keys = list(read[0])
    for s, data in zip(samples, read):
        if set(data) != set(keys):
            raise ValueError(f"{records.describe(int(s))} holds {sorted(data)} but another record of its batch holds "
                             f"{sorted(keys)}; every record must have the same tensors (they are concatenated key "
                             "by key)")
    flagged = [key for key in keys if key in pads[0]]
    for key in flagged:
        if f"{key}_is_pad" in keys:
            raise ValueError(f"the records hold {key + '_is_pad'!r}, the name under which ErrorPolicy(nonfinite="
                             f"'mask') flags the masked entries of {key!r}; rename it")
    payload: dict[str, Any] = {key: torch.cat([data[key] for data in read]) for key in keys}
    payload.update({f"{key}_is_pad": np.concatenate([p[key] for p in pads]) for key in flagged})
    return payload


def _add_absent(payload: dict[str, Any], source: EpisodeSource, features: Sequence[str], read: list) -> None:
    """Every feature the batch lists gets its payload keys, empty where no sample of the batch holds it (a
    mixture's batch of datasets without that camera), so a batch's keys are always its modalities'."""
    payload.setdefault(TEXT, np.zeros(0, np.int32))
    for key in features:
        if key not in payload:
            example = next((d[key] for d in read if d is not None and key in d), None)
            spec = source.features[key]
            payload[key] = example[:0] if example is not None else np.zeros((0, *spec.shape), np.dtype(spec.dtype))
            payload.setdefault(f"{key}_is_pad", np.zeros(0, bool))
        if key in getattr(source, "padded", {}):
            payload.setdefault(f"{key}_dim_mask", np.zeros((0, source.padded[key]), bool))
