"""PackedBatch: packed rows of documents as tensors, with their attention masks.

The only module of :mod:`mmfeed.packing` that imports torch. The ids come from the numba kernels of
:mod:`mmfeed.packing.metadata`; this module wraps them as CPU tensors (sharing memory with the numpy arrays),
builds the dense mask and the FlexAttention ``BlockMask`` and moves everything to a device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask

from mmfeed.packing.metadata import Layout, Metadata, block_tables, document_metadata, layout_from_rows, \
    transpose_tables

__all__ = ["PackedBatch"]


@dataclass(frozen=True, eq=False)
class _Host:
    """Host (numpy) views of the ids that block tables are computed from, taken when a CPU batch is moved, so
    that ``block_mask()`` on a device batch never waits for the device."""

    document_ids: np.ndarray
    step_ids: np.ndarray


def _as_tensor(key: str, value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    raise TypeError(f"data[{key!r}] must be a torch.Tensor or numpy array, got {type(value).__name__}")


def map_tensors(value: Any, fn: Callable[[Any], Any], kind: type | tuple[type, ...] = torch.Tensor) -> Any:
    """``value`` with ``fn(x)`` in place of each ``x`` of type ``kind`` (a tensor), itself or in nested dicts."""
    if isinstance(value, kind):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn, kind) for k, v in value.items()}
    return value


BY_VALUE_BYTES = 1 << 20  # CPU tensors up to this size are pickled with the batch, larger ones by torch


@dataclass(frozen=True)
class _Value:
    """A small CPU tensor pickled by value, as the numpy array it is rebuilt from (without a copy)."""

    array: np.ndarray

    def __reduce__(self) -> tuple:  # the array alone (a dataclass's default pickles its field dict too)
        return _Value, (self.array,)


def small_array(tensor: torch.Tensor) -> np.ndarray | None:
    """The numpy array (a view) a small CPU tensor is pickled as, by value; None for a tensor torch pickles itself
    (over ``BY_VALUE_BYTES``, needing grad, in shared memory already, or of a dtype numpy lacks: bfloat16)."""
    if tensor.device.type == "cpu" and tensor.numel() * tensor.element_size() <= BY_VALUE_BYTES \
            and not tensor.requires_grad and not tensor.untyped_storage().is_shared():
        try:
            return tensor.numpy()
        except TypeError:
            return None
    return None


def _by_value(tensor: torch.Tensor) -> torch.Tensor | _Value:
    """A small CPU tensor as a :class:`_Value`; any other tensor as it is (for torch to pickle)."""
    array = small_array(tensor)
    return tensor if array is None else _Value(array)


def _from_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _from_value(v) for k, v in value.items()}
    if isinstance(value, _Value):
        return torch.from_numpy(value.array)
    return value


def _checked_inputs(modalities: Sequence[str] | None, data: object, metadata: object) -> list[str]:
    """The modality names (default ``["text"]``) after checking them, ``data`` and ``metadata``."""
    names = ["text"] if modalities is None else list(modalities)
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"modalities must be distinct strings (at least one), got {names!r}")
    if len(names) > 127:
        raise ValueError(f"at most 127 modalities fit int8 modality ids, got {len(names)}")
    if data is not None and not isinstance(data, Mapping):
        raise TypeError(f"data must be a dict of tensors, got {type(data).__name__}")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    return names


@dataclass(frozen=True, eq=False)
class PackedBatch:
    """Rows of ``capacity`` token slots holding whole documents back to back, then padding.

    Build it with :meth:`from_lengths` (metadata only) or :meth:`from_segments` (modalities and payloads).

    Attributes:
        document_ids: int32 ``[R, C]``, -1 on padding; documents numbered 0, 1, 2, ... row by row.
        position_ids: int64 ``[R, C]``, 0 at each document start, counting up; 0 on padding.
        step_ids: int32 ``[R, C]``, attention time index within the document; -1 on padding.
        modality_ids: int8 ``[R, C]``, index into ``modalities``; -1 on padding.
        modalities: names of the modalities: ``"text"`` and feature names, e.g.
            ``["text", "observation.images.cam_high", "observation.state", "action"]``.
        cu_seqlens: int32 ``[n_docs + 1]``, document boundaries with padding removed (flash-attention varlen).
        max_seqlen: longest document (Python int, known without a device sync); 0 when there is none.
        data: each modality's payload, flat over the batch, in the order its tokens appear.
        metadata: free-form information about the batch (sample keys, episode ids); tensors in it move with
            :meth:`to` like ``data``.

    Attention rule (``attention_mask``, ``block_mask``): query q may attend key k iff both belong to the same
    document and ``step[k] <= step[q]``; a padding token attends only to itself.

    >>> b = PackedBatch.from_lengths([[5, 3], [7]], capacity=8)
    >>> b.cu_seqlens.tolist(), b.max_seqlen
    ([0, 5, 8, 15], 7)
    """

    document_ids: torch.Tensor
    position_ids: torch.Tensor
    step_ids: torch.Tensor
    modality_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    modalities: list[str]
    data: dict[str, torch.Tensor] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    _host: _Host | None = field(default=None, repr=False)
    _documents: int | None = field(default=None, repr=False)  # the real count once cu_seqlens is padded

    @classmethod
    def from_lengths(cls, rows: Sequence[Sequence[int]], capacity: int, *,
                     step_sizes: Sequence[Sequence[Sequence[int] | None]] | None = None) -> PackedBatch:
        """Metadata of packed rows given their document lengths (no payloads; every token modality "text").

        Args:
            rows: ``rows[r]`` the lengths of the documents in row r, in order; a row may be empty.
            capacity: tokens per row (rows are padded up to it).
            step_sizes: ``step_sizes[r][d]`` tokens per attention step of that document, summing to its length
                (``[1] * n`` token-causal, ``[256] * frames`` block-causal video, ``[n]`` bidirectional); None
                means one token per step (for the whole batch or for a single document).

        Raises ValueError naming the row, document and value for a row longer than ``capacity``, a length or
        step size < 1, step sizes not summing to the document length, or ``capacity < 1``.

        >>> PackedBatch.from_lengths([[2, 1]], 4, step_sizes=[[[2], None]]).step_ids.tolist()
        [[0, 0, 0, -1]]
        """
        return cls.from_segments(rows, capacity, step_sizes=step_sizes)

    @classmethod
    def from_segments(cls, rows: Sequence[Sequence[int]], capacity: int, *,
                      step_sizes: Sequence[Sequence[Sequence[int] | None]] | None = None,
                      segments: Sequence[Sequence[Sequence[tuple[int, int]]]] | None = None,
                      modalities: Sequence[str] | None = None,
                      data: Mapping[str, torch.Tensor | np.ndarray] | None = None,
                      metadata: Mapping[str, Any] | None = None) -> PackedBatch:
        """Packed batch with modalities and payloads, the constructor collate functions use.

        Args:
            rows, capacity, step_sizes: as in :meth:`from_lengths`.
            segments: ``segments[r][d]`` a list of ``(modality index, n_tokens)`` runs covering document d of
                row r in order, e.g. ``[(0, 12), (1, 512), (2, 1), (3, 50)]`` for 12 text tokens, two
                256-token camera frames, one state token and a 50-token action chunk. None: all modality 0.
            modalities: the names the indices refer to; default ``["text"]``.
            data: payload per name (tensors or numpy arrays, kept on their device), flat over the batch in
                token order; its leading dimension is whatever unit the model embeds (tokens for text,
                frames for video), so it is not checked against the token counts.
            metadata: free-form information carried along (copied into a new dict).

        >>> b = PackedBatch.from_segments([[3]], 4, segments=[[[(0, 1), (1, 2)]]], modalities=["text", "action"])
        >>> b.modality_ids.tolist()
        [[0, 1, 1, -1]]
        """
        names = _checked_inputs(modalities, data, metadata)
        layout = layout_from_rows(rows, capacity, step_sizes=step_sizes, segments=segments,
                                  num_modalities=len(names))
        return cls.from_layout(layout, modalities=names, data=data, metadata=metadata)

    @classmethod
    def from_layout(cls, layout: Layout, *, modalities: Sequence[str] | None = None,
                    data: Mapping[str, torch.Tensor | np.ndarray] | None = None,
                    metadata: Mapping[str, Any] | None = None) -> PackedBatch:
        """Packed batch from a validated flat :class:`~mmfeed.packing.metadata.Layout` (the fast path for
        loaders that already hold lengths as arrays; see :func:`~mmfeed.packing.metadata.make_layout`); the
        modalities, data and metadata are checked as :meth:`from_segments` checks them."""
        return cls.from_metadata(document_metadata(layout), modalities=modalities, data=data, metadata=metadata)

    @classmethod
    def from_metadata(cls, meta: Metadata, *, modalities: Sequence[str] | None = None,
                      data: Mapping[str, torch.Tensor | np.ndarray] | None = None,
                      metadata: Mapping[str, Any] | None = None) -> PackedBatch:
        """Packed batch over the attention metadata ``document_metadata(layout)`` gave (its arrays become the
        batch's tensors, not copied): :meth:`from_layout` for a caller that keeps the metadata of a layout it
        meets again."""
        names = _checked_inputs(modalities, data, metadata)
        payload = {str(k): _as_tensor(str(k), v) for k, v in (data or {}).items()}
        return cls(
            document_ids=torch.from_numpy(meta.document_ids),
            position_ids=torch.from_numpy(meta.position_ids),
            step_ids=torch.from_numpy(meta.step_ids),
            modality_ids=torch.from_numpy(meta.modality_ids),
            cu_seqlens=torch.from_numpy(meta.cu_seqlens),
            max_seqlen=meta.max_seqlen,
            modalities=names,
            data=payload,
            metadata=dict(metadata or {}),
        )

    @property
    def num_rows(self) -> int:
        """R, the number of rows."""
        return self.document_ids.shape[0]

    @property
    def capacity(self) -> int:
        """C, token slots per row."""
        return self.document_ids.shape[1]

    @property
    def num_documents(self) -> int:
        """Documents in the batch (not counting the empty ones :meth:`pad_documents` appends)."""
        return self._documents if self._documents is not None else self.cu_seqlens.shape[0] - 1

    def pad_documents(self, max_documents: int) -> PackedBatch:
        """The batch with ``cu_seqlens`` padded to ``max_documents + 1`` entries by repeating its last value
        (empty documents, which varlen attention skips), so that batches holding any number of documents have one
        shape (static shapes); ``num_documents`` stays the real count.

        >>> PackedBatch.from_lengths([[2, 1]], 4).pad_documents(4).cu_seqlens.tolist()
        [0, 2, 3, 3, 3]
        """
        n = self.num_documents
        if isinstance(max_documents, bool) or not isinstance(max_documents, int) or max_documents < n:
            raise ValueError(f"max_documents must be an int >= the batch's {n} documents, got {max_documents!r}")
        cu = self.cu_seqlens[: n + 1]
        padded = torch.cat([cu, cu[-1:].expand(max_documents - n)])
        return replace(self, cu_seqlens=padded, _documents=n)

    @property
    def device(self) -> torch.device:
        return self.document_ids.device

    def _ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.document_ids.to(torch.int32), self.step_ids.to(torch.int32)

    def attention_mask(self) -> torch.Tensor:
        """Dense bool mask ``[R, 1, C, C]`` (True = may attend) for ``scaled_dot_product_attention``.

        Same document and ``step[k] <= step[q]``; a padding query attends only to itself, so no row of the
        softmax is empty. Memory is R * C^2 bytes: for long rows use :meth:`block_mask` instead.
        """
        doc, step = self._ids()
        same = doc[:, :, None] == doc[:, None, :]
        causal = step[:, None, :] <= step[:, :, None]
        eye = torch.eye(self.capacity, dtype=torch.bool, device=doc.device)
        mask = (same & causal & (doc >= 0)[:, :, None]) | eye
        return mask[:, None]

    def mask_mod(self, block_size: int = 128) -> Callable:
        """The FlexAttention ``mask_mod(b, h, q_idx, kv_idx)`` of the attention rule, over this batch's ids
        (padded with padding ids up to a multiple of ``block_size`` so that indices of the logical padding
        stay in range)."""
        doc, step = self._ids()
        pad = -self.capacity % block_size
        if pad:
            doc = torch.nn.functional.pad(doc, (0, pad), value=-1)
            step = torch.nn.functional.pad(step, (0, pad), value=-1)

        def mask_mod(b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
            dq = doc[b, q_idx]
            same = (dq == doc[b, kv_idx]) & (step[b, kv_idx] <= step[b, q_idx]) & (dq >= 0)
            return same | (q_idx == kv_idx)

        return mask_mod

    def block_mask(self, block_size: int = 128) -> BlockMask:
        """FlexAttention ``BlockMask`` [R, 1, C, C] for the same rule as :meth:`attention_mask`.

        Built straight from the ids: the block tables (empty / partial / full per pair of blocks) come from
        per-block minima and maxima in numba, on host copies of the ids (no device sync), and so do their
        transposes for the backward pass (:func:`~mmfeed.packing.metadata.transpose_tables`); partial blocks use
        :meth:`mask_mod`. Capacities that are not a multiple of
        ``block_size`` are padded logically.
        """
        host = self._host_ids()
        if host is None:  # on a device without host copies (built by hand): fetch the ids
            host = _Host(self.document_ids.cpu().numpy(), self.step_ids.cpu().numpy())
        tables = block_tables(host.document_ids, host.step_ids, block_size)
        device = self.device
        kv_num, kv_idx, full_num, full_idx = (torch.from_numpy(t).to(device) for t in tables)
        # the query-block tables (the backward pass reads them) transposed in numba: torch's own transpose builds
        # a dense [nb, nb] grid and sorts it (1 s at 128K tokens a row, minutes at 1M)
        q_num, q_idx, full_q_num, full_q_idx = (torch.from_numpy(t).to(device) for t in transpose_tables(tables))
        return BlockMask(seq_lengths=(self.capacity, self.capacity), kv_num_blocks=kv_num, kv_indices=kv_idx,
                         full_kv_num_blocks=full_num, full_kv_indices=full_idx, q_num_blocks=q_num,
                         q_indices=q_idx, full_q_num_blocks=full_q_num, full_q_indices=full_q_idx,
                         BLOCK_SIZE=(block_size, block_size), mask_mod=self.mask_mod(block_size))

    def _host_ids(self) -> _Host | None:
        if self.document_ids.device.type == "cpu" and self.step_ids.device.type == "cpu":
            return _Host(self.document_ids.numpy(), self.step_ids.numpy())  # views, no copy
        return self._host

    def __getstate__(self) -> dict[str, Any]:
        # On the CPU the tensors themselves are the host copy: do not pickle the ids twice (worker -> main).
        # Small CPU tensors travel inside the pickle: between processes torch would give each its own new shared
        # memory file and pass its descriptor over a socket (2 ms apiece, measured), the pickle costs 0.2 ms for
        # all of a batch's ids, masks and metadata. Tensors already in shared memory (frames) still go by handle.
        return self.pickled_state(_by_value)

    def pickled_state(self, fn: Callable[[torch.Tensor], Any]) -> dict[str, Any]:
        """The attributes :meth:`__getstate__` pickles, each tensor as ``fn`` makes it (``_by_value``: small CPU
        tensors as their arrays); a DataLoader worker that recycles buffers gives its own ``fn``."""
        state = dict(self.__dict__)
        if self.device.type == "cpu":
            state["_host"] = None
        return {k: map_tensors(v, fn) for k, v in state.items()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({k: _from_value(v) for k, v in state.items()})

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> PackedBatch:
        return replace(
            self,
            _host=self._host_ids(),
            document_ids=fn(self.document_ids),
            position_ids=fn(self.position_ids),
            step_ids=fn(self.step_ids),
            modality_ids=fn(self.modality_ids),
            cu_seqlens=fn(self.cu_seqlens),
            modalities=list(self.modalities),
            data={k: fn(v) for k, v in self.data.items()},
            metadata=map_tensors(dict(self.metadata), fn),
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedBatch:
        """A new PackedBatch with every tensor (ids, cu_seqlens, data, tensors in metadata) on ``device``;
        ``max_seqlen`` stays a Python int."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> PackedBatch:
        """A new PackedBatch with every CPU tensor in page-locked memory (what torch's DataLoader calls when
        ``pin_memory=True``), so that ``to(device, non_blocking=True)`` copies asynchronously."""
        return self._map(lambda t: t.pin_memory() if t.device.type == "cpu" else t)
