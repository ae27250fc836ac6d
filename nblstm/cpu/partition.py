"""How the CPU kernels split their work: chunks of hidden units, row and column blocks.

Every threshold that decides whether work is split across the kernels' worker threads
is here, with the measurement behind it. The bounds are int64 arrays that
the kernels take as arguments: splitting is a run-time decision, never a
compile-time one. Bounds are named as such (``u0, u1`` the first and
one-past-last unit of a chunk, ``r0, r1`` rows, ``n0, n1`` columns);
offsets (``col0``) are positions in packed arrays.

The micro-kernel's results do not depend on how the columns are split
(:mod:`nblstm.cpu.microkernel`), and the row blocks of the forward's input
projection do not depend on the thread count: the kernels give the same
bits on any number of threads.
"""

import functools

import numba
import numpy as np

from ..spec import GATE_BLOCKS
from . import microkernel

__all__ = [
    "MAX_DIRECTIONS_AT_ONCE_WORK",
    "MIN_PARALLEL_CELL_STEP_WORK",
    "MIN_PARALLEL_PACK",
    "MIN_PARALLEL_STEP_WORK",
    "MIN_PARALLEL_CALL_WORK",
    "block_bounds",
    "call_threads",
    "cell_chunk_bounds",
    "chunk_bounds",
    "column_offsets",
    "directions_at_once",
    "fused_projection",
    "gate_blocks",
    "row_blocks",
    "row_bounds",
    "split",
]

#: Below this many multiply-adds in a step's recurrent GEMM, one thread does
#: the fused ops' steps: the threads' meeting at every step costs about a microsecond.
MIN_PARALLEL_STEP_WORK = 32768
#: The same threshold for the cell's steps (:func:`cell_chunk_bounds`), set
#: higher: the meeting costs far more when the cores are shared (measured with
#: a region per step: T=16, B=64, H=24 on 2 busy cores, 1.5 ms forward on one
#: thread, 6-15 ms split in two chunks).
MIN_PARALLEL_CELL_STEP_WORK = 1 << 18
# Fewer hidden units than this per chunk make thin, inefficient GEMMs.
_MIN_UNITS_PER_CHUNK = 8
# Largest panel of packed input weights for which a step computes its own
# input projection at any batch size (fused_projection).
_FUSED_PANEL_BYTES = 32 * 1024
# Inputs of up to _FUSED_MAX_INPUT_BYTES a row: from _FUSED_MIN_ROWS examples a
# step computes its own input projection when the packed weights (input and
# recurrent) are at most _FUSED_MAX_WEIGHT_BYTES, from _FUSED_MIN_BATCH
# examples whatever their size (fused_projection).
_FUSED_MAX_INPUT_BYTES = 2048
_FUSED_MIN_ROWS = 8
_FUSED_MAX_WEIGHT_BYTES = 4 << 20
_FUSED_MIN_BATCH = 32
#: Below this many multiply-adds in a whole kernel call, one thread runs it,
#: whatever its chunks: a helper thread joins a call 20-60 us after it
#: starts (:mod:`nblstm.cpu.threads`), about the time of this much work on
#: one core, and every step's meeting waits a time slice whenever the other
#: core is busy (a batch-1 step at H = 128: 30 ms 99th percentile against a
#: 66 us median on two threads). Chunked kernels then run every chunk on
#: the calling thread (the same bits).
MIN_PARALLEL_CALL_WORK = 1 << 22
#: Weights with fewer elements than this are packed (and float16 arrays
#: converted) on one thread: a copy of this size takes about as long as
#: starting a helper thread.
MIN_PARALLEL_PACK = 1 << 20
#: Matrices with fewer elements than this in all are transposed on one
#: thread (:func:`nblstm.cpu.pack.transpose_gates`); from it, a thread each.
#: Measured here on the two matrices of ``nblstm.torch.LSTM``'s weights
#: (``[4H, H]`` each, float32), on PyTorch's threads after a PyTorch
#: operation: one thread 0.078 ms and two 0.164 ms at ``H = 128``, 0.43 and
#: 0.38 ms at ``H = 256``, 1.26 and 0.82 ms at ``H = 512``.
MIN_PARALLEL_TRANSPOSE = 1 << 18
#: Below this many multiply-adds in a step's GEMMs (``B * 4H * (I + H)``), the two directions of a
#: bidirectional layer run at once, a thread each (:func:`directions_at_once`).
MAX_DIRECTIONS_AT_ONCE_WORK = 1 << 24
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


@functools.lru_cache(maxsize=256)
def split(count, parts):
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
        if work < MIN_PARALLEL_STEP_WORK:
            num_chunks = 1
        else:
            num_chunks = min(numba.get_num_threads(), max(1, num_units // _MIN_UNITS_PER_CHUNK))
    return split(num_units, num_chunks)


def call_threads(work, wanted=None):
    """Threads for a kernel call of ``work`` multiply-adds: 1 below :data:`MIN_PARALLEL_CALL_WORK`, else
    ``wanted`` (default :func:`numba.get_num_threads`)."""
    if work < MIN_PARALLEL_CALL_WORK:
        return 1
    return numba.get_num_threads() if wanted is None else wanted


def block_bounds(count, num_blocks):
    """``[num_blocks + 1]`` int64: ``range(count)`` split evenly, with empty blocks when ``count < num_blocks``."""
    bounds = split(count, num_blocks)
    if bounds.shape[0] == num_blocks + 1:
        return bounds
    return np.concatenate([bounds, np.full(num_blocks + 1 - bounds.shape[0], bounds[-1], np.int64)])


def row_bounds(rows, work_per_row):
    """Split ``rows`` of a large GEMM across threads (one block when the work is small)."""
    if rows * work_per_row < _MIN_PARALLEL_GEMM_WORK:
        return split(rows, 1)
    return split(rows, numba.get_num_threads())


def row_blocks(rows, work_per_row):
    """Split ``rows`` of the input projection into blocks that do not depend on the thread count.

    Returns
    -------
    tuple
        ``(bounds: [R + 1] int64, parallel: bool)``: whether the ``4 * R``
        GEMMs (gates by blocks) are worth running on several threads.
    """
    if rows * work_per_row < _MIN_PARALLEL_GEMM_WORK:
        return split(rows, 1), False
    return split(rows, min(_MAX_ROW_BLOCKS, max(1, rows // _ROW_BLOCK))), True


@functools.cache
def gate_blocks(layout):
    """``[4]`` int64: the block (0..3) of the gates ``i, ci, f, o`` in ``layout`` (shared: not to be modified)."""
    return np.array(GATE_BLOCKS[layout], np.int64)


def column_offsets(bounds, per_unit, dtype):
    """``[K + 1]`` int64: where each chunk's columns start in the packed weights and workspaces.

    Chunk ``k`` has ``per_unit * uk`` columns (``uk`` its units) (4 gates in
    forward, 1 unit in backward), padded to a multiple of the micro-kernel's panel width
    (:mod:`nblstm.cpu.microkernel`). Cached, as :func:`split`: the array is
    shared between calls and must not be modified.
    """
    return _column_offsets(np.asarray(bounds, np.int64).tobytes(), per_unit, np.dtype(dtype))


@functools.lru_cache(maxsize=256)
def _column_offsets(bounds_bytes, per_unit, dtype):
    bounds = np.frombuffer(bounds_bytes, np.int64).tolist()
    offsets = [0]
    for u0, u1 in zip(bounds[:-1], bounds[1:]):
        offsets.append(offsets[-1] + microkernel.padded(per_unit * (u1 - u0), dtype))
    return np.array(offsets, np.int64)


def directions_at_once(batch_size, inputs, units):
    """Whether a bidirectional layer runs its two directions' calls at once (forward, backward), a thread each
    (:func:`nblstm.cpu.threads.run_each`), rather than one after the other on every thread.

    With two threads, where a step's GEMMs (``B x (I + H) x 4H``)
    are small: the chunks of a step are then thin, and the threads' meeting
    at every step a larger share of it. A 2-layer bidirectional
    ``nblstm.LSTM``, two threads, both directions at once against one after
    the other: at ``(50, 32, 128, 128)`` inference 0.84x the time, forward and
    backward 0.68x; at ``(100, 16, 256, 256)`` 1.00x and 0.89x; at
    ``(100, 1, 256, 256)`` 0.93x and 0.89x; from ``2^24`` multiply-adds a step
    (``B = 32, 64`` at ``H = 256``) 0.99-1.01x, no gain.
    """
    # Two threads exactly, as measured: with more, each direction would still run on one of them alone.
    return numba.get_num_threads() == 2 and batch_size * 4 * units * (inputs + units) < MAX_DIRECTIONS_AT_ONCE_WORK


def fused_projection(batch_size, inputs, units, dtype):
    """Whether :func:`~nblstm.cpu.fused.forward_kernel` computes each step's input projection inside the step.

    Rather than as BLAS GEMMs before the loop, which write ``[T, B, 4H]`` to
    memory for the steps to read back. With ``B > 1``:

    - when a panel of the packed input weights (``I x P``) fits in 32 KiB
      of L1: ``I <= 256`` in float32 and float64. 0.97x the time at ``(50,
      32, 256, 256)`` and 0.98x at ``(100, 64, 125, 320)``;
    - with ``B >= 8`` and up to 2 KiB of input a row, when the packed
      weights ``[I + H, 4H]`` are at most 4 MiB (the L2 of two cores
      here): every panel then stays in L2 from
      one step to the next. ``nblstm.LSTM``'s forward, its weights packed
      once (2 threads, float32, an Intel Xeon with AVX-512): 0.83-0.87x the
      time at ``(50, 8 .. 16, 512, 128 .. 256)``, ``(100, 16, 512, 256)``
      and ``(50, 16, 300, 200 .. 300)`` (float64 0.86x at ``(50, 16, 512,
      128)``, 4 KiB a row: left on BLAS with the rule below). Larger weights at such batches stay on BLAS: 0.99-1.11x at
      ``(50, 16 .. 24, 512, 512)`` and ``(50, 16, 768, 384)``; and so do
      smaller batches, whose rows fill less than a tile of the micro-kernel:
      1.12-1.33x at ``(50, 2 .. 4, 512, 256)``;
    - with ``B >= 32``, for inputs of up to 2 KiB a row (``I <= 512`` in
      float32), whatever the weights: each panel serves at least four tiles
      of rows. 0.87-0.91x at ``(50, 32 .. 128, 512, 256)``, 0.93x at ``(50,
      128, 512, 512)``, 0.95-0.99x at ``(50, 32 .. 64, 512, 512)``. The
      fused ops, which pack their weights at every call: 0.93-0.95x at
      ``(50, 64 .. 128, 512, 256 .. 512)``, 0.96-1.04x at ``(50, 32, 512,
      512)``; with one core busy with other work 1.02-1.04x there.
      Longer inputs stay on BLAS: at ``(25, 64, 1024, 1024)`` the layer ran
      0.88-0.90x inside the steps on a quiet machine, but the fused ops'
      forward with one core busy 1.15-1.28x (each step waits for the busy
      core's share of ``x_t @ w_x``; the GEMMs before the loop do not), and
      float64 1.12x at ``(25, 32, 1024, 1024)`` quiet.
    """
    if batch_size <= 1:
        return False
    itemsize = np.dtype(dtype).itemsize
    if inputs * microkernel.panel_width(dtype) * itemsize <= _FUSED_PANEL_BYTES:
        return True
    if inputs * itemsize > _FUSED_MAX_INPUT_BYTES:  # longer inputs were not measured inside the steps
        return False
    if batch_size >= _FUSED_MIN_ROWS and (inputs + units) * 4 * units * itemsize <= _FUSED_MAX_WEIGHT_BYTES:
        return True
    return batch_size >= _FUSED_MIN_BATCH


def cell_chunk_bounds(batch_size, width, num_chunks=None):
    """:func:`chunk_bounds` for the cell's steps: ``width`` hidden units (or projected columns).

    With the cell's own threshold for splitting a step at all
    (:data:`MIN_PARALLEL_CELL_STEP_WORK`).
    """
    if num_chunks is None and batch_size * width * 4 * width < MIN_PARALLEL_CELL_STEP_WORK:
        num_chunks = 1
    return chunk_bounds(batch_size, width, num_chunks)
