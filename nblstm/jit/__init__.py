"""LSTM steps and sequences to call from your own ``@njit`` code (and, in :mod:`nblstm.jit.cuda`, ``@cuda.jit`` code).

Call the functions from Python, or from a function of your own compiled
with numba (``@njit``): numba compiles the call into your function, with
machine code it loads from its cache after the first run. They compute the
maths of the fused ops (:mod:`nblstm.ops`), with the same options, into
output arrays the caller gives (``docs/jit.rst``):

========================================  ==========================================================
function                                  as
========================================  ==========================================================
:func:`lstm_step`                         :func:`nblstm.lstm_block_cell`: ``cs`` and ``h``
:func:`lstm_step_train`                   :func:`nblstm.lstm_block_cell`: all seven outputs
:func:`lstm_step_grad`                    :func:`nblstm.lstm_block_cell_grad`
:func:`lstm_step_input_grads`             ``dicfo @ w.T``: the gradients of ``x`` and ``h_prev``
:func:`lstm_step_weight_grads`            adds ``[x, h_prev].T @ dicfo`` to ``w_grad``
:func:`lstm_forward`                      :func:`nblstm.block_lstm`
:func:`lstm_backward`                     :func:`nblstm.block_lstm_grad`
========================================  ==========================================================

Options are run-time arguments, in this order: ``forget_bias`` (float),
``cell_clip`` (float, ``<= 0`` for none), ``use_peephole`` (bool) and
``layout``, an integer code (:data:`IFCO`, :data:`ICFO`,
:func:`layout_code`). Arguments named ``out_...`` are written; the gradient
arguments of the step functions without the prefix are added to.

:mod:`nblstm.jit.cuda` (imported on first use, so that this module needs no
CUDA toolkit) has device functions for ``@cuda.jit`` kernels.
"""

import importlib

from .cpu import (
    ICFO,
    IFCO,
    layout_code,
    lstm_backward,
    lstm_forward,
    lstm_step,
    lstm_step_grad,
    lstm_step_input_grads,
    lstm_step_train,
    lstm_step_weight_grads,
)

__all__ = [
    "ICFO",
    "IFCO",
    "layout_code",
    "lstm_backward",
    "lstm_forward",
    "lstm_step",
    "lstm_step_grad",
    "lstm_step_input_grads",
    "lstm_step_train",
    "lstm_step_weight_grads",
]


def __getattr__(name):
    # nblstm.jit.cuda imports numba.cuda: only when it is asked for.
    if name == "cuda":
        return importlib.import_module(".cuda", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
