"""The activations a cell may use for ``j`` and its output, by their Keras names.

The kernels know each activation by an integer code (:data:`nblstm.spec.ACTIVATIONS`);
:class:`Activation` carries the name and the code, and applies the activation to
NumPy arrays for reference. Importing this module does not import numba.
"""

import numpy as np

from ..options import ACTIVATION_NAMES

__all__ = ["ACTIVATION_NAMES", "Activation", "activation_of"]

# SELU's constants (Klambauer et al., 2017), as in Keras and nblstm.spec.
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_NUMPY_ACTIVATIONS = {
    "tanh": np.tanh,
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": _sigmoid,
    "elu": lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0))),
    "softsign": lambda x: x / (1 + np.abs(x)),
    "softplus": lambda x: np.logaddexp(0, x),
    "selu": lambda x: _SELU_SCALE * np.where(x > 0, x, _SELU_ALPHA * np.expm1(np.minimum(x, 0))),
    "linear": lambda x: x,
    "hard_sigmoid": lambda x: np.clip(x + 3.0, 0.0, 6.0) / 6.0,  # Keras 3's: relu6(x + 3) / 6
}


class Activation:
    """An activation the kernels know, by its Keras name.

    Calling it applies it to a NumPy array (for reference and plots); the
    kernels use its integer :attr:`code`.

    Parameters
    ----------
    name : str
        One of :data:`ACTIVATION_NAMES`.

    Examples
    --------
    >>> Activation("relu")(np.array([-1.0, 2.0]))
    array([0., 2.])
    """

    __slots__ = ("name", "code")

    def __init__(self, name):
        key = str(name).lower()
        if key not in ACTIVATION_NAMES:
            raise ValueError(f"activation {name!r} is not supported; expected one of {ACTIVATION_NAMES}")
        self.name = key
        self.code = ACTIVATION_NAMES.index(key)

    def __call__(self, x):
        return _NUMPY_ACTIVATIONS[self.name](np.asarray(x))

    def __repr__(self):
        return f"Activation({self.name!r})"

    def __eq__(self, other):
        return isinstance(other, Activation) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


def activation_of(value):
    """An :class:`Activation` from ``None`` (tanh), a name, an Activation or a function with a known name."""
    if value is None:
        return Activation("tanh")
    if isinstance(value, Activation):
        return value
    if isinstance(value, str):
        return Activation(value)
    name = getattr(value, "__name__", None)
    if callable(value) and isinstance(name, str) and name.lower() in ACTIVATION_NAMES:
        return Activation(name)
    raise ValueError(f"activation {value!r} is not supported: pass one of the names {ACTIVATION_NAMES} "
                     "or an nblstm.cell.Activation")
