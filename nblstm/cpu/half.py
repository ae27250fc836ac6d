"""float16 <-> float32 conversion on the CPU, in jitted loops on several threads (:mod:`nblstm.cpu.threads`).

Numba's CPU target has no float16 type, so the kernels compute float16
problems in float32. NumPy's own ``astype`` between the two runs at about
6 ns an element on these machines (float32 to float16), which made the
conversions cost more than the LSTM itself; these loops work on the bits
(float16 viewed as ``uint16``) and give NumPy's results bit for bit:

- float16 -> float32 is exact: a 65536-entry table (built once by NumPy's
  own conversion, so NaN payloads match too) indexed by the bits.
- float32 -> float16 rounds to nearest, ties to even, as IEEE 754 and NumPy
  do: normal results by integer arithmetic on the bits, subnormal ones by
  ``rint(|x| * 2**24)``, overflow to infinity, NaN keeping the top bits of
  its payload (and staying NaN).
"""

import numba
import numpy as np
from numba import njit

from .._jit import CALLEE, KERNEL
from . import threads
from .partition import MIN_PARALLEL_PACK

__all__ = ["to_float16", "to_float32"]

# Elements per block of the conversions.
_BLOCK = 1 << 16

_table = {}


def _half_to_float_table():
    if "f32" not in _table:
        _table["f32"] = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    return _table["f32"]


@njit(**CALLEE)
def _bits_to_float(bits, table, out, start, stop):
    # Sliced so that the loop indexes from 0: no wraparound checks.
    src, dst = bits[start:stop], out[start:stop]
    for k in range(src.shape[0]):
        dst[k] = table[src[k]]


@njit(**KERNEL)
def _to_float32(w, workers, bits, table, out):
    """Worker ``w``'s blocks of ``out[k] = float32(float16 with bits[k])`` (flat ``bits: [N] uint16``,
    ``out: [N] float32``)."""
    n = bits.shape[0]
    for start in range(w * _BLOCK, n, workers * _BLOCK):
        _bits_to_float(bits, table, out, start, min(n, start + _BLOCK))


@njit(**CALLEE)
def _float_to_bits(values, value_bits, out, start, stop):
    # Sliced so that the loop indexes from 0 (no wraparound checks), and
    # every case computed and then selected, so that LLVM vectorizes it.
    x, xb, dst = values[start:stop], value_bits[start:stop], out[start:stop]
    for k in range(x.shape[0]):
        u = xb[k]
        sign = (u >> np.uint32(16)) & np.uint32(0x8000)
        a = u & np.uint32(0x7FFFFFFF)
        # A normal result: rebias the exponent and round the 13 dropped
        # mantissa bits to nearest even; a carry out of the mantissa bumps
        # the exponent (up to inf for |x| >= 65520), as it should.
        odd = (a >> np.uint32(13)) & np.uint32(1)
        normal = (a - np.uint32(0x38000000) + np.uint32(0x0FFF) + odd) >> np.uint32(13)
        # |x| < 2**-14: a subnormal or zero result, |x| / 2**-24 rounded to
        # nearest even (1024 is the least normal: right too). Clamped so that
        # the unused value of large |x| converts safely.
        subnormal = np.uint32(np.rint(min(abs(x[k]), np.float32(1.0)) * np.float32(16777216.0)))
        # NaN keeps the top 10 bits of its payload, and never becomes inf.
        payload = (a & np.uint32(0x007FFFFF)) >> np.uint32(13)
        nan = np.uint32(0x7C00) | payload | np.uint32(payload == 0)
        h = subnormal if a < np.uint32(0x38800000) else normal
        h = np.uint32(0x7C00) if a >= np.uint32(0x47800000) else h  # |x| >= 2**16 or inf
        h = nan if a > np.uint32(0x7F800000) else h
        dst[k] = np.uint16(sign | h)


@njit(**KERNEL)
def _to_float16(w, workers, values, value_bits, out):
    """Worker ``w``'s blocks of ``out[k]`` = the bits of ``float16(values[k])`` (``value_bits``: ``values``
    viewed as uint32)."""
    n = values.shape[0]
    for start in range(w * _BLOCK, n, workers * _BLOCK):
        _float_to_bits(values, value_bits, out, start, min(n, start + _BLOCK))


def _workers(n):
    """Threads for ``n`` elements: one below :data:`~nblstm.cpu.partition.MIN_PARALLEL_PACK` (starting a helper
    thread costs about as much as converting that many), else one per block, at most
    :func:`numba.get_num_threads`."""
    if n < MIN_PARALLEL_PACK:
        return 1
    return max(1, min(numba.get_num_threads(), -(-n // _BLOCK)))


def to_float32(a):
    """A float16 array (any layout) as a new C-contiguous float32 array of its shape."""
    a = np.ascontiguousarray(a)
    out = np.empty(a.shape, np.float32)
    if a.size:
        workers = _workers(a.size)
        threads.run(_to_float32, (workers, a.reshape(-1).view(np.uint16), _half_to_float_table(), out.reshape(-1)),
                    workers)
    return out


def to_float16(a):
    """A float32 array (any layout) as a new C-contiguous float16 array of its shape."""
    a = np.ascontiguousarray(a, np.float32)
    out = np.empty(a.shape, np.float16)
    if a.size:
        flat = a.reshape(-1)
        workers = _workers(a.size)
        threads.run(_to_float16, (workers, flat, flat.view(np.uint32), out.reshape(-1).view(np.uint16)), workers)
    return out
