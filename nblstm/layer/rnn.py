"""TensorFlow 1's RNN functions over :class:`nblstm.LSTMCell`: MultiRNNCell, dynamic_rnn, bidirectional_dynamic_rnn.

The signatures and results are TensorFlow's (``tf.compat.v1.nn``): batch-major
inputs unless ``time_major=True``, outputs zero past each example's length,
final states at each length, the backward direction of
``bidirectional_dynamic_rnn`` reversed within each example's length and its
outputs returned in time order. Each cell runs the whole sequence in fused
kernels: a ``MultiRNNCell`` runs cell after cell, each over all steps (the
same results as TensorFlow's step-by-step loop, whose outputs past a length
are discarded).
"""

import re

from .. import _validate as v
from .. import arrays
from .._dispatch import check_precision
from ..cell import LSTMCell
from ..interchange import accepts_any_array

__all__ = ["MultiRNNCell", "bidirectional_dynamic_rnn", "dynamic_rnn"]


class MultiRNNCell:
    """Cells stacked: ``tf.compat.v1.nn.rnn_cell.MultiRNNCell``.

    Parameters
    ----------
    cells : list of LSTMCell or MultiRNNCell
        Cell ``k + 1`` reads cell ``k``'s output (a nested stack is its
        cells in order, its state a tuple in the tuple).
    state_is_tuple : bool, default True
        TensorFlow's only supported value.

    Notes
    -----
    Every cell is checked against what reaches it before any kernel runs:
    a cell built for another input depth than the previous cell's
    ``output_size`` (the inputs' depth for the first), a cell of another
    dtype than the inputs, or a state of the wrong shape raises an error
    that names the cell (``cells[k]``, ``cell.cells[k]`` in
    :func:`dynamic_rnn`) and both sides.

    Examples
    --------
    >>> import numpy as np, nblstm
    >>> stack = nblstm.MultiRNNCell([nblstm.LSTMCell(4, seed=0), nblstm.LSTMCell(3, num_proj=2, seed=1)])
    >>> x = np.ones((2, 5, 6), np.float32)                                 # [B, T, I]
    >>> outputs, state = nblstm.dynamic_rnn(stack, x, sequence_length=[5, 2])
    >>> outputs.shape, [s.c.shape for s in state], stack.output_size
    ((2, 5, 2), [(2, 4), (2, 3)], 2)
    """

    def __init__(self, cells, state_is_tuple=True):
        if not isinstance(cells, (list, tuple)) or not cells:
            raise ValueError("cells must be a non-empty list of nblstm.LSTMCell")
        for k, cell in enumerate(cells):
            if not isinstance(cell, (LSTMCell, MultiRNNCell)):
                raise TypeError(f"cells[{k}] must be an nblstm.LSTMCell, got {type(cell).__name__}")
        if not v.check_bool("state_is_tuple", state_is_tuple):
            raise ValueError("state_is_tuple=False is deprecated in TensorFlow and not supported: states are tuples")
        self.cells = tuple(cells)

    @property
    def output_size(self):
        """The last cell's output size."""
        return self.cells[-1].output_size

    @property
    def state_size(self):
        """One entry per cell."""
        return tuple(cell.state_size for cell in self.cells)

    def zero_state(self, batch_size, dtype):
        """A tuple of every cell's zero state."""
        return tuple(cell.zero_state(batch_size, dtype) for cell in self.cells)

    @accepts_any_array
    def __call__(self, inputs, state, scope=None):
        """One step of every cell: ``output, new_state = stack(inputs, state)``.

        Parameters
        ----------
        inputs : [B, I] array
        state : tuple
            One state per cell (:attr:`state_size`).
        scope : ignored

        Returns
        -------
        tuple
            ``(output [B, P], new_state)``, ``P`` the last cell's output size.
        """
        if not isinstance(state, (tuple, list)) or len(state) != len(self.cells):
            raise TypeError(f"state must be a tuple of {len(self.cells)} cell states")
        info = v.describe_array("inputs", inputs)
        if len(info.shape) != 2:
            raise ValueError(f"inputs must have rank 2 [B, I], got shape {tuple(info.shape)}")
        flat = _flatten(self, state, "", "state")
        _check_chain(flat, info, info.shape[0])
        finals = []
        for _, cell, s, _ in flat:
            inputs, s = cell(inputs, s)
            finals.append(s)
        return inputs, _nest(self, iter(finals))

    def get_weights(self):
        """``{"cell_{k}/{name}": array}``, cell after cell (TensorFlow's scope names without ``rnn/multi_rnn_cell``)."""
        return {f"cell_{k}/{n}": a for k, cell in enumerate(self.cells) for n, a in cell.get_weights().items()}

    def set_weights(self, weights):
        """Every cell's weights: a dict keyed like :meth:`get_weights` or TensorFlow's variable names
        (``rnn/multi_rnn_cell/cell_0/lstm_cell/kernel:0`` ...), or TensorFlow's flat list in its order.

        A cell that is not built yet takes its input depth from its kernel.
        """
        for cell, w in zip(self.cells, _per_cell(weights, self.cells), strict=True):
            cell.set_weights(w)

    def __repr__(self):
        return f"MultiRNNCell({list(self.cells)!r})"


_CELL_SCOPE = re.compile(r"(?:^|/)cell_(\d+)/")


def _per_cell(weights, cells):
    """Split a MultiRNNCell's weights into one argument of ``LSTMCell.set_weights`` per cell."""
    if isinstance(weights, (list, tuple)):
        counts = [len(c.weight_names) for c in cells]
        if len(weights) != sum(counts):
            raise ValueError(f"weights has {len(weights)} arrays; expected {sum(counts)} (every cell's weights in "
                             f"TensorFlow's order: {counts} per cell)")
        starts = [sum(counts[:k]) for k in range(len(cells))]
        return [list(weights[a:a + n]) for a, n in zip(starts, counts, strict=True)]
    if not isinstance(weights, dict):
        raise TypeError(f"weights must be a dict or a list, got {type(weights).__name__}")
    groups = [{} for _ in cells]
    scopes = set()
    for key, value in weights.items():
        found = _CELL_SCOPE.search(str(key))
        if found is None or int(found.group(1)) >= len(cells):
            raise ValueError(f"weights key {key!r} names no cell: expected 'cell_<k>/...' with k < {len(cells)} "
                             "(TensorFlow's scope of a MultiRNNCell's k-th cell)")
        scopes.add(key[:found.start()])
        groups[int(found.group(1))][key[found.end():]] = value
    if len(scopes) > 1:
        raise ValueError(f"weights holds the variables of several MultiRNNCells (scopes {sorted(scopes)}); pass one "
                         "stack's, e.g. nblstm.porting.tf.select(weights, 'fw')")
    return groups


def _flatten(cell, state, label, state_label):
    """The LSTMCells of ``cell`` in order, nested stacks flattened: ``[(label, cell, state, state label)]``.

    The labels name each cell and its state in messages (``cell.cells[1]``,
    ``initial_state[1]``); ``state`` may be ``None`` (zeros for every cell).
    """
    if not isinstance(cell, MultiRNNCell):
        return [(label, cell, state, state_label)]
    if state is not None and (not isinstance(state, (tuple, list)) or len(state) != len(cell.cells)):
        raise TypeError(f"{state_label} must be a tuple of {len(cell.cells)} cell states (one per cell of the "
                        "MultiRNNCell)")
    flat = []
    for k, c in enumerate(cell.cells):
        flat += _flatten(c, None if state is None else state[k], f"{label}.cells[{k}]" if label else f"cells[{k}]",
                         f"{state_label}[{k}]")
    return flat


def _nest(cell, finals):
    """The final states of :func:`_flatten`'s cells (an iterator, in order) in ``cell``'s structure."""
    if not isinstance(cell, MultiRNNCell):
        return next(finals)
    return tuple(_nest(c, finals) for c in cell.cells)


def _check_chain(flat, info, batch):
    """Every cell of a stack against what reaches it, before any kernel runs.

    A cell's own checks run only when its turn comes, after the cells
    before it ran, and blame ``inputs`` for what the previous cell
    produced; here each cell is named with what it expects and what it
    gets. A cell not built yet takes the depth that reaches it (a cell used
    twice must get the same both times).
    """
    depth, dtype, source = info.shape[-1], info.dtype, None
    if dtype not in v.SUPPORTED_DTYPES:
        raise TypeError(f"inputs has dtype {dtype}; expected float16, float32 or float64")
    assumed = {}
    for label, cell, state, state_label in flat:
        what = f"{label} ({cell!r})"
        built_depth, built_dtype = assumed.get(id(cell), (cell.input_depth, cell.dtype))
        if built_dtype is not None and built_dtype != dtype:
            if source is None:
                raise TypeError(f"{what} has dtype {built_dtype}, but inputs has dtype {dtype}")
            raise TypeError(f"{what} has dtype {built_dtype}, but {source} produces {dtype}: every cell of a "
                            "MultiRNNCell computes in the dtype of inputs")
        if built_depth is not None and built_depth != depth:
            if source is None:
                raise ValueError(f"{what} was built for input depth {built_depth}, but inputs has depth {depth} "
                                 f"(shape {tuple(info.shape)})")
            raise ValueError(f"{what} was built for input depth {built_depth}, but {source} outputs {depth} columns "
                             "(its output_size): each cell of a MultiRNNCell reads the outputs of the cell before it")
        check_precision(info.kind, cell.precision)
        cell._state_arrays(state, batch, dtype, info.kind, state_label)
        assumed[id(cell)] = (depth, dtype)
        depth, source = cell.output_size, what


def _sequence(cell, inputs, sequence_length, initial_state, time_major, reverse, name):
    """One direction: ``(outputs [T, B, P] time-major, final_state)``."""
    if not isinstance(cell, (LSTMCell, MultiRNNCell)):
        raise TypeError(f"{name} must be an nblstm.LSTMCell or nblstm.MultiRNNCell, got {type(cell).__name__}")
    info = v.describe_array("inputs", inputs)
    if len(info.shape) != 3:
        layout = "[T, B, I] (time_major=True)" if time_major else "[B, T, I] (time_major=False)"
        raise ValueError(f"inputs must have rank 3, {layout}, got shape {tuple(info.shape)}")
    v.check_sequence_layout(initial_state, sequence_length, tuple(info.shape), time_major)
    flat = _flatten(cell, initial_state, name, "initial_state")
    if isinstance(cell, MultiRNNCell):
        _check_chain(flat, info, info.shape[1] if time_major else info.shape[0])
    x = inputs if time_major else arrays.swap01(inputs, info.kind)
    finals = []
    for _, c, s, _ in flat:
        x, final = c.run(x, s, sequence_length, reverse=reverse)
        finals.append(final)
    return x, _nest(cell, iter(finals))


def _check_dtype(inputs, dtype):
    if dtype is not None:
        dt = v.check_dtype("dtype", dtype)
        found = v.describe_array("inputs", inputs).dtype
        if dt != found:
            raise TypeError(f"dtype={dt} disagrees with the dtype {found} of inputs")


@accepts_any_array
def dynamic_rnn(cell, inputs, sequence_length=None, initial_state=None, dtype=None, parallel_iterations=None,
                swap_memory=False, time_major=False, scope=None):
    """``tf.compat.v1.nn.dynamic_rnn``: a cell (or a :class:`MultiRNNCell`) over a whole sequence.

    Parameters
    ----------
    cell : LSTMCell or MultiRNNCell
    inputs : [B, T, I] array (``[T, B, I]`` with ``time_major=True``)
    sequence_length : [B] ints, optional
        Past its length an example's outputs are zero and its state is carried.
    initial_state : state, optional
        The cell's state structure (a tuple of them for a MultiRNNCell); zeros when omitted.
    dtype : optional
        Checked against the inputs' dtype (TensorFlow needs it without ``initial_state``).
    parallel_iterations, swap_memory, scope
        Accepted for compatibility; they do not apply.
    time_major : bool, default False
        TensorFlow's default: batch-major inputs and outputs.

    Returns
    -------
    tuple
        ``(outputs [B, T, P] (or [T, B, P]), final_state)``.

    Raises
    ------
    TypeError, ValueError
        Wrong types, shapes or dtypes; a state or lengths sized for the other
        layout of ``inputs`` (the message names ``time_major``); a cell of a
        MultiRNNCell that does not fit what reaches it (named, before any
        kernel runs).
    """
    _check_dtype(inputs, dtype)
    time_major = v.check_bool("time_major", time_major)
    outputs, state = _sequence(cell, inputs, sequence_length, initial_state, time_major, False, "cell")
    return (outputs if time_major else arrays.swap01(outputs, v.describe_array("outputs", outputs).kind)), state


@accepts_any_array
def bidirectional_dynamic_rnn(cell_fw, cell_bw, inputs, sequence_length=None, initial_state_fw=None,
                              initial_state_bw=None, dtype=None, parallel_iterations=None, swap_memory=False,
                              time_major=False, scope=None):
    """``tf.compat.v1.nn.bidirectional_dynamic_rnn``: a forward and a backward cell over the same sequence.

    The backward cell runs each example reversed within its own length
    (TensorFlow's ``reverse_sequence``), inside the kernels: the inputs are
    not copied. Its outputs come back in time order.

    Parameters
    ----------
    cell_fw, cell_bw : LSTMCell or MultiRNNCell
    inputs : [B, T, I] array (``[T, B, I]`` with ``time_major=True``)
    sequence_length : [B] ints, optional
    initial_state_fw, initial_state_bw : states, optional
    dtype, parallel_iterations, swap_memory, scope
        As :func:`dynamic_rnn`.
    time_major : bool, default False

    Returns
    -------
    tuple
        ``((output_fw, output_bw), (output_state_fw, output_state_bw))``.

    Examples
    --------
    >>> import numpy as np, nblstm
    >>> fw, bw = nblstm.LSTMCell(4, seed=0), nblstm.LSTMCell(3, seed=1)
    >>> x = np.ones((2, 5, 6), np.float32)                                 # [B, T, I]
    >>> (out_fw, out_bw), (state_fw, state_bw) = nblstm.bidirectional_dynamic_rnn(fw, bw, x, sequence_length=[5, 2])
    >>> out_fw.shape, out_bw.shape
    ((2, 5, 4), (2, 5, 3))
    >>> np.array_equal(state_bw.h[1], out_bw[1, 0])   # the backward direction ends at time 0
    True
    """
    _check_dtype(inputs, dtype)
    time_major = v.check_bool("time_major", time_major)
    out_fw, state_fw = _sequence(cell_fw, inputs, sequence_length, initial_state_fw, time_major, False, "cell_fw")
    out_bw, state_bw = _sequence(cell_bw, inputs, sequence_length, initial_state_bw, time_major, True, "cell_bw")
    if not time_major:
        kind = v.describe_array("outputs", out_fw).kind
        out_fw, out_bw = arrays.swap01(out_fw, kind), arrays.swap01(out_bw, kind)
    return (out_fw, out_bw), (state_fw, state_bw)

