"""Attention masks of a PackedBatch: the dense mask, the block tables and the FlexAttention BlockMask.

Rule: query q may attend key k iff both are real tokens of the same document and step[k] <= step[q]; a padding
token attends only to itself.
"""

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torch.nn.functional import scaled_dot_product_attention as sdpa

from mmfeed import PackedBatch
from mmfeed.packing.metadata import block_tables
from mmfeed.testing.strategies import packed_layouts
from flex import eager_flex
from naive import naive_attention_mask, naive_block_tables

LAYOUTS = packed_layouts(max_rows=4, max_capacity=64, max_docs=8)


def materialize(block_mask, mask_mod, capacity):
    """The mask a block-sparse kernel applies: full blocks allow everything, partial blocks ask mask_mod,
    other blocks allow nothing (so wrong block tables show up here even though eager flex ignores them)."""
    bs = block_mask.BLOCK_SIZE[0]
    blocks = block_mask.to_dense().bool()  # [R, 1, nb, nb]: partial or full
    kv_num, kv_idx = block_mask.full_kv_num_blocks, block_mask.full_kv_indices
    full = torch.zeros_like(blocks)
    for r in range(blocks.shape[0]):
        for i in range(blocks.shape[2]):
            full[r, 0, i, kv_idx[r, 0, i, : kv_num[r, 0, i]].long()] = True

    def up(t):  # block level -> token level
        return t.repeat_interleave(bs, -1).repeat_interleave(bs, -2)[..., :capacity, :capacity]

    r, q, k = torch.meshgrid(*(torch.arange(n) for n in (blocks.shape[0], capacity, capacity)), indexing="ij")
    by_mod = mask_mod(r, torch.zeros_like(r), q, k)[:, None]
    return up(full) | (up(blocks) & by_mod)


def test_example_mask():
    """Two causal documents and a padding slot: each sees its own past, padding sees only itself."""
    m = PackedBatch.from_lengths([[2, 1, 1]], 5).attention_mask()[0, 0].int().tolist()
    assert m == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]


@given(LAYOUTS)
@settings(max_examples=50)
def test_dense_mask_equals_written_out_rule(layout):
    """attention_mask() equals the double loop over the rule, shape [R, 1, C, C], dtype bool."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    mask = b.attention_mask()
    assert mask.dtype == torch.bool and mask.shape == (len(rows), 1, capacity, capacity)
    assert mask[:, 0].tolist() == naive_attention_mask(b.document_ids.tolist(), b.step_ids.tolist())


@given(LAYOUTS)
def test_padding_and_real_tokens_never_see_each_other(layout):
    """Real tokens never attend padding, padding never attends real tokens, a padding query attends exactly
    itself, every query attends at least itself, and no SDPA output row is NaN."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    mask = b.attention_mask()[:, 0]
    pad = b.document_ids < 0
    assert not (mask & pad[:, None, :] & ~pad[:, :, None]).any()
    assert not (mask & ~pad[:, None, :] & pad[:, :, None]).any()
    eye = torch.eye(capacity, dtype=torch.bool)
    assert torch.equal(mask & pad[:, :, None], eye & pad[:, :, None])
    assert mask.diagonal(dim1=1, dim2=2).all()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(len(rows), 1, capacity, 4, generator=g) for _ in range(3))
    assert not sdpa(q, k, v, attn_mask=b.attention_mask()).isnan().any()


@pytest.mark.kernels
@given(LAYOUTS, st.sampled_from([1, 3, 8, 16]))
@settings(max_examples=60)
def test_block_tables_equal_naive(layout, block_size):
    """The per-block min/max kernel classifies every tile (empty, partial, full) as the dense mask does,
    including block sizes that do not divide the capacity."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    tables = block_tables(b.document_ids.numpy(), b.step_ids.numpy(), block_size)
    dense = naive_attention_mask(b.document_ids.tolist(), b.step_ids.tolist())
    kv_num, kv_idx, full_num, full_idx = naive_block_tables(dense, block_size)
    assert tables.kv_num_blocks[:, 0].tolist() == kv_num
    assert tables.kv_indices[:, 0].tolist() == kv_idx
    assert tables.full_kv_num_blocks[:, 0].tolist() == full_num
    assert tables.full_kv_indices[:, 0].tolist() == full_idx


@given(LAYOUTS, st.sampled_from([4, 16, 128]))
@settings(max_examples=40)
def test_block_mask_materializes_to_dense_mask(layout, block_size):
    """Full blocks + mask_mod on partial blocks give exactly attention_mask(); the tables equal torch's own
    create_block_mask over the same mask_mod."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    bm = b.block_mask(block_size)
    assert bm.shape == (len(rows), 1, capacity, capacity) and bm.BLOCK_SIZE == (block_size, block_size)
    mod = b.mask_mod(block_size)
    assert torch.equal(materialize(bm, mod, capacity), b.attention_mask())
    ref = create_block_mask(mod, len(rows), 1, capacity, capacity, device="cpu", BLOCK_SIZE=block_size)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        assert torch.equal(getattr(bm, name), getattr(ref, name)), name


@given(LAYOUTS)
@settings(max_examples=25)
def test_flex_attention_equals_sdpa_with_dense_mask(layout):
    """flex_attention with block_mask() gives the output of SDPA with attention_mask() (float64)."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    g = torch.Generator().manual_seed(capacity)
    q, k, v = (torch.randn(len(rows), 2, capacity, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out = eager_flex(q, k, v, b.block_mask(16))
    ref = sdpa(q, k, v, attn_mask=b.attention_mask())
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)


def test_block_mask_sparsity_of_long_causal_and_many_documents():
    """One causal document: kv blocks above the diagonal are empty, below full, on it partial. Many short
    documents: blocks far from the diagonal are empty."""
    b = PackedBatch.from_lengths([[512]], 512)
    t = block_tables(b.document_ids.numpy(), b.step_ids.numpy(), 128)
    assert t.kv_num_blocks[0, 0].tolist() == [1, 1, 1, 1] and t.full_kv_num_blocks[0, 0].tolist() == [0, 1, 2, 3]
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 40, 200)
    lengths = lengths[np.cumsum(lengths) <= 8192].tolist()
    b = PackedBatch.from_lengths([lengths], 8192)
    t = block_tables(b.document_ids.numpy(), b.step_ids.numpy(), 128)
    assert t.kv_num_blocks.max() <= 2 and t.full_kv_num_blocks.max() == 0


def test_bidirectional_blocks_are_full():
    """A bidirectional document spanning whole blocks makes them full in both directions (no mask_mod)."""
    b = PackedBatch.from_lengths([[256, 100]], 384, step_sizes=[[[256], [100]]])
    t = block_tables(b.document_ids.numpy(), b.step_ids.numpy(), 128)
    assert t.full_kv_num_blocks[0, 0].tolist() == [2, 2, 0]
    assert t.kv_num_blocks[0, 0].tolist() == [0, 0, 1]


def test_block_size_validation():
    """A block size < 1 raises ValueError naming it."""
    b = PackedBatch.from_lengths([[3]], 4)
    with pytest.raises(ValueError, match="block_size must be an int >= 1, got 0"):
        b.block_mask(0)


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MMFEED_COMPILE_TESTS") != "1",
                    reason="compiles flex_attention with inductor (about 30 s on CPU); set MMFEED_COMPILE_TESTS=1")
def test_compiled_flex_attention_uses_the_block_tables():
    """Compiled flex_attention skips empty blocks and skips mask_mod on full blocks, so it checks the tables
    themselves: its output equals SDPA with the dense mask, with a capacity that is not a block multiple."""
    rows = [[50, 30, 20, 60], [70, 20, 100], [200]]
    steps = [[[10] * 5, None, [20], None], [[70], None, [25] * 4], [[200]]]
    b = PackedBatch.from_lengths(rows, 200, step_sizes=steps)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 200, 16, generator=g) for _ in range(3))
    out = torch.compile(flex_attention)(q, k, v, block_mask=b.block_mask(128))
    torch.testing.assert_close(out, sdpa(q, k, v, attn_mask=b.attention_mask()), atol=1e-5, rtol=1e-5)


@st.composite
def mixed_rows(draw):
    """Rows of block-causal video documents (frames of equal size per step) and token-causal text, a few hundred
    tokens each, so documents span many blocks."""
    capacity = draw(st.integers(64, 400))
    rows, steps = [], []
    for _ in range(draw(st.integers(1, 2))):
        row, row_steps, left = [], [], capacity
        while left > 0 and draw(st.booleans()):
            if draw(st.booleans()):  # video: frames x tokens per frame, one step per frame
                frame = draw(st.integers(1, 40))
                n = min(draw(st.integers(1, 8)), left // frame)
                if n == 0:
                    break
                row.append(n * frame)
                row_steps.append([frame] * n)
            else:
                n = draw(st.integers(1, left))
                row.append(n)
                row_steps.append(None)
            left -= row[-1]
        rows.append(row)
        steps.append(row_steps)
    return rows, capacity, steps


@pytest.mark.kernels
@given(mixed_rows(), st.sampled_from([4, 16, 32]))
@settings(max_examples=25, deadline=None)
def test_block_tables_of_long_mixed_documents_equal_the_dense_rule(layout, block_size):
    """Documents spanning many blocks (block-causal video and token-causal text mixed): the tables built from
    each block's document span equal the ones read off the dense mask, tile by tile."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    tables = block_tables(b.document_ids.numpy(), b.step_ids.numpy(), block_size)
    dense = b.attention_mask()[:, 0].tolist()
    kv_num, kv_idx, full_num, full_idx = naive_block_tables(dense, block_size)
    assert tables.kv_num_blocks[:, 0].tolist() == kv_num and tables.kv_indices[:, 0].tolist() == kv_idx
    assert tables.full_kv_num_blocks[:, 0].tolist() == full_num and tables.full_kv_indices[:, 0].tolist() == full_idx


@pytest.mark.kernels
def test_block_tables_of_non_contiguous_ids_stay_correct():
    """Id arrays whose documents are not contiguous runs (a document resumed after another, or after padding)
    fall back to comparing every pair of blocks: no block that attends is called empty."""
    doc = np.array([[0] * 8 + [1] * 8 + [0] * 8 + [-1] * 8 + [1] * 8])
    step = np.array([list(range(8)) + list(range(8)) + list(range(8, 16)) + [-1] * 8 + list(range(8, 16))])
    dense = naive_attention_mask(doc.tolist(), step.tolist())
    tables = block_tables(doc, step, 8)
    kv_num, kv_idx, full_num, full_idx = naive_block_tables(dense, 8)
    assert tables.kv_num_blocks[:, 0].tolist() == kv_num and tables.kv_indices[:, 0].tolist() == kv_idx
    assert tables.full_kv_num_blocks[:, 0].tolist() == full_num and tables.full_kv_indices[:, 0].tolist() == full_idx
