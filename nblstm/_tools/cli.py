"""Command line: ``python -m nblstm {demo,check,bench,info,warmup}`` (also the ``nblstm`` script)."""

__all__ = ["main"]

import argparse
import os
import platform
import sys
import time

import numpy as np

from .. import __version__, ops
from .. import reference as ref

_DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
_OUTPUTS = ("i", "cs", "f", "o", "ci", "co", "h")
_GRADS = ("x_grad", "cs_prev_grad", "h_prev_grad", "w_grad", "wci_grad", "wcf_grad", "wco_grad", "b_grad")


def _problem(rng, steps, batch, inputs, units, dtype):
    """A random problem whose gate pre-activations are of order one."""
    scale = 1.0 / np.sqrt(inputs + units)
    arrays = {
        "x": rng.standard_normal((steps, batch, inputs)),
        "cs_prev": rng.standard_normal((batch, units)) * 0.5,
        "h_prev": rng.uniform(-0.5, 0.5, (batch, units)),
        "w": rng.standard_normal((inputs + units, 4 * units)) * scale,
        "b": rng.standard_normal(4 * units) * 0.1,
        "wci": rng.standard_normal(units) * 0.1,
        "wcf": rng.standard_normal(units) * 0.1,
        "wco": rng.standard_normal(units) * 0.1,
    }
    return {k: v.astype(dtype) for k, v in arrays.items()}


def _time(fn, repeats):
    """Median wall time of ``repeats`` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _max_rel_error(got, expected):
    expected = np.asarray(expected, np.float64)
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    return float(np.abs(np.asarray(got, np.float64) - expected).max(initial=0.0)) / scale


def _check_ops(p, options, out=sys.stdout):
    """Run forward and backward, compare with the float64 reference; returns the worst errors."""
    args = (p["x"], p["cs_prev"], p["h_prev"], p["w"], p["b"], p["wci"], p["wcf"], p["wco"])
    fwd = ops.block_lstm(*args, **options)
    rng = np.random.default_rng(1)
    h_grad = rng.standard_normal(fwd.h.shape).astype(fwd.h.dtype)
    grads = ops.block_lstm_grad(*args[:4], fwd, None, h_grad, *args[5:], seq_len_max=options.get("seq_len_max"),
                                use_peephole=options["use_peephole"], layout=options["layout"])
    cell_clip = options["cell_clip"] if options["cell_clip"] is not None else -1.0
    expected = ref.block_lstm(*args, options.get("seq_len_max"), options["forget_bias"], cell_clip,
                              options["use_peephole"], options["layout"])
    expected_grads = ref.block_lstm_grad(*args[:4], *args[5:], fwd, np.zeros_like(h_grad), h_grad,
                                         options.get("seq_len_max"), options["use_peephole"], options["layout"])
    fwd_error = max(_max_rel_error(getattr(fwd, k), expected[k]) for k in _OUTPUTS)
    bwd_error = max(_max_rel_error(getattr(grads, k), expected_grads[k]) for k in _GRADS)
    return fwd_error, bwd_error


def _tolerance(dtype):
    return {np.float16: 1e-2, np.float32: 1e-5, np.float64: 1e-10}[np.dtype(dtype).type]


def _progress(out):
    """A progress callback of :func:`nblstm.warmup` that prints each line to ``out``, indented."""

    def report(line):
        print(f"  {line}", file=out, flush=True)

    return report


def demo(args, out=sys.stdout):
    """Compile the kernels, train an LSTMCell on the adding problem, then check and time the fused ops."""
    from ..precompile import warmup as run_warmup
    from .demo import train

    # The cell trains in float32; the fused ops run in the chosen dtype. The demo runs no stepper.
    dtypes = sorted({"float32", args.dtype})
    groups = ("LSTMCell", "block_lstm_grad", "block_lstm")
    where = f", {args.jobs} processes at once" if args.jobs > 1 else ""
    print(f"nblstm demo: compiling the kernels it runs (numba caches them: later runs load them){where}", file=out)
    seconds = run_warmup(dtypes, jobs=args.jobs, groups=groups, progress=_progress(out))
    print(f"  kernels ready in {seconds:.1f} s", file=out)
    print(file=out)
    status = train(out=out, steps=args.train_steps)
    print(file=out)
    return status or ops_demo(args, out)


def warmup(args, out=None):
    """Compile (or load from numba's cache) every CPU kernel for the chosen dtypes; a line per group."""
    from ..precompile import warmup as run_warmup

    out = sys.stdout if out is None else out
    where = f" in {args.jobs} processes at once" if args.jobs > 1 else ""
    print(f"nblstm {__version__}: compiling the CPU kernels for {', '.join(args.dtypes)}{where} "
          f"(or loading them from numba's cache)", file=out)
    seconds = run_warmup(args.dtypes, jobs=args.jobs, progress=_progress(out))
    print(f"done in {seconds:.1f} s", file=out)
    return 0


def ops_demo(args, out=sys.stdout):
    """Forward and backward on one shape: check against the float64 reference, then time."""
    steps, batch, inputs, units = args.shape
    dtype = _DTYPES[args.dtype]
    print(f"nblstm {__version__}: BlockLSTMV2 forward + backward, (T, B, I, H) = {tuple(args.shape)}, {args.dtype}",
          file=out)
    p = _problem(np.random.default_rng(0), steps, batch, inputs, units, dtype)
    options = {"forget_bias": 1.0, "cell_clip": None, "use_peephole": False, "layout": "ifco"}
    start = time.perf_counter()
    fwd_error, bwd_error = _check_ops(p, options, out)
    print(f"  first call (compiles or loads the kernels): {time.perf_counter() - start:.2f} s", file=out)
    tol = _tolerance(dtype)
    ok = fwd_error <= tol and bwd_error <= tol
    print(f"  max error vs float64 reference: forward {fwd_error:.2e}, backward {bwd_error:.2e} "
          f"(tolerance {tol:.0e}): {'OK' if ok else 'FAILED'}", file=out)
    x, c0, h0, w, b = (p[k] for k in ("x", "cs_prev", "h_prev", "w", "b"))
    result = {}

    def forward():
        result["fwd"] = ops.block_lstm(x, c0, h0, w, b)

    def backward():
        ops.block_lstm_grad(x, c0, h0, w, result["fwd"], None, result["fwd"].h)

    forward()
    t_fwd = _time(forward, args.repeats)
    t_bwd = _time(backward, args.repeats)
    flops = 2.0 * steps * batch * (inputs + units) * 4 * units
    print(f"  forward  {t_fwd * 1e3:9.3f} ms  {flops / t_fwd / 1e9:7.1f} GFLOP/s", file=out)
    print(f"  backward {t_bwd * 1e3:9.3f} ms  {2 * flops / t_bwd / 1e9:7.1f} GFLOP/s", file=out)
    return 0 if ok else 1


def check(args, out=sys.stdout):
    """Every op and option against the float64 reference on the chosen target; prints a table."""
    if args.target == "cuda":
        from .gpu_check import run_check

        return run_check(out=out)
    rng = np.random.default_rng(0)
    failures = 0
    print(f"{'dtype':8} {'layout':6} {'peephole':8} {'clip':>5} {'seq_len_max':>11} {'forward':>9} {'backward':>9}",
          file=out)
    for dtype in (np.float16, np.float32, np.float64):
        for layout in ("ifco", "icfo"):
            for use_peephole, cell_clip in ((False, None), (True, 0.5)):
                for seq_len_max in (0, 3, 6):
                    p = _problem(rng, 6, 4, 5, 7, dtype)
                    options = {"forget_bias": 1.0, "cell_clip": cell_clip, "use_peephole": use_peephole,
                               "layout": layout, "seq_len_max": seq_len_max}
                    fwd_error, bwd_error = _check_ops(p, options, out)
                    bad = max(fwd_error, bwd_error) > _tolerance(dtype)
                    failures += bad
                    print(f"{np.dtype(dtype).name:8} {layout:6} {str(use_peephole):8} {str(cell_clip):>5} "
                          f"{seq_len_max:>11} {fwd_error:9.1e} {bwd_error:9.1e}{'  FAILED' if bad else ''}", file=out)
    print("all ops match the float64 reference" if not failures else f"{failures} cases FAILED", file=out)
    return 1 if failures else 0


def _time_forward_backward(p, repeats):
    """Median times of a forward call and of a forward plus backward call, in seconds."""
    x, c0, h0, w, b = (p[k] for k in ("x", "cs_prev", "h_prev", "w", "b"))

    def forward():
        return ops.block_lstm(x, c0, h0, w, b)

    def both():
        fwd = forward()
        ops.block_lstm_grad(x, c0, h0, w, fwd, None, fwd.h)

    both()
    return _time(forward, repeats), _time(both, repeats)


def bench(args, out=sys.stdout):
    """Time forward and forward+backward on a few shapes."""
    if args.target == "cuda":
        from .gpu_check import run_bench

        return run_bench(out=out)
    shapes = [(63, 1, 24, 32), (100, 1, 256, 256), (50, 32, 256, 256), (50, 32, 512, 512)]
    dtype = _DTYPES[args.dtype]
    print(f"{'T':>4} {'B':>4} {'I':>5} {'H':>5} {'fwd ms':>9} {'GFLOP/s':>8} {'fwd+bwd ms':>11} {'GFLOP/s':>8}",
          file=out)
    for steps, batch, inputs, units in shapes:
        p = _problem(np.random.default_rng(0), steps, batch, inputs, units, dtype)
        t_fwd, t_both = _time_forward_backward(p, args.repeats)
        flops = 2.0 * steps * batch * (inputs + units) * 4 * units
        print(f"{steps:4} {batch:4} {inputs:5} {units:5} {t_fwd * 1e3:9.3f} {flops / t_fwd / 1e9:8.1f} "
              f"{t_both * 1e3:11.3f} {3 * flops / t_both / 1e9:8.1f}", file=out)
    return 0


def info(args, out=sys.stdout):
    """Versions, targets, threading and the BLAS in use."""
    import llvmlite
    import numba
    import scipy

    from ..cpu.blas import blas_info
    from ..cpu.microkernel import describe

    print(f"nblstm      {__version__}", file=out)
    print(f"python      {platform.python_version()} ({platform.machine()}, {platform.system()})", file=out)
    for module in (numba, llvmlite, np, scipy):
        print(f"{module.__name__:11} {module.__version__}", file=out)
    print("targets     cpu" + (", cuda" if _cuda_available() else " (cuda: not available)"), file=out)
    # The CPU kernels run on nblstm's own worker threads (nblstm.cpu.threads), as many as numba's setting.
    print(f"threading   {numba.get_num_threads()} worker threads (numba.get_num_threads())", file=out)
    # The recurrent products' register tile (nblstm.cpu.microkernel), chosen by the host's vector width.
    print(f"microkernel {describe()}", file=out)
    for lib in blas_info():
        print(f"blas        {lib['internal_api']} {lib['version']} ({lib.get('architecture')}), "
              f"{lib['num_threads']} threads, {lib['filepath']}", file=out)
    return 0


def _cuda_available():
    try:
        from numba import cuda
    except ImportError:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:
        return False


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(prog="nblstm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="train an LSTMCell, then check and time the fused ops on one shape")
    p_demo.add_argument("--train-steps", type=int, default=400)
    p_demo.add_argument("--shape", type=int, nargs=4, metavar=("T", "B", "I", "H"), default=[50, 32, 256, 256])
    p_demo.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p_demo.add_argument("--repeats", type=int, default=20)
    p_demo.add_argument("--jobs", type=_positive_int, default=min(2, os.cpu_count() or 1),
                        help="processes that compile the kernels at once (default 2; 1 on a single core)")
    p_check = sub.add_parser("check", help="every op and option against the float64 reference")
    p_check.add_argument("--target", choices=["cpu", "cuda"], default="cpu")
    p_bench = sub.add_parser("bench", help="time forward and backward on standard shapes")
    p_bench.add_argument("--target", choices=["cpu", "cuda"], default="cpu")
    p_bench.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    p_bench.add_argument("--repeats", type=int, default=10)
    sub.add_parser("info", help="versions, targets, threads and BLAS")
    p_warmup = sub.add_parser("warmup", help="compile (or load from numba's cache) every CPU kernel now")
    p_warmup.add_argument("--dtypes", nargs="+", choices=sorted(_DTYPES), default=["float32", "float64"])
    p_warmup.add_argument("--jobs", type=_positive_int, default=1, help="processes that compile at once (default 1)")
    args = parser.parse_args(argv)
    commands = {"demo": demo, "check": check, "bench": bench, "info": info, "warmup": warmup}
    return commands[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
