"""The float32 activations of ``nblstm.spec`` against float64 NumPy, as the kernels compile them.

The rational tanh and the sigmoid's own ``exp`` are plain arithmetic: their
error depends on how they are evaluated. The CPU kernels let LLVM fuse
multiply-adds (``fastmath`` ``contract``); the bounds hold either way.
"""

import numpy as np
import pytest
from numba import njit

from nblstm import spec


def _evaluator(fastmath):
    @njit(fastmath=fastmath, error_model="numpy")
    def evaluate(x, tanh_out, sigmoid_out):
        one = np.float32(1.0)
        for k in range(x.size):
            tanh_out[k] = spec.tanh(x[k])
            sigmoid_out[k] = spec.sigmoid(x[k], one)

    return evaluate


@pytest.mark.parametrize("fastmath", [False, {"contract"}], ids=["plain", "contract"])
def test_float32_tanh_and_sigmoid_errors(fastmath):
    grid = np.linspace(-10, 10, 2_000_001, dtype=np.float32)
    edges = np.array(
        [
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            spec._TANH_BOUND,
            -spec._TANH_BOUND,
            np.nextafter(spec._TANH_BOUND, np.float32(0)),
            20,
            -20,
            1e30,
            -1e30,
            np.inf,
            -np.inf,
        ],
        np.float32,
    )
    x = np.concatenate([grid, edges])
    t, s = np.empty_like(x), np.empty_like(x)
    _evaluator(fastmath)(x, t, s)
    x64 = x.astype(np.float64)
    assert np.abs(t - np.tanh(x64)).max() <= 3.4e-7
    assert (np.abs(t - np.tanh(x64)) / np.maximum(np.abs(np.tanh(x64)), 1e-38)).max() <= 3.4e-7
    with np.errstate(over="ignore"):
        sigmoid = 1 / (1 + np.exp(-x64))
    assert np.abs(s - sigmoid).max() <= 1.8e-7
    assert (t[x >= spec._TANH_BOUND] == 1).all() and (t[x <= -spec._TANH_BOUND] == -1).all()
    assert t[x == 0][0] == 0 and s[x == 0][0] == 0.5

    nan = np.array([np.nan], np.float32)
    tn, sn = np.empty_like(nan), np.empty_like(nan)
    _evaluator(fastmath)(nan, tn, sn)
    assert np.isnan(tn[0]) and np.isnan(sn[0])


def _ulp32(ref):
    """The spacing of float32 at each (float64) ``ref``: ``2^(e - 23)`` in the binade ``[2^e, 2^(e + 1))``, and
    ``2^-149`` among the subnormals."""
    _, exponent = np.frexp(np.abs(ref))
    return np.maximum(np.ldexp(1.0, exponent - 24), 2.0**-149)


@pytest.mark.parametrize("fastmath", [False, {"contract"}], ids=["plain", "contract"])
def test_float32_sigmoid_is_within_one_ulp(fastmath):
    """Within 1 ulp of ``1 / (1 + exp(-x))`` near 1 (``x >= 0``, the forget gate of a long memory) and, as a
    relative error, near 0 (``x < 0``, subnormal results included); exactly 0 and 1 where those are nearest.
    The former ``0.5 + 0.5 tanh(x / 2)`` was 3.1 ulp off below 1 and returned 0 from ``x = -15.8`` on."""
    grid = np.linspace(-20, 20, 2_000_001, dtype=np.float32)
    # Every 4099th float32 of [-110, 110]: every binade, those of subnormal results included.
    top = int(np.float32(110).view(np.uint32))
    bits = np.arange(0, top, 4099, dtype=np.uint32).view(np.float32)
    x = np.concatenate([grid, bits, -bits, np.float32([17.32, 17.33, -87.33, -103.97, -103.98, 1e30, -1e30])])
    y, unused = np.empty_like(x), np.empty_like(x)
    _evaluator(fastmath)(x, unused, y)
    with np.errstate(over="ignore"):
        ref = 1 / (1 + np.exp(-x.astype(np.float64)))
    ulps = np.abs(y - ref) / _ulp32(ref)
    assert ulps[x >= 0].max() <= 1
    assert ulps[x < 0].max() <= 1
    assert (y[x > 17.33] == 1).all() and (y[x < -103.98] == 0).all()
    assert y[x == np.float32(-103.97)][0] == 2.0**-149
