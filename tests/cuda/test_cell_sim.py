"""LSTMCell called with GPU arrays: results on the GPU, equal to the NumPy call.

The cell has no CUDA kernels yet; it copies GPU arguments to the host, runs the
CPU kernels and copies the results back. These tests pin that contract (run in
the simulator, ``NUMBA_ENABLE_CUDASIM=1``, or on a GPU).
"""

import numpy as np
import pytest
from numba import cuda

import nblstm


def host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


@pytest.mark.parametrize("state_is_tuple", [True, False])
def test_cell_with_gpu_arrays(state_is_tuple):
    rng = np.random.default_rng(0)
    cell = nblstm.LSTMCell(3, num_proj=2, use_peepholes=True, state_is_tuple=state_is_tuple, dtype=np.float32, seed=0)
    x = rng.standard_normal((4, 2, 5)).astype(np.float32)
    lengths = np.array([4, 1])
    (out, state), backward = cell.vjp(x, sequence_length=lengths)
    d_out = rng.standard_normal(out.shape).astype(np.float32)
    grads = backward(d_out)
    d_x = cuda.to_device(x)
    (g_out, g_state), g_backward = cell.vjp(d_x, sequence_length=cuda.to_device(lengths))
    assert not isinstance(g_out, np.ndarray)
    np.testing.assert_array_equal(host(g_out), out)
    g_grads = g_backward(cuda.to_device(d_out))
    np.testing.assert_array_equal(host(g_grads[0]), grads[0])
    if state_is_tuple:
        np.testing.assert_array_equal(host(g_state.c), state.c)
        np.testing.assert_array_equal(host(g_grads[1].h), grads[1].h)
    else:
        np.testing.assert_array_equal(host(g_state), state)
    for name, value in grads[2].items():
        np.testing.assert_array_equal(g_grads[2][name], value)
    step_out, step_state = cell(d_x[0], cell.get_initial_state(d_x[0]))
    np.testing.assert_array_equal(host(step_out), cell(x[0], cell.get_initial_state(x[0]))[0])
    with pytest.raises(TypeError, match="must live together"):
        cell.run(d_x, cell.zero_state(2, np.float32))
