"""The BLAS products the CPU kernels call from jitted code, one thread each, on addresses.

:func:`gemm` and :func:`dot` call numba's own BLAS entry points (what its
``np.dot`` calls: SciPy's ``sgemm``, ``sgemv``, ``sdot`` and their float64
twins) on operands given by their addresses and leading dimensions, so that
one compiled function (:func:`_product`, ten integers and three addresses)
serves every product of the fused ops, the cell and the step, whatever the
layouts, dtypes and slices of the arrays around it. ``np.dot`` on array
slices compiled numba's product machinery again for each combination of
array types, and ``a.T @ b`` with ``beta`` had a helper of its own
(:ref:`design-compile`). :func:`dot` passes BLAS the arguments ``np.dot``
passed for the same product, so the results are bitwise the same.

Callers run inside :class:`nblstm.cpu.blas.kernel_section` (BLAS on one thread).
"""

import numpy as np
from numba import njit, types

from .._jit import CALLEE
from .views import fill_zero, flat

__all__ = ["address", "dot", "gemm", "rows_product"]

# numba's BLAS entry points (what its np.dot calls), their pointers declared as
# integers (the same registers on every ABI numba supports).
_intp, _char = types.intp, types.char
#: kind, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc
_XXGEMM = types.ExternalFunction("numba_xxgemm", types.intc(_char, _char, _char, *[_intp] * 11))
#: kind, trans, m, n, alpha, a, lda, x, beta, y
_XXGEMV = types.ExternalFunction("numba_xxgemv", types.intc(_char, _char, *[_intp] * 8))
#: kind, conjugate, n, x, y, result
_XXDOT = types.ExternalFunction("numba_xxdot", types.intc(_char, _char, *[_intp] * 4))
# alpha = 1 and beta = 1 or 0, read by BLAS through their addresses.
_SCALARS32 = np.array([1.0, 0.0], np.float32)
_SCALARS64 = np.array([1.0, 0.0], np.float64)
_N, _T = np.int8(78), np.int8(84)


@njit(inline="always")
def address(array, offset):
    """The address (int64) of element ``offset`` (counted in elements) of ``array``'s data."""
    return np.int64(array.ctypes.data) + np.int64(offset) * np.int64(array.itemsize)


@njit(inline="always")
def gemm(dims, a, b, c):
    """``c = op(a) @ op(b)`` (``c += ...`` with ``accumulate``) on row-major operands at addresses ``a, b, c``,
    one BLAS GEMM.

    ``dims`` is ``(m, n, k, lda, ldb, ldc, trans_a, trans_b, accumulate,
    itemsize)``, all integers: ``c`` is ``[m, n]`` with row stride ``ldc``;
    ``op(a)`` is ``[m, k]``, stored as ``[m, k]`` with row stride ``lda``, or
    as ``[k, m]`` with ``trans_a``; ``op(b)`` is ``[k, n]``, stored as
    ``[k, n]`` with row stride ``ldb``, or as ``[n, k]`` with ``trans_b``;
    ``itemsize`` is 4 (float32) or 8 (float64). With ``k = 0``, ``c`` is left
    as it is (callers write the zeros an empty sum gives).

    Inlined into the caller, where it makes every integer an ``int64``, so
    that :func:`_product` compiles once, whatever types and literals the
    caller's integers have.
    """
    i = np.int64
    m, n, k, lda, ldb, ldc, trans_a, trans_b, accumulate, itemsize = dims
    _product((i(m), i(n), i(k), i(lda), i(ldb), i(ldc), i(trans_a), i(trans_b), i(accumulate), i(itemsize), i(0)),
             i(a), i(b), i(c))


@njit(inline="always")
def dot(dims, a, b, c):
    """``c = a @ op(b)`` as numba's ``np.dot(a, b, c)`` computes it: a GEMM, or
    where ``a`` or ``op(b)`` is a vector (``m = 1`` or ``n = 1``) a GEMV, or
    for two vectors a DOT, which round otherwise.

    ``dims`` is ``(m, n, k, lda, ldb, ldc, trans_b, itemsize)``, as
    :func:`gemm`'s (``a`` not transposed, no accumulation).
    """
    i = np.int64
    m, n, k, lda, ldb, ldc, trans_b, itemsize = dims
    _product((i(m), i(n), i(k), i(lda), i(ldb), i(ldc), i(0), i(trans_b), i(0), i(itemsize), i(1)), i(a), i(b),
             i(c))


@njit(inline="always")
def rows_product(a, b, out, r0, r1):
    """``out[r0:r1] = a[r0:r1] @ b`` as numba's ``np.dot`` computes it (:func:`dot`), for C-contiguous 2-D
    ``a [M, K]``, ``b [K, N]`` and ``out [M, N]``; an empty sum (``K = 0``) is zero."""
    k, n = b.shape
    if k == 0:
        fill_zero(flat(out), r0 * n, (r1 - r0) * n)
    dot((r1 - r0, n, k, k, n, n, 0, out.itemsize), address(a, r0 * k), address(b, 0), address(out, r0 * n))


@njit(**CALLEE)
def _product(dims, a, b, c):
    """:func:`gemm` (``as_dot = 0``) or :func:`dot` (``as_dot = 1``) on ``int64`` arguments:
    ``dims`` is ``(m, n, k, lda, ldb, ldc, trans_a, trans_b, accumulate, itemsize, as_dot)``."""
    m, n, k, lda, ldb, ldc, trans_a, trans_b, accumulate, itemsize, as_dot = dims
    if m == 0 or n == 0 or k == 0:
        return
    if itemsize == 4:
        kind = np.int8(115)  # 's'
        scalars = np.int64(_SCALARS32.ctypes.data)
    else:
        kind = np.int8(100)  # 'd'
        scalars = np.int64(_SCALARS64.ctypes.data)
    beta = scalars if accumulate else scalars + itemsize
    if as_dot and n == 1 and m == 1:
        _XXDOT(kind, np.int8(0), k, a, b, c)
    elif as_dot and n == 1:  # matrix @ vector
        _XXGEMV(kind, _T, k, m, scalars, a, max(lda, 1), b, beta, c)
    elif as_dot and m == 1:  # vector @ matrix
        if trans_b:
            _XXGEMV(kind, _T, k, n, scalars, b, max(ldb, 1), a, beta, c)
        else:
            _XXGEMV(kind, _N, n, k, scalars, b, max(ldb, 1), a, beta, c)
    else:  # column-major BLAS sees each row-major operand transposed: c^T = op(b)^T @ op(a)^T
        _XXGEMM(kind, _T if trans_b else _N, _T if trans_a else _N, n, m, k, scalars, b, max(ldb, 1), a,
                max(lda, 1), beta, c, max(ldc, 1))
