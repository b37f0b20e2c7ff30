"""What one planned batch reads, as data: the hand-over from an item kind to collation.

A planned dataset asks its items (:class:`Items`: episode windows and chunks,
:class:`~mmfeed.loaders.planned.items.EpisodeItems`; records, :class:`~mmfeed.loaders.planned.records.RecordItems`)
what the samples of one step read, and hands the answer to :func:`mmfeed.loaders.planned.collate.collate_batch`:

- :class:`EpisodeReads`: the episode source, one :class:`SampleRead` per sample (its frames, ``is_pad`` flags,
  token layout, task text) and the batch's layout and features; for a batch of windows every sample of which
  reads every feature, the samples as arrays (:class:`WindowSamples`), whose per-sample reads are made only
  where collation works sample by sample;
- :class:`RecordReads`: the record source (:class:`RecordSource`: a map-style dataset's records and what they
  are priced) and the batch's record ids.

Collation reads through the sources (``read_many``, ``read``), never through the items: no item kind hands
itself to collation, and nothing collation does calls an item kind back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from mmfeed.loaders.sources.base import EpisodeRequest, EpisodeSource, WindowArrays
from mmfeed.loaders.sources.requests import per_sample
from mmfeed.packing.layout import SampleLayout, TokenLayout
from mmfeed.packing.samples import SampleTable

__all__ = ["DocumentNames", "EpisodeReads", "Items", "RecordReads", "RecordSource", "SampleRead", "WindowSamples",
           "episode_sample", "record_sample"]


@dataclass(frozen=True, eq=False)
class SampleRead:
    """What one sample reads and how it is laid out, everything collation needs of it.

    sample: its id in the sample table; request: the frames of each feature it reads (its episode too);
    pads: each feature's ``is_pad`` flags; layout: its token layout; task: its task id (-1: none) and text: the
    token ids of that task's text; start: its first step (a window's anchor).
    """

    sample: int
    request: EpisodeRequest
    pads: dict[str, np.ndarray]
    layout: SampleLayout
    task: int
    text: np.ndarray
    start: int


class WindowSamples(Sequence):
    """The :class:`SampleRead` of each sample of a batch of windows that every sample reads every feature of,
    made only when asked for: collation reads and lays out such a batch from its arrays (``windows``, and each
    sample's ``layouts``, ``texts``, ``episodes`` and ``starts``), and asks for the reads only where a step works
    sample by sample (a failure, a transform, a value that is not finite, a source that reads request by
    request)."""

    def __init__(self, samples: np.ndarray, windows: WindowArrays, layouts: list[SampleLayout], tasks: list[int],
                 texts: list[np.ndarray], starts: np.ndarray) -> None:
        self.samples, self.windows, self.layouts, self.tasks, self.texts = samples, windows, layouts, tasks, texts
        self.episodes, self.starts = windows.episodes, starts
        self._reads: list[SampleRead] | None = None

    def reads(self) -> list[SampleRead]:
        """Every sample's :class:`SampleRead` (made once)."""
        if self._reads is None:
            self._reads = [SampleRead(s, request, pads, lay, task, text, start) for s, (request, pads), lay, task,
                           text, start in zip(self.samples.tolist(), per_sample(self.windows, {}), self.layouts,
                                              self.tasks, self.texts, np.asarray(self.starts).tolist())]
        return self._reads

    def __len__(self) -> int:
        return len(self.layouts)

    def __getitem__(self, k: Any) -> Any:
        return self.reads()[k]

    def __iter__(self) -> Iterator[SampleRead]:
        return iter(self.reads())


@dataclass(frozen=True, eq=False)
class DocumentNames:
    """How the documents of a batch are named in its metadata when the reader names them itself, not by the
    sample table and the source (a stream: :mod:`mmfeed.loaders.streaming`): each sample's ``sample`` id and
    ``episode`` number (in row order), the ``source`` name, and ``errors``, failures met before the batch was
    collated (episodes skipped whole), listed after the batch's own. No ``dataset`` is named."""

    sample: np.ndarray
    episode: np.ndarray
    source: str
    errors: list[dict]


@dataclass(frozen=True, eq=False)
class EpisodeReads:
    """The episode samples of one batch: ``samples`` (one :class:`SampleRead` each, in row order) read from
    ``source``, laid out by ``layout`` over the modalities task text and ``features``; ``names``: how the
    documents are named, when not by their sample ids and the source's episodes (:class:`DocumentNames`);
    ``windows``: the same samples' windows as arrays (:class:`~mmfeed.loaders.sources.requests.WindowArrays`),
    where they are windows and every one reads every feature, which collation reads in one call."""

    source: EpisodeSource
    samples: Sequence[SampleRead]
    layout: TokenLayout
    features: list[str]
    names: DocumentNames | None = None
    windows: WindowArrays | None = None


@runtime_checkable
class RecordSource(Protocol):
    """Records as collation reads them: ``tokens`` (each record's planned length), ``read(i)`` (its per-token
    tensors and its other entries), ``describe(i)`` (where it lies, for errors) and ``empty_record(tries)`` (the
    tensors of a record with no entries, for a batch whose every record failed)."""

    tokens: np.ndarray

    def read(self, i: int) -> tuple[dict[str, Any], Any]: ...

    def describe(self, i: int) -> str: ...

    def empty_record(self, tries: int) -> dict[str, Any]: ...


@dataclass(frozen=True, eq=False)
class RecordReads:
    """The records of one batch: their ids ``samples`` (in row order) in ``records``."""

    records: RecordSource
    samples: np.ndarray


@runtime_checkable
class Items(Protocol):
    """What a planned dataset plans over and reads, for every item kind (episode windows, whole-episode chunks,
    a mixture's samples, records): ``table`` (the samples and their prices, what the epoch is planned from),
    ``len(items)`` and ``reads(samples)`` (what those samples read, as data for collation)."""

    table: SampleTable

    def __len__(self) -> int: ...

    def reads(self, samples: np.ndarray) -> EpisodeReads | RecordReads: ...


# -- what a transform gets of a sample: made from what was read, one sample at a time -----------------------------
def episode_sample(source: EpisodeSource, read: SampleRead, data: dict | None) -> dict | None:
    """What a transform gets of an episode sample (None where reading it failed): each feature's frames as
    tensors, its ``_is_pad`` flags, ``task``, ``episode_index``, ``frame_index``; in a mixture ``dataset`` (and
    ``embodiment``) and each padded feature's ``_dim_mask``."""
    if data is None:
        return None
    episode = int(read.request.episode)
    sample = {f: torch.from_numpy(np.ascontiguousarray(v)) if v.dtype != object else v for f, v in data.items()}
    sample.update({f"{f}_is_pad": torch.from_numpy(p) for f, p in read.pads.items()})
    for f in data:
        mask = source.dim_mask(episode, f)
        if mask is not None:
            sample[f"{f}_dim_mask"] = torch.from_numpy(mask.copy())
    sample.update(task=source.tasks[read.task] if read.task >= 0 else "", episode_index=episode,
                  frame_index=read.start, **source.origin(episode))
    return sample


def record_sample(records: RecordSource, index: int, data: dict | None, extra: Any) -> dict | None:
    """What a transform gets of a record (None where reading it failed): its tensors (copies: a transform may work
    in place without touching the dataset), its other entries and ``index``, its position in the dataset."""
    if data is None:
        return None
    extra = extra if isinstance(extra, Mapping) else {}
    if "index" in data or "index" in extra:
        raise ValueError(f"{records.describe(index)} has an entry 'index', the name under which a transform gets "
                         "the record's position; rename that entry")
    return {**{key: value.clone() for key, value in data.items()}, **extra, "index": index}
