"""Every set of numba JIT options the CPU kernels are compiled with, spelled once.

``error_model="numpy"``: without Python's division-by-zero checks LLVM
vectorizes the loops (IEEE results, no exceptions). ``cache=True``: numba's
on-disk cache, so that a later process loads the machine code instead of
compiling it again. ``nogil=True``: the kernels' workers run at once on
several Python threads (:mod:`nblstm.cpu.threads`).

Three sets, by what the code may let LLVM do with its arithmetic and where it is compiled:

- :data:`KERNEL`, the kernels with gate maths (the fused ops and the cell):
  no fast-math flag. With ``fastmath={"contract"}`` LLVM fused multiplies
  and adds into FMAs wherever it chose, and where it chose depended on how a
  kernel was optimized: a kernel compiled afresh (numba optimizes the
  functions it calls once more, with it) and the same kernel loaded from the
  cache gave float32 results that differed in the last bit. The polynomials
  of :mod:`nblstm.spec` fuse their steps explicitly (``llvm.fma``), which
  kept the speed the flag had given them (the gate maths took 0.7x the time
  with FMAs).
- :data:`EXACT`, code whose every rounding is part of its contract: the
  GEMM micro-kernel (each result element is the same however the columns
  are split, see :mod:`nblstm.cpu.microkernel`) and the float16 conversions
  (:mod:`nblstm.cpu.half`): no fast-math flag at all.
- :data:`GATE_MATHS`, the activations of :mod:`nblstm.spec` that are functions
  of their own (not inlined): compiled into the CPU kernels, which carry their
  own flags and cache, and into the CUDA kernels as device functions.
"""

__all__ = ["EXACT", "GATE_MATHS", "KERNEL"]

#: Kernels with gate maths: IEEE arithmetic as written (FMAs only where spec.py writes them).
KERNEL = {"cache": True, "error_model": "numpy", "nogil": True}
#: The micro-kernel and the float16 conversions: IEEE arithmetic as written.
EXACT = {"cache": True, "error_model": "numpy", "nogil": True}
#: The activations of nblstm.spec: no division checks; compiled into their callers on both targets.
GATE_MATHS = {"error_model": "numpy"}
