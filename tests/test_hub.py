"""LeRobot datasets by Hub id (``open_dataset("org/name")``): LeRobot's local copy offline, the Hub's read in place
through huggingface_hub's filesystem, a download into LeRobot's folder, HTTP 429 backed off, and an unknown id
refused in one line naming every place looked. The Hub is a local server answering its API
(``tests/hub_server.py``), serving a LeRobot directory; huggingface_hub reads ``HF_ENDPOINT`` when it is imported,
so the in-place reads run in a fresh process."""

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
