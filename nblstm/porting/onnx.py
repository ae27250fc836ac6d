"""ONNX ``LSTM`` nodes as ``nblstm.LSTM`` keywords and cell weights (needs the ``onnx`` package, imported here only).

Layout of the node's inputs (``D = 2`` for ``direction="bidirectional"``,
gate blocks ``i, o, f, c`` along the ``4H`` rows):

=====================  ==============  =====================================================
input                  shape           cell weights of direction ``d``
=====================  ==============  =====================================================
``W``                  ``[D, 4H, I]``  ``kernel[:I] = perm(W[d].T)``
``R``                  ``[D, 4H, H]``  ``kernel[I:] = perm(R[d].T)``
``B`` (optional)       ``[D, 8H]``     ``bias = perm(B[d, :4H] + B[d, 4H:])`` (``Wb + Rb``)
``P`` (optional)       ``[D, 3H]``     ``w_i_diag, w_o_diag, w_f_diag = P[d, :H], [H:2H], [2H:]``
=====================  ==============  =====================================================

``perm`` takes the blocks ``i, o, f, c`` to ``i, c, f, o``
(:func:`nblstm.convert.onnx_to_lstmcell`). ONNX's peepholes act as TF1's:
``P_i * c_prev`` on ``i``, ``P_f * c_prev`` on ``f``, ``P_o * c`` on ``o``.
"""

import os

import numpy as np

from .. import convert
from ._common import layer_config

__all__ = ["read"]

# ONNX activation -> (alphas consumed, betas consumed, default alpha, default beta), as onnxruntime reads
# activation_alpha / activation_beta: in order, one value per parameter an activation takes.
_PARAMETERS = {"affine": (1, 1, 1.0, 0.0), "leakyrelu": (1, 0, 0.01, 0.0), "thresholdedrelu": (1, 0, 1.0, 0.0),
               "scaledtanh": (1, 1, 1.0, 1.0), "hardsigmoid": (1, 1, 0.2, 0.5), "elu": (1, 0, 1.0, 0.0)}
# ONNX activations of g and h with nblstm's names (with the parameters they need).
_ACTIVATIONS = {"tanh": "tanh", "relu": "relu", "sigmoid": "sigmoid", "softsign": "softsign", "softplus": "softplus"}
_KERAS_HARD_SIGMOID = (1 / 6, 0.5)
_ATTRIBUTES = ("activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size",
               "input_forget", "layout")
_DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _import_onnx():
    try:
        import onnx
    except ImportError:
        raise ImportError("reading ONNX models needs the onnx package (pip install onnx)") from None
    return onnx


def _lstm_nodes(graph, parents=()):
    """Every LSTM node of ``graph`` and its subgraphs, with the graphs whose values it sees (innermost first)."""
    chain = (graph, *parents)
    found = []
    for node in graph.node:
        if node.op_type == "LSTM" and node.domain in ("", "ai.onnx"):
            found.append((node, chain))
        for attr in node.attribute:
            subgraphs = list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])
            for sub in subgraphs:
                found.extend(_lstm_nodes(sub, chain))
    return found


def _op_types(graph):
    return sorted({n.op_type for n in graph.node})


def _label(node, k):
    return repr(node.name) if node.name else f"<unnamed LSTM #{k}, output {node.output[0]!r}>"


def _select(nodes, name, what):
    if name is not None:
        picked = [(n, c) for n, c in nodes if n.name == name]
        if not picked:
            picked = [(n, c) for n, c in nodes if n.output and n.output[0] == name]
        if not picked:
            raise ValueError(f"{what} has no LSTM node named {name!r}; its LSTM nodes are "
                             f"{', '.join(_label(n, k) for k, (n, _) in enumerate(nodes))}")
        if len(picked) > 1:
            raise ValueError(f"{what} has {len(picked)} LSTM nodes named {name!r}")
        return picked[0]
    if len(nodes) > 1:
        labels = ", ".join(_label(n, k) for k, (n, _) in enumerate(nodes))
        raise ValueError(f"{what} has {len(nodes)} LSTM nodes ({labels}): pass name= to select one (nblstm reads "
                         "one node; stack several by hand)")
    return nodes[0]


def _constant(onnx, value_name, chain, weights, node_label, weight=True):
    """The constant value ``value_name`` of the graphs in ``chain`` (or of ``weights``), or ``None``.

    A ``weight`` computed by another node is refused; anything else computed is ``None``.
    """
    if weights is not None and value_name in weights:
        return convert._array(weights[value_name], f"weights[{value_name!r}]")
    for graph in chain:
        for init in graph.initializer:
            if init.name == value_name:
                return onnx.numpy_helper.to_array(init)
        for producer in graph.node:
            if value_name in producer.output:
                if producer.op_type == "Constant":
                    for attr in producer.attribute:
                        if attr.name == "value":
                            return onnx.numpy_helper.to_array(attr.t)
                if not weight:
                    return None
                raise ValueError(f"input {value_name!r} of LSTM node {node_label} is computed by a "
                                 f"{producer.op_type} node ({producer.name!r}), not a constant: export the model "
                                 "with constant folding, or pass weights={name: array}")
    return None


def _is_keras_hard_sigmoid(alpha, beta):
    """Whether HardSigmoid(alpha, beta) is Keras 3's hard_sigmoid, ``x / 6 + 0.5`` clipped (within float32)."""
    return abs(alpha - _KERAS_HARD_SIGMOID[0]) <= 1e-7 and abs(beta - _KERAS_HARD_SIGMOID[1]) <= 1e-7


def _activations(values, alphas, betas, directions, label):
    """``(activation, recurrent_activation)`` of the node's ``activations`` and their parameters."""
    if values is None:
        values = ["Sigmoid", "Tanh", "Tanh"] * directions
    if len(values) != 3 * directions:
        raise ValueError(f"LSTM node {label} has activations={values}; expected {3 * directions} (f, g, h per "
                         "direction)")
    alphas, betas = list(alphas or []), list(betas or [])
    parsed = []
    for value in values:
        key = value.lower()
        n_alpha, n_beta, alpha, beta = _PARAMETERS.get(key, (0, 0, None, None))
        if n_alpha and alphas:
            alpha = alphas.pop(0)
        if n_beta and betas:
            beta = betas.pop(0)
        parsed.append((key, value, alpha, beta))
    triples = [parsed[3 * d:3 * d + 3] for d in range(directions)]
    if directions == 2 and [p[:1] + p[2:] for p in triples[0]] != [p[:1] + p[2:] for p in triples[1]]:
        raise ValueError(f"LSTM node {label} has activations={values}: the two directions differ; nblstm.LSTM's "
                         "directions share their activations")
    (f_key, f_name, f_alpha, f_beta), (g_key, g_name, g_alpha, g_beta), (h_key, h_name, h_alpha, h_beta) = triples[0]
    if f_key == "sigmoid":
        recurrent = "sigmoid"
    elif f_key == "hardsigmoid" and _is_keras_hard_sigmoid(f_alpha, f_beta):
        recurrent = "hard_sigmoid"
    else:
        detail = f" (alpha={f_alpha}, beta={f_beta})" if f_alpha is not None else ""
        raise ValueError(f"LSTM node {label} has activations={values}: the gate activation f = {f_name}{detail} is "
                         "not supported; nblstm has Sigmoid and HardSigmoid with alpha=1/6, beta=0.5 (Keras 3's "
                         "hard_sigmoid)")
    if (g_key, g_alpha, g_beta) != (h_key, h_alpha, h_beta):
        raise ValueError(f"LSTM node {label} has activations={values}: g = {g_name} and h = {h_name} differ; "
                         "nblstm uses one activation for both")
    if g_key in _ACTIVATIONS:
        activation = _ACTIVATIONS[g_key]
    elif g_key == "elu" and g_alpha == 1.0:
        activation = "elu"
    elif g_key == "hardsigmoid" and _is_keras_hard_sigmoid(g_alpha, g_beta):
        activation = "hard_sigmoid"
    elif g_key == "affine" and (g_alpha, g_beta) == (1.0, 0.0):
        activation = "linear"
    else:
        detail = f" (alpha={g_alpha}, beta={g_beta})" if g_alpha is not None else ""
        raise ValueError(f"LSTM node {label} has activations={values}: g = h = {g_name}{detail} is not supported; "
                         "nblstm has Tanh, Relu, Sigmoid, Elu (alpha=1), Softsign, Softplus, HardSigmoid (alpha=1/6, "
                         "beta=0.5) and Affine (alpha=1, beta=0)")
    return activation, recurrent


def read(model_or_node, name=None, weights=None):
    """The configuration and cell weights of an ONNX ``LSTM`` node (forward, reverse or bidirectional).

    Parameters
    ----------
    model_or_node : ModelProto, GraphProto, NodeProto, str or os.PathLike
        A model, a graph, the path of a ``.onnx`` file, or a node (its
        weights then come from ``weights``). LSTM nodes inside subgraphs
        (``If``, ``Loop``, ``Scan`` bodies) are found too.
    name : str, optional
        The node to read (its ``name``, or the name of its first output);
        required when there are several.
    weights : dict, optional
        ``{input name: array}``: values of the node's inputs (``W``, ``R``,
        ``B``, ``P``), used before the graph's initializers and
        ``Constant`` nodes; required for a bare node.

    Returns
    -------
    tuple
        ``(config, cells)``: ``config`` the ``nblstm.LSTM`` keyword arguments
        (``num_layers=1``; ``batch_first`` from ``layout``; ``bias`` whether
        ``B`` is given; ``use_peepholes`` whether ``P`` is; the activations),
        ``cells`` one cell-weight dict per direction (forward first). A
        ``direction="reverse"`` node gives one cell and the extra key
        ``config["reverse"] = True``: it runs each sequence reversed within
        its length and returns its outputs in input order.

    Raises
    ------
    ValueError
        No LSTM node, several without ``name``, an unknown ``name``;
        ``clip`` (ONNX clips every gate's pre-activation; nblstm has no such
        clip); ``input_forget=1``; activations nblstm lacks (gates other than
        Sigmoid or HardSigmoid(1/6, 0.5), ``g`` and ``h`` that differ);
        weights that are not constants; a nonzero constant ``initial_h`` or
        ``initial_c`` (pass the state when calling the layer instead);
        misshapen inputs.
    ImportError
        The ``onnx`` package is missing.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import helper
    >>> from nblstm.porting import onnx as porting_onnx
    >>> rng = np.random.default_rng(0)
    >>> W, R = rng.standard_normal((1, 8, 3)), rng.standard_normal((1, 8, 2))   # H = 2, I = 3
    >>> node = helper.make_node("LSTM", ["X", "W", "R"], ["Y"], hidden_size=2, name="lstm")
    >>> config, cells = porting_onnx.read(node, weights={"W": W, "R": R})
    >>> config["hidden_size"], config["bias"], cells[0]["kernel"].shape
    (2, False, (5, 8))
    """
    onnx = _import_onnx()
    obj = model_or_node
    what = "model_or_node"
    if isinstance(obj, (str, os.PathLike)):
        what = repr(os.fspath(obj))
        obj = onnx.load(os.fspath(obj))
    if weights is not None and not isinstance(weights, dict):
        raise TypeError(f"weights must be a dict {{input name: array}}, got {type(weights).__name__}")
    if hasattr(obj, "graph") and hasattr(obj.graph, "node"):
        graph = obj.graph
    elif hasattr(obj, "node") and hasattr(obj, "initializer"):
        graph = obj
    elif hasattr(obj, "op_type"):
        graph = None
        if obj.op_type != "LSTM":
            raise ValueError(f"model_or_node is a {obj.op_type} node; nblstm converts LSTM nodes only")
        if name is not None and name not in (obj.name, *obj.output[:1]):
            raise ValueError(f"name={name!r} but model_or_node is the LSTM node {obj.name!r}")
    else:
        raise TypeError(f"model_or_node must be an onnx ModelProto, GraphProto, NodeProto or a path to a .onnx "
                        f"file, got {type(obj).__name__}")
    if graph is not None:
        nodes = _lstm_nodes(graph)
        if not nodes:
            raise ValueError(f"{what} has no LSTM node; its op types are {_op_types(graph)}")
        node, chain = _select(nodes, name, what)
    else:
        node, chain = obj, ()
    label = _label(node, 0)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    unknown = sorted(set(attrs) - set(_ATTRIBUTES))
    if unknown:
        raise ValueError(f"LSTM node {label} has attributes nblstm does not know: {unknown}")

    def text(value):
        return value.decode() if isinstance(value, bytes) else str(value)

    if "clip" in attrs:
        raise ValueError(f"LSTM node {label} has clip={attrs['clip']}: ONNX clips every gate's pre-activation to "
                         "[-clip, clip], which nblstm does not do")
    if attrs.get("input_forget", 0):
        raise ValueError(f"LSTM node {label} has input_forget={attrs['input_forget']} (coupled input and forget "
                         "gates), which nblstm does not have")
    direction = text(attrs.get("direction", b"forward"))
    if direction not in _DIRECTIONS:
        raise ValueError(f"LSTM node {label} has direction={direction!r}; expected one of {tuple(_DIRECTIONS)}")
    directions = _DIRECTIONS[direction]
    layout = int(attrs.get("layout", 0))
    if layout not in (0, 1):
        raise ValueError(f"LSTM node {label} has layout={layout}; ONNX defines 0 ([T, B, I]) and 1 ([B, T, I])")
    activations = [text(a) for a in attrs["activations"]] if "activations" in attrs else None
    activation, recurrent = _activations(activations, attrs.get("activation_alpha"), attrs.get("activation_beta"),
                                         directions, label)
    inputs = list(node.input) + [""] * (8 - len(node.input))

    def value(index, input_name, required):
        value_name = inputs[index]
        if not value_name:
            if required:
                raise ValueError(f"LSTM node {label} has no input {input_name}")
            return None
        weight = input_name in ("W", "R", "B", "P")
        a = _constant(onnx, value_name, chain, weights, label, weight=weight)
        if a is None:
            if weight:
                source = "weights" if graph is None else "the graph's initializers or Constant nodes"
                raise ValueError(f"input {input_name} ({value_name!r}) of LSTM node {label} is not in {source}"
                                 + ("; pass weights={name: array}" if graph is None else ""))
            return None
        return a

    W, R = value(1, "W", True), value(2, "R", True)
    B, P = value(3, "B", False), value(7, "P", False)
    for index, state_name in ((5, "initial_h"), (6, "initial_c")):
        state = value(index, state_name, False)
        if state is not None and np.any(state):
            raise ValueError(f"LSTM node {label} has a nonzero constant {state_name}: pass the initial state when "
                             "calling the layer (hx) instead")
    if W.ndim != 3 or W.shape[0] != directions or W.shape[1] % 4 or W.shape[1] == 0:
        raise ValueError(f"input W of LSTM node {label} has shape {W.shape}; expected [{directions}, 4H, I] "
                         f"(direction={direction!r})")
    units = W.shape[1] // 4
    if "hidden_size" in attrs and attrs["hidden_size"] != units:
        raise ValueError(f"LSTM node {label} has hidden_size={attrs['hidden_size']} but W has shape {W.shape}")
    for input_name, a, shape in (("R", R, (directions, 4 * units, units)), ("B", B, (directions, 8 * units)),
                                 ("P", P, (directions, 3 * units))):
        if a is not None and a.shape != shape:
            raise ValueError(f"input {input_name} of LSTM node {label} has shape {a.shape}; expected {shape}")
    dtypes = {a.dtype for a in (W, R, B, P) if a is not None}
    if len(dtypes) > 1:
        raise TypeError(f"the inputs of LSTM node {label} mix dtypes {sorted(d.name for d in dtypes)}")
    cells = [convert.onnx_to_lstmcell(W[d], R[d], None if B is None else B[d], None if P is None else P[d])
             for d in range(directions)]
    config = layer_config(input_size=W.shape[2], hidden_size=units, num_layers=1, bidirectional=directions == 2,
                          dtype=W.dtype, bias=B is not None, batch_first=layout == 1, use_peepholes=P is not None,
                          activation=activation, recurrent_activation=recurrent)
    if direction == "reverse":
        config["reverse"] = True
    return config, cells
