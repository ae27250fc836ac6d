"""The state of an :class:`~nblstm.cell.LSTMCell`: its tuple, and the one check of a state argument."""

from collections import namedtuple

from .. import _validate as v

__all__ = ["LSTMStateTuple", "state_arrays"]

LSTMStateTuple = namedtuple("LSTMStateTuple", ["c", "h"])
LSTMStateTuple.__doc__ = """State of an :class:`LSTMCell`: ``c [B, H]`` (cell) and ``h [B, P]`` (output), in that order.

Keras orders the same state ``[h, c]`` and PyTorch ``(h0, c0)``.

Examples
--------
>>> import numpy as np, nblstm
>>> state = nblstm.LSTMStateTuple(c=np.zeros((2, 4)), h=np.ones((2, 3)))  # B = 2, H = 4, P = 3
>>> c, h = state
>>> c.shape, h.shape, state.h is h
((2, 4), (2, 3), True)
"""


def state_arrays(state, batch, dtype, kind, name, units, depth, state_is_tuple):
    """``(c [B, H], h [B, P])`` from a state argument (``None`` for each part when ``state`` is).

    The arrays themselves, or column views of a joined state
    (``state_is_tuple=False``, ``[B, H + P]``); the target makes zeros of
    ``None``. ``kind`` and ``dtype`` are the inputs'; ``name`` names the
    argument in the messages; ``units`` is ``H``, ``depth`` ``P``.
    """
    if state is None:
        return None, None
    if state_is_tuple:
        if not isinstance(state, (tuple, list)) or len(state) != 2:
            raise TypeError(f"{name} must be an LSTMStateTuple (c [B, H], h [B, P]) with state_is_tuple=True, "
                            f"got {type(state).__name__}")
        parts = {f"{name}.c": state[0], f"{name}.h": state[1]}
    else:
        if isinstance(state, (tuple, list)):
            raise TypeError(f"{name} must be one [B, {units + depth}] array with state_is_tuple=False, "
                            f"got a {type(state).__name__}")
        parts = {name: state}
    infos = {}
    for n, a in parts.items():
        infos[n] = info = v.describe_array(n, a)
        if info.kind != kind:
            raise TypeError(f"{n} is a {'GPU' if info.kind == 'device' else 'NumPy'} array but inputs is "
                            f"{'a GPU' if kind == 'device' else 'a NumPy'} array: they must live together")
        if info.dtype != dtype:
            raise TypeError(f"{n} has dtype {info.dtype}; expected {dtype} (the dtype of inputs)")
        if len(info.shape) != 2:
            raise ValueError(f"{n} must have rank 2, got shape {tuple(info.shape)}")
    if state_is_tuple:
        v.check_shape(infos[f"{name}.c"], (batch, units), "[B, H]: B from inputs, H = num_units")
        v.check_shape(infos[f"{name}.h"], (batch, depth), "[B, P]: B from inputs, P = num_proj or num_units")
        c, h = parts.values()
    else:
        v.check_shape(infos[name], (batch, units + depth), "[B, H + P]: the state c and h concatenated")
        c, h = state[:, :units], state[:, units:]
    return c, h
