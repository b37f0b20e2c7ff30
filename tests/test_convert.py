"""`mmfeed convert` on real files: a LeRobot AV1 directory, shards and a user's generator to indexed shards, every
feature and every step's task checked against the source; identical bytes from 1 and 2 local workers and a real
local Ray; a killed job resumed to the same bytes; corrupt episodes named or skipped; DST refusal; task runs in
the shard format."""

import argparse
import glob
import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
import webdataset

from mmfeed.codecs.demux import probe
from mmfeed.loaders import ShardWriter, compute_stats, open_dataset
from mmfeed.loaders.conversion.job import MANIFEST, ConvertError, add_arguments, convert, run
from mmfeed.loaders.stores.index import INDEX_FILENAME, read_shard_index, write_index
from mmfeed.loaders.stores.quantiles import ALPHA, QUANTILES
from mmfeed.testing import make_episodes, read_index, write_lerobot, write_webdataset, write_webdataset_v1

CAM = "observation.images.cam_high"
WRIST = "observation.images.cam_wrist"


@pytest.fixture(scope="module")
def episodes():
    return make_episodes(5, seed=3, min_length=10, max_length=30, height=48, width=64)


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory, episodes):
    return write_lerobot(tmp_path_factory.mktemp("lerobot") / "ds", episodes, codec="av1", task_switch=True)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, lerobot):
    """The LeRobot directory converted to H.264 shards of 2 episodes in this process: (dst, summary)."""
    dst = tmp_path_factory.mktemp("converted") / "out"
    return str(dst), convert(lerobot, dst, episodes_per_shard=2, workers=1, progress=False)


def _files(directory) -> dict[str, bytes]:
    return {os.path.basename(p): open(p, "rb").read() for p in sorted(glob.glob(os.path.join(directory, "*")))}


def _manifest(directory) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(directory, MANIFEST))]


def _step_texts(ds, e) -> list[str]:
    return [ds.tasks[t] for t in ds.step_tasks(e)]


def _same_episodes(src, out, *, copied=()):
    """Every feature of every episode: arrays bit for bit, frames identified (bit for bit where ``copied``),
    videos within codec loss; every step's task."""
    assert len(out) == len(src) and set(out.features) == set(src.features)
    for e in range(len(src)):
        a, b = src.episode(e), out.episode(e)
        for name, feature in src.features.items():
            assert out.features[name] == feature, name
            if feature.kind == "array":
                assert b[name].dtype == a[name].dtype and np.array_equal(b[name], a[name]), (e, name)
            elif name in copied:
                assert np.array_equal(b[name], a[name]), (e, name)
            else:
                assert np.array_equal(read_index(b[name]), read_index(a[name])), (e, name)
                assert np.abs(b[name].astype(np.int16) - a[name]).mean() < 4.0, (e, name)
        assert _step_texts(out, e) == _step_texts(src, e), e
        assert out.lengths[e] == src.lengths[e] and out.fps[e] == src.fps[e]


def test_lerobot_av1_to_shards_every_feature_task_and_stat(lerobot, converted):
    dst, summary = converted
    src, out = open_dataset(lerobot), open_dataset(dst)
    _same_episodes(src, out)
    assert (out.episode_tasks == -1).all(), "every episode switches task halfway (task_switch=True)"
    assert out.task(0, 0) != out.task(0, int(out.lengths[0]) - 1)
    table = read_shard_index(os.path.join(dst, INDEX_FILENAME))
    assert table["shard"].to_pylist() == [f"shard-{i // 2:06d}.tar" for i in range(5)], "episode i in shard i // 2"
    assert table["episode_id"].to_pylist() == [f"episode_{i:06d}" for i in range(5)]
    assert table["shard_mtime_ns"].null_count == 5, "no mtime: the index depends on the shards' bytes only"
    shards = sorted(glob.glob(os.path.join(dst, "shard-*.tar")))
    assert (summary.episodes, summary.shards, summary.total_shards, summary.skipped) == (5, 3, 3, [])
    assert summary.bytes == sum(os.path.getsize(p) for p in shards) and 0 < summary.encode_share < 1
    lines = _manifest(dst)
    assert lines[0]["job"]["codec"] == "h264" and lines[-1] == {"complete": True, "episodes": 5, "shards": 3,
                                                                 "skipped": 0}
    for record, path in zip(lines[1:-1], shards):
        data = open(path, "rb").read()
        assert (record["file"], record["size"], record["sha256"]) == (os.path.basename(path), len(data),
                                                                      hashlib.sha256(data).hexdigest())
    for name in ("observation.state", "action", "next.reward", "index"):  # stats merged from per-episode partials
        values = np.concatenate([src.episode(e)[name] for e in range(len(src))]).astype(np.float64)
        values = values.reshape(len(values), -1)
        got, want = out.stats[name], src.stats[name]
        for stat in ("mean", "std", "min", "max", "count"):
            np.testing.assert_allclose(np.ravel(got[stat]), np.ravel(want[stat]), rtol=1e-9, atol=1e-12)
        for q, level in QUANTILES.items():  # the sketch: within ALPHA of np.quantile (LeRobot's own numbers)
            np.testing.assert_allclose(np.ravel(want[q]), np.quantile(values, level, axis=0), rtol=1e-6)
            bound = ALPHA * np.maximum(*(np.abs(np.quantile(values, level, axis=0, method=m))
                                         for m in ("lower", "higher"))) + 1e-9
            assert np.all(np.abs(np.ravel(got[q]) - np.ravel(want[q])) <= bound), (name, q)


def test_webdataset_library_reads_the_shards(converted):
    dst, _ = converted
    samples = list(webdataset.WebDataset(sorted(glob.glob(f"{dst}/shard-*.tar")), shardshuffle=False))
    assert [s["__key__"] for s in samples] == [f"episode_{i:06d}" for i in range(5)]
    first = samples[0]
    assert {"observation.state.npy", f"{CAM}.mp4", "meta.json"} <= set(first)
    assert probe(first[f"{CAM}.mp4"]).codec == "h264"
    assert json.loads(first["meta.json"])["task_runs"][1][0] == (int(json.loads(first["meta.json"])["length"]) + 1) // 2


@pytest.mark.slow  # a Ray cluster / a job killed and resumed
def test_local_workers_and_ray_give_the_same_bytes_and_stats(tmp_path, lerobot, converted):
    dst, _ = converted
    reference = _files(dst)
    two = convert(lerobot, tmp_path / "two", episodes_per_shard=2, workers=2, progress=False)
    assert two.shards == 3 and _files(tmp_path / "two") == reference
    ray = pytest.importorskip("ray", reason="engine='ray' needs the optional extra: pip install 'mmfeed[ray]'")
    convert(lerobot, tmp_path / "ray", episodes_per_shard=2, workers=2, engine="ray", progress=False)
    assert _files(tmp_path / "ray") == reference, "Ray tasks write the very bytes of one local process"
    assert not ray.is_initialized(), "the local cluster convert started is stopped"
    write_webdataset(tmp_path / "good", make_episodes(3, seed=6, min_length=10, max_length=12), episodes_per_shard=3)
    bad_shard = _corrupt_copy(tmp_path / "good", tmp_path / "bad", "episode_000001", f"{CAM}.mp4", "shard-000000.tar")
    ray.init(num_cpus=2, include_dashboard=False)
    try:
        rows = ray.data.read_webdataset(sorted(glob.glob(f"{dst}/shard-*.tar"))).take_all()
        with pytest.raises(ConvertError, match="failed 2 time") as raised:  # the cluster running: joined, kept
            convert(tmp_path / "bad", tmp_path / "ray_bad", engine="ray", max_retries=1, progress=False)
        assert ray.is_initialized()
        # mmfeed stats on the same engines: Ray tasks count what local processes count
        on_ray, local = compute_stats(lerobot, engine="ray", workers=2), compute_stats(lerobot, workers=2)
        for feature, stats in local.datasets[0].items():
            for key, value in stats.items():
                np.testing.assert_allclose(on_ray.datasets[0][feature][key], value, rtol=1e-12,
                                           err_msg=f"{feature} {key}")
    finally:
        ray.shutdown()
    assert "episode 1 " in str(raised.value) and bad_shard in str(raised.value)
    assert sorted(r["__key__"] for r in rows) == [f"episode_{i:06d}" for i in range(5)]


def test_lerobot_copy_remuxes_each_episodes_packets(tmp_path, lerobot):
    summary = convert(lerobot, tmp_path / "copy", codec="copy", episodes_per_shard=3, progress=False)
    src, out = open_dataset(lerobot), open_dataset(tmp_path / "copy")
    assert summary.encode_seconds == 0.0, "nothing re-encoded"
    _same_episodes(src, out, copied=(CAM, WRIST))
    for e in range(len(out)):
        info = probe(out.member_bytes(e, CAM))
        assert info.codec == "av1" and info.num_frames == out.lengths[e] and info.keyframes()[0] == 0
    # a frame size for one camera re-encodes that camera (in the source's codec) and copies the other
    convert(lerobot, tmp_path / "small", codec="copy", frame_size={CAM: (32, 64)}, progress=False)
    small = open_dataset(tmp_path / "small")
    assert small.features[CAM].shape == (32, 64, 3) and small.features[WRIST].shape == (48, 64, 3)
    for e in range(len(small)):
        a, b = src.episode(e), small.episode(e)
        assert np.array_equal(read_index(b[CAM]), read_index(a[CAM])) and np.array_equal(b[WRIST], a[WRIST])
        assert probe(small.member_bytes(e, CAM)).codec == "av1" and probe(small.member_bytes(e, CAM)).height == 32


def test_reshard_shards_with_another_gop_and_copy(tmp_path):
    eps = make_episodes(5, seed=4, min_length=10, max_length=30, camera_fps={"cam_wrist": 15.0})
    write_webdataset(tmp_path / "src", eps, episodes_per_shard=2, gop=30)
    convert(tmp_path / "src", tmp_path / "gop4", gop=4, episodes_per_shard=3, progress=False)
    src, out = open_dataset(tmp_path / "src"), open_dataset(tmp_path / "gop4")
    _same_episodes(src, out)
    assert len(glob.glob(f"{tmp_path}/gop4/shard-*.tar")) == 2
    assert [out.episode_id(e) for e in range(5)] == [ep.episode_id for ep in eps]
    np.testing.assert_array_equal(out.rates(WRIST), 15.0)
    for e in range(5):
        assert probe(out.member_bytes(e, CAM)).keyframes().tolist() == list(range(0, int(out.lengths[e]), 4))
    convert(tmp_path / "src", tmp_path / "copy", codec="copy", episodes_per_shard=5, progress=False)
    copied = open_dataset(tmp_path / "copy")
    for e in range(5):
        assert copied.member_bytes(e, WRIST) == src.member_bytes(e, WRIST), "copy keeps the shard's video bytes"
    # --shard-size-mb: cut where the bytes estimated from the source (exact for copied videos) pass the target
    sizes = [len(b"".join(copied.member_bytes(e, f) for f in copied.features)) for e in range(5)]
    target = 2.5 * float(np.mean(sizes))
    convert(tmp_path / "src", tmp_path / "sized", codec="copy", shard_size_mb=target / 1e6, progress=False)
    sized = read_shard_index(tmp_path / "sized" / INDEX_FILENAME)["shard"].to_pylist()
    counts = [sized.count(s) for s in dict.fromkeys(sized)]
    assert 1 < len(counts) < 5 and sum(counts) == 5
    starts = np.cumsum([0] + counts)
    for a, b in zip(starts[:-1], starts[1:]):
        assert sum(sizes[a:b]) <= target or b - a == 1
        assert b == 5 or sum(sizes[a:b + 1]) > target, "a shard is closed only when the next episode overflows it"
    # first-version shards convert too, their features under the names v1 gives them
    write_webdataset_v1(tmp_path / "v1", eps[:2], episodes_per_shard=2)
    convert(tmp_path / "v1", tmp_path / "from_v1", progress=False)
    _same_episodes(open_dataset(tmp_path / "v1"), open_dataset(tmp_path / "from_v1"))


GENERATOR = '''
import time
import numpy as np
from mmfeed.testing import frame_pattern

def episodes():
    for i in range(N):
        rng = np.random.default_rng(i)
        length = 10 + 3 * i
        yield {"features": {"observation.state": rng.standard_normal((length, 4)).astype(np.float32),
                            "next.done": np.arange(length) == length - 1,
                            "observation.images.top": frame_pattern(length, height=48, width=64, start=100 * i),
                            "observation.images.slow": frame_pattern((length + 1) // 2, height=48, width=64)},
               "fps": 20.0, "rates": {"observation.images.slow": 10.0},
               "task": ["reach"] * (length // 2) + ["grasp"] * (length - length // 2) if i % 2 else "wave",
               "key": f"run{i:03d}"}

class Lazy:
    """An array read when asked for (as an HDF5 dataset is), slowly."""

    def __init__(self, array):
        self.array = array

    def __array__(self, dtype=None, copy=None):
        time.sleep(DELAY)
        return self.array

def slow():
    for episode in episodes():
        episode["features"]["observation.state"] = Lazy(episode["features"]["observation.state"])
        yield episode
'''


def _generator_module(tmp_path, name: str, n: int, delay: float = 0.0) -> str:
    (tmp_path / f"{name}.py").write_text(GENERATOR.replace("N)", f"{n})").replace("DELAY", repr(delay)))
    return str(tmp_path)


def test_user_generator_module_function(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(_generator_module(tmp_path, "usergen", 4))
    import usergen

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert run(parser.parse_args(["usergen:episodes", str(tmp_path / "out"), "--episodes-per-shard", "3",
                                  "--no-progress"])) == 0
    assert "converted 4 episode(s) into 2 shard(s)" in capsys.readouterr().out
    out = open_dataset(tmp_path / "out")
    for e, ep in enumerate(usergen.episodes()):
        got = out.episode(e)
        assert out.episode_id(e) == ep["key"] and out.fps[e] == 20.0
        for name in ("observation.state", "next.done"):
            assert np.array_equal(got[name], ep["features"][name]), name
        for name in ("observation.images.top", "observation.images.slow"):
            assert np.array_equal(read_index(got[name]), read_index(ep["features"][name])), name
        np.testing.assert_array_equal(out.rates("observation.images.slow")[e], 10.0)
        task = ep["task"]
        assert _step_texts(out, e) == (task if isinstance(task, list) else [task] * int(out.lengths[e]))
    assert out.episode_tasks.tolist() == [out.tasks.index("wave"), -1, out.tasks.index("wave"), -1]


@pytest.mark.slow  # a Ray cluster / a job killed and resumed
def test_killed_job_resumes_to_the_bytes_of_an_uninterrupted_run(tmp_path, monkeypatch):
    path = _generator_module(tmp_path, "slowgen", 6, delay=0.3)
    monkeypatch.syspath_prepend(path)
    dst = tmp_path / "killed"
    code = ("from mmfeed.loaders.conversion.job import convert; "
            f"convert('slowgen:slow', {str(dst)!r}, episodes_per_shard=2)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([path, os.environ.get("PYTHONPATH", "")])}
    job = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job.poll() is None:
            # killed mid-shard: shard 0 finished (the job line and its line), shard 1 half written (its second
            # episode's state is being read: 0.3 s)
            if os.path.exists(dst / ".shard-000001.tar.partial") and len(_manifest(dst)) >= 2:
                break
            time.sleep(0.02)
        assert job.poll() is None, "the job ended before it could be killed"
        job.send_signal(signal.SIGKILL)
    finally:
        job.wait()
    finished = [line for line in _manifest(dst) if "shard" in line]
    assert [line["shard"] for line in finished] == [0] and os.path.exists(dst / ".shard-000001.tar.partial")
    with pytest.raises(FileExistsError, match="resume"):
        convert("slowgen:slow", dst, episodes_per_shard=2, progress=False)
    resumed = convert("slowgen:slow", dst, episodes_per_shard=2, resume=True, progress=False)
    assert (resumed.resumed_shards, resumed.shards, resumed.episodes) == (1, 2, 4)
    assert not glob.glob(f"{dst}/.*.partial")
    convert("slowgen:slow", tmp_path / "whole", episodes_per_shard=2, progress=False)
    assert _files(dst) == _files(tmp_path / "whole"), "shards, index and manifest: the same bytes"
    again = convert("slowgen:slow", dst, episodes_per_shard=2, resume=True, progress=False)
    assert again.episodes == 0 and again.resumed_shards == 3 and _files(dst) == _files(tmp_path / "whole")
    # killed after shards were renamed but before the manifest recorded them, in the middle of a line
    lines = open(dst / MANIFEST).read().splitlines(keepends=True)
    (dst / MANIFEST).write_text(lines[0] + lines[1][:20])
    os.unlink(dst / INDEX_FILENAME)
    redone = convert("slowgen:slow", dst, episodes_per_shard=2, resume=True, progress=False)
    assert redone.resumed_shards == 0 and redone.shards == 3 and _files(dst) == _files(tmp_path / "whole")


def _corrupt_copy(src_dir, dst_dir, key: str, member: str, shard: str = "shard-000001.tar") -> str:
    """The shards of ``src_dir`` rewritten into ``dst_dir`` with one member's bytes replaced by noise."""
    os.makedirs(dst_dir)
    rng = np.random.default_rng(0)
    for path in sorted(glob.glob(f"{src_dir}/*.tar")):
        target = os.path.join(dst_dir, os.path.basename(path))
        with tarfile.open(path) as tar, open(target, "wb") as f, webdataset.TarWriter(f, encoder=False,
                                                                                     mtime=0) as out:
            samples: dict[str, dict] = {}
            for info in tar:
                k, _, rest = info.name.partition(".")
                samples.setdefault(k, {"__key__": k})[rest] = tar.extractfile(info).read()
            for k, sample in samples.items():
                if k == key:
                    sample[member] = rng.integers(0, 256, len(sample[member]), dtype=np.uint8).tobytes()
                out.write(sample)
    write_index(sorted(glob.glob(f"{dst_dir}/*.tar")), os.path.join(dst_dir, INDEX_FILENAME))
    return os.path.join(dst_dir, shard)


def test_corrupt_episode_video_is_named_or_skipped(tmp_path):
    eps = make_episodes(5, seed=6, min_length=10, max_length=20)
    write_webdataset(tmp_path / "good", eps, episodes_per_shard=2)
    bad_shard = _corrupt_copy(tmp_path / "good", tmp_path / "bad", "episode_000002", f"{CAM}.mp4")
    with pytest.raises(ConvertError) as raised:
        convert(tmp_path / "bad", tmp_path / "raise", episodes_per_shard=1, progress=False)
    message = str(raised.value)
    assert "episode 2 " in message and bad_shard in message and "episode_000002" in message
    assert not glob.glob(f"{tmp_path}/raise/.*.partial") and not os.path.exists(tmp_path / "raise" / INDEX_FILENAME)
    assert [line["shard"] for line in _manifest(tmp_path / "raise")[1:]] == [0, 1], "finished shards are kept"
    summary = convert(tmp_path / "bad", tmp_path / "skip", episodes_per_shard=2, errors="skip", progress=False)
    assert summary.total_episodes == 4 and [s["episode"] for s in summary.skipped] == [2]
    record = next(line for line in _manifest(tmp_path / "skip") if line.get("shard") == 1)
    assert record["written"] == 1 and record["skipped"][0]["episode"] == 2
    assert bad_shard in record["skipped"][0]["source"] and "SampleError" in record["skipped"][0]["reason"]
    out = open_dataset(tmp_path / "skip")
    assert [out.episode_id(e) for e in range(len(out))] == [f"episode_{i:06d}" for i in (0, 1, 3, 4)]
    assert read_shard_index(tmp_path / "skip" / INDEX_FILENAME)["shard"].to_pylist()[2] == "shard-000001.tar"


def test_dst_holding_another_dataset_is_refused(tmp_path, lerobot, converted):
    dst, _ = converted
    with pytest.raises(FileExistsError, match="overwrite"):
        convert(lerobot, dst, episodes_per_shard=2, progress=False)
    with pytest.raises(ValueError, match="episodes_per_shard"):
        convert(lerobot, dst, episodes_per_shard=3, resume=True, progress=False)
    write_webdataset(tmp_path / "other", make_episodes(1, min_length=5, max_length=5))
    with pytest.raises(FileExistsError, match="another dataset"):
        convert(lerobot, tmp_path / "other", resume=True, progress=False)
    with pytest.raises(FileExistsError, match="another dataset"):
        convert(tmp_path / "other", lerobot, progress=False)
    with pytest.raises(ValueError, match="is SRC"):
        convert(tmp_path / "other", tmp_path / "other", overwrite=True, progress=False)
    convert(lerobot, tmp_path / "other", episodes_per_shard=2, overwrite=True, progress=False)
    assert _files(tmp_path / "other") == _files(dst)


def test_remote_lerobot_url_gives_the_local_bytes(tmp_path, lerobot, converted):
    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    memory.put(lerobot, "/convert-test/ds", recursive=True)
    try:
        convert("memory://convert-test/ds", tmp_path / "remote", episodes_per_shard=2, progress=False)
    finally:
        memory.rm("/convert-test", recursive=True)
    remote, local = _files(tmp_path / "remote"), _files(converted[0])
    assert remote.pop(MANIFEST) != local.pop(MANIFEST), "the manifest names its source"
    assert remote == local and _manifest(tmp_path / "remote")[1:] == _manifest(converted[0])[1:]


def test_task_runs_in_shard_format_and_older_indexes_still_read(tmp_path):
    with ShardWriter(tmp_path / "s", episodes_per_shard=2) as w:
        w.write({"x": np.arange(5)}, fps=10.0, task=["a", "a", "b", "b", "a"])
        w.write({"x": np.arange(3)}, fps=10.0, task="c")
        w.write({"x": np.arange(3)}, fps=10.0, task=["c", "c", "c"])
    with pytest.raises(ValueError, match="per-step texts"):
        ShardWriter(tmp_path / "t").write({"x": np.arange(3)}, fps=10.0, task=["a"])
    ds = open_dataset(tmp_path / "s")
    assert ds.episode_tasks.tolist() == [-1, ds.tasks.index("c"), ds.tasks.index("c")]
    assert _step_texts(ds, 0) == ["a", "a", "b", "b", "a"] and ds.task(0, 2) == "b"
    meta = json.loads(next(iter(webdataset.WebDataset(ds._shards[0], shardshuffle=False)))["meta.json"])
    assert meta["task"] == "a" and meta["task_runs"] == [[0, "a"], [2, "b"], [4, "a"]]
    index = tmp_path / "s" / INDEX_FILENAME
    table = pq.read_table(index)
    pq.write_table(table.drop_columns(["task_runs"]).replace_schema_metadata(table.schema.metadata), index)
    older = open_dataset(tmp_path / "s", check_index=False)
    assert older.episode_tasks.tolist() == [older.tasks.index("a"), older.tasks.index("c"), older.tasks.index("c")]


def test_an_episodes_texts_are_kept_in_its_meta_json_and_must_be_strings(tmp_path):
    with ShardWriter(tmp_path / "s") as w:
        w.write({"x": np.arange(3)}, fps=10.0, task="a", text={"episode_metadata.file_path": "/data/0.npy"})
        w.write({"x": np.arange(2)}, fps=10.0, task="b")
    metas = [json.loads(s["meta.json"]) for s in webdataset.WebDataset(w.shards[0], shardshuffle=False)]
    assert metas[0]["text"] == {"episode_metadata.file_path": "/data/0.npy"} and "text" not in metas[1]
    assert metas[0]["task"] == "a" and open_dataset(tmp_path / "s").task(1) == "b"
    with pytest.raises(ValueError, match=r"text must map names to strings.*\{'n': 3\}"):
        ShardWriter(tmp_path / "t").write({"x": np.arange(3)}, fps=10.0, text={"n": 3})
