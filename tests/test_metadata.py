"""Attention metadata of packed rows: document, position, step and modality ids, cu_seqlens, max_seqlen."""

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed import PackedBatch
from mmfeed.packing.metadata import Layout, document_metadata, layout_from_rows, make_layout
from mmfeed.testing.strategies import packed_layouts
from naive import naive_metadata


def test_contract_example():
    """The PackedBatch docstring's example: two rows, three documents numbered row-major, padding marked -1 / 0."""
    b = PackedBatch.from_lengths([[5, 3], [7]], capacity=8)
    assert b.document_ids.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1], [2, 2, 2, 2, 2, 2, 2, -1]]
    assert b.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, 0]]
    assert b.step_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6, -1]]
    assert b.modality_ids.tolist() == [[0] * 8, [0] * 7 + [-1]]
    assert b.modalities == ["text"]
    assert b.cu_seqlens.tolist() == [0, 5, 8, 15]
    assert b.max_seqlen == 7 and type(b.max_seqlen) is int
    assert b.data == {}


def test_dtypes_and_shapes():
    """Every field has the dtype and shape of the contract and lives on the CPU."""
    b = PackedBatch.from_lengths([[2], [], [1, 1, 1]], capacity=5)
    assert (b.document_ids.dtype, b.position_ids.dtype, b.step_ids.dtype, b.modality_ids.dtype,
            b.cu_seqlens.dtype) == (torch.int32, torch.int64, torch.int32, torch.int8, torch.int32)
    for t in (b.document_ids, b.position_ids, b.step_ids, b.modality_ids):
        assert t.shape == (3, 5) and t.device.type == "cpu"
    assert b.cu_seqlens.shape == (5,)
    assert (b.num_rows, b.capacity, b.num_documents) == (3, 5, 4)


def test_step_sizes_block_causal_and_bidirectional():
    """A frame's tokens share a step; a bidirectional document is one step; None keeps one token per step."""
    b = PackedBatch.from_lengths([[6, 3], [4]], 10, step_sizes=[[[1, 1, 2, 2], [3]], [None]])
    assert b.step_ids.tolist() == [[0, 1, 2, 2, 3, 3, 0, 0, 0, -1], [0, 1, 2, 3] + [-1] * 6]


def test_segments_set_modality_ids():
    """Segment runs give every token its modality index, in order; padding is -1. Modalities are feature names
    (dots and all), payloads keyed by them."""
    names = ["text", "observation.images.cam_high", "observation.state", "action"]
    b = PackedBatch.from_segments([[7], [2]], 8, segments=[[[(0, 2), (1, 4), (3, 1)]], [[(2, 2)]]],
                                  modalities=names, data={"observation.state": np.zeros((2, 3), np.float32),
                                                          "observation.state_is_pad": np.zeros(2, bool)})
    assert b.modality_ids.tolist() == [[0, 0, 1, 1, 1, 1, 3, -1], [2, 2] + [-1] * 6]
    assert b.modalities == names
    assert isinstance(b.data["observation.state"], torch.Tensor) and b.data["observation.state"].shape == (2, 3)
    assert b.data["observation.state_is_pad"].dtype == torch.bool


@given(packed_layouts(max_rows=4, max_capacity=64, max_docs=8))
def test_cu_seqlens_consistent_with_document_ids(layout):
    """cu_seqlens is int32, its differences are the document lengths, its last entry the number of real tokens,
    and flattening the rows row-major with padding removed gives document g exactly on cu[g]:cu[g+1]."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    cu = b.cu_seqlens.numpy()
    flat = b.document_ids.numpy().reshape(-1)
    flat = flat[flat >= 0]
    assert cu.dtype == np.int32 and cu[0] == 0
    assert np.diff(cu).tolist() == [n for row in rows for n in row]
    assert cu[-1] == (b.document_ids >= 0).sum().item() == len(flat)
    for g in range(b.num_documents):
        assert (flat[cu[g]:cu[g + 1]] == g).all()


@given(packed_layouts(max_rows=4, max_capacity=64, max_docs=8))
def test_positions_reset_and_steps_follow_step_sizes(layout):
    """Positions are 0 at each document start and count up by one; step ids are the index of the step a token
    falls in; documents are numbered 0, 1, 2, ... row by row; max_seqlen is the longest document (a Python
    int, 0 when there is none)."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    g = 0
    for r, row in enumerate(rows):
        t = 0
        for d, n in enumerate(row):
            assert b.document_ids[r, t:t + n].tolist() == [g] * n
            assert b.position_ids[r, t:t + n].tolist() == list(range(n))
            assert b.step_ids[r, t:t + n].tolist() == [s for s, size in enumerate(steps[r][d]) for _ in range(size)]
            t, g = t + n, g + 1
        assert b.document_ids[r, t:].tolist() == [-1] * (capacity - t)
        assert b.step_ids[r, t:].tolist() == [-1] * (capacity - t)
        assert b.position_ids[r, t:].tolist() == [0] * (capacity - t)
    assert type(b.max_seqlen) is int
    assert b.max_seqlen == max((n for row in rows for n in row), default=0)


@pytest.mark.kernels
@given(packed_layouts(max_rows=3, max_capacity=24, max_docs=5))
def test_metadata_kernel_equals_naive(layout):
    """The numba metadata kernel equals the token-by-token reference, segments included."""
    rows, capacity, steps = layout
    # cut each document into at most three modality runs, deterministically from its length
    segments = [[[(0, n)] if n < 3 else [(n % 4, 1), (2, n - 2), (1, 1)] for n in row] for row in rows]
    meta = document_metadata(layout_from_rows(rows, capacity, step_sizes=steps, segments=segments))
    doc, pos, step, mod, cu, max_seqlen = naive_metadata(rows, capacity, steps, segments)
    assert meta.document_ids.tolist() == doc
    assert meta.position_ids.tolist() == pos
    assert meta.step_ids.tolist() == step
    assert meta.modality_ids.tolist() == mod
    assert meta.cu_seqlens.tolist() == cu
    assert meta.max_seqlen == max_seqlen


@pytest.mark.kernels
def test_metadata_kernel_equals_naive_on_random_arrays():
    """Seeded random layouts built from flat arrays (the loaders' path) match the reference."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        capacity = int(rng.integers(1, 40))
        rows = []
        for _ in range(int(rng.integers(0, 4))):
            row, free = [], capacity
            while free and rng.random() < 0.8:
                row.append(int(rng.integers(1, free + 1)))
                free -= row[-1]
            rows.append(row)
        lengths = np.array([n for row in rows for n in row], np.int64)
        offsets = np.cumsum([0] + [len(row) for row in rows])
        meta = document_metadata(make_layout(lengths, offsets, capacity))
        doc, pos, step, mod, cu, max_seqlen = naive_metadata(rows, capacity)
        assert meta.document_ids.reshape(len(rows), capacity).tolist() == doc
        assert (meta.position_ids.tolist(), meta.step_ids.tolist(), meta.modality_ids.tolist()) == (pos, step, mod)
        assert (meta.cu_seqlens.tolist(), meta.max_seqlen) == (cu, max_seqlen)


def test_all_padding_batch():
    """A batch of empty rows holds no document: everything is padding, cu_seqlens == [0], max_seqlen == 0."""
    b = PackedBatch.from_lengths([[], []], capacity=3)
    assert b.document_ids.tolist() == [[-1] * 3] * 2
    assert b.cu_seqlens.tolist() == [0] and b.max_seqlen == 0 and type(b.max_seqlen) is int
    assert b.attention_mask()[0, 0].tolist() == torch.eye(3, dtype=torch.bool).tolist()


def test_full_rows_have_no_padding():
    """Rows filled to capacity carry no -1."""
    b = PackedBatch.from_lengths([[4, 4], [8]], capacity=8)
    assert (b.document_ids >= 0).all() and b.cu_seqlens.tolist() == [0, 4, 8, 16]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(rows=[[5, 4]], capacity=8), "row 0 holds 9 tokens, more than capacity 8"),
        (dict(rows=[[2], [3, 0]], capacity=8), r"row 1, document 1 has length 0"),
        (dict(rows=[[2], [-3]], capacity=8), r"row 1, document 0 has length -3"),
        (dict(rows=[[3]], capacity=0), "capacity must be >= 1, got 0"),
        (dict(rows=[[3]], capacity=4, step_sizes=[[[1, 1]]]), r"row 0, document 0 sum to 2 .* 3 tokens"),
        (dict(rows=[[1], [3]], capacity=4, step_sizes=[[[1]], [[4, -1]]]), r"row 1, document 0 must be positive"),
        (dict(rows=[[3]], capacity=4, step_sizes=[[[3], [1]]]), r"step_sizes\[0\] has 2 entries"),
        (dict(rows=[[3]], capacity=4, step_sizes=[]), "step_sizes has 0 rows"),
    ],
)
def test_bad_input_raises_value_error_naming_it(kwargs, match):
    """Rows over capacity, non-positive lengths or step sizes, steps not covering their document and capacity < 1
    raise ValueError naming the row, document and value."""
    with pytest.raises(ValueError, match=match):
        PackedBatch.from_lengths(**kwargs)


def test_bad_segments_and_types():
    """Segments must cover their document with known modality indices; wrong types raise TypeError."""
    with pytest.raises(ValueError, match=r"row 0, document 1 sum to 1"):
        PackedBatch.from_segments([[1, 2]], 4, segments=[[[(0, 1)], [(0, 1)]]])
    with pytest.raises(ValueError, match=r"modality index 2, outside \[0, 1\]"):
        PackedBatch.from_segments([[2]], 4, segments=[[[(2, 2)]]], modalities=["text", "action"])
    with pytest.raises(ValueError, match="distinct strings"):
        PackedBatch.from_segments([[2]], 4, modalities=["text", "text"])
    with pytest.raises(TypeError, match="capacity must be an int"):
        PackedBatch.from_lengths([[2]], 4.0)
    with pytest.raises(TypeError, match="rows must be a list"):
        PackedBatch.from_lengths(np.array([[2]]), 4)
    with pytest.raises(TypeError, match=r"data\['x'\] must be a torch.Tensor"):
        PackedBatch.from_segments([[2]], 4, data={"x": [1, 2]})
    with pytest.raises(TypeError, match="lengths must hold integers"):
        PackedBatch.from_lengths([[2.5]], 4)
    with pytest.raises(TypeError, match="step_sizes must hold integers"):
        PackedBatch.from_lengths([[2]], 4, step_sizes=[[[1.0, 1.0]]])
    with pytest.raises(ValueError, match=r"\(modality index, n_tokens\) pairs"):
        PackedBatch.from_segments([[2]], 4, segments=[[[(0, 1, 1)]]])
    with pytest.raises(TypeError, match="must hold integers"):
        make_layout(np.array([1.5]), [0, 1], 4)
    with pytest.raises(ValueError, match="row_offsets must start at 0"):
        make_layout(np.array([1, 2]), [0, 1], 4)


def test_from_layout_fast_path_equals_from_lengths():
    """A Layout built from flat arrays gives the same batch as the nested-list constructor."""
    rows, steps = [[3, 2], [5]], [[[1, 2], [2]], [[5]]]
    lay = make_layout(np.array([3, 2, 5]), [0, 2, 3], 6, step_sizes=np.array([1, 2, 2, 5]), step_offsets=[0, 2, 3, 4])
    assert isinstance(lay, Layout) and (lay.num_rows, lay.num_documents) == (2, 3)
    a, b = PackedBatch.from_layout(lay), PackedBatch.from_lengths(rows, 6, step_sizes=steps)
    for name in ("document_ids", "position_ids", "step_ids", "modality_ids", "cu_seqlens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def _layouts():
    """Flat layouts, mostly valid and often broken in one place: a row over capacity, an empty document, offsets
    that decrease or end elsewhere, runs that do not cover their document, a modality out of range."""
    def build(draw):
        docs = draw(st.lists(st.integers(1, 9), min_size=0, max_size=8))
        cuts = sorted(draw(st.lists(st.integers(0, len(docs)), min_size=0, max_size=3)))
        row_offsets = [0, *cuts, len(docs)]
        step_sizes, step_offsets, seg_sizes, seg_mods, seg_offsets = [], [0], [], [], [0]
        for n in docs:
            left = n
            while left:
                k = draw(st.integers(1, left))
                step_sizes.append(k)
                left -= k
            step_offsets.append(len(step_sizes))
            left = n
            while left:
                k = draw(st.integers(1, left))
                seg_sizes.append(k)
                seg_mods.append(draw(st.integers(0, 3)))
                left -= k
            seg_offsets.append(len(seg_sizes))
        capacity = max([sum(docs[a:b]) for a, b in zip(row_offsets, row_offsets[1:])] + [1])
        arrays = [list(docs), row_offsets, step_sizes, step_offsets, seg_mods, seg_sizes, seg_offsets]
        broken = draw(st.integers(-1, len(arrays) + 1))  # -1: none; len: capacity; len + 1: top
        if broken == len(arrays):
            capacity -= 1
        elif 0 <= broken < len(arrays) and arrays[broken]:
            at = draw(st.integers(0, len(arrays[broken]) - 1))
            arrays[broken][at] += draw(st.sampled_from([-2, -1, 1, 5]))
        top = 2 if broken == len(arrays) + 1 else 3
        return arrays, max(capacity, 1), top
    return st.composite(lambda draw: build(draw))()


@pytest.mark.kernels
@settings(max_examples=300, deadline=None)
@given(_layouts(), st.booleans(), st.booleans())
def test_the_compiled_layout_check_accepts_exactly_what_the_numpy_checks_accept(case, steps, segments):
    """_layout_valid (make_layout's checks in one compiled pass) says yes exactly where tests/naive.py's checks
    do and the numpy checks raise nothing; where it says no, make_layout raises the numpy checks' error."""
    from naive import naive_layout_valid

    from mmfeed.packing.metadata import _explain_layout, _layout_valid

    (docs, row_offsets, step_sizes, step_offsets, seg_mods, seg_sizes, seg_offsets), capacity, top = case
    a = [np.array(x, np.int64) for x in (docs, row_offsets, step_sizes, step_offsets, seg_mods, seg_sizes,
                                        seg_offsets)]
    got = _layout_valid(a[0], a[1], capacity, steps, a[2], a[3], segments, a[4], a[5], a[6], top)
    naive = naive_layout_valid(docs, row_offsets, capacity, (step_sizes, step_offsets) if steps else None,
                               (seg_mods, seg_sizes, seg_offsets) if segments else None, top)
    try:
        _explain_layout(a[0], a[1], capacity, a[2] if steps else None, a[3] if steps else None,
                        a[4] if segments else None, a[5] if segments else None, a[6] if segments else None, top)
        raised = None
    except ValueError as err:
        raised = err
    assert got == naive == (raised is None)
    if not got:
        with pytest.raises(ValueError, match=re.escape(str(raised))):
            make_layout(a[0], a[1], capacity, **({"step_sizes": a[2], "step_offsets": a[3]} if steps else {}),
                        **({"segment_modalities": a[4], "segment_lengths": a[5], "segment_offsets": a[6],
                            "num_modalities": top + 1} if segments else {}))
