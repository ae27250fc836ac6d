"""Argument checks run before any kernel: numba does not bounds-check.

Every check raises ``TypeError`` (wrong kind of object, wrong dtype) or
``ValueError`` (wrong rank, shape or value) with a message that names the
argument, what was found and what was expected.
"""

import numbers

import numpy as np

__all__ = [
    "LAYOUTS",
    "SUPPORTED_DTYPES",
    "ArrayInfo",
    "check_arrays",
    "check_batch_size",
    "check_bool",
    "check_choice",
    "check_clip_bound",
    "check_dtype",
    "check_layout",
    "check_layout_fit",
    "check_lengths",
    "check_mask",
    "check_outputs",
    "check_positive_int",
    "check_real",
    "check_seq_len_max",
    "check_sequence_layout",
    "check_shape",
    "compute_dtype",
    "describe_array",
    "to_device",
    "to_host",
]

#: dtypes the kernels accept (float16 is computed in float32 on the CPU).
SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
LAYOUTS = ("ifco", "icfo")


def compute_dtype(dtype):
    """The dtype the kernels of every target compute ``dtype`` in: float16 in float32 (stored as float16)."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


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


def check_positive_int(name, value, allow_none=False):
    """Return ``value`` as an int ``> 0`` (or ``None`` when allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive int{' or None' if allow_none else ''}, "
                        f"got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return int(value)


def check_clip_bound(name, value):
    """Return a clip bound: ``None`` or a float ``>= 0`` (the cell's convention: ``0`` clips to zero)."""
    if value is None:
        return None
    value = check_real(name, value)
    if value < 0:
        raise ValueError(f"{name} must be >= 0 or None, got {value}")
    return value


def check_dtype(name, value, allow_none=True):
    """Return ``value`` as one of :data:`SUPPORTED_DTYPES` (or ``None`` when allowed)."""
    if value is None and allow_none:
        return None
    try:
        dt = np.dtype(value)
    except TypeError:
        raise TypeError(f"{name} must be float16, float32 or float64, got {value!r}") from None
    if dt not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be float16, float32 or float64, got {dt}")
    return dt


def check_batch_size(value, name="batch_size"):
    """Return a batch size, an int ``>= 0`` (an integral float is accepted, as TensorFlow does)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got bool")
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and float(value).is_integer():
        value = int(value)  # TensorFlow accepts a float batch size
    if not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def check_choice(name, value, choices):
    """Return ``value`` (a str, lower-cased) if it is one of ``choices``; ``TypeError``/``ValueError`` otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {choices}, got {type(value).__name__}")
    if value.lower() not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value.lower()


def _shape_of(value):
    """``value``'s shape as ints (a list or tuple of scalars: its length), or ``None``; never raises."""
    shape = getattr(value, "shape", None)
    if shape is None:
        if isinstance(value, (list, tuple)) and not any(isinstance(x, (list, tuple)) for x in value):
            return (len(value),)
        return None
    try:
        return tuple(int(n) for n in shape)
    except (TypeError, ValueError):
        return None


def check_layout_fit(inputs, shape, batch_major, flag, fix, args, mask=None):
    """Arguments sized for the other layout of the inputs: a ``ValueError`` that names the layout's flag.

    A ``[T, B, I]`` sequence read as ``[B, T, I]`` (or the reverse) makes
    the states, lengths and mask the caller sized for ``B`` look wrong; their
    own shape checks would only say "expected (B, ...)" of a ``B`` that is
    really ``T``. Nothing is raised without evidence: ``T == B``, or no
    argument sized like the time axis.

    Parameters
    ----------
    inputs : str
        The inputs' argument name.
    shape : tuple of int
        The inputs' shape as given, ``[B, T, I]`` when ``batch_major``, else ``[T, B, I]``.
    batch_major : bool
    flag : str
        The setting that reads them so, e.g. ``"batch_first=True"``.
    fix : str
        What to do when the inputs have the other layout.
    args : list of (str, object, int, int)
        ``(name, value, batch axis, rank)`` of the arguments sized by ``B``;
        a value without that rank (or ``None``) is left to its own checks.
    mask : [B, T] mask, optional
        Batch first whatever the layout.
    """
    if len(shape) < 2:
        return
    steps, batch = (shape[1], shape[0]) if batch_major else (shape[0], shape[1])
    if steps == batch:
        return
    read = "[B, T, I]" if batch_major else "[T, B, I]"
    other = "[T, B, I]" if batch_major else "[B, T, I]"
    seen = f"{inputs} {tuple(shape)} read as {read} ({flag}: B = {batch}, T = {steps})"
    for name, value, axis, rank in args:
        found = _shape_of(value)
        if found is not None and len(found) == rank and found[axis] == steps:
            raise ValueError(f"{name} has shape {found}, a batch of {steps}: that is the time axis of {seen}. If "
                             f"{inputs} is {other}, {fix}; otherwise {name} must have a batch of {batch}")
    found = _shape_of(mask) if mask is not None else None
    if found == (steps, batch):  # a transposed mask, or the inputs' other layout: both said, the mask first
        raise ValueError(f"mask has shape {found}; expected [B, T] = {(batch, steps)} (Keras's layout: batch first, "
                         f"whatever the layout of {inputs}), with {seen}. If {inputs} is {other}, {fix}")


def check_sequence_layout(state, sequence_length, shape, time_major, mask=None):
    """:func:`check_layout_fit` for the cell and ``dynamic_rnn``: a state, lengths or mask sized for the other
    ``time_major``.

    ``shape`` is the inputs' shape as given (``[T, B, I]`` when
    ``time_major``); a state's first array (``c``, or the first cell's of a
    ``MultiRNNCell``) has the batch on its first axis.
    """
    first = state
    while isinstance(first, (tuple, list)) and first:
        first = first[0]
    check_layout_fit("inputs", shape, not time_major, f"time_major={time_major}", f"pass time_major={not time_major}",
                     [("initial_state", first, 0, 2), ("sequence_length", sequence_length, 0, 1)], mask)


def check_mask(mask, steps, batch, name="mask"):
    """A Keras mask as a ``[B, T]`` bool NumPy array (``True``: the step is computed).

    ``mask`` may be a NumPy array, nested lists, or an array on a GPU (copied
    to the host: the schedule is built there), of dtype bool or 0/1 integers.
    """
    if not isinstance(mask, np.ndarray):
        if hasattr(mask, "copy_to_host") or hasattr(mask, "__cuda_array_interface__"):
            mask = to_host(mask)
        elif isinstance(mask, (list, tuple)):
            mask = np.asarray(mask)
        else:
            raise TypeError(f"{name} must be a [B, T] bool array, got {type(mask).__name__}")
    if mask.dtype != np.bool_:
        if mask.dtype.kind not in "iu" or mask.size and not np.isin(mask, (0, 1)).all():
            raise TypeError(f"{name} must be a [B, T] bool array (or of 0/1 integers), got dtype {mask.dtype}")
        mask = mask.astype(bool)
    if mask.shape != (batch, steps):
        raise ValueError(f"{name} has shape {mask.shape}; expected [B, T] = ({batch}, {steps}) (Keras's layout: "
                         "batch first, whatever the layout of the inputs)")
    return np.ascontiguousarray(mask)


def check_lengths(sequence_length, steps, batch):
    """Per-example lengths as a ``[B]`` int64 NumPy array in ``[0, T]``; ``None`` means ``T`` for every example.

    ``sequence_length`` may be a NumPy array, a list or tuple of ints, or an
    array on a GPU (copied to the host: the lengths are validated there).
    """
    if sequence_length is None:
        return np.full(batch, steps, np.int64)
    if not isinstance(sequence_length, np.ndarray):
        if hasattr(sequence_length, "copy_to_host") or hasattr(sequence_length, "__cuda_array_interface__"):
            sequence_length = to_host(sequence_length)
        elif isinstance(sequence_length, (list, tuple)):
            if not all(isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))
                       for x in sequence_length):
                raise TypeError("sequence_length must hold integers")
            sequence_length = np.array(sequence_length, np.int64).reshape(len(sequence_length))
        else:
            raise TypeError(f"sequence_length must be a [B] integer array or list, got "
                            f"{type(sequence_length).__name__}")
    if sequence_length.dtype.kind not in "iu":
        raise TypeError(f"sequence_length must have an integer dtype, got {sequence_length.dtype}")
    if sequence_length.shape != (batch,):
        raise ValueError(f"sequence_length has shape {sequence_length.shape}; expected ({batch},) "
                         "(one length per example, B from inputs)")
    if batch and (sequence_length.min() < 0 or sequence_length.max() > steps):
        raise ValueError(f"sequence_length values must be in [0, T] = [0, {steps}], got "
                         f"min {sequence_length.min()}, max {sequence_length.max()}")
    return sequence_length.astype(np.int64)


def check_outputs(outputs, names, name="outputs"):
    """The forward outputs ``names`` (``("i", "cs", ...)``) as a tuple: from a named tuple, a sequence or a dict."""
    if isinstance(outputs, dict):
        try:
            return tuple(outputs[k] for k in names)
        except KeyError as missing:
            raise ValueError(f"{name} lacks the forward output {missing}") from None
    if not isinstance(outputs, (tuple, list)):
        raise TypeError(f"{name} must be the tuple of forward outputs (i, cs, f, o, ci, co, h), "
                        f"got {type(outputs).__name__}")
    if len(outputs) < len(names):
        raise ValueError(f"{name} must hold the {len(names)} forward outputs {tuple(names)}, got {len(outputs)}")
    return tuple(outputs[:len(names)])


def to_host(value):
    """A NumPy copy of an array that lives on a GPU (``numba.cuda`` imported only here)."""
    if hasattr(value, "copy_to_host"):
        return value.copy_to_host()
    from numba import cuda

    return cuda.as_cuda_array(value).copy_to_host()


def to_device(value):
    """A Numba device array copied from a host array."""
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(value))
