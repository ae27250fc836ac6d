"""nblstm against stored TensorFlow 2.21 and PyTorch results (tests/fixtures/).

The fixtures were made by ``scripts/make_tf_fixtures.py``; these tests need
neither TensorFlow nor PyTorch. Tolerances are those of TensorFlow's own
tests (docs/specification.rst, "Tolerances"): float32 ``rtol = atol = 1e-6`` forward and ``1e-5``
for gradients, float16 ``rtol = 8e-3, atol = 8e-4`` forward and ``1e-2`` for
gradients.

TensorFlow leaves ``i, f, o, ci, co`` uninitialised from ``seq_len_max`` on
(nblstm zero-fills them), so those five are compared only for
``t < seq_len_max``.
"""

import json
import math
import pathlib

import numpy as np
import pytest

from nblstm import raw_ops

FIXTURES = pathlib.Path(__file__).parent / "fixtures"

FORWARD_TOL = {"float16": (8e-3, 8e-4), "float32": (1e-6, 1e-6), "float64": (1e-12, 1e-12)}
GRAD_TOL = {"float16": (1e-2, 1e-2), "float32": (1e-5, 1e-5), "float64": (1e-10, 1e-10)}
# TensorFlow's own LSTMCell and PyTorch's nn.LSTM use other GEMMs and other
# formulas (e.g. tanh-based sigmoid); their float32 results are compared a
# little more loosely than the raw ops, whose kernels nblstm reproduces.
PEER_TOL = {"float16": (2e-2, 2e-2), "float32": (1e-5, 1e-5), "float64": (1e-10, 1e-10)}

OUTPUT_NAMES = ("i", "cs", "f", "o", "ci", "co", "h")
UNINITIALISED_IN_TF = ("i", "f", "o", "ci", "co")
INPUT_NAMES = ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")
GRAD_NAMES = ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad", "wco_grad", "b_grad")
CELL_GRAD_NAMES = ("cs_prev_grad", "dicfo", "wci_grad", "wcf_grad", "wco_grad")


def load_packed(path):
    """Read a fixture file of packed arrays (``tf_raw_ops.npz``).

    Returns
    -------
    index : dict
        The JSON index: ``"cases"``, ``"autodiff"``, ``"versions"``...
    arrays : callable
        ``arrays(meta)`` returns the dict of a case's arrays.
    """
    with np.load(path) as data:
        index = json.loads(str(data["index"]))
        buffers = {k[len("data/"):]: data[k] for k in data.files if k.startswith("data/")}

    def arrays(meta):
        return {name: buffers[dtype][offset:offset + math.prod(shape)].reshape(shape)
                for name, (dtype, offset, shape) in meta["arrays"].items()}

    return index, arrays


def load_keyed(path):
    """Read a fixture file of ``"<case>/<name>"`` keys (``tf_lstmcell.npz``, ``torch_lstm.npz``).

    Returns
    -------
    index : dict
    cases : dict
        ``{case name: {array name: array}}``.
    """
    with np.load(path) as data:
        index = json.loads(str(data["index"]))
        cases = {}
        for key in data.files:
            if key != "index":
                case, name = key.split("/", 1)
                cases.setdefault(case, {})[name] = data[key]
    return index, cases


RAW_INDEX, RAW_ARRAYS = load_packed(FIXTURES / "tf_raw_ops.npz")
SEQ_CASES = [c for c in RAW_INDEX["cases"] if c["op"] in ("BlockLSTM", "BlockLSTMV2")]
CELL_CASES = [c for c in RAW_INDEX["cases"] if c["op"] == "LSTMBlockCell"]


def _case_id(meta):
    shape = "x".join(str(n) for n in meta["shape"])
    parts = [meta["name"], meta["op"], meta["dtype"], shape]
    if meta["defaults"]:
        parts.append("defaults")
    else:
        parts += [f"peep{int(meta['use_peephole'])}", f"clip{meta['cell_clip']:g}"]
        if meta["op"] != "BlockLSTMV2":
            parts.append(f"fb{meta['forget_bias']:g}")
    if "seq_len_max" in meta:
        parts.append(f"slm{meta['seq_len_max']}")
    return "-".join(parts)


def assert_close(actual, expected, tol, what):
    """``assert_allclose`` with the dtype checked and a readable name."""
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, TensorFlow's is {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape}, expected {expected.shape}"
    rtol, atol = tol
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol,
                               err_msg=what)


def _attrs(meta, with_forget_bias):
    if meta["defaults"]:
        return {}
    attrs = {"cell_clip": meta["cell_clip"], "use_peephole": meta["use_peephole"]}
    if with_forget_bias:
        attrs["forget_bias"] = meta["forget_bias"]
    return attrs


# --------------------------------------------------------------------------
# BlockLSTM, BlockLSTMV2, BlockLSTMGrad, BlockLSTMGradV2
# --------------------------------------------------------------------------


@pytest.mark.parametrize("meta", SEQ_CASES, ids=_case_id)
def test_block_lstm_forward(meta):
    a = RAW_ARRAYS(meta)
    op = getattr(raw_ops, meta["op"])
    slm = meta["seq_len_max"]
    out = op(seq_len_max=np.int64(slm), **{k: a[k] for k in INPUT_NAMES},
             **_attrs(meta, meta["op"] == "BlockLSTM"))
    tol = FORWARD_TOL[meta["dtype"]]
    for name in OUTPUT_NAMES:
        got = getattr(out, name)
        if name in UNINITIALISED_IN_TF:
            assert_close(got[:slm], a[name][:slm], tol, f"{name}[:{slm}]")
            # nblstm's own rule past seq_len_max (TensorFlow's values there are garbage).
            assert not np.any(got[slm:]), f"{name} past seq_len_max is not zero"
        else:
            assert_close(got, a[name], tol, name)


@pytest.mark.parametrize("meta", SEQ_CASES, ids=_case_id)
def test_block_lstm_grad(meta):
    a = RAW_ARRAYS(meta)
    op = getattr(raw_ops, meta["grad_op"])
    grads = op(seq_len_max=np.int64(meta["seq_len_max"]), **{k: a[k] for k in INPUT_NAMES + OUTPUT_NAMES},
               cs_grad=a["cs_grad"], h_grad=a["h_grad"], use_peephole=meta["use_peephole"])
    tol = GRAD_TOL[meta["dtype"]]
    for name in GRAD_NAMES:
        assert_close(getattr(grads, name), a[name], tol, name)


@pytest.mark.parametrize("meta", [m for m in SEQ_CASES if m["seq_len_max"] < m["shape"][0]], ids=_case_id)
def test_block_lstm_grad_ignores_steps_past_seq_len_max(meta):
    """TensorFlow feeds its uninitialised outputs to the gradient op: they must not matter."""
    a = RAW_ARRAYS(meta)
    slm = meta["seq_len_max"]
    poisoned = {k: a[k].copy() for k in (*UNINITIALISED_IN_TF, "cs_grad", "h_grad")}
    for value in poisoned.values():
        value[slm:] = np.nan
    args = {k: a[k] for k in INPUT_NAMES + OUTPUT_NAMES}
    args.update(poisoned)
    grads = getattr(raw_ops, meta["grad_op"])(seq_len_max=np.int64(slm), **args, use_peephole=meta["use_peephole"])
    tol = GRAD_TOL[meta["dtype"]]
    for name in GRAD_NAMES:
        assert_close(getattr(grads, name), a[name], tol, name)


# --------------------------------------------------------------------------
# LSTMBlockCell, LSTMBlockCellGrad
# --------------------------------------------------------------------------


@pytest.mark.parametrize("meta", CELL_CASES, ids=_case_id)
def test_lstm_block_cell(meta):
    a = RAW_ARRAYS(meta)
    out = raw_ops.LSTMBlockCell(**{k: a[k] for k in INPUT_NAMES}, **_attrs(meta, True))
    tol = FORWARD_TOL[meta["dtype"]]
    for name in OUTPUT_NAMES:
        assert_close(getattr(out, name), a[name], tol, name)


@pytest.mark.parametrize("meta", CELL_CASES, ids=_case_id)
def test_lstm_block_cell_grad(meta):
    a = RAW_ARRAYS(meta)
    grads = raw_ops.LSTMBlockCellGrad(**{k: a[k] for k in INPUT_NAMES + OUTPUT_NAMES[:6]}, cs_grad=a["cs_grad"],
                                      h_grad=a["h_grad"], use_peephole=meta["use_peephole"])
    tol = GRAD_TOL[meta["dtype"]]
    for name in CELL_GRAD_NAMES:
        assert_close(getattr(grads, name), a[name], tol, name)


def test_fixture_coverage():
    """The fixture spans what the task asks for: both ops and dtypes, clips, seq_len_max, odd sizes."""
    seen = {(m["op"], m["dtype"]) for m in RAW_INDEX["cases"]}
    for op in ("BlockLSTM", "BlockLSTMV2", "LSTMBlockCell"):
        for dtype in ("float32", "float16"):
            assert (op, dtype) in seen
    seq = SEQ_CASES
    assert {m["seq_len_max"] == 0 for m in seq} == {True, False}
    assert any(0 < m["seq_len_max"] < m["shape"][0] for m in seq)
    assert {m["use_peephole"] for m in seq} == {True, False}
    clips = {m["cell_clip"] for m in seq}
    assert {0.0, -1.0} <= clips and any(c > 0 for c in clips)
    assert any(m["clipped_fraction"] > 0.1 for m in seq)
    for axis in range(4):
        assert any(m["shape"][axis] == 1 for m in seq), f"no case with size 1 on axis {'TBIH'[axis]}"


# --------------------------------------------------------------------------
# TensorFlow's autodiff through the fused ops (docs/specification.rst, "TensorFlow bugs not copied")
# --------------------------------------------------------------------------

AUTODIFF = {m["op"]: m for m in RAW_INDEX["autodiff"]}


@pytest.mark.parametrize("op", ["BlockLSTM", "BlockLSTMV2"])
def test_grad_matches_tf_raw_grad_op_of_autodiff_case(op):
    meta = AUTODIFF[op]
    a = RAW_ARRAYS(meta)
    grad_op = getattr(raw_ops, op.replace("BlockLSTM", "BlockLSTMGrad"))
    grads = grad_op(seq_len_max=np.int64(meta["seq_len_max"]), **{k: a[k] for k in INPUT_NAMES + OUTPUT_NAMES},
                    cs_grad=a["cs_grad"], h_grad=a["h_grad"], use_peephole=True)
    for name in GRAD_NAMES:
        assert_close(getattr(grads, name), a[name], GRAD_TOL["float32"], name)


def test_tf_autodiff_facts():
    """BlockLSTM's autodiff equals its raw gradient op; BlockLSTMV2's does not (TensorFlow's bug).

    TensorFlow's registered gradient of BlockLSTMV2 calls the ICFO gradient
    op on the IFCO weights: nblstm's BlockLSTMGrad fed the same IFCO arrays
    reproduces TensorFlow's wrong autodiff result.
    """
    assert AUTODIFF["BlockLSTM"]["autodiff_matches_raw_op"]
    assert not AUTODIFF["BlockLSTMV2"]["autodiff_matches_raw_op"]
    meta = AUTODIFF["BlockLSTMV2"]
    a = RAW_ARRAYS(meta)
    wrong = raw_ops.BlockLSTMGrad(seq_len_max=np.int64(meta["seq_len_max"]),
                                  **{k: a[k] for k in INPUT_NAMES + OUTPUT_NAMES}, cs_grad=a["cs_grad"],
                                  h_grad=a["h_grad"], use_peephole=True)
    for name in INPUT_NAMES:
        assert_close(getattr(wrong, name + "_grad"), a[f"autodiff_{name}_grad"], GRAD_TOL["float32"],
                     f"autodiff {name}_grad")


# --------------------------------------------------------------------------
# The TF1 LSTMCell and torch.nn.LSTM fixtures, through the fused ops where a
# mapping exists (docs/specification.rst, "LSTMCell" and "Converting weights"). They check the fixtures and the
# mapping; the LSTMCell facade has its own tests on the same files.
# --------------------------------------------------------------------------

LSTMCELL_INDEX, LSTMCELL_CASES = load_keyed(FIXTURES / "tf_lstmcell.npz")
TORCH_INDEX, TORCH_CASES = load_keyed(FIXTURES / "torch_lstm.npz")


def _blocklstm_mappable(meta):
    clip = meta["cell_clip"]
    return meta["num_proj"] is None and meta["activation"] is None and (clip is None or clip > 0)


def _total_grads(R, Rh, Rc):
    """``h_grad`` and ``cs_grad`` of the loss ``sum(out * R) + sum(h_T * Rh) + sum(c_T * Rc)``."""
    h_grad = R.copy()
    h_grad[-1] += Rh
    cs_grad = np.zeros(R.shape[:2] + Rc.shape[-1:], R.dtype)
    cs_grad[-1] = Rc
    return h_grad, cs_grad


@pytest.mark.parametrize("meta", [m for m in LSTMCELL_INDEX["cases"] if _blocklstm_mappable(m)],
                         ids=lambda m: m["name"])
def test_tf_lstmcell_fixture_through_block_lstm(meta):
    a = LSTMCELL_CASES[meta["name"]]
    H = meta["num_units"]
    peep = meta["use_peepholes"]
    zeros = np.zeros(H, a["x"].dtype)
    peepholes = dict(wci=a["w_i_diag"], wcf=a["w_f_diag"], wco=a["w_o_diag"]) if peep else dict(
        wci=zeros, wcf=zeros, wco=zeros)
    clip = -1.0 if meta["cell_clip"] is None else meta["cell_clip"]
    args = dict(x=a["x"], cs_prev=a["c0"], h_prev=a["h0"], w=a["kernel"], b=a["bias"], **peepholes)
    out = raw_ops.BlockLSTM(seq_len_max=meta["steps"], **args, forget_bias=meta["forget_bias"], cell_clip=clip,
                            use_peephole=peep)
    tol = PEER_TOL[meta["dtype"]]
    assert_close(out.h, a["outputs"], tol, "outputs")
    assert_close(out.cs, a["c"], tol, "c")
    if meta["cell_clip"] is not None:
        return  # LSTMCell differentiates the clip, the fused ops pass through it
    h_grad, cs_grad = _total_grads(a["R"], a["Rh"], a["Rc"])
    grads = raw_ops.BlockLSTMGrad(seq_len_max=meta["steps"], **args, **out._asdict(), cs_grad=cs_grad,
                                  h_grad=h_grad, use_peephole=peep)
    pairs = {"x_grad": "x", "cs_prev_grad": "c0", "h_prev_grad": "h0", "w_grad": "kernel", "b_grad": "bias"}
    if peep:
        pairs.update(wci_grad="w_i_diag", wcf_grad="w_f_diag", wco_grad="w_o_diag")
    for ours, theirs in pairs.items():
        assert_close(getattr(grads, ours), a["grad/" + theirs], PEER_TOL[meta["dtype"]], ours)


@pytest.mark.parametrize("meta", [m for m in TORCH_INDEX["cases"] if m["proj_size"] == 0], ids=lambda m: m["name"])
def test_torch_lstm_fixture_through_block_lstm_v2(meta):
    a = TORCH_CASES[meta["name"]]
    I, H = meta["input_size"], meta["hidden_size"]
    w = np.concatenate([a["weight_ih_l0"].T, a["weight_hh_l0"].T], axis=0)
    b = a["bias_ih_l0"] + a["bias_hh_l0"]
    zeros = np.zeros(H, w.dtype)
    args = dict(x=a["x"], cs_prev=a["c0"][0], h_prev=a["h0"][0], w=w, b=b, wci=zeros, wcf=zeros, wco=zeros)
    out = raw_ops.BlockLSTMV2(seq_len_max=meta["steps"], **args)
    tol = PEER_TOL[meta["dtype"]]
    assert_close(out.h, a["output"], tol, "output")
    assert_close(out.h[-1], a["h_n"][0], tol, "h_n")
    assert_close(out.cs[-1], a["c_n"][0], tol, "c_n")
    h_grad, cs_grad = _total_grads(a["R"], a["Rh"][0], a["Rc"][0])
    grads = raw_ops.BlockLSTMGradV2(seq_len_max=meta["steps"], **args, **out._asdict(), cs_grad=cs_grad,
                                    h_grad=h_grad, use_peephole=False)
    assert_close(grads.x_grad, a["grad/x"], tol, "grad x")
    assert_close(grads.h_prev_grad, a["grad/h0"][0], tol, "grad h0")
    assert_close(grads.cs_prev_grad, a["grad/c0"][0], tol, "grad c0")
    assert_close(grads.w_grad[:I].T, a["grad/weight_ih_l0"], tol, "grad weight_ih_l0")
    assert_close(grads.w_grad[I:].T, a["grad/weight_hh_l0"], tol, "grad weight_hh_l0")
    assert_close(grads.b_grad, a["grad/bias_ih_l0"], tol, "grad bias_ih_l0")
    assert_close(grads.b_grad, a["grad/bias_hh_l0"], tol, "grad bias_hh_l0")
