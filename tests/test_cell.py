"""Tests of nblstm.LSTMCell: TF1 semantics, sequences, gradients, fixtures and validation.

Shapes are tiny and float64 is used wherever the dtype does not matter, so
the kernels compile for two dtypes only (float16 computes in float32).
"""

import json
import os
import warnings

import numba
import numpy as np
import pytest

import nblstm
from nblstm import LSTMCell, LSTMStateTuple
from nblstm.cell import ACTIVATION_NAMES, Activation
from nblstm.reference import cell as ref

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
TF_FIXTURE = os.path.join(FIXTURES, "tf_lstmcell.npz")
TORCH_FIXTURE = os.path.join(FIXTURES, "torch_lstm.npz")

T, B, I, H, P = 4, 3, 2, 3, 2


def make_cell(rng, dtype=np.float64, input_depth=I, **kwargs):
    """A built cell with random weights (bias random too, so every term is exercised)."""
    cell = LSTMCell(H if "num_units" not in kwargs else kwargs.pop("num_units"), dtype=dtype, seed=3, **kwargs)
    cell.build(input_depth)
    w = cell.get_weights()
    w["bias"] = (rng.standard_normal(w["bias"].shape) * 0.5).astype(dtype)
    for n in ("w_f_diag", "w_i_diag", "w_o_diag"):
        if n in w:
            w[n] = rng.standard_normal(w[n].shape).astype(dtype)
    cell.set_weights(w)
    return cell


def ref_options(cell):
    return {"forget_bias": cell.forget_bias, "cell_clip": cell.cell_clip,
            "proj_clip": cell.proj_clip if cell.num_proj else None, "activation": cell.activation.name}


def random_state(rng, cell, batch=B, dtype=np.float64):
    return LSTMStateTuple(rng.standard_normal((batch, cell.num_units)).astype(dtype),
                          (0.5 * rng.standard_normal((batch, cell.output_size))).astype(dtype))


# Option combinations: each runs forward and backward against the reference.
COMBOS = [
    {},
    {"use_peepholes": True},
    {"cell_clip": 0.4, "forget_bias": 0.3},
    {"num_proj": P},
    {"num_proj": 4, "proj_clip": 0.15, "use_peepholes": True, "cell_clip": 0.5, "activation": "relu"},
    {"activation": "softsign", "use_peepholes": True},
    {"activation": "elu", "num_proj": P, "proj_clip": 10.0},
]


# ----------------------------------------------------------------------------------------------------
# Constructor, variables, sizes
# ----------------------------------------------------------------------------------------------------


def test_activation_codes_match_spec():
    from nblstm.spec import ACTIVATIONS

    assert ACTIVATION_NAMES == tuple(sorted(ACTIVATIONS, key=ACTIVATIONS.get))


def test_variables_names_shapes_and_initial_values():
    cell = LSTMCell(5, use_peepholes=True, num_proj=3, seed=0)
    cell.build(4)
    w = cell.get_weights()
    assert list(w) == ["kernel", "bias", "w_f_diag", "w_i_diag", "w_o_diag", "projection/kernel"]
    assert w["kernel"].shape == (4 + 3, 20) and w["bias"].shape == (20,)
    assert w["projection/kernel"].shape == (5, 3) and w["w_o_diag"].shape == (5,)
    assert all(a.dtype == np.float32 for a in w.values())
    assert not w["bias"].any()
    assert np.abs(w["kernel"]).max() <= np.sqrt(6 / (7 + 20))
    assert np.abs(w["w_f_diag"]).max() <= np.sqrt(3 / 5)
    again = LSTMCell(5, use_peepholes=True, num_proj=3, seed=0)
    again.build((None, 4))
    assert all(np.array_equal(a, again.get_weights()[n]) for n, a in w.items())
    other = LSTMCell(5, use_peepholes=True, num_proj=3, seed=1)
    other.build(4)
    assert not np.array_equal(other.get_weights()["kernel"], w["kernel"])


def test_initializers():
    cell = LSTMCell(4, initializer="orthogonal", dtype="float64", seed=0)
    cell.build(4)
    k = cell.get_weights()["kernel"]  # [8, 16]: orthonormal rows
    np.testing.assert_allclose(k @ k.T, np.eye(8), atol=1e-12)
    calls = []

    def init(shape, dtype, rng):
        calls.append(shape)
        return np.full(shape, 0.25, dtype)

    cell = LSTMCell(2, initializer=init, num_proj=1)
    cell.build(3)
    assert calls == [(4, 8), (2, 1)]
    assert (cell.get_weights()["kernel"] == 0.25).all()
    cell = LSTMCell(2, initializer="zeros")
    cell.build(1)
    assert not cell.get_weights()["kernel"].any()
    with pytest.raises(ValueError, match="initializer"):
        LSTMCell(2, initializer="nope")
    with pytest.raises(TypeError, match="initializer"):
        LSTMCell(2, initializer=3)
    with pytest.raises(ValueError, match="orthogonal"):
        LSTMCell(2, initializer="orthogonal", use_peepholes=True)
    bad = LSTMCell(2, initializer=lambda shape, dtype, rng: np.zeros(3))
    with pytest.raises(ValueError, match="initializer returned shape"):
        bad.build(2)


def test_constructor_validation():
    with pytest.raises(TypeError, match="unexpected keyword arguments: bogus"):
        LSTMCell(2, bogus=1)
    assert LSTMCell(2, trainable=False).trainable is False
    with pytest.warns(DeprecationWarning, match="num_unit_shards"):
        LSTMCell(2, num_unit_shards=2)
    with pytest.warns(DeprecationWarning, match="num_proj_shards"):
        LSTMCell(2, num_proj=1, num_proj_shards=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LSTMCell(2)
    for bad, exc, match in [
        ({"num_units": 0}, ValueError, "num_units"),
        ({"num_units": 2.0}, TypeError, "num_units"),
        ({"num_units": True}, TypeError, "num_units"),
        ({"num_proj": 0}, ValueError, "num_proj"),
        ({"cell_clip": -1.0}, ValueError, "cell_clip"),
        ({"cell_clip": "1"}, TypeError, "cell_clip"),
        ({"proj_clip": float("nan")}, ValueError, "proj_clip"),
        ({"forget_bias": None}, TypeError, "forget_bias"),
        ({"use_peepholes": 1}, TypeError, "use_peepholes"),
        ({"state_is_tuple": "yes"}, TypeError, "state_is_tuple"),
        ({"activation": "swish"}, ValueError, "activation"),
        ({"activation": lambda x: x}, ValueError, "activation"),
        ({"dtype": np.int32}, TypeError, "dtype"),
        ({"dtype": "complex64"}, TypeError, "dtype"),
        ({"name": 3}, TypeError, "name"),
        ({"seed": 1.5}, TypeError, "seed"),
    ]:
        args = {"num_units": 2, **bad}
        with pytest.raises(exc, match=match):
            LSTMCell(**args)


def test_activation_by_name_object_and_function():
    assert LSTMCell(2, activation="ReLU").activation == Activation("relu")
    assert LSTMCell(2, activation=Activation("selu")).activation.name == "selu"
    assert LSTMCell(2, activation=np.tanh).activation.name == "tanh"
    assert LSTMCell(2).activation.name == "tanh"
    x = np.linspace(-3, 3, 13)
    for name in ACTIVATION_NAMES:
        np.testing.assert_allclose(Activation(name)(x), ref.ACTIVATIONS[name](x), rtol=1e-12, atol=1e-15)


def test_sizes_and_zero_state():
    cell = LSTMCell(4, num_proj=3)
    assert cell.output_size == 3 and cell.state_size == LSTMStateTuple(4, 3)
    z = cell.zero_state(2, np.float16)
    assert isinstance(z, LSTMStateTuple) and z.c.shape == (2, 4) and z.h.shape == (2, 3) and z.h.dtype == np.float16
    flat = LSTMCell(4, state_is_tuple=False)
    assert flat.state_size == 8 and flat.output_size == 4
    assert flat.zero_state(3.0, "float32").shape == (3, 8)
    with pytest.raises(TypeError, match="batch_size"):
        cell.zero_state("2", np.float32)
    with pytest.raises(ValueError, match="batch_size"):
        cell.zero_state(-1, np.float32)
    with pytest.raises(TypeError, match="dtype"):
        cell.zero_state(2, np.int64)


def test_get_initial_state():
    cell = LSTMCell(4)
    x = np.zeros((5, 2, 3), np.float64)
    s = cell.get_initial_state(x)
    assert s.c.shape == (2, 4) and s.c.dtype == np.float64
    assert cell.get_initial_state(np.zeros((2, 3), np.float32), batch_size=2, dtype=np.float32).h.shape == (2, 4)
    assert cell.get_initial_state(batch_size=1, dtype=np.float32).c.shape == (1, 4)
    with pytest.raises(ValueError, match="batch_size"):
        cell.get_initial_state(x, batch_size=3)
    with pytest.raises(ValueError, match="dtype"):
        cell.get_initial_state(x, dtype=np.float32)
    with pytest.raises(ValueError, match="needs inputs"):
        cell.get_initial_state(batch_size=2)
    with pytest.raises(TypeError, match="inputs"):
        cell.get_initial_state([[1.0]])


# ----------------------------------------------------------------------------------------------------
# Forward against the reference
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", COMBOS + [{"activation": a} for a in ACTIVATION_NAMES[1:]])
def test_step_matches_reference(options):
    rng = np.random.default_rng(1)
    cell = make_cell(rng, **options)
    x = rng.standard_normal((B, I))
    state = random_state(rng, cell)
    out, new = cell(x, state)
    c, m = ref.step(cell.get_weights(), x, state.c, state.h, **ref_options(cell))
    np.testing.assert_allclose(new.c, c, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(new.h, m, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(out, new.h)
    assert isinstance(new, LSTMStateTuple)


@pytest.mark.parametrize("options", COMBOS)
def test_sequence_matches_reference_with_lengths(options):
    rng = np.random.default_rng(2)
    cell = make_cell(rng, **options)
    x = rng.standard_normal((T, B, I))
    state = random_state(rng, cell)
    for lengths in (None, [T, 0, 2], np.array([1, T, 3], np.int32)):
        outputs, final = cell.run(x, state, sequence_length=lengths)
        r_out, r_c, r_m = ref.run(cell.get_weights(), x, state.c, state.h, lengths, **ref_options(cell))
        np.testing.assert_allclose(outputs, r_out, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(final.c, r_c, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(final.h, r_m, rtol=1e-12, atol=1e-14)
    # Zero-length example: outputs zero, final state the initial state, exactly.
    outputs, final = cell.run(x, state, sequence_length=[0, 0, 0])
    assert not outputs.any()
    np.testing.assert_array_equal(final.c, state.c)
    np.testing.assert_array_equal(final.h, state.h)


def test_run_equals_steps_and_default_state():
    rng = np.random.default_rng(3)
    cell = make_cell(rng, use_peepholes=True, num_proj=P)
    x = rng.standard_normal((T, B, I))
    outputs, final = cell.run(x)
    state = cell.zero_state(B, np.float64)
    for t in range(T):
        out, state = cell(x[t], state)
        np.testing.assert_allclose(out, outputs[t], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(state.c, final.c, rtol=1e-13, atol=1e-15)


def test_one_cell_runs_batch_one_and_larger_batches():
    # The recurrent weights are packed differently for B = 1 (a matrix-vector
    # product) and B > 1 (the micro-kernel's panels); one cell serves both.
    rng = np.random.default_rng(13)
    cell = make_cell(rng, use_peepholes=True, num_proj=P)
    x = rng.standard_normal((T, B, I))
    state = random_state(rng, cell)
    for batch in (B, 1, B, 1):
        part = LSTMStateTuple(state.c[:batch], state.h[:batch])
        outputs, final = cell.run(x[:, :batch], part)
        r_out, r_c, r_m = ref.run(cell.get_weights(), x[:, :batch], part.c, part.h, None, **ref_options(cell))
        np.testing.assert_allclose(outputs, r_out, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(final.c, r_c, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(final.h, r_m, rtol=1e-12, atol=1e-14)
    # Gradients: the batch with zero cotangents on every row but the first
    # gives the batch-1 gradients.
    one = LSTMStateTuple(state.c[:1], state.h[:1])
    (out1, _), back1 = cell.vjp(x[:, :1], one)
    r = rng.standard_normal(out1.shape)
    d_x1, d_s1, d_w1 = back1(r)
    (out_b, _), back_b = cell.vjp(x, state)
    r_b = np.zeros(out_b.shape)
    r_b[:, :1] = r
    d_xb, d_sb, d_wb = back_b(r_b)
    np.testing.assert_allclose(d_xb[:, :1], d_x1, rtol=1e-12, atol=1e-14)
    assert not d_xb[:, 1:].any()
    np.testing.assert_allclose(d_sb.c[:1], d_s1.c, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(d_sb.h[:1], d_s1.h, rtol=1e-12, atol=1e-14)
    for name in d_w1:
        np.testing.assert_allclose(d_wb[name], d_w1[name], rtol=1e-12, atol=1e-14, err_msg=name)


def test_empty_sequence_and_batch():
    rng = np.random.default_rng(4)
    cell = make_cell(rng, num_proj=P)
    state = random_state(rng, cell)
    outputs, final = cell.run(np.zeros((0, B, I)), state)
    assert outputs.shape == (0, B, P)
    np.testing.assert_array_equal(final.c, state.c)
    outputs, final = cell.run(np.zeros((T, 0, I)))
    assert outputs.shape == (T, 0, P) and final.c.shape == (0, H)
    (outputs, final), backward = cell.vjp(np.zeros((0, B, I)), state)
    d_x, d_state, d_w = backward(None, (np.ones((B, H)), None))
    np.testing.assert_array_equal(d_state.c, np.ones((B, H)))
    assert not d_w["kernel"].any()


def test_state_is_tuple_false():
    rng = np.random.default_rng(5)
    cell = make_cell(rng, state_is_tuple=False, num_proj=P, use_peepholes=True)
    x = rng.standard_normal((T, B, I))
    s = random_state(rng, cell)
    flat = np.concatenate([s.c, s.h], axis=1)
    outputs, final = cell.run(x, flat, sequence_length=[T, 1, 0])
    r_out, r_c, r_m = ref.run(cell.get_weights(), x, s.c, s.h, [T, 1, 0], **ref_options(cell))
    assert final.shape == (B, H + P)
    np.testing.assert_allclose(final, np.concatenate([r_c, r_m], axis=1), rtol=1e-12, atol=1e-14)
    out, new = cell(x[0], flat)
    assert new.shape == (B, H + P)
    with pytest.raises(TypeError, match="one \\[B, 5\\] array"):
        cell(x[0], s)


# ----------------------------------------------------------------------------------------------------
# Golden values of TensorFlow's own tests (docs/specification.rst, "Tolerances and reference values")
# ----------------------------------------------------------------------------------------------------


def test_cell_clip_zero_gives_zero_outputs():
    rng = np.random.default_rng(6)
    cell = make_cell(rng, use_peepholes=True, cell_clip=0.0)
    x = rng.standard_normal((T, B, I))
    (outputs, final), backward = cell.vjp(x)
    assert not outputs.any() and not final.c.any() and not final.h.any()
    d_x, d_state, d_w = backward(np.ones_like(outputs), (np.ones((B, H)), np.ones((B, H))))
    # c is clipped to 0 everywhere: nothing flows through the cell.
    assert not d_x.any() and not d_state.c.any()


def test_two_stacked_cells_golden_values():
    x = np.ones((1, 2), np.float32)
    state = LSTMStateTuple(np.full((1, 2), 0.1, np.float32), np.full((1, 2), 0.1, np.float32))
    expected = [(0.68967271, 0.44848421), (0.39897051, 0.24024698)]
    inputs = x
    for layer in range(2):
        cell = LSTMCell(2, dtype=np.float32)
        cell.set_weights({"kernel": np.full((4, 8), 0.5, np.float32), "bias": np.zeros(8, np.float32)})
        inputs, new = cell(inputs, state)
        np.testing.assert_allclose(new.c, np.full((1, 2), expected[layer][0]), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(new.h, np.full((1, 2), expected[layer][1]), rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------------------------------
# Gradients: finite differences of the float64 reference
# ----------------------------------------------------------------------------------------------------


def _numeric_grad(f, a, eps=1e-6):
    g = np.zeros_like(a)
    for idx in np.ndindex(a.shape):
        keep = a[idx]
        a[idx] = keep + eps
        up = f()
        a[idx] = keep - eps
        down = f()
        a[idx] = keep
        g[idx] = (up - down) / (2 * eps)
    return g


GRAD_COMBOS = COMBOS + [{"activation": a, "use_peepholes": True} for a in ("sigmoid", "softplus", "selu", "linear")]


@pytest.mark.parametrize("options", GRAD_COMBOS)
def test_gradients_match_finite_differences(options):
    rng = np.random.default_rng(7)
    cell = make_cell(rng, **options)
    x = rng.standard_normal((T, B, I))
    state = random_state(rng, cell)
    lengths = np.array([T, 0, 2])
    (outputs, final), backward = cell.vjp(x, state, lengths)
    R = rng.standard_normal(outputs.shape)
    Rc, Rh = rng.standard_normal(final.c.shape), rng.standard_normal(final.h.shape)
    d_x, d_state, d_w = backward(R, LSTMStateTuple(Rc, Rh))
    weights = cell.get_weights()
    c0, h0 = state.c.copy(), state.h.copy()
    opts = ref_options(cell)

    def loss():
        out, c, m = ref.run(weights, x, c0, h0, lengths, **opts)
        return (out * R).sum() + (c * Rc).sum() + (m * Rh).sum()

    if cell.cell_clip is not None:
        # The clip must be active somewhere, and no cell value at a kink.
        _, c_all = _cells(weights, x, c0, h0, lengths, opts)
        assert (np.abs(c_all) > cell.cell_clip + 1e-3).any()
        assert (np.abs(np.abs(c_all) - cell.cell_clip) > 1e-4).all()
    assert set(d_w) == set(weights)
    for name, value in weights.items():
        np.testing.assert_allclose(d_w[name], _numeric_grad(loss, value), rtol=1e-6, atol=1e-8, err_msg=name)
    np.testing.assert_allclose(d_x, _numeric_grad(loss, x), rtol=1e-6, atol=1e-8, err_msg="inputs")
    np.testing.assert_allclose(d_state.c, _numeric_grad(loss, c0), rtol=1e-6, atol=1e-8, err_msg="c0")
    np.testing.assert_allclose(d_state.h, _numeric_grad(loss, h0), rtol=1e-6, atol=1e-8, err_msg="h0")
    assert not d_x[2:, 2].any() and not d_x[:, 1].any()


def _cells(weights, x, c0, h0, lengths, opts):
    """Unclipped cell values of every active step (to check the clip is exercised)."""
    raw = []
    c, m = c0, h0
    for t in range(x.shape[0]):
        no_clip = dict(opts, cell_clip=None)
        c_raw, _ = ref.step(weights, x[t], c, m, **no_clip)
        raw.append(c_raw[t < np.asarray(lengths)])
        c_new, m_new = ref.step(weights, x[t], c, m, **opts)
        live = (t < np.asarray(lengths))[:, None]
        c, m = np.where(live, c_new, c), np.where(live, m_new, m)
    return None, np.concatenate([r.ravel() for r in raw])


def test_gradient_defaults_and_repeat_calls():
    rng = np.random.default_rng(8)
    cell = make_cell(rng, num_proj=P)
    x = rng.standard_normal((T, B, I))
    (outputs, final), backward = cell.vjp(x)
    d_x, d_state, d_w = backward()
    assert not d_x.any() and not d_state.c.any() and not d_w["kernel"].any()
    g1 = backward(np.ones_like(outputs))
    g2 = backward(np.ones_like(outputs))
    np.testing.assert_array_equal(g1[0], g2[0])
    np.testing.assert_array_equal(g1[2]["projection/kernel"], g2[2]["projection/kernel"])
    only_h = backward(None, (None, np.ones((B, P))))
    only_out = backward(np.pad(np.ones((1, B, P)), ((T - 1, 0), (0, 0), (0, 0))))
    np.testing.assert_allclose(only_h[0], only_out[0], rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch, inputs", [(1, 8), (3, 8), (3, 300)])
@pytest.mark.parametrize("use_peepholes", [False, True])
def test_cells_with_the_ops_options_run_the_ops_kernels(dtype, batch, inputs, use_peepholes):
    """No projection, tanh, sigmoid, no clip, whole sequences: the fused ops' kernels, bit for bit.

    ``run``, ``vjp`` and its backward give the bits of ``block_lstm`` and
    ``block_lstm_grad`` (the final state's gradients joining the last
    step's), and the backward is right (finite differences).
    """
    rng = np.random.default_rng(11)
    steps, units = 4, 16
    cell = LSTMCell(units, use_peepholes=use_peepholes, forget_bias=0.5, dtype=dtype, seed=2)
    x = rng.standard_normal((steps, batch, inputs)).astype(dtype)
    cell.build(inputs)
    w = cell.get_weights()
    h0 = rng.standard_normal((batch, units)).astype(dtype)
    c0 = rng.standard_normal((batch, units)).astype(dtype)
    zeros = np.zeros(units, dtype)
    ops = nblstm.block_lstm(x, c0, h0, w["kernel"], w["bias"], w.get("w_i_diag", zeros), w.get("w_f_diag", zeros),
                            w.get("w_o_diag", zeros), forget_bias=0.5, use_peephole=use_peepholes, layout="icfo")
    outputs, final = cell.run(x, LSTMStateTuple(c0, h0))
    (vjp_outputs, vjp_final), backward = cell.vjp(x, LSTMStateTuple(c0, h0))
    for a, b in ((outputs, ops.h), (final.c, ops.cs[-1]), (vjp_outputs, outputs), (vjp_final.c, final.c),
                 (vjp_final.h, final.h)):
        np.testing.assert_array_equal(a, b)
    d_out = rng.standard_normal(outputs.shape).astype(dtype)
    d_c, d_h = (rng.standard_normal((batch, units)).astype(dtype) for _ in range(2))
    d_x, d_state, d_w = backward(d_out, LSTMStateTuple(d_c, d_h))
    h_grad, cs_grad = d_out.copy(), np.zeros_like(d_out)
    h_grad[-1] += d_h
    cs_grad[-1] = d_c
    grads = nblstm.block_lstm_grad(x, c0, h0, w["kernel"], ops, cs_grad=cs_grad, h_grad=h_grad,
                                   wci=w.get("w_i_diag", zeros), wcf=w.get("w_f_diag", zeros),
                                   wco=w.get("w_o_diag", zeros), use_peephole=use_peepholes, layout="icfo")
    for a, b in ((d_x, grads.x_grad), (d_state.c, grads.cs_prev_grad), (d_state.h, grads.h_prev_grad),
                 (d_w["kernel"], grads.w_grad), (d_w["bias"], grads.b_grad)):
        np.testing.assert_array_equal(a, b)
    if use_peepholes:
        np.testing.assert_array_equal(d_w["w_f_diag"], grads.wcf_grad)
    if dtype == np.float64:
        d_x, _, d_w = backward(d_out)
        eps = 1e-6
        for index in ((0, 0, 1), (steps - 1, batch - 1, inputs - 1)):
            plus, minus = x.copy(), x.copy()
            plus[index] += eps
            minus[index] -= eps
            numeric = ((cell.vjp(plus, LSTMStateTuple(c0, h0))[0][0] * d_out).sum()
                       - (cell.vjp(minus, LSTMStateTuple(c0, h0))[0][0] * d_out).sum()) / (2 * eps)
            np.testing.assert_allclose(d_x[index], numeric, rtol=1e-6, atol=1e-9)
        again = backward(d_out)  # the forward recomputed on the same kernel: the same gradients
        np.testing.assert_array_equal(again[0], d_x)
        np.testing.assert_array_equal(again[2]["kernel"], d_w["kernel"])


@pytest.mark.parametrize("batch, inputs, lengths", [(1, 5, [3]), (1, 5, [0]), (4, 5, [6, 0, 3, 1]),
                                                    (3, 300, [2, 6, 0]),
                                                    # longest first: the finished rows are skipped (fused._running)
                                                    (9, 5, [6, 6, 5, 4, 3, 3, 2, 1, 0])])
@pytest.mark.parametrize("order", ["lengths", "reverse", "mask", "mask reverse"])
@pytest.mark.parametrize("use_peepholes", [False, True])
def test_cells_with_lengths_run_the_ops_kernels(monkeypatch, batch, inputs, lengths, order, use_peepholes):
    """Per-example lengths, reversal and masks on the fused ops' kernels: the state carried past each length
    (or through each masked time), outputs zero there (or repeated), and the gradients of the carried state
    (the final state's included) reach each example's last step; with a schedule the steps read the inputs
    in step order.

    Against the float64 reference, finite differences, and the cell's own kernels (a clip too large to act
    keeps the cell on them); ``run`` (inference) gives the bits of ``vjp``.
    """
    from nblstm.cpu import cell as cpu_cell

    calls = []
    fused_forward = cpu_cell.fused_forward
    monkeypatch.setattr(cpu_cell, "fused_forward", lambda *a, **k: calls.append(1) or fused_forward(*a, **k))
    rng = np.random.default_rng(23)
    steps, units = 6, 7
    lengths = np.array(lengths)
    x = rng.standard_normal((steps, batch, inputs))
    cell = LSTMCell(units, use_peepholes=use_peepholes, forget_bias=0.5, seed=4)
    own = LSTMCell(units, use_peepholes=use_peepholes, forget_bias=0.5, seed=4, cell_clip=1e300)
    state = random_state(rng, cell, batch)
    if "mask" in order:  # the lengths' pattern with time 1 flipped: holes, and examples starting masked
        mask = np.arange(steps)[None, :] < lengths[:, None]
        mask[:, 1] = ~mask[:, 1]
        given = {"mask": mask, "reverse": "reverse" in order}
    else:
        given = {"sequence_length": lengths, "reverse": order == "reverse"}
    (outputs, final), backward = cell.vjp(x, state, **given)
    assert calls, "the cell did not run on the fused ops' kernels"
    r_out, r_c, r_h = ref.run(cell.get_weights(), x, state.c, state.h, given.get("sequence_length"),
                              given.get("mask"), given["reverse"], **ref_options(cell))
    for a, b in ((outputs, r_out), (final.c, r_c), (final.h, r_h)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    run_outputs, run_final = cell.run(x, state, **given)
    for a, b in ((run_outputs, outputs), (run_final.c, final.c), (run_final.h, final.h)):
        np.testing.assert_array_equal(a, b)
    d_out = rng.standard_normal(outputs.shape)
    d_final = LSTMStateTuple(rng.standard_normal((batch, units)), rng.standard_normal((batch, units)))
    d_x, d_state, d_w = backward(d_out, d_final)
    calls.clear()
    (_, _), own_backward = own.vjp(x, state, **given)
    assert not calls
    o_x, o_state, o_w = own_backward(d_out, d_final)
    for a, b in ((d_x, o_x), (d_state.c, o_state.c), (d_state.h, o_state.h), *((d_w[k], o_w[k]) for k in d_w)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)

    def loss(x, c0, h0):
        out, fin = cell.run(x, LSTMStateTuple(c0, h0), **given)
        return (out * d_out).sum() + (fin.c * d_final.c).sum() + (fin.h * d_final.h).sum()

    eps = 1e-6
    for name, array, grad in (("x", x, d_x), ("c0", state.c, d_state.c), ("h0", state.h, d_state.h)):
        for index in ((0,) * array.ndim, tuple(n - 1 for n in array.shape)):
            args = {"x": x, "c0": state.c, "h0": state.h}
            plus, minus = array.copy(), array.copy()
            plus[index] += eps
            minus[index] -= eps
            numeric = (loss(**{**args, name: plus}) - loss(**{**args, name: minus})) / (2 * eps)
            np.testing.assert_allclose(grad[index], numeric, rtol=1e-6, atol=1e-8, err_msg=f"{name}{index}")


# ----------------------------------------------------------------------------------------------------
# dtypes
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, rtol, atol", [(np.float32, 1e-5, 1e-6), (np.float16, 8e-3, 8e-3)])
def test_low_precision_dtypes(dtype, rtol, atol):
    rng = np.random.default_rng(9)
    cell = make_cell(rng, dtype=dtype, use_peepholes=True, num_proj=P, cell_clip=0.8)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    state = random_state(rng, cell, dtype=dtype)
    (outputs, final), backward = cell.vjp(x, state, [T, 2, 0])
    assert outputs.dtype == dtype and final.c.dtype == dtype
    r_out, r_c, r_m = ref.run(cell.get_weights(), x, state.c, state.h, [T, 2, 0], **ref_options(cell))
    np.testing.assert_allclose(outputs.astype(np.float64), r_out, rtol=rtol, atol=atol)
    np.testing.assert_allclose(final.c.astype(np.float64), r_c, rtol=rtol, atol=atol)
    d_x, d_state, d_w = backward(np.ones_like(outputs))
    assert d_x.dtype == dtype and d_w["kernel"].dtype == dtype and d_state.h.dtype == dtype
    # Against the float64 cell on the same (rounded) values.
    cell64 = LSTMCell(H, use_peepholes=True, num_proj=P, cell_clip=0.8, dtype=np.float64)
    cell64.set_weights({n: a.astype(np.float64) for n, a in cell.get_weights().items()})
    (_, _), back64 = cell64.vjp(x.astype(np.float64), LSTMStateTuple(*(a.astype(np.float64) for a in state)),
                                [T, 2, 0])
    g64 = back64(np.ones((T, B, P)))
    scale = 10 * atol if dtype == np.float16 else atol * 10
    np.testing.assert_allclose(d_w["kernel"].astype(np.float64), g64[2]["kernel"], rtol=rtol * 10, atol=scale)


def test_dtype_from_first_inputs():
    cell = LSTMCell(2)
    assert cell.dtype is None
    cell(np.ones((1, 3), np.float64), cell.zero_state(1, np.float64))
    assert cell.dtype == np.float64 and cell.input_depth == 3
    assert cell.get_weights()["kernel"].dtype == np.float64
    with pytest.raises(TypeError, match="float64"):
        cell(np.ones((1, 3), np.float32), cell.zero_state(1, np.float32))


# ----------------------------------------------------------------------------------------------------
# Weights: set/get/save/load, no aliasing
# ----------------------------------------------------------------------------------------------------


def test_set_weights_validation():
    cell = LSTMCell(2, use_peepholes=True, dtype=np.float32)
    cell.build(3)
    good = cell.get_weights()
    with pytest.raises(TypeError, match="dict"):
        cell.set_weights(42)
    with pytest.raises(ValueError, match="missing: \\['w_o_diag'\\]"):
        cell.set_weights({k: a for k, a in good.items() if k != "w_o_diag"})
    with pytest.raises(ValueError, match="unexpected: \\['extra'\\]"):
        cell.set_weights({**good, "extra": good["bias"]})
    with pytest.raises(ValueError, match="weights\\['bias'\\] has shape"):
        cell.set_weights({**good, "bias": np.zeros(7, np.float32)})
    with pytest.raises(ValueError, match="input depth 3"):
        cell.set_weights({**good, "kernel": np.zeros((6, 8), np.float32)})
    with pytest.raises(TypeError, match="weights\\['w_f_diag'\\] has dtype float64"):
        cell.set_weights({**good, "w_f_diag": good["w_f_diag"].astype(np.float64)})
    with pytest.raises(TypeError, match="NumPy array"):
        cell.set_weights({**good, "bias": [0.0] * 8})
    with pytest.raises(ValueError, match="non-finite"):
        cell.set_weights({**good, "bias": np.full(8, np.nan, np.float32)})
    with pytest.raises(ValueError, match="no weights yet"):
        LSTMCell(2).get_weights()


def test_weights_are_copied_and_inputs_untouched():
    rng = np.random.default_rng(10)
    cell = make_cell(rng, num_proj=P)
    w = cell.get_weights()
    w["kernel"][:] = 0
    assert cell.get_weights()["kernel"].any()
    mine = {k: a.copy() for k, a in cell.get_weights().items()}
    cell.set_weights(mine)
    mine["kernel"][:] = 0
    assert cell.get_weights()["kernel"].any()
    x = rng.standard_normal((T, B, I))
    state = random_state(rng, cell)
    copies = [x.copy(), state.c.copy(), state.h.copy()]
    (outputs, final), backward = cell.vjp(x, state, [T, 1, 2])
    d_out = np.ones_like(outputs)
    d_c = np.ones((B, H))
    backward(d_out, (d_c, None))
    for a, b in zip((x, state.c, state.h), copies, strict=True):
        np.testing.assert_array_equal(a, b)
    assert (d_out == 1).all() and (d_c == 1).all()


def test_set_weights_invalidates_packed_weights():
    rng = np.random.default_rng(11)
    cell = make_cell(rng)
    x = rng.standard_normal((T, B, I))
    before, _ = cell.run(x)
    w = cell.get_weights()
    w["kernel"] = w["kernel"] * 2
    cell.set_weights(w)
    after, _ = cell.run(x)
    r_out, _, _ = ref.run(w, x, np.zeros((B, H)), np.zeros((B, H)), **ref_options(cell))
    np.testing.assert_allclose(after, r_out, rtol=1e-12, atol=1e-14)
    assert not np.allclose(before, after)


def test_save_and_load(tmp_path):
    rng = np.random.default_rng(12)
    cell = make_cell(rng, use_peepholes=True, num_proj=P, proj_clip=0.5, cell_clip=2.0, activation="softsign",
                     forget_bias=0.25, state_is_tuple=False, name="layer0")
    path = tmp_path / "cell.npz"
    cell.save(path)
    loaded = LSTMCell.load(path)
    assert loaded.get_config() == cell.get_config()
    for n, a in cell.get_weights().items():
        np.testing.assert_array_equal(loaded.get_weights()[n], a)
        assert loaded.get_weights()[n].dtype == a.dtype
    x = rng.standard_normal((T, B, I))
    np.testing.assert_array_equal(loaded.run(x)[0], cell.run(x)[0])
    json.dumps(cell.get_config())
    np.savez(tmp_path / "other.npz", a=np.zeros(1))
    with pytest.raises(ValueError, match="not an LSTMCell file"):
        LSTMCell.load(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="no weights"):
        LSTMCell(2).save(tmp_path / "none.npz")


# ----------------------------------------------------------------------------------------------------
# Validation of the call arguments
# ----------------------------------------------------------------------------------------------------


def test_call_validation():
    rng = np.random.default_rng(13)
    cell = make_cell(rng, num_proj=P)
    x = rng.standard_normal((T, B, I))
    state = cell.zero_state(B, np.float64)
    cases = [
        (lambda: cell.run(x[0]), ValueError, "rank 3"),
        (lambda: cell(x, state), ValueError, "rank 2"),
        (lambda: cell.run(x.tolist()), TypeError, "inputs must be a NumPy array"),
        (lambda: cell.run(x.astype(np.float32)), TypeError, "cell's dtype"),
        (lambda: cell.run(x.astype(np.int64)), TypeError, "inputs has dtype int64"),
        (lambda: cell.run(np.zeros((T, B, 5))), ValueError, "input depth 2"),
        (lambda: cell.run(x, (state.c,)), TypeError, "LSTMStateTuple"),
        (lambda: cell.run(x, np.zeros((B, H + P))), TypeError, "LSTMStateTuple"),
        (lambda: cell.run(x, (state.c[:1], state.h)), ValueError, "initial_state.c has shape"),
        (lambda: cell.run(x, (state.c, np.zeros((B, H)))), ValueError, "initial_state.h has shape"),
        (lambda: cell.run(x, (state.c.astype(np.float32), state.h)), TypeError, "initial_state.c has dtype"),
        (lambda: cell.run(x, (state.c[None], state.h)), ValueError, "rank 2"),
        (lambda: cell(x[0], (state.c, [[0.0]])), TypeError, "state.h must be"),
        (lambda: cell.run(x, sequence_length=[1, 2]), ValueError, "sequence_length has shape"),
        (lambda: cell.run(x, sequence_length=[1, 2, T + 1]), ValueError, "\\[0, T\\] = \\[0, 4\\]"),
        (lambda: cell.run(x, sequence_length=[1, -1, 0]), ValueError, "sequence_length values"),
        (lambda: cell.run(x, sequence_length=np.ones(B)), TypeError, "integer dtype"),
        (lambda: cell.run(x, sequence_length=[1.0, 2, 3]), TypeError, "integers"),
        (lambda: cell.run(x, sequence_length=3), TypeError, "sequence_length"),
        (lambda: cell.run(np.zeros((T, B, 0))), ValueError, "must be > 0"),
    ]
    for call, exc, match in cases:
        with pytest.raises(exc, match=match):
            call()
    (outputs, final), backward = cell.vjp(x)
    for args, exc, match in [
        ((np.ones((T, B, H)),), ValueError, "d_outputs has shape"),
        ((outputs.astype(np.float32),), TypeError, "d_outputs has dtype"),
        ((None, np.ones((B, H + P))), TypeError, "pair"),
        ((None, (np.ones((B, P)), None)), ValueError, "d_final_state.c has shape"),
        ((None, (None, "x")), TypeError, "d_final_state.h"),
    ]:
        with pytest.raises(exc, match=match):
            backward(*args)


# ----------------------------------------------------------------------------------------------------
# TensorFlow and PyTorch fixtures
# ----------------------------------------------------------------------------------------------------


def _load(path):
    if not os.path.exists(path):
        pytest.skip(f"{os.path.relpath(path)} is not there (made by scripts/make_tf_fixtures.py)")
    data = np.load(path, allow_pickle=False)
    return json.loads(str(data["index"])), data


def _tf_cases():
    if not os.path.exists(TF_FIXTURE):
        return ["missing"]
    index, _ = _load(TF_FIXTURE)
    return [case["name"] for case in index["cases"]]


def _torch_cases():
    if not os.path.exists(TORCH_FIXTURE):
        return ["missing"]
    index, _ = _load(TORCH_FIXTURE)
    return [case["name"] for case in index["cases"]]


_TOL = {"float64": (1e-10, 1e-12), "float32": (1e-5, 1e-5), "float16": (1e-2, 1e-2)}


@pytest.mark.parametrize("case_name", _tf_cases())
def test_tensorflow_lstmcell_fixture(case_name):
    index, data = _load(TF_FIXTURE)
    case = next(c for c in index["cases"] if c["name"] == case_name)

    def arr(name):
        return data[f"{case_name}/{name}"]

    dtype = np.dtype(case["dtype"])
    cell = LSTMCell(case["num_units"], use_peepholes=case["use_peepholes"], cell_clip=case["cell_clip"],
                    num_proj=case["num_proj"], proj_clip=case["proj_clip"], forget_bias=case["forget_bias"],
                    state_is_tuple=case["state_is_tuple"], activation=case["activation"], dtype=dtype)
    cell.set_weights({n: arr(n) for n in case["weights"]})
    x = arr("x")
    state = LSTMStateTuple(arr("c0"), arr("h0")) if case["state_is_tuple"] else arr("state0")
    (outputs, final), backward = cell.vjp(x, state)
    rtol, atol = _TOL[case["dtype"]]
    if dtype == np.float16:
        rtol, atol = 8e-3, 8e-4 * 4
    close = dict(rtol=rtol, atol=atol)
    np.testing.assert_allclose(outputs.astype(np.float64), arr("outputs"), err_msg="outputs", **close)
    if case["state_is_tuple"]:
        c_final, h_final = final
        d_final = LSTMStateTuple(arr("Rc"), arr("Rh"))
    else:
        np.testing.assert_allclose(final.astype(np.float64), arr("state_final"), **close)
        c_final, h_final = final[:, :case["num_units"]], final[:, case["num_units"]:]
        d_final = np.concatenate([arr("Rc"), arr("Rh")], axis=1)
    np.testing.assert_allclose(c_final.astype(np.float64), arr("c_final"), err_msg="c_final", **close)
    np.testing.assert_allclose(h_final.astype(np.float64), arr("h_final"), err_msg="h_final", **close)
    # One step at a time through __call__ gives the same.
    step_state = state
    for t in range(x.shape[0]):
        out, step_state = cell(x[t], step_state)
        np.testing.assert_allclose(out.astype(np.float64), arr("outputs")[t], err_msg=f"step {t}", **close)
    d_x, d_state, d_w = backward(arr("R"), d_final)
    gtol = dict(rtol=max(rtol, 1e-5) * (3 if dtype == np.float16 else 1), atol=atol * 3 if dtype == np.float16
                else max(atol, 1e-5))
    np.testing.assert_allclose(d_x.astype(np.float64), arr("grad/x"), err_msg="grad/x", **gtol)
    if case["state_is_tuple"]:
        d_c0, d_h0 = d_state
    else:
        d_c0, d_h0 = d_state[:, :case["num_units"]], d_state[:, case["num_units"]:]
    np.testing.assert_allclose(d_c0.astype(np.float64), arr("grad/c0"), err_msg="grad/c0", **gtol)
    np.testing.assert_allclose(d_h0.astype(np.float64), arr("grad/h0"), err_msg="grad/h0", **gtol)
    for n in case["weights"]:
        np.testing.assert_allclose(d_w[n].astype(np.float64), arr(f"grad/{n}"), err_msg=f"grad/{n}", **gtol)


@pytest.mark.parametrize("case_name", _torch_cases())
def test_torch_lstm_fixture(case_name):
    index, data = _load(TORCH_FIXTURE)
    case = next(c for c in index["cases"] if c["name"] == case_name)

    def arr(name):
        return data[f"{case_name}/{name}"]

    state_dict = {n: arr(n) for n in case["parameters"]}
    cell = LSTMCell.from_torch(state_dict)
    assert cell.forget_bias == 0.0 and cell.num_proj == (case["proj_size"] or None)
    x = arr("x")
    (outputs, final), backward = cell.vjp(x, LSTMStateTuple(arr("c0")[0], arr("h0")[0]))
    rtol, atol = _TOL[case["dtype"]]
    np.testing.assert_allclose(outputs, arr("output"), rtol=rtol, atol=atol)
    np.testing.assert_allclose(final.h, arr("h_n")[0], rtol=rtol, atol=atol)
    np.testing.assert_allclose(final.c, arr("c_n")[0], rtol=rtol, atol=atol)
    d_x, d_state, d_w = backward(arr("R"), LSTMStateTuple(arr("Rc")[0], arr("Rh")[0]))
    gtol = dict(rtol=max(rtol, 1e-5), atol=max(atol, 1e-5))
    np.testing.assert_allclose(d_x, arr("grad/x"), **gtol)
    np.testing.assert_allclose(d_state.c, arr("grad/c0")[0], **gtol)
    np.testing.assert_allclose(d_state.h, arr("grad/h0")[0], **gtol)
    # The cell's weight gradients in PyTorch's layout.
    d_torch = nblstm.convert.lstmcell_to_torch(d_w, forget_bias=0.0)
    inputs = x.shape[2]
    np.testing.assert_allclose(d_torch["weight_ih_l0"], arr("grad/weight_ih_l0"), **gtol)
    np.testing.assert_allclose(d_torch["weight_hh_l0"], arr("grad/weight_hh_l0"), **gtol)
    np.testing.assert_allclose(d_torch["bias_ih_l0"], arr("grad/bias_ih_l0"), **gtol)
    np.testing.assert_allclose(d_torch["bias_ih_l0"], arr("grad/bias_hh_l0"), **gtol)
    if case["proj_size"]:
        np.testing.assert_allclose(d_torch["weight_hr_l0"], arr("grad/weight_hr_l0"), **gtol)
    # And back: to_torch reproduces the parameters (bias summed into bias_ih).
    back = cell.to_torch()
    np.testing.assert_array_equal(back["weight_ih_l0"], state_dict["weight_ih_l0"])
    np.testing.assert_allclose(back["bias_ih_l0"], state_dict["bias_ih_l0"] + state_dict["bias_hh_l0"])
    assert back["weight_ih_l0"].shape[1] == inputs


# ----------------------------------------------------------------------------------------------------
# Conversions at the cell level
# ----------------------------------------------------------------------------------------------------


def test_keras_round_trip_and_refusals():
    rng = np.random.default_rng(14)
    cell = make_cell(rng, forget_bias=1.0)
    kernel, recurrent, bias = cell.to_keras()
    assert kernel.shape == (I, 4 * H) and recurrent.shape == (H, 4 * H)
    back = LSTMCell.from_keras([kernel, recurrent, bias])
    x = rng.standard_normal((T, B, I))
    np.testing.assert_allclose(back.run(x)[0], cell.run(x)[0], rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="peepholes"):
        make_cell(rng, use_peepholes=True).to_torch()
    with pytest.raises(ValueError, match="num_proj"):
        make_cell(rng, num_proj=P).to_keras()
    with pytest.raises(ValueError, match="activation 'relu'"):
        make_cell(rng, activation="relu").to_torch()
    with pytest.raises(ValueError, match="cell_clip"):
        make_cell(rng, cell_clip=1.0).to_torch()


def test_to_block_lstm_matches_cell():
    rng = np.random.default_rng(15)
    cell = make_cell(rng, use_peepholes=True, cell_clip=0.6, forget_bias=0.7)
    x = rng.standard_normal((T, B, I))
    state = random_state(rng, cell)
    state = LSTMStateTuple(state.c, rng.standard_normal((B, H)))
    outputs, final = cell.run(x, state)
    args = cell.to_block_lstm()
    fused = nblstm.block_lstm(x, state.c, state.h, **args)
    np.testing.assert_allclose(fused.h, outputs, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(fused.cs[-1], final.c, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("num_proj", [None, 4])
def test_parallel_chunks_match_one_chunk(num_proj):
    """The multi-chunk (prange) paths agree with the one-chunk path, uneven chunks included."""
    from nblstm.cpu import cell as cpu_cell
    from nblstm.options import CellOptions

    rng = np.random.default_rng(16)
    cell = make_cell(rng, num_units=5, num_proj=num_proj, use_peepholes=True, cell_clip=0.7, proj_clip=0.3)
    weights = cell.get_weights()
    x = rng.standard_normal((T, B, I))
    depth = cell.output_size
    c0, m0 = rng.standard_normal((B, 5)), rng.standard_normal((B, depth)) * 0.3
    lengths = np.array([T, 0, 2], np.int64)
    d_out = rng.standard_normal((T, B, depth))
    d_c, d_m = rng.standard_normal((B, 5)), rng.standard_normal((B, depth))
    results = []
    threads = numba.get_num_threads()
    # (chunks, threads): more chunks than threads, and 4 chunks on one thread: the workers of
    # the time loops claim chunks (nblstm.cpu.sync), so one thread does them all.
    try:
        for chunks, n in ((1, threads), (2, threads), (3, threads), (4, 1)):
            numba.set_num_threads(n)
            packed = cpu_cell.PackedWeights(weights, I, B, num_chunks=chunks)
            assert len(packed.bounds) == chunks + 1
            saved = cpu_cell.sequence_forward(x, c0, m0, packed, lengths,
                                              CellOptions(1.0, 0.7, 0.3 if num_proj else None, 0))
            grads = cpu_cell.sequence_backward(saved, packed, d_out, d_c, d_m)
            results.append((cpu_cell.masked_outputs(saved), *cpu_cell.final_state(saved), *grads[:3], grads[3]))
    finally:
        numba.set_num_threads(threads)
    r_out, r_c, r_m = ref.run(weights, x, c0, m0, lengths, **ref_options(cell))
    np.testing.assert_allclose(results[0][0], r_out, rtol=1e-12, atol=1e-14)
    for other in results[1:]:
        for a, b in zip(results[0][:6], other[:6], strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
        for n in weights:
            np.testing.assert_allclose(other[6][n], results[0][6][n], rtol=1e-12, atol=1e-14, err_msg=n)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("config", [
    {},
    {"cell_clip": 0.4},
    {"num_proj": 5, "proj_clip": 0.3, "use_peepholes": True},
    {"num_proj": 5, "activation": "relu", "cell_clip": 2.0},
    {"activation": "softsign", "recurrent_activation": "hard_sigmoid", "use_peepholes": True},
], ids=["ops-options", "clip", "projection", "projection-relu", "softsign-peepholes"])
@pytest.mark.parametrize("steps", [1, 2, 5])
def test_inference_keeps_only_what_it_returns_and_gives_the_training_bits(dtype, config, steps):
    """``run`` (no gradient) writes only the outputs and the final state, and gives the bits of ``vjp``'s forward,
    which keeps every step's values for the backward: whole sequences, lengths, reversed."""
    from nblstm.cpu import cell as cpu_cell
    from nblstm.options import CellOptions

    rng = np.random.default_rng(5)
    batch, inputs, units = 3, 4, 7
    cell = LSTMCell(units, dtype=dtype, seed=3, **config)
    x = rng.standard_normal((steps, batch, inputs)).astype(dtype)
    for kwargs in ({}, {"sequence_length": np.array([steps, 0, max(steps - 1, 1)])}, {"reverse": True}):
        outputs, final = cell.run(x, **kwargs)
        (vjp_outputs, vjp_final), _ = cell.vjp(x, **kwargs)
        for a, b in ((outputs, vjp_outputs), (final[0], vjp_final[0]), (final[1], vjp_final[1])):
            np.testing.assert_array_equal(a, b)
    # What the inference path keeps: h and two steps of c (one step of the cell's scratch).
    weights = {k: np.ascontiguousarray(v, dtype) for k, v in cell.get_weights().items()}
    depth = config.get("num_proj", units)
    packed = cpu_cell.PackedWeights(weights, inputs, batch)
    zeros_c, zeros_h = np.zeros((batch, units), dtype), np.zeros((batch, depth), dtype)
    saved = cpu_cell.sequence_forward(x, zeros_c, zeros_h, packed, np.full(batch, steps, np.int64),
                                      CellOptions(cell_clip=0.5), save=False)
    assert saved["c"].shape == (2, batch, units) and saved["h"].shape == (steps, batch, depth)
    assert saved["c_raw"].shape[0] == saved["ac"].shape[0] == 1


@pytest.mark.parametrize("config", [dict(), dict(state_is_tuple=False), dict(num_proj=3, dtype=np.float64),
                                    dict(dtype=np.float16)], ids=str)
@pytest.mark.parametrize("reverse", [False, True])
def test_run_with_lengths_runs_longest_first_with_the_same_bits(config, reverse):
    """``run`` sorts the examples by length (their finished rows skipped by the kernels) and puts them back: the
    bits of ``vjp``'s forward, which keeps the caller's order; the caller's arrays untouched."""
    cell = LSTMCell(5, seed=2, **config)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 7, 4)).astype(cell.dtype or np.float32)
    lengths = [2, 6, 0, 5, 6, 1, 3]
    state = cell.zero_state(7, x.dtype)
    state = (LSTMStateTuple(*(rng.standard_normal(a.shape).astype(x.dtype) for a in state)) if cell.state_is_tuple
             else rng.standard_normal(state.shape).astype(x.dtype))
    given = [x.copy(), *(np.array(a, copy=True) for a in (state if cell.state_is_tuple else [state]))]
    out, final = cell.run(x, state, sequence_length=lengths, reverse=reverse)
    (t_out, t_final), _ = cell.vjp(x, state, sequence_length=lengths, reverse=reverse)
    pairs = [(out, t_out)] + (list(zip(final, t_final, strict=True)) if cell.state_is_tuple else [(final, t_final)])
    for a, b in pairs:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))
    for a, b in zip([x, *(state if cell.state_is_tuple else [state])], given, strict=True):
        np.testing.assert_array_equal(a, b)
