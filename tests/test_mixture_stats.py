"""Statistics of a mixture of robots: each dataset's own, each embodiment's merged by the rule, `mmfeed stats` from
the arrays alone, and normalization (quantile, clip, dims left alone, delta actions) checked against numpy.

numpy on the episodes' own arrays is the oracle: a merged mean and variance are exact, min and max too, and the
quantiles of the sketch are within its stated error (:data:`mmfeed.loaders.stores.quantiles.ALPHA`, relative).
"""

import os
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import procs
from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec, open_dataset
from mmfeed.loaders.conversion.statistics import compute_stats
from mmfeed.loaders.planned.transforms import CameraDropout, DeltaActions, Normalize, delta_key
from mmfeed.loaders.stores.quantiles import ALPHA, QUANTILES
from mmfeed.loaders.stores.stats import MixtureStats
from mmfeed.testing import make_episodes, write_lerobot
from mmfeed.testing.synth_embodiments import EMBODIMENTS, write_embodiments

STATE, ACTION = "observation.state", "action"
PAD = {ACTION: 32, STATE: 32, "observation.velocity": 32}
NAMES = list(EMBODIMENTS)
DIMS = [EMBODIMENTS[n][0] for n in NAMES]
ARRAYS = (STATE, ACTION, "observation.velocity")


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """The three robots, and a second arm dataset of the franka's embodiment ("franka2")."""
    root = tmp_path_factory.mktemp("robots")
    out = write_embodiments(root, episodes=3, min_length=8, max_length=14)
    eps = make_episodes(4, seed=11, cameras=("front",), state_dim=7, action_dim=7, min_length=10, max_length=20,
                        height=32, width=48)
    out["franka2"] = str(write_lerobot(root / "franka2", eps, codec="h264", gop=10))
    return out


def arrays(path, feature):
    """Every step of ``feature`` in the dataset at ``path``, from its episodes read whole."""
    ds = open_dataset(path)
    return np.concatenate([np.asarray(ds.episode(e)[feature], np.float64) for e in range(len(ds))])


def assert_quantiles_near(got, values, where):
    """Each quantile within the sketch's error of ``np.quantile``: ALPHA relative to the larger of the two order
    statistics it interpolates between."""
    ordered = np.sort(values, axis=0)
    for name, q in QUANTILES.items():
        rank = q * (len(values) - 1)
        lo, hi = ordered[int(np.floor(rank))], ordered[int(np.ceil(rank))]
        bound = ALPHA * np.maximum(np.abs(lo), np.abs(hi)) + 1e-9
        assert np.all(np.abs(got[name] - np.quantile(values, q, axis=0)) <= bound), (where, name)


def test_an_embodiments_datasets_merge_by_the_rule_checked_against_numpy(paths):
    mix = open_dataset({n: paths[n] for n in ("franka", "franka2", "aloha")}, pad_to=PAD,
                       embodiments=["arm", "arm", "bimanual"])
    assert mix.embodiment_names == ["arm", "bimanual"] and mix.embodiment_of_dataset.tolist() == [0, 0, 1]
    for feature in ARRAYS:
        a, b = arrays(paths["franka"], feature), arrays(paths["franka2"], feature)
        both = np.concatenate([a, b])
        got = mix.embodiment_stats["arm"][feature]
        assert int(got["count"][0]) == len(both) and got["mean"].shape == (7,)  # the robot's own width
        np.testing.assert_allclose(got["mean"], both.mean(0), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(got["std"], both.std(0), rtol=1e-5, atol=1e-9)
        assert np.array_equal(got["min"], both.min(0)) and np.array_equal(got["max"], both.max(0))
        # the range covers every dataset's: min of the q01s, max of the q99s (LeRobot wrote np.quantile's)
        for name, pick in (("q01", np.minimum), ("q99", np.maximum)):
            q = QUANTILES[name]
            np.testing.assert_allclose(got[name], pick(np.quantile(a, q, 0), np.quantile(b, q, 0)), rtol=1e-6)
        # a sample of franka2 normalized by embodiment uses the merged stats, by dataset its own
        assert mix.stats_of(1, "embodiment")[feature] is got
        np.testing.assert_allclose(mix.stats_of(1, "dataset")[feature]["mean"], b.mean(0), rtol=1e-6)
    # the bimanual robot alone in its embodiment keeps its own stats
    assert mix.embodiment_stats["bimanual"][ACTION]["mean"].shape == (14,)
    with pytest.raises(ValueError, match="datasets of embodiment 'arm' share their statistics$"):
        open_dataset(paths, pad_to=PAD, embodiments=["arm", "bimanual", "arm", "arm"])


def without_videos(src: Path, dst: Path) -> Path:
    """A copy of the dataset at ``src`` whose video bytes are garbage (a LeRobot directory without ``videos/``;
    shards whose mp4 members are overwritten in place, the index still valid): anything that decodes fails."""
    import shutil

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("videos"))
    for tar in dst.glob("*.tar"):
        with tarfile.open(tar) as t:
            spans = [(m.offset_data, m.size) for m in t.getmembers() if m.name.endswith(".mp4")]
        stat = tar.stat()
        with open(tar, "r+b") as f:
            for offset, size in spans:
                f.seek(offset)
                f.write(b"\0" * size)
        os.utime(tar, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the index still describes these shards
    return dst


@pytest.mark.slow  # stats of three datasets through the CLI
def test_mmfeed_stats_gives_ds_stats_from_the_arrays_alone_never_decoding(paths, tmp_path):
    names = ("franka", "aloha", "base")
    blind = {n: without_videos(Path(paths[n]), tmp_path / n) for n in names}
    with pytest.raises(Exception):  # the copies really cannot be decoded
        open_dataset(blind["aloha"]).episode(0)
    out = tmp_path / "stats.json"
    run = procs.run([sys.executable, "-m", "mmfeed", "stats", *map(str, blind.values()), "--names", ",".join(names),
                     "--embodiments", "arm,bimanual,base", "--workers", "2", "--json", str(out)], timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "franka:" in run.stdout and "embodiment bimanual:" in run.stdout
    got = MixtureStats.load(out)
    assert got.dataset_names == list(names) and got.embodiment_of_dataset.tolist() == [0, 1, 2]
    for d, name in enumerate(names):
        ds = open_dataset(paths[name])
        for feature in ARRAYS:
            mine, theirs = got.datasets[d][feature], ds.stats[feature]
            assert int(mine["count"][0]) == int(np.asarray(theirs["count"]).reshape(-1)[0])
            for key in ("mean", "std", "min", "max"):
                np.testing.assert_allclose(mine[key], np.asarray(theirs[key]).reshape(mine[key].shape), rtol=1e-5,
                                           atol=1e-7, err_msg=f"{name} {feature} {key}")
            assert_quantiles_near(mine, arrays(paths[name], feature), (name, feature))
    # the same call in the library, and the mixture's own stats agree with what the command wrote
    lib = compute_stats({n: paths[n] for n in names}, embodiments=["arm", "bimanual", "base"])
    mix = open_dataset({n: paths[n] for n in names}, pad_to=PAD, embodiments=["arm", "bimanual", "base"])
    for d in range(3):
        for feature in ARRAYS:
            for key in ("mean", "std", "min", "max", "q01", "q99"):
                np.testing.assert_allclose(lib.datasets[d][feature][key], got.datasets[d][feature][key], rtol=1e-12)
            np.testing.assert_allclose(mix.stats_of(d)[feature]["mean"], got.datasets[d][feature]["mean"], rtol=1e-5)


def test_mmfeed_stats_refuses_a_missing_path_in_one_line(tmp_path):
    run = procs.run([sys.executable, "-m", "mmfeed", "stats", str(tmp_path / "nowhere")], timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "nowhere: no such file or directory" in run.stderr.strip().splitlines()[-1]


WINDOW = {STATE: [-1 / 30, 0.0], ACTION: [i / 30 for i in range(4)]}
GRIPPERS = {"franka": [6], "aloha": [6, 13]}


def test_quantile_normalization_with_clip_kept_grippers_and_delta_actions_matches_numpy(paths):
    names = ("franka", "aloha", "base")
    delta = DeltaActions({"franka": range(6), "aloha": [*range(6), *range(7, 13)]})
    stats = compute_stats({n: paths[n] for n in names}, delta=delta, horizon=4)
    # the delta stats: action[t + k] - state[t] on the chosen elements, every anchor t and k < 4, by numpy
    for d, name in enumerate(names[:2]):
        ds, dims = open_dataset(paths[name]), delta.dims_of([name])
        pairs = []
        for e in range(len(ds)):
            ep = ds.episode(e)
            a, s = np.asarray(ep[ACTION], np.float64), np.asarray(ep[STATE], np.float64)
            for k in range(4):
                p = a[k:].copy()
                p[:, dims] -= s[: len(a) - k][:, dims]
                pairs.append(p)
        pairs = np.concatenate(pairs)
        got = stats.datasets[d][delta_key(ACTION)]
        np.testing.assert_allclose(got["mean"], pairs.mean(0), rtol=1e-9, atol=1e-12)
        assert np.array_equal(got["min"], pairs.min(0)) and np.array_equal(got["max"], pairs.max(0))
        assert_quantiles_near(got, pairs, name)
    assert delta_key(ACTION) not in stats.datasets[2], "the base has no delta elements"

    mix = open_dataset({n: paths[n] for n in names}, pad_to=PAD)
    norm = Normalize(stats, mode="quantile", clip=True, leave={n: {ACTION: g} for n, g in GRIPPERS.items()},
                     delta=delta, features=[STATE, ACTION])
    view = mix.windows(WindowSpec.from_delta_timestamps(WINDOW))
    clipped = 0
    for i in range(0, len(view), 5):
        sample = view[i]
        d, name = int(sample["dataset"]), names[int(sample["dataset"])]
        dim, own = DIMS[d], stats.datasets[int(sample["dataset"])]
        out = norm(sample)
        state, action = sample[STATE][:, :dim].double().numpy(), sample[ACTION][:, :dim].double().numpy()
        dims = delta.dims_of([name])
        want_action = action.copy()
        want_action[:, dims] -= state[-1, dims]
        for feature, x, key in ((STATE, state, STATE), (ACTION, want_action, delta_key(ACTION) if dims else ACTION)):
            lo, hi = own[key]["q01"], own[key]["q99"]
            y = np.clip(2 * (x - lo) / (hi - lo + 1e-8) - 1, -1, 1)
            if feature == ACTION:
                y[:, GRIPPERS.get(name, [])] = action[:, GRIPPERS.get(name, [])]
            clipped += int((np.abs(2 * (x - lo) / (hi - lo + 1e-8) - 1) > 1).sum())
            np.testing.assert_allclose(out[feature][:, :dim].numpy(), y, rtol=1e-5, atol=1e-6, err_msg=f"{i} {feature}")
            assert not out[feature][:, dim:].any(), "padding stays zero"
    assert clipped, "some values fell outside q01..q99 and were clipped"


def test_camera_dropout_is_seeded_and_the_same_with_workers(paths):
    mix = open_dataset({n: paths[n] for n in ("franka", "aloha")}, pad_to=PAD)
    cams = ("observation.images.front", "observation.images.top", "observation.images.wrist")
    window = WindowSpec.from_delta_timestamps({**{c: [0.0] for c in cams}, STATE: [0.0]})
    packing = Packing(layout=TokenLayout(tokens_per_frame={c: 2 for c in cams}), window=window,
                      plan=PlanConfig(capacity=64, rows_per_batch=2), seed=3, transform=CameraDropout(0.5))
    def flags(packing, workers):
        out = []
        for batch in DataLoader(mix, packing=packing, num_workers=workers):
            for c in cams:
                pad = batch.data[f"{c}_is_pad"]
                assert not batch.data[c][pad].any(), "a dropped (or absent) camera is zeros"
            out.append(torch.stack([batch.data[f"{c}_is_pad"] for c in cams], 1))
        return torch.cat(out)

    plain = flags(replace(packing, transform=None), 0)
    dropped = [flags(packing, w) for w in (0, 2)]
    assert torch.equal(dropped[0], dropped[1]), "the same cameras dropped with and without workers"
    assert torch.equal(dropped[0] | plain, dropped[0]) and dropped[0].sum() > plain.sum(), "some cameras dropped"
    assert not dropped[0].all(1).any(), "every window keeps one camera it has"
