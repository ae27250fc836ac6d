"""The contract between the front end (the ops, the cell) and each target.

A target runs validated calls on one kind of memory: :mod:`nblstm.cpu` on
NumPy arrays, :mod:`nblstm.cuda` on arrays that live on a GPU. Both
implement :class:`Target` (the CPU also :class:`StreamingTarget`); the front
end calls nothing else of them. Every argument is a keyword: arrays by their
TensorFlow op names (the ops) or the cell's names (the cell), options as one
record of :mod:`nblstm.options`.

What a target may assume: every array was validated (kind, rank, shape,
dtype; all of one dtype), optional arrays are ``None`` or present, integers
are in range, options are normalised records. What it promises: results of
the inputs' dtype, on the inputs' kind of memory, the caller's arrays never
written. This module sits at the bottom of the package: it imports nothing of nblstm.
"""

from typing import Any, NamedTuple, Protocol

__all__ = ["CellBackward", "CellForward", "StreamingTarget", "Target"]


class CellForward(NamedTuple):
    """What :meth:`Target.cell_forward` returns.

    Attributes
    ----------
    outputs : [T, B, P] array
        Zero from each example's length on.
    state : tuple or array
        ``(c [B, H], h [B, P])`` at each example's length, or one
        ``[B, H + P]`` array with ``join_state``.
    saved : object
        What :meth:`Target.cell_backward` needs (``None`` without ``with_grad``).
    """

    outputs: Any
    state: Any
    saved: Any


class CellBackward(NamedTuple):
    """What :meth:`Target.cell_backward` returns.

    Attributes
    ----------
    d_inputs : [T, B, I] array
    d_state : tuple or array
        ``(d_c0 [B, H], d_h0 [B, P])``, or one ``[B, H + P]`` array with ``join_state``.
    d_weights : dict
        NumPy arrays keyed like the cell's weights.
    """

    d_inputs: Any
    d_state: Any
    d_weights: dict


class Target(Protocol):
    """The entry points every target implements (all arguments are keywords).

    The ops: ``block_lstm`` returns the seven ``[T, B, H]`` outputs ``(i, cs,
    f, o, ci, co, h)``, ``block_lstm_grad`` the eight gradients ``(x_grad,
    cs_prev_grad, h_prev_grad, w_grad, wci_grad, wcf_grad, wco_grad,
    b_grad)``, ``lstm_block_cell`` the seven ``[B, H]`` outputs of one step
    and ``lstm_block_cell_grad`` ``(cs_prev_grad, dicfo, wci_grad, wcf_grad,
    wco_grad)``, as sequences. ``wci, wcf, wco`` may be ``None`` (zeros), as
    may ``cs_grad`` and ``h_grad``. ``options`` is an
    :class:`nblstm.options.OpOptions`; ``stream`` a CUDA stream or ``None``.

    The cell (:class:`nblstm.LSTMCell`): ``cell_forward`` runs ``inputs``
    (``[T, B, I]``, or ``[B, I]`` for one step) from the state ``(c0 [B, H],
    h0 [B, P])`` (each ``None`` for zeros) with the cell's host ``weights``
    (a dict of arrays of the cell's dtype); ``cache`` is a dict the cell
    keeps for the target, emptied whenever its weights change, where the
    target keeps weights packed or uploaded; ``lengths`` is a validated
    ``[B]`` int64 NumPy array; ``options`` an
    :class:`nblstm.options.CellOptions`; ``schedule`` a
    :class:`nblstm.schedule.Schedule` or ``None`` (steps in time order, with
    ``lengths``): with one, ``lengths`` is its ``counts``, the outputs and
    their gradients are in time order and everything between in step
    order. ``cell_backward`` takes the
    ``saved`` of a ``cell_forward`` with ``with_grad`` and the gradients of
    the outputs and the final state (``None`` for zeros).

    Streaming is :class:`StreamingTarget`'s.
    """

    def block_lstm(self, *, x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max, options, stream): ...

    def block_lstm_grad(self, *, x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max,
                        options, stream): ...

    def lstm_block_cell(self, *, x, cs_prev, h_prev, w, b, wci, wcf, wco, options, stream): ...

    def lstm_block_cell_grad(self, *, cs_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, options, stream): ...

    def cell_forward(self, *, inputs, c0, h0, weights, cache, lengths, options, join_state,
                     with_grad, schedule=None) -> CellForward: ...

    def cell_backward(self, *, saved, d_outputs, d_c, d_h, join_state) -> CellBackward: ...


class StreamingTarget(Target, Protocol):
    """A :class:`Target` that also streams (:meth:`nblstm.LSTMCell.stepper`): the CPU target.

    ``cell_stepper`` returns an object that keeps a snapshot of the cell's
    ``weights`` packed, and the state ``(c0 [B, H], h0 [B, P])`` (each
    ``None`` for zeros) between calls, for ``batch_size`` rows; its
    ``step(x)`` runs one step from a validated ``[B, I]`` array and returns
    the output ``[B, P]``, ``state()`` and ``set_state(c0, h0)`` read and
    replace the state.
    """

    def cell_stepper(self, *, weights, options, batch_size, c0, h0): ...
