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

The equations are those of the TensorFlow fused ops (:ref:`spec-forward`,
:ref:`spec-backward`); backward derivatives are written from the saved forward outputs
(``d sigmoid = y (1 - y)``, ``d tanh = 1 - y**2``).

``math.exp``/``math.tanh`` rather than ``np.exp``/``np.tanh``: numba's CUDA
target has no ``np.exp`` for scalars in device code, while the ``math``
functions compile on both targets (to ``expf``/``tanhf`` for float32 on the
CPU, to libdevice on the GPU) with the type of their argument. The float32
tanh and sigmoid of the gates call neither: they are plain arithmetic (a
rational tanh; a sigmoid with its own ``exp``, whose ``2^-n`` is built from
its bits by :func:`_pow2_float32`, the one piece of LLVM IR written here),
which LLVM vectorizes where ``expf`` and ``tanhf`` are library calls.
"""

import math
from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ._jit import GATE_MATHS

__all__ = [
    "ACTIVATIONS",
    "GATE_BLOCKS",
    "SELU_ALPHA",
    "SELU_SCALE",
    "activation",
    "activation_grad",
    "backward_unit",
    "cast_like",
    "cell_backward_unit",
    "cell_forward_unit",
    "clip_value",
    "clip_value_grad",
    "fma",
    "forward_unit",
    "sigmoid",
    "tanh",
    "unit_options",
    "UnitOptions",
]

#: Gate layouts: the position (0..3) of each gate's block in the 4H columns.
#: Index order of the tuples is ``(i, ci, f, o)``.
GATE_BLOCKS = {
    "icfo": (0, 1, 2, 3),
    "ifco": (0, 2, 1, 3),
}


class UnitOptions(NamedTuple):
    """What the unit functions read of the options, in the compute type (:func:`unit_options`)."""

    forget_bias: float
    cell_clip: float
    clip_on: bool
    act: int
    use_peepholes: bool
    #: The number 1 in the compute type (no Python literal promotes float32 arithmetic).
    one: float


@njit(inline="always")
def unit_options(options, one, act):
    """The :class:`UnitOptions` of ``options`` (:class:`nblstm.options.KernelOptions`) in the type of ``one``.

    ``act`` replaces ``options.act``: a kernel passes the constant 0 in its
    tanh copy of the gate maths, so that the activation folds away there.
    """
    return UnitOptions(cast_like(options.forget_bias, one), cast_like(options.cell_clip, one), options.clip_on, act,
                       options.use_peepholes, one)


# Rational approximation of tanh for float32: tanh(x) ~ x P(x^2) / Q(x^2) on
# |x| <= _TANH_BOUND, fitted for this project (weighted least squares, then
# Lawson iterations on the maximum error). Evaluated in float32 its error is
# at most 3.4e-7 absolute and relative over the whole real line (its Horner
# steps are fused multiply-adds, fma), within
# TensorFlow's float32 tolerance (1e-6), and, unlike libm's tanhf, it is
# plain arithmetic that LLVM vectorizes. Q has no real root (Q >= 1).
# Measured over every float32, that is at most 5.3 ulp (4.2 ulp below
# |x| = 0.5, where it is biased by -0.85 ulp on average towards 0).
_TANH_BOUND = np.float32(7.90531110763549805)
_TANH_P = tuple(
    np.float32(c)
    for c in (
        0.9999999403953552,
        0.12978173792362213,
        0.0029849179554730654,
        9.874182069324888e-06,
        -1.4709983453542463e-08,
        2.3587359496146654e-11,
    )
)
_TANH_Q = tuple(np.float32(c) for c in (1.0, 0.46311476826667786, 0.02402355521917343, 0.00023709938977845013))
_HALF32 = np.float32(0.5)
_ONE32 = np.float32(1.0)

# float32 exp(-a), a >= 0, for the sigmoid: a = n ln 2 - r with n = round(a / ln 2)
# (Cody and Waite: ln 2 = _LN2_HI32 + _LN2_LO32, where _LN2_HI32 has 9
# significant bits, so that n * _LN2_HI32 - a is exact), exp(r) = 1 + r + r^2 P(r)
# on |r| <= ln(2) / 2 (P fitted for this project: relative error 3.8e-9 with
# float32 coefficients) and exp(-a) = exp(r) 2^-n, 2^-n built from its bits.
_LOG2E32 = np.float32(1.4426950408889634)
_LN2_HI32 = np.float32(0.693359375)
_LN2_LO32 = np.float32(-2.1219444170128554e-04)
_EXP_P = tuple(
    np.float32(c)
    for c in (0.4999999403953552, 0.1666652113199234, 0.04166838899254799, 0.008368716575205326, 0.001381459878757596)
)
# |x| beyond which nothing changes: exp(-128) underflows to 0 (sigmoid(x) is 0 in
# float32 from x < -103.98 and 1 from x > 17.33).
_SIGMOID_CLAMP32 = np.float32(128.0)
# Above round(128 / ln 2) + 1/2: only NaN compares above it.
_EXP_N_CLAMP32 = np.float32(186.0)


def tanh(x):
    """``tanh(x)`` in the type of ``x``: libm/libdevice for float64, a vectorizable
    rational approximation (max error 3.4e-7) for float32. NaN stays NaN."""
    return math.tanh(x)


def _tanh_float32(x):
    # Saturate exactly, as tanh does in float32 beyond the bound (so that a
    # closed gate is exactly 0 and 0 * inf stays NaN); comparisons rather than
    # min/max, so that NaN propagates through the rational function.
    if x >= _TANH_BOUND:
        return _ONE32
    if x <= -_TANH_BOUND:
        return -_ONE32
    s = x * x
    p = _TANH_P[5]
    p = fma(p, s, _TANH_P[4])
    p = fma(p, s, _TANH_P[3])
    p = fma(p, s, _TANH_P[2])
    p = fma(p, s, _TANH_P[1])
    p = fma(p, s, _TANH_P[0])
    q = _TANH_Q[3]
    q = fma(q, s, _TANH_Q[2])
    q = fma(q, s, _TANH_Q[1])
    q = fma(q, s, _TANH_Q[0])
    return x * p / q


@overload(tanh)
def _tanh_overload(x):
    if x == types.float32:
        return _tanh_float32
    return lambda x: math.tanh(x)


@intrinsic
def _pow2_float32(typingctx, k):
    """``2.0 ** k`` in float32 for an integer ``-126 <= k <= 127``: the float's bits, ``(k + 127) << 23``.

    Plain integer arithmetic and a bit cast, the same LLVM IR on every
    target, so that the loops that call it still vectorize (``ldexpf`` is a
    library call).
    """
    if not isinstance(k, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = args[0]
        if k.bitwidth > 32:
            bits = builder.trunc(bits, i32)
        elif k.bitwidth < 32:
            bits = builder.sext(bits, i32) if k.signed else builder.zext(bits, i32)
        bits = builder.shl(builder.add(bits, ir.Constant(i32, 127)), ir.Constant(i32, 23))
        return builder.bitcast(bits, ir.FloatType())

    return types.float32(k), codegen


@intrinsic
def fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (``llvm.fma``; a vector instruction where LLVM vectorizes the loop).

    The kernels are compiled without ``fastmath={"contract"}`` (:mod:`nblstm._jit`):
    where LLVM would fuse which multiply and add depends on how the calling
    kernel was optimized, and a kernel compiled afresh and the same kernel
    loaded from numba's cache gave results that differed in the last bit.
    The polynomials fuse their steps explicitly instead.
    """
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        ft = args[0].type
        name = "llvm.fma.f32" if ft == ir.FloatType() else "llvm.fma.f64"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ft, [ft, ft, ft]), name)
        return builder.call(fn, args)

    return a(a, b, c), codegen


@njit(inline="always")
def _exp_neg_float32(a, one):
    # exp(-a) for 0 <= a <= _SIGMOID_CLAMP32 (or NaN) as an unevaluated sum
    # e + e_lo: e is within 0.86 ulp of exp(-a), e + e_lo within 0.6 ulp
    # (measured). Branch-free: the comparison is a select.
    t = a * _LOG2E32 + _HALF32
    if not t <= _EXP_N_CLAMP32:
        t = _EXP_N_CLAMP32  # NaN: any n will do, r is NaN
    n = types.int32(t)  # round(a / ln 2): t > 0
    nf = cast_like(n, one)
    r_hi = nf * _LN2_HI32 - a  # exact
    r_lo = nf * _LN2_LO32
    r = r_hi + r_lo  # n ln 2 - a, |r| <= ln(2) / 2
    r_err = (r_hi - r) + r_lo  # what rounding r lost (unbiases the result)
    p = _EXP_P[4]
    p = fma(p, r, _EXP_P[3])
    p = fma(p, r, _EXP_P[2])
    p = fma(p, r, _EXP_P[1])
    p = fma(p, r, _EXP_P[0])
    tail = r * r * p + r_err
    er = one + (r + tail)  # exp(r), in [0.70, 1.42]
    er_lo = (r - (er - one)) + tail  # er - 1 and r - (er - 1) are exact
    # 2^-n in two factors, each a normal float32, so that a subnormal
    # exp(-a) (a > 87.3) is rounded once, by the second product.
    n1 = n >> 1
    s1 = _pow2_float32(-n1)
    s2 = _pow2_float32(n1 - n)
    return (er * s1) * s2, (er_lo * s1) * s2


def _sigmoid_float32(x, one):
    # sigmoid(x) = num / (1 + e), e = exp(-|x|) <= 1 (no overflow), num = 1
    # for x >= 0 and e for x < 0. The quotient y = num / d, d = 1 + e rounded,
    # then one Newton step on the unrounded quotient (num + num_lo) / (1 + e + e_lo):
    # num - y is exact (y is in [num / 2, num]) and y * e small next to num, so
    # that the residual is accurate even where y * e is rounded (no FMA) and the
    # result is within 0.70 ulp of sigmoid(x) for x >= 0 and 0.82 ulp for x < 0
    # (relative error, subnormal results included).
    zero = one - one
    a = abs(x)
    if a > _SIGMOID_CLAMP32:
        a = _SIGMOID_CLAMP32  # NaN stays NaN
    e, e_lo = _exp_neg_float32(a, one)
    pos = x >= zero
    num = one if pos else e
    num_lo = zero if pos else e_lo
    y = num / (one + e)
    res = ((num - y) - y * e) + (num_lo - y * e_lo)
    inv_d = y if pos else one - y  # 1 / d, as precise as the step needs
    return y + res * inv_d


def sigmoid(x, one):
    """Logistic function ``1 / (1 + exp(-x))`` in the type of ``x``.

    float64 uses ``exp``. float32 computes ``exp(-|x|)`` itself (range
    reduction and a polynomial, plain arithmetic that LLVM vectorizes) and
    rounds the quotient with one correction step: within 0.70 ulp for
    ``x >= 0`` (outputs near 1, the forget gate of a long memory) and 0.82 ulp
    of relative error for ``x < 0`` (outputs near 0), measured over every
    float32. Saturates to exactly 1 above 17.33 and 0 below -103.98; NaN
    stays NaN.
    """
    return one / (one + math.exp(-x))


@overload(sigmoid)
def _sigmoid_overload(x, one):
    if x == types.float32:
        return _sigmoid_float32
    return lambda x, one: one / (one + math.exp(-x))


@njit(inline="always")
def clip_value(x, bound, active):
    """``clip_by_value(x, -bound, bound)`` when ``active`` (``bound >= 0``; 0 clips to 0), else ``x``."""
    if active:
        if x > bound:
            return bound
        if x < -bound:
            return -bound
    return x


@njit(inline="always")
def clip_value_grad(x, bound, active, one):
    """Gradient of :func:`clip_value` at ``x``: 0 where ``x`` was clipped, 1 elsewhere (bounds included)."""
    if active and (x > bound or x < -bound):
        return one - one
    return one


@njit(inline="always")
def forward_unit(a_i, a_c, a_f, a_o, c_prev, peepholes, unit):
    """Forward of one hidden unit for one step.

    Parameters
    ----------
    a_i, a_c, a_f, a_o : scalar
        Pre-activations of the input gate, the cell input, the forget gate and
        the output gate: the unit's entries of ``[x, h_prev] @ w + b``.
    c_prev : scalar
        The unit's previous (clipped) cell state.
    peepholes : tuple
        The unit's peephole weights ``(wci, wcf, wco)``; read only with ``unit.use_peepholes``.
    unit : UnitOptions
        ``forget_bias`` is added to ``a_f`` inside the sigmoid; the cell
        state is clipped to ``cell_clip`` when ``clip_on``; ``act`` is not
        read (tanh).

    Returns
    -------
    tuple
        ``(i, ci, f, o, cs, co, h)``: gates after their nonlinearity, the
        clipped cell state, ``tanh(cs)`` and the output.
    """
    wci, wcf, wco = peepholes
    one = unit.one
    if unit.use_peepholes:
        a_i = a_i + wci * c_prev
        a_f = a_f + wcf * c_prev
    i = sigmoid(a_i, one)
    ci = tanh(a_c)
    f = sigmoid(a_f + unit.forget_bias, one)
    cs = clip_value(i * ci + f * c_prev, unit.cell_clip, unit.clip_on)
    co = tanh(cs)
    if unit.use_peepholes:
        a_o = a_o + wco * cs
    o = sigmoid(a_o, one)
    return i, ci, f, o, cs, co, o * co


@njit(inline="always")
def backward_unit(dh, dcs_next, i, ci, f, o, co, c_prev, peepholes, unit):
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
    peepholes : tuple
        ``(wci, wcf, wco)``; read only with ``unit.use_peepholes``.
    unit : UnitOptions
        Only ``use_peepholes`` and ``one`` are read.

    Returns
    -------
    tuple
        ``(di, dci, df, do, dc_prev)``: gradients of the four gate
        pre-activations and of the previous cell state.
    """
    wci, wcf, wco = peepholes
    one = unit.one
    do = o * (one - o) * dh * co
    dcs = (one - co * co) * dh * o + dcs_next
    if unit.use_peepholes:
        dcs = dcs + do * wco
    dci = (one - ci * ci) * dcs * i
    df = f * (one - f) * dcs * c_prev
    di = i * (one - i) * dcs * ci
    dc_prev = dcs * f
    if unit.use_peepholes:
        dc_prev = dc_prev + di * wci + df * wcf
    return di, dci, df, do, dc_prev


# ---------------------------------------------------------------------------
# TF1 LSTMCell maths (:ref:`spec-cell`): a choice of activation, clipping by
# value with its true gradient, and the unit's forward/backward with the
# state carried as the clipped cell. The fused-op functions above are left
# as they are; these are used by nblstm.cpu.cell and nblstm.cuda.cell_kernels.
# The unit functions are inlined into the kernels (numba IR inlining), so that
# they take the kernel's error model. The activations are not: inlining their
# eight branches twice into every unit function cost seconds of compilation
# and, measured, made the cell's forward slower; as functions of their own
# (error model "numpy", so no division checks) LLVM inlines them where it pays.
# ---------------------------------------------------------------------------

#: Integer codes of the activations a cell may use for ``j`` and ``act(c)``.
#: Kernels take the code as an argument, so one compiled kernel serves all.
ACTIVATIONS = {
    "tanh": 0,
    "relu": 1,
    "sigmoid": 2,
    "elu": 3,
    "softsign": 4,
    "softplus": 5,
    "selu": 6,
    "linear": 7,
    "hard_sigmoid": 8,
}

#: Codes of the gate functions (:data:`nblstm.options.GATE_FUNCTIONS`) as activation codes.
_GATE_ACTIVATION = (2, 8)

# SELU's constants (Klambauer et al., 2017), as in Keras.
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def cast_like(value, like):
    """``value`` converted to the type of the scalar ``like``.

    In jitted code this is a compile-time cast (see the overload below), so a
    float64 literal never promotes float32 arithmetic.
    """
    return type(like)(value)


@overload(cast_like)
def _cast_like_impl(value, like):
    target = like

    def impl(value, like):
        return target(value)

    return impl


@njit(**GATE_MATHS)
def activation(code, x, one):
    """The activation ``code`` (:data:`ACTIVATIONS`) of ``x``, Keras' definitions (ELU's alpha is 1).

    tanh and sigmoid are :func:`tanh` and :func:`sigmoid`: in float32 the
    vectorizable rational tanh (max error 3.4e-7) and a sigmoid within 0.82
    ulp, libm in float64.
    """
    zero = one - one
    if code == 0:
        return tanh(x)
    if code == 1:
        return x if x > zero else zero
    if code == 2:
        return sigmoid(x, one)
    if code == 3:
        return x if x > zero else math.expm1(x)
    if code == 4:
        return x / (one + abs(x))
    if code == 5:
        # log(1 + exp(x)) without overflow for large x.
        if x > zero:
            return x + math.log1p(math.exp(-x))
        return math.log1p(math.exp(x))
    if code == 6:
        scale = cast_like(SELU_SCALE, one)
        if x > zero:
            return scale * x
        return scale * cast_like(SELU_ALPHA, one) * math.expm1(x)
    if code == 8:
        # Keras 3's hard_sigmoid: relu6(x + 3) / 6.
        return min(max(x + cast_like(3.0, one), zero), cast_like(6.0, one)) / cast_like(6.0, one)
    return x


@njit(**GATE_MATHS)
def activation_grad(code, y, one):
    """Derivative of the activation ``code`` at the input whose output is ``y``.

    Every supported activation's derivative is a function of its output, so
    the kernels save outputs only. At the kinks (relu, elu, selu at 0) the
    derivative of the left side is used, as TensorFlow's gradients do.
    """
    zero = one - one
    if code == 0:
        return one - y * y
    if code == 1:
        return one if y > zero else zero
    if code == 2:
        return y * (one - y)
    if code == 3:
        return one if y > zero else y + one
    if code == 4:
        s = one - abs(y)
        return s * s
    if code == 5:
        # sigmoid(x) = 1 - exp(-softplus(x))
        return -math.expm1(-y)
    if code == 6:
        scale = cast_like(SELU_SCALE, one)
        if y > zero:
            return scale
        return y + scale * cast_like(SELU_ALPHA, one)
    if code == 8:
        # relu6(x + 3) / 6: slope 1/6 strictly inside (0, 1), 0 at and past the kinks (TensorFlow's relu6 gradient).
        return one / cast_like(6.0, one) if zero < y < one else zero
    return one


@njit(inline="always")
def cell_forward_unit(a_i, a_j, a_f, a_o, c_prev, peepholes, unit):
    """Forward of one hidden unit of TF1 ``LSTMCell`` for one step (before the projection).

    Parameters
    ----------
    a_i, a_j, a_f, a_o : scalar
        The unit's entries of ``[inputs, h_prev] @ kernel + bias`` (ICFO blocks).
    c_prev : scalar
        The unit's previous cell state.
    peepholes : tuple
        Peephole weights ``(w_i_diag, w_f_diag, w_o_diag)``; read only with ``unit.use_peepholes``.
    unit : UnitOptions
        ``act`` is the activation code (:data:`ACTIVATIONS`) for ``j`` and
        the cell output, plus 16 times the gate function's code (0:
        sigmoid, 1: hard sigmoid); the cell is clipped to ``cell_clip``
        (``>= 0``) when ``clip_on``.

    Returns
    -------
    tuple
        ``(i, j, f, o, c_raw, c, ac, r)``: gates after their nonlinearity
        (``j`` after ``act``), the cell before and after clipping, ``act(c)``
        and the unit's output before the projection ``r = o * act(c)``.
    """
    w_i, w_f, w_o = peepholes
    one = unit.one
    gate = unit.act // 16  # the kernels' code: activation + 16 * gate function (CellOptions.kernel_code)
    act = unit.act % 16
    if unit.use_peepholes:
        a_i = a_i + w_i * c_prev
        a_f = a_f + w_f * c_prev
    i = _gate(gate, a_i, one)
    j = activation(act, a_j, one)
    f = _gate(gate, a_f + unit.forget_bias, one)
    c_raw = f * c_prev + i * j
    c = clip_value(c_raw, unit.cell_clip, unit.clip_on)
    if unit.use_peepholes:
        a_o = a_o + w_o * c
    o = _gate(gate, a_o, one)
    ac = activation(act, c, one)
    return i, j, f, o, c_raw, c, ac, o * ac


@njit(inline="always")
def _gate(gate, x, one):
    """The gate function ``gate`` (0: sigmoid, 1: hard sigmoid) of ``x``."""
    if gate == 0:
        return sigmoid(x, one)
    return activation(_GATE_ACTIVATION[1], x, one)


@njit(inline="always")
def cell_backward_unit(dr, dc_next, i, j, f, o, c_raw, ac, c_prev, peepholes, unit):
    """Backward of one hidden unit of TF1 ``LSTMCell`` for one step, from the saved forward values.

    Unlike the fused ops, clipping of the cell has its true gradient: zero
    where the cell was clipped.

    Parameters
    ----------
    dr : scalar
        Gradient of the unit's output before the projection, ``r = o * act(c)``.
    dc_next : scalar
        Gradient of the step's (clipped) cell state from later steps.
    i, j, f, o, c_raw, ac : scalar
        Saved forward values (:func:`cell_forward_unit`).
    c_prev : scalar
    peepholes : tuple
    unit : UnitOptions
        As :func:`cell_forward_unit`'s (``forget_bias`` is not read).

    Returns
    -------
    tuple
        ``(di, dj, df, do, dc_prev)``: gradients of the four gate
        pre-activations and of the previous cell state.
    """
    w_i, w_f, w_o = peepholes
    one = unit.one
    gate = unit.act // 16
    act = unit.act % 16
    if gate == 0:  # sigmoid: its derivative y (1 - y), in this order of products
        do = dr * ac * o * (one - o)
    else:
        do = dr * ac * activation_grad(_GATE_ACTIVATION[1], o, one)
    dc = dc_next + dr * o * activation_grad(act, ac, one)
    if unit.use_peepholes:
        dc = dc + do * w_o
    dc = dc * clip_value_grad(c_raw, unit.cell_clip, unit.clip_on, one)
    dj = dc * i * activation_grad(act, j, one)
    if gate == 0:
        di = dc * j * i * (one - i)
        df = dc * c_prev * f * (one - f)
    else:
        di = dc * j * activation_grad(_GATE_ACTIVATION[1], i, one)
        df = dc * c_prev * activation_grad(_GATE_ACTIVATION[1], f, one)
    dc_prev = dc * f
    if unit.use_peepholes:
        dc_prev = dc_prev + di * w_i + df * w_f
    return di, dj, df, do, dc_prev
