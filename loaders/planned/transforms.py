"""Transforms: functions of one sample run in the workers after decode and before packing.

A transform is ``fn(sample: dict[str, Tensor], generator: torch.Generator) -> dict``: the sample holds each
feature's frames ``[K, ...]``, its ``<feature>_is_pad`` flags, ``task``, ``episode_index`` and ``frame_index``
(in a mixture also ``dataset``, ``embodiment`` and ``<feature>_dim_mask``); ``generator`` is seeded from
``(seed, epoch, sample id)`` so random augmentation is the same for any ``num_workers`` and replays exactly after
a resume. A transform may change values and frame sizes, never the number of frames (tokens are planned before
anything is read); it may flag more frames as padding in ``<feature>_is_pad``. :class:`Normalize` is the ready one
for array features, :class:`CameraDropout` a seeded camera dropout::

    >>> import torch
    >>> stats = {"observation.state": {"mean": np.array([1.0]), "std": np.array([2.0])}}
    >>> Normalize(stats)({"observation.state": torch.tensor([[3.0]])}, None)["observation.state"].tolist()
    [[1.0]]

On a mixture of robots (``open_dataset([...], pad_to=..., embodiments=...)``), ``Normalize(mix)`` normalizes each
sample with its own dataset's stats (or its embodiment's, ``by="embodiment"``), only on the dataset's own
elements of a padded feature, so the padding stays zero; ``leave`` keeps chosen elements as they are (a gripper
already in [0, 1]) and ``delta`` turns chosen action elements into deltas from the anchor state, normalized with
their own stats (``mmfeed stats --delta``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["NORMALIZE_MODES", "CameraDropout", "Compose", "DeltaActions", "Normalize", "delta_key"]

NORMALIZE_MODES = {
    "mean_std": ("mean", "std"),
    "min_max": ("min", "max"),
    "quantile": ("q01", "q99"),
}
"""Mode -> the two statistics it needs: ``(x - mean) / std``; ``min_max`` and ``quantile`` map the range between
their two statistics to ``[-1, 1]``, as LeRobot's MIN_MAX and QUANTILES modes (and openpi's quantile
normalization) do."""

Dims = Sequence[int] | Mapping[str, Sequence[int]]


def delta_key(action: str) -> str:
    """The stats key of delta actions: ``"action.delta"`` for the feature ``"action"``."""
    return f"{action}.delta"


@dataclass(frozen=True)
class DeltaActions:
    """Action elements ``dims`` turned into deltas from the anchor state (``action[:, dims] - state[-1, dims]``,
    the last state frame of the window being its anchor), as openpi does for joint actions; the others (a
    gripper) stay absolute.

    dims: element indices for every dataset, or ``{dataset or embodiment name: indices}`` (a name not listed has
        none); action, state: the features.
    """

    dims: Dims
    action: str = "action"
    state: str = "observation.state"

    def dims_of(self, names: Sequence[str]) -> list[int]:
        """The delta elements of a dataset known by ``names`` (its own name, its embodiment's)."""
        return _dims_of(self.dims, names)

    def apply(self, action: np.ndarray, state: np.ndarray, dims: Sequence[int]) -> np.ndarray:
        """``action [..., D]`` with ``dims`` less ``state``'s (broadcast over the leading axes), numpy or torch."""
        out = action.clone() if isinstance(action, torch.Tensor) else np.array(action, copy=True)
        if len(dims):
            index = list(dims)
            out[..., index] = out[..., index] - state[..., index]
        return out


class Normalize:
    """Normalize array features with a dataset's stats (``ds.stats``), or each sample of a mixture with its own
    dataset's.

    stats: feature -> {"mean", "std", "min", "max", "q01", "q99", ...} arrays of the feature's step shape; or a
        mixture (``open_dataset([...])``) or the :class:`~mmfeed.loaders.stores.stats.MixtureStats` that
        ``mmfeed stats`` writes, whose per-dataset stats are picked by each sample's ``dataset``.
    mode: a key of :data:`NORMALIZE_MODES`.
    features: the features to normalize (default: every feature the stats hold that a sample carries; video
        frames, uint8 tensors of 3 or more dimensions in either frame format, are left alone).
    eps: added to the denominator, so a constant feature does not divide by zero.
    by: for a mixture, "dataset" (default without embodiments) or "embodiment" (default with them).
    leave: ``{feature: element indices}`` kept as they are (grippers), for every dataset, or
        ``{dataset or embodiment name: {feature: indices}}``. An index that a dataset's feature does not have (a
        7-dim arm's gripper, 6, given to every robot of a mixture with a 2-dim base), a name that is neither a
        dataset nor an embodiment, or a feature not normalized is refused here (ValueError naming the dataset),
        not in a worker mid-epoch; ``delta`` dims are checked alike.
    clip: with "min_max" or "quantile", clamp the result to ``[-1, 1]``.
    delta: :class:`DeltaActions`: those action elements become deltas from the anchor state before being
        normalized with the stats under :func:`delta_key` (``mmfeed stats --delta``).
    """

    def __init__(self, stats: Any, mode: str = "mean_std", *, features: Sequence[str] | None = None,
                 eps: float = 1e-8, by: str | None = None, leave: Mapping | None = None, clip: bool = False,
                 delta: DeltaActions | None = None) -> None:
        if mode not in NORMALIZE_MODES:
            raise ValueError(f"Normalize mode must be one of {sorted(NORMALIZE_MODES)}, got {mode!r}")
        if clip and mode == "mean_std":
            raise ValueError("clip=True clamps to [-1, 1], the range of modes 'min_max' and 'quantile'")
        self.mode, self.eps, self.clip, self.delta = mode, float(eps), bool(clip), delta
        self._features = None if features is None else list(features)
        per_name = _leave_per_name(leave)
        if isinstance(stats, Mapping) or (hasattr(stats, "stats") and hasattr(stats, "features")
                                          and not hasattr(stats, "stats_of")):
            # one set of stats (ds.stats, the form it always had) or one dataset, opened
            if per_name:
                raise ValueError(f"Normalize: leave={dict(leave)!r} gives elements per dataset or embodiment name, "
                                 "which only a mixture's stats have (Normalize(mix) or MixtureStats); for one "
                                 "dataset give leave={feature: [indices]}")
            self.by = None
            self._groups = [self._params(stats if isinstance(stats, Mapping) else stats.stats, [], leave, "")]
            self._check_elements(leave, [""])
            return
        if hasattr(stats, "stats_of") and hasattr(stats, "dataset_names"):
            has_embodiments = getattr(stats, "embodiment_of_dataset", None) is not None
            self.by = by or ("embodiment" if has_embodiments else "dataset")
            self._groups, labels = [], []
            for k, name in enumerate(stats.dataset_names):
                names, label = [name], f" of dataset {name!r}"
                if has_embodiments:
                    names.append(stats.embodiment_names[int(stats.embodiment_of_dataset[k])])
                    label += f" (embodiment {names[1]!r})"
                self._groups.append(self._params(stats.stats_of(k, self.by), names, leave, f" of dataset {name!r}"))
                labels.append(label)
            if per_name:
                known = list(dict.fromkeys([*stats.dataset_names, *(stats.embodiment_names or [])]))
                unknown = [n for n in leave if n not in known]
                if unknown:
                    raise ValueError(f"Normalize: leave names {unknown}, which are neither datasets nor embodiments "
                                     f"of the mixture; give leave per name of {known}")
            self._check_every_dataset(stats.dataset_names)
            self._check_elements(leave, labels)
            return
        raise TypeError(f"Normalize takes stats ({{feature: {{stat: array}}}}), a dataset or a mixture, or "
                        f"MixtureStats; got {type(stats).__name__}")

    def _params(self, stats: Mapping, names: list[str], leave: Mapping | None, where: str) -> dict:
        """One dataset's parameters: feature -> (lo, hi, keep mask or None), and its delta elements."""
        a, b = NORMALIZE_MODES[self.mode]
        features = self._features
        chosen = list(stats) if features is None else list(features)
        if self.delta is not None and features is None and self.delta.action not in chosen:
            chosen.append(self.delta.action)
        dims = self.delta.dims_of(names) if self.delta is not None else []
        params: dict[str, tuple] = {}
        lacking: list[str] = []
        for feature in chosen:
            key = delta_key(feature) if self.delta is not None and feature == self.delta.action and dims else feature
            have = stats.get(key)
            if have is None:
                if key != feature:
                    raise ValueError(f"Normalize: delta actions need the stats {key!r}{where}; compute them with "
                                     "`mmfeed stats --delta` (or compute_stats(..., delta=...))")
                if features is not None:
                    raise ValueError(f"Normalize: no stats for feature {feature!r}{where}; stats cover "
                                     f"{sorted(stats)}")
                continue
            if a not in have or b not in have:
                if features is not None or key != feature:
                    raise ValueError(f"Normalize(mode={self.mode!r}) needs {a!r} and {b!r} for {key!r}{where}; its "
                                     f"stats have {sorted(have)}")
                lacking.append(feature)
                continue
            lo, hi = (torch.as_tensor(np.asarray(have[k], dtype=np.float64)) for k in (a, b))
            params[feature] = (lo, hi, _left(leave, feature, names))
        return {"params": params, "delta": dims, "mixture": bool(names), "lacking": lacking}

    def _check_every_dataset(self, names: Sequence[str]) -> None:
        """A feature normalized in some datasets of a mixture must be in every one whose stats hold it: a dataset
        with stats of it but without the mode's two would leave its samples unnormalized beside the others'."""
        normalized = {f for g in self._groups for f in g["params"]}
        for name, group in zip(names, self._groups):
            missing = sorted(normalized & set(group["lacking"]))
            if missing:
                a, b = NORMALIZE_MODES[self.mode]
                raise ValueError(f"Normalize(mode={self.mode!r}): dataset {name!r} has no {a!r} and {b!r} for "
                                 f"{missing}, which other datasets of the mixture normalize; compute them with "
                                 "`mmfeed stats PATH... --json stats.json` and pass "
                                 "MixtureStats.load('stats.json'), or name the features to normalize")

    def _check_elements(self, leave: Mapping | None, labels: Sequence[str]) -> None:
        """Refuse, now rather than in a worker mid-epoch, ``leave`` elements or ``delta`` dims that a dataset's
        feature does not have (a gripper index of a 7-dim arm given to every robot of a mixture), naming the
        dataset and how to give them per dataset or embodiment; and ``leave`` features nothing normalizes."""
        mixture = any(labels)
        for label, group in zip(labels, self._groups):
            for feature, (lo, _, kept) in group["params"].items():
                width = int(lo.shape[-1]) if lo.dim() else 0
                bad = [i for i in kept if not -width <= i < width]
                if bad:
                    fix = ("give leave per dataset or embodiment name, only to those that have the elements: "
                           f"leave={{name: {{{feature!r}: [indices]}}}}" if mixture else "give indices below it")
                    raise ValueError(f"Normalize: leave keeps element(s) {bad} of {feature!r}, which has {width} "
                                     f"element(s){label}; {fix}")
            for name in (self.delta.action, self.delta.state) if group["delta"] else ():
                have = group["params"].get(name)
                width = int(have[0].shape[-1]) if have is not None and have[0].dim() else None
                bad = [i for i in group["delta"] if width is not None and not -width <= i < width]
                if bad:
                    fix = ("give DeltaActions dims per dataset or embodiment name, DeltaActions({name: [indices]})"
                           if mixture else "give indices below it")
                    raise ValueError(f"Normalize: delta=DeltaActions({self.delta.dims!r}) takes element(s) {bad} "
                                     f"of {name!r}, which has {width} element(s){label}; {fix}")
        if leave:
            named = {f for v in leave.values() for f in v} if _leave_per_name(leave) else set(leave)
            stray = sorted(named - set(self.features))
            if stray:
                raise ValueError(f"Normalize: leave names feature(s) {stray}, which it does not normalize (it "
                                 f"normalizes {self.features})")

    @property
    def features(self) -> list[str]:
        return list(dict.fromkeys(f for g in self._groups for f in g["params"]))

    def __call__(self, sample: dict[str, Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        out = dict(sample)
        if len(self._groups) > 1 or self.by is not None:
            if "dataset" not in sample:
                raise ValueError("Normalize of a mixture picks each sample's stats by its 'dataset', which this sample "
                                 "lacks; normalize samples of the mixture (ds.windows, or Packing(transform=...))")
            group = self._groups[int(sample["dataset"])]
        else:
            group = self._groups[0]
        if group["delta"]:
            action, state = sample.get(self.delta.action), sample.get(self.delta.state)
            if isinstance(action, torch.Tensor) and isinstance(state, torch.Tensor) and len(state):
                out[self.delta.action] = self.delta.apply(action, state[-1].to(action.dtype), group["delta"])
        for feature, (lo, hi, kept) in group["params"].items():
            x = out.get(feature)
            if not isinstance(x, torch.Tensor) or x.dtype == torch.uint8 and x.dim() >= 3:
                continue  # absent, or video frames (RGB [K, H, W, 3] or yuv420 planes [K, H * 3 // 2, W])
            out[feature] = self._normalized(x, lo, hi, kept, group["mixture"])
        return out

    def _normalized(self, x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, kept: list[int],
                    padded: bool = False) -> torch.Tensor:
        dtype = x.dtype if x.is_floating_point() else torch.float32
        if padded and lo.dim() and x.dim() == lo.dim() + 1 and x.shape[-1] > lo.shape[-1]:
            # a feature the mixture pads (pad_to): only the dataset's own elements; the padding stays zero
            y = x.to(dtype).clone()
            y[..., : lo.shape[-1]] = self._normalized(x[..., : lo.shape[-1]], lo, hi, kept)
            return y
        lo_, hi_ = lo.to(dtype).reshape(lo.shape), hi.to(dtype).reshape(hi.shape)
        if self.mode == "mean_std":
            y = (x.to(dtype) - lo_) / (hi_ + self.eps)
        else:
            y = 2 * (x.to(dtype) - lo_) / (hi_ - lo_ + self.eps) - 1
            if self.clip:
                y = y.clamp(-1.0, 1.0)
        if kept:
            y[..., kept] = x[..., kept].to(dtype)
        return y


class CameraDropout:
    """Drop whole cameras of a sample at random: each video feature it holds is, with probability ``p``, replaced
    by zeros and flagged in ``<feature>_is_pad``, as Octo and openpi drop cameras so that a policy does not lean on
    one. Seeded by the transform's generator, so a resumed run drops the same cameras.

    features: the cameras (default: every video feature of the sample); keep_one: never drop every camera a
        sample has (one of those drawn is kept); a camera already all padding (one the dataset lacks) is not
        counted as one it has.

        >>> sample = {"cam": torch.ones(2, 4, 4, 3, dtype=torch.uint8), "cam_is_pad": torch.zeros(2, dtype=torch.bool)}
        >>> out = CameraDropout(1.0, keep_one=False)(sample, torch.Generator().manual_seed(0))
        >>> int(out["cam"].sum()), out["cam_is_pad"].tolist()
        (0, [True, True])
    """

    def __init__(self, p: float, *, features: Sequence[str] | None = None, keep_one: bool = True) -> None:
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"CameraDropout p must be in [0, 1], got {p!r}")
        self.p, self.keep_one = float(p), bool(keep_one)
        self.features = None if features is None else list(features)

    def __call__(self, sample: dict[str, Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        names = self.features if self.features is not None else [
            k for k, v in sample.items() if isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() >= 3]
        cameras = [f for f in names if isinstance(sample.get(f), torch.Tensor)
                   and not bool(torch.as_tensor(sample.get(f"{f}_is_pad", torch.zeros(1, dtype=torch.bool))).all())]
        if not cameras:
            return sample
        drop = (torch.rand(len(cameras), generator=generator) < self.p).tolist()
        if self.keep_one and all(drop):
            drop[int(torch.randint(len(cameras), (1,), generator=generator))] = False
        out = dict(sample)
        for camera, dropped in zip(cameras, drop):
            if dropped:
                out[camera] = torch.zeros_like(sample[camera])
                out[f"{camera}_is_pad"] = torch.ones(len(sample[camera]), dtype=torch.bool)
        return out


class Compose:
    """Transforms run one after the other on a sample, each with the same generator (so the chain replays
    exactly): ``Compose(Normalize(mix, mode="quantile"), CameraDropout(0.3))``."""

    def __init__(self, *transforms: Any) -> None:
        bad = [t for t in transforms if not callable(t)]
        if bad:
            raise TypeError(f"Compose takes transforms fn(sample, generator) -> sample; got {bad!r}")
        self.transforms = transforms

    def __call__(self, sample: dict[str, Any], generator: torch.Generator | None = None) -> dict[str, Any]:
        for transform in self.transforms:
            sample = transform(sample, generator)
        return sample


def _leave_per_name(leave: Mapping | None) -> bool:
    """Whether ``leave`` is ``{dataset or embodiment name: {feature: indices}}`` (else ``{feature: indices}``);
    TypeError for anything else, or a mix of the two forms."""
    if leave is None:
        return False
    if not isinstance(leave, Mapping):
        raise TypeError(f"Normalize: leave takes {{feature: [indices]}} or {{dataset or embodiment name: {{feature: "
                        f"[indices]}}}}, got {type(leave).__name__}")
    nested = [isinstance(v, Mapping) for v in leave.values()]
    if any(nested) and not all(nested):
        raise TypeError(f"Normalize: leave={dict(leave)!r} mixes {{feature: [indices]}} with {{name: {{feature: "
                        "[indices]}}; give one form (per name: every entry a dict of features)")
    return bool(nested) and all(nested)


def _left(leave: Mapping | None, feature: str, names: Sequence[str]) -> list[int]:
    """The elements of ``feature`` that ``leave`` keeps as they are, for a dataset known by ``names``:
    ``leave[feature]`` (for every dataset) or the union of ``leave[name][feature]``."""
    if not leave:
        return []
    if not any(isinstance(v, Mapping) for v in leave.values()):
        return _dims_of(leave.get(feature, ()), names)
    return sorted({int(i) for n in names for i in (leave.get(n) or {}).get(feature, ())})


def _dims_of(dims: Dims, names: Sequence[str]) -> list[int]:
    """Element indices for a dataset known by ``names``: ``dims`` itself, or the union of ``dims[name]``."""
    if isinstance(dims, Mapping):
        picked = [int(i) for n in names for i in dims.get(n, ())]
        return sorted(set(picked))
    return sorted({int(i) for i in dims})
