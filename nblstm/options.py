"""The options of a call as small frozen records, validated once at the public boundary.

The public functions take their options as keyword arguments with
TensorFlow's names and conventions; :mod:`nblstm.ops` and the cell validate
them and pass one record to the target. The kernels of both targets take
the options of a call as one record of scalars, :class:`KernelOptions`,
built here only (``OpOptions.kernel_options``, ``CellOptions.kernel_options``).
Records are named tuples: they are immutable, and cheap to build on every call.

One clip convention everywhere below the public boundary: a bound is
``None`` (no clipping) or a float ``>= 0`` (clip to ``[-bound, bound]``;
``0`` clips to zero). The fused ops' own convention, "``cell_clip <= 0``
turns clipping off" (TensorFlow's), is converted to it at the boundary by
:func:`op_cell_clip`. Kernels take the pair ``(bound, on)``.
"""

import functools
from typing import NamedTuple

__all__ = ["ACTIVATION_NAMES", "GATE_FUNCTIONS", "PRECISIONS", "CellOptions", "KernelOptions", "OpOptions",
           "clip_scalars", "op_cell_clip"]

#: Activation names of ``j`` and the cell output (Keras names), in the order of their codes in
#: ``nblstm.spec.ACTIVATIONS`` (not imported here: it imports numba; a test checks that the two agree).
ACTIVATION_NAMES = ("tanh", "relu", "sigmoid", "elu", "softsign", "softplus", "selu", "linear", "hard_sigmoid")

#: The gate functions of the cell (Keras's ``recurrent_activation``), by their codes.
GATE_FUNCTIONS = ("sigmoid", "hard_sigmoid")

#: The values of ``precision``: the arithmetic of the large matrix products on the GPU
#: (:mod:`nblstm.cuda.blas`). ``"exact"`` everywhere; the others on GPUs with cuBLAS, for float32 computation.
PRECISIONS = ("exact", "tf32", "fp16")


class KernelOptions(NamedTuple):
    """The options of one call as the kernels of both targets take them: one record of scalars.

    Python ``float``, ``bool`` and ``int`` (numba types them as float64,
    bool and int64), so that one compiled kernel serves every value. A
    kernel turns it into the unit functions' options in its compute type
    (:func:`nblstm.spec.unit_options`). A bound applies only where its flag
    is set.

    Attributes
    ----------
    forget_bias : float
    cell_clip : float
        Bound of the cell state, ``>= 0``.
    clip_on : bool
    proj_clip : float
        Bound of the projection's output (the cell with a projection only).
    proj_clip_on : bool
    act : int
        ``CellOptions.kernel_code``; 0 (tanh and sigmoid) for the fused ops.
    use_peepholes : bool
    has_proj : bool
        The cell has a projection.
    """

    forget_bias: float
    cell_clip: float
    clip_on: bool
    proj_clip: float
    proj_clip_on: bool
    act: int
    use_peepholes: bool
    has_proj: bool


class OpOptions(NamedTuple):
    """Options of the fused ops (BlockLSTM, LSTMBlockCell and their gradients).

    Attributes
    ----------
    forget_bias : float
        Added to the forget gate's pre-activation.
    cell_clip : float or None
        Clip bound of the cell state, ``> 0``; ``None`` for none.
    use_peephole : bool
    layout : {"ifco", "icfo"}
        Gate order of the ``4H`` columns of ``w`` and ``b``.
    precision : str
        One of :data:`PRECISIONS`.
    """

    forget_bias: float = 0.0
    cell_clip: float | None = None
    use_peephole: bool = False
    layout: str = "ifco"
    precision: str = "exact"

    def kernel_options(self, scalar):
        """The kernels' record (:class:`KernelOptions`) for the compute type ``scalar`` (``numpy.float32`` ...).

        Whether the clip is on is decided in that type (:func:`clip_scalars`'s ``positive`` rule).
        """
        return _op_kernel_options(self, scalar)


class CellOptions(NamedTuple):
    """Options of TF1 ``LSTMCell``'s maths, as the cell's kernels need them.

    Attributes
    ----------
    forget_bias : float
    cell_clip : float or None
        Clip bound of the cell state, ``>= 0`` (``0`` clips to zero); ``None`` for none.
    proj_clip : float or None
        Clip bound of the projected output (``None`` without a projection).
    activation : int
        Activation code (:data:`nblstm.spec.ACTIVATIONS`).
    gate : int
        Gate function code: the index in :data:`GATE_FUNCTIONS`.
    precision : str
        One of :data:`PRECISIONS`.
    """

    forget_bias: float = 1.0
    cell_clip: float | None = None
    proj_clip: float | None = None
    activation: int = 0
    gate: int = 0
    precision: str = "exact"

    def kernel_options(self, has_proj, use_peepholes):
        """The kernels' record (:class:`KernelOptions`); ``proj_clip`` applies only with a projection."""
        return _cell_kernel_options(self, bool(has_proj), bool(use_peepholes))

    def kernel_code(self):
        """The one integer the kernels take: the activation code plus 16 times the gate code
        (:func:`nblstm.spec.cell_forward_unit`), so that a gate function adds no kernel argument."""
        return int(self.activation) + 16 * int(self.gate)


def op_cell_clip(cell_clip):
    """The fused ops' ``cell_clip`` (``None`` or ``<= 0``: none) in the one clip convention."""
    return None if cell_clip is None or cell_clip <= 0 else float(cell_clip)


def clip_scalars(bound, scalar=float, positive=False):
    """The kernel arguments ``(bound, on)`` of a clip bound.

    Parameters
    ----------
    bound : float or None
    scalar : callable, default float
        Converts the bound to the kernels' scalar type (``numpy.float32`` ...).
    positive : bool, default False
        The fused ops' rule: clipping is on only if the bound, in the
        kernels' type, is ``> 0`` (a bound that rounds to 0 in float32 turns
        clipping off, as TensorFlow's float attribute does).
    """
    if bound is None:
        return scalar(0.0), False
    value = scalar(bound)
    return value, bool(value > 0) if positive else True


# The kernels' records of the options met so far: a call builds none (a record took 0.8 us to build).
@functools.lru_cache(maxsize=256)
def _op_kernel_options(options, scalar):
    clip, clip_on = clip_scalars(options.cell_clip, scalar, positive=True)
    return KernelOptions(float(options.forget_bias), float(clip), clip_on, 0.0, False, 0, bool(options.use_peephole),
                         False)


@functools.lru_cache(maxsize=256)
def _cell_kernel_options(options, has_proj, use_peepholes):
    return KernelOptions(float(options.forget_bias), *clip_scalars(options.cell_clip),
                         *clip_scalars(options.proj_clip if has_proj else None), options.kernel_code(), use_peepholes,
                         has_proj)
