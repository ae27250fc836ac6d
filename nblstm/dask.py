"""The fused ops, their gradient and a layer's training step on Dask arrays chunked along the batch axis.

Examples in a batch are independent in :func:`nblstm.block_lstm` and
:func:`nblstm.lstm_block_cell`, so a batch split into chunks can be run as
one task per chunk, on any Dask scheduler (threads, processes, a
``distributed`` cluster). The results equal those of one call on the whole
batch, within rounding: each task is one ordinary call on its chunk.

The backward passes are one task per chunk too: the gradients of the
examples (inputs, initial states) stay chunked along the batch, and the
weight gradients, a sum over the examples, are the chunks' sums added up by a
tree reduction (:func:`block_lstm_grad`; :func:`loss_and_grads` for an
:class:`nblstm.LSTM` and a loss). This is data-parallel training past one
machine: the weights go once to every worker, the batch stays where its
chunks are.

This module needs Dask (the ``dask`` extra: ``pip install ".[dask]"``); ``import nblstm``
does not import it.

Arguments are checked when the graph is built, not when it is computed:
a wrong shape, dtype or option raises there, as the ops themselves do.
"""

import copy
import numbers

import numpy as np

try:
    import dask
    import dask.array as da
    from dask.base import tokenize
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('nblstm.dask needs Dask: the dask extra (pip install ".[dask]") or dask[array]') from exc

from . import _validate as v
from . import ops
from .layer.lstm import LSTM

__all__ = ["block_lstm", "block_lstm_grad", "loss_and_grads", "lstm_block_cell", "sgd_step"]

_OUTPUTS = len(ops.BlockLSTMOutput._fields)


def _as_dask(name, value, rank):
    """``value`` (a Dask or NumPy array) as a Dask array of rank ``rank`` (any rank for ``None``)."""
    if isinstance(value, da.Array):
        array = value
    elif isinstance(value, np.ndarray):
        array = da.from_array(value, chunks=value.shape or ())
    else:
        raise TypeError(f"{name} must be a Dask or NumPy array, got {type(value).__name__}")
    if rank is not None and array.ndim != rank:
        raise ValueError(f"{name} must have rank {rank}, got shape {array.shape}")
    if any(np.isnan(n) for n in array.shape):
        raise ValueError(f"{name} has an unknown shape {array.shape}: compute its chunk sizes first")
    return array


def _weight(name, value, rank):
    """A weight as a one-chunk Dask array (every task reads the same block), or ``None``."""
    if value is None:
        return None
    return _as_dask(name, value, rank).rechunk(-1)


def _check(single, x, cs_prev, h_prev, weights, options):
    """Validate everything on empty stand-ins: the ops' own checks, run on a batch of 0.

    A batch of 0 runs no kernel and compiles nothing, so this is cheap.
    """
    batch_axis = 0 if single else 1
    batches = {"x": x.shape[batch_axis], "cs_prev": cs_prev.shape[0], "h_prev": h_prev.shape[0]}
    if len(set(batches.values())) > 1:
        found = ", ".join(f"{k}: {v}" for k, v in batches.items())
        raise ValueError(f"x, cs_prev and h_prev must have the same batch size B; got {found}")

    def empty(a, axis):
        if a is None:
            return None
        shape = list(a.shape)
        if axis is not None:
            shape[axis] = 0
        return np.empty(shape, a.dtype)

    args = [empty(x, batch_axis), empty(cs_prev, 0), empty(h_prev, 0)]
    args += [empty(weights[k], None) for k in ("w", "b", "wci", "wcf", "wco")]
    if single:
        ops.lstm_block_cell(*args, **options)
    else:
        ops.block_lstm(*args, **options)


def _run_block(*arrays, single, names, **options):
    """One task: the op on one batch chunk; the seven outputs stacked on a new leading axis.

    ``arrays`` are the blocks of the arguments named in ``names``, in order.
    """
    fn = ops.lstm_block_cell if single else ops.block_lstm
    return np.stack(fn(**dict(zip(names, arrays, strict=True)), **options))


def _run(single, x, cs_prev, h_prev, w, b, wci, wcf, wco, options):
    x = _as_dask("x", x, 2 if single else 3)
    cs_prev = _as_dask("cs_prev", cs_prev, 2)
    h_prev = _as_dask("h_prev", h_prev, 2)
    weights = {"w": _weight("w", w, 2), "b": _weight("b", b, 1), "wci": _weight("wci", wci, 1),
               "wcf": _weight("wcf", wcf, 1), "wco": _weight("wco", wco, 1)}
    _check(single, x, cs_prev, h_prev, weights, options)
    # One chunk along every axis but the batch; cs_prev and h_prev follow x's batch chunks.
    if single:
        x = x.rechunk({1: -1})
        batch_chunks = x.chunks[0]
        x_index, out_index = "bi", "kbh"
    else:
        x = x.rechunk({0: -1, 2: -1})
        batch_chunks = x.chunks[1]
        x_index, out_index = "tbi", "ktbh"
    indexed = {"x": (x, x_index), "cs_prev": (cs_prev.rechunk((batch_chunks, -1)), "bh"),
               "h_prev": (h_prev.rechunk((batch_chunks, -1)), "bh"), "w": (weights["w"], "rg"),
               "b": (weights["b"], "g")}
    indexed.update({name: (weights[name], "h") for name in ("wci", "wcf", "wco") if weights[name] is not None})
    args = [item for pair in indexed.values() for item in pair]
    dtype = np.dtype(x.dtype)
    stacked = da.blockwise(_run_block, out_index, *args, single=single, names=tuple(indexed),
                           new_axes={"k": _OUTPUTS}, dtype=dtype, concatenate=True,
                           meta=np.empty((0,) * len(out_index), dtype), **options)
    out_type = ops.LSTMBlockCellOutput if single else ops.BlockLSTMOutput
    return out_type(*(stacked[k] for k in range(_OUTPUTS)))


def block_lstm(x, cs_prev, h_prev, w, b, wci=None, wcf=None, wco=None, *, seq_len_max=None, forget_bias=0.0,
               cell_clip=None, use_peephole=False, layout="ifco"):
    """:func:`nblstm.block_lstm` on a batch split into chunks, one Dask task per chunk.

    Parameters
    ----------
    x : [T, B, I] dask.array.Array or numpy.ndarray
        Inputs; the chunks of the batch axis ``B`` become the tasks (the
        time and input axes are brought to one chunk each).
    cs_prev, h_prev : [B, H] dask.array.Array or numpy.ndarray
        Initial state, rechunked along ``B`` like ``x``.
    w : [I + H, 4H] array
        Weights (NumPy or Dask); every task reads the same single block.
    b : [4H] array
    wci, wcf, wco : [H] arrays, optional
        Peephole weights: all three or none.
    seq_len_max, forget_bias, cell_clip, use_peephole, layout
        As :func:`nblstm.block_lstm`.

    Returns
    -------
    BlockLSTMOutput
        Seven lazy ``[T, B, H]`` Dask arrays, chunked along ``B`` like ``x``.
        They share one task per chunk: compute them together
        (``dask.compute(*out)``) to run each chunk once.

    Raises
    ------
    TypeError, ValueError
        As :func:`nblstm.block_lstm`, when the graph is built; also for
        batch sizes that disagree between ``x``, ``cs_prev`` and ``h_prev``
        and for unknown chunk sizes.

    Examples
    --------
    >>> import dask, dask.array as da, numpy as np
    >>> import nblstm, nblstm.dask
    >>> rng = np.random.default_rng(0)
    >>> T, B, I, H = 4, 6, 3, 5
    >>> x = da.from_array(rng.standard_normal((T, B, I)), chunks=(T, 2, I))
    >>> c0 = h0 = np.zeros((B, H))
    >>> w, b = rng.standard_normal((I + H, 4 * H)) * 0.3, np.zeros(4 * H)
    >>> out = nblstm.dask.block_lstm(x, c0, h0, w, b)
    >>> out.h.chunks
    ((4,), (2, 2, 2), (5,))
    >>> i, cs, f, o, ci, co, h = dask.compute(*out, scheduler="sync")
    >>> bool(np.allclose(h, nblstm.block_lstm(x.compute(), c0, h0, w, b).h))
    True
    """
    options = {"seq_len_max": seq_len_max, "forget_bias": forget_bias, "cell_clip": cell_clip,
               "use_peephole": use_peephole, "layout": layout}
    return _run(False, x, cs_prev, h_prev, w, b, wci, wcf, wco, options)


def lstm_block_cell(x, cs_prev, h_prev, w, b, wci=None, wcf=None, wco=None, *, forget_bias=0.0, cell_clip=None,
                    use_peephole=False, layout="ifco"):
    """:func:`nblstm.lstm_block_cell` (one step) on a batch split into chunks, one Dask task per chunk.

    Parameters
    ----------
    x : [B, I] dask.array.Array or numpy.ndarray
        Inputs; the chunks of ``B`` become the tasks.
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    b : [4H] array
    wci, wcf, wco : [H] arrays, optional
    forget_bias, cell_clip, use_peephole, layout
        As :func:`nblstm.lstm_block_cell`.

    Returns
    -------
    LSTMBlockCellOutput
        Seven lazy ``[B, H]`` Dask arrays, chunked along ``B`` like ``x``.

    Raises
    ------
    TypeError, ValueError
        As :func:`block_lstm`.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> import nblstm, nblstm.dask
    >>> rng = np.random.default_rng(0)
    >>> B, I, H = 4, 3, 2
    >>> x = da.from_array(rng.standard_normal((B, I)), chunks=(2, I))
    >>> c0 = h0 = np.zeros((B, H))
    >>> w, b = rng.standard_normal((I + H, 4 * H)) * 0.3, np.zeros(4 * H)
    >>> out = nblstm.dask.lstm_block_cell(x, c0, h0, w, b)
    >>> out.h.chunks
    ((2, 2), (2,))
    >>> h = out.h.compute(scheduler="sync")
    >>> bool(np.allclose(h, nblstm.lstm_block_cell(x.compute(), c0, h0, w, b).h))
    True
    """
    options = {"forget_bias": forget_bias, "cell_clip": cell_clip, "use_peephole": use_peephole, "layout": layout}
    return _run(True, x, cs_prev, h_prev, w, b, wci, wcf, wco, options)


# -- gradients -----------------------------------------------------------------------------------------

_EXAMPLE_GRADS = ("x_grad", "cs_prev_grad", "h_prev_grad")
_WEIGHT_GRADS = ("w_grad", "wci_grad", "wcf_grad", "wco_grad", "b_grad")


def _split_every(value):
    """The fan-in of the tree reductions: ``value``, else Dask's ``split_every`` setting, else 4."""
    if value is None:
        value = dask.config.get("split_every", None)
        value = value if isinstance(value, numbers.Integral) and not isinstance(value, bool) else 4
    elif isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"split_every must be an int >= 2 or None, got {type(value).__name__}")
    if value < 2:
        raise ValueError(f"split_every must be >= 2 (chunks summed per task), got {value}")
    return int(value)


def _same_batch(sizes):
    """``ValueError`` unless every entry of ``{argument name: batch size}`` agrees."""
    if len(set(sizes.values())) > 1:
        found = ", ".join(f"{k}: {n}" for k, n in sizes.items())
        raise ValueError(f"{', '.join(sizes)} must have the same batch size B; got {found}")


def _chunk_list(array, batch_axis, batch_chunks):
    """One ``Delayed`` per batch chunk of ``array``, rechunked to ``batch_chunks`` and one chunk elsewhere."""
    chunks = tuple(batch_chunks if axis == batch_axis else -1 for axis in range(array.ndim))
    return list(array.rechunk(chunks).to_delayed(optimize_graph=False).ravel())


def _sum_in_order(*parts):
    """The elementwise sum of ``parts`` (each a tuple of arrays or numbers), added left to right.

    Arrays are summed in at least float32, so that float16 gradients are not
    rounded at every level of the tree.
    """
    total = []
    for items in zip(*parts, strict=True):
        first = np.asarray(items[0])
        acc = first.astype(np.promote_types(first.dtype, np.float32), copy=True)
        for item in items[1:]:
            acc += item
        total.append(acc)
    return tuple(total)


def _tree_sum(leaves, split_every):
    """A ``Delayed`` sum of the ``Delayed`` tuples ``leaves``: groups of ``split_every`` neighbours, level by level.

    The groups and the order of the additions depend only on the number of
    leaves, so the result is the same on every scheduler and every run.
    """
    level = list(leaves)
    while len(level) > 1:
        level = [dask.delayed(_sum_in_order, pure=True)(*level[k:k + split_every])
                 for k in range(0, len(level), split_every)]
    return level[0]


def _cast_all(parts, dtypes):
    """``parts`` (a tuple of arrays) cast to ``dtypes``, one each (a 0-d one becomes a NumPy scalar)."""
    return tuple(np.asarray(a).astype(dt, copy=False) if np.ndim(a) else np.dtype(dt).type(a)
                 for a, dt in zip(parts, dtypes, strict=True))


def _grad_block(names, arrays, outputs, options):
    """One task: :func:`nblstm.block_lstm_grad` on one batch chunk.

    Returns ``(x_grad, cs_prev_grad, h_prev_grad, weight_grads)``,
    ``weight_grads`` the tuple of the chunk's ``w, wci, wcf, wco, b`` gradients.
    """
    g = ops.block_lstm_grad(**dict(zip(names, arrays, strict=True)), outputs=tuple(outputs), **options)
    return g.x_grad, g.cs_prev_grad, g.h_prev_grad, tuple(getattr(g, name) for name in _WEIGHT_GRADS)


def block_lstm_grad(x, cs_prev, h_prev, w, outputs, cs_grad=None, h_grad=None, wci=None, wcf=None, wco=None, *,
                    seq_len_max=None, use_peephole=False, layout="ifco", split_every=None):
    """:func:`nblstm.block_lstm_grad` on a batch split into chunks, the weight gradients summed by a tree reduction.

    Parameters
    ----------
    x : [T, B, I] dask.array.Array or numpy.ndarray
        Inputs of the forward call; the chunks of ``B`` become the tasks.
    cs_prev, h_prev : [B, H] arrays
        Initial state of the forward call, rechunked along ``B`` like ``x``.
    w : [I + H, 4H] array
        Weights of the forward call; every task reads the same single block.
    outputs : BlockLSTMOutput or sequence of 7 [T, B, H] arrays
        The forward outputs ``(i, cs, f, o, ci, co, h)``, typically those of
        :func:`nblstm.dask.block_lstm` (already chunked like ``x``).
    cs_grad, h_grad : [T, B, H] arrays, optional
        Gradients of the loss with respect to ``cs`` and ``h`` (zeros when omitted).
    wci, wcf, wco : [H] arrays, optional
        Required when ``use_peephole`` is true.
    seq_len_max, use_peephole, layout
        As :func:`nblstm.block_lstm_grad` (the forward call's).
    split_every : int, optional
        Chunks' weight gradients added per task of the tree reduction
        (default: Dask's ``split_every`` setting, else 4).

    Returns
    -------
    BlockLSTMGradOutput
        Lazy Dask arrays: ``x_grad [T, B, I]``, ``cs_prev_grad, h_prev_grad
        [B, H]`` chunked along ``B`` like ``x``, and the weight gradients
        ``w_grad [I + H, 4H]``, ``wci_grad, wcf_grad, wco_grad [H]``, ``b_grad
        [4H]`` (sums over every example, one chunk each). All eight share one
        task per chunk: compute them together (``dask.compute(*grads)``).

    Raises
    ------
    TypeError, ValueError
        As :func:`nblstm.block_lstm_grad`, when the graph is built; also for
        batch sizes that disagree between the arguments, unknown chunk
        sizes and a ``split_every`` below 2.

    Notes
    -----
    The weight gradients of the chunks are added in groups of
    ``split_every`` neighbours, level after level, in float32 at least: the
    order of the additions depends only on the number of chunks, so the
    result is the same on every scheduler and every run, and equals one call
    on the whole batch within rounding.

    Examples
    --------
    >>> import dask, dask.array as da, numpy as np
    >>> import nblstm, nblstm.dask
    >>> rng = np.random.default_rng(0)
    >>> T, B, I, H = 4, 6, 3, 5
    >>> x = da.from_array(rng.standard_normal((T, B, I)), chunks=(T, 2, I))
    >>> c0 = h0 = np.zeros((B, H))
    >>> w, b = rng.standard_normal((I + H, 4 * H)) * 0.3, np.zeros(4 * H)
    >>> out = nblstm.dask.block_lstm(x, c0, h0, w, b)
    >>> h_grad = da.ones_like(out.h)
    >>> grads = nblstm.dask.block_lstm_grad(x, c0, h0, w, out, h_grad=h_grad)
    >>> grads.x_grad.chunks, grads.w_grad.chunks
    (((4,), (2, 2, 2), (3,)), ((8,), (20,)))
    >>> x_grad, _, _, w_grad, _, _, _, b_grad = dask.compute(*grads, scheduler="sync")
    >>> whole = nblstm.block_lstm_grad(x.compute(), c0, h0, w, nblstm.block_lstm(x.compute(), c0, h0, w, b),
    ...                                h_grad=np.ones((T, B, H)))
    >>> bool(np.allclose(w_grad, whole.w_grad) and np.allclose(x_grad, whole.x_grad))
    True
    """
    split_every = _split_every(split_every)
    x = _as_dask("x", x, 3)
    named = {"cs_prev": _as_dask("cs_prev", cs_prev, 2), "h_prev": _as_dask("h_prev", h_prev, 2)}
    fields = ops.BlockLSTMOutput._fields
    outputs = v.check_outputs(outputs, fields)
    outs = {name: _as_dask(f"outputs.{name}", a, 3) for name, a in zip(fields, outputs, strict=True)}
    for name, a in (("cs_grad", cs_grad), ("h_grad", h_grad)):
        if a is not None:
            named[name] = _as_dask(name, a, 3)
    weights = {"w": _weight("w", w, 2), "wci": _weight("wci", wci, 1), "wcf": _weight("wcf", wcf, 1),
               "wco": _weight("wco", wco, 1)}
    per_example = {**named, **{f"outputs.{k}": a for k, a in outs.items()}}
    _same_batch({"x": x.shape[1], **{k: a.shape[0 if a.ndim == 2 else 1] for k, a in per_example.items()}})
    options = {"seq_len_max": seq_len_max, "use_peephole": use_peephole, "layout": layout}

    def empty(a, axis):
        shape = list(a.shape)
        if axis is not None:
            shape[axis] = 0
        return np.empty(shape, a.dtype)

    # The op's own checks on a batch of 0 (no kernel runs); its results give the gradients' shapes and dtypes.
    stand_in = ops.block_lstm_grad(
        empty(x, 1), *(empty(named[k], 0) for k in ("cs_prev", "h_prev")), empty(weights["w"], None),
        tuple(empty(a, 1) for a in outs.values()),
        *(empty(named[k], 1) if k in named else None for k in ("cs_grad", "h_grad")),
        *(None if weights[k] is None else empty(weights[k], None) for k in ("wci", "wcf", "wco")), **options)

    x = x.rechunk({0: -1, 2: -1})
    batch_chunks = x.chunks[1]
    chunked = {"x": list(x.to_delayed(optimize_graph=False).ravel())}
    for name, a in named.items():
        chunked[name] = _chunk_list(a, 0 if a.ndim == 2 else 1, batch_chunks)
    out_chunks = [_chunk_list(a, 1, batch_chunks) for a in outs.values()]
    blocks = {name: a.to_delayed(optimize_graph=False).ravel()[0] for name, a in weights.items() if a is not None}
    names = tuple(chunked) + tuple(blocks)
    tasks = []
    for j in range(len(batch_chunks)):
        arrays = [chunked[name][j] for name in chunked] + list(blocks.values())
        tasks.append(dask.delayed(_grad_block, pure=True, nout=4)(names, arrays, [o[j] for o in out_chunks],
                                                                  options))

    example_grads = []
    for k, name in enumerate(_EXAMPLE_GRADS):
        like = getattr(stand_in, name)
        axis = 1 if like.ndim == 3 else 0
        parts = []
        for j, size in enumerate(batch_chunks):
            shape = list(like.shape)
            shape[axis] = size
            parts.append(da.from_delayed(tasks[j][k], tuple(shape), dtype=like.dtype, meta=like[:0]))
        example_grads.append(da.concatenate(parts, axis=axis))
    like = [getattr(stand_in, name) for name in _WEIGHT_GRADS]
    total = dask.delayed(_cast_all, pure=True, nout=len(like))(
        _tree_sum([t[3] for t in tasks], split_every), tuple(a.dtype for a in like))
    weight_grads = [da.from_delayed(total[k], a.shape, dtype=a.dtype, meta=a[:0])
                    for k, a in enumerate(like)]
    return ops.BlockLSTMGradOutput(*example_grads, *weight_grads)


# -- training an nblstm.LSTM ---------------------------------------------------------------------------

def _layer_block(layer, loss_fn, x, target, lengths, mask, training, seed):
    """One task: the layer's forward and backward on one batch chunk.

    Returns ``(loss, *weight gradients)``, the gradients in
    ``layer.weight_names`` order.
    """
    if seed is not None:  # dropout: this chunk's own masks (a shallow copy: the cells are shared, read only)
        layer = copy.copy(layer)
        layer.rng = np.random.default_rng(seed)
    (output, _), backward = layer.vjp(x, sequence_length=lengths, mask=mask, training=training)
    result = loss_fn(output, target)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"loss_fn must return a pair (loss, d_output), got {type(result).__name__}")
    loss, d_output = result
    loss = np.asarray(loss, dtype=np.float64)
    if loss.shape != ():
        raise ValueError(f"loss_fn must return a scalar loss (the chunk's sum), got shape {loss.shape}")
    d_output = np.asarray(d_output)
    if d_output.shape != output.shape or d_output.dtype != output.dtype:
        raise ValueError(f"loss_fn returned d_output of shape {d_output.shape} and dtype {d_output.dtype}; "
                         f"expected the output's, {output.shape} and {output.dtype}")
    _, _, d_weights = backward(d_output)
    return (loss, *(d_weights[name] for name in layer.weight_names))


def _layer_handle(lstm):
    """The layer as one ``Delayed`` value: a copy taken now (later changes to ``lstm`` are not seen), caches dropped.

    Its key depends on the configuration and the weights: one copy travels
    to each worker that needs it, whatever the number of chunks.
    """
    snapshot = copy.deepcopy(lstm)
    token = tokenize(repr(lstm), lstm.get_config(), lstm.get_weights())
    return dask.delayed(snapshot, name=f"nblstm-lstm-{token}")


def loss_and_grads(lstm, loss_fn, input, target=None, *, sequence_length=None, mask=None, training=False,
                   target_axis=None, split_every=None):
    """The summed loss of an :class:`nblstm.LSTM` and its weight gradients, over a batch split into Dask chunks.

    Each chunk of the batch is one task: the layer's forward pass
    (:meth:`nblstm.LSTM.vjp`), ``loss_fn`` on its output, the backward
    pass. The chunks' losses and weight gradients are added up by a tree
    reduction. The layer goes once to every worker.

    Parameters
    ----------
    lstm : nblstm.LSTM
        The layer; a copy of its weights is taken when the graph is built.
    loss_fn : callable
        ``loss_fn(output, target) -> (loss, d_output)`` on one chunk, NumPy
        arrays: ``output [T, b, D * P]`` (``[b, T, D * P]`` with
        ``batch_first``) for the chunk's ``b`` examples and the chunk of
        ``target`` (``None`` without one); returns the chunk's loss, a
        scalar, and its gradient with respect to ``output`` (same shape and
        dtype). The loss must be a sum over the examples (divide by the
        whole batch size inside for a mean): the chunks' losses are added.
        With a ``distributed`` cluster it must pickle (``cloudpickle``:
        functions and lambdas do).
    input : [T, B, I] dask.array.Array or numpy.ndarray
        ``[B, T, I]`` with ``batch_first``. The chunks of ``B`` become the
        tasks (the other axes are brought to one chunk).
    target : dask.array.Array or numpy.ndarray, optional
        Rechunked along its batch axis like ``input``; its other axes are
        one chunk.
    sequence_length : [B] ints, optional
        Dask or NumPy array or list, as :meth:`nblstm.LSTM.__call__`'s.
    mask : [B, T] bools, optional
        Dask or NumPy array, as :meth:`nblstm.LSTM.__call__`'s.
    training : bool, default False
        Apply the layer's ``dropout``; each chunk draws its own masks, from
        a seed drawn from the layer's generator when the graph is built.
    target_axis : int, optional
        The batch axis of ``target``: by default the input's (0 with
        ``batch_first``, else 1), and 0 for a 1-D ``target``.
    split_every : int, optional
        Chunks added per task of the tree reduction (default: Dask's
        ``split_every`` setting, else 4).

    Returns
    -------
    loss : 0-d dask.array.Array
        The sum of the chunks' losses, float64.
    grads : dict of dask.array.Array
        The weight gradients summed over the chunks, keyed like
        :meth:`nblstm.LSTM.get_weights` (one chunk each, the layer's dtype).
        Compute them together with the loss: ``dask.compute(loss, grads)``.

    Raises
    ------
    TypeError, ValueError
        When the graph is built: as :meth:`nblstm.LSTM.__call__` for the
        input, lengths and mask (checked on an empty batch); batch sizes that
        disagree; a ``loss_fn`` that is not callable; unknown chunk sizes.
        When computed: a ``loss_fn`` that returns something else than a
        scalar loss and a ``d_output`` like the output.

    Notes
    -----
    The initial states are zeros. The chunks are added in groups of
    ``split_every`` neighbours, level by level (float32 at least), so the
    result does not depend on the scheduler, and equals one call on the
    whole batch (:meth:`nblstm.LSTM.vjp` and ``loss_fn`` on everything)
    within rounding.

    Examples
    --------
    >>> import dask, dask.array as da, numpy as np
    >>> import nblstm, nblstm.dask
    >>> lstm = nblstm.LSTM(3, 4, seed=0)
    >>> x = da.ones((5, 6, 3), dtype=np.float32, chunks=(5, 2, 3))   # [T, B, I], 3 chunks
    >>> def loss_fn(output, target):                                 # half the sum of squares
    ...     return 0.5 * float((output ** 2).sum()), output
    >>> loss, grads = nblstm.dask.loss_and_grads(lstm, loss_fn, x)
    >>> loss, grads = dask.compute(loss, grads, scheduler="sync")
    >>> sorted(grads), grads["l0/kernel"].shape
    (['l0/bias', 'l0/kernel'], (7, 16))
    """
    if not isinstance(lstm, LSTM):
        raise TypeError(f"lstm must be an nblstm.LSTM, got {type(lstm).__name__}")
    if not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, loss_fn(output, target) -> (loss, d_output); "
                        f"got {type(loss_fn).__name__}")
    training = v.check_bool("training", training)
    split_every = _split_every(split_every)
    batch_axis = 0 if lstm.batch_first else 1
    x = _as_dask("input", input, 3)
    sizes = {"input": x.shape[batch_axis]}
    per_example = {}  # name: (array, batch axis)
    if target is not None:
        target = _as_dask("target", target, None)
        if target.ndim == 0:
            raise ValueError("target must have a batch axis (rank >= 1), got a scalar")
        if target_axis is None:
            axis = 0 if target.ndim == 1 else batch_axis
        elif isinstance(target_axis, (bool, np.bool_)) or not isinstance(target_axis, numbers.Integral):
            raise TypeError(f"target_axis must be an int or None, got {type(target_axis).__name__}")
        elif not -target.ndim <= target_axis < target.ndim:
            raise ValueError(f"target_axis={target_axis} is out of range for target of rank {target.ndim}")
        else:
            axis = int(target_axis) % target.ndim
        sizes["target"] = target.shape[axis]
        per_example["target"] = (target, axis)
    elif target_axis is not None:
        raise ValueError("target_axis is given but target is not")
    if sequence_length is not None and mask is not None:
        raise ValueError("pass sequence_length or mask, not both")
    steps = x.shape[1 - batch_axis]
    if sequence_length is not None:
        if isinstance(sequence_length, (list, tuple)):  # small and here: checked whole
            sequence_length = v.check_lengths(sequence_length, steps, len(sequence_length))
        lengths = _as_dask("sequence_length", sequence_length, 1)
        sizes["sequence_length"] = lengths.shape[0]
        per_example["sequence_length"] = (lengths, 0)
    if mask is not None:
        mask_array = _as_dask("mask", mask, 2)
        sizes["mask"] = mask_array.shape[0]
        per_example["mask"] = (mask_array, 0)
    _same_batch(sizes)

    # The layer's own checks on a batch of 0.
    shape = list(x.shape)
    shape[batch_axis] = 0
    stand_ins = {}
    if "sequence_length" in per_example:
        stand_ins["sequence_length"] = np.empty(0, per_example["sequence_length"][0].dtype)
    if "mask" in per_example:
        stand_ins["mask"] = np.empty((0, mask_array.shape[1]), mask_array.dtype)
    lstm(np.empty(shape, x.dtype), sequence_length=stand_ins.get("sequence_length"), mask=stand_ins.get("mask"))

    x = x.rechunk({1 - batch_axis: -1, 2: -1})
    batch_chunks = x.chunks[batch_axis]
    inputs = list(x.to_delayed(optimize_graph=False).ravel())
    chunked = {name: _chunk_list(a, axis, batch_chunks) for name, (a, axis) in per_example.items()}
    none = [None] * len(batch_chunks)
    seed = None
    if training and lstm.dropout > 0 and lstm.num_layers > 1:
        seed = int(lstm.rng.integers(2**63))
    layer = _layer_handle(lstm)
    leaves = [dask.delayed(_layer_block, pure=True)(
        layer, loss_fn, inputs[j], chunked.get("target", none)[j], chunked.get("sequence_length", none)[j],
        chunked.get("mask", none)[j], training, None if seed is None else (seed, j))
        for j in range(len(batch_chunks))]
    names = lstm.weight_names
    weights = lstm.get_weights()
    dtypes = (np.dtype(np.float64),) + tuple(weights[n].dtype for n in names)
    total = dask.delayed(_cast_all, pure=True, nout=len(dtypes))(_tree_sum(leaves, split_every), dtypes)
    loss = da.from_delayed(total[0], (), dtype=np.float64, meta=np.empty((), np.float64))
    grads = {n: da.from_delayed(total[k + 1], weights[n].shape, dtype=weights[n].dtype, meta=weights[n][:0])
             for k, n in enumerate(names)}
    return loss, grads


def sgd_step(lstm, grads, lr):
    """One step of plain gradient descent on an :class:`nblstm.LSTM`, in place: ``w <- w - lr * grad``.

    Parameters
    ----------
    lstm : nblstm.LSTM
    grads : dict of arrays
        Gradients keyed like :meth:`nblstm.LSTM.get_weights` (exactly those
        names): NumPy arrays, or Dask arrays (computed here, all at once),
        such as :func:`loss_and_grads`'s.
    lr : float
        The learning rate, ``> 0``.

    Raises
    ------
    TypeError, ValueError
        ``lstm`` not a layer, ``grads`` not a dict of its weights' names and
        shapes, ``lr`` not a positive real number. The weights are unchanged then.

    Examples
    --------
    >>> import numpy as np, nblstm, nblstm.dask
    >>> lstm = nblstm.LSTM(2, 3, seed=0)
    >>> before = lstm.get_weights()
    >>> nblstm.dask.sgd_step(lstm, {k: np.ones_like(w) for k, w in before.items()}, lr=0.5)
    >>> bool(np.allclose(lstm.get_weights()["l0/bias"], before["l0/bias"] - 0.5))
    True
    """
    if not isinstance(lstm, LSTM):
        raise TypeError(f"lstm must be an nblstm.LSTM, got {type(lstm).__name__}")
    if not isinstance(grads, dict):
        raise TypeError(f"grads must be a dict keyed like lstm.get_weights(), got {type(grads).__name__}")
    lr = v.check_real("lr", lr)
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    weights = lstm.get_weights()
    missing, unexpected = sorted(set(weights) - set(grads)), sorted(set(grads) - set(weights))
    if missing or unexpected:
        raise ValueError(f"grads: missing {missing}, unexpected {unexpected} (keys of lstm.get_weights())")
    (grads,) = dask.compute(grads) if any(isinstance(g, da.Array) for g in grads.values()) else (grads,)
    new = {}
    for name, w in weights.items():
        g = np.asarray(grads[name])
        if g.shape != w.shape:
            raise ValueError(f"grads[{name!r}] has shape {g.shape}; expected {w.shape} (the weight's)")
        new[name] = (w - w.dtype.type(lr) * g.astype(w.dtype, copy=False)).astype(w.dtype, copy=False)
    lstm.set_weights(new)
