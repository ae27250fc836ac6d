"""The kernels give the same bits compiled afresh and loaded from numba's cache.

numba optimizes a kernel compiled afresh together with the functions it
calls, while a kernel loaded from the cache is the machine code saved then;
with ``fastmath={"contract"}`` LLVM fused different multiplies and adds in
the two cases, and float32 results differed in the last bit between the
first run of a program and the later ones (:mod:`nblstm._jit`). Two fresh
processes share one empty cache folder: the first compiles and saves, the
second loads; both print a digest of their results.
"""

import os
import subprocess
import sys

_CODE = """
import hashlib
import numpy as np
import nblstm

rng = np.random.default_rng(5)
digest = hashlib.sha256()
for dtype in (np.float32, np.float64):
    T, B, I, H = 6, 8, 5, 16
    x = rng.standard_normal((T, B, I)).astype(dtype)
    c, h = (0.5 * rng.standard_normal((B, H))).astype(dtype), (0.5 * rng.standard_normal((B, H))).astype(dtype)
    w = (0.3 * rng.standard_normal((I + H, 4 * H))).astype(dtype)
    b, p = (0.1 * rng.standard_normal(4 * H)).astype(dtype), (0.2 * rng.standard_normal(H)).astype(dtype)
    out = nblstm.block_lstm(x, c, h, w, b, p, p, p, forget_bias=1.0, cell_clip=1.5, use_peephole=True)
    grads = nblstm.block_lstm_grad(x, c, h, w, out, out.cs, out.h, p, p, p, use_peephole=True)
    cell = nblstm.LSTMCell(H, use_peepholes=True, forget_bias=0.5, num_proj=7, dtype=dtype, seed=3)
    (outputs, final), backward = cell.vjp(x, None, [6, 1, 0, 6, 3, 6, 2, 5])
    d_x, d_state, d_w = backward(np.ones_like(outputs))
    for a in (*out, *grads, outputs, *final, d_x, *d_state, *d_w.values()):
        digest.update(np.ascontiguousarray(a).tobytes())
print(digest.hexdigest())
"""


def test_fresh_and_cached_kernels_give_the_same_bits(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    runs = [subprocess.run([sys.executable, "-c", _CODE], env=env, capture_output=True, text=True, timeout=900)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    fresh, cached = (run.stdout.strip() for run in runs)
    assert fresh == cached, "results of the kernels loaded from the cache differ from those compiled afresh"
