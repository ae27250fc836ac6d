"""The choice of target from the kind of arrays given.

A target runs validated calls on one kind of memory: :mod:`nblstm.cpu` on
NumPy arrays, :mod:`nblstm.cuda` on arrays that live on a GPU. Both
implement the contract of :mod:`nblstm._contract`; :mod:`nblstm.ops` and the
cell (:mod:`nblstm.cell`) call nothing else of them.

The CUDA target is imported only when GPU arrays are seen, so
``import nblstm`` never needs a CUDA driver, and neither target is imported
before its first call (each imports numba).
"""

import functools
import importlib

__all__ = ["check_precision", "check_stream", "target_for"]


@functools.cache
def _cpu():
    return importlib.import_module("nblstm.cpu").TARGET


def target_for(kind):
    """The target (:class:`nblstm._contract.Target`) that runs arrays of ``kind`` (``"host"`` or ``"device"``).

    Each is imported on first use.
    """
    if kind == "host":
        return _cpu()
    try:
        module = importlib.import_module("nblstm.cuda")
    except ImportError as err:  # numba-cuda missing or broken: say what to install
        raise RuntimeError(
            f"GPU arrays were given, but the CUDA target cannot be loaded ({err}); install numba-cuda "
            "(the cuda extra: pip install \".[cuda]\" in nblstm's source tree) or pass NumPy arrays to run on the CPU"
        ) from err
    return module.TARGET


def check_stream(kind, stream):
    """``stream`` applies to GPU arrays only."""
    if stream is not None and kind == "host":
        raise ValueError("stream applies to GPU arrays only; the arrays given are NumPy arrays")


def check_precision(kind, precision):
    """A reduced ``precision`` applies to GPU arrays only: the CPU target computes exactly.

    The CUDA target checks the rest when it runs (cuBLAS present, float32
    computation: :func:`nblstm.cuda.launch.check_precision`).
    """
    if precision != "exact" and kind == "host":
        raise ValueError(f"precision={precision!r} applies to GPU arrays only (cuBLAS's tensor cores); the CPU "
                         "computes exactly: pass precision='exact' with NumPy arrays")
