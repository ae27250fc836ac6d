"""CPU target: ``@njit(parallel=True)`` kernels and their host drivers.

How the work is laid out (DESIGN.md, "What the fastest LSTMs do"):

- Every GEMM runs inside numba's parallel regions as single-threaded BLAS
  calls on a slice of the work, one per thread. NumPy's multi-threaded BLAS
  is never called: its threads spin for a long time after each call and
  would fight numba's threads for the two cores (DESIGN.md measured 40-100x
  slowdowns from such oversubscription).
- The input projection ``x_t @ w[:I]``: with ``B > 1`` and ``I <= 256``
  each step computes its own on the micro-kernel, continuing the same
  accumulators with ``h_{t-1} @ w[I:]`` (:func:`fused_projection`), so that
  no ``[T, B, 4H]`` projection goes to memory and comes back. Otherwise it
  is one GEMM before the time loop, computed straight into the gate outputs,
  its rows split in blocks that do not depend on the thread count (so that
  the forward pass gives the same bits on any number of threads).
- The hidden units are split into ``K`` chunks, one per thread (the
  micro-kernel's results do not depend on the split). Each chunk's
  recurrent weights (its ``4 * hk`` columns, gate blocks in the caller's
  order) are packed once per call in the panels of
  :mod:`nblstm._microkernel`, whose register-tiled GEMM runs the step 1.6x
  faster than OpenBLAS, which packs the weights again at every step (and
  its batch-1 matrix-vector product faster than OpenBLAS's GEMV, with no
  call overhead). The whole time loop is one parallel region: at each
  step a thread runs the recurrent GEMM of its chunk and then the gate
  maths of its units while they are in cache, and the threads meet on
  atomic counters (:mod:`nblstm._sync`) before the next step.
- Backward keeps only ``dh = dgates @ w_h^T`` in the time loop, on the
  micro-kernel with each chunk's ``w_h[h0:h1]^T`` packed once per call;
  ``x_grad`` and the weight gradients are GEMMs after it, split across
  threads (``x_grad`` by rows, ``w_grad`` by its own rows, each block one
  product over all steps: no partial sums).
- Kernels use ``error_model="numpy"``: without Python's division-by-zero
  checks LLVM vectorizes the gate maths (IEEE results, no exceptions). And
  ``fastmath={"contract"}`` alone of the fast-math flags: LLVM may fuse a
  multiply and an add into one FMA (the rational tanh's polynomials: the
  gate maths took 0.7x the time), which changes no result by more than
  the rounding of the add; no reassociation, NaN and infinities as IEEE.

Every array keeps the caller's gate layout (the packed recurrent weights
too, within each chunk); ``blocks[g]`` is the block (0..3) of gate ``g`` in
the order ``i, ci, f, o``.
The kernels run on float32 or float64 arrays; float16 is computed in float32.
The forward's seven outputs are one allocation (see :func:`_forward`); the
kernels write every step below ``seq_len_max`` and the drivers zero the rest.
"""

import functools
import threading

import numba
import numpy as np
from numba import njit, prange, types

from . import _half, _microkernel, _pool, _sync
from ._blas import single_threaded_blas
from .spec import GATE_BLOCKS, backward_unit, forward_unit

# Below this many multiply-adds in a step's recurrent GEMM, one thread does
# the steps: the threads' meeting at every step costs about a microsecond.
_MIN_PARALLEL_STEP_WORK = 32768
# Fewer hidden units than this per chunk make thin, inefficient GEMMs.
_MIN_UNITS_PER_CHUNK = 8
# Largest panel of packed input weights for which a step computes its own
# input projection (fused_projection).
_FUSED_PANEL_BYTES = 32 * 1024
# Recurrent weights with fewer elements than this are packed on one thread.
_MIN_PARALLEL_PACK = 1 << 16
# Row blocks of the large GEMMs below this many multiply-adds run on one thread.
_MIN_PARALLEL_GEMM_WORK = 1 << 18
# Row blocks of the forward's input projection: as many as the rows allow
# (at least _ROW_BLOCK rows each), at most _MAX_ROW_BLOCKS, whatever the
# number of threads: BLAS's result for a row can depend on how many rows its
# call had, and the forward pass is to give the same bits on any number of
# threads. Each block is four GEMMs, one per gate, run as separate tasks. Few
# blocks, because every block's GEMMs pack all of w[:I] again: one or two
# measured fastest here (8 were 1.05-1.25x slower).
_ROW_BLOCK = 64
_MAX_ROW_BLOCKS = 2

_JIT = {"cache": True, "error_model": "numpy", "fastmath": {"contract"}}


_workqueue_lock = threading.RLock()  # kernel sections nest (a pack inside a forward)


class _Scratch(threading.local):
    """Each Python thread's scratch buffers, kept from one call to the next.

    The backward's gate gradients ``[T, B, 4H]`` never leave it. Allocated
    afresh, they are the largest block freed by a training step, and glibc
    then returns the top of its heap to the system and faults it in again
    at the next call (thousands of page faults at ``(50, 32, 256, 256)``).
    A thread keeps the largest buffer it has needed under each name; it is
    freed with the thread.
    """

    def __init__(self):
        self.buffers = {}

    def get(self, name, shape, dtype):
        """An uninitialised ``shape`` array of ``dtype``, valid until this thread asks for ``name`` again."""
        size = int(np.prod(shape))
        key = (name, np.dtype(dtype))
        buffer = self.buffers.get(key)
        if buffer is None or buffer.size < size:
            buffer = _pool.aligned(size, dtype)
            self.buffers[key] = buffer
        return buffer[:size].reshape(shape)


_scratch = _Scratch()


class kernel_section:  # noqa: N801 (used like a function: ``with kernel_section():``)
    """What every kernel call runs inside: SciPy's BLAS on one thread, and a
    lock when numba's threading layer is ``workqueue``, which is not safe for
    parallel regions entered from several Python threads at once (``omp`` and
    ``tbb`` are). Before the first parallel region the layer is not chosen
    yet, so that call takes the lock too.

    A class rather than a generator-based context manager: it is entered on
    every kernel call, and this costs a third of the time.
    """

    __slots__ = ("_lock",)

    def __enter__(self):
        try:
            serial = numba.threading_layer() == "workqueue"
        except ValueError:
            serial = True
        single_threaded_blas().__enter__()
        self._lock = _workqueue_lock if serial else None
        if serial:
            _workqueue_lock.acquire()
        return self

    def __exit__(self, *exc_info):
        if self._lock is not None:
            self._lock.release()
        single_threaded_blas().__exit__(*exc_info)
        return False


@functools.lru_cache(maxsize=256)
def _split(count, parts):
    """``parts + 1`` int64 boundaries splitting ``range(count)`` evenly.

    Cached (every call of a small problem needs several): the array is
    shared between calls and must not be modified.
    """
    parts = max(1, min(parts, count)) if count else 1
    return np.array([(count * k) // parts for k in range(parts + 1)], np.int64)


def chunk_bounds(batch_size, num_units, num_chunks=None):
    """Split ``num_units`` hidden units into chunks, one per thread (one when a step is small).

    The time loops' GEMMs are the micro-kernel's, whose every result element
    is the same however the columns are split, so that the forward pass
    gives the same bits on any number of threads. The fewest and largest
    GEMMs and gate loops measured fastest (0.95-0.97x the time of 4 chunks
    at ``B = 32, H = 256, 512`` and of 8 at ``B = 64, H = 1024``).

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


def block_bounds(count, num_blocks):
    """``[num_blocks + 1]`` int64: ``range(count)`` split evenly, with empty blocks when ``count < num_blocks``."""
    bounds = _split(count, num_blocks)
    if bounds.shape[0] == num_blocks + 1:
        return bounds
    return np.concatenate([bounds, np.full(num_blocks + 1 - bounds.shape[0], bounds[-1], np.int64)])


def row_bounds(rows, work_per_row):
    """Split ``rows`` of a large GEMM across threads (one block when the work is small)."""
    if rows * work_per_row < _MIN_PARALLEL_GEMM_WORK:
        return _split(rows, 1)
    return _split(rows, numba.get_num_threads())


def row_blocks(rows, work_per_row):
    """Split ``rows`` of the input projection into blocks that do not depend on the thread count.

    Returns
    -------
    tuple
        ``(bounds: [R + 1] int64, parallel: bool)``: whether the ``4 * R``
        GEMMs (gates by blocks) are worth a parallel region.
    """
    if rows * work_per_row < _MIN_PARALLEL_GEMM_WORK:
        return _split(rows, 1), False
    return _split(rows, min(_MAX_ROW_BLOCKS, max(1, rows // _ROW_BLOCK))), True


@functools.cache
def gate_blocks(layout):
    """``[4]`` int64: the block (0..3) of the gates ``i, ci, f, o`` in ``layout`` (shared: not to be modified)."""
    return np.array(GATE_BLOCKS[layout], np.int64)


def column_offsets(bounds, per_unit, dtype):
    """``[K + 1]`` int64: where each chunk's columns start in the packed weights and workspaces.

    Chunk ``k`` has ``per_unit * hk`` columns (4 gates in forward, 1 unit in
    backward), padded to a multiple of the micro-kernel's panel width
    (:mod:`nblstm._microkernel`). Cached, as :func:`_split`: the array is
    shared between calls and must not be modified.
    """
    return _column_offsets(np.asarray(bounds, np.int64).tobytes(), per_unit, np.dtype(dtype))


@functools.lru_cache(maxsize=256)
def _column_offsets(bounds_bytes, per_unit, dtype):
    bounds = np.frombuffer(bounds_bytes, np.int64).tolist()
    offsets = [0]
    for h0, h1 in zip(bounds[:-1], bounds[1:]):
        offsets.append(offsets[-1] + _microkernel.padded(per_unit * (h1 - h0), dtype))
    return np.array(offsets, np.int64)


def fused_projection(batch_size, inputs, dtype):
    """Whether the forward computes each step's input projection inside the step (:func:`forward_kernel`).

    With ``B > 1``, when a panel of the packed input weights (``I x P``)
    fits in 32 KiB of L1: ``I <= 256`` in float32 and float64. Measured
    against the projection as BLAS GEMMs before the loop: 0.97x the time at
    ``(50, 32, 256, 256)`` and 0.98x at ``(100, 64, 125, 320)``, but about
    1.07x at ``I = H = 512`` and 1.17x at ``I = H = 1024``, where the
    micro-kernel streams longer panels from L2 and packing ``w[:I]`` at
    every call costs more.
    """
    return batch_size > 1 and inputs * _microkernel.panel_width(dtype) * np.dtype(dtype).itemsize <= _FUSED_PANEL_BYTES


def pack_recurrent(w_rec, bounds, col_off):
    """Weights ``w_rec: [D, 4H]`` as one flat array, chunk by chunk, in the micro-kernel's panels.

    The recurrent weights (``D = H``), and the input weights (``D = I``)
    when the steps compute their input projections
    (:func:`fused_projection`). Chunk ``k`` holds the ``4 * hk`` columns of its
    units, gate block after gate block in the caller's order, at
    ``D * col_off[k]`` (:func:`column_offsets` with ``per_unit = 4``), in
    ``[D, P]`` panels of ``P`` columns, zero-padded: the step's right
    operand. Callers run it inside :func:`kernel_section`.
    """
    packed = _pool.aligned(w_rec.shape[0] * int(col_off[-1]), w_rec.dtype)
    pack_chunks(np.ascontiguousarray(w_rec), bounds, col_off, packed, False, w_rec.size >= _MIN_PARALLEL_PACK)
    return packed


@njit(**_JIT)
def _pack_forward_chunk(w_rec, bounds, col_off, packed, k):
    """Chunk ``k`` of :func:`pack_recurrent` in panels: column ``j = g * hk + u`` is ``w_rec[:, g * H + h0 + u]``."""
    depth = w_rec.shape[0]
    units = w_rec.shape[1] // 4
    h0 = bounds[k]
    hk = bounds[k + 1] - h0
    width = _microkernel.panel_width_of(packed)
    for g in range(4):
        _microkernel.pack_columns(w_rec, g * units + h0, hk, packed, depth * col_off[k], g * hk, width)
    _microkernel.zero_columns(packed, depth * col_off[k], depth, 4 * hk, width)


@njit(**_JIT)
def _pack_backward_chunk(w_rec, bounds, col_off, packed, k):
    """Chunk ``k`` of :func:`pack_chunks` transposed: column ``u`` is ``w_rec[h0 + u, :]``."""
    gates = w_rec.shape[1]
    h0 = bounds[k]
    hk = bounds[k + 1] - h0
    width = _microkernel.panel_width_of(packed)
    _microkernel.pack_rows(w_rec, h0, hk, packed, gates * col_off[k], 0, width)
    _microkernel.zero_columns(packed, gates * col_off[k], gates, hk, width)


@njit(**_JIT)
def _pack_chunk(w_rec, bounds, col_off, packed, k, transposed):
    if transposed:
        _pack_backward_chunk(w_rec, bounds, col_off, packed, k)
    else:
        _pack_forward_chunk(w_rec, bounds, col_off, packed, k)


@njit(parallel=True, **_JIT)
def pack_chunks(w_rec, bounds, col_off, packed, transposed, parallel):
    """Pack every chunk's recurrent weights in the micro-kernel's panels, one task per chunk.

    ``transposed=False``: the forward's operand, chunk ``k``'s ``4 * hk``
    columns at ``H * col_off[k]`` (:func:`pack_recurrent`).
    ``transposed=True``: the backward's, ``w_rec[h0:h1].T`` (``[4H, hk]``) at
    ``4H * col_off[k]`` (:func:`column_offsets` with ``per_unit = 1``), for
    ``dh = dgates @ w_rec^T``.
    """
    chunks = bounds.shape[0] - 1
    if parallel:
        for k in prange(chunks):
            _pack_chunk(w_rec, bounds, col_off, packed, np.int64(k), transposed)
    else:
        for k in range(chunks):
            _pack_chunk(w_rec, bounds, col_off, packed, np.int64(k), transposed)


@njit(parallel=True, **_JIT)
def gate_weights(w, blocks, w_in, parallel):
    """``w_in[g] = w[:I, blocks[g] * H:(blocks[g] + 1) * H]``: ``w_in: [4, I, H]``, the input
    weights of the gates ``i, ci, f, o`` (row copies, in parallel: NumPy's
    copy of the transposed view took 3.2 ms at ``I = H = 1024``)."""
    inputs = w_in.shape[1]
    if parallel:
        for task in prange(4 * inputs):
            _copy_gate_row(w, blocks, w_in, np.int64(task))
    else:
        for task in range(4 * inputs):
            _copy_gate_row(w, blocks, w_in, task)


@njit(inline="always", **_JIT)
def _copy_gate_row(w, blocks, w_in, task):
    inputs, units = w_in.shape[1], w_in.shape[2]
    g = task // inputs
    r = task - g * inputs
    src = w[r, blocks[g] * units:(blocks[g] + 1) * units]
    dst = w_in[g, r]
    for j in range(units):
        dst[j] = src[j]


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


# numba's own BLAS entry point (what its np.dot calls): a GEMM on strided
# operands, with beta, so that w_grad's row blocks come from one product
# over all rows each, with no partial sums to add up.
_XXGEMM = types.ExternalFunction("numba_xxgemm", types.intc(
    types.char, types.char, types.char, types.intp, types.intp, types.intp, types.voidptr, types.voidptr, types.intp,
    types.voidptr, types.intp, types.voidptr, types.voidptr, types.intp))


@njit(inline="always")
def _leading_dimension(a):
    """BLAS's leading dimension of the row-major ``a`` (unit column stride): its row
    stride in elements. NumPy does not normalise the row stride of a one-row
    array (``h.T`` of an ``[H, 1]`` array has strides ``(8, 8)``, a broadcast
    row ``(0, 8)``), and BLAS rejects one below the row length."""
    if a.shape[0] == 1:
        return max(a.shape[1], 1)
    return max(a.strides[0] // a.itemsize, a.shape[1], 1)


@njit(**_JIT)
def _gemm_tn(a, b, c, accumulate):
    """``c = a.T @ b`` (``c += a.T @ b`` with ``accumulate``): ``a: [K, M]``,
    ``b: [K, N]``, ``c: [M, N]``, row-major, each with unit column stride
    (any row stride: ``a`` may be a column block of a larger array)."""
    k, m = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return
    if k == 0:
        if not accumulate:
            c[:] = 0
        return
    item = c.itemsize
    alpha = np.ones(1, c.dtype)
    beta = np.ones(1, c.dtype) if accumulate else np.zeros(1, c.dtype)
    kind = np.int8(115) if item == 4 else np.int8(100)  # 's' or 'd'
    # Column-major BLAS sees each row-major array transposed: c^T = b^T @ a.
    _XXGEMM(kind, np.int8(78), np.int8(84), n, m, k, alpha.ctypes, b.ctypes, _leading_dimension(b), a.ctypes,
            _leading_dimension(a), beta.ctypes, c.ctypes, _leading_dimension(c))


@njit(**_JIT)
def _input_projection(x2d, w_in, pre, rows, task):
    """Task ``task = 4 r + g`` of the input projection: ``pre[g][rows_r] = x2d[rows_r] @ w_in[g]``."""
    g = task % 4
    _gemm_rows(x2d, w_in[g], pre[g], rows, task // 4)


@njit(inline="always", **_JIT)
def _add_to(dst, src):
    """``dst += src`` for two 1-D arrays of the same length."""
    for j in range(dst.shape[0]):
        dst[j] += src[j]


@njit(inline="always", **_JIT)
def _input_part(t, k, col_off, x2d, w_x, work, batch):
    """``x_t @ w_x`` for the columns of chunk ``k`` into its ``work`` (the fused input projection)."""
    inputs = x2d.shape[1]
    c0 = col_off[k]
    width = col_off[k + 1] - c0
    _microkernel.gemm_panels(x2d.reshape(-1), t * batch * inputs, inputs, batch, w_x, inputs * c0, inputs,
                             width // _microkernel.panel_width_of(w_x), work, batch * c0, width)


# Inlined into the time loop: as a call, its ~25 array arguments (each
# reference-counted) cost about 0.25 us a step, a quarter of a small step.
@njit(inline="always", **_JIT)
def _forward_chunk(t, k, bounds, col_off, fused, x_ready, x2d, w_x, bias, cs_prev, h_prev, w_rec, blocks, work, wci,
                   wcf, wco, forget_bias, cell_clip, use_peephole, one, i_, cs_, f_, o_, ci_, co_, h_):
    """Step ``t`` of the units of chunk ``k``: the GEMMs of the gates, then the gate maths.

    With ``fused`` the gates are ``x_t @ w_x + h_{t-1} @ w_rec`` on the
    micro-kernel, one accumulator per element; ``x_ready``: the chunk's
    ``x_t @ w_x`` is in ``work`` already (:func:`_input_part`). Otherwise
    ``i_, ci_, f_, o_`` hold the step's input projections on entry (see
    :func:`forward_kernel`), added to ``h_{t-1} @ w_rec``; the gate maths
    writes the gates over them.
    """
    batch = cs_prev.shape[0]
    units = cs_prev.shape[1]
    h0 = bounds[k]
    h1 = bounds[k + 1]
    hk = h1 - h0
    c0 = col_off[k]
    width = col_off[k + 1] - c0
    gk = work[batch * c0:batch * (c0 + width)].reshape((batch, width))
    h_src = h_prev if t == 0 else h_[t - 1]
    panels = width // _microkernel.panel_width_of(w_rec)
    if fused and not x_ready:
        _input_part(t, k, col_off, x2d, w_x, work, batch)
    _microkernel.gemm_panels(h_src.reshape(-1), 0, units, batch, w_rec, units * c0, units, panels, work,
                             batch * c0, width, fused)
    if not fused:  # add the input projection
        for b in range(batch):
            g = gk[b]
            _add_to(g[blocks[0] * hk:(blocks[0] + 1) * hk], i_[t, b, h0:h1])
            _add_to(g[blocks[1] * hk:(blocks[1] + 1) * hk], ci_[t, b, h0:h1])
            _add_to(g[blocks[2] * hk:(blocks[2] + 1) * hk], f_[t, b, h0:h1])
            _add_to(g[blocks[3] * hk:(blocks[3] + 1) * hk], o_[t, b, h0:h1])
    # Gate g of the chunk's units: columns blocks[g] * hk .. of the chunk's
    # GEMM result, and blocks[g] * H + h0 .. of the bias. Every array is
    # sliced to the chunk, so that the unit loop indexes from 0 (no
    # wraparound checks) and LLVM vectorizes it.
    bi = bias[blocks[0] * units + h0:blocks[0] * units + h1]
    bc = bias[blocks[1] * units + h0:blocks[1] * units + h1]
    bf = bias[blocks[2] * units + h0:blocks[2] * units + h1]
    bo = bias[blocks[3] * units + h0:blocks[3] * units + h1]
    pi, pf, po = wci[h0:h1], wcf[h0:h1], wco[h0:h1]
    for b in range(batch):
        g = gk[b]
        gi = g[blocks[0] * hk:(blocks[0] + 1) * hk]
        gc = g[blocks[1] * hk:(blocks[1] + 1) * hk]
        gf = g[blocks[2] * hk:(blocks[2] + 1) * hk]
        go = g[blocks[3] * hk:(blocks[3] + 1) * hk]
        c_src = cs_prev[b, h0:h1] if t == 0 else cs_[t - 1, b, h0:h1]
        i_r, cs_r, f_r, o_r = i_[t, b, h0:h1], cs_[t, b, h0:h1], f_[t, b, h0:h1], o_[t, b, h0:h1]
        ci_r, co_r, h_r = ci_[t, b, h0:h1], co_[t, b, h0:h1], h_[t, b, h0:h1]
        for j in range(hk):
            i, ci, f, o, cs, co, h = forward_unit(
                gi[j] + bi[j], gc[j] + bc[j], gf[j] + bf[j], go[j] + bo[j],
                c_src[j], pi[j], pf[j], po[j], forget_bias, cell_clip, use_peephole, one,
            )
            i_r[j] = i
            ci_r[j] = ci
            f_r[j] = f
            o_r[j] = o
            cs_r[j] = cs
            co_r[j] = co
            h_r[j] = h


@njit(parallel=True, **_JIT)
def forward_kernel(x2d, w_in, w_x, fused, bias, cs_prev, h_prev, w_rec, bounds, col_off, rows,
                   parallel_projection, blocks, wci, wcf, wco, forget_bias, cell_clip, use_peephole, work, i_, cs_, f_,
                   o_, ci_, co_, h_):
    """The forward pass of steps ``0 .. S - 1``, ``S = x2d.shape[0] // B``.

    ``fused`` (:func:`fused_projection`): each step computes its gates as
    ``x_t @ w_x + h_{t-1} @ w_rec`` on the micro-kernel, with no input
    projection before the loop, whose ``[S, B, 4H]`` result would go to
    memory and come back. Otherwise the input projection of all steps comes
    first, as BLAS GEMMs into ``i_, ci_, f_, o_`` (no ``[T, B, 4H]``
    workspace), and each step adds it to its recurrent product.

    Parameters
    ----------
    x2d : [S * B, I] C-contiguous array
        The inputs of the ``S = seq_len_max`` steps.
    w_in : [4, I, H] C-contiguous array
        Input weights of the gates ``i, ci, f, o`` (empty when ``fused``).
    w_x : [4H * I] array
        Packed input weights when ``fused`` (:func:`pack_recurrent` of
        ``w[:I]``), else empty.
    fused : bool
    bias : [4H] array
        Caller's layout.
    cs_prev, h_prev : [B, H] C-contiguous arrays
    w_rec : [4H * H] array
        Packed recurrent weights (:func:`pack_recurrent`).
    bounds : [K + 1] int64 array
        Hidden-unit chunks (:func:`chunk_bounds`).
    col_off : [K + 1] int64 array
        Where each chunk's columns start in ``w_rec`` and ``work``
        (:func:`column_offsets` with ``per_unit = 4``).
    rows : [R + 1] int64 array
    parallel_projection : bool
        Row blocks of the input projection (unless ``fused``) and whether
        its ``4 * R`` GEMMs run in parallel (:func:`row_blocks`).
    blocks : [4] int64 array
        Gate block of ``i, ci, f, o`` (:func:`gate_blocks`).
    wci, wcf, wco : [H] arrays
    forget_bias, cell_clip : float
    use_peephole : bool
    work : [B * col_off[K]] array
        Workspace of the recurrent GEMMs.
    i_, cs_, f_, o_, ci_, co_, h_ : [T, B, H] C-contiguous arrays, T >= S
        Outputs, written for the first ``S`` steps.
    """
    one = cs_.dtype.type(1.0)
    fb = cs_.dtype.type(forget_bias)
    clip = cs_.dtype.type(cell_clip)
    batch, units = cs_prev.shape
    steps = x2d.shape[0] // batch
    total = i_.shape[0] * batch
    pre = (i_.reshape((total, units)), ci_.reshape((total, units)), f_.reshape((total, units)),
           o_.reshape((total, units)))
    # Helpers get int64 indices and bounds, never literals or prange's
    # unsigned index: each distinct argument type would compile them again.
    tasks = 0 if fused else 4 * (rows.shape[0] - 1)
    if parallel_projection and tasks:
        for k in prange(tasks):
            _input_projection(x2d, w_in, pre, rows, np.int64(k))
    else:  # small: no parallel region (each costs a barrier)
        for k in range(tasks):
            _input_projection(x2d, w_in, pre, rows, k)
    num_chunks = bounds.shape[0] - 1
    if num_chunks == 1:
        for t in range(steps):
            _forward_chunk(t, num_chunks - 1, bounds, col_off, fused, False, x2d, w_x, bias, cs_prev, h_prev, w_rec,
                           blocks, work, wci, wcf, wco, fb, clip, use_peephole, one, i_, cs_, f_, o_, ci_, co_, h_)
        return
    # Every step in one parallel region (nblstm._sync): worker w takes chunk
    # w of each step, then any chunk still unclaimed, and waits for the
    # whole step before the next. With the fused projection, when it did
    # its own chunk (whose workspace nobody else then uses), it claims that
    # chunk of the next step before waiting, and computes its x_{t+1} @ w_x,
    # which does not need h_t, while the other chunks finish.
    claims = np.zeros(steps * num_chunks, np.int64)
    done = np.zeros(steps, np.int64)
    for worker in prange(num_chunks):
        w = np.int64(worker)
        x_ready = np.bool_(False)  # this worker holds chunk w of step t, its x_t @ w_x done (not a literal: one type)
        for t in range(steps):
            own_done = False
            for k in _sync.claimed_chunks(claims, done, t, w, num_chunks, x_ready):
                mine = x_ready and k == w
                _forward_chunk(t, k, bounds, col_off, fused, mine, x2d, w_x, bias, cs_prev, h_prev, w_rec, blocks, work,
                               wci, wcf, wco, fb, clip, use_peephole, one, i_, cs_, f_, o_, ci_, co_, h_)
                own_done = own_done or k == w
            x_ready = fused and own_done and t + 1 < steps and _sync.claim(claims, t + 1, w, num_chunks)
            if x_ready:
                _input_part(t + 1, w, col_off, x2d, w_x, work, batch)
            _sync.wait_for(done, t, num_chunks)


@njit(inline="always", **_JIT)  # inlined, as _forward_chunk
def _backward_chunk(t, k, bounds, col_off, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec_t, blocks,
                    dgates, dc, work, wci, wcf, wco, use_peephole, one, wci_grad, wcf_grad, wco_grad):
    """Step ``t`` (backwards) of the units of chunk ``k``."""
    batch, units = cs_prev.shape
    h0 = bounds[k]
    h1 = bounds[k + 1]
    hk = h1 - h0
    c0 = col_off[k]
    width = col_off[k + 1] - c0
    dhk = work[batch * c0:batch * (c0 + width)].reshape((batch, width))
    gates = 4 * units
    if t + 1 >= dgates.shape[0]:
        dhk[:] = 0
    else:  # dh = dgates[t + 1] @ w_rec[h0:h1]^T, on the packed transposes
        _microkernel.gemm_panels(dgates.reshape(-1), (t + 1) * batch * gates, gates, batch, w_rec_t, gates * c0, gates,
                                 width // _microkernel.panel_width_of(w_rec_t), work, batch * c0, width)
    # Every array sliced to the chunk: the unit loop indexes from 0 and vectorizes.
    pi, pf, po = wci[h0:h1], wcf[h0:h1], wco[h0:h1]
    gi_, gf_, go_ = wci_grad[h0:h1], wcf_grad[h0:h1], wco_grad[h0:h1]
    for b in range(batch):
        dh_r = dhk[b]
        dg = dgates[t, b]
        dgi = dg[blocks[0] * units + h0:blocks[0] * units + h1]
        dgc = dg[blocks[1] * units + h0:blocks[1] * units + h1]
        dgf = dg[blocks[2] * units + h0:blocks[2] * units + h1]
        dgo = dg[blocks[3] * units + h0:blocks[3] * units + h1]
        dc_r = dc[b, h0:h1]
        c_src = cs_prev[b, h0:h1] if t == 0 else cs_[t - 1, b, h0:h1]
        i_r, cs_r, f_r, o_r = i_[t, b, h0:h1], cs_[t, b, h0:h1], f_[t, b, h0:h1], o_[t, b, h0:h1]
        ci_r, co_r = ci_[t, b, h0:h1], co_[t, b, h0:h1]
        hg_r, cg_r = h_grad[t, b, h0:h1], cs_grad[t, b, h0:h1]
        for j in range(hk):
            c_prev = c_src[j]
            di, dci, df, do, dc_prev = backward_unit(
                hg_r[j] + dh_r[j], cg_r[j] + dc_r[j], i_r[j], ci_r[j], f_r[j], o_r[j], co_r[j], c_prev,
                pi[j], pf[j], po[j], use_peephole, one,
            )
            dgi[j] = di
            dgc[j] = dci
            dgf[j] = df
            dgo[j] = do
            dc_r[j] = dc_prev
        if use_peephole:
            # A loop of its own: fewer arrays per loop let LLVM vectorize both.
            for j in range(hk):
                gi_[j] += dgi[j] * c_src[j]
                gf_[j] += dgf[j] * c_src[j]
                go_[j] += dgo[j] * cs_r[j]


@njit(parallel=True, **_JIT)
def backward_kernel(cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec_t, bounds, col_off, blocks, wci, wcf,
                    wco, use_peephole, work, dgates, dc, wci_grad, wcf_grad, wco_grad):
    """The time loop of the backward pass, steps ``S - 1 .. 0``.

    Parameters
    ----------
    cs_prev : [B, H] C-contiguous array
    i_, cs_, f_, o_, ci_, co_ : [T, B, H] C-contiguous arrays
        Forward outputs (trusted, not recomputed).
    cs_grad, h_grad : [T, B, H] C-contiguous arrays
        Incoming gradients; steps ``>= S`` are not read.
    w_rec_t : [4H * col_off[K]] array
        The chunks' ``w_rec[h0:h1].T`` packed in panels
        (:func:`pack_chunks`); empty when ``S = 1`` (nothing is carried).
    bounds : [K + 1] int64 array
    col_off : [K + 1] int64 array
        :func:`column_offsets` with ``per_unit = 1``.
    blocks : [4] int64 array
    wci, wcf, wco : [H] arrays
    use_peephole : bool
    work : [B * col_off[K]] array
        Workspace of ``dgates @ w_h^T``.
    dgates : [S, B, 4H] array
        Output: gradients of the gate pre-activations, caller's layout.
    dc : [B, H] array, zero on entry
        Carried cell gradient; on exit ``cs_prev_grad``.
    wci_grad, wcf_grad, wco_grad : [H] arrays, zero on entry
        Accumulated peephole gradients.
    """
    one = dgates.dtype.type(1.0)
    num_chunks = bounds.shape[0] - 1
    steps = dgates.shape[0]
    if num_chunks == 1:
        for t in range(steps - 1, -1, -1):
            _backward_chunk(t, num_chunks - 1, bounds, col_off, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad,
                            w_rec_t, blocks, dgates, dc, work, wci, wcf, wco, use_peephole, one, wci_grad,
                            wcf_grad, wco_grad)
        return
    # One parallel region for all steps, as the forward (nblstm._sync).
    claims = np.zeros(steps * num_chunks, np.int64)
    done = np.zeros(steps, np.int64)
    for worker in prange(num_chunks):
        w = np.int64(worker)
        for t in range(steps - 1, -1, -1):
            for k in _sync.claimed_chunks(claims, done, t, w, num_chunks, False):
                _backward_chunk(t, k, bounds, col_off, cs_prev, i_, cs_, f_, o_, ci_, co_, cs_grad, h_grad, w_rec_t,
                                blocks, dgates, dc, work, wci, wcf, wco, use_peephole, one, wci_grad, wcf_grad,
                                wco_grad)
            _sync.wait_for(done, t, num_chunks)


@njit(**_JIT)
def _weight_grads_block(k, x2d, h2d, h_prev, dg2d, w_in_t, x_rows, w_rows, col_blocks, x_grad2d, w_grad, b_grad):
    """Thread ``k``'s share of the GEMMs after the backward loop.

    Rows ``x_rows[k]..x_rows[k+1]-1`` of ``x_grad2d``, rows
    ``w_rows[k]..w_rows[k+1]-1`` of ``w_grad`` (each a product over all
    steps: ``[x_t, h_{t-1}]^T @ dgates``, with ``h_prev`` before step 0) and
    columns ``col_blocks[k]..col_blocks[k+1]-1`` of ``b_grad``.
    """
    batch = h_prev.shape[0]
    inputs = x2d.shape[1]
    rows = dg2d.shape[0]
    _gemm_rows(dg2d, w_in_t, x_grad2d, x_rows, k)
    m0, m1 = w_rows[k], w_rows[k + 1]
    a0, a1 = min(m0, inputs), min(m1, inputs)  # rows of w[:I]
    if a1 > a0:
        _gemm_tn(x2d[:, a0:a1], dg2d, w_grad[a0:a1], False)
    b0, b1 = max(m0, inputs), max(m1, inputs)  # rows of w[I:]
    if b1 > b0:
        # Step 0's previous output is h_prev; step t's is h2d[t - 1].
        _gemm_tn(h_prev[:, b0 - inputs:b1 - inputs], dg2d[:batch], w_grad[b0:b1], False)
        _gemm_tn(h2d[:rows - batch, b0 - inputs:b1 - inputs], dg2d[batch:], w_grad[b0:b1], True)
    n0, n1 = col_blocks[k], col_blocks[k + 1]
    bk = b_grad[n0:n1]
    bk[:] = 0
    for row in range(rows):
        dr = dg2d[row, n0:n1]
        for c in range(n1 - n0):
            bk[c] += dr[c]


@njit(parallel=True, **_JIT)
def weight_grads_kernel(x2d, h2d, h_prev, dg2d, w_in_t, w_rec_t, x_rows, w_rows, col_blocks, x_grad2d, w_grad, b_grad,
                        h_prev_grad):
    """The GEMMs after the backward loop, split across threads: ``x_grad`` by rows of
    ``dg2d``, ``w_grad`` by its own rows, ``b_grad`` by columns (no partial sums).

    Parameters
    ----------
    x2d : [S * B, I] C-contiguous array
        Inputs of the ``S`` steps.
    h2d : [T * B, H] C-contiguous array
        Forward output ``h``; row ``r - B`` is the previous output of row ``r``.
    h_prev : [B, H] C-contiguous array
    dg2d : [S * B, 4H] array
        Gate gradients of all steps.
    w_in_t : [4H, I] F-contiguous array
        Transposed input weights (``w[:I].T``, a view).
    w_rec_t : [4H, H] F-contiguous array
        Transposed recurrent weights (``w[I:].T``, a view).
    x_rows : [K + 1] int64 array
        Row blocks over ``0 .. S * B``.
    w_rows : [K + 1] int64 array
        Row blocks over ``0 .. I + H``.
    col_blocks : [K + 1] int64 array
        Column blocks over ``0 .. 4H``.
    x_grad2d : [S * B, I] array
        Output ``dg2d @ w_in_t``.
    w_grad : [I + H, 4H] array
        Output ``[x_t, h_{t-1}]^T @ dgates`` summed over steps.
    b_grad : [4H] array
        Output: column sums of ``dg2d``.
    h_prev_grad : [B, H] array
        Output: ``dg2d[:B] @ w_rec_t``, the gradient of the initial output.
    """
    num_blocks = x_rows.shape[0] - 1
    # int64 block indices, never a literal 0 or prange's unsigned index: each
    # distinct argument type would compile the helper again.
    if num_blocks == 1:  # no parallel region (each costs a barrier)
        _weight_grads_block(num_blocks - 1, x2d, h2d, h_prev, dg2d, w_in_t, x_rows, w_rows, col_blocks, x_grad2d,
                            w_grad, b_grad)
    else:
        for k in prange(num_blocks):
            _weight_grads_block(np.int64(k), x2d, h2d, h_prev, dg2d, w_in_t, x_rows, w_rows, col_blocks, x_grad2d,
                                w_grad, b_grad)
    np.dot(dg2d[:h_prev.shape[0]], w_rec_t, h_prev_grad)


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
    # One allocation for the seven outputs: at 4 MiB and more NumPy asks for
    # transparent huge pages, and glibc raises its trim threshold to the
    # largest block it has freed, so a training loop neither faults the
    # outputs' pages in 4 KiB at a time nor returns them to the kernel after
    # every call. The kernel writes every step below seq_len_max.
    block = _pool.empty((7, steps, batch, units), dtype)
    block[:, seq_len_max:] = 0
    outs = list(block)
    if seq_len_max == 0 or batch == 0:
        return outs
    bounds = chunk_bounds(batch, units)
    blocks = gate_blocks(layout)
    rows = seq_len_max * batch
    x2d = np.ascontiguousarray(x[:seq_len_max].reshape(rows, inputs))
    col_off = column_offsets(bounds, 4, dtype)
    work = _pool.aligned(batch * int(col_off[-1]), dtype)
    c = np.ascontiguousarray
    fused = fused_projection(batch, inputs, dtype)
    if fused:
        w_in = np.empty((4, 0, 0), dtype)
        projection = (_split(rows, 1), False)
    else:
        w_in = np.empty((4, inputs, units), dtype)
        projection = row_blocks(rows, inputs * 4 * units)
    with kernel_section():
        if not fused:
            gate_weights(c(w), blocks, w_in, w_in.size >= _MIN_PARALLEL_PACK)
        w_rec = pack_recurrent(w[inputs:], bounds, col_off)
        w_x = pack_recurrent(w[:inputs], bounds, col_off) if fused else np.empty(0, dtype)
        forward_kernel(x2d, w_in, w_x, fused, c(b), c(cs_prev), c(h_prev), w_rec, bounds, col_off, *projection,
                       blocks, c(wci), c(wcf), c(wco), float(forget_bias), float(cell_clip),
                       bool(use_peephole), work, *outs)
    return outs


def _backward_recurrent(cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, w_rec, use_peephole, layout,
                        dgates=None):
    """The time loop of the backward pass: gate gradients and the cell carry.

    Callers run it inside :func:`kernel_section`.

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
    dgates : [S, B, 4H] C-contiguous array, optional
        Where to write the gate gradients (a new array by default).

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
    col_off = column_offsets(bounds, 1, dtype)
    if dgates is None:
        dgates = _pool.aligned((seq_len_max, batch, 4 * units), dtype)
    work = _pool.aligned(batch * int(col_off[-1]), dtype)
    c = np.ascontiguousarray
    carried = seq_len_max > 1  # a step carries dh from the next one, on the micro-kernel
    w_rec_t = _pool.aligned(4 * units * int(col_off[-1]) if carried else 0, dtype)
    if carried:
        pack_chunks(c(w_rec), bounds, col_off, w_rec_t, True, w_rec.size >= _MIN_PARALLEL_PACK)
    i_, cs_, f_, o_, ci_, co_ = (c(a) for a in outputs[:6])
    backward_kernel(c(cs_prev), i_, cs_, f_, o_, ci_, co_, c(cs_grad), c(h_grad), w_rec_t, bounds, col_off,
                    gate_blocks(layout), c(wci), c(wcf), c(wco), bool(use_peephole), work, dgates, dc, *peephole_grads)
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
    x_grad = np.empty((steps, batch, inputs), dtype)
    x_grad[seq_len_max:] = 0  # the GEMMs after the loop write the steps below seq_len_max
    if seq_len_max == 0 or batch == 0:
        zeros = [np.zeros(units, dtype) for _ in range(3)]
        return (x_grad, np.zeros((batch, units), dtype), np.zeros((batch, units), dtype), np.zeros(w.shape, dtype),
                *zeros, np.zeros(4 * units, dtype))
    rows = seq_len_max * batch
    x_rows = row_bounds(rows, (2 * inputs + units) * 4 * units)
    num_blocks = x_rows.shape[0] - 1
    w_rows, col_blocks = block_bounds(inputs + units, num_blocks), block_bounds(4 * units, num_blocks)
    x_grad2d = x_grad.reshape(steps * batch, inputs)[:rows]
    w_grad = np.empty(w.shape, dtype)
    b_grad = np.empty(4 * units, dtype)
    h_prev_grad = np.empty((batch, units), dtype)
    c = np.ascontiguousarray
    w = c(w)  # its row blocks' transposes are F-contiguous views, as the kernel takes them
    h2d = c(outputs[6]).reshape(steps * batch, units)
    with kernel_section():
        dg, dc, wci_grad, wcf_grad, wco_grad = _backward_recurrent(
            cs_prev, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, w[inputs:], use_peephole, layout,
            _scratch.get("dgates", (seq_len_max, batch, 4 * units), dtype))
        weight_grads_kernel(c(x[:seq_len_max].reshape(rows, inputs)), h2d, c(h_prev), dg.reshape(rows, 4 * units),
                            w[:inputs].T, w[inputs:].T, x_rows, w_rows, col_blocks, x_grad2d, w_grad, b_grad,
                            h_prev_grad)
    return (x_grad, dc, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad, b_grad)


# Entry points called by nblstm.ops (nblstm.cuda has the same three).


def _compute_dtype(dtype):
    """numba's CPU target has no float16: float16 is computed in float32."""
    return np.dtype(np.float32) if dtype == np.float16 else np.dtype(dtype)


def _to_compute(a, dtype):
    """``a`` in the compute dtype: no copy when it has it; float16 by :mod:`nblstm._half`."""
    if a is None or a.dtype == dtype:
        return a
    if a.dtype == np.float16 and dtype == np.float32:
        return _half.to_float32(a)
    return np.asarray(a, dtype)


def _to_storage(a, dtype):
    """A result back in the caller's dtype (float16 by :mod:`nblstm._half`)."""
    if a.dtype == dtype:
        return a
    if dtype == np.float16 and a.dtype == np.float32:
        return _half.to_float16(a)
    return a.astype(dtype)


def _cast_all(arrays, dtype):
    """Cast to the compute dtype (a no-op for arrays already in it); ``None`` stays ``None``."""
    return [_to_compute(a, dtype) for a in arrays]


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
    return [_to_storage(o, dtype) for o in outs]


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
    if cs_grad is None or h_grad is None:
        zeros = np.zeros((steps, batch, units), ct)
        cs_grad = zeros if cs_grad is None else cs_grad
        h_grad = zeros if h_grad is None else h_grad
    grads = _backward(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, use_peephole,
                      layout)
    return [_to_storage(g, dtype) for g in grads]


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
        with kernel_section():
            dgates, dc, wci_grad, wcf_grad, wco_grad = _backward_recurrent(
                cs_prev, wci, wcf, wco, outputs, cs_grad[None], h_grad[None], 1, w_rec, use_peephole, layout)
        grads = [dc, dgates[0], wci_grad, wcf_grad, wco_grad]
    return [_to_storage(g, dtype) for g in grads]
