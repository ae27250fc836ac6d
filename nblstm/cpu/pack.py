"""Weights packed in the micro-kernel's panels, chunk by chunk, and gate blocks transposed.

The forward's operand: each chunk's ``4 * uk`` columns (its units' four gate
blocks, in the caller's order) in ``[D, P]`` panels; the backward's: each
chunk's rows transposed. :mod:`nblstm.cpu.partition` says where each chunk
starts (:func:`~nblstm.cpu.partition.column_offsets`).
"""

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .._jit import CALLEE, KERNEL
from . import microkernel, pool, threads
from .partition import MIN_PARALLEL_PACK, MIN_PARALLEL_TRANSPOSE
from .views import flat

__all__ = ["pack_chunks", "pack_recurrent", "transpose_gates"]


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


#: Bytes of a row of the square tiles of :func:`transpose_gates` (one 512-bit vector: 16 float32 elements).
_TILE_BYTES = 64


@intrinsic
def _transpose_tile(typingctx, dst, dst_off, ldd, src, src_off, lds):
    """``dst[a, b] = src[b, a]`` for a square tile of ``L = 64 / itemsize`` rows of unsigned integers (element
    offsets and row strides on flat arrays): ``L`` vector loads, ``L log2 L`` shuffles, ``L`` vector stores.

    Each stage swaps the off-diagonal ``b x b`` blocks of every ``2b x 2b``
    block (``b = 1, 2, 4, ...``), which transposes the tile: a ``16 x 16``
    float32 tile moved at 2x the rate of the element-by-element copy here
    (0.11 against 0.21 ms a ``[1024, 256]`` matrix). Where the CPU's vectors are narrower, LLVM splits them.
    """
    if not (isinstance(dst, types.Array) and isinstance(dst.dtype, types.Integer) and src.dtype == dst.dtype):
        return None
    bits = dst.dtype.bitwidth
    lanes = 8 * _TILE_BYTES // bits
    sig = types.void(dst, types.intp, types.intp, src, types.intp, types.intp)

    def codegen(context, builder, signature, args):
        d, d_off, ld_d, s, s_off, ld_s = args
        vt = ir.VectorType(ir.IntType(bits), lanes)
        it = ld_d.type
        d_ptr = builder.gep(context.make_array(signature.args[0])(context, builder, d).data, [d_off])
        s_ptr = builder.gep(context.make_array(signature.args[3])(context, builder, s).data, [s_off])

        def row(ptr, ld, r):
            return builder.bitcast(builder.gep(ptr, [builder.mul(ir.Constant(it, r), ld)]), vt.as_pointer())

        rows = []
        for r in range(lanes):
            load = builder.load(row(s_ptr, ld_s, r))
            load.align = bits // 8
            rows.append(load)
        b = 1
        while b < lanes:
            # Rows i and i + b of each 2b block: i keeps its left b-blocks and takes i + b's left ones as its right
            # ones; i + b takes i's right ones as its left ones and keeps its right ones.
            mask = ir.VectorType(ir.IntType(32), lanes)
            top = ir.Constant(mask, [n if n & b == 0 else lanes + n - b for n in range(lanes)])
            bottom = ir.Constant(mask, [n + b if n & b == 0 else lanes + n for n in range(lanes)])
            for i in range(lanes):
                if i & b == 0:
                    rows[i], rows[i + b] = (builder.shuffle_vector(rows[i], rows[i + b], top),
                                            builder.shuffle_vector(rows[i], rows[i + b], bottom))
            b *= 2
        for r in range(lanes):
            store = builder.store(rows[r], row(d_ptr, ld_d, r))
            store.align = bits // 8
        return context.get_dummy_value()

    return sig, codegen


def transpose_gates(pairs, blocks, to_columns):
    """Gate blocks of ``rows [4H, N]`` (``H`` rows each) and of ``columns [N, 4H]`` (``H`` columns each), each
    the other's transpose, for each ``(rows, columns)`` of ``pairs``: block ``k`` of ``rows`` is block
    ``blocks[k]`` of ``columns``.

    ``to_columns``: ``columns`` is written from ``rows``; else the other
    way. One or two pairs, all C-contiguous, of one item size (the bits are
    moved: one compiled kernel per item size). ``nblstm.torch.LSTM``'s
    weights (PyTorch's ``[4H, I]`` and ``[4H, H]`` gate rows into the cell's
    ``[I + H, 4H]`` columns) go through it at every training step, and their
    gradients back: in square tiles of 64-byte rows transposed in vector
    registers (:func:`_transpose_tile`), 0.11 ms a float32 matrix at ``H = N = 256``
    here, where element-by-element ``16 x 16`` tiles took 0.21 ms, a strided copy per gate block 0.40 ms and NumPy's
    transposing copy 1.2 ms (its columns of a power-of-two row length land in
    the same few cache sets). The pairs run at once, one a thread
    (:data:`~nblstm.cpu.partition.MIN_PARALLEL_TRANSPOSE`).
    """
    if sorted(blocks) != [0, 1, 2, 3]:
        raise ValueError(f"blocks must be a permutation of 0, 1, 2, 3, got {blocks}")
    pairs = list(pairs)
    if len(pairs) not in (1, 2):
        raise ValueError(f"transpose_gates takes one or two (rows, columns) pairs, got {len(pairs)}")
    for rows, columns in pairs:
        units = rows.shape[0] // 4 if rows.ndim == 2 else 0
        if (rows.ndim != 2 or columns.ndim != 2 or rows.shape[0] != 4 * units or columns.shape != rows.shape[::-1]
                or rows.dtype != columns.dtype or rows.itemsize != pairs[0][0].itemsize):
            raise ValueError(f"rows {rows.shape} {rows.dtype} and columns {columns.shape} {columns.dtype}: expected "
                             "[4H, N] and [N, 4H] of one dtype, the item size of every pair's")
        if not (rows.flags.c_contiguous and columns.flags.c_contiguous):
            raise ValueError("transpose_gates takes C-contiguous arrays")
    pairs = [(rows.view(f"u{rows.itemsize}"), columns.view(f"u{rows.itemsize}")) for rows, columns in pairs
             if rows.size]
    if not pairs:
        return
    small = sum(rows.size for rows, _ in pairs) < MIN_PARALLEL_TRANSPOSE
    # The larger matrix to the calling thread (worker 0): it ends last, so that on an OpenMP team its wait for
    # the other thread measures that thread's lateness alone (nblstm.cpu.threads.LATE_SECONDS).
    pairs = sorted(pairs, key=lambda pair: pair[0].size, reverse=True)
    (rows_a, columns_a), (rows_b, columns_b) = pairs[0], pairs[-1]  # one pair: the same twice, one worker
    threads.run(_transpose_worker, (rows_a, columns_a, rows_b, columns_b, np.asarray(blocks, np.int64),
                                    np.bool_(to_columns)), len(pairs), 1 if small else None)


@njit(**KERNEL)
def _transpose_worker(w, rows_a, columns_a, rows_b, columns_b, blocks, to_columns):
    """Pair ``w`` of :func:`transpose_gates` (its arrays as unsigned integers; arguments of their own, not a
    tuple, which numba indexes by a run-time ``w`` only where every array has one type)."""
    if w == 0:
        _transpose_tiles(rows_a, columns_a, blocks, to_columns)
    else:
        _transpose_tiles(rows_b, columns_b, blocks, to_columns)


@njit(**CALLEE)
def _transpose_tiles(rows, columns, blocks, to_columns):
    """Block ``k`` of ``rows`` into block ``blocks[k]`` of ``columns`` transposed (``to_columns``), else the other
    way, in square tiles of 64-byte rows (:func:`_transpose_tile`; float64: ``16 x 16`` tiles element by
    element); the rows and columns past the last whole tile element by element, along their destination's
    rows (strided reads, contiguous writes: the other order took 3x as long at ``H = N = 1024``, its writes
    4 KiB apart)."""
    count, width = rows.shape
    units = count // 4
    # 8-byte elements: 16 x 16 tiles element by element (8 x 8 tiles in registers were no faster for them).
    vector = rows.itemsize <= 4
    side = _TILE_BYTES // rows.itemsize if vector else 16
    rows_f, columns_f = flat(rows), flat(columns)
    for k in range(4):
        for r0 in range(0, units, side):
            r1 = min(r0 + side, units)
            for n0 in range(0, width, side):
                n1 = min(n0 + side, width)
                c0 = n0 * count + blocks[k] * units + r0  # element (r0, n0) of the block in columns
                w0 = (k * units + r0) * width + n0  # and in rows
                if vector and r1 - r0 == side and n1 - n0 == side:
                    if to_columns:
                        _transpose_tile(columns_f, c0, count, rows_f, w0, width)
                    else:
                        _transpose_tile(rows_f, w0, width, columns_f, c0, count)
                elif to_columns:  # unsigned indices: numba then emits no wraparound test for negative ones
                    for n in range(n1 - n0):
                        for j in range(r1 - r0):
                            columns_f[np.uint64(c0 + n * count + j)] = rows_f[np.uint64(w0 + j * width + n)]
                else:
                    for j in range(r1 - r0):
                        for n in range(n1 - n0):
                            rows_f[np.uint64(w0 + j * width + n)] = columns_f[np.uint64(c0 + n * count + j)]
