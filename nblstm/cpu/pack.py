"""Weights packed in the micro-kernel's panels, chunk by chunk, and the gates' input weights.

The forward's operand: each chunk's ``4 * uk`` columns (its units' four gate
blocks, in the caller's order) in ``[D, P]`` panels; the backward's: each
chunk's rows transposed. :mod:`nblstm.cpu.partition` says where each chunk
starts (:func:`~nblstm.cpu.partition.column_offsets`).
"""

import numba
import numpy as np
from numba import njit

from .._jit import KERNEL
from . import microkernel, pool, threads
from .partition import MIN_PARALLEL_PACK

__all__ = ["copy_transposed", "gate_weights", "pack_chunks", "pack_recurrent"]


def pack_recurrent(w_rec, bounds, col_off):
    """Weights ``w_rec: [D, 4H]`` as one flat array, chunk by chunk, in the micro-kernel's panels.

    The recurrent weights (``D = H``), and the input weights (``D = I``)
    when the steps compute their input projections
    (:func:`~nblstm.cpu.partition.fused_projection`). Chunk ``k`` holds the ``4 * uk`` columns of its
    units, gate block after gate block in the caller's order, at
    ``D * col_off[k]`` (:func:`~nblstm.cpu.partition.column_offsets` with ``per_unit = 4``), in
    ``[D, P]`` panels of ``P`` columns, zero-padded: the step's right
    operand. Callers run it inside :class:`~nblstm.cpu.blas.kernel_section`.
    """
    packed = pool.aligned(w_rec.shape[0] * int(col_off[-1]), w_rec.dtype)
    pack_chunks(np.ascontiguousarray(w_rec), bounds, col_off, packed, False, w_rec.size >= MIN_PARALLEL_PACK)
    return packed


@njit(inline="always", **KERNEL)
def _pack_forward_chunk(w_rec, bounds, col_off, packed, k):
    """Chunk ``k`` of :func:`pack_recurrent` in panels: column ``j = g * uk + u`` is ``w_rec[:, g * H + u0 + u]``."""
    depth = w_rec.shape[0]
    units = w_rec.shape[1] // 4
    u0 = bounds[k]
    uk = bounds[k + 1] - u0
    width = microkernel.panel_width_of(packed)
    for g in range(4):
        microkernel.pack_columns(w_rec, g * units + u0, uk, packed, depth * col_off[k], g * uk, width)
    microkernel.zero_columns(packed, depth * col_off[k], depth, 4 * uk, width)


@njit(inline="always", **KERNEL)
def _pack_backward_chunk(w_rec, bounds, col_off, packed, k):
    """Chunk ``k`` of :func:`pack_chunks` transposed: column ``u`` is ``w_rec[u0 + u, :]``."""
    gates = w_rec.shape[1]
    u0 = bounds[k]
    uk = bounds[k + 1] - u0
    width = microkernel.panel_width_of(packed)
    microkernel.pack_rows(w_rec, u0, uk, packed, gates * col_off[k], 0, width)
    microkernel.zero_columns(packed, gates * col_off[k], gates, uk, width)


@njit(inline="always", **KERNEL)
def _pack_chunk(w_rec, bounds, col_off, packed, k, transposed):
    if transposed:
        _pack_backward_chunk(w_rec, bounds, col_off, packed, k)
    else:
        _pack_forward_chunk(w_rec, bounds, col_off, packed, k)


def pack_chunks(w_rec, bounds, col_off, packed, transposed, parallel):
    """Pack every chunk's recurrent weights in the micro-kernel's panels, one task per chunk.

    ``transposed=False``: the forward's operand, chunk ``k``'s ``4 * uk``
    columns at ``H * col_off[k]`` (:func:`pack_recurrent`).
    ``transposed=True``: the backward's, ``w_rec[u0:u1].T`` (``[4H, uk]``) at
    ``4H * col_off[k]`` (:func:`~nblstm.cpu.partition.column_offsets` with ``per_unit = 4``), for
    ``dh = dgates @ w_rec^T``. ``parallel``: the chunks on up to :func:`numba.get_num_threads` threads.
    """
    chunks = len(bounds) - 1
    workers = min(chunks, numba.get_num_threads()) if parallel else 1
    threads.run(_pack_worker, (workers, w_rec, bounds, col_off, packed, transposed), workers)


@njit(**KERNEL)
def _pack_worker(w, workers, w_rec, bounds, col_off, packed, transposed):
    """Chunks ``w, w + workers, ...`` of :func:`pack_chunks`."""
    for k in range(w, bounds.shape[0] - 1, workers):
        _pack_chunk(w_rec, bounds, col_off, packed, k, transposed)


def gate_weights(w, blocks, w_in, parallel):
    """``w_in[g] = w[:I, blocks[g] * H:(blocks[g] + 1) * H]``: ``w_in: [4, I, H]``, the input
    weights of the gates ``i, ci, f, o`` (row copies, in parallel: NumPy's
    copy of the transposed view took 3.2 ms at ``I = H = 1024``)."""
    workers = numba.get_num_threads() if parallel else 1
    threads.run(_gate_rows_worker, (workers, w, blocks, w_in), workers)


@njit(**KERNEL)
def _gate_rows_worker(k, workers, w, blocks, w_in):
    """Worker ``k``'s share of :func:`gate_weights`' ``4 I`` row copies."""
    tasks = 4 * w_in.shape[1]
    for task in range(k * tasks // workers, (k + 1) * tasks // workers):
        _copy_gate_row(w, blocks, w_in, task)


@njit(inline="always", **KERNEL)
def _copy_gate_row(w, blocks, w_in, task):
    inputs, units = w_in.shape[1], w_in.shape[2]
    g = task // inputs
    r = task - g * inputs
    src = w[r, blocks[g] * units:(blocks[g] + 1) * units]
    dst = w_in[g, r]
    for j in range(units):
        dst[j] = src[j]


#: Side of the square tiles of :func:`copy_transposed` (a tile of float64 is 2 KiB: both sides stay in L1).
_TRANSPOSE_TILE = 16


def copy_transposed(src, dst):
    """``dst[...] = src.T`` for 2-D arrays of one dtype (any strides), in tiles.

    NumPy copies a transposed view element by element down the columns of
    its source: with a power-of-two row length every such column lands in
    the same few cache sets, and a ``[512, 1024]`` float32 transpose took
    1.24 ms here against 0.35 ms in ``16 x 16`` tiles (64 ms against 19 ms
    at ``[2048, 4096]``; where the rows do not conflict, at ``[445, 1280]``,
    0.35 ms and 0.43 ms). The weights of
    ``nblstm.torch.LSTM`` go through it at every step, and their gradients.
    """
    rows, cols = src.shape
    if dst.shape != (cols, rows) or dst.dtype != src.dtype:
        raise ValueError(f"dst has shape {dst.shape} and dtype {dst.dtype}; expected {(cols, rows)}, {src.dtype}")
    if src.size == 0:
        return
    item = src.itemsize
    _transpose_tiles(_flat(src), src.strides[0] // item, src.strides[1] // item, _flat(dst), dst.strides[0] // item,
                     dst.strides[1] // item, rows, cols)


def _flat(a):
    """The memory ``a`` spans from its first element, as a 1-D array of unsigned integers of its item size.

    A copy moves bits: one compiled kernel per item size (float16, which
    numba has no arrays of, too).
    """
    if any(s < 0 for s in a.strides) or any(s % a.itemsize for s in a.strides):
        raise ValueError("copy_transposed takes arrays with non-negative strides in whole elements")
    span = 1 + sum((n - 1) * s // a.itemsize for n, s in zip(a.shape, a.strides, strict=True))
    bits = np.lib.stride_tricks.as_strided(a, shape=(span,), strides=(a.itemsize,))
    return bits.view(np.dtype(f"u{a.itemsize}"))


@njit(**KERNEL)
def _transpose_tiles(src, s_row, s_col, dst, d_row, d_col, rows, cols):
    """``dst[c * d_row + r * d_col] = src[r * s_row + c * s_col]`` for ``r < rows``, ``c < cols``."""
    for c0 in range(0, cols, _TRANSPOSE_TILE):
        c1 = min(c0 + _TRANSPOSE_TILE, cols)
        for r0 in range(0, rows, _TRANSPOSE_TILE):
            r1 = min(r0 + _TRANSPOSE_TILE, rows)
            for c in range(c0, c1):
                # Unsigned indices: numba then emits no wraparound test for negative ones.
                d = np.uint64(c * d_row)
                s = np.uint64(c * s_col)
                for r in range(r0, r1):
                    dst[d + np.uint64(r * d_col)] = src[s + np.uint64(r * s_row)]
