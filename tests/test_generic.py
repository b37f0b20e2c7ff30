"""The planner over a plain map-style dataset of token sequences (language-model packing)."""

import numpy as np
import pytest
import torch

from mmfeed.loaders import PlanConfig, PlannedDataset


def make_docs(n, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=n)
    # Token values encode (document, position) so every token can be traced back.
    return [{"input_ids": torch.arange(k) + 1000 * i, "labels": torch.arange(k)}
            for i, k in enumerate(lengths)], lengths


def test_every_token_lands_in_its_document_in_order():
    docs, lengths = make_docs(60)
    ds = PlannedDataset.records(docs, lambda i: len(docs[i]["input_ids"]),
                                plan=PlanConfig(capacity=64, rows_per_batch=2), seed=4)
    seen = []
    for step in range(ds.num_steps(0)):
        b = ds[0, step]
        ids = b.data["input_ids"]
        bounds = b.cu_seqlens.tolist()
        for d, sample in enumerate(b.metadata["sample"].tolist()):
            assert ids[bounds[d] : bounds[d + 1]].tolist() == (torch.arange(lengths[sample]) + 1000 * sample).tolist()
        # Tokens sit in the rows in the same order as the flat payload.
        assert (b.document_ids >= 0).sum() == len(ids)
        seen += b.metadata["sample"].tolist()
    assert sorted(seen + ds.plan(0).dropped.tolist()) == list(range(60))


def test_ranks_split_the_epoch_disjointly_with_equal_steps():
    docs, lengths = make_docs(80, seed=1)
    per_rank = [PlannedDataset.records(docs, lengths, plan=PlanConfig(capacity=48), seed=2, rank=r, world_size=3)
                for r in range(3)]
    steps = {d.num_steps(1) for d in per_rank}
    assert len(steps) == 1
    samples = [s for d in per_rank for t in range(d.num_steps(1)) for s in d[1, t].metadata["sample"].tolist()]
    assert len(samples) == len(set(samples))
    assert sorted(samples + per_rank[0].plan(1).dropped.tolist()) == list(range(80))


def test_plain_tensors_and_fixed_batches_pad_to_the_longest():
    docs = [torch.full((n,), n) for n in (3, 9, 4, 2)]
    ds = PlannedDataset.records(docs, [3, 9, 4, 2], plan=PlanConfig(mode="fixed", batch_size=2, shuffle=False))
    b = ds[0, 0]
    assert b.capacity == 9 and b.num_rows == 2 and b.data["text"].tolist() == [3] * 3 + [9] * 9


def test_lengths_that_disagree_with_samples_are_named():
    docs, lengths = make_docs(4)
    lengths = lengths.copy()
    lengths[0] += 1
    ds = PlannedDataset.records(docs, lengths, plan=PlanConfig(capacity=100, shuffle=False))
    with pytest.raises(ValueError, match="sample 0 field 'input_ids'"):
        ds[0, 0]
    with pytest.raises(ValueError, match="one integer per sample"):
        PlannedDataset.records(docs, [1, 2])
