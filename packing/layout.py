"""Token layout: what each piece of a sample costs in tokens, and where it sits in the packed sequence.

A sample is one document. Its pieces are the frames it reads of each feature, each at a time relative to the
anchor (seconds), and the task text. They are laid out as:

1. the task text, one attention step per text token (token-causal);
2. the observed features (every feature not in ``chunk_features``) grouped by time, earliest first: every piece
   observed at one time, in the window's feature order, shares one attention step (block-causal video: the
   tokens of a frame see each other and everything earlier, never later);
3. the chunk (``chunk_features``, by default ``("action",)``): one attention step for the whole chunk, predicted
   jointly as action-chunking policies do, or one step per frame with ``causal_chunk=True``; with
   ``interleave_chunk=True`` a chunk frame at an observed time joins that time's block instead (world models that
   condition the next frame on the current action).

Prices come from the feature names alone (``tokens_per_frame``), so a whole epoch is priced from the index::

    >>> layout = TokenLayout(tokens_per_frame={"observation.images.cam_high": 64})
    >>> pieces = {"observation.images.cam_high": (-0.1, 0.0), "observation.state": (0.0,),
    ...           "action": (0.0, 0.1, 0.2, 0.3)}
    >>> sample = layout.sample(pieces, text_length=10)      # 10 text + 2 * 64 frames + 1 state + 4 actions
    >>> sample.num_tokens, sample.step_sizes[10:]
    (143, (64, 65, 4))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

__all__ = ["SampleLayout", "TokenLayout"]

TEXT = "text"
"""The modality name of task text in a packed batch."""


@dataclass(frozen=True)
class SampleLayout:
    """One sample's place in a packed row: pieces and attention steps, both in token order.

    runs: ``(modality, position, tokens)`` per run of pieces, in order. ``modality`` is ``"text"`` or a feature
        name; ``position`` is the index of the run's first frame among that feature's frames in the sample (runs
        of a chunk feature may span several consecutive frames; 0 for text).
    step_sizes: tokens per attention step, summing to ``num_tokens``.
    """

    runs: tuple[tuple[str, int, int], ...]
    step_sizes: tuple[int, ...]

    @cached_property
    def num_tokens(self) -> int:
        return sum(run[2] for run in self.runs)


@dataclass(frozen=True, kw_only=True)
class TokenLayout:
    """Token prices of each feature, by the dataset's own names, and how a sample is ordered.

    tokens_per_frame: feature -> tokens one frame (one step) of that feature becomes, e.g.
        ``{"observation.images.cam_high": 256}`` for 16x16 patches. Array features not listed cost
        ``default_tokens``; a video feature a sample reads must be listed. Whole-episode chunks read exactly the
        features listed here.
    default_tokens: tokens of one frame of an array feature that ``tokens_per_frame`` does not list.
    tokens_per_text_token: tokens for one text id (1 unless text ids are expanded).
    chunk_features: features laid out as the trailing chunk (see the module docstring).
    causal_chunk: one attention step per chunk frame instead of one for the whole chunk.
    interleave_chunk: chunk frames at an observed time join that time's block.
    """

    tokens_per_frame: Mapping[str, int] = field(default_factory=dict)
    default_tokens: int = 1
    tokens_per_text_token: int = 1
    chunk_features: tuple[str, ...] = ("action",)
    causal_chunk: bool = False
    interleave_chunk: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.tokens_per_frame, Mapping):
            raise TypeError(f"tokens_per_frame must map feature name -> tokens, got {self.tokens_per_frame!r}")
        object.__setattr__(self, "tokens_per_frame", dict(self.tokens_per_frame))
        for feature, tokens in self.tokens_per_frame.items():
            _check_tokens(f"tokens_per_frame[{feature!r}]", tokens)
        _check_tokens("default_tokens", self.default_tokens)
        _check_tokens("tokens_per_text_token", self.tokens_per_text_token)
        if isinstance(self.chunk_features, str):
            raise TypeError(f"chunk_features must be a tuple of feature names, got the string {self.chunk_features!r}")
        object.__setattr__(self, "chunk_features", tuple(self.chunk_features))

    def tokens(self, feature: str) -> int:
        """Tokens of one frame of ``feature``."""
        return int(self.tokens_per_frame.get(feature, self.default_tokens))

    def price(self, counts: Mapping[str, int | np.ndarray], text_lengths: np.ndarray | int) -> np.ndarray:
        """Tokens of each sample (int64) from its frame count per feature and its text length in ids."""
        total = np.asarray(text_lengths, dtype=np.int64) * self.tokens_per_text_token
        for feature, n in counts.items():
            total = total + np.asarray(n, dtype=np.int64) * self.tokens(feature)
        return np.asarray(total, dtype=np.int64)

    def sample(self, pieces: Mapping[str, Sequence[float]], text_length: int) -> SampleLayout:
        """The runs and attention steps of one sample: ``pieces`` gives each feature's frame times (seconds from
        the anchor, in the order the feature's frames are read), ``text_length`` its text ids."""
        runs: list[tuple[str, int, int]] = []
        steps: list[int] = []
        if text_length:
            runs.append((TEXT, 0, text_length * self.tokens_per_text_token))
            steps.extend([self.tokens_per_text_token] * text_length)
        chunk = [f for f in pieces if f in self.chunk_features]
        observed = [f for f in pieces if f not in self.chunk_features]
        times = sorted({_key(t) for f in observed for t in pieces[f]})
        joined = set(times) if self.interleave_chunk else set()
        blocks: dict[int, list[tuple[str, int]]] = {t: [] for t in times}
        for feature in observed:
            for position, t in enumerate(pieces[feature]):
                blocks[_key(t)].append((feature, position))
        trailing: list[tuple[str, int]] = []
        for feature in chunk:
            for position, t in enumerate(pieces[feature]):
                (blocks[_key(t)] if _key(t) in joined else trailing).append((feature, position))
        for t in times:
            block = blocks[t]
            for feature, position in block:
                runs.append((feature, position, self.tokens(feature)))
            steps.append(sum(self.tokens(f) for f, _ in block))
        if trailing:
            for feature, first, count in _consecutive(trailing):
                runs.append((feature, first, count * self.tokens(feature)))
            sizes = [self.tokens(f) for f, _ in trailing]
            steps.extend(sizes if self.causal_chunk else [sum(sizes)])
        return SampleLayout(runs=tuple(runs), step_sizes=tuple(steps))


def _key(t: float) -> int:
    """A time as an integer of microseconds, so that equal times from different rates group together."""
    return int(round(float(t) * 1e6))


def _consecutive(pieces: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """Runs ``(feature, first, count)`` of consecutive positions of one feature."""
    out: list[tuple[str, int, int]] = []
    for feature, position in pieces:
        if out and out[-1][0] == feature and out[-1][1] + out[-1][2] == position:
            out[-1] = (feature, out[-1][1], out[-1][2] + 1)
        else:
            out.append((feature, position, 1))
    return out


def _check_tokens(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
