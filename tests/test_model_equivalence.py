"""End to end: a model trained on packed batches computes exactly what it computes on each document alone.

The tiny transformer of :mod:`mmfeed.testing.model` embeds frames, proprio, actions and text of real packed
batches (webdataset shards read and decoded by mmfeed.DataLoader, and hand-built ``from_segments`` batches).
Invariants, each in float64 to 1e-8:

- every payload item sits in the payload at the place its token slots take in the packed rows (row-major token
  order), which is what lets a model scatter per-modality embeddings into the rows;
- the packed per-document loss sums, hidden states and the gradients of the batch loss equal those of every
  document run alone in a row of exactly its length, with SDPA + ``attention_mask()`` and with FlexAttention +
  ``block_mask()``;
- next-token labels never cross a document boundary (a batch where a crossing label would change the loss);
- the loss is normalised by real label terms: more padding capacity, empty rows, static-shape payload padding
  or moving documents between rows leave the loss and its gradients unchanged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from mmfeed import DataLoader, PackedBatch
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec
from mmfeed.testing import make_episodes, read_index, write_webdataset
from mmfeed.testing.model import TinyModelConfig, TinyWorldModel, rebatch, split_documents, text_targets

from flex import eager_flex

ATOL = 1e-8
EPISODES = dict(num_episodes=3, seed=5, min_length=8, max_length=12, height=32, width=64)
SPEC = WindowSpec(offsets={"frames.cam_high": (-1, 0), "frames.cam_wrist": (0,), "proprio": (-1, 0),
                           "action": tuple(range(4))})
CASES = {
    # LeRobot-style windows, the action chunk one attention step (queried, not fed)
    "window-chunk": (TokenLayout(tokens_per_frame={"cam_high": 4, "cam_wrist": 2}), SPEC, None),
    # one step per action (teacher-forced), several tokens per proprio and action step
    "window-causal": (TokenLayout(tokens_per_frame={"cam_high": 4, "cam_wrist": 2}, tokens_per_proprio_step=2,
                                  tokens_per_action_step=2, causal_actions=True), SPEC, None),
    # whole-episode chunks with the action of each time in that time's block (world-model layout)
    "episode-interleaved": (TokenLayout(tokens_per_frame={"cam_high": 4, "cam_wrist": 1}, causal_actions=True,
                                        interleave_actions=True), None, 5),
}


def block_sparse_attention(q, k, v, block_mask):
    """What a block-sparse kernel computes from ``block_mask``, differentiably (CPU FlexAttention has no
    backward): full blocks attend everywhere, partial blocks ask mask_mod, other blocks nothing."""
    capacity = q.shape[-2]
    bs = block_mask.BLOCK_SIZE[0]
    blocks = block_mask.to_dense().bool()
    full = torch.zeros_like(blocks)
    num, idx = block_mask.full_kv_num_blocks, block_mask.full_kv_indices
    for r in range(blocks.shape[0]):
        for i in range(blocks.shape[2]):
            full[r, 0, i, idx[r, 0, i, : num[r, 0, i]].long()] = True

    def up(t):
        return t.repeat_interleave(bs, -1).repeat_interleave(bs, -2)[..., :capacity, :capacity]

    r, qi, ki = torch.meshgrid(*(torch.arange(n) for n in (blocks.shape[0], capacity, capacity)), indexing="ij")
    allowed = up(full) | (up(blocks) & block_mask.mask_mod(r, torch.zeros_like(r), qi, ki)[:, None])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("equivalence")
    write_webdataset(out, make_episodes(**EPISODES), episodes_per_shard=2)
    return out


_BATCHES: dict = {}


def loader_batches(shards, case, static_shapes=False):
    """Every batch of epoch 0 of ``case`` from mmfeed.DataLoader over the shards (cached per module)."""
    key = (case, static_shapes)
    if key not in _BATCHES:
        layout, window, max_length = CASES[case]
        packing = Packing(layout=layout, window=window, max_length=max_length, static_shapes=static_shapes,
                          plan=PlanConfig(capacity=96, rows_per_batch=2), seed=2)
        _BATCHES[key] = list(DataLoader(shards, packing=packing))
    return _BATCHES[key]


def picked(shards, case):
    """The first batch and the one with the most padded (clamped) action steps."""
    batches = loader_batches(shards, case)
    padded = max(batches, key=lambda b: int(b.data["action_is_pad"].sum()))
    return [batches[0], padded]


def model_for(layout, seed=0, flex=eager_flex, dims=(14, 14)):
    torch.manual_seed(seed)
    config = TinyModelConfig(layout=layout, proprio_dim=dims[0], action_dim=dims[1], width=16, heads=2, depth=2)
    return TinyWorldModel(config, flex_attention=flex).double()


def grads(model, loss):
    params = list(model.parameters())
    got = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, got)]


def assert_grads_close(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=ATOL, rtol=0)


def unpacked(model, batch, layout, attention):
    """Per-document sums, counts and hidden states of every document run alone, and the batch loss they make."""
    sums, counts, hidden = [], [], []
    for one in split_documents(batch, layout):
        out = model.loss(one, attention=attention)
        sums.append(out.document_sum[0])
        counts.append(out.document_count[0])
        hidden.append(model(one, attention=attention)[0])
    sums, counts = torch.stack(sums), torch.stack(counts)
    return sums, counts, hidden, sums.sum() / counts.sum().clamp(min=1)


def packed_hidden_per_document(model, batch, attention):
    h = model(batch, attention=attention)
    doc = batch.document_ids
    return [h[doc == d] for d in range(batch.num_documents)]


def segments_batch():
    """A hand-built batch: text-then-action documents of mixed attention styles, a padding tail and an
    empty row, payloads seeded."""
    g = torch.Generator().manual_seed(3)
    rows = [[9, 6], [], [11]]
    segments = [[[(0, 5), (1, 1), (2, 3)], [(0, 3), (2, 3)]], [], [[(0, 7), (1, 1), (2, 3)]]]
    steps = [[[1] * 5 + [1, 3], [1, 1, 1, 1, 1, 1]], [], [[1] * 7 + [1, 3]]]
    data = {"text": torch.randint(0, 256, (15,), generator=g, dtype=torch.int32),
            "proprio": torch.randn(2, 3, generator=g), "action": torch.randn(9, 2, generator=g),
            "action_is_pad": torch.tensor([0, 0, 1, 0, 0, 0, 0, 0, 1], dtype=torch.bool)}
    b = PackedBatch.from_segments(rows, 18, step_sizes=steps, segments=segments,
                                  modalities=["text", "proprio", "action"], data=data)
    return b, TokenLayout(tokens_per_proprio_step=1)


def expected_items(layout, spec, start, length):
    """The documented token order of one sample: per observed time (sorted) every camera of the layout then
    proprio (then, interleaved, that time's action), then the remaining actions: ``(key, step)`` per item."""
    cameras = ["frames." + c for c in layout.cameras if "frames." + c in spec.offsets]
    observed = cameras + (["proprio"] if "proprio" in spec.offsets else [])
    times = sorted({o for k in observed for o in spec.offsets[k]})
    actions = spec.offsets.get("action", ())
    clamp = lambda o: min(max(start + o, 0), length - 1)  # noqa: E731
    items = []
    for t in times:
        items += [(k, clamp(t)) for k in observed if t in spec.offsets[k]]
        if layout.interleave_actions and t in actions:
            items.append(("action", clamp(t)))
    items += [("action", clamp(o)) for o in actions if not (layout.interleave_actions and o in times)]
    return items


@pytest.mark.parametrize("case", list(CASES))
def test_payload_items_sit_in_token_order(shards, case):
    """The k-th item of every modality's payload is the k-th group of that modality's token slots (row-major):
    walking the documents in order, each document's slots follow the documented layout, and each item is the
    frame (read back from its decoded pixels), proprio or action row of the step that layout puts there."""
    layout, window, _ = CASES[case]
    episodes = make_episodes(**EPISODES)
    for batch in loader_batches(shards, case)[:3]:
        mod, cu = batch.modality_ids.reshape(-1), batch.cu_seqlens.tolist()
        slots = mod[batch.document_ids.reshape(-1) >= 0]  # padding removed: documents back to back
        cursor = {k: 0 for k in batch.data}
        for d in range(batch.num_documents):
            ep = episodes[int(batch.metadata["episode"][d])]
            start = int(batch.metadata["start_step"][d])
            text = np.frombuffer(ep.task.encode(), np.uint8)
            spec = window or WindowSpec(offsets={k: tuple(range(min(5, ep.length - start)))
                                                 for k in ["frames.cam_high", "frames.cam_wrist", "proprio", "action"]})
            items = expected_items(layout, spec, start, ep.length)
            want = ["text"] * len(text) + [k for k, _ in items for _ in range(layout.key_tokens(k))]
            got = [batch.modalities[m] for m in slots[cu[d] : cu[d + 1]].tolist()]
            assert got == want, f"document {d}: slot order differs from the layout"
            c = cursor["text"]
            assert batch.data["text"][c : c + len(text)].numpy().tolist() == text.tolist()
            cursor["text"] += len(text)
            for key, step in items:
                value = batch.data[key][cursor[key]]
                cursor[key] += 1
                if key.startswith("frames."):
                    assert read_index(value.numpy())[0] == step, (d, key, step)
                else:
                    np.testing.assert_array_equal(value.numpy(), getattr(ep, key)[step])
        assert all(cursor[k] == len(batch.data[k]) for k in ("text", "proprio", "action"))


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("case", [*CASES, "segments"])
def test_packed_loss_hidden_states_and_gradients_equal_per_document_runs(shards, case, attention):
    """Per-document loss sums, label counts and hidden states of a packed batch equal each document run alone in
    a row of its own length, and so do the gradients of the batch loss (float64, 1e-8): with SDPA +
    attention_mask(), and with FlexAttention + block_mask() (torch's flex_attention for the forward; on the CPU,
    where it has no backward, gradients through the attention the block mask's tables and mask_mod define)."""
    if case == "segments":
        batch, layout = segments_batch()
        batches, dims = [batch], (3, 2)
    else:
        layout, dims = CASES[case][0], (14, 14)
        batches = picked(shards, case)
    for batch in batches:
        model = model_for(layout, dims=dims)
        with torch.no_grad():  # forward: the real kernels (CPU FlexAttention refuses inputs that need grad)
            out = model.loss(batch, attention=attention)
            sums, counts, hidden, _ = unpacked(model, batch, layout, attention)
            for h_packed, h_alone in zip(packed_hidden_per_document(model, batch, attention), hidden):
                torch.testing.assert_close(h_packed, h_alone, atol=ATOL, rtol=0)
        torch.testing.assert_close(out.document_sum, sums, atol=ATOL, rtol=0)
        assert torch.equal(out.document_count, counts) and int(counts.sum()) > 0
        if attention == "flex":
            model = model_for(layout, flex=block_sparse_attention, dims=dims)
        out = model.loss(batch, attention=attention)
        ref = unpacked(model, batch, layout, attention)[3]
        torch.testing.assert_close(out.loss, ref, atol=ATOL, rtol=0)
        assert_grads_close(grads(model, out.loss), grads(model, ref))


def test_labels_never_cross_document_boundaries():
    """Text documents packed back to back: a label from the last token of one document to the first of the next
    would change the loss (a document-blind shift does), but the model's labels stay inside each document and
    its loss equals the per-document one."""
    g = torch.Generator().manual_seed(7)
    rows, capacity = [[5, 4, 3], [6, 2]], 14
    batch = PackedBatch.from_segments(rows, capacity, data={"text": torch.randint(0, 256, (20,), generator=g)})
    layout = TokenLayout()
    valid, target = text_targets(batch)
    doc = batch.document_ids
    assert int(valid.sum()) == sum(n - 1 for row in rows for n in row)
    assert not (valid[:, :-1] & (doc[:, :-1] != doc[:, 1:])).any()
    model = model_for(layout)
    out = model.loss(batch)
    ref = unpacked(model, batch, layout, "sdpa")[3]
    torch.testing.assert_close(out.loss, ref, atol=ATOL, rtol=0)
    assert_grads_close(grads(model, out.loss), grads(model, ref))
    # the document-blind shift: every text slot followed by a text slot of the same row gets a label
    text = batch.modality_ids == 0
    blind = torch.zeros_like(valid)
    blind[:, :-1] = text[:, :-1] & text[:, 1:]
    ids = torch.zeros(batch.num_rows * capacity, dtype=torch.int64)
    ids[text.reshape(-1)] = batch.data["text"].long()
    blind_target = torch.zeros_like(target)
    blind_target[:, :-1] = ids.view(batch.num_rows, capacity)[:, 1:]
    h = model(batch)
    blind_loss = F.cross_entropy(model.text_head(h[blind]), blind_target[blind])
    assert int(blind.sum()) == int(valid.sum()) + 3  # three document boundaries inside rows
    assert abs(float(blind_loss.detach()) - float(out.loss.detach())) > 1e-3


@pytest.mark.parametrize("case", ["window-causal", "episode-interleaved"])
def test_loss_is_normalised_by_real_labels_not_padding(shards, case):
    """The label count is (text ids - 1) + real action steps per document, computed from the payload flags; more
    capacity, an empty row, static-shape payload padding and documents moved between rows leave the loss and
    its gradients unchanged."""
    layout = CASES[case][0]
    batch = picked(shards, case)[1]
    model = model_for(layout)
    out = model.loss(batch)
    # independent count: per document, text ids - 1 and the actions not flagged as clamped padding
    cu = batch.cu_seqlens.tolist()
    real_tokens = batch.document_ids.reshape(-1) >= 0
    mods = batch.modality_ids.reshape(-1)[real_tokens]
    k = layout.tokens_per_action_step
    pads, a = batch.data["action_is_pad"], 0
    want = []
    for d in range(batch.num_documents):
        span = mods[cu[d] : cu[d + 1]]
        n_text, n_act = int((span == 0).sum()), int((span == batch.modalities.index("action")).sum()) // k
        want.append(n_text - 1 + int((~pads[a : a + n_act]).sum()))
        a += n_act
    assert out.document_count.tolist() == want
    assert int(pads.sum()) > 0 or CASES[case][1] is None  # windows clamp at episode ends; chunks never do
    torch.testing.assert_close(out.loss, out.document_sum.sum() / sum(want), atol=ATOL, rtol=0)
    reference = grads(model, out.loss)
    n = batch.num_documents
    rows = [list(range(n)), [], []]  # everything in one long row, two empty rows
    variants = [rebatch(batch, layout, rows, int(batch.cu_seqlens[-1]) + 37),
                rebatch(batch, layout, [[d] for d in reversed(range(n))], batch.max_seqlen + 5)]
    static = loader_batches(shards, case, static_shapes=True)
    same = [s for s in static if torch.equal(s.metadata["sample"], batch.metadata["sample"])]
    assert len(same) == 1 and len(same[0].data["action"]) > len(batch.data["action"])
    variants.append(same[0])
    for other in variants:
        again = model.loss(other)
        torch.testing.assert_close(again.loss, out.loss, atol=ATOL, rtol=0)
        assert int(again.document_count.sum()) == sum(want)
        assert_grads_close(grads(model, again.loss), reference)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flex_attention_gradients_on_cuda(shards):
    """On a GPU, FlexAttention's own backward gives the per-document gradients too (float64, 1e-8)."""
    layout = CASES["window-chunk"][0]
    batch = picked(shards, "window-chunk")[0].to("cuda")
    model = model_for(layout, flex=flex_attention).cuda()
    out = model.loss(batch, attention="flex")
    ref = unpacked(model, batch, layout, "flex")[3]
    torch.testing.assert_close(out.loss, ref, atol=ATOL, rtol=0)
    assert_grads_close(grads(model, out.loss), grads(model, ref))
