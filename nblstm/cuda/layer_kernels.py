"""Kernels of the layers' glue on the GPU: layouts, step order, the directions' columns, sums and products.

Grid-stride loops over the elements of their ``[N0, N1, N2]`` C-contiguous
output, each element written by one thread (:mod:`nblstm.arrays`
launches them).
"""

from numba import cuda

from .registry import A3, I64, kernel

__all__ = ["add3", "flip0", "mul3", "place_columns", "swap01", "take_columns"]


@kernel("cell")
def swap01(src: A3, dst: A3):
    """``dst[i, j, n] = src[j, i, n]``; ``src: [N1, N0, N2]``, ``dst: [N0, N1, N2]``."""
    n0, n1, n2 = dst.shape
    for k in range(cuda.grid(1), n0 * n1 * n2, cuda.gridsize(1)):
        i = k // (n1 * n2)
        r = k % (n1 * n2)
        dst[i, r // n2, r % n2] = src[r // n2, i, r % n2]


@kernel("cell")
def flip0(src: A3, dst: A3):
    """``dst[t] = src[N0 - 1 - t]``: steps in processing order (Keras's ``go_backwards``) and back."""
    n0, n1, n2 = dst.shape
    for k in range(cuda.grid(1), n0 * n1 * n2, cuda.gridsize(1)):
        i = k // (n1 * n2)
        r = k % (n1 * n2)
        dst[i, r // n2, r % n2] = src[n0 - 1 - i, r // n2, r % n2]


@kernel("cell")
def place_columns(src: A3, dst: A3, col0: I64):
    """``dst[t, b, col0 + n] = src[t, b, n]``: one direction's outputs into the layer's columns."""
    n0, n1, n2 = src.shape
    for k in range(cuda.grid(1), n0 * n1 * n2, cuda.gridsize(1)):
        t = k // (n1 * n2)
        r = k % (n1 * n2)
        dst[t, r // n2, col0 + r % n2] = src[t, r // n2, r % n2]


@kernel("cell")
def take_columns(src: A3, col0: I64, dst: A3):
    """``dst[t, b, n] = src[t, b, col0 + n]``: one direction's columns of the layer's gradient."""
    n0, n1, n2 = dst.shape
    for k in range(cuda.grid(1), n0 * n1 * n2, cuda.gridsize(1)):
        t = k // (n1 * n2)
        r = k % (n1 * n2)
        dst[t, r // n2, r % n2] = src[t, r // n2, col0 + r % n2]


@kernel("cell")
def add3(a: A3, b: A3, out: A3):
    """``out = a + b`` (the input gradients of two directions)."""
    n0, n1, n2 = out.shape
    for k in range(cuda.grid(1), n0 * n1 * n2, cuda.gridsize(1)):
        i = k // (n1 * n2)
        r = k % (n1 * n2)
        out[i, r // n2, r % n2] = a[i, r // n2, r % n2] + b[i, r // n2, r % n2]


@kernel("cell")
def mul3(a: A3, b: A3, out: A3):
    """``out = a * b`` (dropout: the outputs times the scaled keep mask)."""
    n0, n1, n2 = out.shape
    for k in range(cuda.grid(1), n0 * n1 * n2, cuda.gridsize(1)):
        i = k // (n1 * n2)
        r = k % (n1 * n2)
        out[i, r // n2, r % n2] = a[i, r // n2, r % n2] * b[i, r // n2, r % n2]
