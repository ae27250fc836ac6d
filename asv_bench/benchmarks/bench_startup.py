"""Cold-start benchmarks: a fresh interpreter that imports nblstm and makes its first calls.

Each ``timeraw_`` function returns the code that asv times in a new process.
``*_cached`` use numba's on-disk cache, as a user's second run does
(``setup`` fills it first); ``*_compile`` point numba at an empty cache
folder, as the first run after installing does, and so time the JIT.
"""

import subprocess
import sys

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
