"""Every kernel of the CUDA target with the types it compiles for, for compile-only checks (PTX).

Importing this module imports every kernel module, so that each kernel has
registered itself in :data:`nblstm.cuda.registry.KERNELS`; the registry
itself imports none of them (they import it). :func:`signatures` derives the
argument types from each kernel's annotated parameters
(``numba.cuda.compile_ptx`` runs with no GPU).
"""

import inspect

import numpy as np
from numba import types

from . import cell_kernels, elementwise, fused_kernels, gemm, layer_kernels, resident  # noqa: F401 - they register
from .registry import KERNELS, Record

__all__ = ["signatures"]

_NUMBA_TYPES = {np.dtype(np.float16): types.float16, np.dtype(np.float32): types.float32,
                np.dtype(np.float64): types.float64}


def _type(kind, nt):
    if isinstance(kind, Record):
        return types.BaseTuple.from_types([_type(k, nt) for k in kind.field_kinds()], kind.cls)
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
