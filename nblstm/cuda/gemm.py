"""The tiled shared-memory GEMM of the CUDA target: ``c = op(a) @ op(b) [+ bias] [+ c]``.

Used for the input projection of all steps and the gradients after the
backward loop. Its shared and local arrays take the dtype of ``c`` (one
kernel, specialised on its argument types); tile sizes are those of
:mod:`nblstm.cuda.config`.
"""

from numba import cuda

from .config import GEMM_BK, GEMM_BM, GEMM_BN, GEMM_RM, GEMM_RN, GEMM_TX, GEMM_TY
from .registry import A1, A2, BOOL, kernel

__all__ = ["gemm"]

_GEMM_THREADS = GEMM_TX * GEMM_TY


@cuda.jit(device=True)
def load_k_tile(src, dst, k_major, k0, x0, k_total, x_total, tid, zero):
    """``dst[kk, xx] = op(src)[k0 + kk, x0 + xx]`` (zero outside ``op(src)``), by all ``GEMM_TX * GEMM_TY`` threads.

    ``op(src)`` is ``src: [K, X]`` when ``k_major``, ``src.T`` of ``src: [X, K]``
    otherwise. Consecutive threads walk the stored array's contiguous
    axis (coalesced global reads).
    """
    bk, bx = dst.shape
    for e in range(tid, bk * bx, _GEMM_THREADS):
        if k_major:
            kk = e // bx
            xx = e % bx
        else:
            xx = e // bk
            kk = e % bk
        if x0 + xx < x_total and k0 + kk < k_total:
            dst[kk, xx] = src[k0 + kk, x0 + xx] if k_major else src[x0 + xx, k0 + kk]
        else:
            dst[kk, xx] = zero


@kernel("common")
def gemm(a: A2, b: A2, c: A2, bias: A1, trans_a: BOOL, trans_b: BOOL, accumulate: BOOL, use_bias: BOOL):
    """``c = op(a) @ op(b) [+ bias] [+ c]``, tiled in shared memory.

    Parameters
    ----------
    a : [M, K] array, or [K, M] when ``trans_a``
    b : [K, N] array, or [N, K] when ``trans_b``
    c : [M, N] array
        Output (read too when ``accumulate``).
    bias : [N] array
        Added when ``use_bias`` (any array otherwise).
    trans_a, trans_b, accumulate, use_bias : bool

    Launch with ``(ceil(N / GEMM_BN), min(ceil(M / GEMM_BM), 65535))`` blocks of
    ``(GEMM_TX, GEMM_TY)`` threads (blocks stride over the M tiles); each thread
    owns an ``RM x RN`` micro-tile, strided by ``TY`` rows and ``TX``
    columns so that neighbouring threads read neighbouring shared-memory
    words.
    """
    m_total, n_total = c.shape
    k_total = a.shape[0] if trans_a else a.shape[1]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tid = ty * GEMM_TX + tx
    n0 = cuda.blockIdx.x * GEMM_BN
    a_s = cuda.shared.array((GEMM_BK, GEMM_BM), c.dtype)
    b_s = cuda.shared.array((GEMM_BK, GEMM_BN), c.dtype)
    acc = cuda.local.array((GEMM_RM, GEMM_RN), c.dtype)
    zero = c.dtype.type(0.0)
    # Blocks stride over the M tiles: gridDim.y is at most 65535 (M = S * B rows can need more tiles).
    for m0 in range(cuda.blockIdx.y * GEMM_BM, m_total, cuda.gridDim.y * GEMM_BM):
        for r in range(GEMM_RM):
            for s in range(GEMM_RN):
                acc[r, s] = zero
        for k0 in range(0, k_total, GEMM_BK):
            load_k_tile(a, a_s, trans_a, k0, m0, k_total, m_total, tid, zero)
            load_k_tile(b, b_s, not trans_b, k0, n0, k_total, n_total, tid, zero)
            cuda.syncthreads()
            for kk in range(GEMM_BK):
                for r in range(GEMM_RM):
                    av = a_s[kk, ty + r * GEMM_TY]
                    for s in range(GEMM_RN):
                        acc[r, s] += av * b_s[kk, tx + s * GEMM_TX]
            cuda.syncthreads()
        for r in range(GEMM_RM):
            m = m0 + ty + r * GEMM_TY
            if m < m_total:
                for s in range(GEMM_RN):
                    n = n0 + tx + s * GEMM_TX
                    if n < n_total:
                        value = acc[r, s]
                        if use_bias:
                            value += bias[n]
                        if accumulate:
                            value += c[m, n]
                        c[m, n] = value
