"""The BLAS products the CPU kernels call from jitted code, one thread each.

``np.dot`` inside ``@njit`` calls SciPy's BLAS; :func:`gemm_tn` calls numba's
own BLAS entry point directly for ``a.T @ b`` with ``beta`` and any row
stride, which ``np.dot`` does not offer. Callers run inside
:class:`nblstm.cpu.blas.kernel_section` (BLAS on one thread).
"""

import numpy as np
from numba import njit, types

from .._jit import KERNEL

__all__ = ["gemm_rows", "gemm_tn"]


@njit(**KERNEL)
def gemm_rows(a, b, out, rows, r):
    """``out[rows] = a[rows] @ b`` for row block ``r`` (``rows``: boundaries)."""
    r0 = rows[r]
    r1 = rows[r + 1]
    if r1 > r0:
        if a.shape[1] == 0:
            out[r0:r1] = 0
        else:
            np.dot(a[r0:r1], b, out[r0:r1])


# numba's own BLAS entry point (what its np.dot calls): a GEMM on strided
# operands, with beta, so that w_grad's row blocks come from one product
# over all rows each, with no partial sums to add up.
_XXGEMM = types.ExternalFunction("numba_xxgemm", types.intc(
    types.char, types.char, types.char, types.intp, types.intp, types.intp, types.voidptr, types.voidptr, types.intp,
    types.voidptr, types.intp, types.voidptr, types.voidptr, types.intp))


@njit(inline="always")
def _leading_dimension(a):
    """BLAS's leading dimension of the row-major ``a`` (unit column stride): its row
    stride in elements. NumPy does not normalise the row stride of a one-row
    array (``h.T`` of an ``[H, 1]`` array has strides ``(8, 8)``, a broadcast
    row ``(0, 8)``), and BLAS rejects one below the row length."""
    if a.shape[0] == 1:
        return max(a.shape[1], 1)
    return max(a.strides[0] // a.itemsize, a.shape[1], 1)


@njit(**KERNEL)
def gemm_tn(a, b, c, accumulate):
    """``c = a.T @ b`` (``c += a.T @ b`` with ``accumulate``): ``a: [K, M]``,
    ``b: [K, N]``, ``c: [M, N]``, row-major, each with unit column stride
    (any row stride: ``a`` may be a column block of a larger array)."""
    k, m = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:
        if not accumulate:
            c[:] = 0
        return
    item = c.itemsize
    scalars = np.empty(2, c.dtype)  # alpha, beta (np.empty only: each allocator is another compile)
    scalars[0] = 1
    scalars[1] = 1 if accumulate else 0
    alpha, beta = scalars[:1], scalars[1:]
    kind = np.int8(115) if item == 4 else np.int8(100)  # 's' or 'd'
    # Column-major BLAS sees each row-major array transposed: c^T = b^T @ a.
    _XXGEMM(kind, np.int8(78), np.int8(84), n, m, k, alpha.ctypes, b.ctypes, _leading_dimension(b), a.ctypes,
            _leading_dimension(a), beta.ctypes, c.ctypes, _leading_dimension(c))
