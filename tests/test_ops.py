"""The fused ops on the CPU against the float64 reference and finite differences."""

import numpy as np
import pytest

import nblstm
from nblstm import reference as ref
from tests.helpers import FORWARD_TOL, GRAD_NAMES, GRAD_TOL, OUTPUT_NAMES, assert_close, make_problem

SHAPES = [(1, 1, 1, 1), (4, 3, 5, 6), (6, 2, 1, 3), (3, 5, 4, 17), (1, 1, 3, 1), (1, 1, 3, 5)]
DTYPES = [np.float64, np.float32, np.float16]


def run_both(p, dtype, seq_len_max, forget_bias, cell_clip, use_peephole, layout):
    out = nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"],
                            seq_len_max=seq_len_max, forget_bias=forget_bias, cell_clip=cell_clip,
                            use_peephole=use_peephole, layout=layout)
    expected = ref.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"],
                              seq_len_max, forget_bias, -1.0 if cell_clip is None else cell_clip, use_peephole, layout)
    return out, expected


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", ["ifco", "icfo"])
@pytest.mark.parametrize(
    "forget_bias, cell_clip, use_peephole",
    [(0.0, None, False), (1.0, 0.4, True), (0.5, -2.0, True), (1.0, 0.0, False), (0.0, 3.0, False)],
)
def test_forward_and_backward_match_reference(dtype, shape, layout, forget_bias, cell_clip, use_peephole):
    rng = np.random.default_rng(abs(hash((shape, layout, forget_bias, cell_clip))) % 2**32)
    p = make_problem(rng, *shape, dtype=dtype)
    steps = shape[0]
    for seq_len_max in sorted({0, steps // 2, steps}):
        out, expected = run_both(p, dtype, seq_len_max, forget_bias, cell_clip, use_peephole, layout)
        for name in OUTPUT_NAMES:
            got = getattr(out, name)
            assert got.dtype == dtype and got.shape == expected[name].shape
            assert_close(got, expected[name], dtype, FORWARD_TOL, name)
            assert not got[seq_len_max:].any(), f"{name} must be zero past seq_len_max"
        cs_grad = rng.standard_normal(out.cs.shape).astype(dtype)
        h_grad = rng.standard_normal(out.h.shape).astype(dtype)
        grads = nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], out, cs_grad, h_grad, p["wci"],
                                       p["wcf"], p["wco"], seq_len_max=seq_len_max, use_peephole=use_peephole,
                                       layout=layout)
        # The reference reads the same (rounded) forward outputs the kernel was given.
        expected_grads = ref.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["wci"], p["wcf"], p["wco"],
                                             out, cs_grad, h_grad, seq_len_max, use_peephole, layout)
        for name in GRAD_NAMES:
            got = getattr(grads, name)
            assert got.dtype == dtype and got.shape == expected_grads[name].shape, name
            scale = max(1.0, np.abs(expected_grads[name]).max(initial=0.0))
            assert_close(got / scale, expected_grads[name] / scale, dtype, GRAD_TOL, name)
        if not use_peephole:
            for name in ("wci_grad", "wcf_grad", "wco_grad"):
                assert not getattr(grads, name).any()


def _loss_and_fd(p, r_cs, r_h, seq_len_max, forget_bias, cell_clip, use_peephole, layout, offsets=None, eps=1e-6):
    """Central differences of ``sum(cs * r_cs) + sum(h * r_h)`` for every input and weight.

    With ``offsets`` (``clip(cs) - cs`` per step, held fixed), the derivative is
    the straight-through one: clipping moves the cell by a constant.
    """

    def loss(q):
        c, h = q["cs_prev"], q["h_prev"]
        total = 0.0
        blocks = {"icfo": "icfo", "ifco": "ifco"}[layout]
        units = c.shape[1]
        pk = 1.0 if use_peephole else 0.0
        for t in range(seq_len_max):
            g = np.concatenate([q["x"][t], h], 1) @ q["w"] + q["b"]
            a = {name: g[:, k * units:(k + 1) * units] for k, name in enumerate(blocks)}
            i = 1 / (1 + np.exp(-(a["i"] + pk * q["wci"] * c)))
            f = 1 / (1 + np.exp(-(a["f"] + forget_bias + pk * q["wcf"] * c)))
            cs = i * np.tanh(a["c"]) + f * c
            if offsets is not None:
                cs = cs + offsets[t]
            o = 1 / (1 + np.exp(-(a["o"] + pk * q["wco"] * cs)))
            h = o * np.tanh(cs)
            c = cs
            total += (cs * r_cs[t]).sum() + (h * r_h[t]).sum()
        return total

    grads = {}
    for name in ("x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco"):
        g = np.zeros_like(p[name])
        for idx in np.ndindex(p[name].shape):
            q = {k: v.copy() for k, v in p.items()}
            q[name][idx] += eps
            up = loss(q)
            q[name][idx] -= 2 * eps
            g[idx] = (up - loss(q)) / (2 * eps)
        grads[name] = g
    return grads


@pytest.mark.parametrize("layout", ["ifco", "icfo"])
@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("cell_clip", [None, 0.3])
def test_gradients_by_finite_differences(layout, use_peephole, cell_clip):
    rng = np.random.default_rng(7)
    p = make_problem(rng, 4, 2, 3, 3, scale=1.5)
    seq_len_max, forget_bias = 3, 0.7
    out = nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"],
                            seq_len_max=seq_len_max, forget_bias=forget_bias, cell_clip=cell_clip,
                            use_peephole=use_peephole, layout=layout)
    offsets = None
    if cell_clip is not None:
        raw = ref.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"],
                             seq_len_max, forget_bias, cell_clip, use_peephole, layout)
        # Recover the unclipped cell of each step from the clipped recurrence.
        c_prev = np.concatenate([p["cs_prev"][None], raw["cs"][:-1]])
        unclipped = raw["i"] * raw["ci"] + raw["f"] * c_prev
        offsets = raw["cs"] - unclipped
        assert np.abs(offsets[:seq_len_max]).max() > 0, "the test must exercise clipping"
    r_cs = rng.standard_normal(out.cs.shape)
    r_h = rng.standard_normal(out.h.shape)
    grads = nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], out, r_cs, r_h, p["wci"], p["wcf"],
                                   p["wco"], seq_len_max=seq_len_max, use_peephole=use_peephole, layout=layout)
    fd = _loss_and_fd(p, r_cs, r_h, seq_len_max, forget_bias, cell_clip, use_peephole, layout, offsets)
    for name in ("x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco"):
        expected = fd[name]
        if name in ("wci", "wcf", "wco") and not use_peephole:
            expected = np.zeros_like(expected)
        np.testing.assert_allclose(getattr(grads, name + "_grad"), expected, rtol=1e-6, atol=1e-7, err_msg=name)


def test_incoming_gradients_past_seq_len_max_are_ignored():
    rng = np.random.default_rng(3)
    p = make_problem(rng, 5, 2, 3, 4)
    out = nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], seq_len_max=3)
    cs_grad = rng.standard_normal(out.cs.shape)
    h_grad = rng.standard_normal(out.h.shape)
    g1 = nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], out, cs_grad, h_grad, seq_len_max=3)
    cs_grad[3:] = np.nan
    h_grad[3:] = 1e30
    g2 = nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], out, cs_grad, h_grad, seq_len_max=3)
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a, b)
    assert not g1.x_grad[3:].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 3, 9])
@pytest.mark.parametrize("units", [6, 1])
def test_input_projection_inside_and_before_the_steps(monkeypatch, dtype, batch, units):
    # Where nblstm.cpu.partition.fused_projection says so, each step computes
    # its own input projection; otherwise it comes before the time loop, where
    # BLAS reads each gate's columns of the weights in place (H = 1: a vector).
    # Force each way on the same problem: both match the reference.
    from nblstm.cpu import partition

    rng = np.random.default_rng(6)
    p = make_problem(rng, 5, batch, 7, units, dtype)
    options = dict(seq_len_max=4, forget_bias=0.5, cell_clip=0.8, use_peephole=True, layout="icfo")
    expected = ref.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"], 4, 0.5,
                              0.8, True, "icfo")
    seen = []
    for limit in (0, 1 << 30):
        for name in ("_FUSED_PANEL_BYTES", "_FUSED_MAX_WEIGHT_BYTES", "_FUSED_MAX_INPUT_BYTES"):
            monkeypatch.setattr(partition, name, limit)
        seen.append(partition.fused_projection(batch, 7, units, dtype))
        out = nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"],
                                **options)
        for name in out._fields:
            assert_close(getattr(out, name), expected[name], dtype, name=name)
    assert seen == [False, batch > 1]


def test_outputs_past_seq_len_max_are_zero_in_recycled_memory():
    # The outputs are not zero-filled allocations: fill memory of the same
    # sizes with NaN and free it first, so that the allocator hands it back.
    rng = np.random.default_rng(4)
    steps, batch, inputs, units = 6, 3, 5, 7
    p = make_problem(rng, steps, batch, inputs, units)
    h_grad = rng.standard_normal((steps, batch, units))
    for _ in range(3):
        garbage = [np.full((7, steps, batch, units), np.nan), np.full((steps, batch, inputs), np.nan)]
        del garbage
        out = nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], seq_len_max=2)
        garbage = np.full((steps, batch, inputs), np.nan)
        del garbage
        grads = nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], out, h_grad=h_grad,
                                       seq_len_max=2)
        for name, got in zip(out._fields, out):
            assert not got[2:].any(), name
            assert np.isfinite(got).all(), name
        assert not grads.x_grad[2:].any()
        assert np.isfinite(grads.x_grad).all()


def test_backward_scratch_left_dirty_by_other_calls_changes_nothing():
    # The backward keeps its gate-gradient and partial buffers per thread
    # between calls: fill them with NaN, and with a larger shape's leftovers.
    from nblstm.cpu import fused

    rng = np.random.default_rng(5)
    p = make_problem(rng, 6, 3, 5, 7)
    out = nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"])
    h_grad = rng.standard_normal(out.h.shape)
    args = (p["x"], p["cs_prev"], p["h_prev"], p["w"], out, None, h_grad)
    first = nblstm.block_lstm_grad(*args)
    assert fused._scratch.buffers, "the backward keeps its scratch"
    for buffer in fused._scratch.buffers.values():
        buffer[...] = np.nan
    again = nblstm.block_lstm_grad(*args)
    big = make_problem(rng, 9, 4, 6, 11)
    big_out = nblstm.block_lstm(big["x"], big["cs_prev"], big["h_prev"], big["w"], big["b"])
    nblstm.block_lstm_grad(big["x"], big["cs_prev"], big["h_prev"], big["w"], big_out, None,
                           rng.standard_normal(big_out.h.shape))
    after_big = nblstm.block_lstm_grad(*args)
    for name, a, b, c in zip(first._fields, first, again, after_big):
        np.testing.assert_array_equal(a, b, err_msg=name)
        np.testing.assert_array_equal(a, c, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_v1_and_permuted_v2_are_bitwise_identical(dtype):
    rng = np.random.default_rng(11)
    p = make_problem(rng, 4, 3, 5, 8, dtype=dtype)
    v1 = nblstm.raw_ops.BlockLSTM(4, p["x"], p["cs_prev"], p["h_prev"], p["w"], p["wci"], p["wcf"], p["wco"], p["b"],
                                  forget_bias=0.0, cell_clip=0.5, use_peephole=True)
    perm = np.r_[0:8, 16:24, 8:16, 24:32]
    v2 = nblstm.raw_ops.BlockLSTMV2(4, p["x"], p["cs_prev"], p["h_prev"], p["w"][:, perm], p["wci"], p["wcf"],
                                    p["wco"], p["b"][perm], cell_clip=0.5, use_peephole=True)
    for a, b in zip(v1, v2):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_peephole, cell_clip", [(False, None), (True, 0.5)])
def test_single_step_ops_match_sequence_ops(dtype, use_peephole, cell_clip):
    rng = np.random.default_rng(5)
    p = make_problem(rng, 1, 3, 4, 5, dtype=dtype)
    kwargs = {"use_peephole": use_peephole, "layout": "icfo"}
    seq = nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"],
                            forget_bias=1.0, cell_clip=cell_clip, **kwargs)
    step = nblstm.lstm_block_cell(p["x"][0], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"],
                                  forget_bias=1.0, cell_clip=cell_clip, **kwargs)
    for a, b in zip(seq, step):
        np.testing.assert_array_equal(a[0], b)
        assert b.dtype == dtype
    cs_grad = rng.standard_normal((3, 5)).astype(dtype)
    h_grad = rng.standard_normal((3, 5)).astype(dtype)
    g = nblstm.lstm_block_cell_grad(p["x"][0], p["cs_prev"], p["h_prev"], p["w"], step, cs_grad, h_grad, p["wci"],
                                    p["wcf"], p["wco"], **kwargs)
    expected = ref.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["wci"], p["wcf"], p["wco"],
                                   [a[None] for a in step], cs_grad[None], h_grad[None], 1, use_peephole, "icfo")
    assert_close(g.cs_prev_grad, expected["cs_prev_grad"], dtype, GRAD_TOL, "cs_prev_grad")
    # dicfo is the gate gradient: b_grad of one step with a batch of one row each.
    dg = np.asarray(g.dicfo, np.float64)
    assert_close(dg.sum(0), expected["b_grad"], dtype, GRAD_TOL, "dicfo")
    assert_close(dg @ np.asarray(p["w"], np.float64)[:4].T, expected["x_grad"][0], dtype, GRAD_TOL, "x grad")
    for name in ("wci_grad", "wcf_grad", "wco_grad"):
        assert_close(getattr(g, name), expected[name], dtype, GRAD_TOL, name)


def test_golden_values_of_two_stacked_cells():
    # TensorFlow's reference values (docs/specification.rst): two stacked cells of 2 units, every weight 0.5, bias 0,
    # x = [[1, 1]], every state entry 0.1, cell clipping off.
    w = np.full((4, 8), 0.5, np.float32)
    z2, z8 = np.zeros(2, np.float32), np.zeros(8, np.float32)
    state = np.full((1, 2), 0.1, np.float32)
    layer0 = nblstm.raw_ops.LSTMBlockCell(np.ones((1, 2), np.float32), state, state, w, z2, z2, z2, z8, cell_clip=-1)
    layer1 = nblstm.raw_ops.LSTMBlockCell(layer0.h, state, state, w, z2, z2, z2, z8, cell_clip=-1)
    np.testing.assert_allclose(layer0.cs, [[0.68967271] * 2], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(layer0.h, [[0.44848421] * 2], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(layer1.cs, [[0.39897051] * 2], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(layer1.h, [[0.24024698] * 2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shape", [(0, 2, 3, 4), (3, 0, 3, 4), (3, 2, 0, 4)])
def test_empty_dimensions(shape):
    p = make_problem(np.random.default_rng(0), *shape)
    out = nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"])
    steps, batch, inputs, units = shape
    assert all(a.shape == (steps, batch, units) for a in out)
    expected = ref.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"])
    for name in OUTPUT_NAMES:
        np.testing.assert_allclose(getattr(out, name), expected[name], rtol=1e-12, atol=1e-14)
    grads = nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], out, out.cs, out.h)
    assert grads.x_grad.shape == (steps, batch, inputs)
    assert grads.w_grad.shape == (inputs + units, 4 * units)
    assert grads.cs_prev_grad.shape == (batch, units)


def test_memory_orders_views_and_read_only_inputs_give_the_same_results():
    rng = np.random.default_rng(2)
    p = make_problem(rng, 4, 3, 5, 6, dtype=np.float32)
    base = nblstm.block_lstm(p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"],
                             use_peephole=True, cell_clip=1.0)
    base_g = nblstm.block_lstm_grad(p["x"], p["cs_prev"], p["h_prev"], p["w"], base, base.cs, base.h, p["wci"],
                                    p["wcf"], p["wco"], use_peephole=True)

    def fortran(a):
        return np.asfortranarray(a)

    def strided(a):
        big = np.zeros(tuple(2 * n for n in a.shape), a.dtype)
        view = big[tuple(slice(None, None, 2) for _ in a.shape)]
        view[...] = a
        return view

    def read_only(a):
        a = a.copy()
        a.flags.writeable = False
        return a

    for make in (fortran, strided, read_only):
        q = {k: make(v) for k, v in p.items()}
        snapshot = {k: v.copy() for k, v in q.items()}
        out = nblstm.block_lstm(q["x"], q["cs_prev"], q["h_prev"], q["w"], q["b"], q["wci"], q["wcf"], q["wco"],
                                use_peephole=True, cell_clip=1.0)
        outs_in = [make(a) for a in out]
        g = nblstm.block_lstm_grad(q["x"], q["cs_prev"], q["h_prev"], q["w"], outs_in, make(base.cs), make(base.h),
                                   q["wci"], q["wcf"], q["wco"], use_peephole=True)
        for a, b in zip(out, base):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(g, base_g):
            np.testing.assert_array_equal(a, b)
        for k in q:
            np.testing.assert_array_equal(q[k], snapshot[k], err_msg=f"{make.__name__}: {k} was modified")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_single_row_arrays_with_odd_strides(dtype):
    """NumPy leaves the row stride of a one-row array as it came (``h.T`` of an ``[H, 1]`` array has
    strides ``(itemsize, itemsize)``, a broadcast row ``(0, itemsize)``); such arrays count as
    C-contiguous and reach the kernels uncopied. B = 1 and T * B = 1 give the results of plain copies."""
    rng = np.random.default_rng(8)
    for steps in (1, 3):
        p = make_problem(rng, steps, 1, 4, 5, dtype=dtype)
        odd = dict(p)
        odd["h_prev"] = np.array(p["h_prev"].T, order="C", copy=True).T  # [1, H], strides (itemsize, itemsize)
        odd["cs_prev"] = np.broadcast_to(p["cs_prev"][0], (1, 5))  # strides (0, itemsize)
        odd["x"] = np.array(p["x"].transpose(2, 1, 0), order="C", copy=True).transpose(2, 1, 0)
        assert odd["h_prev"].strides[0] != odd["h_prev"].shape[1] * odd["h_prev"].itemsize
        results = []
        for q in (p, odd):
            out = nblstm.block_lstm(q["x"], q["cs_prev"], q["h_prev"], q["w"], q["b"])
            grads = nblstm.block_lstm_grad(q["x"], q["cs_prev"], q["h_prev"], q["w"], out, h_grad=np.ones_like(out.h))
            results.append([*out, *grads])
        for a, b in zip(*results, strict=True):
            np.testing.assert_array_equal(a, b)


def test_lstm_cell_state_rows_with_odd_strides():
    """LSTMCell at B = 1 with a broadcast initial state (strides (0, itemsize)) and a projection: the
    gradients of plain copies."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((3, 1, 4))
    c, m = rng.standard_normal(5), rng.standard_normal(2)
    results = []
    for state in (nblstm.LSTMStateTuple(np.broadcast_to(c, (1, 5)), np.broadcast_to(m, (1, 2))),
                  nblstm.LSTMStateTuple(c[None].copy(), m[None].copy())):
        cell = nblstm.LSTMCell(5, num_proj=2, seed=3, dtype=np.float64)
        (out, final), backward = cell.vjp(x, state)
        d_x, d_state, d_w = backward(np.ones_like(out))
        results.append([out, *final, d_x, *d_state, *(d_w[k] for k in sorted(d_w))])
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_clip_bound_that_rounds_to_zero_turns_clipping_off(dtype):
    """``cell_clip > 0`` is decided in the compute dtype, as TensorFlow's float attribute does: 1e-46 is 0 in
    float32 (float16 computes in float32), so it clips nothing, bit for bit as ``cell_clip=None``."""
    p = make_problem(np.random.default_rng(3), 4, 3, 5, 6, dtype=dtype)
    arrays = [p[k] for k in ("x", "cs_prev", "h_prev", "w", "b")]
    tiny = nblstm.block_lstm(*arrays, cell_clip=1e-46)
    none = nblstm.block_lstm(*arrays, cell_clip=None)
    assert np.abs(none.cs).max() > 0.01  # clipping to zero would change these
    for name in OUTPUT_NAMES:
        np.testing.assert_array_equal(getattr(tiny, name), getattr(none, name), err_msg=name)
    step = nblstm.lstm_block_cell(arrays[0][0], *arrays[1:], cell_clip=1e-46)
    np.testing.assert_array_equal(step.cs, nblstm.lstm_block_cell(arrays[0][0], *arrays[1:]).cs)
