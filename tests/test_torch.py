"""nblstm.torch.LSTM against torch.nn.LSTM (needs PyTorch, the torch extra; skipped without it)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nt = pytest.importorskip("nblstm.torch")

CASES = [
    dict(),
    dict(num_layers=2, bidirectional=True, proj_size=2, batch_first=True),
    dict(num_layers=3, bidirectional=True),
    dict(num_layers=2, bias=False),
]


def pair(dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    reference = torch.nn.LSTM(3, 4, dtype=dtype, **kwargs)
    lstm = nt.LSTM(3, 4, dtype=dtype, **kwargs)
    assert str(lstm.load_state_dict(reference.state_dict())) == "<All keys matched successfully>"
    return reference, lstm


def inputs(kwargs, dtype=torch.float64, batch=3, steps=5):
    directions = 2 if kwargs.get("bidirectional") else 1
    layers = kwargs.get("num_layers", 1)
    depth = kwargs.get("proj_size") or 4
    shape = (batch, steps, 3) if kwargs.get("batch_first") else (steps, batch, 3)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, dtype=dtype, generator=g).requires_grad_(True)
    h0 = torch.randn(layers * directions, batch, depth, dtype=dtype, generator=g).requires_grad_(True)
    c0 = torch.randn(layers * directions, batch, 4, dtype=dtype, generator=g).requires_grad_(True)
    return x, h0, c0


@pytest.mark.parametrize("kwargs", CASES, ids=str)
def test_outputs_and_every_gradient_match_torch(kwargs):
    reference, lstm = pair(**kwargs)
    x, h0, c0 = inputs(kwargs)
    results = []
    for module in (reference, lstm):
        out, (h_n, c_n) = module(x, (h0, c0))
        R = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
        loss = (out * R).sum() + (h_n * 0.5).sum() + (c_n * -0.25).sum()
        grads = torch.autograd.grad(loss, [x, h0, c0, *module.parameters()])
        results.append((out, h_n, c_n, grads))
    (o1, h1, c1, g1), (o2, h2, c2, g2) = results
    for a, b in ((o1, o2), (h1, h2), (c1, c2), *zip(g1, g2, strict=True)):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs", CASES[:3], ids=str)
def test_packed_sequences_match_torch(kwargs):
    reference, lstm = pair(**kwargs)
    x, h0, c0 = inputs(kwargs)
    lengths = torch.tensor([5, 2, 4])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=kwargs.get("batch_first", False),
                                                     enforce_sorted=False)
    p1, (h1, c1) = reference(packed, (h0, c0))
    p2, (h2, c2) = lstm(packed, (h0, c0))
    assert isinstance(p2, torch.nn.utils.rnn.PackedSequence)
    torch.testing.assert_close(p2.data, p1.data, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(h2, h1, rtol=1e-10, atol=1e-12)
    g1 = torch.autograd.grad(p1.data.sum() + c1.sum(), [x, *reference.parameters()], retain_graph=True)
    g2 = torch.autograd.grad(p2.data.sum() + c2.sum(), [x, *lstm.parameters()])
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def test_gradcheck_float64_inputs_and_parameters():
    kwargs = dict(num_layers=2, bidirectional=True, proj_size=2)
    _, lstm = pair(**kwargs)
    x, h0, c0 = inputs(kwargs, batch=2, steps=3)
    assert torch.autograd.gradcheck(lambda x, h0, c0: lstm(x, (h0, c0))[0], (x, h0, c0))
    names = [n for n, _ in lstm.named_parameters()]
    params = [p.detach().clone().requires_grad_(True) for p in lstm.parameters()]

    def f(*ps):
        return torch.func.functional_call(lstm, dict(zip(names, ps, strict=True)), (x.detach(),))[0]

    assert torch.autograd.gradcheck(f, params)


def test_state_dict_moves_both_ways():
    reference, lstm = pair(torch.float32, num_layers=2, bidirectional=True, proj_size=2)
    other = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2)
    other.load_state_dict(lstm.state_dict())
    x = torch.randn(4, 2, 3)
    torch.testing.assert_close(lstm(x)[0], other(x)[0], rtol=1e-6, atol=1e-6)
    assert list(lstm.state_dict()) == list(reference.state_dict())


def test_a_training_loop_follows_torchs_loss_curve():
    torch.manual_seed(0)
    reference = torch.nn.LSTM(4, 8, num_layers=2)
    lstm = nt.LSTM(4, 8, num_layers=2)
    lstm.load_state_dict(reference.state_dict())
    g = torch.Generator().manual_seed(2)
    x = torch.randn(10, 6, 4, generator=g)
    with torch.no_grad():  # a target the model can learn: another LSTM's outputs
        target = torch.nn.LSTM(4, 8, num_layers=2)(x)[0]
    curves = []
    for module in (reference, lstm):
        opt = torch.optim.Adam(module.parameters(), lr=0.01)
        losses = []
        for _ in range(200):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(module(x)[0], target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(np.array(losses))
    assert curves[1][-1] < 0.5 * curves[1][0]
    np.testing.assert_allclose(curves[1], curves[0], rtol=1e-4)


def test_nblstm_options_peepholes_and_clip():
    lstm = nt.LSTM(3, 4, use_peepholes=True, cell_clip=0.5, dtype=torch.float64)
    assert {"weight_ci_l0", "weight_cf_l0", "weight_co_l0"} <= set(lstm.state_dict())
    with torch.no_grad():
        for name in ("weight_ci_l0", "weight_cf_l0", "weight_co_l0"):
            getattr(lstm, name).uniform_(-0.5, 0.5)
    x, h0, c0 = inputs({}, batch=2, steps=3)
    assert torch.autograd.gradcheck(lambda x: lstm(x)[0], (x,))


def test_inputs_are_not_modified_and_errors_name_the_argument():
    _, lstm = pair(torch.float32)
    x = torch.randn(5, 2, 3)
    before = x.clone()
    lstm(x)
    assert torch.equal(x, before)
    with pytest.raises(TypeError, match="dtype"):
        lstm(x.double())
    with pytest.raises(ValueError, match="input"):
        lstm(torch.randn(5, 2, 7))
    with pytest.raises(ValueError, match="hx"):
        lstm(x, (torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)))
    with pytest.raises(TypeError, match="Tensor or a PackedSequence"):
        lstm(x.numpy())


def test_torch_compile_falls_back_around_the_kernels():
    _, lstm = pair(torch.float32)
    x = torch.randn(5, 2, 3)
    compiled = torch.compile(lstm, backend="eager")
    torch.testing.assert_close(compiled(x)[0], lstm(x)[0])


def test_the_modules_examples():
    import doctest

    assert doctest.testmod(nt, optionflags=doctest.NORMALIZE_WHITESPACE).failed == 0


def test_non_contiguous_inputs_give_the_contiguous_results():
    reference, lstm = pair(torch.float64, num_layers=2, bidirectional=True)
    x = torch.randn(3, 5, 6, dtype=torch.float64)[:, :, ::2].transpose(0, 1)  # [T, B, I] strided
    assert not x.is_contiguous()
    torch.testing.assert_close(lstm(x)[0], lstm(x.contiguous())[0], rtol=0, atol=0)
    torch.testing.assert_close(lstm(x)[0], reference(x)[0], rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------------------
# Dtype moves, and the module as a source and a target of nblstm.LSTM's porting
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("move", ["double", "to_float64"])
def test_double_moves_the_kernels_to_float64(move):
    reference, lstm = pair(torch.float32, num_layers=2, bidirectional=True, proj_size=2)
    reference.double()
    lstm.double() if move == "double" else lstm.to(torch.float64)
    x, h0, c0 = inputs({"num_layers": 2, "bidirectional": True, "proj_size": 2})
    out, (h_n, c_n) = lstm(x, (h0, c0))
    assert out.dtype == torch.float64
    expected, (h_e, c_e) = reference(x, (h0, c0))
    for a, b in ((out, expected), (h_n, h_e), (c_n, c_e)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    (out.sum() + c_n.sum()).backward()
    grads = [p.grad for p in lstm.parameters()]
    lstm.zero_grad()
    x.grad = None
    (expected.sum() + c_e.sum()).backward()
    for g, p in zip(grads, reference.parameters(), strict=True):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-10)


def test_half_and_back_to_float():
    reference, lstm = pair(torch.float32, num_layers=2)
    x = torch.randn(5, 2, 3)
    lstm.half()
    out = lstm(x.half())[0]
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), reference(x)[0], rtol=0, atol=5e-3)
    lstm.float()
    reference.half().float()  # the same weights, rounded to float16 and back
    torch.testing.assert_close(lstm(x)[0], reference(x)[0], rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match=r"torch.bfloat16; nblstm.torch.LSTM computes in torch.float16"):
        lstm.to(torch.bfloat16)(x.bfloat16())


class LSTM(torch.nn.Module):
    """A user's model named like the module it wraps: the name must not decide."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 16, batch_first=True)
        self.fc = torch.nn.Linear(16, 2)


def test_from_torch_finds_the_lstm_inside_a_wrapper_named_lstm():
    torch.manual_seed(0)
    model = LSTM()
    layer = nblstm_layer().from_torch(model)
    assert layer.batch_first
    x = torch.randn(5, 7, 8)
    np.testing.assert_allclose(layer(x.numpy())[0], model.lstm(x)[0].detach().numpy(), rtol=1e-5, atol=1e-6)


def nblstm_layer():
    import nblstm

    return nblstm.LSTM


def test_from_torch_refuses_several_lstms_naming_them_and_odd_lstm_classes():
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = torch.nn.Sequential(torch.nn.LSTM(3, 4))
            self.decoder = torch.nn.LSTM(4, 4)

    with pytest.raises(ValueError, match=r"holds 2 LSTMs \['encoder.0', 'decoder'\]; pass the one to convert, "
                                         r"e.g. from_torch\(model.get_submodule\('decoder'\)\)"):
        nblstm_layer().from_torch(Two())
    assert nblstm_layer().from_torch(Two().get_submodule("encoder.0")).hidden_size == 4

    class Doubling(torch.nn.LSTM):
        def forward(self, x, hx=None):
            return super().forward(2 * x, hx)

    with pytest.raises(ValueError, match="submodule '0' is a .*Doubling, which holds LSTM parameters but is not "
                                         "torch.nn.LSTM"):
        nblstm_layer().from_torch(torch.nn.Sequential(Doubling(3, 4)))

    class Normed(torch.nn.LSTM):  # nn.LSTM's forward, but a parameter of its own
        def __init__(self):
            super().__init__(3, 4)
            self.scale = torch.nn.Parameter(torch.ones(4))

    with pytest.raises(ValueError, match=r"parameters or buffers nn.LSTM does not: \['scale'\]"):
        nblstm_layer().from_torch(Normed())


def test_from_torch_misshapen_weight_hh_names_it():
    sd = torch.nn.LSTM(3, 4).state_dict()
    sd["weight_hh_l0"] = torch.zeros(16, 5)
    with pytest.raises(ValueError, match=r"\['weight_hh_l0'\] has shape \(16, 5\); expected \(16, 4\)"):
        nblstm_layer().from_torch(sd)


def test_from_torch_reads_an_nblstm_torch_module_with_its_options():
    torch.manual_seed(0)
    source = nt.LSTM(3, 4, num_layers=2, bidirectional=True, use_peepholes=True, cell_clip=0.5, forget_bias=1.0,
                     dtype=torch.float64)
    with torch.no_grad():
        for name, p in source.named_parameters():
            if name.startswith("weight_c"):
                p.uniform_(-1, 1)
    layer = nblstm_layer().from_torch(source)
    assert (layer.use_peepholes, layer.cell_clip, layer.forget_bias) == (True, 0.5, 1.0)
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    np.testing.assert_array_equal(layer(x.numpy())[0], source(x)[0].detach().numpy())
    shifted = nblstm_layer().from_torch(source, forget_bias=0.0)
    np.testing.assert_allclose(shifted(x.numpy())[0], layer(x.numpy())[0], rtol=1e-12, atol=1e-12)
    import nblstm

    cell = nblstm.LSTMCell.from_torch(source, layer=1, suffix="_reverse")
    assert (cell.use_peepholes, cell.cell_clip, cell.forget_bias) == (True, 0.5, 0.0)


@pytest.mark.parametrize("kwargs", [dict(), dict(num_layers=2, bidirectional=True, proj_size=2, batch_first=True),
                                    dict(bias=False, dtype=np.float64)], ids=str)
def test_to_torch_is_a_ready_nn_lstm(kwargs):
    import nblstm

    layer = nblstm.LSTM(3, 4, seed=0, forget_bias=1.0 if kwargs.get("bias", True) else 0.0, **kwargs)
    module = layer.to_torch()
    assert type(module) is torch.nn.LSTM
    assert (module.batch_first, module.num_layers, module.bidirectional, module.proj_size, module.bias) == (
        layer.batch_first, layer.num_layers, layer.bidirectional, layer.proj_size, layer.bias)
    x = np.random.default_rng(0).standard_normal((2, 5, 3) if layer.batch_first else (5, 2, 3)).astype(layer.dtype)
    out, (h_n, c_n) = module(torch.from_numpy(x))
    expected, (h_e, c_e) = layer(x)
    tol = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.detach().numpy(), expected, **tol)
    np.testing.assert_allclose(c_n.detach().numpy(), c_e, **tol)
    back = nblstm.LSTM.from_torch(module)
    np.testing.assert_allclose(back(x)[0], expected, **tol)
    with pytest.raises(ValueError, match="no equivalent of config's use_peepholes=True"):
        nblstm.LSTM(3, 4, use_peepholes=True).to_torch()


@pytest.mark.parametrize("kwargs", CASES, ids=str)
def test_no_grad_runs_the_inference_call_with_the_training_bits(kwargs):
    """Under ``torch.no_grad()`` (and with nothing requiring grad) the module runs the layer's inference call:
    no autograd node, the bits of the forward that training runs, and ``nn.LSTM``'s results."""
    reference, lstm = pair(dtype=torch.float32, **kwargs)
    x, h0, c0 = (t.detach().float() for t in inputs(kwargs))
    trained = lstm(x.requires_grad_(True), (h0, c0))
    x = x.detach()
    with torch.no_grad():
        inferred = lstm(x, (h0, c0))
        expected = reference(x, (h0, c0))
    for p in lstm.parameters():
        p.requires_grad_(False)
    frozen = lstm(x, (h0, c0))
    for got in (inferred, frozen):
        assert got[0].grad_fn is None
        for a, b in ((got[0], trained[0]), (got[1][0], trained[1][0]), (got[1][1], trained[1][1])):
            assert torch.equal(a, b.detach())
        for a, b in ((got[0], expected[0]), (got[1][0], expected[1][0]), (got[1][1], expected[1][1])):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_inference_reuses_the_packed_weights_until_a_parameter_changes(monkeypatch):
    """Inference calls keep the layer's weights while the parameters keep their bits; a change made anywhere
    (``.data``, ``load_state_dict``, an optimizer) is seen at the next call."""
    reference, lstm = pair(dtype=torch.float32, num_layers=2)
    x = inputs({}, dtype=torch.float32)[0].detach()
    rebuilt = []
    real = nt._cell_kernel
    monkeypatch.setattr(nt, "_cell_kernel", lambda *a: rebuilt.append(1) or real(*a))
    with torch.no_grad():
        first = lstm(x)[0]
        again = lstm(x)[0]
        assert len(rebuilt) == 2 and torch.equal(first, again)  # two layers built once
        for module in (reference, lstm):
            module.weight_hh_l1.data[0, 0] += 0.5  # .data: no version counter moves
        changed = lstm(x)[0]
        assert len(rebuilt) == 4
        torch.testing.assert_close(changed, reference(x)[0], rtol=1e-5, atol=1e-6)
        assert not torch.equal(changed, first)
        for module in (reference, lstm):
            module.bias_ih_l0.data[3] = float("nan")
            module.bias_ih_l0.data[3] = 0.25  # back to a value: the bits are compared, not a counter
        torch.testing.assert_close(lstm(x)[0], reference(x)[0], rtol=1e-5, atol=1e-6)
    trained = lstm(x.requires_grad_(True))[0]  # a training call rebuilds, and the next inference too
    torch.testing.assert_close(trained.detach(), reference(x.detach())[0].detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/maps"), reason="finds PyTorch's runtime on Linux")
def test_the_kernels_run_on_pytorchs_openmp_threads(monkeypatch):
    """The module's kernel calls run their workers on the team of the OpenMP runtime PyTorch runs on, with the
    bits of nblstm's own threads; the runtime is found whichever copy the process loaded first."""
    import subprocess
    import sys

    from nblstm.cpu import partition, threads

    assert nt._TEAM is not None and "libtorch_cpu" in nt._TEAM.path
    monkeypatch.setattr(partition, "MIN_PARALLEL_CALL_WORK", 0)  # tiny calls on several workers too
    monkeypatch.setattr(threads, "LATE_SECONDS", float("inf"))  # on the team however busy the machine
    monkeypatch.setattr(nt._TEAM, "avoid_until", 0.0)
    calls = []
    run = nt._TEAM.run
    monkeypatch.setattr(nt._TEAM, "run",
                        lambda fn, args, workers, *timed: calls.append(workers) or run(fn, args, workers, *timed))
    torch.manual_seed(0)
    lstm = nt.LSTM(16, 32, num_layers=2, bidirectional=True)  # B * H * 4H: units split across workers
    x = torch.randn(6, 8, 16)
    out = lstm(x)[0]
    out.sum().backward()
    assert calls, "no kernel call ran on PyTorch's threads"
    grads = [p.grad.clone() for p in lstm.parameters()]
    monkeypatch.setattr(nt, "_TEAM", None)  # the same on nblstm's own threads
    lstm.zero_grad()
    again = lstm(x)[0]
    again.sum().backward()
    assert torch.equal(out, again) and all(torch.equal(a, p.grad) for a, p in zip(grads, lstm.parameters()))
    # numba's OpenMP threading layer first: PyTorch then runs on the system's libgomp, and the team is that one.
    code = ("import numba; numba.get_num_threads(); import torch, nblstm.torch as nt; "
            "print(nt._TEAM is not None and nt._TEAM.run(lambda w: None, (), 2) is None)")
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert found.stdout.strip() == "True", found.stderr


def test_the_teams_threads_keep_their_python_thread_state_between_calls():
    """A team thread keeps the thread state its first call made (ctypes otherwise makes one per callback): what
    a worker leaves in a thread-local on a team thread is still there at the next call on that thread."""
    import threading

    if torch.get_num_threads() < 2:
        pytest.skip("PyTorch runs on one thread here")
    local = threading.local()
    seen = {}

    def worker(w, call):
        if w:
            seen[call] = (threading.get_ident(), getattr(local, "call", None))
            local.call = call

    for call in range(3):
        nt._TEAM.run(worker, (call,), 2)
    if len(seen) < 3 or len({ident for ident, _ in seen.values()}) != 1:
        pytest.skip("the runtime did not run worker 1 on one team thread each time")
    assert [before for _, before in seen.values()] == [None, 0, 1]


def test_a_team_thread_that_starts_late_sends_the_next_calls_to_nblstms_threads(monkeypatch):
    """Two of the last four calls whose end waits for a late team thread (its core busy with other work) send
    the calls of the next ``AVOID_SECONDS`` to nblstm's own threads, then the team is tried again; one late
    call, or calls on time, stay on the team."""
    import threading

    from nblstm.cpu import threads

    team = nt._TEAM
    names = []

    def worker(w):
        if w:
            names.append(threading.current_thread().name)

    monkeypatch.setattr(team, "avoid_until", 0.0)
    monkeypatch.setattr(team, "_recent", 0)
    monkeypatch.setattr(threads, "LATE_SECONDS", 0.5)  # on time, however busy the machine
    with threads.on_team(team):
        threads.run(worker, (), 2)
        assert team.usable()
        monkeypatch.setattr(threads, "LATE_SECONDS", -1.0)  # every team thread late
        threads.run(worker, (), 2)
        if names[-1] == threading.current_thread().name:
            pytest.skip("the runtime ran the call on one thread")
        assert team.usable()  # one late call: the runtime may have been starting its threads
        threads.run(worker, (), 2)
        assert not team.usable()
        threads.run(worker, (), 2)  # on nblstm's own helper
        assert names[-1] == "nblstm-worker" and names[0] != "nblstm-worker"
        monkeypatch.setattr(team, "avoid_until", 0.0)  # the window over: the team again
        threads.run(worker, (), 2)
        assert names[-1] != "nblstm-worker"


def test_work_of_unequal_parts_does_not_count_as_a_late_team():
    """``run_each``'s jobs take unequal times: their calls are not timed. ``transpose_gates`` gives the larger
    matrix to the calling thread (worker 0), so that the caller's wait measures the other thread alone. Checked
    on the mechanism, not on timings (a busy machine makes any thread late)."""
    import time

    from nblstm.convert import SWAP_CF_BLOCKS
    from nblstm.cpu import pack, threads

    team = nt._TEAM
    timed, first = [], []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(team, "avoid_until", 0.0)
        mp.setattr(team, "_waited", lambda delay: timed.append(delay))
        mp.setattr(pack, "MIN_PARALLEL_TRANSPOSE", 0)
        run = threads.run
        def recording(fn, args, *rest, **kw):
            if fn is pack._transpose_worker:
                first.append(args[0].shape)
            return run(fn, args, *rest, **kw)

        mp.setattr(threads, "run", recording)
        small, large = np.ones((64, 4), np.float32), np.ones((64, 4096), np.float32)
        with threads.on_team(team):
            threads.run_each([lambda: None, lambda: time.sleep(0.01)])
            if torch.get_num_threads() > 1:
                assert not timed, "run_each's jobs were timed"
            for pairs in ([(small, np.empty((4, 64), np.float32)), (large, np.empty((4096, 64), np.float32))],
                          [(large, np.empty((4096, 64), np.float32)), (small, np.empty((4, 64), np.float32))]):
                first.clear()
                pack.transpose_gates(pairs, SWAP_CF_BLOCKS, True)
                assert first == [(64, 4096)], "the larger matrix is not worker 0's"


def test_the_kept_thread_states_do_not_pile_up_when_the_team_shrinks():
    """A region of fewer threads than the last ends the runtime's threads past it: only thread 1, in every
    call, keeps a Python thread state, so that regions of 4 and 2 threads in turn leave no states behind."""
    import ctypes

    api = ctypes.pythonapi
    api.PyInterpreterState_Get.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.restype = ctypes.c_void_p
    api.PyInterpreterState_ThreadHead.argtypes = [ctypes.c_void_p]
    api.PyThreadState_Next.restype = ctypes.c_void_p
    api.PyThreadState_Next.argtypes = [ctypes.c_void_p]

    def thread_states():
        count, state = 0, api.PyInterpreterState_ThreadHead(api.PyInterpreterState_Get())
        while state:
            count, state = count + 1, api.PyThreadState_Next(state)
        return count

    before = torch.get_num_threads()
    torch.set_num_threads(4)
    try:
        if nt._TEAM._max_threads() < 4:
            pytest.skip("the runtime gives fewer than 4 threads")
        for _ in range(3):
            nt._TEAM.run(lambda w: None, (), 4)
            nt._TEAM.run(lambda w: None, (), 2)
        first = thread_states()
        for _ in range(20):
            nt._TEAM.run(lambda w: None, (), 4)
            nt._TEAM.run(lambda w: None, (), 2)
        assert thread_states() <= first
    finally:
        torch.set_num_threads(before)


def test_weights_changed_between_forward_and_backward_do_not_reach_the_gradients():
    """The layer keeps its own weights (``set_cell_weights(copy=False)`` takes only arrays made for it): a
    parameter changed in place after the forward leaves the backward's gradients as they were, a projection
    of one unit (whose transpose is C-contiguous) included."""
    for proj_size in (1, 2):
        torch.manual_seed(0)
        module = nt.LSTM(3, 4, proj_size=proj_size, use_peepholes=True)
        x = torch.randn(5, 2, 3)
        grads = []
        for change in (False, True):
            module.zero_grad()
            out = module(x)[0]
            if change:
                with torch.no_grad():
                    for p in module.parameters():
                        p.mul_(2.0)
            out.sum().backward()
            grads.append([p.grad.clone() for p in module.parameters()])
            if change:
                with torch.no_grad():
                    for p in module.parameters():
                        p.mul_(0.5)
        for a, b in zip(*grads, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
