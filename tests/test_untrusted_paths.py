"""Reads stay inside the dataset, and FFmpeg opens only video containers: each case is a real dataset (written by
mmfeed.testing's writers) with one field of its metadata changed, refused with one line naming the file, the field
and the value, before anything outside is read; a local index naming a URL makes no request to a real server."""

import json
import os
import shutil
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from http_server import serve
from mmfeed.codecs.demux import probe
from mmfeed.codecs.errors import DecodeError
from mmfeed.codecs.video import DecodeOptions, open_reader, read_frames
from mmfeed.loaders import open_dataset
from mmfeed.loaders.transport.confine import Confined, PathTemplate, UnsafePathError, shorten
from mmfeed.loaders.stores.index import INDEX_FILENAME, stale_shards, write_index
from mmfeed.loaders.formats.lerobot.source import LeRobotSource
from mmfeed.loaders.formats.webdataset.source import WebDatasetSource
from mmfeed.testing import frame_pattern, make_episodes, write_lerobot, write_video, write_webdataset

from cli_lines import error_line

CAM = "observation.images.cam_high"
VIDEO = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
DATA = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"


def episodes():
    return make_episodes(2, seed=7, cameras=("cam_high",), height=32, width=48, min_length=6, max_length=8)


@pytest.fixture(scope="module")
def lerobot(tmp_path_factory) -> Path:
    return Path(write_lerobot(tmp_path_factory.mktemp("untrusted") / "lerobot", episodes(), codec="h264"))


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("untrusted") / "shards"
    write_webdataset(out, episodes(), episodes_per_shard=1)
    return out


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFEED_CACHE", str(tmp_path / "cache"))  # index arrays derived afresh, not kept in ~


def edited(lerobot: Path, tmp_path: Path, **fields) -> Path:
    """A copy of the dataset at ``tmp_path/ds`` with ``fields`` of its info.json changed, and a second copy at
    ``tmp_path/elsewhere`` (real files outside it, for the changed paths to name)."""
    root = tmp_path / "ds"
    shutil.copytree(lerobot, root)
    shutil.copytree(lerobot, tmp_path / "elsewhere")
    info = json.loads((root / "meta" / "info.json").read_text())
    info.update(fields)
    (root / "meta" / "info.json").write_text(json.dumps(info))
    return root


def one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text and len(text) < 600, text
    return text


# -- LeRobot info.json: data_path / video_path name files inside the dataset ------------------------------------------


@pytest.mark.parametrize("field, value, reason", [
    ("video_path", "../elsewhere/" + VIDEO, "it climbs out with '..'"),
    ("video_path", "{root}/../elsewhere/" + VIDEO, "it is an absolute path"),
    ("data_path", "../elsewhere/" + DATA, "it climbs out with '..'"),
    ("data_path", "{root}/../elsewhere/" + DATA, "it is an absolute path"),
])
def test_a_template_naming_files_outside_is_refused_at_open(lerobot, tmp_path, field, value, reason):
    value = value.replace("{root}", str(tmp_path / "ds"))
    root = edited(lerobot, tmp_path, **{field: value})
    relative = value.replace("{video_key}", CAM).replace("{chunk_index:03d}", "000").replace("{file_index:03d}", "000")
    assert (root / relative).is_file()  # the file it names exists and was read before
    with pytest.raises(UnsafePathError) as err:
        LeRobotSource(root)
    line = one_line(err.value)
    assert line.startswith(f"{root / 'meta' / 'info.json'}: {field} {shorten(value)} names {shorten(relative)} (")
    assert f"chunk 0, file 0), outside the dataset ({reason}); a dataset's files must lie inside its directory" in line


def test_a_template_through_the_cli_is_one_line(lerobot, tmp_path, capsys):
    root = edited(lerobot, tmp_path, video_path="../elsewhere/" + VIDEO)
    line = error_line(capsys, "inspect", str(root))
    assert line.startswith(f"mmfeed: error: {root / 'meta' / 'info.json'}: video_path '../elsewhere/")
    assert "outside the dataset (it climbs out with '..')" in line


def test_a_symbolic_link_out_of_the_dataset_is_refused(lerobot, tmp_path):
    root = edited(lerobot, tmp_path)
    shutil.rmtree(root / "videos" / CAM)
    os.symlink(tmp_path / "elsewhere" / "videos" / CAM, root / "videos" / CAM)
    with pytest.raises(UnsafePathError) as err:
        LeRobotSource(root)
    line = one_line(err.value)
    assert line.startswith(f"{root / 'meta' / 'info.json'}: video_path {VIDEO!r} names ")
    assert f"outside the dataset (it resolves through a symbolic link to '{tmp_path / 'elsewhere'}" in line
    # a metadata file linked out of the dataset is refused too, naming it
    (root / "meta" / "stats.json").unlink()
    os.symlink(tmp_path / "elsewhere" / "meta" / "stats.json", root / "meta" / "stats.json")
    (root / "videos" / CAM).unlink()
    shutil.copytree(tmp_path / "elsewhere" / "videos" / CAM, root / "videos" / CAM)
    with pytest.raises(UnsafePathError, match=rf"^{root}: 'meta/stats.json' lies outside the dataset \(it resolves "
                                              "through a symbolic link to"):
        LeRobotSource(root)


def test_a_folder_the_user_trusts_may_be_linked_into(lerobot, tmp_path, monkeypatch):
    """videos/ linked to another disk, as users lay out their own data: refused until that disk is named in
    MMFEED_TRUSTED_ROOTS, then read like any other folder of the dataset (and only that folder is trusted)."""
    root = edited(lerobot, tmp_path)
    shutil.rmtree(root / "videos" / CAM)
    os.symlink(tmp_path / "elsewhere" / "videos" / CAM, root / "videos" / CAM)
    with pytest.raises(UnsafePathError, match="MMFEED_TRUSTED_ROOTS"):
        LeRobotSource(root)
    monkeypatch.setenv("MMFEED_TRUSTED_ROOTS",
                       os.pathsep.join(["/nonexistent", str(tmp_path / "elsewhere" / "videos")]))
    source = LeRobotSource(root)
    assert source.episode(0)[CAM].shape[0] == source.lengths[0]
    monkeypatch.setenv("MMFEED_TRUSTED_ROOTS", str(tmp_path / "elsewhere" / "meta"))
    with pytest.raises(UnsafePathError, match="through a symbolic link"):
        LeRobotSource(root)


def test_a_dataset_in_the_hugging_face_hub_cache_opens_through_its_blob_links(lerobot, tmp_path):
    """snapshots/<revision>/ holds links into the repository's blobs/, as huggingface_hub lays a download out."""
    repo = tmp_path / "hub" / "datasets--someone--robot"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    for k, path in enumerate(sorted(p for p in lerobot.rglob("*") if p.is_file())):
        blob = repo / "blobs" / f"{k:040x}"
        shutil.copyfile(path, blob)
        link = snapshot / path.relative_to(lerobot)
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    got, want = LeRobotSource(snapshot).episode(1), LeRobotSource(lerobot).episode(1)
    assert np.array_equal(got[CAM], want[CAM]) and np.array_equal(got["action"], want["action"])


@pytest.mark.parametrize("field, template, problem", [
    ("video_path", "videos/{video_key.__class__}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
     "field 'video_key.__class__' reaches into a value (attribute or item access)"),
    ("data_path", "data/chunk-{chunk_index.__doc__}/file-{file_index:03d}.parquet",
     "field 'chunk_index.__doc__' reaches into a value (attribute or item access)"),
    ("data_path", "data/chunk-{chunk_index[0]}/file-{file_index:03d}.parquet",
     "field 'chunk_index[0]' reaches into a value (attribute or item access)"),
    ("data_path", "data/chunk-{chunk_index:>3000000000}/file-{file_index:03d}.parquet",
     "field {chunk_index} has format spec '>3000000000'; it takes only an integer format such as 03d"),
    ("data_path", "data/chunk-{chunk_index:021d}/file-{file_index:03d}.parquet",
     "field {chunk_index} asks for width 21; at most 20"),
    ("data_path", "data/chunk-{chunk_index!r}/file-{file_index:03d}.parquet",
     "field {chunk_index} has a conversion '!r', which a path template does not take"),
    ("data_path", "data/chunk-{nope}/file-{file_index:03d}.parquet",
     "unknown field 'nope'; data_path may use {chunk_index}, {file_index}"),
    ("video_path", "videos/{video_key:>40}/file-{file_index:03d}.mp4", "field {video_key} has format spec '>40'"),
    ("data_path", "data/{0}.parquet", "positional field {0}"),
    ("data_path", "data/chunk-{.parquet", "not a valid template"),
])
def test_templates_take_only_their_documented_fields(lerobot, tmp_path, field, template, problem):
    root = tmp_path / "ds"
    shutil.copytree(lerobot, root)
    info = json.loads((root / "meta" / "info.json").read_text())
    (root / "meta" / "info.json").write_text(json.dumps({**info, field: template}))
    with pytest.raises(UnsafePathError) as err:
        LeRobotSource(root)
    line = one_line(err.value)
    assert line.startswith(f"{root / 'meta' / 'info.json'}: {field} ") and problem in line


def test_the_templates_lerobot_writes_fill_as_str_format_did():
    video = PathTemplate(VIDEO, ("video_key", "chunk_index", "file_index"), where="info.json", field="video_path")
    assert video.fill(video_key=CAM, chunk_index=3, file_index=12) == VIDEO.format(video_key=CAM, chunk_index=3,
                                                                                   file_index=12)
    plain = PathTemplate("d/{chunk_index}-{file_index:6d}-{{x}}", ("chunk_index", "file_index"), where="i", field="f")
    assert plain.fill(chunk_index=1234, file_index=5) == "d/1234-     5-{x}"


def test_a_feature_name_cannot_lead_out_of_a_dataset(tmp_path):
    """The filled path is judged, not the template: a feature name (video_key) with '..' or a URL is refused."""
    video = PathTemplate(VIDEO, ("video_key", "chunk_index", "file_index"), where="info.json", field="video_path")
    local, remote = Confined(str(tmp_path), url=False), Confined("https://example.com/ds", url=True)
    for key, reason in [("../../etc", "it climbs out with '..'"), ("http://x", "it is a URL")]:
        path = video.fill(video_key=key, chunk_index=0, file_index=0)
        assert local.outside(path) == reason and remote.outside(path) == reason
    assert remote.outside("videos/%2e%2e/%2E%2E/x.mp4") == "it climbs out with '..'"
    assert remote.outside("videos/x.mp4?y=1") == "it holds '?', '#' or a backslash, which a URL reads otherwise"
    assert local.outside("videos/x.mp4") is None and remote.outside("videos/x.mp4") is None


# -- webdataset: the index's shard column names shards inside the index's folder ----------------------------------


def rewrite_shards(index: Path, shard) -> None:
    """Rewrite every value of the index's ``shard`` column with ``shard(old value)``, keeping its metadata."""
    table = pq.read_table(index)
    column = pa.array([shard(s) for s in table["shard"].to_pylist()], pa.string())
    pq.write_table(table.set_column(table.schema.get_field_index("shard"), table.schema.field("shard"), column),
                   index)


@pytest.mark.parametrize("how, reason", [
    ("absolute", "it is an absolute path"),
    ("dotdot", "it climbs out with '..'"),
    ("symlink", "it resolves through a symbolic link to"),
])
def test_an_index_naming_shards_outside_its_folder_is_refused(shards, tmp_path, how, reason):
    root, elsewhere = tmp_path / "ds", tmp_path / "elsewhere"
    shutil.copytree(shards, root)
    shutil.copytree(shards, elsewhere)
    index = root / INDEX_FILENAME
    if how == "absolute":
        rewrite_shards(index, lambda s: str(elsewhere / s))
    elif how == "dotdot":
        rewrite_shards(index, lambda s: f"../elsewhere/{s}")
    else:
        for tar in root.glob("*.tar"):
            tar.unlink()
            os.symlink(elsewhere / tar.name, tar)
    with pytest.raises(UnsafePathError) as err:
        open_dataset(root)
    line = one_line(err.value)
    assert line.startswith(f"{index}: column 'shard' names '") and f"outside the index's folder ({reason}" in line
    assert line.endswith("an index reads only shards inside its own folder")


def test_a_local_index_naming_a_url_sends_no_request(shards, tmp_path, capsys):
    root = tmp_path / "ds"
    shutil.copytree(shards, root)
    asked = []
    with serve(shards, fault=lambda n, path: asked.append(path)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        rewrite_shards(root / INDEX_FILENAME, lambda s: f"{url}/{s}")
        for check_index in (True, False):
            with pytest.raises(UnsafePathError, match=r"it is a URL, and a local index names only files beside it"):
                WebDatasetSource(root, check_index=check_index)
        with pytest.raises(UnsafePathError, match=r"it is a URL, and a local index names only files beside it"):
            stale_shards(root / INDEX_FILENAME)
        line = error_line(capsys, "inspect", str(root))
    assert line.startswith(f"mmfeed: error: {root / INDEX_FILENAME}: column 'shard' names '{url}/shard-000000.tar'")
    assert asked == []  # neither the HEAD of the staleness check nor a GET of a member


def test_a_remote_index_naming_shards_on_another_host_sends_them_no_request(shards, tmp_path):
    served, other = tmp_path / "served", tmp_path / "other"
    shutil.copytree(shards, served)
    shutil.copytree(shards, other)
    asked = []
    with serve(served) as index_server, serve(other, fault=lambda n, path: asked.append(path)) as other_server:
        there = f"http://127.0.0.1:{other_server.server_address[1]}"
        rewrite_shards(served / INDEX_FILENAME, lambda s: f"{there}/{s}")
        index_url = f"http://127.0.0.1:{index_server.server_address[1]}/{INDEX_FILENAME}"
        with pytest.raises(UnsafePathError) as err:
            WebDatasetSource(index_url)
        assert "it is a URL under another scheme, host or folder than the index's own" in one_line(err.value)
        # the same shards named under the index's own URL are read (an index under another name: the range cache
        # keeps the first one's bytes)
        own = served / "own.parquet"
        shutil.copyfile(served / INDEX_FILENAME, own)
        rewrite_shards(own, lambda s: f"{index_url.rsplit('/', 1)[0]}/{s.rsplit('/', 1)[1]}")
        source = WebDatasetSource(index_url.replace(INDEX_FILENAME, own.name))
        assert np.array_equal(source.episode(0)["action"], WebDatasetSource(shards).episode(0)["action"])
    assert asked == []


def test_an_index_is_not_written_where_its_shards_would_be_refused(shards, tmp_path):
    (tmp_path / "index").mkdir()
    with pytest.raises(UnsafePathError, match=r"shard '\.\./.*' lies outside the index's folder \(it climbs out with "
                                              r"'\.\.'\); .* write it into a folder that holds every shard"):
        write_index(sorted(str(p) for p in shards.glob("*.tar")), tmp_path / "index" / INDEX_FILENAME)
    assert not (tmp_path / "index" / INDEX_FILENAME).exists()


# -- FFmpeg opens only video containers -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secret(tmp_path_factory) -> Path:
    """A real video outside every dataset of these tests."""
    return Path(write_video(tmp_path_factory.mktemp("secret") / "secret.mp4", frame_pattern(5, height=48, width=64),
                            gop=2))


def hls_playlist(path: Path, target: Path) -> Path:
    path.write_text(f"#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:10\n#EXTINF:10.0,\n{target}\n#EXT-X-ENDLIST\n")
    return path


def test_an_hls_playlist_in_a_dataset_is_not_a_video_container(lerobot, secret, tmp_path, capsys):
    root = edited(lerobot, tmp_path, video_path=VIDEO.replace(".mp4", ".m3u8"))
    playlist = hls_playlist(root / "videos" / CAM / "chunk-000" / "file-000.m3u8", secret)
    with av.open(str(playlist)) as container:  # what FFmpeg does with it unasked: the frames of the file elsewhere
        assert container.format.name == "hls" and len(list(container.decode(video=0))) == 5
    said = f"{playlist}: not a video container (an HLS playlist); mmfeed opens only MP4/MOV and Matroska/WebM videos"
    with pytest.raises(DecodeError) as err:
        read_frames(playlist, [0])
    assert one_line(err.value) == said
    with pytest.raises(ValueError) as err:
        LeRobotSource(root).episode(0)
    assert str(playlist) in one_line(err.value) and "not a video container (an HLS playlist)" in str(err.value)
    line = error_line(capsys, "cache", str(root), "--dir", str(tmp_path / "frames"), "--processes", "1",
                      "--no-progress")
    assert str(playlist) in line and "not a video container (an HLS playlist)" in line


def test_a_concat_list_is_not_a_video_container(secret, tmp_path):
    shutil.copyfile(secret, tmp_path / "inner.mp4")
    listing = tmp_path / "file-000.mp4"
    listing.write_text("ffconcat version 1.0\nfile inner.mp4\n")
    with av.open(str(listing)) as container:  # FFmpeg follows it unasked
        assert container.format.name == "concat" and len(list(container.decode(video=0))) == 5
    with pytest.raises(DecodeError) as err:
        probe(listing)
    assert one_line(err.value) == (f"{listing}: not a video container (an FFmpeg concat list); mmfeed opens only "
                                   "MP4/MOV and Matroska/WebM videos")
    with pytest.raises(DecodeError, match=r"^<\d+ bytes in memory>: not a video container \(an FFmpeg concat list\)"):
        probe(listing.read_bytes())  # a tar member's bytes: the same demuxers


def test_decoders_that_open_files_themselves_get_only_video_containers(secret, tmp_path):
    """decord opens a path with its own FFmpeg: the file's first bytes are checked before it gets it (here a
    playlist swapped in after the real file was probed)."""
    pytest.importorskip("decord")
    playlist = hls_playlist(tmp_path / "v.mp4", secret)
    with pytest.raises(DecodeError, match=rf"^{playlist}: not a video container \(an HLS playlist\)"):
        open_reader(playlist, DecodeOptions(backend="decord"), info=probe(secret))
    assert read_frames(secret, [0, 4], backend="decord").shape == (2, 48, 64, 3)
