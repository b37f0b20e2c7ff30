"""A mixture of three robots read as one dataset: each sample's real dimensions are its own dataset's, the padding
is zero and flagged, and it says where it came from.

The robots (:mod:`mmfeed.testing.synth_embodiments`): a 7-dim arm with one camera (a LeRobot directory), a 14-dim
bimanual robot with two (webdataset shards), a 2-dim mobile base with none (a LeRobot directory). Each dataset
opened alone is the oracle: the mixture's windows, whole episodes and packed batches must hold its samples,
widened with zeros, with masks that say which elements and frames are real.
"""

import numpy as np
import pytest
import torch

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.planned.transforms import Normalize
from mmfeed.testing import make_episodes, write_lerobot
from mmfeed.testing.synth_embodiments import EMBODIMENTS, write_embodiments

PRIMARY, WRIST = "observation.images.primary", "observation.images.wrist"
STATE, ACTION = "observation.state", "action"
PAD = {ACTION: 32, STATE: 32, "observation.velocity": 32}
# each robot's cameras onto the shared slots, as Octo maps them
RENAME = {"franka": {"observation.images.front": PRIMARY}, "aloha": {"observation.images.top": PRIMARY}}
DELTAS = {PRIMARY: [0.0], WRIST: [-1 / 30, 0.0], STATE: [-1 / 30, 0.0], ACTION: [i / 30 for i in range(4)]}
SPEC = WindowSpec.from_delta_timestamps(DELTAS)
NAMES = list(EMBODIMENTS)
DIMS = [EMBODIMENTS[n][0] for n in NAMES]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    return write_embodiments(tmp_path_factory.mktemp("robots"), episodes=3, min_length=8, max_length=14)


@pytest.fixture(scope="module")
def mix(paths):
    return open_dataset(paths, pad_to=PAD, rename=RENAME, embodiments=["arm", "bimanual", "base"])


@pytest.fixture(scope="module")
def alone(paths):
    """Each dataset opened by itself, and the names its features have there."""
    return [open_dataset(paths[n]) for n in NAMES]


def own_name(d, feature):
    """``feature``'s name in dataset ``d`` (before the renames)."""
    back = {new: old for old, new in RENAME.get(NAMES[d], {}).items()}
    return back.get(feature, feature)


def own_spec(source, d):
    """The window of SPEC over the features dataset ``d`` has, under its own names."""
    deltas = {own_name(d, f): v for f, v in DELTAS.items() if own_name(d, f) in source.features}
    return WindowSpec.from_delta_timestamps(deltas)


def offsets(alone):
    return np.concatenate([[0], np.cumsum([len(s) for s in alone])])


def alone_sample(alone, views, sample):
    """The sample dataset ``sample['dataset']`` gives alone at the same episode and anchor step."""
    d = int(sample["dataset"])
    episode = int(sample["episode_index"]) - int(offsets(alone)[d])
    starts = np.concatenate([[0], np.cumsum(alone[d].lengths)])
    want = views[d][int(starts[episode]) + int(sample["frame_index"])]
    assert (want["episode_index"], want["frame_index"]) == (episode, sample["frame_index"])
    return d, want


def check_against_alone(sample, d, want):
    """``sample`` (of the mixture) holds ``want`` (dataset ``d`` alone): padded arrays, masks, zero cameras."""
    for feature in DELTAS:
        mine = own_name(d, feature)
        if feature in PAD:
            dim = DIMS[d]
            assert sample[feature].shape[-1] == PAD[feature]
            assert torch.equal(sample[feature][..., :dim], want[mine])
            assert not sample[feature][..., dim:].any(), "padding is zero"
            assert sample[f"{feature}_dim_mask"].tolist() == [j < dim for j in range(PAD[feature])]
            assert torch.equal(sample[f"{feature}_is_pad"], want[f"{mine}_is_pad"])
        elif mine in want:
            assert torch.equal(sample[feature], want[mine]) and torch.equal(sample[f"{feature}_is_pad"],
                                                                            want[f"{mine}_is_pad"])
        else:  # a camera this robot lacks: zeros, every frame flagged
            assert sample[feature].shape == (len(DELTAS[feature]), 32, 48, 3) and not sample[feature].any()
            assert sample[f"{feature}_is_pad"].all()


def test_the_windows_view_holds_each_datasets_own_samples_padded_and_masked(mix, alone):
    views = [s.windows(own_spec(s, d)) for d, s in enumerate(alone)]
    view = mix.windows(SPEC)
    assert len(view) == sum(len(v) for v in views)
    assert mix.features[ACTION].shape == (32,) and mix.features[STATE].shape == (32,)
    keys, seen = set(), set()
    for i in range(0, len(view), 3):
        sample = view[i]
        keys.add(tuple(sorted(sample)))
        d, want = alone_sample(alone, views, sample)
        assert sample["embodiment"] == d  # one embodiment per dataset, in order
        check_against_alone(sample, d, want)
        seen.add(d)
    assert seen == {0, 1, 2} and len(keys) == 1, "every sample of the mixture has one set of keys"


def test_whole_episodes_are_each_datasets_own_padded_with_their_dim_masks(mix, alone):
    starts = offsets(alone)
    for d, source in enumerate(alone):
        for e in (0, len(source) - 1):
            got, want = mix.episode(int(starts[d]) + e), source.episode(e)
            assert (got["dataset"], got["embodiment"]) == (d, d)
            for feature, width in PAD.items():
                assert got[feature].shape == (len(want[feature]), width)
                assert np.array_equal(got[feature][:, : DIMS[d]], want[feature]) and not got[feature][:, DIMS[d]:].any()
                assert got[f"{feature}_dim_mask"].tolist() == [j < DIMS[d] for j in range(width)]
            for feature, value in want.items():  # cameras (under the shared names) and the rest as they are
                if feature not in PAD and isinstance(value, np.ndarray):
                    name = RENAME.get(NAMES[d], {}).get(feature, feature)
                    assert np.array_equal(got[name], value), (d, e, feature)


def documents(batch):
    """Each document of a packed batch as ``{key: tensor}`` (payloads, ``_is_pad`` and ``_dim_mask`` rows)."""
    n = len(batch.metadata["sample"])
    at = dict.fromkeys(DELTAS, 0)
    for k in range(n):
        doc = {}
        for f, deltas in DELTAS.items():
            rows = slice(at[f], at[f] + len(deltas))
            doc[f], doc[f"{f}_is_pad"] = batch.data[f][rows], batch.data[f"{f}_is_pad"][rows]
            if f in PAD:
                doc[f"{f}_dim_mask"] = batch.data[f"{f}_dim_mask"][rows]
            at[f] += len(deltas)
        yield k, doc
    assert all(at[f] == len(batch.data[f]) for f in DELTAS), "every payload row belongs to one document"


def test_packed_batches_carry_flat_dim_masks_and_where_each_document_came_from(mix):
    view = mix.windows(SPEC)
    packing = Packing(layout=TokenLayout(tokens_per_frame={PRIMARY: 4, WRIST: 4}), window=SPEC,
                      plan=PlanConfig(capacity=96, rows_per_batch=2), seed=1)
    loader = DataLoader(mix, packing=packing, num_workers=2)
    seen, datasets = [], set()
    for batch in loader:
        for f in (STATE, ACTION):  # flat like the payload: one mask row per payload row
            assert batch.data[f"{f}_dim_mask"].shape == (len(batch.data[f]), PAD[f])
        for k, doc in documents(batch):
            sample = int(batch.metadata["sample"][k])
            want = view[sample]
            assert int(batch.metadata["dataset"][k]) == want["dataset"]
            assert int(batch.metadata["embodiment"][k]) == want["embodiment"]
            for key, value in doc.items():
                expected = want[key] if not key.endswith("_dim_mask") else want[key].expand(len(value), -1)
                assert torch.equal(value, expected), (sample, key)
            datasets.add(want["dataset"])
            seen.append(sample)
    dropped = loader.dataset.plan(0).dropped.tolist()  # what balancing the rows left out, listed
    assert sorted(seen + dropped) == list(range(len(view))) and datasets == {0, 1, 2}


def test_a_mismatch_without_pad_to_is_an_error_that_names_pad_to(paths):
    with pytest.raises(ValueError, match=r"feature 'action' is array float32 \[7\] in .*franka.*\[14\].*pad_to="
                                         r"\{'action': 14\}"):
        open_dataset([paths["franka"], paths["aloha"]])
    with pytest.raises(ValueError, match=r"'action' is 14 wide in .*aloha.*pad_to\['action'\] = 8"):
        open_dataset(paths, pad_to={**PAD, ACTION: 8})
    with pytest.raises(ValueError, match="rename names datasets"):
        open_dataset(paths, pad_to=PAD, rename={"ur5": {"observation.images.front": PRIMARY}})


def test_cameras_of_other_sizes_in_one_slot_name_frame_size_and_then_share_it(paths, tmp_path):
    big = write_lerobot(tmp_path / "big", make_episodes(2, seed=4, cameras=("front",), height=64, width=64,
                                                        state_dim=7, action_dim=7, min_length=8, max_length=10))
    with pytest.raises(ValueError, match=r"video uint8 \[32, 48, 3\] in .*franka but video uint8 \[64, 64, 3\] in "
                                         r".*big; .*frame_size=\(H, W\)"):
        open_dataset([paths["franka"], big])
    mix = open_dataset([paths["franka"], big], frame_size=(32, 32))
    view = mix.windows(WindowSpec.from_delta_timestamps({"observation.images.front": [0.0]}))
    assert {tuple(view[i]["observation.images.front"].shape) for i in (0, len(view) - 1)} == {(1, 32, 32, 3)}


def test_normalize_of_the_mixture_is_each_datasets_own_and_leaves_the_padding_zero(mix, alone):
    views = [s.windows(own_spec(s, d)) for d, s in enumerate(alone)]
    view = mix.windows(SPEC)
    for mode in ("mean_std", "min_max"):
        mixed = Normalize(mix, mode=mode, features=[STATE, ACTION])
        own = [Normalize(s, mode=mode, features=[STATE, ACTION]) for s in alone]
        for i in range(0, len(view), 7):
            sample = view[i]
            d, want = alone_sample(alone, views, sample)
            got, expected = mixed(sample), own[d](want)
            for f in (STATE, ACTION):
                assert torch.equal(got[f][..., : DIMS[d]], expected[f]), (mode, i, f)
                assert not got[f][..., DIMS[d]:].any(), "padding stays zero"


# ------------------------------------------------------------------------ per-dataset options that do not fit


GRIPPERS = {"arm": {ACTION: [6]}, "bimanual": {ACTION: [6, 13]}}  # per embodiment: the base has no gripper


def test_leave_that_a_dataset_lacks_is_refused_when_normalize_is_built_naming_it(mix):
    """leave={"action": [6]} over robots of 7, 14 and 2 dims was an IndexError in a worker mid-epoch; Normalize
    refuses it when it is built, naming the 2-dim base and the per-name form that fits."""
    with pytest.raises(ValueError, match=r"leave keeps element\(s\) \[6\] of 'action', which has 2 element\(s\) of "
                                         r"dataset 'base' \(embodiment 'base'\); give leave per dataset or "
                                         r"embodiment name.*leave=\{name: \{'action': \[indices\]\}\}"):
        Normalize(mix, features=[STATE, ACTION], leave={ACTION: [6]})
    with pytest.raises(ValueError, match=r"leave names \['ur5'\], which are neither datasets nor embodiments"):
        Normalize(mix, features=[STATE, ACTION], leave={"ur5": {ACTION: [6]}})
    with pytest.raises(ValueError, match=r"leave keeps element\(s\) \[7\] of 'action', which has 7 element\(s\) of "
                                         r"dataset 'franka' \(embodiment 'arm'\)"):
        Normalize(mix, features=[STATE, ACTION], leave={"arm": {ACTION: [7]}})
    with pytest.raises(ValueError, match=r"leave names feature\(s\) \['gripper'\], which it does not normalize"):
        Normalize(mix, features=[STATE, ACTION], leave={"gripper": [0]})
    with pytest.raises(TypeError, match="mixes"):
        Normalize(mix, features=[STATE, ACTION], leave={"arm": {ACTION: [6]}, STATE: [0]})
    one = mix.sources[2]  # the base alone
    with pytest.raises(ValueError, match=r"leave keeps element\(s\) \[6\] of 'action', which has 2 element\(s\); "
                                         "give indices below it"):
        Normalize(one, features=[ACTION], leave={ACTION: [6]})
    with pytest.raises(ValueError, match="only a mixture's stats have"):
        Normalize(one, features=[ACTION], leave={"base": {ACTION: [0]}})


def test_leave_per_embodiment_keeps_the_grippers_through_an_epoch_in_workers(mix, alone):
    """Given per embodiment, leave keeps each robot's own gripper elements as they are (and normalizes the rest),
    through a whole epoch in worker processes."""
    normalize = Normalize(mix, features=[STATE, ACTION], leave=GRIPPERS)
    plain = Normalize(mix, features=[STATE, ACTION])
    view = mix.windows(SPEC)
    for i in range(0, len(view), 5):
        sample = view[i]
        kept = GRIPPERS.get(["arm", "bimanual", "base"][int(sample["dataset"])], {}).get(ACTION, [])
        got, other = normalize(sample)[ACTION], plain(sample)[ACTION]
        assert torch.equal(got[..., kept], sample[ACTION][..., kept])
        rest = [j for j in range(DIMS[int(sample["dataset"])]) if j not in kept]
        assert torch.equal(got[..., rest], other[..., rest]) and not got[..., DIMS[int(sample["dataset"])]:].any()
    packing = Packing(layout=TokenLayout(tokens_per_frame={PRIMARY: 4, WRIST: 4}), window=SPEC,
                      plan=PlanConfig(capacity=96, rows_per_batch=2), seed=1, transform=normalize)
    robots = set()
    for batch in DataLoader(mix, packing=packing, num_workers=2):
        robots.update(batch.metadata["embodiment"].tolist())
    assert robots == {0, 1, 2}


def test_pad_to_that_a_dataset_does_not_fit_is_refused_naming_the_dataset(paths):
    named = {"franka": paths["franka"], "aloha": paths["aloha"], "base": paths["base"]}
    with pytest.raises(ValueError, match=r"feature 'action' is 14 wide in dataset 'aloha' \(.*\), more than "
                                         r"pad_to\['action'\] = 8; raise the width"):
        open_dataset(named, pad_to={**PAD, ACTION: 8})
    with pytest.raises(ValueError, match=r"pad_to pads the last dimension of array features; "
                                         r"'observation.images.front' in dataset 'franka' \(.*franka\) is video"):
        open_dataset(named, pad_to={**PAD, "observation.images.front": 32})


def test_rename_that_a_dataset_does_not_fit_is_refused_naming_the_dataset(paths):
    named = {"franka": paths["franka"], "aloha": paths["aloha"], "base": paths["base"]}
    front = "observation.images.front"
    with pytest.raises(ValueError, match=r"rename\['aloha'\] renames \['observation.images.front'\], which dataset "
                                         r"'aloha' does not have; its features are \[.*'observation.images.top'"):
        open_dataset(named, pad_to=PAD, rename={"aloha": {front: PRIMARY}})
    with pytest.raises(ValueError, match=r"rename\[1\] renames \['observation.images.front'\], which dataset "
                                         r"'aloha' does not have"):
        open_dataset(named, pad_to=PAD, rename=[{front: PRIMARY}, {front: PRIMARY}, {}])
    with pytest.raises(ValueError, match=r"rename names features \['observation.images.side'\], which no dataset "
                                         r"of \['franka', 'aloha', 'base'\] has"):
        open_dataset(named, pad_to=PAD, rename={"observation.images.side": PRIMARY})
    with pytest.raises(ValueError, match=r"rename\['franka'\] = .* gives two features of dataset 'franka' the "
                                         r"name\(s\) \['observation.state'\]"):
        open_dataset(named, pad_to=PAD, rename={"franka": {front: STATE}})
    # the {name: new name} form renames in every dataset that has the feature, and only there
    mix = open_dataset(named, pad_to=PAD, rename={front: PRIMARY, "observation.images.top": PRIMARY})
    assert PRIMARY in mix.features and front not in mix.features


# ------------------------------------------------------------------------------- openpi's idle filter form


def test_openpi_keep_ranges_file_keeps_exactly_those_steps(mix, tmp_path):
    """A frame-filter file in openpi's form, {dataset: {episode: [[start, end], ...]}} (and {episode: ...} for
    one dataset), keeps the steps start <= step < end of the episodes it names and every step of the others."""
    from mmfeed.loaders.planned.filters import FrameFilter

    spec = WindowSpec.from_delta_timestamps({STATE: [0.0], ACTION: [0.0, 1 / 30]})  # anchored at its first frame
    path = tmp_path / "idle.json"
    path.write_text('{"franka": {"0": [[2, 5]], "2": [[0, 2], [6, 8]]}, "base": {"1": [[1, 3]]}}')
    packing = Packing(window=spec, plan=PlanConfig(capacity=64, rows_per_batch=1), frame_filter=str(path))
    table = packing.dataset(mix).items.table
    episode, start = table.locate(np.arange(len(table)))
    kept = {(int(e), int(s)) for e, s in zip(episode, start)}
    lengths = mix.lengths.tolist()
    franka, base = 0, 6  # first episodes of the datasets in the mixture (three each)
    want = {(e, s) for e in range(len(lengths)) for s in range(lengths[e])
            if e not in (franka, franka + 2, base + 1)}
    want |= {(franka, 2), (franka, 3), (franka, 4), (franka + 2, 0), (franka + 2, 1), (franka + 2, 6),
             (franka + 2, 7), (base + 1, 1), (base + 1, 2)}
    assert kept == want
    for batch in DataLoader(mix, packing=packing):
        assert set(zip(batch.metadata["episode"].tolist(), batch.metadata["start_step"].tolist())) <= want

    one = tmp_path / "one.json"
    one.write_text('{"1": [[0, 3]]}')
    assert FrameFilter.load(one).keep == [(None, 1, 0, 3)] and FrameFilter.load(one).drop == []
    both = tmp_path / "both.json"
    both.write_text('{"keep": [[0, 0, 2]], "1": [[0, 3]]}')
    with pytest.raises(ValueError, match=r"both.json: a frame filter is .* or \{episode: \[\[start, end\], \.\.\.\]\} "
                                         r"\(openpi's keep ranges\), not both; got keys \['1', 'keep'\]"):
        FrameFilter.load(both)
