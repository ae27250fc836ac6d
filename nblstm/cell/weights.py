"""A cell's variables: their names and shapes, their initial values, the checks of new ones, the file format.

The variables are host NumPy arrays of the cell's dtype, keyed by
TensorFlow's names, in TensorFlow's creation order: ``kernel [I + P, 4H]``
(ICFO), ``bias [4H]``, with peepholes ``w_f_diag, w_i_diag, w_o_diag [H]``,
with a projection ``projection/kernel [H, P]``.
"""

import json
import os

import numpy as np

from .. import _validate as v

__all__ = ["PEEPHOLE_NAMES", "checked_weights", "initial_weights", "load", "save", "weight_shapes"]

#: Names of the peephole weights, in TensorFlow's creation order.
PEEPHOLE_NAMES = ("w_f_diag", "w_i_diag", "w_o_diag")


def weight_shapes(input_depth, num_units, num_proj, use_peepholes):
    """``{name: shape}`` of the variables, in TensorFlow's creation order."""
    depth = num_proj or num_units
    shapes = {"kernel": (input_depth + depth, 4 * num_units), "bias": (4 * num_units,)}
    if use_peepholes:
        shapes.update({name: (num_units,) for name in PEEPHOLE_NAMES})
    if num_proj is not None:
        shapes["projection/kernel"] = (num_units, num_proj)
    return shapes


def initial_weights(shapes, dtype, initializer, seed):
    """The variables' initial values: ``bias`` zero, the others from ``initializer(shape, dtype, rng)``.

    Drawn in TensorFlow's creation order from one generator seeded with ``seed``.
    """
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in shapes.items():
        if name == "bias":
            weights[name] = np.zeros(shape, dtype)
            continue
        value = np.asarray(initializer(shape, dtype, rng))
        if value.shape != shape:
            raise ValueError(f"initializer returned shape {value.shape} for {name}; expected {shape}")
        weights[name] = value.astype(dtype)
    return weights


def checked_weights(weights, num_units, num_proj, use_peepholes, input_depth, dtype, owned=()):
    """Validated variables for a cell, copies unless ``owned``; returns ``(weights, input_depth, dtype)``.

    Parameters
    ----------
    weights : dict, list or tuple
        ``{name: array}`` with the cell's names or TensorFlow's scoped names
        of one cell (``rnn/lstm_cell/kernel:0``), or a list in the order of
        the names (TensorFlow's ``get_weights()``): NumPy arrays, arrays on a
        GPU (copied to the host), or objects with a ``numpy()`` method
        (TensorFlow variables, PyTorch tensors).
    num_units, num_proj, use_peepholes
        The cell's sizes and options.
    input_depth : int or None
        The cell's input depth, ``None`` when it is not built: taken from ``kernel``.
    dtype : numpy.dtype or None
        The cell's dtype, ``None`` when it has none: taken from ``kernel``.
    owned : collection of str, optional
        Names of arrays that the caller made for the cell and will not
        touch again (``nblstm.torch.LSTM``'s kernel, rebuilt at every
        step): kept as they are when they are C-contiguous and own their
        memory (a view of someone else's is copied all the same), where
        every other array is copied.

    Raises
    ------
    TypeError
        Not a dict or list, non-arrays, a dtype that is not the cell's.
    ValueError
        Missing or unexpected names, wrong shapes or count, non-finite
        values, the scoped names of several cells.
    """
    from ..porting.tf import cell_weights

    if not isinstance(weights, (dict, list, tuple)):
        raise TypeError(f"weights must be a dict {{name: array}} or a list of arrays in TensorFlow's order, got "
                        f"{type(weights).__name__}")
    expected = tuple(weight_shapes(1, num_units, num_proj, use_peepholes))
    weights = cell_weights(weights, expected)
    missing = [n for n in expected if n not in weights]
    extra = [n for n in weights if n not in expected]
    if missing or extra:
        raise ValueError(f"weights must have exactly the names {expected}; missing: {missing}, "
                         f"unexpected: {extra}")
    arrays = {}
    for n in expected:
        a = weights[n]
        if not isinstance(a, np.ndarray):
            if hasattr(a, "copy_to_host") or hasattr(a, "__cuda_array_interface__"):
                a = v.to_host(a)
            elif hasattr(a, "detach") and hasattr(a, "cpu"):   # a PyTorch tensor
                a = a.detach().cpu().numpy()
            elif callable(getattr(a, "numpy", None)):          # a TensorFlow or Keras variable
                a = np.asarray(a.numpy())
            else:
                raise TypeError(f"weights[{n!r}] must be a NumPy array, got {type(a).__name__}")
        arrays[n] = a
    depth = num_proj or num_units
    kernel = arrays["kernel"]
    if kernel.ndim != 2 or kernel.shape[0] <= depth:
        raise ValueError(f"weights['kernel'] has shape {kernel.shape}; expected [I + {depth}, "
                         f"{4 * num_units}] with I > 0")
    found_depth = kernel.shape[0] - depth
    if input_depth is not None and found_depth != input_depth:
        raise ValueError(f"weights['kernel'] has shape {kernel.shape}; the cell was built for input depth "
                         f"{input_depth}: expected {(input_depth + depth, 4 * num_units)}")
    dtype = dtype or v.check_dtype("weights['kernel'] dtype", kernel.dtype)
    for n, shape in weight_shapes(found_depth, num_units, num_proj, use_peepholes).items():
        a = arrays[n]
        if a.shape != shape:
            raise ValueError(f"weights[{n!r}] has shape {a.shape}; expected {shape}")
        if a.dtype != dtype:
            raise TypeError(f"weights[{n!r}] has dtype {a.dtype}; expected {dtype} (the cell's dtype)")
        if not np.isfinite(a).all():
            raise ValueError(f"weights[{n!r}] has non-finite values")
    # C-contiguous copies: the kernels' packing reads rows (a transposed view, as the converters give, is
    # transposed here once).
    return ({n: arrays[n] if n in owned and arrays[n].flags.owndata and arrays[n].flags.c_contiguous
             else np.array(arrays[n], copy=True, order="C") for n in expected}, found_depth, dtype)


def save(path, config, weights):
    """Write a cell's configuration (JSON) and variables to one ``.npz`` file."""
    arrays = {f"weight:{n}": a for n, a in weights.items()}
    arrays["config"] = np.array(json.dumps(config))
    np.savez(os.fspath(path), **arrays)


def load(path):
    """``(config, weights)`` from a file written by :func:`save`.

    Nothing in the file is run: no pickles (``allow_pickle=False``: object
    arrays are refused), and the configuration is JSON. A file that is not
    such an ``.npz`` (empty, truncated, corrupt, another format) raises
    ``ValueError`` naming it; a missing one, the system's ``OSError``.
    """
    name = os.fspath(path)
    what = repr(name)
    not_ours = f"{what} is not an LSTMCell file (an .npz written by LSTMCell.save)"
    with open(name, "rb") as f:  # told apart here: numpy takes any other file for a pickle, and says so
        head = f.read(6)
    if not head:
        raise ValueError(f"{not_ours}: the file is empty")
    if head.startswith(b"\x93NUMPY"):
        raise ValueError(f"{not_ours}: it holds one array (a .npy file)")
    if not head.startswith(b"PK"):
        raise ValueError(f"{not_ours}: it is not a zip archive, which an .npz is")
    try:
        data = np.load(name, allow_pickle=False)
    except Exception as e:  # numpy and zipfile raise many kinds for a damaged archive; all mean "not ours"
        raise ValueError(f"{not_ours}: {type(e).__name__}: {e}") from None
    with data:
        if "config" not in data.files:
            raise ValueError(f"{not_ours}: no 'config' entry")
        try:  # the members are read here: a corrupt or truncated one fails now
            text = data["config"]
            weights = {k[len("weight:"):]: data[k] for k in data.files if k.startswith("weight:")}
        except Exception as e:  # zlib, zipfile and numpy errors of a damaged or foreign entry
            raise ValueError(f"{not_ours}: an entry cannot be read ({type(e).__name__}: {e})") from None
    if text.ndim != 0 or text.dtype.kind not in "US":
        raise ValueError(f"{not_ours}: its 'config' is not a string")
    try:
        config = json.loads(str(text))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{what}: its 'config' is not JSON ({type(e).__name__}: {e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{what}: its 'config' is a JSON {type(config).__name__}, not the dict of the cell's "
                         "arguments")
    return config, weights
