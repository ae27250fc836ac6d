"""CUDA target: ``@cuda.jit`` kernels and their host drivers.

Imported lazily by :mod:`nblstm.ops` when GPU arrays are seen; importing it
compiles nothing and needs no driver (every kernel is lazy: no eager
signatures). The entry points :func:`forward`, :func:`backward`,
:func:`cell_forward` and :func:`cell_backward` have the signatures of those
in :mod:`nblstm.cpu`, take arrays that live on a GPU (anything with
``__cuda_array_interface__``: Numba device arrays, CuPy arrays, PyTorch CUDA
tensors; the simulator's arrays under ``NUMBA_ENABLE_CUDASIM=1``) and return
arrays of the caller's kind, with no copy through the host.

How the work is laid out (DESIGN.md, "What the fastest LSTMs do"):

- Forward: one tiled shared-memory GEMM computes the input projection of
  all steps plus the bias, ``xw = x @ w[:I] + b`` (``[S * B, 4H]``). Then
  each step is one launch of a fused kernel: a block owns a tile of
  ``_SB`` batch rows by ``_SJ`` hidden units, computes the four gate
  columns of those units of ``h_{t-1} @ w[I:]`` (its slice of the
  recurrent GEMM) and runs the gate maths of :mod:`nblstm.spec` on them
  while they are in registers.
- Backward: each step is one launch of a fused kernel that computes the
  carried ``dh = dgates[t + 1] @ w[I:]^T`` for its tile and the gate
  gradients of :func:`nblstm.spec.backward_unit`. ``x_grad``,
  ``h_prev_grad`` and ``w_grad`` are large GEMMs after the loop;
  ``b_grad`` and the peephole gradients are column reductions.
- A step's tile is a device function (:func:`_kernels` ``forward_tile``,
  ``backward_tile``) called by the per-step kernels and by persistent
  kernels that loop over all steps in one cooperative launch with a grid
  barrier per step (used for small batches, where launches dominate).
- float16 arrays are cast to float32 on the device, computed in float32
  and cast back (float16 storage, float32 arithmetic, as on the CPU).
  Non-contiguous inputs are copied to contiguous ones on the device, so
  every kernel sees C-contiguous arrays of one compute dtype: few
  specialisations.

Every kernel and device function is deterministic: no atomics, each output
element is written by one thread, reductions run in a fixed order.
"""

import contextlib
import functools
import sys

import numpy as np
from numba import cuda, types

from . import spec
from .spec import GATE_BLOCKS

try:  # numba-cuda keeps its own configuration module.
    from numba.cuda.core import config as _cuda_config
except ImportError:  # pragma: no cover - older numba-cuda
    from numba import config as _cuda_config

#: True when running in Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).
SIMULATOR = bool(_cuda_config.ENABLE_CUDASIM)

# Tile sizes. The simulator runs every thread as a Python thread: it gets
# tiny tiles, which also makes the tiny test shapes span several tiles, so
# the boundary handling is exercised.
if SIMULATOR:
    _GEMM_TX, _GEMM_TY, _GEMM_RM, _GEMM_RN, _GEMM_BK = 2, 2, 2, 2, 2
    _SJ, _SB, _SK = 2, 2, 3
    _LINEAR_THREADS = 8
else:
    # 256 threads, each a 4 x 4 micro-tile of a 64 x 64 output tile.
    _GEMM_TX, _GEMM_TY, _GEMM_RM, _GEMM_RN, _GEMM_BK = 16, 16, 4, 4, 16
    # Step kernels: 128 threads, 32 hidden units x 4 batch rows, K tiles of 32.
    _SJ, _SB, _SK = 32, 4, 32
    _LINEAR_THREADS = 256
_GEMM_BM = _GEMM_TY * _GEMM_RM
_GEMM_BN = _GEMM_TX * _GEMM_RN
#: CUDA's limit on gridDim.y (and z); gridDim.x may reach 2**31 - 1.
_MAX_GRID_Y = 65535
#: Most blocks of a one-dimensional launch: those kernels are grid-stride loops.
_LINEAR_MAX_BLOCKS = 1024

#: When to use the persistent (cooperative, one launch for all steps)
#: kernels: ``"auto"`` (batch at most :data:`PERSISTENT_MAX_BATCH` and the
#: tiles fit in one cooperative grid), ``True`` (whenever possible) or
#: ``False`` (never).
PERSISTENT = "auto"
PERSISTENT_MAX_BATCH = 16

_COMPUTE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _ceil_div(a, b):
    return -(-a // b)


# ---------------------------------------------------------------------------
# Kernels that need no shared memory: generic, specialised lazily on their
# argument types.


@cuda.jit
def _fill(out, value):
    """``out[:] = value``; ``out: [N]`` C-contiguous."""
    for k in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[k] = value


@cuda.jit
def _fill2(out, value):
    """``out[:, :] = value``; ``out: [N0, N1]``, any strides (e.g. the tails of several outputs)."""
    n1 = out.shape[1]
    for k in range(cuda.grid(1), out.shape[0] * n1, cuda.gridsize(1)):
        out[k // n1, k % n1] = value


@cuda.jit
def _copy1(src, dst):
    """``dst[:] = src`` with a cast; ``src, dst: [N]``, any strides."""
    for k in range(cuda.grid(1), dst.shape[0], cuda.gridsize(1)):
        dst[k] = src[k]


@cuda.jit
def _copy2(src, dst):
    """``dst[:, :] = src`` with a cast; ``src, dst: [N0, N1]``, any strides."""
    n1 = dst.shape[1]
    for k in range(cuda.grid(1), dst.shape[0] * n1, cuda.gridsize(1)):
        dst[k // n1, k % n1] = src[k // n1, k % n1]


@cuda.jit
def _copy3(src, dst):
    """``dst[:, :, :] = src`` with a cast; ``src, dst: [N0, N1, N2]``, any strides."""
    n1 = dst.shape[1]
    n2 = dst.shape[2]
    for k in range(cuda.grid(1), dst.shape[0] * n1 * n2, cuda.gridsize(1)):
        a = k // (n1 * n2)
        r = k % (n1 * n2)
        dst[a, r // n2, r % n2] = src[a, r // n2, r % n2]


@cuda.jit
def _column_sums(m, out, zero):
    """``out[n] = sum_r m[r, n]``; ``m: [R, N]``, ``out: [N]``, ``zero`` of their dtype.

    One thread per column, rows summed in order: deterministic, and the
    reads of a warp are coalesced along the row.
    """
    for n in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        s = zero
        for r in range(m.shape[0]):
            s += m[r, n]
        out[n] = s


@cuda.jit
def _peephole_grads(steps, cs_prev, cs_, dgates, bi, bf, bo, zero, wci_grad, wcf_grad, wco_grad):
    """Peephole weight gradients summed over steps and batch.

    Parameters
    ----------
    steps : int
        ``S``, the number of steps computed.
    cs_prev : [B, H] array
    cs_ : [T, B, H] array, T >= S
        Forward cell states.
    dgates : [S, B, 4H] array
        Gradients of the gate pre-activations, caller's layout.
    bi, bf, bo : int
        Gate block index of i, f and o in the layout.
    zero : scalar of the compute dtype
    wci_grad, wcf_grad, wco_grad : [H] arrays
        Outputs: ``sum di * c_prev``, ``sum df * c_prev``, ``sum do * cs``.
    """
    batch, units = cs_prev.shape
    for j in range(cuda.grid(1), units, cuda.gridsize(1)):
        si = zero
        sf = zero
        so = zero
        for t in range(steps):
            for b in range(batch):
                c_prev = cs_prev[b, j] if t == 0 else cs_[t - 1, b, j]
                si += dgates[t, b, bi * units + j] * c_prev
                sf += dgates[t, b, bf * units + j] * c_prev
                so += dgates[t, b, bo * units + j] * cs_[t, b, j]
        wci_grad[j] = si
        wcf_grad[j] = sf
        wco_grad[j] = so


# ---------------------------------------------------------------------------
# Kernels with shared memory: shared and local arrays need their dtype at
# compile time, so these are built per compute dtype by a factory (still
# lazy: nothing compiles until the first launch).


@functools.cache
def _kernels(dtype):
    """The shared-memory kernels and device functions for one compute dtype.

    Parameters
    ----------
    dtype : numpy.dtype
        float32 or float64.

    Returns
    -------
    types.SimpleNamespace
        ``gemm``, the device functions ``gate_dots``, ``row_dot`` and ``next_step_dot`` (the
        step kernels' slices of the recurrent GEMMs, shared with
        :mod:`nblstm.cuda_cell`), ``forward_tile``, ``forward_step``,
        ``forward_persistent``, ``backward_tile``, ``backward_step``,
        ``backward_persistent``.
    """
    import types as pytypes

    dt = {np.dtype(np.float32): types.float32, np.dtype(np.float64): types.float64}[np.dtype(dtype)]
    tx_, ty_, rm_, rn_, bk_ = _GEMM_TX, _GEMM_TY, _GEMM_RM, _GEMM_RN, _GEMM_BK
    bm_, bn_ = _GEMM_BM, _GEMM_BN
    nthreads_gemm = tx_ * ty_
    sj_, sb_, sk_ = _SJ, _SB, _SK
    nthreads_step = sj_ * sb_
    # Shapes of shared arrays must be compile-time constants: computed here,
    # not in device code (where ``4 * sj_`` would be a run-time int64).
    gate_cols_ = 4 * sj_
    sk_pad_ = sk_ + 1

    @cuda.jit(device=True)
    def load_k_tile(src, dst, k_major, k0, x0, k_total, x_total, tid, zero):
        """``dst[kk, xx] = op(src)[k0 + kk, x0 + xx]`` (zero outside ``op(src)``), by all ``TX * TY`` threads.

        ``op(src)`` is ``src: [K, X]`` when ``k_major``, ``src.T`` of ``src: [X, K]``
        otherwise. Consecutive threads walk the stored array's contiguous
        axis (coalesced global reads).
        """
        bk, bx = dst.shape
        for e in range(tid, bk * bx, nthreads_gemm):
            if k_major:
                kk = e // bx
                xx = e % bx
            else:
                xx = e // bk
                kk = e % bk
            if x0 + xx < x_total and k0 + kk < k_total:
                dst[kk, xx] = src[k0 + kk, x0 + xx] if k_major else src[x0 + xx, k0 + kk]
            else:
                dst[kk, xx] = zero

    @cuda.jit
    def gemm(a, b, c, bias, trans_a, trans_b, accumulate, use_bias):
        """``c = op(a) @ op(b) [+ bias] [+ c]``, tiled in shared memory.

        Parameters
        ----------
        a : [M, K] array, or [K, M] when ``trans_a``
        b : [K, N] array, or [N, K] when ``trans_b``
        c : [M, N] array
            Output (read too when ``accumulate``).
        bias : [N] array
            Added when ``use_bias`` (any array otherwise).
        trans_a, trans_b, accumulate, use_bias : bool

        Launch with ``(ceil(N / BN), min(ceil(M / BM), 65535))`` blocks of
        ``(TX, TY)`` threads (blocks stride over the M tiles); each thread
        owns an ``RM x RN`` micro-tile, strided by ``TY`` rows and ``TX``
        columns so that neighbouring threads read neighbouring shared-memory
        words.
        """
        m_total, n_total = c.shape
        k_total = a.shape[0] if trans_a else a.shape[1]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        tid = ty * tx_ + tx
        n0 = cuda.blockIdx.x * bn_
        a_s = cuda.shared.array((bk_, bm_), dt)
        b_s = cuda.shared.array((bk_, bn_), dt)
        acc = cuda.local.array((rm_, rn_), dt)
        zero = dt(0.0)
        # Blocks stride over the M tiles: gridDim.y is at most 65535 (M = S * B rows can need more tiles).
        for m0 in range(cuda.blockIdx.y * bm_, m_total, cuda.gridDim.y * bm_):
            for r in range(rm_):
                for s in range(rn_):
                    acc[r, s] = zero
            for k0 in range(0, k_total, bk_):
                load_k_tile(a, a_s, trans_a, k0, m0, k_total, m_total, tid, zero)
                load_k_tile(b, b_s, not trans_b, k0, n0, k_total, n_total, tid, zero)
                cuda.syncthreads()
                for kk in range(bk_):
                    for r in range(rm_):
                        av = a_s[kk, ty + r * ty_]
                        for s in range(rn_):
                            acc[r, s] += av * b_s[kk, tx + s * tx_]
                cuda.syncthreads()
            for r in range(rm_):
                m = m0 + ty + r * ty_
                if m < m_total:
                    for s in range(rn_):
                        n = n0 + tx + s * tx_
                        if n < n_total:
                            value = acc[r, s]
                            if use_bias:
                                value += bias[n]
                            if accumulate:
                                value += c[m, n]
                            c[m, n] = value

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
        tid = ty * sj_ + tx
        h_s = cuda.shared.array((sb_, sk_), dt)
        w_s = cuda.shared.array((sk_, gate_cols_), dt)
        acc_i = zero
        acc_c = zero
        acc_f = zero
        acc_o = zero
        for k0 in range(0, k_total, sk_):
            for e in range(tid, sb_ * sk_, nthreads_step):
                r = e // sk_
                kk = k0 + e % sk_
                bb = bt * sb_ + r
                value = zero
                if bb < batch and kk < k_total:
                    value = first[bb, kk] if t == 0 else seq[t - 1, bb, kk]
                h_s[r, e % sk_] = value
            # w_s[kk, g * SJ + u] = w[k0 + kk, block_g * H + jt * SJ + u],
            # gates g in the order i, ci, f, o.
            for e in range(tid, sk_ * 4 * sj_, nthreads_step):
                kk = e // (4 * sj_)
                rest = e % (4 * sj_)
                g = rest // sj_
                jj = jt * sj_ + rest % sj_
                block = bi if g == 0 else (bc if g == 1 else (bf if g == 2 else bo))
                value = zero
                if k0 + kk < k_total and jj < units:
                    value = w[k0 + kk, block * units + jj]
                w_s[kk, rest] = value
            cuda.syncthreads()
            for kk in range(sk_):
                hv = h_s[ty, kk]
                acc_i += hv * w_s[kk, tx]
                acc_c += hv * w_s[kk, sj_ + tx]
                acc_f += hv * w_s[kk, 2 * sj_ + tx]
                acc_o += hv * w_s[kk, 3 * sj_ + tx]
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
        tid = ty * sj_ + tx
        a_s = cuda.shared.array((sb_, sk_), dt)
        # One padding column: thread tx reads row tx, so an odd row length
        # spreads a warp's reads over the shared-memory banks.
        b_s = cuda.shared.array((sj_, sk_pad_), dt)
        acc = zero
        for k0 in range(0, k_total, sk_):
            for e in range(tid, sb_ * sk_, nthreads_step):
                r = e // sk_
                kk = k0 + e % sk_
                rr = rt * sb_ + r
                value = zero
                if rr < rows and kk < k_total:
                    value = a[rr, kk]
                a_s[r, e % sk_] = value
            # Consecutive threads load consecutive elements of b_mat's rows
            # (coalesced), whichever way it is stored.
            for e in range(tid, sj_ * sk_, nthreads_step):
                if trans_b:
                    u = e // sk_
                    kk = e % sk_
                else:
                    kk = e // sj_
                    u = e % sj_
                nn = nt * sj_ + u
                value = zero
                if nn < n_total and k0 + kk < k_total:
                    value = b_mat[nn, k0 + kk] if trans_b else b_mat[k0 + kk, nn]
                b_s[u, kk] = value
            cuda.syncthreads()
            for kk in range(sk_):
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

    @cuda.jit(device=True)
    def forward_tile(t, jt, bt, xw, cs_prev, h_prev, w_rec, wci, wcf, wco, one, forget_bias, cell_clip,
                     use_peephole, bi, bc, bf, bo, out):
        """Step ``t`` of the tile ``(jt, bt)``: ``_SB`` batch rows by ``_SJ`` units.

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
        use_peephole : bool
        bi, bc, bf, bo : int
            Gate block index of i, ci, f and o in the layout.
        out : [7, T, B, H] array
            Outputs ``i, cs, f, o, ci, co, h`` in one array (one kernel
            argument instead of seven); step ``t - 1`` of ``cs`` (``out[1]``)
            and ``h`` (``out[6]``) is read.
        """
        batch, units = cs_prev.shape
        j = jt * sj_ + cuda.threadIdx.x
        b = bt * sb_ + cuda.threadIdx.y
        acc_i, acc_c, acc_f, acc_o = gate_dots(t, jt, bt, h_prev, out[6], w_rec, bi, bc, bf, bo, one - one)
        if b < batch and j < units:
            c_prev = cs_prev[b, j] if t == 0 else out[1, t - 1, b, j]
            i, ci, f, o, cs, co, h = spec.forward_unit(
                acc_i + xw[t, b, bi * units + j],
                acc_c + xw[t, b, bc * units + j],
                acc_f + xw[t, b, bf * units + j],
                acc_o + xw[t, b, bo * units + j],
                c_prev, wci[j], wcf[j], wco[j], forget_bias, cell_clip, use_peephole, one,
            )
            out[0, t, b, j] = i
            out[1, t, b, j] = cs
            out[2, t, b, j] = f
            out[3, t, b, j] = o
            out[4, t, b, j] = ci
            out[5, t, b, j] = co
            out[6, t, b, j] = h

    @cuda.jit
    def forward_step(t, xw, cs_prev, h_prev, w_rec, wci, wcf, wco, one, forget_bias, cell_clip, use_peephole,
                     bi, bc, bf, bo, out):
        """One forward step; grid ``(ceil(H / SJ), ceil(B / SB))``, block ``(SJ, SB)``."""
        forward_tile(t, cuda.blockIdx.x, cuda.blockIdx.y, xw, cs_prev, h_prev, w_rec, wci, wcf, wco, one,
                     forget_bias, cell_clip, use_peephole, bi, bc, bf, bo, out)

    @cuda.jit
    def forward_persistent(steps, xw, cs_prev, h_prev, w_rec, wci, wcf, wco, one, forget_bias, cell_clip,
                           use_peephole, bi, bc, bf, bo, out):
        """All ``steps`` forward steps in one cooperative launch, block ``(SJ, SB)``.

        Blocks stride over the tiles; a grid barrier separates the steps
        (step ``t`` reads ``h`` of step ``t - 1`` written by other blocks).
        """
        grid = cuda.cg.this_grid()
        batch, units = cs_prev.shape
        tiles_j = (units + sj_ - 1) // sj_
        tiles = tiles_j * ((batch + sb_ - 1) // sb_)
        for t in range(steps):
            for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
                forward_tile(t, tile % tiles_j, tile // tiles_j, xw, cs_prev, h_prev, w_rec, wci, wcf, wco, one,
                             forget_bias, cell_clip, use_peephole, bi, bc, bf, bo, out)
            grid.sync()

    @cuda.jit(device=True)
    def backward_tile(t, steps, jt, bt, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec, wci, wcf,
                      wco, one, use_peephole, bi, bc, bf, bo, dgates, dc):
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
        j = jt * sj_ + cuda.threadIdx.x
        b = bt * sb_ + cuda.threadIdx.y
        zero = one - one
        acc = next_step_dot(t, steps, dgates, w_rec, jt, bt, zero)
        if b < batch and j < units:
            c_prev = cs_prev[b, j] if t == 0 else cs_[t - 1, b, j]
            di, dci, df, do, dc_prev = spec.backward_unit(
                h_grad[t, b, j] + acc, cs_grad[t, b, j] + dc[b, j],
                i_[t, b, j], ci_[t, b, j], f_[t, b, j], o_[t, b, j], co_[t, b, j], c_prev,
                wci[j], wcf[j], wco[j], use_peephole, one,
            )
            dgates[t, b, bi * units + j] = di
            dgates[t, b, bc * units + j] = dci
            dgates[t, b, bf * units + j] = df
            dgates[t, b, bo * units + j] = do
            dc[b, j] = dc_prev

    @cuda.jit
    def backward_step(t, steps, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec, wci, wcf, wco, one,
                      use_peephole, bi, bc, bf, bo, dgates, dc):
        """One backward step; grid ``(ceil(H / SJ), ceil(B / SB))``, block ``(SJ, SB)``."""
        backward_tile(t, steps, cuda.blockIdx.x, cuda.blockIdx.y, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad,
                      h_grad, w_rec, wci, wcf, wco, one, use_peephole, bi, bc, bf, bo, dgates, dc)

    @cuda.jit
    def backward_persistent(steps, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec, wci, wcf, wco, one,
                            use_peephole, bi, bc, bf, bo, dgates, dc):
        """All backward steps, ``S - 1 .. 0``, in one cooperative launch, block ``(SJ, SB)``."""
        grid = cuda.cg.this_grid()
        batch, units = cs_prev.shape
        tiles_j = (units + sj_ - 1) // sj_
        tiles = tiles_j * ((batch + sb_ - 1) // sb_)
        for step in range(steps):
            t = steps - 1 - step
            for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
                backward_tile(t, steps, tile % tiles_j, tile // tiles_j, cs_prev, i_, cs_, f_, o_, ci_, co_,
                              cs_grad, h_grad, w_rec, wci, wcf, wco, one, use_peephole, bi, bc, bf, bo, dgates, dc)
            grid.sync()

    return pytypes.SimpleNamespace(
        gemm=gemm,
        gate_dots=gate_dots,
        row_dot=row_dot,
        next_step_dot=next_step_dot,
        forward_tile=forward_tile,
        forward_step=forward_step,
        forward_persistent=forward_persistent,
        backward_tile=backward_tile,
        backward_step=backward_step,
        backward_persistent=backward_persistent,
    )


# ---------------------------------------------------------------------------
# Host side: arrays, streams, devices.
#
# Host overhead matters as much as the kernels here: at small sizes a call is
# bound by what the host does per launch and per allocation (each costs
# driver calls). So a call makes one device allocation for all its results
# and takes its temporaries (input projections, gate gradients, dtype casts)
# from scratch memory kept between calls (:class:`_Arena`); the per-step loop
# launches a kernel whose arguments were converted once (:class:`_Repeat`);
# the forward kernels get their seven outputs as one array; with one visible
# GPU no pointer is queried for its device.


class _HostView:
    """Exposes a ``__cuda_array_interface__`` as ``__array_interface__``.

    Only for the simulator, where "device" memory is host memory: it lets a
    foreign object's data be viewed by NumPy without a copy.
    """

    def __init__(self, cai, owner):
        self.__array_interface__ = {
            "shape": tuple(cai["shape"]),
            "typestr": cai["typestr"],
            "data": (cai["data"][0], False),
            "strides": cai.get("strides"),
            "version": 3,
        }
        self._owner = owner


_GPU_USABLE = False


def _require_gpu():
    global _GPU_USABLE
    if _GPU_USABLE:
        return
    if not cuda.is_available():
        raise RuntimeError(
            "GPU arrays (objects with __cuda_array_interface__) were given, but CUDA is not usable here: "
            "numba.cuda.is_available() is False (no NVIDIA GPU, no driver, or no NVVM). Pass NumPy arrays to "
            "run on the CPU."
        )
    _GPU_USABLE = True


@functools.cache
def _gpu_count():
    """Number of GPUs this process sees (enumerated once)."""
    try:
        return len(cuda.gpus)
    except Exception:  # noqa: BLE001 - no device list: treat as one GPU
        return 1


def _device_ordinal(value):
    """The ordinal of the GPU that holds ``value``'s data, or ``None`` if unknown (empty, simulator, one GPU)."""
    if SIMULATOR or _gpu_count() <= 1:
        return None
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is None or not cai["data"][0]:
        return None
    try:
        from cuda.bindings import driver as binding
        from numba.cuda.cudadrv.driver import driver

        attr = binding.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
        return int(driver.cuPointerGetAttribute(attr, binding.CUdeviceptr(cai["data"][0])))
    except Exception:  # noqa: BLE001 - an unknown device only skips the check
        return None


def _check_same_device(named):
    """Raise ``TypeError`` naming the arguments when the arrays are on different GPUs.

    Parameters
    ----------
    named : dict
        ``{name: array or None}``.

    Returns
    -------
    int or None
        The common device ordinal (``None`` when unknown).
    """
    by_device = {}
    for name, value in named.items():
        if value is not None:
            ordinal = _device_ordinal(value)
            if ordinal is not None:
                by_device.setdefault(ordinal, []).append(name)
    if len(by_device) > 1:
        where = "; ".join(f"GPU {d}: {', '.join(names)}" for d, names in sorted(by_device.items()))
        raise TypeError(f"arrays must all be on one GPU; {where}")
    return next(iter(by_device), None)


@contextlib.contextmanager
def _on_device(ordinal):
    """Make the GPU that holds the arrays the current one for the call."""
    if SIMULATOR or ordinal is None or cuda.get_current_device().id == ordinal:
        yield
    else:
        with cuda.gpus[ordinal]:
            yield


def _stream_handle(stream):
    """The raw handle of a Numba stream (0 for the default stream), or ``None`` if it has none."""
    if isinstance(stream, int):
        return stream
    handle = getattr(stream, "handle", None)
    if handle is None:
        return None
    try:
        return int(handle)
    except (TypeError, ValueError):
        return None


def _as_device(value, stream=0):
    """``value`` as a Numba device array (simulator array in the simulator), without a copy.

    A foreign array's producer stream (``"stream"`` of its interface) is
    synchronised only when it is not the launch stream ``stream`` (work on
    one stream is ordered already).
    """
    if value is None or getattr(value, "__cuda_ndarray__", False):
        return value
    cai = value.__cuda_array_interface__
    if SIMULATOR:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return FakeCUDAArray(np.asarray(_HostView(cai, value)))
    producer = cai.get("stream")
    handle = _stream_handle(stream)
    # 1 and 2 are the legacy and per-thread default streams, ordered with the default stream 0.
    same = producer is None or producer == handle or (handle == 0 and producer in (1, 2))
    return cuda.from_cuda_array_interface(cai, owner=value, sync=not same)


@functools.lru_cache(maxsize=64)
def _external_stream(handle):
    """A Numba stream for a foreign stream handle (one object per handle)."""
    return cuda.external_stream(handle)


def _stream(stream, like):
    """The Numba stream to launch on.

    ``stream`` may be a Numba stream, ``0``, a CuPy or PyTorch stream (their
    handle is wrapped with ``cuda.external_stream``), or a raw handle. With
    ``None``, the current stream of CuPy or PyTorch when ``like`` is one of
    their arrays (so the work is ordered with theirs), else the default stream.
    """
    if stream is None:
        module = type(like).__module__.split(".")[0]
        if SIMULATOR or module not in ("cupy", "torch"):
            return 0
        if module == "cupy":
            stream = sys.modules["cupy"].cuda.get_current_stream()
        else:
            stream = sys.modules["torch"].cuda.current_stream(like.device)
    if SIMULATOR or stream == 0:
        return stream
    for attribute in ("cuda_stream", "ptr"):  # PyTorch, CuPy
        handle = getattr(stream, attribute, None)
        if isinstance(handle, int):
            return _external_stream(handle) if handle else 0
    if isinstance(stream, int):
        return _external_stream(stream)
    return stream


def _wrap_like(like, ordinal):
    """A function returning a result array in the kind of ``like`` (CuPy, PyTorch or Numba)."""
    module = type(like).__module__.split(".")[0]
    if not SIMULATOR and module == "cupy":
        return sys.modules["cupy"].asarray
    if not SIMULATOR and module == "torch":
        torch = sys.modules["torch"]
        device = like.device if ordinal is None else torch.device("cuda", ordinal)
        return lambda a: torch.as_tensor(a, device=device)
    return lambda a: a


def _storage_dtype(value):
    """The dtype of a GPU array, read without converting it."""
    if getattr(value, "__cuda_ndarray__", False):
        return np.dtype(value.dtype)
    return np.dtype(value.__cuda_array_interface__["typestr"])


def _size(shape):
    if isinstance(shape, int):
        return shape
    n = 1
    for d in shape:
        n *= int(d)
    return n


# Scratch and result regions start at multiples of this many elements
# (256 bytes in float32): aligned, coalesced accesses in every region.
_ALIGN = 64


def _padded(n):
    return -(-n // _ALIGN) * _ALIGN


class _Arena:
    """Scratch memory reused by successive calls on one device, stream and compute dtype.

    A call takes its temporaries from ``buffer`` in order; what does not fit
    is allocated for that call, and the next call allocates one buffer of the
    largest total seen (so from the second call of a size on, a call makes
    no scratch allocation). Calls on one stream run in order on the GPU, so
    a call may reuse the memory of the previous one; ``lock`` keeps the
    calls of several host threads from interleaving their launches. ``zeros``
    is a buffer of zeros that kernels only read (absent gradients).
    """

    __slots__ = ("lock", "buffer", "need", "zeros")

    def __init__(self):
        import threading

        self.lock = threading.Lock()
        self.buffer = None
        self.need = 0
        self.zeros = None


_ARENAS = {}


def _arena(device, stream):
    """The :class:`_Arena` of ``(device, stream)`` (created on first use)."""
    handle = _stream_handle(stream)
    if handle is None:
        handle = ("object", id(stream))
    elif handle == 0 and getattr(_cuda_config, "CUDA_PER_THREAD_DEFAULT_STREAM", False):
        import threading

        handle = ("per-thread", threading.get_ident())
    key = (device, handle)
    arena = _ARENAS.get(key)
    if arena is None:
        arena = _ARENAS.setdefault(key, {})
    return arena


def release_workspaces():
    """Free the scratch memory kept between calls of the CUDA target.

    It is allocated again, at the size needed, by the next call.
    """
    for arenas in list(_ARENAS.values()):
        for arena in list(arenas.values()):
            with arena.lock:
                arena.buffer = arena.zeros = None
                arena.need = 0
    _ARENAS.clear()


class _Repeat:
    """Launches of one kernel with fixed arguments after a varying int64 first one (the step index).

    On a GPU the arguments are converted to kernel parameters once, and each
    launch passes them straight to the launch function Numba itself calls:
    a step costs one launch call instead of Numba's conversion of every
    argument. Where Numba's internals differ from those this was written
    for (other versions, the simulator), each launch goes through the
    configured kernel.
    """

    def __init__(self, kernel, griddim, blockdim, stream, args):
        self._configured = kernel[griddim, blockdim, stream]
        self._args = args
        self._fast = None if SIMULATOR else self._prepare(kernel, args)

    def _prepare(self, dispatcher, args):
        import ctypes

        try:
            from numba.cuda import dispatcher as numba_dispatcher

            launch = numba_dispatcher.launch
            config_type = numba_dispatcher.LaunchConfig
            new_config = numba_dispatcher.CUDA_CORE_GE_1_0
            configured = self._configured
            all_args = (0, *args)
            kernel = dispatcher.compile(tuple(dispatcher.typeof_pyval(a) for a in all_args))
            if getattr(kernel, "debug", True) or getattr(kernel, "extensions", None):
                return None
            params, writeback = [], []
            for ty, value in zip(kernel.argument_types, all_args, strict=True):
                kernel._prepare_args(ty, value, configured.stream, writeback, params)
            if writeback or not isinstance(params[0], ctypes.c_int64):
                return None
            options = dict(grid=configured.griddim, block=configured.blockdim, shmem_size=0)
            cooperative = bool(kernel.cooperative)
            options["is_cooperative" if new_config else "cooperative_launch"] = cooperative
            config = config_type(**options)
            handle = kernel._codelibrary.get_cufunc().kernel
            stream = configured.stream
        except Exception:  # noqa: BLE001 - other Numba internals: the ordinary launch path
            return None
        rest = params[1:]

        def fast(first):
            launch(stream, config, handle, ctypes.c_int64(first), *rest)

        return fast

    def __call__(self, first):
        if self._fast is not None:
            self._fast(first)
        else:
            self._configured(first, *self._args)


class _Launcher:
    """Memory and launches of one call on one stream, in one compute dtype.

    Parameters
    ----------
    dtype : numpy.dtype
        Compute dtype (float32 or float64).
    storage : numpy.dtype
        Storage dtype of the caller's arrays (float16, float32 or float64).
    stream : Numba stream or 0
    arena : _Arena
        Scratch memory of this device, stream and compute dtype; held by the
        caller for the call.
    wrap : callable
        Turns a Numba device array into the caller's array kind.
    """

    def __init__(self, dtype, storage, stream, arena, wrap):
        self.dtype = np.dtype(dtype)
        self.storage = np.dtype(storage)
        self.stream = stream
        self.k = _kernels(self.dtype)
        self.one = self.dtype.type(1.0)
        self._arena = arena
        self._wrap = wrap
        self._used = 0
        self.scratch_total = 0
        self._results = None
        self.device = 0  # set by _call
        if arena.need and (arena.buffer is None or arena.buffer.shape[0] < arena.need):
            arena.buffer = None  # freed before the larger one is allocated
            arena.buffer = self.empty(arena.need)

    def _linear(self, kernel, n, *args):
        if n > 0:
            blocks = min(_ceil_div(n, _LINEAR_THREADS), _LINEAR_MAX_BLOCKS)
            kernel[blocks, _LINEAR_THREADS, self.stream](*args)

    def empty(self, shape, dtype=None):
        """A new device allocation (the only place this module allocates)."""
        return cuda.device_array(shape, self.dtype if dtype is None else dtype, stream=self.stream)

    def scratch(self, shape):
        """A C-contiguous array of the compute dtype, valid for this call only, from the arena."""
        n = _size(shape)
        padded = _padded(n)
        buffer = self._arena.buffer
        if buffer is not None and self._used + padded <= buffer.shape[0]:
            view = buffer[self._used:self._used + n]
            self._used += padded
        else:
            view = self.empty(n)
        self.scratch_total += padded
        return view.reshape(shape)

    def read_only_zeros(self, shape):
        """A C-contiguous array of zeros that kernels must only read (kept between calls)."""
        n = _size(shape)
        arena = self._arena
        if arena.zeros is None or arena.zeros.shape[0] < n:
            arena.zeros = None
            arena.zeros = self.empty(max(n, _ALIGN))
            self.fill_zero(arena.zeros)
        return arena.zeros[:n].reshape(shape)

    def results(self, n):
        """A flat ``[n]`` array of the compute dtype to hold all the call's results (see :meth:`finish`).

        One allocation; for float16 storage the results are computed in
        scratch memory and :meth:`finish` casts them into one allocation.
        """
        flat = self.empty(n) if self.storage == self.dtype else self.scratch(n)
        self._results = flat
        return flat

    def finish(self, parts):
        """The results as arrays of the storage dtype and the caller's kind.

        Parameters
        ----------
        parts : sequence of (int, tuple)
            ``(offset, shape)`` of each result in the flat array of :meth:`results`.

        Returns
        -------
        list
            Views of one allocation, wrapped once in the caller's kind.
        """
        flat = self._results
        if self.storage != self.dtype:
            cast = self.empty(flat.shape[0], self.storage)
            self._linear(_copy1, flat.shape[0], flat, cast)
            flat = cast
        wrapped = self._wrap(flat)
        return [wrapped[offset:offset + _size(shape)].reshape(shape) for offset, shape in parts]

    def fill_zero(self, out):
        """Zero a device array: C-contiguous, or a 2-D view with any strides."""
        size = _size(out.shape)
        if not size:
            return
        zero = out.dtype.type(0)
        if len(out.shape) == 2 and not out.is_c_contiguous():
            self._linear(_fill2, size, out, zero)
        else:
            flat = out.reshape(size)
            self._linear(_fill, size, flat, zero)

    def prepare(self, *values, keep=False):
        """Each value as a C-contiguous device array of the compute dtype.

        No copy when a value is one already; otherwise a device-side copy
        (cast) into scratch memory, or with ``keep`` into an allocation of
        its own that outlives the call (kept for a later backward pass).
        ``None`` stays ``None``.
        """
        prepared = []
        for value in values:
            if value is not None:
                value = _as_device(value, self.stream)
                if np.dtype(value.dtype) != self.dtype or not value.is_c_contiguous():
                    src = value
                    value = (self.empty if keep else self.scratch)(tuple(src.shape))
                    self.copy(src, value)
            prepared.append(value)
        return prepared

    def copy(self, src, dst):
        """``dst[...] = src`` with a cast; 1-3 dimensions, any strides."""
        kernel = {1: _copy1, 2: _copy2, 3: _copy3}[len(src.shape)]
        self._linear(kernel, _size(src.shape), src, dst)

    def elementwise(self, kernel, n, *args):
        """Launch ``kernel(*args)``, a grid-stride loop over ``n`` elements (no launch when ``n == 0``)."""
        self._linear(kernel, n, *args)

    def gemm(self, a, b, c, bias=None, trans_a=False, trans_b=False, accumulate=False):
        """``c = op(a) @ op(b) [+ bias] [+ c]`` (see :func:`_kernels` ``gemm``)."""
        m, n = c.shape
        if m == 0 or n == 0:
            return
        grid = (_ceil_div(n, _GEMM_BN), min(_ceil_div(m, _GEMM_BM), _MAX_GRID_Y))
        use_bias = bias is not None
        self.k.gemm[grid, (_GEMM_TX, _GEMM_TY), self.stream](
            a, b, c, bias if use_bias else c.reshape(m * n), bool(trans_a), bool(trans_b), bool(accumulate), use_bias)

    def column_sums(self, m, out):
        self._linear(_column_sums, out.shape[0], m, out, self.dtype.type(0))

    def peephole_grads(self, steps, cs_prev, cs_, dgates, blocks, out):
        units = cs_prev.shape[1]
        bi, _, bf, bo = blocks
        self._linear(_peephole_grads, units, steps, cs_prev, cs_, dgates, bi, bf, bo, self.dtype.type(0), *out)

    def recurrence(self, persistent, step, args, steps, batch, units, reverse=False, step_args=()):
        """Run the time loop: one cooperative launch of ``persistent``, or one launch of ``step`` per step.

        ``persistent`` is called with ``(steps, *args)``, ``step`` with
        ``(t, *step_args, *args)`` for ``t`` in order (reversed with
        ``reverse``).
        """
        block = (_SJ, _SB)
        blocks = self.persistent_grid(persistent, (steps, *args), batch, units)
        if blocks:
            persistent[blocks, block, self.stream](steps, *args)
            return
        grid = (_ceil_div(units, _SJ), _ceil_div(batch, _SB))
        launch = _Repeat(step, grid, block, self.stream, (*step_args, *args))
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            launch(t)

    def persistent_grid(self, kernel, args, batch, units):
        """Blocks for a persistent launch of ``kernel``, or 0 to use per-step launches."""
        if PERSISTENT is False or (PERSISTENT == "auto" and batch > PERSISTENT_MAX_BATCH):
            return 0
        tiles = _ceil_div(units, _SJ) * _ceil_div(batch, _SB)
        if SIMULATOR:
            # The simulator's grid barrier synchronises one block only.
            return 1
        limit = _cooperative_limit(kernel, tuple(kernel.typeof_pyval(a) for a in args),
                                   cuda.get_current_device().id)
        if PERSISTENT == "auto" and limit < tiles:
            return 0
        return max(1, min(tiles, limit))


@functools.lru_cache(maxsize=64)
def _cooperative_limit(kernel, argtypes, device_id):
    """Most blocks of ``(SJ, SB)`` threads one cooperative launch of ``kernel`` may have on ``device_id``.

    Cached: the occupancy query costs more than a launch.
    """
    return kernel.compile(argtypes).max_cooperative_grid_blocks((_SJ, _SB))


def _blocks(layout):
    """Gate block indices ``(i, ci, f, o)`` as Python ints."""
    return tuple(int(k) for k in GATE_BLOCKS[layout])


def _compute_dtype(dtype):
    """float16 is stored as float16 and computed in float32."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _forward_device(run, x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, forget_bias, cell_clip,
                    use_peephole, layout, out):
    """Whole-sequence forward on prepared device arrays of the compute dtype.

    Parameters
    ----------
    run : _Launcher
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    b : [4H] array
    wci, wcf, wco : [H] arrays or None
        ``None`` when not used (``use_peephole`` is False).
    seq_len_max : int
    forget_bias, cell_clip : float
    use_peephole : bool
    layout : {"ifco", "icfo"}
    out : [7, T, B, H] array
        Output: ``i, cs, f, o, ci, co, h``, zero past ``seq_len_max``.
    """
    steps, batch, inputs = x.shape
    units = cs_prev.shape[1]
    s = seq_len_max if batch and units else 0
    if s < steps:  # the tails of all seven outputs in one launch
        run.fill_zero(out.reshape(7, steps * batch * units)[:, s * batch * units:])
    if s == 0:
        return
    xw = run.scratch((s, batch, 4 * units))
    run.gemm(x[:s].reshape(s * batch, inputs), w[:inputs], xw.reshape(s * batch, 4 * units), bias=b)
    dt = run.dtype.type
    # Absent peephole weights are never used: any array of at least H elements stands in.
    wci, wcf, wco = (b if p is None else p for p in (wci, wcf, wco))
    args = (xw, cs_prev, h_prev, w[inputs:], wci, wcf, wco, run.one, dt(forget_bias), dt(cell_clip),
            bool(use_peephole), *_blocks(layout), out)
    run.recurrence(run.k.forward_persistent, run.k.forward_step, args, s, batch, units)


def _backward_recurrent(run, cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, w_rec, use_peephole,
                        layout, dgates, dc, peephole_grads):
    """The time loop of the backward pass on prepared device arrays.

    Parameters
    ----------
    run : _Launcher
    cs_prev : [B, H] array
    wci, wcf, wco : [H] arrays or None
    outputs : sequence of 6 or 7 [T, B, H] arrays
    cs_grad, h_grad : [T, B, H] arrays
    seq_len_max : int
        ``1 <= seq_len_max <= T``, and ``B, H >= 1``.
    w_rec : [H, 4H] array
    use_peephole : bool
    layout : {"ifco", "icfo"}
    dgates : [S, B, 4H] array
        Output: gradients of the gate pre-activations, caller's layout.
    dc : [B, H] array, zero
        Output: ``cs_prev_grad`` (the carried cell gradient).
    peephole_grads : sequence of 3 [H] arrays
        Output with ``use_peephole`` (left alone otherwise).
    """
    batch, units = cs_prev.shape
    s = seq_len_max
    blocks_layout = _blocks(layout)
    i_, cs_, f_, o_, ci_, co_ = outputs[:6]
    wci, wcf, wco = (w_rec[0] if p is None else p for p in (wci, wcf, wco))
    args = (cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec, wci, wcf, wco, run.one, bool(use_peephole),
            *blocks_layout, dgates, dc)
    run.recurrence(run.k.backward_persistent, run.k.backward_step, args, s, batch, units, reverse=True,
                   step_args=(s,))
    if use_peephole:
        run.peephole_grads(s, cs_prev, cs_, dgates, blocks_layout, peephole_grads)


def _regions(run, shapes):
    """``(offsets, total)`` of consecutive regions of the given shapes in one flat results array.

    Aligned, except where the results are cast to float16 as one block
    (the padding would be cast too).
    """
    offsets, total = [], 0
    for shape in shapes:
        offsets.append(total)
        total += _padded(_size(shape)) if run.storage == run.dtype else _size(shape)
    return offsets, total


def _backward_device(run, x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, use_peephole,
                     layout):
    """Whole-sequence backward on prepared device arrays of the compute dtype.

    Returns
    -------
    list
        ``[x_grad [T, B, I], cs_prev_grad [B, H], h_prev_grad [B, H],
        w_grad [I + H, 4H], wci_grad, wcf_grad, wco_grad [H], b_grad [4H]]``
        from :meth:`_Launcher.finish` (views of one allocation).
    """
    steps, batch, inputs = x.shape
    units = cs_prev.shape[1]
    gates = 4 * units
    # Laid out so that everything to zero is one range: the tail of x_grad,
    # dc, and the peephole gradients.
    shapes = [(steps, batch, inputs), (batch, units), (units,), (units,), (units,), (batch, units),
              (inputs + units, gates), (gates,)]
    offsets, total = _regions(run, shapes)
    flat = run.results(total)
    x_grad, dc, wci_grad, wcf_grad, wco_grad, h_prev_grad, w_grad, b_grad = (
        flat[o:o + _size(shape)].reshape(shape) for o, shape in zip(offsets, shapes, strict=True))
    parts = [(offsets[k], shapes[k]) for k in (0, 1, 5, 6, 2, 3, 4, 7)]
    s = seq_len_max if batch and units else 0
    if s == 0:
        run.fill_zero(flat)
        return run.finish(parts)
    zero_end = offsets[5] if not use_peephole else offsets[2]
    run.fill_zero(flat[s * batch * inputs:zero_end])
    w_rec = w[inputs:]
    dgates = run.scratch((s, batch, gates))
    _backward_recurrent(run, cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, s, w_rec, use_peephole, layout,
                        dgates, dc, (wci_grad, wcf_grad, wco_grad))
    dg2 = dgates.reshape(s * batch, gates)
    # The GEMMs after the loop: x_grad = dG @ w_x^T, h_prev_grad = dG[0] @ w_h^T,
    # w_grad = [x; h_{t-1}]^T @ dG, b_grad = column sums of dG.
    run.gemm(dg2, w[:inputs], x_grad[:s].reshape(s * batch, inputs), trans_b=True)
    run.gemm(dgates[0], w_rec, h_prev_grad, trans_b=True)
    run.gemm(x[:s].reshape(s * batch, inputs), dg2, w_grad[:inputs], trans_a=True)
    run.gemm(h_prev, dgates[0], w_grad[inputs:], trans_a=True)
    if s > 1:
        h_ = outputs[6]
        run.gemm(h_[:s - 1].reshape((s - 1) * batch, units), dgates[1:].reshape((s - 1) * batch, gates),
                 w_grad[inputs:], trans_a=True, accumulate=True)
    run.column_sums(dg2, b_grad)
    return run.finish(parts)


def _context_cache():
    """Numba's cache of the current CUDA context, held for a whole call.

    Numba looks the current context up (two driver calls) on every
    allocation, launch and array conversion unless an outer
    ``driver.get_active_context()`` block caches it; one block around the
    call replaces about 30 lookups of a forward by one.
    """
    if SIMULATOR:
        return contextlib.nullcontext()
    try:
        from numba.cuda.cudadrv.driver import driver

        return driver.get_active_context()
    except Exception:  # noqa: BLE001 - other Numba internals: no cache
        return contextlib.nullcontext()


@contextlib.contextmanager
def _call(named, stream, wrap=None):
    """Checks and context of one entry-point call.

    Yields a :class:`_Launcher` in the compute dtype on the resolved
    stream, holding the scratch memory of that device and stream for the
    call. ``named["x"]`` (else the first array given) decides the storage
    dtype, the default stream and the kind of the results; ``wrap``, when
    given, replaces the latter (:mod:`nblstm.cuda_cell` returns Numba device
    arrays). The launcher's ``device`` is the ordinal of the GPU it runs on.
    """
    _require_gpu()
    first = named["x"] if named.get("x") is not None else next(v for v in named.values() if v is not None)
    ordinal = _check_same_device(named)
    with _on_device(ordinal), _context_cache():
        storage = _storage_dtype(first)
        dtype = _compute_dtype(storage)
        launch_stream = _stream(stream, first)
        if ordinal is not None:
            device = ordinal
        else:
            device = 0 if SIMULATOR or _gpu_count() <= 1 else cuda.get_current_device().id
        arenas = _arena(device, launch_stream)
        arena = arenas.get(dtype)
        if arena is None:
            arena = arenas.setdefault(dtype, _Arena())
        with arena.lock:
            run = _Launcher(dtype, storage, launch_stream, arena, wrap or _wrap_like(first, ordinal))
            run.device = device
            try:
                yield run
            finally:
                arena.need = max(arena.need, run.scratch_total)


# ---------------------------------------------------------------------------
# Entry points called by nblstm.ops (the same as nblstm.cpu's).


def forward(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, forget_bias, cell_clip, use_peephole, layout,
            stream=None):
    """Whole-sequence forward of validated GPU arrays of any supported dtype.

    Parameters
    ----------
    x : [T, B, I] GPU array
    cs_prev, h_prev : [B, H] GPU arrays
    w : [I + H, 4H] GPU array
        Gate columns in ``layout``.
    b : [4H] GPU array
    wci, wcf, wco : [H] GPU arrays or None
        ``None`` stands for zeros.
    seq_len_max : int
        ``0 <= seq_len_max <= T``.
    forget_bias, cell_clip : float
    use_peephole : bool
    layout : {"ifco", "icfo"}
    stream : stream, optional
        A Numba, CuPy or PyTorch stream (default: the current CuPy/PyTorch
        stream for their arrays, else the default stream).

    Returns
    -------
    list
        ``[i, cs, f, o, ci, co, h]``, each ``[T, B, H]``, dtype of ``x``, the
        array kind of ``x``; zero past ``seq_len_max``. The seven are views
        of one allocation.

    Raises
    ------
    RuntimeError
        CUDA is not usable in this process.
    TypeError
        The arrays are on different GPUs.
    """
    named = {"x": x, "cs_prev": cs_prev, "h_prev": h_prev, "w": w, "b": b, "wci": wci, "wcf": wcf, "wco": wco}
    with _call(named, stream) as run:
        peep = (wci, wcf, wco) if use_peephole else (None, None, None)
        x, cs_prev, h_prev, w, b, wci, wcf, wco = run.prepare(x, cs_prev, h_prev, w, b, *peep)
        steps, batch, _ = x.shape
        units = cs_prev.shape[1]
        n = steps * batch * units
        out = run.results(7 * n).reshape(7, steps, batch, units)
        _forward_device(run, x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, forget_bias, cell_clip,
                        use_peephole, layout, out)
        return run.finish([(k * n, (steps, batch, units)) for k in range(7)])


def backward(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, use_peephole, layout,
             stream=None):
    """Whole-sequence backward of validated GPU arrays of any supported dtype.

    Parameters
    ----------
    x : [T, B, I] GPU array
    cs_prev, h_prev : [B, H] GPU arrays
    w : [I + H, 4H] GPU array
    wci, wcf, wco : [H] GPU arrays or None
    outputs : sequence of 7 [T, B, H] GPU arrays
        Forward outputs ``i, cs, f, o, ci, co, h``.
    cs_grad, h_grad : [T, B, H] GPU arrays or None
        ``None`` stands for zeros.
    seq_len_max : int
    use_peephole : bool
    layout : {"ifco", "icfo"}
    stream : stream, optional

    Returns
    -------
    list
        ``[x_grad [T, B, I], cs_prev_grad [B, H], h_prev_grad [B, H],
        w_grad [I + H, 4H], wci_grad, wcf_grad, wco_grad [H], b_grad [4H]]``
        in the dtype and array kind of ``x`` (views of one allocation).

    Raises
    ------
    RuntimeError, TypeError
        As :func:`forward`.
    """
    names = ("i", "cs", "f", "o", "ci", "co", "h")
    named = {"x": x, "cs_prev": cs_prev, "h_prev": h_prev, "w": w, "wci": wci, "wcf": wcf, "wco": wco,
             **dict(zip(names, outputs, strict=False)), "cs_grad": cs_grad, "h_grad": h_grad}
    with _call(named, stream) as run:
        peep = (wci, wcf, wco) if use_peephole else (None, None, None)
        x, cs_prev, h_prev, w, wci, wcf, wco, cs_grad, h_grad, *outputs = run.prepare(
            x, cs_prev, h_prev, w, *peep, cs_grad, h_grad, *outputs)
        steps, batch, _ = x.shape
        units = cs_prev.shape[1]
        cs_grad, h_grad = (run.read_only_zeros((steps, batch, units)) if g is None else g for g in (cs_grad, h_grad))
        return _backward_device(run, x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max,
                                use_peephole, layout)


def cell_forward(x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout, stream=None):
    """One step (LSTMBlockCell) of validated GPU arrays.

    ``x: [B, I]``; the other parameters as :func:`forward`. Returns the seven
    ``[B, H]`` outputs ``[i, cs, f, o, ci, co, h]`` (views of one allocation).
    """
    named = {"x": x, "cs_prev": cs_prev, "h_prev": h_prev, "w": w, "b": b, "wci": wci, "wcf": wcf, "wco": wco}
    with _call(named, stream) as run:
        peep = (wci, wcf, wco) if use_peephole else (None, None, None)
        x, cs_prev, h_prev, w, b, wci, wcf, wco = run.prepare(x, cs_prev, h_prev, w, b, *peep)
        batch, inputs = x.shape
        units = cs_prev.shape[1]
        n = batch * units
        out = run.results(7 * n).reshape(7, 1, batch, units)
        _forward_device(run, x.reshape(1, batch, inputs), cs_prev, h_prev, w, b, wci, wcf, wco, 1, forget_bias,
                        cell_clip, use_peephole, layout, out)
        return run.finish([(k * n, (batch, units)) for k in range(7)])


def cell_backward(cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, w, use_peephole, layout, stream=None):
    """Elementwise backward of one step (LSTMBlockCellGrad) of validated GPU arrays.

    Parameters
    ----------
    cs_prev : [B, H] GPU array
    wci, wcf, wco : [H] GPU arrays or None
    outputs : sequence of 6 [B, H] GPU arrays
        ``i, cs, f, o, ci, co`` of the step.
    cs_grad, h_grad : [B, H] GPU arrays or None
        Total gradients of the step's ``cs`` and ``h``.
    w : [I + H, 4H] GPU array
        Weights; only the recurrent rows are read (and only for the shape).
    use_peephole : bool
    layout : {"ifco", "icfo"}
    stream : stream, optional

    Returns
    -------
    list
        ``[cs_prev_grad [B, H], dgates [B, 4H], wci_grad, wcf_grad, wco_grad [H]]``
        (views of one allocation).
    """
    names = ("i", "cs", "f", "o", "ci", "co")
    named = {"cs_prev": cs_prev, "wci": wci, "wcf": wcf, "wco": wco, **dict(zip(names, outputs, strict=False)),
             "cs_grad": cs_grad, "h_grad": h_grad, "w": w}
    with _call(named, stream) as run:
        peep = (wci, wcf, wco) if use_peephole else (None, None, None)
        cs_prev, w, wci, wcf, wco, cs_grad, h_grad, *outputs = run.prepare(cs_prev, w, *peep, cs_grad, h_grad,
                                                                            *outputs[:6])
        batch, units = cs_prev.shape
        outputs = [a.reshape(1, batch, units) for a in outputs]
        cs_grad, h_grad = (run.read_only_zeros((1, batch, units)) if g is None else g.reshape(1, batch, units)
                           for g in (cs_grad, h_grad))
        # dc and the peephole gradients first: one range to zero.
        shapes = [(batch, units), (units,), (units,), (units,), (batch, 4 * units)]
        offsets, total = _regions(run, shapes)
        flat = run.results(total)
        dc, wci_grad, wcf_grad, wco_grad, dgates = (
            flat[o:o + _size(shape)].reshape(shape) for o, shape in zip(offsets, shapes, strict=True))
        parts = [(offsets[k], shapes[k]) for k in (0, 4, 1, 2, 3)]
        if batch == 0 or units == 0:
            run.fill_zero(flat)
        else:
            run.fill_zero(flat[:offsets[4] if not use_peephole else offsets[1]])
            _backward_recurrent(run, cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, 1, w[w.shape[0] - units:],
                                use_peephole, layout, dgates.reshape(1, batch, 4 * units), dc,
                                (wci_grad, wcf_grad, wco_grad))
        return run.finish(parts)


# ---------------------------------------------------------------------------
# Kept for the PTX checks: every kernel with the argument types it is launched with.
def kernel_signatures(dtype):
    """``[(name, python function, signature)]`` of every kernel for one storage dtype.

    Used by the compile-only checks (``numba.cuda.compile_ptx``). For
    float16 these are the storage-cast kernels; for float32 and float64
    every kernel.

    Parameters
    ----------
    dtype : numpy.dtype
        float16, float32 or float64.
    """
    dtype = np.dtype(dtype)
    nt = {np.dtype(np.float16): types.float16, np.dtype(np.float32): types.float32,
          np.dtype(np.float64): types.float64}[dtype]
    a1, a2, a3, a4 = (types.Array(nt, n, "C") for n in (1, 2, 3, 4))
    sigs = []
    if dtype == np.float16:
        f32 = [types.Array(types.float32, n, "C") for n in (1, 2, 3)]
        anyf16 = [types.Array(nt, n, "A") for n in (1, 2, 3)]
        for name, kernel in (("copy1", _copy1), ("copy2", _copy2), ("copy3", _copy3)):
            n = int(name[-1]) - 1
            sigs.append((f"{name}_f16_to_f32", kernel.py_func, (anyf16[n], f32[n])))
            sigs.append((f"{name}_f32_to_f16", kernel.py_func, (f32[n], types.Array(nt, n + 1, "C"))))
        sigs.append(("fill", _fill.py_func, (a1, nt)))
        return sigs
    k = _kernels(dtype)
    i64, b1 = types.int64, types.boolean
    step_common = (a3, a2, a2, a2, a1, a1, a1, nt, nt, nt, b1, i64, i64, i64, i64, a4)
    back_common = (a2, a3, a3, a3, a3, a3, a3, a3, a3, a2, a1, a1, a1, nt, b1, i64, i64, i64, i64, a3, a2)
    sigs += [
        ("fill", _fill.py_func, (a1, nt)),
        ("fill2", _fill2.py_func, (types.Array(nt, 2, "A"), nt)),
        ("copy1", _copy1.py_func, (types.Array(nt, 1, "A"), a1)),
        ("copy2", _copy2.py_func, (types.Array(nt, 2, "A"), a2)),
        ("copy3", _copy3.py_func, (types.Array(nt, 3, "A"), a3)),
        ("column_sums", _column_sums.py_func, (a2, a1, nt)),
        ("peephole_grads", _peephole_grads.py_func, (i64, a2, a3, a3, i64, i64, i64, nt, a1, a1, a1)),
        ("gemm", k.gemm.py_func, (a2, a2, a2, a1, b1, b1, b1, b1)),
        ("forward_step", k.forward_step.py_func, (i64, *step_common)),
        ("forward_persistent", k.forward_persistent.py_func, (i64, *step_common)),
        ("backward_step", k.backward_step.py_func, (i64, i64, *back_common)),
        ("backward_persistent", k.backward_persistent.py_func, (i64, *back_common)),
    ]
    return sigs


__all__ = ["forward", "backward", "cell_forward", "cell_backward", "kernel_signatures", "release_workspaces",
           "SIMULATOR"]
