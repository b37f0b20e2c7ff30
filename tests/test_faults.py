"""Faults: dead workers, hung reads, Ctrl-C, fuzzed parsers and memory over epochs. Never a hang, never a leak."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfeed import DataLoader
from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec
from mmfeed.loaders.loop.workers import PARENT_POLL_S
from mmfeed.loaders.stores.index import build_index
from mmfeed.loaders.transport.tar import parse_meta
from mmfeed.testing import make_episodes, write_webdataset

CAM = "observation.images.cam_high"


class Deadly(torch.utils.data.Dataset):
    """Sample `kill_at` kills its own worker process with SIGKILL; sample `hang_at` sleeps far past any timeout."""

    def __init__(self, n=16, kill_at=None, hang_at=None):
        self.n, self.kill_at, self.hang_at = n, kill_at, hang_at

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if i == self.hang_at:
            time.sleep(60)
        return torch.tensor([i])


def test_a_killed_worker_is_an_error_naming_it_not_a_hang():
    loader = DataLoader(Deadly(kill_at=5), batch_size=2, num_workers=2)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pid.*\) .*(killed|exited)"):
        list(loader)
    assert time.monotonic() - start < 30


ORPHANED = textwrap.dedent("""
    import multiprocessing, os, signal, sys
    import numpy as np
    import torch
    from mmfeed import DataLoader
    from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec

    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 10_000
        def __getitem__(self, i):
            return np.full(50_000, i)

    def stack(samples):  # numpy arrays go through the result pipe by value (tensors would go in shared memory)
        return np.stack(samples)

    cam = "observation.images.cam_high"
    packing = Packing(layout=TokenLayout(tokens_per_frame={cam: 16}),
                      window=WindowSpec.from_delta_timestamps({cam: [-1 / 30, 0.0], "action": [0.0, 1 / 30]}),
                      plan=PlanConfig(capacity=16384, rows_per_batch=2))  # 256 kB of position ids a batch
    if sys.argv[2] == "planned":
        loader = DataLoader(sys.argv[1], packing=packing, num_workers=2, persistent_workers=True)
    else:
        loader = DataLoader(Plain(), batch_size=4, num_workers=2, persistent_workers=True, collate_fn=stack)
    for n, batch in enumerate(loader):
        if n == 4:
            break
    print(*[p.pid for p in multiprocessing.active_children()], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would: no cleanup, the workers left mid-epoch
""")


def _alive(pid):
    """The process exists and is no zombie (its state follows the parenthesised command name)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("dataset", ["planned", "plain"])
def test_workers_of_a_killed_training_process_exit(tmp_path, dataset):
    """A training process killed with SIGKILL leaves no worker behind: each notices its parent is gone and
    exits (torch's own check, on its own, can leave a worker blocked for ever on its result pipe)."""
    write_webdataset(tmp_path / "d", make_episodes(4, seed=3, min_length=40, max_length=60, cameras=("cam_high",)))
    script, out = tmp_path / "orphans.py", tmp_path / "pids.txt"
    script.write_text(ORPHANED)
    with open(out, "w") as f:
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "d"), dataset], stdout=f,
                                stderr=subprocess.PIPE, start_new_session=True, text=True)
    try:
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
        pids = [int(p) for p in out.read_text().split()]
        assert len(pids) == 2
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if _alive(p)]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow  # workers started by spawn and forkserver
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_workers_started_by_spawn_or_a_fork_server_watch_the_right_parent(tmp_path, context):
    """Under forkserver a worker's OS parent is the fork server, not the training process: the watch must not
    take that for a dead parent. Every batch of the epoch arrives, from workers that stay alive."""
    write_webdataset(tmp_path / "d", make_episodes(3, seed=4, min_length=20, max_length=30, cameras=("cam_high",)))
    packing = Packing(layout=TokenLayout(tokens_per_frame={CAM: 16}),
                      window=WindowSpec.from_delta_timestamps({CAM: [0.0], "action": [0.0, 1 / 30]}),
                      plan=PlanConfig(capacity=64, rows_per_batch=1))
    expected = sorted(int(s) for b in DataLoader(tmp_path / "d", packing=packing) for s in b.metadata["sample"])
    loader = DataLoader(tmp_path / "d", packing=packing, num_workers=2, multiprocessing_context=context)
    got = []
    for n, batch in enumerate(loader):
        got.extend(int(s) for s in batch.metadata["sample"])
        if n == 0:
            time.sleep(3 * PARENT_POLL_S)  # a worker that took the fork server's pid for its parent is gone now
    assert sorted(got) == expected and len(got) > 0


@pytest.mark.slow
def test_a_hung_read_hits_the_timeout_with_a_clear_error():
    loader = DataLoader(Deadly(hang_at=3), batch_size=1, num_workers=1, timeout=2)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 2 seconds"):
        list(loader)
    assert time.monotonic() - start < 20


CTRL_C = textwrap.dedent("""
    import signal
    # Ctrl-C raises KeyboardInterrupt here even where the test runner started us with SIGINT ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import json, multiprocessing, sys, time
    from mmfeed import DataLoader
    from mmfeed.loaders import Packing, PlanConfig, TokenLayout, WindowSpec
    cam = "observation.images.cam_high"
    packing = Packing(layout=TokenLayout(tokens_per_frame={cam: 8}),
                      window=WindowSpec.from_delta_timestamps({cam: [0.0], "action": [0.0, 1 / 30]}),
                      plan=PlanConfig(capacity=64))
    loader = DataLoader(sys.argv[1], packing=packing, num_workers=2, persistent_workers=True)
    it = iter(loader)
    next(it)
    print(json.dumps([p.pid for p in multiprocessing.active_children()]), flush=True)
    try:
        while True:
            for _ in loader:
                time.sleep(0.05)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise
""")


def _shm():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.slow
def test_ctrl_c_shuts_workers_down_and_leaves_no_shared_memory(tmp_path):
    write_webdataset(tmp_path / "d", make_episodes(2, seed=1, min_length=30, max_length=30, cameras=("cam_high",)))
    before = _shm()
    proc = subprocess.Popen([sys.executable, "-c", CTRL_C, str(tmp_path / "d")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    workers = []
    try:
        line = proc.stdout.readline()
        assert line, f"the loader did not start: {proc.stderr.read()[-2000:]}"
        workers = json.loads(line)
        assert len(workers) == 2
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode != 0 and "interrupted" in out and "KeyboardInterrupt" in err
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
            time.sleep(0.1)
        alive = [pid for pid in workers if _alive(pid)]
        assert not alive, f"workers {alive} outlived the interrupted loader"
        assert not {n for n in _shm() - before if n.startswith(("torch_", "psm_", "mp-"))}
    finally:
        if proc.poll() is None:  # it did not stop: do not leave it (or its workers) running
            proc.kill()
            proc.wait(timeout=30)
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@settings(max_examples=200)
@given(st.binary(max_size=200))
def test_meta_parser_rejects_any_bytes_with_a_value_error_naming_shard_and_key(raw):
    try:
        meta = parse_meta("shard-x.tar", "ep1", raw)
    except ValueError as err:
        assert "shard-x.tar" in str(err) and "ep1" in str(err)
    else:
        assert {"fps", "length", "task", "rates"} <= set(meta)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 100) | st.floats(allow_nan=True) | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)
META_KEYS = st.sampled_from(["fps", "length", "task", "rates", "camera_fps", "features", "cameras"])


@settings(max_examples=200)
@given(st.dictionaries(META_KEYS, JSON, max_size=6), st.booleans())
def test_meta_parser_checks_every_field_it_returns(fields, with_required):
    """meta.json objects of any field values: a ValueError naming shard and key, or a meta whose fps and rates
    are numbers > 0, length an int >= 0 and task a string."""
    if with_required:
        fields = {"fps": 30.0, "length": 10, **fields}
    try:
        meta = parse_meta("shard-x.tar", "ep1", json.dumps(fields).encode())
    except ValueError as err:
        assert "shard-x.tar" in str(err) and "ep1" in str(err)
    else:
        assert isinstance(meta["length"], int) and not isinstance(meta["length"], bool) and meta["length"] >= 0
        assert isinstance(meta["task"], str) and meta["fps"] > 0
        assert all(isinstance(v, float) and v > 0 for v in meta["rates"].values())


@pytest.fixture(scope="module")
def tiny_tar(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz")
    return write_webdataset(out, make_episodes(1, seed=3, min_length=4, max_length=4, cameras=("c",)))[0]


@settings(max_examples=60)
@given(data=st.data())
def test_tar_reader_on_mutated_bytes_raises_only_value_errors(tiny_tar, tmp_path_factory, data):
    """Flipped, cut or inserted bytes anywhere in a shard: the index reader either indexes it or raises a
    ValueError naming the shard, never anything else."""
    raw = bytearray(open(tiny_tar, "rb").read())
    kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    at = data.draw(st.integers(0, len(raw) - 1))
    if kind == "flip":
        raw[at] ^= data.draw(st.integers(1, 255))
    elif kind == "cut":
        raw = raw[:at]
    else:
        raw[at:at] = data.draw(st.binary(min_size=1, max_size=600))
    path = tmp_path_factory.mktemp("m") / "shard-000000.tar"
    path.write_bytes(bytes(raw))
    try:
        build_index([str(path)])
    except ValueError as err:
        assert "shard-000000.tar" in str(err)


def _rss_kib(pids):
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fh:
                total += next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))
        except (FileNotFoundError, StopIteration):
            pass
    return total


def test_memory_stays_flat_over_five_epochs_with_workers(tmp_path):
    """RSS of the loop and its workers grows by less than 10% from the end of epoch 1 to the end of epoch 5."""
    import multiprocessing

    write_webdataset(tmp_path / "d", make_episodes(6, seed=2, min_length=20, max_length=30, cameras=("cam_high",)))
    packing = Packing(layout=TokenLayout(tokens_per_frame={CAM: 16}),
                      window=WindowSpec.from_delta_timestamps({CAM: [-1 / 30, 0.0], "observation.state": [0.0],
                                                               "action": [0.0, 1 / 30, 2 / 30]}),
                      plan=PlanConfig(capacity=128, rows_per_batch=2))
    loader = DataLoader(tmp_path / "d", packing=packing, num_workers=2, persistent_workers=True)
    sizes = []
    for _ in range(5):
        for batch in loader:
            del batch
        pids = [os.getpid()] + [p.pid for p in multiprocessing.active_children()]
        sizes.append(_rss_kib(pids))
    growth = (sizes[-1] - sizes[0]) / sizes[0]
    assert growth < 0.10, f"RSS per epoch (KiB): {sizes}"
