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

Beside a framework that has its own OpenMP threads (PyTorch), the workers
run on that framework's team instead (:class:`OpenMPTeam`, :func:`on_team`):
after each of its parallel operations an OpenMP worker spins for some
milliseconds waiting for the next one (libgomp's default: 300,000 pauses),
which took one of this machine's two cores from nblstm's own helper and held
the kernels' meeting at every step (a training step through
``nblstm.torch.LSTM`` at ``(50, 32, 256, 256)``: 59 ms on nblstm's threads,
42 ms on PyTorch's, PyTorch's own step 32 ms, in one run). The spinning
threads take the work at once, and no third thread competes for the cores.
Where another process holds a core, the team's threads wait for it by whole
time slices: the team measures its calls and sends them to nblstm's own
threads for a while after two late ones (:data:`LATE_SECONDS`).
"""

import contextlib
import ctypes
import os
import re
import threading
import time

__all__ = ["OpenMPTeam", "on_team", "run", "run_each"]


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


#: A call whose end waits this long (seconds) for a team thread after the calling thread's workers are done
#: waited for that thread's core: another process runs there. libgomp's threads spin between regions, so
#: that the scheduler shares a core between such a thread and a busy process by whole time slices, and every
#: region waits for its slowest thread; nblstm's own helpers sleep between calls and are woken at once. With
#: one busy process on the other core (Intel Xeon, 2 cores), a training step through nblstm.torch.LSTM at
#: (100, 1, 256, 256) took 37.7 ms on PyTorch's threads against 11.8 ms on nblstm's (PyTorch's own step 18.6
#: ms), a batch-1 inference of a 2-layer H = 256 module 7.6 against 2.8 ms. On a quiet machine the waits are
#: some microseconds.
LATE_SECONDS = 2e-3
#: How long calls stay on nblstm's own threads after two late calls among the last four timed ones (or a late
#: one that tried the team again after such a window) before the team is tried again.
AVOID_SECONDS = 1.0
_team_thread = threading.local()  # per thread of an OpenMP team: whether it keeps its thread state
_gil_state_ensure = ctypes.pythonapi.PyGILState_Ensure
_gil_state_ensure.restype = ctypes.c_int


class OpenMPTeam:
    """The OpenMP runtime a loaded library runs on, whose thread team runs the workers.

    Its ``GOMP_parallel`` entry point (libgomp's; LLVM's and Intel's runtimes
    export it too) runs a ctypes callback on every thread of the calling
    thread's team; each takes the workers ``w = tid, tid + n, ...`` (``n``
    the team's size, which the runtime may make smaller than asked: a worker
    that runs late or after another on the same thread finds the work done,
    as on a busy pool). The callback takes the GIL to call the ``nogil``
    worker, as the pool's helpers do. A call uses at most the runtime's
    ``omp_get_max_threads()`` threads (``torch.set_num_threads``), and one
    call uses the team at a time: the runtime gives each calling thread a
    team of its own, so a call that finds the team busy (another Python
    thread's) runs its workers one after the other in its own thread, as on
    a busy pool, instead of starting more threads than the cores.

    Parameters
    ----------
    path : str
        A loaded library: the runtime itself, or one that links to it (a
        framework's, such as PyTorch's ``libtorch_cpu.so``), whose symbols
        are looked up through its own dependencies, so that the team is the
        one the framework runs on, whichever copy of the runtime the process
        loaded first. Nothing is loaded a second time (a second copy would
        start threads of its own).
    """

    _CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def __init__(self, path):
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LOCAL)  # OSError if it is not loaded
        self.path, self.pid = path, os.getpid()
        self._thread_num, self._num_threads = lib.omp_get_thread_num, lib.omp_get_num_threads
        self._max_threads = lib.omp_get_max_threads
        self._parallel = lib.GOMP_parallel
        self._parallel.argtypes = [self._CALLBACK, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
        self._parallel.restype = None
        self._jobs = {}
        self._keys = iter(range(1, 2**62))
        self._lock = threading.Lock()
        self._callback = self._CALLBACK(self._member)  # kept: the runtime holds only its address
        self.avoid_until = 0.0  # time.perf_counter() before which calls go to nblstm's own threads (usable)
        self._recent = 0  # the last 4 timed calls, a bit each (lowest: the last): whether it waited for the team
        self._caller_done = None  # when the calling thread's workers of the current call ended (run sets it)

    def usable(self):
        """Whether calls run on the team now: not within :data:`AVOID_SECONDS` of the second of the last 4 timed
        calls whose end waited :data:`LATE_SECONDS` for a team thread after the calling thread's workers were
        done (the machine's other work holds that thread's core; one such call alone can be the runtime
        starting its threads)."""
        return time.perf_counter() >= self.avoid_until

    def _waited(self, delay):
        """A timed call's end waited ``delay`` seconds for the team after the calling thread's workers."""
        late = delay > LATE_SECONDS
        self._recent = ((self._recent << 1) | late) & 0b1111
        if late and bin(self._recent).count("1") >= 2:
            # The next call on the team comes after the window; one more late call then starts another window.
            self._recent = 0b1
            self.avoid_until = time.perf_counter() + AVOID_SECONDS

    @classmethod
    def loaded(cls, under, name):
        """The team of the loaded library in the folder ``under`` whose file name matches the regular expression
        ``name``, or ``None`` (none loaded, no OpenMP entry points, or no ``/proc/self/maps``: not Linux)."""
        try:
            with open("/proc/self/maps") as maps:
                paths = {line.split(None, 5)[-1].strip() for line in maps if line.count(" ") >= 5}
        except OSError:
            return None
        root = os.path.realpath(under) + os.sep
        for path in sorted(paths):
            if os.path.realpath(path).startswith(root) and re.match(name, os.path.basename(path)):
                try:
                    return cls(path)
                except (OSError, AttributeError):
                    return None
        return None

    def _member(self, key):
        # Everything in the try: an exception that left the callback would only be printed by ctypes, and this
        # thread's other workers skipped.
        errors = None
        try:
            tid = self._thread_num()
            if tid == 1 and not getattr(_team_thread, "kept", False):
                # ctypes gives a thread that Python did not start a thread state for each callback and deletes
                # it after: one more level of PyGILState_Ensure, never released, keeps it for the thread's life
                # (what pybind11's gil_scoped_acquire.inc_ref() does). A call on the team then took 42 against
                # 64 us here (median, an empty worker on two threads). Thread 1 alone: every call has it (a
                # call runs on 2 threads or more), where a region of fewer threads than the last ends the
                # runtime's threads past it, whose kept states would stay behind.
                _gil_state_ensure()
                _team_thread.kept = True
            fn, args, workers, errors = self._jobs[key]
            team = max(self._num_threads(), 1)
            for w in range(tid, workers, team):
                fn(w, *args)
            if tid == 0:
                self._caller_done = time.perf_counter()
        except BaseException as error:  # handed to the caller, re-raised there
            if errors is not None:
                errors.append(error)

    def run(self, fn, args, workers, timed=True):
        """``fn(w, *args)`` for ``w = 0 .. workers - 1`` on the calling thread's team of this runtime.

        ``timed``: how long the call's end waits for the team after the calling thread's workers counts
        towards :meth:`usable`: kernel workers share their work (:mod:`nblstm.cpu.sync`), split it into
        equal parts, or give the largest to the caller (:func:`nblstm.cpu.pack.transpose_gates`), so that a
        thread on time ends with the caller. Not for :func:`run_each`'s jobs.
        """
        threads_ = min(workers, max(self._max_threads(), 1))
        if threads_ <= 1 or not self._lock.acquire(blocking=False):
            for w in range(workers):
                fn(w, *args)
            return
        key = next(self._keys)
        errors = []
        self._jobs[key] = (fn, args, workers, errors)
        self._caller_done = None
        try:
            self._parallel(self._callback, key, threads_, 0)  # ctypes releases the GIL meanwhile
            if timed and self._caller_done is not None:
                self._waited(time.perf_counter() - self._caller_done)
        finally:
            del self._jobs[key]
            self._lock.release()
        if errors:
            raise errors[0]


_local = threading.local()


@contextlib.contextmanager
def on_team(team):
    """Context manager: this thread's kernel calls run their workers on ``team`` (an :class:`OpenMPTeam`; ``None``:
    on nblstm's own threads)."""
    before = getattr(_local, "team", None)
    _local.team = team
    try:
        yield
    finally:
        _local.team = before


def run(fn, args, workers, concurrency=None, timed=True):
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
    timed : bool, default True
        On an OpenMP team, how long the call's end waits for the team's
        threads counts towards :meth:`OpenMPTeam.usable`: ``False`` for
        workers of unequal work whose longest part is not worker 0's
        (:func:`run_each`'s jobs), whose waits say nothing of the machine's
        load.
    """
    if getattr(_local, "alone", False):  # inside run_each's job: the workers in turn, on this thread
        for w in range(workers):
            fn(w, *args)
        return
    team = getattr(_local, "team", None)
    if team is not None and workers > 1 and concurrency != 1 and team.pid == os.getpid() and team.usable():
        team.run(fn, args, workers, timed)  # a forked child keeps to its own threads: the parent's
        return
    _pool.run(fn, args, workers, workers if concurrency is None else concurrency)



def run_each(jobs):
    """``[job() for job in jobs]``, the jobs at once, a thread each (``jobs[0]`` on this one), each job's kernels
    on its own thread alone.

    For independent calls whose steps are too small to split well between
    threads: the two directions of a bidirectional layer at ``H = 128``,
    where two threads on one direction ran at 0.75-0.82 of twice one
    thread's speed. A job is Python (the GIL is held between its kernels,
    which release it) and runs where :func:`run` runs workers: nblstm's
    helper threads, or the calling thread's OpenMP team (:func:`on_team`).
    Inside a job, :func:`run` calls a kernel's workers one after the other
    on the job's thread: the kernels split their work as on every thread,
    so that the results are the same bits. The first job's exception is
    raised once every job has ended.
    """
    results = [None] * len(jobs)
    run(_job, (jobs, results), len(jobs), timed=False)  # jobs of their own sizes
    return results


def _job(w, jobs, results):
    before = getattr(_local, "alone", False)
    _local.alone = True
    try:
        results[w] = jobs[w]()
    finally:
        _local.alone = before
