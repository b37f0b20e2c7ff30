"""Memory over many epochs: what a persistent worker keeps per read, per batch or per epoch stays bounded.

The PyAV reader seeks once per sample under a shuffle; PyAV's demux generator, dropped half way, keeps its packet
buffer (about 150 bytes of native memory) for good, so a reader must close the generators it drops. Measured with
glibc's ``mallinfo2`` (bytes in use on the C heap), which the Python-level tools (``tracemalloc``, ``gc``) do not
see.
"""

import ctypes
import gc

import numpy as np
import pytest

from mmfeed.codecs._pyav import PyAVReader
from mmfeed.codecs.demux import frames_of, open_container, packets_of, probe
from mmfeed.testing import frame_pattern, write_video


def heap_in_use() -> int:
    """Bytes in use on the C heap (glibc's mallinfo2), after a collection."""
    gc.collect()
    libc = ctypes.CDLL(None)
    fields = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
    libc.mallinfo2.restype = type("Mallinfo2", (ctypes.Structure,), {"_fields_": fields})
    return int(libc.mallinfo2().uordblks)


needs_glibc = pytest.mark.skipif(not hasattr(ctypes.CDLL(None), "mallinfo2"), reason="needs glibc's mallinfo2")


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = tmp_path_factory.mktemp("soak") / "v.mp4"
    return str(write_video(path, frame_pattern(120, height=48, width=64), codec="h264", gop=2))


def growth_per_call(fn, calls: int = 1500) -> float:
    """Heap bytes in use that ``calls`` calls of ``fn`` leave behind, per call (after a warm-up)."""
    for _ in range(200):
        fn()
    before = heap_in_use()
    for _ in range(calls):
        fn()
    return (heap_in_use() - before) / calls


@needs_glibc
def test_a_reader_that_seeks_per_read_keeps_no_heap_per_seek(video):
    info = probe(video)
    reader = PyAVReader(video, info)
    rng = np.random.default_rng(0)

    def read() -> None:
        i = int(rng.integers(1, info.num_frames))
        reader.decode(np.array([i - 1, i]))

    seeks = reader.seeks
    per_read = growth_per_call(read)
    assert reader.seeks - seeks >= 1500  # each read seeked: the path that leaked
    assert per_read < 16, f"{per_read:.0f} heap bytes kept per seek"
    reader.close()


@needs_glibc
def test_generators_dropped_half_way_leave_no_packet_buffer(video):
    container = open_container(video)
    stream = container.streams.video[0]

    def first_frame() -> None:
        container.seek(0, stream=stream)
        next(frames_of(container, stream))

    def first_packet() -> None:
        container.seek(0, stream=stream)
        for _ in packets_of(container, stream):
            break

    assert growth_per_call(first_frame) < 16
    assert growth_per_call(first_packet) < 16
    container.close()
