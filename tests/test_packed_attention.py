"""A packed attention pass equals the per-document unpacked passes; PackedBatch moves between devices whole."""

import pickle

import pytest
import torch
from hypothesis import given, settings
from torch.nn.functional import scaled_dot_product_attention as sdpa

from mmfeed import PackedBatch
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec
from mmfeed.loaders.sources.arrays import ArraySource
from mmfeed.testing import make_episodes
from mmfeed.testing.strategies import packed_layouts

from flex import eager_flex

HEADS, DIM = 2, 8
CAM = "observation.images.cam_high"


def unpacked_reference(q, k, v, rows, step_sizes):
    """Attention of every document on its own, the document's mask built from its step sizes alone:
    token-causal documents use SDPA's is_causal, others step[k] <= step[q] within the document."""
    out = torch.zeros_like(q)
    for r, row in enumerate(rows):
        t = 0
        for n, sizes in zip(row, step_sizes[r]):
            sl = slice(t, t + n)
            dq, dk, dv = q[r : r + 1, :, sl], k[r : r + 1, :, sl], v[r : r + 1, :, sl]
            if all(s == 1 for s in sizes):
                out[r, :, sl] = sdpa(dq, dk, dv, is_causal=True)[0]
            else:
                step = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
                out[r, :, sl] = sdpa(dq, dk, dv, attn_mask=step[None, :] <= step[:, None])[0]
            t += n
    return out


def random_qkv(rows, capacity, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(len(rows), HEADS, capacity, DIM, generator=g, dtype=torch.float64) for _ in range(3)]


def check_packed_equals_unpacked(rows, capacity, steps, seed=0, batch=None):
    b = PackedBatch.from_lengths(rows, capacity, step_sizes=steps) if batch is None else batch
    q, k, v = random_qkv(rows, capacity, seed)
    ref = unpacked_reference(q, k, v, rows, steps)
    real = (b.document_ids >= 0)[:, None, :, None].expand_as(q)
    dense = sdpa(q, k, v, attn_mask=b.attention_mask())
    flex = eager_flex(q, k, v, b.block_mask(16))
    torch.testing.assert_close(dense[real], ref[real], atol=1e-10, rtol=0)
    torch.testing.assert_close(flex[real], ref[real], atol=1e-10, rtol=0)
    # a padding query attends only to itself, so its output is its own value vector
    torch.testing.assert_close(dense[~real], v[~real], atol=1e-12, rtol=0)
    torch.testing.assert_close(flex[~real], v[~real], atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "kind",
    ["token-causal", "block-causal", "bidirectional", "mixed"],
)
def test_packed_pass_equals_per_document_passes(kind):
    """Packing token-causal, block-causal (4-token frames) and bidirectional documents into rows changes
    nothing: each real token's output equals the one from its document attended alone (float64, 1e-10)."""
    rows = [[7, 13, 9], [20], [12, 5, 6, 1]]
    styles = {
        "token-causal": lambda n: [1] * n,
        "block-causal": lambda n: [4] * (n // 4) + ([n % 4] if n % 4 else []),
        "bidirectional": lambda n: [n],
    }
    names = list(styles)
    steps = [[styles[names[(r + d) % 3] if kind == "mixed" else kind](n) for d, n in enumerate(row)]
             for r, row in enumerate(rows)]
    check_packed_equals_unpacked(rows, 40, steps)


@given(packed_layouts(max_rows=3, max_capacity=48, max_docs=6))
@settings(max_examples=30)
def test_packed_pass_equals_per_document_passes_on_random_layouts(layout):
    """The same equality on random layouts: any capacity, empty rows, documents of every attention style."""
    rows, capacity, steps = layout
    check_packed_equals_unpacked(rows, capacity, steps, seed=capacity)


def runs(values):
    """Lengths of the runs of equal consecutive values."""
    cut = [i for i in range(1, len(values)) if values[i] != values[i - 1]]
    return [b - a for a, b in zip([0, *cut], [*cut, len(values)])]


def test_a_loader_batch_attends_as_its_documents_alone():
    """A v2 batch as the planned dataset packs it (text, a 15 fps camera beside a 30 Hz clock in 4-token frames,
    the state, a one-step action chunk): its own attention_mask() and block_mask() give each real token what its
    document attended alone gives, the document's mask rebuilt from its step sizes alone; and to() moves every
    feature's payload and is_pad flags, keyed by feature name."""
    eps = make_episodes(3, seed=1, min_length=6, max_length=9, cameras=("cam_high",), height=16, width=32,
                        camera_fps={"cam_high": 15.0})
    src = ArraySource([{**e.features(), "task": e.task, "fps": e.fps, "rates": e.rates()} for e in eps])
    spec = WindowSpec.from_delta_timestamps({CAM: [-1 / 15, 0.0], "observation.state": [0.0],
                                             "action": [0.0, 1 / 30, 2 / 30]})
    packing = Packing(layout=TokenLayout(tokens_per_frame={CAM: 4}), window=spec,
                      plan=PlanConfig(capacity=96, rows_per_batch=2))
    b = packing.dataset(src)[0, 0]
    doc, step = b.document_ids.tolist(), b.step_ids.tolist()
    rows = [runs([d for d in row if d >= 0]) for row in doc]
    steps = [[runs([s for s, d in zip(step[r], doc[r]) if d == g]) for g in sorted({d for d in doc[r] if d >= 0})]
             for r in range(len(doc))]
    assert max(len(row) for row in rows) > 1 and {4, 5, 3} <= {s for row in steps for d in row for s in d}
    check_packed_equals_unpacked(rows, b.capacity, steps, seed=5, batch=b)
    moved = b.to("meta")
    assert set(moved.data) == set(b.data) >= {CAM, f"{CAM}_is_pad", "action", "action_is_pad", "text"}
    assert all(v.device.type == "meta" for v in moved.data.values())


def test_to_moves_every_tensor_and_keeps_max_seqlen_an_int():
    """to() returns a new PackedBatch with ids, cu_seqlens, data and metadata tensors converted; max_seqlen
    stays a Python int and the original is untouched."""
    b = PackedBatch.from_segments([[3, 2]], 6, segments=[[[(0, 3)], [(1, 2)]]], modalities=["text", "action"],
                                  data={"action": torch.ones(2, 4)}, metadata={"episode": torch.tensor([4, 9])})
    moved = b.to("meta")
    assert moved is not b and type(moved.max_seqlen) is int and moved.max_seqlen == 3
    for t in (moved.document_ids, moved.position_ids, moved.step_ids, moved.modality_ids, moved.cu_seqlens,
              moved.data["action"], moved.metadata["episode"]):
        assert t.device.type == "meta"
    assert b.document_ids.device.type == "cpu" and b.data["action"].device.type == "cpu"
    assert moved.modalities == ["text", "action"] and moved.capacity == 6
    again = b.to(torch.device("cpu"), non_blocking=True)
    assert torch.equal(again.document_ids, b.document_ids)


def test_block_mask_of_moved_batch_needs_no_device_copy_back():
    """block_mask() of a moved batch is computed from host copies of the ids and lives on the batch's device."""
    b = PackedBatch.from_lengths([[5, 3], [7]], 8).to("meta")
    bm = b.block_mask(4)
    assert bm.kv_num_blocks.device.type == "meta" and bm.shape == (2, 1, 8, 8)


def test_pickle_round_trip_keeps_everything():
    """A batch sent from a worker process (pickled) comes back equal, payloads and masks included."""
    b = PackedBatch.from_segments([[3, 2], [4]], 5, step_sizes=[[[3], None], [[2, 2]]],
                                  data={"text": torch.arange(9)}, metadata={"keys": ["a", "b", "c"]})
    c = pickle.loads(pickle.dumps(b))
    for name in ("document_ids", "position_ids", "step_ids", "modality_ids", "cu_seqlens"):
        assert torch.equal(getattr(c, name), getattr(b, name)), name
    assert (c.max_seqlen, c.modalities, c.metadata) == (b.max_seqlen, b.modalities, b.metadata)
    assert torch.equal(c.data["text"], b.data["text"])
    assert torch.equal(c.block_mask(2).to_dense(), b.block_mask(2).to_dense())
    assert c.to("meta").block_mask(2).full_kv_num_blocks.device.type == "meta"

def test_between_processes_small_tensors_go_in_the_pickle_and_shared_ones_by_handle():
    """What a worker sends: ids, masks and metadata inside the pickle (no shared-memory file each), payloads
    already in shared memory by handle (their memory is not copied), dtypes numpy lacks through torch."""
    import io
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's reductions, as a worker has them)

    frames = torch.arange(2 << 20, dtype=torch.uint8).share_memory_()
    b = PackedBatch.from_segments([[3, 2], [4]], 5, data={"text": torch.arange(9), CAM: frames,
                                                          "half": torch.ones(4, dtype=torch.bfloat16)},
                                  metadata={"sample": torch.tensor([7, 8, 9]), "keys": ["a", "b", "c"]})
    buf = io.BytesIO()
    ForkingPickler(buf, pickle.HIGHEST_PROTOCOL).dump(b)
    payload = buf.getvalue()
    assert b.position_ids.numpy().tobytes() in payload  # by value
    assert len(payload) < 64 << 10  # and not the 2 MiB of frames
    c = pickle.loads(payload)
    assert torch.equal(c.position_ids, b.position_ids) and c.position_ids.dtype == torch.int64
    assert torch.equal(c.metadata["sample"], b.metadata["sample"]) and c.metadata["keys"] == ["a", "b", "c"]
    assert c.data[CAM].data_ptr() == frames.data_ptr()  # the same memory, mapped once
    assert c.data["half"].dtype == torch.bfloat16 and torch.equal(c.data["half"], b.data["half"])
    assert torch.equal(c.data["text"], b.data["text"]) and not c.data["text"].is_shared()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pin_memory_then_cuda():
    """pin_memory() pins every tensor, data included; to('cuda', non_blocking=True) then carries equal values."""
    b = PackedBatch.from_segments([[3]], 4, data={"text": torch.arange(3)})
    pinned = b.pin_memory()
    assert pinned.document_ids.is_pinned() and pinned.data["text"].is_pinned() and pinned.cu_seqlens.is_pinned()
    on_gpu = pinned.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert on_gpu.document_ids.is_cuda and torch.equal(on_gpu.document_ids.cpu(), b.document_ids)
    assert type(on_gpu.max_seqlen) is int
