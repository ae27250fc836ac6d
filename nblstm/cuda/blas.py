"""cuBLAS for the large products of the CUDA target: the input projection, the gradient GEMMs, the bias gradient.

The tiled kernel of :mod:`nblstm.cuda.gemm` reaches a fraction of what
cuBLAS does on these shapes, so on a GPU :meth:`nblstm.cuda.launch.Launcher.gemm`
calls ``cublasGemmEx`` through a maintained binding that takes raw device
pointers and streams:

- nvmath-python's ``nvmath.bindings.cublas`` (NVIDIA's; the ``cuda`` extra
  installs it with the cuBLAS library), else
- CuPy's ``cupy_backends.cuda.libs.cublas`` (where CuPy is installed).

Both bind the same C function, so the choice changes nothing in the
results; nvmath-python is preferred because it is what the ``cuda`` extra
installs, and CuPy is a large dependency to ask for a single function.
Without a binding, in the simulator, or with :data:`nblstm.cuda.config.BLAS`
``False``, the tiled kernel runs.

Row-major products are column-major products of the transposes:
``C = op(A) @ op(B)`` with ``C: [M, N]`` row-major is the column-major
``C^T = op(B)^T @ op(A)^T``, so :func:`gemm` swaps the operands and passes
each array's row stride as its leading dimension; no array is copied.
A bias is written into ``C`` first (one broadcast kernel) and added by
``beta = 1``; so is an accumulation.

``precision`` (:data:`nblstm.options.PRECISIONS`) picks cuBLAS's compute type: ``"exact"``
computes in the compute dtype (``CUBLAS_COMPUTE_32F`` or ``_64F``: no
reduced-precision tensor cores); ``"tf32"`` lets float32 products run on
TF32 tensor cores (10-bit mantissas of the operands, float32 sums);
``"fp16"`` rounds the operands to float16 for the tensor cores (float32
sums). The reduced precisions apply to float32 computation only (float32
and float16 storage).
"""

import ctypes
import threading
import warnings

import numpy as np

from . import config
from .config import SIMULATOR

__all__ = ["Binding", "StepGemm", "available", "backend_name", "gemm", "handle_for", "pointer", "reset"]


# cuBLAS's enumerations (cublas_api.h, library_types.h): stable parts of the C API.
_OP_N, _OP_T = 0, 1
_CUDA_R_32F, _CUDA_R_64F = 0, 1
_COMPUTE = {
    ("exact", np.dtype(np.float32)): 68,  # CUBLAS_COMPUTE_32F
    ("tf32", np.dtype(np.float32)): 77,  # CUBLAS_COMPUTE_32F_FAST_TF32
    ("fp16", np.dtype(np.float32)): 74,  # CUBLAS_COMPUTE_32F_FAST_16F
    ("exact", np.dtype(np.float64)): 70,  # CUBLAS_COMPUTE_64F
}
_DATA_TYPE = {np.dtype(np.float32): _CUDA_R_32F, np.dtype(np.float64): _CUDA_R_64F}
_SCALAR = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double}
_GEMM_DEFAULT = -1  # CUBLAS_GEMM_DEFAULT


class Binding:
    """The three cuBLAS functions the target calls, from one Python binding.

    Attributes
    ----------
    name : str
        ``"nvmath"`` or ``"cupy"``.
    create : callable
        ``create() -> handle``.
    set_stream : callable
        ``set_stream(handle, stream)`` with a raw stream handle.
    gemm_ex : callable
        ``cublasGemmEx``'s arguments in its order; pointers as ints.
    """

    __slots__ = ("name", "create", "set_stream", "gemm_ex")

    def __init__(self, name, create, set_stream, gemm_ex):
        self.name = name
        self.create = create
        self.set_stream = set_stream
        self.gemm_ex = gemm_ex


def _nvmath():
    from nvmath.bindings import cublas

    cublas.get_property(0)  # loads the library: where it is missing, the next binding (or the tiled GEMM) serves
    return Binding("nvmath", cublas.create, cublas.set_stream, cublas.gemm_ex)


def _cupy():
    import cupy
    from cupy_backends.cuda.libs import cublas

    streams = {}

    def set_stream(handle, stream):
        with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream for Stream.from_external
            warnings.simplefilter("ignore", DeprecationWarning)
            streams[handle] = cupy.cuda.ExternalStream(stream) if stream else cupy.cuda.Stream.null
        cublas.setStream(handle, stream)

    def gemm_ex(handle, *args):
        # CuPy's gemmEx sets the handle's stream to CuPy's current stream at every call: make the handle's stream
        # CuPy's current one for the call, or the product would run on another stream than the kernels around it.
        with streams[handle]:
            cublas.gemmEx(handle, *args)

    return Binding("cupy", cublas.create, set_stream, gemm_ex)


_LOCK = threading.Lock()
_STATE = {"binding": None, "loaded": False}
_HANDLES = {}


def _binding():
    """The first importable :class:`Binding`, or ``None`` (looked up once)."""
    if not _STATE["loaded"]:
        with _LOCK:
            if not _STATE["loaded"]:
                for loader in (_nvmath, _cupy):
                    try:
                        _STATE["binding"] = loader()
                        break
                    except Exception:  # noqa: BLE001, S112 - an absent or broken binding: try the next
                        continue
                _STATE["loaded"] = True
    return _STATE["binding"]


def reset(binding=None):
    """Forget the handles, and use ``binding`` (a :class:`Binding`; ``None``: look one up again).

    For tests, which put a binding of their own in place, and for a process
    that changes devices' contexts.
    """
    with _LOCK:
        _HANDLES.clear()
        _STATE["binding"] = binding
        _STATE["loaded"] = binding is not None


def available():
    """Whether :meth:`nblstm.cuda.launch.Launcher.gemm` calls cuBLAS (:data:`nblstm.cuda.config.BLAS`).

    ``"auto"``: on a GPU (not the simulator) with a binding; ``True``:
    whenever a binding is there (the tests' own binding in the
    simulator); ``False``: never.
    """
    if config.BLAS is False or (config.BLAS == "auto" and SIMULATOR):
        return False
    return _binding() is not None


def backend_name():
    """``"nvmath"``, ``"cupy"``, or ``None`` when the tiled kernel runs the products."""
    return _binding().name if available() else None


def handle_for(device, stream):
    """The cuBLAS handle of ``(device, stream)`` for this host thread: created on first use, its stream set once.

    ``stream`` is a raw stream handle (an int; 0 for the default stream, as
    Numba passes it). One handle per host thread, as cuBLAS asks: calls in
    several dtypes on one stream hold different arena locks.
    """
    key = (device, stream, threading.get_ident())
    handle = _HANDLES.get(key)
    if handle is None:
        binding = _binding()
        with _LOCK:
            handle = _HANDLES.get(key)
            if handle is None:
                handle = binding.create()
                binding.set_stream(handle, stream)
                _HANDLES[key] = handle
    return handle


def pointer(array):
    """The address of ``array``'s first element (a host address in the simulator)."""
    if SIMULATOR:  # the simulator's arrays are NumPy arrays on the host
        return array._ary.ctypes.data
    return array.__cuda_array_interface__["data"][0]


def _row_stride(array):
    """Leading dimension of a 2-D row-major array (rows may be strided, elements may not)."""
    itemsize = array.dtype.itemsize
    rows, cols = array.shape
    row, col = (s // itemsize for s in array.strides)
    if col != 1 and cols > 1:
        raise ValueError("cuBLAS needs rows of contiguous elements")
    return max(row if rows > 1 else cols, cols, 1)


def _gemm_ex(handle, trans_a, trans_b, m, n, k, a, lda, b, ldb, c, ldc, scalars, precision, dtype):
    """Row-major ``c [M, N] = op(a) @ op(b) + beta c`` at raw addresses; ``scalars``: ctypes ``(alpha, beta)``."""
    data_type = _DATA_TYPE[dtype]
    # Column-major C^T [N, M] = op(b)^T @ op(a)^T: b is cuBLAS's first operand.
    _binding().gemm_ex(
        handle, _OP_T if trans_b else _OP_N, _OP_T if trans_a else _OP_N, n, m, k,
        ctypes.addressof(scalars[0]), b, data_type, ldb, a, data_type, lda,
        ctypes.addressof(scalars[1]), c, data_type, ldc, _COMPUTE[(precision, dtype)], _GEMM_DEFAULT)


def _scalars(dtype, beta):
    scalar = _SCALAR[dtype]
    return scalar(1.0), scalar(beta)


def gemm(handle, a, b, c, trans_a, trans_b, beta, precision):
    """``c = op(a) @ op(b) + beta * c`` by ``cublasGemmEx`` on ``handle``'s stream.

    Parameters
    ----------
    handle : int
        From :func:`handle_for`.
    a : [M, K] device array, or [K, M] when ``trans_a``
    b : [K, N] device array, or [N, K] when ``trans_b``
    c : [M, N] device array
        Row-major; every array's elements are contiguous along its rows.
    trans_a, trans_b : bool
    beta : float
        0 or 1.
    precision : str
        One of :data:`nblstm.options.PRECISIONS`, valid for ``c``'s dtype.
    """
    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
    dtype = np.dtype(c.dtype)
    _gemm_ex(handle, trans_a, trans_b, m, n, k, pointer(a), _row_stride(a), pointer(b), _row_stride(b), pointer(c),
             _row_stride(c), _scalars(dtype, beta), precision, dtype)


class StepGemm:
    """``c = a @ op(b) + beta c`` for one fixed ``b`` and fixed shapes, called with the addresses of ``a`` and ``c``.

    The per-step products of the time loop (:mod:`nblstm.cuda.fused`): the
    arguments are converted once, so that a step costs one binding call.

    Parameters
    ----------
    handle : int
    b : [K, N] device array, or [N, K] when ``trans_b``
        Rows contiguous (a row slice of a C-contiguous array).
    rows : int
        ``M``: rows of ``a`` (``[M, K]``) and ``c`` (``[M, N]``), both C-contiguous.
    trans_b : bool
    beta : float
        0 or 1.
    precision : str
    """

    def __init__(self, handle, b, rows, trans_b, beta, precision):
        k, n = (b.shape[1], b.shape[0]) if trans_b else b.shape
        self.dtype = np.dtype(b.dtype)
        self._fixed = (handle, False, trans_b, rows, n, k)
        self._b = (pointer(b), _row_stride(b))
        self._dims = (k, n)
        self._scalars = _scalars(self.dtype, beta)
        self._precision = precision

    def __call__(self, a, c):
        """One product: ``a`` and ``c`` are the addresses of ``[M, K]`` and ``[M, N]`` C-contiguous arrays."""
        k, n = self._dims
        _gemm_ex(*self._fixed, a, k, *self._b, c, n, self._scalars, self._precision, self.dtype)
