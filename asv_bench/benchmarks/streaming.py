"""Streaming benchmarks: one step of batch 1, as a voice-activity detector's LSTM runs (``H = 64, 128``).

``Stepper.time_step`` is the streaming API (:meth:`nblstm.LSTMCell.stepper`);
``CellCall.time_call`` the cell's own one-step call and
``BlockLSTMStep.time_step`` the fused op with ``T = 1``, both of which
validate and pack the weights at every call. ``setup`` makes a first call,
so compilation (or the load from numba's cache) is not timed.
``asv_bench/streaming_compare.py`` times the same calls next to onnxruntime.
"""

import numpy as np

import nblstm

from .common import parse

#: ``IxH`` of the streaming cases: inputs of the units' size, batch 1.
STREAM_SHAPES = ["64x64", "128x128"]


def _cell(shape):
    inputs_, units = parse(shape)
    cell = nblstm.LSTMCell(units, seed=0, dtype=np.float32)
    cell.build(inputs_)
    x = np.random.default_rng(0).standard_normal((1, inputs_)).astype(np.float32)
    return cell, x


class Stepper:
    """``h = step(x_t)`` of ``step = cell.stepper()``, float32, batch 1."""

    params = (STREAM_SHAPES,)
    param_names = ["shape"]

    def setup(self, shape):
        cell, self.x = _cell(shape)
        self.step = cell.stepper()
        self.step(self.x)

    def time_step(self, shape):
        self.step(self.x)


class CellCall:
    """``output, state = cell(x_t, state)``, float32, batch 1."""

    params = (STREAM_SHAPES,)
    param_names = ["shape"]

    def setup(self, shape):
        self.cell, self.x = _cell(shape)
        self.state = self.cell.zero_state(1, np.float32)
        self.cell(self.x, self.state)

    def time_call(self, shape):
        self.cell(self.x, self.state)


class BlockLSTMStep:
    """``nblstm.block_lstm`` with ``T = 1`` (the cell's weights, ICFO), float32, batch 1."""

    params = (STREAM_SHAPES,)
    param_names = ["shape"]

    def setup(self, shape):
        cell, x = _cell(shape)
        self.x = x[None]
        self.c, self.h = cell.zero_state(1, np.float32)
        self.kwargs = cell.to_block_lstm()
        nblstm.block_lstm(self.x, self.c, self.h, **self.kwargs)

    def time_step(self, shape):
        nblstm.block_lstm(self.x, self.c, self.h, **self.kwargs)
