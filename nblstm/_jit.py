"""Every set of numba JIT options the CPU kernels are compiled with, spelled once.

``error_model="numpy"``: without Python's division-by-zero checks LLVM
vectorizes the loops (IEEE results, no exceptions). ``cache=True``: numba's
on-disk cache, so that a later process loads the machine code instead of
compiling it again. ``nogil=True``: the kernels' workers run at once on
several Python threads (:mod:`nblstm.cpu.threads`).

Two sets, by where the code is compiled:

- :data:`KERNEL`, every CPU kernel (the fused ops, the cell, the step, the
  GEMM micro-kernel, the float16 conversions, ``nblstm.jit``): no fast-math
  flag, IEEE arithmetic as written, every rounding part of the contract.
  With ``fastmath={"contract"}`` LLVM fused multiplies and adds into FMAs
  wherever it chose, and where it chose depended on how a kernel was
  optimized: a kernel compiled afresh (numba optimizes the functions it
  calls once more, with it) and the same kernel loaded from the cache gave
  float32 results that differed in the last bit. The polynomials of
  :mod:`nblstm.spec` fuse their steps explicitly (``llvm.fma``), which kept
  the speed the flag had given them (the gate maths took 0.7x the time with
  FMAs); the micro-kernel's result elements are the same however the
  columns are split (:mod:`nblstm.cpu.microkernel`).
  No C entry point (``no_cfunc_wrapper``): the kernels are called from
  Python or from other kernels, never through a C function pointer, and the
  wrapper was machine code to compile for each (the fused ops' first call on
  an empty cache 0.27 s faster here without them).
- :data:`CALLEE`, the kernels that only other kernels call (the BLAS
  products, the fused ops' input projection and weight-gradient blocks, the
  micro-kernel's product and packing, the cell's per-step functions, the
  float16 conversions' blocks): :data:`KERNEL` without the Python entry
  point numba otherwise compiles with each function (its generation alone
  took 0.43 s of the float32 warm-up for those ten functions here).
- :data:`GATE_MATHS`, the activations of :mod:`nblstm.spec` that are functions
  of their own (not inlined): compiled into the CPU kernels, which carry their
  own flags and cache, and into the CUDA kernels as device functions.

While numba compiles an nblstm function, Python's cyclic garbage collector
is paused (:class:`_PausedCollector`).
"""

import gc

from numba import types
from numba.core import event
from numba.extending import intrinsic

__all__ = ["CALLEE", "GATE_MATHS", "KERNEL", "full_width"]

#: Every CPU kernel: IEEE arithmetic as written (FMAs only where spec.py writes them); no C entry point.
KERNEL = {"cache": True, "error_model": "numpy", "nogil": True, "no_cfunc_wrapper": True}
#: The activations of nblstm.spec: no division checks; compiled into their callers on both targets.
GATE_MATHS = {"error_model": "numpy"}
#: CPU kernels called only from other kernels, never from Python: no Python or C wrapper to compile.
CALLEE = {**KERNEL, "no_cpython_wrapper": True}


@intrinsic
def full_width(typingctx):
    """Called first in a CPU kernel: LLVM vectorizes its loops at the full width of the CPU's vector registers.

    On Intel's AVX-512 cores LLVM prefers 256-bit vectors (a tuning of its
    CPU models, for the clock speed that 512-bit instructions cost on the
    first of them); the micro-kernel's products are 512-bit already
    (:mod:`nblstm.cpu.microkernel`), and the gate maths ran 1.4x as fast with
    512-bit vectors (the float32 sigmoid: 0.97 to 0.69 ns a unit here), with
    the same bits: every lane computes what one element's scalar code does.
    The function attribute ``"prefer-vector-width"="512"`` says so for the
    function being compiled (a kernel's inlined functions included); on a
    CPU without AVX-512 it changes nothing.
    """

    def codegen(context, builder, signature, args):
        # llvmlite's FunctionAttributes takes only LLVM's keyword attributes; a string attribute is written out
        # as it is given (the set's own add, past that check). Should a later llvmlite keep its attributes
        # otherwise, the hint is left out: the loops then vectorize at LLVM's preferred width, as before.
        try:
            set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        except (TypeError, AttributeError):
            pass
        return context.get_dummy_value()

    return types.none(), codegen


class _PausedCollector(event.Listener):
    """Pauses Python's cyclic garbage collector while numba compiles a function of nblstm.

    A compile makes hundreds of thousands of Python objects (numba's IR, its
    types, llvmlite's IR), most of which live until the compile ends, and the
    collector went through all of them again and again: 808 collections took
    0.52-0.54 s of the ops' first forward and backward on an empty cache
    (6.3-6.7 s; 5.7-6.1 s with the collector paused, 4 alternating processes
    each), for 50 MB more peak memory. The collector is paused from the
    start of the outermost compile of an nblstm function (numba's own
    functions that it compiles on the way included) to its end, as it was
    found: a caller who paused it finds it paused. Numba compiles under its
    global compiler lock, so the events of one compile never interleave with
    another's. Nothing changes when a compile is loaded from numba's cache
    (no compile event) or for functions outside nblstm. The pause is
    process-wide: other threads' reference cycles also wait for the end of
    the compile (seconds, once per kernel and process).
    """

    def __init__(self):
        self._depth = 0  # compiles open since the outermost nblstm one started
        self._resume = False  # whether that one found the collector enabled

    def on_start(self, ev):
        if self._depth:
            self._depth += 1
        elif _is_ours(ev.data):
            self._depth = 1
            self._resume = gc.isenabled()
            gc.disable()

    def on_end(self, ev):
        if self._depth:
            self._depth -= 1
            if not self._depth and self._resume:
                gc.enable()


def _is_ours(data):
    """Whether a compile event's ``data`` is about a function of nblstm (any other dispatcher, or a function
    without a module, as ``exec`` makes them, is not: a listener must never fail a compile)."""
    module = getattr(getattr(data.get("dispatcher"), "py_func", None), "__module__", None)
    return isinstance(module, str) and module.startswith("nblstm.")


event.register("numba:compile", _PausedCollector())
