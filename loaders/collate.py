"""Collation: the samples of one planned batch read, decoded and laid out as a :class:`PackedBatch`.

Each sample becomes one document; its pieces follow the token layout (text, then the frames and proprio of each
observed time, then the action chunk), and each modality's payload is flat over the batch in token order:
``data["frames.<camera>"]`` uint8 ``[n_frames, H, W, 3]`` (frames stay uint8 all the way to the device),
``data["proprio"]`` float32 ``[n, Dp]``, ``data["action"]`` float32 ``[n, Da]``, ``data["text"]`` int32 ``[n]``,
and ``data["<key>_is_pad"]`` bool beside each windowed key (LeRobot's convention for clamped steps).
``metadata`` holds per-document ``sample``, ``episode``, ``start_step`` and ``start_time`` (seconds).

With ``static_shapes`` every payload is padded to the most the batch could ever hold (derived from the rows,
the capacity and the layout), padded entries flagged in ``_is_pad``, so every batch has identical tensor shapes
and torch.compile or CUDA graphs never recompile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from mmfeed.loaders.errors import ErrorCounter, ErrorPolicy, SampleError
from mmfeed.loaders.layout import FRAMES_PREFIX
from mmfeed.loaders.samples import SampleTable
from mmfeed.loaders.sources import Source
from mmfeed.loaders.shm import pooled_buffer
from mmfeed.loaders.timing import stage
from mmfeed.packing import PackedBatch
from mmfeed.packing.batch import BY_VALUE_BYTES

__all__ = ["collate_rows"]


def collate_rows(
    table: SampleTable,
    source: Source,
    rows: Sequence[np.ndarray],
    capacity: int,
    *,
    num_rows: int | None = None,
    static_shapes: bool = False,
    errors: ErrorCounter | None = None,
) -> PackedBatch:
    """Read the samples of ``rows`` (sample ids per row) from ``source`` and pack them into a PackedBatch.

    capacity: tokens per row; 0 pads to the longest document of the batch (bucket and fixed modes).
    num_rows: rows of the batch (empty rows appended as padding); default ``len(rows)``.
    errors: the error policy's running counter; None raises on the first failure. Samples that fail under
        "skip"/"warn" are left out of their rows (the batch still goes out) and listed in ``metadata["errors"]``.
    """
    policy = errors.policy if errors is not None else ErrorPolicy()
    samples = np.concatenate(rows).astype(np.int64) if len(rows) else np.zeros(0, np.int64)
    requests, pads = zip(*table.requests(samples, source.lengths)) if len(samples) else ((), ())
    index = {m: i for i, m in enumerate(table.layout.modalities())}
    plans: dict[int, tuple] = {}  # per sample layout: payload positions per key, segments, steps
    sample_plans = []
    for s in samples:
        sample_layout = table.sample_layout(int(s))
        if id(sample_layout) not in plans:
            plans[id(sample_layout)] = _payload_plan(sample_layout, table.layout, index)
        sample_plans.append(plans[id(sample_layout)])
    requests, direct = _decode_in_place(source, list(requests), sample_plans)
    read, failures = _read(source, requests, samples, errors)
    _check_finite(source, requests, read, pads, samples, policy, errors, failures)
    if failures:
        bad = {f["sample"] for f in failures}
        keep = [i for i, s in enumerate(samples) if int(s) not in bad]
        rows = [np.asarray([s for s in row if int(s) not in bad], dtype=np.int64) for row in rows]
        samples = samples[keep]
        read, pads = [read[i] for i in keep], [pads[i] for i in keep]
        sample_plans = [sample_plans[i] for i in keep]
        direct = {}  # the decoded-in-place buffers now have holes: gather the kept pieces instead
    with stage("collate"):
        layout = table.layout
        modalities = layout.modalities()
        pieces: dict[str, list[np.ndarray]] = {}
        pad_pieces: dict[str, list[np.ndarray]] = {}
        segments, steps, doc_tokens = [], [], []
        for s, data, pad, plan in zip(samples, read, pads, sample_plans):
            sample_layout = table.sample_layout(int(s))
            order, doc_segments, doc_steps = plan
            text = table.text[table.episode[s]]
            if len(text):
                pieces.setdefault("text", []).append(text)
            for key, positions in order.items():
                if key in direct:  # already decoded into its place in the payload
                    pad_pieces.setdefault(key, []).append(pad[key])
                    continue
                values = data[key]
                # Positions in window order (the usual case) take the array as it is: no copy before the concat.
                pieces.setdefault(key, []).append(values if positions is _IN_ORDER else values[positions])
                pad_pieces.setdefault(key, []).append(pad[key] if positions is _IN_ORDER else pad[key][positions])
            segments.append(doc_segments)
            steps.append(doc_steps)
            doc_tokens.append(sample_layout.num_tokens)
        payload = {key: _concat(parts) for key, parts in pieces.items()}
        payload.update(direct)
        payload.update({f"{key}_is_pad": np.concatenate(parts) for key, parts in pad_pieces.items()})
        row_capacity = capacity or max(doc_tokens, default=1)
        nrows = len(rows) if num_rows is None else num_rows
        if static_shapes:
            _pad_static(payload, layout, nrows * row_capacity, read)
        row_lengths, row_segments, row_steps, d = [], [], [], 0
        for row in rows:
            n = len(row)
            row_lengths.append(doc_tokens[d : d + n])
            row_segments.append(segments[d : d + n])
            row_steps.append(steps[d : d + n])
            d += n
        for _ in range(nrows - len(rows)):
            row_lengths.append([]), row_segments.append([]), row_steps.append([])
        fps = source.fps[table.episode[samples]] if len(samples) else np.zeros(0)
        metadata = {
            "sample": torch.from_numpy(samples),
            "episode": torch.from_numpy(table.episode[samples].copy()),
            "start_step": torch.from_numpy(table.start[samples].copy()),
            "start_time": torch.from_numpy(table.start[samples] / np.maximum(fps, 1e-12)),
            "source": source.name,
        }
        if failures:
            metadata["errors"] = failures
        return PackedBatch.from_segments(row_lengths, row_capacity, step_sizes=row_steps, segments=row_segments,
                                         modalities=modalities, data=payload, metadata=metadata)


_IN_ORDER = object()  # marker: a key's payload items are its read array in order


def _decode_in_place(source: Source, requests: list, sample_plans: list) -> tuple[list, dict]:
    """Give each request's frames a slice of one payload buffer per camera (in shared memory in a worker), so
    the decoder writes every frame straight to where the batch holds it: no gather, no concatenation. Only for
    cameras whose frames every sample takes in window order, from sources that know their frame size."""
    frame_shape = getattr(source, "frame_shape", None)
    if not requests or not callable(frame_shape):
        return requests, {}
    keys = [k for k in requests[0].steps if k.startswith(FRAMES_PREFIX)]
    keys = [k for k in keys if all(k in r.steps and p[0].get(k) is _IN_ORDER for r, p in zip(requests, sample_plans))]
    buffers, outs = {}, [{} for _ in requests]
    for key in keys:
        camera = key[len(FRAMES_PREFIX):]
        try:
            shapes = {frame_shape(r.episode, camera) for r in requests}
        except MemoryError:
            raise
        except Exception:  # an unreadable video: the read below meets it again, under the error policy
            continue
        if len(shapes) != 1 or None in shapes:
            continue
        counts = [len(r.steps[key]) for r in requests]
        buffer = _alloc(key, (sum(counts), *next(iter(shapes)), 3))
        view = buffer.numpy() if isinstance(buffer, torch.Tensor) else buffer
        start = 0
        for out, n in zip(outs, counts):
            out[key] = view[start : start + n]
            start += n
        buffers[key] = buffer
    if not buffers:
        return requests, {}
    return [replace(r, out=o) for r, o in zip(requests, outs)], buffers


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
    if torch.utils.data.get_worker_info() is None or len(parts) == 0 or nbytes <= BY_VALUE_BYTES:
        return np.concatenate(parts)
    shape = (sum(len(p) for p in parts), *parts[0].shape[1:])
    out = _shared(shape, torch.from_numpy(np.ascontiguousarray(parts[0][:0])).dtype)
    np.concatenate(parts, out=out.numpy())
    return out


def _describe(source: Source, episode: int) -> str:
    describe = getattr(source, "describe", None)
    return describe(episode) if callable(describe) else f"{source.name} episode {episode}"


def _read(source: Source, requests: list, samples: np.ndarray, errors: ErrorCounter | None):
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
            record = {"sample": int(s), "episode": int(request.episode), "source": source.name,
                      "reason": f"{type(err).__name__}: {err}"}
            failures.append(record)
            read.append(None)
            errors.failed(record)
    return read, failures


def _check_finite(source, requests, read, pads, samples, policy: ErrorPolicy, errors, failures: list) -> None:
    """NaN or inf in proprio or actions: raise (through the error policy), or mask (0, flagged as padding)."""
    for i, data in enumerate(read):
        if data is None:
            continue
        for key in ("proprio", "action"):
            values = data.get(key)
            if values is None or np.isfinite(values).all():
                continue
            bad = ~np.isfinite(values).reshape(len(values), -1).all(axis=1)
            steps = np.asarray(requests[i].steps[key])[bad].tolist()
            if policy.nonfinite == "mask":
                data[key] = np.where(np.isfinite(values), values, 0).astype(values.dtype)
                pads[i][key] = pads[i][key] | bad
                continue
            reason = f"{_describe(source, requests[i].episode)} key {key!r}: NaN or inf at steps {steps}"
            if errors is None or policy.on_error == "raise":
                raise SampleError(reason + "; fix the data or use ErrorPolicy(nonfinite='mask')")
            record = {"sample": int(samples[i]), "episode": int(requests[i].episode), "source": source.name,
                      "reason": f"SampleError: {reason}"}
            failures.append(record)
            read[i] = None
            errors.failed(record)
            break


def _payload_plan(sample_layout, layout, index: dict[str, int]) -> tuple[dict[str, np.ndarray], list, list]:
    """Where a sample's payload items come from, in token order (window positions per key), its segments
    ``(modality index, tokens)`` and its step sizes."""
    order: dict[str, list[int]] = {}
    for key, position, tokens in sample_layout.runs:
        if key == "action":
            order.setdefault(key, []).extend(range(position, position + tokens // layout.tokens_per_action_step))
        elif key != "text":
            order.setdefault(key, []).append(position)
    segments = [(index[key], tokens) for key, _, tokens in sample_layout.runs]
    # Every window position of a key appears once, so positions 0, 1, 2, ... mean "the read array as it is".
    positions = {k: _IN_ORDER if v == list(range(len(v))) else np.asarray(v, dtype=np.int64) for k, v in order.items()}
    return positions, segments, list(sample_layout.step_sizes)


def _pad_static(payload: dict[str, np.ndarray], layout, slots: int, read: list[dict]) -> None:
    """Pad every payload to the most ``slots`` tokens could hold; padded entries are flagged as padding."""
    for key in ["text", *(FRAMES_PREFIX + c for c in layout.cameras), "proprio", "action"]:
        per_item = layout.tokens_per_text_token if key == "text" else layout.key_tokens(key)
        most = slots // per_item
        have = payload.get(key)
        if isinstance(have, torch.Tensor):
            have = have.numpy()
        if have is None:
            example = next((d[key] for d in read if key in d), None)
            if example is None and key != "text":
                continue
            have = np.zeros((0, *example.shape[1:]), example.dtype) if example is not None else np.zeros(0, np.int32)
        extra = most - len(have)
        payload[key] = np.concatenate([have, np.zeros((extra, *have.shape[1:]), have.dtype)])
        if key != "text":
            flags = payload.get(f"{key}_is_pad", np.zeros(0, bool))
            payload[f"{key}_is_pad"] = np.concatenate([flags, np.ones(extra, bool)])
