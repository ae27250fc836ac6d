"""Property-based tests of every public entry point of the fused ops.

Hypothesis draws small problems (zero- and one-sized dimensions included),
dtypes, gate layouts, options, ``seq_len_max`` in its accepted forms, memory
orders and views, and deliberately wrong arguments. Every call either
matches the float64 reference (:mod:`nblstm.reference`) within the dtype's
tolerance or raises ``ValueError``/``TypeError``.

Profiles (``NBLSTM_HYPOTHESIS_PROFILE``): ``ci`` (default, derandomized, a
few thousand examples in all), ``dev`` (random, more examples), ``quick``.
The arrays are built from a drawn seed, not drawn element by element: that
keeps an example cheap. Read-only inputs are all-or-nothing per example:
numba compiles one specialisation per combination of read-only flags, so a
per-array draw would compile dozens.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nblstm
from nblstm import raw_ops
from nblstm import reference as ref
from tests.helpers import make_problem

settings.register_profile(
    "ci", max_examples=100, deadline=None, derandomize=True, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev", max_examples=1000, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "quick", max_examples=20, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile(os.environ.get("NBLSTM_HYPOTHESIS_PROFILE", "ci"))


def examples(factor):
    """The profile's settings with ``factor`` times its ``max_examples``."""
    return settings(PROFILE, max_examples=max(1, int(PROFILE.max_examples * factor)))


OUTPUT_NAMES = ("i", "cs", "f", "o", "ci", "co", "h")
GRAD_NAMES = ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad", "wco_grad", "b_grad")
CELL_GRAD_NAMES = ("cs_prev_grad", "dicfo", "wci_grad", "wcf_grad", "wco_grad")
DTYPES = (np.float16, np.float32, np.float64)
#: (rtol, atol) per dtype; the absolute part is scaled by ``1 + max|expected|`` (docs/specification.rst, "Tolerances").
FORWARD_TOL = {np.float64: (1e-12, 1e-13), np.float32: (2e-6, 1e-6), np.float16: (8e-3, 8e-4)}
GRAD_TOL = {np.float64: (1e-11, 1e-12), np.float32: (2e-5, 1e-5), np.float16: (1e-2, 1e-2)}

FORWARD_OPS = ("block_lstm", "BlockLSTM", "BlockLSTMV2", "lstm_block_cell", "LSTMBlockCell")
GRAD_OPS = ("block_lstm_grad", "BlockLSTMGrad", "BlockLSTMGradV2", "lstm_block_cell_grad", "LSTMBlockCellGrad")
SEQUENCE_OPS = ("block_lstm", "BlockLSTM", "BlockLSTMV2", "block_lstm_grad", "BlockLSTMGrad", "BlockLSTMGradV2")
RAW_LAYOUT = {"BlockLSTM": "icfo", "BlockLSTMV2": "ifco", "BlockLSTMGrad": "icfo", "BlockLSTMGradV2": "ifco",
              "LSTMBlockCell": "icfo", "LSTMBlockCellGrad": "icfo"}


# --------------------------------------------------------------------------------------------------------------
# Problems


def make_arrays(seed, steps, batch, inputs, units, dtype, scale):
    """Random inputs, weights, forward-output-like arrays and incoming gradients in ``dtype``."""
    rng = np.random.default_rng(seed)
    p = make_problem(rng, steps, batch, inputs, units, scale=scale)
    p["cs_grad"] = rng.standard_normal((steps, batch, units))
    p["h_grad"] = rng.standard_normal((steps, batch, units))
    return {k: v.astype(dtype) for k, v in p.items()}


def as_single_step(a):
    """The arrays of a problem for the single-step ops: time axis of length 1 (zeros when it was empty)."""
    return {k: (v[:1] if v.shape[0] else np.zeros((1,) + v.shape[1:], v.dtype)) if v.ndim == 3 else v
            for k, v in a.items()}


@st.composite
def problems(draw, min_units=1):
    """A dict: dims, dtype, arrays and options of one call."""
    dims = (draw(st.integers(0, 3)), draw(st.integers(0, 3)), draw(st.integers(0, 3)), draw(st.integers(min_units, 4)))
    dtype = draw(st.sampled_from(DTYPES))
    scale = draw(st.sampled_from([0.3, 1.0, 2.5]))
    arrays = make_arrays(draw(st.integers(0, 2**32 - 1)), *dims, dtype, scale)
    return {"dims": dims, "dtype": dtype, "arrays": arrays}


@st.composite
def options(draw, steps):
    """Options as a functional-API caller would pass them, plus the normalised values."""
    seq = draw(st.one_of(st.none(), st.integers(0, steps)))
    seq_form = seq
    if seq is not None:
        seq_form = draw(st.sampled_from([int, np.int64, np.int32, np.uint8, np.array]))(seq)
    return {
        "seq_len_max": seq,
        "seq_len_max_form": seq_form,
        "forget_bias": draw(st.one_of(st.sampled_from([0.0, 1.0]), st.floats(-3, 3, allow_nan=False))),
        "cell_clip": draw(st.sampled_from([None, 0.0, -1.0, -3.0, 0.05, 0.5, 3.0, np.inf])),
        "use_peephole": draw(st.booleans()),
        "layout": draw(st.sampled_from(["ifco", "icfo", "IFCO"])),
        "pass_peepholes": draw(st.booleans()),
    }


def peephole_args(a, opts):
    if opts["use_peephole"] or opts["pass_peepholes"]:
        return a["wci"], a["wcf"], a["wco"]
    return None, None, None


def reference_forward(a, seq_len_max, forget_bias, cell_clip, use_peephole, layout):
    clip = -1.0 if cell_clip is None else cell_clip
    with np.errstate(all="ignore"):
        return ref.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], a["wci"], a["wcf"], a["wco"],
                              seq_len_max, forget_bias, clip, use_peephole, layout.lower())


def reference_cell_grad(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, use_peephole, layout):
    """LSTMBlockCellGrad from the sequence reference, one batch row at a time (``b_grad`` of a row is its dicfo)."""
    batch, units = cs_prev.shape
    res = {"cs_prev_grad": np.zeros((batch, units)), "dicfo": np.zeros((batch, 4 * units)),
           "wci_grad": np.zeros(units), "wcf_grad": np.zeros(units), "wco_grad": np.zeros(units)}
    outputs = list(outputs[:6]) + [np.zeros((batch, units))]
    for r in range(batch):
        row = slice(r, r + 1)
        g = ref.block_lstm_grad(x[None, row], cs_prev[row], h_prev[row], w, wci, wcf, wco,
                                [o[None, row] for o in outputs], cs_grad[None, row], h_grad[None, row], 1,
                                use_peephole, layout)
        res["cs_prev_grad"][r] = g["cs_prev_grad"][0]
        res["dicfo"][r] = g["b_grad"]
        for name in ("wci_grad", "wcf_grad", "wco_grad"):
            res[name] += g[name]
    return res


def assert_matches(actual, expected, dtype, tol, name):
    """Elementwise ``|a - e| <= atol * (1 + max|e|) + rtol * |e|``; the dtype and shape must be right."""
    assert isinstance(actual, np.ndarray), name
    assert actual.dtype == np.dtype(dtype), f"{name}: dtype {actual.dtype}, expected {np.dtype(dtype)}"
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape}, expected {expected.shape}"
    if actual.size == 0:
        return
    rtol, atol = tol[np.dtype(dtype).type]
    got = actual.astype(np.float64)
    err = np.abs(got - expected)
    bound = atol * (1.0 + np.abs(expected).max()) + rtol * np.abs(expected)
    worst = np.argmax(err - bound)
    assert np.all(err <= bound), (f"{name}: max excess at {np.unravel_index(worst, err.shape)}: "
                                  f"got {got.flat[worst]!r}, expected {expected.flat[worst]!r}")


# --------------------------------------------------------------------------------------------------------------
# Calls: every entry point as (function, positional args, keyword args) from a problem and options


def forward_call(name, a, opts, defaults=False):
    """The call of forward op ``name`` and the reference options it stands for."""
    wci, wcf, wco = peephole_args(a, opts)
    seq = opts["seq_len_max_form"]
    fb, clip, peep, layout = opts["forget_bias"], opts["cell_clip"], opts["use_peephole"], opts["layout"]
    single = name in ("lstm_block_cell", "LSTMBlockCell")
    x = a["x"][0] if single else a["x"]
    if name in ("block_lstm", "lstm_block_cell"):
        kwargs = {"forget_bias": fb, "cell_clip": clip, "use_peephole": peep, "layout": layout}
        if not single:
            kwargs["seq_len_max"] = seq
        fn = getattr(nblstm, name)
        return fn, (x, a["cs_prev"], a["h_prev"], a["w"], a["b"], wci, wcf, wco), kwargs, (fb, clip, peep, layout)
    # Raw ops: TensorFlow's arguments; every peephole array is required.
    wci, wcf, wco = a["wci"], a["wcf"], a["wco"]
    layout = RAW_LAYOUT[name]
    fn = getattr(raw_ops, name)
    if single:
        args = (x, a["cs_prev"], a["h_prev"], a["w"], wci, wcf, wco, a["b"])
    else:
        seq = a["x"].shape[0] if seq is None else seq
        args = (seq, x, a["cs_prev"], a["h_prev"], a["w"], wci, wcf, wco, a["b"])
    if defaults:
        fb = 0.0 if name == "BlockLSTMV2" else 1.0
        clip = 0.0 if name == "BlockLSTMV2" else 3.0
        return fn, args, {}, (fb, clip, False, layout)
    kwargs = {"cell_clip": clip if clip is not None else -1.0, "use_peephole": peep}
    if name != "BlockLSTMV2":
        kwargs["forget_bias"] = fb
    else:
        fb = 0.0
    return fn, args, kwargs, (fb, clip, peep, layout)


def grad_call(name, a, outputs, opts, outputs_form):
    """The call of gradient op ``name``; ``outputs`` are the forward outputs (seven arrays)."""
    single = name in ("lstm_block_cell_grad", "LSTMBlockCellGrad")
    x = a["x"][0] if single else a["x"]
    cs_grad = a["cs_grad"][0] if single else a["cs_grad"]
    h_grad = a["h_grad"][0] if single else a["h_grad"]
    peep = opts["use_peephole"]
    if name in ("block_lstm_grad", "lstm_block_cell_grad"):
        wci, wcf, wco = peephole_args(a, opts)
        outs = list(outputs)
        if single and outputs_form == "six":
            outs = outs[:6]
        if outputs_form == "dict":
            outs = dict(zip(OUTPUT_NAMES, outs, strict=True))
        elif outputs_form == "tuple":
            outs = tuple(outs)
        elif outputs_form == "named":
            outs = (nblstm.LSTMBlockCellOutput if single else nblstm.BlockLSTMOutput)(*outputs)
        kwargs = {"use_peephole": peep, "layout": opts["layout"]}
        if not single:
            kwargs["seq_len_max"] = opts["seq_len_max_form"]
        fn = getattr(nblstm, name)
        return fn, (x, a["cs_prev"], a["h_prev"], a["w"], outs, cs_grad, h_grad, wci, wcf, wco), kwargs
    fn = getattr(raw_ops, name)
    common = (x, a["cs_prev"], a["h_prev"], a["w"], a["wci"], a["wcf"], a["wco"], a["b"])
    if single:
        return fn, (*common, *outputs[:6], cs_grad, h_grad, peep), {}
    seq = a["x"].shape[0] if opts["seq_len_max"] is None else opts["seq_len_max_form"]
    return fn, (seq, *common, *outputs, cs_grad, h_grad, peep), {}


def grad_layout(name, opts):
    return RAW_LAYOUT.get(name, opts["layout"].lower())


# --------------------------------------------------------------------------------------------------------------
# Valid calls match the reference


@examples(6)
@given(problems(), st.data(), st.sampled_from(FORWARD_OPS), st.booleans())
def test_forward_ops_match_reference(problem, data, name, defaults):
    a, dtype = problem["arrays"], problem["dtype"]
    steps, batch, _, units = problem["dims"]
    single = name in ("lstm_block_cell", "LSTMBlockCell")
    if single:
        a = as_single_step(a)
    opts = data.draw(options(a["x"].shape[0]))
    if single:
        opts = dict(opts, seq_len_max=None, seq_len_max_form=None)
    fn, args, kwargs, (fb, clip, peep, layout) = forward_call(name, a, opts, defaults)
    out = fn(*args, **kwargs)
    expected = reference_forward(a, opts["seq_len_max"], fb, clip, peep, layout)
    assert type(out).__name__ == ("LSTMBlockCellOutput" if single else "BlockLSTMOutput")
    assert out._fields == OUTPUT_NAMES
    for k in OUTPUT_NAMES:
        e = expected[k][0] if single else expected[k]
        assert_matches(getattr(out, k), e, dtype, FORWARD_TOL, k)
    if not single:
        seq = steps if opts["seq_len_max"] is None else opts["seq_len_max"]
        assert all(not np.any(getattr(out, k)[seq:]) for k in OUTPUT_NAMES), "outputs past seq_len_max must be 0"


@examples(5)
@given(problems(), st.data(), st.sampled_from(GRAD_OPS), st.sampled_from(["list", "tuple", "dict", "named", "six"]))
def test_gradient_ops_match_reference(problem, data, name, outputs_form):
    a, dtype = problem["arrays"], problem["dtype"]
    single = name in ("lstm_block_cell_grad", "LSTMBlockCellGrad")
    if single:
        a = as_single_step(a)
    elif outputs_form == "six":
        outputs_form = "list"
    opts = data.draw(options(a["x"].shape[0]))
    if single:
        opts = dict(opts, seq_len_max=None, seq_len_max_form=None)
    layout = grad_layout(name, opts)
    peep = opts["use_peephole"]
    # Forward outputs from the kernels, in the call's dtype: the gradient trusts them.
    fwd = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], a["wci"], a["wcf"], a["wco"],
                            seq_len_max=opts["seq_len_max"], forget_bias=opts["forget_bias"],
                            cell_clip=opts["cell_clip"], use_peephole=peep, layout=layout)
    outputs = [o[0] for o in fwd] if single else list(fwd)
    fn, args, kwargs = grad_call(name, a, outputs, opts, outputs_form)
    grads = fn(*args, **kwargs)
    if single:
        assert grads._fields == CELL_GRAD_NAMES
        expected = reference_cell_grad(a["x"][0], a["cs_prev"], a["h_prev"], a["w"], a["wci"], a["wcf"], a["wco"],
                                       outputs, a["cs_grad"][0], a["h_grad"][0], peep, layout)
        names = CELL_GRAD_NAMES
    else:
        assert grads._fields == GRAD_NAMES
        with np.errstate(all="ignore"):
            expected = ref.block_lstm_grad(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["wci"], a["wcf"], a["wco"],
                                           outputs, a["cs_grad"], a["h_grad"], opts["seq_len_max"], peep, layout)
        names = GRAD_NAMES
    for k in names:
        assert_matches(getattr(grads, k), expected[k], dtype, GRAD_TOL, k)
    if not peep:
        assert not any(np.any(getattr(grads, k)) for k in ("wci_grad", "wcf_grad", "wco_grad"))


@examples(3)
@given(problems(), st.data())
def test_raw_ops_are_the_functional_ops(problem, data):
    """V1 ops are the functional ops with layout "icfo", V2 with "ifco" and forget_bias 0: bitwise."""
    a = problem["arrays"]
    opts = data.draw(options(a["x"].shape[0]))
    seq = opts["seq_len_max"]
    clip = -1.0 if opts["cell_clip"] is None else opts["cell_clip"]
    peep, fb = opts["use_peephole"], opts["forget_bias"]
    core = (a["x"], a["cs_prev"], a["h_prev"], a["w"])
    peeps = (a["wci"], a["wcf"], a["wco"])
    seq_arg = a["x"].shape[0] if seq is None else seq
    for raw, grad, layout, bias in (("BlockLSTM", "BlockLSTMGrad", "icfo", fb),
                                    ("BlockLSTMV2", "BlockLSTMGradV2", "ifco", 0.0)):
        extra = {"forget_bias": fb} if raw == "BlockLSTM" else {}
        got = getattr(raw_ops, raw)(seq_len_max=seq_arg, x=a["x"], cs_prev=a["cs_prev"], h_prev=a["h_prev"],
                                    w=a["w"], wci=a["wci"], wcf=a["wcf"], wco=a["wco"], b=a["b"], cell_clip=clip,
                                    use_peephole=peep, name="op", **extra)
        want = nblstm.block_lstm(*core, a["b"], *peeps, seq_len_max=seq, forget_bias=bias, cell_clip=clip,
                                 use_peephole=peep, layout=layout)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
        ggot = getattr(raw_ops, grad)(seq_arg, *core, *peeps, a["b"], *got, a["cs_grad"], a["h_grad"], peep)
        gwant = nblstm.block_lstm_grad(*core, want, a["cs_grad"], a["h_grad"], *peeps, seq_len_max=seq,
                                       use_peephole=peep, layout=layout)
        assert all(np.array_equal(g, w) for g, w in zip(ggot, gwant, strict=True))
    x0 = a["x"][0] if a["x"].shape[0] else np.zeros(a["x"].shape[1:], a["x"].dtype)
    cell = raw_ops.LSTMBlockCell(x0, a["cs_prev"], a["h_prev"], a["w"], *peeps, a["b"], forget_bias=fb,
                                 cell_clip=clip, use_peephole=peep)
    want = nblstm.lstm_block_cell(x0, a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, forget_bias=fb,
                                  cell_clip=clip, use_peephole=peep, layout="icfo")
    assert all(np.array_equal(g, w) for g, w in zip(cell, want, strict=True))
    dcs, dh = cell.cs * 0.5, cell.h
    ggot = raw_ops.LSTMBlockCellGrad(x0, a["cs_prev"], a["h_prev"], a["w"], *peeps, a["b"], *cell[:6], dcs, dh, peep)
    gwant = nblstm.lstm_block_cell_grad(x0, a["cs_prev"], a["h_prev"], a["w"], want, dcs, dh, *peeps,
                                        use_peephole=peep, layout="icfo")
    assert all(np.array_equal(g, w) for g, w in zip(ggot, gwant, strict=True))


# --------------------------------------------------------------------------------------------------------------
# Memory orders and views


def fortran(a):
    return np.asfortranarray(a)


def strided(a, axis=0, offset=1):
    """``a`` as a view with doubled stride on ``axis`` into a larger buffer (filled with NaN around it)."""
    if a.ndim == 0:
        return a
    axis %= a.ndim
    shape = list(a.shape)
    shape[axis] = 2 * shape[axis] + offset
    big = np.full(shape, np.nan, a.dtype)
    index = [slice(None)] * a.ndim
    index[axis] = slice(offset, offset + 2 * a.shape[axis], 2)
    view = big[tuple(index)]
    view[...] = a
    return view


def reversed_view(a, axis=0):
    """``a`` as a negative-stride view."""
    if a.ndim == 0:
        return a
    axis %= a.ndim
    index = [slice(None)] * a.ndim
    index[axis] = slice(None, None, -1)
    flipped = np.ascontiguousarray(a[tuple(index)])
    return flipped[tuple(index)]


def transposed_copy(a):
    """A C-ordered array's values in a view of a transposed buffer (neither C nor F for rank 3)."""
    if a.ndim < 2:
        return a.copy()
    perm = tuple(reversed(range(a.ndim)))
    return np.ascontiguousarray(a.transpose(perm)).transpose(perm)


VIEWS = {"C": np.array, "F": fortran, "strided": strided, "reversed": reversed_view, "T": transposed_copy}


def read_only(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


def map_arrays(value, fn):
    """Apply ``fn`` to every array in a (possibly nested) argument."""
    if isinstance(value, np.ndarray):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_arrays(v, fn) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(map_arrays(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(map_arrays(v, fn) for v in value)
    return value


def flat_arrays(value):
    if isinstance(value, np.ndarray):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in flat_arrays(v)]
    return []


@examples(4)
@given(problems(), st.data(), st.sampled_from(FORWARD_OPS + GRAD_OPS), st.booleans())
def test_views_orders_and_read_only_inputs_give_identical_results(problem, data, name, all_read_only):
    a = problem["arrays"]
    single = "cell" in name.lower()
    if single:
        a = as_single_step(a)
    opts = data.draw(options(a["x"].shape[0]))
    if single:
        opts = dict(opts, seq_len_max=None, seq_len_max_form=None)
    if all_read_only:
        # Read-only calls pass every optional array, so that one specialisation per dtype serves them all.
        opts = dict(opts, pass_peepholes=True)
    if name in FORWARD_OPS:
        fn, args, kwargs, _ = forward_call(name, a, opts)
    else:
        layout = grad_layout(name, opts)
        fwd = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], a["wci"], a["wcf"], a["wco"],
                                seq_len_max=opts["seq_len_max"], forget_bias=opts["forget_bias"],
                                cell_clip=opts["cell_clip"], use_peephole=opts["use_peephole"], layout=layout)
        outputs = [o[0] for o in fwd] if single else list(fwd)
        fn, args, kwargs = grad_call(name, a, outputs, opts, data.draw(st.sampled_from(["list", "tuple", "dict"])))
    base = fn(*args, **kwargs)

    if all_read_only:
        view_args = map_arrays(args, read_only)
    else:
        def any_view(arr):
            if arr.ndim == 0:  # a seq_len_max given as a 0-d array
                return arr
            kind = data.draw(st.sampled_from(sorted(VIEWS)))
            if kind in ("strided", "reversed"):
                return VIEWS[kind](arr, data.draw(st.integers(0, 2)))
            return VIEWS[kind](arr)
        view_args = map_arrays(args, any_view)
    snapshot = [arr.copy() for arr in flat_arrays(view_args)]
    got = fn(*view_args, **kwargs)
    for g, b in zip(got, base, strict=True):
        assert g.dtype == b.dtype and g.shape == b.shape
        assert g.flags.c_contiguous and g.flags.writeable
        np.testing.assert_array_equal(g, b)
    for before, after in zip(snapshot, flat_arrays(view_args), strict=True):
        np.testing.assert_array_equal(after, before, err_msg="a caller's array was modified")
        assert after.flags.writeable == (not all_read_only)


# --------------------------------------------------------------------------------------------------------------
# Wrong arguments


def valid_call(name, a, opts):
    """A valid call of any entry point as (function, args list, kwargs dict, names of the array arguments)."""
    if name in FORWARD_OPS:
        fn, args, kwargs, _ = forward_call(name, a, opts)
    else:
        single = "cell" in name.lower()
        shape = (a["x"].shape[1], a["cs_prev"].shape[1]) if single else a["cs_grad"].shape
        outputs = [np.full(shape, 0.5, a["x"].dtype) for _ in OUTPUT_NAMES]
        fn, args, kwargs = grad_call(name, a, outputs, opts, "list")
    return fn, list(args), dict(kwargs)


def array_positions(args):
    """Indices ``(i, j)`` of the array arguments: ``j`` is ``None`` or the position in an outputs list."""
    pos = []
    for i, v in enumerate(args):
        if isinstance(v, np.ndarray) and v.ndim > 0:
            pos.append((i, None))
        elif isinstance(v, list):
            pos.extend((i, j) for j in range(len(v)))
    return pos


def get_arg(args, where):
    i, j = where
    return args[i] if j is None else args[i][j]


def set_arg(args, where, value):
    i, j = where
    if j is None:
        args[i] = value
    else:
        args[i] = list(args[i])
        args[i][j] = value


MUTATIONS = ["rank_up", "rank_down", "shape", "dtype_one", "dtype_all", "not_array", "seq_len_max", "option",
             "no_units", "stream", "outputs", "missing_peephole"]


@examples(8)
@given(problems(), st.data(), st.sampled_from(FORWARD_OPS + GRAD_OPS), st.sampled_from(MUTATIONS))
def test_wrong_arguments_raise_value_or_type_error(problem, data, name, mutation):
    a = problem["arrays"]
    single = "cell" in name.lower()
    raw = name[0].isupper()
    if single:
        a = as_single_step(a)
    opts = data.draw(options(a["x"].shape[0]))
    if single:
        opts = dict(opts, seq_len_max=None, seq_len_max_form=None)
    opts["pass_peepholes"] = True
    fn, args, kwargs = valid_call(name, a, opts)
    fn(*args, **kwargs)  # the unmutated call is valid
    positions = array_positions(args)
    if name == "lstm_block_cell_grad":
        positions.remove((4, 6))  # the step's h is accepted in outputs and not read
    expected = (ValueError, TypeError)
    seq_index = 0 if (raw and not single) else None

    if mutation in ("rank_up", "rank_down", "shape", "dtype_one", "not_array"):
        where = data.draw(st.sampled_from(positions))
        arr = get_arg(args, where)
        if mutation == "rank_up":
            set_arg(args, where, arr[None]) if data.draw(st.booleans()) else set_arg(args, where, arr[..., None])
            expected = ValueError
        elif mutation == "rank_down":
            if arr.ndim == 1:
                set_arg(args, where, np.asarray(arr.reshape(-1)[0]))
            else:
                set_arg(args, where, arr.reshape(arr.shape[:-2] + (arr.shape[-2] * arr.shape[-1],)))
            expected = ValueError
        elif mutation == "shape":
            x_pos = positions[0]  # x is the first array argument of every entry point
            axes = [ax for ax in range(arr.ndim) if not (where == x_pos and arr.ndim == 3 and ax == 0)]
            ax = data.draw(st.sampled_from(axes))
            shape = list(arr.shape)
            shape[ax] += data.draw(st.sampled_from([1, 2]))
            set_arg(args, where, np.zeros(shape, arr.dtype))
            expected = ValueError
        elif mutation == "dtype_one":
            others = [d for d in (np.float16, np.float32, np.float64, np.int32, np.complex64, np.bool_)
                      if d != arr.dtype]
            set_arg(args, where, arr.astype(data.draw(st.sampled_from(others))))
            expected = TypeError
        else:
            bad = data.draw(st.sampled_from(["list", "none", "float", "str", "memoryview", "matrix_like"]))
            # None is valid for the optional arrays of the functional API, and the raw gradient ops
            # take cs_grad=None, h_grad=None as zeros (a leniency TensorFlow does not have).
            optional = where[0] >= 5 if not raw else name in GRAD_OPS and where[0] in (len(args) - 3, len(args) - 2)
            if bad == "none" and where[1] is None and optional:
                bad = "str"
            value = {"list": arr.tolist(), "none": None, "float": 1.0, "str": "x",
                     "memoryview": memoryview(np.ascontiguousarray(arr)) if arr.size else memoryview(b""),
                     "matrix_like": _ArrayLike(arr)}[bad]
            set_arg(args, where, value)
            expected = TypeError
    elif mutation == "dtype_all":
        bad = data.draw(st.sampled_from([np.int64, np.int32, np.complex128, np.bool_, np.longdouble, np.object_]))
        if np.dtype(bad) in (np.dtype(np.float64), np.dtype(np.float32)):  # longdouble may be float64
            bad = np.complex64
        for where in positions:
            set_arg(args, where, get_arg(args, where).astype(bad))
        expected = TypeError
    elif mutation == "seq_len_max":
        steps = a["x"].shape[0]
        bad = data.draw(st.sampled_from(["negative", "too_big", "float", "bool", "str", "vector", "float_array",
                                         "complex"]))
        value = {"negative": -data.draw(st.integers(1, 3)), "too_big": steps + data.draw(st.integers(1, 3)),
                 "float": float(steps), "bool": bool(steps % 2), "str": str(steps), "vector": np.array([steps]),
                 "float_array": np.array(float(steps)), "complex": complex(steps)}[bad]
        expected = ValueError if bad in ("negative", "too_big", "vector") else TypeError
        if single:
            expected = TypeError  # the single-step ops have no seq_len_max
            kwargs["seq_len_max"] = value
        elif seq_index is not None:
            args[seq_index] = value
        else:
            kwargs["seq_len_max"] = value
    elif mutation == "option":
        names = ["use_peephole", "layout", "forget_bias", "cell_clip"]
        if name in GRAD_OPS:
            names = ["use_peephole"] if raw else ["use_peephole", "layout"]
        elif raw:
            names = ["use_peephole", "cell_clip"] + (["forget_bias"] if name != "BlockLSTMV2" else [])
        option = data.draw(st.sampled_from(names))
        bad_values = {
            "use_peephole": [1, 0, None, "yes", 1.0, np.array([True])],
            "layout": ["fico", "", None, 1, b"ifco"],
            "forget_bias": [True, "1", None, complex(1, 0), np.nan, np.array([1.0]), [1.0]],
            "cell_clip": [False, "3", complex(3, 0), np.nan, np.array([1.0])],
        }
        value = data.draw(st.sampled_from(bad_values[option]))
        if raw and name in GRAD_OPS:
            args[-1] = value
        else:
            kwargs[option] = value
    elif mutation == "no_units":
        # H = 0 everywhere, consistently: always an error (an empty cell).
        steps, batch, inputs = a["x"].shape
        a0 = make_arrays(0, steps, batch, inputs, 0, a["x"].dtype, 1.0)
        fn, args, kwargs = valid_call(name, a0, opts)
        expected = ValueError
    elif mutation == "stream":
        if raw:
            kwargs["stream"] = 0
            expected = TypeError  # raw ops have TensorFlow's signature: no stream
        else:
            kwargs["stream"] = object()
            expected = ValueError
    elif mutation == "outputs":
        if name not in ("block_lstm_grad", "lstm_block_cell_grad"):
            kwargs["unknown_argument"] = 1
            expected = TypeError
        else:
            outs = args[4]
            bad = data.draw(st.sampled_from(["short", "array", "dict", "none"]))
            args[4] = {"short": outs[:5], "array": np.stack(outs) if outs[0].size else np.zeros((7, 1)),
                       "dict": dict(zip(OUTPUT_NAMES[1:], outs[1:], strict=True)), "none": None}[bad]
            expected = ValueError if bad in ("short", "dict") else TypeError
    elif mutation == "missing_peephole":
        if raw:
            # TensorFlow's raw ops take every peephole array; None is not an array.
            where = [(i, None) for i, v in enumerate(args) if v is a["wcf"]][0]
            set_arg(args, where, None)
            expected = TypeError
        else:
            kwargs["use_peephole"] = True
            index = 5 if name in FORWARD_OPS else 7
            args[index + data.draw(st.integers(0, 2))] = None
            expected = ValueError
    with pytest.raises(expected):
        fn(*args, **kwargs)


class _ArrayLike:
    """An object with ``__array__`` but neither an ndarray nor a GPU array: rejected, not converted."""

    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a


@examples(1)
@given(st.sampled_from(FORWARD_OPS + GRAD_OPS), st.sampled_from(DTYPES), st.integers(0, 3), st.integers(0, 3))
def test_empty_batch_or_time_gives_empty_outputs_of_the_right_shapes(name, dtype, steps, batch):
    a = make_arrays(0, steps, batch, 2, 3, dtype, 1.0)
    single = "cell" in name.lower()
    if single:
        a = as_single_step(a)
    opts = {"seq_len_max": None, "seq_len_max_form": None, "forget_bias": 1.0, "cell_clip": 3.0,
            "use_peephole": True, "layout": "ifco", "pass_peepholes": True}
    fn, args, kwargs = valid_call(name, a, opts)
    out = fn(*args, **kwargs)
    expected_shapes = {
        "forward_seq": [(steps, batch, 3)] * 7,
        "forward_cell": [(batch, 3)] * 7,
        "grad_seq": [(steps, batch, 2), (batch, 3), (batch, 3), (5, 12), (3,), (3,), (3,), (12,)],
        "grad_cell": [(batch, 3), (batch, 12), (3,), (3,), (3,)],
    }["{}_{}".format("grad" if name in GRAD_OPS else "forward", "cell" if single else "seq")]
    assert [o.shape for o in out] == expected_shapes
    assert all(o.dtype == np.dtype(dtype) for o in out)
    if batch == 0 or (steps == 0 and not single):
        assert not any(np.any(o) for o in out), "no step or no example: every output and gradient is zero"


@pytest.mark.parametrize("name", ["block_lstm", "lstm_block_cell", "BlockLSTM", "BlockLSTMV2", "LSTMBlockCell"])
@pytest.mark.parametrize("batch", [0, 2])
def test_bias_none_raises_type_error(name, batch):
    a = make_arrays(0, 2, batch, 3, 4, np.float64, 1.0)
    opts = {"seq_len_max": None, "seq_len_max_form": None, "forget_bias": 1.0, "cell_clip": 3.0,
            "use_peephole": False, "layout": "ifco", "pass_peepholes": True}
    fn, args, kwargs, _ = forward_call(name, as_single_step(a) if "cell" in name.lower() else a, opts)
    args = [None if v is a["b"] else v for v in args]
    with pytest.raises(TypeError, match="b must be"):
        fn(*args, **kwargs)
