"""The published control rates of the Open X-Embodiment datasets: the table itself, and the default ``fps`` an RLDS
dataset takes from it by the name its ``dataset_info.json`` records (``fps=`` still overriding it, and a name the
table lacks still needing ``fps=``)."""

import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from mmfeed.loaders import WindowSpec, open_dataset
from mmfeed.loaders.formats.rlds.rates import OXE_RATES, published_rate

CORPUS_NAME = "mmfeed_rlds_corpus"
VERSION = Path(__file__).parent / "rlds_corpus" / CORPUS_NAME / "1.0.0"
STATE, ACTION = "observation.state", "action"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MMFEED_CACHE", str(tmp_path / "cache"))


def renamed(tmp_path: Path, name: str) -> Path:
    """A copy of the corpus whose dataset_info.json says ``name`` (its shards renamed to match, as TFDS names them
    after the dataset)."""
    target = tmp_path / name / "1.0.0"
    target.mkdir(parents=True)
    for path in VERSION.iterdir():
        shutil.copy2(path, target / path.name.replace(CORPUS_NAME, name))
    info = json.loads((target / "dataset_info.json").read_text())
    info["name"] = name
    (target / "dataset_info.json").write_text(json.dumps(info))
    return target


def test_every_rate_is_a_positive_finite_number_of_hz_by_a_tfds_name():
    assert len(OXE_RATES) >= 60
    for name, hz in OXE_RATES.items():
        assert isinstance(name, str) and name == name.strip().lower() and " " not in name, name
        assert type(hz) is float and math.isfinite(hz) and 0 < hz <= 100, (name, hz)
        assert published_rate(name) == hz


@pytest.mark.parametrize("name, hz", [
    ("fractal20220817_data", 3.0), ("kuka", 10.0), ("bridge", 5.0), ("bridge_dataset", 5.0), ("taco_play", 15.0),
    ("jaco_play", 10.0), ("language_table", 10.0), ("toto", 30.0), ("viola", 20.0), ("berkeley_autolab_ur5", 5.0),
    ("nyu_door_opening_surprising_effectiveness", 3.0), ("ucsd_kitchen_dataset_converted_externally_to_rlds", 2.0),
    ("asu_table_top_converted_externally_to_rlds", 12.5), ("dobbe", 3.75), ("eth_agent_affordances", 66.6),
    ("robo_net", 1.0), ("droid", 15.0), ("r2d2_faceblur", 15.0), ("droid_101", 15.0),
])
def test_spot_values_are_the_published_ones(name, hz):
    assert published_rate(name) == hz


@pytest.mark.parametrize("name", [
    CORPUS_NAME, "", "Taco_Play", "taco_play ", "stanford_mask_vit_converted_externally_to_rlds",  # no number
    "vima_converted_externally_to_rlds", "tidybot", "io_ai_tech", "spoc",  # none, or published copies disagree
])
def test_a_name_without_a_published_rate_has_none(name):
    assert published_rate(name) is None


def test_an_oxe_dataset_opened_without_fps_takes_its_published_rate_and_says_so(tmp_path, caplog):
    path = renamed(tmp_path, "taco_play")
    with caplog.at_level(logging.INFO, logger="mmfeed.loaders.formats.rlds.source"):
        ds = open_dataset(path)
    assert ds.dataset_name == "taco_play"
    assert ds.fps.dtype == np.float64 and len(ds.fps) == len(ds) and (ds.fps == 15.0).all()
    assert ds.features[ACTION].fps == 15.0 and ds.features[STATE].fps == 15.0
    assert ds.episode(0)["fps"] == 15.0
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("15 Hz" in m and "'taco_play'" in m and "fps= overrides it" in m for m in said), said
    # windows are timed: one step ahead is 1/15 s
    sample = ds.windows(WindowSpec.from_delta_timestamps({STATE: [0.0, 1 / 15]}))[0]
    whole = ds.episode(int(sample["episode_index"]))[STATE]
    t = int(sample["frame_index"])
    assert np.array_equal(np.asarray(sample[STATE]), whole[t:t + 2])


def test_fps_given_overrides_the_published_rate_and_logs_nothing(tmp_path, caplog):
    path = renamed(tmp_path, "taco_play")
    with caplog.at_level(logging.INFO, logger="mmfeed.loaders.formats.rlds.source"):
        ds = open_dataset(path, fps=7.5)
    assert (ds.fps == 7.5).all() and ds.features[ACTION].fps == 7.5 and ds.episode(0)["fps"] == 7.5
    assert not [r for r in caplog.records if "published control frequency" in r.getMessage()]


@pytest.mark.parametrize("name", [CORPUS_NAME, "io_ai_tech"])
def test_a_name_the_table_lacks_still_needs_fps(tmp_path, name):
    ds = open_dataset(VERSION if name == CORPUS_NAME else renamed(tmp_path, name))
    assert ds.dataset_name == name and ds.episode(0)["fps"] is None
    with pytest.raises(ValueError, match=r"RLDS records no control rate; pass fps="):
        ds.fps
    with pytest.raises(ValueError, match=r"RLDS records no control rate; pass fps="):
        ds.windows(WindowSpec.from_delta_timestamps({STATE: [0.0]}))[0]
