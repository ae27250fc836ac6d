"""Host overhead of the CUDA target: kernel launches and device allocations per call.

Every launch and every allocation costs driver calls (tens of microseconds
each on some machines): a regression that adds some per call, or per step,
fails here. Launches are counted at Numba's launch function (the
simulator's kernel call under ``NUMBA_ENABLE_CUDASIM=1``), allocations at
every Numba allocation function the CUDA target could use.

Runs in the simulator or on a GPU, like the other kernel tests.
"""

import contextlib

import numpy as np
import pytest
from numba import cuda

import nblstm
from nblstm import cuda as ncuda

T, B, I, H = 3, 3, 2, 3


class Counts:
    def __init__(self):
        self.launches = 0
        self.allocations = 0

    def __repr__(self):
        return f"Counts(launches={self.launches}, allocations={self.allocations})"


@contextlib.contextmanager
def counting(monkeypatch):
    """Count kernel launches and device allocations made inside the block."""
    counts = Counts()
    with monkeypatch.context() as m:
        # On a GPU every allocation reaches Context.memalloc (counted below);
        # the simulator has no context: count its allocation functions.
        for name in ("device_array", "device_array_like", "to_device", "pinned_array", "mapped_array",
                     "managed_array") if ncuda.SIMULATOR else ():
            original = getattr(cuda, name, None)
            if original is None:
                continue

            def counted(*args, _original=original, **kwargs):
                counts.allocations += 1
                return _original(*args, **kwargs)

            m.setattr(cuda, name, counted)
        if ncuda.SIMULATOR:
            from numba.cuda.simulator import kernel as sim_kernel

            call = sim_kernel.FakeCUDAKernel.__call__

            def counted_call(self, *args):
                if not self._device and not sim_kernel._kernel_context:
                    counts.launches += 1
                return call(self, *args)

            m.setattr(sim_kernel.FakeCUDAKernel, "__call__", counted_call)
        else:
            from numba.cuda import dispatcher
            from numba.cuda.cudadrv import driver

            launch = dispatcher.launch

            def counted_launch(*args, **kwargs):
                counts.launches += 1
                return launch(*args, **kwargs)

            m.setattr(dispatcher, "launch", counted_launch)
            memalloc = driver.Context.memalloc

            def counted_memalloc(self, *args, **kwargs):
                counts.allocations += 1
                return memalloc(self, *args, **kwargs)

            m.setattr(driver.Context, "memalloc", counted_memalloc)
        yield counts


def device_inputs(dtype=np.float32, peepholes=False):
    rng = np.random.default_rng(0)
    shapes = {"x": (T, B, I), "cs_prev": (B, H), "h_prev": (B, H), "w": (I + H, 4 * H), "b": (4 * H,)}
    if peepholes:
        shapes.update(wci=(H,), wcf=(H,), wco=(H,))
    return {k: cuda.to_device(rng.standard_normal(s).astype(dtype)) for k, s in shapes.items()}


def measure(monkeypatch, fn, repeats=3):
    """Counts of the last of ``repeats`` calls (the first two may size the scratch memory kept between calls)."""
    for _ in range(repeats - 1):
        fn()
    with counting(monkeypatch) as counts:
        fn()
    return counts


@pytest.mark.parametrize("persistent", [False, True], ids=["per_step", "persistent"])
def test_forward_launches_and_allocations(monkeypatch, persistent):
    monkeypatch.setattr(ncuda.config, "PERSISTENT", persistent)
    d = device_inputs()
    counts = measure(monkeypatch, lambda: nblstm.block_lstm(d["x"], d["cs_prev"], d["h_prev"], d["w"], d["b"]))
    print("forward", "persistent" if persistent else "per-step", counts)
    # The input GEMM, then one launch per step or one persistent launch.
    assert counts.launches <= 1 + (1 if persistent else T), counts
    # One allocation holds the seven outputs; scratch memory is reused.
    assert counts.allocations <= 1, counts


def test_forward_with_peepholes_and_shorter_sequence(monkeypatch):
    monkeypatch.setattr(ncuda.config, "PERSISTENT", False)
    d = device_inputs(peepholes=True)
    s = T - 1
    counts = measure(monkeypatch, lambda: nblstm.block_lstm(*d.values(), use_peephole=True, seq_len_max=s))
    print("forward, peepholes, seq_len_max < T", counts)
    # One more launch zeroes the steps past seq_len_max of all seven outputs.
    assert counts.launches <= 2 + s, counts
    assert counts.allocations <= 1, counts


def test_float16_forward(monkeypatch):
    monkeypatch.setattr(ncuda.config, "PERSISTENT", False)
    d = device_inputs(np.float16)
    counts = measure(monkeypatch, lambda: nblstm.block_lstm(d["x"], d["cs_prev"], d["h_prev"], d["w"], d["b"]))
    print("forward float16", counts)
    # Five input casts, GEMM, steps, one cast of all outputs.
    assert counts.launches <= 5 + 1 + T + 1, counts
    assert counts.allocations <= 1, counts


@pytest.mark.parametrize("persistent", [False, True], ids=["per_step", "persistent"])
def test_backward_launches_and_allocations(monkeypatch, persistent):
    monkeypatch.setattr(ncuda.config, "PERSISTENT", persistent)
    d = device_inputs()
    core = (d["x"], d["cs_prev"], d["h_prev"], d["w"])
    outs = nblstm.block_lstm(*core, d["b"])
    h_grad = cuda.to_device(np.ones((T, B, H), np.float32))
    counts = measure(monkeypatch, lambda: nblstm.block_lstm_grad(*core, outs, h_grad=h_grad))
    print("backward", "persistent" if persistent else "per-step", counts)
    # Zeroing, the steps, five GEMMs after the loop and the bias-gradient sum.
    assert counts.launches <= 1 + (1 if persistent else T) + 5 + 1, counts
    # One allocation holds the eight gradients.
    assert counts.allocations <= 1, counts


def test_cell_launches_and_allocations(monkeypatch):
    d = device_inputs()
    x1 = d["x"][0]
    fwd = measure(monkeypatch, lambda: nblstm.lstm_block_cell(x1, d["cs_prev"], d["h_prev"], d["w"], d["b"]))
    print("cell forward", fwd)
    assert fwd.launches <= 2, fwd
    assert fwd.allocations <= 1, fwd
    outs = nblstm.lstm_block_cell(x1, d["cs_prev"], d["h_prev"], d["w"], d["b"])
    h_grad = d["cs_prev"]
    bwd = measure(monkeypatch, lambda: nblstm.lstm_block_cell_grad(x1, d["cs_prev"], d["h_prev"], d["w"], outs,
                                                                    h_grad=h_grad))
    print("cell backward", bwd)
    assert bwd.launches <= 2, bwd
    assert bwd.allocations <= 1, bwd
