"""The fused ops on Dask arrays chunked along the batch axis.

Examples in a batch are independent in :func:`nblstm.block_lstm` and
:func:`nblstm.lstm_block_cell`, so a batch split into chunks can be run as
one task per chunk, on any Dask scheduler (threads, processes, a
``distributed`` cluster). The results equal those of one call on the whole
batch, within rounding: each task is one ordinary call on its chunk.

This module needs Dask (the ``dask`` extra: ``pip install ".[dask]"``); ``import nblstm``
does not import it.

Arguments are checked when the graph is built, not when it is computed:
a wrong shape, dtype or option raises there, as the ops themselves do.
"""

import numpy as np

try:
    import dask.array as da
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError('nblstm.dask needs Dask: the dask extra (pip install ".[dask]") or dask[array]') from exc

from . import ops

__all__ = ["block_lstm", "lstm_block_cell"]

_OUTPUTS = len(ops.BlockLSTMOutput._fields)


def _as_dask(name, value, rank):
    """``value`` (a Dask or NumPy array) as a Dask array of rank ``rank``."""
    if isinstance(value, da.Array):
        array = value
    elif isinstance(value, np.ndarray):
        array = da.from_array(value, chunks=value.shape or ())
    else:
        raise TypeError(f"{name} must be a Dask or NumPy array, got {type(value).__name__}")
    if array.ndim != rank:
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
