"""End to end: a model trained on packed batches computes exactly what it computes on each document alone.

The tiny transformer of :mod:`mmfeed.testing.model` embeds every feature of real packed batches by its own name
(videos, state, actions, rewards and text read and decoded by mmfeed.DataLoader from webdataset shards, with a
15 fps camera beside a 30 Hz control clock, and hand-built ``from_segments`` batches). Invariants, each in float64
to 1e-8:

- every payload item sits in the payload at the place its token slots take in the packed rows (row-major token
  order), which is what lets a model scatter per-feature embeddings into the rows, and it is the frame (read back
  from its decoded pixels) or step of its feature at the time the layout puts there, with its ``_is_pad`` flag;
- the packed per-document loss sums, hidden states and the gradients of the batch loss equal those of every
  document run alone in a row of exactly its length, with SDPA + ``attention_mask()`` and with FlexAttention +
  ``block_mask()`` (which also agree with each other);
- next-token labels never cross a document boundary (a batch where a crossing label would change the loss);
- the loss is normalised by real label terms: more padding capacity, empty rows, static-shape payload padding
  or moving documents between rows leave the loss and its gradients unchanged.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from mmfeed import DataLoader, PackedBatch
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.sources.arrays import ArraySource
from mmfeed.testing import make_episodes, read_index, write_webdataset
from mmfeed.testing.model import (TinyModelConfig, TinyWorldModel, model_features, rebatch, split_documents,
                                  text_targets)
from mmfeed.testing.synth_episodes import IMAGE_PREFIX

from flex import eager_flex

ATOL = 1e-8
CAM, WRIST, STATE = "observation.images.cam_high", "observation.images.cam_wrist", "observation.state"
EPISODES = dict(num_episodes=3, seed=5, min_length=8, max_length=12, height=32, width=64,
                camera_fps={"cam_high": 15.0})
WINDOW = {CAM: [-1 / 15, 0.0], WRIST: [0.0], STATE: [-1 / 30, 0.0], "action": [i / 30 for i in range(4)]}
CASES = {
    # LeRobot-style windows, the action chunk one attention step (queried, not fed)
    "window-chunk": (TokenLayout(tokens_per_frame={CAM: 4, WRIST: 2}), WindowSpec.from_delta_timestamps(WINDOW),
                     None),
    # one step per chunk frame (teacher-forced), several tokens per state and action step, and a second chunk
    # feature: the scalar reward of the next two steps
    "window-causal": (TokenLayout(tokens_per_frame={CAM: 4, WRIST: 2, STATE: 2, "action": 2},
                                  chunk_features=("action", "next.reward"), causal_chunk=True),
                      WindowSpec.from_delta_timestamps({**WINDOW, "next.reward": [1 / 30, 2 / 30]}), None),
    # whole-episode chunks with the action of each time in that time's block (world-model layout), a bool
    # scalar feature observed beside the state
    "episode-interleaved": (TokenLayout(tokens_per_frame={CAM: 4, WRIST: 1, STATE: 1, "action": 1, "next.done": 1},
                                        causal_chunk=True, interleave_chunk=True), None, 4),
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
def source(tmp_path_factory):
    out = tmp_path_factory.mktemp("equivalence")
    write_webdataset(out, make_episodes(**EPISODES), episodes_per_shard=2)
    return open_dataset(out)


def array_source():
    eps = make_episodes(**EPISODES)
    return ArraySource([{**e.features(), "task": e.task, "fps": e.fps, "rates": e.rates()} for e in eps])


_BATCHES: dict = {}
_ARRAYS: dict = {}


def loader_batches(source, case, static_shapes=False):
    """Every batch of epoch 0 of ``case`` from mmfeed.DataLoader over the source (cached per source)."""
    key = (id(source), case, static_shapes)
    if key not in _BATCHES:
        layout, window, max_length = CASES[case]
        packing = Packing(layout=layout, window=window, max_length=max_length, static_shapes=static_shapes,
                          plan=PlanConfig(capacity=128, rows_per_batch=2), seed=2)
        _BATCHES[key] = (source, list(DataLoader(source, packing=packing)))
    return _BATCHES[key][1]


def picked(source, case):
    """The first batch and the one with the most padded (clamped) action steps."""
    batches = loader_batches(source, case)
    padded = max(batches, key=lambda b: int(b.data["action_is_pad"].sum()))
    return [batches[0], padded]


def model_for(layout, features, seed=0, flex=eager_flex):
    torch.manual_seed(seed)
    config = TinyModelConfig(layout=layout, features=features, width=16, heads=2, depth=2)
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
            STATE: torch.randn(2, 3, generator=g), "action": torch.randn(9, 2, generator=g),
            "action_is_pad": torch.tensor([0, 0, 1, 0, 0, 0, 0, 0, 1], dtype=torch.bool)}
    b = PackedBatch.from_segments(rows, 18, step_sizes=steps, segments=segments,
                                  modalities=["text", STATE, "action"], data=data)
    return b, TokenLayout(), {STATE: (3,), "action": (2,)}


def rate_and_frames(ep, feature):
    """A feature's exact rate and frame count in a synthetic episode (cameras at their own rates)."""
    if feature.startswith(IMAGE_PREFIX):
        camera = feature[len(IMAGE_PREFIX):]
        return Fraction(ep.camera_fps[camera]), ep.num_frames(camera)
    return Fraction(ep.fps), ep.length


def frame_times(ep, feature, start, stop):
    """Exact times (from the chunk's first step) of the frames of ``feature`` in steps ``[start, stop)``: those
    in ``[start / fps, stop / fps)``, the episode's last chunk up to its end."""
    rate, frames = rate_and_frames(ep, feature)
    clock = Fraction(ep.fps)
    j1 = frames if stop >= ep.length else math.ceil(Fraction(stop) / clock * rate)
    return {j: Fraction(j) / rate - Fraction(start) / clock for j in range(math.ceil(start / clock * rate), j1)}


def expected_items(ep, layout, window, start, length):
    """The documented token order of one sample, derived in exact arithmetic: per observed time (sorted) its
    features in the sample's feature order (then, interleaved, that time's chunk frames), then the remaining chunk
    frames feature by feature. ``(feature, frame index, is_pad)`` per item."""
    pieces = {}  # feature -> [(time, frame index, is_pad)] in read order
    if window is not None:
        clock, last = Fraction(ep.fps), Fraction(ep.length - 1) / Fraction(ep.fps)
        for feature, deltas in window.deltas.items():
            rate, frames = rate_and_frames(ep, feature)
            out = []
            for d in deltas:
                tau = Fraction(start) / clock + Fraction(d).limit_denominator(1000)
                out.append((tau, min(max(math.floor(tau * rate), 0), frames - 1), not 0 <= tau <= last))
            pieces[feature] = out
    else:
        for feature in layout.tokens_per_frame:
            pieces[feature] = [(t, j, False) for j, t in frame_times(ep, feature, start, start + length).items()]
    observed = [f for f in pieces if f not in layout.chunk_features]
    chunk = [f for f in pieces if f in layout.chunk_features]
    times = sorted({t for f in observed for t, _, _ in pieces[f]})
    items = []
    for t in times:
        items += [(f, j, p) for f in observed for s, j, p in pieces[f] if s == t]
        if layout.interleave_chunk:
            items += [(f, j, p) for f in chunk for s, j, p in pieces[f] if s == t]
    items += [(f, j, p) for f in chunk for s, j, p in pieces[f] if not (layout.interleave_chunk and s in times)]
    return items


@pytest.mark.parametrize("kind", ["shards", "arrays"])
@pytest.mark.parametrize("case", list(CASES))
def test_payload_items_sit_in_token_order(source, case, kind):
    """The k-th item of every feature's payload is the k-th group of that feature's token slots (row-major):
    walking the documents in order, each document's slots follow the documented layout, and each item is the
    frame (read back from its decoded pixels, the 15 fps camera at its own rate) or the step of the feature that
    layout puts there, flagged in ``<feature>_is_pad`` exactly where its time lies outside the episode."""
    layout, window, _ = CASES[case]
    episodes = make_episodes(**EPISODES)
    src = source if kind == "shards" else _ARRAYS.setdefault("src", array_source())
    assert src.lengths.tolist() == [ep.length for ep in episodes]
    for batch in loader_batches(src, case)[:3]:
        mod, cu = batch.modality_ids.reshape(-1), batch.cu_seqlens.tolist()
        slots = mod[batch.document_ids.reshape(-1) >= 0]  # padding removed: documents back to back
        cursor = {k: 0 for k in batch.data}
        for d in range(batch.num_documents):
            ep = episodes[int(batch.metadata["episode"][d])]
            start = int(batch.metadata["start_step"][d])
            text = np.frombuffer(ep.task.encode(), np.uint8)
            length = min(CASES[case][2] or 1, ep.length - start)
            items = expected_items(ep, layout, window, start, length)
            want = ["text"] * len(text) + [f for f, _, _ in items for _ in range(layout.tokens(f))]
            got = [batch.modalities[m] for m in slots[cu[d] : cu[d + 1]].tolist()]
            assert got == want, f"document {d}: slot order differs from the layout"
            c = cursor["text"]
            assert batch.data["text"][c : c + len(text)].numpy().tolist() == text.tolist()
            cursor["text"] += len(text)
            for feature, frame, pad in items:
                value = batch.data[feature][cursor[feature]]
                assert bool(batch.data[f"{feature}_is_pad"][cursor[feature]]) == pad, (d, feature, frame)
                cursor[feature] += 1
                if feature.startswith(IMAGE_PREFIX):
                    assert read_index(value.numpy())[0] == frame, (d, feature, frame)
                else:
                    np.testing.assert_array_equal(value.numpy(), ep.arrays()[feature][frame])
        assert set(batch.data) == {"text"} | {k for f in batch.modalities[1:] for k in (f, f"{f}_is_pad")}
        for f in batch.modalities:  # every item walked, nothing left over
            assert cursor[f] == len(batch.data[f]) and (f == "text" or len(batch.data[f"{f}_is_pad"]) == cursor[f])


@pytest.mark.parametrize("attention", ["sdpa", "flex"])
@pytest.mark.parametrize("case", [*CASES, "segments"])
def test_packed_loss_hidden_states_and_gradients_equal_per_document_runs(source, case, attention):
    """Per-document loss sums, label counts and hidden states of a packed batch equal each document run alone in
    a row of its own length, and so do the gradients of the batch loss (float64, 1e-8): with SDPA +
    attention_mask(), and with FlexAttention + block_mask() (torch's flex_attention for the forward, equal to
    SDPA's; on the CPU, where it has no backward, gradients through the attention the block mask's tables and
    mask_mod define)."""
    if case == "segments":
        batch, layout, features = segments_batch()
        batches = [batch]
    else:
        layout, features = CASES[case][0], model_features(source)
        batches = picked(source, case)
    for batch in batches:
        model = model_for(layout, features)
        with torch.no_grad():  # forward: the real kernels (CPU FlexAttention refuses inputs that need grad)
            out = model.loss(batch, attention=attention)
            sums, counts, hidden, _ = unpacked(model, batch, layout, attention)
            for h_packed, h_alone in zip(packed_hidden_per_document(model, batch, attention), hidden):
                torch.testing.assert_close(h_packed, h_alone, atol=ATOL, rtol=0)
            if attention == "flex":
                torch.testing.assert_close(out.document_sum, model.loss(batch).document_sum, atol=ATOL, rtol=0)
        torch.testing.assert_close(out.document_sum, sums, atol=ATOL, rtol=0)
        assert torch.equal(out.document_count, counts) and int(counts.sum()) > 0
        assert all(int(out.chunk_count[f]) > 0 for f in layout.chunk_features if f in batch.modalities)
        if attention == "flex":
            model = model_for(layout, features, flex=block_sparse_attention)
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
    model = model_for(layout, {})
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
def test_loss_is_normalised_by_real_labels_not_padding(source, case):
    """The label count is (text ids - 1) + real chunk items of every chunk feature per document, computed from
    the payload flags; more capacity, an empty row, static-shape payload padding and documents moved between
    rows leave the loss and its gradients unchanged."""
    layout, window, _ = CASES[case]
    batch = picked(source, case)[1]
    model = model_for(layout, model_features(source))
    out = model.loss(batch)
    # independent count: per document, text ids - 1 and the chunk items not flagged as clamped padding
    cu = batch.cu_seqlens.tolist()
    mods = batch.modality_ids.reshape(-1)[batch.document_ids.reshape(-1) >= 0]
    chunk = [f for f in layout.chunk_features if f in batch.modalities]
    first = {f: 0 for f in chunk}
    want = []
    for d in range(batch.num_documents):
        span = mods[cu[d] : cu[d + 1]]
        labels = int((span == 0).sum()) - 1
        for f in chunk:
            n = int((span == batch.modalities.index(f)).sum()) // layout.tokens(f)
            labels += int((~batch.data[f"{f}_is_pad"][first[f] : first[f] + n]).sum())
            first[f] += n
        want.append(labels)
    assert out.document_count.tolist() == want
    pads = sum(int(batch.data[f"{f}_is_pad"].sum()) for f in chunk)
    assert pads > 0 or window is None  # windows clamp at episode ends; chunks never do
    torch.testing.assert_close(out.loss, out.document_sum.sum() / sum(want), atol=ATOL, rtol=0)
    reference = grads(model, out.loss)
    n = batch.num_documents
    rows = [list(range(n)), [], []]  # everything in one long row, two empty rows
    variants = [rebatch(batch, layout, rows, int(batch.cu_seqlens[-1]) + 37),
                rebatch(batch, layout, [[d] for d in reversed(range(n))], batch.max_seqlen + 5)]
    static = loader_batches(source, case, static_shapes=True)
    same = [s for s in static if torch.equal(s.metadata["sample"], batch.metadata["sample"])]
    assert len(same) == 1 and len(same[0].data["action"]) > len(batch.data["action"])
    variants.append(same[0])
    for other in variants:
        again = model.loss(other)
        torch.testing.assert_close(again.loss, out.loss, atol=ATOL, rtol=0)
        assert int(again.document_count.sum()) == sum(want)
        assert_grads_close(grads(model, again.loss), reference)


def test_config_and_batches_the_model_cannot_embed_raise_naming_the_feature(source):
    """A feature the config does not list, a video chunk feature and a malformed step shape are refused with
    the feature's name."""
    layout = CASES["window-chunk"][0]
    batch = picked(source, "window-chunk")[0]
    model = model_for(layout, model_features(source, [STATE, "action"]))
    with pytest.raises(ValueError, match="observation.images.cam_high"):
        model.loss(batch)
    with pytest.raises(ValueError, match="chunk feature 'observation.images.cam_high' is a video"):
        TinyModelConfig(layout=TokenLayout(chunk_features=(CAM,)), features={CAM: (32, 64, 3)})
    with pytest.raises(ValueError, match=r"features\['action'\]"):
        TinyModelConfig(layout=layout, features={"action": 14})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_flex_attention_gradients_on_cuda(source):
    """On a GPU, FlexAttention's own backward gives the per-document gradients too (float64, 1e-8)."""
    layout = CASES["window-chunk"][0]
    batch = picked(source, "window-chunk")[0].to("cuda")
    model = model_for(layout, model_features(source), flex=flex_attention).cuda()
    out = model.loss(batch, attention="flex")
    ref = unpacked(model, batch, layout, "flex")[3]
    torch.testing.assert_close(out.loss, ref, atol=ATOL, rtol=0)
    assert_grads_close(grads(model, out.loss), grads(model, ref))


def test_yuv420_batches_train_the_model_as_their_rgb_frames_do(tmp_path):
    """The same shards opened with frame_format="yuv420": the model's features are the RGB frames, it converts
    the planes on the batch's device, and the loss equals the RGB batches' (bit-exact conversion on x86)."""
    import platform

    out = tmp_path / "shards"
    write_webdataset(out, make_episodes(**EPISODES), episodes_per_shard=2)
    rgb, yuv = open_dataset(out), open_dataset(out, frame_format="yuv420")
    assert model_features(yuv) == model_features(rgb)
    layout, window, max_length = CASES["window-chunk"]
    packing = Packing(layout=layout, window=window, max_length=max_length, plan=PlanConfig(capacity=128,
                                                                                            rows_per_batch=2), seed=2)
    a, b = next(iter(DataLoader(rgb, packing=packing))), next(iter(DataLoader(yuv, packing=packing)))
    assert b.data[CAM].shape[1:] == (a.data[CAM].shape[1] * 3 // 2, a.data[CAM].shape[2])
    model = model_for(layout, model_features(rgb))
    la, lb = model.loss(a).loss, model.loss(b).loss
    if platform.machine() in ("x86_64", "AMD64"):
        assert torch.equal(la, lb)
    else:
        torch.testing.assert_close(la, lb, rtol=0.05, atol=0)
