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
# The attributes of ONNX's LSTM (opsets 7 and 14) and their types (onnx.AttributeProto's names).
_ATTRIBUTE_TYPES = {"activation_alpha": "FLOATS", "activation_beta": "FLOATS", "activations": "STRINGS",
                    "clip": "FLOAT", "direction": "STRING", "hidden_size": "INT", "input_forget": "INT",
                    "layout": "INT"}
_INPUTS = ("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P")
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
    if node.name:
        return repr(node.name)
    return f"<unnamed LSTM #{k}, output {node.output[0]!r}>" if node.output else f"<unnamed LSTM #{k}, no outputs>"


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


def _external_location(tensor, base_dir, where):
    """The checked path of a tensor's external data: a regular file inside the model's folder ``base_dir``.

    Checked here whatever the onnx version: a model file must not make the
    reader open files outside its own folder (``../``, absolute paths, links).
    """
    location = next((e.value for e in tensor.external_data if e.key == "location"), "")
    if base_dir is None:
        raise ValueError(f"{where} keeps its data in an external file ({location!r}), and an in-memory model has no "
                         "folder to read it from: pass the model's path (its external data is read from the model's "
                         "folder), or onnx.load(path) with load_external_data=True")
    outside = (not location or os.path.isabs(location) or os.path.splitdrive(location)[0]
               or ".." in location.replace("\\", "/").split("/"))
    base = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(base, location))
    if outside or os.path.commonpath([base, path]) != base:
        raise ValueError(f"{where} keeps its data in {location!r}, outside the model's folder {base_dir!r}: refused "
                         "(a model's external data must be a file inside its folder)")
    if not os.path.isfile(path):
        raise ValueError(f"{where} keeps its data in {location!r}, which is not a file in the model's folder "
                         f"{base_dir!r}")


def _tensor(onnx, tensor, where, base_dir):
    """A ``TensorProto`` as an array; a malformed one (a corrupt or hostile file) is a ``ValueError`` naming it."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        _external_location(tensor, base_dir, where)
    try:
        return onnx.numpy_helper.to_array(tensor, base_dir or "")
    except Exception as e:  # onnx raises many kinds for a malformed tensor; all of them mean "unreadable"
        raise ValueError(f"{where} is a tensor onnx cannot read: {type(e).__name__}: {e}") from None


def _sparse(onnx, sparse, where, base_dir):
    """A ``SparseTensorProto`` as a dense array (``indices`` linear ``[NNZ]`` or coordinates ``[NNZ, rank]``)."""
    values = _tensor(onnx, sparse.values, where, base_dir)
    indices = _tensor(onnx, sparse.indices, where, base_dir)
    dims = tuple(int(d) for d in sparse.dims)
    try:
        dense = np.zeros(int(np.prod(dims, dtype=np.int64)), values.dtype)
        flat = indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), dims)
        dense[flat] = values
        return dense.reshape(dims)
    except (ValueError, TypeError, IndexError, MemoryError) as e:
        raise ValueError(f"{where} is a sparse tensor onnx cannot read: {type(e).__name__}: {e}") from None


# Constant's attributes other than "value" (a tensor) and "sparse_value": a scalar or a list, as NumPy arrays.
_CONSTANT_FORMS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64,
                   "value_ints": np.int64}


def _constant_node(onnx, node, where, base_dir):
    """The value of a ``Constant`` node, whichever of its attributes holds it."""
    for attr in node.attribute:
        if attr.name == "value":
            return _tensor(onnx, attr.t, where, base_dir)
        if attr.name == "sparse_value":
            return _sparse(onnx, attr.sparse_tensor, where, base_dir)
        if attr.name in _CONSTANT_FORMS:
            return np.array(onnx.helper.get_attribute_value(attr), _CONSTANT_FORMS[attr.name])
    names = [a.name for a in node.attribute]
    raise ValueError(f"{where} is the Constant node {node.name!r} with attributes {names}; nblstm reads numbers "
                     f"(value, sparse_value, {', '.join(_CONSTANT_FORMS)})")


def _constant(onnx, value_name, chain, weights, node_label, weight=True, base_dir=None):
    """The constant value ``value_name`` of the graphs in ``chain`` (or of ``weights``), or ``None``.

    A ``weight`` computed by another node is refused; anything else computed
    (or an input of a graph) is ``None``.
    """
    where = f"input {value_name!r} of LSTM node {node_label}"
    if weights is not None and value_name in weights:
        if weight:
            return convert._array(weights[value_name], f"weights[{value_name!r}]")
        return np.asarray(weights[value_name])
    for graph in chain:
        for init in graph.initializer:
            if init.name == value_name:
                return _tensor(onnx, init, where, base_dir)
        for init in getattr(graph, "sparse_initializer", ()):
            if init.values.name == value_name:  # a sparse initializer has the name of its values
                return _sparse(onnx, init, where, base_dir)
        for producer in graph.node:
            if value_name in producer.output:
                if producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
                    return _constant_node(onnx, producer, where, base_dir)
                if not weight:
                    return None
                raise ValueError(f"input {value_name!r} of LSTM node {node_label} is computed by a "
                                 f"{producer.op_type} node ({producer.name!r}), not a constant: export the model "
                                 "with constant folding, or pass weights={name: array}")
        # A graph input is given at run time, and in a subgraph it hides the outer graphs' values of its name.
        if any(i.name == value_name for i in getattr(graph, "input", ())):
            return None
    return None


def _shown(a):
    """A constant's values for a message: all of them when few, else the first ones and the shape."""
    flat = a.ravel().tolist()
    if len(flat) <= 16:
        return str(a.tolist())
    return f"[{', '.join(str(x) for x in flat[:8])}, ...] (shape {a.shape})"


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
        (``If``, ``Loop``, ``Scan`` bodies) are found too. A file's format
        is onnx's choice by its extension (``.onnx``: protobuf); its
        external data is read only for the node's weights, and only from
        regular files inside the file's folder.
    name : str, optional
        The node to read (its ``name``, or the name of its first output);
        required when there are several.
    weights : dict, optional
        ``{input name: array}``: values of the node's inputs (``W``, ``R``,
        ``B``, ``P``), used before the graph's initializers (sparse ones
        too) and ``Constant`` nodes; required for a bare node.

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
        A file that is not an ONNX model (empty, truncated, corrupt, another
        format; the message names the file, as every message about a file
        does); no LSTM node, several without ``name``, an unknown ``name``;
        ``clip`` (ONNX clips every gate's pre-activation; nblstm has no such
        clip); ``input_forget=1``; activations nblstm lacks (gates other than
        Sigmoid or HardSigmoid(1/6, 0.5), ``g`` and ``h`` that differ);
        attributes ONNX's LSTM does not have, or of another type; more than
        8 inputs; weights that are not constants; a constant
        ``sequence_lens`` or a nonzero constant ``initial_h`` or
        ``initial_c`` (the layer keeps no lengths and no state: the message
        gives the values, to pass when calling the layer, and the input to
        clear to read the node); external data outside the file's folder, or
        of an in-memory model; misshapen or unreadable tensors.
    TypeError
        Weights of mixed dtypes, or of a dtype other than float16, float32
        and float64.
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
    if weights is not None and not isinstance(weights, dict):
        raise TypeError(f"weights must be a dict {{input name: array}}, got {type(weights).__name__}")
    if not isinstance(model_or_node, (str, os.PathLike)):
        return _read(onnx, model_or_node, name, weights, "model_or_node", None)
    path = os.fsdecode(os.fspath(model_or_node))
    what = repr(path)
    model = _load(onnx, path, what)
    try:
        return _read(onnx, model, name, weights, what, os.path.dirname(os.path.abspath(path)))
    except (ValueError, TypeError) as e:  # whatever is wrong with a file names the file
        if what in str(e):
            raise
        raise (TypeError if isinstance(e, TypeError) else ValueError)(f"{what}: {e}") from None


def _load(onnx, path, what):
    """The ``ModelProto`` of the file ``path``; what is not a model is a ``ValueError`` naming the file.

    The external data stays unread: :func:`_tensor` reads the node's own
    tensors, checked to lie in the model's folder.
    """
    try:
        model = onnx.load(path, load_external_data=False)
    except OSError:
        raise
    except Exception as e:  # protobuf's DecodeError, the text formats' ParseError, UnicodeDecodeError: not a model
        raise ValueError(f"{what} is not an ONNX model onnx can read (truncated, corrupt or another format): "
                         f"{type(e).__name__}: {e}") from None
    if not model.HasField("graph"):
        reason = "the file is empty" if os.path.getsize(path) == 0 else "it has no graph"
        raise ValueError(f"{what} is not an ONNX model: {reason}")
    return model


def _read(onnx, obj, name, weights, what, base_dir):
    """:func:`read` of a model, graph or node; ``what`` names it in messages, ``base_dir`` is a file's folder."""
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
    names = [a.name for a in node.attribute]
    unknown = sorted(set(names) - set(_ATTRIBUTE_TYPES))
    if unknown:
        raise ValueError(f"LSTM node {label} has attributes nblstm does not know: {unknown}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"LSTM node {label} has the attributes {twice} more than once")
    kinds = onnx.AttributeProto.AttributeType
    for a in node.attribute:  # a value of another type would be misread (a STRING hidden_size, an INT activations)
        expected = _ATTRIBUTE_TYPES[a.name]
        if a.type != kinds.Value(expected):
            found = kinds.Name(a.type) if a.type in kinds.values() else a.type
            raise ValueError(f"LSTM node {label} has the attribute {a.name} of type {found}; ONNX's LSTM defines "
                             f"it as {expected}")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}

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
    if len(node.input) > len(_INPUTS):
        raise ValueError(f"LSTM node {label} has {len(node.input)} inputs; ONNX's LSTM has {len(_INPUTS)} "
                         f"({', '.join(_INPUTS)})")
    inputs = list(node.input) + [""] * (len(_INPUTS) - len(node.input))

    def value(index, input_name, required):
        value_name = inputs[index]
        if not value_name:
            if required:
                raise ValueError(f"LSTM node {label} has no input {input_name}")
            return None
        weight = input_name in ("W", "R", "B", "P")
        a = _constant(onnx, value_name, chain, weights, label, weight=weight, base_dir=base_dir)
        if a is None:
            if weight:
                source = "weights" if graph is None else "the graph's initializers or Constant nodes"
                raise ValueError(f"input {input_name} ({value_name!r}) of LSTM node {label} is not in {source}"
                                 + ("; pass weights={name: array}" if graph is None else ""))
            return None
        return a

    W, R = value(1, "W", True), value(2, "R", True)
    B, P = value(3, "B", False), value(7, "P", False)
    # The layer keeps no lengths and no state: a constant one would be dropped, so it is refused, with the call
    # that gives the node's results.
    lengths = value(4, "sequence_lens", False)
    if lengths is not None:
        shown = _shown(lengths)
        call = f"sequence_length={shown}" if lengths.size <= 16 else "sequence_length=<these lengths>"
        raise ValueError(f"LSTM node {label} has a constant sequence_lens ({inputs[4]!r} = {shown}): nblstm.LSTM "
                         f"keeps no lengths. Pass them when calling the layer, lstm(X, {call}), and read the node "
                         "without them (clear its input: node.input[4] = '')")
    for index, state_name in ((5, "initial_h"), (6, "initial_c")):
        state = value(index, state_name, False)
        if state is not None and np.any(state):
            raise ValueError(f"LSTM node {label} has a nonzero constant {state_name} ({inputs[index]!r}): "
                             "nblstm.LSTM keeps no state. Pass it when calling the layer, lstm(X, (initial_h, "
                             f"initial_c)), and read the node without it (clear its input: node.input[{index}] = '')")
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
    if W.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"the weights of LSTM node {label} have dtype {W.dtype}; nblstm computes in float16, float32 "
                        "and float64")
    cells = [convert.onnx_to_lstmcell(W[d], R[d], None if B is None else B[d], None if P is None else P[d])
             for d in range(directions)]
    config = layer_config(input_size=W.shape[2], hidden_size=units, num_layers=1, bidirectional=directions == 2,
                          dtype=W.dtype, bias=B is not None, batch_first=layout == 1, use_peepholes=P is not None,
                          activation=activation, recurrent_activation=recurrent)
    if direction == "reverse":
        config["reverse"] = True
    return config, cells
