"""The layers' and the cell's glue on either kind of array: NumPy on the host, small kernels on the GPU.

A layer runs its cells through the targets; between them it only moves
arrays: batch-major to time-major, the two directions' outputs into one
array and their gradients out of it, sums of input gradients, dropout.
Each function takes the ``kind`` of :func:`nblstm._validate.describe_array`
(``"host"`` or ``"device"``) and returns a new C-contiguous array of that
kind (a Numba device array on the GPU, launched on the default stream, as
the cell's kernels are). Importing this module imports neither numba nor CUDA.
"""

import numpy as np

from ._validate import to_device

__all__ = ["add", "columns", "concat_columns", "flip0", "multiply", "stack", "swap01", "to_kind"]

_THREADS = 256
_MAX_BLOCKS = 1024


def _launch(kernel, n, *args):
    if n:
        kernel[min((n + _THREADS - 1) // _THREADS, _MAX_BLOCKS), _THREADS](*args)


def _device(a):
    from .cuda.interop import as_device

    return as_device(a, 0)


def _empty(shape, dtype):
    from numba import cuda

    return cuda.device_array(shape, dtype)


def swap01(a, kind):
    """``a: [N0, N1, N] -> [N1, N0, N]`` (batch-major to time-major and back), a copy."""
    if kind == "host":
        return np.ascontiguousarray(np.swapaxes(a, 0, 1))
    from .cuda.layer_kernels import swap01 as kernel

    src = _device(a)
    if not src.is_c_contiguous():
        raise ValueError("GPU inputs of a batch-first layer must be C-contiguous")
    out = _empty((a.shape[1], a.shape[0], a.shape[2]), src.dtype)
    _launch(kernel, out.size, src, out)
    return out


def flip0(a, kind):
    """``a: [T, B, N]`` with its steps in the other order (``a[::-1]``), a copy."""
    if kind == "host":
        return np.ascontiguousarray(a[::-1])
    from .cuda.layer_kernels import flip0 as kernel

    src = _device(a)
    out = _empty(a.shape, src.dtype)
    _launch(kernel, out.size, src, out)
    return out


def concat_columns(parts, kind):
    """``[T, B, N_k]`` arrays side by side along the last axis (the directions' outputs)."""
    if kind == "host":
        return np.concatenate(parts, axis=2) if len(parts) > 1 else parts[0]
    if len(parts) == 1:
        return parts[0]
    from .cuda.layer_kernels import place_columns

    steps, batch = parts[0].shape[:2]
    out = _empty((steps, batch, sum(p.shape[2] for p in parts)), parts[0].dtype)
    col0 = 0
    for p in parts:
        _launch(place_columns, p.size, _device(p), out, col0)
        col0 += p.shape[2]
    return out


def columns(a, col0, width, kind):
    """``a[:, :, col0:col0 + width]`` as a C-contiguous array (one direction's gradient)."""
    if kind == "host":
        return np.ascontiguousarray(a[:, :, col0:col0 + width])
    if col0 == 0 and width == a.shape[2]:
        return a
    from .cuda.layer_kernels import take_columns

    out = _empty((a.shape[0], a.shape[1], width), a.dtype)
    _launch(take_columns, out.size, _device(a), col0, out)
    return out


def add(a, b, kind):
    """``a + b`` for two ``[T, B, N]`` arrays; ``None`` stands for zeros."""
    if a is None or b is None:
        return b if a is None else a
    if kind == "host":
        return a + b
    from .cuda.layer_kernels import add3

    out = _empty(a.shape, a.dtype)
    _launch(add3, out.size, _device(a), _device(b), out)
    return out


def multiply(a, factor, kind):
    """``a * factor`` for ``[T, B, N]`` arrays (``factor`` a host array, moved to ``a``'s kind)."""
    if kind == "host":
        return a * factor
    from .cuda.layer_kernels import mul3

    out = _empty(a.shape, a.dtype)
    _launch(mul3, out.size, _device(a), to_kind(np.ascontiguousarray(factor, a.dtype), kind), out)
    return out


def stack(parts, kind):
    """``[B, N]`` arrays stacked into ``[K, B, N]`` (the final states of the cells)."""
    if kind == "host":
        return np.stack(parts)
    out = _empty((len(parts), *parts[0].shape), parts[0].dtype)
    for k, p in enumerate(parts):
        out[k].copy_to_device(_device(p))
    return out


def to_kind(a, kind):
    """A host array on the GPU when ``kind == "device"`` (a copy), unchanged otherwise."""
    return a if kind == "host" else to_device(a)
