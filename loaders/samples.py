"""Samples: how episodes are cut into training samples, and what each sample reads.

Two ways to cut, both pure numpy over the index:

- ``windows``: one sample anchored every ``stride`` steps, reading each key at its window offsets (LeRobot-style
  training: a few history frames, the current state, a future action chunk; edges clamped and flagged);
- ``chunks``: whole episodes for long-horizon world models, split into consecutive pieces of at most
  ``max_length`` steps, reading every step of every key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mmfeed.loaders.layout import FRAMES_PREFIX, SampleLayout, TokenLayout
from mmfeed.loaders.sources import EpisodeRequest, Source
from mmfeed.loaders.windows import WindowSpec, episode_chunks, episode_windows

__all__ = ["SampleTable", "SamplingConfig", "build_samples", "chunk_step_tokens"]


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How samples are cut from episodes.

    window: per-key offsets of a windowed sample; None means whole-episode chunks.
    stride: steps between window anchors (1 = one sample per step, as LeRobot).
    max_length: longest chunk in steps (chunk mode; longer episodes are split); None keeps episodes whole.
    """

    window: WindowSpec | None = None
    stride: int = 1
    max_length: int | None = None

    def __post_init__(self) -> None:
        if self.stride < 1:
            raise ValueError(f"SamplingConfig.stride must be >= 1, got {self.stride}")
        if self.max_length is not None and self.max_length < 1:
            raise ValueError(f"SamplingConfig.max_length must be >= 1 or None, got {self.max_length}")


@dataclass(frozen=True, eq=False)
class SampleTable:
    """Every sample of an epoch as arrays: ``episode``, ``start`` (anchor step for windows, first step for
    chunks), ``length`` (steps covered by a chunk; 1 for windows) and ``tokens`` (price), all int64 ``[n]``;
    ``text`` holds each episode's token ids."""

    episode: np.ndarray
    start: np.ndarray
    length: np.ndarray
    tokens: np.ndarray
    text: list[np.ndarray]
    sampling: SamplingConfig
    layout: TokenLayout
    cameras: list[str]
    _layouts: dict = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.episode)

    def spec(self, sample: int) -> WindowSpec:
        """The window of one sample (for chunks: every step of the chunk for every key)."""
        if self.sampling.window is not None:
            return self.sampling.window
        steps = tuple(range(int(self.length[sample])))
        keys = [FRAMES_PREFIX + c for c in self.cameras] + ["proprio", "action"]
        return WindowSpec(offsets={k: steps for k in keys})

    def sample_layout(self, sample: int) -> SampleLayout:
        """Runs and attention steps of one sample (cached by what they depend on)."""
        key = (len(self.text[self.episode[sample]]), int(self.length[sample]) if self.sampling.window is None else 0)
        cached = self._layouts.get(key)
        if cached is None:
            cached = self._layouts[key] = self.layout.sample(self.spec(sample), key[0])
        return cached

    def requests(self, samples: np.ndarray, lengths: np.ndarray) -> list[tuple[EpisodeRequest, dict[str, np.ndarray]]]:
        """:meth:`request` for many samples at once (vectorized over the window's keys)."""
        window = self.sampling.window
        if window is None:
            return [self.request(int(s), lengths) for s in samples]
        samples = np.asarray(samples, dtype=np.int64)
        episode = self.episode[samples]
        last = np.asarray(lengths, dtype=np.int64)[episode][:, None] - 1
        anchor = self.start[samples][:, None]
        idx, pad = {}, {}
        for key, offsets in window.offsets.items():
            raw = anchor + np.asarray(offsets, dtype=np.int64)[None, :]
            pad[key] = (raw < 0) | (raw > last)
            idx[key] = np.clip(raw, 0, last)
        return [(EpisodeRequest(int(e), {k: v[i] for k, v in idx.items()}), {k: v[i] for k, v in pad.items()})
                for i, e in enumerate(episode)]

    def request(self, sample: int, lengths: np.ndarray) -> tuple[EpisodeRequest, dict[str, np.ndarray]]:
        """What sample reads (clamped steps per key) and its ``is_pad`` flags per key."""
        e = int(self.episode[sample])
        if self.sampling.window is not None:
            idx, pad = self.sampling.window.indices(np.array([self.start[sample]]), int(lengths[e]))
            return EpisodeRequest(e, {k: v[0] for k, v in idx.items()}), {k: v[0] for k, v in pad.items()}
        steps = np.arange(self.start[sample], self.start[sample] + self.length[sample], dtype=np.int64)
        spec = self.spec(sample)
        return EpisodeRequest(e, {k: steps for k in spec.offsets}), {k: np.zeros(len(steps), bool) for k in spec.offsets}


def chunk_step_tokens(layout: TokenLayout, cameras: list[str]) -> int:
    """Tokens one step of a whole-episode chunk costs: a frame of each camera, the proprio state, the action."""
    return sum(layout.tokens_per_frame[c] for c in cameras) + layout.tokens_per_proprio_step \
        + layout.tokens_per_action_step


def build_samples(source: Source, sampling: SamplingConfig, layout: TokenLayout, tokenizer) -> SampleTable:
    """Cut and price every sample of ``source`` from its index alone."""
    lengths = np.asarray(source.lengths, dtype=np.int64)
    by_task: dict[str, np.ndarray] = {}
    text = []
    for e in range(len(lengths)):
        task = source.task(e)
        if task not in by_task:
            by_task[task] = np.asarray(tokenizer.encode(task), dtype=np.int32)
        text.append(by_task[task])
    text_len = np.array([len(t) for t in text], dtype=np.int64)
    cameras = [c for c in source.cameras if c in layout.tokens_per_frame]
    if sampling.window is not None:
        for key in sampling.window.offsets:
            layout.key_tokens(key)  # every key must be priced
        episode, start = episode_windows(lengths, stride=sampling.stride)
        length = np.ones(len(episode), dtype=np.int64)
        tokens = layout.price(sampling.window, text_len[episode])
    else:
        max_length = sampling.max_length or int(lengths.max(initial=1))
        episode, start, length = episode_chunks(lengths, max_length)
        tokens = text_len[episode] * layout.tokens_per_text_token + length * chunk_step_tokens(layout, cameras)
    return SampleTable(episode, start, length, np.asarray(tokens, dtype=np.int64), text, sampling, layout, cameras)
