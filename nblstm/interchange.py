"""Arrays of any library in, the same kind out: DLPack and ``__cuda_array_interface__`` at the public boundary.

The kernels read NumPy arrays on the host and ``__cuda_array_interface__``
arrays on a GPU. The public functions and methods (the ops, the cell, the
layers) are wrapped with :func:`accepts_any_array`: an argument of another
library is turned into one of those without a copy, and the results go back
into that library:

- host arrays with ``__dlpack__`` (PyTorch CPU tensors, JAX CPU arrays, ...)
  are viewed as NumPy arrays (``numpy.from_dlpack``); NumPy results are
  handed back through the library's ``from_dlpack`` (no copy for PyTorch);
- GPU arrays with ``__cuda_array_interface__`` (CuPy, PyTorch CUDA tensors)
  are read in place by the CUDA target; Numba device results are wrapped as
  the caller's kind (``cupy.asarray``, ``torch.as_tensor``: no copy).

A call with NumPy or Numba arrays only pays one scan of its arguments.
Weight gradients of a GPU call stay NumPy arrays (the weights live on the
host). Importing this module imports no array library.
"""

import functools
import sys

import numpy as np

__all__ = ["accepts_any_array", "foreign_array"]

# DLPack device types (dlpack.h): CPU, CUDA host-pinned memory.
_DLPACK_HOST = (1, 3)


def _root(value):
    return type(value).__module__.split(".")[0]


def foreign_array(value):
    """Whether ``value`` is an array of another library than NumPy and Numba (converted at the boundary)."""
    if isinstance(value, np.ndarray) or value is None or isinstance(value, (int, float, str, bool)):
        return False
    if _root(value) == "numba":
        return False
    return hasattr(value, "__dlpack__") or hasattr(value, "__cuda_array_interface__")


def _find(values):
    """The first foreign array among ``values`` (one level into tuples, lists and dicts), or ``None``."""
    for value in values:
        if isinstance(value, (tuple, list, dict)):
            for item in (value.values() if isinstance(value, dict) else value):
                if foreign_array(item):
                    return item
        elif foreign_array(value):
            return value
    return None


class _Converter:
    """Turns foreign arguments into kernel arrays and results back into the library of ``like``."""

    def __init__(self, like):
        self.module = sys.modules.get(_root(like))
        self.on_gpu = hasattr(like, "__cuda_array_interface__")
        self.like = like

    def argument(self, value):
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(self.argument(v) for v in value)
        if isinstance(value, tuple):  # a named tuple (a state)
            return type(value)(*(self.argument(v) for v in value))
        if isinstance(value, list):
            return [self.argument(v) for v in value]
        if isinstance(value, dict):
            return {k: self.argument(v) for k, v in value.items()}
        if not foreign_array(value) or hasattr(value, "__cuda_array_interface__"):
            return value  # GPU arrays are read in place by the CUDA target
        device = value.__dlpack_device__()[0] if hasattr(value, "__dlpack_device__") else 1
        if device not in _DLPACK_HOST:
            raise TypeError(f"a {type(value).__name__} on DLPack device type {device} has no "
                            "__cuda_array_interface__: pass a CuPy array or a PyTorch CUDA tensor, or a host array")
        if getattr(value, "requires_grad", False):
            raise TypeError(f"a {type(value).__name__} that requires grad was given: pass tensor.detach() "
                            "(nblstm.torch.LSTM runs nblstm inside autograd)")
        return np.from_dlpack(value)

    def _back(self, a):
        if self.on_gpu:
            if isinstance(a, np.ndarray) or not hasattr(a, "__cuda_array_interface__") and not hasattr(
                    a, "__cuda_ndarray__"):
                return a
            from .cuda.interop import wrap_like

            return wrap_like(self.like, None)(a)
        if not isinstance(a, np.ndarray):
            return a
        to_library = getattr(self.module, "from_dlpack", None)
        if to_library is None and self.module is not None:
            to_library = getattr(getattr(self.module, "numpy", None), "from_dlpack", None)
        return a if to_library is None else to_library(a if a.flags.writeable else a.copy())

    def result(self, value):
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            return type(value)(*(self.result(v) for v in value))
        if isinstance(value, tuple):
            return tuple(self.result(v) for v in value)
        if isinstance(value, list):
            return [self.result(v) for v in value]
        if isinstance(value, dict):
            return {k: self.result(v) for k, v in value.items()}
        if callable(value) and not hasattr(value, "__array_interface__") and not hasattr(value, "shape"):
            return self.function(value)
        return self._back(value)

    def function(self, func):
        @functools.wraps(func)
        def converted(*args, **kwargs):
            args = tuple(self.argument(a) for a in args)
            kwargs = {k: self.argument(v) for k, v in kwargs.items()}
            return self.result(func(*args, **kwargs))

        return converted


def accepts_any_array(func):
    """Wrap a public function or method: foreign array arguments in, results of their library out.

    Examples
    --------
    >>> import numpy as np
    >>> @accepts_any_array
    ... def double(a):
    ...     return 2 * a
    >>> double(np.ones(2))                                       # NumPy: unchanged
    array([2., 2.])
    """

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        like = _find(args) if not kwargs else _find((*args, *kwargs.values()))
        if like is None:
            return func(*args, **kwargs)
        convert = _Converter(like)
        args = tuple(convert.argument(a) for a in args)
        kwargs = {k: convert.argument(v) for k, v in kwargs.items()}
        return convert.result(func(*args, **kwargs))

    return wrapper
