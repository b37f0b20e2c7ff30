"""The sample table and the planner rule, from plain index arrays (no source, no torch), against sample-by-sample
twins in tests/naive.py: every window and chunk, its episode, start, task and price; the one price, the runs of one
price and the cheapest; the weighted draw; which planner runs and why."""

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed.packing.bins import _DECREASING
from mmfeed.packing.epoch import choose_planner, plan_for
from mmfeed.packing.layout import TokenLayout
from mmfeed.packing.plan import PlanConfig
from mmfeed.packing.samples import EpisodeIndex, SampleTable
from mmfeed.packing.windows import WindowSpec
from naive import naive_chunk_price, naive_planner, naive_runs, naive_task, naive_window_price, naive_windows

FEATURES = ("cam", "state", "action")


@st.composite
def indexes(draw):
    """Episodes of 0-12 steps at 10 or 30 Hz, a camera at its own rate in some, tasks that may change midway."""
    n = draw(st.integers(1, 8))
    lengths = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
    fps = draw(st.lists(st.sampled_from([10.0, 30.0]), min_size=n, max_size=n))
    num_tasks = draw(st.integers(1, 3))
    text = draw(st.lists(st.integers(0, 6), min_size=num_tasks, max_size=num_tasks))
    tasks = draw(st.lists(st.integers(-1, num_tasks - 1), min_size=n, max_size=n))
    step_tasks = {e: draw(st.lists(st.integers(0, num_tasks - 1), min_size=lengths[e], max_size=lengths[e]))
                  for e in range(n) if tasks[e] < 0}
    cam_rate = [f / draw(st.sampled_from([1, 2])) for f in fps]
    present = {f: draw(st.lists(st.booleans(), min_size=n, max_size=n)) if f == "cam" else [True] * n
               for f in FEATURES}
    dataset = draw(st.lists(st.integers(0, 1), min_size=n, max_size=n))
    index = EpisodeIndex.of(lengths=lengths, fps=fps, tasks=tasks, text_lengths=text,
                            rates={"cam": np.array(cam_rate)}, present={f: np.array(v) for f, v in present.items()},
                            step_tasks=lambda e: np.array(step_tasks[e], dtype=np.int64),
                            dataset=np.array(sorted(dataset), dtype=np.int64))
    plain = dict(lengths=lengths, fps=fps, tasks=tasks, text=text, step_tasks=step_tasks, present=present,
                 rates={"cam": cam_rate, "state": fps, "action": fps})
    return index, plain


LAYOUT = TokenLayout(tokens_per_frame={"cam": 5, "state": 1, "action": 2})
SPEC = WindowSpec.from_delta_timestamps({"cam": [-0.1, 0.0], "state": [0.0], "action": [0.0, 0.1, 0.2]})


@settings(max_examples=60, deadline=None)
@given(data=indexes(), stride=st.integers(1, 3))
def test_windows_columns_prices_runs_and_the_one_price_equal_the_naive_table(data, stride):
    index, plain = data
    table = SampleTable.windows(index, LAYOUT, SPEC, stride=stride)
    naive = naive_windows(plain["lengths"], stride)
    assert len(table) == len(naive)
    ids = np.arange(len(naive))
    episode, start = table.locate(ids)
    assert list(zip(episode.tolist(), start.tolist())) == naive
    tasks = [naive_task(plain["tasks"], plain["step_tasks"], e, t) for e, t in naive]
    assert table.tasks(ids).tolist() == tasks
    counts = {f: len(d) for f, d in SPEC.deltas.items()}
    prices = [naive_window_price(counts, plain["present"], e, LAYOUT.tokens_per_frame, plain["text"][k])
              for (e, _), k in zip(naive, tasks)]
    assert table.prices(ids).tolist() == prices == table.tokens.tolist()
    assert table.groups.tolist() == [e for e, _ in naive] and (table.lengths(ids) == 1).all()
    lengths, values = table.price_runs  # every episode's windows as runs of one price, in order
    flat = [p for n, p in zip(lengths.tolist(), values.tolist()) for _ in range(n)]
    assert flat == prices
    runs_naive = naive_runs(prices, [e for e, _ in naive])
    kept = [(n, p) for n, p in zip(lengths.tolist(), values.tolist()) if n]
    assert kept == list(zip(*runs_naive)) if prices else kept == []
    assert table.min_price == (min(prices) if prices else 1)
    changing = any(t < 0 and plain["lengths"][e] for e, t in enumerate(plain["tasks"]))
    if len(set(prices)) == 1 and not (changing and len(set(plain["text"])) > 1):
        assert table.uniform_price == prices[0]
    elif len(set(prices)) > 1 or not prices:
        assert table.uniform_price is None


@settings(max_examples=60, deadline=None)
@given(data=indexes(), max_length=st.one_of(st.none(), st.integers(1, 6)), capacity=st.integers(20, 80),
       truncate=st.booleans())
def test_chunks_cover_every_step_once_and_are_priced_as_the_naive_table(data, max_length, capacity, truncate):
    index, plain = data
    try:
        table = SampleTable.chunks(index, LAYOUT, list(FEATURES), max_length=max_length, capacity=capacity,
                                   long_episodes="truncate" if truncate else "split")
    except ValueError as err:  # one step of an episode does not fit: said so, with the capacity
        assert "cannot hold one step" in str(err)
        return
    ids = np.arange(len(table))
    episode, start = table.locate(ids)
    length = table.lengths(ids)
    steps = {e: [] for e in range(len(plain["lengths"]))}
    for e, s, n in zip(episode.tolist(), start.tolist(), length.tolist()):
        steps[e].extend(range(s, s + n))
    for e, n in enumerate(plain["lengths"]):
        if truncate:
            assert steps[e] == list(range(len(steps[e]))) and len(steps[e]) <= n
        else:
            assert steps[e] == list(range(n))  # every step in exactly one chunk, in order
    tasks = table.tasks(ids).tolist()
    assert tasks == [naive_task(plain["tasks"], plain["step_tasks"], e, s) for e, s in zip(episode, start)]
    prices = [naive_chunk_price(s, n, e, lengths=plain["lengths"], fps=plain["fps"], rates=plain["rates"],
                                present=plain["present"], tokens_per_frame=LAYOUT.tokens_per_frame,
                                text=plain["text"][k] if k >= 0 else 0)
              for e, s, n, k in zip(episode.tolist(), start.tolist(), length.tolist(), tasks)]
    assert table.tokens.tolist() == prices and max(prices, default=0) <= capacity
    assert table.price_runs is None and table.classes is None
    assert table.uniform_price == (prices[0] if len(set(prices)) == 1 else None)


@settings(max_examples=40, deadline=None)
@given(data=indexes(), weights=st.lists(st.floats(0.1, 3.0), min_size=2, max_size=2), seed=st.integers(0, 99))
def test_a_weighted_draw_takes_each_datasets_share_from_its_own_samples(data, weights, seed):
    index, plain = data
    table = SampleTable.windows(index, LAYOUT, SPEC)
    sizes = np.bincount(table.groups, minlength=len(plain["lengths"]))
    per_dataset = np.bincount(index.dataset, weights=sizes, minlength=2).astype(int)
    if not per_dataset.sum():  # nothing to draw from: an empty epoch
        assert len(SampleTable.windows(index, LAYOUT, SPEC, weights=weights).draw(seed, 0)) == 0
        return
    try:
        weighted = SampleTable.windows(index, LAYOUT, SPEC, weights=weights)
    except ValueError as err:  # a dataset with a share but no samples: said so
        assert "no samples" in str(err) and (per_dataset == 0).any()
        return
    drawn = weighted.draw(seed, 0)
    counts = np.bincount(index.dataset[weighted.groups[drawn]], minlength=2)
    share = np.array(weights) / sum(weights) * len(table)
    assert len(drawn) == len(table) and (np.abs(counts - share) < 1 + 1e-9).all()
    for d in range(2):  # each dataset's draws are its own samples, each once while the epoch lasts
        mine = drawn[index.dataset[weighted.groups[drawn]] == d]
        assert len(set(mine.tolist())) == min(len(mine), per_dataset[d])
    assert SampleTable.windows(index, LAYOUT, SPEC).draw(seed, 0) is None


@settings(max_examples=80, deadline=None)
@given(mode=st.sampled_from(["pack", "bucket", "fixed"]), block=st.sampled_from([0, 2]),
       algorithm=st.sampled_from(["bfd", "ffd", "nf"]), weighted=st.booleans(), kind=st.sampled_from(["windows",
       "uniform", "chunks", "prices"]), capacity=st.sampled_from([8, 64]))
def test_the_planner_rule(mode, block, algorithm, weighted, kind, capacity):
    index = EpisodeIndex.of(lengths=[4, 3, 5], fps=[10.0] * 3, tasks=[0, 1, 0], text_lengths=[3, 3 if kind == "uniform"
                                                                                                else 7],
                            dataset=np.array([0, 0, 1]))
    weights = [1.0, 1.0] if weighted and kind != "prices" else None
    if kind in ("windows", "uniform"):
        table = SampleTable.windows(index, LAYOUT, SPEC, weights=weights)
    elif kind == "chunks":
        table = SampleTable.chunks(index, LAYOUT, ["state"], weights=weights)
    else:
        table = SampleTable.of_prices([3, 5, 3, 8])
    config = PlanConfig(capacity=capacity, rows_per_batch=1, mode=mode, episode_block=block, algorithm=algorithm,
                        batch_size=2)
    drawn = table.draw(0, 0)
    planner, reason = choose_planner(table, config, drawn)
    assert planner == naive_planner(drawn=drawn is not None, mode=mode, episode_block=block,
                                    uniform=table.uniform_price, capacity=capacity,
                                    has_runs=table.price_runs is not None, decreasing=_DECREASING[algorithm])
    assert reason
    if block and table.groups is None:  # episode blocks of samples without episodes: refused, saying why
        with pytest.raises(ValueError, match="episode_block needs groups"):
            plan_for(table, config, seed=1, epoch=0)
        return
    planned = plan_for(table, config, seed=1, epoch=0)
    assert planned.planner == planner
    assert type(planned.plan).__name__ == {"uniform": "UniformPlan", "classes": "ClassPlan", "samples": "Plan"}[planner]


def test_the_table_and_the_planner_need_no_torch():
    assert "mmfeed.packing.samples" in sys.modules and "mmfeed.packing.epoch" in sys.modules
    import subprocess

    code = ("import sys; import mmfeed.packing.samples, mmfeed.packing.epoch; "
            "assert 'torch' not in sys.modules, 'torch imported'; "
            "assert not any(m.startswith(('mmfeed.loaders', 'mmfeed.codecs')) for m in sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)
