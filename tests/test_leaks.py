"""Memory stays flat: every public path, called thousands of times, keeps nothing once each call returns.

A call may allocate what it likes while it runs, and the library keeps
caches whose size does not grow with the number of calls (packed weights
per cell, scratch buffers per thread, the pool of large blocks). What a
call must not do is leave something behind: the resident set size (RSS)
after warm-up may grow by at most :data:`BYTES_PER_CALL` per call, 1 MB
over 20,000 calls. (The CPU kernels once leaked their step counters, 0.8 to
9 KB a call: numba never finalises a generator that nopython code runs, and
each generator kept a reference to the arrays it was given.)

RSS moves in pages and the allocator keeps some memory after a burst, so a
path is measured over windows of ``calls`` calls, and it passes when one
window stays within the bound: a leak grows in every window, a warm-up
effect does not. Shapes are those the leak was found at, ``(T, B, I, H) =
(20, 3, 8, 16)`` float32.
"""

import gc
import os
import sys

import numpy as np
import pytest

import nblstm

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")

#: RSS growth allowed per call after warm-up.
BYTES_PER_CALL = 50
T, B, I, H, P = 20, 3, 8, 16, 6
LENGTHS = np.array([T, 11, 5])


def _resident_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def assert_flat(call, calls, warmup=300, windows=4):
    """``call()`` keeps at most :data:`BYTES_PER_CALL` per call in one of ``windows`` windows of ``calls`` calls."""
    for _ in range(warmup):
        call()
    grown = []
    for _ in range(windows):
        gc.collect()
        before = _resident_bytes()
        for _ in range(calls):
            call()
        gc.collect()
        grown.append(_resident_bytes() - before)
        if grown[-1] <= BYTES_PER_CALL * calls:
            return
    per_call = ", ".join(f"{g / calls:.0f}" for g in grown)
    pytest.fail(f"resident memory grew in every window of {calls} calls: {per_call} bytes a call "
                f"(at most {BYTES_PER_CALL} allowed)")


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).standard_normal((T, B, I)).astype(np.float32)


def test_fused_ops_forward_and_backward(x):
    rng = np.random.default_rng(1)
    w = (0.3 * rng.standard_normal((I + H, 4 * H))).astype(np.float32)
    b = np.zeros(4 * H, np.float32)
    peep = (0.1 * rng.standard_normal(H)).astype(np.float32)
    c0 = h0 = np.zeros((B, H), np.float32)

    def call():
        out = nblstm.block_lstm(x, c0, h0, w, b, peep, peep, peep, use_peephole=True)
        nblstm.block_lstm_grad(x, c0, h0, w, out, np.ones_like(out.cs), np.ones_like(out.h), peep, peep, peep,
                               use_peephole=True)
        step = nblstm.lstm_block_cell(x[0], c0, h0, w, b)
        nblstm.lstm_block_cell_grad(x[0], c0, h0, w, step, np.ones_like(c0), np.ones_like(h0))

    assert_flat(call, 2000)


def test_cell_run_and_vjp(x):
    cell = nblstm.LSTMCell(H, num_proj=P, use_peepholes=True, cell_clip=2.0, seed=0)

    def call():
        cell.run(x, sequence_length=LENGTHS)
        (outputs, _), backward = cell.vjp(x, sequence_length=LENGTHS)
        backward(np.ones_like(outputs), None)

    assert_flat(call, 2000)


def test_cell_on_the_fused_kernels_with_lengths_and_schedules(x):
    """The ops' options: lengths, and a reversed masked direction, run on the fused ops' kernels."""
    cell = nblstm.LSTMCell(H, seed=0)
    mask = np.arange(x.shape[0])[None, :] < LENGTHS[:, None]

    def call():
        cell.run(x, sequence_length=LENGTHS)
        (outputs, _), backward = cell.vjp(x, sequence_length=LENGTHS)
        backward(np.ones_like(outputs), None)
        (outputs, _), backward = cell.vjp(x, mask=mask, reverse=True)
        backward(np.ones_like(outputs), None)

    assert_flat(call, 2000)


def test_layer_call_and_vjp(x):
    layer = nblstm.LSTM(I, H, num_layers=2, bidirectional=True, proj_size=P, seed=0)

    def call():
        layer(x, sequence_length=LENGTHS)
        (output, _), backward = layer.vjp(x, sequence_length=LENGTHS)
        backward(np.ones_like(output))

    assert_flat(call, 2000)


def test_stepper(x):
    cell = nblstm.LSTMCell(H, seed=0)
    cell.build(I)
    step = cell.stepper(batch_size=B)

    def call():
        step(x[0])
        step.state  # noqa: B018 - reading the state allocates new arrays

    assert_flat(call, 20_000)


def test_torch_module_forward_and_backward(x):
    torch = pytest.importorskip("torch")
    nt = pytest.importorskip("nblstm.torch")
    module = nt.LSTM(I, H, num_layers=2, bidirectional=True, proj_size=P)
    xt = torch.from_numpy(x)

    def call():
        output, _ = module(xt)
        output.sum().backward()

    assert_flat(call, 2000)


def test_layer_inference_sorted_by_length_and_the_torch_module_on_pytorchs_threads(x, monkeypatch):
    """The layer's inference call that sorts its examples by length and puts them back, and the torch module's
    calls with their workers on PyTorch's OpenMP team (a ctypes callback on each of its threads per call)."""
    from nblstm.cpu import partition, threads

    monkeypatch.setattr(partition, "MIN_PARALLEL_CALL_WORK", 0)  # tiny calls on several workers too
    layer = nblstm.LSTM(I, H, num_layers=2, bidirectional=True, seed=0)
    lengths = np.array([5, T, 11])  # not longest first: sorted and put back at every call

    def call():
        layer(x, sequence_length=lengths)

    assert_flat(call, 2000)
    torch = pytest.importorskip("torch")
    nt = pytest.importorskip("nblstm.torch")
    if nt._TEAM is None:
        pytest.skip("PyTorch's OpenMP runtime was not found")
    module = nt.LSTM(I, 4 * H, num_layers=2)  # B * H * 4H: units split across workers
    xt = torch.from_numpy(x)
    runs = []
    run = nt._TEAM.run
    monkeypatch.setattr(nt._TEAM, "run", lambda *a: runs.append(1) or run(*a))
    monkeypatch.setattr(threads, "LATE_SECONDS", float("inf"))  # on the team however busy the machine
    monkeypatch.setattr(nt._TEAM, "avoid_until", 0.0)

    def train():
        output, _ = module(xt)
        output.sum().backward()

    train()
    assert runs, "no call ran on PyTorch's threads"
    assert_flat(train, 2000)
