"""Compile (or load from numba's on-disk cache) every CPU kernel ahead of its first use.

Numba compiles a kernel for each new signature (argument types) on first use
and keeps the machine code in its on-disk cache. The kernels take every
option at run time and get C-contiguous, writable arrays of the compute
dtype whatever the caller passes (:mod:`nblstm.cpu.target`), so the
signatures a user can reach are those of a few calls per kernel family and
compute dtype. :func:`warmup` makes those calls, in groups (:data:`GROUPS`):

- ``block_lstm``: :func:`nblstm.block_lstm` and :func:`nblstm.lstm_block_cell`
  on shapes that take every path of :mod:`nblstm.cpu.partition`: one chunk
  of units and several, on the calling thread and on helper threads, the
  input projection inside the steps and as GEMMs before them, weights packed
  on one thread and on several, ``seq_len_max`` 0, 1 and ``T``.
- ``block_lstm_grad``: :func:`nblstm.block_lstm_grad` and
  :func:`nblstm.lstm_block_cell_grad` on the same shapes, with stand-in
  forward outputs (so that the group compiles no forward kernel).
- ``LSTMCell``: :class:`nblstm.LSTMCell` one step, ``run``, ``vjp`` and its
  backward function, with and without ``num_proj``, peepholes, clips,
  lengths, masks, the reverse direction and a joined state, every
  activation, one chunk and several (the layers, :class:`nblstm.LSTM` and
  TensorFlow 1's RNN functions, run these kernels only).
- ``LSTMCell.stepper``: :meth:`nblstm.LSTMCell.stepper` steps, with and
  without ``num_proj``, one row and several, ``out=``, ``reset``.

float16 is computed in float32: the float32 groups also run their calls on
float16 arrays, which compiles the float16 conversions. With ``jobs > 1``
the groups are compiled in parallel processes; numba's cache carries the
machine code to the calling process, which then loads it.
"""

import contextlib
import itertools
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

__all__ = ["GROUPS", "run_group", "warmup"]

#: The kernel groups of :func:`warmup`, heaviest first (compiled in that order).
GROUPS = ("LSTMCell", "block_lstm_grad", "block_lstm", "LSTMCell.stepper")

_COMPUTE_DTYPES = {"float16": "float32", "float32": "float32", "float64": "float64"}


# -- the groups ------------------------------------------------------------------------------------------------


def _op_shapes(dtype):
    """``(T, B, I, H)`` of the fused ops' calls: together they take every path of :mod:`nblstm.cpu.partition`."""
    from .cpu.partition import fused_projection

    # The smallest I for which the input projection is GEMMs before the loop at B = 8, H = 512.
    unfused = 64
    while fused_projection(8, unfused, 512, dtype):
        unfused *= 2
    return (
        (3, 2, 3, 8),  # one chunk (a small step), the input projection inside the steps
        (3, 1, 3, 8),  # batch 1: matrix-vector steps, the input projection before the loop
        (2, 8, 8, 128),  # several chunks, a call too small for helper threads (below 2^22 multiply-adds)
        (2, 8, 16, 512),  # several chunks on helper threads; 2^20 recurrent weights, packed in parallel
        (2, 8, unfused, 512),  # the same, the input projection's GEMMs and weight packing in parallel
    )


def _op_arrays(rng, steps, batch, inputs, units, dtype):
    scale = 1.0 / np.sqrt(inputs + units)
    x = rng.standard_normal((steps, batch, inputs)).astype(dtype)
    cs = (rng.standard_normal((batch, units)) * 0.5).astype(dtype)
    h = (rng.standard_normal((batch, units)) * 0.5).astype(dtype)
    w = (rng.standard_normal((inputs + units, 4 * units)) * scale).astype(dtype)
    b = np.zeros(4 * units, dtype)
    p = (rng.standard_normal(units) * 0.1).astype(dtype)
    return x, cs, h, w, b, p


def _storage_dtypes(dtype):
    """The dtypes whose calls run on the kernels of the compute dtype ``dtype``."""
    return (np.float32, np.float16) if np.dtype(dtype) == np.float32 else (np.float64,)


def _float16_shapes(shapes):
    """float16 runs the float32 kernels: only the conversions are new, on one thread (the first shape) and on
    several (the last, 2^20 weights and more)."""
    return (shapes[0], shapes[-1])


def _op_problems(dtype):
    """``(shape, storage dtype, arrays)`` of every op call of the warm-up for the compute ``dtype``."""
    rng = np.random.default_rng(0)
    for storage in _storage_dtypes(dtype):
        shapes = _op_shapes(dtype)
        for shape in _float16_shapes(shapes) if storage == np.float16 else shapes:
            yield shape, storage, _op_arrays(rng, *shape, storage)


def _block_lstm(dtype):
    from . import ops

    for _, _, (x, cs, h, w, b, p) in _op_problems(dtype):
        ops.block_lstm(x, cs, h, w, b)
        ops.block_lstm(
            x, cs, h, w, b, p, p, p, seq_len_max=1, forget_bias=1.0, cell_clip=1.0, use_peephole=True, layout="icfo"
        )
        ops.block_lstm(x, cs, h, w, b, seq_len_max=0)
        ops.lstm_block_cell(x[0], cs, h, w, b, p, p, p, cell_clip=1.0, use_peephole=True)


def _block_lstm_grad(dtype):
    from . import ops

    for shape, storage, (x, cs, h, w, _, p) in _op_problems(dtype):
        steps, batch, _, units = shape
        # Stand-in forward outputs: the backward trusts them, and no forward kernel is compiled here.
        outputs = [np.full((steps, batch, units), 0.5, storage) for _ in range(7)]
        grad = outputs[0]
        ops.block_lstm_grad(x, cs, h, w, outputs, None, grad)
        ops.block_lstm_grad(
            x, cs, h, w, outputs, grad, grad, p, p, p, seq_len_max=1, use_peephole=True, layout="icfo"
        )
        ops.block_lstm_grad(x, cs, h, w, outputs, grad, None, seq_len_max=0)
        step = [a[0] for a in outputs]
        ops.lstm_block_cell_grad(x[0], cs, h, w, step, grad[0], grad[0], p, p, p, use_peephole=True)
        ops.lstm_block_cell_grad(x[0], cs, h, w, step)


#: ``(T, B, I, H, P)`` of the cell's calls: one chunk; several chunks on the calling thread (a call below
#: 2^22 multiply-adds); several on helper threads, 2^20 recurrent weights packed in parallel (without num_proj).
_CELL_SHAPES = ((3, 2, 3, 8, 4), (2, 16, 8, 128, 64), (2, 8, 8, 512, 256))


def _cells(units, num_proj, dtype):
    """A plain cell, and one with every option (a joined state, a run-time activation code)."""
    from .cell import LSTMCell

    return (
        LSTMCell(units, dtype=dtype, seed=0),
        LSTMCell(
            units,
            num_proj=num_proj,
            use_peepholes=True,
            cell_clip=1.0,
            proj_clip=0.5,
            state_is_tuple=False,
            activation="relu",
            dtype=dtype,
            seed=0,
        ),
    )


def _lstm_cell(dtype):
    from .cell import ACTIVATION_NAMES, LSTMCell
    from .cpu.pack import transpose_gates

    rng = np.random.default_rng(0)
    for storage in _storage_dtypes(dtype):
        for steps, batch, inputs, units, num_proj in (
            _float16_shapes(_CELL_SHAPES) if storage == np.float16 else _CELL_SHAPES
        ):
            x = rng.standard_normal((steps, batch, inputs)).astype(storage)
            lengths = np.arange(batch) % (steps + 1)
            for cell, sequence_length in zip(_cells(units, num_proj, storage), (None, lengths)):
                state = cell.zero_state(batch, storage)
                cell(x[0], state)
                cell.run(x, state, sequence_length=sequence_length)
                (outputs, final), backward = cell.vjp(x, None, sequence_length=sequence_length)
                backward(np.ones_like(outputs), final)
                backward()
                # The reverse direction and masks (nblstm.LSTM, bidirectional_dynamic_rnn): the schedule's kernels.
                mask = rng.random((batch, steps)) < 0.7
                (outputs, final), backward = cell.vjp(x, None, mask=mask, reverse=True)
                backward(np.ones_like(outputs))
    x = rng.standard_normal((2, 2, 3)).astype(dtype)
    for activation in ACTIVATION_NAMES:  # run-time codes: nothing to compile each, and cheap to show it
        cell = LSTMCell(4, num_proj=3, activation=activation, dtype=dtype, seed=0)
        cell.vjp(x, sequence_length=[2, 1])[1]()
    for storage in _storage_dtypes(dtype):  # nblstm.torch.LSTM's weights and gradients, in its layouts
        transpose_gates([(np.ones((8, 3), storage), np.empty((3, 8), storage)),
                         (np.ones((8, 2), storage), np.empty((2, 8), storage))], (0, 2, 1, 3), True)


def _stepper(dtype):
    rng = np.random.default_rng(0)
    for storage in _storage_dtypes(dtype):
        # One row; several rows in the input projection's row blocks (2^20 multiply-adds a step).
        for batch, inputs, units, num_proj in ((1, 3, 8, 4), (32, 64, 128, 64)):
            for cell in _cells(units, num_proj, storage):
                cell.build(inputs)
                step = cell.stepper(batch)
                x = rng.standard_normal((batch, inputs)).astype(storage)
                out = step(x)
                step(x, out=out)
                step.reset(step.state)
                step(x[:, ::-1].copy(order="F") if batch > 1 else x)


_RUN = {
    "block_lstm": _block_lstm,
    "block_lstm_grad": _block_lstm_grad,
    "LSTMCell": _lstm_cell,
    "LSTMCell.stepper": _stepper,
}


def run_group(group, dtype):
    """Make the calls of one group (:data:`GROUPS`) on the kernels of the compute dtype ``dtype``.

    Parameters
    ----------
    group : str
        One of :data:`GROUPS`.
    dtype : {"float32", "float64"}
        float32 runs the float16 calls too.
    """
    _RUN[group](np.dtype(dtype))


# -- arguments ---------------------------------------------------------------------------------------------------


def _compute_dtypes(dtypes):
    """The compute dtypes of ``dtypes``, in order, each once."""
    if isinstance(dtypes, (str, np.dtype, type)):
        dtypes = [dtypes]
    names = []
    for dtype in dtypes:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
        if name not in _COMPUTE_DTYPES:
            raise ValueError(f"dtypes: {dtype!r} is not one of float16, float32, float64")
        if _COMPUTE_DTYPES[name] not in names:
            names.append(_COMPUTE_DTYPES[name])
    return names


def _work(dtypes, groups):
    if groups is None:
        groups = GROUPS
    elif isinstance(groups, str):
        groups = [groups]
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"groups: {unknown[0]!r} is not one of {GROUPS}")
    ordered = [g for g in GROUPS if g in groups]
    return [(group, dtype) for group in ordered for dtype in _compute_dtypes(dtypes)]


# -- parallel processes ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _file_lock(path):
    """An exclusive lock on the file ``path``, across processes."""
    with open(path, "a+b") as f:
        try:
            import fcntl
        except ImportError:  # Windows
            import msvcrt

            f.seek(0)
            msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)
            try:
                yield
            finally:
                f.seek(0)
                msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
        else:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _can_serialise_saves():
    try:
        from numba.core import caching
    except ImportError:
        return False
    return callable(getattr(getattr(caching, "IndexDataCacheFile", None), "save", None))


@contextlib.contextmanager
def _serialised_saves(lock_path):
    """Numba's cache saves, one process at a time.

    A save reads the function's index, picks the first free data file name
    and writes both: two processes saving two signatures of one function at
    once could pick the same name, and the index of one would then point at
    the machine code of the other. Every process of a parallel warm-up takes
    the lock around each save.
    """
    from numba.core import caching

    original = caching.IndexDataCacheFile.save

    def save(self, key, data):
        with _file_lock(lock_path):
            return original(self, key, data)

    caching.IndexDataCacheFile.save = save
    try:
        yield
    finally:
        caching.IndexDataCacheFile.save = original


def _serve(lock_path):
    """A helper process: run the groups named on stdin (``group dtype`` lines), answer one JSON line each."""
    replies, sys.stdout = sys.stdout, sys.stderr  # nothing else may write to the replies
    with _serialised_saves(lock_path):
        for line in sys.stdin:
            group, dtype = line.split()
            start = time.perf_counter()
            try:
                run_group(group, dtype)
                reply = {"error": None}
            except Exception as error:  # reported to the caller, which runs the group itself
                reply = {"error": f"{type(error).__name__}: {error}"}
            reply["seconds"] = time.perf_counter() - start
            replies.write(json.dumps(reply) + "\n")
            replies.flush()
    return 0


# The helper imports the caller's nblstm: from the folder that holds it, when another would come first.
_SERVE = """
import importlib.util, os, sys
root = sys.argv[2]
spec = importlib.util.find_spec("nblstm")
if spec is None or os.path.dirname(os.path.dirname(os.path.abspath(spec.origin))) != root:
    sys.path.insert(0, root)
from nblstm.precompile import _serve
sys.exit(_serve(sys.argv[1]))
"""


def _helper_environment():
    """The caller's environment with the numba cache folder this process uses (set before numba was imported)."""
    import numba

    env = dict(os.environ)
    cache_dir = numba.config.CACHE_DIR
    if cache_dir:
        env["NUMBA_CACHE_DIR"] = cache_dir
    else:
        env.pop("NUMBA_CACHE_DIR", None)
    return env


#: The folder that holds the nblstm package of this process.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Helper:
    """A helper process that compiles the groups it is given; numba's cache carries their machine code back."""

    def __init__(self, folder, index, env):
        self.log_path = os.path.join(folder, f"helper-{index}.log")
        self.used = False
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SERVE, os.path.join(folder, "lock"), _ROOT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
        )

    def run(self, group, dtype):
        """``None`` when the helper compiled the group, else what went wrong."""
        self.used = True
        try:
            self.process.stdin.write(f"{group} {dtype}\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        except OSError:  # it exited: its log says why
            line = ""
        if line:
            return json.loads(line)["error"]
        self.process.wait()
        with open(self.log_path, "rb") as f:
            failure = f.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"the helper process exited with code {self.process.returncode}: {failure[0]}"

    @property
    def alive(self):
        return self.process.poll() is None

    def close(self, kill=False):
        """End the process: it exits once its input closes; one that never got work is killed."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        if kill or not self.used:
            self.process.kill()
        try:
            self.process.wait()
        finally:
            self.process.stdout.close()
            self._log.close()


def _feed(helper, pending, finished, announce):
    """Give ``helper`` pending groups until there are none left (or it dies); post each result."""
    while True:
        try:
            item = pending.get_nowait()
        except queue.Empty:
            return
        announce(item)
        try:
            error = helper.run(*item)
        except Exception as e:  # never leave the caller waiting for this item
            error = f"{type(e).__name__}: {e}"
        finished.put((item, error))
        if error is not None and not helper.alive:
            return


class _Helpers:
    """``size`` helper processes, started at this process's first cache miss, each fed by a thread of its own.

    Until then this process loads the groups itself: from a warm cache that is
    faster than starting processes that would only load them too.
    """

    def __init__(self, folder, size, pending, finished, announce):
        self.folder, self.size = folder, size
        self.pending, self.finished, self.announce = pending, finished, announce
        self.helpers, self.feeders = [], []
        self.missed = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._starter = threading.Thread(target=self._start, daemon=True)
        self._starter.start()

    def on_compile(self):
        self.missed.set()

    def _start(self):
        self.missed.wait()
        with self._lock:
            if self._closed or self.pending.empty():
                return
            env = _helper_environment()
            for index in range(self.size):
                helper = _Helper(self.folder, index, env)
                feeder = threading.Thread(
                    target=_feed, args=(helper, self.pending, self.finished, self.announce), daemon=True
                )
                self.helpers.append(helper)
                self.feeders.append(feeder)
                feeder.start()

    def close(self, kill):
        with self._lock:
            self._closed = True
        self.missed.set()
        self._starter.join()
        for helper in self.helpers:
            helper.close(kill)
        for feeder in self.feeders:
            feeder.join()


class _CompileListener:
    """A numba event listener that calls ``callback()`` when a compilation (a cache miss) starts."""

    def __new__(cls, callback):
        from numba.core import event

        class Listener(event.Listener):
            def on_start(self, _event):
                callback()

            def on_end(self, _event):
                pass

        return Listener()


@contextlib.contextmanager
def _listening(callback):
    from numba.core import event

    listener = _CompileListener(callback)
    event.register("numba:compile", listener)
    try:
        yield
    finally:
        event.unregister("numba:compile", listener)


def _parallel(work, jobs, announce, progress):
    """Run ``work`` in ``jobs`` processes: this one and, from its first cache miss, ``jobs - 1`` helpers.

    This process takes the next pending group whenever it is free, and loads
    each group a helper compiled from the cache (or compiles it, if the helper
    failed).
    """
    pending = queue.Queue()
    for item in work:
        pending.put(item)
    finished = queue.Queue()
    with (
        tempfile.TemporaryDirectory(prefix="nblstm-warmup-") as folder,
        _serialised_saves(os.path.join(folder, "lock")),
    ):
        helpers = _Helpers(folder, jobs - 1, pending, finished, announce)
        ok = False
        try:
            with _listening(helpers.on_compile):
                done = 0
                while done < len(work):
                    try:
                        item, error = finished.get_nowait()
                    except queue.Empty:
                        try:
                            item = pending.get_nowait()
                        except queue.Empty:
                            item, error = finished.get()
                        else:
                            announce(item)
                            error = None
                    if error is not None and progress is not None:
                        progress(f"{item[0]} {item[1]}: {error}; compiling it here")
                    run_group(*item)
                    done += 1
            ok = True
        finally:
            helpers.close(kill=not ok)


def warmup(dtypes=("float32", "float64"), jobs=1, *, groups=None, progress=None):
    """Compile (or load from numba's cache) every CPU kernel for ``dtypes`` now, instead of at first use.

    Numba compiles a kernel the first time it sees new argument types, which
    takes seconds; later calls, and later processes through numba's on-disk
    cache, reuse the machine code. ``warmup()`` makes, on small arrays, the
    calls that need every signature the public API reaches on the CPU (the
    fused ops, :mod:`nblstm.raw_ops`, :class:`nblstm.LSTMCell` and its
    stepper, every option, one thread and several, any input layout):
    afterwards the process compiles nothing more for those dtypes. The
    GPU's kernels are not compiled.

    Parameters
    ----------
    dtypes : sequence of str or numpy dtype, default ("float32", "float64")
        float16 is computed in float32: "float16" and "float32" both warm the
        float32 kernels and the float16 conversions.
    jobs : int, default 1
        Processes that compile at once. With ``jobs > 1``, from the first
        kernel missing from numba's cache on, ``jobs - 1`` helper processes
        compile groups while this process compiles others, each writing the
        cache, and this process then loads the helpers' groups from it (a
        helper that fails leaves its group to this process). Worth it with
        that many idle cores and an empty or outdated cache; with a warm
        cache it starts no process.
    groups : sequence of str, optional
        Some of ``"LSTMCell"``, ``"block_lstm_grad"``, ``"block_lstm"``,
        ``"LSTMCell.stepper"`` (``nblstm.precompile.GROUPS``); all by
        default. ``block_lstm`` holds :func:`nblstm.block_lstm` and
        :func:`nblstm.lstm_block_cell` (and their raw ops), ``block_lstm_grad``
        their gradients.
    progress : callable, optional
        Called with one line per group as its compilation starts, such as
        ``"compiling block_lstm_grad float32 (3/8)"``; with ``jobs > 1``
        possibly from another thread.

    Returns
    -------
    float
        Seconds spent.

    Raises
    ------
    ValueError
        An unknown dtype or group, or ``jobs < 1``.

    Examples
    --------
    >>> import nblstm
    >>> lines = []
    >>> seconds = nblstm.warmup(["float64"], groups=["block_lstm"], progress=lines.append)
    >>> lines
    ['compiling block_lstm float64 (1/1)']
    """
    start = time.perf_counter()
    if isinstance(jobs, bool) or not isinstance(jobs, (int, np.integer)) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    work = _work(dtypes, groups)
    lock = threading.Lock()
    counter = itertools.count(1)

    def announce(item):
        with lock:
            line = f"compiling {item[0]} {item[1]} ({next(counter)}/{len(work)})"
            if progress is not None:
                progress(line)

    jobs = min(int(jobs), len(work))
    if jobs > 1 and sys.executable and _can_serialise_saves():
        _parallel(work, jobs, announce, progress)
    else:
        for item in work:
            announce(item)
            run_group(*item)
    return time.perf_counter() - start
