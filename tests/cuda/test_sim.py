"""The CUDA target against the CPU target and the float64 reference.

Runs in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) or on a GPU.
The simulator runs every thread as a Python thread: shapes are tiny, but
:mod:`nblstm.cuda` uses tiny tiles there, so these shapes still span several
tiles in every dimension (partial tiles included).
"""

import numpy as np
import pytest
from numba import cuda

import nblstm
from nblstm import cuda as ncuda
from nblstm import reference
from nblstm.cuda import interop, launch

T, B, I, H = 3, 3, 2, 3
NAMES = ("i", "cs", "f", "o", "ci", "co", "h")
GRAD_NAMES = ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad", "wco_grad", "b_grad")

# (rtol, atol) against the CPU target (same storage inputs, same compute
# dtype) and against the float64 reference.
TOL_CPU = {np.float16: (2e-3, 2e-3), np.float32: (1e-5, 1e-5), np.float64: (1e-12, 1e-12)}
TOL_REF = {np.float16: (2e-2, 2e-2), np.float32: (1e-5, 1e-5), np.float64: (1e-12, 1e-12)}


def host(a):
    """A result on the host (device arrays are copied back)."""
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def dev(a):
    return None if a is None else cuda.to_device(np.ascontiguousarray(a))


def make_inputs(dtype, steps=T, batch=B, inputs=I, units=H, seed=0):
    """Random forward inputs (no zeros: they hide unwritten outputs), in ``dtype``."""
    rng = np.random.default_rng(seed)
    arrays = {
        "x": rng.standard_normal((steps, batch, inputs)),
        "cs_prev": rng.standard_normal((batch, units)),
        "h_prev": rng.standard_normal((batch, units)),
        "w": rng.standard_normal((inputs + units, 4 * units)) * 0.5,
        "b": rng.standard_normal(4 * units) * 0.2,
        "wci": rng.standard_normal(units) * 0.5,
        "wcf": rng.standard_normal(units) * 0.5,
        "wco": rng.standard_normal(units) * 0.5,
    }
    return {k: v.astype(dtype) for k, v in arrays.items()}


def make_grads(dtype, steps=T, batch=B, units=H, seed=1):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal((steps, batch, units)).astype(dtype) for k in ("cs_grad", "h_grad")}


def assert_close(actual, expected, tol, what):
    rtol, atol = tol
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, what
    assert np.all(np.isfinite(actual)), what
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=what)


# Option sets: (seq_len_max, forget_bias, cell_clip, use_peephole, layout).
OPTIONS = {
    "all": (2, 1.0, 0.6, True, "icfo"),
    "plain": (None, 0.0, None, False, "ifco"),
    "peephole_ifco": (T, 0.3, None, True, "ifco"),
    "clip_icfo": (1, 0.0, 0.5, False, "icfo"),
}
# Every dtype runs these; the others run in float32 only (the simulator is slow).
ALL_DTYPE_OPTIONS = ("all", "plain")


def run_forward_backward(dtype, options, **shape):
    """Forward and backward on the GPU and the CPU from the same inputs."""
    seq_len_max, forget_bias, cell_clip, use_peephole, layout = options
    a = make_inputs(dtype, **shape)
    g = make_grads(dtype, steps=a["x"].shape[0], batch=a["x"].shape[1], units=a["cs_prev"].shape[1])
    kw = dict(seq_len_max=seq_len_max, forget_bias=forget_bias, cell_clip=cell_clip, use_peephole=use_peephole,
              layout=layout)
    peep = ("wci", "wcf", "wco") if use_peephole else ()
    cpu_out = nblstm.block_lstm(*(a[k] for k in ("x", "cs_prev", "h_prev", "w", "b")), *(a[k] for k in peep), **kw)
    gpu_out = nblstm.block_lstm(*(dev(a[k]) for k in ("x", "cs_prev", "h_prev", "w", "b")),
                                *(dev(a[k]) for k in peep), **kw)
    # Both backward passes read the CPU's forward outputs: identical inputs.
    bkw = dict(seq_len_max=seq_len_max, use_peephole=use_peephole, layout=layout)
    core = ("x", "cs_prev", "h_prev", "w")
    cpu_grads = nblstm.block_lstm_grad(*(a[k] for k in core), cpu_out, g["cs_grad"], g["h_grad"],
                                       *(a[k] for k in peep), **bkw)
    gpu_grads = nblstm.block_lstm_grad(*(dev(a[k]) for k in core), [dev(o) for o in cpu_out], dev(g["cs_grad"]),
                                       dev(g["h_grad"]), *(dev(a[k]) for k in peep), **bkw)
    return a, g, cpu_out, gpu_out, cpu_grads, gpu_grads


CASES = [(dtype, name, False) for name in ALL_DTYPE_OPTIONS for dtype in (np.float16, np.float32, np.float64)]
CASES += [(np.float32, name, False) for name in OPTIONS if name not in ALL_DTYPE_OPTIONS]
# The persistent kernels run the same step code in one cooperative launch.
CASES += [(np.float32, "all", True), (np.float64, "plain", True)]


@pytest.mark.parametrize(
    "dtype, option_set, persistent", CASES,
    ids=[f"{np.dtype(d).name}-{o}-{'persistent' if p else 'per_step'}" for d, o, p in CASES])
def test_block_lstm_matches_cpu_and_reference(dtype, option_set, persistent, monkeypatch):
    monkeypatch.setattr(ncuda.config, "PERSISTENT", persistent)
    options = OPTIONS[option_set]
    seq_len_max, forget_bias, cell_clip, use_peephole, layout = options
    a, g, cpu_out, gpu_out, cpu_grads, gpu_grads = run_forward_backward(dtype, options)
    steps = T if seq_len_max is None else seq_len_max
    ref = reference.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], a["wci"], a["wcf"], a["wco"],
                               steps, forget_bias, -1.0 if cell_clip is None else cell_clip, use_peephole, layout)
    for name, c, gpu in zip(NAMES, cpu_out, gpu_out, strict=True):
        out = host(gpu)
        assert out.dtype == np.dtype(dtype), name
        assert_close(out, c, TOL_CPU[dtype], f"{name} vs CPU")
        assert_close(out, ref[name], TOL_REF[dtype], f"{name} vs reference")
        assert np.all(out[steps:] == 0), f"{name} past seq_len_max"
    ref_grads = reference.block_lstm_grad(
        a["x"], a["cs_prev"], a["h_prev"], a["w"], a["wci"], a["wcf"], a["wco"], [np.asarray(o) for o in cpu_out],
        g["cs_grad"], g["h_grad"], steps, use_peephole, layout)
    for name, c, gpu in zip(GRAD_NAMES, cpu_grads, gpu_grads, strict=True):
        out = host(gpu)
        assert out.dtype == np.dtype(dtype), name
        assert_close(out, c, TOL_CPU[dtype], f"{name} vs CPU")
        assert_close(out, ref_grads[name], TOL_REF[dtype], f"{name} vs reference")
    assert np.all(host(gpu_grads.x_grad)[steps:] == 0)
    if not use_peephole:
        for name in ("wci_grad", "wcf_grad", "wco_grad"):
            assert np.all(host(getattr(gpu_grads, name)) == 0)


def test_capped_grids_stride_over_their_work(monkeypatch):
    """GEMM blocks stride over M tiles past gridDim.y's limit, 1-D kernels over their elements past the block cap.

    On a GPU that happens from ``S * B > 65535 * 64`` rows and ``4H > 1024 * 256``
    columns; here the caps are lowered so tiny shapes reach them.
    """
    monkeypatch.setattr(launch, "MAX_GRID_Y", 1)
    monkeypatch.setattr(launch, "LINEAR_MAX_BLOCKS", 1)
    _, _, cpu_out, gpu_out, cpu_grads, gpu_grads = run_forward_backward(np.float32, OPTIONS["all"])
    for name, c, gpu in zip(NAMES, cpu_out, gpu_out, strict=True):
        assert_close(host(gpu), c, TOL_CPU[np.float32], name)
    for name, c, gpu in zip(GRAD_NAMES, cpu_grads, gpu_grads, strict=True):
        assert_close(host(gpu), c, TOL_CPU[np.float32], name)


@pytest.mark.parametrize("seq_len_max, batch", [(0, B), (T, 0)])
def test_empty_work(seq_len_max, batch):
    a = make_inputs(np.float32, batch=batch)
    args = [dev(a[k]) for k in ("x", "cs_prev", "h_prev", "w", "b")]
    out = nblstm.block_lstm(*args, seq_len_max=seq_len_max)
    for o in out:
        assert o.shape == (T, batch, H)
        assert np.all(host(o) == 0)
    grads = nblstm.block_lstm_grad(*args[:4], out, h_grad=dev(np.ones((T, batch, H), np.float32)),
                                   seq_len_max=seq_len_max)
    expected_shapes = [(T, batch, I), (batch, H), (batch, H), (I + H, 4 * H), (H,), (H,), (H,), (4 * H,)]
    for g, shape in zip(grads, expected_shapes, strict=True):
        assert g.shape == shape
        assert np.all(host(g) == 0)


def test_grad_defaults_and_non_contiguous_inputs():
    """``cs_grad``/``h_grad`` omitted are zeros; strided device inputs are copied on the device."""
    a = make_inputs(np.float64)
    out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
    # Slices of wider arrays are strided views (Numba's transpose of a real
    # device array copies, and works in 2D only).
    w_t = cuda.to_device(np.concatenate([a["w"], a["w"]], axis=1))[:, :4 * H]
    x_strided = cuda.to_device(np.concatenate([a["x"], a["x"]], axis=2))[:, :, :I]
    assert not w_t.is_c_contiguous() and not x_strided.is_c_contiguous()
    gpu = nblstm.block_lstm(x_strided, dev(a["cs_prev"]), dev(a["h_prev"]), w_t, dev(a["b"]))
    for c, g in zip(out, gpu, strict=True):
        assert_close(host(g), c, TOL_CPU[np.float64], "forward with strided inputs")
    h_grad = np.ones((T, B, H))
    cpu_grads = nblstm.block_lstm_grad(a["x"], a["cs_prev"], a["h_prev"], a["w"], out, h_grad=h_grad)
    gpu_grads = nblstm.block_lstm_grad(x_strided, dev(a["cs_prev"]), dev(a["h_prev"]), w_t, [dev(o) for o in out],
                                       h_grad=dev(h_grad))
    for name, c, g in zip(GRAD_NAMES, cpu_grads, gpu_grads, strict=True):
        assert_close(host(g), c, TOL_CPU[np.float64], name)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_cell_matches_cpu(dtype):
    a = make_inputs(dtype, steps=1)
    x = a["x"][0]
    kw = dict(forget_bias=0.5, cell_clip=0.6, use_peephole=True, layout="icfo")
    peep = [a[k] for k in ("wci", "wcf", "wco")]
    cpu_out = nblstm.lstm_block_cell(x, a["cs_prev"], a["h_prev"], a["w"], a["b"], *peep, **kw)
    gpu_out = nblstm.lstm_block_cell(dev(x), dev(a["cs_prev"]), dev(a["h_prev"]), dev(a["w"]), dev(a["b"]),
                                     *map(dev, peep), **kw)
    for name, c, g in zip(NAMES, cpu_out, gpu_out, strict=True):
        assert host(g).dtype == np.dtype(dtype)
        assert_close(host(g), c, TOL_CPU[dtype], name)
    g = make_grads(dtype, steps=1)
    cs_grad, h_grad = g["cs_grad"][0], g["h_grad"][0]
    bkw = dict(use_peephole=True, layout="icfo")
    cpu_grads = nblstm.lstm_block_cell_grad(x, a["cs_prev"], a["h_prev"], a["w"], cpu_out, cs_grad, h_grad, *peep,
                                            **bkw)
    gpu_grads = nblstm.lstm_block_cell_grad(dev(x), dev(a["cs_prev"]), dev(a["h_prev"]), dev(a["w"]),
                                            [dev(o) for o in cpu_out], dev(cs_grad), dev(h_grad), *map(dev, peep),
                                            **bkw)
    for name, c, gg in zip(nblstm.LSTMBlockCellGradOutput._fields, cpu_grads, gpu_grads, strict=True):
        assert host(gg).dtype == np.dtype(dtype)
        assert_close(host(gg), c, TOL_CPU[dtype], name)


def test_cell_without_grads_or_peepholes():
    a = make_inputs(np.float32, steps=1)
    x = a["x"][0]
    args = (x, a["cs_prev"], a["h_prev"], a["w"])
    cpu_out = nblstm.lstm_block_cell(*args, a["b"])
    gpu_out = nblstm.lstm_block_cell(*map(dev, args), dev(a["b"]))
    cpu_grads = nblstm.lstm_block_cell_grad(*args, cpu_out)
    gpu_grads = nblstm.lstm_block_cell_grad(*map(dev, args), [dev(o) for o in cpu_out])
    for c, g in zip(cpu_grads, gpu_grads, strict=True):
        assert_close(host(g), c, TOL_CPU[np.float32], "cell grad")
        assert np.all(host(g) == 0)  # no incoming gradient: all zero
    for c, g in zip(cpu_out, gpu_out, strict=True):
        assert_close(host(g), c, TOL_CPU[np.float32], "cell")


# --- dispatch ---------------------------------------------------------------


class Wrapped:
    """A foreign GPU array: only ``__cuda_array_interface__`` (as CuPy or PyTorch expose)."""

    def __init__(self, array):
        self._array = cuda.to_device(np.ascontiguousarray(array))
        if ncuda.SIMULATOR:  # simulator "device" memory is host memory
            host_ai = self._array._ary.__array_interface__
            self.__cuda_array_interface__ = {
                "shape": host_ai["shape"], "typestr": host_ai["typestr"], "data": host_ai["data"],
                "strides": None, "version": 3,
            }
        else:
            self.__cuda_array_interface__ = self._array.__cuda_array_interface__


def test_kinds_of_arrays():
    a = make_inputs(np.float32)
    names = ("x", "cs_prev", "h_prev", "w", "b")
    cpu_out = nblstm.block_lstm(*(a[k] for k in names))
    assert all(isinstance(o, np.ndarray) for o in cpu_out)
    for convert in (dev, Wrapped):
        gpu_out = nblstm.block_lstm(*(convert(a[k]) for k in names))
        for c, g in zip(cpu_out, gpu_out, strict=True):
            assert not isinstance(g, np.ndarray) and hasattr(g, "copy_to_host")
            assert_close(host(g), c, TOL_CPU[np.float32], convert.__name__)


def test_mixed_host_and_device_raises():
    a = make_inputs(np.float32)
    with pytest.raises(TypeError, match=r"host: cs_prev, h_prev.*device: x, w, b|host: .*device: "):
        nblstm.block_lstm(dev(a["x"]), a["cs_prev"], a["h_prev"], dev(a["w"]), dev(a["b"]))


def test_arrays_on_different_gpus_raise(monkeypatch):
    a = make_inputs(np.float32)
    arrays = {k: Wrapped(a[k]) for k in ("x", "cs_prev", "h_prev", "w", "b")}
    arrays["w"].gpu, arrays["b"].gpu = 1, 1
    monkeypatch.setattr(interop, "device_ordinal", lambda value: getattr(value, "gpu", 0))
    with pytest.raises(TypeError, match=r"one GPU; GPU 0: x, cs_prev, h_prev; GPU 1: w, b"):
        nblstm.block_lstm(*arrays.values())


def test_stream_is_used():
    a = make_inputs(np.float32)
    args = [dev(a[k]) for k in ("x", "cs_prev", "h_prev", "w", "b")]
    stream = cuda.stream()
    out = nblstm.block_lstm(*args, stream=stream)
    stream.synchronize()
    expected = nblstm.block_lstm(*(a[k] for k in ("x", "cs_prev", "h_prev", "w", "b")))
    assert_close(host(out.h), expected.h, TOL_CPU[np.float32], "h on a stream")
    with pytest.raises(ValueError, match="stream"):
        nblstm.block_lstm(*(a[k] for k in ("x", "cs_prev", "h_prev", "w", "b")), stream=stream)


def test_a_clip_bound_that_rounds_to_zero_turns_clipping_off():
    """As on the CPU: 1e-46 is 0 in float32, so it clips nothing."""
    a = make_inputs(np.float32)
    args = [dev(a[k]) for k in ("x", "cs_prev", "h_prev", "w", "b")]
    tiny = nblstm.block_lstm(*args, cell_clip=1e-46)
    none = nblstm.block_lstm(*args, cell_clip=None)
    np.testing.assert_array_equal(host(tiny.cs), host(none.cs))
    assert np.abs(host(none.cs)).max() > 0.01
