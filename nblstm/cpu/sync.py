"""Step synchronisation inside one parallel region, for the kernels' time loops.

A time loop with one parallel region per step pays numba's region launch
and join at every step (about 2 us here, a sixth of a batch-1 step). The
loops instead run all steps inside one region, each worker taking the
chunks of hidden units of a step and waiting until every chunk of the step
is done before the next one.

Nothing assumes that the region's iterations run concurrently (a threading
layer may run them one after the other on one thread, or start some late):
the chunks of a step are claimed, not assigned. A worker first claims its
own chunk, so that in the usual case every thread keeps the weights of one
chunk in its cache, then claims whatever chunk of the step is still
unclaimed. A worker alone does every chunk itself; a stalled thread's chunk
is taken over by another. Chunk results do not depend on which thread
computes them.

:func:`claimed_chunks` is that loop, for every kernel: a generator of the
chunks a worker claims, whose caller runs each chunk in its loop body.

The counters are 1-D ``int64`` arrays updated with sequentially consistent
atomic adds (LLVM ``atomicrmw``): a chunk's writes happen before its
``done`` increment, and the waiters read ``done`` with an acquire load.
"""

import llvmlite.binding as llb
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["atomic_add", "atomic_load", "claim", "claimed_chunks", "wait_for"]

#: Spins (each a ``pause`` on x86) before a waiter starts yielding its core
#: (``sched_yield``, POSIX).
_SPINS_BEFORE_YIELD = 1 << 12

_X86 = llb.get_process_triple().startswith(("x86_64", "i686", "i386"))


def _is_counters(array_type):
    """A 1-D C-contiguous int64 array (the intrinsics index its memory directly)."""
    return (isinstance(array_type, types.Array) and array_type.dtype == types.int64 and array_type.ndim == 1
            and array_type.layout == "C")


def _element_pointer(context, builder, array_type, array, index):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [index])


@intrinsic
def atomic_add(typingctx, counters, index, value):
    """``counters[index] += value`` atomically (sequentially consistent); returns the old value."""
    if not _is_counters(counters):
        return None
    sig = types.int64(counters, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return sig, codegen


@intrinsic
def atomic_load(typingctx, counters, index):
    """``counters[index]`` read with acquire ordering."""
    if not _is_counters(counters):
        return None
    sig = types.int64(counters, types.intp)

    def codegen(context, builder, signature, args):
        ptr = _element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", 8)

    return sig, codegen


@intrinsic
def _relax(typingctx, spins):
    """One wait of a spin loop: ``pause`` (x86), and ``sched_yield`` once ``spins`` is large."""
    sig = types.void(types.int64)

    def codegen(context, builder, signature, args):
        if _X86:
            pause = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                   "llvm.x86.sse2.pause")
            builder.call(pause, [])
        threshold = ir.Constant(args[0].type, _SPINS_BEFORE_YIELD)
        with builder.if_then(builder.icmp_signed(">=", args[0], threshold), likely=False):
            sched_yield = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                                         "sched_yield")
            builder.call(sched_yield, [])
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always")
def wait_for(counters, index, target):
    """Spin until ``counters[index] >= target``."""
    spins = 0
    while atomic_load(counters, index) < target:
        spins += 1
        _relax(spins)


@njit(inline="always")
def claim(claims, stage, chunk, stride):
    """Whether this worker is the first to claim chunk ``chunk`` of ``stage`` (``claims[stage * stride + chunk]``)."""
    return atomic_add(claims, stage * stride + chunk, 1) == 0


@njit
def claimed_chunks(claims, done, stage, worker, num_chunks, held):
    """Yield every chunk of ``stage`` this worker claims, and count each one done once the caller has run it.

    The worker claims its own chunk ``worker`` first, then the others in
    turn (``worker + 1, worker + 2, ...`` modulo ``num_chunks``). It does not
    wait for the other workers' chunks: :func:`wait_for` ``(done, stage,
    num_chunks)`` does. Usage: ``for k in claimed_chunks(...): <chunk k>``.

    Parameters
    ----------
    claims : [S * stride] int64 array, zero on entry
        One counter per chunk of each of the ``S`` stages; ``stride =
        claims.shape[0] // S`` is at least the number of chunks of any stage.
    done : [S] int64 array, zero on entry
        Chunks finished, per stage.
    stage, worker, num_chunks : int64
    held : bool
        The worker has claimed its own chunk of ``stage`` already (with
        :func:`claim`, to start on it early).
    """
    stride = claims.shape[0] // done.shape[0]
    for j in range(num_chunks):
        k = (worker + j) % num_chunks
        if (j == 0 and held) or claim(claims, stage, k, stride):
            yield k
            atomic_add(done, stage, 1)
