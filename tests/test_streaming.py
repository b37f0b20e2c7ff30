"""Streaming mode: tar shards read in order without an index, packed online; every sample out exactly once."""

import json
import logging
import os
import platform

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.loaders import ErrorPolicy, Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.stores.index import INDEX_FILENAME
from mmfeed.loaders.streaming.dataset import (
    EPISODE_STRIDE,
    StreamConfig,
    StreamingPackedDataset,
    assign_shards,
    shard_order,
)
from mmfeed.testing import make_episodes, read_index, write_webdataset

CAM = "observation.images.cam_high"
STATE = "observation.state"
SPEC = WindowSpec.from_delta_timestamps({CAM: [-1 / 30, 0.0], STATE: [0.0], "action": [i / 30 for i in range(4)]})
LAYOUT = TokenLayout(tokens_per_frame={CAM: 8})
PER_SHARD = 2


@pytest.fixture(scope="module")
def episodes():
    return make_episodes(5, seed=5, min_length=8, max_length=14, cameras=("cam_high",))


@pytest.fixture(scope="module")
def shards(tmp_path_factory, episodes):
    """Three shards (2, 2, 1 episodes) with the index file deleted: streaming must not need it."""
    out = tmp_path_factory.mktemp("stream")
    write_webdataset(out, episodes, episodes_per_shard=PER_SHARD)
    os.remove(out / INDEX_FILENAME)
    return out


def truth_of(episodes, number):
    """The ground-truth episode behind ``metadata["episode"]`` (shard * stride + position)."""
    return episodes[(number // EPISODE_STRIDE) * PER_SHARD + number % EPISODE_STRIDE]


def per_doc(batch, key, counts):
    return np.split(batch.data[key].numpy(), np.cumsum(counts)[:-1])


def pairs(batches):
    return [(int(e), int(t)) for b in batches for e, t in zip(b.metadata["episode"], b.metadata["start_step"])]


def all_windows(episodes, stride=1):
    return sorted((s // PER_SHARD * EPISODE_STRIDE + s % PER_SHARD, t)
                  for s, ep in enumerate(episodes) for t in range(0, ep.length, stride))


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.document_ids, y.document_ids) and torch.equal(x.step_ids, y.step_ids)
        assert sorted(x.data) == sorted(y.data) and all(torch.equal(x.data[k], y.data[k]) for k in x.data)
        for k in ("sample", "episode", "start_step", "start_time"):
            assert torch.equal(x.metadata[k], y.metadata[k])


def stream(shards, *, window=SPEC, layout=LAYOUT, capacity=128, rows_per_batch=1, static_shapes=False, seed=0,
           config=None, errors=None, **kwargs):
    packing_args = {k: kwargs.pop(k) for k in ("stride", "max_length", "transform") if k in kwargs}
    packing = Packing(layout=layout, window=window, plan=PlanConfig(capacity=capacity, rows_per_batch=rows_per_batch),
                      static_shapes=static_shapes, seed=seed, errors=errors or ErrorPolicy(), **packing_args)
    return StreamingPackedDataset(shards, packing=packing, config=config, **kwargs)


def test_reading_shards_without_any_index_file_works(shards, episodes):
    assert not os.path.exists(shards / INDEX_FILENAME)
    batches = list(stream(str(shards / "shard-{000000..000002}.tar")))
    assert sorted(pairs(batches)) == all_windows(episodes)


def test_windowed_stream_carries_exactly_the_ground_truth_steps(shards, episodes):
    ds = stream(shards, rows_per_batch=2, config=StreamConfig(window_items=12))
    batches = list(ds)
    for k, batch in enumerate(batches):
        n = batch.num_documents
        assert batch.modalities == ["text", CAM, STATE, "action"]
        # Rows hold whole documents within capacity; every batch but the last has rows_per_batch rows.
        assert batch.document_ids.shape[1] == 128 and (batch.document_ids.shape[0] == 2 or k == len(batches) - 1)
        counts = [int((batch.modality_ids == m).sum()) for m in range(4)]
        assert counts[0] == len(batch.data["text"]) and counts[1] == 8 * len(batch.data[CAM])
        assert counts[2] == len(batch.data[STATE]) and counts[3] == len(batch.data["action"])
        frames = per_doc(batch, CAM, [2] * n)
        frame_pads = per_doc(batch, f"{CAM}_is_pad", [2] * n)
        actions, pads = per_doc(batch, "action", [4] * n), per_doc(batch, "action_is_pad", [4] * n)
        proprio = per_doc(batch, STATE, [1] * n)
        for d in range(n):
            e, t = int(batch.metadata["episode"][d]), int(batch.metadata["start_step"][d])
            truth = truth_of(episodes, e)
            assert read_index(frames[d]).tolist() == np.clip([t - 1, t], 0, truth.length - 1).tolist()
            assert frame_pads[d].tolist() == [t == 0, False]
            np.testing.assert_array_equal(proprio[d], truth.state[[t]])
            np.testing.assert_array_equal(actions[d], truth.action[np.clip(t + np.arange(4), 0, truth.length - 1)])
            assert pads[d].tolist() == [t + j >= truth.length for j in range(4)]
            assert float(batch.metadata["start_time"][d]) == pytest.approx(t / truth.fps)
    # Every sample of every episode comes out exactly once, and the counters agree.
    assert sorted(pairs(batches)) == all_windows(episodes)
    stats = ds.stats
    assert stats["samples"] == len(all_windows(episodes)) and stats["oversize"] == 0
    assert stats["batches"] == len(batches) and stats["episodes"] == len(episodes)
    assert stats["tokens"] == sum(int((b.document_ids >= 0).sum()) for b in batches)
    # Episodes are released as their samples go out: never all held at once, none left at the end.
    assert stats["episodes_held"] == 0 and 1 <= stats["episodes_held_max"] < len(episodes)


def test_batches_have_the_structure_of_the_planned_dataset(shards):
    packing = Packing(layout=LAYOUT, window=SPEC, plan=PlanConfig(capacity=128))
    planned = packing.dataset(open_dataset(shards))[0, 0]
    streamed = next(iter(stream(shards)))
    assert streamed.modalities == planned.modalities
    assert sorted(streamed.data) == sorted(planned.data) and sorted(streamed.metadata) == sorted(planned.metadata)
    assert all(streamed.data[k].dtype == planned.data[k].dtype for k in planned.data)
    assert all(type(streamed.metadata[k]) is type(planned.metadata[k]) for k in planned.metadata)


def test_a_stream_delivers_yuv420_frames_as_the_planned_loader_does(shards):
    """frame_format="yuv420" reaches the stream's in-memory sources: I420 planes [n, H * 3 // 2, W], the same
    planes the planned loader delivers for the same first batch."""
    from mmfeed.codecs.colour import yuv420_to_rgb

    streamed = next(iter(stream(shards, frame_format="yuv420")))
    rgb = next(iter(stream(shards)))
    h, w = rgb.data[CAM].shape[1:3]
    assert streamed.data[CAM].shape == (len(rgb.data[CAM]), h * 3 // 2, w)
    back = torch.as_tensor(yuv420_to_rgb(streamed.data[CAM].numpy())).int()
    gap = int((back - torch.as_tensor(rgb.data[CAM]).int()).abs().max())
    assert gap == 0 if platform.machine() in ("x86_64", "AMD64") else gap <= 3  # swscale's x86 arithmetic
    with pytest.raises(ValueError, match="frame_format"):
        stream(shards, frame_format="rgb")


def test_whole_episode_chunks_cover_each_episode(shards, episodes):
    layout = TokenLayout(tokens_per_frame={CAM: 4, STATE: 1, "action": 1}, interleave_chunk=True)
    chunks = {}
    for batch in stream(shards, window=None, layout=layout, max_length=5):
        doc, frame_tokens = batch.document_ids, batch.modality_ids == 1
        counts = [int((frame_tokens & (doc == d)).sum()) // 4 for d in range(batch.num_documents)]
        for d, frames in enumerate(per_doc(batch, CAM, counts)):
            e, start = int(batch.metadata["episode"][d]), int(batch.metadata["start_step"][d])
            assert read_index(frames).tolist() == list(range(start, start + counts[d]))
            chunks.setdefault(e, []).extend(range(start, start + counts[d]))
        assert max(counts) <= 5
    # The chunks of each episode cover it exactly, in steps of at most max_length.
    assert {e: sorted(steps) for e, steps in chunks.items()} == {
        s // PER_SHARD * EPISODE_STRIDE + s % PER_SHARD: list(range(ep.length)) for s, ep in enumerate(episodes)}


def test_sparse_windows_read_only_the_frames_of_their_anchors(shards, episodes):
    ds = stream(shards, window=WindowSpec.from_delta_timestamps({CAM: [0.0], "action": [0.0, 1 / 30]}), stride=4,
                capacity=96)
    batches = list(ds)
    assert sorted(pairs(batches)) == all_windows(episodes, stride=4)
    for batch in batches:
        got = read_index(batch.data[CAM].numpy()).tolist()
        assert got == batch.metadata["start_step"].tolist()
    # One frame per anchor, far fewer than the frames in the shards.
    assert (sum(len(b.data[CAM]) for b in batches) == len(all_windows(episodes, stride=4))
            < sum(e.length for e in episodes))


def test_a_camera_at_its_own_rate_is_aligned_by_time(tmp_path):
    # cam_high records at 15 fps against a 30 fps control clock: step t sees frame t // 2 (latest at or before).
    eps = make_episodes(2, seed=9, min_length=8, max_length=12, cameras=("cam_high",), camera_fps={"cam_high": 15})
    write_webdataset(tmp_path, eps, episodes_per_shard=2)
    os.remove(tmp_path / INDEX_FILENAME)
    seen = 0
    for batch in stream(tmp_path):
        frames = per_doc(batch, CAM, [2] * batch.num_documents)
        for d, t in enumerate(batch.metadata["start_step"].tolist()):
            length = eps[int(batch.metadata["episode"][d])].length
            assert read_index(frames[d]).tolist() == (np.clip([t - 1, t], 0, length - 1) // 2).tolist()
            seen += 1
    assert seen == sum(e.length for e in eps)


def test_worker_processes_together_cover_each_sample_once(shards, episodes):
    ds = stream(shards, rows_per_batch=2)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = pairs(loader)
    assert sorted(got) == all_windows(episodes) and len(got) == len(set(got))


def test_shards_are_dealt_to_rank_times_worker_exactly_once():
    for num_shards, world_size, num_workers in [(7, 2, 3), (3, 1, 2), (12, 4, 1), (2, 2, 2)]:
        order = shard_order(num_shards, seed=1, epoch=3, shuffle=True)
        dealt = [assign_shards(order, rank=r, world_size=world_size, worker=w, num_workers=num_workers)
                 for r in range(world_size) for w in range(num_workers)]
        assert sorted(np.concatenate(dealt).tolist()) == list(range(num_shards))
        for g, mine in enumerate(dealt):  # position i of the order goes to global worker i % total
            assert mine.tolist() == order[g :: world_size * num_workers].tolist()
    # The shuffle is a pure function of (seed, epoch); without it the order is the listed one.
    def order(epoch, shuffle=True):
        return shard_order(9, seed=4, epoch=epoch, shuffle=shuffle).tolist()

    assert order(0) == order(0) and order(0) != order(1) and sorted(order(1)) == order(2, False) == list(range(9))


def test_ranks_split_the_samples_and_steps_per_epoch_evens_their_steps(shards, episodes):
    per_rank = [list(stream(shards, capacity=64, rank=r, world_size=2)) for r in range(2)]
    assert sorted(pairs(per_rank[0]) + pairs(per_rank[1])) == all_windows(episodes)
    steps = [len(b) for b in per_rank]
    assert steps[0] != steps[1]  # 2 shards against 1: uneven in streaming mode
    cap = StreamConfig(steps_per_epoch=min(steps))
    capped = [len(list(stream(shards, capacity=64, config=cap, rank=r, world_size=2))) for r in range(2)]
    assert capped == [min(steps)] * 2


def test_shuffled_shard_order_follows_seed_and_epoch_and_covers_every_sample(shards, episodes):
    # window_items=1: every sample goes out in its own row at once, so batches show the reading order.
    ds = stream(shards, config=StreamConfig(window_items=1, shuffle_shards=True), seed=3)
    orders = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        batches = list(ds)
        assert sorted(pairs(batches)) == all_windows(episodes)
        orders.append(list(dict.fromkeys(e // EPISODE_STRIDE for e, _ in pairs(batches))))
        assert orders[-1] == shard_order(3, seed=3, epoch=epoch, shuffle=True).tolist()
    assert orders[0] != orders[1]


def test_set_epoch_reaches_persistent_workers(shards):
    """Persistent workers keep the copies of the dataset they started with; set_epoch must still reach them:
    each epoch's batches, in order, equal those of workers started afresh for that epoch."""
    config = StreamConfig(window_items=1, shuffle_shards=True)

    def epochs(persistent):
        ds = stream(shards, config=config, seed=3)
        loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
        out = []
        for epoch in range(3):
            ds.set_epoch(epoch)
            out.append(pairs(loader))
        return out

    fresh, persistent = epochs(False), epochs(True)
    assert len({tuple(order) for order in fresh}) > 1  # the shard order does change with the epoch
    assert persistent == fresh


@pytest.mark.parametrize("cut", [1, 4, 9])
def test_resume_continues_with_exactly_the_remaining_batches(shards, cut):
    def build():
        return stream(shards, capacity=96, rows_per_batch=2, config=StreamConfig(window_items=10))

    full = list(build())
    assert len(full) > cut
    first = build()
    it = iter(first)
    head = [next(it) for _ in range(cut)]
    state = json.loads(json.dumps(first.state_dict()))  # plain data, self-contained
    resumed = build()
    resumed.load_state_dict(state)
    assert_same_batches(head + list(resumed), full)
    assert resumed.stats["batches"] == len(full) and resumed.stats["episodes_held"] == 0


def test_oversize_samples_are_counted_and_logged(shards, episodes, caplog):
    # A sample costs len(task) + 21 tokens; capacity 42 fits tasks of up to 21 bytes.
    long_task = [len(truth_of(episodes, e).task.encode()) > 21 for e, _ in all_windows(episodes)]
    assert 0 < sum(long_task) < len(long_task)
    ds = stream(shards, capacity=42)
    with caplog.at_level(logging.WARNING, logger="mmfeed.loaders.streaming"):
        got = pairs(list(ds))
    assert ds.stats["oversize"] == sum(long_task) and len(got) + sum(long_task) == len(long_task)
    assert sorted(got) == [p for p, long in zip(all_windows(episodes), long_task) if not long]
    assert "longer than capacity 42" in caplog.text


def test_the_end_of_the_stream_is_flushed_not_dropped(shards, episodes):
    batches = list(stream(shards, rows_per_batch=10_000))
    assert len(batches) == 1 and sorted(pairs(batches)) == all_windows(episodes)


def test_static_shapes_give_identical_tensor_shapes(shards):
    batches = list(stream(shards, capacity=96, rows_per_batch=2, static_shapes=True))
    shapes = {(tuple(b.cu_seqlens.shape), *((k, tuple(v.shape)) for k, v in sorted(b.data.items()))) for b in batches}
    assert len(shapes) == 1 and len(batches) > 1 and batches[-1].document_ids.shape[0] == 2


def test_bad_settings_are_refused_with_the_fix(shards):
    with pytest.raises(ValueError, match="window_items"):
        StreamConfig(window_items=0)
    with pytest.raises(ValueError, match="no price"):
        list(stream(shards, window=WindowSpec.from_delta_timestamps({CAM: [0.0]}), layout=TokenLayout()))
    with pytest.raises(ValueError, match="does not have"):
        list(stream(shards, window=WindowSpec.from_delta_timestamps({"observation.images.cam_wrist": [0.0]})))
    with pytest.raises(ValueError, match="weights"):
        StreamingPackedDataset(shards, packing=Packing(layout=LAYOUT, window=SPEC, weights=[1.0]))
    with pytest.raises(RuntimeError, match="num_workers=0"):
        stream(shards).state_dict()
    ds = stream(shards)
    next(iter(ds))
    with pytest.raises(ValueError, match="capacity"):
        stream(shards, capacity=64).load_state_dict(ds.state_dict())


def test_an_unreadable_episode_is_named_or_skipped_and_counted(tmp_path, episodes):
    """A corrupt member raises naming shard and key; under the skip policy the rest streams and it is listed."""
    import tarfile

    write_webdataset(tmp_path / "ok", episodes[:2], episodes_per_shard=2)
    broken = tmp_path / "broken"
    broken.mkdir()
    with (tarfile.open(tmp_path / "ok" / "shard-000000.tar") as src,
          tarfile.open(broken / "shard-000000.tar", "w") as out):
        for info in src.getmembers():
            data = src.extractfile(info).read()
            if info.name == "episode_000001.observation.state.npy":
                data = data[:20]  # a truncated array
                info.size = len(data)
            out.addfile(info, __import__("io").BytesIO(data))
    with pytest.raises(ValueError, match=r"shard-000000.tar.*episode_000001.*observation.state"):
        list(stream(broken))
    ds = stream(broken, errors=ErrorPolicy(on_error="skip"))
    loader = DataLoader(ds, batch_size=None)
    got = pairs(loader)
    assert {e for e, _ in got} == {0} and ds.stats["skipped_episodes"] == 1
    assert loader.stats["skipped_samples"] == 1 and "episode_000001" in loader.stats["errors"][0]["source"]


def test_a_stream_takes_read_options_as_open_dataset_does_and_refuses_what_shards_do_not_read(shards):
    from mmfeed.loaders.sources.options import ReadOptions

    by_name = stream(shards, frame_size=(16, 16), frame_format="yuv420")
    given = stream(shards, options=ReadOptions(frame_size=(16, 16), frame_format="yuv420"))
    assert by_name.options == given.options == ReadOptions(frame_size=(16, 16), frame_format="yuv420")
    assert (by_name.backend, by_name.frame_size, by_name.frame_format) == ("auto", (16, 16), "yuv420")
    first, second = next(iter(by_name)), next(iter(given))
    assert first.data[CAM].shape[1:] == (24, 16) and torch.equal(first.data[CAM], second.data[CAM])
    with pytest.raises(ValueError, match="tolerance_s.*does not apply to webdataset shards"):
        stream(shards, tolerance_s=0.01)
    with pytest.raises(ValueError, match="no format takes option 'frame_rate'"):
        stream(shards, frame_rate=10)
    with pytest.raises(ValueError, match=r"\(H, W\)|frame size|size"):
        stream(shards, frame_size=(1, 1))  # checked when the dataset is built, not at the first episode
