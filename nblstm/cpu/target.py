"""The CPU target: the entry points of the target contract (:class:`nblstm._contract.Target`) on NumPy arrays.

Here the validated arguments of a call are brought to what the kernels
take: the compute dtype (numba's CPU target has no float16: float16 is
computed in float32, converted by :mod:`nblstm.cpu.half`), zeros for
absent optional arrays, C-contiguous arrays; results go back to the
caller's dtype.
"""

import numpy as np

from .._contract import CellBackward, CellForward
from .._validate import compute_dtype
from . import cell, fused, half, step
from .blas import kernel_section
from .partition import cell_chunk_bounds, chunk_bounds, fused_projection

__all__ = ["CpuTarget", "to_compute", "to_storage", "writable_alias"]


class _Alias:
    """The base of a writable view of a read-only array's memory; keeps that array alive."""

    __slots__ = ("__array_interface__", "_array")

    def __init__(self, array):
        self._array = array
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface


def writable_alias(a):
    """``a`` itself, or for a read-only array a writable view of the same memory, never written.

    Numba types a read-only array apart from a writable one, so each kernel
    would compile a second time (10 s for the fused forward) for a
    memory-mapped file, an ``np.broadcast_to`` result or a frozen weight. The
    kernels never write their inputs: they get the same memory as a writable
    array of the same layout (no copy; about 2 us).
    """
    if a.flags.writeable:
        return a
    return np.asarray(_Alias(a))


def to_compute(a, dtype):
    """``a`` in the compute dtype, writable (:func:`writable_alias`): no copy when it has it; float16 by
    :mod:`nblstm.cpu.half`."""
    if a is None:
        return a
    a = writable_alias(a)
    if a.dtype == dtype:
        return a
    if a.dtype == np.float16 and dtype == np.float32:
        return half.to_float32(a)
    return np.asarray(a, dtype)


def to_storage(a, dtype):
    """A result back in the caller's dtype (float16 by :mod:`nblstm.cpu.half`)."""
    if a.dtype == dtype:
        return a
    if dtype == np.float16 and a.dtype == np.float32:
        return half.to_float16(a)
    return a.astype(dtype)


def _cast_all(arrays, dtype):
    """Cast to the compute dtype (a no-op for arrays already in it); ``None`` stays ``None``."""
    return [to_compute(a, dtype) for a in arrays]


def _peepholes(wci, wcf, wco, units, dtype):
    """Zeros stand in for absent peephole weights (they are read only with ``use_peephole``)."""
    return [np.zeros(units, dtype) if p is None else p for p in (wci, wcf, wco)]


class CpuTarget:
    """The CPU implementation of :class:`nblstm._contract.StreamingTarget` (``stream`` is always ``None`` here)."""

    name = "cpu"

    def block_lstm(self, *, x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, options, stream=None):
        dtype = x.dtype
        ct = compute_dtype(dtype)
        x, cs_prev, h_prev, w, b, wci, wcf, wco = _cast_all((x, cs_prev, h_prev, w, b, wci, wcf, wco), ct)
        wci, wcf, wco = _peepholes(wci, wcf, wco, cs_prev.shape[1], ct)
        block = fused.forward(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, options)
        return list(to_storage(block, dtype))

    def block_lstm_grad(self, *, x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max,
                        options, stream=None):
        dtype = x.dtype
        ct = compute_dtype(dtype)
        steps, batch, _ = x.shape
        units = cs_prev.shape[1]
        x, cs_prev, h_prev, w, wci, wcf, wco, cs_grad, h_grad = _cast_all(
            (x, cs_prev, h_prev, w, wci, wcf, wco, cs_grad, h_grad), ct)
        outputs = _cast_all(outputs, ct)
        wci, wcf, wco = _peepholes(wci, wcf, wco, units, ct)
        if cs_grad is None or h_grad is None:
            zeros = np.zeros((steps, batch, units), ct)
            cs_grad = zeros if cs_grad is None else cs_grad
            h_grad = zeros if h_grad is None else h_grad
        grads = fused.backward(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max, options)
        return [to_storage(g, dtype) for g in grads]

    def lstm_block_cell(self, *, x, cs_prev, h_prev, w, b, wci, wcf, wco, options, stream=None):
        outs = self.block_lstm(x=x[None], cs_prev=cs_prev, h_prev=h_prev, w=w, b=b, wci=wci, wcf=wcf, wco=wco,
                               seq_len_max=1, options=options)
        return [o[0] for o in outs]

    def lstm_block_cell_grad(self, *, cs_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, options, stream=None):
        dtype = cs_prev.dtype
        ct = compute_dtype(dtype)
        batch, units = cs_prev.shape
        w_rec = w[w.shape[0] - units:]
        cs_prev, wci, wcf, wco, cs_grad, h_grad, w_rec = _cast_all((cs_prev, wci, wcf, wco, cs_grad, h_grad, w_rec),
                                                                   ct)
        outputs = [a[None] for a in _cast_all(outputs, ct)]
        wci, wcf, wco = _peepholes(wci, wcf, wco, units, ct)
        zeros = np.zeros((batch, units), ct)
        cs_grad = zeros if cs_grad is None else cs_grad
        h_grad = zeros if h_grad is None else h_grad
        if batch == 0:
            grads = [zeros, np.zeros((batch, 4 * units), ct), *(np.zeros(units, ct) for _ in range(3))]
        else:
            with kernel_section():
                dgates, dc, wci_grad, wcf_grad, wco_grad = fused.backward_recurrent(
                    cs_prev, wci, wcf, wco, outputs, cs_grad[None], h_grad[None], 1, w_rec, options.use_peephole,
                    options.layout)
            grads = [dc, dgates[0], wci_grad, wcf_grad, wco_grad]
        return [to_storage(g, dtype) for g in grads]

    # -- the cell ------------------------------------------------------------------------------------------

    def cell_forward(self, *, inputs, c0, h0, weights, cache, lengths, options, join_state, with_grad,
                     schedule=None):
        dtype = inputs.dtype
        ct = compute_dtype(dtype)
        x = inputs[None] if inputs.ndim == 2 else inputs
        steps, batch, input_depth = x.shape
        if schedule is not None:
            lengths = schedule.counts
        on_fused = cell.fused_forward_applies(options, "projection/kernel" in weights, steps)
        packed = None if on_fused else _packed_weights(weights, cache, ct, input_depth, batch)
        fused_weights = _fused_weights(weights, cache, ct, batch) if on_fused else None
        units = weights["bias"].shape[0] // 4
        depth = units if packed is None else packed.depth
        c0 = np.zeros((batch, units), ct) if c0 is None else c0
        h0 = np.zeros((batch, depth), ct) if h0 is None else h0
        x, c0, h0 = (np.ascontiguousarray(to_compute(a, ct)) for a in (x, c0, h0))
        saved = cell.sequence_forward(x, c0, h0, packed, lengths, options, schedule, fused_weights, save=with_grad)
        c_final, h_final = cell.final_state(saved)
        outputs = to_storage(cell.masked_outputs(saved), dtype)
        state = _state(c_final, h_final, dtype, join_state)
        ctx = None
        if with_grad:
            ctx = {"saved": saved, "packed": packed, "dtype": dtype, "compute": ct,
                   "shape": (steps, batch, units, depth)}
        return CellForward(outputs, state, ctx)

    def cell_backward(self, *, saved, d_outputs, d_c, d_h, join_state):
        packed, dtype, ct = saved["packed"], saved["dtype"], saved["compute"]
        steps, batch, units, depth = saved["shape"]
        d_out, d_c, d_h = (np.zeros(shape, ct) if a is None else np.ascontiguousarray(to_compute(a, ct))
                           for a, shape in ((d_outputs, (steps, batch, depth)), (d_c, (batch, units)),
                                            (d_h, (batch, depth))))
        d_x, d_c0, d_h0, d_w = cell.sequence_backward(saved["saved"], packed, d_out, d_c, d_h)
        return CellBackward(to_storage(d_x, dtype), _state(d_c0, d_h0, dtype, join_state), d_w)

    def cell_stepper(self, *, weights, options, batch_size, c0, h0):
        """The cell one step at a time, its weights packed once (:class:`nblstm.cpu.step.CellStep`)."""
        return step.CellStep(weights, options, batch_size, c0, h0)


def _packed_weights(weights, cache, ct, input_depth, batch):
    """The cell's weights packed for ``batch`` rows in the compute dtype, kept in ``cache`` (per chunking)."""
    units = weights["bias"].shape[0] // 4
    key = ("cpu", ct.str, cell_chunk_bounds(max(batch, 1), units).tobytes())
    packed = cache.get(key)
    if packed is None:
        packed = cache[key] = cell.PackedWeights(_in_compute_dtype(weights, ct), input_depth, batch)
    return packed


def _fused_weights(weights, cache, ct, batch):
    """The cell's weights for the fused ops' forward kernel (:class:`nblstm.cpu.cell.FusedWeights`), kept in
    ``cache`` per chunking and input-projection choice, as :func:`_packed_weights`."""
    kernel = weights["kernel"]
    units = kernel.shape[1] // 4
    key = ("cpu-fused", ct.str, chunk_bounds(max(batch, 1), units).tobytes(),
           fused_projection(max(batch, 1), kernel.shape[0] - units, units, ct))
    found = cache.get(key)
    if found is None:
        found = cache[key] = cell.FusedWeights(_in_compute_dtype(weights, ct), batch)
    return found


def _in_compute_dtype(weights, ct):
    """The cell's weights as the kernels read them: C-contiguous, writable, of the compute dtype ``ct``."""
    return {k: writable_alias(np.ascontiguousarray(a, ct)) for k, a in weights.items()}


def _state(c, h, dtype, join_state):
    """A state ``(c [B, H], h [B, P])`` in the caller's dtype, or one ``[B, H + P]`` array."""
    c, h = to_storage(c, dtype), to_storage(h, dtype)
    return np.concatenate([c, h], axis=1) if join_state else (c, h)
