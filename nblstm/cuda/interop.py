"""Arrays, devices and streams: how the CUDA target reads the caller's GPU arrays and returns its own.

Anything with ``__cuda_array_interface__`` (Numba device arrays, CuPy arrays,
PyTorch CUDA tensors) is viewed as a Numba device array without a copy
(:func:`as_device`); results go back in the caller's kind
(:func:`wrap_like`). In the simulator, "device" memory is host memory.
"""

import contextlib
import functools
import sys

import numpy as np
from numba import cuda

from .config import SIMULATOR

__all__ = ["as_device", "check_same_device", "context_cache", "device_ordinal", "gpu_count", "on_device",
           "require_gpu", "resolve_stream", "storage_dtype", "stream_handle", "wrap_like"]


class _HostView:
    """Exposes a ``__cuda_array_interface__`` as ``__array_interface__``.

    Only for the simulator, where "device" memory is host memory: it lets a
    foreign object's data be viewed by NumPy without a copy.
    """

    def __init__(self, cai, owner):
        self.__array_interface__ = {
            "shape": tuple(cai["shape"]),
            "typestr": cai["typestr"],
            "data": (cai["data"][0], False),
            "strides": cai.get("strides"),
            "version": 3,
        }
        self._owner = owner


_GPU_USABLE = False


def require_gpu():
    global _GPU_USABLE
    if _GPU_USABLE:
        return
    if not cuda.is_available():
        raise RuntimeError(
            "GPU arrays (objects with __cuda_array_interface__) were given, but CUDA is not usable here: "
            "numba.cuda.is_available() is False (no NVIDIA GPU, no driver, or no NVVM). Pass NumPy arrays to "
            "run on the CPU."
        )
    _GPU_USABLE = True


@functools.cache
def gpu_count():
    """Number of GPUs this process sees (enumerated once)."""
    try:
        return len(cuda.gpus)
    except Exception:  # noqa: BLE001 - no device list: treat as one GPU
        return 1


def device_ordinal(value):
    """The ordinal of the GPU that holds ``value``'s data, or ``None`` if unknown (empty, simulator, one GPU)."""
    if SIMULATOR or gpu_count() <= 1:
        return None
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is None or not cai["data"][0]:
        return None
    try:
        from cuda.bindings import driver as binding
        from numba.cuda.cudadrv.driver import driver

        attr = binding.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        return int(driver.cuPointerGetAttribute(attr, binding.CUdeviceptr(cai["data"][0])))
    except Exception:  # noqa: BLE001 - an unknown device only skips the check
        return None


def check_same_device(named):
    """Raise ``TypeError`` naming the arguments when the arrays are on different GPUs.

    Parameters
    ----------
    named : dict
        ``{name: array or None}``.

    Returns
    -------
    int or None
        The common device ordinal (``None`` when unknown).
    """
    by_device = {}
    for name, value in named.items():
        if value is not None:
            ordinal = device_ordinal(value)
            if ordinal is not None:
                by_device.setdefault(ordinal, []).append(name)
    if len(by_device) > 1:
        where = "; ".join(f"GPU {d}: {', '.join(names)}" for d, names in sorted(by_device.items()))
        raise TypeError(f"arrays must all be on one GPU; {where}")
    return next(iter(by_device), None)


@contextlib.contextmanager
def on_device(ordinal):
    """Make the GPU that holds the arrays the current one for the call."""
    if SIMULATOR or ordinal is None or cuda.get_current_device().id == ordinal:
        yield
    else:
        with cuda.gpus[ordinal]:
            yield


def stream_handle(stream):
    """The raw handle of a Numba stream (0 for the default stream), or ``None`` if it has none."""
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "handle", None)
    if handle is None:
        return None
    try:
        return int(handle)
    except (TypeError, ValueError):
        return None


def as_device(value, stream=0):
    """``value`` as a Numba device array (simulator array in the simulator), without a copy.

    A foreign array's producer stream (``"stream"`` of its interface) is
    synchronised only when it is not the launch stream ``stream`` (work on
    one stream is ordered already).
    """
    if value is None or getattr(value, "__cuda_ndarray__", False):
        return value
    cai = value.__cuda_array_interface__
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(np.asarray(_HostView(cai, value)))
    producer = cai.get("stream")
    handle = stream_handle(stream)
    # 1 and 2 are the legacy and per-thread default streams, ordered with the default stream 0.
    same = producer is None or producer == handle or (handle == 0 and producer in (1, 2))
    return cuda.from_cuda_array_interface(cai, owner=value, sync=not same)


@functools.lru_cache(maxsize=64)
def _external_stream(handle):
    """A Numba stream for a foreign stream handle (one object per handle)."""
    return cuda.external_stream(handle)


def resolve_stream(stream, like):
    """The Numba stream to launch on.

    ``stream`` may be a Numba stream, ``0``, a CuPy or PyTorch stream (their
    handle is wrapped with ``cuda.external_stream``), or a raw handle. With
    ``None``, the current stream of CuPy or PyTorch when ``like`` is one of
    their arrays (so the work is ordered with theirs), else the default stream.
    """
    if stream is None:
        module = type(like).__module__.split(".")[0]
        if SIMULATOR or module not in ("cupy", "torch"):
            return 0
        if module == "cupy":
            stream = sys.modules["cupy"].cuda.get_current_stream()
        else:
            stream = sys.modules["torch"].cuda.current_stream(like.device)
    if SIMULATOR or stream == 0:
        return stream
    for attribute in ("cuda_stream", "ptr"):  # PyTorch, CuPy
        handle = getattr(stream, attribute, None)
        if isinstance(handle, int):
            return _external_stream(handle) if handle else 0
    if isinstance(stream, int):
        return _external_stream(stream)
    return stream


def wrap_like(like, ordinal):
    """A function returning a result array in the kind of ``like`` (CuPy, PyTorch or Numba)."""
    module = type(like).__module__.split(".")[0]
    if not SIMULATOR and module == "cupy":
        return sys.modules["cupy"].asarray
    if not SIMULATOR and module == "torch":
        torch = sys.modules["torch"]
        device = like.device if ordinal is None else torch.device("cuda", ordinal)
        return lambda a: torch.as_tensor(a, device=device)
    return lambda a: a


def storage_dtype(value):
    """The dtype of a GPU array, read without converting it."""
    if getattr(value, "__cuda_ndarray__", False):
        return np.dtype(value.dtype)
    return np.dtype(value.__cuda_array_interface__["typestr"])


def context_cache():
    """Numba's cache of the current CUDA context, held for a whole call.

    Numba looks the current context up (two driver calls) on every
    allocation, launch and array conversion unless an outer
    ``driver.get_active_context()`` block caches it; one block around the
    call replaces about 30 lookups of a forward by one.
    """
    if SIMULATOR:
        return contextlib.nullcontext()
    try:
        from numba.cuda.cudadrv.driver import driver

        return driver.get_active_context()
    except Exception:  # noqa: BLE001 - other Numba internals: no cache
        return contextlib.nullcontext()
