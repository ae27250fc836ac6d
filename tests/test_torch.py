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
