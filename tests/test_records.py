"""Records (``PlannedDataset.records``) honour every option as episode samples do: the transform with its seeded
generator, the error policy, the finiteness check and static shapes; a tokenizer is refused, saying why."""

import logging

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mmfeed import DataLoader
from mmfeed.loaders import ErrorPolicy, PlanConfig, PlannedDataset, SampleError
from mmfeed.loaders.planned.collate import sample_generator

from replay import replayed

LENGTHS = [int(n) for n in np.random.default_rng(5).integers(1, 30, size=40)]


class Records(torch.utils.data.Dataset):
    """Record i: token ids ``1000 * i + position`` and a float weight per token; reading a record in ``bad``
    raises; ``nan`` records hold a NaN weight at position 0."""

    def __init__(self, lengths=LENGTHS, bad=(), nan=(), error=OSError):
        self.lengths, self.bad, self.nan, self.error = list(lengths), set(bad), set(nan), error

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        if i in self.bad:
            raise self.error(f"record {i} is unreadable")
        weights = torch.full((self.lengths[i],), 0.5)
        if i in self.nan:
            weights[0] = float("nan")
        return {"input_ids": torch.arange(self.lengths[i]) + 1000 * i, "weights": weights, "name": f"doc{i}"}


def planned(dataset=None, **kwargs):
    dataset = Records() if dataset is None else dataset
    kwargs.setdefault("plan", PlanConfig(capacity=40, rows_per_batch=2))
    return PlannedDataset.records(dataset, dataset.lengths, seed=3, **kwargs)


def epoch(ds, e=0):
    return [ds[e, s] for s in range(ds.num_steps(e))]


def documents(batch, key="input_ids"):
    """Each document's entries of ``key``, by its record id."""
    bounds = batch.cu_seqlens.tolist()
    return {s: batch.data[key][bounds[d]:bounds[d + 1]] for d, s in enumerate(batch.metadata["sample"].tolist())}


def jitter(sample, generator):
    """Random noise on the ids, drawn from the record's generator, added in place (the dataset must not see it)."""
    assert isinstance(sample["index"], int) and sample["name"] == f"doc{sample['index']}"
    sample["input_ids"].add_(torch.randint(0, 100, sample["input_ids"].shape, generator=generator))
    return sample


def test_a_transform_runs_on_every_record_with_its_own_seeded_generator():
    ds = planned(transform=jitter)
    for e in (0, 1):
        seen = []
        for batch in epoch(ds, e):
            for s, ids in documents(batch).items():
                noise = torch.randint(0, 100, (LENGTHS[s],), generator=sample_generator(3, e, s))
                assert torch.equal(ids, torch.arange(LENGTHS[s]) + 1000 * s + noise)
                seen.append(s)
        assert sorted(seen + ds.plan(e).dropped.tolist()) == list(range(len(LENGTHS)))
    # the dataset's own tensors stayed as they were
    assert all(torch.equal(ds.items.dataset[i]["input_ids"], torch.arange(n) + 1000 * i) for i, n in enumerate(LENGTHS))


@pytest.mark.slow
def test_a_records_transform_is_the_same_for_any_number_of_workers_and_replays_after_resume():
    plain = replayed(lambda w: DataLoader(planned(transform=jitter), num_workers=w),
                     lambda b: b.data["input_ids"].clone(), resumes=((0, 2), (2, 3)))
    assert len(plain) > 3
    untouched = [b.data["input_ids"] for b in DataLoader(planned())]
    assert not any(torch.equal(a, b) for a, b in zip(plain, untouched))  # the transform did something


def test_a_transform_may_change_values_but_not_a_records_length_or_keys():
    shorter = lambda s, g: {**s, "weights": s["weights"][1:]}  # noqa: E731
    with pytest.raises(ValueError, match=r"number of tokens of 'weights' in sample \d+ from \d+ to \d+"):
        planned(transform=shorter)[0, 0]
    dropped = lambda s, g: {"input_ids": s["input_ids"]}  # noqa: E731
    with pytest.raises(ValueError, match=r"dropped 'weights' of sample \d+"):
        planned(transform=dropped)[0, 0]
    scaled = lambda s, g: {**s, "weights": s["weights"] * 4}  # noqa: E731
    assert planned(transform=scaled)[0, 0].data["weights"].eq(2.0).all()
    bare = PlannedDataset.records([torch.arange(4)], [4], transform=lambda s, g: {**s, "text": s["text"] * s["index"]})
    assert bare[0, 0].data["text"].tolist() == [0, 0, 0, 0]  # a bare tensor record is {"text": ...}


@pytest.mark.parametrize("mode,workers", [("skip", 2), ("warn", 0)])  # a worker's log stays in its process
def test_unreadable_records_are_skipped_counted_and_every_other_one_delivered_once(mode, workers, caplog):
    bad = {2, 3, 11, 30}
    ds = planned(Records(bad=bad), errors=ErrorPolicy(on_error=mode))
    with caplog.at_level(logging.WARNING, logger="mmfeed.loaders.planned.errors"):
        loader = DataLoader(ds, num_workers=workers)
        batches = list(loader)
    delivered = [s for b in batches for s in b.metadata["sample"].tolist()]
    skipped = [f["sample"] for b in batches for f in b.metadata.get("errors", [])]
    planned_ids = set(range(len(LENGTHS))) - set(ds.plan(0).dropped.tolist())
    assert sorted(delivered) == sorted(planned_ids - bad) and sorted(skipped) == sorted(planned_ids & bad)
    assert loader.stats["skipped_samples"] == len(skipped) > 0
    assert all(f["source"] == f"Records[{f['sample']}]" and "OSError: record" in f["reason"]
               for f in loader.stats["errors"])
    for b in batches:  # the batch still holds every kept record's tokens in its documents
        assert all(torch.equal(ids, torch.arange(LENGTHS[s]) + 1000 * s) for s, ids in documents(b).items())
    assert len(batches) == ds.num_steps(0)
    warned = [r for r in caplog.records if "skipped sample" in r.getMessage()]
    assert (len(warned) > 0) == (mode == "warn")


def test_under_raise_the_first_unreadable_record_stops_and_system_errors_always_do():
    with pytest.raises(OSError, match="record 2 is unreadable"):
        epoch(planned(Records(bad={2})))
    with pytest.raises(MemoryError):
        epoch(planned(Records(bad={2}, error=MemoryError), errors=ErrorPolicy(on_error="skip")))
    policy = ErrorPolicy(on_error="skip", max_consecutive_errors=2)
    with pytest.raises(SampleError, match="3 samples in a row failed"):
        epoch(planned(Records(bad=range(40)), errors=policy))


def test_non_finite_record_values_raise_skip_or_are_masked_as_for_episodes():
    with pytest.raises(SampleError, match=r"Records\[7\] key 'weights': NaN or inf at positions \[0\].*nonfinite"):
        epoch(planned(Records(nan={7})))
    skipped = epoch(planned(Records(nan={7}), errors=ErrorPolicy(on_error="skip")))
    assert [f["sample"] for b in skipped for f in b.metadata.get("errors", [])] == [7]
    masked = epoch(planned(Records(nan={7}), errors=ErrorPolicy(nonfinite="mask")))
    for b in masked:
        assert set(b.data) == {"input_ids", "weights", "weights_is_pad"}  # every batch: one set of keys
        flags, weights = documents(b, "weights_is_pad"), documents(b, "weights")
        for s in flags:
            assert flags[s].tolist() == [s == 7] + [False] * (LENGTHS[s] - 1)
            assert weights[s].tolist() == [0.0 if s == 7 else 0.5] + [0.5] * (LENGTHS[s] - 1)


def test_static_shapes_give_records_one_shape_per_tensor_for_the_whole_epoch():
    ds = planned(static_shapes=True)
    plain = epoch(planned())
    shapes = set()
    for b, p in zip(epoch(ds), plain):
        shapes.add((tuple(b.cu_seqlens.shape), tuple(b.document_ids.shape),
                    *sorted((k, tuple(v.shape)) for k, v in b.data.items())))
        n = int(p.cu_seqlens[-1])
        assert b.num_documents == p.num_documents
        assert b.cu_seqlens[: p.num_documents + 1].tolist() == p.cu_seqlens.tolist()
        assert set(b.cu_seqlens[p.num_documents:].tolist()) == {n}  # padded by repeating the last value
        assert all(torch.equal(b.data[k][:n], p.data[k]) and not b.data[k][n:].any() for k in p.data)
    assert len(shapes) == 1 and len(plain) > 3 and len({int(p.cu_seqlens[-1]) for p in plain}) > 1


def test_a_batch_whose_every_record_failed_keeps_the_epochs_keys_and_shapes():
    lengths = [int(n) for n in np.random.default_rng(2).integers(16, 30, size=8)]  # one record a row
    ds = planned(Records(lengths, bad={0, 3}), plan=PlanConfig(capacity=30, rows_per_batch=1), static_shapes=True,
                 errors=ErrorPolicy(on_error="skip"))
    batches = epoch(ds)
    assert len(batches) == 8 and sum(b.num_documents == 0 for b in batches) == 2
    assert len({tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(b.data.items())) for b in batches}) == 1


@given(st.lists(st.integers(1, 12), min_size=1, max_size=30), st.data())
def test_every_readable_record_is_delivered_once_and_every_unreadable_one_counted_once(lengths, data):
    bad = data.draw(st.sets(st.integers(0, len(lengths) - 1)))
    ds = planned(Records(lengths, bad=bad), plan=PlanConfig(capacity=16, rows_per_batch=2), static_shapes=True,
                 errors=ErrorPolicy(on_error="skip", max_consecutive_errors=100))
    batches = epoch(ds)
    delivered = [s for b in batches for s in b.metadata["sample"].tolist()]
    skipped = [f["sample"] for b in batches for f in b.metadata.get("errors", [])]
    assert sorted(delivered + skipped + ds.plan(0).dropped.tolist()) == list(range(len(lengths)))
    assert not set(delivered) & bad and set(skipped) <= bad
    assert len({(tuple(b.cu_seqlens.shape), *((k, tuple(v.shape)) for k, v in sorted(b.data.items())))
                for b in batches}) <= 1  # one shape (an epoch may be too short for any batch)


def test_records_refuse_a_tokenizer_saying_why():
    with pytest.raises(ValueError, match="records carry their own token ids"):
        PlannedDataset.records([torch.arange(3)], [3], tokenizer=str.encode)


def test_every_item_kind_meets_the_items_protocol_and_hands_collation_data_not_itself():
    from mmfeed.loaders import Packing, TokenLayout, WindowSpec
    from mmfeed.loaders.planned.collate import collate_batch
    from mmfeed.loaders.planned.reads import EpisodeReads, Items, RecordReads
    from mmfeed.loaders.sources.arrays import ArraySource
    from mmfeed.testing import make_episodes

    eps = make_episodes(2, seed=1, min_length=6, max_length=8, cameras=())
    source = ArraySource([{**e.features(), "task": e.task, "fps": e.fps, "rates": e.rates()} for e in eps])
    windows = Packing(window=WindowSpec.from_delta_timestamps({"action": [0.0, 1 / 30]})).dataset(source).items
    chunks = Packing(layout=TokenLayout(tokens_per_frame={"action": 1})).dataset(source).items
    records = planned().items
    for items in (windows, chunks, records):
        assert isinstance(items, Items)
        reads = items.reads(np.array([1, 0]))
        assert reads is not items and not any(v is items for v in vars(reads).values())
    assert isinstance(windows.reads(np.array([0])), EpisodeReads)
    reads = records.reads(np.array([1, 0]))
    assert isinstance(reads, RecordReads) and reads.samples.tolist() == [1, 0]
    batch = collate_batch(reads, [np.array([1, 0])], LENGTHS[0] + LENGTHS[1])
    assert batch.metadata["sample"].tolist() == [1, 0]
    assert batch.data["input_ids"].tolist() == [*range(1000, 1000 + LENGTHS[1]), *range(LENGTHS[0])]
    with pytest.raises(TypeError, match="EpisodeReads or RecordReads"):
        collate_batch([np.array([0])], [np.array([0])], 40)
