"""Every validation rule: a wrong call raises the right error, naming the argument."""

import numpy as np
import pytest

import nblstm
from nblstm import raw_ops
from tests.helpers import make_problem

T, B, I, H = 3, 2, 4, 5


@pytest.fixture
def p():
    return make_problem(np.random.default_rng(0), T, B, I, H, dtype=np.float32)


def fwd(p, **changes):
    q = {**p, **changes}
    options = {k: q.pop(k) for k in list(q) if k not in ("x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco")}
    return nblstm.block_lstm(q["x"], q["cs_prev"], q["h_prev"], q["w"], q["b"], q["wci"], q["wcf"], q["wco"],
                             **options)


@pytest.mark.parametrize(
    "name, bad, pattern",
    [
        ("x", np.zeros((T, B), np.float32), r"x must have rank 3"),
        ("cs_prev", np.zeros((B, H, 1), np.float32), r"cs_prev must have rank 2"),
        ("w", np.zeros(4 * H, np.float32), r"w must have rank 2"),
        ("b", np.zeros((1, 4 * H), np.float32), r"b must have rank 1"),
        ("wco", np.zeros((H, 1), np.float32), r"wco must have rank 1"),
        ("cs_prev", np.zeros((B + 1, H), np.float32), r"cs_prev has shape \(3, 5\); expected \(2, 5\)"),
        ("h_prev", np.zeros((B, H + 1), np.float32), r"h_prev has shape \(2, 6\); expected \(2, 5\)"),
        ("w", np.zeros((I + H + 1, 4 * H), np.float32), r"w has shape \(10, 20\); expected \(9, 20\)"),
        ("w", np.zeros((I + H, 4 * H + 4), np.float32), r"w has shape"),
        ("b", np.zeros(4 * H - 1, np.float32), r"b has shape \(19,\); expected \(20,\)"),
        ("wci", np.zeros(H + 1, np.float32), r"wci has shape"),
        ("wcf", np.zeros(H - 1, np.float32), r"wcf has shape"),
        ("cs_prev", np.zeros((B, 0), np.float32), r"cell size"),
    ],
)
def test_wrong_rank_or_shape_raises_value_error(p, name, bad, pattern):
    with pytest.raises(ValueError, match=pattern):
        fwd(p, **{name: bad})


@pytest.mark.parametrize("name", ["x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco"])
def test_mismatched_dtype_raises_type_error(p, name):
    # The dtype of x sets the expectation; the message names the odd one out.
    expected = r"cs_prev has dtype float32; expected float64 \(the dtype of x\)" if name == "x" else \
        rf"{name} has dtype float64; expected float32 \(the dtype of x\)"
    with pytest.raises(TypeError, match=expected):
        fwd(p, **{name: p[name].astype(np.float64)})


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.complex64, np.bool_, object])
def test_unsupported_dtype_raises_type_error(p, dtype):
    q = {k: v.astype(dtype) for k, v in p.items()}
    with pytest.raises(TypeError, match=r"x has dtype .*; expected float16, float32 or float64"):
        fwd(q)


@pytest.mark.parametrize("bad", [[[1.0]], 3.0, None, "x"])
def test_non_array_raises_type_error(p, bad):
    with pytest.raises(TypeError, match=r"x must be a NumPy array or an array on a GPU"):
        fwd(p, x=bad)
    with pytest.raises(TypeError, match=r"cs_prev must be a NumPy array"):
        fwd(p, cs_prev=[[0.0] * H] * B)


@pytest.mark.parametrize(
    "value, error, pattern",
    [
        (-1, ValueError, r"seq_len_max must be in \[0, T\] = \[0, 3\].*got -1"),
        (T + 1, ValueError, r"seq_len_max must be in \[0, T\]"),
        (2.0, TypeError, r"seq_len_max must be an integer scalar, got float"),
        (True, TypeError, r"seq_len_max must be an integer scalar, got bool"),
        ("2", TypeError, r"seq_len_max must be an integer scalar"),
        (np.array([2]), ValueError, r"seq_len_max must be a scalar"),
        (np.array(2.0), TypeError, r"seq_len_max must be an integer scalar"),
    ],
)
def test_bad_seq_len_max(p, value, error, pattern):
    with pytest.raises(error, match=pattern):
        fwd(p, seq_len_max=value)


@pytest.mark.parametrize("value", [2, np.int64(2), np.int32(2), np.uint8(2), np.array(2, np.int64)])
def test_integer_scalars_are_accepted_for_seq_len_max(p, value):
    out = fwd(p, seq_len_max=value)
    assert out.h[1].any() and not out.h[2].any()


def test_bad_scalar_options(p):
    with pytest.raises(TypeError, match=r"forget_bias must be a real number, got str"):
        fwd(p, forget_bias="1")
    with pytest.raises(TypeError, match=r"cell_clip must be a real number"):
        fwd(p, cell_clip=np.zeros(1))
    with pytest.raises(ValueError, match=r"cell_clip must not be NaN"):
        fwd(p, cell_clip=float("nan"))
    with pytest.raises(TypeError, match=r"use_peephole must be a bool, got int"):
        fwd(p, use_peephole=1)
    with pytest.raises(ValueError, match=r"layout must be one of"):
        fwd(p, layout="iofc")
    with pytest.raises(TypeError, match=r"layout must be a str"):
        fwd(p, layout=0)
    with pytest.raises(ValueError, match=r"stream applies to GPU arrays only"):
        fwd(p, stream=object())


def test_precision_is_checked_and_reduced_ones_are_refused_on_the_cpu(p):
    with pytest.raises(ValueError, match=r"precision must be one of \('exact', 'tf32', 'fp16'\), got 'bf16'"):
        fwd(p, precision="bf16")
    with pytest.raises(TypeError, match=r"precision must be one of"):
        fwd(p, precision=None)
    for precision in ("tf32", "fp16"):
        with pytest.raises(ValueError, match=rf"precision='{precision}' applies to GPU arrays only"):
            fwd(p, precision=precision)
    out = fwd(p, precision="EXACT")
    assert np.array_equal(out.h, fwd(p).h)
    with pytest.raises(ValueError, match=r"precision='tf32' applies to GPU arrays only"):
        nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], out, h_grad=out.h, precision="tf32")
    with pytest.raises(ValueError, match=r"precision='fp16' applies to GPU arrays only"):
        nblstm.lstm_block_cell(p["x"][0], p["cs_prev"], p["h_prev"], p["w"], p["b"], precision="fp16")
    cell = nblstm.LSTMCell(H, precision="tf32", seed=0)
    assert cell.get_config()["precision"] == "tf32"
    assert nblstm.LSTMCell(**cell.get_config()).precision == "tf32"
    with pytest.raises(ValueError, match=r"precision='tf32' applies to GPU arrays only"):
        cell.run(p["x"])
    with pytest.raises(ValueError, match=r"precision must be one of"):
        nblstm.LSTM(I, H, precision="half")
    layer = nblstm.LSTM(I, H, precision="fp16")
    assert all(c.precision == "fp16" for c in layer.cells)
    with pytest.raises(ValueError, match=r"precision='fp16' applies to GPU arrays only"):
        layer(p["x"])


def test_missing_peepholes_with_use_peephole(p):
    with pytest.raises(ValueError, match=r"missing: wci, wco"):
        nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], wcf=p["wcf"], use_peephole=True)
    # Without peepholes they may be omitted.
    nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"])


def test_grad_validation(p):
    out = fwd(p)
    args = (p["x"], p["cs_prev"], p["h_prev"], p["w"])
    with pytest.raises(ValueError, match=r"cs has shape \(3, 2, 4\); expected \(3, 2, 5\)"):
        bad = list(out)
        bad[1] = np.zeros((T, B, H - 1), np.float32)
        nblstm.block_lstm_grad(*args, bad)
    with pytest.raises(ValueError, match=r"outputs must hold the 7 forward outputs"):
        nblstm.block_lstm_grad(*args, list(out)[:6])
    with pytest.raises(TypeError, match=r"outputs must be the tuple of forward outputs"):
        nblstm.block_lstm_grad(*args, out.h)
    with pytest.raises(ValueError, match=r"h_grad has shape"):
        nblstm.block_lstm_grad(*args, out, h_grad=np.zeros((T + 1, B, H), np.float32))
    with pytest.raises(TypeError, match=r"cs_grad has dtype float64"):
        nblstm.block_lstm_grad(*args, out, cs_grad=np.zeros((T, B, H)))
    with pytest.raises(ValueError, match=r"seq_len_max must be in"):
        nblstm.block_lstm_grad(*args, out, seq_len_max=T + 1)


def test_cell_validation(p):
    x = p["x"][0]
    with pytest.raises(ValueError, match=r"x must have rank 2"):
        nblstm.lstm_block_cell(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"])
    with pytest.raises(ValueError, match=r"cs_prev has shape"):
        nblstm.lstm_block_cell(x[:1], p["cs_prev"], p["h_prev"], p["w"], p["b"])
    step = nblstm.lstm_block_cell(x, p["cs_prev"], p["h_prev"], p["w"], p["b"])
    with pytest.raises(ValueError, match=r"outputs must hold the 6 forward outputs"):
        nblstm.lstm_block_cell_grad(x, p["cs_prev"], p["h_prev"], p["w"], step[:5])
    with pytest.raises(ValueError, match=r"co has shape"):
        nblstm.lstm_block_cell_grad(x, p["cs_prev"], p["h_prev"], p["w"], (*step[:5], np.zeros((B, 1), np.float32)))


def test_raw_ops_check_every_argument(p):
    out = raw_ops.BlockLSTMV2(seq_len_max=T, x=p["x"], cs_prev=p["cs_prev"], h_prev=p["h_prev"], w=p["w"],
                              wci=p["wci"], wcf=p["wcf"], wco=p["wco"], b=p["b"])
    assert out._fields == ("i", "cs", "f", "o", "ci", "co", "h")
    kwargs = dict(seq_len_max=T, x=p["x"], cs_prev=p["cs_prev"], h_prev=p["h_prev"], w=p["w"], wci=p["wci"],
                  wcf=p["wcf"], wco=p["wco"], b=p["b"], **out._asdict(), cs_grad=out.cs, h_grad=out.h,
                  use_peephole=False)
    grads = raw_ops.BlockLSTMGradV2(**kwargs)
    assert grads._fields == ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad",
                             "wco_grad", "b_grad")
    with pytest.raises(ValueError, match=r"b has shape"):
        raw_ops.BlockLSTMGrad(**{**kwargs, "b": np.zeros(3, np.float32)})
    with pytest.raises(TypeError, match=r"wci must be a NumPy array"):
        raw_ops.BlockLSTM(T, p["x"], p["cs_prev"], p["h_prev"], p["w"], None, p["wcf"], p["wco"], p["b"])
    step = raw_ops.LSTMBlockCell(x=p["x"][0], cs_prev=p["cs_prev"], h_prev=p["h_prev"], w=p["w"], wci=p["wci"],
                                 wcf=p["wcf"], wco=p["wco"], b=p["b"])
    cell_kwargs = dict(x=p["x"][0], cs_prev=p["cs_prev"], h_prev=p["h_prev"], w=p["w"], wci=p["wci"], wcf=p["wcf"],
                       wco=p["wco"], b=p["b"], i=step.i, cs=step.cs, f=step.f, o=step.o, ci=step.ci, co=step.co,
                       cs_grad=step.cs, h_grad=step.h, use_peephole=True)
    g = raw_ops.LSTMBlockCellGrad(**cell_kwargs)
    assert g._fields == ("cs_prev_grad", "dicfo", "wci_grad", "wcf_grad", "wco_grad")
    with pytest.raises(ValueError, match=r"b has shape"):
        raw_ops.LSTMBlockCellGrad(**{**cell_kwargs, "b": np.zeros(1, np.float32)})


def test_raw_op_defaults_follow_tensorflow(p):
    args = (T, p["x"] * 10, p["cs_prev"] * 10, p["h_prev"], p["w"], p["wci"], p["wcf"], p["wco"], p["b"])
    v1 = raw_ops.BlockLSTM(*args)  # forget_bias=1.0, cell_clip=3.0
    assert np.abs(v1.cs).max() <= 3.0
    explicit = nblstm.block_lstm(*args[1:5], args[8], seq_len_max=T, forget_bias=1.0, cell_clip=3.0, layout="icfo")
    for a, b in zip(v1, explicit):
        np.testing.assert_array_equal(a, b)
    v2 = raw_ops.BlockLSTMV2(*args)  # cell_clip=0.0: off, forget_bias 0
    explicit = nblstm.block_lstm(*args[1:5], args[8], seq_len_max=T)
    for a, b in zip(v2, explicit):
        np.testing.assert_array_equal(a, b)


def test_caller_arrays_are_never_modified(p):
    snapshot = {k: v.copy() for k, v in p.items()}
    out = fwd(p, use_peephole=True, cell_clip=0.5)
    outs = [a.copy() for a in out]
    nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], out, out.cs, out.h, p["wci"], p["wcf"],
                           p["wco"], use_peephole=True)
    for k, v in p.items():
        np.testing.assert_array_equal(v, snapshot[k])
    for a, b in zip(out, outs):
        np.testing.assert_array_equal(a, b)


def test_raw_gradient_ops_need_every_incoming_gradient(p):
    out = raw_ops.BlockLSTMV2(T, p["x"], p["cs_prev"], p["h_prev"], p["w"], p["wci"], p["wcf"], p["wco"], p["b"])
    args = (T, p["x"], p["cs_prev"], p["h_prev"], p["w"], p["wci"], p["wcf"], p["wco"], p["b"], *out)
    with pytest.raises(TypeError, match=r"cs_grad must be a NumPy array"):
        raw_ops.BlockLSTMGradV2(*args, None, out.h, False)
    with pytest.raises(TypeError, match=r"h_grad must be a NumPy array"):
        raw_ops.BlockLSTMGrad(*args, out.cs, None, False)
    step = raw_ops.LSTMBlockCell(p["x"][0], p["cs_prev"], p["h_prev"], p["w"], p["wci"], p["wcf"], p["wco"], p["b"])
    with pytest.raises(TypeError, match=r"h_grad must be a NumPy array"):
        raw_ops.LSTMBlockCellGrad(p["x"][0], p["cs_prev"], p["h_prev"], p["w"], p["wci"], p["wcf"], p["wco"], p["b"],
                                  *step[:6], step.cs, None, False)
