"""Tests of nblstm.porting (PyTorch, Keras, ONNX and TensorFlow weights), the ONNX converters and the LSTMCell
conversions built on them.

Each framework's layout is checked against an independent NumPy LSTM written in that framework's own layout
(its gate order, its bias terms), and against the frameworks' results stored in ``tests/fixtures`` (one
direction of one layer here; whole layers are tested with ``nblstm.LSTM``). No framework is needed, except
``onnx`` for the ONNX tests.
"""

import json
import os
import re

import numpy as np
import pytest

import nblstm
from nblstm import LSTMCell, LSTMStateTuple, convert, porting

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
F32 = {"rtol": 1e-5, "atol": 1e-5}
F64 = {"rtol": 1e-10, "atol": 1e-12}


def _tol(dtype):
    return F64 if np.dtype(dtype) == np.float64 else F32


def _fixture(name):
    path = os.path.join(FIXTURES, name)
    if not os.path.exists(path):
        pytest.skip(f"{name} not generated")
    data = np.load(path)
    return json.loads(str(data["index"])), data


# ----------------------------------------------------------------------------------------------------
# Independent NumPy LSTMs, each in its framework's layout (float64)
# ----------------------------------------------------------------------------------------------------


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _hard_sigmoid(x):
    return np.clip(x / 6.0 + 0.5, 0.0, 1.0)


_ACT = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0), "sigmoid": _sigmoid, "hard_sigmoid": _hard_sigmoid}


def torch_lstm(sd, x, h, c, layer=0, suffix=""):
    """One direction of one nn.LSTM layer, time-major, from its state dict (gates i, f, g, o)."""
    def p(stem):
        key = f"{stem}_l{layer}{suffix}"
        return np.asarray(sd[key], np.float64) if key in sd else None
    w_ih, w_hh, b_ih, b_hh, w_hr = (p(s) for s in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"))
    outs = []
    for t in range(x.shape[0]):
        z = x[t] @ w_ih.T + h @ w_hh.T
        if b_ih is not None:
            z = z + b_ih + b_hh
        i, f, g, o = np.split(z, 4, axis=1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        h = _sigmoid(o) * np.tanh(c)
        if w_hr is not None:
            h = h @ w_hr.T
        outs.append(h)
    return np.stack(outs), h, c


def keras_lstm(weights, x, activation="tanh", recurrent_activation="sigmoid", h=None, c=None):
    """A Keras LSTM, time-major: z = x @ kernel + h @ recurrent_kernel + bias, gates i, f, c, o."""
    kernel, recurrent_kernel = (np.asarray(a, np.float64) for a in weights[:2])
    bias = np.asarray(weights[2], np.float64) if len(weights) > 2 else 0.0
    units = recurrent_kernel.shape[0]
    act, gate = _ACT[activation], _ACT[recurrent_activation]
    h = np.zeros((x.shape[1], units)) if h is None else h
    c = np.zeros((x.shape[1], units)) if c is None else c
    outs = []
    for t in range(x.shape[0]):
        i, f, cc, o = np.split(x[t] @ kernel + h @ recurrent_kernel + bias, 4, axis=1)
        c = gate(f) * c + gate(i) * act(cc)
        h = gate(o) * act(c)
        outs.append(h)
    return np.stack(outs), h, c


def onnx_lstm(W, R, B, P, x, h, c, lengths=None, reverse=False):
    """One direction of an ONNX LSTM (gates i, o, f, c; peepholes i, o, f), time-major, ``Y`` zero past a length.

    The reverse direction runs each example reversed within its own length.
    """
    W, R = np.asarray(W, np.float64), np.asarray(R, np.float64)
    units = R.shape[1]
    b = 0.0 if B is None else np.asarray(B[:4 * units] + B[4 * units:], np.float64)
    p = np.zeros(3 * units) if P is None else np.asarray(P, np.float64)
    steps, batch = x.shape[:2]
    lengths = np.full(batch, steps) if lengths is None else np.asarray(lengths)
    y = np.zeros((steps, batch, units))
    h, c = np.array(h, np.float64), np.array(c, np.float64)
    for n in range(batch):
        times = range(lengths[n] - 1, -1, -1) if reverse else range(lengths[n])
        hn, cn = h[n], c[n]
        for t in times:
            i, o, f, cc = np.split(x[t, n] @ W.T + hn @ R.T + b, 4)
            i = _sigmoid(i + p[:units] * cn)
            f = _sigmoid(f + p[2 * units:] * cn)
            cn = f * cn + i * np.tanh(cc)
            o = _sigmoid(o + p[units:2 * units] * cn)
            hn = o * np.tanh(cn)
            y[t, n] = hn
        h[n], c[n] = hn, cn
    return y, h, c


def reverse_within(x, lengths):
    """Each example of ``x [T, B, ...]`` reversed within its length (tf.reverse_sequence)."""
    out = np.array(x, copy=True)
    for n, length in enumerate(lengths):
        out[:length, n] = x[:length, n][::-1]
    return out


def random_torch_state_dict(rng, input_size=3, hidden_size=4, num_layers=1, bidirectional=False, proj_size=0,
                            bias=True, dtype=np.float64):
    sd = {}
    depth = proj_size or hidden_size
    directions = 2 if bidirectional else 1
    for layer in range(num_layers):
        for suffix in ("", "_reverse")[:directions]:
            inputs = input_size if layer == 0 else directions * depth
            sd[f"weight_ih_l{layer}{suffix}"] = rng.standard_normal((4 * hidden_size, inputs)) * 0.5
            sd[f"weight_hh_l{layer}{suffix}"] = rng.standard_normal((4 * hidden_size, depth)) * 0.5
            if bias:
                sd[f"bias_ih_l{layer}{suffix}"] = rng.standard_normal(4 * hidden_size) * 0.5
                sd[f"bias_hh_l{layer}{suffix}"] = rng.standard_normal(4 * hidden_size) * 0.5
            if proj_size:
                sd[f"weight_hr_l{layer}{suffix}"] = rng.standard_normal((proj_size, hidden_size)) * 0.5
    return {k: a.astype(dtype) for k, a in sd.items()}


def random_keras_weights(rng, inputs, units, use_bias=True):
    weights = [rng.standard_normal((inputs, 4 * units)) * 0.5, rng.standard_normal((units, 4 * units)) * 0.5]
    return weights + ([rng.standard_normal(4 * units) * 0.5] if use_bias else [])


def keras_lstm_dict(weights, **config):
    units = np.shape(weights[1])[0]
    return {"class_name": "LSTM", "weights": weights,
            "config": {"units": units, "use_bias": len(weights) == 3, "return_sequences": True, **config}}


def keras_bidirectional_dict(forward, backward, **config):
    return {"class_name": "Bidirectional", "config": {"layer": forward, "merge_mode": "concat", **config},
            "weights": forward["weights"] + backward["weights"]}


def fake(kind, **attributes):
    """An object of a class named ``kind`` (duck-typed framework objects)."""
    return type(kind, (), attributes)()


def keras_layer(kind, config, weights):
    return fake(kind, get_config=lambda self: dict(config), get_weights=lambda self: list(weights))


def torch_module(kind, state_dict, **attributes):
    """A module of ``torch.nn``'s class ``kind`` holding the parameters ``state_dict`` (as the reader sees one)."""
    cls = type(kind, (), {"state_dict": lambda self: dict(state_dict), "forward": lambda self, *args: None,
                          "named_parameters": lambda self, recurse=True: iter(dict(state_dict).items()), **attributes})
    cls.__module__ = "torch.nn.modules.rnn"
    return cls()


@pytest.fixture
def rng():
    return np.random.default_rng(16)


# ----------------------------------------------------------------------------------------------------
# PyTorch
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [
    {},
    {"num_layers": 2, "bidirectional": True, "proj_size": 2},
    {"num_layers": 3, "bias": False},
    {"bidirectional": True, "hidden_size": 1, "input_size": 1},
])
def test_torch_read_layout_per_cell(rng, options):
    sd = random_torch_state_dict(rng, **options)
    config, cells = porting.torch.read(sd)
    num_layers, bidirectional = options.get("num_layers", 1), options.get("bidirectional", False)
    assert config["num_layers"] == num_layers and config["bidirectional"] == bidirectional
    assert config["proj_size"] == options.get("proj_size", 0) and config["bias"] == options.get("bias", True)
    assert config["input_size"] == options.get("input_size", 3) and config["hidden_size"] == options.get(
        "hidden_size", 4)
    assert config["batch_first"] is False and config["dtype"] == "float64" and config["forget_bias"] == 0.0
    directions = 2 if bidirectional else 1
    assert len(cells) == num_layers * directions
    units, depth = config["hidden_size"], config["proj_size"] or config["hidden_size"]
    for k, weights in enumerate(cells):
        layer, suffix = k // directions, "_reverse" if k % directions else ""
        inputs = config["input_size"] if layer == 0 else directions * depth
        assert weights["kernel"].shape == (inputs + depth, 4 * units)
        x = rng.standard_normal((4, 2, inputs))
        h0, c0 = rng.standard_normal((2, depth)) * 0.5, rng.standard_normal((2, units))
        expected = torch_lstm(sd, x, h0, c0, layer, suffix)
        cell = LSTMCell.from_torch(sd, layer=layer, suffix=suffix)
        assert cell.forget_bias == 0.0 and cell.num_proj == (config["proj_size"] or None)
        outputs, final = cell.run(x, LSTMStateTuple(c0, h0))
        np.testing.assert_allclose(outputs, expected[0], **F64)
        np.testing.assert_allclose(final.h, expected[1], **F64)
        np.testing.assert_allclose(final.c, expected[2], **F64)
        # The same cell from porting's weights directly.
        direct = LSTMCell(units, num_proj=config["proj_size"] or None, forget_bias=0.0)
        direct.set_weights(weights)
        np.testing.assert_array_equal(direct.run(x)[0], cell.run(x)[0])


def test_torch_from_torch_forget_bias_is_exact(rng):
    sd = random_torch_state_dict(rng)
    x = rng.standard_normal((3, 2, 3))
    plain = LSTMCell.from_torch(sd)
    shifted = LSTMCell.from_torch(sd, forget_bias=1.0)
    assert shifted.forget_bias == 1.0
    np.testing.assert_allclose(shifted.run(x)[0], plain.run(x)[0], **F64)


def test_torch_write_round_trip(rng):
    sd = random_torch_state_dict(rng, num_layers=2, bidirectional=True, proj_size=3)
    config, cells = porting.torch.read(sd)
    back = porting.torch.write(config, cells)
    assert list(back) == list(sd)   # PyTorch's order: per layer and direction ih, hh, biases, hr
    for key, a in sd.items():
        if key.startswith("bias_ih"):
            np.testing.assert_allclose(back[key], a + sd[key.replace("bias_ih", "bias_hh")], **F64)
        elif key.startswith("bias_hh"):
            assert not back[key].any()
        else:
            np.testing.assert_array_equal(back[key], a)
    # forget_bias is folded into bias_ih's forget block (rows H:2H).
    shifted = porting.torch.write({**config, "forget_bias": 0.5}, cells)
    np.testing.assert_allclose(shifted["bias_ih_l1"] - back["bias_ih_l1"], np.repeat([0, 0.5, 0, 0], 4), **F64)
    nobias = random_torch_state_dict(rng, bias=False)
    config, cells = porting.torch.read(nobias)
    assert sorted(porting.torch.write(config, cells)) == sorted(nobias)


def test_torch_module_duck_typed(rng):
    sd = random_torch_state_dict(rng, num_layers=2, proj_size=2)
    module = torch_module("LSTM", sd, mode="LSTM", input_size=3, hidden_size=4, num_layers=2, bias=True,
                          batch_first=True, bidirectional=False, proj_size=2, dropout=0.25)
    config, cells = porting.torch.read(module)
    assert config["batch_first"] is True and config["dropout"] == 0.25 and config["num_layers"] == 2
    assert porting.torch.read(module, batch_first=False)[0]["batch_first"] is False
    # A model holding one LSTM: its state dict has the LSTM's prefix.
    holder = fake("Model", state_dict=lambda self: {f"lstm.{k}": a for k, a in sd.items()},
                  named_modules=lambda self: iter([("", self), ("lstm", module)]))
    assert porting.torch.read(holder)[0] == config
    prefixed = {**{f"encoder.lstm.{k}": a for k, a in sd.items()}, "head.weight": np.zeros((2, 2))}
    np.testing.assert_array_equal(porting.torch.read(prefixed)[1][1]["kernel"], cells[1]["kernel"])
    # nn.LSTMCell's keys have no layer number.
    cell_sd = {k.replace("_l0", ""): a for k, a in random_torch_state_dict(rng).items()}
    cell_config, cell_cells = porting.torch.read(torch_module("LSTMCell", cell_sd, input_size=3, hidden_size=4,
                                                              bias=True))
    assert cell_config["num_layers"] == 1 and cell_cells[0]["kernel"].shape == (7, 16)
    # Tensors: anything with detach().cpu().numpy().
    tensor = fake("Tensor", detach=lambda self: self, cpu=lambda self: self,
                  numpy=lambda self: sd["weight_ih_l0"].astype(np.float32))
    tensor64 = fake("Tensor", detach=lambda self: self, cpu=lambda self: self, numpy=lambda self: sd["weight_ih_l0"])
    np.testing.assert_array_equal(porting.torch.read({**sd, "weight_ih_l0": tensor64})[1][0]["kernel"],
                                  cells[0]["kernel"])
    with pytest.raises(TypeError, match="mixes dtypes"):
        porting.torch.read({**sd, "weight_ih_l0": tensor})


def test_torch_refusals(rng):
    sd = random_torch_state_dict(rng, num_layers=2)
    gru = {"weight_ih_l0": np.zeros((12, 3)), "weight_hh_l0": np.zeros((12, 4)), "bias_ih_l0": np.zeros(12),
           "bias_hh_l0": np.zeros(12)}
    with pytest.raises(ValueError, match=r"from_torch got an nn.GRU \(weight_ih_l0 has 3 \* hidden_size rows\); "
                                         r"nblstm converts nn.LSTM only"):
        LSTMCell.from_torch(gru)
    with pytest.raises(ValueError, match="nn.GRU"):
        porting.torch.read(torch_module("GRU", gru, mode="GRU"))
    with pytest.raises(ValueError, match="nn.RNN"):
        porting.torch.read({"weight_ih_l0": np.zeros((4, 3)), "weight_hh_l0": np.zeros((4, 4))})
    with pytest.raises(ValueError, match="nn.GRU"):
        porting.torch.read(fake("Net", state_dict=lambda self: {}, named_modules=lambda self: iter(
            [("", self), ("rnn", torch_module("GRU", gru, mode="GRU"))])))
    with pytest.raises(ValueError, match="suffix"):
        LSTMCell.from_torch(sd, suffix="_rev")
    with pytest.raises(ValueError, match="suffix='_reverse' but the nn.LSTM is not bidirectional"):
        LSTMCell.from_torch(sd, suffix="_reverse")
    with pytest.raises(ValueError, match="layer=2 but the nn.LSTM has num_layers=2"):
        LSTMCell.from_torch(sd, layer=2)
    with pytest.raises(TypeError, match="layer must be an int"):
        LSTMCell.from_torch(sd, layer="1")
    with pytest.raises(ValueError, match="lacks 'weight_hh_l1'"):
        porting.torch.read({k: a for k, a in sd.items() if k != "weight_hh_l1"})
    with pytest.raises(ValueError, match=r"module_or_state_dict\['weight_ih_l1'\] has shape \(16, 3\); expected "
                                         r"\(16, 4\)"):
        porting.torch.read({**sd, "weight_ih_l1": np.zeros((16, 3))})
    with pytest.raises(ValueError, match="lacks 'weight_hh_l0_reverse'"):
        porting.torch.read({**sd, "weight_ih_l0_reverse": np.zeros((16, 3))})
    with pytest.raises(ValueError, match=r"not part of an nn.LSTM .*proj_size=0.*\['weight_hr_l1'\]"):
        porting.torch.read({**sd, "weight_hr_l1": np.zeros((2, 4))})
    with pytest.raises(ValueError, match="no nn.LSTM parameters"):
        porting.torch.read({"weight": np.zeros(3)})
    with pytest.raises(ValueError, match="2 recurrent modules"):
        porting.torch.read({**{f"a.{k}": v for k, v in sd.items()}, **{f"b.{k}": v for k, v in sd.items()}})
    with pytest.raises(ValueError, match="holds 2 LSTMs"):
        porting.torch.read(fake("Net", state_dict=lambda self: {}, named_modules=lambda self: iter(
            [("", self), ("a", torch_module("LSTM", sd, mode="LSTM")), ("b", torch_module("LSTM", sd, mode="LSTM"))])))
    with pytest.raises(TypeError, match="module_or_state_dict must be"):
        porting.torch.read(42)
    with pytest.raises(TypeError, match="batch_first"):
        porting.torch.read(sd, batch_first=1)
    with pytest.raises(ValueError, match="num_layers=3 but its parameters give 2"):
        porting.torch.read(torch_module("LSTM", sd, mode="LSTM", num_layers=3))
    with pytest.raises(TypeError, match="num_proj comes from the nn.LSTM"):
        LSTMCell.from_torch(sd, num_proj=2)
    with pytest.raises(ValueError, match="activation='relu' disagrees with the nn.LSTM's activation='tanh'"):
        LSTMCell.from_torch(sd, activation="relu")


def test_torch_write_refusals(rng):
    config, cells = porting.torch.read(random_torch_state_dict(rng))
    for change, match in (({"activation": "relu"}, "activation='relu'"),
                          ({"recurrent_activation": "hard_sigmoid"}, "recurrent_activation='hard_sigmoid'"),
                          ({"cell_clip": 1.0}, "cell_clip=1.0"), ({"proj_clip": 1.0}, "proj_clip=1.0"),
                          ({"use_peepholes": True}, "use_peepholes=True"),
                          ({"bias": False}, "bias=False but cells\\[0\\]'s bias"),
                          ({"num_layers": 2}, "cells has 1 entries"),
                          ({"hidden_size": 5}, "config\\['hidden_size'\\] is 5")):
        with pytest.raises(ValueError, match=match):
            porting.torch.write({**config, **change}, cells)
    peep = {**cells[0], **{n: np.zeros(4) for n in ("w_i_diag", "w_f_diag", "w_o_diag")}}
    with pytest.raises(ValueError, match="peephole"):
        porting.torch.write(config, [peep])
    zero = {"kernel": cells[0]["kernel"], "bias": np.zeros(16)}
    assert "bias_ih_l0" not in porting.torch.write({**config, "bias": False}, [zero])
    with pytest.raises(ValueError, match="bias=False but"):
        porting.torch.write({**config, "bias": False, "forget_bias": 1.0}, [zero])


def test_cell_to_torch_layer_suffix_and_refusals(rng):
    cell = LSTMCell(4, seed=0, forget_bias=1.0, dtype=np.float64)
    cell.build(3)
    sd = cell.to_torch(layer=1, suffix="_reverse")
    assert sorted(sd) == ["bias_hh_l1_reverse", "bias_ih_l1_reverse", "weight_hh_l1_reverse", "weight_ih_l1_reverse"]
    with pytest.raises(ValueError, match="suffix"):
        cell.to_torch(suffix="reverse")
    with pytest.raises(ValueError, match="layer must be >= 0"):
        cell.to_torch(layer=-1)
    hard = LSTMCell(4, recurrent_activation="hard_sigmoid", seed=0)
    hard.build(3)
    with pytest.raises(ValueError, match="recurrent_activation 'hard_sigmoid'"):
        hard.to_torch()
    kernel, recurrent_kernel, bias = hard.to_keras()   # Keras 3 has hard_sigmoid
    assert kernel.shape == (3, 16)


# ----------------------------------------------------------------------------------------------------
# Keras
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation, recurrent_activation, use_bias", [
    ("tanh", "sigmoid", True), ("relu", "hard_sigmoid", False), ("sigmoid", "sigmoid", True)])
def test_keras_layer_numerics(rng, activation, recurrent_activation, use_bias):
    weights = random_keras_weights(rng, 3, 4, use_bias)
    config = {"name": "lstm", "units": 4, "activation": activation, "recurrent_activation": recurrent_activation,
              "use_bias": use_bias, "return_sequences": True}
    x = rng.standard_normal((5, 2, 3)) * 3   # [T, B, I]; beyond hard_sigmoid's [-3, 3] often
    expected = keras_lstm(weights, x, activation, recurrent_activation)
    for source in (keras_layer("LSTM", config, weights), {"class_name": "LSTM", "config": config, "weights": weights},
                   [keras_layer("InputLayer", {}, []), keras_layer("LSTM", config, weights)]):
        cell = LSTMCell.from_keras(source)
        assert cell.activation.name == activation and cell.recurrent_activation == recurrent_activation
        outputs, final = cell.run(x)
        np.testing.assert_allclose(outputs, expected[0], **F64)
        np.testing.assert_allclose(final.c, expected[2], **F64)
    config_out, cells = porting.keras.read({"class_name": "LSTM", "config": config, "weights": weights})
    assert config_out["batch_first"] is True and config_out["bias"] is use_bias
    assert config_out["activation"] == activation and config_out["recurrent_activation"] == recurrent_activation
    assert config_out["dropout"] == 0.0 and config_out["forget_bias"] == 0.0 and config_out["num_layers"] == 1
    if not use_bias:
        assert not cells[0]["bias"].any()


def test_keras_bare_weights_and_kwargs(rng):
    weights = random_keras_weights(rng, 3, 2)
    x = rng.standard_normal((3, 2, 3))
    cell = LSTMCell.from_keras(weights, activation="relu", recurrent_activation="hard_sigmoid")
    np.testing.assert_allclose(cell.run(x)[0], keras_lstm(weights, x, "relu", "hard_sigmoid")[0], **F64)
    layer = keras_lstm_dict(weights, activation="tanh")
    with pytest.raises(ValueError, match="activation='relu' disagrees with the Keras layer's activation='tanh'"):
        LSTMCell.from_keras(layer, activation="relu")
    assert LSTMCell.from_keras(layer, activation="tanh", forget_bias=1.0).forget_bias == 1.0
    np.testing.assert_allclose(LSTMCell.from_keras(layer, forget_bias=1.0).run(x)[0], keras_lstm(weights, x)[0],
                               **F64)
    config, cells = porting.keras.read(weights)          # a bare weight list: Keras's default activations
    assert (config["activation"], config["recurrent_activation"]) == ("tanh", "sigmoid")
    config, cells = porting.keras.read(weights + random_keras_weights(rng, 3, 2))   # a Bidirectional's
    assert config["bidirectional"] and len(cells) == 2
    with pytest.raises(ValueError, match="use nblstm.LSTM.from_keras"):
        LSTMCell.from_keras(weights + random_keras_weights(rng, 3, 2))
    with pytest.raises(ValueError, match="list of 5 arrays"):
        porting.keras.read(weights + weights[:2])


def test_keras_bidirectional_and_stack(rng):
    fw, bw = keras_lstm_dict(random_keras_weights(rng, 3, 4)), keras_lstm_dict(random_keras_weights(rng, 3, 4))
    bi = keras_bidirectional_dict(fw, bw)
    config, cells = porting.keras.read(bi)
    assert config["bidirectional"] and config["num_layers"] == 1 and len(cells) == 2
    x = rng.standard_normal((4, 2, 3))
    for weights, cell in zip((fw["weights"], bw["weights"]), cells):
        c = LSTMCell(4, forget_bias=0.0)
        c.set_weights(cell)
        np.testing.assert_allclose(c.run(x)[0], keras_lstm(weights, x)[0], **F64)
    # An explicit backward layer.
    explicit = keras_bidirectional_dict(fw, bw, backward_layer={**bw, "config": {**bw["config"], "go_backwards": True}})
    np.testing.assert_array_equal(porting.keras.read(explicit)[1][1]["kernel"], cells[1]["kernel"])
    # A stack: Bidirectional(LSTM(4)) -> Bidirectional(LSTM(4)), from a list, a model or layer objects.
    second = keras_bidirectional_dict(keras_lstm_dict(random_keras_weights(rng, 8, 4)),
                                      keras_lstm_dict(random_keras_weights(rng, 8, 4)))
    config, cells = porting.keras.read([bi, second])
    assert config["num_layers"] == 2 and [c["kernel"].shape for c in cells] == [(7, 16)] * 2 + [(12, 16)] * 2
    objects = [keras_layer(d["class_name"], d["config"], d["weights"]) for d in (bi, second)]
    model = fake("Sequential", layers=[keras_layer("InputLayer", {}, []), keras_layer("Masking", {}, []),
                                       objects[0], keras_layer("Dropout", {}, []), objects[1],
                                       keras_layer("Dense", {}, [np.zeros((8, 1))])])
    for source in (objects, model):
        config2, cells2 = porting.keras.read(source)
        assert config2 == config
        for a, b in zip(cells, cells2):
            np.testing.assert_array_equal(a["kernel"], b["kernel"])
    # Layers of different sizes: one by one.
    uni = keras_lstm_dict(random_keras_weights(rng, 8, 2))
    with pytest.raises(ValueError, match="read_layers"):
        porting.keras.read([bi, uni])
    layers = porting.keras.read_layers([bi, uni])
    assert [(c["input_size"], c["hidden_size"], c["bidirectional"], len(w)) for c, w in layers] == [
        (3, 4, True, 2), (8, 2, False, 1)]


def test_keras_write_round_trip(rng):
    fw, bw = random_keras_weights(rng, 3, 4), random_keras_weights(rng, 3, 4)
    bi = keras_bidirectional_dict(keras_lstm_dict(fw), keras_lstm_dict(bw))
    config, cells = porting.keras.read(bi)
    (written,) = porting.keras.write(config, cells)
    for a, b in zip(written, fw + bw):
        np.testing.assert_array_equal(a, b)
    shifted = porting.keras.write({**config, "forget_bias": 1.0}, cells)[0]
    np.testing.assert_allclose(shifted[2] - fw[2], np.repeat([0, 1.0, 0, 0], 4), **F64)
    nobias = porting.keras.read(keras_lstm_dict(random_keras_weights(rng, 3, 4, use_bias=False)))
    assert len(porting.keras.write(*nobias)[0]) == 2
    with pytest.raises(ValueError, match="projection"):
        porting.keras.write(*porting.torch.read(random_torch_state_dict(rng, proj_size=2)))
    with pytest.raises(ValueError, match="cell_clip"):
        porting.keras.write({**config, "cell_clip": 3.0}, cells)


def test_keras_refusals(rng):
    weights = random_keras_weights(rng, 3, 4)
    layer = keras_lstm_dict(weights, name="enc")
    bi = keras_bidirectional_dict(layer, keras_lstm_dict(random_keras_weights(rng, 3, 4)))

    def refused(obj, match):
        with pytest.raises(ValueError, match=match):
            porting.keras.read(obj)

    refused({**layer, "class_name": "GRU"}, "from_keras got a GRU layer .*; nblstm converts LSTM layers only")
    refused({**layer, "class_name": "SimpleRNN"}, "from_keras got a SimpleRNN layer")
    refused(keras_layer("GRU", layer["config"], weights), "from_keras got a GRU layer")
    refused({**bi, "config": {**bi["config"], "layer": {**layer, "class_name": "GRU"}}}, "Bidirectional\\(GRU\\)")
    for change, match in (({"recurrent_activation": "relu"}, "recurrent_activation='relu' is not supported"),
                          ({"activation": "swish"}, "activation='swish' is not supported"),
                          ({"stateful": True}, "stateful=True"),
                          ({"dtype": "mixed_bfloat16"}, "dtype policy 'mixed_bfloat16'"),
                          ({"time_major": True}, "time_major=True"),
                          ({"time_major": False, "recurrent_activation": "hard_sigmoid"},
                           "hard_sigmoid' from Keras 2"),
                          ({"units": 5}, "units=5")):
        refused({**layer, "config": {**layer["config"], **change}}, match)
    refused({**layer, "weights": []}, "no weights yet")
    refused({**layer, "weights": weights[:2]}, "has 2 weights; an LSTM with use_bias=True has 3")
    refused({**layer, "keras_version": "2.15.0", "config": {**layer["config"], "recurrent_activation": "hard_sigmoid"}},
            "Keras 2")
    refused({**bi, "config": {**bi["config"], "merge_mode": "sum"}}, "merge_mode='sum'")
    refused({**bi, "config": {**bi["config"], "merge_mode": None}}, "merge_mode=None")
    other = keras_lstm_dict(random_keras_weights(rng, 3, 5))
    refused(keras_bidirectional_dict(layer, other, backward_layer={**other, "config": {**other["config"],
                                                                                       "go_backwards": True}}),
            "backward layer has units=5, the forward layer 4")
    refused(keras_bidirectional_dict(layer, layer, backward_layer=layer), "backward_layer has go_backwards=False")
    refused({**bi, "config": {**bi["config"], "layer": {**layer, "config": {**layer["config"], "go_backwards": True}}}},
            "forward layer has go_backwards=True")
    refused([layer, keras_lstm_dict(random_keras_weights(rng, 5, 4))], "layer 1 takes 5 inputs; layer 0 gives 4")
    refused([keras_lstm_dict(weights, return_sequences=False), keras_lstm_dict(random_keras_weights(rng, 4, 4))],
            "layer 0 has return_sequences=False")
    refused([layer, keras_lstm_dict(random_keras_weights(rng, 4, 4), activation="relu")],
            "layer 1 has activation='relu'")
    dense = {"class_name": "Dense", "config": {}, "weights": []}
    refused([layer, dense, keras_lstm_dict(random_keras_weights(rng, 4, 4))], "Dense layer .* between its recurrent")
    refused(fake("Sequential", layers=[keras_layer("Dense", {}, [])]), "no LSTM or Bidirectional layer")
    with pytest.raises(ValueError, match="without \\['config'\\]"):
        porting.keras.read({"class_name": "LSTM"})
    with pytest.raises(TypeError, match="must be a Keras LSTM"):
        porting.keras.read(3)
    with pytest.raises(ValueError, match="Bidirectional layer .*use nblstm.LSTM.from_keras"):
        LSTMCell.from_keras(bi)
    with pytest.raises(ValueError, match="2 LSTM layers.*use nblstm.LSTM.from_keras"):
        LSTMCell.from_keras([layer, keras_lstm_dict(random_keras_weights(rng, 4, 4))])


def test_keras_activation_forms(rng):
    weights = random_keras_weights(rng, 3, 4)
    for value, name in ((None, "linear"), ({"class_name": "function", "config": "relu"}, "relu"), ("Tanh", "tanh"),
                        ("hard_sigmoid", "hard_sigmoid")):
        config, _ = porting.keras.read(keras_lstm_dict(weights, activation=value))
        assert config["activation"] == name


# ----------------------------------------------------------------------------------------------------
# ONNX: the converters (NumPy only) and the reader (onnx)
# ----------------------------------------------------------------------------------------------------


def test_onnx_converters(rng):
    H, I = 3, 2
    W, R = rng.standard_normal((4 * H, I)), rng.standard_normal((4 * H, H))
    Bias, Peep = rng.standard_normal(8 * H), rng.standard_normal(3 * H)
    weights = convert.onnx_to_lstmcell(W, R, Bias, Peep)
    assert list(weights) == ["kernel", "bias", "w_f_diag", "w_i_diag", "w_o_diag"]
    x = rng.standard_normal((4, 2, I))
    h0, c0 = rng.standard_normal((2, H)), rng.standard_normal((2, H))
    cell = LSTMCell(H, use_peepholes=True, forget_bias=0.0)
    cell.set_weights(weights)
    outputs, final = cell.run(x, LSTMStateTuple(c0, h0))
    y, h, c = onnx_lstm(W, R, Bias, Peep, x, h0, c0)
    np.testing.assert_allclose(outputs, y, **F64)
    np.testing.assert_allclose(final.c, c, **F64)
    back = convert.lstmcell_to_onnx(weights, forget_bias=0.0)
    np.testing.assert_array_equal(back["W"][0], W)
    np.testing.assert_array_equal(back["R"][0], R)
    np.testing.assert_allclose(back["B"][0, :4 * H], Bias[:4 * H] + Bias[4 * H:], **F64)
    np.testing.assert_array_equal(back["P"][0], Peep)
    # forget_bias: taken off the bias on the way in, folded into Wb's forget block (ONNX block 2) on the way out.
    shifted = convert.onnx_to_lstmcell(W[None], R[None], Bias[None], forget_bias=1.0)
    np.testing.assert_allclose(weights["bias"] - shifted["bias"], np.repeat([0, 0, 1.0, 0], H), **F64)
    folded = convert.lstmcell_to_onnx(shifted, forget_bias=1.0)
    np.testing.assert_allclose(folded["B"][0, :4 * H], back["B"][0, :4 * H], **F64)
    with pytest.raises(ValueError, match="projection"):
        convert.lstmcell_to_onnx({**weights, "projection/kernel": np.zeros((H, 2))})
    with pytest.raises(ValueError, match="2 directions"):
        convert.onnx_to_lstmcell(np.stack([W, W]), R)
    with pytest.raises(ValueError, match="B has shape"):
        convert.onnx_to_lstmcell(W, R, Bias[:4 * H])
    with pytest.raises(ValueError, match="P has shape"):
        convert.onnx_to_lstmcell(W, R, Bias, Peep[:H])
    with pytest.raises(ValueError, match="must be \\[4H, I\\] and \\[4H, H\\]"):
        convert.onnx_to_lstmcell(W, R[:, :2])


def _onnx_model(rng, H=3, I=2, direction="forward", peepholes=False, bias=True, dtype=np.float32, initial=None,
                name="lstm", **attributes):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    D = 2 if direction == "bidirectional" else 1
    arrays = {"W": rng.standard_normal((D, 4 * H, I)), "R": rng.standard_normal((D, 4 * H, H))}
    if bias:
        arrays["B"] = rng.standard_normal((D, 8 * H))
    if peepholes:
        arrays["P"] = rng.standard_normal((D, 3 * H))
    if initial is not None:
        arrays["initial_h"] = np.full((D, 1, H), initial)
    arrays = {k: (a * 0.5).astype(dtype) for k, a in arrays.items()}
    inputs = ["X", "W", "R", "B" if bias else "", "", "initial_h" if initial is not None else "", "",
              "P" if peepholes else ""]
    while not inputs[-1]:
        inputs.pop()
    node = helper.make_node("LSTM", inputs, ["Y", "Y_h", "Y_c"], name=name, direction=direction, hidden_size=H,
                            **attributes)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", elem, [None, None, I])],
                              [helper.make_tensor_value_info("Y", elem, None)],
                              [numpy_helper.from_array(a, k) for k, a in arrays.items()])
    return onnx, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)]), node, arrays


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_onnx_read_forms_and_numerics(rng, tmp_path, direction):
    onnx, model, node, arrays = _onnx_model(rng, direction=direction, peepholes=True, dtype=np.float64)
    path = tmp_path / "lstm.onnx"
    onnx.save(model, str(path))
    results = [porting.onnx.read(model), porting.onnx.read(model.graph), porting.onnx.read(str(path)),
               porting.onnx.read(path, name="lstm"), porting.onnx.read(node, weights=arrays),
               porting.onnx.read(model, name="Y")]
    config, cells = results[0]
    D = 2 if direction == "bidirectional" else 1
    assert config["bidirectional"] == (D == 2) and config["use_peepholes"] and config["bias"]
    assert config["input_size"] == 2 and config["hidden_size"] == 3 and config["dtype"] == "float64"
    assert config.get("reverse", False) == (direction == "reverse") and config["batch_first"] is False
    for other_config, other_cells in results[1:]:
        assert other_config == config
        for a, b in zip(cells, other_cells):
            assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    x = rng.standard_normal((5, 3, 2))
    lengths = [5, 2, 3]
    h0, c0 = rng.standard_normal((3, 3)) * 0.5, rng.standard_normal((3, 3))
    for d, weights in enumerate(cells):
        reverse = direction == "reverse" or d == 1
        cell = LSTMCell(3, use_peepholes=True, forget_bias=0.0)
        cell.set_weights(weights)
        inputs = reverse_within(x, lengths) if reverse else x
        outputs, final = cell.run(inputs, LSTMStateTuple(c0, h0), sequence_length=lengths)
        if reverse:
            outputs = reverse_within(outputs, lengths)
        y, h, c = onnx_lstm(arrays["W"][d], arrays["R"][d], arrays["B"][d], arrays["P"][d], x, h0, c0, lengths,
                            reverse)
        np.testing.assert_allclose(outputs, y, **F64)
        np.testing.assert_allclose(final.h, h, **F64)
        np.testing.assert_allclose(final.c, c, **F64)


def test_onnx_attributes(rng):
    _, model, _, _ = _onnx_model(rng, layout=1, bias=False)
    config, cells = porting.onnx.read(model)
    assert config["batch_first"] is True and config["bias"] is False and not cells[0]["bias"].any()
    assert config["dtype"] == "float32" and cells[0]["kernel"].dtype == np.float32
    hard = {"activations": ["HardSigmoid", "Relu", "Relu"], "activation_alpha": [1 / 6], "activation_beta": [0.5]}
    config, _ = porting.onnx.read(_onnx_model(rng, **hard)[1])
    assert (config["activation"], config["recurrent_activation"]) == ("relu", "hard_sigmoid")
    both = {"activations": ["Sigmoid", "Softsign", "Softsign"] * 2}
    config, _ = porting.onnx.read(_onnx_model(rng, direction="bidirectional", **both)[1])
    assert config["activation"] == "softsign"
    elu = {"activations": ["Sigmoid", "Elu", "Elu"], "activation_alpha": [1.0, 1.0]}
    assert porting.onnx.read(_onnx_model(rng, **elu)[1])[0]["activation"] == "elu"
    # A zero constant initial state is fine.
    assert porting.onnx.read(_onnx_model(rng, initial=0.0)[1])[0]["hidden_size"] == 3


def test_onnx_refusals(rng):
    def refused(match, **options):
        with pytest.raises(ValueError, match=match):
            porting.onnx.read(_onnx_model(rng, **options)[1])

    refused(r"clip=1.0: ONNX clips every gate's pre-activation", clip=1.0)
    refused("input_forget=1", input_forget=1)
    refused("gate activation f = Relu", activations=["Relu", "Tanh", "Tanh"])
    refused(r"f = HardSigmoid \(alpha=0.2", activations=["HardSigmoid", "Tanh", "Tanh"])
    refused("g = Tanh and h = Relu differ", activations=["Sigmoid", "Tanh", "Relu"])
    refused(r"g = h = LeakyRelu", activations=["Sigmoid", "LeakyRelu", "LeakyRelu"])
    refused(r"g = h = Elu \(alpha=0.5", activations=["Sigmoid", "Elu", "Elu"], activation_alpha=[0.5, 0.5])
    refused("the two directions differ", direction="bidirectional",
            activations=["Sigmoid", "Tanh", "Tanh", "Sigmoid", "Relu", "Relu"])
    refused("expected 6", direction="bidirectional", activations=["Sigmoid", "Tanh", "Tanh"])
    refused("nonzero constant initial_h", initial=0.5)
    onnx, model, node, arrays = _onnx_model(rng)
    from onnx import helper

    with pytest.raises(ValueError, match="input W .* is not in weights"):
        porting.onnx.read(node, weights={"R": arrays["R"]})
    with pytest.raises(ValueError, match="name='other' but model_or_node is the LSTM node 'lstm'"):
        porting.onnx.read(node, name="other", weights=arrays)
    with pytest.raises(ValueError, match="is a GRU node"):
        porting.onnx.read(helper.make_node("GRU", ["X", "W", "R"], ["Y"]), weights=arrays)
    # Two nodes: name= selects, and is required.
    second = helper.make_node("LSTM", ["Y2", "W", "R"], ["Z"], name="second", hidden_size=3)
    model.graph.node.append(second)
    with pytest.raises(ValueError, match=r"2 LSTM nodes \('lstm', 'second'\): pass name="):
        porting.onnx.read(model)
    with pytest.raises(ValueError, match="no LSTM node named 'third'; its LSTM nodes are 'lstm', 'second'"):
        porting.onnx.read(model, name="third")
    assert porting.onnx.read(model, name="second")[0]["bias"] is False
    # Weights computed by another node.
    model.graph.node.insert(0, helper.make_node("Identity", ["W"], ["W2"], name="copy"))
    third = helper.make_node("LSTM", ["X", "W2", "R"], ["V"], name="third", hidden_size=3)
    model.graph.node.append(third)
    with pytest.raises(ValueError, match="computed by a Identity node"):
        porting.onnx.read(model, name="third")
    graph = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "g", [], [])
    with pytest.raises(ValueError, match="has no LSTM node; its op types are \\['Relu'\\]"):
        porting.onnx.read(graph)
    with pytest.raises(TypeError, match="model_or_node must be"):
        porting.onnx.read(3)
    with pytest.raises(ValueError, match=r"hidden_size=3 but W has shape \(1, 20, 2\)"):
        porting.onnx.read(_onnx_model(rng)[1].graph.node[0], weights={**arrays, "W": np.zeros((1, 20, 2))})


def test_onnx_constant_nodes_and_subgraphs(rng):
    onnx, model, node, arrays = _onnx_model(rng)
    from onnx import helper, numpy_helper

    expected = porting.onnx.read(model)[1][0]
    # Weights from Constant nodes instead of initializers.
    constants = [helper.make_node("Constant", [], [k], value=numpy_helper.from_array(a, k)) for k, a in arrays.items()]
    graph = helper.make_graph(constants + [node], "g", [], [])
    np.testing.assert_array_equal(porting.onnx.read(graph)[1][0]["kernel"], expected["kernel"])
    # An LSTM inside an If branch sees the outer graph's initializers.
    branch = helper.make_graph([node], "then", [], [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "else", [],
                              [helper.make_tensor_value_info("Y", onnx.TensorProto.FLOAT, None)])
    outer = helper.make_graph([helper.make_node("If", ["cond"], ["Y"], then_branch=branch, else_branch=other)], "g",
                              [], [], list(model.graph.initializer))
    np.testing.assert_array_equal(porting.onnx.read(outer)[1][0]["bias"], expected["bias"])


# ----------------------------------------------------------------------------------------------------
# TensorFlow: set_weights with TensorFlow's list order and scoped names
# ----------------------------------------------------------------------------------------------------


def _tf_weights(rng, cell_scope="rnn/lstm_cell", peepholes=True, proj=2, units=4, inputs=3):
    shapes = {"kernel": (inputs + (proj or units), 4 * units), "bias": (4 * units,)}
    if peepholes:
        shapes.update({n: (units,) for n in ("w_f_diag", "w_i_diag", "w_o_diag")})
    if proj:
        shapes["projection/kernel"] = (units, proj)
    return {f"{cell_scope}/{n}:0": rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def test_set_weights_tensorflow_forms(rng):
    scoped = _tf_weights(rng)
    plain = {k[len("rnn/lstm_cell/"):-2]: a for k, a in scoped.items()}
    reference = LSTMCell(4, use_peepholes=True, num_proj=2)
    reference.set_weights(plain)
    x = rng.standard_normal((3, 2, 3)).astype(np.float32)
    expected = reference.run(x)[0]
    checkpoint = {k[:-2]: a for k, a in scoped.items()}   # checkpoint names have no ":0"
    variables = [fake("ResourceVariable", numpy=lambda self, a=a: a) for a in scoped.values()]
    old = {"rnn/lstm_cell/weights": plain["kernel"], "rnn/lstm_cell/biases": plain["bias"],
           **{f"rnn/lstm_cell/{n}": plain[n] for n in ("w_f_diag", "w_i_diag", "w_o_diag")},
           "rnn/lstm_cell/projection/weights": plain["projection/kernel"]}
    for form in (scoped, checkpoint, list(scoped.values()), tuple(scoped.values()), variables, old):
        cell = LSTMCell(4, use_peepholes=True, num_proj=2)
        cell.set_weights(form)
        np.testing.assert_array_equal(cell.run(x)[0], expected)
    cell = LSTMCell(4, use_peepholes=True, num_proj=2)
    with pytest.raises(ValueError, match="list of 5 arrays; this cell takes 6"):
        cell.set_weights(list(scoped.values())[:5])
    with pytest.raises(ValueError, match="use_peepholes=True or num_proj"):
        LSTMCell(4).set_weights(list(scoped.values()))
    with pytest.raises(ValueError, match="Keras layer's .*from_keras"):
        LSTMCell(4).set_weights(random_keras_weights(rng, 3, 4))
    with pytest.raises(ValueError, match="Keras variables .*from_keras"):
        LSTMCell(4).set_weights({"lstm/lstm_cell/kernel:0": np.zeros((3, 16)),
                                 "lstm/lstm_cell/recurrent_kernel:0": np.zeros((4, 16)),
                                 "lstm/lstm_cell/bias:0": np.zeros(16)})
    with pytest.raises(ValueError, match="missing: \\['projection/kernel'\\]"):
        cell.set_weights({k: a for k, a in scoped.items() if "projection" not in k})
    with pytest.raises(ValueError, match="unexpected: \\['rnn/lstm_cell/kernel/Adam'\\]"):
        cell.set_weights({**checkpoint, "rnn/lstm_cell/kernel/Adam": plain["kernel"]})
    with pytest.raises(ValueError, match="mixes the scopes \\['', 'rnn/lstm_cell'\\]"):
        cell.set_weights({"kernel": plain["kernel"], "bias": plain["bias"], **{k: scoped[k] for k in list(scoped)[2:]}})
    with pytest.raises(TypeError, match="dict .* or a list"):
        cell.set_weights(3)


def test_set_weights_refuses_several_cells(rng):
    multi = {**_tf_weights(rng, "rnn/multi_rnn_cell/cell_0/lstm_cell", proj=0, peepholes=False),
             **_tf_weights(rng, "rnn/multi_rnn_cell/cell_1/lstm_cell", proj=0, peepholes=False, inputs=4)}
    cell = LSTMCell(4)
    with pytest.raises(ValueError, match="several cells .*kernel: \\['rnn/multi_rnn_cell/cell_0/lstm_cell/kernel:0', "
                                         "'rnn/multi_rnn_cell/cell_1/lstm_cell/kernel:0'\\].*"
                                         "select\\(weights, 'cell_0'\\).*MultiRNNCell.set_weights"):
        cell.set_weights(multi)
    mixed = {"rnn/multi_rnn_cell/cell_0/lstm_cell/kernel:0": multi["rnn/multi_rnn_cell/cell_0/lstm_cell/kernel:0"],
             "rnn/multi_rnn_cell/cell_1/lstm_cell/bias:0": multi["rnn/multi_rnn_cell/cell_1/lstm_cell/bias:0"]}
    with pytest.raises(ValueError, match="mixes the scopes"):
        cell.set_weights(mixed)
    groups = porting.tf.split_scopes(multi)
    assert list(groups) == ["rnn/multi_rnn_cell/cell_0/lstm_cell", "rnn/multi_rnn_cell/cell_1/lstm_cell"]
    assert list(groups["rnn/multi_rnn_cell/cell_1/lstm_cell"]) == ["kernel", "bias"]
    cell.set_weights(groups["rnn/multi_rnn_cell/cell_0/lstm_cell"])
    np.testing.assert_array_equal(porting.tf.select(multi, "cell_1")["kernel"],
                                  multi["rnn/multi_rnn_cell/cell_1/lstm_cell/kernel:0"])
    with pytest.raises(ValueError, match="2 scopes of weights contain 'lstm_cell'"):
        porting.tf.select(multi, "lstm_cell")
    with pytest.raises(ValueError, match="0 scopes of weights contain 'fw'"):
        porting.tf.select(multi, "fw")
    with pytest.raises(ValueError, match="not LSTMCell variables"):
        porting.tf.split_scopes({**multi, "global_step:0": np.zeros(())})
    with pytest.raises(ValueError, match="two names for rnn/lstm_cell/kernel"):
        porting.tf.split_scopes({"rnn/lstm_cell/kernel:0": 1, "rnn/lstm_cell/weights:0": 2})
    assert porting.tf.split_name("bidirectional_rnn/bw/lstm_cell/w_f_diag:0") == (
        "bidirectional_rnn/bw/lstm_cell", "w_f_diag")


# ----------------------------------------------------------------------------------------------------
# The frameworks' own results (tests/fixtures)
# ----------------------------------------------------------------------------------------------------


def test_fixture_torch_layers_configs_and_weights():
    index, data = _fixture("torch_layers.npz")
    for case in index["cases"]:
        name = case["name"]
        sd = {k: data[f"{name}/sd/{k}"] for k in case["state_dict"]}
        config, cells = porting.torch.read(sd, batch_first=case["batch_first"])
        for key in ("input_size", "hidden_size", "num_layers", "bidirectional", "proj_size", "bias", "batch_first",
                    "dtype"):
            assert config[key] == case[key], (name, key)
        # The cells are the inverse of the writer, which is PyTorch's layout.
        back = porting.torch.write(config, cells)
        assert sorted(back) == sorted(sd)
        for key, a in sd.items():
            if key.startswith("weight"):
                np.testing.assert_array_equal(back[key], a)
            elif key.startswith("bias_ih"):
                np.testing.assert_allclose(back[key], a + sd[key.replace("bias_ih", "bias_hh")], rtol=0, atol=0)
    gru = {k: data[f"gru/sd/{k}"] for k in index["gru"]["state_dict"]}
    with pytest.raises(ValueError, match=r"from_torch got an nn.GRU \(weight_ih_l0 has 3 \* hidden_size rows\)"):
        LSTMCell.from_torch(gru)


def test_fixture_torch_uni_numerics():
    index, data = _fixture("torch_layers.npz")
    case = next(c for c in index["cases"] if c["name"] == "uni")
    sd = {k: data[f"uni/sd/{k}"] for k in case["state_dict"]}
    cell = LSTMCell.from_torch(sd)
    outputs, final = cell.run(data["uni/x"], LSTMStateTuple(data["uni/c0"][0], data["uni/h0"][0]))
    np.testing.assert_allclose(outputs, data["uni/output"], **F32)
    np.testing.assert_allclose(final.h, data["uni/h_n"][0], **F32)
    np.testing.assert_allclose(final.c, data["uni/c_n"][0], **F32)


@pytest.mark.parametrize("case_name", ["proj", "proj64"])
def test_fixture_tf_dynamic_rnn_scoped_names_and_list(case_name):
    index, data = _fixture("tf_rnn.npz")
    case = next(c for c in index["cases"] if c["name"] == case_name)
    (spec,) = case["cells"]
    variables = {v["name"]: data[f"{case_name}/var/{n}"] for n, v in enumerate(case["variables"])}
    x = np.swapaxes(data[f"{case_name}/x"], 0, 1)    # batch-major in the fixture
    initial = LSTMStateTuple(data[f"{case_name}/init/c"], data[f"{case_name}/init/h"])
    lengths = data[f"{case_name}/sequence_length"]
    as_list = [variables[case["variables"][n]["name"]] for n in spec["get_weights_index"]]
    resolved = spec["resolved"]
    for form in (variables, as_list):
        cell = LSTMCell(resolved["num_units"], use_peepholes=resolved["use_peepholes"], cell_clip=resolved["cell_clip"],
                        num_proj=resolved["num_proj"], forget_bias=resolved["forget_bias"])
        cell.set_weights(form)
        outputs, final = cell.run(x, initial, sequence_length=lengths)
        tol = _tol(case["dtype"])
        np.testing.assert_allclose(np.swapaxes(outputs, 0, 1), data[f"{case_name}/out"], **tol)
        np.testing.assert_allclose(final.c, data[f"{case_name}/final/c"], **tol)
        np.testing.assert_allclose(final.h, data[f"{case_name}/final/h"], **tol)


def test_fixture_tf_multi_and_bidirectional_scopes():
    index, data = _fixture("tf_rnn.npz")
    for case in index["cases"]:
        name = case["name"]
        variables = {v["name"]: data[f"{name}/var/{n}"] for n, v in enumerate(case["variables"])}
        groups = porting.tf.split_scopes(variables)
        assert len(groups) == len(case["cells"]), name
        for spec, weights in zip(case["cells"], groups.values()):
            assert list(weights) == [n.rsplit("/lstm_cell/", 1)[1][:-2] for n in spec["get_weights"]]
            part = "/".join(p for p in (spec["direction"], f"cell_{spec['position']}" if case["multi_rnn_cell"]
                                        else None) if p)
            if part:
                assert porting.tf.select(variables, part) is not None
            resolved = spec["resolved"]
            cell = LSTMCell(resolved["num_units"], use_peepholes=resolved["use_peepholes"],
                            num_proj=resolved["num_proj"])
            cell.set_weights(weights)
        if len(groups) > 1:
            with pytest.raises(ValueError, match="several cells"):
                LSTMCell(4).set_weights(variables)
    # multi3: the MultiRNNCell's cells one after the other (lengths given to each) are dynamic_rnn's result.
    case = next(c for c in index["cases"] if c["name"] == "multi3")
    variables = {v["name"]: data[f"multi3/var/{n}"] for n, v in enumerate(case["variables"])}
    inputs, lengths = data["multi3/x"], data["multi3/sequence_length"]     # time-major
    for k, spec in enumerate(case["cells"]):
        resolved = spec["resolved"]
        cell = LSTMCell(resolved["num_units"], num_proj=resolved["num_proj"], forget_bias=resolved["forget_bias"])
        cell.set_weights(porting.tf.select(variables, f"cell_{k}"))
        inputs, final = cell.run(inputs, sequence_length=lengths)
        np.testing.assert_allclose(final.c, data[f"multi3/final/{k}/c"], **F32)
        np.testing.assert_allclose(final.h, data[f"multi3/final/{k}/h"], **F32)
    np.testing.assert_allclose(inputs, data["multi3/out"], **F32)


def test_fixture_keras_layers():
    index, data = _fixture("keras_layers.npz")
    for case in index["cases"]:
        name = case["name"]
        weights = [data[f"{name}/weights/{k}"] for k in range(len(case["weights"]))]
        serialized = {**case["serialized"], "weights": weights}
        config, cells = porting.keras.read(serialized)
        assert config.get("go_backwards", False) == (name == "go_backwards")
        layer = case["serialized"]["config"]
        layer = layer["layer"]["config"] if "layer" in layer else layer
        assert config["hidden_size"] == layer["units"] and config["input_size"] == case["input_size"]
        assert config["bidirectional"] == (case["layer"] == "Bidirectional") and config["batch_first"] is True
        assert config["dtype"] == case["dtype"] and config["forget_bias"] == 0.0
        assert config["activation"] == layer["activation"]
        assert config["recurrent_activation"] == layer["recurrent_activation"]
        (written,) = porting.keras.write(config, cells)
        for a, b in zip(written, weights):
            np.testing.assert_array_equal(a, b)
        if case["layer"] != "LSTM" or "mask" in case["arrays"]:
            continue      # masks and both directions: the layer's tests
        # One unmasked LSTM: the cell reproduces Keras (time-major here).
        cell = LSTMCell.from_keras(serialized)
        initial = None
        if case["initial_state"]:
            h0, c0 = (data[f"{name}/initial_state/{k}"] for k in range(2))
            initial = LSTMStateTuple(c0, h0)
        outputs, final = cell.run(np.swapaxes(data[f"{name}/x"], 0, 1), initial)
        tol = _tol(case["dtype"])
        np.testing.assert_allclose(np.swapaxes(outputs, 0, 1), data[f"{name}/output"], **tol)
        np.testing.assert_allclose(final.h, data[f"{name}/h"], **tol)
        np.testing.assert_allclose(final.c, data[f"{name}/c"], **tol)
    gru = {**index["gru"]["serialized"], "weights": [data[f"gru/weights/{k}"] for k in range(3)]}
    with pytest.raises(ValueError, match="from_keras got a GRU layer"):
        LSTMCell.from_keras(gru)
    with pytest.raises(ValueError, match="stateful=True"):
        porting.keras.read({**index["stateful"]["serialized"], "weights": []})
    # The stack: Bidirectional(LSTM(3)) -> LSTM(2) cannot be one nblstm.LSTM; read_layers gives both.
    stack = [{**layer["serialized"], "weights": [data[f"stack/layers/{n}/weights/{k}"]
                                                 for k in range(len(layer["weights"]))]}
             for n, layer in enumerate(index["stack"]["layers"])]
    with pytest.raises(ValueError, match="read_layers"):
        porting.keras.read(stack)
    layers = porting.keras.read_layers(stack)
    assert [(c["input_size"], c["hidden_size"], c["bidirectional"]) for c, _ in layers] == [(3, 3, True), (6, 2, False)]


def test_fixture_keras_hard_sigmoid_samples():
    index, data = _fixture("keras_layers.npz")
    for dtype in ("float32", "float64"):
        x, y = data[f"hard_sigmoid_samples/x_{dtype}"], data[f"hard_sigmoid_samples/y_{dtype}"]
        np.testing.assert_allclose(_hard_sigmoid(x.astype(np.float64)), y, rtol=1e-6, atol=1e-7)


def _onnx_fixture_case(name):
    index, data = _fixture("onnx_lstm.npz")
    return next(c for c in index["cases"] if c["name"] == name), data


@pytest.mark.parametrize("name", ["forward", "reverse", "bidirectional", "zero_length"])
def test_fixture_onnx_per_direction(name):
    onnx = pytest.importorskip("onnx")
    case, data = _onnx_fixture_case(name)
    model = onnx.load_from_string(data[f"{name}/model"].tobytes())
    config, cells = porting.onnx.read(model)
    D = case["num_directions"]
    assert config["hidden_size"] == case["hidden_size"] and config["input_size"] == case["input_size"]
    assert config["bidirectional"] == (D == 2) and config.get("reverse", False) == (name == "reverse")
    assert config["use_peepholes"] == ("P" in case["node_inputs"])
    x = data[f"{name}/X"]
    steps, batch = x.shape[:2]
    lengths = data[f"{name}/sequence_lens"] if f"{name}/sequence_lens" in data.files else np.full(batch, steps)
    for d, weights in enumerate(cells):
        reverse = name == "reverse" or d == 1
        cell = LSTMCell(config["hidden_size"], use_peepholes=config["use_peepholes"], forget_bias=0.0)
        cell.set_weights(weights)
        initial = None
        if f"{name}/initial_h" in data.files:
            initial = LSTMStateTuple(data[f"{name}/initial_c"][d], data[f"{name}/initial_h"][d])
        outputs, final = cell.run(reverse_within(x, lengths) if reverse else x, initial, sequence_length=lengths)
        if reverse:
            outputs = reverse_within(outputs, lengths)
        np.testing.assert_allclose(outputs, data[f"{name}/Y"][:, d], **F32)
        live = lengths > 0      # onnxruntime gives zero states for zero lengths, dynamic_rnn the initial ones
        np.testing.assert_allclose(final.h[live], data[f"{name}/Y_h"][d][live], **F32)
        np.testing.assert_allclose(final.c[live], data[f"{name}/Y_c"][d][live], **F32)
        # The node's weights read without onnx are the same.
        arrays = {k: data[f"{name}/{k}"][d] for k in ("W", "R", "B", "P") if f"{name}/{k}" in data.files}
        direct = convert.onnx_to_lstmcell(**arrays)
        assert all(np.array_equal(direct[k], weights[k]) for k in weights)


def test_fixture_onnx_attributes_and_exports():
    onnx = pytest.importorskip("onnx")
    index, data = _fixture("onnx_lstm.npz")

    def model(name):
        return onnx.load_from_string(data[f"{name}/model"].tobytes())

    assert porting.onnx.read(model("layout1"))[0]["batch_first"] is True
    for name, match in (("clip", "clip=1.0"), ("input_forget", "input_forget=1"), ("relu", "f = Relu")):
        with pytest.raises(ValueError, match=match):
            porting.onnx.read(model(name))
    # PyTorch's export of nn.LSTM(3, 4, num_layers=2, bidirectional=True): one node per layer, the same weights.
    export = index["torch_export"]
    nodes = [n["name"] for n in export["lstm_nodes"]]
    with pytest.raises(ValueError, match="2 LSTM nodes"):
        porting.onnx.read(model("torch_export"))
    sd = {k[len("torch_export/sd/"):]: data[k] for k in data.files if k.startswith("torch_export/sd/")}
    _, torch_cells = porting.torch.read(sd)
    onnx_cells = [c for node in nodes for c in porting.onnx.read(model("torch_export"), name=node)[1]]
    for a, b in zip(onnx_cells, torch_cells, strict=True):
        np.testing.assert_array_equal(a["kernel"], b["kernel"])
        np.testing.assert_allclose(a["bias"], b["bias"], **F32)
    stacked = [porting.onnx.read(model("stacked"), name=n["name"])[0] for n in index["stacked"]["nodes"]]
    assert [(c["input_size"], c["hidden_size"], c["bidirectional"]) for c in stacked] == [(3, 3, True), (6, 4, False)]


@pytest.mark.parametrize("name", ["constant_lens", "constant_state"])
def test_fixture_onnx_constant_inputs_are_refused_and_the_suggested_call_is_onnxruntimes(name):
    """A constant sequence_lens (or initial state) is refused, not dropped; the call the message suggests gives
    onnxruntime's results for that model."""
    onnx = pytest.importorskip("onnx")
    index, data = _fixture("onnx_constant_inputs.npz")
    case = next(c for c in index["cases"] if c["name"] == name)
    model = onnx.load_from_string(data[f"{name}/model"].tobytes())
    node = model.graph.node[0]
    assert [i.name for i in model.graph.input] == ["X"] and set(case["constants"]) <= set(node.input)
    lengths = data[f"{name}/sequence_lens"]
    with pytest.raises(ValueError) as refused:
        nblstm.LSTM.from_onnx(model)
    assert str(refused.value) == (
        f"LSTM node 'lstm' has a constant sequence_lens ('sequence_lens' = {lengths.tolist()}): nblstm.LSTM keeps no "
        f"lengths. Pass them when calling the layer, lstm(X, sequence_length={lengths.tolist()}), and read the node "
        "without them (clear its input: node.input[4] = '')")
    node.input[4] = ""
    hx = None
    if "initial_h" in case["constants"]:
        with pytest.raises(ValueError, match=r"nonzero constant initial_h \('initial_h'\).*lstm\(X, \(initial_h, "
                                             r"initial_c\)\).*node.input\[5\] = ''"):
            nblstm.LSTM.from_onnx(model)
        node.input[5] = node.input[6] = ""
        hx = (data[f"{name}/initial_h"], data[f"{name}/initial_c"])
    lstm = nblstm.LSTM.from_onnx(model)
    x = data[f"{name}/X"]
    output, (h_n, c_n) = lstm(x, hx, sequence_length=lengths)
    steps, batch = x.shape[:2]
    Y = output.reshape(steps, batch, lstm.num_directions, lstm.hidden_size).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(Y, data[f"{name}/Y"], **F32)
    np.testing.assert_allclose(h_n, data[f"{name}/Y_h"], **F32)
    np.testing.assert_allclose(c_n, data[f"{name}/Y_c"], **F32)


def test_onnx_reads_every_kind_of_constant(rng):
    """Constants of every form ONNX has are read: an option is never dropped because of how it is stored."""
    onnx, model, node, arrays = _onnx_model(rng, peepholes=True)
    from onnx import helper, numpy_helper

    expected = porting.onnx.read(model)[1][0]
    node = model.graph.node[0]
    # sequence_lens as a Constant node of each numeric form, and as a sparse initializer.
    for form, value in (("value_ints", [3, 2]), ("value_int", 4)):
        model.graph.node.insert(0, helper.make_node("Constant", [], [f"lens_{form}"], **{form: value}))
        node.input[4] = f"lens_{form}"
        with pytest.raises(ValueError, match=re.escape(f"constant sequence_lens ('lens_{form}' = {value})")):
            porting.onnx.read(model)
    values = numpy_helper.from_array(np.array([5, 1], np.int32), "lens_sparse")
    model.graph.sparse_initializer.append(
        helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 2], np.int64), "i"), [3]))
    node.input[4] = "lens_sparse"
    with pytest.raises(ValueError, match=r"constant sequence_lens \('lens_sparse' = \[5, 0, 1\]\)"):
        porting.onnx.read(model)
    # A weight as a sparse initializer, and as a Constant node's value_floats.
    node.input[4] = ""
    P = arrays["P"].copy()
    P[0, 1:] = 0
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(P[0, :1], "P_sparse"), numpy_helper.from_array(np.array([[0, 0]], np.int64), "j"),
        list(P.shape)))
    node.input[7] = "P_sparse"
    assert porting.onnx.read(model)[1][0]["w_i_diag"][0] == P[0, 0]
    assert not porting.onnx.read(model)[1][0]["w_o_diag"].any()
    node.input[7] = "P"
    model.graph.node.insert(0, helper.make_node("Constant", [], ["floats"], value_floats=[1.0, 2.0]))
    node.input[3] = "floats"
    with pytest.raises(ValueError, match=r"input B of LSTM node 'lstm' has shape \(2,\)"):
        porting.onnx.read(model)
    node.input[3] = "B"
    np.testing.assert_array_equal(porting.onnx.read(model)[1][0]["kernel"], expected["kernel"])
    model.graph.node.insert(0, helper.make_node("Constant", [], ["text"], value_strings=["a"]))
    node.input[4] = "text"
    with pytest.raises(ValueError, match=r"input 'text' of LSTM node 'lstm' is the Constant node '' with attributes "
                                         r"\['value_strings'\]"):
        porting.onnx.read(model)


def test_onnx_refuses_what_it_cannot_read(rng, tmp_path):
    onnx, model, node, arrays = _onnx_model(rng)
    from onnx import AttributeProto, TensorProto, helper

    def refused(match, target=None):
        with pytest.raises(ValueError, match=match):
            porting.onnx.read(model if target is None else target)

    node = model.graph.node[0]
    node.input.extend(["", "", "", "", "extra"])
    refused(r"LSTM node 'lstm' has 9 inputs; ONNX's LSTM has 8 \(X, W, R, B, sequence_lens, initial_h, initial_c, "
            r"P\)")
    del node.input[4:]
    node.attribute.append(helper.make_attribute("layout", "1"))
    refused("has the attribute layout of type STRING; ONNX's LSTM defines it as INT")
    node.attribute[-1].CopyFrom(helper.make_attribute("hidden_size", 3))
    refused(r"has the attributes \['hidden_size'\] more than once")
    del node.attribute[-1]
    assert node.attribute[0].type == AttributeProto.STRING and porting.onnx.read(model)[0]["hidden_size"] == 3
    # A subgraph's input hides an outer initializer of its name: the weight is not a constant there.
    body = helper.make_graph([node], "body", [helper.make_tensor_value_info("W", TensorProto.FLOAT, None)], [])
    outer = helper.make_graph([helper.make_node("Loop", ["", "", "Y0"], ["Y"], body=body)], "g", [], [],
                              list(model.graph.initializer))
    refused(r"input W \('W'\) of LSTM node 'lstm' is not in the graph's initializers", outer)
    # External data: never read for an in-memory model (no folder), and only inside the model's folder.
    W = model.graph.initializer[0]
    raw = W.raw_data
    W.ClearField("raw_data")
    W.data_location = TensorProto.EXTERNAL
    entry = W.external_data.add()
    entry.key, entry.value = "location", "W.bin"
    refused(r"input 'W' of LSTM node 'lstm' keeps its data in an external file \('W.bin'\), and an in-memory model "
            "has no folder")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "W.bin").write_bytes(raw)
    (tmp_path / "outside.bin").write_bytes(raw)
    onnx.save(model, str(folder / "lstm.onnx"))
    kernel = porting.onnx.read(folder / "lstm.onnx")[1][0]["kernel"]
    assert np.array_equal(kernel[:2], convert.onnx_to_lstmcell(arrays["W"][0], arrays["R"][0])["kernel"][:2])
    (folder / "link.bin").symlink_to(tmp_path / "outside.bin")
    for location in ("../outside.bin", str(tmp_path / "outside.bin"), "link.bin"):
        entry.value = location
        onnx.save(model, str(folder / "lstm.onnx"))
        refused(rf"'.*lstm.onnx': input 'W' of LSTM node 'lstm' keeps its data in '{re.escape(location)}', outside "
                "the model's folder", folder / "lstm.onnx")
    entry.value = "missing.bin"
    onnx.save(model, str(folder / "lstm.onnx"))
    refused("keeps its data in 'missing.bin', which is not a file in the model's folder", folder / "lstm.onnx")


def test_package_exports():
    assert set(porting.__all__) == {"keras", "onnx", "tf", "torch"}
    assert {"onnx_to_lstmcell", "lstmcell_to_onnx"} <= set(convert.__all__)
    assert nblstm.porting is porting


# ----------------------------------------------------------------------------------------------------
# A PyTorch module tree without PyTorch: modules as PyTorch exposes them to the reader
# (named_modules, named_parameters(recurse=False), state_dict, attributes), holding the parameters
# PyTorch stored in torch_layers.npz. tests/test_torch.py does the same with real modules.
# ----------------------------------------------------------------------------------------------------


class _Module:
    """A module tree as PyTorch's ``nn.Module`` shows it to the reader."""

    def __init__(self, params=(), **children):
        self._params, self._children = dict(params), children

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, child in self._children.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self, recurse=True):
        assert not recurse
        return iter(self._params.items())

    def state_dict(self):
        out = {}
        for path, m in self.named_modules():
            out.update({(f"{path}." if path else "") + k: a for k, a in m._params.items()})
        return out


class LSTM(_Module):
    """A user's wrapper named LSTM (a published model's name), holding an nn.LSTM(batch_first=True)."""


def _nn_lstm(sd, batch_first):
    module = torch_module("LSTM", sd, batch_first=batch_first, dropout=0.0)
    module.named_modules = lambda prefix="": iter([(prefix, module)])
    return module


def test_from_torch_finds_the_lstm_in_a_tree_by_its_parameters_not_the_class_name():
    index, data = _fixture("torch_layers.npz")
    case = next(c for c in index["cases"] if c["name"] == "bi_proj")
    assert case["batch_first"]
    sd = {k: data[f"bi_proj/sd/{k}"] for k in case["state_dict"]}
    model = LSTM(lstm=_nn_lstm(sd, batch_first=True), fc=_Module({"weight": np.zeros((2, 6)), "bias": np.zeros(2)}))
    layer = nblstm.LSTM.from_torch(model)
    assert layer.batch_first
    hx = (data["bi_proj/h0"], data["bi_proj/c0"])
    output, (h_n, c_n) = layer(data["bi_proj/x"], hx, sequence_length=data["bi_proj/lengths"])
    np.testing.assert_allclose(output, data["bi_proj/output"], **F32)
    np.testing.assert_allclose(c_n, data["bi_proj/c_n"], **F32)
    # Two LSTMs: refused, naming both and how to pick one.
    two = _Module(encoder=_Module(**{"0": _nn_lstm(sd, True)}), decoder=_nn_lstm(sd, False))
    with pytest.raises(ValueError, match=r"holds 2 LSTMs \['encoder.0', 'decoder'\]; pass the one to convert, "
                                         r"e.g. from_torch\(model.get_submodule\('decoder'\)\)"):
        nblstm.LSTM.from_torch(two)
    # A class holding LSTM parameters that is not nn.LSTM: what it computes is unknown.
    with pytest.raises(ValueError, match=r"submodule 'lstm' is a .*_Module, which holds LSTM parameters but is not "
                                         r"torch.nn.LSTM .*from_torch\(module.state_dict\(\), batch_first=...\)"):
        nblstm.LSTM.from_torch(LSTM(lstm=_Module(sd)))
    # The GRU of the fixture, inside a model: named as a GRU.
    gru = {k: data[f"gru/sd/{k}"] for k in index["gru"]["state_dict"]}
    with pytest.raises(ValueError, match=r"from_torch got an nn.GRU \(weight_ih_l0 has 3 \* hidden_size rows\)"):
        nblstm.LSTM.from_torch(_Module(rnn=_Module(gru)))


def test_from_torch_misshapen_parameters_are_named():
    index, data = _fixture("torch_layers.npz")
    case = next(c for c in index["cases"] if c["name"] == "uni")
    sd = {k: data[f"uni/sd/{k}"] for k in case["state_dict"]}
    for key, shape in (("weight_hh_l0", (16, 5)), ("weight_ih_l0", (15, 3)), ("bias_hh_l0", (12,))):
        bad = {**sd, key: np.zeros(shape, np.float32)}
        with pytest.raises(ValueError, match=rf"\['{key}'\] has shape"):
            nblstm.LSTM.from_torch(bad)
