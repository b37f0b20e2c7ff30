"""LeRobot's per-frame language columns: ``language_persistent`` and ``language_events`` (declared in
meta/info.json with dtype ``language``: a list of message rows ``{role, content, style, timestamp, camera,
tool_calls}`` per frame) and text columns the data holds undeclared beside ``task`` are text features, delivered
(as JSON text for the message lists) by episodes, windows and the shards ``convert`` writes, and as LeRobot's lists
of message dicts by ``mmfeed.lerobot.LeRobotDataset``; they were refused or dropped."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mmfeed.lerobot import LeRobotDataset
from mmfeed.loaders import WindowSpec, open_dataset
from mmfeed.testing import make_episodes, write_lerobot

PERSISTENT = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("style", pa.string()),
                                 ("timestamp", pa.float32()), ("camera", pa.string()),
                                 ("tool_calls", pa.list_(pa.string()))]))
EVENTS = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string()), ("style", pa.string()),
                             ("camera", pa.string()), ("tool_calls", pa.list_(pa.string()))]))


def annotations(index: int, step: int) -> tuple[list[dict], list[dict] | None, str | None]:
    """The language rows of global frame ``index`` (step ``step`` of its episode): a plan and the current subtask
    (persistent), an interjection with a tool call every third frame (events; none on the others, and null every
    fifth), and a free-text note (null every fourth)."""
    persistent = [{"role": "assistant", "content": "plan: reach, grasp, lift", "style": "plan", "timestamp": 0.0,
                   "camera": None, "tool_calls": None},
                  {"role": "assistant", "content": f"subtask {step // 3}", "style": "subtask",
                   "timestamp": float(np.float32(step // 3 * 3 / 10)), "camera": None, "tool_calls": None}]
    events = [] if index % 3 else [{"role": "user", "content": f"stop at frame {index}", "style": "interjection",
                                    "camera": None, "tool_calls": [json.dumps({"name": "say", "text": "ok"})]}]
    return persistent, None if index % 5 == 4 else events, None if index % 4 == 3 else f"note {index}"


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    """A dataset of mmfeed.testing's LeRobot writer with LeRobot's two language columns added (declared as LeRobot
    declares them) and an undeclared string column ``note``."""
    root = write_lerobot(tmp_path_factory.mktemp("language") / "ds",
                         make_episodes(3, seed=2, min_length=4, max_length=7, height=32, width=32))
    data = f"{root}/data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    rows = [annotations(int(i), int(s)) for i, s in zip(table["index"].to_pylist(), table["frame_index"].to_pylist())]
    table = table.append_column("language_persistent", pa.array([r[0] for r in rows], PERSISTENT))
    table = table.append_column("language_events", pa.array([r[1] for r in rows], EVENTS))
    table = table.append_column("note", pa.array([r[2] for r in rows], pa.string()))
    pq.write_table(table, data)
    info = json.loads(open(f"{root}/meta/info.json").read())
    for name in ("language_persistent", "language_events"):
        info["features"][name] = {"dtype": "language", "shape": [1], "names": None}
    open(f"{root}/meta/info.json", "w").write(json.dumps(info))
    return root, rows


def expected(rows, k: int) -> tuple[list, list, str]:
    persistent, events, note = rows[k]
    return persistent, events or [], note or ""


def test_language_columns_are_text_features_of_every_frame(annotated):
    root, rows = annotated
    ds = open_dataset(root)
    for name in ("language_persistent", "language_events", "note"):
        assert ds.features[name].kind == "text", name
    k = 0
    for e in range(len(ds)):
        episode = ds.episode(e)
        for step in range(int(ds.lengths[e])):
            persistent, events, note = expected(rows, k)
            assert json.loads(episode["language_persistent"][step]) == persistent
            assert json.loads(episode["language_events"][step]) == events
            assert episode["note"][step] == note
            k += 1


def test_windows_and_lerobots_class_deliver_them(annotated):
    root, rows = annotated
    ds = open_dataset(root)
    step = 1 / float(ds.features["language_events"].fps)
    windows = ds.windows(WindowSpec.from_delta_timestamps({"language_events": [-step, 0.0], "note": [0.0]}))
    assert ds.lengths[0] >= 4
    sample = windows[3]  # episode 0, step 3: frames 2 and 3
    assert [json.loads(t) for t in sample["language_events"]] == [expected(rows, 2)[1], expected(rows, 3)[1]]
    assert expected(rows, 3)[1][0]["style"] == "interjection"
    assert list(sample["note"]) == [expected(rows, 3)[2]]
    lerobot = LeRobotDataset("local/annotated", root=root)
    item = lerobot[6]
    assert item["language_persistent"] == expected(rows, 6)[0]
    assert item["language_events"] == expected(rows, 6)[1]
    assert "note" not in item  # LeRobot's item holds the declared features only
    persistent = item["language_persistent"][1]
    assert isinstance(persistent["timestamp"], float) and persistent["style"] == "subtask"


def test_convert_names_them_as_what_shards_cannot_hold(annotated, tmp_path):
    """Shards hold numeric arrays and videos only: ``convert`` refuses the text features by name (it used to
    convert the dataset without them, silently)."""
    from mmfeed.loaders import convert

    root, _ = annotated
    with pytest.raises(ValueError, match=r"\['language_persistent', 'language_events', 'note'\] hold text per step"):
        convert(root, tmp_path / "shards", codec="copy", episodes_per_shard=2, progress=False)


def test_a_language_column_of_another_type_is_named(annotated, tmp_path):
    """A declared language column holding numbers is refused when read, naming the feature and the file."""
    import shutil

    root, _ = annotated
    copy = tmp_path / "ds"
    shutil.copytree(root, copy)
    data = copy / "data/chunk-000/file-000.parquet"
    table = pq.read_table(data)
    table = table.set_column(table.column_names.index("language_events"), "language_events",
                             pa.array(np.arange(table.num_rows, dtype=np.float32)))
    pq.write_table(table, data)
    ds = open_dataset(copy)
    with pytest.raises(ValueError, match=r"language_events.*file-000.parquet"):
        ds.episode(0)
