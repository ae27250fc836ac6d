"""Memory for the kernels' outputs and workspaces: aligned, and large blocks recycled.

Every array from here starts on a 64-byte boundary (:func:`aligned`).

glibc serves every block above 32 MiB (its largest mmap threshold) with a
fresh ``mmap`` and unmaps it on ``free``: each forward whose outputs are that
large, ``7 T B H`` elements (57 MiB at ``(100, 64, 125, 320)``), faults all
its pages in again and the kernel zeroes them, 13-15 % of the forward's time
here. Smaller blocks come from glibc's heap, which the calling thread keeps;
but a helper thread's heap (glibc's arena of that thread) gave its freed
blocks back to the system: the second direction of a bidirectional layer,
run on a helper thread (:func:`nblstm.cpu.threads.run_each`), faulted in
some 900 pages of its outputs and gradients at every training call at
``(50, 32, 128, 128)``, and its forward took 1.2-1.4x the first
direction's time.

:func:`empty` lends such blocks from a pool instead. The arrays it returns,
and every view of them, have a small owner object as their base; when the
last of them is gone the owner hands the memory back to the pool, and the
next call of the same size (or up to half as large) reuses it, already mapped. The
pool keeps at most :data:`MAX_FREE_BYTES` of free blocks, the most recently freed
first, and drops those smaller than a request that none of them serves.
"""

import math
import threading

import numpy as np
from numba import njit

from .._jit import KERNEL

__all__ = ["ALIGNMENT", "MAX_FREE_BYTES", "MIN_BYTES", "aligned", "clear", "empty", "zeros"]

#: Blocks smaller than this come from NumPy directly. From 256 KiB a block is pooled, on any thread (a
#: 2-layer bidirectional ``nblstm.LSTM`` at ``(50, 32, 128, 128)`` trained in 0.86x the time with the pool
#: from 256 KiB than from 32 MiB).
MIN_BYTES = 256 << 10
#: Alignment in bytes of the data of every array from here.
ALIGNMENT = 64
#: Free blocks kept for reuse, in bytes at most.
MAX_FREE_BYTES = 256 << 20

_lock = threading.RLock()  # re-entrant: a collection may free a block while the pool is locked
_free = []  # [(nbytes, uint8 buffer)], most recently freed last
_free_bytes = 0  # their total


class _Lease:
    """The base object of a pooled array: returns the buffer when collected."""

    __slots__ = ("__array_interface__", "_buffer")

    def __init__(self, buffer, shape, dtype):
        self._buffer = buffer
        address = buffer.ctypes.data + _misalignment(buffer)
        self.__array_interface__ = {"data": (address, False), "shape": tuple(shape),
                                    "typestr": dtype.str, "version": 3}

    def __del__(self):
        _release(self._buffer)


@njit(**KERNEL)
def _misalignment(buffer):
    """Bytes from the start of the 1-D ``buffer`` to its first 64-byte boundary
    (jitted: ``ndarray.ctypes.data`` takes 1.6 us, this call 0.2)."""
    return -buffer.ctypes.data % ALIGNMENT


def aligned(shape, dtype):
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary (unless it is empty).

    A cache line, and an AVX-512 vector: NumPy aligns to 16 bytes only
    (glibc's large blocks start 16 bytes into a page), and vectors that
    straddle cache lines cost two loads or stores each. Packed weights and
    workspaces of the micro-kernel, and the arrays the gate maths reads and
    writes, come from here. A batch-1 cell step, bound by its loads, took
    about 1.3x the time on misaligned panels, depending on where the
    allocator happened to put them.

    Parameters
    ----------
    shape : int or sequence of int
    dtype : numpy dtype
    """
    dtype = np.dtype(dtype)
    count = math.prod(shape) if isinstance(shape, (tuple, list)) else shape
    buffer = np.empty(count * dtype.itemsize + ALIGNMENT, np.uint8)
    return np.ndarray(shape, dtype, buffer, _misalignment(buffer))


def _release(buffer):
    global _free_bytes
    with _lock:
        _free.append((buffer.nbytes, buffer))
        _free_bytes += buffer.nbytes
        while _free_bytes > MAX_FREE_BYTES:
            _free_bytes -= _free.pop(0)[0]


def _take(nbytes):
    """The smallest free block of ``nbytes`` to ``2 * nbytes`` bytes (of equals, the most recently freed), or
    ``None``.

    Without one, the free blocks smaller than ``nbytes`` are dropped: calls
    whose sizes grow (a sequence length that changes from batch to batch)
    would never take them again, and kept they held the pool's whole
    :data:`MAX_FREE_BYTES` (a cell trained at ``T = 10, 13, .., 199``:
    a peak RSS of 534 MiB, against 273 MiB with blocks from glibc alone).
    """
    global _free_bytes
    with _lock:
        best = -1
        for k in range(len(_free) - 1, -1, -1):
            size = _free[k][0]
            if nbytes <= size <= 2 * nbytes and (best < 0 or size < _free[best][0]):
                best = k
        if best >= 0:
            size, buffer = _free.pop(best)
            _free_bytes -= size
            return buffer
        _free[:] = [(size, buffer) for size, buffer in _free if size >= nbytes]
        _free_bytes = sum(size for size, _ in _free)
    return None


def empty(shape, dtype):
    """An uninitialised C-contiguous array, 64-byte aligned, from the pool when it is large.

    Parameters
    ----------
    shape : tuple of int
    dtype : numpy dtype

    Returns
    -------
    numpy.ndarray
        Writeable; its memory goes back to the pool (or to NumPy) when it
        and all its views are gone.
    """
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return aligned(shape, dtype)
    buffer = _take(nbytes + ALIGNMENT)
    if buffer is None:
        buffer = np.empty(nbytes + ALIGNMENT, np.uint8)
    return np.asarray(_Lease(buffer, shape, dtype))


def zeros(shape, dtype):
    """:func:`empty`, zeroed."""
    a = empty(shape, dtype)
    a.fill(0)
    return a


def clear():
    """Drop every free block (the memory of blocks in use is not affected)."""
    global _free_bytes
    with _lock:
        _free.clear()
        _free_bytes = 0
