"""LeRobot datasets by Hub id (``open_dataset("org/name")``): LeRobot's local copy offline, the Hub's read in place
through huggingface_hub's filesystem, a download into LeRobot's folder, HTTP 429 backed off, and an unknown id
refused in one line naming every place looked; and LeRobot directories in storage buckets
(``hf://buckets/<namespace>/<bucket>[/<prefix>]``). The Hub is a local server answering its API
(``tests/hub_server.py``), serving a LeRobot directory from a dataset repository and from buckets; huggingface_hub
reads ``HF_ENDPOINT`` when it is imported, so the in-place reads run in a fresh process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mmfeed.loaders import open_dataset
from mmfeed.testing import make_episodes, write_lerobot

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from hub_server import serve_hub  # noqa: E402

pytest.importorskip("huggingface_hub")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    episodes = make_episodes(3, seed=0, cameras=("cam_high",), height=32, width=48, min_length=8, max_length=12)
    return Path(write_lerobot(tmp_path_factory.mktemp("hub") / "pusht", episodes))


def digest(ds) -> list[dict]:
    return [{k: np.asarray(v).tolist() for k, v in ds.episode(i).items() if k != "fps"} for i in range(len(ds))]


def test_a_hub_id_opens_lerobots_own_copy_without_the_network(dataset, tmp_path, monkeypatch):
    home = tmp_path / "lerobot-home"
    shutil.copytree(dataset, home / "lerobot" / "pusht")
    monkeypatch.setenv("HF_LEROBOT_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    ds = open_dataset("lerobot/pusht")
    assert ds.name == str(home / "lerobot" / "pusht")
    assert digest(ds) == digest(open_dataset(str(dataset)))


def test_an_unknown_id_offline_is_one_line_naming_every_place_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        open_dataset("lerobot/nowhere")
    message = str(info.value)
    assert "\n" not in message and message.startswith("lerobot/nowhere: no such file or directory")
    assert str(tmp_path / "home" / "lerobot" / "nowhere") in message and "HF_HUB_OFFLINE is set" in message
    run = subprocess.run([sys.executable, "-m", "mmfeed", "inspect", "lerobot/nowhere"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={**os.environ})
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("mmfeed: error: lerobot/nowhere: no such file or directory")


def test_paths_that_are_no_hub_id_are_not_taken_for_one(tmp_path, monkeypatch, dataset):
    from mmfeed.loaders.formats.lerobot.hub import is_hub_id

    monkeypatch.chdir(dataset.parent)
    assert is_hub_id("lerobot/pusht") and is_hub_id("org-1/name_2.v3")
    assert not is_hub_id(dataset.name)  # one name, no slash
    assert not any(is_hub_id(s) for s in ("a/b/c", "../x", "s3://b/k", "shards/x.tar", "a/{0..3}.tar", "/abs/x"))
    (dataset.parent / "local").mkdir()
    (dataset.parent / "local" / "ds").mkdir()
    assert not is_hub_id("local/ds")  # a local folder of that name is a path


CHILD = """
import json, os, sys, time
import numpy as np
from mmfeed.loaders import open_dataset

def digest(ds):
    return [{k: np.asarray(v).tolist() for k, v in ds.episode(i).items() if k != "fps"} for i in range(len(ds))]

local = digest(open_dataset(os.environ["LOCAL"]))
out = {}
if sys.argv[1] == "throttled":  # the server answers the first file requests with 429
    start = time.perf_counter()
    out["same"] = digest(open_dataset("hf://datasets/org/pusht")) == local
    out["seconds"] = time.perf_counter() - start
else:
    hub = open_dataset("org/pusht")
    out["hub_name"], out["hub_same"] = hub.name, digest(hub) == local
    out["url_same"] = digest(open_dataset("hf://datasets/org/pusht")) == local
    out["revision_name"] = open_dataset("org/pusht", revision="main").name
    got = open_dataset("org/pusht", download=True)
    out["download_name"], out["download_same"] = got.name, digest(got) == local
print(json.dumps(out))
"""


def run_child(mode: str, env: dict, cwd: Path) -> dict:
    run = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True, text=True, timeout=240,
                         cwd=cwd)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two fresh processes reading through the local Hub
def test_the_hubs_copy_reads_in_place_downloads_and_backs_off_429(dataset, tmp_path):
    with serve_hub({"org/pusht": dataset}) as server:
        env = {**os.environ, "HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HOME": str(tmp_path / "hf-home"), "HF_LEROBOT_HOME": str(tmp_path / "lerobot-home"),
               "LOCAL": str(dataset), "MMFEED_CACHE": str(tmp_path / "cache")}
        out = run_child("all", env, tmp_path)
        assert not server.throttled
        server.throttle = 3
        throttled = run_child("throttled", env, tmp_path)
        assert server.throttled == 3
    assert out["hub_name"] == "hf://datasets/org/pusht" and out["hub_same"] and out["url_same"]
    assert out["revision_name"] == "hf://datasets/org/pusht@main"
    assert out["download_name"] == str(tmp_path / "lerobot-home" / "org" / "pusht") and out["download_same"]
    assert (tmp_path / "lerobot-home" / "org" / "pusht" / "meta" / "info.json").is_file()
    assert throttled["same"] and throttled["seconds"] >= 3.0  # three answers of Retry-After: 1, each waited out


BUCKET_CHILD = """
import hashlib, json, os, sys
import numpy as np
from mmfeed import DataLoader
from mmfeed.loaders import WindowSpec, open_dataset

def digest(ds):
    return [{k: np.asarray(v).tolist() for k, v in ds.episode(i).items() if k != "fps"} for i in range(len(ds))]

def batches(ds, num_workers):
    cameras = [f for f, s in ds.features.items() if s.kind == "video"]
    spec = WindowSpec.from_delta_timestamps({**{c: [-1 / 30, 0.0] for c in cameras}, "observation.state": [0.0],
                                             "action": [0.0, 1 / 30]})
    out = []
    for batch in DataLoader(ds.windows(spec), batch_size=4, num_workers=num_workers):
        out.append({k: hashlib.sha256(np.ascontiguousarray(np.asarray(v)).tobytes()).hexdigest()
                    + str(np.asarray(v).shape) for k, v in sorted(batch.items()) if k in cameras
                    or k in ("observation.state", "action")})
    return out

local = open_dataset(os.environ["LOCAL"])
want, want_batches = digest(local), batches(local, 0)
out = {"batches": len(want_batches)}
for url in sys.argv[1:]:
    ds = open_dataset(url)
    out[url] = {"name": ds.name, "same": digest(ds) == want, "windows_same": batches(ds, 2) == want_batches}
for url in ("hf://buckets/ns/nowhere", "hf://buckets/ns/pusht/meta/info.json"):
    try:
        open_dataset(url)
        out[url] = "opened"
    except Exception as err:
        out[url] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""


@pytest.mark.slow  # a fresh process reading two buckets through the local Hub, with DataLoader workers
def test_a_lerobot_directory_in_a_storage_bucket_reads_in_place(dataset, tmp_path):
    """``hf://buckets/<namespace>/<bucket>[/<prefix>]``: a LeRobot directory at a bucket's root and one under a
    prefix (next to a file the prefix matches as text, which the Hub lists too) open with the local episodes, the
    Hub's HTTP 429 waited out, and windows through ``DataLoader`` with two workers are the local batches; every
    parquet and video file is read with ranged GETs of the bucket's resolve URL; a missing bucket is a one-line
    FileNotFoundError naming the URL and the bucket, and a path inside a file of a bucket is "no dataset there",
    not huggingface_hub's KeyError."""
    shutil.copytree(dataset, tmp_path / "root")
    shutil.copytree(dataset, tmp_path / "prefixed" / "datasets" / "pusht")
    (tmp_path / "prefixed" / "datasets" / "pusht_notes.txt").write_text("not part of the dataset\n")
    urls = ["hf://buckets/ns/pusht", "hf://buckets/ns/shelf/datasets/pusht"]
    with serve_hub({}, buckets={"ns/pusht": tmp_path / "root", "ns/shelf": tmp_path / "prefixed"}) as server:
        env = {**os.environ, "HF_ENDPOINT": server.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1",
               "HF_HOME": str(tmp_path / "hf-home"), "LOCAL": str(dataset), "MMFEED_CACHE": str(tmp_path / "cache"),
               "MMFEED_REMOTE_BLOCK_BYTES": "4096"}
        server.throttle = 2  # the first two file reads answered 429 with Retry-After: 1
        run = subprocess.run([sys.executable, "-c", BUCKET_CHILD, *urls], env=env, capture_output=True, text=True,
                             timeout=240, cwd=tmp_path, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["batches"] >= 3 and server.throttled == 2
    for url in urls:
        assert out[url] == {"name": url, "same": True, "windows_same": True}, url
    assert ("GET", "/api/buckets/ns/shelf") in server.requests
    assert any(p.startswith("/api/buckets/ns/shelf/tree/datasets%2Fpusht") for _, p in server.requests)
    read = [(rel, header) for rel, header in server.ranges if rel.endswith((".parquet", ".mp4"))]
    assert {rel for rel, _ in read} >= {"data/chunk-000/file-000.parquet",
                                       "datasets/pusht/data/chunk-000/file-000.parquet",
                                       "videos/observation.images.cam_high/chunk-000/file-000.mp4",
                                       "datasets/pusht/videos/observation.images.cam_high/chunk-000/file-000.mp4"}
    assert all(header and header.startswith("bytes=") for _, header in read), read
    missing = out["hf://buckets/ns/nowhere"]
    assert missing.startswith("FileNotFoundError: hf://buckets/ns/nowhere") and "\n" not in missing
    assert "the Hub has no bucket ns/nowhere (if it is private: log in with `hf auth login` or set HF_TOKEN)" in missing
    inside = out["hf://buckets/ns/pusht/meta/info.json"]
    assert inside.startswith("FileNotFoundError: hf://buckets/ns/pusht/meta/info.json: no dataset there"), inside


def test_the_local_hub_answers_huggingface_hubs_bucket_calls(dataset, tmp_path, monkeypatch):
    """The bucket API of ``tests/hub_server.py`` as huggingface_hub's own client reads it (in this process, with
    the server's endpoint given explicitly): the bucket's info, tree listings at the root and under a prefix
    (recursive, and one level with its folders; a prefix matching other names as text), paths-info, a missing
    bucket, and byte ranges of a file through ``HfFileSystem``."""
    import huggingface_hub.constants
    from huggingface_hub import HfApi, HfFileSystem
    from huggingface_hub.errors import BucketNotFoundError

    # the suite's HF_HUB_OFFLINE=1 (read when huggingface_hub is imported) lifted for this test's local server only
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)

    shutil.copytree(dataset, tmp_path / "b" / "datasets" / "pusht")
    (tmp_path / "b" / "datasets" / "pusht_notes.txt").write_text("notes\n")
    files = sorted(p.relative_to(tmp_path / "b").as_posix() for p in (tmp_path / "b").rglob("*") if p.is_file())
    info = (tmp_path / "b" / "datasets" / "pusht" / "meta" / "info.json").read_bytes()
    with serve_hub({}, buckets={"ns/b": tmp_path / "b"}) as server:
        api = HfApi(endpoint=server.url, token=False)
        about = api.bucket_info("ns/b")
        assert (about.id, about.total_files) == ("ns/b", len(files))
        assert about.size == sum((tmp_path / "b" / f).stat().st_size for f in files)
        assert sorted(e.path for e in api.list_bucket_tree("ns/b", recursive=True)) == files
        top = {(e.type, e.path) for e in api.list_bucket_tree("ns/b", "datasets/pusht", recursive=False)}
        children = {("directory" if p.is_dir() else "file", f"datasets/pusht/{p.name}") for p in dataset.iterdir()}
        assert top == children | {("file", "datasets/pusht_notes.txt")}  # the prefix matched as text, as the Hub does
        found = list(api.get_bucket_paths_info("ns/b", ["datasets/pusht/meta/info.json", "datasets/pusht", "nope"]))
        assert [(f.path, f.size) for f in found] == [("datasets/pusht/meta/info.json", len(info))]
        fs = HfFileSystem(endpoint=server.url, token=False, skip_instance_cache=True)
        assert fs.cat_file("buckets/ns/b/datasets/pusht/meta/info.json", start=5, end=40) == info[5:40]
        rel, header = server.ranges[-1]
        assert rel == "datasets/pusht/meta/info.json" and header.startswith("bytes=5-")
        assert sorted(fs.ls("buckets/ns/b/datasets/pusht", detail=False)) == sorted(
            f"buckets/ns/b/{path}" for _, path in children)  # huggingface_hub drops the text match
        with pytest.raises(BucketNotFoundError):
            api.bucket_info("ns/nowhere")
