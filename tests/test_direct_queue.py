"""A recycling loader's workers talk through DirectQueue: messages written by the thread that puts them, no
feeder thread on either side; and the same batches arrive as through torch's own queues."""

import multiprocessing
import queue
import threading

import pytest
import torch

from dist_job import packing
from house_digest import digest_of
from mmfeed import DataLoader
from mmfeed.loaders import open_dataset
from mmfeed.loaders.loop import dataloader as loop_dataloader
from mmfeed.loaders.loop.workers import DirectQueue, direct_queues
from mmfeed.testing import make_episodes, write_webdataset


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("direct") / "d"
    write_webdataset(out, make_episodes(6, seed=4, min_length=10, max_length=20, cameras=("cam_high",),
                                        height=32, width=32), episodes_per_shard=3)
    return out


def _echo(inbox, outbox) -> None:
    """Put back each message, doubled, until None."""
    while (message := inbox.get(timeout=30)) is not None:
        outbox.put(message * 2)
    outbox.put("done")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_messages_cross_to_a_child_in_order_with_no_feeder_thread(method):
    ctx = direct_queues(method)
    assert isinstance(ctx, type(multiprocessing.get_context(method))) and ctx.get_start_method() == method
    inbox, outbox = ctx.Queue(), ctx.Queue()
    assert type(inbox) is DirectQueue and type(outbox) is DirectQueue
    child = ctx.Process(target=_echo, args=(inbox, outbox))
    child.start()
    try:
        big = bytes(range(256)) * 1600  # 400 KB, more than a pipe holds: written while the other side reads
        for message in (1, "ab", [3], big, None):
            inbox.put(message)
        got = [outbox.get(timeout=30) for _ in range(5)]
        assert got[:3] == [2, "abab", [3, 3]] and got[3] == big * 2 and got[4] == "done"
        assert inbox._thread is None and outbox._thread is None  # nothing was handed to a thread
        assert not [t for t in threading.enumerate() if "QueueFeederThread" in t.name]
    finally:
        child.join(timeout=30)
    assert child.exitcode == 0


def test_a_full_or_closed_queue_refuses_and_an_unpicklable_message_raises_in_put():
    q = direct_queues().Queue(maxsize=1)
    q.put(1)
    with pytest.raises(queue.Full):
        q.put(2, block=False)
    with pytest.raises(queue.Full):
        q.put(2, timeout=0.01)
    assert q.get(timeout=5) == 1
    with pytest.raises(Exception, match="pickle"):  # raised here, not printed by a thread and lost
        q.put(lambda: None)
    q.put(3)  # the refused message took no place in the queue
    assert q.get(timeout=5) == 3
    q.close()
    with pytest.raises(ValueError, match="is closed"):
        q.put(4)


def test_a_recycling_loader_uses_direct_queues_and_delivers_the_same_batches(shards, monkeypatch):
    def batches():
        loader = DataLoader(open_dataset(shards), packing=packing(), num_workers=2, persistent_workers=True)
        out = [digest_of(batch) for batch in loader]  # every tensor and field of each batch
        it = loader._chain.torch_iter
        kinds = {type(it._data_queue), *(type(q) for q in it._index_queues)}
        feeders = [t for t in threading.enumerate() if "QueueFeederThread" in t.name]
        del loader, it
        return out, kinds, feeders

    direct, kinds, feeders = batches()
    assert kinds == {DirectQueue} and not feeders
    monkeypatch.setattr(loop_dataloader, "direct_queues", lambda context=None: context)  # torch's queues
    plain, kinds, feeders = batches()
    assert DirectQueue not in kinds and feeders
    assert direct == plain and len(direct) > 0


def test_a_loader_without_recycled_buffers_keeps_torchs_queues(shards):
    loader = DataLoader(open_dataset(shards), packing=packing(), num_workers=2, persistent_workers=True,
                        recycle_buffers=False)
    assert sum(1 for _ in loader) > 0
    assert type(loader._chain.torch_iter._data_queue) is not DirectQueue
