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
anything else is copied by numpy. The stores are 16-byte vector stores marked ``!nontemporal`` (SSE2 ``movntdq`` on x86-64; a plain
store where a CPU has no such instruction), followed by a fence, so the frame is in memory before the batch is
handed over. The bytes written are the same as ``dst[...] = src``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["STREAM_MIN_BYTES", "copy_into"]

STREAM_MIN_BYTES = 64 * 1024
"""Frames smaller than this are copied by numpy: they do not displace much, and the call costs more."""


@intrinsic
def _address(typingctx, array, offset):
    """``&array[offset]`` of a 1-D uint8 array, as a byte pointer."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(8).as_pointer())
    return types.voidptr(array, types.intp), codegen


@intrinsic
def _stream16(typingctx, dst, src):
    """Store the 16 bytes at ``src`` to the 16-byte aligned ``dst`` with a non-temporal store."""
    def codegen(context, builder, signature, args):
        vector = ir.VectorType(ir.IntType(8), 16).as_pointer()
        value = builder.load(builder.bitcast(args[1], vector), align=1)
        store = builder.store(value, builder.bitcast(args[0], vector), align=16)
        store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
    return types.void(types.voidptr, types.voidptr), codegen


@intrinsic
def _fence(typingctx):
    """A full memory fence: the streaming stores before it are visible to every process after it."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
    return types.void(), codegen


@njit(cache=True, nogil=True)
def _stream_rows(dst, src, dst_address):
    """The rows of ``src`` (2-D uint8, each row contiguous) back to back into the contiguous 1-D ``dst``, whose
    first byte lies at ``dst_address``."""
    rows, width = src.shape
    at = 0
    for r in range(rows):
        row = src[r]
        head = min((16 - (dst_address + at) % 16) % 16, width)
        for i in range(head):
            dst[at + i] = row[i]
        i = head
        while i + 16 <= width:
            _stream16(_address(dst, at + i), _address(row, i))
            i += 16
        while i < width:
            dst[at + i] = row[i]
            i += 1
        at += width
    _fence()


def _rows(array: np.ndarray) -> np.ndarray | None:
    """uint8 ``array`` as a 2-D ``[rows, bytes per row]`` view (rows: its first axis) when each row is
    contiguous, else None."""
    if array.dtype != np.uint8 or array.ndim < 2 or not len(array) or not array[0].flags.c_contiguous:
        return None
    return np.lib.stride_tricks.as_strided(array, (array.shape[0], int(np.prod(array.shape[1:]))),
                                           (array.strides[0], 1), writeable=False)


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` (same shape), with streaming stores where that pays (see the module docstring)."""
    if dst.nbytes >= STREAM_MIN_BYTES and dst.shape == src.shape and dst.dtype == np.uint8 \
            and dst.flags.c_contiguous:
        rows = _rows(src)
        if rows is not None:
            _stream_rows(dst.reshape(-1), rows, dst.ctypes.data)
            return
    dst[...] = src
