"""Control of the BLAS library that numba's jitted ``np.dot`` calls.

Numba's ``np.dot`` calls SciPy's bundled OpenBLAS, a different library from
NumPy's. The CPU kernels call it from inside numba's parallel regions, one
single-threaded GEMM per thread: a multi-threaded BLAS there would fight
numba's own threads for the same cores (DESIGN.md measured 40-100x slowdowns).
:func:`single_threaded_blas` holds SciPy's BLAS to one thread for the duration
of a kernel and restores the caller's setting afterwards.
"""

import contextlib
import threading

_lock = threading.Lock()
_state = {"controllers": None, "depth": 0, "saved": None}


def _scipy_blas_controllers():
    """The threadpoolctl controllers of the BLAS libraries SciPy loaded."""
    if _state["controllers"] is None:
        # Load SciPy's BLAS first: a limit set before the library is loaded
        # would not reach it.
        import scipy.linalg.cython_blas  # noqa: F401
        from threadpoolctl import ThreadpoolController

        controller = ThreadpoolController()
        _state["controllers"] = [
            lib
            for lib in controller.lib_controllers
            if lib.user_api == "blas" and "scipy" in lib.filepath and "numpy" not in lib.filepath
        ] or [lib for lib in controller.lib_controllers if lib.user_api == "blas"]
    return _state["controllers"]


def _set_num_threads(lib, count):
    """Set ``lib``'s thread count from any Python thread.

    threadpoolctl lets only the first Python thread that changed OpenBLAS's
    (process-wide) thread count change it again, and silently ignores the
    others: kernels called from a second thread would then run a
    multi-threaded BLAS inside numba's threads. This module serialises the
    changes itself (lock and reference count), so it calls the setter below
    that rule where threadpoolctl has one.
    """
    getattr(lib, "_real_set_num_threads", lib.set_num_threads)(count)


@contextlib.contextmanager
def single_threaded_blas():
    """Context manager: SciPy's BLAS runs on one thread inside it.

    Re-entrant and safe to use from several Python threads at once: the
    setting is changed by the first thread to enter and restored by the last
    one to leave.
    """
    with _lock:
        if _state["depth"] == 0:
            libs = _scipy_blas_controllers()
            _state["saved"] = [lib.num_threads for lib in libs]
            for lib in libs:
                _set_num_threads(lib, 1)
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                for lib, n in zip(_state["controllers"], _state["saved"]):
                    _set_num_threads(lib, n)


def blas_info():
    """Describe SciPy's BLAS (the one jitted code calls): a list of dicts."""
    return [lib.info() for lib in _scipy_blas_controllers()]
