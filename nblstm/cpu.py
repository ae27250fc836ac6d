"""CPU target: ``@njit(parallel=True)`` kernels and their host drivers.

How the work is laid out (DESIGN.md, "What the fastest LSTMs do"):

- Every GEMM runs inside numba's parallel regions as single-threaded BLAS
  calls on a slice of the work, one per thread. NumPy's multi-threaded BLAS
  is never called: its threads spin for a long time after each call and
  would fight numba's threads for the two cores (DESIGN.md measured 40-100x
  slowdowns from such oversubscription).
- The input projection of all steps, ``x @ w[:I] + b``, is one GEMM before
  the time loop, its rows split across threads.
- The hidden units are split into ``K`` chunks, one per thread. Each chunk's
  recurrent weights are packed contiguously (``[H, 4 * hk]``, gate blocks
  ``i | ci | f | o``), so that each step is one parallel region in which a
  thread runs its recurrent GEMM and then the gate maths of its units while
  they are in cache; the end of the region is the step's only barrier.
- Backward keeps only ``dgates @ w_h^T`` in the time loop; ``x_grad`` and the
  weight gradients are GEMMs after it, split across threads by rows.
- Kernels use ``error_model="numpy"``: without Python's division-by-zero
  checks LLVM vectorizes the gate maths (IEEE results, no exceptions).

Arrays other than the packed recurrent weights keep the caller's gate
layout; ``gate_cols[g]`` is the first column of gate ``g`` (``i, ci, f, o``).
The kernels run on float32 or float64 arrays; float16 is computed in float32.
Outputs past ``seq_len_max`` are left as the zeros they were allocated with.
"""

import numba
import numpy as np
from numba import njit, prange

from ._blas import single_threaded_blas
from .spec import GATE_BLOCKS, backward_unit, forward_unit

# Below this many multiply-adds in a step's recurrent GEMM, one thread does
# the step: a parallel region costs microseconds to open.
_MIN_PARALLEL_STEP_WORK = 32768
# Fewer hidden units than this per chunk make thin, inefficient GEMMs.
_MIN_UNITS_PER_CHUNK = 8
# Row blocks of the large GEMMs below this many multiply-adds run on one thread.
_MIN_PARALLEL_GEMM_WORK = 1 << 18

_JIT = {"cache": True, "error_model": "numpy"}


def _split(count, parts):
    """``parts + 1`` int64 boundaries splitting ``range(count)`` evenly."""
    parts = max(1, min(parts, count)) if count else 1
    return np.linspace(0, count, parts + 1).round().astype(np.int64)


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
    return _split(num_units, num_chunks)


def row_bounds(rows, work_per_row):
    """Split ``rows`` of a large GEMM across threads (one block when the work is small)."""
    if rows * work_per_row < _MIN_PARALLEL_GEMM_WORK:
        return _split(rows, 1)
    return _split(rows, numba.get_num_threads())


def gate_columns(num_units, layout):
    """``[4]`` int64: first column of the ``i, ci, f, o`` blocks in ``layout``."""
    return np.array([block * num_units for block in GATE_BLOCKS[layout]], np.int64)


def pack_recurrent(w_rec, bounds, gate_cols, transpose):
    """Pack the recurrent weights ``w_rec: [H, 4H]`` chunk by chunk into one flat array.

    Without ``transpose`` chunk ``k`` is ``[H, 4 * hk]`` with columns
    ``i | ci | f | o`` of its units (forward); with ``transpose`` it is
    ``w_rec[h0:h1, :].T``, ``[4H, hk]``, rows in the caller's layout (backward).
    """
    parts = []
    for h0, h1 in zip(bounds[:-1], bounds[1:]):
        if transpose:
            parts.append(w_rec[h0:h1, :].T.ravel())
        else:
            cols = np.concatenate([np.arange(c + h0, c + h1) for c in gate_cols])
            parts.append(w_rec[:, cols].ravel())
    return np.concatenate(parts)


@njit(**_JIT)
def _gemm_rows(a, b, out, rows, r):
    """``out[rows] = a[rows] @ b`` for row block ``r`` (``rows``: boundaries)."""
    r0 = rows[r]
    r1 = rows[r + 1]
    if r1 > r0:
        if a.shape[1] == 0:
            out[r0:r1] = 0
        else:
            np.dot(a[r0:r1], b, out[r0:r1])


@njit(**_JIT)
def _input_projection(x2d, w_in, bias, xw, rows, r):
    """Row block ``r`` of ``xw = x2d @ w_in + bias``."""
    _gemm_rows(x2d, w_in, xw, rows, r)
    for row in range(rows[r], rows[r + 1]):
        xr = xw[row]
        for c in range(xr.shape[0]):
            xr[c] += bias[c]


@njit(**_JIT)
def _forward_chunk(t, h0, h1, xw, cs_prev, h_prev, w_rec, gate_cols, work, wci, wcf, wco, forget_bias, cell_clip,
                   use_peephole, one, i_, cs_, f_, o_, ci_, co_, h_):
    """Step ``t`` of the units ``h0..h1-1``: recurrent GEMM, then the gate maths."""
    batch = cs_prev.shape[0]
    units = cs_prev.shape[1]
    hk = h1 - h0
    wk = w_rec[units * 4 * h0:units * 4 * h1].reshape((units, 4 * hk))
    gk = work[batch * 4 * h0:batch * 4 * h1].reshape((batch, 4 * hk))
    if t == 0:
        np.dot(h_prev, wk, gk)
    else:
        np.dot(h_[t - 1], wk, gk)
    ci0 = gate_cols[0] + h0
    cc0 = gate_cols[1] + h0
    cf0 = gate_cols[2] + h0
    co0 = gate_cols[3] + h0
    for b in range(batch):
        g = gk[b]
        xr = xw[t * batch + b]
        c_src = cs_prev[b] if t == 0 else cs_[t - 1, b]
        i_r, cs_r, f_r, o_r, ci_r, co_r, h_r = i_[t, b], cs_[t, b], f_[t, b], o_[t, b], ci_[t, b], co_[t, b], h_[t, b]
        for jj in range(hk):
            j = h0 + jj
            i, ci, f, o, cs, co, h = forward_unit(
                g[jj] + xr[ci0 + jj], g[hk + jj] + xr[cc0 + jj], g[2 * hk + jj] + xr[cf0 + jj],
                g[3 * hk + jj] + xr[co0 + jj], c_src[j], wci[j], wcf[j], wco[j], forget_bias, cell_clip,
                use_peephole, one,
            )
            i_r[j] = i
            ci_r[j] = ci
            f_r[j] = f
            o_r[j] = o
            cs_r[j] = cs
            co_r[j] = co
            h_r[j] = h


@njit(parallel=True, **_JIT)
def forward_kernel(x2d, w_in, bias, cs_prev, h_prev, w_rec, bounds, rows, gate_cols, wci, wcf, wco, forget_bias,
                   cell_clip, use_peephole, xw, work, i_, cs_, f_, o_, ci_, co_, h_):
    """The forward pass of steps ``0 .. S - 1``, ``S = x2d.shape[0] // B``.

    Parameters
    ----------
    x2d : [S * B, I] C-contiguous array
        The inputs of the ``S = seq_len_max`` steps.
    w_in : [I, 4H] C-contiguous array
        Input weights (first ``I`` rows of ``w``), caller's layout.
    bias : [4H] array
    cs_prev, h_prev : [B, H] C-contiguous arrays
    w_rec : [H * 4H] array
        Packed recurrent weights (:func:`pack_recurrent`).
    bounds : [K + 1] int64 array
        Hidden-unit chunks (:func:`chunk_bounds`).
    rows : [R + 1] int64 array
        Row blocks of the input projection (:func:`row_bounds`).
    gate_cols : [4] int64 array
        First column of the ``i, ci, f, o`` blocks (:func:`gate_columns`).
    wci, wcf, wco : [H] arrays
    forget_bias, cell_clip : float
    use_peephole : bool
    xw : [S * B, 4H] array
        Workspace: the input projections plus bias.
    work : [B * 4H] array
        Workspace of the recurrent GEMMs.
    i_, cs_, f_, o_, ci_, co_, h_ : [T, B, H] C-contiguous arrays, T >= S
        Outputs, written for the first ``S`` steps.
    """
    one = xw.dtype.type(1.0)
    fb = xw.dtype.type(forget_bias)
    clip = xw.dtype.type(cell_clip)
    batch, units = cs_prev.shape
    steps = x2d.shape[0] // batch
    if rows.shape[0] == 2:  # one block: no parallel region (each costs a barrier)
        _input_projection(x2d, w_in, bias, xw, rows, 0)
    else:
        for r in prange(rows.shape[0] - 1):
            _input_projection(x2d, w_in, bias, xw, rows, r)
    num_chunks = bounds.shape[0] - 1
    for t in range(steps):
        if num_chunks == 1:
            _forward_chunk(t, 0, units, xw, cs_prev, h_prev, w_rec, gate_cols, work, wci, wcf, wco, fb, clip,
                           use_peephole, one, i_, cs_, f_, o_, ci_, co_, h_)
        else:
            for k in prange(num_chunks):
                _forward_chunk(t, bounds[k], bounds[k + 1], xw, cs_prev, h_prev, w_rec, gate_cols, work, wci, wcf,
                               wco, fb, clip, use_peephole, one, i_, cs_, f_, o_, ci_, co_, h_)


@njit(**_JIT)
def _backward_chunk(t, h0, h1, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec_t, gate_cols, dgates, dc,
                    work, wci, wcf, wco, use_peephole, one, wci_grad, wcf_grad, wco_grad):
    """Step ``t`` (backwards) of the units ``h0..h1-1``."""
    batch, units = cs_prev.shape
    hk = h1 - h0
    dhk = work[batch * h0:batch * h1].reshape((batch, hk))
    if t + 1 < dgates.shape[0]:
        wk = w_rec_t[4 * units * h0:4 * units * h1].reshape((4 * units, hk))
        np.dot(dgates[t + 1], wk, dhk)
    else:
        dhk[:] = 0
    ci0 = gate_cols[0] + h0
    cc0 = gate_cols[1] + h0
    cf0 = gate_cols[2] + h0
    co0 = gate_cols[3] + h0
    for b in range(batch):
        dh_r = dhk[b]
        dg = dgates[t, b]
        dc_r = dc[b]
        c_src = cs_prev[b] if t == 0 else cs_[t - 1, b]
        i_r, cs_r, f_r, o_r, ci_r, co_r = i_[t, b], cs_[t, b], f_[t, b], o_[t, b], ci_[t, b], co_[t, b]
        hg_r, cg_r = h_grad[t, b], cs_grad[t, b]
        for jj in range(hk):
            j = h0 + jj
            c_prev = c_src[j]
            di, dci, df, do, dc_prev = backward_unit(
                hg_r[j] + dh_r[jj], cg_r[j] + dc_r[j], i_r[j], ci_r[j], f_r[j], o_r[j], co_r[j], c_prev,
                wci[j], wcf[j], wco[j], use_peephole, one,
            )
            dg[ci0 + jj] = di
            dg[cc0 + jj] = dci
            dg[cf0 + jj] = df
            dg[co0 + jj] = do
            dc_r[j] = dc_prev
            if use_peephole:
                wci_grad[j] += di * c_prev
                wcf_grad[j] += df * c_prev
                wco_grad[j] += do * cs_r[j]


@njit(parallel=True, **_JIT)
def backward_kernel(cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec_t, bounds, gate_cols, wci, wcf, wco,
                    use_peephole, work, dgates, dc, wci_grad, wcf_grad, wco_grad):
    """The time loop of the backward pass, steps ``S - 1 .. 0``.

    Parameters
    ----------
    cs_prev : [B, H] C-contiguous array
    i_, cs_, f_, o_, ci_, co_ : [T, B, H] C-contiguous arrays
        Forward outputs (trusted, not recomputed).
    cs_grad, h_grad : [T, B, H] C-contiguous arrays
        Incoming gradients; steps ``>= S`` are not read.
    w_rec_t : [4H * H] array
        Packed transposed recurrent weights (:func:`pack_recurrent`).
    bounds : [K + 1] int64 array
    gate_cols : [4] int64 array
    wci, wcf, wco : [H] arrays
    use_peephole : bool
    work : [B * H] array
        Workspace of ``dgates @ w_h^T``.
    dgates : [S, B, 4H] array
        Output: gradients of the gate pre-activations, caller's layout.
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
            _backward_chunk(t, 0, units, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec_t, gate_cols,
                            dgates, dc, work, wci, wcf, wco, use_peephole, one, wci_grad, wcf_grad, wco_grad)
        else:
            for k in prange(num_chunks):
                _backward_chunk(t, bounds[k], bounds[k + 1], cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad,
                                w_rec_t, gate_cols, dgates, dc, work, wci, wcf, wco, use_peephole, one, wci_grad,
                                wcf_grad, wco_grad)


@njit(parallel=True, **_JIT)
def weight_grads_kernel(dg2d, w_in_t, w_rec_t, z_t, x_rows, z_rows, x_grad2d, w_grad, b_grad, h_prev_grad):
    """The GEMMs after the backward loop, split across threads by rows.

    Parameters
    ----------
    dg2d : [S * B, 4H] array
        Gate gradients of all steps.
    w_in_t : [4H, I] C-contiguous array
        Transposed input weights.
    w_rec_t : [4H, H] C-contiguous array
        Transposed recurrent weights.
    z_t : [I + H, S * B] C-contiguous array
        ``[x_t, h_{t-1}]`` of every step, transposed.
    x_rows, z_rows : int64 arrays
        Row blocks of ``x_grad2d`` and of ``w_grad``.
    x_grad2d : [S * B, I] array
        Output ``dg2d @ w_in_t``.
    w_grad : [I + H, 4H] array
        Output ``z_t @ dg2d``.
    b_grad : [4H] array
        Output: column sums of ``dg2d``.
    h_prev_grad : [B, H] array
        Output: ``dg2d[:B] @ w_rec_t``, the gradient of the initial output.
    """
    np.dot(dg2d[:h_prev_grad.shape[0]], w_rec_t, h_prev_grad)
    # One block: no parallel region (each costs a barrier).
    if x_rows.shape[0] == 2:
        _gemm_rows(dg2d, w_in_t, x_grad2d, x_rows, 0)
    else:
        for r in prange(x_rows.shape[0] - 1):
            _gemm_rows(dg2d, w_in_t, x_grad2d, x_rows, r)
    if z_rows.shape[0] == 2:
        _gemm_rows(z_t, dg2d, w_grad, z_rows, 0)
    else:
        for r in prange(z_rows.shape[0] - 1):
            _gemm_rows(z_t, dg2d, w_grad, z_rows, r)
    b_grad[:] = 0
    for row in range(dg2d.shape[0]):
        dr = dg2d[row]
        for c in range(dg2d.shape[1]):
            b_grad[c] += dr[c]


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
    gate_cols = gate_columns(units, layout)
    rows = seq_len_max * batch
    x2d = np.ascontiguousarray(x[:seq_len_max].reshape(rows, inputs))
    w_rec = pack_recurrent(w[inputs:], bounds, gate_cols, transpose=False)
    xw = np.empty((rows, 4 * units), dtype)
    work = np.empty(batch * 4 * units, dtype)
    c = np.ascontiguousarray
    with single_threaded_blas():
        forward_kernel(x2d, c(w[:inputs]), c(b), c(cs_prev), c(h_prev), w_rec, bounds,
                       row_bounds(rows, inputs * 4 * units), gate_cols, c(wci), c(wcf), c(wco), float(forget_bias),
                       float(cell_clip), bool(use_peephole), xw, work, *outs)
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
    gate_cols = gate_columns(units, layout)
    w_rec_t = pack_recurrent(w_rec, bounds, gate_cols, transpose=True)
    dgates = np.empty((seq_len_max, batch, 4 * units), dtype)
    work = np.empty(batch * units, dtype)
    c = np.ascontiguousarray
    i_, cs_, f_, o_, ci_, co_ = (c(a) for a in outputs[:6])
    with single_threaded_blas():
        backward_kernel(c(cs_prev), i_, cs_, f_, o_, ci_, co_, c(cs_grad), c(h_grad), w_rec_t, bounds, gate_cols,
                        c(wci), c(wcf), c(wco), bool(use_peephole), work, dgates, dc, *peephole_grads)
    return (dgates, dc, *peephole_grads)


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
    rows = seq_len_max * batch
    dg2d = dg.reshape(rows, 4 * units)
    # [x_t, h_{t-1}] of every step, transposed: the left operand of w_grad.
    z_t = np.empty((inputs + units, rows), dtype)
    z_t[:inputs] = x[:seq_len_max].reshape(rows, inputs).T
    z_t[inputs:, :batch] = h_prev.T
    z_t[inputs:, batch:] = outputs[6][:seq_len_max - 1].reshape(rows - batch, units).T
    w_grad = np.empty(w.shape, dtype)
    b_grad = np.empty(4 * units, dtype)
    x_grad2d = x_grad.reshape(steps * batch, inputs)[:rows]
    h_prev_grad = np.empty((batch, units), dtype)
    c = np.ascontiguousarray
    with single_threaded_blas():
        weight_grads_kernel(dg2d, c(w[:inputs].T), c(w[inputs:].T), z_t, row_bounds(rows, inputs * 4 * units),
                            row_bounds(inputs + units, rows * 4 * units), x_grad2d, w_grad, b_grad, h_prev_grad)
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
