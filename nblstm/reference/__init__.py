"""Plain float64 NumPy references, written for clarity, sharing no code with the kernels.

:func:`block_lstm` and :func:`block_lstm_grad` are the fused ops'
(:mod:`~nblstm.reference.ops`); :mod:`~nblstm.reference.cell` has TF1
``LSTMCell`` and ``dynamic_rnn`` one step at a time. The tests compare every
kernel against them.
"""

from . import cell
from .ops import block_lstm, block_lstm_grad

__all__ = ["block_lstm", "block_lstm_grad", "cell"]
