"""One step of the TF1 ``LSTMCell`` on the CPU, for streaming: weights packed once, state kept between calls.

:class:`CellStep` is what :meth:`nblstm.LSTMCell.stepper` runs on the CPU.
Every array a step needs -- the packed weights, the options as scalars,
the state ``(c, h)`` and the workspaces -- lives in one flat buffer of the
compute dtype, at offsets recorded in one int64 array, so that a step is
one call of one jitted function with three arguments (:func:`step_kernel`):
numba's dispatch costs a fraction of a microsecond per argument, and the
cell's own one-step call (:meth:`nblstm.LSTMCell.__call__`) spends about
30 us in Python (validation, packing lookups, allocations, BLAS thread
control) before its kernel runs.

The arithmetic is the cell's (:mod:`nblstm.cpu.cell`), operation for
operation, so that a step gives the bits of ``cell(x_t, state)``:

- the input projection ``x_t @ kernel[:I]`` is the same BLAS calls
  (:func:`~nblstm.cpu.gemm.rows_product`) on the same operands, in the cell's
  row blocks (:func:`~nblstm.cpu.partition.row_bounds`): a block of one row
  is a matrix-vector product, whose rounding differs in the last bits from
  that of a product of several rows (and from the micro-kernel's);
- the recurrent product ``h @ kernel[I:]`` is :func:`~nblstm.cpu.microkernel.gemm_panels`
  on the same panels (:func:`~nblstm.cpu.pack.pack_chunks`, one chunk: each
  element's sum does not depend on the chunking);
- the gate maths is the cell's own row loop
  (:func:`nblstm.cpu.cell.forward_row`: ``recurrent + input + bias``, in
  that order, then :func:`nblstm.spec.cell_forward_unit` and the cell's
  stores) on row views sliced to the units, with tanh's code a constant
  (the cell's two copies of the loop), compiled with the same flags
  (:data:`nblstm._jit.KERNEL`);
- the projection ``r @ projection`` is the cell's BLAS calls in the cell's
  column chunks (their widths change BLAS's rounding too), then
  :func:`nblstm.spec.clip_value`.

The row blocks and column chunks depend on :func:`numba.get_num_threads`,
as the cell's do; a step with several rows or a projection looks them up
again (cached: a fraction of a microsecond), so that it follows a change of
the thread count as the cell does.

The kernel is serial: one step of a streaming cell is far below the work
at which the cell splits its steps across threads (starting a helper thread costs
tens of microseconds, and a meeting per step waits a time slice on busy cores).
BLAS products large enough that OpenBLAS could split them across its own
threads (:data:`BLAS_THREAD_WORK` multiply-adds or more) run inside
:func:`~nblstm.cpu.blas.single_threaded_blas`; smaller ones skip its cost
(about 2 us a call).

float16 cells compute in float32, as the cell does: ``x_t`` is converted
exactly, and after every step ``c`` and ``h`` are rounded to float16 and
kept as those values, as the state the cell returns (float16) would be.
"""

import numba
import numpy as np
from numba import njit

from .._jit import KERNEL, full_width
from ..spec import UnitOptions, clip_value
from . import half, microkernel, pool
from .blas import kernel_section, single_threaded_blas
from .cell import forward_row
from .gemm import rows_product
from .pack import pack_chunks
from .partition import cell_chunk_bounds, row_bounds
from .views import matrix

__all__ = ["BLAS_THREAD_WORK", "CellStep", "step_kernel"]

#: BLAS products of at least this many multiply-adds are held to one thread:
#: OpenBLAS runs smaller GEMMs on the calling thread only (its threshold is
#: 65536 x 4 multiply-adds), and its matrix-vector products measured so too
#: up to 2^18 (``[1, 256] @ [256, 1024]``); ``[1, 1024] @ [1024, 4096]`` used two.
BLAS_THREAD_WORK = 1 << 18

# The int64 layout array: sizes, flags, then offsets into the buffer (elements).
_B, _I, _H, _P, _WIDTH = 0, 1, 2, 3, 4
_HAS_PROJ, _PEEPHOLES, _CLIP_ON, _PROJ_CLIP_ON, _ACT = 5, 6, 7, 8, 9
_W_X, _W_REC, _BIAS, _W_I, _W_F, _W_O, _W_PROJ = 10, 11, 12, 13, 14, 15, 16
_C, _H_STATE, _PRE, _WORK, _R, _H_RAW = 17, 18, 19, 20, 21, 22
_C_NEW, _C_RAW, _AC = 23, 24, 25
_ROW_BLOCKS, _PROJ_BLOCKS, _PROJ_BOUNDS_AT = 26, 27, 28
_ROWS = 29  # the row blocks' bounds, then from _PROJ_BOUNDS_AT the projection's column chunks
# The scalars at the start of the buffer.
_FORGET_BIAS, _CELL_CLIP, _PROJ_CLIP = 0, 1, 2
_SCALARS = 3


@njit(inline="always")
def _gate_rows(f, m, act, one):
    """The gate maths of one step for every row (inlined, so that ``act`` may be a constant).

    The loop body of the cell's (``nblstm.cpu.cell``), stores included:
    the gates go back to ``pre``, ``c_raw``, ``c`` and ``act(c)`` to
    workspaces of their own. Which product of ``c_raw = f c_prev + i j``
    LLVM fuses into an FMA depends on them: without those stores, float64
    with a non-tanh activation fused the other one and differed from the
    cell in the last bit. ``r = o * act(c)`` goes to the output state ``h``
    without a projection (the GEMM has read the previous ``h`` by then) and
    to the ``r`` workspace with one.
    """
    batch, units, width = m[_B], m[_H], m[_WIDTH]
    uk = units
    four = 4 * units
    unit = UnitOptions(f[_FORGET_BIAS], f[_CELL_CLIP], m[_CLIP_ON] != 0, act, m[_PEEPHOLES] != 0, one)
    # Row views sliced to the units, indexed from 0 (they vectorize), as in nblstm.cpu.cell.
    bk = f[m[_BIAS] : m[_BIAS] + four]
    w_ik, w_fk, w_ok = f[m[_W_I] : m[_W_I] + uk], f[m[_W_F] : m[_W_F] + uk], f[m[_W_O] : m[_W_O] + uk]
    r_off = m[_R] if m[_HAS_PROJ] != 0 else m[_H_STATE]
    for b in range(batch):
        g = f[m[_WORK] + b * width : m[_WORK] + b * width + four]
        pre = f[m[_PRE] + b * four : m[_PRE] + (b + 1) * four]
        c_src = f[m[_C] + b * uk : m[_C] + (b + 1) * uk]
        c_r = f[m[_C_NEW] + b * uk : m[_C_NEW] + (b + 1) * uk]
        c_raw_r = f[m[_C_RAW] + b * uk : m[_C_RAW] + (b + 1) * uk]
        ac_r = f[m[_AC] + b * uk : m[_AC] + (b + 1) * uk]
        r_r = f[r_off + b * uk : r_off + (b + 1) * uk]
        forward_row(g, pre, bk, c_src, (w_ik, w_fk, w_ok), unit, (c_raw_r, c_r, ac_r, r_r))


@njit(**KERNEL)
def step_kernel(x, f, m):
    """One step of the cell: reads ``x`` and the state in ``f``, leaves the new state there.

    Parameters
    ----------
    x : [B, I] C-contiguous array
        The step's inputs, in the compute dtype.
    f : [N] array
        The buffer of :class:`CellStep`: the options' scalars, the packed
        weights, the state ``c [B, H]`` and ``h [B, P]`` (read, then
        overwritten with the new state) and the workspaces.
    m : int64 array
        Sizes, flags and offsets of ``f``'s parts, then the bounds of the
        input projection's row blocks and of the projection's column chunks.
    """
    full_width()
    one = f.dtype.type(1.0)
    batch, inputs, units, depth, width = m[_B], m[_I], m[_H], m[_P], m[_WIDTH]
    four = 4 * units
    # The input projection: the cell's BLAS calls, by the cell's row blocks (a
    # block of one row is a matrix-vector product, with other roundings).
    w_x = matrix(f, m[_W_X], inputs, four)
    pre = matrix(f, m[_PRE], batch, four)
    rows = m[_ROWS : _ROWS + m[_ROW_BLOCKS] + 1]
    for r in range(m[_ROW_BLOCKS]):
        rows_product(x, w_x, pre, rows[r], rows[r + 1])
    # The recurrent product on the micro-kernel's panels, from the previous h.
    microkernel.gemm_panels(
        f, m[_H_STATE], depth, batch, f, m[_W_REC], depth, width // microkernel.panel_width_of(f), f, m[_WORK], width
    )
    if m[_ACT] == 0:  # tanh, the default: a constant code, so that the maths vectorizes
        _gate_rows(f, m, 0, one)
    else:
        _gate_rows(f, m, m[_ACT], one)
    c_new = f[m[_C_NEW] : m[_C_NEW] + batch * units]
    c_state = f[m[_C] : m[_C] + batch * units]
    for k in range(batch * units):  # the new state c, once every unit has read its previous value
        c_state[k] = c_new[k]
    if m[_HAS_PROJ] != 0:
        # The projection by the cell's column chunks (nblstm.cpu.cell's
        # _forward_proj): chunk k's weights are a C-ordered [H, pk] block at
        # H * p0, its products [B, pk] at B * p0 (BLAS rounds a product
        # otherwise for other widths).
        r = matrix(f, m[_R], batch, units)
        proj_clip, proj_clip_on = f[_PROJ_CLIP], m[_PROJ_CLIP_ON] != 0
        at = m[_PROJ_BOUNDS_AT]
        for k in range(m[_PROJ_BLOCKS]):
            p0, p1 = m[at + k], m[at + k + 1]
            pk = p1 - p0
            wk = matrix(f, m[_W_PROJ] + units * p0, units, pk)
            gk = matrix(f, m[_H_RAW] + batch * p0, batch, pk)
            rows_product(r, wk, gk, 0, batch)
            for b in range(batch):
                g = gk[b]
                h_r = f[m[_H_STATE] + b * depth + p0 : m[_H_STATE] + b * depth + p1]
                for jj in range(pk):
                    h_r[jj] = clip_value(g[jj], proj_clip, proj_clip_on)


def _aligned_end(offset, dtype):
    """``offset`` (elements) rounded up to the next 64-byte boundary."""
    per_line = pool.ALIGNMENT // np.dtype(dtype).itemsize
    return -(-offset // per_line) * per_line


class CellStep:
    """A cell's weights, options and state for one step at a time on the CPU, in one buffer.

    Parameters
    ----------
    weights : dict
        The cell's variables (``kernel [I + P, 4H]`` ICFO, ``bias [4H]``,
        optional peepholes ``[H]`` and ``projection/kernel [H, P]``), of
        the storage dtype; copied (a snapshot).
    options : nblstm.options.CellOptions
    batch_size : int
        ``B >= 1``.
    c0 : [B, H] array or None
    h0 : [B, P] array or None
        The initial state, of the weights' dtype (``None``: zeros).

    Attributes
    ----------
    dtype : numpy.dtype
        The storage dtype (the weights'): of the inputs, outputs and states.
    step : callable
        ``step(x) -> h``: one step from ``x: [B, I]``, a C-contiguous,
        aligned and writable array of the storage dtype; returns the output
        ``[B, P]`` (the new ``h``) as a new array. Chosen once for the
        dtype and sizes, so that a call runs no test of its own.
    """

    def __init__(self, weights, options, batch_size, c0=None, h0=None):
        kernel = weights["kernel"]
        self.dtype = kernel.dtype
        ct = np.dtype(np.float32) if self.dtype == np.float16 else self.dtype
        units = kernel.shape[1] // 4
        proj = weights.get("projection/kernel")
        has_proj = proj is not None
        depth = proj.shape[1] if has_proj else units
        inputs = kernel.shape[0] - depth
        batch = int(batch_size)
        width = microkernel.padded(4 * units, ct)
        sizes = [  # (layout slot, elements), in buffer order
            (_W_X, inputs * 4 * units),
            (_W_REC, depth * width),
            (_BIAS, 4 * units),
            (_W_I, units),
            (_W_F, units),
            (_W_O, units),
            (_W_PROJ, units * depth if has_proj else 0),
            (_C, batch * units),
            (_H_STATE, batch * depth),
            (_PRE, batch * 4 * units),
            (_WORK, batch * width),
            (_C_NEW, batch * units),
            (_C_RAW, batch * units),
            (_AC, batch * units),
            (_R, batch * units if has_proj else 0),
            (_H_RAW, batch * depth if has_proj else 0),
        ]
        most = numba.config.NUMBA_NUM_THREADS + 1  # bounds of at most one block per thread
        layout = np.zeros(_ROWS + 2 * most, np.int64)
        layout[_PROJ_BOUNDS_AT] = _ROWS + most
        offset = _SCALARS
        for slot, size in sizes:  # every part on a 64-byte boundary, as the cell's arrays (pool.aligned)
            offset = _aligned_end(offset, ct)
            layout[slot] = offset
            offset += size
        use_peepholes = "w_i_diag" in weights
        scalars = options.kernel_options(has_proj, use_peepholes)  # the cell's kernels' record (KernelOptions)
        layout[[_B, _I, _H, _P, _WIDTH]] = batch, inputs, units, depth, width
        layout[[_HAS_PROJ, _PEEPHOLES, _CLIP_ON, _PROJ_CLIP_ON, _ACT]] = (
            has_proj,
            use_peepholes,
            scalars.clip_on,
            scalars.proj_clip_on,
            scalars.act,
        )
        f = pool.aligned(offset, ct)
        f[:] = 0  # the panels' padding and the workspaces too: every element is defined
        # The kernels' scalars, rounded to the compute dtype as the cell's kernels round them.
        f[[_FORGET_BIAS, _CELL_CLIP, _PROJ_CLIP]] = scalars.forget_bias, scalars.cell_clip, scalars.proj_clip

        def part(slot, size, shape=None):
            view = f[layout[slot] : layout[slot] + size]
            return view if shape is None else view.reshape(shape)

        def compute(a):
            return np.ascontiguousarray(half.to_float32(a) if a.dtype == np.float16 else a, ct)

        kernel = compute(kernel)
        part(_W_X, inputs * 4 * units, (inputs, 4 * units))[...] = kernel[:inputs]
        with kernel_section():  # one chunk: each element's sum is the same however the cell chunks it
            pack_chunks(
                np.ascontiguousarray(kernel[inputs:]),
                np.array([0, units], np.int64),
                np.array([0, width], np.int64),
                part(_W_REC, depth * width),
                False,
                False,
            )
        part(_BIAS, 4 * units)[...] = compute(weights["bias"])
        if use_peepholes:
            for slot, name in ((_W_I, "w_i_diag"), (_W_F, "w_f_diag"), (_W_O, "w_o_diag")):
                part(slot, units)[...] = compute(weights[name])
        self._proj = compute(proj) if has_proj else None
        self.batch_size, self.units, self.depth, self.input_depth = batch, units, depth, inputs
        self._f, self._layout = f, layout
        self._c = part(_C, batch * units, (batch, units))
        self._h = part(_H_STATE, batch * depth, (batch, depth))
        self._rows = self._proj_bounds = None
        self._x_work = inputs * 4 * units
        self._check_blocks()
        largest = batch * max(inputs * 4 * units, units * depth if has_proj else 0)
        #: Whether a step holds BLAS to one thread (products of BLAS_THREAD_WORK multiply-adds or more).
        self.holds_blas = largest >= BLAS_THREAD_WORK
        if self.dtype == np.float16:
            self.step = self._step_half
        elif batch > 1 or has_proj or self.holds_blas:
            self.step = self._step_checked
        else:  # one row, small products: the kernel and a copy
            self.step = self._step
        self.set_state(c0, h0)

    def _check_blocks(self):
        """The input projection's row blocks and the projection's column chunks, as the cell would
        split them now: they depend on :func:`numba.get_num_threads`, and BLAS rounds products of
        other shapes otherwise (a block of one row is a matrix-vector product)."""
        rows = row_bounds(self.batch_size, self._x_work)  # cached: the same array while nothing changes
        if rows is not self._rows:
            self._layout[_ROW_BLOCKS] = len(rows) - 1
            self._layout[_ROWS : _ROWS + len(rows)] = rows
            self._rows = rows
        if self._proj is None:
            return
        # PackedWeights' chunking: the projected columns in as many chunks as the units.
        batch = max(self.batch_size, 1)
        bounds = cell_chunk_bounds(batch, self.depth, len(cell_chunk_bounds(batch, self.units)) - 1)
        if bounds is not self._proj_bounds:
            at, units, layout = self._layout[_PROJ_BOUNDS_AT], self.units, self._layout
            layout[_PROJ_BLOCKS] = len(bounds) - 1
            layout[at : at + len(bounds)] = bounds
            w_proj = self._f[layout[_W_PROJ] : layout[_W_PROJ] + units * self.depth]
            for p0, p1 in zip(bounds[:-1], bounds[1:], strict=True):
                w_proj[units * p0 : units * p1] = self._proj[:, p0:p1].ravel()
            self._proj_bounds = bounds

    def set_state(self, c0=None, h0=None):
        """Make ``(c0 [B, H], h0 [B, P])`` (validated arrays of the storage dtype, ``None`` for zeros) the state."""
        for dst, src in ((self._c, c0), (self._h, h0)):
            if src is None:
                dst[...] = 0
            elif src.dtype == np.float16:
                dst[...] = half.to_float32(src)
            else:
                dst[...] = src

    def state(self):
        """The current state ``(c [B, H], h [B, P])``: new arrays of the storage dtype."""
        if self.dtype == np.float16:
            return half.to_float16(self._c), half.to_float16(self._h)
        return self._c.copy(), self._h.copy()

    def _step(self, x):
        step_kernel(x, self._f, self._layout)
        return self._h.copy()

    def _step_checked(self, x):
        """Several rows, a projection, or products large enough to hold BLAS to one thread."""
        self._check_blocks()
        if self.holds_blas:
            with single_threaded_blas():
                step_kernel(x, self._f, self._layout)
        else:
            step_kernel(x, self._f, self._layout)
        return self._h.copy()

    def _step_half(self, x):
        """float16: computed in float32; then ``c`` and ``h`` are rounded to float16 and kept as those
        values, as the float16 state the cell returns would be."""
        self._check_blocks()
        if self.holds_blas:
            with single_threaded_blas():
                step_kernel(half.to_float32(x), self._f, self._layout)
        else:
            step_kernel(half.to_float32(x), self._f, self._layout)
        c16, h16 = half.to_float16(self._c), half.to_float16(self._h)
        self._c[...] = half.to_float32(c16)
        self._h[...] = half.to_float32(h16)
        return h16
