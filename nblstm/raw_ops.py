"""TensorFlow's fused LSTM ops with TensorFlow's exact signatures.

Code written against ``tf.raw_ops`` ports by changing the import::

    from nblstm import raw_ops
    out = raw_ops.BlockLSTMV2(seq_len_max=T, x=x, cs_prev=c0, h_prev=h0, w=w,
                              wci=wci, wcf=wcf, wco=wco, b=b)

Arguments have TensorFlow's names, order and defaults (they may be passed by
keyword, as ``tf.raw_ops`` requires, or by position); results are named
tuples whose fields are TensorFlow's output names. ``name`` is accepted and
ignored. Each op is a thin wrapper over the functions of :mod:`nblstm.ops`:

- ``BlockLSTM``, ``BlockLSTMGrad``, ``LSTMBlockCell``, ``LSTMBlockCellGrad``
  use the ICFO gate layout; ``BlockLSTMV2`` and ``BlockLSTMGradV2`` use IFCO.
- ``BlockLSTMV2`` has no ``forget_bias`` (it is 0).
- ``cell_clip <= 0`` turns clipping off, as in TensorFlow.

Differences from TensorFlow (deliberate): outputs past ``seq_len_max`` are
all zero (TensorFlow leaves five of them uninitialised); a bad argument
raises ``ValueError``/``TypeError`` instead of aborting the process; float64
is supported.
"""

from . import ops
from ._validate import describe_array

__all__ = ["BlockLSTM", "BlockLSTMV2", "BlockLSTMGrad", "BlockLSTMGradV2", "LSTMBlockCell", "LSTMBlockCellGrad"]


def _required(**arrays):
    """TensorFlow's ops take every array; ``None`` is not an array (the ops check the others)."""
    for name, value in arrays.items():
        if value is None:
            describe_array(name, value)  # raises TypeError naming the argument


def BlockLSTM(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0,
              use_peephole=False, name=None):
    """TensorFlow's BlockLSTM: whole-sequence forward, ICFO gate layout.

    Parameters
    ----------
    seq_len_max : int
        Steps to compute, ``0 <= seq_len_max <= T``.
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
        ICFO columns.
    wci, wcf, wco : [H] arrays
        Peephole weights (read only when ``use_peephole``).
    b : [4H] array
    forget_bias : float, default 1.0
    cell_clip : float, default 3.0
        ``<= 0`` turns clipping off.
    use_peephole : bool, default False
    name : str, optional
        Ignored.

    Returns
    -------
    BlockLSTMOutput
        ``(i, cs, f, o, ci, co, h)``, each ``[T, B, H]``.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm import raw_ops
    >>> T, B, I, H = 4, 2, 3, 5
    >>> x = np.ones((T, B, I), np.float32)
    >>> c0 = h0 = np.zeros((B, H), np.float32)
    >>> w = np.full((I + H, 4 * H), 0.1, np.float32)
    >>> zeros = np.zeros(H, np.float32)
    >>> out = raw_ops.BlockLSTM(seq_len_max=T, x=x, cs_prev=c0, h_prev=h0, w=w, wci=zeros, wcf=zeros, wco=zeros,
    ...                         b=np.zeros(4 * H, np.float32))
    >>> out._fields, out.h.shape
    (('i', 'cs', 'f', 'o', 'ci', 'co', 'h'), (4, 2, 5))
    """
    _required(wci=wci, wcf=wcf, wco=wco)
    return ops.block_lstm(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max=seq_len_max,
                          forget_bias=forget_bias, cell_clip=cell_clip, use_peephole=use_peephole, layout="icfo")


def BlockLSTMV2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, cell_clip=0.0, use_peephole=False, name=None):
    """TensorFlow's BlockLSTMV2: whole-sequence forward, IFCO gate layout, no forget bias.

    Parameters
    ----------
    seq_len_max : int
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
        IFCO columns.
    wci, wcf, wco : [H] arrays
    b : [4H] array
    cell_clip : float, default 0.0 (off)
    use_peephole : bool, default False
    name : str, optional
        Ignored.

    Returns
    -------
    BlockLSTMOutput
        ``(i, cs, f, o, ci, co, h)``, each ``[T, B, H]``.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm import raw_ops
    >>> T, B, I, H = 4, 2, 3, 5
    >>> x = np.ones((T, B, I), np.float32)
    >>> c0 = h0 = np.zeros((B, H), np.float32)
    >>> w = np.full((I + H, 4 * H), 0.1, np.float32)
    >>> zeros = np.zeros(H, np.float32)
    >>> out = raw_ops.BlockLSTMV2(seq_len_max=T, x=x, cs_prev=c0, h_prev=h0, w=w, wci=zeros, wcf=zeros, wco=zeros,
    ...                           b=np.zeros(4 * H, np.float32))
    >>> out._fields, out.h.shape
    (('i', 'cs', 'f', 'o', 'ci', 'co', 'h'), (4, 2, 5))
    """
    _required(wci=wci, wcf=wcf, wco=wco)
    return ops.block_lstm(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max=seq_len_max, forget_bias=0.0,
                          cell_clip=cell_clip, use_peephole=use_peephole, layout="ifco")


def _block_lstm_grad(layout, seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad,
                     h_grad, use_peephole):
    # b is not used by the gradient, but TensorFlow checks it: so do we. The
    # peephole weights are required (with or without use_peephole) and checked
    # like the other arrays.
    _required(wci=wci, wcf=wcf, wco=wco, cs_grad=cs_grad, h_grad=h_grad)
    return ops.checked_block_lstm_grad(x, cs_prev, h_prev, w, b, (i, cs, f, o, ci, co, h), cs_grad, h_grad, wci, wcf,
                                       wco, seq_len_max, use_peephole, layout, None)


def BlockLSTMGrad(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad, h_grad,
                  use_peephole, name=None):
    """TensorFlow's BlockLSTMGrad: whole-sequence backward, ICFO gate layout.

    Parameters
    ----------
    seq_len_max : int
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    wci, wcf, wco : [H] arrays
    b : [4H] array
        Checked, not used.
    i, cs, f, o, ci, co, h : [T, B, H] arrays
        Forward outputs (trusted).
    cs_grad, h_grad : [T, B, H] arrays
    use_peephole : bool
    name : str, optional
        Ignored.

    Returns
    -------
    BlockLSTMGradOutput
        ``(x_grad, cs_prev_grad, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)``.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm import raw_ops
    >>> T, B, I, H = 4, 2, 3, 5
    >>> args = dict(x=np.ones((T, B, I)), cs_prev=np.zeros((B, H)), h_prev=np.zeros((B, H)),
    ...             w=np.full((I + H, 4 * H), 0.1), wci=np.zeros(H), wcf=np.zeros(H), wco=np.zeros(H),
    ...             b=np.zeros(4 * H))
    >>> out = raw_ops.BlockLSTM(seq_len_max=T, **args)
    >>> grads = raw_ops.BlockLSTMGrad(seq_len_max=T, **args, **out._asdict(), cs_grad=np.zeros((T, B, H)),
    ...                               h_grad=np.ones((T, B, H)), use_peephole=False)
    >>> grads.x_grad.shape, grads.w_grad.shape
    ((4, 2, 3), (8, 20))
    """
    return _block_lstm_grad("icfo", seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h,
                            cs_grad, h_grad, use_peephole)


def BlockLSTMGradV2(seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h, cs_grad, h_grad,
                    use_peephole, name=None):
    """TensorFlow's BlockLSTMGradV2: whole-sequence backward, IFCO gate layout.

    Same parameters and results as :func:`BlockLSTMGrad`. Unlike
    TensorFlow's autodiff through BlockLSTMV2 (which calls the ICFO gradient
    on IFCO weights), this is the correct gradient of :func:`BlockLSTMV2`.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm import raw_ops
    >>> T, B, I, H = 4, 2, 3, 5
    >>> args = dict(x=np.ones((T, B, I)), cs_prev=np.zeros((B, H)), h_prev=np.zeros((B, H)),
    ...             w=np.full((I + H, 4 * H), 0.1), wci=np.zeros(H), wcf=np.zeros(H), wco=np.zeros(H),
    ...             b=np.zeros(4 * H))
    >>> out = raw_ops.BlockLSTMV2(seq_len_max=T, **args)
    >>> grads = raw_ops.BlockLSTMGradV2(seq_len_max=T, **args, **out._asdict(), cs_grad=np.zeros((T, B, H)),
    ...                                 h_grad=np.ones((T, B, H)), use_peephole=False)
    >>> grads.x_grad.shape, grads.w_grad.shape
    ((4, 2, 3), (8, 20))
    """
    return _block_lstm_grad("ifco", seq_len_max, x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, h,
                            cs_grad, h_grad, use_peephole)


def LSTMBlockCell(x, cs_prev, h_prev, w, wci, wcf, wco, b, forget_bias=1.0, cell_clip=3.0, use_peephole=False,
                  name=None):
    """TensorFlow's LSTMBlockCell: one step, ICFO gate layout.

    Parameters
    ----------
    x : [B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    wci, wcf, wco : [H] arrays
    b : [4H] array
    forget_bias : float, default 1.0
    cell_clip : float, default 3.0
    use_peephole : bool, default False
    name : str, optional
        Ignored.

    Returns
    -------
    LSTMBlockCellOutput
        ``(i, cs, f, o, ci, co, h)``, each ``[B, H]``.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm import raw_ops
    >>> B, I, H = 1, 2, 2
    >>> state = np.full((B, H), 0.1)
    >>> step = raw_ops.LSTMBlockCell(x=np.ones((B, I)), cs_prev=state, h_prev=state, w=np.full((I + H, 4 * H), 0.5),
    ...                              wci=np.zeros(H), wcf=np.zeros(H), wco=np.zeros(H), b=np.zeros(4 * H),
    ...                              cell_clip=-1.0)
    >>> np.round(step.h, 6)
    array([[0.448484, 0.448484]])
    """
    _required(wci=wci, wcf=wcf, wco=wco)
    return ops.lstm_block_cell(x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias=forget_bias,
                               cell_clip=cell_clip, use_peephole=use_peephole, layout="icfo")


def LSTMBlockCellGrad(x, cs_prev, h_prev, w, wci, wcf, wco, b, i, cs, f, o, ci, co, cs_grad, h_grad, use_peephole,
                      name=None):
    """TensorFlow's LSTMBlockCellGrad: the elementwise gradient of one step, ICFO layout.

    Parameters
    ----------
    x : [B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    wci, wcf, wco : [H] arrays
    b : [4H] array
        Checked, not used.
    i, cs, f, o, ci, co : [B, H] arrays
        The step's forward outputs.
    cs_grad, h_grad : [B, H] arrays
        Total gradients of the step's ``cs`` and ``h``.
    use_peephole : bool
    name : str, optional
        Ignored.

    Returns
    -------
    LSTMBlockCellGradOutput
        ``(cs_prev_grad [B, H], dicfo [B, 4H], wci_grad, wcf_grad, wco_grad [H])``.

    Notes
    -----
    TensorFlow's GPU kernel adds the peephole term to ``cs_prev_grad`` twice
    (TensorFlow issue 34171); this follows the CPU kernel, which is right.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm import raw_ops
    >>> B, I, H = 1, 2, 2
    >>> args = dict(x=np.ones((B, I)), cs_prev=np.zeros((B, H)), h_prev=np.zeros((B, H)),
    ...             w=np.full((I + H, 4 * H), 0.5), wci=np.zeros(H), wcf=np.zeros(H), wco=np.zeros(H),
    ...             b=np.zeros(4 * H))
    >>> step = raw_ops.LSTMBlockCell(**args)
    >>> grads = raw_ops.LSTMBlockCellGrad(**args, i=step.i, cs=step.cs, f=step.f, o=step.o, ci=step.ci,
    ...                                   co=step.co, cs_grad=np.zeros((B, H)), h_grad=np.ones((B, H)),
    ...                                   use_peephole=False)
    >>> grads.dicfo.shape
    (1, 8)
    """
    _required(wci=wci, wcf=wcf, wco=wco, cs_grad=cs_grad, h_grad=h_grad)
    return ops.checked_lstm_block_cell_grad(x, cs_prev, h_prev, w, b, (i, cs, f, o, ci, co), cs_grad, h_grad, wci,
                                            wcf, wco, use_peephole, "icfo", None)
