"""Calls from many Python threads at once and determinism (memory over many calls: tests/test_leaks.py).

The kernels' workers (:mod:`nblstm.cpu.threads`) may be started from several
Python threads at once: one call uses the helper threads at a time, the others
run their workers one after the other in their own thread, with the same
results.
"""

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pytest

import nblstm
from nblstm.cpu import blas as _blas
from nblstm.cpu import fused, partition, threads
from nblstm.cpu import sync as _sync
from tests.helpers import run_python
from tests.test_properties import make_arrays

# (T, B, I, H): one chunk; hidden units split across threads (B * H * 4H >= 32768); the input
# projection split by rows as well (T * B * I * 4H >= 2**18).
SMALL, CHUNKED, ROW_SPLIT = (3, 2, 3, 5), (3, 8, 16, 32), (4, 8, 64, 32)


def run_job(job):
    """Forward and backward (sequence or single step) of one problem; returns every result array."""
    kind, shape, dtype, seed = job
    a = make_arrays(seed, *shape, dtype, 1.0)
    peeps = (a["wci"], a["wcf"], a["wco"])
    if kind == "sequence":
        out = nblstm.block_lstm(a["x"], a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, forget_bias=1.0,
                                cell_clip=2.0, use_peephole=True)
        grads = nblstm.block_lstm_grad(a["x"], a["cs_prev"], a["h_prev"], a["w"], out, a["cs_grad"], a["h_grad"],
                                       *peeps, use_peephole=True)
    else:
        out = nblstm.lstm_block_cell(a["x"][0], a["cs_prev"], a["h_prev"], a["w"], a["b"], *peeps, forget_bias=1.0,
                                     use_peephole=True, layout="icfo")
        grads = nblstm.lstm_block_cell_grad(a["x"][0], a["cs_prev"], a["h_prev"], a["w"], out, a["cs_grad"][0],
                                            a["h_grad"][0], *peeps, use_peephole=True, layout="icfo")
    return [*out, *grads]


JOBS = [(kind, shape, dtype, seed)
        for seed, (kind, shape) in enumerate([("sequence", SMALL), ("sequence", CHUNKED), ("sequence", ROW_SPLIT),
                                              ("cell", SMALL), ("cell", CHUNKED)])
        for dtype in (np.float32, np.float64, np.float16)]


def assert_identical(got, expected, what):
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.dtype == e.dtype and g.shape == e.shape
        assert np.array_equal(g, e, equal_nan=True), f"{what}: result {k} differs"


@pytest.fixture(autouse=True)
def helpers_on_tiny_problems(monkeypatch):
    """Every call here with more than one chunk or block runs on the helper threads (nblstm.cpu.threads),
    however small: the problems here are tiny, and below the threshold one thread would run them."""
    monkeypatch.setattr(partition, "MIN_PARALLEL_CALL_WORK", 0)


@pytest.fixture
def restore_num_threads():
    n = numba.get_num_threads()
    yield n
    numba.set_num_threads(n)


def scipy_blas_threads():
    return [info["num_threads"] for info in _blas.blas_info()]


def test_concurrent_calls_from_eight_threads_match_sequential_calls():
    blas_before = scipy_blas_threads()
    expected = [run_job(job) for job in JOBS]
    main_threads = numba.get_num_threads()
    rounds = 3
    work = [k for _ in range(rounds) for k in range(len(JOBS))]
    barrier = threading.Barrier(8)

    def worker(indices):
        numba.set_num_threads(main_threads)  # numba's thread count is per Python thread
        barrier.wait()
        return [(k, run_job(JOBS[k])) for k in indices]

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(worker, work[t::8]) for t in range(8)]
        results = [r for f in futures for r in f.result(timeout=300)]
    assert len(results) == len(work)
    for k, got in results:
        assert_identical(got, expected[k], f"job {JOBS[k][:3]}")
    assert scipy_blas_threads() == blas_before, "single_threaded_blas did not restore SciPy's BLAS threads"


def test_threads_with_different_numba_thread_counts(restore_num_threads):
    """Each Python thread's numba thread count is its own; results follow that count only."""
    counts = sorted({1, restore_num_threads})
    job = ("sequence", CHUNKED, np.float32, 7)
    expected = {}
    for n in counts:
        numba.set_num_threads(n)
        expected[n] = run_job(job)
    numba.set_num_threads(restore_num_threads)
    barrier = threading.Barrier(8)

    def worker(n):
        numba.set_num_threads(n)
        barrier.wait()
        return n, [run_job(job) for _ in range(5)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        for n, runs in pool.map(worker, [counts[t % len(counts)] for t in range(8)]):
            for got in runs:
                assert_identical(got, expected[n], f"{n} numba threads")


@pytest.fixture
def blas_two_threads():
    """SciPy's BLAS on 2 threads, set from this (the main) thread, which so controls it; restored afterwards."""
    libs = _blas._scipy_blas_controllers()
    saved = [lib.get_num_threads() for lib in libs]
    for lib in libs:
        lib.set_num_threads(2)
    if scipy_blas_threads() != [2] * len(libs):
        pytest.skip("SciPy's BLAS cannot be set to 2 threads from this thread")
    yield
    for lib, n in zip(libs, saved, strict=True):
        lib.set_num_threads(n)


def test_single_threaded_blas_is_reference_counted_across_threads(blas_two_threads):
    """One BLAS thread while any thread is inside; the setting comes back when the last one leaves."""
    entered = threading.Barrier(4)
    released = threading.Event()
    seen = []

    def holder():
        with _blas.single_threaded_blas():
            entered.wait()
            released.wait(timeout=60)
            seen.append(scipy_blas_threads())

    with _blas.single_threaded_blas():  # first in, last out (see the next test for other orders)
        threads = [threading.Thread(target=holder) for _ in range(3)]
        for t in threads:
            t.start()
        entered.wait()
        with _blas.single_threaded_blas():  # nested
            assert all(n == 1 for n in scipy_blas_threads())
        assert all(n == 1 for n in scipy_blas_threads())
        released.set()
        for t in threads:
            t.join(timeout=60)
        assert all(n == 1 for n in scipy_blas_threads()), "released while this thread still holds it"
    assert len(seen) == 3 and all(n == 1 for s in seen for n in s)
    assert scipy_blas_threads() == [2] * len(seen[0])


def test_single_threaded_blas_works_from_any_python_thread(blas_two_threads):
    with _blas.single_threaded_blas():  # this thread took control of the BLAS
        pass
    seen = []

    def other():
        with _blas.single_threaded_blas():
            seen.append(scipy_blas_threads())

    t = threading.Thread(target=other)
    t.start()
    t.join(timeout=60)
    assert seen and all(n == 1 for n in seen[0]), f"BLAS threads inside single_threaded_blas in a thread: {seen}"
    assert all(n == 2 for n in scipy_blas_threads())


@pytest.mark.parametrize("job", [j for j in JOBS if j[2] != np.float16], ids=str)
def test_repeated_calls_are_bitwise_identical(job):
    first = run_job(job)
    for _ in range(3):
        assert_identical(run_job(job), first, "run to run")


def _by_thread_count(job):
    results = {}
    for n in (1, 2):
        numba.set_num_threads(n)
        results[n] = run_job(job)
    return results


needs_two_threads = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 numba threads")


@needs_two_threads
@pytest.mark.parametrize("kind, shape", [("sequence", SMALL), ("sequence", CHUNKED), ("cell", CHUNKED)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_results_do_not_depend_on_the_thread_count_below_the_row_split(kind, shape, dtype, restore_num_threads):
    """Splitting the hidden units across threads leaves every result bitwise unchanged.

    Each chunk's recurrent GEMM sums over all H inputs in the same order whatever
    the chunking, and the gate maths is elementwise.
    """
    results = _by_thread_count((kind, shape, dtype, 3))
    assert_identical(results[2], results[1], "1 vs 2 numba threads")


@needs_two_threads
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 2, 256, 128), (7, 5, 64, 33), (40, 9, 32, 48)], ids=str)
def test_forward_does_not_depend_on_the_thread_count(shape, dtype, restore_num_threads):
    """The forward's input projection is split into blocks that do not depend on the thread count (row_blocks)."""
    results = _by_thread_count(("sequence", shape, dtype, 11))
    assert_identical(results[2][:7], results[1][:7], "forward: 1 vs 2 numba threads")


@needs_two_threads
@pytest.mark.xfail(strict=False, reason=(
    "not guaranteed: from T*B*I*4H >= 2**18 multiply-adds (nblstm.cpu.partition) x_grad and w_grad are "
    "split into one block per numba thread (x_grad by rows of the gate gradients, w_grad by its own rows); "
    "OpenBLAS's sum over K for an element can depend on the block's size (M = 1 goes through GEMV, small M*N*K "
    "through its small-matrix kernels), so results may differ in the last bits between thread counts"))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_across_thread_counts_above_the_row_split(dtype, restore_num_threads):
    results = _by_thread_count(("sequence", (2, 2, 2, 256), dtype, 11))
    assert_identical(results[2][7:], results[1][7:], "backward: 1 vs 2 numba threads")


@pytest.mark.parametrize("threads", [1, 2])
def test_more_chunks_than_threads(threads, monkeypatch, restore_num_threads):
    """The time loops' workers claim the chunks of each step (nblstm.cpu.sync): with 5 chunks on fewer
    threads, a thread takes over the chunks of workers that are not running, and no result changes."""
    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip("needs 2 numba threads")
    job = ("sequence", CHUNKED, np.float32, 5)
    expected = run_job(job)
    monkeypatch.setattr(fused, "chunk_bounds", lambda batch, units, num_chunks=None: partition.split(units, 5))
    numba.set_num_threads(threads)
    got = run_job(job)
    assert_identical(got, expected, f"5 chunks on {threads} thread(s)")


@numba.njit
def _claim_round(claims, done, stage, worker, num_chunks, held):
    """Run the claim loop of :func:`nblstm.cpu.sync.claimed` on one thread: the chunks claimed, and ``done`` seen
    in each."""
    order = np.full(num_chunks, -1, np.int64)
    done_before = np.full(num_chunks, -1, np.int64)
    n = 0
    for j in range(num_chunks):
        k = _sync.claimed(claims, done, stage, worker, num_chunks, held, j)
        if k >= 0:
            order[n] = k
            done_before[n] = done[stage]
            n += 1
            _sync.count_done(done, stage, num_chunks)
    return order[:n], done_before[:n]


def test_claimed_own_chunk_first_then_the_rest_once():
    num_chunks, stages = 5, 3
    claims, done = _sync.counters(stages, num_chunks)
    order, done_before = _claim_round(claims, done, 1, 2, num_chunks, False)
    assert order.tolist() == [2, 3, 4, 0, 1]
    assert done_before.tolist() == [0, 1, 2, 3, 4], "a chunk is counted done only after the caller ran it"
    assert done.tolist() == [0, 5, 0, 0] and claims.reshape(stages, num_chunks)[1].tolist() == [1] * num_chunks
    order, _ = _claim_round(claims, done, 1, 0, num_chunks, False)
    assert order.size == 0 and done[1] == 5, "every chunk of the stage was taken: another worker gets none"
    # Worker 3 claimed its own chunk of stage 2 ahead (held); worker 0 took chunk 4 meanwhile.
    assert _sync.claim(claims, 2, 3, num_chunks) and _sync.claim(claims, 2, 4, num_chunks)
    order, _ = _claim_round(claims, done, 2, 3, num_chunks, True)
    assert order.tolist() == [3, 0, 1, 2] and done[2] == 4
    assert claims.reshape(stages, num_chunks)[2].tolist() == [1, 1, 1, 1, 2], "only chunk 4 was asked for twice"


@numba.njit(nogil=True)
def _record_worker(w, log, fail_on):
    log[w] += 1
    if w == fail_on:
        raise ValueError("worker failed")


def test_worker_pool_runs_every_worker_once_and_reports_errors():
    log = np.zeros(3, np.int64)
    threads.run(_record_worker, (log, -1), 3)
    assert log.tolist() == [1, 1, 1]
    threads.run(_record_worker, (log, -1), 3, concurrency=1)  # one after the other on this thread
    assert log.tolist() == [2, 2, 2]
    with pytest.raises(ValueError, match="worker failed"):
        threads.run(_record_worker, (log, 2), 3)  # raised in a helper thread, re-raised here
    assert log.tolist() == [3, 3, 3], "the other workers ran to the end"
    threads.run(_record_worker, (log, -1), 3)  # the pool still works
    assert log.tolist() == [4, 4, 4]


def test_worker_pool_busy_runs_the_workers_in_the_calling_thread():
    """A call that finds the helpers taken by another thread's call runs its workers itself."""
    log = np.zeros(2, np.int64)
    with threads._pool.lock:
        threads.run(_record_worker, (log, -1), 2)
    assert log.tolist() == [1, 1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_worker_pool_in_a_forked_child():
    """The parent's helper threads do not exist in a child made by fork: the child starts its own."""
    log = np.zeros(2, np.int64)
    threads.run(_record_worker, (log, -1), 2)  # helpers started in the parent
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its call completes with both workers
        status = 1
        try:
            child_log = np.zeros(2, np.int64)
            threads.run(_record_worker, (child_log, -1), 2)
            status = 0 if child_log.tolist() == [1, 1] else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# -- the workers on an OpenMP runtime's team (nblstm.cpu.threads.OpenMPTeam, as nblstm.torch runs them) -----------


@pytest.fixture(scope="module")
def gomp_team():
    """The system's libgomp, loaded here, as a team (nblstm.torch uses PyTorch's copy the same way)."""
    import ctypes.util

    name = ctypes.util.find_library("gomp")
    if name is None or not os.path.exists("/proc/self/maps"):
        pytest.skip("no libgomp on this machine, or no /proc/self/maps")
    lib = ctypes.CDLL(name)  # noqa: F841 - kept loaded for the module's tests
    with open("/proc/self/maps") as maps:
        found = [line.split()[-1] for line in maps if "libgomp" in line.rsplit("/", 1)[-1]]
    team = threads.OpenMPTeam.loaded(os.path.dirname(found[0]), r"libgomp")
    assert team is not None and "libgomp" in team.path
    yield team
    del lib


def test_openmp_team_runs_each_worker_once_on_its_threads(gomp_team):
    seen = []
    lock = threading.Lock()

    def worker(w, tag):
        with lock:
            seen.append((w, tag, threading.get_native_id()))

    gomp_team.run(worker, ("x",), 3)
    assert sorted(w for w, _, _ in seen) == [0, 1, 2] and {t for _, t, _ in seen} == {"x"}
    ids = {tid for _, _, tid in seen}
    assert threading.get_native_id() in ids, "the calling thread is one of the team"
    # At most the runtime's thread count (omp_get_max_threads: the cores here), several where it allows them.
    assert len(ids) <= min(3, gomp_team._max_threads())
    if gomp_team._max_threads() > 1:
        assert len(ids) > 1


def test_openmp_team_busy_or_of_one_thread_runs_the_workers_here(gomp_team, monkeypatch):
    """A call that finds the team busy (another Python thread's call), or a runtime of one thread, runs its
    workers one after the other on the calling thread: no second team of threads."""
    here = threading.get_native_id()
    seen = []
    with gomp_team._lock:
        gomp_team.run(lambda w: seen.append((w, threading.get_native_id())), (), 3)
    assert seen == [(0, here), (1, here), (2, here)]
    seen.clear()
    monkeypatch.setattr(gomp_team, "_max_threads", lambda: 1)
    gomp_team.run(lambda w: seen.append((w, threading.get_native_id())), (), 3)
    assert seen == [(0, here), (1, here), (2, here)]


def test_openmp_team_hands_a_worker_error_to_the_caller(gomp_team):
    def worker(w):
        if w == 1:
            raise ValueError("worker 1 failed")

    with pytest.raises(ValueError, match="worker 1 failed"):
        gomp_team.run(worker, (), 2)
    gomp_team.run(lambda w: None, (), 2)  # usable afterwards


def test_openmp_team_smaller_than_asked_runs_every_worker(gomp_team, monkeypatch):
    """A runtime may give a team of fewer threads than asked: each thread then takes several workers."""
    monkeypatch.setattr(gomp_team, "_parallel", lambda callback, key, workers, flags: callback(key))  # one thread
    monkeypatch.setattr(gomp_team, "_num_threads", lambda: 1)
    monkeypatch.setattr(gomp_team, "_thread_num", lambda: 0)
    seen = []
    gomp_team.run(lambda w: seen.append(w), (), 4)
    assert seen == [0, 1, 2, 3]


@pytest.mark.parametrize("job", [j for j in JOBS if j[0] == "sequence" or j[1] == CHUNKED], ids=str)
def test_kernels_on_an_openmp_team_give_the_pool_s_bits(gomp_team, job, monkeypatch):
    expected = run_job(job)
    # On the team throughout, however late its threads (a busy machine would send calls to nblstm's threads).
    monkeypatch.setattr(threads, "LATE_SECONDS", float("inf"))
    monkeypatch.setattr(gomp_team, "avoid_until", 0.0)
    calls = []
    run = gomp_team.run
    monkeypatch.setattr(gomp_team, "run",
                        lambda fn, args, workers, *timed: calls.append(workers) or run(fn, args, workers, *timed))
    with threads.on_team(gomp_team):
        got = run_job(job)
    assert_identical(got, expected, "OpenMP team against nblstm's threads")
    if job[1] != SMALL and numba.get_num_threads() > 1:
        assert calls, "no call ran on the team"
    with threads.on_team(None):  # nested: back on nblstm's own threads
        calls.clear()
        run_job(job)
        assert not calls


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_on_its_own_threads(gomp_team):
    job = ("sequence", CHUNKED, np.float32, 3)
    expected = run_job(job)
    with threads.on_team(gomp_team):
        run_job(job)  # the parent's team has threads now
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's exit code says
            ok = all(np.array_equal(g, e) for g, e in zip(run_job(job), expected, strict=True))
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@needs_two_threads
def test_run_each_returns_every_job_s_result_and_reports_errors(restore_num_threads):
    """``run_each``: the results in the jobs' order, the first job on the calling thread, each job seeing the
    caller's numba thread count (its kernels split their work as elsewhere), the first error raised once every
    job has ended."""
    numba.set_num_threads(2)
    ran = []

    def job(name, fail=False):
        def run():
            ran.append(name)
            if fail:
                raise ValueError(f"{name} failed")
            return name, numba.get_num_threads(), threading.get_ident()
        return run

    results = threads.run_each([job("a"), job("b")])
    assert [r[:2] for r in results] == [("a", 2), ("b", 2)], "a job's kernels split their work as elsewhere"
    assert results[0][2] == threading.get_ident(), "the first job runs on the calling thread"
    assert numba.get_num_threads() == 2
    ran.clear()
    with pytest.raises(ValueError, match="b failed"):
        threads.run_each([job("a"), job("b", fail=True)])
    assert sorted(ran) == ["a", "b"] and numba.get_num_threads() == 2


def test_run_each_runs_a_job_s_workers_in_turn_on_its_thread(gomp_team):
    """Inside a job, a kernel's workers run one after the other on the job's thread, on nblstm's threads or on
    an OpenMP team; outside, as before."""

    def job():
        seen = []
        threads.run(lambda w: seen.append((w, threading.get_ident())), (), 3)
        return seen, threading.get_ident()

    for team in (None, gomp_team):
        with threads.on_team(team):
            results = threads.run_each([job, job])
        for seen, ident in results:
            assert seen == [(0, ident), (1, ident), (2, ident)]
    seen = []
    threads.run(lambda w: seen.append(threading.get_ident()), (), 2)
    assert len(set(seen)) == 2, "outside a job the workers run on two threads"


@needs_two_threads
@pytest.mark.parametrize("call", [dict(), dict(lengths=True), dict(mask=True), dict(num_proj=True)], ids=str)
def test_bidirectional_directions_at_once_give_the_same_bits(call, monkeypatch, restore_num_threads):
    """A bidirectional layer whose steps are small runs its two directions' calls at once, a thread each
    (partition.directions_at_once), their kernels' workers in turn: the outputs, the final state and every
    gradient bit for bit as one after the other (a shape whose calls split each step and the weight gradients
    between two threads; a projection's cells on their own kernels)."""
    numba.set_num_threads(2)
    rng = np.random.default_rng(4)
    steps, batch, inputs, units = 20, 16, 24, 64
    layer = nblstm.LSTM(inputs, units, num_layers=2, bidirectional=True, seed=2,
                        proj_size=16 if call.get("num_proj") else 0)
    x = rng.standard_normal((steps, batch, inputs)).astype(np.float32)
    given = {}
    if call.get("lengths"):
        given["sequence_length"] = rng.integers(0, steps + 1, batch)
    if call.get("mask"):
        given["mask"] = rng.random((batch, steps)) < 0.7
    d_out = rng.standard_normal((steps, batch, layer.output_size)).astype(np.float32)
    calls = []
    import nblstm.layer.lstm as layer_module

    def counted(jobs):
        calls.append(len(jobs))
        return threads.run_each(jobs)

    monkeypatch.setattr(layer_module, "run_each", counted)
    results = {}
    for at_once in (False, True):
        monkeypatch.setattr(partition, "MAX_DIRECTIONS_AT_ONCE_WORK", 1 << 40 if at_once else 0)
        out, (h_n, c_n) = layer(x, **given)
        (t_out, (t_h, t_c)), backward = layer.vjp(x, **given)
        d_x, _, d_w = backward(d_out)
        results[at_once] = [out, h_n, c_n, t_out, t_h, t_c, d_x, *[d_w[k] for k in sorted(d_w)]]
    assert calls == [2, 2, 2, 2, 2, 2], "each layer's directions at once: inference, training forward, backward"
    for a, b in zip(results[False], results[True], strict=True):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


_SCIPY_BLAS_RUN = """
import importlib.util
import sys
import numpy as np
import nblstm
from nblstm.reference.ops import block_lstm
x = np.ones((2, 1, 40), np.float32)  # B = 1: the input projection on BLAS
c = np.zeros((1, 4), np.float32)
w = np.linspace(-1, 1, 44 * 16, dtype=np.float32).reshape(44, 16)
h = nblstm.block_lstm(x, c, c, w, np.zeros(16, np.float32)).h
z = np.zeros(4)
ref = block_lstm(x.astype(np.float64), c, c, w.astype(np.float64), np.zeros(16), z, z, z)["h"]
assert np.allclose(h, ref, atol=1e-5), "the BLAS products"
"""


def _run_scipy_case(code):
    assert run_python(code).strip() == "ok"


def test_scipy_blas_loads_without_scipy_linalg_which_still_imports_whole_afterwards():
    """The kernels' BLAS (``scipy.linalg.cython_blas``) is loaded without running the ``scipy.linalg`` package
    (nblstm.cpu.blas); a look-up of the package does not import it, and a later ``import scipy.linalg`` gives
    the package with its ``cython_blas`` attribute, after which the finder that set it is gone."""
    _run_scipy_case(_SCIPY_BLAS_RUN + """
assert "scipy.linalg" not in sys.modules, "the package was imported"
assert importlib.util.find_spec("scipy.linalg") is not None and "scipy.linalg" not in sys.modules
import scipy.linalg
import scipy.linalg.cython_blas as blas
assert scipy.linalg.cython_blas is blas is sys.modules["scipy.linalg.cython_blas"]
assert not [f for f in sys.meta_path if type(f).__name__ == "_SetOnParent"]
a = np.array([[2.0, 1.0], [1.0, 3.0]])
assert np.allclose(scipy.linalg.inv(a) @ a, np.eye(2))
print("ok")
""")


def test_scipy_blas_falls_back_to_the_usual_import():
    """Where the extension cannot be loaded alone, ``scipy.linalg.cython_blas`` is imported the usual way."""
    run = _SCIPY_BLAS_RUN.replace("import nblstm\n", """import nblstm
import nblstm.cpu.blas as b
def fail():
    raise ImportError("laid out otherwise")
b._load_extension_alone = fail
""")
    _run_scipy_case(run + """
assert "scipy.linalg" in sys.modules, "the usual import"
import scipy.linalg
assert scipy.linalg.cython_blas is sys.modules["scipy.linalg.cython_blas"]
assert not [f for f in sys.meta_path if type(f).__name__ == "_SetOnParent"]
print("ok")
""")
