"""Collation: the samples of one planned batch read, decoded, transformed and laid out as a PackedBatch.

Each sample becomes one document; its pieces follow the token layout (:mod:`mmfeed.packing.layout`) and each
feature's payload is flat over the batch in the order its tokens appear: ``data[feature]`` ``[n, *shape]``
(video frames stay uint8 ``[n, H, W, 3]``, or I420 planes ``[n, H * 3 // 2, W]`` from a source opened with
``frame_format="yuv420"``, all the way to the device), ``data["text"]`` int32 ``[n]`` and
``data[f"{feature}_is_pad"]`` bool ``[n]`` beside each feature (LeRobot's convention for clamped times).
``metadata`` holds per-document ``sample``, ``episode``, ``start_step``, ``start_time`` (seconds) and, for a
mixture, ``dataset``.

In a DataLoader worker the frames of a batch are decoded straight into one shared-memory buffer per feature
(recycled between batches, :mod:`mmfeed.loaders.shm`), so handing the batch to the training process copies
nothing. A transform (``Packing(transform=fn)``) runs on each sample after decode, with a generator seeded from
``(seed, epoch, sample id)``: the same augmentation for any number of workers, replayed exactly after a resume.

With ``static_shapes`` every payload is padded to the most the batch could ever hold (from the rows, the
capacity and the layout; padded entries flagged in ``_is_pad``) and ``cu_seqlens`` to the most documents a batch
can hold (repeating its last value), so every batch of the epoch has the same tensor shapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from mmfeed.codecs.colour import frame_step_shape
from mmfeed.loaders.errors import ErrorCounter, ErrorPolicy, SampleError
from mmfeed.loaders.shm import pooled_buffer
from mmfeed.loaders.sources.base import EpisodeSource
from mmfeed.loaders.timing import stage
from mmfeed.packing import PackedBatch
from mmfeed.packing.batch import BY_VALUE_BYTES
from mmfeed.packing.layout import TEXT, SampleLayout
from mmfeed.packing.metadata import Layout, make_layout

__all__ = ["collate", "sample_generator"]

_IN_ORDER = object()  # marker: a feature's payload items are its read array in order


def sample_generator(seed: int, epoch: int, sample: int) -> torch.Generator:
    """The generator a transform gets for one sample: a pure function of ``(seed, epoch, sample id)``."""
    state = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(epoch), int(sample)]).generate_state(2, np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def collate(items: Any, rows: Sequence[np.ndarray], capacity: int, *, num_rows: int | None = None,
            static_shapes: bool = False, max_documents: int | None = None, errors: ErrorCounter | None = None,
            epoch: int = 0, seed: int = 0, transform: Callable | None = None) -> PackedBatch:
    """Read the samples of ``rows`` (sample ids of :class:`~mmfeed.loaders.items.EpisodeItems` per row) and pack
    them into a PackedBatch.

    capacity: tokens per row; 0 pads to the longest document of the batch (bucket and fixed modes).
    num_rows: rows of the batch (empty rows appended as padding); default ``len(rows)``.
    max_documents: with ``static_shapes``, the length ``cu_seqlens`` is padded to, minus one.
    errors: the error policy's running counter; None raises on the first failure. Samples that fail under
        "skip"/"warn" are left out of their rows (the batch still goes out) and listed in ``metadata["errors"]``.
    """
    source: EpisodeSource = items.source
    policy = errors.policy if errors is not None else ErrorPolicy()
    samples = np.concatenate(rows).astype(np.int64) if len(rows) else np.zeros(0, np.int64)
    reads = items.requests(samples)
    requests = [r for r, _, _ in reads]
    pads = [p for _, p, _ in reads]
    layouts = [lay for _, _, lay in reads]
    modalities = [TEXT, *items.features]
    index = {m: i for i, m in enumerate(modalities)}
    plans: dict[int, tuple] = {}
    for lay in layouts:
        if id(lay) not in plans:
            plans[id(lay)] = _payload_plan(lay, items.layout, index)
    sample_plans = [plans[id(lay)] for lay in layouts]
    direct: dict[str, Any] = {}
    if transform is None:
        requests, direct = _decode_in_place(source, requests, sample_plans)
    read, failures = _read(source, requests, samples, errors)
    _fill_direct(requests, read, direct)
    _check_finite(source, requests, read, pads, samples, policy, errors, failures)
    if transform is not None:
        read = _transform(items, samples, requests, read, pads, transform, epoch, seed)
    if failures:
        bad = {f["sample"] for f in failures}
        keep = [i for i, s in enumerate(samples) if int(s) not in bad]
        rows = [np.asarray([s for s in row if int(s) not in bad], dtype=np.int64) for row in rows]
        samples = samples[keep]
        read, pads = [read[i] for i in keep], [pads[i] for i in keep]
        layouts, sample_plans = [layouts[i] for i in keep], [sample_plans[i] for i in keep]
        direct = {}  # the decoded-in-place buffers now have holes: gather the kept pieces instead
    with stage("collate"):
        pieces: dict[str, list[np.ndarray]] = {}
        pad_pieces: dict[str, list[np.ndarray]] = {}
        segments, steps, doc_tokens = [], [], []
        tasks = np.asarray(items.task[samples])  # once for the batch: windowed items compute it per sample id
        for task, data, pad, lay, (order, doc_segments, doc_steps) in zip(tasks, read, pads, layouts, sample_plans):
            text = items.text[task] if task >= 0 else None
            if text is not None and len(text):
                pieces.setdefault(TEXT, []).append(text)
            for feature, positions in order.items():
                if feature in direct:  # already decoded into its place in the payload
                    pad_pieces.setdefault(feature, []).append(pad[feature])
                    continue
                values = data[feature]
                # Positions in read order (the usual case) take the array as it is: no copy before the concat.
                pieces.setdefault(feature, []).append(values if positions is _IN_ORDER else values[positions])
                pad_pieces.setdefault(feature, []).append(
                    pad[feature] if positions is _IN_ORDER else pad[feature][positions])
            segments.append(doc_segments)
            steps.append(doc_steps)
            doc_tokens.append(lay.num_tokens)
        payload = {key: _concat(parts) for key, parts in pieces.items()}
        payload.update(direct)
        payload.update({f"{key}_is_pad": np.concatenate(parts) for key, parts in pad_pieces.items()})
        row_capacity = capacity or max(doc_tokens, default=1)
        nrows = len(rows) if num_rows is None else num_rows
        _add_absent(payload, items, read)
        if static_shapes:
            _pad_static(payload, items, nrows * row_capacity)
        layout = _batch_layout(rows, nrows, row_capacity, doc_tokens, segments, steps, len(modalities))
        episode, start = np.array(items.episode[samples]), np.array(items.start[samples])
        metadata: dict[str, Any] = {
            "sample": torch.from_numpy(samples),
            "episode": torch.from_numpy(episode),
            "start_step": torch.from_numpy(start),
            "start_time": torch.from_numpy(start / np.maximum(source.fps[episode], 1e-12)),
            "source": source.name,
        }
        dataset_of = getattr(source, "dataset_of", None)
        if dataset_of is not None:
            metadata["dataset"] = torch.from_numpy(np.asarray(dataset_of)[episode].astype(np.int64))
        if failures:
            metadata["errors"] = failures
        batch = PackedBatch.from_layout(layout, modalities=modalities, data=payload, metadata=metadata)
        if static_shapes and max_documents is not None:
            batch = batch.pad_documents(max_documents)
        return batch


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


def _batch_layout(rows: Sequence[np.ndarray], nrows: int, capacity: int, doc_tokens: list[int],
                  segments: list[np.ndarray], steps: list[np.ndarray], num_modalities: int) -> Layout:
    """The batch's :class:`~mmfeed.packing.metadata.Layout` from the documents' arrays (segments ``[n, 2]`` and
    step sizes of each document, in row order), validated by ``make_layout``; ``nrows - len(rows)`` empty rows
    pad the batch."""
    def offsets(sizes: list[int]) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)

    row_offsets = offsets([len(row) for row in rows] + [0] * (nrows - len(rows)))
    runs = np.concatenate(segments) if segments else np.zeros((0, 2), np.int64)
    return make_layout(np.asarray(doc_tokens, dtype=np.int64), row_offsets, capacity,
                       step_sizes=np.concatenate(steps) if steps else np.zeros(0, np.int64),
                       step_offsets=offsets([len(p) for p in steps]), segment_modalities=runs[:, 0],
                       segment_lengths=runs[:, 1], segment_offsets=offsets([len(p) for p in segments]),
                       num_modalities=num_modalities)


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
        try:
            shapes = {source.frame_shape(requests[k].episode, feature) for k in having}
        except MemoryError:
            raise
        except Exception:  # an unreadable video: the read below meets it again, under the error policy
            continue
        if len(shapes) != 1 or None in shapes:
            continue
        counts = [len(r.indices[feature]) if feature in r.indices else 0 for r in requests]
        step = frame_step_shape(*next(iter(shapes)), source.features[feature].frame_format or "rgb24")
        buffer = _alloc(feature, (sum(counts), *step))
        view = buffer.numpy() if isinstance(buffer, torch.Tensor) else buffer
        start = 0
        for k in having:
            out, n = outs[k], counts[k]
            out[feature] = view[start : start + n]
            start += n
        buffers[feature] = buffer
    if not buffers:
        return requests, {}
    return [dataclasses.replace(r, out=o) for r, o in zip(requests, outs)], buffers


def _fill_direct(requests: list, read: list, direct: dict) -> None:
    """Copy frames a source returned elsewhere (it may ignore ``out``) into their place in the payload."""
    for request, data in zip(requests, read):
        if data is None or not request.out:
            continue
        for feature, out in request.out.items():
            if feature in direct and not np.may_share_memory(data[feature], out):
                out[...] = data[feature]
                data[feature] = out


def _alloc(key: str, shape: tuple[int, ...]) -> np.ndarray | torch.Tensor:
    """A uint8 buffer for payload ``key``; in a DataLoader worker a shared-memory tensor, which the training
    process maps as is (a recycled one when the worker recycles buffers, see :mod:`mmfeed.loaders.shm`)."""
    if torch.utils.data.get_worker_info() is None:
        return np.empty(shape, dtype=np.uint8)
    pooled = pooled_buffer(key, shape)
    return pooled if pooled is not None else _shared(shape, torch.uint8)


def _shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor allocated in shared memory (``share_memory_()`` would allocate, then copy)."""
    numel = int(np.prod(shape))
    storage = torch.UntypedStorage._new_shared(numel * torch.empty((), dtype=dtype).element_size())
    return torch.empty(0, dtype=dtype).set_(storage).view(shape)


def _concat(parts: list[np.ndarray]) -> np.ndarray | torch.Tensor:
    """``np.concatenate(parts)``; in a DataLoader worker a large result is written straight into shared memory, so
    that handing the batch to the training process costs no second copy (torch would copy it there when
    pickling). Small ones stay plain: a PackedBatch pickles them by value, which is cheaper than a shared file."""
    nbytes = sum(p.nbytes for p in parts)
    if torch.utils.data.get_worker_info() is None or len(parts) == 0 or nbytes <= BY_VALUE_BYTES \
            or parts[0].dtype == object:
        return np.concatenate(parts)
    shape = (sum(len(p) for p in parts), *parts[0].shape[1:])
    out = _shared(shape, torch.from_numpy(np.ascontiguousarray(parts[0][:0])).dtype)
    np.concatenate(parts, out=out.numpy())
    return out


def _read(source: EpisodeSource, requests: list, samples: np.ndarray, errors: ErrorCounter | None):
    """``source.read_many(requests)``; under skip/warn a failing batch is read again sample by sample and the
    failing samples come back as None with a record each."""
    try:
        read = source.read_many(requests)
    except MemoryError:
        raise
    except Exception:
        if errors is None or errors.policy.on_error == "raise":
            raise
    else:
        if errors is not None and len(requests):
            errors.succeeded()
        return read, []
    read, failures = [], []
    for s, request in zip(samples, requests):
        try:
            read.append(source.read_many([request])[0])
            errors.succeeded()
        except MemoryError:
            raise
        except Exception as err:
            record = {"sample": int(s), "episode": int(request.episode), "source": source.describe(request.episode),
                      "reason": f"{type(err).__name__}: {err}"}
            failures.append(record)
            read.append(None)
            errors.failed(record)
    return read, failures


def _check_finite(source, requests, read, pads, samples, policy: ErrorPolicy, errors, failures: list) -> None:
    """NaN or inf in a float array feature: raise (through the error policy), or mask (0, flagged as padding)."""
    floats = [f for f, feat in source.features.items() if feat.kind == "array" and np.dtype(feat.dtype).kind == "f"]
    for i, data in enumerate(read):
        if data is None:
            continue
        for feature in floats:
            values = data.get(feature)
            if values is None or np.isfinite(values).all():
                continue
            bad = ~np.isfinite(values).reshape(len(values), -1).all(axis=1)
            frames = np.asarray(requests[i].indices[feature])[bad].tolist()
            if policy.nonfinite == "mask":
                data[feature] = np.where(np.isfinite(values), values, 0).astype(values.dtype)
                pads[i][feature] = pads[i][feature] | bad
                continue
            reason = f"{source.describe(requests[i].episode)} feature {feature!r}: NaN or inf at frames {frames}"
            if errors is None or policy.on_error == "raise":
                raise SampleError(reason + "; fix the data or use ErrorPolicy(nonfinite='mask')")
            record = {"sample": int(samples[i]), "episode": int(requests[i].episode),
                      "source": source.describe(requests[i].episode), "reason": f"SampleError: {reason}"}
            failures.append(record)
            read[i] = None
            errors.failed(record)
            break


def _transform(items, samples, requests, read, pads, transform: Callable, epoch: int, seed: int) -> list:
    """Run the user's transform on each sample (tensors in, tensors out), with its own seeded generator; the
    number of frames of every feature must stay (tokens were planned before anything was read)."""
    out = []
    tasks, starts = np.asarray(items.task[samples]), np.asarray(items.start[samples])
    for s, task, start, request, data, pad in zip(samples, tasks, starts, requests, read, pads):
        if data is None:
            out.append(None)
            continue
        sample = {f: torch.from_numpy(np.ascontiguousarray(v)) if v.dtype != object else v for f, v in data.items()}
        sample.update({f"{f}_is_pad": torch.from_numpy(p) for f, p in pad.items()})
        task = int(task)
        sample.update(task=items.source.tasks[task] if task >= 0 else "", episode_index=int(request.episode),
                      frame_index=int(start))
        result = transform(sample, sample_generator(seed, epoch, int(s)))
        if not isinstance(result, dict):
            raise TypeError(f"the transform must return a dict of tensors, got {type(result).__name__}")
        new = {}
        for f, before in data.items():
            after = result.get(f)
            if after is None:
                raise ValueError(f"the transform dropped feature {f!r}; it may change values and frame sizes only")
            after = after.numpy() if isinstance(after, torch.Tensor) else np.asarray(after)
            if len(after) != len(before):
                raise ValueError(f"the transform changed the number of frames of {f!r} from {len(before)} to "
                                 f"{len(after)}; tokens are planned before reading, so counts must stay")
            new[f] = after
        out.append(new)
    return out


def _pad_static(payload: dict[str, Any], items, slots: int) -> None:
    """Pad every payload (all present, see :func:`_add_absent`) to the most ``slots`` tokens could hold; padded
    entries are flagged as padding."""
    layout = items.layout
    for key in [TEXT, *items.features]:
        per_item = layout.tokens_per_text_token if key == TEXT else layout.tokens(key)
        have = payload[key]
        if isinstance(have, torch.Tensor):
            have = have.numpy()
        extra = slots // per_item - len(have)
        payload[key] = np.concatenate([have, np.zeros((extra, *have.shape[1:]), have.dtype)])
        if key != TEXT:
            payload[f"{key}_is_pad"] = np.concatenate([payload[f"{key}_is_pad"], np.ones(extra, bool)])


def _add_absent(payload: dict[str, Any], items, read: list) -> None:
    """Every feature the batch lists gets its payload keys, empty where no sample of the batch holds it (a
    mixture's batch of datasets without that camera), so a batch's keys are always its modalities'."""
    features = items.source.features
    payload.setdefault(TEXT, np.zeros(0, np.int32))
    for key in items.features:
        if key not in payload:
            example = next((d[key] for d in read if d is not None and key in d), None)
            payload[key] = example[:0] if example is not None else np.zeros((0, *features[key].shape),
                                                                            np.dtype(features[key].dtype))
            payload.setdefault(f"{key}_is_pad", np.zeros(0, bool))
