"""Token layout: what each piece of a sample costs in tokens, and where it sits in the packed sequence.

A sample (one window of an episode) is laid out as one document:

1. the task text, one token per text id, token-causal (one attention step per token);
2. for each observation time of the window, in time order, the frames of every camera at that time followed by
   the proprio state at that time; everything observed at one time shares one attention step (block-causal video);
3. the action chunk: one attention step for the whole chunk (predicted jointly, as action-chunking policies do),
   or one step per action step with ``causal_actions=True``.

The layout prices samples for packing from the window alone, so a whole epoch can be planned without decoding::

    >>> layout = TokenLayout(tokens_per_frame={"cam_high": 64}, tokens_per_proprio_step=1)
    >>> spec = WindowSpec(offsets={"frames.cam_high": (-1, 0), "proprio": (0,), "action": tuple(range(4))})
    >>> int(layout.price(spec, text_lengths=np.array([10]))[0])   # 10 text + 2 * 64 frames + 1 proprio + 4 actions
    143
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from mmfeed.loaders.windows import WindowSpec

__all__ = ["FRAMES_PREFIX", "SampleLayout", "TokenLayout"]

FRAMES_PREFIX = "frames."


@dataclass(frozen=True)
class SampleLayout:
    """One sample's place in a packed row: modality runs and attention steps, both in token order.

    runs: ``(modality, window position, tokens)`` per piece, in order. ``modality`` is ``"text"`` or the window key
        the piece comes from (``frames.<camera>``, ``proprio``, ``action``); ``window position`` is its index among
        that key's offsets (for an action run, the first of its consecutive positions; 0 for text).
    step_sizes: tokens per attention step, summing to ``num_tokens``.
    """

    runs: tuple[tuple[str, int, int], ...]
    step_sizes: tuple[int, ...]

    @property
    def num_tokens(self) -> int:
        return sum(run[2] for run in self.runs)


@dataclass(frozen=True, kw_only=True)
class TokenLayout:
    """Token prices of each modality.

    tokens_per_frame: camera name -> tokens one frame of that camera becomes (e.g. 256 for 16x16 patches).
    tokens_per_proprio_step: tokens for one proprio state vector.
    tokens_per_action_step: tokens for one action vector.
    tokens_per_text_token: tokens for one text id (1 unless text ids are expanded).
    causal_actions: one attention step per action step instead of one for the whole chunk.
    interleave_actions: put the action of each observed time into that time's block (frames, proprio, action),
        as world models that condition the next frame on the current action do; action offsets at no observed
        time still form the trailing chunk.
    """

    tokens_per_frame: Mapping[str, int] = field(default_factory=dict)
    tokens_per_proprio_step: int = 1
    tokens_per_action_step: int = 1
    tokens_per_text_token: int = 1
    causal_actions: bool = False
    interleave_actions: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens_per_frame", dict(self.tokens_per_frame))
        for camera, tokens in self.tokens_per_frame.items():
            _check_tokens(f"tokens_per_frame[{camera!r}]", tokens)
        for name in ("tokens_per_proprio_step", "tokens_per_action_step", "tokens_per_text_token"):
            _check_tokens(name, getattr(self, name))

    @property
    def cameras(self) -> list[str]:
        return list(self.tokens_per_frame)

    def modalities(self) -> list[str]:
        """Modality names in the order of ``PackedBatch.modalities``."""
        return ["text", *(FRAMES_PREFIX + c for c in self.cameras), "proprio", "action"]

    def key_tokens(self, key: str) -> int:
        """Tokens of one step of window key ``key`` (``frames.<camera>``, ``proprio`` or ``action``)."""
        if key.startswith(FRAMES_PREFIX):
            camera = key[len(FRAMES_PREFIX) :]
            if camera not in self.tokens_per_frame:
                raise ValueError(f"window key {key!r} names camera {camera!r}, which the layout has no price for; "
                                 f"priced cameras: {self.cameras}")
            return self.tokens_per_frame[camera]
        if key == "proprio":
            return self.tokens_per_proprio_step
        if key == "action":
            return self.tokens_per_action_step
        raise ValueError(f"window key {key!r} is not 'frames.<camera>', 'proprio' or 'action'")

    def price(self, spec: WindowSpec, text_lengths: np.ndarray) -> np.ndarray:
        """Tokens of each sample (int64 ``[N]``) given the window and each sample's text length in ids."""
        fixed = sum(len(offsets) * self.key_tokens(key) for key, offsets in spec.offsets.items())
        text = np.asarray(text_lengths, dtype=np.int64)
        return fixed + text * self.tokens_per_text_token

    def sample(self, spec: WindowSpec, text_length: int) -> SampleLayout:
        """The runs and attention steps of one sample with ``text_length`` text ids."""
        runs: list[tuple[str, int, int]] = []
        steps: list[int] = []
        if text_length:
            runs.append(("text", 0, text_length * self.tokens_per_text_token))
            steps.extend([self.tokens_per_text_token] * text_length)
        for key in spec.offsets:
            self.key_tokens(key)  # rejects keys the layout cannot price
        # At each observation time: every camera in layout order, then proprio.
        observed = [FRAMES_PREFIX + c for c in self.cameras if FRAMES_PREFIX + c in spec.offsets]
        observed += ["proprio"] if "proprio" in spec.offsets else []
        times = sorted({o for k in observed for o in spec.offsets[k]})
        actions = spec.offsets.get("action", ())
        in_blocks: dict[int, list[int]] = {}
        if self.interleave_actions:
            for position, offset in enumerate(actions):
                if offset in set(times):
                    in_blocks.setdefault(offset, []).append(position)
        for t in times:
            step = 0
            for key in observed:
                for position, offset in enumerate(spec.offsets[key]):
                    if offset == t:
                        tokens = self.key_tokens(key)
                        runs.append((key, position, tokens))
                        step += tokens
            for position in in_blocks.get(t, ()):
                runs.append(("action", position, self.tokens_per_action_step))
                step += self.tokens_per_action_step
            steps.append(step)
        chunk = [p for p, o in enumerate(actions) if o not in set(times) or not self.interleave_actions]
        if chunk:
            # The chunk's actions are consecutive positions of the window's action offsets.
            for first, count in _runs(chunk):
                runs.append(("action", first, count * self.tokens_per_action_step))
            tokens = len(chunk) * self.tokens_per_action_step
            steps.extend([self.tokens_per_action_step] * len(chunk) if self.causal_actions else [tokens])
        return SampleLayout(runs=tuple(runs), step_sizes=tuple(steps))


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs ``(first, count)`` of sorted positions."""
    out: list[tuple[int, int]] = []
    for p in positions:
        if out and out[-1][0] + out[-1][1] == p:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((p, 1))
    return out


def _check_tokens(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
