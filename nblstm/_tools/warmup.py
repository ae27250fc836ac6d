"""Compile (or load from numba's cache) the CPU kernels ahead of their first use."""

import time

import numpy as np

from .. import ops

__all__ = ["warmup"]


def warmup(dtypes=("float32", "float64")):
    """Compile the CPU kernels of every op for ``dtypes`` now, instead of at first use.

    Numba compiles a kernel the first time it sees a new argument type, which
    takes seconds; later calls (and later processes, through numba's on-disk
    cache) reuse the machine code. Calling ``warmup()`` at start-up moves that
    cost out of the first real call. float16 uses the float32 kernels.

    Parameters
    ----------
    dtypes : sequence of str or numpy dtype, default ("float32", "float64")

    Returns
    -------
    float
        Seconds spent.

    Examples
    --------
    >>> import nblstm
    >>> seconds = nblstm.warmup(["float64"])
    """
    start = time.perf_counter()
    for dtype in dtypes:
        dtype = np.dtype(dtype)
        # Large enough for the multi-threaded paths, small enough to run at once.
        steps, batch, inputs, units = 2, 8, 2, 32
        x = np.zeros((steps, batch, inputs), dtype)
        state = np.zeros((batch, units), dtype)
        w = np.zeros((inputs + units, 4 * units), dtype)
        b = np.zeros(4 * units, dtype)
        out = ops.block_lstm(x, state, state, w, b)
        ops.block_lstm_grad(x, state, state, w, out, out.cs, out.h)
        step = ops.lstm_block_cell(x[0], state, state, w, b)
        ops.lstm_block_cell_grad(x[0], state, state, w, step, step.cs, step.h)
    return time.perf_counter() - start
