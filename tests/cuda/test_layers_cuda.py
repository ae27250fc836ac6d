"""nblstm.LSTM and LSTMCell's reverse direction and masks with GPU arrays, against the CPU path.

Runs in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) or on a GPU;
shapes are tiny (the simulator runs every thread as a Python thread). float64
throughout: the GPU's results differ from the CPU's only by rounding.
"""

import copy

import numpy as np
import pytest
from numba import cuda

import nblstm
from nblstm import LSTM, LSTMStateTuple

TOL = dict(rtol=1e-10, atol=1e-12)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


def host(a):
    assert not isinstance(a, np.ndarray) and hasattr(a, "copy_to_host"), type(a)
    return a.copy_to_host()


def close(gpu, cpu, what):
    got = host(gpu)
    assert got.shape == cpu.shape and got.dtype == cpu.dtype, what
    np.testing.assert_allclose(got, cpu, err_msg=what, **TOL)


def random_layer(rng, num_layers=2, **kwargs):
    lstm = LSTM(2, 3, num_layers=num_layers, bidirectional=True, dtype=np.float64, seed=0, **kwargs)
    lstm.set_weights({n: 0.5 * rng.standard_normal(a.shape) for n, a in lstm.get_weights().items()})
    return lstm


def random_hx(lstm, rng, batch):
    rows = lstm.num_layers * lstm.num_directions
    return (rng.standard_normal((rows, batch, lstm.proj_size or lstm.hidden_size)),
            rng.standard_normal((rows, batch, lstm.hidden_size)))


def compare_layer(lstm, x, hx, rng, **kwargs):
    """Forward and backward on the CPU and on the GPU from the same arrays; every result compared."""
    (out, (h_n, c_n)), backward = lstm.vjp(x, hx, **kwargs)
    (g_out, (g_h, g_c)), g_backward = lstm.vjp(dev(x), None if hx is None else (dev(hx[0]), dev(hx[1])), **kwargs)
    close(g_out, out, "output")
    close(g_h, h_n, "h_n")
    close(g_c, c_n, "c_n")
    d_out, d_h, d_c = (rng.standard_normal(a.shape) for a in (out, h_n, c_n))
    d_x, (d_h0, d_c0), d_w = backward(d_out, (d_h, d_c))
    g_x, (g_h0, g_c0), g_w = g_backward(dev(d_out), (dev(d_h), dev(d_c)))
    close(g_x, d_x, "d_input")
    close(g_h0, d_h0, "d_h0")
    close(g_c0, d_c0, "d_c0")
    assert list(g_w) == list(d_w) == list(lstm.weight_names)
    for name, g in d_w.items():
        assert isinstance(g_w[name], np.ndarray), name
        np.testing.assert_allclose(g_w[name], g, err_msg=name, **TOL)
    return out


def test_bidirectional_two_layers_with_lengths():
    rng = np.random.default_rng(0)
    lstm = random_layer(rng, proj_size=2, use_peepholes=True)
    x = rng.standard_normal((4, 3, 2))
    lengths = np.array([4, 0, 2])
    out = compare_layer(lstm, x, random_hx(lstm, rng, 3), rng, sequence_length=lengths)
    assert not out[2:, 2].any() and not out[:, 1].any()


@pytest.mark.parametrize("zero_output_for_mask", [False, True])
def test_bidirectional_two_layers_batch_first_with_a_mask(zero_output_for_mask):
    rng = np.random.default_rng(1)
    # Two layers repeating masked outputs; one zeroing them (the schedule differs only in the outputs).
    lstm = random_layer(rng, num_layers=1 if zero_output_for_mask else 2, batch_first=True,
                        zero_output_for_mask=zero_output_for_mask)
    x = rng.standard_normal((3, 4, 2))  # [B, T, I]
    mask = np.array([[True, False, True, True], [False, False, False, False], [False, True, True, False]])
    out = compare_layer(lstm, x, random_hx(lstm, rng, 3), rng, mask=mask)
    assert not out[1].any()
    # The mask may live on the GPU too.
    np.testing.assert_allclose(host(lstm(dev(x), mask=dev(mask))[0]), lstm(x, mask=mask)[0], **TOL)


def test_dropout_on_the_gpu_draws_the_cpu_masks():
    rng = np.random.default_rng(2)
    lstm = random_layer(rng, dropout=0.5)
    x = rng.standard_normal((3, 2, 2))
    state = copy.deepcopy(lstm.rng)
    out = lstm(x, training=True)[0]
    lstm.rng = state
    close(lstm(dev(x), training=True)[0], out, "output with dropout")


def test_cell_reverse_and_mask_on_the_gpu():
    rng = np.random.default_rng(3)
    cell = nblstm.LSTMCell(3, num_proj=2, use_peepholes=True, dtype=np.float64, seed=1)
    cell.build(2)
    cell.set_weights({n: 0.5 * rng.standard_normal(a.shape) for n, a in cell.get_weights().items()})
    x = rng.standard_normal((4, 3, 2))
    state = LSTMStateTuple(rng.standard_normal((3, 3)), rng.standard_normal((3, 2)))
    g_state = LSTMStateTuple(dev(state.c), dev(state.h))
    mask = np.array([[True, False, True, False], [True, True, True, True], [False, False, True, True]])
    for kwargs in (dict(sequence_length=[4, 0, 2]), dict(mask=mask), dict(mask=mask, zero_output_for_mask=True)):
        out, final = cell.run(x, state, reverse=True, **kwargs)
        g_out, g_final = cell.run(dev(x), g_state, reverse=True, **kwargs)
        close(g_out, out, f"outputs {sorted(kwargs)}")
        close(g_final.c, final.c, "final c")
        close(g_final.h, final.h, "final h")
    # Batch-major, through vjp.
    x_bm = np.ascontiguousarray(x.swapaxes(0, 1))
    (out, final), backward = cell.vjp(x_bm, state, [4, 0, 2], reverse=True, time_major=False)
    (g_out, _), g_backward = cell.vjp(dev(x_bm), g_state, [4, 0, 2], reverse=True, time_major=False)
    close(g_out, out, "batch-major outputs")
    d_out = rng.standard_normal(out.shape)
    d_x, d_state, d_w = backward(d_out, None)
    g_x, g_d_state, g_w = g_backward(dev(d_out), None)
    close(g_x, d_x, "d_inputs")
    close(g_d_state.c, d_state.c, "d_c0")
    for name, g in d_w.items():
        np.testing.assert_allclose(g_w[name], g, err_msg=name, **TOL)


def test_bidirectional_dynamic_rnn_on_the_gpu():
    rng = np.random.default_rng(5)
    fw = nblstm.LSTMCell(3, use_peepholes=True, dtype=np.float64, seed=1)
    bw = nblstm.LSTMCell(2, num_proj=1, dtype=np.float64, seed=2)
    x = rng.standard_normal((3, 4, 2))  # [B, T, I]
    lengths = [4, 0, 3]
    (out_fw, out_bw), (st_fw, st_bw) = nblstm.bidirectional_dynamic_rnn(fw, bw, x, sequence_length=lengths)
    (g_fw, g_bw), (g_st_fw, g_st_bw) = nblstm.bidirectional_dynamic_rnn(fw, bw, dev(x), sequence_length=lengths)
    close(g_fw, out_fw, "output_fw")
    close(g_bw, out_bw, "output_bw")
    close(g_st_fw.c, st_fw.c, "state_fw.c")
    close(g_st_bw.h, st_bw.h, "state_bw.h")


def test_gpu_and_numpy_arrays_are_not_mixed():
    rng = np.random.default_rng(4)
    lstm = random_layer(rng)
    x = rng.standard_normal((3, 2, 2))
    h0, c0 = random_hx(lstm, rng, 2)
    with pytest.raises(TypeError, match=r"hx\[0\] \(h\) must live where input does"):
        lstm(dev(x), (h0, dev(c0)))
    with pytest.raises(TypeError, match=r"hx\[1\] \(c\) must live where input does"):
        lstm(dev(x), (dev(h0), c0))
    with pytest.raises(TypeError, match=r"hx\[0\]"):
        lstm(x, (dev(h0), dev(c0)))
    (out, _), backward = lstm.vjp(dev(x))
    with pytest.raises(TypeError, match="d_output must live where input did"):
        backward(np.zeros(out.shape))
    with pytest.raises(ValueError, match="d_output has shape"):
        backward(dev(np.zeros((3, 2, 5))))
    with pytest.raises(TypeError, match=r"d_hx\[0\]"):
        backward(None, (h0, None))
    with pytest.raises(TypeError, match="input has dtype float32"):
        lstm(dev(x.astype(np.float32)))
    with pytest.raises(ValueError, match="input must have rank 3"):
        lstm(dev(x[0]))
