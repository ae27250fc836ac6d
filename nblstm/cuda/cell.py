"""The TF1 ``LSTMCell`` on the GPU: drivers of its kernels over whole sequences (:ref:`spec-cell`).

The GPU counterpart of :mod:`nblstm.cpu.cell`, with the same semantics:
peepholes, ``cell_clip`` and ``proj_clip`` with the true ``clip_by_value``
gradient (zero where clipped; a bound of 0 clips to 0), a projection
``h = clip(r @ projection)`` of ``r = o * act(c)``, any activation code of
:data:`nblstm.spec.ACTIVATIONS`, ``forget_bias``, and per-example lengths
with ``dynamic_rnn`` semantics (past its length an example's outputs are
zero and its state is carried unchanged).

It is built from the pieces of the fused ops: the tiled GEMM
(:mod:`nblstm.cuda.gemm`), the step tiles' slices of the recurrent GEMMs
(:mod:`nblstm.cuda.tiles`), the launcher with its scratch arena, streams
and devices, and the per-step launches with arguments converted once
(:mod:`nblstm.cuda.launch`); its kernels are in
:mod:`nblstm.cuda.cell_kernels`.

- Forward: one GEMM computes the input projection of all steps plus the
  bias into the gates array ``[S, B, 4H]``. Each step is one launch of a
  fused kernel: a block owns ``SB`` batch rows by ``SJ`` units, computes
  their four gate columns of ``h_{t-1} @ kernel[I:]`` and runs the gate
  maths, overwriting the step's projections with the gates. With a
  projection a second launch per step computes ``h`` (it needs every
  unit's ``r``).
- Backward: per step, one launch computes the gradient of ``h`` carried from
  step ``t + 1`` (``dgates[t + 1] @ kernel[I:]^T``) and of the projection
  before its clip, and one the gradient of ``r`` (``@ projection^T``) and
  the gate maths. Without a projection one launch does both: unit ``j``'s
  output is column ``j`` of ``h``, so a thread owns both. The input and
  weight gradients are GEMMs after the loop, the bias and peephole
  gradients column reductions.
- Only ``S = max(lengths)`` steps run: after the longest example every
  state is only carried.
- The weights are uploaded once (:class:`DeviceWeights`, one host-to-device
  copy) and kept by the cell until they change.
- float16 arrays are computed in float32 and the results cast back, as for
  the fused ops.

Results (outputs, states and their gradients, the input gradient) are Numba
device arrays of the inputs' dtype, whatever kind of GPU array was given;
the weight gradients come back as NumPy arrays of the compute dtype (one
device-to-host copy), like the cell's weights. Every kernel is
deterministic: no atomics, each output element written by one thread,
reductions in a fixed order.
"""

import numpy as np
from numba import cuda

from .cell_kernels import (
    CellForward,
    CellGrads,
    CellState,
    CellWeights,
    backward_h_step,
    backward_units_step,
    forward_step,
    project_step,
)
from .config import SB, SJ, ceil_div, padded, size
from .elementwise import gather_rows, masked_outputs, scatter_add_rows, write_state
from .interop import as_device
from .launch import LOOPS, Repeat, call, regions
from .resident import cell_backward_resident, cell_forward_resident

__all__ = ["DeviceWeights", "sequence_backward", "sequence_forward"]

#: Names of the weights, as :meth:`nblstm.LSTMCell.get_weights` keys them.
_PEEPHOLE_NAMES = ("w_i_diag", "w_f_diag", "w_o_diag")


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
    record : nblstm.cuda.cell_kernels.CellWeights
        The arrays the step kernels read, as their one argument.
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
            total += padded(weights[name].size)
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
        self.record = CellWeights(self.w_rec, self.projection, self.w_i, self.w_f, self.w_o)


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


def sequence_forward(inputs, c0, h0, weights, cache, lengths, options, join_state, with_grad, schedule=None):
    """Forward of the cell over a sequence (or one step) on the GPU, from validated arguments.

    Parameters
    ----------
    inputs : [T, B, I] or [B, I] GPU array
        A rank-2 array is one step (``T = 1``).
    c0 : [B, H] GPU array or None
    h0 : [B, P] GPU array or None
        Initial state, the dtype of ``inputs`` (any strides); ``None`` for zeros.
    weights : dict
        The cell's host weights (:class:`DeviceWeights`), in the dtype of ``inputs``.
    cache : dict
        The cell's uploaded weights, keyed by compute dtype and GPU; filled
        here on first use.
    lengths : [B] int64 NumPy array
        Validated lengths, ``0 <= lengths <= T``.
    options : nblstm.options.CellOptions
    join_state : bool
        The final state as one ``[B, H + P]`` array (``state_is_tuple=False``)
        instead of ``(c, h)``.
    with_grad : bool
        Keep what :func:`sequence_backward` needs.
    schedule : nblstm.schedule.Schedule, optional
        The order of the steps (``lengths`` is then its ``counts``): the
        input projection of every time is gathered into step order, the
        outputs back into time order.

    Returns
    -------
    tuple
        ``(outputs [T, B, P], state, saved)``: ``outputs`` zero from each
        example's length on, ``state`` ``(c [B, H], h [B, P])`` or
        ``[B, H + P]`` at each example's length, as Numba device arrays of
        the dtype of ``inputs``; ``saved`` a dict for
        :func:`sequence_backward` (``None`` without ``with_grad``).
    """
    with call({"x": inputs, "c0": c0, "h0": h0}, None, wrap=_numba_array, precision=options.precision) as run:
        w = _device_weights(run, weights, cache)
        x, c0, h0 = run.prepare(inputs, c0, h0, keep=with_grad)
        if len(x.shape) == 2:
            x = x.reshape(1, *x.shape)
        steps, batch, _ = x.shape
        units, depth = w.units, w.depth
        # A zero state is read only (also when kept for the backward pass): the arena's zeros serve.
        if c0 is None:
            c0 = run.read_only_zeros((batch, units))
        if h0 is None:
            h0 = run.read_only_zeros((batch, depth))
        if schedule is not None:
            lengths = schedule.counts
        s = int(lengths.max()) if batch else 0
        d_lengths = cuda.to_device(np.ascontiguousarray(lengths, np.int64), stream=run.stream) if batch else None
        maps = None
        if schedule is not None and batch:
            maps = {name: cuda.to_device(np.ascontiguousarray(getattr(schedule, name)), stream=run.stream)
                    for name in ("time_of", "step_of", "output_of")}
        out_shape = (steps, batch, depth)
        offsets, total = regions(run, [out_shape, *_state_shapes(batch, units, depth, join_state)])
        flat = run.results(total)
        outputs = flat[:size(out_shape)].reshape(out_shape)
        saved = None
        if s == 0:
            gates = cells = hs = None
            c_last, h_last, h_all = c0, h0, outputs
        else:
            alloc = run.empty if with_grad else run.scratch
            gates = alloc((s, batch, 4 * units))
            cells = alloc((4, s, batch, units))
            hs = alloc((2, s, batch, depth)) if w.has_proj else cells[2:4]
            _forward_steps(run, x, c0, h0, w, d_lengths, s, options, gates, cells, hs, maps)
            c_last, h_last, h_all = cells[1, s - 1], hs[1, s - 1], hs[1]
        if maps is None:
            run.elementwise(masked_outputs, size(out_shape), d_lengths, h_all, outputs, run.dtype.type(0))
        else:  # no step computed: every index is -1 and h_all is not read
            run.elementwise(gather_rows, size(out_shape), h_all, h0, maps["output_of"], 0, outputs,
                            run.dtype.type(0))
        where, parts = _state_parts(offsets[1:], batch, units, depth, join_state)
        run.elementwise(write_state, batch * (units + depth), c_last, h_last, flat, *where)
        results = run.finish([(0, out_shape), *parts])
        if with_grad:
            saved = {"inputs": inputs, "x": x, "c0": c0, "h0": h0, "lengths": d_lengths, "steps": s, "weights": w,
                     "gates": gates, "cells": cells, "hs": hs, "options": options, "maps": maps}
    state = results[1] if join_state else (results[1], results[2])
    return results[0], state, saved


def _forward_steps(run, x, c0, h0, w, d_lengths, s, options, gates, cells, hs, maps=None):
    """The input GEMM and the time loop of the forward pass (``s >= 1`` steps, ``B >= 1``)."""
    steps, batch, inputs = x.shape
    units, depth = w.units, w.depth
    if maps is None:
        # The input projection of all steps plus the bias, straight into the gates array.
        run.gemm(x[:s].reshape(s * batch, inputs), w.w_x, gates.reshape(s * batch, 4 * units), bias=w.bias)
    else:
        # The projection of every time, then its rows in step order (time_of[:s]: C-contiguous rows).
        pre = run.scratch((steps, batch, 4 * units))
        run.gemm(x.reshape(steps * batch, inputs), w.w_x, pre.reshape(steps * batch, 4 * units), bias=w.bias)
        run.elementwise(gather_rows, size(gates.shape), pre, pre[0], maps["time_of"][:s], 0, gates,
                        run.dtype.type(0))
    args = (CellForward(gates, cells, hs), CellState(c0, h0), w.record, d_lengths, run.one,
            run.kernel_options(options, w.has_proj, w.use_peepholes))
    if not w.has_proj and run.resident(cell_forward_resident, s, args, batch, units, True):
        return
    block = (SJ, SB)
    rows = ceil_div(batch, SB)
    # With the per-step GEMM loop cuBLAS adds h[t - 1] @ kernel[I:] to gates[t] (and computes r[t] @ projection
    # into h_raw[t]) before each step's kernel, which then only runs the gate maths.
    given = run.step_gemm()
    step = Repeat(forward_step, (ceil_div(units, SJ), rows), block, run.stream, (*args, given))
    project = None
    if w.has_proj:
        project = Repeat(project_step, (ceil_div(depth, SJ), rows), block, run.stream, (*args, given))
    if given:
        recurrent = run.step_product(w.w_rec, batch, accumulate=True)
        projected = run.step_product(w.projection, batch) if w.has_proj else None
        gate_rows, h_rows = gates.reshape(s * batch, 4 * units), hs[1].reshape(s * batch, depth)
        r_rows, h_raw_rows = cells[3].reshape(s * batch, units), hs[0].reshape(s * batch, depth)
    for t in range(s):
        if given:
            recurrent(h0 if t == 0 else h_rows, 0 if t == 0 else (t - 1) * batch, gate_rows, t * batch)
        step(t)
        if project is not None:
            if given:
                projected(r_rows, t * batch, h_raw_rows, t * batch)
            project(t)
    if given:
        LOOPS["gemm-steps"] += 1


def sequence_backward(saved, d_outputs, d_c, d_h, join_state):
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
    d_h : [B, P] GPU array or None
        Gradient of the final state (``None``: zeros), any strides.
    join_state : bool
        The gradient of the initial state as one ``[B, H + P]`` array.

    Returns
    -------
    tuple
        ``(d_x [T, B, I], d_state, d_weights)``: ``d_x`` and ``d_state``
        (``(d_c0 [B, H], d_h0 [B, P])`` or ``[B, H + P]``) Numba device
        arrays of the inputs' dtype, ``d_weights`` a dict of NumPy arrays of
        the compute dtype keyed like the weights.
    """
    named = {"x": saved["inputs"], "d_outputs": d_outputs, "d_c": d_c, "d_h": d_h}
    with call(named, None, wrap=_numba_array, precision=saved["options"].precision) as run:
        x, w, s = saved["x"], saved["weights"], saved["steps"]
        steps, batch, inputs = x.shape
        units, depth = w.units, w.depth
        (d_out,) = run.prepare(d_outputs)
        if d_out is None:
            d_out = run.read_only_zeros((steps, batch, depth))
        # The carried gradients start as the final state's and end as the initial state's.
        dc, dh = run.scratch((batch, units)), run.scratch((batch, depth))
        for given, carried in ((d_c, dc), (d_h, dh)):
            if given is None:
                run.fill_zero(carried)
            else:
                run.copy(as_device(given, run.stream), carried)
        x_shape = (steps, batch, inputs)
        offsets, total = regions(run, [x_shape, *_state_shapes(batch, units, depth, join_state)])
        flat = run.results(total)
        d_x = flat[:size(x_shape)].reshape(x_shape)
        run.fill_zero(flat[s * batch * inputs:size(x_shape)])
        grads, d_weights = _weight_grad_arrays(run, w)
        if s == 0:
            run.fill_zero(grads)
        else:
            _backward_steps(run, saved, d_out, dc, dh, d_x, d_weights)
        where, parts = _state_parts(offsets[1:], batch, units, depth, join_state)
        run.elementwise(write_state, batch * (units + depth), dc, dh, flat, *where)
        results = run.finish([(0, x_shape), *parts])
        host = grads.copy_to_host(stream=run.stream)
        if not (isinstance(run.stream, int) and run.stream == 0):
            run.stream.synchronize()
    offsets_w = {name: (offset, a.shape) for name, (offset, a) in d_weights.items()}
    d_w = {name: host[offset:offset + size(shape)].reshape(shape) for name, (offset, shape) in offsets_w.items()}
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
        total += padded(size(shape))
    flat = run.empty(total)
    return flat, {name: (offset, flat[offset:offset + size(shapes[name])].reshape(shapes[name]))
                  for name, offset in views.items()}


def _backward_steps(run, saved, d_out, dc, dh, d_x, d_weights):
    """The time loop of the backward pass and the GEMMs after it (``S >= 1`` steps, ``B >= 1``)."""
    x, c0, h0, w, s = saved["x"], saved["c0"], saved["h0"], saved["weights"], saved["steps"]
    gates, cells, hs, d_lengths = saved["gates"], saved["cells"], saved["hs"], saved["lengths"]
    steps, batch, inputs = x.shape
    units, depth = w.units, w.depth
    maps = saved["maps"]
    if maps is not None:  # the output gradients in step order (summed where outputs repeat)
        d_out_steps = run.scratch((s, batch, depth))
        run.elementwise(scatter_add_rows, batch * depth, d_out, maps["output_of"], d_out_steps, run.dtype.type(0))
        d_out = d_out_steps
    dgates = run.scratch((s, batch, 4 * units))
    # Without a projection the gradient of h is never stored per step (no projection gradient needs it).
    dh_raw = run.scratch((s, batch, depth)) if w.has_proj else dgates
    block = (SJ, SB)
    rows = ceil_div(batch, SB)
    # With the per-step GEMM loop cuBLAS computes each step's carried product before its kernel:
    # dgates[t + 1] @ kernel[I:]^T into carried_h ([B, P]), and with a projection dh_raw[t] @ projection^T
    # into carried_r ([B, H]; without one, r is h and that product is dgates[t + 1] @ kernel[I:]^T).
    given = run.step_gemm()
    carried_h = run.scratch((batch, depth)) if given else dh
    carried_r = (run.scratch((batch, units)) if w.has_proj else carried_h) if given else dc
    fwd, weights = CellForward(gates, cells, hs), w.record
    options = run.kernel_options(saved["options"], w.has_proj, w.use_peepholes)
    grads = CellGrads(d_out, dgates, dc, dh, dh_raw)
    h_step = Repeat(backward_h_step, (ceil_div(depth, SJ), rows), block, run.stream,
                    (s, fwd, weights, d_lengths, run.one, options, grads, given, carried_h))
    units_step = Repeat(backward_units_step, (ceil_div(units, SJ), rows), block, run.stream,
                        (s, fwd, CellState(c0, h0), weights, d_lengths, run.one, options, grads, given, carried_r))
    if given:
        through_w = run.step_product(w.w_rec, batch, trans_b=True)
        through_proj = run.step_product(w.projection, batch, trans_b=True) if w.has_proj else None
        dgate_rows = dgates.reshape(s * batch, 4 * units)
        dh_raw_rows = dh_raw.reshape(s * batch, depth) if w.has_proj else None
    resident = not w.has_proj and run.resident(
        cell_backward_resident, s, (fwd, CellState(c0, h0), weights, d_lengths, run.one, options, grads), batch, units,
        False)
    for t in range(-1 if resident else s - 1, -1, -1):
        if given and t + 1 < s:
            through_w(dgate_rows, (t + 1) * batch, carried_h, 0)
        if w.has_proj:
            h_step(t)
            if given:
                through_proj(dh_raw_rows, t * batch, carried_r, 0)
        units_step(t)
    if given:
        through_w(dgate_rows, 0, carried_h, 0)
        LOOPS["gemm-steps"] += not resident
    h_step(-1)  # the gradient of h0 from the first step's gate gradients
    # After the loop: d_x = dG @ kernel[:I]^T, d_kernel = [x; h_{t-1}]^T @ dG,
    # d_bias = column sums of dG, d_projection = r^T @ dh_raw.
    dg2 = dgates.reshape(s * batch, 4 * units)
    d_kernel = d_weights["kernel"][1]
    if maps is None:
        run.gemm(dg2, w.w_x, d_x[:s].reshape(s * batch, inputs), trans_b=True)
        run.gemm(x[:s].reshape(s * batch, inputs), dg2, d_kernel[:inputs], trans_a=True)
    else:  # the input's share in time order: the gate gradients gathered back to their times
        dg_times = run.scratch((steps, batch, 4 * units)).reshape(steps * batch, 4 * units)
        run.elementwise(gather_rows, dg_times.size, dgates, dgates[0], maps["step_of"], 0,
                        dg_times.reshape(steps, batch, 4 * units), run.dtype.type(0))
        run.gemm(dg_times, w.w_x, d_x.reshape(steps * batch, inputs), trans_b=True)
        run.gemm(x.reshape(steps * batch, inputs), dg_times, d_kernel[:inputs], trans_a=True)
    run.gemm(h0, dgates[0], d_kernel[inputs:], trans_a=True)
    if s > 1:
        run.gemm(hs[1][:s - 1].reshape((s - 1) * batch, depth), dgates[1:].reshape((s - 1) * batch, 4 * units),
                 d_kernel[inputs:], trans_a=True, accumulate=True)
    run.column_sums(dg2, d_weights["bias"][1])
    if w.use_peepholes:
        run.peephole_grads(s, c0, cells[1], dgates, (0, 1, 2, 3),
                           tuple(d_weights[name][1] for name in _PEEPHOLE_NAMES))
    if w.has_proj:
        run.gemm(cells[3].reshape(s * batch, units), dh_raw.reshape(s * batch, depth),
                 d_weights["projection/kernel"][1], trans_a=True)
