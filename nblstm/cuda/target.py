"""The CUDA target: the entry points of the target contract (:class:`nblstm._contract.Target`) on GPU arrays.

The ops return arrays of the caller's kind (CuPy, PyTorch or Numba device
arrays); the cell returns Numba device arrays and NumPy weight gradients
(:mod:`nblstm.cuda.cell`).
"""

from .._contract import CellBackward, CellForward
from . import cell, fused

__all__ = ["CudaTarget"]


class CudaTarget:
    """The CUDA implementation of :class:`nblstm._contract.Target`."""

    name = "cuda"

    def block_lstm(self, *, x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, options, stream=None):
        return fused.block_lstm(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, options, stream)

    def block_lstm_grad(self, *, x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max,
                        options, stream=None):
        return fused.block_lstm_grad(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max,
                                     options, stream)

    def lstm_block_cell(self, *, x, cs_prev, h_prev, w, b, wci, wcf, wco, options, stream=None):
        return fused.lstm_block_cell(x, cs_prev, h_prev, w, b, wci, wcf, wco, options, stream)

    def lstm_block_cell_grad(self, *, cs_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, options, stream=None):
        return fused.lstm_block_cell_grad(cs_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, options, stream)

    def cell_forward(self, *, inputs, c0, h0, weights, cache, lengths, options, join_state, with_grad,
                     schedule=None):
        return CellForward(*cell.sequence_forward(inputs, c0, h0, weights, cache, lengths, options, join_state,
                                                  with_grad, schedule))

    def cell_backward(self, *, saved, d_outputs, d_c, d_h, join_state):
        return CellBackward(*cell.sequence_backward(saved, d_outputs, d_c, d_h, join_state))
