"""A warmed-up process compiles nothing: :func:`nblstm.warmup` reaches every CPU kernel signature of the public API.

A fresh interpreter, with this process's numba cache folder, runs
``nblstm.warmup(("float32", "float64"))`` and then every public entry point
(the ops, the raw ops, :class:`nblstm.LSTMCell` one step, ``run``, ``vjp`` and
its backward, its stepper, converters, Dask) on shapes that take the single- and the
multi-threaded paths, the input projection inside the steps and before them,
on float16, strided, Fortran-ordered and read-only inputs. Numba's compile
events are recorded, and every dispatcher's signatures compared before and
after each case: a case that compiles a kernel, or loads one from the cache
that the warm-up did not load, fails and names it. A signature the warm-up
misses would otherwise compile on a user's first call (seconds each).
"""

import gc
import json
import os
import textwrap

import numba
import numpy as np
import pytest

import nblstm
from nblstm.precompile import GROUPS
from tests.helpers import run_python

_PRELUDE = '''
import gc, json, sys, threading
import numpy as np
import nblstm
from numba.core import event
from numba.core.dispatcher import Dispatcher


def signatures():
    """Every (function, signature) compiled or loaded in this process."""
    found = set()
    for obj in gc.get_objects():
        if isinstance(obj, Dispatcher):
            name = f"{obj.py_func.__module__}.{obj.py_func.__qualname__}"
            found.update((name, str(sig)) for sig in list(obj.overloads))
    return found


def compiled_in(fn, *args):
    """Run fn(*args); return the names of the functions numba compiled meanwhile and what else it loaded."""
    before = signatures()
    with event.install_recorder("numba:compile") as recorder:
        fn(*args)
    compiled = sorted({f"{e.data['dispatcher'].py_func.__module__}.{e.data['dispatcher'].py_func.__qualname__}"
                       f"{tuple(map(str, e.data['args']))}" for _, e in recorder.buffer if e.is_start})
    loaded = sorted(f"{name}{sig}" for name, sig in signatures() - before)
    return {"compiled": compiled, "loaded": loaded}
'''

_CASES = '''
import os, tempfile
from nblstm import convert, raw_ops
from nblstm.cell import ACTIVATION_NAMES

# (T, B, I, H): one chunk; batch 1; several chunks on one thread (a call below 2^22 multiply-adds); several
# chunks on helper threads, the input projection inside the steps, before them, and 2^20 weights packed in parallel.
OP_SHAPES = [(5, 3, 7, 12), (4, 1, 6, 10), (3, 8, 40, 64), (4, 16, 40, 256), (3, 8, 600, 512), (2, 4, 20, 512)]
# (T, B, I, H, P): one chunk; several chunks on helper threads.
CELL_SHAPES = [(5, 3, 7, 12, 6), (3, 32, 10, 128, 48)]
rng = np.random.default_rng(1)


def problem(shape, dtype):
    T, B, I, H = shape
    p = {"x": rng.standard_normal((T, B, I)), "cs_prev": rng.standard_normal((B, H)),
         "h_prev": rng.standard_normal((B, H)), "w": rng.standard_normal((I + H, 4 * H)) * 0.1,
         "b": rng.standard_normal(4 * H) * 0.1, "wci": rng.standard_normal(H) * 0.1,
         "wcf": rng.standard_normal(H) * 0.1, "wco": rng.standard_normal(H) * 0.1}
    return {k: a.astype(dtype) for k, a in p.items()}


def ops_calls(dtype, view):
    for shape in OP_SHAPES:
        p = {k: view(a) for k, a in problem(shape, dtype).items()}
        x, c, h, w, b, wci, wcf, wco = (p[k] for k in ("x", "cs_prev", "h_prev", "w", "b", "wci", "wcf", "wco"))
        T = x.shape[0]
        out = nblstm.block_lstm(x, c, h, w, b)
        grad = view(np.ones_like(out.h))
        nblstm.block_lstm_grad(x, c, h, w, [view(a) for a in out], None, grad)
        for slm in (T - 1, 1, 0):
            out = nblstm.block_lstm(x, c, h, w, b, wci, wcf, wco, seq_len_max=slm, forget_bias=1.0, cell_clip=0.5,
                                    use_peephole=True, layout="icfo")
            nblstm.block_lstm_grad(x, c, h, w, out, grad, grad, wci, wcf, wco, seq_len_max=slm, use_peephole=True,
                                   layout="icfo")
        step = nblstm.lstm_block_cell(x[0], c, h, w, b, wci, wcf, wco, cell_clip=0.5, use_peephole=True)
        nblstm.lstm_block_cell_grad(x[0], c, h, w, [view(a) for a in step], view(step.cs), None, wci, wcf, wco,
                                    use_peephole=True)
        nblstm.lstm_block_cell_grad(x[0], c, h, w, nblstm.lstm_block_cell(x[0], c, h, w, b))


def raw_ops_calls(dtype, view):
    for shape in OP_SHAPES[:3]:
        p = {k: view(a) for k, a in problem(shape, dtype).items()}
        args = {k: p[k] for k in ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")}
        T = p["x"].shape[0]
        for forward, backward in ((raw_ops.BlockLSTM, raw_ops.BlockLSTMGrad),
                                  (raw_ops.BlockLSTMV2, raw_ops.BlockLSTMGradV2)):
            outs = forward(seq_len_max=T, **args, use_peephole=True)
            grad = view(np.ones_like(outs.h))
            backward(seq_len_max=T, **args, **outs._asdict(), cs_grad=grad, h_grad=grad, use_peephole=True)
        args["x"] = p["x"][0]
        step = raw_ops.LSTMBlockCell(**args)
        gates = {k: view(a) for k, a in step._asdict().items() if k != "h"}
        raw_ops.LSTMBlockCellGrad(**args, **gates, cs_grad=view(step.cs), h_grad=view(step.h), use_peephole=False)


def cell_calls(dtype, view):
    for T, B, I, H, P in CELL_SHAPES:
        x = view(rng.standard_normal((T, B, I)).astype(dtype))
        lengths = view(np.arange(B, dtype=np.int64) % (T + 1))
        for kwargs in ({}, {"num_proj": P, "use_peepholes": True, "cell_clip": 0.5, "proj_clip": 0.5,
                            "activation": "softsign", "state_is_tuple": False}):
            cell = nblstm.LSTMCell(H, dtype=dtype, seed=2, **kwargs)
            cell.build(I)
            cell.set_weights({k: view(a) for k, a in cell.get_weights().items()})
            state = cell.zero_state(B, dtype)
            state = type(state)(*map(view, state)) if isinstance(state, tuple) else view(state)
            output, step_state = cell(x[0], state)
            cell.run(x, state, sequence_length=lengths)
            (outputs, final), backward = cell.vjp(x, state, lengths)
            d_final = type(final)(*map(view, final)) if isinstance(final, tuple) else view(final)
            backward(view(np.ones_like(outputs)), d_final)
            backward()
            cell.vjp(x)[1](None, None)
    x = view(rng.standard_normal((3, 2, 4)).astype(dtype))
    for activation in ACTIVATION_NAMES:
        cell = nblstm.LSTMCell(5, num_proj=3, activation=activation, dtype=dtype, seed=0)
        (outputs, _), backward = cell.vjp(x, sequence_length=[3, 1])
        backward(view(np.ones_like(outputs)))


def stepper_calls(dtype, view):
    for batch, inputs, units, num_proj in ((1, 5, 12, 6), (24, 40, 96, 48)):
        for kwargs in ({}, {"num_proj": num_proj, "use_peepholes": True, "cell_clip": 0.5, "proj_clip": 0.5,
                            "activation": "elu", "state_is_tuple": False}):
            cell = nblstm.LSTMCell(units, dtype=dtype, seed=3, **kwargs)
            cell.build(inputs)
            state = cell.zero_state(batch, dtype)
            state = type(state)(*map(view, state)) if isinstance(state, tuple) else view(state)
            step = cell.stepper(batch, initial_state=state)
            x = view(rng.standard_normal((batch, inputs)).astype(dtype))
            out = step(x)
            step(x, out=np.empty_like(out))
            step.reset(state)
            step(x)
            step.state


def convert_calls(dtype, view):
    cell = nblstm.LSTMCell(6, use_peepholes=True, dtype=dtype, seed=0)
    cell.build(4)
    weights = cell.to_block_lstm()
    w2, b2 = convert.block_lstm_v1_to_v2(weights["w"], weights["b"])
    convert.icfo_to_ifco(weights["w"])
    convert.block_lstm_v2_to_torch(w2, b2, 4)
    plain = nblstm.LSTMCell(6, dtype=dtype, seed=0)
    plain.build(4)
    nblstm.LSTMCell.from_keras(plain.to_keras()).run(view(np.ones((3, 2, 4), dtype)))
    x = view(np.ones((3, 2, 4), dtype))
    c = view(np.zeros((2, 6), dtype))
    nblstm.block_lstm(x, c, c, **{k: view(a) if isinstance(a, np.ndarray) else a for k, a in weights.items()})


def dask_calls(dtype, view):
    try:
        import dask.array as da
        import nblstm.dask
    except ImportError:
        return
    p = problem(OP_SHAPES[2], dtype)
    x, c, h = (da.from_array(p[k], chunks={0: -1, 1: 3}) for k in ("x", "cs_prev", "h_prev"))
    nblstm.dask.block_lstm(x, c, h, p["w"], p["b"]).h.compute(scheduler="synchronous")
    nblstm.dask.lstm_block_cell(x[0], c, h, p["w"], p["b"]).h.compute(scheduler="synchronous")


def strided(a):
    """The values of ``a`` in a view with a stride over every other element."""
    wide = np.repeat(a, 2, axis=-1) if a.ndim else a
    return wide[..., ::2]


def read_only_views(a):
    """``a`` made read-only, by turns: frozen, broadcast, memory-mapped."""
    kind = read_only_views.count % 3
    read_only_views.count += 1
    if kind == 0:
        a = a.copy()
        a.flags.writeable = False
        return a
    if kind == 1:
        return np.broadcast_to(a, a.shape)
    path = os.path.join(FOLDER, f"{read_only_views.count}.npy")
    np.save(path, a)
    return np.load(path, mmap_mode="r")


read_only_views.count = 0
FOLDER = tempfile.mkdtemp(prefix="nblstm-compile-once-")
same = lambda a: a  # noqa: E731


def each(calls, view, dtypes=(np.float32, np.float64)):
    def run():
        for dtype in dtypes:
            for fn in calls:
                fn(dtype, view)
    return run


every = (ops_calls, raw_ops_calls, cell_calls, stepper_calls)
CASES = {
    "ops": each([ops_calls], same),
    "raw_ops": each([raw_ops_calls], same),
    "LSTMCell": each([cell_calls], same),
    "stepper": each([stepper_calls], same),
    "float16": each(every, same, (np.float16,)),
    "strided": each(every, strided),
    "fortran": each(every, np.asfortranarray),
    "convert": each([convert_calls], same),
    "dask": each([dask_calls], same),
    "read-only": each(every + (convert_calls,), read_only_views),  # last: what it alone compiles is its own
}
'''

_WARM_PROCESS = (
    _PRELUDE
    + _CASES
    + """
seconds = nblstm.warmup(("float32", "float64"))
results = {name: compiled_in(run) for name, run in CASES.items()}
print(json.dumps({"warmup_seconds": seconds, "cases": results}))
"""
)

#: The cases of the warm process, in its order.
CASES = ("ops", "raw_ops", "LSTMCell", "stepper", "float16", "strided", "fortran", "convert", "dask", "read-only")


def _run_child(code, env=None, timeout=1800):
    """Run ``code`` in a fresh interpreter on the nblstm under test; the JSON of its last output line."""
    return json.loads(run_python(code, env, timeout).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def warm_process():
    """One warmed-up interpreter's record of what each case compiled (numba's cache folder: this process's)."""
    env = dict(os.environ)
    if numba.config.CACHE_DIR:
        env["NUMBA_CACHE_DIR"] = numba.config.CACHE_DIR
    return _run_child(_WARM_PROCESS, env)


def _describe(record):
    lines = [f"compiled: {name}" for name in record["compiled"]]
    lines += [
        f"loaded from the cache, not by the warm-up: {name}"
        for name in record["loaded"]
        if not any(name.startswith(c.split("(")[0]) for c in record["compiled"])
    ]
    return "\n".join(lines[:40])


@pytest.mark.parametrize("case", CASES)
def test_warm_process_compiles_nothing(warm_process, case):
    record = warm_process["cases"][case]
    assert not record["compiled"] and not record["loaded"], (
        f"after nblstm.warmup(), the {case!r} calls needed kernels the warm-up did not compile:\n" + _describe(record)
    )


def test_cases_take_every_path():
    """The warm-up's shapes take the single- and multi-threaded paths of :mod:`nblstm.cpu.partition`."""
    from nblstm.cpu.partition import call_threads, cell_chunk_bounds, chunk_bounds, fused_projection, row_blocks
    from nblstm.precompile import _CELL_SHAPES, _op_shapes

    several = numba.get_num_threads() > 1
    for dtype in (np.float32, np.float64):
        shapes = _op_shapes(dtype)
        chunks = [len(chunk_bounds(b, h)) - 1 > 1 for _, b, _, h in shapes]
        threads = [call_threads(t * b * 4 * h * (i + h)) > 1 for t, b, i, h in shapes]
        assert chunks == [False, False, several, several, several]
        assert threads == [False, False, False, several, several]
        assert [fused_projection(b, i, h, dtype) for _, b, i, h in shapes] == [True, False, True, True, False]
        t, b, i, h = shapes[-1]
        assert row_blocks(t * b, i * 4 * h)[1]  # the input projection's GEMMs in parallel
    chunks = [len(cell_chunk_bounds(b, h)) - 1 > 1 for _, b, _, h, _ in _CELL_SHAPES]
    threads = [call_threads(t * b * 4 * h * (i + h)) > 1 for t, b, i, h, _ in _CELL_SHAPES]
    assert chunks == [False, several, several] and threads == [False, False, several]


def test_float16_warms_the_float32_groups():
    """float16 is computed in float32: ``warmup(["float16"])`` is float32's (the float16 case checks its calls)."""
    from nblstm.precompile import _work

    assert _work(["float16"], None) == _work(["float32"], None) == [(g, "float32") for g in GROUPS]
    assert _work(["float16", "float32", np.float64], ["block_lstm"]) == [
        ("block_lstm", "float32"),
        ("block_lstm", "float64"),
    ]


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="dtypes"):
        nblstm.warmup(["int32"])
    with pytest.raises(ValueError, match="groups"):
        nblstm.warmup(groups=["gemm"])
    with pytest.raises(ValueError, match="jobs"):
        nblstm.warmup(jobs=0)


_PARALLEL = _PRELUDE + textwrap.dedent("""
    import nblstm.precompile as w

    lines, helped, loads = [], [], {}
    run_group = w.run_group

    def recorded(group, dtype):
        loads.setdefault(f"{group} {dtype}", []).append(compiled_in(run_group, group, dtype))

    def progress(line):
        lines.append(line)
        if threading.current_thread() is not threading.main_thread():
            helped.append(" ".join(line.split()[1:3]))

    w.run_group = recorded
    seconds = nblstm.warmup(["float32", "float64"], jobs=2, groups=["block_lstm_grad"], progress=progress)
    print(json.dumps({"seconds": seconds, "lines": lines, "helped": helped, "loads": loads}))
""")


def test_parallel_warmup_leaves_this_process_warm(tmp_path):
    """``jobs=2``, empty cache: a helper process compiles a group, and this process loads it without compiling."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    result = _run_child(_PARALLEL, env, timeout=900)
    assert sorted(line.split(" (")[0] for line in result["lines"]) == [
        "compiling block_lstm_grad float32",
        "compiling block_lstm_grad float64",
    ]
    assert result["seconds"] > 0
    assert len(result["helped"]) == 1, result  # one group each: this process and the helper
    helped = result["helped"][0]
    assert len(result["loads"][helped]) == 1
    record = result["loads"][helped][0]
    assert not record["compiled"], "the helper's kernels compiled again here:\n" + _describe(record)


def test_command_line_prints_a_line_per_group_and_the_time(capsys):
    from nblstm._tools import cli

    assert cli.main(["warmup", "--dtypes", "float64", "--jobs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("nblstm ") and "float64" in lines[0]
    assert [line.strip() for line in lines[1:-1]] == [f"compiling {g} float64 ({k}/4)" for k, g in enumerate(GROUPS, 1)]
    assert lines[-1].startswith("done in ") and lines[-1].endswith(" s")


def _probe_function(module, seen):
    """A jitted function of ``module`` whose compile records whether the garbage collector runs then."""
    from numba import njit, types
    from numba.extending import intrinsic

    @intrinsic
    def probe(typingctx, x):
        seen.append(gc.isenabled())
        if not isinstance(x, types.Float):
            raise TypeError("a float, please")  # a failed compile
        return x(x), lambda context, builder, signature, args: args[0]

    def function(x):
        return probe(x)

    function.__module__ = module
    return njit(function)


@pytest.mark.parametrize("collector_on", [True, False])
def test_nblstm_compiles_pause_the_collector_and_leave_it_as_found(collector_on):
    """While numba compiles a function of nblstm, Python's garbage collector waits (:mod:`nblstm._jit`); after it,
    it runs again if it ran before, also when the compile fails. Other functions compile as they would."""
    import nblstm._jit  # noqa: F401 (registers the pause)

    ours, others = [], []
    was = gc.isenabled()
    try:
        gc.enable() if collector_on else gc.disable()
        assert _probe_function("nblstm.probe", ours)(1.5) == 1.5
        assert gc.isenabled() == collector_on
        with pytest.raises(Exception, match="a float, please"):
            _probe_function("nblstm.probe", ours)(1)
        assert gc.isenabled() == collector_on
        assert _probe_function("user_code", others)(2.5) == 2.5
        assert gc.isenabled() == collector_on
        assert _probe_function(None, others)(3.5) == 3.5  # a function made by exec has no module
        assert gc.isenabled() == collector_on
    finally:
        gc.enable() if was else gc.disable()
    assert ours == [False, False]
    assert others == [collector_on, collector_on]


@pytest.mark.parametrize("outer_module", ["user_code", "nblstm.probe"])
def test_nested_compiles_pause_the_collector_once(outer_module):
    """A function of nblstm compiled inside a user's compile, and a user's inside nblstm's: the collector waits
    while any nblstm compile is open and runs again after the outermost one."""
    from numba import njit

    import nblstm._jit  # noqa: F401 (registers the pause)

    inner_module = "user_code" if outer_module.startswith("nblstm") else "nblstm.probe"
    seen = []
    inner = _probe_function(inner_module, seen)

    def outer(x):
        return inner(x) + 1.0

    outer.__module__ = outer_module
    was = gc.isenabled()
    try:
        gc.enable()
        assert njit(outer)(1.5) == 2.5
        assert gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()
    assert seen == [False]  # inside an nblstm compile either way
