"""Streaming: an :class:`~nblstm.LSTMCell` run one step at a time, its weights packed once, its state kept.

:meth:`nblstm.LSTMCell.stepper` returns a :class:`Stepper`. It is for
inputs that arrive one step at a time (audio chunks, tokens, sensor
frames) and are to be answered at once: where ``cell(x_t, state)``
validates its state, looks up the cell's packed weights and allocates its
outputs at every call, a stepper has done all of that once, and a step is
one check of ``x_t`` and one call of a compiled kernel
(:mod:`nblstm.cpu.step`). Its results are those of ``cell(x_t, state)``,
bit for bit.
"""

import threading

import numpy as np

from .. import _validate as v
from .state import LSTMStateTuple, state_arrays

__all__ = ["Stepper"]


class Stepper:
    """A cell run one step at a time, with its state kept between calls (streaming).

    Made by :meth:`nblstm.LSTMCell.stepper`. ``h = step(x_t)`` runs one step
    from the current state, returns the output and keeps the new state for
    the next call; results are bitwise those of ``cell(x_t, state)``.

    A stepper holds a snapshot of the cell's weights, packed for its kernel
    when it is made: a later :meth:`~nblstm.LSTMCell.set_weights` (or
    :meth:`~nblstm.LSTMCell.build`) does not reach it; make a new stepper
    then. It runs on the CPU, with NumPy arrays. One stepper is one stream:
    calls from several threads at once run one after the other (a lock
    around each step, :meth:`state` and :meth:`reset`), so every output is
    that of a serial step from the state the previous step left, in the
    order the threads got the lock. Separate streams need separate steppers,
    which run at once.

    Attributes
    ----------
    batch_size : int
        ``B``, the rows of every step.
    dtype : numpy.dtype
        The cell's dtype: of ``x_t``, the outputs and the state.
    input_depth : int
        ``I``.
    num_units : int
        ``H``.
    output_size : int
        ``P = num_proj or num_units``.

    Examples
    --------
    >>> import numpy as np, nblstm
    >>> cell = nblstm.LSTMCell(4, num_proj=3, seed=0)
    >>> cell.build(2)
    >>> step = cell.stepper(batch_size=1)
    >>> x = np.ones((5, 1, 2), np.float32)             # five steps of [B, I]
    >>> outputs = [step(x_t) for x_t in x]              # each [B, P], a new array
    >>> outputs[-1].shape, step.state.c.shape, step.state.h.shape
    ((1, 3), (1, 4), (1, 3))
    >>> state = cell.zero_state(1, np.float32)          # the same, with the cell
    >>> for x_t in x:
    ...     output, state = cell(x_t, state)
    >>> np.array_equal(output, outputs[-1])
    True
    """

    __slots__ = (
        "_dtype",
        "_impl",
        "_joined",
        "_lock",
        "_out_shape",
        "_step",
        "_units",
        "_x_shape",
        "batch_size",
        "dtype",
        "input_depth",
        "num_units",
        "output_size",
    )

    def __init__(self, target, weights, options, batch_size, initial_state, state_is_tuple):
        """Use :meth:`nblstm.LSTMCell.stepper`: the cell validates and hands over its weights and options."""
        kernel = weights["kernel"]
        self.dtype = self._dtype = kernel.dtype
        self.num_units = kernel.shape[1] // 4
        proj = weights.get("projection/kernel")
        self.output_size = self.num_units if proj is None else proj.shape[1]
        self.input_depth = kernel.shape[0] - self.output_size
        self.batch_size = batch_size
        self._x_shape = (batch_size, self.input_depth)
        self._out_shape = (batch_size, self.output_size)
        self._joined = not state_is_tuple
        # The kernel releases the GIL and works in the stepper's one buffer: two steps at once would mix
        # their states. Uncontended, the lock costs about 0.15 us a step (docs/streaming.md).
        self._lock = threading.Lock()
        c0, h0 = self._checked_state(initial_state, "initial_state")
        self._impl = target.cell_stepper(weights=weights, options=options, batch_size=batch_size, c0=c0, h0=h0)
        self._step = self._impl.step

    def __call__(self, x_t, out=None):
        """One step: ``h = step(x_t)``, and the new state kept for the next call.

        Parameters
        ----------
        x_t : [B, I] array
            NumPy array of the cell's dtype (any layout; finite or not).
            Never modified.
        out : [B, P] array, optional
            Where to write the output (a writable NumPy array of the cell's
            dtype); it is returned.

        Returns
        -------
        numpy.ndarray
            ``[B, P]``, the step's output (the new ``h``, TensorFlow's
            ``m``): a new array at every call (or ``out``), which later
            steps do not touch.

        Raises
        ------
        TypeError
            ``x_t`` (or ``out``) not a NumPy array, or not of the cell's
            dtype; GPU arrays, which a stepper does not take.
        ValueError
            ``x_t`` not ``[B, I]`` (or ``out`` not ``[B, P]``).
        """
        # The usual case in as few operations as possible: the exact type, dtype
        # and shape, C-contiguous, aligned and writable (flags.carray), which the
        # kernel takes as it is (a read-only array would compile it again).
        if not (
            x_t.__class__ is np.ndarray and x_t.dtype is self._dtype and x_t.shape == self._x_shape and x_t.flags.carray
        ):
            x_t = self._checked_input(x_t)
        out = None if out is None else self._checked_out(out)
        # acquire/release, not `with`: 0.15 us against 0.37 us here (CPython 3.11), of a 3-7 us step.
        self._lock.acquire()
        try:
            if out is None:
                return self._step(x_t)
            out[...] = self._step(x_t)
            return out
        finally:
            self._lock.release()

    @property
    def state(self):
        """The current state: ``LSTMStateTuple(c [B, H], h [B, P])``, or one ``[B, H + P]`` array
        with ``state_is_tuple=False``; new arrays of the cell's dtype (a copy of the stepper's).

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(3, seed=0, state_is_tuple=False)
        >>> cell.build(2)
        >>> step = cell.stepper(batch_size=2)
        >>> step.state.shape                         # [B, H + P], zeros before the first step
        (2, 6)
        >>> h = step(np.ones((2, 2), np.float32))
        >>> np.array_equal(step.state[:, 3:], h)     # c, then h
        True
        """
        with self._lock:
            c, h = self._impl.state()
        if self._joined:
            return np.concatenate([c, h], axis=1)
        return LSTMStateTuple(c, h)

    def reset(self, state=None):
        """Start again from ``state`` (zeros when ``None``), as at :meth:`~nblstm.LSTMCell.stepper`.

        Parameters
        ----------
        state : state, optional
            As the cell's :attr:`~nblstm.LSTMCell.state_size`, ``[B, ...]``
            rows of the cell's dtype; copied.

        Examples
        --------
        >>> import numpy as np, nblstm
        >>> cell = nblstm.LSTMCell(3, seed=0)
        >>> cell.build(2)
        >>> step = cell.stepper()
        >>> x = np.ones((1, 2), np.float32)
        >>> first = step(x)
        >>> second = step(x)                      # from the state after the first step
        >>> step.reset()
        >>> np.array_equal(step(x), first), np.array_equal(first, second)
        (True, False)
        """
        c0, h0 = self._checked_state(state, "state")
        with self._lock:
            self._impl.set_state(c0, h0)

    # -- checks ------------------------------------------------------------------------------------

    def _checked_input(self, x_t):
        """``x_t`` validated, as the kernel takes it (a C-contiguous, aligned, writable copy when it is not one)."""
        info = v.describe_array("x_t", x_t)
        if info.kind != "host":
            raise TypeError(
                "x_t is a GPU array; a Stepper runs on the CPU with NumPy arrays (its weights and "
                "state live on the host): pass a NumPy array, or call the cell itself on GPU arrays"
            )
        if info.dtype != self._dtype:
            raise TypeError(f"x_t has dtype {info.dtype}; expected {self._dtype} (the cell's dtype)")
        if tuple(info.shape) != self._x_shape:
            raise ValueError(
                f"x_t has shape {tuple(info.shape)}; expected {self._x_shape} ([B, I]: B = batch_size "
                f"of the stepper, I = the cell's input depth)"
            )
        if x_t.__class__ is np.ndarray and x_t.flags.carray:
            return x_t
        return np.array(x_t, self._dtype, order="C", copy=True)

    def _checked_out(self, out):
        if out.__class__ is not np.ndarray:
            raise TypeError(f"out must be a NumPy array, got {type(out).__name__}")
        if out.dtype != self._dtype:
            raise TypeError(f"out has dtype {out.dtype}; expected {self._dtype} (the cell's dtype)")
        if out.shape != self._out_shape:
            raise ValueError(f"out has shape {out.shape}; expected {self._out_shape} ([B, P])")
        if not out.flags.writeable:
            raise ValueError("out is read-only")
        return out

    def _checked_state(self, state, name):
        """``(c, h)`` of a state argument, validated as the cell validates its states (``None``: zeros)."""
        if state is not None:
            parts = state if isinstance(state, (tuple, list)) else (state,)
            for part in parts:
                if v.describe_array(name, part).kind != "host":
                    raise TypeError(f"{name} holds GPU arrays; a Stepper runs on the CPU with NumPy arrays")
        return state_arrays(state, self.batch_size, self._dtype, "host", name, self.num_units, self.output_size,
                            not self._joined)

    def __repr__(self):
        return (
            f"Stepper(batch_size={self.batch_size}, input_depth={self.input_depth}, "
            f"num_units={self.num_units}, output_size={self.output_size}, dtype={self._dtype.name})"
        )
