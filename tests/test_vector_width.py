"""``_jit.full_width``: the kernels' loops at the CPU's full vector width, with the bits of scalar code.

The function attribute only changes how LLVM vectorizes a loop; each lane
computes what one element's scalar code does. Checked on the float32
sigmoid and tanh (the gate maths' costliest parts) against the same
functions called one element at a time, past every branch of their range
reduction, and on the kernels that carry it.
"""

import llvmlite.binding as llb
import numpy as np
from numba import njit

from nblstm._jit import KERNEL, full_width
from nblstm.spec import sigmoid, tanh


@njit(**KERNEL)
def _wide(x, out_sigmoid, out_tanh):
    full_width()
    one = np.float32(1.0)
    for j in range(x.shape[0]):
        out_sigmoid[j] = sigmoid(x[j], one)
        out_tanh[j] = tanh(x[j])


@njit(**KERNEL)
def _one(x):
    """One element per call: no loop to vectorize."""
    return sigmoid(x, np.float32(1.0)), tanh(x)


def _inputs():
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(4000) * 4, rng.standard_normal(1000) * 60, np.linspace(-120, 30, 997),
        [0.0, -0.0, 17.33, -103.98, 1e-30, -1e-30, np.inf, -np.inf, np.nan, 1e38, -1e38],
    ]).astype(np.float32)
    return x


def test_wide_loops_give_the_scalar_bits():
    x = _inputs()
    got_sigmoid, got_tanh = np.empty_like(x), np.empty_like(x)
    _wide(x, got_sigmoid, got_tanh)
    if llb.get_host_cpu_features().get("avx512f", False):  # the loop is vectorized, and at 512 bits
        fresh = njit(**{**KERNEL, "cache": False})(_wide.py_func)
        fresh.compile(_wide.signatures[0])
        assert "zmm" in fresh.inspect_asm(_wide.signatures[0])
    expected = np.array([_one(v) for v in x], np.float32)
    np.testing.assert_array_equal(got_sigmoid.view(np.uint32), expected[:, 0].view(np.uint32))
    np.testing.assert_array_equal(got_tanh.view(np.uint32), expected[:, 1].view(np.uint32))


def test_the_kernels_carry_the_attribute():
    """The fused ops' workers, compiled afresh (code loaded from numba's cache has no IR to read)."""
    import nblstm
    from nblstm.cpu import fused

    T, B, I, H = 3, 2, 3, 4
    x = np.ones((T, B, I), np.float32)
    c = np.zeros((B, H), np.float32)
    w = np.full((I + H, 4 * H), 0.1, np.float32)
    out = nblstm.block_lstm(x, c, c, w, np.zeros(4 * H, np.float32))
    nblstm.block_lstm_grad(x, c, c, w, out, None, np.ones_like(out.h))
    c1 = np.zeros((1, H), np.float32)
    nblstm.block_lstm(x[:, :1], c1, c1, w, np.zeros(4 * H, np.float32))  # batch 1: the projection before the loop
    for kernel in (fused.forward_worker, fused.projected_forward_worker, fused.backward_worker):
        fresh = njit(**{**KERNEL, "cache": False})(kernel.py_func)
        signature = kernel.signatures[0]
        fresh.compile(signature)
        assert '"prefer-vector-width"="512"' in fresh.inspect_llvm(signature)
