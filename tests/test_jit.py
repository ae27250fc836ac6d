"""nblstm.jit: LSTM steps and sequences called from Python and from users' @njit code.

Checked against the float64 reference, against the fused ops (the same bits
where the ops run their step's whole product on the micro-kernel, rounding
otherwise), and against themselves: a user's loop of steps gives the bits of
the whole-sequence functions. Called from jitted code with constants and
arrays of every layout, each kernel compiles once per dtype; in a second
process it loads from numba's cache and nothing of nblstm compiles.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba import njit, prange
from numba.core import errors

import nblstm
import nblstm.jit as lstm
from nblstm import reference as ref
from nblstm.cpu.partition import fused_projection
from nblstm.jit import cpu as jit_cpu
from tests.helpers import FORWARD_TOL, GRAD_NAMES, GRAD_TOL, OUTPUT_NAMES, assert_close, make_problem

ROOT = Path(nblstm.__file__).resolve().parents[1]
DTYPES = [np.float32, np.float64]
# (forget_bias, cell_clip, use_peephole): cell_clip <= 0 is no clipping.
OPTIONS = [(0.0, 0.0, False), (1.0, 0.4, True), (0.5, -2.0, True), (0.0, 3.0, False)]
# (T, B, I, H): the fused ops run the first two and the last with their input projection inside the steps
# (on the micro-kernel, as nblstm.jit: the last one from B = 8 with small weights), the other two with it as
# BLAS GEMMs before the loop (batch 1, or I > 256 at B < 8: nblstm.cpu.partition.fused_projection).
SHAPES = [(4, 3, 5, 6), (3, 9, 2, 17), (5, 1, 4, 7), (3, 4, 300, 5), (3, 9, 300, 6)]


def _problem(shape, dtype, seed=0):
    return make_problem(np.random.default_rng(seed), *shape, dtype=dtype)


def _args(p):
    return p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"]


def _forward(p, options, layout, seq_len_max=None, empty=np.empty):
    steps, batch, _ = p["x"].shape
    units = p["cs_prev"].shape[1]
    outs = [empty((steps, batch, units), p["x"].dtype) for _ in range(7)]
    lstm.lstm_forward(*_args(p), *options, lstm.layout_code(layout), *outs, seq_len_max)
    return outs


def _grad_arrays(p):
    steps, batch, inputs = p["x"].shape
    units = p["cs_prev"].shape[1]
    dtype = p["x"].dtype
    return [np.full(shape, np.nan, dtype) for shape in ((steps, batch, inputs), (batch, units), (batch, units),
                                                        (inputs + units, 4 * units), (units,), (units,), (units,),
                                                        (4 * units,))]


def _backward(p, outs, cs_grad, h_grad, use_peephole, layout, seq_len_max=None):
    grads = _grad_arrays(p)
    lstm.lstm_backward(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["wci"], p["wcf"], p["wco"], *outs, cs_grad, h_grad,
                    use_peephole, lstm.layout_code(layout), *grads, seq_len_max)
    return grads


def _incoming(p, seed=1):
    rng = np.random.default_rng(seed)
    steps, batch, _ = p["x"].shape
    units = p["cs_prev"].shape[1]
    return [rng.standard_normal((steps, batch, units)).astype(p["x"].dtype) for _ in range(2)]


def test_layout_codes():
    assert (lstm.layout_code("ifco"), lstm.layout_code("ICFO"), lstm.layout_code(1)) == (lstm.IFCO, lstm.ICFO, 1)
    for wrong in ("fico", 2, True, None):
        with pytest.raises(ValueError, match="layout"):
            lstm.layout_code(wrong)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES[:3])
@pytest.mark.parametrize("layout", ["ifco", "icfo"])
@pytest.mark.parametrize("options", OPTIONS)
def test_sequence_matches_the_reference(dtype, shape, layout, options):
    forget_bias, cell_clip, use_peephole = options
    p = _problem(shape, dtype)
    steps = shape[0]
    cs_grad, h_grad = _incoming(p)
    for seq_len_max in sorted({0, steps // 2, steps}):
        outs = _forward(p, options, layout, seq_len_max, empty=lambda s, d: np.full(s, np.nan, d))
        expected = ref.block_lstm(*_args(p), seq_len_max, forget_bias, cell_clip, use_peephole, layout)
        for name, got in zip(OUTPUT_NAMES, outs):
            assert_close(got, expected[name], dtype, FORWARD_TOL, name)
            assert not got[seq_len_max:].any(), name
        grads = _backward(p, outs, cs_grad, h_grad, use_peephole, layout, seq_len_max)
        expected = ref.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["wci"], p["wcf"], p["wco"], outs,
                                       cs_grad, h_grad, seq_len_max, use_peephole, layout)
        for name, got in zip(GRAD_NAMES, grads):
            scale = max(1.0, np.abs(expected[name]).max(initial=0.0))
            assert_close(got / scale, expected[name] / scale, dtype, GRAD_TOL, name)
        assert not grads[0][seq_len_max:].any()
        if not use_peephole:
            assert not any(g.any() for g in grads[4:7])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", ["ifco", "icfo"])
@pytest.mark.parametrize("options", OPTIONS[:2])
def test_the_fused_ops_bits(dtype, shape, layout, options):
    """Where the ops' steps run their whole product on the micro-kernel, the forward outputs and the gate
    gradients (so cs_prev_grad and the peephole gradients) are the ops' bits; the products the ops run on BLAS
    (the input projection otherwise, x_grad, h_prev_grad, w_grad) and b_grad (summed in another order) agree
    to rounding."""
    forget_bias, cell_clip, use_peephole = options
    steps, batch, inputs, units = shape
    p = _problem(shape, dtype, seed=3)
    same_bits = fused_projection(batch, inputs, units, dtype)
    op_options = {"forget_bias": forget_bias, "cell_clip": cell_clip, "use_peephole": use_peephole, "layout": layout}
    expected = nblstm.block_lstm(*_args(p), **op_options)
    outs = _forward(p, options, layout)
    for name, got, want in zip(OUTPUT_NAMES, outs, expected):
        if same_bits:
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            assert_close(got, want.astype(np.float64), dtype, GRAD_TOL, name)
    # One step: lstm_step_train against lstm_block_cell, lstm_step against lstm_step_train.
    step = nblstm.lstm_block_cell(p["x"][0], *_args(p)[1:], **op_options)
    seven = [np.empty((batch, units), dtype) for _ in range(7)]
    lstm.lstm_step_train(p["x"][0], *_args(p)[1:], *options, lstm.layout_code(layout), *seven)
    cs, h = np.empty((batch, units), dtype), np.empty((batch, units), dtype)
    lstm.lstm_step(p["x"][0], *_args(p)[1:], *options, lstm.layout_code(layout), cs, h)
    np.testing.assert_array_equal(cs, seven[1])
    np.testing.assert_array_equal(h, seven[6])
    for name, got, want in zip(OUTPUT_NAMES, seven, step):
        if same_bits:
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            assert_close(got, want.astype(np.float64), dtype, GRAD_TOL, name)
    # The backward, from the ops' forward outputs.
    cs_grad, h_grad = _incoming(p)
    op_grads = nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], expected, cs_grad, h_grad,
                                      p["wci"], p["wcf"], p["wco"], use_peephole=use_peephole, layout=layout)
    grads = _backward(p, list(expected), cs_grad, h_grad, use_peephole, layout)
    for name, got, want in zip(GRAD_NAMES, grads, op_grads):
        if name in ("cs_prev_grad", "wci_grad", "wcf_grad", "wco_grad"):
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            scale = max(1.0, np.abs(want).max())
            assert_close(got / scale, want.astype(np.float64) / scale, dtype, GRAD_TOL, name)
    # One step's gradient: lstm_step_grad against lstm_block_cell_grad, bit for bit.
    op_step = nblstm.lstm_block_cell_grad(p["x"][0], p["cs_prev"], p["h_prev"], p["w"], step, cs_grad[0], h_grad[0],
                                          p["wci"], p["wcf"], p["wco"], use_peephole=use_peephole, layout=layout)
    cs_prev_grad, dicfo = np.empty((batch, units), dtype), np.empty((batch, 4 * units), dtype)
    peephole_grads = [np.zeros(units, dtype) for _ in range(3)]
    lstm.lstm_step_grad(p["cs_prev"], *step[:6], cs_grad[0], h_grad[0], p["wci"], p["wcf"], p["wco"], use_peephole,
                     lstm.layout_code(layout), cs_prev_grad, dicfo, *peephole_grads)
    for name, got in zip(op_step._fields, (cs_prev_grad, dicfo, *peephole_grads)):
        np.testing.assert_array_equal(got, getattr(op_step, name), err_msg=name)


@njit
def _user_forward(x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout):
    """A user's loop of lstm_step, the state updated in place."""
    c = cs_prev.copy()
    h = h_prev.copy()
    hs = np.empty((x.shape[0],) + h.shape, x.dtype)
    for t in range(x.shape[0]):
        lstm.lstm_step(x[t], c, h, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout, c, h)
        hs[t] = h
    return hs, c


@njit
def _user_training_step(x, cs_prev, h_prev, w, b, wci, wcf, wco, h_grad, use_peephole, layout):
    """A user's forward (lstm_step_train) and backward (lstm_step_grad and its products) over a sequence."""
    steps, batch, inputs = x.shape
    units = cs_prev.shape[1]
    out = np.empty((7, steps, batch, units), x.dtype)  # i, cs, f, o, ci, co, h
    for t in range(steps):
        c = cs_prev if t == 0 else out[1, t - 1]
        h = h_prev if t == 0 else out[6, t - 1]
        lstm.lstm_step_train(x[t], c, h, w, b, wci, wcf, wco, 1.0, 0.5, use_peephole, layout, out[0, t], out[1, t],
                          out[2, t], out[3, t], out[4, t], out[5, t], out[6, t])
    x_grad = np.empty_like(x)
    dh = np.zeros((batch, units), x.dtype)  # carried from step t + 1
    dc = np.zeros((batch, units), x.dtype)
    dicfo = np.empty((batch, 4 * units), x.dtype)
    w_grad = np.zeros_like(w)
    b_grad = np.zeros_like(b)
    peepholes = np.zeros((3, units), x.dtype)
    for t in range(steps - 1, -1, -1):
        c = cs_prev if t == 0 else out[1, t - 1]
        h = h_prev if t == 0 else out[6, t - 1]
        total_h = h_grad[t] + dh
        lstm.lstm_step_grad(c, out[0, t], out[1, t], out[2, t], out[3, t], out[4, t], out[5, t], dc, total_h, wci, wcf,
                         wco, use_peephole, layout, dc, dicfo, peepholes[0], peepholes[1], peepholes[2])
        lstm.lstm_step_input_grads(dicfo, w, x_grad[t], dh)
        lstm.lstm_step_weight_grads(x[t], h, dicfo, w_grad, b_grad)
    return out, (x_grad, dc, dh, w_grad, peepholes[0], peepholes[1], peepholes[2], b_grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", [lstm.IFCO, lstm.ICFO])
@pytest.mark.parametrize("use_peephole", [False, True])
def test_a_users_loop_of_steps_gives_the_sequence_bits(dtype, layout, use_peephole):
    shape = (5, 3, 4, 6)
    p = _problem(shape, dtype, seed=4)
    options = (1.0, 0.5, use_peephole)
    outs = _forward(p, options, layout)
    hs, c = _user_forward(*_args(p), *options, layout)
    np.testing.assert_array_equal(hs, outs[6])
    np.testing.assert_array_equal(c, outs[1][-1])
    np.testing.assert_array_equal(outs[6], nblstm.block_lstm(*_args(p), forget_bias=1.0, cell_clip=0.5,
                                                             use_peephole=use_peephole,
                                                             layout=("ifco", "icfo")[layout]).h)
    _, h_grad = _incoming(p)
    user_outs, user_grads = _user_training_step(*_args(p), h_grad, use_peephole, layout)
    for name, got, want in zip(OUTPUT_NAMES, user_outs, outs):
        np.testing.assert_array_equal(got, want, err_msg=name)
    grads = _backward(p, outs, np.zeros_like(h_grad), h_grad, use_peephole, layout)
    for name, got, want in zip(GRAD_NAMES, user_grads, grads):
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_constants_and_array_layouts_from_jitted_code_compile_each_kernel_once():
    """Literal options (numba types each constant int and bool apart) and C, strided, Fortran and read-only
    arrays reach one compiled kernel per dtype, with the results of C-contiguous arrays."""
    p = _problem((3, 4, 5, 6), np.float64, seed=5)
    x, c0, h0, w, b, wci, wcf, wco = _args(p)

    @njit
    def steps(x, c, h, w, b, wci, wcf, wco):
        out = np.empty((4,) + c.shape, x.dtype)
        lstm.lstm_step(x, c, h, w, b, wci, wcf, wco, 1, 0.0, True, 1, out[0], out[1])
        lstm.lstm_step(x, c, h, w, b, wci, wcf, wco, 0.5, 2, False, lstm.IFCO, out[2], out[3])
        return out

    expected = steps(x[0], c0, h0, w, b, wci, wcf, wco)
    frozen = w.copy()
    frozen.flags.writeable = False
    variants = [
        (x[0], c0, h0, w, b, wci, wcf, wco),
        (np.asfortranarray(x[0]), np.asfortranarray(c0), h0, np.asfortranarray(w), b, wci, wcf, wco),
        (np.repeat(x[0], 2, axis=1)[:, ::2], c0, np.repeat(h0, 2, axis=0)[::2], frozen, np.broadcast_to(b, b.shape),
         wci[::1], np.repeat(wcf, 3)[::3], wco),
    ]
    for args in variants:
        np.testing.assert_array_equal(steps(*args), expected)
        out = np.empty((4, 4, 12))[:, :, ::2]  # strided outputs
        lstm.lstm_step(*args, 1, 0.0, True, 1, out[0], out[1])
        np.testing.assert_array_equal(out[:2], expected[:2])
    assert len(jit_cpu._step_kernel.signatures) == 1 + (np.float32 in _compiled_dtypes(jit_cpu._step_kernel))


def _compiled_dtypes(dispatcher):
    """The dtypes a kernel is compiled for: that of its first record's first array (``StepInputs.x``)."""
    return {np.dtype(str(sig[0][0].dtype)).type for sig in dispatcher.signatures}


def test_the_kernels_take_records_of_at_most_12_parameters():
    """The step kernel as a call from Python compiles it: its options one JitOptions of float64, bool and int64
    (whatever types the caller's options had), its arrays in records of arrays of layout "A"."""
    p = _problem((1, 2, 3, 4), np.float64, seed=6)
    x, c0, h0, w, b, wci, wcf, wco = _args(p)
    c, h = np.empty_like(c0), np.empty_like(c0)
    lstm.lstm_step(x[0], c0, h0, w, b, wci, wcf, wco, np.float32(1.0), 0, np.bool_(True), np.int32(0), c, h)
    kernels = [jit_cpu._step_kernel, jit_cpu._step_grad_kernel, jit_cpu._forward_kernel, jit_cpu._backward_kernel]
    for kernel in kernels:
        assert len(kernel.py_func.__code__.co_varnames[:kernel.py_func.__code__.co_argcount]) <= 12
    (sig,) = [sig for sig in jit_cpu._step_kernel.signatures if str(sig[0][0].dtype) == "float64"]
    inputs, w_type, b_type, peepholes, options, save, out = sig
    assert inputs.instance_class is jit_cpu.StepInputs and peepholes.instance_class is jit_cpu.Peepholes
    assert out.instance_class is jit_cpu.StepOutputs
    assert options.instance_class is jit_cpu.JitOptions
    assert [str(t) for t in options] == ["float64", "float64", "bool", "int64"]
    assert {t.layout for t in (*inputs, w_type, b_type, *peepholes, *out)} == {"A"}
    assert all(t.mutable for t in out) and not any(t.mutable for t in inputs)


def test_inputs_are_not_modified_and_outputs_may_be_the_state():
    p = _problem((3, 4, 5, 6), np.float32, seed=6)
    before = {k: v.copy() for k, v in p.items()}
    c, h = p["cs_prev"].copy(), p["h_prev"].copy()
    cs, hh = np.empty_like(c), np.empty_like(h)
    lstm.lstm_step(p["x"][0], c, h, *_args(p)[3:], 1.0, 0.0, True, lstm.ICFO, cs, hh)
    lstm.lstm_step(p["x"][0], c, h, *_args(p)[3:], 1.0, 0.0, True, lstm.ICFO, c, h)  # in place
    np.testing.assert_array_equal(c, cs)
    np.testing.assert_array_equal(h, hh)
    outs = _forward(p, (1.0, 0.0, True), "icfo")
    _backward(p, outs, *_incoming(p), True, "icfo")
    for k, v in before.items():
        np.testing.assert_array_equal(p[k], v, err_msg=k)
    # The cs_prev gradient written over the incoming cs gradient.
    units = c.shape[1]
    seven = [a[0] for a in outs]
    cs_grad, h_grad = (g[0] for g in _incoming(p))
    args = (p["cs_prev"], *seven[:6])
    separate = [np.empty_like(c), np.empty((4, 4 * units), np.float32)]
    lstm.lstm_step_grad(*args, cs_grad, h_grad, *_args(p)[5:], False, 1, *separate, *[np.zeros(units, np.float32)] * 3)
    shared = cs_grad.copy()
    dicfo = np.empty((4, 4 * units), np.float32)
    lstm.lstm_step_grad(*args, shared, h_grad, *_args(p)[5:], False, 1, shared, dicfo,
                        *[np.zeros(units, np.float32)] * 3)
    np.testing.assert_array_equal(shared, separate[0])
    np.testing.assert_array_equal(dicfo, separate[1])


def test_peephole_weights_are_not_read_without_peepholes():
    p = _problem((3, 2, 3, 4), np.float64, seed=7)
    expected = _forward(p, (0.0, 0.0, False), "ifco")
    p.update(wci=np.full(4, np.nan), wcf=np.full(4, np.inf), wco=np.full(1, np.nan))  # even the wrong length
    for got, want in zip(_forward(p, (0.0, 0.0, False), "ifco"), expected):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_clip_bound_that_rounds_to_zero_in_the_dtype_turns_clipping_off(dtype):
    p = _problem((2, 3, 2, 3), dtype, seed=8)
    p["cs_prev"] *= 10
    off = _forward(p, (0.0, 0.0, False), "ifco")
    tiny = _forward(p, (0.0, 1e-50, False), "ifco")
    expected = nblstm.block_lstm(*_args(p), cell_clip=1e-50)
    np.testing.assert_array_equal(tiny[1], expected.cs)
    if dtype == np.float32:
        np.testing.assert_array_equal(tiny[1], off[1])
    else:
        assert np.abs(tiny[1]).max() <= 1e-50


@pytest.mark.parametrize("shape", [(0, 2, 3, 4), (3, 0, 3, 4), (3, 2, 0, 4)])
def test_empty_dimensions(shape):
    p = _problem(shape, np.float64, seed=9)
    outs = _forward(p, (1.0, 0.0, True), "ifco")
    expected = nblstm.block_lstm(*_args(p), forget_bias=1.0, use_peephole=True)
    for got, want in zip(outs, expected):
        np.testing.assert_array_equal(got, want)
    cs_grad, h_grad = _incoming(p)
    grads = _backward(p, outs, cs_grad, h_grad, True, "ifco")
    op = nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], expected, cs_grad, h_grad, p["wci"],
                                p["wcf"], p["wco"], use_peephole=True)
    for name, got, want in zip(GRAD_NAMES, grads, op):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=name)


@njit(parallel=True)
def _many_sequences(x, c0, h0, w, b, p, h_out):
    """Independent sequences on several threads: x [N, T, B, I], h_out [N, T, B, H]."""
    for n in prange(x.shape[0]):
        out = np.empty((7,) + h_out.shape[1:], x.dtype)
        lstm.lstm_forward(x[n], c0, h0, w, b, p, p, p, 1.0, 0.0, False, lstm.IFCO, out[0], out[1], out[2], out[3],
                          out[4], out[5], out[6])
        h_out[n] = out[6]


def test_called_from_prange_loops():
    p = _problem((4, 3, 5, 6), np.float32, seed=10)
    xs = np.stack([p["x"] * k for k in range(4)])
    h_out = np.empty((4, 4, 3, 6), np.float32)
    _many_sequences(xs, p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], h_out)
    for n in range(4):
        q = dict(p, x=xs[n])
        np.testing.assert_array_equal(h_out[n], _forward(q, (1.0, 0.0, False), "ifco")[6])


def test_errors_from_python_name_the_argument():
    p = _problem((3, 2, 3, 4), np.float32, seed=11)
    x, c, h, w, b, wci, wcf, wco = _args(p)
    cs, hh = np.empty_like(c), np.empty_like(h)
    good = [x[0], c, h, w, b, wci, wcf, wco, 1.0, 0.0, False, 0, cs, hh]

    def call(index, value, error, match):
        args = list(good)
        args[index] = value
        with pytest.raises(error, match=match):
            lstm.lstm_step(*args)

    call(0, x[0].tolist(), TypeError, "x must be a NumPy array")
    call(3, w.astype(np.float64), TypeError, "w is float64 but x is float32")
    call(1, c.astype(np.int32), TypeError, "cs_prev must be a float32 or float64 array")
    call(0, x, ValueError, "x must be a 2-D array")
    call(3, w[:-1], ValueError, r"w must be an \[I \+ H, 4H\] array")
    call(13, np.empty((2, 5), np.float32), ValueError, "out_cs and out_h")
    call(11, 2, ValueError, "layout")
    call(10, "yes", TypeError, "use_peephole must be a bool")
    call(8, None, TypeError, "forget_bias must be a real number")
    frozen = np.empty_like(c)
    frozen.flags.writeable = False
    call(12, frozen, ValueError, "out_cs is written")
    args = list(good)
    args[10] = True
    args[5] = wci[:2]
    with pytest.raises(ValueError, match="wci, wcf and wco must be"):
        lstm.lstm_step(*args)
    outs = [np.empty((3, 2, 4), np.float32) for _ in range(7)]
    with pytest.raises(ValueError, match="seq_len_max"):
        lstm.lstm_forward(*_args(p), 0.0, 0.0, False, 0, *outs, 4)


def test_errors_from_jitted_code():
    p = _problem((3, 2, 3, 4), np.float32, seed=12)

    @njit
    def step(x, c, h, w, b, p, out):
        lstm.lstm_step(x, c, h, w, b, p, p, p, 0.0, 0.0, False, 0, out, out)

    c = p["cs_prev"]
    with pytest.raises(errors.TypingError, match="nblstm.jit.lstm_step: w is float64 but x is float32"):
        step(p["x"][0], c, p["h_prev"], p["w"].astype(np.float64), p["b"], p["wci"], np.empty_like(c))
    with pytest.raises(ValueError, match="out_cs and out_h must be"):  # shapes: at run time
        step(p["x"][0], c, p["h_prev"], p["w"], p["b"], p["wci"], np.empty((2, 3), np.float32))

    @njit
    def named_layout(x, c, h, w, b, p, out):
        lstm.lstm_step(x, c, h, w, b, p, p, p, 0.0, 0.0, False, "ifco", out, out)

    with pytest.raises(errors.TypingError, match="layout must be an integer code"):
        named_layout(p["x"][0], c, p["h_prev"], p["w"], p["b"], p["wci"], np.empty_like(c))


_CHILD = '''
import json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from numba.core import event

with event.install_recorder("numba:compile") as recorder:
    start = time.perf_counter()
    import user_lstm
    result = user_lstm.train(*user_lstm.problem())
    seconds = time.perf_counter() - start
compiled = sorted({f"{e.data['dispatcher'].py_func.__module__}.{e.data['dispatcher'].py_func.__qualname__}"
                   for _, e in recorder.buffer if e.is_start})
print(json.dumps({"compiled": compiled, "seconds": seconds, "digest": float(np.sum(result))}))
'''

_USER_MODULE = '''
import numpy as np
from numba import njit

import nblstm.jit as lstm


def problem():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 5)).astype(np.float32)
    w = (rng.standard_normal((5 + 6, 24)) * 0.3).astype(np.float32)
    return x, np.zeros((3, 6), np.float32), w, np.zeros(24, np.float32)


@njit(cache=True)
def train(x, c0, w, b):
    steps, batch, _ = x.shape
    units = c0.shape[1]
    p = np.zeros(units, x.dtype)
    out = np.empty((7, steps, batch, units), x.dtype)
    lstm.lstm_forward(x, c0, c0, w, b, p, p, p, 1.0, 0.0, False, lstm.IFCO, out[0], out[1], out[2], out[3], out[4],
                      out[5], out[6])
    c, h = c0.copy(), c0.copy()
    lstm.lstm_step(x[0], c, h, w, b, p, p, p, 1.0, 0.0, False, lstm.IFCO, c, h)
    g = [np.empty_like(x), np.empty_like(c0), np.empty_like(c0), np.empty_like(w), np.empty_like(p),
         np.empty_like(p), np.empty_like(p), np.empty_like(b)]
    lstm.lstm_backward(x, c0, c0, w, p, p, p, out[0], out[1], out[2], out[3], out[4], out[5], out[6],
                       np.zeros_like(out[1]), np.ones_like(out[6]), False, lstm.IFCO, g[0], g[1], g[2], g[3], g[4],
                       g[5], g[6], g[7])
    return g[3]
'''


def test_compiled_with_the_caller_and_cached(tmp_path):
    """A user's cached @njit function calling nblstm.jit: the first process compiles nblstm's kernels into numba's
    cache (their index files are there); a second process compiles nothing, neither nblstm's kernels nor the
    user's function, and gets the same bits."""
    (tmp_path / "user_lstm.py").write_text(textwrap.dedent(_USER_MODULE))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    runs = []
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-4000:]
        runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
    first, second = runs
    kernels = {"_forward_kernel", "_backward_kernel", "_step_kernel"}
    assert kernels <= {name.rsplit(".", 1)[-1] for name in first["compiled"] if name.startswith("nblstm.jit.")}
    assert "user_lstm.train" in first["compiled"]
    index = {path.name.split("-")[0] for path in (tmp_path / "numba-cache").rglob("*.nbi")}
    assert {f"cpu.{name}" for name in kernels} <= index, sorted(index)
    assert second["compiled"] == [], second["compiled"]
    assert second["digest"] == first["digest"]


def test_importing_nblstm_jit_does_not_import_numba_cuda():
    code = "import sys, nblstm.jit; print('numba.cuda' in sys.modules, 'nblstm.jit.cuda' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "False"]


def test_layout_names_from_python():
    p = _problem((2, 3, 2, 4), np.float32, seed=13)
    by_name = _forward(p, (0.0, 0.0, False), "icfo")
    by_code = [np.empty_like(a) for a in by_name]
    lstm.lstm_forward(*_args(p), 0, 0, np.bool_(False), np.int64(lstm.ICFO), *by_code)
    for got, want in zip(by_name, by_code):
        np.testing.assert_array_equal(got, want)
