"""Peak memory of the fused ops on the CPU, measured with ``tracemalloc`` (NumPy reports its buffers to it).

The bounds (docs/design.md, "Memory"): a forward call needs its outputs plus
one copy of the weights (repacked for the kernels) and ``O(B x 4H)``
workspace; a backward call needs its gradients, one ``[T, B, 4H]`` buffer
(the gate gradients) and the recurrent weights transposed and packed for
the time loop (``[4H, H]``, padded to the micro-kernel's panels). The gate
gradients are kept per Python thread from one backward call to the next, so
a second call of the same shape allocates less than the bound; the test
measures a call that allocates them. Likewise the pool's free blocks
(``nblstm.cpu.pool``), from which a later call takes its outputs and
gradients: each test empties it first. Beyond that only the time loops' step
counters scale with ``T`` (``nblstm.cpu.sync``: ``K + 1`` int64 per step for
``K`` chunks, one per thread). Numba's own allocations go through Python's
raw allocator, so ``tracemalloc`` sees them too.
"""

import tracemalloc

import numba
import numpy as np
import pytest

import nblstm
from nblstm.cpu import fused
from nblstm.cpu import pool as _pool
from tests.helpers import make_problem

# Index arrays, named tuples, small vectors, the padding of the 64-byte
# aligned arrays (nblstm.cpu.pool.aligned: outputs, packed weights, workspaces)
# and the workers' argument tuples (nblstm.cpu.threads).
SLACK = 20 * 1024 + 8 * _pool.ALIGNMENT


def _step_counters(steps):
    """Bytes of the time loop's claim and done counters (nblstm.cpu.sync)."""
    return (steps + 1) * (numba.get_num_threads() + 1) * 8


def _peak(fn):
    _pool.clear()  # a call that allocates its outputs, not one that takes them from the pool
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = fn()
        return tracemalloc.get_traced_memory()[1], result
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(40, 16, 24, 64), (6, 3, 5, 7)], ids=str)
def test_forward_peak_is_outputs_plus_weights_plus_batch_workspace(shape, dtype):
    steps, batch, inputs, units = shape
    a = make_problem(np.random.default_rng(0), steps, batch, inputs, units, dtype)
    args = (a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
    nblstm.block_lstm(*args)  # compiled before measuring
    peak, out = _peak(lambda: nblstm.block_lstm(*args))
    outputs = sum(o.nbytes for o in out)
    bound = outputs + a["w"].nbytes + 2 * batch * 4 * units * np.dtype(dtype).itemsize + _step_counters(steps) + SLACK
    assert outputs <= peak <= bound, (peak, outputs, bound)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(40, 16, 24, 64), (6, 3, 5, 7)], ids=str)
def test_backward_peak_is_gradients_plus_one_gate_buffer(shape, dtype):
    steps, batch, inputs, units = shape
    rng = np.random.default_rng(1)
    a = make_problem(rng, steps, batch, inputs, units, dtype)
    out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
    cs_grad, h_grad = (rng.standard_normal((steps, batch, units)).astype(dtype) for _ in range(2))
    args = (a["x"], a["cs_prev"], a["h_prev"], a["w"], out, cs_grad, h_grad)
    nblstm.block_lstm_grad(*args)
    fused._scratch.buffers.clear()  # measure a call that allocates its scratch too
    peak, grads = _peak(lambda: nblstm.block_lstm_grad(*args))
    gradients = sum(g.nbytes for g in grads)
    itemsize = np.dtype(dtype).itemsize
    gate_buffer = steps * batch * 4 * units * itemsize
    # Each chunk of units is padded to the micro-kernel's panels on its own (wider panels pad more).
    packed_weights = 4 * units * int(fused.column_offsets(fused.chunk_bounds(batch, units), 1, dtype)[-1]) * itemsize
    bound = gradients + gate_buffer + packed_weights + _step_counters(steps) + SLACK
    assert gradients <= peak <= bound, (peak, gradients, bound)
