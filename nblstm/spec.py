"""The gate maths of one LSTM unit, written once for every target.

Every function here is a lazy ``@njit`` function: nothing compiles at import.
The CPU kernels (:mod:`nblstm.cpu`) call them from ``@njit(parallel=True)``
code, and the CUDA kernels (:mod:`nblstm.cuda`) call the very same functions
from ``@cuda.jit`` code (numba compiles an ``@njit`` function called from a
CUDA kernel as a device function). No kernel re-derives the equations.

All functions work on scalars of the compute type (float32 or float64).
Constants are never written as Python literals, which numba types as
float64 and would promote float32 arithmetic: each function takes ``one``,
the number 1 of the compute type, and derives what it needs from it.

The equations are those of the TensorFlow fused ops (``SPEC.md`` sections 3
and 5); backward derivatives are written from the saved forward outputs
(``d sigmoid = y (1 - y)``, ``d tanh = 1 - y**2``).

``math.exp``/``math.tanh`` rather than ``np.exp``/``np.tanh``: numba's CUDA
target has no ``np.exp`` for scalars in device code, while the ``math``
functions compile on both targets (to ``expf``/``tanhf`` for float32 on the
CPU, to libdevice on the GPU) with the type of their argument.
"""

import math

from numba import njit

#: Gate layouts: the position (0..3) of each gate's block in the 4H columns.
#: Index order of the tuples is ``(i, ci, f, o)``.
GATE_BLOCKS = {
    "icfo": (0, 1, 2, 3),
    "ifco": (0, 2, 1, 3),
}


@njit(cache=True)
def sigmoid(x, one):
    """Logistic function ``1 / (1 + exp(-x))`` in the type of ``x``."""
    return one / (one + math.exp(-x))


@njit(cache=True)
def clip_cell(cs, cell_clip):
    """Clip ``cs`` to ``[-cell_clip, cell_clip]``; no clipping when ``cell_clip <= 0``."""
    if cell_clip > 0:
        if cs > cell_clip:
            return cell_clip
        if cs < -cell_clip:
            return -cell_clip
    return cs


@njit(cache=True)
def forward_unit(a_i, a_c, a_f, a_o, c_prev, wci, wcf, wco, forget_bias, cell_clip, use_peephole, one):
    """Forward of one hidden unit for one step.

    Parameters
    ----------
    a_i, a_c, a_f, a_o : scalar
        Pre-activations of the input gate, the cell input, the forget gate and
        the output gate: the unit's entries of ``[x, h_prev] @ w + b``.
    c_prev : scalar
        The unit's previous (clipped) cell state.
    wci, wcf, wco : scalar
        The unit's peephole weights; read only when ``use_peephole``.
    forget_bias : scalar
        Added to ``a_f`` inside the sigmoid.
    cell_clip : scalar
        Clip bound of the cell state; ``<= 0`` turns clipping off.
    use_peephole : bool
    one : scalar
        The number 1 in the compute type.

    Returns
    -------
    tuple
        ``(i, ci, f, o, cs, co, h)``: gates after their nonlinearity, the
        clipped cell state, ``tanh(cs)`` and the output.
    """
    if use_peephole:
        a_i = a_i + wci * c_prev
        a_f = a_f + wcf * c_prev
    i = sigmoid(a_i, one)
    ci = math.tanh(a_c)
    f = sigmoid(a_f + forget_bias, one)
    cs = clip_cell(i * ci + f * c_prev, cell_clip)
    co = math.tanh(cs)
    if use_peephole:
        a_o = a_o + wco * cs
    o = sigmoid(a_o, one)
    return i, ci, f, o, cs, co, o * co


@njit(cache=True)
def backward_unit(dh, dcs_next, i, ci, f, o, co, c_prev, wci, wcf, wco, use_peephole, one):
    """Backward of one hidden unit for one step, from the saved forward outputs.

    Clipping of the cell state is treated as the identity (straight-through),
    as TensorFlow's fused gradient kernels do.

    Parameters
    ----------
    dh : scalar
        Total gradient of the step's output ``h`` (external plus the carry
        from the next step).
    dcs_next : scalar
        Total gradient of the step's cell state ``cs`` (external plus carry).
    i, ci, f, o, co : scalar
        The step's saved forward outputs.
    c_prev : scalar
        The previous cell state the step read.
    wci, wcf, wco : scalar
        Peephole weights; read only when ``use_peephole``.
    use_peephole : bool
    one : scalar
        The number 1 in the compute type.

    Returns
    -------
    tuple
        ``(di, dci, df, do, dc_prev)``: gradients of the four gate
        pre-activations and of the previous cell state.
    """
    do = o * (one - o) * dh * co
    dcs = (one - co * co) * dh * o + dcs_next
    if use_peephole:
        dcs = dcs + do * wco
    dci = (one - ci * ci) * dcs * i
    df = f * (one - f) * dcs * c_prev
    di = i * (one - i) * dcs * ci
    dc_prev = dcs * f
    if use_peephole:
        dc_prev = dc_prev + di * wci + df * wcf
    return di, dci, df, do, dc_prev
