"""CPU target: ``@njit(parallel=True)`` kernels and their host drivers.

How the work is laid out (DESIGN.md, "What the fastest LSTMs do"):

- The input projection of all steps, ``x @ w[:I] + b``, is one large GEMM
  done by NumPy's multi-threaded BLAS before the time loop.
- The hidden units are split into ``K`` chunks, one per thread. The weight
  columns are permuted ("packed") so that a chunk's four gate blocks are
  contiguous: ``[i | ci | f | o]`` of units ``h0..h1``, always in that
  order, whatever the caller's gate layout. Each step is then one parallel
  region in which every thread runs a single-threaded GEMM on its slice of the
  recurrent weights and the gate maths of the same slice while it is in
  cache; the end of the region is the step's only barrier.
- Backward keeps only ``dgates @ w_h^T`` in the time loop; ``x_grad`` and the
  weight gradients are large GEMMs after it.

The kernels run on float32 or float64 arrays; float16 is computed in float32
by :mod:`nblstm.ops`. Outputs past ``seq_len_max`` are left as the zeros
they were allocated with.
"""

import numba
import numpy as np
from numba import njit, prange

from ._blas import single_threaded_blas
from .spec import GATE_BLOCKS, backward_unit, forward_unit

# Below this many multiply-adds in a step's recurrent GEMM, one thread does
# the step: a parallel region costs a few microseconds to open.
_MIN_PARALLEL_STEP_WORK = 32768
# Fewer hidden units than this per chunk make thin, inefficient GEMMs.
_MIN_UNITS_PER_CHUNK = 8


def chunk_bounds(batch_size, num_units, num_chunks=None):
    """Split ``num_units`` hidden units into chunks, one per thread.

    Returns
    -------
    numpy.ndarray
        ``bounds: [K + 1]`` int64; chunk ``k`` holds units
        ``bounds[k] .. bounds[k + 1] - 1``.
    """
    if num_chunks is None:
        work = batch_size * num_units * 4 * num_units
        if work < _MIN_PARALLEL_STEP_WORK:
            num_chunks = 1
        else:
            num_chunks = min(numba.get_num_threads(), max(1, num_units // _MIN_UNITS_PER_CHUNK))
    num_chunks = max(1, min(num_chunks, num_units))
    return np.linspace(0, num_units, num_chunks + 1).round().astype(np.int64)


def packed_columns(num_units, bounds, layout):
    """Column permutation from the caller's gate layout to the packed order.

    Returns
    -------
    numpy.ndarray
        ``perm: [4H]`` int64, such that ``w[:, perm]`` is packed: chunk ``k``
        occupies columns ``4*h0 .. 4*h1 - 1`` as ``[i | ci | f | o]``.
    """
    blocks = GATE_BLOCKS[layout]
    perm = []
    for h0, h1 in zip(bounds[:-1], bounds[1:]):
        for block in blocks:
            perm.append(np.arange(block * num_units + h0, block * num_units + h1))
    return np.concatenate(perm).astype(np.int64)


@njit(cache=True)
def _forward_chunk(t, h0, h1, xw, cs_prev, h_prev, w_rec, work, wci, wcf, wco, forget_bias, cell_clip,
                   use_peephole, one, i_, cs_, f_, o_, ci_, co_, h_):
    """Step ``t`` of the units ``h0..h1-1``: recurrent GEMM, then the gate maths."""
    batch = xw.shape[1]
    units = cs_prev.shape[1]
    hk = h1 - h0
    wk = w_rec[units * 4 * h0:units * 4 * h1].reshape((units, 4 * hk))
    gk = work[batch * 4 * h0:batch * 4 * h1].reshape((batch, 4 * hk))
    if t == 0:
        np.dot(h_prev, wk, gk)
    else:
        np.dot(h_[t - 1], wk, gk)
    col = 4 * h0
    for b in range(batch):
        for jj in range(hk):
            j = h0 + jj
            c_prev = cs_prev[b, j] if t == 0 else cs_[t - 1, b, j]
            i, ci, f, o, cs, co, h = forward_unit(
                gk[b, jj] + xw[t, b, col + jj],
                gk[b, hk + jj] + xw[t, b, col + hk + jj],
                gk[b, 2 * hk + jj] + xw[t, b, col + 2 * hk + jj],
                gk[b, 3 * hk + jj] + xw[t, b, col + 3 * hk + jj],
                c_prev, wci[j], wcf[j], wco[j], forget_bias, cell_clip, use_peephole, one,
            )
            i_[t, b, j] = i
            ci_[t, b, j] = ci
            f_[t, b, j] = f
            o_[t, b, j] = o
            cs_[t, b, j] = cs
            co_[t, b, j] = co
            h_[t, b, j] = h


@njit(parallel=True, cache=True)
def forward_kernel(xw, cs_prev, h_prev, w_rec, bounds, wci, wcf, wco, forget_bias, cell_clip, use_peephole,
                   work, i_, cs_, f_, o_, ci_, co_, h_):
    """Recurrent part of the forward pass, steps ``0 .. xw.shape[0] - 1``.

    Parameters
    ----------
    xw : [S, B, 4H] array
        Packed input projections plus bias of the ``S = seq_len_max`` steps.
    cs_prev, h_prev : [B, H] C-contiguous arrays
    w_rec : [H * 4H] array
        Packed recurrent weights, chunk after chunk, each chunk a C-ordered
        ``[H, 4 * hk]`` block.
    bounds : [K + 1] int64 array
        Chunk boundaries (:func:`chunk_bounds`).
    wci, wcf, wco : [H] arrays
    forget_bias, cell_clip : float
    use_peephole : bool
    work : [B * 4H] array
        Workspace for the recurrent GEMMs.
    i_, cs_, f_, o_, ci_, co_, h_ : [T, B, H] arrays, T >= S
        Outputs, written for the first ``S`` steps.
    """
    one = xw.dtype.type(1.0)
    fb = xw.dtype.type(forget_bias)
    clip = xw.dtype.type(cell_clip)
    units = cs_prev.shape[1]
    num_chunks = bounds.shape[0] - 1
    for t in range(xw.shape[0]):
        if num_chunks == 1:
            _forward_chunk(t, 0, units, xw, cs_prev, h_prev, w_rec, work, wci, wcf, wco, fb, clip,
                           use_peephole, one, i_, cs_, f_, o_, ci_, co_, h_)
        else:
            for k in prange(num_chunks):
                _forward_chunk(t, bounds[k], bounds[k + 1], xw, cs_prev, h_prev, w_rec, work, wci, wcf, wco,
                               fb, clip, use_peephole, one, i_, cs_, f_, o_, ci_, co_, h_)


@njit(cache=True)
def _backward_chunk(t, h0, h1, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec_t, dgates, dc, work,
                    wci, wcf, wco, use_peephole, one, wci_grad, wcf_grad, wco_grad):
    """Step ``t`` (backwards) of the units ``h0..h1-1``."""
    batch = cs_prev.shape[0]
    units = cs_prev.shape[1]
    hk = h1 - h0
    dhk = work[batch * h0:batch * h1].reshape((batch, hk))
    if t + 1 < dgates.shape[0]:
        wk = w_rec_t[4 * units * h0:4 * units * h1].reshape((4 * units, hk))
        np.dot(dgates[t + 1], wk, dhk)
    else:
        dhk[:] = 0
    col = 4 * h0
    for b in range(batch):
        for jj in range(hk):
            j = h0 + jj
            c_prev = cs_prev[b, j] if t == 0 else cs_[t - 1, b, j]
            di, dci, df, do, dc_prev = backward_unit(
                h_grad[t, b, j] + dhk[b, jj], cs_grad[t, b, j] + dc[b, j],
                i_[t, b, j], ci_[t, b, j], f_[t, b, j], o_[t, b, j], co_[t, b, j], c_prev,
                wci[j], wcf[j], wco[j], use_peephole, one,
            )
            dgates[t, b, col + jj] = di
            dgates[t, b, col + hk + jj] = dci
            dgates[t, b, col + 2 * hk + jj] = df
            dgates[t, b, col + 3 * hk + jj] = do
            dc[b, j] = dc_prev
            if use_peephole:
                wci_grad[j] += di * c_prev
                wcf_grad[j] += df * c_prev
                wco_grad[j] += do * cs_[t, b, j]


@njit(parallel=True, cache=True)
def backward_kernel(cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec_t, bounds, wci, wcf, wco,
                    use_peephole, work, dgates, dc, wci_grad, wcf_grad, wco_grad):
    """Recurrent part of the backward pass, steps ``S - 1 .. 0``.

    Parameters
    ----------
    cs_prev : [B, H] array
    i_, cs_, f_, o_, ci_, co_ : [T, B, H] arrays
        Forward outputs (trusted, not recomputed).
    cs_grad, h_grad : [T, B, H] arrays
        Incoming gradients; steps ``>= S`` are not read.
    w_rec_t : [4H * H] array
        Packed transposed recurrent weights, chunk after chunk, each a
        C-ordered ``[4H, hk]`` block (rows in packed gate order).
    bounds : [K + 1] int64 array
    wci, wcf, wco : [H] arrays
    use_peephole : bool
    work : [B * H] array
        Workspace for ``dgates @ w_h^T``.
    dgates : [S, B, 4H] array
        Output: packed gradients of the gate pre-activations.
    dc : [B, H] array, zero on entry
        Carried cell gradient; on exit ``cs_prev_grad``.
    wci_grad, wcf_grad, wco_grad : [H] arrays, zero on entry
        Accumulated peephole gradients.
    """
    one = dgates.dtype.type(1.0)
    units = cs_prev.shape[1]
    num_chunks = bounds.shape[0] - 1
    for t in range(dgates.shape[0] - 1, -1, -1):
        if num_chunks == 1:
            _backward_chunk(t, 0, units, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec_t, dgates,
                            dc, work, wci, wcf, wco, use_peephole, one, wci_grad, wcf_grad, wco_grad)
        else:
            for k in prange(num_chunks):
                _backward_chunk(t, bounds[k], bounds[k + 1], cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad,
                                w_rec_t, dgates, dc, work, wci, wcf, wco, use_peephole, one, wci_grad, wcf_grad,
                                wco_grad)


def _chunks_of(matrix, bounds, transpose):
    """Flatten the packed column blocks of ``matrix: [H, 4H]`` chunk by chunk."""
    parts = []
    for h0, h1 in zip(bounds[:-1], bounds[1:]):
        if transpose:
            parts.append(matrix[h0:h1, :].T.ravel())
        else:
            parts.append(matrix[:, 4 * h0:4 * h1].ravel())
    return np.concatenate(parts)


def _forward(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, forget_bias, cell_clip, use_peephole, layout):
    """Whole-sequence forward on validated float32/float64 NumPy arrays.

    Parameters
    ----------
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
        Gate columns in ``layout``.
    b : [4H] array
    wci, wcf, wco : [H] arrays
    seq_len_max : int
        ``0 <= seq_len_max <= T``.
    forget_bias, cell_clip : float
    use_peephole : bool
    layout : {"ifco", "icfo"}

    Returns
    -------
    list of numpy.ndarray
        ``[i, cs, f, o, ci, co, h]``, each ``[T, B, H]``, zero past ``seq_len_max``.
    """
    steps, batch, inputs = x.shape
    units = cs_prev.shape[1]
    dtype = x.dtype
    outs = [np.zeros((steps, batch, units), dtype) for _ in range(7)]
    if seq_len_max == 0 or batch == 0:
        return outs
    bounds = chunk_bounds(batch, units)
    perm = packed_columns(units, bounds, layout)
    wp = w[:, perm]
    xw = x[:seq_len_max].reshape(seq_len_max * batch, inputs) @ wp[:inputs]
    xw += b[perm]
    xw = xw.reshape(seq_len_max, batch, 4 * units)
    w_rec = _chunks_of(wp[inputs:], bounds, transpose=False)
    work = np.empty(batch * 4 * units, dtype)
    i_, cs_, f_, o_, ci_, co_, h_ = outs
    with single_threaded_blas():
        forward_kernel(xw, np.ascontiguousarray(cs_prev), np.ascontiguousarray(h_prev), w_rec, bounds,
                       np.ascontiguousarray(wci), np.ascontiguousarray(wcf), np.ascontiguousarray(wco),
                       float(forget_bias), float(cell_clip), bool(use_peephole), work, i_, cs_, f_, o_, ci_, co_, h_)
    return outs


def _backward_recurrent(cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, w_rec, use_peephole, layout):
    """The time loop of the backward pass: gate gradients and the cell carry.

    Parameters
    ----------
    cs_prev : [B, H] array
    wci, wcf, wco : [H] arrays
    outputs : sequence of 6 or 7 [T, B, H] arrays
        Forward outputs ``i, cs, f, o, ci, co[, h]``.
    cs_grad, h_grad : [T, B, H] arrays
    seq_len_max : int
        ``1 <= seq_len_max <= T``.
    w_rec : [H, 4H] array
        Recurrent weights (the last H rows of ``w``), caller's layout.
    use_peephole : bool
    layout : {"ifco", "icfo"}

    Returns
    -------
    tuple
        ``(dgates [S, B, 4H] in the caller's layout, cs_prev_grad [B, H],
        wci_grad [H], wcf_grad [H], wco_grad [H])``.
    """
    batch, units = cs_prev.shape
    dtype = cs_prev.dtype
    dc = np.zeros((batch, units), dtype)
    peephole_grads = [np.zeros(units, dtype) for _ in range(3)]
    bounds = chunk_bounds(batch, units)
    perm = packed_columns(units, bounds, layout)
    w_rec_t = _chunks_of(w_rec[:, perm], bounds, transpose=True)
    dgates = np.empty((seq_len_max, batch, 4 * units), dtype)
    work = np.empty(batch * units, dtype)
    i_, cs_, f_, o_, ci_, co_ = (np.ascontiguousarray(a) for a in outputs[:6])
    with single_threaded_blas():
        backward_kernel(np.ascontiguousarray(cs_prev), i_, cs_, f_, o_, ci_, co_, np.ascontiguousarray(cs_grad),
                        np.ascontiguousarray(h_grad), w_rec_t, bounds, np.ascontiguousarray(wci),
                        np.ascontiguousarray(wcf), np.ascontiguousarray(wco), bool(use_peephole), work, dgates, dc,
                        *peephole_grads)
    # Unpack the gate columns back to the caller's layout.
    unpacked = np.empty_like(dgates)
    unpacked[..., perm] = dgates
    return (unpacked, dc, *peephole_grads)


def _backward(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, use_peephole, layout):
    """Whole-sequence backward on validated float32/float64 NumPy arrays.

    Parameters
    ----------
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    wci, wcf, wco : [H] arrays
    outputs : sequence of 7 [T, B, H] arrays
        Forward outputs ``i, cs, f, o, ci, co, h``.
    cs_grad, h_grad : [T, B, H] arrays
    seq_len_max : int
    use_peephole : bool
    layout : {"ifco", "icfo"}

    Returns
    -------
    tuple
        ``(x_grad [T, B, I], cs_prev_grad [B, H], h_prev_grad [B, H],
        w_grad [I + H, 4H], wci_grad [H], wcf_grad [H], wco_grad [H], b_grad [4H])``.
    """
    steps, batch, inputs = x.shape
    units = cs_prev.shape[1]
    dtype = x.dtype
    x_grad = np.zeros((steps, batch, inputs), dtype)
    if seq_len_max == 0 or batch == 0:
        zeros = [np.zeros(units, dtype) for _ in range(3)]
        return (x_grad, np.zeros((batch, units), dtype), np.zeros((batch, units), dtype), np.zeros(w.shape, dtype),
                *zeros, np.zeros(4 * units, dtype))
    dg, dc, wci_grad, wcf_grad, wco_grad = _backward_recurrent(
        cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, w[inputs:], use_peephole, layout)
    h_ = outputs[6]
    dg2 = dg.reshape(seq_len_max * batch, 4 * units)
    h_prev_grad = dg[0] @ w[inputs:].T
    x_grad[:seq_len_max] = (dg2 @ w[:inputs].T).reshape(seq_len_max, batch, inputs)
    w_grad = np.empty(w.shape, dtype)
    w_grad[:inputs] = x[:seq_len_max].reshape(seq_len_max * batch, inputs).T @ dg2
    w_grad[inputs:] = h_prev.T @ dg[0]
    if seq_len_max > 1:
        w_grad[inputs:] += h_[:seq_len_max - 1].reshape(-1, units).T @ dg[1:].reshape(-1, 4 * units)
    b_grad = dg2.sum(axis=0)
    return (x_grad, dc, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)


# Entry points called by nblstm.ops (nblstm.cuda has the same three).


def _compute_dtype(dtype):
    """numba's CPU target has no float16: float16 is computed in float32."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def _cast_all(arrays, dtype):
    """Cast to the compute dtype (a no-op for arrays already in it); ``None`` stays ``None``."""
    return [None if a is None else np.asarray(a, dtype) for a in arrays]


def _peepholes(wci, wcf, wco, units, dtype):
    """Zeros stand in for absent peephole weights (they are read only with ``use_peephole``)."""
    return [np.zeros(units, dtype) if p is None else p for p in (wci, wcf, wco)]


def forward(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, forget_bias, cell_clip, use_peephole, layout,
            stream=None):
    """Whole-sequence forward of validated NumPy arrays of any supported dtype.

    Same parameters as :func:`_forward`; ``wci, wcf, wco`` may be ``None``
    (zeros); ``stream`` must be ``None``. Returns the seven ``[T, B, H]``
    outputs in the dtype of ``x``.
    """
    dtype = x.dtype
    ct = _compute_dtype(dtype)
    x, cs_prev, h_prev, w, b, wci, wcf, wco = _cast_all((x, cs_prev, h_prev, w, b, wci, wcf, wco), ct)
    wci, wcf, wco = _peepholes(wci, wcf, wco, cs_prev.shape[1], ct)
    outs = _forward(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, forget_bias, cell_clip, use_peephole,
                    layout)
    return [o.astype(dtype, copy=False) for o in outs]


def backward(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, use_peephole, layout,
             stream=None):
    """Whole-sequence backward of validated NumPy arrays of any supported dtype.

    Same parameters as :func:`_backward`; ``wci, wcf, wco``, ``cs_grad`` and
    ``h_grad`` may be ``None`` (zeros). Returns the eight gradients in the
    dtype of ``x``.
    """
    dtype = x.dtype
    ct = _compute_dtype(dtype)
    steps, batch, _ = x.shape
    units = cs_prev.shape[1]
    x, cs_prev, h_prev, w, wci, wcf, wco, cs_grad, h_grad = _cast_all(
        (x, cs_prev, h_prev, w, wci, wcf, wco, cs_grad, h_grad), ct)
    outputs = _cast_all(outputs, ct)
    wci, wcf, wco = _peepholes(wci, wcf, wco, units, ct)
    zeros = np.zeros((steps, batch, units), ct)
    cs_grad = zeros if cs_grad is None else cs_grad
    h_grad = zeros if h_grad is None else h_grad
    grads = _backward(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, use_peephole,
                      layout)
    return [g.astype(dtype, copy=False) for g in grads]


def cell_forward(x, cs_prev, h_prev, w, b, wci, wcf, wco, forget_bias, cell_clip, use_peephole, layout, stream=None):
    """One step (LSTMBlockCell) of validated NumPy arrays: ``x: [B, I]``; returns seven ``[B, H]`` arrays."""
    outs = forward(x[None], cs_prev, h_prev, w, b, wci, wcf, wco, 1, forget_bias, cell_clip, use_peephole, layout)
    return [o[0] for o in outs]


def cell_backward(cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, w, use_peephole, layout, stream=None):
    """Elementwise backward of one step (LSTMBlockCellGrad) of validated NumPy arrays.

    Parameters
    ----------
    cs_prev : [B, H] array
    wci, wcf, wco : [H] arrays or None
    outputs : sequence of 6 [B, H] arrays
        ``i, cs, f, o, ci, co`` of the step.
    cs_grad, h_grad : [B, H] arrays or None
        Total gradients of the step's ``cs`` and ``h``.
    w : [I + H, 4H] array
        Weights; only the recurrent rows ``I..I+H-1`` are read.
    use_peephole : bool
    layout : {"ifco", "icfo"}

    Returns
    -------
    list
        ``[cs_prev_grad [B, H], dgates [B, 4H], wci_grad, wcf_grad, wco_grad [H]]``.
    """
    dtype = cs_prev.dtype
    ct = _compute_dtype(dtype)
    batch, units = cs_prev.shape
    w_rec = w[w.shape[0] - units:]
    cs_prev, wci, wcf, wco, cs_grad, h_grad, w_rec = _cast_all((cs_prev, wci, wcf, wco, cs_grad, h_grad, w_rec), ct)
    outputs = [a[None] for a in _cast_all(outputs, ct)]
    wci, wcf, wco = _peepholes(wci, wcf, wco, units, ct)
    zeros = np.zeros((batch, units), ct)
    cs_grad = zeros if cs_grad is None else cs_grad
    h_grad = zeros if h_grad is None else h_grad
    if batch == 0:
        grads = [zeros, np.zeros((batch, 4 * units), ct), *(np.zeros(units, ct) for _ in range(3))]
    else:
        dgates, dc, wci_grad, wcf_grad, wco_grad = _backward_recurrent(
            cs_prev, wci, wcf, wco, outputs, cs_grad[None], h_grad[None], 1, w_rec, use_peephole, layout)
        grads = [dc, dgates[0], wci_grad, wcf_grad, wco_grad]
    return [g.astype(dtype, copy=False) for g in grads]
