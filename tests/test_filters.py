"""Frame filters and tempered mixture weights, from plain index arrays (no source, no torch), against step-by-step
twins in tests/naive.py: the kept segments, the windows and chunks cut from them, and a weighted draw by size^alpha."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed.packing.filters import kept_segments
from mmfeed.packing.layout import TokenLayout
from mmfeed.packing.mixture import SizeWeights, mixture_weights
from mmfeed.packing.plan import PlanConfig
from mmfeed.packing.epoch import plan_for
from mmfeed.packing.samples import EpisodeIndex, SampleTable
from mmfeed.packing.windows import WindowSpec
from naive import naive_kept_steps, naive_segment_windows, naive_segments

LAYOUT = TokenLayout(tokens_per_frame={"state": 1, "action": 2})
SPEC = WindowSpec.from_delta_timestamps({"state": [0.0], "action": [0.0, 0.1]})


@st.composite
def filtered(draw):
    """Episodes of 0-15 steps and ranges to keep and drop in some of them (some past the end, some empty)."""
    lengths = draw(st.lists(st.integers(0, 15), min_size=1, max_size=8))
    n = len(lengths)

    def ranges():
        out = []
        for _ in range(draw(st.integers(0, 6))):
            e = draw(st.integers(0, n - 1))
            a = draw(st.integers(0, 18))
            out.append((e, a, a + draw(st.integers(0, 8))))
        return out

    return lengths, ranges(), ranges()


def as_arrays(ranges):
    return tuple(np.array([r[k] for r in ranges], dtype=np.int64) for k in range(3))


@settings(max_examples=150, deadline=None)
@given(data=filtered())
def test_kept_segments_are_the_maximal_runs_of_kept_steps(data):
    lengths, keep, drop = data
    episode, start, end = kept_segments(np.array(lengths), keep=as_arrays(keep) if keep else None,
                                        drop=as_arrays(drop) if drop else None)
    want = naive_segments(naive_kept_steps(lengths, keep, drop))
    assert list(zip(episode.tolist(), start.tolist(), end.tolist())) == want


def test_a_bad_range_is_refused_naming_it():
    with pytest.raises(ValueError, match="names episode 5; there are 2 episodes"):
        kept_segments(np.array([4, 4]), keep=as_arrays([(5, 0, 2)]))
    with pytest.raises(ValueError, match="ends at step 1, before its start 3"):
        kept_segments(np.array([4, 4]), drop=as_arrays([(1, 3, 1)]))


@settings(max_examples=80, deadline=None)
@given(data=filtered(), stride=st.integers(1, 3))
def test_windows_of_kept_segments_are_anchored_only_at_kept_steps(data, stride):
    """Every window of a filtered table is anchored at a kept step, one every ``stride`` steps of each kept run;
    its episode, price and group are those of the unfiltered window at that anchor."""
    lengths, keep, drop = data
    index = EpisodeIndex.of(lengths=lengths, fps=[10.0] * len(lengths), tasks=[0] * len(lengths), text_lengths=[3])
    segments = kept_segments(index.lengths, keep=as_arrays(keep) if keep else None,
                             drop=as_arrays(drop) if drop else None)
    table = SampleTable.windows(index, LAYOUT, SPEC, stride=stride, segments=segments)
    want = naive_segment_windows(naive_segments(naive_kept_steps(lengths, keep, drop)), stride)
    ids = np.arange(len(table))
    episode, anchor = table.locate(ids)
    assert list(zip(episode.tolist(), anchor.tolist())) == want
    assert table.groups.tolist() == [e for e, _ in want]
    assert table.tokens.tolist() == [3 + 1 + 2 * 2] * len(want)
    for e in range(len(lengths)):  # an episode's windows are consecutive ids, in order of anchor
        assert table._windows.of_episode(e).tolist() == [i for i, (f, _) in enumerate(want) if f == e]
    lengths_run, prices_run = table.price_runs
    assert int(lengths_run.sum()) == len(want)


@settings(max_examples=60, deadline=None)
@given(data=filtered(), max_length=st.one_of(st.none(), st.integers(1, 5)))
def test_chunks_of_kept_segments_cover_every_kept_step_once(data, max_length):
    lengths, keep, drop = data
    index = EpisodeIndex.of(lengths=lengths, fps=[10.0] * len(lengths), tasks=[0] * len(lengths), text_lengths=[3])
    segments = kept_segments(index.lengths, keep=as_arrays(keep) if keep else None,
                             drop=as_arrays(drop) if drop else None)
    table = SampleTable.chunks(index, LAYOUT, ["state"], max_length=max_length, segments=segments)
    ids = np.arange(len(table))
    episode, start = table.locate(ids)
    covered = [[False] * n for n in lengths]
    for e, s, n in zip(episode.tolist(), start.tolist(), table.lengths(ids).tolist()):
        assert max_length is None or n <= max_length
        for t in range(s, s + n):
            assert not covered[e][t], "a step in two chunks"
            covered[e][t] = True
    assert covered == naive_kept_steps(lengths, keep, drop)


def test_no_filter_is_the_table_without_segments():
    index = EpisodeIndex.of(lengths=[5, 0, 7], fps=[10.0] * 3, tasks=[0, 0, 0], text_lengths=[3])
    plain = SampleTable.windows(index, LAYOUT, SPEC, stride=2)
    whole = SampleTable.windows(index, LAYOUT, SPEC, stride=2, segments=kept_segments(index.lengths))
    ids = np.arange(len(plain))
    assert len(plain) == len(whole) and all(np.array_equal(a, b) for a, b in zip(plain.locate(ids), whole.locate(ids)))
    config = PlanConfig(capacity=24, rows_per_batch=1)
    a, b = plan_for(plain, config, seed=3, epoch=1), plan_for(whole, config, seed=3, epoch=1)
    assert a.planner == b.planner and [r.tolist() for r in a.plan.batch_rows(0, 0)] == \
        [r.tolist() for r in b.plan.batch_rows(0, 0)]


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), min_size=2, max_size=4), alpha=st.floats(0.0, 2.0))
def test_size_weights_are_size_to_the_alpha(sizes, alpha):
    sizes = np.array(sizes)
    got = mixture_weights(SizeWeights(alpha), sizes)
    if alpha == 1.0:
        assert got is None  # in proportion to size: every sample once
    else:
        assert np.allclose(got, np.where(sizes > 0, sizes.astype(float) ** alpha, 0.0))
    assert mixture_weights("size", sizes) is None and mixture_weights(None, sizes) is None
    assert mixture_weights([1, 2], sizes[:2]).tolist() == [1.0, 2.0]


def test_a_tempered_draw_shares_the_epoch_by_size_to_the_alpha():
    """Two datasets of 40 and 10 windows, alpha 0.5: shares 2:1 (sqrt 40 : sqrt 10) of an epoch of 50."""
    index = EpisodeIndex.of(lengths=[20, 20, 10], fps=[10.0] * 3, tasks=[0] * 3, text_lengths=[3],
                            dataset=np.array([0, 0, 1]))
    table = SampleTable.windows(index, LAYOUT, SPEC, weights=SizeWeights(0.5))
    drawn = table.draw(seed=0, epoch=0)
    counts = np.bincount(index.dataset[table.groups[drawn]], minlength=2)
    assert len(drawn) == 50 and counts.tolist() == [33, 17]
    assert SampleTable.windows(index, LAYOUT, SPEC, weights="size").draw(0, 0) is None
    with pytest.raises(ValueError, match="alpha"):
        SizeWeights(-1.0)
    with pytest.raises(ValueError, match="'size' or SizeWeights"):
        SampleTable.windows(index, LAYOUT, SPEC, weights="sizes")
