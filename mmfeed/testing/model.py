"""A tiny block-causal transformer over :class:`~mmfeed.packing.PackedBatch`, for examples and correctness tests.

It embeds every feature a packed batch carries, by the dataset's own feature names, and trains on it, so that the
examples show a complete loop and the tests can check end to end that packing changes nothing a model computes:

- video features (uint8 ``[n, H, W, 3]`` payloads, or yuv420 planes ``[n, H * 3 // 2, W]``, converted to RGB on
  the batch's device first) become ``layout.tokens(feature)`` patch tokens per frame: the
  frame is average-pooled to the most nearly square grid of that many ``patch_pixels``-square patches, each
  through a linear patch embedding (one per feature);
- array features (a vector or scalar per step) become ``layout.tokens(feature)`` tokens per step through a linear
  map (one per feature) of the flattened step;
- chunk features (``layout.chunk_features``, the ones a policy predicts, e.g. ``action``) are never fed: each of
  their tokens' input is a learned query per feature, plus the previous item of the same feature and document
  when the layout has ``causal_chunk`` (teacher forcing: with one attention step per chunk frame the next one is
  never visible); a regression head per feature predicts each item from its tokens;
- text ids go through an embedding table.

The per-item embeddings are written into the ``[R, C]`` token slots of their feature in row-major order: the
payload of every feature is flat over the batch in token order (see :mod:`mmfeed.loaders.planned.collate`), so the k-th
item fills the k-th group of slots whose ``modality_ids`` name that feature. Positions come from
``position_ids``; a modality embedding over ``["text", *config.features]`` tells features apart whatever subset a
batch lists; attention is SDPA with ``attention_mask()`` or FlexAttention with ``block_mask()``.

The loss (:meth:`TinyWorldModel.loss`) sums, per document, next-token cross-entropy on text (labels never cross
a document boundary) and the mean squared error of each chunk item regressed from its tokens (items flagged in
``<feature>_is_pad`` left out), and divides by the number of those real label terms, never by padding::

    >>> import torch
    >>> from mmfeed import PackedBatch
    >>> from mmfeed.loaders import TokenLayout
    >>> b = PackedBatch.from_segments([[4, 3]], 8, segments=[[[(0, 3), (1, 1)], [(0, 2), (1, 1)]]],
    ...                               modalities=["text", "action"], step_sizes=[[[1, 1, 1, 1], [1, 1, 1]]],
    ...                               data={"text": torch.tensor([5, 6, 7, 8, 9]), "action": torch.zeros(2, 3),
    ...                                     "action_is_pad": torch.tensor([False, False])})
    >>> model = TinyWorldModel(TinyModelConfig(layout=TokenLayout(), features={"action": (3,)}))
    >>> out = model.loss(b)  # labels: (3 - 1) text + 1 action, then (2 - 1) + 1
    >>> out.document_count.tolist(), out.chunk_count["action"].item()
    ([3, 2], 2)

:func:`model_features` gives ``TinyModelConfig.features`` from a source's features::

    >>> import numpy as np
    >>> from mmfeed.loaders.sources.arrays import ArraySource
    >>> model_features(ArraySource([{"observation.images.cam": np.zeros((4, 8, 8, 3), np.uint8),
    ...                              "observation.state": np.zeros((4, 2), np.float32), "next.reward": np.zeros(4)}]))
    {'observation.images.cam': (8, 8, 3), 'observation.state': (2,), 'next.reward': ()}

:func:`split_documents` and :func:`rebatch` re-pack a batch's documents (one per row, other rows, more padding)
from its ids and payloads, the references of the equivalence tests.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mmfeed.packing import PackedBatch
from mmfeed.packing.layout import TEXT, TokenLayout

__all__ = ["PackedLoss", "TinyModelConfig", "TinyWorldModel", "is_video_shape", "model_features", "rebatch",
           "split_documents", "text_targets", "tokens_per_item"]

ATTENTIONS = ("sdpa", "flex")


def is_video_shape(shape: Sequence[int]) -> bool:
    """Whether a step shape is a video frame's, ``(H, W, 3)``: how :class:`TinyWorldModel` tells video features
    (patch embedding) from array features (linear map)."""
    return len(shape) == 3 and shape[-1] == 3


def model_features(source: Any, names: Sequence[str] | None = None) -> dict[str, tuple[int, ...]]:
    """``TinyModelConfig.features`` of a source (or of a mapping of :class:`~mmfeed.loaders.Feature`): feature
    -> step shape of its video and array features, in the source's order (only ``names``, in that order, if
    given). Text features are left out: task text reaches the model as ``data["text"]``."""
    features = getattr(source, "features", source)
    names = [n for n, f in features.items() if f.kind != "text"] if names is None else list(names)
    for name in names:
        if name not in features:
            raise KeyError(f"no feature {name!r}; the source has {sorted(features)}")
        if features[name].kind == "text":
            raise ValueError(f"feature {name!r} is text; the model embeds task text as data['text']")
    # a yuv420 video feature is embedded as the RGB frames its planes convert to (on the batch's device)
    return {name: (*features[name].frame_size, 3) if getattr(features[name], "frame_format", None) == "yuv420"
            else tuple(features[name].shape) for name in names}


@dataclass(frozen=True, kw_only=True)
class TinyModelConfig:
    """Sizes of :class:`TinyWorldModel`.

    layout: the token layout the batches were packed with (tokens per frame of each feature, which features are
        the chunk and whether it is causal); the model makes exactly that many tokens of each item.
    features: feature -> step shape of every non-text feature the model embeds, e.g.
        ``{"observation.images.cam_high": (48, 64, 3), "observation.state": (14,), "action": (14,)}`` (a scalar
        feature has shape ``()``; a shape ``(H, W, 3)`` is a video feature); :func:`model_features` builds it
        from a source. Chunk features (``layout.chunk_features``) among them are regressed, never fed.
    vocab_size: text ids are in ``[0, vocab_size)`` (256 for mmfeed's default UTF-8 byte tokenizer).
    width, depth, heads: transformer width, number of blocks, attention heads (``width % heads == 0``).
    max_positions: the largest ``position_ids`` value + 1 (the longest document).
    patch_pixels: side of the average-pooled pixel square each frame patch is embedded from.
    """

    layout: TokenLayout
    features: Mapping[str, tuple[int, ...]]
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
        if not isinstance(self.features, Mapping):
            raise TypeError(f"features must map feature name -> step shape, got {type(self.features).__name__}")
        clean = {}
        for name, shape in self.features.items():
            if not isinstance(name, str) or not name or name == TEXT:
                raise ValueError(f"feature names must be non-empty strings other than {TEXT!r}, got {name!r}")
            if not isinstance(shape, (tuple, list)) or not all(
                    isinstance(s, (int, np.integer)) and not isinstance(s, bool) and s >= 1 for s in shape):
                raise ValueError(f"features[{name!r}] must be a step shape (a tuple of ints >= 1; () for a scalar), "
                                 f"got {shape!r}")
            clean[name] = tuple(int(s) for s in shape)
            if name in self.layout.chunk_features and is_video_shape(clean[name]):
                raise ValueError(f"chunk feature {name!r} is a video; TinyWorldModel regresses array chunks only")
        object.__setattr__(self, "features", clean)
        for name in ("vocab_size", "width", "depth", "heads", "max_positions", "patch_pixels"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TinyModelConfig.{name} must be an int >= 1, got {value!r}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of heads {self.heads}")

    @property
    def modalities(self) -> list[str]:
        """The modality names the model knows: ``["text", *features]``."""
        return [TEXT, *self.features]


@dataclass(frozen=True, eq=False)
class PackedLoss:
    """The loss of one batch and its parts, per document.

    loss: scalar, ``document_sum.sum() / document_count.sum()`` (0 when the batch has no label).
    document_sum: ``[n_docs]`` summed loss terms of each document (text cross-entropy + chunk squared errors).
    document_count: int64 ``[n_docs]`` label terms of each document (text labels + real chunk items).
    text_sum, text_count: the text terms over the whole batch.
    chunk_sum, chunk_count: chunk feature -> its terms over the whole batch (every chunk feature the model
        knows, 0 where the batch has none).
    """

    loss: torch.Tensor
    document_sum: torch.Tensor
    document_count: torch.Tensor
    text_sum: torch.Tensor
    text_count: torch.Tensor
    chunk_sum: dict[str, torch.Tensor]
    chunk_count: dict[str, torch.Tensor]


def tokens_per_item(layout: TokenLayout, modality: str) -> int:
    """Token slots one payload item of ``modality`` fills (a frame or step of a feature, a text id)."""
    return layout.tokens_per_text_token if modality == TEXT else layout.tokens(modality)


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
    """A few pre-norm transformer blocks over a packed batch of any features (see the module docstring).

    flex_attention: the FlexAttention function used with ``attention="flex"`` (default torch's
        ``flex_attention``; pass ``torch.compile(flex_attention)`` on a GPU).

    Per-feature modules are keyed ``f0, f1, ...`` in ``config.features`` order (module names hold no dots):
    ``embed_in`` (patch or linear embedding; a chunk feature's teacher-forcing input), ``chunk_query``, ``chunk_head``.
    """

    def __init__(self, config: TinyModelConfig, *, flex_attention: Callable | None = None) -> None:
        super().__init__()
        self.config = config
        layout, width, p = config.layout, config.width, config.patch_pixels
        self._flex = flex_attention
        self._key = {name: f"f{i}" for i, name in enumerate(config.features)}
        self.chunk_features = [f for f in config.features if f in layout.chunk_features]
        self.text_embed = nn.Embedding(config.vocab_size, width)
        self.embed_in, self.chunk_head = nn.ModuleDict(), nn.ModuleDict()
        self.chunk_query = nn.ParameterDict()
        for name, shape in config.features.items():
            key, k, numel = self._key[name], layout.tokens(name), math.prod(shape)
            if name in layout.chunk_features:
                self.chunk_query[key] = nn.Parameter(torch.randn(k * width) * 0.02)
                self.chunk_head[key] = nn.Linear(k * width, numel)
                if layout.causal_chunk:
                    self.embed_in[key] = nn.Linear(numel, k * width)
            elif is_video_shape(shape):
                self.embed_in[key] = nn.Linear(3 * p * p, width)
            else:
                self.embed_in[key] = nn.Linear(numel, k * width)
        self.position_embed = nn.Embedding(config.max_positions, width)
        self.modality_embed = nn.Embedding(len(config.modalities) + 1, width)  # + 1: padding (id -1)
        self.blocks = nn.ModuleList(_Block(width, config.heads) for _ in range(config.depth))
        self.norm = nn.LayerNorm(width)
        self.text_head = nn.Linear(width, config.vocab_size)

    # -- embedding ------------------------------------------------------------------------------------------
    def _embed_items(self, name: str, items: torch.Tensor, item_docs: torch.Tensor) -> torch.Tensor:
        """``[n_items, tokens_per_item * width]`` embeddings of one modality's payload items."""
        dtype = self.position_embed.weight.dtype
        if name == TEXT:
            return self.text_embed(items.long())
        if name not in self._key:
            raise ValueError(f"TinyWorldModel cannot embed feature {name!r}: TinyModelConfig.features lists "
                             f"{list(self.config.features)}")
        key, n = self._key[name], items.shape[0]
        if name in self.config.layout.chunk_features:
            out = self.chunk_query[key].expand(n, -1)
            if self.config.layout.causal_chunk:  # teacher forcing: the previous item of the same document
                flat = items.reshape(n, -1).to(dtype)
                prev = torch.cat([torch.zeros_like(flat[:1]), flat[:-1]])
                same = torch.cat([item_docs.new_zeros(1, dtype=torch.bool), item_docs[1:] == item_docs[:-1]])
                out = out + self.embed_in[key](prev) * same[:, None].to(dtype)
            return out
        if is_video_shape(self.config.features[name]):
            h, w, _ = self.config.features[name]
            if items.dim() == 3 and tuple(items.shape[1:]) == (h * 3 // 2, w):  # yuv420 planes: to RGB here
                from mmfeed.codecs.colour import yuv420_to_rgb_torch

                items = yuv420_to_rgb_torch(items)
            if items.dim() != 4 or items.shape[-1] != 3:
                raise ValueError(f"video feature {name!r} needs uint8 [n, H, W, 3] frames, got {list(items.shape)}")
            gh, gw = _grid(self.config.layout.tokens(name))
            p = self.config.patch_pixels
            x = items.to(dtype).permute(0, 3, 1, 2) / 255.0 - 0.5                       # [n, 3, H, W]
            x = F.adaptive_avg_pool2d(x, (gh * p, gw * p)).view(-1, 3, gh, p, gw, p)
            x = x.permute(0, 2, 4, 1, 3, 5).reshape(n, gh * gw, 3 * p * p)              # patches in raster order
            return self.embed_in[key](x).flatten(1)
        return self.embed_in[key](items.reshape(n, -1).to(dtype))

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
        index = self._modality_index(batch)  # checks the names first
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
        return x + self.position_embed(batch.position_ids) + self.modality_embed(index)

    def _modality_index(self, batch: PackedBatch) -> torch.Tensor:
        """Each slot's modality as an index of the model's modalities, + 1 (0 is padding), so that a feature
        means the same embedding whatever subset of features a batch lists."""
        names = self.config.modalities
        unknown = [m for m in batch.modalities if m not in names]
        if unknown:
            raise ValueError(f"batch modalities {unknown} are not among the model's {names}; add them to "
                             "TinyModelConfig.features (see model_features)")
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
        """Next-token text loss and chunk regression, summed per document and divided by the label count."""
        h = self(batch, attention=attention, mask=mask)
        width, dtype = self.config.width, h.dtype
        flat = h.reshape(-1, width)
        docs = batch.document_ids.reshape(-1).long()
        zero, none = flat.new_zeros(()), torch.zeros((), dtype=torch.int64, device=h.device)
        terms, owners, text_sum, text_count = [], [], zero, none
        if TEXT in batch.modalities:  # position i predicts the id at i + 1 when both are text of one document
            valid, target = text_targets(batch)
            where = torch.nonzero(valid.reshape(-1)).squeeze(1)
            ce = F.cross_entropy(self.text_head(flat[where]), target.reshape(-1)[where], reduction="none")
            terms.append(ce), owners.append(docs[where])
            text_sum, text_count = ce.sum(), torch.tensor(where.numel(), device=h.device)
        chunk_sum, chunk_count = {f: zero for f in self.chunk_features}, {f: none for f in self.chunk_features}
        for name in self.chunk_features:
            if name not in batch.modalities:
                continue
            k = self.config.layout.tokens(name)
            slots = _slots(batch, batch.modalities.index(name), k, name)
            n = slots.numel() // k
            if not n:
                continue
            target = _payload(batch, name, n).reshape(n, -1).to(dtype)
            pred = self.chunk_head[self._key[name]](flat[slots].reshape(n, k * width))
            err = ((pred - target) ** 2).mean(dim=1)
            pad = batch.data.get(f"{name}_is_pad")
            real = torch.ones(n, dtype=torch.bool, device=h.device) if pad is None else ~pad[:n].bool()
            keep = torch.nonzero(real).squeeze(1)
            terms.append(err[keep]), owners.append(docs[slots[::k]][keep])
            chunk_sum[name], chunk_count[name] = err[keep].sum(), torch.tensor(keep.numel(), device=h.device)
        values = torch.cat(terms) if terms else flat.new_zeros(0)
        owner = torch.cat(owners) if owners else docs.new_zeros(0)
        document_sum = flat.new_zeros(batch.num_documents).index_add(0, owner, values)
        document_count = torch.zeros(batch.num_documents, dtype=torch.int64, device=h.device).index_add(
            0, owner, torch.ones_like(owner))
        loss = document_sum.sum() / document_count.sum().clamp(min=1).to(dtype)
        return PackedLoss(loss, document_sum, document_count, text_sum, text_count, chunk_sum, chunk_count)


def text_targets(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token labels: ``valid`` bool ``[R, C]`` (the slot is text and so is the next slot of its document)
    and ``target`` int64 ``[R, C]`` (the next text id; 0 where not valid). A label never crosses a document or
    row boundary and padding has none."""
    r, c = batch.num_rows, batch.capacity
    text = batch.modality_ids == batch.modalities.index(TEXT)
    ids = torch.zeros(r * c, dtype=torch.int64, device=batch.device)
    slots = torch.nonzero(text.reshape(-1)).squeeze(1)
    if slots.numel():
        ids[slots] = _payload(batch, TEXT, slots.numel()).long()
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
