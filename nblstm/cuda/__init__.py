"""The CUDA target: ``@cuda.jit`` kernels of the fused ops and of the cell, and their drivers (:ref:`design-cuda`).

Imported lazily by :func:`nblstm._dispatch.target_for` when GPU arrays are
seen; importing it compiles nothing and needs no driver (every kernel is
lazy: no eager signatures). It takes arrays that live on a GPU (anything
with ``__cuda_array_interface__``: Numba device arrays, CuPy arrays,
PyTorch CUDA tensors; the simulator's arrays under
``NUMBA_ENABLE_CUDASIM=1``) and returns arrays of the caller's kind, with
no copy through the host.

Modules: :mod:`~nblstm.cuda.config` (tile sizes, switches),
:mod:`~nblstm.cuda.registry` (every kernel, and its signatures for the PTX
checks), the kernels by family (:mod:`~nblstm.cuda.elementwise`,
:mod:`~nblstm.cuda.gemm`, :mod:`~nblstm.cuda.tiles`,
:mod:`~nblstm.cuda.blas` (cuBLAS for the large products on a GPU),
:mod:`~nblstm.cuda.fused_kernels`, :mod:`~nblstm.cuda.cell_kernels`),
:mod:`~nblstm.cuda.interop` (arrays, devices, streams),
:mod:`~nblstm.cuda.launch` (scratch memory and launches), the drivers
(:mod:`~nblstm.cuda.fused`, :mod:`~nblstm.cuda.cell`) and
:mod:`~nblstm.cuda.target` (the entry points).
"""

from . import config
from .config import SIMULATOR
from .launch import release_workspaces
from .target import CudaTarget

__all__ = ["SIMULATOR", "TARGET", "CudaTarget", "config", "release_workspaces"]

#: The CUDA :class:`nblstm._contract.Target`.
TARGET = CudaTarget()
