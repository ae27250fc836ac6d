"""Shared inputs of the benchmarks."""

import numpy as np

#: Whole-sequence shapes ``TxBxIxH``: a batch-1 inference case and a training-sized one.
SEQ_SHAPES = ["20x1x32x64", "50x32x256x256"]
#: Single-step shapes ``BxIxH``.
CELL_SHAPES = ["1x64x128", "32x256x256"]
DTYPES = ["float16", "float32", "float64"]


def parse(shape):
    """``"50x32x256x256"`` -> ``(50, 32, 256, 256)``."""
    return tuple(int(n) for n in shape.split("x"))


def inputs(batch, inputs_, units, dtype, steps=None, seed=0):
    """Random arguments of the fused ops.

    Returns
    -------
    dict
        ``x`` (``[T, B, I]``, or ``[B, I]`` when ``steps`` is None),
        ``cs_prev, h_prev [B, H]``, ``w [I + H, 4H]``, ``b [4H]``,
        ``wci, wcf, wco [H]``, all of ``dtype``.
    """
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(units)
    x_shape = (batch, inputs_) if steps is None else (steps, batch, inputs_)
    arrays = {
        "x": rng.standard_normal(x_shape),
        "cs_prev": rng.standard_normal((batch, units)) * 0.5,
        "h_prev": rng.standard_normal((batch, units)) * 0.5,
        "w": rng.uniform(-scale, scale, (inputs_ + units, 4 * units)),
        "b": rng.uniform(-scale, scale, 4 * units),
        "wci": rng.uniform(-scale, scale, units),
        "wcf": rng.uniform(-scale, scale, units),
        "wco": rng.uniform(-scale, scale, units),
    }
    return {k: a.astype(dtype) for k, a in arrays.items()}
