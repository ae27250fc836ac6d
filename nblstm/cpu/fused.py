"""The fused ops on the CPU: kernels of BlockLSTM and its gradient, and their drivers.

How the work is laid out (:ref:`design-cpu`):

- A kernel is a serial ``nogil`` worker, ``worker(w, ...)``, run on
  several threads by :func:`nblstm.cpu.threads.run` (on the calling thread
  alone below :data:`~nblstm.cpu.partition.MIN_PARALLEL_CALL_WORK`
  multiply-adds a call). Every GEMM in a worker is a single-threaded BLAS
  call on a slice of the work. NumPy's multi-threaded BLAS is never called:
  its threads spin for a long time after each call and would fight the
  workers for the two cores (40-100x slowdowns measured from such
  oversubscription, :ref:`design-threads`).
- The input projection ``x_t @ w[:I]``: with ``B > 1`` and ``I <= 256``
  (longer inputs from ``B = 8`` or ``32``) each step computes its own on
  the micro-kernel, continuing the same accumulators with ``h_{t-1} @
  w[I:]`` (:func:`~nblstm.cpu.partition.fused_projection`), so that no
  ``[T, B, 4H]`` projection goes to memory and comes back. Otherwise it is
  one GEMM before the time loop, computed straight into the gate outputs,
  its rows split in blocks that do not depend on the thread count (so that
  the forward pass gives the same bits on any number of threads).
- The hidden units are split into ``K`` chunks, one per thread (the
  micro-kernel's results do not depend on the split). Each chunk's
  recurrent weights (its ``4 * uk`` columns, gate blocks in the caller's
  order) are packed once per call in the panels of
  :mod:`nblstm.cpu.microkernel`, whose register-tiled GEMM runs the step
  1.6x faster than OpenBLAS, which packs the weights again at every step
  (and its batch-1 matrix-vector product faster than OpenBLAS's GEMV, with
  no call overhead). Each worker runs the whole time loop: at each step
  it runs the recurrent GEMM of its chunk and then the gate maths of its
  units while they are in cache, and the workers meet on atomic counters
  (:mod:`nblstm.cpu.sync`) before the next step.
- Backward keeps only ``dh = dgates @ w_h^T`` in the time loop, on the
  micro-kernel with each chunk's ``w_h[u0:u1]^T`` packed once per call;
  ``x_grad`` and the weight gradients are GEMMs after it, split across
  threads (``x_grad`` by rows, ``w_grad`` by its own rows, each block one
  product over all steps: no partial sums).
- Kernels are compiled with :data:`nblstm._jit.KERNEL` (no division checks,
  no fast-math flags).

Every array keeps the caller's gate layout (the packed recurrent weights
too, within each chunk); ``blocks[g]`` is the block (0..3) of gate ``g`` in
the order ``i, ci, f, o``. Unit chunk ``k`` holds the units
``u0 = bounds[k] .. u1 - 1``, ``uk = u1 - u0`` of them; its columns start at
``col0 = col_off[k]`` in the packed arrays and workspaces.
The kernels run on float32 or float64 arrays (the caller casts float16,
:mod:`nblstm.cpu.target`). The forward's seven outputs are one ``[7, T, B, H]``
allocation, passed to the kernel as one array; the kernels write every step
below ``seq_len_max`` and the drivers zero the rest.
"""

import threading
from typing import NamedTuple

import numba
import numpy as np
from numba import njit

from .._jit import CALLEE, KERNEL, full_width
from ..options import KernelOptions, OpOptions
from ..schedule import by_length
from ..spec import backward_unit, forward_unit, unit_options
from . import microkernel, pool, sync, threads
from .blas import kernel_section
from .gemm import address, dot, gemm
from .pack import pack_chunks, pack_recurrent
from .partition import (
    MIN_PARALLEL_PACK,
    block_bounds,
    call_threads,
    chunk_bounds,
    column_offsets,
    fused_projection,
    gate_blocks,
    row_blocks,
    row_bounds,
    split,
)
from .views import U, copy_elements, fill_zero, flat, matrix

__all__ = ["BackwardWeights", "ForwardWeights", "Inputs", "PackedBackward", "PackedForward", "backward",
           "backward_recurrent", "forward", "forward_packed", "weight_grads_block"]


# The kernels' records: the arrays of a call grouped by what they are, so that
# a worker takes a dozen parameters. A driver hands them to its workers as
# plain tuples, which a worker takes apart once, before its time loop:
# numba's dispatcher types a plain tuple of arrays in C, a named one in Python
# (5 arrays dispatched in 1.1 us as a plain tuple, 2.0 us named), and arrays
# taken out of a record inside the loop cost their reference counting at
# every step (0.15 us a step at B = 1, H = 32, measured).
class Inputs(NamedTuple):
    """The forward's inputs: ``x2d [S * B, I]`` (C-contiguous), ``cs_prev, h_prev [B, H]``, and ``lengths [B]``
    int64, each example's steps (empty: every example has every step; :func:`forward_packed`)."""

    x2d: np.ndarray
    cs_prev: np.ndarray
    h_prev: np.ndarray
    lengths: np.ndarray


class PackedForward(NamedTuple):
    """The forward's weights as the kernels read them (:meth:`ForwardWeights.record`).

    ``w_in [I, 4H]`` the input weights, C-contiguous (empty when ``fused``),
    ``w_x [4H * I]`` the packed input weights (empty unless ``fused``),
    ``w_rec [4H * H]`` the packed recurrent weights, ``bounds, col_off
    [K + 1]`` int64 the chunks of units and where their columns start
    (:func:`column_offsets` with ``per_unit = 4``), ``blocks [4]`` int64 the
    gate blocks of ``i, ci, f, o`` (:func:`gate_blocks`), ``fused`` the
    input projection inside the steps, ``bias [4H]`` in the caller's layout,
    ``peepholes`` the tuple ``(wci, wcf, wco)`` of ``[H]`` arrays.
    """

    w_in: np.ndarray
    w_x: np.ndarray
    w_rec: np.ndarray
    bounds: np.ndarray
    col_off: np.ndarray
    blocks: np.ndarray
    fused: bool
    bias: np.ndarray
    peepholes: tuple


class PackedBackward(NamedTuple):
    """The backward's weights as the kernels read them (:meth:`BackwardWeights.record`).

    ``w_rec_t`` the chunks' ``w_rec[u0:u1].T`` in panels (:func:`pack_chunks`;
    empty when ``S = 1``), ``bounds, col_off [K + 1]`` int64
    (:func:`column_offsets` with ``per_unit = 1``), ``blocks [4]`` int64,
    ``peepholes`` the tuple ``(wci, wcf, wco)`` of ``[H]`` arrays.
    """

    w_rec_t: np.ndarray
    bounds: np.ndarray
    col_off: np.ndarray
    blocks: np.ndarray
    peepholes: tuple


class _Scratch(threading.local):
    """Each Python thread's scratch buffers, kept from one call to the next.

    The backward's gate gradients ``[T, B, 4H]`` never leave it. Allocated
    afresh, they are the largest block freed by a training step, and glibc
    then returns the top of its heap to the system and faults it in again
    at the next call (thousands of page faults at ``(50, 32, 256, 256)``).
    A thread keeps the largest buffer it has needed under each name; it is
    freed with the thread.
    """

    def __init__(self):
        self.buffers = {}

    def get(self, name, shape, dtype):
        """An uninitialised ``shape`` array of ``dtype``, valid until this thread asks for ``name`` again."""
        size = int(np.prod(shape))
        key = (name, np.dtype(dtype))
        buffer = self.buffers.get(key)
        if buffer is None or buffer.size < size:
            buffer = pool.aligned(size, dtype)
            self.buffers[key] = buffer
        return buffer[:size].reshape(shape)


_scratch = _Scratch()


@njit(**CALLEE)
def _input_projection(x2d, w_in, blocks, pre, rows, task):
    """Task ``task = 4 r + g`` of the input projection: ``pre[g][rows_r] = x2d[rows_r] @ w_in[:, gate g's block]``.

    BLAS reads the gate's columns in place (its row stride ``4H``): a copy
    of each gate's ``[I, H]`` block, as ``np.dot`` needed, moved all the
    input weights at every call of the ops (16 MB at ``I = H = 1024``).
    With ``H = 1`` the gate's column is a vector, which BLAS's vector
    products read contiguous: it is copied.
    """
    g = task % 4
    inputs, units = x2d.shape[1], pre[g].shape[1]
    r0, r1 = rows[task // 4], rows[task // 4 + 1]
    if inputs == 0:  # an empty sum
        fill_zero(flat(pre[g]), r0 * units, (r1 - r0) * units)
    if units == 1:  # a vector: BLAS's matrix-vector and dot products read it with a unit stride
        column = np.empty(inputs, w_in.dtype)
        for i in range(inputs):
            column[i] = w_in[i, blocks[g]]
        dot((r1 - r0, 1, inputs, inputs, 1, 1, 0, w_in.itemsize), address(x2d, r0 * inputs), address(column, 0),
            address(pre[g], r0))
    else:
        dot((r1 - r0, units, inputs, inputs, w_in.shape[1], units, 0, w_in.itemsize), address(x2d, r0 * inputs),
            address(w_in, blocks[g] * units), address(pre[g], r0 * units))


@njit(inline="always", **KERNEL)
def _add_to(dst, src):
    """``dst += src`` for two 1-D arrays of the same length."""
    for j in range(dst.shape[0]):
        dst[j] += src[j]


@njit(inline="always", **KERNEL)
def _input_part(t, k, col_off, x2d, w_x, work, batch, rows):
    """``x_t @ w_x`` for the columns of chunk ``k`` into its ``work`` (the fused input projection), rows ``0 ..
    rows - 1`` of the ``batch``."""
    inputs = x2d.shape[1]
    col0 = col_off[k]
    width = col_off[k + 1] - col0
    microkernel.gemm_panels(flat(x2d), t * batch * inputs, inputs, rows, w_x, inputs * col0, inputs,
                             width // microkernel.panel_width_of(w_x), work, batch * col0, width, np.bool_(False))


@njit(**CALLEE)
def _running(t, lengths, batch):
    """The rows step ``t`` computes: ``0 .. n - 1``, ``n`` one past the last example still running (``t <
    lengths[b]``; all ``batch`` without lengths).

    The rows after it have finished: they cost nothing from then on, forward
    and backward, and the rows computed keep their bits (the micro-kernel's
    sums do not depend on the number of rows). :class:`nblstm.LSTM` sorts
    the examples by length for its inference calls, so that every finished
    example is past ``n``.
    """
    if lengths.shape[0] == 0:
        return batch
    n = 0
    for b in range(batch):
        if lengths[b] > t:
            n = b + 1
    return n


@njit(inline="always")
def _zeroes_finished(lengths, slots, steps):
    """Whether the forward zeroes, not carries, the examples past their length: an inference call's outputs
    (``co`` ``slots < steps``: :func:`forward_packed`) with ``lengths`` longest first
    (:func:`outputs_zeroed` on the host).

    Nothing reads a finished example's gates or state there: each step
    computes the rows before the last example still running
    (:func:`_running`), which are then exactly the running ones, and
    :func:`forward_packed` takes a finished example's final state from its
    own last step and zeroes its outputs after it, which the caller receives
    (the layer's outputs past a length). Carried, a finished row's state cost
    as much as a computed row's gate maths: two threads copied each other's
    halves of the same rows.
    """
    if lengths.shape[0] == 0 or slots >= steps:
        return False
    for b in range(1, lengths.shape[0]):
        if lengths[b] > lengths[b - 1]:
            return False
    return True


@njit(**CALLEE)
def _carry_state(t, u0, u1, lengths, cs_prev, h_prev, outs, slots):
    """Step ``t`` of units ``u0 .. u1 - 1`` of the examples past their length (``t >= lengths[b]``): the state
    carried unchanged, the gates zero (their slots ``slots = (ti, tc, tp, to)`` of :func:`forward_worker`).

    An inference call with the examples longest first carries nothing
    (:func:`_zeroes_finished`).

    Run after the step's gate maths, which computes the rows before the last
    example still running (:func:`_running`) and is overwritten here for
    those that have finished: a function of its own, so that the forward's
    time loop compiles as without lengths (a test of the lengths in its row
    loop took the forward 1.03-1.05x the time). Each row's zeroes and copies
    are one ``memset`` or ``memmove`` on flat views (:func:`fill_zero`,
    :func:`copy_elements`): written as loops over arrays indexed by three
    indices, the carry of the finished rows took 0.6x the time of a step's
    computed rows (``(50, 32, 128, 128)``), and as loops over flat views,
    which LLVM vectorized, this function took 0.38 s of the ops' first call
    on an empty cache (it is compiled on its own and again inside the forward
    worker).
    """
    i_, cs_, f_, o_, ci_, co_, h_ = outs
    ti, tc, tp, to = slots
    batch, units = cs_prev.shape
    if _zeroes_finished(lengths, co_.shape[0], h_.shape[0]):
        return
    i_f, cs_f, f_f, o_f, ci_f, co_f, h_f = flat(i_), flat(cs_), flat(f_), flat(o_), flat(ci_), flat(co_), flat(h_)
    c0_f, h0_f = flat(cs_prev), flat(h_prev)
    uk = U(u1 - u0)
    for b in range(lengths.shape[0]):
        if t >= lengths[b]:
            gate, co, row = U((ti * batch + b) * units + u0), U((to * batch + b) * units + u0), U(b * units + u0)
            fill_zero(i_f, gate, uk)
            fill_zero(ci_f, gate, uk)
            fill_zero(f_f, gate, uk)
            fill_zero(o_f, gate, uk)
            fill_zero(co_f, co, uk)
            c_dst, h_dst = U((tc * batch + b) * units + u0), U((t * batch + b) * units + u0)
            if t == 0:
                copy_elements(cs_f, c_dst, c0_f, row, uk)
                copy_elements(h_f, h_dst, h0_f, row, uk)
            else:
                c_src, h_src = U((tp * batch + b) * units + u0), U(((t - 1) * batch + b) * units + u0)
                copy_elements(cs_f, c_dst, cs_f, c_src, uk)
                copy_elements(h_f, h_dst, h_f, h_src, uk)


def forward_kernel(inputs, weights, rows, parallel_projection, options, work, outs):
    """The forward pass of steps ``0 .. S - 1``, ``S = x2d.shape[0] // B``.

    ``weights.fused`` (:func:`~nblstm.cpu.partition.fused_projection`): each step computes its gates as
    ``x_t @ w_x + h_{t-1} @ w_rec`` on the micro-kernel, with no input
    projection before the loop, whose ``[S, B, 4H]`` result would go to
    memory and come back. Otherwise the input projection of all steps comes
    first, as BLAS GEMMs into ``i_, ci_, f_, o_`` (no ``[T, B, 4H]``
    workspace), and each step adds it to its recurrent product.

    Parameters
    ----------
    inputs : Inputs
        ``x2d [S * B, I]``, the inputs of the ``S = seq_len_max`` steps;
        ``cs_prev, h_prev [B, H]``, C-contiguous; ``lengths`` (empty, or
        example ``b`` runs steps ``0 .. lengths[b] - 1`` and carries its state
        through the others).
    weights : PackedForward
    rows : [R + 1] int64 array
    parallel_projection : bool
        Row blocks of the input projection (unless ``fused``) and whether
        its ``4 * R`` GEMMs run in parallel (:func:`row_blocks`).
    options : nblstm.options.KernelOptions
        ``forget_bias``, the clip and ``use_peepholes`` are read.
    work : [B * col_off[K]] array
        Workspace of the recurrent GEMMs.
    outs : tuple of 7 C-contiguous arrays
        Outputs ``i, cs, f, o, ci, co, h``, each ``[T, B, H]`` with ``T >= S``
        (written for the first ``S`` steps), or shorter where the caller
        keeps no more than a step's values: step ``t`` of an output of ``n``
        steps goes to its slot ``t % n``. ``h`` has every step; ``cs`` may
        have 2 (the previous step is read), ``co`` 1, and ``i, ci, f, o`` 1
        with ``fused`` (otherwise they hold the input projection of every
        step). An inference call keeps only ``h`` and the last ``cs``.
    """
    # The workers compile as serial code (nblstm.cpu.threads); one worker runs
    # on the calling thread alone.
    x2d, cs_prev = inputs.x2d, inputs.cs_prev
    num_chunks = len(weights.bounds) - 1
    steps = x2d.shape[0] // cs_prev.shape[0]
    tasks = 0 if weights.fused else 4 * (len(rows) - 1)
    batch, units = cs_prev.shape
    workers = num_chunks
    if parallel_projection and tasks:
        workers = max(workers, min(tasks, numba.get_num_threads()))
    workers = min(workers, call_threads(steps * batch * 4 * units * (x2d.shape[1] + units), workers))
    claims, done = sync.counters(steps + 1, max(num_chunks, tasks))
    worker = forward_worker if weights.fused else projected_forward_worker
    threads.run(worker, (claims, done, tuple(inputs), tuple(weights), rows, parallel_projection, tuple(options),
                         work, outs), workers)


@njit(inline="always")
def _chunk_gates(t, u0, u1, gk, running, blocks, bias, peepholes, unit, cs_prev, outs, slots):
    """The gate maths of step ``t`` for the units ``u0 .. u1 - 1`` of rows ``0 .. running - 1``, from ``gk [B,
    width]``, the chunk's products (the input projection's included), into the step's ``slots = (ti, tc, tp,
    to)`` of ``outs`` (:func:`forward_kernel`). Inlined into both forward workers."""
    i_, cs_, f_, o_, ci_, co_, h_ = outs
    wci, wcf, wco = peepholes
    ti, tc, tp, to = slots
    units = cs_prev.shape[1]
    uk = u1 - u0
    # Gate g of the chunk's units: columns blocks[g] * uk .. of the chunk's
    # GEMM result, and blocks[g] * H + u0 .. of the bias. Every array is
    # sliced to the chunk, so that the unit loop indexes from 0 (no
    # wraparound checks) and LLVM vectorizes it.
    bi = bias[blocks[0] * units + u0:blocks[0] * units + u1]
    bc = bias[blocks[1] * units + u0:blocks[1] * units + u1]
    bf = bias[blocks[2] * units + u0:blocks[2] * units + u1]
    bo = bias[blocks[3] * units + u0:blocks[3] * units + u1]
    pi, pf, po = wci[u0:u1], wcf[u0:u1], wco[u0:u1]
    for b in range(running):
        g = gk[b]
        gi = g[blocks[0] * uk:(blocks[0] + 1) * uk]
        gc = g[blocks[1] * uk:(blocks[1] + 1) * uk]
        gf = g[blocks[2] * uk:(blocks[2] + 1) * uk]
        go = g[blocks[3] * uk:(blocks[3] + 1) * uk]
        c_src = cs_prev[b, u0:u1] if t == 0 else cs_[tp, b, u0:u1]
        i_r, cs_r, f_r, o_r = i_[ti, b, u0:u1], cs_[tc, b, u0:u1], f_[ti, b, u0:u1], o_[ti, b, u0:u1]
        ci_r, co_r, h_r = ci_[ti, b, u0:u1], co_[to, b, u0:u1], h_[t, b, u0:u1]
        for jj in range(uk):
            i, ci, f, o, cs, co, h = forward_unit(
                gi[jj] + bi[jj], gc[jj] + bc[jj], gf[jj] + bf[jj], go[jj] + bo[jj], c_src[jj],
                (pi[jj], pf[jj], po[jj]), unit,
            )
            i_r[jj] = i
            ci_r[jj] = ci
            f_r[jj] = f
            o_r[jj] = o
            cs_r[jj] = cs
            co_r[jj] = co
            h_r[jj] = h


@njit(**KERNEL)
def forward_worker(w, claims, done, inputs, weights, rows, parallel_projection, options, work, outs):
    """Worker ``w``'s part of :func:`forward_kernel` with the fused projection (``weights.fused``): each step's
    gates are ``x_t @ w_x + h_{t-1} @ w_rec`` (``claims, done``: :func:`nblstm.cpu.sync.counters` of ``S + 1``
    stages, the first one unused).

    Worker ``w`` takes chunk ``w`` of each step, then any chunk still
    unclaimed, and waits for the whole step before the next
    (:mod:`nblstm.cpu.sync`). When it did its own chunk (whose workspace
    nobody else then uses), it claims that chunk of the next step before
    waiting, and computes its ``x_{t+1} @ w_x``, which does not need
    ``h_t``, while the other chunks finish. The other path is a worker of
    its own (:func:`projected_forward_worker`): a first call compiles only
    the one it takes (the ops' first forward and backward on an empty cache
    took 7.0 s with both in one worker, 6.3 s with this one alone here).
    """
    full_width()
    # The records taken apart once, before the time loop: a function taking
    # them would take them apart at every step (0.15 us a step).
    x2d, cs_prev, h_prev, lengths = inputs
    _, w_x, w_rec, bounds, col_off, blocks, _, bias, peepholes = weights
    i_, cs_, f_, o_, ci_, co_, h_ = outs
    unit = unit_options(KernelOptions(*options), cs_.dtype.type(1.0), np.int64(0))  # the fused ops: tanh, sigmoid
    batch, units = cs_prev.shape
    steps = x2d.shape[0] // batch
    stride = claims.shape[0] // (done.shape[0] - 1)
    num_chunks = bounds.shape[0] - 1
    if w >= num_chunks:
        return
    full = lengths.shape[0] == 0
    x_ready = np.bool_(False)  # this worker holds chunk w of step t, its x_t @ w_x done (not a literal: one type)
    for t in range(steps):
        running = _running(t, lengths, batch)  # rows from here on have finished: _carry_state writes them
        own_done = False
        for j in range(num_chunks):
            k = sync.claimed(claims, done, t + 1, w, num_chunks, x_ready, j)
            if k >= 0:
                # Step t of the units of chunk k: the GEMMs of the gates, then the gate maths.
                u0 = bounds[k]
                u1 = bounds[k + 1]
                col0 = col_off[k]
                width = col_off[k + 1] - col0
                h_src = h_prev if t == 0 else h_[t - 1]
                # The step's slot of each output: step t itself, or a slot of a
                # short array that an inference call reuses (forward_kernel).
                slots = (t % i_.shape[0], t % cs_.shape[0], (t - 1) % cs_.shape[0], t % co_.shape[0])
                if not (x_ready and k == w):
                    _input_part(t, k, col_off, x2d, w_x, work, batch, running)
                # Offsets and flags as int64 and bool values, never literals: each
                # literal would compile the micro-kernel again.
                microkernel.gemm_panels(flat(h_src), np.int64(0), units, running, w_rec, units * col0, units,
                                         width // microkernel.panel_width_of(w_rec), work, batch * col0, width,
                                         np.bool_(True))
                _chunk_gates(t, u0, u1, matrix(work, batch * col0, batch, width), running,
                             blocks, bias, peepholes, unit, cs_prev, outs, slots)
                if not full:  # past an example's length (a function of its own: see _carry_state)
                    _carry_state(t, u0, u1, lengths, cs_prev, h_prev, outs, slots)
                own_done = own_done or k == w
                sync.count_done(done, t + 1, num_chunks)
        x_ready = own_done and t + 1 < steps and sync.claim(claims, t + 2, w, stride)
        if x_ready:
            _input_part(t + 1, w, col_off, x2d, w_x, work, batch, _running(t + 1, lengths, batch))
        sync.wait_for(done, t + 1, num_chunks)


@njit(**KERNEL)
def projected_forward_worker(w, claims, done, inputs, weights, rows, parallel_projection, options, work, outs):
    """Worker ``w``'s part of :func:`forward_kernel` without the fused projection: stage 0 of ``claims, done``
    is the input projection of every step (BLAS GEMMs into ``i_, ci_, f_, o_``, on worker 0 alone when it is
    small), then each step adds it to its recurrent product. Workers past the last chunk only help with the
    projection; the steps as in :func:`forward_worker`.
    """
    full_width()
    x2d, cs_prev, h_prev, lengths = inputs
    w_in, _, w_rec, bounds, col_off, blocks, _, bias, peepholes = weights
    i_, cs_, f_, o_, ci_, co_, h_ = outs
    unit = unit_options(KernelOptions(*options), cs_.dtype.type(1.0), np.int64(0))  # the fused ops: tanh, sigmoid
    batch, units = cs_prev.shape
    steps = x2d.shape[0] // batch
    total = i_.shape[0] * batch
    pre = (matrix(flat(i_), 0, total, units), matrix(flat(ci_), 0, total, units), matrix(flat(f_), 0, total, units),
           matrix(flat(o_), 0, total, units))
    tasks = 4 * (rows.shape[0] - 1)
    if tasks:
        if parallel_projection or w == 0:
            for j in range(tasks):
                k = sync.claimed(claims, done, np.int64(0), w, tasks, np.bool_(False), j)
                if k >= 0:
                    _input_projection(x2d, w_in, blocks, pre, rows, k)
                    sync.count_done(done, np.int64(0), tasks)
        sync.wait_for(done, np.int64(0), tasks)
    num_chunks = bounds.shape[0] - 1
    if w >= num_chunks:
        return
    full = lengths.shape[0] == 0
    for t in range(steps):
        running = _running(t, lengths, batch)
        for j in range(num_chunks):
            k = sync.claimed(claims, done, t + 1, w, num_chunks, np.bool_(False), j)
            if k >= 0:
                u0 = bounds[k]
                u1 = bounds[k + 1]
                uk = u1 - u0
                col0 = col_off[k]
                width = col_off[k + 1] - col0
                gk = matrix(work, batch * col0, batch, width)
                h_src = h_prev if t == 0 else h_[t - 1]
                slots = (t % i_.shape[0], t % cs_.shape[0], (t - 1) % cs_.shape[0], t % co_.shape[0])
                ti = slots[0]
                microkernel.gemm_panels(flat(h_src), np.int64(0), units, running, w_rec, units * col0, units,
                                         width // microkernel.panel_width_of(w_rec), work, batch * col0, width,
                                         np.bool_(False))
                for b in range(running):  # add the input projection
                    g = gk[b]
                    _add_to(g[blocks[0] * uk:(blocks[0] + 1) * uk], i_[ti, b, u0:u1])
                    _add_to(g[blocks[1] * uk:(blocks[1] + 1) * uk], ci_[ti, b, u0:u1])
                    _add_to(g[blocks[2] * uk:(blocks[2] + 1) * uk], f_[ti, b, u0:u1])
                    _add_to(g[blocks[3] * uk:(blocks[3] + 1) * uk], o_[ti, b, u0:u1])
                _chunk_gates(t, u0, u1, gk, running, blocks, bias, peepholes, unit, cs_prev, outs, slots)
                if not full:
                    _carry_state(t, u0, u1, lengths, cs_prev, h_prev, outs, slots)
                sync.count_done(done, t + 1, num_chunks)
        sync.wait_for(done, t + 1, num_chunks)


@njit(**CALLEE)
def _carry_gradients(t, u0, u1, lengths, incoming, dc, work, w_off, width, carried):
    """Before step ``t``'s gradients of units ``u0 .. u1 - 1`` (:func:`backward_worker`), with lengths.

    The step's gradients then run on every row as without lengths: past an
    example's length its saved gates are zero, so its gate gradients come out
    zero (and its peephole terms) and its cell gradient zero, which
    :func:`_carried_gradients` replaces. Here, for those rows, the carried
    state's gradients: ``carried[0] = h_grad[t] + carried[0]`` (the gradient
    of ``h`` carried back) and ``carried[1] = cs_grad[t] + dc`` (the cell
    gradient that row keeps); and for an example's last step of its own
    (``t + 1 = lengths[b] < S``) the carried ``h`` gradient joins its
    recurrent one in ``work`` (rows of ``width`` from ``w_off``). Functions
    of their own, so that the time loop compiles as without lengths (a test
    of the lengths in its row loop took the backward 1.03-1.04x the time).
    """
    cs_grad, h_grad, _ = incoming
    steps = cs_grad.shape[0]
    for b in range(lengths.shape[0]):
        length = lengths[b]
        if t >= length:
            for jj in range(u1 - u0):
                carried[0, b, u0 + jj] = h_grad[t, b, u0 + jj] + carried[0, b, u0 + jj]
                carried[1, b, u0 + jj] = cs_grad[t, b, u0 + jj] + dc[b, u0 + jj]
        elif t + 1 == length and length < steps:
            row = w_off + b * width
            for jj in range(u1 - u0):
                work[row + jj] += carried[0, b, u0 + jj]


@njit(**CALLEE)
def _carried_gradients(t, u0, u1, lengths, dgates, blocks, dc, carried):
    """After step ``t``'s gradients of units ``u0 .. u1 - 1``: past an example's length its cell gradient is the
    one carried (:func:`_carry_gradients`) and its gate gradients zero (a positive zero, as written)."""
    batch, units = dc.shape
    dc_f, carried_f, dg_f = flat(dc), flat(carried), flat(dgates)
    uk = U(u1 - u0)
    for b in range(lengths.shape[0]):
        if t >= lengths[b]:
            copy_elements(dc_f, U(b * units + u0), carried_f, U((batch + b) * units + u0), uk)
            for g in range(4):
                fill_zero(dg_f, U((t * batch + b) * 4 * units + blocks[g] * units + u0), uk)


def backward_kernel(cs_prev, saved, incoming, weights, options, work, grads):
    """The time loop of the backward pass, steps ``S - 1 .. 0``.

    Parameters
    ----------
    cs_prev : [B, H] C-contiguous array
    saved : tuple of 6 [T, B, H] C-contiguous arrays
        Forward outputs ``i, cs, f, o, ci, co`` (trusted, not recomputed).
    incoming : tuple
        The incoming gradients ``cs_grad, h_grad [T, B, H]`` (C-contiguous;
        steps ``>= S`` are not read) and the forward's ``lengths [B]``
        (:class:`Inputs`).
    weights : PackedBackward
    options : nblstm.options.KernelOptions
        Only ``use_peepholes`` is read.
    work : [B * col_off[K]] array
        Workspace of ``dgates @ w_h^T``.
    grads : tuple
        Outputs ``(dgates, dc, peephole_grads, dh)``: ``dgates [S, B, 4H]``
        the gradients of the gate pre-activations, caller's layout (zero past
        an example's length); ``dc [B, H]``, zero on entry, the carried cell
        gradient, on exit ``cs_prev_grad``; ``peephole_grads`` the tuple of
        the ``[H]`` gradients of ``wci, wcf, wco``, zero on entry,
        accumulated; ``carried [2, B, H]`` (with lengths, else empty), zero
        on entry: ``carried[0]`` the gradient of ``h`` carried back through
        the steps past an example's length, on exit that of ``h_prev`` for
        the examples of length 0; ``carried[1]`` a workspace
        (:func:`_carry_gradients`).
    """
    num_chunks = len(weights.bounds) - 1
    steps, batch, gates = grads[0].shape
    claims, done = sync.counters(steps, num_chunks)
    workers = min(num_chunks, call_threads(steps * batch * gates * gates // 4, num_chunks))
    threads.run(backward_worker, (claims, done, cs_prev, saved, incoming, tuple(weights), tuple(options), work, grads),
                workers)


@njit(**KERNEL)
def backward_worker(w, claims, done, cs_prev, saved, incoming, weights, options, work, grads):
    """Worker ``w``'s part of :func:`backward_kernel`: the steps' chunks it claims (:mod:`nblstm.cpu.sync`)."""
    full_width()
    # The records taken apart once, before the time loop (see forward_worker).
    i_, cs_, f_, o_, ci_, co_ = saved
    cs_grad, h_grad, lengths = incoming
    w_rec_t, bounds, col_off, blocks, (wci, wcf, wco) = weights
    dgates, dc, (wci_grad, wcf_grad, wco_grad), carried = grads
    unit = unit_options(KernelOptions(*options), dgates.dtype.type(1.0), np.int64(0))
    batch, units = cs_prev.shape
    num_chunks = bounds.shape[0] - 1
    steps = dgates.shape[0]
    gates = 4 * units
    # Flat views and unsigned offsets, no slice in the time loop (see forward_worker).
    i_f, cs_f, f_f, o_f, ci_f, co_f = flat(i_), flat(cs_), flat(f_), flat(o_), flat(ci_), flat(co_)
    cg_f, hg_f, dg_f, dc_f, c0_f = flat(cs_grad), flat(h_grad), flat(dgates), flat(dc), flat(cs_prev)
    full = lengths.shape[0] == 0
    for t in range(steps - 1, -1, -1):
        running = _running(t, lengths, batch)  # the other rows' gradients are carried (_carry_gradients)
        for j in range(num_chunks):
            k = sync.claimed(claims, done, t, w, num_chunks, np.bool_(False), j)
            if k >= 0:
                # Step t (backwards) of the units of chunk k.
                u0, u1 = bounds[k], bounds[k + 1]
                uk = u1 - u0
                col0 = col_off[k]
                width = col_off[k + 1] - col0
                if t + 1 >= steps:
                    fill_zero(work, U(batch * col0), U(batch * width))
                else:  # dh = dgates[t + 1] @ w_rec[u0:u1]^T, on the packed transposes
                    microkernel.gemm_panels(dg_f, (t + 1) * batch * gates, gates, running, w_rec_t, gates * col0, gates,
                                             width // microkernel.panel_width_of(w_rec_t), work, batch * col0, width,
                                             np.bool_(False))
                p = U(u0)
                c_src = c0_f if t == 0 else cs_f
                if not full:  # past an example's length (functions of their own: see _carry_gradients)
                    _carry_gradients(t, u0, u1, lengths, incoming, dc, work, batch * col0, width, carried)
                for b in range(running):
                    dh = U(batch * col0 + b * width)
                    g = U((t * batch + b) * gates)
                    gi, gc = g + U(blocks[0] * units + u0), g + U(blocks[1] * units + u0)
                    gf, go = g + U(blocks[2] * units + u0), g + U(blocks[3] * units + u0)
                    r, rd = U((t * batch + b) * units + u0), U(b * units + u0)
                    rc = rd if t == 0 else U(((t - 1) * batch + b) * units + u0)
                    for jj in range(U(uk)):
                        di, dci, df, do, dc_prev = backward_unit(
                            hg_f[r + jj] + work[dh + jj], cg_f[r + jj] + dc_f[rd + jj], i_f[r + jj], ci_f[r + jj],
                            f_f[r + jj], o_f[r + jj], co_f[r + jj], c_src[rc + jj],
                            (wci[p + jj], wcf[p + jj], wco[p + jj]), unit,
                        )
                        dg_f[gi + jj] = di
                        dg_f[gc + jj] = dci
                        dg_f[gf + jj] = df
                        dg_f[go + jj] = do
                        dc_f[rd + jj] = dc_prev
                    if unit.use_peepholes:
                        # A loop of its own: fewer arrays per loop let LLVM vectorize both.
                        for jj in range(U(uk)):
                            wci_grad[p + jj] += dg_f[gi + jj] * c_src[rc + jj]
                            wcf_grad[p + jj] += dg_f[gf + jj] * c_src[rc + jj]
                            wco_grad[p + jj] += dg_f[go + jj] * cs_f[r + jj]
                if not full:
                    _carried_gradients(t, u0, u1, lengths, dgates, blocks, dc, carried)
                sync.count_done(done, t, num_chunks)
        sync.wait_for(done, t, num_chunks)


@njit(**CALLEE)
def weight_grads_block(k, x2d, h2d, h_prev, dg2d, w_in, splits, x_grad2d, w_grad, b_grad):
    """Thread ``k``'s share of the GEMMs after the backward loop.

    ``splits`` is ``(x_rows, w_rows, col_blocks)`` (:func:`weight_grads_kernel`):
    rows ``x_rows[k]..x_rows[k+1]-1`` of ``x_grad2d = dg2d @ w_in[:I].T``,
    rows ``w_rows[k]..w_rows[k+1]-1`` of ``w_grad`` (each a product over
    all steps: ``[x_t, h_{t-1}]^T @ dgates``, with ``h_prev`` before step 0)
    and columns ``col_blocks[k]..col_blocks[k+1]-1`` of ``b_grad``. ``w_in``
    is C-contiguous, its first ``I`` rows the input weights.
    """
    full_width()
    x_rows, w_rows, col_blocks = splits
    batch, depth = h_prev.shape
    inputs = x2d.shape[1]
    rows, gates = dg2d.shape
    size = dg2d.itemsize
    r0, r1 = x_rows[k], x_rows[k + 1]
    if gates == 0:  # an empty sum
        fill_zero(flat(x_grad2d), U(r0 * inputs), U((r1 - r0) * inputs))
    dot((r1 - r0, inputs, gates, gates, gates, inputs, 1, size), address(dg2d, r0 * gates), address(w_in, 0),
        address(x_grad2d, r0 * inputs))
    r0, r1 = w_rows[k], w_rows[k + 1]
    a0, a1 = min(r0, inputs), min(r1, inputs)  # rows of w[:I]
    gemm((a1 - a0, gates, rows, inputs, gates, gates, 1, 0, 0, size), address(x2d, a0), address(dg2d, 0),
         address(w_grad, a0 * gates))
    b0, b1 = max(r0, inputs) - inputs, max(r1, inputs) - inputs  # rows of w[I:]
    # Step 0's previous output is h_prev; step t's is h2d[t - 1].
    gemm((b1 - b0, gates, batch, depth, gates, gates, 1, 0, 0, size), address(h_prev, b0), address(dg2d, 0),
         address(w_grad, (inputs + b0) * gates))
    gemm((b1 - b0, gates, rows - batch, depth, gates, gates, 1, 0, 1, size), address(h2d, b0),
         address(dg2d, batch * gates), address(w_grad, (inputs + b0) * gates))
    n0, n1 = col_blocks[k], col_blocks[k + 1]
    fill_zero(b_grad, U(n0), U(n1 - n0))
    bk = b_grad[n0:n1]  # sliced, so that the loop indexes from 0 and vectorizes
    for row in range(rows):
        dr = dg2d[row, n0:n1]
        for c in range(n1 - n0):
            bk[c] += dr[c]


def weight_grads_kernel(x2d, h2d, h_prev, dg2d, w, splits, x_grad2d, w_grad, b_grad, h_prev_grad):
    """The GEMMs after the backward loop, split across threads: ``x_grad`` by rows of
    ``dg2d``, ``w_grad`` by its own rows, ``b_grad`` by columns (no partial sums).

    Parameters
    ----------
    x2d : [S * B, I] C-contiguous array
        Inputs of the ``S`` steps.
    h2d : [T * B, H] C-contiguous array
        Forward output ``h``; row ``r - B`` is the previous output of row ``r``.
    h_prev : [B, H] C-contiguous array
    dg2d : [S * B, 4H] C-contiguous array
        Gate gradients of all steps.
    w : [I + H, 4H] C-contiguous array
        The weights.
    splits : tuple of 3 [K + 1] int64 arrays
        ``(x_rows, w_rows, col_blocks)``: row blocks over ``0 .. S * B``
        (of ``x_grad2d``), row blocks over ``0 .. I + H`` (of ``w_grad``),
        column blocks over ``0 .. 4H`` (of ``b_grad``).
    x_grad2d : [S * B, I] array
        Output ``dg2d @ w[:I].T``.
    w_grad : [I + H, 4H] array
        Output ``[x_t, h_{t-1}]^T @ dgates`` summed over steps.
    b_grad : [4H] array
        Output: column sums of ``dg2d``.
    h_prev_grad : [B, H] array
        Output: ``dg2d[:B] @ w[I:].T``, the gradient of the initial output.
    """
    rows, gates = dg2d.shape
    threads.run(weight_grads_worker, (x2d, h2d, h_prev, dg2d, w, splits, x_grad2d, w_grad, b_grad, h_prev_grad),
                len(splits[0]) - 1,
                call_threads(rows * gates * (2 * x2d.shape[1] + h2d.shape[1])))


@njit(**KERNEL)
def weight_grads_worker(k, x2d, h2d, h_prev, dg2d, w, splits, x_grad2d, w_grad, b_grad, h_prev_grad):
    """Block ``k`` of :func:`weight_grads_kernel` (:func:`weight_grads_block`); block 0 also ``h_prev_grad``."""
    weight_grads_block(k, x2d, h2d, h_prev, dg2d, w, splits, x_grad2d, w_grad, b_grad)
    if k == 0:  # dg2d[:B] @ w[I:].T
        batch, units = h_prev_grad.shape
        gates, inputs = dg2d.shape[1], x2d.shape[1]
        dot((batch, units, gates, gates, gates, units, 1, dg2d.itemsize), address(dg2d, 0),
            address(w, inputs * gates), address(h_prev_grad, 0))


class ForwardWeights:
    """The weights of the fused forward packed for one batch size: what :func:`forward_packed` reads.

    The fused ops pack them at every call (their weights are arguments);
    :class:`nblstm.LSTMCell` keeps them until its weights change, as it
    keeps :class:`nblstm.cpu.cell.PackedWeights`.

    Parameters
    ----------
    w : [I + H, 4H] array
        Gate columns in ``layout``, float32 or float64.
    batch : int
    layout : {"ifco", "icfo"}
    """

    def __init__(self, w, batch, layout):
        dtype = w.dtype
        units = w.shape[1] // 4
        self.inputs = inputs = w.shape[0] - units
        self.units, self.dtype = units, dtype
        self.bounds = chunk_bounds(batch, units)
        self.blocks = gate_blocks(layout)
        self.col_off = column_offsets(self.bounds, 4, dtype)
        self.fused = fused_projection(batch, inputs, units, dtype)
        w = np.ascontiguousarray(w)
        with kernel_section():
            # Kept, not copied: the ops read the caller's weights during their call, the cell its own.
            self.w_in = np.empty((0, 0), dtype) if self.fused else w[:inputs]
            self.w_rec = pack_recurrent(w[inputs:], self.bounds, self.col_off)
            self.w_x = pack_recurrent(w[:inputs], self.bounds, self.col_off) if self.fused else np.empty(0, dtype)

    def record(self, bias, peepholes):
        """The kernels' record (:class:`PackedForward`) with ``bias [4H]`` and ``peepholes (wci, wcf, wco)``."""
        c = np.ascontiguousarray
        wci, wcf, wco = peepholes
        return PackedForward(self.w_in, self.w_x, self.w_rec, self.bounds, self.col_off, self.blocks, self.fused,
                             c(bias), (c(wci), c(wcf), c(wco)))


def forward(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, options):
    """Whole-sequence forward on validated float32/float64 NumPy arrays.

    Parameters
    ----------
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
        Gate columns in ``options.layout``.
    b : [4H] array
    wci, wcf, wco : [H] arrays
    seq_len_max : int
        ``0 <= seq_len_max <= T``.
    options : nblstm.options.OpOptions

    Returns
    -------
    numpy.ndarray
        ``[7, T, B, H]``: ``i, cs, f, o, ci, co, h``, zero past ``seq_len_max``.
    """
    weights = ForwardWeights(w, max(x.shape[1], 1), options.layout)
    return forward_packed(x, cs_prev, h_prev, weights, b, (wci, wcf, wco), seq_len_max,
                          options.kernel_options(x.dtype.type))


def forward_packed(x, cs_prev, h_prev, weights, b, peepholes, seq_len_max, options, save=True, lengths=None):
    """:func:`forward` on packed weights (:class:`ForwardWeights` for ``B`` rows).

    Also :class:`nblstm.LSTMCell`'s forward where its options are the fused
    ops' (:func:`nblstm.cpu.cell.sequence_forward`). ``peepholes`` is
    ``(wci, wcf, wco)``, ``options`` the kernels' record
    (:class:`nblstm.options.KernelOptions`). ``lengths [B]`` (int64, the
    cell's): example ``b`` runs its first ``lengths[b]`` steps and carries
    its state through the others, whose gates ``i, f, o, ci`` and ``co``
    are zero, ``cs`` and ``h`` the carried state (default: every step).

    Returns
    -------
    numpy.ndarray or tuple
        ``[7, T, B, H]``: ``i, cs, f, o, ci, co, h``, zero past
        ``seq_len_max``. With ``save=False`` (inference, ``seq_len_max = T >
        0``, ``B > 0``) only what a caller of the cell receives: ``(h [T, B,
        H], cs [B, H], h_last [B, H])``, the outputs and the final state, the
        other values in a step's scratch (:func:`forward_kernel`). With
        ``lengths`` longest first, the outputs past an example's length are
        zero there, and the final state is the example's last step's
        (:func:`_zeroes_finished`).
    """
    steps, batch, inputs = x.shape
    units = cs_prev.shape[1]
    dtype = x.dtype
    if not save:
        # One allocation: h, the two slots of cs, co's slot, and the gates' (every step's without the fused
        # projection: they hold the input projection).
        n = 1 if weights.fused else steps
        buf = pool.empty((steps + 3 + 4 * n, batch, units), dtype)
        h, ring, co = buf[:steps], buf[steps:steps + 2], buf[steps + 2:steps + 3]
        i_, f_, o_, ci_ = (buf[steps + 3 + g * n:steps + 3 + (g + 1) * n] for g in range(4))
        _forward_steps(x, cs_prev, h_prev, weights, b, peepholes, steps, options, (i_, ring, f_, o_, ci_, co, h),
                       lengths)
        if not outputs_zeroed(lengths, steps):
            return h, ring[(steps - 1) % 2], h[-1]
        # Nothing of a finished example was carried: its final state is that of its last step, its outputs after
        # it are zero.
        ran = _lengths(lengths, steps)
        last = ran - 1
        rows = np.arange(batch)
        began = (last >= 0)[:, None]
        c_last = np.where(began, ring[np.maximum(last, 0) % 2, rows], cs_prev)
        h_last = np.where(began, h[np.maximum(last, 0), rows], h_prev)
        for b in range(batch):
            h[ran[b]:, b] = 0
        return h, c_last, h_last
    # One allocation for the seven outputs: at 4 MiB and more NumPy asks for
    # transparent huge pages, and glibc raises its trim threshold to the
    # largest block it has freed, so a training loop neither faults the
    # outputs' pages in 4 KiB at a time nor returns them to the kernel after
    # every call. The kernel writes every step below seq_len_max.
    block = pool.empty((7, steps, batch, units), dtype)
    block[:, seq_len_max:] = 0
    if seq_len_max == 0 or batch == 0:
        return block
    _forward_steps(x, cs_prev, h_prev, weights, b, peepholes, seq_len_max, options, tuple(block), lengths)
    return block


#: The kernels' lengths where every example has every step.
_WHOLE = np.empty(0, np.int64)


def _lengths(lengths, steps):
    """The kernels' ``lengths``: :data:`_WHOLE` where every example has all ``steps`` (no check in the loop)."""
    if lengths is None or lengths.size == 0 or int(lengths.min()) >= steps:
        return _WHOLE
    return np.ascontiguousarray(lengths, np.int64)


def outputs_zeroed(lengths, steps):
    """Whether an inference call of :func:`forward_packed` (``save=False``) zeroes the outputs past each
    example's length: :func:`_zeroes_finished` of its kernels, which it mirrors."""
    ran = _lengths(lengths, steps)
    return bool(ran.size and steps > 1 and by_length(ran) is None)


def _forward_steps(x, cs_prev, h_prev, weights, b, peepholes, seq_len_max, options, outs, lengths):
    """:func:`forward_kernel` on the first ``seq_len_max > 0`` steps of ``x``, ``B > 0`` rows, into ``outs``."""
    batch, inputs = x.shape[1:]
    units = cs_prev.shape[1]
    rows = seq_len_max * batch
    x2d = np.ascontiguousarray(x[:seq_len_max].reshape(rows, inputs))
    work = pool.aligned(batch * int(weights.col_off[-1]), x.dtype)
    c = np.ascontiguousarray
    projection = (split(rows, 1), False) if weights.fused else row_blocks(rows, inputs * 4 * units)
    with kernel_section():
        forward_kernel(Inputs(x2d, c(cs_prev), c(h_prev), _lengths(lengths, seq_len_max)),
                       weights.record(b, peepholes), *projection, options, work, outs)


class BackwardWeights:
    """The backward's recurrent weights ``w_rec^T`` packed by chunks of units for ``B`` rows (:func:`pack_chunks`).

    Packed at every call of the fused ops; kept by :class:`nblstm.LSTMCell`
    until its weights change.

    Parameters
    ----------
    w_rec : [H, 4H] array
        Recurrent weights (the last ``H`` rows of ``w``).
    batch : int
    carried : bool, default True
        ``False`` for one step, which carries nothing: no packing.
    """

    def __init__(self, w_rec, batch, carried=True):
        units = w_rec.shape[0]
        dtype = w_rec.dtype
        self.bounds = chunk_bounds(batch, units)
        self.col_off = column_offsets(self.bounds, 1, dtype)
        self.w_rec_t = pool.aligned(4 * units * int(self.col_off[-1]) if carried else 0, dtype)
        if carried:
            with kernel_section():
                pack_chunks(np.ascontiguousarray(w_rec), self.bounds, self.col_off, self.w_rec_t, True,
                            w_rec.size >= MIN_PARALLEL_PACK)

    def record(self, layout, peepholes):
        """The kernels' record (:class:`PackedBackward`) for the gate ``layout`` and ``peepholes (wci, wcf, wco)``."""
        c = np.ascontiguousarray
        wci, wcf, wco = peepholes
        return PackedBackward(self.w_rec_t, self.bounds, self.col_off, gate_blocks(layout), (c(wci), c(wcf), c(wco)))


def backward_recurrent(cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, w_rec, use_peephole, layout,
                       dgates=None, packed_t=None, lengths=None, carried=None):
    """The time loop of the backward pass: gate gradients and the cell carry.

    Callers run it inside :class:`~nblstm.cpu.blas.kernel_section`.

    Parameters
    ----------
    cs_prev : [B, H] array
    wci, wcf, wco : [H] arrays
    outputs : sequence of 6 or 7 [T, B, H] arrays
        Forward outputs ``i, cs, f, o, ci, co[, h]``.
    cs_grad, h_grad : [T, B, H] arrays
    seq_len_max : int
        ``1 <= seq_len_max <= T``.
    w_rec : [H, 4H] array
        Recurrent weights (the last H rows of ``w``), caller's layout.
    use_peephole : bool
    layout : {"ifco", "icfo"}
    dgates : [S, B, 4H] C-contiguous array, optional
        Where to write the gate gradients (a new array by default).
    packed_t : BackwardWeights, optional
        ``w_rec`` packed for ``B`` rows (packed here by default).
    lengths : [B] int64 array, optional
        The forward's (:func:`forward_packed`), with ``carried``: a zero
        ``[2, B, H]`` array whose first row gets the gradient of ``h_prev``
        carried past the steps of the examples of length 0
        (:func:`backward_kernel`).

    Returns
    -------
    tuple
        ``(dgates [S, B, 4H] in the caller's layout, cs_prev_grad [B, H],
        wci_grad [H], wcf_grad [H], wco_grad [H])``.
    """
    batch, units = cs_prev.shape
    dtype = cs_prev.dtype
    dc = np.zeros((batch, units), dtype)
    peephole_grads = [np.zeros(units, dtype) for _ in range(3)]
    if packed_t is None:
        packed_t = BackwardWeights(w_rec, batch, carried=seq_len_max > 1)  # a step carries dh from the next one
    if dgates is None:
        dgates = pool.aligned((seq_len_max, batch, 4 * units), dtype)
    work = pool.aligned(batch * int(packed_t.col_off[-1]), dtype)
    c = np.ascontiguousarray
    options = OpOptions(use_peephole=bool(use_peephole)).kernel_options(dtype.type)
    lengths = _lengths(lengths, seq_len_max)
    if not lengths.size:
        carried = np.empty((0, 0, 0), dtype)
    backward_kernel(c(cs_prev), tuple(c(a) for a in outputs[:6]), (c(cs_grad), c(h_grad), lengths),
                    packed_t.record(layout, (wci, wcf, wco)), options, work,
                    (dgates, dc, tuple(peephole_grads), carried))
    return (dgates, dc, *peephole_grads)


def backward(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, options, packed_t=None,
             lengths=None):
    """Whole-sequence backward on validated float32/float64 NumPy arrays.

    Parameters
    ----------
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    wci, wcf, wco : [H] arrays
    outputs : sequence of 7 [T, B, H] arrays
        Forward outputs ``i, cs, f, o, ci, co, h``.
    cs_grad, h_grad : [T, B, H] arrays
    seq_len_max : int
    options : nblstm.options.OpOptions
        ``use_peephole`` and ``layout`` are read.
    packed_t : BackwardWeights, optional
        ``w[I:]`` packed for ``B`` rows (:func:`backward_recurrent`).
    lengths : [B] int64 array, optional
        The forward's (:func:`forward_packed`); the gradients of the steps
        past an example's length are those of the carried state, and
        ``cs_grad, h_grad`` there reach the last step of its own.

    Returns
    -------
    tuple
        ``(x_grad [T, B, I], cs_prev_grad [B, H], h_prev_grad [B, H],
        w_grad [I + H, 4H], wci_grad [H], wcf_grad [H], wco_grad [H], b_grad [4H])``.
    """
    steps, batch, inputs = x.shape
    units = cs_prev.shape[1]
    dtype = x.dtype
    x_grad = pool.empty((steps, batch, inputs), dtype)  # pool.MIN_BYTES: no faults on a helper thread
    x_grad[seq_len_max:] = 0  # the GEMMs after the loop write the steps below seq_len_max
    if seq_len_max == 0 or batch == 0:
        zeros = [np.zeros(units, dtype) for _ in range(3)]
        return (x_grad, np.zeros((batch, units), dtype), np.zeros((batch, units), dtype), np.zeros(w.shape, dtype),
                *zeros, np.zeros(4 * units, dtype))
    rows = seq_len_max * batch
    x_rows = row_bounds(rows, (2 * inputs + units) * 4 * units)
    num_blocks = x_rows.shape[0] - 1
    w_rows, col_blocks = block_bounds(inputs + units, num_blocks), block_bounds(4 * units, num_blocks)
    x_grad2d = x_grad.reshape(steps * batch, inputs)[:rows]
    w_grad = pool.empty(w.shape, dtype)
    b_grad = np.empty(4 * units, dtype)
    h_prev_grad = np.empty((batch, units), dtype)
    c = np.ascontiguousarray
    w = c(w)
    h2d = c(outputs[6]).reshape(steps * batch, units)
    lengths = _lengths(lengths, seq_len_max)
    carried = np.zeros((2, batch, units), dtype) if lengths.size else None
    with kernel_section():
        dg, dc, wci_grad, wcf_grad, wco_grad = backward_recurrent(
            cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, w[inputs:], options.use_peephole,
            options.layout, _scratch.get("dgates", (seq_len_max, batch, 4 * units), dtype), packed_t, lengths,
            carried)
        weight_grads_kernel(c(x[:seq_len_max].reshape(rows, inputs)), h2d, c(h_prev), dg.reshape(rows, 4 * units),
                            w, (x_rows, w_rows, col_blocks), x_grad2d, w_grad, b_grad, h_prev_grad)
    if lengths.size:  # an example of length 0 carries h_prev to the end (its gate gradients are zero)
        empty = lengths == 0
        h_prev_grad[empty] += carried[0][empty]
    return (x_grad, dc, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)
