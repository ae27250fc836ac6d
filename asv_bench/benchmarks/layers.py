"""Benchmarks of the layer: a 2-layer bidirectional ``nblstm.LSTM`` with per-example lengths, float32.

``LSTMLayer.time_forward`` is ``lstm(x, sequence_length=L)``,
``time_forward_backward`` is ``lstm.vjp(x, sequence_length=L)`` and the
``backward`` of an output gradient; ``time_forward_full`` and
``time_forward_backward_full`` the same calls without lengths (every example
runs all ``T`` steps: the finished examples' savings are the ratio). The lengths are uniform in ``[T / 2, T]``
(fixed seed), so the reverse direction runs each example reversed within its
own length. ``setup`` makes both calls once, so compilation (or the load from
numba's cache) is not timed. ``asv_bench/layer_compare.py`` times the same
calls next to ``torch.nn.LSTM`` on a packed sequence.
"""

import numpy as np

import nblstm

from .common import parse

#: ``TxBxIxH`` of the layer cases: a small one and the smallest shape of the PyTorch comparison.
LAYER_SHAPES = ["20x4x32x64", "50x32x128x128"]


class LSTMLayer:
    """``nblstm.LSTM(I, H, num_layers=2, bidirectional=True)`` called with ``sequence_length``."""

    params = (LAYER_SHAPES,)
    param_names = ["shape"]

    def setup(self, shape):
        steps, batch, inputs_, units = parse(shape)
        rng = np.random.default_rng(0)
        self.lstm = nblstm.LSTM(inputs_, units, num_layers=2, bidirectional=True, seed=0)
        self.x = rng.standard_normal((steps, batch, inputs_)).astype(np.float32)
        self.lengths = rng.integers(steps // 2, steps + 1, batch)
        self.d_output = (rng.standard_normal((steps, batch, 2 * units)) * 0.1).astype(np.float32)
        self.time_forward(shape)
        self.time_forward_backward(shape)
        self.time_forward_full(shape)
        self.time_forward_backward_full(shape)

    def time_forward(self, shape):
        self.lstm(self.x, sequence_length=self.lengths)

    def time_forward_backward(self, shape):
        backward = self.lstm.vjp(self.x, sequence_length=self.lengths)[1]
        backward(self.d_output)

    def time_forward_full(self, shape):
        self.lstm(self.x)

    def time_forward_backward_full(self, shape):
        backward = self.lstm.vjp(self.x)[1]
        backward(self.d_output)

    def peakmem_forward_backward(self, shape):
        backward = self.lstm.vjp(self.x, sequence_length=self.lengths)[1]
        backward(self.d_output)
