"""Argument checks run before any kernel: numba does not bounds-check.

Every check raises ``TypeError`` (wrong kind of object, wrong dtype) or
``ValueError`` (wrong rank, shape or value) with a message that names the
argument, what was found and what was expected.
"""

import numbers

import numpy as np

#: dtypes the kernels accept (float16 is computed in float32 on the CPU).
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
LAYOUTS = ("ifco", "icfo")


class ArrayInfo:
    """What validation needs to know about one array argument.

    Attributes
    ----------
    name : str
    value : object
        The array as given.
    kind : {"host", "device"}
        ``"host"`` for NumPy arrays, ``"device"`` for objects that live on a
        GPU (``__cuda_array_interface__``, or the CUDA simulator's arrays).
    shape : tuple of int
    dtype : numpy.dtype
    """

    __slots__ = ("name", "value", "kind", "shape", "dtype")

    def __init__(self, name, value, kind, shape, dtype):
        self.name, self.value, self.kind, self.shape, self.dtype = name, value, kind, shape, dtype


def describe_array(name, value):
    """Classify ``value`` as a host or device array, or raise ``TypeError``."""
    if isinstance(value, np.ndarray):
        return ArrayInfo(name, value, "host", value.shape, value.dtype)
    cai = getattr(value, "__cuda_array_interface__", None)
    if cai is not None:
        return ArrayInfo(name, value, "device", tuple(cai["shape"]), np.dtype(cai["typestr"]))
    if hasattr(value, "__cuda_ndarray__"):  # numba's CUDA simulator device arrays
        return ArrayInfo(name, value, "device", tuple(value.shape), np.dtype(value.dtype))
    raise TypeError(
        f"{name} must be a NumPy array or an array on a GPU (with __cuda_array_interface__), "
        f"got {type(value).__name__}"
    )


def check_arrays(named, ranks):
    """Describe every array argument and check kinds, ranks and dtypes.

    Parameters
    ----------
    named : dict
        ``{name: value}`` in the order of the signature.
    ranks : dict
        ``{name: expected rank}``.

    Returns
    -------
    dict
        ``{name: ArrayInfo}``.

    Raises
    ------
    TypeError
        A non-array argument, an unsupported or mismatched dtype, or host and
        device arrays mixed in one call.
    ValueError
        An argument of the wrong rank.
    """
    if all(type(value) is np.ndarray for value in named.values()):  # the usual case, in one pass
        infos = {name: ArrayInfo(name, value, "host", value.shape, value.dtype) for name, value in named.items()}
        kinds = ("host",)
    else:
        infos = {name: describe_array(name, value) for name, value in named.items()}
        kinds = {info.kind for info in infos.values()}
    if len(kinds) > 1:
        host = [n for n, i in infos.items() if i.kind == "host"]
        device = [n for n, i in infos.items() if i.kind == "device"]
        raise TypeError(
            f"arrays must all be NumPy arrays or all be GPU arrays; host: {', '.join(host)}; "
            f"device: {', '.join(device)}"
        )
    first = next(iter(infos.values()))
    if first.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{first.name} has dtype {first.dtype}; expected float16, float32 or float64")
    for info in infos.values():
        if info.dtype is not first.dtype and info.dtype != first.dtype:
            raise TypeError(
                f"{info.name} has dtype {info.dtype}; expected {first.dtype} (the dtype of {first.name}): "
                "all arrays must share one dtype"
            )
        rank = ranks[info.name]
        if len(info.shape) != rank:
            raise ValueError(f"{info.name} must have rank {rank}, got shape {info.shape}")
    return infos


def check_shape(info, expected, meaning):
    """Raise ``ValueError`` unless ``info.shape == expected``."""
    if tuple(info.shape) != tuple(expected):
        raise ValueError(f"{info.name} has shape {tuple(info.shape)}; expected {tuple(expected)} ({meaning})")


def check_seq_len_max(value, steps):
    """Return ``seq_len_max`` as an int in ``[0, steps]``; ``None`` means ``steps``."""
    if value is None:
        return steps
    if isinstance(value, np.ndarray):
        if value.ndim != 0:
            raise ValueError(f"seq_len_max must be a scalar, got an array of shape {value.shape}")
        value = value[()]
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"seq_len_max must be an integer scalar, got {type(value).__name__}")
    value = int(value)
    if not 0 <= value <= steps:
        raise ValueError(f"seq_len_max must be in [0, T] = [0, {steps}] (T = x.shape[0]), got {value}")
    return value


def check_real(name, value):
    """Return ``value`` as a float; ``TypeError`` unless it is a real number, ``ValueError`` for NaN."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if value != value:
        raise ValueError(f"{name} must not be NaN")
    return value


def check_bool(name, value):
    """Return ``value`` as a bool; ``TypeError`` unless it is a bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_layout(value):
    """Return the gate layout name; ``ValueError`` unless it is ``"ifco"`` or ``"icfo"``."""
    if not isinstance(value, str):
        raise TypeError(f"layout must be a str, got {type(value).__name__}")
    if value.lower() not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {value!r}")
    return value.lower()
