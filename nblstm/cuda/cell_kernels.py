"""The TF1 ``LSTMCell``'s step kernels on the GPU (:ref:`spec-cell`).

Every step kernel runs on a grid of ``(ceil(N / SJ), ceil(B / SB))`` blocks
of ``(SJ, SB)`` threads, ``N`` the width it computes (``H`` units or ``P``
output columns); thread ``(tx, ty)`` of block ``(jt, bt)`` owns column
``jt * SJ + tx`` of batch row ``bt * SB + ty``. Every thread reaches the
device functions that synchronise the block (:mod:`nblstm.cuda.tiles`).
The gate maths is :func:`nblstm.spec.cell_forward_unit` and
:func:`nblstm.spec.cell_backward_unit`, the functions the CPU kernels run.
``h`` is the cell's output state (TensorFlow's ``m``).

Each kernel computes its step's product (its slice of ``h @ kernel[I:]``,
of ``r @ projection``, or of a carried gradient) in shared-memory tiles,
unless ``given``: then cuBLAS computed it before the launch (the per-step
GEMM loop of :mod:`nblstm.cuda.cell`, :meth:`nblstm.cuda.launch.Launcher.step_gemm`)
and the kernel reads it: a step is then one product and one elementwise
kernel, as for the fused ops.
"""

from numba import cuda

from ..spec import UnitOptions, cell_backward_unit, cell_forward_unit, clip_value, clip_value_grad
from .config import SB, SJ
from .registry import A1, A2, A3, A4, BOOL, I64, LENGTHS, SCALAR, kernel
from .tiles import gate_dots, next_step_dot, row_dot

__all__ = ["backward_h_step", "backward_units_step", "cell_backward_at", "cell_unit_at", "forward_step",
           "project_step"]


@cuda.jit(device=True)
def thread_tile():
    """``(column tile, batch tile, column, batch row)`` of this thread in a step kernel's grid."""
    ct = cuda.blockIdx.x
    bt = cuda.blockIdx.y
    return ct, bt, ct * SJ + cuda.threadIdx.x, bt * SB + cuda.threadIdx.y


@cuda.jit(device=True)
def cell_unit_at(t, b, j, a_i, a_j, a_f, a_o, gates, c0, h0, lengths, w_i, w_f, w_o, one, forget_bias, cell_clip,
                 clip_on, act, use_peepholes, has_proj, cells, hs):
    """Step ``t`` of unit ``j`` of row ``b`` from the recurrent sums ``a_*`` (added to ``gates[t]``, which holds the
    input projection): the gate maths within the row's length, the carried state past it. Arguments as
    :func:`forward_step`'s; every forward loop of the cell ends in this function."""
    units = c0.shape[1]
    zero = one - one
    c_prev = c0[b, j] if t == 0 else cells[1, t - 1, b, j]
    if t < lengths[b]:
        i, j_gate, f, o, c_raw, c, ac, r = cell_forward_unit(
            a_i + gates[t, b, j], a_j + gates[t, b, units + j], a_f + gates[t, b, 2 * units + j],
            a_o + gates[t, b, 3 * units + j], c_prev, (w_i[j], w_f[j], w_o[j]),
            UnitOptions(forget_bias, cell_clip, clip_on, act, use_peepholes, one),
        )
        gates[t, b, j] = i
        gates[t, b, units + j] = j_gate
        gates[t, b, 2 * units + j] = f
        gates[t, b, 3 * units + j] = o
        cells[0, t, b, j] = c_raw
        cells[1, t, b, j] = c
        cells[2, t, b, j] = ac
        cells[3, t, b, j] = r
    else:
        for block in range(4):
            gates[t, b, block * units + j] = zero
        cells[0, t, b, j] = c_prev
        cells[1, t, b, j] = c_prev
        cells[2, t, b, j] = zero
        if has_proj:
            cells[3, t, b, j] = zero
        else:
            cells[3, t, b, j] = h0[b, j] if t == 0 else hs[1, t - 1, b, j]


@cuda.jit(device=True)
def cell_backward_at(t, b, j, dr, c0, gates, cells, lengths, d_out, w_i, w_f, w_o, one, cell_clip, clip_on, act,
                     use_peepholes, has_proj, dgates, dc, dh):
    """Backward step ``t`` of unit ``j`` of row ``b`` from ``dr``, the gradient of ``r`` carried into it (without a
    projection: from step ``t + 1``'s gate gradients, before ``dh``'s carry and ``d_out``). Arguments as
    :func:`backward_units_step`'s; every backward loop of the cell ends in this function."""
    units = c0.shape[1]
    zero = one - one
    if not has_proj:
        if t + 1 < lengths[b]:
            dh[b, j] = dr
        dr = dh[b, j] + d_out[t, b, j]
    if t < lengths[b]:
        c_prev = c0[b, j] if t == 0 else cells[1, t - 1, b, j]
        di, dj, df, do, dc_prev = cell_backward_unit(
            dr, dc[b, j], gates[t, b, j], gates[t, b, units + j], gates[t, b, 2 * units + j],
            gates[t, b, 3 * units + j], cells[0, t, b, j], cells[2, t, b, j], c_prev, (w_i[j], w_f[j], w_o[j]),
            UnitOptions(one - one, cell_clip, clip_on, act, use_peepholes, one),
        )
        dgates[t, b, j] = di
        dgates[t, b, units + j] = dj
        dgates[t, b, 2 * units + j] = df
        dgates[t, b, 3 * units + j] = do
        dc[b, j] = dc_prev
    else:
        # A carried step: no gate gradients, the cell gradient passes unchanged.
        for block in range(4):
            dgates[t, b, block * units + j] = zero


@kernel("cell")
def forward_step(t: I64, gates: A3, c0: A2, h0: A2, w_rec: A2, lengths: LENGTHS, w_i: A1, w_f: A1, w_o: A1, one: SCALAR,
                 forget_bias: SCALAR, cell_clip: SCALAR, clip_on: BOOL, act: I64, use_peepholes: BOOL, has_proj: BOOL,
                 cells: A4, hs: A4, given: BOOL):
    """Forward step ``t`` of every unit (before the projection).

    Parameters
    ----------
    t : int
    gates : [S, B, 4H] array
        On entry ``x @ kernel[:I] + bias`` (ICFO); step ``t`` becomes
        the gates ``i, j, f, o`` after their nonlinearities (zero past
        an example's length).
    c0 : [B, H] array
    h0 : [B, P] array
    w_rec : [P, 4H] array
        ``kernel[I:]``.
    lengths : [B] int64 array
    w_i, w_f, w_o : [H] arrays
        Peephole weights (read only with ``use_peepholes``).
    one, forget_bias, cell_clip : scalars of the compute dtype
    clip_on : bool
    act : int
        Activation code.
    use_peepholes, has_proj : bool
    cells : [4, S, B, H] array
        Output ``c_raw, c, ac, r``: the cell before and after its clip,
        ``act(c)`` and ``r = o * act(c)``. Past an example's length the
        cell is carried and ``ac, r`` are zero, except that without a
        projection ``r`` is ``h``, carried too.
    hs : [2, S, B, P] array
        ``h_raw, h``; ``h[t - 1]`` is read. Without a projection this is
        ``cells[2:4]`` (``h`` is ``r``).
    given : bool
        ``gates[t]`` already holds ``h[t - 1] @ w_rec`` too.
    """
    batch, units = c0.shape
    jt, bt, j, b = thread_tile()
    zero = one - one
    a_i = a_j = a_f = a_o = zero
    if not given:
        a_i, a_j, a_f, a_o = gate_dots(t, jt, bt, h0, hs[1], w_rec, 0, 1, 2, 3, zero)
    if b < batch and j < units:
        cell_unit_at(t, b, j, a_i, a_j, a_f, a_o, gates, c0, h0, lengths, w_i, w_f, w_o, one, forget_bias, cell_clip,
                     clip_on, act, use_peepholes, has_proj, cells, hs)


@kernel("cell")
def project_step(t: I64, cells: A4, h0: A2, w_proj: A2, lengths: LENGTHS, one: SCALAR, proj_clip: SCALAR,
                 proj_clip_on: BOOL, hs: A4, given: BOOL):
    """Projection of step ``t``: ``h = clip(r @ projection)``, carried past an example's length.

    Parameters
    ----------
    t : int
    cells : [4, S, B, H] array
        ``r[t]`` (``cells[3, t]``) is read.
    h0 : [B, P] array
    w_proj : [H, P] array
    lengths : [B] int64 array
    one, proj_clip : scalars of the compute dtype
    proj_clip_on : bool
    hs : [2, S, B, P] array
        Output ``h_raw[t]`` (zero past the length) and ``h[t]``.
    given : bool
        ``h_raw[t]`` already holds ``r[t] @ w_proj`` for every row.
    """
    batch, depth = h0.shape
    pt, bt, p, b = thread_tile()
    zero = one - one
    acc = zero
    if not given:
        acc = row_dot(cells[3, t], w_proj, False, pt, bt, zero)
    if b < batch and p < depth:
        if given:
            acc = hs[0, t, b, p]
        if t < lengths[b]:
            hs[0, t, b, p] = acc
            hs[1, t, b, p] = clip_value(acc, proj_clip, proj_clip_on)
        else:
            hs[0, t, b, p] = zero
            hs[1, t, b, p] = h0[b, p] if t == 0 else hs[1, t - 1, b, p]


@kernel("cell")
def backward_h_step(t: I64, steps: I64, dgates: A3, w_rec: A2, lengths: LENGTHS, d_out: A3, hs: A4, one: SCALAR,
                    proj_clip: SCALAR, proj_clip_on: BOOL, dh: A2, dh_raw: A3, given: BOOL, product: A2):
    """Backward step ``t`` of the output state ``h`` (with a projection), or the final carry (``t = -1``).

    Rows active at ``t + 1`` take the gradient of ``h[t]`` from that
    step's gate gradients; the others carried ``h``, so ``dh`` is kept.
    Rows active at ``t`` then get the gradient of the projection before
    its clip, ``dh_raw[t] = (dh + d_out[t]) clip'(h_raw[t])``; zero
    elsewhere. ``t = -1`` only finishes the carry: ``dh`` becomes the
    gradient of ``h0``, for a cell with or without a projection.

    Parameters
    ----------
    t, steps : int
        ``-1 <= t < steps = S``.
    dgates : [S, B, 4H] array
        Gate gradients; step ``t + 1`` is read.
    w_rec : [P, 4H] array
    lengths : [B] int64 array
    d_out : [T, B, P] array
    hs : [2, S, B, P] array
        ``h_raw`` is read.
    one, proj_clip : scalars of the compute dtype
    proj_clip_on : bool
    dh : [B, P] array
        The carried gradient of ``h``, updated in place.
    dh_raw : [S, B, P] array
        Output for step ``t``.
    given : bool
        ``product`` holds ``dgates[t + 1] @ w_rec^T`` (``t + 1 < steps``).
    product : [B, P] array
        Read when ``given``.
    """
    batch, depth = dh.shape
    pt, bt, p, b = thread_tile()
    zero = one - one
    acc = zero
    if not given:
        acc = next_step_dot(t, steps, dgates, w_rec, pt, bt, zero)
    if b < batch and p < depth:
        if given and t + 1 < steps:
            acc = product[b, p]
        if t + 1 < lengths[b]:
            dh[b, p] = acc
        if t >= 0:
            if t < lengths[b]:
                dh_raw[t, b, p] = (dh[b, p] + d_out[t, b, p]) * clip_value_grad(
                    hs[0, t, b, p], proj_clip, proj_clip_on, one)
            else:
                dh_raw[t, b, p] = zero


@kernel("cell")
def backward_units_step(t: I64, steps: I64, c0: A2, gates: A3, cells: A4, dh_raw: A3, w_rec: A2, w_proj: A2,
                        lengths: LENGTHS, d_out: A3, w_i: A1, w_f: A1, w_o: A1, one: SCALAR, cell_clip: SCALAR,
                        clip_on: BOOL, act: I64, use_peepholes: BOOL, has_proj: BOOL, dgates: A3, dc: A2, dh: A2,
                        given: BOOL, product: A2):
    """Backward step ``t`` of every unit: the gradient of ``r``, then the gate maths.

    With a projection ``dr = dh_raw[t] @ projection^T``. Without one,
    ``r`` is ``h``: this thread also carries ``dh`` of its column as
    :func:`backward_h_step` does, and ``dr = dh + d_out[t]``.

    Parameters
    ----------
    t, steps : int
        ``0 <= t < steps = S``.
    c0 : [B, H] array
    gates : [S, B, 4H] array
        The forward gates (:func:`forward_step`).
    cells : [4, S, B, H] array
        ``c_raw, c, ac, r`` of the forward pass.
    dh_raw : [S, B, P] array
        Step ``t`` is read with a projection.
    w_rec : [P, 4H] array
    w_proj : [H, P] array
    lengths : [B] int64 array
    d_out : [T, B, P] array
    w_i, w_f, w_o : [H] arrays
    one, cell_clip : scalars of the compute dtype
    clip_on : bool
    act : int
    use_peepholes, has_proj : bool
    dgates : [S, B, 4H] array
        Output: gradients of the gate pre-activations of step ``t``
        (zero past an example's length); step ``t + 1`` is read.
    dc : [B, H] array
        The carried gradient of the cell, updated in place.
    dh : [B, P] array
        The carried gradient of ``h``, updated in place without a projection.
    given : bool
        ``product`` holds ``dr`` before the carry: ``dh_raw[t] @ w_proj^T``
        with a projection, else ``dgates[t + 1] @ w_rec^T`` (``t + 1 < steps``).
    product : [B, H] array
        Read when ``given``.
    """
    batch, units = c0.shape
    jt, bt, j, b = thread_tile()
    zero = one - one
    # row_dot called directly in both branches, not next_step_dot: a kernel
    # that reaches row_dot both directly and through next_step_dot declares
    # its shared arrays twice, and NVVM rejects the IR.
    dr = zero
    if given:
        pass
    elif has_proj:
        dr = row_dot(dh_raw[t], w_proj, True, jt, bt, zero)
    elif t + 1 < steps:
        dr = row_dot(dgates[t + 1], w_rec, True, jt, bt, zero)
    if b < batch and j < units:
        if given and (has_proj or t + 1 < steps):
            dr = product[b, j]
        cell_backward_at(t, b, j, dr, c0, gates, cells, lengths, d_out, w_i, w_f, w_o, one, cell_clip, clip_on, act,
                         use_peepholes, has_proj, dgates, dc, dh)
