"""Tests of the layers: nblstm.LSTM, MultiRNNCell, dynamic_rnn, bidirectional_dynamic_rnn, masks and directions.

Against the stored results of the frameworks (tests/fixtures/README.md:
``tf_rnn.npz``, ``torch_layers.npz``, ``keras_layers.npz``,
``onnx_lstm.npz``; the frameworks are not needed) and against the float64
reference (:mod:`nblstm.reference.cell`) run layer by layer and direction by
direction, with finite differences of the reference for the gradients.

The weights are converted from the frameworks' layouts by the small helpers
below, written from the frameworks' documentation independently of
:mod:`nblstm.porting`: they are the tests' statement of those layouts.
Tolerances are TensorFlow's (docs/specification.rst, "Tolerances"): float32
``rtol = atol = 1e-6`` forward and ``1e-5`` for gradients.
"""

import copy
import importlib.util
import json
import os

import numba
import numpy as np
import pytest

import nblstm
from nblstm import LSTM, LSTMCell, LSTMStateTuple, MultiRNNCell
from nblstm.cpu import cell as cpu_cell
from nblstm.cpu import partition, threads
from nblstm.reference import cell as ref

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")

FORWARD_TOL = {"float32": (1e-6, 1e-6), "float64": (1e-12, 1e-12)}
GRAD_TOL = {"float32": (1e-5, 1e-5), "float64": (1e-10, 1e-10)}
# nblstm in float64 against its own float64 reference (the same maths, other summation orders).
REF_TOL = dict(rtol=1e-11, atol=1e-12)


def _load(name):
    path = os.path.join(FIXTURES, name)
    if not os.path.exists(path):
        pytest.skip(f"tests/fixtures/{name} is not there (made by scripts/make_layer_fixtures.py)")
    with np.load(path, allow_pickle=False) as data:
        index = json.loads(str(data["index"]))
        arrays = {k: data[k] for k in data.files if k != "index"}
    return index, arrays


_CACHE = {}


def fixture(name):
    """``(index, cases)``: ``cases[case][array name]`` (keys ``"<case>/<name>"``), read once."""
    if name not in _CACHE:
        index, arrays = _load(name)
        cases = {}
        for key, a in arrays.items():
            case, rest = key.split("/", 1)
            cases.setdefault(case, {})[rest] = a
        _CACHE[name] = index, cases
    return _CACHE[name]


def case_names(name):
    path = os.path.join(FIXTURES, name)
    if not os.path.exists(path):
        return ["missing"]
    return [c["name"] for c in fixture(name)[0]["cases"]]


def case_of(name, case):
    index, cases = fixture(name)
    return next(c for c in index["cases"] if c["name"] == case), cases[case]


def close(actual, expected, dtype, what, grad=False):
    """``actual`` (nblstm's, of ``dtype``) against a framework's ``expected``."""
    dtype = np.dtype(dtype).name
    rtol, atol = (GRAD_TOL if grad else FORWARD_TOL)[dtype]
    actual = np.asarray(actual)
    assert actual.dtype == np.dtype(dtype), f"{what}: dtype {actual.dtype}"
    assert actual.shape == np.shape(expected), f"{what}: shape {actual.shape}, expected {np.shape(expected)}"
    np.testing.assert_allclose(actual.astype(np.float64), np.asarray(expected, np.float64), rtol=rtol, atol=atol,
                               err_msg=what)


# ----------------------------------------------------------------------------------------------------
# The frameworks' layouts (independent of nblstm.porting)
# ----------------------------------------------------------------------------------------------------


def gate_blocks(a, order, axis=-1):
    """The four gate blocks of ``a`` along ``axis`` in the order ``order`` (indices of the source's blocks)."""
    a = np.asarray(a)
    size = a.shape[axis] // 4
    return np.concatenate([np.take(a, np.arange(g * size, (g + 1) * size), axis=axis) for g in order], axis=axis)


# Each permutation takes a framework's gate blocks to ICFO (i, j = c, f, o) and, being its own
# inverse, back: PyTorch i, f, g, o; Keras i, f, c, o; ONNX i, o, f, c.
TORCH_TO_ICFO = KERAS_TO_ICFO = (0, 2, 1, 3)
ONNX_TO_ICFO = (0, 3, 2, 1)


def torch_cell(sd, layer, suffix, bias=True):
    """One cell's weights from an ``nn.LSTM`` state dict: rows i, f, g, o; bias ``b_ih + b_hh``; ``W_hr [P, H]``."""
    s = f"l{layer}{suffix}"
    w_ih, w_hh = sd[f"weight_ih_{s}"], sd[f"weight_hh_{s}"]
    weights = {"kernel": gate_blocks(np.concatenate([w_ih, w_hh], axis=1).T, TORCH_TO_ICFO)}
    if bias:
        weights["bias"] = gate_blocks(sd[f"bias_ih_{s}"] + sd[f"bias_hh_{s}"], TORCH_TO_ICFO)
    if f"weight_hr_{s}" in sd:
        weights["projection/kernel"] = sd[f"weight_hr_{s}"].T
    return weights


def torch_grads(d_w, prefix, inputs):
    """A cell's weight gradients (nblstm's layout) in the state dict's: ``{key suffix: array}``."""
    d_kernel = gate_blocks(d_w[prefix + "kernel"], TORCH_TO_ICFO)  # [I + P, 4H], gates i, f, g, o
    out = {"weight_ih": d_kernel[:inputs].T, "weight_hh": d_kernel[inputs:].T}
    if prefix + "bias" in d_w:
        out["bias_ih"] = out["bias_hh"] = gate_blocks(d_w[prefix + "bias"], TORCH_TO_ICFO)
    if prefix + "projection/kernel" in d_w:
        out["weight_hr"] = d_w[prefix + "projection/kernel"].T
    return out


def keras_cell(kernel, recurrent, bias=None):
    """A Keras LSTM's ``[kernel [I, 4U], recurrent_kernel [U, 4U], bias [4U]]`` (gates i, f, c, o)."""
    weights = {"kernel": gate_blocks(np.concatenate([kernel, recurrent], axis=0), KERAS_TO_ICFO)}
    if bias is not None:
        weights["bias"] = gate_blocks(bias, KERAS_TO_ICFO)
    return weights


def keras_grads(d_w, inputs):
    """Cell weight gradients as Keras's ``[d_kernel, d_recurrent_kernel(, d_bias)]``."""
    d_kernel = gate_blocks(d_w["kernel"], KERAS_TO_ICFO)
    out = [d_kernel[:inputs], d_kernel[inputs:]]
    if "bias" in d_w:
        out.append(gate_blocks(d_w["bias"], KERAS_TO_ICFO))
    return out


def onnx_cell(W, R, B=None, P=None):
    """One direction of an ONNX LSTM: ``W [4H, I]``, ``R [4H, H]`` rows i, o, f, c; ``B = Wb ++ Rb``; ``P`` i, o, f."""
    weights = {"kernel": gate_blocks(np.concatenate([W, R], axis=1).T, ONNX_TO_ICFO)}
    units = R.shape[1]
    b = np.zeros(8 * units, W.dtype) if B is None else B
    weights["bias"] = gate_blocks(b[:4 * units] + b[4 * units:], ONNX_TO_ICFO)
    if P is not None:
        weights["w_i_diag"], weights["w_o_diag"], weights["w_f_diag"] = P[:units], P[units:2 * units], P[2 * units:]
    return weights


def tf_plain_name(scoped):
    """``rnn/multi_rnn_cell/cell_1/lstm_cell/projection/kernel:0`` -> ``projection/kernel``."""
    return scoped.split("lstm_cell/", 1)[1].removesuffix(":0")


# ----------------------------------------------------------------------------------------------------
# 1. TensorFlow 1: dynamic_rnn, MultiRNNCell, bidirectional_dynamic_rnn (tf_rnn.npz)
# ----------------------------------------------------------------------------------------------------


def tf_cells(case, arrays, scoped=False):
    """``{"fw": [cells], "bw": [cells]}`` (``None``: the cells of ``dynamic_rnn``), weights from the variables."""
    groups = {}
    dtype = np.dtype(case["dtype"])
    for meta in case["cells"]:
        r = meta["resolved"]
        cell = LSTMCell(r["num_units"], use_peepholes=r["use_peepholes"], cell_clip=r["cell_clip"],
                        num_proj=r["num_proj"], proj_clip=r["proj_clip"], forget_bias=r["forget_bias"],
                        activation=r["activation"], dtype=dtype)
        names = zip(meta["get_weights"], meta["get_weights_index"], strict=True)
        if scoped:
            cell.set_weights({name: arrays[f"var/{k}"] for name, k in names})
        else:
            cell.set_weights({tf_plain_name(name): arrays[f"var/{k}"] for name, k in names})
        groups.setdefault(meta["direction"], []).append(cell)
    return groups


def tf_top(cells, multi):
    return MultiRNNCell(cells) if multi else cells[0]


def tf_state(arrays, prefix, path):
    c, h = arrays.get(f"{prefix}/{path}c"), arrays.get(f"{prefix}/{path}h")
    return None if c is None else LSTMStateTuple(c, h)


def tf_paths(case, direction):
    return [m["state_path"] for m in case["cells"] if m["direction"] == direction]


def tf_initial(case, arrays, direction):
    paths = tf_paths(case, direction)
    if not case["initial_state"]:
        return None
    states = tuple(tf_state(arrays, "init", p) for p in paths)
    return states if case["multi_rnn_cell"] else states[0]


def check_tf_final(final, case, arrays, direction, dtype):
    paths = tf_paths(case, direction)
    finals = final if case["multi_rnn_cell"] else (final,)
    assert len(finals) == len(paths)
    for state, p in zip(finals, paths, strict=True):
        assert isinstance(state, LSTMStateTuple), p
        close(state.c, arrays[f"final/{p}c"], dtype, f"final/{p}c")
        close(state.h, arrays[f"final/{p}h"], dtype, f"final/{p}h")


@pytest.mark.parametrize("case_name", case_names("tf_rnn.npz"))
def test_tf_rnn_forward(case_name):
    case, arrays = case_of("tf_rnn.npz", case_name)
    dtype = np.dtype(case["dtype"])
    groups = tf_cells(case, arrays)
    multi, time_major = case["multi_rnn_cell"], case["time_major"]
    x, lengths = arrays["x"], arrays["sequence_length"]
    assert (lengths == 0).any() or case_name == "bi_multi"
    if case["fn"].endswith(".dynamic_rnn"):
        out, final = nblstm.dynamic_rnn(tf_top(groups[None], multi), x, sequence_length=lengths,
                                        initial_state=tf_initial(case, arrays, None), dtype=dtype,
                                        time_major=time_major)
        close(out, arrays["out"], dtype, "out")
        check_tf_final(final, case, arrays, None, dtype)
    else:
        (out_fw, out_bw), (final_fw, final_bw) = nblstm.bidirectional_dynamic_rnn(
            tf_top(groups["fw"], multi), tf_top(groups["bw"], multi), x, sequence_length=lengths,
            initial_state_fw=tf_initial(case, arrays, "fw"), initial_state_bw=tf_initial(case, arrays, "bw"),
            dtype=dtype, time_major=time_major)
        close(out_fw, arrays["out_fw"], dtype, "out_fw")
        close(out_bw, arrays["out_bw"], dtype, "out_bw")
        check_tf_final(final_fw, case, arrays, "fw", dtype)
        check_tf_final(final_bw, case, arrays, "bw", dtype)


def chained_vjp(cells, x, states, lengths, reverse, time_major):
    """The cells of a MultiRNNCell (or one cell) over ``x``, each through ``LSTMCell.vjp``; a backward function."""
    backs, finals = [], []
    for cell, state in zip(cells, states, strict=True):
        (x, final), back = cell.vjp(x, state, lengths, reverse=reverse, time_major=time_major)
        backs.append(back)
        finals.append(final)

    def backward(d_out, d_finals):
        d_initial, d_weights = [None] * len(cells), [None] * len(cells)
        for k in range(len(cells) - 1, -1, -1):
            d_out, d_initial[k], d_weights[k] = backs[k](d_out, d_finals[k])
        return d_out, d_initial, d_weights

    return x, finals, backward


@pytest.mark.parametrize("case_name", case_names("tf_rnn.npz"))
def test_tf_rnn_gradients_through_cell_vjp(case_name):
    """The fixtures' gradients (x, initial states, every variable) from LSTMCell.vjp, chained by hand."""
    case, arrays = case_of("tf_rnn.npz", case_name)
    dtype = np.dtype(case["dtype"])
    groups = tf_cells(case, arrays)
    x, lengths, time_major = arrays["x"], arrays["sequence_length"], case["time_major"]
    d_x = np.zeros(x.shape)
    cell_metas = iter(case["cells"])
    for direction, cells in groups.items():
        paths = tf_paths(case, direction)
        states = [tf_state(arrays, "init", p) for p in paths]
        out, finals, backward = chained_vjp(cells, x, states, lengths, direction == "bw", time_major)
        out_name = "out" if direction is None else f"out_{direction}"
        close(out, arrays[out_name], dtype, out_name)
        d_finals = [LSTMStateTuple(arrays[f"R/final/{p}c"], arrays[f"R/final/{p}h"]) for p in paths]
        d_in, d_initial, d_weights = backward(arrays[f"R/{out_name}"], d_finals)
        d_x += d_in
        for p, d_state in zip(paths, d_initial, strict=True):
            if case["initial_state"]:
                close(d_state.c, arrays[f"grad/init/{p}c"], dtype, f"grad/init/{p}c", grad=True)
                close(d_state.h, arrays[f"grad/init/{p}h"], dtype, f"grad/init/{p}h", grad=True)
        for d_w in d_weights:
            meta = next(cell_metas)
            assert meta["direction"] == direction
            for name, k in zip(meta["get_weights"], meta["get_weights_index"], strict=True):
                close(d_w[tf_plain_name(name)], arrays[f"grad/var/{k}"], dtype, f"grad of {name}", grad=True)
    close(d_x.astype(dtype), arrays["grad/x"], dtype, "grad/x", grad=True)


needs_tf_names = pytest.mark.skipif(importlib.util.find_spec("nblstm.porting") is None,
                                    reason="TensorFlow's scoped names are read by nblstm.porting")


@needs_tf_names
@pytest.mark.parametrize("case_name", case_names("tf_rnn.npz"))
def test_tf_scoped_names_and_list_order(case_name):
    """Weights set by TensorFlow's scoped names (``rnn/lstm_cell/kernel:0``) or in ``get_weights()`` order."""
    case, arrays = case_of("tf_rnn.npz", case_name)
    plain = tf_cells(case, arrays)
    scoped = tf_cells(case, arrays, scoped=True)
    for direction, cells in plain.items():
        for a, b in zip(cells, scoped[direction], strict=True):
            assert list(a.get_weights()) == list(b.get_weights())
            for name, value in a.get_weights().items():
                np.testing.assert_array_equal(b.get_weights()[name], value, err_msg=name)
        # The function's cell as a whole: a MultiRNNCell takes every cell's scoped names or the flat list.
        key = "cell" if direction is None else direction
        names = case["top_get_weights"][key]
        position = {v["name"]: k for k, v in enumerate(case["variables"])}
        values = [arrays[f"var/{position[n]}"] for n in names]
        if case["multi_rnn_cell"]:
            fresh = [LSTMCell(c.num_units, use_peepholes=c.use_peepholes, cell_clip=c.cell_clip,
                              num_proj=c.num_proj, forget_bias=c.forget_bias, activation=c.activation.name,
                              dtype=c.dtype) for c in cells]
            by_name, by_list = MultiRNNCell(fresh), MultiRNNCell([copy.deepcopy(c) for c in fresh])
            by_name.set_weights(dict(zip(names, values, strict=True)))
            by_list.set_weights(values)
            for stack in (by_name, by_list):
                for a, b in zip(cells, stack.cells, strict=True):
                    for name, value in a.get_weights().items():
                        np.testing.assert_array_equal(b.get_weights()[name], value, err_msg=name)
        else:
            by_list = LSTMCell(cells[0].num_units, use_peepholes=cells[0].use_peepholes,
                               cell_clip=cells[0].cell_clip, num_proj=cells[0].num_proj,
                               forget_bias=cells[0].forget_bias, dtype=cells[0].dtype)
            by_list.set_weights(values)
            for name, value in cells[0].get_weights().items():
                np.testing.assert_array_equal(by_list.get_weights()[name], value, err_msg=name)


@needs_tf_names
def test_tf_scoped_names_of_two_cells_are_refused():
    case, arrays = case_of("tf_rnn.npz", "bi")
    both = {v["name"]: arrays[f"var/{k}"] for k, v in enumerate(case["variables"])}
    cell = LSTMCell(4, use_peepholes=True)
    with pytest.raises(ValueError, match="weights holds the variables of several cells"):
        cell.set_weights(both)
    multi_case, multi_arrays = case_of("tf_rnn.npz", "multi3")
    names = {v["name"]: multi_arrays[f"var/{k}"] for k, v in enumerate(multi_case["variables"])}
    with pytest.raises(ValueError, match="several cells"):
        LSTMCell(4).set_weights(names)


def test_tf_zero_length_keeps_the_initial_state_and_zero_outputs():
    case, arrays = case_of("tf_rnn.npz", "bi")
    groups = tf_cells(case, arrays)
    x, lengths = arrays["x"], arrays["sequence_length"]
    zero = int(np.flatnonzero(lengths == 0)[0])
    init_fw, init_bw = tf_initial(case, arrays, "fw"), tf_initial(case, arrays, "bw")
    (out_fw, out_bw), (final_fw, final_bw) = nblstm.bidirectional_dynamic_rnn(
        groups["fw"][0], groups["bw"][0], x, sequence_length=lengths, initial_state_fw=init_fw,
        initial_state_bw=init_bw)
    assert not out_fw[zero].any() and not out_bw[zero].any()
    for final, init in ((final_fw, init_fw), (final_bw, init_bw)):
        np.testing.assert_array_equal(final.c[zero], init.c[zero])
        np.testing.assert_array_equal(final.h[zero], init.h[zero])
    for b, n in enumerate(lengths):
        assert not out_fw[b, n:].any() and not out_bw[b, n:].any()


# ----------------------------------------------------------------------------------------------------
# 2. PyTorch: nn.LSTM (torch_layers.npz)
# ----------------------------------------------------------------------------------------------------


def prefix_of(lstm, k):
    """The prefix of cell ``k``'s names in ``lstm.get_weights()``: ``"l{layer}/"`` or ``"l{layer}_reverse/"``."""
    layer, direction = divmod(k, lstm.num_directions)
    return f"l{layer}{'_reverse' if direction else ''}/"


def torch_layer(case, arrays):
    lstm = LSTM(case["input_size"], case["hidden_size"], num_layers=case["num_layers"], bias=case["bias"],
                batch_first=case["batch_first"], bidirectional=case["bidirectional"], proj_size=case["proj_size"],
                dtype=np.dtype(case["dtype"]))
    sd = {k[len("sd/"):]: a for k, a in arrays.items() if k.startswith("sd/")}
    lstm.set_cell_weights([torch_cell(sd, layer, suffix, case["bias"]) for layer in range(case["num_layers"])
                           for suffix in ("", "_reverse")[:lstm.num_directions]])
    return lstm


@pytest.mark.parametrize("case_name", case_names("torch_layers.npz"))
def test_torch_layers(case_name):
    case, arrays = case_of("torch_layers.npz", case_name)
    dtype = np.dtype(case["dtype"])
    lstm = torch_layer(case, arrays)
    lengths = arrays.get("lengths")
    hx = (arrays["h0"], arrays["c0"])
    output, (h_n, c_n) = lstm(arrays["x"], hx, sequence_length=lengths)
    close(output, arrays["output"], dtype, "output")
    close(h_n, arrays["h_n"], dtype, "h_n")
    close(c_n, arrays["c_n"], dtype, "c_n")
    (output2, (h_n2, c_n2)), backward = lstm.vjp(arrays["x"], hx, sequence_length=lengths)
    np.testing.assert_array_equal(output2, output)
    np.testing.assert_array_equal(h_n2, h_n)
    np.testing.assert_array_equal(c_n2, c_n)
    d_x, (d_h0, d_c0), d_w = backward(arrays["R"], (arrays["Rh"], arrays["Rc"]))
    close(d_x, arrays["grad/x"], dtype, "grad/x", grad=True)
    close(d_h0, arrays["grad/h0"], dtype, "grad/h0", grad=True)
    close(d_c0, arrays["grad/c0"], dtype, "grad/c0", grad=True)
    assert list(d_w) == list(lstm.weight_names)
    seen = set()
    for k, cell in enumerate(lstm.cells):
        layer, direction = divmod(k, lstm.num_directions)
        suffix = "_reverse" if direction else ""
        prefix = f"l{layer}{suffix}/"
        for key, g in torch_grads(d_w, prefix, cell.input_depth).items():
            name = f"grad/sd/{key}_l{layer}{suffix}"
            close(np.ascontiguousarray(g), arrays[name], dtype, name, grad=True)
            seen.add(name)
    assert seen == {k for k in arrays if k.startswith("grad/sd/")}


def test_torch_layer_weight_names_and_round_trip():
    case, arrays = case_of("torch_layers.npz", "bi_proj")
    lstm = torch_layer(case, arrays)
    names = lstm.weight_names
    assert names[:3] == ("l0/kernel", "l0/bias", "l0/projection/kernel")
    assert "l1_reverse/projection/kernel" in names and len(names) == 12
    weights = lstm.get_weights()
    assert weights["l1/kernel"].shape == (2 * 3 + 3, 4 * 5) and weights["l0/kernel"].shape == (3 + 3, 20)
    other = LSTM(3, 5, num_layers=2, bidirectional=True, batch_first=True, proj_size=3, seed=1)
    other.set_weights(weights)
    x = arrays["x"]
    np.testing.assert_array_equal(other(x, sequence_length=arrays["lengths"])[0],
                                  lstm(x, sequence_length=arrays["lengths"])[0])
    nobias_case, nobias_arrays = case_of("torch_layers.npz", "nobias")
    nobias = torch_layer(nobias_case, nobias_arrays)
    assert not any(n.endswith("bias") for n in nobias.weight_names)
    assert all(not c.get_weights()["bias"].any() for c in nobias.cells)


# ----------------------------------------------------------------------------------------------------
# 3. Keras 3: LSTM, Bidirectional(LSTM), masks, go_backwards, stacks (keras_layers.npz)
# ----------------------------------------------------------------------------------------------------


def keras_config(meta):
    return meta["serialized"]["config"]


def keras_options(config):
    return dict(activation=config["activation"], recurrent_activation=config["recurrent_activation"],
                bias=config["use_bias"])


def keras_weights(arrays, prefix, count, use_bias):
    ws = [arrays[f"{prefix}{k}"] for k in range(count)]
    per = 3 if use_bias else 2
    return [keras_cell(*ws[a:a + per]) for a in range(0, count, per)]


@pytest.mark.parametrize("case_name", [n for n in case_names("keras_layers.npz") if n != "go_backwards"])
def test_keras_layers(case_name):
    case, arrays = case_of("keras_layers.npz", case_name)
    dtype = np.dtype(case["dtype"])
    config = keras_config(case)
    bidirectional = case["layer"] == "Bidirectional"
    if bidirectional:
        config = config["layer"]["config"]
    assert not config["go_backwards"]
    units = config["units"]
    options = keras_options(config)
    lstm = LSTM(case["input_size"], units, bidirectional=bidirectional, batch_first=True, dtype=dtype,
                zero_output_for_mask=bidirectional, activation=options["activation"],
                recurrent_activation=options["recurrent_activation"], bias=options["bias"])
    count = len(case["weights"])
    cells = keras_weights(arrays, "weights/", count, options["bias"])
    lstm.set_cell_weights(cells)
    hx = None
    if case["initial_state"]:
        init = [arrays[f"initial_state/{k}"] for k in range(len(case["initial_state"]))]
        hx = (np.stack(init[0::2]), np.stack(init[1::2]))  # Keras: [h, c] per direction
    mask = arrays.get("mask")
    (output, (h_n, c_n)), backward = lstm.vjp(arrays["x"], hx, mask=mask)
    close(output, arrays["output"], dtype, "output")
    suffixes = ("_fw", "_bw") if bidirectional else ("",)
    for d, s in enumerate(suffixes):
        close(h_n[d], arrays[f"h{s}"], dtype, f"h{s}")
        close(c_n[d], arrays[f"c{s}"], dtype, f"c{s}")
    d_hx = (np.stack([arrays[f"R/h{s}"] for s in suffixes]), np.stack([arrays[f"R/c{s}"] for s in suffixes]))
    d_x, (d_h0, d_c0), d_w = backward(arrays["R/output"], d_hx)
    close(d_x, arrays["grad/x"], dtype, "grad/x", grad=True)
    if hx is not None:
        for d in range(len(suffixes)):
            close(d_h0[d], arrays[f"grad/initial_state/{2 * d}"], dtype, f"grad/initial_state h {d}", grad=True)
            close(d_c0[d], arrays[f"grad/initial_state/{2 * d + 1}"], dtype, f"grad/initial_state c {d}", grad=True)
    grads = []
    for k in range(lstm.num_directions):
        prefix = prefix_of(lstm, k)
        grads += keras_grads({n[len(prefix):]: g for n, g in d_w.items() if n.startswith(prefix)},
                             case["input_size"])
    assert len(grads) == count
    for k, g in enumerate(grads):
        close(np.ascontiguousarray(g), arrays[f"grad/weights/{k}"], dtype, f"grad/weights/{k}", grad=True)


def test_keras_mask_semantics_in_the_fixtures():
    """What the masked cases show: repeats of the previous output (LSTM), zeros (Bidirectional)."""
    case, arrays = case_of("keras_layers.npz", "mask")
    lstm = LSTM(3, 4, batch_first=True)
    lstm.set_cell_weights(keras_weights(arrays, "weights/", 3, True))
    mask = arrays["mask"]
    output = lstm(arrays["x"], mask=mask)[0]
    assert (~mask).any(axis=1).sum() >= 3
    for b in range(mask.shape[0]):
        last = np.zeros(4, np.float32)
        for t in range(mask.shape[1]):
            if not mask[b, t]:
                np.testing.assert_array_equal(output[b, t], last)
            last = output[b, t]
    case, arrays = case_of("keras_layers.npz", "bidirectional")
    lstm = LSTM(3, 3, batch_first=True, bidirectional=True, zero_output_for_mask=True)
    lstm.set_cell_weights(keras_weights(arrays, "weights/", 6, True))
    output = lstm(arrays["x"], mask=arrays["mask"])[0]
    assert not output[~arrays["mask"]].any() and output[arrays["mask"]].all()
    # The prepadded mask: zeros before the first step, the initial state carried to it.
    case, arrays = case_of("keras_layers.npz", "prepad")
    mask = arrays["mask"]
    assert not mask[:, 0].all() and mask[:, -1].all()


def test_keras_go_backwards_is_a_reversed_cell_read_in_processing_order():
    case, arrays = case_of("keras_layers.npz", "go_backwards")
    dtype = np.dtype(case["dtype"])
    assert keras_config(case)["go_backwards"]
    mask = arrays["mask"]
    assert (~mask).all(axis=1).any()  # a fully masked row
    cell = LSTMCell(4, forget_bias=0.0, dtype=dtype)
    cell.set_weights(keras_weights(arrays, "weights/", 3, True)[0])
    (out, final), backward = cell.vjp(arrays["x"], None, mask=mask, reverse=True, time_major=False)
    close(out[:, ::-1], arrays["output"], dtype, "output (processing order)")
    close(final.h, arrays["h"], dtype, "h")
    close(final.c, arrays["c"], dtype, "c")
    full = (~mask).all(axis=1)
    assert not out[full].any() and not final.h[full].any()
    d_x, _, d_w = backward(np.ascontiguousarray(arrays["R/output"][:, ::-1]), LSTMStateTuple(arrays["R/c"],
                                                                                           arrays["R/h"]))
    close(d_x, arrays["grad/x"], dtype, "grad/x", grad=True)
    for k, g in enumerate(keras_grads(d_w, case["input_size"])):
        close(np.ascontiguousarray(g), arrays[f"grad/weights/{k}"], dtype, f"grad/weights/{k}", grad=True)
    # A layer with reverse=True: the same, its outputs in time order too.
    lstm = LSTM(case["input_size"], 4, reverse=True, batch_first=True)
    lstm.set_cell_weights(keras_weights(arrays, "weights/", 3, True))
    (output, (h_n, c_n)), layer_backward = lstm.vjp(arrays["x"], mask=mask)
    close(output[:, ::-1], arrays["output"], dtype, "output (LSTM reverse=True)")
    close(h_n[0], arrays["h"], dtype, "h (LSTM reverse=True)")
    close(c_n[0], arrays["c"], dtype, "c (LSTM reverse=True)")
    d_x2 = layer_backward(np.ascontiguousarray(arrays["R/output"][:, ::-1]),
                          (arrays["R/h"][None], arrays["R/c"][None]))[0]
    close(d_x2, arrays["grad/x"], dtype, "grad/x (LSTM reverse=True)", grad=True)
    # The same through run(), and with the mask as 0/1 integers.
    out2, final2 = cell.run(arrays["x"], mask=mask.astype(np.int8), reverse=True, time_major=False)
    np.testing.assert_array_equal(out2, out)
    np.testing.assert_array_equal(final2.c, final.c)


# Keras options that from_keras reads (keras_options.npz): zero_output_for_mask, go_backwards, Keras 2's CuDNNLSTM.


def keras_serialized(case, arrays):
    return {**case["serialized"], "weights": [arrays[f"weights/{k}"] for k in range(case["weights"])]}


@pytest.mark.parametrize("case_name", [n for n in case_names("keras_options.npz") if n != "missing"])
def test_keras_options_from_keras(case_name):
    """from_keras of each layer against Keras: outputs, final states, and every gradient Keras stored."""
    case, arrays = case_of("keras_options.npz", case_name)
    dtype = np.float32
    config = case["serialized"]["config"]
    lstm = nblstm.LSTM.from_keras(keras_serialized(case, arrays))
    inner = config["layer"]["config"] if "layer" in config else config
    assert lstm.go_backwards == bool(inner.get("go_backwards"))
    assert lstm.zero_output_for_mask == bool(inner.get("zero_output_for_mask") or "layer" in config)
    mask = arrays.get("mask")
    (output, (h_n, c_n)), backward = lstm.vjp(arrays["x"], mask=mask)
    sequences = inner.get("return_sequences", False) or "layer" in config
    close(output if sequences else h_n[0], arrays["output"], dtype, "output")
    if "h" in arrays:
        close(h_n[0], arrays["h"], dtype, "h")
        close(c_n[0], arrays["c"], dtype, "c")
    d_hx = None
    if "h" in arrays or not sequences:  # one direction: h_n is Keras's h, and its last output without sequences
        d_h = arrays.get("R/h", 0) + (0 if sequences else arrays["R/output"])
        d_hx = (np.broadcast_to(d_h, h_n.shape).astype(dtype), arrays.get("R/c", np.zeros_like(c_n[0]))[None])
    d_x, _, d_w = backward(arrays["R/output"] if sequences else None, d_hx)
    close(d_x, arrays["grad/x"], dtype, "grad/x", grad=True)
    if case["framework"] == "keras":  # tf_keras's gradients are the converted LSTM's weights', not the source's
        grads = keras_grads({n[3:]: g for n, g in d_w.items()}, lstm.input_size)
        for k, g in enumerate(grads):
            close(np.ascontiguousarray(g), arrays[f"grad/weights/{k}"], dtype, f"grad/weights/{k}", grad=True)
    if mask is None or not lstm.go_backwards:
        return
    # go_backwards: the mask of the steps before each length is the same as those lengths.
    lengths = np.array([6, 4, 0, 2])
    steps = arrays["x"].shape[1]
    by_mask = lstm(arrays["x"], mask=np.arange(steps)[None, :] < lengths[:, None])
    by_lengths = lstm(arrays["x"], sequence_length=lengths)
    for a, b in zip((by_mask[0], *by_mask[1]), (by_lengths[0], *by_lengths[1]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_keras_options_refused_where_they_cannot_be_honoured():
    case, arrays = case_of("keras_options.npz", "backwards_sequences")
    serialized = keras_serialized(case, arrays)
    with pytest.raises(ValueError, match="go_backwards=True, which an LSTMCell takes per call"):
        LSTMCell.from_keras(serialized)
    weights_only = LSTMCell.from_keras(serialized["weights"])  # the weights alone, the option the caller's
    out, _ = weights_only.run(arrays["x"], mask=arrays["mask"], reverse=True, time_major=False)
    close(out[:, ::-1], arrays["output"], np.float32, "cell output, processing order")
    zero, zero_arrays = case_of("keras_options.npz", "zero_output")
    with pytest.raises(ValueError, match="zero_output_for_mask=True, which an LSTMCell takes per call"):
        LSTMCell.from_keras(keras_serialized(zero, zero_arrays))
    # One nblstm.LSTM of several layers cannot reverse the sequence between them: read them one by one.
    above = {**serialized, "config": {**serialized["config"], "go_backwards": False, "return_sequences": True}}
    over = {**serialized, "weights": [np.zeros((4, 16), np.float32), *serialized["weights"][1:]]}
    with pytest.raises(ValueError, match="layer 0 has go_backwards=True.*stack_from_keras"):
        nblstm.LSTM.from_keras([serialized, over])
    with pytest.raises(ValueError, match="a layer above the first has go_backwards=True"):
        nblstm.LSTM.from_keras([above, over])
    first, second = nblstm.LSTM.stack_from_keras([above, over])
    assert not first.go_backwards and second.go_backwards
    with pytest.raises(ValueError, match="go_backwards=True"):
        nblstm.LSTM(3, 4, num_layers=2, go_backwards=True)
    with pytest.raises(ValueError, match="no equivalent of go_backwards=True"):
        nblstm.LSTM.from_keras(serialized).to_torch(state_dict=True)
    mixed = {**serialized, "config": {**serialized["config"], "dtype": {"class_name": "DTypePolicy",
                                                                         "config": {"name": "mixed_float16"}}}}
    with pytest.raises(ValueError, match="dtype policy 'mixed_float16'"):
        nblstm.LSTM.from_keras(mixed)


def test_keras_cudnn_lstm_cell_and_converter():
    """CuDNNLSTM's variables through LSTMCell.from_keras, and the converter against tf_keras's own."""
    case, arrays = case_of("keras_options.npz", "cudnn")
    serialized = keras_serialized(case, arrays)
    cell = LSTMCell.from_keras(serialized)
    out, final = cell.run(arrays["x"], time_major=False)
    close(out, arrays["output"], np.float32, "output")
    close(final.c, arrays["c"], np.float32, "c")
    with pytest.raises(ValueError, match="CuDNNLSTM's variables are kernel"):
        nblstm.convert.keras_cudnn_to_keras(*serialized["weights"][:2], serialized["weights"][2][:12])
    with pytest.raises(ValueError, match="CuDNNLSTM's variables are kernel"):
        nblstm.convert.keras_cudnn_to_keras(serialized["weights"][0][None], *serialized["weights"][1:])
    with pytest.raises(TypeError, match="kernel must be a floating-point array"):
        nblstm.convert.keras_cudnn_to_keras(serialized["weights"][0].astype(np.int32), *serialized["weights"][1:])
    with pytest.raises(TypeError, match="go_backwards"):
        nblstm.LSTM(3, 4, go_backwards="yes")


def test_keras_stack_bidirectional_then_lstm():
    index, cases = fixture("keras_layers.npz")
    meta, arrays = index["stack"], cases["stack"]
    layers = meta["layers"]
    assert [layer["class_name"] for layer in layers] == ["InputLayer", "Masking", "Bidirectional", "LSTM"]
    mask = arrays["mask"]
    bi_units = layers[2]["serialized"]["config"]["layer"]["config"]["units"]
    last_units = layers[3]["serialized"]["config"]["units"]
    bi = LSTM(meta["input_size"], bi_units, bidirectional=True, batch_first=True, zero_output_for_mask=True)
    bi.set_cell_weights(keras_weights(arrays, "layers/2/weights/", 6, True))
    last = LSTM(2 * bi_units, last_units, batch_first=True)
    last.set_cell_weights(keras_weights(arrays, "layers/3/weights/", 3, True))
    middle = bi(arrays["x"], mask=mask)[0]
    close(middle, arrays["bidirectional_output"], np.float32, "bidirectional_output")
    output = last(middle, mask=mask)[0]
    close(output, arrays["output"], np.float32, "output")


def test_keras_hard_sigmoid_samples():
    _, cases = fixture("keras_layers.npz")
    samples = cases["hard_sigmoid_samples"]
    # One unit, the kernel picking one gate pre-activation: i = hard_sigmoid(x) at c_prev = 0, j = 1 (relu), c = i.
    for dtype in (np.float32, np.float64):
        x, y = samples[f"x_{np.dtype(dtype).name}"], samples[f"y_{np.dtype(dtype).name}"]
        cell = LSTMCell(1, activation="linear", recurrent_activation="hard_sigmoid", forget_bias=0.0, dtype=dtype)
        kernel = np.zeros((2, 4), dtype)
        kernel[0, 0] = 1.0
        cell.set_weights({"kernel": kernel, "bias": np.array([0, 1, 0, 0], dtype)})
        c = cell.run(x.reshape(1, -1, 1).astype(dtype))[1].c[:, 0]
        close(c, y, dtype, f"hard_sigmoid {np.dtype(dtype).name}")


# ----------------------------------------------------------------------------------------------------
# 4. ONNX LSTM nodes run by onnxruntime (onnx_lstm.npz)
# ----------------------------------------------------------------------------------------------------


def onnx_cells(arrays):
    W, R = arrays["W"], arrays["R"]
    B, P = arrays.get("B"), arrays.get("P")
    return [onnx_cell(W[d], R[d], None if B is None else B[d], None if P is None else P[d])
            for d in range(W.shape[0])]


@pytest.mark.parametrize("case_name", ["forward", "bidirectional", "layout1", "zero_length"])
def test_onnx_lstm_layers(case_name):
    case, arrays = case_of("onnx_lstm.npz", case_name)
    dtype = np.float32
    layout1 = case["layout"] == 1
    num_dir = case["num_directions"]
    lstm = LSTM(case["input_size"], case["hidden_size"], bidirectional=num_dir == 2, batch_first=layout1,
                use_peepholes="P" in arrays)
    lstm.set_cell_weights(onnx_cells(arrays))
    hx = None
    if "initial_h" in arrays:
        h0, c0 = arrays["initial_h"], arrays["initial_c"]
        hx = (h0.transpose(1, 0, 2), c0.transpose(1, 0, 2)) if layout1 else (h0, c0)
        hx = tuple(np.ascontiguousarray(a) for a in hx)
    lengths = arrays.get("sequence_lens")
    output, (h_n, c_n) = lstm(arrays["X"], hx, sequence_length=lengths)
    Y, Y_h, Y_c = arrays["Y"], arrays["Y_h"], arrays["Y_c"]
    if layout1:  # Y [B, T, D, H]; Y_h [B, D, H]
        expected = Y.reshape(Y.shape[0], Y.shape[1], -1)
        Y_h, Y_c = Y_h.transpose(1, 0, 2), Y_c.transpose(1, 0, 2)
    else:  # Y [T, D, B, H]
        expected = np.concatenate([Y[:, d] for d in range(num_dir)], axis=-1)
    close(output, expected, dtype, "Y")
    keep = np.ones(h_n.shape[1], bool)
    if case_name == "zero_length":
        # A documented difference: onnxruntime zeroes the final states of a zero-length example;
        # nblstm (as TensorFlow's dynamic_rnn) returns its initial state.
        zero = np.asarray(lengths) == 0
        assert not Y_h[:, zero].any() and not Y_c[:, zero].any()
        np.testing.assert_array_equal(h_n[:, zero], hx[0][:, zero])
        np.testing.assert_array_equal(c_n[:, zero], hx[1][:, zero])
        keep = ~zero
    close(h_n[:, keep], Y_h[:, keep], dtype, "Y_h")
    close(c_n[:, keep], Y_c[:, keep], dtype, "Y_c")


def test_onnx_reverse_direction_is_the_reversed_cell():
    case, arrays = case_of("onnx_lstm.npz", "reverse")
    assert case["attributes"]["direction"] == "reverse"
    cell = LSTMCell(case["hidden_size"], forget_bias=0.0)
    cell.set_weights(onnx_cells(arrays)[0])
    out, final = cell.run(arrays["X"], None, arrays["sequence_lens"], reverse=True)
    close(out, arrays["Y"][:, 0], np.float32, "Y")
    close(final.h, arrays["Y_h"][0], np.float32, "Y_h")
    close(final.c, arrays["Y_c"][0], np.float32, "Y_c")
    lstm = LSTM(case["input_size"], case["hidden_size"], reverse=True)
    lstm.set_cell_weights(onnx_cells(arrays))
    output, (h_n, c_n) = lstm(arrays["X"], sequence_length=arrays["sequence_lens"])
    close(output, arrays["Y"][:, 0], np.float32, "Y (LSTM reverse=True)")
    close(h_n, arrays["Y_h"], np.float32, "Y_h (LSTM reverse=True)")
    close(c_n, arrays["Y_c"], np.float32, "Y_c (LSTM reverse=True)")


def test_onnx_stacked_nodes_as_layers():
    index, cases = fixture("onnx_lstm.npz")
    arrays = cases["stacked"]
    first = {k: arrays[f"lstm_a/{k}"] for k in ("W", "R", "B")}
    second = {k: arrays[f"lstm_b/{k}"] for k in ("W", "R", "B")}
    x, lengths = arrays["X"], arrays["sequence_lens"]
    a = LSTM(x.shape[2], first["R"].shape[2], bidirectional=True)
    a.set_cell_weights(onnx_cells(first))
    out_a, (h_a, c_a) = a(x, sequence_length=lengths)
    close(out_a, arrays["lstm_a/out"], np.float32, "lstm_a/out")
    close(h_a, arrays["lstm_a/Y_h"], np.float32, "lstm_a/Y_h")
    b = LSTM(out_a.shape[2], second["R"].shape[2])
    b.set_cell_weights(onnx_cells(second))
    out_b, (h_b, c_b) = b(out_a, sequence_length=lengths)
    close(out_b, arrays["lstm_b/Y"][:, 0], np.float32, "lstm_b/Y")
    close(c_b, arrays["lstm_b/Y_c"], np.float32, "lstm_b/Y_c")


# ----------------------------------------------------------------------------------------------------
# 5. The float64 reference, layer by layer, and finite differences
# ----------------------------------------------------------------------------------------------------


def randomize(lstm, rng, scale=0.5):
    """Normal weights (biases and peepholes too), so every term counts."""
    lstm.set_weights({n: (scale * rng.standard_normal(a.shape)).astype(a.dtype)
                      for n, a in lstm.get_weights().items()})
    return lstm


def cell_options(cell):
    return dict(forget_bias=cell.forget_bias, cell_clip=cell.cell_clip,
                proj_clip=cell.proj_clip if cell.num_proj else None, activation=cell.activation.name,
                recurrent_activation=cell.recurrent_activation)


def reference_layer(lstm, x, hx=None, lengths=None, mask=None, keeps=None, weights=None):
    """``lstm``'s call in float64: :func:`nblstm.reference.cell.run` per layer and direction.

    ``keeps``: the dropout factors ``[T, B, D * P]`` (time-major) after each layer but the last.
    ``weights``: a list of cell weight dicts replacing the cells' (for finite differences).
    """
    x = np.asarray(x, np.float64)
    if lstm.batch_first:
        x = x.swapaxes(0, 1)
    steps, batch = x.shape[:2]
    weights = [c.get_weights() for c in lstm.cells] if weights is None else weights
    layer_in, h_n, c_n = x, [], []
    for layer in range(lstm.num_layers):
        outs = []
        for d in range(lstm.num_directions):
            k = layer * lstm.num_directions + d
            cell = lstm.cells[k]
            c0 = np.zeros((batch, cell.num_units)) if hx is None else hx[1][k]
            h0 = np.zeros((batch, cell.output_size)) if hx is None else hx[0][k]
            out, c, h = ref.run(weights[k], layer_in, c0, h0, sequence_length=lengths, mask=mask,
                                reverse=bool(d) or lstm.reverse, **cell_options(cell))
            if mask is not None and lstm.zero_output_for_mask:
                out = np.where(np.asarray(mask).T[:, :, None], out, 0.0)
            outs.append(out)
            h_n.append(h)
            c_n.append(c)
        layer_in = np.concatenate(outs, axis=2)
        if keeps is not None and layer < lstm.num_layers - 1:
            layer_in = layer_in * keeps[layer]
    output = layer_in.swapaxes(0, 1) if lstm.batch_first else layer_in
    return output, np.stack(h_n), np.stack(c_n)


def random_hx(lstm, rng, batch):
    rows = lstm.num_layers * lstm.num_directions
    return (0.5 * rng.standard_normal((rows, batch, lstm.proj_size or lstm.hidden_size)),
            rng.standard_normal((rows, batch, lstm.hidden_size)))


def random_mask(rng, batch, steps):
    mask = rng.random((batch, steps)) < 0.6
    mask[0] = True
    mask[1] = False
    if batch > 2:
        mask[2, :2] = False
        mask[2, -1] = True
    return mask


# (constructor keywords, (T, B), inputs: "lengths", "mask" or None)
REFERENCE_CASES = {
    "3_layers_bi_proj_peepholes_clip": (dict(num_layers=3, bidirectional=True, proj_size=2, use_peepholes=True,
                                             cell_clip=0.6), (5, 4), "lengths"),
    "2_layers_bi_mask_batch_first": (dict(num_layers=2, bidirectional=True, batch_first=True, use_peepholes=True),
                                     (5, 4), "mask"),
    "2_layers_bi_mask_zero_output": (dict(num_layers=2, bidirectional=True, zero_output_for_mask=True,
                                          proj_size=2, proj_clip=0.3), (4, 3), "mask"),
    "2_layers_batch_first_lengths": (dict(num_layers=2, batch_first=True, forget_bias=0.5,
                                          recurrent_activation="hard_sigmoid", activation="softsign"),
                                     (4, 3), "lengths"),
    "1_layer_bi_full": (dict(bidirectional=True, cell_clip=0.4), (3, 2), None),
    "2_layers_reverse_lengths": (dict(num_layers=2, reverse=True, proj_size=2), (5, 4), "lengths"),
    "2_layers_reverse_mask_batch_first": (dict(num_layers=2, reverse=True, batch_first=True), (4, 3), "mask"),
}


def reference_problem(name, rng):
    kwargs, (steps, batch), kind = REFERENCE_CASES[name]
    lstm = randomize(LSTM(3, 3, dtype=np.float64, seed=0, **kwargs), rng)
    x = rng.standard_normal((batch, steps, 3) if lstm.batch_first else (steps, batch, 3))
    lengths = mask = None
    if kind == "lengths":
        lengths = np.array([steps, 0, 2, 1][:batch])
    elif kind == "mask":
        mask = random_mask(rng, batch, steps)
    return lstm, x, random_hx(lstm, rng, batch), lengths, mask


@pytest.mark.parametrize("name", list(REFERENCE_CASES))
def test_layer_matches_the_reference(name):
    rng = np.random.default_rng(sum(map(ord, name)))
    lstm, x, hx, lengths, mask = reference_problem(name, rng)
    for state in (hx, None):
        output, (h_n, c_n) = lstm(x, state, sequence_length=lengths, mask=mask)
        e_out, e_h, e_c = reference_layer(lstm, x, state, lengths, mask)
        np.testing.assert_allclose(output, e_out, err_msg="output", **REF_TOL)
        np.testing.assert_allclose(h_n, e_h, err_msg="h_n", **REF_TOL)
        np.testing.assert_allclose(c_n, e_c, err_msg="c_n", **REF_TOL)
    if lengths is not None:
        out_tm = output.swapaxes(0, 1) if lstm.batch_first else output
        for b, n in enumerate(lengths):
            assert not out_tm[n:, b].any()
    if lstm.cell_clip is not None:  # the clip is reached
        assert (np.abs(c_n) >= lstm.cell_clip - 1e-12).any()


def fd(loss, array, index, eps=1e-6):
    keep = array[index]
    array[index] = keep + eps
    up = loss()
    array[index] = keep - eps
    down = loss()
    array[index] = keep
    return (up - down) / (2 * eps)


def check_gradients(lstm, x, hx, lengths, mask, rng, training=False, keeps=None, entries=3):
    """lstm.vjp's gradients against central differences of the reference at ``entries`` entries of each array."""
    out, h_n, c_n = reference_layer(lstm, x, hx, lengths, mask, keeps)
    r_out, r_h, r_c = (rng.standard_normal(a.shape) for a in (out, h_n, c_n))
    x, hx = x.copy(), (hx[0].copy(), hx[1].copy())
    weights = [c.get_weights() for c in lstm.cells]

    def loss():
        o, h, c = reference_layer(lstm, x, hx, lengths, mask, keeps, weights)
        return np.sum(o * r_out) + np.sum(h * r_h) + np.sum(c * r_c)

    d_x, (d_h0, d_c0), d_w = lstm_backward(lstm, x, hx, lengths, mask, training, r_out, r_h, r_c)
    targets = [("x", x, d_x), ("h0", hx[0], d_h0), ("c0", hx[1], d_c0)]
    for k, w in enumerate(weights):
        prefix = prefix_of(lstm, k)
        targets += [(prefix + n, w[n], d_w[prefix + n]) for n in w if lstm.bias or n != "bias"]
    assert {t[0] for t in targets[3:]} == set(d_w)
    for what, array, grad in targets:
        assert grad.shape == array.shape, what
        flat = rng.choice(array.size, size=min(entries, array.size), replace=False)
        for i in flat:
            index = np.unravel_index(i, array.shape)
            np.testing.assert_allclose(grad[index], fd(loss, array, index), rtol=1e-6, atol=1e-7,
                                       err_msg=f"d {what}{index}")
    return d_x, (d_h0, d_c0), d_w


def lstm_backward(lstm, x, hx, lengths, mask, training, r_out, r_h, r_c):
    (out, _), backward = lstm.vjp(x, hx, sequence_length=lengths, mask=mask, training=training)
    return backward(r_out, (r_h, r_c))


@pytest.mark.parametrize("name", list(REFERENCE_CASES))
def test_layer_gradients_match_finite_differences(name):
    rng = np.random.default_rng(7 + sum(map(ord, name)))
    lstm, x, hx, lengths, mask = reference_problem(name, rng)
    d_x, _, _ = check_gradients(lstm, x, hx, lengths, mask, rng)
    if lengths is not None:  # nothing flows from the padding
        d_tm = d_x.swapaxes(0, 1) if lstm.batch_first else d_x
        for b, n in enumerate(lengths):
            assert not d_tm[n:, b].any()
    if mask is not None:
        assert not (d_x.swapaxes(0, 1) if not lstm.batch_first else d_x)[~mask].any()


def test_vjp_without_cotangents_and_with_one_state_part():
    rng = np.random.default_rng(3)
    lstm, x, hx, lengths, _ = reference_problem("3_layers_bi_proj_peepholes_clip", rng)
    (out, (h_n, c_n)), backward = lstm.vjp(x, hx, sequence_length=lengths)
    d_x, (d_h0, d_c0), d_w = backward()
    assert not d_x.any() and not d_h0.any() and not d_c0.any() and not any(g.any() for g in d_w.values())
    r = rng.standard_normal(h_n.shape)
    only_h = backward(None, (r, None))
    both = backward(None, (r, np.zeros_like(c_n)))
    np.testing.assert_allclose(only_h[0], both[0], rtol=0, atol=0)
    # Linear in the cotangents.
    r_out = rng.standard_normal(out.shape)
    a, b, ab = backward(r_out), backward(None, (r, None)), backward(r_out, (r, None))
    np.testing.assert_allclose(a[0] + b[0], ab[0], rtol=1e-12, atol=1e-12)


def test_dropout_only_when_training_and_seeded():
    rng = np.random.default_rng(11)
    kwargs = dict(num_layers=3, bidirectional=True, dropout=0.4, dtype=np.float64)
    lstm = randomize(LSTM(3, 3, seed=5, **kwargs), rng)
    twin = LSTM(3, 3, seed=5, **kwargs)
    twin.set_weights(lstm.get_weights())
    no_dropout = LSTM(3, 3, num_layers=3, bidirectional=True, dtype=np.float64)
    no_dropout.set_weights(lstm.get_weights())
    x = rng.standard_normal((4, 3, 3))
    lengths = np.array([4, 0, 2])
    plain = no_dropout(x, sequence_length=lengths)
    off = lstm(x, sequence_length=lengths)  # training=False: no dropout
    np.testing.assert_array_equal(off[0], plain[0])
    np.testing.assert_array_equal(off[1][0], plain[1][0])
    np.testing.assert_array_equal(off[1][1], plain[1][1])
    # The same seed draws the same masks; the masks are the layer's generator's draws, 1/(1-p) where kept.
    rng_before = copy.deepcopy(lstm.rng)
    out, (h_n, c_n) = lstm(x, sequence_length=lengths, training=True)
    twin_out = twin(x, sequence_length=lengths, training=True)[0]
    np.testing.assert_array_equal(out, twin_out)
    keeps = [(rng_before.random((4, 3, 6)) >= 0.4) / 0.6 for _ in range(2)]
    e_out, e_h, e_c = reference_layer(lstm, x, None, lengths, None, keeps)
    np.testing.assert_allclose(out, e_out, **REF_TOL)
    np.testing.assert_allclose(h_n, e_h, **REF_TOL)
    assert not np.allclose(out, plain[0])
    # Later calls draw new masks.
    assert not np.array_equal(lstm(x, sequence_length=lengths, training=True)[0], out)
    # The vjp with training=True: finite differences with the masks of that call held fixed.
    hx = random_hx(lstm, rng, 3)
    draws = copy.deepcopy(lstm.rng)  # the draws the next call will make
    keeps = [(draws.random((4, 3, 6)) >= 0.4) / 0.6 for _ in range(2)]
    check_gradients(lstm, x, hx, lengths, None, rng, training=True, keeps=keeps)
    # A single layer has no dropout.
    single = LSTM(3, 3, dropout=0.5, dtype=np.float64, seed=1)
    np.testing.assert_array_equal(single(x, training=True)[0], single(x)[0])


def test_multi_rnn_cell_initial_states_and_both_layouts():
    """A MultiRNNCell with given initial states, forward and backward direction: its cells chained by hand."""
    rng = np.random.default_rng(14)
    cells = [LSTMCell(3, use_peepholes=True, dtype=np.float64, seed=1), LSTMCell(4, num_proj=2, dtype=np.float64,
                                                                                  seed=2)]
    x = rng.standard_normal((4, 5, 2))  # [B, T, I]
    lengths = np.array([5, 0, 3, 1])
    for cell, inputs in zip(cells, (2, 3), strict=True):
        cell.build(inputs)
        cell.set_weights({n: 0.5 * rng.standard_normal(a.shape) for n, a in cell.get_weights().items()})
    states = tuple(LSTMStateTuple(rng.standard_normal((4, c.num_units)), rng.standard_normal((4, c.output_size)))
                   for c in cells)
    stack = MultiRNNCell(cells)
    assert stack.output_size == 2 and stack.state_size == (cells[0].state_size, cells[1].state_size)
    for reverse in (False, True):
        expected, finals = np.ascontiguousarray(x.swapaxes(0, 1)), []
        for cell, state in zip(cells, states, strict=True):
            expected, c, h = ref.run(cell.get_weights(), expected, state.c, state.h, sequence_length=lengths,
                                     reverse=reverse, **cell_options(cell))
            finals.append((c, h))
        if reverse:
            (_, out), (_, final) = nblstm.bidirectional_dynamic_rnn(stack, stack, x, sequence_length=lengths,
                                                                    initial_state_fw=states, initial_state_bw=states)
        else:
            out, final = nblstm.dynamic_rnn(stack, x, sequence_length=lengths, initial_state=states)
        np.testing.assert_allclose(out, expected.swapaxes(0, 1), **REF_TOL)
        for state, (c, h) in zip(final, finals, strict=True):
            np.testing.assert_allclose(state.c, c, **REF_TOL)
            np.testing.assert_allclose(state.h, h, **REF_TOL)
        out_tm, _ = nblstm.dynamic_rnn(stack, np.ascontiguousarray(x.swapaxes(0, 1)), sequence_length=lengths,
                                       initial_state=states, time_major=True)
        if not reverse:
            np.testing.assert_allclose(out_tm, expected, **REF_TOL)


def test_multi_rnn_cell_steps_match_dynamic_rnn():
    rng = np.random.default_rng(15)
    stack = MultiRNNCell([LSTMCell(3, dtype=np.float64, seed=1), LSTMCell(2, num_proj=1, dtype=np.float64, seed=2)])
    x = rng.standard_normal((2, 4, 3))
    out, final = nblstm.dynamic_rnn(stack, x)
    state = stack.zero_state(2, np.float64)
    for t in range(4):
        step, state = stack(x[:, t], state)
        np.testing.assert_allclose(step, out[:, t], **REF_TOL)
    for a, b in zip(state, final, strict=True):
        np.testing.assert_allclose(a.c, b.c, **REF_TOL)
        np.testing.assert_allclose(a.h, b.h, **REF_TOL)
    assert list(stack.get_weights())[:2] == ["cell_0/kernel", "cell_0/bias"]


def test_float16_layer_computes_in_float32():
    rng = np.random.default_rng(16)
    lstm = randomize(LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2, dtype=np.float16), rng)
    exact = LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2, dtype=np.float64)
    exact.set_weights({n: a.astype(np.float64) for n, a in lstm.get_weights().items()})
    x = rng.standard_normal((5, 3, 3)).astype(np.float16)
    mask = random_mask(rng, 3, 5)
    for kw in (dict(sequence_length=[5, 0, 2]), dict(mask=mask)):
        (out, (h_n, c_n)), backward = lstm.vjp(x, **kw)
        e_out, e_h, e_c = reference_layer(exact, x, None, kw.get("sequence_length"), kw.get("mask"))
        assert out.dtype == h_n.dtype == c_n.dtype == np.float16
        for a, e in ((out, e_out), (h_n, e_h), (c_n, e_c)):
            np.testing.assert_allclose(a.astype(np.float64), e, rtol=8e-3, atol=2e-3)
        d_x, _, d_w = backward(np.ones_like(out))
        assert d_x.dtype == np.float16 and all(g.dtype == np.float16 for g in d_w.values())


def test_mask_and_lengths_agree_on_right_padded_masks():
    """A right-padded mask is lengths, except that masked outputs repeat the last one."""
    rng = np.random.default_rng(12)
    lstm = randomize(LSTM(3, 3, num_layers=2, bidirectional=True, dtype=np.float64), rng)
    x = rng.standard_normal((5, 4, 3))
    lengths = np.array([5, 3, 1, 0])
    mask = np.arange(5)[None, :] < lengths[:, None]
    by_len = lstm(x, sequence_length=lengths)
    by_mask = lstm(x, mask=mask)
    np.testing.assert_allclose(by_mask[1][0], by_len[1][0], **REF_TOL)
    np.testing.assert_allclose(by_mask[1][1], by_len[1][1], **REF_TOL)
    # The forward direction's masked outputs repeat the last output; the reverse direction's (masked
    # times come first in its order) are zero.
    np.testing.assert_allclose(by_mask[0][:, :, :3][mask.T], by_len[0][:, :, :3][mask.T], **REF_TOL)
    zoo = LSTM(3, 3, num_layers=1, bidirectional=True, dtype=np.float64, zero_output_for_mask=True)
    zoo.set_weights({n: a for n, a in lstm.get_weights().items() if n.startswith("l0")})
    one = LSTM(3, 3, num_layers=1, bidirectional=True, dtype=np.float64)
    one.set_weights(zoo.get_weights())
    np.testing.assert_allclose(zoo(x, mask=mask)[0], one(x, sequence_length=lengths)[0], **REF_TOL)


def test_cell_run_keywords_match_the_reference():
    """LSTMCell.run with reverse, mask, time_major and zero_output_for_mask: the reference cell."""
    rng = np.random.default_rng(13)
    cell = LSTMCell(3, num_proj=2, use_peepholes=True, dtype=np.float64, seed=1)
    cell.build(2)
    cell.set_weights({n: 0.5 * rng.standard_normal(a.shape) for n, a in cell.get_weights().items()})
    x = rng.standard_normal((5, 4, 2))
    state = LSTMStateTuple(rng.standard_normal((4, 3)), rng.standard_normal((4, 2)))
    mask = random_mask(rng, 4, 5)
    opts = cell_options(cell)
    for reverse in (False, True):
        for kw, ref_kw in ((dict(sequence_length=[5, 0, 3, 1]), dict(sequence_length=[5, 0, 3, 1])),
                           (dict(mask=mask), dict(mask=mask))):
            e_out, e_c, e_h = ref.run(cell.get_weights(), x, state.c, state.h, reverse=reverse, **ref_kw, **opts)
            out, final = cell.run(x, state, reverse=reverse, **kw)
            np.testing.assert_allclose(out, e_out, **REF_TOL)
            np.testing.assert_allclose(final.c, e_c, **REF_TOL)
            np.testing.assert_allclose(final.h, e_h, **REF_TOL)
            out_bm, final_bm = cell.run(np.ascontiguousarray(x.swapaxes(0, 1)), state, reverse=reverse,
                                        time_major=False, **kw)
            np.testing.assert_allclose(out_bm, e_out.swapaxes(0, 1), **REF_TOL)
            np.testing.assert_allclose(final_bm.h, e_h, **REF_TOL)
        out, _ = cell.run(x, state, mask=mask, reverse=reverse, zero_output_for_mask=True)
        e_out = ref.run(cell.get_weights(), x, state.c, state.h, mask=mask, reverse=reverse, **opts)[0]
        np.testing.assert_allclose(out, np.where(mask.T[:, :, None], e_out, 0.0), **REF_TOL)


# ----------------------------------------------------------------------------------------------------
# 6. Several workers: shapes above the thresholds of nblstm.cpu.partition
# ----------------------------------------------------------------------------------------------------


@pytest.fixture
def restore_num_threads():
    n = numba.get_num_threads()
    yield n
    numba.set_num_threads(n)


@pytest.fixture
def worker_counts(monkeypatch):
    """The worker counts of every threads.run call of the cell's kernels."""
    counts = []
    original = threads.run

    def recording(fn, args, workers, concurrency=None, timed=True):
        counts.append(workers)
        return original(fn, args, workers, concurrency, timed)

    monkeypatch.setattr(threads, "run", recording)
    return counts


@pytest.mark.parametrize("kind", ["lengths", "mask"])
def test_parallel_paths_match_the_reference_and_one_thread(kind, restore_num_threads, worker_counts):
    # B * H * 4H >= MIN_PARALLEL_CELL_STEP_WORK: units split in chunks; T * B * 4H * (I + H) and the
    # backward's T * B * (4H)^2 / 4 >= MIN_PARALLEL_CALL_WORK: helper threads join.
    steps, batch, inputs, units = 20, 64, 16, 32
    assert batch * units * 4 * units >= partition.MIN_PARALLEL_CELL_STEP_WORK
    assert steps * batch * (4 * units) ** 2 // 4 >= partition.MIN_PARALLEL_CALL_WORK
    rng = np.random.default_rng(21)
    lstm = LSTM(inputs, units, num_layers=2, bidirectional=True, use_peepholes=True, cell_clip=1.0,
                dtype=np.float64, seed=2)
    randomize(lstm, rng, scale=0.2)
    x = rng.standard_normal((steps, batch, inputs))
    hx = random_hx(lstm, rng, batch)
    lengths = mask = None
    if kind == "lengths":
        lengths = rng.integers(0, steps + 1, batch)
        lengths[:3] = (0, steps, 1)
    else:
        mask = rng.random((batch, steps)) < 0.7
        mask[0] = False
    (out, (h_n, c_n)), backward = lstm.vjp(x, hx, sequence_length=lengths, mask=mask)
    e_out, e_h, e_c = reference_layer(lstm, x, hx, lengths, mask)
    np.testing.assert_allclose(out, e_out, **REF_TOL)
    np.testing.assert_allclose(h_n, e_h, **REF_TOL)
    np.testing.assert_allclose(c_n, e_c, **REF_TOL)
    r_out, r_h, r_c = (rng.standard_normal(a.shape) for a in (out, h_n, c_n))
    grads = backward(r_out, (r_h, r_c))
    if numba.get_num_threads() > 1:
        assert max(worker_counts) > 1, worker_counts
    # One thread: one chunk, no helpers; the same results (the forward bit for bit, by design).
    numba.set_num_threads(1)
    single = LSTM(inputs, units, num_layers=2, bidirectional=True, use_peepholes=True, cell_clip=1.0,
                  dtype=np.float64)
    single.set_weights(lstm.get_weights())
    (out1, (h1, c1)), backward1 = single.vjp(x, hx, sequence_length=lengths, mask=mask)
    np.testing.assert_array_equal(out1, out)
    np.testing.assert_array_equal(h1, h_n)
    grads1 = backward1(r_out, (r_h, r_c))
    np.testing.assert_allclose(grads[0], grads1[0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(grads[1][0], grads1[1][0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(grads[1][1], grads1[1][1], rtol=1e-12, atol=1e-13)
    for name, g in grads[2].items():
        np.testing.assert_allclose(g, grads1[2][name], rtol=1e-11, atol=1e-11, err_msg=name)
    # Single examples (batch 1) give each example's outputs.
    for b in (0, 1, 2, batch - 1):
        one = single(x[:, b:b + 1], (hx[0][:, b:b + 1].copy(), hx[1][:, b:b + 1].copy()),
                     sequence_length=None if lengths is None else lengths[b:b + 1],
                     mask=None if mask is None else mask[b:b + 1])
        np.testing.assert_allclose(one[0][:, 0], out[:, b], **REF_TOL)
        np.testing.assert_allclose(one[1][1][:, 0], c_n[:, b], **REF_TOL)


def test_parallel_packing_gives_the_same_results(monkeypatch):
    """Weights packed by several threads (MIN_PARALLEL_PACK lowered) give the same bits."""
    rng = np.random.default_rng(22)
    lstm = randomize(LSTM(4, 16, bidirectional=True, proj_size=8, dtype=np.float64), rng)
    x = rng.standard_normal((6, 40, 4))
    lengths = rng.integers(0, 7, 40)
    expected = lstm(x, sequence_length=lengths)
    monkeypatch.setattr(cpu_cell, "MIN_PARALLEL_PACK", 0)
    packed = LSTM(4, 16, bidirectional=True, proj_size=8, dtype=np.float64)
    packed.set_weights(lstm.get_weights())
    got = packed(x, sequence_length=lengths)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1][1], expected[1][1])


def test_helpers_on_small_calls_with_masks_and_reverse(monkeypatch):
    """Every call with more than one chunk runs on helper threads (the call threshold at 0)."""
    monkeypatch.setattr(partition, "MIN_PARALLEL_CALL_WORK", 0)
    rng = np.random.default_rng(23)
    lstm = randomize(LSTM(3, 16, num_layers=2, bidirectional=True, batch_first=True, dtype=np.float64), rng)
    x = rng.standard_normal((40, 5, 3))
    hx = random_hx(lstm, rng, 40)
    mask = rng.random((40, 5)) < 0.6
    out, (h_n, c_n) = lstm(x, hx, mask=mask)
    e_out, e_h, e_c = reference_layer(lstm, x, hx, None, mask)
    np.testing.assert_allclose(out, e_out, **REF_TOL)
    np.testing.assert_allclose(c_n, e_c, **REF_TOL)


# ----------------------------------------------------------------------------------------------------
# 7. Errors name the argument; inputs are never modified
# ----------------------------------------------------------------------------------------------------


def small_layer(**kwargs):
    kwargs.setdefault("dtype", np.float64)
    return LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2, seed=0, **kwargs)


T_, B_ = 5, 3


@pytest.mark.parametrize("make, error, match", [
    (lambda: (np.zeros((T_, 3)),), ValueError, r"input must have rank 3"),
    (lambda: (np.zeros((T_, B_, 3), np.float32),), TypeError, r"input has dtype float32"),
    (lambda: (np.zeros((T_, B_, 2)),), ValueError, r"input_size"),
    (lambda: ([[[0.0] * 3]],), TypeError, r"input"),
    (lambda: (np.zeros((T_, B_, 3)), np.zeros((4, B_, 2))), TypeError, r"hx"),
    (lambda: (np.zeros((T_, B_, 3)), (np.zeros((B_, 2)), np.zeros((4, B_, 4)))), ValueError, r"hx\[0\]"),
    (lambda: (np.zeros((T_, B_, 3)), (np.zeros((4, B_, 4)), np.zeros((4, B_, 4)))), ValueError, r"hx\[0\]"),
    (lambda: (np.zeros((T_, B_, 3)), (np.zeros((2, B_, 2)), np.zeros((2, B_, 4)))), ValueError, r"hx\[0\]"),
    (lambda: (np.zeros((T_, B_, 3)), (np.zeros((4, B_, 2)), np.zeros((4, B_, 2)))), ValueError, r"hx\[1\]"),
    (lambda: (np.zeros((T_, B_, 3)), (np.zeros((4, B_, 2)), np.zeros((4, B_, 4), np.float32))), TypeError,
     r"hx\[1\]"),
])
def test_call_errors(make, error, match):
    lstm = small_layer()
    with pytest.raises(error, match=match):
        lstm(*make())
    with pytest.raises(error, match=match):
        lstm.vjp(*make())


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(sequence_length=[5, 6, 1]), ValueError, r"sequence_length values must be in \[0, T\] = \[0, 5\]"),
    (dict(sequence_length=[5, -1, 1]), ValueError, r"sequence_length"),
    (dict(sequence_length=[5, 1]), ValueError, r"sequence_length has shape"),
    (dict(sequence_length=np.array([5.0, 1.0, 2.0])), TypeError, r"sequence_length"),
    (dict(sequence_length="abc"), TypeError, r"sequence_length"),
    (dict(mask=np.ones((T_, B_), bool)), ValueError, r"mask has shape \(5, 3\); expected \[B, T\] = \(3, 5\)"),
    (dict(mask=np.ones((B_, T_), np.float32)), TypeError, r"mask must be a \[B, T\] bool array"),
    (dict(mask=np.full((B_, T_), 2)), TypeError, r"mask"),
    (dict(mask=np.ones((B_, T_), bool), sequence_length=[1, 2, 3]), ValueError, r"sequence_length or mask"),
    (dict(training="yes"), TypeError, r"training"),
])
def test_lengths_and_mask_errors(kwargs, error, match):
    lstm = small_layer()
    x = np.zeros((T_, B_, 3))
    with pytest.raises(error, match=match):
        lstm(x, **kwargs)
    with pytest.raises(error, match=match):
        lstm.vjp(x, **kwargs)


def test_mask_is_batch_first_whatever_the_layout():
    lstm = small_layer(batch_first=True)
    x = np.zeros((B_, T_, 3))
    lstm(x, mask=np.ones((B_, T_), bool))
    with pytest.raises(ValueError, match="mask"):
        lstm(x, mask=np.ones((T_, B_), bool))
    with pytest.raises(ValueError, match=r"hx\[0\]"):  # hx is [L * D, B, P] with batch_first too
        lstm(x, (np.zeros((4, T_, 2)), np.zeros((4, T_, 4))))


def test_backward_errors():
    lstm = small_layer()
    x = np.zeros((T_, B_, 3))
    (out, (h_n, c_n)), backward = lstm.vjp(x)
    with pytest.raises(ValueError, match="d_output has shape"):
        backward(np.zeros((T_, B_, 2)))
    with pytest.raises(ValueError, match="d_output"):
        backward(np.zeros((B_, T_, 4)))
    with pytest.raises(TypeError, match="d_output has dtype"):
        backward(out.astype(np.float32))
    with pytest.raises(TypeError, match="d_output"):
        backward([0.0])
    with pytest.raises(ValueError, match=r"d_hx\[0\]"):
        backward(None, (np.zeros((2, B_, 2)), None))
    with pytest.raises(ValueError, match=r"d_hx\[1\]"):
        backward(None, (None, np.zeros((4, B_, 2))))
    with pytest.raises(TypeError, match="d_hx"):
        backward(None, np.zeros((4, B_, 2)))
    backward(out, (h_n, c_n))  # and still usable


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(dropout=1.0), ValueError, "dropout"),
    (dict(dropout="0.1"), TypeError, "dropout"),
    (dict(proj_size=4), ValueError, "proj_size"),
    (dict(proj_size=-1), ValueError, "proj_size"),
    (dict(num_layers=0), ValueError, "num_layers"),
    (dict(bidirectional=1), TypeError, "bidirectional"),
    (dict(batch_first="no"), TypeError, "batch_first"),
    (dict(dtype=np.int32), (TypeError, ValueError), "dtype"),
    (dict(seed=1.5), TypeError, "seed"),
    (dict(recurrent_activation="relu"), ValueError, "recurrent_activation"),
    (dict(zero_output_for_mask=None), TypeError, "zero_output_for_mask"),
    (dict(reverse=True, bidirectional=True), ValueError, "reverse"),
    (dict(reverse="yes"), TypeError, "reverse"),
])
def test_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        LSTM(3, 4, **kwargs)


def test_to_torch_refuses_a_reverse_only_layer():
    """nn.LSTM has no reverse-only direction: writing one as a forward nn.LSTM would change its results."""
    with pytest.raises(ValueError, match="reverse"):
        LSTM(3, 4, reverse=True, seed=0).to_torch()


def test_weight_errors():
    lstm = small_layer()
    weights = lstm.get_weights()
    with pytest.raises(ValueError, match=r"missing \['l1_reverse/bias'\]"):
        lstm.set_weights({k: a for k, a in weights.items() if k != "l1_reverse/bias"})
    with pytest.raises(ValueError, match="unexpected"):
        lstm.set_weights({**weights, "l2/kernel": weights["l1/kernel"]})
    with pytest.raises(TypeError, match="weights must be a dict"):
        lstm.set_weights(list(weights.values()))
    with pytest.raises(ValueError, match="cells must be a list of 4"):
        lstm.set_cell_weights([c.get_weights() for c in lstm.cells[:3]])
    cells = [c.get_weights() for c in lstm.cells]
    cells[2]["kernel"] = cells[0]["kernel"]  # layer 1 reads D * P = 4 inputs, not 3
    with pytest.raises(ValueError, match=r"cell 2 \(l1\): kernel has 5 rows; expected 6"):
        lstm.set_cell_weights(cells)
    nobias = LSTM(3, 4, bias=False, dtype=np.float64)
    with pytest.raises(ValueError, match="bias"):
        nobias.set_cell_weights([lstm.cells[0].get_weights() | {"kernel": np.zeros((7, 16))}])
    # A bad array in a later cell names that cell and replaces nothing (no half-updated layer).
    new = {k: a + 1 for k, a in weights.items()}
    new["l1/bias"] = np.zeros(3)
    with pytest.raises(ValueError, match=r"cell 2 \(l1\).*bias"):
        lstm.set_weights(new)
    new["l1/bias"] = np.full(16, np.nan)
    with pytest.raises(ValueError, match=r"cell 2 \(l1\)"):
        lstm.set_weights(new)
    for name, a in lstm.get_weights().items():
        np.testing.assert_array_equal(a, weights[name], err_msg=name)


def test_rnn_function_errors():
    cell = LSTMCell(4, dtype=np.float64, seed=0)
    x = np.zeros((3, 5, 2))  # [B, T, I]
    with pytest.raises(ValueError, match="inputs must have rank 3"):
        nblstm.dynamic_rnn(cell, x[0])
    with pytest.raises(TypeError, match="cell must be an nblstm.LSTMCell"):
        nblstm.dynamic_rnn("lstm", x)
    with pytest.raises(TypeError, match="cell_bw"):
        nblstm.bidirectional_dynamic_rnn(cell, object(), x)
    with pytest.raises(TypeError, match="dtype"):
        nblstm.dynamic_rnn(cell, x, dtype=np.float32)
    with pytest.raises(TypeError, match="time_major"):
        nblstm.dynamic_rnn(cell, x, time_major=None)
    with pytest.raises(ValueError, match="sequence_length"):
        nblstm.dynamic_rnn(cell, x, sequence_length=[5, 6, 0])
    stack = MultiRNNCell([LSTMCell(4, dtype=np.float64), LSTMCell(3, dtype=np.float64)])
    with pytest.raises(TypeError, match="initial_state must be a tuple of 2"):
        nblstm.dynamic_rnn(stack, x, initial_state=stack.zero_state(3, np.float64) * 2)
    with pytest.raises(ValueError, match="cells must be a non-empty list"):
        MultiRNNCell([])
    with pytest.raises(TypeError, match=r"cells\[1\]"):
        MultiRNNCell([cell, "cell"])
    # A state sized for the other axis: the message says to pass time_major.
    state = LSTMStateTuple(np.zeros((3, 4)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="time_major=False"):
        cell.run(x, state)
    with pytest.raises(ValueError, match="time_major"):
        cell.run(x, None, [5, 5, 5])


def test_cell_keyword_errors():
    cell = LSTMCell(4, dtype=np.float64, seed=0)
    x = np.zeros((5, 3, 2))
    with pytest.raises(TypeError, match="reverse"):
        cell.run(x, reverse="yes")
    with pytest.raises(TypeError, match="zero_output_for_mask"):
        cell.run(x, zero_output_for_mask=1)
    with pytest.raises(ValueError, match="sequence_length or mask"):
        cell.run(x, sequence_length=[1, 2, 3], mask=np.ones((3, 5), bool))
    with pytest.raises(ValueError, match=r"mask has shape"):
        cell.vjp(x, mask=np.ones((5, 3), bool))


def test_inputs_are_never_modified():
    rng = np.random.default_rng(31)
    for batch_first in (False, True):
        lstm = randomize(small_layer(batch_first=batch_first), rng)
        x = rng.standard_normal((B_, T_, 3) if batch_first else (T_, B_, 3))
        hx = random_hx(lstm, rng, B_)
        lengths = np.array([5, 0, 2])
        mask = random_mask(rng, B_, T_)
        for kw in (dict(sequence_length=lengths), dict(mask=mask)):
            saved = copy.deepcopy((x, hx, kw))
            (out, (h_n, c_n)), backward = lstm.vjp(x, hx, **kw)
            d_out, d_hx = rng.standard_normal(out.shape), (rng.standard_normal(h_n.shape), rng.standard_normal(
                c_n.shape))
            saved_d = copy.deepcopy((d_out, d_hx))
            backward(d_out, d_hx)
            lstm(x, hx, training=True, **kw)
            np.testing.assert_array_equal(x, saved[0])
            for a, b in zip(hx, saved[1], strict=True):
                np.testing.assert_array_equal(a, b)
            for k, a in kw.items():
                np.testing.assert_array_equal(a, saved[2][k])
            np.testing.assert_array_equal(d_out, saved_d[0])
            for a, b in zip(d_hx, saved_d[1], strict=True):
                np.testing.assert_array_equal(a, b)
    # dynamic_rnn and the cell's keywords too.
    cell = LSTMCell(3, dtype=np.float64, seed=0)
    x = rng.standard_normal((B_, T_, 2))
    saved = x.copy()
    nblstm.bidirectional_dynamic_rnn(cell, cell, x, sequence_length=[5, 0, 2])
    cell.run(x, mask=mask, reverse=True, time_major=False)
    np.testing.assert_array_equal(x, saved)


def test_outputs_are_fresh_arrays():
    """Outputs and gradients do not alias the inputs or each other."""
    lstm = small_layer(batch_first=True)
    x = np.ones((B_, T_, 3))
    (out, (h_n, c_n)), backward = lstm.vjp(x)
    d_x, (d_h0, d_c0), _ = backward(np.ones_like(out))
    for a in (out, h_n, c_n, d_x, d_h0, d_c0):
        assert not np.shares_memory(a, x)
    assert out.flags.c_contiguous and d_x.flags.c_contiguous and d_x.shape == x.shape


def test_porting_overrides_keep_the_sources_results():
    source = nblstm.LSTM(3, 4, num_layers=2, bidirectional=True, seed=0)
    state_dict = source.to_torch(state_dict=True)
    x = np.random.default_rng(0).standard_normal((5, 2, 3)).astype(np.float32)
    expected = source(x)[0]
    np.testing.assert_allclose(nblstm.LSTM.from_torch(state_dict, forget_bias=1.0)(x)[0], expected, rtol=1e-6,
                               atol=1e-6)
    batch_major = nblstm.LSTM.from_torch(state_dict, batch_first=True, dtype=np.float64)
    np.testing.assert_allclose(batch_major(np.swapaxes(x, 0, 1).astype(np.float64))[0], np.swapaxes(expected, 0, 1),
                               rtol=1e-6, atol=1e-6)
    for bad in ({"activation": "relu"}, {"bidirectional": False}, {"cell_clip": 1.0}):
        with pytest.raises(TypeError, match=list(bad)[0]):
            nblstm.LSTM.from_torch(state_dict, **bad)


def test_multi_rnn_cell_refuses_the_variables_of_two_stacks():
    stack = nblstm.MultiRNNCell([nblstm.LSTMCell(2, seed=0), nblstm.LSTMCell(2, seed=1)])
    weights = {f"bidirectional_rnn/{d}/multi_rnn_cell/cell_{k}/lstm_cell/{n}:0": np.zeros(s, np.float32)
               for d in ("fw", "bw") for k in range(2) for n, s in (("kernel", (4, 8)), ("bias", (8,)))}
    with pytest.raises(ValueError, match="several MultiRNNCells"):
        stack.set_weights(weights)


def test_dynamic_rnn_layout_hint_names_the_right_flag():
    stack = nblstm.MultiRNNCell([nblstm.LSTMCell(2, seed=0)])
    x_time_major = np.ones((5, 3, 4), np.float32)  # [T, B, I] given with the default time_major=False
    with pytest.raises(ValueError, match="pass time_major=True"):
        nblstm.dynamic_rnn(stack, x_time_major, sequence_length=[5, 5, 5])


def test_dropout_in_float32_keeps_the_dtype():
    lstm = nblstm.LSTM(2, 3, num_layers=2, dropout=0.5, seed=0)
    out, (h_n, _) = lstm(np.ones((4, 2, 2), np.float32), training=True)
    assert out.dtype == np.float32 and h_n.dtype == np.float32


# ----------------------------------------------------------------------------------------------------
# Messages: the other layout, and the cells of a stack
# ----------------------------------------------------------------------------------------------------


def test_layer_fed_the_other_layout_names_batch_first():
    """hx, lengths or a mask that fit the input's other layout: the message says batch_first, not just "(1, 5, 6)"."""
    lstm = LSTM(6, 6, batch_first=True)
    x = np.zeros((5, 3, 6), np.float32)  # [T, B, I] = (5, 3, 6), read as [B, T, I]
    hx = (np.zeros((1, 3, 6), np.float32), np.zeros((1, 3, 6), np.float32))
    read = r"input \(5, 3, 6\) read as \[B, T, I\] \(batch_first=True: B = 5, T = 3\)\. If input is \[T, B, I\], " \
           r"use a layer with batch_first=False, or pass input.swapaxes\(0, 1\)"
    seen = "that is the time axis of " + read
    for call in (lstm, lstm.vjp):
        with pytest.raises(ValueError, match=rf"^hx\[0\] \(h\) has shape \(1, 3, 6\), a batch of 3: {seen}; "
                                             r"otherwise hx\[0\] \(h\) must have a batch of 5$"):
            call(x, hx)
        with pytest.raises(ValueError, match=rf"^hx\[1\] \(c\) has shape \(1, 3, 6\), a batch of 3: {seen}"):
            call(x, (None, hx[1]))
        for lengths in ([5, 2, 4], np.array([5, 2, 4])):
            with pytest.raises(ValueError, match=rf"^sequence_length has shape \(3,\), a batch of 3: {seen}; "
                                                 "otherwise sequence_length must have a batch of 5$"):
                call(x, sequence_length=lengths)
        with pytest.raises(ValueError, match=r"^mask has shape \(3, 5\); expected \[B, T\] = \(5, 3\) \(Keras's "
                                             rf"layout: batch first, whatever the layout of input\), with {read}$"):
            call(x, mask=np.ones((3, 5), bool))
    # The other way round, and the state's shape check where no layout fits.
    time_major = LSTM(6, 6)
    with pytest.raises(ValueError, match=r"read as \[T, B, I\] \(batch_first=False: B = 5, T = 3\)\. If input is "
                                         r"\[B, T, I\], use a layer with batch_first=True"):
        time_major(np.zeros((3, 5, 6), np.float32), sequence_length=[3, 1, 2])
    with pytest.raises(ValueError, match=r"^hx\[0\] \(h\) has shape \(1, 4, 6\); expected \(1, 5, 6\)"):
        lstm(x, (np.zeros((1, 4, 6), np.float32), None))
    square = np.zeros((3, 3, 6), np.float32)  # T == B: no evidence either way
    with pytest.raises(ValueError, match=r"^sequence_length has shape \(2,\); expected \(3,\)"):
        lstm(square, sequence_length=[1, 2])


def test_cell_and_dynamic_rnn_fed_the_other_layout_name_time_major():
    cell = LSTMCell(4, dtype=np.float32, seed=0)
    x = np.zeros((5, 3, 6), np.float32)
    with pytest.raises(ValueError, match=r"^mask has shape \(3, 5\); expected \[B, T\] = \(5, 3\) .*, with inputs "
                                         r"\(5, 3, 6\) read as \[B, T, I\] \(time_major=False: B = 5, T = 3\)\. If "
                                         r"inputs is \[T, B, I\], pass time_major=True$"):
        cell.run(x, mask=np.ones((3, 5), bool), time_major=False)
    with pytest.raises(ValueError, match=r"^initial_state has shape \(5, 4\), a batch of 5: that is the time axis "
                                         r"of inputs \(5, 3, 6\) read as \[T, B, I\] \(time_major=True: B = 3, T = 5\)"
                                         r"\. If inputs is \[B, T, I\], pass time_major=False"):
        cell.run(x, cell.zero_state(5, np.float32))
    stack = MultiRNNCell([LSTMCell(4, seed=0), LSTMCell(2, seed=1)])
    with pytest.raises(ValueError, match=r"^initial_state has shape \(3, 4\), a batch of 3: .*\(time_major=False: "
                                         r"B = 5, T = 3\)\. If inputs is \[T, B, I\], pass time_major=True"):
        nblstm.dynamic_rnn(stack, x, initial_state=stack.zero_state(3, np.float32))
    # A 0-d sequence_length reaches its own check (it has no length to compare).
    with pytest.raises(ValueError, match=r"sequence_length has shape \(\); expected \(3,\)"):
        cell.run(x, None, np.array(3))
    assert not cell.built  # nothing ran


def test_multi_rnn_cell_names_the_cell_that_does_not_fit():
    x = np.zeros((2, 5, 6), np.float32)  # [B, T, I]
    first = LSTMCell(4, seed=0)
    wrong = LSTMCell(3, num_proj=2, seed=1)
    wrong.build(5)  # reads 5 columns; the first cell outputs 4
    stack = MultiRNNCell([first, wrong])
    expected = (r"cell.cells\[1\] \(LSTMCell\(3, num_proj=2\)\) was built for input depth 5, but cell.cells\[0\] "
                r"\(LSTMCell\(4\)\) outputs 4 columns \(its output_size\): each cell of a MultiRNNCell reads the "
                "outputs of the cell before it")
    with pytest.raises(ValueError, match="^" + expected + "$"):
        nblstm.dynamic_rnn(stack, x)
    with pytest.raises(ValueError, match="^" + expected.replace("cell.cells", "cell_bw.cells")):
        nblstm.bidirectional_dynamic_rnn(LSTMCell(2), stack, x)
    assert not first.built  # validated before any kernel ran: the first cell would have been built
    with pytest.raises(ValueError, match=r"^cells\[1\] \(LSTMCell\(3, num_proj=2\)\) was built for input depth 5, "
                                         r"but cells\[0\] \(LSTMCell\(4\)\) outputs 4 columns"):
        stack(x[:, 0], stack.zero_state(2, np.float32))
    with pytest.raises(ValueError, match=r"^cell.cells\[0\] \(LSTMCell\(3, num_proj=2\)\) was built for input depth "
                                         r"5, but inputs has depth 6 \(shape \(2, 5, 6\)\)$"):
        nblstm.dynamic_rnn(MultiRNNCell([wrong]), x)
    # Another dtype: named against what the previous cell produces.
    float64 = LSTMCell(3, dtype=np.float64, seed=2)
    with pytest.raises(TypeError, match=r"^cell.cells\[1\] \(LSTMCell\(3\)\) has dtype float64, but cell.cells\[0\] "
                                        r"\(LSTMCell\(4\)\) produces float32: every cell of a MultiRNNCell computes "
                                        "in the dtype of inputs$"):
        nblstm.dynamic_rnn(MultiRNNCell([first, float64]), x)
    with pytest.raises(TypeError, match=r"^cell.cells\[0\] \(LSTMCell\(3\)\) has dtype float64, but inputs has dtype "
                                        "float32$"):
        nblstm.dynamic_rnn(MultiRNNCell([float64, first]), x)
    # A state of the wrong shape names its cell; a cell used twice must get the same depth both times.
    states = MultiRNNCell([first, LSTMCell(3)]).zero_state(2, np.float32)
    bad = (states[0], LSTMStateTuple(states[1].c, np.zeros((2, 4), np.float32)))
    with pytest.raises(ValueError, match=r"^initial_state\[1\].h has shape \(2, 4\); expected \(2, 3\)"):
        nblstm.dynamic_rnn(MultiRNNCell([first, LSTMCell(3)]), x, initial_state=bad)
    with pytest.raises(ValueError, match=r"cell.cells\[1\] \(LSTMCell\(4\)\) was built for input depth 6, but "
                                         r"cell.cells\[0\] \(LSTMCell\(4\)\) outputs 4 columns"):
        nblstm.dynamic_rnn(MultiRNNCell([first, first]), x)
    assert not first.built


def test_nested_multi_rnn_cells_run_as_their_cells_in_order():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 6))
    cells = [LSTMCell(4, dtype=np.float64, seed=k) for k in range(3)]
    flat = MultiRNNCell(cells)
    nested = MultiRNNCell([MultiRNNCell(cells[:2]), cells[2]])
    out_flat, state_flat = nblstm.dynamic_rnn(flat, x, sequence_length=[5, 2])
    initial = nested.zero_state(2, np.float64)
    out_nested, state_nested = nblstm.dynamic_rnn(nested, x, sequence_length=[5, 2], initial_state=initial)
    np.testing.assert_array_equal(out_nested, out_flat)
    assert len(state_nested) == 2 and len(state_nested[0]) == 2
    for a, b in zip((*state_nested[0], state_nested[1]), state_flat, strict=True):
        np.testing.assert_array_equal(a.h, b.h)
    output, step_state = nested(x[:, 0], initial)
    np.testing.assert_allclose(output, flat(x[:, 0], flat.zero_state(2, np.float64))[0], rtol=0, atol=0)
    assert isinstance(step_state[0], tuple) and len(step_state[0]) == 2
    with pytest.raises(TypeError, match=r"initial_state\[0\] must be a tuple of 2 cell states"):
        nblstm.dynamic_rnn(nested, x, initial_state=(initial[0][:1], initial[1]))


@pytest.mark.parametrize("config, sorts", [
    (dict(), True), (dict(num_layers=2, bidirectional=True), True), (dict(batch_first=True), True),
    (dict(dtype=np.float64, bidirectional=True), True), (dict(dtype=np.float16), True),
    (dict(num_layers=2, dropout=0.5), True),  # dropout applies only when training
    (dict(go_backwards=True), True), (dict(reverse=True, num_layers=2), True),
    # Longer inputs projected inside the steps (nblstm.cpu.partition.fused_projection): small weights from 8
    # examples, inputs up to 4 KiB a row from 32.
    (dict(input_size=300), True), (dict(input_size=300, batch=40), True),
    (dict(input_size=300, batch=40, num_layers=2, bidirectional=True), True),
    # Nothing skipped there, or an input projection on BLAS before the time loop: the caller's order.
    (dict(input_size=300, batch=5), False), (dict(input_size=300, hidden=600), False),
    (dict(input_size=1100, hidden=256, batch=40), False),
    (dict(proj_size=3), False), (dict(num_layers=2, dropout=0.5, training=True), False),
], ids=str)
def test_inference_with_lengths_runs_longest_first_with_the_same_bits(config, sorts, monkeypatch):
    """An inference call sorts the examples by length (nblstm.schedule.by_length) where the kernels then skip the
    finished ones with every product on the micro-kernel, and puts everything back: the outputs and final states of
    a training call's forward, bit for bit, which keeps the caller's order; the caller's arrays untouched."""
    from nblstm import schedule as sched
    from nblstm.layer import lstm as layer_module

    orders = []
    monkeypatch.setattr(layer_module, "by_length", lambda lengths: orders.append(sched.by_length(lengths))
                        or orders[-1])
    config = {"input_size": 5, **config}
    training = config.pop("training", False)
    steps, batch = 7, config.pop("batch", 9)
    units = config.pop("hidden", 6)
    layer = nblstm.LSTM(config.pop("input_size"), units, seed=3, **config)
    rng = np.random.default_rng(5)
    lengths = np.resize([3, 7, 0, 5, 7, 1, 2, 6, 4], batch)
    x = rng.standard_normal((batch, steps, layer.input_size) if layer.batch_first
                            else (steps, batch, layer.input_size)).astype(layer.dtype)
    rows = layer.num_layers * (2 if layer.bidirectional else 1)
    depth = layer.proj_size or units
    hx = tuple(rng.standard_normal((rows, batch, n)).astype(layer.dtype) for n in (depth, units))
    given = [a.copy() for a in (x, *hx, lengths)]
    out, (h_n, c_n) = layer(x, hx, sequence_length=lengths, training=training)
    assert (bool(orders) and orders[-1] is not None) == sorts
    for a, b in zip((x, *hx, lengths), given, strict=True):
        np.testing.assert_array_equal(a, b)
    if training:
        return  # its dropout masks are drawn afresh: nothing to compare
    count = len(orders)
    (t_out, (t_h, t_c)), _ = layer.vjp(x, hx, sequence_length=lengths)
    assert len(orders) == count, "a training call keeps the order"
    for a, b in ((out, t_out), (h_n, t_h), (c_n, t_c)):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))
    assert sched.by_length(np.sort(lengths)[::-1]) is None and sched.by_length(np.array([4])) is None


@pytest.mark.parametrize("input_size", [5, 300], ids=["projection in the steps", "projection on BLAS"])
@pytest.mark.parametrize("lengths", [[7, 7, 5, 3, 3, 1, 0, 0, 0], [7, 6, 5, 4, 3, 2, 2, 1, 1], [2] * 9, [0] * 9],
                         ids=str)
def test_inference_zeroes_finished_examples_instead_of_carrying_them(input_size, lengths, monkeypatch):
    """With the examples longest first, an inference call's kernels zero a finished example's outputs and carry
    nothing of it (cpu.fused._zeroes_finished), and its final state comes from its own last step: the results of a
    training call, which carries the state, bit for bit."""
    from nblstm.cpu import fused, partition

    if input_size > 5:  # 9 rows and small weights would project inside the steps (fused_projection): keep BLAS
        monkeypatch.setattr(partition, "_FUSED_MAX_WEIGHT_BYTES", 0)
    assert partition.fused_projection(9, input_size, 6, np.float32) == (input_size == 5)

    lengths = np.array(lengths)
    steps, batch = 7, 9
    assert fused.outputs_zeroed(lengths, steps) == (lengths.min() < steps)
    assert not fused.outputs_zeroed(lengths[::-1], steps) or lengths.min() == lengths.max()
    assert not fused.outputs_zeroed(np.zeros(batch, np.int64), 1), "one step: the usual slots"
    layer = nblstm.LSTM(input_size, 6, seed=3)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((steps, batch, input_size)).astype(np.float32)
    hx = tuple(rng.standard_normal((1, batch, 6)).astype(np.float32) for _ in range(2))
    out, (h_n, c_n) = layer(x, hx, sequence_length=lengths)
    (t_out, (t_h, t_c)), _ = layer.vjp(x, hx, sequence_length=lengths)
    for a, b in ((out, t_out), (h_n, t_h), (c_n, t_c)):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    assert (out[np.arange(steps)[:, None] >= lengths[None, :]] == 0).all()


def test_finished_rows_are_skipped_only_after_the_last_running_one():
    from nblstm.cpu import fused

    running = fused._running.py_func  # compiled for the kernels alone (no Python wrapper)
    lengths = np.array([5, 2, 4, 0], np.int64)
    assert [running(t, lengths, 4) for t in range(6)] == [3, 3, 3, 3, 1, 0]
    assert running(3, np.empty(0, np.int64), 4) == 4  # without lengths: every row


def test_set_cell_weights_copies_unless_told_not_to():
    """``copy=True`` (the default) keeps copies, so that the caller's later changes reach nothing; ``copy=False``
    takes the arrays as they are (``nblstm.torch.LSTM``'s, made for the layer at every step), with the same
    results."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    cells = [{"kernel": (0.3 * rng.standard_normal((3 + 4, 16))).astype(np.float32),
              "bias": (0.1 * rng.standard_normal(16)).astype(np.float32)}]
    copied, kept = nblstm.LSTM(3, 4), nblstm.LSTM(3, 4)
    copied.set_cell_weights(cells)
    kept.set_cell_weights([dict(c) for c in cells], copy=False)
    assert not np.shares_memory(copied.cells[0]._weights["kernel"], cells[0]["kernel"])
    assert kept.cells[0]._weights["kernel"] is cells[0]["kernel"]
    view = {"kernel": np.vstack([cells[0]["kernel"]] * 2)[:7], "bias": cells[0]["bias"]}  # not its own memory
    viewed = nblstm.LSTM(3, 4)
    viewed.set_cell_weights([view], copy=False)
    assert not np.shares_memory(viewed.cells[0]._weights["kernel"], view["kernel"])
    expected = copied(x)[0]
    np.testing.assert_array_equal(kept(x)[0], expected)
    cells[0]["kernel"][:] = 0.0  # the caller's array, changed after the call
    np.testing.assert_array_equal(copied(x)[0], expected)
    with pytest.raises(ValueError, match="non-finite"):
        kept.set_cell_weights([{"kernel": np.full((7, 16), np.nan, np.float32), "bias": cells[0]["bias"]}],
                              copy=False)
    bias = cells[0]["bias"]
    with pytest.raises(ValueError, match="6 rows; expected 7"):  # every check made as with copies
        kept.set_cell_weights([{"kernel": np.zeros((6, 16), np.float32), "bias": bias}], copy=False)
    with pytest.raises(TypeError, match="dtype"):
        kept.set_cell_weights([{"kernel": np.zeros((7, 16), np.float64), "bias": bias}], copy=False)
    with pytest.raises(TypeError, match="NumPy array"):  # not an array of any kind
        kept.set_cell_weights([{"kernel": object(), "bias": bias}], copy=False)
    with pytest.raises(TypeError, match="copy must be a bool"):
        kept.set_cell_weights(cells, copy="no")
    np.testing.assert_array_equal(kept(x)[0], expected)  # a refused call replaced nothing
