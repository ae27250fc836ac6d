"""A step tile's slices of the recurrent GEMMs: device functions shared by the ops' and the cell's step kernels.

A step kernel's block owns a tile of ``SB`` batch rows by ``SJ`` columns
(hidden units, or projected columns); thread ``(tx, ty)`` owns one element.
These functions accumulate that element's products over shared-memory K
tiles of ``SK``; every thread of the block must call them (they synchronise
the block). Their shared arrays take the dtype of the weights (``w``,
``a``): one device function, specialised on its argument types.

:data:`unit_options` is the one way a kernel of either family turns the
call's options into the unit functions' record.
"""

from numba import cuda

from .. import spec
from .config import GATE_COLS, SB, SIMULATOR, SJ, SK, SK_PAD

__all__ = ["gate_dots", "next_step_dot", "row_dot", "unit_options"]

#: :func:`nblstm.spec.unit_options` as the kernels call it: the call's options
#: (:class:`nblstm.options.KernelOptions`, bounds in the compute dtype:
#: :meth:`nblstm.cuda.launch.Launcher.kernel_options`) as the unit functions'
#: :class:`nblstm.spec.UnitOptions`. In the simulator its Python function: a
#: compiled call's record would come back with Python floats, which would
#: promote the simulated gate maths to float64.
unit_options = spec.unit_options.py_func if SIMULATOR else spec.unit_options

_STEP_THREADS = SJ * SB


@cuda.jit(device=True)
def gate_dots(t, jt, bt, first, seq, w, bi, bc, bf, bo, zero):
    """This thread's four gate columns of ``h @ w``, where ``h`` is ``first`` at ``t == 0``, else ``seq[t - 1]``.

    Thread ``(tx, ty)`` of the tile ``(jt, bt)`` owns unit
    ``j = jt * SJ + tx`` of batch row ``b = bt * SB + ty``; it returns
    ``(sum_k h[b, k] w[k, g H + j] for g in (bi, bc, bf, bo))``,
    accumulated over shared-memory K tiles. Rows and units outside the
    arrays read zeros (their results are not used). Every thread of the
    block must call this (it synchronises the block). Shared by the
    fused ops' and the cell's forward steps.

    Parameters
    ----------
    t, jt, bt : int
    first : [B, K] array
        ``h`` of step 0 (the initial state).
    seq : [S, B, K] array
        ``h`` of the steps computed so far (``seq[t - 1]`` is read).
    w : [K, 4H] array
        Recurrent weights.
    bi, bc, bf, bo : int
        Gate block index of i, ci, f and o in the layout.
    zero : scalar of the compute dtype

    Returns
    -------
    tuple
        ``(acc_i, acc_c, acc_f, acc_o)``.
    """
    batch, k_total = first.shape
    units = w.shape[1] // 4
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tid = ty * SJ + tx
    h_s = cuda.shared.array((SB, SK), w.dtype)
    w_s = cuda.shared.array((SK, GATE_COLS), w.dtype)
    acc_i = zero
    acc_c = zero
    acc_f = zero
    acc_o = zero
    for k0 in range(0, k_total, SK):
        for e in range(tid, SB * SK, _STEP_THREADS):
            r = e // SK
            kk = k0 + e % SK
            bb = bt * SB + r
            value = zero
            if bb < batch and kk < k_total:
                value = first[bb, kk] if t == 0 else seq[t - 1, bb, kk]
            h_s[r, e % SK] = value
        # w_s[kk, g * SJ + u] = w[k0 + kk, block_g * H + jt * SJ + u],
        # gates g in the order i, ci, f, o.
        for e in range(tid, SK * 4 * SJ, _STEP_THREADS):
            kk = e // (4 * SJ)
            rest = e % (4 * SJ)
            g = rest // SJ
            jj = jt * SJ + rest % SJ
            block = bi if g == 0 else (bc if g == 1 else (bf if g == 2 else bo))
            value = zero
            if k0 + kk < k_total and jj < units:
                value = w[k0 + kk, block * units + jj]
            w_s[kk, rest] = value
        cuda.syncthreads()
        for kk in range(SK):
            hv = h_s[ty, kk]
            acc_i += hv * w_s[kk, tx]
            acc_c += hv * w_s[kk, SJ + tx]
            acc_f += hv * w_s[kk, 2 * SJ + tx]
            acc_o += hv * w_s[kk, 3 * SJ + tx]
        cuda.syncthreads()
    return acc_i, acc_c, acc_f, acc_o


@cuda.jit(device=True)
def row_dot(a, b_mat, trans_b, nt, rt, zero):
    """This thread's element of ``a @ op(b_mat)`` in the tile ``(nt, rt)``.

    Thread ``(tx, ty)`` owns column ``n = nt * SJ + tx`` of row
    ``r = rt * SB + ty`` and returns ``sum_k a[r, k] op(b_mat)[k, n]``,
    accumulated over shared-memory K tiles; rows and columns outside the
    arrays read zeros. Every thread of the block must call this (it
    synchronises the block). The fused ops' backward step uses it for the
    carried ``dh``; the cell for its projection and its carried gradients.

    Parameters
    ----------
    a : [R, K] array
    b_mat : [N, K] array when ``trans_b``, else [K, N]
    trans_b : bool
    nt, rt : int
    zero : scalar of the compute dtype
    """
    rows, k_total = a.shape
    n_total = b_mat.shape[0] if trans_b else b_mat.shape[1]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tid = ty * SJ + tx
    a_s = cuda.shared.array((SB, SK), a.dtype)
    # One padding column (SK_PAD): thread tx reads row tx, so an odd row
    # length spreads a warp's reads over the shared-memory banks.
    b_s = cuda.shared.array((SJ, SK_PAD), a.dtype)
    acc = zero
    for k0 in range(0, k_total, SK):
        for e in range(tid, SB * SK, _STEP_THREADS):
            r = e // SK
            kk = k0 + e % SK
            rr = rt * SB + r
            value = zero
            if rr < rows and kk < k_total:
                value = a[rr, kk]
            a_s[r, e % SK] = value
        # Consecutive threads load consecutive elements of b_mat's rows
        # (coalesced), whichever way it is stored.
        for e in range(tid, SJ * SK, _STEP_THREADS):
            if trans_b:
                u = e // SK
                kk = e % SK
            else:
                kk = e // SJ
                u = e % SJ
            nn = nt * SJ + u
            value = zero
            if nn < n_total and k0 + kk < k_total:
                value = b_mat[nn, k0 + kk] if trans_b else b_mat[k0 + kk, nn]
            b_s[u, kk] = value
        cuda.syncthreads()
        for kk in range(SK):
            acc += a_s[ty, kk] * b_s[tx, kk]
        cuda.syncthreads()
    return acc


@cuda.jit(device=True)
def next_step_dot(t, steps, dgates, w_rec, nt, rt, zero):
    """``row_dot(dgates[t + 1], w_rec, True, ...)``: the gradient a backward
    step carries from step ``t + 1`` into ``t``; zero at the last step.
    The condition is the same for the whole block, so every thread of a
    block calls ``row_dot`` (which synchronizes) or none does."""
    if t + 1 < steps:
        return row_dot(dgates[t + 1], w_rec, True, nt, rt, zero)
    return zero
