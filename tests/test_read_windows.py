"""A batch of windows read in one call (``EpisodeSource.read_windows``: the LeRobot reader's array gathers per data
file and frame requests per video file; the RLDS reader's step arrays and one pass over the batch's pictures)
gives, byte for byte, the batches the request-by-request path gives, on the datasets real LeRobot and TFDS wrote
(tests/lerobot_corpus: data and videos over several files and chunks, row groups, 1-step episodes;
tests/rlds_corpus: JPEG and PNG cameras, several shards), in process and from worker processes; and where the
batch fails, the request path reads it again, so the error names the request and the error policy applies as
before."""

import shutil
from pathlib import Path

import pytest
import torch

from house_digest import digest_of
from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.formats.lerobot.source import LeRobotSource
from mmfeed.loaders.formats.rlds.source import RldsSource
from mmfeed.loaders.planned.errors import ErrorPolicy
from mmfeed.loaders.transport.errors import SampleError

CORPUS = Path(__file__).parent / "lerobot_corpus"
RLDS = Path(__file__).parent / "rlds_corpus" / "mmfeed_rlds_corpus" / "1.0.0"
LAYOUTS = ["chunked", "edge", "rowgroups", "v21", "rlds"]


def loader(root, *, workers: int = 0, errors: ErrorPolicy | None = None) -> DataLoader:
    """Windows of every camera (two frames) and every numeric step array (the anchor and the next two steps) of
    ``root``, shuffled, eight a batch."""
    source = open_dataset(root, **({"fps": 10} if Path(root).name == "1.0.0" else {}))
    once = set(getattr(source, "episode_features", []))  # RLDS's episode_metadata: one value an episode
    cameras = [f for f, feat in source.features.items() if feat.kind == "video"]
    arrays = [f for f, feat in source.features.items() if feat.kind == "array" and f not in once]
    step = 1 / float(source.fps[0])
    window = WindowSpec.from_delta_timestamps({**{c: [-step, 0.0] for c in cameras},
                                               **{a: [0.0, step, 2 * step] for a in arrays}})
    packing = Packing(layout=TokenLayout(tokens_per_frame=dict.fromkeys(cameras, 4)), window=window, seed=3,
                      plan=PlanConfig(mode="fixed", batch_size=8, shuffle=True), errors=errors or ErrorPolicy())
    return DataLoader(source, packing=packing, num_workers=workers)


def epoch(loader: DataLoader) -> list[tuple]:
    """Each batch's digest (its public fields, tensors by bytes) and the order of its data and metadata keys."""
    return [(digest_of(batch), list(batch.data), list(batch.metadata)) for batch in loader]


def spied(monkeypatch, source: type) -> list:
    """Each batch's read in one call by ``source``'s reader: True (read), False (left to the request path) or
    "raised"."""
    calls = []
    read = source.read_windows

    def counted(self, windows, buffer):
        calls.append("raised")
        got = read(self, windows, buffer)
        calls[-1] = got is not None
        return got

    monkeypatch.setattr(source, "read_windows", counted)
    return calls


@pytest.fixture
def one_call(monkeypatch):
    return spied(monkeypatch, LeRobotSource)


@pytest.fixture
def one_call_rlds(monkeypatch):
    return spied(monkeypatch, RldsSource)


def request_by_request(monkeypatch) -> None:
    for source in (LeRobotSource, RldsSource):
        monkeypatch.setattr(source, "read_windows", lambda self, windows, buffer: None)


@pytest.mark.parametrize("name", LAYOUTS)
def test_windows_read_in_one_call_equal_those_read_request_by_request(name, one_call, one_call_rlds, monkeypatch):
    root = RLDS if name == "rlds" else CORPUS / name
    fast = epoch(loader(root))
    calls = one_call_rlds if name == "rlds" else one_call
    assert calls and all(c is True for c in calls)
    request_by_request(monkeypatch)
    assert epoch(loader(root)) == fast


@pytest.mark.parametrize("root", [CORPUS / "chunked", RLDS], ids=["lerobot", "rlds"])
def test_windows_read_in_one_call_in_worker_processes(root, monkeypatch):
    """From workers, frames decoded straight into pooled shared-memory buffers: the same batches again."""
    fast = epoch(loader(root, workers=2))
    request_by_request(monkeypatch)
    assert epoch(loader(root)) == fast


@pytest.mark.parametrize("root", [CORPUS / "chunked", RLDS], ids=["lerobot", "rlds"])
def test_a_batch_read_in_one_call_makes_no_per_sample_reads(root, monkeypatch):
    """The samples of a batch of windows come to collation as arrays (WindowSamples): a batch read in one call is
    laid out from them without a SampleRead or a request made per sample; the request path makes them once a
    batch."""
    from mmfeed.loaders.planned.reads import WindowSamples

    made = []
    reads = WindowSamples.reads

    def counted(self):
        made.append(len(self))
        return reads(self)

    monkeypatch.setattr(WindowSamples, "reads", counted)
    batches = len(epoch(loader(root)))
    assert batches > 2 and made == []
    request_by_request(monkeypatch)
    assert len(epoch(loader(root))) == batches and len(made) == batches and made[0] == 8


@pytest.fixture
def broken(tmp_path):
    """The chunked corpus with its first video file cut short: the episodes in it cannot all be decoded."""
    root = tmp_path / "chunked"
    shutil.copytree(CORPUS / "chunked", root)
    video = sorted(root.glob("videos/*/chunk-000/file-000.mp4"))[0]
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 3])
    return root


def test_a_batch_that_fails_in_one_call_is_read_again_request_by_request(broken, one_call, monkeypatch):
    """The error names the request's episode and feature, as the request path's does, and under a skip policy
    the same samples are skipped and counted."""
    with pytest.raises(SampleError) as fast:
        epoch(loader(broken))
    assert "raised" in one_call
    request_by_request(monkeypatch)
    with pytest.raises(SampleError) as slow:
        epoch(loader(broken))
    assert str(fast.value) == str(slow.value)
    assert "episode" in str(fast.value)


def test_a_failed_batch_skips_what_the_request_path_skips(broken, monkeypatch):
    skip = ErrorPolicy(on_error="skip", max_consecutive_errors=10**6)
    batches = [(b.metadata["sample"].tolist(), [e["sample"] for e in b.metadata.get("errors", [])])
               for b in loader(broken, errors=skip)]
    request_by_request(monkeypatch)
    assert [(b.metadata["sample"].tolist(), [e["sample"] for e in b.metadata.get("errors", [])])
            for b in loader(broken, errors=skip)] == batches
    assert any(errors for _, errors in batches)


def test_a_pooled_buffer_of_a_failed_batch_is_free_again():
    from mmfeed.loaders import shm

    pool = shm.BufferPool(per_key=2)
    first = pool.take("frames", (4, 8))
    pool.give_back(first)
    again = pool.take("frames", (4, 8))
    assert again.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    assert (pool.allocated, pool.reused) == (1, 1)
    assert isinstance(again, torch.Tensor)


@pytest.fixture
def with_nan(tmp_path):
    """The chunked corpus with one state value NaN (the fourth row of its second data file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "chunked"
    shutil.copytree(CORPUS / "chunked", root)
    path = root / "data" / "chunk-000" / "file-001.parquet"
    table = pq.read_table(path)
    column = table.schema.get_field_index("observation.state")
    values = table["observation.state"].to_pylist()
    values[1][2] = float("nan")
    table = table.set_column(column, table.schema.field(column), pa.array(values, type=table.schema.field(column).type))
    pq.write_table(table, path)
    return root


@pytest.mark.parametrize("nonfinite", ["raise", "mask"])
def test_a_nan_in_a_batch_read_in_one_call_is_met_as_sample_by_sample(with_nan, monkeypatch, nonfinite):
    """NaN found in the batch's arrays: masked, or raised naming the episode, feature and frame, as the request
    path does."""
    policy = ErrorPolicy(nonfinite=nonfinite)
    if nonfinite == "raise":
        with pytest.raises(SampleError) as fast:
            epoch(loader(with_nan, errors=policy))
        request_by_request(monkeypatch)
        with pytest.raises(SampleError) as slow:
            epoch(loader(with_nan, errors=policy))
        assert str(fast.value) == str(slow.value) and "NaN or inf" in str(fast.value)
        return
    fast = epoch(loader(with_nan, errors=policy))
    request_by_request(monkeypatch)
    assert epoch(loader(with_nan, errors=policy)) == fast
