"""The TF1 ``LSTMCell`` on the CPU: kernels over whole sequences and their drivers (:ref:`spec-cell`).

The cell differs from the fused ops (:mod:`nblstm.cpu.fused`) in five ways,
all handled here: an optional projection ``h = clip(r @ projection,
proj_clip)`` of the output ``r = o * act(c)``; a choice of activation;
clipping with its true gradient (zero where clipped, ``cell_clip = 0`` clips
to 0); per-example sequence lengths with ``dynamic_rnn`` semantics (past its
length an example's state is carried unchanged and its output is zero); and
the state ``(c, h)`` in which ``h`` (TensorFlow's ``m``) has
``P = num_proj or H`` columns.

The work is laid out as in :mod:`nblstm.cpu.fused` (:ref:`design-cpu`), with its helpers:

- A kernel is a serial ``nogil`` worker run on several threads by
  :func:`nblstm.cpu.threads.run`. Every GEMM in it is a single-threaded
  call of SciPy's BLAS (:class:`~nblstm.cpu.blas.kernel_section`) on a
  slice of the work, one slice per thread; NumPy's multi-threaded BLAS is
  never called (its threads would spin and fight the workers for the
  cores). A kernel runs on the calling thread alone when the work is a
  single block or below :data:`~nblstm.cpu.partition.MIN_PARALLEL_CALL_WORK`
  multiply-adds: every meeting of the threads costs a barrier, and far
  more than its work on busy cores.
- The input projection of all steps, ``x @ kernel[:I]``, is one GEMM before
  the time loop, its rows split across threads, written straight into the
  ``[T, B, 4H]`` gates array; each step's gate maths reads the projection
  there (adding the bias) and overwrites it with the gates.
- The hidden units are split into chunks, one per thread, with the weight
  columns packed so that a chunk's ``[i | j | f | o]`` blocks are contiguous.
  Each worker runs the whole time loop (:mod:`nblstm.cpu.sync`): at each
  step it runs the recurrent GEMM of its slice, then the gate maths of
  that slice, and the workers meet on atomic counters. The
  GEMM is :mod:`nblstm.cpu.microkernel`'s, on each chunk's weights packed in
  panels once per weight change (:class:`PackedWeights`), whatever the
  batch. The same goes for the backward's ``dh = dgates @ w_h^T``. With a
  projection a second stage of each step computes ``h`` (its columns split
  across threads): ``h`` needs every unit's ``r``.
- Backward keeps only the recurrent GEMMs (and the peephole gradients) in
  the time loop; the input gradient and the kernel, bias and projection
  gradients are GEMMs and reductions after it, split across threads (the
  input gradient by rows, the weight gradients by their own rows, the bias
  gradient by columns), reading ``x`` and ``h`` in place (no shifted
  copies).
- Kernels run the gate maths on 1-D row views, so that LLVM vectorizes it;
  the tanh activation (the default) gets its own copy of the loops in which
  the activation code is a constant, so that its float32 loops are
  branch-free arithmetic (:func:`nblstm.spec.tanh`). They are compiled with
  :data:`nblstm._jit.KERNEL`, as the fused ops'.

All kernels take the options (activation code, clip bounds, flags) as run-time
arguments, so there is one compiled kernel per dtype (float32, float64).
Chunk ``k`` holds the units ``u0 = bounds[k] .. u1 - 1`` (``uk`` of them);
``p0, p1`` bound a chunk of projected columns, ``col0, col1`` its columns in
the packed arrays.
"""

from typing import NamedTuple

import numpy as np
from numba import njit

from .._jit import CALLEE, KERNEL, full_width
from .._validate import compute_dtype
from ..options import KernelOptions, OpOptions
from ..spec import cell_backward_unit, cell_forward_unit, clip_value, clip_value_grad, unit_options
from . import microkernel, pool, regroup, sync, threads
from .blas import kernel_section
from .fused import BackwardWeights, ForwardWeights, outputs_zeroed
from .fused import backward as fused_backward
from .fused import forward_packed as fused_forward
from .fused import weight_grads_block as fused_weight_grads_block
from .gemm import address, gemm, rows_product
from .pack import pack_chunks
from .partition import (
    MIN_PARALLEL_PACK,
    block_bounds,
    call_threads,
    cell_chunk_bounds,
    column_offsets,
    fused_projection,
    row_bounds,
)
from .views import U, copy_elements, fill_zero, flat, matrix

__all__ = [
    "CellGrads",
    "CellInputs",
    "CellSaved",
    "CellWeights",
    "FusedWeights",
    "PackedWeights",
    "backward_kernel",
    "final_state",
    "forward_kernel",
    "fused_forward_applies",
    "forward_row",
    "masked_outputs",
    "packed_columns",
    "packed_order",
    "sequence_backward",
    "sequence_forward",
    "weight_grads_kernel",
]


def packed_columns(num_units, bounds):
    """Column permutation from ICFO to the packed order.

    Returns
    -------
    numpy.ndarray
        ``perm: [4H]`` int64 such that ``kernel[:, perm]`` is packed: chunk
        ``k`` occupies columns ``4*u0 .. 4*u1 - 1`` as ``[i | j | f | o]``.
    """
    perm = [np.arange(block * num_units + u0, block * num_units + u1)
            for u0, u1 in zip(bounds[:-1], bounds[1:], strict=True) for block in range(4)]
    return np.concatenate(perm).astype(np.int64)


def packed_order(matrix, bounds):
    """``matrix[..., packed_columns(H, bounds)]`` as a new C-contiguous array, by block copies.

    ``matrix: [..., 4H]`` in ICFO. The permutation moves whole runs of
    columns (one per gate and chunk): copied run by run, it took 1.5 ms at
    ``[512, 1024]`` and 51 ms at ``[2048, 4096]`` as a NumPy gather
    (``matrix[:, perm]``), whose result is not even C-ordered; the copies
    give the same values.
    """
    units = matrix.shape[-1] // 4
    runs = [matrix[..., block * units + u0:block * units + u1]
            for u0, u1 in zip(bounds[:-1], bounds[1:], strict=True) for block in range(4)]
    return np.concatenate(runs, axis=-1)


# The kernels' records: the arrays of a call grouped by what they are, so that
# a worker takes a dozen parameters; handed to the workers as plain tuples and
# named again there, as the fused ops' (nblstm.cpu.fused.Inputs).
class CellInputs(NamedTuple):
    """The inputs of a call: ``x2d [T * B, I]`` (C-contiguous), ``rows [R + 1]`` int64 the row blocks of the input
    projection (:func:`~nblstm.cpu.partition.row_bounds`), ``c0 [B, H]``, ``h0 [B, P]``, ``lengths [B]`` int64
    (``0 <= lengths[b] <= T``)."""

    x2d: np.ndarray
    rows: np.ndarray
    c0: np.ndarray
    h0: np.ndarray
    lengths: np.ndarray


class CellWeights(NamedTuple):
    """The packed weights as the kernels read them (:attr:`PackedWeights.record`).

    Attributes
    ----------
    w_x : [I, 4H] C-contiguous array
        Packed input weights.
    bias : [4H] array
        Packed bias.
    w_rec : [P * rec_off[K]] array
        Packed recurrent weights, chunk after chunk from ``P * rec_off[k]``,
        in the micro-kernel's panels.
    bounds : [K + 1] int64 array
        Chunks of hidden units.
    rec_off : [K + 1] int64 array
        Where each chunk's columns start in ``w_rec`` and the forward's ``work``.
    w_proj : [H * P] array
        Projection weights, column chunk after column chunk, each a C-ordered
        ``[H, pk]`` block (empty without a projection).
    proj_bounds : [KP + 1] int64 array
        Chunks of the ``P`` output-state columns; ``bounds`` without a projection.
    peepholes : tuple of 3 [H] arrays
        ``w_i, w_f, w_o`` (read only with ``use_peepholes``).
    w_rec_t : [4H * rt_off[KP]] array
        Packed transposed recurrent weights, column chunk after column chunk
        (``proj_bounds``) from ``4H * rt_off[k]``, in the micro-kernel's panels.
    rt_off : [KP + 1] int64 array
        Where each column chunk starts in ``w_rec_t`` and the backward's ``proj_work``.
    w_proj_t : [P * H] array
        Transposed projection weights, unit chunk after unit chunk, each a
        C-ordered ``[P, uk]`` block (empty without a projection).
    """

    w_x: np.ndarray
    bias: np.ndarray
    w_rec: np.ndarray
    bounds: np.ndarray
    rec_off: np.ndarray
    w_proj: np.ndarray
    proj_bounds: np.ndarray
    peepholes: tuple
    w_rec_t: np.ndarray
    rt_off: np.ndarray
    w_proj_t: np.ndarray


class CellSaved(NamedTuple):
    """The forward's saved values, what the backward reads.

    ``gates [T, B, 4H]`` C-contiguous (packed ``i, j, f, o`` after their
    nonlinearities, zero past the lengths; also the workspace of the input
    projection, and in the backward the gate gradients), ``c_raw, c, ac, r
    [T, B, H]`` the cell before and after clipping (the carried state),
    ``act(c)`` and ``r = o * act(c)``, ``h_raw [T, B, P]`` the projection
    before ``proj_clip`` (unused without a projection), ``h [T, B, P]`` the
    carried output state (the same array as ``r`` without a projection).

    An inference call keeps no more than it returns: ``c_raw, ac`` and, with
    a projection, ``r, h_raw`` then have one step, ``c`` two (the previous
    step is read), and step ``t`` goes to slot ``t % n`` of an array of
    ``n`` steps (:func:`sequence_forward`). ``gates`` (the input
    projection) and ``h`` always have every step.
    """

    gates: np.ndarray
    c_raw: np.ndarray
    c: np.ndarray
    ac: np.ndarray
    r: np.ndarray
    h_raw: np.ndarray
    h: np.ndarray


class CellGrads(NamedTuple):
    """The backward's outputs: ``dh_raw [T, B, P]`` the gradient of the projection before clipping (of ``r``
    without one); ``dc [B, H]`` and ``dh [B, P]``, on entry the gradients of the final state, on exit those of
    ``c0, h0``; ``peepholes`` the tuple of the ``[H]`` peephole gradients, zero on entry (accumulated only with
    ``use_peepholes``)."""

    dh_raw: np.ndarray
    dc: np.ndarray
    dh: np.ndarray
    peepholes: tuple


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------
@njit(inline="always")
def forward_row(g, pre, bk, c_src, peepholes, unit, out):
    """The gate maths of one row of ``uk`` units, on 1-D views indexed from 0 (so that the loop vectorizes).

    ``g`` and ``pre`` hold the chunk's ``[i | j | f | o]`` recurrent and input
    products (``4 uk`` each), ``bk`` its bias, ``peepholes`` the tuple of the
    chunk's ``[uk]`` peephole weights, ``unit`` the
    :class:`~nblstm.spec.UnitOptions`; ``pre`` gets the gates, and the
    ``[uk]`` views ``out = (c_raw, c, ac, r)`` the unit's values. Also the
    streaming step's (:mod:`nblstm.cpu.step`), so that both give the same bits.
    """
    uk = c_src.shape[0]
    w_ik, w_fk, w_ok = peepholes
    c_raw_r, c_r, ac_r, r_r = out
    for jj in range(uk):
        i, j_gate, f, o, c_raw, c, ac, r = cell_forward_unit(
            g[jj] + pre[jj] + bk[jj], g[uk + jj] + pre[uk + jj] + bk[uk + jj],
            g[2 * uk + jj] + pre[2 * uk + jj] + bk[2 * uk + jj],
            g[3 * uk + jj] + pre[3 * uk + jj] + bk[3 * uk + jj],
            c_src[jj], (w_ik[jj], w_fk[jj], w_ok[jj]), unit,
        )
        pre[jj] = i
        pre[uk + jj] = j_gate
        pre[2 * uk + jj] = f
        pre[3 * uk + jj] = o
        c_raw_r[jj] = c_raw
        c_r[jj] = c
        ac_r[jj] = ac
        r_r[jj] = r


@njit(inline="always")
def _forward_rows(t, u0, u1, gk, inputs, weights, unit, has_proj, saved):
    """Gate maths of step ``t`` for the units ``u0..u1-1`` of every row (inlined: ``unit.act`` may be a constant)."""
    c0, h0, lengths = inputs.c0, inputs.h0, inputs.lengths
    gates, c_raw_, c_, ac_, r_, h_ = saved.gates, saved.c_raw, saved.c, saved.ac, saved.r, saved.h
    w_i, w_f, w_o = weights.peepholes
    batch, units = gk.shape[0], c_raw_.shape[2]
    uk = u1 - u0
    # Every row view below is sliced to the chunk, so that the loops index
    # it from 0 (a known non-negative index needs no wraparound: they vectorize).
    # Gates i, j, f, o of the chunk: columns jj, uk + jj, 2 uk + jj, 3 uk + jj
    # of its slice of a row of ``gates`` (and of ``bias``).
    bk = weights.bias[4 * u0:4 * u1]
    peepholes = (w_i[u0:u1], w_f[u0:u1], w_o[u0:u1])
    # The step's slots (CellSaved: step t itself, or a slot of a short array).
    tw, tc, tp = t % c_raw_.shape[0], t % c_.shape[0], (t - 1) % c_.shape[0]
    ta, tr = t % ac_.shape[0], t % r_.shape[0]
    for b in range(batch):
        g = gk[b]
        pre = gates[t, b, 4 * u0:4 * u1]
        c_src = c0[b, u0:u1] if t == 0 else c_[tp, b, u0:u1]
        c_raw_r, c_r, ac_r, r_r = c_raw_[tw, b, u0:u1], c_[tc, b, u0:u1], ac_[ta, b, u0:u1], r_[tr, b, u0:u1]
        if t < lengths[b]:
            # r_r is also h without a projection (h_ is r_)
            forward_row(g, pre, bk, c_src, peepholes, unit, (c_raw_r, c_r, ac_r, r_r))
        else:
            # Past the example's length the state is carried unchanged: runs of memory (cpu/views.py), no loops
            # to compile in both copies of this function.
            row, n = U(b * units + u0), U(uk)
            fill_zero(flat(gates), U((t * batch + b) * 4 * units + 4 * u0), U(4 * uk))
            c_from, c_at = (flat(c0), row) if t == 0 else (flat(c_), U((tp * batch + b) * units + u0))
            copy_elements(flat(c_raw_), U((tw * batch + b) * units + u0), c_from, c_at, n)
            copy_elements(flat(c_), U((tc * batch + b) * units + u0), c_from, c_at, n)
            fill_zero(flat(ac_), U((ta * batch + b) * units + u0), n)
            fill_zero(flat(r_), U((tr * batch + b) * units + u0), n)
            if not has_proj:  # h_ is r_ (units columns): h carried after r's zeroes
                h_from, h_at = (flat(h0), row) if t == 0 else (flat(h_), U(((t - 1) * batch + b) * units + u0))
                copy_elements(flat(h_), U((t * batch + b) * units + u0), h_from, h_at, n)


@njit(**CALLEE)
def _forward_units(t, k, inputs, weights, options, one, work, saved):
    """Step ``t`` of the units of chunk ``k``: recurrent GEMM, then the gate maths."""
    full_width()
    h0 = inputs.h0
    u0, u1 = weights.bounds[k], weights.bounds[k + 1]
    col0, col1 = weights.rec_off[k], weights.rec_off[k + 1]
    batch = saved.gates.shape[1]
    depth = h0.shape[1]
    width = col1 - col0
    gk = matrix(work, batch * col0, batch, width)
    h_src = h0 if t == 0 else saved.h[t - 1]
    microkernel.gemm_panels(flat(h_src), np.int64(0), depth, batch, weights.w_rec, depth * col0, depth,
                             width // microkernel.panel_width_of(weights.w_rec), work, batch * col0, width,
                             np.bool_(False))
    if options.act == 0:  # tanh, the default: a constant code, so the maths vectorizes
        _forward_rows(t, u0, u1, gk, inputs, weights, unit_options(options, one, np.int64(0)), options.has_proj, saved)
    else:
        _forward_rows(t, u0, u1, gk, inputs, weights, unit_options(options, one, options.act), options.has_proj,
                      saved)


@njit(**CALLEE)
def _forward_proj(t, k, inputs, weights, proj_clip, proj_clip_on, work, saved):
    """Step ``t`` of the projected columns of chunk ``k``: ``h = clip(r @ projection)`` (``proj_clip`` in the
    compute dtype)."""
    full_width()
    h0, lengths = inputs.h0, inputs.lengths
    r_, h_raw_, h_ = saved.r, saved.h_raw, saved.h
    p0, p1 = weights.proj_bounds[k], weights.proj_bounds[k + 1]
    batch = r_.shape[1]
    units = r_.shape[2]
    pk = p1 - p0
    wk = matrix(weights.w_proj, units * p0, units, pk)
    gk = matrix(work, batch * p0, batch, pk)
    rows_product(r_[t % r_.shape[0]], wk, gk, 0, batch)
    for b in range(batch):
        g = gk[b]
        raw_r, h_r = h_raw_[t % h_raw_.shape[0], b, p0:p1], h_[t, b, p0:p1]
        if t < lengths[b]:
            for jj in range(pk):
                raw_r[jj] = g[jj]
                h_r[jj] = clip_value(g[jj], proj_clip, proj_clip_on)
        else:
            h_src = h0[b, p0:p1] if t == 0 else h_[t - 1, b, p0:p1]
            for jj in range(pk):
                raw_r[jj] = g[jj] - g[jj]
                h_r[jj] = h_src[jj]


def forward_kernel(inputs, weights, options, work, proj_work, saved, project=True):
    """The cell's forward pass over ``T = saved.gates.shape[0]`` steps.

    Parameters
    ----------
    inputs : CellInputs
    weights : CellWeights
    options : nblstm.options.KernelOptions
    work : [B * rec_off[K]] array
    proj_work : [B * P] array
        Workspaces of the per-step GEMMs.
    saved : CellSaved
        Output, every element written. ``gates`` is also the workspace of the
        input projection.
    project : bool, default True
        Compute the input projection into ``gates``; ``False``: ``gates``
        already holds it, in step order (:mod:`nblstm.schedule`).
    """
    # Stage 0 is the input projection (its row blocks), stage 1 + 2 t the
    # units of step t, stage 2 + 2 t its projection (every unit's r first).
    # The workers compile as serial code (nblstm.cpu.threads).
    num_chunks = len(weights.bounds) - 1
    blocks = len(inputs.rows) - 1
    steps = saved.gates.shape[0]
    claims, done = sync.counters(2 * steps + 1, max(num_chunks, blocks))
    workers = max(num_chunks, blocks)
    batch, units = inputs.c0.shape
    depth = inputs.h0.shape[1]
    macs = steps * batch * 4 * units * (inputs.x2d.shape[1] + depth) + steps * batch * units * depth * options.has_proj
    threads.run(forward_worker, (claims, done, tuple(inputs), tuple(weights), tuple(options), work, proj_work,
                                 tuple(saved), np.bool_(project)), min(workers, call_threads(macs, workers)))


@njit(**KERNEL)
def projection_worker(w, claims, done, x2d, w_x, rows, pre2d):
    """Worker ``w``'s row blocks of the input projection ``pre2d = x2d @ w_x`` (stage 0 of ``claims``)."""
    full_width()
    for j in range(rows.shape[0] - 1):
        r = sync.claimed(claims, done, np.int64(0), w, rows.shape[0] - 1, np.bool_(False), j)
        if r >= 0:
            rows_product(x2d, w_x, pre2d, rows[r], rows[r + 1])
            sync.count_done(done, np.int64(0), rows.shape[0] - 1)


@njit(**KERNEL)
def forward_worker(w, claims, done, inputs, weights, options, work, proj_work, saved, project):
    """Worker ``w``'s part of :func:`forward_kernel`: the chunks it claims (:mod:`nblstm.cpu.sync`); workers past
    the last chunk only help with the input projection."""
    inputs, weights, options, saved = CellInputs(*inputs), CellWeights(*weights), KernelOptions(*options), \
        CellSaved(*saved)
    gates = saved.gates
    one = gates.dtype.type(1.0)
    pclip = gates.dtype.type(options.proj_clip)
    steps, batch, four_units = gates.shape
    rows = inputs.rows
    if project:
        projection_worker(w, claims, done, inputs.x2d, weights.w_x, rows,
                          matrix(flat(gates), 0, steps * batch, four_units))
        sync.wait_for(done, np.int64(0), rows.shape[0] - 1)
    num_chunks = weights.bounds.shape[0] - 1
    num_proj_chunks = weights.proj_bounds.shape[0] - 1  # <= num_chunks
    if w >= num_chunks:
        return
    for t in range(steps):
        for j in range(num_chunks):
            k = sync.claimed(claims, done, 2 * t + 1, w, num_chunks, np.bool_(False), j)
            if k >= 0:
                _forward_units(t, k, inputs, weights, options, one, work, saved)
                sync.count_done(done, 2 * t + 1, num_chunks)
        sync.wait_for(done, 2 * t + 1, num_chunks)
        if options.has_proj:
            for j in range(num_proj_chunks):
                k = sync.claimed(claims, done, 2 * t + 2, w, num_proj_chunks, np.bool_(False), j)
                if k >= 0:
                    _forward_proj(t, k, inputs, weights, pclip, options.proj_clip_on, proj_work, saved)
                    sync.count_done(done, 2 * t + 2, num_proj_chunks)
            sync.wait_for(done, 2 * t + 2, num_proj_chunks)


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------
@njit(**CALLEE)
def _backward_h(t, k, col_bounds, lengths, weights, options, saved, d_out, work, grads):
    """Step ``t`` (backwards) of the output-state columns of chunk ``k`` of ``col_bounds`` (``proj_bounds``, or
    ``bounds`` without a projection; packed columns ``rt_off[k]..rt_off[k+1]-1``).

    ``grads.dh`` holds the gradient of ``h[t]`` from later steps. Rows that
    were active at ``t + 1`` receive it from that step's gate gradients; the
    others carried ``h`` unchanged, so their gradient is carried too. For
    rows active at ``t`` the step's output gradient is added and the
    gradient of the projection before clipping is written to ``dh_raw[t]``.
    ``t = -1`` only finishes the carry (the gradient of the initial ``h``).
    """
    full_width()
    dgates, h_raw_ = saved.gates, saved.h_raw
    dh, dh_raw = grads.dh, grads.dh_raw
    p0, p1 = col_bounds[k], col_bounds[k + 1]
    col0, col1 = weights.rt_off[k], weights.rt_off[k + 1]
    one = dgates.dtype.type(1.0)
    proj_clip = dgates.dtype.type(options.proj_clip)
    batch = dh.shape[0]
    steps = dgates.shape[0]
    four_units = dgates.shape[2]
    pk = p1 - p0
    width = col1 - col0
    gk = matrix(work, batch * col0, batch, width)
    if t + 1 < steps:  # on the micro-kernel's panels (PackedWeights)
        microkernel.gemm_panels(flat(dgates), (t + 1) * batch * four_units, four_units, batch, weights.w_rec_t,
                                 four_units * col0, four_units, width // microkernel.panel_width_of(weights.w_rec_t),
                                 work, batch * col0, width, np.bool_(False))
    for b in range(batch):
        dh_r = dh[b, p0:p1]
        if t + 1 < lengths[b]:
            g = gk[b]
            for jj in range(pk):
                dh_r[jj] = g[jj]
        if t >= 0:
            raw_r = dh_raw[t, b, p0:p1]
            if t < lengths[b]:
                out_r = d_out[t, b, p0:p1]
                if options.has_proj:
                    h_raw_r = h_raw_[t, b, p0:p1]
                    for jj in range(pk):
                        raw_r[jj] = (dh_r[jj] + out_r[jj]) * clip_value_grad(h_raw_r[jj], proj_clip,
                                                                             options.proj_clip_on, one)
                else:
                    for jj in range(pk):
                        raw_r[jj] = dh_r[jj] + out_r[jj]
            else:
                fill_zero(flat(dh_raw), U((t * batch + b) * dh_raw.shape[2] + p0), U(pk))


@njit(inline="always")
def _backward_rows(t, u0, u1, drk, inputs, weights, unit, saved, grads):
    """Gate maths of step ``t`` (backwards) for the units ``u0..u1-1`` (inlined: ``unit.act`` may be a constant).

    ``saved.gates[t]`` holds the step's gates on entry and their gradients on exit.
    """
    c0, lengths = inputs.c0, inputs.lengths
    dgates, c_raw_, c_, ac_ = saved.gates, saved.c_raw, saved.c, saved.ac
    dc = grads.dc
    w_i, w_f, w_o = weights.peepholes
    w_i_grad, w_f_grad, w_o_grad = grads.peepholes
    batch, units = drk.shape[0], dc.shape[1]
    uk = u1 - u0
    # Row views sliced to the chunk, indexed from 0 (see _forward_rows).
    w_ik, w_fk, w_ok = w_i[u0:u1], w_f[u0:u1], w_o[u0:u1]
    gi_k, gf_k, go_k = w_i_grad[u0:u1], w_f_grad[u0:u1], w_o_grad[u0:u1]
    for b in range(batch):
        dg = dgates[t, b, 4 * u0:4 * u1]
        if t >= lengths[b]:
            # A carried step: no gate gradients, the cell gradient passes unchanged.
            fill_zero(flat(dgates), U((t * batch + b) * 4 * units + 4 * u0), U(4 * uk))
            continue
        dr = drk[b]
        dc_r = dc[b, u0:u1]
        c_src = c0[b, u0:u1] if t == 0 else c_[t - 1, b, u0:u1]
        c_raw_r, c_r, ac_r = c_raw_[t, b, u0:u1], c_[t, b, u0:u1], ac_[t, b, u0:u1]
        for jj in range(uk):
            c_prev = c_src[jj]
            di, dj, df, do, dc_prev = cell_backward_unit(
                dr[jj], dc_r[jj], dg[jj], dg[uk + jj], dg[2 * uk + jj], dg[3 * uk + jj], c_raw_r[jj], ac_r[jj], c_prev,
                (w_ik[jj], w_fk[jj], w_ok[jj]), unit,
            )
            dg[jj] = di
            dg[uk + jj] = dj
            dg[2 * uk + jj] = df
            dg[3 * uk + jj] = do
            dc_r[jj] = dc_prev
            if unit.use_peepholes:
                gi_k[jj] += di * c_prev
                gf_k[jj] += df * c_prev
                go_k[jj] += do * c_r[jj]


@njit(**CALLEE)
def _backward_units(t, k, inputs, weights, options, saved, work, grads):
    """Step ``t`` (backwards) of the units of chunk ``k``: gradient of ``r``, then the gate maths."""
    full_width()
    dh_raw = grads.dh_raw
    u0, u1 = weights.bounds[k], weights.bounds[k + 1]
    one = saved.gates.dtype.type(1.0)
    batch = inputs.c0.shape[0]
    depth = dh_raw.shape[2]
    uk = u1 - u0
    drk = matrix(work, batch * u0, batch, uk)
    if options.has_proj:
        wk = matrix(weights.w_proj_t, depth * u0, depth, uk)
        rows_product(dh_raw[t], wk, drk, 0, batch)
    else:
        for b in range(batch):
            src = dh_raw[t, b]
            dst = drk[b]
            for jj in range(uk):
                dst[jj] = src[u0 + jj]
    if options.act == 0:  # tanh, the default: a constant code, so the maths vectorizes
        _backward_rows(t, u0, u1, drk, inputs, weights, unit_options(options, one, np.int64(0)), saved, grads)
    else:
        _backward_rows(t, u0, u1, drk, inputs, weights, unit_options(options, one, options.act), saved, grads)


def backward_kernel(inputs, weights, options, saved, d_out, work, proj_work, grads):
    """The time loop of the cell's backward pass, steps ``T - 1 .. 0``.

    Parameters
    ----------
    inputs : CellInputs
        ``c0`` and ``lengths`` are read.
    weights : CellWeights
    options : nblstm.options.KernelOptions
    saved : CellSaved
        Saved forward values (:func:`forward_kernel`). ``gates`` holds the
        saved gates on entry and their gradients on exit (of the
        pre-activations, packed): step ``t`` is overwritten once step
        ``t + 1`` no longer needs it, so the backward pass needs no second
        ``[T, B, 4H]`` array.
    d_out : [T, B, P] C-contiguous array
        Gradient of the outputs (read only at steps inside each example's length).
    work : [B * H] array
    proj_work : [B * rt_off[KP]] array
        Workspaces of the GEMMs.
    grads : CellGrads
    """
    # With a projection, stage 2 t + 2 is the h-gradient columns of step t and
    # stage 2 t + 1 its units (they need every column). Without one, unit j's
    # output is column j of h: both phases of a chunk touch only its own
    # columns, in stage 2 t + 1. Stage 0 is the gradient of h0 (t = -1).
    num_chunks = len(weights.bounds) - 1
    steps, batch, four_units = saved.gates.shape
    has_proj = options.has_proj
    macs = steps * batch * four_units * (saved.h_raw.shape[2] if has_proj else four_units // 4) * (1 + has_proj)
    claims, done = sync.counters(2 * steps + 1, num_chunks)
    threads.run(backward_worker, (claims, done, tuple(inputs), tuple(weights), tuple(options), tuple(saved), d_out,
                                  work, proj_work, tuple(grads)), min(num_chunks, call_threads(macs, num_chunks)))


@njit(**KERNEL)
def backward_worker(w, claims, done, inputs, weights, options, saved, d_out, work, proj_work, grads):
    """Worker ``w``'s part of :func:`backward_kernel`: the chunks it claims (:mod:`nblstm.cpu.sync`)."""
    inputs, weights, options, saved = CellInputs(*inputs), CellWeights(*weights), KernelOptions(*options), \
        CellSaved(*saved)
    grads = CellGrads(*grads)
    bounds, proj_bounds, lengths = weights.bounds, weights.proj_bounds, inputs.lengths
    num_chunks = bounds.shape[0] - 1
    num_proj_chunks = proj_bounds.shape[0] - 1
    steps = saved.gates.shape[0]
    for t in range(steps - 1, -2, -1):
        if options.has_proj or t < 0:
            for j in range(num_proj_chunks):
                k = sync.claimed(claims, done, 2 * t + 2, w, num_proj_chunks, np.bool_(False), j)
                if k >= 0:
                    _backward_h(t, k, proj_bounds, lengths, weights, options, saved, d_out, proj_work, grads)
                    sync.count_done(done, 2 * t + 2, num_proj_chunks)
            sync.wait_for(done, 2 * t + 2, num_proj_chunks)
        if t >= 0:
            for j in range(num_chunks):
                k = sync.claimed(claims, done, 2 * t + 1, w, num_chunks, np.bool_(False), j)
                if k >= 0:
                    if not options.has_proj:
                        _backward_h(t, k, bounds, lengths, weights, options, saved, d_out, proj_work, grads)
                    _backward_units(t, k, inputs, weights, options, saved, work, grads)
                    sync.count_done(done, 2 * t + 1, num_chunks)
            sync.wait_for(done, 2 * t + 1, num_chunks)


@njit(**KERNEL)
def _weight_grads_block(k, x2d, h2d, h0, r2d, dg2d, dh2d, w_x, splits, has_proj, outs):
    """Thread ``k``'s share of the GEMMs after the backward loop (arguments as :func:`weight_grads_kernel`'s).

    The fused ops' share (:func:`nblstm.cpu.fused.weight_grads_block`: ``dx2d``,
    the kernel and bias gradients in packed columns, with ``h`` as the
    previous output) plus, with a projection, rows
    ``proj_rows[k]..proj_rows[k+1]-1`` of its gradient ``r^T @ dh2d``.
    """
    full_width()
    dx2d, packed_grad, packed_b, d_proj = outs
    fused_weight_grads_block(k, x2d, h2d, h0, dg2d, w_x, splits[:3], dx2d, packed_grad, packed_b)
    if has_proj:
        proj_rows = splits[3]
        p0, p1 = proj_rows[k], proj_rows[k + 1]
        units, depth = d_proj.shape
        # r2d[:, p0:p1]^T @ dh2d
        gemm((p1 - p0, depth, r2d.shape[0], units, depth, depth, 1, 0, 0, r2d.itemsize), address(r2d, p0),
             address(dh2d, 0), address(d_proj, p0 * depth))


def weight_grads_kernel(x2d, h2d, h0, r2d, dg2d, dh2d, w_x, splits, perm, has_proj, outs, d_kernel, d_bias):
    """The GEMMs after the backward loop, split across threads as the fused ops' (no partial sums).

    Parameters
    ----------
    x2d : [T * B, I] C-contiguous array
        Inputs of all steps.
    h2d : [T * B, P] C-contiguous array
        Output state ``h``; row ``r - B`` is the previous output of row ``r``.
    h0 : [B, P] C-contiguous array
    r2d : [T * B, H] C-contiguous array
        ``r = o * act(c)`` (read only with a projection).
    dg2d : [T * B, 4H] C-contiguous array
        Packed gate gradients of all steps.
    dh2d : [T * B, P] C-contiguous array
        Gradient of the projection before clipping (read only with a projection).
    w_x : [I, 4H] C-contiguous array
        Packed input weights.
    splits : tuple of 4 [K + 1] int64 arrays
        ``(x_rows, w_rows, col_blocks, proj_rows)``: row blocks over
        ``0 .. T * B`` (of ``dx2d``), over ``0 .. I + P`` (of the kernel
        gradient), column blocks over ``0 .. 4H`` (of the bias gradient),
        row blocks over ``0 .. H`` (of the projection gradient).
    perm : [4H] int64 array
        Packed column ``c`` is column ``perm[c]`` of the ICFO layout.
    has_proj : bool
    outs : tuple
        ``(dx2d [T * B, I], packed_grad [I + P, 4H], packed_b [4H], d_proj
        [H, P])``: the output ``dg2d @ w_x.T``; workspaces, the kernel and
        bias gradients in packed columns; the output ``r^T @ dh2d`` (written
        only with a projection).
    d_kernel : [I + P, 4H] array
        Output ``[x_t, h_{t-1}]^T @ dgates`` summed over steps, ICFO columns.
    d_bias : [4H] array
        Output: column sums of ``dg2d``, ICFO.
    """
    threads.run(_weight_grads_block, (x2d, h2d, h0, r2d, dg2d, dh2d, w_x, splits, has_proj, outs), len(splits[0]) - 1,
                call_threads(dg2d.shape[0] * dg2d.shape[1] * (2 * x2d.shape[1] + 2 * h2d.shape[1])))
    _unpack_columns(outs[1], outs[2], perm, d_kernel, d_bias)


@njit(**KERNEL)
def _unpack_columns(packed_grad, packed_b, perm, d_kernel, d_bias):
    """The kernel and bias gradients from packed columns to ICFO: packed column ``c`` is column ``perm[c]``."""
    for row in range(d_kernel.shape[0]):
        out = d_kernel[row]
        src = packed_grad[row]
        for c in range(perm.shape[0]):
            out[perm[c]] = src[c]
    for c in range(perm.shape[0]):
        d_bias[perm[c]] = packed_b[c]


# ---------------------------------------------------------------------------
# Host drivers
# ---------------------------------------------------------------------------
def _column_chunks(matrix, bounds, width):
    """Flatten ``matrix`` column block by column block: block ``k`` is ``matrix[:, width*b_k : width*b_{k+1}]``.

    With a single block this is ``matrix`` itself, flattened (no copy when it is C-contiguous).
    """
    if len(bounds) == 2:
        return np.ascontiguousarray(matrix).reshape(-1)
    pairs = zip(bounds[:-1], bounds[1:], strict=True)
    return np.concatenate([matrix[:, width * a:width * b].ravel() for a, b in pairs])


def _dummy3(dtype):
    """A stand-in for an unused ``[T, B, P]`` array (same type, so no extra compile)."""
    return np.zeros((0, 0, 0), dtype)


class PackedWeights:
    """Cell weights packed for the kernels, for one dtype and one chunking.

    Packing permutes and copies every weight; a cell keeps its packed weights
    until they change (``set_weights``), so repeated calls pay it once.

    Parameters
    ----------
    weights : dict
        ``kernel [I + P, 4H]`` (ICFO), ``bias [4H]``, optional
        ``w_i_diag, w_f_diag, w_o_diag [H]`` and ``projection/kernel [H, P]``,
        already in the compute dtype.
    input_depth : int
    batch_size : int
        Decides how many chunks (threads) a step uses.
    num_chunks : int, optional
        Force the number of chunks (tests use it to run the parallel paths on tiny shapes).
    """

    def __init__(self, weights, input_depth, batch_size, num_chunks=None):
        kernel = weights["kernel"]
        dtype = kernel.dtype
        units = kernel.shape[1] // 4
        proj = weights.get("projection/kernel")
        depth = units if proj is None else proj.shape[1]
        self.dtype, self.units, self.depth, self.input_depth = dtype, units, depth, input_depth
        self.has_proj = proj is not None
        self.bounds = cell_chunk_bounds(max(batch_size, 1), units, num_chunks)
        self.perm = packed_columns(units, self.bounds)
        kp = packed_order(kernel, self.bounds)
        self.w_x = kp[:input_depth]  # [I, 4H] packed, C-contiguous (rows of a C-contiguous array)
        w_h = kp[input_depth:]  # [P, 4H] packed
        self.bias = packed_order(weights["bias"], self.bounds)
        # The forward's recurrent weights: each chunk's 4 uk columns in the
        # micro-kernel's panels (nblstm.cpu does the same per call; a cell
        # keeps them until its weights change). The fused ops' packing:
        # chunk k's columns [i | j | f | o] of the ICFO kernel, and the
        # transposes of w_h's row chunks.
        self.rec_off = column_offsets(self.bounds, 4, dtype)
        self.w_rec = pool.aligned(depth * int(self.rec_off[-1]), dtype)
        with kernel_section():
            pack_chunks(np.ascontiguousarray(kernel[input_depth:]), self.bounds, self.rec_off, self.w_rec, False,
                        w_h.size >= MIN_PARALLEL_PACK)
        if self.has_proj:
            self.proj_bounds = cell_chunk_bounds(max(batch_size, 1), depth, len(self.bounds) - 1)
            self.w_proj = _column_chunks(proj, self.proj_bounds, 1)
            self.w_proj_t = _column_chunks(proj.T, self.bounds, 1)
        else:
            # Without a projection both backward phases share the unit chunks.
            self.proj_bounds = self.bounds
            self.w_proj = self.w_proj_t = np.zeros(0, dtype)
        # The backward's w_h^T by column chunks, in panels as w_rec.
        self.rt_off = column_offsets(self.proj_bounds, 1, dtype)
        self.w_rec_t = pool.aligned(4 * units * int(self.rt_off[-1]), dtype)
        with kernel_section():
            pack_chunks(w_h, self.proj_bounds, self.rt_off, self.w_rec_t, True, w_h.size >= MIN_PARALLEL_PACK)
        zeros = np.zeros(units, dtype)
        self.peepholes = tuple(np.ascontiguousarray(weights.get(n, zeros))
                               for n in ("w_i_diag", "w_f_diag", "w_o_diag"))
        self.use_peepholes = "w_i_diag" in weights
        #: The kernels' view of these weights (:class:`CellWeights`).
        self.record = CellWeights(self.w_x, self.bias, self.w_rec, self.bounds, self.rec_off, self.w_proj,
                                  self.proj_bounds, self.peepholes, self.w_rec_t, self.rt_off, self.w_proj_t)

    def kernel_options(self, options):
        """The kernels' record of ``options`` (:class:`nblstm.options.KernelOptions`) for these weights."""
        return options.kernel_options(self.has_proj, self.use_peepholes)


def fused_forward_applies(options, has_proj, steps):
    """Whether the cell runs on the fused ops' kernels, forward (:func:`nblstm.cpu.fused.forward_packed`) and
    backward (:func:`nblstm.cpu.fused.backward`).

    It does where its options are the ops': no projection, tanh and
    sigmoid, no clip (the ops' backward passes the gradient through the
    clip, the cell's gives it its true gradient). Per-example lengths
    included: the fused kernels carry the state past an example's length,
    as the cell's do; and any schedule (reversal, masks), whose steps read
    the inputs gathered into step order. The unit maths is the same; the ops' forward
    computes the input projection inside the steps
    (:func:`~nblstm.cpu.partition.fused_projection`), which the cell's does
    not (``run`` took 0.6-0.87x the cell kernel's time at batched shapes,
    ``docs/design.md``), and one family of kernels serves the ops and these
    cells, compiled once. One step (``T = 1``) stays on the cell's kernels,
    whose bits the streaming step reproduces (:mod:`nblstm.cpu.step`).
    """
    return not has_proj and options.kernel_code() == 0 and options.cell_clip is None and steps > 1


def skips_sorted_rows(options, has_proj, steps, batch, inputs, units, dtype):
    """Whether an inference call of the cell gains by its examples sorted longest first, with the same bits.

    It does on the fused kernels (:func:`fused_forward_applies`) with the
    input projection inside the steps
    (:func:`~nblstm.cpu.partition.fused_projection`): every product is then
    the micro-kernel's, whose sums do not depend on a row's position, and
    the steps skip the rows after the last example still running
    (:func:`nblstm.cpu.fused._running`). Elsewhere nothing is skipped, and the
    input projection before the loop is a BLAS GEMM, which promises no such
    independence.
    """
    return (fused_forward_applies(options, has_proj, steps)
            and fused_projection(max(batch, 1), inputs, units, compute_dtype(dtype)))


class FusedWeights:
    """A cell's weights for the fused ops' kernels (:func:`fused_forward_applies`), for one batch size.

    Parameters
    ----------
    weights : dict
        ``kernel [I + H, 4H]`` (ICFO), ``bias [4H]``, optional ``w_i_diag,
        w_f_diag, w_o_diag [H]``, in the compute dtype; no projection.
    batch_size : int
    """

    def __init__(self, weights, batch_size):
        self.kernel = kernel = np.ascontiguousarray(weights["kernel"])
        self.batch_size = max(batch_size, 1)
        self.forward = ForwardWeights(kernel, self.batch_size, "icfo")
        self.dtype, self.units = kernel.dtype, kernel.shape[1] // 4
        self.bias = np.ascontiguousarray(weights["bias"])
        zeros = np.zeros(self.units, self.dtype)
        self.peepholes = tuple(np.ascontiguousarray(weights.get(n, zeros))
                               for n in ("w_i_diag", "w_f_diag", "w_o_diag"))
        self.use_peepholes = "w_i_diag" in weights
        self._backward = None

    def backward(self):
        """The backward's packed recurrent weights (:class:`nblstm.cpu.fused.BackwardWeights`), made at first use."""
        if self._backward is None:
            self._backward = BackwardWeights(self.kernel[self.kernel.shape[0] - self.units:], self.batch_size)
        return self._backward


def sequence_forward(x, c0, h0, packed, lengths, options, schedule=None, fused_weights=None, save=True):
    """Whole-sequence forward of the cell on validated arrays of the compute dtype.

    Parameters
    ----------
    x : [T, B, I] array
    c0 : [B, H] array
    h0 : [B, P] array
    packed : PackedWeights or None
        ``None`` with ``fused_weights``.
    lengths : [B] int64 array
    options : nblstm.options.CellOptions
    schedule : nblstm.schedule.Schedule, optional
        The order of the steps (``lengths`` is then its ``counts``); the
        saved values are in step order.
    fused_weights : FusedWeights, optional
        Run the fused ops' forward, where :func:`fused_forward_applies`; the
        saved values are then the ops' outputs, which
        :func:`sequence_backward` gives to the ops' backward.
    save : bool, default True
        Keep what the backward reads; ``False`` (inference): only the outputs
        and the final state are kept (:class:`CellSaved`), and the result is
        for :func:`final_state` and :func:`masked_outputs` alone.

    Returns
    -------
    dict
        Saved values: ``gates [T, B, 4H]`` (packed), ``c_raw, c, ac, r
        [T, B, H]``, ``h_raw, h [T, B, P]`` (``h_raw`` empty without a
        projection, ``h`` the same array as ``r``), and the inputs and
        options the backward pass needs. :func:`sequence_backward` turns
        ``gates`` into their gradients (it becomes ``None``).
    """
    steps, batch, inputs = x.shape
    if fused_weights is not None:
        return _fused_sequence_forward(x, c0, h0, lengths, options, fused_weights, save, schedule)
    units, depth, dtype = packed.units, packed.depth, packed.dtype
    c = np.ascontiguousarray
    x, c0, h0 = c(x, dtype), c(c0, dtype), c(h0, dtype)
    saved = {"x": x, "c0": c0, "h0": h0, "lengths": lengths, "options": options, "schedule": schedule,
             "fused_weights": None, "save": save}
    if steps == 0 or batch == 0:
        gates = np.zeros((steps, batch, 4 * units), dtype)
        c_raw_, c_, ac_, r_ = (np.zeros((steps, batch, units), dtype) for _ in range(4))
        h_raw_ = np.zeros((steps, batch, depth), dtype) if packed.has_proj else _dummy3(dtype)
        h_ = np.zeros((steps, batch, depth), dtype) if packed.has_proj else r_
        saved.update(gates=gates, c_raw=c_raw_, c=c_, ac=ac_, r=r_, h_raw=h_raw_, h=h_)
        return saved
    # Every element of these is written by the kernel.
    gates = pool.empty((steps, batch, 4 * units), dtype)
    if save:
        c_raw_, c_, ac_, r_ = pool.empty((4, steps, batch, units), dtype)  # one allocation
        if packed.has_proj:
            h_raw_, h_ = pool.empty((steps, batch, depth), dtype), pool.empty((steps, batch, depth), dtype)
    else:  # a step's scratch, the previous cell state, and the outputs
        c_raw_, ac_, r_ = pool.empty((3, 1, batch, units), dtype)
        c_ = pool.empty((2, batch, units), dtype)
        if packed.has_proj:
            h_raw_, h_ = pool.empty((1, batch, depth), dtype), pool.empty((steps, batch, depth), dtype)
        else:
            r_ = pool.empty((steps, batch, units), dtype)
    if not packed.has_proj:
        h_raw_, h_ = _dummy3(dtype), r_
    saved.update(gates=gates, c_raw=c_raw_, c=c_, ac=ac_, r=r_, h_raw=h_raw_, h=h_)
    rows = steps * batch
    work = pool.aligned(batch * int(packed.rec_off[-1]), dtype)
    proj_work = np.empty(batch * depth, dtype)
    x_rows = row_bounds(rows, inputs * 4 * units)
    with kernel_section():
        if schedule is not None:
            # The projection of every time, in time order, then its rows in step order.
            pre = pool.empty((steps, batch, 4 * units), dtype)
            blocks = x_rows.shape[0] - 1
            claims, done = sync.counters(1, blocks)
            threads.run(projection_worker, (claims, done, x.reshape(rows, inputs), packed.w_x, x_rows,
                                            pre.reshape(rows, 4 * units)),
                        min(blocks, call_threads(rows * inputs * 4 * units, blocks)))
            regroup.gather(pre, schedule.time_of, gates)
        forward_kernel(CellInputs(x.reshape(rows, inputs), x_rows, c0, h0, c(lengths, np.int64)), packed.record,
                       packed.kernel_options(options), work, proj_work,
                       CellSaved(gates, c_raw_, c_, ac_, r_, h_raw_, h_), project=schedule is None)
    return saved


def _fused_sequence_forward(x, c0, h0, lengths, options, weights, save, schedule):
    """:func:`sequence_forward` on the fused ops' forward kernel (:func:`fused_forward_applies`).

    With a schedule the steps read the inputs gathered into step order
    (``saved["x"]``, which the backward reads), ``lengths`` its counts.
    """
    dtype = weights.dtype
    c = np.ascontiguousarray
    x, c0, h0 = c(x, dtype), c(c0, dtype), c(h0, dtype)
    if schedule is not None and x.size:
        x_steps = pool.empty(x.shape, dtype)
        with kernel_section():
            regroup.gather(x, schedule.time_of, x_steps)
        x = x_steps
    saved = {"x": x, "c0": c0, "h0": h0, "lengths": lengths, "options": options, "schedule": schedule,
             "fused_weights": weights, "save": save}
    kernel_options = options.kernel_options(False, weights.use_peepholes)
    if not save and x.shape[1]:  # inference: the outputs and the last cell state only
        h, c_last, h_last = fused_forward(x, c0, h0, weights.forward, weights.bias, weights.peepholes, x.shape[0],
                                          kernel_options, save=False, lengths=lengths)
        # With the examples longest first, h is zero past each one's length (fused._zeroes_finished).
        return {**saved, "c": c_last[None], "h": h, "h_last": h_last,
                "masked": outputs_zeroed(lengths, x.shape[0])}
    block = fused_forward(x, c0, h0, weights.forward, weights.bias, weights.peepholes, x.shape[0], kernel_options,
                          lengths=lengths)
    # The ops' seven outputs, as their backward reads them; c and h for the state and the outputs.
    return {**saved, "block": block, "c": block[1], "h": block[6]}


def _fused_sequence_backward(saved, d_out, d_c, d_h):
    """:func:`sequence_backward` on the fused ops' backward kernel, after :func:`_fused_sequence_forward`.

    Without a clip the ops' straight-through clip gradient is the cell's
    true one. The final state's gradients join the last step's (and reach
    each example's last step of its own through the carried state); the
    outputs past an example's length are zero, so their gradients are not
    read. With a schedule the output gradients are summed into step order
    and the inputs' come back in time order.
    """
    weights, x, c0, h0, lengths = saved["fused_weights"], saved["x"], saved["c0"], saved["h0"], saved["lengths"]
    schedule = saved["schedule"]
    dtype = weights.dtype
    # The temporaries from the pool: a bidirectional layer's second direction runs on a helper thread, whose
    # freed blocks glibc gave back to the system, to be faulted in again at the next call (pool.MIN_BYTES).
    if schedule is not None:  # the output gradients in step order (summed where outputs repeat; every row written)
        h_grad = pool.empty(d_out.shape, dtype)
        if h_grad.size:
            with kernel_section():
                regroup.scatter_add(np.ascontiguousarray(d_out, dtype), schedule.output_of, h_grad)
    else:
        h_grad = pool.empty(d_out.shape, dtype)
        h_grad[...] = d_out
    if lengths is not None and lengths.size and int(lengths.min()) < h_grad.shape[0]:
        h_grad[np.arange(h_grad.shape[0])[:, None] >= lengths[None, :]] = 0
    cs_grad = pool.zeros(h_grad.shape, dtype)
    if h_grad.shape[0]:
        h_grad[-1] += d_h
        cs_grad[-1] = d_c
    d_x, d_c0, d_h0, d_kernel, d_wi, d_wf, d_wo, d_bias = fused_backward(
        x, c0, h0, weights.kernel, *weights.peepholes, saved["block"], cs_grad, h_grad, x.shape[0],
        OpOptions(use_peephole=weights.use_peepholes, layout="icfo"), weights.backward(), lengths)
    if schedule is not None and d_x.size:  # the inputs' gradients back in time order
        d_x_steps, d_x = d_x, pool.empty(d_x.shape, dtype)
        with kernel_section():
            regroup.gather(d_x_steps, schedule.step_of, d_x)
    d_weights = {"kernel": d_kernel, "bias": d_bias}
    if weights.use_peepholes:
        d_weights["w_i_diag"], d_weights["w_f_diag"], d_weights["w_o_diag"] = d_wi, d_wf, d_wo
    return d_x, d_c0, d_h0, d_weights


def final_state(saved):
    """The state after the last step, ``(c [B, H], h [B, P])``; the initial state when ``T = 0``."""
    steps = saved["h"].shape[0]
    if steps == 0:
        return saved["c0"].copy(), saved["h0"].copy()
    c = saved["c"]  # every step's, or the slots of an inference call (CellSaved)
    h = saved["h_last"] if "h_last" in saved else saved["h"][-1]
    return c[(steps - 1) % c.shape[0]].copy(), h.copy()


def masked_outputs(saved):
    """Outputs ``[T, B, P]``: ``h``, zero from each example's length on (in time order with a schedule)."""
    h = saved["h"]
    steps = h.shape[0]
    schedule = saved["schedule"]
    if schedule is not None:
        out = np.empty(h.shape, h.dtype)
        if out.size:
            regroup.gather(h, schedule.output_of, out)
        return out
    lengths = saved["lengths"]
    if lengths.size == 0 or lengths.min() >= steps or saved.get("masked", False):  # nothing to mask
        return h if not saved["save"] else h.copy()  # an inference call keeps nothing else of h
    mask = np.arange(steps)[:, None] < saved["lengths"][None, :]
    return np.where(mask[:, :, None], h, 0).astype(h.dtype, copy=False)


def sequence_backward(saved, packed, d_out, d_c, d_h):
    """Whole-sequence backward of the cell.

    Parameters
    ----------
    saved : dict
        From :func:`sequence_forward` with the same ``packed``. Its gates
        array becomes the gate gradients (``saved["gates"]`` is set to
        ``None``): the pass needs no second ``[T, B, 4H]`` array. A later
        call on the same ``saved`` recomputes the forward pass first, so the
        backward pass may run any number of times.
    packed : PackedWeights
    d_out : [T, B, P] array
        Gradient of the outputs.
    d_c : [B, H] array
    d_h : [B, P] array
        Gradient of the final state.

    Returns
    -------
    tuple
        ``(d_x [T, B, I], d_c0 [B, H], d_h0 [B, P], d_weights)`` where
        ``d_weights`` is a dict keyed like the weights.
    """
    if saved["fused_weights"] is not None:
        return _fused_sequence_backward(saved, d_out, d_c, d_h)
    x, c0, h0, lengths = saved["x"], saved["c0"], saved["h0"], saved["lengths"]
    steps, batch, inputs = x.shape
    units, depth, dtype = packed.units, packed.depth, packed.dtype
    dc = np.array(d_c, dtype, copy=True, order="C")
    dh = np.array(d_h, dtype, copy=True, order="C")
    peephole_grads = [np.zeros(units, dtype) for _ in range(3)]
    d_kernel = np.zeros((inputs + depth, 4 * units), dtype)
    d_bias = np.zeros(4 * units, dtype)
    d_proj = np.zeros((units, depth), dtype) if packed.has_proj else np.zeros((0, 0), dtype)
    rows = steps * batch
    d_x = (np.empty if rows else np.zeros)((steps, batch, inputs), dtype)  # every row is written
    if rows > 0:
        c = np.ascontiguousarray
        # The gate gradients overwrite the saved gates: with the forward pass,
        # one [T, B, 4H] array in all.
        schedule = saved["schedule"]
        if saved["gates"] is None:  # consumed by an earlier backward pass: recompute
            saved.update(sequence_forward(x, c0, h0, packed, lengths, saved["options"], schedule))
        dgates = saved["gates"]
        saved["gates"] = None
        dh_raw = pool.empty((steps, batch, depth), dtype)
        work = np.empty(batch * units, dtype)
        proj_work = pool.aligned(batch * int(packed.rt_off[-1]), dtype)
        lengths = c(lengths, np.int64)
        x_rows = row_bounds(rows, (2 * inputs + 2 * depth) * 4 * units)
        num_blocks = x_rows.shape[0] - 1
        w_rows, col_blocks, proj_rows = (block_bounds(n, num_blocks) for n in (inputs + depth, 4 * units, units))
        packed_grad = np.empty((inputs + depth, 4 * units), dtype)
        packed_b = np.empty(4 * units, dtype)
        h_steps, h_first = saved["h"].reshape(rows, depth), h0
        with kernel_section():
            d_out = c(d_out, dtype)
            if schedule is not None:  # the output gradients in step order (summed where outputs repeat)
                d_out_steps = pool.empty((steps, batch, depth), dtype)
                regroup.scatter_add(d_out, schedule.output_of, d_out_steps)
                d_out = d_out_steps
            backward_kernel(CellInputs(x.reshape(rows, inputs), x_rows, c0, h0, lengths), packed.record,
                            packed.kernel_options(saved["options"]),
                            CellSaved(dgates, saved["c_raw"], saved["c"], saved["ac"], saved["r"], saved["h_raw"],
                                      saved["h"]),
                            d_out, work, proj_work, CellGrads(dh_raw, dc, dh, tuple(peephole_grads)))
            if schedule is not None:
                # Back to time order: the gate gradients, and each time's previous output (h0 before step 0).
                dgates_steps, dgates = dgates, pool.empty((steps, batch, 4 * units), dtype)
                regroup.gather(dgates_steps, schedule.step_of, dgates)
                h_prev = pool.empty((steps, batch, depth), dtype)
                regroup.gather(saved["h"], schedule.step_of, h_prev, first=h0, shift=1)
                # weight_grads_kernel reads row r - B as the previous output of row r, h_first before row B.
                h_first, h_steps = h_prev[0], h_prev[1:].reshape((steps - 1) * batch, depth)
            weight_grads_kernel(x.reshape(rows, inputs), h_steps, h_first,
                                saved["r"].reshape(rows, units), dgates.reshape(rows, 4 * units),
                                dh_raw.reshape(rows, depth), packed.w_x, (x_rows, w_rows, col_blocks, proj_rows),
                                packed.perm, packed.has_proj,
                                (d_x.reshape(rows, inputs), packed_grad, packed_b, d_proj), d_kernel, d_bias)
    d_weights = {"kernel": d_kernel, "bias": d_bias}
    if packed.use_peepholes:
        d_weights["w_i_diag"], d_weights["w_f_diag"], d_weights["w_o_diag"] = peephole_grads
    if packed.has_proj:
        d_weights["projection/kernel"] = d_proj
    return d_x, dc, dh, d_weights
