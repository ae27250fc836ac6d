"""Step synchronisation between a kernel's workers, for the time loops.

A kernel call runs one worker per thread (:mod:`nblstm.cpu.threads`), and
each worker runs all the steps: it takes chunks of hidden units of a step
and waits until every chunk of the step is done before the next one. (A
launch and join per step, as numba's parallel region per step was, cost
about 2 us here, a sixth of a batch-1 step.)

Nothing assumes that the workers run concurrently (a call that finds the
helper threads busy runs them one after the other on one thread, and a
helper may start late): the chunks of a step are claimed, not assigned.
A worker first claims its own chunk, so that in the usual case every thread
keeps the weights of one chunk in its cache, then claims whatever chunk of
the step is still unclaimed. A worker alone does every chunk itself; a
stalled thread's chunk is taken over by another. Chunk results do not
depend on which thread computes them.

:func:`claimed` is that loop's turn, for every kernel: the chunk a worker
claims at its ``j``-th turn, which the caller runs in its loop body.

The counters are 1-D ``int64`` arrays updated with sequentially consistent
atomic adds (LLVM ``atomicrmw``): a chunk's writes happen before its
``done`` increment, and the waiters read ``done`` with an acquire load.
:func:`counters` makes them.

A waiter spins for a bounded time, then sleeps (Linux: ``futex``; elsewhere
``sched_yield``). Spinning on while the thread it waits for is descheduled
(another process on that core) would wait a whole time slice: a batch-1
step measured a 30 ms 99th percentile against a 66 us median with the other
core busy. Sleeping frees the waiter's core, to which the scheduler then
moves the descheduled worker. The last chunk of a stage wakes the sleepers
(one system call, made only when somebody sleeps: the ``done`` array's last
element counts them).

:func:`claimed`, :func:`count_done` and :func:`wait_for` are functions of
their own (:data:`nblstm._jit.CALLEE`), compiled once and called by every
worker, not inlined into each: inlined, numba typed and lowered their bodies
again at each call site (some 640 of the fused forward worker's 2,500 IR
statements), and the first forward and backward of the ops on an empty cache took
about 0.4 s longer here (with the backward change of the same commit: 7.9 against 7.4 s,
medians of 3). LLVM still inlines them into the workers' machine code.
"""

import sys

import llvmlite.binding as llb
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._jit import CALLEE
from .views import element_pointer

__all__ = ["atomic_add", "atomic_load", "claim", "claimed", "count_done", "counters", "wait_for"]

#: Spins (each a ``pause`` on x86, 9 ns on an Intel Xeon here, up to about
#: 40 ns on other cores) before a waiter sleeps: tens of microseconds, about
#: what a sleep and its wake-up cost. With 512 (4.5 us here) a waiter slept at
#: nearly every step whose work was small, and the steps of finished examples
#: (lengths, ``(50, 128, 256, 256)``, two threads) took 19 us each instead
#: of 2 us: a woken thread starts late, its partner takes its chunk, and it
#: waits, and sleeps, again.
SPINS_BEFORE_SLEEP = 1 << 11
#: Longest sleep in nanoseconds: the waiter checks its counter again after it
#: even without a wake-up (a safety net; the wake-up is the normal path).
SLEEP_NS = 1_000_000

_TRIPLE = llb.get_process_triple()
_X86 = _TRIPLE.startswith(("x86_64", "i686", "i386"))
# futex(2) system call numbers; the counters are little-endian int64, whose
# low 32 bits are the futex word (counts stay far below 2**31).
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(_TRIPLE.split("-")[0]) if sys.platform.startswith("linux") else None
_FUTEX = _SYS_FUTEX is not None and sys.byteorder == "little"
_FUTEX_WAIT_PRIVATE = 128
_FUTEX_WAKE_PRIVATE = 129


def counters(stages, chunks):
    """Zeroed ``(claims [stages * chunks], done [stages + 1])`` for :func:`claimed` and :func:`wait_for`.

    ``done[stages]`` counts the sleeping waiters.
    """
    return np.zeros(stages * chunks, np.int64), np.zeros(stages + 1, np.int64)


def _is_counters(array_type):
    """A 1-D C-contiguous int64 array (the intrinsics index its memory directly)."""
    return (isinstance(array_type, types.Array) and array_type.dtype == types.int64 and array_type.ndim == 1
            and array_type.layout == "C")


@intrinsic
def atomic_add(typingctx, counters, index, value):
    """``counters[index] += value`` atomically (sequentially consistent); returns the old value."""
    if not _is_counters(counters):
        return None
    sig = types.int64(counters, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        ptr = element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "seq_cst")

    return sig, codegen


@intrinsic
def atomic_load(typingctx, counters, index):
    """``counters[index]`` read with acquire ordering."""
    if not _is_counters(counters):
        return None
    sig = types.int64(counters, types.intp)

    def codegen(context, builder, signature, args):
        ptr = element_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", 8)

    return sig, codegen


def _futex_call(builder, address, op, value, timeout):
    """``syscall(SYS_futex, address, op, value, timeout, 0, 0)`` (``timeout``: a ``timespec *`` or null)."""
    i64, i32 = ir.IntType(64), ir.IntType(32)
    syscall = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64], var_arg=True), "syscall")
    word = builder.bitcast(address, i32.as_pointer())
    null = ir.Constant(i32.as_pointer(), None)
    return builder.call(syscall, [ir.Constant(i64, _SYS_FUTEX), word, ir.Constant(i32, op), value,
                                  timeout, null, ir.Constant(i32, 0)])


@intrinsic
def _sleep_while(typingctx, counters, index, value):
    """Sleep while ``counters[index] == value`` (futex), at most :data:`SLEEP_NS`; without futex, yield once."""
    if not _is_counters(counters):
        return None
    sig = types.void(counters, types.intp, types.int64)

    def codegen(context, builder, signature, args):
        i64, i32 = ir.IntType(64), ir.IntType(32)
        if _FUTEX:
            ptr = element_pointer(context, builder, signature.args[0], args[0], args[1])
            timespec = ir.LiteralStructType([i64, i64])
            timeout = cgutils.alloca_once(builder, timespec)
            builder.store(ir.Constant(timespec, [SLEEP_NS // 1_000_000_000, SLEEP_NS % 1_000_000_000]), timeout)
            timeout = builder.bitcast(timeout, i32.as_pointer())
            _futex_call(builder, ptr, _FUTEX_WAIT_PRIVATE, builder.trunc(args[2], i32), timeout)
        else:
            sched_yield = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, []), "sched_yield")
            builder.call(sched_yield, [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _wake_all(typingctx, counters, index):
    """Wake every thread sleeping on ``counters[index]`` (nothing without futex)."""
    if not _is_counters(counters):
        return None
    sig = types.void(counters, types.intp)

    def codegen(context, builder, signature, args):
        if _FUTEX:
            ptr = element_pointer(context, builder, signature.args[0], args[0], args[1])
            timeout = ir.Constant(ir.IntType(32).as_pointer(), None)
            _futex_call(builder, ptr, _FUTEX_WAKE_PRIVATE, ir.Constant(ir.IntType(32), (1 << 31) - 1), timeout)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _pause(typingctx):
    """One wait of a spin loop: ``pause`` on x86, nothing elsewhere."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if _X86:
            pause = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                   "llvm.x86.sse2.pause")
            builder.call(pause, [])
        return context.get_dummy_value()

    return sig, codegen


@njit(**CALLEE)
def wait_for(done, index, target):
    """Wait until ``done[index] >= target``: spin :data:`SPINS_BEFORE_SLEEP` times, then sleep until woken.

    ``done`` is the array of :func:`counters`; its last element counts the
    sleepers, so that :func:`count_done` makes the wake-up call only when
    somebody sleeps. The sleeper count is incremented before the counter is
    read again, and :func:`count_done` increments the counter before it reads
    the sleeper count (both sequentially consistent): either the waiter sees
    the new count, or the waker sees the sleeper. The futex sleeps only while
    the counter still has the value read.
    """
    spins = 0
    while atomic_load(done, index) < target:
        spins += 1
        if spins < SPINS_BEFORE_SLEEP:
            _pause()
        else:
            sleepers = done.shape[0] - 1
            atomic_add(done, sleepers, 1)
            value = atomic_add(done, index, 0)  # a sequentially consistent read
            if value < target:
                _sleep_while(done, index, value)
            atomic_add(done, sleepers, -1)


@njit(**CALLEE)
def count_done(done, stage, num_chunks):
    """Count one chunk of ``stage`` done; the last one wakes the stage's sleepers, if any."""
    if atomic_add(done, stage, 1) + 1 == num_chunks and atomic_add(done, done.shape[0] - 1, 0) > 0:
        _wake_all(done, stage)


@njit(inline="always")
def claim(claims, stage, chunk, stride):
    """Whether this worker is the first to claim chunk ``chunk`` of ``stage`` (``claims[stage * stride + chunk]``)."""
    return atomic_add(claims, stage * stride + chunk, 1) == 0


@njit(**CALLEE)
def claimed(claims, done, stage, worker, num_chunks, held, j):
    """Chunk ``(worker + j) % num_chunks`` of ``stage`` if this worker claims it at its turn ``j``, else ``-1``.

    The worker claims its own chunk ``worker`` first (turn 0), then the
    others in turn (``worker + 1, worker + 2, ...`` modulo ``num_chunks``).
    It does not wait for the other workers' chunks: :func:`wait_for`
    ``(done, stage, num_chunks)`` does. Usage, the caller counting each
    chunk done once it has run it::

        for j in range(num_chunks):
            k = claimed(claims, done, stage, worker, num_chunks, held, j)
            if k >= 0:
                <chunk k>
                count_done(done, stage, num_chunks)

    (Not a generator: numba never finalises a generator that nopython code
    runs, so each one would keep a reference to the counters it was given,
    and every kernel call would leak them; numba issue 1278.)

    Parameters
    ----------
    claims : [S * stride] int64 array, zero on entry
        One counter per chunk of each of the ``S`` stages; ``stride =
        claims.shape[0] // S`` is at least the number of chunks of any stage.
    done : [S + 1] int64 array, zero on entry
        Chunks finished, per stage, and the sleepers (:func:`counters`).
    stage, worker, num_chunks, j : int64
    held : bool
        The worker has claimed its own chunk of ``stage`` already (with
        :func:`claim`, to start on it early).
    """
    stride = claims.shape[0] // (done.shape[0] - 1)
    k = (worker + j) % num_chunks
    if (j == 0 and held) or claim(claims, stage, k, stride):
        return k
    return -1
