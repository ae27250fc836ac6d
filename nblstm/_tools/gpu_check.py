"""Checks and timings of the CUDA target on a real GPU.

:func:`run_check` runs every op on the GPU and on the CPU target from the
same inputs and prints a table of the largest differences; :func:`run_bench`
times forward and forward+backward on DeepBench-like shapes, next to
PyTorch's cuDNN LSTM when PyTorch with CUDA is importable. Both import the
CUDA target only when called (``import nblstm`` stays free of CUDA).
"""

import statistics
import sys
import time

import numpy as np

__all__ = ["run_bench", "run_check"]

# Largest accepted error relative to the largest magnitude of the CPU result
# (float16 is stored in float16, 3 decimal digits; float32 gradients sum
# over T * B terms).
_REL_TOL = {np.dtype(np.float16): 2e-2, np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-10}

# (T, B, I, H): sizes that are not multiples of the tiles, and one that
# spans several tiles in every dimension.
_CHECK_SHAPES = [(5, 3, 7, 10), (6, 37, 70, 45)]
# (seq_len_max as a fraction of T or None, forget_bias, cell_clip, use_peephole, layout)
_CHECK_OPTIONS = [
    (None, 0.0, None, False, "ifco"),
    (0.5, 1.0, 0.8, True, "icfo"),
    (None, 0.3, None, True, "ifco"),
]


def _cuda_or_none(out):
    try:
        from numba import cuda
    except ImportError as err:
        print(f"numba.cuda cannot be imported ({err}); install numba-cuda (the cuda extra of nblstm)", file=out)
        return None
    if not cuda.is_available():
        print("no usable CUDA GPU: numba.cuda.is_available() is False", file=out)
        return None
    return cuda


def _inputs(rng, shape, dtype):
    steps, batch, inputs, units = shape
    return {
        "x": rng.standard_normal((steps, batch, inputs)).astype(dtype),
        "cs_prev": rng.standard_normal((batch, units)).astype(dtype),
        "h_prev": rng.standard_normal((batch, units)).astype(dtype),
        "w": (rng.standard_normal((inputs + units, 4 * units)) / np.sqrt(inputs + units)).astype(dtype),
        "b": (rng.standard_normal(4 * units) * 0.2).astype(dtype),
        "wci": (rng.standard_normal(units) * 0.5).astype(dtype),
        "wcf": (rng.standard_normal(units) * 0.5).astype(dtype),
        "wco": (rng.standard_normal(units) * 0.5).astype(dtype),
        "cs_grad": rng.standard_normal((steps, batch, units)).astype(dtype),
        "h_grad": rng.standard_normal((steps, batch, units)).astype(dtype),
    }


def _errors(gpu, cpu):
    """``(max abs error, max abs error / max |cpu|)``; NaN or inf on the GPU count as infinite."""
    g = np.asarray(gpu, np.float64)
    c = np.asarray(cpu, np.float64)
    if g.shape != c.shape or not np.all(np.isfinite(g)):
        return float("inf"), float("inf")
    if g.size == 0:
        return 0.0, 0.0
    err = float(np.max(np.abs(g - c)))
    scale = float(np.max(np.abs(c)))
    return err, err / scale if scale else err


def _compare_case(cuda, ncuda, shape, dtype, options, persistent, rng):
    """Rows ``(op, max abs, max rel)`` of one case, every op."""
    import nblstm

    a = _inputs(rng, shape, dtype)
    steps = shape[0]
    frac, forget_bias, cell_clip, use_peephole, layout = options
    seq_len_max = None if frac is None else int(steps * frac)
    d = {k: cuda.to_device(v) for k, v in a.items()}
    peep = ("wci", "wcf", "wco") if use_peephole else ()
    core = ("x", "cs_prev", "h_prev", "w")
    fkw = dict(seq_len_max=seq_len_max, forget_bias=forget_bias, cell_clip=cell_clip, use_peephole=use_peephole,
               layout=layout)
    bkw = dict(seq_len_max=seq_len_max, use_peephole=use_peephole, layout=layout)
    saved = ncuda.config.PERSISTENT
    ncuda.config.PERSISTENT = persistent
    rows = []
    try:
        cpu_out = nblstm.block_lstm(*(a[k] for k in core), a["b"], *(a[k] for k in peep), **fkw)
        gpu_out = nblstm.block_lstm(*(d[k] for k in core), d["b"], *(d[k] for k in peep), **fkw)
        for name, c, g in zip(cpu_out._fields, cpu_out, gpu_out, strict=True):
            rows.append((f"block_lstm.{name}", *_errors(g.copy_to_host(), c)))
        dev_out = [cuda.to_device(o) for o in cpu_out]
        cpu_g = nblstm.block_lstm_grad(*(a[k] for k in core), cpu_out, a["cs_grad"], a["h_grad"],
                                       *(a[k] for k in peep), **bkw)
        gpu_g = nblstm.block_lstm_grad(*(d[k] for k in core), dev_out, d["cs_grad"], d["h_grad"],
                                       *(d[k] for k in peep), **bkw)
        for name, c, g in zip(cpu_g._fields, cpu_g, gpu_g, strict=True):
            rows.append((f"block_lstm_grad.{name}", *_errors(g.copy_to_host(), c)))
        x1 = a["x"][0]
        cell_kw = dict(forget_bias=forget_bias, cell_clip=cell_clip, use_peephole=use_peephole, layout=layout)
        cpu_c = nblstm.lstm_block_cell(x1, a["cs_prev"], a["h_prev"], a["w"], a["b"], *(a[k] for k in peep),
                                       **cell_kw)
        gpu_c = nblstm.lstm_block_cell(cuda.to_device(x1), d["cs_prev"], d["h_prev"], d["w"], d["b"],
                                       *(d[k] for k in peep), **cell_kw)
        for name, c, g in zip(cpu_c._fields, cpu_c, gpu_c, strict=True):
            rows.append((f"lstm_block_cell.{name}", *_errors(g.copy_to_host(), c)))
        ckw = dict(use_peephole=use_peephole, layout=layout)
        cpu_cg = nblstm.lstm_block_cell_grad(x1, a["cs_prev"], a["h_prev"], a["w"], cpu_c, a["cs_grad"][0],
                                             a["h_grad"][0], *(a[k] for k in peep), **ckw)
        gpu_cg = nblstm.lstm_block_cell_grad(cuda.to_device(x1), d["cs_prev"], d["h_prev"], d["w"],
                                             [cuda.to_device(o) for o in cpu_c], cuda.to_device(a["cs_grad"][0]),
                                             cuda.to_device(a["h_grad"][0]), *(d[k] for k in peep), **ckw)
        for name, c, g in zip(cpu_cg._fields, cpu_cg, gpu_cg, strict=True):
            rows.append((f"lstm_block_cell_grad.{name}", *_errors(g.copy_to_host(), c)))
    finally:
        ncuda.config.PERSISTENT = saved
    return rows


def _foreign_kinds(cuda, out):
    """Round trips of PyTorch and CuPy arrays (when importable): ``[(label, ok, note)]``."""
    import nblstm

    results = []
    rng = np.random.default_rng(7)
    a = _inputs(rng, (4, 5, 6, 9), np.float32)
    names = ("x", "cs_prev", "h_prev", "w", "b")
    expected = nblstm.block_lstm(*(a[k] for k in names)).h
    try:
        import torch

        if torch.cuda.is_available():
            t = [torch.as_tensor(a[k], device="cuda") for k in names]
            h = nblstm.block_lstm(*t).h
            ok = isinstance(h, torch.Tensor) and h.is_cuda
            err = _errors(h.cpu().numpy(), expected)[1] if ok else float("inf")
            results.append(("torch tensors in -> torch out", ok and err < 1e-4, f"rel err {err:.1e}"))
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                h = nblstm.block_lstm(*t).h
            s.synchronize()
            err = _errors(h.cpu().numpy(), expected)[1]
            results.append(("torch current stream", err < 1e-4, f"rel err {err:.1e}"))
    except ImportError:
        pass
    try:
        import cupy

        c = [cupy.asarray(a[k]) for k in names]
        h = nblstm.block_lstm(*c).h
        ok = isinstance(h, cupy.ndarray)
        err = _errors(cupy.asnumpy(h), expected)[1] if ok else float("inf")
        results.append(("cupy arrays in -> cupy out", ok and err < 1e-4, f"rel err {err:.1e}"))
    except ImportError:
        pass
    except Exception as exc:  # noqa: BLE001 - a broken CuPy install is reported, not fatal
        results.append(("cupy arrays in -> cupy out", False, repr(exc)[:60]))
    stream = cuda.stream()
    h = nblstm.block_lstm(*(cuda.to_device(a[k]) for k in names), stream=stream).h
    stream.synchronize()
    err = _errors(h.copy_to_host(), expected)[1]
    results.append(("numba stream=", err < 1e-4, f"rel err {err:.1e}"))
    return results


def _cell_rows(cuda, dtype, rng, shape=(12, 37, 19, 70), num_proj=45):
    """Rows ``(output, max abs, max rel)`` of :class:`nblstm.LSTMCell` on the GPU against the CPU.

    Every option at once (peepholes, cell and projection clipping, a relu
    cell activation, per-example lengths including 0 and T), through
    ``vjp``: outputs, final state and every gradient. The shape spans several
    blocks of every kernel.
    """
    import nblstm

    steps, batch, inputs, units = shape
    cell = nblstm.LSTMCell(units, use_peepholes=True, cell_clip=1.5, num_proj=num_proj, proj_clip=0.8,
                           activation="relu", dtype=dtype, seed=1)
    x = rng.standard_normal((steps, batch, inputs)).astype(dtype)
    lengths = rng.integers(0, steps + 1, batch)
    lengths[:2] = (0, steps)
    state = cell.zero_state(batch, dtype)
    state = nblstm.LSTMStateTuple(*(rng.standard_normal(a.shape).astype(dtype) for a in state))
    (out, final), backward = cell.vjp(x, state, lengths)
    d_out = rng.standard_normal(out.shape).astype(dtype)
    d_x, d_state, d_w = backward(d_out)
    g_state = nblstm.LSTMStateTuple(*(cuda.to_device(a) for a in state))
    (g_out, g_final), g_backward = cell.vjp(cuda.to_device(x), g_state, cuda.to_device(lengths))
    g_x, g_dstate, g_w = g_backward(cuda.to_device(d_out))
    pairs = [("outputs", g_out, out), ("final.c", g_final.c, final.c), ("final.h", g_final.h, final.h),
             ("d_inputs", g_x, d_x), ("d_state.c", g_dstate.c, d_state.c), ("d_state.h", g_dstate.h, d_state.h)]
    rows = [(f"LSTMCell {name}", *_errors(g.copy_to_host(), c)) for name, g, c in pairs]
    rows += [(f"LSTMCell d_{name}", *_errors(g_w[name], d_w[name])) for name in d_w]
    return rows


def run_check(out=sys.stdout):
    """Run every op on the GPU and on the CPU target; print the largest errors.

    Parameters
    ----------
    out : file-like
        Where the table goes.

    Returns
    -------
    int
        0 when every error is within tolerance, 1 otherwise, 2 when no GPU
        is usable.
    """
    cuda = _cuda_or_none(out)
    if cuda is None:
        return 2
    from .. import cuda as ncuda

    device = cuda.get_current_device()
    name = getattr(device, "name", "CUDA simulator")
    print(f"GPU: {name.decode() if isinstance(name, bytes) else name}, "
          f"compute capability {getattr(device, 'compute_capability', '-')}", file=out)
    rng = np.random.default_rng(0)
    failures = 0
    header = f"{'dtype':8} {'shape (T,B,I,H)':18} {'options':32} {'loop':10} {'worst output':34} " \
             f"{'max abs':>9} {'max rel':>9}  ok"
    print(header, file=out)
    print("-" * len(header), file=out)
    for dtype in (np.float16, np.float32, np.float64):
        tol = _REL_TOL[np.dtype(dtype)]
        for shape in _CHECK_SHAPES:
            for options in _CHECK_OPTIONS:
                for persistent in (False, True):
                    rows = _compare_case(cuda, ncuda, shape, dtype, options, persistent, rng)
                    name, err, rel = max(rows, key=lambda r: r[2])
                    ok = rel <= tol
                    failures += not ok
                    frac, fb, clip, peep, layout = options
                    opts = f"{layout} fb={fb} clip={clip} peep={int(peep)} S={frac or 1}T"
                    loop = "persistent" if persistent else "per-step"
                    print(f"{np.dtype(dtype).name:8} {str(shape):18} {opts:32} {loop:10} {name:34} "
                          f"{err:9.2e} {rel:9.2e}  {'ok' if ok else 'FAIL'}", file=out)
    for dtype in (np.float16, np.float32, np.float64):
        tol = _REL_TOL[np.dtype(dtype)]
        name, err, rel = max(_cell_rows(cuda, dtype, rng), key=lambda r: r[2])
        ok = rel <= tol
        failures += not ok
        print(f"{np.dtype(dtype).name:8} {'LSTMCell, every option':51} {'per-step':10} {name:34} "
              f"{err:9.2e} {rel:9.2e}  {'ok' if ok else 'FAIL'}", file=out)
    for label, ok, note in _foreign_kinds(cuda, out):
        failures += not ok
        print(f"{label:40} {note:30} {'ok' if ok else 'FAIL'}", file=out)
    print(f"{'all ok' if not failures else f'{failures} FAILED'}", file=out)
    return 0 if not failures else 1


def _median_ms(cuda, fn, reps):
    """Median wall time of ``fn`` in milliseconds, synchronised, after one warm-up."""
    fn()
    cuda.synchronize()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _nblstm_times(cuda, ncuda, d, persistent, reps):
    """nblstm forward and forward+backward medians (ms) on the device arrays ``d``."""
    import nblstm

    core = (d["x"], d["cs_prev"], d["h_prev"], d["w"])

    def fwd():
        return nblstm.block_lstm(*core, d["b"])

    def fwd_bwd():
        outs = nblstm.block_lstm(*core, d["b"])
        return nblstm.block_lstm_grad(*core, outs, h_grad=d["h_grad"])

    saved = ncuda.config.PERSISTENT
    ncuda.config.PERSISTENT = persistent
    try:
        return _median_ms(cuda, fwd, reps), _median_ms(cuda, fwd_bwd, reps)
    finally:
        ncuda.config.PERSISTENT = saved


def _torch_lstm_times(shape, reps):
    """cuDNN ``nn.LSTM`` forward and forward+backward medians (ms), or ``None``."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    steps, batch, inputs, units = shape
    lstm = torch.nn.LSTM(inputs, units).cuda()
    x = torch.randn(steps, batch, inputs, device="cuda", requires_grad=True)
    h0 = torch.randn(1, batch, units, device="cuda")
    c0 = torch.randn(1, batch, units, device="cuda")
    grad = torch.ones(steps, batch, units, device="cuda")

    def fwd():
        return lstm(x, (h0, c0))[0]

    def fwd_bwd():
        y = lstm(x, (h0, c0))[0]
        y.backward(grad)

    def timed(fn):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    return timed(fwd), timed(fwd_bwd)


def _host_counts(fn):
    """``(kernel launches, device allocations)`` made by one call of ``fn`` (Numba's launch and allocation paths)."""
    from numba.cuda import dispatcher
    from numba.cuda.cudadrv import driver

    counts = [0, 0]
    launch, memalloc = dispatcher.launch, driver.Context.memalloc

    def counted_launch(*args, **kwargs):
        counts[0] += 1
        return launch(*args, **kwargs)

    def counted_memalloc(self, *args, **kwargs):
        counts[1] += 1
        return memalloc(self, *args, **kwargs)

    dispatcher.launch, driver.Context.memalloc = counted_launch, counted_memalloc
    try:
        fn()
    finally:
        dispatcher.launch, driver.Context.memalloc = launch, memalloc
    return tuple(counts)


def run_bench(out=sys.stdout, steps=25, units_list=(512, 1024), batches=(1, 16, 64), reps=10):
    """Time forward and forward+backward (float32) on DeepBench-like shapes.

    Shapes are ``T = steps``, ``I = H`` for each ``H`` in ``units_list`` and
    ``B`` in ``batches``. Prints milliseconds (median of ``reps`` after a
    warm-up), GFLOP/s of the GEMMs (forward ``2 T B (I + H) 4H``, backward
    twice that), and the ratio to PyTorch's cuDNN ``nn.LSTM`` when
    available (ratio > 1: nblstm is slower). For small batches both loop
    variants are timed: per-step launches and the persistent kernel. Then
    the kernel launches and device allocations of one warm call of each op.

    Returns
    -------
    int
        0, or 2 when no GPU is usable.
    """
    cuda = _cuda_or_none(out)
    if cuda is None:
        return 2
    from .. import cuda as ncuda

    header = f"{'T':>3} {'B':>3} {'H':>5} {'loop':10} {'fwd ms':>8} {'GFLOP/s':>8} {'cudnn':>7} {'ratio':>6} " \
             f"{'f+b ms':>8} {'GFLOP/s':>8} {'cudnn':>7} {'ratio':>6}"
    print(header, file=out)
    print("-" * len(header), file=out)
    rng = np.random.default_rng(0)
    for units in units_list:
        for batch in batches:
            shape = (steps, batch, units, units)
            a = _inputs(rng, shape, np.float32)
            d = {k: cuda.to_device(v) for k, v in a.items()}
            flops = 2.0 * steps * batch * (2 * units) * 4 * units
            torch_times = _torch_lstm_times(shape, reps)
            loops = [("per-step", False)]
            if batch <= ncuda.config.PERSISTENT_MAX_BATCH:
                loops.append(("persistent", True))
            for label, persistent in loops:
                t_f, t_fb = _nblstm_times(cuda, ncuda, d, persistent, reps)
                if torch_times:
                    ref_f, ref_fb = torch_times
                    cf, rf = f"{ref_f:7.2f}", f"{t_f / ref_f:6.2f}"
                    cfb, rfb = f"{ref_fb:7.2f}", f"{t_fb / ref_fb:6.2f}"
                else:
                    cf = rf = cfb = rfb = "    n/a"
                print(f"{steps:3d} {batch:3d} {units:5d} {label:10} {t_f:8.2f} {flops / t_f / 1e6:8.0f} {cf} {rf} "
                      f"{t_fb:8.2f} {3 * flops / t_fb / 1e6:8.0f} {cfb} {rfb}", file=out)
    _print_host_counts(cuda, ncuda, rng, steps, out)
    return 0


def _print_host_counts(cuda, ncuda, rng, steps, out):
    """Launches and allocations of one warm forward and backward, per loop variant."""
    import nblstm

    d = {k: cuda.to_device(v) for k, v in _inputs(rng, (steps, 4, 64, 64), np.float32).items()}
    core = (d["x"], d["cs_prev"], d["h_prev"], d["w"])
    print(f"host work per call (T={steps}): kernel launches / device allocations", file=out)
    saved = ncuda.config.PERSISTENT
    try:
        for label, persistent in (("per-step", False), ("persistent", True)):
            ncuda.config.PERSISTENT = persistent
            outs = nblstm.block_lstm(*core, d["b"])
            ops = {
                "block_lstm": lambda: nblstm.block_lstm(*core, d["b"]),
                "block_lstm_grad": lambda outs=outs: nblstm.block_lstm_grad(*core, outs, h_grad=d["h_grad"]),
            }
            for name, fn in ops.items():
                fn()
                fn()  # the first calls size the scratch memory kept between calls
                launches, allocations = _host_counts(fn)
                print(f"  {name:16} {label:10} {launches:4d} launches {allocations:3d} allocations", file=out)
    finally:
        ncuda.config.PERSISTENT = saved
    cuda.synchronize()
