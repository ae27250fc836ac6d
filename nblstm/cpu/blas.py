"""Control of the BLAS library that numba's jitted ``np.dot`` calls.

Numba's ``np.dot`` calls SciPy's bundled OpenBLAS, a different library from
NumPy's. The CPU kernels call it from their worker threads, one
single-threaded GEMM per thread: a multi-threaded BLAS there would fight
the workers for the same cores (40-100x slowdowns measured: :ref:`design-threads`).
:func:`single_threaded_blas` holds SciPy's BLAS to one thread for the duration
of a kernel and restores the caller's setting afterwards; :class:`kernel_section`
is what every kernel call runs inside.

SciPy's BLAS is loaded without the rest of ``scipy.linalg``
(:func:`_load_scipy_blas`): the package took 0.15-0.2 s of a warm process's
first call.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
from pathlib import Path

__all__ = ["blas_info", "kernel_section", "single_threaded_blas"]

_lock = threading.Lock()
_state = {"controllers": None, "controls": None, "depth": 0, "saved": None}


_BLAS_MODULE = "scipy.linalg.cython_blas"
_load_lock = threading.Lock()


class _SetOnParent(importlib.abc.MetaPathFinder):
    """Gives ``scipy.linalg``, when it is imported after :func:`_load_scipy_blas`, its ``cython_blas`` attribute.

    Python sets a submodule as an attribute of its package when it imports
    the submodule, which here came first: this finder finds ``scipy.linalg``
    as the other finders do, and sets the attribute once the package has
    run. It leaves ``sys.meta_path`` only then, so that a mere look-up
    (``importlib.util.find_spec``) or an import that fails does not use it up.
    """

    def find_spec(self, name, path=None, target=None):
        if name != "scipy.linalg":
            return None
        at = sys.meta_path.index(self) if self in sys.meta_path else len(sys.meta_path)
        for finder in sys.meta_path[at + 1:]:  # the finders after this one, as the import system would ask them
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module, finder = loader.exec_module, self

        def exec_and_set(module):
            exec_module(module)
            module.cython_blas = sys.modules[_BLAS_MODULE]
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)

        loader.exec_module = exec_and_set
        return spec


def _load_scipy_blas():
    """Load ``scipy.linalg.cython_blas`` (SciPy's BLAS, whose functions numba's jitted products call) without running
    the ``scipy.linalg`` package.

    Importing the module imports its package first, which imports most of
    SciPy's array API layer and ``numpy.f2py``: 0.15-0.2 s here, against
    0.012 s for the extension module alone (what numba needs: it finds the
    module in ``sys.modules`` and reads its C functions). ``scipy`` itself
    is imported first (it prepares the loading of its libraries on some
    platforms), then the extension is loaded from its file and registered
    under its name; :class:`_SetOnParent` completes a later import of
    ``scipy.linalg``. Where anything of this fails (SciPy laid out
    otherwise), the usual import runs.
    """
    with _load_lock:
        if _BLAS_MODULE in sys.modules:
            return
        if "scipy.linalg" not in sys.modules:
            try:
                _load_extension_alone()
                return
            except Exception:  # noqa: BLE001 - any failure: the usual import below
                sys.modules.pop(_BLAS_MODULE, None)
        import scipy.linalg.cython_blas  # noqa: F401


def _load_extension_alone():
    import scipy

    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = Path(scipy.__path__[0]) / "linalg" / f"cython_blas{suffix}"
        if path.is_file():
            break
    else:
        raise ImportError(f"no {_BLAS_MODULE} extension file in {scipy.__path__[0]}")
    spec = importlib.util.spec_from_file_location(_BLAS_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_BLAS_MODULE] = module
    spec.loader.exec_module(module)
    sys.meta_path.insert(0, _SetOnParent())


def _scipy_blas_controllers():
    """The threadpoolctl controllers of the BLAS libraries SciPy loaded."""
    if _state["controllers"] is None:
        # Load SciPy's BLAS first: a limit set before the library is loaded
        # would not reach it.
        _load_scipy_blas()
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
