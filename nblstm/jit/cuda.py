"""Device functions of :mod:`nblstm.jit`: LSTM units and steps to call from your own ``@cuda.jit`` kernels.

Importing this module imports ``numba.cuda`` (``nblstm.jit`` itself does
not). The functions compile into the kernel that calls them. Two levels:

- :func:`lstm_unit` and :func:`lstm_unit_grad` (``@cuda.jit(device=True)``):
  the gate maths of one hidden unit from its four gate pre-activations (a
  kernel that computes its own matrix products),
  :func:`nblstm.spec.forward_unit` and :func:`nblstm.spec.backward_unit`,
  what the fused ops run on both targets.
- :func:`lstm_step_at`, :func:`lstm_step_train_at` and
  :func:`lstm_step_grad_at`: one element ``(row, unit)`` of a whole step,
  the gate pre-activations included, for a kernel with a thread per
  element of the ``[B, H]`` state (each thread reads its unit's four
  columns of ``w``: simple, not the fastest; the fused ops' kernels tile
  the product in shared memory). Their bodies are inlined into the calling
  kernel (a CUDA ``overload``), where they pass their arguments on in the
  records of :mod:`nblstm.jit.cpu` (:class:`~nblstm.jit.cpu.JitOptions`,
  :class:`~nblstm.jit.cpu.StepInputs`, ...) to the device functions that do
  the work, which take at most 12 parameters.

The arguments are those of the CPU functions of :mod:`nblstm.jit`:
``forget_bias``, ``cell_clip`` (``<= 0`` for none), ``use_peephole`` and
the layout code :data:`~nblstm.jit.IFCO` / :data:`~nblstm.jit.ICFO`. The
compute type is the dtype of the arrays (float32 or float64). The element
functions sum each gate's products over ``k = 0 .. I + H - 1`` in order with
fused multiply-adds, as the CPU functions do.
"""

import inspect

from numba import cuda, njit

try:  # numba-cuda (the cuda extra)
    from numba.cuda.extending import overload
except ImportError:  # numba's own numba.cuda: its overload takes the target
    from numba.extending import overload

from ..spec import UnitOptions, backward_unit, cast_like, fma, forward_unit
from .cpu import ICFO, IFCO, JitOptions, OutputGrads, Peepholes, StepInputs, StepOutputs, layout_code

__all__ = [
    "ICFO",
    "IFCO",
    "layout_code",
    "lstm_step_at",
    "lstm_step_grad_at",
    "lstm_step_train_at",
    "lstm_unit",
    "lstm_unit_grad",
]


# Helpers that are plain @njit functions: on the GPU numba compiles them as device functions; in numba's CUDA
# simulator, which runs kernels as Python, they run compiled for the CPU (an intrinsic such as the fused
# multiply-add cannot be called from Python).


@njit(inline="always")
def _fused(a, b, c):
    """``a * b + c`` rounded once."""
    return fma(a, b, c)


@njit(inline="always")
def _blocks(layout):
    """``(bi, bc, bf, bo)``: the block (0..3) of the gates ``i, ci, f, o`` in the 4H columns."""
    if layout == IFCO:
        return 0, 2, 1, 3
    return 0, 1, 2, 3


@njit(inline="always")
def _unit_options(options, one):
    """The unit functions' :class:`~nblstm.spec.UnitOptions` of ``options`` (:class:`~nblstm.jit.cpu.JitOptions`)
    in the type of ``one``: clipping is on when the bound is > 0 in that type. The device functions' one place for
    it (the gradients' options carry zeros for the floats, not read)."""
    clip = cast_like(options.cell_clip, one)
    return UnitOptions(cast_like(options.forget_bias, one), clip, clip > one - one, 0, options.use_peephole, one)


@njit(inline="always")
def _unit(a_i, a_c, a_f, a_o, c_prev, peepholes, options):
    """:func:`nblstm.spec.forward_unit` in the type of ``c_prev``, the peephole weights ``(wci, wcf, wco)`` not read
    without peepholes. The unit options are built here, in compiled code: in the simulator a record returned to
    Python would carry its float32 fields as Python floats (float64)."""
    unit = _unit_options(options, cast_like(1.0, c_prev))
    wci, wcf, wco = peepholes
    if not unit.use_peepholes:  # not read: TensorFlow's semantics (a non-finite weight has no effect)
        wci = wcf = wco = unit.one - unit.one
    return forward_unit(a_i, a_c, a_f, a_o, c_prev, (wci, wcf, wco), unit)


@njit(inline="always")
def _unit_grad(dh, dcs, i, ci, f, o, co, c_prev, peepholes, options):
    """:func:`nblstm.spec.backward_unit` in the type of ``c_prev``, the peephole weights not read without
    peepholes."""
    unit = _unit_options(options, cast_like(1.0, c_prev))
    wci, wcf, wco = peepholes
    if not unit.use_peepholes:
        wci = wcf = wco = unit.one - unit.one
    return backward_unit(dh, dcs, i, ci, f, o, co, c_prev, (wci, wcf, wco), unit)


def _in_kernels(function):
    """Make ``function`` a device function whose body is compiled into the kernel that calls it (numba inlines it
    there). The public element functions are such Python functions: they keep their documented argument lists and
    pass them on in the records of :mod:`nblstm.jit.cpu` to the device functions that do the work (the one place
    where the device functions' records are built). In the simulator, which runs kernels as Python, they run as
    Python too."""

    def typing(*args):
        return function

    typing.__signature__ = inspect.signature(function)
    overload(function, target="cuda", inline="always")(typing)
    return function


@cuda.jit(device=True)
def lstm_unit(a_i, a_c, a_f, a_o, c_prev, wci, wcf, wco, forget_bias, cell_clip, use_peephole):
    """The forward gate maths of one hidden unit for one step (a device function).

    Parameters
    ----------
    a_i, a_c, a_f, a_o : scalar
        The unit's pre-activations of the input gate, the cell input, the
        forget gate and the output gate: its entries of ``[x, h_prev] @ w + b``.
    c_prev : scalar
        The unit's previous cell state; its type is the compute type.
    wci, wcf, wco : scalar
        The unit's peephole weights (not read without ``use_peephole``).
    forget_bias, cell_clip : float
        As in :func:`nblstm.jit.lstm_step` (``cell_clip <= 0``: no clipping).
    use_peephole : bool

    Returns
    -------
    tuple
        ``(i, ci, f, o, cs, co, h)``, the unit's outputs of :func:`nblstm.lstm_block_cell`.
    """
    one = cast_like(1.0, c_prev)
    return _unit(cast_like(a_i, one), cast_like(a_c, one), cast_like(a_f, one), cast_like(a_o, one), c_prev,
                 (cast_like(wci, one), cast_like(wcf, one), cast_like(wco, one)),
                 JitOptions(forget_bias, cell_clip, use_peephole, IFCO))


@cuda.jit(device=True)
def lstm_unit_grad(dh, dcs, i, ci, f, o, co, c_prev, wci, wcf, wco, use_peephole):
    """The gradient of one hidden unit's gate maths for one step (a device function).

    Parameters
    ----------
    dh, dcs : scalar
        Total gradients of the unit's ``h`` and ``cs`` (from the loss and the next step).
    i, ci, f, o, co : scalar
        The unit's saved outputs of the step.
    c_prev : scalar
        Its previous cell state; its type is the compute type.
    wci, wcf, wco : scalar
        Peephole weights (not read without ``use_peephole``).
    use_peephole : bool

    Returns
    -------
    tuple
        ``(di, dci, df, do, dc_prev)``: the gradients of the four gate
        pre-activations and of ``c_prev``. The peephole gradients are
        ``di * c_prev``, ``df * c_prev`` and ``do * cs``, summed over the batch.
    """
    one = cast_like(1.0, c_prev)
    return _unit_grad(cast_like(dh, one), cast_like(dcs, one), cast_like(i, one), cast_like(ci, one),
                      cast_like(f, one), cast_like(o, one), cast_like(co, one), c_prev,
                      (cast_like(wci, one), cast_like(wcf, one), cast_like(wco, one)),
                      JitOptions(0.0, 0.0, use_peephole, IFCO))


@cuda.jit(device=True)
def _gate_sums(row, unit, x, h_prev, w, b, layout):
    """Unit ``unit`` of row ``row``: its four columns of ``[x, h_prev] @ w`` plus ``b``, ``(a_i, a_c, a_f, a_o)``."""
    inputs = x.shape[1]
    units = h_prev.shape[1]
    bi, bc, bf, bo = _blocks(layout)
    ci, cc, cf, co = bi * units + unit, bc * units + unit, bf * units + unit, bo * units + unit
    zero = cast_like(0.0, w[0, 0])
    s_i = zero
    s_c = zero
    s_f = zero
    s_o = zero
    for k in range(inputs + units):
        z = x[row, k] if k < inputs else h_prev[row, k - inputs]
        s_i = cast_like(_fused(z, w[k, ci], s_i), zero)
        s_c = cast_like(_fused(z, w[k, cc], s_c), zero)
        s_f = cast_like(_fused(z, w[k, cf], s_f), zero)
        s_o = cast_like(_fused(z, w[k, co], s_o), zero)
    return s_i + b[ci], s_c + b[cc], s_f + b[cf], s_o + b[co]


@cuda.jit(device=True)
def _element(row, unit, inputs, w, b, peepholes, options):
    """``(i, ci, f, o, cs, co, h)`` of element ``(row, unit)`` of a step: ``inputs`` a
    :class:`~nblstm.jit.cpu.StepInputs`, ``peepholes`` a :class:`~nblstm.jit.cpu.Peepholes` of ``[H]`` arrays,
    ``options`` a :class:`~nblstm.jit.cpu.JitOptions`."""
    a_i, a_c, a_f, a_o = _gate_sums(row, unit, inputs.x, inputs.h_prev, w, b, options.layout)
    c_prev = inputs.cs_prev[row, unit]
    peephole = (peepholes.wci[unit], peepholes.wcf[unit], peepholes.wco[unit])
    return _unit(a_i, a_c, a_f, a_o, c_prev, peephole, options)


@cuda.jit(device=True)
def _step_train_element(row, unit, inputs, w, b, peepholes, options, out):
    """:func:`lstm_step_train_at` on its records: ``out`` a :class:`~nblstm.jit.cpu.StepOutputs` of ``[B, H]``
    arrays."""
    i, ci, f, o, cs, co, h = _element(row, unit, inputs, w, b, peepholes, options)
    out.i[row, unit] = i
    out.cs[row, unit] = cs
    out.f[row, unit] = f
    out.o[row, unit] = o
    out.ci[row, unit] = ci
    out.co[row, unit] = co
    out.h[row, unit] = h


@cuda.jit(device=True)
def _step_element(row, unit, inputs, w, b, peepholes, options, out_cs, out_h):
    """:func:`lstm_step_at` on its records."""
    _, _, _, _, cs, _, h = _element(row, unit, inputs, w, b, peepholes, options)
    out_cs[row, unit] = cs
    out_h[row, unit] = h


@cuda.jit(device=True)
def _step_grad_element(row, unit, cs_prev, saved, grads, peepholes, options, out_cs_prev_grad, out_dicfo):
    """:func:`lstm_step_grad_at` on its records: ``saved`` a :class:`~nblstm.jit.cpu.StepOutputs` (``h`` not
    read), ``grads`` an :class:`~nblstm.jit.cpu.OutputGrads` of ``[B, H]`` arrays."""
    units = cs_prev.shape[1]
    c_prev = cs_prev[row, unit]
    one = cast_like(1.0, c_prev)
    peephole = (peepholes.wci[unit], peepholes.wcf[unit], peepholes.wco[unit])
    di, dci, df, do, dc_prev = _unit_grad(grads.h_grad[row, unit], grads.cs_grad[row, unit], saved.i[row, unit],
                                          saved.ci[row, unit], saved.f[row, unit], saved.o[row, unit],
                                          saved.co[row, unit], c_prev, peephole, options)
    bi, bc, bf, bo = _blocks(options.layout)
    out_dicfo[row, bi * units + unit] = di
    out_dicfo[row, bc * units + unit] = dci
    out_dicfo[row, bf * units + unit] = df
    out_dicfo[row, bo * units + unit] = do
    out_cs_prev_grad[row, unit] = dc_prev
    if options.use_peephole:
        return cast_like(di * c_prev, one), cast_like(df * c_prev, one), cast_like(do * saved.cs[row, unit], one)
    zero = one - one
    return zero, zero, zero


@_in_kernels
def lstm_step_train_at(row, unit, x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole,
                       layout, out_i, out_cs, out_f, out_o, out_ci, out_co, out_h):
    """Element ``(row, unit)`` of one step, all seven outputs (a device function).

    Parameters
    ----------
    row, unit : int
        The batch row and the hidden unit this thread computes.
    x : [B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    b : [4H] array
    wci, wcf, wco : [H] arrays
    forget_bias, cell_clip, use_peephole, layout
        As :func:`nblstm.jit.lstm_step`.
    out_i, out_cs, out_f, out_o, out_ci, out_co, out_h : [B, H] arrays
        Element ``(row, unit)`` is written. They must not be ``cs_prev`` or
        ``h_prev``: other threads read the whole row of ``h_prev``.

    Notes
    -----
    Nothing is checked: the caller keeps ``row < B`` and ``unit < H``.
    """
    _step_train_element(row, unit, StepInputs(x, cs_prev, h_prev), w, b, Peepholes(wci, wcf, wco),
                        JitOptions(forget_bias, cell_clip, use_peephole, layout),
                        StepOutputs(out_i, out_cs, out_f, out_o, out_ci, out_co, out_h))


@_in_kernels
def lstm_step_at(row, unit, x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout,
                 out_cs, out_h):
    """Element ``(row, unit)`` of one step: the new cell state and output (a device function).

    Parameters
    ----------
    row, unit, x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout
        As :func:`lstm_step_train_at`.
    out_cs, out_h : [B, H] arrays
        Element ``(row, unit)`` is written (not ``cs_prev`` or ``h_prev``).
    """
    _step_element(row, unit, StepInputs(x, cs_prev, h_prev), w, b, Peepholes(wci, wcf, wco),
                  JitOptions(forget_bias, cell_clip, use_peephole, layout), out_cs, out_h)


@_in_kernels
def lstm_step_grad_at(row, unit, cs_prev, i, cs, f, o, ci, co, cs_grad, h_grad, wci, wcf, wco, use_peephole, layout,
                      out_cs_prev_grad, out_dicfo):
    """Element ``(row, unit)`` of one step's gradient (LSTMBlockCellGrad; a device function).

    Parameters
    ----------
    row, unit : int
    cs_prev, i, cs, f, o, ci, co, cs_grad, h_grad : [B, H] arrays
    wci, wcf, wco : [H] arrays
    use_peephole, layout
        As :func:`nblstm.jit.lstm_step_grad`.
    out_cs_prev_grad : [B, H] array
        Element ``(row, unit)`` is written (it may be ``cs_grad``).
    out_dicfo : [B, 4H] array
        The unit's four gate gradients of row ``row`` are written.

    Returns
    -------
    tuple
        ``(wci_grad, wcf_grad, wco_grad)``: this element's terms of the
        peephole gradients (zeros without peepholes), for the caller to sum
        over the batch (``cuda.atomic.add``, or a reduction).
    """
    return _step_grad_element(row, unit, cs_prev, StepOutputs(i, cs, f, o, ci, co, cs), OutputGrads(cs_grad, h_grad),
                              Peepholes(wci, wcf, wco), JitOptions(0.0, 0.0, use_peephole, layout), out_cs_prev_grad,
                              out_dicfo)
