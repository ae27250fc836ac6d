"""PyTorch ``nn.LSTM``: a module or state dict as ``nblstm.LSTM`` keywords and cell weights, and back.

PyTorch is not imported: a module is read through its attributes and
``state_dict()``, tensors through ``detach().cpu().numpy()``.

Layout (gates ``i, f, g, o`` along the ``4H`` rows, ``P = proj_size or
hidden_size``, ``D = 2`` when bidirectional, suffix ``_reverse`` for the
backward direction):

==========================  ==================  =============================================
state-dict entry            shape               cell weights
==========================  ==================  =============================================
``weight_ih_l{k}{suffix}``  ``[4H, I_k]``       ``kernel[:I_k] = ifco_to_icfo(weight_ih.T)``
``weight_hh_l{k}{suffix}``  ``[4H, P]``         ``kernel[I_k:] = ifco_to_icfo(weight_hh.T)``
``bias_ih_l{k}{suffix}``    ``[4H]``            ``bias = ifco_to_icfo(bias_ih + bias_hh)``
``bias_hh_l{k}{suffix}``    ``[4H]``
``weight_hr_l{k}{suffix}``  ``[P, H]``          ``projection/kernel = weight_hr.T``
==========================  ==================  =============================================

``I_0 = input_size``, ``I_k = D * P`` for ``k > 0``.
"""

import re
from collections.abc import Mapping

from .. import convert
from ._common import (
    activation_names,
    as_array,
    check_bool,
    check_layer_index,
    check_suffix,
    checked_cells,
    layer_config,
    option,
)

__all__ = ["read", "read_cell", "write"]

_KEY = re.compile(r"^(?P<prefix>.*?)(?P<stem>weight_ih|weight_hh|bias_ih|bias_hh|weight_hr|weight_c[ifo])"
                  r"(?:_l(?P<layer>\d+))?(?P<reverse>_reverse)?$")
# nblstm.torch.LSTM's peepholes, parameters [H] read into the cell weights w_i_diag, w_f_diag, w_o_diag.
_PEEPHOLES = {"weight_ci": "w_i_diag", "weight_cf": "w_f_diag", "weight_co": "w_o_diag"}


def _not_lstm(kind, gates, key="weight_ih_l0"):
    rows = "hidden_size rows" if gates == 1 else f"{gates} * hidden_size rows"
    return ValueError(f"from_torch got an {kind} ({key} has {rows}); nblstm converts nn.LSTM only")


def _own_parameters(module):
    """``{name: shape}`` of the parameters a module holds itself (not its submodules'), or ``None``."""
    named = getattr(module, "named_parameters", None)
    if not callable(named):
        return None
    try:
        return {name: tuple(p.shape) for name, p in named(recurse=False)}
    except TypeError:
        return None


def _recurrent_kind(params):
    """What a module holding ``params`` is, by its parameters: ``None`` (no recurrent weights), ``"LSTM"``,
    ``"LSTMCell"``, or ``(kind, gates, key)`` of a GRU or plain RNN (``weight_hh`` has ``gates * H`` rows)."""
    cell = "weight_ih" in params
    if not cell and "weight_ih_l0" not in params:
        return None
    suffix = "" if cell else "_l0"
    if "weight_hr" + suffix in params:  # only nn.LSTM projects its output
        return "LSTMCell" if cell else "LSTM"
    hh = params.get("weight_hh" + suffix, ())
    if len(hh) == 2 and hh[1] and hh[0] != 4 * hh[1] and hh[0] / hh[1] in (1, 3):
        gates = int(hh[0] / hh[1])
        return ("nn." + ("GRU" if gates == 3 else "RNN") + ("Cell" if cell else ""), gates, "weight_ih" + suffix)
    return "LSTMCell" if cell else "LSTM"


def _is_nn_lstm(module):
    """Whether ``module`` runs ``torch.nn.LSTM``'s (or ``nn.LSTMCell``'s) forward: the class or a subclass
    that keeps it."""
    for cls in type(module).__mro__:
        if cls.__module__ == "torch.nn.modules.rnn" and cls.__name__ in ("LSTM", "LSTMCell"):
            return type(module).forward is cls.forward
    return False


def _lstm_module(module):
    """``(path, module)`` of the one ``nn.LSTM`` (or ``nn.LSTMCell``, or ``nblstm.torch.LSTM``) in ``module``'s tree.

    The LSTM is found by its own parameters (``weight_ih_l0`` or ``weight_ih``
    with ``4 * hidden_size`` rows), not by class names: a user's wrapper may
    well be called ``LSTM``. ``path`` is its dotted name in the tree (``""``: ``module`` itself).
    """
    named_modules = getattr(module, "named_modules", None)
    tree = list(named_modules()) if callable(named_modules) else [("", module)]
    found, others = [], []
    for path, m in tree:
        params = _own_parameters(m)
        kind = _recurrent_kind(params) if params is not None else None
        if isinstance(kind, tuple):
            others.append((path, kind))
        elif kind is not None:
            found.append((path, m))
    root = type(module).__name__
    if len(found) > 1:
        names = [path or "(the module itself)" for path, _ in found]
        raise ValueError(f"module_or_state_dict ({root}) holds {len(found)} LSTMs {names}; pass the one to convert, "
                         f"e.g. from_torch(model.get_submodule({(found[-1][0] or found[0][0])!r}))")
    if found:
        return found[0]
    if others:
        raise _not_lstm(*others[0][1])
    raise ValueError(f"module_or_state_dict is a {root} with no nn.LSTM inside (no module holds parameters "
                     f"weight_ih_l0 or weight_ih)")


def _where(path):
    return f"module_or_state_dict's submodule {path!r}" if path else "module_or_state_dict"


def _module_options(path, module, state):
    """``(batch_first, dropout, extra)`` of the LSTM ``module``: what its parameters do not say.

    ``extra`` holds an ``nblstm.torch.LSTM``'s own options (peepholes are
    parameters; ``cell_clip``, ``proj_clip``, ``forget_bias``). A module
    whose computation nblstm cannot know (a subclass of ``nn.LSTM`` with its
    own ``forward``, parameters or buffers ``nn.LSTM`` does not have, another
    class altogether) is refused.
    """
    where = _where(path)
    layer = getattr(module, "_layer", None)
    extra = {}
    if type(module).__module__ == "nblstm.torch" and layer is not None:
        extra = {"cell_clip": layer.cell_clip, "proj_clip": layer.proj_clip, "forget_bias": float(layer.forget_bias)}
        if layer.activation != "tanh" or layer.recurrent_activation != "sigmoid":  # pragma: no cover - fixed there
            raise ValueError(f"{where} has activations nblstm.torch.LSTM does not set")
    elif not _is_nn_lstm(module):
        cls = type(module)
        raise ValueError(f"{where} is a {cls.__module__}.{cls.__qualname__}, which holds LSTM parameters but is not "
                         f"torch.nn.LSTM (or a subclass keeping its forward): nblstm cannot know what it computes. "
                         f"If it computes what nn.LSTM does, pass its state dict and batch_first: "
                         f"from_torch(module.state_dict(), batch_first=...)")
    unknown = sorted(str(k) for k in state if not _KEY.match(str(k)))
    if unknown:
        raise ValueError(f"{where} ({type(module).__name__}) has parameters or buffers nn.LSTM does not: {unknown}; "
                         f"nblstm cannot honour them")
    return bool(getattr(module, "batch_first", False)), float(getattr(module, "dropout", 0.0) or 0.0), extra


def _lstm_entries(state):
    """``(prefix, {(stem, layer, reverse): key})`` of the one LSTM in a state dict."""
    groups = {}
    for key in state:
        m = _KEY.match(str(key))
        if m:
            layer = None if m["layer"] is None else int(m["layer"])
            groups.setdefault(m["prefix"], {})[(m["stem"], layer, bool(m["reverse"]))] = key
    groups = {p: g for p, g in groups.items() if any(s == "weight_ih" for s, _, _ in g)}
    if not groups:
        raise ValueError(f"module_or_state_dict has no nn.LSTM parameters (weight_ih_l0, weight_hh_l0, ...); "
                         f"its keys are {sorted(map(str, state))[:12]}")
    if len(groups) > 1:
        raise ValueError(f"module_or_state_dict holds the parameters of {len(groups)} recurrent modules "
                         f"(prefixes {sorted(groups)}); pass one module, or its own state dict")
    return next(iter(groups.items()))


def _parse_state(state):
    """``(arrays keyed like nn.LSTM's layer-0.. state dict without prefix, sizes)`` of a state dict."""
    prefix, entries = _lstm_entries(state)
    values = {key: as_array(state[key], f"module_or_state_dict[{key!r}]") for key in entries.values()}
    layers = {layer for _, layer, _ in entries}
    if None in layers and len(layers) > 1:
        raise ValueError(f"module_or_state_dict mixes nn.LSTMCell keys (weight_ih) and nn.LSTM keys "
                         f"(weight_ih_l0): {sorted(map(str, entries.values()))}")
    cell_style = None in layers

    def key_of(stem, layer, reverse):
        return entries.get((stem, None if cell_style else layer, reverse))

    def shape_of(key):
        return values[key].shape

    num_layers = 1 if cell_style else max(layers) + 1
    reverse = any(r for _, _, r in entries)
    if cell_style and reverse:
        raise ValueError("module_or_state_dict has nn.LSTMCell keys with a '_reverse' suffix")
    directions = 2 if reverse else 1
    first = key_of("weight_ih", 0, False)
    hh = key_of("weight_hh", 0, False)
    if first is None or hh is None:
        missing = [f"{prefix}{s}{'' if cell_style else '_l0'}" for s in ("weight_ih", "weight_hh")
                   if key_of(s, 0, False) is None]
        raise ValueError(f"module_or_state_dict lacks {missing}")
    ih_shape, hh_shape = shape_of(first), shape_of(hh)
    if len(ih_shape) != 2 or len(hh_shape) != 2:
        raise ValueError(f"module_or_state_dict[{first!r}] and [{hh!r}] must be matrices, got shapes {ih_shape} "
                         f"and {hh_shape}")
    hr = key_of("weight_hr", 0, False)
    if hr is None and hh_shape[1] and hh_shape[0] == ih_shape[0] and hh_shape[0] != 4 * hh_shape[1]:
        gates = hh_shape[0] / hh_shape[1]
        if gates in (1, 3):
            kind = {1: "nn.RNN", 3: "nn.GRU"}[int(gates)]
            raise _not_lstm(kind + ("Cell" if cell_style else ""), int(gates), key=str(first))
    if ih_shape[0] % 4 or ih_shape[0] == 0:
        raise ValueError(f"module_or_state_dict[{first!r}] has shape {ih_shape}; nn.LSTM's is "
                         f"[4 * hidden_size, input_size]")
    units = ih_shape[0] // 4
    proj = 0 if hr is None else (shape_of(hr) or (0,))[0]
    depth = proj or units
    input_size = ih_shape[1]
    has_bias = key_of("bias_ih", 0, False) is not None or key_of("bias_hh", 0, False) is not None
    has_peepholes = any(key_of(stem, 0, False) is not None for stem in _PEEPHOLES)
    out = {}
    used = set()
    for layer in range(num_layers):
        for d in range(directions):
            rev = bool(d)
            suffix = "_reverse" if rev else ""
            inputs = input_size if layer == 0 else directions * depth
            expected = {"weight_ih": (4 * units, inputs), "weight_hh": (4 * units, depth)}
            if has_bias:
                expected.update({"bias_ih": (4 * units,), "bias_hh": (4 * units,)})
            if proj:
                expected["weight_hr"] = (proj, units)
            if has_peepholes:
                expected.update({stem: (units,) for stem in _PEEPHOLES})
            for stem, shape in expected.items():
                key = key_of(stem, layer, rev)
                name = f"{prefix}{stem}{'' if cell_style else f'_l{layer}'}{suffix}"
                if key is None:
                    raise ValueError(f"module_or_state_dict lacks {name!r} (it has "
                                     f"{sorted(map(str, entries.values()))})")
                if shape_of(key) != shape:
                    raise ValueError(f"module_or_state_dict[{key!r}] has shape {shape_of(key)}; expected {shape} "
                                     f"(nn.LSTM with input_size={input_size}, hidden_size={units}, proj_size={proj}, "
                                     f"{'bidirectional, ' if reverse else ''}layer {layer})")
                out[f"{stem}_l{layer}{suffix}"] = values[key]
                used.add(key)
    extra = sorted(str(k) for k in entries.values() if k not in used)
    if extra:
        raise ValueError(f"module_or_state_dict has entries that are not part of an nn.LSTM with "
                         f"num_layers={num_layers}, bidirectional={reverse}, proj_size={proj}, bias={has_bias}: "
                         f"{extra}")
    dtypes = {a.dtype for a in out.values()}
    if len(dtypes) > 1:
        raise TypeError(f"module_or_state_dict mixes dtypes {sorted(d.name for d in dtypes)}")
    sizes = {"input_size": input_size, "hidden_size": units, "num_layers": num_layers, "bidirectional": reverse,
             "proj_size": proj, "bias": has_bias, "use_peepholes": has_peepholes}
    return out, sizes, dtypes.pop()


def read(module_or_state_dict, batch_first=None):
    """The configuration and cell weights of a PyTorch ``nn.LSTM``.

    Parameters
    ----------
    module_or_state_dict : torch.nn.LSTM, module or mapping
        An ``nn.LSTM`` (or ``nn.LSTMCell``, or :class:`nblstm.torch.LSTM`),
        a module holding exactly one anywhere in its tree (found by its own
        parameters, not class names), or a state dict of tensors or arrays
        (``weight_ih_l0``, ...; a common key prefix such as
        ``"encoder.lstm."`` is allowed when it is the only recurrent
        module's). A state dict gives the sizes, ``num_layers``,
        ``bidirectional`` (``_reverse`` keys), ``proj_size`` (``weight_hr``),
        ``bias`` and peepholes (``weight_ci_l0``, ...); the module also gives
        ``batch_first`` and ``dropout`` (an ``nblstm.torch.LSTM`` its
        ``cell_clip``, ``proj_clip`` and ``forget_bias``). A module whose
        computation is not ``nn.LSTM``'s (a subclass with its own
        ``forward``, parameters ``nn.LSTM`` lacks) is refused.
    batch_first : bool, optional
        The layout the converted layer takes: ``None`` uses the module's
        (``False`` for a state dict, PyTorch's default).

    Returns
    -------
    tuple
        ``(config, cells)``: ``config`` the ``nblstm.LSTM`` keyword
        arguments, ``cells`` ``num_layers * D`` dicts of cell weights
        (``kernel [I_k + P, 4H]`` ICFO, ``bias [4H]``, with a projection
        ``projection/kernel [H, P]``), index ``layer * D + direction``, in the
        parameters' dtype, for ``config["forget_bias"]`` (0 but for an
        ``nblstm.torch.LSTM``). ``bias=False`` gives zero biases.

    Raises
    ------
    ValueError
        An ``nn.GRU`` or ``nn.RNN`` (module or state dict), several LSTMs
        in a module (named), a module that is not ``nn.LSTM``, missing,
        unexpected or misshapen parameters (named).
    TypeError
        Not a module or mapping; mixed dtypes.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm.porting import torch as porting_torch
    >>> rng = np.random.default_rng(0)
    >>> state_dict = {"weight_ih_l0": rng.standard_normal((16, 3)), "weight_hh_l0": rng.standard_normal((16, 4)),
    ...               "weight_ih_l0_reverse": rng.standard_normal((16, 3)),
    ...               "weight_hh_l0_reverse": rng.standard_normal((16, 4))}   # nn.LSTM(3, 4, bias=False,
    >>> config, cells = porting_torch.read(state_dict)                         #         bidirectional=True)
    >>> config["hidden_size"], config["bidirectional"], config["bias"], len(cells)
    (4, True, False, 2)
    >>> cells[1]["kernel"].shape
    (7, 16)
    """
    batch_first = check_bool("batch_first", batch_first, allow_none=True)
    obj = module_or_state_dict
    module = None
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        path, module = _lstm_module(obj)
        state = module.state_dict()
        module_batch_first, dropout, extra = _module_options(path, module, state)
    elif isinstance(obj, Mapping):
        state = obj
        module_batch_first, dropout, extra = False, 0.0, {}
    else:
        raise TypeError(f"module_or_state_dict must be a torch.nn.LSTM or its state dict {{name: tensor or "
                        f"array}}, got {type(obj).__name__}")
    arrays, sizes, dtype = _parse_state(state)
    if module is not None:
        where = _where(path)
        for name, value in sizes.items():
            attr = getattr(module, name, None)
            if attr is not None and attr != value:
                raise ValueError(f"{where} has {name}={attr!r} but its parameters give {value!r}")
    if batch_first is None:
        batch_first = module_batch_first
    directions = 2 if sizes["bidirectional"] else 1
    cells = []
    for k in range(sizes["num_layers"] * directions):
        layer, suffix = k // directions, "_reverse" if k % directions else ""
        cell = convert.torch_to_lstmcell(arrays, forget_bias=0.0, layer=layer, suffix=suffix)
        if sizes["use_peepholes"]:
            cell.update({name: arrays[f"{stem}_l{layer}{suffix}"] for stem, name in _PEEPHOLES.items()})
        cells.append(cell)
    config = layer_config(**sizes, batch_first=bool(batch_first), dropout=dropout, dtype=dtype)
    config.update(extra)
    return config, cells


def write(config, cells):
    """An ``nn.LSTM`` state dict (NumPy arrays) of a layer: the inverse of :func:`read`.

    ``bias_ih`` holds the cell's bias (plus ``forget_bias`` in its forget
    block), ``bias_hh`` zeros. Load with ``module.load_state_dict({k:
    torch.from_numpy(a) for k, a in state_dict.items()})`` into
    ``nn.LSTM(input_size, hidden_size, num_layers, bias, batch_first,
    bidirectional=..., proj_size=...)``.

    Parameters
    ----------
    config : dict
        ``nblstm.LSTM`` keyword arguments (``num_layers``, ``bidirectional``,
        ``proj_size``, ``bias``, ``forget_bias``, ``activation``, ...).
    cells : list of dict
        Cell weights, index ``layer * D + direction``.

    Raises
    ------
    ValueError
        What PyTorch lacks: peepholes, ``cell_clip``, ``proj_clip``, an
        activation other than tanh, gates other than sigmoid, a nonzero
        bias with ``bias=False``; cells that disagree with ``config``.

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm.porting import torch as porting_torch
    >>> cells = [{"kernel": np.zeros((5, 8)), "bias": np.zeros(8)}]     # I = 3, H = 2
    >>> state_dict = porting_torch.write({"num_layers": 1, "forget_bias": 1.0}, cells)
    >>> sorted(state_dict), state_dict["bias_ih_l0"]
    (['bias_hh_l0', 'bias_ih_l0', 'weight_hh_l0', 'weight_ih_l0'], array([0., 0., 1., 1., 0., 0., 0., 0.]))
    """
    num_layers, directions, _, _, _, _, _ = checked_cells(config, cells, "PyTorch nn.LSTM")
    activation, recurrent = activation_names(config)
    if activation != "tanh":
        raise ValueError(f"PyTorch nn.LSTM has tanh only; config has activation={activation!r}")
    if recurrent != "sigmoid":
        raise ValueError(f"PyTorch nn.LSTM's gates are sigmoids; config has recurrent_activation={recurrent!r}")
    forget_bias = float(option(config, "forget_bias", 0.0))
    bias = check_bool("config['bias']", option(config, "bias", True))
    out = {}
    for k, cell in enumerate(cells):
        layer, suffix = k // directions, "_reverse" if k % directions else ""
        part = convert.lstmcell_to_torch(cell, forget_bias, layer=layer, suffix=suffix)
        if not bias:
            for stem in ("bias_ih", "bias_hh"):
                b = part.pop(f"{stem}_l{layer}{suffix}")
                if b.any():
                    raise ValueError(f"config has bias=False but cells[{k}]'s bias (with forget_bias="
                                     f"{forget_bias}) is nonzero: nn.LSTM(bias=False) has no bias")
        out.update(part)
    return out


def read_cell(module_or_state_dict, layer=0, suffix=""):
    """One direction of one layer of an ``nn.LSTM``: ``(options, weights)`` for :meth:`nblstm.LSTMCell.from_torch`.

    Parameters
    ----------
    module_or_state_dict
        As :func:`read`.
    layer : int, default 0
    suffix : {"", "_reverse"}, default ""
        ``"_reverse"``: the backward direction of a bidirectional ``nn.LSTM``.

    Returns
    -------
    tuple
        ``options`` (``num_units``, ``num_proj``, ``activation="tanh"``,
        ``recurrent_activation="sigmoid"``) and the cell weights (``forget_bias=0``).

    Examples
    --------
    >>> import numpy as np
    >>> from nblstm.porting import torch as porting_torch
    >>> state_dict = {"weight_ih_l0": np.zeros((8, 3)), "weight_hh_l0": np.zeros((8, 2))}   # nn.LSTM(3, 2)
    >>> options, weights = porting_torch.read_cell(state_dict)
    >>> options["num_units"], options["num_proj"], weights["kernel"].shape
    (2, None, (5, 8))
    """
    direction = check_suffix(suffix)
    layer = check_layer_index("layer", layer)
    config, cells = read(module_or_state_dict)
    if layer >= config["num_layers"]:
        raise ValueError(f"layer={layer} but the nn.LSTM has num_layers={config['num_layers']}")
    if direction and not config["bidirectional"]:
        raise ValueError("suffix='_reverse' but the nn.LSTM is not bidirectional (its state dict has no "
                         "'_reverse' entries)")
    directions = 2 if config["bidirectional"] else 1
    options = {"num_units": config["hidden_size"], "num_proj": config["proj_size"] or None, "activation": "tanh",
               "recurrent_activation": "sigmoid"}
    options.update({name: config[name] for name in ("use_peepholes", "cell_clip", "proj_clip") if config[name]})
    weights = cells[layer * directions + direction]
    forget_bias = config["forget_bias"]
    if forget_bias and "bias" in weights:  # an nblstm.torch.LSTM's forget_bias, into the bias (ICFO: f third)
        units = config["hidden_size"]
        weights = {**weights, "bias": weights["bias"].copy()}
        weights["bias"][2 * units:3 * units] += weights["bias"].dtype.type(forget_bias)
    return options, weights
