"""What the readers and writers share: the configuration record, array conversion, stack checks."""

import numbers

import numpy as np

from .. import convert
from ..options import ACTIVATION_NAMES, GATE_FUNCTIONS

#: The gate functions ``s`` of ``i, f, o`` that nblstm computes (``"hard_sigmoid"`` is Keras 3's ``relu6(x + 3) / 6``).
RECURRENT_ACTIVATIONS = GATE_FUNCTIONS


def as_array(value, name):
    """``value`` (a NumPy array, a PyTorch tensor, a TensorFlow or Keras variable) as a floating NumPy array."""
    return convert._array(value, name)


def layer_config(*, input_size, hidden_size, num_layers, bidirectional, dtype, bias=True, batch_first=False,
                 dropout=0.0, proj_size=0, use_peepholes=False, activation="tanh", recurrent_activation="sigmoid"):
    """The keyword arguments of ``nblstm.LSTM`` for a converted layer (every keyword, in the constructor's order)."""
    return {
        "input_size": int(input_size), "hidden_size": int(hidden_size), "num_layers": int(num_layers),
        "bias": bool(bias), "batch_first": bool(batch_first), "dropout": float(dropout),
        "bidirectional": bool(bidirectional), "proj_size": int(proj_size), "use_peepholes": bool(use_peepholes),
        "cell_clip": None, "proj_clip": None, "forget_bias": 0.0, "activation": activation,
        "recurrent_activation": recurrent_activation, "dtype": np.dtype(dtype).name,
    }


def check_bool(name, value, allow_none=False):
    if value is None and allow_none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def check_layer_index(name, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def check_suffix(suffix):
    """``""`` (the forward direction) or ``"_reverse"`` (the backward one); the direction index, 0 or 1."""
    if suffix not in ("", "_reverse"):
        raise ValueError(f"suffix must be '' (forward direction) or '_reverse' (the backward direction of a "
                         f"bidirectional nn.LSTM), got {suffix!r}")
    return 1 if suffix else 0


def with_forget_bias(weights, forget_bias):
    """Cell weights for a cell built with ``forget_bias``: a copy, ``forget_bias`` taken off the bias's forget block.

    The readers return weights for ``forget_bias=0`` (the frameworks have none); the ICFO forget block is
    ``bias[2H:3H]``.
    """
    out = {k: np.array(a, copy=True) for k, a in weights.items()}
    if forget_bias:
        units = out["bias"].shape[0] // 4
        out["bias"][2 * units:3 * units] -= out["bias"].dtype.type(forget_bias)
    return out


def option(config, name, default):
    value = config.get(name, default)
    return default if value is None and default is not None else value


def checked_cells(config, cells, target):
    """``(num_layers, D, input_size, H, P, has_proj, has_peepholes, dtype)`` of ``cells`` agreeing with ``config``.

    ``target`` names the format written, for the messages.
    """
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict of nblstm.LSTM keyword arguments, got {type(config).__name__}")
    if not isinstance(cells, (list, tuple)):
        raise TypeError(f"cells must be a list of cell-weight dicts (layer * D + direction), got "
                        f"{type(cells).__name__}")
    num_layers = check_layer_index("config['num_layers']", option(config, "num_layers", 1))
    directions = 2 if check_bool("config['bidirectional']", option(config, "bidirectional", False)) else 1
    if num_layers < 1 or len(cells) != num_layers * directions:
        raise ValueError(f"cells has {len(cells)} entries; config (num_layers={num_layers}, "
                         f"bidirectional={directions == 2}) needs {num_layers * directions}")
    problems = []
    if option(config, "use_peepholes", False):
        problems.append("use_peepholes=True")
    for clip in ("cell_clip", "proj_clip"):
        if config.get(clip) is not None:
            problems.append(f"{clip}={config[clip]!r}")
    if problems:
        raise ValueError(f"{target} has no equivalent of config's {', '.join(problems)}")
    sizes = None
    for k, cell in enumerate(cells):
        if not isinstance(cell, dict):
            raise TypeError(f"cells[{k}] must be a dict of cell weights, got {type(cell).__name__}")
        try:
            found = convert._cell_sizes(cell)
        except ValueError as e:
            raise ValueError(f"cells[{k}]: {e}") from None
        if any(cell.get(n) is not None for n in ("w_i_diag", "w_f_diag", "w_o_diag")):
            raise ValueError(f"{target} has no peepholes; cells[{k}] has peephole weights")
        inputs, units, depth, has_proj = found
        layer = k // directions
        if sizes is None:
            sizes = (inputs, units, depth, has_proj)
        expected_inputs = sizes[0] if layer == 0 else directions * sizes[2]
        if (units, depth, has_proj) != sizes[1:] or inputs != expected_inputs:
            raise ValueError(f"cells[{k}] has kernel {np.shape(cell['kernel'])}; a layer of this stack expects "
                             f"[{expected_inputs} + {sizes[2]}, {4 * sizes[1]}]")
    inputs, units, depth, has_proj = sizes
    for name, found in (("input_size", inputs), ("hidden_size", units)):
        if config.get(name) is not None and config[name] != found:
            raise ValueError(f"config[{name!r}] is {config[name]}, the cells' weights have {found}")
    proj = option(config, "proj_size", 0)
    if proj != (depth if has_proj else 0):
        raise ValueError(f"config['proj_size'] is {proj}, the cells' weights have "
                         f"{'projection size ' + str(depth) if has_proj else 'no projection'}")
    dtype = as_array(cells[0]["kernel"], "cells[0]['kernel']").dtype
    return num_layers, directions, inputs, units, depth, has_proj, dtype


def activation_names(config):
    """``(activation, recurrent_activation)`` of ``config`` as names."""
    activation = option(config, "activation", "tanh")
    recurrent = option(config, "recurrent_activation", "sigmoid")
    return getattr(activation, "name", activation), getattr(recurrent, "name", recurrent)


def check_activation(value, what):
    """An activation name of :data:`nblstm.cell.ACTIVATION_NAMES` from ``value`` (``what`` names it)."""
    name = value.lower() if isinstance(value, str) else value
    if name not in ACTIVATION_NAMES:
        raise ValueError(f"{what}={value!r} is not supported; nblstm has {ACTIVATION_NAMES}")
    return name


def check_recurrent_activation(value, what):
    name = value.lower() if isinstance(value, str) else value
    if name not in RECURRENT_ACTIVATIONS:
        raise ValueError(f"{what}={value!r} is not supported; nblstm's gates use 'sigmoid' or 'hard_sigmoid' "
                         "(Keras 3's relu6(x + 3) / 6)")
    return name


def _name(value):
    name = getattr(value, "name", getattr(value, "__name__", value))
    return "tanh" if name is None else (name.lower() if isinstance(name, str) else name)


def new_cell(cls, options, weights, forget_bias, kwargs, source):
    """An ``LSTMCell`` (``cls``) of converted weights: the conversion classmethods' common end.

    ``options`` holds ``num_units``, ``num_proj`` and what the source fixes
    (``activation``, ``recurrent_activation``, and for nblstm's own modules
    ``use_peepholes``, ``cell_clip``, ``proj_clip``); ``kwargs`` the caller's
    further arguments, which must not contradict them (``source`` names the
    source in the message). ``weights`` are for ``forget_bias=0``.
    """
    kwargs = dict(kwargs)
    if "num_proj" in kwargs:
        raise TypeError(f"num_proj comes from the {source}; it cannot be given")
    for name in ("activation", "recurrent_activation", "use_peepholes", "cell_clip", "proj_clip"):
        given = _name(kwargs[name]) if name.endswith("activation") and name in kwargs else kwargs.get(name)
        if name in options and name in kwargs and given != options[name]:
            raise ValueError(f"{name}={kwargs[name]!r} disagrees with the {source}'s {name}={options[name]!r}")
        if name in options:
            kwargs[name] = options[name]
    kwargs.setdefault("dtype", np.asarray(weights["kernel"]).dtype)
    cell = cls(options["num_units"], num_proj=options.get("num_proj"), forget_bias=forget_bias, **kwargs)
    cell.set_weights(with_forget_bias(weights, forget_bias))
    return cell
