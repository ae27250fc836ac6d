"""The float32 activations of ``nblstm.spec`` against float64 NumPy, as the kernels compile them.

The rational tanh is plain arithmetic: its error depends on how it is
evaluated. The CPU kernels let LLVM fuse multiply-adds (``fastmath``
``contract``); the bounds hold either way.
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
    edges = np.array([0.0, -0.0, 1e-30, -1e-30, spec._TANH_BOUND, -spec._TANH_BOUND,
                      np.nextafter(spec._TANH_BOUND, np.float32(0)), 20, -20, 1e30, -1e30, np.inf, -np.inf],
                     np.float32)
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
