"""Every set of numba JIT options the CPU kernels are compiled with, spelled once.

``error_model="numpy"``: without Python's division-by-zero checks LLVM
vectorizes the loops (IEEE results, no exceptions). ``cache=True``: numba's
on-disk cache, so that a later process loads the machine code instead of
compiling it again. ``nogil=True``: the kernels' workers run at once on
several Python threads (:mod:`nblstm.cpu.threads`).

Three sets, by what the code may let LLVM do with its arithmetic and where it is compiled:

- :data:`KERNEL`, the kernels with gate maths (the fused ops and the cell):
  ``fastmath={"contract"}`` alone of the fast-math flags, so that LLVM may
  fuse a multiply and an add into one FMA (the rational tanh's polynomials:
  the gate maths took 0.7x the time). This changes no result by more than
  the rounding of the add; there is no reassociation, and NaN and infinities
  are IEEE.
- :data:`EXACT`, code whose every rounding is part of its contract: the
  GEMM micro-kernel (each result element is the same however the columns
  are split, see :mod:`nblstm.cpu.microkernel`) and the float16 conversions
  (:mod:`nblstm.cpu.half`): no fast-math flag at all.
- :data:`GATE_MATHS`, the activations of :mod:`nblstm.spec` that are functions
  of their own (not inlined): compiled into the CPU kernels, which carry their
  own flags and cache, and into the CUDA kernels as device functions.
"""

__all__ = ["EXACT", "GATE_MATHS", "KERNEL"]

#: Kernels with gate maths: multiply-adds may be contracted into FMAs.
KERNEL = {"cache": True, "error_model": "numpy", "fastmath": {"contract"}, "nogil": True}
#: The micro-kernel and the float16 conversions: IEEE arithmetic as written.
EXACT = {"cache": True, "error_model": "numpy", "nogil": True}
#: The activations of nblstm.spec: no division checks; compiled into their callers on both targets.
GATE_MATHS = {"error_model": "numpy"}
