"""The cuBLAS path of the CUDA target, in the simulator, through a binding that computes cuBLAS's contract with NumPy.

The binding below implements ``cublasGemmEx`` as its documentation states it
(column-major operands at raw addresses, leading dimensions, transposes,
``alpha`` and ``beta`` read from host pointers, the compute type), so these
tests check what :mod:`nblstm.cuda.blas` passes to cuBLAS: the row-major to
column-major mapping, the leading dimensions of row slices, the bias and
accumulation through ``beta``, the bias gradient as a product with ones, and
the compute type of each ``precision``. Its TF32 and float16 modes round the
operands as the tensor cores do, so the reduced precisions' errors are
checked too. On a GPU the real binding runs every other test instead (the
simulator's arrays are host memory; a GPU's are not).
"""

import ctypes

import numpy as np
import pytest
from numba import cuda

import nblstm
from nblstm import cuda as ncuda
from nblstm import reference
from nblstm.cuda import blas
from tests.helpers import make_problem_with_grads

pytestmark = pytest.mark.skipif(not ncuda.SIMULATOR, reason="the NumPy binding reads the simulator's host arrays")

_DTYPES = {0: np.float32, 1: np.float64}
_CTYPES = {0: ctypes.c_float, 1: ctypes.c_double}


def _round_tf32(a):
    """``a`` (float32) with a 10-bit mantissa, rounded to nearest even: what a TF32 tensor core multiplies."""
    bits = np.asarray(a, np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    return rounded.view(np.float32)


class NumpyCublas:
    """``cublasCreate``, ``cublasSetStream`` and ``cublasGemmEx`` on host memory, recording each call."""

    def __init__(self):
        self.calls = []
        self.streams = {}

    def binding(self):
        return blas.Binding("numpy", self.create, self.set_stream, self.gemm_ex)

    def create(self):
        return len(self.streams) + 1

    def set_stream(self, handle, stream):
        self.streams[handle] = stream

    @staticmethod
    def _matrix(address, rows, cols, ld, dtype):
        """The column-major ``rows x cols`` matrix at ``address`` with leading dimension ``ld``."""
        assert ld >= max(1, rows), f"leading dimension {ld} < rows {rows}"
        itemsize = np.dtype(dtype).itemsize
        count = (cols - 1) * ld + rows if rows and cols else 0
        buffer = (ctypes.c_byte * (count * itemsize)).from_address(address) if count else bytearray(0)
        return np.ndarray((rows, cols), dtype, buffer=buffer, strides=(itemsize, ld * itemsize))

    def gemm_ex(self, handle, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c, ctype, ldc,
                compute, algo):
        assert handle in self.streams and atype == btype == ctype and algo == -1
        dtype = _DTYPES[atype]
        alpha = _CTYPES[atype].from_address(alpha).value
        beta = _CTYPES[atype].from_address(beta).value
        self.calls.append({"trans": (transa, transb), "mnk": (m, n, k), "beta": beta, "compute": compute})
        op_a = self._matrix(a, *((m, k) if transa == 0 else (k, m)), lda, dtype)
        op_b = self._matrix(b, *((k, n) if transb == 0 else (n, k)), ldb, dtype)
        op_a = op_a if transa == 0 else op_a.T
        op_b = op_b if transb == 0 else op_b.T
        if compute == 77:  # CUBLAS_COMPUTE_32F_FAST_TF32
            op_a, op_b = _round_tf32(op_a), _round_tf32(op_b)
        elif compute == 74:  # CUBLAS_COMPUTE_32F_FAST_16F
            op_a, op_b = (x.astype(np.float16).astype(np.float32) for x in (op_a, op_b))
        else:
            assert compute == {0: 68, 1: 70}[atype]
        out = self._matrix(c, m, n, ldc, dtype)
        product = alpha * (op_a.astype(np.float64) @ op_b.astype(np.float64))
        out[...] = product + (beta * out if beta else 0.0)  # beta = 0: C is not read (it may hold anything)


@pytest.fixture
def fake(monkeypatch):
    """The NumPy binding in place of cuBLAS, for one test."""
    numpy_cublas = NumpyCublas()
    monkeypatch.setattr(ncuda.config, "BLAS", True)
    blas.reset(numpy_cublas.binding())
    yield numpy_cublas
    blas.reset()


def _dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm_maps_row_major_products_onto_cublas(fake, dtype, trans_a, trans_b):
    rng = np.random.default_rng(0)
    m, n, k = 5, 7, 3
    rows, cols = (k, m) if trans_a else (m, k)
    # A view of a wider array: contiguous rows whose stride (the leading dimension) exceeds the view's width.
    a_full = rng.standard_normal((rows + 2, cols + 3)).astype(dtype)
    a_host = a_full[:rows, :cols]
    b_host = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    expected = (a_host.T if trans_a else a_host) @ (b_host.T if trans_b else b_host)
    a_arg = _dev(a_full)[:rows, :cols]
    for beta in (0.0, 1.0):
        c = _dev(c0 if beta else np.full((m, n), np.nan, dtype))
        blas.gemm(blas.handle_for(0, 0), a_arg, _dev(b_host), c, trans_a, trans_b, beta, "exact")
        np.testing.assert_allclose(c.copy_to_host(), expected + (c0 if beta else 0), rtol=1e-6, atol=1e-6)
    assert len(fake.calls) == 2


NAMES = ("i", "cs", "f", "o", "ci", "co", "h")


def _op_inputs(dtype, steps=4, batch=3, inputs=5, units=6, seed=0):
    return make_problem_with_grads(dtype, steps, batch, inputs, units, seed)


def _ops(a, arrays, precision="exact"):
    kw = {"use_peephole": True, "seq_len_max": 3, "layout": "icfo"}
    core = [arrays(a[k]) for k in ("x", "cs_prev", "h_prev", "w")]
    peep = {k: arrays(a[k]) for k in ("wci", "wcf", "wco")}
    out = nblstm.block_lstm(*core, arrays(a["b"]), **peep, forget_bias=0.5, cell_clip=1.5, precision=precision, **kw)
    grads = nblstm.block_lstm_grad(*core, out, cs_grad=arrays(a["cs_grad"]), h_grad=arrays(a["h_grad"]), **peep,
                                   precision=precision, **kw)
    host = [np.asarray(r.copy_to_host() if hasattr(r, "copy_to_host") else r, np.float64) for r in (*out, *grads)]
    return host


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_fused_ops_on_cublas_match_the_cpu(fake, dtype):
    a = _op_inputs(dtype)
    cpu = _ops(a, np.asarray)
    gpu = _ops(a, _dev)
    tol = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    for k, (c, g) in enumerate(zip(cpu, gpu, strict=True)):
        np.testing.assert_allclose(g, c, rtol=tol, atol=tol, err_msg=f"result {k}")
    computes = {call["compute"] for call in fake.calls}
    assert computes == {70 if dtype == np.float64 else 68}
    # The input projection (bias written first, beta = 1), the three peephole gradients (ones @ terms: M = 1),
    # x_grad, h_prev_grad, the two w_grad parts (the second accumulating) and b_grad (ones @ dgates).
    assert len(fake.calls) == 10
    assert [call["beta"] for call in fake.calls] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    # Rows of each row-major product (cuBLAS's n): S B, 1 (x3), S B, B, I, H, H, 1 with S = 3, B = 3, I = 5, H = 6.
    assert [call["mnk"][1] for call in fake.calls] == [9, 1, 1, 1, 9, 3, 5, 6, 6, 1]


def test_cell_and_layer_on_cublas_match_the_cpu(fake):
    rng = np.random.default_rng(3)
    cell = nblstm.LSTMCell(5, num_proj=3, use_peepholes=True, cell_clip=1.0, seed=0, dtype=np.float32)
    x = rng.standard_normal((4, 3, 6)).astype(np.float32)
    lengths = [4, 1, 3]
    d_out = rng.standard_normal((4, 3, 3)).astype(np.float32)
    (host_out, _), host_vjp = cell.vjp(x, sequence_length=lengths)
    (dev_out, _), dev_vjp = cell.vjp(_dev(x), sequence_length=lengths)
    np.testing.assert_allclose(dev_out.copy_to_host(), host_out, rtol=1e-5, atol=1e-6)
    h_grads, d_dev = host_vjp(d_out), dev_vjp(_dev(d_out))
    np.testing.assert_allclose(d_dev[0].copy_to_host(), h_grads[0], rtol=1e-5, atol=1e-5)
    for name, value in h_grads[2].items():
        np.testing.assert_allclose(np.asarray(d_dev[2][name]), value, rtol=1e-5, atol=1e-5, err_msg=name)
    assert fake.calls, "the cell's products ran on the tiled kernel"
    layer = nblstm.LSTM(6, 4, num_layers=2, bidirectional=True, seed=1)
    want, _ = layer(x, sequence_length=lengths)
    got, _ = layer(_dev(x), sequence_length=lengths)
    np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision, compute, tol", [("tf32", 77, 5e-3), ("fp16", 74, 5e-3)])
def test_reduced_precisions_pass_their_compute_type_and_stay_near_exact(fake, precision, compute, tol):
    a = _op_inputs(np.float32, seed=4)
    exact = _ops(a, _dev)
    fake.calls.clear()
    reduced = _ops(a, _dev, precision=precision)
    # The products of the layers in the reduced precision; the sums of the bias and peephole gradients (ones @ ...,
    # one row) exact: rounding their terms would save nothing.
    assert {call["compute"] for call in fake.calls if call["mnk"][1] > 1} == {compute}
    assert {call["compute"] for call in fake.calls if call["mnk"][1] == 1} == {68}
    ref = reference.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], a["wci"], a["wcf"], a["wco"], 3,
                               0.5, 1.5, True, "icfo")
    h = NAMES.index("h")
    assert not np.array_equal(reduced[h], exact[h]), "the operands were not rounded"
    np.testing.assert_allclose(reduced[h], ref["h"], rtol=tol, atol=tol)
    cell = nblstm.LSTMCell(4, precision=precision, seed=0)
    x = _dev(a["x"])
    fake.calls.clear()
    out, _ = cell.run(x)
    assert {call["compute"] for call in fake.calls if call["mnk"][1] > 1} == {compute}
    want, _ = nblstm.LSTMCell(4, seed=0).run(a["x"])
    np.testing.assert_allclose(out.copy_to_host(), want, rtol=tol, atol=tol)


def test_precisions_that_cannot_be_honoured_are_refused(fake, monkeypatch):
    a = _op_inputs(np.float64)
    with pytest.raises(ValueError, match="precision='tf32' applies to float32"):
        _ops(a, _dev, precision="tf32")
    a32 = _op_inputs(np.float32)
    with pytest.raises(ValueError, match="precision='tf32' applies to GPU arrays only"):
        _ops(a32, np.asarray, precision="tf32")
    with pytest.raises(ValueError, match="precision must be one of"):
        _ops(a32, _dev, precision="bf16")
    with pytest.raises(ValueError, match="precision must be one of"):
        nblstm.LSTMCell(3, precision="half")
    cell = nblstm.LSTMCell(3, precision="fp16", seed=0)
    with pytest.raises(ValueError, match="precision='fp16' applies to GPU arrays only"):
        cell.run(a32["x"])
    monkeypatch.setattr(ncuda.config, "BLAS", False)
    with pytest.raises(ValueError, match="needs cuBLAS"):
        _ops(a32, _dev, precision="tf32")
    assert not fake.calls
    assert nblstm.LSTM(3, 2, precision="tf32").precision == "tf32"


def test_per_step_products_pass_the_addresses_of_each_step(fake, monkeypatch):
    """Past the resident kernels' batch: one cuBLAS product and one gate kernel per step (:class:`blas.StepGemm`)."""
    monkeypatch.setattr(ncuda.config, "RESIDENT_MAX_BATCH", 4)
    batch = 6
    a = _op_inputs(np.float32, steps=4, batch=batch, inputs=3, units=4, seed=5)
    cpu = _ops(a, np.asarray)
    gpu = _ops(a, _dev)
    for k, (c, g) in enumerate(zip(cpu, gpu, strict=True)):
        np.testing.assert_allclose(g, c, rtol=1e-5, atol=1e-5, err_msg=f"result {k}")
    steps = [call for call in fake.calls if call["mnk"][1] == batch and call["mnk"][2] in (4, 16)]
    # seq_len_max = 3: three forward steps (h @ W_h onto xw[t], beta = 1), two carried products backward
    # (dgates[t + 1] @ W_h^T, beta = 0); h_prev_grad has the same shape as the latter.
    assert [(c["mnk"], c["beta"]) for c in steps] == [((16, batch, 4), 1.0)] * 3 + [((4, batch, 16), 0.0)] * 3


def test_reduced_precisions_leave_the_resident_kernels_earlier(fake, monkeypatch):
    """Past PERSISTENT_MAX_BATCH a reduced precision takes the per-step cuBLAS loop (tensor cores), exact stays
    resident up to RESIDENT_MAX_BATCH."""
    from nblstm.cuda import launch

    monkeypatch.setattr(ncuda.config, "PERSISTENT_MAX_BATCH", 4)
    a = _op_inputs(np.float32, batch=5)
    for precision, loop in (("exact", "resident"), ("tf32", "gemm-steps")):
        launch.LOOPS.clear()
        _ops(a, _dev, precision=precision)
        assert launch.LOOPS == {loop: 2}, precision


def test_the_cupy_binding_runs_each_product_on_its_handles_stream(monkeypatch):
    """CuPy's gemmEx sets the handle's stream to CuPy's current stream at each call: the binding makes the
    handle's stream the current one around the call (checked with stand-ins for CuPy's modules)."""
    import sys
    import types

    current = [0]
    calls = []

    class Stream:
        def __init__(self, ptr):
            self.ptr = ptr

        def __enter__(self):
            self.saved, current[0] = current[0], self.ptr

        def __exit__(self, *exc):
            current[0] = self.saved

    cublas = types.SimpleNamespace(
        create=lambda: 7, setStream=lambda handle, stream: calls.append(("setStream", handle, stream)),
        gemmEx=lambda handle, *args: calls.append(("gemmEx", handle, current[0], args)))
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(ExternalStream=Stream, Stream=types.SimpleNamespace(null=Stream(0)))
    libs = types.ModuleType("cupy_backends.cuda.libs")
    libs.cublas = cublas
    for name, module in (("cupy", cupy), ("cupy_backends", types.ModuleType("cupy_backends")),
                         ("cupy_backends.cuda", types.ModuleType("cupy_backends.cuda")),
                         ("cupy_backends.cuda.libs", libs), ("cupy_backends.cuda.libs.cublas", cublas)):
        monkeypatch.setitem(sys.modules, name, module)
    binding = blas._cupy()
    handle = binding.create()
    binding.set_stream(handle, 1234)
    binding.gemm_ex(handle, 1, 2, 3)
    assert calls == [("setStream", 7, 1234), ("gemmEx", 7, 1234, (1, 2, 3))]
    assert current[0] == 0
