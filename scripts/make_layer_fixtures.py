"""Generate the layer fixtures of ``tests/fixtures/`` from PyTorch, TensorFlow 1, Keras 3 and onnxruntime.

Each part needs its own framework; the tests that read the fixtures need
none of them::

    python scripts/make_layer_fixtures.py --only torch,onnx,onnx_constants   # with torch, onnx and onnxruntime
    python scripts/make_layer_fixtures.py --only tf1,keras,keras_options  # tensorflow-cpu 2.21, keras 3, tf_keras

Six files are written (``tests/fixtures/README.md`` documents every key):

``torch_layers.npz``
    ``torch.nn.LSTM`` stacked, bidirectional, batch-first and projected, with
    packed sequences of unsorted lengths, and autograd gradients; one
    ``torch.nn.GRU`` state dict.
``tf_rnn.npz``
    TF1 ``LSTMCell`` and ``MultiRNNCell`` run by ``tf.compat.v1.nn.dynamic_rnn``
    and ``bidirectional_dynamic_rnn`` (eagerly), with ``tf.GradientTape``
    gradients and the variables under the names TensorFlow gives them.
``keras_layers.npz``
    Keras 3 ``LSTM`` and ``Bidirectional(LSTM)`` layers and a stacked model,
    serialized, with masks of every kind and ``tf.GradientTape`` gradients.
``keras_options.npz``
    Keras 3 layers with ``zero_output_for_mask`` and ``go_backwards`` (masked,
    ``return_sequences`` both ways), and Keras 2's ``CuDNNLSTM`` (tf_keras),
    run as the ``LSTM`` that tf_keras's own converter makes of its weights.
``onnx_lstm.npz``
    ONNX ``LSTM`` nodes run by onnxruntime: forward, reverse, bidirectional,
    batch-major, stacked, the attributes nblstm refuses, and a PyTorch export.
``onnx_constant_inputs.npz``
    Two of those models with their ``sequence_lens`` (and initial states)
    made initializers, run by onnxruntime: the reader refuses such constants.

Every random number comes from fixed seeds, so a rerun reproduces the
inputs exactly; outputs may differ in the last bit between framework builds.
"""

import argparse
import json
import os
import pathlib
import sys
import warnings

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures"
GENERATOR = "scripts/make_layer_fixtures.py"
WEIGHT_SCALE = 0.5  # weights ~ N(0, 0.5**2); inputs, states and cotangents ~ N(0, 1)


def _save(path, arrays, index):
    """Write ``arrays`` and the JSON ``index`` (key ``"index"``) to a compressed ``.npz``."""
    arrays = dict(arrays)
    arrays["index"] = np.array(json.dumps(index, indent=1, sort_keys=True))
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB, {len(arrays)} arrays)")


def _versions():
    import numpy

    versions = {"numpy": numpy.__version__, "python": sys.version.split()[0]}
    for name in ("tensorflow", "keras", "torch", "onnx", "onnxruntime"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = module.__version__
    return versions


def _seeds(seed, offset, n):
    """``n`` independent generators for one file (``offset`` tells the files apart)."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed + offset).spawn(n)]


def _weight(rng, shape, dtype):
    return (rng.standard_normal(tuple(shape)) * WEIGHT_SCALE).astype(dtype)


def _normal(rng, shape, dtype):
    return rng.standard_normal(tuple(shape)).astype(dtype)


# --------------------------------------------------------------------------
# torch.nn.LSTM: stacked, bidirectional, projected, packed sequences
# --------------------------------------------------------------------------

TORCH_CASES = (
    dict(name="uni", input_size=3, hidden_size=4, num_layers=1, bidirectional=False, proj_size=0,
         batch_first=False, bias=True, dtype="float32", steps=5, batch=3, lengths=None),
    dict(name="bi_proj", input_size=3, hidden_size=5, num_layers=2, bidirectional=True, proj_size=3,
         batch_first=True, bias=True, dtype="float32", steps=6, batch=4, lengths=[4, 6, 1, 3]),
    dict(name="bi3", input_size=2, hidden_size=3, num_layers=3, bidirectional=True, proj_size=0,
         batch_first=False, bias=True, dtype="float32", steps=5, batch=3, lengths=[2, 5, 3]),
    dict(name="bi_proj64", input_size=3, hidden_size=5, num_layers=2, bidirectional=True, proj_size=3,
         batch_first=True, bias=True, dtype="float64", steps=6, batch=4, lengths=[4, 6, 1, 3]),
    dict(name="nobias", input_size=3, hidden_size=4, num_layers=2, bidirectional=False, proj_size=0,
         batch_first=False, bias=False, dtype="float32", steps=4, batch=2, lengths=None),
)
TORCH_CONFIG_KEYS = ("input_size", "hidden_size", "num_layers", "bidirectional", "proj_size", "batch_first", "bias")


def _torch_case(torch, cfg, rng):
    """Run one ``nn.LSTM`` case with autograd; returns ``(arrays, meta)``."""
    dtype = np.dtype(cfg["dtype"])
    T, B = cfg["steps"], cfg["batch"]
    L, D = cfg["num_layers"], 2 if cfg["bidirectional"] else 1
    H, P = cfg["hidden_size"], cfg["proj_size"] or cfg["hidden_size"]
    lstm = torch.nn.LSTM(**{k: cfg[k] for k in TORCH_CONFIG_KEYS}).to(getattr(torch, cfg["dtype"]))
    state = {}
    with torch.no_grad():
        for name, param in lstm.named_parameters():
            state[name] = _weight(rng, param.shape, dtype)
            param.copy_(torch.from_numpy(state[name]))
    x_shape = (B, T, cfg["input_size"]) if cfg["batch_first"] else (T, B, cfg["input_size"])
    x = _normal(rng, x_shape, dtype)
    lengths = None if cfg["lengths"] is None else np.asarray(cfg["lengths"], dtype=np.int64)
    if lengths is not None:  # padding zero, as a padded batch holds it
        for b, n in enumerate(lengths):
            (x[b, n:] if cfg["batch_first"] else x[n:, b])[...] = 0
    h0 = _normal(rng, (L * D, B, P), dtype)
    c0 = _normal(rng, (L * D, B, H), dtype)
    out_shape = (B, T, D * P) if cfg["batch_first"] else (T, B, D * P)
    R = _normal(rng, out_shape, dtype)
    Rh = _normal(rng, h0.shape, dtype)
    Rc = _normal(rng, c0.shape, dtype)
    xt, h0t, c0t = (torch.from_numpy(a.copy()).requires_grad_(True) for a in (x, h0, c0))
    if lengths is None:
        out, (hn, cn) = lstm(xt, (h0t, c0t))
    else:
        packed = torch.nn.utils.rnn.pack_padded_sequence(xt, torch.from_numpy(lengths), batch_first=cfg["batch_first"],
                                                         enforce_sorted=False)
        out, (hn, cn) = lstm(packed, (h0t, c0t))
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(out, batch_first=cfg["batch_first"], total_length=T)
    loss = (out * torch.from_numpy(R)).sum() + (hn * torch.from_numpy(Rh)).sum() + (cn * torch.from_numpy(Rc)).sum()
    loss.backward()
    arrays = {"x": x, "h0": h0, "c0": c0, "R": R, "Rh": Rh, "Rc": Rc, "output": out.detach().numpy(),
              "h_n": hn.detach().numpy(), "c_n": cn.detach().numpy(), "loss": np.asarray(loss.detach().numpy()),
              "grad/x": xt.grad.numpy(), "grad/h0": h0t.grad.numpy(), "grad/c0": c0t.grad.numpy()}
    if lengths is not None:
        arrays["lengths"] = lengths
    for name, param in lstm.named_parameters():
        arrays["sd/" + name] = state[name]
        arrays["grad/sd/" + name] = param.grad.numpy()
    meta = {k: cfg[k] for k in ("name", *TORCH_CONFIG_KEYS, "dtype", "steps", "batch", "lengths")}
    meta["state_dict"] = list(state)  # named_parameters order
    meta["arrays"] = sorted(arrays)
    if lengths is not None:
        pad = np.ones(out_shape[:2], dtype=bool)
        for b, n in enumerate(lengths):
            (pad[b, :n] if cfg["batch_first"] else pad[:n, b])[...] = False
        meta["padding_output_is_zero"] = bool(np.all(arrays["output"][pad] == 0))
    return arrays, meta


def make_torch(out_dir, seed):
    """Write ``torch_layers.npz``."""
    import torch

    torch.set_num_threads(1)
    rngs = _seeds(seed, 10, len(TORCH_CASES) + 1)
    arrays, cases = {}, []
    for cfg, rng in zip(TORCH_CASES, rngs, strict=False):
        case_arrays, meta = _torch_case(torch, cfg, rng)
        cases.append(meta)
        arrays.update({f"{cfg['name']}/{k}": v for k, v in case_arrays.items()})
        print(f"  torch {cfg['name']}: padding outputs zero: {meta.get('padding_output_is_zero')}")
    gru_cfg = dict(input_size=3, hidden_size=4, num_layers=2, bidirectional=True, batch_first=False, bias=True)
    gru = torch.nn.GRU(**gru_cfg)
    with torch.no_grad():
        for name, param in gru.named_parameters():
            arrays["gru/sd/" + name] = _weight(rngs[-1], param.shape, np.float32)
            param.copy_(torch.from_numpy(arrays["gru/sd/" + name]))
    gru_meta = dict(gru_cfg, name="gru", state_dict=[n for n, _ in gru.named_parameters()],
                    **{"class": "torch.nn.GRU"})
    index = {"cases": cases, "gru": gru_meta, "versions": _versions(), "seed": seed, "generator": GENERATOR,
             "class": "torch.nn.LSTM", "lengths": "packed with pack_padded_sequence(enforce_sorted=False), "
             "unpacked with pad_packed_sequence(total_length=T)"}
    _save(out_dir / "torch_layers.npz", arrays, index)


# --------------------------------------------------------------------------
# TF1: dynamic_rnn, bidirectional_dynamic_rnn, LSTMCell, MultiRNNCell
# --------------------------------------------------------------------------

TF1_CASES = (
    dict(name="proj", fn="dynamic_rnn", time_major=False, steps=5, batch=4, input_size=3, dtype="float32",
         sequence_length=[5, 0, 3, 2], initial_state=True,
         cells=[dict(num_units=4, use_peepholes=True, num_proj=3, cell_clip=1.5)]),
    dict(name="proj64", fn="dynamic_rnn", time_major=False, steps=5, batch=4, input_size=3, dtype="float64",
         sequence_length=[5, 0, 3, 2], initial_state=True,
         cells=[dict(num_units=4, use_peepholes=True, num_proj=3, cell_clip=1.5)]),
    dict(name="multi3", fn="dynamic_rnn", time_major=True, steps=5, batch=3, input_size=2, dtype="float32",
         sequence_length=[4, 0, 5], initial_state=False,
         multi=True, cells=[dict(num_units=4), dict(num_units=3, num_proj=2), dict(num_units=5, forget_bias=0.5)]),
    dict(name="bi", fn="bidirectional_dynamic_rnn", time_major=False, steps=5, batch=4, input_size=3,
         dtype="float32", sequence_length=[5, 0, 2, 4], initial_state=True,
         cells_fw=[dict(num_units=4, use_peepholes=True)], cells_bw=[dict(num_units=3, num_proj=2)]),
    dict(name="bi_multi", fn="bidirectional_dynamic_rnn", time_major=True, steps=5, batch=3, input_size=3,
         dtype="float32", sequence_length=[5, 3, 1], initial_state=False, multi=True,
         cells_fw=[dict(num_units=3), dict(num_units=4, use_peepholes=True)],
         cells_bw=[dict(num_units=3, num_proj=2), dict(num_units=2, activation="relu")]),
)


def _tf1_resolved(cell):
    """The constructor values a TF1 LSTMCell ended up with (defaults included)."""
    act = cell._activation
    return {"num_units": cell._num_units, "use_peepholes": cell._use_peepholes, "cell_clip": cell._cell_clip,
            "num_proj": cell._num_proj, "proj_clip": cell._proj_clip, "forget_bias": cell._forget_bias,
            "state_is_tuple": cell._state_is_tuple,
            "activation": getattr(act, "__name__", str(act)), "initializer": None if cell._initializer is None
            else str(cell._initializer), "num_unit_shards": cell._num_unit_shards,
            "num_proj_shards": cell._num_proj_shards}


def _tf1_case(tf, rnn_cell_impl, cfg, rng):
    """Run one dynamic_rnn / bidirectional_dynamic_rnn case; returns ``(arrays, meta)``."""
    dtype = np.dtype(cfg["dtype"])
    tf_dtype = tf.as_dtype(dtype)
    T, B, I = cfg["steps"], cfg["batch"], cfg["input_size"]
    bidi = cfg["fn"] == "bidirectional_dynamic_rnn"
    directions = ("fw", "bw") if bidi else ("",)
    specs = {d: cfg["cells_" + d] for d in directions} if bidi else {"": cfg["cells"]}
    multi = cfg.get("multi", False)
    cells, tops = {}, {}
    for d in directions:
        cells[d] = [rnn_cell_impl.LSTMCell(dtype=tf_dtype, **kw) for kw in specs[d]]
        tops[d] = rnn_cell_impl.MultiRNNCell(cells[d]) if multi else cells[d][0]
    x = _normal(rng, (T, B, I) if cfg["time_major"] else (B, T, I), dtype)
    seq = None if cfg["sequence_length"] is None else np.asarray(cfg["sequence_length"], dtype=np.int32)

    def state_paths(d):
        pre = (d + "/") if d else ""
        return [pre + (f"{k}/" if multi else "") for k in range(len(cells[d]))]

    init = {}
    if cfg["initial_state"]:
        for d in directions:
            for path, kw in zip(state_paths(d), specs[d], strict=True):
                init[path + "c"] = _normal(rng, (B, kw["num_units"]), dtype)
                init[path + "h"] = _normal(rng, (B, kw.get("num_proj") or kw["num_units"]), dtype)
    xv = tf.Variable(x)
    initv = {k: tf.Variable(v) for k, v in init.items()}

    def initial_state(d):
        if not cfg["initial_state"]:
            return None
        tuples = [rnn_cell_impl.LSTMStateTuple(initv[p + "c"], initv[p + "h"]) for p in state_paths(d)]
        return tuple(tuples) if multi else tuples[0]

    def run():
        kwargs = dict(sequence_length=seq, time_major=cfg["time_major"], dtype=tf_dtype)
        if bidi:
            (out_fw, out_bw), (st_fw, st_bw) = tf.compat.v1.nn.bidirectional_dynamic_rnn(
                tops["fw"], tops["bw"], xv, initial_state_fw=initial_state("fw"),
                initial_state_bw=initial_state("bw"), **kwargs)
            return {"out_fw": out_fw, "out_bw": out_bw}, {"fw": st_fw, "bw": st_bw}
        out, st = tf.compat.v1.nn.dynamic_rnn(tops[""], xv, initial_state=initial_state(""), **kwargs)
        return {"out": out}, {"": st}

    run()  # builds the variables
    variables = [v for d in directions for v in tops[d].variables]
    values = [_weight(rng, v.shape, dtype) for v in variables]
    for v, a in zip(variables, values, strict=True):
        v.assign(a)
    outs, states = run()
    final = {}
    for d in directions:
        st = states[d] if multi else (states[d],)
        for path, s in zip(state_paths(d), st, strict=True):
            final[path + "c"], final[path + "h"] = s.c, s.h
    R = {k: _normal(rng, o.shape, dtype) for k, o in outs.items()}
    Rfinal = {k: _normal(rng, s.shape, dtype) for k, s in final.items()}
    with tf.GradientTape() as tape:
        outs, states = run()
        final = {}
        for d in directions:
            st = states[d] if multi else (states[d],)
            for path, s in zip(state_paths(d), st, strict=True):
                final[path + "c"], final[path + "h"] = s.c, s.h
        loss = sum(tf.reduce_sum(outs[k] * R[k]) for k in outs) + sum(tf.reduce_sum(final[k] * Rfinal[k])
                                                                        for k in final)
    assert len([v for d in directions for v in tops[d].variables]) == len(variables)
    targets = [xv] + [initv[k] for k in init] + variables
    grads = tape.gradient(loss, targets)
    grads = [np.zeros(t.shape, dtype) if g is None else tf.convert_to_tensor(g).numpy() for t, g in
             zip(targets, grads, strict=True)]
    arrays = {"x": x, "loss": np.asarray(loss.numpy()), "grad/x": grads[0]}
    if seq is not None:
        arrays["sequence_length"] = seq
    for k, o in outs.items():
        arrays[k] = o.numpy()
        arrays["R/" + k] = R[k]
    for k, s in final.items():
        arrays["final/" + k] = s.numpy()
        arrays["R/final/" + k] = Rfinal[k]
    for n, k in enumerate(init):
        arrays["init/" + k] = init[k]
        arrays["grad/init/" + k] = grads[1 + n]
    names = [v.name for v in variables]
    for n, (a, g) in enumerate(zip(values, grads[1 + len(init):], strict=True)):
        arrays[f"var/{n}"] = a
        arrays[f"grad/var/{n}"] = g
    cell_meta = []
    for d in directions:
        for k, (cell, kw) in enumerate(zip(cells[d], specs[d], strict=True)):
            wnames = [v.name for v in cell.variables]
            # get_weights() order = cell.variables order; checked against the values
            for w, v in zip(cell.get_weights(), cell.variables, strict=True):
                assert np.array_equal(w, values[names.index(v.name)])
            cell_meta.append({"direction": d or None, "position": k, "constructor": kw,
                              "resolved": _tf1_resolved(cell), "get_weights": wnames,
                              "get_weights_index": [names.index(n) for n in wnames],
                              "state_path": state_paths(d)[k]})
    meta = {"name": cfg["name"], "fn": "tf.compat.v1.nn." + cfg["fn"], "time_major": cfg["time_major"],
            "steps": T, "batch": B, "input_size": I, "dtype": cfg["dtype"], "sequence_length": cfg["sequence_length"],
            "initial_state": cfg["initial_state"], "multi_rnn_cell": multi, "cells": cell_meta,
            "variables": [{"name": v.name, "shape": list(v.shape)} for v in variables],
            "top_get_weights": {d or "cell": [v.name for v in tops[d].variables] for d in directions},
            "outputs": sorted(outs), "final_states": sorted(final), "initial_states": sorted(init),
            "arrays": sorted(arrays)}
    if seq is not None:
        zero = {}
        for k in outs:
            o = arrays[k] if not cfg["time_major"] else np.swapaxes(arrays[k], 0, 1)
            zero[k] = bool(all(np.all(o[b, n:] == 0) for b, n in enumerate(seq)))
        meta["outputs_past_length_zero"] = zero
        meta["zero_length_final_equals_initial"] = bool(all(
            np.array_equal(arrays["final/" + k][seq == 0], (init[k] if init else np.zeros_like(arrays["final/" + k]))
                           [seq == 0]) for k in final))
    clips = [c["resolved"]["cell_clip"] for c in cell_meta]
    if any(clips):
        c_final = arrays["final/c"]
        meta["final_c_at_clip_fraction"] = float(np.mean(np.abs(c_final) >= clips[0] * (1 - 1e-6)))
    return arrays, meta


def make_tf1(out_dir, seed):
    """Write ``tf_rnn.npz``."""
    import tensorflow as tf
    from tensorflow.python.keras.layers.legacy_rnn import rnn_cell_impl

    tf.get_logger().setLevel("ERROR")
    rngs = _seeds(seed, 20, len(TF1_CASES))
    arrays, cases = {}, []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cfg, rng in zip(TF1_CASES, rngs, strict=True):
            case_arrays, meta = _tf1_case(tf, rnn_cell_impl, cfg, rng)
            cases.append(meta)
            arrays.update({f"{cfg['name']}/{k}": v for k, v in case_arrays.items()})
            print(f"  tf1 {cfg['name']}: {[v['name'] for v in meta['variables']]}")
    index = {"cases": cases, "versions": _versions(), "seed": seed, "generator": GENERATOR,
             "class": "tensorflow.python.keras.layers.legacy_rnn.rnn_cell_impl.LSTMCell / MultiRNNCell",
             "mode": "eager; gradients by tf.GradientTape"}
    _save(out_dir / "tf_rnn.npz", arrays, index)


# --------------------------------------------------------------------------
# Keras 3: LSTM, Bidirectional(LSTM), masks, a stacked model
# --------------------------------------------------------------------------

# Masks [B, T] (True = step used).
MASK_ARBITRARY = [[1, 1, 1, 1, 1, 1],   # fully unmasked
                  [0, 0, 1, 1, 1, 1],   # masked at the start
                  [1, 1, 0, 0, 1, 1],   # masked in the middle
                  [0, 1, 0, 1, 1, 0]]   # start, middle and end
MASK_PREPAD = [[0, 0, 1, 1, 1],
               [1, 1, 1, 1, 1],
               [0, 1, 1, 1, 1],
               [0, 0, 0, 0, 1]]
MASK_WITH_EMPTY = [[1, 0, 1, 1, 0],
                   [0, 0, 0, 0, 0],     # fully masked
                   [0, 0, 1, 1, 1]]
MASK_BIDI = [[1, 1, 1, 1, 1],
             [1, 1, 0, 1, 0],
             [0, 0, 1, 1, 1],
             [1, 0, 0, 1, 1]]

KERAS_CASES = (
    dict(name="plain", layer="LSTM", kwargs=dict(units=4), batch=3, steps=5, input_size=3),
    dict(name="mask", layer="LSTM", kwargs=dict(units=4), batch=4, steps=6, input_size=3, mask=MASK_ARBITRARY),
    dict(name="prepad", layer="LSTM", kwargs=dict(units=4), batch=4, steps=5, input_size=3, mask=MASK_PREPAD,
         masking_layer=True, initial_state=True),
    dict(name="prepad64", layer="LSTM", kwargs=dict(units=4, dtype="float64"), batch=4, steps=5, input_size=3,
         mask=MASK_PREPAD, masking_layer=True, initial_state=True),
    dict(name="hard_sigmoid", layer="LSTM",
         kwargs=dict(units=4, recurrent_activation="hard_sigmoid", activation="relu", use_bias=False),
         batch=3, steps=5, input_size=3, input_scale=3.0),
    dict(name="bidirectional", layer="Bidirectional", kwargs=dict(units=3), merge_mode="concat", batch=4, steps=5,
         input_size=3, mask=MASK_BIDI),
    dict(name="bidirectional_state", layer="Bidirectional", kwargs=dict(units=3), merge_mode="concat", batch=4,
         steps=5, input_size=2, initial_state=True),
    dict(name="go_backwards", layer="LSTM", kwargs=dict(units=4, go_backwards=True), batch=3, steps=5,
         input_size=3, mask=MASK_WITH_EMPTY),
    dict(name="unit_forget_bias", layer="LSTM", kwargs=dict(units=4, unit_forget_bias=True), batch=3, steps=4,
         input_size=3, keep_bias=True),
)


def _keras_layer(keras, cfg):
    kwargs = dict(cfg["kwargs"], return_sequences=True, return_state=True)
    if cfg["layer"] == "Bidirectional":
        return keras.layers.Bidirectional(keras.layers.LSTM(**kwargs, name="lstm_" + cfg["name"]),
                                          merge_mode=cfg["merge_mode"], name="bidirectional_" + cfg["name"])
    return keras.layers.LSTM(**kwargs, name="lstm_" + cfg["name"])


def _keras_mask_checks(out, mask, zeros_where_masked, backwards=False):
    """Check the masked-step outputs of one direction ``out`` [B, T, U] against Keras's rule.

    The processing order is ``T-1 .. 0`` when ``backwards``; a masked step's
    output is zero (``zeros_where_masked``) or the output of the previous
    processed step (zero before the first unmasked step).
    """
    B, T = mask.shape
    ok = True
    for b in range(B):
        prev = np.zeros(out.shape[-1], out.dtype)
        for t in (range(T - 1, -1, -1) if backwards else range(T)):
            if mask[b, t]:
                prev = out[b, t]
            else:
                expect = np.zeros_like(prev) if zeros_where_masked else prev
                ok &= bool(np.array_equal(out[b, t], expect))
    return ok


def _keras_case(tf, keras, cfg, rng):
    """Run one Keras layer case with tf.GradientTape; returns ``(arrays, meta)``."""
    dtype = np.dtype(cfg["kwargs"].get("dtype", "float32"))
    B, T, I = cfg["batch"], cfg["steps"], cfg["input_size"]
    U = cfg["kwargs"]["units"]
    layer = _keras_layer(keras, cfg)
    x = _normal(rng, (B, T, I), dtype) * dtype.type(cfg.get("input_scale", 1.0))
    mask = None if cfg.get("mask") is None else np.asarray(cfg["mask"], dtype=bool)
    arrays = {}
    meta = {"name": cfg["name"], "layer": cfg["layer"], "constructor": cfg["kwargs"], "batch": B, "steps": T,
            "input_size": I, "dtype": dtype.name, "input_scale": cfg.get("input_scale", 1.0),
            "merge_mode": cfg.get("merge_mode")}
    if mask is not None and cfg.get("masking_layer"):
        x[~mask] = 0  # what pad_sequences(padding="pre") leaves in the padding
        derived = keras.layers.Masking(mask_value=0.0).compute_mask(tf.constant(x))
        meta["mask_from_masking_layer"] = bool(np.array_equal(np.asarray(derived), mask))
    layer(x)  # builds
    n_dir = 2 if cfg["layer"] == "Bidirectional" else 1
    init = []
    if cfg.get("initial_state"):
        init = [_normal(rng, (B, U), dtype) for _ in range(2 * n_dir)]  # [h, c] (fw then bw)
    weights = layer.get_weights()
    if cfg.get("keep_bias"):
        values = [w if k % 3 == 2 else _weight(rng, w.shape, dtype) for k, w in enumerate(weights)]
    else:
        values = [_weight(rng, w.shape, dtype) for w in weights]
    layer.set_weights(values)
    xv = tf.Variable(x)
    initv = [tf.Variable(a) for a in init]
    call_kwargs = {}
    if mask is not None:
        call_kwargs["mask"] = tf.constant(mask)
    if init:
        call_kwargs["initial_state"] = initv
    returned = layer(xv, **call_kwargs)
    Rs = [_normal(rng, r.shape, dtype) for r in returned]
    with tf.GradientTape() as tape:
        returned = layer(xv, **call_kwargs)
        loss = sum(tf.reduce_sum(r * c) for r, c in zip(returned, Rs, strict=True))
    grads = tape.gradient(loss, [xv, *initv, *layer.trainable_weights])
    assert len(layer.trainable_weights) == len(values)
    for w, tw in zip(layer.get_weights(), layer.trainable_weights, strict=True):
        assert np.array_equal(w, np.asarray(tw))
    returned_names = ["output", "h", "c"] if n_dir == 1 else ["output", "h_fw", "c_fw", "h_bw", "c_bw"]
    arrays["x"] = x
    if mask is not None:
        arrays["mask"] = mask
    for k, a in enumerate(init):
        arrays[f"initial_state/{k}"] = a
        arrays[f"grad/initial_state/{k}"] = grads[1 + k].numpy()
    for k, (name, r) in enumerate(zip(returned_names, returned, strict=True)):
        arrays[name] = np.asarray(r)
        arrays["R/" + name] = Rs[k]
    arrays["loss"] = np.asarray(loss)
    arrays["grad/x"] = grads[0].numpy()
    for k, (w, g) in enumerate(zip(values, grads[1 + len(init):], strict=True)):
        arrays[f"weights/{k}"] = w
        arrays[f"grad/weights/{k}"] = np.asarray(g)
    meta.update({
        "serialized": keras.saving.serialize_keras_object(layer), "returned": returned_names,
        "weights": [w.path for w in layer.weights], "initial_state": ["h", "c"] * n_dir if init else None,
        "arrays": sorted(arrays)})
    if mask is not None:
        out = arrays["output"]
        if n_dir == 1:
            backwards = cfg["kwargs"].get("go_backwards", False)
            # go_backwards returns the outputs in processing order: out[:, k] belongs to step T-1-k.
            natural = out[:, ::-1] if backwards else out
            meta["masked_output_repeats_previous"] = _keras_mask_checks(natural, mask, False, backwards)
            meta["masked_output_is_zero"] = _keras_mask_checks(natural, mask, True, backwards)
        else:
            fw, bw = out[..., :U], out[..., U:]
            meta["masked_output_is_zero"] = {"fw": _keras_mask_checks(fw, mask, True),
                                             "bw": _keras_mask_checks(bw, mask, True, True)}
            meta["masked_output_repeats_previous"] = {"fw": _keras_mask_checks(fw, mask, False),
                                                      "bw": _keras_mask_checks(bw, mask, False, True)}
    return arrays, meta


def _hard_sigmoid_samples(keras):
    xs = np.array([-4.0, -3.0, -2.9, -1.5, 0.0, 1.0, 2.9, 3.0, 3.5])
    arrays = {}
    for dtype in ("float32", "float64"):
        arrays[f"hard_sigmoid_samples/x_{dtype}"] = xs.astype(dtype)
        arrays[f"hard_sigmoid_samples/y_{dtype}"] = np.asarray(keras.activations.hard_sigmoid(xs.astype(dtype)))
    return arrays


def _keras_stack(tf, keras, rng):
    """Input -> Masking -> Bidirectional(LSTM) -> LSTM, functional; returns ``(arrays, meta)``."""
    B, T, I = 4, 5, 3
    mask = np.asarray(MASK_BIDI, dtype=bool)
    x = _normal(rng, (B, T, I), np.float32)
    x[~mask] = 0
    inp = keras.Input(shape=(T, I), name="stack_input")
    masked = keras.layers.Masking(mask_value=0.0, name="stack_masking")(inp)
    bi = keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True, name="stack_lstm_0"),
                                    name="stack_bidirectional")(masked)
    out = keras.layers.LSTM(2, return_sequences=True, name="stack_lstm_1")(bi)
    model = keras.Model(inp, out, name="stack")
    probe = keras.Model(inp, [bi, out])
    values = [_weight(rng, w.shape, np.float32) for w in model.get_weights()]
    model.set_weights(values)
    bi_out, final = (np.asarray(a) for a in probe(x))
    model_out = np.asarray(model(x))
    assert np.array_equal(model_out, final)
    arrays = {"x": x, "mask": mask, "output": model_out, "bidirectional_output": bi_out}
    layers = []
    for layer in model.layers:
        entry = {"serialized": keras.saving.serialize_keras_object(layer), "weights": [], "class_name":
                 type(layer).__name__}
        for k, w in enumerate(layer.get_weights()):
            key = f"layers/{len(layers)}/weights/{k}"
            arrays[key] = w
            entry["weights"].append(key)
        layers.append(entry)
    U = 3
    meta = {"name": "stack", "layers": layers, "model": keras.saving.serialize_keras_object(model),
            "batch": B, "steps": T, "input_size": I, "dtype": "float32", "arrays": sorted(arrays),
            "bidirectional_masked_output_is_zero": {
                "fw": _keras_mask_checks(bi_out[..., :U], mask, True),
                "bw": _keras_mask_checks(bi_out[..., U:], mask, True, True)},
            "last_masked_output_repeats_previous": _keras_mask_checks(model_out, mask, False)}
    return arrays, meta


def make_keras(out_dir, seed):
    """Write ``keras_layers.npz``."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    rngs = _seeds(seed, 30, len(KERAS_CASES) + 2)
    arrays, cases = {}, []
    for cfg, rng in zip(KERAS_CASES, rngs, strict=False):
        case_arrays, meta = _keras_case(tf, keras, cfg, rng)
        cases.append(meta)
        arrays.update({f"{cfg['name']}/{k}": v for k, v in case_arrays.items()})
        print(f"  keras {cfg['name']}: repeats previous {meta.get('masked_output_repeats_previous')}, "
              f"zero {meta.get('masked_output_is_zero')}")
    stack_arrays, stack = _keras_stack(tf, keras, rngs[-2])
    arrays.update({f"stack/{k}": v for k, v in stack_arrays.items()})
    print(f"  keras stack: bidirectional zero {stack['bidirectional_masked_output_is_zero']}, last repeats "
          f"{stack['last_masked_output_repeats_previous']}")
    arrays.update(_hard_sigmoid_samples(keras))
    gru = keras.layers.GRU(3, name="gru")
    gru.build((None, 5, 2))
    gru.set_weights([_weight(rngs[-1], w.shape, np.float32) for w in gru.get_weights()])
    for k, w in enumerate(gru.get_weights()):
        arrays[f"gru/weights/{k}"] = w
    stateful = keras.layers.LSTM(4, stateful=True, name="lstm_stateful")
    index = {"cases": cases, "stack": stack, "versions": _versions(), "seed": seed, "generator": GENERATOR,
             "backend": keras.backend.backend(),
             "gru": {"serialized": keras.saving.serialize_keras_object(gru),
                     "weights": [f"gru/weights/{k}" for k in range(len(gru.get_weights()))]},
             "stateful": {"serialized": keras.saving.serialize_keras_object(stateful)},
             "hard_sigmoid": "keras.activations.hard_sigmoid: relu6(x + 3) / 6"}
    _save(out_dir / "keras_layers.npz", arrays, index)


# --------------------------------------------------------------------------
# Keras options the readers must honour: zero_output_for_mask, go_backwards, Keras 2's CuDNNLSTM
# --------------------------------------------------------------------------


def _keras_options_case(tf, name, layer, x, mask, rng, returns_state=True):
    """Run ``layer`` (built, weights set) on ``x`` with ``mask``; outputs and tf.GradientTape gradients.

    The loss is ``sum(output * R)`` (plus ``sum(h * Rh) + sum(c * Rc)`` with ``returns_state``).
    """
    xv = tf.Variable(x)
    kwargs = {} if mask is None else {"mask": tf.constant(mask)}
    returned = layer(xv, **kwargs)
    returned = list(returned) if isinstance(returned, (list, tuple)) else [returned]
    names = ["output", "h", "c"][:len(returned)]
    Rs = [_normal(rng, r.shape, x.dtype) for r in returned]
    with tf.GradientTape() as tape:
        again = layer(xv, **kwargs)
        again = list(again) if isinstance(again, (list, tuple)) else [again]
        loss = sum(tf.reduce_sum(r * c) for r, c in zip(again, Rs, strict=True))
    grads = tape.gradient(loss, [xv, *layer.trainable_weights])
    arrays = {"x": x, "grad/x": np.asarray(grads[0])}
    if mask is not None:
        arrays["mask"] = mask
    for n, r, R in zip(names, returned, Rs, strict=True):
        arrays[n] = np.asarray(r)
        arrays["R/" + n] = R
    for k, (w, g) in enumerate(zip(layer.get_weights(), grads[1:], strict=True)):
        arrays[f"weights/{k}"] = w
        arrays[f"grad/weights/{k}"] = np.asarray(g)
    return {f"{name}/{k}": v for k, v in arrays.items()}, names


def make_keras_options(out_dir, seed):
    """Write ``keras_options.npz``: Keras 3 layers with zero_output_for_mask and go_backwards, tf_keras's CuDNNLSTM."""
    import keras
    import tensorflow as tf
    import tf_keras
    from tf_keras.src.layers.rnn.cudnn_lstm import CuDNNLSTM
    from tf_keras.src.saving.legacy import hdf5_format

    keras.utils.set_random_seed(seed)
    rngs = _seeds(seed, 70, 8)
    arrays, cases = {}, []
    B, T, I = 4, 6, 3
    mask = np.asarray(MASK_ARBITRARY, dtype=bool)
    prepad = np.asarray([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1], [0, 1, 1, 1, 1, 1]], dtype=bool)
    keras3 = [
        ("zero_output", dict(units=4, return_sequences=True, return_state=True, zero_output_for_mask=True), mask),
        ("backwards_last", dict(units=4, go_backwards=True, return_sequences=False, return_state=True), prepad),
        ("backwards_sequences", dict(units=4, go_backwards=True, return_sequences=True, return_state=True), mask),
        ("backwards_unmasked", dict(units=4, go_backwards=True, return_sequences=True), None),
    ]
    for (name, kwargs, m), rng in zip(keras3, rngs, strict=False):
        layer = keras.layers.LSTM(**kwargs, name="lstm_" + name)
        x = _normal(rng, (B, T, I), np.float32)
        layer.build((None, T, I))
        layer.set_weights([_weight(rng, w.shape, np.float32) for w in layer.get_weights()])
        case_arrays, names = _keras_options_case(tf, name, layer, x, m, rng)
        arrays.update(case_arrays)
        cases.append({"name": name, "framework": "keras", "constructor": kwargs, "returned": names,
                      "serialized": keras.saving.serialize_keras_object(layer), "masked": m is not None,
                      "weights": len(layer.get_weights())})
        print(f"  keras options {name}: returned {names}")
    # Keras 2's CuDNNLSTM (tf_keras): built on the CPU; what it computes is the LSTM that tf_keras's own
    # converter (the one that loads CuDNNLSTM weights from an HDF5 file into an LSTM) makes of its weights.
    for name, bidirectional, rng in (("cudnn", False, rngs[5]), ("cudnn_bidirectional", True, rngs[6])):
        cudnn = CuDNNLSTM(3, return_sequences=True, return_state=not bidirectional, name="cudnn_lstm")
        plain = tf_keras.layers.LSTM(3, return_sequences=True, return_state=not bidirectional, name="lstm")
        if bidirectional:
            cudnn = tf_keras.layers.Bidirectional(cudnn, name="bidirectional_cudnn")
            plain = tf_keras.layers.Bidirectional(plain, name="bidirectional_lstm")
        cudnn.build((None, T, I))
        plain.build((None, T, I))
        weights = [_weight(rng, w.shape, np.float32) for w in cudnn.get_weights()]
        cudnn.set_weights(weights)
        plain.set_weights(hdf5_format.preprocess_weights_for_loading(plain, weights, original_keras_version="2"))
        x = _normal(rng, (B, T, I), np.float32)
        case_arrays, names = _keras_options_case(tf, name, plain, x, None, rng)
        case_arrays = {k: v for k, v in case_arrays.items() if "/weights/" not in k}  # the LSTM's, not the source's
        for k, w in enumerate(weights):
            case_arrays[f"{name}/weights/{k}"] = w
        arrays.update(case_arrays)
        cases.append({"name": name, "framework": "tf_keras", "returned": names,
                      "serialized": json.loads(json.dumps(tf_keras.layers.serialize(cudnn), default=list)),
                      "masked": False, "weights": len(weights),
                      "reference": "tf_keras LSTM with the weights converted by hdf5_format.preprocess_weights_for_"
                                   "loading (outputs and gradients with respect to x)"})
        print(f"  tf_keras {name}: weights {[w.shape for w in weights]}")
    index = {"cases": cases, "versions": {**_versions(), "tf_keras": tf_keras.__version__}, "seed": seed,
             "generator": GENERATOR, "backend": keras.backend.backend()}
    _save(out_dir / "keras_options.npz", arrays, index)


# --------------------------------------------------------------------------
# ONNX LSTM nodes run by onnxruntime
# --------------------------------------------------------------------------

ONNX_OPSET = 14  # the first with the LSTM attribute "layout"

ONNX_CASES = (
    dict(name="forward", direction="forward", steps=5, batch=3, input_size=3, hidden_size=4,
         sequence_lens=[5, 3, 5]),
    dict(name="reverse", direction="reverse", steps=5, batch=3, input_size=3, hidden_size=4,
         sequence_lens=[2, 5, 4]),
    dict(name="bidirectional", direction="bidirectional", steps=4, batch=3, input_size=2, hidden_size=3,
         sequence_lens=[4, 2, 3], peepholes=True, initial_state=True),
    dict(name="layout1", direction="bidirectional", steps=4, batch=2, input_size=3, hidden_size=3, layout=1,
         initial_state=True),
    dict(name="zero_length", direction="bidirectional", steps=4, batch=3, input_size=2, hidden_size=3,
         sequence_lens=[4, 0, 2], initial_state=True),
    dict(name="clip", direction="forward", steps=4, batch=2, input_size=3, hidden_size=3, clip=1.0),
    dict(name="input_forget", direction="forward", steps=4, batch=2, input_size=3, hidden_size=3, input_forget=1),
    dict(name="relu", direction="forward", steps=4, batch=2, input_size=3, hidden_size=3,
         activations=["Relu", "Tanh", "Tanh"]),
)


ONNX_ACTIVATIONS = {"Sigmoid": lambda z: 1 / (1 + np.exp(-z)), "Tanh": np.tanh, "Relu": lambda z: np.maximum(z, 0)}


def _onnx_reference(X, W, R, B, P, seq, h0, c0, clip=None, input_forget=0, activations=("Sigmoid", "Tanh", "Tanh")):
    """A NumPy ONNX LSTM, one direction in forward order, time-major; ``seq`` [B].

    ``clip`` bounds every gate's pre-activation to ``[-clip, clip]``;
    ``input_forget`` couples the gates (``f = 1 - i``); ``activations`` are
    ONNX's ``f, g, h``.
    """
    H = R.shape[-1]
    T, Bn, _ = X.shape
    f_act, g_act, h_act = (ONNX_ACTIVATIONS[a] for a in activations)
    bound = (lambda z: np.clip(z, -clip, clip)) if clip else (lambda z: z)
    h, c = h0.astype(np.float64), c0.astype(np.float64)
    Y = np.zeros((T, Bn, H))
    for t in range(T):
        z = X[t] @ W.T + h @ R.T + B[:4 * H] + B[4 * H:]
        zi, zo, zf, zc = (z[:, k * H:(k + 1) * H] for k in range(4))
        i = f_act(bound(zi + P[:H] * c))
        f = 1 - i if input_forget else f_act(bound(zf + P[2 * H:] * c))
        cn = f * c + i * g_act(bound(zc))
        o = f_act(bound(zo + P[H:2 * H] * cn))
        hn = o * h_act(cn)
        live = (t < seq)[:, None]
        h, c = np.where(live, hn, h), np.where(live, cn, c)
        Y[t] = np.where(live, hn, 0)
    return Y, h, c


def _onnx_lstm_node(helper, name, inputs, outputs, cfg, D, layout):
    attrs = dict(hidden_size=cfg["hidden_size"], direction=cfg["direction"])
    if layout:
        attrs["layout"] = layout
    for key in ("clip", "input_forget"):
        if key in cfg:
            attrs[key] = cfg[key]
    if "activations" in cfg:
        attrs["activations"] = cfg["activations"] * D
    return helper.make_node("LSTM", inputs, outputs, name=name, **attrs), attrs


def _onnx_model(onnx, cfg, a, layout):
    """A single-node ONNX model of case ``cfg`` with the arrays ``a`` (time-major ones when ``layout`` is 0)."""
    from onnx import TensorProto, helper, numpy_helper

    D = a["W"].shape[0]
    inits = [numpy_helper.from_array(a[k], k) for k in ("W", "R", "B", "P") if k in a]
    node_inputs = ["X", "W", "R", "B"] + [k if k in a else "" for k in ("sequence_lens", "initial_h", "initial_c",
                                                                        "P")]
    while node_inputs[-1] == "":
        node_inputs.pop()
    node, attrs = _onnx_lstm_node(helper, "lstm", node_inputs, ["Y", "Y_h", "Y_c"], cfg, D, layout)
    f = TensorProto.FLOAT
    graph_inputs = [helper.make_tensor_value_info("X", f, list(a["X"].shape))]
    if "sequence_lens" in a:
        graph_inputs.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32,
                                                          list(a["sequence_lens"].shape)))
    for k in ("initial_h", "initial_c"):
        if k in a:
            graph_inputs.append(helper.make_tensor_value_info(k, f, list(a[k].shape)))
    T, Bn = (a["X"].shape[1], a["X"].shape[0]) if layout else a["X"].shape[:2]
    H = cfg["hidden_size"]
    y_shape = [Bn, T, D, H] if layout else [T, D, Bn, H]
    state_shape = [Bn, D, H] if layout else [D, Bn, H]
    outputs = [helper.make_tensor_value_info("Y", f, y_shape), helper.make_tensor_value_info("Y_h", f, state_shape),
               helper.make_tensor_value_info("Y_c", f, state_shape)]
    graph = helper.make_graph([node], "lstm_" + cfg["name"], graph_inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              producer_name="nblstm-fixtures")
    model.ir_version = 8
    onnx.checker.check_model(model)
    feeds = {i.name: a[i.name] for i in graph_inputs}
    return model.SerializeToString(), feeds, attrs, node_inputs


def _onnx_run(ort, data, feeds):
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return sess.run(["Y", "Y_h", "Y_c"], feeds)


def _onnx_case(onnx, ort, cfg, rng):
    """Build one single-node model and run it; returns ``(arrays, meta)``."""
    D = 2 if cfg["direction"] == "bidirectional" else 1
    T, Bn, I, H = cfg["steps"], cfg["batch"], cfg["input_size"], cfg["hidden_size"]
    layout = cfg.get("layout", 0)
    a = {"W": _weight(rng, (D, 4 * H, I), np.float32), "R": _weight(rng, (D, 4 * H, H), np.float32),
         "B": _weight(rng, (D, 8 * H), np.float32)}
    if cfg.get("peepholes"):
        a["P"] = _weight(rng, (D, 3 * H), np.float32)
    a["X"] = _normal(rng, (T, Bn, I), np.float32)
    if cfg.get("sequence_lens") is not None:
        a["sequence_lens"] = np.asarray(cfg["sequence_lens"], dtype=np.int32)
    if cfg.get("initial_state"):
        a["initial_h"] = _normal(rng, (D, Bn, H), np.float32)
        a["initial_c"] = _normal(rng, (D, Bn, H), np.float32)
    time_major = dict(a)
    if layout:  # batch-major copies: X [B, T, I], states [B, D, H]
        a["X"] = np.ascontiguousarray(np.swapaxes(a["X"], 0, 1))
        for k in ("initial_h", "initial_c"):
            if k in a:
                a[k] = np.ascontiguousarray(np.swapaxes(a[k], 0, 1))
    data, feeds, attrs, node_inputs = _onnx_model(onnx, cfg, a, layout)
    arrays = dict(a, model=np.frombuffer(data, dtype=np.uint8).copy())
    meta = {"name": cfg["name"], "attributes": attrs, "steps": T, "batch": Bn, "input_size": I, "hidden_size": H,
            "num_directions": D, "layout": layout, "opset": ONNX_OPSET, "node_inputs": node_inputs,
            "sequence_lens": cfg.get("sequence_lens"), "outputs_from": "onnxruntime, this model"}
    try:
        Y, Y_h, Y_c = _onnx_run(ort, data, feeds)
    except Exception as exc:  # recorded: what onnxruntime does with this model
        meta["onnxruntime_error"] = f"{type(exc).__name__}: {exc}".strip()
        if not layout:
            meta["arrays"] = sorted(arrays)
            return arrays, meta
        # The same node with layout=0 on the time-major arrays; results transposed to layout 1.
        data0, feeds0, _, _ = _onnx_model(onnx, cfg, time_major, 0)
        Y, Y_h, Y_c = _onnx_run(ort, data0, feeds0)
        Y, Y_h, Y_c = np.transpose(Y, (2, 0, 1, 3)), np.swapaxes(Y_h, 0, 1), np.swapaxes(Y_c, 0, 1)
        meta["outputs_from"] = ("onnxruntime, the same node with layout=0 on X and the initial states transposed "
                                "to time-major, results transposed to layout 1")
    arrays.update(Y=Y, Y_h=Y_h, Y_c=Y_c)
    meta.update(_onnx_check(cfg, time_major, dict(Y=Y, Y_h=Y_h, Y_c=Y_c), D, layout))
    if any(k in cfg for k in ("clip", "input_forget", "activations")):  # the attribute changes the results
        plain = dict(cfg)
        for k in ("clip", "input_forget", "activations"):
            plain.pop(k, None)
        data1, feeds1, _, _ = _onnx_model(onnx, plain, a, layout)
        meta["max_abs_difference_from_plain_node"] = float(np.max(np.abs(_onnx_run(ort, data1, feeds1)[0] - Y)))
    meta["arrays"] = sorted(arrays)
    return arrays, meta


def _onnx_check(cfg, a, out, D, layout):
    """Compare onnxruntime's results with the NumPy reference, per direction and example.

    The reference runs the reverse direction on each example reversed within
    its own length, and keeps a zero-length example's initial state.
    """
    T, Bn, H = cfg["steps"], cfg["batch"], cfg["hidden_size"]
    X = a["X"]
    Y = np.transpose(out["Y"], (1, 2, 0, 3)) if layout else out["Y"]  # -> [T, D, B, H]
    Y_h = np.swapaxes(out["Y_h"], 0, 1) if layout else out["Y_h"]  # -> [D, B, H]
    Y_c = np.swapaxes(out["Y_c"], 0, 1) if layout else out["Y_c"]
    seq = a.get("sequence_lens", np.full(Bn, T, np.int32))
    zeros = np.zeros((D, Bn, H), np.float32)
    h0, c0 = a.get("initial_h", zeros), a.get("initial_c", zeros)
    P = a.get("P", np.zeros((D, 3 * H), np.float32))
    reverse_flags = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}[cfg["direction"]]
    options = dict(clip=cfg.get("clip"), input_forget=cfg.get("input_forget", 0),
                   activations=cfg.get("activations", ("Sigmoid", "Tanh", "Tanh")))
    live = seq > 0
    err = 0.0
    for d, rev in enumerate(reverse_flags):
        Xd = np.zeros_like(X) if rev else X
        if rev:  # each example reversed within its own length
            for b, n in enumerate(seq):
                Xd[:n, b] = X[:n, b][::-1]
        Yd, hd, cd = _onnx_reference(Xd, a["W"][d], a["R"][d], a["B"][d], P[d], seq, h0[d], c0[d], **options)
        if rev:
            for b, n in enumerate(seq):
                Yd[:n, b] = Yd[:n, b][::-1].copy()
        err = max(err, float(np.max(np.abs(Yd - Y[:, d]))), float(np.max(np.abs((hd - Y_h[d])[live]))),
                  float(np.max(np.abs((cd - Y_c[d])[live]))))
    checks = {"max_abs_error_vs_reference": err,
              "Y_past_length_is_zero": bool(all(np.all(Y[n:, :, b] == 0) for b, n in enumerate(seq)))}
    if not live.all():
        dead = ~live
        checks["zero_length_Y_h_Y_c_are_zero"] = bool(np.all(Y_h[:, dead] == 0) and np.all(Y_c[:, dead] == 0))
        checks["zero_length_Y_h_Y_c_are_initial"] = bool(np.array_equal(Y_h[:, dead], h0[:, dead]) and
                                                         np.array_equal(Y_c[:, dead], c0[:, dead]))
    return checks


def _onnx_stacked(onnx, ort, rng):
    """Two LSTM nodes, "lstm_a" (bidirectional) -> Transpose/Reshape -> "lstm_b" (forward)."""
    from onnx import TensorProto, helper, numpy_helper

    T, Bn, I, H1, H2 = 5, 2, 3, 3, 4
    arrays = {"X": _normal(rng, (T, Bn, I), np.float32), "sequence_lens": np.array([5, 3], dtype=np.int32)}
    inits, nodes, meta_nodes = [], [], []
    for name, D, H, In, direction in (("lstm_a", 2, H1, I, "bidirectional"), ("lstm_b", 1, H2, 2 * H1, "forward")):
        for w, shape in (("W", (D, 4 * H, In)), ("R", (D, 4 * H, H)), ("B", (D, 8 * H))):
            arrays[f"{name}/{w}"] = _weight(rng, shape, np.float32)
            inits.append(numpy_helper.from_array(arrays[f"{name}/{w}"], f"{name}.{w}"))
        meta_nodes.append({"name": name, "attributes": {"hidden_size": H, "direction": direction},
                           "num_directions": D, "input_size": In})
    nodes.append(helper.make_node("LSTM", ["X", "lstm_a.W", "lstm_a.R", "lstm_a.B", "sequence_lens"],
                                  ["lstm_a_Y", "lstm_a_Y_h", "lstm_a_Y_c"], name="lstm_a", hidden_size=H1,
                                  direction="bidirectional"))
    inits.append(numpy_helper.from_array(np.array([0, 0, -1], dtype=np.int64), "shape_tb_"))
    nodes.append(helper.make_node("Transpose", ["lstm_a_Y"], ["lstm_a_Y_t"], name="transpose_a", perm=[0, 2, 1, 3]))
    nodes.append(helper.make_node("Reshape", ["lstm_a_Y_t", "shape_tb_"], ["lstm_a_out"], name="reshape_a"))
    nodes.append(helper.make_node("LSTM", ["lstm_a_out", "lstm_b.W", "lstm_b.R", "lstm_b.B", "sequence_lens"],
                                  ["lstm_b_Y", "lstm_b_Y_h", "lstm_b_Y_c"], name="lstm_b", hidden_size=H2,
                                  direction="forward"))
    f = TensorProto.FLOAT
    outputs = [helper.make_tensor_value_info("lstm_a_Y", f, [T, 2, Bn, H1]),
               helper.make_tensor_value_info("lstm_a_Y_h", f, [2, Bn, H1]),
               helper.make_tensor_value_info("lstm_a_Y_c", f, [2, Bn, H1]),
               helper.make_tensor_value_info("lstm_a_out", f, [T, Bn, 2 * H1]),
               helper.make_tensor_value_info("lstm_b_Y", f, [T, 1, Bn, H2]),
               helper.make_tensor_value_info("lstm_b_Y_h", f, [1, Bn, H2]),
               helper.make_tensor_value_info("lstm_b_Y_c", f, [1, Bn, H2])]
    graph = helper.make_graph(nodes, "stacked", [helper.make_tensor_value_info("X", f, [T, Bn, I]),
                                                 helper.make_tensor_value_info("sequence_lens", TensorProto.INT32,
                                                                               [Bn])],
                              outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
                              producer_name="nblstm-fixtures")
    model.ir_version = 8
    onnx.checker.check_model(model)
    data = model.SerializeToString()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in outputs]
    results = sess.run(names, {"X": arrays["X"], "sequence_lens": arrays["sequence_lens"]})
    for n, r in zip(names, results, strict=True):  # "lstm_a_Y_h" -> "lstm_a/Y_h"
        arrays[n[:6] + "/" + n[7:]] = r
    arrays["model"] = np.frombuffer(data, dtype=np.uint8).copy()
    meta = {"name": "stacked", "nodes": meta_nodes, "steps": T, "batch": Bn, "input_size": I, "opset": ONNX_OPSET,
            "between": "Transpose(perm=[0, 2, 1, 3]) then Reshape([0, 0, -1]): Y [T, D, B, H] -> [T, B, D*H]",
            "arrays": sorted(arrays)}
    return arrays, meta


def _torch_export(onnx, ort, rng):
    """Export ``nn.LSTM(3, 4, num_layers=2, bidirectional=True)`` with torch.onnx; returns ``(arrays, meta)``."""
    import io

    import torch

    lstm = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True)
    state = {}
    with torch.no_grad():
        for name, param in lstm.named_parameters():
            state[name] = _weight(rng, param.shape, np.float32)
            param.copy_(torch.from_numpy(state[name]))
    T, B = 5, 2
    x = _normal(rng, (T, B, 3), np.float32)
    h0 = _normal(rng, (4, B, 4), np.float32)
    c0 = _normal(rng, (4, B, 4), np.float32)
    with torch.no_grad():
        out, (hn, cn) = lstm(torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0)))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(lstm, (torch.from_numpy(x), (torch.from_numpy(h0), torch.from_numpy(c0))), buf,
                          input_names=["input", "h0", "c0"], output_names=["output", "h_n", "c_n"],
                          opset_version=ONNX_OPSET, dynamo=False)
    data = buf.getvalue()
    model = onnx.load_from_string(data)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(sess.get_inputs(), (x, h0, c0), strict=False)}
    ort_out = sess.run(["output", "h_n", "c_n"], feeds)
    arrays = {"model": np.frombuffer(data, dtype=np.uint8).copy(), "x": x, "h0": h0, "c0": c0,
              "output": out.numpy(), "h_n": hn.numpy(), "c_n": cn.numpy(), "ort/output": ort_out[0],
              "ort/h_n": ort_out[1], "ort/c_n": ort_out[2]}
    for k, v in state.items():
        arrays["sd/" + k] = v
    lstm_nodes = [{"name": n.name, "inputs": list(n.input), "outputs": list(n.output),
                   "attributes": {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}}
                  for n in model.graph.node if n.op_type == "LSTM"]
    for n in lstm_nodes:
        n["attributes"] = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in n["attributes"].items()}
    meta = {"name": "torch_export", "module": "torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True)",
            "export": f"torch.onnx.export(dynamo=False, opset_version={ONNX_OPSET})", "steps": T, "batch": B,
            "graph_inputs": [i.name for i in sess.get_inputs()], "lstm_nodes": lstm_nodes,
            "op_types": [n.op_type for n in model.graph.node],
            "ort_matches_torch_max_abs": float(max(np.max(np.abs(a - b)) for a, b in
                                                   zip(ort_out, (out.numpy(), hn.numpy(), cn.numpy()),
                                                       strict=True))),
            "arrays": sorted(arrays)}
    return arrays, meta


def make_onnx(out_dir, seed):
    """Write ``onnx_lstm.npz``."""
    import onnx
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # the refused layout=1 model is reported in the index, not logged
    rngs = _seeds(seed, 40, len(ONNX_CASES) + 2)
    arrays, cases = {}, []
    for cfg, rng in zip(ONNX_CASES, rngs, strict=False):
        case_arrays, meta = _onnx_case(onnx, ort, cfg, rng)
        cases.append(meta)
        arrays.update({f"{cfg['name']}/{k}": v for k, v in case_arrays.items()})
        print(f"  onnx {cfg['name']}: {meta.get('onnxruntime_error') or 'ran'}; error vs reference "
              f"{meta.get('max_abs_error_vs_reference')}; zero-length states zero "
              f"{meta.get('zero_length_Y_h_Y_c_are_zero')}")
    stacked_arrays, stacked = _onnx_stacked(onnx, ort, rngs[-2])
    arrays.update({f"stacked/{k}": v for k, v in stacked_arrays.items()})
    index = {"cases": cases, "stacked": stacked, "versions": _versions(), "seed": seed, "generator": GENERATOR,
             "provider": "CPUExecutionProvider"}
    try:
        export_arrays, export = _torch_export(onnx, ort, rngs[-1])
    except Exception as exc:  # the export is optional
        index["torch_export"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"  torch export failed: {index['torch_export']['error']}")
    else:
        arrays.update({f"torch_export/{k}": v for k, v in export_arrays.items()})
        index["torch_export"] = export
        print(f"  torch export: ops {export['op_types']}, ort vs torch {export['ort_matches_torch_max_abs']:.2e}")
    _save(out_dir / "onnx_lstm.npz", arrays, index)


# Inputs of the call made constants of the model, which the reader must refuse, not drop; their cases are the
# onnx_lstm.npz cases of the same names with those inputs moved to initializers.
ONNX_CONSTANT_CASES = (
    dict(name="constant_lens", source="forward", constants=("sequence_lens",)),
    dict(name="constant_state", source="bidirectional", constants=("sequence_lens", "initial_h", "initial_c")),
)


def make_onnx_constants(out_dir, seed):
    """Write ``onnx_constant_inputs.npz`` from ``onnx_lstm.npz`` (read from ``out_dir``; ``seed`` is unused)."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    with np.load(out_dir / "onnx_lstm.npz", allow_pickle=False) as source:
        stored = {k: source[k] for k in source.files}
    arrays, cases = {}, []
    for cfg in ONNX_CONSTANT_CASES:
        name, src = cfg["name"], cfg["source"]
        model = onnx.load_from_string(stored[f"{src}/model"].tobytes())
        graph = model.graph
        kept = [i for i in graph.input if i.name not in cfg["constants"]]
        del graph.input[:]
        graph.input.extend(kept)
        graph.initializer.extend(numpy_helper.from_array(stored[f"{src}/{k}"], k) for k in cfg["constants"])
        onnx.checker.check_model(model)
        data = model.SerializeToString()
        feeds = {i.name: stored[f"{src}/{i.name}"] for i in graph.input}
        Y, Y_h, Y_c = _onnx_run(ort, data, feeds)
        case = {"model": np.frombuffer(data, dtype=np.uint8).copy(), "Y": Y, "Y_h": Y_h, "Y_c": Y_c}
        case.update({k: stored[f"{src}/{k}"] for k in (*feeds, *cfg["constants"])})
        arrays.update({f"{name}/{k}": v for k, v in case.items()})
        same = all(np.array_equal(a, stored[f"{src}/{k}"]) for k, a in (("Y", Y), ("Y_h", Y_h), ("Y_c", Y_c)))
        cases.append({"name": name, "source": f"onnx_lstm.npz, case {src!r}", "constants": list(cfg["constants"]),
                      "graph_inputs": sorted(feeds), "node_inputs": list(graph.node[0].input),
                      "outputs_equal_source_case": bool(same), "arrays": sorted(case)})
        print(f"  onnx {name}: initializers {list(cfg['constants'])}; outputs equal {src!r}'s: {same}")
    index = {"cases": cases, "versions": _versions(), "generator": GENERATOR, "provider": "CPUExecutionProvider"}
    _save(out_dir / "onnx_constant_inputs.npz", arrays, index)


def main(argv=None):
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="output folder (tests/fixtures)")
    parser.add_argument("--only", default="torch,tf1,keras,keras_options,onnx,onnx_constants",
                        help="comma-separated subset of torch, tf1, keras, keras_options, onnx, onnx_constants")
    parser.add_argument("--seed", type=int, default=20240611)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    makers = {"torch": make_torch, "tf1": make_tf1, "keras": make_keras, "keras_options": make_keras_options,
              "onnx": make_onnx, "onnx_constants": make_onnx_constants}
    for part in args.only.split(","):
        makers[part.strip()](args.out, args.seed)


if __name__ == "__main__":
    main()
