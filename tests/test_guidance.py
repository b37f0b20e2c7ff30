"""Mistakes a new user makes get one error that points the way: the value or file at fault, what was wrong and
what to do. On real files (shards and LeRobot directories written by mmfeed.testing, videos and indexes made
unreadable by overwriting their bytes), real servers on 127.0.0.1 (moto's S3, an HTTP file server) and a host
name that never resolves; the command line run in this process, as tests/test_cli.py does."""

import functools
import logging
import os
import shutil
import socket
import tarfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from http_server import serve
from mmfeed import DataLoader
from mmfeed.cli import main as cli_main
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.planned.dataset import PlannedDataset
from mmfeed.testing import make_episodes, write_lerobot, write_webdataset

import cli_lines

# argparse's own refusals (a choice not offered) count as the one line too
error_line = functools.partial(cli_lines.error_line, argparse_refusal=True)

CAM = "observation.images.cam_high"
SPEC = WindowSpec.from_delta_timestamps({CAM: [-1 / 30, 0.0], "observation.state": [0.0],
                                         "action": [0.0, 1 / 30, 2 / 30]})
LAYOUT = TokenLayout(tokens_per_frame={CAM: 16})


def episodes(n: int = 3):
    return make_episodes(n, seed=5, cameras=("cam_high",), height=32, width=48, min_length=12, max_length=20)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("guidance") / "shards"
    write_webdataset(out, episodes())
    return out


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory) -> Path:
    return Path(write_lerobot(tmp_path_factory.mktemp("guidance") / "lerobot", episodes(), codec="h264", gop=10))


def overwrite_video_header(path: Path, offset: int = 0) -> None:
    """Zero the first 64 bytes of the mp4 at ``offset`` of ``path``, keeping the file's size and mtime (an index
    beside it stays valid): the container no longer opens."""
    stat = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\0" * 64)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


# -- 1. a capacity smaller than every sample ----------------------------------------------------------------------


def test_a_capacity_no_sample_fits_is_refused_naming_the_capacity_that_fits(shards):
    """An epoch of no step is refused where the prices are first known, naming the capacity given and the one that
    fits every sample (and the cheapest); fixed mode, which pads to the longest sample, is not refused."""
    source = open_dataset(shards)
    forecast = Packing(layout=LAYOUT, window=SPEC, plan=PlanConfig(capacity=8)).dataset(source, refuse_unfit=False)
    tokens = forecast.items.table.tokens
    assert forecast.num_steps(0) == 0  # what the loader silently ran before
    cheapest, dearest = int(tokens.min()), int(tokens.max())
    with pytest.raises(ValueError, match=rf"PlanConfig\(capacity=8\): every sample costs more than the capacity "
                                         rf"\({cheapest}( to {dearest})? tokens\).*give capacity >= {dearest}"):
        DataLoader(source, packing=Packing(layout=LAYOUT, window=SPEC, plan=PlanConfig(capacity=8)))
    docs = [torch.arange(n) for n in (5, 3, 7)]
    with pytest.raises(ValueError, match=r"capacity=2\).*\(3 to 7 tokens\).*capacity >= 7 \(3 fits the cheapest\)"):
        PlannedDataset.records(docs, lengths=[5, 3, 7], plan=PlanConfig(capacity=2))
    with pytest.raises(ValueError, match=r"token budget \(capacity\)"):
        PlannedDataset.records(docs, lengths=[5, 3, 7], plan=PlanConfig(capacity=2, mode="bucket"))
    fixed = PlannedDataset.records(docs, lengths=[5, 3, 7], plan=PlanConfig(capacity=2, mode="fixed", batch_size=1))
    assert fixed.num_steps(0) == 3


def test_samples_longer_than_the_capacity_beside_others_are_left_out_and_counted(caplog):
    """Documented behaviour kept: a sample dearer than the capacity is left out of the plan when others fit, and
    the warning says how many and the capacity that keeps them."""
    docs = [torch.arange(n) for n in (5, 3, 7, 9)]
    with caplog.at_level(logging.WARNING, logger="mmfeed.loaders.planned.dataset"):
        ds = PlannedDataset.records(docs, lengths=[5, 3, 7, 9], plan=PlanConfig(capacity=6))
    assert ds.plan(0).dropped.tolist() == [2, 3]
    assert "2 of 4 samples cost more than the capacity of 6 tokens (up to 9)" in caplog.text
    assert "capacity >= 9 keeps them" in caplog.text


def test_inspect_still_forecasts_a_capacity_no_sample_fits(shards, capsys):
    """`mmfeed inspect` forecasts the epoch the loader would refuse (its survey and the advice stay)."""
    capsys.readouterr()
    assert cli_main(["inspect", str(shards), "--capacity", "8", "--tokens-per-frame", "16"]) == 0
    out = capsys.readouterr().out
    assert "raise --capacity to at least" in out and "0 steps per rank" in out


# -- 2. torch's habit: DataLoader(open_dataset(...), batch_size=32) ----------------------------------------------


def test_an_episode_source_without_packing_is_refused_saying_windows_or_packing(shards):
    source = open_dataset(shards)
    with pytest.raises(TypeError, match=r"DataLoader got WebDatasetSource .*a dataset of whole episodes \(what "
                                        r"open_dataset returns\).*ds\.windows\(WindowSpec\(\.\.\.\)\).*"
                                        r"packing=Packing\(\.\.\.\)"):
        DataLoader(source, batch_size=32)
    first = next(iter(DataLoader(source.windows(SPEC), batch_size=4)))  # the way the message points
    assert first["observation.state"].shape[0] == 4
    assert next(iter(DataLoader(list(range(10)), batch_size=4))).tolist() == [0, 1, 2, 3]  # others as torch's


# -- 3. remote datasets that cannot be reached ------------------------------------------------------------------


@pytest.fixture
def s3(monkeypatch):
    """moto's S3 server on 127.0.0.1 with bucket ``robots`` holding a LeRobot ``meta/info.json``; yields
    ``(endpoint, set_auth)``: ``set_auth("0")`` makes the server check credentials (moto knows none of the test's,
    so every request is refused with 403), ``set_auth("inf")`` stops it."""
    pytest.importorskip("s3fs", reason="s3fs (the dev extra) reads s3:// URLs")
    server_module = pytest.importorskip("moto.server", reason="moto[server] (the dev extra) is the local S3")
    import boto3
    import s3fs

    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for key, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
                       "AWS_SHARED_CREDENTIALS_FILE": os.devnull}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)

    def set_auth(count: str) -> None:
        request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(), method="POST",
                                         headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=10).read()

    s3fs.S3FileSystem.clear_instance_cache()  # filesystems keep the credentials they were made with
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket="robots")
        client.put_object(Bucket="robots", Key="ds/meta/info.json", Body=b'{"codebase_version": "v3.0"}')
        yield endpoint, set_auth
    finally:
        set_auth("inf")  # moto's setting is process-wide
        s3fs.S3FileSystem.clear_instance_cache()
        server.stop()


def test_s3_without_credentials_names_the_url_and_the_variables_to_set(s3, monkeypatch):
    import s3fs

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(PermissionError, match=r"^s3://robots/ds\S*: no credentials for s3:// were found; set "
                                              r"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"):
        open_dataset("s3://robots/ds")


def test_s3_refusing_the_credentials_is_access_denied_naming_the_url(s3, capsys):
    _, set_auth = s3
    set_auth("0")
    with pytest.raises(PermissionError, match=r"^s3://robots/ds\S*: access denied \(403\): the credentials are "
                                              r"refused.*check AWS_ACCESS_KEY_ID"):
        open_dataset("s3://robots/ds")
    line = error_line(capsys, "inspect", "s3://robots/ds")
    assert "s3://robots/ds" in line and "access denied (403)" in line


def test_s3_with_nothing_at_the_url_says_what_was_looked_for(s3):
    for url in ("s3://robots/nothing", "s3://no-such-bucket/ds"):
        with pytest.raises(FileNotFoundError, match=rf"^{url}: no dataset there: looked for meta/info\.json \(a "
                                                    r"LeRobot v3 directory\) and mmfeed-index\.parquet"):
            open_dataset(url)


def test_http_403_and_404_name_the_url(lerobot):
    with serve(lerobot.parent, fault=lambda n, path: "403") as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/lerobot"
        with pytest.raises(PermissionError, match=rf"^{url}\S*: access denied \(403\): the server refuses it"):
            open_dataset(url)
    with serve(lerobot.parent) as server:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(FileNotFoundError, match=rf"^{base}/missing: no dataset there: looked for "
                                                    r"meta/info\.json .* and mmfeed-index\.parquet"):
            open_dataset(f"{base}/missing")
        assert len(open_dataset(f"{base}/lerobot")) == 3  # the served directory itself opens


def test_a_host_that_does_not_resolve_is_named_at_once(monkeypatch, capsys):
    """DNS failure: one line naming the URL and the host, not five tries with backoff (retries are few here in
    case this machine's resolver answers 'try again'; a name that does not exist is never retried)."""
    from mmfeed.loaders.transport.remote import retryable

    assert not retryable(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    monkeypatch.setenv("MMFEED_REMOTE_RETRIES", "2")
    start = time.perf_counter()
    with pytest.raises(OSError, match=r"^https://nonexistent\.invalid/ds\S*: cannot resolve host "
                                      r"nonexistent\.invalid \(.*\); check the host name in the URL"):
        open_dataset("https://nonexistent.invalid/ds")
    assert time.perf_counter() - start < 10
    assert "nonexistent.invalid" in error_line(capsys, "stats", "https://nonexistent.invalid/ds")


# -- 4. a directory that is not a dataset, 5. a corrupt index -------------------------------------------------------


def test_a_directory_that_is_not_a_dataset_says_what_was_looked_for(shards, tmp_path):
    folder = tmp_path / "datasets"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    shutil.copytree(shards, folder / "arm")
    with pytest.raises(FileNotFoundError, match=r"datasets: not a dataset: looked for webdataset shards \(\*\.tar\) "
                                                r"or their mmfeed-index\.parquet, and for meta/info\.json \(a LeRobot "
                                                r"v3 directory\), and found none; its subdirectories arm are datasets"):
        open_dataset(folder)
    assert len(open_dataset([folder / "arm"])) == 3


def test_the_metadata_file_of_a_lerobot_directory_points_to_the_directory(lerobot):
    with pytest.raises(ValueError, match=rf"info\.json is the metadata file of a LeRobot directory: open the "
                                         rf"directory itself, {lerobot}$"):
        open_dataset(lerobot / "meta" / "info.json")


def test_a_corrupt_index_is_named(shards, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MMFEED_CACHE", str(tmp_path / "cache"))  # no index arrays cached from an earlier read
    torn = tmp_path / "torn"
    shutil.copytree(shards, torn)
    index = torn / "mmfeed-index.parquet"
    index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    with pytest.raises(ValueError, match=rf"{index}: not a readable index \(corrupt or not parquet: .*\); rebuild "
                                         rf"it with `mmfeed index {torn}`"):
        open_dataset(torn)
    assert str(index) in error_line(capsys, "stats", str(torn))


# -- 6. every command's error is one line naming the file and the cause ---------------------------------------------


@pytest.fixture(scope="module")
def corrupt_shards(shards, tmp_path_factory) -> Path:
    """The shards with the video of episode 1 unreadable (its mp4 header zeroed inside the tar)."""
    out = tmp_path_factory.mktemp("corrupt") / "shards"
    shutil.copytree(shards, out)
    tar = sorted(out.glob("*.tar"))[0]
    with tarfile.open(tar) as f:
        member = next(m for m in f.getmembers() if m.name == f"episode_000001.{CAM}.mp4")
    overwrite_video_header(tar, member.offset_data)
    return out


def test_bench_on_a_corrupt_video_names_the_shard_episode_and_feature(corrupt_shards, capsys):
    """Raised in a DataLoader worker (torch re-raises it with the worker's whole traceback): one line."""
    line = error_line(capsys, "bench", "--data", str(corrupt_shards), "--quick", "--no-progress", "--no-limit",
                      "--workers", "1", "--capacity", "512", "--tokens-per-frame", "16", "--repeats", "1")
    assert line == (f"mmfeed: error: {sorted(corrupt_shards.glob('*.tar'))[0]} key 'episode_000001' feature "
                    f"'{CAM}': not a readable video file (unknown format, truncated or corrupt): Invalid data found "
                    "when processing input")


def test_cache_on_a_corrupt_video_names_the_file_without_every_time(lerobot, tmp_path, capsys):
    """Filling the frame cache decodes a whole segment (every time of the episode): the line names the file once,
    the episode and the feature, and never lists every time (the damaged header is found before any is asked)."""
    root = tmp_path / "lerobot"
    shutil.copytree(lerobot, root)
    video = root / "videos" / CAM / "chunk-000" / "file-000.mp4"
    overwrite_video_header(video)
    line = error_line(capsys, "cache", str(root), "--dir", str(tmp_path / "frames"), "--processes", "1",
                      "--no-progress")
    assert line.startswith(f"mmfeed: error: {root} episode 0 feature '{CAM}' ({video})")
    assert "not a readable video file (unknown format, truncated or corrupt): Invalid data found" in line
    assert len(line.replace(str(root), "ROOT")) < 350 and line.count(str(video)) == 1  # was 1.3 KB, the file twice


def test_a_failed_decode_shows_a_few_of_its_times_not_all():
    """A decode that fails part-way names the frames asked: all of a few, else the first three, the last and how
    many (a whole segment's 57 times would drown the reason)."""
    from mmfeed.loaders.transport.errors import _shown

    assert _shown(np.arange(30) / 30) == "[0.0, 0.033333, 0.066667, ..., 0.966667] (30 of them)"
    assert _shown(np.array([4, 5])) == "[4, 5]"


def test_stats_refuses_a_feature_no_dataset_has_listing_the_known_ones(shards, lerobot, capsys):
    line = error_line(capsys, "stats", str(shards), "--features", "nope", "--no-progress")
    assert line == (f"mmfeed: error: {shards / 'mmfeed-index.parquet'}: no feature ['nope'] to compute stats of; "
                    "the numeric array features are ['action', 'next.done', 'next.reward', 'observation.state', "
                    "'observation.velocity']")
    line = error_line(capsys, "stats", str(shards), str(lerobot), "--features", "observation.state,nope")
    assert "none of the 2 datasets has feature ['nope']" in line
    line = error_line(capsys, "stats", str(shards), "--delta", "0-2", "--action", "act", "--no-progress")
    assert "delta actions need feature 'act', which the dataset lacks; its numeric array features are" in line


def test_unknown_codecs_are_refused_by_convert_and_shard_writer(shards, tmp_path, capsys):
    from mmfeed.codecs.encode import CODECS
    from mmfeed.loaders import ShardWriter
    from mmfeed.loaders.conversion.job import CODEC_CHOICES, convert

    assert CODEC_CHOICES == (*CODECS, "copy")
    line = error_line(capsys, "convert", str(shards), str(tmp_path / "a"), "--codec", "vp9")
    assert "argument --codec: invalid choice: 'vp9'" in line
    with pytest.raises(ValueError, match=r"codec 'vp9' is not one mmfeed writes shards with; choose one of "
                                         r"\['h264', 'av1', 'hevc', 'copy'\]"):
        convert(shards, tmp_path / "b", codec="vp9")
    with pytest.raises(ValueError, match=r"ShardWriter codec 'vp9' is not one shards are written with; choose one "
                                         r"of \['h264', 'av1', 'hevc'\]"):
        ShardWriter(tmp_path / "c", codec="vp9")
    assert not any((tmp_path / d).exists() for d in "abc")  # refused before anything is written


def test_index_of_a_directory_without_shards_says_what_shards_are(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    line = error_line(capsys, "index", str(tmp_path))
    assert line == (f"mmfeed: error: {tmp_path}: directory holds no .tar shards (webdataset shards are uncompressed "
                    "*.tar files; nor is it a LeRobot v3 directory, which holds meta/info.json)")


def test_a_worker_traceback_is_cut_to_its_error_line():
    from mmfeed.cli import _one_line

    try:
        next(iter(DataLoader(_Failing(), batch_size=1, num_workers=1)))
    except ValueError as err:
        assert "Original Traceback" in str(err)
        assert _one_line(err) == "sample 0: broken on purpose"


class _Failing(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int):
        raise ValueError(f"sample {i}: broken\non purpose")

