"""Cold-start benchmarks: a fresh interpreter that imports nblstm and makes its first calls.

Each ``timeraw_`` function returns the code that asv times in a new process.
``*_cached`` use numba's on-disk cache, as a user's second run does
(``setup`` fills it first); ``*_compile`` point numba at an empty cache
folder, as the first run after installing does, and so time the JIT.

The ``track_`` benchmarks of :class:`ColdStart` and :class:`WarmStart` return the
wall seconds of one such process (start to exit), for the fused ops' first
forward and backward and for an :class:`nblstm.LSTMCell`'s first ``run``,
``vjp`` and backward: with an empty numba cache folder of their own (cold), or
one that a first process filled (warm).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

_FIRST_CALLS = """
import numpy as np
import nblstm
T, B, I, H = 4, 2, 3, 5
x = np.ones((T, B, I), np.float32)
c = np.zeros((B, H), np.float32)
w = np.full((I + H, 4 * H), 0.1, np.float32)
b = np.zeros(4 * H, np.float32)
out = nblstm.block_lstm(x, c, c, w, b)
{grad}
"""
_GRAD = "nblstm.block_lstm_grad(x, c, c, w, out, None, np.ones_like(out.h))"
_EMPTY_CACHE = """
import atexit, os, shutil, tempfile
os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="nblstm-asv-")
atexit.register(shutil.rmtree, os.environ["NUMBA_CACHE_DIR"], True)
"""


def _fill_cache():
    """Run the first calls once in a subprocess so that numba's cache is current."""
    code = _FIRST_CALLS.format(grad=_GRAD)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def timeraw_import():
    """``import nblstm`` alone: compiles nothing, needs no CUDA driver."""
    return "import nblstm"


def timeraw_import_numba():
    """``import numba`` alone: the floor under nblstm's first call (which imports numba)."""
    return "import numba"


class FirstCall:
    """Import plus the first forward (and backward) call, with numba's cache filled."""

    timeout = 300
    repeat = (1, 5, 30.0)

    def setup(self):
        _fill_cache()

    def timeraw_forward_cached(self):
        return _FIRST_CALLS.format(grad="")

    def timeraw_forward_backward_cached(self):
        return _FIRST_CALLS.format(grad=_GRAD)


class FirstCallCompile:
    """Import plus the first forward call with an empty numba cache: the JIT compilation itself."""

    timeout = 600
    repeat = (1, 2, 60.0)

    def timeraw_forward_compile(self):
        return _FIRST_CALLS.format(grad=""), _EMPTY_CACHE


_CELL_CALLS = """
import numpy as np
import nblstm
cell = nblstm.LSTMCell(5, seed=0)
x = np.ones((4, 2, 3), np.float32)
outputs, final = cell.run(x)
(outputs, final), backward = cell.vjp(x)
backward(np.ones_like(outputs))
"""


def _process_seconds(code, cache_dir):
    """Wall seconds of ``python -c code`` (start to exit) with numba's cache in ``cache_dir``."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def _cold_seconds(code):
    cache_dir = tempfile.mkdtemp(prefix="nblstm-asv-cold-")
    try:
        return _process_seconds(code, cache_dir)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


class ColdStart:
    """A fresh process's import and first calls with an empty numba cache: the JIT compilation of what they need."""

    timeout = 900
    unit = "seconds"

    def track_ops_forward_backward(self):
        """Import, then the first ``block_lstm`` and ``block_lstm_grad`` (float32, T, B, I, H = 4, 2, 3, 5)."""
        return _cold_seconds(_FIRST_CALLS.format(grad=_GRAD))

    def track_cell_run_vjp_backward(self):
        """Import, then an LSTMCell's first ``run``, ``vjp`` and backward (float32, 5 units)."""
        return _cold_seconds(_CELL_CALLS)


class WarmStart:
    """The same processes with numba's cache filled by a first one, as every later run of a program."""

    timeout = 900
    unit = "seconds"

    def setup_cache(self):
        # asv runs this in a temporary folder that it removes after the benchmarks of this class.
        cache_dir = os.path.abspath("numba-cache")
        for code in (_FIRST_CALLS.format(grad=_GRAD), _CELL_CALLS):
            _process_seconds(code, cache_dir)
        return cache_dir

    def track_ops_forward_backward(self, cache_dir):
        """As :meth:`ColdStart.track_ops_forward_backward`, with the kernels loaded from the cache."""
        return _process_seconds(_FIRST_CALLS.format(grad=_GRAD), cache_dir)

    def track_cell_run_vjp_backward(self, cache_dir):
        """As :meth:`ColdStart.track_cell_run_vjp_backward`, with the kernels loaded from the cache."""
        return _process_seconds(_CELL_CALLS, cache_dir)
