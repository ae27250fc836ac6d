"""CPU kernels of the TF1 ``LSTMCell`` over whole sequences (SPEC.md section 6).

The cell differs from the fused ops (:mod:`nblstm.cpu`) in five ways, all
handled here: an optional projection ``m = clip(r @ projection, proj_clip)``
of the output ``r = o * act(c)``; a choice of activation; clipping with its
true gradient (zero where clipped, ``cell_clip = 0`` clips to 0); per-example
sequence lengths with ``dynamic_rnn`` semantics (past its length an
example's state is carried unchanged and its output is zero); and the state
``(c, m)`` in which ``m`` has ``P = num_proj or H`` columns.

The work is laid out as in :mod:`nblstm.cpu` (DESIGN.md):

- The input projection of all steps, ``x @ kernel[:I] + bias``, is one GEMM
  before the time loop (NumPy's multi-threaded BLAS).
- The hidden units are split into chunks, one per thread, with the weight
  columns packed so that a chunk's ``[i | j | f | o]`` blocks are contiguous.
  Each step is one parallel region: every thread runs a single-threaded GEMM
  on its slice of the recurrent weights, then the gate maths of that slice.
  With a projection a second region per step computes ``m`` (its columns
  split across threads): ``m`` needs every unit's ``r``.
- Backward keeps only the recurrent GEMMs in the time loop; the input
  gradient and every weight gradient are GEMMs or reductions after it.

All kernels take the options (activation code, clip bounds, flags) as run-time
arguments, so there is one compiled kernel per dtype (float32, float64).
"""

import contextlib
import threading

import numba
import numpy as np
from numba import njit, prange

from ._blas import single_threaded_blas
from .spec import cell_backward_unit, cell_forward_unit, clip_value, clip_value_grad

_numpy_blas = {"controller": None}
_numpy_blas_lock = threading.Lock()


@contextlib.contextmanager
def _serial_numpy_blas(work):
    """Hold NumPy's own BLAS to one thread for small problems (``work`` multiply-adds per step).

    The GEMMs before and after the time loop run in NumPy's BLAS. For small
    ones, waking its threads costs more than it saves, and far more on busy
    cores: on this project's shared 2-core machines a small forward and
    backward (T=16, B=64, H=24) took 10-20 ms with NumPy's BLAS on two threads,
    2-3 ms on one.
    """
    if work >= _MIN_PARALLEL_STEP_WORK:
        yield
        return
    with _numpy_blas_lock:
        if _numpy_blas["controller"] is None:
            from threadpoolctl import ThreadpoolController

            _numpy_blas["controller"] = ThreadpoolController()
    with _numpy_blas["controller"].limit(limits=1, user_api="blas"):
        yield


# Below this many multiply-adds in a step's recurrent GEMM, one thread does
# the step: a parallel region costs a few microseconds to open, and far more
# when the cores are shared (T=16, B=64, H=24 on 2 busy cores: 1.5 ms forward
# on one thread, 6-15 ms split in two chunks).
_MIN_PARALLEL_STEP_WORK = 1 << 18
# Fewer columns than this per chunk make thin, inefficient GEMMs.
_MIN_COLUMNS_PER_CHUNK = 8


def chunk_bounds(batch_size, width, num_chunks=None):
    """Split ``width`` hidden units (or projected columns) into chunks, one per thread.

    Returns
    -------
    numpy.ndarray
        ``bounds: [K + 1]`` int64; chunk ``k`` holds ``bounds[k] .. bounds[k + 1] - 1``.
    """
    if num_chunks is None:
        if batch_size * width * 4 * width < _MIN_PARALLEL_STEP_WORK:
            num_chunks = 1
        else:
            num_chunks = min(numba.get_num_threads(), max(1, width // _MIN_COLUMNS_PER_CHUNK))
    num_chunks = max(1, min(num_chunks, width))
    return np.linspace(0, width, num_chunks + 1).round().astype(np.int64)


def packed_columns(num_units, bounds):
    """Column permutation from ICFO to the packed order.

    Returns
    -------
    numpy.ndarray
        ``perm: [4H]`` int64 such that ``kernel[:, perm]`` is packed: chunk
        ``k`` occupies columns ``4*h0 .. 4*h1 - 1`` as ``[i | j | f | o]``.
    """
    perm = [np.arange(block * num_units + h0, block * num_units + h1)
            for h0, h1 in zip(bounds[:-1], bounds[1:], strict=True) for block in range(4)]
    return np.concatenate(perm).astype(np.int64)


@njit(cache=True)
def _forward_units(t, h0, h1, xw, c0, m0, w_rec, work, lengths, w_i, w_f, w_o, forget_bias, cell_clip, clip_on,
                   act, use_peepholes, has_proj, one, gates, c_raw_, c_, ac_, r_, m_):
    """Step ``t`` of the units ``h0..h1-1``: recurrent GEMM, then the gate maths."""
    batch = xw.shape[1]
    depth = m0.shape[1]
    hk = h1 - h0
    wk = w_rec[depth * 4 * h0:depth * 4 * h1].reshape((depth, 4 * hk))
    gk = work[batch * 4 * h0:batch * 4 * h1].reshape((batch, 4 * hk))
    if t == 0:
        np.dot(m0, wk, gk)
    else:
        np.dot(m_[t - 1], wk, gk)
    zero = one - one
    col = 4 * h0
    for b in range(batch):
        active = t < lengths[b]
        for jj in range(hk):
            j = h0 + jj
            c_prev = c0[b, j] if t == 0 else c_[t - 1, b, j]
            if active:
                i, g, f, o, c_raw, c, ac, r = cell_forward_unit(
                    gk[b, jj] + xw[t, b, col + jj],
                    gk[b, hk + jj] + xw[t, b, col + hk + jj],
                    gk[b, 2 * hk + jj] + xw[t, b, col + 2 * hk + jj],
                    gk[b, 3 * hk + jj] + xw[t, b, col + 3 * hk + jj],
                    c_prev, w_i[j], w_f[j], w_o[j], forget_bias, cell_clip, clip_on, act, use_peepholes, one,
                )
            else:
                # Past the example's length the state is carried unchanged.
                i = g = f = o = ac = r = zero
                c_raw = c = c_prev
            gates[t, b, col + jj] = i
            gates[t, b, col + hk + jj] = g
            gates[t, b, col + 2 * hk + jj] = f
            gates[t, b, col + 3 * hk + jj] = o
            c_raw_[t, b, j] = c_raw
            c_[t, b, j] = c
            ac_[t, b, j] = ac
            r_[t, b, j] = r
            if not has_proj:
                if active:
                    m_[t, b, j] = r
                else:
                    m_[t, b, j] = m0[b, j] if t == 0 else m_[t - 1, b, j]


@njit(cache=True)
def _forward_proj(t, p0, p1, r_, m0, w_proj, work, lengths, proj_clip, proj_clip_on, m_raw_, m_):
    """Step ``t`` of the projected columns ``p0..p1-1``: ``m = clip(r @ projection)``."""
    batch = r_.shape[1]
    units = r_.shape[2]
    pk = p1 - p0
    wk = w_proj[units * p0:units * p1].reshape((units, pk))
    gk = work[batch * p0:batch * p1].reshape((batch, pk))
    np.dot(r_[t], wk, gk)
    for b in range(batch):
        active = t < lengths[b]
        for jj in range(pk):
            p = p0 + jj
            if active:
                m_raw_[t, b, p] = gk[b, jj]
                m_[t, b, p] = clip_value(gk[b, jj], proj_clip, proj_clip_on)
            else:
                m_raw_[t, b, p] = gk[b, jj] - gk[b, jj]
                m_[t, b, p] = m0[b, p] if t == 0 else m_[t - 1, b, p]


@njit(parallel=True, cache=True)
def forward_kernel(xw, c0, m0, w_rec, bounds, w_proj, proj_bounds, lengths, w_i, w_f, w_o, forget_bias, cell_clip,
                   clip_on, proj_clip, proj_clip_on, act, use_peepholes, has_proj, work, proj_work,
                   gates, c_raw_, c_, ac_, r_, m_raw_, m_):
    """Recurrent part of the cell's forward pass over ``T = xw.shape[0]`` steps.

    Parameters
    ----------
    xw : [T, B, 4H] array
        Packed input projections plus bias.
    c0 : [B, H] array
    m0 : [B, P] array
    w_rec : [P * 4H] array
        Packed recurrent weights, chunk after chunk, each a C-ordered ``[P, 4 hk]`` block.
    bounds : [K + 1] int64 array
        Chunks of hidden units.
    w_proj : [H * P] array
        Projection weights, column chunk after column chunk, each a C-ordered
        ``[H, pk]`` block (unused without a projection).
    proj_bounds : [KP + 1] int64 array
        Chunks of projected columns.
    lengths : [B] int64 array
        Per-example sequence lengths, ``0 <= lengths[b] <= T``.
    w_i, w_f, w_o : [H] arrays
        Peephole weights (read only with ``use_peepholes``).
    forget_bias, cell_clip, proj_clip : float
    clip_on, proj_clip_on, use_peepholes, has_proj : bool
    act : int
        Activation code.
    work : [B * 4H] array
    proj_work : [B * P] array
        Workspaces of the GEMMs.
    gates : [T, B, 4H] array
        Output: packed ``i, j, f, o`` after their nonlinearities (zero past the lengths).
    c_raw_, c_, ac_, r_ : [T, B, H] arrays
        Output: cell before and after clipping (the carried state), ``act(c)``
        and ``r = o * act(c)``.
    m_raw_ : [T, B, P] array
        Output: projection before ``proj_clip`` (unused without a projection).
    m_ : [T, B, P] array
        Output: the carried output state ``m``. Without a projection it may be
        the same array as ``r_``.
    """
    one = xw.dtype.type(1.0)
    fb = xw.dtype.type(forget_bias)
    clip = xw.dtype.type(cell_clip)
    pclip = xw.dtype.type(proj_clip)
    units = c0.shape[1]
    depth = m0.shape[1]
    num_chunks = bounds.shape[0] - 1
    num_proj_chunks = proj_bounds.shape[0] - 1
    for t in range(xw.shape[0]):
        if num_chunks == 1:
            _forward_units(t, 0, units, xw, c0, m0, w_rec, work, lengths, w_i, w_f, w_o, fb, clip, clip_on, act,
                           use_peepholes, has_proj, one, gates, c_raw_, c_, ac_, r_, m_)
        else:
            for k in prange(num_chunks):
                _forward_units(t, bounds[k], bounds[k + 1], xw, c0, m0, w_rec, work, lengths, w_i, w_f, w_o, fb,
                               clip, clip_on, act, use_peepholes, has_proj, one, gates, c_raw_, c_, ac_, r_, m_)
        if has_proj:
            if num_proj_chunks == 1:
                _forward_proj(t, 0, depth, r_, m0, w_proj, proj_work, lengths, pclip, proj_clip_on, m_raw_, m_)
            else:
                for k in prange(num_proj_chunks):
                    _forward_proj(t, proj_bounds[k], proj_bounds[k + 1], r_, m0, w_proj, proj_work, lengths, pclip,
                                  proj_clip_on, m_raw_, m_)


@njit(cache=True)
def _backward_m(t, p0, p1, d_gates, w_rec_t, work, lengths, d_out, m_raw_, proj_clip, proj_clip_on, has_proj,
                one, dm, dm_raw):
    """Step ``t`` (backwards) of the output-state columns ``p0..p1-1``.

    ``dm`` holds the gradient of ``m[t]`` from later steps. Rows that were
    active at ``t + 1`` receive it from that step's gate gradients; the
    others carried ``m`` unchanged, so their gradient is carried too. For
    rows active at ``t`` the step's output gradient is added and the
    gradient of the projection before clipping is written to ``dm_raw[t]``.
    ``t = -1`` only finishes the carry (the gradient of the initial ``m``).
    """
    batch = dm.shape[0]
    steps = d_gates.shape[0]
    four_units = d_gates.shape[2]
    pk = p1 - p0
    gk = work[batch * p0:batch * p1].reshape((batch, pk))
    if t + 1 < steps:
        wk = w_rec_t[four_units * p0:four_units * p1].reshape((four_units, pk))
        np.dot(d_gates[t + 1], wk, gk)
    for b in range(batch):
        if t + 1 < lengths[b]:
            for jj in range(pk):
                dm[b, p0 + jj] = gk[b, jj]
        if t >= 0:
            active = t < lengths[b]
            for jj in range(pk):
                p = p0 + jj
                if active:
                    g = dm[b, p] + d_out[t, b, p]
                    if has_proj:
                        g = g * clip_value_grad(m_raw_[t, b, p], proj_clip, proj_clip_on, one)
                    dm_raw[t, b, p] = g
                else:
                    dm_raw[t, b, p] = one - one


@njit(cache=True)
def _backward_units(t, h0, h1, c0, gates, c_raw_, c_, ac_, dm_raw, w_proj_t, work, lengths, w_i, w_f, w_o,
                    cell_clip, clip_on, act, use_peepholes, has_proj, one, d_gates, dc):
    """Step ``t`` (backwards) of the units ``h0..h1-1``: gradient of ``r``, then the gate maths."""
    batch = c0.shape[0]
    depth = dm_raw.shape[2]
    hk = h1 - h0
    drk = work[batch * h0:batch * h1].reshape((batch, hk))
    if has_proj:
        wk = w_proj_t[depth * h0:depth * h1].reshape((depth, hk))
        np.dot(dm_raw[t], wk, drk)
    else:
        for b in range(batch):
            for jj in range(hk):
                drk[b, jj] = dm_raw[t, b, h0 + jj]
    zero = one - one
    col = 4 * h0
    for b in range(batch):
        if t >= lengths[b]:
            # A carried step: no gate gradients, the cell gradient passes unchanged.
            for jj in range(4 * hk):
                d_gates[t, b, col + jj] = zero
            continue
        for jj in range(hk):
            j = h0 + jj
            c_prev = c0[b, j] if t == 0 else c_[t - 1, b, j]
            di, dj, df, do, dc_prev = cell_backward_unit(
                drk[b, jj], dc[b, j],
                gates[t, b, col + jj], gates[t, b, col + hk + jj], gates[t, b, col + 2 * hk + jj],
                gates[t, b, col + 3 * hk + jj], c_raw_[t, b, j], ac_[t, b, j], c_prev,
                w_i[j], w_f[j], w_o[j], cell_clip, clip_on, act, use_peepholes, one,
            )
            d_gates[t, b, col + jj] = di
            d_gates[t, b, col + hk + jj] = dj
            d_gates[t, b, col + 2 * hk + jj] = df
            d_gates[t, b, col + 3 * hk + jj] = do
            dc[b, j] = dc_prev


@njit(parallel=True, cache=True)
def backward_kernel(c0, gates, c_raw_, c_, ac_, m_raw_, d_out, w_rec_t, bounds, w_proj_t, proj_bounds, lengths,
                    w_i, w_f, w_o, cell_clip, clip_on, proj_clip, proj_clip_on, act, use_peepholes, has_proj,
                    work, proj_work, d_gates, dm_raw, dc, dm):
    """Recurrent part of the cell's backward pass, steps ``T - 1 .. 0``.

    Parameters
    ----------
    c0 : [B, H] array
    gates : [T, B, 4H] array
    c_raw_, c_, ac_ : [T, B, H] arrays
    m_raw_ : [T, B, P] array
        Saved forward values (:func:`forward_kernel`).
    d_out : [T, B, P] array
        Gradient of the outputs (read only at steps inside each example's length).
    w_rec_t : [4H * P] array
        Packed transposed recurrent weights, column chunk after column chunk
        (``proj_bounds``), each a C-ordered ``[4H, pk]`` block.
    bounds : [K + 1] int64 array
        Chunks of hidden units.
    w_proj_t : [P * H] array
        Transposed projection weights, unit chunk after unit chunk, each a
        C-ordered ``[P, hk]`` block (unused without a projection).
    proj_bounds : [KP + 1] int64 array
        Chunks of the ``P`` output-state columns; equal to ``bounds`` without
        a projection, so both phases of a step run in one parallel region.
    lengths : [B] int64 array
    w_i, w_f, w_o : [H] arrays
    cell_clip, proj_clip : float
    clip_on, proj_clip_on, use_peepholes, has_proj : bool
    act : int
    work : [B * H] array
    proj_work : [B * P] array
        Workspaces of the GEMMs.
    d_gates : [T, B, 4H] array
        Output: packed gradients of the gate pre-activations.
    dm_raw : [T, B, P] array
        Output: gradient of the projection before clipping (of ``r`` without one).
    dc : [B, H] array
        On entry the gradient of the final cell state; on exit that of ``c0``.
    dm : [B, P] array
        On entry the gradient of the final ``m``; on exit that of ``m0``.
    """
    one = gates.dtype.type(1.0)
    clip = gates.dtype.type(cell_clip)
    pclip = gates.dtype.type(proj_clip)
    units = c0.shape[1]
    depth = dm.shape[1]
    num_chunks = bounds.shape[0] - 1
    num_proj_chunks = proj_bounds.shape[0] - 1
    for t in range(gates.shape[0] - 1, -1, -1):
        if has_proj:
            if num_proj_chunks == 1:
                _backward_m(t, 0, depth, d_gates, w_rec_t, proj_work, lengths, d_out, m_raw_, pclip, proj_clip_on,
                            has_proj, one, dm, dm_raw)
            else:
                for k in prange(num_proj_chunks):
                    _backward_m(t, proj_bounds[k], proj_bounds[k + 1], d_gates, w_rec_t, proj_work, lengths, d_out,
                                m_raw_, pclip, proj_clip_on, has_proj, one, dm, dm_raw)
            if num_chunks == 1:
                _backward_units(t, 0, units, c0, gates, c_raw_, c_, ac_, dm_raw, w_proj_t, work, lengths, w_i, w_f,
                                w_o, clip, clip_on, act, use_peepholes, has_proj, one, d_gates, dc)
            else:
                for k in prange(num_chunks):
                    _backward_units(t, bounds[k], bounds[k + 1], c0, gates, c_raw_, c_, ac_, dm_raw, w_proj_t, work,
                                    lengths, w_i, w_f, w_o, clip, clip_on, act, use_peepholes, has_proj, one,
                                    d_gates, dc)
        elif num_chunks == 1:
            _backward_m(t, 0, depth, d_gates, w_rec_t, proj_work, lengths, d_out, m_raw_, pclip, proj_clip_on,
                        has_proj, one, dm, dm_raw)
            _backward_units(t, 0, units, c0, gates, c_raw_, c_, ac_, dm_raw, w_proj_t, work, lengths, w_i, w_f, w_o,
                            clip, clip_on, act, use_peepholes, has_proj, one, d_gates, dc)
        else:
            # Without a projection unit j's output is column j of m: both
            # phases of a chunk touch only its own columns, one region a step.
            for k in prange(num_chunks):
                _backward_m(t, bounds[k], bounds[k + 1], d_gates, w_rec_t, proj_work, lengths, d_out, m_raw_, pclip,
                            proj_clip_on, has_proj, one, dm, dm_raw)
                _backward_units(t, bounds[k], bounds[k + 1], c0, gates, c_raw_, c_, ac_, dm_raw, w_proj_t, work,
                                lengths, w_i, w_f, w_o, clip, clip_on, act, use_peepholes, has_proj, one, d_gates,
                                dc)
    # The gradient of m0 from the first step's gate gradients.
    if num_proj_chunks == 1:
        _backward_m(-1, 0, depth, d_gates, w_rec_t, proj_work, lengths, d_out, m_raw_, pclip, proj_clip_on,
                    has_proj, one, dm, dm_raw)
    else:
        for k in prange(num_proj_chunks):
            _backward_m(-1, proj_bounds[k], proj_bounds[k + 1], d_gates, w_rec_t, proj_work, lengths, d_out, m_raw_,
                        pclip, proj_clip_on, has_proj, one, dm, dm_raw)


# ---------------------------------------------------------------------------
# Host drivers
# ---------------------------------------------------------------------------


def _column_chunks(matrix, bounds, width):
    """Flatten ``matrix`` column block by column block: block ``k`` is ``matrix[:, width*b_k : width*b_{k+1}]``."""
    pairs = zip(bounds[:-1], bounds[1:], strict=True)
    return np.concatenate([matrix[:, width * a:width * b].ravel() for a, b in pairs])


def _dummy3(dtype):
    """A stand-in for an unused ``[T, B, P]`` array (same type, so no extra compile)."""
    return np.zeros((0, 0, 0), dtype)


class PackedWeights:
    """Cell weights packed for the kernels, for one dtype and one chunking.

    Packing permutes and copies every weight; a cell keeps its packed weights
    until they change (``set_weights``), so repeated calls pay it once.

    Parameters
    ----------
    weights : dict
        ``kernel [I + P, 4H]`` (ICFO), ``bias [4H]``, optional
        ``w_i_diag, w_f_diag, w_o_diag [H]`` and ``projection/kernel [H, P]``,
        already in the compute dtype.
    input_depth : int
    batch_size : int
        Decides how many chunks (threads) a step uses.
    num_chunks : int, optional
        Force the number of chunks (tests use it to run the parallel paths on tiny shapes).
    """

    def __init__(self, weights, input_depth, batch_size, num_chunks=None):
        kernel = weights["kernel"]
        dtype = kernel.dtype
        units = kernel.shape[1] // 4
        proj = weights.get("projection/kernel")
        depth = units if proj is None else proj.shape[1]
        self.dtype, self.units, self.depth, self.input_depth = dtype, units, depth, input_depth
        self.has_proj = proj is not None
        self.bounds = chunk_bounds(max(batch_size, 1), units, num_chunks)
        self.perm = packed_columns(units, self.bounds)
        kp = kernel[:, self.perm]
        self.w_x = np.ascontiguousarray(kp[:input_depth])  # [I, 4H] packed
        self.w_h = np.ascontiguousarray(kp[input_depth:])  # [P, 4H] packed
        self.bias = np.ascontiguousarray(weights["bias"][self.perm])
        self.w_rec = _column_chunks(self.w_h, self.bounds, 4)
        if self.has_proj:
            self.proj_bounds = chunk_bounds(max(batch_size, 1), depth, len(self.bounds) - 1)
            self.proj = np.ascontiguousarray(proj)
            self.w_proj = _column_chunks(self.proj, self.proj_bounds, 1)
            self.w_proj_t = _column_chunks(np.ascontiguousarray(proj.T), self.bounds, 1)
        else:
            # Without a projection both backward phases share the unit chunks.
            self.proj_bounds = self.bounds
            self.proj = None
            self.w_proj = self.w_proj_t = np.zeros(0, dtype)
        self.w_rec_t = _column_chunks(np.ascontiguousarray(self.w_h.T), self.proj_bounds, 1)
        zeros = np.zeros(units, dtype)
        self.peepholes = tuple(np.ascontiguousarray(weights.get(n, zeros))
                               for n in ("w_i_diag", "w_f_diag", "w_o_diag"))
        self.use_peepholes = "w_i_diag" in weights

    def unpack_columns(self, packed):
        """``[..., 4H]`` packed columns back to ICFO order."""
        out = np.empty_like(packed)
        out[..., self.perm] = packed
        return out


def sequence_forward(x, c0, m0, packed, lengths, forget_bias, cell_clip, proj_clip, act):
    """Whole-sequence forward of the cell on validated arrays of the compute dtype.

    Parameters
    ----------
    x : [T, B, I] array
    c0 : [B, H] array
    m0 : [B, P] array
    packed : PackedWeights
    lengths : [B] int64 array
    forget_bias : float
    cell_clip, proj_clip : float or None
        ``None`` turns clipping off; ``>= 0`` otherwise.
    act : int
        Activation code.

    Returns
    -------
    dict
        Saved values: ``gates [T, B, 4H]`` (packed), ``c_raw, c, ac, r
        [T, B, H]``, ``m_raw, m [T, B, P]`` (``m_raw`` empty without a
        projection), and the inputs the backward pass needs.
    """
    steps, batch, inputs = x.shape
    units, depth, dtype = packed.units, packed.depth, packed.dtype
    saved = {"x": x, "c0": c0, "m0": m0, "lengths": lengths}
    gates = np.zeros((steps, batch, 4 * units), dtype)
    c_raw, c, ac, r = (np.zeros((steps, batch, units), dtype) for _ in range(4))
    if packed.has_proj:
        m_raw, m = np.zeros((steps, batch, depth), dtype), np.zeros((steps, batch, depth), dtype)
    else:
        m_raw, m = _dummy3(dtype), r
    saved.update(gates=gates, c_raw=c_raw, c=c, ac=ac, r=r, m_raw=m_raw, m=m)
    if steps == 0 or batch == 0:
        return saved
    work = np.empty(batch * 4 * units, dtype)
    proj_work = np.empty(batch * depth, dtype)
    with _serial_numpy_blas(batch * (inputs + depth) * 4 * units), single_threaded_blas():
        xw = x.reshape(steps * batch, inputs) @ packed.w_x
        xw += packed.bias
        xw = xw.reshape(steps, batch, 4 * units)
        forward_kernel(xw, c0, m0, packed.w_rec, packed.bounds, packed.w_proj, packed.proj_bounds, lengths,
                       *packed.peepholes, float(forget_bias), 0.0 if cell_clip is None else float(cell_clip),
                       cell_clip is not None, 0.0 if proj_clip is None else float(proj_clip),
                       proj_clip is not None and packed.has_proj, int(act), packed.use_peepholes, packed.has_proj,
                       work, proj_work, gates, c_raw, c, ac, r, m_raw, m)
    return saved


def final_state(saved):
    """The state after the last step, ``(c [B, H], m [B, P])``; the initial state when ``T = 0``."""
    if saved["c"].shape[0] == 0:
        return saved["c0"].copy(), saved["m0"].copy()
    return saved["c"][-1].copy(), saved["m"][-1].copy()


def masked_outputs(saved):
    """Outputs ``[T, B, P]``: ``m``, zero from each example's length on."""
    m = saved["m"]
    steps = m.shape[0]
    mask = np.arange(steps)[:, None] < saved["lengths"][None, :]
    return np.where(mask[:, :, None], m, 0).astype(m.dtype, copy=False)


def sequence_backward(saved, packed, d_out, d_c, d_m, cell_clip, proj_clip, act):
    """Whole-sequence backward of the cell (see :func:`_sequence_backward`)."""
    batch = saved["x"].shape[1]
    with _serial_numpy_blas(batch * (packed.input_depth + packed.depth) * 4 * packed.units):
        return _sequence_backward(saved, packed, d_out, d_c, d_m, cell_clip, proj_clip, act)


def _sequence_backward(saved, packed, d_out, d_c, d_m, cell_clip, proj_clip, act):
    """Whole-sequence backward of the cell.

    Parameters
    ----------
    saved : dict
        From :func:`sequence_forward` with the same ``packed``.
    packed : PackedWeights
    d_out : [T, B, P] array
        Gradient of the outputs.
    d_c : [B, H] array
    d_m : [B, P] array
        Gradient of the final state.
    cell_clip, proj_clip : float or None
    act : int

    Returns
    -------
    tuple
        ``(d_x [T, B, I], d_c0 [B, H], d_m0 [B, P], d_weights)`` where
        ``d_weights`` is a dict keyed like the weights.
    """
    x, c0, m0, lengths = saved["x"], saved["c0"], saved["m0"], saved["lengths"]
    steps, batch, inputs = x.shape
    units, depth, dtype = packed.units, packed.depth, packed.dtype
    dc = np.array(d_c, dtype, copy=True, order="C")
    dm = np.array(d_m, dtype, copy=True, order="C")
    d_gates = np.zeros((steps, batch, 4 * units), dtype)
    dm_raw = np.zeros((steps, batch, depth), dtype)
    if steps > 0 and batch > 0:
        work = np.empty(batch * units, dtype)
        proj_work = np.empty(batch * depth, dtype)
        with single_threaded_blas():
            backward_kernel(c0, saved["gates"], saved["c_raw"], saved["c"], saved["ac"], saved["m_raw"],
                            np.ascontiguousarray(d_out, dtype), packed.w_rec_t, packed.bounds, packed.w_proj_t,
                            packed.proj_bounds, lengths, *packed.peepholes,
                            0.0 if cell_clip is None else float(cell_clip), cell_clip is not None,
                            0.0 if proj_clip is None else float(proj_clip), proj_clip is not None and packed.has_proj,
                            int(act), packed.use_peepholes, packed.has_proj, work, proj_work, d_gates, dm_raw, dc, dm)
    rows = steps * batch
    dg = d_gates.reshape(rows, 4 * units)
    d_x = (dg @ packed.w_x.T).reshape(steps, batch, inputs)
    # m_prev of every step: m0, then m[0..T-2].
    m_prev = np.concatenate([m0[None], saved["m"][:steps - 1]]) if steps else np.zeros((0, batch, depth), dtype)
    d_kernel = np.empty((inputs + depth, 4 * units), dtype)
    d_kernel[:inputs] = x.reshape(rows, inputs).T @ dg
    d_kernel[inputs:] = m_prev.reshape(rows, depth).T @ dg
    d_weights = {"kernel": packed.unpack_columns(d_kernel), "bias": packed.unpack_columns(dg.sum(axis=0))}
    if packed.use_peepholes:
        dgu = packed.unpack_columns(dg)
        c_prev = np.concatenate([c0[None], saved["c"][:steps - 1]]).reshape(rows, units) if steps else \
            np.zeros((0, units), dtype)
        c_all = saved["c"].reshape(rows, units)
        d_weights["w_f_diag"] = (dgu[:, 2 * units:3 * units] * c_prev).sum(axis=0)
        d_weights["w_i_diag"] = (dgu[:, :units] * c_prev).sum(axis=0)
        d_weights["w_o_diag"] = (dgu[:, 3 * units:] * c_all).sum(axis=0)
    if packed.has_proj:
        d_weights["projection/kernel"] = saved["r"].reshape(rows, units).T @ dm_raw.reshape(rows, depth)
    return d_x, dc, dm, d_weights


def num_threads():
    """Threads numba's parallel regions use (for the docs and the demo)."""
    return numba.get_num_threads()
