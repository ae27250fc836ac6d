"""Forward, backward and one-step benchmarks of nblstm's functional API on the CPU.

``setup`` builds the inputs and makes one call, so the JIT compilation (or
the load from numba's cache) is not timed; the ``timeraw_`` benchmarks of
``bench_startup`` time it.
"""

import numpy as np

import nblstm

from .common import CELL_SHAPES, DTYPES, SEQ_SHAPES, inputs, parse


class BlockLSTM:
    """Whole-sequence forward (``nblstm.block_lstm``, IFCO, no peepholes, no clip)."""

    params = (SEQ_SHAPES, DTYPES)
    param_names = ["shape", "dtype"]

    def setup(self, shape, dtype):
        steps, batch, inputs_, units = parse(shape)
        a = inputs(batch, inputs_, units, dtype, steps=steps)
        self.args = (a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"])
        nblstm.block_lstm(*self.args)

    def time_forward(self, shape, dtype):
        nblstm.block_lstm(*self.args)

    def peakmem_forward(self, shape, dtype):
        nblstm.block_lstm(*self.args)


class BlockLSTMGrad:
    """Whole-sequence backward (``nblstm.block_lstm_grad``) given the forward outputs."""

    params = (SEQ_SHAPES, DTYPES)
    param_names = ["shape", "dtype"]

    def setup(self, shape, dtype):
        steps, batch, inputs_, units = parse(shape)
        a = inputs(batch, inputs_, units, dtype, steps=steps)
        self.args = (a["x"], a["cs_prev"], a["h_prev"], a["w"])
        self.outputs = nblstm.block_lstm(*self.args, a["b"])
        rng = np.random.default_rng(1)
        self.h_grad = rng.standard_normal(self.outputs.h.shape).astype(dtype)
        self.cs_grad = np.zeros_like(self.h_grad)
        self.time_backward(shape, dtype)

    def time_backward(self, shape, dtype):
        nblstm.block_lstm_grad(*self.args, self.outputs, self.cs_grad, self.h_grad)

    def peakmem_backward(self, shape, dtype):
        nblstm.block_lstm_grad(*self.args, self.outputs, self.cs_grad, self.h_grad)


class BlockLSTMOptions:
    """Forward and backward with peepholes and cell clipping, float32."""

    params = (["50x32x256x256"], [False, True], [None, 0.5])
    param_names = ["shape", "use_peephole", "cell_clip"]

    def setup(self, shape, use_peephole, cell_clip):
        steps, batch, inputs_, units = parse(shape)
        a = inputs(batch, inputs_, units, "float32", steps=steps)
        self.args = (a["x"], a["cs_prev"], a["h_prev"], a["w"])
        self.b = a["b"]
        self.peepholes = (a["wci"], a["wcf"], a["wco"])
        self.options = {"use_peephole": use_peephole, "layout": "icfo"}
        self.outputs = nblstm.block_lstm(*self.args, self.b, *self.peepholes, cell_clip=cell_clip, forget_bias=1.0,
                                         **self.options)
        self.cell_clip = cell_clip
        self.h_grad = np.ones_like(self.outputs.h)
        self.time_backward(shape, use_peephole, cell_clip)

    def time_forward(self, shape, use_peephole, cell_clip):
        nblstm.block_lstm(*self.args, self.b, *self.peepholes, cell_clip=self.cell_clip, forget_bias=1.0,
                          **self.options)

    def time_backward(self, shape, use_peephole, cell_clip):
        nblstm.block_lstm_grad(*self.args, self.outputs, None, self.h_grad, *self.peepholes, **self.options)


class LSTMBlockCell:
    """One step (``nblstm.lstm_block_cell``) and its gradient (``nblstm.lstm_block_cell_grad``)."""

    params = (CELL_SHAPES, DTYPES)
    param_names = ["shape", "dtype"]

    def setup(self, shape, dtype):
        batch, inputs_, units = parse(shape)
        a = inputs(batch, inputs_, units, dtype)
        self.args = (a["x"], a["cs_prev"], a["h_prev"], a["w"])
        self.b = a["b"]
        self.outputs = nblstm.lstm_block_cell(*self.args, self.b)
        self.h_grad = np.ones_like(self.outputs.h)
        self.time_cell_grad(shape, dtype)

    def time_cell(self, shape, dtype):
        nblstm.lstm_block_cell(*self.args, self.b)

    def time_cell_grad(self, shape, dtype):
        nblstm.lstm_block_cell_grad(*self.args, self.outputs, None, self.h_grad)

    def peakmem_cell(self, shape, dtype):
        nblstm.lstm_block_cell(*self.args, self.b)
