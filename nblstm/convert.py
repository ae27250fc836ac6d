"""Weight layouts of TF1 ``LSTMCell``, BlockLSTM V1/V2, Keras, PyTorch, cuDNN and ONNX (:ref:`spec-conversion`).

NumPy only: every function takes arrays (or anything ``numpy.asarray``
accepts, PyTorch tensors included) and returns new NumPy arrays; the
arguments are never modified. The gate order of the ``4H`` columns is ICFO
(``i, j/ci, f, o``) for TF1 ``LSTMCell`` and BlockLSTM V1, IFCO (``i, f,
g/ci, o``) for BlockLSTMV2, Keras, PyTorch and cuDNN, IOFC (``i, o, f, c``)
for ONNX.

The ``forget_bias`` of TF1 ``LSTMCell`` and BlockLSTM V1 is added inside the
forget gate's sigmoid; the IFCO frameworks have none, so conversions to them
fold it into the forget block of the bias, and conversions from them take
``forget_bias=0.0`` by default (exact: no rounding of the bias).

Name conventions of the dicts used here:

- TF1 ``LSTMCell`` weights: ``kernel [I + P, 4H]``, ``bias [4H]``, optional
  ``w_f_diag, w_i_diag, w_o_diag [H]`` and ``projection/kernel [H, P]``
  (``P = num_proj or H``), as :meth:`nblstm.LSTMCell.get_weights` returns.
- PyTorch ``nn.LSTM`` state dicts: ``weight_ih_l{k} [4H, I]``,
  ``weight_hh_l{k} [4H, P]``, ``bias_ih_l{k}, bias_hh_l{k} [4H]``, optional
  ``weight_hr_l{k} [P, H]`` (``proj_size``).
- Keras ``LSTM``: ``[kernel [I, 4H], recurrent_kernel [H, 4H], bias [4H]]``
  (the order of ``layer.get_weights()``).
- ONNX ``LSTM`` node inputs of one direction: ``W [4H, I]``, ``R [4H, H]``,
  optional ``B [8H]`` (``Wb`` then ``Rb``) and ``P [3H]`` (peepholes ``i, o, f``).
"""

import numpy as np

__all__ = [
    "SWAP_CF_BLOCKS",
    "icfo_to_ifco",
    "ifco_to_icfo",
    "keras_cudnn_to_keras",
    "block_lstm_v1_to_v2",
    "block_lstm_v2_to_v1",
    "lstmcell_to_block_lstm",
    "block_lstm_to_lstmcell",
    "keras_to_block_lstm_v2",
    "block_lstm_v2_to_keras",
    "torch_to_block_lstm_v2",
    "block_lstm_v2_to_torch",
    "lstmcell_to_torch",
    "torch_to_lstmcell",
    "lstmcell_to_keras",
    "keras_to_lstmcell",
    "block_lstm_v2_to_cudnn",
    "cudnn_to_block_lstm_v2",
    "onnx_to_lstmcell",
    "lstmcell_to_onnx",
]

_PEEPHOLE_NAMES = ("w_i_diag", "w_f_diag", "w_o_diag")

#: Gate block ``k`` of ``[i|f|c|o]`` is block ``SWAP_CF_BLOCKS[k]`` of ``[i|c|f|o]``, and the other way round:
#: the permutation of :func:`icfo_to_ifco` and :func:`ifco_to_icfo`, for code that moves the blocks itself.
SWAP_CF_BLOCKS = (0, 2, 1, 3)


def _array(value, name):
    """``value`` as a NumPy array (PyTorch tensors are detached and copied to the host)."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        value = value.detach().cpu().numpy()
    elif hasattr(value, "copy_to_host"):
        value = value.copy_to_host()
    elif hasattr(value, "numpy") and not isinstance(value, np.ndarray):
        value = value.numpy()
    a = np.asarray(value)
    if a.dtype.kind != "f":
        raise TypeError(f"{name} must be a floating-point array, got dtype {a.dtype}")
    return a


def _gate_blocks(a, axis, name):
    a = _array(a, name)
    size = a.shape[axis]
    if size % 4:
        raise ValueError(f"{name} has {size} entries along axis {axis}; expected 4H (four gate blocks)")
    return np.split(a, 4, axis=axis)


def icfo_to_ifco(a, axis=-1):
    """Reorder the four gate blocks of ``a`` along ``axis`` from ``[i|c|f|o]`` to ``[i|f|c|o]``.

    Parameters
    ----------
    a : [..., 4H, ...] array
    axis : int, default -1

    Returns
    -------
    numpy.ndarray
        A new array, same shape.

    Examples
    --------
    >>> icfo_to_ifco(np.arange(8.0))
    array([0., 1., 4., 5., 2., 3., 6., 7.])
    """
    blocks = _gate_blocks(a, axis, "a")
    return np.concatenate([blocks[k] for k in SWAP_CF_BLOCKS], axis=axis)


def ifco_to_icfo(a, axis=-1):
    """Reorder the four gate blocks of ``a`` along ``axis`` from ``[i|f|c|o]`` to ``[i|c|f|o]`` (inverse of
    :func:`icfo_to_ifco`).

    Examples
    --------
    >>> ifco_to_icfo(icfo_to_ifco(np.arange(8.0)))
    array([0., 1., 2., 3., 4., 5., 6., 7.])
    """
    blocks = _gate_blocks(a, axis, "a")
    return np.concatenate([blocks[k] for k in SWAP_CF_BLOCKS], axis=axis)


def _add_to_forget_block(b_ifco, value):
    """Add ``value`` to the forget block ``[H, 2H)`` of an IFCO bias (a new array)."""
    b = np.array(b_ifco, copy=True)
    units = b.shape[-1] // 4
    if value:
        b[..., units:2 * units] += b.dtype.type(value)
    return b


def block_lstm_v1_to_v2(w, b, forget_bias=1.0):
    """BlockLSTM (V1, ICFO, ``forget_bias``) weights to BlockLSTMV2 (IFCO, no forget bias).

    Parameters
    ----------
    w : [I + H, 4H] array
    b : [4H] array
    forget_bias : float, default 1.0
        The V1 op's ``forget_bias``; folded into the forget block of the bias.

    Returns
    -------
    tuple
        ``(w2 [I + H, 4H], b2 [4H])``.

    Examples
    --------
    >>> w, b = np.zeros((5, 8)), np.zeros(8)  # I = 3, H = 2
    >>> w2, b2 = block_lstm_v1_to_v2(w, b, forget_bias=1.0)
    >>> w2.shape, b2
    ((5, 8), array([0., 0., 1., 1., 0., 0., 0., 0.]))
    """
    return icfo_to_ifco(w), _add_to_forget_block(icfo_to_ifco(b), forget_bias)


def block_lstm_v2_to_v1(w, b, forget_bias=1.0):
    """BlockLSTMV2 weights to BlockLSTM (V1) run with ``forget_bias`` (subtracted from the forget block).

    Parameters
    ----------
    w : [I + H, 4H] array
        BlockLSTMV2 weights, IFCO columns.
    b : [4H] array
    forget_bias : float, default 1.0
        The ``forget_bias`` the BlockLSTM (V1) op will be run with.

    Returns
    -------
    tuple
        ``(w1 [I + H, 4H], b1 [4H])``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> w, b = rng.standard_normal((5, 8)), rng.standard_normal(8)  # I = 3, H = 2
    >>> w1, b1 = block_lstm_v2_to_v1(*block_lstm_v1_to_v2(w, b, forget_bias=1.0), forget_bias=1.0)
    >>> w1.shape, np.allclose(w1, w) and np.allclose(b1, b)
    ((5, 8), True)
    """
    return ifco_to_icfo(w), ifco_to_icfo(_add_to_forget_block(b, -forget_bias))


def _cell_sizes(weights):
    """``(I, H, P, has_proj)`` of TF1 LSTMCell weights, checking the shapes agree."""
    for name in ("kernel", "bias"):
        if name not in weights:
            raise ValueError(f"weights lack {name!r}")
    kernel = _array(weights["kernel"], "kernel")
    bias = _array(weights["bias"], "bias")
    if bias.ndim != 1 or bias.shape[0] % 4 or bias.shape[0] == 0:
        raise ValueError(f"bias has shape {bias.shape}; expected [4H]")
    units = bias.shape[0] // 4
    proj = weights.get("projection/kernel")
    depth = units
    if proj is not None:
        proj = _array(proj, "projection/kernel")
        if proj.ndim != 2 or proj.shape[0] != units:
            raise ValueError(f"projection/kernel has shape {proj.shape}; expected [H, P] with H = {units}")
        depth = proj.shape[1]
    if kernel.ndim != 2 or kernel.shape[1] != 4 * units or kernel.shape[0] <= depth:
        raise ValueError(f"kernel has shape {kernel.shape}; expected [I + {depth}, {4 * units}] with I > 0")
    return kernel.shape[0] - depth, units, depth, proj is not None


def _peepholes_of(weights):
    present = [n for n in _PEEPHOLE_NAMES if weights.get(n) is not None]
    if present and len(present) != 3:
        raise ValueError(f"peephole weights must come as all of {_PEEPHOLE_NAMES}, got {present}")
    return {n: _array(weights[n], n) for n in present}


def lstmcell_to_block_lstm(weights, forget_bias=1.0, cell_clip=None):
    """Arguments of BlockLSTM (V1, ``layout="icfo"``) that reproduce a TF1 ``LSTMCell`` with a tanh activation.

    Parameters
    ----------
    weights : dict
        ``LSTMCell`` weights, without ``projection/kernel``.
    forget_bias : float, default 1.0
    cell_clip : float, optional
        The cell's ``cell_clip``; ``None`` becomes ``-1`` (off). ``0.0``
        has no BlockLSTM equivalent (it clips the cell to zero in
        ``LSTMCell`` but turns clipping off in BlockLSTM).

    Returns
    -------
    dict
        Keyword arguments for :func:`nblstm.block_lstm`: ``w, b, wci, wcf,
        wco, forget_bias, cell_clip, use_peephole, layout``.

    Raises
    ------
    ValueError
        A projection, ``cell_clip <= 0``, or malformed weights.

    Examples
    --------
    >>> import nblstm
    >>> weights = {"kernel": np.full((5, 8), 0.1), "bias": np.zeros(8)}  # I = 3, H = 2
    >>> args = lstmcell_to_block_lstm(weights)
    >>> args["w"].shape, args["use_peephole"], args["cell_clip"], args["layout"]
    ((5, 8), False, -1.0, 'icfo')
    >>> x, c0, h0 = np.ones((3, 1, 3)), np.zeros((1, 2)), np.zeros((1, 2))  # [T, B, I], [B, H]
    >>> nblstm.block_lstm(x, c0, h0, **args).h.shape
    (3, 1, 2)
    """
    _, units, _, has_proj = _cell_sizes(weights)
    if has_proj:
        raise ValueError("BlockLSTM has no projection: weights with 'projection/kernel' cannot be converted")
    if cell_clip is not None and cell_clip <= 0:
        raise ValueError(f"cell_clip={cell_clip!r} has no BlockLSTM equivalent (BlockLSTM treats <= 0 as off)")
    peep = _peepholes_of(weights)
    kernel = _array(weights["kernel"], "kernel")
    zeros = np.zeros(units, kernel.dtype)
    return {
        "w": kernel.copy(),
        "b": _array(weights["bias"], "bias").copy(),
        "wci": peep.get("w_i_diag", zeros).copy(),
        "wcf": peep.get("w_f_diag", zeros).copy(),
        "wco": peep.get("w_o_diag", zeros).copy(),
        "forget_bias": float(forget_bias),
        "cell_clip": -1.0 if cell_clip is None else float(cell_clip),
        "use_peephole": bool(peep),
        "layout": "icfo",
    }


def block_lstm_to_lstmcell(w, b, wci=None, wcf=None, wco=None):
    """BlockLSTM (V1, ICFO) weights as TF1 ``LSTMCell`` weights (use the same ``forget_bias``).

    Parameters
    ----------
    w : [I + H, 4H] array
        BlockLSTM (V1) weights, ICFO columns.
    b : [4H] array
    wci, wcf, wco : [H] arrays, optional
        Peephole weights, all three or none; they become ``w_i_diag, w_f_diag, w_o_diag``.

    Returns
    -------
    dict
        ``kernel``, ``bias`` and, when the peepholes are given, ``w_f_diag,
        w_i_diag, w_o_diag``.

    Examples
    --------
    >>> w, b = np.zeros((5, 8)), np.zeros(8)  # I = 3, H = 2
    >>> sorted(block_lstm_to_lstmcell(w, b))
    ['bias', 'kernel']
    >>> wci, wcf, wco = np.zeros((3, 2))
    >>> sorted(block_lstm_to_lstmcell(w, b, wci, wcf, wco))
    ['bias', 'kernel', 'w_f_diag', 'w_i_diag', 'w_o_diag']
    """
    out = {"kernel": _array(w, "w").copy(), "bias": _array(b, "b").copy()}
    given = [p is not None for p in (wci, wcf, wco)]
    if any(given):
        if not all(given):
            raise ValueError("peephole weights wci, wcf, wco must be given together")
        out["w_f_diag"] = _array(wcf, "wcf").copy()
        out["w_i_diag"] = _array(wci, "wci").copy()
        out["w_o_diag"] = _array(wco, "wco").copy()
    return out


def keras_to_block_lstm_v2(kernel, recurrent_kernel, bias):
    """Keras ``LSTM`` weights to BlockLSTMV2: ``w = [kernel; recurrent_kernel]``, ``b = bias``.

    Parameters
    ----------
    kernel : [I, 4H] array
    recurrent_kernel : [H, 4H] array
    bias : [4H] array or None
        ``None`` for ``use_bias=False`` (zeros).

    Returns
    -------
    tuple
        ``(w [I + H, 4H], b [4H])``.

    Examples
    --------
    >>> kernel, recurrent_kernel = np.ones((3, 8)), np.zeros((2, 8))  # I = 3, H = 2
    >>> w, b = keras_to_block_lstm_v2(kernel, recurrent_kernel, None)
    >>> w.shape, b.shape, float(w[:3].sum()), float(w[3:].sum())
    ((5, 8), (8,), 24.0, 0.0)
    """
    kernel = _array(kernel, "kernel")
    recurrent_kernel = _array(recurrent_kernel, "recurrent_kernel")
    if kernel.ndim != 2 or recurrent_kernel.ndim != 2 or recurrent_kernel.shape[1] != 4 * recurrent_kernel.shape[0] \
            or kernel.shape[1] != recurrent_kernel.shape[1]:
        raise ValueError(f"kernel {kernel.shape} and recurrent_kernel {recurrent_kernel.shape} must be [I, 4H] and "
                         "[H, 4H]")
    b = np.zeros(kernel.shape[1], kernel.dtype) if bias is None else _array(bias, "bias").copy()
    if b.shape != (kernel.shape[1],):
        raise ValueError(f"bias has shape {b.shape}; expected ({kernel.shape[1]},)")
    return np.concatenate([kernel, recurrent_kernel], axis=0), b


def block_lstm_v2_to_keras(w, b, input_size):
    """BlockLSTMV2 weights to Keras ``LSTM``: ``[kernel [I, 4H], recurrent_kernel [H, 4H], bias [4H]]``.

    Parameters
    ----------
    w : [I + H, 4H] array
        BlockLSTMV2 weights, IFCO columns.
    b : [4H] array
    input_size : int
        ``I``.

    Examples
    --------
    >>> w, b = np.arange(40.0).reshape(5, 8), np.zeros(8)  # I = 3, H = 2
    >>> kernel, recurrent_kernel, bias = block_lstm_v2_to_keras(w, b, input_size=3)
    >>> kernel.shape, recurrent_kernel.shape, bias.shape
    ((3, 8), (2, 8), (8,))
    >>> np.array_equal(keras_to_block_lstm_v2(kernel, recurrent_kernel, bias)[0], w)
    True
    """
    w = _array(w, "w")
    return [w[:input_size].copy(), w[input_size:].copy(), _array(b, "b").copy()]


def _torch_key(state_dict, stem, layer, suffix):
    key = f"{stem}_l{layer}{suffix}"
    if key not in state_dict:
        raise ValueError(f"state_dict lacks {key!r}; it has {sorted(state_dict)}")
    return _array(state_dict[key], key)


def torch_to_block_lstm_v2(state_dict, layer=0, suffix=""):
    """One layer of a PyTorch ``nn.LSTM`` state dict to BlockLSTMV2 weights (plus its projection).

    Parameters
    ----------
    state_dict : mapping
        ``weight_ih_l{layer}{suffix}``, ``weight_hh_l...``, optional
        ``bias_ih_l...``, ``bias_hh_l...`` (``bias=False``) and
        ``weight_hr_l...`` (``proj_size > 0``).
    layer : int, default 0
    suffix : str, default ""
        ``"_reverse"`` for the backward direction of a bidirectional LSTM.

    Returns
    -------
    tuple
        ``(w [I + P, 4H], b [4H], projection [H, P] or None)`` with
        ``b = bias_ih + bias_hh``.

    Examples
    --------
    >>> state_dict = {"weight_ih_l0": np.ones((8, 3)), "weight_hh_l0": np.ones((8, 2)),  # H = 2, I = 3
    ...               "bias_ih_l0": np.ones(8), "bias_hh_l0": np.ones(8)}
    >>> w, b, projection = torch_to_block_lstm_v2(state_dict)
    >>> w.shape, b[:2], projection
    ((5, 8), array([2., 2.]), None)
    """
    w_ih = _torch_key(state_dict, "weight_ih", layer, suffix)
    w_hh = _torch_key(state_dict, "weight_hh", layer, suffix)
    four_units = w_ih.shape[0]
    b = np.zeros(four_units, w_ih.dtype)
    for stem in ("bias_ih", "bias_hh"):
        if f"{stem}_l{layer}{suffix}" in state_dict:
            b = b + _torch_key(state_dict, stem, layer, suffix)
    proj = None
    if f"weight_hr_l{layer}{suffix}" in state_dict:
        proj = _torch_key(state_dict, "weight_hr", layer, suffix).T.copy()
    return np.concatenate([w_ih.T, w_hh.T], axis=0), b, proj


def block_lstm_v2_to_torch(w, b, input_size, projection=None, layer=0, suffix=""):
    """BlockLSTMV2 weights (plus a projection) to a PyTorch ``nn.LSTM`` state dict of one layer.

    The bias goes to ``bias_ih``; ``bias_hh`` is zero.

    Parameters
    ----------
    w : [I + P, 4H] array
    b : [4H] array
    input_size : int
    projection : [H, P] array, optional
        Becomes ``weight_hr = projection.T`` (``proj_size = P``).
    layer : int, default 0
    suffix : str, default ""

    Returns
    -------
    dict
        ``{name: numpy array}``; load with ``module.load_state_dict({k:
        torch.from_numpy(v) ...})``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> w, b = rng.standard_normal((5, 8)), rng.standard_normal(8)  # I = 3, H = 2
    >>> state_dict = block_lstm_v2_to_torch(w, b, input_size=3)
    >>> {k: a.shape for k, a in state_dict.items()}
    {'weight_ih_l0': (8, 3), 'weight_hh_l0': (8, 2), 'bias_ih_l0': (8,), 'bias_hh_l0': (8,)}
    >>> w2, b2, _ = torch_to_block_lstm_v2(state_dict)
    >>> np.allclose(w2, w) and np.allclose(b2, b)
    True
    """
    w = _array(w, "w")
    b = _array(b, "b")
    out = {
        f"weight_ih_l{layer}{suffix}": np.ascontiguousarray(w[:input_size].T),
        f"weight_hh_l{layer}{suffix}": np.ascontiguousarray(w[input_size:].T),
        f"bias_ih_l{layer}{suffix}": b.copy(),
        f"bias_hh_l{layer}{suffix}": np.zeros_like(b),
    }
    if projection is not None:
        out[f"weight_hr_l{layer}{suffix}"] = np.ascontiguousarray(_array(projection, "projection").T)
    return out


def _cell_to_v2(weights, forget_bias):
    input_size, _, _, _ = _cell_sizes(weights)
    if _peepholes_of(weights):
        raise ValueError("peephole weights (w_i_diag, w_f_diag, w_o_diag) have no equivalent in this format")
    w, b = block_lstm_v1_to_v2(weights["kernel"], weights["bias"], forget_bias)
    return input_size, w, b


def lstmcell_to_torch(weights, forget_bias=1.0, layer=0, suffix=""):
    """TF1 ``LSTMCell`` weights to a PyTorch ``nn.LSTM`` state dict (with ``proj_size`` when projected).

    ``W = icfo_to_ifco(kernel)``, ``weight_ih = W[:I].T``, ``weight_hh =
    W[I:].T``, ``bias_ih = icfo_to_ifco(bias)`` plus ``forget_bias`` in its
    forget block, ``bias_hh = 0``, ``weight_hr = projection/kernel.T``.
    The cell's ``cell_clip``, ``proj_clip`` and activation are not part of
    the weights: PyTorch has tanh only and no clipping.

    Parameters
    ----------
    weights : mapping
        ``kernel [I + P, 4H]``, ``bias [4H]`` and, projected, ``projection/kernel [H, P]``
        (``P = num_proj or H``), as :meth:`nblstm.LSTMCell.get_weights` returns.
    forget_bias : float, default 1.0
        The cell's ``forget_bias``, folded into ``bias_ih``.
    layer : int, default 0
    suffix : str, default ""
        ``"_reverse"`` for the backward direction of a bidirectional LSTM.

    Raises
    ------
    ValueError
        Peephole weights (PyTorch has none) or malformed weights.

    Examples
    --------
    >>> weights = {"kernel": np.zeros((5, 8)), "bias": np.zeros(8)}  # I = 3, H = 2
    >>> state_dict = lstmcell_to_torch(weights, forget_bias=1.0)
    >>> state_dict["weight_ih_l0"].shape, state_dict["weight_hh_l0"].shape, state_dict["bias_ih_l0"]
    ((8, 3), (8, 2), array([0., 0., 1., 1., 0., 0., 0., 0.]))
    """
    input_size, w, b = _cell_to_v2(weights, forget_bias)
    return block_lstm_v2_to_torch(w, b, input_size, weights.get("projection/kernel"), layer, suffix)


def torch_to_lstmcell(state_dict, forget_bias=0.0, layer=0, suffix=""):
    """A PyTorch ``nn.LSTM`` layer as TF1 ``LSTMCell`` weights for a cell built with ``forget_bias``.

    With the default ``forget_bias=0.0`` the bias is copied exactly; with
    another value it is subtracted from the forget block.

    Parameters
    ----------
    state_dict : mapping
        ``weight_ih_l{layer}{suffix} [4H, I]``, ``weight_hh_l... [4H, P]``,
        optional ``bias_ih_l..., bias_hh_l... [4H]`` and ``weight_hr_l... [P, H]``.
    forget_bias : float, default 0.0
        The ``forget_bias`` of the cell that will use the weights.
    layer : int, default 0
    suffix : str, default ""

    Returns
    -------
    dict
        ``kernel [I + P, 4H]``, ``bias [4H]``, and ``projection/kernel [H, P]``
        when the state dict has ``weight_hr``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> weights = {"kernel": rng.standard_normal((4, 8)), "bias": rng.standard_normal(8),  # I = 3, H = 2, P = 1
    ...            "projection/kernel": rng.standard_normal((2, 1))}
    >>> back = torch_to_lstmcell(lstmcell_to_torch(weights, forget_bias=1.0), forget_bias=1.0)
    >>> sorted(back), all(np.allclose(back[k], weights[k]) for k in weights)
    (['bias', 'kernel', 'projection/kernel'], True)
    """
    w, b, proj = torch_to_block_lstm_v2(state_dict, layer, suffix)
    w1, b1 = block_lstm_v2_to_v1(w, b, forget_bias)
    out = {"kernel": w1, "bias": b1}
    if proj is not None:
        out["projection/kernel"] = proj
    return out


def lstmcell_to_keras(weights, forget_bias=1.0):
    """TF1 ``LSTMCell`` weights (no projection, no peepholes) to Keras ``LSTM``: ``[kernel, recurrent_kernel,
    bias]``, ``forget_bias`` folded into the bias (use ``unit_forget_bias=False`` when building the layer).

    Parameters
    ----------
    weights : mapping
        ``kernel [I + H, 4H]`` and ``bias [4H]``, ICFO columns.
    forget_bias : float, default 1.0
        The cell's ``forget_bias``, folded into the Keras bias.

    Examples
    --------
    >>> weights = {"kernel": np.zeros((5, 8)), "bias": np.zeros(8)}  # I = 3, H = 2
    >>> kernel, recurrent_kernel, bias = lstmcell_to_keras(weights, forget_bias=1.0)
    >>> kernel.shape, recurrent_kernel.shape, bias
    ((3, 8), (2, 8), array([0., 0., 1., 1., 0., 0., 0., 0.]))
    """
    if weights.get("projection/kernel") is not None:
        raise ValueError("Keras LSTM has no projection: weights with 'projection/kernel' cannot be converted")
    input_size, w, b = _cell_to_v2(weights, forget_bias)
    return block_lstm_v2_to_keras(w, b, input_size)


def keras_to_lstmcell(kernel, recurrent_kernel=None, bias=None, forget_bias=0.0):
    """Keras ``LSTM`` weights as TF1 ``LSTMCell`` weights for a cell built with ``forget_bias``.

    Parameters
    ----------
    kernel : [I, 4H] array, or the list ``layer.get_weights()``
    recurrent_kernel : [H, 4H] array
    bias : [4H] array or None
    forget_bias : float, default 0.0

    Returns
    -------
    dict
        ``kernel [I + H, 4H]`` and ``bias [4H]`` in ICFO order.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> layer_weights = [rng.standard_normal((3, 8)), rng.standard_normal((2, 8)), rng.standard_normal(8)]
    >>> weights = keras_to_lstmcell(layer_weights)  # I = 3, H = 2
    >>> weights["kernel"].shape, weights["bias"].shape
    ((5, 8), (8,))
    >>> all(np.allclose(a, b) for a, b in zip(lstmcell_to_keras(weights, forget_bias=0.0), layer_weights))
    True
    """
    if isinstance(kernel, (list, tuple)):
        if recurrent_kernel is not None or bias is not None or len(kernel) not in (2, 3):
            raise ValueError("pass either the list [kernel, recurrent_kernel(, bias)] or the three arrays")
        kernel, recurrent_kernel, bias = (*kernel, None)[:3]
    if recurrent_kernel is None:
        raise ValueError("recurrent_kernel is required")
    w, b = keras_to_block_lstm_v2(kernel, recurrent_kernel, bias)
    w1, b1 = block_lstm_v2_to_v1(w, b, forget_bias)
    return {"kernel": w1, "bias": b1}


def block_lstm_v2_to_cudnn(w, b, input_size):
    """BlockLSTMV2 weights to cuDNN's canonical per-gate matrices and biases.

    Parameters
    ----------
    w : [I + H, 4H] array
        BlockLSTMV2 weights, IFCO columns.
    b : [4H] array
        The summed bias, split half and half between cuDNN's input and
        recurrent biases.
    input_size : int
        ``I``.

    Returns
    -------
    tuple
        ``(weights, biases)``: ``weights`` is ``[W_i, W_f, W_c, W_o]`` (each
        ``[H, I]``) followed by ``[R_i, R_f, R_c, R_o]`` (each ``[H, H]``);
        ``biases`` is 8 ``[H]`` arrays, the summed bias split half and half
        between the input and recurrent biases of each gate, as TensorFlow
        does when it writes cuDNN weights.

    Examples
    --------
    >>> weights, biases = block_lstm_v2_to_cudnn(np.ones((5, 8)), np.ones(8), input_size=3)  # I = 3, H = 2
    >>> len(weights), weights[0].shape, weights[4].shape, len(biases), biases[0]
    (8, (2, 3), (2, 2), 8, array([0.5, 0.5]))
    """
    w = _array(w, "w")
    b = _array(b, "b")
    ws = [blk.T.copy() for blk in np.split(w[:input_size], 4, axis=1)]
    rs = [blk.T.copy() for blk in np.split(w[input_size:], 4, axis=1)]
    half = [blk / 2 for blk in np.split(b, 4)]
    return ws + rs, half + [h.copy() for h in half]


def cudnn_to_block_lstm_v2(weights, biases):
    """cuDNN canonical per-gate weights and biases (gate order ``i, f, c, o``) to BlockLSTMV2.

    Parameters
    ----------
    weights : sequence of 8 arrays
        ``W_i, W_f, W_c, W_o`` (each ``[H, I]``), ``R_i, R_f, R_c, R_o`` (each ``[H, H]``).
    biases : sequence of 8 [H] arrays
        Input biases of the four gates, then recurrent biases; summed per gate.

    Returns
    -------
    tuple
        ``(w [I + H, 4H], b [4H])``.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> w, b = rng.standard_normal((5, 8)), rng.standard_normal(8)  # I = 3, H = 2
    >>> w2, b2 = cudnn_to_block_lstm_v2(*block_lstm_v2_to_cudnn(w, b, input_size=3))
    >>> w2.shape, np.allclose(w2, w) and np.allclose(b2, b)
    ((5, 8), True)
    """
    if len(weights) != 8 or len(biases) != 8:
        raise ValueError(f"cuDNN LSTM has 8 weight matrices and 8 biases, got {len(weights)} and {len(biases)}")
    ws = [_array(a, f"weights[{k}]") for k, a in enumerate(weights)]
    bs = [_array(a, f"biases[{k}]") for k, a in enumerate(biases)]
    w = np.concatenate([np.concatenate([m.T for m in ws[:4]], axis=1), np.concatenate([m.T for m in ws[4:]], axis=1)])
    b = np.concatenate([bs[k] + bs[k + 4] for k in range(4)])
    return w, b


def keras_cudnn_to_keras(kernel, recurrent_kernel, bias):
    """The variables of Keras 2's ``CuDNNLSTM`` as those of a Keras ``LSTM`` computing the same.

    ``CuDNNLSTM`` hands each gate's block of its variables to cuDNN as raw
    memory: the ``[I, H]`` block of ``kernel`` is read as cuDNN's row-major
    ``[H, I]`` matrix (a reinterpretation, not a transpose), the ``[H, H]``
    block of ``recurrent_kernel`` as ``[H, H]`` (a transpose, in effect), and
    ``bias`` holds the input biases of the four gates then the recurrent
    ones. Gates ``i, f, c, o`` as in Keras.

    Parameters
    ----------
    kernel : [I, 4H] array
    recurrent_kernel : [H, 4H] array
    bias : [8H] array

    Returns
    -------
    tuple
        ``(kernel [I, 4H], recurrent_kernel [H, 4H], bias [4H])`` of a Keras
        ``LSTM``; the bias is the sum of the two halves.

    Examples
    --------
    >>> kernel = np.arange(24.0).reshape(3, 8)                     # I = 3, H = 2
    >>> k, r, b = keras_cudnn_to_keras(kernel, np.zeros((2, 8)), np.arange(16.0))
    >>> k[:, :2]                             # gate i's block [0, 1, 8, 9, 16, 17] read as [H, I], transposed
    array([[ 0.,  9.],
           [ 1., 16.],
           [ 8., 17.]])
    >>> b
    array([ 8., 10., 12., 14., 16., 18., 20., 22.])
    """
    kernel = _array(kernel, "kernel")
    recurrent_kernel = _array(recurrent_kernel, "recurrent_kernel")
    bias = _array(bias, "bias")
    units = recurrent_kernel.shape[0] if recurrent_kernel.ndim == 2 else 0
    inputs = kernel.shape[0] if kernel.ndim == 2 else 0
    if kernel.shape != (inputs, 4 * units) or recurrent_kernel.shape != (units, 4 * units) \
            or bias.shape != (8 * units,) or not units:
        raise ValueError(f"CuDNNLSTM's variables are kernel [I, 4H], recurrent_kernel [H, 4H] and bias [8H]; got "
                         f"{kernel.shape}, {recurrent_kernel.shape} and {bias.shape}")
    gates = range(4)
    w = [np.ascontiguousarray(kernel[:, g * units:(g + 1) * units]).reshape(units, inputs) for g in gates]
    r = [recurrent_kernel[:, g * units:(g + 1) * units] for g in gates]
    k = np.concatenate([m.T for m in w], axis=1)
    rk = np.concatenate([m.T for m in r], axis=1)
    return k, rk, bias[:4 * units] + bias[4 * units:]


# ONNX's gate blocks are [i|o|f|c]; ICFO takes blocks 0, 3, 2, 1 of them (the permutation is its own inverse).
_ONNX_TO_ICFO = (0, 3, 2, 1)


def _onnx_blocks(a, axis):
    blocks = np.split(a, 4, axis=axis)
    return np.concatenate([blocks[k] for k in _ONNX_TO_ICFO], axis=axis)


def _one_direction(a, name, rank):
    """``a`` without a leading direction axis of size 1 (``[1, ...]`` or ``[...]``)."""
    a = _array(a, name)
    if a.ndim == rank + 1:
        if a.shape[0] != 1:
            raise ValueError(f"{name} has shape {a.shape}: {a.shape[0]} directions; pass one direction "
                             f"({name}[d]), as these functions convert one")
        a = a[0]
    if a.ndim != rank:
        raise ValueError(f"{name} has shape {a.shape}; expected rank {rank} (or {rank + 1} with one direction)")
    return a


def onnx_to_lstmcell(W, R, B=None, P=None, forget_bias=0.0):
    """One direction of an ONNX ``LSTM`` node as TF1 ``LSTMCell`` weights for a cell built with ``forget_bias``.

    ONNX orders the gate blocks ``i, o, f, c`` and the peepholes ``i, o, f``;
    its bias is the input bias ``Wb`` then the recurrent bias ``Rb``, summed:
    ``kernel = perm([W.T; R.T])``, ``bias = perm(Wb + Rb)`` minus
    ``forget_bias`` in the forget block, ``w_i_diag, w_o_diag, w_f_diag =
    P[:H], P[H:2H], P[2H:]``.

    Parameters
    ----------
    W : [4H, I] array (or [1, 4H, I]: the node's ``W[d:d + 1]``)
    R : [4H, H] array (or [1, 4H, H])
    B : [8H] array (or [1, 8H]), optional
        ``Wb ++ Rb``; zeros when omitted (ONNX's default).
    P : [3H] array (or [1, 3H]), optional
        Peepholes; the result has ``w_f_diag, w_i_diag, w_o_diag`` when given.
    forget_bias : float, default 0.0
        The ``forget_bias`` of the cell that will use the weights (ONNX has none).

    Returns
    -------
    dict
        ``kernel [I + H, 4H]`` (ICFO), ``bias [4H]`` and, with ``P``, the peepholes.

    Examples
    --------
    >>> H, I = 2, 3
    >>> W = np.repeat(np.arange(4.0), H)[:, None] * np.ones((4 * H, I))   # blocks 0, 1, 2, 3 = i, o, f, c
    >>> weights = onnx_to_lstmcell(W, np.zeros((4 * H, H)))
    >>> weights["kernel"][0]                                              # i, c, f, o
    array([0., 0., 3., 3., 2., 2., 1., 1.])
    """
    W = _one_direction(W, "W", 2)
    R = _one_direction(R, "R", 2)
    if W.shape[0] % 4 or W.shape[0] == 0 or R.shape != (W.shape[0], W.shape[0] // 4):
        raise ValueError(f"W {W.shape} and R {R.shape} must be [4H, I] and [4H, H]")
    units = W.shape[0] // 4
    kernel = _onnx_blocks(np.concatenate([W.T, R.T], axis=0), axis=1)
    if B is None:
        bias = np.zeros(4 * units, kernel.dtype)
    else:
        B = _one_direction(B, "B", 1)
        if B.shape != (8 * units,):
            raise ValueError(f"B has shape {B.shape}; expected [8H] = ({8 * units},): Wb then Rb")
        bias = _onnx_blocks(B[:4 * units] + B[4 * units:], axis=0)
    bias = ifco_to_icfo(_add_to_forget_block(icfo_to_ifco(bias), -forget_bias))
    out = {"kernel": kernel, "bias": bias}
    if P is not None:
        P = _one_direction(P, "P", 1)
        if P.shape != (3 * units,):
            raise ValueError(f"P has shape {P.shape}; expected [3H] = ({3 * units},): i, o, f")
        out["w_f_diag"] = P[2 * units:].copy()
        out["w_i_diag"] = P[:units].copy()
        out["w_o_diag"] = P[units:2 * units].copy()
    return out


def lstmcell_to_onnx(weights, forget_bias=1.0):
    """TF1 ``LSTMCell`` weights (no projection) as the inputs of a forward ONNX ``LSTM`` node.

    The inverse of :func:`onnx_to_lstmcell`: ``W``, ``R`` in ONNX's gate
    order ``i, o, f, c``, ``B`` the bias (plus ``forget_bias`` in its forget
    block) then zeros, ``P`` the peepholes ``i, o, f``. Each has a leading
    direction axis of size 1; concatenate two along it for a bidirectional
    node (forward first). The node takes ``hidden_size=H``; its default
    activations (Sigmoid, Tanh, Tanh) are the cell's with a tanh activation.

    Parameters
    ----------
    weights : mapping
        ``kernel [I + H, 4H]``, ``bias [4H]``, optional ``w_i_diag, w_f_diag, w_o_diag [H]``.
    forget_bias : float, default 1.0
        The cell's ``forget_bias``, folded into ``B``.

    Returns
    -------
    dict
        ``W [1, 4H, I]``, ``R [1, 4H, H]``, ``B [1, 8H]`` and, with peepholes, ``P [1, 3H]``.

    Raises
    ------
    ValueError
        A projection (ONNX's LSTM has none) or malformed weights.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> weights = {"kernel": rng.standard_normal((5, 8)), "bias": rng.standard_normal(8)}   # I = 3, H = 2
    >>> node_inputs = lstmcell_to_onnx(weights, forget_bias=1.0)
    >>> {k: a.shape for k, a in node_inputs.items()}
    {'W': (1, 8, 3), 'R': (1, 8, 2), 'B': (1, 16)}
    >>> back = onnx_to_lstmcell(**node_inputs, forget_bias=1.0)
    >>> np.allclose(back["kernel"], weights["kernel"]) and np.allclose(back["bias"], weights["bias"])
    True
    """
    input_size, units, _, has_proj = _cell_sizes(weights)
    if has_proj:
        raise ValueError("ONNX's LSTM has no projection: weights with 'projection/kernel' cannot be converted")
    peep = _peepholes_of(weights)
    kernel = _onnx_blocks(_array(weights["kernel"], "kernel"), axis=1)   # [I + H, 4H], ONNX gate order
    bias = ifco_to_icfo(_add_to_forget_block(icfo_to_ifco(_array(weights["bias"], "bias")), forget_bias))
    out = {
        "W": np.ascontiguousarray(kernel[:input_size].T)[None],
        "R": np.ascontiguousarray(kernel[input_size:].T)[None],
        "B": np.concatenate([_onnx_blocks(bias, axis=0), np.zeros_like(bias)])[None],
    }
    if peep:
        out["P"] = np.concatenate([peep["w_i_diag"], peep["w_o_diag"], peep["w_f_diag"]])[None]
    return out
