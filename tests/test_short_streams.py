"""Real recordings, end to end on real files: a 15 fps camera beside a 50 Hz clock that ended a frame early, or
ran on after the last step. Such a stream is written and indexed with the frames it holds, read by ds.windows,
by the packed loader and as whole-episode chunks with the missing frame flagged and read as the last real one,
and priced as a full stream. Shards written with webdataset's own TarWriter index and read the same way."""

import io
import json
import math

import numpy as np
import pytest
import webdataset

from mmfeed import DataLoader
from mmfeed.cli import main as cli_main
from mmfeed.codecs import encode_video
from mmfeed.loaders import Packing, PlanConfig, ShardWriter, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.planned.items import EpisodeItems
from mmfeed.loaders.sources.arrays import ArraySource
from mmfeed.loaders.stores.index import INDEX_FILENAME, build_index, feature_columns, read_shard_index
from mmfeed.loaders.transport.tar import iter_shard
from mmfeed.packing.windows import frames_at_rate
from mmfeed.testing import frame_pattern, read_index

CAM = "observation.images.cam_high"
FPS, CAM_FPS = 50.0, 15.0
DELTAS = [-1 / 15, 0.0, 2 / 15]  # the last one asks past the episode's end near it
SPEC = WindowSpec.from_delta_timestamps({CAM: DELTAS, "observation.state": [0.0]})
# steps, camera frames held: 48 steps imply 15 frames (one short: 14), 37 imply 11 (ran on: 13), 40 imply 12
EPISODES = ((48, 14), (37, 13), (40, 12))
IMPLIED = [int(frames_at_rate(n, FPS, CAM_FPS)) for n, _ in EPISODES]
HELD = [held for _, held in EPISODES]


def _features(length: int, frames: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"observation.state": rng.standard_normal((length, 3)).astype(np.float32),
            CAM: frame_pattern(frames, height=48, width=64)}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("short")
    with ShardWriter(out, gop=5, episodes_per_shard=2) as writer:
        for e, (length, frames) in enumerate(EPISODES):
            writer.write(_features(length, frames, e), fps=FPS, rates={CAM: CAM_FPS}, task="wipe")
    return out, writer


@pytest.fixture(scope="module")
def dataset(written):
    return open_dataset(written[0])


def expected(t: int, e: int) -> tuple[list[int], list[bool]]:
    """The camera frames window ``t`` of episode ``e`` reads, written out: the latest implied frame at or before
    each asked time (clamped into the episode), padding outside it or where the stream lacks that frame, which
    then reads the stream's last frame."""
    length = EPISODES[e][0]
    frames, pads = [], []
    for d in DELTAS:
        tau = t / FPS + d
        j = min(max(math.floor((tau + 1e-4) * CAM_FPS), 0), IMPLIED[e] - 1)
        pads.append(tau < -1e-4 or tau > (length - 1) / FPS + 1e-4 or j >= HELD[e])
        frames.append(min(j, HELD[e] - 1))
    return frames, pads


def test_the_frame_count_is_the_streams_own_everywhere(written, dataset):
    """meta.json, the parquet index, source.frames and the decoded episode all hold the frames the stream has."""
    out, writer = written
    assert IMPLIED == [15, 11, 12]
    meta = [m for shard in writer.shards for _, _, m in iter_shard(shard)]
    assert [m["features"][CAM]["frames"] for m in meta] == HELD
    columns = feature_columns(read_shard_index(out / INDEX_FILENAME))
    assert columns[CAM]["frames"].tolist() == HELD
    assert dataset.frames(CAM).tolist() == HELD
    for e in range(len(EPISODES)):
        assert read_index(dataset.episode(e)[CAM]).tolist() == list(range(HELD[e]))


def test_windows_flag_the_missing_frame_and_read_the_last_real_one(dataset):
    view = dataset.windows(SPEC)
    assert len(view) == sum(n for n, _ in EPISODES)
    flagged = 0
    for i in range(len(view)):
        item = view[i]
        e, t = item["episode_index"], item["frame_index"]
        frames, pads = expected(t, e)
        assert read_index(item[CAM].numpy()).tolist() == frames, (e, t)
        assert item[f"{CAM}_is_pad"].tolist() == pads, (e, t)
        flagged += e == 0 and pads[1]  # the anchor time itself has no frame
    # Near the end of the short episode: the anchor 47 (0.94 s) asks for frame 14, which the stream lacks.
    last = view[EPISODES[0][0] - 1]
    assert last[f"{CAM}_is_pad"].tolist() == [False, True, True]
    assert read_index(last[CAM].numpy()).tolist() == [13, 13, 13]
    assert flagged == 1
    # The stream that ran on: frames 11 and 12 lie after its last step and are never read.
    ran_on = view[EPISODES[0][0] + EPISODES[1][0] - 1]
    assert read_index(ran_on[CAM].numpy()).tolist() == [9, 10, 10]
    assert ran_on[f"{CAM}_is_pad"].tolist() == [False, False, True]


def test_the_packed_loader_delivers_the_same_flags(dataset):
    packing = Packing(layout=TokenLayout(tokens_per_frame={CAM: 4}), window=SPEC,
                      plan=PlanConfig(capacity=128, rows_per_batch=2))
    loader = DataLoader(dataset, packing=packing, num_workers=1)
    seen = set()
    for batch in loader:
        frames = read_index(batch.data[CAM].numpy()).reshape(-1, len(DELTAS))
        pads = batch.data[f"{CAM}_is_pad"].numpy().reshape(-1, len(DELTAS))
        for d, (e, t) in enumerate(zip(batch.metadata["episode"].tolist(), batch.metadata["start_step"].tolist())):
            want, want_pad = expected(t, e)
            assert frames[d].tolist() == want and pads[d].tolist() == want_pad, (e, t)
            seen.add((e, t))
    assert len(seen) + len(loader.dataset.plan(0).dropped) == sum(n for n, _ in EPISODES)
    assert (0, EPISODES[0][0] - 1) in seen


def test_whole_episode_chunks_read_the_implied_frames_priced_as_a_full_stream(dataset):
    """A chunk holds the frames the clock implies: the one the short stream lacks is its last frame, flagged; the
    frames a long stream holds after its last step are in no chunk; prices are a full stream's."""
    layout = TokenLayout(tokens_per_frame={CAM: 4})
    full = ArraySource([{**_features(n, IMPLIED[e], e), "fps": FPS, "rates": {CAM: CAM_FPS}, "task": "wipe"}
                        for e, (n, _) in enumerate(EPISODES)])
    assert EpisodeItems(dataset, layout=layout).table.tokens.tolist() == \
        EpisodeItems(full, layout=layout).table.tokens.tolist()
    loader = DataLoader(dataset, packing=Packing(layout=layout, plan=PlanConfig(capacity=256, rows_per_batch=1)))
    seen = []
    for batch in loader:
        got = read_index(batch.data[CAM].numpy()).tolist()
        pads = batch.data[f"{CAM}_is_pad"].tolist()
        for e in batch.metadata["episode"].tolist():  # each episode's frames in turn, in document order
            implied = range(IMPLIED[e])
            assert got[:len(implied)] == [min(j, HELD[e] - 1) for j in implied]
            assert pads[:len(implied)] == [j >= HELD[e] for j in implied]
            got, pads = got[len(implied):], pads[len(implied):]
            seen.append(e)
        assert got == [] and pads == []
    assert sorted(seen) == [0, 1, 2]


def test_the_writer_refuses_a_stream_two_frame_periods_short(tmp_path):
    """The boundary, on real mp4s: 48 steps imply 15 frames; 14 are kept (above), 13 are refused, as frames to
    encode and as mp4 bytes, naming the feature, the counts and the rule. The array source agrees."""
    with ShardWriter(tmp_path) as writer:
        for value in (frame_pattern(13, height=48, width=64), encode_video(frame_pattern(13, height=48, width=64),
                                                                           fps=CAM_FPS)):
            with pytest.raises(ValueError) as err:
                writer.write({**_features(48, 1), CAM: value}, fps=FPS, rates={CAM: CAM_FPS})
            message = str(err.value)
            assert f"feature {CAM!r}: 13 frames" in message and "need 15" in message
            assert "at least 14" in message and "one frame period early" in message
        writer.write({**_features(48, 1), CAM: encode_video(frame_pattern(14, height=48, width=64), fps=CAM_FPS)},
                     fps=FPS, rates={CAM: CAM_FPS})
    assert open_dataset(tmp_path).frames(CAM).tolist() == [14]
    with pytest.raises(ValueError, match=rf"feature {CAM!r}: 13 frames.*need 15.*at least 14"):
        ArraySource([{**_features(48, 13), "fps": FPS, "rates": {CAM: CAM_FPS}}])


def _hand_written_shard(path, frames: int) -> str:
    """One episode written with webdataset's own TarWriter: a meta.json with fps, length, task and rates only
    (no features list), so the index probes the mp4 for its frame count."""
    buffer = io.BytesIO()
    np.save(buffer, np.arange(48, dtype=np.float32)[:, None])
    meta = {"fps": FPS, "length": 48, "task": "wipe", "rates": {CAM: CAM_FPS}}
    with open(path, "wb") as f, webdataset.TarWriter(f) as tar:
        tar.write({"__key__": "ep_a", f"{CAM}.mp4": encode_video(frame_pattern(frames, height=48, width=64),
                                                                  fps=CAM_FPS, gop=4),
                   "observation.state.npy": buffer.getvalue(), "meta.json": json.dumps(meta).encode()})
    return str(path)


def test_mmfeed_index_of_tarwriter_shards_keeps_the_true_count(tmp_path):
    shard = _hand_written_shard(tmp_path / "hand-000000.tar", 14)
    assert cli_main(["index", shard]) == 0
    assert feature_columns(read_shard_index(tmp_path / INDEX_FILENAME))[CAM]["frames"].tolist() == [14]
    ds = open_dataset(tmp_path)
    assert ds.frames(CAM).tolist() == [14]
    last = ds.windows(SPEC)[47]
    assert last[f"{CAM}_is_pad"].tolist() == [False, True, True]
    assert read_index(last[CAM].numpy()).tolist() == [13, 13, 13]
    short = _hand_written_shard(tmp_path / "short.tar", 13)
    with pytest.raises(ValueError) as err:
        build_index([short])
    message = str(err.value)
    assert short in message and f"ep_a.{CAM}.mp4" in message and f"feature {CAM!r}: 13 frames" in message
    assert "need 15" in message and "at least 14" in message
