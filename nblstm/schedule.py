"""The order in which a direction of a layer visits the time steps of each example: lengths, masks, reversal.

The cell's kernels run ``T`` steps ``s = 0 .. T - 1``; an example ``b`` is
active in its first ``counts[b]`` steps and carries its state in the others
(the kernels' ``lengths``). A :class:`Schedule` says which input time each
active step reads and which step's output each time shows, so that one set
of kernels runs every case:

- lengths (``dynamic_rnn``, PyTorch's packed sequences): step ``s`` reads
  time ``s``, outputs from the length on are zero. The identity: no
  schedule is built (:func:`schedule` returns ``None``) and the kernels
  run exactly as without one.
- the reverse direction with lengths (``bidirectional_dynamic_rnn``,
  ``tf.reverse_sequence``): step ``s`` reads time ``L_b - 1 - s``, each
  example reversed within its own length; outputs go back to their times.
- a Keras mask ``[B, T]``, any pattern: the unmasked times in order (last
  to first for the reverse direction); a masked time's output repeats the
  output of the last step before it in the direction's order (zero before
  the first), its state is carried; or, with ``zero_masked`` (Keras's
  ``zero_output_for_mask``, which ``Bidirectional`` sets), it is zero.

The targets apply a schedule around the unchanged time loop: the input
projection of all ``T`` times is computed in time order, then its rows are
gathered into step order; after the loop the outputs are gathered back to
time order. The backward pass does the reverse (gradients of the outputs
summed into steps, gate gradients gathered back to times). The inputs are
never copied or reversed.
"""

from typing import NamedTuple

import numpy as np

__all__ = ["Schedule", "by_length", "schedule"]


class Schedule(NamedTuple):
    """Index maps between steps and times for one direction (``-1``: none).

    Attributes
    ----------
    counts : [B] int64
        Active steps of each example (the kernels' lengths).
    time_of : [T, B] int64
        The time step ``s`` reads, ``-1`` from ``counts[b]`` on.
    step_of : [T, B] int64
        The step that reads time ``t``, ``-1`` where no step does.
    output_of : [T, B] int64
        The step whose output ``h`` is the output at time ``t``; ``-1``: zero.
    """

    counts: np.ndarray
    time_of: np.ndarray
    step_of: np.ndarray
    output_of: np.ndarray


def by_length(lengths):
    """The examples longest first (a stable ``[B]`` permutation), or ``None`` where they are in that order already.

    The CPU kernels skip the rows after the last example still running at
    each step (forward and backward): with the examples sorted so, every
    example that has finished costs nothing from then on. Each row's results
    do not depend on its position, so that a permuted call gives the bits of
    the call in the caller's order.
    """
    if lengths.size < 2 or bool(np.all(lengths[:-1] >= lengths[1:])):
        return None
    return np.argsort(-lengths, kind="stable")


def schedule(steps, batch, lengths=None, mask=None, reverse=False, zero_masked=False):
    """The :class:`Schedule` of one direction, or ``None`` for the identity (lengths, forward).

    Parameters
    ----------
    steps, batch : int
        ``T`` and ``B``.
    lengths : [B] int64 array, optional
        Validated lengths in ``[0, T]`` (default ``T``). Not with ``mask``.
    mask : [B, T] bool array, optional
        Validated Keras mask: ``True`` where a step is computed.
    reverse : bool, default False
        Visit the active times last to first.
    zero_masked : bool, default False
        With ``mask``: masked times output zeros instead of repeating the last output.

    Examples
    --------
    >>> import numpy as np
    >>> s = schedule(4, 2, lengths=np.array([3, 1]), reverse=True)
    >>> s.counts.tolist(), s.time_of[:, 0].tolist(), s.output_of[:, 1].tolist()
    ([3, 1], [2, 1, 0, -1], [0, -1, -1, -1])
    >>> m = schedule(4, 1, mask=np.array([[False, True, False, True]]))
    >>> m.time_of[:, 0].tolist(), m.output_of[:, 0].tolist()
    ([1, 3, -1, -1], [-1, 0, 0, 1])
    >>> schedule(4, 2, lengths=np.array([4, 2])) is None
    True
    """
    if mask is None and not reverse:
        return None
    if mask is not None:
        active = np.ascontiguousarray(np.asarray(mask, bool).T)  # [T, B]
    else:
        full = np.full(batch, steps, np.int64) if lengths is None else np.asarray(lengths, np.int64)
        active = np.arange(steps)[:, None] < full[None, :]
    # rank[t, b]: the steps of b's direction order taken up to and including time t, minus one.
    if reverse:
        rank = np.cumsum(active[::-1], axis=0)[::-1] - 1
    else:
        rank = np.cumsum(active, axis=0) - 1
    rank = rank.astype(np.int64)
    counts = active.sum(axis=0).astype(np.int64)
    step_of = np.where(active, rank, -1).astype(np.int64)
    time_of = np.full((steps, batch), -1, np.int64)
    t_idx, b_idx = np.nonzero(active)
    time_of[step_of[t_idx, b_idx], b_idx] = t_idx
    # Lengths: outputs past the length are zero. Masks (Keras): a masked time repeats the last output.
    output_of = rank if mask is not None and not zero_masked else step_of
    return Schedule(counts, time_of, np.ascontiguousarray(step_of), np.ascontiguousarray(output_of))
