"""A tiny block-causal transformer over :class:`~mmfeed.packing.PackedBatch`, for examples and correctness tests.

It embeds every modality a packed robot batch carries and trains on it, so that the examples show a complete
loop and the tests can check end to end that packing changes nothing a model computes:

- frames (uint8 ``[n, H, W, 3]``) become ``tokens_per_frame`` patch tokens each: the frame is average-pooled to a
  ``gh x gw`` grid of ``patch_pixels``-square patches (``gh * gw == tokens_per_frame``) and each patch goes
  through a linear patch embedding (one per camera);
- proprio and action vectors become ``tokens_per_*_step`` tokens each through a linear map; an action token's
  input is a learned query, plus the previous action of its document when the layout has ``causal_actions``
  (teacher forcing: with one attention step per action the next action is never visible);
- text ids go through an embedding table.

The per-item embeddings are written into the ``[R, C]`` token slots of their modality in row-major order: the
payload of every modality is flat over the batch in token order (see :mod:`mmfeed.loaders.collate`), so the
k-th item fills the k-th group of slots whose ``modality_ids`` name that modality. Positions come from
``position_ids``; attention is SDPA with ``attention_mask()`` or FlexAttention with ``block_mask()``.

The loss (:meth:`TinyWorldModel.loss`) sums, per document, next-token cross-entropy on text (a text token
predicts the next token only when both are text of the same document: labels never cross a document boundary)
and the squared error of each action regressed from its tokens (steps flagged in ``action_is_pad`` left out),
and divides by the number of those real label terms, never by padding::

    >>> import torch
    >>> from mmfeed import PackedBatch
    >>> from mmfeed.loaders import TokenLayout
    >>> b = PackedBatch.from_segments([[4, 3]], 8, segments=[[[(0, 3), (1, 1)], [(0, 2), (1, 1)]]],
    ...                               modalities=["text", "action"], step_sizes=[[[1, 1, 1, 1], [1, 1, 1]]],
    ...                               data={"text": torch.tensor([5, 6, 7, 8, 9]), "action": torch.zeros(2, 3)})
    >>> model = TinyWorldModel(TinyModelConfig(layout=TokenLayout(), proprio_dim=1, action_dim=3))
    >>> out = model.loss(b)
    >>> out.document_count.tolist()   # (3 - 1) text labels + 1 action, then (2 - 1) + 1
    [3, 2]

:func:`split_documents` and :func:`rebatch` re-pack a batch's documents (one per row, other rows, more padding)
from its ids and payloads, the references of the equivalence tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mmfeed.loaders.layout import FRAMES_PREFIX, TokenLayout
from mmfeed.packing import PackedBatch

__all__ = ["PackedLoss", "TinyModelConfig", "TinyWorldModel", "rebatch", "split_documents", "text_targets",
           "tokens_per_item"]

ATTENTIONS = ("sdpa", "flex")


@dataclass(frozen=True, kw_only=True)
class TinyModelConfig:
    """Sizes of :class:`TinyWorldModel`.

    layout: the token layout the batches were packed with (tokens per frame of each camera, per proprio and
        action step); the model makes exactly that many tokens of each item.
    proprio_dim, action_dim: lengths of the proprio and action vectors.
    vocab_size: text ids are in ``[0, vocab_size)`` (256 for mmfeed's default UTF-8 byte tokenizer).
    width, depth, heads: transformer width, number of blocks, attention heads (``width % heads == 0``).
    max_positions: the largest ``position_ids`` value + 1 (the longest document).
    patch_pixels: side of the average-pooled pixel square each frame patch is embedded from.
    """

    layout: TokenLayout
    proprio_dim: int = 14
    action_dim: int = 14
    vocab_size: int = 256
    width: int = 32
    depth: int = 2
    heads: int = 2
    max_positions: int = 4096
    patch_pixels: int = 4

    def __post_init__(self) -> None:
        if not isinstance(self.layout, TokenLayout):
            raise TypeError(f"layout must be an mmfeed.loaders.TokenLayout, got {type(self.layout).__name__}")
        if self.layout.tokens_per_text_token != 1:
            raise ValueError(f"TinyWorldModel embeds one token per text id; got a layout with "
                             f"tokens_per_text_token={self.layout.tokens_per_text_token} (use 1)")
        for name in ("proprio_dim", "action_dim", "vocab_size", "width", "depth", "heads", "max_positions",
                     "patch_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyModelConfig.{name} must be an int >= 1, got {value!r}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of heads {self.heads}")


@dataclass(frozen=True, eq=False)
class PackedLoss:
    """The loss of one batch and its parts, per document.

    loss: scalar, ``document_sum.sum() / document_count.sum()`` (0 when the batch has no label).
    document_sum: ``[n_docs]`` summed loss terms of each document (text cross-entropy + action squared error).
    document_count: int64 ``[n_docs]`` label terms of each document (text labels + real action steps).
    text_sum, text_count, action_sum, action_count: the two kinds of terms over the whole batch.
    """

    loss: torch.Tensor
    document_sum: torch.Tensor
    document_count: torch.Tensor
    text_sum: torch.Tensor
    text_count: torch.Tensor
    action_sum: torch.Tensor
    action_count: torch.Tensor


def tokens_per_item(layout: TokenLayout, modality: str) -> int:
    """Token slots one payload item of ``modality`` fills (a frame, a proprio or action vector, a text id)."""
    if modality == "text":
        return layout.tokens_per_text_token
    return layout.key_tokens(modality)


def _grid(tokens: int) -> tuple[int, int]:
    """The most nearly square ``(rows, cols)`` with ``rows * cols == tokens``."""
    rows = max(d for d in range(1, math.isqrt(tokens) + 1) if tokens % d == 0)
    return rows, tokens // rows


def _slots(batch: PackedBatch, modality: int, per_item: int, name: str) -> torch.Tensor:
    """Flat (row-major) indices of the token slots of one modality; their count must be whole items."""
    slots = torch.nonzero(batch.modality_ids.reshape(-1) == modality).squeeze(1)
    if slots.numel() % per_item:
        raise ValueError(f"modality {name!r} fills {slots.numel()} token slots, not a multiple of its "
                         f"{per_item} tokens per item: was the batch packed with this layout?")
    return slots


def _payload(batch: PackedBatch, name: str, items: int) -> torch.Tensor:
    value = batch.data.get(name)
    if value is None:
        raise ValueError(f"batch has {items} items of modality {name!r} but no data[{name!r}]")
    if value.shape[0] < items:
        raise ValueError(f"data[{name!r}] holds {value.shape[0]} items but the batch's tokens need {items}")
    return value[:items]  # static-shape batches pad the payload at the end


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, attend: Callable) -> torch.Tensor:
        r, c, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(r, c, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = attend(q, k, v).transpose(1, 2).reshape(r, c, d)
        x = x + self.out(a)
        return x + self.mlp(self.norm2(x))


class TinyWorldModel(nn.Module):
    """A few pre-norm transformer blocks over a packed robot batch (see the module docstring).

    flex_attention: the FlexAttention function used with ``attention="flex"`` (default torch's
        ``flex_attention``; pass ``torch.compile(flex_attention)`` on a GPU).
    """

    def __init__(self, config: TinyModelConfig, *, flex_attention: Callable | None = None) -> None:
        super().__init__()
        self.config = config
        layout, width = config.layout, config.width
        self._flex = flex_attention
        self.text_embed = nn.Embedding(config.vocab_size, width)
        p = config.patch_pixels
        self.patch_embed = nn.ModuleDict({c: nn.Linear(3 * p * p, width) for c in layout.cameras})
        self.proprio_embed = nn.Linear(config.proprio_dim, layout.tokens_per_proprio_step * width)
        ka = layout.tokens_per_action_step
        self.action_query = nn.Parameter(torch.randn(ka * width) * 0.02)
        self.action_embed = nn.Linear(config.action_dim, ka * width)
        self.position_embed = nn.Embedding(config.max_positions, width)
        self.modality_embed = nn.Embedding(len(layout.modalities()) + 1, width)  # + 1: padding (id -1)
        self.blocks = nn.ModuleList(_Block(width, config.heads) for _ in range(config.depth))
        self.norm = nn.LayerNorm(width)
        self.text_head = nn.Linear(width, config.vocab_size)
        self.action_head = nn.Linear(ka * width, config.action_dim)

    # -- embedding ------------------------------------------------------------------------------------------
    def _embed_items(self, name: str, items: torch.Tensor, item_docs: torch.Tensor) -> torch.Tensor:
        """``[n_items, tokens_per_item * width]`` embeddings of one modality's payload items."""
        dtype = self.position_embed.weight.dtype
        if name == "text":
            return self.text_embed(items.long())
        if name.startswith(FRAMES_PREFIX):
            camera = name[len(FRAMES_PREFIX):]
            gh, gw = _grid(self.config.layout.tokens_per_frame[camera])
            p = self.config.patch_pixels
            x = items.to(dtype).permute(0, 3, 1, 2) / 255.0 - 0.5                       # [n, 3, H, W]
            x = F.adaptive_avg_pool2d(x, (gh * p, gw * p)).view(-1, 3, gh, p, gw, p)
            x = x.permute(0, 2, 4, 1, 3, 5).reshape(x.shape[0], gh * gw, 3 * p * p)    # patches in raster order
            return self.patch_embed[camera](x).flatten(1)
        if name == "proprio":
            return self.proprio_embed(items.to(dtype))
        if name == "action":
            out = self.action_query.expand(items.shape[0], -1)
            if self.config.layout.causal_actions:  # teacher forcing: the previous action of the same document
                prev = torch.cat([torch.zeros_like(items[:1]), items[:-1]]).to(dtype)
                same = torch.cat([item_docs.new_zeros(1, dtype=torch.bool), item_docs[1:] == item_docs[:-1]])
                out = out + self.action_embed(prev) * same[:, None].to(dtype)
            return out
        raise ValueError(f"TinyWorldModel cannot embed modality {name!r}; it knows text, frames.<camera>, "
                         "proprio and action")

    def embed(self, batch: PackedBatch) -> torch.Tensor:
        """Token embeddings ``[R, C, width]``: each modality's items scattered into its slots, plus position
        and modality embeddings (padding slots carry only those)."""
        if batch.max_seqlen > self.config.max_positions:
            raise ValueError(f"a document of {batch.max_seqlen} tokens exceeds max_positions="
                             f"{self.config.max_positions}; raise TinyModelConfig.max_positions")
        r, c, width = batch.num_rows, batch.capacity, self.config.width
        weight = self.position_embed.weight
        x = torch.zeros(r * c, width, dtype=weight.dtype, device=weight.device)
        docs = batch.document_ids.reshape(-1)
        for m, name in enumerate(batch.modalities):
            k = tokens_per_item(self.config.layout, name)
            slots = _slots(batch, m, k, name)
            n = slots.numel() // k
            if n == 0:
                continue
            items = _payload(batch, name, n)
            emb = self._embed_items(name, items, docs[slots[::k]])
            x = x.index_copy(0, slots, emb.reshape(n * k, width))
        x = x.view(r, c, width)
        return x + self.position_embed(batch.position_ids) + self.modality_embed(self._modality_index(batch))

    def _modality_index(self, batch: PackedBatch) -> torch.Tensor:
        """Each slot's modality as an index of the layout's modalities, + 1 (0 is padding), so that a modality
        means the same embedding whatever subset of modalities a batch lists."""
        names = self.config.layout.modalities()
        unknown = [m for m in batch.modalities if m not in names]
        if unknown:
            raise ValueError(f"batch modalities {unknown} are not in the model's layout {names}")
        table = torch.tensor([0] + [names.index(m) + 1 for m in batch.modalities], device=batch.device)
        return table[batch.modality_ids.long() + 1]

    # -- transformer ----------------------------------------------------------------------------------------
    def forward(self, batch: PackedBatch, *, attention: str = "sdpa", mask: Any = None) -> torch.Tensor:
        """Hidden states ``[R, C, width]``.

        attention: ``"sdpa"`` (dense ``batch.attention_mask()``) or ``"flex"`` (``batch.block_mask()``);
        mask: a prebuilt mask of that kind, to reuse one across calls.
        """
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}; choose one of {list(ATTENTIONS)}")
        if attention == "sdpa":
            dense = batch.attention_mask() if mask is None else mask

            def attend(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
        else:
            block = batch.block_mask() if mask is None else mask
            flex = self._flex
            if flex is None:
                from torch.nn.attention.flex_attention import flex_attention as flex

            def attend(q, k, v):
                return flex(q, k, v, block_mask=block)
        x = self.embed(batch)
        for blk in self.blocks:
            x = blk(x, attend)
        return self.norm(x)

    def loss(self, batch: PackedBatch, *, attention: str = "sdpa", mask: Any = None) -> PackedLoss:
        """Next-token text loss and action regression, summed per document and divided by the label count."""
        h = self(batch, attention=attention, mask=mask)
        width, dtype = self.config.width, h.dtype
        flat = h.reshape(-1, width)
        docs = batch.document_ids.reshape(-1).long()
        n_docs = batch.num_documents
        zero = flat.new_zeros(())
        terms, owners = [], []
        # text: position i predicts the id at i + 1 when both are text of the same document
        text_sum, text_count = zero, torch.zeros((), dtype=torch.int64, device=h.device)
        if "text" in batch.modalities:
            valid, target = text_targets(batch)
            where = torch.nonzero(valid.reshape(-1)).squeeze(1)
            ce = F.cross_entropy(self.text_head(flat[where]), target.reshape(-1)[where], reduction="none")
            terms.append(ce), owners.append(docs[where])
            text_sum, text_count = ce.sum(), torch.tensor(where.numel(), device=h.device)
        action_sum, action_count = zero, torch.zeros((), dtype=torch.int64, device=h.device)
        if "action" in batch.modalities:
            k = self.config.layout.tokens_per_action_step
            slots = _slots(batch, batch.modalities.index("action"), k, "action")
            n = slots.numel() // k
            if n:
                target = _payload(batch, "action", n).to(dtype)
                pred = self.action_head(flat[slots].reshape(n, k * width))
                err = ((pred - target) ** 2).mean(dim=1)
                real = torch.ones(n, dtype=torch.bool, device=h.device)
                if "action_is_pad" in batch.data:
                    real = ~_payload(batch, "action_is_pad", n).bool()
                keep = torch.nonzero(real).squeeze(1)
                terms.append(err[keep]), owners.append(docs[slots[::k]][keep])
                action_sum, action_count = err[keep].sum(), torch.tensor(keep.numel(), device=h.device)
        values = torch.cat(terms) if terms else flat.new_zeros(0)
        owner = torch.cat(owners) if owners else docs.new_zeros(0)
        document_sum = flat.new_zeros(n_docs).index_add(0, owner, values)
        document_count = torch.zeros(n_docs, dtype=torch.int64, device=h.device).index_add(
            0, owner, torch.ones_like(owner))
        loss = document_sum.sum() / document_count.sum().clamp(min=1).to(dtype)
        return PackedLoss(loss, document_sum, document_count, text_sum, text_count, action_sum, action_count)


def text_targets(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token labels: ``valid`` bool ``[R, C]`` (the slot is text and so is the next slot of its document)
    and ``target`` int64 ``[R, C]`` (the next text id; 0 where not valid). A label never crosses a document or
    row boundary and padding has none."""
    r, c = batch.num_rows, batch.capacity
    text = batch.modality_ids == batch.modalities.index("text")
    ids = torch.zeros(r * c, dtype=torch.int64, device=batch.device)
    slots = torch.nonzero(text.reshape(-1)).squeeze(1)
    if slots.numel():
        ids[slots] = _payload(batch, "text", slots.numel()).long()
    ids = ids.view(r, c)
    doc = batch.document_ids
    valid = torch.zeros(r, c, dtype=torch.bool, device=batch.device)
    valid[:, :-1] = text[:, :-1] & text[:, 1:] & (doc[:, :-1] == doc[:, 1:]) & (doc[:, :-1] >= 0)
    target = torch.zeros_like(ids)
    target[:, :-1] = ids[:, 1:]
    return valid, target * valid


def _runs(values: np.ndarray) -> list[tuple[int, int]]:
    """``(value, run length)`` of consecutive equal values."""
    if not len(values):
        return []
    cut = np.flatnonzero(np.diff(values)) + 1
    starts = np.concatenate([[0], cut])
    ends = np.concatenate([cut, [len(values)]])
    return [(int(values[s]), int(e - s)) for s, e in zip(starts, ends)]


def rebatch(batch: PackedBatch, layout: TokenLayout, rows: Sequence[Sequence[int]], capacity: int) -> PackedBatch:
    """The documents of ``batch`` re-packed: ``rows[r]`` lists the (old) document indices of new row r, in order.

    Each document keeps its tokens, modality runs, attention steps and payload items; its ids are recomputed
    by :meth:`PackedBatch.from_segments`. Per-document metadata tensors (``sample``, ``episode``, ...) follow
    their documents. ``layout`` gives the tokens per payload item of each modality.
    """
    doc = batch.document_ids.cpu().numpy().reshape(-1)
    mod = batch.modality_ids.cpu().numpy().reshape(-1)
    step = batch.step_ids.cpu().numpy().reshape(-1)
    n_docs = batch.num_documents
    per_item = [tokens_per_item(layout, m) for m in batch.modalities]
    where = [np.flatnonzero(doc == d) for d in range(n_docs)]  # a document's slots are contiguous in one row
    counts = np.array([[np.count_nonzero(mod[w] == m) // per_item[m] for m in range(len(per_item))]
                       for w in where], dtype=np.int64).reshape(n_docs, len(per_item))
    first = np.cumsum(counts, axis=0) - counts  # [n_docs, n_modalities]: first payload item of each document
    keys: dict[str, int] = {}
    for key in batch.data:
        base = key[: -len("_is_pad")] if key.endswith("_is_pad") else key
        if base not in batch.modalities:
            raise ValueError(f"rebatch cannot tell which documents data[{key!r}] belongs to: it names no modality "
                             f"of {batch.modalities}")
        keys[key] = batch.modalities.index(base)
    order = [int(d) for row in rows for d in row]
    if sorted(set(order)) != sorted(order) or any(not 0 <= d < n_docs for d in order):
        raise ValueError(f"rows must list distinct document indices in [0, {n_docs}), got {rows!r}")
    data = {}
    for key, m in keys.items():
        value = batch.data[key]
        parts = [value[first[d, m] : first[d, m] + counts[d, m]] for d in order]
        data[key] = torch.cat(parts) if parts else value[:0]
    index = torch.as_tensor(order, dtype=torch.int64)
    metadata = {k: (v[index.to(v.device)] if isinstance(v, torch.Tensor) and v.ndim and v.shape[0] == n_docs
                    else v) for k, v in batch.metadata.items()}
    lengths = [[len(where[d]) for d in row] for row in rows]
    steps = [[[n for _, n in _runs(step[where[d]])] for d in row] for row in rows]
    segments = [[_runs(mod[where[d]]) for d in row] for row in rows]
    out = PackedBatch.from_segments(lengths, capacity, step_sizes=steps, segments=segments,
                                    modalities=batch.modalities, data=data, metadata=metadata)
    return out if batch.device.type == "cpu" else out.to(batch.device)  # ids are built on the host


def split_documents(batch: PackedBatch, layout: TokenLayout) -> list[PackedBatch]:
    """One batch per document of ``batch``, each a single row of exactly the document's length: the unpacked
    reference a packed computation must reproduce."""
    sizes = torch.diff(batch.cu_seqlens.cpu()).tolist()
    return [rebatch(batch, layout, [[d]], int(n)) for d, n in enumerate(sizes)]
