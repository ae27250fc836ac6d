"""Tests of nblstm.convert: gate permutations and the layouts of TF1, BlockLSTM, Keras, PyTorch and cuDNN."""

import numpy as np
import pytest

import nblstm
from nblstm import convert
from nblstm.reference import cell as ref

I, H, P, T, B = 3, 4, 2, 3, 2


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def ifco_run(w, b, x, c, h, projection=None):
    """Plain IFCO LSTM (Keras / PyTorch / BlockLSTMV2 maths) in float64: outputs [T, B, P]."""
    outs = []
    for t in range(x.shape[0]):
        g = np.concatenate([x[t], h], axis=1) @ w + b
        i, f, gg, o = np.split(g, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(gg)
        h = _sigmoid(o) * np.tanh(c)
        if projection is not None:
            h = h @ projection
        outs.append(h)
    return np.stack(outs)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_permutations(rng):
    a = rng.standard_normal((5, 4 * H))
    np.testing.assert_array_equal(convert.ifco_to_icfo(convert.icfo_to_ifco(a)), a)
    b = convert.icfo_to_ifco(a)
    np.testing.assert_array_equal(b[:, H:2 * H], a[:, 2 * H:3 * H])
    np.testing.assert_array_equal(b[:, 2 * H:3 * H], a[:, H:2 * H])
    np.testing.assert_array_equal(convert.icfo_to_ifco(a.T, axis=0), b.T)
    assert b is not a and not np.shares_memory(b, a)
    with pytest.raises(ValueError, match="4H"):
        convert.icfo_to_ifco(np.zeros(6))
    with pytest.raises(TypeError, match="floating"):
        convert.icfo_to_ifco(np.zeros(8, np.int64))


def test_block_lstm_v1_v2_round_trip_and_equivalence(rng):
    w = rng.standard_normal((I + H, 4 * H)) * 0.5
    b = rng.standard_normal(4 * H)
    w2, b2 = convert.block_lstm_v1_to_v2(w, b, forget_bias=0.75)
    w1, b1 = convert.block_lstm_v2_to_v1(w2, b2, forget_bias=0.75)
    np.testing.assert_array_equal(w1, w)
    np.testing.assert_allclose(b1, b, rtol=0, atol=1e-15)
    x = rng.standard_normal((T, B, I))
    c0, h0 = rng.standard_normal((B, H)), rng.standard_normal((B, H))
    v1 = nblstm.block_lstm(x, c0, h0, w, b, forget_bias=0.75, layout="icfo")
    v2 = nblstm.block_lstm(x, c0, h0, w2, b2, layout="ifco")
    np.testing.assert_allclose(v2.h, v1.h, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(ifco_run(w2, b2, x, c0, h0), v1.h, rtol=1e-12, atol=1e-14)


def test_keras_conversions(rng):
    kernel = rng.standard_normal((I, 4 * H)) * 0.5
    recurrent = rng.standard_normal((H, 4 * H)) * 0.5
    bias = rng.standard_normal(4 * H)
    w, b = convert.keras_to_block_lstm_v2(kernel, recurrent, bias)
    assert w.shape == (I + H, 4 * H)
    back = convert.block_lstm_v2_to_keras(w, b, I)
    for a, e in zip(back, (kernel, recurrent, bias), strict=True):
        np.testing.assert_array_equal(a, e)
    cell_w = convert.keras_to_lstmcell([kernel, recurrent, bias])
    x = rng.standard_normal((T, B, I))
    zeros = np.zeros((B, H))
    out, _, _ = ref.run(cell_w, x, zeros, zeros, forget_bias=0.0)
    np.testing.assert_allclose(out, ifco_run(w, b, x, zeros, zeros), rtol=1e-12, atol=1e-14)
    # forget_bias other than 0 is folded into the bias and back.
    cell_w1 = convert.keras_to_lstmcell(kernel, recurrent, bias, forget_bias=1.0)
    out1, _, _ = ref.run(cell_w1, x, zeros, zeros, forget_bias=1.0)
    np.testing.assert_allclose(out1, out, rtol=1e-12, atol=1e-14)
    k2, r2, b2 = convert.lstmcell_to_keras(cell_w1, forget_bias=1.0)
    np.testing.assert_allclose(b2, bias, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(k2, kernel)
    no_bias = convert.keras_to_lstmcell([kernel, recurrent])
    assert not no_bias["bias"].any()
    with pytest.raises(ValueError, match="recurrent_kernel"):
        convert.keras_to_block_lstm_v2(kernel, recurrent[:, :4], bias)
    with pytest.raises(ValueError, match="bias"):
        convert.keras_to_block_lstm_v2(kernel, recurrent, bias[:4])


@pytest.mark.parametrize("proj", [None, P])
def test_torch_conversions(rng, proj):
    depth = proj or H
    sd = {
        "weight_ih_l0": rng.standard_normal((4 * H, I)),
        "weight_hh_l0": rng.standard_normal((4 * H, depth)),
        "bias_ih_l0": rng.standard_normal(4 * H),
        "bias_hh_l0": rng.standard_normal(4 * H),
    }
    if proj:
        sd["weight_hr_l0"] = rng.standard_normal((proj, H))
    originals = {k: a.copy() for k, a in sd.items()}
    w, b, projection = convert.torch_to_block_lstm_v2(sd)
    assert w.shape == (I + depth, 4 * H)
    np.testing.assert_allclose(b, sd["bias_ih_l0"] + sd["bias_hh_l0"])
    cell_w = convert.torch_to_lstmcell(sd)
    assert ("projection/kernel" in cell_w) == bool(proj)
    x = rng.standard_normal((T, B, I))
    c0, h0 = rng.standard_normal((B, H)), rng.standard_normal((B, depth))
    out, _, _ = ref.run(cell_w, x, c0, h0, forget_bias=0.0)
    np.testing.assert_allclose(out, ifco_run(w, b, x, c0, h0, projection), rtol=1e-12, atol=1e-14)
    back = convert.lstmcell_to_torch(cell_w, forget_bias=0.0)
    np.testing.assert_array_equal(back["weight_ih_l0"], sd["weight_ih_l0"])
    np.testing.assert_array_equal(back["weight_hh_l0"], sd["weight_hh_l0"])
    np.testing.assert_allclose(back["bias_ih_l0"] + back["bias_hh_l0"], b)
    if proj:
        np.testing.assert_array_equal(back["weight_hr_l0"], sd["weight_hr_l0"])
    for k, a in originals.items():
        np.testing.assert_array_equal(sd[k], a)
    # Layer and direction suffixes; bias=False modules.
    sd1 = {"weight_ih_l1_reverse": sd["weight_ih_l0"], "weight_hh_l1_reverse": sd["weight_hh_l0"]}
    w1, b1, _ = convert.torch_to_block_lstm_v2(sd1, layer=1, suffix="_reverse")
    np.testing.assert_array_equal(w1[:I], w[:I])
    assert not b1.any()
    with pytest.raises(ValueError, match="weight_ih_l2"):
        convert.torch_to_block_lstm_v2(sd, layer=2)


def test_torch_from_cell_with_forget_bias(rng):
    cell_w = {"kernel": rng.standard_normal((I + H, 4 * H)), "bias": rng.standard_normal(4 * H)}
    sd = convert.lstmcell_to_torch(cell_w, forget_bias=1.0)
    assert not sd["bias_hh_l0"].any()
    w, b, _ = convert.torch_to_block_lstm_v2(sd)
    x = rng.standard_normal((T, B, I))
    zeros = np.zeros((B, H))
    out, _, _ = ref.run(cell_w, x, zeros, zeros, forget_bias=1.0)
    np.testing.assert_allclose(ifco_run(w, b, x, zeros, zeros), out, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="peephole"):
        convert.lstmcell_to_torch({**cell_w, "w_i_diag": np.zeros(H), "w_f_diag": np.zeros(H),
                                   "w_o_diag": np.zeros(H)})
    with pytest.raises(ValueError, match="all of"):
        convert.lstmcell_to_torch({**cell_w, "w_i_diag": np.zeros(H)})
    with pytest.raises(ValueError, match="kernel"):
        convert.lstmcell_to_torch({"bias": cell_w["bias"]})


def test_cudnn_round_trip(rng):
    w = rng.standard_normal((I + H, 4 * H))
    b = rng.standard_normal(4 * H)
    weights, biases = convert.block_lstm_v2_to_cudnn(w, b, I)
    assert [m.shape for m in weights] == [(H, I)] * 4 + [(H, H)] * 4
    np.testing.assert_array_equal(weights[1], w[:I, H:2 * H].T)  # forget gate, input weights
    np.testing.assert_allclose(biases[0] + biases[4], b[:H])
    w2, b2 = convert.cudnn_to_block_lstm_v2(weights, biases)
    np.testing.assert_array_equal(w2, w)
    np.testing.assert_allclose(b2, b, rtol=1e-15)
    with pytest.raises(ValueError, match="8 weight matrices"):
        convert.cudnn_to_block_lstm_v2(weights[:4], biases)


def test_lstmcell_block_lstm_arguments(rng):
    cell_w = {"kernel": rng.standard_normal((I + H, 4 * H)), "bias": rng.standard_normal(4 * H),
              "w_f_diag": rng.standard_normal(H), "w_i_diag": rng.standard_normal(H),
              "w_o_diag": rng.standard_normal(H)}
    args = convert.lstmcell_to_block_lstm(cell_w, forget_bias=0.5, cell_clip=None)
    assert args["cell_clip"] == -1.0 and args["use_peephole"] and args["layout"] == "icfo"
    np.testing.assert_array_equal(args["wcf"], cell_w["w_f_diag"])
    back = convert.block_lstm_to_lstmcell(args["w"], args["b"], args["wci"], args["wcf"], args["wco"])
    for k, a in cell_w.items():
        np.testing.assert_array_equal(back[k], a)
    with pytest.raises(ValueError, match="cell_clip"):
        convert.lstmcell_to_block_lstm(cell_w, cell_clip=0.0)
    with pytest.raises(ValueError, match="projection"):
        convert.lstmcell_to_block_lstm({"kernel": np.zeros((I + P, 4 * H)), "bias": np.zeros(4 * H),
                                        "projection/kernel": np.zeros((H, P))})
    with pytest.raises(ValueError, match="together"):
        convert.block_lstm_to_lstmcell(args["w"], args["b"], args["wci"])


def test_accepts_tensor_like_objects(rng):
    class FakeTensor:
        def __init__(self, a):
            self.a = a

        def detach(self):
            return self

        def cpu(self):
            return self

        def numpy(self):
            return self.a

    a = rng.standard_normal(8)
    np.testing.assert_array_equal(convert.icfo_to_ifco(FakeTensor(a)), convert.icfo_to_ifco(a))
