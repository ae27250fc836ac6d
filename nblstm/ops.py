"""The functional API: validate, build the options record, dispatch.

Data flows one way: a public call is validated here
(:mod:`nblstm._validate`), its options become one
:class:`~nblstm.options.OpOptions`, the target is chosen from the kind of
arrays given (:func:`nblstm._dispatch.target_for`: NumPy arrays run on the
CPU, arrays that live on a GPU run on the GPU), and the target's entry
point runs the kernels (:ref:`design-contract`).

The functions here use the TensorFlow op names for arrays (``cs``, ``h``,
``w``, ``b``...) and take the gate layout and ``forget_bias`` as arguments;
:mod:`nblstm.raw_ops` wraps them with TensorFlow's exact signatures.
"""

from collections import namedtuple

from . import _validate as v
from ._dispatch import check_precision, check_stream, target_for
from .interchange import accepts_any_array
from .options import PRECISIONS, OpOptions, op_cell_clip

__all__ = [
    "BlockLSTMOutput",
    "BlockLSTMGradOutput",
    "LSTMBlockCellOutput",
    "LSTMBlockCellGradOutput",
    "block_lstm",
    "block_lstm_grad",
    "checked_block_lstm_grad",
    "checked_lstm_block_cell_grad",
    "lstm_block_cell",
    "lstm_block_cell_grad",
]

BlockLSTMOutput = namedtuple("BlockLSTMOutput", ["i", "cs", "f", "o", "ci", "co", "h"])
BlockLSTMOutput.__doc__ = """Outputs of :func:`block_lstm`: seven ``[T, B, H]`` arrays.

``i, f, o`` are the gates after the sigmoid, ``ci`` the cell input after
tanh, ``cs`` the (clipped) cell state, ``co = tanh(cs)`` and ``h`` the output.
"""
BlockLSTMGradOutput = namedtuple(
    "BlockLSTMGradOutput",
    ["x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad", "wco_grad", "b_grad"],
)
BlockLSTMGradOutput.__doc__ = """Outputs of :func:`block_lstm_grad`.

``x_grad [T, B, I]``, ``cs_prev_grad [B, H]``, ``h_prev_grad [B, H]``,
``w_grad [I + H, 4H]``, ``wci_grad, wcf_grad, wco_grad [H]``, ``b_grad [4H]``.
"""
LSTMBlockCellOutput = namedtuple("LSTMBlockCellOutput", ["i", "cs", "f", "o", "ci", "co", "h"])
LSTMBlockCellOutput.__doc__ = """Outputs of :func:`lstm_block_cell`: seven ``[B, H]`` arrays."""
LSTMBlockCellGradOutput = namedtuple(
    "LSTMBlockCellGradOutput", ["cs_prev_grad", "dicfo", "wci_grad", "wcf_grad", "wco_grad"]
)
LSTMBlockCellGradOutput.__doc__ = """Outputs of :func:`lstm_block_cell_grad`.

``cs_prev_grad [B, H]``, ``dicfo [B, 4H]`` (gradient of the gate
pre-activations, in the call's gate layout) and ``wci_grad, wcf_grad,
wco_grad [H]`` of this step.
"""

_OUTPUT_NAMES = ("i", "cs", "f", "o", "ci", "co", "h")
# Stands for "this op has no bias argument" (the gradient ops), unlike None,
# which is a wrong value for a bias.
_NO_BIAS = object()
_PEEPHOLES = ("wci", "wcf", "wco")


def _options(forget_bias, cell_clip, use_peephole, layout, precision="exact"):
    """Validate the options; returns them as one record (``cell_clip <= 0`` becomes ``None``: no clipping)."""
    return OpOptions(
        v.check_real("forget_bias", forget_bias),
        op_cell_clip(None if cell_clip is None else v.check_real("cell_clip", cell_clip)),
        v.check_bool("use_peephole", use_peephole),
        v.check_layout(layout),
        v.check_choice("precision", precision, PRECISIONS),
    )


def _peephole_arrays(wci, wcf, wco, use_peephole):
    """The peephole arguments that were given; all three are required with ``use_peephole``."""
    given = {name: a for name, a in zip(_PEEPHOLES, (wci, wcf, wco)) if a is not None}
    if use_peephole:
        missing = [name for name in _PEEPHOLES if name not in given]
        if missing:
            raise ValueError(f"use_peephole=True needs the peephole weights; missing: {', '.join(missing)}")
    return given


def _check_core(x, cs_prev, h_prev, w, b, peepholes, extra=None, x_rank=3):
    """Validate the arrays common to every op; returns ``(infos, (T, B, I, H))``.

    ``b`` is ``_NO_BIAS`` for the ops without a bias argument. ``extra`` maps
    further array names to ``(value, rank)``; their shapes are
    checked by the caller. ``T`` is ``None`` for single-step ops.
    """
    named = {"x": x, "cs_prev": cs_prev, "h_prev": h_prev, "w": w}
    ranks = {"x": x_rank, "cs_prev": 2, "h_prev": 2, "w": 2, "b": 1, "wci": 1, "wcf": 1, "wco": 1}
    if b is not _NO_BIAS:
        named["b"] = b
    named.update(peepholes)
    for name, (value, rank) in (extra or {}).items():
        named[name] = value
        ranks[name] = rank
    infos = v.check_arrays(named, ranks)
    if x_rank == 3:
        steps, batch, inputs = infos["x"].shape
        x_meaning = "[T, B, I]"
    else:
        steps = None
        batch, inputs = infos["x"].shape
        x_meaning = "[B, I]"
    units = infos["cs_prev"].shape[1]
    if units == 0:
        raise ValueError(f"cs_prev has shape {infos['cs_prev'].shape}: the cell size H = cs_prev.shape[1] must be > 0")
    v.check_shape(infos["cs_prev"], (batch, units), f"[B, H], B = x.shape[{x_rank - 2}] from x {x_meaning}")
    v.check_shape(infos["h_prev"], (batch, units), "[B, H] like cs_prev")
    v.check_shape(infos["w"], (inputs + units, 4 * units), "[I + H, 4H] from x and cs_prev")
    if b is not _NO_BIAS:
        v.check_shape(infos["b"], (4 * units,), "[4H] from cs_prev")
    for name in peepholes:
        v.check_shape(infos[name], (units,), "[H] from cs_prev")
    return infos, (steps, batch, inputs, units)


@accepts_any_array
def block_lstm(x, cs_prev, h_prev, w, b, wci=None, wcf=None, wco=None, *, seq_len_max=None, forget_bias=0.0,
               cell_clip=None, use_peephole=False, layout="ifco", precision="exact", stream=None):
    """LSTM forward over a whole sequence (TensorFlow's BlockLSTM / BlockLSTMV2).

    Parameters
    ----------
    x : [T, B, I] array
        Inputs, time-major.
    cs_prev, h_prev : [B, H] arrays
        Initial cell state and output.
    w : [I + H, 4H] array
        Weights; rows ``0..I-1`` multiply ``x``, rows ``I..I+H-1`` multiply
        ``h``; the four gate blocks of the columns are in ``layout`` order.
    b : [4H] array
        Bias, same column order as ``w``.
    wci, wcf, wco : [H] arrays, optional
        Peephole weights of the input, forget and output gates; required
        when ``use_peephole`` is true, ignored otherwise.
    seq_len_max : int, optional
        Number of steps computed, ``0 <= seq_len_max <= T`` (default ``T``).
        Every output is zero from step ``seq_len_max`` on.
    forget_bias : float, default 0.0
        Added to the forget gate's pre-activation.
    cell_clip : float, optional
        Clip the cell state to ``[-cell_clip, cell_clip]`` when positive;
        ``None`` or ``<= 0`` turns clipping off.
    use_peephole : bool, default False
    layout : {"ifco", "icfo"}, default "ifco"
        Gate order of the 4H columns: ``"ifco"`` as BlockLSTMV2, Keras,
        PyTorch and cuDNN; ``"icfo"`` as BlockLSTM (V1) and TF1 ``LSTMCell``.
    precision : {"exact", "tf32", "fp16"}, default "exact"
        Arithmetic of the large matrix products on the GPU: ``"exact"`` in
        the compute dtype; ``"tf32"`` on TF32 tensor cores, ``"fp16"`` with
        operands rounded to float16 (both with float32 sums, for float32 and
        float16 arrays on a GPU with cuBLAS; refused otherwise). See :doc:`/gpu`.
    stream : CUDA stream, optional
        For GPU arrays: the stream to run on.

    Returns
    -------
    BlockLSTMOutput
        ``(i, cs, f, o, ci, co, h)``, each ``[T, B, H]``, dtype of ``x``, on
        the target of the inputs. On the CPU (float32 and float64) the seven
        are views of one ``[7, T, B, H]`` allocation, which is faster to
        allocate and fault in: keeping one of them keeps the memory of all
        seven (copy ``h`` to keep only it).

    Raises
    ------
    TypeError
        A non-array argument, mismatched or unsupported dtypes, host and
        device arrays mixed, a non-integer ``seq_len_max``.
    ValueError
        A wrong rank or shape, ``H = 0``, ``seq_len_max`` outside ``[0, T]``,
        missing peephole weights, an unknown layout, a ``precision`` this
        target cannot honour.

    Examples
    --------
    >>> import numpy as np, nblstm
    >>> T, B, I, H = 5, 2, 3, 4
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((T, B, I), dtype=np.float32)
    >>> w = rng.standard_normal((I + H, 4 * H), dtype=np.float32) * 0.3
    >>> b = np.zeros(4 * H, np.float32)
    >>> c0 = h0 = np.zeros((B, H), np.float32)
    >>> out = nblstm.block_lstm(x, c0, h0, w, b)
    >>> out.h.shape, out.h.dtype
    ((5, 2, 4), dtype('float32'))
    """
    peepholes = _peephole_arrays(wci, wcf, wco, use_peephole)
    infos, (steps, _, _, _) = _check_core(x, cs_prev, h_prev, w, b, peepholes)
    seq_len_max = v.check_seq_len_max(seq_len_max, steps)
    options = _options(forget_bias, cell_clip, use_peephole, layout, precision)
    kind = infos["x"].kind
    check_stream(kind, stream)
    check_precision(kind, options.precision)
    outs = target_for(kind).block_lstm(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, b=b, wci=wci, wcf=wcf, wco=wco,
                                       seq_len_max=seq_len_max, options=options, stream=stream)
    return BlockLSTMOutput(*outs)


@accepts_any_array
def block_lstm_grad(x, cs_prev, h_prev, w, outputs, cs_grad=None, h_grad=None, wci=None, wcf=None, wco=None, *,
                    seq_len_max=None, use_peephole=False, layout="ifco", precision="exact", stream=None):
    """LSTM backward over a whole sequence (TensorFlow's BlockLSTMGrad / BlockLSTMGradV2).

    Parameters
    ----------
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
        Same weights and layout as the forward call.
    outputs : BlockLSTMOutput or sequence of 7 [T, B, H] arrays
        The forward outputs ``(i, cs, f, o, ci, co, h)``; trusted, not recomputed.
    cs_grad, h_grad : [T, B, H] arrays, optional
        Gradients of the loss with respect to the outputs ``cs`` and ``h``
        (zeros when omitted). Steps from ``seq_len_max`` on are ignored.
    wci, wcf, wco : [H] arrays, optional
        Required when ``use_peephole`` is true.
    seq_len_max : int, optional
        Same as in the forward call (default ``T``).
    use_peephole : bool, default False
    layout : {"ifco", "icfo"}, default "ifco"
    precision : {"exact", "tf32", "fp16"}, default "exact"
        As :func:`block_lstm`.
    stream : CUDA stream, optional

    Returns
    -------
    BlockLSTMGradOutput
        ``x_grad [T, B, I]`` (zero from ``seq_len_max`` on), ``cs_prev_grad,
        h_prev_grad [B, H]``, ``w_grad [I + H, 4H]``, ``wci_grad, wcf_grad,
        wco_grad [H]`` (zeros without peepholes), ``b_grad [4H]``.

    Raises
    ------
    TypeError, ValueError
        As :func:`block_lstm`, for every argument.

    Notes
    -----
    Cell clipping is treated as the identity (straight-through), as in
    TensorFlow's fused kernels.

    Examples
    --------
    >>> import numpy as np, nblstm
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((5, 2, 3))
    >>> w = rng.standard_normal((3 + 4, 16)) * 0.3
    >>> b = np.zeros(16)
    >>> c0 = h0 = np.zeros((2, 4))
    >>> out = nblstm.block_lstm(x, c0, h0, w, b)
    >>> grads = nblstm.block_lstm_grad(x, c0, h0, w, out, h_grad=np.ones_like(out.h))
    >>> grads.w_grad.shape
    (7, 16)
    """
    return checked_block_lstm_grad(x, cs_prev, h_prev, w, _NO_BIAS, outputs, cs_grad, h_grad, wci, wcf, wco,
                                   seq_len_max, use_peephole, layout, stream, precision)


@accepts_any_array
def checked_block_lstm_grad(x, cs_prev, h_prev, w, b, outputs, cs_grad, h_grad, wci, wcf, wco, seq_len_max,
                            use_peephole, layout, stream, precision="exact"):
    """:func:`block_lstm_grad`, also checking a bias ``b`` (unused) unless it is ``_NO_BIAS`` (for ``raw_ops``)."""
    peepholes = _peephole_arrays(wci, wcf, wco, use_peephole)
    outputs = v.check_outputs(outputs, _OUTPUT_NAMES[:7])
    extra = {name: (a, 3) for name, a in zip(_OUTPUT_NAMES, outputs)}
    for name, a in (("cs_grad", cs_grad), ("h_grad", h_grad)):
        if a is not None:
            extra[name] = (a, 3)
    infos, (steps, batch, _, units) = _check_core(x, cs_prev, h_prev, w, b, peepholes, extra)
    for name in extra:
        v.check_shape(infos[name], (steps, batch, units), "[T, B, H] from x and cs_prev")
    seq_len_max = v.check_seq_len_max(seq_len_max, steps)
    options = _options(0.0, None, use_peephole, layout, precision)
    kind = infos["x"].kind
    check_stream(kind, stream)
    check_precision(kind, options.precision)
    grads = target_for(kind).block_lstm_grad(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, wci=wci, wcf=wcf, wco=wco,
                                             outputs=outputs, cs_grad=cs_grad, h_grad=h_grad,
                                             seq_len_max=seq_len_max, options=options, stream=stream)
    return BlockLSTMGradOutput(*grads)


@accepts_any_array
def lstm_block_cell(x, cs_prev, h_prev, w, b, wci=None, wcf=None, wco=None, *, forget_bias=0.0, cell_clip=None,
                    use_peephole=False, layout="ifco", precision="exact", stream=None):
    """One LSTM step (TensorFlow's LSTMBlockCell, with a choice of gate layout).

    Parameters
    ----------
    x : [B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    b : [4H] array
    wci, wcf, wco : [H] arrays, optional
        Required when ``use_peephole`` is true.
    forget_bias : float, default 0.0
    cell_clip : float, optional
        Positive to clip the cell state; ``None`` or ``<= 0`` for no clipping.
    use_peephole : bool, default False
    layout : {"ifco", "icfo"}, default "ifco"
    precision : {"exact", "tf32", "fp16"}, default "exact"
        As :func:`block_lstm`.
    stream : CUDA stream, optional

    Returns
    -------
    LSTMBlockCellOutput
        ``(i, cs, f, o, ci, co, h)``, each ``[B, H]``.

    Raises
    ------
    TypeError, ValueError
        As :func:`block_lstm`.

    Examples
    --------
    >>> import numpy as np, nblstm
    >>> x = np.ones((1, 2))
    >>> w = np.full((2 + 2, 8), 0.5)
    >>> c0 = h0 = np.full((1, 2), 0.1)
    >>> step = nblstm.lstm_block_cell(x, c0, h0, w, np.zeros(8), forget_bias=1.0, layout="icfo")
    >>> np.round(step.cs, 6), np.round(step.h, 6)
    (array([[0.689673, 0.689673]]), array([[0.448484, 0.448484]]))
    """
    peepholes = _peephole_arrays(wci, wcf, wco, use_peephole)
    infos, _ = _check_core(x, cs_prev, h_prev, w, b, peepholes, x_rank=2)
    options = _options(forget_bias, cell_clip, use_peephole, layout, precision)
    kind = infos["x"].kind
    check_stream(kind, stream)
    check_precision(kind, options.precision)
    outs = target_for(kind).lstm_block_cell(x=x, cs_prev=cs_prev, h_prev=h_prev, w=w, b=b, wci=wci, wcf=wcf,
                                            wco=wco, options=options, stream=stream)
    return LSTMBlockCellOutput(*outs)


@accepts_any_array
def lstm_block_cell_grad(x, cs_prev, h_prev, w, outputs, cs_grad=None, h_grad=None, wci=None, wcf=None, wco=None, *,
                         use_peephole=False, layout="ifco", stream=None):
    """Gradient of one LSTM step's elementwise part (TensorFlow's LSTMBlockCellGrad).

    Parameters
    ----------
    x : [B, I] array
        Validated for shape; the step's input gradient is ``dicfo @ w[:I].T``.
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    outputs : LSTMBlockCellOutput or sequence of 6 or 7 [B, H] arrays
        The step's forward outputs ``(i, cs, f, o, ci, co[, h])``.
    cs_grad, h_grad : [B, H] arrays, optional
        Total gradients of the step's ``cs`` and ``h`` (zeros when omitted).
    wci, wcf, wco : [H] arrays, optional
        Required when ``use_peephole`` is true.
    use_peephole : bool, default False
    layout : {"ifco", "icfo"}, default "ifco"
    stream : CUDA stream, optional

    Returns
    -------
    LSTMBlockCellGradOutput
        ``cs_prev_grad [B, H]``, ``dicfo [B, 4H]`` in ``layout`` order, and
        this step's ``wci_grad, wcf_grad, wco_grad [H]``.

    Raises
    ------
    TypeError, ValueError
        As :func:`block_lstm`.

    Examples
    --------
    >>> import numpy as np, nblstm
    >>> x, c0, h0 = np.ones((1, 2)), np.zeros((1, 3)), np.zeros((1, 3))
    >>> w = np.full((5, 12), 0.1)
    >>> step = nblstm.lstm_block_cell(x, c0, h0, w, np.zeros(12))
    >>> g = nblstm.lstm_block_cell_grad(x, c0, h0, w, step, h_grad=np.ones((1, 3)))
    >>> g.dicfo.shape
    (1, 12)
    """
    return checked_lstm_block_cell_grad(x, cs_prev, h_prev, w, _NO_BIAS, outputs, cs_grad, h_grad, wci, wcf, wco,
                                        use_peephole, layout, stream)


@accepts_any_array
def checked_lstm_block_cell_grad(x, cs_prev, h_prev, w, b, outputs, cs_grad, h_grad, wci, wcf, wco, use_peephole,
                                 layout, stream):
    """:func:`lstm_block_cell_grad`, also checking a bias ``b`` (unused) unless it is ``_NO_BIAS`` (for ``raw_ops``)."""
    peepholes = _peephole_arrays(wci, wcf, wco, use_peephole)
    outputs = v.check_outputs(outputs, _OUTPUT_NAMES[:6])
    extra = {name: (a, 2) for name, a in zip(_OUTPUT_NAMES, outputs)}
    for name, a in (("cs_grad", cs_grad), ("h_grad", h_grad)):
        if a is not None:
            extra[name] = (a, 2)
    infos, (_, batch, _, units) = _check_core(x, cs_prev, h_prev, w, b, peepholes, extra, x_rank=2)
    for name in extra:
        v.check_shape(infos[name], (batch, units), "[B, H] from x and cs_prev")
    options = _options(0.0, None, use_peephole, layout)
    kind = infos["x"].kind
    check_stream(kind, stream)
    grads = target_for(kind).lstm_block_cell_grad(cs_prev=cs_prev, w=w, wci=wci, wcf=wcf, wco=wco, outputs=outputs,
                                                  cs_grad=cs_grad, h_grad=h_grad, options=options, stream=stream)
    return LSTMBlockCellGradOutput(*grads)
