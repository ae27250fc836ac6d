"""A plain float64 NumPy reference of TF1 ``LSTMCell`` (:ref:`spec-cell`) and ``dynamic_rnn``.

One step at a time, the equations as the specification prints them; no
packing, no kernels, no code shared with nblstm. Gradients are not written
here: the tests take finite differences of :func:`run`.
"""

import numpy as np

__all__ = ["ACTIVATIONS", "run", "step"]

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946

ACTIVATIONS = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "elu": lambda x: np.where(x > 0, x, np.exp(np.minimum(x, 0.0)) - 1.0),
    "softsign": lambda x: x / (1.0 + np.abs(x)),
    "softplus": lambda x: np.log(1.0 + np.exp(x)),
    "selu": lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * (np.exp(np.minimum(x, 0.0)) - 1.0)),
    "linear": lambda x: x,
    "hard_sigmoid": lambda x: np.clip(x + 3.0, 0.0, 6.0) / 6.0,
}


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def step(weights, x, c_prev, h_prev, forget_bias=1.0, cell_clip=None, proj_clip=None, activation="tanh",
         recurrent_activation="sigmoid"):
    """One step of the cell in float64.

    Parameters
    ----------
    weights : dict
        ``kernel [I + P, 4H]`` (ICFO), ``bias [4H]``, optional peepholes
        ``w_f_diag, w_i_diag, w_o_diag [H]`` and ``projection/kernel [H, P]``.
    x : [B, I] array
    c_prev : [B, H] array
    h_prev : [B, P] array
    recurrent_activation : str
        The gate function, a name of :data:`ACTIVATIONS` (``"sigmoid"`` or ``"hard_sigmoid"``).

    Returns
    -------
    tuple
        ``(c [B, H], h [B, P])``; ``h`` (TensorFlow's ``m``) is also the output.
    """
    w = {k: np.asarray(a, np.float64) for k, a in weights.items()}
    act = ACTIVATIONS[activation]
    sigmoid = ACTIVATIONS[recurrent_activation]
    units = w["bias"].shape[0] // 4
    gates = np.concatenate([x, h_prev], axis=1) @ w["kernel"] + w["bias"]
    i, j, f, o = (gates[:, k * units:(k + 1) * units] for k in range(4))
    peep = "w_i_diag" in w
    if peep:
        c = sigmoid(f + forget_bias + w["w_f_diag"] * c_prev) * c_prev + sigmoid(i + w["w_i_diag"] * c_prev) * act(j)
    else:
        c = sigmoid(f + forget_bias) * c_prev + sigmoid(i) * act(j)
    if cell_clip is not None:
        c = np.clip(c, -cell_clip, cell_clip)
    if peep:
        h = sigmoid(o + w["w_o_diag"] * c) * act(c)
    else:
        h = sigmoid(o) * act(c)
    if "projection/kernel" in w:
        h = h @ w["projection/kernel"]
        if proj_clip is not None:
            h = np.clip(h, -proj_clip, proj_clip)
    return c, h


def run(weights, x, c0, h0, sequence_length=None, mask=None, reverse=False, **options):
    """``dynamic_rnn`` over ``x: [T, B, I]`` (time-major) in float64.

    Past an example's length its output is zero and its state is carried.
    With a Keras ``mask [B, T]`` instead, a masked time carries the state
    and repeats the previous output (zeros before the first). ``reverse``
    visits the times last to first: with lengths, the padding first (the
    state carried from the start), so that each example runs reversed
    within its length.

    Returns
    -------
    tuple
        ``(outputs [T, B, P], c_final [B, H], h_final [B, P])``, the outputs in time order.
    """
    x = np.asarray(x, np.float64)
    c = np.asarray(c0, np.float64)
    h = np.asarray(h0, np.float64)
    steps, batch, _ = x.shape
    lengths = np.full(batch, steps) if sequence_length is None else np.asarray(sequence_length)
    depth = h.shape[1]
    out = np.zeros((steps, batch, depth))
    last = np.zeros((batch, depth))
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        c_new, h_new = step(weights, x[t], c, h, **options)
        live = (np.asarray(mask)[:, t] if mask is not None else t < lengths)[:, None]
        c = np.where(live, c_new, c)
        h = np.where(live, h_new, h)
        if mask is not None:
            last = np.where(live, h_new, last)
            out[t] = last
        else:
            out[t] = np.where(live, h_new, 0.0)
    return out, c, h
