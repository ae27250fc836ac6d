"""Control of the BLAS library that numba's jitted ``np.dot`` calls.

Numba's ``np.dot`` calls SciPy's bundled OpenBLAS, a different library from
NumPy's. The CPU kernels call it from their worker threads, one
single-threaded GEMM per thread: a multi-threaded BLAS there would fight
the workers for the same cores (40-100x slowdowns measured: :ref:`design-threads`).
:func:`single_threaded_blas` holds SciPy's BLAS to one thread for the duration
of a kernel and restores the caller's setting afterwards; :class:`kernel_section`
is what every kernel call runs inside.
"""

import threading

__all__ = ["blas_info", "kernel_section", "single_threaded_blas"]

_lock = threading.Lock()
_state = {"controllers": None, "controls": None, "depth": 0, "saved": None}


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


def _thread_controls():
    """``[(get, set)]``: functions reading and setting each BLAS's thread count.

    Every kernel call changes the count and changes it back, so the calls
    are resolved once: for OpenBLAS (pthreads) the library's own
    ``openblas_get/set_num_threads`` through ctypes, a fraction of a
    microsecond each, where threadpoolctl's generic path costs several.

    threadpoolctl lets only the first Python thread that changed OpenBLAS's
    (process-wide) thread count change it again, and silently ignores the
    others: kernels called from a second thread would then run a
    multi-threaded BLAS inside numba's threads. This module serialises the
    changes itself (lock and reference count), so it calls the setter below
    that rule where threadpoolctl has one.
    """
    if _state["controls"] is None:
        controls = []
        for lib in _scipy_blas_controllers():
            getter = setter = None
            if lib.internal_api == "openblas" and lib.threading_layer != "openmp":
                getter = lib._get_symbol("openblas_get_num_threads")
                setter = lib._get_symbol("openblas_set_num_threads")
            if getter is None or setter is None:
                getter = lib.get_num_threads
                setter = getattr(lib, "_real_set_num_threads", lib.set_num_threads)
            controls.append((getter, setter))
        _state["controls"] = controls
    return _state["controls"]


class _SingleThreadedBlas:
    """The context manager :func:`single_threaded_blas` returns (a class, not
    a generator: it is entered on every kernel call)."""

    __slots__ = ()

    def __enter__(self):
        with _lock:
            if _state["depth"] == 0:
                controls = _thread_controls()
                _state["saved"] = [get() for get, _ in controls]
                for (_, set_threads), saved in zip(controls, _state["saved"]):
                    if saved != 1:
                        set_threads(1)
            _state["depth"] += 1
        return self

    def __exit__(self, *exc_info):
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                for (_, set_threads), saved in zip(_state["controls"], _state["saved"]):
                    if saved != 1:
                        set_threads(saved)
        return False


_SINGLE_THREADED_BLAS = _SingleThreadedBlas()


def single_threaded_blas():
    """Context manager: SciPy's BLAS runs on one thread inside it.

    Re-entrant and safe to use from several Python threads at once: the
    setting is changed by the first thread to enter and restored by the last
    one to leave.
    """
    return _SINGLE_THREADED_BLAS


def blas_info():
    """Describe SciPy's BLAS (the one jitted code calls): a list of dicts."""
    return [lib.info() for lib in _scipy_blas_controllers()]


class kernel_section:  # noqa: N801 (used like a function: ``with kernel_section():``)
    """What every kernel call runs inside: SciPy's BLAS on one thread.

    A class rather than a generator-based context manager: it is entered on
    every kernel call, and this costs a third of the time.
    """

    __slots__ = ()

    def __enter__(self):
        _SINGLE_THREADED_BLAS.__enter__()
        return self

    def __exit__(self, *exc_info):
        _SINGLE_THREADED_BLAS.__exit__(*exc_info)
        return False
