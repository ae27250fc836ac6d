"""Generate the reference fixtures of ``tests/fixtures/`` from TensorFlow and PyTorch.

Run it in an environment that has TensorFlow 2.21 (CPU) and PyTorch; the
tests that read the fixtures need neither::

    python scripts/make_tf_fixtures.py                 # all three files
    python scripts/make_tf_fixtures.py --only raw_ops  # just tf_raw_ops.npz

Three files are written (``tests/fixtures/README.md`` documents every key):

``tf_raw_ops.npz``
    Small float32 and float16 cases of ``tf.raw_ops.BlockLSTM``,
    ``BlockLSTMV2``, ``BlockLSTMGrad``, ``BlockLSTMGradV2``,
    ``LSTMBlockCell`` and ``LSTMBlockCellGrad``, plus the gradients that
    TensorFlow's autodiff gives through BlockLSTM and BlockLSTMV2.
``tf_lstmcell.npz``
    The TF1 ``LSTMCell`` run step by step over short sequences, with
    ``tf.GradientTape`` gradients.
``torch_lstm.npz``
    ``torch.nn.LSTM`` with and without ``proj_size``, with autograd gradients.

Every random number comes from fixed seeds, so a rerun reproduces the
inputs exactly; outputs may differ in the last bit between TensorFlow builds,
and the values TensorFlow leaves uninitialised past ``seq_len_max`` differ
from run to run.
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

# Values of cell_clip: one that clips many cell values of the random cases
# below, one positive but never reached, zero and negative (both turn
# clipping off in the fused ops).
CLIP_ACTIVE = 0.4
CLIP_INACTIVE = 50.0
CLIPS = (CLIP_ACTIVE, CLIP_INACTIVE, 0.0, -1.0)
FORGET_BIASES = (1.0, 0.0, -0.7, 2.5)

BASE_SHAPE = (5, 3, 3, 5)  # (T, B, I, H)
ODD_SHAPES = (
    (1, 1, 1, 1),  # everything 1
    (4, 2, 3, 1),  # H = 1
    (3, 2, 1, 4),  # I = 1
    (1, 3, 2, 4),  # T = 1
    (6, 1, 4, 3),  # B = 1
)
CELL_BASE_SHAPE = (3, 4, 6)  # (B, I, H)
CELL_ODD_SHAPES = ((1, 1, 1), (2, 3, 1), (2, 1, 5), (1, 5, 3))

OUTPUT_NAMES = ("i", "cs", "f", "o", "ci", "co", "h")
GRAD_NAMES = ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad", "wco_grad", "b_grad")
CELL_GRAD_NAMES = ("cs_prev_grad", "dicfo", "wci_grad", "wcf_grad", "wco_grad")


def _save(path, arrays, index):
    """Write ``arrays`` and the JSON ``index`` (key ``"index"``) to a compressed ``.npz``."""
    arrays = dict(arrays)
    arrays["index"] = np.array(json.dumps(index, indent=1, sort_keys=True))
    np.savez_compressed(path, **arrays)
    print(f"wrote {path} ({path.stat().st_size / 1024:.1f} KiB, {len(arrays)} arrays)")


def _pack(cases):
    """Pack many small arrays into one flat buffer per dtype.

    A ``.npz`` member costs a few hundred bytes of headers, more than most of
    these arrays; packing keeps the file small.

    Parameters
    ----------
    cases : list of (dict, dict)
        ``(meta, arrays)`` pairs; each ``meta`` gets an ``"arrays"`` entry
        mapping an array's name to ``[dtype, offset, shape]`` in the buffer
        ``"data/<dtype>"``.

    Returns
    -------
    dict
        ``{"data/<dtype>": 1-D array}``.
    """
    buffers = {}
    for meta, arrays in cases:
        meta["arrays"] = {}
        for name in sorted(arrays):
            a = np.asarray(arrays[name])
            chunks = buffers.setdefault(a.dtype.name, [])
            offset = sum(c.size for c in chunks)
            chunks.append(a.ravel())
            meta["arrays"][name] = [a.dtype.name, offset, list(a.shape)]
    return {f"data/{dtype}": np.concatenate(chunks) for dtype, chunks in buffers.items()}


def _versions():
    import numpy

    versions = {"numpy": numpy.__version__, "python": sys.version.split()[0]}
    for name in ("tensorflow", "torch"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = module.__version__
    return versions


# --------------------------------------------------------------------------
# tf.raw_ops: BlockLSTM, BlockLSTMV2 and their gradients; LSTMBlockCell(+Grad)
# --------------------------------------------------------------------------


def _block_configs():
    """The whole-sequence cases: a list of dicts (op, dtype, shape, attributes)."""
    configs = []
    for dtype in ("float32", "float16"):
        for op in ("BlockLSTM", "BlockLSTMV2"):
            T, B, I, H = BASE_SHAPE
            # TensorFlow's defaults, called without the attribute arguments.
            configs.append(dict(op=op, dtype=dtype, shape=BASE_SHAPE, seq_len_max=T, use_peephole=False,
                                cell_clip=3.0 if op == "BlockLSTM" else 0.0,
                                forget_bias=1.0 if op == "BlockLSTM" else 0.0, defaults=True))
            grid = [(p, c, s) for p in (False, True) for c in CLIPS for s in (T, 3)]
            if dtype == "float16":  # a smaller grid: float16 adds rounding, not code paths
                grid = [(p, c, s) for p, c, s in grid if c in (CLIP_ACTIVE, -1.0)]
            grid += [(False, CLIP_ACTIVE, 0), (True, -1.0, 0)]
            for n, (peep, clip, slm) in enumerate(grid):
                configs.append(dict(op=op, dtype=dtype, shape=BASE_SHAPE, seq_len_max=slm, use_peephole=peep,
                                    cell_clip=clip, forget_bias=FORGET_BIASES[n % 4] if op == "BlockLSTM" else 0.0,
                                    defaults=False))
            for n, shape in enumerate(ODD_SHAPES):
                T = shape[0]
                configs.append(dict(op=op, dtype=dtype, shape=shape, seq_len_max=T, use_peephole=True,
                                    cell_clip=CLIP_ACTIVE, forget_bias=FORGET_BIASES[n % 4] if op == "BlockLSTM"
                                    else 0.0, defaults=False))
                configs.append(dict(op=op, dtype=dtype, shape=shape, seq_len_max=T - 1, use_peephole=False,
                                    cell_clip=(0.0, -1.0)[n % 2], forget_bias=FORGET_BIASES[(n + 1) % 4]
                                    if op == "BlockLSTM" else 0.0, defaults=False))
    return configs


def _cell_configs():
    """The single-step cases (LSTMBlockCell and LSTMBlockCellGrad)."""
    configs = []
    for dtype in ("float32", "float16"):
        configs.append(dict(op="LSTMBlockCell", dtype=dtype, shape=CELL_BASE_SHAPE, use_peephole=False, cell_clip=3.0,
                            forget_bias=1.0, defaults=True))
        n = 0
        for peep in (False, True):
            for clip in CLIPS:
                configs.append(dict(op="LSTMBlockCell", dtype=dtype, shape=CELL_BASE_SHAPE, use_peephole=peep,
                                    cell_clip=clip, forget_bias=FORGET_BIASES[n % 4], defaults=False))
                n += 1
        for shape in CELL_ODD_SHAPES:
            for peep in (False, True):
                configs.append(dict(op="LSTMBlockCell", dtype=dtype, shape=shape, use_peephole=peep,
                                    cell_clip=CLIP_ACTIVE if peep else -1.0, forget_bias=FORGET_BIASES[n % 4],
                                    defaults=False))
                n += 1
    return configs


def _random_inputs(rng, steps, batch, inputs, units, dtype):
    """Random inputs of the fused ops; ``steps=None`` for one step. Drawn in float64, then cast."""
    x_shape = (batch, inputs) if steps is None else (steps, batch, inputs)
    arrays = {
        "x": rng.standard_normal(x_shape),
        "cs_prev": rng.standard_normal((batch, units)),
        "h_prev": rng.uniform(-1.0, 1.0, (batch, units)),
        "w": rng.standard_normal((inputs + units, 4 * units)) * 0.6,
        "wci": rng.standard_normal(units) * 0.5,
        "wcf": rng.standard_normal(units) * 0.5,
        "wco": rng.standard_normal(units) * 0.5,
        "b": rng.standard_normal(4 * units) * 0.5,
    }
    return {k: a.astype(dtype) for k, a in arrays.items()}


def _block_case(tf, cfg, rng):
    """Run one whole-sequence case; returns ``(arrays, meta)``."""
    T, B, I, H = cfg["shape"]
    dtype = np.dtype(cfg["dtype"])
    op = cfg["op"]
    inp = _random_inputs(rng, T, B, I, H, dtype)
    attrs = {} if cfg["defaults"] else {"cell_clip": cfg["cell_clip"], "use_peephole": cfg["use_peephole"]}
    if op == "BlockLSTM" and not cfg["defaults"]:
        attrs["forget_bias"] = cfg["forget_bias"]
    fwd = getattr(tf.raw_ops, op)(seq_len_max=np.int64(cfg["seq_len_max"]), **inp, **attrs)
    out = {name: getattr(fwd, name).numpy() for name in OUTPUT_NAMES}
    grads_in = {
        "cs_grad": rng.standard_normal((T, B, H)).astype(dtype),
        "h_grad": rng.standard_normal((T, B, H)).astype(dtype),
    }
    # The gradient op gets TensorFlow's own forward outputs, as in training
    # (including what TensorFlow leaves uninitialised past seq_len_max).
    grad_op = getattr(tf.raw_ops, op.replace("BlockLSTM", "BlockLSTMGrad"))
    grad = grad_op(seq_len_max=np.int64(cfg["seq_len_max"]), **inp, **out, **grads_in,
                   use_peephole=cfg["use_peephole"])
    arrays = {**inp, **out, **grads_in}
    arrays.update({name: getattr(grad, name).numpy() for name in GRAD_NAMES})
    meta = dict(cfg)
    meta["shape"] = list(cfg["shape"])
    meta["grad_op"] = op.replace("BlockLSTM", "BlockLSTMGrad")
    slm = cfg["seq_len_max"]
    clip = cfg["cell_clip"]
    meta["clipped_fraction"] = (float(np.mean(np.abs(out["cs"][:slm].astype(np.float64)) >= np.float32(clip) *
                                              (1 - 1e-3)))
                                if clip > 0 and slm > 0 else 0.0)
    return arrays, meta


def _cell_case(tf, cfg, rng):
    """Run one LSTMBlockCell case and its LSTMBlockCellGrad; returns ``(arrays, meta)``."""
    B, I, H = cfg["shape"]
    dtype = np.dtype(cfg["dtype"])
    inp = _random_inputs(rng, None, B, I, H, dtype)
    attrs = {} if cfg["defaults"] else {"cell_clip": cfg["cell_clip"], "use_peephole": cfg["use_peephole"],
                                        "forget_bias": cfg["forget_bias"]}
    fwd = tf.raw_ops.LSTMBlockCell(**inp, **attrs)
    out = {name: getattr(fwd, name).numpy() for name in OUTPUT_NAMES}
    grads_in = {
        "cs_grad": rng.standard_normal((B, H)).astype(dtype),
        "h_grad": rng.standard_normal((B, H)).astype(dtype),
    }
    grad = tf.raw_ops.LSTMBlockCellGrad(**inp, **{k: out[k] for k in OUTPUT_NAMES[:6]}, **grads_in,
                                        use_peephole=cfg["use_peephole"])
    arrays = {**inp, **out, **grads_in}
    arrays.update({name: getattr(grad, name).numpy() for name in CELL_GRAD_NAMES})
    meta = dict(cfg)
    meta["shape"] = list(cfg["shape"])
    meta["grad_op"] = "LSTMBlockCellGrad"
    clip = cfg["cell_clip"]
    meta["clipped_fraction"] = (float(np.mean(np.abs(out["cs"].astype(np.float64)) >= np.float32(clip) * (1 - 1e-3)))
                                if clip > 0 else 0.0)
    return arrays, meta


def _autodiff_case(tf, op, rng):
    """TensorFlow's autodiff through ``op`` next to its raw gradient op, on the same loss.

    The loss is ``sum(h * h_grad) + sum(cs * cs_grad)``, so the raw gradient
    op gets exactly those ``cs_grad`` and ``h_grad``.
    """
    T, B, I, H = BASE_SHAPE
    inp = _random_inputs(rng, T, B, I, H, np.float32)
    cs_grad = rng.standard_normal((T, B, H)).astype(np.float32)
    h_grad = rng.standard_normal((T, B, H)).astype(np.float32)
    attrs = {"cell_clip": -1.0, "use_peephole": True}
    if op == "BlockLSTM":
        attrs["forget_bias"] = 0.5
    variables = {k: tf.Variable(v) for k, v in inp.items()}
    with tf.GradientTape() as tape:
        fwd = getattr(tf.raw_ops, op)(seq_len_max=np.int64(T), **variables, **attrs)
        loss = tf.reduce_sum(fwd.h * h_grad) + tf.reduce_sum(fwd.cs * cs_grad)
    names = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")
    auto = tape.gradient(loss, [variables[k] for k in names])
    out = {name: getattr(fwd, name).numpy() for name in OUTPUT_NAMES}
    raw = getattr(tf.raw_ops, op.replace("BlockLSTM", "BlockLSTMGrad"))(
        seq_len_max=np.int64(T), **inp, **out, cs_grad=cs_grad, h_grad=h_grad, use_peephole=True)
    arrays = {**inp, **out, "cs_grad": cs_grad, "h_grad": h_grad}
    matches = True
    for name, g in zip(names, auto, strict=True):
        arrays["autodiff_" + name + "_grad"] = g.numpy()
        raw_g = getattr(raw, name + "_grad").numpy()
        arrays[name + "_grad"] = raw_g
        matches &= bool(np.allclose(g.numpy(), raw_g, rtol=1e-5, atol=1e-5))
    meta = dict(op=op, dtype="float32", shape=list(BASE_SHAPE), seq_len_max=T, use_peephole=True, cell_clip=-1.0,
                forget_bias=attrs.get("forget_bias", 0.0), defaults=False, autodiff_matches_raw_op=matches)
    return arrays, meta


def make_raw_ops(out_dir, seed):
    """Write ``tf_raw_ops.npz``."""
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng_root = np.random.SeedSequence(seed)
    configs = _block_configs() + _cell_configs()
    seeds = rng_root.spawn(len(configs) + 2)
    cases, autodiff = [], []
    for n, cfg in enumerate(configs):
        rng = np.random.default_rng(seeds[n])
        runner = _cell_case if cfg["op"] == "LSTMBlockCell" else _block_case
        case_arrays, meta = runner(tf, cfg, rng)
        meta["name"] = f"{'cell' if cfg['op'] == 'LSTMBlockCell' else 'seq'}{n:03d}"
        cases.append((meta, case_arrays))
    for k, op in enumerate(("BlockLSTM", "BlockLSTMV2")):
        case_arrays, meta = _autodiff_case(tf, op, np.random.default_rng(seeds[len(configs) + k]))
        meta["name"] = f"autodiff_{op}"
        autodiff.append((meta, case_arrays))
    arrays = _pack(cases + autodiff)
    index = {"cases": [m for m, _ in cases], "autodiff": [m for m, _ in autodiff], "versions": _versions(),
             "seed": seed, "generator": "scripts/make_tf_fixtures.py"}
    _save(out_dir / "tf_raw_ops.npz", arrays, index)
    cases = index["cases"]
    autodiff = index["autodiff"]
    for meta in autodiff:
        print(f"  TensorFlow autodiff through {meta['op']} matches the raw gradient op: "
              f"{meta['autodiff_matches_raw_op']}")
    active = [c["clipped_fraction"] for c in cases if c["cell_clip"] == CLIP_ACTIVE and c.get("seq_len_max", 1) > 0]
    print(f"  clipped fraction where cell_clip={CLIP_ACTIVE}: min {min(active):.2f}, max {max(active):.2f}")


# --------------------------------------------------------------------------
# TF1 LSTMCell
# --------------------------------------------------------------------------

LSTMCELL_CONFIGS = (
    dict(name="basic", num_units=4, inputs=3, batch=2, steps=4, dtype="float32", kwargs={}),
    dict(name="peephole_clip", num_units=4, inputs=3, batch=2, steps=4, dtype="float32",
         kwargs=dict(use_peepholes=True, cell_clip=0.3, forget_bias=0.5)),
    dict(name="peephole_clip0", num_units=3, inputs=2, batch=2, steps=3, dtype="float32",
         kwargs=dict(use_peepholes=True, cell_clip=0.0)),
    dict(name="proj_clip", num_units=4, inputs=3, batch=2, steps=4, dtype="float32",
         kwargs=dict(use_peepholes=True, num_proj=3, proj_clip=0.1)),
    dict(name="proj_wide", num_units=4, inputs=3, batch=3, steps=3, dtype="float32",
         kwargs=dict(num_proj=5, cell_clip=1.0, forget_bias=0.0)),
    dict(name="relu", num_units=4, inputs=3, batch=2, steps=4, dtype="float32",
         kwargs=dict(activation="relu", forget_bias=-0.5)),
    dict(name="concat_state", num_units=4, inputs=3, batch=2, steps=3, dtype="float32",
         kwargs=dict(state_is_tuple=False, use_peepholes=True, num_proj=2)),
    dict(name="tiny", num_units=1, inputs=1, batch=1, steps=3, dtype="float32",
         kwargs=dict(use_peepholes=True, cell_clip=0.2)),
    dict(name="float64", num_units=4, inputs=3, batch=2, steps=4, dtype="float64",
         kwargs=dict(use_peepholes=True, cell_clip=0.5, num_proj=3, proj_clip=0.4)),
    dict(name="float16", num_units=4, inputs=3, batch=2, steps=3, dtype="float16",
         kwargs=dict(use_peepholes=True, forget_bias=1.0)),
)


def _lstmcell_case(tf, rnn_cell_impl, cfg, rng):
    """Run one TF1 LSTMCell configuration step by step; returns ``(arrays, meta)``."""
    dtype = np.dtype(cfg["dtype"])
    tf_dtype = tf.as_dtype(dtype)
    H, I, B, T = cfg["num_units"], cfg["inputs"], cfg["batch"], cfg["steps"]
    kwargs = cfg["kwargs"]
    P = kwargs.get("num_proj") or H
    cell = rnn_cell_impl.LSTMCell(H, dtype=tf_dtype, name=f"lstm_cell_{cfg['name']}", **kwargs)
    x = rng.standard_normal((T, B, I)).astype(dtype)
    c0 = rng.standard_normal((B, H)).astype(dtype)
    h0 = rng.uniform(-1.0, 1.0, (B, P)).astype(dtype)
    tuple_state = kwargs.get("state_is_tuple", True)
    cell.build(tf.TensorShape([B, I]))
    weights = {}
    prefix = cell.name + "/"
    for var in cell.variables:
        tf_name = var.name.split(":")[0]
        tf_name = tf_name[len(prefix):] if tf_name.startswith(prefix) else tf_name
        value = (rng.standard_normal(var.shape) * 0.6).astype(dtype)
        var.assign(value)
        weights[tf_name] = value
    R = rng.standard_normal((T, B, P)).astype(dtype)
    Rc = rng.standard_normal((B, H)).astype(dtype)
    Rh = rng.standard_normal((B, P)).astype(dtype)
    xs = tf.Variable(x)
    c0v, h0v = tf.Variable(c0), tf.Variable(h0)
    with tf.GradientTape() as tape:
        state = (rnn_cell_impl.LSTMStateTuple(c0v, h0v) if tuple_state else tf.concat([c0v, h0v], axis=1))
        outputs, cs = [], []
        for t in range(T):
            m, state = cell(xs[t], state)
            outputs.append(m)
            cs.append(state.c if tuple_state else state[:, :H])
        outputs = tf.stack(outputs)
        c_final = state.c if tuple_state else state[:, :H]
        h_final = state.h if tuple_state else state[:, H:]
        loss = tf.reduce_sum(outputs * R) + tf.reduce_sum(c_final * Rc) + tf.reduce_sum(h_final * Rh)
    variables = {name: v for v in cell.variables for name in weights if v.name.split(":")[0] == prefix + name}
    targets = [xs, c0v, h0v] + [variables[name] for name in weights]
    grads = tape.gradient(loss, targets)
    arrays = {"x": x, "c0": c0, "h0": h0, "R": R, "Rc": Rc, "Rh": Rh, **weights,
              "outputs": outputs.numpy(), "c": tf.stack(cs).numpy(), "c_final": c_final.numpy(),
              "h_final": h_final.numpy(), "loss": np.asarray(loss.numpy())}
    if not tuple_state:
        arrays["state0"] = np.concatenate([c0, h0], axis=1)
        arrays["state_final"] = state.numpy()
    for name, g in zip(["x", "c0", "h0", *weights], grads, strict=True):
        arrays["grad/" + name] = np.zeros_like(arrays[name]) if g is None else tf.convert_to_tensor(g).numpy()
    meta = {"name": cfg["name"], "num_units": H, "input_size": I, "batch": B, "steps": T, "dtype": cfg["dtype"],
            "use_peepholes": kwargs.get("use_peepholes", False), "cell_clip": kwargs.get("cell_clip"),
            "num_proj": kwargs.get("num_proj"), "proj_clip": kwargs.get("proj_clip"),
            "forget_bias": kwargs.get("forget_bias", 1.0), "state_is_tuple": tuple_state,
            "activation": kwargs.get("activation"), "weights": sorted(weights), "arrays": sorted(arrays)}
    return arrays, meta


def make_lstmcell(out_dir, seed):
    """Write ``tf_lstmcell.npz``."""
    import tensorflow as tf
    from tensorflow.python.keras.layers.legacy_rnn import rnn_cell_impl

    arrays, cases = {}, []
    seeds = np.random.SeedSequence(seed + 1).spawn(len(LSTMCELL_CONFIGS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for cfg, s in zip(LSTMCELL_CONFIGS, seeds, strict=True):
            case_arrays, meta = _lstmcell_case(tf, rnn_cell_impl, cfg, np.random.default_rng(s))
            cases.append(meta)
            arrays.update({f"{cfg['name']}/{k}": v for k, v in case_arrays.items()})
    index = {"cases": cases, "versions": _versions(), "seed": seed, "generator": "scripts/make_tf_fixtures.py",
             "class": "tensorflow.python.keras.layers.legacy_rnn.rnn_cell_impl.LSTMCell"}
    _save(out_dir / "tf_lstmcell.npz", arrays, index)


# --------------------------------------------------------------------------
# torch.nn.LSTM
# --------------------------------------------------------------------------

TORCH_CONFIGS = (
    dict(name="plain", input_size=3, hidden_size=4, proj_size=0, batch=2, steps=5, dtype="float32"),
    dict(name="proj", input_size=3, hidden_size=5, proj_size=3, batch=2, steps=4, dtype="float32"),
    dict(name="plain64", input_size=4, hidden_size=3, proj_size=0, batch=3, steps=4, dtype="float64"),
    dict(name="proj64", input_size=2, hidden_size=4, proj_size=2, batch=2, steps=3, dtype="float64"),
    dict(name="tiny", input_size=1, hidden_size=1, proj_size=0, batch=1, steps=2, dtype="float32"),
)


def _torch_case(torch, cfg, rng):
    """Run one ``torch.nn.LSTM`` configuration with autograd; returns ``(arrays, meta)``."""
    dtype = np.dtype(cfg["dtype"])
    I, H, P, B, T = cfg["input_size"], cfg["hidden_size"], cfg["proj_size"], cfg["batch"], cfg["steps"]
    HP = P or H
    lstm = torch.nn.LSTM(I, H, proj_size=P).to(getattr(torch, cfg["dtype"]))
    state = {}
    with torch.no_grad():
        for name, param in lstm.named_parameters():
            value = (rng.standard_normal(tuple(param.shape)) * 0.5).astype(dtype)
            param.copy_(torch.from_numpy(value))
            state[name] = value
    x = rng.standard_normal((T, B, I)).astype(dtype)
    h0 = rng.uniform(-1.0, 1.0, (1, B, HP)).astype(dtype)
    c0 = rng.standard_normal((1, B, H)).astype(dtype)
    R = rng.standard_normal((T, B, HP)).astype(dtype)
    Rh = rng.standard_normal((1, B, HP)).astype(dtype)
    Rc = rng.standard_normal((1, B, H)).astype(dtype)
    xt, h0t, c0t = (torch.from_numpy(a.copy()).requires_grad_(True) for a in (x, h0, c0))
    out, (hn, cn) = lstm(xt, (h0t, c0t))
    loss = (out * torch.from_numpy(R)).sum() + (hn * torch.from_numpy(Rh)).sum() + (cn * torch.from_numpy(Rc)).sum()
    loss.backward()
    arrays = {"x": x, "h0": h0, "c0": c0, "R": R, "Rh": Rh, "Rc": Rc, **state,
              "output": out.detach().numpy(), "h_n": hn.detach().numpy(), "c_n": cn.detach().numpy(),
              "loss": np.asarray(loss.detach().numpy())}
    arrays["grad/x"] = xt.grad.numpy()
    arrays["grad/h0"] = h0t.grad.numpy()
    arrays["grad/c0"] = c0t.grad.numpy()
    for name, param in lstm.named_parameters():
        arrays["grad/" + name] = param.grad.numpy()
    meta = dict(cfg)
    meta["parameters"] = sorted(state)
    meta["arrays"] = sorted(arrays)
    return arrays, meta


def make_torch(out_dir, seed):
    """Write ``torch_lstm.npz``."""
    import torch

    torch.set_num_threads(1)
    arrays, cases = {}, []
    seeds = np.random.SeedSequence(seed + 2).spawn(len(TORCH_CONFIGS))
    for cfg, s in zip(TORCH_CONFIGS, seeds, strict=True):
        case_arrays, meta = _torch_case(torch, cfg, np.random.default_rng(s))
        cases.append(meta)
        arrays.update({f"{cfg['name']}/{k}": v for k, v in case_arrays.items()})
    index = {"cases": cases, "versions": _versions(), "seed": seed, "generator": "scripts/make_tf_fixtures.py",
             "class": "torch.nn.LSTM(input_size, hidden_size, proj_size=proj_size), one layer, time-major"}
    _save(out_dir / "torch_lstm.npz", arrays, index)


def main(argv=None):
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="output folder (tests/fixtures)")
    parser.add_argument("--only", default="raw_ops,lstmcell,torch",
                        help="comma-separated subset of raw_ops, lstmcell, torch")
    parser.add_argument("--seed", type=int, default=20240611)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    makers = {"raw_ops": make_raw_ops, "lstmcell": make_lstmcell, "torch": make_torch}
    for part in args.only.split(","):
        makers[part.strip()](args.out, args.seed)


if __name__ == "__main__":
    main()
