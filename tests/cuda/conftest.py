"""CUDA tests: a separate pytest run (the main run ignores tests/cuda).

Two kinds of test live here:

- ``test_ptx.py`` (and ``test_jit_cuda.py``'s PTX test of a user's kernel)
  compiles every kernel to PTX (``numba.cuda.compile_ptx``) for several
  compute capabilities. It needs numba-cuda with NVVM but no GPU
  and no driver; it is skipped under the simulator, which cannot compile.
- Every other module runs kernels, so it is skipped unless
  ``NUMBA_ENABLE_CUDASIM=1`` (Numba's CUDA simulator; set it before Python
  starts) or a real GPU is usable.

Run them with::

    NUMBA_ENABLE_CUDASIM=1 pytest tests/cuda   # kernels in the simulator
    pytest tests/cuda                          # PTX (and kernels, on a GPU machine)
"""

import os

import pytest

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def _gpu_usable():
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:  # noqa: BLE001 - no numba-cuda, no driver: no GPU
        return False


def _compile_only(item):
    return item.path.name == "test_ptx.py" or item.name.startswith("test_a_users_kernels_compile_to_ptx")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    ours = [item for item in items if str(item.path).startswith(here)]
    if not ours:
        return
    runs_kernels = SIMULATOR or _gpu_usable()
    skip_run = pytest.mark.skip(reason="needs NUMBA_ENABLE_CUDASIM=1 or a CUDA GPU")
    skip_ptx = pytest.mark.skip(reason="compile-only checks do not run under the CUDA simulator")
    for item in ours:
        if _compile_only(item):
            if SIMULATOR:
                item.add_marker(skip_ptx)
        elif not runs_kernels:
            item.add_marker(skip_run)
