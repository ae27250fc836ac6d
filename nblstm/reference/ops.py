"""A plain float64 NumPy reference of the fused LSTM ops (:ref:`spec-forward`, :ref:`spec-backward`).

Written for clarity, not speed: one step at a time, the equations as they
are printed in the specification, no packing, no threads. The tests compare
every kernel against it, and the demo checks the kernels with it. It shares
no code with the kernels.
"""

import numpy as np

__all__ = ["block_lstm", "block_lstm_grad"]


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _peephole_term(use_peephole):
    """``term -> term`` with peepholes, ``term -> 0`` without.

    Written as a choice rather than a product with 0 or 1, so that non-finite
    peephole weights have no effect without peepholes (``0 * inf`` is NaN).
    """
    if use_peephole:
        return lambda term: term
    return lambda term: 0.0


def _gate_slices(units, layout):
    """Column slices of the ``i, ci, f, o`` blocks for a gate ``layout``."""
    order = {"icfo": "icfo", "ifco": "ifco"}[layout]
    return {g: slice(k * units, (k + 1) * units) for k, g in enumerate(order)}


def block_lstm(x, cs_prev, h_prev, w, b, wci, wcf, wco, seq_len_max=None, forget_bias=0.0, cell_clip=-1.0,
               use_peephole=False, layout="ifco"):
    """Forward of BlockLSTM (``layout="icfo"``) or BlockLSTMV2 (``"ifco"``) in float64.

    Parameters
    ----------
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    b : [4H] array
    wci, wcf, wco : [H] arrays
    seq_len_max : int, optional
        Defaults to ``T``.
    forget_bias, cell_clip : float
    use_peephole : bool
    layout : {"ifco", "icfo"}

    Returns
    -------
    dict
        ``i, cs, f, o, ci, co, h``, each ``[T, B, H]`` float64, zero past ``seq_len_max``.
    """
    x, cs_prev, h_prev, w, b, wci, wcf, wco = (np.asarray(a, np.float64) for a in
                                                (x, cs_prev, h_prev, w, b, wci, wcf, wco))
    steps, batch, _ = x.shape
    units = cs_prev.shape[1]
    seq_len_max = steps if seq_len_max is None else int(seq_len_max)
    peep = _peephole_term(use_peephole)
    g = _gate_slices(units, layout)
    out = {k: np.zeros((steps, batch, units)) for k in ("i", "cs", "f", "o", "ci", "co", "h")}
    c, h = cs_prev, h_prev
    for t in range(seq_len_max):
        gates = np.concatenate([x[t], h], axis=1) @ w + b
        i = _sigmoid(gates[:, g["i"]] + peep(wci * c))
        ci = np.tanh(gates[:, g["c"]])
        f = _sigmoid(gates[:, g["f"]] + forget_bias + peep(wcf * c))
        cs = i * ci + f * c
        if cell_clip > 0:
            cs = np.clip(cs, -cell_clip, cell_clip)
        co = np.tanh(cs)
        o = _sigmoid(gates[:, g["o"]] + peep(wco * cs))
        h = o * co
        c = cs
        for name, value in zip(("i", "cs", "f", "o", "ci", "co", "h"), (i, cs, f, o, ci, co, h)):
            out[name][t] = value
    return out


def block_lstm_grad(x, cs_prev, h_prev, w, wci, wcf, wco, outputs, cs_grad, h_grad, seq_len_max=None,
                    use_peephole=False, layout="ifco"):
    """Backward of BlockLSTMGrad (``"icfo"``) or BlockLSTMGradV2 (``"ifco"``) in float64.

    Parameters
    ----------
    x : [T, B, I] array
    cs_prev, h_prev : [B, H] arrays
    w : [I + H, 4H] array
    wci, wcf, wco : [H] arrays
    outputs : dict or sequence
        Forward outputs ``i, cs, f, o, ci, co, h`` (a dict with those keys,
        or a sequence in that order), each ``[T, B, H]``.
    cs_grad, h_grad : [T, B, H] arrays
    seq_len_max : int, optional
    use_peephole : bool
    layout : {"ifco", "icfo"}

    Returns
    -------
    dict
        ``x_grad [T, B, I], cs_prev_grad [B, H], h_prev_grad [B, H],
        w_grad [I + H, 4H], wci_grad, wcf_grad, wco_grad [H], b_grad [4H]``.
    """
    names = ("i", "cs", "f", "o", "ci", "co", "h")
    if not isinstance(outputs, dict):
        outputs = dict(zip(names, outputs))
    i_, cs_, f_, o_, ci_, co_, h_ = (np.asarray(outputs[k], np.float64) for k in names)
    x, cs_prev, h_prev, w, wci, wcf, wco, cs_grad, h_grad = (
        np.asarray(a, np.float64) for a in (x, cs_prev, h_prev, w, wci, wcf, wco, cs_grad, h_grad))
    steps, batch, inputs = x.shape
    units = cs_prev.shape[1]
    seq_len_max = steps if seq_len_max is None else int(seq_len_max)
    peep = _peephole_term(use_peephole)
    g = _gate_slices(units, layout)
    grads = {
        "x_grad": np.zeros_like(x), "w_grad": np.zeros_like(w), "b_grad": np.zeros(4 * units),
        "wci_grad": np.zeros(units), "wcf_grad": np.zeros(units), "wco_grad": np.zeros(units),
    }
    dc = np.zeros((batch, units))
    dh = np.zeros((batch, units))
    for t in range(seq_len_max - 1, -1, -1):
        c_prev = cs_prev if t == 0 else cs_[t - 1]
        h_prev_t = h_prev if t == 0 else h_[t - 1]
        i, cs, f, o, ci, co = i_[t], cs_[t], f_[t], o_[t], ci_[t], co_[t]
        dH = h_grad[t] + dh
        dC = cs_grad[t] + dc
        do = o * (1 - o) * dH * co
        dcs = (1 - co**2) * dH * o + dC + peep(do * wco)
        dci = (1 - ci**2) * dcs * i
        df = f * (1 - f) * dcs * c_prev
        di = i * (1 - i) * dcs * ci
        dG = np.zeros((batch, 4 * units))
        dG[:, g["i"]], dG[:, g["c"]], dG[:, g["f"]], dG[:, g["o"]] = di, dci, df, do
        dc = dcs * f + peep(di * wci + df * wcf)
        dxh = dG @ w.T
        grads["x_grad"][t] = dxh[:, :inputs]
        dh = dxh[:, inputs:]
        grads["w_grad"] += np.concatenate([x[t], h_prev_t], axis=1).T @ dG
        grads["b_grad"] += dG.sum(axis=0)
        grads["wci_grad"] += peep((di * c_prev).sum(axis=0))
        grads["wcf_grad"] += peep((df * c_prev).sum(axis=0))
        grads["wco_grad"] += peep((do * cs).sum(axis=0))
    grads["cs_prev_grad"] = dc
    grads["h_prev_grad"] = dh
    return grads
