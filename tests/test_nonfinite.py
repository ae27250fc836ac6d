"""NaN and infinity in inputs, weights and incoming gradients.

The kernels have no data-dependent control flow (the time loop and the
hidden units are counted, clipping is two comparisons), so a non-finite
value cannot make them hang or crash: it propagates through the arithmetic
as IEEE 754 says. The float64 kernels agree with the float64 reference on
where every output is NaN, +inf or -inf, and so do the float32 kernels
(float16 is computed in float32): their gate nonlinearities are rational
approximations that saturate to exactly 0, 1 and -1
(:func:`test_float32_gates_saturate_exactly`).
"""

import threading
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import nblstm
from nblstm import reference as ref
from tests.test_properties import (
    CELL_GRAD_NAMES,
    GRAD_NAMES,
    OUTPUT_NAMES,
    as_single_step,
    examples,
    make_arrays,
    reference_cell_grad,
)

#: dtypes whose kernels reproduce the reference's NaN/+inf/-inf pattern exactly: all of them, since the
#: float32 gates saturate to exactly 0 and 1 (test_float32_gates_saturate_exactly).
EXACT_DTYPES = (np.float64, np.float32, np.float16)
TOL = {np.float64: 1e-9, np.float32: 1e-4, np.float16: 2e-2}
SPECIALS = (np.nan, np.inf, -np.inf)


def check_nonfinite(actual, expected, dtype, name):
    """Compare a kernel result with the float64 reference, NaN and infinities included."""
    got = np.asarray(actual, np.float64)
    assert got.shape == expected.shape, name
    if np.dtype(dtype).type in EXACT_DTYPES:
        for mask in (np.isnan, np.isposinf, np.isneginf):
            np.testing.assert_array_equal(mask(got), mask(expected), err_msg=f"{name}: {mask.__name__} differs")
    else:
        spurious = ~np.isfinite(got) & np.isfinite(expected)
        assert not spurious.any(), f"{name}: non-finite where the reference is finite: {np.argwhere(spurious)}"
    both = np.isfinite(got) & np.isfinite(expected)
    tol = TOL[np.dtype(dtype).type]
    np.testing.assert_allclose(got[both], expected[both], rtol=tol, atol=tol * (1 + np.abs(expected[both]).max(
        initial=0.0)), err_msg=name)


@st.composite
def poisoned_problems(draw):
    dims = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(0, 3)), draw(st.integers(1, 4)))
    dtype = draw(st.sampled_from([np.float16, np.float32, np.float64]))
    a = make_arrays(draw(st.integers(0, 2**32 - 1)), *dims, dtype, 1.0)
    names = ["x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco", "cs_grad", "h_grad"]
    poisoned = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(names))
        arr = a[name]
        if arr.size:
            index = draw(st.integers(0, arr.size - 1))
            value = draw(st.sampled_from(SPECIALS))
            arr.flat[index] = value
            poisoned.append((name, np.unravel_index(index, arr.shape), value))
    return dims, dtype, a, poisoned


@examples(3)
@given(poisoned_problems(), st.booleans(), st.sampled_from([None, 1.0, -1.0, np.inf]),
       st.sampled_from(["ifco", "icfo"]), st.sampled_from([0.0, 1.0, np.inf, -np.inf]), st.booleans())
def test_non_finite_values_propagate_as_in_the_reference(problem, use_peephole, cell_clip, layout, forget_bias,
                                                          single):
    _, dtype, a, _ = problem
    clip = -1.0 if cell_clip is None else cell_clip
    peeps = (a["wci"], a["wcf"], a["wco"])
    if single:
        a = as_single_step(a)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the kernels warn about nothing
        options = {"forget_bias": forget_bias, "cell_clip": cell_clip, "use_peephole": use_peephole, "layout": layout}
        if single:
            step = nblstm.lstm_block_cell(a["x"][0], a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, **options)
            fwd = nblstm.BlockLSTMOutput(*(o[None] for o in step))
        else:
            fwd = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, **options)
        if single:
            outputs = list(step)
            grads = nblstm.lstm_block_cell_grad(a["x"][0], a["cs_prev"], a["h_prev"], a["w"], outputs,
                                                a["cs_grad"][0], a["h_grad"][0], *peeps, use_peephole=use_peephole,
                                                layout=layout)
        else:
            grads = nblstm.block_lstm_grad(a["x"], a["cs_prev"], a["h_prev"], a["w"], fwd, a["cs_grad"], a["h_grad"],
                                           *peeps, use_peephole=use_peephole, layout=layout)
    with np.errstate(all="ignore"):
        expected = ref.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, None, forget_bias, clip,
                                  use_peephole, layout)
        if single:
            expected_grads = reference_cell_grad(a["x"][0], a["cs_prev"], a["h_prev"], a["w"], *peeps, outputs,
                                                 a["cs_grad"][0], a["h_grad"][0], use_peephole, layout)
        else:
            expected_grads = ref.block_lstm_grad(a["x"], a["cs_prev"], a["h_prev"], a["w"], *peeps, fwd, a["cs_grad"],
                                                 a["h_grad"], None, use_peephole, layout)
    for name in OUTPUT_NAMES:
        check_nonfinite(getattr(fwd, name), expected[name], dtype, name)
    for name in CELL_GRAD_NAMES if single else GRAD_NAMES:
        check_nonfinite(getattr(grads, name), expected_grads[name], dtype, name)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_nan_in_one_input_poisons_its_example_from_that_step_on(dtype):
    a = make_arrays(1, 4, 3, 2, 5, dtype, 1.0)
    a["x"][2, 1, 0] = np.nan
    out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
    for name in OUTPUT_NAMES:
        value = getattr(out, name)
        assert np.isfinite(value[:2]).all(), f"{name}: steps before the NaN are unaffected"
        assert np.isfinite(value[:, [0, 2]]).all(), f"{name}: other examples are unaffected"
        assert np.isnan(value[2:, 1]).all(), f"{name}: the example is NaN from the step of the NaN on"
    grads = nblstm.block_lstm_grad(a["x"], a["cs_prev"], a["h_prev"], a["w"], out, a["cs_grad"], a["h_grad"])
    # Backward runs from the last step to the first: the NaN reaches every step of its example and,
    # through the sums over the batch, every weight gradient.
    assert np.isnan(grads.x_grad[:, 1]).all() and np.isfinite(grads.x_grad[:, [0, 2]]).all()
    assert np.isnan(grads.cs_prev_grad[1]).all() and np.isfinite(grads.cs_prev_grad[[0, 2]]).all()
    assert np.isnan(grads.w_grad).all() and np.isnan(grads.b_grad).all()


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_clipping_bounds_an_infinite_cell_and_keeps_nan(dtype):
    a = make_arrays(2, 3, 2, 2, 3, dtype, 1.0)
    a["cs_prev"][0, :] = np.inf
    a["cs_prev"][1, :] = np.nan
    out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], forget_bias=1.0, cell_clip=2.0)
    # inf * f with 0 < f: +inf, clipped to the bound: the example is finite again from step 0 on.
    np.testing.assert_array_equal(out.cs[0, 0], np.full(3, 2.0, dtype))
    assert np.isfinite(out.h[:, 0]).all()
    # Clipping is two comparisons, both false for NaN: NaN stays NaN.
    assert np.isnan(out.cs[:, 1]).all() and np.isnan(out.h[:, 1]).all()


def test_infinite_options_and_nan_options():
    a = make_arrays(3, 3, 2, 2, 3, np.float64, 1.0)
    core = (a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
    no_clip = nblstm.block_lstm(*core, cell_clip=None)
    inf_clip = nblstm.block_lstm(*core, cell_clip=np.inf)
    for x, y in zip(no_clip, inf_clip, strict=True):
        np.testing.assert_array_equal(x, y)  # an infinite bound clips nothing
    open_gate = nblstm.block_lstm(*core, forget_bias=np.inf)
    np.testing.assert_array_equal(open_gate.f, np.ones_like(open_gate.f))
    closed_gate = nblstm.block_lstm(*core, forget_bias=-np.inf)
    np.testing.assert_array_equal(closed_gate.f, np.zeros_like(closed_gate.f))
    for option in ("forget_bias", "cell_clip"):
        with pytest.raises(ValueError, match="NaN"):
            nblstm.block_lstm(*core, **{option: np.nan})


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_float32_gates_saturate_exactly(dtype):
    a = make_arrays(4, 1, 1, 1, 2, dtype, 1.0)
    a["x"][...] = np.inf
    a["w"][...] = 1.0
    a["w"][0, 2:4] = -1.0  # ifco: the forget gate's pre-activation is -inf for unit 0 ... 1
    a["b"][...] = 0
    out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
    assert out.i[0, 0, 0] == 1 and out.o[0, 0, 0] == 1 and out.ci[0, 0, 0] == 1
    assert out.f[0, 0, 0] == 0
    a["cs_prev"][...] = np.inf
    out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
    assert np.isnan(out.cs[0, 0, 0]) and np.isnan(out.h[0, 0, 0]), "0 * inf is NaN"


def test_non_finite_inputs_never_hang():
    """A batch of poisoned calls finishes well within a generous deadline (checked from another thread)."""
    rng = np.random.default_rng(5)
    errors = []

    def work():
        try:
            for k in range(60):
                dtype = (np.float32, np.float64)[k % 2]
                a = make_arrays(k, 3, 4, 3, 16, dtype, 1.0)
                for name in ("x", "w", "cs_prev", "b"):
                    a[name].flat[rng.integers(a[name].size, size=3)] = rng.choice(SPECIALS, 3)
                out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], cell_clip=1.0)
                nblstm.block_lstm_grad(a["x"], a["cs_prev"], a["h_prev"], a["w"], out, a["cs_grad"], a["h_grad"])
        except BaseException as exc:  # reported below
            errors.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the kernels did not finish on non-finite inputs"
    assert not errors, errors
