"""Shared test helpers: random LSTM problems, tolerances, and fresh interpreters."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import nblstm

#: (rtol, atol) for forward outputs and for gradients, per dtype (docs/specification.rst, "Tolerances").
FORWARD_TOL = {np.float64: (1e-10, 1e-12), np.float32: (1e-6, 1e-6), np.float16: (8e-3, 8e-4)}
GRAD_TOL = {np.float64: (1e-9, 1e-11), np.float32: (1e-5, 1e-5), np.float16: (1e-2, 1e-2)}

OUTPUT_NAMES = ("i", "cs", "f", "o", "ci", "co", "h")
GRAD_NAMES = ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad", "wco_grad", "b_grad")


def make_problem(rng, steps, batch, inputs, units, dtype=np.float64, scale=1.0):
    """Random inputs and weights, scaled so gate pre-activations are of order one.

    Returns
    -------
    dict
        ``x [T, B, I], cs_prev, h_prev [B, H], w [I + H, 4H], b [4H], wci, wcf, wco [H]``.
    """
    fan = max(inputs + units, 1)
    p = {
        "x": rng.standard_normal((steps, batch, inputs)),
        "cs_prev": rng.standard_normal((batch, units)),
        "h_prev": rng.uniform(-1, 1, (batch, units)),
        "w": rng.standard_normal((inputs + units, 4 * units)) * scale / np.sqrt(fan),
        "b": rng.standard_normal(4 * units) * 0.5,
        "wci": rng.standard_normal(units) * 0.5,
        "wcf": rng.standard_normal(units) * 0.5,
        "wco": rng.standard_normal(units) * 0.5,
    }
    return {k: v.astype(dtype) for k, v in p.items()}


def make_problem_with_grads(dtype, steps, batch, inputs, units, seed=0):
    """:func:`make_problem` from ``default_rng(seed)``, and random output gradients ``h_grad, cs_grad [T, B, H]``."""
    rng = np.random.default_rng(seed)
    p = make_problem(rng, steps, batch, inputs, units, dtype)
    for name in ("h_grad", "cs_grad"):
        p[name] = rng.standard_normal((steps, batch, units)).astype(dtype)
    return p


def assert_close(actual, expected, dtype, tol=FORWARD_TOL, name=""):
    """``assert_allclose`` with the dtype's tolerance; ``expected`` is float64."""
    rtol, atol = tol[np.dtype(dtype).type]
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol, err_msg=name)


#: The folder that holds the nblstm under test (the checkout, or site-packages where it is installed): fresh
#: interpreters import it from there.
ROOT = Path(nblstm.__file__).resolve().parents[1]


def run_python(code, env=None, timeout=600):
    """Run ``code`` in a fresh interpreter on the nblstm under test; its stdout (a failure shows the output)."""
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env or dict(os.environ), capture_output=True,
                            text=True, timeout=timeout)
    assert result.returncode == 0, (result.stdout + result.stderr)[-8000:]
    return result.stdout
