"""Records: the samples of any map-style dataset (token sequences, dicts of per-token tensors) as an item kind of
the planned dataset (:mod:`mmfeed.loaders.planned.dataset`), for language-model packing::

    >>> import torch
    >>> items = RecordItems([torch.arange(5), torch.arange(3)], [5, 3])
    >>> items.read(1)[0]["text"].tolist(), items.describe(1)
    ([0, 1, 2], 'list[1]')

:class:`Records` is what collation reads (a :class:`~mmfeed.loaders.planned.reads.RecordSource`, as an episode
source is for episode samples); :class:`RecordItems` is the item kind: the records' sample table and
``reads(samples)``, which names the records a batch reads in its :class:`Records`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from mmfeed.loaders.planned.reads import RecordReads
from mmfeed.packing.samples import SampleTable

__all__ = ["RecordItems", "Records"]


class Records:
    """The records of a map-style dataset and their lengths (``tokens``, int64, one per record, each >= 1), as
    collation reads them (:func:`~mmfeed.loaders.planned.collate.collate_records`)."""

    def __init__(self, dataset: Sequence, tokens: np.ndarray) -> None:
        self.dataset, self.tokens = dataset, tokens
        self._empty: dict[str, torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def describe(self, i: int) -> str:
        """Where record ``i`` lies, for errors: ``MyDataset[i]``."""
        return f"{type(self.dataset).__name__}[{i}]"

    def read(self, i: int) -> tuple[dict[str, torch.Tensor], Any]:
        """Record ``i``: its tensors of one entry per token (``{"text": ids}`` for a bare 1-D one) and its other
        entries (None when it has none). Raises ValueError naming the record and key when a tensor's first
        dimension is not the record's length (its planned tokens)."""
        sample = self.dataset[i]
        entries = {"text": sample} if isinstance(sample, (torch.Tensor, np.ndarray)) else sample
        if not isinstance(entries, Mapping):
            return {}, sample
        tensors, rest = {}, {}
        for key, value in entries.items():
            value = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            if isinstance(value, torch.Tensor) and value.dim() >= 1:
                if value.shape[0] != self.tokens[i]:
                    raise ValueError(f"sample {i} field {key!r} has {value.shape[0]} entries but its length is "
                                     f"{int(self.tokens[i])}; lengths must match the samples")
                tensors[key] = value
            else:
                rest[key] = value
        return tensors, rest or None

    def empty_record(self, tries: int) -> dict[str, torch.Tensor]:
        """A record's tensors with no entries, for a batch whose every record failed (its keys, dtypes and shapes
        stay the epoch's): those of the first record that reads among the first ``tries``, or {} if none does."""
        if self._empty is None:
            for i in range(min(tries, len(self))):
                try:
                    tensors, _ = self.read(i)
                except MemoryError:
                    raise
                except Exception:
                    continue
                self._empty = {key: value[:0].clone() for key, value in tensors.items()}
                break
        return dict(self._empty or {})


class RecordItems:
    """The samples of a map-style dataset, priced ``lengths`` (an array, or a function ``index -> int``).

    Samples may be 1-D tensors (token ids, stored as ``data["text"]``) or dicts of tensors whose first dimension
    is the sample's length (each key concatenated in token order; every record of a batch has the same keys);
    anything else (0-d tensors, strings, ...) goes to ``metadata["samples"]`` unchanged. Records carry their own
    token ids, so no tokenizer applies. They are collated by :func:`~mmfeed.loaders.planned.collate.collate_records`
    through the same steps as episode samples: the error policy, the finiteness check, the transform and static
    shapes mean the same.
    """

    def __init__(self, dataset: Sequence, lengths: Sequence[int] | np.ndarray | Callable[[int], int]) -> None:
        n = len(dataset)
        values = [lengths(i) for i in range(n)] if callable(lengths) else lengths
        tokens = np.asarray(values)
        if tokens.shape != (n,) or (n and not np.issubdtype(tokens.dtype, np.integer)):
            raise ValueError(f"lengths must give one integer per sample ({n}), got shape {tokens.shape}")
        if n and tokens.min() < 1:
            raise ValueError(f"sample {int(np.argmin(tokens))} has length {tokens.min()}; lengths must be >= 1")
        self.records = Records(dataset, tokens.astype(np.int64))
        self.table = SampleTable.of_prices(self.records.tokens)

    @property
    def dataset(self) -> Sequence:
        return self.records.dataset

    @property
    def tokens(self) -> np.ndarray:
        """Each record's length, in tokens (int64)."""
        return self.records.tokens

    def __len__(self) -> int:
        return len(self.records)

    def reads(self, samples: np.ndarray) -> RecordReads:
        """What ``samples`` read, for collation: those records of :attr:`records`."""
        return RecordReads(self.records, np.asarray(samples, dtype=np.int64))

    def describe(self, i: int) -> str:
        """Where record ``i`` lies, for errors (:meth:`Records.describe`)."""
        return self.records.describe(i)

    def read(self, i: int) -> tuple[dict[str, torch.Tensor], Any]:
        """Record ``i``'s tensors and other entries (:meth:`Records.read`)."""
        return self.records.read(i)
