"""LeRobot directories read in place from object storage and over HTTP: real servers on 127.0.0.1 (an HTTP
server with range requests and no folder listings, and moto's S3), the same samples as the local copy, videos
read by byte range, and every read (metadata, parquet, videos; the shards' index too) surviving a server that
fails one request in five."""

import threading
from pathlib import Path

import numpy as np
import pytest

from http_server import serve
from s3_server import moto_s3
from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.formats.lerobot.source import LeRobotSource
from mmfeed.loaders.transport.remote import default_cache
from mmfeed.testing import make_episodes, write_lerobot, write_webdataset

CORPUS = Path(__file__).parent / "lerobot_corpus"
NAMES = sorted(p.name for p in CORPUS.iterdir() if (p / "meta" / "info.json").is_file())  # every layout
FPS = 10


def window_of(ds) -> WindowSpec:
    cameras = [f for f, spec in ds.features.items() if spec.kind == "video"]
    return WindowSpec.from_delta_timestamps({**{c: [-1 / FPS, 0.0] for c in cameras}, "observation.state": [0.0],
                                             "action": [0.0, 1 / FPS, 2 / FPS]})


def windows(ds) -> list[dict]:
    view = ds.windows(window_of(ds))
    return [view[i] for i in range(len(view))]


def assert_same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys(), i
        for key in x:
            if key == "task":
                assert x[key] == y[key], (i, key)
            else:
                assert np.array_equal(np.asarray(x[key]), np.asarray(y[key])), (i, key)


@pytest.fixture(scope="module")
def http_corpus():
    with serve(CORPUS) as server:
        yield f"http://127.0.0.1:{server.server_address[1]}", server


@pytest.mark.parametrize("name", NAMES)
def test_a_lerobot_directory_over_http_gives_the_local_samples(http_corpus, name):
    """Over plain HTTP (no folder listing: meta/episodes files are found in LeRobot's order), every window over
    every camera, the state and the action chunk equals the local one, frames bit for bit."""
    base, _ = http_corpus
    remote = open_dataset(f"{base}/{name}")
    local = open_dataset(CORPUS / name)
    assert isinstance(remote, LeRobotSource) and remote.files.remote
    assert remote.lengths.tolist() == local.lengths.tolist() and remote.tasks == local.tasks
    assert remote.features == local.features and remote.stats.keys() == local.stats.keys()
    assert_same(windows(remote), windows(local))


def test_remote_videos_are_read_by_range_not_whole(tmp_path, monkeypatch):
    """With 4 KiB blocks, reading one window from the middle of a video of several episodes fetches the video's
    header (its start and the index at its end) and the groups of pictures the window needs, in PyAV's reads of
    32 KiB: well under half of the file, whatever its size; and the frames equal the local ones."""
    monkeypatch.setenv("MMFEED_REMOTE_BLOCK_BYTES", "4096")
    root = write_lerobot(tmp_path / "long", make_episodes(6, seed=2, min_length=150, max_length=150,
                                                         cameras=("cam",), height=48, width=64))
    local = open_dataset(root)
    spec = WindowSpec.from_delta_timestamps({"observation.images.cam": [-1 / 30, 0.0]})
    middle = len(local.windows(spec)) // 2
    video = "/long/videos/observation.images.cam/chunk-000/file-000.mp4"
    size = (tmp_path / video.lstrip("/")).stat().st_size
    with serve(tmp_path) as server:
        sample = open_dataset(f"http://127.0.0.1:{server.server_address[1]}/long").windows(spec)[middle]
    fetched = sum(n for method, path, n in server.served if path == video)
    assert size > 200_000 and 0 < fetched < size / 2, (fetched, size)
    assert default_cache().block_size == 4096
    assert np.array_equal(sample["observation.images.cam"], local.windows(spec)[middle]["observation.images.cam"])


@pytest.fixture(scope="module")
def s3_corpus():
    """moto's S3 server on 127.0.0.1 holding the corpus directories; the endpoint and credentials are set in the
    environment, where fsspec (s3fs) finds them, as a user's would be."""
    pytest.importorskip("s3fs", reason="s3fs (the dev extra) reads s3:// URLs")
    with moto_s3() as client:
        client.create_bucket(Bucket="robots")
        for name in NAMES:
            for path in (CORPUS / name).rglob("*"):
                if path.is_file():
                    client.upload_file(str(path), "robots", f"{name}/{path.relative_to(CORPUS / name).as_posix()}")
        yield "s3://robots"


@pytest.mark.parametrize("name", NAMES)
def test_a_lerobot_directory_in_s3_gives_the_local_samples(s3_corpus, name):
    remote = open_dataset(f"{s3_corpus}/{name}")
    assert isinstance(remote, LeRobotSource)
    assert_same(windows(remote), windows(open_dataset(CORPUS / name)))


def test_a_lerobot_directory_in_s3_loads_packed_batches_in_workers(s3_corpus):
    """Worker processes read the S3 directory themselves (each with its own filesystem and range cache): the
    packed batches equal the local ones."""
    remote, local = open_dataset(f"{s3_corpus}/chunked"), open_dataset(CORPUS / "chunked")
    assert batches(remote, 2) == batches(local, 0)


def packing_for(ds) -> Packing:
    cameras = {f: 4 for f, spec in ds.features.items() if spec.kind == "video"}
    return Packing(layout=TokenLayout(tokens_per_frame=cameras), window=window_of(ds),
                   plan=PlanConfig(capacity=96, rows_per_batch=2), seed=3)


def batches(ds, num_workers: int) -> list[tuple]:
    """Each batch's sample ids, state and action, as plain lists."""
    loader = DataLoader(ds, packing=packing_for(ds), num_workers=num_workers)
    return [(b.metadata["sample"].tolist(), b.data["observation.state"].numpy().round(6).tolist(),
             b.data["action"].numpy().round(6).tolist()) for b in loader]


def one_in_five():
    """Every fifth request answered 500, whatever it asks for (metadata, index, parquet, video)."""
    lock = threading.Lock()

    def fault(number: int, path: str):
        with lock:
            return "500" if number % 5 == 4 else None

    return fault


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_epoch_through_a_store_that_fails_one_request_in_five_completes(monkeypatch, num_workers):
    """A LeRobot directory over a server failing one request in five, from the first metadata read on: the epoch
    completes with every sample once, equal to the local epoch, the failures retried."""
    monkeypatch.setenv("MMFEED_REMOTE_BLOCK_BYTES", "8192")  # many requests: many failures
    here = open_dataset(CORPUS / "chunked")
    local = batches(here, 0)
    with serve(CORPUS, fault=one_in_five()) as server:
        remote = batches(open_dataset(f"http://127.0.0.1:{server.server_address[1]}/chunked"), num_workers)
    assert len(server.faults) >= 5
    assert {path.split("/")[2] for _, path in server.faults} >= {"meta"}, "metadata reads failed too"
    assert remote == local
    seen = [s for ids, _, _ in remote for s in ids]
    dropped = DataLoader(here, packing=packing_for(here)).dataset.plan(0).dropped.tolist()  # the plan's, by design
    assert sorted(seen + dropped) == list(range(len(here.windows(window_of(here)))))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shards_and_their_index_through_a_store_that_fails_one_request_in_five(tmp_path, monkeypatch, num_workers):
    """Webdataset shards over the same flaky server, the index parquet included: the epoch completes with every
    sample once, equal to the local one."""
    monkeypatch.setenv("MMFEED_REMOTE_BLOCK_BYTES", "8192")
    monkeypatch.setenv("MMFEED_CACHE", str(tmp_path / "cache"))  # the index is read from the server, not a cache
    write_webdataset(tmp_path / "d", make_episodes(4, seed=8, min_length=8, max_length=20, cameras=("cam_high",),
                                                   height=32, width=32), episodes_per_shard=2)
    spec = WindowSpec.from_delta_timestamps({"observation.images.cam_high": [0.0], "observation.state": [0.0],
                                             "action": [0.0, 1 / 30]})
    packing = Packing(layout=TokenLayout(tokens_per_frame={"observation.images.cam_high": 4}), window=spec,
                      plan=PlanConfig(capacity=64, rows_per_batch=2), seed=2)

    def run(ds, workers):
        return [(b.metadata["sample"].tolist(), b.data["observation.state"].numpy().tolist())
                for b in DataLoader(ds, packing=packing, num_workers=workers)]

    here = open_dataset(tmp_path / "d")
    local = run(here, 0)
    with serve(tmp_path, fault=one_in_five()) as server:
        remote = run(open_dataset(f"http://127.0.0.1:{server.server_address[1]}/d/mmfeed-index.parquet"),
                     num_workers)
    assert any(path.endswith(".parquet") for _, path in server.faults), "the index reads failed too"
    assert remote == local
    seen = [s for ids, _ in remote for s in ids]
    dropped = DataLoader(here, packing=packing).dataset.plan(0).dropped.tolist()  # the plan's, by design
    assert sorted(seen + dropped) == list(range(int(here.lengths.sum())))


def test_a_metadata_read_that_fails_every_try_names_the_url_and_the_cause(monkeypatch):
    """A server that answers 500 to every request for info.json: after the last try the error names that URL,
    the tries and the cause (and is not taken for a missing file)."""
    from mmfeed.loaders.transport.remote import RemoteReadError

    monkeypatch.setenv("MMFEED_REMOTE_RETRIES", "2")
    with serve(CORPUS, fault=lambda n, path: "500" if path.endswith("info.json") else None) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/edge"
        with pytest.raises(RemoteReadError, match=r"/edge/meta/info\.json: 2 tries failed; last: .*500"):
            open_dataset(url)
