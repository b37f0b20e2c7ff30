"""Device transforms: batched augmentation run on a whole PackedBatch after it reaches the device.

``DataLoader(..., device="cuda", device_transform=fn)`` calls ``fn(batch, samples)`` on each batch inside the
prefetcher, after the copy (on CUDA on the copy's side stream, before the event the loop waits on): ``batch`` is
the :class:`~mmfeed.packing.PackedBatch` on the device, ``samples`` a :class:`BatchSamples`, a sequence of one
``torch.Generator`` per document of the batch (in document order), each seeded from ``(seed, epoch, sample id)``
by :func:`~mmfeed.loaders.planned.steps.sample_generator`, exactly as a worker transform's, so a resumed run draws
the same. ``fn`` returns the batch (``dataclasses.replace(batch, data=...)``); it may change values and frame
sizes, not the number of payload entries.

The ops here draw their randomness per sample on the host (a few numbers each) and apply it in one batched op per
feature, per-sample parameters gathered per frame as tensors (``samples.document_of(feature)``: the document of
each payload entry). :class:`YUVToRGB`, :class:`Resize`, :class:`RandomResizedCrop`, :class:`ColorJitter`,
:class:`NormalizeImages` work on video features, :class:`DeviceNormalize` and :class:`DeviceCameraDropout` are the
batched forms of the worker-side :class:`~mmfeed.loaders.planned.transforms.Normalize` and
:class:`~mmfeed.loaders.planned.transforms.CameraDropout` and give the same tensors for the same seed, epoch and
sample; :class:`DeviceCompose` chains them with the same generators::

    >>> import torch
    >>> from mmfeed.packing import PackedBatch
    >>> batch = PackedBatch.from_segments([[2]], 2, segments=[[[(1, 2)]]], modalities=["text", "cam"],
    ...                                   data={"cam": torch.full((2, 4, 4, 3), 100, dtype=torch.uint8)},
    ...                                   metadata={"sample": torch.tensor([7])})
    >>> out = ColorJitter(brightness=0.5)(batch, BatchSamples.of(batch, seed=0, epoch=0))
    >>> out.data["cam"].shape, out.data["cam"].dtype
    (torch.Size([2, 4, 4, 3]), torch.uint8)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from mmfeed.codecs.colour import yuv420_to_rgb
from mmfeed.loaders.planned.steps import sample_generator
from mmfeed.loaders.planned.transforms import Normalize
from mmfeed.packing import PackedBatch

__all__ = ["BatchSamples", "BatchTransform", "ColorJitter", "DeviceCameraDropout", "DeviceCompose",
           "DeviceNormalize", "NormalizeImages", "RandomResizedCrop", "Resize", "YUVToRGB", "video_features"]

_SIDE = ("_is_pad", "_dim_mask")


class BatchSamples(Sequence):
    """The documents of one batch as a device transform sees them: ``samples[i]`` the generator of document ``i``
    (seeded from ``(seed, epoch, ids[i])``, made when first asked for, then drawn on by every op of the chain),
    ``ids`` the sample ids, ``epoch``, ``seed``, ``dataset`` (each document's dataset in a mixture, else None) and
    :meth:`document_of` (the document of each payload entry of a feature). Build it with :meth:`of` from the batch
    on the host (the loader does, before the copy)."""

    def __init__(self, ids: np.ndarray, epoch: int, seed: int, documents: dict[str, np.ndarray],
                 dataset: np.ndarray | None = None) -> None:
        self.ids, self.epoch, self.seed = np.asarray(ids, dtype=np.int64), int(epoch), int(seed)
        self.dataset = dataset
        self._documents = documents
        self.pads: dict[str, np.ndarray] = {}  # host copies of the payloads' ``_is_pad`` flags
        self._generators: list[torch.Generator | None] = [None] * len(self.ids)
        self._on: dict[tuple[str, str], torch.Tensor] = {}

    @classmethod
    def of(cls, batch: PackedBatch, seed: int, epoch: int,
           tokens: Callable[[str], int] | None = None) -> BatchSamples:
        """The samples of ``batch`` (a CPU PackedBatch whose ``metadata["sample"]`` names its documents);
        ``tokens(feature)``: tokens of one payload entry of a feature (a frame's; default 1)."""
        if not isinstance(batch, PackedBatch):
            raise TypeError(f"device transforms take PackedBatch objects (a planned dataset's), got "
                            f"{type(batch).__name__}")
        ids = batch.metadata.get("sample")
        if ids is None:
            raise ValueError("a device transform seeds each document from its sample id, and this batch has no "
                             "metadata['sample']; use a planned dataset (packing=...)")
        ids = np.asarray(ids.cpu().numpy() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64)
        doc = batch.document_ids.cpu().numpy().reshape(-1)
        mod = batch.modality_ids.cpu().numpy().reshape(-1)
        documents = {}
        for m, name in enumerate(batch.modalities):
            if name not in batch.data:
                continue
            per = int(tokens(name)) if tokens is not None else 1
            owners = doc[mod == m][::max(per, 1)].astype(np.int64)
            n = len(batch.data[name])
            if len(owners) > n:
                raise ValueError(f"payload {name!r} holds {n} entries but the batch lays out {len(owners)} of "
                                 f"{per} token(s) each; give the tokens of one entry")
            documents[name] = np.concatenate([owners, np.full(n - len(owners), -1, np.int64)])  # static padding
        dataset = batch.metadata.get("dataset")
        if isinstance(dataset, torch.Tensor):
            dataset = dataset.cpu().numpy().astype(np.int64)
        out = cls(ids, epoch, seed, documents, dataset)
        out.pads = {name: batch.data[f"{name}_is_pad"].cpu().numpy().astype(bool) for name in documents
                    if isinstance(batch.data.get(f"{name}_is_pad"), torch.Tensor)}
        return out

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> torch.Generator:  # type: ignore[override]
        g = self._generators[i]
        if g is None:
            g = self._generators[i] = sample_generator(self.seed, self.epoch, int(self.ids[i]))
        return g

    def document_of(self, feature: str, device: torch.device | str | None = None) -> np.ndarray | torch.Tensor:
        """The document of each payload entry of ``feature`` (-1: padding of static shapes): int64 numpy, or a
        tensor on ``device`` (cached)."""
        if feature not in self._documents:
            raise KeyError(f"the batch lays out no payload {feature!r}; it has {sorted(self._documents)}")
        owners = self._documents[feature]
        if device is None:
            return owners
        key = (feature, str(device))
        if key not in self._on:
            self._on[key] = torch.from_numpy(owners).to(device)
        return self._on[key]

    def per_frame(self, feature: str, values: torch.Tensor) -> torch.Tensor:
        """``values`` (one row per document, on the batch's device) gathered for each payload entry of
        ``feature``; padding entries take row 0 (callers mask them)."""
        owners = self.document_of(feature, values.device)
        return values[owners.clamp(min=0)]


class BatchTransform:
    """What the loader's prefetcher runs on each batch: ``fn(batch, samples)`` with the :class:`BatchSamples`
    made from the batch on the host (before the copy) for the epoch ``epoch_of(n)`` of the ``n``-th batch it
    gets; ``tokens(feature)``: a payload entry's tokens."""

    def __init__(self, fn: Callable, seed: int, epoch_of: Callable[[int], int],
                 tokens: Callable[[str], int] | None = None) -> None:
        self.fn, self.seed, self.epoch_of, self.tokens = fn, int(seed), epoch_of, tokens
        self.count = 0

    def prepare(self, host: Any) -> BatchSamples:
        """The samples of the next batch, from its host copy (in the order the batches come)."""
        n, self.count = self.count, self.count + 1
        return BatchSamples.of(host, self.seed, self.epoch_of(n), self.tokens)

    def __call__(self, batch: Any, samples: BatchSamples) -> Any:
        out = self.fn(batch, samples)
        if not isinstance(out, PackedBatch):
            raise TypeError(f"the device transform must return the PackedBatch (dataclasses.replace(batch, "
                            f"data=...)), got {type(out).__name__}")
        for key, before in batch.data.items():
            after = out.data.get(key)
            if after is None or len(after) != len(before):
                raise ValueError(f"the device transform changed payload {key!r} from {len(before)} entries to "
                                 f"{'none' if after is None else len(after)}; it may change values and frame "
                                 "sizes, not the number of entries")
        return out


def video_features(batch: PackedBatch) -> list[str]:
    """The video payloads of a batch, in the order of its modalities: uint8 RGB ``[n, H, W, 3]`` or yuv420
    planes ``[n, H * 3 // 2, W]``."""
    return [m for m in batch.modalities if _is_video(batch.data.get(m))]


def _is_video(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype == torch.uint8 and x.dim() >= 3


def _chosen(batch: PackedBatch, features: Sequence[str] | None, rgb: bool = True) -> list[str]:
    names = video_features(batch) if features is None else list(features)
    missing = [f for f in names if f not in batch.data]
    if missing:
        raise ValueError(f"device transform: the batch has no payload {missing}; it has {sorted(batch.data)}")
    if rgb:
        bad = [f for f in names if batch.data[f].dim() != 4 or batch.data[f].shape[-1] != 3]
        if bad:
            raise ValueError(f"device transform: {bad} are not RGB frames [n, H, W, 3] (yuv420 planes? put "
                             "YUVToRGB() first)")
    return names


def _to_float(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    """``[n, H, W, 3]`` frames as float32 ``[n, 3, H, W]`` and the top of their range (255 for uint8, else 1)."""
    top = 255.0 if x.dtype == torch.uint8 else 1.0
    # contiguous: elementwise ops and resampling on a channels-last view run several times slower on the CPU
    return x.to(torch.float32).permute(0, 3, 1, 2).contiguous(), top


def _back(y: torch.Tensor, like: torch.Tensor, top: float, channels_first: bool = True) -> torch.Tensor:
    """Float frames (``[n, 3, H, W]``, or ``[n, H, W, 3]``) back to ``like``'s dtype, ``[n, H, W, 3]``."""
    y = y.clamp(0.0, top)
    if like.dtype == torch.uint8:
        y = y.round_().to(torch.uint8)
    else:
        y = y.to(like.dtype)
    return y.permute(0, 2, 3, 1).contiguous() if channels_first else y


def _with(batch: PackedBatch, data: dict[str, torch.Tensor]) -> PackedBatch:
    return replace(batch, data={**batch.data, **data})


def _check_features(features: Sequence[str] | None) -> list[str] | None:
    if features is None:
        return None
    if isinstance(features, str) or not all(isinstance(f, str) for f in features):
        raise TypeError(f"features must be a list of feature names, got {features!r}")
    return list(features)


def _size(size: Any) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, int) and not isinstance(size, bool) else tuple(size)
    if len(pair) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in pair):
        raise ValueError(f"size must be an int > 0 or (height, width) of ints > 0, got {size!r}")
    return int(pair[0]), int(pair[1])


class YUVToRGB:
    """I420 planes ``[n, H * 3 // 2, W]`` to RGB ``[n, H, W, 3]`` (:func:`mmfeed.codecs.colour.yuv420_to_rgb`,
    swscale's numbers on any device). features: default every 3-dimensional uint8 payload."""

    def __init__(self, features: Sequence[str] | None = None, *, matrix: str = "bt601",
                 full_range: bool = False) -> None:
        self.features, self.matrix, self.full_range = _check_features(features), matrix, bool(full_range)

    def __call__(self, batch: PackedBatch, samples: BatchSamples) -> PackedBatch:
        names = [f for f in video_features(batch) if batch.data[f].dim() == 3] if self.features is None \
            else _chosen(batch, self.features, rgb=False)
        return _with(batch, {f: yuv420_to_rgb(batch.data[f], matrix=self.matrix, full_range=self.full_range)
                             for f in names})


class Resize:
    """RGB frames resized to ``size`` (int or (height, width)), bilinear with antialiasing, one op per feature."""

    def __init__(self, size: Any, features: Sequence[str] | None = None) -> None:
        self.size, self.features = _size(size), _check_features(features)

    def __call__(self, batch: PackedBatch, samples: BatchSamples) -> PackedBatch:
        out = {}
        for f in _chosen(batch, self.features):
            x, top = _to_float(batch.data[f])
            if len(x) == 0:
                out[f] = batch.data[f].new_zeros((0, *self.size, 3))
                continue
            y = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False, antialias=True)
            out[f] = _back(y, batch.data[f], top)
        return _with(batch, out)


class RandomResizedCrop:
    """A random crop of each sample (the same box on every frame of the sample's window, drawn per feature) resized
    to ``size``: area a fraction ``scale`` of the frame, aspect ratio in ``ratio`` (log-uniform); four draws per
    document and feature, whether or not it holds frames of it, so the draws replay. One ``grid_sample`` per
    feature."""

    def __init__(self, size: Any, scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3 / 4, 4 / 3), features: Sequence[str] | None = None) -> None:
        self.size, self.features = _size(size), _check_features(features)
        if not (len(scale) == 2 and 0 < scale[0] <= scale[1] <= 1):
            raise ValueError(f"scale must be (low, high) with 0 < low <= high <= 1, got {scale!r}")
        if not (len(ratio) == 2 and 0 < ratio[0] <= ratio[1]):
            raise ValueError(f"ratio must be (low, high) with 0 < low <= high, got {ratio!r}")
        self.scale, self.ratio = (float(scale[0]), float(scale[1])), (float(ratio[0]), float(ratio[1]))

    def boxes(self, samples: BatchSamples, aspect: float) -> torch.Tensor:
        """Each document's crop ``(cx, cy, w, h)`` in [-1, 1] coordinates of a frame of width/height ``aspect``."""
        out = torch.empty(len(samples), 4, dtype=torch.float64)
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for i in range(len(samples)):
            u = torch.rand(4, generator=samples[i], dtype=torch.float64)
            area = self.scale[0] + (self.scale[1] - self.scale[0]) * float(u[0])
            r = math.exp(lo + (hi - lo) * float(u[1])) / aspect  # width / height in frame fractions
            w, h = min(math.sqrt(area * r), 1.0), min(math.sqrt(area / r), 1.0)
            x0, y0 = (1 - w) * float(u[2]), (1 - h) * float(u[3])
            out[i] = torch.tensor([2 * x0 + w - 1, 2 * y0 + h - 1, w, h], dtype=torch.float64)
        return out

    def __call__(self, batch: PackedBatch, samples: BatchSamples) -> PackedBatch:
        out = {}
        for f in _chosen(batch, self.features):
            frames = batch.data[f]
            boxes = self.boxes(samples, frames.shape[2] / frames.shape[1] if frames.shape[1] else 1.0)
            if len(frames) == 0:
                out[f] = frames.new_zeros((0, *self.size, 3))
                continue
            x, top = _to_float(frames)
            box = samples.per_frame(f, boxes.to(device=x.device, dtype=torch.float32))
            theta = torch.zeros(len(x), 2, 3, device=x.device, dtype=torch.float32)
            theta[:, 0, 0], theta[:, 0, 2] = box[:, 2], box[:, 0]
            theta[:, 1, 1], theta[:, 1, 2] = box[:, 3], box[:, 1]
            grid = F.affine_grid(theta, [len(x), 3, *self.size], align_corners=False)
            y = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
            out[f] = _back(y, frames, top)
        return _with(batch, out)


class ColorJitter:
    """Brightness, contrast and saturation of each sample scaled by factors drawn uniformly from
    ``[max(0, 1 - b), 1 + b]`` (three draws per document and feature), applied in that order as torchvision does
    (contrast about each frame's mean grey, saturation towards each pixel's grey), batched."""

    def __init__(self, brightness: float = 0.0, contrast: float = 0.0, saturation: float = 0.0,
                 features: Sequence[str] | None = None) -> None:
        for name, value in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"ColorJitter {name} must be a number >= 0, got {value!r}")
        self.amounts = (float(brightness), float(contrast), float(saturation))
        self.features = _check_features(features)

    def factors(self, samples: BatchSamples) -> torch.Tensor:
        """Each document's (brightness, contrast, saturation) factors, ``[documents, 3]`` float32."""
        out = torch.empty(len(samples), 3, dtype=torch.float32)
        lo = torch.tensor([max(0.0, 1 - a) for a in self.amounts])
        hi = torch.tensor([1 + a for a in self.amounts])
        for i in range(len(samples)):
            out[i] = lo + (hi - lo) * torch.rand(3, generator=samples[i])
        return out

    def __call__(self, batch: PackedBatch, samples: BatchSamples) -> PackedBatch:
        out = {}
        for f in _chosen(batch, self.features):
            factors = self.factors(samples)
            frames = batch.data[f]
            if len(frames) == 0:
                continue
            top = 255.0 if frames.dtype == torch.uint8 else 1.0
            x = frames.to(torch.float32)  # [n, H, W, 3], contiguous
            k = samples.per_frame(f, factors.to(x.device))[:, :, None, None, None]  # [n, 3, 1, 1, 1]
            x = (x * k[:, 0]).clamp_(0, top)
            mean = _grey(x).mean(dim=(1, 2, 3), keepdim=True)
            x = (k[:, 1] * x + (1 - k[:, 1]) * mean).clamp_(0, top)
            x = (k[:, 2] * x + (1 - k[:, 2]) * _grey(x)).clamp_(0, top)
            out[f] = _back(x, frames, top, channels_first=False)
        return _with(batch, out)


_LUMA = (0.299, 0.587, 0.114)


def _grey(x: torch.Tensor) -> torch.Tensor:
    """ITU-R 601 luma of ``[n, H, W, 3]`` frames, ``[n, H, W, 1]``."""
    return (x @ torch.tensor(_LUMA, dtype=x.dtype, device=x.device)).unsqueeze(-1)


class NormalizeImages:
    """RGB frames to float32 ``(x / 255 - mean) / std`` per channel (uint8 in; floats taken as already in
    [0, 1]), laid out ``[n, H, W, 3]`` (``channels_first=True``: ``[n, 3, H, W]``)."""

    def __init__(self, mean: Sequence[float] = (0.485, 0.456, 0.406), std: Sequence[float] = (0.229, 0.224, 0.225),
                 features: Sequence[str] | None = None, *, channels_first: bool = False) -> None:
        if len(mean) != 3 or len(std) != 3 or any(float(s) <= 0 for s in std):
            raise ValueError(f"NormalizeImages takes 3 means and 3 stds > 0, got mean={mean!r} std={std!r}")
        self.mean, self.std = torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)
        self.features, self.channels_first = _check_features(features), bool(channels_first)

    def __call__(self, batch: PackedBatch, samples: BatchSamples) -> PackedBatch:
        out = {}
        for f in _chosen(batch, self.features):
            x = batch.data[f]
            y = x.to(torch.float32) / (255.0 if x.dtype == torch.uint8 else 1.0)
            y = (y - self.mean.to(y.device)) / self.std.to(y.device)
            out[f] = y.permute(0, 3, 1, 2).contiguous() if self.channels_first else y
        return _with(batch, out)


class DeviceNormalize:
    """The batched form of :class:`~mmfeed.loaders.planned.transforms.Normalize` (same arguments, ``delta`` aside:
    delta actions need each window's anchor state, so they stay in the workers), equal to it for every sample:
    each payload entry normalized with its document's dataset's stats (by ``metadata["dataset"]`` in a mixture),
    padding entries of static shapes left as they are."""

    def __init__(self, stats: Any, mode: str = "mean_std", **kwargs: Any) -> None:
        if kwargs.get("delta") is not None:
            raise ValueError("DeviceNormalize: delta actions need each window's anchor state; normalize them in the "
                             "workers (Packing(transform=Normalize(..., delta=...)))")
        self.worker = Normalize(stats, mode, **kwargs)
        self.features = self.worker.features

    def __call__(self, batch: PackedBatch, samples: BatchSamples) -> PackedBatch:
        worker, out = self.worker, {}
        groups = worker._groups
        mixture = len(groups) > 1 or worker.by is not None
        if mixture and samples.dataset is None:
            raise ValueError("DeviceNormalize of a mixture picks stats by each document's dataset, and this batch "
                             "has no metadata['dataset']")
        for feature in self.features:
            x = batch.data.get(feature)
            if not isinstance(x, torch.Tensor) or _is_video(x):
                continue
            owners = samples.document_of(feature)
            which = samples.dataset[owners.clip(min=0)] if mixture else np.zeros(len(owners), np.int64)
            which = np.where(owners >= 0, which, -1)
            dtype = x.dtype if x.is_floating_point() else torch.float32
            y = x.to(dtype).clone()
            for k, group in enumerate(groups):
                params = group["params"].get(feature)
                rows = np.flatnonzero(which == k)
                if params is None or len(rows) == 0:
                    continue
                lo, hi, kept = params
                at = torch.from_numpy(rows).to(x.device)
                y[at] = worker._normalized(x[at], lo.to(x.device), hi.to(x.device), kept, group["mixture"])
            out[feature] = y
        return _with(batch, out)


class DeviceCameraDropout:
    """The batched form of :class:`~mmfeed.loaders.planned.transforms.CameraDropout`, equal to it for every sample:
    per document the cameras it holds (frames of the feature, not all flagged padding) are drawn in the order of
    the batch's modalities (the order a sample holds them), the dropped ones' frames zeroed and flagged in
    ``<feature>_is_pad``, in one op per camera."""

    def __init__(self, p: float, *, features: Sequence[str] | None = None, keep_one: bool = True) -> None:
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"DeviceCameraDropout p must be in [0, 1], got {p!r}")
        self.p, self.keep_one, self.features = float(p), bool(keep_one), _check_features(features)

    def __call__(self, batch: PackedBatch, samples: BatchSamples) -> PackedBatch:
        names = video_features(batch) if self.features is None else _chosen(batch, self.features, rgb=False)
        held = np.zeros((len(samples), len(names)), dtype=bool)
        for j, f in enumerate(names):
            owners = samples.document_of(f)
            pad = samples.pads.get(f)
            real = np.ones(len(owners), bool) if pad is None else ~pad
            np.logical_or.at(held[:, j], owners[(owners >= 0) & real], True)
        dropped = np.zeros_like(held)
        for i in range(len(samples)):
            cams = np.flatnonzero(held[i])
            if len(cams) == 0:
                continue
            g = samples[i]
            drop = (torch.rand(len(cams), generator=g) < self.p).tolist()
            if self.keep_one and all(drop):
                drop[int(torch.randint(len(cams), (1,), generator=g))] = False
            dropped[i, cams] = drop
        out = {}
        for j, f in enumerate(names):
            if not dropped[:, j].any():
                continue
            x = batch.data[f]
            mask = samples.per_frame(f, torch.from_numpy(dropped[:, j]).to(x.device))
            mask &= samples.document_of(f, x.device) >= 0
            out[f] = torch.where(mask.reshape(-1, *([1] * (x.dim() - 1))), torch.zeros((), dtype=x.dtype,
                                                                                    device=x.device), x)
            pad = batch.data.get(f"{f}_is_pad")
            out[f"{f}_is_pad"] = mask if pad is None else pad | mask
            owners = samples.document_of(f)
            host = dropped[owners.clip(min=0), j] & (owners >= 0)  # what later ops of the chain see
            samples.pads[f] = host if f not in samples.pads else samples.pads[f] | host
        return _with(batch, out)


class DeviceCompose:
    """Device transforms run one after the other on a batch, with the same generators (so the chain replays as a
    worker-side :class:`~mmfeed.loaders.planned.transforms.Compose` of the same ops does)."""

    def __init__(self, *transforms: Callable) -> None:
        bad = [t for t in transforms if not callable(t)]
        if bad:
            raise TypeError(f"DeviceCompose takes device transforms fn(batch, samples) -> batch; got {bad!r}")
        self.transforms = transforms

    def __call__(self, batch: PackedBatch, samples: BatchSamples) -> PackedBatch:
        for transform in self.transforms:
            batch = transform(batch, samples)
        return batch
