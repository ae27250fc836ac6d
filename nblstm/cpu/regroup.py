"""Rows of ``[T, B, N]`` arrays moved between time order and step order (:mod:`nblstm.schedule`).

Two kernels, each a serial worker over a share of the examples (example
``b`` goes to worker ``b % workers``), run on several threads
(:func:`nblstm.cpu.threads.run`) from :data:`~nblstm.cpu.partition.MIN_PARALLEL_PACK`
elements on: they only move memory.
"""

import numba
import numpy as np
from numba import njit

from .._jit import KERNEL, full_width
from . import threads
from .partition import MIN_PARALLEL_PACK

__all__ = ["gather", "scatter_add"]


@njit(**KERNEL)
def _gather_worker(w, workers, src, first, index, shift, dst):
    full_width()
    steps, batch, width = dst.shape
    zero = dst.dtype.type(0.0)
    for b in range(w, batch, workers):
        for t in range(steps):
            k = index[t, b]
            out = dst[t, b]
            if k < 0:
                for n in range(width):
                    out[n] = zero
            else:
                row = first[b] if k < shift else src[k - shift, b]
                for n in range(width):
                    out[n] = row[n]


@njit(**KERNEL)
def _scatter_add_worker(w, workers, src, index, dst):
    full_width()
    batch, width = dst.shape[1], dst.shape[2]
    zero = dst.dtype.type(0.0)
    for b in range(w, batch, workers):
        for s in range(dst.shape[0]):
            out = dst[s, b]
            for n in range(width):
                out[n] = zero
        for t in range(src.shape[0]):  # in time order: a fixed order of the sums
            k = index[t, b]
            if k >= 0:
                out = dst[k, b]
                row = src[t, b]
                for n in range(width):
                    out[n] += row[n]


def _workers(dst):
    return 1 if dst.size < MIN_PARALLEL_PACK else max(1, min(numba.get_num_threads(), dst.shape[1]))


def gather(src, index, dst, first=None, shift=0):
    """``dst[t, b] = src[index[t, b] - shift, b]``; ``first[b]`` where ``0 <= index < shift``; zero where ``index < 0``.

    Parameters
    ----------
    src : [S, B, N] C-contiguous array
    index : [T, B] int64 C-contiguous array
    dst : [T, B, N] C-contiguous array
        Output.
    first : [B, N] C-contiguous array, optional
        The row before ``src[0]`` (``shift = 1``: ``h0`` before the outputs of the steps).
    shift : {0, 1}
    """
    workers = _workers(dst)
    threads.run(_gather_worker, (workers, src, src[0] if first is None else first, index, np.int64(shift), dst),
                workers)


def scatter_add(src, index, dst):
    """``dst[s, b] = sum of src[t, b] over the times t with index[t, b] == s`` (zero where none).

    Parameters
    ----------
    src : [T, B, N] C-contiguous array
    index : [T, B] int64 C-contiguous array
        Values in ``[-1, S)``; ``-1`` rows are dropped.
    dst : [S, B, N] C-contiguous array
        Output.
    """
    workers = _workers(dst)
    threads.run(_scatter_add_worker, (workers, src, index, dst), workers)
