"""The initializers of a cell's variables: callables ``(shape, dtype, rng) -> array``, Keras' definitions."""

import numpy as np

__all__ = ["INITIALIZER_NAMES", "initializer_of"]


def _fans(shape):
    if len(shape) == 1:
        return shape[0], shape[0]
    return shape[0], shape[1]


def _glorot_uniform(shape, dtype, rng):
    fan_in, fan_out = _fans(shape)
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, shape).astype(dtype)


def _glorot_normal(shape, dtype, rng):
    fan_in, fan_out = _fans(shape)
    return _truncated(rng, np.sqrt(2.0 / (fan_in + fan_out)), shape).astype(dtype)


def _lecun_uniform(shape, dtype, rng):
    limit = np.sqrt(3.0 / _fans(shape)[0])
    return rng.uniform(-limit, limit, shape).astype(dtype)


def _he_uniform(shape, dtype, rng):
    limit = np.sqrt(6.0 / _fans(shape)[0])
    return rng.uniform(-limit, limit, shape).astype(dtype)


def _he_normal(shape, dtype, rng):
    return _truncated(rng, np.sqrt(2.0 / _fans(shape)[0]), shape).astype(dtype)


def _truncated(rng, std, shape):
    """Normal samples redrawn beyond two standard deviations, scaled so the result has ``std``."""
    # 0.8796... is the std of a unit normal truncated to [-2, 2] (Keras' correction).
    scale = std / 0.87962566103423978
    out = rng.standard_normal(shape)
    bad = np.abs(out) > 2
    while bad.any():
        out[bad] = rng.standard_normal(int(bad.sum()))
        bad = np.abs(out) > 2
    return out * scale


def _orthogonal(shape, dtype, rng):
    if len(shape) < 2:
        raise ValueError(f"the 'orthogonal' initializer needs a matrix; the variable has shape {shape} "
                         "(peephole weights are vectors: pass another initializer with use_peepholes=True)")
    rows, cols = shape
    a = rng.standard_normal((max(rows, cols), min(rows, cols)))
    q, r = np.linalg.qr(a)
    q = q * np.sign(np.diag(r))
    if rows < cols:
        q = q.T
    return q.astype(dtype)


_INITIALIZERS = {
    "glorot_uniform": _glorot_uniform,
    "glorot_normal": _glorot_normal,
    "lecun_uniform": _lecun_uniform,
    "he_uniform": _he_uniform,
    "he_normal": _he_normal,
    "orthogonal": _orthogonal,
    "uniform": lambda shape, dtype, rng: rng.uniform(-0.05, 0.05, shape).astype(dtype),
    "random_uniform": lambda shape, dtype, rng: rng.uniform(-0.05, 0.05, shape).astype(dtype),
    "normal": lambda shape, dtype, rng: (0.05 * rng.standard_normal(shape)).astype(dtype),
    "random_normal": lambda shape, dtype, rng: (0.05 * rng.standard_normal(shape)).astype(dtype),
    "truncated_normal": lambda shape, dtype, rng: _truncated(rng, 0.05, shape).astype(dtype),
    "zeros": lambda shape, dtype, rng: np.zeros(shape, dtype),
    "ones": lambda shape, dtype, rng: np.ones(shape, dtype),
}

#: Initializer names accepted by :class:`nblstm.LSTMCell`.
INITIALIZER_NAMES = tuple(_INITIALIZERS)


def initializer_of(value):
    """``(name, function)`` of an initializer given by name or as a callable (name ``None``)."""
    if value is None:
        return "glorot_uniform", _INITIALIZERS["glorot_uniform"]
    if isinstance(value, str):
        key = value.lower()
        if key not in _INITIALIZERS:
            raise ValueError(f"initializer {value!r} is not supported; expected one of {INITIALIZER_NAMES} "
                             "or a callable (shape, dtype, rng) -> array")
        return key, _INITIALIZERS[key]
    if callable(value):
        return None, value
    raise TypeError(f"initializer must be a name or a callable (shape, dtype, rng) -> array, "
                    f"got {type(value).__name__}")
