"""The CPU target: ``@njit(parallel=True)`` kernels of the fused ops and of the cell (:ref:`design-cpu`).

Modules, from the bottom up: :mod:`~nblstm.cpu.sync` (step barriers inside
one parallel region), :mod:`~nblstm.cpu.pool` (aligned and recycled memory),
:mod:`~nblstm.cpu.blas` (SciPy's BLAS on one thread),
:mod:`~nblstm.cpu.half` (float16 conversions), :mod:`~nblstm.cpu.microkernel`
(the step GEMM), :mod:`~nblstm.cpu.partition` (how work is split, every
threshold), :mod:`~nblstm.cpu.pack` (packed weights),
:mod:`~nblstm.cpu.gemm` (BLAS products), :mod:`~nblstm.cpu.fused` (the fused
ops' kernels), :mod:`~nblstm.cpu.cell` (the cell's kernels) and
:mod:`~nblstm.cpu.target` (the entry points). Importing this package imports
numba but compiles nothing.
"""

from .target import CpuTarget

__all__ = ["TARGET", "CpuTarget"]

#: The CPU's :class:`nblstm._dispatch.Target`.
TARGET = CpuTarget()
