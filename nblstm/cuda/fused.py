"""The fused ops on the GPU: drivers of BlockLSTM, LSTMBlockCell and their gradients.

How the work is laid out (:ref:`design-cuda`):

- Forward: one tiled shared-memory GEMM (:mod:`nblstm.cuda.gemm`) computes
  the input projection of all steps plus the bias, ``xw = x @ w[:I] + b``
  (``[S * B, 4H]``). Then each step is one launch of a fused kernel
  (:mod:`nblstm.cuda.fused_kernels`): a block owns a tile of ``SB`` batch
  rows by ``SJ`` hidden units, computes the four gate columns of those
  units of ``h_{t-1} @ w[I:]`` (its slice of the recurrent GEMM) and runs
  the gate maths of :mod:`nblstm.spec` on them while they are in registers.
- Backward: each step is one launch of a fused kernel that computes the
  carried ``dh = dgates[t + 1] @ w[I:]^T`` for its tile and the gate
  gradients of :func:`nblstm.spec.backward_unit`. ``x_grad``,
  ``h_prev_grad`` and ``w_grad`` are large GEMMs after the loop;
  ``b_grad`` and the peephole gradients are column reductions.
- Small batches run all steps in one persistent cooperative launch with a
  grid barrier per step, where launches would dominate
  (:meth:`nblstm.cuda.launch.Launcher.recurrence`).
- float16 arrays are cast to float32 on the device, computed in float32
  and cast back (float16 storage, float32 arithmetic, as on the CPU).
  Non-contiguous inputs are copied to contiguous ones on the device, so
  every kernel sees C-contiguous arrays of one compute dtype: few
  specialisations.

Every kernel and device function is deterministic: no atomics, each output
element is written by one thread, reductions run in a fixed order.
"""

from ..spec import GATE_BLOCKS
from .config import size
from .fused_kernels import (
    BackwardResults,
    ForwardOutputs,
    OutputGrads,
    RecurrentWeights,
    backward_gates,
    backward_persistent,
    backward_step,
    forward_gates,
    forward_persistent,
    forward_step,
)
from .launch import call, regions
from .resident import backward_resident, forward_resident

__all__ = ["block_lstm", "block_lstm_grad", "lstm_block_cell", "lstm_block_cell_grad"]


def _blocks(layout):
    """Gate block indices ``(i, ci, f, o)`` as Python ints."""
    return tuple(int(k) for k in GATE_BLOCKS[layout])


def _forward_device(run, x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, options, out):
    """Whole-sequence forward on prepared device arrays of the compute dtype.

    Parameters
    ----------
    run : nblstm.cuda.launch.Launcher
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    b : [4H] array
    wci, wcf, wco : [H] arrays or None
        ``None`` when not used (``use_peephole`` is False).
    seq_len_max : int
    options : nblstm.options.OpOptions
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
    # Absent peephole weights are never used: any array of at least H elements stands in.
    w_rec = w[inputs:]
    weights = RecurrentWeights(w_rec, *(b if p is None else p for p in (wci, wcf, wco)))
    maths = (run.one, run.kernel_options(options), _blocks(options.layout), out)
    args = (xw, cs_prev, h_prev, weights, *maths)

    def gemm_steps():
        # Per step: xw[t] += h_{t-1} @ W_h (cuBLAS), then the gate maths.
        product = run.step_product(w_rec, batch, accumulate=True)
        gates = run.repeat_linear(forward_gates, batch * units, (xw, cs_prev, weights, *maths))
        h_seq, xw_rows = out[6].reshape(steps * batch, units), xw.reshape(s * batch, 4 * units)
        for t in range(s):
            product(h_prev if t == 0 else h_seq, 0 if t == 0 else (t - 1) * batch, xw_rows, t * batch)
            gates(t)

    run.recurrence(forward_persistent, forward_step, args, s, batch, units, resident=forward_resident,
                   gemm_steps=gemm_steps)


def _backward_recurrent(run, cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, w_rec, options, dgates,
                        dc, peephole_grads):
    """The time loop of the backward pass on prepared device arrays.

    Parameters
    ----------
    run : nblstm.cuda.launch.Launcher
    cs_prev : [B, H] array
    wci, wcf, wco : [H] arrays or None
    outputs : sequence of 6 or 7 [T, B, H] arrays
    cs_grad, h_grad : [T, B, H] arrays
    seq_len_max : int
        ``1 <= seq_len_max <= T``, and ``B, H >= 1``.
    w_rec : [H, 4H] array
    options : nblstm.options.OpOptions
        ``use_peephole`` and ``layout`` are read.
    dgates : [S, B, 4H] array
        Output: gradients of the gate pre-activations, caller's layout.
    dc : [B, H] array, zero
        Output: ``cs_prev_grad`` (the carried cell gradient).
    peephole_grads : sequence of 3 [H] arrays
        Output with ``use_peephole`` (left alone otherwise).
    """
    batch, units = cs_prev.shape
    s = seq_len_max
    blocks_layout = _blocks(options.layout)
    saved = ForwardOutputs(*outputs[:6])
    weights = RecurrentWeights(w_rec, *(w_rec[0] if p is None else p for p in (wci, wcf, wco)))
    common = (saved, OutputGrads(cs_grad, h_grad), weights, run.one, run.kernel_options(options), blocks_layout,
              BackwardResults(dgates, dc))
    args = (cs_prev, *common)

    def gemm_steps():
        # Per step: dh = dgates[t + 1] @ W_h^T (cuBLAS; none at the last step), then the gate maths.
        dh = run.scratch((batch, units))
        product = run.step_product(w_rec, batch, trans_b=True)
        gates = run.repeat_linear(backward_gates, batch * units, (s, dh, cs_prev, *common))
        dgate_rows = dgates.reshape(s * batch, 4 * units)
        for t in range(s - 1, -1, -1):
            if t + 1 < s:
                product(dgate_rows, (t + 1) * batch, dh, 0)
            gates(t)

    run.recurrence(backward_persistent, backward_step, args, s, batch, units, reverse=True,
                   step_args=(s,), resident=backward_resident, gemm_steps=gemm_steps)
    if options.use_peephole:
        run.peephole_grads(s, cs_prev, saved.cs, dgates, blocks_layout, peephole_grads)


def _backward_device(run, x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, options):
    """Whole-sequence backward on prepared device arrays of the compute dtype.

    Returns
    -------
    list
        ``[x_grad [T, B, I], cs_prev_grad [B, H], h_prev_grad [B, H],
        w_grad [I + H, 4H], wci_grad, wcf_grad, wco_grad [H], b_grad [4H]]``
        from :meth:`~nblstm.cuda.launch.Launcher.finish` (views of one allocation).
    """
    steps, batch, inputs = x.shape
    units = cs_prev.shape[1]
    gates = 4 * units
    # Laid out so that everything to zero is one range: the tail of x_grad,
    # dc, and the peephole gradients.
    shapes = [(steps, batch, inputs), (batch, units), (units,), (units,), (units,), (batch, units),
              (inputs + units, gates), (gates,)]
    offsets, total = regions(run, shapes)
    flat = run.results(total)
    x_grad, dc, wci_grad, wcf_grad, wco_grad, h_prev_grad, w_grad, b_grad = (
        flat[o:o + size(shape)].reshape(shape) for o, shape in zip(offsets, shapes, strict=True))
    parts = [(offsets[k], shapes[k]) for k in (0, 1, 5, 6, 2, 3, 4, 7)]
    s = seq_len_max if batch and units else 0
    if s == 0:
        run.fill_zero(flat)
        return run.finish(parts)
    zero_end = offsets[5] if not options.use_peephole else offsets[2]
    run.fill_zero(flat[s * batch * inputs:zero_end])
    w_rec = w[inputs:]
    dgates = run.scratch((s, batch, gates))
    _backward_recurrent(run, cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, s, w_rec, options, dgates, dc,
                        (wci_grad, wcf_grad, wco_grad))
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


def block_lstm(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, options, stream=None):
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
    options : nblstm.options.OpOptions
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
    with call(named, stream, precision=options.precision) as run:
        peep = (wci, wcf, wco) if options.use_peephole else (None, None, None)
        x, cs_prev, h_prev, w, b, wci, wcf, wco = run.prepare(x, cs_prev, h_prev, w, b, *peep)
        steps, batch, _ = x.shape
        units = cs_prev.shape[1]
        n = steps * batch * units
        out = run.results(7 * n).reshape(7, steps, batch, units)
        _forward_device(run, x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, options, out)
        return run.finish([(k * n, (steps, batch, units)) for k in range(7)])


def block_lstm_grad(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, options, stream=None):
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
    options : nblstm.options.OpOptions
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
        As :func:`block_lstm`.
    """
    names = ("i", "cs", "f", "o", "ci", "co", "h")
    named = {"x": x, "cs_prev": cs_prev, "h_prev": h_prev, "w": w, "wci": wci, "wcf": wcf, "wco": wco,
             **dict(zip(names, outputs, strict=False)), "cs_grad": cs_grad, "h_grad": h_grad}
    with call(named, stream, precision=options.precision) as run:
        peep = (wci, wcf, wco) if options.use_peephole else (None, None, None)
        x, cs_prev, h_prev, w, wci, wcf, wco, cs_grad, h_grad, *outputs = run.prepare(
            x, cs_prev, h_prev, w, *peep, cs_grad, h_grad, *outputs)
        steps, batch, _ = x.shape
        units = cs_prev.shape[1]
        cs_grad, h_grad = (run.read_only_zeros((steps, batch, units)) if g is None else g for g in (cs_grad, h_grad))
        return _backward_device(run, x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max,
                                options)


def lstm_block_cell(x, cs_prev, h_prev, w, b, wci, wcf, wco, options, stream=None):
    """One step (LSTMBlockCell) of validated GPU arrays.

    ``x: [B, I]``; the other parameters as :func:`block_lstm`. Returns the seven
    ``[B, H]`` outputs ``[i, cs, f, o, ci, co, h]`` (views of one allocation).
    """
    named = {"x": x, "cs_prev": cs_prev, "h_prev": h_prev, "w": w, "b": b, "wci": wci, "wcf": wcf, "wco": wco}
    with call(named, stream, precision=options.precision) as run:
        peep = (wci, wcf, wco) if options.use_peephole else (None, None, None)
        x, cs_prev, h_prev, w, b, wci, wcf, wco = run.prepare(x, cs_prev, h_prev, w, b, *peep)
        batch, inputs = x.shape
        units = cs_prev.shape[1]
        n = batch * units
        out = run.results(7 * n).reshape(7, 1, batch, units)
        _forward_device(run, x.reshape(1, batch, inputs), cs_prev, h_prev, w, b, wci, wcf, wco, 1, options, out)
        return run.finish([(k * n, (batch, units)) for k in range(7)])


def lstm_block_cell_grad(cs_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, options, stream=None):
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
    options : nblstm.options.OpOptions
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
    with call(named, stream) as run:
        peep = (wci, wcf, wco) if options.use_peephole else (None, None, None)
        cs_prev, w, wci, wcf, wco, cs_grad, h_grad, *outputs = run.prepare(cs_prev, w, *peep, cs_grad, h_grad,
                                                                            *outputs[:6])
        batch, units = cs_prev.shape
        outputs = [a.reshape(1, batch, units) for a in outputs]
        cs_grad, h_grad = (run.read_only_zeros((1, batch, units)) if g is None else g.reshape(1, batch, units)
                           for g in (cs_grad, h_grad))
        # dc and the peephole gradients first: one range to zero.
        shapes = [(batch, units), (units,), (units,), (units,), (batch, 4 * units)]
        offsets, total = regions(run, shapes)
        flat = run.results(total)
        dc, wci_grad, wcf_grad, wco_grad, dgates = (
            flat[o:o + size(shape)].reshape(shape) for o, shape in zip(offsets, shapes, strict=True))
        parts = [(offsets[k], shapes[k]) for k in (0, 4, 1, 2, 3)]
        if batch == 0 or units == 0:
            run.fill_zero(flat)
        else:
            run.fill_zero(flat[:offsets[4] if not options.use_peephole else offsets[1]])
            _backward_recurrent(run, cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, 1, w[w.shape[0] - units:],
                                options, dgates.reshape(1, batch, 4 * units), dc, (wci_grad, wcf_grad, wco_grad))
        return run.finish(parts)
