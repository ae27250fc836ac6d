"""Time nblstm's fused LSTM ops against TensorFlow and PyTorch on the CPU.

What is timed, float32, time-major ``(T, B, I, H)``:

========== ============================================ ==========================================
library    forward                                      backward (and forward + backward)
========== ============================================ ==========================================
nblstm     ``nblstm.raw_ops.BlockLSTMV2`` (whole call)  ``nblstm.raw_ops.BlockLSTMGradV2``
TensorFlow ``tf.raw_ops.BlockLSTMV2`` (eager)           ``tf.raw_ops.BlockLSTMGradV2``
PyTorch    ``torch.nn.LSTM`` under ``no_grad``          forward with autograd, then ``backward``
========== ============================================ ==========================================

Forward + backward is the forward op followed by the gradient op (nblstm,
TensorFlow) or a training forward and ``backward`` (PyTorch, whose
backward cannot run alone; its "backward" column is that time minus its
no-grad forward). Every backward computes the gradients of the input,
the initial state and the weights.

Each library runs in a fresh subprocess of its own, so that one library's
thread pools never compete with another's, and nothing is set or unset in
the environment: every library runs with its own default threading. Each
of ``--rounds`` rounds starts one subprocess per library in turn
(interleaved, so drift of the machine's speed hits all alike); inside it,
every shape is warmed up and then timed for ``--min-time`` seconds. The
result is the median of the per-round medians, next to the 99th percentile
of every call timed in all rounds (the tail latency).

``--busy N`` measures the loaded case: during each round N busy-loop
processes (``python -c "while True: pass"``) run, each pinned to one of the
last N CPUs where :func:`os.sched_setaffinity` exists; they start before the
round's workers and are killed after them. The default, 0, starts none.

Floating-point work: forward ``2*T*B*(I+H)*4H`` (the GEMMs), backward twice
that. Ratios are ``nblstm time / peer time``: below 1 means nblstm is faster.

Usage (any interpreter works for the driver; the workers run under
``--python``, default the driver's own interpreter)::

    python asv_bench/peer_compare.py                       # every shape, every library found
    python asv_bench/peer_compare.py --shapes small        # (63,1,24,32) and (100,1,256,256)
    python asv_bench/peer_compare.py --shapes 50x32x256x256 25x64x1024x1024 --rounds 5
    python asv_bench/peer_compare.py --python /path/to/venv-with-tf/bin/python
    python asv_bench/peer_compare.py --libs nblstm,torch --python-nblstm /path/to/venv/bin/python
    python asv_bench/peer_compare.py --shapes small --busy 1   # another process busy on one core

It writes a Markdown table (``--markdown``, default ``docs/benchmarks.md``),
a PNG plot (``--plot``, default ``docs/benchmarks.png``; skipped without
matplotlib) and, with ``--json``, the raw samples.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: (T, B, I, H) timed by default.
SHAPES = (
    (63, 1, 24, 32),
    (50, 32, 256, 256),
    (50, 32, 512, 512),
    (100, 1, 256, 256),
    (100, 64, 125, 320),
    (25, 64, 1024, 1024),
)
SHAPE_GROUPS = {
    "all": SHAPES,
    "small": ((63, 1, 24, 32), (100, 1, 256, 256)),
}
LIBRARIES = ("nblstm", "tensorflow", "torch")
LABELS = {"nblstm": "nblstm", "tensorflow": "TensorFlow", "torch": "PyTorch"}
METRICS = ("fwd", "bwd", "fwd_bwd")


def forward_flops(shape):
    """GEMM floating-point operations of one forward pass: ``2*T*B*(I+H)*4H``."""
    T, B, I, H = shape
    return 2 * T * B * (I + H) * 4 * H


def metric_flops(shape, metric):
    """FLOPs of ``metric``: forward 1x, backward 2x, forward + backward 3x the forward."""
    return forward_flops(shape) * {"fwd": 1, "bwd": 2, "fwd_bwd": 3}[metric]


# --------------------------------------------------------------------------
# Worker: runs in a subprocess, imports one library, prints JSON.
# --------------------------------------------------------------------------


def _inputs(shape, seed=0):
    """The float32 inputs shared by every library (same seed, same values).

    Returns a dict with ``x [T,B,I]``, ``cs_prev, h_prev [B,H]``, ``w [I+H,4H]``
    (IFCO), ``b [4H]``, zero peepholes ``wci, wcf, wco [H]`` and the output
    gradient ``h_grad [T,B,H]``.
    """
    import numpy as np

    T, B, I, H = shape
    rng = np.random.default_rng(seed)
    scale = 1.0 / np.sqrt(H)
    f32 = np.float32
    zeros = np.zeros(H, f32)
    return {
        "x": rng.standard_normal((T, B, I)).astype(f32),
        "cs_prev": (rng.standard_normal((B, H)) * 0.5).astype(f32),
        "h_prev": (rng.standard_normal((B, H)) * 0.5).astype(f32),
        "w": rng.uniform(-scale, scale, (I + H, 4 * H)).astype(f32),
        "b": rng.uniform(-scale, scale, 4 * H).astype(f32),
        "wci": zeros, "wcf": zeros, "wco": zeros,
        "h_grad": (rng.standard_normal((T, B, H)) * 0.1).astype(f32),
    }


def _time(fn, min_time, min_calls, max_calls):
    """Seconds per call of ``fn``: one warm-up call, then calls until ``min_time`` has passed."""
    fn()
    samples = []
    start = time.perf_counter()
    while len(samples) < max_calls and (len(samples) < min_calls or time.perf_counter() - start < min_time):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


def _checksums(np, h, x_grad):
    """Sums that let the driver check that the libraries computed the same thing."""
    return {"h": float(np.asarray(h, np.float64).sum()), "x_grad": float(np.asarray(x_grad, np.float64).sum())}


def _setup_nblstm(shape):
    import numpy as np

    import nblstm
    from nblstm import raw_ops

    a = _inputs(shape)
    T = shape[0]
    args = {k: a[k] for k in ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")}
    zeros = np.zeros_like(a["h_grad"])

    def fwd():
        return raw_ops.BlockLSTMV2(seq_len_max=T, **args)

    out = fwd()

    def bwd():
        return raw_ops.BlockLSTMGradV2(seq_len_max=T, **args, **out._asdict(), cs_grad=zeros, h_grad=a["h_grad"],
                                       use_peephole=False)

    def fwd_bwd():
        o = raw_ops.BlockLSTMV2(seq_len_max=T, **args)
        return raw_ops.BlockLSTMGradV2(seq_len_max=T, **args, **o._asdict(), cs_grad=zeros, h_grad=a["h_grad"],
                                       use_peephole=False)

    import numba

    info = {"version": nblstm.__version__, "numba": numba.__version__, "threads": numba.get_num_threads()}
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd_bwd}, _checksums(np, out.h, bwd().x_grad), info


def _setup_tensorflow(shape):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    a = _inputs(shape)
    T = np.int64(shape[0])
    args = {k: tf.constant(a[k]) for k in ("x", "cs_prev", "h_prev", "w", "wci", "wcf", "wco", "b")}
    h_grad = tf.constant(a["h_grad"])
    zeros = tf.zeros_like(h_grad)

    def fwd():
        return tf.raw_ops.BlockLSTMV2(seq_len_max=T, **args)

    out = fwd()
    outs = {k: getattr(out, k) for k in ("i", "cs", "f", "o", "ci", "co", "h")}

    def bwd():
        return tf.raw_ops.BlockLSTMGradV2(seq_len_max=T, **args, **outs, cs_grad=zeros, h_grad=h_grad,
                                          use_peephole=False)

    def fwd_bwd():
        o = tf.raw_ops.BlockLSTMV2(seq_len_max=T, **args)
        return tf.raw_ops.BlockLSTMGradV2(seq_len_max=T, **args, i=o.i, cs=o.cs, f=o.f, o=o.o, ci=o.ci, co=o.co,
                                          h=o.h, cs_grad=zeros, h_grad=h_grad, use_peephole=False)

    threads = tf.config.threading
    info = {"version": tf.__version__, "intra_op_threads": threads.get_intra_op_parallelism_threads(),
            "inter_op_threads": threads.get_inter_op_parallelism_threads()}
    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd_bwd}, _checksums(np, out.h.numpy(), bwd().x_grad.numpy()), info


def _setup_torch(shape):
    import numpy as np
    import torch

    a = _inputs(shape)
    T, B, I, H = shape
    lstm = torch.nn.LSTM(I, H)
    with torch.no_grad():  # the same weights as the fused ops: IFCO, one bias
        lstm.weight_ih_l0.copy_(torch.from_numpy(a["w"][:I].T.copy()))
        lstm.weight_hh_l0.copy_(torch.from_numpy(a["w"][I:].T.copy()))
        lstm.bias_ih_l0.copy_(torch.from_numpy(a["b"]))
        lstm.bias_hh_l0.zero_()
    x = torch.from_numpy(a["x"])
    state = (torch.from_numpy(a["h_prev"])[None], torch.from_numpy(a["cs_prev"])[None])
    h_grad = torch.from_numpy(a["h_grad"])
    x_train = x.clone().requires_grad_(True)
    state_train = tuple(s.clone().requires_grad_(True) for s in state)

    def fwd():
        with torch.no_grad():
            return lstm(x, state)

    def fwd_bwd():
        for p in lstm.parameters():
            p.grad = None
        for t in (x_train, *state_train):
            t.grad = None
        out, _ = lstm(x_train, state_train)
        out.backward(h_grad)
        return x_train.grad

    h = fwd()[0].numpy()
    info = {"version": torch.__version__, "threads": torch.get_num_threads(),
            "mkldnn": bool(torch.backends.mkldnn.is_available())}
    return {"fwd": fwd, "fwd_bwd": fwd_bwd}, _checksums(np, h, fwd_bwd().numpy()), info


SETUPS = {"nblstm": _setup_nblstm, "tensorflow": _setup_tensorflow, "torch": _setup_torch}
IMPORT_NAMES = {"nblstm": "nblstm", "tensorflow": "tensorflow", "torch": "torch"}


def worker(library, shapes, min_time, min_calls, max_calls):
    """Time ``library`` on ``shapes``; returns a JSON-ready dict."""
    import importlib

    t0 = time.perf_counter()
    try:
        importlib.import_module(IMPORT_NAMES[library])
    except ImportError as exc:
        return {"library": library, "skipped": f"cannot import {IMPORT_NAMES[library]}: {exc}"}
    result = {"library": library, "import_s": time.perf_counter() - t0, "shapes": []}
    for shape in shapes:
        t0 = time.perf_counter()
        fns, checks, info = SETUPS[library](tuple(shape))
        entry = {"shape": list(shape), "setup_s": time.perf_counter() - t0, "checks": checks, "samples": {}}
        result["info"] = info
        for metric, fn in fns.items():
            entry["samples"][metric] = _time(fn, min_time, min_calls, max_calls)
        result["shapes"].append(entry)
    return result


# --------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------


def _parse_shape(text):
    parts = text.lower().replace(",", "x").split("x")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"a shape is TxBxIxH, e.g. 50x32x256x256; got {text!r}")
    return tuple(int(p) for p in parts)


def _shapes(names):
    shapes = []
    for name in names:
        for shape in SHAPE_GROUPS.get(name.lower(), None) or (_parse_shape(name),):
            if shape not in shapes:
                shapes.append(shape)
    return shapes


def run_worker(python, library, shapes, args):
    """Run one worker subprocess; returns its parsed result."""
    cmd = [python, str(pathlib.Path(__file__).resolve()), "--worker", library,
           "--shapes", *("x".join(map(str, s)) for s in shapes),
           "--min-time", str(args.min_time), "--min-calls", str(args.min_calls), "--max-calls", str(args.max_calls)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=args.worker_timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return {"library": library, "skipped": f"worker failed (exit {proc.returncode}): " + " | ".join(tail)}
    return json.loads(lines[-1])


def busy_cpus(count):
    """The CPUs the ``count`` busy processes are pinned to: the last ``count`` this process may use (round
    robin when there are fewer); ``None`` each where the system cannot pin."""
    if not hasattr(os, "sched_setaffinity") or not hasattr(os, "sched_getaffinity"):
        return [None] * count
    cpus = sorted(os.sched_getaffinity(0))
    return [cpus[(len(cpus) - count + k) % len(cpus)] for k in range(count)]


def start_busy(cpus):
    """Start one busy-loop process per entry of ``cpus``, pinned to that CPU (not pinned for ``None``)."""
    procs = []
    try:
        for cpu in cpus:
            proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(proc)
            if cpu is not None:
                os.sched_setaffinity(proc.pid, {cpu})
    except BaseException:
        stop_busy(procs)
        raise
    if procs:
        time.sleep(0.2)  # the interpreters start and reach their loop
    return procs


def stop_busy(procs):
    """Kill the busy processes and wait for them."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        proc.wait()


def busy_mode(count, cpus):
    """The load a run was timed under, in words."""
    if count <= 0:
        return "no busy process"
    noun = "1 busy process" if count == 1 else f"{count} busy processes"
    if cpus and cpus[0] is None:
        return f"with {noun} (not pinned)"
    return f"with {noun} on one core" + (" each" if count > 1 else "")


def collect(args):
    """Run the interleaved rounds; returns ``{library: {shape: {metric: [round medians]}}}`` and metadata.

    ``samples`` holds every call timed, all rounds together (for the percentiles).
    """
    shapes = _shapes(args.shapes)
    libs = [lib.strip() for lib in args.libs.split(",") if lib.strip()]
    pythons = {lib: getattr(args, f"python_{lib}") or args.python for lib in libs}
    medians = {lib: {s: {} for s in shapes} for lib in libs}
    samples_all = {lib: {s: {} for s in shapes} for lib in libs}
    raw = {lib: [] for lib in libs}
    skipped, infos, checks = {}, {}, {lib: {} for lib in libs}
    cpus = busy_cpus(args.busy)
    for r in range(args.rounds):
        busy = start_busy(cpus)
        try:
            for lib in libs:
                if lib in skipped:
                    continue
                t0 = time.perf_counter()
                res = run_worker(pythons[lib], lib, shapes, args)
                if "skipped" in res:
                    skipped[lib] = res["skipped"]
                    print(f"  {LABELS[lib]}: skipped ({res['skipped']})", flush=True)
                    continue
                raw[lib].append(res)
                infos[lib] = res.get("info", {})
                for entry in res["shapes"]:
                    shape = tuple(entry["shape"])
                    checks[lib][shape] = entry["checks"]
                    for metric, samples in entry["samples"].items():
                        medians[lib][shape].setdefault(metric, []).append(statistics.median(samples))
                        samples_all[lib][shape].setdefault(metric, []).extend(samples)
                print(f"  round {r + 1}/{args.rounds} {LABELS[lib]}: {time.perf_counter() - t0:.1f} s", flush=True)
        finally:
            stop_busy(busy)
    libs = [lib for lib in libs if lib not in skipped]
    return {"shapes": shapes, "libs": libs, "medians": medians, "samples": samples_all, "skipped": skipped,
            "infos": infos, "checks": checks, "raw": raw, "pythons": pythons,
            "busy": {"count": args.busy, "cpus": cpus, "mode": busy_mode(args.busy, cpus)}}


def percentile(values, q):
    """The ``q``-th percentile of ``values`` (linear between the closest ranks, as NumPy's default)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def summarise(data):
    """Median times and GFLOP/s per ``(library, shape, metric)``."""
    table = {}
    for lib in data["libs"]:
        for shape in data["shapes"]:
            m = data["medians"][lib][shape]
            row = {metric: statistics.median(m[metric]) for metric in METRICS if metric in m}
            if "bwd" not in row and "fwd" in row and "fwd_bwd" in row:  # PyTorch: no backward alone
                row["bwd"] = row["fwd_bwd"] - row["fwd"]
                row["bwd_derived"] = True
            for metric in METRICS:
                if metric in row:
                    row[metric + "_gflops"] = metric_flops(shape, metric) / row[metric] / 1e9
            for metric, samples in data["samples"][lib][shape].items():
                row[metric + "_p99"] = percentile(samples, 99)
                row[metric + "_calls"] = len(samples)
            spread = m.get("fwd", [])
            row["fwd_spread"] = (max(spread) - min(spread)) / statistics.median(spread) if len(spread) > 1 else 0.0
            table[lib, shape] = row
    return table


def _check_agreement(data):
    """Relative differences of the libraries' checksums from nblstm's."""
    notes = []
    if "nblstm" not in data["libs"]:
        return notes
    for lib in data["libs"]:
        if lib == "nblstm":
            continue
        for shape in data["shapes"]:
            ours, theirs = data["checks"]["nblstm"].get(shape), data["checks"][lib].get(shape)
            if not ours or not theirs:
                continue
            for key in ours:
                scale = max(abs(ours[key]), 1e-30)
                rel = abs(ours[key] - theirs[key]) / scale
                notes.append((lib, shape, key, rel))
    return notes


def _fmt_ms(seconds):
    return f"{seconds * 1e3:.3g}" if seconds >= 1e-3 else f"{seconds * 1e3:.3f}"


def _machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"


def _mode_sentence(busy):
    """The Markdown sentence that says under which load the run was timed."""
    if busy["count"] <= 0:
        return "Mode: quiet, no busy process started by the script (other work on the machine is not controlled)."
    cpus = [c for c in busy["cpus"] if c is not None]
    where = f", pinned to CPU {', '.join(map(str, cpus))}" if cpus else ""
    return (f"Mode: loaded, {busy['mode']}: `python -c \"while True: pass\"`{where}, started before each round's "
            "workers and killed after them.")


def markdown(data, table, args):
    """The Markdown report."""
    lines = [
        "# Benchmarks: nblstm against TensorFlow and PyTorch (CPU)",
        "",
        f"Generated by `asv_bench/peer_compare.py` on {datetime.date.today().isoformat()}: {_machine()}.",
        f"float32, time-major `(T, B, I, H)`; median of {args.rounds} interleaved rounds, each library in a fresh "
        "process with its default threading; every round times each case for at least "
        f"{args.min_time:g} s after a warm-up call. **p99**: the 99th percentile of every call timed in all "
        "rounds (the slowest calls when there are fewer than 100).",
        "",
        _mode_sentence(data["busy"]),
        "",
        "- **nblstm**: `nblstm.raw_ops.BlockLSTMV2` / `BlockLSTMGradV2`, the whole public call.",
        "- **TensorFlow**: eager `tf.raw_ops.BlockLSTMV2` / `BlockLSTMGradV2`.",
        "- **PyTorch**: `torch.nn.LSTM`, forward under `torch.no_grad()`; forward + backward is a training forward "
        "and `backward()`; its backward alone (in italics) is that minus the no-grad forward.",
        "",
        "GFLOP/s count the GEMMs: forward `2*T*B*(I+H)*4H`, backward twice that. "
        "**nblstm / peer** is the ratio of times: below 1 means nblstm is faster.",
        "",
    ]
    versions = []
    for lib in data["libs"]:
        info = data["infos"].get(lib, {})
        extra = ", ".join(f"{k} {v}" for k, v in info.items() if k != "version")
        versions.append(f"{LABELS[lib]} {info.get('version', '?')}" + (f" ({extra})" if extra else ""))
    lines += ["Versions: " + "; ".join(versions) + ".", ""]
    for lib, reason in data["skipped"].items():
        lines += [f"{LABELS[lib]} was skipped: {reason}", ""]
    header = ("| T, B, I, H | library | forward ms | fwd p99 ms | fwd GFLOP/s | backward ms | bwd GFLOP/s | "
              "fwd+bwd ms | fwd+bwd p99 ms | fwd+bwd GFLOP/s | nblstm / peer, fwd | nblstm / peer, fwd+bwd |")
    lines += [header, "|" + "---|" * 12]
    for shape in data["shapes"]:
        ours = table.get(("nblstm", shape))
        for lib in data["libs"]:
            row = table[lib, shape]
            bwd = _fmt_ms(row["bwd"]) if "bwd" in row else "-"
            bwd_g = f"{row['bwd_gflops']:.1f}" if "bwd" in row else "-"
            if row.get("bwd_derived"):
                bwd, bwd_g = f"*{bwd}*", f"*{bwd_g}*"
            ratios = []
            for metric in ("fwd", "fwd_bwd"):
                if lib == "nblstm" or ours is None or metric not in row or metric not in ours:
                    ratios.append("-")
                else:
                    ratios.append(f"{ours[metric] / row[metric]:.2f}")
            p99 = {m: _fmt_ms(row[m + "_p99"]) if m + "_p99" in row else "-" for m in ("fwd", "fwd_bwd")}
            cells = [", ".join(map(str, shape)), LABELS[lib], _fmt_ms(row["fwd"]), p99["fwd"],
                     f"{row['fwd_gflops']:.1f}", bwd, bwd_g, _fmt_ms(row["fwd_bwd"]), p99["fwd_bwd"],
                     f"{row['fwd_bwd_gflops']:.1f}", *ratios]
            lines.append("| " + " | ".join(cells) + " |")
    notes = _check_agreement(data)
    if notes:
        worst = max(n[3] for n in notes)
        lines += ["", f"Sanity check: the sums of `h` and of the input gradient agree with nblstm's to a relative "
                      f"{worst:.1e} at worst (same inputs in every process)."]
    noisy = [(lib, shape) for (lib, shape), row in table.items() if row["fwd_spread"] > 0.2]
    if noisy:
        lines += ["", "Forward times that varied by more than 20 % between rounds: " +
                  ", ".join(f"{LABELS[lib]} {shape}" for lib, shape in noisy) + "."]
    lines.append("")
    return "\n".join(lines)


def plot(data, table, path):
    """Bar chart of GFLOP/s, forward and forward + backward; skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return False
    shapes, libs = data["shapes"], data["libs"]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(shapes) + 3), 4.5), sharey=False)
    width = 0.8 / max(1, len(libs))
    for ax, metric, title in zip(axes, ("fwd", "fwd_bwd"), ("forward", "forward + backward"), strict=True):
        for k, lib in enumerate(libs):
            values = [table[lib, s].get(metric + "_gflops", 0.0) for s in shapes]
            ax.bar([n + (k - (len(libs) - 1) / 2) * width for n in range(len(shapes))], values, width,
                   label=LABELS[lib])
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels(["{},{}\n{},{}".format(*s) for s in shapes], fontsize=8)
        ax.set_xlabel("T, B / I, H")
        ax.set_title(f"{title}, float32" + (f"\n{data['busy']['mode']}" if data["busy"]["count"] > 0 else ""))
        ax.set_ylabel("GFLOP/s")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None):
    """Command-line entry point (driver or, with ``--worker``, one library's timing process)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["all"],
                        help="TxBxIxH shapes, or 'all' (default) or 'small'")
    parser.add_argument("--libs", default=",".join(LIBRARIES), help="comma-separated: nblstm,tensorflow,torch")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the worker processes")
    for lib in LIBRARIES:
        parser.add_argument(f"--python-{lib}", dest=f"python_{lib}", default=None,
                            help=f"interpreter for {LABELS[lib]} (default --python)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds timed per case and round")
    parser.add_argument("--min-calls", type=int, default=3)
    parser.add_argument("--max-calls", type=int, default=20000,
                        help="cap on the calls timed per case and round (default 20000)")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="busy-loop processes running while timing, each pinned to one of the last N CPUs "
                             "(default 0: none)")
    parser.add_argument("--worker-timeout", type=float, default=1800.0, help="seconds before a worker is killed")
    parser.add_argument("--markdown", type=pathlib.Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--plot", type=pathlib.Path, default=ROOT / "docs" / "benchmarks.png",
                        help="PNG path; '' for none")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="also write the raw samples here")
    parser.add_argument("--worker", choices=LIBRARIES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.busy < 0:
        parser.error("--busy is a count of processes, 0 or more")

    if args.worker:
        shapes = [_parse_shape(s) for s in args.shapes]
        print(json.dumps(worker(args.worker, shapes, args.min_time, args.min_calls, args.max_calls)))
        return 0

    data = collect(args)
    if not data["libs"]:
        print("no library could be timed")
        return 1
    table = summarise(data)
    text = markdown(data, table, args)
    print(text)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(text)
    print(f"wrote {args.markdown}")
    if str(args.plot) not in ("", ".") and plot(data, table, args.plot):
        print(f"wrote {args.plot}")
    if args.json:
        serial = {k: v for k, v in data.items() if k in ("libs", "skipped", "infos", "raw", "pythons", "busy")}
        serial["shapes"] = [list(s) for s in data["shapes"]]
        args.json.write_text(json.dumps(serial, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
