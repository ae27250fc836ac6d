"""Persistent kernels that keep the recurrent weights on chip: the fused ops' time loops for small batches.

At small batches a step is a matrix-vector product with ``W_h``, and what
it costs is reading ``W_h``: the per-step kernels (and
:mod:`nblstm.cuda.fused_kernels`' persistent ones) read all of it from L2
for every step and every 4-row batch tile. Here one cooperative launch runs
every step; block ``g`` owns hidden units ``[g U, (g + 1) U)`` and loads
its slice of ``W_h`` into shared memory once, for the whole sequence:

- forward: the four gate columns of each of its units, stored as rows
  (``[4U, H]``, unit-major: row ``4u + gate``);
- backward: the rows ``W_h[j, :]`` of its units (``[U, 4H]``), which the
  carried ``dh[:, j] = dgates[t + 1] @ W_h[j, :]^T`` reads.

A step takes the batch by groups of ``RB`` rows. For each group it stages
the vector operand (``h_{t-1}``, or ``dgates[t + 1]``) in shared memory by
chunks of ``chunk`` columns, and thread ``(lane, u)`` accumulates unit
``u``'s products over the columns ``k = lane (mod lanes)`` for every row of
the group in registers (the four gates together in the forward, so that
one load of ``h`` feeds four products). The lanes' partial sums are added
in lane order through shared memory (fixed order: deterministic) and the
gate maths of :mod:`nblstm.spec` runs on them; one grid barrier separates
the steps. With one lane the sums run in the order of the tiled step
kernels, bit for bit.

The launcher (:meth:`nblstm.cuda.launch.Launcher.recurrence`) picks ``U``
so that the blocks fit the GPU at one block per multiprocessor, sizes the
dynamic shared memory (:func:`shared_words`) and raises the kernel's
shared-memory limit above 48 KB where the slice needs it.
"""

from numba import cuda

from . import cell_kernels as cell
from . import fused_kernels as fused
from .cell_kernels import cell_backward_at, cell_unit_at
from .fused_kernels import backward_unit_at, forward_unit_at
from .registry import A2, A3, A4, BLOCKS, I64, LENGTHS, OPTIONS, SCALAR, kernel
from .tiles import unit_options

__all__ = ["RB", "backward_resident", "cell_backward_resident", "cell_forward_resident", "forward_resident",
           "shared_words"]

#: Batch rows of a group: each thread keeps ``4 * RB`` sums in registers (64 of its registers in the forward).
RB = 16


def shared_words(forward, per_block, units, batch, lanes, chunk):
    """Elements of dynamic shared memory a resident launch needs.

    ``forward``: ``[4U, H]`` weights, the staging or reduction buffer of one
    group of rows, and its ``[4U, RB]`` gate sums; backward: ``[U, 4H]``
    weights and the buffer.
    """
    rows = 4 * per_block if forward else per_block
    k_total = units if forward else 4 * units
    group = min(batch, RB)
    buffer = max(group * chunk, rows * group * (lanes + 1))
    return rows * k_total + buffer + (rows * group if forward else 0)


@cuda.jit(device=True)
def _stage(src, first, t, g0, group, k0, kc, chunk, buf, tid, nthreads):
    """``buf[b * chunk + kk] = op[g0 + b, k0 + kk]`` where ``op`` is ``first`` at ``t < 0``, else ``src[t]``."""
    for e in range(tid, group * kc, nthreads):
        b = e // kc
        kk = e % kc
        buf[b * chunk + kk] = first[g0 + b, k0 + kk] if t < 0 else src[t, g0 + b, k0 + kk]


@cuda.jit(device=True)
def _gate_columns(w_rec, per_block, gs, blocks, zero):
    """The forward kernels' dynamic shared memory as ``(w_s, gate_s, buf)``, ``w_s`` loaded (the layout
    :func:`shared_words` sizes).

    ``w_s[(4u + g) H + k] = w_rec[k, block_g H + j0 + u]``: the four gate
    columns of the block's units as rows (``blocks`` holds the gate block
    indices ``(i, c, f, o)``; units past ``H`` get zeros); ``gate_s``: the
    ``[4U, gs]`` gate sums; ``buf``: the staging and reduction buffer. Every
    thread of the block calls this (it synchronises the block).
    """
    units = w_rec.shape[0]
    rows = 4 * per_block
    smem = cuda.shared.array(0, w_rec.dtype)
    w_s = smem[:rows * units]
    j0 = cuda.blockIdx.x * per_block
    nthreads = cuda.blockDim.x * cuda.blockDim.y
    for e in range(cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x, rows * units, nthreads):
        r = e // units
        jj = j0 + r // 4
        w_s[e] = w_rec[e % units, blocks[r % 4] * units + jj] if jj < units else zero
    cuda.syncthreads()
    return w_s, smem[rows * units:rows * units + rows * gs], smem[rows * units + rows * gs:]


@cuda.jit(device=True)
def _gate_sums(seq, first, t, g0, group, gs, w_s, buf, gate_s, chunk, zero):
    """``gate_s[(4u + g) gs + b] = sum_k h[g0 + b, k] w_s[(4u + g) H + k]`` for this block's units ``u``, where ``h``
    is ``first`` at ``t == 0``, else ``seq[t - 1]``: the recurrent part of the gates of one group of rows.

    Every thread of the block calls this (it synchronises the block);
    thread ``(lane, u)`` sums the columns ``k = lane (mod lanes)`` of unit
    ``u`` in registers, then the lanes' sums are added in lane order.
    """
    units = first.shape[1]
    lanes = cuda.blockDim.x
    lane = cuda.threadIdx.x
    u = cuda.threadIdx.y
    nthreads = lanes * cuda.blockDim.y
    tid = u * lanes + lane
    base = 4 * u * units
    acc = cuda.local.array((4, RB), w_s.dtype)
    for b in range(RB):
        for g in range(4):
            acc[g, b] = zero
    for k0 in range(0, units, chunk):
        kc = min(chunk, units - k0)
        _stage(seq, first, t - 1, g0, group, k0, kc, chunk, buf, tid, nthreads)
        cuda.syncthreads()
        for kk in range(lane, kc, lanes):
            w0 = w_s[base + k0 + kk]
            w1 = w_s[base + units + k0 + kk]
            w2 = w_s[base + 2 * units + k0 + kk]
            w3 = w_s[base + 3 * units + k0 + kk]
            for b in range(RB):
                if b < group:
                    hv = buf[b * chunk + kk]
                    acc[0, b] += hv * w0
                    acc[1, b] += hv * w1
                    acc[2, b] += hv * w2
                    acc[3, b] += hv * w3
        cuda.syncthreads()
    # The lanes' sums of unit u, gate g, row b at buf[((4u + g) gs + b) (lanes + 1) + lane]: the padding
    # column spreads the reads of one row's lanes over the banks.
    for b in range(RB):
        if b < group:
            for g in range(4):
                buf[((4 * u + g) * gs + b) * (lanes + 1) + lane] = acc[g, b]
    cuda.syncthreads()
    for o in range(lane, 4 * group, lanes):
        row = (4 * u + o // group) * gs + o % group
        s = buf[row * (lanes + 1)]
        for q in range(1, lanes):
            s += buf[row * (lanes + 1) + q]
        gate_s[row] = s
    cuda.syncthreads()


@kernel("fused")
def forward_resident(steps: I64, xw: A3, cs_prev: A2, h_prev: A2, weights: fused.WEIGHTS, one: SCALAR,
                     options: OPTIONS, blocks: BLOCKS, out: A4, per_block: I64, chunk: I64):
    """All ``steps`` forward steps with ``W_h``'s slice of each block in shared memory.

    Arguments as :func:`nblstm.cuda.fused_kernels.forward_persistent`, and
    ``per_block`` (``U``, units per block) and ``chunk`` (columns of ``h``
    staged at a time). Grid ``ceil(H / U)`` blocks of ``(lanes, U)`` threads,
    all resident (cooperative); ``shared_words(True, ...)`` elements of
    dynamic shared memory.
    """
    grid = cuda.cg.this_grid()
    batch, units = cs_prev.shape
    lanes = cuda.blockDim.x
    lane = cuda.threadIdx.x
    zero = one - one
    unit = unit_options(options, one, 0)
    bi, bc, bf, bo = blocks
    gs = min(batch, RB)  # rows of a group, the row stride of the sums
    w_s, gate_s, buf = _gate_columns(weights.w_rec, per_block, gs, blocks, zero)
    u = cuda.threadIdx.y
    j = cuda.blockIdx.x * per_block + u
    for t in range(steps):
        for g0 in range(0, batch, RB):
            group = min(RB, batch - g0)
            _gate_sums(out[6], h_prev, t, g0, group, gs, w_s, buf, gate_s, chunk, zero)
            if j < units:
                for b in range(lane, group, lanes):
                    bb = g0 + b
                    forward_unit_at(t, bb, j, (gate_s[(4 * u) * gs + b] + xw[t, bb, bi * units + j],
                                               gate_s[(4 * u + 1) * gs + b] + xw[t, bb, bc * units + j],
                                               gate_s[(4 * u + 2) * gs + b] + xw[t, bb, bf * units + j],
                                               gate_s[(4 * u + 3) * gs + b] + xw[t, bb, bo * units + j]),
                                    cs_prev, weights, unit, out)
        grid.sync()


@kernel("cell")
def cell_forward_resident(steps: I64, fwd: cell.FORWARD, state: cell.STATE, weights: cell.WEIGHTS,
                          lengths: LENGTHS, one: SCALAR, options: OPTIONS, per_block: I64, chunk: I64):
    """All ``steps`` forward steps of ``LSTMCell`` without a projection, ``W_h``'s slices in shared memory.

    Arguments as :func:`nblstm.cuda.cell_kernels.forward_step`'s (``fwd.hs``
    is ``fwd.cells[2:4]``: ``h`` is ``r``), and ``per_block`` and ``chunk`` as
    :func:`forward_resident`'s, with the same grid and shared memory.
    """
    grid = cuda.cg.this_grid()
    c0, h0 = state
    batch, units = c0.shape
    lanes = cuda.blockDim.x
    lane = cuda.threadIdx.x
    zero = one - one
    unit = unit_options(options, one, options.act)
    gs = min(batch, RB)  # rows of a group, the row stride of the sums
    w_s, gate_s, buf = _gate_columns(weights.w_rec, per_block, gs, (0, 1, 2, 3), zero)
    u = cuda.threadIdx.y
    j = cuda.blockIdx.x * per_block + u
    for t in range(steps):
        for g0 in range(0, batch, RB):
            group = min(RB, batch - g0)
            _gate_sums(fwd.hs[1], h0, t, g0, group, gs, w_s, buf, gate_s, chunk, zero)
            if j < units:
                for b in range(lane, group, lanes):
                    cell_unit_at(t, g0 + b, j, (gate_s[(4 * u) * gs + b], gate_s[(4 * u + 1) * gs + b],
                                                gate_s[(4 * u + 2) * gs + b], gate_s[(4 * u + 3) * gs + b]),
                                 fwd, state, lengths, weights, unit, False)
        grid.sync()


@cuda.jit(device=True)
def _weight_rows(w_rec, per_block, zero):
    """The backward kernels' dynamic shared memory as ``(w_s, buf)``, ``w_s`` loaded (the layout
    :func:`shared_words` sizes): ``w_s[u 4H + c] = w_rec[j0 + u, c]``, the rows of ``W_h`` of the block's units
    (zeros past ``H``), and the staging and reduction buffer. Every thread of the block calls this."""
    units, gates = w_rec.shape
    smem = cuda.shared.array(0, w_rec.dtype)
    w_s = smem[:per_block * gates]
    j0 = cuda.blockIdx.x * per_block
    nthreads = cuda.blockDim.x * cuda.blockDim.y
    for e in range(cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x, per_block * gates, nthreads):
        jj = j0 + e // gates
        w_s[e] = w_rec[jj, e % gates] if jj < units else zero
    cuda.syncthreads()
    return w_s, smem[per_block * gates:]


@cuda.jit(device=True)
def _carried_sums(dgates, t, steps, g0, group, gs, w_s, buf, chunk, zero):
    """The lanes' partial sums of ``dgates[t + 1, g0 + b] @ w_s[u]`` (zero at the last step) into
    ``buf[(u gs + b) (lanes + 1) + lane]``; :func:`_lane_sum` adds them. Every thread of the block calls this."""
    gates = dgates.shape[2]
    lanes = cuda.blockDim.x
    lane = cuda.threadIdx.x
    u = cuda.threadIdx.y
    nthreads = lanes * cuda.blockDim.y
    tid = u * lanes + lane
    base = u * gates
    acc = cuda.local.array(RB, w_s.dtype)
    for b in range(RB):
        acc[b] = zero
    if t + 1 < steps:  # the same for every thread of the grid: all reach the barriers below
        for k0 in range(0, gates, chunk):
            kc = min(chunk, gates - k0)
            _stage(dgates, dgates[0], t + 1, g0, group, k0, kc, chunk, buf, tid, nthreads)
            cuda.syncthreads()
            for kk in range(lane, kc, lanes):
                wv = w_s[base + k0 + kk]
                for b in range(RB):
                    if b < group:
                        acc[b] += buf[b * chunk + kk] * wv
            cuda.syncthreads()
    for b in range(RB):
        if b < group:
            buf[(u * gs + b) * (lanes + 1) + lane] = acc[b]
    cuda.syncthreads()


@cuda.jit(device=True)
def _lane_sum(buf, u, b, gs):
    """Unit ``u``'s carried sum of row ``b`` of the group: its lanes' partial sums in lane order."""
    lanes = cuda.blockDim.x
    row = (u * gs + b) * (lanes + 1)
    s = buf[row]
    for q in range(1, lanes):
        s += buf[row + q]
    return s


@kernel("fused")
def backward_resident(steps: I64, cs_prev: A2, saved: fused.SAVED, grads: fused.GRADS, weights: fused.WEIGHTS,
                      one: SCALAR, options: OPTIONS, blocks: BLOCKS, results: fused.RESULTS, per_block: I64,
                      chunk: I64):
    """All backward steps, ``S - 1 .. 0``, with the rows of ``W_h`` of each block's units in shared memory.

    Arguments as :func:`nblstm.cuda.fused_kernels.backward_persistent`, and
    ``per_block`` and ``chunk`` (gate columns of ``dgates[t + 1]`` staged at
    a time). Grid ``ceil(H / U)`` blocks of ``(lanes, U)`` threads, all
    resident; ``shared_words(False, ...)`` elements of dynamic shared memory.
    """
    grid = cuda.cg.this_grid()
    batch, units = cs_prev.shape
    lanes = cuda.blockDim.x
    lane = cuda.threadIdx.x
    u = cuda.threadIdx.y
    zero = one - one
    unit = unit_options(options, one, 0)
    h_grad = grads.h_grad
    gs = min(batch, RB)  # rows of a group, the row stride of the sums
    w_s, buf = _weight_rows(weights.w_rec, per_block, zero)
    j = cuda.blockIdx.x * per_block + u
    for step in range(steps):
        t = steps - 1 - step
        for g0 in range(0, batch, RB):
            group = min(RB, batch - g0)
            _carried_sums(results.dgates, t, steps, g0, group, gs, w_s, buf, chunk, zero)
            if j < units:
                for b in range(lane, group, lanes):
                    backward_unit_at(t, g0 + b, j, h_grad[t, g0 + b, j] + _lane_sum(buf, u, b, gs), cs_prev, saved,
                                     grads.cs_grad, weights, unit, blocks, results)
            cuda.syncthreads()  # the next group stages into the buffer these sums were read from
        grid.sync()


@kernel("cell")
def cell_backward_resident(steps: I64, fwd: cell.FORWARD, state: cell.STATE, weights: cell.WEIGHTS,
                           lengths: LENGTHS, one: SCALAR, options: OPTIONS, grads: cell.GRADS, per_block: I64,
                           chunk: I64):
    """All backward steps of ``LSTMCell`` without a projection, ``S - 1 .. 0``, the rows of ``W_h`` of each
    block's units in shared memory.

    Arguments as :func:`nblstm.cuda.cell_kernels.backward_units_step`'s
    (``grads.dh`` is carried in place; the gradient of ``h0`` is left to one
    :func:`~nblstm.cuda.cell_kernels.backward_h_step` at ``t = -1``), and
    ``per_block`` and ``chunk`` as :func:`backward_resident`'s, with the same
    grid and shared memory.
    """
    grid = cuda.cg.this_grid()
    batch, units = state.c0.shape
    lanes = cuda.blockDim.x
    lane = cuda.threadIdx.x
    u = cuda.threadIdx.y
    zero = one - one
    unit = unit_options(options, one, options.act)
    gs = min(batch, RB)  # rows of a group, the row stride of the sums
    w_s, buf = _weight_rows(weights.w_rec, per_block, zero)
    j = cuda.blockIdx.x * per_block + u
    for step in range(steps):
        t = steps - 1 - step
        for g0 in range(0, batch, RB):
            group = min(RB, batch - g0)
            _carried_sums(grads.dgates, t, steps, g0, group, gs, w_s, buf, chunk, zero)
            if j < units:
                for b in range(lane, group, lanes):
                    dr = _lane_sum(buf, u, b, gs) if t + 1 < steps else zero
                    cell_backward_at(t, g0 + b, j, dr, fwd, state, lengths, weights, unit, False, grads)
            cuda.syncthreads()
        grid.sync()
