"""The fused ops' step kernels: forward and backward, one launch per step or one persistent launch.

A step's tile (:func:`forward_tile`, :func:`backward_tile`) is a device
function called by the per-step kernels and by persistent kernels that loop
over all steps in one cooperative launch with a grid barrier per step (used
for small batches, where launches dominate). The gate maths is
:func:`nblstm.spec.forward_unit` and :func:`nblstm.spec.backward_unit`, the
functions the CPU kernels run.
"""

from typing import NamedTuple

from numba import cuda

from ..spec import backward_unit, forward_unit
from .config import SB, SJ
from .registry import A1, A2, A3, A4, BLOCKS, I64, OPTIONS, SCALAR, Record, kernel
from .tiles import gate_dots, next_step_dot, unit_options

__all__ = ["BackwardResults", "ForwardOutputs", "OutputGrads", "RecurrentWeights", "backward_gates",
           "backward_persistent", "backward_step", "backward_tile", "backward_unit_at", "forward_gates",
           "forward_persistent", "forward_step", "forward_tile", "forward_unit_at"]


class RecurrentWeights(NamedTuple):
    """The weights the step kernels read (one kernel argument).

    Attributes
    ----------
    w_rec : [H, 4H] array
        Recurrent weights (rows ``I..I+H-1`` of ``w``), caller's layout.
    wci, wcf, wco : [H] arrays
        Peephole weights; read only with ``use_peepholes`` (any array of at
        least ``H`` elements stands in for absent ones).
    """

    w_rec: object
    wci: object
    wcf: object
    wco: object


class ForwardOutputs(NamedTuple):
    """The forward outputs the backward kernels read, each ``[T, B, H]``: ``i, cs, f, o, ci, co``."""

    i: object
    cs: object
    f: object
    o: object
    ci: object
    co: object


class OutputGrads(NamedTuple):
    """The gradients flowing into the outputs, each ``[T, B, H]``: ``cs_grad`` (of ``cs``) and ``h_grad`` (of ``h``)."""

    cs_grad: object
    h_grad: object


class BackwardResults(NamedTuple):
    """What the backward kernels write.

    Attributes
    ----------
    dgates : [S, B, 4H] array
        Gradients of the gate pre-activations, caller's layout; step ``t``
        is written, step ``t + 1`` read.
    dc : [B, H] array
        The carried cell gradient, updated in place (each element by its own
        thread); ``cs_prev_grad`` at the end.
    """

    dgates: object
    dc: object


#: Kinds of the records' parameters (:mod:`nblstm.cuda.registry`).
WEIGHTS = Record(RecurrentWeights, A2, A1, A1, A1)
SAVED = Record(ForwardOutputs, A3)
GRADS = Record(OutputGrads, A3)
RESULTS = Record(BackwardResults, A3, A2)


@cuda.jit(device=True)
def forward_unit_at(t, b, j, pre, cs_prev, weights, unit, out):
    """The gate maths of unit ``j`` of row ``b`` at step ``t`` from its four pre-activations ``pre = (i, ci, f,
    o)``; writes ``out[:, t, b, j]``.

    ``c_{t-1}`` is ``cs_prev`` at ``t == 0``, else ``out[1, t - 1]``;
    ``unit`` is the call's :class:`nblstm.spec.UnitOptions`. Every forward
    loop (tiled, resident, per-step GEMM) ends in this function.
    """
    c_prev = cs_prev[b, j] if t == 0 else out[1, t - 1, b, j]
    i, ci, f, o, cs, co, h = forward_unit(pre[0], pre[1], pre[2], pre[3], c_prev,
                                          (weights.wci[j], weights.wcf[j], weights.wco[j]), unit)
    out[0, t, b, j] = i
    out[1, t, b, j] = cs
    out[2, t, b, j] = f
    out[3, t, b, j] = o
    out[4, t, b, j] = ci
    out[5, t, b, j] = co
    out[6, t, b, j] = h


@cuda.jit(device=True)
def backward_unit_at(t, b, j, dh, cs_prev, saved, cs_grad, weights, unit, blocks, results):
    """The backward gate maths of unit ``j`` of row ``b`` at step ``t`` from the total ``dh``; writes
    ``results.dgates[t, b]``'s four columns of ``j`` and updates the carried ``results.dc[b, j]``. Every backward
    loop ends in it."""
    units = cs_prev.shape[1]
    c_prev = cs_prev[b, j] if t == 0 else saved.cs[t - 1, b, j]
    dgates, dc = results
    di, dci, df, do, dc_prev = backward_unit(
        dh, cs_grad[t, b, j] + dc[b, j], saved.i[t, b, j], saved.ci[t, b, j], saved.f[t, b, j], saved.o[t, b, j],
        saved.co[t, b, j], c_prev, (weights.wci[j], weights.wcf[j], weights.wco[j]), unit,
    )
    bi, bc, bf, bo = blocks
    dgates[t, b, bi * units + j] = di
    dgates[t, b, bc * units + j] = dci
    dgates[t, b, bf * units + j] = df
    dgates[t, b, bo * units + j] = do
    dc[b, j] = dc_prev


@cuda.jit(device=True)
def forward_tile(t, jt, bt, xw, cs_prev, h_prev, weights, unit, blocks, out):
    """Step ``t`` of the tile ``(jt, bt)``: ``SB`` batch rows by ``SJ`` units.

    Thread ``(tx, ty)`` owns unit ``j = jt * SJ + tx`` of batch row
    ``b = bt * SB + ty``: it accumulates that unit's four gate columns of
    ``h_{t-1} @ w_rec`` over shared-memory K tiles, adds ``xw[t]`` and
    runs :func:`nblstm.spec.forward_unit`. Every thread of the block must
    call this (it synchronises the block).

    Parameters
    ----------
    t, jt, bt : int
    xw : [S, B, 4H] array
        Input projections plus bias, caller's layout.
    cs_prev, h_prev : [B, H] arrays
    weights : RecurrentWeights
    unit : nblstm.spec.UnitOptions
    blocks : tuple of 4 int
        Gate block index of i, ci, f and o in the layout.
    out : [7, T, B, H] array
        Outputs ``i, cs, f, o, ci, co, h`` in one array (one kernel
        argument instead of seven); step ``t - 1`` of ``cs`` (``out[1]``)
        and ``h`` (``out[6]``) is read.
    """
    batch, units = cs_prev.shape
    j = jt * SJ + cuda.threadIdx.x
    b = bt * SB + cuda.threadIdx.y
    bi, bc, bf, bo = blocks
    acc_i, acc_c, acc_f, acc_o = gate_dots(t, jt, bt, h_prev, out[6], weights.w_rec, bi, bc, bf, bo,
                                           unit.one - unit.one)
    if b < batch and j < units:
        forward_unit_at(t, b, j, (acc_i + xw[t, b, bi * units + j], acc_c + xw[t, b, bc * units + j],
                                  acc_f + xw[t, b, bf * units + j], acc_o + xw[t, b, bo * units + j]),
                        cs_prev, weights, unit, out)


@kernel("fused")
def forward_step(t: I64, xw: A3, cs_prev: A2, h_prev: A2, weights: WEIGHTS, one: SCALAR, options: OPTIONS,
                 blocks: BLOCKS, out: A4):
    """One forward step; grid ``(ceil(H / SJ), ceil(B / SB))``, block ``(SJ, SB)``.

    Arguments as :func:`forward_tile`'s, with the call's options
    (:class:`nblstm.options.KernelOptions`) and ``one`` of the compute dtype.
    """
    forward_tile(t, cuda.blockIdx.x, cuda.blockIdx.y, xw, cs_prev, h_prev, weights, unit_options(options, one, 0),
                 blocks, out)


@kernel("fused")
def forward_persistent(steps: I64, xw: A3, cs_prev: A2, h_prev: A2, weights: WEIGHTS, one: SCALAR, options: OPTIONS,
                       blocks: BLOCKS, out: A4):
    """All ``steps`` forward steps in one cooperative launch, block ``(SJ, SB)``.

    Blocks stride over the tiles; a grid barrier separates the steps
    (step ``t`` reads ``h`` of step ``t - 1`` written by other blocks).
    """
    grid = cuda.cg.this_grid()
    batch, units = cs_prev.shape
    unit = unit_options(options, one, 0)
    tiles_j = (units + SJ - 1) // SJ
    tiles = tiles_j * ((batch + SB - 1) // SB)
    for t in range(steps):
        for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
            forward_tile(t, tile % tiles_j, tile // tiles_j, xw, cs_prev, h_prev, weights, unit, blocks, out)
        grid.sync()


@cuda.jit(device=True)
def backward_tile(t, steps, jt, bt, cs_prev, saved, grads, weights, unit, blocks, results):
    """Backward step ``t`` of the tile ``(jt, bt)``.

    Thread ``(tx, ty)`` owns unit ``j`` of batch row ``b``: it computes
    the carried ``dh[b, j] = dgates[t + 1, b, :] @ w_rec[j, :]`` (zero at
    the last step) over shared-memory K tiles of the 4H gate columns,
    then :func:`nblstm.spec.backward_unit`. Every thread of the block
    must call this.

    Parameters
    ----------
    t, steps, jt, bt : int
    cs_prev : [B, H] array
    saved : ForwardOutputs
    grads : OutputGrads
    weights : RecurrentWeights
    unit : nblstm.spec.UnitOptions
    blocks : tuple of 4 int
    results : BackwardResults
        ``dgates`` is written for step ``t`` (step ``t + 1`` is read), ``dc``
        updated.
    """
    batch, units = cs_prev.shape
    j = jt * SJ + cuda.threadIdx.x
    b = bt * SB + cuda.threadIdx.y
    zero = unit.one - unit.one
    acc = next_step_dot(t, steps, results.dgates, weights.w_rec, jt, bt, zero)
    if b < batch and j < units:
        backward_unit_at(t, b, j, grads.h_grad[t, b, j] + acc, cs_prev, saved, grads.cs_grad, weights, unit, blocks,
                         results)


@kernel("fused")
def backward_step(t: I64, steps: I64, cs_prev: A2, saved: SAVED, grads: GRADS, weights: WEIGHTS, one: SCALAR,
                  options: OPTIONS, blocks: BLOCKS, results: RESULTS):
    """One backward step; grid ``(ceil(H / SJ), ceil(B / SB))``, block ``(SJ, SB)``. Arguments as
    :func:`backward_tile`'s, with the call's options and ``one`` of the compute dtype."""
    backward_tile(t, steps, cuda.blockIdx.x, cuda.blockIdx.y, cs_prev, saved, grads, weights,
                  unit_options(options, one, 0), blocks, results)


@kernel("fused")
def backward_persistent(steps: I64, cs_prev: A2, saved: SAVED, grads: GRADS, weights: WEIGHTS, one: SCALAR,
                        options: OPTIONS, blocks: BLOCKS, results: RESULTS):
    """All backward steps, ``S - 1 .. 0``, in one cooperative launch, block ``(SJ, SB)``."""
    grid = cuda.cg.this_grid()
    batch, units = cs_prev.shape
    unit = unit_options(options, one, 0)
    tiles_j = (units + SJ - 1) // SJ
    tiles = tiles_j * ((batch + SB - 1) // SB)
    for step in range(steps):
        t = steps - 1 - step
        for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
            backward_tile(t, steps, tile % tiles_j, tile // tiles_j, cs_prev, saved, grads, weights, unit, blocks,
                          results)
        grid.sync()


@kernel("fused")
def forward_gates(t: I64, xw: A3, cs_prev: A2, weights: WEIGHTS, one: SCALAR, options: OPTIONS, blocks: BLOCKS,
                  out: A4):
    """The gate maths of step ``t`` once ``xw[t]`` holds the whole pre-activations (cuBLAS added ``h_{t-1} @ W_h``).

    A grid-stride loop over the ``B * H`` units of the step: the per-step
    GEMM loop of larger batches (:func:`nblstm.cuda.fused._forward_gemm_steps`).
    ``weights.w_rec`` is not read.
    """
    batch, units = cs_prev.shape
    unit = unit_options(options, one, 0)
    bi, bc, bf, bo = blocks
    for e in range(cuda.grid(1), batch * units, cuda.gridsize(1)):
        b = e // units
        j = e % units
        forward_unit_at(t, b, j, (xw[t, b, bi * units + j], xw[t, b, bc * units + j], xw[t, b, bf * units + j],
                                  xw[t, b, bo * units + j]), cs_prev, weights, unit, out)


@kernel("fused")
def backward_gates(t: I64, steps: I64, dh: A2, cs_prev: A2, saved: SAVED, grads: GRADS, weights: WEIGHTS,
                   one: SCALAR, options: OPTIONS, blocks: BLOCKS, results: RESULTS):
    """The backward gate maths of step ``t`` once ``dh`` holds ``dgates[t + 1] @ W_h^T`` (not read at the last step).

    A grid-stride loop over the ``B * H`` units of the step (the per-step
    GEMM loop of larger batches). ``weights.w_rec`` is not read.
    """
    batch, units = cs_prev.shape
    unit = unit_options(options, one, 0)
    last = t + 1 >= steps
    h_grad = grads.h_grad
    for e in range(cuda.grid(1), batch * units, cuda.gridsize(1)):
        b = e // units
        j = e % units
        carried = h_grad[t, b, j] if last else h_grad[t, b, j] + dh[b, j]
        backward_unit_at(t, b, j, carried, cs_prev, saved, grads.cs_grad, weights, unit, blocks, results)
