"""A register-tiled GEMM for the recurrent step, on weights packed once per call.

The recurrent step multiplies a few rows (the batch) by the same weights at
every step. OpenBLAS packs both operands again on each call: for ``B = 32``
each weight element is used 32 times per call, so the packing costs about
as much as the arithmetic, and the step GEMMs ran at about 100 GFLOP/s per
core here against 150 for large products. This module packs the weights
into column panels once per call and multiplies with a micro-kernel that
keeps a ``R x P`` tile of the result in vector registers, written as LLVM
IR (a numba intrinsic with explicit vector types and ``llvm.fma``): numba's
own loops cannot keep an accumulator tile in registers. It ran at 160-175
GFLOP/s per core on the step shapes here.

Layout: ``C[rows, ncols] = A[rows, K] @ Bp`` where ``Bp`` is packed in
panels of ``P`` columns, panel ``q`` a contiguous ``[K, P]`` block; column
counts are padded to a multiple of ``P`` with zeros. Every result element
is one accumulator summed over ``k = 0 .. K-1`` in order (with fused
multiply-adds), whatever the tile, chunk or thread that computes it: the
results do not depend on how the work is split.
"""

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._jit import CALLEE
from .views import fill_zero

__all__ = [
    "TILE_ROWS",
    "describe",
    "gemm_panels",
    "make_tile",
    "pack_columns",
    "pack_rows",
    "padded",
    "panel_width",
    "panel_width_of",
    "zero_columns",
]

#: Panel rows per block of :func:`pack_rows` (64 rows of 32 float32 are 8 KiB).
_PACK_BLOCK = 64


def _tile_shape():
    """``(lanes of float32, rows R, vectors per row V)`` for this CPU.

    AVX-512 has 32 vector registers: an 8 x 2 tile of accumulators plus the
    two panel vectors and a broadcast. AVX2 has 16: 4 x 3.
    """
    features = llb.get_host_cpu_features()
    if features.get("avx512f", False):
        return 16, 8, 2
    return 8, 4, 3


_LANES32, TILE_ROWS, _VECTORS = _tile_shape()


def describe():
    """The tile chosen for this CPU, in words (``nblstm info``)."""
    isa = "AVX-512" if _LANES32 == 16 else "AVX2"
    return (f"{isa}: {TILE_ROWS} x {_VECTORS} tile of {_LANES32}-lane float32 vectors, panels of "
            f"{panel_width(np.float32)} float32 / {panel_width(np.float64)} float64 columns")


def panel_width(dtype):
    """Columns ``P`` of a packed panel for ``dtype`` (float32 or float64)."""
    return _LANES32 * _VECTORS if np.dtype(dtype).itemsize == 4 else (_LANES32 // 2) * _VECTORS


def padded(count, dtype):
    """``count`` rounded up to a multiple of :func:`panel_width`."""
    p = panel_width(dtype)
    return -(-count // p) * p


def make_tile(lanes32, tile_rows, vectors, accumulate=False, panels=1):
    """A micro-kernel intrinsic for ``R = tile_rows`` rows and ``panels`` panels of ``P = vectors * lanes`` columns.

    ``tile(c, c_off, ldc, a, a_off, lda, bp, bp_off, k, rows)`` computes
    ``C[r, 0:Q P] = sum_k A[r, k] * Bp[k, 0:Q P]`` for ``r < rows <= R`` on flat
    arrays (element offsets and row strides), where ``Bp`` is ``Q = panels``
    consecutive packed panels of ``k x P`` from ``bp_off``. Several panels
    give a single row more independent accumulators (a matrix-vector
    product is otherwise bound by the latency of its fused multiply-adds);
    each element's sum is the same whatever ``Q`` and ``R``. With ``accumulate`` each sum
    starts from ``C[r, 0:Q P]`` instead of zero (``C += A @ Bp``: one
    accumulator continued, the same bits as one product over the joined
    ``K``). Rows of ``A`` and ``C`` beyond ``rows`` are not read (the last
    row is read again in their place) and their results are not stored.
    ``lanes`` is ``lanes32`` for float32 and half that for float64.
    """

    @intrinsic
    def tile(typingctx, c, c_off, ldc, a, a_off, lda, bp, bp_off, k, rows):
        if not (isinstance(c, types.Array) and c.dtype in (types.float32, types.float64) and a.dtype == c.dtype
                and bp.dtype == c.dtype):
            return None
        intp = types.intp
        sig = types.void(c, intp, intp, a, intp, intp, bp, intp, intp, intp)
        is32 = c.dtype == types.float32
        lanes = lanes32 if is32 else lanes32 // 2

        def codegen(context, builder, signature, args):
            c_v, c_off_v, ldc_v, a_v, a_off_v, lda_v, bp_v, bp_off_v, k_v, rows_v = args
            ft = ir.FloatType() if is32 else ir.DoubleType()
            vt = ir.VectorType(ft, lanes)
            it = ldc_v.type
            cptr = builder.gep(context.make_array(signature.args[0])(context, builder, c_v).data, [c_off_v])
            aptr = builder.gep(context.make_array(signature.args[3])(context, builder, a_v).data, [a_off_v])
            bptr = builder.gep(context.make_array(signature.args[6])(context, builder, bp_v).data, [bp_off_v])
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                                                 f"llvm.fma.v{lanes}{'f32' if is32 else 'f64'}")
            zero = ir.Constant(vt, [ir.Constant(ft, 0.0)] * lanes)
            columns = panels * vectors  # accumulator vectors per row
            accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(columns)] for _ in range(tile_rows)]
            last = builder.sub(rows_v, ir.Constant(it, 1))
            arows = []
            for r in range(tile_rows):
                r_const = ir.Constant(it, r)
                r_eff = builder.select(builder.icmp_signed("<", r_const, rows_v), r_const, last)
                arows.append(builder.gep(aptr, [builder.mul(r_eff, lda_v)]))
                if accumulate:
                    crow = builder.gep(cptr, [builder.mul(r_eff, ldc_v)])
                    for v in range(columns):
                        src = builder.bitcast(builder.gep(crow, [ir.Constant(it, v * lanes)]), vt.as_pointer())
                        load = builder.load(src)
                        load.align = 4 if is32 else 8
                        builder.store(load, accs[r][v])
            splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
            width = ir.Constant(it, lanes * vectors)
            panel_size = builder.mul(k_v, width)
            with cgutils.for_range(builder, k_v) as loop:
                p = loop.index
                bvecs = []
                for q in range(panels):
                    row = builder.gep(bptr, [builder.add(builder.mul(ir.Constant(it, q), panel_size),
                                                         builder.mul(p, width))])
                    for v in range(vectors):
                        src = builder.bitcast(builder.gep(row, [ir.Constant(it, v * lanes)]), vt.as_pointer())
                        load = builder.load(src)
                        load.align = 4 if is32 else 8
                        bvecs.append(load)
                for r in range(tile_rows):
                    s = builder.load(builder.gep(arows[r], [p]))
                    sv = builder.insert_element(ir.Constant(vt, ir.Undefined), s, ir.Constant(ir.IntType(32), 0))
                    sv = builder.shuffle_vector(sv, ir.Constant(vt, ir.Undefined), splat_mask)
                    for v in range(columns):
                        builder.store(builder.call(fma, [sv, bvecs[v], builder.load(accs[r][v])]), accs[r][v])
            for r in range(tile_rows):
                with builder.if_then(builder.icmp_signed("<", ir.Constant(it, r), rows_v)):
                    crow = builder.gep(cptr, [builder.mul(ir.Constant(it, r), ldc_v)])
                    for v in range(columns):
                        dst = builder.bitcast(builder.gep(crow, [ir.Constant(it, v * lanes)]), vt.as_pointer())
                        store = builder.store(builder.load(accs[r][v]), dst)
                        store.align = 4 if is32 else 8
            return context.get_dummy_value()

        return sig, codegen

    return tile


_tile = make_tile(_LANES32, TILE_ROWS, _VECTORS)
_tile_add = make_tile(_LANES32, TILE_ROWS, _VECTORS, accumulate=True)
# One row, two panels at a time: a matrix-vector product (batch 1) with one
# panel keeps only ``V`` sums in flight, and waits on each fused
# multiply-add's latency (0.7x the time with two at K = 1024 here).
_ROW_PANELS = 2
_row = make_tile(_LANES32, 1, _VECTORS, panels=_ROW_PANELS)
_row_add = make_tile(_LANES32, 1, _VECTORS, accumulate=True, panels=_ROW_PANELS)
# A tile costs its ``R`` rows however few it stores: the rows after the last
# whole tile, when fewer than ``R / 2``, run one at a time on the row kernel
# instead (1.8x a tile row's time each, against ``R`` rows for the tile), and
# the steps of a call with lengths compute only the rows still running
# (``B = 25`` took the time of ``B = 32``). No other tile: the kernels that
# call this one compile its tiles into their own code (a first call of the ops
# took 0.2 s longer with two more).
_SINGLE_ROWS = TILE_ROWS // 2


@njit(**CALLEE)
def gemm_panels(a, a_off, lda, rows, bp, bp_off, k, panels, c, c_off, ldc, accumulate=False):
    """``C = A @ Bp`` (``C += A @ Bp`` with ``accumulate``) on flat arrays:
    ``A`` is ``rows x k`` (row stride ``lda`` from ``a_off``), ``Bp`` is
    ``panels`` packed panels ``[k, P]`` from ``bp_off``, ``C`` is
    ``rows x panels * P`` (row stride ``ldc`` from ``c_off``). Each panel is
    used for every row tile while it is in L1. Accumulating continues each
    element's accumulator from ``C``: the bits of one product over the
    joined ``K``."""
    width = panel_width_of(c)
    left = rows % TILE_ROWS
    tiled = rows if left >= _SINGLE_ROWS else rows - left  # rows on tiles; the others one at a time
    paired = panels - panels % _ROW_PANELS
    for r in range(tiled, rows):  # two panels at a time
        for q in range(0, paired, _ROW_PANELS):
            if accumulate:
                _row_add(c, c_off + r * ldc + q * width, ldc, a, a_off + r * lda, lda, bp, bp_off + q * k * width, k,
                         1)
            else:
                _row(c, c_off + r * ldc + q * width, ldc, a, a_off + r * lda, lda, bp, bp_off + q * k * width, k, 1)
    for q in range(panels):
        end = rows if q >= paired else tiled  # the odd panel of the single rows on the tiles
        for r0 in range(0, end, TILE_ROWS):
            n = min(TILE_ROWS, end - r0)
            if accumulate:
                _tile_add(c, c_off + r0 * ldc + q * width, ldc, a, a_off + r0 * lda, lda, bp, bp_off + q * k * width, k,
                          n)
            else:
                _tile(c, c_off + r0 * ldc + q * width, ldc, a, a_off + r0 * lda, lda, bp, bp_off + q * k * width, k, n)


@njit(inline="always")
def panel_width_of(array):
    """:func:`panel_width` of ``array``'s dtype, in jitted code."""
    if array.itemsize == 4:
        return _LANES32 * _VECTORS
    return (_LANES32 // 2) * _VECTORS


# Packing: columns of a row-major matrix, or rows of one (transposed), copied
# as runs of up to P contiguous elements into the panels; the inner loops are
# plain copies that vectorize (a gather through an index array ran at about
# 3.5 GB/s here).
@njit(inline="always")
def _panel_run(j, n, depth, dst_off, width):
    """The columns from ``j`` that lie in one panel, at most ``n``: ``(count,
    index in dst of the first one's top element)``, panels ``[depth, width]``
    from ``dst_off``."""
    q = j // width
    lane = j - q * width
    return min(width - lane, n), dst_off + q * depth * width + lane


@njit(**CALLEE)
def pack_columns(src, col0, n, dst, dst_off, j0, width):
    """Columns ``col0 .. col0 + n - 1`` of ``src: [K, N]`` (C-contiguous) as
    columns ``j0 .. j0 + n - 1`` of the panels ``[K, width]`` at ``dst[dst_off:]``."""
    depth = src.shape[0]
    u = 0
    while u < n:
        m, base = _panel_run(j0 + u, n - u, depth, dst_off, width)
        for r in range(depth):
            row = src[r, col0 + u:col0 + u + m]
            out = dst[base + r * width:base + r * width + m]
            for v in range(m):
                out[v] = row[v]
        u += m


@njit(**CALLEE)
def pack_rows(src, row0, n, dst, dst_off, j0, width):
    """Rows ``row0 .. row0 + n - 1`` of ``src: [N, K]`` (C-contiguous) as
    columns ``j0 .. j0 + n - 1`` of the panels ``[K, width]`` at
    ``dst[dst_off:]``: the panels of ``src[row0:row0 + n].T``."""
    depth = src.shape[1]
    u = 0
    while u < n:
        m, base = _panel_run(j0 + u, n - u, depth, dst_off, width)
        for k0 in range(0, depth, _PACK_BLOCK):  # a block of panel rows stays in L1
            k1 = min(k0 + _PACK_BLOCK, depth)
            block = src[row0 + u:row0 + u + m, k0:k1]
            for k in range(k1 - k0):
                out = dst[base + (k0 + k) * width:base + (k0 + k) * width + m]
                for v in range(m):
                    out[v] = block[v, k]
        u += m


@njit(**CALLEE)
def zero_columns(dst, dst_off, depth, j0, width):
    """Zero columns ``j0 ..`` up to the end of their panel, of the panels ``[depth, width]`` at ``dst[dst_off:]``."""
    if j0 % width:
        q = j0 // width
        base = dst_off + q * depth * width
        for r in range(depth):
            fill_zero(dst, base + r * width + j0 - q * width, width - (j0 - q * width))
