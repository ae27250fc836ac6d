"""Keras ``LSTM`` and ``Bidirectional(LSTM)`` layers and their stacks as ``nblstm.LSTM`` keywords and cell weights.

Keras is not imported: a layer is read through ``type(layer).__name__``,
``get_config()`` and ``get_weights()``, a model through ``.layers``; the
serialized form ``{"class_name": "LSTM", "config": layer.get_config(),
"weights": layer.get_weights()}`` (a ``Bidirectional``'s ``"weights"``: the
forward layer's, then the backward layer's) needs no Keras at all.

Layout (gates ``i, f, c, o`` along the ``4H`` columns):

=========================  ===========  ================================================
Keras weight               shape        cell weights
=========================  ===========  ================================================
``kernel``                 ``[I, 4H]``  ``kernel[:I] = ifco_to_icfo(kernel)``
``recurrent_kernel``       ``[H, 4H]``  ``kernel[I:] = ifco_to_icfo(recurrent_kernel)``
``bias`` (``use_bias``)    ``[4H]``     ``bias = ifco_to_icfo(bias)``
=========================  ===========  ================================================

Keras layers are batch-major: the configuration has ``batch_first=True``.
"""

import sys
from collections.abc import Mapping

import numpy as np

from .. import convert
from ._common import (
    activation_names,
    as_array,
    check_activation,
    check_bool,
    check_recurrent_activation,
    checked_cells,
    layer_config,
    option,
)

__all__ = ["read", "read_cell", "read_layers", "write"]

_LSTM_LAYERS = ("LSTM", "CuDNNLSTM")  # Keras 2's CuDNNLSTM: an LSTM whose variables cuDNN reads in its own way
_RNN_LAYERS = ("GRU", "SimpleRNN", "RNN", "CuDNNGRU", "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D")
# Layers that may sit between two recurrent layers of a model: the identity at inference.
_PASS_THROUGH = ("Dropout", "SpatialDropout1D", "GaussianDropout", "GaussianNoise", "AlphaDropout",
                 "ActivityRegularization")
_SKIP = ("InputLayer",)


def _is_array(value):
    return isinstance(value, np.ndarray) or (hasattr(value, "shape") and hasattr(value, "dtype")
                                             and not hasattr(value, "get_config"))


def _keras_major(obj):
    """Keras's major version of a layer object (from its package), or ``None``."""
    root = type(obj).__module__.split(".")[0]
    version = getattr(sys.modules.get(root), "__version__", None)
    if root == "tf_keras":
        return 2
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def _entry(obj, where):
    """A layer as ``{"class_name", "config", "weights", "keras_major"}``."""
    if isinstance(obj, Mapping):
        missing = [k for k in ("class_name", "config") if k not in obj]
        if missing:
            raise ValueError(f"{where} is a dict without {missing}: a serialized Keras layer is "
                             "{'class_name': ..., 'config': layer.get_config(), 'weights': layer.get_weights()}")
        major = obj.get("keras_major")
        version = obj.get("keras_version")
        if major is None and version is not None:
            major = int(str(version).split(".")[0])
        return {"class_name": str(obj["class_name"]), "config": dict(obj["config"]),
                "weights": list(obj.get("weights") or []), "keras_major": major, "where": where}
    if hasattr(obj, "get_config") and hasattr(obj, "get_weights"):
        return {"class_name": type(obj).__name__, "config": obj.get_config(), "weights": list(obj.get_weights()),
                "keras_major": _keras_major(obj), "where": where}
    raise TypeError(f"{where} must be a Keras LSTM or Bidirectional(LSTM) layer, a model, a list of layers or a "
                    f"serialized layer dict, got {type(obj).__name__}")


def _recurrent(entries, what):
    """The recurrent layers among ``entries`` (a model's or a list's layers), which must follow each other.

    Layers before the first and after the last are left out; only dropout and noise layers (the identity at
    inference) may sit between two.
    """
    found, gap = [], None
    for entry in entries:
        kind = entry["class_name"]
        if kind in _SKIP:
            continue
        if kind in (*_LSTM_LAYERS, "Bidirectional", *_RNN_LAYERS):
            if gap is not None:
                raise ValueError(f"{what} has a {gap['class_name']} layer ({gap['where']}) between its recurrent "
                                 "layers; nblstm stacks LSTM layers that follow each other")
            found.append(entry)
        elif found and kind not in _PASS_THROUGH and gap is None:
            gap = entry
    if not found:
        raise ValueError(f"{what} has no LSTM or Bidirectional layer; its layers are "
                         f"{[e['class_name'] for e in entries]}")
    return found


def _entries(obj):
    """The recurrent layers of ``obj`` (a layer, model, list, weight list or dict), in order."""
    if isinstance(obj, (list, tuple)):
        if obj and all(_is_array(a) for a in obj):
            return [_bare_weights(list(obj))]
        if not obj:
            raise ValueError("layer_or_model is an empty list")
        return _recurrent([_entry(item, f"layer_or_model[{k}]") for k, item in enumerate(obj)], "layer_or_model")
    name = type(obj).__name__
    if not isinstance(obj, Mapping) and name not in (*_LSTM_LAYERS, "Bidirectional", *_RNN_LAYERS) \
            and hasattr(obj, "layers"):
        entries = [_entry(layer, f"layer_or_model.layers[{k}]") for k, layer in enumerate(obj.layers)]
        return _recurrent(entries, f"layer_or_model ({name})")
    return [_entry(obj, "layer_or_model")]


def _bare_weights(weights):
    """A bare weight list: one LSTM (2 or 3 arrays) or one Bidirectional (4 or 6), Keras's default options."""
    n = len(weights)
    shapes = [np.shape(a) for a in weights]
    if n in (2, 3):
        has_bias = n == 3
        bidirectional = False
    elif n in (4, 6):
        has_bias = n == 6
        bidirectional = True
    else:
        raise ValueError(f"layer_or_model is a list of {n} arrays; a Keras LSTM's get_weights() has 2 or 3 "
                         "(kernel, recurrent_kernel, bias) and a Bidirectional's 4 or 6 (forward, then backward)")
    units = shapes[1][0] if len(shapes[1]) == 2 else 0
    config = {"units": units, "use_bias": has_bias, "return_sequences": True}
    if bidirectional:
        layer = {"class_name": "LSTM", "config": config}
        return {"class_name": "Bidirectional", "config": {"layer": layer, "merge_mode": "concat"}, "weights": weights,
                "keras_major": None, "where": "layer_or_model"}
    return {"class_name": "LSTM", "config": config, "weights": weights, "keras_major": None, "where": "layer_or_model"}


def _activation(value, what, where):
    if value is None:
        return "linear"
    if isinstance(value, Mapping):  # {"class_name": "function", "config": "tanh", ...} (older Keras)
        inner = value.get("config")
        value = inner if isinstance(inner, str) else value.get("class_name")
    if callable(value) and not isinstance(value, str):
        value = getattr(value, "__name__", value)
    try:
        return check_activation(value, what)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _dtype_policy(value, where):
    """Refuse a mixed-precision policy: Keras computes such a layer in float16 from float32 weights."""
    if isinstance(value, Mapping):
        value = (value.get("config") or {}).get("name") if isinstance(value.get("config"), Mapping) else None
    if isinstance(value, str) and value.startswith("mixed_"):
        raise ValueError(f"{where} has the dtype policy {value!r}: Keras computes it in "
                         f"{value.split('_', 1)[1]} from float32 weights, which nblstm does not reproduce; convert "
                         "a copy of the model built with a float32 policy")


def _lstm(entry, config, weights, where):
    """One Keras LSTM (or CuDNNLSTM): its options and its cell weights (ICFO, ``forget_bias=0``).

    Every option of the layer's configuration is read: those that change its
    results are honoured or refused; the rest only matter in training or for
    the initial weights (initializers, regularizers, constraints,
    ``dropout``, ``recurrent_dropout``, ``unit_forget_bias``, ``seed``,
    ``trainable``) or choose among implementations of the same maths
    (``unroll``, ``implementation``, ``use_cudnn``), or what the call
    returns (``return_state``).
    """
    class_name = config.get("__class_name__", "LSTM")
    if class_name not in _LSTM_LAYERS:
        raise ValueError(f"from_keras got a {class_name} layer ({where}); nblstm converts LSTM layers only")
    cudnn = class_name == "CuDNNLSTM"
    _dtype_policy(config.get("dtype"), where)
    major = entry["keras_major"]
    if major is None and "time_major" in config:  # Keras 2 writes time_major, Keras 3 has none
        major = 2
    if config.get("time_major"):
        raise ValueError(f"{where} has time_major=True; nblstm reads Keras layers batch-major (batch_first=True): "
                         "build the layer with time_major=False")
    if config.get("stateful"):
        raise ValueError(f"{where} has stateful=True; nblstm keeps no state between calls: pass the state as hx")
    activation = _activation(config.get("activation", "tanh"), "activation", where)
    recurrent = config.get("recurrent_activation", "sigmoid")
    if isinstance(recurrent, Mapping):
        recurrent = recurrent.get("config") if isinstance(recurrent.get("config"), str) else recurrent
    try:
        recurrent = check_recurrent_activation(recurrent, "recurrent_activation")
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if recurrent == "hard_sigmoid" and major is not None and major < 3:
        raise ValueError(f"{where} has recurrent_activation='hard_sigmoid' from Keras {major} (0.2 * x + 0.5, "
                         "clipped); nblstm's is Keras 3's (x / 6 + 0.5, clipped)")
    units = config.get("units")
    use_bias = bool(config.get("use_bias", True)) or cudnn
    count = 3 if use_bias else 2
    if not weights:
        raise ValueError(f"{where} has no weights yet: build the layer (or call it once) first")
    if len(weights) != count:
        raise ValueError(f"{where} has {len(weights)} weights; an LSTM with use_bias={use_bias} has {count} "
                         "(kernel, recurrent_kernel" + (", bias)" if use_bias else ")"))
    kernel = as_array(weights[0], f"{where} kernel")
    recurrent_kernel = as_array(weights[1], f"{where} recurrent_kernel")
    bias = as_array(weights[2], f"{where} bias") if use_bias else None
    if cudnn:
        try:
            kernel, recurrent_kernel, bias = convert.keras_cudnn_to_keras(kernel, recurrent_kernel, bias)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    if units is None:
        units = recurrent_kernel.shape[0] if recurrent_kernel.ndim == 2 else 0
    units = int(units)
    if kernel.ndim != 2 or kernel.shape[1] != 4 * units or recurrent_kernel.shape != (units, 4 * units) \
            or (bias is not None and bias.shape != (4 * units,)):
        raise ValueError(f"{where} has weights of shapes {[np.shape(a) for a in weights]}; an LSTM with units={units} "
                         f"has kernel [I, {4 * units}], recurrent_kernel [{units}, {4 * units}], bias [{4 * units}]")
    if bias is not None and bias.dtype != kernel.dtype or recurrent_kernel.dtype != kernel.dtype:
        raise TypeError(f"{where} has weights of different dtypes")
    cell = convert.keras_to_lstmcell(kernel, recurrent_kernel, bias, forget_bias=0.0)
    return {"units": units, "input_size": kernel.shape[0], "activation": activation, "recurrent_activation": recurrent,
            "use_bias": use_bias, "return_sequences": bool(config.get("return_sequences", False)),
            "go_backwards": bool(config.get("go_backwards", False)),
            "zero_output_for_mask": bool(config.get("zero_output_for_mask", False)), "cell": cell,
            "dtype": kernel.dtype}


def _inner(serialized, what, where):
    """The config of a layer nested in a Bidirectional's config, tagged with its class name."""
    if not isinstance(serialized, Mapping) or "config" not in serialized:
        raise ValueError(f"{where}: config[{what!r}] must be a serialized layer {{'class_name', 'config'}}")
    return {**serialized["config"], "__class_name__": serialized.get("class_name", "LSTM")}


def _layer(entry):
    """A layer entry as ``(directions, [options of each direction])``."""
    class_name, config, weights = entry["class_name"], entry["config"], entry["weights"]
    where = f"{entry['where']} ({config['name']!r})" if config.get("name") else entry["where"]
    if class_name in _LSTM_LAYERS:
        return 1, [_lstm(entry, {**config, "__class_name__": class_name}, weights, where)]
    if class_name != "Bidirectional":
        raise ValueError(f"from_keras got a {class_name} layer ({where}); nblstm converts LSTM layers only")
    merge_mode = config.get("merge_mode", "concat")
    if merge_mode != "concat":
        raise ValueError(f"{where} has merge_mode={merge_mode!r}; nblstm concatenates the two directions "
                         "(merge_mode='concat')")
    _dtype_policy(config.get("dtype"), where)
    forward = _inner(config.get("layer"), "layer", where)
    if forward["__class_name__"] not in _LSTM_LAYERS:
        raise ValueError(f"from_keras got a Bidirectional({forward['__class_name__']}) layer ({where}); nblstm "
                         "converts LSTM layers only")
    if forward.get("go_backwards"):
        raise ValueError(f"{where}: its forward layer has go_backwards=True (the two directions swapped); build the "
                         "Bidirectional from a layer with go_backwards=False")
    if config.get("backward_layer") is not None:
        backward = _inner(config["backward_layer"], "backward_layer", where)
    else:
        backward = {**forward, "go_backwards": True}
    def count(layer):
        return 3 if layer.get("use_bias", True) or layer["__class_name__"] == "CuDNNLSTM" else 2

    n_forward = count(forward)
    fw = _lstm(entry, forward, weights[:n_forward], f"{where} forward layer")
    bw = _lstm(entry, backward, weights[n_forward:], f"{where} backward layer")
    if weights and len(weights) != n_forward + count(backward):
        raise ValueError(f"{where} has {len(weights)} weights; expected the forward layer's then the backward's")
    if not bw["go_backwards"]:
        raise ValueError(f"{where}: its backward_layer has go_backwards=False; Keras runs it backwards")
    for option_name in ("units", "input_size", "activation", "recurrent_activation", "return_sequences"):
        if fw[option_name] != bw[option_name]:
            raise ValueError(f"{where}: the backward layer has {option_name}={bw[option_name]!r}, the forward layer "
                             f"{fw[option_name]!r}; nblstm.LSTM's two directions share their options")
    return 2, [fw, bw]


def read(layer_or_model):
    """The configuration and cell weights of Keras ``LSTM`` / ``Bidirectional(LSTM)`` layers, one or a stack.

    Keras's training-time ``dropout`` and ``recurrent_dropout`` are not
    imported (the configuration has ``dropout=0.0``), nor
    ``unit_forget_bias``, which only initialises the bias (the weights hold
    its effect), nor initializers, regularizers and constraints. ``unroll``,
    ``implementation`` and ``use_cudnn`` do not change the results. Keras
    has no ``forget_bias``: the cells are for ``forget_bias=0``. The
    configuration has ``zero_output_for_mask`` (the top layer's; a
    ``Bidirectional``'s is its ``return_sequences``) and, for one layer
    with ``go_backwards=True``, ``go_backwards``. Keras 2's ``CuDNNLSTM``
    (``bias [8H]``) is read as the LSTM it computes
    (:func:`nblstm.convert.keras_cudnn_to_keras`).

    Parameters
    ----------
    layer_or_model : layer, model, list or dict
        A Keras ``LSTM`` or ``Bidirectional(LSTM)`` layer (``merge_mode="concat"``);
        a model (its ``LSTM``/``Bidirectional`` layers, stacked: other layers
        before the first or after the last are not part of the result, and
        only dropout or noise layers may sit between them); a list of layers
        (a stack); a serialized layer ``{"class_name": ..., "config": ...,
        "weights": [arrays]}`` or a list of them; or a bare weight list
        (``get_weights()`` of one ``LSTM``, 2 or 3 arrays, or of one
        ``Bidirectional``, 4 or 6), read with Keras's default
        ``activation="tanh"`` and ``recurrent_activation="sigmoid"``.

    Returns
    -------
    tuple
        ``(config, cells)``: ``config`` the ``nblstm.LSTM`` keyword arguments
        (``batch_first=True``: Keras is batch-major), ``cells`` the
        ``num_layers * D`` cell-weight dicts (``kernel [I_k + H, 4H]`` ICFO,
        ``bias [4H]``, zero when ``use_bias=False``), index ``layer * D +
        direction``, in the weights' dtype.

    Raises
    ------
    ValueError
        A GRU or other non-LSTM layer; ``stateful=True``; ``time_major=True``;
        a mixed-precision dtype policy; ``go_backwards=True`` on a layer of a
        stack read as one ``nblstm.LSTM`` (:func:`read_layers` reads it); a
        ``merge_mode`` other than ``"concat"``; an ``activation`` nblstm lacks or a
        ``recurrent_activation`` other than sigmoid and (Keras 3's)
        hard_sigmoid; a backward layer unlike the forward one; a stack whose
        layers differ in units, directions or activations or whose input
        sizes do not chain (``layer k + 1`` takes ``D * units``), or whose
        inner layer has ``return_sequences=False``; unbuilt layers.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm.porting import keras as porting_keras
    >>> rng = np.random.default_rng(0)
    >>> weights = [rng.standard_normal((3, 8)), rng.standard_normal((2, 8)), np.zeros(8)]  # I = 3, H = 2
    >>> layer = {"class_name": "LSTM", "weights": weights,
    ...          "config": {"units": 2, "activation": "tanh", "recurrent_activation": "hard_sigmoid"}}
    >>> config, cells = porting_keras.read(layer)
    >>> config["recurrent_activation"], config["batch_first"], cells[0]["kernel"].shape
    ('hard_sigmoid', True, (5, 8))
    """
    layers = _chained(layer_or_model)
    directions, first = layers[0][0], layers[0][1][0]
    for k, (d, options) in enumerate(layers[1:], 1):
        if d != directions:
            raise ValueError(f"layer {k} is {'bi' if d == 2 else 'uni'}directional, layer 0 is not; the layers of one "
                             "nblstm.LSTM have the same directions (nblstm.porting.keras.read_layers reads them one "
                             "by one)")
        for name in ("units", "activation", "recurrent_activation", "dtype"):
            if options[0][name] != first[name]:
                raise ValueError(f"layer {k} has {name}={options[0][name]!r}, layer 0 {first[name]!r}; the layers "
                                 "of one nblstm.LSTM share it (nblstm.porting.keras.read_layers reads them one by one)")
    return _config(layers), [o["cell"] for _, options in layers for o in options]


def _config(layers):
    """The ``nblstm.LSTM`` keywords of parsed layers (a stack that one ``nblstm.LSTM`` holds).

    Masked steps: a ``Bidirectional`` sets its layers' ``zero_output_for_mask``
    to their ``return_sequences``; a layer's own setting counts otherwise, and
    only the top layer's shows (a layer above skips the steps the mask hides).
    """
    directions, first = layers[0][0], layers[0][1][0]
    config = layer_config(input_size=first["input_size"], hidden_size=first["units"], num_layers=len(layers),
                          bidirectional=directions == 2, dtype=first["dtype"], batch_first=True,
                          bias=any(o["use_bias"] for _, options in layers for o in options),
                          activation=first["activation"], recurrent_activation=first["recurrent_activation"])
    top = layers[-1][1][0]
    config["zero_output_for_mask"] = top["return_sequences"] if directions == 2 else top["zero_output_for_mask"]
    if directions == 1 and first["go_backwards"]:
        if len(layers) > 1:
            raise ValueError("layer 0 has go_backwards=True: it reverses the sequence it reads, which one "
                             "nblstm.LSTM of several layers does not; read the layers one by one "
                             "(nblstm.LSTM.stack_from_keras)")
        config["go_backwards"] = True
    elif directions == 1 and any(options[0]["go_backwards"] for _, options in layers):
        raise ValueError("a layer above the first has go_backwards=True: it reverses the sequence it reads, which "
                         "one nblstm.LSTM of several layers does not; read the layers one by one "
                         "(nblstm.LSTM.stack_from_keras)")
    return config


def _chained(layer_or_model):
    """The parsed recurrent layers of ``layer_or_model``, checked to feed each other."""
    layers = [_layer(entry) for entry in _entries(layer_or_model)]
    for k in range(1, len(layers)):
        d, below = layers[k - 1][0], layers[k - 1][1][0]
        options = layers[k][1][0]
        if options["input_size"] != d * below["units"]:
            raise ValueError(f"layer {k} takes {options['input_size']} inputs; layer {k - 1} gives "
                             f"{d * below['units']} ({d} * units): the layers do not stack")
        if not below["return_sequences"]:
            raise ValueError(f"layer {k - 1} has return_sequences=False but another LSTM layer follows it")
    return layers


def read_layers(layer_or_model):
    """Each recurrent layer of a Keras stack on its own: a list of ``(config, cells)``, one per layer.

    For stacks whose layers differ (in units, directions or activations),
    which one ``nblstm.LSTM`` cannot hold: each ``config`` has
    ``num_layers=1``, and layer ``k + 1``'s ``input_size`` is layer ``k``'s
    output size (checked).

    Parameters
    ----------
    layer_or_model
        As :func:`read`.

    Returns
    -------
    list of tuple
        ``(config, cells)`` per layer, as :func:`read` gives for that layer alone.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm.porting import keras as porting_keras
    >>> rng = np.random.default_rng(0)
    >>> def lstm(inputs, units, **config):
    ...     weights = [rng.standard_normal((inputs, 4 * units)), rng.standard_normal((units, 4 * units)),
    ...                np.zeros(4 * units)]
    ...     return {"class_name": "LSTM", "config": {"units": units, "return_sequences": True, **config},
    ...             "weights": weights}
    >>> bidirectional = {"class_name": "Bidirectional", "config": {"layer": lstm(3, 4)},
    ...                  "weights": lstm(3, 4)["weights"] + lstm(3, 4)["weights"]}
    >>> layers = porting_keras.read_layers([bidirectional, lstm(8, 2)])
    >>> [(config["input_size"], config["hidden_size"], config["bidirectional"]) for config, _ in layers]
    [(3, 4, True), (8, 2, False)]
    """
    return [(_config([layer]), [o["cell"] for o in layer[1]]) for layer in _chained(layer_or_model)]


def write(config, cells):
    """Keras weight lists of a layer: one list per layer, for ``layer.set_weights`` (the inverse of :func:`read`).

    A bidirectional layer's list is the forward layer's ``[kernel,
    recurrent_kernel, bias]`` then the backward layer's (a
    ``Bidirectional``'s ``set_weights`` order). ``forget_bias`` is folded
    into the bias (build the Keras layers with ``unit_forget_bias=False``;
    it only matters for initialisation); ``bias=False`` drops the bias (for
    ``use_bias=False``).

    Parameters
    ----------
    config : dict
        ``nblstm.LSTM`` keyword arguments.
    cells : list of dict
        Cell weights, index ``layer * D + direction``.

    Raises
    ------
    ValueError
        What Keras's LSTM lacks: peepholes, a projection, ``cell_clip``,
        ``proj_clip``; a nonzero bias with ``bias=False``; cells that disagree
        with ``config``.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm.porting import keras as porting_keras
    >>> cells = [{"kernel": np.zeros((5, 8)), "bias": np.zeros(8)}] * 2          # I = 3, H = 2, bidirectional
    >>> [[a.shape for a in layer] for layer in porting_keras.write({"bidirectional": True}, cells)]
    [[(3, 8), (2, 8), (8,), (3, 8), (2, 8), (8,)]]
    """
    num_layers, directions, _, _, _, has_proj, _ = checked_cells(config, cells, "Keras LSTM")
    if has_proj:
        raise ValueError("Keras LSTM has no projection; the cells have projection/kernel (proj_size > 0)")
    check_activation(activation_names(config)[0], "config['activation']")
    check_recurrent_activation(activation_names(config)[1], "config['recurrent_activation']")
    forget_bias = float(option(config, "forget_bias", 0.0))
    bias = check_bool("config['bias']", option(config, "bias", True))
    out = []
    for layer in range(num_layers):
        weights = []
        for d in range(directions):
            k = layer * directions + d
            kernel, recurrent_kernel, b = convert.lstmcell_to_keras(cells[k], forget_bias)
            weights += [kernel, recurrent_kernel]
            if bias:
                weights.append(b)
            elif b.any():
                raise ValueError(f"config has bias=False but cells[{k}]'s bias (with forget_bias={forget_bias}) is "
                                 "nonzero: a Keras LSTM with use_bias=False has no bias")
        out.append(weights)
    return out


def read_cell(layer_or_weights):
    """One Keras ``LSTM`` layer: ``(options, weights)`` for :meth:`nblstm.LSTMCell.from_keras`.

    Parameters
    ----------
    layer_or_weights
        A Keras ``LSTM`` layer (or a model or list holding one), its
        serialized dict, or its bare ``get_weights()`` list.

    Returns
    -------
    tuple
        ``options`` (``num_units``, ``num_proj=None`` and, from a layer or
        dict, ``activation`` and ``recurrent_activation``; a bare weight list
        leaves them to the caller) and the cell weights (``forget_bias=0``).

    Raises
    ------
    ValueError
        A ``Bidirectional`` layer or a stack (use ``nblstm.LSTM.from_keras``),
        ``go_backwards=True`` or ``zero_output_for_mask=True`` (a cell takes
        them per call), and what :func:`read` refuses.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm.porting import keras as porting_keras
    >>> layer = {"class_name": "LSTM", "config": {"units": 2, "activation": "relu"},
    ...          "weights": [np.zeros((3, 8)), np.zeros((2, 8)), np.zeros(8)]}
    >>> options, weights = porting_keras.read_cell(layer)
    >>> options
    {'num_units': 2, 'num_proj': None, 'activation': 'relu', 'recurrent_activation': 'sigmoid'}
    """
    bare = isinstance(layer_or_weights, (list, tuple)) and bool(layer_or_weights) \
        and all(_is_array(a) for a in layer_or_weights)
    config, cells = read(layer_or_weights)
    if config["bidirectional"]:
        raise ValueError("from_keras got a Bidirectional layer (or its weights); an LSTMCell is one direction of "
                         "one layer: use nblstm.LSTM.from_keras")
    if config["num_layers"] > 1:
        raise ValueError(f"from_keras got {config['num_layers']} LSTM layers; an LSTMCell is one layer: use "
                         "nblstm.LSTM.from_keras")
    for option_name, call in (("go_backwards", "cell.run(inputs, mask=mask, reverse=True, time_major=False), "
                                                "outputs[:, ::-1]"),
                              ("zero_output_for_mask", "cell.run(..., mask=mask, zero_output_for_mask=True)")):
        if config.get(option_name):
            raise ValueError(f"the Keras layer has {option_name}=True, which an LSTMCell takes per call, not as an "
                             f"option: nblstm.LSTM.from_keras keeps it; or take the weights alone "
                             f"(LSTMCell.from_keras(layer.get_weights(), ...)) and call {call}")
    options = {"num_units": config["hidden_size"], "num_proj": None}
    if not bare:
        options.update(activation=config["activation"], recurrent_activation=config["recurrent_activation"])
    return options, cells[0]
