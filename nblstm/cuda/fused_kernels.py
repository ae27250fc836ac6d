"""The fused ops' step kernels: forward and backward, one launch per step or one persistent launch.

A step's tile (:func:`forward_tile`, :func:`backward_tile`) is a device
function called by the per-step kernels and by persistent kernels that loop
over all steps in one cooperative launch with a grid barrier per step (used
for small batches, where launches dominate). The gate maths is
:func:`nblstm.spec.forward_unit` and :func:`nblstm.spec.backward_unit`, the
functions the CPU kernels run.
"""

from numba import cuda

from ..spec import UnitOptions, backward_unit, forward_unit
from .config import SB, SJ
from .registry import A1, A2, A3, A4, BOOL, I64, SCALAR, kernel
from .tiles import gate_dots, next_step_dot

__all__ = ["backward_gates", "backward_persistent", "backward_step", "backward_tile", "backward_unit_at",
           "forward_gates", "forward_persistent", "forward_step", "forward_tile", "forward_unit_at"]


@cuda.jit(device=True)
def forward_unit_at(t, b, j, pre_i, pre_c, pre_f, pre_o, cs_prev, wci, wcf, wco, one, forget_bias, cell_clip, clip_on,
                    use_peephole, out):
    """The gate maths of unit ``j`` of row ``b`` at step ``t`` from its four pre-activations; writes
    ``out[:, t, b, j]``.

    ``c_{t-1}`` is ``cs_prev`` at ``t == 0``, else ``out[1, t - 1]``. Every
    forward loop (tiled, resident, per-step GEMM) ends in this function.
    """
    c_prev = cs_prev[b, j] if t == 0 else out[1, t - 1, b, j]
    i, ci, f, o, cs, co, h = forward_unit(pre_i, pre_c, pre_f, pre_o, c_prev, (wci[j], wcf[j], wco[j]),
                                          UnitOptions(forget_bias, cell_clip, clip_on, 0, use_peephole, one))
    out[0, t, b, j] = i
    out[1, t, b, j] = cs
    out[2, t, b, j] = f
    out[3, t, b, j] = o
    out[4, t, b, j] = ci
    out[5, t, b, j] = co
    out[6, t, b, j] = h


@cuda.jit(device=True)
def backward_unit_at(t, b, j, dh, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, wci, wcf, wco, one, use_peephole, bi,
                     bc, bf, bo, dgates, dc):
    """The backward gate maths of unit ``j`` of row ``b`` at step ``t`` from the total ``dh``; writes
    ``dgates[t, b]``'s four columns of ``j`` and updates the carried ``dc[b, j]``. Every backward loop ends in it."""
    units = cs_prev.shape[1]
    c_prev = cs_prev[b, j] if t == 0 else cs_[t - 1, b, j]
    di, dci, df, do, dc_prev = backward_unit(
        dh, cs_grad[t, b, j] + dc[b, j], i_[t, b, j], ci_[t, b, j], f_[t, b, j], o_[t, b, j], co_[t, b, j], c_prev,
        (wci[j], wcf[j], wco[j]), UnitOptions(one - one, one - one, False, 0, use_peephole, one),
    )
    dgates[t, b, bi * units + j] = di
    dgates[t, b, bc * units + j] = dci
    dgates[t, b, bf * units + j] = df
    dgates[t, b, bo * units + j] = do
    dc[b, j] = dc_prev


@cuda.jit(device=True)
def forward_tile(t, jt, bt, xw, cs_prev, h_prev, w_rec, wci, wcf, wco, one, forget_bias, cell_clip, clip_on,
                 use_peephole, bi, bc, bf, bo, out):
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
    w_rec : [H, 4H] array
        Recurrent weights (rows ``I..I+H-1`` of ``w``).
    wci, wcf, wco : [H] arrays
    one, forget_bias, cell_clip : scalars of the compute dtype
    clip_on, use_peephole : bool
    bi, bc, bf, bo : int
        Gate block index of i, ci, f and o in the layout.
    out : [7, T, B, H] array
        Outputs ``i, cs, f, o, ci, co, h`` in one array (one kernel
        argument instead of seven); step ``t - 1`` of ``cs`` (``out[1]``)
        and ``h`` (``out[6]``) is read.
    """
    batch, units = cs_prev.shape
    j = jt * SJ + cuda.threadIdx.x
    b = bt * SB + cuda.threadIdx.y
    acc_i, acc_c, acc_f, acc_o = gate_dots(t, jt, bt, h_prev, out[6], w_rec, bi, bc, bf, bo, one - one)
    if b < batch and j < units:
        forward_unit_at(t, b, j, acc_i + xw[t, b, bi * units + j], acc_c + xw[t, b, bc * units + j],
                        acc_f + xw[t, b, bf * units + j], acc_o + xw[t, b, bo * units + j], cs_prev, wci, wcf, wco,
                        one, forget_bias, cell_clip, clip_on, use_peephole, out)


@kernel("fused")
def forward_step(t: I64, xw: A3, cs_prev: A2, h_prev: A2, w_rec: A2, wci: A1, wcf: A1, wco: A1, one: SCALAR,
                 forget_bias: SCALAR, cell_clip: SCALAR, clip_on: BOOL, use_peephole: BOOL, bi: I64, bc: I64, bf: I64,
                 bo: I64, out: A4):
    """One forward step; grid ``(ceil(H / SJ), ceil(B / SB))``, block ``(SJ, SB)``."""
    forward_tile(t, cuda.blockIdx.x, cuda.blockIdx.y, xw, cs_prev, h_prev, w_rec, wci, wcf, wco, one,
                 forget_bias, cell_clip, clip_on, use_peephole, bi, bc, bf, bo, out)


@kernel("fused")
def forward_persistent(steps: I64, xw: A3, cs_prev: A2, h_prev: A2, w_rec: A2, wci: A1, wcf: A1, wco: A1, one: SCALAR,
                       forget_bias: SCALAR, cell_clip: SCALAR, clip_on: BOOL, use_peephole: BOOL, bi: I64, bc: I64,
                       bf: I64, bo: I64, out: A4):
    """All ``steps`` forward steps in one cooperative launch, block ``(SJ, SB)``.

    Blocks stride over the tiles; a grid barrier separates the steps
    (step ``t`` reads ``h`` of step ``t - 1`` written by other blocks).
    """
    grid = cuda.cg.this_grid()
    batch, units = cs_prev.shape
    tiles_j = (units + SJ - 1) // SJ
    tiles = tiles_j * ((batch + SB - 1) // SB)
    for t in range(steps):
        for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
            forward_tile(t, tile % tiles_j, tile // tiles_j, xw, cs_prev, h_prev, w_rec, wci, wcf, wco, one,
                         forget_bias, cell_clip, clip_on, use_peephole, bi, bc, bf, bo, out)
        grid.sync()


@cuda.jit(device=True)
def backward_tile(t, steps, jt, bt, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec, wci, wcf, wco, one,
                  use_peephole, bi, bc, bf, bo, dgates, dc):
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
    i_, cs_, f_, o_, ci_, co_ : [T, B, H] arrays
        Forward outputs.
    cs_grad, h_grad : [T, B, H] arrays
    w_rec : [H, 4H] array
    wci, wcf, wco : [H] arrays
    one : scalar of the compute dtype
    use_peephole : bool
    bi, bc, bf, bo : int
    dgates : [S, B, 4H] array
        Output for step ``t``; step ``t + 1`` is read.
    dc : [B, H] array
        Carried cell gradient, updated in place (each element by its
        own thread).
    """
    batch, units = cs_prev.shape
    j = jt * SJ + cuda.threadIdx.x
    b = bt * SB + cuda.threadIdx.y
    zero = one - one
    acc = next_step_dot(t, steps, dgates, w_rec, jt, bt, zero)
    if b < batch and j < units:
        backward_unit_at(t, b, j, h_grad[t, b, j] + acc, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, wci, wcf, wco,
                         one, use_peephole, bi, bc, bf, bo, dgates, dc)


@kernel("fused")
def backward_step(t: I64, steps: I64, cs_prev: A2, i_: A3, cs_: A3, f_: A3, o_: A3, ci_: A3, co_: A3, cs_grad: A3,
                  h_grad: A3, w_rec: A2, wci: A1, wcf: A1, wco: A1, one: SCALAR, use_peephole: BOOL, bi: I64, bc: I64,
                  bf: I64, bo: I64, dgates: A3, dc: A2):
    """One backward step; grid ``(ceil(H / SJ), ceil(B / SB))``, block ``(SJ, SB)``."""
    backward_tile(t, steps, cuda.blockIdx.x, cuda.blockIdx.y, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad,
                  h_grad, w_rec, wci, wcf, wco, one, use_peephole, bi, bc, bf, bo, dgates, dc)


@kernel("fused")
def backward_persistent(steps: I64, cs_prev: A2, i_: A3, cs_: A3, f_: A3, o_: A3, ci_: A3, co_: A3, cs_grad: A3,
                        h_grad: A3, w_rec: A2, wci: A1, wcf: A1, wco: A1, one: SCALAR, use_peephole: BOOL, bi: I64,
                        bc: I64, bf: I64, bo: I64, dgates: A3, dc: A2):
    """All backward steps, ``S - 1 .. 0``, in one cooperative launch, block ``(SJ, SB)``."""
    grid = cuda.cg.this_grid()
    batch, units = cs_prev.shape
    tiles_j = (units + SJ - 1) // SJ
    tiles = tiles_j * ((batch + SB - 1) // SB)
    for step in range(steps):
        t = steps - 1 - step
        for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
            backward_tile(t, steps, tile % tiles_j, tile // tiles_j, cs_prev, i_, cs_, f_, o_, ci_, co_,
                          cs_grad, h_grad, w_rec, wci, wcf, wco, one, use_peephole, bi, bc, bf, bo, dgates, dc)
        grid.sync()


@kernel("fused")
def forward_gates(t: I64, xw: A3, cs_prev: A2, wci: A1, wcf: A1, wco: A1, one: SCALAR, forget_bias: SCALAR,
                  cell_clip: SCALAR, clip_on: BOOL, use_peephole: BOOL, bi: I64, bc: I64, bf: I64, bo: I64, out: A4):
    """The gate maths of step ``t`` once ``xw[t]`` holds the whole pre-activations (cuBLAS added ``h_{t-1} @ W_h``).

    A grid-stride loop over the ``B * H`` units of the step: the per-step
    GEMM loop of larger batches (:func:`nblstm.cuda.fused._forward_gemm_steps`).
    """
    batch, units = cs_prev.shape
    for e in range(cuda.grid(1), batch * units, cuda.gridsize(1)):
        b = e // units
        j = e % units
        forward_unit_at(t, b, j, xw[t, b, bi * units + j], xw[t, b, bc * units + j], xw[t, b, bf * units + j],
                        xw[t, b, bo * units + j], cs_prev, wci, wcf, wco, one, forget_bias, cell_clip, clip_on,
                        use_peephole, out)


@kernel("fused")
def backward_gates(t: I64, steps: I64, dh: A2, cs_prev: A2, i_: A3, cs_: A3, f_: A3, o_: A3, ci_: A3, co_: A3,
                   cs_grad: A3, h_grad: A3, wci: A1, wcf: A1, wco: A1, one: SCALAR, use_peephole: BOOL, bi: I64,
                   bc: I64, bf: I64, bo: I64, dgates: A3, dc: A2):
    """The backward gate maths of step ``t`` once ``dh`` holds ``dgates[t + 1] @ W_h^T`` (not read at the last step).

    A grid-stride loop over the ``B * H`` units of the step (the per-step
    GEMM loop of larger batches).
    """
    batch, units = cs_prev.shape
    last = t + 1 >= steps
    for e in range(cuda.grid(1), batch * units, cuda.gridsize(1)):
        b = e // units
        j = e % units
        carried = h_grad[t, b, j] if last else h_grad[t, b, j] + dh[b, j]
        backward_unit_at(t, b, j, carried, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, wci, wcf, wco, one,
                         use_peephole, bi, bc, bf, bo, dgates, dc)
