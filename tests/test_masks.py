"""Attention masks of a PackedBatch: the dense mask, the block tables and the FlexAttention BlockMask.

Rule: query q may attend key k iff both are real tokens of the same document and step[k] <= step[q]; a padding
token attends only to itself.
"""

import os

import numba
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.array_utils import byte_bounds
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
from torch.nn.functional import scaled_dot_product_attention as sdpa

from mmfeed import PackedBatch
from mmfeed.packing.metadata import block_tables, document_metadata, layout_from_rows, transpose_tables
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


def compact_reference(dense, block_size):
    """naive_block_tables with every index list cut to its table's width (the most blocks any query block of
    the batch lists, at least 1): the compact tables block_tables stores."""
    kv_num, kv_idx, full_num, full_idx = naive_block_tables(dense, block_size)

    def cut(num, idx):
        width = max([1] + [n for row in num for n in row])
        return [[listed[:width] for listed in row] for row in idx]

    return kv_num, cut(kv_num, kv_idx), full_num, cut(full_num, full_idx)


def naive_block_mask(mask, block_size):
    """blocks[r][qb][kb]: some pair of the tile may attend (slots past C never do), the block-level dense mask
    BlockMask.to_dense() gives."""
    out = []
    for m in mask:
        c = len(m)
        nb = max(1, -(-c // block_size))
        out.append([[any(m[q][k] for q in range(qb * block_size, min(c, (qb + 1) * block_size))
                         for k in range(kb * block_size, min(c, (kb + 1) * block_size)))
                     for kb in range(nb)] for qb in range(nb)])
    return out


def storage_bytes(view):
    """Bytes of memory an array's elements span (its storage, not its shape times its itemsize)."""
    low, high = byte_bounds(view)
    return high - low


def assert_tables_equal_naive(tables, dense, block_size):
    """The counts equal the naive ones; compact() equals the naive tables cut to width; the [R, 1, nb, nb]
    tables torch reads start each row with those entries and span only R * nb * width (+ nb) int32 entries."""
    kv_num, kv_idx, full_num, full_idx = compact_reference(dense, block_size)
    compact = tables.compact()
    assert tables.kv_num_blocks[:, 0].tolist() == kv_num and compact.kv_indices[:, 0].tolist() == kv_idx
    assert tables.full_kv_num_blocks[:, 0].tolist() == full_num and compact.full_kv_indices[:, 0].tolist() == full_idx
    rows, nb = len(kv_num), len(kv_num[0])
    for view, cut in ((tables.kv_indices, compact.kv_indices), (tables.full_kv_indices, compact.full_kv_indices)):
        width = cut.shape[-1]
        assert view.shape == (rows, 1, nb, nb) and view.dtype == np.int32 and cut.dtype == np.int32
        assert np.array_equal(view[..., :width], cut) and np.shares_memory(view, cut)
        assert storage_bytes(view) == 4 * (rows * nb * width + nb - width)


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
    including block sizes that do not divide the capacity, and stores the compact tables."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    tables = block_tables(b.document_ids.numpy(), b.step_ids.numpy(), block_size)
    dense = naive_attention_mask(b.document_ids.tolist(), b.step_ids.tolist())
    assert_tables_equal_naive(tables, dense, block_size)


@given(LAYOUTS, st.sampled_from([4, 16, 128]))
@settings(max_examples=40)
def test_block_mask_materializes_to_dense_mask(layout, block_size):
    """Full blocks + mask_mod on partial blocks give exactly attention_mask(); the tables equal torch's own
    create_block_mask over the same mask_mod: counts, the kv indices in its order cut to the compact width
    (the entries past it are unused), the transposed q tables torch derives, and to_dense()."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    bm = b.block_mask(block_size)
    assert bm.shape == (len(rows), 1, capacity, capacity) and bm.BLOCK_SIZE == (block_size, block_size)
    mod = b.mask_mod(block_size)
    assert torch.equal(materialize(bm, mod, capacity), b.attention_mask())
    ref = create_block_mask(mod, len(rows), 1, capacity, capacity, device="cpu", BLOCK_SIZE=block_size)
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")):
        assert torch.equal(getattr(bm, num), getattr(ref, num)), num
        width = max(1, int(getattr(bm, num).max()))
        assert torch.equal(getattr(bm, idx)[..., :width], getattr(ref, idx)[..., :width]), idx
    for num, idx in (("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        assert torch.equal(getattr(bm, num), getattr(ref, num)), num  # transposed by mmfeed, same as torch's
        width = max(1, int(getattr(bm, num).max()))
        assert torch.equal(getattr(bm, idx)[..., :width], getattr(ref, idx)[..., :width]), idx
    assert torch.equal(bm.to_dense(), ref.to_dense())


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


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("MMFEED_COMPILE_TESTS") != "1",
                    reason="compiles flex_attention with inductor (about 30 s on CPU); set MMFEED_COMPILE_TESTS=1")
def test_compiled_flex_attention_reads_the_compact_tables():
    """16 blocks per row whose query blocks list at most 8 kv blocks: the compiled kernel walks the strided
    [R, 1, nb, nb] view of the compact tables (rows 7 and 8 entries apart) and gives SDPA's output."""
    rows = [[300, 500, 256, 700, 200], [1024, 512, 400]]
    steps = [[None, [100] * 5, [128, 128], None, [50] * 4], [[256] * 4, None, [40] * 10]]
    b = PackedBatch.from_lengths(rows, 2000, step_sizes=steps)
    bm = b.block_mask(128)
    assert bm.kv_indices.shape == (2, 1, 16, 16) and bm.kv_indices.stride()[-2] < 16
    assert bm.full_kv_indices.stride()[-2] < 16
    assert bm.q_indices.stride()[-2] < 16 and bm.full_q_indices.stride()[-2] < 16  # transposed compact too
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 2000, 16, generator=g) for _ in range(3))
    # static shapes: recompiling for a second shape with dynamic ones hits an inductor C++ codegen error
    # ("cur_kvSplitSize8 was not declared") in torch 2.13, with [nb, nb] tables as well; the backward pass (the
    # one reader of the q tables) is GPU-only in torch 2.13: "FlexAttention does not support backward on CPU"
    out = torch.compile(flex_attention, dynamic=False)(q, k, v, block_mask=bm)
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


@pytest.mark.slow  # dense masks of long rows as the reference
@pytest.mark.kernels
@given(mixed_rows(), st.integers(1, 48))
@settings(max_examples=40, deadline=None)
def test_block_tables_of_long_mixed_documents_equal_the_dense_rule(layout, block_size):
    """Documents spanning many blocks (block-causal video and token-causal text mixed), any block size: the
    tables built from each block's document span equal the ones read off the dense mask, tile by tile; the
    BlockMask torch builds from them gives the dense rule's blocks (to_dense) and, with mask_mod on the
    partial ones, exactly attention_mask()."""
    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    tables = block_tables(b.document_ids.numpy(), b.step_ids.numpy(), block_size)
    dense = b.attention_mask()[:, 0].tolist()
    assert_tables_equal_naive(tables, dense, block_size)
    bm = BlockMask.from_kv_blocks(*(torch.from_numpy(t) for t in tables), BLOCK_SIZE=block_size,
                                  mask_mod=b.mask_mod(block_size), seq_lengths=(capacity, capacity))
    assert bm.to_dense()[:, 0].bool().tolist() == naive_block_mask(dense, block_size)
    assert torch.equal(materialize(bm, bm.mask_mod, capacity), b.attention_mask())
    assert torch.equal(b.block_mask(block_size).to_dense(), bm.to_dense())


@pytest.mark.kernels
def test_block_tables_of_non_contiguous_ids_stay_correct():
    """Id arrays whose documents are not contiguous runs (a document resumed after another, or after padding)
    fall back to comparing every pair of blocks: no block that attends is called empty."""
    doc = np.array([[0] * 8 + [1] * 8 + [0] * 8 + [-1] * 8 + [1] * 8])
    step = np.array([list(range(8)) + list(range(8)) + list(range(8, 16)) + [-1] * 8 + list(range(8, 16))])
    dense = naive_attention_mask(doc.tolist(), step.tolist())
    tables = block_tables(doc, step, 8)
    assert_tables_equal_naive(tables, dense, 8)


def long_mixed_row(capacity, seed):
    """One row filled with documents of 64-4096 tokens, alternately token-causal text and block-causal video of
    256-token frames; its document and step ids and the longest document."""
    lengths, steps = long_mixed_documents(capacity, seed)
    meta = document_metadata(layout_from_rows([lengths], capacity, step_sizes=[steps]))
    return meta.document_ids, meta.step_ids, max(lengths)


def long_mixed_documents(capacity, seed):
    """The documents of :func:`long_mixed_row`: their lengths and step sizes (None: token-causal)."""
    rng = np.random.default_rng(seed)
    lengths, steps = [], []
    while True:
        video = len(lengths) % 2 == 1
        n = int(rng.integers(64, 4097))
        n = max(256, n // 256 * 256) if video else n
        if sum(lengths) + n > capacity:
            break
        lengths.append(n)
        steps.append([256] * (n // 256) if video else None)
    return lengths, steps


def tile_kinds(doc, step, q_block, block_size):
    """Kind of every kv block for one query block, read off the token-level rule (numpy), keys restricted to the
    documents of the query block's tokens (no other key may attend): {kv block: 1 partial, 2 full}."""
    nb = -(-doc.shape[0] // block_size)
    qs = np.arange(q_block * block_size, min(doc.shape[0], (q_block + 1) * block_size))
    real = doc[qs] >= 0
    keys = np.flatnonzero(np.isin(doc, doc[qs][real])) if real.any() else np.zeros(0, np.int64)
    keys = np.union1d(keys, qs)
    allowed = (doc[qs][:, None] == doc[keys][None, :]) & (step[keys][None, :] <= step[qs][:, None])
    allowed &= real[:, None]
    allowed |= qs[:, None] == keys[None, :]
    kinds = {}
    for kb in np.unique(keys // block_size):
        cols = (keys // block_size) == kb
        tile = np.zeros((block_size, block_size), bool)  # slots past C never attend
        tile[: len(qs), (keys[cols] - kb * block_size)] = allowed[:, cols]
        if tile.any():
            kinds[int(kb)] = 2 if tile.all() else 1
    assert all(0 <= k < nb for k in kinds)
    return kinds


@pytest.mark.kernels
def test_block_tables_of_a_million_token_row_take_o_blocks_bytes():
    """One row of 2**20 tokens (2**16 under NUMBA_DISABLE_JIT) of mixed text and video documents, block 128:
    each table spans nb * width + nb int32 entries, width at most the blocks two of the longest documents
    cover, not nb * nb; sampled query blocks list exactly the tiles the token-level rule gives."""
    capacity = 2**16 if numba.config.DISABLE_JIT else 2**20
    doc, step, longest = long_mixed_row(capacity, seed=0)
    t = block_tables(doc, step, 128)
    nb = capacity // 128
    span = 2 * (-(-longest // 128) + 1)  # a block holds the end of one document and the start of the next
    assert t.kv_num_blocks.shape == t.full_kv_num_blocks.shape == (1, 1, nb)
    assert t.kv_indices.shape == t.full_kv_indices.shape == (1, 1, nb, nb)
    c = t.compact()
    total = 0
    for num, view, cut in ((t.kv_num_blocks, t.kv_indices, c.kv_indices),
                           (t.full_kv_num_blocks, t.full_kv_indices, c.full_kv_indices)):
        width = cut.shape[-1]
        assert width == max(1, int(num.max())) and width <= span
        assert storage_bytes(view) == 4 * (nb * width + nb - width)
        total += storage_bytes(view) + num.nbytes
    assert total <= 4 * nb * (2 * span + 4)  # O(blocks): 4.5 MB at 2**20 tokens, where [nb, nb] tables take 537 MB
    rng = np.random.default_rng(1)
    for q in rng.choice(nb, 48, replace=False):
        kinds = tile_kinds(doc[0], step[0], int(q), 128)
        partial = sorted(k for k, v in kinds.items() if v == 1)
        full = sorted(k for k, v in kinds.items() if v == 2)
        assert t.kv_indices[0, 0, q, : t.kv_num_blocks[0, 0, q]].tolist() == partial, q
        assert t.full_kv_indices[0, 0, q, : t.full_kv_num_blocks[0, 0, q]].tolist() == full, q


@pytest.mark.kernels
@given(mixed_rows(), st.integers(1, 48))
@settings(max_examples=40, deadline=None)
def test_transposed_tables_equal_torchs_transpose(layout, block_size):
    """The query-block tables mmfeed transposes (the backward pass reads them) equal torch's own
    ``_transpose_ordered`` of the kv tables: counts, and indices up to the compact width."""
    from torch.nn.attention.flex_attention import _transpose_ordered

    rows, capacity, steps = layout
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps)
    tables = block_tables(b.document_ids.numpy(), b.step_ids.numpy(), block_size)
    q = transpose_tables(tables)
    for num, idx, q_num, q_idx in ((tables[0], tables[1], q[0], q[1]), (tables[2], tables[3], q[2], q[3])):
        want_num, want_idx = _transpose_ordered(torch.from_numpy(num), torch.from_numpy(np.ascontiguousarray(idx)))
        assert np.array_equal(q_num, want_num.numpy())
        width = max(1, int(q_num.max()))
        assert np.array_equal(np.ascontiguousarray(q_idx)[..., :width], want_idx.numpy()[..., :width])


def test_a_million_token_block_mask_builds_with_compact_tables_both_ways():
    """PackedBatch.block_mask() of one 2**20-token row (2**16 under NUMBA_DISABLE_JIT): the q tables come
    compact too (torch's transpose would build a dense [nb, nb] grid), and they are the transpose of the kv
    tables on sampled blocks."""
    capacity = 2**16 if numba.config.DISABLE_JIT else 2**20
    lengths, steps = long_mixed_documents(capacity, seed=2)
    bm = PackedBatch.from_lengths([lengths], capacity, step_sizes=[steps]).block_mask(128)
    nb = capacity // 128
    for num, idx in ((bm.q_num_blocks, bm.q_indices), (bm.full_q_num_blocks, bm.full_q_indices)):
        width = max(1, int(num.max()))
        assert idx.shape == (1, 1, nb, nb) and storage_bytes(idx.numpy()) == 4 * (nb * width + nb - width)
    kv_num, kv_idx = bm.kv_num_blocks[0, 0].numpy(), bm.kv_indices[0, 0].numpy()
    q_num, q_idx = bm.q_num_blocks[0, 0].numpy(), bm.q_indices[0, 0].numpy()
    for j in np.random.default_rng(3).choice(nb, 32, replace=False):
        listing = [q for q in range(nb) if j in kv_idx[q, : kv_num[q]].tolist()]
        assert q_idx[j, : q_num[j]].tolist() == listing, j
