"""The resident persistent kernels (:mod:`nblstm.cuda.resident`) against the tiled persistent ones and the CPU.

With one lane their sums run in the tiled kernels' order, so the results
are those of the tiled persistent kernels bit for bit; with several lanes
and several staged chunks (the partial sums and the staging loop a GPU
runs) they agree within rounding. Runs in the simulator (one block) or on
a GPU.
"""

import numpy as np
import pytest
from numba import cuda

import nblstm
from nblstm import cuda as ncuda
from nblstm import reference
from nblstm.cuda import launch
from tests.helpers import make_problem_with_grads


def _inputs(dtype, steps=4, batch=3, inputs=5, units=6, seed=0):
    return make_problem_with_grads(dtype, steps, batch, inputs, units, seed)


def _host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def _run(a, arrays, **kw):
    core = [arrays(a[k]) for k in ("x", "cs_prev", "h_prev", "w")]
    peep = {k: arrays(a[k]) for k in ("wci", "wcf", "wco")}
    out = nblstm.block_lstm(*core, arrays(a["b"]), **peep, forget_bias=0.7, cell_clip=1.2, **kw)
    grads = nblstm.block_lstm_grad(*core, out, cs_grad=arrays(a["cs_grad"]), h_grad=arrays(a["h_grad"]), **peep,
                                   **kw)
    return [_host(r) for r in (*out, *grads)]


@pytest.fixture
def plans():
    """The time loops run by the test, by kind (:data:`nblstm.cuda.launch.LOOPS`)."""
    launch.LOOPS.clear()
    return launch.LOOPS


def _dev(a):
    return cuda.to_device(np.ascontiguousarray(a))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 3, 17])
def test_one_lane_gives_the_tiled_persistent_kernels_bits(dtype, batch, monkeypatch, plans):
    a = _inputs(dtype, 4, batch, 3, 5)
    kw = {"use_peephole": True, "seq_len_max": 3}
    monkeypatch.setattr(ncuda.config, "PERSISTENT", True)
    monkeypatch.setattr(ncuda.config, "RESIDENT", False)
    tiled = _run(a, _dev, **kw)
    assert plans["resident"] == 0
    monkeypatch.setattr(ncuda.config, "RESIDENT", "auto")
    monkeypatch.setattr(ncuda.config, "RESIDENT_LANES", 1)
    resident = _run(a, _dev, **kw)
    assert plans["resident"] == 2  # the forward and the backward loop
    for k, (t, r) in enumerate(zip(tiled, resident, strict=True)):
        assert np.array_equal(t, r), f"result {k}"


@pytest.mark.parametrize("lanes, chunk, batch", [(2, None, 3), (3, 2, 3), (4, 3, 1), (2, 4, 18)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_lanes_and_chunks_match_the_cpu_and_the_reference(dtype, lanes, chunk, batch, monkeypatch, plans):
    """Several lanes, staged chunks and (batch 18) two groups of rows, one of them partial."""
    monkeypatch.setattr(ncuda.config, "RESIDENT_LANES", lanes)
    monkeypatch.setattr(ncuda.config, "RESIDENT_CHUNK", chunk)
    steps, units = 4, 5
    a = _inputs(dtype, steps, batch, 2, units, seed=lanes)
    kw = {"use_peephole": True, "layout": "icfo"}
    cpu = _run(a, np.asarray, **kw)
    gpu = _run(a, _dev, **kw)
    assert plans["resident"] == 2
    tol = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-12}[dtype]
    for k, (c, g) in enumerate(zip(cpu, gpu, strict=True)):
        assert g.dtype == np.dtype(dtype)
        np.testing.assert_allclose(g.astype(np.float64), c.astype(np.float64), rtol=tol, atol=tol,
                                   err_msg=f"result {k}")
    if dtype == np.float64:
        ref = reference.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], a["wci"], a["wcf"], a["wco"],
                                   steps, 0.7, 1.2, True, "icfo")
        np.testing.assert_allclose(gpu[6], ref["h"], rtol=1e-12, atol=1e-12)


def test_the_batch_limit_and_the_switches_choose_the_loop(monkeypatch, plans):
    monkeypatch.setattr(ncuda.config, "RESIDENT_MAX_BATCH", 4)
    a = _inputs(np.float32, 2, 5, 2, 3)
    _run(a, _dev)
    assert plans["resident"] == 0  # past the batch limit: per-step launches
    small = _inputs(np.float32, 2, 2, 2, 3)
    monkeypatch.setattr(ncuda.config, "PERSISTENT", False)
    _run(small, _dev)
    assert plans["resident"] == 0
    monkeypatch.setattr(ncuda.config, "PERSISTENT", "auto")
    _run(small, _dev)
    assert plans["resident"] == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [2, 5])
def test_the_per_step_gemm_loop_matches_the_fused_step_kernels(dtype, batch, monkeypatch, plans):
    """One GEMM and one gate kernel per step (here on the tiled GEMM) against one fused kernel per step."""
    a = _inputs(dtype, 4, batch, 3, 5, seed=7)
    kw = {"use_peephole": True, "seq_len_max": 3, "layout": "icfo"}
    monkeypatch.setattr(ncuda.config, "RESIDENT_MAX_BATCH", 4)
    monkeypatch.setattr(ncuda.config, "PERSISTENT", False)
    monkeypatch.setattr(ncuda.config, "STEP_GEMM", False)
    fused = _run(a, _dev, **kw)
    assert plans["per-step"] == 2 and plans["gemm-steps"] == 0
    launches = []
    gemm = launch.Launcher.gemm
    monkeypatch.setattr(launch.Launcher, "gemm", lambda self, *args, **kws: launches.append(1) or gemm(self, *args,
                                                                                                       **kws))
    monkeypatch.setattr(ncuda.config, "STEP_GEMM", True)
    stepped = _run(a, _dev, **kw)
    assert plans["gemm-steps"] == 2
    # 3 forward steps and 2 carried products backward, and the 6 products outside the loops (the bias gradient is
    # a column-sum kernel without cuBLAS).
    assert len(launches) == 3 + 2 + 6
    tol = {np.float32: 1e-5, np.float64: 1e-12}[dtype]
    for k, (f, s) in enumerate(zip(fused, stepped, strict=True)):
        np.testing.assert_allclose(s, f, rtol=tol, atol=tol, err_msg=f"result {k}")


@pytest.mark.parametrize("num_proj", [None, 3])
def test_the_cells_per_step_gemm_loop_matches_its_fused_step_kernels(num_proj, monkeypatch, plans):
    rng = np.random.default_rng(11)
    cell = nblstm.LSTMCell(4, num_proj=num_proj, use_peepholes=True, cell_clip=0.8, proj_clip=0.6 if num_proj else None,
                           seed=2, dtype=np.float64)
    x = rng.standard_normal((5, 3, 2))
    lengths = [5, 2, 0]
    d_out = rng.standard_normal((5, 3, num_proj or 4))
    d_c, d_h = rng.standard_normal((3, 4)), rng.standard_normal((3, num_proj or 4))
    results = []
    monkeypatch.setattr(ncuda.config, "RESIDENT", False)
    for step_gemm in (False, True):
        monkeypatch.setattr(ncuda.config, "STEP_GEMM", step_gemm)
        (out, state), backward = cell.vjp(_dev(x), sequence_length=lengths)
        d_x, d_state, d_w = backward(_dev(d_out), (_dev(d_c), _dev(d_h)))
        results.append([_host(out), _host(state.c), _host(state.h), _host(d_x), _host(d_state.c),
                        _host(d_state.h), *(np.asarray(d_w[k]) for k in sorted(d_w))])
    assert plans["gemm-steps"] == 2  # the forward and the backward loop of the second call
    for k, (fused, stepped) in enumerate(zip(*results, strict=True)):
        np.testing.assert_allclose(stepped, fused, rtol=1e-12, atol=1e-12, err_msg=f"result {k}")


@pytest.mark.parametrize("lanes, chunk, batch", [(1, None, 3), (2, 2, 3), (3, None, 18)])
def test_the_cells_resident_loops_match_its_step_kernels(lanes, chunk, batch, monkeypatch, plans):
    """LSTMCell without a projection, forward and backward: one lane gives the per-step kernels' bits; more lanes,
    chunks and groups of rows agree within rounding. Lengths (a zero one too), peepholes, a cell clip and another
    activation."""
    rng = np.random.default_rng(lanes)
    cell = nblstm.LSTMCell(5, use_peepholes=True, cell_clip=0.7, activation="relu", seed=3, dtype=np.float32)
    x = rng.standard_normal((4, batch, 3)).astype(np.float32)
    lengths = rng.integers(0, 5, batch)
    d_out = rng.standard_normal((4, batch, 5)).astype(np.float32)
    d_c, d_h = rng.standard_normal((2, batch, 5)).astype(np.float32)
    monkeypatch.setattr(ncuda.config, "RESIDENT", False)
    (want, want_state), backward = cell.vjp(_dev(x), sequence_length=lengths)
    want_grads = backward(_dev(d_out), (_dev(d_c), _dev(d_h)))
    assert plans["resident"] == 0
    monkeypatch.setattr(ncuda.config, "RESIDENT", "auto")
    monkeypatch.setattr(ncuda.config, "RESIDENT_LANES", lanes)
    monkeypatch.setattr(ncuda.config, "RESIDENT_CHUNK", chunk)
    (got, got_state), backward = cell.vjp(_dev(x), sequence_length=lengths)
    got_grads = backward(_dev(d_out), (_dev(d_c), _dev(d_h)))
    assert plans["resident"] == 2  # the forward and the backward loop
    pairs = [(got, want), (got_state.c, want_state.c), (got_state.h, want_state.h), (got_grads[0], want_grads[0]),
             (got_grads[1].c, want_grads[1].c), (got_grads[1].h, want_grads[1].h),
             *((got_grads[2][k], want_grads[2][k]) for k in sorted(want_grads[2]))]
    for k, (g, w) in enumerate(pairs):
        if lanes == 1:
            assert np.array_equal(_host(g), _host(w)), f"result {k}"
        else:
            np.testing.assert_allclose(_host(g), _host(w), rtol=1e-5, atol=1e-5, err_msg=f"result {k}")
    host_out, _ = cell.run(x, sequence_length=lengths)
    np.testing.assert_allclose(_host(got), host_out, rtol=1e-5, atol=1e-6)
