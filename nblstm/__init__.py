"""nblstm: TensorFlow's fused LSTM kernels, exact, compiled with Numba for CPUs and NVIDIA GPUs.

The functional API (:func:`block_lstm`, :func:`block_lstm_grad`,
:func:`lstm_block_cell`, :func:`lstm_block_cell_grad`) runs NumPy arrays on
the CPU and GPU arrays on the GPU; :mod:`nblstm.raw_ops` has the same ops
with TensorFlow's exact signatures; :class:`LSTMCell` is TensorFlow's TF1
cell API over fused sequence kernels (:meth:`LSTMCell.stepper` runs it one
step at a time, for streaming), and :mod:`nblstm.convert` moves weights
between frameworks. Importing nblstm compiles nothing and
needs no CUDA driver.
"""

from . import convert, raw_ops
from .cell import LSTMCell, LSTMStateTuple
from .cell.stepper import Stepper
from .layer.lstm import LSTM
from .layer.rnn import MultiRNNCell, bidirectional_dynamic_rnn, dynamic_rnn
from .ops import (
    BlockLSTMGradOutput,
    BlockLSTMOutput,
    LSTMBlockCellGradOutput,
    LSTMBlockCellOutput,
    block_lstm,
    block_lstm_grad,
    lstm_block_cell,
    lstm_block_cell_grad,
)
from .precompile import warmup

__version__ = "0.1.0"

__all__ = [
    "BlockLSTMGradOutput",
    "BlockLSTMOutput",
    "LSTM",
    "LSTMBlockCellGradOutput",
    "LSTMBlockCellOutput",
    "LSTMCell",
    "LSTMStateTuple",
    "MultiRNNCell",
    "Stepper",
    "bidirectional_dynamic_rnn",
    "block_lstm",
    "convert",
    "dynamic_rnn",
    "block_lstm_grad",
    "lstm_block_cell",
    "lstm_block_cell_grad",
    "raw_ops",
    "warmup",
    "__version__",
]
