"""Copying decoded frames into a batch without evicting the decoder's working set from the CPU caches.

Every delivered frame is written once into its batch (a shared-memory buffer the training process reads). An
ordinary copy goes through the caches: a 320x240 RGB frame is 230 KB, a batch of 64 such frames 15 MB, which
pushes the decoder's reference frames and tables out of L2/L3, so the next frames decode slower. Measured on an
AV1 320x240 workload (one process, 32 two-frame windows a batch): decoding alone 25.5 ms a batch, decoding and
copying each frame into the batch 28.5 ms, the same with this module's copy 27.0 ms. A copy that stores with
non-temporal (streaming) instructions writes past the caches and does not read the destination first, so it
also moves a third fewer bytes over the memory bus (which is what bounds copying cached frames out of a
memory-mapped frame store).

:func:`copy_into` does that for arrays of at least :data:`STREAM_MIN_BYTES` whose rows (first axis) are each
contiguous (any row stride, so a crop or a plane with padded lines is fine), into a C-contiguous destination;
anything else is copied by numpy. The stores are 16-byte vector stores marked ``!nontemporal`` (SSE2 ``movntdq``
on x86-64; a plain store where a CPU has no such instruction), followed by a fence, so the frame is in memory
before the batch is handed over. The bytes written are the same as ``dst[...] = src``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["STREAM_MIN_BYTES", "copy_into", "warm"]

STREAM_MIN_BYTES = 64 * 1024
"""Frames smaller than this are copied by numpy: they do not displace much, and the call costs more."""


def _byte_pointer(builder, address):
    return builder.inttoptr(address, ir.IntType(8).as_pointer())


@intrinsic
def _stream16(typingctx, dst, src):
    """Store the 16 bytes at address ``src`` to the 16-byte aligned address ``dst`` with a non-temporal store."""
    def codegen(context, builder, signature, args):
        vector = ir.VectorType(ir.IntType(8), 16).as_pointer()
        value = builder.load(builder.bitcast(_byte_pointer(builder, args[1]), vector), align=1)
        store = builder.store(value, builder.bitcast(_byte_pointer(builder, args[0]), vector), align=16)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
    return types.void(types.intp, types.intp), codegen


@intrinsic
def _copy_byte(typingctx, dst, src):
    """The byte at address ``src`` to address ``dst``."""
    def codegen(context, builder, signature, args):
        builder.store(builder.load(_byte_pointer(builder, args[1])), _byte_pointer(builder, args[0]))
    return types.void(types.intp, types.intp), codegen


@intrinsic
def _fence(typingctx):
    """A full memory fence: the streaming stores before it are visible to every process after it."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
    return types.void(), codegen


@njit(cache=True, nogil=True)
def _stream_rows(dst, src, rows, width, stride):
    """``rows`` rows of ``width`` bytes, the first at address ``src`` and each ``stride`` bytes after the last,
    back to back to address ``dst``."""
    at = dst
    for r in range(rows):
        row = src + r * stride
        head = min((16 - at % 16) % 16, width)
        for i in range(head):
            _copy_byte(at + i, row + i)
        i = head
        while i + 16 <= width:
            _stream16(at + i, row + i)
            i += 16
        while i < width:
            _copy_byte(at + i, row + i)
            i += 1
        at += width
    _fence()


def _row_layout(array: np.ndarray) -> tuple[int, int] | None:
    """(bytes per row, row stride) of uint8 ``array`` when each row (an item of its first axis) is contiguous,
    else None."""
    if array.dtype != np.uint8 or array.ndim < 2:
        return None
    width, inner = 1, 1
    for n, step in zip(array.shape[:0:-1], array.strides[:0:-1]):  # the inner axes, innermost first
        if n > 1 and step != inner:
            return None
        inner *= n
        width *= n
    return width, array.strides[0]


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` (same shape), with streaming stores where that pays (see the module docstring)."""
    if dst.nbytes >= STREAM_MIN_BYTES and dst.shape == src.shape and dst.dtype == np.uint8 \
            and dst.flags.c_contiguous:
        layout = _row_layout(src)
        if layout is not None:
            _stream_rows(dst.ctypes.data, src.ctypes.data, src.shape[0], *layout)
            return
    dst[...] = src


def warm() -> None:
    """Load the compiled kernel now (about 0.4 s the first time in a process, from numba's on-disk cache). A
    loader calls it before it forks its workers, so that they inherit it instead of each loading it again at
    its first batch (and again every epoch, where workers do not persist)."""
    _stream_rows(0, 0, 0, 0, 0)
