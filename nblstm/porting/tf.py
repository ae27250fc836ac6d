"""TensorFlow's names and order of TF1 ``LSTMCell`` variables, for :meth:`nblstm.LSTMCell.set_weights`.

TensorFlow names a cell's variables by their scope: ``rnn/lstm_cell/kernel:0``
(``dynamic_rnn``), ``rnn/multi_rnn_cell/cell_0/lstm_cell/kernel:0``
(``MultiRNNCell``), ``bidirectional_rnn/fw/lstm_cell/w_f_diag:0`` and
``.../bw/...`` (``bidirectional_dynamic_rnn``),
``.../lstm_cell/projection/kernel:0``; checkpoints drop the ``:0``. The
cell's own names are the last part: ``kernel``, ``bias``, ``w_f_diag``,
``w_i_diag``, ``w_o_diag``, ``projection/kernel`` (TensorFlow before 1.2:
``weights``, ``biases``, ``projection/weights``). ``cell.get_weights()`` and
``cell.weights`` list them in that order (:attr:`nblstm.LSTMCell.weight_names`).
"""

import re

__all__ = ["cell_weights", "select", "split_name", "split_scopes"]

# Longest first: "projection/kernel" before "kernel".
_LOCAL = ("projection/kernel", "projection/weights", "kernel", "weights", "bias", "biases", "w_f_diag", "w_i_diag",
          "w_o_diag")
_ALIASES = {"projection/weights": "projection/kernel", "weights": "kernel", "biases": "bias"}
_PLAIN = ("kernel", "bias", "w_f_diag", "w_i_diag", "w_o_diag", "projection/kernel")
_OUTPUT_INDEX = re.compile(r":\d+$")


def split_name(key):
    """``(scope, name)`` of a TensorFlow variable name, ``name`` one of the cell's; ``None`` for other names.

    Examples
    --------
    >>> split_name("rnn/multi_rnn_cell/cell_1/lstm_cell/projection/kernel:0")
    ('rnn/multi_rnn_cell/cell_1/lstm_cell', 'projection/kernel')
    >>> split_name("kernel"), split_name("lstm/lstm_cell/recurrent_kernel:0")
    (('', 'kernel'), None)
    """
    if not isinstance(key, str):
        return None
    base = _OUTPUT_INDEX.sub("", key)
    for local in _LOCAL:
        if base == local or base.endswith("/" + local):
            return base[:-len(local)].rstrip("/"), _ALIASES.get(local, local)
    return None


def _is_scoped(key):
    return isinstance(key, str) and key not in _PLAIN and split_name(key) is not None


def split_scopes(weights):
    """Group TensorFlow-named variables by cell: ``{scope: {name: array}}``, in order of first appearance.

    For the variables of several cells (a ``MultiRNNCell``'s ``cell_0``,
    ``cell_1``, ..., ``bidirectional_dynamic_rnn``'s ``fw`` and ``bw``); each
    group is one cell's, for its ``set_weights``.

    Parameters
    ----------
    weights : dict
        ``{TensorFlow name: array}`` (``":0"`` optional).

    Raises
    ------
    ValueError
        A name that is not a cell variable (an optimizer's slot, a counter,
        a Keras ``recurrent_kernel``), or two names for one variable of a scope.

    Examples
    --------
    >>> import numpy as np
    >>> weights = {f"rnn/multi_rnn_cell/cell_{k}/lstm_cell/{n}:0": np.zeros(1)
    ...            for k in range(2) for n in ("kernel", "bias")}
    >>> {scope: sorted(group) for scope, group in split_scopes(weights).items()}
    {'rnn/multi_rnn_cell/cell_0/lstm_cell': ['bias', 'kernel'],
     'rnn/multi_rnn_cell/cell_1/lstm_cell': ['bias', 'kernel']}
    """
    if not isinstance(weights, dict):
        raise TypeError(f"weights must be a dict {{TensorFlow name: array}}, got {type(weights).__name__}")
    groups, sources = {}, {}
    others = [k for k in weights if split_name(k) is None]
    if others:
        raise ValueError(f"weights has names that are not LSTMCell variables ({', '.join(_PLAIN)}): "
                         f"{[str(k) for k in others]}; pass the cells' variables only")
    for key, a in weights.items():
        scope, name = split_name(key)
        group = groups.setdefault(scope, {})
        if name in group:
            raise ValueError(f"weights has two names for {scope + '/' if scope else ''}{name}: "
                             f"{sources[scope, name]!r} and {key!r}")
        group[name] = a
        sources[scope, name] = key
    return groups


def select(weights, part):
    """The variables of the one cell whose scope contains ``part``: ``"cell_0"``, ``"fw"``, ``"bw/cell_1"``.

    ``part``'s ``/``-separated components must appear in the scope in that
    order (``"bw/cell_1"`` matches ``bidirectional_rnn/bw/multi_rnn_cell/cell_1/lstm_cell``).

    Examples
    --------
    >>> import numpy as np
    >>> weights = {f"bidirectional_rnn/{d}/lstm_cell/{n}:0": np.zeros(1) for d in ("fw", "bw")
    ...            for n in ("kernel", "bias")}
    >>> sorted(select(weights, "bw"))
    ['bias', 'kernel']
    """
    groups = split_scopes(weights)
    wanted = [p for p in str(part).split("/") if p]

    def matches(scope):
        components = iter(scope.split("/"))
        return bool(wanted) and all(any(c == p for c in components) for p in wanted)

    found = [scope for scope in groups if matches(scope)]
    if len(found) != 1:
        raise ValueError(f"{len(found)} scopes of weights contain {part!r} ({found or list(groups)}); pass a part "
                         "that names one cell")
    return groups[found[0]]


def _list_weights(weights, names):
    n, expected = len(weights), len(names)
    if n >= 2 and len(getattr(weights[1], "shape", ())) == 2:
        raise ValueError(f"weights is a list whose second array has shape {tuple(weights[1].shape)}: a Keras layer's "
                         "[kernel, recurrent_kernel(, bias)]? Use nblstm.LSTMCell.from_keras. TensorFlow's order "
                         f"is {names}")
    if n != expected:
        hint = " Does the cell need use_peepholes=True or num_proj?" if n > expected else ""
        raise ValueError(f"weights is a list of {n} arrays; this cell takes {expected}, in TensorFlow's order "
                         f"{names}.{hint}")
    return dict(zip(names, weights))


def _scoped_weights(weights):
    mapped, sources, scopes = {}, {}, {}
    keras = [k for k in weights if isinstance(k, str) and _OUTPUT_INDEX.sub("", k).endswith("recurrent_kernel")]
    if keras:
        raise ValueError(f"weights has Keras variables ({keras[0]!r}): Keras's layout is not TF1's; use "
                         "nblstm.LSTMCell.from_keras or nblstm.LSTM.from_keras")
    for key, a in weights.items():
        parsed = split_name(key)
        if parsed is None:
            mapped[key] = a   # reported as unexpected by the checks
            continue
        scope, name = parsed
        sources.setdefault(name, []).append(key)
        scopes.setdefault(scope, []).append(key)
        mapped[name] = a
    repeated = {name: keys for name, keys in sources.items() if len(keys) > 1}
    if repeated:
        listing = "; ".join(f"{name}: {keys}" for name, keys in repeated.items())
        raise ValueError(f"weights holds the variables of several cells ({listing}): pass one cell's variables "
                         f"(nblstm.porting.tf.select(weights, 'cell_0') or split_scopes(weights)[scope]), or use "
                         f"nblstm.MultiRNNCell.set_weights for a MultiRNNCell")
    if len(scopes) > 1:
        raise ValueError(f"weights mixes the scopes {list(scopes)}; one cell's variables share one scope: pass one "
                         "cell's variables (nblstm.porting.tf.split_scopes(weights))")
    return mapped


def cell_weights(weights, names):
    """``{name: array}`` with the cell's own names, from any form :meth:`nblstm.LSTMCell.set_weights` takes.

    Parameters
    ----------
    weights : dict, list or tuple
        The cell's names; TensorFlow's scoped names (``rnn/lstm_cell/kernel:0``)
        of one cell; or a list in ``names`` order (``tf_cell.get_weights()``).
    names : tuple of str
        The cell's :attr:`~nblstm.LSTMCell.weight_names`.

    Returns
    -------
    dict
        Keyed by the cell's names (unknown names kept, for the cell's checks to report).

    Examples
    --------
    >>> import numpy as np
    >>> sorted(cell_weights({"rnn/lstm_cell/kernel:0": np.zeros((3, 4)), "rnn/lstm_cell/bias:0": np.zeros(4)},
    ...                     ("kernel", "bias")))
    ['bias', 'kernel']
    """
    if isinstance(weights, (list, tuple)):
        return _list_weights(list(weights), tuple(names))
    if isinstance(weights, dict) and any(_is_scoped(k) for k in weights):
        return _scoped_weights(weights)
    return weights
