"""The kernels' workers on several threads: ``nogil`` numba functions run by a persistent pool of Python threads.

A kernel is a serial ``@njit(nogil=True)`` worker function ``worker(w,
*args)``; :func:`run` calls it with ``w = 0`` in the calling thread and with
``w = 1 .. workers - 1`` in helper threads that wait for work between calls.
The workers share the work through the claims of :mod:`nblstm.cpu.sync`,
which assume nothing about when, or whether concurrently, they run: a worker
that starts late finds its chunks taken and only waits.

Why not numba's ``prange``: a parallel region compiles the code it calls a
second time, inside the region's own function (a serial caller of a worker
took 0.1x the worker's compile time, a ``prange`` caller 0.5x; the fused
forward kernel alone compiled for 10 s). Workers called from here compile
like any serial function. The price is the start of a call: the helpers get
the GIL to call the worker (numba's dispatch of its arguments), so a helper
joins some 20-60 us after the caller's worker starts (measured here; the
claims let the caller's worker go on meanwhile), which is why the kernels
split only calls with enough work (:mod:`nblstm.cpu.partition`).

Calls from several Python threads at once are safe: one call uses the pool
at a time, and a call that finds it busy runs its workers one after the
other in its own thread (the same results: chunk results do not depend on
the thread that computes them).
"""

import os
import threading

__all__ = ["run"]


class _Helper:
    """One helper thread: runs the jobs it is given, one at a time."""

    def __init__(self):
        self.job = None
        self.error = None
        self.go = threading.Lock()
        self.go.acquire()
        self.finished = threading.Lock()
        self.finished.acquire()
        self.thread = threading.Thread(target=self._loop, name="nblstm-worker", daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            self.go.acquire()
            fn, w, args = self.job
            self.job = None
            try:
                fn(w, *args)
            except BaseException as error:  # handed to the caller, re-raised there
                self.error = error
            self.finished.release()

    def start(self, fn, w, args):
        self.job = (fn, w, args)
        self.go.release()

    def join(self):
        self.finished.acquire()
        error, self.error = self.error, None
        return error


class _Pool:
    def __init__(self):
        self.lock = threading.Lock()
        self.helpers = []

    def run(self, fn, args, workers, concurrency):
        if workers <= 1:
            fn(0, *args)
            return
        if concurrency <= 1 or not self.lock.acquire(blocking=False):  # or another thread's call holds the helpers
            for w in range(workers):
                fn(w, *args)
            return
        try:
            while len(self.helpers) < workers - 1:
                self.helpers.append(_Helper())
            helpers = self.helpers[:workers - 1]
            for w, helper in enumerate(helpers, start=1):
                helper.start(fn, w, args)
            error = None
            try:
                fn(0, *args)
            except BaseException as e:
                error = e
            for helper in helpers:  # every helper is joined, whatever happened
                helper_error = helper.join()
                error = error or helper_error
            if error is not None:
                raise error
        finally:
            self.lock.release()


_pool = _Pool()


def _after_fork_in_child():
    global _pool
    _pool = _Pool()  # the parent's helper threads do not exist in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def run(fn, args, workers, concurrency=None):
    """``fn(w, *args)`` for ``w = 0 .. workers - 1``, at once on ``workers`` threads (``w = 0`` on this one).

    Parameters
    ----------
    fn : numba dispatcher
        A ``nogil`` worker whose workers share their work through
        :mod:`nblstm.cpu.sync` (or split it by ``w`` alone).
    args : tuple
    workers : int
    concurrency : int, optional
        ``1``: the workers one after the other on this thread (for work
        split by ``w``, too small to be worth a helper thread); default: all
        at once.
    """
    _pool.run(fn, args, workers, workers if concurrency is None else concurrency)
