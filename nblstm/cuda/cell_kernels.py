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

from typing import NamedTuple

from numba import cuda

from ..spec import cell_backward_unit, cell_forward_unit, clip_value, clip_value_grad
from .config import SB, SJ
from .registry import A1, A2, A3, A4, BOOL, I64, LENGTHS, OPTIONS, SCALAR, Record, kernel
from .tiles import gate_dots, next_step_dot, row_dot, unit_options

__all__ = ["CellForward", "CellGrads", "CellState", "CellWeights", "backward_h_step", "backward_units_step",
           "cell_backward_at", "cell_unit_at", "forward_step", "project_step"]


class CellState(NamedTuple):
    """The initial state: ``c0 [B, H]`` and ``h0 [B, P]``."""

    c0: object
    h0: object


class CellWeights(NamedTuple):
    """The weights the step kernels read (the device arrays of :class:`nblstm.cuda.cell.DeviceWeights`).

    Attributes
    ----------
    w_rec : [P, 4H] array
        ``kernel[I:]``.
    projection : [H, P] array
        Read only with a projection (``w_rec`` stands in without one).
    w_i, w_f, w_o : [H] arrays
        Peephole weights, read only with ``use_peepholes``.
    """

    w_rec: object
    projection: object
    w_i: object
    w_f: object
    w_o: object


class CellForward(NamedTuple):
    """The forward pass's arrays of every step: written by the forward kernels, read by the backward ones.

    Attributes
    ----------
    gates : [S, B, 4H] array
        Before a forward step ``x @ kernel[:I] + bias`` (ICFO); after it the
        gates ``i, j, f, o`` after their nonlinearities (zero past an
        example's length).
    cells : [4, S, B, H] array
        ``c_raw, c, ac, r``: the cell before and after its clip, ``act(c)``
        and ``r = o * act(c)``. Past an example's length the cell is carried
        and ``ac, r`` are zero, except that without a projection ``r`` is
        ``h``, carried too.
    hs : [2, S, B, P] array
        ``h_raw, h``. Without a projection this is ``cells[2:4]`` (``h`` is
        ``r``).
    """

    gates: object
    cells: object
    hs: object


class CellGrads(NamedTuple):
    """The backward pass's gradients.

    Attributes
    ----------
    d_out : [T, B, P] array
        Gradient of the outputs (read).
    dgates : [S, B, 4H] array
        Gradients of the gate pre-activations of each step (zero past an
        example's length); step ``t`` is written, ``t + 1`` read.
    dc : [B, H] array
        The carried gradient of the cell, updated in place.
    dh : [B, P] array
        The carried gradient of ``h``, updated in place.
    dh_raw : [S, B, P] array
        The gradient of the projection before its clip (with a projection;
        any ``[S, B, >= P]`` array stands in without one).
    """

    d_out: object
    dgates: object
    dc: object
    dh: object
    dh_raw: object


#: Kinds of the records' parameters (:mod:`nblstm.cuda.registry`).
STATE = Record(CellState, A2)
WEIGHTS = Record(CellWeights, A2, A2, A1, A1, A1)
FORWARD = Record(CellForward, A3, A4, A4)
GRADS = Record(CellGrads, A3, A3, A2, A2, A3)


@cuda.jit(device=True)
def thread_tile():
    """``(column tile, batch tile, column, batch row)`` of this thread in a step kernel's grid."""
    ct = cuda.blockIdx.x
    bt = cuda.blockIdx.y
    return ct, bt, ct * SJ + cuda.threadIdx.x, bt * SB + cuda.threadIdx.y


@cuda.jit(device=True)
def cell_unit_at(t, b, j, sums, fwd, state, lengths, weights, unit, has_proj):
    """Step ``t`` of unit ``j`` of row ``b`` from the recurrent sums ``sums = (a_i, a_j, a_f, a_o)`` (added to
    ``fwd.gates[t]``, which holds the input projection): the gate maths within the row's length, the carried state
    past it. Arguments as :func:`forward_step`'s (``unit``: the call's :class:`nblstm.spec.UnitOptions`); every
    forward loop of the cell ends in this function."""
    gates, cells, hs = fwd
    c0, h0 = state
    units = c0.shape[1]
    zero = unit.one - unit.one
    c_prev = c0[b, j] if t == 0 else cells[1, t - 1, b, j]
    if t < lengths[b]:
        i, j_gate, f, o, c_raw, c, ac, r = cell_forward_unit(
            sums[0] + gates[t, b, j], sums[1] + gates[t, b, units + j], sums[2] + gates[t, b, 2 * units + j],
            sums[3] + gates[t, b, 3 * units + j], c_prev, (weights.w_i[j], weights.w_f[j], weights.w_o[j]), unit,
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
def cell_backward_at(t, b, j, dr, fwd, state, lengths, weights, unit, has_proj, grads):
    """Backward step ``t`` of unit ``j`` of row ``b`` from ``dr``, the gradient of ``r`` carried into it (without a
    projection: from step ``t + 1``'s gate gradients, before ``dh``'s carry and ``d_out``). Arguments as
    :func:`backward_units_step`'s; every backward loop of the cell ends in this function."""
    gates, cells = fwd.gates, fwd.cells
    c0 = state.c0
    dgates, dc, dh = grads.dgates, grads.dc, grads.dh
    units = c0.shape[1]
    zero = unit.one - unit.one
    if not has_proj:
        if t + 1 < lengths[b]:
            dh[b, j] = dr
        dr = dh[b, j] + grads.d_out[t, b, j]
    if t < lengths[b]:
        c_prev = c0[b, j] if t == 0 else cells[1, t - 1, b, j]
        di, dj, df, do, dc_prev = cell_backward_unit(
            dr, dc[b, j], gates[t, b, j], gates[t, b, units + j], gates[t, b, 2 * units + j],
            gates[t, b, 3 * units + j], cells[0, t, b, j], cells[2, t, b, j], c_prev,
            (weights.w_i[j], weights.w_f[j], weights.w_o[j]), unit,
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
def forward_step(t: I64, fwd: FORWARD, state: STATE, weights: WEIGHTS, lengths: LENGTHS, one: SCALAR,
                 options: OPTIONS, given: BOOL):
    """Forward step ``t`` of every unit (before the projection).

    Parameters
    ----------
    t : int
    fwd : CellForward
        Step ``t`` of ``gates`` becomes the gates, of ``cells`` is written;
        ``hs.h[t - 1]`` is read.
    state : CellState
    weights : CellWeights
    lengths : [B] int64 array
    one : scalar of the compute dtype
    options : nblstm.options.KernelOptions
        The call's options, bounds in the compute dtype.
    given : bool
        ``gates[t]`` already holds ``h[t - 1] @ w_rec`` too.
    """
    c0, h0 = state
    batch, units = c0.shape
    jt, bt, j, b = thread_tile()
    zero = one - one
    a_i = a_j = a_f = a_o = zero
    if not given:
        a_i, a_j, a_f, a_o = gate_dots(t, jt, bt, h0, fwd.hs[1], weights.w_rec, 0, 1, 2, 3, zero)
    if b < batch and j < units:
        cell_unit_at(t, b, j, (a_i, a_j, a_f, a_o), fwd, state, lengths, weights,
                     unit_options(options, one, options.act), options.has_proj)


@kernel("cell")
def project_step(t: I64, fwd: FORWARD, state: STATE, weights: WEIGHTS, lengths: LENGTHS, one: SCALAR,
                 options: OPTIONS, given: BOOL):
    """Projection of step ``t``: ``h = clip(r @ projection)``, carried past an example's length.

    Arguments as :func:`forward_step`'s: ``r[t]`` (``fwd.cells[3, t]``) is
    read, ``fwd.hs[:, t]`` written (``h_raw`` zero past the length).
    ``given``: ``h_raw[t]`` already holds ``r[t] @ projection`` for every row.
    """
    cells, hs = fwd.cells, fwd.hs
    h0 = state.h0
    batch, depth = h0.shape
    pt, bt, p, b = thread_tile()
    zero = one - one
    acc = zero
    if not given:
        acc = row_dot(cells[3, t], weights.projection, False, pt, bt, zero)
    if b < batch and p < depth:
        if given:
            acc = hs[0, t, b, p]
        if t < lengths[b]:
            hs[0, t, b, p] = acc
            hs[1, t, b, p] = clip_value(acc, options.proj_clip, options.proj_clip_on)
        else:
            hs[0, t, b, p] = zero
            hs[1, t, b, p] = h0[b, p] if t == 0 else hs[1, t - 1, b, p]


@kernel("cell")
def backward_h_step(t: I64, steps: I64, fwd: FORWARD, weights: WEIGHTS, lengths: LENGTHS, one: SCALAR,
                    options: OPTIONS, grads: GRADS, given: BOOL, product: A2):
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
    fwd : CellForward
        ``hs.h_raw`` is read.
    weights : CellWeights
    lengths : [B] int64 array
    one : scalar of the compute dtype
    options : nblstm.options.KernelOptions
    grads : CellGrads
        ``dgates[t + 1]`` and ``d_out[t]`` are read, ``dh`` updated in
        place, ``dh_raw[t]`` written.
    given : bool
        ``product`` holds ``dgates[t + 1] @ w_rec^T`` (``t + 1 < steps``).
    product : [B, P] array
        Read when ``given``.
    """
    hs = fwd.hs
    dh, dh_raw, d_out = grads.dh, grads.dh_raw, grads.d_out
    batch, depth = dh.shape
    pt, bt, p, b = thread_tile()
    zero = one - one
    acc = zero
    if not given:
        acc = next_step_dot(t, steps, grads.dgates, weights.w_rec, pt, bt, zero)
    if b < batch and p < depth:
        if given and t + 1 < steps:
            acc = product[b, p]
        if t + 1 < lengths[b]:
            dh[b, p] = acc
        if t >= 0:
            if t < lengths[b]:
                dh_raw[t, b, p] = (dh[b, p] + d_out[t, b, p]) * clip_value_grad(
                    hs[0, t, b, p], options.proj_clip, options.proj_clip_on, one)
            else:
                dh_raw[t, b, p] = zero


@kernel("cell")
def backward_units_step(t: I64, steps: I64, fwd: FORWARD, state: STATE, weights: WEIGHTS, lengths: LENGTHS,
                        one: SCALAR, options: OPTIONS, grads: GRADS, given: BOOL, product: A2):
    """Backward step ``t`` of every unit: the gradient of ``r``, then the gate maths.

    With a projection ``dr = dh_raw[t] @ projection^T``. Without one,
    ``r`` is ``h``: this thread also carries ``dh`` of its column as
    :func:`backward_h_step` does, and ``dr = dh + d_out[t]``.

    Parameters
    ----------
    t, steps : int
        ``0 <= t < steps = S``.
    fwd : CellForward
        The forward pass's gates and cells.
    state : CellState
    weights : CellWeights
    lengths : [B] int64 array
    one : scalar of the compute dtype
    options : nblstm.options.KernelOptions
    grads : CellGrads
        ``dh_raw[t]`` is read with a projection; ``dgates[t]`` written
        (step ``t + 1`` read), ``dc`` updated in place, and ``dh`` without
        a projection.
    given : bool
        ``product`` holds ``dr`` before the carry: ``dh_raw[t] @ projection^T``
        with a projection, else ``dgates[t + 1] @ w_rec^T`` (``t + 1 < steps``).
    product : [B, H] array
        Read when ``given``.
    """
    batch, units = state.c0.shape
    jt, bt, j, b = thread_tile()
    zero = one - one
    has_proj = options.has_proj
    # row_dot called directly in both branches, not next_step_dot: a kernel
    # that reaches row_dot both directly and through next_step_dot declares
    # its shared arrays twice, and NVVM rejects the IR.
    dr = zero
    if given:
        pass
    elif has_proj:
        dr = row_dot(grads.dh_raw[t], weights.projection, True, jt, bt, zero)
    elif t + 1 < steps:
        dr = row_dot(grads.dgates[t + 1], weights.w_rec, True, jt, bt, zero)
    if b < batch and j < units:
        if given and (has_proj or t + 1 < steps):
            dr = product[b, j]
        cell_backward_at(t, b, j, dr, fwd, state, lengths, weights, unit_options(options, one, options.act),
                         has_proj, grads)
