"""``mmfeed bench train``: what packing buys in training, measured on a variable-length robot workload.

One small transformer (:class:`mmfeed.testing.model.TinyWorldModel`: features embedded by name, SDPA with
``PackedBatch.attention_mask()``, a loss divided by the real label terms) is trained three ways from the same
initial weights with the same AdamW settings, on the same samples in the same order, in as many optimizer steps:

- **packed**: mmfeed's plan (:func:`mmfeed.packing.plan_epoch`: best fit decreasing into rows of ``capacity``
  tokens, ``rows_per_batch`` rows a step, epoch after epoch) laid out as :class:`~mmfeed.packing.PackedBatch`
  rows holding several documents each, with exact document masks;
- **padded**: every packed step's samples again, each its own row, the batch padded to its longest sample (a
  ``PackedBatch`` with one document per row and ``capacity`` = that longest), so the same model code runs;
- **padded_fixed**: the usual pad-to-longest loader: the same sample stream cut into batches of a fixed number of
  samples (+-1; as many batches as packed steps), each padded to its longest.

*packed* and *padded* see the same samples in every optimizer step, so they train on the same useful tokens and
the loss, which counts real label terms only, is the same function of the weights: the two trainings follow one
trajectory up to float rounding, and the throughput ratio is what the padding costs, nothing else. That is the
like-for-like comparison the targets are judged on. *padded_fixed* groups the same samples into other steps, so
its loss differs by batch composition (a different sequence of gradients), not by packing: its losses (training,
and on the same held-out packed batches) are reported as what they are, a few percent off, not judged.

Workload (token-level synthetic, seeded, priced and ordered by :class:`~mmfeed.loaders.TokenLayout`): episodes
of two embodiments at a 30 Hz control clock, ``bimanual`` (``observation.images.cam_high`` 16 tokens a frame at
15 fps, ``observation.images.cam_wrist`` 4 tokens at 30 fps) and ``single_arm`` (``observation.images.front``
36 tokens at 10 fps), 14-d ``observation.state`` and ``action``, task text of 10-90 bytes. Half the episodes
feed a world model with whole-episode chunks of up to ``chunk_steps`` steps (every frame, state and action,
the action of each time in its block: long documents, the last chunk of an episode short); the other half feed
a policy with windows every ``stride`` steps (the last 2 frames of each camera, the state, a 16-step action
chunk, clamped actions past the episode's end flagged in ``action_is_pad``: short documents).

Timing: all batches are built (and moved to the device) before training. After one warm-up stretch per side
(trained on, not timed), ``repeats`` stretches of ``steps`` optimizer steps per side, interleaved (A B C, then
C B A, ...), each side continuing its own training. A stretch's useful tokens/s is its non-padding tokens over
its wall time (CUDA synchronised) and, as ``cpu_useful_tokens_per_s``, over the process CPU time (steadier on a
shared machine; on CUDA it is only the host's share); figures are medians with the per-stretch values under ``repeats``;
a ratio is the median of the ratios of neighbouring stretches (stretch k of both sides). CPU runs use one torch thread
by default (``--threads``): the model is small, a second thread buys little, and on a machine shared with other jobs the
threads' barriers make timings erratic. Loss: per label term, over each side's last stretch, and after training
on the same held-out packed batches. Targets: packed >= 1.5x the useful tokens/s of padded; losses within 1%.

Run ``python -m mmfeed.bench.train [--quick] [--device cuda] [--json FILE]`` (or ``mmfeed bench train``);
``--device cuda`` prints that it is skipped (exit 0) where torch sees no GPU.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from mmfeed.bench.common import environment, table
from mmfeed.packing import PackedBatch, PlanConfig, plan_epoch
from mmfeed.packing.layout import TEXT, TokenLayout
from mmfeed.testing.model import TinyModelConfig, TinyWorldModel

__all__ = ["DEFAULT", "QUICK", "SIDES", "Doc", "TrainBench", "build_batch", "corpus", "main", "modalities",
           "model_config", "padded_batch", "packed_steps", "render", "run_bench", "stretches", "train_step"]

FPS = 30.0
CAM_HIGH, CAM_WRIST, FRONT = ("observation.images.cam_high", "observation.images.cam_wrist",
                              "observation.images.front")
STATE, ACTION = "observation.state", "action"
DIM = 14  # state and action dimensions
PATCH = 2  # TinyModelConfig.patch_pixels: a frame of k tokens is its grid of k PATCH x PATCH patches
# embodiment -> camera feature -> (fps, tokens per frame)
EMBODIMENTS = {"bimanual": {CAM_HIGH: (15.0, 16), CAM_WRIST: (30.0, 4)}, "single_arm": {FRONT: (10.0, 36)}}
LAYOUT = TokenLayout(tokens_per_frame={f: n for cams in EMBODIMENTS.values() for f, (_, n) in cams.items()},
                     chunk_features=(ACTION,), causal_chunk=True, interleave_chunk=True)
HISTORY, HORIZON = 2, 16  # policy windows: camera frames, action steps
WORDS = ("pick", "up", "the", "red", "blue", "green", "cube", "cup", "place", "it", "in", "on", "bin", "tray",
         "open", "close", "drawer", "left", "right", "fold", "towel", "stack", "blocks", "and", "then", "wipe")
TARGET_SPEEDUP, TARGET_LOSS = 1.5, 0.01


@dataclass(frozen=True)
class TrainBench:
    """Settings of one run (see the module docstring)."""

    capacity: int = 1024
    rows_per_batch: int = 2
    steps: int = 8             # optimizer steps per measured stretch
    repeats: int = 7           # measured stretches per side
    episodes: int = 160        # training episodes (half world model, half policy)
    heldout_episodes: int = 24
    heldout_steps: int = 6     # held-out packed batches
    min_length: int = 60       # episode length in control steps
    max_length: int = 240
    chunk_steps: int = 48      # longest world-model chunk
    stride: int = 8            # policy windows: steps between anchors
    width: int = 64
    depth: int = 2
    heads: int = 4
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"

    @property
    def frame_shapes(self) -> dict[str, tuple[int, int, int]]:
        shapes = {}
        for cams in EMBODIMENTS.values():
            for feature, (_, tokens) in cams.items():
                rows = max(d for d in range(1, math.isqrt(tokens) + 1) if tokens % d == 0)
                shapes[feature] = (rows * PATCH, tokens // rows * PATCH, 3)
        return shapes


DEFAULT = TrainBench()
QUICK = replace(DEFAULT, capacity=512, chunk_steps=24, steps=3, repeats=2, episodes=24, heldout_episodes=8,
                heldout_steps=2, width=32, heads=2)


@dataclass(frozen=True, eq=False)
class Doc:
    """One sample laid out: its tokens, modality runs and attention steps, and each modality's payload items in
    token order (``items[m]``: ``[n, *shape]``; ``pad``: ``action_is_pad`` of its action items)."""

    kind: str
    embodiment: str
    tokens: int
    segments: list[tuple[int, int]]
    steps: list[int]
    items: dict[str, np.ndarray]
    pad: np.ndarray


def modalities() -> list[str]:
    cams = [f for cams in EMBODIMENTS.values() for f in cams]
    return [TEXT, *cams, STATE, ACTION]


def _episode(rng: np.random.Generator, embodiment: str, length: int, mixing: np.ndarray, shapes) -> dict:
    """Arrays of one synthetic episode: a smooth state trajectory, actions a fixed map of the next state (plus
    noise), random frames per camera at its own rate and a task text."""
    t = np.arange(length + 1)[:, None] / FPS
    freq, phase = rng.uniform(0.2, 1.5, DIM), rng.uniform(0, 2 * np.pi, DIM)
    state = np.sin(2 * np.pi * freq * t + phase).astype(np.float32)
    action = (state[1:] @ mixing + 0.05 * rng.standard_normal((length, DIM))).astype(np.float32)
    frames = {f: rng.integers(0, 256, (math.ceil(length / FPS * fps),) + shapes[f], dtype=np.uint8)
              for f, (fps, _) in EMBODIMENTS[embodiment].items()}
    words = rng.choice(WORDS, int(rng.integers(2, 16)))
    text = np.frombuffer(" ".join(words).encode()[:90], np.uint8).astype(np.int32)
    return {"state": state[:length], "action": action, "frames": frames, "text": text, "length": length}


def _doc(kind: str, embodiment: str, ep: dict, pieces: dict, index: dict, pad: np.ndarray) -> Doc:
    """Lay one sample out by LAYOUT: ``pieces`` feature -> (times, frame indices)."""
    names = modalities()
    lay = LAYOUT.sample({f: times for f, (times, _) in pieces.items()}, text_length=len(ep["text"]))
    items: dict[str, list[np.ndarray]] = {}
    pads: list[np.ndarray] = []
    for modality, position, tokens in lay.runs:
        if modality == TEXT:
            items.setdefault(TEXT, []).append(ep["text"])
            continue
        n = tokens // LAYOUT.tokens(modality)
        frames = pieces[modality][1][position : position + n]
        source = ep["frames"][modality] if modality in ep["frames"] else ep[index[modality]]
        items.setdefault(modality, []).append(source[frames])
        if modality == ACTION:
            pads.append(pad[position : position + n])
    segments = [(names.index(m), tokens) for m, _, tokens in lay.runs]
    return Doc(kind, embodiment, lay.num_tokens, segments, list(lay.step_sizes),
               {m: np.concatenate(v) for m, v in items.items()}, np.concatenate(pads))


def corpus(cfg: TrainBench, episodes: int, seed: int) -> list[Doc]:
    """The samples of ``episodes`` synthetic episodes (alternating embodiments; every other pair of episodes a
    world model's, cut into chunks, the others a policy's, cut into windows)."""
    rng = np.random.default_rng([seed, episodes])
    shapes = cfg.frame_shapes
    mixing = {e: np.random.default_rng([seed, i]).standard_normal((DIM, DIM)).astype(np.float32) / np.sqrt(DIM)
              for i, e in enumerate(EMBODIMENTS)}
    index = {STATE: "state", ACTION: "action"}
    docs = []
    for e in range(episodes):
        embodiment = list(EMBODIMENTS)[e % 2]
        length = int(rng.integers(cfg.min_length, cfg.max_length + 1))
        ep = _episode(rng, embodiment, length, mixing[embodiment], shapes)
        cams = EMBODIMENTS[embodiment]
        if e // 2 % 2 == 0:  # world model: whole-episode chunks
            for start in range(0, length, cfg.chunk_steps):
                stop = min(start + cfg.chunk_steps, length)
                steps = np.arange(start, stop)
                pieces = {}
                for f, (fps, _) in cams.items():
                    j = np.arange(math.ceil(start / FPS * fps - 1e-9), math.ceil(stop / FPS * fps - 1e-9))
                    j = j[j < len(ep["frames"][f])]
                    pieces[f] = (tuple(j / fps - start / FPS), j)
                times = tuple((steps - start) / FPS)
                pieces[STATE] = pieces[ACTION] = (times, steps)
                docs.append(_doc("world_chunk", embodiment, ep, pieces, index, np.zeros(len(steps), bool)))
        else:  # policy: windows
            for anchor in range(0, length, cfg.stride):
                pieces = {}
                for f, (fps, _) in cams.items():
                    deltas = tuple((k - (HISTORY - 1)) / fps for k in range(HISTORY))
                    j = np.clip(np.floor((anchor / FPS + np.array(deltas)) * fps + 1e-6), 0,
                                len(ep["frames"][f]) - 1).astype(np.int64)
                    pieces[f] = (deltas, j)
                pieces[STATE] = ((0.0,), np.array([anchor]))
                want = anchor + np.arange(HORIZON)
                pieces[ACTION] = (tuple(np.arange(HORIZON) / FPS), np.minimum(want, length - 1))
                docs.append(_doc("policy_window", embodiment, ep, pieces, index, want >= length))
    return docs


def build_batch(docs: Sequence[Doc], rows: Sequence[Sequence[int]], capacity: int) -> PackedBatch:
    """The PackedBatch of ``rows`` (doc indices per row) at ``capacity``: payloads flat in token order."""
    names = modalities()
    order = [int(i) for row in rows for i in row]
    data = {}
    for m in names:
        parts = [docs[i].items[m] for i in order if m in docs[i].items]
        if parts:
            data[m] = torch.from_numpy(np.concatenate(parts))
    data[f"{ACTION}_is_pad"] = torch.from_numpy(np.concatenate([docs[i].pad for i in order]))
    return PackedBatch.from_segments([[docs[i].tokens for i in row] for row in rows], capacity,
                                     step_sizes=[[docs[i].steps for i in row] for row in rows],
                                     segments=[[docs[i].segments for i in row] for row in rows],
                                     modalities=names, data=data)


def padded_batch(docs: Sequence[Doc], samples: Sequence[int]) -> PackedBatch:
    """Pad-to-longest: each sample its own row, the rows as long as the longest sample."""
    return build_batch(docs, [[int(i)] for i in samples], max(docs[int(i)].tokens for i in samples))


def packed_steps(docs: Sequence[Doc], cfg: TrainBench, steps: int, *, seed: int) -> list[list[np.ndarray]]:
    """The rows (doc indices) of ``steps`` packed steps: mmfeed's plan, epoch after epoch as needed."""
    tokens = np.array([d.tokens for d in docs], np.int64)
    config = PlanConfig(capacity=cfg.capacity, rows_per_batch=cfg.rows_per_batch)
    out: list[list[np.ndarray]] = []
    epoch = 0
    while len(out) < steps:
        plan = plan_epoch(tokens, config, seed=seed, epoch=epoch)
        if not plan.num_steps:
            raise ValueError(f"the corpus fills no step of {cfg.rows_per_batch} rows of {cfg.capacity} tokens")
        out.extend(plan.batch_rows(0, s) for s in range(plan.num_steps))
        epoch += 1
    return out[:steps]


def model_config(cfg: TrainBench) -> TinyModelConfig:
    features = {**cfg.frame_shapes, STATE: (DIM,), ACTION: (DIM,)}
    return TinyModelConfig(layout=LAYOUT, features=features, width=cfg.width, depth=cfg.depth, heads=cfg.heads,
                           max_positions=cfg.capacity, patch_pixels=PATCH)


def train_step(model: TinyWorldModel, opt: torch.optim.Optimizer, batch: PackedBatch) -> tuple[torch.Tensor, ...]:
    """One optimizer step; the loss terms' sum and count (tensors, left on the device)."""
    opt.zero_grad(set_to_none=True)
    out = model.loss(batch)
    out.loss.backward()
    opt.step()
    return out.document_sum.detach().sum(), out.document_count.sum()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stats(values: Sequence[int]) -> dict[str, float]:
    a = np.asarray(values)
    return {"count": int(a.size), "min": int(a.min()), "p50": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "max": int(a.max()), "mean": float(a.mean())}


def _evaluate(model: TinyWorldModel, batches: Sequence[PackedBatch]) -> float:
    total, count = 0.0, 0
    with torch.no_grad():
        for b in batches:
            out = model.loss(b)
            total += float(out.document_sum.sum())
            count += int(out.document_count.sum())
    return total / max(count, 1)


SIDES = ("packed", "padded", "padded_fixed")


def stretches(docs: Sequence[Doc], cfg: TrainBench, rows: Sequence[list[np.ndarray]]) -> dict[str, list[list]]:
    """Each side's batches, stretch by stretch (``cfg.steps`` packed steps a stretch; every side trains on the
    same samples in the same order in each stretch, in as many optimizer steps): packed rows, the same steps
    padded to their longest, and the stretch's samples in order cut into as many pad-to-longest batches of
    equal sample counts (+-1)."""
    out: dict[str, list[list]] = {side: [] for side in SIDES}
    for k in range(0, len(rows), cfg.steps):
        span = rows[k : k + cfg.steps]
        stream = np.concatenate([np.concatenate(r) for r in span])
        out["packed"].append([build_batch(docs, r, cfg.capacity) for r in span])
        out["padded"].append([padded_batch(docs, np.concatenate(r)) for r in span])
        out["padded_fixed"].append([padded_batch(docs, part) for part in np.array_split(stream, len(span))])
    return out


def run_bench(cfg: TrainBench, *, progress: bool = False) -> dict[str, Any]:
    """Train every side (see the module docstring); the report."""
    device = torch.device(cfg.device)
    docs = corpus(cfg, cfg.episodes, cfg.seed)
    rows = packed_steps(docs, cfg, (1 + cfg.repeats) * cfg.steps, seed=cfg.seed)
    work = {side: [[b.to(device) for b in stretch] for stretch in s] for side, s in stretches(docs, cfg, rows).items()}
    held = corpus(cfg, cfg.heldout_episodes, cfg.seed + 1_000_003)
    heldout = [build_batch(held, r, cfg.capacity).to(device)
               for r in packed_steps(held, cfg, cfg.heldout_steps, seed=cfg.seed)]
    torch.manual_seed(cfg.seed)
    init = TinyWorldModel(model_config(cfg)).to(device)
    runs = {}
    for side in SIDES:
        model = copy.deepcopy(init)
        runs[side] = {"model": model, "opt": torch.optim.AdamW(model.parameters(), lr=cfg.lr), "wall": [],
                      "cpu": [], "useful": [], "loss": math.nan}
    for k in range(1 + cfg.repeats):  # stretch 0 warms up; then ABC, CBA, ...
        useful = {side: sum(_useful(b) for b in work[side][k]) for side in SIDES}
        if len(set(useful.values())) != 1:
            raise AssertionError(f"stretch {k}: the sides hold different useful tokens {useful}")
        for side in SIDES if k % 2 == 0 else SIDES[::-1]:
            run = runs[side]
            _sync(device)
            wall, cpu = time.perf_counter(), time.process_time()
            parts = [train_step(run["model"], run["opt"], b) for b in work[side][k]]
            _sync(device)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            run["loss"] = float(sum(p[0] for p in parts)) / max(int(sum(p[1] for p in parts)), 1)
            if k:
                run["wall"].append(wall)
                run["cpu"].append(cpu)
            if progress:
                print(f"  stretch {k} {side:12s} {wall:6.2f} s ({cpu:5.2f} s CPU) {useful[side] / wall:8.0f} useful "
                      f"tokens/s{'  (warm-up, not counted)' if not k else ''}", flush=True)
        for side in SIDES:
            if k:
                runs[side]["useful"].append(useful[side])
    for run in runs.values():
        run["heldout"] = _evaluate(run["model"], heldout)
    return _report(cfg, docs, rows, work, runs)


def _useful(batch: PackedBatch) -> int:
    return int((batch.document_ids >= 0).sum())


def _report(cfg: TrainBench, docs, rows, work, runs) -> dict[str, Any]:
    report: dict[str, Any] = {}
    for side in SIDES:
        batches = [b for stretch in work[side] for b in stretch]
        useful, slots = sum(map(_useful, batches)), sum(b.num_rows * b.capacity for b in batches)
        run = runs[side]
        rates = [u / t for u, t in zip(run["useful"], run["wall"])]
        cpu_rates = [u / t for u, t in zip(run["useful"], run["cpu"])]
        report[side] = {
            "useful_tokens_per_s": statistics.median(rates), "cpu_useful_tokens_per_s": statistics.median(cpu_rates),
            "stretch_s": statistics.median(run["wall"]), "stretch_cpu_s": statistics.median(run["cpu"]),
            "useful_tokens": useful, "token_slots": slots, "padding_fraction": 1 - useful / slots,
            "steps": len(batches), "rows_per_step": statistics.mean(b.num_rows for b in batches),
            "row_tokens_per_step": statistics.mean(b.capacity for b in batches),
            "train_loss": run["loss"], "heldout_loss": run["heldout"],
            "repeats": {"useful_tokens_per_s": rates, "cpu_useful_tokens_per_s": cpu_rates, "stretch_s": run["wall"],
                        "stretch_cpu_s": run["cpu"]},
        }
    p = report["packed"]
    ratios: dict[str, float] = {}
    for side in SIDES[1:]:
        q = report[side]
        for clock in ("", "cpu_"):
            key = f"{clock}useful_tokens_per_s"
            per = [a / b for a, b in zip(p["repeats"][key], q["repeats"][key])]  # stretch k beside stretch k
            ratios[f"{clock}packed_vs_{side}"] = statistics.median(per)
            ratios[f"{clock}packed_vs_{side}_min"], ratios[f"{clock}packed_vs_{side}_max"] = min(per), max(per)
        for loss in ("train_loss", "heldout_loss"):
            ratios[f"{loss}_relative_difference_{side}"] = abs(p[loss] - q[loss]) / abs(q[loss])
    report["ratios"] = ratios
    loss_gap = max(ratios["train_loss_relative_difference_padded"], ratios["heldout_loss_relative_difference_padded"])
    report["targets"] = {"speedup": TARGET_SPEEDUP, "loss_relative_difference": TARGET_LOSS}
    report["target_checks"] = {"speedup": ratios["packed_vs_padded"] >= TARGET_SPEEDUP,
                               "loss_relative_difference": loss_gap <= TARGET_LOSS}
    kinds: dict[str, list[int]] = {}
    for d in docs:
        kinds.setdefault(f"{d.kind}.{d.embodiment}", []).append(d.tokens)
    trained = [int(i) for r in rows for row in r for i in row]
    report["workload"] = {
        "samples": len(docs), "trained_samples": len(trained), "distinct_samples_trained": len(set(trained)),
        "tokens": _stats([d.tokens for d in docs]), "by_kind": {k: _stats(v) for k, v in sorted(kinds.items())},
        "token_share_world_chunks": sum(d.tokens for d in docs if d.kind == "world_chunk")
        / sum(d.tokens for d in docs),
        "samples_per_step": statistics.mean(sum(map(len, r)) for r in rows)}
    report["settings"] = {**asdict(cfg), "threads": torch.get_num_threads(),
                          "layout": {"tokens_per_frame": dict(LAYOUT.tokens_per_frame),
                                     "chunk_features": list(LAYOUT.chunk_features),
                                     "causal_chunk": LAYOUT.causal_chunk, "interleave_chunk": LAYOUT.interleave_chunk},
                          "model": "mmfeed.testing.model.TinyWorldModel", "attention": "sdpa", "optimizer": "AdamW"}
    report["environment"] = environment()
    return report


def render(report: dict[str, Any]) -> str:
    """The report as text: the workload, one row per side, the ratios and the loss agreement."""
    w = report["workload"]
    lines = [f"workload: {w['samples']} samples, tokens min {w['tokens']['min']} / median {w['tokens']['p50']:.0f} / "
             f"p90 {w['tokens']['p90']:.0f} / max {w['tokens']['max']}; world-model chunks hold "
             f"{w['token_share_world_chunks']:.0%} of the tokens"]
    for kind, s in w["by_kind"].items():
        lines.append(f"  {kind:24s} {s['count']:5d} samples, {s['min']}-{s['max']} tokens (median {s['p50']:.0f})")
    lines.append(f"each side trained on {w['trained_samples']} samples in the same order "
                 f"({w['samples_per_step']:.1f} a step), {report['packed']['useful_tokens']} useful tokens")
    rows = []
    for side in SIDES:
        s = report[side]
        rates = s["repeats"]["useful_tokens_per_s"]
        rows.append({"side": side, "tok": s["useful_tokens_per_s"], "spread": f"{min(rates):.0f}-{max(rates):.0f}",
                     "cpu": s["cpu_useful_tokens_per_s"],
                     "steps": s["steps"], "pad": f"{s['padding_fraction']:.1%}",
                     "shape": f"{s['rows_per_step']:.1f} x {s['row_tokens_per_step']:.0f}",
                     "train": f"{s['train_loss']:.6f}", "held": f"{s['heldout_loss']:.6f}"})
    lines.append(table(rows, [("side", "side"), ("tok", "useful tok/s"), ("spread", "min-max"),
                              ("cpu", "per CPU s"), ("steps", "steps"),
                              ("pad", "padding"), ("shape", "rows x tokens/step"), ("train", "train loss"),
                              ("held", "held-out loss")]))
    r, ok = report["ratios"], report["target_checks"]
    for side in SIDES[1:]:
        lines.append(f"packed / {side}: {r[f'packed_vs_{side}']:.2f}x useful tokens/s (stretches "
                     f"{r[f'packed_vs_{side}_min']:.2f}-{r[f'packed_vs_{side}_max']:.2f}x), per CPU second "
                     f"{r[f'cpu_packed_vs_{side}']:.2f}x ({r[f'cpu_packed_vs_{side}_min']:.2f}-"
                     f"{r[f'cpu_packed_vs_{side}_max']:.2f}x); loss per label term apart by "
                     f"{r[f'train_loss_relative_difference_{side}']:.2e} (train), "
                     f"{r[f'heldout_loss_relative_difference_{side}']:.2e} (held-out)")
    lines.append(f"targets, packed vs padded (same steps): >= {TARGET_SPEEDUP}x useful tokens/s "
                 f"{'met' if ok['speedup'] else 'MISSED'}; losses within {TARGET_LOSS:.0%} "
                 f"{'met' if ok['loss_relative_difference'] else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmfeed bench train", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model and few steps (< 30 s; for tests)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda; cuda is skipped when absent")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per measured stretch")
    parser.add_argument("--repeats", type=int, default=None, help="measured stretches per side")
    parser.add_argument("--capacity", type=int, default=None, help="tokens per packed row (default 1024)")
    parser.add_argument("--rows-per-batch", type=int, default=None, help="packed rows per step (default 2)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: see the module docstring; 0 keeps torch's own)")
    parser.add_argument("--json", metavar="FILE", help="write every figure, the settings and the environment")
    parser.add_argument("--no-progress", action="store_true", help="no per-stretch lines")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else DEFAULT
    for name in ("steps", "repeats", "capacity", "rows_per_batch", "seed"):
        value = getattr(args, name)
        if value is not None:
            least = 0 if name == "seed" else 1
            if value < least:
                parser.error(f"--{name.replace('_', '-')} must be >= {least}")
            cfg = replace(cfg, **{name: value})
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"skipped: --device {args.device}, but torch sees no CUDA device")
        return 0
    if args.threads < 0:
        parser.error("--threads must be >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run_bench(replace(cfg, device=args.device), progress=not args.no_progress)
    print(render(report))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
