"""The one list of the CUDA target's kernels, and their signatures for compile-only checks.

Every kernel is declared with :func:`kernel` instead of ``@cuda.jit``: it is
the same lazy ``cuda.jit`` dispatcher (nothing compiles at import), recorded
here with its family. Its parameters are annotated with the kind of value
each one is launched with (numba does not read annotations), so that the
argument list is written once, in the kernel's own ``def``, and
:func:`signatures` derives the types the kernel compiles for in each dtype
(``numba.cuda.compile_ptx``: the PTX checks run with no GPU). Kinds:

:data:`A1` .. :data:`A4`
    C-contiguous array of the compute dtype, of that rank.
:data:`ANY1` .. :data:`ANY3`
    Array of the compute dtype, any layout (the source of a copy).
:data:`SCALAR`
    Scalar of the compute dtype.
:data:`I64`, :data:`BOOL`
    ``int64``, ``bool``.
:data:`LENGTHS`
    C-contiguous ``[B]`` int64 array.
:data:`INDEX`
    C-contiguous ``[T, B]`` int64 array (the maps of :mod:`nblstm.schedule`).

Kernels that also run on float16 storage arrays (``storage=True``: the
dtype casts and the fill) get float16 signatures too: a copy from float16
(any layout) to float32 and back, and the fill in float16.
"""

import inspect

import numpy as np
from numba import cuda, types

__all__ = ["A1", "A2", "A3", "A4", "ANY1", "ANY2", "ANY3", "BOOL", "I64", "INDEX", "KERNELS", "LENGTHS", "SCALAR",
           "kernel", "signatures"]

# The kinds of kernel parameters (annotations of the kernels' parameters).
A1, A2, A3, A4 = "a1", "a2", "a3", "a4"
ANY1, ANY2, ANY3 = "any1", "any2", "any3"
SCALAR, I64, BOOL, LENGTHS, INDEX = "s", "i64", "b", "lengths", "index"

#: ``[(family, dispatcher, storage)]`` of every kernel, in declaration order.
KERNELS = []


def kernel(family, storage=False):
    """Declare a kernel of ``family`` (``"common"``, ``"fused"`` or ``"cell"``): ``@kernel("fused")``."""

    def declare(func):
        dispatcher = cuda.jit(func)
        KERNELS.append((family, dispatcher, storage))
        return dispatcher

    return declare


_NUMBA_TYPES = {np.dtype(np.float16): types.float16, np.dtype(np.float32): types.float32,
                np.dtype(np.float64): types.float64}


def _type(kind, nt):
    if kind == "s":
        return nt
    if kind == "i64":
        return types.int64
    if kind == "b":
        return types.boolean
    if kind == "lengths":
        return types.Array(types.int64, 1, "C")
    if kind == "index":
        return types.Array(types.int64, 2, "C")
    if kind.startswith("any"):
        return types.Array(nt, int(kind[3:]), "A")
    if kind[0] == "a":
        return types.Array(nt, int(kind[1:]), "C")
    raise ValueError(f"unknown parameter kind {kind!r}")


def _kinds(dispatcher):
    return [p.annotation for p in inspect.signature(dispatcher.py_func).parameters.values()]


def signatures(dtype, family=None):
    """``[(name, python function, argument types)]`` of the kernels of ``family`` (all when ``None``).

    Names are unique within a family (``forward_step`` is a kernel of ``"fused"`` and of ``"cell"``).

    For float32 and float64 every kernel; for float16 the storage casts
    (``copy1_f16_to_f32`` ...) and the fill.
    """
    from . import cell_kernels, elementwise, fused_kernels, gemm, layer_kernels, resident  # noqa: F401 - their kernels register on import

    nt = _NUMBA_TYPES[np.dtype(dtype)]
    found = []
    for fam, dispatcher, storage in KERNELS:
        if family is not None and fam != family:
            continue
        name = dispatcher.py_func.__name__
        kinds = _kinds(dispatcher)
        if nt != types.float16:
            found.append((name, dispatcher.py_func, tuple(_type(k, nt) for k in kinds)))
        elif storage and name.startswith("copy"):
            rank = int(kinds[0][3:])
            f32 = types.Array(types.float32, rank, "C")
            found.append((f"{name}_f16_to_f32", dispatcher.py_func, (types.Array(nt, rank, "A"), f32)))
            found.append((f"{name}_f32_to_f16", dispatcher.py_func, (f32, types.Array(nt, rank, "C"))))
        elif storage:
            found.append((name, dispatcher.py_func, tuple(_type(k, nt) for k in kinds)))
    return found
