"""nblstm.jit.cuda: device functions called from a user's own @cuda.jit kernels, against the CPU functions.

In numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the device functions
give the CPU functions' bits: the same gate maths (:mod:`nblstm.spec`) and the
same fused multiply-adds in the same order. On a GPU the compiler may fuse
other multiplies and adds, so the results agree to rounding there; the
PTX check (a GPU machine, not the simulator) compiles a user's kernels.
"""

import os
import re

import numpy as np
import pytest
from numba import cuda, types

import nblstm.jit as lstm
from nblstm.jit import cuda as jc

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
B, I, H = 3, 4, 5
T = 3
DTYPES = [np.float32, np.float64]
TOL = {np.float32: 2e-6, np.float64: 1e-13}


def _problem(dtype, seed=0):
    rng = np.random.default_rng(seed)
    p = {
        "x": rng.standard_normal((T, B, I)),
        "cs_prev": rng.standard_normal((B, H)),
        "h_prev": rng.uniform(-1, 1, (B, H)),
        "w": rng.standard_normal((I + H, 4 * H)) * 0.4,
        "b": rng.standard_normal(4 * H) * 0.3,
        "wci": rng.standard_normal(H) * 0.5,
        "wcf": rng.standard_normal(H) * 0.5,
        "wco": rng.standard_normal(H) * 0.5,
    }
    return {k: v.astype(dtype) for k, v in p.items()}


def _same(got, want, dtype, what=""):
    if SIMULATOR:
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype], err_msg=what)


def _grid(rows, cols):
    return (-(-rows // 4), -(-cols // 8)), (4, 8)


@cuda.jit
def _train_step_kernel(x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout, i, cs,
                       f, o, ci, co, h):
    row, unit = cuda.grid(2)
    if row < x.shape[0] and unit < cs_prev.shape[1]:
        jc.lstm_step_train_at(row, unit, x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole,
                              layout, i, cs, f, o, ci, co, h)


@cuda.jit
def _step_kernel(x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout, cs, h):
    row, unit = cuda.grid(2)
    if row < x.shape[0] and unit < cs_prev.shape[1]:
        jc.lstm_step_at(row, unit, x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole,
                        layout, cs, h)


@cuda.jit
def _grad_kernel(cs_prev, i, cs, f, o, ci, co, cs_grad, h_grad, wci, wcf, wco, use_peephole, layout, cs_prev_grad,
                 dicfo, peephole_grads):
    row, unit = cuda.grid(2)
    if row < cs_prev.shape[0] and unit < cs_prev.shape[1]:
        gi, gf, go = jc.lstm_step_grad_at(row, unit, cs_prev, i, cs, f, o, ci, co, cs_grad, h_grad, wci, wcf, wco,
                                          use_peephole, layout, cs_prev_grad, dicfo)
        cuda.atomic.add(peephole_grads, (0, unit), gi)
        cuda.atomic.add(peephole_grads, (1, unit), gf)
        cuda.atomic.add(peephole_grads, (2, unit), go)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", [lstm.IFCO, lstm.ICFO])
@pytest.mark.parametrize("forget_bias, cell_clip, use_peephole", [(0.0, 0.0, False), (1.0, 0.6, True)])
def test_a_users_step_kernel_matches_the_cpu_step(dtype, layout, forget_bias, cell_clip, use_peephole):
    p = _problem(dtype)
    args = (p["x"][0], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"], forget_bias,
            cell_clip, use_peephole, layout)
    expected = [np.empty((B, H), dtype) for _ in range(7)]
    lstm.lstm_step_train(*args, *expected)
    outs = [np.full((B, H), np.nan, dtype) for _ in range(7)]
    _train_step_kernel[_grid(B, H)](*args, *outs)
    for name, got, want in zip("i cs f o ci co h".split(), outs, expected):
        _same(got, want, dtype, name)
    cs, h = np.full((B, H), np.nan, dtype), np.full((B, H), np.nan, dtype)
    _step_kernel[_grid(B, H)](*args, cs, h)
    _same(cs, expected[1], dtype, "cs")
    _same(h, expected[6], dtype, "h")
    # The gradient of the step: the gate gradients written, the peephole terms summed by the kernel.
    rng = np.random.default_rng(1)
    cs_grad, h_grad = (rng.standard_normal((B, H)).astype(dtype) for _ in range(2))
    grad_args = (p["cs_prev"], *expected[:6], cs_grad, h_grad, p["wci"], p["wcf"], p["wco"], use_peephole, layout)
    want = [np.empty((B, H), dtype), np.empty((B, 4 * H), dtype), *(np.zeros(H, dtype) for _ in range(3))]
    lstm.lstm_step_grad(*grad_args, *want)
    cs_prev_grad, dicfo = np.full((B, H), np.nan, dtype), np.full((B, 4 * H), np.nan, dtype)
    peephole_grads = np.zeros((3, H), dtype)
    _grad_kernel[_grid(B, H)](*grad_args, cs_prev_grad, dicfo, peephole_grads)
    _same(cs_prev_grad, want[0], dtype, "cs_prev_grad")
    _same(dicfo, want[1], dtype, "dicfo")
    # Summed over the batch in the order the threads come: rounding.
    np.testing.assert_allclose(peephole_grads, np.stack(want[2:]), rtol=TOL[dtype], atol=TOL[dtype])
    if not use_peephole:
        assert not peephole_grads.any()


@cuda.jit
def _unit_kernel(pre, c_prev, wci, wcf, wco, forget_bias, cell_clip, use_peephole, grads, outs, back):
    """Gate maths from pre-activations the user computed: pre [4, B, H] in the order i, c, f, o."""
    row, unit = cuda.grid(2)
    if row < c_prev.shape[0] and unit < c_prev.shape[1]:
        i, ci, f, o, cs, co, h = jc.lstm_unit(pre[0, row, unit], pre[1, row, unit], pre[2, row, unit],
                                              pre[3, row, unit], c_prev[row, unit], wci[unit], wcf[unit], wco[unit],
                                              forget_bias, cell_clip, use_peephole)
        for k, value in enumerate((i, cs, f, o, ci, co, h)):
            outs[k, row, unit] = value
        d = jc.lstm_unit_grad(grads[0, row, unit], grads[1, row, unit], i, ci, f, o, co, c_prev[row, unit], wci[unit],
                              wcf[unit], wco[unit], use_peephole)
        for k in range(5):
            back[k, row, unit] = d[k]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_peephole", [False, True])
def test_unit_functions_match_the_cpu_step(dtype, use_peephole):
    """lstm_unit on the pre-activations [x, h_prev] @ w + b gives lstm_step_train's outputs, lstm_unit_grad
    lstm_step_grad's gate gradients."""
    p = _problem(dtype, seed=2)
    pre_all = (np.concatenate([p["x"][0], p["h_prev"]], 1).astype(np.float64) @ p["w"] + p["b"]).astype(dtype)
    pre = np.stack([pre_all[:, k * H:(k + 1) * H] for k in (0, 2, 1, 3)])  # ifco columns, as i, c, f, o
    # The CPU reference from the same pre-activations: an identity input, no recurrent weights, the bias.
    eye = np.eye(B, dtype=dtype)
    w_pre = np.zeros((B + H, 4 * H), dtype)
    w_pre[:B] = pre_all
    expected = [np.empty((B, H), dtype) for _ in range(7)]
    lstm.lstm_step_train(eye, p["cs_prev"], np.zeros((B, H), dtype), w_pre, np.zeros(4 * H, dtype), p["wci"], p["wcf"],
                      p["wco"], 0.5, 0.8, use_peephole, lstm.IFCO, *expected)
    rng = np.random.default_rng(3)
    grads = rng.standard_normal((2, B, H)).astype(dtype)
    outs = np.full((7, B, H), np.nan, dtype)
    back = np.full((5, B, H), np.nan, dtype)
    _unit_kernel[_grid(B, H)](pre, p["cs_prev"], p["wci"], p["wcf"], p["wco"], 0.5, 0.8, use_peephole, grads, outs,
                              back)
    for k, want in enumerate(expected):
        np.testing.assert_allclose(outs[k], want, rtol=TOL[dtype], atol=TOL[dtype])
    want = [np.empty((B, H), dtype), np.empty((B, 4 * H), dtype), *(np.zeros(H, dtype) for _ in range(3))]
    lstm.lstm_step_grad(p["cs_prev"], *outs[:6], grads[1], grads[0], p["wci"], p["wcf"], p["wco"], use_peephole,
                     lstm.IFCO, *want)
    for k, block in enumerate((0, 2, 1, 3)):  # di, dci, df, do
        _same(back[k], want[1][:, block * H:(block + 1) * H], dtype, f"gate {k}")
    _same(back[4], want[0], dtype, "dc_prev")


def test_a_users_time_loop_matches_lstm_forward():
    """A kernel launch per step, the state in device arrays: lstm_forward's outputs."""
    dtype = np.float32
    p = _problem(dtype, seed=4)
    d = {k: cuda.to_device(v) for k, v in p.items()}
    states = [cuda.to_device(p["cs_prev"]), cuda.to_device(p["h_prev"])]
    hs = []
    for t in range(T):
        cs, h = cuda.device_array((B, H), dtype), cuda.device_array((B, H), dtype)
        _step_kernel[_grid(B, H)](d["x"][t], states[0], states[1], d["w"], d["b"], d["wci"], d["wcf"], d["wco"], 1.0,
                                  0.0, True, lstm.ICFO, cs, h)
        states = [cs, h]
        hs.append(h.copy_to_host())
    outs = [np.empty((T, B, H), dtype) for _ in range(7)]
    lstm.lstm_forward(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"], 1.0, 0.0, True,
                   lstm.ICFO, *outs)
    _same(np.stack(hs), outs[6], dtype, "h")


class _Device:
    compute_capability = (8, 0)


@pytest.fixture
def sm_80(monkeypatch):
    """Compiling for sm_80 with or without a GPU (the compiler asks the current device for its compute
    capability: supplied here, as in test_ptx.py)."""
    nvrtc = pytest.importorskip("numba.cuda.cudadrv.nvrtc")
    dispatcher = pytest.importorskip("numba.cuda.dispatcher")
    try:
        supported = (8, 0) in nvrtc.get_supported_ccs()
    except Exception:  # noqa: BLE001 - no NVRTC/NVVM: nothing compiles
        supported = False
    if not supported:
        pytest.skip("the installed CUDA toolkit cannot target sm_80")
    monkeypatch.setattr(dispatcher, "get_current_device", lambda: _Device())


@pytest.mark.skipif(SIMULATOR, reason="the simulator does not compile to PTX")
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_users_kernels_compile_to_ptx(dtype, sm_80):
    """The user's kernels of this file compile for sm_80; in float32 no float64 arithmetic, even with the options
    passed as Python floats (float64 parameters, converted once)."""
    nt = {np.float32: types.float32, np.float64: types.float64}[dtype]
    a1, a2 = types.Array(nt, 1, "C"), types.Array(nt, 2, "C")
    arrays = (a2, a2, a2, a2, a1, a1, a1, a1)
    options = (types.float64, types.float64, types.boolean, types.int64)
    sigs = [(_step_kernel, (*arrays, *options, a2, a2)),
            (_train_step_kernel, (*arrays, *options, *[a2] * 7)),
            (_grad_kernel, (*[a2] * 9, a1, a1, a1, types.boolean, types.int64, a2, a2, a2))]
    for kernel, sig in sigs:
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(8, 0))
        assert ".entry" in ptx
        if dtype == np.float32:
            ops = set(re.findall(r"\b[a-z]+(?:\.[a-z0-9]+)*\.f64\b", ptx))
            assert ops <= {"ld.param.f64", "cvt.rn.f32.f64"}, ops
