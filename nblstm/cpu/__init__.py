"""The CPU target: the fused ops' and the cell's kernels, ``nogil`` workers on several threads (:ref:`design-cpu`).

Modules, from the bottom up: :mod:`~nblstm.cpu.threads` (the workers'
helper threads), :mod:`~nblstm.cpu.sync` (step barriers between the
workers), :mod:`~nblstm.cpu.pool` (aligned and recycled memory),
:mod:`~nblstm.cpu.blas` (SciPy's BLAS on one thread),
:mod:`~nblstm.cpu.half` (float16 conversions), :mod:`~nblstm.cpu.microkernel`
(the step GEMM), :mod:`~nblstm.cpu.partition` (how work is split, every
threshold), :mod:`~nblstm.cpu.pack` (packed weights),
:mod:`~nblstm.cpu.gemm` (BLAS products), :mod:`~nblstm.cpu.fused` (the fused
ops' kernels), :mod:`~nblstm.cpu.cell` (the cell's kernels),
:mod:`~nblstm.cpu.step` (the cell's streaming step) and
:mod:`~nblstm.cpu.target` (the entry points). Importing this package imports
numba but compiles nothing.
"""

from .target import CpuTarget

__all__ = ["TARGET", "CpuTarget"]

#: The CPU's :class:`nblstm._contract.Target`.
TARGET = CpuTarget()
