"""CUDA kernels of the TF1 ``LSTMCell`` over whole sequences (SPEC.md section 6).

The GPU counterpart of :mod:`nblstm.cpu_cell`, with the same semantics:
peepholes, ``cell_clip`` and ``proj_clip`` with the true ``clip_by_value``
gradient (zero where clipped; a bound of 0 clips to 0), a projection
``m = clip(r @ projection)`` of ``r = o * act(c)``, any activation code of
:data:`nblstm.spec.ACTIVATIONS`, ``forget_bias``, and per-example lengths
with ``dynamic_rnn`` semantics (past its length an example's outputs are
zero and its state is carried unchanged). :class:`nblstm.LSTMCell` calls it
for GPU arrays; importing it compiles nothing and needs no driver.

It is built from the pieces of :mod:`nblstm.cuda` (the fused ops): its tiled
GEMM, the step tiles' slices of the recurrent GEMMs (``gate_dots``,
``row_dot``), the launcher with its scratch arena, streams and devices, and
the per-step launches with arguments converted once. The gate maths is
:func:`nblstm.spec.cell_forward_unit` and
:func:`nblstm.spec.cell_backward_unit`, the very functions the CPU kernels
run.

- Forward: one GEMM computes the input projection of all steps plus the
  bias into the gates array ``[S, B, 4H]``. Each step is one launch of a
  fused kernel: a block owns ``_SB`` batch rows by ``_SJ`` units, computes
  their four gate columns of ``m_{t-1} @ kernel[I:]`` and runs the gate
  maths, overwriting the step's projections with the gates. With a
  projection a second launch per step computes ``m`` (it needs every
  unit's ``r``).
- Backward: per step, one launch computes the gradient of ``m`` carried from
  step ``t + 1`` (``dgates[t + 1] @ kernel[I:]^T``) and of the projection
  before its clip, and one the gradient of ``r`` (``@ projection^T``) and
  the gate maths. Without a projection one launch does both: unit ``j``'s
  output is column ``j`` of ``m``, so a thread owns both. The input and
  weight gradients are GEMMs after the loop, the bias and peephole
  gradients column reductions.
- Only ``S = max(lengths)`` steps run: after the longest example every
  state is only carried.
- The weights are uploaded once (:class:`DeviceWeights`, one host-to-device
  copy) and kept by the cell until they change.
- float16 arrays are computed in float32 and the results cast back, as in
  :mod:`nblstm.cuda`.

Results (outputs, states and their gradients, the input gradient) are Numba
device arrays of the inputs' dtype, whatever kind of GPU array was given;
the weight gradients come back as NumPy arrays of the compute dtype (one
device-to-host copy), like the cell's weights. Every kernel is
deterministic: no atomics, each output element written by one thread,
reductions in a fixed order.
"""

import functools

import numpy as np
from numba import cuda, types

from . import cuda as _cu
from . import spec

#: Names of the weights, as :meth:`nblstm.LSTMCell.get_weights` keys them.
_PEEPHOLE_NAMES = ("w_i_diag", "w_f_diag", "w_o_diag")


# ---------------------------------------------------------------------------
# Kernels without shared memory: generic, specialised lazily on their argument types.


@cuda.jit
def _masked_outputs(lengths, m_, out, zero):
    """``out[t, b] = m_[t, b]`` for ``t < lengths[b]``, zero elsewhere.

    Parameters
    ----------
    lengths : [B] int64 array
    m_ : [S, B, P] array
        Output state of the steps computed (``S = max(lengths)``).
    out : [T, B, P] array
    zero : scalar of the dtype of ``out``
    """
    steps, batch, depth = out.shape
    per_step = batch * depth
    for k in range(cuda.grid(1), steps * per_step, cuda.gridsize(1)):
        t = k // per_step
        rest = k % per_step
        b = rest // depth
        p = rest % depth
        if t < lengths[b]:
            out[t, b, p] = m_[t, b, p]
        else:
            out[t, b, p] = zero


@cuda.jit
def _write_state(c, m, out, c_offset, c_row, m_offset, m_row):
    """Copy a state into a flat results array: ``c[b, j]`` to ``out[c_offset + b c_row + j]``, ``m`` likewise.

    Two regions for a state tuple (``c_row = H``, ``m_row = P``); one
    ``[B, H + P]`` array for a joined state (``c_row = m_row = H + P``,
    ``m_offset = c_offset + H``).

    Parameters
    ----------
    c : [B, H] array
    m : [B, P] array
    out : [N] array
    c_offset, c_row, m_offset, m_row : int
    """
    batch, units = c.shape
    width = units + m.shape[1]
    for k in range(cuda.grid(1), batch * width, cuda.gridsize(1)):
        b = k // width
        u = k % width
        if u < units:
            out[c_offset + b * c_row + u] = c[b, u]
        else:
            out[m_offset + b * m_row + u - units] = m[b, u - units]


# ---------------------------------------------------------------------------
# Step kernels: they call the shared-memory device functions of
# nblstm.cuda._kernels, which exist per compute dtype, so they are built per
# dtype too (lazily: nothing compiles until the first launch).


@functools.cache
def _cell_kernels(dtype):
    """The cell's step kernels for one compute dtype (float32 or float64).

    Every step kernel runs on a grid of ``(ceil(N / SJ), ceil(B / SB))``
    blocks of ``(SJ, SB)`` threads, ``N`` the width it computes (``H`` units
    or ``P`` output columns); thread ``(tx, ty)`` of block ``(jt, bt)`` owns
    column ``jt * SJ + tx`` of batch row ``bt * SB + ty``. Every thread
    reaches the device functions that synchronise the block.

    Returns
    -------
    types.SimpleNamespace
        ``forward_step``, ``project_step``, ``backward_m_step``, ``backward_units_step``.
    """
    import types as pytypes

    k = _cu._kernels(dtype)
    gate_dots, row_dot, next_step_dot = k.gate_dots, k.row_dot, k.next_step_dot
    sj_, sb_ = _cu._SJ, _cu._SB

    @cuda.jit(device=True)
    def thread_tile():
        """``(column tile, batch tile, column, batch row)`` of this thread in a step kernel's grid."""
        ct = cuda.blockIdx.x
        bt = cuda.blockIdx.y
        return ct, bt, ct * sj_ + cuda.threadIdx.x, bt * sb_ + cuda.threadIdx.y

    @cuda.jit
    def forward_step(t, gates, c0, m0, w_rec, lengths, w_i, w_f, w_o, one, forget_bias, cell_clip, clip_on, act,
                     use_peepholes, has_proj, cells, ms):
        """Forward step ``t`` of every unit (before the projection).

        Parameters
        ----------
        t : int
        gates : [S, B, 4H] array
            On entry ``x @ kernel[:I] + bias`` (ICFO); step ``t`` becomes
            the gates ``i, j, f, o`` after their nonlinearities (zero past
            an example's length).
        c0 : [B, H] array
        m0 : [B, P] array
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
            projection ``r`` is ``m``, carried too.
        ms : [2, S, B, P] array
            ``m_raw, m``; ``m[t - 1]`` is read. Without a projection this is
            ``cells[2:4]`` (``m`` is ``r``).
        """
        batch, units = c0.shape
        jt, bt, j, b = thread_tile()
        zero = one - one
        a_i, a_j, a_f, a_o = gate_dots(t, jt, bt, m0, ms[1], w_rec, 0, 1, 2, 3, zero)
        if b < batch and j < units:
            c_prev = c0[b, j] if t == 0 else cells[1, t - 1, b, j]
            if t < lengths[b]:
                i, g, f, o, c_raw, c, ac, r = spec.cell_forward_unit(
                    a_i + gates[t, b, j], a_j + gates[t, b, units + j], a_f + gates[t, b, 2 * units + j],
                    a_o + gates[t, b, 3 * units + j], c_prev, w_i[j], w_f[j], w_o[j], forget_bias, cell_clip,
                    clip_on, act, use_peepholes, one,
                )
                gates[t, b, j] = i
                gates[t, b, units + j] = g
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
                    cells[3, t, b, j] = m0[b, j] if t == 0 else ms[1, t - 1, b, j]

    @cuda.jit
    def project_step(t, cells, m0, w_proj, lengths, one, proj_clip, proj_clip_on, ms):
        """Projection of step ``t``: ``m = clip(r @ projection)``, carried past an example's length.

        Parameters
        ----------
        t : int
        cells : [4, S, B, H] array
            ``r[t]`` (``cells[3, t]``) is read.
        m0 : [B, P] array
        w_proj : [H, P] array
        lengths : [B] int64 array
        one, proj_clip : scalars of the compute dtype
        proj_clip_on : bool
        ms : [2, S, B, P] array
            Output ``m_raw[t]`` (zero past the length) and ``m[t]``.
        """
        batch, depth = m0.shape
        pt, bt, p, b = thread_tile()
        zero = one - one
        acc = row_dot(cells[3, t], w_proj, False, pt, bt, zero)
        if b < batch and p < depth:
            if t < lengths[b]:
                ms[0, t, b, p] = acc
                ms[1, t, b, p] = spec.clip_value(acc, proj_clip, proj_clip_on)
            else:
                ms[0, t, b, p] = zero
                ms[1, t, b, p] = m0[b, p] if t == 0 else ms[1, t - 1, b, p]

    @cuda.jit
    def backward_m_step(t, steps, dgates, w_rec, lengths, d_out, ms, one, proj_clip, proj_clip_on, dm, dm_raw):
        """Backward step ``t`` of the output state ``m`` (with a projection), or the final carry (``t = -1``).

        Rows active at ``t + 1`` take the gradient of ``m[t]`` from that
        step's gate gradients; the others carried ``m``, so ``dm`` is kept.
        Rows active at ``t`` then get the gradient of the projection before
        its clip, ``dm_raw[t] = (dm + d_out[t]) clip'(m_raw[t])``; zero
        elsewhere. ``t = -1`` only finishes the carry: ``dm`` becomes the
        gradient of ``m0``, for a cell with or without a projection.

        Parameters
        ----------
        t, steps : int
            ``-1 <= t < steps = S``.
        dgates : [S, B, 4H] array
            Gate gradients; step ``t + 1`` is read.
        w_rec : [P, 4H] array
        lengths : [B] int64 array
        d_out : [T, B, P] array
        ms : [2, S, B, P] array
            ``m_raw`` is read.
        one, proj_clip : scalars of the compute dtype
        proj_clip_on : bool
        dm : [B, P] array
            The carried gradient of ``m``, updated in place.
        dm_raw : [S, B, P] array
            Output for step ``t``.
        """
        batch, depth = dm.shape
        pt, bt, p, b = thread_tile()
        zero = one - one
        acc = next_step_dot(t, steps, dgates, w_rec, pt, bt, zero)
        if b < batch and p < depth:
            if t + 1 < lengths[b]:
                dm[b, p] = acc
            if t >= 0:
                if t < lengths[b]:
                    dm_raw[t, b, p] = (dm[b, p] + d_out[t, b, p]) * spec.clip_value_grad(
                        ms[0, t, b, p], proj_clip, proj_clip_on, one)
                else:
                    dm_raw[t, b, p] = zero

    @cuda.jit
    def backward_units_step(t, steps, c0, gates, cells, dm_raw, w_rec, w_proj, lengths, d_out, w_i, w_f, w_o, one,
                            cell_clip, clip_on, act, use_peepholes, has_proj, dgates, dc, dm):
        """Backward step ``t`` of every unit: the gradient of ``r``, then the gate maths.

        With a projection ``dr = dm_raw[t] @ projection^T``. Without one,
        ``r`` is ``m``: this thread also carries ``dm`` of its column as
        :func:`backward_m_step` does, and ``dr = dm + d_out[t]``.

        Parameters
        ----------
        t, steps : int
            ``0 <= t < steps = S``.
        c0 : [B, H] array
        gates : [S, B, 4H] array
            The forward gates (:func:`forward_step`).
        cells : [4, S, B, H] array
            ``c_raw, c, ac, r`` of the forward pass.
        dm_raw : [S, B, P] array
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
        dm : [B, P] array
            The carried gradient of ``m``, updated in place without a projection.
        """
        batch, units = c0.shape
        jt, bt, j, b = thread_tile()
        zero = one - one
        # row_dot called directly in both branches, not next_step_dot: a kernel
        # that reaches row_dot both directly and through next_step_dot declares
        # its shared arrays twice, and NVVM rejects the IR.
        dr = zero
        if has_proj:
            dr = row_dot(dm_raw[t], w_proj, True, jt, bt, zero)
        elif t + 1 < steps:
            dr = row_dot(dgates[t + 1], w_rec, True, jt, bt, zero)
        if b < batch and j < units:
            if not has_proj:
                if t + 1 < lengths[b]:
                    dm[b, j] = dr
                dr = dm[b, j] + d_out[t, b, j]
            if t < lengths[b]:
                c_prev = c0[b, j] if t == 0 else cells[1, t - 1, b, j]
                di, dj, df, do, dc_prev = spec.cell_backward_unit(
                    dr, dc[b, j], gates[t, b, j], gates[t, b, units + j], gates[t, b, 2 * units + j],
                    gates[t, b, 3 * units + j], cells[0, t, b, j], cells[2, t, b, j], c_prev, w_i[j], w_f[j],
                    w_o[j], cell_clip, clip_on, act, use_peepholes, one,
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

    return pytypes.SimpleNamespace(forward_step=forward_step, project_step=project_step,
                                   backward_m_step=backward_m_step, backward_units_step=backward_units_step)


# ---------------------------------------------------------------------------
# Host side


class DeviceWeights:
    """A cell's weights on one GPU in one compute dtype, uploaded in one host-to-device copy.

    :class:`nblstm.LSTMCell` keeps them (per compute dtype and GPU) until
    its weights change, so repeated calls upload nothing.

    Parameters
    ----------
    weights : dict
        Host arrays keyed like :meth:`nblstm.LSTMCell.get_weights`:
        ``kernel [I + P, 4H]`` (ICFO), ``bias [4H]``, optional
        ``w_i_diag, w_f_diag, w_o_diag [H]`` and ``projection/kernel [H, P]``.
    dtype : numpy.dtype
        Compute dtype (float32 or float64).
    stream : Numba stream or 0
        Stream of the copy.

    Attributes
    ----------
    kernel : [I + P, 4H] device array
    w_x : [I, 4H] device array
        ``kernel[:I]`` (a view).
    w_rec : [P, 4H] device array
        ``kernel[I:]`` (a view).
    bias : [4H] device array
    w_i, w_f, w_o : [H] device arrays
        The peepholes; without them the bias stands in (never read).
    projection : [H, P] device array
        Without a projection ``w_rec`` stands in (never read).
    input_depth, units, depth : int
        ``I``, ``H`` and ``P = num_proj or H``.
    use_peepholes, has_proj : bool
    """

    def __init__(self, weights, dtype, stream=0):
        dtype = np.dtype(dtype)
        kernel = weights["kernel"]
        self.units = kernel.shape[1] // 4
        proj = weights.get("projection/kernel")
        self.has_proj = proj is not None
        self.use_peepholes = "w_i_diag" in weights
        self.depth = proj.shape[1] if self.has_proj else self.units
        self.input_depth = kernel.shape[0] - self.depth
        names = ["kernel", "bias", *(_PEEPHOLE_NAMES if self.use_peepholes else ()),
                 *(("projection/kernel",) if self.has_proj else ())]
        offsets, total = [], 0
        for name in names:
            offsets.append(total)
            total += _cu._padded(weights[name].size)
        # One host buffer, one copy: each copy costs a driver call and a synchronisation.
        host = np.zeros(max(total, 1), dtype)
        for name, offset in zip(names, offsets, strict=True):
            host[offset:offset + weights[name].size] = weights[name].ravel()
        flat = cuda.to_device(host, stream=stream)
        if stream:
            # The cache serves every later call, on whatever stream: the
            # upload must be complete before any of them reads it.
            stream.synchronize()
        views = {name: flat[offset:offset + weights[name].size].reshape(weights[name].shape)
                 for name, offset in zip(names, offsets, strict=True)}
        self.kernel = views["kernel"]
        self.w_x = self.kernel[:self.input_depth]
        self.w_rec = self.kernel[self.input_depth:]
        self.bias = views["bias"]
        self.w_i, self.w_f, self.w_o = (views.get(n, self.bias) for n in _PEEPHOLE_NAMES)
        self.projection = views.get("projection/kernel", self.w_rec)


def _device_weights(run, weights, cache):
    """The cell's weights on the launcher's GPU in its compute dtype: from ``cache``, uploaded on first use."""
    key = (run.dtype.str, run.device)
    found = cache.get(key)
    if found is None:
        found = cache[key] = DeviceWeights(weights, run.dtype, run.stream)
    return found


def _numba_array(value):
    """Results stay Numba device arrays, whatever kind of GPU array the caller gave (the cell's contract)."""
    return value


def _clip_args(dt, bound):
    """``(bound, on)`` kernel arguments of an optional clip bound, the bound in the compute dtype."""
    return (dt(0.0), False) if bound is None else (dt(bound), True)


def _state_parts(offset, batch, units, depth, join_state):
    """``(write_state offsets and row lengths, finish parts)`` of a state region starting at ``offset``.

    ``offset`` is a list: one offset for a joined state, two for a tuple.
    """
    if join_state:
        width = units + depth
        return (offset[0], width, offset[0] + units, width), [(offset[0], (batch, width))]
    return (offset[0], units, offset[1], depth), [(offset[0], (batch, units)), (offset[1], (batch, depth))]


def _state_shapes(batch, units, depth, join_state):
    return [(batch, units + depth)] if join_state else [(batch, units), (batch, depth)]


def sequence_forward(inputs, c0, m0, weights, cache, lengths, forget_bias, cell_clip, proj_clip, act, join_state,
                     with_grad):
    """Forward of the cell over a sequence (or one step) on the GPU, from validated arguments.

    Parameters
    ----------
    inputs : [T, B, I] or [B, I] GPU array
        A rank-2 array is one step (``T = 1``).
    c0 : [B, H] GPU array or None
    m0 : [B, P] GPU array or None
        Initial state, the dtype of ``inputs`` (any strides); ``None`` for zeros.
    weights : dict
        The cell's host weights (:class:`DeviceWeights`), in the dtype of ``inputs``.
    cache : dict
        The cell's uploaded weights, keyed by compute dtype and GPU; filled
        here on first use.
    lengths : [B] int64 NumPy array
        Validated lengths, ``0 <= lengths <= T``.
    forget_bias : float
    cell_clip, proj_clip : float or None
        ``None`` turns clipping off (``proj_clip`` applies with a projection only).
    act : int
        Activation code (:data:`nblstm.spec.ACTIVATIONS`).
    join_state : bool
        The final state as one ``[B, H + P]`` array (``state_is_tuple=False``)
        instead of ``(c, m)``.
    with_grad : bool
        Keep what :func:`sequence_backward` needs.

    Returns
    -------
    tuple
        ``(outputs [T, B, P], state, saved)``: ``outputs`` zero from each
        example's length on, ``state`` ``(c [B, H], m [B, P])`` or
        ``[B, H + P]`` at each example's length, as Numba device arrays of
        the dtype of ``inputs``; ``saved`` a dict for
        :func:`sequence_backward` (``None`` without ``with_grad``).
    """
    with _cu._call({"x": inputs, "c0": c0, "m0": m0}, None, wrap=_numba_array) as run:
        w = _device_weights(run, weights, cache)
        x, c0, m0 = run.prepare(inputs, c0, m0, keep=with_grad)
        if len(x.shape) == 2:
            x = x.reshape(1, *x.shape)
        steps, batch, _ = x.shape
        units, depth = w.units, w.depth
        # A zero state is read only (also when kept for the backward pass): the arena's zeros serve.
        if c0 is None:
            c0 = run.read_only_zeros((batch, units))
        if m0 is None:
            m0 = run.read_only_zeros((batch, depth))
        s = int(lengths.max()) if batch else 0
        d_lengths = cuda.to_device(np.ascontiguousarray(lengths, np.int64), stream=run.stream) if batch else None
        out_shape = (steps, batch, depth)
        offsets, total = _cu._regions(run, [out_shape, *_state_shapes(batch, units, depth, join_state)])
        flat = run.results(total)
        outputs = flat[:_cu._size(out_shape)].reshape(out_shape)
        saved = None
        if s == 0:
            gates = cells = ms = None
            c_last, m_last, m_all = c0, m0, outputs
        else:
            alloc = run.empty if with_grad else run.scratch
            gates = alloc((s, batch, 4 * units))
            cells = alloc((4, s, batch, units))
            ms = alloc((2, s, batch, depth)) if w.has_proj else cells[2:4]
            _forward_steps(run, x, c0, m0, w, d_lengths, s, forget_bias, cell_clip, proj_clip, act, gates, cells,
                           ms)
            c_last, m_last, m_all = cells[1, s - 1], ms[1, s - 1], ms[1]
        run.elementwise(_masked_outputs, _cu._size(out_shape), d_lengths, m_all, outputs, run.dtype.type(0))
        where, parts = _state_parts(offsets[1:], batch, units, depth, join_state)
        run.elementwise(_write_state, batch * (units + depth), c_last, m_last, flat, *where)
        results = run.finish([(0, out_shape), *parts])
        if with_grad:
            saved = {"inputs": inputs, "x": x, "c0": c0, "m0": m0, "lengths": d_lengths, "steps": s, "weights": w,
                     "gates": gates, "cells": cells, "ms": ms, "options": (cell_clip, proj_clip, act)}
    state = results[1] if join_state else (results[1], results[2])
    return results[0], state, saved


def _forward_steps(run, x, c0, m0, w, d_lengths, s, forget_bias, cell_clip, proj_clip, act, gates, cells, ms):
    """The input GEMM and the time loop of the forward pass (``s >= 1`` steps, ``B >= 1``)."""
    batch, inputs = x.shape[1], x.shape[2]
    units, depth = w.units, w.depth
    dt = run.dtype.type
    # The input projection of all steps plus the bias, straight into the gates array.
    run.gemm(x[:s].reshape(s * batch, inputs), w.w_x, gates.reshape(s * batch, 4 * units), bias=w.bias)
    k = _cell_kernels(run.dtype)
    block = (_cu._SJ, _cu._SB)
    rows = _cu._ceil_div(batch, _cu._SB)
    step = _cu._Repeat(k.forward_step, (_cu._ceil_div(units, _cu._SJ), rows), block, run.stream,
                       (gates, c0, m0, w.w_rec, d_lengths, w.w_i, w.w_f, w.w_o, run.one, dt(forget_bias),
                        *_clip_args(dt, cell_clip), int(act), w.use_peepholes, w.has_proj, cells, ms))
    project = None
    if w.has_proj:
        project = _cu._Repeat(k.project_step, (_cu._ceil_div(depth, _cu._SJ), rows), block, run.stream,
                              (cells, m0, w.projection, d_lengths, run.one, *_clip_args(dt, proj_clip), ms))
    for t in range(s):
        step(t)
        if project is not None:
            project(t)


def sequence_backward(saved, d_outputs, d_c, d_m, join_state):
    """Backward of the cell over the sequence of :func:`sequence_forward`, on the GPU.

    Parameters
    ----------
    saved : dict
        From :func:`sequence_forward` with ``with_grad``; not changed, so the
        backward pass may run any number of times.
    d_outputs : [T, B, P] GPU array or None
        Gradient of the outputs (``None``: zeros). Entries past an example's
        length are not read (those outputs are constant zero).
    d_c : [B, H] GPU array or None
    d_m : [B, P] GPU array or None
        Gradient of the final state (``None``: zeros), any strides.
    join_state : bool
        The gradient of the initial state as one ``[B, H + P]`` array.

    Returns
    -------
    tuple
        ``(d_x [T, B, I], d_state, d_weights)``: ``d_x`` and ``d_state``
        (``(d_c0 [B, H], d_m0 [B, P])`` or ``[B, H + P]``) Numba device
        arrays of the inputs' dtype, ``d_weights`` a dict of NumPy arrays of
        the compute dtype keyed like the weights.
    """
    named = {"x": saved["inputs"], "d_outputs": d_outputs, "d_c": d_c, "d_m": d_m}
    with _cu._call(named, None, wrap=_numba_array) as run:
        x, w, s = saved["x"], saved["weights"], saved["steps"]
        steps, batch, inputs = x.shape
        units, depth = w.units, w.depth
        (d_out,) = run.prepare(d_outputs)
        if d_out is None:
            d_out = run.read_only_zeros((steps, batch, depth))
        # The carried gradients start as the final state's and end as the initial state's.
        dc, dm = run.scratch((batch, units)), run.scratch((batch, depth))
        for given, carried in ((d_c, dc), (d_m, dm)):
            if given is None:
                run.fill_zero(carried)
            else:
                run.copy(_cu._as_device(given, run.stream), carried)
        x_shape = (steps, batch, inputs)
        offsets, total = _cu._regions(run, [x_shape, *_state_shapes(batch, units, depth, join_state)])
        flat = run.results(total)
        d_x = flat[:_cu._size(x_shape)].reshape(x_shape)
        run.fill_zero(flat[s * batch * inputs:_cu._size(x_shape)])
        grads, d_weights = _weight_grad_arrays(run, w)
        if s == 0:
            run.fill_zero(grads)
        else:
            _backward_steps(run, saved, d_out, dc, dm, d_x, d_weights)
        where, parts = _state_parts(offsets[1:], batch, units, depth, join_state)
        run.elementwise(_write_state, batch * (units + depth), dc, dm, flat, *where)
        results = run.finish([(0, x_shape), *parts])
        host = grads.copy_to_host(stream=run.stream)
        if not (isinstance(run.stream, int) and run.stream == 0):
            run.stream.synchronize()
    offsets_w = {name: (offset, a.shape) for name, (offset, a) in d_weights.items()}
    d_w = {name: host[offset:offset + _cu._size(shape)].reshape(shape) for name, (offset, shape) in offsets_w.items()}
    state = results[1] if join_state else (results[1], results[2])
    return results[0], state, d_w


def _weight_grad_arrays(run, w):
    """One device allocation for every weight gradient: ``(flat, {name: (offset, view)})``."""
    shapes = {"kernel": (w.input_depth + w.depth, 4 * w.units), "bias": (4 * w.units,)}
    if w.use_peepholes:
        shapes.update({name: (w.units,) for name in _PEEPHOLE_NAMES})
    if w.has_proj:
        shapes["projection/kernel"] = (w.units, w.depth)
    views, total = {}, 0
    for name, shape in shapes.items():
        views[name] = total
        total += _cu._padded(_cu._size(shape))
    flat = run.empty(total)
    return flat, {name: (offset, flat[offset:offset + _cu._size(shapes[name])].reshape(shapes[name]))
                  for name, offset in views.items()}


def _backward_steps(run, saved, d_out, dc, dm, d_x, d_weights):
    """The time loop of the backward pass and the GEMMs after it (``S >= 1`` steps, ``B >= 1``)."""
    x, c0, m0, w, s = saved["x"], saved["c0"], saved["m0"], saved["weights"], saved["steps"]
    gates, cells, ms, d_lengths = saved["gates"], saved["cells"], saved["ms"], saved["lengths"]
    cell_clip, proj_clip, act = saved["options"]
    batch, inputs = x.shape[1], x.shape[2]
    units, depth = w.units, w.depth
    dt = run.dtype.type
    dgates = run.scratch((s, batch, 4 * units))
    # Without a projection the gradient of m is never stored per step (no projection gradient needs it).
    dm_raw = run.scratch((s, batch, depth)) if w.has_proj else dgates
    k = _cell_kernels(run.dtype)
    block = (_cu._SJ, _cu._SB)
    rows = _cu._ceil_div(batch, _cu._SB)
    m_step = _cu._Repeat(k.backward_m_step, (_cu._ceil_div(depth, _cu._SJ), rows), block, run.stream,
                         (s, dgates, w.w_rec, d_lengths, d_out, ms, run.one, *_clip_args(dt, proj_clip), dm, dm_raw))
    units_step = _cu._Repeat(k.backward_units_step, (_cu._ceil_div(units, _cu._SJ), rows), block, run.stream,
                             (s, c0, gates, cells, dm_raw, w.w_rec, w.projection, d_lengths, d_out, w.w_i, w.w_f,
                              w.w_o, run.one, *_clip_args(dt, cell_clip), int(act), w.use_peepholes, w.has_proj,
                              dgates, dc, dm))
    for t in range(s - 1, -1, -1):
        if w.has_proj:
            m_step(t)
        units_step(t)
    m_step(-1)  # the gradient of m0 from the first step's gate gradients
    # After the loop: d_x = dG @ kernel[:I]^T, d_kernel = [x; m_{t-1}]^T @ dG,
    # d_bias = column sums of dG, d_projection = r^T @ dm_raw.
    dg2 = dgates.reshape(s * batch, 4 * units)
    d_kernel = d_weights["kernel"][1]
    run.gemm(dg2, w.w_x, d_x[:s].reshape(s * batch, inputs), trans_b=True)
    run.gemm(x[:s].reshape(s * batch, inputs), dg2, d_kernel[:inputs], trans_a=True)
    run.gemm(m0, dgates[0], d_kernel[inputs:], trans_a=True)
    if s > 1:
        run.gemm(ms[1][:s - 1].reshape((s - 1) * batch, depth), dgates[1:].reshape((s - 1) * batch, 4 * units),
                 d_kernel[inputs:], trans_a=True, accumulate=True)
    run.column_sums(dg2, d_weights["bias"][1])
    if w.use_peepholes:
        run.peephole_grads(s, c0, cells[1], dgates, (0, 1, 2, 3),
                           tuple(d_weights[name][1] for name in _PEEPHOLE_NAMES))
    if w.has_proj:
        run.gemm(cells[3].reshape(s * batch, units), dm_raw.reshape(s * batch, depth),
                 d_weights["projection/kernel"][1], trans_a=True)


# ---------------------------------------------------------------------------
# Kept for the PTX checks: every kernel with the argument types it is launched with.
def kernel_signatures(dtype):
    """``[(name, python function, signature)]`` of every kernel of this module for one compute dtype.

    Used by the compile-only checks (``numba.cuda.compile_ptx``). float16
    arrays run these kernels in float32 (their casts are
    :func:`nblstm.cuda.kernel_signatures`'), so only float32 and float64
    have kernels here.

    Parameters
    ----------
    dtype : numpy.dtype
        float32 or float64.
    """
    dtype = np.dtype(dtype)
    nt = {np.dtype(np.float32): types.float32, np.dtype(np.float64): types.float64}[dtype]
    a1, a2, a3, a4 = (types.Array(nt, n, "C") for n in (1, 2, 3, 4))
    i64, b1 = types.int64, types.boolean
    lengths = types.Array(i64, 1, "C")
    k = _cell_kernels(dtype)
    return [
        ("masked_outputs", _masked_outputs.py_func, (lengths, a3, a3, nt)),
        ("write_state", _write_state.py_func, (a2, a2, a1, i64, i64, i64, i64)),
        ("forward_step", k.forward_step.py_func,
         (i64, a3, a2, a2, a2, lengths, a1, a1, a1, nt, nt, nt, b1, i64, b1, b1, a4, a4)),
        ("project_step", k.project_step.py_func, (i64, a4, a2, a2, lengths, nt, nt, b1, a4)),
        ("backward_m_step", k.backward_m_step.py_func, (i64, i64, a3, a2, lengths, a3, a4, nt, nt, b1, a2, a3)),
        ("backward_units_step", k.backward_units_step.py_func,
         (i64, i64, a2, a3, a4, a3, a2, a2, lengths, a3, a1, a1, a1, nt, nt, b1, i64, b1, b1, a3, a2, a2)),
    ]


__all__ = ["DeviceWeights", "sequence_forward", "sequence_backward", "kernel_signatures"]
