"""The CPU functions of :mod:`nblstm.jit`: LSTM steps and sequences to call from Python or from ``@njit`` code.

Each public function is a Python function with a numba typing and lowering
(:func:`_declare`): called from jitted code, the call is compiled into the
caller as a few lines that build the kernel's records and call the
function's kernel (``_..._kernel`` below). The kernels take their arguments
in records (:class:`JitOptions`, the options as float64, bool and int64;
NamedTuples of arrays typed as arrays of any layout: :class:`StepInputs`,
:class:`Peepholes`, :class:`StepOutputs`, :class:`OutputGrads`,
:class:`StepGrads`, :class:`SequenceGrads`), at most 12 parameters. So a
kernel is compiled once per dtype however it is called: numba types an
``int`` or ``bool`` constant written in a caller's code as a literal of its
value, and C-contiguous, strided and read-only arrays as different types,
and would compile a plain ``@njit`` function again for each. Called from
Python, the function checks its arguments and runs a jitted entry point that
makes the same call (its arguments in plain tuples, which dispatch at about
the cost of their fields: the records are built in compiled code).

Inside, the kernels work on C-contiguous arrays, which LLVM vectorizes: an
argument whose memory is C-contiguous is used in place, any other is copied
(:func:`_c_in`, :func:`_c_out`). The gate maths is
:func:`nblstm.spec.forward_unit` and :func:`nblstm.spec.backward_unit`, what
the fused ops run, and the matrix products run on the fused ops'
micro-kernel (:mod:`nblstm.cpu.microkernel`): each element of a product is
one accumulator summed over its terms in order with fused multiply-adds,
however the work is tiled, so that a step gives the fused ops' bits where
their step runs its whole product on the micro-kernel. No BLAS is called and
no thread is started: the functions run on the caller's thread, and may be
called from ``prange`` loops.

Everything is compiled with :data:`nblstm._jit.KERNEL` (``cache=True``: a
later process loads the machine code from numba's cache).
"""

import inspect
from typing import NamedTuple

import numpy as np
from numba import njit, types
from numba.core import cgutils, errors
from numba.core.imputils import impl_ret_borrowed, lower_builtin, user_function
from numba.extending import intrinsic, type_callable

from .._jit import KERNEL, full_width
from .._validate import check_bool, check_real, check_seq_len_max
from ..cpu import microkernel
from ..spec import UnitOptions, backward_unit, forward_unit

__all__ = [
    "ICFO",
    "IFCO",
    "layout_code",
    "lstm_backward",
    "lstm_forward",
    "lstm_step",
    "lstm_step_grad",
    "lstm_step_input_grads",
    "lstm_step_train",
    "lstm_step_weight_grads",
]

#: Layout code of the gate order ``i, f, c, o`` (BlockLSTMV2, Keras, PyTorch, cuDNN).
IFCO = 0
#: Layout code of the gate order ``i, c, f, o`` (BlockLSTM V1, TF1 ``LSTMCell``).
ICFO = 1

_LAYOUT_CODES = {"ifco": IFCO, "icfo": ICFO}

def layout_code(layout):
    """The integer code of a gate layout, as the functions of :mod:`nblstm.jit` take it.

    Parameters
    ----------
    layout : {"ifco", "icfo"} or int
        The name, or a code already (returned unchanged).

    Returns
    -------
    int
        :data:`IFCO` (0) or :data:`ICFO` (1).

    Raises
    ------
    ValueError
        Another name or code.

    Examples
    --------
    >>> from nblstm.jit import layout_code
    >>> layout_code("ifco"), layout_code("icfo")
    (0, 1)
    """
    if isinstance(layout, str):
        code = _LAYOUT_CODES.get(layout.lower())
        if code is not None:
            return code
    elif isinstance(layout, (int, np.integer)) and not isinstance(layout, bool) and int(layout) in (IFCO, ICFO):
        return int(layout)
    raise ValueError(f"layout must be 'ifco' or 'icfo' (or their codes 0 and 1), got {layout!r}")


# -- the kernels' records ---------------------------------------------------------------------------------------
#
# The kernels take their arguments grouped into records (NamedTuples), the options as one :class:`JitOptions`:
# compiled code passes a record as its fields, and one built and read in compiled code costs nothing there. They
# are built in compiled code, by the lowering of a public function's call (:func:`_declare`), whether the call comes
# from a user's jitted code or from Python through an entry point: a NamedTuple built in Python costs its dispatch
# about 2.5 us a call more than its fields passed alone (measured here; a plain tuple of the same fields, about 0.1 us
# more), so the entry points take the public arguments as plain tuples. The kernel functions of nblstm.jit.cuda take
# the same records.


class JitOptions(NamedTuple):
    """The option scalars of a call of :mod:`nblstm.jit`, as the kernels of both targets take them.

    Built where a public function's call is compiled (float64, bool and int64 fields, so that one kernel serves
    every value); each target turns it into the unit functions' :class:`~nblstm.spec.UnitOptions` in the compute
    type, where it also decides whether clipping is on (``cell_clip > 0`` in that type).

    Attributes
    ----------
    forget_bias : float
        ``0.0`` in the gradients' calls (not read).
    cell_clip : float
        ``<= 0``: no clipping; ``0.0`` in the gradients' calls (clipping is the identity there).
    use_peephole : bool
    layout : int
        :data:`IFCO` or :data:`ICFO`.
    """

    forget_bias: float
    cell_clip: float
    use_peephole: bool
    layout: int


class StepInputs(NamedTuple):
    """A step's input and the state it starts from.

    Attributes
    ----------
    x : [B, I] array
        ``[T, B, I]`` for a sequence.
    cs_prev, h_prev : [B, H] arrays
    """

    x: object
    cs_prev: object
    h_prev: object


class Peepholes(NamedTuple):
    """The peephole weights, or their gradients.

    Attributes
    ----------
    wci, wcf, wco : [H] arrays
    """

    wci: object
    wcf: object
    wco: object


class StepOutputs(NamedTuple):
    """The seven outputs of LSTMBlockCell, written by a forward and read by its gradient.

    Attributes
    ----------
    i, cs, f, o, ci, co, h : [B, H] arrays
        ``[T, B, H]`` for a sequence, ``[H]`` for one batch row. A call that writes or reads only some of them
        passes another of them in the others' places (:func:`lstm_step`: ``cs``; :func:`lstm_step_grad`: ``h``
        is ``cs``).
    """

    i: object
    cs: object
    f: object
    o: object
    ci: object
    co: object
    h: object


class OutputGrads(NamedTuple):
    """Gradients of a step's cell state and output (from the loss, or carried from the next step).

    Attributes
    ----------
    cs_grad, h_grad : [B, H] arrays
        ``[T, B, H]`` for a sequence, ``[H]`` for one batch row.
    """

    cs_grad: object
    h_grad: object


class StepGrads(NamedTuple):
    """The outputs of :func:`lstm_step_grad`.

    Attributes
    ----------
    cs_prev_grad : [B, H] array
    dicfo : [B, 4H] array
    peephole_grads : Peepholes
        Of ``[H]`` arrays, added to.
    """

    cs_prev_grad: object
    dicfo: object
    peephole_grads: Peepholes


class SequenceGrads(NamedTuple):
    """The outputs of :func:`lstm_backward`.

    Attributes
    ----------
    x_grad : [T, B, I] array
    cs_prev_grad, h_prev_grad : [B, H] arrays
    w_grad : [I + H, 4H] array
    peephole_grads : Peepholes
        Of ``[H]`` arrays.
    b_grad : [4H] array
    """

    x_grad: object
    cs_prev_grad: object
    h_prev_grad: object
    w_grad: object
    peephole_grads: Peepholes
    b_grad: object


# -- C-contiguous views and copies ------------------------------------------------------------------------------
#
# The kernels take arrays of any layout (one compiled kernel for all); their loops run on C-contiguous arrays,
# which LLVM vectorizes (on arrays of layout "A" the loops ran 7x slower, scalar). An argument whose memory is
# C-contiguous is used in place, typed as such (:func:`_c_view`); any other is copied in (and an output copied
# back at the end).


@intrinsic
def _c_view(typingctx, a):
    """``a`` typed as a writable C-contiguous array (same data). Only for an array whose strides are C-contiguous
    (:func:`_is_c`); inputs are never written through it (writable so that the kernels they reach are the ones
    the fused ops compile)."""
    if not isinstance(a, types.Array):
        return None
    target = a.copy(layout="C", readonly=False)

    def codegen(context, builder, signature, args):
        return impl_ret_borrowed(context, builder, target, args[0])

    return target(a), codegen


@njit(**KERNEL)
def _is_c(a):
    """Whether the elements of ``a`` lie in C order with no gaps (dimensions of length 1 may have any stride)."""
    if a.size == 0:
        return True
    expected = a.itemsize
    for d in range(a.ndim - 1, -1, -1):
        if a.shape[d] != 1 and a.strides[d] != expected:
            return False
        expected *= a.shape[d]
    return True


@njit(**KERNEL)
def _c_in(a):
    """An input as a C-contiguous array: ``a`` itself, or a copy."""
    if _is_c(a):
        return _c_view(a)
    return a.copy()


@njit(**KERNEL)
def _c_out(a):
    """An output as a C-contiguous array: ``a`` itself, or an uninitialised array to copy back (:func:`_c_back`)."""
    if _is_c(a):
        return _c_view(a)
    return np.empty(a.shape, a.dtype)


@njit(**KERNEL)
def _c_back(c, a):
    """Copy ``c`` into the caller's ``a`` unless it is ``a`` itself (element by element: an array assignment
    would compile numba's message for mismatched shapes, seconds)."""
    if not _is_c(a):
        for index in np.ndindex(a.shape):
            a[index] = c[index]


# -- the matrix products, on the micro-kernel of nblstm.cpu ----------------------------------------------------


@njit(inline="always")
def _padded(count, like):
    """``count`` rounded up to a multiple of the micro-kernel's panel width for the dtype of ``like``."""
    width = microkernel.panel_width_of(like)
    return -(-count // width) * width


@njit(**KERNEL)
def _pack(w):
    """``w: [K, N]`` (C-contiguous) in the micro-kernel's panels: the right operand of ``a @ w``, ``[K, N']``
    flattened, ``N'`` the padded ``N``."""
    depth, cols = w.shape
    width = microkernel.panel_width_of(w)
    packed = np.empty(depth * _padded(cols, w), w.dtype)
    microkernel.pack_columns(w, np.int64(0), cols, packed, np.int64(0), np.int64(0), width)
    microkernel.zero_columns(packed, np.int64(0), depth, cols, width)
    return packed


@njit(**KERNEL)
def _pack_transposed(w):
    """``w.T`` in the micro-kernel's panels (``w: [N, K]`` C-contiguous): the right operand of ``a @ w.T``."""
    rows, depth = w.shape
    width = microkernel.panel_width_of(w)
    packed = np.empty(depth * _padded(rows, w), w.dtype)
    microkernel.pack_rows(w, np.int64(0), rows, packed, np.int64(0), np.int64(0), width)
    microkernel.zero_columns(packed, np.int64(0), depth, rows, width)
    return packed


@njit(inline="always")
def _product(a, packed, out, accumulate):
    """``out = a @ W`` (``out += a @ W`` with ``accumulate``): ``a: [M, K]``, ``W`` packed (:func:`_pack`),
    ``out: [M, N']`` (``N'`` padded), all C-contiguous. Each element is one accumulator over ``k = 0 .. K-1`` in
    order (fused multiply-adds), from zero or from ``out``."""
    rows, depth = a.shape
    cols = out.shape[1]
    if rows > 0 and cols > 0:
        microkernel.gemm_panels(a.reshape(-1), np.int64(0), depth, rows, packed, np.int64(0), depth,
                                cols // microkernel.panel_width_of(out), out.reshape(-1), np.int64(0), cols,
                                accumulate)


@njit(inline="always")
def _join_rows(z, x, h):
    """``z = [x, h]`` row by row (``z: [B, I + H]``)."""
    inputs = x.shape[1]
    for r in range(z.shape[0]):
        zr, xr, hr = z[r], x[r], h[r]
        for k in range(inputs):
            zr[k] = xr[k]
        for k in range(hr.shape[0]):
            zr[inputs + k] = hr[k]


# -- the gate maths of a batch row --------------------------------------------------------------------------------


@njit(inline="always")
def _gate_blocks(layout):
    """``(bi, bc, bf, bo)``: the block (0..3) of the gates ``i, ci, f, o`` in the 4H columns."""
    if layout == IFCO:
        return 0, 2, 1, 3
    return 0, 1, 2, 3


@njit(inline="always")
def _unit_options(options, like):
    """The unit functions' :class:`~nblstm.spec.UnitOptions` of ``options`` (:class:`JitOptions`) in the compute
    type, the dtype of the array ``like``: clipping is on when the bound is > 0 in that type. The CPU kernels' one
    place for it (the gradients' options carry zeros for the floats, not read)."""
    scalar = like.dtype.type
    clip = scalar(options.cell_clip)
    return UnitOptions(scalar(options.forget_bias), clip, clip > 0, 0, options.use_peephole, scalar(1.0))


@njit(inline="always")
def _row(out, r):
    """Row ``r`` of each output of ``out`` (:class:`StepOutputs` of ``[B, H]`` arrays): ``[H]`` views."""
    return StepOutputs(out.i[r], out.cs[r], out.f[r], out.o[r], out.ci[r], out.co[r], out.h[r])


@njit(**KERNEL)
def _units(g, bias, c_prev, peepholes, unit, layout, save, out):
    """The gate maths of one batch row: ``g`` the row's ``[x, h_prev] @ w`` (``[4H]`` or longer), ``c_prev`` its
    ``[H]`` previous cell state, ``peepholes`` the ``[H]`` weights; writes ``out`` (:class:`StepOutputs` of ``[H]``
    rows: only ``cs`` and ``h`` without ``save``). As the fused forward kernel: ``forward_unit(g + b, ...)``."""
    full_width()
    units = c_prev.shape[0]
    bi, bc, bf, bo = _gate_blocks(layout)
    wci, wcf, wco = peepholes
    i_, cs_, f_, o_, ci_, co_, h_ = out
    use_peephole = unit.use_peepholes
    zero = unit.one - unit.one
    # Each gate's columns sliced, so that the unit loop indexes from 0 and LLVM vectorizes it.
    gi, gc = g[bi * units:(bi + 1) * units], g[bc * units:(bc + 1) * units]
    gf, go = g[bf * units:(bf + 1) * units], g[bo * units:(bo + 1) * units]
    si, sc = bias[bi * units:(bi + 1) * units], bias[bc * units:(bc + 1) * units]
    sf, so = bias[bf * units:(bf + 1) * units], bias[bo * units:(bo + 1) * units]
    for u in range(units):
        pi = wci[u] if use_peephole else zero
        pf = wcf[u] if use_peephole else zero
        po = wco[u] if use_peephole else zero
        i, ci, f, o, cs, co, h = forward_unit(gi[u] + si[u], gc[u] + sc[u], gf[u] + sf[u], go[u] + so[u], c_prev[u],
                                              (pi, pf, po), unit)
        cs_[u] = cs
        h_[u] = h
        if save:
            i_[u] = i
            f_[u] = f
            o_[u] = o
            ci_[u] = ci
            co_[u] = co


@njit(**KERNEL)
def _units_grad(c_prev, saved, grads, carried, peepholes, unit, layout, dicfo, dc_out, peephole_grads):
    """The gradient of one batch row's gate maths, as the fused backward kernel computes it (its order of operations).

    ``[H]`` rows: ``saved`` (:class:`StepOutputs`, ``h`` not read), ``grads`` and ``carried``
    (:class:`OutputGrads`: the gradients of the loss and those carried from the next step, added together);
    ``peepholes`` and ``peephole_grads`` (:class:`Peepholes`) ``[H]`` arrays. Writes ``dicfo`` (``[4H]``,
    ``layout`` order) and ``dc_out`` (the ``cs_prev`` gradient; it may be ``carried.cs_grad`` or ``grads.cs_grad``:
    each element is read before it is written); adds the row's peephole gradients.
    """
    full_width()
    units = c_prev.shape[0]
    bi, bc, bf, bo = _gate_blocks(layout)
    i_, cs_, f_, o_, ci_, co_, _ = saved
    cs_grad, h_grad = grads
    dc_in, dh = carried
    wci, wcf, wco = peepholes
    use_peephole = unit.use_peepholes
    zero = unit.one - unit.one
    di_, dc_ = dicfo[bi * units:(bi + 1) * units], dicfo[bc * units:(bc + 1) * units]
    df_, do_ = dicfo[bf * units:(bf + 1) * units], dicfo[bo * units:(bo + 1) * units]
    for u in range(units):
        pi = wci[u] if use_peephole else zero
        pf = wcf[u] if use_peephole else zero
        po = wco[u] if use_peephole else zero
        di, dci, df, do, dc_prev = backward_unit(h_grad[u] + dh[u], cs_grad[u] + dc_in[u], i_[u], ci_[u], f_[u], o_[u],
                                                 co_[u], c_prev[u], (pi, pf, po), unit)
        di_[u] = di
        dc_[u] = dci
        df_[u] = df
        do_[u] = do
        dc_out[u] = dc_prev
    if use_peephole:  # a loop of its own, as in the fused kernel
        wci_grad, wcf_grad, wco_grad = peephole_grads
        for u in range(units):
            wci_grad[u] += di_[u] * c_prev[u]
            wcf_grad[u] += df_[u] * c_prev[u]
            wco_grad[u] += do_[u] * cs_[u]


# -- the steps, on C-contiguous arrays ------------------------------------------------------------------------------


@njit(**KERNEL)
def _forward_step(inputs, packed, b, peepholes, unit, layout, scratch, save, out):
    """One step on all rows: ``work = [x, h_prev] @ w`` (``scratch`` is ``(z, work)``, ``z`` holds ``[x, h_prev]``),
    then the gate maths into ``out`` (:class:`StepOutputs` of ``[B, H]`` arrays). ``inputs.h_prev`` and
    ``inputs.cs_prev`` are read before any output is written: the outputs may be them."""
    full_width()
    x, cs_prev, h_prev = inputs
    z, work = scratch
    _join_rows(z, x, h_prev)
    _product(z, packed, work, np.bool_(False))
    for r in range(x.shape[0]):
        _units(work[r], b, cs_prev[r], peepholes, unit, layout, save, _row(out, r))


@njit(**KERNEL)
def _backward_step(dicfo, packed_t, inputs, grads):
    """``grads = dicfo @ w.T`` (``[B, I + H]`` padded): the gradients of ``x`` and ``h_prev``; each element one
    accumulator over the 4H gate columns in order (the fused backward's ``dh = dicfo @ w_h^T``)."""
    full_width()
    _product(dicfo, packed_t, grads, np.bool_(False))


@njit(**KERNEL)
def _weight_product(zt, dicfo, w_grad, b_grad):
    """``w_grad += zt @ dicfo`` (``zt: [I + H, R]``, ``dicfo: [R, 4H]``, ``w_grad: [I + H, 4H]`` padded) and
    ``b_grad += dicfo.sum(0)``: each element continues its accumulator over the ``R`` rows in order (fused
    multiply-adds; the bias plain adds)."""
    full_width()
    rows, gates = dicfo.shape
    width = microkernel.panel_width_of(dicfo)
    packed = np.empty(rows * _padded(gates, dicfo), dicfo.dtype)
    microkernel.pack_columns(dicfo, np.int64(0), gates, packed, np.int64(0), np.int64(0), width)
    microkernel.zero_columns(packed, np.int64(0), rows, gates, width)
    _product(zt, packed, w_grad, np.bool_(True))
    for r in range(rows):
        d = dicfo[r]
        for n in range(gates):
            b_grad[n] += d[n]


@njit(inline="always")
def _transpose_rows(z, zt, col0):
    """``zt[:, col0 + r] = z[r]`` for every row ``r`` of ``z`` (blocks of columns of ``z`` stay in cache)."""
    batch, depth = z.shape
    for k0 in range(0, depth, 16):
        k1 = min(k0 + 16, depth)
        for r in range(batch):
            zr = z[r]
            for k in range(k0, k1):
                zt[k, col0 + r] = zr[k]


# -- checks in the kernels --------------------------------------------------------------------------------------
#
# They return whether a shape is wrong, and the kernels raise: a message passed as an argument would be a
# string built at run time, and numba would compile its string functions into the kernel (seconds).


@njit(inline="always")
def _wrong1(a, n):
    return a.shape[0] != n


@njit(inline="always")
def _wrong2(a, rows, cols):
    return a.shape[0] != rows or a.shape[1] != cols


@njit(inline="always")
def _wrong3(a, steps, rows, cols):
    return a.shape[0] != steps or a.shape[1] != rows or a.shape[2] != cols


@njit(inline="always")
def _check_layout(layout):
    if layout != IFCO and layout != ICFO:
        raise ValueError("layout must be the code 0 ('ifco') or 1 ('icfo'): see nblstm.jit.layout_code")


@njit(inline="always")
def _check_peepholes(use_peephole, peepholes, units):
    wci, wcf, wco = peepholes
    if use_peephole and (_wrong1(wci, units) or _wrong1(wcf, units) or _wrong1(wco, units)):
        raise ValueError("with use_peephole, wci, wcf and wco must be [H] arrays, H = cs_prev.shape[1]")


@njit(inline="always")
def _c_in_peepholes(peepholes):
    return Peepholes(_c_in(peepholes.wci), _c_in(peepholes.wcf), _c_in(peepholes.wco))


# -- one step ---------------------------------------------------------------------------------------------------


@njit(**KERNEL)
def _step_kernel(inputs, w, b, peepholes, options, save, out):
    """:func:`lstm_step` (``save`` false: only ``out.cs`` and ``out.h`` written, the other fields are ``out.cs``)
    and :func:`lstm_step_train` (``save``): ``inputs`` :class:`StepInputs`, ``peepholes`` :class:`Peepholes`,
    ``options`` :class:`JitOptions`, ``out`` :class:`StepOutputs` of ``[B, H]`` arrays."""
    full_width()
    x, cs_prev, h_prev = inputs
    batch, inputs_size = x.shape
    units = cs_prev.shape[1]
    if _wrong2(cs_prev, batch, units) or _wrong2(h_prev, batch, units):
        raise ValueError("cs_prev and h_prev must be [B, H] arrays, B = x.shape[0]")
    if _wrong2(w, inputs_size + units, 4 * units) or _wrong1(b, 4 * units):
        raise ValueError("w must be an [I + H, 4H] array and b a [4H] array, I = x.shape[1], H = cs_prev.shape[1]")
    _check_peepholes(options.use_peephole, peepholes, units)
    _check_layout(options.layout)
    if _wrong2(out.cs, batch, units) or _wrong2(out.h, batch, units):
        raise ValueError("out_cs and out_h must be [B, H] arrays like cs_prev")
    if save:
        for a in (out.i, out.f, out.o, out.ci, out.co):
            if _wrong2(a, batch, units):
                raise ValueError("out_i, out_f, out_o, out_ci and out_co must be [B, H] arrays like cs_prev")
    unit = _unit_options(options, x)
    cs = _c_out(out.cs)
    h = _c_out(out.h)
    if save:
        i, f, o, ci, co = _c_out(out.i), _c_out(out.f), _c_out(out.o), _c_out(out.ci), _c_out(out.co)
    else:
        i = f = o = ci = co = cs  # not written
    scratch = (np.empty((batch, inputs_size + units), x.dtype), np.empty((batch, _padded(4 * units, x)), x.dtype))
    _forward_step(StepInputs(_c_in(x), _c_in(cs_prev), _c_in(h_prev)), _pack(_c_in(w)), _c_in(b),
                  _c_in_peepholes(peepholes), unit, options.layout, scratch, save, StepOutputs(i, cs, f, o, ci, co, h))
    _c_back(cs, out.cs)
    _c_back(h, out.h)
    if save:
        for c, a in ((i, out.i), (f, out.f), (o, out.o), (ci, out.ci), (co, out.co)):
            _c_back(c, a)


# -- one step's gradient ----------------------------------------------------------------------------------------


@njit(**KERNEL)
def _step_grad_kernel(cs_prev, saved, grads, peepholes, options, out):
    """:func:`lstm_step_grad`: ``saved`` :class:`StepOutputs` (its ``h`` is ``cs``, not read), ``grads``
    :class:`OutputGrads`, ``peepholes`` :class:`Peepholes`, ``options`` :class:`JitOptions`, ``out``
    :class:`StepGrads` (its peephole gradients added to)."""
    full_width()
    batch, units = cs_prev.shape
    for a in (saved.i, saved.cs, saved.f, saved.o, saved.ci, saved.co, grads.cs_grad, grads.h_grad):
        if _wrong2(a, batch, units):
            raise ValueError("i, cs, f, o, ci, co, cs_grad and h_grad must be [B, H] arrays like cs_prev")
    if _wrong2(out.cs_prev_grad, batch, units):
        raise ValueError("out_cs_prev_grad must be a [B, H] array like cs_prev")
    if _wrong2(out.dicfo, batch, 4 * units):
        raise ValueError("out_dicfo must be a [B, 4H] array, B, H = cs_prev.shape")
    use_peephole = options.use_peephole
    _check_peepholes(use_peephole, peepholes, units)
    wci_grad, wcf_grad, wco_grad = out.peephole_grads
    if use_peephole and (_wrong1(wci_grad, units) or _wrong1(wcf_grad, units) or _wrong1(wco_grad, units)):
        raise ValueError("with use_peephole, wci_grad, wcf_grad and wco_grad must be [H] arrays, H = cs_prev.shape[1]")
    _check_layout(options.layout)
    unit = _unit_options(options, cs_prev)
    zeros = np.zeros(units, cs_prev.dtype)  # nothing carried: the fused kernel's last step adds zeros too
    carried = OutputGrads(zeros, zeros)
    cs_prev = _c_in(cs_prev)
    i, cs, f, o = _c_in(saved.i), _c_in(saved.cs), _c_in(saved.f), _c_in(saved.o)
    ci, co = _c_in(saved.ci), _c_in(saved.co)
    cs_grad, h_grad, peepholes = _c_in(grads.cs_grad), _c_in(grads.h_grad), _c_in_peepholes(peepholes)
    dc, dicfo = _c_out(out.cs_prev_grad), _c_out(out.dicfo)
    gi, gf, go = _c_in(wci_grad), _c_in(wcf_grad), _c_in(wco_grad)  # added to: copied in and back
    for r in range(batch):
        _units_grad(cs_prev[r], StepOutputs(i[r], cs[r], f[r], o[r], ci[r], co[r], cs[r]),
                    OutputGrads(cs_grad[r], h_grad[r]), carried, peepholes, unit, options.layout, dicfo[r], dc[r],
                    Peepholes(gi, gf, go))
    _c_back(dc, out.cs_prev_grad)
    _c_back(dicfo, out.dicfo)
    if use_peephole:
        _c_back(gi, wci_grad)
        _c_back(gf, wcf_grad)
        _c_back(go, wco_grad)


# -- the products of a step's gradient ----------------------------------------------------------------------------


@njit(**KERNEL)
def _step_input_grads_kernel(dicfo, w, out_x_grad, out_h_prev_grad):
    full_width()
    batch, gates = dicfo.shape
    units = gates // 4
    inputs = w.shape[0] - units
    if gates % 4 or inputs < 0 or w.shape[1] != gates:
        raise ValueError("dicfo must be a [B, 4H] array and w an [I + H, 4H] array")
    if _wrong2(out_x_grad, batch, inputs):
        raise ValueError("out_x_grad must be a [B, I] array, B = dicfo.shape[0], I + H = w.shape[0]")
    if _wrong2(out_h_prev_grad, batch, units):
        raise ValueError("out_h_prev_grad must be a [B, H] array, 4H = dicfo.shape[1]")
    grads = np.empty((batch, _padded(inputs + units, w)), w.dtype)
    _backward_step(_c_in(dicfo), _pack_transposed(_c_in(w)), inputs, grads)
    for r in range(batch):
        g, xg, hg = grads[r], out_x_grad[r], out_h_prev_grad[r]
        for k in range(inputs):
            xg[k] = g[k]
        for k in range(units):
            hg[k] = g[inputs + k]


@njit(**KERNEL)
def _step_weight_grads_kernel(x, h_prev, dicfo, w_grad, b_grad):
    full_width()
    batch, inputs = x.shape
    units = h_prev.shape[1]
    if _wrong2(h_prev, batch, units) or _wrong2(dicfo, batch, 4 * units):
        raise ValueError("h_prev must be a [B, H] array and dicfo a [B, 4H] array, B = x.shape[0]")
    if _wrong2(w_grad, inputs + units, 4 * units) or _wrong1(b_grad, 4 * units):
        raise ValueError("w_grad must be an [I + H, 4H] array and b_grad a [4H] array")
    gates = 4 * units
    z = np.empty((batch, inputs + units), x.dtype)
    _join_rows(z, _c_in(x), _c_in(h_prev))
    zt = np.empty((inputs + units, batch), x.dtype)
    _transpose_rows(z, zt, 0)
    acc = np.empty((inputs + units, _padded(gates, x)), x.dtype)  # w_grad's accumulators, padded for the tiles
    for k in range(inputs + units):
        a, g = acc[k], w_grad[k]
        for n in range(gates):
            a[n] = g[n]
    bg = _c_in(b_grad)
    _weight_product(zt, _c_in(dicfo), acc, bg)
    for k in range(inputs + units):
        a, g = acc[k], w_grad[k]
        for n in range(gates):
            g[n] = a[n]
    _c_back(bg, b_grad)


# -- whole sequences --------------------------------------------------------------------------------------------


@njit(inline="always")
def _check_sequence_shapes(inputs, w, seq_len_max):
    x, cs_prev, h_prev = inputs
    steps, batch, inputs_size = x.shape
    units = cs_prev.shape[1]
    if _wrong2(cs_prev, batch, units) or _wrong2(h_prev, batch, units):
        raise ValueError("cs_prev and h_prev must be [B, H] arrays, B = x.shape[1]")
    if _wrong2(w, inputs_size + units, 4 * units):
        raise ValueError("w must be an [I + H, 4H] array, I = x.shape[2], H = cs_prev.shape[1]")
    if seq_len_max < 0 or seq_len_max > steps:
        raise ValueError("seq_len_max must be in [0, T], T = x.shape[0]")
    return steps, batch, inputs_size, units


@njit(**KERNEL)
def _forward_kernel(inputs, w, b, peepholes, options, seq_len_max, out):
    """:func:`lstm_forward`: ``inputs`` :class:`StepInputs` (``x`` ``[T, B, I]``), ``peepholes``
    :class:`Peepholes`, ``options`` :class:`JitOptions`, ``out`` :class:`StepOutputs` of ``[T, B, H]`` arrays."""
    full_width()
    steps, batch, inputs_size, units = _check_sequence_shapes(inputs, w, seq_len_max)
    if _wrong1(b, 4 * units):
        raise ValueError("b must be a [4H] array, H = cs_prev.shape[1]")
    _check_peepholes(options.use_peephole, peepholes, units)
    _check_layout(options.layout)
    for a in out:
        if _wrong3(a, steps, batch, units):
            raise ValueError("out_i, out_cs, out_f, out_o, out_ci, out_co and out_h must be [T, B, H] arrays, "
                             "T, B = x.shape[:2], H = cs_prev.shape[1]")
    x, cs_prev, h_prev = inputs
    unit = _unit_options(options, x)
    outs = StepOutputs(_c_out(out.i), _c_out(out.cs), _c_out(out.f), _c_out(out.o), _c_out(out.ci), _c_out(out.co),
                       _c_out(out.h))
    x, cs_prev, h_prev, b = _c_in(x), _c_in(cs_prev), _c_in(h_prev), _c_in(b)
    peepholes = _c_in_peepholes(peepholes)
    packed = _pack(_c_in(w))
    scratch = (np.empty((batch, inputs_size + units), x.dtype), np.empty((batch, _padded(4 * units, x)), x.dtype))
    save = np.bool_(True)
    i, cs, f, o, ci, co, h = outs
    for t in range(seq_len_max):
        c_src = cs_prev if t == 0 else cs[t - 1]
        h_src = h_prev if t == 0 else h[t - 1]
        _forward_step(StepInputs(x[t], c_src, h_src), packed, b, peepholes, unit, options.layout, scratch, save,
                      StepOutputs(i[t], cs[t], f[t], o[t], ci[t], co[t], h[t]))
    for c, a in zip(outs, out):
        c[seq_len_max:] = 0
        _c_back(c, a)


@njit(**KERNEL)
def _backward_kernel(inputs, w, peepholes, saved, grads, options, seq_len_max, out):
    """:func:`lstm_backward`: ``inputs`` :class:`StepInputs` (``x`` ``[T, B, I]``), ``peepholes``
    :class:`Peepholes`, ``saved`` :class:`StepOutputs` and ``grads`` :class:`OutputGrads` of ``[T, B, H]``
    arrays, ``options`` :class:`JitOptions`, ``out`` :class:`SequenceGrads` (all written)."""
    full_width()
    steps, batch, inputs_size, units = _check_sequence_shapes(inputs, w, seq_len_max)
    use_peephole = options.use_peephole
    _check_peepholes(use_peephole, peepholes, units)
    _check_layout(options.layout)
    for a in (saved.i, saved.cs, saved.f, saved.o, saved.ci, saved.co, saved.h, grads.cs_grad, grads.h_grad):
        if _wrong3(a, steps, batch, units):
            raise ValueError("i, cs, f, o, ci, co, h, cs_grad and h_grad must be [T, B, H] arrays, T, B = x.shape[:2], "
                             "H = cs_prev.shape[1]")
    if _wrong3(out.x_grad, steps, batch, inputs_size):
        raise ValueError("out_x_grad must be a [T, B, I] array like x")
    if _wrong2(out.cs_prev_grad, batch, units) or _wrong2(out.h_prev_grad, batch, units):
        raise ValueError("out_cs_prev_grad and out_h_prev_grad must be [B, H] arrays like cs_prev")
    if _wrong2(out.w_grad, inputs_size + units, 4 * units) or _wrong1(out.b_grad, 4 * units):
        raise ValueError("out_w_grad must be an [I + H, 4H] array like w and out_b_grad a [4H] array")
    out_wci_grad, out_wcf_grad, out_wco_grad = out.peephole_grads
    if _wrong1(out_wci_grad, units) or _wrong1(out_wcf_grad, units) or _wrong1(out_wco_grad, units):
        raise ValueError("out_wci_grad, out_wcf_grad and out_wco_grad must be [H] arrays, H = cs_prev.shape[1]")
    x, cs_prev, h_prev = inputs
    dtype = x.dtype
    unit = _unit_options(options, x)
    gates = 4 * units
    x, cs_prev, h_prev = _c_in(x), _c_in(cs_prev), _c_in(h_prev)
    peepholes = _c_in_peepholes(peepholes)
    i, cs, f, o = _c_in(saved.i), _c_in(saved.cs), _c_in(saved.f), _c_in(saved.o)
    ci, co, h = _c_in(saved.ci), _c_in(saved.co), _c_in(saved.h)
    cs_grad, h_grad = _c_in(grads.cs_grad), _c_in(grads.h_grad)
    x_grad = _c_out(out.x_grad)
    packed_t = _pack_transposed(_c_in(w))
    dh = np.zeros((batch, units), dtype)  # the gradients carried to the previous step
    dc = np.zeros((batch, units), dtype)
    # The steps' gate gradients and [x_t, h_{t-1}].T, last step first: the weight gradients are one product
    # after the loop, each element summed over the steps from the last to the first (lstm_step_weight_grads' order).
    dicfo_all = np.empty((seq_len_max, batch, gates), dtype)
    zt = np.empty((inputs_size + units, seq_len_max * batch), dtype)
    step_grads = np.empty((batch, _padded(inputs_size + units, x)), dtype)
    z = np.empty((batch, inputs_size + units), dtype)
    w_grad = np.zeros((inputs_size + units, _padded(gates, x)), dtype)
    b_grad = np.zeros(gates, dtype)
    peephole_grads = Peepholes(np.zeros(units, dtype), np.zeros(units, dtype), np.zeros(units, dtype))
    for t in range(seq_len_max - 1, -1, -1):
        c_src = cs_prev if t == 0 else cs[t - 1]
        h_src = h_prev if t == 0 else h[t - 1]
        dicfo = dicfo_all[seq_len_max - 1 - t]
        for r in range(batch):
            _units_grad(c_src[r], StepOutputs(i[t, r], cs[t, r], f[t, r], o[t, r], ci[t, r], co[t, r], h[t, r]),
                        OutputGrads(cs_grad[t, r], h_grad[t, r]), OutputGrads(dc[r], dh[r]), peepholes, unit,
                        options.layout, dicfo[r], dc[r], peephole_grads)
        _backward_step(dicfo, packed_t, inputs_size, step_grads)
        for r in range(batch):
            g, xg, hg = step_grads[r], x_grad[t, r], dh[r]
            for k in range(inputs_size):
                xg[k] = g[k]
            for k in range(units):
                hg[k] = g[inputs_size + k]
        _join_rows(z, x[t], h_src)
        _transpose_rows(z, zt, (seq_len_max - 1 - t) * batch)
    _weight_product(zt, dicfo_all.reshape((seq_len_max * batch, gates)), w_grad, b_grad)
    x_grad[seq_len_max:] = 0
    _c_back(x_grad, out.x_grad)
    # Element by element: an array assignment would compile numba's message for mismatched shapes (seconds).
    for r in range(batch):
        for u in range(units):
            out.cs_prev_grad[r, u] = dc[r, u]
            out.h_prev_grad[r, u] = dh[r, u]
    for k in range(inputs_size + units):
        for n in range(gates):
            out.w_grad[k, n] = w_grad[k, n]
    for n in range(gates):
        out.b_grad[n] = b_grad[n]
    for g, a in zip(peephole_grads, out.peephole_grads):
        for u in range(units):
            a[u] = g[u]


# -- the public functions -----------------------------------------------------------------------------------------
#
# Each public function is a Python function: called from Python, it checks its arguments (TypeError, ValueError)
# and runs a jitted entry point (``_..._entry``, compiled once per argument types and cached). Called from jitted
# code, it is typed and lowered by :func:`_declare`: at compile time its argument types are checked and the call
# becomes a call of the function's kernel, with its arguments in the kernel's records (:class:`JitOptions` of
# float64, bool and int64, and records of arrays typed as read-only (inputs) or writable (outputs) arrays of layout
# "A"), so that each kernel is compiled once per dtype however it is called. (Numba types an int or bool written as
# a constant in a caller as a literal of its value, and C-contiguous, strided and read-only arrays as different
# types: a @njit function called with them would be compiled again for each; so would a wrapper or an @overload,
# whose implementation numba also compiles with everything it calls, for every caller.) The entry points make the
# same call: they take the public arguments as plain tuples (:func:`_entry_groups`).
#
# The arguments of each public function are described by a spec: ``name:kind`` with kind a rank (an input
# array), a rank and ``w`` (an output array, written), a rank and ``a`` (an array added to), ``f`` (a float
# option), ``b`` (a bool option), ``l`` (a layout code) or ``n`` (``seq_len_max``: an int, or omitted for T).
# The kernel's arguments are given as a list of the public ones by name, constants (``True``, ``0.0``) and records
# whose fields are such items (``StepInputs("x", "cs_prev", "h_prev")``).

_FORWARD_OPTIONS = "forget_bias:f cell_clip:f use_peephole:b layout:l"
_SPECS = {
    "lstm_step": "x:2 cs_prev:2 h_prev:2 w:2 b:1 wci:1 wcf:1 wco:1 " + _FORWARD_OPTIONS + " out_cs:2w out_h:2w",
    "lstm_step_train": "x:2 cs_prev:2 h_prev:2 w:2 b:1 wci:1 wcf:1 wco:1 " + _FORWARD_OPTIONS
    + " out_i:2w out_cs:2w out_f:2w out_o:2w out_ci:2w out_co:2w out_h:2w",
    "lstm_step_grad": "cs_prev:2 i:2 cs:2 f:2 o:2 ci:2 co:2 cs_grad:2 h_grad:2 wci:1 wcf:1 wco:1 use_peephole:b "
    "layout:l out_cs_prev_grad:2w out_dicfo:2w wci_grad:1a wcf_grad:1a wco_grad:1a",
    "lstm_step_input_grads": "dicfo:2 w:2 out_x_grad:2w out_h_prev_grad:2w",
    "lstm_step_weight_grads": "x:2 h_prev:2 dicfo:2 w_grad:2a b_grad:1a",
    "lstm_forward": "x:3 cs_prev:2 h_prev:2 w:2 b:1 wci:1 wcf:1 wco:1 " + _FORWARD_OPTIONS
    + " out_i:3w out_cs:3w out_f:3w out_o:3w out_ci:3w out_co:3w out_h:3w seq_len_max:n",
    "lstm_backward": "x:3 cs_prev:2 h_prev:2 w:2 wci:1 wcf:1 wco:1 i:3 cs:3 f:3 o:3 ci:3 co:3 h:3 cs_grad:3 h_grad:3 "
    "use_peephole:b layout:l out_x_grad:3w out_cs_prev_grad:2w out_h_prev_grad:2w out_w_grad:2w out_wci_grad:1w "
    "out_wcf_grad:1w out_wco_grad:1w out_b_grad:1w seq_len_max:n",
}


def _spec(function):
    """``[(name, kind), ...]`` of a public function, parsed once (a call from Python reads it: parsing it again
    took 1.5 us a call)."""
    return _PARSED_SPECS[function]


_PARSED_SPECS = {function: tuple(tuple(item.split(":")) for item in spec.split()) for function, spec in _SPECS.items()}


def _python_arguments(function, values):
    """The arguments of a call from Python, checked (``TypeError``, ``ValueError`` naming the argument) and
    converted to what the entry point takes (``seq_len_max`` checked by the kernel)."""
    where = f"nblstm.jit.{function}"
    dtype = None
    out = []
    for (name, kind), value in zip(_spec(function), values):
        if kind == "f":
            value = check_real(name, value)
        elif kind == "b":
            value = check_bool(name, value)
        elif kind == "l":
            value = layout_code(value)
        elif kind == "n":
            if value is not None:
                value = check_seq_len_max(value, values[0].shape[0])
        else:
            if not isinstance(value, np.ndarray):
                raise TypeError(f"{where}: {name} must be a NumPy array, got {type(value).__name__}")
            if value.dtype not in (np.float32, np.float64):
                raise TypeError(f"{where}: {name} must be a float32 or float64 array, got {value.dtype}")
            if dtype is None:
                dtype = (name, value.dtype)
            elif value.dtype != dtype[1]:
                raise TypeError(f"{where}: {name} is {value.dtype} but {dtype[0]} is {dtype[1]}: the arrays must "
                                "share one dtype")
            if value.ndim != int(kind[0]):
                raise ValueError(f"{where}: {name} must be a {kind[0]}-D array, got shape {value.shape}")
            if kind[1:] and not value.flags.writeable:
                raise ValueError(f"{where}: {name} is written and must be a writable array")
        out.append(value)
    return out


def _check_numba_types(function, arguments):
    """The same checks on the numba types of a call from jitted code (when it is compiled): ``TypingError``."""
    where = f"nblstm.jit.{function}"
    dtype = None
    for (name, kind), value in zip(_spec(function), arguments):
        value = types.unliteral(value)
        if kind in ("f", "b"):
            if not isinstance(value, (types.Float, types.Integer, types.Boolean)):
                raise errors.TypingError(f"{where}: {name} must be a number, got {value}")
        elif kind == "l":
            if not isinstance(value, types.Integer):
                raise errors.TypingError(f"{where}: layout must be an integer code (nblstm.jit.IFCO, nblstm.jit.ICFO),"
                                         f" got {value}")
        elif kind == "n":
            if not (_omitted(value) or isinstance(value, types.Integer)):
                raise errors.TypingError(f"{where}: seq_len_max must be an integer or None, got {value}")
        else:
            if not isinstance(value, types.Array):
                raise errors.TypingError(f"{where}: {name} must be a NumPy array, got {value}")
            if value.dtype not in (types.float32, types.float64):
                raise errors.TypingError(f"{where}: {name} must be a float32 or float64 array, got {value.dtype}")
            if dtype is None:
                dtype = (name, value.dtype)
            elif value.dtype != dtype[1]:
                raise errors.TypingError(f"{where}: {name} is {value.dtype} but {dtype[0]} is {dtype[1]}: the arrays "
                                         "must share one dtype")
            if value.ndim != int(kind[0]):
                raise errors.TypingError(f"{where}: {name} must be a {kind[0]}-D array, got {value.ndim}-D")
            if kind[1:] and not value.mutable:
                raise errors.TypingError(f"{where}: {name} is written and must not be a read-only array")


def _omitted(value):
    return value is None or isinstance(value, (types.NoneType, types.Omitted))


def _entry_groups(function, values):
    """The checked arguments ``values`` of a call from Python as its entry point takes them: plain tuples of the
    arrays before the options, the options and the arrays after them, then ``seq_len_max`` where there is one."""
    first, last, end = _GROUPS[function]
    values = tuple(values)
    return (values[:first], values[first:last], values[last:end], *values[end:])


def _groups(function):
    kinds = [kind for _, kind in _spec(function)]
    options = [k for k, kind in enumerate(kinds) if kind in ("f", "b", "l")]
    end = len(kinds) - (kinds[-1] == "n")
    return options[0], options[-1] + 1, end


_GROUPS = {function: _groups(function)
           for function in ("lstm_step", "lstm_step_train", "lstm_step_grad", "lstm_forward", "lstm_backward")}


def _record_type(record, fields):
    """The numba type of a ``record`` (a NamedTuple class) of fields of the numba types ``fields``: the one numba
    gives such a record (uniform fields: a ``NamedUniTuple``)."""
    if all(field == fields[0] for field in fields):
        return types.NamedUniTuple(fields[0], len(fields), record)
    return types.NamedTuple(fields, record)


def _declare(function, kernel, kernel_arguments):
    """Type and lower calls of the public ``function`` from jitted code as calls of ``kernel``.

    ``kernel_arguments``: the kernel's parameters, each a name of one of ``function``'s parameters, a constant
    (``False``, ``0.0``) or a record (a NamedTuple) of such items. The lowering builds the records (the one place
    where the CPU kernels' records are built from a call's arguments) and makes numba's own call of a compiled
    function (what it emits for a call of a dispatcher), on the kernel compiled (or loaded from the cache) for the
    normalized types when the call is typed.
    """
    name = function.__name__
    pysig = inspect.signature(function)
    kinds = dict(_spec(name))
    order = list(pysig.parameters)

    def item_type(item, arg_types):
        if isinstance(item, tuple):
            return _record_type(type(item), [item_type(field, arg_types) for field in item])
        if isinstance(item, bool):
            return types.boolean
        if isinstance(item, float):
            return types.float64
        kind = kinds[item]
        if kind[0].isdigit():
            return types.unliteral(arg_types[order.index(item)]).copy(layout="A", readonly=len(kind) == 1)
        return {"f": types.float64, "b": types.boolean, "l": types.int64, "n": types.int64}[kind]

    def normalized(arg_types):
        """The kernel's argument types for the public argument types ``arg_types`` (omitted ones absent)."""
        return tuple(item_type(item, arg_types) for item in kernel_arguments)

    @type_callable(function)
    def typing(context):
        def typer(*args, **kws):
            bound = pysig.bind(*args, **kws)
            arguments = [bound.arguments.get(parameter) for parameter in order]
            _check_numba_types(name, arguments)
            kernel.compile(normalized(arguments))  # compiled now, or loaded from numba's cache
            return types.none

        typer.pysig = pysig
        return typer

    @lower_builtin(function, types.VarArg(types.Any))
    def lowering(context, builder, signature, args):
        arg_types = list(signature.args) + [types.none] * (len(order) - len(signature.args))
        values = list(args) + [None] * (len(order) - len(args))

        def item_value(item, target):
            if isinstance(item, tuple):
                fields = [item_value(field, field_type) for field, field_type in zip(item, target)]
                return context.make_tuple(builder, target, fields)
            if isinstance(item, (bool, float)):
                return context.get_constant(target, item)
            k = order.index(item)
            fromty, value = arg_types[k], values[k]
            if kinds[item] == "n" and _omitted(fromty):  # seq_len_max omitted: T = x.shape[0]
                x = context.make_array(arg_types[0])(context, builder, value=values[0])
                value, fromty = cgutils.unpack_tuple(builder, x.shape)[0], types.intp
            elif isinstance(fromty, types.Literal):
                value = context.get_constant(types.unliteral(fromty), fromty.literal_value)
                fromty = types.unliteral(fromty)
            return context.cast(builder, value, fromty, target)

        kernel_types = normalized(arg_types)
        kernel_values = [item_value(item, target) for item, target in zip(kernel_arguments, kernel_types)]
        compiled = kernel.overloads[kernel_types]
        context.add_linking_libs([compiled.library])
        user_function(compiled.fndesc, [compiled.library])(context, builder, compiled.signature, kernel_values)
        return context.get_dummy_value()


#: The kernels' options of the forward functions and of the gradients (:class:`JitOptions`).
_FORWARD = JitOptions("forget_bias", "cell_clip", "use_peephole", "layout")
_GRADIENT = JitOptions(0.0, 0.0, "use_peephole", "layout")
_INPUTS = StepInputs("x", "cs_prev", "h_prev")
_PEEPHOLES = Peepholes("wci", "wcf", "wco")


def lstm_step(x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout, out_cs, out_h):
    """One LSTM step on a batch (TensorFlow's LSTMBlockCell): the new cell state and output.

    Parameters
    ----------
    x : [B, I] array
    cs_prev, h_prev : [B, H] arrays
        The previous cell state and output.
    w : [I + H, 4H] array
        Rows ``0 .. I-1`` multiply ``x``, rows ``I ..`` multiply ``h_prev``;
        the four gate blocks of the columns in ``layout`` order.
    b : [4H] array
    wci, wcf, wco : [H] arrays
        Peephole weights; read only when ``use_peephole`` (any 1-D arrays
        of the dtype otherwise).
    forget_bias : float
        Added to the forget gate's pre-activation.
    cell_clip : float
        Clip the cell state to ``[-cell_clip, cell_clip]`` when positive;
        ``<= 0`` turns clipping off (TensorFlow's convention).
    use_peephole : bool
    layout : int
        :data:`IFCO` (0) or :data:`ICFO` (1); from Python also ``"ifco"``
        or ``"icfo"`` (:func:`layout_code`).
    out_cs, out_h : [B, H] arrays
        Written: the new cell state and output. They may be ``cs_prev`` and
        ``h_prev`` themselves (the state updated in place).

    Raises
    ------
    TypeError
        From Python: an argument that is not a float32 or float64 NumPy
        array, mixed dtypes, an option of the wrong type.
    ValueError
        Shapes that do not agree, a read-only output, an unknown layout.
    numba.core.errors.TypingError
        From jitted code, when it is compiled: the checks of the types above.

    Notes
    -----
    All arrays share one dtype, float32 or float64, and may have any
    layout. In jitted code the shapes are checked at run time (a
    ``ValueError``, whose message names the arguments); an output that
    overlaps an input other than as above gives undefined results.
    """
    _lstm_step_entry(*_entry_groups("lstm_step", _python_arguments("lstm_step", (
        x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout, out_cs, out_h))))


_declare(lstm_step, _step_kernel, [_INPUTS, "w", "b", _PEEPHOLES, _FORWARD, False,
                                   StepOutputs(*["out_cs"] * 6, "out_h")])


@njit(**KERNEL)
def _lstm_step_entry(inputs, options, outputs):
    lstm_step(*inputs, *options, *outputs)


def lstm_step_train(x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout, out_i,
                    out_cs, out_f, out_o, out_ci, out_co, out_h):
    """One LSTM step that also keeps what its gradient needs: the seven outputs of LSTMBlockCell.

    Parameters
    ----------
    x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout
        As :func:`lstm_step`.
    out_i, out_cs, out_f, out_o, out_ci, out_co, out_h : [B, H] arrays
        Written: the gates after their sigmoid (``i, f, o``), the cell input
        after tanh (``ci``), the (clipped) cell state, ``co = tanh(cs)`` and
        the output, as :func:`nblstm.lstm_block_cell` returns them.
        ``out_cs`` and ``out_h`` may be ``cs_prev`` and ``h_prev``.

    Raises
    ------
    TypeError, ValueError, numba.core.errors.TypingError
        As :func:`lstm_step`.
    """
    _lstm_step_train_entry(*_entry_groups("lstm_step_train", _python_arguments("lstm_step_train", (
        x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout, out_i, out_cs, out_f,
        out_o, out_ci, out_co, out_h))))


_declare(lstm_step_train, _step_kernel, [_INPUTS, "w", "b", _PEEPHOLES, _FORWARD, True, StepOutputs(
    "out_i", "out_cs", "out_f", "out_o", "out_ci", "out_co", "out_h")])


@njit(**KERNEL)
def _lstm_step_train_entry(inputs, options, outputs):
    lstm_step_train(*inputs, *options, *outputs)


def lstm_step_grad(cs_prev, i, cs, f, o, ci, co, cs_grad, h_grad, wci, wcf, wco, use_peephole, layout,
                   out_cs_prev_grad, out_dicfo, wci_grad, wcf_grad, wco_grad):
    """The gradient of one step's gate maths (TensorFlow's LSTMBlockCellGrad).

    Parameters
    ----------
    cs_prev : [B, H] array
        The step's previous cell state.
    i, cs, f, o, ci, co : [B, H] arrays
        The step's outputs (:func:`lstm_step_train`).
    cs_grad, h_grad : [B, H] arrays
        Total gradients of the step's ``cs`` and ``h`` (from the loss and
        from the next step).
    wci, wcf, wco : [H] arrays
        Read only when ``use_peephole``.
    use_peephole : bool
    layout : int
        :data:`IFCO` or :data:`ICFO`.
    out_cs_prev_grad : [B, H] array
        Written: the gradient of ``cs_prev``. It may be ``cs_grad`` itself.
    out_dicfo : [B, 4H] array
        Written: the gradients of the four gate pre-activations, in
        ``layout`` order (LSTMBlockCellGrad's ``dicfo``).
    wci_grad, wcf_grad, wco_grad : [H] arrays
        With ``use_peephole``, this step's peephole gradients are **added**
        to them (zero them before the first step); untouched otherwise.

    Raises
    ------
    TypeError, ValueError, numba.core.errors.TypingError
        As :func:`lstm_step`.

    Notes
    -----
    Cell clipping is treated as the identity, as in TensorFlow's fused
    kernels. The gradients of ``x``, ``h_prev`` and the weights are products
    with ``out_dicfo``: :func:`lstm_step_input_grads`,
    :func:`lstm_step_weight_grads`.
    """
    _lstm_step_grad_entry(*_entry_groups("lstm_step_grad", _python_arguments("lstm_step_grad", (
        cs_prev, i, cs, f, o, ci, co, cs_grad, h_grad, wci, wcf, wco, use_peephole, layout, out_cs_prev_grad,
        out_dicfo, wci_grad, wcf_grad, wco_grad))))


_declare(lstm_step_grad, _step_grad_kernel, [
    "cs_prev", StepOutputs("i", "cs", "f", "o", "ci", "co", "cs"), OutputGrads("cs_grad", "h_grad"), _PEEPHOLES,
    _GRADIENT, StepGrads("out_cs_prev_grad", "out_dicfo", Peepholes("wci_grad", "wcf_grad", "wco_grad"))])


@njit(**KERNEL)
def _lstm_step_grad_entry(inputs, options, outputs):
    lstm_step_grad(*inputs, *options, *outputs)


def lstm_step_input_grads(dicfo, w, out_x_grad, out_h_prev_grad):
    """The gradients of a step's input and previous output from its gate gradients: ``dicfo @ w.T``.

    Parameters
    ----------
    dicfo : [B, 4H] array
        The step's gate gradients (:func:`lstm_step_grad`).
    w : [I + H, 4H] array
    out_x_grad : [B, I] array
        Written: ``dicfo @ w[:I].T``.
    out_h_prev_grad : [B, H] array
        Written: ``dicfo @ w[I:].T``, the gradient the previous step's
        output gets from this step.

    Raises
    ------
    TypeError, ValueError, numba.core.errors.TypingError
        As :func:`lstm_step`.

    Notes
    -----
    Each element is one sum over the 4H gate columns in order, with fused
    multiply-adds: ``out_h_prev_grad`` has the bits of the gradient that
    :func:`nblstm.block_lstm_grad` carries from a step to the previous one.
    """
    _lstm_step_input_grads_entry(*_python_arguments("lstm_step_input_grads", (dicfo, w, out_x_grad, out_h_prev_grad)))


_declare(lstm_step_input_grads, _step_input_grads_kernel, ["dicfo", "w", "out_x_grad", "out_h_prev_grad"])


@njit(**KERNEL)
def _lstm_step_input_grads_entry(dicfo, w, out_x_grad, out_h_prev_grad):
    lstm_step_input_grads(dicfo, w, out_x_grad, out_h_prev_grad)


def lstm_step_weight_grads(x, h_prev, dicfo, w_grad, b_grad):
    """Add one step's weight and bias gradients: ``w_grad += [x, h_prev].T @ dicfo``, ``b_grad += dicfo.sum(0)``.

    Parameters
    ----------
    x : [B, I] array
    h_prev : [B, H] array
        The step's input and previous output.
    dicfo : [B, 4H] array
        The step's gate gradients (:func:`lstm_step_grad`).
    w_grad : [I + H, 4H] array
        **Added to** (zero it before the first step).
    b_grad : [4H] array
        **Added to**.

    Raises
    ------
    TypeError, ValueError, numba.core.errors.TypingError
        As :func:`lstm_step`.

    Notes
    -----
    Each element continues its own sum over the batch rows in order (fused
    multiply-adds for ``w_grad``): the steps added from the last to the
    first give the bits of :func:`lstm_backward`.
    """
    _lstm_step_weight_grads_entry(*_python_arguments("lstm_step_weight_grads", (x, h_prev, dicfo, w_grad, b_grad)))


_declare(lstm_step_weight_grads, _step_weight_grads_kernel, ["x", "h_prev", "dicfo", "w_grad", "b_grad"])


@njit(**KERNEL)
def _lstm_step_weight_grads_entry(x, h_prev, dicfo, w_grad, b_grad):
    lstm_step_weight_grads(x, h_prev, dicfo, w_grad, b_grad)


def lstm_forward(x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout, out_i, out_cs,
                 out_f, out_o, out_ci, out_co, out_h, seq_len_max=None):
    """LSTM forward over a whole sequence (TensorFlow's BlockLSTM / BlockLSTMV2).

    Parameters
    ----------
    x : [T, B, I] array
        Inputs, time-major.
    cs_prev, h_prev : [B, H] arrays
        Initial cell state and output.
    w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout
        As :func:`lstm_step`.
    out_i, out_cs, out_f, out_o, out_ci, out_co, out_h : [T, B, H] arrays
        Written: the outputs of :func:`nblstm.block_lstm`, zero from step
        ``seq_len_max`` on.
    seq_len_max : int, optional
        Steps computed, ``0 <= seq_len_max <= T`` (default ``T``).

    Raises
    ------
    TypeError, ValueError, numba.core.errors.TypingError
        As :func:`lstm_step`; ``seq_len_max`` outside ``[0, T]``.

    Notes
    -----
    Step ``t`` is :func:`lstm_step_train` on ``x[t]`` and the outputs of
    step ``t - 1``, with the same bits.
    """
    arguments = _python_arguments("lstm_forward", (x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip,
                                                   use_peephole, layout, out_i, out_cs, out_f, out_o, out_ci, out_co,
                                                   out_h, seq_len_max))
    if arguments[-1] is None:
        arguments[-1] = x.shape[0]
    _lstm_forward_entry(*_entry_groups("lstm_forward", arguments))


_declare(lstm_forward, _forward_kernel, [_INPUTS, "w", "b", _PEEPHOLES, _FORWARD, "seq_len_max", StepOutputs(
    "out_i", "out_cs", "out_f", "out_o", "out_ci", "out_co", "out_h")])


@njit(**KERNEL)
def _lstm_forward_entry(inputs, options, outputs, seq_len_max):
    lstm_forward(*inputs, *options, *outputs, seq_len_max)


def lstm_backward(x, cs_prev, h_prev, w, wci, wcf, wco, i, cs, f, o, ci, co, h, cs_grad, h_grad, use_peephole, layout,
                  out_x_grad, out_cs_prev_grad, out_h_prev_grad, out_w_grad, out_wci_grad, out_wcf_grad, out_wco_grad,
                  out_b_grad, seq_len_max=None):
    """LSTM backward over a whole sequence (TensorFlow's BlockLSTMGrad / BlockLSTMGradV2).

    Parameters
    ----------
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    wci, wcf, wco : [H] arrays
        Read only when ``use_peephole``.
    i, cs, f, o, ci, co, h : [T, B, H] arrays
        The forward outputs (:func:`lstm_forward`).
    cs_grad, h_grad : [T, B, H] arrays
        Gradients of the loss with respect to the outputs ``cs`` and ``h``;
        steps from ``seq_len_max`` on are not read.
    use_peephole : bool
    layout : int
        :data:`IFCO` or :data:`ICFO`.
    out_x_grad : [T, B, I] array
        Zero from step ``seq_len_max`` on.
    out_cs_prev_grad, out_h_prev_grad : [B, H] arrays
    out_w_grad : [I + H, 4H] array
    out_wci_grad, out_wcf_grad, out_wco_grad : [H] arrays
        Zeros without peepholes.
    out_b_grad : [4H] array
        The outputs of :func:`nblstm.block_lstm_grad`, all written (not
        added to).
    seq_len_max : int, optional
        As in the forward call (default ``T``).

    Raises
    ------
    TypeError, ValueError, numba.core.errors.TypingError
        As :func:`lstm_forward`.

    Notes
    -----
    Cell clipping is treated as the identity, as in TensorFlow's fused
    kernels. The steps run from the last to the first, each
    :func:`lstm_step_grad` (with the gradients carried from the next step
    added to ``cs_grad[t]`` and ``h_grad[t]``), :func:`lstm_step_input_grads`
    and :func:`lstm_step_weight_grads`, with the same bits.
    """
    arguments = _python_arguments("lstm_backward", (
        x, cs_prev, h_prev, w, wci, wcf, wco, i, cs, f, o, ci, co, h, cs_grad, h_grad, use_peephole, layout,
        out_x_grad, out_cs_prev_grad, out_h_prev_grad, out_w_grad, out_wci_grad, out_wcf_grad, out_wco_grad,
        out_b_grad, seq_len_max))
    if arguments[-1] is None:
        arguments[-1] = x.shape[0]
    _lstm_backward_entry(*_entry_groups("lstm_backward", arguments))


_declare(lstm_backward, _backward_kernel, [
    _INPUTS, "w", _PEEPHOLES, StepOutputs("i", "cs", "f", "o", "ci", "co", "h"), OutputGrads("cs_grad", "h_grad"),
    _GRADIENT, "seq_len_max", SequenceGrads("out_x_grad", "out_cs_prev_grad", "out_h_prev_grad", "out_w_grad",
                                            Peepholes("out_wci_grad", "out_wcf_grad", "out_wco_grad"), "out_b_grad")])


@njit(**KERNEL)
def _lstm_backward_entry(inputs, options, outputs, seq_len_max):
    lstm_backward(*inputs, *options, *outputs, seq_len_max)
