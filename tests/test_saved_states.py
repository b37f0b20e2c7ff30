"""States saved by an earlier mmfeed load and resume exactly, and a few configurations still digest as recorded.

``tests/saved_states/`` was written by ``python tests/house_digest.py --write-states``: each ``<name>.pt`` is a
loader's ``state_dict()`` taken in its second epoch, saved with ``torch.save`` as users save it, and
``states.json`` the sha256 of the batches that followed it; ``digest.json`` holds every configuration's digest
(see the module docstring of ``house_digest.py``). A change that alters any of them changes behaviour: if it is
meant, regenerate them with ``--write-states`` and say so in the commit.
"""

import json

import numpy as np
import pytest
import torch

import house_digest
from house_digest import BY_NAME, CONFIGS, SAVED, STATES_DIR, Data, batches_digest, digest_of, run_config

STATES = json.loads((STATES_DIR / "states.json").read_text())
GOLDEN = json.loads((STATES_DIR / "digest.json").read_text())
CHEAP = ["records-w0", "map-shuffle-generator-w0", "windows-uniform-wds-w0"]


@pytest.fixture(scope="module")
def data():
    with Data() as d:
        yield d


def test_the_saved_states_are_the_listed_configurations():
    assert sorted(STATES) == sorted(SAVED)
    assert all((STATES_DIR / STATES[name]["file"]).is_file() for name in SAVED)


@pytest.mark.parametrize("name", SAVED)
def test_a_saved_state_loads_with_weights_only_and_resumes_with_the_recorded_batches(data, name):
    # plain ints, strings, lists and (a shuffle's generator state) a uint8 tensor: torch's safe loader takes them
    state = torch.load(STATES_DIR / STATES[name]["file"], weights_only=True)
    assert digest_of(state, data.roots) == STATES[name]["state_sha256"]
    house_digest.seed_torch(name + "/resumed")  # as the run that recorded it (none of these orders reads it)
    loader = BY_NAME[name].build(data)
    loader.load_state_dict(state)
    digest, batches = batches_digest(iter(loader), data.roots)
    assert len(batches) == STATES[name]["resumed_batches"] > 0
    assert digest == STATES[name]["resumed_sha256"], f"{name}: the batches after the saved state changed"


def test_the_golden_digest_names_every_configuration_and_its_total():
    assert list(GOLDEN) == [c.name for c in CONFIGS] + ["total"]
    assert house_digest.total_digest(GOLDEN) == GOLDEN["total"]


@pytest.mark.parametrize("name", CHEAP)
def test_a_cheap_configuration_digests_as_recorded(data, name):
    result = run_config(name, data)
    assert result.resume_matches, f"{name}: the resumed batches are not the rest of the uninterrupted epoch"
    assert result.digest == GOLDEN[name], f"{name}: sections {result.sections}"


@pytest.mark.slow
def test_every_configuration_digests_as_recorded():
    results = house_digest.digest_all()
    digests = {name: r.digest for name, r in results.items()}
    assert [name for name, r in results.items() if not r.resume_matches] == []
    assert {n: d for n, d in digests.items() if d != GOLDEN[n]} == {}
    assert house_digest.total_digest(digests) == GOLDEN["total"]


# -- the encoding itself: what changes a digest and what does not ------------------------------------------------

def test_one_byte_dtype_or_shape_changes_a_tensor_digest():
    t = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    changed = t.clone()
    changed[2, 3] += 1
    digests = {digest_of(x) for x in (t, changed, t.to(torch.int64), t.reshape(4, 3), t.numpy())}
    assert len(digests) == 5
    assert digest_of(t) == digest_of(t.t().contiguous().t())  # layout in memory does not matter, values do


def test_dict_order_does_not_change_a_digest_but_keys_and_types_do():
    a = {"b": 1, "a": [1.5, "x", None, (True,)]}
    b = {"a": [1.5, "x", None, (True,)], "b": 1}
    assert digest_of(a) == digest_of(b)
    others = [{"b": 1.0, "a": a["a"]}, {"b": 1, "a": [1.5, "x", None, [True]]}, {"b": np.int64(1), "a": a["a"]},
              {"c": 1, "a": a["a"]}]
    assert len({digest_of(x) for x in [a, *others]}) == 5


def test_the_data_root_is_left_out_of_strings(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert digest_of(f"{one}/wds/index.parquet", (str(one),)) == digest_of(f"{two}/wds/index.parquet", (str(two),))
    assert digest_of(f"{one}/wds/a", (str(one),)) != digest_of(f"{one}/wds/b", (str(one),))


def test_an_object_without_a_stable_encoding_is_refused():
    with pytest.raises(TypeError, match="no stable encoding for .*Generator"):
        digest_of({"g": torch.Generator()})
